// Column matvecs, fast arithmetic (docs/arithmetic.md): the fast decode products of matvec_fast.hip
// for a block of 2..DS4_COLS tokens ("columns": a speculative verify block) in one grid row, each
// weight tile or word read once for all of them instead of once per token. Per column the lane
// dots, row sums and K-slice sums are those of the single-token fast kernel in the same order, so
// each column has its bits; only the weight loads are shared. Same arguments as the single-token
// kernel, plus n_tok (<= DS4_COLS); outputs laid out as there. Deterministic: the same inputs give
// the same bits on every run and any grid.
//
// Where the activations live decides the cost (docs/benchmarks.md#fast-q8_0-column-matvecs-per-shape).
// The single-token kernel's lane dots 4 blocks of one row and keeps that activation slice in
// registers; for n columns that would take 36 n registers, so the first form (q8_tiled_cols' own
// rounds) loads every column's slice again each round, and those loads cost as much as the weights
// they share. The register-held form (q8_held_cols) gives a lane one block position of 4 rows
// instead: one 32-code block of every column stays in registers (9 per column) for all the rounds,
// and the lane chains of the single-token kernel (4 blocks of a chunk half, in order) are rebuilt
// across the 4 lanes that hold those blocks, so each column keeps its bits.
#pragma once
#include "matvec_fast.hip"

// The register-held form (header): a warp's tile is 4 rows of DS4_QH_CHUNKS chunks (the same 17
// DS4_WARP / 2 words as a q8_tiles tile, so a block round covers the same rows); lane (c, h, q)
// (lane = q + 4 h + 8 c) holds block 4 h + q of chunk c of the 4 rows, and a row's chunks are split
// over nc / DS4_QH_CHUNKS consecutive warps.
#define DS4_QH_CHUNKS (DS4_WARP / 8)
// Its kernels hold 9 registers a column for DS4_COLS columns beside the tile's: one block of 8 warps
// an SM on sm_90 (up to 255 registers) instead of q8_tiled_product's two.
#define DS4_QH_LAUNCH DS4_LAUNCH(DS4_BLOCK)

// Whether q8_held_cols takes the shape: tiled rows of DS4_QH_CHUNKS to 32 chunks (a row quad within
// one block round) whose 4 rows of a lane read one activation group (rows_per_group a multiple of 4,
// or one group for every row below n_rows).
DS4_DEV bool q8_held(u32 n_in, u32 n_rows, u32 rows_per_group) {
    const u32 nc = n_in / DS4_Q8_0_CHUNK;
    return q8_tiled(n_in) && nc >= DS4_QH_CHUNKS && nc <= 32 &&
           (rows_per_group % 4 == 0 || rows_per_group >= n_rows);
}

// Loads the warp's tile (rows row0..row0+3, chunks [cg, cg + 1) * DS4_QH_CHUNKS), coalesced; words
// of rows >= n_out read as 0.
DS4_DEV void q8_held_load(uint4 (&v)[DS4_Q8T_LOADS], const u8* w, u32 nc, u32 row0, u32 cg, u32 n_out) {
    const u32 span = 17 * DS4_QH_CHUNKS;  // 16-byte words of one row's part
#pragma unroll
    for (int i = 0; i < DS4_Q8T_LOADS; ++i) {
        const u32 q = i * DS4_WARP + lane_id(), r = q / span;
        const bool ok = q < DS4_Q8T_WORDS && row0 + r < n_out;
        const u8* rp = w + ((u64)(row0 + r) * nc + (u64)cg * DS4_QH_CHUNKS) * DS4_Q8_0_CHUNK_B;
        v[i] = ok ? ((const uint4*)rp)[q % span] : make_uint4(0, 0, 0, 0);
    }
}

