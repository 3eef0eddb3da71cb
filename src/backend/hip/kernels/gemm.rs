//! Builders of kernels/gemm.hip (prefill chunks): the dense GEMMs (64 x 64 output tiles) and the
//! grouped-expert kernels (pairs grouped by expert id into column-class tiles, grouped GEMMs, the
//! slot-order sum), and [`RoutedExperts`], the launches of a batch's routed experts either per
//! token or grouped.

use super::abi::{Arg, DevPtr, GEMM_F16, GEMM_Q8_0, GEMM_Q8_0_SWIGLU, MOE_GROUP, MOE_SUM};
use super::launch::{BLOCK, Launch, blocks, f, ptr, u};
use super::matvec::{Q8Proj, Q8Swiglu};
use super::moe::{ExpertFormat, Q8K, moe_down, moe_gate_up};
use super::norm_quant::{QuantOut, quantize_rows};

/// Output tile edge of the GEMM kernels (DS4_GM_ROWS = DS4_GM_TOKS).
pub const GEMM_TILE: u32 = 64;

/// `ds4_gemm_q8_0`: the projection `p` of a chunk of `n_tok` tokens (rows_per_group must be a
/// multiple of 64). Grid (ceil(n_out/64), ceil(n_tok/64)).
pub fn gemm_q8_0(p: &Q8Proj, n_tok: u32) -> Launch {
    let rows_per_group = p.rows_per_group;
    assert!(
        rows_per_group.is_multiple_of(GEMM_TILE),
        "gemm_q8_0: rows_per_group {rows_per_group} % 64 != 0"
    );
    let args = [p.args(), vec![u(n_tok)]].concat();
    Launch::new(
        &GEMM_Q8_0,
        [blocks(p.n_out, GEMM_TILE), blocks(n_tok, GEMM_TILE), 1],
        args,
    )
}

/// `ds4_gemm_q8_0_swiglu`: batched shared-expert gate/up + SwiGLU. Grid (ceil(n_ff/64), ceil(n_tok/64)).
pub fn gemm_q8_0_swiglu(s: &Q8Swiglu, n_tok: u32) -> Launch {
    let args = [s.args(), vec![u(n_tok)]].concat();
    Launch::new(
        &GEMM_Q8_0_SWIGLU,
        [blocks(s.n_ff, GEMM_TILE), blocks(n_tok, GEMM_TILE), 1],
        args,
    )
}

/// `ds4_gemm_f16`: batched F16-weight projection, f32 activations. Grid (ceil(n_out/64), ceil(n_tok/64)).
pub fn gemm_f16(y: DevPtr, w: DevPtr, x: DevPtr, n_in: u32, n_out: u32, x_stride: u32, n_tok: u32) -> Launch {
    Launch::new(
        &GEMM_F16,
        [blocks(n_out, GEMM_TILE), blocks(n_tok, GEMM_TILE), 1],
        vec![ptr(y), ptr(w), ptr(x), u(n_in), u(n_out), u(x_stride), u(n_tok)],
    )
}

/// Column classes of the grouped expert tiles, narrowest first (kernels/gemm.hip `TileShape`,
/// `tile_class`): a class-C tile covers up to C pairs of one expert and 64, 128 or 256 weight rows.
pub const MOE_TILE_COLS: [u32; 7] = [8, 12, 16, 24, 32, 48, 64];
/// Narrowest column class the batched forward uses (`ds4_moe_group`'s `min_cols`).
pub const MOE_MIN_COLS: u32 = 8;
/// u32 words of one tile record of `ds4_moe_group`: (expert, first pair, count, column class).
pub const MOE_TILE_WORDS: u32 = 4;

/// Pairs per expert that exercise every column class and its edges (8/9, 12/13, 16/17, 24/25, 32/33,
/// 48/49, 64), experts with several full tiles, and an expert with none (total even, for 2 slots per
/// token): the selftest's and the emulator tests' grouping.
pub const TILE_CLASS_COUNTS: [usize; 18] = [1, 7, 8, 9, 12, 13, 16, 17, 24, 25, 32, 33, 48, 49, 64, 70, 132, 0];

