// Row post-processing, fast arithmetic (docs/arithmetic.md): ds4_rows_finish's operations with the
// row in registers instead of shared memory. Thread i holds the element pairs p = i + DS4_BLOCK * k
// (elements 2p, 2p + 1: one 8-byte load, and exactly one RoPE pair); the RMS norm's sum of squares
// is an f32 tree (block_sum) instead of the exact kernel's f64 sum, the only block barriers are
// that sum's; the E4M3 block of 64 is 32 neighbouring threads (width-32 shuffles). RoPE angles, the
// sine and cosine and the E4M3 rounding are the exact kernel's functions. The Hadamard/FP4 flag has
// no fast twin (kernels::fast_twin keeps the exact kernel for it). Deterministic.
#pragma once
#include "rows.hip"

// Pairs per thread: head_dim <= 2 * 2 * DS4_BLOCK = 1024.
#define DS4_ROWF_SLOTS 2

// Row `h` of token blockIdx.y for ds4_rows_finish_fast (its arguments otherwise). VOLATILE: the row
// was written by other blocks of this launch (prelude.h last_arrival_of).
template <bool VOLATILE = false>
DS4_DEV void rows_finish_fast_row(float* x, float* ring, const float* w, const u32* pos, u32 n_head, u32 h,
                                  u32 head_dim, u32 n_rot, u32 flags, u32 n_tok, u32 emit_ratio, u32 row_cap,
                                  u32 ring_cap, float theta_scale, float freq_scale, float ext_factor,
                                  float corr_low, float corr_high, float mscale, float eps) {
    constexpr int S = DS4_ROWF_SLOTS;
    __shared__ float scratch[DS4_GROUPS32];
    const u32 t = blockIdx.y, hd = head_dim;
    if (hd > 2 * S * DS4_BLOCK) return;
    u32 row, row_pos;
    if (!row_of_block(pos, t, n_tok, emit_ratio, row_cap, row, row_pos)) return;
    float* xr = x + ((u64)row * n_head + h) * hd;
    float v[S][2], wv[S][2];
#pragma unroll
    for (int k = 0; k < S; ++k) {
        const u32 p = threadIdx.x + DS4_BLOCK * k;
        v[k][0] = v[k][1] = 0.0f;
        wv[k][0] = wv[k][1] = 1.0f;
        if (2 * p < hd) {
            if (VOLATILE) {
                v[k][0] = ((const volatile float*)xr)[2 * p];
                v[k][1] = ((const volatile float*)xr)[2 * p + 1];
            } else {
                const float2 a = ((const float2*)xr)[p];
                v[k][0] = a.x, v[k][1] = a.y;
            }
            if ((flags & DS4_ROW_NORM) && w) {
                const float2 b = ((const float2*)w)[p];
                wv[k][0] = b.x, wv[k][1] = b.y;
            }
        }
    }
    if (flags & DS4_ROW_NORM) {
        float ss = 0.0f;
#pragma unroll
        for (int k = 0; k < S; ++k) ss += fmaf(v[k][0], v[k][0], v[k][1] * v[k][1]);
        const float sc = 1.0f / sqrtf(block_sum(ss, scratch) / (float)hd + eps);
#pragma unroll
        for (int k = 0; k < S; ++k) v[k][0] = v[k][0] * sc * wv[k][0], v[k][1] = v[k][1] * sc * wv[k][1];
    }
    const u32 off = hd - n_rot;
    if (flags & DS4_ROW_ROPE) {
#pragma unroll
        for (int k = 0; k < S; ++k) {
            const u32 p = threadIdx.x + DS4_BLOCK * k;
            if (2 * p >= off && 2 * p < hd) {
                const float th =
                    rope_theta(row_pos, p - off / 2, theta_scale, freq_scale, ext_factor, corr_low, corr_high);
                const float c = ds4_cosf(th) * mscale;
                const float sn = ((flags & DS4_ROW_ROPE_INV) ? -ds4_sinf(th) : ds4_sinf(th)) * mscale;
                const float x0 = v[k][0], x1 = v[k][1];
                v[k][0] = x0 * c - x1 * sn;
                v[k][1] = x0 * sn + x1 * c;
            }
        }
    }
    if (flags & DS4_ROW_E4M3) {
        // Dims [0, off) in blocks of 64 = the pairs of 32 neighbouring threads.
#pragma unroll
        for (int k = 0; k < S; ++k) {
            const u32 p = threadIdx.x + DS4_BLOCK * k;
            const bool nope = 2 * p < off;
            const float am = group32_max(nope ? fmaxf(fabsf(v[k][0]), fabsf(v[k][1])) : 0.0f);
            const float scale = pow2_scale(fmaxf(am, 1.0e-4f), DS4_RCP448);
            if (nope) {
#pragma unroll
                for (int j = 0; j < 2; ++j) v[k][j] = e4m3_round(fminf(448.0f, fmaxf(-448.0f, v[k][j] / scale))) * scale;
            }
        }
    }
    const bool rnd = (flags & DS4_ROW_ROUND_F16) != 0;
    float* rr = (flags & DS4_ROW_STORE_RING) && ring ? ring + (u64)(row_pos % ring_cap) * hd : nullptr;
#pragma unroll
    for (int k = 0; k < S; ++k) {
        const u32 p = threadIdx.x + DS4_BLOCK * k;
        if (2 * p < hd) {
            float2 o, r;
            r.x = round_f16(v[k][0]);
            r.y = round_f16(v[k][1]);
            o.x = rnd ? r.x : v[k][0];
            o.y = rnd ? r.y : v[k][1];
            ((float2*)xr)[p] = o;
            if (rr) ((float2*)rr)[p] = r;
        }
    }
}

