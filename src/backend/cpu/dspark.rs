//! DSpark's forward on the CPU (docs/dspark.md#forward), the reference: the conditioning row
//! (`main_proj`, `main_norm`) from the captured target rows, the context-KV rows of the draft
//! window, the block (anchor and noise tokens, and under ds4's convention the context row), three
//! stages (HC pre/post, non-causal attention with sinks over the window and the block, grouped
//! output projection, learned top-k routing with biased selection, shared expert), the HC head, the
//! main model's LM head, the Markov bias and the confidence head.
//!
//! Owns the drafter's weight views, scratch and context-KV rows. Every product, norm, RoPE, HC step,
//! attention and MoE is the main forward's (`ops`, `matvec`, `hc`, `attention`, `moe`). Must not
//! decide how many tokens are proposed (`engine::speculate::dspark`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::backend::BackendError;
use crate::backend::dspark::DsparkForward;
use crate::gguf::GgufFile;
use crate::gguf::dequant::dequantize_into;
use crate::model::dspark::{DsparkConvention, DsparkModel, PassReads, REFERENCE_WINDOW, StageTensors};
use crate::model::weights::ExpertTensor;
use crate::model::{HParams, Model};

use super::attention::{self, Visible};
use super::dspark_capture::Capture;
use super::hc;
use super::matvec::{Mat, matmul, matmul_q8_0_prequant, quantize_rows_q8_0};
use super::moe::{self, MoeScratch};
use super::ops::{self, Rope};
use super::quant::Q8_0Act;
use super::resolved::{HcW, LayerW, Resolved, floats_in};

/// The SwiGLU clamp of the drafter's experts (ds4's shape table for DSpark).
const SWIGLU_CLAMP: f32 = 10.0;
/// Captured rows a session keeps for its drafter: the reference's window and a whole prefill
/// chunk (ds4's window), with room.
pub const CAPTURE_ROWS: usize = 2 * REFERENCE_WINDOW;

/// The last stage's head tensors.
struct HeadTensors {
    hc_fn: Mat,
    hc_base: Vec<f32>,
    hc_scale: Vec<f32>,
    norm: Vec<f32>,
    markov_w1: Mat,
    markov_w2: Mat,
    confidence: Mat,
}

fn stage_weights(f: &GgufFile, st: &StageTensors) -> LayerW {
    let v = |n: &str| floats_in(f, st.get(n));
    let m = |n: &str| Mat::new(st.get(n));
    let x = |n: &str| ExpertTensor { t: st.get(n).clone() };
    let hcw = |p: &str| HcW {
        fn_: m(&format!("hc_{p}_fn.weight")),
        scale: v(&format!("hc_{p}_scale.weight")),
        base: v(&format!("hc_{p}_base.weight")),
    };
    LayerW {
        hc_attn: hcw("attn"),
        attn_norm: v("attn_norm.weight"),
        q_a: m("attn_q_a.weight"),
        q_a_norm: v("attn_q_a_norm.weight"),
        q_b: m("attn_q_b.weight"),
        kv: m("attn_kv.weight"),
        kv_norm: v("attn_kv_a_norm.weight"),
        sinks: v("attn_sinks.weight"),
        out_a: m("attn_output_a.weight"),
        out_b: m("attn_output_b.weight"),
        comp: None,
        indexer: None,
        hc_ffn: hcw("ffn"),
        ffn_norm: v("ffn_norm.weight"),
        router: m("ffn_gate_inp.weight"),
        router_bias: Some(v("exp_probs_b.bias")),
        gate_exps: x("ffn_gate_exps.weight"),
        up_exps: x("ffn_up_exps.weight"),
        down_exps: x("ffn_down_exps.weight"),
        gate_sh: m("ffn_gate_shexp.weight"),
        up_sh: m("ffn_up_shexp.weight"),
        down_sh: m("ffn_down_shexp.weight"),
        tid2eid: None,
        clamp: SWIGLU_CLAMP,
    }
}

