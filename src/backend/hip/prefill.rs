//! The device launch sequence for `n` consecutive tokens (kernels/README.md "Forward-pass recipe"),
//! shared by decode (`n == 1`) and the batched prefill (a chunk of up to `Acts::n_max` tokens).
//!
//! A prefill chunk runs one launch sequence per layer (spec §3.11, the semantics of the CPU engine's
//! `forward_chunk`): the wide products as GEMMs that read every weight once per chunk (`gemm_q8_0`,
//! `gemm_q8_0_swiglu`, `gemm_f16`), the routed experts grouped by expert id (`moe_group` →
//! `moe_gemm_gate_up` → `rms_norm_quant` over K_e·n rows → `moe_gemm_down` → `moe_sum`), and the
//! causal parts with the kernels' token-count forms: the chunk's kv rows go into the raw ring
//! before attention (the ring holds window + n_max − 1 rows, spec §4.2), `compressor_pool` walks the
//! chunk in token order, the indexer scores every token of the chunk and `indexer_topk` / `attention`
//! use a token's list only when it sees more than T_k rows. The head runs on the last token only.
//! With `n == 1` the same code issues the decode launches (matvecs, per-token expert kernels), and so
//! does a batch of up to `MATVEC_MAX_TOKENS` tokens (one grid row per token), where a GEMM tile would
//! be mostly empty.
//!
//! Position-dependent values reach the kernels only through the step parameters in device memory
//! (`Acts::step`: the batch's first position, then its token ids), never as launch arguments: the
//! kernels derive the compressed-row counts, the rows a batch emits, whether the indexer selection
//! is active and the attention rows from that position. So the `n == 1` sequence can be captured
//! once into a graph and replayed at every position (`forward.rs`). With a position known to the
//! host (direct launches) the launches that would exit at once are left out and the grids are sized
//! to the batch; while capturing, every launch is issued with the grid the session's largest case
//! needs. Either way the kernels compute the same numbers.
//!
//! Owns the activation buffers (allocated once for the largest chunk) and the launch order; the
//! session state (ring, compressed rows, compressor states) and `eval` live in `forward.rs`.

use std::cell::Cell;

use crate::backend::EngineError;
use crate::backend::cpu::cache::comp_cap;
use crate::model::hparams::HParams;
use crate::model::weights::{CompressorWeights, ExpertTensor, TensorRef};

use super::forward::HipBackend;
use super::kernels::{
    self, AttentionShape, DevPtr, ExpertFormat, ExpertGrouping, ExpertTiles, GEMM_TILE, HcEps, NQ_NORM, NULL, Q8K,
    QuantOut, RopeParams, RoutedExperts,
};
use super::runtime::{DeviceBuffer, HipContext};

use kernels::row_flags as rf;

/// Tokens per prefill chunk. Every non-expert weight is read once per chunk instead of once per
/// token (64-token GEMM tiles), and the routed experts see chunk·K_e token/expert pairs, so larger
/// chunks share more of each expert's weight reads. Measured on the H200 (Flash-shaped q2 file, a
/// 4096-token prompt, column-class expert GEMMs, 2026-11-30 session 3): 512 → 692 t/s (2048-token
/// prompt), 1024 → 812 t/s, 2048 → 909 t/s. 1024 rather than 2048 because the chunk is also the
/// cancel and progress granularity: 1.3 s on the H200, several times that on a Strix Halo iGPU.
/// `DS4_HIP_PREFILL_CHUNK` overrides it (for tuning; 1 = decode steps only).
pub const PREFILL_CHUNK: usize = 1024;

/// Environment variable overriding [`PREFILL_CHUNK`].
pub const PREFILL_CHUNK_ENV: &str = "DS4_HIP_PREFILL_CHUNK";

/// The chunk size to allocate for a session of `ctx` tokens: `DS4_HIP_PREFILL_CHUNK` when set to a
/// positive integer, else [`PREFILL_CHUNK`]; never more than ctx.
pub fn prefill_chunk(ctx: usize) -> Result<usize, String> {
    let n = match std::env::var(PREFILL_CHUNK_ENV) {
        Ok(s) => match s.trim().parse::<usize>() {
            Ok(n) if n > 0 => n,
            _ => return Err(format!("{PREFILL_CHUNK_ENV}={s}: expected a positive token count")),
        },
        Err(_) => PREFILL_CHUNK,
    };
    Ok(n.min(ctx.max(1)))
}

/// Batches of at most this many tokens run the decode kernels with one grid row per token (matvecs,
/// per-token experts) instead of the tiled GEMMs and grouped experts: a short prompt or a chat turn's
/// few template tokens leave GEMM tiles mostly empty and few blocks on the device. Measured on the
/// H200 (Flash-shaped q2 file, prefill t/s of batches of n tokens, token-wise vs GEMMs, session 3):
/// n = 8: 219 vs 37, 16: 250 vs 65, 32: 268 vs 112, 64: 278 vs 189, 128: 282 vs 322.
/// `DS4_HIP_MATVEC_TOKENS` overrides it (1 = the GEMMs for every n > 1).
pub const MATVEC_MAX_TOKENS: usize = 64;

/// Environment variable overriding [`MATVEC_MAX_TOKENS`].
pub const MATVEC_TOKENS_ENV: &str = "DS4_HIP_MATVEC_TOKENS";

