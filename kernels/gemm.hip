// Tiled GEMMs for batched prefill (spec §3.11): quantized weights x int8-quantized activations with
// the same per-token activation quantization as decode (Q8_0 for Q8_0 weights, Q8_K for experts),
// so prefill and decode compute the same products, plus an f32 GEMM for F16 weights.
//
// One generic body serves every quantized format. A 32-element chunk of a weight row is unpacked
// into 32 int8 codes and four floats (A0, A1, B0, B1) such that its dot with an activation chunk
// (int8 codes q, scale d, 16-element sums bs0, bs1) is
//     d * (A0 * i0 + A1 * i1 - B0 * bs0 - B1 * bs1),  i0/i1 = int dot of the first/second 16 codes.
//   Q8_0:    codes = q,                 A0 = A1 = d_w,                B = 0
//   Q4_K:    codes = nibble (0..15),    A = d * sc_j,                 B = dmin * m_j
//   Q2_K:    codes = 2-bit (0..3),      A_h = d * (sc_s & 15),        B_h = dmin * (sc_s >> 4)
//   IQ2_XXS: codes = signed grid bytes, A = d * (2 ls + 1) / 8,       B = 0
// which is the per-block formula of spec §2.3 regrouped per chunk.
//
// Tiles: 64 weight rows x 64 tokens (or expert pairs), 4 chunks (128 elements) per shared-memory
// stage, 256 threads each owning 4 rows x 4 tokens.
#pragma once
#include "formats.h"

#define DS4_GM_ROWS 64
#define DS4_GM_TOKS 64
#define DS4_GM_CH 4

struct WChunk {
    int q[8];
    float a0, a1, b0, b1;
};

// Unpacks chunk c of weight row `wrow` (format T) into codes and factors.
template <int T>
DS4_DEV void unpack_chunk(const u8* wrow, u32 c, WChunk& o, const u64* grid) {
    if constexpr (T == DS4_T_Q8_0) {
        const u8* blk = wrow + (u64)c * 34;
        const float d = f16_to_f32(*(const u16*)blk);
#pragma unroll
        for (int i = 0; i < 8; ++i) o.q[i] = (int)load_u32_2a(blk + 2 + 4 * i);
        o.a0 = o.a1 = d;
        o.b0 = o.b1 = 0.0f;
    } else if constexpr (T == DS4_T_Q4_K) {
        const u8* blk = wrow + (u64)(c / 8) * 144;
        const u32 j = c % 8;
        const u32 dd = *(const u32*)blk;
        const u32* sc32 = (const u32*)(blk + 4);
        const u32 s0 = sc32[0], s1 = sc32[1], s2 = sc32[2];
        u32 sc, m;
        if (j < 4) {
            sc = (s0 >> (8 * j)) & 63;
            m = (s1 >> (8 * j)) & 63;
        } else {
            const u32 jj = j - 4;
            const u32 b8 = (s2 >> (8 * jj)) & 0xff;
            sc = (b8 & 15) | (((s0 >> (8 * jj + 6)) & 3) << 4);
            m = (b8 >> 4) | (((s1 >> (8 * jj + 6)) & 3) << 4);
        }
        const int4* qp = (const int4*)(blk + 16 + 32 * (j / 2));
        const int4 q0 = qp[0], q1 = qp[1];
        const u32 sh = 4 * (j & 1);
        const int w[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
#pragma unroll
        for (int i = 0; i < 8; ++i) o.q[i] = (int)(((u32)w[i] >> sh) & 0x0F0F0F0Fu);
        const float d = f16_to_f32((u16)(dd & 0xffff)), dmin = f16_to_f32((u16)(dd >> 16));
        o.a0 = o.a1 = d * (float)sc;
        o.b0 = o.b1 = dmin * (float)m;
    } else if constexpr (T == DS4_T_Q2_K) {
        const u8* blk = wrow + (u64)(c / 8) * 84;
        const u32 cb = c % 8, k = cb / 4, j = cb % 4;
        const u32 sc01 = *(const u16*)(blk + 8 * k + 2 * j);
        const u32* qs = (const u32*)(blk + 16 + 32 * k);
        const u32 sh = 2 * j;
#pragma unroll
        for (int i = 0; i < 8; ++i) o.q[i] = (int)((qs[i] >> sh) & 0x03030303u);
        const u32 dd = *(const u32*)(blk + 80);
        const float d = f16_to_f32((u16)(dd & 0xffff)), dmin = f16_to_f32((u16)(dd >> 16));
        o.a0 = d * (float)(sc01 & 15);
        o.a1 = d * (float)((sc01 >> 8) & 15);
        o.b0 = dmin * (float)((sc01 >> 4) & 15);
        o.b1 = dmin * (float)(sc01 >> 12);
    } else if constexpr (T == DS4_T_IQ2_XXS) {
        const u8* blk = wrow + (u64)(c / 8) * 66;
        const u32 ib = c % 8;
        const float d = f16_to_f32(*(const u16*)blk);
        const u32 g4 = load_u32_2a(blk + 2 + 8 * ib);
        const u32 aux = load_u32_2a(blk + 6 + 8 * ib);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const u64 g = grid[(g4 >> (8 * k)) & 0xff];
            u32 s = (aux >> (7 * k)) & 127;
            s |= (__popc(s) & 1) << 7;
            const u32 mlo = sign_mask4(s & 15), mhi = sign_mask4(s >> 4);
            o.q[2 * k] = (int)(((u32)g ^ mlo) + (mlo & 0x01010101u));
            o.q[2 * k + 1] = (int)(((u32)(g >> 32) ^ mhi) + (mhi & 0x01010101u));
        }
        o.a0 = o.a1 = d * 0.125f * (float)(2 * (aux >> 28) + 1);
        o.b0 = o.b1 = 0.0f;
    }
}

