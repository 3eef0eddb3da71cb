//! The routed-expert cases that the exact checks (group `moe`) and the fast twins' checks
//! (`moe_fast`) share: random expert weights in a format, Q8_K activations and a random selection
//! on the device, with the CPU reference of each pair.

use ds4_chat::backend::cpu::moe::swiglu;
use ds4_chat::backend::cpu::quant::BlockQ8K;
use ds4_chat::backend::hip::kernels::{self, ExpertFormat, ExpertTiles, Launch};
use ds4_chat::backend::hip::runtime::{DeviceBuffer, HipResult};

use super::support::*;

/// Distinct random experts per token and positive weights; with `last_highest` the last token
/// takes the highest ids (n_expert - 1 down), so the last experts are always routed.
pub fn random_selection(
    rng: &mut CheckRng,
    n_tok: usize,
    n_used: usize,
    n_expert: usize,
    last_highest: bool,
) -> (Vec<u32>, Vec<f32>) {
    let mut sel = Vec::new();
    for t in 0..n_tok {
        let mut chosen: Vec<u32> = Vec::new();
        while chosen.len() < n_used {
            let e = if last_highest && t + 1 == n_tok {
                (n_expert - 1 - chosen.len()) as u32
            } else {
                rng.int_in(0, n_expert as i64 - 1) as u32
            };
            if !chosen.contains(&e) {
                chosen.push(e);
            }
        }
        sel.extend(chosen);
    }
    let selw = (0..n_tok * n_used)
        .map(|_| 0.2 + 0.5 * (rng.next_f32() + 1.0))
        .collect();
    (sel, selw)
}

/// The routed gate/up step of `n_tok` tokens: `fmt` gate and up rows of `n_expert` experts
/// (`shape`: n_in, n_ff, n_expert, n_used), Q8_K activations and a selection with weights.
pub struct GateUpCase {
    pub fmt: ExpertFormat,
    pub shape: (usize, usize, usize, usize),
    pub n_tok: usize,
    pub limit: f32,
    /// The output, poisoned: `n_tok * n_used * n_ff` f32, pair by pair.
    pub mid: DeviceBuffer,
    gate: Vec<u8>,
    up: Vec<u8>,
    x: Vec<BlockQ8K>,
    sel: Vec<u32>,
    selw: Vec<f32>,
    /// Gate, up, selection, selection weights; the activations.
    dev: ([DeviceBuffer; 4], Q8kDevice),
}

impl GateUpCase {
    /// With `last_highest` the last token routes to the highest expert ids ([`random_selection`]).
    pub fn new(
        gpu: &Gpu,
        rng: &mut CheckRng,
        fmt: ExpertFormat,
        shape: (usize, usize, usize, usize),
        (n_tok, limit, last_highest): (usize, f32, bool),
    ) -> HipResult<GateUpCase> {
        let (n_in, n_ff, n_expert, n_used) = shape;
        let ty = fmt.ggml_type();
        let gate = random_weights(rng, ty, n_in, n_ff * n_expert);
        let up = random_weights(rng, ty, n_in, n_ff * n_expert);
        let x = q8k_blocks(&random_vec(rng, n_tok * n_in, 2.0));
        let (sel, selw) = random_selection(rng, n_tok, n_used, n_expert, last_highest);
        let dev = (
            [gpu.up(&gate)?, gpu.up(&up)?, gpu.up(&sel)?, gpu.up(&selw)?],
            gpu.up_q8k(&x)?,
        );
        let mid = gpu.poisoned::<f32>(n_tok * n_used * n_ff)?;
        Ok(GateUpCase {
            fmt,
            shape,
            n_tok,
            limit,
            mid,
            gate,
            up,
            x,
            sel,
            selw,
            dev,
        })
    }

    /// The selection on the device (for the grouping of the GEMM).
    pub fn sel(&self) -> &DeviceBuffer {
        &self.dev.0[2]
    }

    /// `ds4_moe_gate_up_*`: every pair in one launch.
    pub fn launch(&self) -> Launch {
        let [gate, up, sel, selw] = self.dev.0.each_ref().map(|b| b.ptr().0);
        let (n_in, n_ff, _, n_used) = self.shape;
        let [n_in, n_ff, n_used, n_tok] = [n_in, n_ff, n_used, self.n_tok].map(|v| v as u32);
        let (mid, x) = (self.mid.ptr().0, self.dev.1.planes());
        kernels::moe_gate_up(
            self.fmt, mid, gate, up, x, sel, selw, n_in, n_ff, n_used, self.limit, n_tok,
        )
    }

    /// `ds4_moe_gemm_gate_up_*` over the selection's grouping `tiles`.
    pub fn launch_gemm(&self, tiles: ExpertTiles) -> Launch {
        let [gate, up, _, selw] = self.dev.0.each_ref().map(|b| b.ptr().0);
        let (n_in, n_ff, _, n_used) = self.shape;
        let [n_in, n_ff, n_used] = [n_in, n_ff, n_used].map(|v| v as u32);
        let (mid, x) = (self.mid.ptr().0, self.dev.1.planes());
        kernels::moe_gemm_gate_up(self.fmt, mid, gate, up, x, tiles, selw, n_in, n_ff, n_used, self.limit)
    }

    /// The CPU reference ([`ref_gate_up`]).
    pub fn want(&self) -> Vec<f32> {
        let (n_in, n_ff, _, n_used) = self.shape;
        let (x, sel, selw) = (&self.x, &self.sel, &self.selw);
        ref_gate_up(
            self.fmt,
            &self.gate,
            &self.up,
            x,
            sel,
            selw,
            (n_in, n_ff, n_used),
            self.limit,
        )
    }
}

