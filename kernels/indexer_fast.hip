// Fast indexer top-k (docs/arithmetic.md): the selection of ds4_indexer_topk (the top_k rows by
// score, ties to the lower row index, ascending row indices) in two launches, so a long context
// is not one block's sequential walk over every score:
//   1. ds4_indexer_topk_segments: the scores of a token are cut into segments of `seg` rows (the
//      last one also takes the remainder, so every segment has >= seg >= 2 top_k rows); a block per
//      segment selects the segment's top_k (the global top_k is among them, ties included) and
//      writes them back into the segment's own first 2 top_k score slots: the order keys, then the
//      row indices, both in ascending row order. A token with one segment gets its final list here.
//   2. ds4_indexer_topk_merge: one block per token selects the top_k among the n_seg x top_k
//      candidates, which are already in ascending row order, so the ordered pass of the exact
//      kernel writes ascending indices.
// Pure selection, no arithmetic: the list equals the exact kernel's. The scores of a token with
// more than one segment are overwritten (nothing reads them after the selection).
#pragma once
#include "indexer.hip"

#define DS4_IDX_SEG_MAX 8192  // most keys of a segment staged in shared memory (2 seg - 1 < this)

// Radix select over `n` keys read by `key_at(i)`: returns the k-th largest key (`prefix`) and how
// many keys equal to it are taken (`need`), as ds4_indexer_topk's four passes of 8 bits.
template <typename KeyAt>
DS4_DEV void radix_select(KeyAt key_at, u32 n, u32 k, u32* hist, u32* wsum, u32* s_prefix, u32* s_need,
                          u32& prefix, u32& need) {
    const u32 tid = threadIdx.x;
    u32 mask = 0;
    prefix = 0;
    need = k;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (u32 i = tid; i < 256; i += DS4_BLOCK) hist[i] = 0;
        __syncthreads();
        for (u32 i = tid; i < n; i += DS4_BLOCK) {
            const u32 key = key_at(i);
            if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255], 1u);
        }
        __syncthreads();
        {
            const u32 d = 255 - tid;
            const u32 v = hist[d];
            const u32 above = block_scan_excl(v, wsum);
            if ((above + v >= need || d == 0) && above < need) {
                *s_prefix = prefix | (d << shift);
                *s_need = need - above;
            }
        }
        __syncthreads();
        prefix = *s_prefix;
        need = *s_need;
        mask |= 255u << shift;
        __syncthreads();
    }
}

// The kept entries of `n` keys in order (every key above `prefix`, the first `need` equal to it):
// calls emit(i, o) with the output rank o of entry i, for ranks < k. Contiguous runs per thread.
template <typename KeyAt, typename Emit>
DS4_DEV void ordered_keep(KeyAt key_at, u32 n, u32 k, u32 prefix, u32 need, u32* wsum, Emit emit) {
    const u32 tid = threadIdx.x;
    const u32 chunk = (n + DS4_BLOCK - 1) / DS4_BLOCK;
    const u32 a = min(n, tid * chunk), b = min(n, a + chunk);
    u32 gt = 0, eq = 0;
    for (u32 i = a; i < b; ++i) {
        const u32 key = key_at(i);
        gt += key > prefix;
        eq += key == prefix;
    }
    const u32 eq_before = block_scan_excl(eq, wsum);
    u32 take = eq_before >= need ? 0 : min(eq, need - eq_before);
    u32 o = block_scan_excl(gt + take, wsum);
    for (u32 i = a; i < b; ++i) {
        const u32 key = key_at(i);
        if (key > prefix || (key == prefix && take > 0)) {
            if (key == prefix) --take;
            if (o < k) emit(i, o);
            ++o;
        }
    }
}

// Segments of a token with n rows: n_seg = max(1, n / seg); segment s covers [s seg, (s + 1) seg),
// the last one up to n.
DS4_DEV u32 idx_n_seg(u32 n, u32 seg) { return max(1u, n / seg); }

