//! The GPU forward pass: `HipBackend`, a `backend::Backend` whose weights, activations, KV ring,
//! compressed rows and compressor/indexer state live on the device.
//!
//! `eval` runs a single token as one decode step and longer inputs as chunks of up to `Acts::n_max`
//! tokens, both through the launch sequence of `prefill.rs` (kernels/README.md "Forward-pass
//! recipe"; batched GEMMs and grouped experts for a chunk). The decode step is captured once into
//! a graph and replayed at every position: the host writes the step parameters (position and token
//! id) with one asynchronous copy, then launches the graph (`DS4_HIP_GRAPH=0`: direct launches of
//! the same kernels). The logits stay on the device until someone asks for them (`logits()`), and
//! `sample_on_device` picks the next token there (greedy and the default min-p path).
//! The semantics are those of the CPU engine (`backend::cpu::forward`, spec §3): the selftest's
//! `--forward` check compares the two on the same model. Owns the device buffers of one session;
//! must not know about chat or sampling (the checkpoint payload is `state.rs`'s).

use std::cell::{Cell, OnceCell};
use std::sync::Arc;

use crate::backend::{Backend, DevicePick, DeviceSample, EngineError, MemoryReport, Progress, WeightsPlacement};
use crate::model::Model;
use crate::model::hparams::HParams;
use crate::model::weights::TensorRef;

use super::kernel_module::KernelModule;
use super::kernels::{self, DevPtr, ExpertFormat, RopeParams};
use super::prefill::{self, Acts};
use super::profile::LaunchProfile;
use super::runtime::{CaptureMode, DeviceBuffer, GraphExec, HipContext, PinnedBuffer, Stream};
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

/// Environment variable that turns the captured decode graph off (`0`: direct launches).
pub const GRAPH_ENV: &str = "DS4_HIP_GRAPH";

/// The decode step captured as a graph, and the kernel launches one replay runs.
struct DecodeGraph {
    exec: GraphExec,
    launches: u64,
}

