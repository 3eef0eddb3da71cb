// Matrix-vector products for decode, fast arithmetic (docs/arithmetic.md): free summation order and
// FMA, built to keep bytes in flight. A Q8_0 row is cut into chunks of 8 blocks (256 elements,
// 272 bytes, 16-byte aligned when n_in % 256 == 0); a lane loads a whole chunk with 17 16-byte
// loads, takes its 8 blocks apart in registers and dots them with dot4; the G lanes of a row
// (G = min(32, the power of two >= the row's chunk count)) fold their sums as a butterfly.
// Deterministic: the same inputs give the same bits on every run.
#pragma once
#include "formats.h"
#include "norm_quant_fast.hip"  // q8_0_store_lane (the quantizing product), norm_quant_row_fast
#include "rows_fast.hip"        // the row finishing of the products that finish their heads

#define DS4_Q8_0_CHUNK 256   // elements per lane chunk (8 Q8_0 blocks)
#define DS4_Q8_0_CHUNK_B 272 // bytes per lane chunk

// The 32-bit little-endian word at an even byte offset of registers holding consecutive bytes.
DS4_DEV u32 reg_word(const u32* w, u32 byte) {
    const u32 i = byte / 4;
    return byte % 4 == 0 ? w[i] : (w[i] >> 16) | (w[i + 1] << 16);
}
DS4_DEV u16 reg_half(const u32* w, u32 byte) {
    const u32 i = byte / 4;
    return byte % 4 == 0 ? (u16)(w[i] & 0xffff) : (u16)(w[i] >> 16);
}

// W_chunk · x_chunk for one 272-byte chunk of Q8_0 weights (16-byte aligned) and its activation
// codes (256 bytes, 16-byte aligned) and scales (8 floats, 16-byte aligned).
DS4_DEV float q8_0_chunk_dot(const u8* wc, const i8* xc, const float* dc, float acc) {
    u32 w[DS4_Q8_0_CHUNK_B / 4];
#pragma unroll
    for (int i = 0; i < DS4_Q8_0_CHUNK_B / 16; ++i) {
        const uint4 v = ((const uint4*)wc)[i];
        w[4 * i] = v.x;
        w[4 * i + 1] = v.y;
        w[4 * i + 2] = v.z;
        w[4 * i + 3] = v.w;
    }
    const float4 d0 = ((const float4*)dc)[0], d1 = ((const float4*)dc)[1];
    const float ds[8] = {d0.x, d0.y, d0.z, d0.w, d1.x, d1.y, d1.z, d1.w};
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        const uint4 xa = ((const uint4*)xc)[2 * k], xb = ((const uint4*)xc)[2 * k + 1];
        const int xs[8] = {(int)xa.x, (int)xa.y, (int)xa.z, (int)xa.w, (int)xb.x, (int)xb.y, (int)xb.z, (int)xb.w};
        int is = 0;
#pragma unroll
        for (int j = 0; j < 8; ++j) is = dot4_i8((int)reg_word(w, 34 * k + 2 + 4 * j), xs[j], is);
        acc = fmaf(f16_to_f32(reg_half(w, 34 * k)) * ds[k], (float)is, acc);
    }
    return acc;
}

// Lanes per row for a row of n_chunks chunks (a power of two, at most 32).
DS4_DEV u32 q8_0_fast_lanes(u32 n_chunks) {
    u32 g = 1;
    while (g < n_chunks && g < 32) g *= 2;
    return g;
}

// Sum over the G aligned lanes of a row group (G a power of two <= 32); every lane gets the sum.
DS4_DEV float group_sum(float v, u32 g) {
    for (u32 o = g / 2; o > 0; o /= 2) v += __shfl_xor(v, o, DS4_WARP);
    return v;
}

// Coalesced Q8_0 tiles (rows of nc = n_in / 256 chunks, nc a power of two <= 128). A block round
// covers 128 chunks (34,816 bytes, 128 / nc rows): each warp a tile of TW = DS4_WARP / 2 chunks,
// either TW / nc whole rows (nc <= TW) or K-slice s = warp % k of one row (k = nc / TW slices, summed
// through shared memory). A tile is 17 TW 16-byte words, read by consecutive lanes at consecutive
// addresses (9 loads per lane, the next round's issued before this round's math), staged in shared
// memory and read back as lane (j, h) (q8_lane_chunk, q8_lane_half): blocks 4h..4h+3 of chunk j.
// The lane's activation slice (4 blocks of codes and scales) stays in registers while it does not
// change. Rounds are split over the grid in contiguous runs, so any grid covers the matrix.
#define DS4_Q8T_CHUNKS (DS4_WARP / 2)       // chunks per warp tile (TW)
#define DS4_Q8T_WORDS (17 * DS4_Q8T_CHUNKS)  // 16-byte words per warp tile
#define DS4_Q8T_LOADS 9                      // ceil(DS4_Q8T_WORDS / DS4_WARP)
#define DS4_Q8T_ROUND 128                    // chunks per block round (DS4_WARPS_PER_BLOCK * TW)
// Two blocks per SM on sm_90 (at most 128 registers; the tile loads of 16 warps in flight), where
// the compiler would otherwise take ~164 and leave one block (8 warps) per SM.
#if defined(DS4_NVIDIA)
#define DS4_Q8T_LAUNCH __launch_bounds__(DS4_BLOCK, 2)
#else
#define DS4_Q8T_LAUNCH DS4_LAUNCH(DS4_BLOCK)
#endif

// Where a warp's tile sits for one matrix shape.
struct Q8Tiles {
    u32 nc, k, rpt, rpr, s, wr;
};
DS4_DEV Q8Tiles q8_tiles(u32 n_in) {
    Q8Tiles g;
    g.nc = n_in / DS4_Q8_0_CHUNK;
    g.k = g.nc > DS4_Q8T_CHUNKS ? g.nc / DS4_Q8T_CHUNKS : 1;
    g.rpt = g.nc < DS4_Q8T_CHUNKS ? DS4_Q8T_CHUNKS / g.nc : 1;
    g.rpr = DS4_Q8T_ROUND / g.nc;
    g.s = warp_id() % g.k;
    g.wr = warp_id() / g.k;
    return g;
}
// First row of the warp's tile in round `rd`.
DS4_DEV u32 q8_tile_row0(const Q8Tiles& g, u32 rd) { return rd * g.rpr + g.wr * g.rpt; }

