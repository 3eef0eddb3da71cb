// Routed experts at decode in the fast order (docs/arithmetic.md): the moe.hip kernels' products and
// arguments, built to stream the selected experts' rows at bandwidth. A warp's "job" is the weight
// rows one output needs (gate/up: the gate and up rows of row r of expert k; down: row r of each
// selected expert), at most MoeJob::BYTES. The warp reads a job with 16-byte loads at
// consecutive addresses (the next job's loads in flight while it works on this one), stages it in
// its shared memory, and lane l unpacks chunks l, l + DS4_WARP, ... of each staged row (formats.h
// unpack_chunk) against the activation chunk of the same index, loaded once for every row that uses
// it (the gate and up rows share theirs); each chunk adds its own float term (unit_term is linear in
// the integer sums), then the warp folds its lanes. Deterministic.
// A block first issues its warps' first job loads, then stages what every warp reads many times
// (the IQ2_XXS grid, the token's activations) in shared memory while those loads are in flight.
#pragma once
#include "moe.hip"         // DS4_MOE_MAX_USED, router_probs
#include "matvec_fast.hip"  // the router logits' F16 rows (f16_row_part)
#include "norm_quant_fast.hip"  // nqf_store_row (the fused Q8_K of mid)

#define DS4_MOE_FAST_ROWS 16  // output rows per down block (fast.rs MOE_FAST_ROWS)
#define DS4_MOE_FAST_RPW (DS4_MOE_FAST_ROWS / DS4_WARPS_PER_BLOCK)  // output rows per down warp

// Where shared memory is plentiful (sm_90: 228 KB a multiprocessor) and on the emulator, which tests
// this path, a block stages the token's activations once instead of every job reading them from
// global memory; each block stays under 48 KB of static shared memory (CUDA's limit without an
// opt-in). AMD keeps global activations: a workgroup has 64 KB there, and occupancy hides the
// latency of a bandwidth-bound kernel better. The IQ2_XXS grid is staged in one copy: conflict-free
// interleaved copies cost shared memory and bought no speed.
#ifndef DS4_MOE_ACT_SMEM
#if defined(DS4_NVIDIA) || defined(DS4_EMU)
#define DS4_MOE_ACT_SMEM 1
#else
#define DS4_MOE_ACT_SMEM 0
#endif
#endif

