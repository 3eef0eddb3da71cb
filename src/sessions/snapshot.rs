//! The KV snapshot file (docs/sessions.md#kv-snapshots): a session's cache as backend-neutral rows
//! (`backend::cache_rows`), bound to the model file and to the exact tokens it holds. Little endian:
//!
//! * magic `DS4KVSNP`, version (u32), 0 (u32);
//! * the model's identity: file size (u64), header hash (u64);
//! * the model's shape: layers, vocabulary, head dim, indexer head dim, sliding window (u32 each);
//! * the token count (u32), the hash of the token ids (u64), the token ids (u32 each);
//! * the cache rows (`CacheRows::encode`);
//! * the hash of every byte before it (u64).
//!
//! Owns the format and its checks; every rejection is one line saying what does not match.

use std::io::Write;
use std::path::Path;

use super::atomic::write_atomic_with;
use super::identity::{ModelIdentity, hash64};
use crate::backend::cache_rows::CacheRows;
use crate::backend::payload::{PayloadReader, put_u32};
use crate::model::hparams::HParams;

pub const MAGIC: &[u8; 8] = b"DS4KVSNP";
pub const VERSION: u32 = 1;

/// What a snapshot file holds.
#[derive(Clone, Debug, PartialEq)]
pub struct Snapshot {
    /// The tokens the cache holds, in order.
    pub tokens: Vec<u32>,
    pub rows: CacheRows,
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// The hash of token ids as a snapshot stores it: `hash64` of their little-endian bytes (the prompt
/// store names its files by it).
pub fn token_hash(tokens: &[u32]) -> u64 {
    let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    hash64(&bytes)
}

fn shape(hp: &HParams) -> [u32; 5] {
    [
        hp.n_layer as u32,
        hp.n_vocab as u32,
        hp.head_dim as u32,
        hp.idx_head_dim as u32,
        hp.sliding_window as u32,
    ]
}

/// The file's bytes.
pub fn encode(id: ModelIdentity, hp: &HParams, tokens: &[u32], rows: &CacheRows) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(MAGIC);
    put_u32(&mut out, VERSION);
    put_u32(&mut out, 0);
    put_u64(&mut out, id.file_size);
    put_u64(&mut out, id.header_hash);
    for w in shape(hp) {
        put_u32(&mut out, w);
    }
    put_u32(&mut out, tokens.len() as u32);
    put_u64(&mut out, token_hash(tokens));
    for &t in tokens {
        put_u32(&mut out, t);
    }
    rows.encode(&mut out);
    let sum = hash64(&out);
    put_u64(&mut out, sum);
    out
}

/// Writes the snapshot atomically (temporary file, fsync, rename; the directory is created);
/// returns its size. On failure
/// (a full disk) the old file stays as it was.
pub fn save(path: &Path, id: ModelIdentity, hp: &HParams, tokens: &[u32], rows: &CacheRows) -> Result<u64, String> {
    let bytes = encode(id, hp, tokens, rows);
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    write_atomic_with(path, |f| f.write_all(&bytes)).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(bytes.len() as u64)
}

/// Bytes before the token ids: magic, version, flags, identity, shape, token count, token hash.
const HEADER_BYTES: usize = 8 + 4 + 4 + 8 + 8 + 5 * 4 + 4 + 8;

fn one_line(e: crate::backend::BackendError) -> String {
    match e {
        crate::backend::BackendError::BadCheckpoint(m) => m,
        other => other.to_string(),
    }
}

fn read_u64(r: &mut PayloadReader<'_>, what: &str) -> Result<u64, String> {
    let lo = r.u32(what).map_err(one_line)? as u64;
    let hi = r.u32(what).map_err(one_line)? as u64;
    Ok(lo | hi << 32)
}

