//! The target rows DSpark reads (docs/dspark.md#capture): for every evaluated position, the mean
//! over the HC streams of the output of each target layer, concatenated in the metadata's order
//! (targets × n_embd floats). Decode rows, prefill chunks and verified rows are captured alike; rows
//! past the cache's length are dropped when a verified block is cut back or the cache is reset.
//!
//! Owns the rows and their bookkeeping (position, a sequence number that changes whenever a
//! position is evaluated again, the batch that evaluated it). Shared between the session that
//! writes it (`forward.rs`) and the drafter that reads it (`dspark.rs`).

use std::collections::VecDeque;

use super::hc;

/// One captured position.
#[derive(Clone, Debug)]
pub struct CapturedRow {
    pub pos: usize,
    /// Unique per evaluation: a position evaluated again gets a new one.
    pub seq: u64,
    /// The forward chunk that evaluated it (prefill chunk, decode step or verified block).
    pub batch: u64,
    /// targets × n_embd.
    pub data: Vec<f32>,
}

/// The captured rows of one session, oldest first, positions consecutive.
pub struct Capture {
    targets: Vec<usize>,
    n_embd: usize,
    /// 1 / n_hc for every stream: the uniform mean ds4 and DeepSeek's reference take.
    mean: Vec<f32>,
    /// Most rows kept (the oldest are dropped first).
    keep: usize,
    rows: VecDeque<CapturedRow>,
    next_seq: u64,
    next_batch: u64,
    /// The rows of the chunk being evaluated (n × targets × n_embd).
    chunk: Vec<f32>,
}

impl Capture {
    /// Capture of `targets` (main-model layers) for a model of `n_embd` and `n_hc` streams, keeping
    /// the last `keep` rows.
    pub fn new(targets: &[usize], n_embd: usize, n_hc: usize, keep: usize) -> Capture {
        Capture {
            targets: targets.to_vec(),
            n_embd,
            mean: vec![1.0 / n_hc as f32; n_hc],
            keep: keep.max(1),
            rows: VecDeque::new(),
            next_seq: 0,
            next_batch: 0,
            chunk: Vec::new(),
        }
    }

    /// Width of one row.
    pub fn width(&self) -> usize {
        self.targets.len() * self.n_embd
    }

    /// Record layer `layer`'s output HC state of the chunk's `n` rows (`hc`: n × n_hc × n_embd,
    /// stream-major per row), when it is a target layer.
    pub fn layer_output(&mut self, layer: usize, hc: &[f32], n: usize) {
        let Some(slot) = self.targets.iter().position(|&t| t == layer) else {
            return;
        };
        let (e, w, nt) = (self.n_embd, self.width(), self.targets.len());
        let hcd = self.mean.len() * e;
        self.chunk.resize(n * w, 0.0);
        for t in 0..n {
            let dst = &mut self.chunk[t * w + slot * e..t * w + slot * e + e];
            hc::weighted_sum(dst, &hc[t * hcd..(t + 1) * hcd], &self.mean, e);
        }
        debug_assert!(slot < nt);
    }

    /// The chunk of `n` rows at positions `p0..` is evaluated: its rows replace any at or after `p0`.
    pub fn chunk_done(&mut self, p0: usize, n: usize) {
        self.truncate(p0);
        let w = self.width();
        let batch = self.next_batch;
        self.next_batch += 1;
        for t in 0..n {
            self.rows.push_back(CapturedRow {
                pos: p0 + t,
                seq: self.next_seq,
                batch,
                data: self.chunk[t * w..(t + 1) * w].to_vec(),
            });
            self.next_seq += 1;
        }
        while self.rows.len() > self.keep {
            self.rows.pop_front();
        }
    }

    /// Drop the rows at positions ≥ `len` (the cache was cut back to `len` tokens).
    pub fn truncate(&mut self, len: usize) {
        while self.rows.back().is_some_and(|r| r.pos >= len) {
            self.rows.pop_back();
        }
    }

    /// Drop every row (a restored or imported cache: its positions were not captured here).
    pub fn clear(&mut self) {
        self.rows.clear();
    }

    /// The row of position `pos`, when captured.
    pub fn row(&self, pos: usize) -> Option<&CapturedRow> {
        let first = self.rows.front()?.pos;
        self.rows.get(pos.checked_sub(first)?)
    }

    /// The captured rows, oldest first.
    pub fn rows(&self) -> impl DoubleEndedIterator<Item = &CapturedRow> {
        self.rows.iter()
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        (self.rows.len() * self.width() + self.chunk.len()) * 4
    }
}
