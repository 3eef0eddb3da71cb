//! Malformed model files: each must be refused with a one-line error that names the problem — never
//! a panic, a hang or an allocation out of proportion to the file (checked with a counting global
//! allocator). A few go through the binary (`ds4-chat inspect`): non-zero exit, one line on stderr.
//!
//! Cases are derived from a valid "micro" model (genmodel, ~370 KB, binds) by re-laying it out with
//! changed metadata or tensors (`GgufLayout`), or by patching bytes at offsets found in its header.
//! `write_fuzz_seeds` (ignored by default; `--ignored` with DS4_WRITE_FUZZ_SEEDS=DIR) writes the seed
//! corpus for fuzz/ (no .gguf extension: *.gguf is git-ignored).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use ds4_chat::genmodel::{ExpertMix, GenSpec, Preset, SyntheticModel, hparams_metadata, micro_hparams, plan_tensors};
use ds4_chat::gguf::reader::vt;
use ds4_chat::gguf::writer::{GgufLayout, TensorEntry};
use ds4_chat::gguf::{GgmlType, GgufError, GgufFile, MetaValue};
use ds4_chat::model::Model;

/// Largest single allocation request since the last reset.
static MAX_ALLOC: AtomicUsize = AtomicUsize::new(0);

struct CountingAlloc;

unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        MAX_ALLOC.fetch_max(l.size(), Ordering::Relaxed);
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        MAX_ALLOC.fetch_max(new, Ordering::Relaxed);
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

type Meta = Vec<(String, MetaValue)>;

/// The valid micro model: metadata, tensor entries, bytes.
struct Base {
    meta: Meta,
    entries: Vec<TensorEntry>,
    bytes: Vec<u8>,
}

fn base() -> &'static Base {
    static B: OnceLock<Base> = OnceLock::new();
    B.get_or_init(|| {
        let spec = GenSpec::new(Preset::Micro, 1, ExpertMix::Q2);
        let m = SyntheticModel::new(&spec).unwrap();
        Base {
            meta: hparams_metadata(&micro_hparams(), &spec.name),
            entries: plan_tensors(&micro_hparams(), ExpertMix::Q2)
                .into_iter()
                .map(|(_, e)| e)
                .collect(),
            bytes: m.to_bytes(),
        }
    })
}

/// Lay out `meta` + `entries` with patterned tensor data.
fn build(meta: &Meta, entries: &[TensorEntry]) -> Vec<u8> {
    GgufLayout::new(meta, entries).unwrap().to_vec(1 << 16, |t, s, b| {
        for (i, x) in b.iter_mut().enumerate() {
            *x = (s as usize + i + t) as u8 & 0x3f; // small values: finite f16/f32 and scales
        }
    })
}

fn with_meta(f: impl FnOnce(&mut Meta)) -> Vec<u8> {
    let b = base();
    let mut m = b.meta.clone();
    f(&mut m);
    build(&m, &b.entries)
}

fn set_meta(m: &mut Meta, key: &str, v: MetaValue) {
    match m.iter_mut().find(|(k, _)| k == key) {
        Some(e) => e.1 = v,
        None => m.push((key.to_string(), v)),
    }
}

/// The base file with metadata `key` set to `v` (added when missing).
fn with_key(key: &str, v: MetaValue) -> Vec<u8> {
    with_meta(|m| set_meta(m, key, v))
}

/// The base file without metadata `key`.
fn without_key(key: &str) -> Vec<u8> {
    with_meta(|m| m.retain(|(k, _)| k != key))
}

fn with_entries(f: impl FnOnce(&mut Vec<TensorEntry>)) -> Vec<u8> {
    let b = base();
    let mut e = b.entries.clone();
    f(&mut e);
    build(&b.meta, &e)
}

/// The base file with `f` applied to the first tensor whose name ends with `suffix`.
fn with_tensor(suffix: &str, f: impl FnOnce(&mut TensorEntry)) -> Vec<u8> {
    with_entries(|e| f(e.iter_mut().find(|t| t.name.ends_with(suffix)).unwrap()))
}

fn find(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len())
        .position(|w| w == needle)
        .unwrap_or_else(|| panic!("{:?} not in file", String::from_utf8_lossy(needle)))
}

