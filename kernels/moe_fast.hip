// Routed experts at decode in the fast order (docs/arithmetic.md): the moe.hip kernels' products and
// arguments, built to stream the selected experts' rows at bandwidth. A warp's "job" is the weight
// rows one output needs (gate/up: the gate and up rows of row r of expert k; down: row r of each
// selected expert), at most MoeJob::BYTES. The warp reads a job with 16-byte loads at
// consecutive addresses (the next job's loads in flight while it works on this one), stages it in
// its shared memory, and lane l unpacks chunks l, l + DS4_WARP, ... of each staged row (formats.h
// unpack_chunk) against the activation chunk of the same index, loaded once for every row that uses
// it (the gate and up rows share theirs); each chunk adds its own float term (unit_term is linear in
// the integer sums), then the warp folds its lanes. Deterministic.
#pragma once
#include "moe.hip"  // DS4_MOE_MAX_USED

#define DS4_MOE_FAST_ROWS 16                               // output rows per block (fast.rs MOE_FAST_ROWS)
#define DS4_MOE_FAST_RPW (DS4_MOE_FAST_ROWS / DS4_WARPS_PER_BLOCK)  // output rows per warp

// Bytes of weight rows per warp job, per kernel (at most; fast.rs moe_fast_job_bytes): the job's
// prefetch registers and staged words are sized for its kernel's jobs, not the largest format's.
// The Flash-shaped files' gate/up jobs (two IQ2_XXS rows of 4096 columns, 2112 bytes) fit 2560, so
// that kernel keeps 20 registers and 20 KB of shared memory fewer than at 5120 (more blocks a
// multiprocessor); their down jobs (six Q2_K rows of 2048 columns, 4032 bytes) fit 4096.
template <int T, bool DOWN>
struct MoeJob {
    static constexpr u32 BYTES = T == DS4_T_IQ2_XXS ? (DOWN ? 3584 : 2560)
                                 : T == DS4_T_Q2_K  ? (DOWN ? 4096 : 3072)
                                                    : 5120;
    static constexpr u32 WORDS = BYTES / 16;                           // 16-byte words
    static constexpr int LOADS = (int)((WORDS + DS4_WARP - 1) / DS4_WARP);  // loads per lane
};

// Loads a job of `nseg` rows of `wpr` 16-byte words each, row s at seg(s) (16-byte aligned).
template <int L, class Seg>
DS4_DEV void moe_job_load(uint4 (&v)[L], Seg seg, u32 nseg, u32 wpr) {
#pragma unroll
    for (int i = 0; i < L; ++i) {
        const u32 q = i * DS4_WARP + lane_id(), s = q / wpr;
        v[i] = s < nseg ? ((const uint4*)seg(s))[q - s * wpr] : make_uint4(0, 0, 0, 0);
    }
}

// Stages a loaded job of n_words words in the warp's shared memory.
template <int L>
DS4_DEV void moe_job_stage(uint4* job, const uint4 (&v)[L], u32 n_words) {
    ds4_sync_warp();  // the lanes' reads of the previous job are done
#pragma unroll
    for (int i = 0; i < L; ++i) {
        const u32 q = i * DS4_WARP + lane_id();
        if (q < n_words) job[q] = v[i];
    }
    ds4_sync_warp();
}

// One activation chunk (Q8_K row, chunk c): codes, the scale of its 256-element unit and, for the
// formats with mins, its two 16-element sums. Loaded once and dotted with every weight row that
// needs it (gate and up, the same chunk of both).
struct ActChunk {
    int q[8];
    float yd;
    int bs0, bs1;
};
template <int T>
DS4_DEV void load_act(ActChunk& a, const i8* xq, const float* xd, const i16* xbs, u32 c) {
    load_act_chunk(xq, c, a.q);
    a.yd = xd[c / 8];
    a.bs0 = a.bs1 = 0;
    if constexpr (T == DS4_T_Q2_K || T == DS4_T_Q4_K) {  // IQ2_XXS has no mins: its sums are unused
        const u32 bs = *(const u32*)(xbs + 2 * c);
        a.bs0 = (int)(i16)(bs & 0xffff);
        a.bs1 = (int)(i16)(bs >> 16);
    }
}

