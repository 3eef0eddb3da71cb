// Per-row post-processing shared by attention q/kv, compressed rows and the indexer: RMSNorm,
// partial RoPE on the tail (interleaved pairs, YaRN blend), the E4M3 round trip on the non-rope
// dims, Hadamard-128 + E2M1 (FP4) round trip, f16 rounding and the raw-ring store
// (docs/model.md#rope-and-yarn, #fp8-and-fp4-simulations, #kv-cache, #device-ring).
#pragma once
#include "formats.h"

#define DS4_ROW_NORM 1u         // RMSNorm (eps), times w when w != null
#define DS4_ROW_ROPE 2u         // RoPE on the last n_rot dims at the row's position
#define DS4_ROW_ROPE_INV 4u     // with DS4_ROW_ROPE: inverse rotation (attention output)
#define DS4_ROW_E4M3 8u         // E4M3 round trip on dims [0, head_dim - n_rot) in 64-blocks
#define DS4_ROW_HADAMARD_FP4 16u  // Hadamard-128 then E2M1 round trip on 32-blocks, per 128 dims
#define DS4_ROW_ROUND_F16 32u   // write the row back rounded through f16 (how cache rows are stored)
#define DS4_ROW_STORE_RING 64u  // also store round_f16(row) at ring row (pos % ring_cap)

// Nearest E4M3FN value to x, |x| <= 448, ties to the even code (docs/model.md#fp8-and-fp4-simulations). Codes
// are evenly spaced by 2^(e-3) within a binade and by 2^-9 below 2^-6, and an even code index always has an
// even mantissa, so rintf (half to even) on the scaled value picks exactly that code.
DS4_DEV float e4m3_round(float x) {
    const float a = fabsf(x);
    float r;
    if (a < 0.015625f) {
        r = rintf(a * 512.0f) * (1.0f / 512.0f);
    } else {
        const float step = ldexpf(1.0f, ilogbf(a) - 3);
        r = rintf(a / step) * step;
    }
    return copysignf(r, x);
}

// Nearest E2M1 value of {0, .5, 1, 1.5, 2, 3, 4, 6} to x, |x| <= 6, ties to the even table index.
DS4_DEV float e2m1_round(float x) {
    const float a = fabsf(x);
    float r;
    if (a < 2.0f) r = rintf(a * 2.0f) * 0.5f;
    else if (a < 4.0f) r = rintf(a);
    else r = 2.0f * rintf(a * 0.5f);
    return copysignf(r, x);
}

// Power-of-two block scale 2^ceil(log2(amax / limit)), the division taken as amax * (1/limit); the
// power built exactly (the reference's powi), not through exp2f.
DS4_DEV float pow2_scale(float amax, float rcp_limit) {
    return ldexpf(1.0f, (int)ceilf(ds4_log2f(amax * rcp_limit)));
}

// RoPE rotation angle of pair k (docs/model.md#rope-and-yarn): theta_extrap = pos * theta_scale^k as an
// iterated float product, then the YaRN blend theta = fs*te*(1 - ramp*ext) + te*(ramp*ext).
DS4_DEV float rope_theta(u32 pos, u32 k, float theta_scale, float freq_scale, float ext_factor, float corr_low,
                         float corr_high) {
    float te = (float)pos;
    for (u32 i = 0; i < k; ++i) te *= theta_scale;
    const float y = ((float)k - corr_low) / fmaxf(0.001f, corr_high - corr_low);
    const float ramp = (1.0f - fminf(1.0f, fmaxf(0.0f, y))) * ext_factor;
    const float ti = freq_scale * te;
    return ti * (1.0f - ramp) + te * ramp;
}

struct RowOps {
    u32 flags, head_dim, n_rot, pos;
    float theta_scale, freq_scale, ext_factor, corr_low, corr_high, mscale, eps;
    const float* w;
};

