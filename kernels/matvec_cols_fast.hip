// Column matvecs, fast arithmetic (docs/arithmetic.md): the fast decode products of matvec_fast.hip
// for a block of 2..DS4_COLS tokens ("columns": a speculative verify block) in one grid row, each
// weight tile or word read once for all of them instead of once per token. Per column the lane
// dots, row sums and K-slice sums are those of the single-token fast kernel in the same order, so
// each column has its bits; only the weight loads are shared. A lane's activation slice is loaded
// per column (from L1) where the single-token kernel keeps one in registers across rounds. Same
// arguments as the single-token kernel, plus n_tok (<= DS4_COLS); outputs laid out as there.
// Deterministic: the same inputs give the same bits on every run and any grid.
#pragma once
#include "matvec_fast.hip"

// q8_tiled_product's rounds (one matrix, n1 = 0, grouped rows reading their group's activations; or
// two sharing their activations, q8_round_matrix) for n_cols columns of global activations (column c
// at xq + c * x_stride): each round's tile is staged once and dotted with every column's slice.
// QOUT as q8_tiled_product's, each column's rows quantized as their Q8_0 blocks complete.
// Grid (any), block 256.
template <bool QOUT>
DS4_DEV void q8_tiled_cols(float* y0, float* y1, const u8* w0, const u8* w1, const i8* xq, const float* xd, u32 n_in,
                           u32 n0, u32 n1, u32 rows_per_group, u32 x_stride, u32 n_cols, i8* q_out, float* d_out) {
    __shared__ uint4 tiles[DS4_WARPS_PER_BLOCK * DS4_Q8T_WORDS];
    __shared__ float part[2][DS4_COLS][DS4_WARPS_PER_BLOCK];
    __shared__ float qrow[QOUT ? DS4_COLS : 1][QOUT ? DS4_Q8T_QROWS : 1];
    const Q8Tiles g = q8_tiles(n_in);
    const u32 q_span = g.rpr >= 32 ? g.rpr : 32;  // rows quantized together
    u32 begin, end;
    q8_block_rounds(n0 + n1, g.rpr, begin, end, QOUT ? q_span / g.rpr : 1);
    if (begin >= end) {
        ds4_grid_sync();
        return;
    }
    uint4* tile = tiles + warp_id() * DS4_Q8T_WORDS;
    uint4 v[DS4_Q8T_LOADS];
    Q8RoundMatrix m = q8_round_matrix(begin, g.rpr, w0, y0, n0, w1, y1, n1);
    q8_tile_load(v, m.w, g, m.rd, m.n_out);
    ds4_grid_sync();  // the first round's weights in flight before the wait (prelude.h)
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
        for (u32 c = 0; c < n_cols; ++c) {
            Q8Slice x = q8_slice_empty();
            if (row < cur.n_out) q8_slice_load(x, xq, xd, c, x_stride, row / rows_per_group, cir, n_in, g.nc);
            const float acc = q8_row_sum(q8_lane_dot(wv, x), g.nc);
            if (g.k == 1) {
                if (row < cur.n_out && cir == 0 && q8_lane_half() == 0) {
                    if (QOUT)
                        qrow[c][row % q_span] = acc;
                    else
                        cur.y[(u64)c * cur.n_out + row] = acc;
                }
            } else if (lane_id() == 0) {
                part[rd & 1][c][warp_id()] = acc;
            }
        }
        if (g.k > 1) {
            __syncthreads();
            const u32 c = threadIdx.x / g.rpr, rr = threadIdx.x % g.rpr, r = cur.rd * g.rpr + rr;
            if (c < n_cols && r < cur.n_out) {
                float sum = 0.0f;
                for (u32 s = 0; s < g.k; ++s) sum += part[rd & 1][c][rr * g.k + s];
                if (QOUT)
                    qrow[c][r % q_span] = sum;
                else
                    cur.y[(u64)c * cur.n_out + r] = sum;
            }
        }
        if (QOUT) {
            const u32 rows_done = (cur.rd + 1) * g.rpr;  // rows of the matrix finished after this round
            if (rows_done % q_span == 0 || rows_done >= cur.n_out) {
                __syncthreads();
                const u32 row0 = (rows_done - 1) / q_span * q_span;
                for (u32 c = 0; c < n_cols; ++c)
                    q8_quantize_rows(qrow[c], (u32)((u64)c * cur.n_out + row0), min(q_span, cur.n_out - row0), q_out,
                                     d_out);
                __syncthreads();
            }
        }
    }
}

