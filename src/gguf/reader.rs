//! GGUF v3 container reader over a read-only memory map (docs/gguf.md#container).
//!
//! Owns parsing of the header, metadata, tensor directory and data offset, and zero-copy tensor views.
//! It knows nothing about DeepSeek: `model::` binds names and shapes. Every count, length and offset
//! read from the file is checked against the bytes that remain before anything is allocated or
//! sliced, so an untrusted count never drives an allocation larger than the file itself.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;

use super::error::GgufError;
use super::types::GgmlType;

pub const GGUF_MAGIC: u32 = 0x4655_4747; // "GGUF" read as little-endian u32
pub const GGUF_VERSION: u32 = 3;
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Deepest array nesting accepted (ds4 skips nested arrays up to depth 8).
pub const MAX_ARRAY_DEPTH: usize = 8;
/// Tensors may have 1..=8 dims (ds4: parse_tensors).
pub const MAX_DIMS: usize = 8;

/// GGUF metadata value type ids.
pub mod vt {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}

/// One decoded metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    /// Element type id and the elements (all of that type).
    Array(u32, Vec<MetaValue>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl MetaValue {
    pub fn type_id(&self) -> u32 {
        match self {
            MetaValue::U8(_) => vt::U8,
            MetaValue::I8(_) => vt::I8,
            MetaValue::U16(_) => vt::U16,
            MetaValue::I16(_) => vt::I16,
            MetaValue::U32(_) => vt::U32,
            MetaValue::I32(_) => vt::I32,
            MetaValue::F32(_) => vt::F32,
            MetaValue::Bool(_) => vt::BOOL,
            MetaValue::String(_) => vt::STRING,
            MetaValue::Array(..) => vt::ARRAY,
            MetaValue::U64(_) => vt::U64,
            MetaValue::I64(_) => vt::I64,
            MetaValue::F64(_) => vt::F64,
        }
    }

    pub fn type_name(&self) -> &'static str {
        type_name(self.type_id())
    }

    /// Integer value of any integer type, if it fits in u64 (negative → None).
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::U8(v) => Some(v as u64),
            MetaValue::U16(v) => Some(v as u64),
            MetaValue::U32(v) => Some(v as u64),
            MetaValue::U64(v) => Some(v),
            MetaValue::I8(v) => u64::try_from(v).ok(),
            MetaValue::I16(v) => u64::try_from(v).ok(),
            MetaValue::I32(v) => u64::try_from(v).ok(),
            MetaValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Float view of float and integer values (float keys accept either, docs/gguf.md#metadata).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(v) => Some(v as f64),
            MetaValue::F64(v) => Some(v),
            MetaValue::U32(v) => Some(v as f64),
            MetaValue::I32(v) => Some(v as f64),
            MetaValue::U64(v) => Some(v as f64),
            MetaValue::I64(v) => Some(v as f64),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            MetaValue::Array(_, v) => Some(v),
            _ => None,
        }
    }
}

pub fn type_name(id: u32) -> &'static str {
    match id {
        vt::U8 => "u8",
        vt::I8 => "i8",
        vt::U16 => "u16",
        vt::I16 => "i16",
        vt::U32 => "u32",
        vt::I32 => "i32",
        vt::F32 => "f32",
        vt::BOOL => "bool",
        vt::STRING => "string",
        vt::ARRAY => "array",
        vt::U64 => "u64",
        vt::I64 => "i64",
        vt::F64 => "f64",
        _ => "unknown",
    }
}

/// Directory entry of one tensor. `offset` is absolute in the file.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// GGUF order: dims[0] is the contiguous axis.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    pub offset: u64,
    pub nbytes: u64,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }

    pub fn shape_string(&self) -> String {
        let d: Vec<String> = self.dims.iter().map(|d| d.to_string()).collect();
        format!("[{}]", d.join(", "))
    }
}

/// Bytes the parsed directory refers to: the whole file (mapped) or a borrowed slice (fuzzing, tests).
enum Backing {
    Map(Mmap),
    Owned(Vec<u8>),
}

