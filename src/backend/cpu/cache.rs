//! Per-layer session cache of the CPU engine (docs/model.md#kv-cache): the raw sliding window of KV rows, the
//! compressed attention rows, the indexer rows and both compressor states.
//!
//! Every stored row is f16-rounded on write (docs/model.md#kv-cache). Owns only storage and its invariants;
//! the math that fills it lives in `forward.rs` / `compressor.rs`.

use crate::gguf::half::round_f16;
use crate::model::hparams::HParams;

use super::compressor::CompressorState;

/// Append-only list of f16-rounded rows.
#[derive(Clone, Debug)]
pub struct Rows {
    pub width: usize,
    pub cap: usize,
    pub n: usize,
    pub data: Vec<f32>,
}

impl Rows {
    pub fn new(width: usize, cap: usize) -> Rows {
        Rows {
            width,
            cap,
            n: 0,
            data: vec![0.0; width * cap],
        }
    }

    pub fn live(&self) -> &[f32] {
        &self.data[..self.n * self.width]
    }

    /// Append a row, rounding through f16. Returns false when the capacity is exhausted.
    pub fn push(&mut self, row: &[f32]) -> bool {
        if self.n == self.cap {
            return false;
        }
        let dst = &mut self.data[self.n * self.width..(self.n + 1) * self.width];
        for (d, &s) in dst.iter_mut().zip(row) {
            *d = round_f16(s);
        }
        self.n += 1;
        true
    }
}

/// The raw sliding window, kept in logical order (oldest first); the oldest row drops when full.
#[derive(Clone, Debug)]
pub struct RawWindow {
    pub rows: Rows,
}

impl RawWindow {
    pub fn push(&mut self, row: &[f32]) {
        let w = self.rows.width;
        if self.rows.n == self.rows.cap {
            self.rows.data.copy_within(w.., 0);
            self.rows.n -= 1;
        }
        self.rows.push(row);
    }
}

/// Cache of one layer.
#[derive(Clone, Debug)]
pub struct LayerCache {
    pub ratio: usize,
    pub raw: RawWindow,
    /// Compressed attention rows and their compressor (ratio ≠ 0).
    pub comp: Option<(Rows, CompressorState)>,
    /// Indexer rows and their compressor (ratio 4).
    pub index: Option<(Rows, CompressorState)>,
}

/// Raw window capacity min(W, ctx), at least 1 (docs/model.md#kv-cache).
pub fn raw_cap(hp: &HParams, ctx: usize) -> usize {
    hp.sliding_window.min(ctx).max(1)
}

/// Compressed row capacity ctx/ratio + 2 (docs/model.md#kv-cache).
pub fn comp_cap(ctx: usize, ratio: usize) -> usize {
    ctx / ratio + 2
}

/// Compressed-row capacity of the most compressing-often layer (smallest nonzero ratio): the most
/// compressed rows any layer holds, 0 when no layer compresses (docs/model.md#kv-cache; a header field of the
/// checkpoint payload).
pub fn max_comp_cap(hp: &HParams, ctx: usize) -> usize {
    match hp.compress_ratios.iter().copied().filter(|&r| r != 0).min() {
        Some(r) => comp_cap(ctx, r as usize),
        None => 0,
    }
}

impl LayerCache {
    pub fn new(hp: &HParams, layer: usize, ctx: usize) -> LayerCache {
        let ratio = hp.ratio(layer) as usize;
        let comp = (ratio != 0).then(|| {
            (
                Rows::new(hp.head_dim, comp_cap(ctx, ratio)),
                CompressorState::new(ratio, hp.head_dim),
            )
        });
        let index = hp.has_indexer(layer).then(|| {
            (
                Rows::new(hp.idx_head_dim, comp_cap(ctx, ratio)),
                CompressorState::new(ratio, hp.idx_head_dim),
            )
        });
        LayerCache {
            ratio,
            raw: RawWindow {
                rows: Rows::new(hp.head_dim, raw_cap(hp, ctx)),
            },
            comp,
            index,
        }
    }

    pub fn reset(&mut self) {
        self.raw.rows.n = 0;
        for (rows, st) in self.comp.iter_mut().chain(self.index.iter_mut()) {
            rows.n = 0;
            st.reset();
        }
    }

    /// Bytes held by this layer's cache.
    pub fn bytes(&self) -> usize {
        let mut n = self.raw.rows.data.len();
        for (rows, st) in self.comp.iter().chain(self.index.iter()) {
            n += rows.data.len() + st.kv.len() + st.score.len();
        }
        n * 4
    }
}
