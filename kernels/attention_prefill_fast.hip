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
#pragma once
#include "attention.hip"
#include "attention_fast.hip"  // afd_slices (the decode slices)
#include "mma.h"

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