/// The forward pass on one HIP device for one model and one session cache.
pub struct HipBackend {
    pub(super) model: Arc<Model>,
    ctx: usize,
    n_past: usize,
    /// Host copy of `acts.logits`, fetched by the first `logits()` after an eval (a decode loop that
    /// samples on the device never needs it); `logits_spare` keeps its allocation between steps.
    host_logits: OnceCell<Vec<f32>>,
    logits_spare: Cell<Vec<f32>>,
    /// Pinned staging of the step parameters (`prefill::STEP_TOKENS` words, then the token ids) and
    /// of the device sampling result. Rewritten only after the stream has passed the last copy
    /// (every eval and sample ends with a synchronize).
    step_host: PinnedBuffer,
    sample_host: PinnedBuffer,
    /// The captured decode step (made at the first decode step; every pointer it bakes in lives as
    /// long as the backend, so it is never re-captured) and whether to use one (`DS4_HIP_GRAPH`).
    decode_graph: Option<DecodeGraph>,
    use_graph: bool,
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
    /// Shared with the engine and its other sessions (`engine::HipEngine`).
    weights: Arc<DeviceWeights>,
    placement: WeightsPlacement,
    stream: Stream,
    kernels: Arc<KernelModule>,
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
        Self::with_weights(hip, Arc::new(kernels), model, ctx, Arc::new(weights), String::new())
    }

    /// Allocate a session of `ctx` tokens on the device for weights already placed (`reason`: why
    /// that placement, for `weights_placement`); the kernels and weights are shared, not copied.
    pub fn with_weights(
        hip: HipContext,
        kernels: Arc<KernelModule>,
        model: Arc<Model>,
        ctx: usize,
        weights: Arc<DeviceWeights>,
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
        let pinned = |bytes: usize| PinnedBuffer::new(&hip, bytes).map_err(|e| e.to_string());
        let step_host = pinned(acts.step.len_bytes())?;
        let sample_host = pinned(4 * kernels::SAMPLE_OUT_WORDS)?;
        let use_graph = std::env::var(GRAPH_ENV).map_or(true, |v| v.trim() != "0");
        let ropes = (0..hp.n_layer).map(|l| layer_rope(hp, l)).collect();
        let mut backend = HipBackend {
            host_logits: OnceCell::from(vec![0.0; hp.n_vocab]),
            logits_spare: Cell::new(Vec::new()),
            step_host,
            sample_host,
            decode_graph: None,
            use_graph,
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

    /// Turn on the selection-margin probe (slow: one synchronization per routed layer; decode steps
    /// then use direct launches).
    pub fn set_probe(&mut self, on: bool) {
        self.probe = on;
    }

    /// Replay the captured decode graph for decode steps (the default unless `DS4_HIP_GRAPH=0`) or
    /// launch the same kernels directly.
    pub fn set_decode_graph(&mut self, on: bool) {
        self.use_graph = on;
    }

    /// Whether the next decode step replays the graph: not with the selection probe (it reads
    /// scores back between launches) nor with the launch profile (it brackets every launch).
    pub fn decode_graph_active(&self) -> bool {
        self.use_graph && !self.probe && !self.profile.is_on()
    }

    /// Kernel launches one replay of the decode graph runs (`None` before the first graph step).
    pub fn decode_graph_launches(&self) -> Option<u64> {
        self.decode_graph.as_ref().map(|g| g.launches)
    }

    /// Write the step parameters of a batch of `tokens` at `pos0` to the device: one asynchronous
    /// copy from pinned memory, stream-ordered before the launches that read it.
    fn write_step(&mut self, pos0: usize, tokens: &[u32]) -> Result<(), EngineError> {
        let host = self.step_host.as_mut_slice();
        host[..4].copy_from_slice(&(pos0 as u32).to_le_bytes());
        let ids = &mut host[4 * prefill::STEP_TOKENS..];
        for (dst, t) in ids.chunks_exact_mut(4).zip(tokens) {
            dst.copy_from_slice(&t.to_le_bytes());
        }
        let bytes = 4 * (prefill::STEP_TOKENS + tokens.len());
        self.acts
            .step
            .copy_from_pinned_async(0, &self.step_host, bytes, &self.stream)
            .map_err(dev)
    }

    /// One decode step (step parameters already written) by replaying the captured graph; the
    /// first call captures it.
    fn decode_step_graph(&mut self) -> Result<(), EngineError> {
        if self.decode_graph.is_none() {
            let before = self.launch_count();
            self.stream.begin_capture(CaptureMode::ThreadLocal).map_err(dev)?;
            let issued = self.forward_tokens(1, true, None);
            let captured = self.stream.end_capture();
            let hint = |e: String| EngineError::Device(format!("capturing the decode graph: {e} (set {GRAPH_ENV}=0)"));
            issued.map_err(|e| hint(e.to_string()))?;
            let exec = captured
                .and_then(|g| g.instantiate())
                .map_err(|e| hint(e.to_string()))?;
            let launches = self.launch_count() - before;
            // The captured launches run at each replay, counted there.
            self.acts.launches.set(before);
            self.decode_graph = Some(DecodeGraph { exec, launches });
        }
        let g = self.decode_graph.as_ref().expect("captured above");
        g.exec.launch(&self.stream).map_err(dev)?;
        self.acts.launches.set(self.acts.launches.get() + g.launches);
        Ok(())
    }

    /// Forget the host copy of the logits (the device's are about to change).
    fn invalidate_logits(&mut self) {
        if let Some(v) = self.host_logits.take() {
            self.logits_spare.set(v);
        }
    }

    /// Set the logits of the last token on the device and on the host (checkpoint restore).
    pub(super) fn restore_logits(&mut self, logits: Vec<f32>) -> Result<(), EngineError> {
        self.acts.logits.copy_from_host(0, &logits).map_err(dev)?;
        self.invalidate_logits();
        let _ = self.host_logits.set(logits);
        Ok(())
    }

    /// The next token from the last eval's logits, picked on the device; 8 bytes come back.
    fn sample_device(&mut self, how: DeviceSample) -> Result<DevicePick, EngineError> {
        self.hip.bind_thread().map_err(dev)?;
        let (out, logits) = (self.acts.sampled.ptr().0, self.acts.logits.ptr().0);
        let n = self.model.hp.n_vocab as u32;
        let launch = match how {
            DeviceSample::Greedy => kernels::argmax(out, logits, n),
            DeviceSample::MinP {
                temperature,
                min_p,
                u01,
            } => kernels::sample_min_p(out, logits, n, temperature, min_p, u01),
        };
        self.run(&launch)?;
        let bytes = 4 * kernels::SAMPLE_OUT_WORDS;
        self.acts
            .sampled
            .copy_to_pinned_async(0, &mut self.sample_host, bytes, &self.stream)
            .map_err(dev)?;
        self.stream.synchronize().map_err(dev)?;
        let w = self.sample_host.as_slice();
        let word = |i: usize| u32::from_le_bytes([w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]]);
        Ok(DevicePick {
            token: word(0),
            drew: word(1) != 0,
        })
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
        // The logits of an empty cache are zeros, on the device (device sampling) and the host.
        let n = self.acts.logits.len_bytes();
        self.acts.logits.fill_bytes_async(0, n, 0, stream).map_err(dev)?;
        for f in &fills {
            self.run(f)?;
        }
        self.stream.synchronize().map_err(dev)?;
        self.n_past = 0;
        self.invalidate_logits();
        let _ = self.host_logits.set(vec![0.0; self.model.hp.n_vocab]);
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
        if !tokens.is_empty() {
            self.invalidate_logits();
        }
        // Chunks of up to `self.chunk` tokens (one token = a decode step); progress and cancellation
        // between chunks. A cancel leaves n_past at the chunks done and the logits of their last token.
        // The logits stay on the device (`logits()` fetches them).
        let total = tokens.len();
        let mut done = 0;
        let mut prev = 0;
        while done < total {
            if !progress(done, total) {
                if prev > 0 {
                    self.head(prev - 1)?;
                    self.stream.synchronize().map_err(dev)?;
                }
                return Err(EngineError::Cancelled { done });
            }
            let n = self.chunk.min(total - done);
            let last = done + n == total;
            self.write_step(self.n_past, &tokens[done..done + n])?;
            if n == 1 && last && self.decode_graph_active() {
                self.decode_step_graph()?;
            } else {
                self.forward_tokens(n, last, Some(self.n_past))?;
            }
            self.stream.synchronize().map_err(dev)?;
            self.profile.collect();
            self.n_past += n;
            done += n;
            prev = n;
        }
        progress(total, total);
        Ok(())
    }

    fn logits(&self) -> &[f32] {
        self.host_logits.get_or_init(|| {
            let mut v = self.logits_spare.take();
            v.resize(self.model.hp.n_vocab, 0.0);
            // eval ends with the stream synchronized. The trait has no error channel here: a failed
            // copy (a device in error) reads as NaN logits, and the next eval reports the error.
            let copied = self
                .hip
                .bind_thread()
                .and_then(|_| self.acts.logits.copy_to_host(0, &mut v));
            if copied.is_err() {
                v.fill(f32::NAN);
            }
            v
        })
    }

    fn sample_on_device(&mut self, how: DeviceSample) -> Option<Result<DevicePick, EngineError>> {
        Some(self.sample_device(how))
    }

    fn reset(&mut self) {
        // A failure here leaves a device in error; the next eval reports it.
        let _ = self.hip.bind_thread();
        let _ = self.clear_state();
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
