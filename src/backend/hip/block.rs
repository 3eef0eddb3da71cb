//! The device side of the block verify (docs/model.md#block-verify-and-commit): the sizes of its
//! buffers and the span tables that keep and restore the compressor states.
//!
//! A verify evaluates a block of up to `BLOCK_MAX_TOKENS` tokens as one batch (the launch sequence
//! of `layers.rs`, the head on every row). Most of what a token writes needs no undo on the device:
//! the raw ring holds a prefill chunk more than the window (`acts::ring_rows`), so the rows a
//! rejected token wrote are never read before they are written again, and the compressed and
//! indexer rows past the live count are invisible (every kernel derives the counts from the
//! position). The compressor and indexer states are the exception: a token overwrites a slot of
//! the window being pooled, and at ratio 4 a window end shifts the state. So a verify first copies
//! every state (one `ds4_copy_spans` launch, `keep` table) and keeps its tokens' compressor inputs
//! (the kv and gate projections, `block_redo`); a commit that drops a suffix copies the states back
//! (`restore` table) and walks the kept tokens' inputs through `ds4_compressor_pool` again, which
//! writes the states only (capacity 0: no compressed row is touched). No kept token is evaluated
//! again, and the states end bitwise where a decode of the kept tokens would leave them.
//!
//! Owns the layout of the verify buffers (sizes, per-layer offsets, the span tables); the order of
//! a verify and a commit is `session/verify.rs`'s.

use crate::model::hparams::HParams;

use super::cache::LayerState;
use super::footprint::layer_plans;
use super::kernels::{COPY_SPAN_WORDS, DevPtr};

/// The most tokens one verify takes (a sampled token and up to 7 drafts).
pub const BLOCK_MAX_TOKENS: usize = 8;

/// Tokens a verify of a session with prefill chunks of `n_max` tokens takes: a block is one batch.
pub(super) fn block_capacity(n_max: usize) -> usize {
    n_max.min(BLOCK_MAX_TOKENS)
}

/// Floats of one layer's compressor inputs in `block_redo`: kv then gate projections of the
/// attention compressor (2·head_dim wide at most), then the indexer compressor's (2·idx_head_dim),
/// for `BLOCK_MAX_TOKENS` tokens each.
pub(super) fn redo_layer_floats(hp: &HParams) -> usize {
    2 * BLOCK_MAX_TOKENS * (2 * hp.head_dim + 2 * hp.idx_head_dim)
}

/// Where layer `l`'s compressor inputs go in `block_redo` at `base`: [attention kv, attention
/// gate] and [indexer kv, indexer gate].
pub(super) fn redo_ptrs(hp: &HParams, base: DevPtr, l: usize) -> ([DevPtr; 2], [DevPtr; 2]) {
    let at = |floats: usize| base + 4 * (l * redo_layer_floats(hp) + floats) as u64;
    let (a, i) = (
        BLOCK_MAX_TOKENS * 2 * hp.head_dim,
        BLOCK_MAX_TOKENS * 2 * hp.idx_head_dim,
    );
    ([at(0), at(a)], [at(2 * a), at(2 * a + i)])
}

/// Floats of every compressor and indexer state (kv and score) of a session: the size of the
/// copy a verify keeps.
pub(super) fn state_floats(hp: &HParams, ctx: usize, n_max: usize) -> usize {
    layer_plans(hp, ctx, n_max)
        .iter()
        .flat_map(|p| [p.comp, p.index])
        .map(|s| s.map_or(0, |(_, st)| 2 * st))
        .sum()
}

/// Spans of the tables of a session with `n_states` state buffers: keep (states and the logits),
/// restore (states), then `BLOCK_MAX_TOKENS` + 1 logits copies (block row i, the logits before).
pub(super) fn span_count(n_states: usize) -> usize {
    (n_states + 1) + n_states + BLOCK_MAX_TOKENS + 1
}

/// State buffers (kv and score of each compressor and indexer) of a session with `hp`'s layers.
pub(super) fn state_buffers(hp: &HParams) -> usize {
    (0..hp.n_layer)
        .map(|l| 2 * (usize::from(hp.ratio(l) != 0) + usize::from(hp.has_indexer(l))))
        .sum()
}

/// The span tables' bytes for `hp`.
pub(super) fn span_table_bytes(hp: &HParams) -> usize {
    8 * COPY_SPAN_WORDS * span_count(state_buffers(hp))
}

/// Which table of `SpanTables` a launch copies, as (first span, spans).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum SpanSet {
    /// Every state into `kept_states`, and the logits into `logits_before`.
    Keep,
    /// `kept_states` back into every state.
    Restore,
    /// Block row i of `block_logits` into the logits.
    BlockRow(usize),
    /// `logits_before` into the logits.
    LogitsBefore,
}