/// [`MATVEC_MAX_TOKENS`], or `DS4_HIP_MATVEC_TOKENS` when set to a count (never below 1: a single
/// token always takes the decode kernels).
pub fn matvec_max_tokens() -> Result<usize, String> {
    match std::env::var(MATVEC_TOKENS_ENV) {
        Ok(s) => match s.trim().parse::<usize>() {
            Ok(n) => Ok(n.max(1)),
            _ => Err(format!("{MATVEC_TOKENS_ENV}={s}: expected a token count")),
        },
        Err(_) => Ok(MATVEC_MAX_TOKENS),
    }
}

/// Words of step parameters before the token ids in `Acts::step`: word 0 is the position of the
/// batch's first token (the rest is padding that keeps the ids 16-byte aligned).
pub(super) const STEP_TOKENS: usize = 4;

/// Raw-ring rows for chunks of up to `n_max` tokens: a chunk stores all its kv rows before its
/// attention, and its first token still needs the window - 1 rows before it (spec §4.2).
pub fn ring_rows(hp: &HParams, n_max: usize) -> usize {
    hp.sliding_window.max(1) + n_max - 1
}

/// Activations of up to `n_max` tokens, planar per token (kernels/README.md layouts), allocated once.
/// Generic over the buffer so the same size plan gives device buffers (`Acts`) and byte counts
/// (`activation_bytes`, no device needed).
pub(super) struct ActsOf<B> {
    pub(super) n_max: usize,
    /// Kernel launches issued through `HipBackend::launch`, and those a decode-graph replay runs
    /// (diagnostics).
    pub(super) launches: Cell<u64>,
    /// Step parameters: u32 [STEP_TOKENS] (the batch's first position), then the batch's token ids.
    pub(super) step: B,
    hc: B,
    split_a: B,
    split_f: B,
    /// HC mix values, [n][2 n_hc + n_hc²].
    mix: B,
    pub(super) counter: B,
    xn: B,
    xq: B,
    xd: B,
    kq: B,
    kd: B,
    kbs: B,
    qr: B,
    qrn: B,
    qq: B,
    qd: B,
    q: B,
    kv: B,
    ckv: B,
    csc: B,
    qi: B,
    iw: B,
    scores: B,
    sel: B,
    att: B,
    /// Attention scores then weights, [n][n_head][most visible rows], and 1/denominator per head.
    att_sc: B,
    att_inv: B,
    aq: B,
    ad: B,
    low: B,
    lq: B,
    ld: B,
    y: B,
    rl: B,
    sel_e: B,
    selw: B,
    mid: B,
    mq: B,
    md: B,
    mbs: B,
    moe: B,
    /// Expert grouping of a chunk (`moe_group`): pair ids, tiles, tile count; per-pair down outputs.
    pairs: B,
    tiles: B,
    n_tiles: B,
    outp: B,
    smid: B,
    sq: B,
    sd: B,
    yh: B,
    pub(super) logits: B,
    /// Device sampling result: u32 [kernels::SAMPLE_OUT_WORDS].
    pub(super) sampled: B,
}

/// The activation buffers on the device.
pub(super) type Acts = ActsOf<DeviceBuffer>;

impl<B> ActsOf<B> {
    /// The buffers for chunks of up to `n_max` tokens of a session of `ctx` tokens; `alloc` makes
    /// a buffer of the given bytes.
    fn build(
        hp: &HParams,
        n_max: usize,
        ctx: usize,
        alloc: &mut dyn FnMut(usize) -> Result<B, String>,
    ) -> Result<ActsOf<B>, String> {
        fn f32s<B>(alloc: &mut dyn FnMut(usize) -> Result<B, String>, k: usize) -> Result<B, String> {
            alloc(4 * k.max(1))
        }
        fn bytes<B>(alloc: &mut dyn FnMut(usize) -> Result<B, String>, k: usize) -> Result<B, String> {
            alloc(k.max(1))
        }
        let n = n_max.max(1);
        let (ne, d, di) = (hp.n_embd, hp.head_dim, hp.idx_head_dim);
        let n_mix = hp.hc_mix();
        let qdim = hp.q_dim();
        let low = hp.n_out_group * hp.o_lora_rank;
        let ke_f = hp.n_expert_used * hp.n_ff_exp;
        let ke = hp.n_expert_used;
        let max_tiles = kernels::moe_max_tiles(n as u32, ke as u32, hp.n_expert as u32) as usize;
        let att_sc = attention_score_floats(hp, n, ctx);
        // Indexer scores: one row of the layer's compressed-row capacity per token.
        let max_comp_cap = (0..hp.n_layer)
            .filter(|&l| hp.has_indexer(l))
            .map(|l| comp_cap(ctx, hp.ratio(l) as usize))
            .max()
            .unwrap_or(1);
        // Only a chunk (n > 1) uses the grouped-expert buffers.
        let chunk = |k: usize| if n > 1 { k } else { 1 };
        Ok(ActsOf {
            n_max: n,
            launches: Cell::new(0),
            step: bytes(alloc, 4 * (STEP_TOKENS + n))?,
            hc: f32s(alloc, n * hp.hc_dim())?,
            split_a: f32s(alloc, n * n_mix)?,
            split_f: f32s(alloc, n * n_mix)?,
            mix: f32s(alloc, n * n_mix)?,
            // Zeroed by HipBackend::clear_state before the first launch.
            counter: bytes(alloc, 4 * n)?,
            xn: f32s(alloc, n * ne)?,
            xq: bytes(alloc, n * ne)?,
            xd: f32s(alloc, n * ne / 32)?,
            kq: bytes(alloc, n * ne)?,
            kd: f32s(alloc, n * ne / 256)?,
            kbs: bytes(alloc, 2 * (n * ne / 16))?,
            qr: f32s(alloc, n * hp.q_lora_rank)?,
            qrn: f32s(alloc, n * hp.q_lora_rank)?,
            qq: bytes(alloc, n * hp.q_lora_rank)?,
            qd: f32s(alloc, n * hp.q_lora_rank / 32)?,
            q: f32s(alloc, n * qdim)?,
            kv: f32s(alloc, n * d)?,
            ckv: f32s(alloc, n * 2 * d.max(di))?,
            csc: f32s(alloc, n * 2 * d.max(di))?,
            qi: f32s(alloc, n * hp.idx_n_head * di)?,
            iw: f32s(alloc, n * hp.idx_n_head)?,
            scores: f32s(alloc, n * max_comp_cap)?,
            sel: bytes(alloc, 4 * n * hp.idx_top_k)?,
            att: f32s(alloc, n * qdim)?,
            att_sc: f32s(alloc, att_sc)?,
            att_inv: f32s(alloc, n * hp.n_head)?,
            aq: bytes(alloc, n * qdim)?,
            ad: f32s(alloc, n * qdim / 32)?,
            low: f32s(alloc, n * low)?,
            lq: bytes(alloc, n * low)?,
            ld: f32s(alloc, n * low / 32)?,
            y: f32s(alloc, n * ne)?,
            rl: f32s(alloc, n * hp.n_expert)?,
            sel_e: bytes(alloc, 4 * n * ke)?,
            selw: f32s(alloc, n * ke)?,
            mid: f32s(alloc, n * ke_f)?,
            mq: bytes(alloc, n * ke_f)?,
            md: f32s(alloc, n * ke_f / 256)?,
            mbs: bytes(alloc, 2 * (n * ke_f / 16))?,
            moe: f32s(alloc, n * ne)?,
            pairs: bytes(alloc, chunk(4 * n * ke))?,
            tiles: bytes(alloc, chunk(4 * kernels::MOE_TILE_WORDS as usize * max_tiles))?,
            n_tiles: bytes(alloc, 4)?,
            outp: f32s(alloc, chunk(n * ke * ne))?,
            smid: f32s(alloc, n * hp.n_ff_exp)?,
            sq: bytes(alloc, n * hp.n_ff_exp)?,
            sd: f32s(alloc, n * hp.n_ff_exp / 32)?,
            yh: f32s(alloc, ne)?,
            logits: f32s(alloc, hp.n_vocab)?,
            sampled: bytes(alloc, 4 * kernels::SAMPLE_OUT_WORDS)?,
        })
    }

