// Fast-mode GEMMs for batched prefill on matrix cores (kernels/mma.h), the twins of gemm.hip's
// ds4_gemm_q8_0 and ds4_gemm_f16 with the same arguments, the same model math and another sum order.
//
// Tiles: a block of 256 threads computes 64 weight rows x 128 tokens; its 8 MMA groups each own
// 16 rows x 64 tokens (four 16 x 16 tiles sharing one A fragment per k step). Operands are staged
// in shared memory as k-contiguous rows (the layout mma.h's loaders read); each thread loads the
// next stage's global data into registers before the current stage's tiles run, so the loads are
// in flight during the matrix work.
#pragma once
#include "formats.h"
#include "gemm.hip"  // the exact twins' tile machinery the quantized GEMMs share
#include "mma.h"

#define DS4_MM_ROWS 64    // weight rows per block
#define DS4_MM_TOKS 128   // tokens per block
#define DS4_MM_QB 4       // Q8_0 blocks (32 k each) per stage
#define DS4_MM_LDQ (32 * DS4_MM_QB + 16)  // staged int8 row stride in bytes (16-byte aligned, padded)
#define DS4_MM_KH 32      // f16 k per stage
#define DS4_MM_LDH (DS4_MM_KH + 8)  // staged f16 row stride in halves (80 bytes)

// Two floats as f16 bits (round to nearest even), a in the low half: one packed conversion on
// NVIDIA (its scalar f32 -> f16 conversions run at a quarter of the ALU rate).
DS4_DEV u32 f16x2_bits(float a, float b) {
#if defined(DS4_NVIDIA)
    const __half2 h = __floats2half2_rn(a, b);
    return (u32)__half_as_ushort(__low2half(h)) | (u32)__half_as_ushort(__high2half(h)) << 16;
#else
    return (u32)f32_to_f16_bits(a) | (u32)f32_to_f16_bits(b) << 16;
#endif
}

// One Q8_0 block (34 bytes at a 2-byte aligned address: f16 scale, 32 codes) in 9 loads rather
// than 17: the 4-byte words covering it, the codes shifted out of word pairs. Returns the scale's
// bits; q[i] = codes 4i .. 4i + 3 (as load_u32_2a would read them). Reads only the block's bytes.
DS4_DEV u16 load_q8_0_block(const u8* blk, u32 q[8]) {
    const bool odd = ((uintptr_t)blk & 2) != 0;  // the codes start 4-byte aligned
    const u32* a = (const u32*)(blk - (odd ? 2 : 0));
    u32 wd[9];
#pragma unroll
    for (int i = 0; i < 8; ++i) wd[i] = a[i];
    wd[8] = odd ? a[8] : (u32) * (const u16*)(a + 8);
    const u32 sh = odd ? 32 : 16;
#pragma unroll
    for (int i = 0; i < 8; ++i) q[i] = (u32)((((u64)wd[i + 1] << 32) | wd[i]) >> sh);
    return (u16)(odd ? wd[0] >> 16 : wd[0]);
}

