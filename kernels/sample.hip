// Sampling on the device (docs/sampler.md): the next token from the logits of the last step without
// copying the n_vocab logits to the host. The random number is drawn by the host from its own
// xorshift64* stream (it does not depend on the logits) and passed in as `u01`; the kernel reports
// whether the host's path would have consumed that draw. Paths that need a sort (top_k > 0 or
// top_p < 1) stay on the host. The picks are those of src/engine/sampler.rs (`argmax`,
// `sample_id_order`), up to the float rounding of the sums.
#pragma once
#include "formats.h"

#define DS4_NO_ID 0xffffffffu

// Keeps the better of two (value, id) candidates: the larger value, ties to the lower id; DS4_NO_ID
// is no candidate.
DS4_DEV void ds4_best_of(float& best, u32& bi, float v, u32 i) {
    if (i != DS4_NO_ID && (bi == DS4_NO_ID || v > best || (v == best && i < bi))) {
        best = v;
        bi = i;
    }
}

// The block's best (value, id) candidate (ds4_best_of's order) from every thread's own, in thread 0:
// a width-DS4_WARP butterfly, then the warps' results in warp order. Any order of the folds gives the
// same candidate: ds4_best_of is a total order on the candidates. Ends with a barrier, so the next
// call may reuse the shared words at once.
DS4_DEV void ds4_block_best(float& best, u32& bi) {
    __shared__ float sb[DS4_WARPS_PER_BLOCK];
    __shared__ u32 si[DS4_WARPS_PER_BLOCK];
#pragma unroll
    for (int o = DS4_WARP / 2; o > 0; o >>= 1) {
        const float ob = __shfl_xor(best, o, DS4_WARP);
        const u32 oi = __shfl_xor(bi, o, DS4_WARP);
        ds4_best_of(best, bi, ob, oi);
    }
    if (lane_id() == 0) {
        sb[warp_id()] = best;
        si[warp_id()] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0)
        for (int w = 1; w < DS4_WARPS_PER_BLOCK; ++w) ds4_best_of(best, bi, sb[w], si[w]);
    __syncthreads();
}

// First index of the largest logit among those accepted (finite_only: finite ones; otherwise every
// logit above -inf, so +inf wins and NaN never does), or DS4_NO_ID; the result in every thread.
DS4_DEV u32 ds4_block_first_max(const float* logits, u32 n, bool finite_only) {
    __shared__ u32 s_out;
    float best = -INFINITY;
    u32 bi = DS4_NO_ID;
    for (u32 i = threadIdx.x; i < n; i += DS4_BLOCK) {
        const float v = logits[i];
        const bool ok = finite_only ? isfinite(v) : v > -INFINITY;
        if (ok) ds4_best_of(best, bi, v, i);
    }
    ds4_block_best(best, bi);
    if (threadIdx.x == 0) s_out = bi;
    __syncthreads();
    return s_out;
}

// Greedy (temperature ≤ 0, docs/sampler.md#greedy), the host's `argmax`: out[0] = first index of the largest
// logit, NaN never wins, 0 when every logit is NaN or -inf. out[1] = 0 (no draw).
// Launch: grid (1), block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_argmax(u32* out, const float* logits, u32 n) {
    ds4_grid_sync();
    const u32 bi = ds4_block_first_max(logits, n, false);
    if (threadIdx.x == 0) {
        out[0] = bi == DS4_NO_ID ? 0u : bi;
        out[1] = 0;
    }
}

// Default sampler path (docs/sampler.md#sampling-paths, top_k = 0 and top_p = 1), the host's `sample_id_order`:
// w_i = exp((l_i - l_max) / temp) for finite logits, tokens with w_i < min_p dropped, r = u01 * sum w,
// then walking ids in increasing order subtracting w_i, the first id where r <= 0. Sums are taken
// per contiguous chunk of ids and then in chunk order, so only float rounding differs from the host's
// sequential walk. out[0] = the id; out[1] = 1 when the draw was used, 0 when the host would not have
// drawn: no finite logit (out[0] = the greedy pick) or nothing kept (out[0] = first finite maximum).
// When rounding leaves r > 0 after the last kept id, the first finite maximum (the host's fallback).
// Launch: grid (1), block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_sample_min_p(u32* out, const float* logits, u32 n, float temp,
                                                                   float min_p, float u01) {
    ds4_grid_sync();
    __shared__ float csum[DS4_BLOCK];
    const u32 tid = threadIdx.x;
    const u32 best = ds4_block_first_max(logits, n, true);
    if (best == DS4_NO_ID) {
        const u32 g = ds4_block_first_max(logits, n, false);
        if (tid == 0) {
            out[0] = g == DS4_NO_ID ? 0u : g;
            out[1] = 0;
        }
        return;
    }
    const float mx = logits[best];
    const u32 chunk = (n + DS4_BLOCK - 1) / DS4_BLOCK;
    const u32 a = min(n, tid * chunk), b = min(n, a + chunk);
    float s = 0.0f;
    for (u32 i = a; i < b; ++i) {
        const float v = logits[i];
        if (!isfinite(v)) continue;
        const float p = ds4_expf((v - mx) / temp);
        if (p >= min_p) s += p;
    }
    csum[tid] = s;
    __syncthreads();
    if (tid != 0) return;
    float total = 0.0f;
    for (u32 i = 0; i < DS4_BLOCK; ++i) total += csum[i];
    if (!(total > 0.0f && isfinite(total))) {
        out[0] = best;
        out[1] = 0;
        return;
    }
    float r = u01 * total;
    u32 pick = DS4_NO_ID;
    for (u32 c = 0; c < DS4_BLOCK && pick == DS4_NO_ID; ++c) {
        if (r - csum[c] > 0.0f) {
            r -= csum[c];
            continue;
        }
        const u32 ca = min(n, c * chunk), cb = min(n, ca + chunk);
        for (u32 i = ca; i < cb; ++i) {
            const float v = logits[i];
            if (!isfinite(v)) continue;
            const float p = ds4_expf((v - mx) / temp);
            if (p < min_p) continue;
            r -= p;
            if (r <= 0.0f) {
                pick = i;
                break;
            }
        }
    }
    out[0] = pick != DS4_NO_ID ? pick : best;
    out[1] = 1;
}
