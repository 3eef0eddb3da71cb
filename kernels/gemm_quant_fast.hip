// Fast-mode twins of gemm.hip's quantized GEMMs with K-format or paired weights, on int8
// matrix-core tiles (kernels/mma.h): the grouped routed-expert gate/up + SwiGLU and down GEMMs
// (IQ2_XXS, Q2_K, Q4_K weights, Q8_K activations) and the shared expert's Q8_0 gate/up + SwiGLU.
// Same arguments and grids as their exact twins.
//
// The model's dot (formats.h "arithmetic of the CPU reference dots") splits into integer work per
// 32-element chunk and one float term per unit; the tiles keep that split, so these kernels give
// the same bits as their exact twins and only the integer sums change order (exact):
//   * a chunk's code products go through one int8 tile (i32 sums). Q2_K folds each 16-element
//     half's 4-bit scale into its 2-bit codes (products <= 45, still int8); the other formats have
//     one scale per chunk, applied to the tile's i32 sum in registers;
//   * the mins term (Q2_K, Q4_K: m_h times the activation's 16-element sums) is added per output;
//   * at a unit's last chunk, unit_term adds the unit's float term with the reference's grouping,
//     in unit order.
//
// Tiles: a block of 256 threads computes 64 weight rows x 64 columns (tokens, or the pairs of one
// expert tile of ds4_moe_group: any column class runs 64 wide, empty 16-column tiles are skipped);
// its 8 MMA groups each own 16 rows x 32 columns. A stage holds 4 chunks of every row and column.
#pragma once
#include "gemm.hip"
#include "mma.h"

#define DS4_MQ_ROWS 64
#define DS4_MQ_COLS 64
#define DS4_MQ_CH 4                           // chunks per stage
#define DS4_MQ_LD (32 * DS4_MQ_CH + 16)       // staged int8 row stride in bytes (16-byte aligned, padded)

template <int NW>
struct MmaQuantSmem {
    int4 ws[NW][DS4_MQ_ROWS * DS4_MQ_LD / 16];  // codes, row-major, k-contiguous
    u32 wsc[NW][DS4_MQ_CH][DS4_MQ_ROWS];        // WChunk::sc of each (chunk, row)
    float2 wf[NW][DS4_MQ_CH][DS4_MQ_ROWS];      // the unit's (d, dmin)
    int4 xs[DS4_MQ_COLS * DS4_MQ_LD / 16];
    float xf[DS4_MQ_CH][DS4_MQ_COLS];           // activation scale of the chunk's unit
    int2 xb[DS4_MQ_CH][DS4_MQ_COLS];            // activation 16-element sums (Q8_K)
    TileCols cols;
};

