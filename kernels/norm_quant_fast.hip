// RMSNorm and activation quantization, fast arithmetic (docs/arithmetic.md): ds4_rms_norm_quant's
// outputs with the whole row in registers. Thread i of the block holds the 8-element strips starting
// at 8 * (i + DS4_BLOCK * k), loaded with 16-byte loads all issued at once; the sum of squares is an
// f32 tree (in-thread pairs, then block_sum) instead of the exact kernel's f64 sum; the Q8_0 block
// of 32 is 4 neighbouring threads, the Q8_K super-block of 256 is 32 (width-32 shuffles, so wave32
// and wave64 agree) and its 16-element sums are thread pairs. The code of each element is computed
// with the exact kernel's formulas, so codes differ from the exact ones only where the normed value
// itself moved across a rounding boundary. Deterministic.
#pragma once
#include "norm_quant.hip"

// 8-element strips per thread: rows of up to DS4_NQF_SLOTS * 8 * DS4_BLOCK = 8192 elements.
#define DS4_NQF_SLOTS 4
#define DS4_NQF_MAX (DS4_NQF_SLOTS * 8 * DS4_BLOCK)

// Start of this thread's strip k.
DS4_DEV u32 nqf_start(u32 k) { return 8 * (threadIdx.x + DS4_BLOCK * k); }

DS4_DEV void load8(float v[8], const float* p) {
    const float4 a = ((const float4*)p)[0], b = ((const float4*)p)[1];
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
    v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}
DS4_DEV void store8(float* p, const float v[8]) {
    ((float4*)p)[0] = make_float4(v[0], v[1], v[2], v[3]);
    ((float4*)p)[1] = make_float4(v[4], v[5], v[6], v[7]);
}
// 8 codes (each in -128..127) as one 8-byte store.
DS4_DEV void store8_i8(i8* p, const int q[8]) {
    u32 lo = 0, hi = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        lo |= ((u32)q[j] & 0xffu) << (8 * j);
        hi |= ((u32)q[4 + j] & 0xffu) << (8 * j);
    }
    *(int2*)p = make_int2((int)lo, (int)hi);
}

// Sum of squares of the thread's strips (pairwise within a strip).
template <int S>
DS4_DEV float strips_sumsq(const float v[S][8]) {
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < S; ++k) {
        const float a = fmaf(v[k][0], v[k][0], v[k][1] * v[k][1]) + fmaf(v[k][2], v[k][2], v[k][3] * v[k][3]);
        const float b = fmaf(v[k][4], v[k][4], v[k][5] * v[k][5]) + fmaf(v[k][6], v[k][6], v[k][7] * v[k][7]);
        ss += a + b;
    }
    return ss;
}

// Writes the outputs of ds4_rms_norm_quant for row `row` from the finished (normed) values of the
// thread's strips: out f32, Q8_0 (q, d) and Q8_K (q, d, bsums), each null = not wanted. Strips at or
// past n hold zeros. All threads call it (shuffles); no block barrier inside.
template <int S>
DS4_DEV void nqf_store_row(u64 row, const float v[S][8], u32 n, float* out, i8* q0_q, float* q0_d, i8* qk_q,
                           float* qk_d, i16* qk_bs) {
#pragma unroll
    for (int k = 0; k < S; ++k) {
        const u32 i0 = nqf_start(k);
        // Every lane runs the shuffles; a Q8_0 block (4 threads) or Q8_K block (32 threads) is
        // either wholly inside the row or wholly past it (n % 32 == 0, n % 256 == 0 when quantized).
        const bool live = i0 < n;
        if (live && out) store8(out + row * n + i0, v[k]);
        if (q0_q) {
            float am = 0.0f;
#pragma unroll
            for (int j = 0; j < 8; ++j) am = fmaxf(am, fabsf(v[k][j]));
            am = fmaxf(am, __shfl_xor(am, 1, 4));
            am = fmaxf(am, __shfl_xor(am, 2, 4));
            const Q8Scale sc = q8_0_scale(am);
            int q[8];
#pragma unroll
            for (int j = 0; j < 8; ++j) q[j] = q8_0_code(v[k][j], sc);
            if (live) {
                store8_i8(q0_q + row * n + i0, q);
                if ((i0 & 31) == 0) q0_d[row * (n / 32) + i0 / 32] = sc.d;
            }
        }
        if (qk_q) {
            // The element with the largest |v|, the first one (lowest index) on ties, and its sign.
            float best = -1.0f, bval = 0.0f;
            u32 bidx = i0;
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                if (fabsf(v[k][j]) > best) {
                    best = fabsf(v[k][j]);
                    bval = v[k][j];
                    bidx = i0 + j;
                }
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
                const float ob = __shfl_xor(best, o, 32);
                const float ov = __shfl_xor(bval, o, 32);
                const u32 oi = __shfl_xor(bidx, o, 32);
                if (ob > best || (ob == best && oi < bidx)) {
                    best = ob;
                    bval = ov;
                    bidx = oi;
                }
            }
            float iscale = 0.0f, d = 0.0f;
            if (best != 0.0f) {
                iscale = -127.0f / bval;
                d = bval * -DS4_RCP127;
            }
            int q[8], sum = 0;
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                int c = 0;
                if (best != 0.0f) {
                    c = round_even_i(iscale * v[k][j]);
                    c = c < -128 ? -128 : (c > 127 ? 127 : c);
                }
                q[j] = c;
                sum += c;
            }
            sum += __shfl_xor(sum, 1, 2);
            if (live) {
                store8_i8(qk_q + row * n + i0, q);
                if ((i0 & 15) == 0) qk_bs[row * (n / 16) + i0 / 16] = (i16)sum;
                if ((i0 & 255) == 0) qk_d[row * (n / 256) + i0 / 256] = d;
            }
        }
    }
}

