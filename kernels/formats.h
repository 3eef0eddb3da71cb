// Block formats of the GGUF weights (docs/gguf.md#block-formats) and the device activation layouts, as
// per-chunk dot products. A "chunk" is 32 consecutive elements of a row; every weight format used by ds4
// (Q8_0, Q2_K, Q4_K, IQ2_XXS) splits cleanly into 32-element chunks, so one matvec body serves all
// of them: lane l of a warp handles chunks l, l + DS4_WARP, ... and the warp sums the results.
//
// Weights are used in place, in the exact GGUF byte layout (rows of blocks, row-major,
// docs/model.md#tensor-conventions).
//
// Device activation layouts (planar, so activation chunks are 16-byte aligned int8 runs; how the codes
// are computed: docs/arithmetic.md#activation-quantization):
//   Q8_0 activation of a row of n floats: q  int8[n], d f32[n/32] (scale kept as f32).
//   Q8_K activation of a row of n floats: q  int8[n], d f32[n/256], bsums i16[n/16].
// Batched activations are `rows` such rows back to back in each plane (row r of q at r*n).
#pragma once
#include "prelude.h"
#include "iq2xxs_grid.h"

// GGML type ids (docs/gguf.md#element-types) used as template parameters.
#define DS4_T_Q8_0 8
#define DS4_T_Q2_K 10
#define DS4_T_Q4_K 12
#define DS4_T_IQ2_XXS 16

template <int T>
struct Fmt;
#define DS4_FMT(type, elems, bytes)                                         \
    template <>                                                             \
    struct Fmt<type> {                                                      \
        static constexpr u32 block_elems = (elems), block_bytes = (bytes); \
    };
DS4_FMT(DS4_T_Q8_0, 32, 34)
DS4_FMT(DS4_T_Q2_K, 256, 84)
DS4_FMT(DS4_T_Q4_K, 256, 144)
DS4_FMT(DS4_T_IQ2_XXS, 256, 66)
#undef DS4_FMT

template <int T>
DS4_DEV u64 row_bytes(u32 n) {
    return (u64)(n / Fmt<T>::block_elems) * Fmt<T>::block_bytes;
}

// 32 int8 activation values of chunk c as 8 packed ints (two 16-byte loads).
DS4_DEV void load_act_chunk(const i8* xq, u32 c, int v[8]) {
    const int4* p = (const int4*)(xq + (u64)c * 32);
    int4 a = p[0], b = p[1];
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
    v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}

// Copies the IQ2_XXS grid to shared memory; call from every thread, then __syncthreads().
DS4_DEV void stage_iq2_grid(u64* sgrid) {
    for (u32 i = threadIdx.x; i < 256; i += blockDim.x) sgrid[i] = ds4_iq2xxs_grid[i];
}
DS4_DEV u32 sign_mask4(u32 nib) { return ((nib * 0x00204081u) & 0x01010101u) * 0xFFu; }

// ---------------------------------------------------------------------------------------------
// Arithmetic of the CPU reference dots (src/backend/cpu/quant.rs, docs/arithmetic.md#dot-products), which every
// kernel reproduces bit for bit (prelude.h "arithmetic contract"):
//   * the integer work of a "unit" (a Q8_0 block of 32, a K-quant super-block of 256) is exact, so
//     it may be split over lanes and chunks in any order;
//   * each unit then contributes ONE float term, computed with the reference's grouping
//     (unit_term), and the terms are added to a single accumulator that starts at +0 in unit order;
//   * IQ2_XXS multiplies the finished sum by 1/8 (finish_dot).
// A 32-element chunk of a weight row unpacks to 32 int8 codes, two integer scales (one per
// 16-element half) and two integer mins, plus the unit's float factors d and dmin; its integer part
// against an activation chunk (codes, 16-element sums bs0/bs1) is
//     isum += s0 * i0 + s1 * i1,   summs += m0 * bs0 + m1 * bs1   (i0/i1 = int dot of each half)
//   Q8_0:    codes = q,               s = 1,             m = 0,           d = d_w
//   Q4_K:    codes = nibble (0..15),  s = sc_j,          m = m_j
//   Q2_K:    codes = 2-bit (0..3),    s_h = sc_s & 15,   m_h = sc_s >> 4
//   IQ2_XXS: codes = signed grid,     s = 2 ls + 1,      m = 0
// ---------------------------------------------------------------------------------------------
struct WChunk {
    int q[8];
    u32 sc;  // bytes: s0, s1, m0, m1
    float d, dmin;
};

