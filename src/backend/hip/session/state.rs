//! The checkpoint payload of `HipSession` (`DeviceSession::save_state` / `load_state`): what the session's
//! turn checkpoints (retry, edit, rewind) and `bench` save and restore on the GPU, playing the role
//! of the CPU's checkpoint payload (docs/model.md#checkpoints) for the device state. Little endian:
//!
//! * header, u32 words: magic "DS4H", version, ctx, n_past, n_layer, n_embd, head_dim,
//!   idx_head_dim, n_vocab, saved raw ring rows, n_hc;
//! * the next-token logits (n_vocab f32); the byte length of the HC split counters, then the counters;
//! * per layer: the raw KV ring as a ring of the sliding window's rows (attention reads no older
//!   row; the device ring is longer by a prefill chunk, and is rebuilt from it on load, its other
//!   rows zero); then, for the compressed rows and for the indexer rows where the layer has them:
//!   the live row count (n_past / ratio, docs/model.md#compressor), those rows, the compressor kv
//!   state and score state.
//!
//! Cache rows (ring, compressed, indexer) are written by `payload::put_rows`: f16 when that is
//! lossless, which it is for rows stored f16-rounded (docs/model.md#kv-cache), so a checkpoint
//! takes about half the bytes of the cache it restores. Version 1 payloads (whole ring, f32 rows)
//! still load. A payload is validated completely before anything is written, so a rejected one
//! leaves the session untouched; rows past the restored count are zeroed, so a restored session
//! computes bit for bit what a fresh evaluation of the same tokens computes. Owns the format and its
//! validation, and the conversion to and from the backend-neutral rows (`backend::cache_rows`: the
//! ring read in position order, the HC counters left at zero, as they are between launches).

use super::{HipSession, dev};
use crate::backend::BackendError;
use crate::backend::cache_rows::{self, CacheRows, CompressorRows, LayerRows};
use crate::backend::hip::kernels;
use crate::backend::payload::{PayloadReader, put_f32s, put_rows, put_u32};
use std::borrow::Cow;

const MAGIC: u32 = u32::from_le_bytes(*b"DS4H");
/// Version 2: window-sized ring, rows through `put_rows`. Version 1: whole ring, rows f32 bare.
const VERSION: u32 = 2;
const HEADER_WORDS: usize = 11;

/// The header of this session, word 9 being `ring` rows.
fn header(b: &HipSession, ring: usize) -> [u32; HEADER_WORDS] {
    let hp = &b.model.hp;
    [
        MAGIC,
        VERSION,
        b.ctx as u32,
        b.n_past as u32,
        hp.n_layer as u32,
        hp.n_embd as u32,
        hp.head_dim as u32,
        hp.idx_head_dim as u32,
        hp.n_vocab as u32,
        ring as u32,
        hp.n_hc as u32,
    ]
}

/// Ring rows a payload saves: the sliding window (never more than the device ring).
fn saved_ring_rows(b: &HipSession) -> usize {
    b.model.hp.sliding_window.max(1).min(ring_rows(b))
}

/// Rows of the raw KV rings of this session (all layers alike; the row of position p is p % rows).
fn ring_rows(b: &HipSession) -> usize {
    b.layers
        .first()
        .map_or(0, |l| l.ring.len_bytes() / (4 * b.model.hp.head_dim))
}

/// The ring of a session with `dst_rows` rows holding what a ring of `src_rows` rows holds after
/// `n_past` tokens: the newest min(src, dst, n_past) positions moved to their rows, the rest zero.
/// Attention reads only the sliding window (docs/model.md#kv-cache), so rings at least that long carry
/// over.
fn remap_ring(src: &[u8], src_rows: usize, dst_rows: usize, n_past: usize) -> Vec<u8> {
    let row = src.len() / src_rows.max(1);
    let mut dst = vec![0u8; row * dst_rows];
    for p in n_past - n_past.min(src_rows).min(dst_rows)..n_past {
        let (s, d) = (p % src_rows, p % dst_rows);
        dst[d * row..(d + 1) * row].copy_from_slice(&src[s * row..(s + 1) * row]);
    }
    dst
}

/// Compressed (or indexer) rows a layer of compression `ratio` holds after `n_past` tokens.
fn live_rows(ratio: u32, n_past: usize) -> usize {
    kernels::compressor_emitted(ratio, 0, n_past as u32).1 as usize
}