// Activation chunk: Q8_0 activations (AK = false: scale per chunk, no sums) or Q8_K (AK = true).
template <bool AK>
DS4_DEV void load_act_any(const i8* xq, const float* xd, const i16* xbs, u32 c, int q[8], float& d, int& bs0,
                          int& bs1) {
    load_act_chunk(xq, c, q);
    if constexpr (AK) {
        d = xd[c / 8];
        bs0 = xbs[2 * c];
        bs1 = xbs[2 * c + 1];
    } else {
        d = xd[c];
        bs0 = bs1 = 0;
    }
}

// Where the 64 columns (tokens or expert pairs) of a tile come from.
struct TileCols {
    u32 n;            // live columns in this tile
    u32 act_row[DS4_GM_TOKS];  // activation row of each column (filled in shared memory)
    u32 out_row[DS4_GM_TOKS];  // output row of each column
};

// The shared GEMM body. NW = 1 (plain) or 2 (gate + up with SwiGLU). Computes, for the 64 weight
// rows starting at r0 and the tile's columns, acc[w][i][j] over all n_in / 32 chunks.
template <int T, bool AK, int NW>
DS4_DEV void gemm_tile(float (&acc)[NW][4][4], const u8* const* wbase, u64 rb, u32 r0, u32 n_rows, u32 n_in,
                       const i8* xq, const float* xd, const i16* xbs, u32 x_stride, u32 xg_off,
                       const TileCols& cols, const u64* grid) {
    __shared__ int4 ws[NW][DS4_GM_CH][DS4_GM_ROWS][2];
    __shared__ float4 wf[NW][DS4_GM_CH][DS4_GM_ROWS];
    __shared__ int4 xs[DS4_GM_CH][DS4_GM_TOKS][2];
    __shared__ float xf[DS4_GM_CH][DS4_GM_TOKS];
    __shared__ int2 xb[DS4_GM_CH][DS4_GM_TOKS];
    const u32 tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    const u32 nc = n_in / 32;
#pragma unroll
    for (int w = 0; w < NW; ++w)
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) acc[w][i][j] = 0.0f;

    for (u32 c0 = 0; c0 < nc; c0 += DS4_GM_CH) {
        // Stage: thread -> (row, chunk) of each weight and (column, chunk) of the activations.
        {
            const u32 row = tid % DS4_GM_ROWS, ch = tid / DS4_GM_ROWS;
            const u32 c = c0 + ch;
#pragma unroll
            for (int w = 0; w < NW; ++w) {
                WChunk wc;
                if (c < nc && r0 + row < n_rows) {
                    unpack_chunk<T>(wbase[w] + (u64)(r0 + row) * rb, c, wc, grid);
                } else {
#pragma unroll
                    for (int i = 0; i < 8; ++i) wc.q[i] = 0;
                    wc.a0 = wc.a1 = wc.b0 = wc.b1 = 0.0f;
                }
                ws[w][ch][row][0] = make_int4(wc.q[0], wc.q[1], wc.q[2], wc.q[3]);
                ws[w][ch][row][1] = make_int4(wc.q[4], wc.q[5], wc.q[6], wc.q[7]);
                wf[w][ch][row] = make_float4(wc.a0, wc.a1, wc.b0, wc.b1);
            }
            const u32 col = tid % DS4_GM_TOKS;
            int q[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            float d = 0.0f;
            int b0 = 0, b1 = 0;
            if (c < nc && col < cols.n) {
                const u64 ar = cols.act_row[col];
                load_act_any<AK>(xq + ar * x_stride + xg_off, xd + ar * (x_stride / (AK ? 256 : 32)) +
                                     xg_off / (AK ? 256 : 32),
                                 xbs ? xbs + ar * (x_stride / 16) + xg_off / 16 : nullptr, c, q, d, b0, b1);
            }
            xs[ch][col][0] = make_int4(q[0], q[1], q[2], q[3]);
            xs[ch][col][1] = make_int4(q[4], q[5], q[6], q[7]);
            xf[ch][col] = d;
            xb[ch][col] = make_int2(b0, b1);
        }
        __syncthreads();
#pragma unroll
        for (int ch = 0; ch < DS4_GM_CH; ++ch) {
            int4 xv[4][2];
            float xd4[4];
            int2 xb4[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const u32 col = tx + 16 * j;
                xv[j][0] = xs[ch][col][0];
                xv[j][1] = xs[ch][col][1];
                xd4[j] = xf[ch][col];
                xb4[j] = xb[ch][col];
            }
#pragma unroll
            for (int w = 0; w < NW; ++w) {
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const u32 row = ty + 16 * i;
                    const int4 a = ws[w][ch][row][0], b = ws[w][ch][row][1];
                    const float4 f = wf[w][ch][row];
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        int i0 = dot4_i8(a.x, xv[j][0].x, 0);
                        i0 = dot4_i8(a.y, xv[j][0].y, i0);
                        i0 = dot4_i8(a.z, xv[j][0].z, i0);
                        i0 = dot4_i8(a.w, xv[j][0].w, i0);
                        int i1 = dot4_i8(b.x, xv[j][1].x, 0);
                        i1 = dot4_i8(b.y, xv[j][1].y, i1);
                        i1 = dot4_i8(b.z, xv[j][1].z, i1);
                        i1 = dot4_i8(b.w, xv[j][1].w, i1);
                        acc[w][i][j] += xd4[j] * (f.x * (float)i0 + f.y * (float)i1 - f.z * (float)xb4[j].x -
                                                  f.w * (float)xb4[j].y);
                    }
                }
            }
        }
        __syncthreads();
    }
}

