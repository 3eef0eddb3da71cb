//! The forward pass (docs/model.md#forward-pass, #batched-prefill) over a chunk of consecutive tokens,
//! layer-major: per layer the projections run batched for every token of the chunk, then the tokens walk in
//! order through RoPE, the KV quantization simulation, the raw window, compressors, indexer and attention — the
//! decode math with the cache filled so far — then the batched output projection, HC post and FFN.
//! Decode is the same code with a chunk of one token, so prefill and decode agree by construction.
//!
//! Owns the preallocated scratch (no allocation per token) and the chunk driver. Must not know about
//! sessions, checkpoints or progress reporting (`mod.rs`).

use rayon::prelude::*;

use crate::model::hparams::HParams;

use super::attention::{self, Visible};
use super::cache::{self, LayerCache};
use super::compressor::{self, RowKind};
use super::dspark_capture::Capture;
use super::hc;
use super::indexer::{self, IndexerScratch};
use super::matvec::{matmul, matmul_q8_0_prequant, par_rows, quantize_rows_q8_0};
use super::moe::{self, MoeScratch};
use super::ops::{self, Rope};
use super::quant::{Q8_0Act, dot_f16};
use super::resolved::{HcW, Resolved};
use super::undo::{Part, UndoLog};

/// Which next-token logits a chunk computes.
pub enum HeadOut<'a> {
    /// None (a prefill chunk that is not the last).
    None,
    /// After the chunk's last token (n_vocab).
    Last(&'a mut [f32]),
    /// After every token of the chunk (n × n_vocab, token-major): a block verify.
    Every(&'a mut [f32]),
}

/// Everything a chunk of up to `n_max` tokens needs, allocated once.
pub struct Scratch {
    pub n_max: usize,
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
    ckv: Vec<f32>,
    csc: Vec<f32>,
    ikv: Vec<f32>,
    isc: Vec<f32>,
    heads: Vec<f32>,
    low: Vec<f32>,
    y: Vec<f32>,
    sh_gate: Vec<f32>,
    sh_up: Vec<f32>,
    moe_out: Vec<f32>,
    q8: Vec<Q8_0Act>,
    comp_row: Vec<f32>,
    idx_row: Vec<f32>,
    att_scores: Vec<f32>,
    idx: IndexerScratch,
    /// One routed-MoE scratch per chunk token: a prefill runs its tokens' experts in parallel.
    moe: Vec<MoeScratch>,
    head_pre: Vec<f32>,
    head_y: Vec<f32>,
}

impl Scratch {
    pub fn new(hp: &HParams, ctx: usize, n_max: usize) -> Scratch {
        let n = n_max;
        let e = hp.n_embd;
        let hcd = hp.hc_dim();
        let qd = hp.q_dim();
        let comp_cap = cache::max_comp_cap(hp, ctx);
        let rows = cache::raw_cap(hp, ctx) + comp_cap;
        let q8_width = [e, hp.q_lora_rank, qd, hp.n_out_group * hp.o_lora_rank, hp.n_ff_exp]
            .into_iter()
            .max()
            .unwrap_or(0);
        Scratch {
            n_max,
            hc: vec![0.0; n * hcd],
            hc_next: vec![0.0; n * hcd],
            flat: vec![0.0; n * hcd],
            mix: vec![0.0; n * hp.hc_mix()],
            pre: vec![0.0; n * hp.n_hc],
            post: vec![0.0; n * hp.n_hc],
            comb: vec![0.0; n * hp.n_hc * hp.n_hc],
            cur: vec![0.0; n * e],
            xn: vec![0.0; n * e],
            qr: vec![0.0; n * hp.q_lora_rank],
            q: vec![0.0; n * qd],
            kv: vec![0.0; n * hp.head_dim],
            ckv: vec![0.0; n * 2 * hp.head_dim],
            csc: vec![0.0; n * 2 * hp.head_dim],
            ikv: vec![0.0; n * 2 * hp.idx_head_dim],
            isc: vec![0.0; n * 2 * hp.idx_head_dim],
            heads: vec![0.0; n * qd],
            low: vec![0.0; n * hp.n_out_group * hp.o_lora_rank],
            y: vec![0.0; n * e],
            sh_gate: vec![0.0; n * hp.n_ff_exp],
            sh_up: vec![0.0; n * hp.n_ff_exp],
            moe_out: vec![0.0; n * e],
            q8: (0..n).map(|_| Q8_0Act::with_len(q8_width)).collect(),
            comp_row: vec![0.0; hp.head_dim],
            idx_row: vec![0.0; hp.idx_head_dim],
            att_scores: vec![0.0; hp.n_head * rows.max(1)],
            idx: IndexerScratch::new(hp.idx_n_head, hp.idx_head_dim, comp_cap.max(1)),
            moe: (0..n).map(|_| MoeScratch::new(hp)).collect(),
            head_pre: vec![0.0; hp.n_hc],
            head_y: vec![0.0; 2 * e],
        }
    }

    /// The HC state of the chunk's rows after the last layer run (rows × n_hc × n_embd).
    pub fn hc_state(&self) -> &[f32] {
        &self.hc
    }

    pub fn bytes(&self) -> usize {
        let f = self.hc.len() * 3
            + self.mix.len()
            + self.cur.len() * 3
            + self.qr.len()
            + self.q.len() * 2
            + self.kv.len()
            + self.ckv.len() * 2
            + self.ikv.len() * 2
            + self.low.len()
            + self.sh_gate.len() * 2
            + self.att_scores.len();
        f * 4 + self.q8.iter().map(|q| q.qs.len() + 4 * q.scales.len()).sum::<usize>()
    }
}

/// Fixed context of one evaluation: the model bytes, the resolved weights, the pool.
pub struct ForwardPass<'a> {
    pub hp: &'a HParams,
    pub file: &'a [u8],
    pub w: &'a Resolved,
    pub pool: &'a rayon::ThreadPool,
    pub ropes: &'a [Rope],
}

