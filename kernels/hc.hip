// Hyper-connections (docs/model.md#hyper-connections, #output-head). The HC state of a token is n_hc streams of
// n_embd floats, stream-major (element (h, d) at h * n_embd + d, docs/model.md#tensor-conventions).
//
// The arithmetic is the CPU reference's (src/backend/cpu/hc.rs, forward.rs `hc_pre` / `head`), so
// the results are bitwise equal to it: the state is RMS-normalized first (flat = X * scale, the sum
// of squares in the shared block order), then each mix value is ONE sequential F16 dot over the
// n_hc * n_embd columns (ds4's order; a chain of 16384 adds for Flash, which is why each mix row gets
// its own block; formats.h block_dot_f16_seq), then the Sinkhorn split in the reference's order.
//   ds4_hc_mix:         one block per (mix row, token): mix[t][o] = fn[o] · flat_t.
//   ds4_hc_pre_finish / ds4_hc_head_finish: one block per token: split + weighted stream sum.
//   ds4_hc_pre_fused:   ds4_hc_mix's blocks, of which the last to finish for a token also does the
//                       finish and the sublayer's input norm + quantization.
#pragma once
#include "formats.h"
#include "norm_quant.hip"

#define DS4_HC_MAX_MIX 24  // 2*n_hc + n_hc^2 for n_hc = 4 (docs/model.md#hyperparameters); n_hc <= 4 supported
#define DS4_HC_MAX 4

// mix[t][o] = fn[o] · (X_t * rms_scale(X_t, eps)) for the block's (o, t) = (blockIdx.x, blockIdx.y).
DS4_DEV void hc_mix_block(float* mix, const float* hc, const u16* fn_w, u32 n_in, u32 n_mix, float eps) {
    __shared__ double dscratch[DS4_GROUPS32];
    __shared__ float4 buf4[DS4_F16_SEQ_SMEM / 4];
    float* buf = (float*)buf4;
    const u32 o = blockIdx.x, t = blockIdx.y;
    const float* x = hc + (u64)t * n_in;
    double ss = 0.0;
    for (u32 i = threadIdx.x; i < n_in; i += DS4_BLOCK) ss += (double)x[i] * (double)x[i];
    ss = block_sum_f64(ss, dscratch);
    const float scale = 1.0f / sqrtf((float)(ss / (double)n_in) + eps);
    const float v = block_dot_f16_seq(fn_w + (u64)o * n_in, x, scale, n_in, buf);
    if (threadIdx.x == 0) mix[(u64)t * n_mix + o] = v;
}

// mix: f32 [n_tok][n_mix]; hc: f32 [n_tok][n_in] (n_in = n_hc * n_embd); fn: F16 [n_mix][n_in].
// Launch: grid (n_mix, n_tok), block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_hc_mix(float* mix, const float* hc, const u16* fn_w, u32 n_in,
                                                             u32 n_mix, float eps) {
    ds4_grid_sync();
    hc_mix_block(mix, hc, fn_w, n_in, n_mix, eps);
}

DS4_DEV float plain_sigmoid(float z) { return 1.0f / (1.0f + ds4_expf(-z)); }