/// Offset just past the name of tensor `name` in the directory of `bytes` (its u32 n_dims).
fn dir_entry(bytes: &[u8], name: &str) -> usize {
    let mut needle = (name.len() as u64).to_le_bytes().to_vec();
    needle.extend_from_slice(name.as_bytes());
    find(bytes, &needle) + needle.len()
}

/// Offsets of (type id, relative offset) fields of a tensor's directory entry.
fn dir_fields(bytes: &[u8], name: &str) -> (usize, usize) {
    let p = dir_entry(bytes, name);
    let nd = u32::from_le_bytes(bytes[p..p + 4].try_into().unwrap()) as usize;
    let ty = p + 4 + 8 * nd;
    (ty, ty + 4)
}

fn patch(f: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut b = base().bytes.clone();
    f(&mut b);
    b
}

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

fn nested(depth: usize) -> MetaValue {
    let mut v = MetaValue::Array(vt::U8, vec![MetaValue::U8(1)]);
    for _ in 1..depth {
        v = MetaValue::Array(vt::ARRAY, vec![v]);
    }
    v
}

/// (case name, file bytes, text the error must contain).
fn cases() -> Vec<(&'static str, Vec<u8>, &'static str)> {
    let b = base();
    let data_offset = GgufFile::from_bytes(b.bytes.clone()).unwrap().data_offset as usize;
    let first_key_at = 24;
    let (qa_ty, qa_off) = dir_fields(&b.bytes, "blk.0.attn_q_a.weight");
    let (_, qb_off) = dir_fields(&b.bytes, "blk.0.attn_q_b.weight");
    let embd_nd = dir_entry(&b.bytes, "token_embd.weight");
    let tensor_dir_start = dir_entry(&b.bytes, "token_embd.weight") - 8 - "token_embd.weight".len();
    let q8 = GgmlType::Q8_0;
    // Two metadata keys of equal length: rename the second to the first in place.
    let dup_key = {
        let keys: Vec<&String> = b.meta.iter().map(|(k, _)| k).collect();
        let (a, c) = keys
            .iter()
            .enumerate()
            .find_map(|(i, a)| keys[i + 1..].iter().find(|c| c.len() == a.len()).map(|c| (*a, *c)))
            .expect("two keys of equal length");
        let bytes = patch(|x| {
            let mut needle = (c.len() as u64).to_le_bytes().to_vec();
            needle.extend_from_slice(c.as_bytes());
            let p = find(x, &needle) + 8;
            x[p..p + a.len()].copy_from_slice(a.as_bytes());
        });
        (format!("duplicate metadata key '{a}'"), bytes)
    };
    let dup_key_name: &'static str = Box::leak(dup_key.0.clone().into_boxed_str());
    let dup_key = (dup_key_name, dup_key.1);
    vec![
        ("empty file", vec![], "header magic needs 4 bytes but only 0 remain"),
        ("bad magic", patch(|x| x[0..4].copy_from_slice(b"GGUG")), "bad magic"),
        ("not a gguf at all", b"{\"model\": \"json\"}".to_vec(), "bad magic"),
        ("version 1", patch(|x| put_u32(x, 4, 1)), "version 1 is not supported"),
        ("version 4", patch(|x| put_u32(x, 4, 4)), "version 4 is not supported"),
        (
            "truncated inside the header",
            b.bytes[..14].to_vec(),
            "truncated file: tensor count",
        ),
        (
            "truncated inside the metadata",
            b.bytes[..tensor_dir_start - 50].to_vec(),
            "truncated file|runs past end of file",
        ),
        (
            "truncated inside the tensor table",
            b.bytes[..tensor_dir_start + 30].to_vec(),
            "truncated",
        ),
        (
            "truncated inside the tensor data",
            b.bytes[..data_offset + 100].to_vec(),
            "runs past end of file",
        ),
        (
            "n_tensors = 2^63",
            patch(|x| put_u64(x, 8, 1 << 63)),
            "tensor count 9223372036854775808 cannot fit",
        ),
        ("n_kv = 2^64-1", patch(|x| put_u64(x, 16, u64::MAX)), "metadata count"),
        (
            "key string length past EOF",
            patch(|x| put_u64(x, first_key_at, 1 << 40)),
            "runs past end of file",
        ),
        (
            "array count past EOF",
            patch(|x| {
                let key = "deepseek4.attention.compress_ratios";
                let p = find(x, key.as_bytes()) + key.len() + 8; // past value type and element type
                put_u64(x, p, 1 << 40);
            }),
            "array of 1099511627776 u32 elements cannot fit",
        ),
        (
            "arrays nested 100 deep",
            with_meta(|m| m.push(("x.deep".into(), nested(100)))),
            "nested deeper than 8",
        ),
        (
            "unknown metadata value type",
            patch(|x| put_u32(x, first_key_at + 8 + 20, 13)),
            "unknown metadata value type 13",
        ),
        (
            "invalid UTF-8 key",
            patch(|x| x[first_key_at + 8] = 0xff),
            "not valid UTF-8",
        ),
        (
            "tensor offset past EOF",
            patch(|x| put_u64(x, qa_off, 1 << 40)),
            "'blk.0.attn_q_a.weight'",
        ),
        (
            "overlapping tensors",
            patch(|x| {
                let v = u64::from_le_bytes(x[qa_off..qa_off + 8].try_into().unwrap());
                put_u64(x, qb_off, v + 32);
            }),
            "overlap",
        ),
        (
            "unknown tensor type id",
            patch(|x| put_u32(x, qa_ty, 99)),
            "unknown or unsupported GGML type id 99",
        ),
        (
            "unsupported ggml type (Q4_0)",
            patch(|x| put_u32(x, qa_ty, 2)),
            "type id 2",
        ),
        ("tensor with 0 dims", patch(|x| put_u32(x, embd_nd, 0)), "0 dimensions"),
        ("tensor with 9 dims", patch(|x| put_u32(x, embd_nd, 9)), "9 dimensions"),
        (
            "element count overflow",
            patch(|x| {
                put_u64(x, embd_nd + 4, 1 << 40);
                put_u64(x, embd_nd + 12, 1 << 40);
            }),
            "overflows 64 bits",
        ),
        (
            "row not whole blocks",
            patch(|x| {
                let (ty, _) = dir_fields(x, "blk.0.attn_kv.weight");
                let p = dir_entry(x, "blk.0.attn_kv.weight");
                put_u32(x, ty, q8.id());
                put_u64(x, p + 4, 250);
            }),
            "not a whole number of Q8_0 blocks",
        ),
        (
            "duplicate tensor",
            patch(|x| {
                let p = dir_entry(x, "blk.0.attn_q_b.weight");
                x[p - 21..p].copy_from_slice(b"blk.0.attn_q_a.weight");
            }),
            "duplicate tensor 'blk.0.attn_q_a.weight'",
        ),
        ("duplicate metadata key", dup_key.1, dup_key.0),
        (
            "missing tensor",
            with_entries(|e| e.retain(|t| !t.name.ends_with("ffn_down_shexp.weight"))),
            "missing tensor 'blk.0.ffn_down_shexp.weight'",
        ),
        (
            "known tensor with the wrong type",
            with_tensor("blk.0.attn_q_a.weight", |t| t.ty = GgmlType::F16),
            "tensor 'blk.0.attn_q_a.weight': type F16, expected Q8_0",
        ),
        (
            "known tensor with the wrong shape",
            with_tensor("blk.0.attn_kv.weight", |t| t.dims.reverse()),
            "tensor 'blk.0.attn_kv.weight': shape [128, 256], expected [256, 128]",
        ),
        (
            "routed expert of a non-expert type",
            with_entries(|e| {
                for t in e.iter_mut().filter(|t| t.name.ends_with("ffn_down_exps.weight")) {
                    t.ty = GgmlType::Q8_0;
                }
            }),
            "expected IQ2_XXS, Q2_K or Q4_K",
        ),
        (
            "gate and up of different types",
            with_tensor("ffn_up_exps.weight", |t| t.ty = GgmlType::Q4K),
            "gate and up must share a type",
        ),
        (
            "wrong architecture",
            with_key("general.architecture", MetaValue::String("llama".into())),
            "general.architecture is 'llama', expected 'deepseek4'",
        ),
        (
            "missing architecture",
            without_key("general.architecture"),
            "'general.architecture' missing",
        ),
        (
            "block_count of type string",
            with_key("deepseek4.block_count", MetaValue::String("1".into())),
            "key 'deepseek4.block_count': expected an unsigned integer, found string",
        ),
        (
            "missing key",
            without_key("deepseek4.expert_count"),
            "missing metadata key 'deepseek4.expert_count'",
        ),
        (
            "expert_weights_norm of type u32",
            with_key("deepseek4.expert_weights_norm", MetaValue::U32(1)),
            "expected bool, found u32",
        ),
        (
            "compress_ratios of strings",
            with_key(
                "deepseek4.attention.compress_ratios",
                MetaValue::Array(vt::STRING, vec![MetaValue::String("0".into())]),
            ),
            "compress_ratios'[0]: expected u32 or i32, found string",
        ),
        (
            "compress ratio 5",
            with_key(
                "deepseek4.attention.compress_ratios",
                MetaValue::Array(vt::U32, vec![MetaValue::U32(5)]),
            ),
            "ratio 5, expected 0, 4 or 128",
        ),
        (
            "bool value 2",
            patch(|x| {
                let p = find(x, b"deepseek4.expert_weights_norm") + "deepseek4.expert_weights_norm".len();
                x[p + 4] = 2;
            }),
            "bool value 2, expected 0 or 1",
        ),
        (
            "alignment 24",
            patch(|x| {
                let p = find(x, b"general.alignment") + "general.alignment".len() + 4;
                put_u32(x, p, 24);
            }),
            "key 'general.alignment': expected a nonzero power-of-two u32",
        ),
        (
            "value_length != key_length",
            with_key("deepseek4.attention.value_length", MetaValue::U32(64)),
            "value length must equal key length",
        ),
        (
            "more experts used than exist",
            with_key("deepseek4.expert_used_count", MetaValue::U32(2)),
            "exceeds expert_count",
        ),
    ]
}

