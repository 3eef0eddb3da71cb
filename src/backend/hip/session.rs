//! `HipSession`: the forward pass on one HIP device, a `backend::DeviceSession` whose weights,
//! activations, KV ring, compressed rows and compressor/indexer state live on the device.
//!
//! `eval` runs a single token as one decode step (`decode.rs`: replay of the captured graph, or
//! direct launches) and longer inputs as chunks of up to `Acts::n_max` tokens (`prefill.rs`), both
//! through the launch sequence of `layers.rs`. The logits stay on the device until someone asks for
//! them (`logits()`), and `sample_on_device` picks the next token there. The semantics are those of
//! the CPU engine (`backend::cpu::forward`, docs/model.md#forward-pass); the emulator tests compare the
//! two bit for bit.
//!
//! Owns the device buffers of one session and the order of an eval (chunks, progress, cancel); must
//! not know about chat or sampling (the checkpoint payload is `session/state.rs`'s).

use std::cell::{Cell, OnceCell};
use std::sync::Arc;

use crate::backend::arithmetic::Arithmetic;
use crate::backend::{BackendError, DevicePick, DeviceSample, DeviceSession, MemoryReport, PlacementReport, Progress};
use crate::model::Model;

use super::acts::Acts;
use super::block::{self, SpanTables};
use super::cache::{self, LayerState};
use super::decode::{self, DecodeGraph};
use super::kernel_module::KernelModule;
use super::kernels::{self, ExpertFormat, RopeParams};
use super::lanes::Lanes;
use super::layers;
use super::options::HipOptions;
use super::pass::{Pass, dev};
use super::profile::LaunchProfile;
use super::runtime::{HipContext, PinnedBuffer, Stream};
use super::weights::DeviceWeights;

/// The DSpark drafter's capture (a child module: it reads the private buffers).
mod dspark;
/// The checkpoint payload of the device state (a child module: it reads the private buffers).
mod state;
/// The block verify and commit (a child module: it reads the private buffers).
mod verify;

/// The forward pass on one HIP device for one model and one session cache.
pub struct HipSession {
    model: Arc<Model>,
    ctx: usize,
    n_past: usize,
    /// Host copy of `acts.logits`, fetched by the first `logits()` after an eval (a decode loop that
    /// samples on the device never needs it); `logits_spare` keeps its allocation between steps.
    host_logits: OnceCell<Vec<f32>>,
    logits_spare: Cell<Vec<f32>>,
    /// Pinned staging of the step parameters (`acts::STEP_TOKENS` words, then the token ids) and
    /// of the device sampling result.
    step_host: PinnedBuffer,
    sample_host: PinnedBuffer,
    /// The captured decode step (made at the first decode step) and whether to use one
    /// (`HipOptions::decode_graph`).
    decode_graph: Option<DecodeGraph>,
    use_graph: bool,
    /// The kernels' arithmetic contract (`HipOptions::arithmetic`).
    arithmetic: Arithmetic,
    /// The fast twins' tunable grid sizes (`HipOptions::fast_grids`).
    fast_grids: kernels::FastGrids,
    layers: Vec<LayerState>,
    acts: Acts,
    /// Batches up to this size take the decode kernels token by token (`HipOptions::matvec_tokens`).
    matvec_tokens: usize,
    kv_bytes: u64,
    scratch_bytes: u64,
    ropes: Vec<RopeParams>,
    /// DS4_HIP_PROFILE=1: device time per kernel, printed when the backend is dropped.
    profile: LaunchProfile,
    /// Shared with the engine and its other sessions (`engine::HipModel`).
    weights: Arc<DeviceWeights>,
    placement: PlacementReport,
    stream: Stream,
    /// Side streams for a sublayer's independent chains (`lanes.rs`).
    lanes: Lanes,
    kernels: Arc<KernelModule>,
    /// The block verify's pending block, rows and graphs (`verify.rs`).
    verify: verify::BlockVerify,
    /// The target-row capture of an attached DSpark drafter (`session/dspark.rs`).
    dspark: Option<dspark::SessionCapture>,
    hip: HipContext,
}

/// The placement the backend reports, from the placed weights.
pub(super) fn placement_of(w: &DeviceWeights, reason: String) -> PlacementReport {
    PlacementReport {
        copied: !w.is_mapped(),
        bytes: w.len_bytes() as u64,
        seconds: w.upload_seconds,
        reason,
    }
}