/// Per-row buffers of one block, allocated once.
struct DraftScratch {
    hc: Vec<f32>,
    hc_next: Vec<f32>,
    flat: Vec<f32>,
    mix: Vec<f32>,
    pre: Vec<f32>,
    post: Vec<f32>,
    comb: Vec<f32>,
    cur: Vec<f32>,
    xn: Vec<f32>,
    qr: Vec<f32>,
    q: Vec<f32>,
    kv: Vec<f32>,
    keys: Vec<f32>,
    heads: Vec<f32>,
    low: Vec<f32>,
    y: Vec<f32>,
    sh_gate: Vec<f32>,
    sh_up: Vec<f32>,
    moe_out: Vec<f32>,
    scores: Vec<f32>,
    q8: Vec<Q8_0Act>,
    moe: MoeScratch,
    /// The HC head's output per draft row, before (`y_head`) and after (`z`) the final norm.
    y_head: Vec<f32>,
    z: Vec<f32>,
    /// The LM head's logits per draft row, computed when a row's token is first asked for.
    logits: Vec<f32>,
    have_logits: Vec<bool>,
    state: Vec<f32>,
    bias: Vec<f32>,
    features: Vec<f32>,
    one: Vec<f32>,
}

/// DSpark's forward over one CPU session (`DeviceSession::dspark`).
pub struct CpuDspark {
    main: Arc<Model>,
    support: Arc<DsparkModel>,
    pool: Arc<rayon::ThreadPool>,
    capture: Arc<Mutex<Capture>>,
    convention: DsparkConvention,
    stages: Vec<LayerW>,
    main_proj: Mat,
    main_norm: Vec<f32>,
    head: HeadTensors,
    embd: Mat,
    output: Mat,
    rope: Rope,
    /// Context-KV rows (stages × head_dim) by the sequence number of the captured row they come from.
    context_kv: HashMap<u64, Vec<f32>>,
    /// The window of the last block: sequence numbers of its context rows, oldest first.
    window: Vec<u64>,
    /// The conditioning row of the last block's newest context row (ds4's block row 0).
    main_x: Vec<f32>,
    block_ready: bool,
    /// What the last block read (`DsparkForward::reads`): the distinct experts of each stage.
    experts_used: Vec<std::collections::BTreeSet<usize>>,
    markov_rows: usize,
    confidence_rows: usize,
    s: DraftScratch,
}

impl CpuDspark {
    /// The forward of `support` over `main` (the model `capture` records), on `pool`.
    pub fn new(
        main: Arc<Model>,
        support: Arc<DsparkModel>,
        pool: Arc<rayon::ThreadPool>,
        w: &Resolved,
        capture: Arc<Mutex<Capture>>,
        convention: DsparkConvention,
    ) -> CpuDspark {
        let hp = &main.hp;
        let f = &support.file;
        let stages: Vec<LayerW> = support.stages.iter().map(|st| stage_weights(f, st)).collect();
        let first = &support.stages[0];
        let last = support.stages.last().expect("a support file has stages");
        let meta = &support.meta;
        let (e, hcd, b) = (hp.n_embd, hp.hc_dim(), meta.block_size);
        let r = b + 1;
        let low = hp.n_out_group * hp.o_lora_rank;
        let q8w = [
            meta.targets.len() * e,
            e + meta.markov_rank,
            hp.q_dim(),
            low,
            hp.n_ff_exp,
            hp.q_lora_rank,
            e,
        ]
        .into_iter()
        .max()
        .unwrap_or(e);
        let s = DraftScratch {
            hc: vec![0.0; r * hcd],
            hc_next: vec![0.0; r * hcd],
            flat: vec![0.0; r * hcd],
            mix: vec![0.0; r * hp.hc_mix()],
            pre: vec![0.0; r * hp.n_hc],
            post: vec![0.0; r * hp.n_hc],
            comb: vec![0.0; r * hp.n_hc * hp.n_hc],
            cur: vec![0.0; r * e],
            xn: vec![0.0; r * e],
            qr: vec![0.0; r * hp.q_lora_rank],
            q: vec![0.0; r * hp.q_dim()],
            kv: vec![0.0; r * hp.head_dim],
            keys: Vec::new(),
            heads: vec![0.0; r * hp.q_dim()],
            low: vec![0.0; r * low],
            y: vec![0.0; r * e],
            sh_gate: vec![0.0; r * hp.n_ff_exp],
            sh_up: vec![0.0; r * hp.n_ff_exp],
            moe_out: vec![0.0; e],
            scores: Vec::new(),
            q8: (0..r).map(|_| Q8_0Act::with_len(q8w)).collect(),
            moe: MoeScratch::new(hp),
            y_head: vec![0.0; b * e],
            z: vec![0.0; b * e],
            logits: vec![0.0; b * hp.n_vocab],
            have_logits: vec![false; b],
            state: vec![0.0; meta.markov_rank],
            bias: vec![0.0; hp.n_vocab],
            features: vec![0.0; e + meta.markov_rank],
            one: vec![0.0; hp.n_hc.max(1)],
        };
        CpuDspark {
            stages,
            main_proj: Mat::new(first.get("main_proj.weight")),
            main_norm: floats_in(f, first.get("main_norm.weight")),
            head: HeadTensors {
                hc_fn: Mat::new(last.get("hc_head_fn.weight")),
                hc_base: floats_in(f, last.get("hc_head_base.weight")),
                hc_scale: floats_in(f, last.get("hc_head_scale.weight")),
                norm: floats_in(f, last.get("norm.weight")),
                markov_w1: Mat::new(last.get("markov_head.markov_w1.weight")),
                markov_w2: Mat::new(last.get("markov_head.markov_w2.weight")),
                confidence: Mat::new(last.get("confidence_head.proj.weight")),
            },
            embd: w.head.embd,
            output: w.head.output,
            rope: Rope::for_layer(hp, false),
            context_kv: HashMap::new(),
            window: Vec::new(),
            main_x: vec![0.0; e],
            block_ready: false,
            experts_used: vec![Default::default(); support.stages.len()],
            markov_rows: 0,
            confidence_rows: 0,
            s,
            main,
            support,
            pool,
            capture,
            convention,
        }
    }

