// Greedy pick and the default min-p draw, fast: the answers of ds4_argmax and ds4_sample_min_p, with
// the vocabulary split over a grid of blocks so that it is read by many compute units at once, each
// thread's 16-byte loads in flight together; the last block to finish (by a counter) combines the
// blocks' results. ds4_best_of is a total order on the candidates (larger value, then lower id), so
// neither the split nor the order of the folds can change a pick; the min-p draw's sums are taken in
// another order than the exact kernel's, which moves only draws within float rounding of a boundary.
#pragma once
#include "sample.hip"

#define DS4_SAMPLE_MAX_BLOCKS 64  // the most blocks of a launch (kernels::SAMPLE_FAST_BLOCKS <= this)

// The scratch words of `out` past the pick's two (kernels::SAMPLE_BUFFER_WORDS): [2] the blocks'
// counter (0 before a launch; the last block puts it back), [3] the min-p draw's first finite
// maximum, from [4] DS4_SAMPLE_PART words per block.
#define DS4_SAMPLE_COUNTER 2  // kernels::SAMPLE_COUNTER_WORD
#define DS4_SAMPLE_BEST 3
#define DS4_SAMPLE_PARTS 4
#define DS4_SAMPLE_PART 4

// take(v, i) for every logit of block b's share among nb blocks: float4 c goes to block (c / 256) % nb
// (consecutive threads read consecutive 16-byte words), the tail past the last whole float4 to block 0.
template <typename Take>
DS4_DEV void ds4_share_each(const float* logits, u32 n, u32 nb, u32 b, Take take) {
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
}

// The best of the nb candidates (value bits, id) that the blocks wrote at part[DS4_SAMPLE_PART b + k],
// in thread 0 (volatile: other blocks of this launch wrote them).
DS4_DEV void ds4_fold_parts(const u32* part, u32 k, u32 nb, float& best, u32& bi) {
    best = -INFINITY;
    bi = DS4_NO_ID;
    if (threadIdx.x < nb) {
        const volatile u32* p = part + DS4_SAMPLE_PART * threadIdx.x + k;
        best = ds4m_u2f(p[0]);
        bi = p[1];
    }
    ds4_block_best(best, bi);
}

// ds4_argmax's arguments and outputs (out[0] the id, out[1] = 0), out extended by the scratch words
// above. logits 16-byte aligned. Launch: grid (B <= DS4_SAMPLE_MAX_BLOCKS), block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_argmax_fast(u32* out, const float* logits, u32 n) {
    ds4_grid_sync();
    const u32 nb = gridDim.x, b = blockIdx.x;
    if (nb > DS4_SAMPLE_MAX_BLOCKS) return;
    float best = -INFINITY;
    u32 bi = DS4_NO_ID;
    ds4_share_each(logits, n, nb, b, [&](float v, u32 i) {
        if (v > -INFINITY) ds4_best_of(best, bi, v, i);
    });
    ds4_block_best(best, bi);
    u32* part = out + DS4_SAMPLE_PARTS;
    if (threadIdx.x == 0) {
        part[DS4_SAMPLE_PART * b] = ds4m_f2u(best);
        part[DS4_SAMPLE_PART * b + 1] = bi;
    }
    if (!last_block_of(&out[DS4_SAMPLE_COUNTER], nb)) return;
    ds4_fold_parts(part, 0, nb, best, bi);
    if (threadIdx.x == 0) {
        out[0] = bi == DS4_NO_ID ? 0u : bi;
        out[1] = 0;
    }
}

// The kept weight of logit v for the min-p draw, as ds4_sample_min_p computes it; `kept` false for a
// logit that is not finite or whose weight is below min_p.
DS4_DEV float min_p_weight(float v, float mx, float temp, float min_p, bool& kept) {
    kept = false;
    if (!isfinite(v)) return 0.0f;
    const float p = ds4_expf((v - mx) / temp);
    kept = p >= min_p;
    return kept ? p : 0.0f;
}

// The min-p draw's share of block b: ids [b S, (b + 1) S) with S a multiple of 4 * DS4_BLOCK, each
// thread a contiguous run of S / DS4_BLOCK ids (16-byte aligned).
DS4_DEV u32 min_p_share(u32 n, u32 nb) {
    const u32 q = 4 * DS4_BLOCK;
    return ((n + nb - 1) / nb + q - 1) / q * q;
}

// The thread's run of block b's share: the sum of its kept weights, in id order.
DS4_DEV float min_p_run_sum(const float* logits, u32 n, u32 a, u32 len, float mx, float temp, float min_p) {
    float s = 0.0f;
    bool kept;
    for (u32 i = a; i < min(n, a + len); i += 4) {
        if (i + 4 <= n) {
            const float4 v = *(const float4*)(logits + i);
            s += min_p_weight(v.x, mx, temp, min_p, kept);
            s += min_p_weight(v.y, mx, temp, min_p, kept);
            s += min_p_weight(v.z, mx, temp, min_p, kept);
            s += min_p_weight(v.w, mx, temp, min_p, kept);
        } else {
            for (u32 j = i; j < n; ++j) s += min_p_weight(logits[j], mx, temp, min_p, kept);
        }
    }
    return s;
}

