// Attention with sinks over the raw ring and the compressed rows (docs/model.md#attention-core,
// docs/model.md#device-ring). K = V = one shared row per token (MQA with one KV head). Decode and batched
// prefill use the same kernels: token t of a batch sits at position p = pos0 + t and sees, in this order,
//   raw rows       positions max(0, p - window + 1) .. p, read from ring row (position % ring_cap)
//                  (the ring must hold window + n_tok - 1 rows, docs/model.md#device-ring), oldest first;
//   compressed     rows 0 .. n_c - 1 with n_c = min(floor((p + 1) / ratio), n_comp_avail) when
//                  ratio != 0; if comp_sel != null and n_c > top_k, only the top_k rows listed in
//                  comp_sel[t][0..top_k) (ascending row indices from ds4_indexer_topk).
//
// The arithmetic is the CPU reference's (src/backend/cpu/attention.rs), operation for operation, so
// the output is bitwise equal to it (kernels/prelude.h "arithmetic contract"):
//   s_r   = dot(q_h, row_r) * scale           (the 8-lane order of quant.rs dot_f32)
//   m     = max(sink_h, max_r s_r)
//   w_r   = exp(s_r - m);  den = exp(sink_h - m) + w_0 + w_1 + ...   (added in row order)
//   acc_d = fma(w_r, row_r[d], acc_d) over the rows in order;  out_h[d] = acc_d * (1 / den)
// The sums over rows are sequential chains (as on the CPU), so the work is split over three launches
// that keep many chains in flight: scores (rows spread over blocks), the softmax of each (token,
// head), and the weighted values (dims and heads spread over blocks).
#pragma once
#include "formats.h"

#define DS4_ATT_SCORE_ROWS 8   // rows per block of ds4_attention_scores
#define DS4_ATT_MAX_DIM 512
#define DS4_ATT_VAL_HEADS 8    // heads per block of ds4_attention_values
#define DS4_ATT_VAL_DIMS 64    // dims per block of ds4_attention_values

// Visible rows of the token at position p (raw + compressed after the selection).
struct AttRows {
    u32 n_raw, n_c, n_vis;
    bool use_sel;
};
DS4_DEV AttRows att_rows(u32 p, u32 window, u32 n_comp_avail, u32 ratio, u32 top_k, bool has_sel) {
    AttRows a;
    a.n_raw = min(window, p + 1);
    a.n_c = ratio ? min((p + 1) / ratio, n_comp_avail) : 0;
    a.use_sel = has_sel && a.n_c > top_k;
    a.n_vis = a.n_raw + (a.use_sel ? top_k : a.n_c);
    return a;
}

// Row v (0 .. n_vis) of the token at position p (token t of the batch).
DS4_DEV const float* att_row(const AttRows& a, u32 v, u32 p, u32 t, const float* ring, const float* comp,
                             const u32* comp_sel, u32 ring_cap, u32 top_k, u32 head_dim) {
    if (v < a.n_raw) return ring + (u64)((p - a.n_raw + 1 + v) % ring_cap) * head_dim;
    const u32 j = v - a.n_raw;
    return comp + (u64)(a.use_sel ? comp_sel[(u64)t * top_k + j] : j) * head_dim;
}

// Scores: sc[t][h][v] = dot8(q[t][h], row_v) * scale for the visible rows v of token t.
// sc: f32 [n_tok][n_head][sc_stride] (sc_stride >= the most visible rows of any token);
// q: f32 [n_tok][n_head][head_dim]; ring: f32 [ring_cap][head_dim]; comp: f32 [n_comp_avail][head_dim];
// comp_sel: u32 [n_tok][top_k] or null; pos: u32 [1] = pos0 (device step parameters).
// head_dim % 8 == 0, head_dim <= 512.
// Launch: grid (ceil(most visible rows / 8), n_tok), block 256; blocks past a token's rows exit.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_attention_scores(float* sc, const float* q, const float* ring,
                                                                       const float* comp, const u32* comp_sel,
                                                                       const u32* pos, u32 n_head, u32 head_dim,
                                                                       u32 ring_cap, u32 window, u32 n_comp_avail,
                                                                       u32 ratio, u32 top_k, u32 sc_stride,
                                                                       float scale) {
    ds4_grid_sync();
    // Rows padded by 4 floats: the 8 rows a warp reads at one offset fall in different banks.
    __shared__ float4 srow[DS4_ATT_SCORE_ROWS][DS4_ATT_MAX_DIM / 4 + 1];
    const u32 t = blockIdx.y, p = pos[0] + t;
    const AttRows a = att_rows(p, window, n_comp_avail, ratio, top_k, comp_sel != nullptr);
    const u32 r0 = blockIdx.x * DS4_ATT_SCORE_ROWS;
    if (r0 >= a.n_vis || head_dim > DS4_ATT_MAX_DIM) return;
    const u32 nr = min((u32)DS4_ATT_SCORE_ROWS, a.n_vis - r0), d4 = head_dim / 4;
    for (u32 i = threadIdx.x; i < nr * d4; i += DS4_BLOCK) {
        const u32 r = i / d4, c = i % d4;
        srow[r][c] = ((const float4*)att_row(a, r0 + r, p, t, ring, comp, comp_sel, ring_cap, top_k, head_dim))[c];
    }
    __syncthreads();
    // One (head, row) pair per thread; consecutive threads share the head (q is broadcast).
    for (u32 pr = threadIdx.x; pr < n_head * nr; pr += DS4_BLOCK) {
        const u32 h = pr / nr, r = pr % nr;
        const float s = thread_dot8_f32(q + ((u64)t * n_head + h) * head_dim, (const float*)srow[r], head_dim);
        sc[((u64)t * n_head + h) * sc_stride + r0 + r] = s * scale;
    }
}