// The float term of chunk c of a staged row against its activation chunk.
template <int T>
DS4_DEV float moe_chunk_term(const u8* row, u32 c, const ActChunk& a, const u64* grid) {
    WChunk w;
    unpack_chunk<T>(row, c, w, grid);
    int isum = 0, summs = 0;
    chunk_ints(w.q, w.sc, a.q, a.bs0, a.bs1, isum, summs);
    return unit_term<T>(isum, summs, w.d, w.dmin, a.yd);
}

// The IQ2_XXS grid in the block's shared memory, staged by every thread. (Its signs stay
// arithmetic, formats.h unpack_chunk: a staged sign table measured 44 us a gate/up launch on the
// H200 against 38 us, its random reads adding to the grid's shared-memory bank conflicts;
// tests/hip-on-cuda/results/h200-2026-12-02-s10-variants.log.)
template <int T>
DS4_DEV void stage_moe_grid(u64* grid) {
    if constexpr (T == DS4_T_IQ2_XXS) {
        stage_iq2_grid(grid);
        __syncthreads();
    }
}

// ds4_moe_gate_up_<fmt> in the fast order. Preconditions (fast.rs): row bytes % 16 == 0 and two rows
// fit a job. Launch: grid (ceil(n_ff / 16), n_used, n_tok), block 256.
template <int T>
DS4_DEV void moe_gate_up_fast_body(float* mid, const u8* gate, const u8* up, const i8* xq, const float* xd,
                                   const i16* xbs, const u32* sel, const float* selw, u32 n_in, u32 n_ff,
                                   u32 n_used, float limit) {
    using Job = MoeJob<T, false>;
    __shared__ u64 sgrid[256];
    __shared__ uint4 jobs[DS4_WARPS_PER_BLOCK * Job::WORDS];
    stage_moe_grid<T>(sgrid);
    const u32 k = blockIdx.y, t = blockIdx.z;
    const u32 e = sel[(u64)t * n_used + k];
    const float wk = selw[(u64)t * n_used + k];
    const u64 rb = row_bytes<T>(n_in);
    const u32 wpr = (u32)(rb / 16), nck = n_in / 32;
    const u8* ge = gate + (u64)e * n_ff * rb;
    const u8* ue = up + (u64)e * n_ff * rb;
    const i8* xr = xq + (u64)t * n_in;
    const float* dr = xd + (u64)t * (n_in / 256);
    const i16* br = xbs + (u64)t * (n_in / 16);
    uint4* job = jobs + warp_id() * Job::WORDS;
    const u32 r0 = (blockIdx.x * DS4_WARPS_PER_BLOCK + warp_id()) * DS4_MOE_FAST_RPW;
    const u32 r1 = min(r0 + DS4_MOE_FAST_RPW, n_ff);
    if (r0 >= r1) return;  // warp-uniform; no block barrier follows
    auto rows = [&](u32 r) { return [=](u32 s) { return (s == 0 ? ge : ue) + r * rb; }; };
    uint4 v[Job::LOADS];
    moe_job_load(v, rows(r0), 2, wpr);
    for (u32 r = r0; r < r1; ++r) {
        moe_job_stage(job, v, 2 * wpr);
        if (r + 1 < r1) moe_job_load(v, rows(r + 1), 2, wpr);
        float ga = 0.0f, ua = 0.0f;
        for (u32 c = lane_id(); c < nck; c += DS4_WARP) {
            ActChunk a;
            load_act<T>(a, xr, dr, br, c);
            ga += moe_chunk_term<T>((const u8*)job, c, a, sgrid);
            ua += moe_chunk_term<T>((const u8*)job + rb, c, a, sgrid);
        }
        ga = finish_dot<T>(warp_sum(ga));
        ua = finish_dot<T>(warp_sum(ua));
        if (lane_id() == 0) mid[((u64)t * n_used + k) * n_ff + r] = swiglu_clamped(ga, ua, limit) * wk;
    }
}

