// Column matvecs (docs/arithmetic.md#dot-products): the matvecs of matvec.hip for a block of 2..DS4_COLS
// tokens ("columns": a speculative verify block) in one grid row, each weight read once for all of
// them instead of once per token (matvec.hip's kernels read the matrix once per grid row, i.e. per
// token). Each column's result has the bits of the matvec.hip kernel for that token alone
// (formats.h warp_dot_rows_q8_0_cols, block_dots_f16_seq_cols: the same terms in the same order per
// column). Same arguments as that kernel, plus n_tok (<= DS4_COLS); the tokens' activation rows and
// outputs are laid out as there.
#pragma once
#include "matvec.hip"

// ds4_matvec_q8_0 of n_tok columns. Launch: grid (ceil(n_out / 8)), block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_matvec_q8_0_cols(float* y, const u8* w, const i8* xq,
                                                                       const float* xd, u32 n_in, u32 n_out,
                                                                       u32 rows_per_group, u32 x_stride, u32 n_tok) {
    ds4_grid_sync();
    DS4_CHAIN_SHARED(chain);
    const u32 n_cols = min(n_tok, (u32)DS4_COLS);
    const u64 rb = (u64)(n_in / 32) * 34;
    for (u32 r = blockIdx.x * DS4_MV_ROWS + warp_id(); r < min((blockIdx.x + 1) * DS4_MV_ROWS, n_out);
         r += DS4_WARPS_PER_BLOCK) {
        const u32 g = r / rows_per_group;
        const u8* wr[1] = {w + r * rb};
        float s[DS4_COLS][1];
        warp_dot_rows_q8_0_cols<1>(wr, xq + (u64)g * n_in, xd + (u64)g * (n_in / 32), x_stride, n_cols, n_in,
                                   (float*)chain[warp_id()], s);
        if (lane_id() == 0)
#pragma unroll
            for (int c = 0; c < DS4_COLS; ++c)
                if ((u32)c < n_cols) y[(u64)c * n_out + r] = s[c][0];
    }
}

// ds4_matvec_q8_0_swiglu of n_tok columns. Launch: grid (ceil(n_ff / 8)), block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_matvec_q8_0_swiglu_cols(float* mid, const u8* wg, const u8* wu,
                                                                              const i8* xq, const float* xd,
                                                                              u32 n_in, u32 n_ff, float limit,
                                                                              u32 n_tok) {
    ds4_grid_sync();
    DS4_CHAIN_SHARED(chain);
    const u32 n_cols = min(n_tok, (u32)DS4_COLS);
    const u64 rb = (u64)(n_in / 32) * 34;
    for (u32 r = blockIdx.x * DS4_MV_ROWS + warp_id(); r < min((blockIdx.x + 1) * DS4_MV_ROWS, n_ff);
         r += DS4_WARPS_PER_BLOCK) {
        const u8* wr[2] = {wg + r * rb, wu + r * rb};
        float gu[DS4_COLS][2];
        warp_dot_rows_q8_0_cols<2>(wr, xq, xd, n_in, n_cols, n_in, (float*)chain[warp_id()], gu);
        if (lane_id() == 0)
#pragma unroll
            for (int c = 0; c < DS4_COLS; ++c)
                if ((u32)c < n_cols) mid[(u64)c * n_ff + r] = swiglu_clamped(gu[c][0], gu[c][1], limit);
    }
}

// ds4_matvec_f16 of n_tok columns. Launch: grid (ceil(n_out / 8)), block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_matvec_f16_cols(float* y, const u16* w, const float* x,
                                                                      u32 n_in, u32 n_out, u32 x_stride, u32 n_tok) {
    ds4_grid_sync();
    __shared__ float4 smem4[DS4_F16_SEQ_COLS_SMEM / 4];  // float4: the chains read 16-byte words
    float* smem = (float*)smem4;
    const u32 n_cols = min(n_tok, (u32)DS4_COLS), r0 = blockIdx.x * DS4_MV_ROWS;
    const u32 live = min(DS4_MV_ROWS, n_out - r0);
    block_dots_f16_seq_cols<DS4_MV_ROWS>([&](u32 r) { return w + (u64)(r0 + r) * n_in; }, live, x, x_stride, n_cols,
                                         1.0f, n_in, smem);
    const u32 c = threadIdx.x / DS4_MV_ROWS, r = threadIdx.x % DS4_MV_ROWS;
    if (c < n_cols && r < live) y[(u64)c * n_out + r0 + r] = smem[DS4_F16_SEQ_COLS_OUT + threadIdx.x];
}

// ds4_matvec_f16_pair of n_tok columns. Launch: grid (ceil(2 * n_out / 8)), block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_matvec_f16_pair_cols(float* y0, float* y1, const u16* w0,
                                                                           const u16* w1, const float* x, u32 n_in,
                                                                           u32 n_out, u32 x_stride, u32 n_tok) {
    ds4_grid_sync();
    __shared__ float4 smem4[DS4_F16_SEQ_COLS_SMEM / 4];  // float4: the chains read 16-byte words
    float* smem = (float*)smem4;
    const u32 n_cols = min(n_tok, (u32)DS4_COLS), r0 = blockIdx.x * DS4_MV_ROWS;
    const u32 live = min(DS4_MV_ROWS, 2 * n_out - r0);
    block_dots_f16_seq_cols<DS4_MV_ROWS>(
        [&](u32 r) {
            const u32 rr = r0 + r;
            return rr >= n_out ? w1 + (u64)(rr - n_out) * n_in : w0 + (u64)rr * n_in;
        },
        live, x, x_stride, n_cols, 1.0f, n_in, smem);
    const u32 c = threadIdx.x / DS4_MV_ROWS, rr = r0 + threadIdx.x % DS4_MV_ROWS;
    if (c < n_cols && rr < r0 + live) {
        const float s = smem[DS4_F16_SEQ_COLS_OUT + threadIdx.x];
        if (rr >= n_out) y1[(u64)c * n_out + rr - n_out] = s;
        else y0[(u64)c * n_out + rr] = s;
    }
}
