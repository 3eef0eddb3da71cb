//! `HipOptions`: the settings that tune how a HIP session runs (chunk sizes, the decode graph)
//! without changing what it computes: every choice gives the same bits, except the fast
//! attention's slice length (`DS4_HIP_ATTENTION_ROWS`), which moves its sums within the fast
//! tolerances. The engine fills them from the environment (`from_env`: `DS4_HIP_PREFILL_CHUNK`,
//! `DS4_HIP_MATVEC_TOKENS`, `DS4_HIP_GRAPH`, `DS4_HIP_LANES`, `DS4_HIP_EXACT`, `DS4_HIP_Q8_BLOCKS`,
//! `DS4_HIP_ATTENTION_ROWS`, README "GPU backend"); a program that opens a backend itself passes its
//! own.

use super::decode;
use super::kernels::FastGrids;
use super::lanes;
use super::prefill;
use crate::backend::arithmetic::Arithmetic;

/// How a `HipSession` session runs; fixed when it is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HipOptions {
    /// Tokens per prefill chunk (1 = every token a decode step); the session allocates its
    /// buffers for min(this, ctx) tokens. Default [`prefill::PREFILL_CHUNK`] (`from_env`: the
    /// device kind's, [`prefill::prefill_chunk`]).
    pub prefill_chunk: usize,
    /// Batches of up to this many tokens take the decode kernels token by token, larger ones the
    /// GEMMs and grouped experts (1 = only single tokens). Default [`prefill::MATVEC_MAX_TOKENS`].
    pub matvec_tokens: usize,
    /// Decode steps replay the captured graph (else direct launches of the same kernels).
    pub decode_graph: bool,
    /// A sublayer's independent chains run on side streams beside the main one (`lanes.rs`; else
    /// every launch in order on one stream).
    pub lanes: bool,
    /// The kernels' arithmetic contract (docs/arithmetic.md): fast by default, exact for verification.
    pub arithmetic: Arithmetic,
    /// The fast kernels' work split where it is a tuning choice (`DS4_HIP_Q8_BLOCKS`,
    /// `DS4_HIP_ATTENTION_ROWS`).
    pub fast_grids: FastGrids,
}

impl Default for HipOptions {
    fn default() -> HipOptions {
        HipOptions {
            prefill_chunk: prefill::PREFILL_CHUNK,
            matvec_tokens: prefill::MATVEC_MAX_TOKENS,
            decode_graph: true,
            lanes: true,
            arithmetic: Arithmetic::default(),
            fast_grids: FastGrids::default(),
        }
    }
}

impl HipOptions {
    /// The defaults for a GPU with (`unified`) or without unified memory, overridden by the
    /// environment; a malformed value is a one-line error naming it.
    pub fn from_env(unified: bool) -> Result<HipOptions, String> {
        Ok(HipOptions {
            prefill_chunk: prefill::prefill_chunk(unified)?,
            matvec_tokens: prefill::matvec_max_tokens()?,
            decode_graph: decode::graph_enabled(),
            lanes: lanes::lanes_enabled(),
            arithmetic: Arithmetic::default().with_env(),
            fast_grids: FastGrids::from_env()?,
        })
    }
}