// ds4_moe_down_<fmt> in the fast order (the slots' products summed in any order). Preconditions
// (fast.rs): row bytes % 16 == 0 and n_used rows fit a job; n_used <= DS4_MOE_MAX_USED.
// Launch: grid (ceil(n_out / 16), n_tok), block 256.
template <int T>
DS4_DEV void moe_down_fast_body(float* out, const u8* down, const i8* mq, const float* md, const i16* mbs,
                                const u32* sel, u32 n_ff, u32 n_out, u32 n_used) {
    using Job = MoeJob<T, true>;
    __shared__ u64 sgrid[256];
    __shared__ uint4 jobs[DS4_WARPS_PER_BLOCK * Job::WORDS];
    stage_moe_grid<T>(sgrid);
    const u32 t = blockIdx.y;
    const u64 rb = row_bytes<T>(n_ff);
    const u32 wpr = (u32)(rb / 16), nck = n_ff / 32;
    const u32 nu = min(n_used, (u32)DS4_MOE_MAX_USED);
    __shared__ u32 experts[DS4_MOE_MAX_USED];
    if (threadIdx.x < nu) experts[threadIdx.x] = sel[(u64)t * n_used + threadIdx.x];
    __syncthreads();
    uint4* job = jobs + warp_id() * Job::WORDS;
    const u32 r0 = (blockIdx.x * DS4_WARPS_PER_BLOCK + warp_id()) * DS4_MOE_FAST_RPW;
    const u32 r1 = min(r0 + DS4_MOE_FAST_RPW, n_out);
    if (r0 >= r1) return;  // warp-uniform; no block barrier follows
    auto rows = [&](u32 r) { return [=](u32 s) { return down + ((u64)experts[s] * n_out + r) * rb; }; };
    // Slot k's activation is row t * n_used + k: consecutive rows, n_ff elements apart.
    const i8* xr = mq + (u64)t * n_used * n_ff;
    const float* dr = md + (u64)t * n_used * (n_ff / 256);
    const i16* br = mbs + (u64)t * n_used * (n_ff / 16);
    uint4 v[Job::LOADS];
    moe_job_load(v, rows(r0), nu, wpr);
    for (u32 r = r0; r < r1; ++r) {
        moe_job_stage(job, v, nu * wpr);
        if (r + 1 < r1) moe_job_load(v, rows(r + 1), nu, wpr);
        float acc = 0.0f;
        for (u32 k = 0; k < nu; ++k)
            for (u32 c = lane_id(); c < nck; c += DS4_WARP) {
                ActChunk a;
                load_act<T>(a, xr + (u64)k * n_ff, dr + k * (n_ff / 256), br + k * (n_ff / 16), c);
                acc += moe_chunk_term<T>((const u8*)job + k * rb, c, a, sgrid);
            }
        acc = finish_dot<T>(warp_sum(acc));
        if (lane_id() == 0) out[(u64)t * n_out + r] = acc;
    }
}

extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_moe_gate_up_iq2_xxs_fast(float* mid, const u8* gate,
                                                                             const u8* up, const i8* xq,
                                                                             const float* xd, const i16* xbs,
                                                                             const u32* sel, const float* selw,
                                                                             u32 n_in, u32 n_ff, u32 n_used,
                                                                             float limit) {
    moe_gate_up_fast_body<DS4_T_IQ2_XXS>(mid, gate, up, xq, xd, xbs, sel, selw, n_in, n_ff, n_used, limit);
}
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_moe_gate_up_q2_k_fast(float* mid, const u8* gate,
                                                                          const u8* up, const i8* xq,
                                                                          const float* xd, const i16* xbs,
                                                                          const u32* sel, const float* selw,
                                                                          u32 n_in, u32 n_ff, u32 n_used,
                                                                          float limit) {
    moe_gate_up_fast_body<DS4_T_Q2_K>(mid, gate, up, xq, xd, xbs, sel, selw, n_in, n_ff, n_used, limit);
}
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_moe_gate_up_q4_k_fast(float* mid, const u8* gate,
                                                                          const u8* up, const i8* xq,
                                                                          const float* xd, const i16* xbs,
                                                                          const u32* sel, const float* selw,
                                                                          u32 n_in, u32 n_ff, u32 n_used,
                                                                          float limit) {
    moe_gate_up_fast_body<DS4_T_Q4_K>(mid, gate, up, xq, xd, xbs, sel, selw, n_in, n_ff, n_used, limit);
}
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_moe_down_iq2_xxs_fast(float* out, const u8* down,
                                                                          const i8* mq, const float* md,
                                                                          const i16* mbs, const u32* sel, u32 n_ff,
                                                                          u32 n_out, u32 n_used) {
    moe_down_fast_body<DS4_T_IQ2_XXS>(out, down, mq, md, mbs, sel, n_ff, n_out, n_used);
}
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_moe_down_q2_k_fast(float* out, const u8* down, const i8* mq,
                                                                       const float* md, const i16* mbs,
                                                                       const u32* sel, u32 n_ff, u32 n_out,
                                                                       u32 n_used) {
    moe_down_fast_body<DS4_T_Q2_K>(out, down, mq, md, mbs, sel, n_ff, n_out, n_used);
}
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_moe_down_q4_k_fast(float* out, const u8* down, const i8* mq,
                                                                       const float* md, const i16* mbs,
                                                                       const u32* sel, u32 n_ff, u32 n_out,
                                                                       u32 n_used) {
    moe_down_fast_body<DS4_T_Q4_K>(out, down, mq, md, mbs, sel, n_ff, n_out, n_used);
}

// ds4_router's arguments, outputs and launch (grid (n_tok), block 256) with the selection on one warp:
// every thread computes its experts' probabilities as ds4_router does, then the first warp runs the
// n_used rounds as warp argmaxes (shuffles, the same lowest-index rule on ties) instead of block
// argmaxes with two barriers each, and the weights as ds4_router, so the ids and weights have its
// bits. (The probabilities on one warp alone, 8 softplus each, measured 14.2 us a launch on the H200
// against the exact kernel's 7.3: tests/hip-on-cuda/results/h200-2026-12-02-s11-call2.log.)
// n_expert <= 1024, n_used <= 16.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_router_fast(u32* sel, float* selw, const float* logits,
                                                                  const float* bias, const i32* tid2eid,
                                                                  const u32* tokens, u32 n_expert, u32 n_used,
                                                                  float weight_scale, u32 n_tok) {
    __shared__ float prob[1024];
    __shared__ float score[1024];
    __shared__ u32 chosen[16];
    const u32 t = blockIdx.x, lane = lane_id();
    if (t >= n_tok) return;
    router_probs(prob, score, logits + (u64)t * n_expert, bias, n_expert);
    __syncthreads();
    if (warp_id() != 0) return;
    if (tid2eid) {
        router_hashed(chosen, tid2eid, tokens[t], n_expert, n_used);
    } else {
        for (u32 k = 0; k < n_used; ++k) {
            float best = -INFINITY;
            int bi = 0x7fffffff;
            for (u32 e = lane; e < n_expert; e += DS4_WARP) {
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
            if (bi < 0 || (u32)bi >= n_expert) bi = 0;  // all scores NaN: degenerate but in bounds
            ds4_sync_warp();  // every lane has read score before lane 0 clears the winner
            if (lane == 0) {
                chosen[k] = (u32)bi;
                score[bi] = -INFINITY;
            }
            ds4_sync_warp();
        }
    }
    ds4_sync_warp();
    if (lane == 0) router_weights(sel + (u64)t * n_used, selw + (u64)t * n_used, prob, chosen, n_used, weight_scale);
}
