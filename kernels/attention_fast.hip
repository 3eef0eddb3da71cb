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
// the slice count only, never on the wave size or the unrolling. One block per head was a chain
// over all (80 at a 2k context) slices of 2 dims a thread: 9.5 us on the H200, 64 blocks
// (tests/hip-on-cuda/results/h200-2026-12-03-s17-call2.log).
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
