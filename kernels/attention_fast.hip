// Fast decode attention (docs/arithmetic.md): the rows a token sees (kernels/attention.hip: raw ring
// rows, then the compressed rows, after the indexer's selection) are split over many blocks,
// flash-decoding style. Each block takes one slice of rows and DS4_AFD_HEADS heads and writes, per
// head, the slice's partial softmax state (max m, sum l of exp(s - m), and the unnormalised
// values acc[d] = sum exp(s - m) row[d]); a merge launch combines the slices with the sink:
//   M = max(sink, m_s),  den = exp(sink - M) + sum_s l_s exp(m_s - M),
//   out[d] = (sum_s exp(m_s - M) acc_s[d]) / den.
// Same math as the exact kernels, summed in a different order (tree reductions across lanes, slices
// merged at the end), so within the fast tolerances of the exact twin. Two launches replace the
// exact kernels' three, and no step is a chain over all rows: the cost per step is the rows read
// divided over the blocks, plus the merge of at most `n_split` slices.
//
// Slices: a token seeing n_vis rows uses chunk = max(min_chunk, round_up(ceil(n_vis / most_slices), 8))
// rows per slice and n_used = ceil(n_vis / chunk) slices (both kernels compute the same). The slices
// depend on the rows, on min_chunk and on most_slices (fixed for a session and batch size), never on
// the grid: the host launches n_split >= n_used blocks per token (the session's most rows while
// capturing the decode graph, the batch's own rows on direct launches), the extra blocks exit, and
// both ways give the same bits. The partial buffers are laid out with n_split slices per head.
#pragma once
#include "attention.hip"
#include "norm_quant.hip"  // q8_0_store_lane (the fused merge's Q8_0)
#include "rows.hip"        // rope_theta (the fused merge's inverse RoPE)
#include "mma.h"         // the matrix-core attention

#define DS4_AFD_HEADS 8       // heads per block of ds4_attention_decode_split
#define DS4_AFD_SUB 64        // rows scored before their values are added (online rescale between)
#ifndef DS4_AFD_TILE  // -D for experiments: the host does not depend on it
#define DS4_AFD_TILE 4  // rows whose loads are in flight together
#endif
#define DS4_AFD_ROUND 8       // slice lengths are multiples of this
#define DS4_AFD_STAGED 256    // rows of a slice whose addresses are staged in shared memory

// The slices of a token that sees n_vis rows, at least min_chunk rows a slice (a multiple of
// DS4_AFD_ROUND; kernels::AttentionSplitPlan::min_rows).
struct AfdSlices {
    u32 chunk, n_used;
};
DS4_DEV AfdSlices afd_slices(u32 n_vis, u32 most_slices, u32 min_chunk) {
    AfdSlices s;
    const u32 per = (n_vis + most_slices - 1) / most_slices;
    s.chunk = max(min_chunk, (per + DS4_AFD_ROUND - 1) / DS4_AFD_ROUND * DS4_AFD_ROUND);
    s.n_used = (n_vis + s.chunk - 1) / s.chunk;
    return s;
}