// ds4_rows_finish's arguments, outputs and launch (block 256, the grid of its two forms).
// Preconditions (kernels::fast_twin checks them): no DS4_ROW_HADAMARD_FP4, head_dim even and
// <= 1024, n_rot even, pointers 16-byte aligned.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_rows_finish_fast(
    float* x, float* ring, const float* w, const u32* pos, u32 n_head, u32 head_dim, u32 n_rot, u32 flags, u32 n_tok,
    u32 emit_ratio, u32 row_cap, u32 ring_cap, float theta_scale, float freq_scale, float ext_factor, float corr_low,
    float corr_high, float mscale, float eps) {
    ds4_grid_sync();
    rows_finish_fast_row(x, ring, w, pos, n_head, blockIdx.x, head_dim, n_rot, flags, n_tok, emit_ratio, row_cap,
                         ring_cap, theta_scale, freq_scale, ext_factor, corr_low, corr_high, mscale, eps);
}

// Two ds4_rows_finish_fast launches of the same tokens, positions, widths and RoPE in one (fast
// mode: a layer's query heads and its kv row; kernels::fused_rows_finish_pair): blocks [0, n_head)
// finish rows of x (ring, w, flags, ring_cap), blocks n_head .. n_head + n_head2 rows of x2 (ring2,
// w2, flags2, ring_cap2). Each row has the bits of its own launch. Grid (n_head + n_head2, n_tok).
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_rows_finish_pair_fast(
    float* x, float* ring, const float* w, u32 n_head, u32 flags, u32 ring_cap, float* x2, float* ring2,
    const float* w2, u32 n_head2, u32 flags2, u32 ring_cap2, const u32* pos, u32 head_dim, u32 n_rot, u32 n_tok,
    float theta_scale, float freq_scale, float ext_factor, float corr_low, float corr_high, float mscale,
    float eps) {
    ds4_grid_sync();
    if (blockIdx.x < n_head)
        rows_finish_fast_row(x, ring, w, pos, n_head, blockIdx.x, head_dim, n_rot, flags, n_tok, 0, 0, ring_cap,
                             theta_scale, freq_scale, ext_factor, corr_low, corr_high, mscale, eps);
    else if (blockIdx.x - n_head < n_head2)
        rows_finish_fast_row(x2, ring2, w2, pos, n_head2, blockIdx.x - n_head, head_dim, n_rot, flags2, n_tok, 0, 0,
                             ring_cap2, theta_scale, freq_scale, ext_factor, corr_low, corr_high, mscale, eps);
}