// Stage 1. sel, scores, pos, score_stride, n_comp_avail, ratio, top_k: as ds4_indexer_topk;
// seg >= 2 top_k, seg <= 4096. Launch: grid (most segments of any token, n_tok), block 256;
// segments past a token's rows exit.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_indexer_topk_segments(u32* sel, float* scores, const u32* pos,
                                                                            u32 score_stride, u32 n_comp_avail,
                                                                            u32 ratio, u32 top_k, u32 seg) {
    ds4_grid_sync();
    __shared__ u32 keys[DS4_IDX_SEG_MAX];
    __shared__ u32 hist[256];
    __shared__ u32 s_prefix, s_need;
    __shared__ u32 wsum[DS4_WARPS_PER_BLOCK];
    const u32 t = blockIdx.y, s = blockIdx.x;
    const u32 n = min((pos[0] + t + 1) / ratio, n_comp_avail);
    if (n <= top_k || 2 * seg > DS4_IDX_SEG_MAX) return;
    const u32 n_seg = idx_n_seg(n, seg);
    if (s >= n_seg) return;
    const u32 r0 = s * seg, len = (s + 1 == n_seg ? n : r0 + seg) - r0;
    float* sr = scores + (u64)t * score_stride + r0;
    for (u32 i = threadIdx.x; i < len; i += DS4_BLOCK) keys[i] = float_key(sr[i]);
    __syncthreads();
    u32 prefix, need;
    const auto key_at = [&](u32 i) { return keys[i]; };
    radix_select(key_at, len, top_k, hist, wsum, &s_prefix, &s_need, prefix, need);
    if (n_seg == 1) {
        u32* out = sel + (u64)t * top_k;
        ordered_keep(key_at, len, top_k, prefix, need, wsum, [&](u32 i, u32 o) { out[o] = i; });
    } else {
        u32* cand = (u32*)sr;  // keys in [0, top_k), row indices in [top_k, 2 top_k)
        ordered_keep(key_at, len, top_k, prefix, need, wsum, [&](u32 i, u32 o) {
            cand[o] = keys[i];
            cand[top_k + o] = r0 + i;
        });
    }
}

// Stage 2: the top_k of the candidates of every segment of a token with more than one segment.
// Launch: grid (n_tok), block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_indexer_topk_merge(u32* sel, const float* scores, const u32* pos,
                                                                         u32 score_stride, u32 n_comp_avail, u32 ratio,
                                                                         u32 top_k, u32 seg) {
    ds4_grid_sync();
    __shared__ u32 hist[256];
    __shared__ u32 s_prefix, s_need;
    __shared__ u32 wsum[DS4_WARPS_PER_BLOCK];
    const u32 t = blockIdx.x;
    const u32 n = min((pos[0] + t + 1) / ratio, n_comp_avail);
    if (n <= top_k) return;
    const u32 n_seg = idx_n_seg(n, seg);
    if (n_seg == 1) return;
    const u32* base = (const u32*)(scores + (u64)t * score_stride);
    // Candidate i: segment i / top_k, rank i % top_k.
    const auto key_at = [&](u32 i) { return base[(u64)(i / top_k) * seg + i % top_k]; };
    u32 prefix, need;
    radix_select(key_at, n_seg * top_k, top_k, hist, wsum, &s_prefix, &s_need, prefix, need);
    u32* out = sel + (u64)t * top_k;
    ordered_keep(key_at, n_seg * top_k, top_k, prefix, need, wsum,
                 [&](u32 i, u32 o) { out[o] = base[(u64)(i / top_k) * seg + top_k + i % top_k]; });
}

// Fast twins of ds4_indexer_scores (same arguments): the scores of a block's rows against every
// head as register-tiled products, each thread 4 rows x 8 heads, the heads' queries staged once per
// block (transposed, [dim][head]) and the rows' dims a step at a time (transposed, [dim][row]), each
// step's rows loaded into registers while the previous step computes; then max(0, .) * w per head
// and a sum over the heads by the 8 lanes sharing the rows. Same math as the exact kernel, summed in
// another order.
//   ds4_indexer_scores_fast: 128 rows a block (32 row groups x 8 head groups), each dot one chain
//     over the 128 dims; a batch's shape, the queries staged once serve 128 rows.
//   ds4_indexer_scores_decode_fast: 32 rows a block for a few tokens, 4 times the blocks. Its 256
//     threads are 4 quarters of 8 row groups x 8 head groups; quarter q's dots run over the dims
//     (s 64 + q 16 .. + 15) of the two 64-dim steps s, and the four partial dots of a row and head
//     are added in quarter order (through shared memory) before the max(0, .). At a 2.8k context
//     the 700 rows would be only 6 blocks of 128; one row a thread in blocks of 32 would be bound by
//     the shared-memory reads of 9 values per 8 products; the quarters keep 4 x 8 tiles.
#define DS4_IDXF_ROWS 128
#define DS4_IDXF_STEP 16
#define DS4_IDXF_PER_THREAD (DS4_IDXF_ROWS * DS4_IDXF_STEP / DS4_BLOCK)  // staged floats per thread a step
#define DS4_IDXD_ROWS 32  // rows per block of the decode twin
#define DS4_IDXD_STEP 64  // dims per staged step of the decode twin (16 per quarter)
#define DS4_IDXD_RS (DS4_IDXD_ROWS + 4)  // floats per staged dim (padded; float4-aligned)