/// The span tables' content for a session: `(source, destination, 32-bit words)` per span, in the
/// order `span_count` gives.
pub(super) struct SpanTables {
    pub(super) words: Vec<u64>,
    n_states: usize,
}

impl SpanTables {
    /// The tables for `layers`' states, the logits buffers (`n_vocab` floats each) and the block
    /// logits rows.
    pub(super) fn new(
        layers: &[LayerState],
        kept: DevPtr,
        logits: DevPtr,
        logits_before: DevPtr,
        block_logits: DevPtr,
        n_vocab: usize,
    ) -> SpanTables {
        let mut states = Vec::new();
        let mut at = kept;
        for ls in layers {
            for st in ls.comp.iter().chain(ls.index.iter()) {
                for b in &st[1..] {
                    let words = (b.len_bytes() / 4) as u64;
                    states.push((b.ptr().0, at, words));
                    at += 4 * words;
                }
            }
        }
        let n_states = states.len();
        let mut spans: Vec<(DevPtr, DevPtr, u64)> = states.clone();
        spans.push((logits, logits_before, n_vocab as u64));
        spans.extend(states.iter().map(|&(state, copy, w)| (copy, state, w)));
        spans.extend((0..BLOCK_MAX_TOKENS).map(|i| (block_logits + (4 * i * n_vocab) as u64, logits, n_vocab as u64)));
        spans.push((logits_before, logits, n_vocab as u64));
        debug_assert_eq!(spans.len(), span_count(n_states));
        SpanTables {
            words: spans.into_iter().flat_map(|(s, d, w)| [s, d, w]).collect(),
            n_states,
        }
    }

    /// (first span, spans) of `set`.
    pub(super) fn range(&self, set: SpanSet) -> (usize, usize) {
        let n = self.n_states;
        match set {
            SpanSet::Keep => (0, n + 1),
            SpanSet::Restore => (n + 1, n),
            SpanSet::BlockRow(i) => {
                assert!(i < BLOCK_MAX_TOKENS, "block row {i}");
                (2 * n + 1 + i, 1)
            }
            SpanSet::LogitsBefore => (2 * n + 1 + BLOCK_MAX_TOKENS, 1),
        }
    }
}

/// Device address of span `first` of the table at `table`.
pub(super) fn span_ptr(table: DevPtr, first: usize) -> DevPtr {
    table + (8 * COPY_SPAN_WORDS * first) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The state copy a verify keeps for Flash, and the redo inputs: small beside a step's weight
    /// reads (docs/model.md#block-verify-and-commit cites these sizes).
    #[test]
    fn flash_verify_buffers() {
        let hp = HParams::flash();
        let states = state_floats(&hp, 65536, 2048);
        let mib = |floats: usize| (4 * floats) as f64 / (1 << 20) as f64;
        // Ratio-4 layers keep 2 windows × 2 head_dim columns of kv and score, ratio-128 layers one
        // window of head_dim; the indexer likewise at idx_head_dim.
        let want: usize = (0..hp.n_layer)
            .map(|l| {
                let (r, c) = (hp.ratio(l) as usize, hp.compress_overlap(l));
                let idx = if hp.has_indexer(l) {
                    c * r * c * hp.idx_head_dim
                } else {
                    0
                };
                2 * (c * r * c * hp.head_dim + idx)
            })
            .sum();
        assert_eq!(states, want);
        assert!(mib(states) < 16.0, "{} MiB of states", mib(states));
        assert!(mib(hp.n_layer * redo_layer_floats(&hp)) < 4.0);
        assert_eq!(
            state_buffers(&hp),
            2 * (0..hp.n_layer).filter(|&l| hp.ratio(l) != 0).count()
                + 2 * (0..hp.n_layer).filter(|&l| hp.has_indexer(l)).count()
        );
    }

    /// Layer l's redo inputs do not overlap layer l + 1's, nor each other.
    #[test]
    fn redo_pointers_tile_the_layer() {
        let hp = HParams::flash();
        let (a0, i0) = redo_ptrs(&hp, 0, 0);
        let (a1, _) = redo_ptrs(&hp, 0, 1);
        let f = |floats: usize| 4 * floats as u64;
        assert_eq!(a0[1] - a0[0], f(BLOCK_MAX_TOKENS * 2 * hp.head_dim));
        assert_eq!(i0[0] - a0[1], f(BLOCK_MAX_TOKENS * 2 * hp.head_dim));
        assert_eq!(i0[1] - i0[0], f(BLOCK_MAX_TOKENS * 2 * hp.idx_head_dim));
        assert_eq!(a1[0] - i0[1], f(BLOCK_MAX_TOKENS * 2 * hp.idx_head_dim));
        assert_eq!(a1[0], f(redo_layer_floats(&hp)));
    }
}
