//! The GPU forward pass: `HipBackend`, a `backend::Backend` whose weights, activations, KV ring,
//! compressed rows and compressor/indexer state live on the device.
//!
//! `eval` runs a single token as one decode step and longer inputs as chunks of up to `Acts::n_max`
//! tokens, both through the launch sequence of `prefill.rs` (kernels/README.md "Forward-pass
//! recipe"; batched GEMMs and grouped experts for a chunk; graph capture of the step comes later).
//! The semantics are those of the CPU engine (`backend::cpu::forward`, spec §3): the selftest's
//! `--forward` check compares the two on the same model. Owns the device buffers of one session;
//! must not know about chat or sampling (the checkpoint payload is `state.rs`'s).

use std::sync::Arc;

use crate::backend::{Backend, EngineError, MemoryReport, Progress, WeightsPlacement};
use crate::model::Model;
use crate::model::hparams::HParams;
use crate::model::weights::TensorRef;

use super::kernel_module::KernelModule;
use super::kernels::{self, DevPtr, ExpertFormat, RopeParams};
use super::prefill::{self, Acts};
use super::profile::LaunchProfile;
use super::runtime::{DeviceBuffer, HipContext, Stream};
use super::weights::DeviceWeights;

/// The checkpoint payload of the device state (a child module: it reads the private buffers).
mod state;

/// Device state of one layer (spec §4.1): the raw ring, compressed rows and compressor states.
pub(super) struct LayerState {
    /// `prefill::ring_rows` rows of head_dim floats, row = position % rows.
    pub(super) ring: DeviceBuffer,
    /// Compressed rows, compressor kv and score state (ratio != 0).
    pub(super) comp: Option<[DeviceBuffer; 3]>,
    /// Indexer rows and their compressor kv and score state (ratio 4).
    pub(super) index: Option<[DeviceBuffer; 3]>,
    pub(super) comp_cap: usize,
}

/// The forward pass on one HIP device for one model and one session cache.
pub struct HipBackend {
    pub(super) model: Arc<Model>,
    ctx: usize,
    n_past: usize,
    logits: Vec<f32>,
    pub(super) layers: Vec<LayerState>,
    pub(super) acts: Acts,
    /// Tokens per prefill chunk (<= acts.n_max).
    chunk: usize,
    /// Batches up to this size take the decode kernels token by token (`prefill::MATVEC_MAX_TOKENS`).
    pub(super) matvec_tokens: usize,
    kv_bytes: u64,
    scratch_bytes: u64,
    pub(super) ropes: Vec<RopeParams>,
    /// Diagnostics (selftest only): read back router and indexer scores after each launch and keep
    /// the smallest selection margins of the last token (`selection_margins`).
    pub(super) probe: bool,
    pub(super) margins: std::cell::Cell<(f32, f32)>,
    /// DS4_HIP_PROFILE=1: device time per kernel, printed when the backend is dropped.
    profile: LaunchProfile,
    weights: DeviceWeights,
    placement: WeightsPlacement,
    stream: Stream,
    kernels: KernelModule,
    hip: HipContext,
}

fn dev(e: impl std::fmt::Display) -> EngineError {
    EngineError::Device(e.to_string())
}

/// RoPE of layer `l` on the device, the same choice as the CPU's `Rope::for_layer` (spec §3.5).
fn layer_rope(hp: &HParams, l: usize) -> RopeParams {
    let compressed = hp.ratio(l) != 0;
    let base = if compressed && hp.compress_rope_freq_base > 0.0 {
        hp.compress_rope_freq_base
    } else {
        hp.rope_freq_base
    };
    if compressed && hp.rope_scaling_factor > 1.0 {
        RopeParams::yarn(
            hp.n_rot as u32,
            base,
            hp.rope_scaling_factor,
            hp.rope_orig_ctx as u32,
            hp.yarn_beta_fast,
            hp.yarn_beta_slow,
        )
    } else {
        RopeParams::plain(hp.n_rot as u32, base)
    }
}

impl HipBackend {
    /// Fail with a one-line reason when the model has tensors the GPU kernels cannot run.
    pub fn check_model(model: &Model) -> Result<(), String> {
        if model.hp.n_expert_used > kernels::MOE_MAX_USED {
            return Err(format!(
                "expert_used_count is {}, the GPU expert kernels handle at most {}",
                model.hp.n_expert_used,
                kernels::MOE_MAX_USED
            ));
        }
        for (l, lw) in model.w.layers.iter().enumerate() {
            for t in [&lw.ffn_gate_exps, &lw.ffn_up_exps, &lw.ffn_down_exps] {
                if ExpertFormat::from_ggml_type(t.ty().id()).is_none() {
                    return Err(format!(
                        "layer {l}: expert tensor {} has type {:?}, which the GPU kernels do not support",
                        t.t.name,
                        t.ty()
                    ));
                }
            }
        }
        Ok(())
    }

