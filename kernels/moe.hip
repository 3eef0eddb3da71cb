// Mixture of experts: router and routed experts (docs/model.md#moe). Expert ids and weights stay in device
// buffers (sel / selw) so a decode step needs no host synchronisation between router and experts.
#pragma once
#include "formats.h"

#define DS4_MOE_ROWS 8  // output rows per block
#define DS4_MOE_MAX_USED 8  // experts per token the per-token kernels handle (Flash: 6)

// The router's per-expert probabilities prob_e and selection scores prob_e + bias_e, every thread of
// the block a strided share (shared by ds4_router and its fast twin).
DS4_DEV void router_probs(float* prob, float* score, const float* lg, const float* bias, u32 n_expert) {
    for (u32 e = threadIdx.x; e < n_expert; e += DS4_BLOCK) {
        const float z = lg[e];
        const float sp = z > 20.0f ? z : (z < -20.0f ? ds4_expf(z) : ds4_log1pf(ds4_expf(z)));
        const float p = sqrtf(sp);
        prob[e] = p;
        score[e] = bias ? p + bias[e] : p;
    }
}

// A hash layer's experts for token id `token` (out-of-range entries become expert 0): threads
// 0 .. n_used - 1 write chosen.
DS4_DEV void router_hashed(u32* chosen, const i32* tid2eid, u32 token, u32 n_expert, u32 n_used) {
    if (threadIdx.x < n_used) {
        const i32 e = tid2eid[(u64)token * n_used + threadIdx.x];
        chosen[threadIdx.x] = (e < 0 || (u32)e >= n_expert) ? 0u : (u32)e;
    }
}

// The chosen experts' ids and weights of one token, by one thread. Sum and normalisation grouped as
// ds4's compiled code does (and the CPU reference): pairwise for 6 experts, and p * scale * (1/sum)
// rather than p / sum * scale.
DS4_DEV void router_weights(u32* sel, float* selw, const float* prob, const u32* chosen, u32 n_used,
                            float weight_scale) {
    float sum = 0.0f;
    if (n_used == 6) {
        const float* p6 = prob;
        sum = ((p6[chosen[0]] + p6[chosen[1]]) + (p6[chosen[2]] + p6[chosen[3]])) + (p6[chosen[4]] + p6[chosen[5]]);
    } else {
        for (u32 k = 0; k < n_used; ++k) sum += prob[chosen[k]];
    }
    const float inv = 1.0f / fmaxf(sum, 6.103515625e-5f);
    for (u32 k = 0; k < n_used; ++k) {
        sel[k] = chosen[k];
        selw[k] = prob[chosen[k]] * weight_scale * inv;
    }
}

