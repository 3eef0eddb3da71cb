//! The FFN sublayer of one layer on the device (docs/model.md#moe): the HC pre step, the router, the
//! routed experts (per token, or grouped by expert id for a chunk), the shared expert and the HC post
//! step.
//!
//! Lanes (`lanes.rs`): the shared expert (it owns `smid`, `sq`, `sd` and `y`) runs on a side lane
//! beside the router and the routed experts; the routed experts' last launch joins it.

use crate::backend::BackendError;

use super::kernels::{self, NULL, Q8K, Q8Proj, Q8Swiglu, QuantOut, RoutedExperts};
use super::pass::{Pass, expert_format, p0, q8};

/// The FFN sublayer's side lane (module comment).
const LANE_SHARED_EXPERT: usize = 0;
use super::prefill;

impl Pass<'_> {
    /// The FFN sublayer of layer `l` for `n` tokens (docs/model.md#moe).
    pub(super) fn ffn_sublayer(&self, l: usize, n: usize) -> Result<(), BackendError> {
        let hp = &self.model.hp;
        let a = &self.acts;
        let lw = &self.model.w.layers[l];
        let nt = n as u32;
        let ne = hp.n_embd as u32;
        let nhc = hp.n_hc as u32;
        let (ff, ke, nex) = (hp.n_ff_exp as u32, hp.n_expert_used as u32, hp.n_expert as u32);
        let clamp = hp.swiglu_clamp[l];
        let hc_w = [&lw.hc_ffn_fn, &lw.hc_ffn_scale, &lw.hc_ffn_base, &lw.ffn_norm];
        self.hc_pre(p0(&a.split_f), true, hc_w, nt)?;
        // Shared expert (step 6).
        let shared = Q8Swiglu {
            mid: p0(&a.smid),
            wg: self.w(&lw.ffn_gate_shexp),
            wu: self.w(&lw.ffn_up_shexp),
            x: q8(&a.xq, &a.xd),
            n_in: ne,
            n_ff: ff,
            limit: clamp,
        };
        self.fork(LANE_SHARED_EXPERT, || {
            // In fast arithmetic a decode step's SwiGLU quantizes its own output (one launch fewer).
            let quant = kernels::quantize_rows(QuantOut::q8_0(p0(&a.sq), p0(&a.sd)), p0(&a.smid), ff, nt);
            let fused = self
                .fast_token_wise(nt)
                .then(|| {
                    let swiglu = self.swiglu_product(&shared, nt);
                    kernels::matvec_q8_0_swiglu_quantized(&swiglu, &quant, a.shared_unit_counter())
                })
                .flatten();
            match fused {
                Some(fused) => self.launch(&fused)?,
                None => {
                    self.swiglu_q8_0(&shared, nt)?;
                    self.launch(&quant)?;
                }
            }
            let mid = q8(&a.sq, &a.sd);
            self.proj_q8_0(&Q8Proj::plain(p0(&a.y), self.w(&lw.ffn_down_shexp), mid, ff, ne), nt)
        })?;
        // Router (steps 3-4): in fast arithmetic, one launch for a decode step's logits and selection.
        let router = kernels::router(
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
        );
        let logits = self.f16_product(p0(&a.rl), self.w(&lw.ffn_gate_inp), p0(&a.xn), ne, nex, ne, nt);
        let fused = self
            .fast_token_wise(nt)
            .then(|| kernels::matvec_f16_router(&logits, &router, a.router_counter()))
            .flatten();
        if let Some(fused) = fused {
            self.launch(&fused)?;
        } else {
            self.launch(&logits)?;
            self.launch(&router)?;
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
        let grouping = (!self.token_wise(nt)).then(|| prefill::expert_grouping(a, nt, ke, nex));
        let launches = experts.launches(nt, grouping);
        // In fast arithmetic a decode step's gate/up also quantizes its output (one launch fewer).
        let quantized = self
            .fast_token_wise(nt)
            .then(|| kernels::moe_gate_up_quantized(&launches[0], &launches[1], a.moe_counter(), self.fast_grids))
            .flatten();
        let rest = match &quantized {
            Some(fused) => {
                self.launch(fused)?;
                &launches[2..]
            }
            None => &launches[..],
        };
        // The shared expert's lane joins before the last routed launch (the down projection), not
        // before the HC post: it ends long before the routed experts do, and the HC post (with the
        // next sublayer's HC pre) then follows the main stream's kernel alone, so it may start, and
        // load its weights, while the down projection runs (kernels/README.md "Dependent launches").
        let (before, last) = rest.split_at(rest.len().saturating_sub(1));
        for l in before {
            self.launch(l)?;
        }
        self.join_all()?;
        for l in last {
            self.launch(l)?;
        }
        // HC post of moe + shared (steps 7-8).
        let (hc_out, hc_in) = self.advance_hc(nt);
        self.launch(&kernels::hc_post(
            hc_out,
            hc_in,
            p0(&a.moe),
            p0(&a.y),
            p0(&a.split_f),
            ne,
            nhc,
            nt,
        ))
    }
}
