// Tiled GEMMs for batched prefill (docs/model.md#batched-prefill): quantized weights x int8-quantized
// activations with the same per-token activation quantization as decode (Q8_0 for Q8_0 weights, Q8_K for
// experts), so prefill and decode compute the same products, plus an f32 GEMM for F16 weights.
//
// One generic body serves every quantized format, bitwise equal to the CPU reference's row dots
// (formats.h "arithmetic of the CPU reference dots"): each weight chunk is unpacked once per tile
// (unpack_chunk: codes, integer scales/mins, the unit's d/dmin); every output keeps integer
// accumulators isum/summs over the chunks of a unit (a Q8_0 block, a K-quant super-block of 8
// chunks, which spans stages when a stage holds fewer chunks) and adds the unit's one float term
// (unit_term) to its float accumulator in unit order.
//
// Tiles: a block of 256 threads computes ROWS weight rows x COLS columns (tokens, or the expert pairs
// of one expert), each thread 4 rows x CPT columns. COLS is a template parameter so that a grouped
// expert tile can be sized to the pairs its expert really has (ds4_moe_group picks it per tile):
//     COLS  CPT  ROWS  chunks per stage
//      64    4    64    4      dense GEMMs, full expert tiles
//      48    3    64    4
//      32    4   128    2
//      24    3   128    2
//      16    4   256    1
//      12    3   256    1
//       8    2   256    1
// Every shape stages 256 (row, chunk) weight slots per stage (the same shared memory), unpacks each
// weight chunk once per tile for all of its columns, and accumulates every output over the chunks
// c = 0 .. n_in/32 - 1 in order with the reference's float expression, so all shapes give bitwise
// identical outputs (equal to the CPU reference); they differ only in how much dp4a work goes to
// empty columns.
#pragma once
#include "formats.h"

#define DS4_GM_TILE 64       // dense tile edge (rows and tokens); widest expert tile
#define DS4_GM_MAX_COLS 64   // widest column class
#define DS4_GM_SLOTS 256     // weight (row, chunk) slots per stage of every tile shape

// Activation chunk: Q8_0 activations (AK = false: scale per chunk, no sums) or Q8_K (AK = true).
template <bool AK>
DS4_DEV void load_act_any(const i8* xq, const float* xd, const i16* xbs, u32 c, int q[8], float& d, int& bs0,
                          int& bs1) {
    load_act_chunk(xq, c, q);
    if constexpr (AK) {
        d = xd[c / 8];
        bs0 = xbs[2 * c];
        bs1 = xbs[2 * c + 1];
    } else {
        d = xd[c];
        bs0 = bs1 = 0;
    }
}

// Where the columns (tokens or expert pairs) of a tile come from.
struct TileCols {
    u32 n;                         // live columns in this tile
    u32 act_row[DS4_GM_MAX_COLS];  // activation row of each column
    u32 out_row[DS4_GM_MAX_COLS];  // output row of each column
};

// Shared memory of one GEMM block, the same for every tile shape (slot = chunk-in-stage * ROWS + row
// for weights, chunk-in-stage * COLS + column for activations). NW = number of weight matrices.
template <int NW>
struct GemmSmem {
    int4 ws[NW][DS4_GM_SLOTS][2];  // 32 weight codes per slot
    u32 wsc[NW][DS4_GM_SLOTS];     // packed integer scales and mins (WChunk::sc)
    float2 wf[NW][DS4_GM_SLOTS];   // the unit's (d, dmin)
    int4 xs[DS4_GM_SLOTS][2];      // 32 activation codes per slot
    float xf[DS4_GM_SLOTS];        // activation scale
    int2 xb[DS4_GM_SLOTS];         // activation 16-element sums (Q8_K)
    TileCols cols;
};