pub fn save(b: &HipSession) -> Result<Vec<u8>, BackendError> {
    b.stream.synchronize().map_err(dev)?;
    let mut out = Vec::new();
    let (rows_here, saved) = (ring_rows(b), saved_ring_rows(b));
    for w in header(b, saved) {
        put_u32(&mut out, w);
    }
    put_f32s(&mut out, crate::backend::DeviceSession::logits(b));
    let read = |buf: &crate::backend::hip::runtime::DeviceBuffer, n: usize| -> Result<Vec<u8>, BackendError> {
        let mut host = vec![0u8; n];
        buf.copy_to_host(0, &mut host).map_err(dev)?;
        Ok(host)
    };
    let counter = b.acts.counter.len_bytes();
    put_u32(&mut out, counter as u32);
    out.extend_from_slice(&read(&b.acts.counter, counter)?);
    for (l, ls) in b.layers.iter().enumerate() {
        let ring = read(&ls.ring, ls.ring.len_bytes())?;
        put_rows(&mut out, &remap_ring(&ring, rows_here, saved, b.n_past));
        let ratio = b.model.hp.ratio(l);
        for (st, width) in [(&ls.comp, b.model.hp.head_dim), (&ls.index, b.model.hp.idx_head_dim)] {
            if let Some(st) = st {
                let rows = live_rows(ratio, b.n_past);
                put_u32(&mut out, rows as u32);
                put_rows(&mut out, &read(&st[0], rows * width * 4)?);
                out.extend_from_slice(&read(&st[1], st[1].len_bytes())?);
                out.extend_from_slice(&read(&st[2], st[2].len_bytes())?);
            }
        }
    }
    Ok(out)
}

/// One device write of a validated payload: `bytes` into `buffer` from offset 0, the rest zeroed.
struct Write<'a> {
    layer: usize,
    /// 0 = ring, 1 = compressed state, 2 = indexer state; then the buffer within the state.
    slot: (u8, usize),
    bytes: Cow<'a, [u8]>,
}

pub fn load(b: &mut HipSession, payload: &[u8]) -> Result<(), BackendError> {
    let bad = |m: String| Err(BackendError::BadCheckpoint(m));
    let mut r = PayloadReader::new(payload);
    let mut h = [0u32; HEADER_WORDS];
    for (i, w) in h.iter_mut().enumerate() {
        *w = r.u32(&format!("header word {i}"))?;
    }
    let want = header(b, ring_rows(b));
    if h[0] != MAGIC {
        return bad(format!(
            "magic {:#010x}, expected {MAGIC:#010x} (\"DS4H\", a HIP session)",
            h[0]
        ));
    }
    let version = h[1];
    if !(1..=VERSION).contains(&version) {
        return bad(format!("version {version}, expected 1..={VERSION}"));
    }
    let names = [
        "layers",
        "embedding width",
        "head dim",
        "indexer head dim",
        "vocabulary",
        "",
        "HC streams",
    ];
    for (k, name) in (4..HEADER_WORDS).zip(names) {
        if k != 9 && h[k] != want[k] {
            return bad(format!("{name} {} does not match the model ({})", h[k], want[k]));
        }
    }
    let n_past = h[3] as usize;
    if n_past > b.ctx {
        return bad(format!("{n_past} tokens do not fit this session's context {}", b.ctx));
    }
    let hp = &b.model.hp;
    // Rings of another length (sessions whose prefill chunk differs) carry over when both hold
    // the sliding window.
    let (saved_rows, rows_here) = (h[9] as usize, want[9] as usize);
    if saved_rows == 0 || (saved_rows != rows_here && saved_rows.min(rows_here) < hp.sliding_window) {
        return bad(format!(
            "raw ring of {saved_rows} rows cannot be restored into this session's {rows_here} (window {})",
            hp.sliding_window
        ));
    }
    let logits: Vec<f32> = r
        .take(4 * hp.n_vocab, "logits")?
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let counter_len = r.u32("HC counter length")? as usize;
    let counter = r.take(counter_len, "HC counters")?;
    let mut writes = Vec::new();
    let row_bytes = 4 * hp.head_dim;
    for l in 0..b.layers.len() {
        let what = format!("layer {l} raw ring");
        let ring = read_rows(&mut r, version, saved_rows * row_bytes / 4, &what)?;
        let ring = if saved_rows == rows_here {
            ring
        } else {
            Cow::Owned(remap_ring(&ring, saved_rows, rows_here, n_past))
        };
        writes.push(Write {
            layer: l,
            slot: (0, 0),
            bytes: ring,
        });
        layer_states(&mut r, b, l, n_past, version, &mut writes)?;
    }
    if r.remaining() != 0 {
        return bad(format!("{} bytes after the last layer", r.remaining()));
    }
    // Validated: write it. A device failure part way leaves an unknown state, so it is cleared.
    let result = write_all(b, &writes, counter);
    if let Err(e) = result {
        let _ = b.clear_state();
        return Err(e);
    }
    b.n_past = n_past;
    b.restore_logits(logits)
}