// Dense Q8_0 GEMM on int8 tiles: y[t][r] = sum over blocks b of (i32 sum of the block's 32 code
// products) * d_w[r][b] * d_x[t][b], the Q8_0 dot of the model; the i32 block sums are exact, the
// blocks are added in order with one fused multiply-add each. Grouped projections as in ds4_gemm_q8_0
// (rows_per_group a multiple of 64). Launch: grid (ceil(n_out / 64), ceil(n_tok / 128)), block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_gemm_q8_0_mma(float* y, const u8* w, const i8* xq,
                                                                    const float* xd, u32 n_in, u32 n_out,
                                                                    u32 rows_per_group, u32 x_stride, u32 n_tok) {
    ds4_grid_sync();
    __shared__ int4 ws4[DS4_MM_ROWS * DS4_MM_LDQ / 16];
    __shared__ int4 xs4[DS4_MM_TOKS * DS4_MM_LDQ / 16];
    __shared__ float wd[DS4_MM_QB][DS4_MM_ROWS];
    __shared__ float xds[DS4_MM_QB][DS4_MM_TOKS];
    i8* ws = (i8*)ws4;
    i8* xs = (i8*)xs4;
    const u32 tid = threadIdx.x;
    const u32 r0 = blockIdx.x * DS4_MM_ROWS, t0 = blockIdx.y * DS4_MM_TOKS;
    const u32 nc = n_in / 32;
    const u64 rb = (u64)nc * 34;
    const u32 xg_off = (r0 / rows_per_group) * n_in;
    const u32 g = mma_group(), rg = 16 * (g % 4), tg = 64 * (g / 4);
    MmaAccF acc[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) mma_zero(acc[j]);

    // A stage's global data in registers: weights (row tid / 4, block tid % 4) and the activation
    // (token, block) pairs tid + 256 i. The next stage's loads are issued before this stage's tiles
    // run, so they are in flight during the matrix work (one shared-memory stage, two barriers).
    constexpr u32 XP = DS4_MM_TOKS * DS4_MM_QB / DS4_BLOCK;
    struct Stage {
        u32 wq[8];
        float wd;
        int4 x[XP][2];
        float xd[XP];
    };
    const u32 w_row = tid / DS4_MM_QB, w_b = tid % DS4_MM_QB;
    auto load = [&](u32 c0, Stage& st) {
        const u32 c = c0 + w_b;
        const bool wl = r0 + w_row < n_out && c < nc;
        if (wl) {
            st.wd = f16_to_f32(load_q8_0_block(w + (u64)(r0 + w_row) * rb + (u64)c * 34, st.wq));
        } else {
            st.wd = 0.0f;
#pragma unroll
            for (int i = 0; i < 8; ++i) st.wq[i] = 0u;
        }
#pragma unroll
        for (u32 i = 0; i < XP; ++i) {
            const u32 pi = tid + DS4_BLOCK * i, tok = pi / DS4_MM_QB, cx = c0 + pi % DS4_MM_QB;
            const bool xl = t0 + tok < n_tok && cx < nc;
            const u64 t = t0 + tok;
            const int4* src = (const int4*)(xq + t * x_stride + xg_off + 32 * cx);
            st.x[i][0] = xl ? src[0] : make_int4(0, 0, 0, 0);
            st.x[i][1] = xl ? src[1] : make_int4(0, 0, 0, 0);
            st.xd[i] = xl ? xd[t * (x_stride / 32) + xg_off / 32 + cx] : 0.0f;
        }
    };
    auto store = [&](const Stage& st) {
        int4* wdst = (int4*)(ws + w_row * DS4_MM_LDQ + 32 * w_b);
        wdst[0] = make_int4((int)st.wq[0], (int)st.wq[1], (int)st.wq[2], (int)st.wq[3]);
        wdst[1] = make_int4((int)st.wq[4], (int)st.wq[5], (int)st.wq[6], (int)st.wq[7]);
        wd[w_b][w_row] = st.wd;
#pragma unroll
        for (u32 i = 0; i < XP; ++i) {
            const u32 pi = tid + DS4_BLOCK * i, tok = pi / DS4_MM_QB, b = pi % DS4_MM_QB;
            int4* xdst = (int4*)(xs + tok * DS4_MM_LDQ + 32 * b);
            xdst[0] = st.x[i][0];
            xdst[1] = st.x[i][1];
            xds[b][tok] = st.xd[i];
        }
    };
    Stage st;
    load(0, st);
    for (u32 c0 = 0; c0 < nc; c0 += DS4_MM_QB) {
        store(st);
        __syncthreads();
        if (c0 + DS4_MM_QB < nc) load(c0 + DS4_MM_QB, st);
#pragma unroll
        for (u32 b = 0; b < DS4_MM_QB; ++b) {
            MmaFragI8 a;
            mma_load(a, ws + rg * DS4_MM_LDQ + 32 * b, DS4_MM_LDQ);
            // The block's scales in registers: the lane's rows once per block, its columns per tile.
            float wr[8];
#pragma unroll
            for (int e = 0; e < 8; ++e) wr[e] = wd[b][rg + mma_row(e)];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const u32 tj = tg + 16 * j;
                MmaFragI8 bf;
                mma_load(bf, xs + tj * DS4_MM_LDQ + 32 * b, DS4_MM_LDQ);
                float xc[8];
#pragma unroll
                for (int e = 0; e < 8; ++e) xc[e] = xds[b][tj + mma_col(e)];
                MmaAccI s;
                mma_zero(s);
                mma_i8(s, a, bf);
#pragma unroll
                for (int e = 0; e < 8; ++e) acc[j].v[e] = fmaf((float)s.v[e], wr[e] * xc[e], acc[j].v[e]);
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            const u32 r = r0 + rg + mma_row(e), t = t0 + tg + 16 * j + mma_col(e);
            if (r < n_out && t < n_tok) y[(u64)t * n_out + r] = acc[j].v[e];
        }
}

// F16-weight GEMM on f16 tiles: y[t][r] = W[r] · x_t (row-major F16 W [n_out][n_in], f32 x
// [n_tok][x_stride]). Each activation is split as x = hi + lo with hi = f16(x), lo = f16(x - hi)
// and both halves go through the f16 tiles with f32 accumulation, so a product carries about 22
// bits of x rather than f16's 11 (weights are exactly f16). Activations beyond the f16 range
// (|x| > 65504) are not supported: these GEMMs see normalized rows. Launch: grid
// (ceil(n_out / 64), ceil(n_tok / 128)), block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_gemm_f16_mma(float* y, const u16* w, const float* x, u32 n_in,
                                                                   u32 n_out, u32 x_stride, u32 n_tok) {
    ds4_grid_sync();
    __shared__ int4 ws4[DS4_MM_ROWS * DS4_MM_LDH * 2 / 16];
    __shared__ int4 xh4[DS4_MM_TOKS * DS4_MM_LDH * 2 / 16];
    __shared__ int4 xl4[DS4_MM_TOKS * DS4_MM_LDH * 2 / 16];
    u16* ws = (u16*)ws4;
    u16* xh = (u16*)xh4;
    u16* xl = (u16*)xl4;
    const u32 tid = threadIdx.x;
    const u32 r0 = blockIdx.x * DS4_MM_ROWS, t0 = blockIdx.y * DS4_MM_TOKS;
    const u32 g = mma_group(), rg = 16 * (g % 4), tg = 64 * (g / 4);
    MmaAccF acc[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) mma_zero(acc[j]);

    // A stage's global data in registers (weights: row tid / 4, 8 consecutive k; activations:
    // token tid / 2, 16 consecutive k), the next stage's loaded before this stage's tiles run.
    // 16-byte loads where the shapes and pointers allow (a lane's 8 or 4 k then lie wholly inside
    // or outside n_in), element loads otherwise.
    const u32 w_row = tid / 4, w_k = 8 * (tid % 4), x_tok = tid / 2, x_k = 16 * (tid % 2);
    const bool vec = n_in % 8 == 0 && x_stride % 4 == 0 && ((uintptr_t)w | (uintptr_t)x) % 16 == 0;  // uniform
    struct Stage {
        int4 w;  // 8 halves
        float x[16];
    };
    auto load = [&](u32 k0, Stage& st) {
        const u32 gr = r0 + w_row, t = t0 + x_tok;
        if (vec) {
            st.w = gr < n_out && k0 + w_k < n_in ? *(const int4*)(w + (u64)gr * n_in + k0 + w_k) : make_int4(0, 0, 0, 0);
#pragma unroll
            for (u32 i = 0; i < 16; i += 4) {
                const u32 k = k0 + x_k + i;
                const float4 v = t < n_tok && k < n_in ? *(const float4*)(x + (u64)t * x_stride + k)
                                                       : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                st.x[i] = v.x;
                st.x[i + 1] = v.y;
                st.x[i + 2] = v.z;
                st.x[i + 3] = v.w;
            }
            return;
        }
        u16 wh[8];
#pragma unroll
        for (u32 i = 0; i < 8; ++i) {
            const u32 k = k0 + w_k + i;
            wh[i] = (gr < n_out && k < n_in) ? w[(u64)gr * n_in + k] : (u16)0;
        }
        st.w = make_int4((int)(wh[0] | (u32)wh[1] << 16), (int)(wh[2] | (u32)wh[3] << 16),
                         (int)(wh[4] | (u32)wh[5] << 16), (int)(wh[6] | (u32)wh[7] << 16));
#pragma unroll
        for (u32 i = 0; i < 16; ++i) {
            const u32 k = k0 + x_k + i;
            st.x[i] = (t < n_tok && k < n_in) ? x[(u64)t * x_stride + k] : 0.0f;
        }
    };
    Stage st;
    load(0, st);
    for (u32 k0 = 0; k0 < n_in; k0 += DS4_MM_KH) {
        *(int4*)(ws + w_row * DS4_MM_LDH + w_k) = st.w;
        u32 hp[8], lp[8];  // halves packed in pairs
#pragma unroll
        for (u32 i = 0; i < 16; i += 2) {
            const u32 h = f16x2_bits(st.x[i], st.x[i + 1]);
            hp[i / 2] = h;
            lp[i / 2] = f16x2_bits(st.x[i] - f16_to_f32((u16)h), st.x[i + 1] - f16_to_f32((u16)(h >> 16)));
        }
        int4* xhd = (int4*)(xh + x_tok * DS4_MM_LDH + x_k);
        int4* xld = (int4*)(xl + x_tok * DS4_MM_LDH + x_k);
        xhd[0] = make_int4((int)hp[0], (int)hp[1], (int)hp[2], (int)hp[3]);
        xhd[1] = make_int4((int)hp[4], (int)hp[5], (int)hp[6], (int)hp[7]);
        xld[0] = make_int4((int)lp[0], (int)lp[1], (int)lp[2], (int)lp[3]);
        xld[1] = make_int4((int)lp[4], (int)lp[5], (int)lp[6], (int)lp[7]);
        __syncthreads();
        if (k0 + DS4_MM_KH < n_in) load(k0 + DS4_MM_KH, st);
#pragma unroll
        for (u32 h = 0; h < DS4_MM_KH / 16; ++h) {
            MmaFragF16 a;
            mma_load(a, ws + rg * DS4_MM_LDH + 16 * h, DS4_MM_LDH);
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const u32 tj = tg + 16 * j;
                MmaFragF16 bh, bl;
                mma_load(bh, xh + tj * DS4_MM_LDH + 16 * h, DS4_MM_LDH);
                mma_load(bl, xl + tj * DS4_MM_LDH + 16 * h, DS4_MM_LDH);
                mma_f16(acc[j], a, bl);
                mma_f16(acc[j], a, bh);
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            const u32 r = r0 + rg + mma_row(e), t = t0 + tg + 16 * j + mma_col(e);
            if (r < n_out && t < n_tok) y[(u64)t * n_out + r] = acc[j].v[e];
        }
}

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
// its 8 MMA groups each own 16 rows x 32 columns. A stage holds 4 chunks of every row and column,
// each weight chunk decoded once per block for all its columns. Global loads are laid out so the 4
// lanes of a row (or column) read its stage bytes together, and the next stage's loads are issued
// before the current stage's tiles run (one shared-memory stage, two barriers per stage).

#define DS4_MQ_ROWS 64
#define DS4_MQ_COLS 64
#define DS4_MQ_CH 4                           // chunks per stage
#define DS4_MQ_LD (32 * DS4_MQ_CH + 16)       // staged int8 row stride in bytes (16-byte aligned, padded)

template <int NW>
struct MmaQuantSmem {
    int4 ws[NW][DS4_MQ_ROWS * DS4_MQ_LD / 16];  // codes, row-major, k-contiguous
    u32 wsc[NW][DS4_MQ_ROWS][DS4_MQ_CH];        // WChunk::sc of each (row, chunk)
    float2 wf[NW][DS4_MQ_ROWS][DS4_MQ_CH];      // the unit's (d, dmin)
    int4 xs[DS4_MQ_COLS * DS4_MQ_LD / 16];
    float xf[DS4_MQ_COLS][DS4_MQ_CH];           // activation scale of the chunk's unit
    u32 xb[DS4_MQ_COLS][DS4_MQ_CH];             // activation 16-element sums (Q8_K), an i16 pair
    TileCols cols;
};

// A thread's share of one stage of one weight matrix as loaded from global memory: row tid / 4,
// chunk c0 + tid % 4 (the 4 lanes of a row read its stage bytes together, so a warp's load touches
// 8 rows). wraw_fetch issues the loads, wraw_stage decodes into shared memory after the
// previous stage's tiles are done, so the loads are in flight during the matrix work. Every format
// writes the bytes, scales and factors unpack_chunk<T> gives (Q2_K: scales folded into the codes).
template <int T>
struct WRaw;
DS4_DEV void set_wf(float2& f, float d, float dmin) {
    f.x = d;
    f.y = dmin;
}

// Q8_0: the block's words (9 loads, load_q8_0_block).
template <>
struct WRaw<DS4_T_Q8_0> {
    u32 q[8];
    u16 d;
};
DS4_DEV void wraw_fetch(WRaw<DS4_T_Q8_0>& r, const u8* wrow, u32 c0, u32 t, bool live) {
    if (live) {
        r.d = load_q8_0_block(wrow + (u64)(c0 + t) * 34, r.q);
    } else {
        r.d = 0;
#pragma unroll
        for (int i = 0; i < 8; ++i) r.q[i] = 0;
    }
}
template <int NW>
DS4_DEV void wraw_stage(const WRaw<DS4_T_Q8_0>& r, MmaQuantSmem<NW>& sm, int w, u32 row, u32 t, const u64*, const u64*) {
    int4* dst = (int4*)((i8*)sm.ws[w] + row * DS4_MQ_LD + 32 * t);
    dst[0] = make_int4((int)r.q[0], (int)r.q[1], (int)r.q[2], (int)r.q[3]);
    dst[1] = make_int4((int)r.q[4], (int)r.q[5], (int)r.q[6], (int)r.q[7]);
    sm.wsc[w][row][t] = 0x0101u;
    set_wf(sm.wf[w][row][t], f16_to_f32(r.d), 0.0f);
}

// IQ2_XXS: the chunk's grid indices and sign/scale word, and the block's d. The signs decode
// through a staged table of the 128 ksigns patterns as bytewise masks.
template <>
struct WRaw<DS4_T_IQ2_XXS> {
    u32 g4, aux;
    u16 d;
};
DS4_DEV void wraw_fetch(WRaw<DS4_T_IQ2_XXS>& r, const u8* wrow, u32 c0, u32 t, bool live) {
    const u32 c = c0 + t;
    const u8* blk = wrow + (u64)(c / 8) * 66;
    r.g4 = live ? load_u32_2a(blk + 2 + 8 * (c % 8)) : 0;
    r.aux = live ? load_u32_2a(blk + 6 + 8 * (c % 8)) : 0;
    r.d = live ? *(const u16*)blk : 0;
}
template <int NW>
DS4_DEV void wraw_stage(const WRaw<DS4_T_IQ2_XXS>& r, MmaQuantSmem<NW>& sm, int w, u32 row, u32 t, const u64* grid,
                        const u64* signs) {
    int q[8];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        // A dead slot (rows past n_rows, all words 0) decodes to grid[0] codes with d = 0; those
        // rows are never stored.
        const u64 g = grid[(r.g4 >> (8 * k)) & 0xff], m = signs[(r.aux >> (7 * k)) & 127];
        // Bytewise negate where the mask is set: (g ^ m) + 1 per byte; no carry, grid bytes are > 0.
        q[2 * k] = (int)(((u32)g ^ (u32)m) + ((u32)m & 0x01010101u));
        q[2 * k + 1] = (int)(((u32)(g >> 32) ^ (u32)(m >> 32)) + ((u32)(m >> 32) & 0x01010101u));
    }
    int4* dst = (int4*)((i8*)sm.ws[w] + row * DS4_MQ_LD + 32 * t);
    dst[0] = make_int4(q[0], q[1], q[2], q[3]);
    dst[1] = make_int4(q[4], q[5], q[6], q[7]);
    const u32 ls = 2 * (r.aux >> 28) + 1;
    sm.wsc[w][row][t] = ls | (ls << 8);
    set_wf(sm.wf[w][row][t], f16_to_f32(r.d), 0.0f);
}