template <int COLS>
struct TileShape {
    static constexpr int CPT = COLS % 3 == 0 ? 3 : COLS >= 16 ? 4 : 2;  // columns per thread
    static constexpr int TC = COLS / CPT;                   // threads across the columns
    static constexpr int TR = DS4_BLOCK / TC;               // threads across the rows
    static constexpr int ROWS = 4 * TR;                     // weight rows per tile
    static constexpr int CH = DS4_GM_SLOTS / ROWS;          // chunks per stage
    static_assert(COLS == 8 || COLS == 12 || COLS == 16 || COLS == 24 || COLS == 32 || COLS == 48 || COLS == 64,
                  "tile columns: 8, 12, 16, 24, 32, 48 or 64");
    static_assert(TC * CPT == COLS && TR * TC == DS4_BLOCK, "tile threads");
    static_assert(CH >= 1 && CH * ROWS == DS4_GM_SLOTS && COLS * CH <= DS4_GM_SLOTS, "tile shape");
};

template <int C>
struct ColsTag {
    static constexpr int value = C;
};

// Column classes of the grouped expert tiles, narrowest first (kernels.rs MOE_TILE_COLS).
#define DS4_GM_N_CLASSES 7
DS4_DEV u32 tile_class(u32 i) {
    const u32 classes[DS4_GM_N_CLASSES] = {8, 12, 16, 24, 32, 48, 64};
    return classes[i];
}

// Calls f(ColsTag<COLS>{}) for a tile's runtime column class (anything unknown runs 64).
template <class F>
DS4_DEV void with_tile_cols(u32 cols, F&& f) {
    switch (cols) {
        case 8: f(ColsTag<8>{}); break;
        case 12: f(ColsTag<12>{}); break;
        case 16: f(ColsTag<16>{}); break;
        case 24: f(ColsTag<24>{}); break;
        case 32: f(ColsTag<32>{}); break;
        case 48: f(ColsTag<48>{}); break;
        default: f(ColsTag<64>{}); break;
    }
}