    fn rows_in_block(&self) -> usize {
        self.support.meta.block_size + usize::from(self.convention == DsparkConvention::Ds4)
    }

    /// `main_x = RMSNorm(main_proj · h) ⊙ main_norm` of a captured row `h` into `out`.
    fn condition(&mut self, h: &[f32], out: &mut [f32]) {
        let hp = &self.main.hp;
        let sf = self.support.file.bytes();
        matmul(
            &self.pool,
            sf,
            &self.main_proj,
            h,
            1,
            &mut self.s.y[..hp.n_embd],
            &mut self.s.q8,
        );
        ops::rms_norm(out, &self.s.y[..hp.n_embd], Some(&self.main_norm), hp.rms_eps);
    }

    /// The context-KV row of every stage for the captured row `h` at position `pos`
    /// (docs/dspark.md#conventions): `kv_norm(wkv(main_x))` under the reference, the stage's HC pre
    /// and `attn_norm` first under ds4's; then RoPE at `pos` and the FP8 round trip of the KV cache.
    fn context_kv_row(&mut self, h: &[f32], pos: usize) -> Vec<f32> {
        let hp = self.main.hp.clone();
        let (e, d) = (hp.n_embd, hp.head_dim);
        let mut main_x = vec![0.0; e];
        self.condition(h, &mut main_x);
        let sf = self.support.file.clone();
        let mut out = vec![0.0; self.stages.len() * d];
        for st in 0..self.stages.len() {
            let input: Vec<f32> = match self.convention {
                DsparkConvention::Reference => main_x.clone(),
                DsparkConvention::Ds4 => {
                    replicate(&mut self.s.hc[..hp.hc_dim()], &main_x, hp.n_hc);
                    hc_pre(&hp, &self.pool, sf.bytes(), &self.stages[st].hc_attn, &mut self.s, 0, 1);
                    let mut xn = vec![0.0; e];
                    ops::rms_norm(&mut xn, &self.s.cur[..e], Some(&self.stages[st].attn_norm), hp.rms_eps);
                    xn
                }
            };
            let lw = &self.stages[st];
            let kv = &mut out[st * d..(st + 1) * d];
            matmul(&self.pool, sf.bytes(), &lw.kv, &input, 1, kv, &mut self.s.q8);
            ops::rms_norm_inplace(kv, Some(&lw.kv_norm), hp.rms_eps);
            self.rope.apply(kv, d, pos, false);
            ops::fp8_kv_round_trip(kv, hp.head_dim_nope());
        }
        out
    }

