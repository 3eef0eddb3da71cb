//! Device memory footprint of one `HipBackend` session besides the weights, computed from the
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
use super::prefill;

/// Device memory of one session besides the weights: the KV ring, compressed rows and
/// compressor/indexer state (`kv`), and the per-token activations (`scratch`). Computed from the
/// shapes alone, so the memory guard can check it before anything is allocated; it is exactly what
/// `backend::HipBackend::with_weights` allocates (a test compares the two).
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

/// The session's device bytes for `ctx` tokens (see `SessionBytes`): the per-layer state of
/// `layer_plans` (rings of `acts::ring_rows` rows for the prefill chunk), the activations from
/// the plan `acts::Acts::new` allocates from.
pub fn session_bytes(hp: &HParams, ctx: usize) -> SessionBytes {
    // A malformed DS4_HIP_PREFILL_CHUNK fails in HipOptions::from_env with its reason; count the default.
    let n_max = prefill::prefill_chunk(ctx).unwrap_or(prefill::PREFILL_CHUNK.min(ctx.max(1)));
    SessionBytes {
        kv: layer_plans(hp, ctx, n_max).iter().map(LayerPlan::bytes).sum(),
        scratch: acts::activation_bytes(hp, n_max, ctx),
    }
}

/// The memory guard's one line: "too little device memory: need X, have Y <detail>".
pub fn too_little_memory(need: u64, have: u64, detail: &str) -> String {
    format!(
        "too little device memory: need {}, have {} {detail}",
        fmt_mib_or_gib(need),
        fmt_mib_or_gib(have)
    )
}