// ds4_rows_finish of rows of DS4_ROWH_DIM elements with DS4_ROW_HADAMARD_FP4 (the indexer's query
// heads and its compressed rows), one warp a row instead of one block: lane l holds elements
// E l .. E l + E - 1 (E = DS4_ROWH_DIM / DS4_WARP) in registers, so the Hadamard butterflies across
// lanes are shuffles and no step waits on a block barrier (the exact kernel runs 7 barriered stages
// of 64 active threads). Every element sees the exact kernel's
// operations on the same operands: each butterfly's a + b and a - b in stage order, RoPE's products,
// the E2M1 block max (order-free), and the norm's f64 sum of squares as block_sum_f64's tree (the
// butterfly within each group of 32 elements, xor 16 down to 1, then the groups added in order),
// so the rows have the exact kernel's bits. Preconditions (kernels::fast_twin checks them):
// head_dim == DS4_ROWH_DIM, no DS4_ROW_E4M3 or DS4_ROW_STORE_RING, n_rot even. ds4_rows_finish's
// arguments; grid (ceil(n_head / DS4_ROWH_ROWS), its grid's y), block 256.
#define DS4_ROWH_DIM 128
#define DS4_ROWH_ROWS 8  // rows a block (fast.rs ROWS_HADAMARD_PER_BLOCK): one a warp on wave32
// One warp's row h; VOLATILE as rows_finish_fast_row's.
template <bool VOLATILE = false>
DS4_DEV void rows_finish_hadamard_row(float* x, const float* w, const u32* pos, u32 n_head, u32 h, u32 n_rot,
                                      u32 flags, u32 n_tok, u32 emit_ratio, u32 row_cap, float theta_scale,
                                      float freq_scale, float ext_factor, float corr_low, float corr_high,
                                      float mscale, float eps) {
    constexpr u32 E = DS4_ROWH_DIM / DS4_WARP;  // elements a lane: 4 (wave32) or 2 (wave64)
    const u32 t = blockIdx.y;
    u32 row, row_pos;
    if (!row_of_block(pos, t, n_tok, emit_ratio, row_cap, row, row_pos)) return;
    float* xr = x + ((u64)row * n_head + h) * DS4_ROWH_DIM;
    const u32 lane = lane_id(), e0 = E * lane;
    float v[E];
#pragma unroll
    for (u32 j = 0; j < E; ++j) v[j] = VOLATILE ? ((const volatile float*)xr)[e0 + j] : xr[e0 + j];
    if (flags & DS4_ROW_NORM) {
        double sq[E];
#pragma unroll
        for (u32 j = 0; j < E; ++j) sq[j] = (double)v[j] * (double)v[j];
        // block_sum_f64's butterfly over element index m within its group of 32: bits of m at or
        // above log2(E) are lane bits, the lower ones the slot within the lane.
#pragma unroll
        for (u32 o = 16; o > 0; o >>= 1) {
            if (o >= E) {
#pragma unroll
                for (u32 j = 0; j < E; ++j) sq[j] += __shfl_xor(sq[j], (int)(o / E), DS4_WARP);
            } else {
                double nx[E];
#pragma unroll
                for (u32 j = 0; j < E; ++j) nx[j] = sq[j] + sq[j ^ o];
#pragma unroll
                for (u32 j = 0; j < E; ++j) sq[j] = nx[j];
            }
        }
        // The groups' totals in group order (the groups past the row are zeros there).
        double ss = 0.0;
#pragma unroll
        for (u32 g = 0; g < DS4_ROWH_DIM / 32; ++g) ss += __shfl(sq[0], (int)(g * 32 / E), DS4_WARP);
        const float sc = 1.0f / sqrtf((float)(ss / (double)DS4_ROWH_DIM) + eps);
#pragma unroll
        for (u32 j = 0; j < E; ++j) v[j] = w ? v[j] * sc * w[e0 + j] : v[j] * sc;
    }
    if (flags & DS4_ROW_ROPE) {
        const u32 off = DS4_ROWH_DIM - n_rot;
#pragma unroll
        for (u32 j = 0; j < E; j += 2) {
            const u32 e = e0 + j;
            if (e >= off) {
                const float th =
                    rope_theta(row_pos, (e - off) / 2, theta_scale, freq_scale, ext_factor, corr_low, corr_high);
                const float c = ds4_cosf(th) * mscale;
                const float sn = ((flags & DS4_ROW_ROPE_INV) ? -ds4_sinf(th) : ds4_sinf(th)) * mscale;
                const float x0 = v[j], x1 = v[j + 1];
                v[j] = x0 * c - x1 * sn;
                v[j + 1] = x0 * sn + x1 * c;
            }
        }
    }
    if (flags & DS4_ROW_HADAMARD_FP4) {
        // Stage `stride`: element i with that bit clear becomes a + b, its partner a - b.
#pragma unroll
        for (u32 stride = 1; stride < DS4_ROWH_DIM; stride <<= 1) {
            if (stride < E) {
                float nx[E];
#pragma unroll
                for (u32 j = 0; j < E; ++j) nx[j] = (j & stride) ? v[j ^ stride] - v[j] : v[j] + v[j ^ stride];
#pragma unroll
                for (u32 j = 0; j < E; ++j) v[j] = nx[j];
            } else {
                const bool hi = (e0 & stride) != 0;
#pragma unroll
                for (u32 j = 0; j < E; ++j) {
                    const float o = __shfl_xor(v[j], (int)(stride / E), DS4_WARP);
                    v[j] = hi ? o - v[j] : v[j] + o;
                }
            }
        }
        // E2M1 per 32-element block: the block's max over its 32 / E lanes.
        float am = 0.0f;
#pragma unroll
        for (u32 j = 0; j < E; ++j) {
            v[j] = v[j] * 0.08838834764831845f;
            am = fmaxf(am, fabsf(v[j]));
        }
#pragma unroll
        for (u32 o = 32 / E / 2; o > 0; o >>= 1) am = fmaxf(am, __shfl_xor(am, (int)o, DS4_WARP));
        const float scale = pow2_scale(fmaxf(am, 7.052966104933725e-38f), DS4_RCP6);
#pragma unroll
        for (u32 j = 0; j < E; ++j) v[j] = e2m1_round(fminf(6.0f, fmaxf(-6.0f, v[j] / scale))) * scale;
    }
    const bool rnd = (flags & DS4_ROW_ROUND_F16) != 0;
#pragma unroll
    for (u32 j = 0; j < E; ++j) xr[e0 + j] = rnd ? round_f16(v[j]) : v[j];
}
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_rows_finish_hadamard_fast(
    float* x, float* ring, const float* w, const u32* pos, u32 n_head, u32 head_dim, u32 n_rot, u32 flags, u32 n_tok,
    u32 emit_ratio, u32 row_cap, u32 ring_cap, float theta_scale, float freq_scale, float ext_factor, float corr_low,
    float corr_high, float mscale, float eps) {
    ds4_grid_sync();
    (void)ring;
    (void)ring_cap;
    if (head_dim != DS4_ROWH_DIM) return;
    for (u32 r = warp_id(); r < DS4_ROWH_ROWS; r += DS4_WARPS_PER_BLOCK) {
        const u32 h = blockIdx.x * DS4_ROWH_ROWS + r;  // warp-uniform
        if (h < n_head)
            rows_finish_hadamard_row(x, w, pos, n_head, h, n_rot, flags, n_tok, emit_ratio, row_cap, theta_scale,
                                     freq_scale, ext_factor, corr_low, corr_high, mscale, eps);
    }
}