    /// Choose the window for a block at `pos` and compute the missing context-KV rows; also the
    /// conditioning row of `pos - 1`. False when `pos - 1` was not captured.
    fn prepare_context(&mut self, pos: usize) -> bool {
        let capture = self.capture.clone();
        let cap = capture.lock().unwrap_or_else(|e| e.into_inner());
        let Some(newest) = pos.checked_sub(1).and_then(|p| cap.row(p)) else {
            return false;
        };
        let newest_batch = newest.batch;
        let newest_data = newest.data.clone();
        // Rows back from pos − 1 while they are captured and belong to the window.
        let mut rows: Vec<(usize, u64, &[f32])> = Vec::new();
        for r in cap.rows().rev().skip_while(|r| r.pos >= pos) {
            let inside = match self.convention {
                DsparkConvention::Reference => rows.len() < REFERENCE_WINDOW,
                DsparkConvention::Ds4 => r.batch == newest_batch,
            };
            let consecutive = rows.last().is_none_or(|&(p, _, _)| r.pos + 1 == p);
            if !inside || !consecutive {
                break;
            }
            rows.push((r.pos, r.seq, &r.data));
        }
        rows.reverse();
        self.window.clear();
        for (p, seq, data) in rows {
            if !self.context_kv.contains_key(&seq) {
                let kv = self.context_kv_row(data, p);
                self.context_kv.insert(seq, kv);
            }
            self.window.push(seq);
        }
        // Forget the rows of positions no longer captured (rolled back or rewritten).
        let live: std::collections::HashSet<u64> = cap.rows().map(|r| r.seq).collect();
        self.context_kv.retain(|seq, _| live.contains(seq));
        drop(cap);
        let mut main_x = std::mem::take(&mut self.main_x);
        self.condition(&newest_data, &mut main_x);
        self.main_x = main_x;
        true
    }