// Dense Q8_0 GEMM: y[t][r] = W[r] · x_t for n_tok tokens with Q8_0 activations (planar, x_stride
// elements per token). Grouped projections as in ds4_matvec_q8_0 (rows_per_group a multiple of 64).
// Launch: grid (ceil(n_out / 64), ceil(n_tok / 64)), block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_gemm_q8_0(float* y, const u8* w, const i8* xq, const float* xd,
                                                                u32 n_in, u32 n_out, u32 rows_per_group,
                                                                u32 x_stride, u32 n_tok) {
    __shared__ TileCols cols;
    const u32 r0 = blockIdx.x * DS4_GM_ROWS, t0 = blockIdx.y * DS4_GM_TOKS;
    if (threadIdx.x == 0) cols.n = min(DS4_GM_TOKS, n_tok - t0);
    if (threadIdx.x < DS4_GM_TOKS) cols.act_row[threadIdx.x] = cols.out_row[threadIdx.x] = t0 + threadIdx.x;
    __syncthreads();
    const u8* wb[1] = {w};
    float acc[1][4][4];
    gemm_tile<DS4_T_Q8_0, false, 1>(acc, wb, (u64)(n_in / 32) * 34, r0, n_out, n_in, xq, xd, nullptr, x_stride,
                                    (r0 / rows_per_group) * n_in, cols, nullptr);
    const u32 tx = threadIdx.x % 16, ty = threadIdx.x / 16;
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const u32 r = r0 + ty + 16 * i, col = tx + 16 * j;
            if (r < n_out && col < cols.n) y[(u64)cols.out_row[col] * n_out + r] = acc[0][i][j];
        }
}