// ds4_matvec_q8_0_fast's untiled path (n_in % 256 == 0, not q8_tiled) for n_cols columns, one
// column after the other: a row's few chunks are read from memory for the first column and from the
// cache for the others (holding a chunk for every column would take more registers than a block has).
DS4_DEV void q8_untiled_cols(float* y, const u8* w, const i8* xq, const float* xd, u32 n_in, u32 n_out,
                             u32 rows_per_group, u32 x_stride, u32 n_cols) {
    const u32 nc = n_in / DS4_Q8_0_CHUNK, g = q8_0_fast_lanes(nc);
    const u32 r = blockIdx.x * (DS4_BLOCK / g) + threadIdx.x / g, sub = threadIdx.x % g;
    const bool live = r < n_out;
    const u32 grp = live ? r / rows_per_group : 0;
    const u8* wr = w + (u64)(live ? r : 0) * nc * DS4_Q8_0_CHUNK_B;
    for (u32 t = 0; t < n_cols; ++t) {
        float acc = 0.0f;
        if (live) {
            const i8* xr = xq + (u64)t * x_stride + (u64)grp * n_in;
            const float* dr = xd + (u64)t * (x_stride / 32) + (u64)grp * (n_in / 32);
            for (u32 c = sub; c < nc; c += g)
                acc = q8_0_chunk_dot(wr + (u64)c * DS4_Q8_0_CHUNK_B, xr + c * DS4_Q8_0_CHUNK, dr + c * 8, acc);
        }
        acc = group_sum(acc, g);
        if (live && sub == 0) y[(u64)t * n_out + r] = acc;
    }
}

// ds4_matvec_q8_0_fast of n_tok columns (ds4_matvec_q8_0_cols' twin). Tiled: grid (any); otherwise
// grid (ceil(n_out / (256 / G))), G = q8_0_fast_lanes(n_in / 256). Block 256.
extern "C" __global__ DS4_Q8T_LAUNCH void ds4_matvec_q8_0_cols_fast(float* y, const u8* w, const i8* xq,
                                                                    const float* xd, u32 n_in, u32 n_out,
                                                                    u32 rows_per_group, u32 x_stride, u32 n_tok) {
    const u32 n_cols = min(n_tok, (u32)DS4_COLS);
    if (q8_tiled(n_in)) {  // ds4_grid_sync in q8_tiled_cols
        q8_tiled_cols<false>(y, nullptr, w, nullptr, xq, xd, n_in, n_out, 0, rows_per_group, x_stride, n_cols, nullptr,
                             nullptr);
        return;
    }
    ds4_grid_sync();
    q8_untiled_cols(y, w, xq, xd, n_in, n_out, rows_per_group, x_stride, n_cols);
}

// ds4_matvec_q8_0_q8_fast of n_tok columns: each column's rows quantized (codes [n_tok][n_out],
// scales [n_tok][n_out / 32]), the f32 rows not written. Preconditions as there
// (kernels::matvec_q8_0_quantized_cols checks them). Grid (any), block 256.
extern "C" __global__ DS4_Q8T_LAUNCH void ds4_matvec_q8_0_q8_cols_fast(i8* q_out, float* d_out, const u8* w,
                                                                       const i8* xq, const float* xd, u32 n_in,
                                                                       u32 n_out, u32 rows_per_group, u32 x_stride,
                                                                       u32 n_tok) {
    if (!q8_tiled(n_in) || n_out % 32 != 0) {
        ds4_grid_sync();
        return;
    }  // otherwise ds4_grid_sync in q8_tiled_cols
    q8_tiled_cols<true>(nullptr, nullptr, w, nullptr, xq, xd, n_in, n_out, 0, rows_per_group, x_stride,
                        min(n_tok, (u32)DS4_COLS), q_out, d_out);
}