    /// One stage over the block rows (`off` = the index of the first draft row).
    fn stage(&mut self, st: usize, positions: &[usize], off: usize) {
        let hp = self.main.hp.clone();
        let (e, d, qd, qrw) = (hp.n_embd, hp.head_dim, hp.q_dim(), hp.q_lora_rank);
        let r = positions.len();
        let nd = r - off;
        let sf = self.support.file.clone();
        let sf = sf.bytes();
        let pool = self.pool.clone();
        let lw = &self.stages[st];
        let s = &mut self.s;
        // (a, b) HC pre and attn_norm of every row.
        hc_pre(&hp, &pool, sf, &lw.hc_attn, s, 0, r);
        ops::rms_norm_rows(&mut s.xn, &s.cur, Some(&lw.attn_norm), hp.rms_eps, e, r);
        // (c) Queries of the draft rows, per-head RMS, RoPE.
        matmul(&pool, sf, &lw.q_a, &s.xn[off * e..r * e], nd, &mut s.qr, &mut s.q8);
        for t in 0..nd {
            ops::rms_norm_inplace(&mut s.qr[t * qrw..(t + 1) * qrw], Some(&lw.q_a_norm), hp.rms_eps);
        }
        matmul(&pool, sf, &lw.q_b, &s.qr, nd, &mut s.q, &mut s.q8);
        for head in s.q[..nd * qd].chunks_exact_mut(d) {
            ops::rms_norm_inplace(head, None, hp.rms_eps);
        }
        for t in 0..nd {
            self.rope
                .apply(&mut s.q[t * qd..(t + 1) * qd], d, positions[off + t], false);
        }
        // (d) KV of every row: the block's keys after the window's.
        matmul(&pool, sf, &lw.kv, &s.xn, r, &mut s.kv, &mut s.q8);
        for (kv, &p) in s.kv[..r * d].chunks_exact_mut(d).zip(positions) {
            ops::rms_norm_inplace(kv, Some(&lw.kv_norm), hp.rms_eps);
            self.rope.apply(kv, d, p, false);
            ops::fp8_kv_round_trip(kv, hp.head_dim_nope());
        }
        s.keys.clear();
        for seq in &self.window {
            s.keys.extend_from_slice(&self.context_kv[seq][st * d..(st + 1) * d]);
        }
        s.keys.extend_from_slice(&s.kv[..r * d]);
        let n_keys = s.keys.len() / d;
        s.scores.resize(hp.n_head * n_keys, 0.0);
        // (e) Non-causal attention with sinks: every draft row sees every key; inverse RoPE.
        let vis = Visible {
            raw: &s.keys,
            comp: &[],
            allowed: None,
        };
        for t in 0..nd {
            let heads = &mut s.heads[t * qd..(t + 1) * qd];
            attention::attend(
                &pool,
                &s.q[t * qd..(t + 1) * qd],
                &vis,
                &lw.sinks,
                d,
                heads,
                &mut s.scores,
            );
            self.rope.apply(heads, d, positions[off + t], true);
        }
        // (f) Grouped output projection, (g) HC post of the draft rows.
        quantize_rows_q8_0(&s.heads, qd, nd, &mut s.q8);
        matmul_q8_0_prequant(&pool, sf, &lw.out_a, &s.q8, hp.o_lora_rank, nd, &mut s.low);
        matmul(&pool, sf, &lw.out_b, &s.low, nd, &mut s.y[off * e..], &mut s.q8);
        hc_post(&hp, s, off, r);
        // (h) FFN of the draft rows: shared expert batched, routed experts row by row.
        hc_pre(&hp, &pool, sf, &lw.hc_ffn, s, off, r);
        let f = hp.n_ff_exp;
        ops::rms_norm_rows(
            &mut s.xn[off * e..],
            &s.cur[off * e..r * e],
            Some(&lw.ffn_norm),
            hp.rms_eps,
            e,
            nd,
        );
        quantize_rows_q8_0(&s.xn[off * e..r * e], e, nd, &mut s.q8);
        matmul_q8_0_prequant(&pool, sf, &lw.gate_sh, &s.q8, 0, nd, &mut s.sh_gate);
        matmul_q8_0_prequant(&pool, sf, &lw.up_sh, &s.q8, 0, nd, &mut s.sh_up);
        for (g, &u) in s.sh_gate[..nd * f].iter_mut().zip(&s.sh_up[..nd * f]) {
            *g = moe::swiglu(*g, u, lw.clamp);
        }
        matmul(&pool, sf, &lw.down_sh, &s.sh_gate, nd, &mut s.y[off * e..], &mut s.q8);
        for t in off..r {
            moe::routed(
                &pool,
                sf,
                &hp,
                lw,
                &s.xn[t * e..(t + 1) * e],
                0,
                &mut s.moe,
                &mut s.moe_out,
            );
            for (y, &m) in s.y[t * e..(t + 1) * e].iter_mut().zip(&s.moe_out) {
                *y += m;
            }
            self.experts_used[st].extend(s.moe.selected.iter().copied());
        }
        hc_post(&hp, s, off, r);
    }

    /// The HC head of the draft rows into `s.y_head` (before the final norm) and `s.z` (after).
    fn head(&mut self, off: usize) {
        let hp = &self.main.hp;
        let (e, hcd, nh) = (hp.n_embd, hp.hc_dim(), hp.n_hc);
        let sf = self.support.file.bytes();
        let b = self.support.meta.block_size;
        let s = &mut self.s;
        let hw = &self.head;
        for j in 0..b {
            let x = &s.hc[(off + j) * hcd..(off + j + 1) * hcd];
            ops::rms_norm(&mut s.flat[..hcd], x, None, hp.rms_eps);
            matmul(&self.pool, sf, &hw.hc_fn, &s.flat[..hcd], 1, &mut s.one, &mut s.q8);
            for h in 0..nh {
                s.one[h] = ops::sigmoid_stable(s.one[h] * hw.hc_scale[0] + hw.hc_base[h]) + hp.hc_eps;
            }
            let y = &mut s.y_head[j * e..(j + 1) * e];
            hc::weighted_sum(y, x, &s.one[..nh], e);
            ops::rms_norm(&mut s.z[j * e..(j + 1) * e], y, Some(&hw.norm), hp.rms_eps);
        }
    }

