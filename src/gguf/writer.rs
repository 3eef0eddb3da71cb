//! GGUF v3 writer (docs/gguf.md#container): metadata of every value type, a tensor directory with aligned
//! offsets, and tensor data produced by a caller-supplied fill function, either into memory or streamed to a
//! file from several threads at precomputed offsets (`FileExt::write_at`), so files far larger than RAM
//! can be written without ever holding them.
//!
//! Owns the byte layout only; what the tensors contain is the caller's business (`genmodel`). The
//! layout is computed once (`GgufLayout::new`); every writing path emits exactly the bytes that
//! `reader.rs` parses back.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use rayon::prelude::*;

use super::error::GgufError;
use super::reader::{DEFAULT_ALIGNMENT, GGUF_MAGIC, GGUF_VERSION, MetaValue, vt};
use super::types::GgmlType;

/// A tensor to be written: name, element type and GGUF dims (dims[0] contiguous).
#[derive(Clone, Debug, PartialEq)]
pub struct TensorEntry {
    pub name: String,
    pub ty: GgmlType,
    pub dims: Vec<u64>,
}

impl TensorEntry {
    /// `name` of type `ty` with GGUF dims `dims`.
    pub fn new(name: &str, ty: GgmlType, dims: &[u64]) -> TensorEntry {
        TensorEntry {
            name: name.to_string(),
            ty,
            dims: dims.to_vec(),
        }
    }
}

/// A tensor with its place in the file.
#[derive(Clone, Debug, PartialEq)]
pub struct PlacedTensor {
    pub name: String,
    pub ty: GgmlType,
    pub dims: Vec<u64>,
    /// Absolute offset in the file (a multiple of the alignment).
    pub offset: u64,
    pub nbytes: u64,
}

/// One unit of parallel work: bytes `[start, start + len)` of tensor `tensor`, whole blocks only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunk {
    pub tensor: usize,
    /// Byte offset inside the tensor's data (a multiple of its block size).
    pub start: u64,
    pub len: u64,
}