/// Full loading path as `inspect` runs it: parse, hyperparameters, bind.
fn load(bytes: Vec<u8>) -> Result<(), GgufError> {
    let f = Arc::new(GgufFile::from_bytes(bytes)?);
    Model::bind(f).map(|_| ())
}

/// Serializes the cases that measure allocation.
static ALLOC_LOCK: Mutex<()> = Mutex::new(());

#[test]
fn base_micro_model_loads() {
    load(base().bytes.clone()).unwrap();
}

#[test]
fn every_malformed_file_gives_a_one_line_error() {
    let _g = ALLOC_LOCK.lock().unwrap();
    let cases = cases();
    assert!(cases.len() >= 20, "only {} cases", cases.len());
    let mut names = std::collections::HashSet::new();
    for (name, bytes, want) in cases {
        assert!(names.insert(name), "case '{name}' twice");
        let len = bytes.len();
        MAX_ALLOC.store(0, Ordering::Relaxed);
        let borrowed = GgufFile::parse_only(&bytes).err();
        let err = load(bytes).expect_err(name);
        let peak = MAX_ALLOC.load(Ordering::Relaxed);
        let msg = err.to_string();
        eprintln!("{name:40} -> {msg}");
        assert!(!msg.contains('\n'), "{name}: message is not one line: {msg}");
        assert!(msg.len() < 400, "{name}: message too long: {msg}");
        assert!(
            want.split('|').any(|w| msg.contains(w)),
            "{name}: '{msg}' does not mention '{want}'"
        );
        // The borrowed parser agrees on every container-level error.
        if let Some(b) = borrowed {
            assert_eq!(b.to_string(), msg, "{name}: parse_only and from_bytes differ");
        }
        // Allocation stays proportional to the file: one MetaValue per encoded byte at most
        // (≤ 64 B each) plus the copy of the file itself, plus 1 MiB of fixed overhead.
        assert!(
            peak <= 64 * len + (1 << 20),
            "{name}: allocated {peak} bytes for a {len}-byte file"
        );
    }
}