// ds4_rms_norm_quant for rows of n <= 8 * DS4_BLOCK * S elements.
template <int S>
DS4_DEV void norm_quant_row_fast(u64 row, const float* xr, float* out, i8* q0_q, float* q0_d, i8* qk_q, float* qk_d,
                                 i16* qk_bs, const float* w, u32 n, u32 flags, float eps) {
    __shared__ float scratch[DS4_GROUPS32];
    float v[S][8], wv[S][8];
#pragma unroll
    for (int k = 0; k < S; ++k) {
        const u32 i0 = nqf_start(k);
        const bool live = i0 < n;
#pragma unroll
        for (int j = 0; j < 8; ++j) v[k][j] = 0.0f, wv[k][j] = 1.0f;
        if (live) load8(v[k], xr + i0);
        if (live && w) load8(wv[k], w + i0);
    }
    if (flags & DS4_NQ_NORM) {
        const float ss = block_sum(strips_sumsq<S>(v), scratch);
        const float scale = 1.0f / sqrtf(ss / (float)n + eps);
#pragma unroll
        for (int k = 0; k < S; ++k)
#pragma unroll
            for (int j = 0; j < 8; ++j) v[k][j] = v[k][j] * scale * wv[k][j];
    } else if (w) {
#pragma unroll
        for (int k = 0; k < S; ++k)
#pragma unroll
            for (int j = 0; j < 8; ++j) v[k][j] *= wv[k][j];
    }
    nqf_store_row<S>(row, v, n, out, q0_q, q0_d, qk_q, qk_d, qk_bs);
}

// ds4_rms_norm_quant's arguments, outputs and launch (grid (rows), block 256) in the fast order.
// Preconditions (kernels::fast_twin checks them): n % 8 == 0, n <= 8192, x_stride % 4 == 0 and
// every pointer 16-byte aligned (the 16-byte loads and stores).
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_rms_norm_quant_fast(float* out, i8* q0_q, float* q0_d, i8* qk_q,
                                                                          float* qk_d, i16* qk_bs, const float* x,
                                                                          const float* w, u32 n, u32 x_stride,
                                                                          u32 flags, float eps) {
    ds4_grid_sync();
    const u64 row = blockIdx.x;
    const float* xr = x + row * x_stride;
    if (n <= 8 * DS4_BLOCK)
        norm_quant_row_fast<1>(row, xr, out, q0_q, q0_d, qk_q, qk_d, qk_bs, w, n, flags, eps);
    else if (n <= 16 * DS4_BLOCK)
        norm_quant_row_fast<2>(row, xr, out, q0_q, q0_d, qk_q, qk_d, qk_bs, w, n, flags, eps);
    else if (n <= DS4_NQF_MAX)
        norm_quant_row_fast<DS4_NQF_SLOTS>(row, xr, out, q0_q, q0_d, qk_q, qk_d, qk_bs, w, n, flags, eps);
}