// ds4_matvec_q8_0_pair_fast of n_tok columns: y0 = W0 · x and y1 = W1 · x. Preconditions as there
// (kernels::paired_matvec_q8_0_cols checks them). Grid (any), block 256.
extern "C" __global__ DS4_Q8T_LAUNCH void ds4_matvec_q8_0_pair_cols_fast(float* y0, float* y1, const u8* w0,
                                                                         const u8* w1, const i8* xq, const float* xd,
                                                                         u32 n_in, u32 n_out0, u32 n_out1, u32 n_tok) {
    if (!q8_tiled(n_in)) {
        ds4_grid_sync();
        return;
    }  // otherwise ds4_grid_sync in q8_tiled_cols
    q8_tiled_cols<false>(y0, y1, w0, w1, xq, xd, n_in, n_out0, n_out1, n_out0 + n_out1, n_in,
                         min(n_tok, (u32)DS4_COLS), nullptr, nullptr);
}

// q8_swiglu_tiled for n_cols columns: a round's gate tile is dotted with every column, then its up
// tile; with whole rows a warp (k == 1) the lane that writes a row keeps its gate sums in shared
// memory until its up sums come.
DS4_DEV void q8_swiglu_tiled_cols(float* mid, const u8* wg, const u8* wu, const i8* xq, const float* xd, u32 n_in,
                                  u32 n_ff, float limit, u32 n_cols) {
    __shared__ uint4 tiles[DS4_WARPS_PER_BLOCK * DS4_Q8T_WORDS];
    __shared__ float part[2][2][DS4_COLS][DS4_WARPS_PER_BLOCK];
    __shared__ float gate[DS4_COLS][DS4_Q8T_ROUND];
    const Q8Tiles g = q8_tiles(n_in);
    u32 begin, end;
    q8_block_rounds(n_ff, g.rpr, begin, end);
    if (begin >= end) {
        ds4_grid_sync();
        return;
    }
    uint4* tile = tiles + warp_id() * DS4_Q8T_WORDS;
    uint4 vg[DS4_Q8T_LOADS], vu[DS4_Q8T_LOADS];
    q8_tile_load(vg, wg, g, begin, n_ff);
    q8_tile_load(vu, wu, g, begin, n_ff);
    ds4_grid_sync();  // the first round's weights in flight before the wait (prelude.h)
    for (u32 rd = begin; rd < end; ++rd) {
        const bool more = rd + 1 < end;
        u32 row, cir;
        q8_lane_row(g, rd, row, cir);
        const bool writes = row < n_ff && cir == 0 && q8_lane_half() == 0;
        const u32 rl = row - rd * g.rpr;  // the row within the round
        float(*p)[DS4_COLS][DS4_WARPS_PER_BLOCK] = part[rd & 1];
        // One matrix's tile of the round (m = 0: gate, 1: up) against every column.
        auto columns = [&](uint4 (&vm)[DS4_Q8T_LOADS], const u8* wm, int m) {
            u32 wv[34];
            q8_tile_swap(tile, vm, wv);
            if (more) q8_tile_load(vm, wm, g, rd + 1, n_ff);
            for (u32 c = 0; c < n_cols; ++c) {
                Q8Slice x = q8_slice_empty();
                if (row < n_ff) q8_slice_load(x, xq, xd, c, n_in, 0, cir, n_in, g.nc);
                const float s = q8_row_sum(q8_lane_dot(wv, x), g.nc);
                if (g.k > 1) {
                    if (lane_id() == 0) p[m][c][warp_id()] = s;
                } else if (writes) {
                    if (m == 0)
                        gate[c][rl] = s;
                    else
                        mid[(u64)c * n_ff + row] = swiglu_clamped(gate[c][rl], s, limit);
                }
            }
        };
        columns(vg, wg, 0);
        columns(vu, wu, 1);
        if (g.k > 1) {
            __syncthreads();
            const u32 c = threadIdx.x / g.rpr, rr = threadIdx.x % g.rpr, r = rd * g.rpr + rr;
            if (c < n_cols && r < n_ff) {
                float gs = 0.0f, us = 0.0f;
                for (u32 s = 0; s < g.k; ++s) {
                    gs += p[0][c][rr * g.k + s];
                    us += p[1][c][rr * g.k + s];
                }
                mid[(u64)c * n_ff + r] = swiglu_clamped(gs, us, limit);
            }
        }
    }
}