// v stored down a column: base[0], base[stride], base[2 stride], base[3 stride].
DS4_DEV void idxf_store4_column(float* base, u32 stride, float4 v) {
    base[0] = v.x;
    base[stride] = v.y;
    base[2 * stride] = v.z;
    base[3 * stride] = v.w;
}

// Token t's queries transposed into qT [dim][head / 4] and its head weights w * w_scale into sw
// (zeros past n_head): thread i loads the query float4s (head i % 64, dims 4 (i / 64 + 4 k) ..), all
// in flight at once, and writes them to consecutive heads. qi 16-byte aligned (kernels::fast_twin
// checks it).
DS4_DEV void idxf_stage_token(float4 (*qT)[DS4_IDX_MAX_HEADS / 4], float* sw, const float* qi, const float* w,
                              u32 t, u32 n_head, float w_scale) {
    constexpr u32 Q4 = DS4_IDX_MAX_HEADS * DS4_IDX_DIM / 4 / DS4_BLOCK, HSTEP = DS4_BLOCK / DS4_IDX_MAX_HEADS;
    const u32 h = threadIdx.x % DS4_IDX_MAX_HEADS, d40 = threadIdx.x / DS4_IDX_MAX_HEADS;
    float4 qv[Q4];
#pragma unroll
    for (u32 k = 0; k < Q4; ++k)
        qv[k] = h < n_head ? *(const float4*)(qi + ((u64)t * n_head + h) * DS4_IDX_DIM + 4 * (d40 + k * HSTEP))
                           : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float* qTf = (float*)qT;
#pragma unroll
    for (u32 k = 0; k < Q4; ++k)
        idxf_store4_column(qTf + 4 * (d40 + k * HSTEP) * DS4_IDX_MAX_HEADS + h, DS4_IDX_MAX_HEADS, qv[k]);
    for (u32 i = threadIdx.x; i < DS4_IDX_MAX_HEADS; i += DS4_BLOCK)
        sw[i] = i < n_head ? w[(u64)t * n_head + i] * w_scale : 0.0f;
}

// A thread's 4 rows x 8 heads tile for one dim: acc[j][k] += x[j] q[k], q = (qa, qb).
DS4_DEV void idxf_tile_fma(float (&acc)[4][8], float4 x, float4 qa, float4 qb) {
    const float xs[4] = {x.x, x.y, x.z, x.w};
    const float qs[8] = {qa.x, qa.y, qa.z, qa.w, qb.x, qb.y, qb.z, qb.w};
#pragma unroll
    for (u32 j = 0; j < 4; ++j)
#pragma unroll
        for (u32 k = 0; k < 8; ++k) acc[j][k] = fmaf(xs[j], qs[k], acc[j][k]);
}

// The sum over the 8 lanes of an aligned group (xor 1, 2, 4), in every lane: a row's score from
// its head groups' partial sums.
DS4_DEV float idxf_lanes8_sum(float s) {
    s += __shfl_xor(s, 1, 8);
    s += __shfl_xor(s, 2, 8);
    return s + __shfl_xor(s, 4, 8);
}

// This thread's floats of the rows' dims d0 .. d0 + DS4_IDXF_STEP (zeros past the nr rows).
DS4_DEV void idxf_step_load(float (&v)[DS4_IDXF_PER_THREAD], const float* krows, u32 c0, u32 nr, u32 d0) {
#pragma unroll
    for (u32 k = 0; k < DS4_IDXF_PER_THREAD; ++k) {
        const u32 i = threadIdx.x + k * DS4_BLOCK, r = i / DS4_IDXF_STEP, d = i % DS4_IDXF_STEP;
        v[k] = r < nr ? krows[(u64)(c0 + r) * DS4_IDX_DIM + d0 + d] : 0.0f;
    }
}