// Loads the warp's tile of round `rd` into registers (coalesced; words of rows >= n_out read as 0).
DS4_DEV void q8_tile_load(uint4 (&v)[DS4_Q8T_LOADS], const u8* w, const Q8Tiles& g, u32 rd, u32 n_out) {
    const u32 row0 = q8_tile_row0(g, rd);
    const uint4* base = (const uint4*)(w + ((u64)row0 * g.nc + g.s * DS4_Q8T_CHUNKS) * DS4_Q8_0_CHUNK_B);
#pragma unroll
    for (int i = 0; i < DS4_Q8T_LOADS; ++i) {
        const u32 q = i * DS4_WARP + lane_id();
        const bool ok = q < DS4_Q8T_WORDS && row0 + (q / 17) / g.nc < n_out;
        v[i] = ok ? base[q] : make_uint4(0, 0, 0, 0);
    }
}

// The lane's tile chunk j and half h: lanes 0-7 take half 0 of chunks 0-7, lanes 8-15 half 1 of the
// same chunks, lanes 16-31 chunks 8-15 likewise (a half-warp's 8-byte shared reads then hit 32
// distinct banks).
DS4_DEV u32 q8_lane_chunk() { return lane_id() % 8 + 8 * (lane_id() / 16); }
DS4_DEV u32 q8_lane_half() { return (lane_id() / 8) % 2; }

// Stages the loaded tile in the warp's shared words and reads back this lane's 4 blocks (136
// bytes from chunk byte 136 h, 17 8-byte reads) of tile chunk j.
DS4_DEV void q8_tile_swap(uint4* tile, const uint4 (&v)[DS4_Q8T_LOADS], u32 (&wv)[34]) {
    ds4_sync_warp();  // the lanes' reads of the previous tile are done
#pragma unroll
    for (int i = 0; i < DS4_Q8T_LOADS; ++i) {
        const u32 q = i * DS4_WARP + lane_id();
        if (q < DS4_Q8T_WORDS) tile[q] = v[i];
    }
    ds4_sync_warp();
    const u64* p = (const u64*)tile + 34 * q8_lane_chunk() + 17 * q8_lane_half();
#pragma unroll
    for (int m = 0; m < 17; ++m) {
        const u64 x = p[m];
        wv[2 * m] = (u32)x;
        wv[2 * m + 1] = (u32)(x >> 32);
    }
}

// This lane's activation slice: codes and scales of the 4 blocks it dots.
struct Q8Slice {
    int xs[32];
    float xd[4];
    u32 key;  // group * nc + chunk of the row, or ~0 before the first load
};

// The lane's output row in round `rd` (>= n_out for the tail) and its chunk within the row.
DS4_DEV void q8_lane_row(const Q8Tiles& g, u32 rd, u32& row, u32& cir) {
    const u32 c = g.s * DS4_Q8T_CHUNKS + q8_lane_chunk();
    row = q8_tile_row0(g, rd) + c / g.nc;
    cir = c % g.nc;
}

DS4_DEV Q8Slice q8_slice_empty() {
    Q8Slice x;
#pragma unroll
    for (int i = 0; i < 32; ++i) x.xs[i] = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) x.xd[i] = 0.0f;
    x.key = ~0u;
    return x;
}

DS4_DEV void q8_slice_load(Q8Slice& x, const i8* xq, const float* xd, u32 t, u32 x_stride, u32 grp, u32 cir,
                           u32 n_in, u32 nc) {
    const u32 key = grp * nc + cir;
    if (key == x.key) return;
    x.key = key;
    const u32 h = q8_lane_half();
    const int4* xp =
        (const int4*)(xq + (u64)t * x_stride + (u64)grp * n_in + (u64)cir * DS4_Q8_0_CHUNK + 128 * h);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int4 a = xp[i];
        x.xs[4 * i] = a.x;
        x.xs[4 * i + 1] = a.y;
        x.xs[4 * i + 2] = a.z;
        x.xs[4 * i + 3] = a.w;
    }
    const float4 d = *(const float4*)(xd + (u64)t * (x_stride / 32) + (u64)grp * (n_in / 32) + cir * 8 + 4 * h);
    x.xd[0] = d.x;
    x.xd[1] = d.y;
    x.xd[2] = d.z;
    x.xd[3] = d.w;
}

// The lane's 4 blocks (registers from q8_tile_swap) against its activation slice.
DS4_DEV float q8_lane_dot(const u32 (&wv)[34], const Q8Slice& x) {
    float acc = 0.0f;
#pragma unroll
    for (int b = 0; b < 4; ++b) {
        int is = 0;
#pragma unroll
        for (int j = 0; j < 8; ++j) is = dot4_i8((int)reg_word(wv, 34 * b + 2 + 4 * j), x.xs[8 * b + j], is);
        acc = fmaf(f16_to_f32(reg_half(wv, 34 * b)) * x.xd[b], (float)is, acc);
    }
    return acc;
}

// Sum over the lanes of one row (both halves of min(nc, TW) chunks); every lane gets it. Chunk bit
// b of the lane's tile chunk is lane bit b (b < 3) or b + 1, the half is lane bit 3.
DS4_DEV float q8_row_sum(float v, u32 nc) {
    for (u32 o = 1; o < min(nc, (u32)DS4_Q8T_CHUNKS); o *= 2) v += __shfl_xor(v, o < 8 ? o : 2 * o, DS4_WARP);
    return v + __shfl_xor(v, 8, DS4_WARP);
}

// The rounds [begin, end) of this block: contiguous runs of a multiple of `align` rounds, any grid.
// The product's blocks are [block0, gridDim.x) (blocks before block0 do other work).
DS4_DEV void q8_block_rounds(u32 n_out, u32 rpr, u32& begin, u32& end, u32 align = 1, u32 block0 = 0) {
    const u32 total = (n_out + rpr - 1) / rpr, blocks = gridDim.x - block0;
    const u32 per = ((total + blocks - 1) / blocks + align - 1) / align * align;
    begin = min(total, (blockIdx.x - block0) * per);
    end = min(total, begin + per);
}