    /// Every buffer.
    fn buffers(&self) -> [&B; 51] {
        [
            &self.step,
            &self.hc,
            &self.split_a,
            &self.split_f,
            &self.mix,
            &self.counter,
            &self.xn,
            &self.xq,
            &self.xd,
            &self.kq,
            &self.kd,
            &self.kbs,
            &self.qr,
            &self.qrn,
            &self.qq,
            &self.qd,
            &self.q,
            &self.kv,
            &self.ckv,
            &self.csc,
            &self.qi,
            &self.iw,
            &self.scores,
            &self.sel,
            &self.att,
            &self.att_sc,
            &self.att_inv,
            &self.aq,
            &self.ad,
            &self.low,
            &self.lq,
            &self.ld,
            &self.y,
            &self.rl,
            &self.sel_e,
            &self.selw,
            &self.mid,
            &self.mq,
            &self.md,
            &self.mbs,
            &self.moe,
            &self.pairs,
            &self.tiles,
            &self.n_tiles,
            &self.outp,
            &self.smid,
            &self.sq,
            &self.sd,
            &self.yh,
            &self.logits,
            &self.sampled,
        ]
    }
}

impl Acts {
    /// Device address of the step parameters' position word.
    pub(super) fn pos_ptr(&self) -> DevPtr {
        self.step.ptr().0
    }

    /// Device address of the batch's token ids.
    pub(super) fn token_ids(&self) -> DevPtr {
        self.step.ptr().0 + 4 * STEP_TOKENS as u64
    }

    /// Device buffers (see [`ActsOf::build`]).
    pub(super) fn new(hip: &HipContext, hp: &HParams, n_max: usize, ctx: usize) -> Result<Acts, String> {
        Acts::build(hp, n_max, ctx, &mut |b| hip.alloc(b).map_err(|e| e.to_string()))
    }

    /// Device bytes of every activation buffer.
    pub(super) fn len_bytes(&self) -> u64 {
        self.buffers().iter().map(|b| b.len_bytes() as u64).sum()
    }
}

/// Device bytes of the activations for chunks of up to `n_max` tokens (the plan of `Acts::new`).
pub fn activation_bytes(hp: &HParams, n_max: usize, ctx: usize) -> u64 {
    let plan = ActsOf::<usize>::build(hp, n_max, ctx, &mut |b| Ok(b)).expect("sizes only");
    plan.buffers().iter().map(|&&b| b as u64).sum()
}

/// Floats of the attention score buffer for batches of 1..=n_max tokens in a session of `ctx`
/// tokens: n_max tokens x n_head heads x the most rows any token sees in any layer
/// ([`max_visible_rows`]: the window plus all compressed rows, or at most top_k with an indexer).
fn attention_score_floats(hp: &HParams, n_max: usize, ctx: usize) -> usize {
    let rows = (0..hp.n_layer)
        .map(|l| {
            let cap = if hp.ratio(l) == 0 {
                0
            } else {
                comp_cap(ctx, hp.ratio(l) as usize)
            };
            max_visible_rows(hp, l, cap)
        })
        .max()
        .unwrap_or(1);
    n_max * hp.n_head * rows.max(1)
}

