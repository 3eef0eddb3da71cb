// Products whose blocks finish their output units, fast arithmetic (docs/arithmetic.md): a decode
// step's projection followed by the work that needs whole units of its output (the row finishing of
// heads: norm, RoPE, E4M3 or Hadamard/FP4; the Q8_0 quantization of 256-row units), in one launch
// instead of two. Every block counts the rows it wrote into its units' counters (prelude.h
// last_arrival_of); the block that completes a unit finishes it at once, reading the rows the other
// blocks wrote. So most units finish while the product's other blocks still stream weights, and the
// second launch (and its gap on the step's chain) is gone. The outputs have the bits of the two fast
// launches one after the other. Deterministic: which block finishes a unit varies, the arithmetic
// does not.
#pragma once
#include "matvec_fast.hip"
#include "rows_fast.hip"
#include "norm_quant_fast.hip"

// For each unit of `unit` rows (a head, a quantization unit) that the block's rows [r0, r1) fall in: counts them toward
// the unit's counter (u32 [units]) and runs fin(h) in the block that completes unit h. Every thread
// of the block (r0, r1 block-uniform).
template <class Fin>
DS4_DEV void finish_units(u32* counter, u32 r0, u32 r1, u32 unit, Fin fin) {
    for (u32 h = r0 / unit; h * unit < r1; ++h) {
        const u32 a = max(r0, h * unit), b = min(r1, (h + 1) * unit);
        if (last_arrival_of(&counter[h], b - a, unit)) fin(h);
    }
}

// ds4_matvec_q8_0_normed_fast (y = the query heads, n_head rows of head_dim), then
// ds4_rows_finish_pair_fast of those heads (ring, row_w, flags, ring_cap) and of the rows x2
// (n_head2 rows: the layer's kv row, made by an earlier launch), in one launch
// (kernels::matvec_q8_0_normed_rows). Blocks [0, n_head2) finish x2's rows, one a block, from the
// start; the others run the product, each head finished by the block that completes it. counter: u32
// [n_tok][n_head], zero before the launch (the finishers put it back). Preconditions (the builder
// checks them): the normed product's, n_head * head_dim == n_out, the row finish's. Grid
// (n_head2 + product blocks, n_tok), block 256.
extern "C" __global__ DS4_Q8T_LAUNCH void ds4_matvec_q8_0_normed_rows_fast(
    float* y, const u8* w, const float* x, const float* norm_w, u32 n_in, u32 n_out, u32 x_stride, float eps,
    u32* counter, float* ring, const float* row_w, u32 n_head, u32 flags, u32 ring_cap, float* x2, float* ring2,
    const float* w2, u32 n_head2, u32 flags2, u32 ring_cap2, const u32* pos, u32 head_dim, u32 n_rot, u32 n_tok,
    float theta_scale, float freq_scale, float ext_factor, float corr_low, float corr_high, float mscale,
    float row_eps) {
    __shared__ int4 sq[DS4_Q8N_MAX / 16];
    __shared__ float4 sd[DS4_Q8N_MAX / 128];
    if (!q8_tiled(n_in) || n_in > DS4_Q8N_MAX || n_head * head_dim != n_out || gridDim.x <= n_head2) {
        ds4_grid_sync();
        return;
    }
    if (blockIdx.x < n_head2) {
        ds4_grid_sync();
        rows_finish_fast_row(x2, ring2, w2, pos, n_head2, blockIdx.x, head_dim, n_rot, flags2, n_tok, 0, 0, ring_cap2,
                             theta_scale, freq_scale, ext_factor, corr_low, corr_high, mscale, row_eps);
        return;
    }
    const Q8NormedAct act_of{x, norm_w, (i8*)sq, (float*)sd, n_in, x_stride, eps};
    u32* cnt = counter + (u64)blockIdx.y * n_head;
    auto done = [&](u32 r0, u32 r1) {
        finish_units(cnt, r0, r1, head_dim, [&](u32 h) {
            rows_finish_fast_row<true>(y, ring, row_w, pos, n_head, h, head_dim, n_rot, flags, n_tok, 0, 0, ring_cap,
                                       theta_scale, freq_scale, ext_factor, corr_low, corr_high, mscale, row_eps);
        });
    };
    // ds4_grid_sync in q8_tiled_product
    q8_tiled_product<false>(y, nullptr, w, nullptr, act_of, n_in, n_out, 0, n_out, n_in, nullptr, nullptr, done,
                            n_head2);
}

