//! Builders of kernels/rows.hip: the per-row finishing (norm, RoPE, E4M3 / FP4 rounding, ring
//! store) of query, kv and compressed rows, and the RoPE parameters the kernel takes.

use crate::backend::cpu::ops::{Rope, RopeTerms};

use super::abi::{Arg, DevPtr, NULL, ROWS_FINISH};
use super::launch::{Launch, f, ptr, u};

/// Largest head_dim of `ds4_rows_finish`.
pub const ROWS_MAX_DIM: u32 = 1024;

/// Flags of [`rows_finish`] (kernels/rows.hip), applied in this order.
pub mod row_flags {
    pub const NORM: u32 = 1;
    pub const ROPE: u32 = 2;
    pub const ROPE_INVERSE: u32 = 4;
    pub const E4M3: u32 = 8;
    pub const HADAMARD_FP4: u32 = 16;
    pub const ROUND_F16: u32 = 32;
    pub const STORE_RING: u32 = 64;
}

/// RoPE parameters of one layer (docs/model.md#rope-and-yarn), as the kernels take them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeParams {
    pub n_rot: u32,
    /// base^(-2/n_rot), computed on the host so every backend uses the same value.
    pub theta_scale: f32,
    pub freq_scale: f32,
    /// 1 with the YaRN blend, 0 without.
    pub ext_factor: f32,
    pub corr_low: f32,
    pub corr_high: f32,
    /// Factor on cos and sin: the YaRN magnitude m divided and multiplied back as the CPU reference
    /// does (`(1 / m) · m`, 1 for ds4's constants, but computed, not assumed).
    pub mscale: f32,
}

impl RopeParams {
    /// Dense (ratio-0) layers: plain rotation with `base`.
    pub fn plain(n_rot: u32, base: f32) -> RopeParams {
        Self::from_terms(n_rot, RopeTerms::plain(n_rot as usize, base))
    }

    /// Compressed layers and their indexer: `base` (160000 for Flash), frequency scale 1/`factor`
    /// and the YaRN ramp between the correction dims of beta_fast / beta_slow
    /// (docs/model.md#rope-and-yarn).
    pub fn yarn(n_rot: u32, base: f32, factor: f32, orig_ctx: u32, beta_fast: f32, beta_slow: f32) -> RopeParams {
        let terms = RopeTerms::yarn(n_rot as usize, base, factor, orig_ctx as u64, beta_fast, beta_slow);
        Self::from_terms(n_rot, terms)
    }

    /// The CPU engine's RoPE of a layer (`Rope::for_layer`), as the kernels take it.
    pub fn from_rope(rope: &Rope) -> RopeParams {
        Self::from_terms(rope.n_rot as u32, rope.terms)
    }

    /// The kernels' angle arguments after n_rot: theta_scale, freq_scale, ext_factor, corr_low,
    /// corr_high, mscale.
    pub fn angle_args(&self) -> [Arg; 6] {
        [
            f(self.theta_scale),
            f(self.freq_scale),
            f(self.ext_factor),
            f(self.corr_low),
            f(self.corr_high),
            f(self.mscale),
        ]
    }

    fn from_terms(n_rot: u32, t: RopeTerms) -> RopeParams {
        let (ext_factor, (corr_low, corr_high)) = match t.yarn {
            Some(dims) => (1.0, dims),
            None => (0.0, (0.0, 0.0)),
        };
        RopeParams {
            n_rot,
            theta_scale: t.theta_scale,
            freq_scale: t.freq_scale,
            ext_factor,
            corr_low,
            corr_high,
            mscale: t.mscale,
        }
    }
}

/// `ds4_rows_finish` on token rows: per-(token, head) row operations (flags from [`row_flags`]) on
/// x [n_tok][n_head][head_dim] in place; row t is at position pos0 + t, pos0 read from the device
/// word `pos` (the step parameters). ring and w may be NULL when unused. Grid (n_head, n_tok).
pub fn rows_finish(
    x: DevPtr,
    ring: DevPtr,
    w: DevPtr,
    pos: DevPtr,
    n_head: u32,
    head_dim: u32,
    flags: u32,
    ring_cap: u32,
    rope: RopeParams,
    eps: f32,
    n_tok: u32,
) -> Launch {
    rows_finish_launch(
        x, ring, w, pos, n_head, head_dim, flags, n_tok, 0, 0, ring_cap, rope, eps, n_tok,
    )
}

/// `ds4_rows_finish` on the compressed rows that the n_tok tokens at pos0 (device word `pos`)
/// emitted into `rows` [row_cap][head_dim] (docs/model.md#compressor, after [`compressor_pool`]): row c
/// at RoPE position c * ratio. Grid (1, `grid_rows`): at least the rows this batch emits
/// ([`compressor_emitted`]; [`compressor_max_emitted`] for any position), blocks past them exit.
pub fn rows_finish_emitted(
    rows: DevPtr,
    w: DevPtr,
    pos: DevPtr,
    head_dim: u32,
    flags: u32,
    ratio: u32,
    row_cap: u32,
    rope: RopeParams,
    eps: f32,
    n_tok: u32,
    grid_rows: u32,
) -> Launch {
    assert!(ratio > 0, "rows_finish_emitted: ratio 0");
    assert!(flags & row_flags::STORE_RING == 0, "rows_finish_emitted: no ring store");
    rows_finish_launch(
        rows,
        NULL,
        w,
        pos,
        1,
        head_dim,
        flags,
        n_tok,
        ratio,
        row_cap,
        1,
        rope,
        eps,
        grid_rows.max(1),
    )
}

fn rows_finish_launch(
    x: DevPtr,
    ring: DevPtr,
    w: DevPtr,
    pos: DevPtr,
    n_head: u32,
    head_dim: u32,
    flags: u32,
    n_tok: u32,
    emit_ratio: u32,
    row_cap: u32,
    ring_cap: u32,
    rope: RopeParams,
    eps: f32,
    grid_y: u32,
) -> Launch {
    assert!(
        head_dim <= ROWS_MAX_DIM,
        "rows_finish: head_dim {head_dim} > {ROWS_MAX_DIM}"
    );
    Launch::new(
        &ROWS_FINISH,
        [n_head, grid_y, 1],
        vec![
            ptr(x),
            ptr(ring),
            ptr(w),
            ptr(pos),
            u(n_head),
            u(head_dim),
            u(rope.n_rot),
            u(flags),
            u(n_tok),
            u(emit_ratio),
            u(row_cap),
            u(ring_cap.max(1)),
        ]
        .into_iter()
        .chain(rope.angle_args())
        .chain([f(eps)])
        .collect(),
    )
}