// The split of one token (docs/model.md#hc-pre) for N = n_hc streams, by one thread: pre and post gates
// and the Sinkhorn-normalized N x N mixing matrix, written to split_out = [pre | post | M] and pre
// also to pre_out. Operation for operation the CPU reference (cpu/hc.rs split_sinkhorn): sums in
// index order, divisions as multiplications by 1 / (sum [+ eps]).
template <int N>
DS4_DEV void hc_split_one(float* split_out, float* pre_out, const float* mix, const float* scale, const float* base,
                          u32 iters, float eps_hc) {
    float m[N][N];
#pragma unroll
    for (int i = 0; i < N; ++i) {
        const float pre = plain_sigmoid(mix[i] * scale[0] + base[i]) + eps_hc;
        pre_out[i] = pre;
        split_out[i] = pre;
        split_out[N + i] = 2.0f * plain_sigmoid(mix[N + i] * scale[1] + base[N + i]);
    }
#pragma unroll
    for (int a = 0; a < N; ++a) {
        float mx = -1.0e30f;
#pragma unroll
        for (int b = 0; b < N; ++b) {
            const int k = 2 * N + N * a + b;
            m[a][b] = mix[k] * scale[2] + base[k];
            mx = fmaxf(mx, m[a][b]);
        }
        float sum = 0.0f;
#pragma unroll
        for (int b = 0; b < N; ++b) {
            m[a][b] = ds4_expf(m[a][b] - mx);
            sum += m[a][b];
        }
        const float inv = 1.0f / sum;
#pragma unroll
        for (int b = 0; b < N; ++b) m[a][b] = m[a][b] * inv + eps_hc;
    }
    for (u32 it = 0; it < iters; ++it) {
        if (it > 0) {
#pragma unroll
            for (int a = 0; a < N; ++a) {
                float sum = 0.0f;
#pragma unroll
                for (int b = 0; b < N; ++b) sum += m[a][b];
                const float inv = 1.0f / (sum + eps_hc);
#pragma unroll
                for (int b = 0; b < N; ++b) m[a][b] *= inv;
            }
        }
#pragma unroll
        for (int b = 0; b < N; ++b) {
            float sum = 0.0f;
#pragma unroll
            for (int a = 0; a < N; ++a) sum += m[a][b];
            const float inv = 1.0f / (sum + eps_hc);
#pragma unroll
            for (int a = 0; a < N; ++a) m[a][b] *= inv;
        }
    }
#pragma unroll
    for (int a = 0; a < N; ++a)
#pragma unroll
        for (int b = 0; b < N; ++b) split_out[2 * N + N * a + b] = m[a][b];
}

// The same split computed by the lanes of one warp for N = 2 or 4: lane a*N + b holds M[a][b] and
// gathers its row or column with shuffles, summing in the reference's order (so every value is
// bit-identical to hc_split_one's), then scales only its own element. The single-thread version
// chains ~640 dependent operations over the 20 Sinkhorn iterations, a latency chain of its own.
// Call from all lanes of one warp.
template <int N>
DS4_DEV void hc_split_warp(float* split_out, float* pre_out, const float* mix, const float* scale, const float* base,
                           u32 iters, float eps_hc) {
    const u32 lane = lane_id();
    if (lane < (u32)N) {
        const float pre = plain_sigmoid(mix[lane] * scale[0] + base[lane]) + eps_hc;
        pre_out[lane] = pre;
        split_out[lane] = pre;
        split_out[N + lane] = 2.0f * plain_sigmoid(mix[N + lane] * scale[1] + base[N + lane]);
    }
    const bool live = lane < (u32)(N * N);
    const u32 a = live ? lane / N : 0, b = live ? lane % N : 0;
    const u32 k = 2 * N + N * a + b;
    float m = live ? mix[k] * scale[2] + base[k] : 0.0f;
    // Row softmax: M[a][j] sits at lane a*N + j = lane ^ (b ^ j).
    float mx = -1.0e30f;
#pragma unroll
    for (int j = 0; j < N; ++j) mx = fmaxf(mx, __shfl_xor(m, b ^ (u32)j, DS4_WARP));
    const float e = ds4_expf(m - mx);
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < N; ++j) sum += __shfl_xor(e, b ^ (u32)j, DS4_WARP);
    m = e * (1.0f / sum) + eps_hc;
    for (u32 it = 0; it < iters; ++it) {
        if (it > 0) {
            float rs = 0.0f;
#pragma unroll
            for (int j = 0; j < N; ++j) rs += __shfl_xor(m, b ^ (u32)j, DS4_WARP);
            m *= 1.0f / (rs + eps_hc);
        }
        // Column b: M[j][b] sits at lane j*N + b = lane ^ ((a ^ j) * N).
        float cs = 0.0f;
#pragma unroll
        for (int j = 0; j < N; ++j) cs += __shfl_xor(m, (a ^ (u32)j) * N, DS4_WARP);
        m *= 1.0f / (cs + eps_hc);
    }
    if (live) split_out[k] = m;
}