/// The complete byte layout of a GGUF file: the serialized header (magic … tensor directory, zero
/// padded to the data section) and every tensor's absolute offset.
#[derive(Clone, Debug)]
pub struct GgufLayout {
    pub header: Vec<u8>,
    pub alignment: u64,
    pub data_offset: u64,
    pub tensors: Vec<PlacedTensor>,
    /// Total file size (the data section is padded to the alignment at the end).
    pub file_size: u64,
}

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    put_u64(out, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

/// Serialize one value without its type tag. Arrays check that every element has the declared type.
fn put_value(out: &mut Vec<u8>, v: &MetaValue, key: &str) -> Result<(), GgufError> {
    match v {
        MetaValue::U8(x) => out.push(*x),
        MetaValue::I8(x) => out.push(*x as u8),
        MetaValue::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U32(x) => put_u32(out, *x),
        MetaValue::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F32(x) => put_u32(out, x.to_bits()),
        MetaValue::Bool(x) => out.push(*x as u8),
        MetaValue::String(s) => put_str(out, s),
        MetaValue::U64(x) => put_u64(out, *x),
        MetaValue::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F64(x) => put_u64(out, x.to_bits()),
        MetaValue::Array(et, elems) => {
            if *et > vt::F64 {
                return Err(GgufError::msg(format!("key '{key}': unknown array element type {et}")));
            }
            put_u32(out, *et);
            put_u64(out, elems.len() as u64);
            for (i, e) in elems.iter().enumerate() {
                if e.type_id() != *et {
                    return Err(GgufError::msg(format!(
                        "key '{key}'[{i}]: element of type {}, array declares {}",
                        e.type_name(),
                        super::reader::type_name(*et)
                    )));
                }
                put_value(out, e, key)?;
            }
        }
    }
    Ok(())
}

/// Serialize a metadata entry: key, type id, value.
pub fn encode_kv(out: &mut Vec<u8>, key: &str, v: &MetaValue) -> Result<(), GgufError> {
    put_str(out, key);
    put_u32(out, v.type_id());
    put_value(out, v, key)
}

impl GgufLayout {
    /// Lay out a file. `general.alignment`, when present in `metadata`, must be a nonzero power-of-two
    /// u32 and sets the alignment (default 32). Errors name the key or tensor.
    pub fn new(metadata: &[(String, MetaValue)], tensors: &[TensorEntry]) -> Result<GgufLayout, GgufError> {
        let mut alignment = DEFAULT_ALIGNMENT;
        let mut keys = std::collections::HashSet::new();
        for (k, v) in metadata {
            if !keys.insert(k.as_str()) {
                return Err(GgufError::msg(format!("duplicate metadata key '{k}'")));
            }
            if k == "general.alignment" {
                match v {
                    MetaValue::U32(a) if *a > 0 && a.is_power_of_two() => alignment = *a as u64,
                    other => {
                        return Err(GgufError::msg(format!(
                            "key 'general.alignment': expected a nonzero power-of-two u32, found {other:?}"
                        )));
                    }
                }
            }
        }
        let mut header = Vec::new();
        put_u32(&mut header, GGUF_MAGIC);
        put_u32(&mut header, GGUF_VERSION);
        put_u64(&mut header, tensors.len() as u64);
        put_u64(&mut header, metadata.len() as u64);
        for (k, v) in metadata {
            encode_kv(&mut header, k, v)?;
        }
        let mut placed = Vec::with_capacity(tensors.len());
        let mut rel = 0u64;
        let mut names = std::collections::HashSet::new();
        for t in tensors {
            if !names.insert(t.name.as_str()) {
                return Err(GgufError::msg(format!("duplicate tensor '{}'", t.name)));
            }
            if t.dims.is_empty() || t.dims.len() > super::reader::MAX_DIMS {
                return Err(GgufError::msg(format!(
                    "tensor '{}': {} dimensions, expected 1..=8",
                    t.name,
                    t.dims.len()
                )));
            }
            let n = t.dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
            let be = t.ty.block_elems();
            let nbytes = match n {
                Some(n) if n.is_multiple_of(be) && t.dims[0].is_multiple_of(be) => t.ty.bytes_for(n),
                _ => None,
            }
            .ok_or_else(|| {
                GgufError::msg(format!(
                    "tensor '{}': dims {:?} are not whole {} blocks of {be} or overflow",
                    t.name, t.dims, t.ty
                ))
            })?;
            put_str(&mut header, &t.name);
            put_u32(&mut header, t.dims.len() as u32);
            for &d in &t.dims {
                put_u64(&mut header, d);
            }
            put_u32(&mut header, t.ty.id());
            put_u64(&mut header, rel);
            placed.push(PlacedTensor {
                name: t.name.clone(),
                ty: t.ty,
                dims: t.dims.clone(),
                offset: rel,
                nbytes,
            });
            rel = (rel + nbytes).div_ceil(alignment) * alignment;
        }
        let data_offset = (header.len() as u64).div_ceil(alignment) * alignment;
        header.resize(data_offset as usize, 0);
        for p in &mut placed {
            p.offset += data_offset;
        }
        Ok(GgufLayout {
            header,
            alignment,
            data_offset,
            tensors: placed,
            file_size: data_offset + rel,
        })
    }

    /// Sum of the tensors' bytes (without alignment padding).
    pub fn tensor_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.nbytes).sum()
    }

    /// Split every tensor into chunks of at most `max_bytes` (rounded down to whole blocks, at least
    /// one block), in file order.
    pub fn chunks(&self, max_bytes: u64) -> Vec<Chunk> {
        let mut out = Vec::new();
        for (i, t) in self.tensors.iter().enumerate() {
            let bb = t.ty.block_bytes();
            let step = (max_bytes / bb).max(1) * bb;
            let mut start = 0;
            while start < t.nbytes {
                let len = step.min(t.nbytes - start);
                out.push(Chunk { tensor: i, start, len });
                start += len;
            }
        }
        out
    }

    /// Build the whole file in memory. `fill(tensor, start, buf)` writes bytes `[start, start +
    /// buf.len())` of tensor `tensor` (whole blocks); chunks are filled in parallel (rayon).
    pub fn to_vec<F>(&self, chunk_bytes: u64, fill: F) -> Vec<u8>
    where
        F: Fn(usize, u64, &mut [u8]) + Sync,
    {
        let mut out = vec![0u8; self.file_size as usize];
        out[..self.header.len()].copy_from_slice(&self.header);
        // Carve the buffer into disjoint chunk slices (file order), then fill them in parallel.
        let chunks = self.chunks(chunk_bytes);
        let mut slices: Vec<(Chunk, &mut [u8])> = Vec::with_capacity(chunks.len());
        let mut rest: &mut [u8] = &mut out;
        let mut base = 0u64;
        for c in chunks {
            let abs = self.tensors[c.tensor].offset + c.start;
            let tail = std::mem::take(&mut rest);
            let (_, tail) = tail.split_at_mut((abs - base) as usize);
            let (mine, tail) = tail.split_at_mut(c.len as usize);
            slices.push((c, mine));
            rest = tail;
            base = abs + c.len;
        }
        slices.into_par_iter().for_each(|(c, buf)| fill(c.tensor, c.start, buf));
        out
    }

    /// Stream the file to `path` from `threads` threads (0 = all cores), each chunk generated into a
    /// private buffer and written at its precomputed offset with `write_at`; memory use is about
    /// `threads × chunk_bytes`. `progress(bytes_done)` is called after every chunk (from any thread).
    pub fn write_file_parallel<F, P>(
        &self,
        path: &Path,
        threads: usize,
        chunk_bytes: u64,
        fill: F,
        progress: P,
    ) -> Result<(), GgufError>
    where
        F: Fn(usize, u64, &mut [u8]) + Sync,
        P: Fn(u64) + Sync,
    {
        let io_err = |what: &str, e: std::io::Error| GgufError::msg(format!("{what}: {e}")).in_file(path);
        let file = File::create(path).map_err(|e| io_err("cannot create", e))?;
        // Sizing the file first makes the padding holes zero and lets every thread write anywhere.
        file.set_len(self.file_size).map_err(|e| io_err("cannot size", e))?;
        file.write_all_at(&self.header, 0)
            .map_err(|e| io_err("cannot write header", e))?;
        let done = AtomicU64::new(self.header.len() as u64);
        progress(done.load(Ordering::Relaxed));
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .map_err(|e| GgufError::msg(format!("cannot start writer threads: {e}")))?;
        let chunks = self.chunks(chunk_bytes);
        pool.install(|| {
            chunks.par_iter().try_for_each_init(Vec::new, |buf: &mut Vec<u8>, c| {
                buf.resize(c.len as usize, 0);
                fill(c.tensor, c.start, buf);
                let abs = self.tensors[c.tensor].offset + c.start;
                file.write_all_at(buf, abs)
                    .map_err(|e| io_err(&format!("cannot write tensor '{}'", self.tensors[c.tensor].name), e))?;
                progress(done.fetch_add(c.len, Ordering::Relaxed) + c.len);
                Ok::<(), GgufError>(())
            })
        })?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::GgufFile;

    fn every_value_type() -> Vec<(String, MetaValue)> {
        use MetaValue::*;
        let s = |x: &str| String(x.to_string());
        vec![
            ("general.alignment".into(), U32(64)),
            ("t.u8".into(), U8(250)),
            ("t.i8".into(), I8(-7)),
            ("t.u16".into(), U16(65000)),
            ("t.i16".into(), I16(-30000)),
            ("t.u32".into(), U32(4_000_000_000)),
            ("t.i32".into(), I32(-2_000_000_000)),
            ("t.f32".into(), F32(-1.25e-3)),
            ("t.bool".into(), Bool(true)),
            ("t.bool0".into(), Bool(false)),
            ("t.str".into(), s("héllo ｜ wörld")),
            ("t.empty".into(), s("")),
            ("t.u64".into(), U64(u64::MAX - 1)),
            ("t.i64".into(), I64(i64::MIN)),
            ("t.f64".into(), F64(std::f64::consts::PI)),
            ("t.arr_str".into(), Array(vt::STRING, vec![s("a b"), s(""), s("Ġthe")])),
            ("t.arr_i32".into(), Array(vt::I32, vec![I32(1), I32(-3), I32(5)])),
            ("t.arr_f32".into(), Array(vt::F32, vec![F32(10.0), F32(-0.5)])),
            ("t.arr_empty".into(), Array(vt::U8, vec![])),
            (
                "t.nested".into(),
                Array(
                    vt::ARRAY,
                    vec![
                        Array(vt::U64, vec![U64(1), U64(2)]),
                        Array(vt::ARRAY, vec![Array(vt::BOOL, vec![Bool(true)])]),
                    ],
                ),
            ),
        ]
    }

    fn tensors() -> Vec<TensorEntry> {
        vec![
            TensorEntry::new("a", GgmlType::F32, &[3]),
            TensorEntry::new("b", GgmlType::Q8_0, &[64, 3]),
            TensorEntry::new("c", GgmlType::Q2K, &[256, 2, 2]),
        ]
    }

    /// Deterministic bytes: tensor index and absolute position inside the tensor.
    fn fill(t: usize, start: u64, buf: &mut [u8]) {
        for (i, b) in buf.iter_mut().enumerate() {
            *b = ((start + i as u64) * 7 + t as u64 * 13) as u8;
        }
    }

    #[test]
    fn every_value_type_round_trips() {
        let meta = every_value_type();
        let lay = GgufLayout::new(&meta, &tensors()).unwrap();
        let bytes = lay.to_vec(100, fill);
        let g = GgufFile::from_bytes(bytes).unwrap();
        assert_eq!(g.metadata, meta);
        assert_eq!(g.alignment, 64);
        assert_eq!(g.data_offset, lay.data_offset);
        assert_eq!(g.data_offset % 64, 0);
        for (p, t) in lay.tensors.iter().zip(&g.tensors) {
            assert_eq!(
                (&p.name, p.ty, &p.dims, p.offset, p.nbytes),
                (&t.name, t.ty, &t.dims, t.offset, t.nbytes)
            );
            assert_eq!(t.offset % 64, 0);
            let mut want = vec![0u8; t.nbytes as usize];
            fill(lay.tensors.iter().position(|x| x.name == t.name).unwrap(), 0, &mut want);
            assert_eq!(g.tensor_data(t), &want[..], "{}", t.name);
        }
        assert_eq!(lay.tensors[1].nbytes, 3 * 2 * 34);
        assert_eq!(lay.tensors[2].nbytes, 4 * 84);
        assert_eq!(lay.file_size % 64, 0);
    }

    #[test]
    fn chunks_are_whole_blocks_and_cover_every_byte() {
        let lay = GgufLayout::new(&[], &tensors()).unwrap();
        let ch = lay.chunks(100);
        for (i, t) in lay.tensors.iter().enumerate() {
            let mine: Vec<_> = ch.iter().filter(|c| c.tensor == i).collect();
            assert_eq!(mine.iter().map(|c| c.len).sum::<u64>(), t.nbytes);
            assert!(mine.iter().all(|c| c.start % t.ty.block_bytes() == 0));
        }
        // Q2_K blocks (84 bytes) are larger than half of 100: one block per chunk.
        assert_eq!(ch.iter().filter(|c| c.tensor == 2).count(), 4);
    }

    #[test]
    fn all_writing_paths_emit_identical_bytes() {
        let meta = every_value_type();
        let lay = GgufLayout::new(&meta, &tensors()).unwrap();
        let mem = lay.to_vec(1 << 20, fill);
        let dir = std::env::temp_dir().join(format!("ds4chat-writer-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("par.gguf");
        let last = AtomicU64::new(0);
        lay.write_file_parallel(&path, 3, 40, fill, |d| {
            last.fetch_max(d, Ordering::Relaxed);
        })
        .unwrap();
        let file = std::fs::read(&path).unwrap();
        std::fs::remove_dir_all(&dir).ok();
        assert_eq!(file, mem);
        assert_eq!(
            last.load(Ordering::Relaxed),
            lay.header.len() as u64 + lay.tensor_bytes()
        );
    }

    #[test]
    fn rejects_bad_input() {
        let bad_align = [("general.alignment".to_string(), MetaValue::U32(24))];
        assert!(GgufLayout::new(&bad_align, &[]).is_err());
        let dup = [("k".to_string(), MetaValue::U8(1)), ("k".to_string(), MetaValue::U8(2))];
        assert!(
            GgufLayout::new(&dup, &[])
                .unwrap_err()
                .message
                .contains("duplicate metadata key 'k'")
        );
        let mixed = [(
            "k".to_string(),
            MetaValue::Array(vt::U32, vec![MetaValue::U32(1), MetaValue::I32(2)]),
        )];
        assert!(GgufLayout::new(&mixed, &[]).unwrap_err().message.contains("k'[1]"));
        let partial = TensorEntry::new("x", GgmlType::Q4K, &[128, 2]);
        assert!(GgufLayout::new(&[], &[partial]).unwrap_err().message.contains("'x'"));
        let t = tensors();
        let twice = [t[0].clone(), t[0].clone()];
        assert!(
            GgufLayout::new(&[], &twice)
                .unwrap_err()
                .message
                .contains("duplicate tensor 'a'")
        );
    }
}