// Unpacks chunk c of weight row `wrow` (format T); `grid` is the staged IQ2_XXS grid (or null).
template <int T>
DS4_DEV void unpack_chunk(const u8* wrow, u32 c, WChunk& o, const u64* grid) {
    if constexpr (T == DS4_T_Q8_0) {
        const u8* blk = wrow + (u64)c * 34;
        o.d = f16_to_f32(*(const u16*)blk);
#pragma unroll
        for (int i = 0; i < 8; ++i) o.q[i] = (int)load_u32_2a(blk + 2 + 4 * i);
        o.sc = 0x0101u;
        o.dmin = 0.0f;
    } else if constexpr (T == DS4_T_Q4_K) {
        const u8* blk = wrow + (u64)(c / 8) * 144;
        const u32 j = c % 8;
        const u32 dd = *(const u32*)blk;
        const u32* sc32 = (const u32*)(blk + 4);
        const u32 s0 = sc32[0], s1 = sc32[1], s2 = sc32[2];
        // scales[i] as bytes: s0 = scales[0..4), s1 = scales[4..8), s2 = scales[8..12)
        // (docs/gguf.md#block-formats)
        u32 sc, m;
        if (j < 4) {
            sc = (s0 >> (8 * j)) & 63;
            m = (s1 >> (8 * j)) & 63;
        } else {
            const u32 jj = j - 4;
            const u32 b8 = (s2 >> (8 * jj)) & 0xff;  // scales[j + 4]
            sc = (b8 & 15) | (((s0 >> (8 * jj + 6)) & 3) << 4);
            m = (b8 >> 4) | (((s1 >> (8 * jj + 6)) & 3) << 4);
        }
        const int4* qp = (const int4*)(blk + 16 + 32 * (j / 2));
        const int4 q0 = qp[0], q1 = qp[1];
        const u32 sh = 4 * (j & 1);
        const int w[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
#pragma unroll
        for (int i = 0; i < 8; ++i) o.q[i] = (int)(((u32)w[i] >> sh) & 0x0F0F0F0Fu);
        o.sc = sc | (sc << 8) | (m << 16) | (m << 24);
        o.d = f16_to_f32((u16)(dd & 0xffff));
        o.dmin = f16_to_f32((u16)(dd >> 16));
    } else if constexpr (T == DS4_T_Q2_K) {
        // Chunk c: elements 32 * (c % 8).. of block c / 8, i.e. k = (c % 8) / 4, shift j = c % 4.
        const u8* blk = wrow + (u64)(c / 8) * 84;
        const u32 cb = c % 8, k = cb / 4, j = cb % 4;
        const u32 sc01 = *(const u16*)(blk + 8 * k + 2 * j);  // scales[s0], scales[s0 + 1]
        const u32* qs = (const u32*)(blk + 16 + 32 * k);
        const u32 sh = 2 * j;
#pragma unroll
        for (int i = 0; i < 8; ++i) o.q[i] = (int)((qs[i] >> sh) & 0x03030303u);
        const u32 dd = *(const u32*)(blk + 80);
        o.sc = (sc01 & 15) | (((sc01 >> 8) & 15) << 8) | (((sc01 >> 4) & 15) << 16) | ((sc01 >> 12) << 24);
        o.d = f16_to_f32((u16)(dd & 0xffff));
        o.dmin = f16_to_f32((u16)(dd >> 16));
    } else if constexpr (T == DS4_T_IQ2_XXS) {
        const u8* blk = wrow + (u64)(c / 8) * 66;
        const u32 ib = c % 8;
        o.d = f16_to_f32(*(const u16*)blk);
        const u32 g4 = load_u32_2a(blk + 2 + 8 * ib);
        const u32 aux = load_u32_2a(blk + 6 + 8 * ib);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const u64 g = grid[(g4 >> (8 * k)) & 0xff];
            u32 s = (aux >> (7 * k)) & 127;
            s |= (__popc(s) & 1) << 7;  // ksigns: even number of negatives per group
            const u32 mlo = sign_mask4(s & 15), mhi = sign_mask4(s >> 4);
            // Bytewise negate where the mask is set: (g ^ m) + 1 per byte; no carry, grid bytes are > 0.
            o.q[2 * k] = (int)(((u32)g ^ mlo) + (mlo & 0x01010101u));
            o.q[2 * k + 1] = (int)(((u32)(g >> 32) ^ mhi) + (mhi & 0x01010101u));
        }
        const u32 ls = 2 * (aux >> 28) + 1;
        o.sc = ls | (ls << 8);
        o.dmin = 0.0f;
    }
}