/// Checks everything up to the token ids and returns them with the reader after them. `whole`:
/// `bytes` is the whole file, so the checksum is checked too (after the identity, as documented);
/// otherwise `bytes` may stop after the token ids.
fn header<'a>(
    bytes: &'a [u8],
    id: ModelIdentity,
    hp: &HParams,
    whole: bool,
) -> Result<(Vec<u32>, PayloadReader<'a>), String> {
    if bytes.len() < MAGIC.len() + 8 {
        return Err(format!("{} bytes, too short for a snapshot", bytes.len()));
    }
    if &bytes[..8] != MAGIC {
        return Err("not a ds4-chat KV snapshot (bad magic)".into());
    }
    let mut r = PayloadReader::new(&bytes[8..]);
    let version = r.u32("version").map_err(one_line)?;
    if version != VERSION {
        return Err(format!("version {version}, this build reads version {VERSION}"));
    }
    if bytes.len() < 16 + 8 {
        return Err("truncated header".into());
    }
    r.u32("flags").map_err(one_line)?;
    let saved = ModelIdentity {
        file_size: read_u64(&mut r, "model size")?,
        header_hash: read_u64(&mut r, "model hash")?,
    };
    if saved != id {
        return Err(format!(
            "made for another model file ({} bytes, hash {:016x}; this one is {} bytes, hash {:016x})",
            saved.file_size, saved.header_hash, id.file_size, id.header_hash
        ));
    }
    if whole {
        let (body, sum) = bytes.split_at(bytes.len() - 8);
        if hash64(body).to_le_bytes() != sum {
            return Err("checksum mismatch (the file is damaged or truncated)".into());
        }
    }
    let names = ["layers", "vocabulary", "head dim", "indexer head dim", "sliding window"];
    for (want, name) in shape(hp).into_iter().zip(names) {
        let got = r.u32(name).map_err(one_line)?;
        if got != want {
            return Err(format!("{name} {got} does not match the model ({want})"));
        }
    }
    let n = r.u32("token count").map_err(one_line)? as usize;
    let hash = read_u64(&mut r, "token hash")?;
    if n.saturating_mul(4) > r.remaining() {
        return Err(format!("{n} tokens do not fit in the file"));
    }
    let mut tokens = Vec::with_capacity(n);
    for _ in 0..n {
        let t = r.u32("token ids").map_err(one_line)?;
        if t as usize >= hp.n_vocab {
            return Err(format!("token id {t} outside the vocabulary ({})", hp.n_vocab));
        }
        tokens.push(t);
    }
    if token_hash(&tokens) != hash {
        return Err("the token ids do not match their hash".into());
    }
    Ok((tokens, r))
}

/// Reads and checks a snapshot for the model `id` of shape `hp`.
pub fn decode(bytes: &[u8], id: ModelIdentity, hp: &HParams) -> Result<Snapshot, String> {
    let (tokens, r) = header(bytes, id, hp, true)?;
    let n = tokens.len();
    if r.remaining() < 8 {
        return Err("truncated after the token ids".into());
    }
    let rows_bytes = &bytes[bytes.len() - r.remaining()..bytes.len() - 8];
    let mut rr = PayloadReader::new(rows_bytes);
    let rows = CacheRows::decode(&mut rr, hp).map_err(one_line)?;
    if rows.n_past != n {
        return Err(format!("the cache holds {} tokens, the file lists {n}", rows.n_past));
    }
    if rr.remaining() != 0 {
        return Err(format!("{} bytes after the cache rows", rr.remaining()));
    }
    Ok(Snapshot { tokens, rows })
}

/// The token ids a snapshot file holds, read from its head only (an index of many snapshots reads
/// them all at start-up); the rows and the checksum are checked when the file is `load`ed. Does not
/// mark the file used.
pub fn read_tokens(path: &Path, id: ModelIdentity, hp: &HParams) -> Result<Vec<u32>, String> {
    use std::io::Read;
    let fail = |e: std::io::Error| format!("cannot read {}: {e}", path.display());
    let mut f = std::fs::File::open(path).map_err(fail)?;
    let size = f.metadata().map_err(fail)?.len();
    let mut head = vec![0u8; HEADER_BYTES.min(size as usize)];
    f.read_exact(&mut head).map_err(fail)?;
    if head.len() == HEADER_BYTES {
        let n = u32::from_le_bytes(head[HEADER_BYTES - 12..HEADER_BYTES - 8].try_into().expect("4 bytes")) as u64;
        // The token ids must leave room for the checksum at least; a count past the file is refused
        // by `header` without reading it.
        let ids = (n * 4).min(size.saturating_sub(HEADER_BYTES as u64 + 8));
        let mut rest = vec![0u8; ids as usize];
        f.read_exact(&mut rest).map_err(fail)?;
        head.extend_from_slice(&rest);
    }
    header(&head, id, hp, false).map(|(tokens, _)| tokens)
}

/// Reads a snapshot file; a successful read marks it used (its modification time, the budget's
/// LRU order).
pub fn load(path: &Path, id: ModelIdentity, hp: &HParams) -> Result<Snapshot, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let snap = decode(&bytes, id, hp)?;
    super::budget::touch(path);
    Ok(snap)
}
