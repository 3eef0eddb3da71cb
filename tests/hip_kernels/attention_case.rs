//! The random inputs of one attention check on the device (queries, ring, compressed rows, sinks,
//! the indexer's selection, the position word), shared by the exact attention check and the fast
//! attention checks that compare against it.

use ds4_chat::backend::hip::kernels::{self, AttentionInputs, AttentionShape};
use ds4_chat::backend::hip::runtime::{DeviceBuffer, HipResult};

use super::support::{CheckRng, Gpu, random_vec};

/// Ascending distinct selections of `top_k` rows among the compressed rows each of the `n_tok`
/// tokens at pos0.. sees (n_comp in the cache, one per `ratio` positions), padded with row 0 to
/// top_k; empty when top_k is 0.
pub fn random_selection(
    rng: &mut CheckRng,
    n_tok: usize,
    pos0: usize,
    ratio: usize,
    n_comp: usize,
    top_k: usize,
) -> Vec<u32> {
    let mut sel: Vec<u32> = Vec::new();
    if top_k == 0 {
        return sel;
    }
    for t in 0..n_tok {
        let n_c = (pos0 + t + 1).checked_div(ratio).map_or(0, |c| c.min(n_comp));
        let mut all: Vec<u32> = (0..n_c as u32).collect();
        for i in (1..all.len()).rev() {
            all.swap(i, rng.int_in(0, i as i64) as usize);
        }
        let mut rows: Vec<u32> = all.into_iter().take(top_k.min(n_c)).collect();
        rows.sort_unstable();
        rows.resize(top_k, 0);
        sel.extend(rows);
    }
    sel
}

/// The attention shape of a check's sizes.
pub fn attention_shape(
    n_head: usize,
    head_dim: usize,
    ring_cap: usize,
    window: usize,
    ratio: usize,
    top_k: usize,
) -> AttentionShape {
    AttentionShape {
        n_head: n_head as u32,
        head_dim: head_dim as u32,
        ring_cap: ring_cap as u32,
        window: window as u32,
        ratio: ratio as u32,
        top_k: top_k as u32,
    }
}

/// One attention case: its host inputs and their device copies.
pub struct AttentionCase {
    shape: AttentionShape,
    /// Tokens of the batch, the first one's position, compressed rows in the cache.
    n_tok: usize,
    pos0: usize,
    n_comp: usize,
    /// q [n_tok][n_head][head_dim].
    pub q: Vec<f32>,
    /// Ring rows [ring_cap][head_dim] and compressed rows [max(n_comp, 1)][head_dim].
    pub ring: Vec<f32>,
    pub comp: Vec<f32>,
    /// One sink logit per head.
    pub sinks: Vec<f32>,
    /// [n_tok][top_k], empty without a selection.
    pub sel: Vec<u32>,
    bufs: [DeviceBuffer; 6],
}

impl AttentionCase {
    /// Random q, ring rows and compressed rows in [-1, 1] (the compressed rows passed through
    /// `comp_round`), sinks in [-2, 2] and the selection, drawn in that order, and uploaded.
    pub fn new(
        gpu: &Gpu,
        rng: &mut CheckRng,
        shape: AttentionShape,
        n_tok: usize,
        pos0: usize,
        n_comp: usize,
        comp_round: fn(f32) -> f32,
    ) -> HipResult<AttentionCase> {
        let (n_head, head_dim) = (shape.n_head as usize, shape.head_dim as usize);
        let q = random_vec(rng, n_tok * n_head * head_dim, 1.0);
        let ring = random_vec(rng, shape.ring_cap as usize * head_dim, 1.0);
        let comp: Vec<f32> = random_vec(rng, n_comp.max(1) * head_dim, 1.0)
            .into_iter()
            .map(comp_round)
            .collect();
        let sinks = random_vec(rng, n_head, 2.0);
        let (ratio, top_k) = (shape.ratio as usize, shape.top_k as usize);
        let sel = random_selection(rng, n_tok, pos0, ratio, n_comp, top_k);
        let bufs = [
            gpu.up(&q)?,
            gpu.up(&ring)?,
            gpu.up(&comp)?,
            gpu.up(&sinks)?,
            gpu.up(&if sel.is_empty() { vec![0u32] } else { sel.clone() })?,
            gpu.up(&[pos0 as u32])?,
        ];
        Ok(AttentionCase {
            shape,
            n_tok,
            pos0,
            n_comp,
            q,
            ring,
            comp,
            sinks,
            sel,
            bufs,
        })
    }

    /// Whether the case passes the indexer's selection.
    pub fn selected(&self) -> bool {
        self.shape.top_k > 0
    }

    /// The rows the batch's last token sees.
    pub fn rows(&self) -> u32 {
        let last = (self.pos0 + self.n_tok - 1) as u32;
        self.shape.visible_rows(last, self.n_comp as u32, self.selected())
    }

    /// The device inputs of the attention launches.
    pub fn inputs(&self) -> AttentionInputs {
        let [q, ring, comp, sinks, sel, pos] = &self.bufs;
        AttentionInputs {
            q: q.ptr().0,
            ring: ring.ptr().0,
            comp: comp.ptr().0,
            comp_sel: if self.selected() { sel.ptr().0 } else { kernels::NULL },
            sinks: sinks.ptr().0,
            pos: pos.ptr().0,
            n_comp_avail: self.n_comp as u32,
        }
    }

    /// The exact sequence (scores, softmax, weighted values) into `out`, its score buffer sized
    /// for `max_rows` rows.
    pub fn run_exact(&self, gpu: &Gpu, out: &DeviceBuffer, max_rows: u32) -> HipResult<()> {
        let nt = self.n_tok as u32;
        let sc = gpu.poisoned::<f32>(self.shape.score_floats(nt, max_rows))?;
        let inv = gpu.poisoned::<f32>(self.n_tok * self.shape.n_head as usize)?;
        let io = self.inputs();
        for launch in kernels::attention(&self.shape, out.ptr().0, sc.ptr().0, inv.ptr().0, &io, max_rows, nt) {
            gpu.run(&launch)?;
        }
        Ok(())
    }
}