// The tile body: like gemm_tile (same arguments and store), on int8 matrix tiles.
template <int T, bool AK, int NW, class Store>
DS4_DEV void mma_quant_tile(MmaQuantSmem<NW>& sm, const u8* const (&wbase)[NW], u64 rb, u32 r0, u32 n_rows,
                            u32 n_in, const i8* xq, const float* xd, const i16* xbs, u32 x_stride, u32 xg_off,
                            const u64* grid, Store&& store) {
    constexpr bool FOLD = T == DS4_T_Q2_K;                          // scales folded into the codes
    constexpr bool MINS = T == DS4_T_Q2_K || T == DS4_T_Q4_K;       // a mins term
    constexpr u32 UNIT = T == DS4_T_Q8_0 ? 1 : 8;                   // chunks per unit
    i8* xs = (i8*)sm.xs;
    const u32 tid = threadIdx.x, nc = n_in / 32;
    const u32 g = mma_group(), rg = 16 * (g % 4), cg = 32 * (g / 4);
    const u32 n_cols = sm.cols.n;
    float acc[NW][2][8];
    int isum[NW][2][8], summs[NW][2][8];
#pragma unroll
    for (int w = 0; w < NW; ++w)
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                acc[w][j][e] = 0.0f;
                isum[w][j][e] = summs[w][j][e] = 0;
            }

    for (u32 c0 = 0; c0 < nc; c0 += DS4_MQ_CH) {
        {
            // Weights: thread -> (row tid % 64, chunk tid / 64) of every matrix.
            const u32 row = tid % DS4_MQ_ROWS, b = tid / DS4_MQ_ROWS, c = c0 + b;
#pragma unroll
            for (int w = 0; w < NW; ++w) {
                WChunk wc;
                if (c < nc && r0 + row < n_rows) {
                    unpack_chunk<T>(wbase[w] + (u64)(r0 + row) * rb, c, wc, grid);
                } else {
#pragma unroll
                    for (int i = 0; i < 8; ++i) wc.q[i] = 0;
                    wc.sc = 0;
                    wc.d = wc.dmin = 0.0f;
                }
                if constexpr (FOLD) {
                    // Codes 0..3 times a 4-bit scale: bytewise products <= 45, no carries.
                    const u32 s0 = wc.sc & 0xff, s1 = (wc.sc >> 8) & 0xff;
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        wc.q[i] = (int)((u32)wc.q[i] * s0);
                        wc.q[4 + i] = (int)((u32)wc.q[4 + i] * s1);
                    }
                }
                int4* dst = (int4*)((i8*)sm.ws[w] + row * DS4_MQ_LD + 32 * b);
                dst[0] = make_int4(wc.q[0], wc.q[1], wc.q[2], wc.q[3]);
                dst[1] = make_int4(wc.q[4], wc.q[5], wc.q[6], wc.q[7]);
                sm.wsc[w][b][row] = wc.sc;
                sm.wf[w][b][row].x = wc.d;
                sm.wf[w][b][row].y = wc.dmin;
            }
        }
        {
            // Activations: thread -> (column tid % 64, chunk tid / 64).
            const u32 col = tid % DS4_MQ_COLS, b = tid / DS4_MQ_COLS, c = c0 + b;
            int q[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            float d = 0.0f;
            int b0 = 0, b1 = 0;
            if (c < nc && col < n_cols) {
                const u64 ar = sm.cols.act_row[col];
                load_act_any<AK>(xq + ar * x_stride + xg_off,
                                 xd + ar * (x_stride / (AK ? 256 : 32)) + xg_off / (AK ? 256 : 32),
                                 xbs ? xbs + ar * (x_stride / 16) + xg_off / 16 : nullptr, c, q, d, b0, b1);
            }
            int4* dst = (int4*)(xs + col * DS4_MQ_LD + 32 * b);
            dst[0] = make_int4(q[0], q[1], q[2], q[3]);
            dst[1] = make_int4(q[4], q[5], q[6], q[7]);
            sm.xf[b][col] = d;
            sm.xb[b][col] = make_int2(b0, b1);
        }
        __syncthreads();
#pragma unroll
        for (u32 b = 0; b < DS4_MQ_CH; ++b) {
            const bool unit_end = (c0 + b) % UNIT == UNIT - 1;  // uniform
#pragma unroll
            for (int w = 0; w < NW; ++w) {
                MmaFragI8 a;
                mma_load(a, (const i8*)sm.ws[w] + rg * DS4_MQ_LD + 32 * b, DS4_MQ_LD);
#pragma unroll
                for (int j = 0; j < 2; ++j) {
                    const u32 cj = cg + 16 * j;
                    if (cj >= n_cols) continue;  // uniform per MMA group
                    MmaFragI8 bf;
                    mma_load(bf, xs + cj * DS4_MQ_LD + 32 * b, DS4_MQ_LD);
                    MmaAccI s;
                    mma_zero(s);
                    mma_i8(s, a, bf);
#pragma unroll
                    for (int e = 0; e < 8; ++e) {
                        const u32 row = rg + mma_row(e), col = cj + mma_col(e);
                        const u32 sc = sm.wsc[w][b][row];
                        isum[w][j][e] += FOLD ? s.v[e] : (int)(sc & 0xff) * s.v[e];
                        if constexpr (MINS) {
                            const int2 bs = sm.xb[b][col];
                            summs[w][j][e] += (int)((sc >> 16) & 0xff) * bs.x + (int)(sc >> 24) * bs.y;
                        }
                        if (unit_end) {
                            const float2 f = sm.wf[w][b][row];
                            acc[w][j][e] = acc[w][j][e] + unit_term<T>(isum[w][j][e], summs[w][j][e], f.x, f.y,
                                                                       sm.xf[b][col]);
                            isum[w][j][e] = summs[w][j][e] = 0;
                        }
                    }
                }
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            const u32 r = r0 + rg + mma_row(e), col = cg + 16 * j + mma_col(e);
            if (r < n_rows && col < n_cols) store(r, col, finish_dot<T>(acc[0][j][e]), finish_dot<T>(acc[NW - 1][j][e]));
        }
}

// Shared-expert gate/up + clamped SwiGLU for a batch on int8 tiles: ds4_gemm_q8_0_swiglu's twin.
// Launch: grid (ceil(n_ff / 64), ceil(n_tok / 64)), block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_gemm_q8_0_swiglu_mma(float* mid, const u8* wg, const u8* wu,
                                                                           const i8* xq, const float* xd, u32 n_in,
                                                                           u32 n_ff, float limit, u32 n_tok) {
    __shared__ MmaQuantSmem<2> sm;
    load_token_cols(sm.cols, blockIdx.y * DS4_MQ_COLS, n_tok);
    const u8* wb[2] = {wg, wu};
    mma_quant_tile<DS4_T_Q8_0, false, 2>(
        sm, wb, (u64)(n_in / 32) * 34, blockIdx.x * DS4_MQ_ROWS, n_ff, n_in, xq, xd, nullptr, n_in, 0, nullptr,
        [&](u32 r, u32 col, float g, float u) {
            mid[(u64)sm.cols.out_row[col] * n_ff + r] = swiglu_clamped(g, u, limit);
        });
}

