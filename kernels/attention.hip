// Attention with sinks over the raw ring and the compressed rows (spec §3.4 "attention core",
// §4.2). K = V = one shared row per token (MQA with one KV head). Decode and batched prefill use the
// same kernel: token t of a batch sits at position pos0 + t and sees
//   raw rows       positions max(0, p - window + 1) .. p, read from ring row (position % ring_cap)
//                  (the ring must hold window + n_tok - 1 rows, spec §4.2), oldest first;
//   compressed     rows 0 .. n_c - 1 with n_c = min(floor((p + 1) / ratio), n_comp_avail) when
//                  ratio != 0; if comp_sel != null and n_c > top_k, only the top_k rows listed in
//                  comp_sel[t][0..top_k) (ascending row indices from ds4_indexer_topk).
// Scores s = (q_h · row) * scale; out_h = sum exp(s - m) row / (exp(sink_h - m) + sum exp(s - m)),
// m = max(sink_h, max s) (spec pitfall 8).
//
// Work split (flash-decoding): a block owns 8 heads and a span of up to rows_per_split (<= 256)
// visible rows of one token; q of its 8 heads is staged in shared memory so each row is read once
// per 8 heads. The split (ds4_att_split) is derived on the device from the batch's position, so a
// captured decode graph launches the most splits the session can need and the blocks past this
// step's count exit. With one split the block writes the final output; otherwise it writes partial
// (m, l, acc) and ds4_attention_combine merges the splits (and exits at once with one split).
#pragma once
#include "formats.h"

#define DS4_ATT_HEADS 8
#define DS4_ATT_ROWS 256
#define DS4_ATT_MAX_DIM 512

// Rows per split and split count of a batch of n_tok tokens at pos0..: the visible rows of its last
// token (after the indexer selection when comp_sel is given), spans of 256 rows from 16 tokens on and
// of ceil(rows / 16) rounded up to a multiple of 32 (32..256) below, so a decode step still fills the
// GPU (the same rule as AttentionShape::splits in src/backend/hip/kernels.rs).
DS4_DEV void ds4_att_split(u32 pos0, u32 n_tok, u32 window, u32 n_comp_avail, u32 ratio, u32 top_k, bool has_sel,
                           u32* rows_per_split, u32* n_split) {
    const u32 p = pos0 + n_tok - 1;
    const u32 n_c = ratio ? min((p + 1) / ratio, n_comp_avail) : 0;
    u32 rows = min(window, p + 1) + (has_sel && n_c > top_k ? top_k : n_c);
    rows = max(rows, 1u);
    u32 rps = DS4_ATT_ROWS;
    if (n_tok < 16) {
        rps = (rows + 15) / 16;
        rps = (rps + 31) / 32 * 32;
        rps = min(max(rps, 32u), (u32)DS4_ATT_ROWS);
    }
    *rows_per_split = rps;
    *n_split = (rows + rps - 1) / rps;
}