// ds4_rms_norm_quant_fast's norm (weight norm_w, f32 out) of each token's row of x, then
// ds4_matvec_f16_fast of the normed row (y = n_head heads of DS4_ROWH_DIM rows: the indexer's query
// heads), then ds4_rows_finish_hadamard_fast of those heads (flags: RoPE and Hadamard/FP4), in one
// launch (kernels::matvec_f16_normed_hadamard): every block norms the row into its shared memory
// after its first weight words are in flight, and the block that completes a head finishes it on
// its first warp. The normed row is not written. counter: u32 [n_tok][n_head], zero before the
// launch (the finishers put it back). Preconditions (the builder checks them): n_in % 8 == 0, n_in
// <= DS4_Q8N_MAX, head_dim == DS4_ROWH_DIM, n_head * head_dim == n_out, 16-byte aligned rows.
// Grid (ceil(n_out / (256 / T)), n_tok), T = f16_fast_threads(n_in); block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_matvec_f16_normed_hadamard_fast(
    float* y, const u16* w, const float* x, const float* norm_w, u32 n_in, u32 n_out, u32 x_stride, float norm_eps,
    u32* counter, const u32* pos, u32 n_head, u32 head_dim, u32 n_rot, u32 flags, u32 n_tok, float theta_scale,
    float freq_scale, float ext_factor, float corr_low, float corr_high, float mscale, float eps) {
    __shared__ float scratch[DS4_WARPS_PER_BLOCK];
    __shared__ float4 xs[DS4_Q8N_MAX / 4];
    const u32 t = blockIdx.y, tpr = f16_fast_threads(n_in), rpb = DS4_BLOCK / tpr;
    const u32 r = blockIdx.x * rpb + threadIdx.x / tpr, sub = threadIdx.x % tpr;
    if (n_in > DS4_Q8N_MAX || head_dim != DS4_ROWH_DIM || n_head * head_dim != n_out) {
        ds4_grid_sync();
        return;
    }
    const bool live = r < n_out;
    const u16* wr = w + (u64)(live ? r : 0) * n_in;
    const F16First first = f16_row_first(wr, n_in, sub, tpr, live);  // weights: before the wait
    ds4_grid_sync();
    norm_quant_row_fast<1>(0, x + (u64)t * x_stride, (float*)xs, nullptr, nullptr, nullptr, nullptr, nullptr, norm_w,
                           n_in, DS4_NQ_NORM, norm_eps);
    __syncthreads();
    const float part = live ? f16_row_part(wr, (const float*)xs, n_in, sub, tpr, &first) : 0.0f;
    const float acc = f16_row_sum(part, tpr, scratch);
    if (live && sub == 0) y[(u64)t * n_out + r] = acc;
    const u32 r0 = min(blockIdx.x * rpb, n_out), r1 = min(r0 + rpb, n_out);
    finish_units(counter + (u64)t * n_head, r0, r1, head_dim, [&](u32 h) {
        if (warp_id() == 0)
            rows_finish_hadamard_row<true>(y, nullptr, pos, n_head, h, n_rot, flags, n_tok, 0, 0, theta_scale,
                                           freq_scale, ext_factor, corr_low, corr_high, mscale, eps);
    });
}

// ds4_matvec_q8_0_swiglu_fast (tiled) followed by the Q8_0 quantization of its output rows as rows
// of 256 (kernels::quantize_rows of mid: the shared expert's down-projection input), in one launch
// (kernels::matvec_q8_0_swiglu_quantized): the block that completes a 256-row unit of mid
// quantizes it (32 threads, one 8-element strip each, as ds4_rms_norm_quant_fast holds a row of
// 256). mid is written as well. counter: u32 [n_tok][n_ff / 256], zero before the launch (the
// finishers put it back). Preconditions (the builder checks them): the tiled shapes, n_ff % 256 ==
// 0. Grid (any, n_tok), block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_matvec_q8_0_swiglu_q8_fast(float* mid, i8* q_out, float* d_out,
                                                                                 u32* counter, const u8* wg,
                                                                                 const u8* wu, const i8* xq,
                                                                                 const float* xd, u32 n_in, u32 n_ff,
                                                                                 float limit) {
    if (!q8_tiled(n_in) || n_ff % 256 != 0) {
        ds4_grid_sync();
        return;
    }
    const u32 units = n_ff / 256;
    u32* cnt = counter + (u64)blockIdx.y * units;
    auto done = [&](u32 r0, u32 r1) {
        finish_units(cnt, r0, r1, 256, [&](u32 u) {
            const u64 unit = (u64)blockIdx.y * units + u;
            // One load each (volatile: other blocks of this launch wrote them).
            float v[1][8];
#pragma unroll
            for (int j = 0; j < 8; ++j)
                v[0][j] = threadIdx.x < 32 ? ((const volatile float*)mid)[unit * 256 + 8 * threadIdx.x + j] : 0.0f;
            nqf_store_row<1>(unit, v, 256, nullptr, q_out, d_out, nullptr, nullptr, nullptr);
        });
    };
    q8_swiglu_tiled(mid, wg, wu, xq, xd, n_in, n_ff, limit, done);  // ds4_grid_sync in q8_swiglu_tiled
}
