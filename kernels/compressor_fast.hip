// Compressor pooling of a whole batch in parallel (fast mode; the twin of ds4_compressor_pool with
// its parameter list, kernels/compressor.hip). The exact kernel walks the batch's tokens in order
// (one thread per dim), a chain as long as the chunk. But an emitted row depends only on the
// projections of its own window (and, for ratio 4, the window before it), and the state the batch
// leaves behind only on the last windows: every emitted row is computed independently from kv_cur /
// sc_cur, or from the state the batch starts with for positions before pos0, then the state is
// rewritten as the walk would have left it. The pooled sums are the exact kernel's, in its order,
// so the output is bitwise the exact kernel's.
//
// Where the state holds position x < pos0 (c = 2, windows of `ratio` positions): in row
// ratio + x % ratio if x lies in the window of pos0 (the partial window), else in row x % ratio
// (the window before, copied there by the last emission; at the start of the sequence these rows
// hold the initial 0 / DS4_NEG_INF). For c = 1 in row x % ratio.
#pragma once
#include "formats.h"

#define DS4_CPF_DIMS 16  // dims per block (16 lanes of a row group read 64 contiguous bytes)
#define DS4_CPF_LANES (DS4_BLOCK / DS4_CPF_DIMS)

// Candidate `slot` of window position x (signed: the window before the first one is x < 0) at state
// column col: from the batch's projections when x >= pos0, else from the initial state.
struct CpfSrc {
    const float *state_kv, *state_score, *kv_cur, *sc_cur;
    const u16* ape;
    u32 pos0, win0, ratio, width, c;
    __device__ __forceinline__ void get(long long x, u32 slot, u32 col, float& kv, float& sc) const {
        if (x >= (long long)pos0) {
            const u64 t = (u64)(x - pos0);
            kv = kv_cur[t * width + col];
            sc = sc_cur[t * width + col] + f16_to_f32(ape[(u64)slot * width + col]);
        } else {
            const u32 row = (c == 2 && x >= (long long)win0) ? ratio + slot : slot;
            kv = state_kv[(u64)row * width + col];
            sc = state_score[(u64)row * width + col];
        }
    }
};

// Same parameters and results as ds4_compressor_pool. Launch: grid (ceil(head_dim / 16)), block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_compressor_pool_fast(float* comp_rows, float* state_kv,
                                                                           float* state_score, const float* kv_cur,
                                                                           const float* sc_cur, const u16* ape,
                                                                           const u32* pos, u32 head_dim, u32 ratio,
                                                                           u32 n_tok, u32 comp_cap) {
    ds4_grid_sync();
    const u32 j = blockIdx.x * DS4_CPF_DIMS + threadIdx.x % DS4_CPF_DIMS, lane = threadIdx.x / DS4_CPF_DIMS;
    if (ratio == 0) return;
    const bool live = j < head_dim;
    const u32 pos0 = pos[0], pend = pos0 + n_tok;
    const u32 c = ratio == 4 ? 2 : 1;
    const u32 width = c * head_dim;
    const CpfSrc src{state_kv, state_score, kv_cur, sc_cur, ape, pos0, pos0 / ratio * ratio, ratio, width, c};
    // Emitted rows e0 .. e0 + count - 1 (row e closes the window of positions e * ratio ..).
    const u32 e0 = pos0 / ratio, count = pend / ratio - e0;
    for (u32 k = lane; live && k < count; k += DS4_CPF_LANES) {
        const u32 crow = e0 + k;
        const long long w = (long long)crow * ratio;  // first position of the window
        float m = -INFINITY;
        for (u32 i = 0; i < ratio; ++i) {
            float kv, sc;
            src.get(c == 2 ? w - ratio + i : w + i, i, j, kv, sc);
            m = fmaxf(m, sc);
            if (c == 2) {
                src.get(w + i, i, head_dim + j, kv, sc);
                m = fmaxf(m, sc);
            }
        }
        float pooled = 0.0f;
        if (m > -5.0e29f) {
            // The exact kernel's order: per slot, both candidates' weights join the denominator as
            // one sum, then their products join the numerator one after the other.
            float den = 0.0f, acc = 0.0f;
            for (u32 i = 0; i < ratio; ++i) {
                float kvp, scp;
                src.get(c == 2 ? w - ratio + i : w + i, i, j, kvp, scp);
                const float wp = ds4_expf(scp - m);
                if (c == 2) {
                    float kvc, scc;
                    src.get(w + i, i, head_dim + j, kvc, scc);
                    const float wc = ds4_expf(scc - m);
                    den += wp + wc;
                    acc += wp * kvp;
                    acc += wc * kvc;
                } else {
                    den += wp;
                    acc += wp * kvp;
                }
            }
            if (den > 0.0f) pooled = acc / den;
        }
        if (crow < comp_cap) comp_rows[(u64)crow * head_dim + j] = pooled;
    }
    // The state the walk leaves: every emitted row above has read the initial state first.
    __syncthreads();
    if (!live || n_tok == 0) return;
    // Slot i's row (ratio + i for c = 2, else i): the last position x < pend with x % ratio == i.
    // c = 2, row i: the window closed by the batch's last emission, when the batch emitted one.
    const u32 first = c == 2 ? ratio : 0;
    const long long last_w = (long long)(pend - 1) / ratio * ratio;
    const bool emitted = count > 0;
    const long long closed_w = (long long)(pend / ratio) * ratio - ratio;
    for (u32 i = lane; i < ratio; i += DS4_CPF_LANES) {
        float kv[2][2], sc[2][2];  // [row kind: slot row, shifted row][column k]
        long long x = last_w + i;
        if (x >= (long long)pend) x -= ratio;
        const bool cur = x >= (long long)pos0;
        for (u32 k = 0; k < c; ++k) {
            if (cur) src.get(x, i, j + k * head_dim, kv[0][k], sc[0][k]);
            if (c == 2 && emitted) src.get(closed_w + i, i, j + k * head_dim, kv[1][k], sc[1][k]);
        }
        // Written after all of this thread's reads (the rows it reads are the rows it writes).
        for (u32 k = 0; k < c; ++k) {
            const u32 col = j + k * head_dim;
            if (cur) {
                state_kv[(u64)(first + i) * width + col] = kv[0][k];
                state_score[(u64)(first + i) * width + col] = sc[0][k];
            }
            if (c == 2 && emitted) {
                state_kv[(u64)i * width + col] = kv[1][k];
                state_score[(u64)i * width + col] = sc[1][k];
            }
        }
    }
}
