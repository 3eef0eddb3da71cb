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