// Rows of Q8_0 output a block gathers before it quantizes them: the 32 of a Q8_0 block, or a
// round's rows when a round has more (128 / nc rows, nc >= 1).
#define DS4_Q8T_QROWS DS4_Q8T_ROUND

// Quantizes the gathered rows [row0, row0 + n) (n and row0 multiples of 32) of qrow as
// ds4_rms_norm_quant_fast's Q8_0 without norm (q8_0_store_lane). Call from every thread, between
// barriers.
DS4_DEV void q8_quantize_rows(const float* qrow, u32 row0, u32 n, i8* q_out, float* d_out) {
    for (u32 i0 = 0; i0 < n; i0 += DS4_BLOCK) {
        const u32 i = i0 + threadIdx.x;
        q8_0_store_lane(i < n ? qrow[i] : 0.0f, i, i < n, q_out + row0, d_out + row0 / 32);
    }
}

// Whether the tiled path takes rows of n_in elements (nc a power of two <= 128).
DS4_DEV bool q8_tiled(u32 n_in) {
    const u32 nc = n_in / DS4_Q8_0_CHUNK;
    return nc > 0 && nc <= DS4_Q8T_ROUND && (nc & (nc - 1)) == 0;
}

// A tiled product's Q8_0 activations: codes, scales and the token row of them to read.
struct Q8Act {
    const i8* q;
    const float* d;
    u32 t;
};
// The launch's activations in global memory, token blockIdx.y.
struct Q8GlobalAct {
    const i8* q;
    const float* d;
    __device__ __forceinline__ Q8Act operator()() const { return {q, d, blockIdx.y}; }
};

// The matrix a round of a tiled product reads: rows [0, n0) of w0 (to y0), then, when n1 > 0, rows
// [0, n1) of w1 (to y1) as rounds n0 / rpr.. (n0 a multiple of rpr then, so no round spans both).
struct Q8RoundMatrix {
    const u8* w;
    float* y;
    u32 rd, n_out;  // the round within the matrix and the matrix's rows
};
DS4_DEV Q8RoundMatrix q8_round_matrix(u32 rd, u32 rpr, const u8* w0, float* y0, u32 n0, const u8* w1, float* y1,
                                      u32 n1) {
    const u32 first = n0 / rpr;
    if (n1 == 0 || rd < first) return {w0, y0, rd, n0};
    return {w1, y1, rd - first, n1};
}

// The tiled fast product (n_in / 256 a power of two <= 128, q8_tiled) of one matrix (n1 = 0; grouped
// rows read their group's activations at grp * n_in) or of two sharing their Q8_0 activations
// (q8_round_matrix). Grid (any, n_tok): q8_block_rounds splits the rounds of n0 + n1 rows.
// QOUT (one matrix, n0 % 32 == 0, the round's rows a divisor or a multiple of 32): instead of y0,
// the rows' Q8_0 codes (q_out) and scales (d_out), each block's run whole Q8_0 blocks of rows,
// gathered in shared memory and quantized as each block of 32 completes.
// act_of() gives the activations (Q8Act) once the block's first tile loads are in flight, so a
// block that makes its own (ds4_matvec_q8_0_normed_fast) does so under their latency.
// done(r0, r1), when given, runs in every thread of a block once it has written its rows [r0, r1)
// (of n0 + n1; the products that finish their heads, at the end of this file, finish them there); the product's blocks are
// [block0, gridDim.x).
struct Q8NoDone {
    __device__ __forceinline__ void operator()(u32, u32) const {}
};
template <bool QOUT, class ActOf, class Done = Q8NoDone>
DS4_DEV void q8_tiled_product(float* y0, float* y1, const u8* w0, const u8* w1, ActOf act_of, u32 n_in, u32 n0,
                              u32 n1, u32 rows_per_group, u32 x_stride, i8* q_out, float* d_out, Done done = Done(),
                              u32 block0 = 0) {
    __shared__ uint4 tiles[DS4_WARPS_PER_BLOCK * DS4_Q8T_WORDS];
    __shared__ float part[2][DS4_WARPS_PER_BLOCK];
    __shared__ float qrow[QOUT ? DS4_Q8T_QROWS : 1];
    const u32 t = blockIdx.y;
    const Q8Tiles g = q8_tiles(n_in);
    const u32 q_span = g.rpr >= 32 ? g.rpr : 32;  // rows quantized together
    u32 begin, end;
    q8_block_rounds(n0 + n1, g.rpr, begin, end, QOUT ? q_span / g.rpr : 1, block0);
    if (begin >= end) {
        ds4_grid_sync();
        return;
    }
    uint4* tile = tiles + warp_id() * DS4_Q8T_WORDS;
    uint4 v[DS4_Q8T_LOADS];
    Q8Slice x = q8_slice_empty();
    Q8RoundMatrix m = q8_round_matrix(begin, g.rpr, w0, y0, n0, w1, y1, n1);
    q8_tile_load(v, m.w, g, m.rd, m.n_out);
    // The first round's weights are in flight before the wait for the previous launch: only what
    // follows reads its outputs (prelude.h ds4_grid_sync).
    ds4_grid_sync();
    const Q8Act act = act_of();
    {
        // The first round's activation slice, its loads in flight with the tile's (a block of one
        // or two rounds would otherwise wait for one, then the other).
        u32 row, cir;
        q8_lane_row(g, m.rd, row, cir);
        if (row < m.n_out) q8_slice_load(x, act.q, act.d, act.t, x_stride, row / rows_per_group, cir, n_in, g.nc);
    }
    for (u32 rd = begin; rd < end; ++rd) {
        u32 wv[34];
        q8_tile_swap(tile, v, wv);
        const Q8RoundMatrix cur = m;
        if (rd + 1 < end) {
            m = q8_round_matrix(rd + 1, g.rpr, w0, y0, n0, w1, y1, n1);
            q8_tile_load(v, m.w, g, m.rd, m.n_out);
        }
        u32 row, cir;
        q8_lane_row(g, cur.rd, row, cir);
        if (row < cur.n_out)
            q8_slice_load(x, act.q, act.d, act.t, x_stride, row / rows_per_group, cir, n_in, g.nc);
        const float acc = q8_row_sum(q8_lane_dot(wv, x), g.nc);
        if (g.k == 1) {
            if (row < cur.n_out && cir == 0 && q8_lane_half() == 0) {
                if (QOUT)
                    qrow[row % q_span] = acc;
                else
                    cur.y[(u64)t * cur.n_out + row] = acc;
            }
        } else {
            float* p = part[rd & 1];
            if (lane_id() == 0) p[warp_id()] = acc;
            __syncthreads();
            const u32 r = cur.rd * g.rpr + threadIdx.x;
            if (threadIdx.x < g.rpr && r < cur.n_out) {
                float sum = 0.0f;
                for (u32 s = 0; s < g.k; ++s) sum += p[threadIdx.x * g.k + s];
                if (QOUT)
                    qrow[r % q_span] = sum;
                else
                    cur.y[(u64)t * cur.n_out + r] = sum;
            }
        }
        if (QOUT) {
            const u32 rows_done = (cur.rd + 1) * g.rpr;  // rows of the matrix finished after this round
            if (rows_done % q_span == 0 || rows_done >= cur.n_out) {
                __syncthreads();
                const u32 row0 = (rows_done - 1) / q_span * q_span;
                q8_quantize_rows(qrow, (u32)((u64)t * cur.n_out + row0), min(q_span, cur.n_out - row0), q_out, d_out);
                __syncthreads();
            }
        }
    }
    done(begin * g.rpr, min(end * g.rpr, n0 + n1));
}