fn expert_format(t: &ExpertTensor) -> ExpertFormat {
    ExpertFormat::from_ggml_type(t.ty().id()).expect("expert types are checked in HipBackend::new")
}

fn p0(b: &DeviceBuffer) -> DevPtr {
    b.ptr().0
}

impl HipBackend {
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
    ) -> Result<(), EngineError> {
        let hp = &self.model.hp;
        let a = &self.acts;
        assert!(
            n >= 1 && n <= a.n_max,
            "forward_tokens: {n} tokens, buffers for {}",
            a.n_max
        );
        if self.probe {
            assert!(
                host_pos.is_some(),
                "the selection probe reads back scores: direct launches only"
            );
            self.margins.set((f32::INFINITY, f32::INFINITY));
        }
        let mw = &self.model.w;
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
        }
        if want_logits { self.head(n - 1) } else { Ok(()) }
    }

    /// Every launch of the sequence goes through here (counted for `launch_count`).
    fn launch(&self, l: &kernels::Launch) -> Result<(), EngineError> {
        self.acts.launches.set(self.acts.launches.get() + 1);
        self.run(l)
    }

    /// Kernel launches run by `forward_tokens` and `head` since the backend was made (directly or
    /// by replays of the decode graph; device sampling not counted).
    pub fn launch_count(&self) -> u64 {
        self.acts.launches.get()
    }

    /// Q8_0 planes (codes `q`, scales `d`) of `rows` rows of `n` floats at `x`: the activation
    /// quantization before a Q8_0 projection (spec §2.3).
    fn quantize_q8_0(&self, q: DevPtr, d: DevPtr, x: DevPtr, n: u32, rows: u32) -> Result<(), EngineError> {
        self.launch(&kernels::quantize_rows(
            QuantOut {
                q8_0_q: q,
                q8_0_d: d,
                ..Default::default()
            },
            x,
            n,
            rows,
        ))
    }

    /// `ds4_rows_finish` in place on the `n_head` rows of `head_dim` floats of every batch token at `x`
    /// (query heads, indexer queries, attention output: no ring store, no norm weight).
    #[allow(clippy::too_many_arguments)]
    fn head_rows_in_place(
        &self,
        x: DevPtr,
        pos: DevPtr,
        n_head: u32,
        head_dim: u32,
        flags: u32,
        rope: RopeParams,
        nt: u32,
    ) -> Result<(), EngineError> {
        let eps = self.model.hp.rms_eps;
        self.launch(&kernels::rows_finish(
            x, NULL, NULL, pos, n_head, head_dim, flags, 1, rope, eps, nt,
        ))
    }

    /// Whether a batch of `n` tokens runs the decode kernels token by token ([`MATVEC_MAX_TOKENS`]).
    fn token_wise<N: Into<u64>>(&self, n: N) -> bool {
        n.into() <= self.matvec_tokens as u64
    }

    /// Device bytes of the activation buffers (sized for the largest prefill chunk).
    pub fn activation_bytes(&self) -> u64 {
        self.acts.len_bytes()
    }

    /// HC pre of a sublayer and its input norm (spec §3.2, §3.4 step 2 / §3.9 step 2), fused: the
    /// split goes to `split`, the normed input to `xn` and its Q8_0 planes (plus Q8_K for the FFN's
    /// routed experts when `q8_k`). `w` = [hc fn, hc scale, hc base, norm weight] of the sublayer.
    fn hc_pre(&self, split: DevPtr, q8_k: bool, w: [&TensorRef; 4], nt: u32) -> Result<(), EngineError> {
        let hp = &self.model.hp;
        let a = &self.acts;
        let p0 = |b: &DeviceBuffer| b.ptr().0;
        let (ne, nhc) = (hp.n_embd as u32, hp.n_hc as u32);
        let mut quant = QuantOut {
            out: p0(&a.xn),
            q8_0_q: p0(&a.xq),
            q8_0_d: p0(&a.xd),
            ..Default::default()
        };
        if q8_k {
            (quant.q8_k_q, quant.q8_k_d, quant.q8_k_bs) = (p0(&a.kq), p0(&a.kd), p0(&a.kbs));
        }
        self.launch(&kernels::hc_pre_fused(
            split,
            quant,
            p0(&a.mix),
            p0(&a.counter),
            p0(&a.hc),
            self.w(w[0]),
            self.w(w[1]),
            self.w(w[2]),
            self.w(w[3]),
            ne,
            nhc,
            hp.sinkhorn_iters as u32,
            self.hc_eps(),
            nt,
        ))
    }

    fn hc_eps(&self) -> HcEps {
        let hp = &self.model.hp;
        HcEps {
            rms: hp.hc_eps,
            hc: hp.hc_eps,
            norm: hp.rms_eps,
        }
    }

    /// y[t] = W · x_t for Q8_0 weights and Q8_0 activations: a matvec for one token, the tiled GEMM
    /// for a chunk (when the group size fits its 64-row tiles).
    #[allow(clippy::too_many_arguments)]
    fn proj_q8_0(
        &self,
        y: DevPtr,
        w: DevPtr,
        xq: DevPtr,
        xd: DevPtr,
        n_in: u32,
        n_out: u32,
        rows_per_group: u32,
        x_stride: u32,
        n: u32,
    ) -> Result<(), EngineError> {
        let product = if self.token_wise(n) || !rows_per_group.is_multiple_of(GEMM_TILE) {
            kernels::matvec_q8_0
        } else {
            kernels::gemm_q8_0
        };
        self.launch(&product(y, w, xq, xd, n_in, n_out, rows_per_group, x_stride, n))
    }

    /// y[t] = W · x_t for F16 weights and f32 activations (matvec for one token, GEMM for a chunk).
    #[allow(clippy::too_many_arguments)]
    fn proj_f16(
        &self,
        y: DevPtr,
        w: DevPtr,
        x: DevPtr,
        n_in: u32,
        n_out: u32,
        x_stride: u32,
        n: u32,
    ) -> Result<(), EngineError> {
        let product = if self.token_wise(n) {
            kernels::matvec_f16
        } else {
            kernels::gemm_f16
        };
        self.launch(&product(y, w, x, n_in, n_out, x_stride, n))
    }

    /// The attention sublayer of layer `l` for the `n` tokens at pos0.. (spec §3.4); `host_pos`:
    /// pos0 when the host knows it (see `forward_tokens`).
    fn attention_sublayer(&self, l: usize, n: usize, host_pos: Option<u32>) -> Result<(), EngineError> {
        let hp = &self.model.hp;
        let a = &self.acts;
        let lw = &self.model.w.layers[l];
        let ls = &self.layers[l];
        let rope = self.ropes[l];
        let ratio = hp.ratio(l);
        let nt = n as u32;
        let (ne, d, di) = (hp.n_embd as u32, hp.head_dim as u32, hp.idx_head_dim as u32);
        let nhc = hp.n_hc as u32;
        let (qr_w, h, hi) = (hp.q_lora_rank as u32, hp.n_head as u32, hp.idx_n_head as u32);
        let (g, or) = (hp.n_out_group as u32, hp.o_lora_rank as u32);
        let eps = hp.rms_eps;
        let pos = a.pos_ptr();
        let raw_cap = ring_rows(hp, a.n_max) as u32;
        let comp_cap = ls.comp_cap as u32;
        let top_k = hp.idx_top_k as u32;
        self.hc_pre(
            p0(&a.split_a),
            false,
            [&lw.hc_attn_fn, &lw.hc_attn_scale, &lw.hc_attn_base, &lw.attn_norm],
            nt,
        )?;
        // Query (steps 3, 5).
        self.proj_q8_0(
            p0(&a.qr),
            self.w(&lw.attn_q_a),
            p0(&a.xq),
            p0(&a.xd),
            ne,
            qr_w,
            qr_w,
            ne,
            nt,
        )?;
        self.launch(&kernels::rms_norm_quant(
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
            nt,
            NQ_NORM,
            eps,
        ))?;
        self.proj_q8_0(
            p0(&a.q),
            self.w(&lw.attn_q_b),
            p0(&a.qq),
            p0(&a.qd),
            qr_w,
            h * d,
            h * d,
            qr_w,
            nt,
        )?;
        self.head_rows_in_place(p0(&a.q), pos, h, d, rf::NORM | rf::ROPE, rope, nt)?;
        // KV (steps 4-7): every token's row enters the ring before the attention of the batch.
        self.proj_q8_0(p0(&a.kv), self.w(&lw.attn_kv), p0(&a.xq), p0(&a.xd), ne, d, d, ne, nt)?;
        self.launch(&kernels::rows_finish(
            p0(&a.kv),
            p0(&ls.ring),
            self.w(&lw.attn_kv_a_norm),
            pos,
            1,
            d,
            rf::NORM | rf::ROPE | rf::E4M3 | rf::STORE_RING,
            raw_cap,
            rope,
            eps,
            nt,
        ))?;
        // Compressors (spec §3.7), then the indexer's selection (§3.8). The kernels bound each
        // token's compressed rows by its own floor((p + 1) / ratio) and the capacity; the host's
        // n_comp (rows emitted up to the batch's last token, when it knows the position) only
        // decides what may be left out.
        let n_comp = host_pos.map(|p| ((p + nt).checked_div(ratio).unwrap_or(0)).min(comp_cap));
        let mut sel = NULL;
        if let (Some(cw), Some(st)) = (&lw.compressor, &ls.comp) {
            let c = hp.compress_overlap(l) as u32;
            let flags = rf::NORM | rf::ROPE | rf::E4M3 | rf::ROUND_F16;
            self.compress(cw, st, comp_cap, c * d, d, ratio, nt, flags, rope, host_pos)?;
        }
        if let (Some(iwt), Some(st)) = (&lw.indexer, &ls.index) {
            let c = hp.compress_overlap(l) as u32;
            let flags = rf::NORM | rf::ROPE | rf::HADAMARD_FP4 | rf::ROUND_F16;
            self.compress(
                &iwt.compressor,
                st,
                comp_cap,
                c * di,
                di,
                ratio,
                nt,
                flags,
                rope,
                host_pos,
            )?;
            // The selection is used once a token sees more than top_k rows (both kernels skip the
            // other tokens).
            if n_comp.is_none_or(|c| c > top_k) {
                self.proj_f16(p0(&a.qi), self.w(&iwt.q_b), p0(&a.qrn), qr_w, hi * di, qr_w, nt)?;
                self.head_rows_in_place(p0(&a.qi), pos, hi, di, rf::ROPE | rf::HADAMARD_FP4, rope, nt)?;
                self.proj_f16(p0(&a.iw), self.w(&iwt.proj), p0(&a.xn), ne, hi, ne, nt)?;
                let stride = comp_cap;
                self.launch(&kernels::indexer_scores(
                    p0(&a.scores),
                    p0(&a.qi),
                    p0(&a.iw),
                    p0(&st[0]),
                    pos,
                    hi,
                    comp_cap,
                    ratio,
                    top_k,
                    stride,
                    1.0 / ((di * hi) as f32).sqrt(),
                    n_comp.unwrap_or(comp_cap),
                    nt,
                ))?;
                if self.probe && n == 1 {
                    let rows = n_comp.expect("the probe runs with direct launches") as usize;
                    let mut sc = self.read_f32(p0(&a.scores), rows)?;
                    self.note_margin(&mut sc, hp.idx_top_k, true, false);
                }
                self.launch(&kernels::indexer_topk(
                    p0(&a.sel),
                    p0(&a.scores),
                    pos,
                    stride,
                    comp_cap,
                    ratio,
                    top_k,
                    nt,
                ))?;
                sel = p0(&a.sel);
            }
        }
        // Attention (steps 10-11): scores, softmax, weighted values. The score grid and stride are
        // the rows of this batch's last token when the host knows the position, else the most any
        // position of the session sees (a captured decode step).
        let shape = AttentionShape {
            n_head: h,
            head_dim: d,
            ring_cap: raw_cap,
            window: hp.sliding_window as u32,
            ratio,
            top_k,
        };
        let max_rows = match (host_pos, n_comp) {
            (Some(p), Some(c)) => shape.visible_rows(p + nt - 1, c, sel != NULL),
            _ => max_visible_rows(hp, l, ls.comp_cap) as u32,
        };
        if shape.score_floats(nt, max_rows) * 4 > a.att_sc.len_bytes() {
            return Err(EngineError::Device(format!(
                "attention scores of {n} tokens over {max_rows} rows exceed the preallocated buffer (layer {l}, position {host_pos:?})"
            )));
        }
        let comp_rows = ls.comp.as_ref().map_or(NULL, |st| p0(&st[0]));
        for launch in kernels::attention(
            &shape,
            p0(&a.att),
            p0(&a.att_sc),
            p0(&a.att_inv),
            p0(&a.q),
            p0(&ls.ring),
            comp_rows,
            sel,
            self.w(&lw.attn_sinks),
            pos,
            comp_cap,
            max_rows,
            nt,
        ) {
            self.launch(&launch)?;
        }
        self.head_rows_in_place(p0(&a.att), pos, h, d, rf::ROPE | rf::ROPE_INVERSE, rope, nt)?;
        // Grouped output projection (step 12): the H heads of every token as H rows of D.
        self.quantize_q8_0(p0(&a.aq), p0(&a.ad), p0(&a.att), d, h * nt)?;
        self.proj_q8_0(
            p0(&a.low),
            self.w(&lw.attn_output_a),
            p0(&a.aq),
            p0(&a.ad),
            h * d / g,
            g * or,
            or,
            h * d,
            nt,
        )?;
        self.quantize_q8_0(p0(&a.lq), p0(&a.ld), p0(&a.low), g * or, nt)?;
        self.proj_q8_0(
            p0(&a.y),
            self.w(&lw.attn_output_b),
            p0(&a.lq),
            p0(&a.ld),
            g * or,
            ne,
            ne,
            g * or,
            nt,
        )?;
        self.launch(&kernels::hc_post(
            p0(&a.hc),
            p0(&a.hc),
            p0(&a.y),
            NULL,
            p0(&a.split_a),
            ne,
            nhc,
            nt,
        ))
    }

    /// The FFN sublayer of layer `l` for `n` tokens (spec §3.9).
    fn ffn_sublayer(&self, l: usize, n: usize) -> Result<(), EngineError> {
        let hp = &self.model.hp;
        let a = &self.acts;
        let lw = &self.model.w.layers[l];
        let nt = n as u32;
        let ne = hp.n_embd as u32;
        let nhc = hp.n_hc as u32;
        let (ff, ke, nex) = (hp.n_ff_exp as u32, hp.n_expert_used as u32, hp.n_expert as u32);
        let clamp = hp.swiglu_clamp[l];
        self.hc_pre(
            p0(&a.split_f),
            true,
            [&lw.hc_ffn_fn, &lw.hc_ffn_scale, &lw.hc_ffn_base, &lw.ffn_norm],
            nt,
        )?;
        // Router (steps 3-4).
        self.proj_f16(p0(&a.rl), self.w(&lw.ffn_gate_inp), p0(&a.xn), ne, nex, ne, nt)?;
        self.launch(&kernels::router(
            p0(&a.sel_e),
            p0(&a.selw),
            p0(&a.rl),
            lw.exp_probs_b.as_ref().map_or(NULL, |t| self.w(t)),
            lw.ffn_gate_tid2eid.as_ref().map_or(NULL, |t| self.w(t)),
            a.token_ids(),
            nex,
            ke,
            hp.expert_weights_scale,
            nt,
        ))?;
        if self.probe && n == 1 && lw.ffn_gate_tid2eid.is_none() {
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
        // Routed experts (step 5): per token for a decode step or a small batch, grouped by expert for a chunk.
        let experts = RoutedExperts {
            fmt_gate_up: expert_format(&lw.ffn_gate_exps),
            fmt_down: expert_format(&lw.ffn_down_exps),
            gate: self.w(&lw.ffn_gate_exps.t),
            up: self.w(&lw.ffn_up_exps.t),
            down: self.w(&lw.ffn_down_exps.t),
            x: Q8K {
                q: p0(&a.kq),
                d: p0(&a.kd),
                bsums: p0(&a.kbs),
            },
            sel: p0(&a.sel_e),
            selw: p0(&a.selw),
            mid: p0(&a.mid),
            mid_q: Q8K {
                q: p0(&a.mq),
                d: p0(&a.md),
                bsums: p0(&a.mbs),
            },
            out: p0(&a.moe),
            n_in: ne,
            n_ff: ff,
            n_used: ke,
            n_expert: nex,
            limit: clamp,
        };
        let grouping = (!self.token_wise(nt)).then(|| ExpertGrouping {
            tiles: ExpertTiles {
                pairs: p0(&a.pairs),
                tiles: p0(&a.tiles),
                n_tiles: p0(&a.n_tiles),
                max_tiles: kernels::moe_max_tiles(nt, ke, nex),
            },
            outp: p0(&a.outp),
            min_cols: kernels::MOE_MIN_COLS,
        });
        for l in experts.launches(nt, grouping) {
            self.launch(&l)?;
        }
        // Shared expert (step 6), then HC post of moe + shared (steps 7-8).
        let (wg, wu) = (self.w(&lw.ffn_gate_shexp), self.w(&lw.ffn_up_shexp));
        let swiglu = if self.token_wise(nt) {
            kernels::matvec_q8_0_swiglu
        } else {
            kernels::gemm_q8_0_swiglu
        };
        self.launch(&swiglu(p0(&a.smid), wg, wu, p0(&a.xq), p0(&a.xd), ne, ff, clamp, nt))?;
        self.quantize_q8_0(p0(&a.sq), p0(&a.sd), p0(&a.smid), ff, nt)?;
        self.proj_q8_0(
            p0(&a.y),
            self.w(&lw.ffn_down_shexp),
            p0(&a.sq),
            p0(&a.sd),
            ff,
            ne,
            ne,
            ff,
            nt,
        )?;
        self.launch(&kernels::hc_post(
            p0(&a.hc),
            p0(&a.hc),
            p0(&a.moe),
            p0(&a.y),
            p0(&a.split_f),
            ne,
            nhc,
            nt,
        ))
    }

    /// Output head (spec §3.10) on the HC state of batch token `t`: writes `acts.logits`.
    pub(super) fn head(&self, t: usize) -> Result<(), EngineError> {
        let hp = &self.model.hp;
        let a = &self.acts;
        let mw = &self.model.w;
        let (ne, nhc, v) = (hp.n_embd as u32, hp.n_hc as u32, hp.n_vocab as u32);
        let hc = p0(&a.hc) + (t * hp.hc_dim() * 4) as u64;
        self.launch(&kernels::hc_mix(
            p0(&a.mix),
            hc,
            self.w(&mw.output_hc_fn),
            nhc * ne,
            nhc,
            hp.rms_eps,
            1,
        ))?;
        self.launch(&kernels::hc_head_finish(
            p0(&a.yh),
            p0(&a.mix),
            hc,
            self.w(&mw.output_hc_scale),
            self.w(&mw.output_hc_base),
            ne,
            nhc,
            hp.hc_eps,
            1,
        ))?;
        self.launch(&kernels::rms_norm_quant(
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
            hp.rms_eps,
        ))?;
        self.launch(&kernels::matvec_q8_0(
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

    /// One compressor of a layer (attention rows or indexer rows) for the `n` tokens at pos0..:
    /// projections, the state walk in token order, then the finishing of the rows it emitted
    /// (left out when the host knows the position and the batch emits none).
    #[allow(clippy::too_many_arguments)]
    fn compress(
        &self,
        cw: &CompressorWeights,
        st: &[DeviceBuffer; 3],
        comp_cap: u32,
        width: u32,
        hd: u32,
        ratio: u32,
        n: u32,
        flags: u32,
        rope: RopeParams,
        host_pos: Option<u32>,
    ) -> Result<(), EngineError> {
        let a = &self.acts;
        let ne = self.model.hp.n_embd as u32;
        if self.token_wise(n) {
            self.launch(&kernels::matvec_f16_pair(
                p0(&a.ckv),
                p0(&a.csc),
                self.w(&cw.kv),
                self.w(&cw.gate),
                p0(&a.xn),
                ne,
                width,
                ne,
                n,
            ))?;
        } else {
            self.launch(&kernels::gemm_f16(
                p0(&a.ckv),
                self.w(&cw.kv),
                p0(&a.xn),
                ne,
                width,
                ne,
                n,
            ))?;
            self.launch(&kernels::gemm_f16(
                p0(&a.csc),
                self.w(&cw.gate),
                p0(&a.xn),
                ne,
                width,
                ne,
                n,
            ))?;
        }
        self.launch(&kernels::compressor_pool(
            p0(&st[0]),
            p0(&st[1]),
            p0(&st[2]),
            p0(&a.ckv),
            p0(&a.csc),
            self.w(&cw.ape),
            a.pos_ptr(),
            hd,
            ratio,
            n,
            comp_cap,
        ))?;
        // compressor_pool skips rows past comp_cap; so does the finishing.
        let rows = match host_pos {
            Some(p) => {
                let (first, count) = kernels::compressor_emitted(ratio, p, n);
                count.min(comp_cap.saturating_sub(first))
            }
            None => kernels::compressor_max_emitted(ratio, n),
        };
        if rows > 0 {
            self.launch(&kernels::rows_finish_emitted(
                p0(&st[0]),
                self.w(&cw.norm),
                a.pos_ptr(),
                hd,
                flags,
                ratio,
                comp_cap,
                rope,
                self.model.hp.rms_eps,
                n,
                rows,
            ))?;
        }
        Ok(())
    }
}

/// The most rows a token of layer `l` can see (raw window plus compressed rows, at most top_k of
/// them with the indexer's selection) when the layer holds `comp_cap` compressed rows.
fn max_visible_rows(hp: &HParams, l: usize, comp_cap: usize) -> usize {
    let comp = match hp.ratio(l) {
        0 => 0,
        _ if hp.has_indexer(l) => comp_cap.min(hp.idx_top_k),
        _ => comp_cap,
    };
    hp.sliding_window + comp
}

/// One layer's device cache read back for inspection (tests, diagnostics), laid out like the CPU
/// engine's `LayerCache`: rows as f32, oldest first.
#[derive(Clone, Debug, Default)]
pub struct LayerCacheView {
    /// Raw rows of the last min(n_past, window) positions, [rows][head_dim].
    pub raw: Vec<f32>,
    /// Compressed attention rows emitted so far, [rows][head_dim] (ratio != 0).
    pub comp: Vec<f32>,
    /// Indexer rows emitted so far, [rows][idx_head_dim] (ratio 4).
    pub index: Vec<f32>,
    /// Compressor kv and score state of the attention rows, then of the indexer rows.
    pub state: Vec<f32>,
}

impl HipBackend {
    /// The session cache of every layer (synchronizes the stream; slow, for tests and diagnostics).
    pub fn read_cache(&self) -> Result<Vec<LayerCacheView>, EngineError> {
        let hp = &self.model.hp;
        let n_past = crate::backend::Backend::n_past(self);
        let rows = ring_rows(hp, self.acts.n_max);
        let d = hp.head_dim;
        let mut out = Vec::with_capacity(hp.n_layer);
        for (l, ls) in self.layers.iter().enumerate() {
            let mut v = LayerCacheView::default();
            let ring = self.read_f32(p0(&ls.ring), rows * d)?;
            for pos in n_past.saturating_sub(hp.sliding_window)..n_past {
                let r = pos % rows;
                v.raw.extend_from_slice(&ring[r * d..(r + 1) * d]);
            }
            let ratio = hp.ratio(l) as usize;
            let n_comp = n_past.checked_div(ratio).unwrap_or(0).min(ls.comp_cap);
            for (st, width, dst) in [(&ls.comp, d, &mut v.comp), (&ls.index, hp.idx_head_dim, &mut v.index)] {
                if let Some(st) = st {
                    dst.extend(self.read_f32(p0(&st[0]), n_comp * width)?);
                    for b in &st[1..] {
                        v.state.extend(self.read_f32(p0(b), b.len_bytes() / 4)?);
                    }
                }
            }
            out.push(v);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The attention score buffer covers every batch the backend launches: any chunk size
    /// 1..=n_max at any position, with the indexer selection exactly when `attention_sublayer` uses
    /// it, for each kind of Flash layer; and the session bound used by a captured decode step is
    /// never below the rows a position sees.
    #[test]
    fn attention_scores_cover_every_batch() {
        let hp = HParams::flash();
        for (ctx, n_max) in [(4096usize, 256usize), (65536, 256), (65536, 16), (300, 7)] {
            let bound = attention_score_floats(&hp, n_max, ctx);
            for l in [0, 2, 3] {
                let ratio = hp.ratio(l);
                let shape = AttentionShape {
                    n_head: hp.n_head as u32,
                    head_dim: hp.head_dim as u32,
                    ring_cap: ring_rows(&hp, n_max) as u32,
                    window: hp.sliding_window as u32,
                    ratio,
                    top_k: hp.idx_top_k as u32,
                };
                let cap = if ratio == 0 {
                    0
                } else {
                    comp_cap(ctx, ratio as usize) as u32
                };
                let most = max_visible_rows(&hp, l, cap as usize) as u32;
                for n in 1..=n_max {
                    for p0 in (0..ctx - n + 1).step_by(97).chain([ctx - n]) {
                        let n_comp = ((p0 + n) as u32).checked_div(ratio).unwrap_or(0).min(cap);
                        let sel = hp.has_indexer(l) && n_comp > hp.idx_top_k as u32;
                        let rows = shape.visible_rows((p0 + n - 1) as u32, n_comp, sel);
                        assert!(rows <= most, "layer {l}: {rows} rows at {p0} > {most}");
                        let need = shape.score_floats(n as u32, rows);
                        assert!(
                            need <= bound,
                            "ctx {ctx}, chunk {n_max}: {n} tokens at {p0} (layer {l}) need {need} > {bound}"
                        );
                    }
                }
                assert!(shape.score_floats(1, most) <= bound);
            }
        }
    }

    /// The activation memory of a chunk, for the report (kernels/README.md): Flash with
    /// PREFILL_CHUNK-token chunks. Grows with ctx only through the indexer scores and the attention scores.
    #[test]
    fn activation_bytes_for_flash() {
        let hp = HParams::flash();
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        let mut last = 0;
        for ctx in [4096usize, 65536, 1 << 20] {
            let decode = activation_bytes(&hp, 1, ctx);
            let chunk = activation_bytes(&hp, PREFILL_CHUNK, ctx);
            eprintln!(
                "Flash ctx {ctx}: activations {:.1} MiB for {PREFILL_CHUNK}-token chunks, {:.1} MiB for decode only",
                mib(chunk),
                mib(decode)
            );
            // A chunk holds at least n_max tokens' worth of the per-token rows (q: H*D floats).
            assert!(chunk >= (PREFILL_CHUNK * hp.q_dim() * 4) as u64 && chunk > decode);
            assert!(chunk >= last);
            last = chunk;
        }
    }
}