// out: f32 [n_tok][n_head][head_dim]; part: f32 [n_tok][n_head][n_split][2 + head_dim] (only used
// when n_split > 1); q: f32 [n_tok][n_head][head_dim]; ring: f32 [ring_cap][head_dim];
// comp: f32 [n_comp_avail][head_dim]; comp_sel: u32 [n_tok][top_k] or null; sinks: f32 [n_head];
// pos: u32 [1] = pos0 (device step parameters).
// Requirements: n_head % 8 == 0, head_dim % 4 == 0, head_dim <= 512.
// Launch: grid (n_head / 8, at least n_split of ds4_att_split, n_tok), block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_attention(float* out, float* part, const float* q,
                                                                const float* ring, const float* comp,
                                                                const u32* comp_sel, const float* sinks,
                                                                const u32* pos, u32 n_head, u32 head_dim,
                                                                u32 ring_cap, u32 window, u32 n_comp_avail, u32 ratio,
                                                                u32 top_k, float scale) {
    __shared__ float4 sq[DS4_ATT_HEADS][DS4_ATT_MAX_DIM / 4];
    __shared__ float sc[DS4_ATT_HEADS][DS4_ATT_ROWS];
    __shared__ const float* srow[DS4_ATT_ROWS];
    __shared__ float sm[DS4_ATT_HEADS], sl[DS4_ATT_HEADS];

    const u32 hg = blockIdx.x, split = blockIdx.y, t = blockIdx.z;
    const u32 pos0 = pos[0];
    u32 rows_per_split, n_split;
    ds4_att_split(pos0, gridDim.z, window, n_comp_avail, ratio, top_k, comp_sel != nullptr, &rows_per_split, &n_split);
    if (split >= n_split) return;
    const u32 h0 = hg * DS4_ATT_HEADS;
    const u32 D = head_dim, D4 = head_dim / 4;
    const u32 p = pos0 + t;
    const u32 n_raw = min(window, p + 1);
    const u32 n_c = ratio ? min((p + 1) / ratio, n_comp_avail) : 0;
    const bool use_sel = comp_sel && n_c > top_k;
    const u32 n_vis = n_raw + (use_sel ? top_k : n_c);
    const u32 r0 = split * rows_per_split;
    const u32 r1 = min(n_vis, r0 + rows_per_split);
    const u32 nr = r1 > r0 ? r1 - r0 : 0;

    for (u32 i = threadIdx.x; i < DS4_ATT_HEADS * D4; i += DS4_BLOCK) {
        const u32 h = i / D4, c = i % D4;
        sq[h][c] = ((const float4*)(q + ((u64)t * n_head + h0 + h) * D))[c];
    }
    for (u32 r = threadIdx.x; r < nr; r += DS4_BLOCK) {
        const u32 v = r0 + r;
        const float* row;
        if (v < n_raw) {
            row = ring + (u64)((p - n_raw + 1 + v) % ring_cap) * D;
        } else {
            const u32 j = v - n_raw;
            row = comp + (u64)(use_sel ? comp_sel[(u64)t * top_k + j] : j) * D;
        }
        srow[r] = row;
    }
    __syncthreads();

    // Scores: one warp per row, all 8 heads.
    for (u32 r = warp_id(); r < nr; r += DS4_WARPS_PER_BLOCK) {
        const float4* row = (const float4*)srow[r];
        float acc[DS4_ATT_HEADS];
#pragma unroll
        for (int h = 0; h < DS4_ATT_HEADS; ++h) acc[h] = 0.0f;
        for (u32 c = lane_id(); c < D4; c += DS4_WARP) {
            const float4 v = row[c];
#pragma unroll
            for (int h = 0; h < DS4_ATT_HEADS; ++h) {
                const float4 qq = sq[h][c];
                acc[h] += v.x * qq.x + v.y * qq.y + v.z * qq.z + v.w * qq.w;
            }
        }
#pragma unroll
        for (int h = 0; h < DS4_ATT_HEADS; ++h) {
            const float s = warp_sum(acc[h]);
            if (lane_id() == 0) sc[h][r] = s * scale;
        }
    }
    __syncthreads();

    // Softmax statistics per head: one warp per head.
    for (u32 h = warp_id(); h < DS4_ATT_HEADS; h += DS4_WARPS_PER_BLOCK) {
        float m = -INFINITY;
        for (u32 r = lane_id(); r < nr; r += DS4_WARP) m = fmaxf(m, sc[h][r]);
        m = warp_max(m);
        float l = 0.0f;
        for (u32 r = lane_id(); r < nr; r += DS4_WARP) {
            const float e = expf(sc[h][r] - m);
            sc[h][r] = e;
            l += e;
        }
        l = warp_sum(l);
        if (lane_id() == 0) {
            sm[h] = m;
            sl[h] = l;
        }
    }
    __syncthreads();

    // Weighted value sum: thread owns dims tid, tid + 256 for all 8 heads.
    constexpr u32 DPT = DS4_ATT_MAX_DIM / DS4_BLOCK;
    float acc[DS4_ATT_HEADS][DPT];
#pragma unroll
    for (int h = 0; h < DS4_ATT_HEADS; ++h)
#pragma unroll
        for (u32 j = 0; j < DPT; ++j) acc[h][j] = 0.0f;
    for (u32 r = 0; r < nr; ++r) {
        const float* row = srow[r];
#pragma unroll
        for (u32 j = 0; j < DPT; ++j) {
            const u32 d = threadIdx.x + j * DS4_BLOCK;
            if (d < D) {
                const float v = row[d];
#pragma unroll
                for (int h = 0; h < DS4_ATT_HEADS; ++h) acc[h][j] += sc[h][r] * v;
            }
        }
    }

    if (n_split == 1) {
#pragma unroll
        for (int h = 0; h < DS4_ATT_HEADS; ++h) {
            const float sink = sinks[h0 + h];
            const float m = fmaxf(sink, sm[h]);
            const float f = nr ? expf(sm[h] - m) : 0.0f;
            const float inv = 1.0f / (expf(sink - m) + sl[h] * f);
            float* o = out + ((u64)t * n_head + h0 + h) * D;
#pragma unroll
            for (u32 j = 0; j < DPT; ++j) {
                const u32 d = threadIdx.x + j * DS4_BLOCK;
                if (d < D) o[d] = acc[h][j] * f * inv;
            }
        }
    } else {
#pragma unroll
        for (int h = 0; h < DS4_ATT_HEADS; ++h) {
            float* pp = part + (((u64)t * n_head + h0 + h) * n_split + split) * (2 + D);
            if (threadIdx.x == 0) {
                pp[0] = nr ? sm[h] : -INFINITY;
                pp[1] = nr ? sl[h] : 0.0f;
            }
#pragma unroll
            for (u32 j = 0; j < DPT; ++j) {
                const u32 d = threadIdx.x + j * DS4_BLOCK;
                if (d < D) pp[2 + d] = acc[h][j];
            }
        }
    }
}