// ds4_matvec_q8_0's product and arguments (grouped rows included) in the fast order; n_in % 256 == 0.
// Tiled (n_in / 256 a power of two <= 128): grid (any, n_tok), q8_0_fast_blocks rounds of 128 / nc
// rows. Otherwise: grid (ceil(n_out / (256 / G)), n_tok), G = q8_0_fast_lanes(n_in / 256) lanes a row
// (each lane a whole 272-byte chunk at a time). Block 256.
extern "C" __global__ DS4_Q8T_LAUNCH void ds4_matvec_q8_0_fast(float* y, const u8* w, const i8* xq,
                                                                       const float* xd, u32 n_in, u32 n_out,
                                                                       u32 rows_per_group, u32 x_stride) {
    if (q8_tiled(n_in)) {  // ds4_grid_sync in q8_tiled_product
        q8_tiled_product<false>(y, nullptr, w, nullptr, Q8GlobalAct{xq, xd}, n_in, n_out, 0, rows_per_group, x_stride,
                                nullptr, nullptr);
        return;
    }
    ds4_grid_sync();
    const u32 t = blockIdx.y, nc = n_in / DS4_Q8_0_CHUNK, g = q8_0_fast_lanes(nc);
    const u32 r = blockIdx.x * (DS4_BLOCK / g) + threadIdx.x / g, sub = threadIdx.x % g;
    const bool live = r < n_out;
    float acc = 0.0f;
    if (live) {
        const u32 grp = r / rows_per_group;
        const i8* xr = xq + (u64)t * x_stride + (u64)grp * n_in;
        const float* dr = xd + (u64)t * (x_stride / 32) + (u64)grp * (n_in / 32);
        const u8* wr = w + (u64)r * nc * DS4_Q8_0_CHUNK_B;
        for (u32 c = sub; c < nc; c += g)
            acc = q8_0_chunk_dot(wr + (u64)c * DS4_Q8_0_CHUNK_B, xr + c * DS4_Q8_0_CHUNK, dr + c * 8, acc);
    }
    acc = group_sum(acc, g);
    if (live && sub == 0) y[(u64)t * n_out + r] = acc;
}

// ds4_matvec_q8_0_fast followed by ds4_rms_norm_quant_fast's Q8_0 of its output rows (no norm, rows of
// 32-element blocks) in one launch: q_out [n_tok][n_out] codes and d_out [n_tok][n_out / 32] scales
// with the bits of the two launches; the f32 rows are not written (e.g. the attention's grouped
// low-rank output before its second projection). Preconditions (kernels::matvec_q8_0_quantized
// checks them): the tiled shapes (n_in / 256 a power of two <= 128), n_out % 32 == 0, and the
// 128 / (n_in / 256) rows of a round dividing 32 or a multiple of it. Grid (any, n_tok), block 256.
extern "C" __global__ DS4_Q8T_LAUNCH void ds4_matvec_q8_0_q8_fast(i8* q_out, float* d_out, const u8* w,
                                                                   const i8* xq, const float* xd, u32 n_in,
                                                                   u32 n_out, u32 rows_per_group, u32 x_stride) {
    if (!q8_tiled(n_in) || n_out % 32 != 0) {
        ds4_grid_sync();
        return;
    }  // otherwise ds4_grid_sync in q8_tiled_product
    q8_tiled_product<true>(nullptr, nullptr, w, nullptr, Q8GlobalAct{xq, xd}, n_in, n_out, 0, rows_per_group,
                           x_stride, q_out, d_out);
}