// HC pre finish (docs/model.md#hc-pre) for one token per block:
//   pre[i]  = sigmoid(mix[i] * scale[0] + base[i]) + eps_hc           (not normalized)
//   post[i] = 2 * sigmoid(mix[n_hc + i] * scale[1] + base[n_hc + i])
//   M[a][b] = mix[2 n_hc + n_hc a + b] * scale[2] + base[...]; row softmax, + eps_hc; column pass;
//             then (iters - 1) x (row pass, column pass), each scaling by 1 / (sum + eps_hc).
//   x_out[t][d] = sum_h X[h][d] * pre[h]  (h in order)
// split_out: f32 [n_tok][n_mix] = [pre | post | M row-major (src a, dst b)], consumed by ds4_hc_post.
// mix: f32 [n_tok][n_mix] from ds4_hc_mix; hc: f32 [n_tok][n_hc * n_embd].
// Launch: grid (n_tok), block 256.
DS4_DEV void hc_pre_finish_token(u32 t, float* x_out, float* split_out, const float* mix_all, const float* hc,
                                 const float* scale, const float* base, u32 n_embd, u32 n_hc, u32 iters,
                                 float eps_hc) {
    __shared__ float mix[DS4_HC_MAX_MIX];
    __shared__ float pre[DS4_HC_MAX];
    const u32 n_mix = 2 * n_hc + n_hc * n_hc;
    // volatile: in ds4_hc_pre_fused the values were written by other blocks of the same launch.
    const volatile float* mt = mix_all + (u64)t * n_mix;
    if (threadIdx.x < n_mix) mix[threadIdx.x] = mt[threadIdx.x];
    __syncthreads();
    // With n_hc a compile-time constant the matrix stays in registers; n_hc = 2 or 4 (Flash: 4) run
    // on one warp, 1 or 3 on one thread.
    float* so = split_out + (u64)t * n_mix;
    if (n_hc == 4 && warp_id() == 0) hc_split_warp<4>(so, pre, mix, scale, base, iters, eps_hc);
    if (n_hc == 2 && warp_id() == 0) hc_split_warp<2>(so, pre, mix, scale, base, iters, eps_hc);
    if (threadIdx.x == 0 && n_hc == 1) hc_split_one<1>(so, pre, mix, scale, base, iters, eps_hc);
    if (threadIdx.x == 0 && n_hc == 3) hc_split_one<3>(so, pre, mix, scale, base, iters, eps_hc);
    __syncthreads();
    const float* x = hc + (u64)t * n_hc * n_embd;
    for (u32 d = threadIdx.x; d < n_embd; d += DS4_BLOCK) {
        float v = 0.0f;
        for (u32 h = 0; h < n_hc; ++h) v += x[(u64)h * n_embd + d] * pre[h];
        x_out[d] = v;
    }
}

extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_hc_pre_finish(float* x_out, float* split_out, const float* mix,
                                                                    const float* hc, const float* scale,
                                                                    const float* base, u32 n_embd, u32 n_hc,
                                                                    u32 iters, float eps_hc) {
    ds4_grid_sync();
    const u32 t = blockIdx.x;
    hc_pre_finish_token(t, x_out + (u64)t * n_embd, split_out, mix, hc, scale, base, n_embd, n_hc, iters, eps_hc);
}