// Q2_K: the stage's 4 chunks are one 32-byte run of 2-bit codes (chunk j is bit pair j of every
// byte); lane t loads code words 2t, 2t + 1 and writes them for all 4 chunks with the 16-element
// scales folded in (bytewise products <= 45, no carries), and the scale words of chunk t.
template <>
struct WRaw<DS4_T_Q2_K> {
    u32 q0, q1, sl, sh, dd;
};
DS4_DEV void wraw_fetch(WRaw<DS4_T_Q2_K>& r, const u8* wrow, u32 c0, u32 t, bool live) {
    const u8* blk = wrow + (u64)(c0 / 8) * 84;
    const u32 k = (c0 % 8) / 4;
    const u32* qs = (const u32*)(blk + 16 + 32 * k);
    r.q0 = live ? qs[2 * t] : 0;
    r.q1 = live ? qs[2 * t + 1] : 0;
    r.sl = live ? *(const u32*)(blk + 8 * k) : 0;      // scale bytes of chunks 0, 1
    r.sh = live ? *(const u32*)(blk + 8 * k + 4) : 0;  // chunks 2, 3
    r.dd = live ? *(const u32*)(blk + 80) : 0;
}
template <int NW>
DS4_DEV void wraw_stage(const WRaw<DS4_T_Q2_K>& r, MmaQuantSmem<NW>& sm, int w, u32 row, u32 t, const u64*, const u64*) {
    i8* dst = (i8*)sm.ws[w] + row * DS4_MQ_LD + 8 * t;
#pragma unroll
    for (u32 j = 0; j < 4; ++j) {
        const u32 sc01 = ((j < 2 ? r.sl : r.sh) >> (16 * (j % 2))) & 0xffff;
        const u32 s = t < 2 ? sc01 & 15 : (sc01 >> 8) & 15;  // words 0-3: first half, 4-7: second
        *(int2*)(dst + 32 * j) = make_int2((int)(((r.q0 >> (2 * j)) & 0x03030303u) * s),
                                           (int)(((r.q1 >> (2 * j)) & 0x03030303u) * s));
    }
    const u32 sc01 = ((t < 2 ? r.sl : r.sh) >> (16 * (t % 2))) & 0xffff;
    sm.wsc[w][row][t] =
        (sc01 & 15) | (((sc01 >> 8) & 15) << 8) | (((sc01 >> 4) & 15) << 16) | ((sc01 >> 12) << 24);
    set_wf(sm.wf[w][row][t], f16_to_f32((u16)(r.dd & 0xffff)), f16_to_f32((u16)(r.dd >> 16)));
}