// Bytes of weight rows per warp job, per kernel (at most; fast.rs moe_fast_job_bytes): the job's
// prefetch registers and staged words are sized for its kernel's jobs, not the largest format's.
// The Flash-shaped files' gate/up jobs (two IQ2_XXS rows of 4096 columns, 2112 bytes) fit 2560, so
// that kernel keeps 20 registers and 20 KB of shared memory fewer than at 5120 (more blocks a
// multiprocessor); their down jobs (six Q2_K rows of 2048 columns, 4032 bytes) fit 4096.
// ACT: the activation elements a block stages at most, the most a job that fits can read (a down
// job's rows read n_used * n_ff elements, a gate/up job's two rows n_in each).
template <int T, bool DOWN>
struct MoeJob {
    static constexpr u32 BYTES = T == DS4_T_IQ2_XXS ? (DOWN ? 3584 : 2560)
                                 : T == DS4_T_Q2_K  ? (DOWN ? 4096 : 3072)
                                                    : (DOWN ? 4608 : 5120);
    static constexpr u32 WORDS = BYTES / 16;                           // 16-byte words
    static constexpr int LOADS = (int)((WORDS + DS4_WARP - 1) / DS4_WARP);  // loads per lane
    static constexpr u32 ACT = (DOWN ? BYTES : BYTES / 2) / Fmt<T>::block_bytes * Fmt<T>::block_elems;
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
// Where a block's staged copy (DS4_MOE_ACT_SMEM) keeps half h of activation chunk c: the halves of
// 32 consecutive chunks side by side (int4 index 64 (c / 32) + 32 h + c % 32), so the 32 lanes of a
// warp, which read consecutive chunks, load 512 contiguous bytes per 16-byte load (4 shared-memory
// wavefronts) instead of 1 KB at a 32-byte stride (8).
DS4_DEV u32 moe_act_slot(u32 c, u32 h) { return 64 * (c / 32) + 32 * h + c % 32; }

// Chunk c of the token's activations (xq, xd, xbs: the block's staged copy where DS4_MOE_ACT_SMEM,
// else the token's rows in global memory).
template <int T>
DS4_DEV void load_act(ActChunk& a, const i8* xq, const float* xd, const i16* xbs, u32 c) {
#if DS4_MOE_ACT_SMEM
    const int4 lo = ((const int4*)xq)[moe_act_slot(c, 0)], hi = ((const int4*)xq)[moe_act_slot(c, 1)];
    a.q[0] = lo.x, a.q[1] = lo.y, a.q[2] = lo.z, a.q[3] = lo.w;
    a.q[4] = hi.x, a.q[5] = hi.y, a.q[6] = hi.z, a.q[7] = hi.w;
#else
    load_act_chunk(xq, c, a.q);
#endif
    a.yd = xd[c / 8];
    a.bs0 = a.bs1 = 0;
    if constexpr (T == DS4_T_Q2_K || T == DS4_T_Q4_K) {  // IQ2_XXS has no mins: its sums are unused
        const u32 bs = *(const u32*)(xbs + 2 * c);
        a.bs0 = (int)(i16)(bs & 0xffff);
        a.bs1 = (int)(i16)(bs >> 16);
    }
}

// A block's copy of one token's activations (Q8_K codes, scales per 256 and, for the formats with
// mins, sums per 16) for at most MAX elements (MoeJob::ACT); tiny where DS4_MOE_ACT_SMEM is 0.
template <int T, u32 MAX>
struct MoeActSmem {
    static constexpr bool MINS = T == DS4_T_Q2_K || T == DS4_T_Q4_K;
    static constexpr u32 N = DS4_MOE_ACT_SMEM ? MAX : 256;
    int4 q[(N + 1023) / 1024 * 64];  // whole groups of 32 chunks (moe_act_slot)
    float d[N / 256];
    i16 bs[MINS ? N / 16 : 2];
};

// Copies the first n elements (n % 256 == 0, n <= MAX) of (xq, xd, xbs) into `sm` (the codes in
// moe_act_slot's order) and points them there (DS4_MOE_ACT_SMEM; otherwise leaves them in global
// memory). Every thread, then a barrier.
template <int T, u32 MAX>
DS4_DEV void stage_moe_act(MoeActSmem<T, MAX>& sm, const i8*& xq, const float*& xd, const i16*& xbs, u32 n) {
#if DS4_MOE_ACT_SMEM
    for (u32 i = threadIdx.x; i < n / 16; i += DS4_BLOCK) sm.q[moe_act_slot(i / 2, i % 2)] = ((const int4*)xq)[i];
    for (u32 i = threadIdx.x; i < n / 256; i += DS4_BLOCK) sm.d[i] = xd[i];
    if constexpr (MoeActSmem<T, MAX>::MINS)
        for (u32 i = threadIdx.x; i < n / 32; i += DS4_BLOCK) ((u32*)sm.bs)[i] = ((const u32*)xbs)[i];
    xq = (const i8*)sm.q;
    xd = sm.d;
    xbs = sm.bs;
#endif
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

// The IQ2_XXS grid in the block's shared memory, staged by every thread before a barrier. (Its signs
// stay arithmetic, formats.h unpack_chunk: a staged sign table's random reads would add to the
// grid's shared-memory bank conflicts.)
template <int T>
struct MoeGridSmem {
    u64 g[T == DS4_T_IQ2_XXS ? 256 : 1];
};
template <int T>
DS4_DEV void stage_moe_grid(MoeGridSmem<T>& sm) {
    if constexpr (T == DS4_T_IQ2_XXS) stage_iq2_grid(sm.g);
}

// ds4_moe_gate_up_<fmt> in the fast order. Preconditions (fast.rs): row bytes % 16 == 0 and two rows
// fit a job. Launch: grid (B, n_used, n_tok), block 256, any B: block b takes the rows
// [b * R, (b + 1) * R) of its expert, R = ceil(n_ff / B), its warps rows w, w + W, ... of them
// (fast.rs FastGrids::moe_rows picks R).
// QUANT (ds4_moe_gate_up_<fmt>_q8k_fast; n_ff % 256 == 0, R a divisor of 256): the Q8_K quantization
// of mid follows in the same launch, with the bits of ds4_rms_norm_quant_fast over its rows of 256
// (quantize_rows): the last of the 256 / R blocks writing a 256-element unit of a slot's mid, by the
// unit's counter (u32 [n_tok][n_used][n_ff / 256], zero before the launch; that block resets it),
// quantizes it.
template <int T, bool QUANT>
DS4_DEV void moe_gate_up_fast_body(float* mid, i8* mq, float* md, i16* mbs, u32* counter, const u8* gate,
                                   const u8* up, const i8* xq, const float* xd, const i16* xbs, const u32* sel,
                                   const float* selw, u32 n_in, u32 n_ff, u32 n_used, float limit) {
    using Job = MoeJob<T, false>;
    __shared__ MoeGridSmem<T> sgrid;
    __shared__ MoeActSmem<T, Job::ACT> sact;
    __shared__ uint4 jobs[DS4_WARPS_PER_BLOCK * Job::WORDS];
    // The grid is a constant: staged before the wait for the launch that selected the experts.
    stage_moe_grid(sgrid);
    ds4_grid_sync();
    const u32 k = blockIdx.y, t = blockIdx.z;
    const u32 e = sel[(u64)t * n_used + k];
    const u64 rb = row_bytes<T>(n_in);
    const u32 wpr = (u32)(rb / 16), nck = n_in / 32;
    const u8* ge = gate + (u64)e * n_ff * rb;
    const u8* ue = up + (u64)e * n_ff * rb;
    const u32 per = (n_ff + gridDim.x - 1) / gridDim.x, rb0 = blockIdx.x * per;
    const u32 r0 = rb0 + warp_id(), r1 = min(rb0 + per, n_ff);  // this warp: r0, r0 + W, ... < r1
    auto rows = [&](u32 r) { return [=](u32 s) { return (s == 0 ? ge : ue) + r * rb; }; };
    uint4 v[Job::LOADS];
    if (r0 < r1) moe_job_load(v, rows(r0), 2, wpr);
    const i8* xr = xq + (u64)t * n_in;
    const float* dr = xd + (u64)t * (n_in / 256);
    const i16* br = xbs + (u64)t * (n_in / 16);
    stage_moe_act<T>(sact, xr, dr, br, n_in);
    __syncthreads();
    if (!QUANT && r0 >= r1) return;  // warp-uniform; no block barrier follows
    const float wk = selw[(u64)t * n_used + k];
    const u64* grid = sgrid.g;
    uint4* job = jobs + warp_id() * Job::WORDS;
    for (u32 r = r0; r < r1; r += DS4_WARPS_PER_BLOCK) {
        moe_job_stage(job, v, 2 * wpr);
        if (r + DS4_WARPS_PER_BLOCK < r1) moe_job_load(v, rows(r + DS4_WARPS_PER_BLOCK), 2, wpr);
        float ga = 0.0f, ua = 0.0f;
        for (u32 c = lane_id(); c < nck; c += DS4_WARP) {
            ActChunk a;
            load_act<T>(a, xr, dr, br, c);
            ga += moe_chunk_term<T>((const u8*)job, c, a, grid);
            ua += moe_chunk_term<T>((const u8*)job + rb, c, a, grid);
        }
        ga = finish_dot<T>(warp_sum(ga));
        ua = finish_dot<T>(warp_sum(ua));
        if (lane_id() == 0) mid[((u64)t * n_used + k) * n_ff + r] = swiglu_clamped(ga, ua, limit) * wk;
    }
    if constexpr (QUANT) {
        const u64 unit = ((u64)t * n_used + k) * (n_ff / 256) + rb0 / 256;
        if (!last_block_of(&counter[unit], 256 / per)) return;
        // The unit as ds4_rms_norm_quant_fast holds a row of 256 (threads 0-31, one 8-element
        // strip each), one load each (volatile: other blocks of this launch wrote them).
        float u[1][8];
#pragma unroll
        for (int j = 0; j < 8; ++j)
            u[0][j] = threadIdx.x < 32 ? ((const volatile float*)mid)[unit * 256 + 8 * threadIdx.x + j] : 0.0f;
        nqf_store_row<1>(unit, u, 256, nullptr, nullptr, nullptr, mq, md, mbs);
    }
}

// Four IQ2_XXS and Q2_K gate/up blocks a multiprocessor on sm_90 (64 registers, no spills; ptxas
// would take 70 and leave three). Q4_K two (it spills at 64 registers, and at 80, three blocks,
// too).
#if defined(DS4_NVIDIA)
#define DS4_MOE_GATE_UP_LAUNCH __launch_bounds__(DS4_BLOCK, 4)
#define DS4_MOE_GATE_UP_Q4_K_LAUNCH __launch_bounds__(DS4_BLOCK, 2)
#else
#define DS4_MOE_GATE_UP_LAUNCH DS4_LAUNCH(DS4_BLOCK)
#define DS4_MOE_GATE_UP_Q4_K_LAUNCH DS4_LAUNCH(DS4_BLOCK)
#endif

// Two down blocks a multiprocessor on sm_90 (at most 128 registers), where ptxas would otherwise
// cap the Q2_K kernel at 80 and spill (the Flash-shaped grid has 256 blocks: two per multiprocessor).
#if defined(DS4_NVIDIA)
#define DS4_MOE_DOWN_LAUNCH __launch_bounds__(DS4_BLOCK, 2)
#else
#define DS4_MOE_DOWN_LAUNCH DS4_LAUNCH(DS4_BLOCK)
#endif

// ds4_moe_down_<fmt> in the fast order (the slots' products summed in any order). Preconditions
// (fast.rs): row bytes % 16 == 0 and n_used rows fit a job; n_used <= DS4_MOE_MAX_USED.
// Launch: grid (ceil(n_out / 16), n_tok), block 256.
template <int T>
DS4_DEV void moe_down_fast_body(float* out, const u8* down, const i8* mq, const float* md, const i16* mbs,
                                const u32* sel, u32 n_ff, u32 n_out, u32 n_used) {
    using Job = MoeJob<T, true>;
    __shared__ MoeGridSmem<T> sgrid;
    __shared__ MoeActSmem<T, Job::ACT> sact;
    __shared__ uint4 jobs[DS4_WARPS_PER_BLOCK * Job::WORDS];
    const u32 t = blockIdx.y;
    const u64 rb = row_bytes<T>(n_ff);
    const u32 wpr = (u32)(rb / 16), nck = n_ff / 32;
    const u32 nu = min(n_used, (u32)DS4_MOE_MAX_USED);
    const u32* ex = sel + (u64)t * n_used;  // read by every lane (cached): no barrier before the loads
    const u32 r0 = (blockIdx.x * DS4_WARPS_PER_BLOCK + warp_id()) * DS4_MOE_FAST_RPW;
    const u32 r1 = min(r0 + DS4_MOE_FAST_RPW, n_out);
    auto rows = [&](u32 r) { return [=](u32 s) { return down + ((u64)ex[s] * n_out + r) * rb; }; };
    uint4 v[Job::LOADS];
    if (r0 < r1) moe_job_load(v, rows(r0), nu, wpr);
    // Slot k's activation is row t * n_used + k: consecutive rows, n_ff elements apart.
    const i8* xr = mq + (u64)t * n_used * n_ff;
    const float* dr = md + (u64)t * n_used * (n_ff / 256);
    const i16* br = mbs + (u64)t * n_used * (n_ff / 16);
    stage_moe_grid(sgrid);
    stage_moe_act<T>(sact, xr, dr, br, nu * n_ff);
    __syncthreads();
    if (r0 >= r1) return;  // warp-uniform; no block barrier follows
    const u64* grid = sgrid.g;
    uint4* job = jobs + warp_id() * Job::WORDS;
    for (u32 r = r0; r < r1; ++r) {
        moe_job_stage(job, v, nu * wpr);
        if (r + 1 < r1) moe_job_load(v, rows(r + 1), nu, wpr);
        float acc = 0.0f;
        for (u32 k = 0; k < nu; ++k)
            for (u32 c = lane_id(); c < nck; c += DS4_WARP) {
                ActChunk a;
                load_act<T>(a, xr, dr, br, k * nck + c);
                acc += moe_chunk_term<T>((const u8*)job + k * rb, c, a, grid);
            }
        acc = finish_dot<T>(warp_sum(acc));
        if (lane_id() == 0) out[(u64)t * n_out + r] = acc;
    }
}

extern "C" __global__ DS4_MOE_GATE_UP_LAUNCH void ds4_moe_gate_up_iq2_xxs_fast(
    float* mid, const u8* gate, const u8* up, const i8* xq, const float* xd, const i16* xbs, const u32* sel,
    const float* selw, u32 n_in, u32 n_ff, u32 n_used, float limit) {
    moe_gate_up_fast_body<DS4_T_IQ2_XXS, false>(mid, nullptr, nullptr, nullptr, nullptr, gate, up, xq, xd, xbs,
                                                sel, selw, n_in, n_ff, n_used, limit);
}
extern "C" __global__ DS4_MOE_GATE_UP_LAUNCH void ds4_moe_gate_up_iq2_xxs_q8k_fast(
    float* mid, i8* mq, float* md, i16* mbs, u32* counter, const u8* gate, const u8* up, const i8* xq, const float* xd,
    const i16* xbs, const u32* sel, const float* selw, u32 n_in, u32 n_ff, u32 n_used, float limit) {
    moe_gate_up_fast_body<DS4_T_IQ2_XXS, true>(mid, mq, md, mbs, counter, gate, up, xq, xd, xbs, sel, selw,
                                               n_in, n_ff, n_used, limit);
}
extern "C" __global__ DS4_MOE_GATE_UP_LAUNCH void ds4_moe_gate_up_q2_k_fast(
    float* mid, const u8* gate, const u8* up, const i8* xq, const float* xd, const i16* xbs, const u32* sel,
    const float* selw, u32 n_in, u32 n_ff, u32 n_used, float limit) {
    moe_gate_up_fast_body<DS4_T_Q2_K, false>(mid, nullptr, nullptr, nullptr, nullptr, gate, up, xq, xd, xbs,
                                             sel, selw, n_in, n_ff, n_used, limit);
}
extern "C" __global__ DS4_MOE_GATE_UP_LAUNCH void ds4_moe_gate_up_q2_k_q8k_fast(
    float* mid, i8* mq, float* md, i16* mbs, u32* counter, const u8* gate, const u8* up, const i8* xq, const float* xd,
    const i16* xbs, const u32* sel, const float* selw, u32 n_in, u32 n_ff, u32 n_used, float limit) {
    moe_gate_up_fast_body<DS4_T_Q2_K, true>(mid, mq, md, mbs, counter, gate, up, xq, xd, xbs, sel, selw,
                                            n_in, n_ff, n_used, limit);
}
extern "C" __global__ DS4_MOE_GATE_UP_Q4_K_LAUNCH void ds4_moe_gate_up_q4_k_fast(
    float* mid, const u8* gate, const u8* up, const i8* xq, const float* xd, const i16* xbs, const u32* sel,
    const float* selw, u32 n_in, u32 n_ff, u32 n_used, float limit) {
    moe_gate_up_fast_body<DS4_T_Q4_K, false>(mid, nullptr, nullptr, nullptr, nullptr, gate, up, xq, xd, xbs,
                                             sel, selw, n_in, n_ff, n_used, limit);
}
extern "C" __global__ DS4_MOE_GATE_UP_Q4_K_LAUNCH void ds4_moe_gate_up_q4_k_q8k_fast(
    float* mid, i8* mq, float* md, i16* mbs, u32* counter, const u8* gate, const u8* up, const i8* xq, const float* xd,
    const i16* xbs, const u32* sel, const float* selw, u32 n_in, u32 n_ff, u32 n_used, float limit) {
    moe_gate_up_fast_body<DS4_T_Q4_K, true>(mid, mq, md, mbs, counter, gate, up, xq, xd, xbs, sel, selw,
                                            n_in, n_ff, n_used, limit);
}
extern "C" __global__ DS4_MOE_DOWN_LAUNCH void ds4_moe_down_iq2_xxs_fast(float* out, const u8* down,
                                                                          const i8* mq, const float* md,
                                                                          const i16* mbs, const u32* sel, u32 n_ff,
                                                                          u32 n_out, u32 n_used) {
    ds4_grid_sync();
    moe_down_fast_body<DS4_T_IQ2_XXS>(out, down, mq, md, mbs, sel, n_ff, n_out, n_used);
}
extern "C" __global__ DS4_MOE_DOWN_LAUNCH void ds4_moe_down_q2_k_fast(float* out, const u8* down, const i8* mq,
                                                                       const float* md, const i16* mbs,
                                                                       const u32* sel, u32 n_ff, u32 n_out,
                                                                       u32 n_used) {
    ds4_grid_sync();
    moe_down_fast_body<DS4_T_Q2_K>(out, down, mq, md, mbs, sel, n_ff, n_out, n_used);
}
extern "C" __global__ DS4_MOE_DOWN_LAUNCH void ds4_moe_down_q4_k_fast(float* out, const u8* down, const i8* mq,
                                                                       const float* md, const i16* mbs,
                                                                       const u32* sel, u32 n_ff, u32 n_out,
                                                                       u32 n_used) {
    ds4_grid_sync();
    moe_down_fast_body<DS4_T_Q4_K>(out, down, mq, md, mbs, sel, n_ff, n_out, n_used);
}

// ds4_router's selection of token t on one warp: every thread computes its experts' probabilities
// as ds4_router does (from `lg`, the token's logits), then the first warp runs the n_used rounds as
// warp argmaxes (shuffles, the same lowest-index rule on ties) instead of block argmaxes with two
// barriers each, and the weights as ds4_router, so the ids and weights have its bits. (The
// probabilities stay on the whole block: on one warp alone, 8 softplus each, they would be a longer
// chain than the exact kernel's.) Every thread of the block; n_expert <= 1024, n_used <= 16.
DS4_DEV void router_fast_token(u32* sel, float* selw, const float* lg, const float* bias, const i32* tid2eid,
                               const u32* tokens, u32 t, u32 n_expert, u32 n_used, float weight_scale) {
    __shared__ float prob[1024];
    __shared__ float score[1024];
    __shared__ u32 chosen[16];
    const u32 lane = lane_id();
    router_probs(prob, score, lg, bias, n_expert);
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

// ds4_router's arguments, outputs and launch (grid (n_tok), block 256), selecting with
// router_fast_token.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_router_fast(u32* sel, float* selw, const float* logits,
                                                                  const float* bias, const i32* tid2eid,
                                                                  const u32* tokens, u32 n_expert, u32 n_used,
                                                                  float weight_scale, u32 n_tok) {
    ds4_grid_sync();
    const u32 t = blockIdx.x;
    if (t >= n_tok) return;
    router_fast_token(sel, selw, logits + (u64)t * n_expert, bias, tid2eid, tokens, t, n_expert, n_used,
                      weight_scale);
}

// The router's logits and its selection in one launch (fast mode: ds4_matvec_f16_fast of the
// router matrix w [n_expert][n_in] against x, then ds4_router_fast on its output, with the bits of the
// two launches): each block writes its rows of logits [n_tok][n_expert]; the last block of a token,
// by the per-token counter (u32 [n_tok], zero before the launch; that block resets it), reads the
// token's logits back and runs router_fast_token. Preconditions (kernels::matvec_f16_router checks
// them): ds4_matvec_f16_fast's and ds4_router_fast's. Grid (ceil(n_expert / (256 / T)), n_tok),
// T = f16_fast_threads(n_in); block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_matvec_f16_router_fast(
    u32* sel, float* selw, float* logits, u32* counter, const u16* w, const float* x, const float* bias,
    const i32* tid2eid, const u32* tokens, u32 n_in, u32 n_expert, u32 n_used, float weight_scale, u32 x_stride) {
    __shared__ float scratch[DS4_WARPS_PER_BLOCK];
    __shared__ float lg[1024];
    const u32 t = blockIdx.y, tpr = f16_fast_threads(n_in);
    const u32 r = blockIdx.x * (DS4_BLOCK / tpr) + threadIdx.x / tpr, sub = threadIdx.x % tpr;
    const bool live = r < n_expert;
    const u16* wr = w + (u64)(live ? r : 0) * n_in;
    const F16First first = f16_row_first(wr, n_in, sub, tpr, live);  // weights: before the wait
    ds4_grid_sync();
    const float part = live ? f16_row_part(wr, x + (u64)t * x_stride, n_in, sub, tpr, &first) : 0.0f;
    const float acc = f16_row_sum(part, tpr, scratch);
    if (live && sub == 0) logits[(u64)t * n_expert + r] = acc;
    if (!last_block_of(&counter[t], gridDim.x)) return;
    // One load each (volatile: other blocks of this launch wrote them).
    for (u32 e = threadIdx.x; e < n_expert; e += DS4_BLOCK)
        lg[e] = ((const volatile float*)logits)[(u64)t * n_expert + e];
    __syncthreads();
    router_fast_token(sel, selw, lg, bias, tid2eid, tokens, t, n_expert, n_used, weight_scale);
}