// Router for one token per block (docs/model.md#router):
//   prob_e = sqrt(softplus(logit_e)), softplus(z) = z if z > 20, exp(z) if z < -20, else log1p(exp(z));
//   hash layers (tid2eid != null): experts = tid2eid[token * n_used + i], i < n_used (as stored);
//   otherwise the n_used highest prob_e + bias_e (bias may be null) in descending order, ties to the
//   lower expert index; weights = prob * weight_scale / max(sum of selected probs, 6.103515625e-5)
//   (always the unbiased probs).
// logits: f32 [n_tok][n_expert]; tokens: u32 [n_tok] (read only for hash layers);
// sel: u32 [n_tok][n_used]; selw: f32 [n_tok][n_used]. n_expert <= 1024, n_used <= 16.
// Launch: grid (n_tok), block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_router(u32* sel, float* selw, const float* logits,
                                                             const float* bias, const i32* tid2eid,
                                                             const u32* tokens, u32 n_expert, u32 n_used,
                                                             float weight_scale, u32 n_tok) {
    ds4_grid_sync();
    __shared__ float prob[1024];
    __shared__ float score[1024];
    __shared__ float wbest[DS4_WARPS_PER_BLOCK];
    __shared__ int ibest[DS4_WARPS_PER_BLOCK];
    __shared__ u32 chosen[16];
    const u32 t = blockIdx.x;
    if (t >= n_tok) return;
    router_probs(prob, score, logits + (u64)t * n_expert, bias, n_expert);
    __syncthreads();
    if (tid2eid) {
        router_hashed(chosen, tid2eid, tokens[t], n_expert, n_used);
        __syncthreads();
    } else {
        for (u32 k = 0; k < n_used; ++k) {
            float best = -INFINITY;
            int bi = 0x7fffffff;
            for (u32 e = threadIdx.x; e < n_expert; e += DS4_BLOCK) {
                const float s = score[e];
                if (s > best || (s == best && (int)e < bi)) {
                    best = s;
                    bi = (int)e;
                }
            }
#pragma unroll
            for (int o = DS4_WARP / 2; o > 0; o >>= 1) {
                const float ob = __shfl_xor(best, o, DS4_WARP);
                const int oi = __shfl_xor(bi, o, DS4_WARP);
                if (ob > best || (ob == best && oi < bi)) {
                    best = ob;
                    bi = oi;
                }
            }
            if (lane_id() == 0) {
                wbest[warp_id()] = best;
                ibest[warp_id()] = bi;
            }
            __syncthreads();
            if (threadIdx.x == 0) {
                float b = wbest[0];
                int i = ibest[0];
                for (int wv = 1; wv < DS4_WARPS_PER_BLOCK; ++wv) {
                    if (wbest[wv] > b || (wbest[wv] == b && ibest[wv] < i)) {
                        b = wbest[wv];
                        i = ibest[wv];
                    }
                }
                if (i < 0 || (u32)i >= n_expert) i = 0;  // all scores NaN: degenerate but in bounds
                chosen[k] = (u32)i;
                score[i] = -INFINITY;
            }
            __syncthreads();
        }
    }
    if (threadIdx.x == 0)
        router_weights(sel + (u64)t * n_used, selw + (u64)t * n_used, prob, chosen, n_used, weight_scale);
}

// Routed gate/up + SwiGLU for the selected experts (docs/model.md#routed-experts):
//   mid[t][k][r] = swiglu(gate_e[r] · x_t, up_e[r] · x_t) * selw[t][k],  e = sel[t][k]
// gate/up: 3-D expert tensors [n_in, n_ff, n_expert] of format T (expert e's matrix starts at
// e * n_ff * row_bytes, docs/model.md#tensor-conventions); x: Q8_K activation of the ffn_norm output, n_in per
// token. mid: f32 [n_tok][n_used][n_ff]. Each dot is the reference's (formats.h), the gate and up chains
// of a row interleaved.
// Launch: grid (ceil(n_ff / 8), n_used, n_tok), block 256.
template <int T>
DS4_DEV void moe_gate_up_body(float* mid, const u8* gate, const u8* up, const i8* xq, const float* xd,
                              const i16* xbs, const u32* sel, const float* selw, u32 n_in, u32 n_ff, u32 n_used,
                              float limit) {
    __shared__ u64 sgrid[256];
    DS4_CHAIN_SHARED(chain);
    if constexpr (T == DS4_T_IQ2_XXS) {
        stage_iq2_grid(sgrid);
        __syncthreads();
    }
    const u32 k = blockIdx.y, t = blockIdx.z;
    const u32 e = sel[(u64)t * n_used + k];
    const float wk = selw[(u64)t * n_used + k];
    const u64 rb = row_bytes<T>(n_in);
    const u8* ge = gate + (u64)e * n_ff * rb;
    const u8* ue = up + (u64)e * n_ff * rb;
    const i8* xr = xq + (u64)t * n_in;
    const float* dr = xd + (u64)t * (n_in / 256);
    const i16* br = xbs + (u64)t * (n_in / 16);
    for (u32 r = blockIdx.x * DS4_MOE_ROWS + warp_id(); r < min((blockIdx.x + 1) * DS4_MOE_ROWS, n_ff);
         r += DS4_WARPS_PER_BLOCK) {
        const u8* wr[2] = {ge + r * rb, ue + r * rb};
        float gu[2];
        warp_dot_rows_k<T, 2>(wr, 2, xr, dr, br, 0, n_in, sgrid, (float*)chain[warp_id()], gu);
        if (lane_id() == 0) mid[((u64)t * n_used + k) * n_ff + r] = swiglu_clamped(gu[0], gu[1], limit) * wk;
    }
}