// Merges the n_split partials of ds4_attention with the sink (same formula as the one-split path);
// the split and its arguments (pos .. top_k, comp_sel as a flag) are those of the ds4_attention
// launch it follows. Exits when that launch had one split (it wrote the output itself).
// Launch: grid (n_head, n_tok), block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_attention_combine(float* out, const float* part,
                                                                        const float* sinks, const u32* comp_sel,
                                                                        const u32* pos, u32 n_head, u32 head_dim,
                                                                        u32 window, u32 n_comp_avail, u32 ratio,
                                                                        u32 top_k) {
    const u32 h = blockIdx.x, t = blockIdx.y;
    u32 rows_per_split, n_split;
    ds4_att_split(pos[0], gridDim.y, window, n_comp_avail, ratio, top_k, comp_sel != nullptr, &rows_per_split,
                  &n_split);
    if (n_split <= 1) return;
    const float* pp = part + ((u64)t * n_head + h) * n_split * (2 + head_dim);
    const float sink = sinks[h];
    float m = sink;
    for (u32 s = 0; s < n_split; ++s) m = fmaxf(m, pp[(u64)s * (2 + head_dim)]);
    float denom = expf(sink - m);
    for (u32 s = 0; s < n_split; ++s) {
        const float* ps = pp + (u64)s * (2 + head_dim);
        if (ps[1] > 0.0f) denom += ps[1] * expf(ps[0] - m);
    }
    const float inv = 1.0f / denom;
    float* o = out + ((u64)t * n_head + h) * head_dim;
    for (u32 d = threadIdx.x; d < head_dim; d += DS4_BLOCK) {
        float v = 0.0f;
        for (u32 s = 0; s < n_split; ++s) {
            const float* ps = pp + (u64)s * (2 + head_dim);
            if (ps[1] > 0.0f) v += ps[2 + d] * expf(ps[0] - m);
        }
        o[d] = v * inv;
    }
}