/// The routed down step of `n_tok` tokens: `fmt` down rows of `n_expert` experts (`shape`: n_ff,
/// n_out, n_expert, n_used), Q8_K mids (one per pair) and a selection.
pub struct DownCase {
    pub fmt: ExpertFormat,
    pub shape: (usize, usize, usize, usize),
    pub n_tok: usize,
    /// The output, poisoned: `n_tok * n_out` f32.
    pub out: DeviceBuffer,
    down: Vec<u8>,
    mids: Vec<BlockQ8K>,
    sel: Vec<u32>,
    /// Down weights, selection; the mids.
    dev: ([DeviceBuffer; 2], Q8kDevice),
}

impl DownCase {
    /// With `last_highest` the last token routes to the highest expert ids ([`random_selection`]).
    pub fn new(
        gpu: &Gpu,
        rng: &mut CheckRng,
        fmt: ExpertFormat,
        shape: (usize, usize, usize, usize),
        (n_tok, last_highest): (usize, bool),
    ) -> HipResult<DownCase> {
        let (n_ff, n_out, n_expert, n_used) = shape;
        let down = random_weights(rng, fmt.ggml_type(), n_ff, n_out * n_expert);
        let mids = q8k_blocks(&random_vec(rng, n_tok * n_used * n_ff, 1.5));
        let (sel, _) = random_selection(rng, n_tok, n_used, n_expert, last_highest);
        let dev = ([gpu.up(&down)?, gpu.up(&sel)?], gpu.up_q8k(&mids)?);
        let out = gpu.poisoned::<f32>(n_tok * n_out)?;
        Ok(DownCase {
            fmt,
            shape,
            n_tok,
            out,
            down,
            mids,
            sel,
            dev,
        })
    }

    /// The selection on the device (for the grouping of the GEMM).
    pub fn sel(&self) -> &DeviceBuffer {
        &self.dev.0[1]
    }

    /// `ds4_moe_down_*`: every token's pairs summed into `out` in one launch.
    pub fn launch(&self) -> Launch {
        let [down, sel] = self.dev.0.each_ref().map(|b| b.ptr().0);
        let (n_ff, n_out, _, n_used) = self.shape;
        let [n_ff, n_out, n_used, n_tok] = [n_ff, n_out, n_used, self.n_tok].map(|v| v as u32);
        let (out, mids) = (self.out.ptr().0, self.dev.1.planes());
        kernels::moe_down(self.fmt, out, down, mids, sel, n_ff, n_out, n_used, n_tok)
    }

    /// `ds4_moe_gemm_down_*` over the selection's grouping `tiles` into `outp` (one row a pair).
    pub fn launch_gemm(&self, outp: &DeviceBuffer, tiles: ExpertTiles) -> Launch {
        let (n_ff, n_out, _, n_used) = self.shape;
        let [n_ff, n_out, n_used] = [n_ff, n_out, n_used].map(|v| v as u32);
        let (down, mids) = (self.dev.0[0].ptr().0, self.dev.1.planes());
        kernels::moe_gemm_down(self.fmt, outp.ptr().0, down, mids, tiles, n_ff, n_out, n_used)
    }

    /// The CPU reference: the pairs' outputs summed per token in expert order from +0, as
    /// `moe_sum` and the decode kernel.
    pub fn want(&self) -> Vec<f32> {
        let (n_ff, n_out, _, n_used) = self.shape;
        let pairs = ref_down(self.fmt, &self.down, &self.mids, &self.sel, (n_ff, n_out));
        let mut want = vec![0f32; self.n_tok * n_out];
        for (i, w) in want.iter_mut().enumerate() {
            let (t, r) = (i / n_out, i % n_out);
            for k in 0..n_used {
                *w += pairs[(t * n_used + k) * n_out + r];
            }
        }
        want
    }
}

/// CPU reference of the routed gate/up step for each (token, expert) pair of `sel`:
/// swiglu(gate row · x_t, up row · x_t, limit) × the pair's weight.
#[allow(clippy::too_many_arguments)]
pub fn ref_gate_up(
    fmt: ExpertFormat,
    gate: &[u8],
    up: &[u8],
    x: &[BlockQ8K],
    sel: &[u32],
    selw: &[f32],
    (n_in, n_ff, n_used): (usize, usize, usize),
    limit: f32,
) -> Vec<f32> {
    let rb = fmt.ggml_type().row_bytes(n_in);
    let bpt = n_in / q8k_block();
    let mut want = Vec::with_capacity(sel.len() * n_ff);
    for (pr, &e) in sel.iter().enumerate() {
        let xt = &x[pr / n_used * bpt..][..bpt];
        for r in 0..n_ff {
            let row = (e as usize * n_ff + r) * rb;
            let g = expert_dot(fmt, &gate[row..row + rb], xt);
            let u = expert_dot(fmt, &up[row..row + rb], xt);
            want.push(swiglu(g, u, limit) * selw[pr]);
        }
    }
    want
}

/// CPU reference of the routed down step for each pair of `sel`: down row · the pair's mid.
pub fn ref_down(
    fmt: ExpertFormat,
    down: &[u8],
    mids: &[BlockQ8K],
    sel: &[u32],
    (n_ff, n_out): (usize, usize),
) -> Vec<f32> {
    let rb = fmt.ggml_type().row_bytes(n_ff);
    let bpr = n_ff / q8k_block();
    let mut want = Vec::with_capacity(sel.len() * n_out);
    for (pr, &e) in sel.iter().enumerate() {
        for r in 0..n_out {
            let row = (e as usize * n_out + r) * rb;
            want.push(expert_dot(fmt, &down[row..row + rb], &mids[pr * bpr..][..bpr]));
        }
    }
    want
}