// The shared GEMM body. NW = 1 (plain) or 2 (gate + up with SwiGLU). For the ROWS weight rows from r0
// and the columns in sm.cols (set, with a barrier, by the caller), accumulates over all n_in / 32
// chunks and then calls store(row, column, acc of weight 0, acc of weight NW - 1) for every live
// output.
template <int T, bool AK, int NW, int COLS, class Store>
DS4_DEV void gemm_tile(GemmSmem<NW>& sm, const u8* const (&wbase)[NW], u64 rb, u32 r0, u32 n_rows, u32 n_in,
                       const i8* xq, const float* xd, const i16* xbs, u32 x_stride, u32 xg_off, const u64* grid,
                       Store&& store) {
    using S = TileShape<COLS>;
    const u32 tid = threadIdx.x, tx = tid % S::TC, ty = tid / S::TC;
    const u32 nc = n_in / 32;
    // Chunks per unit: the float term is added once the unit's last chunk is in (a whole number of
    // units or stages: CH divides 8).
    constexpr u32 UNIT = T == DS4_T_Q8_0 ? 1 : 8;
    float acc[NW][4][S::CPT];
    int isum[NW][4][S::CPT], summs[NW][4][S::CPT];
#pragma unroll
    for (int w = 0; w < NW; ++w)
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < S::CPT; ++j) {
                acc[w][i][j] = 0.0f;
                isum[w][i][j] = summs[w][i][j] = 0;
            }

    for (u32 c0 = 0; c0 < nc; c0 += S::CH) {
        // Stage: thread tid -> weight slot tid (row, chunk) and, while tid < COLS * CH, activation
        // slot tid (column, chunk).
        {
            const u32 row = tid % S::ROWS, c = c0 + tid / S::ROWS;
#pragma unroll
            for (int w = 0; w < NW; ++w) {
                WChunk wc;
                if (c < nc && r0 + row < n_rows) {
                    unpack_chunk<T>(wbase[w] + (u64)(r0 + row) * rb, c, wc, grid);
                } else {
#pragma unroll
                    for (int i = 0; i < 8; ++i) wc.q[i] = 0;
                    wc.sc = 0;
                    wc.d = wc.dmin = 0.0f;
                }
                sm.ws[w][tid][0] = make_int4(wc.q[0], wc.q[1], wc.q[2], wc.q[3]);
                sm.ws[w][tid][1] = make_int4(wc.q[4], wc.q[5], wc.q[6], wc.q[7]);
                sm.wsc[w][tid] = wc.sc;
                sm.wf[w][tid].x = wc.d;
                sm.wf[w][tid].y = wc.dmin;
            }
        }
        if (tid < COLS * S::CH) {
            const u32 col = tid % COLS, c = c0 + tid / COLS;
            int q[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            float d = 0.0f;
            int b0 = 0, b1 = 0;
            if (c < nc && col < sm.cols.n) {
                const u64 ar = sm.cols.act_row[col];
                load_act_any<AK>(xq + ar * x_stride + xg_off, xd + ar * (x_stride / (AK ? 256 : 32)) +
                                     xg_off / (AK ? 256 : 32),
                                 xbs ? xbs + ar * (x_stride / 16) + xg_off / 16 : nullptr, c, q, d, b0, b1);
            }
            sm.xs[tid][0] = make_int4(q[0], q[1], q[2], q[3]);
            sm.xs[tid][1] = make_int4(q[4], q[5], q[6], q[7]);
            sm.xf[tid] = d;
            sm.xb[tid] = make_int2(b0, b1);
        }
        __syncthreads();
#pragma unroll
        for (int ch = 0; ch < S::CH; ++ch) {
            int4 xv[S::CPT][2];
            float xd4[S::CPT];
            int2 xb4[S::CPT];
#pragma unroll
            for (int j = 0; j < S::CPT; ++j) {
                const u32 slot = ch * COLS + tx + S::TC * j;
                xv[j][0] = sm.xs[slot][0];
                xv[j][1] = sm.xs[slot][1];
                xd4[j] = sm.xf[slot];
                xb4[j] = sm.xb[slot];
            }
            // Unit boundary (uniform): the chunk ends a Q8_0 block or a super-block.
            const bool unit_end = (c0 + ch) % UNIT == UNIT - 1;
#pragma unroll
            for (int w = 0; w < NW; ++w) {
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const u32 slot = ch * S::ROWS + ty + S::TR * i;
                    const int4 a = sm.ws[w][slot][0], b = sm.ws[w][slot][1];
                    const int wq[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
                    const u32 sc = sm.wsc[w][slot];
                    const float2 f = sm.wf[w][slot];
#pragma unroll
                    for (int j = 0; j < S::CPT; ++j) {
                        const int xq8[8] = {xv[j][0].x, xv[j][0].y, xv[j][0].z, xv[j][0].w,
                                            xv[j][1].x, xv[j][1].y, xv[j][1].z, xv[j][1].w};
                        chunk_ints(wq, sc, xq8, xb4[j].x, xb4[j].y, isum[w][i][j], summs[w][i][j]);
                        if (unit_end) {
                            acc[w][i][j] = acc[w][i][j] + unit_term<T>(isum[w][i][j], summs[w][i][j], f.x, f.y, xd4[j]);
                            isum[w][i][j] = summs[w][i][j] = 0;
                        }
                    }
                }
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < S::CPT; ++j) {
            const u32 r = r0 + ty + S::TR * i, col = tx + S::TC * j;
            if (r < n_rows && col < sm.cols.n) store(r, col, finish_dot<T>(acc[0][i][j]), finish_dot<T>(acc[NW - 1][i][j]));
        }
}

// Columns of a dense GEMM tile: tokens t0 .. t0 + 63 (activation row = output row = token).
DS4_DEV void load_token_cols(TileCols& cols, u32 t0, u32 n_tok) {
    if (threadIdx.x == 0) cols.n = min(DS4_GM_TILE, n_tok - t0);
    if (threadIdx.x < DS4_GM_TILE) cols.act_row[threadIdx.x] = cols.out_row[threadIdx.x] = t0 + threadIdx.x;
    __syncthreads();
}

// Dense Q8_0 GEMM: y[t][r] = W[r] · x_t for n_tok tokens with Q8_0 activations (planar, x_stride
// elements per token). Grouped projections as in ds4_matvec_q8_0 (rows_per_group a multiple of 64).
// Launch: grid (ceil(n_out / 64), ceil(n_tok / 64)), block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_gemm_q8_0(float* y, const u8* w, const i8* xq, const float* xd,
                                                                u32 n_in, u32 n_out, u32 rows_per_group,
                                                                u32 x_stride, u32 n_tok) {
    ds4_grid_sync();
    __shared__ GemmSmem<1> sm;
    const u32 r0 = blockIdx.x * DS4_GM_TILE;
    load_token_cols(sm.cols, blockIdx.y * DS4_GM_TILE, n_tok);
    const u8* wb[1] = {w};
    gemm_tile<DS4_T_Q8_0, false, 1, DS4_GM_TILE>(
        sm, wb, (u64)(n_in / 32) * 34, r0, n_out, n_in, xq, xd, nullptr, x_stride, (r0 / rows_per_group) * n_in,
        nullptr, [&](u32 r, u32 col, float v, float) { y[(u64)sm.cols.out_row[col] * n_out + r] = v; });
}

// Shared-expert gate/up + clamped SwiGLU for a batch: mid[t][r] = swiglu(Wg[r]·x_t, Wu[r]·x_t).
// Launch: grid (ceil(n_ff / 64), ceil(n_tok / 64)), block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_gemm_q8_0_swiglu(float* mid, const u8* wg, const u8* wu,
                                                                       const i8* xq, const float* xd, u32 n_in,
                                                                       u32 n_ff, float limit, u32 n_tok) {
    ds4_grid_sync();
    __shared__ GemmSmem<2> sm;
    load_token_cols(sm.cols, blockIdx.y * DS4_GM_TILE, n_tok);
    const u8* wb[2] = {wg, wu};
    gemm_tile<DS4_T_Q8_0, false, 2, DS4_GM_TILE>(
        sm, wb, (u64)(n_in / 32) * 34, blockIdx.x * DS4_GM_TILE, n_ff, n_in, xq, xd, nullptr, n_in, 0, nullptr,
        [&](u32 r, u32 col, float g, float u) {
            mid[(u64)sm.cols.out_row[col] * n_ff + r] = swiglu_clamped(g, u, limit);
        });
}