// Shared-expert gate/up + clamped SwiGLU for a batch: mid[t][r] = swiglu(Wg[r]·x_t, Wu[r]·x_t).
// Launch: grid (ceil(n_ff / 64), ceil(n_tok / 64)), block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_gemm_q8_0_swiglu(float* mid, const u8* wg, const u8* wu,
                                                                       const i8* xq, const float* xd, u32 n_in,
                                                                       u32 n_ff, float limit, u32 n_tok) {
    __shared__ TileCols cols;
    const u32 r0 = blockIdx.x * DS4_GM_ROWS, t0 = blockIdx.y * DS4_GM_TOKS;
    if (threadIdx.x == 0) cols.n = min(DS4_GM_TOKS, n_tok - t0);
    if (threadIdx.x < DS4_GM_TOKS) cols.act_row[threadIdx.x] = cols.out_row[threadIdx.x] = t0 + threadIdx.x;
    __syncthreads();
    const u8* wb[2] = {wg, wu};
    float acc[2][4][4];
    gemm_tile<DS4_T_Q8_0, false, 2>(acc, wb, (u64)(n_in / 32) * 34, r0, n_ff, n_in, xq, xd, nullptr, n_in, 0, cols,
                                    nullptr);
    const u32 tx = threadIdx.x % 16, ty = threadIdx.x / 16;
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const u32 r = r0 + ty + 16 * i, col = tx + 16 * j;
            if (r < n_ff && col < cols.n)
                mid[(u64)cols.out_row[col] * n_ff + r] = swiglu_clamped(acc[0][i][j], acc[1][i][j], limit);
        }
}

// Groups the (token, slot) pairs of a batch by expert for the grouped expert GEMMs.
//   pairs: u32 [n_tok * n_used]  pair ids p = t * n_used + k, sorted by expert (stable in p);
//   tiles: u32 [max_tiles][3]    (expert, first index into pairs, count <= 64) per tile;
//   n_tiles: u32 [1]             number of tiles written (<= max_tiles = ceil(n_pairs/64) + n_expert).
// Single thread on purpose: deterministic order, and the pair count of a chunk is small.
// Launch: grid (1), block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_moe_group(u32* pairs, u32* tiles, u32* n_tiles, const u32* sel,
                                                                u32 n_tok, u32 n_used, u32 n_expert) {
    __shared__ u32 count[1024];
    __shared__ u32 start[1025];
    if (n_expert > 1024) return;
    for (u32 e = threadIdx.x; e < n_expert; e += DS4_BLOCK) count[e] = 0;
    __syncthreads();
    const u32 np = n_tok * n_used;
    for (u32 p = threadIdx.x; p < np; p += DS4_BLOCK) {
        const u32 e = sel[p];
        if (e < n_expert) atomicAdd(&count[e], 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        u32 s = 0, nt = 0;
        for (u32 e = 0; e < n_expert; ++e) {
            start[e] = s;
            for (u32 off = 0; off < count[e]; off += DS4_GM_TOKS) {
                tiles[3 * nt] = e;
                tiles[3 * nt + 1] = s + off;
                tiles[3 * nt + 2] = min(DS4_GM_TOKS, count[e] - off);
                ++nt;
            }
            s += count[e];
        }
        start[n_expert] = s;
        n_tiles[0] = nt;
        for (u32 p = 0; p < np; ++p) {
            const u32 e = sel[p];
            if (e < n_expert) pairs[start[e]++] = p;
        }
    }
}

// Loads the columns of expert tile `tile` (see ds4_moe_group); returns the expert id.
DS4_DEV u32 load_expert_tile(TileCols& cols, const u32* pairs, const u32* tiles, u32 tile, u32 n_used, bool act_is_pair) {
    const u32 e = tiles[3 * tile], s = tiles[3 * tile + 1], n = tiles[3 * tile + 2];
    if (threadIdx.x == 0) cols.n = n;
    if (threadIdx.x < n) {
        const u32 p = pairs[s + threadIdx.x];
        cols.out_row[threadIdx.x] = p;
        cols.act_row[threadIdx.x] = act_is_pair ? p : p / n_used;
    }
    __syncthreads();
    return e;
}

// Grouped routed gate/up + SwiGLU: for each tile (expert e, up to 64 pairs p = t * n_used + k),
// mid[p][r] = swiglu(gate_e[r]·x_t, up_e[r]·x_t) * selw[p], x = Q8_K activation of token t.
// Same result layout as ds4_moe_gate_up_<fmt> (mid [n_tok][n_used][n_ff]).
// Launch: grid (ceil(n_ff / 64), max_tiles), block 256; blocks past n_tiles[0] exit.
template <int T>
DS4_DEV void moe_gemm_gate_up_body(float* mid, const u8* gate, const u8* up, const i8* xq, const float* xd,
                                   const i16* xbs, const u32* pairs, const u32* tiles, const u32* n_tiles,
                                   const float* selw, u32 n_in, u32 n_ff, u32 n_used, float limit) {
    __shared__ TileCols cols;
    __shared__ u64 sgrid[256];
    if (blockIdx.y >= n_tiles[0]) return;
    if constexpr (T == DS4_T_IQ2_XXS) stage_iq2_grid(sgrid);
    const u32 e = load_expert_tile(cols, pairs, tiles, blockIdx.y, n_used, false);
    const u64 rb = row_bytes<T>(n_in);
    const u8* wb[2] = {gate + (u64)e * n_ff * rb, up + (u64)e * n_ff * rb};
    const u32 r0 = blockIdx.x * DS4_GM_ROWS;
    float acc[2][4][4];
    gemm_tile<T, true, 2>(acc, wb, rb, r0, n_ff, n_in, xq, xd, xbs, n_in, 0, cols, sgrid);
    const u32 tx = threadIdx.x % 16, ty = threadIdx.x / 16;
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const u32 r = r0 + ty + 16 * i, col = tx + 16 * j;
            if (r < n_ff && col < cols.n) {
                const u32 p = cols.out_row[col];
                mid[(u64)p * n_ff + r] = swiglu_clamped(acc[0][i][j], acc[1][i][j], limit) * selw[p];
            }
        }
}

