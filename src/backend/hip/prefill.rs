//! Chunked prefill: how many tokens one launch sequence takes, and when a batch runs the batched
//! kernels (GEMMs that read every weight once per chunk, routed experts grouped by expert id:
//! `moe_group` → `moe_gemm_gate_up` → `rms_norm_quant` over K_e·n rows → `moe_gemm_down` → `moe_sum`)
//! instead of the decode kernels token by token.
//!
//! Owns the chunk and batch-size policy and the grouping buffers; the launch sequence itself is the
//! same for every batch size (`layers.rs`), and `backend.rs` splits an `eval` into chunks.

use super::acts::Acts;
use super::kernels::{self, ExpertGrouping, ExpertTiles};
use crate::backend::knobs;

/// Tokens per prefill chunk on a discrete GPU. Every non-expert weight is read once per chunk
/// instead of once per token (64-token GEMM tiles), and the routed experts see chunk·K_e
/// token/expert pairs, so larger chunks share more of each expert's weight reads. Measured on an
/// H200 (Flash-shaped q2 file, fast arithmetic, 2026-12-02, tests/hip-on-cuda/run-longctx.sh):
/// a 2048-token prompt 2206 t/s in 1024-token chunks, 2663 t/s in one 2048-token chunk; from 34,816
/// to 51,200 tokens 1414 → 1573 t/s (ds4-bench 1037 in the same run). The chunk is also the cancel
/// and progress granularity: under a second on the H200.
pub const PREFILL_CHUNK: usize = 2048;

/// Tokens per prefill chunk on unified memory (integrated GPUs: Strix Halo). There a chunk's
/// arithmetic, not its weight reads, sets its time (an iGPU prefills a few hundred tokens a
/// second; ds4 measured ~214 t/s on gfx1151), so a larger chunk gains little and would double the
/// wait for a cancel or the next progress step.
pub const PREFILL_CHUNK_UNIFIED: usize = 1024;

/// Environment variable overriding [`PREFILL_CHUNK`] and [`PREFILL_CHUNK_UNIFIED`].
pub const PREFILL_CHUNK_ENV: &str = "DS4_HIP_PREFILL_CHUNK";

/// The prefill chunk of a session on a GPU with (`unified`) or without unified memory:
/// `DS4_HIP_PREFILL_CHUNK` when set to a positive integer, else [`PREFILL_CHUNK_UNIFIED`] or
/// [`PREFILL_CHUNK`] (a session allocates for at most its ctx tokens).
pub fn prefill_chunk(unified: bool) -> Result<usize, String> {
    let default = if unified { PREFILL_CHUNK_UNIFIED } else { PREFILL_CHUNK };
    Ok(knobs::number(PREFILL_CHUNK_ENV)?.unwrap_or(default))
}

/// Batches of at most this many tokens run the decode kernels with one grid row per token (matvecs,
/// per-token experts) instead of the tiled GEMMs and grouped experts: a short prompt or a chat turn's
/// few template tokens leave GEMM tiles mostly empty and few blocks on the device. Measured on the
/// H200 (Flash-shaped q2 file, prefill t/s of batches of n tokens, token-wise vs GEMMs):
/// n = 8: 219 vs 37, 16: 250 vs 65, 32: 268 vs 112, 64: 278 vs 189, 128: 282 vs 322.
/// `DS4_HIP_MATVEC_TOKENS` overrides it (1 = the GEMMs for every n > 1).
pub const MATVEC_MAX_TOKENS: usize = 64;

/// Environment variable overriding [`MATVEC_MAX_TOKENS`].
pub const MATVEC_TOKENS_ENV: &str = "DS4_HIP_MATVEC_TOKENS";

/// [`MATVEC_MAX_TOKENS`], or `DS4_HIP_MATVEC_TOKENS` when set to a count (never below 1: a single
/// token always takes the decode kernels).
pub fn matvec_max_tokens() -> Result<usize, String> {
    let n: Option<usize> = knobs::number(MATVEC_TOKENS_ENV)?;
    Ok(n.map_or(MATVEC_MAX_TOKENS, |n| n.max(1)))
}