    /// Upload `model`'s weights (copy) and allocate a session of `ctx` tokens on the device.
    pub fn new(hip: HipContext, kernels: KernelModule, model: Arc<Model>, ctx: usize) -> Result<HipBackend, String> {
        Self::check_model(&model)?;
        let weights = DeviceWeights::upload(&hip, &model, &mut |_, _| {})?;
        Self::with_weights(hip, kernels, model, ctx, weights, String::new())
    }

    /// Allocate a session of `ctx` tokens on the device for weights already placed (`reason`: why
    /// that placement, for `weights_placement`).
    pub fn with_weights(
        hip: HipContext,
        kernels: KernelModule,
        model: Arc<Model>,
        ctx: usize,
        weights: DeviceWeights,
        reason: String,
    ) -> Result<HipBackend, String> {
        Self::check_model(&model)?;
        let placement = super::backend::placement_of(&weights, reason);
        let hp = &model.hp;
        let stream = hip.stream().map_err(|e| e.to_string())?;
        let e = |r: super::runtime::HipResult<DeviceBuffer>| r.map_err(|e| e.to_string());
        let f32s = |n: usize| e(hip.alloc(4 * n.max(1)));
        let n_max = prefill::prefill_chunk(ctx)?;
        let mut layers = Vec::with_capacity(hp.n_layer);
        let mut kv_bytes = 0u64;
        for plan in super::footprint::layer_plans(hp, ctx, n_max) {
            let mut alloc = |floats: usize| -> Result<DeviceBuffer, String> {
                let b = f32s(floats)?;
                kv_bytes += b.len_bytes() as u64;
                Ok(b)
            };
            let ring = alloc(plan.ring)?;
            let mut state = |s: Option<(usize, usize)>| -> Result<Option<[DeviceBuffer; 3]>, String> {
                s.map(|(rows, st)| Ok([alloc(rows)?, alloc(st)?, alloc(st)?]))
                    .transpose()
            };
            let comp = state(plan.comp)?;
            let index = state(plan.index)?;
            layers.push(LayerState {
                ring,
                comp,
                index,
                comp_cap: plan.comp_cap,
            });
        }
        let acts = Acts::new(&hip, hp, n_max, ctx)?;
        let scratch_bytes = acts.len_bytes();
        let ropes = (0..hp.n_layer).map(|l| layer_rope(hp, l)).collect();
        let mut backend = HipBackend {
            logits: vec![0.0; hp.n_vocab],
            model: model.clone(),
            ctx,
            n_past: 0,
            layers,
            acts,
            chunk: n_max,
            matvec_tokens: prefill::matvec_max_tokens()?,
            kv_bytes,
            scratch_bytes,
            ropes,
            probe: false,
            margins: std::cell::Cell::new((f32::INFINITY, f32::INFINITY)),
            profile: LaunchProfile::from_env(&hip),
            weights,
            placement,
            stream,
            kernels,
            hip,
        };
        backend.clear_state().map_err(|e| e.to_string())?;
        Ok(backend)
    }

    /// Batches of up to `n` tokens run the decode kernels token by token, larger ones the GEMMs and
    /// grouped experts (1 = only single tokens; tests use it to reach both paths). Returns the value set.
    pub fn set_matvec_max_tokens(&mut self, n: usize) -> usize {
        self.matvec_tokens = n.max(1);
        self.matvec_tokens
    }

    /// Turn on the selection-margin probe (slow: one synchronization per routed layer).
    pub fn set_probe(&mut self, on: bool) {
        self.probe = on;
    }

    /// Tokens per prefill chunk from now on: at most the chunk the buffers were allocated for
    /// (`prefill::prefill_chunk`), at least 1 (1 = every token a decode step). Returns the value set.
    pub fn set_prefill_chunk(&mut self, n: usize) -> usize {
        self.chunk = n.clamp(1, self.acts.n_max);
        self.chunk
    }

    /// Smallest gap of the last evaluated token between the K-th and (K+1)-th biased router score
    /// over the score-routed layers, and between the top_k-th and next indexer score (relative to
    /// the largest) over the selecting layers: where these are ~0, float noise may flip a
    /// selection (a near tie, legitimately different between backends).
    pub fn selection_margins(&self) -> (f32, f32) {
        self.margins.get()
    }