// Stages the loaded tile in the warp's shared words and reads back the lane's block of each of the
// 4 rows: its scale (wd) and 8 code words (wc). A block sits at byte 34 b of its chunk, 2 bytes
// past a word boundary for odd b, so 9 words are read and shifted into place.
DS4_DEV void q8_held_swap(uint4* tile, const uint4 (&v)[DS4_Q8T_LOADS], u32 (&wc)[4][8], float (&wd)[4]) {
    ds4_sync_warp();  // the lanes' reads of the previous tile are done
#pragma unroll
    for (int i = 0; i < DS4_Q8T_LOADS; ++i) {
        const u32 q = i * DS4_WARP + lane_id();
        if (q < DS4_Q8T_WORDS) tile[q] = v[i];
    }
    ds4_sync_warp();
    const u32 b = lane_id() % 8, odd = b & 1;
    const u32* base = (const u32*)tile + (lane_id() / 8) * (DS4_Q8_0_CHUNK_B / 4) + 34 * b / 4;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const u32* p = base + i * DS4_QH_CHUNKS * (DS4_Q8_0_CHUNK_B / 4);
        u32 w[9];
#pragma unroll
        for (int j = 0; j < 9; ++j) w[j] = p[j];
        wd[i] = f16_to_f32((u16)(odd ? w[0] >> 16 : w[0]));
#pragma unroll
        for (int j = 0; j < 8; ++j) wc[i][j] = (u32)((((u64)w[j + 1] << 32) | w[j]) >> (odd ? 32 : 16));
    }
}

// The single-token lane sum of row i (q8_lane_dot: blocks 4h..4h+3 of the chunk half, fma in
// order from 0) rebuilt over the quad of lanes that holds those blocks: step t leaves in lane t the
// chain through block 4h + t, so lane 3 ends with the chain of each row; lane q of the quad then
// takes row q's. pr, f: the lane's block's scale product and integer dot of each row.
DS4_DEV float q8_held_chain(const float (&pr)[4], const float (&f)[4]) {
    const u32 q = lane_id() % 4, prev = lane_id() - (q > 0 ? 1 : 0), last = lane_id() | 3;
    float a[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) a[i] = fmaf(pr[i], f[i], 0.0f);
#pragma unroll
    for (int t = 1; t < 4; ++t)
#pragma unroll
        for (int i = 0; i < 4; ++i) a[i] = fmaf(pr[i], f[i], __shfl(a[i], prev, DS4_WARP));
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float r = __shfl(a[i], last, DS4_WARP);
        if (q == (u32)i) s = r;
    }
    return s;
}

// The lane's block of every column for activation group grp (x_stride between columns).
DS4_DEV void q8_held_acts(int (&xs)[DS4_COLS][8], float (&xsc)[DS4_COLS], const i8* xq, const float* xd,
                          u32 x_stride, u32 grp, u32 n_in, u32 chunk, u32 n_cols) {
    const u32 b = lane_id() % 8;
#pragma unroll
    for (int c = 0; c < DS4_COLS; ++c) {
        if ((u32)c >= n_cols) break;
        const int4* xp = (const int4*)(xq + (u64)c * x_stride + (u64)grp * n_in + (u64)chunk * DS4_Q8_0_CHUNK + 32 * b);
        const int4 a0 = xp[0], a1 = xp[1];
        xs[c][0] = a0.x, xs[c][1] = a0.y, xs[c][2] = a0.z, xs[c][3] = a0.w;
        xs[c][4] = a1.x, xs[c][5] = a1.y, xs[c][6] = a1.z, xs[c][7] = a1.w;
        xsc[c] = xd[(u64)c * (x_stride / 32) + (u64)grp * (n_in / 32) + chunk * 8 + b];
    }
}

// The sum of row r of a round from the warps' partial sums p ([warp][row in quad][half], for one
// column) in the single-token kernel's order: within each K-slice of DS4_Q8T_CHUNKS chunks the
// chunk tree's upper levels (groups of DS4_QH_CHUNKS chunks, pairwise), then the halves; the
// slices' sums added in order from 0 when there are several (q8_tiled_product).
DS4_DEV float q8_held_row_sum(const float* p, u32 r, u32 nc) {
    const u32 groups = nc / DS4_QH_CHUNKS, tw = min(nc, (u32)DS4_Q8T_CHUNKS), per = tw / DS4_QH_CHUNKS;
    const float* rp = p + (r / 4) * groups * 8 + (r % 4) * 2;
    float sum = 0.0f, slice = 0.0f;
    for (u32 s = 0; s < nc / tw; ++s) {
        float half[2];
        for (u32 h = 0; h < 2; ++h) {
            const float* g = rp + s * per * 8 + h;
            half[h] = per == 1 ? g[0] : per == 2 ? g[0] + g[8] : (g[0] + g[8]) + (g[16] + g[24]);
        }
        slice = half[0] + half[1];
        sum += slice;
    }
    return nc / tw == 1 ? slice : sum;
}

