// Block formats of the GGUF weights (spec §2.1) and the device activation layouts, as per-chunk
// dot products. A "chunk" is 32 consecutive elements of a row; every weight format used by ds4
// (Q8_0, Q2_K, Q4_K, IQ2_XXS) splits cleanly into 32-element chunks, so one matvec body serves all
// of them: lane l of a warp handles chunks l, l + DS4_WARP, ... and the warp sums the results.
//
// Weights are used in place, in the exact GGUF byte layout (rows of blocks, row-major, spec §0.1).
//
// Device activation layouts (planar, so activation chunks are 16-byte aligned int8 runs):
//   Q8_0 activation of a row of n floats (spec §2.2): q  int8[n], d f32[n/32] (scale kept as f32).
//   Q8_K activation of a row of n floats (spec §2.2): q  int8[n], d f32[n/256], bsums i16[n/16].
// Batched activations are `rows` such rows back to back in each plane (row r of q at r*n).
#pragma once
#include "prelude.h"
#include "iq2xxs_grid.h"

// GGML type ids (spec §1.1) used as template parameters.
#define DS4_T_Q8_0 8
#define DS4_T_Q2_K 10
#define DS4_T_Q4_K 12
#define DS4_T_IQ2_XXS 16

template <int T>
struct Fmt;
template <>
struct Fmt<DS4_T_Q8_0> {
    static constexpr u32 block_elems = 32, block_bytes = 34;
};
template <>
struct Fmt<DS4_T_Q2_K> {
    static constexpr u32 block_elems = 256, block_bytes = 84;
};
template <>
struct Fmt<DS4_T_Q4_K> {
    static constexpr u32 block_elems = 256, block_bytes = 144;
};
template <>
struct Fmt<DS4_T_IQ2_XXS> {
    static constexpr u32 block_elems = 256, block_bytes = 66;
};

template <int T>
DS4_DEV u64 row_bytes(u32 n) {
    return (u64)(n / Fmt<T>::block_elems) * Fmt<T>::block_bytes;
}

// 32 int8 activation values of chunk c as 8 packed ints (two 16-byte loads).
DS4_DEV void load_act_chunk(const i8* xq, u32 c, int v[8]) {
    const int4* p = (const int4*)(xq + (u64)c * 32);
    int4 a = p[0], b = p[1];
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
    v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}

// Activation chunk for the K-quant formats: int8 values, the block's f32 scale and the two
// 16-element sums.
struct ActK {
    int q[8];
    float d;
    int bs0, bs1;
};
DS4_DEV void load_act_k(const i8* xq, const float* xd, const i16* xbs, u32 c, ActK& a) {
    load_act_chunk(xq, c, a.q);
    a.d = xd[c / 8];
    a.bs0 = xbs[2 * c];
    a.bs1 = xbs[2 * c + 1];
}

// ---- Q4_K chunk c = sub-block j of block c/8 (spec §2.1, §2.3)
DS4_DEV float dot_chunk_q4_k(const u8* wrow, u32 c, const ActK& a) {
    const u8* blk = wrow + (u64)(c / 8) * 144;
    const u32 j = c % 8;
    const u32 dd = *(const u32*)blk;
    const u32* sc32 = (const u32*)(blk + 4);
    const u32 s0 = sc32[0], s1 = sc32[1], s2 = sc32[2];
    // scales[i] as bytes: s0 = scales[0..4), s1 = scales[4..8), s2 = scales[8..12)
    u32 sc, m;
    if (j < 4) {
        sc = (s0 >> (8 * j)) & 63;
        m = (s1 >> (8 * j)) & 63;
    } else {
        const u32 jj = j - 4;
        const u32 b8 = (s2 >> (8 * jj)) & 0xff;  // scales[j+4]
        sc = (b8 & 15) | (((s0 >> (8 * jj + 6)) & 3) << 4);
        m = (b8 >> 4) | (((s1 >> (8 * jj + 6)) & 3) << 4);
    }
    const int4* qp = (const int4*)(blk + 16 + 32 * (j / 2));
    const int4 q0 = qp[0], q1 = qp[1];
    const u32 sh = 4 * (j & 1);
    const int w[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
    int isum = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) isum = dot4_i8((int)(((u32)w[i] >> sh) & 0x0F0F0F0Fu), a.q[i], isum);
    const float d = f16_to_f32((u16)(dd & 0xffff)), dmin = f16_to_f32((u16)(dd >> 16));
    return a.d * (d * (float)sc * (float)isum - dmin * (float)m * (float)(a.bs0 + a.bs1));
}