// ds4_rms_norm_quant_fast (norm with weight norm_w, Q8_0) of each token's row of x followed by
// ds4_matvec_q8_0_fast of the codes, in one launch (the query's up-projection of its normed
// down-projection): every block norms and quantizes the token's row into its shared memory while
// its first weight tiles load, instead of a one-block launch before the product (and its gap) on
// the step's critical path. y has the bits of the two launches; the normed row and its planes are
// not written. Preconditions (kernels::matvec_q8_0_normed checks them): the tiled shapes, n_in <=
// DS4_Q8N_MAX. Grid (any, n_tok), block 256.
#define DS4_Q8N_MAX (8 * DS4_BLOCK)  // one 8-element strip a thread (norm_quant_row_fast<1>)
// The activations of a block that makes its own (q8_tiled_product's act_of): token blockIdx.y's row
// of x normed with weight norm_w and quantized to Q8_0 into the block's shared sq, sd (n_in <=
// DS4_Q8N_MAX), with ds4_rms_norm_quant_fast's bits.
struct Q8NormedAct {
    const float* x;
    const float* norm_w;
    i8* sq;
    float* sd;
    u32 n_in, x_stride;
    float eps;
    __device__ __forceinline__ Q8Act operator()() const {
        norm_quant_row_fast<1>(0, x + (u64)blockIdx.y * x_stride, nullptr, sq, sd, nullptr, nullptr, nullptr, norm_w,
                               n_in, DS4_NQ_NORM, eps);
        __syncthreads();
        return {sq, sd, 0};
    }
};
extern "C" __global__ DS4_Q8T_LAUNCH void ds4_matvec_q8_0_normed_fast(float* y, const u8* w, const float* x,
                                                                      const float* norm_w, u32 n_in, u32 n_out,
                                                                      u32 x_stride, float eps) {
    __shared__ int4 sq[DS4_Q8N_MAX / 16];
    __shared__ float4 sd[DS4_Q8N_MAX / 128];
    if (!q8_tiled(n_in) || n_in > DS4_Q8N_MAX) {
        ds4_grid_sync();
        return;
    }  // otherwise ds4_grid_sync in q8_tiled_product
    const Q8NormedAct act_of{x, norm_w, (i8*)sq, (float*)sd, n_in, x_stride, eps};
    q8_tiled_product<false>(y, nullptr, w, nullptr, act_of, n_in, n_out, 0, n_out, n_in, nullptr, nullptr);
}

// y0 = W0 · x and y1 = W1 · x in one launch (two projections of the same Q8_0 activations, e.g. a
// layer's query and kv down-projections): rows [0, n_out0) of w0 then [0, n_out1) of w1 as one
// grid's rounds. Preconditions (kernels::paired_matvec_q8_0 checks them): the tiled shapes (n_in /
// 256 a power of two <= 128) and n_out0 a multiple of the round's 128 / (n_in / 256) rows. Grid
// (any, n_tok), block 256; each row's bits are those of ds4_matvec_q8_0_fast.
extern "C" __global__ DS4_Q8T_LAUNCH void ds4_matvec_q8_0_pair_fast(float* y0, float* y1, const u8* w0,
                                                                            const u8* w1, const i8* xq,
                                                                            const float* xd, u32 n_in,
                                                                            u32 n_out0, u32 n_out1) {
    if (!q8_tiled(n_in)) {
        ds4_grid_sync();
        return;
    }  // otherwise ds4_grid_sync in q8_tiled_product
    q8_tiled_product<false>(y0, y1, w0, w1, Q8GlobalAct{xq, xd}, n_in, n_out0, n_out1, n_out0 + n_out1, n_in, nullptr,
                            nullptr);
}

// The tiled form of ds4_matvec_q8_0_swiglu_fast (q8_tiled(n_in)) for token blockIdx.y; done(r0, r1)
// as q8_tiled_product's, once the block has written its rows [r0, r1) of mid.
template <class Done>
DS4_DEV void q8_swiglu_tiled(float* mid, const u8* wg, const u8* wu, const i8* xq, const float* xd, u32 n_in,
                             u32 n_ff, float limit, Done done) {
    __shared__ uint4 tiles[DS4_WARPS_PER_BLOCK * DS4_Q8T_WORDS];
    __shared__ float part[2][2][DS4_WARPS_PER_BLOCK];
    const u32 t = blockIdx.y;
    const Q8Tiles g = q8_tiles(n_in);
    u32 begin, end;
    q8_block_rounds(n_ff, g.rpr, begin, end);
    if (begin >= end) {
        ds4_grid_sync();
        return;
    }
    uint4* tile = tiles + warp_id() * DS4_Q8T_WORDS;
    uint4 vg[DS4_Q8T_LOADS], vu[DS4_Q8T_LOADS];
    Q8Slice x = q8_slice_empty();
    q8_tile_load(vg, wg, g, begin, n_ff);
    q8_tile_load(vu, wu, g, begin, n_ff);
    ds4_grid_sync();  // the first round's weights in flight before the wait (prelude.h)
    for (u32 rd = begin; rd < end; ++rd) {
        const bool more = rd + 1 < end;
        u32 row, cir;
        q8_lane_row(g, rd, row, cir);
        if (row < n_ff) q8_slice_load(x, xq, xd, t, n_in, 0, cir, n_in, g.nc);
        u32 wv[34];
        q8_tile_swap(tile, vg, wv);
        if (more) q8_tile_load(vg, wg, g, rd + 1, n_ff);
        const float ga = q8_row_sum(q8_lane_dot(wv, x), g.nc);
        q8_tile_swap(tile, vu, wv);
        if (more) q8_tile_load(vu, wu, g, rd + 1, n_ff);
        const float ua = q8_row_sum(q8_lane_dot(wv, x), g.nc);
        if (g.k == 1) {
            if (row < n_ff && cir == 0 && q8_lane_half() == 0)
                mid[(u64)t * n_ff + row] = swiglu_clamped(ga, ua, limit);
        } else {
            float(*p)[DS4_WARPS_PER_BLOCK] = part[rd & 1];
            if (lane_id() == 0) {
                p[0][warp_id()] = ga;
                p[1][warp_id()] = ua;
            }
            __syncthreads();
            const u32 r = rd * g.rpr + threadIdx.x;
            if (threadIdx.x < g.rpr && r < n_ff) {
                float gs = 0.0f, us = 0.0f;
                for (u32 s = 0; s < g.k; ++s) {
                    gs += p[0][threadIdx.x * g.k + s];
                    us += p[1][threadIdx.x * g.k + s];
                }
                mid[(u64)t * n_ff + r] = swiglu_clamped(gs, us, limit);
            }
        }
    }
    done(begin * g.rpr, min(end * g.rpr, n_ff));
}