// Q4_K: loaded and unpacked at stage time (no prefetch): its raw chunk is as large as the unpacked
// one, and holding it across the tiles would spill the gate/up tile on gfx11.
template <>
struct WRaw<DS4_T_Q4_K> {
    const u8* wrow;
    u32 c;
    bool live;
};
DS4_DEV void wraw_fetch(WRaw<DS4_T_Q4_K>& r, const u8* wrow, u32 c0, u32 t, bool live) {
    r.wrow = wrow;
    r.c = c0 + t;
    r.live = live;
}
template <int NW>
DS4_DEV void wraw_stage(const WRaw<DS4_T_Q4_K>& r, MmaQuantSmem<NW>& sm, int w, u32 row, u32 t, const u64*, const u64*) {
    WChunk wc;
    if (r.live) {
        unpack_chunk<DS4_T_Q4_K>(r.wrow, r.c, wc, nullptr);
    } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) wc.q[i] = 0;
        wc.sc = 0;
        wc.d = wc.dmin = 0.0f;
    }
    int4* dst = (int4*)((i8*)sm.ws[w] + row * DS4_MQ_LD + 32 * t);
    dst[0] = make_int4(wc.q[0], wc.q[1], wc.q[2], wc.q[3]);
    dst[1] = make_int4(wc.q[4], wc.q[5], wc.q[6], wc.q[7]);
    sm.wsc[w][row][t] = wc.sc;
    set_wf(sm.wf[w][row][t], wc.d, wc.dmin);
}

