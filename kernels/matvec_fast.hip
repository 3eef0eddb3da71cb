// Matrix-vector products for decode, fast arithmetic (docs/arithmetic.md): free summation order and
// FMA, built to keep bytes in flight. A Q8_0 row is cut into chunks of 8 blocks (256 elements,
// 272 bytes, 16-byte aligned when n_in % 256 == 0); a lane loads a whole chunk with 17 16-byte
// loads, takes its 8 blocks apart in registers and dots them with dot4; the G lanes of a row
// (G = min(32, the power of two >= the row's chunk count)) fold their sums as a butterfly.
// Deterministic: the same inputs give the same bits on every run.
#pragma once
#include "formats.h"

#define DS4_Q8_0_CHUNK 256   // elements per lane chunk (8 Q8_0 blocks)
#define DS4_Q8_0_CHUNK_B 272 // bytes per lane chunk

// The 32-bit little-endian word at an even byte offset of registers holding consecutive bytes.
DS4_DEV u32 reg_word(const u32* w, u32 byte) {
    const u32 i = byte / 4;
    return byte % 4 == 0 ? w[i] : (w[i] >> 16) | (w[i + 1] << 16);
}
DS4_DEV u16 reg_half(const u32* w, u32 byte) {
    const u32 i = byte / 4;
    return byte % 4 == 0 ? (u16)(w[i] & 0xffff) : (u16)(w[i] >> 16);
}

// W_chunk · x_chunk for one 272-byte chunk of Q8_0 weights (16-byte aligned) and its activation
// codes (256 bytes, 16-byte aligned) and scales (8 floats, 16-byte aligned).
DS4_DEV float q8_0_chunk_dot(const u8* wc, const i8* xc, const float* dc, float acc) {
    u32 w[DS4_Q8_0_CHUNK_B / 4];
#pragma unroll
    for (int i = 0; i < DS4_Q8_0_CHUNK_B / 16; ++i) {
        const uint4 v = ((const uint4*)wc)[i];
        w[4 * i] = v.x;
        w[4 * i + 1] = v.y;
        w[4 * i + 2] = v.z;
        w[4 * i + 3] = v.w;
    }
    const float4 d0 = ((const float4*)dc)[0], d1 = ((const float4*)dc)[1];
    const float ds[8] = {d0.x, d0.y, d0.z, d0.w, d1.x, d1.y, d1.z, d1.w};
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        const uint4 xa = ((const uint4*)xc)[2 * k], xb = ((const uint4*)xc)[2 * k + 1];
        const int xs[8] = {(int)xa.x, (int)xa.y, (int)xa.z, (int)xa.w, (int)xb.x, (int)xb.y, (int)xb.z, (int)xb.w};
        int is = 0;
#pragma unroll
        for (int j = 0; j < 8; ++j) is = dot4_i8((int)reg_word(w, 34 * k + 2 + 4 * j), xs[j], is);
        acc = fmaf(f16_to_f32(reg_half(w, 34 * k)) * ds[k], (float)is, acc);
    }
    return acc;
}

// Lanes per row for a row of n_chunks chunks (a power of two, at most 32).
DS4_DEV u32 q8_0_fast_lanes(u32 n_chunks) {
    u32 g = 1;
    while (g < n_chunks && g < 32) g *= 2;
    return g;
}

// Sum over the G aligned lanes of a row group (G a power of two <= 32); every lane gets the sum.
DS4_DEV float group_sum(float v, u32 g) {
    for (u32 o = g / 2; o > 0; o /= 2) v += __shfl_xor(v, o, DS4_WARP);
    return v;
}

// ds4_matvec_q8_0's product and arguments (grouped rows included) in the fast order; n_in % 256 == 0.
// Launch: grid (ceil(n_out / (256 / G)), n_tok), block 256, G = q8_0_fast_lanes(n_in / 256).
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_matvec_q8_0_fast(float* y, const u8* w, const i8* xq,
                                                                       const float* xd, u32 n_in, u32 n_out,
                                                                       u32 rows_per_group, u32 x_stride) {
    const u32 t = blockIdx.y, nc = n_in / DS4_Q8_0_CHUNK, g = q8_0_fast_lanes(nc);
    const u32 r = blockIdx.x * (DS4_BLOCK / g) + threadIdx.x / g, sub = threadIdx.x % g;
    const bool live = r < n_out;
    float acc = 0.0f;
    if (live) {
        const u32 grp = r / rows_per_group;
        const i8* xr = xq + (u64)t * x_stride + (u64)grp * n_in;
        const float* dr = xd + (u64)t * (x_stride / 32) + (u64)grp * (n_in / 32);
        const u8* wr = w + (u64)r * nc * DS4_Q8_0_CHUNK_B;
        for (u32 c = sub; c < nc; c += g)
            acc = q8_0_chunk_dot(wr + (u64)c * DS4_Q8_0_CHUNK_B, xr + c * DS4_Q8_0_CHUNK, dr + c * 8, acc);
    }
    acc = group_sum(acc, g);
    if (live && sub == 0) y[(u64)t * n_out + r] = acc;
}

