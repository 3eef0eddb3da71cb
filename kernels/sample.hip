// Sampling on the device (spec §7.2), so a decode loop can feed the chosen token straight into
// ds4_embed_hc without waiting for the host. The random number is drawn by the host from its own
// xorshift64* stream (it does not depend on the logits) and passed in as `u01`. Paths that need a
// sort (top_k > 0 or top_p < 1) stay on the host.
#pragma once
#include "formats.h"

// out[0] = first index of the maximal finite logit (greedy, spec §7.1 "--temp 0"); 0 when none.
// Launch: grid (1), block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_argmax(u32* out, const float* logits, u32 n) {
    __shared__ float sb[DS4_WARPS_PER_BLOCK];
    __shared__ u32 si[DS4_WARPS_PER_BLOCK];
    float best = -INFINITY;
    u32 bi = 0xffffffffu;
    for (u32 i = threadIdx.x; i < n; i += DS4_BLOCK) {
        const float v = logits[i];
        if (isfinite(v) && (v > best || bi == 0xffffffffu)) {
            best = v;
            bi = i;
        }
    }
#pragma unroll
    for (int o = DS4_WARP / 2; o > 0; o >>= 1) {
        const float ob = __shfl_xor(best, o, DS4_WARP);
        const u32 oi = __shfl_xor(bi, o, DS4_WARP);
        if (oi != 0xffffffffu && (bi == 0xffffffffu || ob > best || (ob == best && oi < bi))) {
            best = ob;
            bi = oi;
        }
    }
    if (lane_id() == 0) {
        sb[warp_id()] = best;
        si[warp_id()] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < DS4_WARPS_PER_BLOCK; ++w) {
            if (si[w] != 0xffffffffu && (bi == 0xffffffffu || sb[w] > best || (sb[w] == best && si[w] < bi))) {
                best = sb[w];
                bi = si[w];
            }
        }
        out[0] = bi == 0xffffffffu ? 0u : bi;
    }
}

// Default sampler path (spec §7.2, top_k = 0 and top_p = 1): p_i = exp((l_i - l_max) / temp) for
// finite logits, tokens with p_i < min_p dropped, r = u01 * sum p, then walking ids in increasing
// order subtracting p_i, the first id where r <= 0. Sums are taken per contiguous chunk and then
// in chunk order, so only float rounding differs from a sequential walk.
// Launch: grid (1), block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_sample_min_p(u32* out, const float* logits, u32 n, float temp,
                                                                   float min_p, float u01) {
    __shared__ float scratch[DS4_WARPS_PER_BLOCK];
    __shared__ float csum[DS4_BLOCK];
    const u32 tid = threadIdx.x;
    float mx = -INFINITY;
    for (u32 i = tid; i < n; i += DS4_BLOCK) {
        const float v = logits[i];
        if (isfinite(v)) mx = fmaxf(mx, v);
    }
    mx = block_max(mx, scratch);
    const u32 chunk = (n + DS4_BLOCK - 1) / DS4_BLOCK;
    const u32 a = min(n, tid * chunk), b = min(n, a + chunk);
    float s = 0.0f;
    for (u32 i = a; i < b; ++i) {
        const float v = logits[i];
        if (!isfinite(v)) continue;
        const float p = expf((v - mx) / temp);
        if (p >= min_p) s += p;
    }
    csum[tid] = s;
    __syncthreads();
    if (tid == 0) {
        float total = 0.0f;
        for (u32 i = 0; i < DS4_BLOCK; ++i) total += csum[i];
        float r = u01 * total;
        u32 pick = 0xffffffffu, last = 0xffffffffu;
        for (u32 c = 0; c < DS4_BLOCK && pick == 0xffffffffu; ++c) {
            const u32 ca = min(n, c * chunk), cb = min(n, ca + chunk);
            if (r - csum[c] > 0.0f) {
                r -= csum[c];
                // remember the last kept id of skipped chunks for the rounding fallback
                for (u32 i = cb; i > ca; --i) {
                    const float v = logits[i - 1];
                    if (isfinite(v) && expf((v - mx) / temp) >= min_p) {
                        last = i - 1;
                        break;
                    }
                }
                continue;
            }
            for (u32 i = ca; i < cb; ++i) {
                const float v = logits[i];
                if (!isfinite(v)) continue;
                const float p = expf((v - mx) / temp);
                if (p < min_p) continue;
                last = i;
                r -= p;
                if (r <= 0.0f) {
                    pick = i;
                    break;
                }
            }
        }
        out[0] = pick != 0xffffffffu ? pick : (last != 0xffffffffu ? last : 0u);
    }
}
