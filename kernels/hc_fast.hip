// Hyper-connections, fast arithmetic (docs/arithmetic.md): the HC pre step of ds4_hc_pre_fused and
// the HC post step, in a GPU-friendly order with the model's math.
//
// ds4_hc_pre_fused_fast: each mix row's block has every thread load 8-column strips of the n_hc
// streams (16-byte loads of fn and X, all issued at once, FMA) and folds the partial dots and the
// state's sum of squares as trees; the RMS scale multiplies the finished dot (fn · (X s) =
// s (fn · X)). The strips stay in registers, laid out as the sublayer input's strips (thread i,
// columns 8 (i + 256 k) of every stream), so the last block of a token finishes without reading X
// again: the weighted stream sum is per thread, the sublayer's input norm is one f32 tree and the
// quantization is kernels/norm_quant_fast.hip's. The Sinkhorn split (16 lanes of the first warp, one
// matrix entry each, row and column sums as pairwise shuffle trees) runs in another block, the last
// of the post and comb rows' blocks, beside the norm and quantization (after them in the block that
// stores the state in place, and in the one-block-per-token form).
// Deterministic: the same inputs give the same bits on every run.
#pragma once
#include "hc.hip"
#include "norm_quant_fast.hip"

// Strips per thread per stream: n_embd <= DS4_HCF_SLOTS * 8 * DS4_BLOCK = 4096.
#define DS4_HCF_SLOTS 2

// acc + the dot of 8 F16 weights (one 16-byte load) with 8 floats.
DS4_DEV float dot8_f16_fma(uint4 wv, const float x[8], float acc) {
    acc = fmaf(f16_to_f32((u16)(wv.x & 0xffff)), x[0], acc);
    acc = fmaf(f16_to_f32((u16)(wv.x >> 16)), x[1], acc);
    acc = fmaf(f16_to_f32((u16)(wv.y & 0xffff)), x[2], acc);
    acc = fmaf(f16_to_f32((u16)(wv.y >> 16)), x[3], acc);
    acc = fmaf(f16_to_f32((u16)(wv.z & 0xffff)), x[4], acc);
    acc = fmaf(f16_to_f32((u16)(wv.z >> 16)), x[5], acc);
    acc = fmaf(f16_to_f32((u16)(wv.w & 0xffff)), x[6], acc);
    return fmaf(f16_to_f32((u16)(wv.w >> 16)), x[7], acc);
}

// The pre weight of stream h from its mix logit: sigmoid(m * scale + base) + eps_hc.
DS4_DEV float hc_pre_weight(float m, float scale, float base, float eps_hc) {
    return plain_sigmoid(m * scale + base) + eps_hc;
}

// The split of one token (hc.hip hc_split_one's math: sigmoid gates, row softmax + eps_hc, then
// iters x (row pass from the second on, column pass), each scaling by 1 / (sum + eps_hc)) by the
// first 16 lanes of one warp: lane 4a + b holds M[a][b] (zero outside the n x n matrix, n = n_hc
// <= 4) and gets row and column sums as pairwise trees of shuffles (xor 1, 2 within a row; xor 4, 8
// within a column), the same values the one-thread trees (v0 + v1) + (v2 + v3) give, since adding a
// zero pad or swapping two addends changes no bits. One thread doing it all is a chain of hundreds
// of dependent operations (hc.hip hc_split_warp), which keeps one block running long after the
// others have finished. The whole 4 x 4 matrix in every lane's registers would give the same trees
// and bits but costs registers the fused launch needs.
// mix: the token's n_mix logits (shared memory); split_out = [pre | post | M]. The lane's constants
// (HcSplitConsts) are loaded before the mix exists. Call from every lane of the warp.
struct HcSplitConsts {
    float sc_pre, sc_post, base_pre, base_post, sc_m, base_m;
};