// Groups the (token, slot) pairs of a batch by expert for the grouped expert GEMMs.
//   pairs: u32 [n_tok * n_used]  pair ids p = t * n_used + k, sorted by expert (stable in p);
//   tiles: u32 [max_tiles][4]    (expert, first index into pairs, count, cols) per tile: an expert's
//                                pairs in tiles of 64, the rest (count < 64) in one tile whose column
//                                class cols is the narrowest of 8, 12, 16, 24, 32, 48, 64 that is
//                                >= min_cols and holds it;
//   n_tiles: u32 [1]             number of tiles written (<= max_tiles = ceil(n_pairs/64) + n_expert).
// min_cols is one of the classes (64: every tile 64 columns wide). Selections >= n_expert are dropped.
// Tiles are made by one thread (a few hundred experts); the pairs are placed by thread e % 256 for
// expert e, scanning the selections staged in shared memory, which keeps the order stable in p.
// Launch: grid (1), block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_moe_group(u32* pairs, u32* tiles, u32* n_tiles, const u32* sel,
                                                                u32 n_tok, u32 n_used, u32 n_expert, u32 min_cols) {
    ds4_grid_sync();
    __shared__ u32 count[1024];
    __shared__ u32 next[1024];
    __shared__ u32 stage[1024];
    if (n_expert > 1024) return;
    for (u32 e = threadIdx.x; e < n_expert; e += DS4_BLOCK) count[e] = 0;
    __syncthreads();
    const u32 np = n_tok * n_used;
    for (u32 p = threadIdx.x; p < np; p += DS4_BLOCK) {
        const u32 e = sel[p];
        if (e < n_expert) atomicAdd(&count[e], 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        u32 s = 0, nt = 0;
        for (u32 e = 0; e < n_expert; ++e) {
            const u32 n = count[e];
            next[e] = s;
            for (u32 off = 0; off < n; off += DS4_GM_MAX_COLS) {
                const u32 left = min(DS4_GM_MAX_COLS, n - off);
                u32 i = 0;
                while (i + 1 < DS4_GM_N_CLASSES && (tile_class(i) < min_cols || tile_class(i) < left)) ++i;
                tiles[4 * nt] = e;
                tiles[4 * nt + 1] = s + off;
                tiles[4 * nt + 2] = left;
                tiles[4 * nt + 3] = tile_class(i);
                ++nt;
            }
            s += n;
        }
        n_tiles[0] = nt;
    }
    for (u32 base = 0; base < np; base += 1024) {
        const u32 m = min(1024u, np - base);
        __syncthreads();  // next[] is set; the previous window has been read
        for (u32 i = threadIdx.x; i < m; i += DS4_BLOCK) stage[i] = sel[base + i];
        __syncthreads();
        for (u32 i = 0; i < m; ++i) {
            const u32 e = stage[i];
            if (e < n_expert && e % DS4_BLOCK == threadIdx.x) pairs[next[e]++] = base + i;
        }
    }
}

// Loads the columns of expert tile `tile` (see ds4_moe_group); returns the expert id.
DS4_DEV u32 load_expert_tile(TileCols& cols, const u32* pairs, const u32* tiles, u32 tile, u32 n_used, bool act_is_pair) {
    const u32 e = tiles[4 * tile], s = tiles[4 * tile + 1], n = tiles[4 * tile + 2];
    if (threadIdx.x == 0) cols.n = n;
    if (threadIdx.x < n) {
        const u32 p = pairs[s + threadIdx.x];
        cols.out_row[threadIdx.x] = p;
        cols.act_row[threadIdx.x] = act_is_pair ? p : p / n_used;
    }
    __syncthreads();
    return e;
}

// One block of a grouped expert GEMM: tile blockIdx.y of ds4_moe_group, in the tile's column class,
// for the weight rows from blockIdx.x * ROWS of that class. The grid is sized for 64-row tiles, so
// the blocks of narrower (taller) classes past n_rows exit, as do blocks past n_tiles[0]. w[i] are
// the all-expert weight tensors ([n_expert][n_rows] rows of n_in elements, format T).
template <int T, int NW, class Store>
DS4_DEV void moe_gemm_block(GemmSmem<NW>& sm, u64* sgrid, const u8* const (&w)[NW], u32 n_rows, u32 n_in,
                            const i8* xq, const float* xd, const i16* xbs, const u32* pairs, const u32* tiles,
                            const u32* n_tiles, u32 n_used, bool act_is_pair, Store&& store) {
    const u32 tile = blockIdx.y;
    if (tile >= n_tiles[0]) return;
    with_tile_cols(tiles[4 * tile + 3], [&](auto tag) {
        constexpr int COLS = decltype(tag)::value;
        const u32 r0 = blockIdx.x * TileShape<COLS>::ROWS;
        if (r0 >= n_rows) return;
        if constexpr (T == DS4_T_IQ2_XXS) stage_iq2_grid(sgrid);
        const u32 e = load_expert_tile(sm.cols, pairs, tiles, tile, n_used, act_is_pair);
        const u64 rb = row_bytes<T>(n_in);
        const u8* wb[NW];
#pragma unroll
        for (int i = 0; i < NW; ++i) wb[i] = w[i] + (u64)e * n_rows * rb;
        gemm_tile<T, true, NW, COLS>(sm, wb, rb, r0, n_rows, n_in, xq, xd, xbs, n_in, 0, sgrid, store);
    });
}

// Grouped routed gate/up + SwiGLU: for each tile (expert e, up to 64 pairs p = t * n_used + k),
// mid[p][r] = swiglu(gate_e[r]·x_t, up_e[r]·x_t) * selw[p], x = Q8_K activation of token t.
// Same result layout as ds4_moe_gate_up_<fmt> (mid [n_tok][n_used][n_ff]).
// Launch: grid (ceil(n_ff / 64), max_tiles), block 256; blocks past n_tiles[0] or n_ff exit.
template <int T>
DS4_DEV void moe_gemm_gate_up_body(float* mid, const u8* gate, const u8* up, const i8* xq, const float* xd,
                                   const i16* xbs, const u32* pairs, const u32* tiles, const u32* n_tiles,
                                   const float* selw, u32 n_in, u32 n_ff, u32 n_used, float limit) {
    __shared__ GemmSmem<2> sm;
    __shared__ u64 sgrid[256];
    const u8* w[2] = {gate, up};
    moe_gemm_block<T, 2>(sm, sgrid, w, n_ff, n_in, xq, xd, xbs, pairs, tiles, n_tiles, n_used, false,
                         [&](u32 r, u32 col, float g, float u) {
                             const u32 p = sm.cols.out_row[col];
                             mid[(u64)p * n_ff + r] = swiglu_clamped(g, u, limit) * selw[p];
                         });
}

// Grouped routed down projection: outp[p][r] = down_e[r] · m_p for the pairs of each tile, m = Q8_K
// rows of the route-weighted mids (row p). ds4_moe_sum then adds the slots in order.
// Launch: grid (ceil(n_out / 64), max_tiles), block 256; blocks past n_tiles[0] or n_out exit.
template <int T>
DS4_DEV void moe_gemm_down_body(float* outp, const u8* down, const i8* mq, const float* md, const i16* mbs,
                                const u32* pairs, const u32* tiles, const u32* n_tiles, u32 n_ff, u32 n_out,
                                u32 n_used) {
    __shared__ GemmSmem<1> sm;
    __shared__ u64 sgrid[256];
    const u8* w[1] = {down};
    moe_gemm_block<T, 1>(sm, sgrid, w, n_out, n_ff, mq, md, mbs, pairs, tiles, n_tiles, n_used, true,
                         [&](u32 r, u32 col, float v, float) { outp[(u64)sm.cols.out_row[col] * n_out + r] = v; });
}

extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_moe_gemm_gate_up_iq2_xxs(
    float* mid, const u8* gate, const u8* up, const i8* xq, const float* xd, const i16* xbs, const u32* pairs,
    const u32* tiles, const u32* n_tiles, const float* selw, u32 n_in, u32 n_ff, u32 n_used, float limit) {
    ds4_grid_sync();
    moe_gemm_gate_up_body<DS4_T_IQ2_XXS>(mid, gate, up, xq, xd, xbs, pairs, tiles, n_tiles, selw, n_in, n_ff,
                                         n_used, limit);
}
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_moe_gemm_gate_up_q2_k(
    float* mid, const u8* gate, const u8* up, const i8* xq, const float* xd, const i16* xbs, const u32* pairs,
    const u32* tiles, const u32* n_tiles, const float* selw, u32 n_in, u32 n_ff, u32 n_used, float limit) {
    ds4_grid_sync();
    moe_gemm_gate_up_body<DS4_T_Q2_K>(mid, gate, up, xq, xd, xbs, pairs, tiles, n_tiles, selw, n_in, n_ff, n_used,
                                      limit);
}
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_moe_gemm_gate_up_q4_k(
    float* mid, const u8* gate, const u8* up, const i8* xq, const float* xd, const i16* xbs, const u32* pairs,
    const u32* tiles, const u32* n_tiles, const float* selw, u32 n_in, u32 n_ff, u32 n_used, float limit) {
    ds4_grid_sync();
    moe_gemm_gate_up_body<DS4_T_Q4_K>(mid, gate, up, xq, xd, xbs, pairs, tiles, n_tiles, selw, n_in, n_ff, n_used,
                                      limit);
}
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_moe_gemm_down_iq2_xxs(
    float* outp, const u8* down, const i8* mq, const float* md, const i16* mbs, const u32* pairs, const u32* tiles,
    const u32* n_tiles, u32 n_ff, u32 n_out, u32 n_used) {
    ds4_grid_sync();
    moe_gemm_down_body<DS4_T_IQ2_XXS>(outp, down, mq, md, mbs, pairs, tiles, n_tiles, n_ff, n_out, n_used);
}
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_moe_gemm_down_q2_k(
    float* outp, const u8* down, const i8* mq, const float* md, const i16* mbs, const u32* pairs, const u32* tiles,
    const u32* n_tiles, u32 n_ff, u32 n_out, u32 n_used) {
    ds4_grid_sync();
    moe_gemm_down_body<DS4_T_Q2_K>(outp, down, mq, md, mbs, pairs, tiles, n_tiles, n_ff, n_out, n_used);
}
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_moe_gemm_down_q4_k(
    float* outp, const u8* down, const i8* mq, const float* md, const i16* mbs, const u32* pairs, const u32* tiles,
    const u32* n_tiles, u32 n_ff, u32 n_out, u32 n_used) {
    ds4_grid_sync();
    moe_gemm_down_body<DS4_T_Q4_K>(outp, down, mq, md, mbs, pairs, tiles, n_tiles, n_ff, n_out, n_used);
}

// out[t][r] = sum over slots k in order of outp[t * n_used + k][r] (the slot-order sum of
// docs/model.md#routed-experts).
// Launch: grid (ceil(n_out / 256), n_tok), block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_moe_sum(float* out, const float* outp, u32 n_out, u32 n_used) {
    ds4_grid_sync();
    const u32 t = blockIdx.y, r = blockIdx.x * DS4_BLOCK + threadIdx.x;
    if (r >= n_out) return;
    float s = 0.0f;
    for (u32 k = 0; k < n_used; ++k) s += outp[((u64)t * n_used + k) * n_out + r];
    out[(u64)t * n_out + r] = s;
}