// One round's tile (the lane's blocks wc, wd) against every column's held activations: with a
// row's chunks all in this warp (groups == 1), done(col, s) in lanes 0..3 with s the sum of the
// quad's row lane_id(); otherwise the warp's partial sums go to p[col][warp * 8 + 2 q + h] for
// q8_held_row_sum.
template <class Done>
DS4_DEV void q8_held_round(const u32 (&wc)[4][8], const float (&wd)[4], const int (&xs)[DS4_COLS][8],
                           const float (&xsc)[DS4_COLS], u32 n_cols, u32 groups,
                           float (*p)[DS4_WARPS_PER_BLOCK * 8], Done done) {
#pragma unroll
    for (int col = 0; col < DS4_COLS; ++col) {
        if ((u32)col >= n_cols) break;
        float pr[4], f[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            int is = 0;
#pragma unroll
            for (int j = 0; j < 8; ++j) is = dot4_i8((int)wc[i][j], xs[col][j], is);
            pr[i] = wd[i] * xsc[col];
            f[i] = (float)is;
        }
        float s = q8_held_chain(pr, f);
        for (u32 o = 8; o < 8 * DS4_QH_CHUNKS; o *= 2) s += __shfl_xor(s, o, DS4_WARP);  // chunk bits
        if (groups == 1) {  // the whole row in this warp: the halves, then the row is done
            s += __shfl_xor(s, 4, DS4_WARP);
            if (lane_id() < 4) done((u32)col, s);
        } else if (lane_id() < 8) {
            p[col][warp_id() * 8 + (lane_id() % 4) * 2 + (lane_id() / 4)] = s;
        }
    }
}

// The QOUT step of both column forms after round rd of a matrix (rpr rows a round, n_out rows):
// once a run of q_span rows (or the matrix) is complete, every column's gathered rows in qrow are
// quantized to Q8_0 (codes [n_cols][n_out], scales [n_cols][n_out / 32]). Call from every thread.
DS4_DEV void q8_cols_quantize_done(float (*qrow)[DS4_Q8T_QROWS], u32 rd, u32 rpr, u32 q_span, u32 n_out, u32 n_cols,
                                   i8* q_out, float* d_out) {
    const u32 rows_done = (rd + 1) * rpr;  // rows of the matrix finished after this round
    if (rows_done % q_span != 0 && rows_done < n_out) return;
    __syncthreads();
    const u32 row0 = (rows_done - 1) / q_span * q_span;
    for (u32 c = 0; c < n_cols; ++c)
        q8_quantize_rows(qrow[c], (u32)((u64)c * n_out + row0), min(q_span, n_out - row0), q_out, d_out);
    __syncthreads();
}

// q8_tiled_cols' product in the register-held form (q8_held takes the shape); its shared arrays
// passed in (qrow: DS4_COLS rows of DS4_Q8T_QROWS when QOUT).
template <bool QOUT>
DS4_DEV void q8_held_cols(float* y0, float* y1, const u8* w0, const u8* w1, const i8* xq, const float* xd, u32 n_in,
                          u32 n0, u32 n1, u32 rows_per_group, u32 x_stride, u32 n_cols, i8* q_out, float* d_out,
                          uint4* tiles, float (*part)[DS4_COLS][DS4_WARPS_PER_BLOCK * 8],
                          float (*qrow)[DS4_Q8T_QROWS]) {
    const u32 nc = n_in / DS4_Q8_0_CHUNK, groups = nc / DS4_QH_CHUNKS, rpr = DS4_Q8T_ROUND / nc;
    const u32 q_span = rpr >= 32 ? rpr : 32;  // rows quantized together
    const u32 rq = warp_id() / groups, cg = warp_id() % groups;
    u32 begin, end;
    q8_block_rounds(n0 + n1, rpr, begin, end, QOUT ? q_span / rpr : 1);
    if (begin >= end) {
        ds4_grid_sync();
        return;
    }
    uint4* tile = tiles + warp_id() * DS4_Q8T_WORDS;
    uint4 v[DS4_Q8T_LOADS];
    Q8RoundMatrix m = q8_round_matrix(begin, rpr, w0, y0, n0, w1, y1, n1);
    q8_held_load(v, m.w, nc, m.rd * rpr + rq * 4, cg, m.n_out);
    ds4_grid_sync();  // the first round's weights in flight before the wait (prelude.h)
    int xs[DS4_COLS][8] = {};
    float xsc[DS4_COLS] = {};
    u32 key = ~0u;  // the activation group in xs
    for (u32 rd = begin; rd < end; ++rd) {
        u32 wc[4][8];
        float wd[4];
        q8_held_swap(tile, v, wc, wd);
        const Q8RoundMatrix cur = m;
        if (rd + 1 < end) {
            m = q8_round_matrix(rd + 1, rpr, w0, y0, n0, w1, y1, n1);
            q8_held_load(v, m.w, nc, m.rd * rpr + rq * 4, cg, m.n_out);
        }
        const u32 row0 = cur.rd * rpr + rq * 4;
        if (row0 < cur.n_out && row0 / rows_per_group != key) {
            key = row0 / rows_per_group;
            q8_held_acts(xs, xsc, xq, xd, x_stride, key, n_in, cg * DS4_QH_CHUNKS + lane_id() / 8, n_cols);
        }
        q8_held_round(wc, wd, xs, xsc, n_cols, groups, part[rd & 1], [&](u32 col, float s) {
            const u32 row = row0 + lane_id();
            if (row >= cur.n_out) return;
            if (QOUT)
                qrow[col][row % q_span] = s;
            else
                cur.y[(u64)col * cur.n_out + row] = s;
        });
        if (groups > 1) {
            __syncthreads();
            const u32 col = threadIdx.x / rpr, rr = threadIdx.x % rpr, r = cur.rd * rpr + rr;
            if (col < n_cols && r < cur.n_out) {
                const float sum = q8_held_row_sum(part[rd & 1][col], rr, nc);
                if (QOUT)
                    qrow[col][r % q_span] = sum;
                else
                    cur.y[(u64)col * cur.n_out + r] = sum;
            }
        }
        if (QOUT) q8_cols_quantize_done(qrow, cur.rd, rpr, q_span, cur.n_out, n_cols, q_out, d_out);
    }
}