// Applies the flagged operations to row s (shared memory, head_dim floats). All threads call it.
DS4_DEV void row_ops_smem(float* s, const RowOps& op) {
    __shared__ double dscratch[DS4_GROUPS32];
    const u32 tid = threadIdx.x, hd = op.head_dim;
    if (op.flags & DS4_ROW_NORM) {
        double ss = 0.0;
        for (u32 i = tid; i < hd; i += DS4_BLOCK) ss += (double)s[i] * (double)s[i];
        ss = block_sum_f64(ss, dscratch);
        const float sc = 1.0f / sqrtf((float)(ss / (double)hd) + op.eps);
        for (u32 i = tid; i < hd; i += DS4_BLOCK) s[i] = op.w ? s[i] * sc * op.w[i] : s[i] * sc;
        __syncthreads();
    }
    if (op.flags & DS4_ROW_ROPE) {
        const u32 off = hd - op.n_rot;
        for (u32 k = tid; k < op.n_rot / 2; k += DS4_BLOCK) {
            const float th = rope_theta(op.pos, k, op.theta_scale, op.freq_scale, op.ext_factor, op.corr_low,
                                        op.corr_high);
            // cos and sign * sin, each times the YaRN magnitude factor (1 for ds4's constants).
            const float c = ds4_cosf(th) * op.mscale;
            const float sn = ((op.flags & DS4_ROW_ROPE_INV) ? -ds4_sinf(th) : ds4_sinf(th)) * op.mscale;
            const float x0 = s[off + 2 * k], x1 = s[off + 2 * k + 1];
            s[off + 2 * k] = x0 * c - x1 * sn;
            s[off + 2 * k + 1] = x0 * sn + x1 * c;
        }
        __syncthreads();
    }
    if (op.flags & DS4_ROW_E4M3) {
        // One warp per 64-element block of the non-rope dims.
        const u32 n_nope = hd - op.n_rot;
        for (u32 b = warp_id(); b * 64 < n_nope; b += DS4_WARPS_PER_BLOCK) {
            float am = 0.0f;
            for (u32 j = lane_id(); j < 64; j += DS4_WARP) {
                const u32 i = b * 64 + j;
                if (i < n_nope) am = fmaxf(am, fabsf(s[i]));
            }
            am = warp_max(am);
            const float scale = pow2_scale(fmaxf(am, 1.0e-4f), DS4_RCP448);
            for (u32 j = lane_id(); j < 64; j += DS4_WARP) {
                const u32 i = b * 64 + j;
                if (i < n_nope) s[i] = e4m3_round(fminf(448.0f, fmaxf(-448.0f, s[i] / scale))) * scale;
            }
        }
        __syncthreads();
    }
    if (op.flags & DS4_ROW_HADAMARD_FP4) {
        // Butterflies within each 128-wide chunk, natural (Sylvester) order.
        for (u32 stride = 1; stride < 128; stride <<= 1) {
            for (u32 p = tid; p < hd / 2; p += DS4_BLOCK) {
                const u32 chunk = p / 64, q = p % 64;
                const u32 i = chunk * 128 + (q / stride) * 2 * stride + (q % stride);
                const float a = s[i], b = s[i + stride];
                s[i] = a + b;
                s[i + stride] = a - b;
            }
            __syncthreads();
        }
        // E2M1 per 32-block: aligned groups of 32 lanes over elements base + tid.
        for (u32 base = 0; base < hd; base += DS4_BLOCK) {
            const u32 i = base + tid;
            const float v = i < hd ? s[i] * 0.08838834764831845f : 0.0f;
            const float am = group32_max(fabsf(v));
            const float scale = pow2_scale(fmaxf(am, 7.052966104933725e-38f), DS4_RCP6);
            if (i < hd) s[i] = e2m1_round(fminf(6.0f, fmaxf(-6.0f, v / scale))) * scale;
        }
        __syncthreads();
    }
}

