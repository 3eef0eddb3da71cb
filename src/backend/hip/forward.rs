//! The GPU forward pass: `HipBackend`, a `backend::Backend` whose weights, activations, KV ring,
//! compressed rows and compressor/indexer state live on the device.
//!
//! Each token is one decode step following kernels/README.md "Forward-pass recipe" (a prefill loops
//! decode steps for now; the batched GEMM prefill and graph capture of the step come later). The
//! semantics are those of the CPU engine (`backend::cpu::forward`, spec §3): the selftest's
//! `--forward` check compares the two on the same model. Owns the device buffers of one session and
//! the launch order; must not know about chat or sampling (the checkpoint payload is `state.rs`'s).

use std::sync::Arc;

use crate::backend::{Backend, EngineError, MemoryReport, Progress, WeightsPlacement};
use crate::model::Model;
use crate::model::hparams::HParams;
use crate::model::weights::TensorRef;

use super::kernel_module::KernelModule;
use super::kernels::{self, AttentionShape, DevPtr, ExpertFormat, HcEps, NQ_NORM, NULL, Q8K, QuantOut, RopeParams};
use super::profile::LaunchProfile;
use super::runtime::{DeviceBuffer, HipContext, Stream};
use super::weights::DeviceWeights;

use kernels::row_flags as rf;

/// The checkpoint payload of the device state (a child module: it reads the private buffers).
mod state;

/// Device state of one layer (spec §4.1): the raw ring, compressed rows and compressor states.
struct LayerState {
    ring: DeviceBuffer,
    /// Compressed rows, compressor kv and score state (ratio != 0).
    comp: Option<[DeviceBuffer; 3]>,
    /// Indexer rows and their compressor kv and score state (ratio 4).
    index: Option<[DeviceBuffer; 3]>,
    comp_cap: usize,
}

/// Per-token activations (one decode step), allocated once.
struct Acts {
    tokens: DeviceBuffer,
    hc: DeviceBuffer,
    split_a: DeviceBuffer,
    split_f: DeviceBuffer,
    part: DeviceBuffer,
    counter: DeviceBuffer,
    xn: DeviceBuffer,
    xq: DeviceBuffer,
    xd: DeviceBuffer,
    kq: DeviceBuffer,
    kd: DeviceBuffer,
    kbs: DeviceBuffer,
    qr: DeviceBuffer,
    qrn: DeviceBuffer,
    qq: DeviceBuffer,
    qd: DeviceBuffer,
    q: DeviceBuffer,
    kv: DeviceBuffer,
    ckv: DeviceBuffer,
    csc: DeviceBuffer,
    qi: DeviceBuffer,
    iw: DeviceBuffer,
    scores: DeviceBuffer,
    sel: DeviceBuffer,
    att: DeviceBuffer,
    att_part: DeviceBuffer,
    aq: DeviceBuffer,
    ad: DeviceBuffer,
    low: DeviceBuffer,
    lq: DeviceBuffer,
    ld: DeviceBuffer,
    y: DeviceBuffer,
    rl: DeviceBuffer,
    sel_e: DeviceBuffer,
    selw: DeviceBuffer,
    mid: DeviceBuffer,
    mq: DeviceBuffer,
    md: DeviceBuffer,
    mbs: DeviceBuffer,
    moe: DeviceBuffer,
    smid: DeviceBuffer,
    sq: DeviceBuffer,
    sd: DeviceBuffer,
    yh: DeviceBuffer,
    logits: DeviceBuffer,
}

