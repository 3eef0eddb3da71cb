//! The device launch sequence for `n` consecutive tokens (kernels/README.md "Forward-pass recipe"),
//! shared by decode (`n == 1`) and the batched prefill (a chunk of up to `Acts::n_max` tokens).
//!
//! A prefill chunk runs one launch sequence per layer (docs/model.md#batched-prefill, the semantics of
//! the CPU engine's `forward_chunk`): the wide products as GEMMs that read every weight once per chunk
//! (`gemm_q8_0`, `gemm_q8_0_swiglu`, `gemm_f16`), the routed experts grouped by expert id (`moe_group`
//! → `moe_gemm_gate_up` → `rms_norm_quant` over K_e·n rows → `moe_gemm_down` → `moe_sum`), and the
//! causal parts with the kernels' token-count forms: the chunk's kv rows go into the raw ring before
//! attention (the ring holds window + n_max − 1 rows, docs/model.md#device-ring), `compressor_pool`
//! walks the chunk in token order, the indexer scores every token of the chunk and `indexer_topk` /
//! `attention` use a token's list only when it sees more than T_k rows. The head runs on the last token
//! only. With `n == 1` the same code issues the decode launches (matvecs, per-token expert kernels),
//! and so does a batch of up to `MATVEC_MAX_TOKENS` tokens (one grid row per token), where a GEMM tile
//! would be mostly empty.
//!
//! Position-dependent values reach the kernels only through the step parameters in device memory
//! (`Acts::step`: the batch's first position, then its token ids), never as launch arguments: the
//! kernels derive the compressed-row counts, the rows a batch emits, whether the indexer selection
//! is active and the attention rows from that position. So the `n == 1` sequence can be captured
//! once into a graph and replayed at every position (`decode.rs`). With a position known to the
//! host (direct launches) the launches that would exit at once are left out and the grids are sized
//! to the batch; while capturing, every launch is issued with the grid the session's largest case
//! needs. Either way the kernels compute the same numbers.
//!
//! With a DSpark drafter attached, each target layer is followed by the copy of its output rows
//! (`dspark_capture.rs`), in the graphs too.
//!
//! Owns the order of the launches over the layers and the head, and each layer's RoPE parameters;
//! the sublayers are `attention_layer.rs` and `ffn_layer.rs`, the buffers `acts.rs` and `cache.rs`.

use crate::backend::BackendError;
use crate::backend::cpu::ops::Rope;
use crate::model::hparams::HParams;

use super::kernels::{self, DevPtr, HcMixed, Q8Proj, QuantOut, RopeParams};
use super::pass::{Pass, p0, q8};

/// RoPE of every layer: the CPU engine's choice and terms (`Rope::for_layer`).
pub(super) fn layer_ropes(hp: &HParams) -> Vec<RopeParams> {
    (0..hp.n_layer)
        .map(|l| RopeParams::from_rope(&Rope::for_layer(hp, hp.ratio(l) != 0)))
        .collect()
}

impl Pass<'_> {
    /// Launch the forward pass of the `n` tokens whose ids and first position pos0 are already in
    /// the step parameters (`acts.step`) through every layer (the session cache must hold positions
    /// `< pos0`); with `want_logits`, the head on the last token writes `acts.logits`. `host_pos` is
    /// pos0 when the host may use it to leave out launches that would exit at once and to size
    /// grids to the batch (direct launches), `None` while capturing the decode graph (every launch,
    /// grids for any position). Nothing is synchronized.
    pub(super) fn forward_tokens(
        &self,
        n: usize,
        want_logits: bool,
        host_pos: Option<usize>,
    ) -> Result<(), BackendError> {
        let hp = &self.model.hp;
        let a = &self.acts;
        assert!(
            n >= 1 && n <= a.n_max,
            "forward_tokens: {n} tokens, buffers for {}",
            a.n_max
        );
        let mw = &self.model.w;
        self.hc_in_alt.set(false);
        // Overlapped launches for token-wise batches only: a prefill chunk's GEMMs measured ~1%
        // slower with them on the H200 (kernels/README.md "Dependent launches").
        self.overlap.set(self.token_wise(n as u64));
        self.launch(&kernels::embed_hc(
            p0(&a.hc),
            self.w(&mw.token_embd),
            a.token_ids(),
            hp.n_embd as u32,
            hp.n_hc as u32,
            hp.n_vocab as u32,
            n as u32,
        ))?;
        let host_pos = host_pos.map(|p| p as u32);
        for l in 0..hp.n_layer {
            self.attention_sublayer(l, n, host_pos)?;
            self.ffn_sublayer(l, n)?;
            if let Some(copy) = self.dspark.and_then(|c| c.copy_launch(l, self.hc_in_alt.get(), n)) {
                self.launch(&copy)?;
            }
        }
        self.flush_launches()?;
        // Every layer advances the HC state twice (`advance_hc`), so a pass ends where it began,
        // in `acts.hc`: a later pass's head (a cancelled eval's) finds it there.
        debug_assert!(!self.hc_in_alt.get(), "the HC state ends a pass in acts.hc");
        if want_logits { self.head(n - 1) } else { Ok(()) }
    }

    /// Output head (docs/model.md#output-head) on the HC state of batch token `t`: writes `acts.logits`.
    pub(super) fn head(&self, t: usize) -> Result<(), BackendError> {
        self.head_rows(t, 1, p0(&self.acts.logits))
    }

    /// Output head on the HC states of batch tokens `first..first + n` (n at most
    /// `block::block_capacity`): their logits, `n_vocab` floats each, to `out` (a verified block's
    /// rows, block.rs). Every row is computed as the one-row head computes it.
    pub(super) fn head_rows(&self, first: usize, n: usize, out: DevPtr) -> Result<(), BackendError> {
        let hp = &self.model.hp;
        let a = &self.acts;
        let mw = &self.model.w;
        let (ne, nhc, v) = (hp.n_embd as u32, hp.n_hc as u32, hp.n_vocab as u32);
        let nt = n as u32;
        let hc = self.hc_state() + (first * hp.hc_dim() * 4) as u64;
        self.launch(&kernels::hc_mix(
            p0(&a.mix),
            hc,
            self.w(&mw.output_hc_fn),
            nhc * ne,
            nhc,
            hp.rms_eps,
            nt,
        ))?;
        let mixed = HcMixed {
            mix: p0(&a.mix),
            hc,
            scale: self.w(&mw.output_hc_scale),
            base: self.w(&mw.output_hc_base),
            n_embd: ne,
            n_hc: nhc,
        };
        self.launch(&kernels::hc_head_finish(p0(&a.yh), &mixed, hp.hc_eps, nt))?;
        let xq = QuantOut::q8_0(p0(&a.xq), p0(&a.xd));
        self.launch(&kernels::norm_rows(
            xq,
            p0(&a.yh),
            self.w(&mw.output_norm),
            ne,
            nt,
            hp.rms_eps,
        ))?;
        let x = q8(&a.xq, &a.xd);
        self.proj_q8_0(&Q8Proj::plain(out, self.w(&mw.output), x, ne, v), nt)
    }
}
