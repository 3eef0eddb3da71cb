// Lightning indexer of the ratio-4 layers (docs/model.md#indexer): scores of the compressed indexer rows and
// the top-k selection. The query heads come from ds4_matvec_f16 (indexer.attn_q_b · qrn) followed by
// ds4_rows_finish(ROPE | HADAMARD_FP4); the head weights from ds4_matvec_f16 (indexer.proj · xn).
// Both kernels skip the tokens that see <= top_k rows (ds4_attention then uses every row without a
// selection), so they may be launched for any batch: a captured decode graph always contains them.
// pos: u32 [1] = pos0, the batch's first position (device step parameters).
#pragma once
#include "formats.h"

#define DS4_IDX_MAX_HEADS 64
#define DS4_IDX_DIM 128
static_assert(DS4_BLOCK == 256, "ds4_indexer_topk: one thread per digit of a radix pass");
#define DS4_IDX_ROWS 16  // rows per block: 2 per warp, so a few hundred rows still fill the device

// scores[t][c] = sum_h max(0, krows[c] · qi[t][h]) * (w[t][h] * w_scale)  for c < n_c(t), summed as
// the CPU reference does (see the loop), where
// n_c(t) = min(floor((pos0 + t + 1) / ratio), n_comp_avail); entries c >= n_c(t) are not written,
// nor any entry of a token with n_c(t) <= top_k.
// qi: f32 [n_tok][n_head][128]; w: f32 [n_tok][n_head]; krows: f32 [n_comp_avail][128];
// scores: f32 [n_tok][score_stride]. w_scale = 1/sqrt(head_dim * n_head) (docs/model.md#indexer). n_head <= 64.
// Launch: grid (ceil(n_comp_avail / 128), n_tok), block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_indexer_scores(float* scores, const float* qi, const float* w,
                                                                     const float* krows, const u32* pos,
                                                                     u32 n_head, u32 n_comp_avail, u32 ratio,
                                                                     u32 top_k, u32 score_stride, float w_scale) {
    ds4_grid_sync();
    __shared__ float sq[DS4_IDX_MAX_HEADS][DS4_IDX_DIM + 1];  // +1: conflict-free column reads
    __shared__ float sw[DS4_IDX_MAX_HEADS];
    __shared__ float srow[DS4_WARPS_PER_BLOCK][DS4_IDX_DIM];
    const u32 t = blockIdx.y;
    const u32 n_c = min((pos[0] + t + 1) / ratio, n_comp_avail);
    const u32 c0 = blockIdx.x * DS4_IDX_ROWS;
    if (n_c <= top_k || c0 >= n_c || n_head > DS4_IDX_MAX_HEADS) return;
    for (u32 i = threadIdx.x; i < n_head * DS4_IDX_DIM; i += DS4_BLOCK)
        sq[i / DS4_IDX_DIM][i % DS4_IDX_DIM] = qi[(u64)t * n_head * DS4_IDX_DIM + i];
    for (u32 h = threadIdx.x; h < n_head; h += DS4_BLOCK) sw[h] = w[(u64)t * n_head + h] * w_scale;
    __syncthreads();
    const u32 c1 = min(n_c, c0 + DS4_IDX_ROWS);
    float* myrow = srow[warp_id()];
    for (u32 c = c0 + warp_id(); c < c1; c += DS4_WARPS_PER_BLOCK) {
        for (u32 i = lane_id(); i < DS4_IDX_DIM; i += DS4_WARP) myrow[i] = krows[(u64)c * DS4_IDX_DIM + i];
        ds4_sync_warp();
        // The reference's order (cpu/indexer.rs): per head the 8-lane dot of quant.rs dot_f32, then
        // acc += max(dot, 0) * w_h over the heads in order. A round scores DS4_WARP / 8 heads, one
        // per group of 8 lanes; every lane then adds them in head order (broadcasts).
        float acc = 0.0f;
        constexpr u32 G = DS4_WARP / 8;
        for (u32 hb = 0; hb < n_head; hb += G) {
            const u32 h = min(hb + lane_id() / 8, n_head - 1);
            const float dw = fmaxf(dot8_f32(myrow, sq[h], DS4_IDX_DIM), 0.0f) * sw[h];
#pragma unroll
            for (u32 g = 0; g < G; ++g) {
                const float v = __shfl(dw, 8 * g, DS4_WARP);
                if (hb + g < n_head) acc += v;
            }
        }
        if (lane_id() == 0) scores[(u64)t * score_stride + c] = acc;
        ds4_sync_warp();
    }
}