// Partial attention of one slice of rows for DS4_AFD_HEADS heads.
// part_acc: f32 [n_tok][n_head][n_split][head_dim]; part_ml: f32 [n_tok][n_head][n_split][2] (m, l);
// other arguments as ds4_attention_scores. head_dim % 4 == 0, head_dim <= 512, n_head % 8 == 0.
// Each warp owns DS4_AFD_HEADS / warps heads; a lane holds the float4 columns lane, lane + warp, ...
// of q and of the accumulators, so a row is one coalesced read per column step and a score one
// butterfly sum. Scores of up to DS4_AFD_SUB rows wait in shared memory while their max is found,
// then their weights and values are added (the rows are read again, from cache).
// Launch: grid (n_split, n_head / 8, n_tok), block 256; slices past a token's rows exit.
// Experiments (-D, nvcc only): a minimum of blocks a multiprocessor for the split's registers.
#if defined(DS4_AFD_MIN_BLOCKS) && defined(DS4_NVIDIA)
#define DS4_AFD_LAUNCH __launch_bounds__(DS4_BLOCK, DS4_AFD_MIN_BLOCKS)
#else
#define DS4_AFD_LAUNCH DS4_LAUNCH(DS4_BLOCK)
#endif
extern "C" __global__ DS4_AFD_LAUNCH void ds4_attention_decode_split(
    float* part_acc, float* part_ml, const float* q, const float* ring, const float* comp, const u32* comp_sel,
    const u32* pos, u32 n_head, u32 head_dim, u32 ring_cap, u32 window, u32 n_comp_avail, u32 ratio, u32 top_k,
    u32 n_split, u32 most_slices, u32 min_chunk, float scale) {
    ds4_grid_sync();
    constexpr u32 HPW = DS4_AFD_HEADS / DS4_WARPS_PER_BLOCK;  // heads per warp: 1 (wave32), 2 (wave64)
    constexpr u32 K4 = DS4_ATT_MAX_DIM / (4 * DS4_WARP);      // float4 columns per lane at most
    __shared__ float ssc[DS4_AFD_HEADS][DS4_AFD_SUB];
    __shared__ const float* srow[DS4_AFD_STAGED];
    const u32 t = blockIdx.z, p = pos[0] + t, split = blockIdx.x;
    const AttRows a = att_rows(p, window, n_comp_avail, ratio, top_k, comp_sel != nullptr);
    const AfdSlices sl = afd_slices(a.n_vis, most_slices, min_chunk);
    if (split >= min(sl.n_used, n_split) || head_dim > DS4_ATT_MAX_DIM) return;  // block-uniform
    const u32 r_begin = split * sl.chunk, r_end = min(a.n_vis, r_begin + sl.chunk);
    // The slice's row addresses, each found once (a selected compressed row is an index load, then
    // the row: two dependent loads a row tile otherwise, in both passes).
    for (u32 i = threadIdx.x; i < min(r_end - r_begin, (u32)DS4_AFD_STAGED); i += DS4_BLOCK)
        srow[i] = att_row(a, r_begin + i, p, t, ring, comp, comp_sel, ring_cap, top_k, head_dim);
    __syncthreads();
    const auto row_at = [&](u32 v) {
        return (const float4*)(v - r_begin < DS4_AFD_STAGED
                                   ? srow[v - r_begin]
                                   : att_row(a, v, p, t, ring, comp, comp_sel, ring_cap, top_k, head_dim));
    };
    const u32 lane = lane_id(), d4 = head_dim / 4;
    const u32 hw = blockIdx.y * DS4_AFD_HEADS + warp_id() * HPW;  // first head of this warp
    float4 qv[HPW][K4], acc[HPW][K4];
    float m[HPW], l[HPW];
#pragma unroll
    for (u32 hh = 0; hh < HPW; ++hh) {
        const float4* qh = (const float4*)(q + ((u64)t * n_head + hw + hh) * head_dim);
#pragma unroll
        for (u32 k = 0; k < K4; ++k) {
            const u32 c = lane + k * DS4_WARP;
            qv[hh][k] = c < d4 ? qh[c] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            acc[hh][k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
        m[hh] = -INFINITY;
        l[hh] = 0.0f;
    }
    float* my_sc = ssc[warp_id() * HPW];
    for (u32 s0 = r_begin; s0 < r_end; s0 += DS4_AFD_SUB) {
        const u32 s1 = min(r_end, s0 + DS4_AFD_SUB);
        float sub_max[HPW];
#pragma unroll
        for (u32 hh = 0; hh < HPW; ++hh) sub_max[hh] = -INFINITY;
        // Scores, DS4_AFD_TILE rows at a time (their loads and butterflies overlap).
        for (u32 r = s0; r < s1; r += DS4_AFD_TILE) {
            float4 x[DS4_AFD_TILE][K4];
#pragma unroll
            for (u32 j = 0; j < DS4_AFD_TILE; ++j) {
                const float4* row = row_at(min(r + j, s1 - 1));
#pragma unroll
                for (u32 k = 0; k < K4; ++k) {
                    const u32 c = lane + k * DS4_WARP;
                    x[j][k] = c < d4 ? row[c] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                }
            }
#pragma unroll
            for (u32 hh = 0; hh < HPW; ++hh) {
#pragma unroll
                for (u32 j = 0; j < DS4_AFD_TILE; ++j) {
                    float s = 0.0f;
#pragma unroll
                    for (u32 k = 0; k < K4; ++k) {
                        s = fmaf(qv[hh][k].x, x[j][k].x, s);
                        s = fmaf(qv[hh][k].y, x[j][k].y, s);
                        s = fmaf(qv[hh][k].z, x[j][k].z, s);
                        s = fmaf(qv[hh][k].w, x[j][k].w, s);
                    }
                    s = warp_sum(s) * scale;
                    if (r + j < s1) {
                        sub_max[hh] = fmaxf(sub_max[hh], s);
                        if (lane == 0) my_sc[hh * DS4_AFD_SUB + (r + j - s0)] = s;
                    }
                }
            }
        }
        ds4_sync_warp();
        // Rescale what the earlier rows added to the new max (m = -inf only before the first rows).
#pragma unroll
        for (u32 hh = 0; hh < HPW; ++hh) {
            const float mn = fmaxf(m[hh], sub_max[hh]);
            const float f = m[hh] == -INFINITY ? 0.0f : ds4_expf(m[hh] - mn);
            l[hh] *= f;
#pragma unroll
            for (u32 k = 0; k < K4; ++k) {
                acc[hh][k].x *= f;
                acc[hh][k].y *= f;
                acc[hh][k].z *= f;
                acc[hh][k].w *= f;
            }
            m[hh] = mn;
        }
        // Weights and values: the rows' loads are independent of the accumulators.
        for (u32 r = s0; r < s1; r += DS4_AFD_TILE) {
            float4 x[DS4_AFD_TILE][K4];
            float w[HPW][DS4_AFD_TILE];
#pragma unroll
            for (u32 j = 0; j < DS4_AFD_TILE; ++j) {
                const bool in = r + j < s1;
                const u32 v = in ? r + j : s1 - 1;
                const float4* row = row_at(v);
#pragma unroll
                for (u32 k = 0; k < K4; ++k) {
                    const u32 c = lane + k * DS4_WARP;
                    x[j][k] = c < d4 ? row[c] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                }
#pragma unroll
                for (u32 hh = 0; hh < HPW; ++hh)
                    w[hh][j] = in ? ds4_expf(my_sc[hh * DS4_AFD_SUB + (v - s0)] - m[hh]) : 0.0f;
            }
#pragma unroll
            for (u32 hh = 0; hh < HPW; ++hh) {
#pragma unroll
                for (u32 j = 0; j < DS4_AFD_TILE; ++j) {
                    l[hh] += w[hh][j];
#pragma unroll
                    for (u32 k = 0; k < K4; ++k) {
                        acc[hh][k].x = fmaf(w[hh][j], x[j][k].x, acc[hh][k].x);
                        acc[hh][k].y = fmaf(w[hh][j], x[j][k].y, acc[hh][k].y);
                        acc[hh][k].z = fmaf(w[hh][j], x[j][k].z, acc[hh][k].z);
                        acc[hh][k].w = fmaf(w[hh][j], x[j][k].w, acc[hh][k].w);
                    }
                }
            }
        }
        ds4_sync_warp();  // my_sc is rewritten by the next sub-slice
    }
#pragma unroll
    for (u32 hh = 0; hh < HPW; ++hh) {
        const u64 ph = ((u64)t * n_head + hw + hh) * n_split + split;
        float4* o = (float4*)(part_acc + ph * head_dim);
#pragma unroll
        for (u32 k = 0; k < K4; ++k) {
            const u32 c = lane + k * DS4_WARP;
            if (c < d4) o[c] = acc[hh][k];
        }
        if (lane == 0) {
            part_ml[2 * ph] = m[hh];
            part_ml[2 * ph + 1] = l[hh];
        }
    }
}

// Merge of the slices of ds4_attention_decode_split with the sink of each head:
// out[t][h][d] = (sum_s exp(m_s - M) acc_s[d]) / (exp(sink - M) + sum_s l_s exp(m_s - M)),
// M = max(sink, m_s). A block merges DS4_AFM_DIMS dims of one head: its 8 groups of 32 threads take
// the slices s = g, g + 8, ... in turn (a float4 of 4 dims per thread, each group's chain in slice
// order), and thread d < DS4_AFM_DIMS adds the 8 groups' sums in group order. The order depends on
// the slice count only, never on the wave size or the unrolling. (One block per head would be a
// chain over all the slices, 80 at a 2k context, on only n_head blocks.)
// Returns the merged value of dim r.d of the head (live: threadIdx.x < DS4_AFM_DIMS and d < head_dim).
#define DS4_AFM_DIMS 128                    // dims of a head per merge block
#define DS4_AFM_GROUPS (DS4_BLOCK / 32)     // slice phases of a merge block
static_assert(DS4_AFM_DIMS == 4 * 32, "a merge group covers DS4_AFM_DIMS dims with one float4 a thread");
struct AfdMerged {
    float v;
    u32 d;
    bool live;
};
DS4_DEV AfdMerged afd_merge(const float* part_acc, const float* part_ml, const float* sinks, const u32* comp_sel,
                            const u32* pos, u32 n_head, u32 head_dim, u32 window, u32 n_comp_avail, u32 ratio,
                            u32 top_k, u32 n_split, u32 most_slices, u32 min_chunk) {
    __shared__ float sfac[DS4_BLOCK];
    __shared__ float red[DS4_WARPS_PER_BLOCK];
    __shared__ float red32[DS4_GROUPS32];
    __shared__ float part[DS4_AFM_GROUPS][DS4_AFM_DIMS];
    const u32 c = blockIdx.x, h = blockIdx.y, t = blockIdx.z, p = pos[0] + t;
    const AttRows a = att_rows(p, window, n_comp_avail, ratio, top_k, comp_sel != nullptr);
    const u32 n_used = min(min(afd_slices(a.n_vis, most_slices, min_chunk).n_used, n_split), (u32)DS4_BLOCK);
    const u64 ph = ((u64)t * n_head + h) * n_split;
    const float sink = sinks[h];
    const u32 s = threadIdx.x;
    const float ms = s < n_used ? part_ml[2 * (ph + s)] : -INFINITY;
    const float mx = block_max(fmaxf(ms, sink), red);
    const float f = s < n_used ? ds4_expf(ms - mx) : 0.0f;
    sfac[s] = f;
    const float den = block_sum(s < n_used ? part_ml[2 * (ph + s) + 1] * f : 0.0f, red32) + ds4_expf(sink - mx);
    const float inv = 1.0f / den;
    const u32 g = threadIdx.x / 32, k = threadIdx.x % 32, d4 = c * (DS4_AFM_DIMS / 4) + k, hd4 = head_dim / 4;
    const float4* src = (const float4*)(part_acc + ph * head_dim) + min(d4, hd4 - 1);  // in bounds
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 4
    for (u32 j = g; j < n_used; j += DS4_AFM_GROUPS) {
        const float fj = sfac[j];
        const float4 x = src[(u64)j * hd4];
        acc.x = fmaf(fj, x.x, acc.x);
        acc.y = fmaf(fj, x.y, acc.y);
        acc.z = fmaf(fj, x.z, acc.z);
        acc.w = fmaf(fj, x.w, acc.w);
    }
    *(float4*)&part[g][4 * k] = acc;
    __syncthreads();
    AfdMerged r;
    r.d = c * DS4_AFM_DIMS + threadIdx.x;
    r.live = threadIdx.x < DS4_AFM_DIMS && r.d < head_dim;
    float v = 0.0f;
    if (threadIdx.x < DS4_AFM_DIMS) {
        v = part[0][threadIdx.x];
#pragma unroll
        for (u32 gg = 1; gg < DS4_AFM_GROUPS; ++gg) v += part[gg][threadIdx.x];
    }
    r.v = r.live ? v * inv : 0.0f;
    return r;
}

// out: f32 [n_tok][n_head][head_dim]; n_split <= 256, head_dim <= DS4_ATT_MAX_DIM, head_dim % 4 == 0.
// Launch: grid (ceil(head_dim / DS4_AFM_DIMS), n_head, n_tok), block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_attention_decode_merge(
    float* out, const float* part_acc, const float* part_ml, const float* sinks, const u32* comp_sel,
    const u32* pos, u32 n_head, u32 head_dim, u32 window, u32 n_comp_avail, u32 ratio, u32 top_k, u32 n_split,
    u32 most_slices, u32 min_chunk) {
    ds4_grid_sync();
    if (head_dim > DS4_ATT_MAX_DIM || head_dim % 4 != 0) return;
    const AfdMerged r = afd_merge(part_acc, part_ml, sinks, comp_sel, pos, n_head, head_dim, window, n_comp_avail,
                                  ratio, top_k, n_split, most_slices, min_chunk);
    if (r.live) out[((u64)blockIdx.z * n_head + blockIdx.y) * head_dim + r.d] = r.v;
}

// The merge, then the attention output's next two fast steps on the merged head in registers,
// with their bits: the inverse RoPE of ds4_rows_finish_fast (flags DS4_ROW_ROPE | DS4_ROW_ROPE_INV;
// the pair 2p, 2p + 1 is in neighbouring threads) and the Q8_0 quantization of
// ds4_rms_norm_quant_fast without norm (a block of 32 dims is 32 neighbouring threads), written to
// q_out [n_tok][n_head][head_dim] and d_out [n_tok][n_head][head_dim / 32]: two launches fewer on
// the decode path (kernels::attention_decode_split_q8). head_dim % 32 == 0, n_rot even.
// Launch: grid (ceil(head_dim / DS4_AFM_DIMS), n_head, n_tok), block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_attention_decode_merge_q8(
    i8* q_out, float* d_out, const float* part_acc, const float* part_ml, const float* sinks, const u32* comp_sel,
    const u32* pos, u32 n_head, u32 head_dim, u32 window, u32 n_comp_avail, u32 ratio, u32 top_k, u32 n_split,
    u32 most_slices, u32 min_chunk, u32 n_rot, float theta_scale, float freq_scale, float ext_factor,
    float corr_low, float corr_high, float mscale) {
    ds4_grid_sync();
    if (head_dim > DS4_ATT_MAX_DIM || head_dim % 32 != 0) return;
    AfdMerged r = afd_merge(part_acc, part_ml, sinks, comp_sel, pos, n_head, head_dim, window, n_comp_avail, ratio,
                            top_k, n_split, most_slices, min_chunk);
    const u32 t = blockIdx.z, row_pos = pos[0] + t, off = head_dim - n_rot, d = r.d;
    const u64 row = (u64)t * n_head + blockIdx.y;
    // The pair's other value (every lane shuffles; a pair never straddles a block's or the head's end).
    const float other = __shfl_xor(r.v, 1, DS4_WARP);
    if (r.live && d >= off) {
        const u32 pr = d / 2;
        const float th = rope_theta(row_pos, pr - off / 2, theta_scale, freq_scale, ext_factor, corr_low, corr_high);
        const float cs = ds4_cosf(th) * mscale;
        const float sn = -ds4_sinf(th) * mscale;
        const float x0 = d % 2 == 0 ? r.v : other, x1 = d % 2 == 0 ? other : r.v;
        r.v = d % 2 == 0 ? x0 * cs - x1 * sn : x0 * sn + x1 * cs;
    }
    q8_0_store_lane(r.v, d, r.live, q_out + row * head_dim, d_out + row * (head_dim / 32));
}