// Launch: grid (ceil(grid_rows / 128), n_tok), block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_indexer_scores_fast(float* scores, const float* qi,
                                                                          const float* w, const float* krows,
                                                                          const u32* pos, u32 n_head,
                                                                          u32 n_comp_avail, u32 ratio, u32 top_k,
                                                                          u32 score_stride, float w_scale) {
    ds4_grid_sync();
    static_assert(DS4_BLOCK == 256, "ds4_indexer_scores_fast: 32 row groups x 8 head groups");
    __shared__ float4 qT[DS4_IDX_DIM][DS4_IDX_MAX_HEADS / 4];      // [dim][head]
    __shared__ float4 rT[DS4_IDXF_STEP][DS4_IDXF_ROWS / 4 + 1];    // [dim][row] of one step
    __shared__ float sw[DS4_IDX_MAX_HEADS];
    const u32 t = blockIdx.y, tid = threadIdx.x;
    const u32 n_c = min((pos[0] + t + 1) / ratio, n_comp_avail);
    const u32 c0 = blockIdx.x * DS4_IDXF_ROWS;
    if (n_c <= top_k || c0 >= n_c || n_head > DS4_IDX_MAX_HEADS) return;
    const u32 nr = min((u32)DS4_IDXF_ROWS, n_c - c0);
    float next[DS4_IDXF_PER_THREAD];
    idxf_step_load(next, krows, c0, nr, 0);
    idxf_stage_token(qT, sw, qi, w, t, n_head, w_scale);
    const u32 rg = tid / 8, hg = tid % 8;  // rows 4 rg .. 4 rg + 3, heads 8 hg .. 8 hg + 7
    float acc[4][8] = {};
    float* rTf = (float*)rT;
    constexpr u32 RS = DS4_IDXF_ROWS + 4;  // floats per staged dim (padded)
    for (u32 d0 = 0; d0 < DS4_IDX_DIM; d0 += DS4_IDXF_STEP) {
        __syncthreads();
#pragma unroll
        for (u32 k = 0; k < DS4_IDXF_PER_THREAD; ++k) {
            const u32 i = tid + k * DS4_BLOCK;
            rTf[(i % DS4_IDXF_STEP) * RS + i / DS4_IDXF_STEP] = next[k];
        }
        __syncthreads();
        if (d0 + DS4_IDXF_STEP < DS4_IDX_DIM) idxf_step_load(next, krows, c0, nr, d0 + DS4_IDXF_STEP);
#pragma unroll 4
        for (u32 d = 0; d < DS4_IDXF_STEP; ++d) {
            idxf_tile_fma(acc, rT[d][rg], qT[d0 + d][2 * hg], qT[d0 + d][2 * hg + 1]);
        }
    }
#pragma unroll
    for (u32 j = 0; j < 4; ++j) {
        float s = 0.0f;
#pragma unroll
        for (u32 k = 0; k < 8; ++k) s = fmaf(fmaxf(acc[j][k], 0.0f), sw[8 * hg + k], s);
        s = idxf_lanes8_sum(s);
        const u32 r = 4 * rg + j;
        if (hg == 0 && r < nr) scores[(u64)t * score_stride + c0 + r] = s;
    }
}

