//! The activation buffers of a session: every per-token intermediate of the launch sequence for up to
//! `n_max` tokens (the largest prefill chunk), planar per token (kernels/README.md layouts),
//! allocated once, and the step parameters the kernels read the position and token ids from.
//!
//! One size plan (`ActsOf::build`) gives both the device buffers (`Acts::new`) and the byte count
//! the memory guard checks before anything is allocated (`activation_bytes`). Owns the buffer list
//! and the bounds of the attention score buffer.

use std::cell::Cell;

use crate::backend::cpu::cache::comp_cap;
use crate::model::hparams::HParams;

use super::block;
use super::kernels::{self, DevPtr};
use super::runtime::{DeviceBuffer, HipContext};

/// Words of step parameters before the token ids in `Acts::step`: word 0 is the position of the
/// batch's first token (the rest is padding that keeps the ids 16-byte aligned).
pub(super) const STEP_TOKENS: usize = 4;

/// Raw-ring rows for chunks of up to `n_max` tokens: a chunk stores all its kv rows before its
/// attention, and its first token still needs the window - 1 rows before it (docs/model.md#device-ring).
pub fn ring_rows(hp: &HParams, n_max: usize) -> usize {
    hp.sliding_window.max(1) + n_max - 1
}

/// Tokens the HC state's second buffer holds for chunks of up to `n_max` tokens: the batches whose
/// HC steps run a block per mix row (`kernels::hc_per_token` false), the ones that write out of place.
pub(super) fn hc_alt_tokens(n_max: usize) -> usize {
    n_max.min(kernels::HC_TOKEN_BLOCKS_MIN_TOKENS as usize - 1)
}