// q8_tiled_product's rounds (one matrix, n1 = 0, grouped rows reading their group's activations; or
// two sharing their activations, q8_round_matrix) for n_cols columns of global activations (column c
// at xq + c * x_stride): each round's tile is staged once and dotted with every column's slice.
// QOUT as q8_tiled_product's, each column's rows quantized as their Q8_0 blocks complete. Shapes
// q8_held takes run q8_held_cols; the others reload each column's slice every round (header).
// Grid (any), block 256.
template <bool QOUT>
DS4_DEV void q8_tiled_cols(float* y0, float* y1, const u8* w0, const u8* w1, const i8* xq, const float* xd, u32 n_in,
                           u32 n0, u32 n1, u32 rows_per_group, u32 x_stride, u32 n_cols, i8* q_out, float* d_out) {
    __shared__ uint4 tiles[DS4_WARPS_PER_BLOCK * DS4_Q8T_WORDS];
    __shared__ float part[2][DS4_COLS][DS4_WARPS_PER_BLOCK * 8];
    __shared__ float qrow[QOUT ? DS4_COLS : 1][DS4_Q8T_QROWS];
    if (q8_held(n_in, n0 + n1, rows_per_group)) {
        q8_held_cols<QOUT>(y0, y1, w0, w1, xq, xd, n_in, n0, n1, rows_per_group, x_stride, n_cols, q_out, d_out,
                           tiles, part, qrow);
        return;
    }
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
        if (QOUT) q8_cols_quantize_done(qrow, cur.rd, g.rpr, q_span, cur.n_out, n_cols, q_out, d_out);
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
extern "C" __global__ DS4_QH_LAUNCH void ds4_matvec_q8_0_cols_fast(float* y, const u8* w, const i8* xq,
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
extern "C" __global__ DS4_QH_LAUNCH void ds4_matvec_q8_0_q8_cols_fast(i8* q_out, float* d_out, const u8* w,
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
extern "C" __global__ DS4_QH_LAUNCH void ds4_matvec_q8_0_pair_cols_fast(float* y0, float* y1, const u8* w0,
                                                                         const u8* w1, const i8* xq, const float* xd,
                                                                         u32 n_in, u32 n_out0, u32 n_out1, u32 n_tok) {
    if (!q8_tiled(n_in)) {
        ds4_grid_sync();
        return;
    }  // otherwise ds4_grid_sync in q8_tiled_cols
    q8_tiled_cols<false>(y0, y1, w0, w1, xq, xd, n_in, n_out0, n_out1, n_out0 + n_out1, n_in,
                         min(n_tok, (u32)DS4_COLS), nullptr, nullptr);
}

// q8_swiglu_tiled_cols in the register-held form (q8_held(n_in, n_ff, n_ff) takes the shape): each
// round dots the gate tile with every column, then the up tile; the gate sums wait in shared memory
// (gate, or the partial sums p[0] when a row spans warps) for the up sums. One tile is in flight at
// a time (a second would not fit gfx1151's registers beside the columns'). Shared arrays passed in.
DS4_DEV void q8_held_swiglu_cols(float* mid, const u8* wg, const u8* wu, const i8* xq, const float* xd, u32 n_in,
                                 u32 n_ff, float limit, u32 n_cols, uint4* tiles,
                                 float (*part)[2][DS4_COLS][DS4_WARPS_PER_BLOCK * 8], float (*gate)[DS4_Q8T_ROUND]) {
    const u32 nc = n_in / DS4_Q8_0_CHUNK, groups = nc / DS4_QH_CHUNKS, rpr = DS4_Q8T_ROUND / nc;
    const u32 rq = warp_id() / groups, cg = warp_id() % groups;
    u32 begin, end;
    q8_block_rounds(n_ff, rpr, begin, end);
    if (begin >= end) {
        ds4_grid_sync();
        return;
    }
    uint4* tile = tiles + warp_id() * DS4_Q8T_WORDS;
    uint4 v[DS4_Q8T_LOADS];  // one tile in flight: the round's up tile, then the next round's gate tile
    q8_held_load(v, wg, nc, begin * rpr + rq * 4, cg, n_ff);
    ds4_grid_sync();  // the first round's weights in flight before the wait (prelude.h)
    int xs[DS4_COLS][8] = {};
    float xsc[DS4_COLS] = {};
    q8_held_acts(xs, xsc, xq, xd, n_in, 0, n_in, cg * DS4_QH_CHUNKS + lane_id() / 8, n_cols);
    for (u32 rd = begin; rd < end; ++rd) {
        const u32 row0 = rd * rpr + rq * 4;
        float(*p)[DS4_COLS][DS4_WARPS_PER_BLOCK * 8] = part[rd & 1];
        u32 wc[4][8];
        float wd[4];
        q8_held_swap(tile, v, wc, wd);
        q8_held_load(v, wu, nc, row0, cg, n_ff);
        q8_held_round(wc, wd, xs, xsc, n_cols, groups, p[0],
                      [&](u32 col, float s) { gate[col][rq * 4 + lane_id()] = s; });
        q8_held_swap(tile, v, wc, wd);
        if (rd + 1 < end) q8_held_load(v, wg, nc, row0 + rpr, cg, n_ff);
        q8_held_round(wc, wd, xs, xsc, n_cols, groups, p[1], [&](u32 col, float s) {
            const u32 row = row0 + lane_id();
            if (row < n_ff) mid[(u64)col * n_ff + row] = swiglu_clamped(gate[col][rq * 4 + lane_id()], s, limit);
        });
        if (groups > 1) {
            __syncthreads();
            const u32 col = threadIdx.x / rpr, rr = threadIdx.x % rpr, r = rd * rpr + rr;
            if (col < n_cols && r < n_ff)
                mid[(u64)col * n_ff + r] = swiglu_clamped(q8_held_row_sum(p[0][col], rr, nc),
                                                          q8_held_row_sum(p[1][col], rr, nc), limit);
        }
    }
}

// q8_swiglu_tiled for n_cols columns: a round's gate tile is dotted with every column, then its up
// tile; with whole rows a warp (k == 1) the lane that writes a row keeps its gate sums in shared
// memory until its up sums come. Shapes q8_held takes run q8_held_swiglu_cols.
DS4_DEV void q8_swiglu_tiled_cols(float* mid, const u8* wg, const u8* wu, const i8* xq, const float* xd, u32 n_in,
                                  u32 n_ff, float limit, u32 n_cols) {
    __shared__ uint4 tiles[DS4_WARPS_PER_BLOCK * DS4_Q8T_WORDS];
    __shared__ float part[2][2][DS4_COLS][DS4_WARPS_PER_BLOCK * 8];
    __shared__ float gate[DS4_COLS][DS4_Q8T_ROUND];
    if (q8_held(n_in, n_ff, n_ff)) {
        q8_held_swiglu_cols(mid, wg, wu, xq, xd, n_in, n_ff, limit, n_cols, tiles, part, gate);
        return;
    }
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
        float(*p)[DS4_COLS][DS4_WARPS_PER_BLOCK * 8] = part[rd & 1];
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