// ds4_matvec_q8_0_swiglu_fast of n_tok columns (ds4_matvec_q8_0_swiglu_cols' twin). Tiled
// (q8_swiglu_tiled_cols): grid (any); otherwise grid (ceil(n_ff / (256 / G))). Block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_matvec_q8_0_swiglu_cols_fast(float* mid, const u8* wg,
                                                                                   const u8* wu, const i8* xq,
                                                                                   const float* xd, u32 n_in,
                                                                                   u32 n_ff, float limit, u32 n_tok) {
    const u32 n_cols = min(n_tok, (u32)DS4_COLS);
    if (q8_tiled(n_in)) {
        q8_swiglu_tiled_cols(mid, wg, wu, xq, xd, n_in, n_ff, limit, n_cols);
        return;
    }
    ds4_grid_sync();
    // Untiled: one column after the other, as q8_untiled_cols.
    const u32 nc = n_in / DS4_Q8_0_CHUNK, g = q8_0_fast_lanes(nc);
    const u32 r = blockIdx.x * (DS4_BLOCK / g) + threadIdx.x / g, sub = threadIdx.x % g;
    const bool live = r < n_ff;
    const u64 off = (u64)(live ? r : 0) * nc * DS4_Q8_0_CHUNK_B;
    for (u32 t = 0; t < n_cols; ++t) {
        float ga = 0.0f, ua = 0.0f;
        if (live) {
            const i8* xr = xq + (u64)t * n_in;
            const float* dr = xd + (u64)t * (n_in / 32);
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
}

// f16_row_part for n_cols columns (column t at x + t * x_stride): each word loaded once, its dot with
// every column added to that column's two sums in f16_row_part's order. part[t]: the thread's part
// of the row's dot with column t (0 where !live).
DS4_DEV void f16_row_part_cols(const u16* wr, const float* x, u32 x_stride, u32 n_cols, u32 n_in, u32 sub, u32 tpr,
                               bool live, const F16First& first, float (&part)[DS4_COLS]) {
    float a0[DS4_COLS], a1[DS4_COLS];
#pragma unroll
    for (int t = 0; t < DS4_COLS; ++t) a0[t] = a1[t] = 0.0f;
    auto step = [&](const uint4 (&v)[4], u32 c) {
#pragma unroll
        for (int t = 0; t < DS4_COLS; ++t) {
            if ((u32)t >= n_cols) continue;
            const float* xt = x + (u64)t * x_stride;
            a0[t] = f16_word_dot(v[0], xt + 8 * c, a0[t]);
            a1[t] = f16_word_dot(v[1], xt + 8 * (c + tpr), a1[t]);
            a0[t] = f16_word_dot(v[2], xt + 8 * (c + 2 * tpr), a0[t]);
            a1[t] = f16_word_dot(v[3], xt + 8 * (c + 3 * tpr), a1[t]);
        }
    };
    if (live) {
        const uint4* w4 = (const uint4*)wr;
        const u32 nw = n_in / 8;
        u32 c = sub;
        if (first.ok) {
            step(first.v, c);
            c += 4 * tpr;
        }
        for (; c + 3 * tpr < nw; c += 4 * tpr) {
            const uint4 v[4] = {w4[c], w4[c + tpr], w4[c + 2 * tpr], w4[c + 3 * tpr]};
            step(v, c);
        }
        for (; c < nw; c += tpr) {
            const uint4 v = w4[c];
#pragma unroll
            for (int t = 0; t < DS4_COLS; ++t) {
                if ((u32)t >= n_cols) continue;
                a0[t] = f16_word_dot(v, x + (u64)t * x_stride + 8 * c, a0[t]);
            }
        }
    }
#pragma unroll
    for (int t = 0; t < DS4_COLS; ++t) part[t] = live ? a0[t] + a1[t] : 0.0f;
}

// ds4_matvec_f16_fast of n_tok columns (ds4_matvec_f16_cols' twin). Launch: grid (ceil(n_out / (256 /
// T))), block 256, T = f16_fast_threads(n_in).
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_matvec_f16_cols_fast(float* y, const u16* w, const float* x,
                                                                           u32 n_in, u32 n_out, u32 x_stride,
                                                                           u32 n_tok) {
    __shared__ float scratch[DS4_COLS][DS4_WARPS_PER_BLOCK];
    const u32 n_cols = min(n_tok, (u32)DS4_COLS), tpr = f16_fast_threads(n_in);
    const u32 r = blockIdx.x * (DS4_BLOCK / tpr) + threadIdx.x / tpr, sub = threadIdx.x % tpr;
    const bool live = r < n_out;
    const u16* wr = w + (u64)(live ? r : 0) * n_in;
    const F16First first = f16_row_first(wr, n_in, sub, tpr, live);  // weights: before the wait
    ds4_grid_sync();
    float part[DS4_COLS];
    f16_row_part_cols(wr, x, x_stride, n_cols, n_in, sub, tpr, live, first, part);
    // Unrolled with a static index (no break: a loop that keeps its barriers is not unrolled, and
    // part[t] indexed at run time would live in scratch); n_cols is uniform across the block.
#pragma unroll
    for (int t = 0; t < DS4_COLS; ++t) {
        if ((u32)t >= n_cols) continue;
        const float acc = f16_row_sum(part[t], tpr, scratch[t]);
        if (live && sub == 0) y[(u64)t * n_out + r] = acc;
    }
}

// ds4_matvec_f16_pair_fast of n_tok columns (ds4_matvec_f16_pair_cols' twin): rows [0, n_out) of W0 to
// y0, rows [n_out, 2 n_out) of W1 to y1. Launch: grid (ceil(2 n_out / (256 / T))), block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_matvec_f16_pair_cols_fast(float* y0, float* y1, const u16* w0,
                                                                                const u16* w1, const float* x,
                                                                                u32 n_in, u32 n_out, u32 x_stride,
                                                                                u32 n_tok) {
    __shared__ float scratch[DS4_COLS][DS4_WARPS_PER_BLOCK];
    const u32 n_cols = min(n_tok, (u32)DS4_COLS), tpr = f16_fast_threads(n_in);
    const u32 r = blockIdx.x * (DS4_BLOCK / tpr) + threadIdx.x / tpr, sub = threadIdx.x % tpr;
    const bool live = r < 2 * n_out, second = r >= n_out;
    const u32 rr = live ? (second ? r - n_out : r) : 0;
    const u16* wr = (second ? w1 : w0) + (u64)rr * n_in;
    const F16First first = f16_row_first(wr, n_in, sub, tpr, live);  // weights: before the wait
    ds4_grid_sync();
    float part[DS4_COLS];
    f16_row_part_cols(wr, x, x_stride, n_cols, n_in, sub, tpr, live, first, part);
    // Unrolled with a static index (no break: a loop that keeps its barriers is not unrolled, and
    // part[t] indexed at run time would live in scratch); n_cols is uniform across the block.
#pragma unroll
    for (int t = 0; t < DS4_COLS; ++t) {
        if ((u32)t >= n_cols) continue;
        const float acc = f16_row_sum(part[t], tpr, scratch[t]);
        if (live && sub == 0) (second ? y1 : y0)[(u64)t * n_out + rr] = acc;
    }
}