DS4_DEV HcSplitConsts hc_split_consts(const float* scale, const float* base, u32 n) {
    const u32 lane = lane_id(), a = (lane / 4) % 4, b = lane % 4;
    HcSplitConsts c;
    c.sc_pre = lane < n ? scale[0] : 0.0f;
    c.sc_post = lane < n ? scale[1] : 0.0f;
    c.base_pre = lane < n ? base[lane] : 0.0f;
    c.base_post = lane < n ? base[n + lane] : 0.0f;
    c.sc_m = scale[2];
    const bool live = lane < 16 && a < n && b < n;
    c.base_m = live ? base[2 * n + n * a + b] : 0.0f;
    return c;
}

// with_pre = false leaves the pre weights (and mix[0, n)) to the caller.
DS4_DEV void hc_split_fast(float* split_out, const float* mix, HcSplitConsts c, u32 n, u32 iters, float eps_hc,
                           bool with_pre) {
    const u32 lane = lane_id(), a = (lane / 4) % 4, b = lane % 4;
    if (lane < n) {
        if (with_pre) split_out[lane] = hc_pre_weight(mix[lane], c.sc_pre, c.base_pre, eps_hc);
        split_out[n + lane] = 2.0f * plain_sigmoid(mix[n + lane] * c.sc_post + c.base_post);
    }
    const bool live = lane < 16 && a < n && b < n;
    const u32 k = 2 * n + n * a + b;
    const float z = live ? mix[k] * c.sc_m + c.base_m : -1.0e30f;
    auto row_max = [](float v) {
        v = fmaxf(v, __shfl_xor(v, 1, DS4_WARP));
        return fmaxf(v, __shfl_xor(v, 2, DS4_WARP));
    };
    auto row_sum = [](float v) {
        v += __shfl_xor(v, 1, DS4_WARP);
        return v + __shfl_xor(v, 2, DS4_WARP);
    };
    auto col_sum = [](float v) {
        v += __shfl_xor(v, 4, DS4_WARP);
        return v + __shfl_xor(v, 8, DS4_WARP);
    };
    const float mx = row_max(z);
    const float e = live ? ds4_expf(z - mx) : 0.0f;
    const float inv0 = 1.0f / row_sum(e);
    float m = live ? fmaf(e, inv0, eps_hc) : 0.0f;
    for (u32 it = 0; it < iters; ++it) {
        if (it > 0) m *= 1.0f / (row_sum(m) + eps_hc);
        m *= 1.0f / (col_sum(m) + eps_hc);
    }
    if (live) split_out[k] = m;
}

// HC post of a token's strips (ds4_hc_post_fast's arithmetic): X'[b] = post[b] * (y + y2) +
// sum_a M[a][b] X[a] (a in order, FMA), for the thread's strips xv[k][a][j] in place.
template <int S, int H>
DS4_DEV void hc_post_strips(float xv[S][H][8], const float* y, const float* y2, const float* sp, u32 n_embd,
                            u32 n_hc) {
    float post[H], m[H][H];
#pragma unroll
    for (int a = 0; a < H; ++a) {
        post[a] = (u32)a < n_hc ? sp[n_hc + a] : 0.0f;
#pragma unroll
        for (int b = 0; b < H; ++b) m[a][b] = (u32)a < n_hc && (u32)b < n_hc ? sp[2 * n_hc + n_hc * a + b] : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < S; ++k) {
        const u32 i0 = nqf_start(k);
        float yv[8], y2v[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) yv[j] = 0.0f, y2v[j] = 0.0f;
        if (i0 < n_embd) {
            load8(yv, y + i0);
            if (y2) load8(y2v, y2 + i0);
        }
        if (y2)
#pragma unroll
            for (int j = 0; j < 8; ++j) yv[j] += y2v[j];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            float out[H];
#pragma unroll
            for (int b = 0; b < H; ++b) {
                float v = post[b] * yv[j];
#pragma unroll
                for (int a = 0; a < H; ++a) v = fmaf(m[a][b], xv[k][a][j], v);
                out[b] = v;
            }
#pragma unroll
            for (int b = 0; b < H; ++b) xv[k][b][j] = (u32)b < n_hc ? out[b] : 0.0f;
        }
    }
}

