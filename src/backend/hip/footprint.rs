//! Device memory footprint of one `HipSession` session besides the weights, computed from the
//! shapes alone so the memory guard (`open::open_backend`) can check it before anything is
//! allocated: the KV ring, compressed rows and compressor/indexer state, and the activations.
//!
//! The per-layer buffers come from one plan (`layer_plans`) that `cache::alloc_layers` allocates
//! from, and the activations from the plan they are allocated from (`acts::activation_bytes`); the
//! emulator test (tests/hip_emu_product.rs) compares the total with what the device actually hands
//! out. Owns the formulas and the memory guard's message.

use crate::model::hparams::HParams;
use crate::units::fmt_mib_or_gib;

use super::acts;

/// Device memory of one session besides the weights: the KV ring, compressed rows and
/// compressor/indexer state (`kv`), and the per-token activations (`scratch`). Computed from the
/// shapes alone, so the memory guard can check it before anything is allocated; it is exactly what
/// `backend::HipSession::with_weights` allocates (a test compares the two).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SessionBytes {
    pub kv: u64,
    pub scratch: u64,
}

/// Floats of one layer's device state (docs/model.md#kv-cache): the raw ring, and for a compressed
/// layer the compressed rows plus the compressor's kv and score state, for the indexer likewise.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerPlan {
    pub ring: usize,
    /// (rows, state) floats of the attention compressor (ratio != 0): rows = comp_cap × head_dim,
    /// state = overlap × ratio × overlap × head_dim for each of kv and score.
    pub comp: Option<(usize, usize)>,
    /// The same for the indexer (ratio-4 layers), with the indexer head dim.
    pub index: Option<(usize, usize)>,
    /// Compressed rows kept: ctx / ratio + 2, as the CPU cache (docs/model.md#kv-cache).
    pub comp_cap: usize,
}

impl LayerPlan {
    /// Bytes as allocated (every buffer at least one float).
    pub fn bytes(&self) -> u64 {
        let f32s = |n: usize| 4 * n.max(1) as u64;
        let state = |s: Option<(usize, usize)>| s.map_or(0, |(rows, st)| f32s(rows) + 2 * f32s(st));
        f32s(self.ring) + state(self.comp) + state(self.index)
    }
}

/// The device state of every layer for `ctx` tokens and prefill chunks of `n_max` tokens.
pub fn layer_plans(hp: &HParams, ctx: usize, n_max: usize) -> Vec<LayerPlan> {
    let (d, di) = (hp.head_dim, hp.idx_head_dim);
    let raw_cap = acts::ring_rows(hp, n_max);
    (0..hp.n_layer)
        .map(|l| {
            let ratio = hp.ratio(l) as usize;
            let c = hp.compress_overlap(l);
            let comp_cap = if ratio == 0 {
                0
            } else {
                crate::backend::cpu::cache::comp_cap(ctx, ratio)
            };
            let state = |width: usize| (comp_cap * width, c * ratio * c * width);
            LayerPlan {
                ring: raw_cap * d,
                comp: (ratio != 0).then(|| state(d)),
                index: hp.has_indexer(l).then(|| state(di)),
                comp_cap,
            }
        })
        .collect()
}

/// The session's device bytes for `ctx` tokens in prefill chunks of `chunk` tokens
/// (`HipOptions::prefill_chunk`; see `SessionBytes`): the per-layer state of `layer_plans` (rings
/// of `acts::ring_rows` rows for the chunk), the activations from the plan `acts::Acts::new`
/// allocates from.
pub fn session_bytes(hp: &HParams, ctx: usize, chunk: usize) -> SessionBytes {
    let n_max = chunk.clamp(1, ctx.max(1));
    SessionBytes {
        kv: layer_plans(hp, ctx, n_max).iter().map(LayerPlan::bytes).sum(),
        scratch: acts::activation_bytes(hp, n_max, ctx),
    }
}

/// Smallest context `largest_ctx_within` suggests.
const MIN_SUGGESTED_CTX: usize = 256;

/// The largest context (a power of two from 256 up to the model's) whose session fits in `room`
/// bytes of device memory with prefill chunks of `chunk` tokens, if any.
pub fn largest_ctx_within(hp: &HParams, room: u64, chunk: usize) -> Option<usize> {
    let top = (hp.context_length as usize).max(MIN_SUGGESTED_CTX);
    std::iter::successors(Some(MIN_SUGGESTED_CTX), |c| c.checked_mul(2))
        .take_while(|&c| c <= top)
        .filter(|&c| {
            let s = session_bytes(hp, c, chunk);
            s.kv + s.scratch <= room
        })
        .last()
}

/// What a session of `ctx` tokens needs, and the largest context that fits `room` bytes when
/// `ctx` does not (prefill chunks of `chunk` tokens): the tail of the memory guard's refusal.
pub fn ctx_hint(hp: &HParams, ctx: usize, room: u64, chunk: usize) -> String {
    let s = session_bytes(hp, ctx, chunk);
    let fits = match largest_ctx_within(hp, room, chunk) {
        Some(c) if c < ctx => format!("; --ctx {c} fits"),
        _ => String::new(),
    };
    format!(
        "--ctx {ctx} needs KV {} + scratch {} (docs/memory.md){fits}",
        fmt_mib_or_gib(s.kv),
        fmt_mib_or_gib(s.scratch)
    )
}