/// The forward pass on one HIP device for one model and one session cache.
pub struct HipBackend {
    model: Arc<Model>,
    ctx: usize,
    n_past: usize,
    logits: Vec<f32>,
    layers: Vec<LayerState>,
    acts: Acts,
    kv_bytes: u64,
    scratch_bytes: u64,
    ropes: Vec<RopeParams>,
    /// Diagnostics (selftest only): read back router and indexer scores after each launch and keep
    /// the smallest selection margins of the last token (`selection_margins`).
    probe: bool,
    margins: std::cell::Cell<(f32, f32)>,
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
        let bytes = |n: usize| e(hip.alloc(n.max(1)));
        let (ne, d, di) = (hp.n_embd, hp.head_dim, hp.idx_head_dim);
        let n_mix = hp.hc_mix();
        let raw_cap = hp.sliding_window.max(1);
        let mut layers = Vec::with_capacity(hp.n_layer);
        let mut kv_bytes = 0u64;
        let mut max_comp_cap = 1usize;
        for l in 0..hp.n_layer {
            let ratio = hp.ratio(l) as usize;
            let c = hp.compress_overlap(l);
            // Capacity ctx/ratio + 2 as the CPU cache (spec §4.1).
            let comp_cap = if ratio == 0 {
                0
            } else {
                crate::backend::cpu::cache::comp_cap(ctx, ratio)
            };
            max_comp_cap = max_comp_cap.max(comp_cap);
            let ring = f32s(raw_cap * d)?;
            kv_bytes += ring.len_bytes() as u64;
            let mut state = |width: usize| -> Result<[DeviceBuffer; 3], String> {
                let rows = f32s(comp_cap * width)?;
                let st = c * ratio * c * width;
                let b = [rows, f32s(st)?, f32s(st)?];
                kv_bytes += b.iter().map(|x| x.len_bytes() as u64).sum::<u64>();
                Ok(b)
            };
            let comp = if ratio != 0 { Some(state(d)?) } else { None };
            let index = if hp.has_indexer(l) { Some(state(di)?) } else { None };
            layers.push(LayerState {
                ring,
                comp,
                index,
                comp_cap,
            });
        }
        let n_split = kernels::hc_mix_splits(hp.hc_dim() as u32);
        let qdim = hp.q_dim();
        let low = hp.n_out_group * hp.o_lora_rank;
        let ke_f = hp.n_expert_used * hp.n_ff_exp;
        let shape_max = AttentionShape {
            n_head: hp.n_head as u32,
            head_dim: d as u32,
            ring_cap: raw_cap as u32,
            window: hp.sliding_window as u32,
            ratio: 1,
            top_k: u32::MAX,
        };
        let max_rows = (raw_cap + max_comp_cap) as u32;
        let att_part = shape_max.part_floats(1, max_rows.div_ceil(32).max(2));
        let acts = Acts {
            tokens: bytes(4)?,
            hc: f32s(hp.hc_dim())?,
            split_a: f32s(n_mix)?,
            split_f: f32s(n_mix)?,
            part: f32s(kernels::hc_part_floats(1, n_split, n_mix as u32))?,
            counter: bytes(4)?,
            xn: f32s(ne)?,
            xq: bytes(ne)?,
            xd: f32s(ne / 32)?,
            kq: bytes(ne)?,
            kd: f32s(ne / 256)?,
            kbs: bytes(2 * (ne / 16))?,
            qr: f32s(hp.q_lora_rank)?,
            qrn: f32s(hp.q_lora_rank)?,
            qq: bytes(hp.q_lora_rank)?,
            qd: f32s(hp.q_lora_rank / 32)?,
            q: f32s(qdim)?,
            kv: f32s(d)?,
            ckv: f32s(2 * d.max(di))?,
            csc: f32s(2 * d.max(di))?,
            qi: f32s(hp.idx_n_head * di)?,
            iw: f32s(hp.idx_n_head)?,
            scores: f32s(max_comp_cap)?,
            sel: bytes(4 * hp.idx_top_k)?,
            att: f32s(qdim)?,
            att_part: f32s(att_part)?,
            aq: bytes(qdim)?,
            ad: f32s(qdim / 32)?,
            low: f32s(low)?,
            lq: bytes(low)?,
            ld: f32s(low / 32)?,
            y: f32s(ne)?,
            rl: f32s(hp.n_expert)?,
            sel_e: bytes(4 * hp.n_expert_used)?,
            selw: f32s(hp.n_expert_used)?,
            mid: f32s(ke_f)?,
            mq: bytes(ke_f)?,
            md: f32s(ke_f / 256)?,
            mbs: bytes(2 * (ke_f / 16))?,
            moe: f32s(ne)?,
            smid: f32s(hp.n_ff_exp)?,
            sq: bytes(hp.n_ff_exp)?,
            sd: f32s(hp.n_ff_exp / 32)?,
            yh: f32s(ne)?,
            logits: f32s(hp.n_vocab)?,
        };
        let scratch_bytes = [
            &acts.hc,
            &acts.part,
            &acts.q,
            &acts.att,
            &acts.att_part,
            &acts.mid,
            &acts.mq,
            &acts.logits,
            &acts.scores,
        ]
        .iter()
        .map(|b| b.len_bytes() as u64)
        .sum();
        let ropes = (0..hp.n_layer).map(|l| layer_rope(hp, l)).collect();
        let mut backend = HipBackend {
            logits: vec![0.0; hp.n_vocab],
            model: model.clone(),
            ctx,
            n_past: 0,
            layers,
            acts,
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

    /// Turn on the selection-margin probe (slow: one synchronization per routed layer).
    pub fn set_probe(&mut self, on: bool) {
        self.probe = on;
    }

    /// Smallest gap of the last evaluated token between the K-th and (K+1)-th biased router score
    /// over the score-routed layers, and between the top_k-th and next indexer score (relative to
    /// the largest) over the selecting layers: where these are ~0, float noise may flip a
    /// selection (a near tie, legitimately different between backends).
    pub fn selection_margins(&self) -> (f32, f32) {
        self.margins.get()
    }

    fn read_f32(&self, ptr: DevPtr, n: usize) -> Result<Vec<f32>, EngineError> {
        self.stream.synchronize().map_err(dev)?;
        let mut bytes = vec![0u8; 4 * n];
        // SAFETY: callers pass a live device buffer or weight tensor of at least n floats.
        unsafe { self.hip.copy_device_to_host(super::runtime::DevicePtr(ptr), &mut bytes) }.map_err(dev)?;
        Ok(bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    fn note_margin(&self, scores: &mut [f32], k: usize, relative: bool, router: bool) {
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

    fn run(&self, launch: &kernels::Launch) -> Result<(), EngineError> {
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

    fn w(&self, t: &TensorRef) -> DevPtr {
        self.weights.tensor(t).0
    }

    /// One decode step for the token already in `acts.tokens` at position `p`.
    fn decode_step(&self, p: usize, want_logits: bool) -> Result<(), EngineError> {
        let hp = &self.model.hp;
        self.margins.set((f32::INFINITY, f32::INFINITY));
        let a = &self.acts;
        let (ne, d, di) = (hp.n_embd as u32, hp.head_dim as u32, hp.idx_head_dim as u32);
        let nhc = hp.n_hc as u32;
        let (qr_w, h, hi) = (hp.q_lora_rank as u32, hp.n_head as u32, hp.idx_n_head as u32);
        let (ff, ke, nex) = (hp.n_ff_exp as u32, hp.n_expert_used as u32, hp.n_expert as u32);
        let (g, or) = (hp.n_out_group as u32, hp.o_lora_rank as u32);
        let v = hp.n_vocab as u32;
        let eps = hp.rms_eps;
        let pu = p as u32;
        let raw_cap = hp.sliding_window.max(1) as u32;
        let n_split = kernels::hc_mix_splits(nhc * ne);
        let hc_eps = HcEps {
            rms: hp.hc_eps,
            hc: hp.hc_eps,
            norm: eps,
        };
        let iters = hp.sinkhorn_iters as u32;
        let p0 = |b: &DeviceBuffer| b.ptr().0;
        let mw = &self.model.w;
        self.run(&kernels::embed_hc(
            p0(&a.hc),
            self.w(&mw.token_embd),
            p0(&a.tokens),
            ne,
            nhc,
            v,
            1,
        ))?;
        for (l, (lw, ls)) in mw.layers.iter().zip(&self.layers).enumerate() {
            let rope = self.ropes[l];
            let ratio = hp.ratio(l);
            // Attention sublayer (spec §3.4).
            self.run(&kernels::hc_pre_fused(
                p0(&a.split_a),
                QuantOut {
                    out: p0(&a.xn),
                    q8_0_q: p0(&a.xq),
                    q8_0_d: p0(&a.xd),
                    ..Default::default()
                },
                p0(&a.part),
                p0(&a.counter),
                p0(&a.hc),
                self.w(&lw.hc_attn_fn),
                self.w(&lw.hc_attn_scale),
                self.w(&lw.hc_attn_base),
                self.w(&lw.attn_norm),
                ne,
                nhc,
                n_split,
                iters,
                hc_eps,
                1,
            ))?;
            self.run(&kernels::matvec_q8_0(
                p0(&a.qr),
                self.w(&lw.attn_q_a),
                p0(&a.xq),
                p0(&a.xd),
                ne,
                qr_w,
                qr_w,
                ne,
                1,
            ))?;
            self.run(&kernels::rms_norm_quant(
                QuantOut {
                    out: p0(&a.qrn),
                    q8_0_q: p0(&a.qq),
                    q8_0_d: p0(&a.qd),
                    ..Default::default()
                },
                p0(&a.qr),
                self.w(&lw.attn_q_a_norm),
                qr_w,
                qr_w,
                1,
                NQ_NORM,
                eps,
            ))?;
            self.run(&kernels::matvec_q8_0(
                p0(&a.q),
                self.w(&lw.attn_q_b),
                p0(&a.qq),
                p0(&a.qd),
                qr_w,
                h * d,
                h * d,
                qr_w,
                1,
            ))?;
            self.run(&kernels::rows_finish(
                p0(&a.q),
                NULL,
                NULL,
                h,
                d,
                rf::NORM | rf::ROPE,
                pu,
                1,
                1,
                rope,
                eps,
                1,
            ))?;
            self.run(&kernels::matvec_q8_0(
                p0(&a.kv),
                self.w(&lw.attn_kv),
                p0(&a.xq),
                p0(&a.xd),
                ne,
                d,
                d,
                ne,
                1,
            ))?;
            self.run(&kernels::rows_finish(
                p0(&a.kv),
                p0(&ls.ring),
                self.w(&lw.attn_kv_a_norm),
                1,
                d,
                rf::NORM | rf::ROPE | rf::E4M3 | rf::STORE_RING,
                pu,
                1,
                raw_cap,
                rope,
                eps,
                1,
            ))?;
            // Compressors (spec §3.7), then the indexer's selection (§3.8).
            let mut n_comp = 0u32;
            let mut sel = NULL;
            if let (Some(cw), Some(st)) = (&lw.compressor, &ls.comp) {
                let c = hp.compress_overlap(l) as u32;
                self.compress(
                    cw,
                    st,
                    ls.comp_cap as u32,
                    c * d,
                    d,
                    ratio,
                    pu,
                    rf::NORM | rf::ROPE | rf::E4M3 | rf::ROUND_F16,
                    rope,
                )?;
                n_comp = ((pu + 1) / ratio).min(ls.comp_cap as u32);
            }
            if let (Some(iwt), Some(st)) = (&lw.indexer, &ls.index) {
                let c = hp.compress_overlap(l) as u32;
                self.compress(
                    &iwt.compressor,
                    st,
                    ls.comp_cap as u32,
                    c * di,
                    di,
                    ratio,
                    pu,
                    rf::NORM | rf::ROPE | rf::HADAMARD_FP4 | rf::ROUND_F16,
                    rope,
                )?;
                if n_comp > hp.idx_top_k as u32 {
                    self.run(&kernels::matvec_f16(
                        p0(&a.qi),
                        self.w(&iwt.q_b),
                        p0(&a.qrn),
                        qr_w,
                        hi * di,
                        qr_w,
                        1,
                    ))?;
                    self.run(&kernels::rows_finish(
                        p0(&a.qi),
                        NULL,
                        NULL,
                        hi,
                        di,
                        rf::ROPE | rf::HADAMARD_FP4,
                        pu,
                        1,
                        1,
                        rope,
                        eps,
                        1,
                    ))?;
                    self.run(&kernels::matvec_f16(
                        p0(&a.iw),
                        self.w(&iwt.proj),
                        p0(&a.xn),
                        ne,
                        hi,
                        ne,
                        1,
                    ))?;
                    let stride = ls.comp_cap as u32;
                    self.run(&kernels::indexer_scores(
                        p0(&a.scores),
                        p0(&a.qi),
                        p0(&a.iw),
                        p0(&st[0]),
                        hi,
                        n_comp,
                        ratio,
                        pu,
                        stride,
                        1.0 / ((di * hi) as f32).sqrt(),
                        1,
                    ))?;
                    if self.probe {
                        let mut sc = self.read_f32(p0(&a.scores), n_comp as usize)?;
                        self.note_margin(&mut sc, hp.idx_top_k, true, false);
                    }
                    self.run(&kernels::indexer_topk(
                        p0(&a.sel),
                        p0(&a.scores),
                        stride,
                        n_comp,
                        ratio,
                        hp.idx_top_k as u32,
                        pu,
                        1,
                    ))?;
                    sel = p0(&a.sel);
                }
            }
            let shape = AttentionShape {
                n_head: h,
                head_dim: d,
                ring_cap: raw_cap,
                window: hp.sliding_window as u32,
                ratio,
                top_k: hp.idx_top_k as u32,
            };
            let comp_rows = ls.comp.as_ref().map_or(NULL, |st| p0(&st[0]));
            let (main, combine) = kernels::attention(
                &shape,
                p0(&a.att),
                p0(&a.att_part),
                p0(&a.q),
                p0(&ls.ring),
                comp_rows,
                sel,
                self.w(&lw.attn_sinks),
                n_comp,
                pu,
                1,
            );
            let (_, splits) = shape.splits(pu, 1, n_comp, sel != NULL);
            if shape.part_floats(1, splits) * 4 > a.att_part.len_bytes() {
                return Err(EngineError::Device(format!(
                    "attention partials for {splits} splits exceed the preallocated buffer (layer {l}, position {p})"
                )));
            }
            self.run(&main)?;
            if let Some(c) = combine {
                self.run(&c)?;
            }
            self.run(&kernels::rows_finish(
                p0(&a.att),
                NULL,
                NULL,
                h,
                d,
                rf::ROPE | rf::ROPE_INVERSE,
                pu,
                1,
                1,
                rope,
                eps,
                1,
            ))?;
            // Grouped output projection (spec §3.4 step 12), HC post.
            self.run(&kernels::quantize_rows(
                QuantOut {
                    q8_0_q: p0(&a.aq),
                    q8_0_d: p0(&a.ad),
                    ..Default::default()
                },
                p0(&a.att),
                d,
                h,
            ))?;
            self.run(&kernels::matvec_q8_0(
                p0(&a.low),
                self.w(&lw.attn_output_a),
                p0(&a.aq),
                p0(&a.ad),
                h * d / g,
                g * or,
                or,
                h * d,
                1,
            ))?;
            self.run(&kernels::quantize_rows(
                QuantOut {
                    q8_0_q: p0(&a.lq),
                    q8_0_d: p0(&a.ld),
                    ..Default::default()
                },
                p0(&a.low),
                g * or,
                1,
            ))?;
            self.run(&kernels::matvec_q8_0(
                p0(&a.y),
                self.w(&lw.attn_output_b),
                p0(&a.lq),
                p0(&a.ld),
                g * or,
                ne,
                ne,
                g * or,
                1,
            ))?;
            self.run(&kernels::hc_post(
                p0(&a.hc),
                p0(&a.hc),
                p0(&a.y),
                NULL,
                p0(&a.split_a),
                ne,
                nhc,
                1,
            ))?;
            // FFN sublayer (spec §3.9).
            self.run(&kernels::hc_pre_fused(
                p0(&a.split_f),
                QuantOut {
                    out: p0(&a.xn),
                    q8_0_q: p0(&a.xq),
                    q8_0_d: p0(&a.xd),
                    q8_k_q: p0(&a.kq),
                    q8_k_d: p0(&a.kd),
                    q8_k_bs: p0(&a.kbs),
                },
                p0(&a.part),
                p0(&a.counter),
                p0(&a.hc),
                self.w(&lw.hc_ffn_fn),
                self.w(&lw.hc_ffn_scale),
                self.w(&lw.hc_ffn_base),
                self.w(&lw.ffn_norm),
                ne,
                nhc,
                n_split,
                iters,
                hc_eps,
                1,
            ))?;
            self.run(&kernels::matvec_f16(
                p0(&a.rl),
                self.w(&lw.ffn_gate_inp),
                p0(&a.xn),
                ne,
                nex,
                ne,
                1,
            ))?;
            self.run(&kernels::router(
                p0(&a.sel_e),
                p0(&a.selw),
                p0(&a.rl),
                lw.exp_probs_b.as_ref().map_or(NULL, |t| self.w(t)),
                lw.ffn_gate_tid2eid.as_ref().map_or(NULL, |t| self.w(t)),
                p0(&a.tokens),
                nex,
                ke,
                hp.expert_weights_scale,
                1,
            ))?;
            if self.probe && lw.ffn_gate_tid2eid.is_none() {
                let rl = self.read_f32(p0(&a.rl), hp.n_expert)?;
                let bias = match &lw.exp_probs_b {
                    Some(t) => self.read_f32(self.w(t), hp.n_expert)?,
                    None => vec![0.0; hp.n_expert],
                };
                let mut sc: Vec<f32> = rl
                    .iter()
                    .zip(&bias)
                    .map(|(&l, &b)| (l.max(0.0) + (-l.abs()).exp().ln_1p()).sqrt() + b)
                    .collect();
                self.note_margin(&mut sc, hp.n_expert_used, false, true);
            }
            let fmt = |t: &crate::model::weights::ExpertTensor| {
                ExpertFormat::from_ggml_type(t.ty().id()).expect("checked in new")
            };
            let clamp = hp.swiglu_clamp[l];
            self.run(&kernels::moe_gate_up(
                fmt(&lw.ffn_gate_exps),
                p0(&a.mid),
                self.w(&lw.ffn_gate_exps.t),
                self.w(&lw.ffn_up_exps.t),
                Q8K {
                    q: p0(&a.kq),
                    d: p0(&a.kd),
                    bsums: p0(&a.kbs),
                },
                p0(&a.sel_e),
                p0(&a.selw),
                ne,
                ff,
                ke,
                clamp,
                1,
            ))?;
            self.run(&kernels::quantize_rows(
                QuantOut {
                    q8_k_q: p0(&a.mq),
                    q8_k_d: p0(&a.md),
                    q8_k_bs: p0(&a.mbs),
                    ..Default::default()
                },
                p0(&a.mid),
                ff,
                ke,
            ))?;
            self.run(&kernels::moe_down(
                fmt(&lw.ffn_down_exps),
                p0(&a.moe),
                self.w(&lw.ffn_down_exps.t),
                Q8K {
                    q: p0(&a.mq),
                    d: p0(&a.md),
                    bsums: p0(&a.mbs),
                },
                p0(&a.sel_e),
                ff,
                ne,
                ke,
                1,
            ))?;
            self.run(&kernels::matvec_q8_0_swiglu(
                p0(&a.smid),
                self.w(&lw.ffn_gate_shexp),
                self.w(&lw.ffn_up_shexp),
                p0(&a.xq),
                p0(&a.xd),
                ne,
                ff,
                clamp,
                1,
            ))?;
            self.run(&kernels::quantize_rows(
                QuantOut {
                    q8_0_q: p0(&a.sq),
                    q8_0_d: p0(&a.sd),
                    ..Default::default()
                },
                p0(&a.smid),
                ff,
                1,
            ))?;
            self.run(&kernels::matvec_q8_0(
                p0(&a.y),
                self.w(&lw.ffn_down_shexp),
                p0(&a.sq),
                p0(&a.sd),
                ff,
                ne,
                ne,
                ff,
                1,
            ))?;
            self.run(&kernels::hc_post(
                p0(&a.hc),
                p0(&a.hc),
                p0(&a.moe),
                p0(&a.y),
                p0(&a.split_f),
                ne,
                nhc,
                1,
            ))?;
        }
        if !want_logits {
            return Ok(());
        }
        // Output head (spec §3.10).
        self.run(&kernels::hc_mix_partial(
            p0(&a.part),
            p0(&a.hc),
            self.w(&mw.output_hc_fn),
            nhc * ne,
            nhc,
            n_split,
            1,
        ))?;
        self.run(&kernels::hc_head_finish(
            p0(&a.yh),
            p0(&a.part),
            p0(&a.hc),
            self.w(&mw.output_hc_scale),
            self.w(&mw.output_hc_base),
            ne,
            nhc,
            n_split,
            eps,
            hp.hc_eps,
            1,
        ))?;
        self.run(&kernels::rms_norm_quant(
            QuantOut {
                q8_0_q: p0(&a.xq),
                q8_0_d: p0(&a.xd),
                ..Default::default()
            },
            p0(&a.yh),
            self.w(&mw.output_norm),
            ne,
            ne,
            1,
            NQ_NORM,
            eps,
        ))?;
        self.run(&kernels::matvec_q8_0(
            p0(&a.logits),
            self.w(&mw.output),
            p0(&a.xq),
            p0(&a.xd),
            ne,
            v,
            v,
            ne,
            1,
        ))
    }

    /// The compressor of one layer (attention rows or indexer rows) for the token at `p`.
    #[allow(clippy::too_many_arguments)]
    fn compress(
        &self,
        cw: &crate::model::weights::CompressorWeights,
        st: &[DeviceBuffer; 3],
        comp_cap: u32,
        width: u32,
        hd: u32,
        ratio: u32,
        p: u32,
        flags: u32,
        rope: RopeParams,
    ) -> Result<(), EngineError> {
        let a = &self.acts;
        let ne = self.model.hp.n_embd as u32;
        self.run(&kernels::matvec_f16_pair(
            a.ckv.ptr().0,
            a.csc.ptr().0,
            self.w(&cw.kv),
            self.w(&cw.gate),
            a.xn.ptr().0,
            ne,
            width,
            ne,
            1,
        ))?;
        self.run(&kernels::compressor_pool(
            st[0].ptr().0,
            st[1].ptr().0,
            st[2].ptr().0,
            a.ckv.ptr().0,
            a.csc.ptr().0,
            self.w(&cw.ape),
            hd,
            ratio,
            p,
            1,
            comp_cap,
        ))?;
        let (first, n) = kernels::compressor_emitted(ratio, p, 1);
        if n > 0 {
            self.run(&kernels::rows_finish(
                st[0].ptr().0 + (first as u64) * (hd as u64) * 4,
                NULL,
                self.w(&cw.norm),
                1,
                hd,
                flags,
                first * ratio,
                ratio,
                1,
                rope,
                self.model.hp.rms_eps,
                n,
            ))?;
        }
        Ok(())
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
        for (i, &tok) in tokens.iter().enumerate() {
            if !progress(i, tokens.len()) {
                return Err(EngineError::Cancelled { done: i });
            }
            self.acts.tokens.copy_from_host(0, &[tok]).map_err(dev)?;
            let last = i + 1 == tokens.len();
            self.decode_step(self.n_past, last)?;
            self.stream.synchronize().map_err(dev)?;
            self.profile.collect();
            self.n_past += 1;
        }
        if !tokens.is_empty() {
            self.acts.logits.copy_to_host(0, &mut self.logits).map_err(dev)?;
        }
        progress(tokens.len(), tokens.len());
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
