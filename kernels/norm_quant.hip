// Embedding lookup, RMSNorm and activation quantization (docs/model.md#rmsnorm,
// docs/arithmetic.md#activation-quantization).
#pragma once
#include "formats.h"

// Embedding row (F16) replicated into the n_hc streams of the HC state (docs/model.md#forward-pass).
// hc: f32 [n_tok][n_hc][n_embd]; emb: F16 [n_vocab][n_embd]; tokens: u32 [n_tok] on the device
// (so decode can feed the sampled token without a host round trip). An id >= n_vocab gives zeros
// (the host validates ids; this only keeps a bad id from reading out of bounds).
// Launch: grid (ceil(n_embd / 256), n_tok), block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_embed_hc(float* hc, const u16* emb, const u32* tokens,
                                                               u32 n_embd, u32 n_hc, u32 n_vocab, u32 n_tok) {
    ds4_grid_sync();
    const u32 t = blockIdx.y;
    const u32 d = blockIdx.x * DS4_BLOCK + threadIdx.x;
    if (t >= n_tok || d >= n_embd) return;
    const u32 tok = tokens[t];
    const float v = tok < n_vocab ? f16_to_f32(emb[(u64)tok * n_embd + d]) : 0.0f;
    float* out = hc + (u64)t * n_hc * n_embd;
    for (u32 h = 0; h < n_hc; ++h) out[(u64)h * n_embd + d] = v;
}

// Fill n floats with v (e.g. the compressor score state with DS4_NEG_INF, docs/model.md#compressor).
// Launch: grid (ceil(n / 256)), block 256 (n <= 2^32 * 256 per launch).
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_fill_f32(float* x, u64 n, float v) {
    ds4_grid_sync();
    const u64 i = (u64)blockIdx.x * DS4_BLOCK + threadIdx.x;
    if (i < n) x[i] = v;
}

// Copy spans of 32-bit words: spans is a device table of n_spans triples of u64 (source address,
// destination address, word count). The block verify keeps the compressor and indexer states of
// every layer with one launch before a block and puts them back with another on a rejection
// (docs/model.md#block-verify-and-commit). A copy of words: the bits move unchanged.
// Launch: grid (blocks per span, n_spans), block 256; any grid covers every span.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_copy_spans(const u64* spans, u32 n_spans) {
    ds4_grid_sync();
    const u32 s = blockIdx.y;
    if (s >= n_spans) return;
    const u32* src = (const u32*)spans[3 * s];
    u32* dst = (u32*)spans[3 * s + 1];
    const u64 n = spans[3 * s + 2];
    for (u64 i = (u64)blockIdx.x * DS4_BLOCK + threadIdx.x; i < n; i += (u64)gridDim.x * DS4_BLOCK) dst[i] = src[i];
}

// Flags of ds4_rms_norm_quant.
#define DS4_NQ_NORM 1u  // apply RMSNorm (else the input passes through unscaled)

// A Q8_0 block whose largest |value| is am (docs/arithmetic.md#activation-quantization): the scale
// d = amax/127 and the factor 1/d of the codes evaluated as amax * (1/127) and 127/amax (DS4_RCP127),
// id = 0 when d is 0.
struct Q8Scale {
    float d, id;
};
DS4_DEV Q8Scale q8_0_scale(float am) {
    Q8Scale s;
    s.d = am * DS4_RCP127;
    s.id = s.d != 0.0f ? 127.0f / am : 0.0f;
    return s;
}
// The code of v in that block: rint(v * id), clamped to the int8 range.
DS4_DEV int q8_0_code(float v, Q8Scale s) {
    const int c = round_even_i(v * s.id);
    return c < -128 ? -128 : (c > 127 ? 127 : c);
}

// Q8_0 of one value per thread, a block being 32 neighbouring threads (width-32 shuffles: call from
// every thread): element i of a row of codes q_row and scales d_row, written where live (the scale by
// the block's first thread): ds4_rms_norm_quant's Q8_0 planes, and the fast kernels' (nqf_store_row)
// for the same values.
DS4_DEV void q8_0_store_lane(float v, u32 i, bool live, i8* q_row, float* d_row) {
    const Q8Scale s = q8_0_scale(group32_max(fabsf(v)));
    const int c = q8_0_code(v, s);
    if (live) {
        q_row[i] = (i8)c;
        if (i % 32 == 0) d_row[i / 32] = s.d;
    }
}