// ---- Q2_K chunk c: elements 32*(c%8).. of block c/8, i.e. k = (c%8)/4, shift j = c%4 (spec §2.1)
DS4_DEV float dot_chunk_q2_k(const u8* wrow, u32 c, const ActK& a) {
    const u8* blk = wrow + (u64)(c / 8) * 84;
    const u32 cb = c % 8, k = cb / 4, j = cb % 4;
    const u32 sc01 = *(const u16*)(blk + 8 * k + 2 * j);  // scales[s0], scales[s0 + 1]
    const u32* qs = (const u32*)(blk + 16 + 32 * k);
    const u32 sh = 2 * j;
    int i0 = 0, i1 = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) i0 = dot4_i8((int)((qs[i] >> sh) & 0x03030303u), a.q[i], i0);
#pragma unroll
    for (int i = 4; i < 8; ++i) i1 = dot4_i8((int)((qs[i] >> sh) & 0x03030303u), a.q[i], i1);
    const u32 dd = *(const u32*)(blk + 80);
    const float d = f16_to_f32((u16)(dd & 0xffff)), dmin = f16_to_f32((u16)(dd >> 16));
    const u32 sca = sc01 & 0xff, scb = sc01 >> 8;
    const float isum = (float)((int)(sca & 15) * i0 + (int)(scb & 15) * i1);
    const float summ = (float)((int)(sca >> 4) * a.bs0 + (int)(scb >> 4) * a.bs1);
    return a.d * (d * isum - dmin * summ);
}

// ---- IQ2_XXS chunk c = sub-block ib of block c/8 (spec §2.1, §2.3). `grid` is the 256-entry
// table staged in shared memory by the kernel (see stage_iq2_grid).
DS4_DEV u32 sign_mask4(u32 nib) { return ((nib * 0x00204081u) & 0x01010101u) * 0xFFu; }
DS4_DEV float dot_chunk_iq2_xxs(const u8* wrow, u32 c, const ActK& a, const u64* grid) {
    const u8* blk = wrow + (u64)(c / 8) * 66;
    const u32 ib = c % 8;
    const float d = f16_to_f32(*(const u16*)blk);
    const u32 g4 = load_u32_2a(blk + 2 + 8 * ib);
    const u32 aux = load_u32_2a(blk + 6 + 8 * ib);
    int isum = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const u64 g = grid[(g4 >> (8 * k)) & 0xff];
        u32 s = (aux >> (7 * k)) & 127;
        s |= (__popc(s) & 1) << 7;  // ksigns: even number of negatives per group
        const u32 mlo = sign_mask4(s & 15), mhi = sign_mask4(s >> 4);
        const u32 glo = (u32)g, ghi = (u32)(g >> 32);
        // Bytewise negate where the mask is set: (g ^ m) + 1 per byte; no carry since g bytes are > 0.
        const u32 vlo = (glo ^ mlo) + (mlo & 0x01010101u);
        const u32 vhi = (ghi ^ mhi) + (mhi & 0x01010101u);
        isum = dot4_i8((int)vlo, a.q[2 * k], isum);
        isum = dot4_i8((int)vhi, a.q[2 * k + 1], isum);
    }
    const u32 ls = aux >> 28;
    return d * a.d * 0.125f * (float)(2 * ls + 1) * (float)isum;
}

// Copies the IQ2_XXS grid to shared memory; call from every thread, then __syncthreads().
DS4_DEV void stage_iq2_grid(u64* sgrid) {
    for (u32 i = threadIdx.x; i < 256; i += blockDim.x) sgrid[i] = ds4_iq2xxs_grid[i];
}

// Dispatch on the K-format for the expert kernels.
template <int T>
DS4_DEV float dot_chunk_k(const u8* wrow, u32 c, const ActK& a, const u64* grid) {
    if constexpr (T == DS4_T_Q4_K) return dot_chunk_q4_k(wrow, c, a);
    if constexpr (T == DS4_T_Q2_K) return dot_chunk_q2_k(wrow, c, a);
    if constexpr (T == DS4_T_IQ2_XXS) return dot_chunk_iq2_xxs(wrow, c, a, grid);
    return 0.0f;
}