/// Activations of up to `n_max` tokens, planar per token (kernels/README.md layouts), allocated once.
/// Generic over the buffer so the same size plan gives device buffers (`Acts`) and byte counts
/// (`activation_bytes`, no device needed).
pub(super) struct ActsOf<B> {
    pub(super) n_max: usize,
    /// Kernel launches issued through `Pass::launch`, and those a decode-graph replay runs
    /// (diagnostics).
    pub(super) launches: Cell<u64>,
    /// Step parameters: u32 [STEP_TOKENS] (the batch's first position), then the batch's token ids.
    pub(super) step: B,
    pub(super) hc: B,
    /// The HC state's second buffer, for batches of fewer than `HC_TOKEN_BLOCKS_MIN_TOKENS` tokens
    /// in fast arithmetic: their HC posts write out of place, alternating `hc` and `hc_alt`
    /// (`Pass::advance_hc`).
    pub(super) hc_alt: B,
    pub(super) split_a: B,
    pub(super) split_f: B,
    /// HC mix values, [n][2 n_hc + n_hc²].
    pub(super) mix: B,
    /// Counters of the finishing blocks, u32: the HC pre's [n] (`p0`), the fused router's [n]
    /// (`router_counter`), the fused routed gate/up's [n][n_used][n_ff / 256] (`moe_counter`), the
    /// query heads' [n][n_head] (`query_head_counter`) and the indexer's query heads' [n][idx_n_head]
    /// (`index_head_counter`; the two chains run at once) and the shared expert's 256-row units
    /// [n][n_ff / 256] (`shared_unit_counter`); each finisher puts its word back to 0.
    pub(super) counter: B,
    /// Byte offsets in `counter` of the query heads', the indexer heads' and the shared expert
    /// units' counters.
    unit_counters_at: [u64; 3],
    pub(super) xn: B,
    pub(super) xq: B,
    pub(super) xd: B,
    pub(super) kq: B,
    pub(super) kd: B,
    pub(super) kbs: B,
    pub(super) qr: B,
    pub(super) qrn: B,
    pub(super) qq: B,
    pub(super) qd: B,
    pub(super) q: B,
    pub(super) kv: B,
    /// The attention compressor's kv and gate projections, [n][2 head_dim] each.
    pub(super) ckv: B,
    pub(super) csc: B,
    /// The indexer compressor's, [n][2 idx_head_dim] each: its own, since the two compressors run
    /// on separate lanes (`attention_layer.rs`).
    pub(super) ickv: B,
    pub(super) icsc: B,
    pub(super) qi: B,
    pub(super) iw: B,
    pub(super) scores: B,
    pub(super) sel: B,
    pub(super) att: B,
    /// Attention scores then weights, [n][n_head][most visible rows], and 1/denominator per head.
    pub(super) att_sc: B,
    pub(super) att_inv: B,
    pub(super) aq: B,
    pub(super) ad: B,
    pub(super) low: B,
    pub(super) lq: B,
    pub(super) ld: B,
    pub(super) y: B,
    pub(super) rl: B,
    pub(super) sel_e: B,
    pub(super) selw: B,
    pub(super) mid: B,
    pub(super) mq: B,
    pub(super) md: B,
    pub(super) mbs: B,
    pub(super) moe: B,
    /// Expert grouping of a chunk (`moe_group`): pair ids, tiles, tile count; per-pair down outputs.
    pub(super) pairs: B,
    pub(super) tiles: B,
    pub(super) n_tiles: B,
    pub(super) outp: B,
    pub(super) smid: B,
    pub(super) sq: B,
    pub(super) sd: B,
    pub(super) yh: B,
    pub(super) logits: B,
    /// Device sampling result: u32 [kernels::SAMPLE_OUT_WORDS].
    pub(super) sampled: B,
    /// The block verify (block.rs): the logits after every token of a block [block][n_vocab], the
    /// logits before it, each layer's compressor inputs, the kept compressor states and the span
    /// tables that copy them.
    pub(super) block_logits: B,
    pub(super) logits_before: B,
    pub(super) block_redo: B,
    pub(super) kept_states: B,
    pub(super) spans: B,
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
        // 256-element units of a token's routed-expert mid rows (the fused gate/up's counters).
        let moe_units = ke_f.div_ceil(256);
        // 256-element units of a token's shared-expert mid row (the fused SwiGLU's counters).
        let shared_units = hp.n_ff_exp.div_ceil(256);
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
            hc_alt: f32s(alloc, hc_alt_tokens(n) * hp.hc_dim())?,
            split_a: f32s(alloc, n * n_mix)?,
            split_f: f32s(alloc, n * n_mix)?,
            mix: f32s(alloc, n * n_mix)?,
            // Zeroed by HipSession::clear_state before the first launch.
            counter: bytes(
                alloc,
                4 * n * (2 + moe_units + hp.n_head + hp.idx_n_head + shared_units),
            )?,
            unit_counters_at: [
                (4 * n * (2 + moe_units)) as u64,
                (4 * n * (2 + moe_units + hp.n_head)) as u64,
                (4 * n * (2 + moe_units + hp.n_head + hp.idx_n_head)) as u64,
            ],
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
            ckv: f32s(alloc, n * 2 * d)?,
            csc: f32s(alloc, n * 2 * d)?,
            ickv: f32s(alloc, n * 2 * di)?,
            icsc: f32s(alloc, n * 2 * di)?,
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
            // The head runs on one row, or on every row of a verified block.
            yh: f32s(alloc, block::block_capacity(n) * ne)?,
            logits: f32s(alloc, hp.n_vocab)?,
            sampled: bytes(alloc, 4 * kernels::SAMPLE_BUFFER_WORDS)?,
            block_logits: f32s(alloc, block::block_capacity(n) * hp.n_vocab)?,
            logits_before: f32s(alloc, hp.n_vocab)?,
            block_redo: f32s(alloc, hp.n_layer * block::redo_layer_floats(hp))?,
            kept_states: f32s(alloc, block::state_floats(hp, ctx, n))?,
            spans: bytes(alloc, block::span_table_bytes(hp))?,
        })
    }

    /// Every buffer.
    fn buffers(&self) -> [&B; 59] {
        [
            &self.step,
            &self.hc,
            &self.hc_alt,
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
            &self.ickv,
            &self.icsc,
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
            &self.block_logits,
            &self.logits_before,
            &self.block_redo,
            &self.kept_states,
            &self.spans,
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

    /// Device address of the fused router's per-token counters (`counter` from word n).
    pub(super) fn router_counter(&self) -> DevPtr {
        self.counter.ptr().0 + 4 * self.n_max as u64
    }

    /// Device address of the fused routed gate/up's counters (`counter` from word 2n).
    pub(super) fn moe_counter(&self) -> DevPtr {
        self.counter.ptr().0 + 8 * self.n_max as u64
    }

    /// Device address of the query heads' counters of the fused up-projection and row finish
    /// (`kernels::matvec_q8_0_normed_rows`).
    pub(super) fn query_head_counter(&self) -> DevPtr {
        self.counter.ptr().0 + self.unit_counters_at[0]
    }

    /// Device address of the indexer's query heads' counters of its fused norm, product and
    /// Hadamard rows (`kernels::matvec_f16_normed_hadamard`).
    pub(super) fn index_head_counter(&self) -> DevPtr {
        self.counter.ptr().0 + self.unit_counters_at[1]
    }

    /// Device address of the shared expert's unit counters of its fused SwiGLU and Q8_0
    /// (`kernels::matvec_q8_0_swiglu_quantized`).
    pub(super) fn shared_unit_counter(&self) -> DevPtr {
        self.counter.ptr().0 + self.unit_counters_at[2]
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

/// The most rows a token of layer `l` can see (raw window plus compressed rows, at most top_k of
/// them with the indexer's selection) when the layer holds `comp_cap` compressed rows.
pub(super) fn max_visible_rows(hp: &HParams, l: usize, comp_cap: usize) -> usize {
    let comp = match hp.ratio(l) {
        0 => 0,
        _ if hp.has_indexer(l) => comp_cap.min(hp.idx_top_k),
        _ => comp_cap,
    };
    hp.sliding_window + comp
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::hip::kernels::AttentionShape;

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
}
