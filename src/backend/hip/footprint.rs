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
    use crate::backend::hip::prefill;

    /// The Flash figures of docs/memory.md: device KV (raw rings for the prefill chunk, compressed
    /// and indexer rows, compressor states) and activations at 2k, 51k, 128k and 1M tokens; the KV
    /// grows by exactly 13,760 bytes a token (f32 rows: 21 ratio-4 layers × (512 + 128) dims / 4 +
    /// 20 ratio-128 layers × 512 dims / 128).
    #[test]
    fn flash_session_bytes_match_docs_memory() {
        let hp = HParams::flash();
        let kv = |ctx: usize, n: usize| layer_plans(&hp, ctx, n).iter().map(LayerPlan::bytes).sum::<u64>();
        // (chunk, ctx, KV, activations): unified memory's 1024-token chunks (docs/memory.md, first
        // table), then a discrete GPU's 2048-token chunks (second table).
        let docs = [
            (
                prefill::PREFILL_CHUNK_UNIFIED,
                2048usize,
                141_937_664u64,
                884_124_708u64,
            ),
            (prefill::PREFILL_CHUNK_UNIFIED, 51_200, 818_269_184, 934_456_356),
            (prefill::PREFILL_CHUNK_UNIFIED, 131_072, 1_917_307_904, 1_150_987_300),
            (prefill::PREFILL_CHUNK_UNIFIED, 1 << 20, 14_542_162_944, 3_969_559_588),
            (prefill::PREFILL_CHUNK, 2048, 232_115_200, 1_766_728_228),
            (prefill::PREFILL_CHUNK, 51_200, 908_446_720, 1_867_391_524),
            (prefill::PREFILL_CHUNK, 131_072, 2_007_485_440, 2_300_453_412),
            (prefill::PREFILL_CHUNK, 1 << 20, 14_632_340_480, 7_937_597_988),
        ];
        for (chunk, ctx, want_kv, want_scratch) in docs {
            let s = session_bytes(&hp, ctx, chunk);
            assert_eq!(s.kv, want_kv, "KV at {ctx}, {chunk}-token chunks");
            assert_eq!(s.scratch, want_scratch, "scratch at {ctx}, {chunk}-token chunks");
        }
        assert_eq!(kv(2 * 65_536, 1024) - kv(65_536, 1024), 65_536 * 13_760);
        // 16,384-token chunks: the rings grow by 15,360 rows of 2 KiB in each of 43 layers, and
        // the activations (the attention and indexer scores most) 16-fold.
        assert_eq!(kv(51_200, 16_384) - kv(51_200, 1024), 43 * 15_360 * 2048);
        assert_eq!(acts::activation_bytes(&hp, 16_384, 131_072), 18_392_978_980);
        assert_eq!(acts::activation_bytes(&hp, 16_384, 1 << 20), 63_490_135_588);
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
        assert!(
            hint.starts_with("--ctx 1048576 needs KV 13.63 GiB + scratch 7.39 GiB"),
            "{hint}"
        );
        assert!(hint.ends_with("; --ctx 131072 fits"), "{hint}");
        assert!(ctx_hint(&hp, 8192, 0, chunk).ends_with("(docs/memory.md)"));
    }
}
