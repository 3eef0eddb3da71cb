//! Device memory footprint of one `HipBackend` session besides the weights, computed from the
//! shapes alone so the memory guard (`backend::open_backend`) can check it before anything is
//! allocated: the KV ring, compressed rows and compressor/indexer state, and the activations.
//!
//! It mirrors the allocations of `forward::HipBackend::with_weights` buffer by buffer; the emulator
//! test (tests/hip_emu_product.rs) compares it with what the device actually hands out, so a change
//! of the session's buffers that is not made here too fails there. Owns the formulas only.

use crate::model::hparams::HParams;

use super::kernels::{self, AttentionShape};

/// Device memory of one session besides the weights: the KV ring, compressed rows and
/// compressor/indexer state (`kv`), and the per-token activations (`scratch`). Computed from the
/// shapes alone, so the memory guard can check it before anything is allocated; it is exactly what
/// `forward::HipBackend::with_weights` allocates (a test compares the two).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SessionBytes {
    pub kv: u64,
    pub scratch: u64,
}

/// The session's device bytes for `ctx` tokens (see `SessionBytes`); mirrors the allocations of
/// `forward::HipBackend::with_weights` buffer by buffer.
pub fn session_bytes(hp: &HParams, ctx: usize) -> SessionBytes {
    let f32s = |n: usize| 4 * n.max(1) as u64;
    let bytes = |n: usize| n.max(1) as u64;
    let (ne, d, di) = (hp.n_embd, hp.head_dim, hp.idx_head_dim);
    let raw_cap = hp.sliding_window.max(1);
    let mut kv = 0u64;
    let mut max_comp_cap = 1usize;
    for l in 0..hp.n_layer {
        let ratio = hp.ratio(l) as usize;
        let c = hp.compress_overlap(l);
        let comp_cap = if ratio == 0 {
            0
        } else {
            crate::backend::cpu::cache::comp_cap(ctx, ratio)
        };
        max_comp_cap = max_comp_cap.max(comp_cap);
        kv += f32s(raw_cap * d);
        let state = |width: usize| f32s(comp_cap * width) + 2 * f32s(c * ratio * c * width);
        if ratio != 0 {
            kv += state(d);
        }
        if hp.has_indexer(l) {
            kv += state(di);
        }
    }
    let n_mix = hp.hc_mix();
    let n_split = kernels::hc_mix_splits(hp.hc_dim() as u32);
    let qdim = hp.q_dim();
    let low = hp.n_out_group * hp.o_lora_rank;
    let ke_f = hp.n_expert_used * hp.n_ff_exp;
    let att_part = attention_part_floats(hp, max_comp_cap);
    let scratch = [
        bytes(4),
        f32s(hp.hc_dim()),
        f32s(n_mix),
        f32s(n_mix),
        f32s(kernels::hc_part_floats(1, n_split, n_mix as u32)),
        bytes(4),
        f32s(ne),
        bytes(ne),
        f32s(ne / 32),
        bytes(ne),
        f32s(ne / 256),
        bytes(2 * (ne / 16)),
        f32s(hp.q_lora_rank),
        f32s(hp.q_lora_rank),
        bytes(hp.q_lora_rank),
        f32s(hp.q_lora_rank / 32),
        f32s(qdim),
        f32s(d),
        f32s(2 * d.max(di)),
        f32s(2 * d.max(di)),
        f32s(hp.idx_n_head * di),
        f32s(hp.idx_n_head),
        f32s(max_comp_cap),
        bytes(4 * hp.idx_top_k),
        f32s(qdim),
        f32s(att_part),
        bytes(qdim),
        f32s(qdim / 32),
        f32s(low),
        bytes(low),
        f32s(low / 32),
        f32s(ne),
        f32s(hp.n_expert),
        bytes(4 * hp.n_expert_used),
        f32s(hp.n_expert_used),
        f32s(ke_f),
        bytes(ke_f),
        f32s(ke_f / 256),
        bytes(2 * (ke_f / 16)),
        f32s(ne),
        f32s(hp.n_ff_exp),
        bytes(hp.n_ff_exp),
        f32s(hp.n_ff_exp / 32),
        f32s(ne),
        f32s(hp.n_vocab),
    ]
    .iter()
    .sum();
    SessionBytes { kv, scratch }
}

/// Floats of the attention partials buffer: the most splits any position up to the largest
/// compressed-row count can need.
fn attention_part_floats(hp: &HParams, max_comp_cap: usize) -> usize {
    let raw_cap = hp.sliding_window.max(1);
    let shape_max = AttentionShape {
        n_head: hp.n_head as u32,
        head_dim: hp.head_dim as u32,
        ring_cap: raw_cap as u32,
        window: hp.sliding_window as u32,
        ratio: 1,
        top_k: u32::MAX,
    };
    let max_rows = (raw_cap + max_comp_cap) as u32;
    shape_max.part_floats(1, max_rows.div_ceil(32).max(2))
}