// The thread's strips of fn row w (16-byte loads; zeros past n_embd and n_hc).
template <int S, int H>
DS4_DEV void hc_row_load(uint4 wv[S][H], const u16* w, u32 n_embd, u32 n_hc) {
#pragma unroll
    for (int k = 0; k < S; ++k)
#pragma unroll
        for (int h = 0; h < H; ++h)
            wv[k][h] = nqf_start(k) < n_embd && (u32)h < n_hc ? *(const uint4*)(w + (u64)h * n_embd + nqf_start(k))
                                                              : make_uint4(0, 0, 0, 0);
}

// The per-thread partial of a mix row's dot: streams in order, strips in order within a stream.
template <int S, int H>
DS4_DEV float hc_row_dot(const uint4 wv[S][H], const float xv[S][H][8]) {
    float dot = 0.0f;
#pragma unroll
    for (int h = 0; h < H; ++h)
#pragma unroll
        for (int k = 0; k < S; ++k) dot = dot8_f16_fma(wv[k][h], xv[k][h], dot);
    return dot;
}

// The HC pre step of token blockIdx.y (see the file comment). PER_TOKEN = false: the block computes
// mix row blockIdx.x, and the token's last blocks by the per-token counter finish the token (the
// other blocks have read the state by then: they count themselves done only after their dots): the
// last pre row's block the sublayer input, the last other row's block the split, or, when the state
// is stored in place, the last block both.
// PER_TOKEN = true (grid (1, n_tok)): the block computes every mix row, folding each row's partials
// as block_sum does (width-32 butterfly, then the group totals in order), so each mix value has the
// bits of the one-row blocks', and finishes the token itself; the counter is not touched. One block
// per token reads the token's state once instead of n_mix times: prefill's shape (docs/arithmetic.md).
// With POST, the state hc is first advanced by the previous sublayer's HC post (y, y2, post_split:
// ds4_hc_post's arguments) in every block, and stored to hc_out: in place (hc_out == hc) by the
// finishing block once every block has read hc; out of place by every block, its share of the
// strips, as soon as it has them (otherwise the finishing block's 64 KB store is a serial tail of
// the launch).
template <bool POST, bool PER_TOKEN>
DS4_DEV void hc_pre_fast(float* split_out, float* xn, i8* q0_q, float* q0_d, i8* qk_q, float* qk_d, i16* qk_bs,
                         float* mix, u32* counter, const float* hc, float* hc_out, const float* y, const float* y2,
                         const float* post_split, const u16* fn_w, const float* scale, const float* base,
                         const float* norm_w, u32 n_embd, u32 n_hc, u32 iters, float eps_rms, float eps_hc,
                         float eps_norm) {
    constexpr int S = DS4_HCF_SLOTS, H = DS4_HC_MAX;
    __shared__ float scratch[DS4_GROUPS32];
    __shared__ float smix[DS4_HC_MAX_MIX];
    __shared__ u32 is_last;
    const u32 t = blockIdx.y;
    const u32 n_mix = 2 * n_hc + n_hc * n_hc, n_in = n_hc * n_embd;
    if (n_embd > S * 8 * DS4_BLOCK || n_hc > H) {
        ds4_grid_sync();
        return;
    }
    const float* x = hc + (u64)t * n_in;
    float* xo = POST ? hc_out + (u64)t * n_in : nullptr;
    const bool share_store = POST && !PER_TOKEN && hc_out != hc;
    // The weights first: the strips of norm_w for the finish, the one-row block's fn strips and the
    // finish's constants, loaded before the wait for the previous launch (prelude.h ds4_grid_sync)
    // so that their latency hides behind it and the dots; then the strips of X, all in flight.
    float xv[S][H][8], nw[S][8];
#pragma unroll
    for (int k = 0; k < S; ++k) {
#pragma unroll
        for (int j = 0; j < 8; ++j) nw[k][j] = 1.0f;
        if (nqf_start(k) < n_embd) load8(nw[k], norm_w + nqf_start(k));
    }
    uint4 wv[S][H];
    if constexpr (!PER_TOKEN) hc_row_load<S, H>(wv, fn_w + (u64)blockIdx.x * n_in, n_embd, n_hc);
    float base_pre[H];
#pragma unroll
    for (int h = 0; h < H; ++h) base_pre[h] = (u32)h < n_hc ? base[h] : 0.0f;
    const float scale_pre = scale[0];
    const HcSplitConsts split_consts = hc_split_consts(scale, base, n_hc);
    ds4_grid_sync();
#pragma unroll
    for (int k = 0; k < S; ++k) {
        const u32 i0 = nqf_start(k);
        const bool live = i0 < n_embd;
#pragma unroll
        for (int h = 0; h < H; ++h) {
#pragma unroll
            for (int j = 0; j < 8; ++j) xv[k][h][j] = 0.0f;
            if (live && (u32)h < n_hc) load8(xv[k][h], x + (u64)h * n_embd + i0);
        }
    }
    if (POST)
        hc_post_strips<S, H>(xv, y + (u64)t * n_embd, y2 ? y2 + (u64)t * n_embd : y2, post_split + (u64)t * n_mix,
                             n_embd, n_hc);
    if (share_store) {
        // Strip (k, h) of thread i is the block's when (k H + h) 256 + i is blockIdx.x modulo n_mix.
#pragma unroll
        for (int k = 0; k < S; ++k)
#pragma unroll
            for (int h = 0; h < H; ++h) {
                const u32 strip = ((u32)k * H + (u32)h) * DS4_BLOCK + threadIdx.x;
                if (nqf_start(k) < n_embd && (u32)h < n_hc && strip % n_mix == blockIdx.x)
                    store8(xo + (u64)h * n_embd + nqf_start(k), xv[k][h]);
            }
    }
    float ss = 0.0f;
#pragma unroll
    for (int h = 0; h < H; ++h) {
        float xs[S][8];
#pragma unroll
        for (int k = 0; k < S; ++k)
#pragma unroll
            for (int j = 0; j < 8; ++j) xs[k][j] = xv[k][h][j];
        ss += strips_sumsq<S>(xs);
    }
    bool finish_split = true;  // this block also runs the split (one finisher)
    if constexpr (PER_TOKEN) {
        // Group totals of every row's partial and of ss (block_sum's first half, all rows at once).
        __shared__ float groups[DS4_HC_MAX_MIX + 1][DS4_GROUPS32];
        // Row o + 1's strips are loaded while row o is folded (the last row is loaded twice).
        uint4 row[S][H];
        hc_row_load<S, H>(row, fn_w, n_embd, n_hc);
        for (u32 o = 0; o < n_mix; ++o) {
            uint4 next[S][H];
            hc_row_load<S, H>(next, fn_w + (u64)min(o + 1, n_mix - 1) * n_in, n_embd, n_hc);
            const float g = group32_sum(hc_row_dot<S, H>(row, xv));
            if (threadIdx.x % 32 == 0) groups[o][threadIdx.x / 32] = g;
#pragma unroll
            for (int k = 0; k < S; ++k)
#pragma unroll
                for (int h = 0; h < H; ++h) row[k][h] = next[k][h];
        }
        const float gss = group32_sum(ss);
        if (threadIdx.x % 32 == 0) groups[DS4_HC_MAX_MIX][threadIdx.x / 32] = gss;
        __syncthreads();
        if (threadIdx.x < n_mix) {
            float dot = 0.0f, tss = 0.0f;
#pragma unroll
            for (int g = 0; g < DS4_GROUPS32; ++g) {
                dot += groups[threadIdx.x][g];
                tss += groups[DS4_HC_MAX_MIX][g];
            }
            const float m = dot * (1.0f / sqrtf(tss / (float)n_in + eps_rms));
            mix[(u64)t * n_mix + threadIdx.x] = m;
            smix[threadIdx.x] = m;
        }
        __syncthreads();
    } else {
        const float dot = block_sum(hc_row_dot<S, H>(wv, xv), scratch);
        ss = block_sum(ss, scratch);
        if (threadIdx.x == 0) mix[(u64)t * n_mix + blockIdx.x] = dot * (1.0f / sqrtf(ss / (float)n_in + eps_rms));
        __threadfence();
        __syncthreads();
        // Two finishers when no block stores the state after the others have read it (share_store,
        // or no post): the last of the n_hc pre rows' blocks finishes the sublayer input (it needs
        // only the pre logits) while the last of the other rows' blocks runs the split of the post
        // and comb weights, so the split's chain and the quantization overlap instead of following
        // each other. One counter word: pre rows count in the low half, the others in the high
        // half; the block that completes both resets it (every atomic of the token is done then).
        const bool two = !POST || share_store;
        const bool pre_row = blockIdx.x < n_hc;
        const u32 inc = two && !pre_row ? 1u << 16 : 1u;
        const u32 full = two ? n_hc + ((n_mix - n_hc) << 16) : n_mix;
        if (threadIdx.x == 0) {
            const u32 now = atomicAdd(&counter[t], inc) + inc;
            const bool group_done = !two      ? now == full
                                    : pre_row ? (now & 0xffffu) == n_hc
                                              : (now >> 16) == n_mix - n_hc;
            is_last = group_done ? (now == full ? 3u : 1u) : 0u;
        }
        __syncthreads();
        if (!is_last) return;
        __threadfence();
        if (threadIdx.x == 0 && is_last == 3u) counter[t] = 0;
        // The finisher's mix logits, one load each (volatile: other blocks of this launch wrote them).
        const u32 m0 = two && !pre_row ? n_hc : 0, m1 = two && pre_row ? n_hc : n_mix;
        if (threadIdx.x >= m0 && threadIdx.x < m1)
            smix[threadIdx.x] = ((const volatile float*)mix)[(u64)t * n_mix + threadIdx.x];
        __syncthreads();
        if (two && !pre_row) {
            if (warp_id() == 0)
                hc_split_fast(split_out + (u64)t * n_mix, smix, split_consts, n_hc, iters, eps_hc, false);
            return;
        }
        if (two) finish_split = false;
    }
    if (POST && !share_store) {
#pragma unroll
        for (int k = 0; k < S; ++k)
#pragma unroll
            for (int h = 0; h < H; ++h)
                if (nqf_start(k) < n_embd && (u32)h < n_hc) store8(xo + (u64)h * n_embd + nqf_start(k), xv[k][h]);
    }
    float pre[H];
#pragma unroll
    for (int h = 0; h < H; ++h) pre[h] = (u32)h < n_hc ? hc_pre_weight(smix[h], scale_pre, base_pre[h], eps_hc) : 0.0f;
    float v[S][8];
#pragma unroll
    for (int k = 0; k < S; ++k)
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            float a = xv[k][0][j] * pre[0];
#pragma unroll
            for (int h = 1; h < H; ++h) a = fmaf(xv[k][h][j], pre[h], a);
            v[k][j] = a;
        }
    const float sc = 1.0f / sqrtf(block_sum(strips_sumsq<S>(v), scratch) / (float)n_embd + eps_norm);