fn temp_file(name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("ds4chat-malformed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

#[test]
fn inspect_binary_exits_nonzero_with_one_line() {
    let all = cases();
    let pick = [
        "bad magic",
        "n_tensors = 2^63",
        "truncated inside the tensor data",
        "wrong architecture",
        "known tensor with the wrong shape",
    ];
    for (name, bytes, want) in all.into_iter().filter(|c| pick.contains(&c.0)) {
        let path = temp_file(&name.replace(' ', "_"), &bytes);
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_ds4-chat"))
            .arg("inspect")
            .arg(&path)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        std::fs::remove_file(&path).ok();
        assert!(!out.status.success(), "{name}: exit status {:?}", out.status);
        assert_eq!(out.status.code(), Some(1), "{name}: not a clean error exit (panic?)");
        assert_eq!(stderr.lines().count(), 1, "{name}: stderr is not one line: {stderr}");
        assert!(stderr.starts_with("ds4-chat: "), "{name}: {stderr}");
        assert!(
            stderr.contains(&path.display().to_string()),
            "{name}: error does not name the file: {stderr}"
        );
        assert!(stderr.contains(want), "{name}: {stderr}");
        assert!(out.stdout.is_empty(), "{name}: printed to stdout");
    }
    // A valid file goes through and reports the micro model's accounting.
    let path = temp_file("micro.gguf", &base().bytes);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ds4-chat"))
        .args(["inspect", "--json"])
        .arg(&path)
        .output()
        .unwrap();
    std::fs::remove_file(&path).ok();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["architecture"], "deepseek4");
    assert_eq!(v["n_tensors"].as_u64().unwrap() as usize, base().entries.len());
    assert_eq!(v["hparams"]["n_embd"], 256);
}

/// Writes the fuzz seed corpus (small files only) into DS4_WRITE_FUZZ_SEEDS: a generator, not a
/// check, so it is ignored by default and fails without the variable.
#[test]
#[ignore = "writes the fuzz seeds: DS4_WRITE_FUZZ_SEEDS=DIR cargo test --release --test gguf_malformed -- --ignored"]
fn write_fuzz_seeds() {
    let dir =
        std::env::var_os("DS4_WRITE_FUZZ_SEEDS").expect("set DS4_WRITE_FUZZ_SEEDS=DIR to write the fuzz seed corpus");
    let dir = std::path::PathBuf::from(dir);
    std::fs::create_dir_all(&dir).unwrap();
    // A header-only variant: the micro metadata and three tiny tensors (binding then fails on shapes).
    let small = build(
        &base().meta,
        &[
            TensorEntry::new("token_embd.weight", GgmlType::F16, &[4, 2]),
            TensorEntry::new("blk.0.attn_q_a.weight", GgmlType::Q8_0, &[32, 1]),
            TensorEntry::new("blk.0.ffn_down_exps.weight", GgmlType::Q2K, &[256, 1, 1]),
        ],
    );
    std::fs::write(dir.join("micro_metadata_small_tensors"), &small).unwrap();
    std::fs::write(dir.join("micro_valid"), &base().bytes).unwrap();
    for (name, bytes, _) in cases() {
        if bytes.len() <= 16 * 1024 {
            std::fs::write(dir.join(name.replace([' ', '^', '=', '!', '(', ')'], "_")), bytes).unwrap();
        }
    }
    // Metadata-level cases rebuilt on the small variant keep the seeds small.
    let small_meta = |f: &dyn Fn(&mut Meta)| {
        let mut m = base().meta.clone();
        f(&mut m);
        build(&m, &[TensorEntry::new("token_embd.weight", GgmlType::F16, &[4, 2])])
    };
    let seeds: Vec<(&str, Vec<u8>)> = vec![
        ("nested_100", small_meta(&|m| m.push(("x.deep".into(), nested(100))))),
        (
            "arch_llama",
            small_meta(&|m| set_meta(m, "general.architecture", MetaValue::String("llama".into()))),
        ),
        (
            "ratios_strings",
            small_meta(&|m| {
                set_meta(
                    m,
                    "deepseek4.attention.compress_ratios",
                    MetaValue::Array(vt::STRING, vec![MetaValue::String("0".into())]),
                )
            }),
        ),
    ];
    for (name, bytes) in seeds {
        std::fs::write(dir.join(name), bytes).unwrap();
    }
}
