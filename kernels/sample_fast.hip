// Greedy pick, fast: the same answer as ds4_argmax (the first index of the largest logit; NaN never
// wins; 0 when every logit is NaN or -inf), split over a grid of blocks so that the vocabulary is
// read by many compute units at once, each thread's 16-byte loads all in flight: every block picks
// among its share, then the last block to finish (by a counter) picks among the blocks' picks.
// ds4_best_of is a total order on the candidates (larger value, then lower id), so neither the split
// nor the order of the folds can change the pick.
#pragma once
#include "sample.hip"

#define DS4_ARGMAX_MAX_BLOCKS 64  // the most blocks of a launch (kernels::ARGMAX_FAST_BLOCKS <= this)

// ds4_argmax's arguments and outputs (out[0] the id, out[1] = 0), with out extended as scratch:
// out[2] the blocks' counter (0 before the launch; the last block puts it back), out[4 + 2 b] and
// out[5 + 2 b] block b's best value (its bits) and id (kernels::SAMPLE_BUFFER_WORDS words in all).
// logits 16-byte aligned. Launch: grid (B <= DS4_ARGMAX_MAX_BLOCKS), block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_argmax_fast(u32* out, const float* logits, u32 n) {
    const u32 nb = gridDim.x, b = blockIdx.x;
    if (nb > DS4_ARGMAX_MAX_BLOCKS) return;
    float best = -INFINITY;
    u32 bi = DS4_NO_ID;
    auto take = [&](float v, u32 i) {
        if (v > -INFINITY) ds4_best_of(best, bi, v, i);
    };
    // Float4 c of the logits goes to block (c / 256) % nb: consecutive threads read consecutive
    // 16-byte words; the tail past the last whole float4 to block 0.
    const u32 n4 = n / 4;
    const float4* l4 = (const float4*)logits;
#pragma unroll 4
    for (u32 c = b * DS4_BLOCK + threadIdx.x; c < n4; c += nb * DS4_BLOCK) {
        const float4 v = l4[c];
        take(v.x, 4 * c);
        take(v.y, 4 * c + 1);
        take(v.z, 4 * c + 2);
        take(v.w, 4 * c + 3);
    }
    if (b == 0)
        for (u32 i = 4 * n4 + threadIdx.x; i < n; i += DS4_BLOCK) take(logits[i], i);
    ds4_block_best(best, bi);
    if (threadIdx.x == 0) {
        out[4 + 2 * b] = ds4m_f2u(best);
        out[5 + 2 * b] = bi;
    }
    if (!last_block_of(&out[2], nb)) return;
    best = -INFINITY;
    bi = DS4_NO_ID;
    if (threadIdx.x < nb) {
        const volatile u32* part = out + 4 + 2 * threadIdx.x;  // other blocks' writes
        best = ds4m_u2f(part[0]);
        bi = part[1];
    }
    ds4_block_best(best, bi);
    if (threadIdx.x == 0) {
        out[0] = bi == DS4_NO_ID ? 0u : bi;
        out[1] = 0;
    }
}