// A thread's activation chunk of a stage: column tid / 4, chunk c0 + tid % 4 (128 contiguous bytes
// per column and stage).
struct XRaw {
    int4 q[2];
    float d;
    int b0, b1;
};

// Stages the IQ2_XXS grid and the ksigns masks (entry s: byte i is 0xff where bit i of s with its
// parity bit 7 is set); call from every thread, then __syncthreads().
DS4_DEV void stage_iq2_tables(u64* sgrid, u64* ssigns) {
    stage_iq2_grid(sgrid);
    for (u32 s = threadIdx.x; s < 128; s += blockDim.x) {
        const u32 f = s | ((__popc(s) & 1) << 7);
        ssigns[s] = (u64)sign_mask4(f & 15) | ((u64)sign_mask4(f >> 4) << 32);
    }
}

// acc + m0 * bs0 + m1 * bs1: the mins bytes of a WChunk::sc against an activation chunk's 16-element
// sums (an i16 pair); one dp2a on NVIDIA.
DS4_DEV int mins_dot(u32 sc, u32 bs01, int acc) {
#if defined(DS4_NVIDIA)
    return __dp2a_lo((int)bs01, (int)(sc >> 16), acc);
#else
    return acc + (int)((sc >> 16) & 0xff) * (int)(i16)(bs01 & 0xffff) + (int)(sc >> 24) * (int)(i16)(bs01 >> 16);
#endif
}