// ds4_matvec_q8_0_swiglu in the fast order: mid[t][r] = swiglu(Wg[r]·x, Wu[r]·x); n_in % 256 == 0.
// Tiled as ds4_matvec_q8_0_fast (gate and up tiles of a round loaded together, staged one after the
// other; q8_swiglu_tiled): grid (any, n_tok); otherwise grid (ceil(n_ff / (256 / G)), n_tok). Block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_matvec_q8_0_swiglu_fast(float* mid, const u8* wg,
                                                                              const u8* wu, const i8* xq,
                                                                              const float* xd, u32 n_in, u32 n_ff,
                                                                              float limit) {
    const u32 t = blockIdx.y;
    if (q8_tiled(n_in)) {
        q8_swiglu_tiled(mid, wg, wu, xq, xd, n_in, n_ff, limit, Q8NoDone());
        return;
    }
    ds4_grid_sync();
    const u32 nc = n_in / DS4_Q8_0_CHUNK, g = q8_0_fast_lanes(nc);
    const u32 r = blockIdx.x * (DS4_BLOCK / g) + threadIdx.x / g, sub = threadIdx.x % g;
    const bool live = r < n_ff;
    float ga = 0.0f, ua = 0.0f;
    if (live) {
        const i8* xr = xq + (u64)t * n_in;
        const float* dr = xd + (u64)t * (n_in / 32);
        const u64 off = (u64)r * nc * DS4_Q8_0_CHUNK_B;
        for (u32 c = sub; c < nc; c += g) {
            const u64 o = off + (u64)c * DS4_Q8_0_CHUNK_B;
            ga = q8_0_chunk_dot(wg + o, xr + c * DS4_Q8_0_CHUNK, dr + c * 8, ga);
            ua = q8_0_chunk_dot(wu + o, xr + c * DS4_Q8_0_CHUNK, dr + c * 8, ua);
        }
    }
    ga = group_sum(ga, g);
    ua = group_sum(ua, g);
    if (live && sub == 0) mid[(u64)t * n_ff + r] = swiglu_clamped(ga, ua, limit);
}

// F16 rows in the fast order: T = f16_fast_threads(n_in) threads a row (256 / T rows a block), thread
// i of a row taking 16-byte words i, i + T, ... (consecutive threads at consecutive addresses), four
// loads in flight at a time, FMAs into two sums; the row's threads fold by butterfly and, past a
// warp, through shared memory. T is the power of two <= n_in / 32 (so 4 to 7 words a thread), at
// least 1 and at most 256.
DS4_DEV u32 f16_fast_threads(u32 n_in) {
    const u32 words = n_in / 8;
    u32 t = 1;
    while (t * 2 <= words / 4 && t < DS4_BLOCK) t *= 2;
    return t;
}

DS4_DEV float f16_word_dot(uint4 v, const float* x, float acc) {
    const float4 xa = ((const float4*)x)[0], xb = ((const float4*)x)[1];
    acc = fmaf(f16_to_f32((u16)(v.x & 0xffff)), xa.x, acc);
    acc = fmaf(f16_to_f32((u16)(v.x >> 16)), xa.y, acc);
    acc = fmaf(f16_to_f32((u16)(v.y & 0xffff)), xa.z, acc);
    acc = fmaf(f16_to_f32((u16)(v.y >> 16)), xa.w, acc);
    acc = fmaf(f16_to_f32((u16)(v.z & 0xffff)), xb.x, acc);
    acc = fmaf(f16_to_f32((u16)(v.z >> 16)), xb.y, acc);
    acc = fmaf(f16_to_f32((u16)(v.w & 0xffff)), xb.z, acc);
    return fmaf(f16_to_f32((u16)(v.w >> 16)), xb.w, acc);
}

// Thread `sub`'s four words of the first step of f16_row_part, loaded ahead of it (before
// ds4_grid_sync: weights only); `ok` false when the row has no whole step for the thread (or !live).
struct F16First {
    uint4 v[4];
    bool ok;
};
DS4_DEV F16First f16_row_first(const u16* wr, u32 n_in, u32 sub, u32 tpr, bool live) {
    const uint4* w4 = (const uint4*)wr;
    F16First f;
    f.ok = live && sub + 3 * tpr < n_in / 8;
#pragma unroll
    for (int i = 0; i < 4; ++i) f.v[i] = f.ok ? w4[sub + i * tpr] : make_uint4(0, 0, 0, 0);
    return f;
}

// Thread `sub`'s part of row `wr` · x (n_in / 8 words, T threads a row); `first`, when given, holds
// the first step's words (the same sums in the same order as loading them here).
DS4_DEV float f16_row_part(const u16* wr, const float* x, u32 n_in, u32 sub, u32 tpr,
                           const F16First* first = nullptr) {
    const uint4* w4 = (const uint4*)wr;
    const u32 nw = n_in / 8;
    float a0 = 0.0f, a1 = 0.0f;
    u32 c = sub;
    if (first && first->ok) {
        a0 = f16_word_dot(first->v[0], x + 8 * c, a0);
        a1 = f16_word_dot(first->v[1], x + 8 * (c + tpr), a1);
        a0 = f16_word_dot(first->v[2], x + 8 * (c + 2 * tpr), a0);
        a1 = f16_word_dot(first->v[3], x + 8 * (c + 3 * tpr), a1);
        c += 4 * tpr;
    }
    for (; c + 3 * tpr < nw; c += 4 * tpr) {
        const uint4 v0 = w4[c], v1 = w4[c + tpr], v2 = w4[c + 2 * tpr], v3 = w4[c + 3 * tpr];
        a0 = f16_word_dot(v0, x + 8 * c, a0);
        a1 = f16_word_dot(v1, x + 8 * (c + tpr), a1);
        a0 = f16_word_dot(v2, x + 8 * (c + 2 * tpr), a0);
        a1 = f16_word_dot(v3, x + 8 * (c + 3 * tpr), a1);
    }
    for (; c < nw; c += tpr) a0 = f16_word_dot(w4[c], x + 8 * c, a0);
    return a0 + a1;
}

// Sum over the T threads of a row (aligned groups of T threads); thread 0 of the row gets it.
// Contains __syncthreads() when T > DS4_WARP: call from every thread of the block.
DS4_DEV float f16_row_sum(float v, u32 tpr, float* scratch) {
    if (tpr <= DS4_WARP) return group_sum(v, tpr);
    v = warp_sum(v);
    if (lane_id() == 0) scratch[warp_id()] = v;
    __syncthreads();
    const u32 per = tpr / DS4_WARP, first = warp_id() / per * per;
    float s = 0.0f;
    for (u32 i = 0; i < per; ++i) s += scratch[first + i];
    return s;
}

