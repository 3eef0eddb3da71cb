//! The cache of a session as plain rows, the same for every backend (docs/model.md#kv-cache): what a
//! session file's KV snapshot holds, so a cache saved on one backend is restored on another.
//!
//! After `n_past` tokens a layer holds: the newest min(n_past, window) raw rows, oldest first; where it
//! compresses, the n_past / ratio compressed rows and its compressor's kv and score state; where it has
//! an indexer, the same for the indexer. Every value is the f32 the backends keep (rows already
//! rounded through f16). The backends' own checkpoint payloads (`DeviceSession::save_state`) differ in
//! layout (the CPU keeps the window in order, the GPU a ring indexed by position), which is why this
//! neutral form exists.
//!
//! Owns the type, its byte encoding and the shape checks against a model; filling and reading it is
//! each backend's (`DeviceSession::export_cache` / `import_cache`).

use super::BackendError;
use super::payload::{PayloadReader, put_f32s, put_u32};
use crate::model::hparams::HParams;

/// A compressor's output rows and its running state.
#[derive(Clone, Debug, PartialEq)]
pub struct CompressorRows {
    /// `n_past / ratio` rows of the layer's head width.
    pub rows: Vec<f32>,
    /// Pending kv and score state (coff·ratio rows of coff·width, coff = 2 for ratio 4, else 1).
    pub kv: Vec<f32>,
    pub score: Vec<f32>,
}

/// One layer's cache.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerRows {
    /// The newest min(n_past, window) raw rows, oldest first.
    pub raw: Vec<f32>,
    pub comp: Option<CompressorRows>,
    pub index: Option<CompressorRows>,
}

/// A session's whole cache after `n_past` tokens, and the next-token logits.
#[derive(Clone, Debug, PartialEq)]
pub struct CacheRows {
    pub n_past: usize,
    pub logits: Vec<f32>,
    pub layers: Vec<LayerRows>,
}

/// Raw rows a layer holds after `n_past` tokens.
pub fn raw_rows(hp: &HParams, n_past: usize) -> usize {
    n_past.min(hp.sliding_window.max(1))
}

/// Compressed (or indexer) rows a layer of compression `ratio` holds after `n_past` tokens.
pub fn compressed_rows(ratio: usize, n_past: usize) -> usize {
    n_past.checked_div(ratio).unwrap_or(0)
}

/// Floats of one compressor state buffer (kv or score) of a layer of `ratio` and head `width`.
pub fn state_floats(ratio: usize, width: usize) -> usize {
    let coff = if ratio == 4 { 2 } else { 1 };
    coff * ratio * coff * width
}

impl CacheRows {
    /// Appends the rows: n_past, n_vocab logits, then per layer its raw rows and, where the model
    /// has them, the compressed and indexer rows with their states (all counts follow from the
    /// model and n_past, so none is stored).
    pub fn encode(&self, out: &mut Vec<u8>) {
        put_u32(out, self.n_past as u32);
        put_f32s(out, &self.logits);
        for l in &self.layers {
            put_f32s(out, &l.raw);
            for c in l.comp.iter().chain(l.index.iter()) {
                put_f32s(out, &c.rows);
                put_f32s(out, &c.kv);
                put_f32s(out, &c.score);
            }
        }
    }

    /// Reads rows encoded for a model of `hp`.
    pub fn decode(r: &mut PayloadReader<'_>, hp: &HParams) -> Result<CacheRows, BackendError> {
        let n_past = r.u32("token count")? as usize;
        let floats = |r: &mut PayloadReader<'_>, n: usize, what: &str| -> Result<Vec<f32>, BackendError> {
            let mut v = vec![0f32; n];
            r.f32s(&mut v, what)?;
            Ok(v)
        };
        let logits = floats(r, hp.n_vocab, "logits")?;
        let mut layers = Vec::with_capacity(hp.n_layer);
        for l in 0..hp.n_layer {
            let raw = floats(r, raw_rows(hp, n_past) * hp.head_dim, &format!("layer {l} raw rows"))?;
            let ratio = hp.ratio(l) as usize;
            let mut part = |width: usize, name: &str| -> Result<CompressorRows, BackendError> {
                Ok(CompressorRows {
                    rows: floats(
                        r,
                        compressed_rows(ratio, n_past) * width,
                        &format!("layer {l} {name} rows"),
                    )?,
                    kv: floats(r, state_floats(ratio, width), &format!("layer {l} {name} state kv"))?,
                    score: floats(r, state_floats(ratio, width), &format!("layer {l} {name} state score"))?,
                })
            };
            let comp = (ratio != 0).then(|| part(hp.head_dim, "compressed")).transpose()?;
            let index = hp
                .has_indexer(l)
                .then(|| part(hp.idx_head_dim, "indexer"))
                .transpose()?;
            layers.push(LayerRows { raw, comp, index });
        }
        Ok(CacheRows { n_past, logits, layers })
    }

    /// Checks every size against a model of `hp` (what `decode` produces always passes; a backend
    /// calls this before writing anything).
    pub fn check(&self, hp: &HParams) -> Result<(), BackendError> {
        let bad = |m: String| Err(BackendError::BadCheckpoint(m));
        if self.logits.len() != hp.n_vocab {
            return bad(format!(
                "{} logits for a vocabulary of {}",
                self.logits.len(),
                hp.n_vocab
            ));
        }
        if self.layers.len() != hp.n_layer {
            return bad(format!("{} layers, the model has {}", self.layers.len(), hp.n_layer));
        }
        for (l, layer) in self.layers.iter().enumerate() {
            if layer.raw.len() != raw_rows(hp, self.n_past) * hp.head_dim {
                return bad(format!(
                    "layer {l}: {} raw floats for {} tokens",
                    layer.raw.len(),
                    self.n_past
                ));
            }
            let ratio = hp.ratio(l) as usize;
            for (part, present, width, name) in [
                (&layer.comp, ratio != 0, hp.head_dim, "compressed"),
                (&layer.index, hp.has_indexer(l), hp.idx_head_dim, "indexer"),
            ] {
                match part {
                    None if !present => {}
                    Some(c)
                        if present
                            && c.rows.len() == compressed_rows(ratio, self.n_past) * width
                            && c.kv.len() == state_floats(ratio, width)
                            && c.score.len() == state_floats(ratio, width) => {}
                    _ => return bad(format!("layer {l}: {name} rows do not match the model")),
                }
            }
        }
        Ok(())
    }
}