impl HipSession {
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
                if ExpertFormat::from_ggml_type(t.ty()).is_none() {
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
    pub fn new(
        hip: HipContext,
        kernels: KernelModule,
        model: Arc<Model>,
        ctx: usize,
        options: HipOptions,
    ) -> Result<HipSession, String> {
        Self::check_model(&model)?;
        let weights = DeviceWeights::upload(&hip, &model, &mut |_, _| {})?;
        Self::with_weights(
            hip,
            Arc::new(kernels),
            model,
            ctx,
            Arc::new(weights),
            String::new(),
            options,
        )
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
        options: HipOptions,
    ) -> Result<HipSession, String> {
        Self::check_model(&model)?;
        let placement = placement_of(&weights, reason);
        let hp = &model.hp;
        let stream = hip.stream().map_err(|e| e.to_string())?;
        let profile = LaunchProfile::from_env(&hip);
        // A launch profile times launches one at a time: chains then run in order.
        let lanes = Lanes::new(&hip, options.lanes && !profile.is_on()).map_err(|e| e.to_string())?;
        let n_max = options.prefill_chunk.clamp(1, ctx.max(1));
        let (layers, kv_bytes) = cache::alloc_layers(&hip, hp, ctx, n_max)?;
        let acts = Acts::new(&hip, hp, n_max, ctx)?;
        let scratch_bytes = acts.len_bytes();
        let pinned = |bytes: usize| PinnedBuffer::new(&hip, bytes).map_err(|e| e.to_string());
        let step_host = pinned(acts.step.len_bytes())?;
        let mut acts = acts;
        let spans = SpanTables::new(
            &layers,
            acts.kept_states.ptr().0,
            acts.logits.ptr().0,
            acts.logits_before.ptr().0,
            acts.block_logits.ptr().0,
            hp.n_vocab,
        );
        acts.spans.copy_from_host(0, &spans.words).map_err(|e| e.to_string())?;
        let sample_host = pinned(4 * kernels::SAMPLE_OUT_WORDS)?;
        let mut backend = HipSession {
            host_logits: OnceCell::from(vec![0.0; hp.n_vocab]),
            logits_spare: Cell::new(Vec::new()),
            step_host,
            sample_host,
            decode_graph: None,
            use_graph: options.decode_graph,
            arithmetic: options.arithmetic,
            fast_grids: options.fast_grids,
            model: model.clone(),
            ctx,
            n_past: 0,
            layers,
            acts,
            matvec_tokens: options.matvec_tokens.max(1),
            kv_bytes,
            scratch_bytes,
            ropes: layers::layer_ropes(hp),
            profile,
            weights,
            placement,
            stream,
            lanes,
            kernels,
            verify: verify::BlockVerify::new(spans),
            dspark: None,
            hip,
        };
        backend.clear_state().map_err(|e| e.to_string())?;
        Ok(backend)
    }

    /// The launch sequence's view of this session.
    fn pass(&self) -> Pass<'_> {
        Pass {
            model: &self.model,
            weights: &self.weights,
            acts: &self.acts,
            layers: &self.layers,
            ropes: &self.ropes,
            matvec_tokens: self.matvec_tokens,
            stream: &self.stream,
            lanes: &self.lanes,
            lane: Default::default(),
            forked: Default::default(),
            kernels: &self.kernels,
            profile: &self.profile,
            arithmetic: self.arithmetic,
            fast_grids: self.fast_grids,
            warp_size: self.hip.info().warp_size as u32,
            pending_post: Default::default(),
            overlap: Cell::new(true),
            hc_in_alt: Default::default(),
            keep_compressor_inputs: false,
            dspark: self.dspark.as_ref().map(|c| &c.device),
        }
    }

    /// Replay the captured decode graph for decode steps or launch the same kernels directly
    /// (`selftest --forward` compares the two on one session).
    pub fn set_decode_graph(&mut self, on: bool) {
        self.use_graph = on;
    }

    /// Whether the next decode step replays the graph: not with the launch profile (it brackets
    /// every launch).
    fn decode_graph_active(&self) -> bool {
        self.use_graph && !self.profile.is_on()
    }

    /// Kernel launches of the launch sequence since the backend was made (directly or by replays of
    /// the decode graph; device sampling and cache fills not counted), for `selftest --forward`.
    pub fn launch_count(&self) -> u64 {
        self.acts.launches.get()
    }

    /// One decode step (step parameters already written) by replaying the captured graph; the
    /// first call captures it.
    fn decode_step_graph(&mut self) -> Result<(), BackendError> {
        if self.decode_graph.is_none() {
            let graph = DecodeGraph::capture(&self.pass())?;
            self.decode_graph = Some(graph);
        }
        let g = self.decode_graph.as_ref().expect("captured above");
        g.replay(&self.acts, &self.stream)
    }

    /// The next token from the last eval's logits, picked on the device; 8 bytes come back.
    fn sample_device(&mut self, how: DeviceSample) -> Result<DevicePick, BackendError> {
        self.hip.bind_thread().map_err(dev)?;
        let pass = self.pass();
        for launch in decode::sample_launches(&self.acts, self.model.hp.n_vocab, how, pass.is_fast()) {
            pass.run(&launch)?;
        }
        decode::read_pick(&self.acts, &mut self.sample_host, &self.stream)
    }

    /// Forget the host copy of the logits (the device's are about to change).
    fn invalidate_logits(&mut self) {
        if let Some(v) = self.host_logits.take() {
            self.logits_spare.set(v);
        }
    }