// The row block-row t finishes and its RoPE position (ds4_rows_finish's two forms, below): token
// row t at pos0 + t, or (emit_ratio > 0) compressed row pos0 / emit_ratio + t at (that row) *
// emit_ratio; false when t is past the rows this batch emitted (the block exits).
DS4_DEV bool row_of_block(const u32* pos, u32 t, u32 n_tok, u32 emit_ratio, u32 row_cap, u32& row, u32& row_pos) {
    const u32 pos0 = pos[0];
    row = t;
    row_pos = pos0 + t;
    if (emit_ratio) {
        const u32 first = pos0 / emit_ratio;
        const u32 end = min((pos0 + n_tok) / emit_ratio, row_cap);
        if (first + t >= end) return false;
        row = first + t;
        row_pos = row * emit_ratio;
    }
    return true;
}

// Row post-processing, one row per block, in two forms sharing one kernel:
// - token rows (emit_ratio == 0): x f32 [n_tok][n_head][head_dim] (in place), row (t, h) at position
//   pos0 + t; grid (n_head, n_tok).
// - the compressed rows a batch emitted (emit_ratio = ratio, n_head = 1; docs/model.md#compressor): x is the
// whole
//   compressed cache [row_cap][head_dim]; the n_tok tokens at pos0 emitted rows c0 = pos0 / ratio up
//   to min((pos0 + n_tok) / ratio, row_cap), row c at RoPE position c * ratio (the first token of its
//   window); grid (1, most rows any batch of n_tok emits), blocks past this batch's count exit.
// pos: u32 [1] = pos0 in device memory (the step parameters: a captured decode graph reads each
// step's position there). ring (with DS4_ROW_STORE_RING, token rows, n_head must be 1):
// f32 [ring_cap][head_dim], row position % ring_cap. w: f32 [head_dim] or null. head_dim <= 1024
// (multiple of 128 with DS4_ROW_HADAMARD_FP4).
// RoPE parameters (docs/model.md#rope-and-yarn): theta_scale = base^(-2/n_rot) computed by the host, freq_scale
// (1 or 1/16), ext_factor (0 = no YaRN, 1 = YaRN), corr_low/high (YaRN corr dims), mscale (the
// factor on cos and sin, as the CPU reference computes it; 1 for ds4's constants).
// Launch: block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_rows_finish(float* x, float* ring, const float* w, const u32* pos,
                                                                  u32 n_head, u32 head_dim, u32 n_rot, u32 flags,
                                                                  u32 n_tok, u32 emit_ratio, u32 row_cap,
                                                                  u32 ring_cap, float theta_scale, float freq_scale,
                                                                  float ext_factor, float corr_low, float corr_high,
                                                                  float mscale, float eps) {
    ds4_grid_sync();
    __shared__ float s[1024];
    const u32 h = blockIdx.x, t = blockIdx.y;
    if (head_dim > 1024) return;
    u32 row, row_pos;
    if (!row_of_block(pos, t, n_tok, emit_ratio, row_cap, row, row_pos)) return;
    float* xr = x + ((u64)row * n_head + h) * head_dim;
    for (u32 i = threadIdx.x; i < head_dim; i += DS4_BLOCK) s[i] = xr[i];
    __syncthreads();
    RowOps op;
    op.flags = flags;
    op.head_dim = head_dim;
    op.n_rot = n_rot;
    op.pos = row_pos;
    op.theta_scale = theta_scale;
    op.freq_scale = freq_scale;
    op.ext_factor = ext_factor;
    op.corr_low = corr_low;
    op.corr_high = corr_high;
    op.mscale = mscale;
    op.eps = eps;
    op.w = w;
    row_ops_smem(s, op);
    const bool rnd = (flags & DS4_ROW_ROUND_F16) != 0;
    float* rr = (flags & DS4_ROW_STORE_RING) && ring ? ring + (u64)(op.pos % ring_cap) * head_dim : nullptr;
    for (u32 i = threadIdx.x; i < head_dim; i += DS4_BLOCK) {
        const float v = s[i];
        xr[i] = rnd ? round_f16(v) : v;
        if (rr) rr[i] = round_f16(v);
    }
}
