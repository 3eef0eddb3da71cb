//! The checkpoint payload (docs/model.md#checkpoints, "DS4 session payload"): token ids, next-token logits and
//! every layer's live cache rows and compressor states, little endian. Layout fields come from the model's
//! hyperparameters, so tiny models serialize with their own dimensions.
//!
//! Owns serialization and its validation, and the conversion to and from the backend-neutral rows
//! (`backend::cache_rows`); a rejected payload leaves the backend untouched.

use super::cache::{self, Rows};
use super::compressor::CompressorState;
use super::{BackendError, CpuSession};
use crate::backend::cache_rows::{CacheRows, CompressorRows, LayerRows};
use crate::backend::payload::{PayloadReader, put_f32s, put_u32};

const MAGIC: u32 = 0x3456_5344; // "DSV4"
const VERSION: u32 = 1;
const HEADER_WORDS: usize = 13;

/// Compressed-row capacity reported in the header: that of the smallest nonzero ratio.
fn header(b: &CpuSession) -> [u32; HEADER_WORDS] {
    let hp = &b.model.hp;
    let n = b.tokens.len();
    let raw_cap = cache::raw_cap(hp, b.ctx);
    [
        MAGIC,
        VERSION,
        b.ctx as u32,
        b.scratch.n_max as u32,
        raw_cap as u32,
        hp.sliding_window.min(b.ctx) as u32,
        cache::max_comp_cap(&b.model.hp, b.ctx) as u32,
        n as u32,
        hp.n_layer as u32,
        hp.head_dim as u32,
        hp.idx_head_dim as u32,
        hp.n_vocab as u32,
        raw_cap.min(n) as u32,
    ]
}

pub fn save(b: &CpuSession) -> Vec<u8> {
    let mut out = Vec::new();
    for w in header(b) {
        put_u32(&mut out, w);
    }
    for &t in &b.tokens {
        put_u32(&mut out, t);
    }
    put_f32s(&mut out, &b.logits);
    for c in &b.caches {
        put_u32(&mut out, c.comp.as_ref().map_or(0, |(r, _)| r.n) as u32);
    }
    for c in &b.caches {
        put_u32(&mut out, c.index.as_ref().map_or(0, |(r, _)| r.n) as u32);
    }
    for c in &b.caches {
        put_f32s(&mut out, c.raw.rows.live());
        for (rows, st) in c.comp.iter().chain(c.index.iter()) {
            put_f32s(&mut out, rows.live());
            put_f32s(&mut out, &st.kv);
            put_f32s(&mut out, &st.score);
        }
    }
    out
}

fn fill_rows(r: &mut PayloadReader<'_>, rows: &mut Rows, n: usize, what: &str) -> Result<(), BackendError> {
    if n > rows.cap {
        return Err(BackendError::BadCheckpoint(format!(
            "{what}: {n} rows exceed the capacity {}",
            rows.cap
        )));
    }
    let w = rows.width;
    r.f32s(&mut rows.data[..n * w], what)?;
    rows.n = n;
    Ok(())
}

