// Greedy pick, fast: the same answer as ds4_argmax (the first index of the largest logit; NaN never
// wins; 0 when every logit is NaN or -inf; the order of comparisons cannot change the pick), read
// with 16-byte loads, several in flight per thread, so one block streams the vocabulary near the
// bandwidth one compute unit can draw instead of one 4-byte load per thread at a time.
#pragma once
#include "sample.hip"

// ds4_argmax's arguments and output; logits 16-byte aligned. Launch: grid (1), block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_argmax_fast(u32* out, const float* logits, u32 n) {
    __shared__ float sb[DS4_WARPS_PER_BLOCK];
    __shared__ u32 si[DS4_WARPS_PER_BLOCK];
    float best = -INFINITY;
    u32 bi = DS4_NO_ID;
    const u32 n4 = n / 4;
    const float4* l4 = (const float4*)logits;
    auto take = [&](float v, u32 i) {
        if (v > -INFINITY) ds4_best_of(best, bi, v, i);
    };
#pragma unroll 8
    for (u32 c = threadIdx.x; c < n4; c += DS4_BLOCK) {
        const float4 v = l4[c];
        take(v.x, 4 * c);
        take(v.y, 4 * c + 1);
        take(v.z, 4 * c + 2);
        take(v.w, 4 * c + 3);
    }
    for (u32 i = 4 * n4 + threadIdx.x; i < n; i += DS4_BLOCK) take(logits[i], i);
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
    if (threadIdx.x == 0) {
        for (int w = 1; w < DS4_WARPS_PER_BLOCK; ++w) ds4_best_of(best, bi, sb[w], si[w]);
        out[0] = bi == DS4_NO_ID ? 0u : bi;
        out[1] = 0;
    }
}