// Integer part of a weight chunk against an activation chunk (codes q, 16-element sums bs0/bs1),
// added to the unit's isum and summs.
DS4_DEV void chunk_ints(const int w[8], u32 sc, const int q[8], int bs0, int bs1, int& isum, int& summs) {
    int i0 = dot4_i8(w[0], q[0], 0);
    i0 = dot4_i8(w[1], q[1], i0);
    i0 = dot4_i8(w[2], q[2], i0);
    i0 = dot4_i8(w[3], q[3], i0);
    int i1 = dot4_i8(w[4], q[4], 0);
    i1 = dot4_i8(w[5], q[5], i1);
    i1 = dot4_i8(w[6], q[6], i1);
    i1 = dot4_i8(w[7], q[7], i1);
    isum += (int)(sc & 0xff) * i0 + (int)((sc >> 8) & 0xff) * i1;
    summs += (int)((sc >> 16) & 0xff) * bs0 + (int)(sc >> 24) * bs1;
}

// The float term of one unit, grouped exactly as the reference (quant.rs dot_*; yd = activation
// scale of the unit, d/dmin = the weight's).
template <int T>
DS4_DEV float unit_term(int isum, int summs, float d, float dmin, float yd) {
    if constexpr (T == DS4_T_Q2_K) return fmaf((float)isum, yd * d, -(((float)summs * yd) * dmin));
    if constexpr (T == DS4_T_Q4_K) return ((yd * d) * (float)isum) - ((yd * dmin) * (float)summs);
    // Q8_0: (d_w * x_d) * isum; IQ2_XXS: (d * y.d) * bsum, the 1/8 comes last (finish_dot).
    return (d * yd) * (float)isum;
}
template <int T>
DS4_DEV float finish_dot(float acc) {
    if constexpr (T == DS4_T_IQ2_XXS) return acc * 0.125f;
    return acc;
}

// ---------------------------------------------------------------------------------------------
// Warp-per-row dots in the reference order. Lanes work in groups of 8 (group g = lane / 8, G =
// DS4_WARP / 8 groups): a group handles one unit, its 8 lanes split the unit's integer work
// (a quarter-word of a Q8_0 block, or one 32-element chunk of a super-block) and fold their integer
// sums with three xor shuffles (exact). Each step covers U * G consecutive units, unit u0 + k * G + g
// in group g's slot k, so a lane keeps U units' loads in flight; the groups' float terms then go
// through per-warp shared memory and every lane adds them to its accumulator in unit order. The
// add chain is n_units long (n_in / 32 for Q8_0, n_in / 256 for K-quants): ~4 cycles per add, and
// several chains (rows) are interleaved where a kernel has them (gate/up, the down slots).
// ---------------------------------------------------------------------------------------------
#define DS4_CHAIN_SMEM 128  // floats of per-warp shared memory for chain_add_units (NR * U * G <= 128)
// The block's chain memory (16-byte aligned for the float4 reads); warp w's part: (float*)name[w].
#define DS4_CHAIN_SHARED(name) __shared__ float4 name[DS4_WARPS_PER_BLOCK][DS4_CHAIN_SMEM / 4]

DS4_DEV int group8_sum_i(int v) {
    v += __shfl_xor(v, 1, DS4_WARP);
    v += __shfl_xor(v, 2, DS4_WARP);
    v += __shfl_xor(v, 4, DS4_WARP);
    return v;
}