// One block of a grouped expert GEMM on int8 tiles (moe_gemm_block's twin): tile blockIdx.y of
// ds4_moe_group, weight rows from blockIdx.x * 64.
template <int T, int NW, class Store>
DS4_DEV void moe_gemm_mma_block(MmaQuantSmem<NW>& sm, u64* sgrid, const u8* const (&w)[NW], u32 n_rows, u32 n_in,
                                const i8* xq, const float* xd, const i16* xbs, const u32* pairs, const u32* tiles,
                                const u32* n_tiles, u32 n_used, bool act_is_pair, Store&& store) {
    const u32 tile = blockIdx.y, r0 = blockIdx.x * DS4_MQ_ROWS;
    if (tile >= n_tiles[0] || r0 >= n_rows) return;
    if constexpr (T == DS4_T_IQ2_XXS) stage_iq2_grid(sgrid);
    const u32 e = load_expert_tile(sm.cols, pairs, tiles, tile, n_used, act_is_pair);
    const u64 rb = row_bytes<T>(n_in);
    const u8* wb[NW];
#pragma unroll
    for (int i = 0; i < NW; ++i) wb[i] = w[i] + (u64)e * n_rows * rb;
    mma_quant_tile<T, true, NW>(sm, wb, rb, r0, n_rows, n_in, xq, xd, xbs, n_in, 0, sgrid, store);
}

template <int T>
DS4_DEV void moe_gemm_gate_up_mma_body(float* mid, const u8* gate, const u8* up, const i8* xq, const float* xd,
                                       const i16* xbs, const u32* pairs, const u32* tiles, const u32* n_tiles,
                                       const float* selw, u32 n_in, u32 n_ff, u32 n_used, float limit) {
    __shared__ MmaQuantSmem<2> sm;
    __shared__ u64 sgrid[256];
    const u8* w[2] = {gate, up};
    moe_gemm_mma_block<T, 2>(sm, sgrid, w, n_ff, n_in, xq, xd, xbs, pairs, tiles, n_tiles, n_used, false,
                             [&](u32 r, u32 col, float g, float u) {
                                 const u32 p = sm.cols.out_row[col];
                                 mid[(u64)p * n_ff + r] = swiglu_clamped(g, u, limit) * selw[p];
                             });
}