#pragma unroll
    for (int k = 0; k < S; ++k)
#pragma unroll
        for (int j = 0; j < 8; ++j) v[k][j] = v[k][j] * sc * nw[k][j];
    nqf_store_row<S>(t, v, n_embd, xn, q0_q, q0_d, qk_q, qk_d, qk_bs);
    if (finish_split) {
        if (warp_id() == 0) hc_split_fast(split_out + (u64)t * n_mix, smix, split_consts, n_hc, iters, eps_hc, true);
    } else if (threadIdx.x < n_hc) {
        // The split's pre weights (hc_split_fast leaves them to this block).
        const u32 h = threadIdx.x;
        split_out[(u64)t * n_mix + h] = hc_pre_weight(smix[h], scale_pre, base[h], eps_hc);
    }
}

// ds4_hc_pre_fused's arguments, outputs and launch (grid (n_mix, n_tok), block 256; the last block
// of a token, by the per-token counter, finishes it). Preconditions (kernels::fast_twin checks them):
// n_embd % 8 == 0, n_embd <= 4096, n_hc <= 4, every pointer 16-byte aligned.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_hc_pre_fused_fast(
    float* split_out, float* xn, i8* q0_q, float* q0_d, i8* qk_q, float* qk_d, i16* qk_bs, float* mix, u32* counter,
    const float* hc, const u16* fn_w, const float* scale, const float* base, const float* norm_w, u32 n_embd,
    u32 n_hc, u32 iters, float eps_rms, float eps_hc, float eps_norm) {
    hc_pre_fast<false, false>(split_out, xn, q0_q, q0_d, qk_q, qk_d, qk_bs, mix, counter, hc, nullptr, nullptr,
                              nullptr, nullptr, fn_w, scale, base, norm_w, n_embd, n_hc, iters, eps_rms, eps_hc,
                              eps_norm);
}