// acc[r] += the terms t[r][0..U) of all groups in unit order, for the first n (<= U * G) units of the
// step; the terms of units past n must be +0. Every lane of a group holds the same t. wsm: this
// warp's DS4_CHAIN_SMEM floats, 16-byte aligned (declare them with DS4_CHAIN_SHARED).
template <int NR, int U>
DS4_DEV void chain_add_units(float (&acc)[NR], const float (&t)[NR][U], u32 n, float* wsm) {
    constexpr u32 G = DS4_WARP / 8;
    static_assert(NR * U * G <= DS4_CHAIN_SMEM, "chain shared memory");
    const u32 lane = lane_id();
    if (lane % 8 == 0) {
#pragma unroll
        for (int r = 0; r < NR; ++r)
#pragma unroll
            for (int k = 0; k < U; ++k) wsm[r * U * G + k * G + lane / 8] = t[r][k];
    }
    ds4_sync_warp();
    // Four terms per shared-memory load (broadcast). The slots past n in the last load are the +0
    // terms of units past the row's end, and acc + (+0) == acc here: acc starts at +0 and a
    // round-to-nearest sum is -0 only when both addends are -0, so acc is never -0.
    static_assert((U * G) % 4 == 0, "chain slots come in fours");
    for (u32 i = 0; i < n; i += 4)
#pragma unroll
        for (int r = 0; r < NR; ++r) {
            const float4 v = *(const float4*)(wsm + r * U * G + i);
            acc[r] = acc[r] + v.x;
            acc[r] = acc[r] + v.y;
            acc[r] = acc[r] + v.z;
            acc[r] = acc[r] + v.w;
        }
    ds4_sync_warp();
}

// Q8_0 weight row · Q8_0 activation row (codes xq, f32 scales xd), n elements: quant.rs dot_q8_0.
// A group's 8 lanes take the 8 quarter-words of one 34-byte block, so a warp-wide load touches G
// consecutive blocks. DS4_Q8_0_UNROLL blocks per lane per step (a build-time knob for measuring
// memory-level parallelism).
#ifndef DS4_Q8_0_UNROLL
#define DS4_Q8_0_UNROLL 4
#endif
template <int NR>
DS4_DEV void warp_dot_rows_q8_0(const u8* const (&wrow)[NR], const i8* xq, const float* xd, u32 n, float* wsm,
                                float (&out)[NR]) {
    constexpr u32 G = DS4_WARP / 8;
    constexpr int U = DS4_Q8_0_UNROLL;
    static_assert(U >= 1 && U <= 16, "DS4_Q8_0_UNROLL: 1..16");
    const u32 nb = n / 32, g = lane_id() / 8, sub = lane_id() % 8;
#pragma unroll
    for (int r = 0; r < NR; ++r) out[r] = 0.0f;
    // The raw words of a step; the next step's are loaded before this step's terms are chained, so
    // the loads stay in flight during the chain (the order of the float adds is unchanged).
    struct Raw {
        int x[U];
        float xs[U];
        u16 dh[NR][U];
        u32 q[NR][U];
    };
    auto load = [&](u32 b0, Raw& w) {
#pragma unroll
        for (int k = 0; k < U; ++k) {
            const u32 b = b0 + k * G + g;
            const bool live = b < nb;
            w.x[k] = live ? *(const int*)(xq + (u64)b * 32 + 4 * sub) : 0;
            w.xs[k] = live ? xd[b] : 0.0f;
#pragma unroll
            for (int r = 0; r < NR; ++r) {
                const u8* blk = wrow[r] + (u64)b * 34;
                w.dh[r][k] = live ? *(const u16*)blk : (u16)0;
                w.q[r][k] = live ? load_u32_2a(blk + 2 + 4 * sub) : 0u;
            }
        }
    };
    Raw cur, nxt;
    load(0, cur);
    for (u32 b0 = 0; b0 < nb; b0 += U * G) {
        if (b0 + U * G < nb) load(b0 + U * G, nxt);
        float t[NR][U];
#pragma unroll
        for (int k = 0; k < U; ++k)
#pragma unroll
            for (int r = 0; r < NR; ++r) {
                const int is = dot4_i8((int)cur.q[r][k], cur.x[k], 0);
                t[r][k] = unit_term<DS4_T_Q8_0>(group8_sum_i(is), 0, f16_to_f32(cur.dh[r][k]), 0.0f, cur.xs[k]);
            }
        chain_add_units<NR, U>(out, t, min(U * G, nb - b0), wsm);
        cur = nxt;
    }
}