// Grouped routed down projection: outp[p][r] = down_e[r] · m_p for the pairs of each tile, m = Q8_K
// rows of the route-weighted mids (row p). ds4_moe_sum then adds the slots in order.
// Launch: grid (ceil(n_out / 64), max_tiles), block 256; blocks past n_tiles[0] exit.
template <int T>
DS4_DEV void moe_gemm_down_body(float* outp, const u8* down, const i8* mq, const float* md, const i16* mbs,
                                const u32* pairs, const u32* tiles, const u32* n_tiles, u32 n_ff, u32 n_out,
                                u32 n_used) {
    __shared__ TileCols cols;
    __shared__ u64 sgrid[256];
    if (blockIdx.y >= n_tiles[0]) return;
    if constexpr (T == DS4_T_IQ2_XXS) stage_iq2_grid(sgrid);
    const u32 e = load_expert_tile(cols, pairs, tiles, blockIdx.y, n_used, true);
    const u64 rb = row_bytes<T>(n_ff);
    const u8* wb[1] = {down + (u64)e * n_out * rb};
    const u32 r0 = blockIdx.x * DS4_GM_ROWS;
    float acc[1][4][4];
    gemm_tile<T, true, 1>(acc, wb, rb, r0, n_out, n_ff, mq, md, mbs, n_ff, 0, cols, sgrid);
    const u32 tx = threadIdx.x % 16, ty = threadIdx.x / 16;
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const u32 r = r0 + ty + 16 * i, col = tx + 16 * j;
            if (r < n_out && col < cols.n) outp[(u64)cols.out_row[col] * n_out + r] = acc[0][i][j];
        }
}

extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_moe_gemm_gate_up_iq2_xxs(
    float* mid, const u8* gate, const u8* up, const i8* xq, const float* xd, const i16* xbs, const u32* pairs,
    const u32* tiles, const u32* n_tiles, const float* selw, u32 n_in, u32 n_ff, u32 n_used, float limit) {
    moe_gemm_gate_up_body<DS4_T_IQ2_XXS>(mid, gate, up, xq, xd, xbs, pairs, tiles, n_tiles, selw, n_in, n_ff,
                                         n_used, limit);
}
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_moe_gemm_gate_up_q2_k(
    float* mid, const u8* gate, const u8* up, const i8* xq, const float* xd, const i16* xbs, const u32* pairs,
    const u32* tiles, const u32* n_tiles, const float* selw, u32 n_in, u32 n_ff, u32 n_used, float limit) {
    moe_gemm_gate_up_body<DS4_T_Q2_K>(mid, gate, up, xq, xd, xbs, pairs, tiles, n_tiles, selw, n_in, n_ff, n_used,
                                      limit);
}
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_moe_gemm_gate_up_q4_k(
    float* mid, const u8* gate, const u8* up, const i8* xq, const float* xd, const i16* xbs, const u32* pairs,
    const u32* tiles, const u32* n_tiles, const float* selw, u32 n_in, u32 n_ff, u32 n_used, float limit) {
    moe_gemm_gate_up_body<DS4_T_Q4_K>(mid, gate, up, xq, xd, xbs, pairs, tiles, n_tiles, selw, n_in, n_ff, n_used,
                                      limit);
}
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_moe_gemm_down_iq2_xxs(
    float* outp, const u8* down, const i8* mq, const float* md, const i16* mbs, const u32* pairs, const u32* tiles,
    const u32* n_tiles, u32 n_ff, u32 n_out, u32 n_used) {
    moe_gemm_down_body<DS4_T_IQ2_XXS>(outp, down, mq, md, mbs, pairs, tiles, n_tiles, n_ff, n_out, n_used);
}
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_moe_gemm_down_q2_k(
    float* outp, const u8* down, const i8* mq, const float* md, const i16* mbs, const u32* pairs, const u32* tiles,
    const u32* n_tiles, u32 n_ff, u32 n_out, u32 n_used) {
    moe_gemm_down_body<DS4_T_Q2_K>(outp, down, mq, md, mbs, pairs, tiles, n_tiles, n_ff, n_out, n_used);
}
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_moe_gemm_down_q4_k(
    float* outp, const u8* down, const i8* mq, const float* md, const i16* mbs, const u32* pairs, const u32* tiles,
    const u32* n_tiles, u32 n_ff, u32 n_out, u32 n_used) {
    moe_gemm_down_body<DS4_T_Q4_K>(outp, down, mq, md, mbs, pairs, tiles, n_tiles, n_ff, n_out, n_used);
}

// out[t][r] = sum over slots k in order of outp[t * n_used + k][r] (spec §3.9 step 5 sum order).
// Launch: grid (ceil(n_out / 256), n_tok), block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_moe_sum(float* out, const float* outp, u32 n_out, u32 n_used) {
    const u32 t = blockIdx.y, r = blockIdx.x * DS4_BLOCK + threadIdx.x;
    if (r >= n_out) return;
    float s = 0.0f;
    for (u32 k = 0; k < n_used; ++k) s += outp[((u64)t * n_used + k) * n_out + r];
    out[(u64)t * n_out + r] = s;
}

// F16-weight GEMM with f32 activations: y[t][r] = W[r] · x_t (row-major F16 W [n_out][n_in],
// x [n_tok][x_stride]). 64 x 64 tiles, 32-wide k steps, fp32 FMA, 4 x 4 outputs per thread.
// Launch: grid (ceil(n_out / 64), ceil(n_tok / 64)), block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_gemm_f16(float* y, const u16* w, const float* x, u32 n_in,
                                                               u32 n_out, u32 x_stride, u32 n_tok) {
    __shared__ float wsm[32][DS4_GM_ROWS + 1];
    __shared__ float xsm[32][DS4_GM_TOKS + 1];
    const u32 r0 = blockIdx.x * DS4_GM_ROWS, t0 = blockIdx.y * DS4_GM_TOKS;
    const u32 tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
    for (u32 k0 = 0; k0 < n_in; k0 += 32) {
        // 64 rows x 32 k of W and 64 tokens x 32 k of x: 8 elements per thread each.
        for (u32 i = tid; i < 64 * 32; i += DS4_BLOCK) {
            const u32 row = i / 32, k = i % 32;
            const u32 gr = r0 + row, gk = k0 + k, gt = t0 + row;
            wsm[k][row] = (gr < n_out && gk < n_in) ? f16_to_f32(w[(u64)gr * n_in + gk]) : 0.0f;
            xsm[k][row] = (gt < n_tok && gk < n_in) ? x[(u64)gt * x_stride + gk] : 0.0f;
        }
        __syncthreads();
#pragma unroll 8
        for (u32 k = 0; k < 32; ++k) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) a[i] = wsm[k][ty + 16 * i];
#pragma unroll
            for (int j = 0; j < 4; ++j) b[j] = xsm[k][tx + 16 * j];
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] += a[i] * b[j];
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const u32 r = r0 + ty + 16 * i, t = t0 + tx + 16 * j;
            if (r < n_out && t < n_tok) y[(u64)t * n_out + r] = acc[i][j];
        }
}