/// Expert ids in which expert e occurs counts[e] times, in an order scrambled by `seed` (a test
/// selection for the grouped kernels, which need not see distinct experts per token).
pub fn selection_with_counts(counts: &[usize], seed: u64) -> Vec<u32> {
    let mut sel: Vec<u32> = counts
        .iter()
        .enumerate()
        .flat_map(|(e, &c)| std::iter::repeat_n(e as u32, c))
        .collect();
    let mut state = seed | 1;
    for i in (1..sel.len()).rev() {
        // xorshift64: any fixed scramble will do.
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        sel.swap(i, (state % (i as u64 + 1)) as usize);
    }
    sel
}

/// Upper bound of the expert tiles of a batch: ceil(n_pairs/64) + n_expert (each expert adds at most
/// one partial tile, whatever its column class). Size `tiles` as [`MOE_TILE_WORDS`] * this many u32.
pub fn moe_max_tiles(n_tok: u32, n_used: u32, n_expert: u32) -> u32 {
    (n_tok * n_used).div_ceil(GEMM_TILE) + n_expert
}

/// `ds4_moe_group`: pairs sorted by expert, tiles and the tile count, all on the device; an expert's
/// last partial tile gets the narrowest class of [`MOE_TILE_COLS`] from `min_cols` up that holds it
/// (`min_cols` = 64: every tile 64 wide). Grid (1).
pub fn moe_group(
    pairs: DevPtr,
    tiles: DevPtr,
    n_tiles: DevPtr,
    sel: DevPtr,
    n_tok: u32,
    n_used: u32,
    n_expert: u32,
    min_cols: u32,
) -> Launch {
    assert!(n_expert <= 1024, "moe_group: n_expert {n_expert} > 1024");
    assert!(
        MOE_TILE_COLS.contains(&min_cols),
        "moe_group: min_cols {min_cols} is not one of {MOE_TILE_COLS:?}"
    );
    Launch::new(
        &MOE_GROUP,
        [1, 1, 1],
        vec![
            ptr(pairs),
            ptr(tiles),
            ptr(n_tiles),
            ptr(sel),
            u(n_tok),
            u(n_used),
            u(n_expert),
            u(min_cols),
        ],
    )
}

/// Device buffers made by [`moe_group`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExpertTiles {
    pub pairs: DevPtr,
    pub tiles: DevPtr,
    pub n_tiles: DevPtr,
    /// [`moe_max_tiles`] of the batch (the launch grid's second dimension).
    pub max_tiles: u32,
}

impl ExpertTiles {
    /// The three table pointers in the order the grouped kernels take them.
    fn args(&self) -> [Arg; 3] {
        [self.pairs, self.tiles, self.n_tiles].map(ptr)
    }
}

/// `ds4_moe_gemm_gate_up_<fmt>`: grouped gate/up + SwiGLU, mid [n_tok][n_used][n_ff].
/// Grid (ceil(n_ff/64), max_tiles): sized for 64-row tiles; blocks of taller (narrower) tiles past n_ff exit.
pub fn moe_gemm_gate_up(
    fmt: ExpertFormat,
    mid: DevPtr,
    gate: DevPtr,
    up: DevPtr,
    x: Q8K,
    t: ExpertTiles,
    selw: DevPtr,
    n_in: u32,
    n_ff: u32,
    n_used: u32,
    limit: f32,
) -> Launch {
    Launch::new(
        fmt.kernel("moe_gemm_gate_up"),
        [blocks(n_ff, GEMM_TILE), t.max_tiles.max(1), 1],
        [
            &[ptr(mid), ptr(gate), ptr(up)][..],
            &x.args(),
            &t.args(),
            &[ptr(selw), u(n_in), u(n_ff), u(n_used), f(limit)],
        ]
        .concat(),
    )
}

/// `ds4_moe_gemm_down_<fmt>`: grouped down projection per pair, outp [n_tok * n_used][n_out]; then
/// [`moe_sum`]. Grid (ceil(n_out/64), max_tiles), as for [`moe_gemm_gate_up`].
pub fn moe_gemm_down(
    fmt: ExpertFormat,
    outp: DevPtr,
    down: DevPtr,
    mid: Q8K,
    t: ExpertTiles,
    n_ff: u32,
    n_out: u32,
    n_used: u32,
) -> Launch {
    Launch::new(
        fmt.kernel("moe_gemm_down"),
        [blocks(n_out, GEMM_TILE), t.max_tiles.max(1), 1],
        [
            &[ptr(outp), ptr(down)][..],
            &mid.args(),
            &t.args(),
            &[u(n_ff), u(n_out), u(n_used)],
        ]
        .concat(),
    )
}

