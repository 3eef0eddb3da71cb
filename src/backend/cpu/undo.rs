//! The undo log of a block verify (docs/model.md#block-verify-and-commit): while a block of draft
//! tokens runs through the forward pass, every cache write of every token is preceded by a record of
//! what it is about to overwrite, so `commit(keep)` can take the rejected tokens back, newest first,
//! and leave each layer cache bitwise as if they had never been evaluated. Nothing is re-evaluated.
//!
//! What one token touches per layer (docs/model.md#kv-cache, #compressor): one push into the raw window
//! (dropping the oldest row when full), one row of each compressor state (and at a ratio-4 window end
//! the move of rows 4..7 to 0..3), and at an emission one appended compressed/indexer row. The
//! indexer's selection is recomputed per token from these rows and holds no state of its own.
//!
//! Owns the record and its replay; the writes themselves stay in `forward.rs` / `cache.rs` /
//! `compressor.rs`.

use super::cache::{LayerCache, RawWindow, Rows};
use super::compressor::CompressorState;

/// Which compressor of a layer an entry belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// The attention compressor and its compressed rows.
    Comp,
    /// The indexer compressor and its indexer rows.
    Index,
}

#[derive(Clone, Copy, Debug)]
enum Change {
    /// A push into the raw window; `dropped` when the window was full and its oldest row (saved at
    /// `at`) fell out.
    RawPush { dropped: bool },
    /// Compressor state rows `first..first + n` (kv then score, saved at `at`) about to be written.
    State { part: Part, first: usize, n: usize },
    /// One row appended to the compressed or indexer rows.
    RowPush { part: Part },
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    /// Index of the token in the block.
    token: usize,
    layer: usize,
    change: Change,
    /// Offset of the saved floats in `UndoLog::saved`.
    at: usize,
}

/// The writes of one verified block, in the order they happened.
#[derive(Debug, Default)]
pub struct UndoLog {
    entries: Vec<Entry>,
    saved: Vec<f32>,
}

/// The state rows a push at `pos` writes (docs/model.md#compressor): its own row, and at a ratio-4
/// window end also rows 0..3, which receive rows 4..7.
fn state_rows(st: &CompressorState, pos: usize) -> (usize, usize) {
    let r = st.ratio;
    let window_end = (pos + 1).is_multiple_of(r);
    match (r, window_end) {
        (4, true) => (0, 8),
        (4, false) => (4 + pos % 4, 1),
        _ => (pos % r, 1),
    }
}

impl UndoLog {
    /// An empty log, keeping the allocations of `self`.
    pub fn clear(&mut self) {
        self.entries.clear();
        self.saved.clear();
    }

    /// Before block token `token` pushes a row into `raw` of `layer`.
    pub fn raw_push(&mut self, token: usize, layer: usize, raw: &RawWindow) {
        let rows = &raw.rows;
        let dropped = rows.n == rows.cap;
        let at = self.saved.len();
        if dropped {
            self.saved.extend_from_slice(&rows.data[..rows.width]);
        }
        self.entries.push(Entry {
            token,
            layer,
            change: Change::RawPush { dropped },
            at,
        });
    }

    /// Before block token `token` at position `pos` pushes its projections into `st`.
    pub fn state_push(&mut self, token: usize, layer: usize, part: Part, st: &CompressorState, pos: usize) {
        let (first, n) = state_rows(st, pos);
        let w = st.width();
        let at = self.saved.len();
        self.saved.extend_from_slice(&st.kv[first * w..(first + n) * w]);
        self.saved.extend_from_slice(&st.score[first * w..(first + n) * w]);
        self.entries.push(Entry {
            token,
            layer,
            change: Change::State { part, first, n },
            at,
        });
    }

    /// After block token `token` appended a row to the `part` rows of `layer`.
    pub fn row_push(&mut self, token: usize, layer: usize, part: Part) {
        self.entries.push(Entry {
            token,
            layer,
            change: Change::RowPush { part },
            at: self.saved.len(),
        });
    }

    /// Take back, newest first, every write of the block tokens `keep..`, then forget the log. The
    /// entries run layer-major (as the pass), so in each layer the writes of `keep..` are its newest.
    pub fn undo_from(&mut self, keep: usize, caches: &mut [LayerCache]) {
        for e in self.entries.iter().rev().filter(|e| e.token >= keep) {
            let cache = &mut caches[e.layer];
            match e.change {
                Change::RawPush { dropped } => unpush_raw(&mut cache.raw.rows, dropped.then(|| &self.saved[e.at..])),
                Change::State { part, first, n } => {
                    let st = &mut compressor(cache, part).1;
                    let w = st.width();
                    let (kv, score) = self.saved[e.at..e.at + 2 * n * w].split_at(n * w);
                    st.kv[first * w..(first + n) * w].copy_from_slice(kv);
                    st.score[first * w..(first + n) * w].copy_from_slice(score);
                }
                Change::RowPush { part } => compressor(cache, part).0.n -= 1,
            }
        }
        self.clear();
    }
}