// Full row dot for one warp: weight row (format T, n elements) · Q8_K activation row.
template <int T>
DS4_DEV float warp_dot_row_k(const u8* wrow, const i8* xq, const float* xd, const i16* xbs, u32 n,
                             const u64* grid) {
    const u32 nc = n / 32;
    float acc = 0.0f;
    // Unrolled so later chunks' loads issue before earlier sums finish (same summation order).
#pragma unroll 4
    for (u32 c = lane_id(); c < nc; c += DS4_WARP) {
        ActK a;
        load_act_k(xq, xd, xbs, c, a);
        acc += dot_chunk_k<T>(wrow, c, a, grid);
    }
    return warp_sum(acc);
}

// Two rows of the same format against one Q8_K activation row (routed gate and up): each
// activation chunk is loaded once for both rows, and the two weight streams are in flight together.
template <int T>
DS4_DEV void warp_dot_rows2_k(const u8* wa, const u8* wb, const i8* xq, const float* xd, const i16* xbs, u32 n,
                              const u64* grid, float& ra, float& rb) {
    const u32 nc = n / 32;
    float acc_a = 0.0f, acc_b = 0.0f;
    // Unrolled so later chunks' loads issue before earlier sums finish (same summation order).
#pragma unroll 4
    for (u32 c = lane_id(); c < nc; c += DS4_WARP) {
        ActK a;
        load_act_k(xq, xd, xbs, c, a);
        acc_a += dot_chunk_k<T>(wa, c, a, grid);
        acc_b += dot_chunk_k<T>(wb, c, a, grid);
    }
    ra = warp_sum(acc_a);
    rb = warp_sum(acc_b);
}

// Full row dot for one warp: Q8_0 weight row · Q8_0 activation row. Eight lanes share a 34-byte
// block (lane sub = lane % 8 takes its 4-byte quarter-word of codes), so one warp-wide load touches
// DS4_WARP/8 consecutive blocks instead of 32 blocks 34 bytes apart; four blocks per lane are in
// flight per iteration (DS4_Q8_0_UNROLL: a build-time knob for measuring memory-level parallelism;
// the lanes' partial sums fold pairwise, ((a0 + a1) + (a2 + a3)) for 4).
#ifndef DS4_Q8_0_UNROLL
#define DS4_Q8_0_UNROLL 4
#endif
DS4_DEV float q8_0_quarter(const u8* wrow, const i8* xq, const float* xd, u32 b, u32 sub) {
    const u8* blk = wrow + (u64)b * 34;
    const float d = f16_to_f32(*(const u16*)blk);
    const int q = (int)load_u32_2a(blk + 2 + 4 * sub);
    const int x = *(const int*)(xq + (u64)b * 32 + 4 * sub);
    return d * xd[b] * (float)dot4_i8(q, x, 0);
}
DS4_DEV float warp_dot_row_q8_0(const u8* wrow, const i8* xq, const float* xd, u32 n) {
    constexpr u32 BPW = DS4_WARP / 8;  // blocks per warp step
    constexpr int U = DS4_Q8_0_UNROLL;
    static_assert(U == 1 || U == 2 || U == 4 || U == 8 || U == 16, "DS4_Q8_0_UNROLL: a power of two <= 16");
    const u32 nb = n / 32, sub = lane_id() % 8;
    u32 b = lane_id() / 8;
    float a[U];
#pragma unroll
    for (int k = 0; k < U; ++k) a[k] = 0.0f;
    for (; b + (U - 1) * BPW < nb; b += U * BPW) {
#pragma unroll
        for (int k = 0; k < U; ++k) a[k] += q8_0_quarter(wrow, xq, xd, b + k * BPW, sub);
    }
    for (; b < nb; b += BPW) a[0] += q8_0_quarter(wrow, xq, xd, b, sub);
#pragma unroll
    for (int w = 1; w < U; w *= 2)
#pragma unroll
        for (int k = 0; k + w < U; k += 2 * w) a[k] += a[k + w];
    return warp_sum(a[0]);
}

// SwiGLU with the asymmetric clamp of spec §3.9 (gate <= limit, up in [-limit, limit], applied
// when limit > 1e-6); silu uses the numerically stable sigmoid.
DS4_DEV float stable_sigmoid(float z) {
    if (z >= 0.0f) return 1.0f / (1.0f + expf(-z));
    const float e = expf(z);
    return e / (1.0f + e);
}
DS4_DEV float swiglu_clamped(float g, float u, float limit) {
    if (limit > 1e-6f) {
        g = fminf(g, limit);
        u = fminf(fmaxf(u, -limit), limit);
    }
    return g * stable_sigmoid(g) * u;
}