// Column dots: the same NR rows against n_cols <= DS4_COLS activation columns (a small batch of
// tokens, "columns"), each weight word read once for all of them. Column c's activations start at
// xq + c * x_col codes (xd + c * (x_col / 32) scales); out[c][r] gets the bits of
// warp_dot_rows_q8_0<NR> for that column: the same terms, chained into the column's own accumulators
// in unit order. The next step's weights are in flight during this step's columns; a column's
// activation words are read as its terms are made (L1: the columns of a step are a few hundred bytes).
#define DS4_COLS 8  // most columns (tokens) of the column kernels
template <int NR>
DS4_DEV void warp_dot_rows_q8_0_cols(const u8* const (&wrow)[NR], const i8* xq, const float* xd, u32 x_col,
                                     u32 n_cols, u32 n, float* wsm, float (&out)[DS4_COLS][NR]) {
    constexpr u32 G = DS4_WARP / 8;
    constexpr int U = DS4_Q8_0_UNROLL;
    const u32 nb = n / 32, g = lane_id() / 8, sub = lane_id() % 8;
#pragma unroll
    for (int c = 0; c < DS4_COLS; ++c)
#pragma unroll
        for (int r = 0; r < NR; ++r) out[c][r] = 0.0f;
    struct Raw {
        u16 dh[NR][U];
        u32 q[NR][U];
    };
    auto load = [&](u32 b0, Raw& w) {
#pragma unroll
        for (int k = 0; k < U; ++k) {
            const u32 b = b0 + k * G + g;
            const bool live = b < nb;
#pragma unroll
            for (int r = 0; r < NR; ++r) {
                const u8* blk = wrow[r] + (u64)b * 34;
                w.dh[r][k] = live ? *(const u16*)blk : (u16)0;
                w.q[r][k] = live ? load_u32_2a(blk + 2 + 4 * sub) : 0u;
            }
        }
    };
    Raw cur, nxt;
    load(0, cur);
    for (u32 b0 = 0; b0 < nb; b0 += U * G) {
        if (b0 + U * G < nb) load(b0 + U * G, nxt);
#pragma unroll
        for (int c = 0; c < DS4_COLS; ++c) {
            if ((u32)c >= n_cols) break;
            const i8* xc = xq + (u64)c * x_col;
            const float* dc = xd + (u64)c * (x_col / 32);
            float t[NR][U];
#pragma unroll
            for (int k = 0; k < U; ++k) {
                const u32 b = b0 + k * G + g;
                const bool live = b < nb;
                const int x = live ? *(const int*)(xc + (u64)b * 32 + 4 * sub) : 0;
                const float xs = live ? dc[b] : 0.0f;
#pragma unroll
                for (int r = 0; r < NR; ++r) {
                    const int is = dot4_i8((int)cur.q[r][k], x, 0);
                    t[r][k] = unit_term<DS4_T_Q8_0>(group8_sum_i(is), 0, f16_to_f32(cur.dh[r][k]), 0.0f, xs);
                }
            }
            chain_add_units<NR, U>(out[c], t, min(U * G, nb - b0), wsm);
        }
        cur = nxt;
    }
}

