// Matrix-vector products for decode and small batches (docs/arithmetic.md#dot-products), bitwise equal
// to the CPU reference's row dots (src/backend/cpu/quant.rs; formats.h "arithmetic of the CPU reference dots").
// Q8_0: one warp per output row, lane groups of 8 per block, the block terms added in block order.
// F16: the 8 rows of a block computed together, one sequential add chain per row (block_dots_f16_seq).
#pragma once
#include "formats.h"

#define DS4_MV_ROWS 8  // output rows per block of every matvec kernel (independent of wave size)

// y[t][r] = W[r] · x_t  for Q8_0 weights and Q8_0-quantized activations (docs/arithmetic.md#dot-products).
// W: Q8_0 rows of n_in elements, n_out rows. Grouped projection (docs/model.md#grouped-output-projection): row
// r reads activation slice (r / rows_per_group) * n_in of the token's activation row; pass
// rows_per_group = n_out for a plain matvec. x_stride = elements per token in xq (n_in for plain,
// n_groups * n_in for grouped); xd has x_stride / 32 scales per token.
// Launch: grid (ceil(n_out / 8), n_tok), block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_matvec_q8_0(float* y, const u8* w, const i8* xq,
                                                                  const float* xd, u32 n_in, u32 n_out,
                                                                  u32 rows_per_group, u32 x_stride) {
    ds4_grid_sync();
    DS4_CHAIN_SHARED(chain);
    const u32 t = blockIdx.y;
    const u64 rb = (u64)(n_in / 32) * 34;
    for (u32 r = blockIdx.x * DS4_MV_ROWS + warp_id(); r < min((blockIdx.x + 1) * DS4_MV_ROWS, n_out);
         r += DS4_WARPS_PER_BLOCK) {
        const u32 g = r / rows_per_group;
        const i8* xr = xq + (u64)t * x_stride + (u64)g * n_in;
        const float* dr = xd + (u64)t * (x_stride / 32) + (u64)g * (n_in / 32);
        const u8* wr[1] = {w + r * rb};
        float s[1];
        warp_dot_rows_q8_0<1>(wr, xr, dr, n_in, (float*)chain[warp_id()], s);
        if (lane_id() == 0) y[(u64)t * n_out + r] = s[0];
    }
}

// Shared-expert gate/up with SwiGLU (docs/model.md#shared-expert): mid[t][r] = swiglu(Wg[r]·x, Wu[r]·x) with
// the clamp `limit`, both products sharing one Q8_0 activation (xq/xd, n_in per token).
// Launch: grid (ceil(n_ff / 8), n_tok), block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_matvec_q8_0_swiglu(float* mid, const u8* wg, const u8* wu,
                                                                         const i8* xq, const float* xd, u32 n_in,
                                                                         u32 n_ff, float limit) {
    ds4_grid_sync();
    DS4_CHAIN_SHARED(chain);
    const u32 t = blockIdx.y;
    const u64 rb = (u64)(n_in / 32) * 34;
    const i8* xr = xq + (u64)t * n_in;
    const float* dr = xd + (u64)t * (n_in / 32);
    for (u32 r = blockIdx.x * DS4_MV_ROWS + warp_id(); r < min((blockIdx.x + 1) * DS4_MV_ROWS, n_ff);
         r += DS4_WARPS_PER_BLOCK) {
        const u8* wr[2] = {wg + r * rb, wu + r * rb};
        float gu[2];
        warp_dot_rows_q8_0<2>(wr, xr, dr, n_in, (float*)chain[warp_id()], gu);
        if (lane_id() == 0) mid[(u64)t * n_ff + r] = swiglu_clamped(gu[0], gu[1], limit);
    }
}

// y[t][r] = W[r] · x_t for F16 weights and f32 activations (docs/arithmetic.md#dot-products), n_in % 8 == 0,
// rows and x 16-byte aligned. x: [n_tok][x_stride] (x_stride % 4 == 0). Used for the router,
// compressor, indexer projections. The block's 8 rows run 8 sequential chains side by side.
// Launch: grid (ceil(n_out / 8), n_tok), block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_matvec_f16(float* y, const u16* w, const float* x, u32 n_in,
                                                                 u32 n_out, u32 x_stride) {
    ds4_grid_sync();
    __shared__ float4 smem4[DS4_F16_SEQ_SMEM / 4];  // float4: the chain reads 16-byte words
    float* smem = (float*)smem4;
    const u32 t = blockIdx.y, r0 = blockIdx.x * DS4_MV_ROWS;
    const u32 live = min(DS4_MV_ROWS, n_out - r0);
    block_dots_f16_seq<DS4_MV_ROWS>([&](u32 r) { return w + (u64)(r0 + r) * n_in; }, live,
                                    x + (u64)t * x_stride, 1.0f, n_in, smem);
    if (threadIdx.x < live) y[(u64)t * n_out + r0 + threadIdx.x] = smem[2 * (DS4_F16_SEQ_STAGE + 32) + threadIdx.x];
}

// Two F16 matvecs of the same shape over one input (the compressor's kv and gate projections,
// docs/model.md#compressor): y0 = W0·x, y1 = W1·x. Rows [0, n_out) go to W0/y0, rows [n_out, 2 n_out) to W1/y1.
// Launch: grid (ceil(2 * n_out / 8), n_tok), block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_matvec_f16_pair(float* y0, float* y1, const u16* w0,
                                                                      const u16* w1, const float* x, u32 n_in,
                                                                      u32 n_out, u32 x_stride) {
    ds4_grid_sync();
    __shared__ float4 smem4[DS4_F16_SEQ_SMEM / 4];  // float4: the chain reads 16-byte words
    float* smem = (float*)smem4;
    const u32 t = blockIdx.y, r0 = blockIdx.x * DS4_MV_ROWS;
    const u32 live = min(DS4_MV_ROWS, 2 * n_out - r0);
    block_dots_f16_seq<DS4_MV_ROWS>(
        [&](u32 r) {
            const u32 rr = r0 + r;
            return rr >= n_out ? w1 + (u64)(rr - n_out) * n_in : w0 + (u64)rr * n_in;
        },
        live, x + (u64)t * x_stride, 1.0f, n_in, smem);
    if (threadIdx.x < live) {
        const u32 rr = r0 + threadIdx.x;
        const float s = smem[2 * (DS4_F16_SEQ_STAGE + 32) + threadIdx.x];
        if (rr >= n_out) y1[(u64)t * n_out + rr - n_out] = s;
        else y0[(u64)t * n_out + rr] = s;
    }
}

#if defined(DS4_EMU)
// Emulator-only test entry (not in the GPU code objects; tests/hip_kernels/emulator.rs): y[b] =
// block_dot_f16_seq(row b of w, x, x_scale, n), written by the block's last thread (every thread
// holds the sum). Launch: grid (n_rows), block 256. Not extern "C": it is no kernel of the module
// (kernels.rs ALL_KERNELS lists those); the emulator registers it by its C++ name.
__global__ void ds4_emutest_block_dot_f16_seq(float* y, const u16* w, const float* x, float x_scale,
                                                         u32 n) {
    __shared__ float4 smem4[DS4_F16_SEQ_SMEM / 4];  // float4: the chain reads 16-byte words
    float* smem = (float*)smem4;
    const float s = block_dot_f16_seq(w + (u64)blockIdx.x * n, x, x_scale, n, smem);
    if (threadIdx.x == DS4_BLOCK - 1) y[blockIdx.x] = s;
}
#endif