// Attention on matrix cores (fast arithmetic mode only; docs/arithmetic.md), over the same visible
// rows per token as the exact kernels (kernels/attention.hip att_rows / att_row: window ring rows,
// then the compressed rows or the indexer's selection). Two kernels share one block walk:
//   ds4_attention_prefill_fast   a batch's whole attention in one launch, in place of
//                                ds4_attention_scores + ds4_attention_softmax + ds4_attention_values;
//   ds4_attention_decode_split_mma  one slice of a token's rows (the slices of afd_slices,
//                                kernels/attention_fast.hip), its partial softmax state written for
//                                ds4_attention_decode_merge(_q8), as ds4_attention_decode_split does.
//
// K = V = one shared row per token (one KV head), so the natural matrix of one token is its heads
// against its own rows: a block takes 32 heads of one token (two 16-row MMA tiles) and walks its
// rows (all of them, or one slice) 16 at a time with an online softmax (flash attention):
//   S  = Q[32 heads][D] . K[16 rows][D]^T      f16 operands, f32 accumulation
//   m' = max(m, max_r S * scale);  alpha = exp(m - m');  P = exp(S * scale - m')   (f16 for the MMA)
//   l  = l * alpha + sum_r P;      O = O * alpha + P[32][16] . V[16 rows][D]
// A whole token starts from m = sink_h, l = 1 (the sink's exp(sink - m)) and writes out = O / l; a
// slice starts from m = -inf, l = 0 and writes (m, l, O) for the merge, which adds the sink. Rows
// past the walk's end are masked (P = 0, V = 0). Every row is read once per block (per 32 heads),
// converted to f16 in shared memory twice: as K (dims contiguous) and as V^T (rows contiguous), the
// k-contiguous operand layouts of kernels/mma.h. Against the CUDA-core split (32 heads a row read
// instead of 8, one wave of blocks at a 2k context instead of 2.4) see kernels/README.md.
//
// Differences from the exact sequence: q, the rows and the weights P are rounded to f16 (11-bit
// significands); the sums run in the tiles' order; the softmax is rescaled online.

