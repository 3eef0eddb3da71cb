// Hyper-connections, fast arithmetic (docs/arithmetic.md): the HC pre step of ds4_hc_pre_fused
// with each mix value a parallel dot instead of one sequential chain. Every thread of a mix row's
// block takes 8-column strips (16-byte loads of fn and X, FMA), the block folds the partial sums as
// a tree; the RMS scale of the state multiplies the finished dot (fn · (X s) = s (fn · X)). The
// Sinkhorn split, the weighted stream sum and the sublayer's input norm are the exact kernel's.
// Deterministic: the same inputs give the same bits on every run.
#pragma once
#include "hc.hip"

// mix[t][o] = rms_scale(X_t) * (fn[o] · X_t) for the block's (o, t) = (blockIdx.x, blockIdx.y).
DS4_DEV void hc_mix_block_fast(float* mix, const float* hc, const u16* fn_w, u32 n_in, u32 n_mix, float eps) {
    __shared__ float scratch[DS4_GROUPS32];
    const u32 o = blockIdx.x, t = blockIdx.y;
    const float* x = hc + (u64)t * n_in;
    const u16* w = fn_w + (u64)o * n_in;
    float dot = 0.0f, ss = 0.0f;
    const u32 n8 = n_in / 8;
#pragma unroll 4
    for (u32 c = threadIdx.x; c < n8; c += DS4_BLOCK) {
        const uint4 wv = ((const uint4*)w)[c];
        const float4 x0 = ((const float4*)x)[2 * c], x1 = ((const float4*)x)[2 * c + 1];
        dot = fmaf(f16_to_f32((u16)(wv.x & 0xffff)), x0.x, dot);
        dot = fmaf(f16_to_f32((u16)(wv.x >> 16)), x0.y, dot);
        dot = fmaf(f16_to_f32((u16)(wv.y & 0xffff)), x0.z, dot);
        dot = fmaf(f16_to_f32((u16)(wv.y >> 16)), x0.w, dot);
        dot = fmaf(f16_to_f32((u16)(wv.z & 0xffff)), x1.x, dot);
        dot = fmaf(f16_to_f32((u16)(wv.z >> 16)), x1.y, dot);
        dot = fmaf(f16_to_f32((u16)(wv.w & 0xffff)), x1.z, dot);
        dot = fmaf(f16_to_f32((u16)(wv.w >> 16)), x1.w, dot);
        ss = fmaf(x0.x, x0.x, fmaf(x0.y, x0.y, fmaf(x0.z, x0.z, fmaf(x0.w, x0.w, ss))));
        ss = fmaf(x1.x, x1.x, fmaf(x1.y, x1.y, fmaf(x1.z, x1.z, fmaf(x1.w, x1.w, ss))));
    }
    for (u32 i = 8 * n8 + threadIdx.x; i < n_in; i += DS4_BLOCK) {
        dot = fmaf(f16_to_f32(w[i]), x[i], dot);
        ss = fmaf(x[i], x[i], ss);
    }
    dot = block_sum(dot, scratch);
    ss = block_sum(ss, scratch);
    const float scale = 1.0f / sqrtf(ss / (float)n_in + eps);
    if (threadIdx.x == 0) mix[(u64)t * n_mix + o] = dot * scale;
}

// ds4_hc_pre_fused's arguments, outputs and launch (grid (n_mix, n_tok), block 256), the mix dots
// in the fast order. hc and fn rows 16-byte aligned (n_in % 8 == 0 for the vector path).
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_hc_pre_fused_fast(
    float* split_out, float* xn, i8* q0_q, float* q0_d, i8* qk_q, float* qk_d, i16* qk_bs, float* mix, u32* counter,
    const float* hc, const u16* fn_w, const float* scale, const float* base, const float* norm_w, u32 n_embd,
    u32 n_hc, u32 iters, float eps_rms, float eps_hc, float eps_norm) {
    __shared__ float xs[4096];
    __shared__ u32 is_last;
    const u32 t = blockIdx.y;
    const u32 n_mix = 2 * n_hc + n_hc * n_hc;
    if (n_embd > 4096) return;
    hc_mix_block_fast(mix, hc, fn_w, n_hc * n_embd, n_mix, eps_rms);
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) is_last = atomicAdd(&counter[t], 1u) == n_mix - 1;
    __syncthreads();
    if (!is_last) return;
    __threadfence();
    if (threadIdx.x == 0) counter[t] = 0;
    hc_pre_finish_token(t, xs, split_out, mix, hc, scale, base, n_embd, n_hc, iters, eps_hc);
    __syncthreads();
    norm_quant_row(t, xs, xn, q0_q, q0_d, qk_q, qk_d, qk_bs, norm_w, n_embd, DS4_NQ_NORM, eps_norm);
}