// ds4_matvec_f16's product and arguments in the fast order (same preconditions: n_in % 8 == 0, rows
// and x 16-byte aligned). Launch: grid (ceil(n_out / (256 / T)), n_tok), block 256,
// T = f16_fast_threads(n_in).
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_matvec_f16_fast(float* y, const u16* w, const float* x,
                                                                      u32 n_in, u32 n_out, u32 x_stride) {
    __shared__ float scratch[DS4_WARPS_PER_BLOCK];
    const u32 t = blockIdx.y, tpr = f16_fast_threads(n_in);
    const u32 r = blockIdx.x * (DS4_BLOCK / tpr) + threadIdx.x / tpr, sub = threadIdx.x % tpr;
    const bool live = r < n_out;
    const u16* wr = w + (u64)(live ? r : 0) * n_in;
    const F16First first = f16_row_first(wr, n_in, sub, tpr, live);  // weights: before the wait
    ds4_grid_sync();
    const float part = live ? f16_row_part(wr, x + (u64)t * x_stride, n_in, sub, tpr, &first) : 0.0f;
    const float acc = f16_row_sum(part, tpr, scratch);
    if (live && sub == 0) y[(u64)t * n_out + r] = acc;
}

// ds4_matvec_f16_pair in the fast order: rows [0, n_out) of W0 to y0, rows [n_out, 2 n_out) of W1 to y1.
// Launch: grid (ceil(2 n_out / (256 / T)), n_tok), block 256, T = f16_fast_threads(n_in).
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_matvec_f16_pair_fast(float* y0, float* y1, const u16* w0,
                                                                           const u16* w1, const float* x, u32 n_in,
                                                                           u32 n_out, u32 x_stride) {
    __shared__ float scratch[DS4_WARPS_PER_BLOCK];
    const u32 t = blockIdx.y, tpr = f16_fast_threads(n_in);
    const u32 r = blockIdx.x * (DS4_BLOCK / tpr) + threadIdx.x / tpr, sub = threadIdx.x % tpr;
    const bool live = r < 2 * n_out, second = r >= n_out;
    const u32 rr = live ? (second ? r - n_out : r) : 0;
    const u16* wr = (second ? w1 : w0) + (u64)rr * n_in;
    const F16First first = f16_row_first(wr, n_in, sub, tpr, live);  // weights: before the wait
    ds4_grid_sync();
    const float part = live ? f16_row_part(wr, x + (u64)t * x_stride, n_in, sub, tpr, &first) : 0.0f;
    const float acc = f16_row_sum(part, tpr, scratch);
    if (live && sub == 0) (second ? y1 : y0)[(u64)t * n_out + rr] = acc;
}

// Products whose blocks finish their output units, fast arithmetic (docs/arithmetic.md): a decode
// step's projection followed by the work that needs whole units of its output (the row finishing of
// heads: norm, RoPE, E4M3 or Hadamard/FP4; the Q8_0 quantization of 256-row units), in one launch
// instead of two. Every block counts the rows it wrote into its units' counters (prelude.h
// last_arrival_of); the block that completes a unit finishes it at once, reading the rows the other
// blocks wrote. So most units finish while the product's other blocks still stream weights, and the
// second launch (and its gap on the step's chain) is gone. The outputs have the bits of the two fast
// launches one after the other. Deterministic: which block finishes a unit varies, the arithmetic
// does not.

// For each unit of `unit` rows (a head, a quantization unit) that the block's rows [r0, r1) fall in: counts them toward
// the unit's counter (u32 [units]) and runs fin(h) in the block that completes unit h. Every thread
// of the block (r0, r1 block-uniform).
template <class Fin>
DS4_DEV void finish_units(u32* counter, u32 r0, u32 r1, u32 unit, Fin fin) {
    for (u32 h = r0 / unit; h * unit < r1; ++h) {
        const u32 a = max(r0, h * unit), b = min(r1, (h + 1) * unit);
        if (last_arrival_of(&counter[h], b - a, unit)) fin(h);
    }
}

// ds4_matvec_q8_0_normed_fast (y = the query heads, n_head rows of head_dim), then
// ds4_rows_finish_pair_fast of those heads (ring, row_w, flags, ring_cap) and of the rows x2
// (n_head2 rows: the layer's kv row, made by an earlier launch), in one launch
// (kernels::matvec_q8_0_normed_rows). Blocks [0, n_head2) finish x2's rows, one a block, from the
// start; the others run the product, each head finished by the block that completes it. counter: u32
// [n_tok][n_head], zero before the launch (the finishers put it back). Preconditions (the builder
// checks them): the normed product's, n_head * head_dim == n_out, the row finish's. Grid
// (n_head2 + product blocks, n_tok), block 256.
extern "C" __global__ DS4_Q8T_LAUNCH void ds4_matvec_q8_0_normed_rows_fast(
    float* y, const u8* w, const float* x, const float* norm_w, u32 n_in, u32 n_out, u32 x_stride, float eps,
    u32* counter, float* ring, const float* row_w, u32 n_head, u32 flags, u32 ring_cap, float* x2, float* ring2,
    const float* w2, u32 n_head2, u32 flags2, u32 ring_cap2, const u32* pos, u32 head_dim, u32 n_rot, u32 n_tok,
    float theta_scale, float freq_scale, float ext_factor, float corr_low, float corr_high, float mscale,
    float row_eps) {
    __shared__ int4 sq[DS4_Q8N_MAX / 16];
    __shared__ float4 sd[DS4_Q8N_MAX / 128];
    if (!q8_tiled(n_in) || n_in > DS4_Q8N_MAX || n_head * head_dim != n_out || gridDim.x <= n_head2) {
        ds4_grid_sync();
        return;
    }
    if (blockIdx.x < n_head2) {
        ds4_grid_sync();
        rows_finish_fast_row(x2, ring2, w2, pos, n_head2, blockIdx.x, head_dim, n_rot, flags2, n_tok, 0, 0, ring_cap2,
                             theta_scale, freq_scale, ext_factor, corr_low, corr_high, mscale, row_eps);
        return;
    }
    const Q8NormedAct act_of{x, norm_w, (i8*)sq, (float*)sd, n_in, x_stride, eps};
    u32* cnt = counter + (u64)blockIdx.y * n_head;
    auto done = [&](u32 r0, u32 r1) {
        finish_units(cnt, r0, r1, head_dim, [&](u32 h) {
            rows_finish_fast_row<true>(y, ring, row_w, pos, n_head, h, head_dim, n_rot, flags, n_tok, 0, 0, ring_cap,
                                       theta_scale, freq_scale, ext_factor, corr_low, corr_high, mscale, row_eps);
        });
    };
    // ds4_grid_sync in q8_tiled_product
    q8_tiled_product<false>(y, nullptr, w, nullptr, act_of, n_in, n_out, 0, n_out, n_in, nullptr, nullptr, done,
                            n_head2);
}