// The min-p draw, fast, in two launches with ds4_sample_min_p's arguments (kernels::sample_min_p_fast):
// 1. ds4_sample_min_p_max_fast: the first finite maximum (the draw's reference) and the greedy pick
//    (for a vocabulary with no finite logit: then it also writes the result, out[1] = 0), split over
//    the blocks as ds4_argmax_fast; out[3] = the first finite maximum or DS4_NO_ID.
// 2. ds4_sample_min_p_draw_fast: block b sums the kept weights of its share (its threads' runs, then
//    block_sum); the last block adds the blocks' sums in block order, takes r = u01 * total and walks
//    the shares, then the runs of the share where r runs out, then that run's ids (the exact kernel's
//    walk: a share or run is passed while r minus its sum stays above 0, an id is picked when r minus
//    its weight reaches 0 or less), the first finite maximum when rounding leaves r above 0 at the end.
// logits 16-byte aligned. Launch: grid (B <= DS4_SAMPLE_MAX_BLOCKS), block 256, both the same B.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_sample_min_p_max_fast(u32* out, const float* logits, u32 n,
                                                                           float temp, float min_p, float u01) {
    ds4_grid_sync();
    const u32 nb = gridDim.x, b = blockIdx.x;
    if (nb > DS4_SAMPLE_MAX_BLOCKS) return;
    float bf = -INFINITY, ba = -INFINITY;  // first finite maximum; greedy pick (every logit above -inf)
    u32 jf = DS4_NO_ID, ja = DS4_NO_ID;
    ds4_share_each(logits, n, nb, b, [&](float v, u32 i) {
        if (isfinite(v)) ds4_best_of(bf, jf, v, i);
        if (v > -INFINITY) ds4_best_of(ba, ja, v, i);
    });
    ds4_block_best(bf, jf);
    ds4_block_best(ba, ja);
    u32* part = out + DS4_SAMPLE_PARTS;
    if (threadIdx.x == 0) {
        u32* p = part + DS4_SAMPLE_PART * b;
        p[0] = ds4m_f2u(bf);
        p[1] = jf;
        p[2] = ds4m_f2u(ba);
        p[3] = ja;
    }
    if (!last_block_of(&out[DS4_SAMPLE_COUNTER], nb)) return;
    ds4_fold_parts(part, 0, nb, bf, jf);
    ds4_fold_parts(part, 2, nb, ba, ja);
    if (threadIdx.x == 0) {
        out[DS4_SAMPLE_BEST] = jf;
        if (jf == DS4_NO_ID) {
            out[0] = ja == DS4_NO_ID ? 0u : ja;
            out[1] = 0;
        }
    }
}

extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_sample_min_p_draw_fast(u32* out, const float* logits, u32 n,
                                                                            float temp, float min_p, float u01) {
    ds4_grid_sync();
    __shared__ float scratch[DS4_GROUPS32];
    __shared__ float runs[DS4_BLOCK];
    __shared__ float s_r;
    __shared__ u32 s_share, s_pick;
    const u32 nb = gridDim.x, b = blockIdx.x, tid = threadIdx.x;
    if (nb > DS4_SAMPLE_MAX_BLOCKS) return;
    const u32 best = out[DS4_SAMPLE_BEST];  // the previous launch's
    if (best == DS4_NO_ID) return;          // no finite logit: the previous launch wrote the pick
    const float mx = logits[best];
    const u32 share = min_p_share(n, nb), len = share / DS4_BLOCK;
    const float s = block_sum(min_p_run_sum(logits, n, b * share + tid * len, len, mx, temp, min_p), scratch);
    u32* part = out + DS4_SAMPLE_PARTS;
    if (tid == 0) part[DS4_SAMPLE_PART * b] = ds4m_f2u(s);
    if (!last_block_of(&out[DS4_SAMPLE_COUNTER], nb)) return;
    if (tid == 0) {
        const volatile u32* p = part;
        float total = 0.0f;
        for (u32 k = 0; k < nb; ++k) total += ds4m_u2f(p[DS4_SAMPLE_PART * k]);
        float r = u01 * total;
        u32 c = nb;
        if (total > 0.0f && isfinite(total)) {
            for (c = 0; c < nb; ++c) {
                const float sk = ds4m_u2f(p[DS4_SAMPLE_PART * c]);
                if (!(r - sk > 0.0f)) break;
                r -= sk;
            }
        } else {
            out[0] = best;  // nothing kept: the host draws nothing
            out[1] = 0;
            c = nb + 1;
        }
        s_r = r;
        s_share = c;
        s_pick = DS4_NO_ID;
    }
    __syncthreads();
    if (s_share > nb) return;
    // The walk from share s_share on (later shares only when rounding left r above 0 in this one).
    for (u32 c = s_share; c < nb; ++c) {
        runs[tid] = min_p_run_sum(logits, n, c * share + tid * len, len, mx, temp, min_p);
        __syncthreads();
        if (tid == 0) {
            float r = s_r;
            u32 pick = DS4_NO_ID;
            for (u32 t = 0; t < DS4_BLOCK && pick == DS4_NO_ID; ++t) {
                if (r - runs[t] > 0.0f) {
                    r -= runs[t];
                    continue;
                }
                const u32 a = c * share + t * len;
                for (u32 i = a; i < min(n, a + len); ++i) {
                    bool kept;
                    const float w = min_p_weight(logits[i], mx, temp, min_p, kept);
                    if (!kept) continue;
                    r -= w;
                    if (r <= 0.0f) {
                        pick = i;
                        break;
                    }
                }
            }
            s_r = r;
            s_pick = pick;
        }
        __syncthreads();
        if (s_pick != DS4_NO_ID) break;
    }
    if (tid == 0) {
        out[0] = s_pick != DS4_NO_ID ? s_pick : best;
        out[1] = 1;
    }
}