pub fn load(b: &mut CpuSession, bytes: &[u8]) -> Result<(), BackendError> {
    let bad = |m: String| Err(BackendError::BadCheckpoint(m));
    let mut r = PayloadReader::new(bytes);
    let mut h = [0u32; HEADER_WORDS];
    for (i, w) in h.iter_mut().enumerate() {
        *w = r.u32(&format!("header word {i}"))?;
    }
    let want = header(b);
    if h[0] != MAGIC {
        return bad(format!("magic {:#010x}, expected {MAGIC:#010x} (\"DSV4\")", h[0]));
    }
    if h[1] != VERSION {
        return bad(format!("version {}, expected {VERSION}", h[1]));
    }
    let names = ["layers", "head dim", "indexer head dim", "vocabulary"];
    for (k, name) in (8..12).zip(names) {
        if h[k] != want[k] {
            return bad(format!("{name} {} does not match the model ({})", h[k], want[k]));
        }
    }
    let (saved_ctx, n) = (h[2] as usize, h[7] as usize);
    if saved_ctx > b.ctx {
        return bad(format!(
            "saved context {saved_ctx} is larger than this session's {}",
            b.ctx
        ));
    }
    if n > b.ctx {
        return bad(format!("{n} tokens do not fit context {}", b.ctx));
    }
    if h[3] != want[3] {
        return bad(format!(
            "prefill chunk {} differs from this session's {}",
            h[3], want[3]
        ));
    }
    if h[5] != want[5] {
        return bad(format!("raw window {} differs from this session's {}", h[5], want[5]));
    }
    let raw_live = h[12] as usize;
    if raw_live != cache::raw_cap(&b.model.hp, b.ctx).min(n) {
        return bad(format!("{raw_live} raw rows for {n} tokens"));
    }
    let n_layer = b.model.hp.n_layer;
    let n_vocab = b.model.hp.n_vocab;
    // Parse into copies first so a bad payload leaves the live state alone.
    let mut tokens = Vec::with_capacity(n);
    for _ in 0..n {
        let t = r.u32("token ids")?;
        if t as usize >= n_vocab {
            return bad(format!("token id {t} outside the vocabulary ({n_vocab})"));
        }
        tokens.push(t);
    }
    let mut logits = vec![0.0f32; n_vocab];
    r.f32s(&mut logits, "logits")?;
    let mut n_comp = vec![0usize; n_layer];
    let mut n_index = vec![0usize; n_layer];
    for v in n_comp.iter_mut() {
        *v = r.u32("compressed row counts")? as usize;
    }
    for v in n_index.iter_mut() {
        *v = r.u32("indexer row counts")? as usize;
    }
    let mut caches = b.caches.clone();
    for (l, c) in caches.iter_mut().enumerate() {
        c.reset();
        fill_rows(&mut r, &mut c.raw.rows, raw_live, &format!("layer {l} raw rows"))?;
        if c.comp.is_none() && n_comp[l] != 0 {
            return bad(format!(
                "layer {l} is not compressed but has {} compressed rows",
                n_comp[l]
            ));
        }
        if c.index.is_none() && n_index[l] != 0 {
            return bad(format!("layer {l} has no indexer but has {} indexer rows", n_index[l]));
        }
        for (kind, counts, slot) in [
            ("compressed", &n_comp, &mut c.comp),
            ("indexer", &n_index, &mut c.index),
        ] {
            if let Some((rows, st)) = slot.as_mut() {
                fill_rows(&mut r, rows, counts[l], &format!("layer {l} {kind} rows"))?;
                r.f32s(&mut st.kv, &format!("layer {l} {kind} state kv"))?;
                r.f32s(&mut st.score, &format!("layer {l} {kind} state score"))?;
            }
        }
    }
    if r.remaining() != 0 {
        return bad(format!("{} trailing bytes after the payload", r.remaining()));
    }
    b.caches = caches;
    b.tokens.clear();
    b.tokens.extend_from_slice(&tokens);
    b.logits = logits;
    Ok(())
}

/// The cache as backend-neutral rows (`cache_rows`).
pub fn export(b: &CpuSession) -> CacheRows {
    let part = |(rows, st): &(Rows, CompressorState)| CompressorRows {
        rows: rows.live().to_vec(),
        kv: st.kv.clone(),
        score: st.score.clone(),
    };
    CacheRows {
        n_past: b.tokens.len(),
        logits: b.logits.clone(),
        layers: b
            .caches
            .iter()
            .map(|c| LayerRows {
                raw: c.raw.rows.live().to_vec(),
                comp: c.comp.as_ref().map(part),
                index: c.index.as_ref().map(part),
            })
            .collect(),
    }
}

/// Restores neutral rows holding `tokens`; checked completely first, so a rejected one leaves the
/// backend untouched.
pub fn import(b: &mut CpuSession, rows: &CacheRows, tokens: &[u32]) -> Result<(), BackendError> {
    let bad = |m: String| Err(BackendError::BadCheckpoint(m));
    rows.check(&b.model.hp)?;
    if rows.n_past != tokens.len() {
        return bad(format!("{} cached tokens, {} token ids", rows.n_past, tokens.len()));
    }
    if tokens.len() >= b.ctx {
        return bad(format!("{} tokens do not fit context {}", tokens.len(), b.ctx));
    }
    if let Some(t) = tokens.iter().find(|&&t| t as usize >= b.model.hp.n_vocab) {
        return bad(format!("token id {t} outside the vocabulary ({})", b.model.hp.n_vocab));
    }
    let mut caches = b.caches.clone();
    for (c, l) in caches.iter_mut().zip(&rows.layers) {
        c.reset();
        let fill = |dst: &mut Rows, src: &[f32]| -> Result<(), BackendError> {
            let n = src.len() / dst.width;
            if n > dst.cap {
                return Err(BackendError::BadCheckpoint(format!(
                    "{n} rows exceed the capacity {}",
                    dst.cap
                )));
            }
            dst.data[..src.len()].copy_from_slice(src);
            dst.n = n;
            Ok(())
        };
        fill(&mut c.raw.rows, &l.raw)?;
        for (dst, src) in c.comp.iter_mut().zip(&l.comp).chain(c.index.iter_mut().zip(&l.index)) {
            fill(&mut dst.0, &src.rows)?;
            dst.1.kv.copy_from_slice(&src.kv);
            dst.1.score.copy_from_slice(&src.score);
        }
    }
    b.caches = caches;
    b.tokens.clear();
    b.tokens.extend_from_slice(tokens);
    b.logits.clone_from(&rows.logits);
    Ok(())
}