// NR weight rows of K-format T against Q8_K activation rows (codes xq, scales xd per 256, sums xbs
// per 16), n elements: quant.rs dot_iq2_xxs / dot_q2_k / dot_q4_k for each row. Row r reads the
// activation row at element offset r * x_row_stride (0: all rows share one activation row). Rows
// from nr_live on (warp-uniform) are not read and give 0. A group's lane `sub` takes chunk sub of
// its super-block (so consecutive lanes read consecutive chunks).
template <int T, int NR>
DS4_DEV void warp_dot_rows_k(const u8* const (&wrow)[NR], u32 nr_live, const i8* xq, const float* xd, const i16* xbs,
                             u32 x_row_stride, u32 n, const u64* grid, float* wsm, float (&out)[NR]) {
    constexpr u32 G = DS4_WARP / 8;
    constexpr int U = NR > 2 ? 1 : 2;  // keeps NR * U * G <= DS4_CHAIN_SMEM and the registers in check
    const u32 ns = n / 256, g = lane_id() / 8, sub = lane_id() % 8;
#pragma unroll
    for (int r = 0; r < NR; ++r) out[r] = 0.0f;
    for (u32 s0 = 0; s0 < ns; s0 += U * G) {
        float t[NR][U];
#pragma unroll
        for (int k = 0; k < U; ++k) {
            const u32 s = s0 + k * G + g, c = 8 * s + sub;
            const bool live = s < ns;
            int q[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            float yd = 0.0f;
            int bs0 = 0, bs1 = 0;
#pragma unroll
            for (int r = 0; r < NR; ++r) {
                const bool row_live = live && (u32)r < nr_live;
                if (row_live && (r == 0 || x_row_stride != 0)) {
                    const u64 xo = (u64)r * x_row_stride;
                    load_act_chunk(xq + xo, c, q);
                    yd = xd[xo / 256 + s];
                    bs0 = xbs[xo / 16 + 2 * c];
                    bs1 = xbs[xo / 16 + 2 * c + 1];
                }
                WChunk w;
                int isum = 0, summs = 0;
                w.d = w.dmin = 0.0f;
                if (row_live) {
                    unpack_chunk<T>(wrow[r], c, w, grid);
                    chunk_ints(w.q, w.sc, q, bs0, bs1, isum, summs);
                }
                isum = group8_sum_i(isum);
                if constexpr (T == DS4_T_Q2_K || T == DS4_T_Q4_K) summs = group8_sum_i(summs);
                t[r][k] = row_live ? unit_term<T>(isum, summs, w.d, w.dmin, yd) : 0.0f;
            }
        }
        chain_add_units<NR, U>(out, t, min(U * G, ns - s0), wsm);
    }
#pragma unroll
    for (int r = 0; r < NR; ++r) out[r] = finish_dot<T>(out[r]);
}

// ---------------------------------------------------------------------------------------------
// Sequential F16 dots (quant.rs dot_f16): acc = acc + w_i * x_i for i = 0 .. n-1, ONE float chain
// per row, the products multiplied then added (never fused). The block computes the products of a
// stage of DS4_F16_SEQ_STAGE elements (over all R rows together, 8 per thread, 16-byte loads) into
// shared memory while thread r (< R) adds the previous stage's products of row r in index order:
// double-buffered, so the next stage's loads are in flight during the add chain. The chain costs
// ~4 cycles per element (n = 4096: ~16k cycles) whatever the block does; R rows per block run R
// chains side by side.
// ---------------------------------------------------------------------------------------------
#define DS4_F16_SEQ_STAGE 2048  // products per stage (all rows together): DS4_BLOCK threads x 8
// Shared memory (floats) that block_dots_f16_seq / block_dot_f16_seq need: two stages of products
// (each row padded by 4 floats against bank conflicts of the chain threads) and R result slots.
#define DS4_F16_SEQ_SMEM (2 * (DS4_F16_SEQ_STAGE + 4 * 8) + 8)

// R (1, 2, 4 or 8) rows: row(r) gives the F16 row r (n halves, 16-byte aligned) for r < n_rows (rows
// from n_rows on are skipped); x: n floats (16-byte aligned), each multiplied by x_scale before its
// product (x_scale = 1 is the plain dot: x * 1 is exact); n % 8 == 0. All DS4_BLOCK threads call it;
// returns with the sum of row r in smem[2 * (DS4_F16_SEQ_STAGE + 32) + r] for every thread to read
// (the function ends with a barrier). smem: DS4_F16_SEQ_SMEM floats.
template <int R, class RowPtr>
DS4_DEV void block_dots_f16_seq(RowPtr row, u32 n_rows, const float* x, float x_scale, u32 n, float* smem) {
    static_assert(R == 1 || R == 2 || R == 4 || R == 8, "rows per block: 1, 2, 4 or 8");
    constexpr u32 TK = DS4_F16_SEQ_STAGE / R;  // elements of each row per stage
    constexpr u32 TPR = DS4_BLOCK / R;         // threads per row
    constexpr u32 RS = TK + 4;                 // row stride of a stage in shared memory
    constexpr u32 BUF = DS4_F16_SEQ_STAGE + 32;
    const u32 tid = threadIdx.x, r = tid / TPR, e = 8 * (tid % TPR);
    const bool loads = r < n_rows;
    const u16* wr = loads ? row(r) : nullptr;
    const u32 n_stages = (n + TK - 1) / TK;
    uint4 wv = make_uint4(0, 0, 0, 0);
    float4 x0 = make_float4(0, 0, 0, 0), x1 = x0;
    auto load = [&](u32 s) {
        const u32 i = s * TK + e;
        if (loads && i < n) {
            wv = *(const uint4*)(wr + i);
            x0 = *(const float4*)(x + i);
            x1 = *(const float4*)(x + i + 4);
        }
    };
    auto store = [&](u32 s) {
        const u32 i = s * TK + e;
        if (loads && i < n) {
            float* o = smem + (s % 2) * BUF + r * RS + e;
            // w_i * (x_i * x_scale): the scaled activation first, as the reference's flat vector.
            o[0] = f16_to_f32((u16)(wv.x & 0xffff)) * (x0.x * x_scale);
            o[1] = f16_to_f32((u16)(wv.x >> 16)) * (x0.y * x_scale);
            o[2] = f16_to_f32((u16)(wv.y & 0xffff)) * (x0.z * x_scale);
            o[3] = f16_to_f32((u16)(wv.y >> 16)) * (x0.w * x_scale);
            o[4] = f16_to_f32((u16)(wv.z & 0xffff)) * (x1.x * x_scale);
            o[5] = f16_to_f32((u16)(wv.z >> 16)) * (x1.y * x_scale);
            o[6] = f16_to_f32((u16)(wv.w & 0xffff)) * (x1.z * x_scale);
            o[7] = f16_to_f32((u16)(wv.w >> 16)) * (x1.w * x_scale);
        }
    };
    load(0);
    store(0);
    __syncthreads();
    float acc = 0.0f;
    for (u32 s = 0; s < n_stages; ++s) {
        if (s + 1 < n_stages) load(s + 1);  // in flight during the chain below
        if (tid < R && tid < n_rows) {
            const float4* p = (const float4*)(smem + (s % 2) * BUF + tid * RS);
            const u32 len = min(TK, n - s * TK) / 4;
#pragma unroll 8
            for (u32 j = 0; j < len; ++j) {
                const float4 v = p[j];
                acc = acc + v.x;
                acc = acc + v.y;
                acc = acc + v.z;
                acc = acc + v.w;
            }
        }
        if (s + 1 < n_stages) store(s + 1);
        __syncthreads();
    }
    if (tid < R) smem[2 * BUF + tid] = acc;
    __syncthreads();
}

// Column form of block_dots_f16_seq<R>: R rows (row(r), r < n_rows) against n_cols <= DS4_COLS
// activation columns (column c at x + c * x_col, 16-byte aligned), each weight word read once for all
// of them. Per stage of DS4_F16_SEQ_COLS_TK elements a row, the block converts the rows' weights and
// scales the columns' activations into shared memory; thread c * R + r then adds row r's products
// with column c in index order, each product w_i * (x_i * x_scale) multiplied then added as in
// block_dots_f16_seq, so each (row, column) sum has its bits. Double-buffered as there. Returns with
// the sum of (row r, column c) in smem[DS4_F16_SEQ_COLS_OUT + c * R + r] (ends with a barrier).
// smem: DS4_F16_SEQ_COLS_SMEM floats.
#define DS4_F16_SEQ_COLS_TK 256  // elements of each row per stage (DS4_BLOCK / 8 threads x 8)
#define DS4_F16_SEQ_COLS_RS (DS4_F16_SEQ_COLS_TK + 4)  // stage row stride (padded against bank conflicts)
#define DS4_F16_SEQ_COLS_BUF ((8 + DS4_COLS) * DS4_F16_SEQ_COLS_RS)  // one stage: 8 weight rows + the columns
#define DS4_F16_SEQ_COLS_OUT (2 * DS4_F16_SEQ_COLS_BUF)
#define DS4_F16_SEQ_COLS_SMEM (DS4_F16_SEQ_COLS_OUT + 8 * DS4_COLS)
template <int R, class RowPtr>
DS4_DEV void block_dots_f16_seq_cols(RowPtr row, u32 n_rows, const float* x, u32 x_col, u32 n_cols, float x_scale,
                                     u32 n, float* smem) {
    static_assert(R == 8, "rows per block: 8 (a stage row per 32 threads)");
    constexpr u32 TK = DS4_F16_SEQ_COLS_TK, RS = DS4_F16_SEQ_COLS_RS, BUF = DS4_F16_SEQ_COLS_BUF;
    constexpr u32 TPR = DS4_BLOCK / R;  // threads per stage row (weights) and per stage column
    const u32 tid = threadIdx.x, r = tid / TPR, e = 8 * (tid % TPR);
    const bool loads_w = r < n_rows, loads_x = r < n_cols;  // thread row r also loads column r
    const u16* wr = loads_w ? row(r) : nullptr;
    const float* xc = x + (u64)(loads_x ? r : 0) * x_col;
    const u32 n_stages = (n + TK - 1) / TK;
    uint4 wv = make_uint4(0, 0, 0, 0);
    float4 x0 = make_float4(0, 0, 0, 0), x1 = x0;
    auto load = [&](u32 s) {
        const u32 i = s * TK + e;
        if (i < n) {
            if (loads_w) wv = *(const uint4*)(wr + i);
            if (loads_x) {
                x0 = *(const float4*)(xc + i);
                x1 = *(const float4*)(xc + i + 4);
            }
        }
    };
    auto store = [&](u32 s) {
        const u32 i = s * TK + e;
        if (i >= n) return;
        float* b = smem + (s % 2) * BUF;
        if (loads_w) {
            float* o = b + r * RS + e;
            o[0] = f16_to_f32((u16)(wv.x & 0xffff));
            o[1] = f16_to_f32((u16)(wv.x >> 16));
            o[2] = f16_to_f32((u16)(wv.y & 0xffff));
            o[3] = f16_to_f32((u16)(wv.y >> 16));
            o[4] = f16_to_f32((u16)(wv.z & 0xffff));
            o[5] = f16_to_f32((u16)(wv.z >> 16));
            o[6] = f16_to_f32((u16)(wv.w & 0xffff));
            o[7] = f16_to_f32((u16)(wv.w >> 16));
        }
        if (loads_x) {
            // The scaled activation first, as the reference's flat vector (block_dots_f16_seq).
            float* o = b + (8 + r) * RS + e;
            o[0] = x0.x * x_scale;
            o[1] = x0.y * x_scale;
            o[2] = x0.z * x_scale;
            o[3] = x0.w * x_scale;
            o[4] = x1.x * x_scale;
            o[5] = x1.y * x_scale;
            o[6] = x1.z * x_scale;
            o[7] = x1.w * x_scale;
        }
    };
    load(0);
    store(0);
    __syncthreads();
    // Chain thread tid = c * R + cr: row cr, column c.
    const u32 cc = tid / R, cr = tid % R;
    const bool chains = cc < n_cols && cr < n_rows;
    float acc = 0.0f;
    for (u32 s = 0; s < n_stages; ++s) {
        if (s + 1 < n_stages) load(s + 1);  // in flight during the chain below
        if (chains) {
            const float4* pw = (const float4*)(smem + (s % 2) * BUF + cr * RS);
            const float4* px = (const float4*)(smem + (s % 2) * BUF + (8 + cc) * RS);
            const u32 len = min(TK, n - s * TK) / 4;
#pragma unroll 4
            for (u32 j = 0; j < len; ++j) {
                const float4 w4 = pw[j], x4 = px[j];
                acc = acc + w4.x * x4.x;
                acc = acc + w4.y * x4.y;
                acc = acc + w4.z * x4.z;
                acc = acc + w4.w * x4.w;
            }
        }
        if (s + 1 < n_stages) store(s + 1);  // the other buffer: its chains ended before the last barrier
        __syncthreads();
    }
    if (tid < R * DS4_COLS) smem[DS4_F16_SEQ_COLS_OUT + tid] = acc;
    __syncthreads();
}

// One row: the sum of w_i * (x_i * x_scale), i = 0 .. n-1, in index order, returned to every thread
// of the block (all DS4_BLOCK threads call it). w, x 16-byte aligned, n % 8 == 0; smem:
// DS4_F16_SEQ_SMEM floats (16.7 KB), reusable once it returns.
DS4_DEV float block_dot_f16_seq(const u16* w, const float* x, float x_scale, u32 n, float* smem) {
    block_dots_f16_seq<1>([&](u32) { return w; }, 1, x, x_scale, n, smem);
    return smem[2 * (DS4_F16_SEQ_STAGE + 32)];
}

// SwiGLU with the asymmetric clamp of docs/model.md#swiglu-clamp (gate <= limit, up in [-limit, limit], applied
// when limit > 1e-6); silu uses the numerically stable sigmoid.
DS4_DEV float stable_sigmoid(float z) {
    if (z >= 0.0f) return 1.0f / (1.0f + ds4_expf(-z));
    const float e = ds4_expf(z);
    return e / (1.0f + e);
}
DS4_DEV float swiglu_clamped(float g, float u, float limit) {
    if (limit > 1e-6f) {
        g = fminf(g, limit);
        u = fminf(fmaxf(u, -limit), limit);
    }
    return g * stable_sigmoid(g) * u;
}