// ds4_rms_norm_quant_fast's norm (weight norm_w, f32 out) of each token's row of x, then
// ds4_matvec_f16_fast of the normed row (y = n_head heads of DS4_ROWH_DIM rows: the indexer's query
// heads), then ds4_rows_finish_hadamard_fast of those heads (flags: RoPE and Hadamard/FP4), in one
// launch (kernels::matvec_f16_normed_hadamard): every block norms the row into its shared memory
// after its first weight words are in flight, and the block that completes a head finishes it on
// its first warp. The normed row is not written. counter: u32 [n_tok][n_head], zero before the
// launch (the finishers put it back). Preconditions (the builder checks them): n_in % 8 == 0, n_in
// <= DS4_Q8N_MAX, head_dim == DS4_ROWH_DIM, n_head * head_dim == n_out, 16-byte aligned rows.
// Grid (ceil(n_out / (256 / T)), n_tok), T = f16_fast_threads(n_in); block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_matvec_f16_normed_hadamard_fast(
    float* y, const u16* w, const float* x, const float* norm_w, u32 n_in, u32 n_out, u32 x_stride, float norm_eps,
    u32* counter, const u32* pos, u32 n_head, u32 head_dim, u32 n_rot, u32 flags, u32 n_tok, float theta_scale,
    float freq_scale, float ext_factor, float corr_low, float corr_high, float mscale, float eps) {
    __shared__ float scratch[DS4_WARPS_PER_BLOCK];
    __shared__ float4 xs[DS4_Q8N_MAX / 4];
    const u32 t = blockIdx.y, tpr = f16_fast_threads(n_in), rpb = DS4_BLOCK / tpr;
    const u32 r = blockIdx.x * rpb + threadIdx.x / tpr, sub = threadIdx.x % tpr;
    if (n_in > DS4_Q8N_MAX || head_dim != DS4_ROWH_DIM || n_head * head_dim != n_out) {
        ds4_grid_sync();
        return;
    }
    const bool live = r < n_out;
    const u16* wr = w + (u64)(live ? r : 0) * n_in;
    const F16First first = f16_row_first(wr, n_in, sub, tpr, live);  // weights: before the wait
    ds4_grid_sync();
    norm_quant_row_fast<1>(0, x + (u64)t * x_stride, (float*)xs, nullptr, nullptr, nullptr, nullptr, nullptr, norm_w,
                           n_in, DS4_NQ_NORM, norm_eps);
    __syncthreads();
    const float part = live ? f16_row_part(wr, (const float*)xs, n_in, sub, tpr, &first) : 0.0f;
    const float acc = f16_row_sum(part, tpr, scratch);
    if (live && sub == 0) y[(u64)t * n_out + r] = acc;
    const u32 r0 = min(blockIdx.x * rpb, n_out), r1 = min(r0 + rpb, n_out);
    finish_units(counter + (u64)t * n_head, r0, r1, head_dim, [&](u32 h) {
        if (warp_id() == 0)
            rows_finish_hadamard_row<true>(y, nullptr, pos, n_head, h, n_rot, flags, n_tok, 0, 0, theta_scale,
                                           freq_scale, ext_factor, corr_low, corr_high, mscale, eps);
    });
}

// ds4_matvec_q8_0_swiglu_fast (tiled) followed by the Q8_0 quantization of its output rows as rows
// of 256 (kernels::quantize_rows of mid: the shared expert's down-projection input), in one launch
// (kernels::matvec_q8_0_swiglu_quantized): the block that completes a 256-row unit of mid
// quantizes it (32 threads, one 8-element strip each, as ds4_rms_norm_quant_fast holds a row of
// 256). mid is written as well. counter: u32 [n_tok][n_ff / 256], zero before the launch (the
// finishers put it back). Preconditions (the builder checks them): the tiled shapes, n_ff % 256 ==
// 0. Grid (any, n_tok), block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_matvec_q8_0_swiglu_q8_fast(float* mid, i8* q_out, float* d_out,
                                                                                 u32* counter, const u8* wg,
                                                                                 const u8* wu, const i8* xq,
                                                                                 const float* xd, u32 n_in, u32 n_ff,
                                                                                 float limit) {
    if (!q8_tiled(n_in) || n_ff % 256 != 0) {
        ds4_grid_sync();
        return;
    }
    const u32 units = n_ff / 256;
    u32* cnt = counter + (u64)blockIdx.y * units;
    auto done = [&](u32 r0, u32 r1) {
        finish_units(cnt, r0, r1, 256, [&](u32 u) {
            const u64 unit = (u64)blockIdx.y * units + u;
            // One load each (volatile: other blocks of this launch wrote them).
            float v[1][8];
#pragma unroll
            for (int j = 0; j < 8; ++j)
                v[0][j] = threadIdx.x < 32 ? ((const volatile float*)mid)[unit * 256 + 8 * threadIdx.x + j] : 0.0f;
            nqf_store_row<1>(unit, v, 256, nullptr, q_out, d_out, nullptr, nullptr, nullptr);
        });
    };
    q8_swiglu_tiled(mid, wg, wu, xq, xd, n_in, n_ff, limit, done);  // ds4_grid_sync in q8_swiglu_tiled
}