// Routed down projection summed over the selected experts in slot order (docs/model.md#routed-experts):
//   out[t][r] = ((0 + down_e0[r] · m_{t,0}) + down_e1[r] · m_{t,1}) + ...,  e_k = sel[t][k]
// down: [n_ff, n_out, n_expert] of format T; m: Q8_K activation rows of the route-weighted mids,
// row (t * n_used + k), n_ff per row. out: f32 [n_tok][n_out]. n_used <= DS4_MOE_MAX_USED. The
// slots' rows are walked together (their loads in flight at once, their chains interleaved); each
// slot's dot is the reference's, then the slots are added in order.
// Launch: grid (ceil(n_out / 8), n_tok), block 256.
template <int T>
DS4_DEV void moe_down_body(float* out, const u8* down, const i8* mq, const float* md, const i16* mbs,
                           const u32* sel, u32 n_ff, u32 n_out, u32 n_used) {
    __shared__ u64 sgrid[256];
    DS4_CHAIN_SHARED(chain);
    if constexpr (T == DS4_T_IQ2_XXS) {
        stage_iq2_grid(sgrid);
        __syncthreads();
    }
    const u32 t = blockIdx.y;
    const u64 rb = row_bytes<T>(n_ff);
    const u32 nu = min(n_used, (u32)DS4_MOE_MAX_USED);
    for (u32 r = blockIdx.x * DS4_MOE_ROWS + warp_id(); r < min((blockIdx.x + 1) * DS4_MOE_ROWS, n_out);
         r += DS4_WARPS_PER_BLOCK) {
        float part[DS4_MOE_MAX_USED];
        const u8* wr[DS4_MOE_MAX_USED];
#pragma unroll
        for (u32 k = 0; k < DS4_MOE_MAX_USED; ++k)
            wr[k] = k < nu ? down + ((u64)sel[(u64)t * n_used + k] * n_out + r) * rb : nullptr;
        // Slot k's activation is row t * n_used + k: consecutive rows, n_ff elements apart.
        warp_dot_rows_k<T, DS4_MOE_MAX_USED>(wr, nu, mq + (u64)t * n_used * n_ff,
                                             md + (u64)t * n_used * (n_ff / 256), mbs + (u64)t * n_used * (n_ff / 16),
                                             n_ff, n_ff, sgrid, (float*)chain[warp_id()], part);
        float acc = 0.0f;
#pragma unroll
        for (u32 k = 0; k < DS4_MOE_MAX_USED; ++k)
            if (k < nu) acc = acc + part[k];
        if (lane_id() == 0) out[(u64)t * n_out + r] = acc;
    }
}

// The kernels for each expert format (gate/up and down may differ in format, docs/gguf.md#tensors).
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_moe_gate_up_iq2_xxs(float* mid, const u8* gate, const u8* up,
                                                                        const i8* xq, const float* xd,
                                                                        const i16* xbs, const u32* sel,
                                                                        const float* selw, u32 n_in, u32 n_ff,
                                                                        u32 n_used, float limit) {
    ds4_grid_sync();
    moe_gate_up_body<DS4_T_IQ2_XXS>(mid, gate, up, xq, xd, xbs, sel, selw, n_in, n_ff, n_used, limit);
}
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_moe_down_iq2_xxs(float* out, const u8* down, const i8* mq,
                                                                     const float* md, const i16* mbs,
                                                                     const u32* sel, u32 n_ff, u32 n_out,
                                                                     u32 n_used) {
    ds4_grid_sync();
    moe_down_body<DS4_T_IQ2_XXS>(out, down, mq, md, mbs, sel, n_ff, n_out, n_used);
}

extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_moe_gate_up_q2_k(float* mid, const u8* gate, const u8* up,
                                                                        const i8* xq, const float* xd,
                                                                        const i16* xbs, const u32* sel,
                                                                        const float* selw, u32 n_in, u32 n_ff,
                                                                        u32 n_used, float limit) {
    ds4_grid_sync();
    moe_gate_up_body<DS4_T_Q2_K>(mid, gate, up, xq, xd, xbs, sel, selw, n_in, n_ff, n_used, limit);
}
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_moe_down_q2_k(float* out, const u8* down, const i8* mq,
                                                                     const float* md, const i16* mbs,
                                                                     const u32* sel, u32 n_ff, u32 n_out,
                                                                     u32 n_used) {
    ds4_grid_sync();
    moe_down_body<DS4_T_Q2_K>(out, down, mq, md, mbs, sel, n_ff, n_out, n_used);
}

extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_moe_gate_up_q4_k(float* mid, const u8* gate, const u8* up,
                                                                        const i8* xq, const float* xd,
                                                                        const i16* xbs, const u32* sel,
                                                                        const float* selw, u32 n_in, u32 n_ff,
                                                                        u32 n_used, float limit) {
    ds4_grid_sync();
    moe_gate_up_body<DS4_T_Q4_K>(mid, gate, up, xq, xd, xbs, sel, selw, n_in, n_ff, n_used, limit);
}
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_moe_down_q4_k(float* out, const u8* down, const i8* mq,
                                                                     const float* md, const i16* mbs,
                                                                     const u32* sel, u32 n_ff, u32 n_out,
                                                                     u32 n_used) {
    ds4_grid_sync();
    moe_down_body<DS4_T_Q4_K>(out, down, mq, md, mbs, sel, n_ff, n_out, n_used);
}

// Plain (non-expert) K-quant matvec, for tests of the block formats and for any K-quant 2-D
// weight: y[t][r] = W[r] · x_t with W of format T ([n_in, n_out]) and Q8_K activations.
// Launch: grid (ceil(n_out / 8), n_tok), block 256.
template <int T>
DS4_DEV void matvec_k_body(float* y, const u8* w, const i8* xq, const float* xd, const i16* xbs, u32 n_in,
                           u32 n_out) {
    __shared__ u64 sgrid[256];
    DS4_CHAIN_SHARED(chain);
    if constexpr (T == DS4_T_IQ2_XXS) {
        stage_iq2_grid(sgrid);
        __syncthreads();
    }
    const u32 t = blockIdx.y;
    const u64 rb = row_bytes<T>(n_in);
    for (u32 r = blockIdx.x * DS4_MOE_ROWS + warp_id(); r < min((blockIdx.x + 1) * DS4_MOE_ROWS, n_out);
         r += DS4_WARPS_PER_BLOCK) {
        const u8* wr[1] = {w + r * rb};
        float s[1];
        warp_dot_rows_k<T, 1>(wr, 1, xq + (u64)t * n_in, xd + (u64)t * (n_in / 256), xbs + (u64)t * (n_in / 16), 0,
                              n_in, sgrid, (float*)chain[warp_id()], s);
        if (lane_id() == 0) y[(u64)t * n_out + r] = s[0];
    }
}
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_matvec_iq2_xxs(float* y, const u8* w, const i8* xq,
                                                                   const float* xd, const i16* xbs, u32 n_in,
                                                                   u32 n_out) {
    ds4_grid_sync();
    matvec_k_body<DS4_T_IQ2_XXS>(y, w, xq, xd, xbs, n_in, n_out);
}

extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_matvec_q2_k(float* y, const u8* w, const i8* xq,
                                                                   const float* xd, const i16* xbs, u32 n_in,
                                                                   u32 n_out) {
    ds4_grid_sync();
    matvec_k_body<DS4_T_Q2_K>(y, w, xq, xd, xbs, n_in, n_out);
}

extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_matvec_q4_k(float* y, const u8* w, const i8* xq,
                                                                   const float* xd, const i16* xbs, u32 n_in,
                                                                   u32 n_out) {
    ds4_grid_sync();
    matvec_k_body<DS4_T_Q4_K>(y, w, xq, xd, xbs, n_in, n_out);
}