    /// `markov_w1[prev]` into `s.state`.
    fn markov_state(&mut self, prev: u32) {
        let w1 = &self.head.markov_w1;
        let row = w1.row(self.support.file.bytes(), prev as usize);
        dequantize_into(w1.ty, row, &mut self.s.state).expect("markov_w1's type was checked at load");
    }

    /// The LM-head logits of draft row `row` (main model's `output`). The first row asked for
    /// computes it and every later row of the block in one product, as ds4 does once the first
    /// confidence passed: the head's weights are read once for the block (docs/dspark.md#cost).
    pub fn base_logits(&mut self, row: usize) -> &[f32] {
        let v = self.main.hp.n_vocab;
        let e = self.main.hp.n_embd;
        if !self.s.have_logits[row] {
            let b = self.support.meta.block_size;
            let s = &mut self.s;
            matmul(
                &self.pool,
                self.main.file.bytes(),
                &self.output,
                &s.z[row * e..b * e],
                b - row,
                &mut s.logits[row * v..b * v],
                &mut s.q8,
            );
            s.have_logits[row..b].fill(true);
        }
        &self.s.logits[row * v..(row + 1) * v]
    }

    /// The Markov bias after `prev`: `markov_w2 · markov_w1[prev]` (n_vocab).
    pub fn markov_bias(&mut self, prev: u32) -> &[f32] {
        self.markov_state(prev);
        let s = &mut self.s;
        matmul(
            &self.pool,
            self.support.file.bytes(),
            &self.head.markov_w2,
            &s.state,
            1,
            &mut s.bias,
            &mut s.q8,
        );
        &self.s.bias
    }

    /// The HC head's output of draft row `row`: before the final norm and after it.
    pub fn hidden(&self, row: usize) -> (&[f32], &[f32]) {
        let e = self.main.hp.n_embd;
        (
            &self.s.y_head[row * e..(row + 1) * e],
            &self.s.z[row * e..(row + 1) * e],
        )
    }
}

/// HC pre of block rows `a..b` with `w`: the sublayer input into `s.cur`, post and comb per row.
fn hc_pre(hp: &HParams, pool: &rayon::ThreadPool, file: &[u8], w: &HcW, s: &mut DraftScratch, a: usize, b: usize) {
    let (hcd, nh, mw, e) = (hp.hc_dim(), hp.n_hc, hp.hc_mix(), hp.n_embd);
    let n = b - a;
    ops::rms_norm_rows(&mut s.flat[a * hcd..], &s.hc[a * hcd..b * hcd], None, hp.hc_eps, hcd, n);
    matmul(
        pool,
        file,
        &w.fn_,
        &s.flat[a * hcd..b * hcd],
        n,
        &mut s.mix[a * mw..],
        &mut s.q8,
    );
    for t in a..b {
        hc::split_sinkhorn(
            &s.mix[t * mw..(t + 1) * mw],
            &w.scale,
            &w.base,
            nh,
            hp.sinkhorn_iters,
            hp.hc_eps,
            &mut s.pre[t * nh..(t + 1) * nh],
            &mut s.post[t * nh..(t + 1) * nh],
            &mut s.comb[t * nh * nh..(t + 1) * nh * nh],
        );
        hc::weighted_sum(
            &mut s.cur[t * e..(t + 1) * e],
            &s.hc[t * hcd..(t + 1) * hcd],
            &s.pre[t * nh..(t + 1) * nh],
            e,
        );
    }
}

/// HC post of rows `a..b` from the sublayer output `s.y`.
fn hc_post(hp: &HParams, s: &mut DraftScratch, a: usize, b: usize) {
    let (hcd, nh, e) = (hp.hc_dim(), hp.n_hc, hp.n_embd);
    for t in a..b {
        hc::post(
            &mut s.hc_next[t * hcd..(t + 1) * hcd],
            &s.y[t * e..(t + 1) * e],
            &s.hc[t * hcd..(t + 1) * hcd],
            &s.post[t * nh..(t + 1) * nh],
            &s.comb[t * nh * nh..(t + 1) * nh * nh],
            e,
        );
    }
    s.hc[a * hcd..b * hcd].copy_from_slice(&s.hc_next[a * hcd..b * hcd]);
}