/// `n` floats of cache rows: through `payload::put_rows` from version 2 on, bare f32 before.
fn read_rows<'a>(r: &mut PayloadReader<'a>, version: u32, n: usize, what: &str) -> Result<Cow<'a, [u8]>, BackendError> {
    if version >= 2 {
        r.rows(n, what)
    } else {
        Ok(Cow::Borrowed(r.take(4 * n, what)?))
    }
}

/// Read and check layer `l`'s compressed and indexer row counts, rows and states (they follow
/// its ring in the payload).
fn layer_states<'a>(
    r: &mut PayloadReader<'a>,
    b: &HipSession,
    l: usize,
    n_past: usize,
    version: u32,
    writes: &mut Vec<Write<'a>>,
) -> Result<(), BackendError> {
    let bad = |m: String| Err(BackendError::BadCheckpoint(m));
    let hp = &b.model.hp;
    let ls = &b.layers[l];
    let ratio = hp.ratio(l);
    for (kind, (st, width)) in [(&ls.comp, hp.head_dim), (&ls.index, hp.idx_head_dim)]
        .into_iter()
        .enumerate()
    {
        let Some(st) = st else { continue };
        let name = if kind == 0 { "compressed" } else { "indexer" };
        let rows = r.u32(&format!("layer {l} {name} row count"))? as usize;
        if rows != live_rows(ratio, n_past) || rows > ls.comp_cap {
            return bad(format!(
                "layer {l}: {rows} {name} rows for {n_past} tokens (expected {}, capacity {})",
                live_rows(ratio, n_past),
                ls.comp_cap
            ));
        }
        let row_bytes = read_rows(r, version, rows * width, &format!("layer {l} {name} rows"))?;
        writes.push(Write {
            layer: l,
            slot: (kind as u8 + 1, 0),
            bytes: row_bytes,
        });
        for (i, what) in [(1, "state kv"), (2, "state score")] {
            let bytes = r.take(st[i].len_bytes(), &format!("layer {l} {name} {what}"))?;
            writes.push(Write {
                layer: l,
                slot: (kind as u8 + 1, i),
                bytes: Cow::Borrowed(bytes),
            });
        }
    }
    Ok(())
}