/// The memory guard's one line: "too little device memory: need X, have Y <detail>".
pub fn too_little_memory(need: u64, have: u64, detail: &str) -> String {
    format!(
        "too little device memory: need {}, have {} {detail}",
        fmt_mib_or_gib(need),
        fmt_mib_or_gib(have)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::cache::comp_cap;
    use crate::backend::hip::prefill;

    /// Powers of two from 256 tokens to the model's context.
    fn contexts(hp: &HParams) -> Vec<usize> {
        std::iter::successors(Some(256usize), |c| c.checked_mul(2))
            .take_while(|&c| c <= hp.context_length as usize)
            .collect()
    }

    /// The KV of a session split the way docs/memory.md tables it, each part from the shapes
    /// (docs/model.md#kv-cache) rather than from `layer_plans`: the raw rings (window + chunk - 1
    /// rows of head_dim floats in every layer), the compressor and indexer states (independent of
    /// ctx) and the compressed and indexer rows (ctx / ratio + 2 of each).
    struct KvParts {
        ring: u64,
        states: u64,
        rows: u64,
    }

    fn kv_parts(hp: &HParams, ctx: usize, chunk: usize) -> KvParts {
        let n_max = chunk.clamp(1, ctx);
        let (d, di) = (hp.head_dim as u64, hp.idx_head_dim as u64);
        let ring = 4 * hp.n_layer as u64 * (hp.sliding_window + n_max - 1) as u64 * d;
        let (mut states, mut rows) = (0u64, 0u64);
        for l in 0..hp.n_layer {
            let ratio = hp.ratio(l) as u64;
            if ratio == 0 {
                continue;
            }
            let c = hp.compress_overlap(l) as u64;
            let width = d + if hp.has_indexer(l) { di } else { 0 };
            // kv and score state: overlap x ratio x overlap rows of each width.
            states += 4 * 2 * c * ratio * c * width;
            rows += 4 * comp_cap(ctx, ratio as usize) as u64 * width;
        }
        KvParts { ring, states, rows }
    }

    /// Bytes of compressed and indexer rows a context token adds: the sum over compressed layers
    /// of (head_dim + the indexer's head_dim where it has one) floats / ratio.
    fn row_bytes_per_token(hp: &HParams) -> u64 {
        (0..hp.n_layer)
            .filter(|&l| hp.ratio(l) != 0)
            .map(|l| {
                4 * (hp.head_dim + if hp.has_indexer(l) { hp.idx_head_dim } else { 0 }) as u64 / hp.ratio(l) as u64
            })
            .sum()
    }

    /// The session's KV is the sum of its parts at every context and both default chunk sizes, the
    /// per-token term scales linearly with ctx, the ring linearly with the chunk, and both KV and
    /// activations grow with ctx.
    #[test]
    fn session_bytes_are_the_sum_of_their_parts_and_scale_as_documented() {
        for hp in [HParams::flash(), HParams::tiny()] {
            let per_token = row_bytes_per_token(&hp);
            for chunk in [prefill::PREFILL_CHUNK_UNIFIED, prefill::PREFILL_CHUNK, 16_384] {
                let mut last = SessionBytes::default();
                for ctx in contexts(&hp) {
                    let s = session_bytes(&hp, ctx, chunk);
                    let p = kv_parts(&hp, ctx, chunk);
                    assert_eq!(s.kv, p.ring + p.states + p.rows, "KV parts at ctx {ctx}, chunk {chunk}");
                    // The states do not depend on ctx.
                    assert_eq!(p.states, kv_parts(&hp, 256, chunk).states);
                    // Monotonic in ctx: more context never needs less.
                    assert!(
                        s.kv > last.kv && s.scratch >= last.scratch,
                        "ctx {ctx}: {s:?} after {last:?}"
                    );
                    last = s;
                    // Doubling a context that every ratio divides adds exactly ctx x the per-token
                    // rows (once the context holds a whole chunk, so the rings stay the same).
                    if ctx % 128 == 0 && ctx >= chunk && 2 * ctx <= hp.context_length as usize {
                        let twice = session_bytes(&hp, 2 * ctx, chunk);
                        assert_eq!(twice.kv - s.kv, ctx as u64 * per_token, "per-token rows from {ctx}");
                    }
                }
            }
            // A bigger chunk only lengthens the rings: n_layer x head_dim floats a chunk token.
            let ctx = 51_200;
            let (small, big) = (session_bytes(&hp, ctx, 1024), session_bytes(&hp, ctx, 16_384));
            assert_eq!(big.kv - small.kv, 4 * (hp.n_layer * 15_360 * hp.head_dim) as u64);
            assert!(big.scratch > small.scratch);
            // A chunk longer than the context is the context.
            assert_eq!(session_bytes(&hp, 300, 2048), session_bytes(&hp, 300, 300));
        }
        // Flash: 21 ratio-4 layers x (512 + 128) dims / 4 + 20 ratio-128 layers x 512 dims / 128,
        // floats of 4 bytes (docs/memory.md).
        assert_eq!(
            row_bytes_per_token(&HParams::flash()),
            4 * (21 * 640 / 4 + 20 * 512 / 128) as u64
        );
    }

    /// docs/memory.md's tables of our device KV and activations are these functions' figures: every
    /// "ours" cell of each table (ring, states, rows, ours KV, our activations; MB = 1e6 B to one
    /// decimal, GiB to two) equals what the code computes for its ctx and the table's chunk size.
    #[test]
    fn docs_memory_tables_are_the_code_figures() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/memory.md");
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let hp = HParams::flash();
        let (mut tables, mut cells) = (0, 0);
        let mut chunk = None;
        let mut header: Option<Vec<String>> = None;
        for line in text.lines() {
            if !line.starts_with('|') {
                header = None;
                // A table's chunk size is the last "N-token chunks" said before it.
                if let Some(n) = line
                    .split("-token chunks")
                    .next()
                    .filter(|_| line.contains("-token chunks"))
                    .and_then(|head| head.rsplit(|c: char| !c.is_ascii_digit() && c != ',').next())
                    .and_then(|n| n.replace(',', "").parse::<usize>().ok())
                {
                    chunk = Some(n);
                }
                continue;
            }
            let row: Vec<String> = line
                .trim_matches('|')
                .split('|')
                .map(|c| c.replace('*', "").trim().to_string())
                .collect();
            let Some(head) = &header else {
                if row.first().is_some_and(|c| c == "ctx") && row.iter().any(|c| c == "ours KV") {
                    header = Some(row);
                    tables += 1;
                }
                continue;
            };
            if row[0].starts_with("---") {
                continue;
            }
            let chunk = chunk.expect("a table of our KV after its chunk size");
            let ctx: usize = row[0]
                .replace(',', "")
                .parse()
                .unwrap_or_else(|_| panic!("ctx cell {:?}", row[0]));
            let s = session_bytes(&hp, ctx, chunk);
            let p = kv_parts(&hp, ctx, chunk);
            for (name, cell) in head.iter().zip(&row) {
                let bytes = match name.as_str() {
                    "ring" => p.ring,
                    "states" => p.states,
                    "rows" => p.rows,
                    "ours KV" => s.kv,
                    "our activations" => s.scratch,
                    _ => continue,
                };
                let (mb, gib) = match cell.split_once('(') {
                    Some((mb, gib)) => (mb.trim(), Some(gib.trim_end_matches(')').trim())),
                    None => (cell.as_str(), None),
                };
                let want = format!("{:.1} MB", bytes as f64 / 1e6);
                assert_eq!(
                    mb.replace(',', ""),
                    want,
                    "docs/memory.md {name} at ctx {ctx}, {chunk}-token chunks"
                );
                if let Some(gib) = gib {
                    assert_eq!(
                        gib,
                        format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64),
                        "{name} at ctx {ctx}"
                    );
                }
                cells += 1;
            }
        }
        // Two tables (unified memory's 1024-token chunks, a discrete GPU's 2048) of four contexts:
        // 4 x 5 + 4 x 2 cells.
        assert_eq!((tables, cells), (2, 28), "docs/memory.md's tables of our KV");
        let per_token = row_bytes_per_token(&hp);
        let spelled = format!("{},{:03} B per token", per_token / 1000, per_token % 1000);
        assert!(
            text.contains(&spelled),
            "docs/memory.md gives the rows per token as {spelled}"
        );
    }

    /// The hint names the largest power-of-two context that fits, and says when none does.
    #[test]
    fn ctx_hint_names_a_context_that_fits() {
        let hp = HParams::flash();
        let chunk = prefill::PREFILL_CHUNK;
        let at = |c: usize| {
            let s = session_bytes(&hp, c, chunk);
            s.kv + s.scratch
        };
        assert_eq!(largest_ctx_within(&hp, at(65_536), chunk), Some(65_536));
        assert_eq!(largest_ctx_within(&hp, at(65_536) - 1, chunk), Some(32_768));
        assert_eq!(largest_ctx_within(&hp, at(256) - 1, chunk), None);
        let hint = ctx_hint(&hp, 1 << 20, at(131_072) + 5, chunk);
        let s = session_bytes(&hp, 1 << 20, chunk);
        let needs = format!(
            "--ctx 1048576 needs KV {} + scratch {}",
            fmt_mib_or_gib(s.kv),
            fmt_mib_or_gib(s.scratch)
        );
        assert!(hint.starts_with(&needs), "{hint}");
        assert!(hint.ends_with("; --ctx 131072 fits"), "{hint}");
        assert!(ctx_hint(&hp, 8192, 0, chunk).ends_with("(docs/memory.md)"));
    }
}
