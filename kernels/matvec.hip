// Matrix-vector products for decode and small batches (spec §2.3, §2.4): one warp per output row,
// each lane handling 32-element chunks, warp-sum at the end. Weight rows are read once per token,
// 16-byte loads where the format's alignment allows (F16, Q4_K, activations) and 2/4-byte loads
// for the 34-byte Q8_0 blocks.
#pragma once
#include "formats.h"

#define DS4_MV_ROWS 8  // output rows per block of every matvec kernel (independent of wave size)

// y[t][r] = W[r] · x_t  for Q8_0 weights and Q8_0-quantized activations (spec §2.3).
// W: Q8_0 rows of n_in elements, n_out rows. Grouped projection (spec §3.4 step 12): row r reads
// activation slice (r / rows_per_group) * n_in of the token's activation row; pass
// rows_per_group = n_out for a plain matvec. x_stride = elements per token in xq (n_in for plain,
// n_groups * n_in for grouped); xd has x_stride / 32 scales per token.
// Launch: grid (ceil(n_out / 8), n_tok), block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_matvec_q8_0(float* y, const u8* w, const i8* xq,
                                                                  const float* xd, u32 n_in, u32 n_out,
                                                                  u32 rows_per_group, u32 x_stride) {
    const u32 t = blockIdx.y;
    const u64 rb = (u64)(n_in / 32) * 34;
    for (u32 r = blockIdx.x * DS4_MV_ROWS + warp_id(); r < min((blockIdx.x + 1) * DS4_MV_ROWS, n_out);
         r += DS4_WARPS_PER_BLOCK) {
        const u32 g = r / rows_per_group;
        const i8* xr = xq + (u64)t * x_stride + (u64)g * n_in;
        const float* dr = xd + (u64)t * (x_stride / 32) + (u64)g * (n_in / 32);
        const float s = warp_dot_row_q8_0(w + r * rb, xr, dr, n_in);
        if (lane_id() == 0) y[(u64)t * n_out + r] = s;
    }
}

// Shared-expert gate/up with SwiGLU (spec §3.9 step 6): mid[t][r] = swiglu(Wg[r]·x, Wu[r]·x) with
// the clamp `limit`, both products sharing one Q8_0 activation (xq/xd, n_in per token).
// Launch: grid (ceil(n_ff / 8), n_tok), block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_matvec_q8_0_swiglu(float* mid, const u8* wg, const u8* wu,
                                                                         const i8* xq, const float* xd, u32 n_in,
                                                                         u32 n_ff, float limit) {
    const u32 t = blockIdx.y;
    const u64 rb = (u64)(n_in / 32) * 34;
    const i8* xr = xq + (u64)t * n_in;
    const float* dr = xd + (u64)t * (n_in / 32);
    for (u32 r = blockIdx.x * DS4_MV_ROWS + warp_id(); r < min((blockIdx.x + 1) * DS4_MV_ROWS, n_ff);
         r += DS4_WARPS_PER_BLOCK) {
        const float g = warp_dot_row_q8_0(wg + r * rb, xr, dr, n_in);
        const float u = warp_dot_row_q8_0(wu + r * rb, xr, dr, n_in);
        if (lane_id() == 0) mid[(u64)t * n_ff + r] = swiglu_clamped(g, u, limit);
    }
}

// One warp: F16 row (n elements, n % 8 == 0, row 16-byte aligned) · f32 vector.
DS4_DEV float warp_dot_row_f16(const u16* wrow, const float* x, u32 n) {
    float acc = 0.0f;
    for (u32 c = lane_id(); c < n / 8; c += DS4_WARP) {
        const uint4 wv = ((const uint4*)wrow)[c];
        const float4 x0 = ((const float4*)x)[2 * c], x1 = ((const float4*)x)[2 * c + 1];
        acc += f16_to_f32((u16)(wv.x & 0xffff)) * x0.x + f16_to_f32((u16)(wv.x >> 16)) * x0.y +
               f16_to_f32((u16)(wv.y & 0xffff)) * x0.z + f16_to_f32((u16)(wv.y >> 16)) * x0.w +
               f16_to_f32((u16)(wv.z & 0xffff)) * x1.x + f16_to_f32((u16)(wv.z >> 16)) * x1.y +
               f16_to_f32((u16)(wv.w & 0xffff)) * x1.z + f16_to_f32((u16)(wv.w >> 16)) * x1.w;
    }
    return warp_sum(acc);
}

// y[t][r] = W[r] · x_t for F16 weights and f32 activations (spec §2.3 "F16 weight"), n_in % 8 == 0.
// x: [n_tok][x_stride] (x_stride % 4 == 0). Used for the router, compressor, indexer projections.
// Launch: grid (ceil(n_out / 8), n_tok), block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_matvec_f16(float* y, const u16* w, const float* x, u32 n_in,
                                                                 u32 n_out, u32 x_stride) {
    const u32 t = blockIdx.y;
    const float* xr = x + (u64)t * x_stride;
    for (u32 r = blockIdx.x * DS4_MV_ROWS + warp_id(); r < min((blockIdx.x + 1) * DS4_MV_ROWS, n_out);
         r += DS4_WARPS_PER_BLOCK) {
        const float s = warp_dot_row_f16(w + (u64)r * n_in, xr, n_in);
        if (lane_id() == 0) y[(u64)t * n_out + r] = s;
    }
}

// Two F16 matvecs of the same shape over one input (the compressor's kv and gate projections,
// spec §3.7): y0 = W0·x, y1 = W1·x. Rows [0, n_out) go to W0/y0, rows [n_out, 2 n_out) to W1/y1.
// Launch: grid (ceil(2 * n_out / 8), n_tok), block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_matvec_f16_pair(float* y0, float* y1, const u16* w0,
                                                                      const u16* w1, const float* x, u32 n_in,
                                                                      u32 n_out, u32 x_stride) {
    const u32 t = blockIdx.y;
    const float* xr = x + (u64)t * x_stride;
    for (u32 r = blockIdx.x * DS4_MV_ROWS + warp_id(); r < min((blockIdx.x + 1) * DS4_MV_ROWS, 2 * n_out);
         r += DS4_WARPS_PER_BLOCK) {
        const bool second = r >= n_out;
        const u32 rr = second ? r - n_out : r;
        const float s = warp_dot_row_f16((second ? w1 : w0) + (u64)rr * n_in, xr, n_in);
        if (lane_id() == 0) (second ? y1 : y0)[(u64)t * n_out + rr] = s;
    }
}