// A sublayer's HC post and the next sublayer's HC pre in one launch (fast mode only; the exact
// sequence launches ds4_hc_post then ds4_hc_pre_fused): ds4_hc_pre_fused_fast's arguments and grid,
// plus ds4_hc_post's: the state read from hc_in and written to hc_out (the same buffer or another),
// y, y2 (may be null) and post_split. Every output has the bits of ds4_hc_post_fast followed by
// ds4_hc_pre_fused_fast.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_hc_post_pre_fast(
    float* split_out, float* xn, i8* q0_q, float* q0_d, i8* qk_q, float* qk_d, i16* qk_bs, float* mix, u32* counter,
    const float* hc_in, float* hc_out, const float* y, const float* y2, const float* post_split, const u16* fn_w,
    const float* scale, const float* base, const float* norm_w, u32 n_embd, u32 n_hc, u32 iters, float eps_rms,
    float eps_hc, float eps_norm) {
    hc_pre_fast<true, false>(split_out, xn, q0_q, q0_d, qk_q, qk_d, qk_bs, mix, counter, hc_in, hc_out, y, y2,
                             post_split, fn_w, scale, base, norm_w, n_embd, n_hc, iters, eps_rms, eps_hc, eps_norm);
}

// ds4_hc_pre_fused_fast and ds4_hc_post_pre_fast with one block per token (grid (1, n_tok), block
// 256): the same arguments and the same bits in every output; counter is not used. Launched for
// batches of tokens (kernels::fast_twin: HC_TOKEN_BLOCKS_MIN_TOKENS).
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_hc_pre_token_fast(
    float* split_out, float* xn, i8* q0_q, float* q0_d, i8* qk_q, float* qk_d, i16* qk_bs, float* mix, u32* counter,
    const float* hc, const u16* fn_w, const float* scale, const float* base, const float* norm_w, u32 n_embd,
    u32 n_hc, u32 iters, float eps_rms, float eps_hc, float eps_norm) {
    hc_pre_fast<false, true>(split_out, xn, q0_q, q0_d, qk_q, qk_d, qk_bs, mix, counter, hc, nullptr, nullptr, nullptr,
                             nullptr, fn_w, scale, base, norm_w, n_embd, n_hc, iters, eps_rms, eps_hc, eps_norm);
}
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_hc_post_pre_token_fast(
    float* split_out, float* xn, i8* q0_q, float* q0_d, i8* qk_q, float* qk_d, i16* qk_bs, float* mix, u32* counter,
    const float* hc_in, float* hc_out, const float* y, const float* y2, const float* post_split, const u16* fn_w,
    const float* scale, const float* base, const float* norm_w, u32 n_embd, u32 n_hc, u32 iters, float eps_rms,
    float eps_hc, float eps_norm) {
    hc_pre_fast<true, true>(split_out, xn, q0_q, q0_d, qk_q, qk_d, qk_bs, mix, counter, hc_in, hc_out, y, y2,
                            post_split, fn_w, scale, base, norm_w, n_embd, n_hc, iters, eps_rms, eps_hc, eps_norm);
}