// Order-preserving map of a float to u32 (larger float -> larger key); -0 is folded into +0 so
// ties between zero scores fall back to the row index like the CPU's float comparison.
DS4_DEV u32 float_key(float f) {
    if (f == 0.0f) f = 0.0f;
    const u32 b = __float_as_uint(f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Exclusive prefix sum of `v` over the block's threads in thread order (every thread of a
// DS4_BLOCK-thread block calls it): a butterfly scan inside each warp, then the warp totals.
DS4_DEV u32 block_scan_excl(u32 v, u32* wsum) {
    u32 incl = v, sum = v;
#pragma unroll
    for (int o = 1; o < DS4_WARP; o <<= 1) {
        const u32 t = __shfl_xor(sum, o, DS4_WARP);
        if (lane_id() & o) incl += t;
        sum += t;
    }
    if (lane_id() == DS4_WARP - 1) wsum[warp_id()] = sum;
    __syncthreads();
    u32 before = 0;
    for (u32 w = 0; w < warp_id(); ++w) before += wsum[w];
    __syncthreads();  // wsum is reused by the next call
    return before + incl - v;
}

// Top-k rows of each token by score, ties to the lower row index (docs/model.md#indexer), written as ascending
// row indices: sel[t][0..top_k). Only for tokens with n_c(t) > top_k (see ds4_indexer_scores);
// other tokens' lists are left untouched. Radix select of the k-th largest key (4 passes of 8
// bits), then one ordered pass that keeps every key above it and the lowest-index equal keys.
// Launch: grid (n_tok), block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_indexer_topk(u32* sel, const float* scores, const u32* pos,
                                                                   u32 score_stride, u32 n_comp_avail, u32 ratio,
                                                                   u32 top_k) {
    ds4_grid_sync();
    __shared__ u32 hist[256];
    __shared__ u32 s_prefix, s_need;
    __shared__ u32 wsum[DS4_WARPS_PER_BLOCK];
    const u32 t = blockIdx.x, tid = threadIdx.x;
    const u32 n = min((pos[0] + t + 1) / ratio, n_comp_avail);
    if (n <= top_k) return;
    const float* sr = scores + (u64)t * score_stride;
    u32 prefix = 0, mask = 0, need = top_k;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (u32 i = tid; i < 256; i += DS4_BLOCK) hist[i] = 0;
        __syncthreads();
        for (u32 i = tid; i < n; i += DS4_BLOCK) {
            const u32 k = float_key(sr[i]);
            if ((k & mask) == prefix) atomicAdd(&hist[(k >> shift) & 255], 1u);
        }
        __syncthreads();
        // The digit d: the largest whose keys, with those of every larger digit, reach `need`
        // (thread i holds digit 255 - i, so a prefix sum over threads counts from the top).
        {
            const u32 d = 255 - tid;
            const u32 v = hist[d];
            const u32 above = block_scan_excl(v, wsum);  // keys with a larger digit
            if ((above + v >= need || d == 0) && above < need) {
                s_prefix = prefix | (d << shift);
                s_need = need - above;
            }
        }
        __syncthreads();
        prefix = s_prefix;
        need = s_need;
        mask |= 255u << shift;
        __syncthreads();
    }
    // prefix = the k-th largest key; `need` rows equal to it are taken (the lowest indices).
    const u32 chunk = (n + DS4_BLOCK - 1) / DS4_BLOCK;
    const u32 a = min(n, tid * chunk), b = min(n, a + chunk);
    u32 gt = 0, eq = 0;
    for (u32 i = a; i < b; ++i) {
        const u32 k = float_key(sr[i]);
        gt += k > prefix;
        eq += k == prefix;
    }
    // Equal keys kept by this thread (the lowest indices first), then its output offset.
    const u32 eq_before = block_scan_excl(eq, wsum);
    u32 take = eq_before >= need ? 0 : min(eq, need - eq_before);
    u32 o = block_scan_excl(gt + take, wsum);
    u32* out = sel + (u64)t * top_k;
    for (u32 i = a; i < b; ++i) {
        const u32 k = float_key(sr[i]);
        if (k > prefix || (k == prefix && take > 0)) {
            if (k == prefix) --take;
            if (o < top_k) out[o] = i;
            ++o;
        }
    }
}