/// A parsed GGUF file. Cheap to share (`Arc`); tensor bytes are sub-slices of the mapping.
pub struct GgufFile {
    backing: Backing,
    pub path: Option<PathBuf>,
    pub version: u32,
    pub alignment: u64,
    pub data_offset: u64,
    pub metadata: Vec<(String, MetaValue)>,
    pub tensors: Vec<TensorInfo>,
    meta_index: HashMap<String, usize>,
    tensor_index: HashMap<String, usize>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("n_kv", &self.metadata.len())
            .field("n_tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Map and parse `path`. Errors name the file.
    pub fn open(path: &Path) -> Result<Arc<GgufFile>, GgufError> {
        let file = File::open(path).map_err(|e| GgufError::msg(format!("cannot open: {e}")).in_file(path))?;
        let len = file
            .metadata()
            .map_err(|e| GgufError::msg(format!("cannot stat: {e}")).in_file(path))?
            .len();
        if len == 0 {
            return Err(GgufError::at(0, "file is empty, expected a GGUF header").in_file(path));
        }
        // SAFETY: the mapping is read-only; a file truncated underneath us by another process would
        // raise SIGBUS, which no Rust API can prevent for file-backed maps.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| GgufError::msg(format!("cannot mmap: {e}")).in_file(path))?;
        let mut g = Self::parse_backing(Backing::Map(map)).map_err(|e| e.in_file(path))?;
        g.path = Some(path.to_path_buf());
        Ok(Arc::new(g))
    }

    /// Parse from owned bytes (tests, fuzzing, in-memory demo model).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        Self::parse_backing(Backing::Owned(bytes))
    }

    /// Parse a borrowed byte slice without keeping it (fuzz entry point): copies nothing but the
    /// directory.
    pub fn parse_only(bytes: &[u8]) -> Result<(), GgufError> {
        parse_directory(bytes).map(|_| ())
    }

    fn parse_backing(backing: Backing) -> Result<GgufFile, GgufError> {
        let bytes: &[u8] = match &backing {
            Backing::Map(m) => m,
            Backing::Owned(v) => v,
        };
        let dir = parse_directory(bytes)?;
        let meta_index = dir
            .metadata
            .iter()
            .enumerate()
            .map(|(i, (k, _))| (k.clone(), i))
            .collect();
        let tensor_index = dir
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Ok(GgufFile {
            backing,
            path: None,
            version: dir.version,
            alignment: dir.alignment,
            data_offset: dir.data_offset,
            metadata: dir.metadata,
            tensors: dir.tensors,
            meta_index,
            tensor_index,
        })
    }

    /// All bytes of the file.
    pub fn bytes(&self) -> &[u8] {
        match &self.backing {
            Backing::Map(m) => m,
            Backing::Owned(v) => v,
        }
    }

    pub fn file_size(&self) -> u64 {
        self.bytes().len() as u64
    }

    /// Name for messages: the path, or "<memory>".
    pub fn display_name(&self) -> String {
        self.path
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "<memory>".into())
    }

    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.meta_index.get(key).map(|&i| &self.metadata[i].1)
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// Zero-copy bytes of a tensor (bounds were checked at parse time).
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        &self.bytes()[t.offset as usize..(t.offset + t.nbytes) as usize]
    }

    /// Advise the kernel about the whole mapping (no-op for owned bytes).
    pub fn advise_willneed(&self) {
        if let Backing::Map(m) = &self.backing {
            let _ = m.advise(memmap2::Advice::WillNeed);
        }
    }

    /// Base pointer and length of the mapping (residency probes, host registration).
    pub fn mapping(&self) -> (*const u8, usize) {
        let b = self.bytes();
        (b.as_ptr(), b.len())
    }

    pub fn is_mapped(&self) -> bool {
        matches!(self.backing, Backing::Map(_))
    }
}

struct Directory {
    version: u32,
    alignment: u64,
    data_offset: u64,
    metadata: Vec<(String, MetaValue)>,
    tensors: Vec<TensorInfo>,
}

/// Bounds-checked little-endian cursor. Every read names the offset on failure.
struct Cursor<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> u64 {
        (self.b.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(GgufError::at(
                self.pos as u64,
                format!(
                    "truncated file: {what} needs {n} bytes but only {} remain (file size {})",
                    self.remaining(),
                    self.b.len()
                ),
            ));
        }
        let s = &self.b[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn u8(&mut self, what: &str) -> Result<u8, GgufError> {
        Ok(self.take(1, what)?[0])
    }
    fn u16(&mut self, what: &str) -> Result<u16, GgufError> {
        Ok(u16::from_le_bytes(self.take(2, what)?.try_into().unwrap()))
    }
    fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.take(4, what)?.try_into().unwrap()))
    }
    fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.take(8, what)?.try_into().unwrap()))
    }

    /// Refuses a `count` (the header field `what`, at offset `at`) of entries of at least
    /// `min_bytes` each that cannot fit in the rest of the file.
    fn check_count(&self, count: u64, min_bytes: u64, what: &str, at: u64) -> Result<(), GgufError> {
        if count.checked_mul(min_bytes).is_none_or(|n| n > self.remaining()) {
            return Err(GgufError::at(
                at,
                format!("{what} {count} cannot fit in a file of {} bytes", self.b.len()),
            ));
        }
        Ok(())
    }

    /// The name opening an entry (a metadata key, a tensor name) and the offset it starts at.
    fn entry_name(&mut self, what: &str) -> Result<(u64, String), GgufError> {
        let at = self.pos as u64;
        Ok((at, self.string(what)?))
    }

    fn string(&mut self, what: &str) -> Result<String, GgufError> {
        let at = self.pos as u64;
        let len = self.u64(what)?;
        if len > self.remaining() {
            return Err(GgufError::at(
                at,
                format!(
                    "{what}: string length {len} runs past end of file ({} bytes remain)",
                    self.remaining()
                ),
            ));
        }
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|_| GgufError::at(at, format!("{what}: string of {len} bytes is not valid UTF-8")))
    }
}