    /// Set the logits of the last token on the device and on the host (checkpoint restore).
    fn restore_logits(&mut self, logits: Vec<f32>) -> Result<(), BackendError> {
        self.acts.logits.copy_from_host(0, &logits).map_err(dev)?;
        self.invalidate_logits();
        let _ = self.host_logits.set(logits);
        Ok(())
    }

    /// Empty cache: rings and rows zeroed, compressor kv 0 and scores -1e30, the kernels' counters 0
    /// (`counter`, the fast greedy pick's in `sampled`).
    fn clear_state(&mut self) -> Result<(), BackendError> {
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
        for b in [&mut self.acts.counter, &mut self.acts.sampled] {
            let n = b.len_bytes();
            b.fill_bytes_async(0, n, 0, stream).map_err(dev)?;
        }
        // The logits of an empty cache are zeros, on the device (device sampling) and the host.
        let n = self.acts.logits.len_bytes();
        self.acts.logits.fill_bytes_async(0, n, 0, stream).map_err(dev)?;
        for f in &fills {
            self.pass().run(f)?;
        }
        self.stream.synchronize().map_err(dev)?;
        self.verify.forget_rows();
        self.with_capture(|c| c.clear());
        self.n_past = 0;
        self.invalidate_logits();
        let _ = self.host_logits.set(vec![0.0; self.model.hp.n_vocab]);
        Ok(())
    }
}

impl DeviceSession for HipSession {
    fn name(&self) -> &'static str {
        "hip"
    }

    fn device_name(&self) -> String {
        self.hip.name().to_string()
    }

    fn arithmetic(&self) -> Option<Arithmetic> {
        Some(self.arithmetic)
    }

    fn ctx(&self) -> usize {
        self.ctx
    }

    fn n_past(&self) -> usize {
        self.n_past
    }

    fn eval(&mut self, tokens: &[u32], progress: Progress<'_>) -> Result<(), BackendError> {
        crate::backend::check_eval_tokens(tokens, self.n_past, self.ctx, self.model.hp.n_vocab)?;
        self.hip.bind_thread().map_err(dev)?;
        if !tokens.is_empty() {
            self.invalidate_logits();
            self.verify.forget_rows();
        }
        // Chunks of up to `acts.n_max` tokens (one token = a decode step); progress and cancellation
        // between chunks. A cancel leaves n_past at the chunks done and the logits of their last token.
        // The logits stay on the device (`logits()` fetches them).
        let total = tokens.len();
        let mut done = 0;
        let mut prev = 0;
        while done < total {
            if !progress(done, total) {
                if prev > 0 {
                    self.pass().head(prev - 1)?;
                    self.stream.synchronize().map_err(dev)?;
                }
                return Err(BackendError::Cancelled { done });
            }
            let n = self.acts.n_max.min(total - done);
            let last = done + n == total;
            decode::write_step(
                &mut self.acts,
                &mut self.step_host,
                &self.stream,
                self.n_past,
                &tokens[done..done + n],
            )?;
            if n == 1 && last && self.decode_graph_active() {
                self.decode_step_graph()?;
            } else {
                self.pass().forward_tokens(n, last, Some(self.n_past))?;
            }
            self.stream.synchronize().map_err(dev)?;
            self.profile.collect();
            self.capture_batch(self.n_past, n)?;
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

    fn has_block_verify(&self) -> bool {
        block::block_capacity(self.acts.n_max) >= 2
    }

    fn verify(&mut self, tokens: &[u32]) -> Result<(), BackendError> {
        self.verify_block(tokens)
    }

    fn block_logits(&self) -> &[f32] {
        self.verified_logits()
    }

    fn commit(&mut self, keep: usize) -> Result<(), BackendError> {
        self.commit_block(keep)
    }

    fn sample_on_device(&mut self, how: DeviceSample) -> Option<Result<DevicePick, BackendError>> {
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

    fn load_state(&mut self, bytes: &[u8]) -> Result<(), BackendError> {
        self.hip.bind_thread().map_err(dev)?;
        state::load(self, bytes)?;
        self.verify.forget_rows();
        self.with_capture(|c| c.clear());
        Ok(())
    }

    fn export_cache(&self) -> Result<crate::backend::cache_rows::CacheRows, BackendError> {
        self.hip.bind_thread().map_err(dev)?;
        state::export(self)
    }

    fn import_cache(
        &mut self,
        rows: &crate::backend::cache_rows::CacheRows,
        tokens: &[u32],
    ) -> Result<(), BackendError> {
        self.hip.bind_thread().map_err(dev)?;
        state::import(self, rows, tokens.len())?;
        self.verify.forget_rows();
        self.with_capture(|c| c.clear());
        Ok(())
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

    fn dspark(
        &mut self,
        support: Arc<crate::model::dspark::DsparkModel>,
        convention: crate::model::dspark::DsparkConvention,
    ) -> Result<Box<dyn crate::backend::dspark::DsparkForward>, BackendError> {
        self.attach_dspark(support, convention)
    }

    fn weights_placement(&self) -> Option<PlacementReport> {
        Some(self.placement.clone())
    }
}