// The body of ds4_rms_norm_quant for output row `row` (one block; all threads call it).
DS4_DEV void norm_quant_row(u64 row, const float* xr, float* out, i8* q0_q, float* q0_d, i8* qk_q, float* qk_d,
                            i16* qk_bs, const float* w, u32 n, u32 flags, float eps) {
    __shared__ double dscratch[DS4_GROUPS32];
    const u32 tid = threadIdx.x;

    float scale = 1.0f;
    if (flags & DS4_NQ_NORM) {
        double ss = 0.0;
        for (u32 i = tid; i < n; i += DS4_BLOCK) {
            const double v = (double)xr[i];
            ss += v * v;
        }
        ss = block_sum_f64(ss, dscratch);
        scale = 1.0f / sqrtf((float)(ss / (double)n) + eps);
    }

    // Chunks of 256 elements (one Q8_K block, eight Q8_0 blocks), one warp per chunk with no block
    // barrier inside: lane l holds elements base + DS4_WARP * j + l, so at a fixed j the aligned
    // groups of 32 (Q8_0) and 16 (Q8_K sums) are lanes of one warp. A 4096-wide row is 16 chunks
    // over 8 warps (16 serial block-wide rounds instead would dominate the fused HC pre).
    const u32 lane = lane_id();
    for (u32 base = warp_id() * 256; base < n; base += DS4_WARPS_PER_BLOCK * 256) {
        float v[256 / DS4_WARP];
#pragma unroll
        for (u32 j = 0; j < 256 / DS4_WARP; ++j) {
            const u32 i = base + DS4_WARP * j + lane;
            const bool live = i < n;
            float x = live ? xr[i] * scale : 0.0f;
            if (live && w) x *= w[i];
            if (live && out) out[(u64)row * n + i] = x;
            v[j] = x;
        }
        if (q0_q) {
#pragma unroll
            for (u32 j = 0; j < 256 / DS4_WARP; ++j) {
                const u32 i = base + DS4_WARP * j + lane;
                q8_0_store_lane(v[j], i, i < n, q0_q + (u64)row * n, q0_d + (u64)row * (n / 32));
            }
        }
        if (qk_q) {
            // The element with the largest |v|, the first one (lowest index) on ties, and its sign.
            float best = -1.0f, bval = 0.0f;
            u32 bidx = 0;
#pragma unroll
            for (u32 j = 0; j < 256 / DS4_WARP; ++j) {
                if (fabsf(v[j]) > best) {
                    best = fabsf(v[j]);
                    bval = v[j];
                    bidx = DS4_WARP * j + lane;
                }
            }
#pragma unroll
            for (int o = DS4_WARP / 2; o > 0; o >>= 1) {
                const float ob = __shfl_xor(best, o, DS4_WARP);
                const float ov = __shfl_xor(bval, o, DS4_WARP);
                const u32 oi = __shfl_xor(bidx, o, DS4_WARP);
                if (ob > best || (ob == best && oi < bidx)) {
                    best = ob;
                    bval = ov;
                    bidx = oi;
                }
            }
            const float m = bval;
            float iscale = 0.0f, d = 0.0f;
            if (best != 0.0f) {
                iscale = -127.0f / m;
                d = m * -DS4_RCP127;  // = 1/iscale, as the reference evaluates it
            }
#pragma unroll
            for (u32 j = 0; j < 256 / DS4_WARP; ++j) {
                const u32 i = base + DS4_WARP * j + lane;
                int q = 0;
                if (best != 0.0f) {
                    q = round_even_i(iscale * v[j]);
                    q = q < -128 ? -128 : (q > 127 ? 127 : q);
                }
                // 16-element sums (aligned groups of 16 lanes).
                int sum = q;
#pragma unroll
                for (int o = 8; o > 0; o >>= 1) sum += __shfl_xor(sum, o, 16);
                if (i < n) {
                    qk_q[(u64)row * n + i] = (i8)q;
                    if ((i & 15) == 0) qk_bs[(u64)row * (n / 16) + i / 16] = (i16)sum;
                }
            }
            if (lane == 0) qk_d[(u64)row * (n / 256) + base / 256] = d;
        }
    }
}

// One row of n floats per block: optional RMSNorm (ss summed in double, scale = 1/sqrtf(ss/n + eps),
// times w when w != null; docs/model.md#rmsnorm), then any of three outputs (null = not wanted):
//   out      f32 [rows][n]                       the normed row
//   q8_0     q [rows][n] int8, d [rows][n/32]    Q8_0 activation, n % 32 == 0
//   q8_k     q [rows][n] int8, d [rows][n/256], bsums [rows][n/16]   Q8_K, n % 256 == 0
// (both as in docs/arithmetic.md#activation-quantization).
// Row r of x starts at x + r*x_stride (x_stride >= n) so heads/slices of a wider buffer can be used.
// Plain quantization of a long row (no NORM flag) can be launched as several shorter rows (e.g. the
// 64 x 512 attention output as 64 rows): the Q8_0/Q8_K blocks never cross a row, the layout is the same.
// Launch: grid (rows), block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_rms_norm_quant(float* out, i8* q0_q, float* q0_d, i8* qk_q,
                                                                     float* qk_d, i16* qk_bs, const float* x,
                                                                     const float* w, u32 n, u32 x_stride,
                                                                     u32 flags, float eps) {
    ds4_grid_sync();
    norm_quant_row(blockIdx.x, x + (u64)blockIdx.x * x_stride, out, q0_q, q0_d, qk_q, qk_d, qk_bs, w, n, flags, eps);
}