impl ForwardPass<'_> {
    /// Run `tokens` (at positions `p0..`) through every layer, updating `caches`, and write the
    /// logits `out` asks for. With `undo`, every cache write is recorded first (`undo.rs`); with
    /// `capture`, the target layers' outputs are recorded for DSpark (`dspark_capture.rs`).
    #[allow(clippy::too_many_arguments)]
    pub fn forward_chunk(
        &self,
        tokens: &[u32],
        p0: usize,
        caches: &mut [LayerCache],
        s: &mut Scratch,
        out: HeadOut<'_>,
        mut undo: Option<&mut UndoLog>,
        mut capture: Option<&mut Capture>,
    ) {
        let hp = self.hp;
        let n = tokens.len();
        assert!(n >= 1 && n <= s.n_max);
        let e = hp.n_embd;
        let hcd = hp.hc_dim();
        // Embedding, replicated into every HC stream (docs/model.md#forward-pass).
        let embd = &self.w.head.embd;
        for (t, &tok) in tokens.iter().enumerate() {
            let row = embd.row(self.file, tok as usize);
            let dst = &mut s.hc[t * hcd..(t + 1) * hcd];
            let tab = super::quant::f16_table();
            for d in 0..e {
                dst[d] = tab[u16::from_le_bytes([row[2 * d], row[2 * d + 1]]) as usize];
            }
            for h in 1..hp.n_hc {
                dst.copy_within(0..e, h * e);
            }
        }
        for (l, cache) in caches.iter_mut().enumerate() {
            self.attention_layer(l, n, p0, cache, s, undo.as_deref_mut());
            self.ffn_layer(l, tokens, s);
            if let Some(c) = capture.as_deref_mut() {
                c.layer_output(l, &s.hc, n);
            }
        }
        if let Some(c) = capture {
            c.chunk_done(p0, n);
        }
        match out {
            HeadOut::None => {}
            HeadOut::Last(logits) => self.head(n - 1, s, logits),
            HeadOut::Every(logits) => {
                for (t, row) in logits.chunks_exact_mut(hp.n_vocab).take(n).enumerate() {
                    self.head(t, s, row);
                }
            }
        }
    }

    /// HC pre for all tokens: writes the sublayer input to `s.cur` and post/comb per token.
    fn hc_pre(&self, w: &HcW, n: usize, s: &mut Scratch) {
        let hp = self.hp;
        let hcd = hp.hc_dim();
        let nh = hp.n_hc;
        let mw = hp.hc_mix();
        ops::rms_norm_rows(&mut s.flat, &s.hc, None, hp.hc_eps, hcd, n);
        matmul(self.pool, self.file, &w.fn_, &s.flat, n, &mut s.mix, &mut s.q8);
        for t in 0..n {
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
                &mut s.cur[t * hp.n_embd..(t + 1) * hp.n_embd],
                &s.hc[t * hcd..(t + 1) * hcd],
                &s.pre[t * nh..(t + 1) * nh],
                hp.n_embd,
            );
        }
    }

    /// HC post for all tokens from the sublayer output `s.y`, then the new state becomes current.
    fn hc_post(&self, n: usize, s: &mut Scratch) {
        let hp = self.hp;
        let hcd = hp.hc_dim();
        let nh = hp.n_hc;
        let e = hp.n_embd;
        for t in 0..n {
            hc::post(
                &mut s.hc_next[t * hcd..(t + 1) * hcd],
                &s.y[t * e..(t + 1) * e],
                &s.hc[t * hcd..(t + 1) * hcd],
                &s.post[t * nh..(t + 1) * nh],
                &s.comb[t * nh * nh..(t + 1) * nh * nh],
                e,
            );
        }
        std::mem::swap(&mut s.hc, &mut s.hc_next);
    }

    fn attention_layer(
        &self,
        l: usize,
        n: usize,
        p0: usize,
        cache: &mut LayerCache,
        s: &mut Scratch,
        mut undo: Option<&mut UndoLog>,
    ) {
        let hp = self.hp;
        let lw = &self.w.layers[l];
        let (e, d, qr_w, qd) = (hp.n_embd, hp.head_dim, hp.q_lora_rank, hp.q_dim());
        let eps = hp.rms_eps;
        let rope = &self.ropes[l];
        self.hc_pre(&lw.hc_attn, n, s);
        ops::rms_norm_rows(&mut s.xn, &s.cur, Some(&lw.attn_norm), eps, e, n);
        // Batched projections (docs/model.md#query-and-kv-projections).
        matmul(self.pool, self.file, &lw.q_a, &s.xn, n, &mut s.qr, &mut s.q8);
        for t in 0..n {
            ops::rms_norm_inplace(&mut s.qr[t * qr_w..(t + 1) * qr_w], Some(&lw.q_a_norm), eps);
        }
        matmul(self.pool, self.file, &lw.q_b, &s.qr, n, &mut s.q, &mut s.q8);
        for head in s.q[..n * qd].chunks_exact_mut(d) {
            ops::rms_norm_inplace(head, None, eps);
        }
        matmul(self.pool, self.file, &lw.kv, &s.xn, n, &mut s.kv, &mut s.q8);
        for t in 0..n {
            ops::rms_norm_inplace(&mut s.kv[t * d..(t + 1) * d], Some(&lw.kv_norm), eps);
        }
        if let Some(cw) = &lw.comp {
            matmul(self.pool, self.file, &cw.kv, &s.xn, n, &mut s.ckv, &mut s.q8);
            matmul(self.pool, self.file, &cw.gate, &s.xn, n, &mut s.csc, &mut s.q8);
        }
        if let Some(iw) = &lw.indexer {
            matmul(self.pool, self.file, &iw.comp.kv, &s.xn, n, &mut s.ikv, &mut s.q8);
            matmul(self.pool, self.file, &iw.comp.gate, &s.xn, n, &mut s.isc, &mut s.q8);
        }
        // Tokens in order through the cache (steps 5–11).
        let n_nope = hp.head_dim_nope();
        for t in 0..n {
            let pos = p0 + t;
            let q = &mut s.q[t * qd..(t + 1) * qd];
            rope.apply(q, d, pos, false);
            let kv = &mut s.kv[t * d..(t + 1) * d];
            rope.apply(kv, d, pos, false);
            ops::fp8_kv_round_trip(kv, n_nope);
            if let Some(u) = undo.as_deref_mut() {
                u.raw_push(t, l, &cache.raw);
            }
            cache.raw.push(kv);
            if let (Some(cw), Some((rows, st))) = (&lw.comp, cache.comp.as_mut()) {
                let w = st.width();
                if let Some(u) = undo.as_deref_mut() {
                    u.state_push(t, l, Part::Comp, st, pos);
                }
                if st.push(
                    &s.ckv[t * w..(t + 1) * w],
                    &s.csc[t * w..(t + 1) * w],
                    &cw.ape,
                    pos,
                    &mut s.comp_row,
                ) {
                    compressor::finish_row(
                        &mut s.comp_row,
                        &cw.norm,
                        eps,
                        rope,
                        st.ratio,
                        pos,
                        RowKind::Attention { n_nope },
                    );
                    let ok = rows.push(&s.comp_row);
                    assert!(
                        ok,
                        "compressed row capacity exceeded (ctx too small for position {pos})"
                    );
                    if let Some(u) = undo.as_deref_mut() {
                        u.row_push(t, l, Part::Comp);
                    }
                }
            }
            let mut selected = false;
            if let (Some(iw), Some((rows, st))) = (&lw.indexer, cache.index.as_mut()) {
                let w = st.width();
                if let Some(u) = undo.as_deref_mut() {
                    u.state_push(t, l, Part::Index, st, pos);
                }
                if st.push(
                    &s.ikv[t * w..(t + 1) * w],
                    &s.isc[t * w..(t + 1) * w],
                    &iw.comp.ape,
                    pos,
                    &mut s.idx_row,
                ) {
                    compressor::finish_row(
                        &mut s.idx_row,
                        &iw.comp.norm,
                        eps,
                        rope,
                        st.ratio,
                        pos,
                        RowKind::Indexer,
                    );
                    let ok = rows.push(&s.idx_row);
                    assert!(ok, "indexer row capacity exceeded (ctx too small for position {pos})");
                    if let Some(u) = undo.as_deref_mut() {
                        u.row_push(t, l, Part::Index);
                    }
                }
                selected = indexer::select(
                    self.pool,
                    self.file,
                    iw,
                    rope,
                    &s.qr[t * qr_w..(t + 1) * qr_w],
                    &s.xn[t * e..(t + 1) * e],
                    rows.live(),
                    hp.idx_head_dim,
                    hp.idx_top_k,
                    pos,
                    &mut s.idx,
                );
            }
            let comp_rows = cache.comp.as_ref().map(|(r, _)| r.live()).unwrap_or(&[]);
            let n_comp = comp_rows.len() / d;
            let vis = Visible {
                raw: cache.raw.rows.live(),
                comp: comp_rows,
                allowed: selected.then(|| &s.idx.allowed[..n_comp]),
            };
            let heads = &mut s.heads[t * qd..(t + 1) * qd];
            attention::attend(
                self.pool,
                &s.q[t * qd..(t + 1) * qd],
                &vis,
                &lw.sinks,
                d,
                heads,
                &mut s.att_scores,
            );
            rope.apply(heads, d, pos, true);
        }
        // Grouped output projection (step 12): row r of out_a reads group r / O_r of the heads.
        quantize_rows_q8_0(&s.heads, qd, n, &mut s.q8);
        matmul_q8_0_prequant(self.pool, self.file, &lw.out_a, &s.q8, hp.o_lora_rank, n, &mut s.low);
        matmul(self.pool, self.file, &lw.out_b, &s.low, n, &mut s.y, &mut s.q8);
        self.hc_post(n, s);
    }

    fn ffn_layer(&self, l: usize, tokens: &[u32], s: &mut Scratch) {
        let hp = self.hp;
        let lw = &self.w.layers[l];
        let n = tokens.len();
        let (e, f) = (hp.n_embd, hp.n_ff_exp);
        self.hc_pre(&lw.hc_ffn, n, s);
        ops::rms_norm_rows(&mut s.xn, &s.cur, Some(&lw.ffn_norm), hp.rms_eps, e, n);
        // Shared expert, batched; gate and up share one Q8_0 quantization
        // (docs/arithmetic.md#activation-quantization).
        quantize_rows_q8_0(&s.xn, e, n, &mut s.q8);
        matmul_q8_0_prequant(self.pool, self.file, &lw.gate_sh, &s.q8, 0, n, &mut s.sh_gate);
        matmul_q8_0_prequant(self.pool, self.file, &lw.up_sh, &s.q8, 0, n, &mut s.sh_up);
        for (g, &u) in s.sh_gate[..n * f].iter_mut().zip(&s.sh_up[..n * f]) {
            *g = moe::swiglu(*g, u, lw.clamp);
        }
        matmul(self.pool, self.file, &lw.down_sh, &s.sh_gate, n, &mut s.y, &mut s.q8);
        // Routed experts per token (in parallel over the tokens of a prefill, each token's arithmetic
        // unchanged); ffn_out = moe + shared.
        let xn = &s.xn;
        let routed = |t: usize, ms: &mut MoeScratch, out: &mut [f32]| {
            moe::routed(
                self.pool,
                self.file,
                hp,
                lw,
                &xn[t * e..(t + 1) * e],
                tokens[t],
                ms,
                out,
            );
        };
        if n == 1 {
            routed(0, &mut s.moe[0], &mut s.moe_out[..e]);
        } else {
            let (moe, out) = (&mut s.moe[..n], &mut s.moe_out[..n * e]);
            self.pool.install(|| {
                moe.par_iter_mut()
                    .zip(out.par_chunks_mut(e))
                    .enumerate()
                    .for_each(|(t, (ms, o))| routed(t, ms, o));
            });
        }
        for (y, &m) in s.y[..n * e].iter_mut().zip(&s.moe_out[..n * e]) {
            *y += m;
        }
        self.hc_post(n, s);
    }

    /// Output head (docs/model.md#output-head) for the HC state of chunk token `t`.
    fn head(&self, t: usize, s: &mut Scratch, logits: &mut [f32]) {
        let hp = self.hp;
        let hw = &self.w.head;
        let e = hp.n_embd;
        let hcd = hp.hc_dim();
        let x = &s.hc[t * hcd..(t + 1) * hcd];
        ops::rms_norm(&mut s.flat[..hcd], x, None, hp.rms_eps);
        let flat = &s.flat[..hcd];
        par_rows(self.pool, &mut s.head_pre, 1, hw.hc_fn.n_out, |o, _| {
            dot_f16(hw.hc_fn.row(self.file, o), flat)
        });
        for h in 0..hp.n_hc {
            s.head_pre[h] = ops::sigmoid_stable(s.head_pre[h] * hw.hc_scale[0] + hw.hc_base[h]) + hp.hc_eps;
        }
        let (y, yn) = s.head_y.split_at_mut(e);
        hc::weighted_sum(y, x, &s.head_pre, e);
        ops::rms_norm(yn, y, Some(&hw.norm), hp.rms_eps);
        matmul(self.pool, self.file, &hw.output, yn, 1, logits, &mut s.q8);
    }
}

/// The RoPE of every layer (dense or compressed parameters).
pub fn layer_ropes(hp: &HParams) -> Vec<Rope> {
    (0..hp.n_layer).map(|l| Rope::for_layer(hp, hp.ratio(l) != 0)).collect()
}