#define DS4_ATTF_HEADS 32  // heads per block (two 16-row tiles)
#define DS4_ATTF_ROWS 16   // rows per step (one tile k-step of P . V)
#define DS4_ATTF_LDK (DS4_ATT_MAX_DIM + 8)  // K and staged-Q row stride (halfs; +16 bytes: banks)
#define DS4_ATTF_LDP 24                      // P row stride (halfs)
#define DS4_ATTF_LDS 17                      // score-partial row stride (floats)
#define DS4_ATTF_NT (DS4_ATT_MAX_DIM / 64)   // 16-wide dim tiles per MMA group (head_dim / 4 / 16)

// The walk of one block: token t, the 32 heads from h0, and either all of its visible rows (SLICE
// false: out f32 [n_tok][n_head][head_dim] = O / l) or slice `split` of them (SLICE true: out =
// part_acc f32 [n_tok][n_head][n_split][head_dim] = O and out_ml = part_ml [..][n_split][2] = (m, l),
// the layout of ds4_attention_decode_split). q: f32 [n_tok][n_head][head_dim]; ring, comp,
// comp_sel, pos as ds4_attention_scores; sinks: f32 [n_head]. head_dim % 64 == 0, <= 512.
template <bool SLICE>
DS4_DEV void attf_block(float* out, float* out_ml, const float* q, const float* ring, const float* comp,
                        const u32* comp_sel, const float* sinks, const u32* pos, u32 n_head, u32 head_dim,
                        u32 ring_cap, u32 window, u32 n_comp_avail, u32 ratio, u32 top_k, float scale, u32 t,
                        u32 h0, u32 n_split, u32 split, u32 most_slices, u32 min_chunk) {
    // K rows (16 x LDK halfs; at the start the 32 staged q rows use K and VT together), V^T (D x 16).
    __shared__ int4 kv4[DS4_ATTF_HEADS * DS4_ATTF_LDK * 2 / 16];  // >= K + V^T
    static_assert(DS4_ATTF_HEADS * DS4_ATTF_LDK >= DS4_ATTF_ROWS * DS4_ATTF_LDK + DS4_ATT_MAX_DIM * DS4_ATTF_ROWS, "kv4");
    __shared__ int4 p4[DS4_ATTF_HEADS * DS4_ATTF_LDP * 2 / 16];
    __shared__ float spart[8][16 * DS4_ATTF_LDS];  // per MMA group: its partial S tile
    __shared__ float salpha[DS4_ATTF_HEADS];
    u16* ks = (u16*)kv4;
    u16* vt = ks + DS4_ATTF_ROWS * DS4_ATTF_LDK;
    u16* ps = (u16*)p4;
    const u32 tid = threadIdx.x, p = pos[0] + t;
    if (head_dim > DS4_ATT_MAX_DIM || head_dim % 64 != 0) return;
    const AttRows a = att_rows(p, window, n_comp_avail, ratio, top_k, comp_sel != nullptr);
    // The rows walked (head h's output goes to row (t n_head + h) n_split + split of `out`; a whole
    // token's walk is called with n_split = 1, split = 0).
    u32 r_begin = 0, r_end = a.n_vis;
    if constexpr (SLICE) {
        const AfdSlices sl = afd_slices(a.n_vis, most_slices, min_chunk);
        if (split >= min(sl.n_used, n_split)) return;  // block-uniform
        r_begin = split * sl.chunk;
        r_end = min(a.n_vis, r_begin + sl.chunk);
    }
    const u32 g = mma_group(), mt = g % 2, quarter = g / 2;
    const u32 nks = head_dim / 64;  // 16-wide k steps (QK^T) / dim tiles (PV) per group
    const u32 d0 = quarter * (head_dim / 4);

    // A step's rows: thread tid loads float4 columns i / 16 of row i % 16 for i = tid, tid + DS4_BLOCK,
    // ... (lanes of a row pair read 32 bytes). Its row is the same at every i (DS4_BLOCK is a multiple
    // of 16), so its address is found once a step. (A slice loading its first rows while q is staged
    // and the next step's while it computes used scratch on gfx1151, tests/kernel_metadata.rs.)
    static_assert(DS4_BLOCK % DS4_ATTF_ROWS == 0, "a thread keeps one row of a step");
    const u32 r = tid % DS4_ATTF_ROWS;

    // Stage q (32 heads, zero past n_head) as f16 and keep this group's fragments in registers.
    for (u32 i = tid; i < DS4_ATTF_HEADS * head_dim / 4; i += DS4_BLOCK) {
        const u32 hh = i / (head_dim / 4), c = 4 * (i % (head_dim / 4));
        float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (h0 + hh < n_head) x = *(const float4*)(q + ((u64)t * n_head + h0 + hh) * head_dim + c);
        u16* dst = ks + hh * DS4_ATTF_LDK + c;
        dst[0] = f32_to_f16_bits(x.x);
        dst[1] = f32_to_f16_bits(x.y);
        dst[2] = f32_to_f16_bits(x.z);
        dst[3] = f32_to_f16_bits(x.w);
    }
    __syncthreads();
    MmaFragF16 qf[DS4_ATTF_NT];
#pragma unroll
    for (u32 i = 0; i < DS4_ATTF_NT; ++i)
        if (i < nks) mma_load(qf[i], ks + mt * 16 * DS4_ATTF_LDK + d0 + 16 * i, DS4_ATTF_LDK);
    MmaAccF acc[DS4_ATTF_NT];
#pragma unroll
    for (u32 i = 0; i < DS4_ATTF_NT; ++i) mma_zero(acc[i]);

    // Softmax lanes: head hh = tid / 8 of the block, rows 2 (tid % 8) and 2 (tid % 8) + 1 of a step;
    // the 8 lanes of a head keep its running max and sum (all equal).
    const u32 sh = tid / 8, sr = 2 * (tid % 8);
    // A slice starts empty (exp(-inf - m) = 0 rescales nothing); the merge adds the sink.
    float run_m = SLICE ? -INFINITY : h0 + sh < n_head ? sinks[h0 + sh] : 0.0f, run_l = SLICE ? 0.0f : 1.0f;
    for (u32 r0 = r_begin; r0 < r_end; r0 += DS4_ATTF_ROWS) {
        __syncthreads();  // the previous step's K, V^T and P are consumed (and the staged q)
        // Rows r0 .. r0 + 15 as f16, as K and as V^T, one float4 at a time.
        const float* row =
            r0 + r < r_end ? att_row(a, r0 + r, p, t, ring, comp, comp_sel, ring_cap, top_k, head_dim) : nullptr;
        for (u32 i = tid; i < DS4_ATTF_ROWS * head_dim / 4; i += DS4_BLOCK) {
            const u32 c = 4 * (i / DS4_ATTF_ROWS);
            const float4 x = row ? *(const float4*)(row + c) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            const u16 hx = f32_to_f16_bits(x.x), hy = f32_to_f16_bits(x.y), hz = f32_to_f16_bits(x.z),
                      hw = f32_to_f16_bits(x.w);
            u16* kd = ks + r * DS4_ATTF_LDK + c;
            kd[0] = hx;
            kd[1] = hy;
            kd[2] = hz;
            kd[3] = hw;
            vt[(c + 0) * DS4_ATTF_ROWS + r] = hx;
            vt[(c + 1) * DS4_ATTF_ROWS + r] = hy;
            vt[(c + 2) * DS4_ATTF_ROWS + r] = hz;
            vt[(c + 3) * DS4_ATTF_ROWS + r] = hw;
        }
        __syncthreads();
        // Partial scores of this group: heads of tile mt over its quarter of the dims.
        {
            MmaAccF s;
            mma_zero(s);
#pragma unroll
            for (u32 i = 0; i < DS4_ATTF_NT; ++i) {
                if (i < nks) {
                    MmaFragF16 kf;
                    mma_load(kf, ks + d0 + 16 * i, DS4_ATTF_LDK);
                    mma_f16(s, qf[i], kf);
                }
            }
#pragma unroll
            for (int e = 0; e < 8; ++e) spart[g][mma_row(e) * DS4_ATTF_LDS + mma_col(e)] = s.v[e];
        }
        __syncthreads();
        // Online softmax of the step: the four quarters' partials summed, masked, rescaled.
        {
            const u32 tile = sh / 16, row = sh % 16;
            float s2[2];
#pragma unroll
            for (u32 j = 0; j < 2; ++j) {
                float s = 0.0f;
#pragma unroll
                for (u32 qq = 0; qq < 4; ++qq) s += spart[tile + 2 * qq][row * DS4_ATTF_LDS + sr + j];
                s2[j] = r0 + sr + j < r_end ? s * scale : -INFINITY;
            }
            float mx = fmaxf(s2[0], s2[1]);
#pragma unroll
            for (int o = 4; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor(mx, o, 8));
            const float m_new = fmaxf(run_m, mx);
            const float alpha = ds4_expf(run_m - m_new);
            const float e0 = ds4_expf(s2[0] - m_new), e1 = ds4_expf(s2[1] - m_new);
            const u16 p0 = f32_to_f16_bits(e0), p1 = f32_to_f16_bits(e1);
            // The sum takes the f16 weights the tile multiplies, so out = O / l stays a convex mix.
            float sum = f16_to_f32(p0) + f16_to_f32(p1);
#pragma unroll
            for (int o = 4; o > 0; o >>= 1) sum += __shfl_xor(sum, o, 8);
            run_l = run_l * alpha + sum;
            run_m = m_new;
            ps[sh * DS4_ATTF_LDP + sr] = p0;
            ps[sh * DS4_ATTF_LDP + sr + 1] = p1;
            if (tid % 8 == 0) salpha[sh] = alpha;
        }
        __syncthreads();
        // O = O * alpha + P . V for this group's heads (tile mt) and dim tiles.
        {
            MmaFragF16 pf;
            mma_load(pf, ps + mt * 16 * DS4_ATTF_LDP, DS4_ATTF_LDP);
            float al[8];
#pragma unroll
            for (int e = 0; e < 8; ++e) al[e] = salpha[mt * 16 + mma_row(e)];
#pragma unroll
            for (u32 i = 0; i < DS4_ATTF_NT; ++i) {
                if (i < nks) {
#pragma unroll
                    for (int e = 0; e < 8; ++e) acc[i].v[e] *= al[e];
                    MmaFragF16 vf;
                    mma_load(vf, vt + (d0 + 16 * i) * DS4_ATTF_ROWS, DS4_ATTF_ROWS);
                    mma_f16(acc[i], pf, vf);
                }
            }
        }
    }
    // out = O / l, or O and (m, l) for the merge (l and m of head hh held by its softmax lanes; the
    // factor passes through shared memory; times 1 leaves a slice's O as it is).
    __syncthreads();
    if (tid % 8 == 0) {
        salpha[sh] = SLICE ? 1.0f : 1.0f / run_l;
        if (SLICE && h0 + sh < n_head) {
            const u64 ph = ((u64)t * n_head + h0 + sh) * n_split + split;
            out_ml[2 * ph] = run_m;
            out_ml[2 * ph + 1] = run_l;
        }
    }
    __syncthreads();
#pragma unroll
    for (u32 i = 0; i < DS4_ATTF_NT; ++i) {
        if (i < nks) {
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                const u32 hh = mt * 16 + mma_row(e), h = h0 + hh;
                if (h < n_head)
                    out[(((u64)t * n_head + h) * n_split + split) * head_dim + d0 + 16 * i + mma_col(e)] =
                        acc[i].v[e] * salpha[hh];
            }
        }
    }
}