    pub(super) fn read_f32(&self, ptr: DevPtr, n: usize) -> Result<Vec<f32>, EngineError> {
        self.stream.synchronize().map_err(dev)?;
        let mut bytes = vec![0u8; 4 * n];
        // SAFETY: callers pass a live device buffer or weight tensor of at least n floats.
        unsafe { self.hip.copy_device_to_host(super::runtime::DevicePtr(ptr), &mut bytes) }.map_err(dev)?;
        Ok(bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    pub(super) fn note_margin(&self, scores: &mut [f32], k: usize, relative: bool, router: bool) {
        if scores.len() <= k {
            return;
        }
        scores.sort_by(|a, b| b.total_cmp(a));
        let mut m = scores[k - 1] - scores[k];
        if relative {
            m /= scores[0].abs().max(1e-30);
        }
        let (r, i) = self.margins.get();
        self.margins.set(if router { (r.min(m), i) } else { (r, i.min(m)) });
    }

    pub(super) fn run(&self, launch: &kernels::Launch) -> Result<(), EngineError> {
        // SAFETY: every buffer was sized in `new` for the model's shapes and `ctx` (positions are
        // checked against ctx in `eval`), and the weight pointers address tensors of the uploaded file.
        self.profile
            .time(launch.kernel.name, &self.stream, || unsafe {
                self.kernels.launch(&self.stream, launch)
            })
            .map_err(|e| EngineError::Device(format!("{}: {e}", launch.kernel.name)))
    }

    /// Empty cache: rings and rows zeroed, compressor kv 0 and scores -1e30, the HC counter 0.
    fn clear_state(&mut self) -> Result<(), EngineError> {
        let stream = &self.stream;
        let mut fills = Vec::new();
        for ls in self.layers.iter_mut() {
            let n = ls.ring.len_bytes();
            ls.ring.fill_bytes_async(0, n, 0, stream).map_err(dev)?;
            for st in ls.comp.iter_mut().chain(ls.index.iter_mut()) {
                for b in st[..2].iter_mut() {
                    let n = b.len_bytes();
                    b.fill_bytes_async(0, n, 0, stream).map_err(dev)?;
                }
                fills.push(kernels::fill_f32(st[2].ptr().0, (st[2].len_bytes() / 4) as u64, -1e30));
            }
        }
        let n = self.acts.counter.len_bytes();
        self.acts.counter.fill_bytes_async(0, n, 0, stream).map_err(dev)?;
        for f in &fills {
            self.run(f)?;
        }
        self.stream.synchronize().map_err(dev)?;
        self.n_past = 0;
        Ok(())
    }

    pub(super) fn w(&self, t: &TensorRef) -> DevPtr {
        self.weights.tensor(t).0
    }
}

impl Backend for HipBackend {
    fn name(&self) -> &'static str {
        "hip"
    }

    fn device_name(&self) -> String {
        self.hip.name().to_string()
    }

    fn ctx(&self) -> usize {
        self.ctx
    }

    fn n_past(&self) -> usize {
        self.n_past
    }

    fn eval(&mut self, tokens: &[u32], progress: Progress<'_>) -> Result<(), EngineError> {
        if self.n_past + tokens.len() > self.ctx {
            return Err(EngineError::ContextFull {
                needed: self.n_past + tokens.len(),
                ctx: self.ctx,
            });
        }
        let n_vocab = self.model.hp.n_vocab;
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= n_vocab) {
            return Err(EngineError::Other(format!(
                "token id {bad} is out of the vocabulary ({n_vocab})"
            )));
        }
        self.hip.bind_thread().map_err(dev)?;
        // Chunks of up to `self.chunk` tokens (one token = a decode step); progress and cancellation
        // between chunks. A cancel leaves n_past at the chunks done and the logits of their last token.
        let total = tokens.len();
        let mut done = 0;
        let mut prev = 0;
        while done < total {
            if !progress(done, total) {
                if prev > 0 {
                    self.head(prev - 1)?;
                    self.stream.synchronize().map_err(dev)?;
                    self.acts.logits.copy_to_host(0, &mut self.logits).map_err(dev)?;
                }
                return Err(EngineError::Cancelled { done });
            }
            let n = self.chunk.min(total - done);
            self.acts
                .tokens
                .copy_from_host(0, &tokens[done..done + n])
                .map_err(dev)?;
            self.forward_tokens(self.n_past, n, done + n == total)?;
            self.stream.synchronize().map_err(dev)?;
            self.profile.collect();
            self.n_past += n;
            done += n;
            prev = n;
        }
        if total > 0 {
            self.acts.logits.copy_to_host(0, &mut self.logits).map_err(dev)?;
        }
        progress(total, total);
        Ok(())
    }

    fn logits(&self) -> &[f32] {
        &self.logits
    }

    fn reset(&mut self) {
        // A failure here leaves a device in error; the next eval reports it.
        let _ = self.hip.bind_thread();
        let _ = self.clear_state();
        self.logits.iter_mut().for_each(|x| *x = 0.0);
    }

    fn save_state(&self) -> Vec<u8> {
        // The trait has no error channel here; a device failure yields an empty payload, which
        // `load_state` rejects (the session then re-evaluates instead of restoring).
        let _ = self.hip.bind_thread();
        state::save(self).unwrap_or_default()
    }

    fn load_state(&mut self, bytes: &[u8]) -> Result<(), EngineError> {
        self.hip.bind_thread().map_err(dev)?;
        state::load(self, bytes)
    }

    fn memory(&self) -> MemoryReport {
        let (used, total) = match self.hip.mem_info() {
            Ok((free, total)) => (Some(total - free), Some(total)),
            Err(_) => (None, None),
        };
        MemoryReport {
            kv_bytes: self.kv_bytes,
            scratch_bytes: self.scratch_bytes,
            // Zero-copy weights stay in host memory (MemoryReport's convention).
            device_weight_bytes: if self.placement.copied {
                self.weights.len_bytes() as u64
            } else {
                0
            },
            device_used: used,
            device_total: total,
        }
    }

    fn weights_placement(&self) -> Option<WeightsPlacement> {
        Some(self.placement.clone())
    }
}