// ds4_hc_post's arguments, outputs and launch (grid (ceil(n_embd / 256), n_tok), block 256), with
// the split and the old streams loaded before any store (hc_out may alias hc_in, so the exact
// kernel reloads the split after each stream's store) and FMA. n_hc <= 4.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_hc_post_fast(float* hc_out, const float* hc_in, const float* y,
                                                                   const float* y2, const float* split, u32 n_embd,
                                                                   u32 n_hc) {
    ds4_grid_sync();
    constexpr int H = DS4_HC_MAX;
    const u32 t = blockIdx.y;
    const u32 d = blockIdx.x * DS4_BLOCK + threadIdx.x;
    if (d >= n_embd || n_hc > H) return;
    const u32 n_mix = 2 * n_hc + n_hc * n_hc;
    const float* sp = split + (u64)t * n_mix;
    const u64 base = (u64)t * n_hc * n_embd + d;
    float post[H], m[H][H], old[H];
#pragma unroll
    for (int a = 0; a < H; ++a) {
        const bool live = (u32)a < n_hc;
        post[a] = live ? sp[n_hc + a] : 0.0f;
        old[a] = live ? hc_in[base + (u64)a * n_embd] : 0.0f;
#pragma unroll
        for (int b = 0; b < H; ++b) m[a][b] = live && (u32)b < n_hc ? sp[2 * n_hc + n_hc * a + b] : 0.0f;
    }
    float yv = y[(u64)t * n_embd + d];
    if (y2) yv += y2[(u64)t * n_embd + d];
    float out[H];
#pragma unroll
    for (int b = 0; b < H; ++b) {
        float v = post[b] * yv;
#pragma unroll
        for (int a = 0; a < H; ++a) v = fmaf(m[a][b], old[a], v);
        out[b] = v;
    }
#pragma unroll
    for (int b = 0; b < H; ++b)
        if ((u32)b < n_hc) hc_out[base + (u64)b * n_embd] = out[b];
}