fn write_all(b: &mut HipSession, writes: &[Write<'_>], counter: &[u8]) -> Result<(), BackendError> {
    b.stream.synchronize().map_err(dev)?;
    // Sessions with other prefill chunks have more or fewer per-token counters; the rest start at 0.
    let n = counter.len().min(b.acts.counter.len_bytes());
    b.acts.counter.copy_from_host(0, &counter[..n]).map_err(dev)?;
    let rest = b.acts.counter.len_bytes() - n;
    if rest > 0 {
        b.acts.counter.fill_bytes_async(n, rest, 0, &b.stream).map_err(dev)?;
    }
    for w in writes {
        let ls = &mut b.layers[w.layer];
        let buf = match w.slot {
            (0, _) => &mut ls.ring,
            (1, i) => &mut ls.comp.as_mut().expect("validated against this model")[i],
            (_, i) => &mut ls.index.as_mut().expect("validated against this model")[i],
        };
        buf.copy_from_host(0, &w.bytes).map_err(dev)?;
        let rest = buf.len_bytes() - w.bytes.len();
        if rest > 0 {
            buf.fill_bytes_async(w.bytes.len(), rest, 0, &b.stream).map_err(dev)?;
        }
    }
    b.stream.synchronize().map_err(dev)
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(v.len() * 4);
    put_f32s(&mut out, v);
    out
}

fn bytes_f32(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// The cache as backend-neutral rows: the newest window positions of each ring in order.
pub fn export(b: &HipSession) -> Result<CacheRows, BackendError> {
    b.stream.synchronize().map_err(dev)?;
    let hp = &b.model.hp;
    let (n, ring) = (b.n_past, ring_rows(b));
    let read = |buf: &crate::backend::hip::runtime::DeviceBuffer, len: usize| -> Result<Vec<f32>, BackendError> {
        let mut bytes = vec![0u8; len];
        buf.copy_to_host(0, &mut bytes).map_err(dev)?;
        Ok(bytes_f32(&bytes))
    };
    let mut layers = Vec::with_capacity(b.layers.len());
    for (l, ls) in b.layers.iter().enumerate() {
        let all = read(&ls.ring, ls.ring.len_bytes())?;
        let d = hp.head_dim;
        let mut raw = Vec::with_capacity(cache_rows::raw_rows(hp, n) * d);
        for p in n - cache_rows::raw_rows(hp, n)..n {
            raw.extend_from_slice(&all[(p % ring) * d..(p % ring + 1) * d]);
        }
        let ratio = hp.ratio(l);
        let part = |st: &Option<[crate::backend::hip::runtime::DeviceBuffer; 3]>, width: usize| {
            st.as_ref()
                .map(|st| -> Result<CompressorRows, BackendError> {
                    Ok(CompressorRows {
                        rows: read(&st[0], live_rows(ratio, n) * width * 4)?,
                        kv: read(&st[1], st[1].len_bytes())?,
                        score: read(&st[2], st[2].len_bytes())?,
                    })
                })
                .transpose()
        };
        layers.push(LayerRows {
            raw,
            comp: part(&ls.comp, hp.head_dim)?,
            index: part(&ls.index, hp.idx_head_dim)?,
        });
    }
    Ok(CacheRows {
        n_past: n,
        logits: crate::backend::DeviceSession::logits(b).to_vec(),
        layers,
    })
}

/// Restores neutral rows of `n_past` tokens: each raw row to its ring slot, the rest zero.
pub fn import(b: &mut HipSession, rows: &CacheRows, n_past: usize) -> Result<(), BackendError> {
    let bad = |m: String| Err(BackendError::BadCheckpoint(m));
    let hp = b.model.hp.clone();
    rows.check(&hp)?;
    if rows.n_past != n_past || n_past >= b.ctx {
        return bad(format!(
            "{} cached tokens for {n_past} token ids in a context of {}",
            rows.n_past, b.ctx
        ));
    }
    let (ring, d) = (ring_rows(b), hp.head_dim);
    let mut owned = Vec::new();
    for (l, (ls, lr)) in b.layers.iter().zip(&rows.layers).enumerate() {
        let mut ring_bytes = vec![0u8; ls.ring.len_bytes()];
        let first = n_past - lr.raw.len() / d;
        for (i, row) in lr.raw.chunks_exact(d).enumerate() {
            let slot = (first + i) % ring;
            ring_bytes[slot * d * 4..(slot + 1) * d * 4].copy_from_slice(&f32_bytes(row));
        }
        owned.push(((l, (0u8, 0usize)), ring_bytes));
        let compressed = cache_rows::compressed_rows(hp.ratio(l) as usize, n_past);
        if compressed > ls.comp_cap && (lr.comp.is_some() || lr.index.is_some()) {
            return bad(format!(
                "layer {l}: {compressed} compressed rows exceed the capacity {}",
                ls.comp_cap
            ));
        }
        for (kind, part) in [(1u8, &lr.comp), (2u8, &lr.index)] {
            for (i, v) in part.iter().flat_map(|c| [&c.rows, &c.kv, &c.score]).enumerate() {
                owned.push(((l, (kind, i)), f32_bytes(v)));
            }
        }
    }
    let writes: Vec<Write<'_>> = owned
        .iter()
        .map(|((layer, slot), bytes)| Write {
            layer: *layer,
            slot: *slot,
            bytes: Cow::Borrowed(bytes),
        })
        .collect();
    if let Err(e) = write_all(b, &writes, &[]) {
        let _ = b.clear_state();
        return Err(e);
    }
    b.n_past = n_past;
    b.restore_logits(rows.logits.clone())
}

#[cfg(test)]
mod tests {
    use super::remap_ring;

    /// Rows tagged with their position: ring of 4 after 10 tokens holds positions 6..10 at rows
    /// p % 4 = 2, 3, 0, 1.
    fn ring(rows: usize, n_past: usize) -> Vec<u8> {
        let mut v = vec![0u8; rows * 2];
        for p in n_past.saturating_sub(rows)..n_past {
            v[(p % rows) * 2] = p as u8 + 1;
            v[(p % rows) * 2 + 1] = 0xAA;
        }
        v
    }

    #[test]
    fn rings_of_another_length_keep_the_newest_positions() {
        // Same length: unchanged.
        assert_eq!(remap_ring(&ring(4, 10), 4, 4, 10), ring(4, 10));
        // Longer destination: the 4 newest positions at p % 6, the rows of positions 4, 5 stay zero.
        let mut want = ring(6, 10);
        for p in [4usize, 5] {
            want[(p % 6) * 2] = 0;
            want[(p % 6) * 2 + 1] = 0;
        }
        assert_eq!(remap_ring(&ring(4, 10), 4, 6, 10), want);
        // Shorter destination: exactly the ring a 3-row session holds.
        assert_eq!(remap_ring(&ring(6, 10), 6, 3, 10), ring(3, 10));
        // Fewer tokens than rows.
        assert_eq!(remap_ring(&ring(6, 2), 6, 4, 2), ring(4, 2));
    }
}
