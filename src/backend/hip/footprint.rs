//! Device memory footprint of one `HipBackend` session besides the weights, computed from the
//! shapes alone so the memory guard (`backend::open_backend`) can check it before anything is
//! allocated: the KV ring, compressed rows and compressor/indexer state, and the activations.
//!
//! It mirrors the per-layer allocations of `forward::HipBackend::with_weights` buffer by buffer and
//! takes the activations from the plan they are allocated from (`prefill::activation_bytes`); the
//! emulator test (tests/hip_emu_product.rs) compares it with what the device actually hands out, so
//! a change of the session's buffers that is not made here too fails there. Owns the formulas only.

use crate::model::hparams::HParams;

use super::prefill;

/// Device memory of one session besides the weights: the KV ring, compressed rows and
/// compressor/indexer state (`kv`), and the per-token activations (`scratch`). Computed from the
/// shapes alone, so the memory guard can check it before anything is allocated; it is exactly what
/// `forward::HipBackend::with_weights` allocates (a test compares the two).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SessionBytes {
    pub kv: u64,
    pub scratch: u64,
}

/// The session's device bytes for `ctx` tokens (see `SessionBytes`): the per-layer state as
/// `forward::HipBackend::with_weights` allocates it (rings of `prefill::ring_rows` rows for the
/// prefill chunk), the activations from the plan `prefill::Acts::new` allocates from.
pub fn session_bytes(hp: &HParams, ctx: usize) -> SessionBytes {
    // A malformed DS4_HIP_PREFILL_CHUNK fails in with_weights with its reason; count the default.
    let n_max = prefill::prefill_chunk(ctx).unwrap_or(prefill::PREFILL_CHUNK.min(ctx.max(1)));
    let f32s = |n: usize| 4 * n.max(1) as u64;
    let (d, di) = (hp.head_dim, hp.idx_head_dim);
    let raw_cap = prefill::ring_rows(hp, n_max);
    let mut kv = 0u64;
    for l in 0..hp.n_layer {
        let ratio = hp.ratio(l) as usize;
        let c = hp.compress_overlap(l);
        let comp_cap = if ratio == 0 {
            0
        } else {
            crate::backend::cpu::cache::comp_cap(ctx, ratio)
        };
        kv += f32s(raw_cap * d);
        let state = |width: usize| f32s(comp_cap * width) + 2 * f32s(c * ratio * c * width);
        if ratio != 0 {
            kv += state(d);
        }
        if hp.has_indexer(l) {
            kv += state(di);
        }
    }
    SessionBytes {
        kv,
        scratch: prefill::activation_bytes(hp, n_max, ctx),
    }
}