// ds4_hc_mix's arguments, outputs and launch (grid (n_mix, n_tok), block 256), in the fast order:
// each thread dots 8-element strips of the row and the state (16-byte loads, a thread's strips in
// flight together, FMA) and sums the state's squares beside them; block_sum folds both, and the RMS
// scale multiplies the finished dot (fn · (X s) = s (fn · X)), as ds4_hc_pre_fused_fast does. The
// output head's mix (n_in = 16384 for Flash) without the exact kernel's 16,384-long add chain.
// Preconditions (kernels::fast_twin checks them): n_in % 8 == 0, hc and fn_w 16-byte aligned.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_hc_mix_fast(float* mix, const float* hc, const u16* fn_w,
                                                                  u32 n_in, u32 n_mix, float eps) {
    ds4_grid_sync();
    __shared__ float scratch[DS4_GROUPS32];
    const u32 o = blockIdx.x, t = blockIdx.y;
    const float* x = hc + (u64)t * n_in;
    const u16* w = fn_w + (u64)o * n_in;
    float dot = 0.0f, ss = 0.0f;
#pragma unroll 8
    for (u32 i0 = 8 * threadIdx.x; i0 < n_in; i0 += 8 * DS4_BLOCK) {
        float xv[8];
        load8(xv, x + i0);
        dot = dot8_f16_fma(*(const uint4*)(w + i0), xv, dot);
#pragma unroll
        for (int j = 0; j < 8; ++j) ss = fmaf(xv[j], xv[j], ss);
    }
    dot = block_sum(dot, scratch);
    ss = block_sum(ss, scratch);
    if (threadIdx.x == 0) mix[(u64)t * n_mix + o] = dot * (1.0f / sqrtf(ss / (float)n_in + eps));
}