// The whole HC pre step and the sublayer's input norm in one launch (docs/model.md#hc-pre,
// then the attention or ffn norm): ds4_hc_mix's blocks, of which the last one to finish for a token (an atomic
// counter per token) performs ds4_hc_pre_finish and then ds4_rms_norm_quant's NORM on x with norm_w, writing
// the same outputs those kernels write (x itself stays in shared memory):
//   split_out [n_tok][n_mix]; xn [n_tok][n_embd] (may be null); Q8_0 and/or Q8_K planes of xn (null
//   = not wanted). mix: f32 [n_tok][n_mix] scratch; counter: u32 [n_tok], zero before the first
//   launch (the last block resets its token's counter, so captured graphs can be replayed).
//   eps_rms: of the HC state's norm; eps_norm: of the sublayer's input norm. n_embd <= 4096.
// Launch: grid (n_mix, n_tok), block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_hc_pre_fused(float* split_out, float* xn, i8* q0_q, float* q0_d,
                                                                   i8* qk_q, float* qk_d, i16* qk_bs, float* mix,
                                                                   u32* counter, const float* hc, const u16* fn_w,
                                                                   const float* scale, const float* base,
                                                                   const float* norm_w, u32 n_embd, u32 n_hc,
                                                                   u32 iters, float eps_rms, float eps_hc,
                                                                   float eps_norm) {
    ds4_grid_sync();
    __shared__ float xs[4096];
    __shared__ u32 is_last;
    const u32 t = blockIdx.y;
    const u32 n_mix = 2 * n_hc + n_hc * n_hc;
    if (n_embd > 4096) return;
    hc_mix_block(mix, hc, fn_w, n_hc * n_embd, n_mix, eps_rms);
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

// Output-head HC reduction (docs/model.md#output-head, up to y): with mix from ds4_hc_mix (n_mix = n_hc,
// fn = output_hc_fn, eps = the model's RMS eps), w_h = stable_sigmoid(mix[h] * scale[0] + base[h]) +
// eps_hc, x_out[t][d] = sum_h X[h][d] * w_h. The following RMSNorm * output_norm and the Q8_0
// quantization are ds4_rms_norm_quant.
// Launch: grid (n_tok), block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_hc_head_finish(float* x_out, const float* mix, const float* hc,
                                                                     const float* scale, const float* base,
                                                                     u32 n_embd, u32 n_hc, float eps_hc) {
    ds4_grid_sync();
    const u32 t = blockIdx.x;
    float wh[DS4_HC_MAX];
#pragma unroll
    for (u32 h = 0; h < DS4_HC_MAX; ++h)
        wh[h] = h < n_hc ? stable_sigmoid(mix[(u64)t * n_hc + h] * scale[0] + base[h]) + eps_hc : 0.0f;
    const float* x = hc + (u64)t * n_hc * n_embd;
    for (u32 d = threadIdx.x; d < n_embd; d += DS4_BLOCK) {
        float v = 0.0f;
        for (u32 h = 0; h < n_hc; ++h) v += x[(u64)h * n_embd + d] * wh[h];
        x_out[(u64)t * n_embd + d] = v;
    }
}

// HC post (docs/model.md#hc-post): X'[dst][d] = post[dst] * (y[d] + y2[d]) + sum_src M[src][dst] * X[src][d]
// with post and M from split (ds4_hc_pre_finish's layout); y2 may be null (the FFN passes the
// routed and the shared expert outputs as y and y2, docs/model.md#shared-expert). hc_out may equal hc_in.
// Launch: grid (ceil(n_embd / 256), n_tok), block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_hc_post(float* hc_out, const float* hc_in, const float* y,
                                                              const float* y2, const float* split, u32 n_embd,
                                                              u32 n_hc) {
    ds4_grid_sync();
    const u32 t = blockIdx.y;
    const u32 d = blockIdx.x * DS4_BLOCK + threadIdx.x;
    if (d >= n_embd || n_hc > DS4_HC_MAX) return;
    const u32 n_mix = 2 * n_hc + n_hc * n_hc;
    const float* sp = split + (u64)t * n_mix;
    const u64 base = (u64)t * n_hc * n_embd + d;
    float yv = y[(u64)t * n_embd + d];
    if (y2) yv += y2[(u64)t * n_embd + d];
    float old[DS4_HC_MAX];
#pragma unroll
    for (u32 h = 0; h < DS4_HC_MAX; ++h) old[h] = h < n_hc ? hc_in[base + (u64)h * n_embd] : 0.0f;
#pragma unroll
    for (u32 dst = 0; dst < DS4_HC_MAX; ++dst) {
        if (dst >= n_hc) break;
        float v = sp[n_hc + dst] * yv;
        for (u32 src = 0; src < n_hc; ++src) v += sp[2 * n_hc + n_hc * src + dst] * old[src];
        hc_out[base + (u64)dst * n_embd] = v;
    }
}