// The tile body: like gemm_tile (same arguments and store), on int8 matrix tiles. `grid` and
// `signs` are the staged IQ2_XXS tables (or null).
template <int T, bool AK, int NW, class Store>
DS4_DEV void mma_quant_tile(MmaQuantSmem<NW>& sm, const u8* const (&wbase)[NW], u64 rb, u32 r0, u32 n_rows,
                            u32 n_in, const i8* xq, const float* xd, const i16* xbs, u32 x_stride, u32 xg_off,
                            const u64* grid, const u64* signs, Store&& store) {
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

    // Loader roles: weight row / activation column tid / 4, chunk-in-stage tid % 4.
    const u32 lrow = tid / DS4_MQ_CH, lt = tid % DS4_MQ_CH;
    const bool row_live = r0 + lrow < n_rows, col_live = lrow < n_cols;
    const u64 ar = col_live ? sm.cols.act_row[lrow] : 0;
    const i8* xrow = xq + ar * x_stride + xg_off;
    const float* xdrow = xd + ar * (x_stride / (AK ? 256 : 32)) + xg_off / (AK ? 256 : 32);
    const i16* xbrow = xbs ? xbs + ar * (x_stride / 16) + xg_off / 16 : nullptr;
    WRaw<T> wr[NW];
    XRaw xr;
    auto fetch = [&](u32 c0) {
        const bool live = c0 + lt < nc;
#pragma unroll
        for (int w = 0; w < NW; ++w) wraw_fetch(wr[w], wbase[w] + (u64)(r0 + lrow) * rb, c0, lt, live && row_live);
        int q[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        xr.d = 0.0f;
        xr.b0 = xr.b1 = 0;
        if (live && col_live) load_act_any<AK>(xrow, xdrow, xbrow, c0 + lt, q, xr.d, xr.b0, xr.b1);
        xr.q[0] = make_int4(q[0], q[1], q[2], q[3]);
        xr.q[1] = make_int4(q[4], q[5], q[6], q[7]);
    };
    fetch(0);
    for (u32 c0 = 0; c0 < nc; c0 += DS4_MQ_CH) {
#pragma unroll
        for (int w = 0; w < NW; ++w) wraw_stage(wr[w], sm, w, lrow, lt, grid, signs);
        int4* xdst = (int4*)(xs + lrow * DS4_MQ_LD + 32 * lt);
        xdst[0] = xr.q[0];
        xdst[1] = xr.q[1];
        sm.xf[lrow][lt] = xr.d;
        sm.xb[lrow][lt] = (u32)(xr.b0 & 0xffff) | (u32)xr.b1 << 16;
        __syncthreads();
        if (c0 + DS4_MQ_CH < nc) fetch(c0 + DS4_MQ_CH);
#pragma unroll
        for (u32 b = 0; b < DS4_MQ_CH; ++b) {
            const bool unit_end = (c0 + b) % UNIT == UNIT - 1;  // uniform
            // The chunk's weight fragments and the lane's row scales, once for both column tiles.
            MmaFragI8 a[NW];
            u32 sc[NW][8];
#pragma unroll
            for (int w = 0; w < NW; ++w) {
                mma_load(a[w], (const i8*)sm.ws[w] + rg * DS4_MQ_LD + 32 * b, DS4_MQ_LD);
#pragma unroll
                for (int e = 0; e < 8; ++e) sc[w][e] = sm.wsc[w][rg + mma_row(e)][b];
            }
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const u32 cj = cg + 16 * j;
                if (cj >= n_cols) continue;  // uniform per MMA group
                MmaFragI8 bf;
                mma_load(bf, xs + cj * DS4_MQ_LD + 32 * b, DS4_MQ_LD);
#pragma unroll
                for (int w = 0; w < NW; ++w) {
                    MmaAccI s;
                    mma_zero(s);
                    mma_i8(s, a[w], bf);
#pragma unroll
                    for (int e = 0; e < 8; ++e) {
                        const u32 row = rg + mma_row(e), col = cj + mma_col(e);
                        // Q2_K: scales folded into the codes; Q8_0: scale 1.
                        isum[w][j][e] += FOLD || T == DS4_T_Q8_0 ? s.v[e] : (int)(sc[w][e] & 0xff) * s.v[e];
                        if constexpr (MINS) {
                            summs[w][j][e] = mins_dot(sc[w][e], sm.xb[col][b], summs[w][j][e]);
                        }
                        if (unit_end) {
                            const float2 f = sm.wf[w][row][b];
                            acc[w][j][e] = acc[w][j][e] + unit_term<T>(isum[w][j][e], summs[w][j][e], f.x, f.y,
                                                                       sm.xf[col][b]);
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
    ds4_grid_sync();
    __shared__ MmaQuantSmem<2> sm;
    load_token_cols(sm.cols, blockIdx.y * DS4_MQ_COLS, n_tok);
    const u8* wb[2] = {wg, wu};
    mma_quant_tile<DS4_T_Q8_0, false, 2>(
        sm, wb, (u64)(n_in / 32) * 34, blockIdx.x * DS4_MQ_ROWS, n_ff, n_in, xq, xd, nullptr, n_in, 0, nullptr, nullptr,
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
    if constexpr (T == DS4_T_IQ2_XXS) stage_iq2_tables(sgrid, sgrid + 256);
    const u32 e = load_expert_tile(sm.cols, pairs, tiles, tile, n_used, act_is_pair);
    const u64 rb = row_bytes<T>(n_in);
    const u8* wb[NW];
#pragma unroll
    for (int i = 0; i < NW; ++i) wb[i] = w[i] + (u64)e * n_rows * rb;
    mma_quant_tile<T, true, NW>(sm, wb, rb, r0, n_rows, n_in, xq, xd, xbs, n_in, 0, sgrid, sgrid + 256, store);
}

template <int T>
DS4_DEV void moe_gemm_gate_up_mma_body(float* mid, const u8* gate, const u8* up, const i8* xq, const float* xd,
                                       const i16* xbs, const u32* pairs, const u32* tiles, const u32* n_tiles,
                                       const float* selw, u32 n_in, u32 n_ff, u32 n_used, float limit) {
    __shared__ MmaQuantSmem<2> sm;
    __shared__ u64 sgrid[256 + 128];  // IQ2_XXS grid, ksigns masks
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
    __shared__ u64 sgrid[256 + 128];  // IQ2_XXS grid, ksigns masks
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
    ds4_grid_sync();
    moe_gemm_gate_up_mma_body<DS4_T_IQ2_XXS>(mid, gate, up, xq, xd, xbs, pairs, tiles, n_tiles, selw, n_in, n_ff, n_used, limit);
}
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_moe_gemm_down_iq2_xxs_mma(
    float* outp, const u8* down, const i8* mq, const float* md, const i16* mbs, const u32* pairs, const u32* tiles,
    const u32* n_tiles, u32 n_ff, u32 n_out, u32 n_used) {
    ds4_grid_sync();
    moe_gemm_down_mma_body<DS4_T_IQ2_XXS>(outp, down, mq, md, mbs, pairs, tiles, n_tiles, n_ff, n_out, n_used);
}
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_moe_gemm_gate_up_q2_k_mma(
    float* mid, const u8* gate, const u8* up, const i8* xq, const float* xd, const i16* xbs, const u32* pairs,
    const u32* tiles, const u32* n_tiles, const float* selw, u32 n_in, u32 n_ff, u32 n_used, float limit) {
    ds4_grid_sync();
    moe_gemm_gate_up_mma_body<DS4_T_Q2_K>(mid, gate, up, xq, xd, xbs, pairs, tiles, n_tiles, selw, n_in, n_ff, n_used, limit);
}
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_moe_gemm_down_q2_k_mma(
    float* outp, const u8* down, const i8* mq, const float* md, const i16* mbs, const u32* pairs, const u32* tiles,
    const u32* n_tiles, u32 n_ff, u32 n_out, u32 n_used) {
    ds4_grid_sync();
    moe_gemm_down_mma_body<DS4_T_Q2_K>(outp, down, mq, md, mbs, pairs, tiles, n_tiles, n_ff, n_out, n_used);
}
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_moe_gemm_gate_up_q4_k_mma(
    float* mid, const u8* gate, const u8* up, const i8* xq, const float* xd, const i16* xbs, const u32* pairs,
    const u32* tiles, const u32* n_tiles, const float* selw, u32 n_in, u32 n_ff, u32 n_used, float limit) {
    ds4_grid_sync();
    moe_gemm_gate_up_mma_body<DS4_T_Q4_K>(mid, gate, up, xq, xd, xbs, pairs, tiles, n_tiles, selw, n_in, n_ff, n_used, limit);
}
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_moe_gemm_down_q4_k_mma(
    float* outp, const u8* down, const i8* mq, const float* md, const i16* mbs, const u32* pairs, const u32* tiles,
    const u32* n_tiles, u32 n_ff, u32 n_out, u32 n_used) {
    ds4_grid_sync();
    moe_gemm_down_mma_body<DS4_T_Q4_K>(outp, down, mq, md, mbs, pairs, tiles, n_tiles, n_ff, n_out, n_used);
}