/// `ds4_moe_sum`: out[t] = Σ_k outp[t*n_used + k] in slot order. Grid (ceil(n_out/256), n_tok).
pub fn moe_sum(out: DevPtr, outp: DevPtr, n_out: u32, n_used: u32, n_tok: u32) -> Launch {
    Launch::new(
        &MOE_SUM,
        [blocks(n_out, BLOCK), n_tok, 1],
        vec![ptr(out), ptr(outp), u(n_out), u(n_used)],
    )
}

/// The routed experts of a batch (docs/model.md#routed-experts) on device buffers: gate/up + SwiGLU
/// into `mid`, its Q8_K quantization, the down projection into `out` [n_tok][n_out] (n_out = n_in).
#[derive(Clone, Copy, Debug)]
pub struct RoutedExperts {
    pub fmt_gate_up: ExpertFormat,
    pub fmt_down: ExpertFormat,
    /// All-expert weight tensors.
    pub gate: DevPtr,
    pub up: DevPtr,
    pub down: DevPtr,
    /// Q8_K token activations [n_tok][n_in].
    pub x: Q8K,
    /// Router output: expert ids u32 and weights f32, [n_tok][n_used].
    pub sel: DevPtr,
    pub selw: DevPtr,
    /// f32 [n_tok][n_used][n_ff] and its Q8_K planes.
    pub mid: DevPtr,
    pub mid_q: Q8K,
    pub out: DevPtr,
    pub n_in: u32,
    pub n_ff: u32,
    pub n_used: u32,
    pub n_expert: u32,
    /// SwiGLU clamp of the layer.
    pub limit: f32,
}

/// Grouping buffers of [`RoutedExperts::launches`] for a batch: [`moe_group`]'s outputs and the
/// per-pair down outputs `outp` f32 [n_tok * n_used][n_out].
#[derive(Clone, Copy, Debug)]
pub struct ExpertGrouping {
    pub tiles: ExpertTiles,
    pub outp: DevPtr,
    /// [`moe_group`]'s `min_cols` ([`MOE_MIN_COLS`] in the forward pass).
    pub min_cols: u32,
}

impl RoutedExperts {
    /// The launches, in order: per token (decode kernels, `grouping` None) or grouped by expert
    /// ([`moe_group`], the grouped GEMMs and [`moe_sum`]).
    pub fn launches(&self, n_tok: u32, grouping: Option<ExpertGrouping>) -> Vec<Launch> {
        let mid_quant = quantize_rows(
            QuantOut {
                q8_k_q: self.mid_q.q,
                q8_k_d: self.mid_q.d,
                q8_k_bs: self.mid_q.bsums,
                ..Default::default()
            },
            self.mid,
            self.n_ff,
            self.n_used * n_tok,
        );
        let (fg, fd) = (self.fmt_gate_up, self.fmt_down);
        let (n_in, n_ff, n_used) = (self.n_in, self.n_ff, self.n_used);
        let Some(g) = grouping else {
            return vec![
                moe_gate_up(
                    fg, self.mid, self.gate, self.up, self.x, self.sel, self.selw, n_in, n_ff, n_used, self.limit,
                    n_tok,
                ),
                mid_quant,
                moe_down(fd, self.out, self.down, self.mid_q, self.sel, n_ff, n_in, n_used, n_tok),
            ];
        };
        let t = g.tiles;
        vec![
            moe_group(
                t.pairs,
                t.tiles,
                t.n_tiles,
                self.sel,
                n_tok,
                n_used,
                self.n_expert,
                g.min_cols,
            ),
            moe_gemm_gate_up(
                fg, self.mid, self.gate, self.up, self.x, t, self.selw, n_in, n_ff, n_used, self.limit,
            ),
            mid_quant,
            moe_gemm_down(fd, g.outp, self.down, self.mid_q, t, n_ff, n_in, n_used),
            moe_sum(self.out, g.outp, n_in, n_used, n_tok),
        ]
    }
}