// out: f32 [n_tok][n_head][head_dim]; the rest as attf_block.
// Launch: grid (ceil(n_head / 32), n_tok), block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_attention_prefill_fast(float* out, const float* q,
                                                                             const float* ring, const float* comp,
                                                                             const u32* comp_sel, const float* sinks,
                                                                             const u32* pos, u32 n_head,
                                                                             u32 head_dim, u32 ring_cap, u32 window,
                                                                             u32 n_comp_avail, u32 ratio, u32 top_k,
                                                                             float scale) {
    ds4_grid_sync();
    attf_block<false>(out, nullptr, q, ring, comp, comp_sel, sinks, pos, n_head, head_dim, ring_cap, window,
                      n_comp_avail, ratio, top_k, scale, blockIdx.y, blockIdx.x * DS4_ATTF_HEADS, 1, 0, 1, 1);
}

// ds4_attention_decode_split's partials (same arguments, same slices, same layout) on matrix cores:
// block (split, head group, token) walks slice `split` of the token's rows for 32 heads.
// Launch: grid (n_split, ceil(n_head / 32), n_tok), block 256; slices past a token's rows exit.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_attention_decode_split_mma(
    float* part_acc, float* part_ml, const float* q, const float* ring, const float* comp, const u32* comp_sel,
    const u32* pos, u32 n_head, u32 head_dim, u32 ring_cap, u32 window, u32 n_comp_avail, u32 ratio, u32 top_k,
    u32 n_split, u32 most_slices, u32 min_chunk, float scale) {
    ds4_grid_sync();
    attf_block<true>(part_acc, part_ml, q, ring, comp, comp_sel, nullptr, pos, n_head, head_dim, ring_cap, window,
                     n_comp_avail, ratio, top_k, scale, blockIdx.z, blockIdx.y * DS4_ATTF_HEADS, n_split,
                     blockIdx.x, most_slices, min_chunk);
}