fn compressor(cache: &mut LayerCache, part: Part) -> &mut (Rows, CompressorState) {
    let slot = match part {
        Part::Comp => cache.comp.as_mut(),
        Part::Index => cache.index.as_mut(),
    };
    slot.expect("an undo entry names a compressor the layer has")
}

/// Take back the newest push of the raw window: drop its last row, and when the push had dropped the
/// oldest row, move the rows back up by one and put that row first.
fn unpush_raw(rows: &mut Rows, dropped: Option<&[f32]>) {
    let w = rows.width;
    rows.n -= 1;
    if let Some(old) = dropped {
        rows.data.copy_within(..rows.n * w, w);
        rows.data[..w].copy_from_slice(&old[..w]);
        rows.n += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::hparams::HParams;

    /// Deterministic values in [-1, 1).
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 23) as f32) - 1.0
            })
            .collect()
    }

    /// Token `pos`'s writes into `cache` in the order of the forward pass, recorded in `log` when
    /// given: the raw push, then per compressor the state push and, at an emission, a row (the
    /// pooled row stands in for the finished one; only the order of writes matters here).
    fn feed(cache: &mut LayerCache, layer: usize, t: usize, pos: usize, mut log: Option<&mut UndoLog>) {
        let seed = pos as u64 * 7 + 1;
        let raw_row = values(cache.raw.rows.width, seed);
        if let Some(l) = log.as_deref_mut() {
            l.raw_push(t, layer, &cache.raw);
        }
        cache.raw.push(&raw_row);
        for (part, slot) in [(Part::Comp, &mut cache.comp), (Part::Index, &mut cache.index)] {
            let Some((rows, st)) = slot.as_mut() else { continue };
            let w = st.width();
            let (kv, sc, ape) = (values(w, seed + 2), values(w, seed + 3), vec![0.25; w * st.ratio]);
            let mut out = vec![0.0; st.hd];
            if let Some(l) = log.as_deref_mut() {
                l.state_push(t, layer, part, st, pos);
            }
            if st.push(&kv, &sc, &ape, pos, &mut out) {
                assert!(rows.push(&out));
                if let Some(l) = log.as_deref_mut() {
                    l.row_push(t, layer, part);
                }
            }
        }
    }

    fn snapshot(c: &LayerCache) -> Vec<u32> {
        let mut v: Vec<f32> = c.raw.rows.live().to_vec();
        for (rows, st) in c.comp.iter().chain(c.index.iter()) {
            v.extend_from_slice(rows.live());
            v.extend_from_slice(&st.kv);
            v.extend_from_slice(&st.score);
            v.push(rows.n as f32);
        }
        v.push(c.raw.rows.n as f32);
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// A block longer than the raw window (so its own rows drop out too), across ratio-4 and
    /// ratio-128 emissions, taken back to every prefix: each layer equals the cache that only saw
    /// the kept tokens, bitwise.
    #[test]
    fn undo_from_every_offset_equals_feeding_only_the_kept_tokens() {
        let mut hp = HParams::tiny();
        hp.sliding_window = 4;
        let ctx = 160;
        // Layers 2 (ratio 4, with the indexer) and 3 (ratio 128) of the tiny schedule.
        let layers = [2usize, 3];
        assert_eq!((hp.ratio(2), hp.ratio(3)), (4, 128));
        let (p0, block) = (122, 9);
        let mut cases = 0;
        for keep in 0..=block {
            // `layer` of the log entries is the index into `caches`.
            let mut caches: Vec<LayerCache> = layers.iter().map(|&l| LayerCache::new(&hp, l, ctx)).collect();
            let mut want = caches.clone();
            let mut log = UndoLog::default();
            for i in 0..layers.len() {
                for pos in 0..p0 {
                    feed(&mut caches[i], i, 0, pos, None);
                }
                for t in 0..block {
                    feed(&mut caches[i], i, t, p0 + t, Some(&mut log));
                }
                for pos in 0..p0 + keep {
                    feed(&mut want[i], i, 0, pos, None);
                }
            }
            log.undo_from(keep, &mut caches);
            for (got, want) in caches.iter().zip(&want) {
                assert_eq!(snapshot(got), snapshot(want), "keep {keep}");
            }
            assert!(log.entries.is_empty() && log.saved.is_empty());
            cases += 1;
        }
        assert_eq!(cases, block + 1);
    }
}
