//! The attention sublayer of one layer on the device (docs/model.md#attention): query and kv rows, the
//! raw ring, the compressors (docs/model.md#compressor) and the indexer's selection
//! (docs/model.md#indexer), attention over the window and the compressed rows, the grouped output
//! projection and the HC post step.
//!
//! Lanes (`lanes.rs`): after the HC pre, the attention compressor (it owns `ckv`, `csc` and the
//! layer's compressed rows) and the indexer compressor with the indexer's head weights (`ickv`,
//! `icsc`, the indexer's rows, `iw`) run on their own lanes. Once the query's down-projection is
//! done, where the indexer selects rows, a third lane makes the query heads and the kv row (`q`,
//! the ring) while the main stream makes the indexer's query heads (`qi`; in fast arithmetic from
//! its own norm of the down-projection, in the same launch as their Hadamard rows; `qrn` otherwise),
//! joins the indexer compressor's lane and runs the indexer's scores and selection (`scores`,
//! `sel`). The attention joins all of them.

use crate::backend::BackendError;
use crate::model::weights::CompressorWeights;

use super::acts::{max_visible_rows, ring_rows};
use super::kernels::{
    self, AttentionInputs, AttentionShape, AttentionSplitPlan, DevPtr, IndexerTopk, NULL, Q8Proj, QuantOut, RopeParams,
    row_flags as rf,
};
use super::lanes::SIDE_LANES;
use super::pass::{Pass, p0, q8};
use super::runtime::DeviceBuffer;

/// The attention sublayer's side lanes (module comment).
const LANE_COMPRESSOR: usize = 0;
const LANE_INDEX_COMPRESSOR: usize = 1;
const LANE_QUERY: usize = 2;
const _: () = assert!(LANE_QUERY < SIDE_LANES);