// Softmax of each (token, head): m = max(sink, scores); the scores become w_v = exp(s_v - m) in
// place; inv[t][h] = 1 / (exp(sink - m) + w_0 + w_1 + ...) with the weights added in row order.
// Launch: grid (n_head, n_tok), block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_attention_softmax(float* sc, float* inv, const float* sinks,
                                                                        const u32* comp_sel, const u32* pos,
                                                                        u32 n_head, u32 window, u32 n_comp_avail,
                                                                        u32 ratio, u32 top_k, u32 sc_stride) {
    ds4_grid_sync();
    __shared__ float red[DS4_WARPS_PER_BLOCK];
    const u32 h = blockIdx.x, t = blockIdx.y, p = pos[0] + t;
    const AttRows a = att_rows(p, window, n_comp_avail, ratio, top_k, comp_sel != nullptr);
    float* s = sc + ((u64)t * n_head + h) * sc_stride;
    const float sink = sinks[h];
    float m = sink;
    for (u32 v = threadIdx.x; v < a.n_vis; v += DS4_BLOCK) m = fmaxf(m, s[v]);
    m = block_max(m, red);
    // The weights of a span of rows go to global memory and to shared memory, from where thread 0
    // adds them in row order, four per load.
    constexpr u32 SPAN = 1024;
    __shared__ float4 w4[SPAN / 4];
    float* w = (float*)w4;
    float den = ds4_expf(sink - m);
    for (u32 v0 = 0; v0 < a.n_vis; v0 += SPAN) {
        const u32 nv = min(SPAN, a.n_vis - v0);
        for (u32 v = threadIdx.x; v < nv; v += DS4_BLOCK) {
            const float e = ds4_expf(s[v0 + v] - m);
            s[v0 + v] = e;
            w[v] = e;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            u32 v = 0;
            for (; v + 4 <= nv; v += 4) {
                const float4 q = *(const float4*)(w + v);
                den += q.x;
                den += q.y;
                den += q.z;
                den += q.w;
            }
            for (; v < nv; ++v) den += w[v];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) inv[(u64)t * n_head + h] = 1.0f / den;
}

// Weighted values: out[t][h][d] = (sum over rows in order of fma(w_v, row_v[d], .)) * inv[t][h], for
// DS4_ATT_VAL_HEADS heads and DS4_ATT_VAL_DIMS dims per block (each thread two heads of one dim).
// out: f32 [n_tok][n_head][head_dim]. n_head % 8 == 0, head_dim % 64 == 0.
// Launch: grid (n_head / 8, head_dim / 64, n_tok), block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_attention_values(float* out, const float* sc, const float* inv,
                                                                       const float* ring, const float* comp,
                                                                       const u32* comp_sel, const u32* pos,
                                                                       u32 n_head, u32 head_dim, u32 ring_cap,
                                                                       u32 window, u32 n_comp_avail, u32 ratio,
                                                                       u32 top_k, u32 sc_stride) {
    ds4_grid_sync();
    constexpr u32 CH = 64;  // rows staged per step
    __shared__ float sw[DS4_ATT_VAL_HEADS][CH];
    __shared__ const float* sp[CH];
    const u32 h0 = blockIdx.x * DS4_ATT_VAL_HEADS, t = blockIdx.z, p = pos[0] + t;
    const u32 d = blockIdx.y * DS4_ATT_VAL_DIMS + threadIdx.x % DS4_ATT_VAL_DIMS;
    const u32 hp = threadIdx.x / DS4_ATT_VAL_DIMS;  // heads h0 + 2 hp, h0 + 2 hp + 1
    const AttRows a = att_rows(p, window, n_comp_avail, ratio, top_k, comp_sel != nullptr);
    const float* w0 = sc + ((u64)t * n_head + h0) * sc_stride;
    float acc0 = 0.0f, acc1 = 0.0f;
    for (u32 c0 = 0; c0 < a.n_vis; c0 += CH) {
        const u32 nc = min(CH, a.n_vis - c0);
        __syncthreads();
        for (u32 i = threadIdx.x; i < DS4_ATT_VAL_HEADS * CH; i += DS4_BLOCK) {
            const u32 hh = i / CH, v = i % CH;
            if (v < nc) sw[hh][v] = w0[(u64)hh * sc_stride + c0 + v];
        }
        for (u32 v = threadIdx.x; v < nc; v += DS4_BLOCK)
            sp[v] = att_row(a, c0 + v, p, t, ring, comp, comp_sel, ring_cap, top_k, head_dim);
        __syncthreads();
        // Rows in order; eight rows' values are loaded before they are accumulated, so the loads
        // overlap (a load per dependent FMA would leave the chain waiting on memory).
        u32 v = 0;
        for (; v + 8 <= nc; v += 8) {
            float x[8];
#pragma unroll
            for (u32 j = 0; j < 8; ++j) x[j] = sp[v + j][d];
#pragma unroll
            for (u32 j = 0; j < 8; ++j) {
                acc0 = fmaf(sw[2 * hp][v + j], x[j], acc0);
                acc1 = fmaf(sw[2 * hp + 1][v + j], x[j], acc1);
            }
        }
        for (; v < nc; ++v) {
            const float x = sp[v][d];
            acc0 = fmaf(sw[2 * hp][v], x, acc0);
            acc1 = fmaf(sw[2 * hp + 1][v], x, acc1);
        }
    }
    const u64 o = ((u64)t * n_head + h0 + 2 * hp) * head_dim + d;
    out[o] = acc0 * inv[(u64)t * n_head + h0 + 2 * hp];
    out[o + head_dim] = acc1 * inv[(u64)t * n_head + h0 + 2 * hp + 1];
}