/// Smallest encoded size of one value of type `t` (bounds array counts before allocating).
fn min_value_size(t: u32) -> u64 {
    match t {
        vt::U8 | vt::I8 | vt::BOOL => 1,
        vt::U16 | vt::I16 => 2,
        vt::U32 | vt::I32 | vt::F32 => 4,
        vt::U64 | vt::I64 | vt::F64 | vt::STRING => 8,
        vt::ARRAY => 12,
        _ => 1,
    }
}

fn read_value(c: &mut Cursor<'_>, t: u32, key: &str, depth: usize) -> Result<MetaValue, GgufError> {
    let at = c.pos as u64;
    Ok(match t {
        vt::U8 => MetaValue::U8(c.u8(key)?),
        vt::I8 => MetaValue::I8(c.u8(key)? as i8),
        vt::U16 => MetaValue::U16(c.u16(key)?),
        vt::I16 => MetaValue::I16(c.u16(key)? as i16),
        vt::U32 => MetaValue::U32(c.u32(key)?),
        vt::I32 => MetaValue::I32(c.u32(key)? as i32),
        vt::F32 => MetaValue::F32(f32::from_bits(c.u32(key)?)),
        vt::BOOL => {
            let v = c.u8(key)?;
            if v > 1 {
                return Err(GgufError::at(
                    at,
                    format!("key '{key}': bool value {v}, expected 0 or 1"),
                ));
            }
            MetaValue::Bool(v == 1)
        }
        vt::STRING => MetaValue::String(c.string(key)?),
        vt::U64 => MetaValue::U64(c.u64(key)?),
        vt::I64 => MetaValue::I64(c.u64(key)? as i64),
        vt::F64 => MetaValue::F64(f64::from_bits(c.u64(key)?)),
        vt::ARRAY => {
            if depth >= MAX_ARRAY_DEPTH {
                return Err(GgufError::at(
                    at,
                    format!("key '{key}': arrays nested deeper than {MAX_ARRAY_DEPTH} levels"),
                ));
            }
            let et = c.u32(key)?;
            if et > vt::F64 {
                return Err(GgufError::at(
                    at,
                    format!("key '{key}': unknown array element type {et}"),
                ));
            }
            let count = c.u64(key)?;
            let need = count.checked_mul(min_value_size(et));
            if need.is_none_or(|n| n > c.remaining()) {
                return Err(GgufError::at(
                    at,
                    format!(
                        "key '{key}': array of {count} {} elements cannot fit in the {} bytes that remain",
                        type_name(et),
                        c.remaining()
                    ),
                ));
            }
            let mut v = Vec::with_capacity(count as usize);
            for _ in 0..count {
                v.push(read_value(c, et, key, depth + 1)?);
            }
            MetaValue::Array(et, v)
        }
        other => {
            return Err(GgufError::at(
                at,
                format!("key '{key}': unknown metadata value type {other}"),
            ));
        }
    })
}