// F16-weight GEMM with f32 activations: y[t][r] = W[r] · x_t (row-major F16 W [n_out][n_in],
// x [n_tok][x_stride]). 64 x 64 tiles, 32-wide k steps, 4 x 4 outputs per thread. Each output is
// quant.rs dot_f16: one accumulator, acc = acc + w_k * x_k for k in order (multiply, then add; the
// zero padding past n_in adds zeros, which leave an accumulator started at +0 unchanged).
// Launch: grid (ceil(n_out / 64), ceil(n_tok / 64)), block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_gemm_f16(float* y, const u16* w, const float* x, u32 n_in,
                                                               u32 n_out, u32 x_stride, u32 n_tok) {
    ds4_grid_sync();
    __shared__ float wsm[32][DS4_GM_TILE + 1];
    __shared__ float xsm[32][DS4_GM_TILE + 1];
    const u32 r0 = blockIdx.x * DS4_GM_TILE, t0 = blockIdx.y * DS4_GM_TILE;
    const u32 tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
    for (u32 k0 = 0; k0 < n_in; k0 += 32) {
        // 64 rows x 32 k of W and 64 tokens x 32 k of x: 8 elements per thread each.
        for (u32 i = tid; i < 64 * 32; i += DS4_BLOCK) {
            const u32 row = i / 32, k = i % 32;
            const u32 gr = r0 + row, gk = k0 + k, gt = t0 + row;
            wsm[k][row] = (gr < n_out && gk < n_in) ? f16_to_f32(w[(u64)gr * n_in + gk]) : 0.0f;
            xsm[k][row] = (gt < n_tok && gk < n_in) ? x[(u64)gt * x_stride + gk] : 0.0f;
        }
        __syncthreads();
#pragma unroll 8
        for (u32 k = 0; k < 32; ++k) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) a[i] = wsm[k][ty + 16 * i];
#pragma unroll
            for (int j = 0; j < 4; ++j) b[j] = xsm[k][tx + 16 * j];
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] += a[i] * b[j];
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const u32 r = r0 + ty + 16 * i, t = t0 + tx + 16 * j;
            if (r < n_out && t < n_tok) y[(u64)t * n_out + r] = acc[i][j];
        }
}