// The decode twin's rows (c0 .., nr of them) for dims d0 .. d0 + DS4_IDXD_STEP: two float4s a thread
// (zeros past the nr rows). krows 16-byte aligned (kernels::fast_twin checks it).
DS4_DEV void idxd_step_load(float4 (&v)[2], const float* krows, u32 c0, u32 nr, u32 d0) {
#pragma unroll
    for (u32 k = 0; k < 2; ++k) {
        const u32 i = threadIdx.x + k * DS4_BLOCK, r = i / (DS4_IDXD_STEP / 4), c4 = i % (DS4_IDXD_STEP / 4);
        v[k] = r < nr ? *(const float4*)(krows + (u64)(c0 + r) * DS4_IDX_DIM + d0 + 4 * c4)
                      : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
}

// Launch: grid (ceil(grid_rows / 32), n_tok), block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_indexer_scores_decode_fast(
    float* scores, const float* qi, const float* w, const float* krows, const u32* pos, u32 n_head,
    u32 n_comp_avail, u32 ratio, u32 top_k, u32 score_stride, float w_scale) {
    ds4_grid_sync();
    static_assert(DS4_BLOCK == 256, "ds4_indexer_scores_decode_fast: 4 quarters x 8 row groups x 8 head groups");
    static_assert(DS4_IDX_DIM == 2 * DS4_IDXD_STEP && DS4_IDXD_ROWS == 32, "two steps of 16 dims a quarter");
    constexpr u32 QUARTERS = 4, QD = DS4_IDXD_STEP / QUARTERS;
    // The queries [dim][head / 4], then (after the products) the quarters' partial dots
    // [quarter][row][head]: both 32 KB.
    __shared__ float4 qT[DS4_IDX_DIM][DS4_IDX_MAX_HEADS / 4];
    static_assert(sizeof(qT) == QUARTERS * DS4_IDXD_ROWS * DS4_IDX_MAX_HEADS * 4, "partials fit the queries' space");
    __shared__ float4 rT[DS4_IDXD_STEP * DS4_IDXD_RS / 4];  // [dim][row] of one step
    __shared__ float sw[DS4_IDX_MAX_HEADS];
    const u32 t = blockIdx.y, tid = threadIdx.x;
    const u32 n_c = min((pos[0] + t + 1) / ratio, n_comp_avail);
    const u32 c0 = blockIdx.x * DS4_IDXD_ROWS;
    if (n_c <= top_k || c0 >= n_c || n_head > DS4_IDX_MAX_HEADS) return;
    const u32 nr = min((u32)DS4_IDXD_ROWS, n_c - c0);
    float4 next[2];
    idxd_step_load(next, krows, c0, nr, 0);
    idxf_stage_token(qT, sw, qi, w, t, n_head, w_scale);
    // Quarter q; rows 4 rg .. 4 rg + 3; heads 4 hg + i and 32 + 4 hg + i (i < 4): the float4 columns
    // hg and 8 + hg of qT, so a warp's 8 head groups read 8 consecutive float4s.
    const u32 q = tid / 64, rg = (tid % 64) / 8, hg = tid % 8;
    float acc[4][8] = {};
    float* rTf = (float*)rT;
#pragma unroll
    for (u32 s = 0; s < 2; ++s) {
        __syncthreads();
#pragma unroll
        for (u32 k = 0; k < 2; ++k) {
            const u32 i = tid + k * DS4_BLOCK, r = i / (DS4_IDXD_STEP / 4), d = 4 * (i % (DS4_IDXD_STEP / 4));
            idxf_store4_column(rTf + d * DS4_IDXD_RS + r, DS4_IDXD_RS, next[k]);
        }
        __syncthreads();
        if (s == 0) idxd_step_load(next, krows, c0, nr, DS4_IDXD_STEP);
#pragma unroll 4
        for (u32 dd = 0; dd < QD; ++dd) {
            const u32 d = q * QD + dd;
            idxf_tile_fma(acc, rT[(d * DS4_IDXD_RS) / 4 + rg], qT[s * DS4_IDXD_STEP + d][hg],
                          qT[s * DS4_IDXD_STEP + d][8 + hg]);
        }
    }
    __syncthreads();  // every thread is done with qT
    float* part = (float*)qT;  // [quarter][row][head]
#pragma unroll
    for (u32 j = 0; j < 4; ++j) {
        float* pr = part + ((u64)q * DS4_IDXD_ROWS + 4 * rg + j) * DS4_IDX_MAX_HEADS;
        *(float4*)(pr + 4 * hg) = make_float4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]);
        *(float4*)(pr + 32 + 4 * hg) = make_float4(acc[j][4], acc[j][5], acc[j][6], acc[j][7]);
    }
    __syncthreads();
    // Row tid / 8, heads 8 (tid % 8) .. + 7: the quarters' sums in order, then max(0, .) * w.
    const u32 r = tid / 8, h0 = 8 * (tid % 8);
    float sc = 0.0f;
#pragma unroll
    for (u32 k = 0; k < 8; ++k) {
        const u32 h = h0 + k;
        float dot = part[(0 * DS4_IDXD_ROWS + r) * DS4_IDX_MAX_HEADS + h];
#pragma unroll
        for (u32 qq = 1; qq < QUARTERS; ++qq) dot += part[(qq * DS4_IDXD_ROWS + r) * DS4_IDX_MAX_HEADS + h];
        sc = fmaf(fmaxf(dot, 0.0f), sw[h], sc);
    }
    sc = idxf_lanes8_sum(sc);
    if (tid % 8 == 0 && r < nr) scores[(u64)t * score_stride + c0 + r] = sc;
}