/// Whether a batch of `n` tokens runs the decode kernels token by token (at most `matvec_tokens`,
/// see [`MATVEC_MAX_TOKENS`]) rather than the GEMMs and grouped experts.
pub(super) fn token_wise(matvec_tokens: usize, n: u64) -> bool {
    n <= matvec_tokens as u64
}

/// Token-wise batches of 2 to this many tokens (a speculative verify block) run the column matvecs
/// (kernels/matvec_cols.hip) instead of the decode matvecs' one grid row per token: each weight is
/// read once for the batch rather than once per token, and each token's output has the bits of the
/// decode matvec's. The kernels hold one accumulator per column (DS4_COLS), which sets the limit.
pub const COLUMN_MAX_TOKENS: usize = kernels::MATVEC_COLS as usize;

/// Whether a batch of `n` tokens runs the column matvecs: a token-wise batch of 2 to
/// [`COLUMN_MAX_TOKENS`] tokens (one token keeps the decode kernels).
pub(super) fn columns(matvec_tokens: usize, n: u64) -> bool {
    token_wise(matvec_tokens, n) && (2..=COLUMN_MAX_TOKENS as u64).contains(&n)
}

/// The buffers of the routed experts of a batch of `n_tok` tokens grouped by expert id (pairs,
/// tiles, tile count, per-pair down outputs), for `RoutedExperts::launches`.
pub(super) fn expert_grouping(acts: &Acts, n_tok: u32, n_used: u32, n_expert: u32) -> ExpertGrouping {
    ExpertGrouping {
        tiles: ExpertTiles {
            pairs: acts.pairs.ptr().0,
            tiles: acts.tiles.ptr().0,
            n_tiles: acts.n_tiles.ptr().0,
            max_tiles: kernels::moe_max_tiles(n_tok, n_used, n_expert),
        },
        outp: acts.outp.ptr().0,
        min_cols: kernels::MOE_MIN_COLS,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::hip::acts::activation_bytes;
    use crate::model::hparams::HParams;

    /// The registry documents these defaults (docs/configuration.md is checked against it).
    #[test]
    fn the_registry_states_the_defaults() {
        use crate::backend::knobs::knob_named;
        assert_eq!(
            knob_named(PREFILL_CHUNK_ENV).unwrap().default,
            format!("{PREFILL_CHUNK} ({PREFILL_CHUNK_UNIFIED} unified memory)")
        );
        assert_eq!(
            knob_named(MATVEC_TOKENS_ENV).unwrap().default,
            MATVEC_MAX_TOKENS.to_string()
        );
    }

    #[test]
    fn verify_blocks_take_the_column_matvecs() {
        assert!(!columns(MATVEC_MAX_TOKENS, 1), "one token keeps the decode kernels");
        assert!((2..=8).all(|n| columns(MATVEC_MAX_TOKENS, n)));
        assert!(!columns(MATVEC_MAX_TOKENS, 9) && !columns(MATVEC_MAX_TOKENS, 64));
        // Batches past the token-wise size take the GEMMs, whatever their size.
        assert!(!columns(1, 4));
    }

    /// The activation memory of a chunk, for the report (kernels/README.md): Flash with
    /// PREFILL_CHUNK-token chunks. Grows with ctx only through the indexer scores and the attention scores.
    #[test]
    fn activation_bytes_for_flash() {
        let hp = HParams::flash();
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        let mut last = 0;
        for ctx in [4096usize, 65536, 1 << 20] {
            let decode = activation_bytes(&hp, 1, ctx);
            let chunk = activation_bytes(&hp, PREFILL_CHUNK, ctx);
            eprintln!(
                "Flash ctx {ctx}: activations {:.1} MiB for {PREFILL_CHUNK}-token chunks, {:.1} MiB for decode only",
                mib(chunk),
                mib(decode)
            );
            // A chunk holds at least n_max tokens' worth of the per-token rows (q: H*D floats).
            assert!(chunk >= (PREFILL_CHUNK * hp.q_dim() * 4) as u64 && chunk > decode);
            assert!(chunk >= last);
            last = chunk;
        }
    }
}