/// `x` (n_embd) copied into every one of `n_hc` streams of `out`.
fn replicate(out: &mut [f32], x: &[f32], n_hc: usize) {
    for h in out.chunks_exact_mut(x.len()).take(n_hc) {
        h.copy_from_slice(x);
    }
}

impl DsparkForward for CpuDspark {
    fn block_size(&self) -> usize {
        self.support.meta.block_size
    }

    fn run_block(&mut self, anchor: u32, pos: usize) -> Result<bool, BackendError> {
        self.block_ready = false;
        let hp = self.main.hp.clone();
        if anchor as usize >= hp.n_vocab {
            return Err(BackendError::Other(format!(
                "token id {anchor} is outside the vocabulary ({})",
                hp.n_vocab
            )));
        }
        if !self.prepare_context(pos) {
            return Ok(false);
        }
        let (e, hcd) = (hp.n_embd, hp.hc_dim());
        let r = self.rows_in_block();
        let off = r - self.support.meta.block_size;
        // Block rows: [context row @pos (ds4)], anchor @pos, noise @pos+1.. (docs/dspark.md#block).
        let mut positions = Vec::with_capacity(r);
        if off == 1 {
            let main_x = std::mem::take(&mut self.main_x);
            replicate(&mut self.s.hc[..hcd], &main_x, hp.n_hc);
            self.main_x = main_x;
            positions.push(pos);
        }
        let file = self.main.file.clone();
        let tab = super::quant::f16_table();
        for j in 0..self.support.meta.block_size {
            let tok = if j == 0 { anchor } else { self.support.meta.noise_token };
            let row = self.embd.row(file.bytes(), tok as usize);
            let dst = &mut self.s.hc[(off + j) * hcd..(off + j + 1) * hcd];
            for d in 0..e {
                dst[d] = tab[u16::from_le_bytes([row[2 * d], row[2 * d + 1]]) as usize];
            }
            let x = dst[..e].to_vec();
            replicate(dst, &x, hp.n_hc);
            positions.push(pos + j);
        }
        for used in &mut self.experts_used {
            used.clear();
        }
        (self.markov_rows, self.confidence_rows) = (0, 0);
        for st in 0..self.stages.len() {
            self.stage(st, &positions, off);
        }
        self.head(off);
        self.s.have_logits.fill(false);
        self.block_ready = true;
        Ok(true)
    }

    fn confidence(&mut self, row: usize, prev: u32) -> f32 {
        assert!(self.block_ready, "DSpark confidence read before a block was run");
        let e = self.main.hp.n_embd;
        self.confidence_rows += 1;
        self.markov_state(prev);
        let (y, z) = self.hidden(row);
        let feat = match self.convention {
            DsparkConvention::Reference => y.to_vec(),
            DsparkConvention::Ds4 => z.to_vec(),
        };
        let s = &mut self.s;
        s.features[..e].copy_from_slice(&feat);
        s.features[e..].copy_from_slice(&s.state);
        let sf = self.support.file.bytes();
        matmul(
            &self.pool,
            sf,
            &self.head.confidence,
            &s.features,
            1,
            &mut s.one[..1],
            &mut s.q8,
        );
        ops::sigmoid_stable(s.one[0])
    }

    fn token(&mut self, row: usize, prev: u32) -> u32 {
        assert!(self.block_ready, "DSpark token read before a block was run");
        self.base_logits(row);
        self.markov_rows += 1;
        self.markov_bias(prev);
        let v = self.main.hp.n_vocab;
        let base = &self.s.logits[row * v..(row + 1) * v];
        let mut best = (0u32, f32::NEG_INFINITY);
        for (i, (&l, &b)) in base.iter().zip(&self.s.bias).enumerate() {
            let x = l + b;
            if x > best.1 {
                best = (i as u32, x);
            }
        }
        best.0
    }

    fn reads(&self) -> PassReads {
        PassReads {
            experts: self.experts_used.iter().map(|u| u.len()).collect(),
            lm_head: self.s.have_logits.iter().any(|&h| h),
            markov_rows: self.markov_rows,
            confidence_rows: self.confidence_rows,
        }
    }

    fn reset(&mut self) {
        self.context_kv.clear();
        self.window.clear();
        self.block_ready = false;
    }
}
