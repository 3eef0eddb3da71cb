// KV compressor state update and pooling (docs/model.md#compressor), for the attention compressor (head_dim =
// D) and the indexer compressor (head_dim = D_i). The overlap factor is c = 2 for ratio 4 and 1
// otherwise; the state is (c * ratio) rows x (c * head_dim) columns of kv and of score.
//
// Every output dim j depends only on state columns j and head_dim + j, so one thread owns one
// output dim and walks the tokens of the batch in order without any synchronisation: decode
// (n_tok = 1) and prefill (a whole chunk) use the same kernel. Emitted rows are written raw
// (pooled, not normalized) into the compressed cache; ds4_rows_finish in its emitted-rows form then
// finishes the rows this batch emitted (RMSNorm * norm weight, RoPE at row * ratio, E4M3 or
// Hadamard+FP4, f16 rounding): first row c0 = pos0 / ratio, count = (pos0 + n_tok) / ratio - c0.
#pragma once
#include "formats.h"

// comp_rows: f32 [comp_cap][head_dim]; state_kv, state_score: f32 [c * ratio][c * head_dim]
// (initialised by the host to 0 and DS4_NEG_INF); pos: u32 [1] = pos0 (device step parameters); kv_cur, sc_cur: f32 [n_tok][c * head_dim] (the
// W_kv and W_gate projections of the normed input); ape: F16 [ratio][c * head_dim].
// Token t (position p = pos0 + t) writes state row (c == 2 ? ratio : 0) + p % ratio with
// kv = kv_cur, score = sc_cur + ape[p % ratio]; when (p + 1) % ratio == 0 it emits compressed row
// (p + 1) / ratio - 1 (skipped if >= comp_cap):
//   pooled[j] = softmax-weighted sum over the candidates (per dim): ratio 4 -> rows 0..3 of
//   column j and rows 4..7 of column head_dim + j; otherwise rows 0..ratio-1 of column j;
//   0 when the largest candidate score is <= -5e29; the sums in the CPU reference's order;
// then (c == 2 only) rows 0..ratio-1 <- rows ratio..2 ratio-1.
// Launch: grid (ceil(head_dim / 256)), block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_compressor_pool(float* comp_rows, float* state_kv,
                                                                      float* state_score, const float* kv_cur,
                                                                      const float* sc_cur, const u16* ape,
                                                                      const u32* pos, u32 head_dim, u32 ratio,
                                                                      u32 n_tok, u32 comp_cap) {
    ds4_grid_sync();
    const u32 j = blockIdx.x * DS4_BLOCK + threadIdx.x;
    if (j >= head_dim || ratio == 0) return;
    const u32 pos0 = pos[0];
    const u32 c = ratio == 4 ? 2 : 1;
    const u32 width = c * head_dim;
    const u32 first = c == 2 ? ratio : 0;
    for (u32 t = 0; t < n_tok; ++t) {
        const u32 p = pos0 + t;
        const u32 slot = p % ratio;
        const u64 row = (u64)(first + slot) * width;
        for (u32 k = 0; k < c; ++k) {
            const u32 col = j + k * head_dim;
            state_kv[row + col] = kv_cur[(u64)t * width + col];
            state_score[row + col] = sc_cur[(u64)t * width + col] + f16_to_f32(ape[(u64)slot * width + col]);
        }
        if ((p + 1) % ratio != 0) continue;
        // Candidate rows: (i, j) and, when c == 2, (ratio + i, head_dim + j) for window slot i.
        float m = -INFINITY;
        for (u32 i = 0; i < ratio; ++i) {
            m = fmaxf(m, state_score[(u64)i * width + j]);
            if (c == 2) m = fmaxf(m, state_score[(u64)(ratio + i) * width + head_dim + j]);
        }
        float pooled = 0.0f;
        if (m > -5.0e29f) {
            // The reference's order (cpu/compressor.rs): per slot, both candidates' weights join the
            // denominator as one sum, then their products join the numerator one after the other.
            float den = 0.0f, acc = 0.0f;
            for (u32 i = 0; i < ratio; ++i) {
                const u64 ip = (u64)i * width + j;
                const float wp = ds4_expf(state_score[ip] - m);
                if (c == 2) {
                    const u64 ic = (u64)(ratio + i) * width + head_dim + j;
                    const float wc = ds4_expf(state_score[ic] - m);
                    den += wp + wc;
                    acc += wp * state_kv[ip];
                    acc += wc * state_kv[ic];
                } else {
                    den += wp;
                    acc += wp * state_kv[ip];
                }
            }
            if (den > 0.0f) pooled = acc / den;
        }
        const u32 crow = (p + 1) / ratio - 1;
        if (crow < comp_cap) comp_rows[(u64)crow * head_dim + j] = pooled;
        if (c == 2) {
            for (u32 i = 0; i < ratio; ++i) {
                for (u32 k = 0; k < c; ++k) {
                    const u32 col = j + k * head_dim;
                    state_kv[(u64)i * width + col] = state_kv[(u64)(ratio + i) * width + col];
                    state_score[(u64)i * width + col] = state_score[(u64)(ratio + i) * width + col];
                }
            }
        }
    }
}