// ds4_matvec_q8_0_swiglu in the fast order: mid[t][r] = swiglu(Wg[r]·x, Wu[r]·x); n_in % 256 == 0.
// Launch: grid (ceil(n_ff / (256 / G)), n_tok), block 256, G = q8_0_fast_lanes(n_in / 256).
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_matvec_q8_0_swiglu_fast(float* mid, const u8* wg,
                                                                              const u8* wu, const i8* xq,
                                                                              const float* xd, u32 n_in, u32 n_ff,
                                                                              float limit) {
    const u32 t = blockIdx.y, nc = n_in / DS4_Q8_0_CHUNK, g = q8_0_fast_lanes(nc);
    const u32 r = blockIdx.x * (DS4_BLOCK / g) + threadIdx.x / g, sub = threadIdx.x % g;
    const bool live = r < n_ff;
    float ga = 0.0f, ua = 0.0f;
    if (live) {
        const i8* xr = xq + (u64)t * n_in;
        const float* dr = xd + (u64)t * (n_in / 32);
        const u64 off = (u64)r * nc * DS4_Q8_0_CHUNK_B;
        for (u32 c = sub; c < nc; c += g) {
            const u64 o = off + (u64)c * DS4_Q8_0_CHUNK_B;
            ga = q8_0_chunk_dot(wg + o, xr + c * DS4_Q8_0_CHUNK, dr + c * 8, ga);
            ua = q8_0_chunk_dot(wu + o, xr + c * DS4_Q8_0_CHUNK, dr + c * 8, ua);
        }
    }
    ga = group_sum(ga, g);
    ua = group_sum(ua, g);
    if (live && sub == 0) mid[(u64)t * n_ff + r] = swiglu_clamped(ga, ua, limit);
}

// F16 rows in the fast order: a lane takes 8 halves (16 bytes) per step and FMAs them into its sum.
// Lanes per row for n_in elements: min(32, the power of two >= n_in / 8) (f16_fast_lanes).
DS4_DEV float f16_row_part(const u16* wr, const float* x, u32 n_in, u32 sub, u32 g) {
    float acc = 0.0f;
    for (u32 c = sub; c < n_in / 8; c += g) {
        const uint4 v = ((const uint4*)wr)[c];
        const float4 xa = ((const float4*)x)[2 * c], xb = ((const float4*)x)[2 * c + 1];
        acc = fmaf(f16_to_f32((u16)(v.x & 0xffff)), xa.x, acc);
        acc = fmaf(f16_to_f32((u16)(v.x >> 16)), xa.y, acc);
        acc = fmaf(f16_to_f32((u16)(v.y & 0xffff)), xa.z, acc);
        acc = fmaf(f16_to_f32((u16)(v.y >> 16)), xa.w, acc);
        acc = fmaf(f16_to_f32((u16)(v.z & 0xffff)), xb.x, acc);
        acc = fmaf(f16_to_f32((u16)(v.z >> 16)), xb.y, acc);
        acc = fmaf(f16_to_f32((u16)(v.w & 0xffff)), xb.z, acc);
        acc = fmaf(f16_to_f32((u16)(v.w >> 16)), xb.w, acc);
    }
    return acc;
}

// ds4_matvec_f16's product and arguments in the fast order (same preconditions: n_in % 8 == 0, rows
// and x 16-byte aligned). Launch: grid (ceil(n_out / (256 / G)), n_tok), block 256,
// G = q8_0_fast_lanes(n_in / 8).
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_matvec_f16_fast(float* y, const u16* w, const float* x,
                                                                      u32 n_in, u32 n_out, u32 x_stride) {
    const u32 t = blockIdx.y, g = q8_0_fast_lanes(n_in / 8);
    const u32 r = blockIdx.x * (DS4_BLOCK / g) + threadIdx.x / g, sub = threadIdx.x % g;
    const bool live = r < n_out;
    const float acc = group_sum(live ? f16_row_part(w + (u64)r * n_in, x + (u64)t * x_stride, n_in, sub, g) : 0.0f, g);
    if (live && sub == 0) y[(u64)t * n_out + r] = acc;
}

// ds4_matvec_f16_pair in the fast order: rows [0, n_out) of W0 to y0, rows [n_out, 2 n_out) of W1 to y1.
// Launch: grid (ceil(2 n_out / (256 / G)), n_tok), block 256, G = q8_0_fast_lanes(n_in / 8).
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_matvec_f16_pair_fast(float* y0, float* y1, const u16* w0,
                                                                           const u16* w1, const float* x, u32 n_in,
                                                                           u32 n_out, u32 x_stride) {
    const u32 t = blockIdx.y, g = q8_0_fast_lanes(n_in / 8);
    const u32 r = blockIdx.x * (DS4_BLOCK / g) + threadIdx.x / g, sub = threadIdx.x % g;
    const bool live = r < 2 * n_out, second = r >= n_out;
    const u32 rr = second ? r - n_out : r;
    const u16* wr = (second ? w1 : w0) + (u64)rr * n_in;
    const float acc = group_sum(live ? f16_row_part(wr, x + (u64)t * x_stride, n_in, sub, g) : 0.0f, g);
    if (live && sub == 0) (second ? y1 : y0)[(u64)t * n_out + rr] = acc;
}