template <int T>
DS4_DEV void moe_gemm_down_mma_body(float* outp, const u8* down, const i8* mq, const float* md, const i16* mbs,
                                    const u32* pairs, const u32* tiles, const u32* n_tiles, u32 n_ff, u32 n_out,
                                    u32 n_used) {
    __shared__ MmaQuantSmem<1> sm;
    __shared__ u64 sgrid[256];
    const u8* w[1] = {down};
    moe_gemm_mma_block<T, 1>(sm, sgrid, w, n_out, n_ff, mq, md, mbs, pairs, tiles, n_tiles, n_used, true,
                             [&](u32 r, u32 col, float v, float) {
                                 outp[(u64)sm.cols.out_row[col] * n_out + r] = v;
                             });
}

// The grouped routed-expert twins: the arguments and grids of ds4_moe_gemm_gate_up_<fmt> and
// ds4_moe_gemm_down_<fmt> (gemm.hip).
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_moe_gemm_gate_up_iq2_xxs_mma(
    float* mid, const u8* gate, const u8* up, const i8* xq, const float* xd, const i16* xbs, const u32* pairs,
    const u32* tiles, const u32* n_tiles, const float* selw, u32 n_in, u32 n_ff, u32 n_used, float limit) {
    moe_gemm_gate_up_mma_body<DS4_T_IQ2_XXS>(mid, gate, up, xq, xd, xbs, pairs, tiles, n_tiles, selw, n_in, n_ff, n_used, limit);
}
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_moe_gemm_down_iq2_xxs_mma(
    float* outp, const u8* down, const i8* mq, const float* md, const i16* mbs, const u32* pairs, const u32* tiles,
    const u32* n_tiles, u32 n_ff, u32 n_out, u32 n_used) {
    moe_gemm_down_mma_body<DS4_T_IQ2_XXS>(outp, down, mq, md, mbs, pairs, tiles, n_tiles, n_ff, n_out, n_used);
}
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_moe_gemm_gate_up_q2_k_mma(
    float* mid, const u8* gate, const u8* up, const i8* xq, const float* xd, const i16* xbs, const u32* pairs,
    const u32* tiles, const u32* n_tiles, const float* selw, u32 n_in, u32 n_ff, u32 n_used, float limit) {
    moe_gemm_gate_up_mma_body<DS4_T_Q2_K>(mid, gate, up, xq, xd, xbs, pairs, tiles, n_tiles, selw, n_in, n_ff, n_used, limit);
}
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_moe_gemm_down_q2_k_mma(
    float* outp, const u8* down, const i8* mq, const float* md, const i16* mbs, const u32* pairs, const u32* tiles,
    const u32* n_tiles, u32 n_ff, u32 n_out, u32 n_used) {
    moe_gemm_down_mma_body<DS4_T_Q2_K>(outp, down, mq, md, mbs, pairs, tiles, n_tiles, n_ff, n_out, n_used);
}
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_moe_gemm_gate_up_q4_k_mma(
    float* mid, const u8* gate, const u8* up, const i8* xq, const float* xd, const i16* xbs, const u32* pairs,
    const u32* tiles, const u32* n_tiles, const float* selw, u32 n_in, u32 n_ff, u32 n_used, float limit) {
    moe_gemm_gate_up_mma_body<DS4_T_Q4_K>(mid, gate, up, xq, xd, xbs, pairs, tiles, n_tiles, selw, n_in, n_ff, n_used, limit);
}
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_moe_gemm_down_q4_k_mma(
    float* outp, const u8* down, const i8* mq, const float* md, const i16* mbs, const u32* pairs, const u32* tiles,
    const u32* n_tiles, u32 n_ff, u32 n_out, u32 n_used) {
    moe_gemm_down_mma_body<DS4_T_Q4_K>(outp, down, mq, md, mbs, pairs, tiles, n_tiles, n_ff, n_out, n_used);
}