impl Pass<'_> {
    /// The attention sublayer of layer `l` for the `n` tokens at pos0.. (docs/model.md#attention);
    /// `host_pos`: pos0 when the host knows it (see `forward_tokens`).
    pub(super) fn attention_sublayer(&self, l: usize, n: usize, host_pos: Option<u32>) -> Result<(), BackendError> {
        let hp = &self.model.hp;
        let a = &self.acts;
        let lw = &self.model.w.layers[l];
        let ls = &self.layers[l];
        let rope = self.ropes[l];
        let ratio = hp.ratio(l);
        let nt = n as u32;
        let (ne, d, di) = (hp.n_embd as u32, hp.head_dim as u32, hp.idx_head_dim as u32);
        let (qr_w, h, hi) = (hp.q_lora_rank as u32, hp.n_head as u32, hp.idx_n_head as u32);
        let eps = hp.rms_eps;
        let pos = a.pos_ptr();
        let raw_cap = ring_rows(hp, a.n_max) as u32;
        let comp_cap = ls.comp_cap as u32;
        let top_k = hp.idx_top_k as u32;
        let hc_w = [&lw.hc_attn_fn, &lw.hc_attn_scale, &lw.hc_attn_base, &lw.attn_norm];
        self.hc_pre(p0(&a.split_a), false, hc_w, nt)?;
        // Compressors (docs/model.md#compressor), beside the query: the kernels bound each token's
        // compressed rows by its own floor((p + 1) / ratio) and the capacity; the host's n_comp
        // (rows emitted up to the batch's last token, when it knows the position) only decides what
        // may be left out.
        let n_comp = host_pos.map(|p| ((p + nt).checked_div(ratio).unwrap_or(0)).min(comp_cap));
        if let (Some(cw), Some(st)) = (&lw.compressor, &ls.comp) {
            let c = hp.compress_overlap(l) as u32;
            let flags = rf::NORM | rf::ROPE | rf::E4M3 | rf::ROUND_F16;
            let scratch = self.compressor_inputs(l).0;
            self.fork(LANE_COMPRESSOR, || {
                self.compress(cw, st, scratch, comp_cap, c * d, d, ratio, nt, flags, rope, host_pos)
            })?;
        }
        // The indexer's selection is used once a token sees more than top_k rows (both kernels
        // skip the other tokens).
        let indexer = lw.indexer.as_ref().zip(ls.index.as_ref());
        let select = indexer.filter(|_| n_comp.is_none_or(|c| c > top_k));
        if let Some((iwt, st)) = indexer {
            let c = hp.compress_overlap(l) as u32;
            let flags = rf::NORM | rf::ROPE | rf::HADAMARD_FP4 | rf::ROUND_F16;
            let scratch = self.compressor_inputs(l).1;
            self.fork(LANE_INDEX_COMPRESSOR, || {
                let cw = &iwt.compressor;
                self.compress(cw, st, scratch, comp_cap, c * di, di, ratio, nt, flags, rope, host_pos)?;
                // The head weights read only the sublayer's input: here, off the query's chain.
                match select {
                    Some(_) => self.proj_f16(p0(&a.iw), self.w(&iwt.proj), p0(&a.xn), ne, hi, ne, nt),
                    None => Ok(()),
                }
            })?;
        }
        // Query (steps 3, 5); its down-projection and the kv projection read the same input (one
        // launch in fast arithmetic).
        let xq = q8(&a.xq, &a.xd);
        let q_a = Q8Proj::plain(p0(&a.qr), self.w(&lw.attn_q_a), xq, ne, qr_w);
        let kv_a = Q8Proj::plain(p0(&a.kv), self.w(&lw.attn_kv), xq, ne, d);
        self.proj_q8_0_pair(&q_a, &kv_a, nt)?;
        // The query's down-projection normed (into qrn for the indexer, Q8_0 planes for the
        // up-projection), then up-projected. In fast arithmetic the up-projection norms its input
        // itself (`kernels::matvec_q8_0_normed`) and the indexer's chain norms qrn.
        let q_a_norm = |o| kernels::norm_rows(o, p0(&a.qr), self.w(&lw.attn_q_a_norm), qr_w, nt, eps);
        let q_b = Q8Proj::plain(p0(&a.q), self.w(&lw.attn_q_b), q8(&a.qq, &a.qd), qr_w, h * d);
        let q_b_normed = self
            .fast_token_fusions(nt)
            .then(|| kernels::matvec_q8_0_normed(&q_b, p0(&a.qr), self.w(&lw.attn_q_a_norm), eps, nt, self.fast_grids))
            .flatten();
        let qrn = QuantOut {
            out: p0(&a.qrn),
            ..Default::default()
        };
        if q_b_normed.is_none() {
            self.launch(&q_a_norm(QuantOut {
                q8_0_q: p0(&a.qq),
                q8_0_d: p0(&a.qd),
                ..qrn
            }))?;
        }
        // The query heads (the up-projection, then their norm and RoPE) and the kv row into the ring
        // (steps 4-7, projected above): every token's row enters the ring before the attention of the
        // batch. In fast arithmetic the up-projection's blocks finish the rows (else the row
        // finishing is one launch after it).
        let query_rows = || {
            let q_rows = kernels::rows_finish(p0(&a.q), NULL, NULL, pos, h, d, rf::NORM | rf::ROPE, 1, rope, eps, nt);
            let kv_rows = kernels::rows_finish(
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
            );
            // In fast arithmetic the up-projection finishes the heads (and the kv row) itself.
            let finishing = self
                .is_fast()
                .then(|| kernels::fused_rows_finish_pair(&q_rows, &kv_rows))
                .flatten()
                .zip(q_b_normed.as_ref())
                .and_then(|(pair, normed)| kernels::matvec_q8_0_normed_rows(normed, &pair, a.query_head_counter()));
            if let Some(fused) = finishing {
                return self.launch(&fused);
            }
            match &q_b_normed {
                Some(fused) => self.launch(fused)?,
                None => self.proj_q8_0(&q_b, nt)?,
            }
            self.launch_rows_pair(&q_rows, &kv_rows)
        };
        let mut sel = NULL;
        match select {
            Some((iwt, st)) => {
                // The query chain on its lane; on the main stream the indexer's query heads
                // (docs/model.md#indexer), then, once the indexer compressor's lane is done, its
                // scores and selection. The indexer's chain is the longer one: on the main stream
                // each of its launches may start while the one before runs (kernels/README.md
                // "Dependent launches"), where a lane's first launch waits for the fork's whole kernel.
                self.fork(LANE_QUERY, query_rows)?;
                // In fast arithmetic one launch norms the down-projection, makes the indexer's
                // query heads and finishes them (qrn is not written then).
                let qi_flags = rf::ROPE | rf::HADAMARD_FP4;
                let product = self.f16_product(p0(&a.qi), self.w(&iwt.q_b), p0(&a.qrn), qr_w, hi * di, qr_w, nt);
                let qi_rows = kernels::rows_finish(p0(&a.qi), NULL, NULL, pos, hi, di, qi_flags, 1, rope, eps, nt);
                let fused = q_b_normed
                    .is_some()
                    .then(|| {
                        kernels::matvec_f16_normed_hadamard(&q_a_norm(qrn), &product, &qi_rows, a.index_head_counter())
                    })
                    .flatten();
                match fused {
                    Some(fused) => self.launch(&fused)?,
                    None => {
                        if q_b_normed.is_some() {
                            self.launch(&q_a_norm(qrn))?;
                        }
                        self.launch(&product)?;
                        self.launch(&qi_rows)?;
                    }
                }
                self.join(LANE_INDEX_COMPRESSOR)?;
                self.indexer_select(l, st, n_comp, nt)?;
                sel = p0(&a.sel);
            }
            None => query_rows()?,
        }
        // Every chain ends before the attention (the compressed rows; an unused indexer
        // compressor's too, so the sublayer ends with every lane joined).
        self.join_all()?;
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
            return Err(BackendError::Device(format!(
                "attention scores of {n} tokens over {max_rows} rows exceed the preallocated buffer (layer {l}, position {host_pos:?})"
            )));
        }
        let io = AttentionInputs {
            q: p0(&a.q),
            ring: p0(&ls.ring),
            comp: ls.comp.as_ref().map_or(NULL, |st| p0(&st[0])),
            comp_sel: sel,
            sinks: self.w(&lw.attn_sinks),
            pos,
            n_comp_avail: comp_cap,
        };
        if let Some(heads_quantized) = self.attention_decode_split(&shape, &io, max_rows, rope, nt)? {
            return self.attention_output(l, nt, heads_quantized);
        }
        if !self.attention_prefill_fast(&shape, &io, nt)? {
            let (out, sc, inv) = (p0(&a.att), p0(&a.att_sc), p0(&a.att_inv));
            for launch in kernels::attention(&shape, out, sc, inv, &io, max_rows, nt) {
                self.launch(&launch)?;
            }
        }
        self.attention_output(l, nt, false)
    }

    /// Layer `l`'s indexer scores of its compressed rows `st` and their top-k selection into
    /// `sel` (docs/model.md#indexer), from the query heads `qi` and the head weights `iw`;
    /// `n_comp`: the rows emitted up to the batch's last token when the host knows the position.
    fn indexer_select(
        &self,
        l: usize,
        st: &[DeviceBuffer; 3],
        n_comp: Option<u32>,
        nt: u32,
    ) -> Result<(), BackendError> {
        let hp = &self.model.hp;
        let a = &self.acts;
        let (di, hi) = (hp.idx_head_dim as u32, hp.idx_n_head as u32);
        let (pos, top_k) = (a.pos_ptr(), hp.idx_top_k as u32);
        let ratio = hp.ratio(l);
        let comp_cap = self.layers[l].comp_cap as u32;
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
        let topk = IndexerTopk {
            sel: p0(&a.sel),
            scores: p0(&a.scores),
            pos,
            score_stride: stride,
            n_comp_avail: comp_cap,
            ratio,
            top_k,
        };
        // Fast arithmetic, token-wise: the selection split over segments of scores.
        let segmented = self
            .fast_token_wise(nt)
            .then(|| {
                let grid_rows = n_comp.unwrap_or(comp_cap);
                kernels::indexer_topk_segmented(&topk, kernels::INDEXER_TOPK_SEGMENT, grid_rows, nt)
            })
            .flatten();
        match segmented {
            Some(launches) => launches.iter().try_for_each(|l| self.launch(l)),
            None => self.launch(&kernels::indexer_topk(&topk, nt)),
        }
    }

    /// Fast arithmetic, token-wise batches: the attention split over slices of rows
    /// (kernels/attention_fast.hip; on matrix cores where asked for and they fit), its partials in the
    /// score buffer, merged straight into the heads' inverse RoPE and Q8_0 planes where the shapes
    /// allow. Returns None when it did not run
    /// (the exact launches run then), else whether the heads are already quantized.
    fn attention_decode_split(
        &self,
        shape: &AttentionShape,
        io: &AttentionInputs,
        max_rows: u32,
        rope: RopeParams,
        nt: u32,
    ) -> Result<Option<bool>, BackendError> {
        let a = &self.acts;
        if !self.fast_token_wise(nt) {
            return Ok(None);
        }
        // Matrix cores where their tiles are laid out for the device's warps (32 lanes) and the
        // shape (kernels/attention_fast.hip); CUDA-core lanes otherwise.
        let mma_rows = self.fast_grids.attention_mma_rows;
        let matrix_cores = mma_rows > 0 && self.warp_size == 32 && kernels::attention_prefill_fast_fits(shape);
        let min_rows = match matrix_cores {
            true => mma_rows,
            false => self.fast_grids.attention_rows,
        };
        let Some(plan) = AttentionSplitPlan::new(shape, nt, max_rows, a.att_sc.len_bytes() / 4, min_rows, matrix_cores)
        else {
            return Ok(None);
        };
        let heads = (p0(&a.aq), p0(&a.ad));
        let (launches, quantized) =
            match kernels::attention_decode_split_q8(shape, plan, rope, heads, p0(&a.att_sc), io, nt) {
                Some(fused) => (fused, true),
                None => (
                    kernels::attention_decode_split(shape, plan, p0(&a.att), p0(&a.att_sc), io, nt),
                    false,
                ),
            };
        for launch in &launches {
            self.launch(launch)?;
        }
        Ok(Some(quantized))
    }

    /// After the attention of layer `l`: the inverse RoPE of the heads and their Q8_0 planes (unless
    /// `heads_quantized`: the fused merge wrote them), the grouped output projection and the HC post
    /// step.
    fn attention_output(&self, l: usize, nt: u32, heads_quantized: bool) -> Result<(), BackendError> {
        let hp = &self.model.hp;
        let a = &self.acts;
        let lw = &self.model.w.layers[l];
        let rope = self.ropes[l];
        let pos = a.pos_ptr();
        let (ne, d, nhc) = (hp.n_embd as u32, hp.head_dim as u32, hp.n_hc as u32);
        let (h, g, or) = (hp.n_head as u32, hp.n_out_group as u32, hp.o_lora_rank as u32);
        if !heads_quantized {
            self.head_rows_in_place(p0(&a.att), pos, h, d, rf::ROPE | rf::ROPE_INVERSE, rope, nt)?;
            self.quantize_q8_0(p0(&a.aq), p0(&a.ad), p0(&a.att), d, h * nt)?;
        }
        // Grouped output projection (step 12): the H heads of every token as H rows of D.
        let heads = q8(&a.aq, &a.ad);
        let grouped = Q8Proj {
            rows_per_group: or,
            x_stride: h * d,
            ..Q8Proj::plain(p0(&a.low), self.w(&lw.attn_output_a), heads, h * d / g, g * or)
        };
        self.proj_q8_0_quantized(&grouped, (p0(&a.lq), p0(&a.ld)), nt)?;
        let low = q8(&a.lq, &a.ld);
        self.proj_q8_0(&Q8Proj::plain(p0(&a.y), self.w(&lw.attn_output_b), low, g * or, ne), nt)?;
        let (hc_out, hc_in) = self.advance_hc(nt);
        self.launch(&kernels::hc_post(
            hc_out,
            hc_in,
            p0(&a.y),
            NULL,
            p0(&a.split_a),
            ne,
            nhc,
            nt,
        ))
    }

    /// Where layer `l`'s attention and indexer compressors put their kv and gate projections: the
    /// shared scratch, or in a block verify the layer's place in `acts.block_redo` (block.rs).
    fn compressor_inputs(&self, l: usize) -> ([DevPtr; 2], [DevPtr; 2]) {
        let a = &self.acts;
        if self.keep_compressor_inputs {
            return super::block::redo_ptrs(&self.model.hp, p0(&a.block_redo), l);
        }
        ([p0(&a.ckv), p0(&a.csc)], [p0(&a.ickv), p0(&a.icsc)])
    }

    /// One compressor of a layer (attention rows or indexer rows) for the `n` tokens at pos0..:
    /// projections (into the compressor's `ckv`, `csc`), the state walk in token order, then the
    /// finishing of the rows it emitted (left out when the host knows the position and the batch
    /// emits none).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn compress(
        &self,
        cw: &CompressorWeights,
        st: &[DeviceBuffer; 3],
        [ckv, csc]: [DevPtr; 2],
        comp_cap: u32,
        width: u32,
        hd: u32,
        ratio: u32,
        n: u32,
        flags: u32,
        rope: RopeParams,
        host_pos: Option<u32>,
    ) -> Result<(), BackendError> {
        let a = &self.acts;
        let ne = self.model.hp.n_embd as u32;
        if self.token_wise(n) {
            let (ys, ws) = ((ckv, csc), (self.w(&cw.kv), self.w(&cw.gate)));
            self.launch(&self.f16_pair_product(ys, ws, p0(&a.xn), ne, width, ne, n))?;
        } else {
            for (out, w) in [(ckv, &cw.kv), (csc, &cw.gate)] {
                self.proj_f16(out, self.w(w), p0(&a.xn), ne, width, ne, n)?;
            }
        }
        self.launch(&kernels::compressor_pool(
            p0(&st[0]),
            p0(&st[1]),
            p0(&st[2]),
            ckv,
            csc,
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
