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
#include "mma.h"

#define DS4_MM_ROWS 64    // weight rows per block
#define DS4_MM_TOKS 128   // tokens per block
#define DS4_MM_QB 4       // Q8_0 blocks (32 k each) per stage
#define DS4_MM_LDQ (32 * DS4_MM_QB + 16)  // staged int8 row stride in bytes (16-byte aligned, padded)
#define DS4_MM_KH 32      // f16 k per stage
#define DS4_MM_LDH (DS4_MM_KH + 8)  // staged f16 row stride in halves (80 bytes)

// Dense Q8_0 GEMM on int8 tiles: y[t][r] = sum over blocks b of (i32 sum of the block's 32 code
// products) * d_w[r][b] * d_x[t][b], the Q8_0 dot of the model; the i32 block sums are exact, the
// blocks are added in order with one fused multiply-add each. Grouped projections as in ds4_gemm_q8_0
// (rows_per_group a multiple of 64). Launch: grid (ceil(n_out / 64), ceil(n_tok / 128)), block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_gemm_q8_0_mma(float* y, const u8* w, const i8* xq,
                                                                    const float* xd, u32 n_in, u32 n_out,
                                                                    u32 rows_per_group, u32 x_stride, u32 n_tok) {
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
        const u16* p = (const u16*)(w + (u64)(r0 + w_row) * rb + (u64)c * 34);
        st.wd = wl ? f16_to_f32(p[0]) : 0.0f;
#pragma unroll
        for (int i = 0; i < 8; ++i) st.wq[i] = wl ? (u32)p[1 + 2 * i] | ((u32)p[2 + 2 * i] << 16) : 0u;
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
    const u32 w_row = tid / 4, w_k = 8 * (tid % 4), x_tok = tid / 2, x_k = 16 * (tid % 2);
    struct Stage {
        u16 w[8];
        float x[16];
    };
    auto load = [&](u32 k0, Stage& st) {
        const u32 gr = r0 + w_row, t = t0 + x_tok;
#pragma unroll
        for (u32 i = 0; i < 8; ++i) {
            const u32 k = k0 + w_k + i;
            st.w[i] = (gr < n_out && k < n_in) ? w[(u64)gr * n_in + k] : (u16)0;
        }
#pragma unroll
        for (u32 i = 0; i < 16; ++i) {
            const u32 k = k0 + x_k + i;
            st.x[i] = (t < n_tok && k < n_in) ? x[(u64)t * x_stride + k] : 0.0f;
        }
    };
    Stage st;
    load(0, st);
    for (u32 k0 = 0; k0 < n_in; k0 += DS4_MM_KH) {
#pragma unroll
        for (u32 i = 0; i < 8; ++i) ws[w_row * DS4_MM_LDH + w_k + i] = st.w[i];
#pragma unroll
        for (u32 i = 0; i < 16; ++i) {
            const u16 hi = f32_to_f16_bits(st.x[i]);
            xh[x_tok * DS4_MM_LDH + x_k + i] = hi;
            xl[x_tok * DS4_MM_LDH + x_k + i] = f32_to_f16_bits(st.x[i] - f16_to_f32(hi));
        }
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