fn parse_directory(b: &[u8]) -> Result<Directory, GgufError> {
    let mut c = Cursor { b, pos: 0 };
    let magic = c.u32("header magic")?;
    if magic != GGUF_MAGIC {
        return Err(GgufError::at(
            0,
            format!("bad magic 0x{magic:08x}, expected 0x{GGUF_MAGIC:08x} (\"GGUF\"): not a GGUF file"),
        ));
    }
    let version = c.u32("header version")?;
    if version != GGUF_VERSION {
        return Err(GgufError::at(
            4,
            format!("GGUF version {version} is not supported, expected {GGUF_VERSION}"),
        ));
    }
    let n_tensors = c.u64("tensor count")?;
    let n_kv = c.u64("metadata count")?;
    // Each KV needs at least 8 (key len) + 4 (type) + 1 bytes; each tensor info at least 8+4+8+4+8.
    c.check_count(n_kv, 13, "metadata count", 16)?;
    c.check_count(n_tensors, 32, "tensor count", 8)?;

    let mut metadata = Vec::with_capacity(n_kv as usize);
    let mut seen_keys = std::collections::HashSet::new();
    for i in 0..n_kv {
        let (at, key) = c.entry_name(&format!("metadata key #{i}"))?;
        let t = c.u32(&key)?;
        let v = read_value(&mut c, t, &key, 0)?;
        if !seen_keys.insert(key.clone()) {
            return Err(GgufError::at(at, format!("duplicate metadata key '{key}'")));
        }
        metadata.push((key, v));
    }

    let mut alignment = DEFAULT_ALIGNMENT;
    if let Some((_, v)) = metadata.iter().find(|(k, _)| k == "general.alignment") {
        match v {
            MetaValue::U32(a) if *a > 0 && a.is_power_of_two() => alignment = *a as u64,
            other => {
                return Err(GgufError::msg(format!(
                    "key 'general.alignment': expected a nonzero power-of-two u32, found {} {other:?}",
                    other.type_name()
                )));
            }
        }
    }

    struct Raw {
        name: String,
        dims: Vec<u64>,
        ty: GgmlType,
        rel: u64,
        at: u64,
        nbytes: u64,
    }
    let mut raw = Vec::with_capacity(n_tensors as usize);
    let mut seen = std::collections::HashSet::new();
    for i in 0..n_tensors {
        let (at, name) = c.entry_name(&format!("tensor #{i} name"))?;
        let nd = c.u32(&name)?;
        if nd == 0 || nd as usize > MAX_DIMS {
            return Err(GgufError::at(
                at,
                format!("tensor '{name}': {nd} dimensions, expected 1..={MAX_DIMS}"),
            ));
        }
        let mut dims = Vec::with_capacity(nd as usize);
        let mut n: u64 = 1;
        for _ in 0..nd {
            let d = c.u64(&name)?;
            n = n
                .checked_mul(d)
                .ok_or_else(|| GgufError::at(at, format!("tensor '{name}': element count overflows 64 bits")))?;
            dims.push(d);
        }
        let tid = c.u32(&name)?;
        let ty = GgmlType::from_id(tid).ok_or_else(|| {
            GgufError::at(
                at,
                format!("tensor '{name}': unknown or unsupported GGML type id {tid}"),
            )
        })?;
        if !n.is_multiple_of(ty.block_elems()) || !dims[0].is_multiple_of(ty.block_elems()) {
            return Err(GgufError::at(
                at,
                format!(
                    "tensor '{name}': row of {} elements is not a whole number of {ty} blocks ({})",
                    dims[0],
                    ty.block_elems()
                ),
            ));
        }
        let rel = c.u64(&name)?;
        let nbytes = ty
            .bytes_for(n)
            .ok_or_else(|| GgufError::at(at, format!("tensor '{name}': byte size overflows 64 bits")))?;
        if !seen.insert(name.clone()) {
            return Err(GgufError::at(at, format!("duplicate tensor '{name}'")));
        }
        raw.push(Raw {
            name,
            dims,
            ty,
            rel,
            at,
            nbytes,
        });
    }

    let data_offset = (c.pos as u64).div_ceil(alignment) * alignment;
    let file_len = b.len() as u64;
    if data_offset > file_len && !raw.is_empty() {
        return Err(GgufError::at(
            c.pos as u64,
            format!("data section would start at {data_offset}, past end of file ({file_len} bytes)"),
        ));
    }
    let mut tensors = Vec::with_capacity(raw.len());
    for r in raw {
        let abs = data_offset
            .checked_add(r.rel)
            .filter(|a| a.checked_add(r.nbytes).is_some_and(|e| e <= file_len));
        let Some(offset) = abs else {
            return Err(GgufError::at(
                r.at,
                format!(
                    "tensor '{}': data at relative offset {} + {} bytes runs past end of file ({} bytes, data section starts at {})",
                    r.name, r.rel, r.nbytes, file_len, data_offset
                ),
            ));
        };
        tensors.push(TensorInfo {
            name: r.name,
            dims: r.dims,
            ty: r.ty,
            offset,
            nbytes: r.nbytes,
        });
    }
    // Overlap check: sort by offset, compare neighbours.
    let mut order: Vec<usize> = (0..tensors.len()).filter(|&i| tensors[i].nbytes > 0).collect();
    order.sort_by_key(|&i| tensors[i].offset);
    for w in order.windows(2) {
        let (a, bt) = (&tensors[w[0]], &tensors[w[1]]);
        if a.offset + a.nbytes > bt.offset {
            return Err(GgufError::at(
                bt.offset,
                format!(
                    "tensors '{}' [{}..{}) and '{}' [{}..{}) overlap",
                    a.name,
                    a.offset,
                    a.offset + a.nbytes,
                    bt.name,
                    bt.offset,
                    bt.offset + bt.nbytes
                ),
            ));
        }
    }
    Ok(Directory {
        version,
        alignment,
        data_offset,
        metadata,
        tensors,
    })
}
