//! Shared pieces of the reference-vector harness (tests/vectors.rs): locating the vectors (vendored in
//! tests/fixtures/vectors), rebuilding and caching tiny_a.gguf with tools/gen_tiny_gguf.py, reading
//! `.npy` logits, and the comparison figures of tests/fixtures/vectors/README.md as plain functions
//! over numbers (so they can be tested on synthetic data without any model).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// sha256 of the case A model file the vectors were recorded on (tests/fixtures/vectors/README.md).
pub const TINY_A_SHA256: &str = "78e4ad2fa157c5f8be6f2332d32e849a67fbc4a24195cbcdc62ad2391b15a57f";

/// Size of that file in bytes.
pub const TINY_A_BYTES: u64 = 145_854_528;

/// The README's required tolerances (stricter than ds4's own noise floor by a safe factor).
#[derive(Clone, Copy, Debug)]
pub struct Tolerances {
    /// Mean |Δ next-token logprob| over all positions.
    pub next_mean: f64,
    /// Max |Δ next-token logprob|, and max |Δ logprob| over ds4's top-20 ids.
    pub max_abs: f64,
    /// Argmax must agree where ds4's top1−top2 margin exceeds this; greedy must agree up to the
    /// first step whose margin is at most this.
    pub margin: f64,
    /// Last prompt position, full vector: rms Δ logprob and KL(ds4‖ours).
    pub last_rms: f64,
    pub last_kl: f64,
}

pub const README_TOLERANCES: Tolerances = Tolerances {
    next_mean: 0.10,
    max_abs: 0.50,
    margin: 0.25,
    last_rms: 0.10,
    last_kl: 0.01,
};

/// The HIP backend's fast arithmetic (docs/arithmetic.md) against the same vectors: next-token
/// |Δlogprob| mean ≤ 0.05, every next-token and top-20 |Δlogprob| ≤ 1.0, the argmax (and greedy)
/// equal wherever ds4's top1−top2 margin exceeds 1.0; the last prompt position's full vector keeps
/// the README's rms and KL bounds.
pub const FAST_TOLERANCES: Tolerances = Tolerances {
    next_mean: 0.05,
    max_abs: 1.0,
    margin: 1.0,
    last_rms: 0.10,
    last_kl: 0.01,
};

/// The repository the vectors and tools/gen_tiny_gguf.py are read from: the checkout the test was
/// built in, else the working directory (a test binary carried to another machine, as the H200
/// validation does, runs in a copy of the repository at another path).
fn repo_root() -> PathBuf {
    let built = Path::new(env!("CARGO_MANIFEST_DIR"));
    if built.join("tools/gen_tiny_gguf.py").is_file() {
        built.to_path_buf()
    } else {
        std::env::current_dir().unwrap_or_else(|_| built.to_path_buf())
    }
}

/// Where the vectors are: `$DS4_VECTORS` if set, else the copy vendored in tests/fixtures/vectors.
pub fn vectors_dir() -> PathBuf {
    match std::env::var_os("DS4_VECTORS").filter(|p| !p.is_empty()) {
        Some(p) => PathBuf::from(p),
        None => repo_root().join("tests/fixtures/vectors"),
    }
}

/// The tiny preset written once by `ds4-chat gen-model` (same seed, same bytes) to
/// `CARGO_TARGET_TMPDIR/serve-tiny.gguf`, for the tests that run `ds4-chat serve` on it.
pub fn serve_tiny_model() -> PathBuf {
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join("serve-tiny.gguf");
    // One writer per process: the tests of a binary run on threads of one process, which share the
    // partial file's name below.
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    if !path.is_file() {
        // A name of its own per process: two test binaries may write it at once.
        let tmp = path.with_extension(format!("partial-{}", std::process::id()));
        run_ok(
            Command::new(env!("CARGO_BIN_EXE_ds4-chat"))
                .args(["gen-model", "--preset", "tiny", "--out"])
                .arg(&tmp),
            "ds4-chat gen-model",
        );
        std::fs::rename(&tmp, &path).expect("move the tiny model in place");
    }
    path
}

/// Runs `cmd` to completion and returns its output; panics naming `what` (with its stderr) when it
/// cannot start or exits unsuccessfully.
pub fn run_ok(cmd: &mut Command, what: &str) -> std::process::Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

pub mod skip;
pub use skip::skip_or_fail;

/// The vectors directory. The vendored copy is always there; a `$DS4_VECTORS` that does not hold
/// case A is a mistake and fails the test.
pub fn require_vectors() -> PathBuf {
    let dir = vectors_dir();
    assert!(
        dir.join("case_a/prompts").is_dir() && dir.join("case_a.json").is_file(),
        "reference vectors not found at {} (case_a/prompts and case_a.json; DS4_VECTORS overrides \
         the vendored tests/fixtures/vectors)",
        dir.display()
    );
    dir
}

fn cache_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"));
    target.join("ds4-vectors")
}

/// sha256 of a file via coreutils `sha256sum`.
pub fn sha256_file(path: &Path) -> Result<String, String> {
    let out = Command::new("sha256sum")
        .arg(path)
        .output()
        .map_err(|e| format!("cannot run sha256sum on {}: {e}", path.display()))?;
    if !out.status.success() {
        return Err(format!(
            "sha256sum {} failed: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace()
        .next()
        .map(str::to_string)
        .ok_or_else(|| format!("sha256sum printed nothing for {}", path.display()))
}

/// Why a model built by tools/gen_tiny_gguf.py (tiny_a, tiny_b) could not be had.
#[derive(Debug)]
pub enum TinyModelError {
    /// python3 with numpy and gguf is not available here: the checks that need the model skip
    /// (fail under CI).
    ToolsMissing(String),
    /// The rebuild ran and failed, or built a file with another sha256: always a failure.
    Failed(String),
}

/// A model file built by tools/gen_tiny_gguf.py: its case config and the sha256 and size it must have.
#[derive(Clone, Copy, Debug)]
pub struct PinnedModel {
    pub file_name: &'static str,
    /// Case config, relative to the repository root (case A's is read from the vectors directory).
    pub config: &'static str,
    pub sha256: &'static str,
    pub bytes: u64,
}

/// The case A model the vectors were recorded on.
pub const TINY_A: PinnedModel = PinnedModel {
    file_name: "tiny_a.gguf",
    config: "tests/fixtures/vectors/case_a.json",
    sha256: TINY_A_SHA256,
    bytes: TINY_A_BYTES,
};

/// A second model with other dimensions (tests/data/tiny_b_config.json), for the engine's generic-shape
/// checks: no vectors, only properties.
pub const TINY_B: PinnedModel = PinnedModel {
    file_name: "tiny_b.gguf",
    config: "tests/data/tiny_b_config.json",
    sha256: "d4a85dd88e76831cdb22124fea49e00d7c2c0af3248af04a9e22f8c1601beaaf",
    bytes: 224_734_208,
};

/// tiny_a.gguf, built from the vectors' case_a.json.
pub fn tiny_a_model(vectors: &Path) -> Result<PathBuf, TinyModelError> {
    built_model(&TINY_A, &vectors.join("case_a.json"))
}

/// `model` built from its config in the repository.
pub fn repo_model(model: &PinnedModel) -> Result<PathBuf, TinyModelError> {
    built_model(model, &repo_root().join(model.config))
}

/// `model` rebuilt with tools/gen_tiny_gguf.py (the vendored tokenizer) from `config` on first use,
/// cached in target/ds4-vectors/, verified against its pinned sha256 every time.
pub fn built_model(model: &PinnedModel, config: &Path) -> Result<PathBuf, TinyModelError> {
    use TinyModelError::{Failed, ToolsMissing};
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let name = model.file_name;
    let dir = cache_dir();
    let path = dir.join(name);
    if path.is_file() {
        let sha = sha256_file(&path).map_err(ToolsMissing)?;
        if sha == model.sha256 {
            return Ok(path);
        }
        eprintln!(
            "cached {} has sha256 {sha}, expected {}: rebuilding",
            path.display(),
            model.sha256
        );
    }
    std::fs::create_dir_all(&dir).map_err(|e| Failed(format!("cannot create {}: {e}", dir.display())))?;

    match Command::new("python3").args(["-c", "import numpy, gguf"]).output() {
        Err(e) => {
            return Err(ToolsMissing(format!(
                "python3 not found ({e}); tools/gen_tiny_gguf.py needs python3 with numpy and gguf \
                 (pip install numpy gguf) to build {name}"
            )));
        }
        Ok(o) if !o.status.success() => {
            return Err(ToolsMissing(format!(
                "python3 lacks numpy/gguf ({}); tools/gen_tiny_gguf.py needs them (pip install numpy gguf) \
                 to build {name}",
                String::from_utf8_lossy(&o.stderr).lines().last().unwrap_or("").trim()
            )));
        }
        Ok(_) => {}
    }

    let tmp = dir.join(format!("{name}.{}.tmp", std::process::id()));
    let t0 = std::time::Instant::now();
    let out = Command::new("python3")
        .arg(repo_root().join("tools/gen_tiny_gguf.py"))
        .arg("--config")
        .arg(config)
        .arg("--out")
        .arg(&tmp)
        .output()
        .map_err(|e| Failed(format!("cannot run python3 tools/gen_tiny_gguf.py: {e}")))?;
    if !out.status.success() {
        let _ = std::fs::remove_file(&tmp);
        return Err(Failed(format!(
            "tools/gen_tiny_gguf.py failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or("")
        )));
    }
    let sha = sha256_file(&tmp).map_err(Failed)?;
    let len = std::fs::metadata(&tmp).map(|m| m.len()).unwrap_or(0);
    if sha != model.sha256 {
        let _ = std::fs::remove_file(&tmp);
        return Err(Failed(format!(
            "tools/gen_tiny_gguf.py built a {name} with sha256 {sha} ({len} bytes), expected {} ({} bytes)",
            model.sha256, model.bytes
        )));
    }
    std::fs::rename(&tmp, &path).map_err(|e| Failed(format!("cannot move {} into place: {e}", tmp.display())))?;
    eprintln!(
        "built {} in {:.1}s (sha256 verified)",
        path.display(),
        t0.elapsed().as_secs_f64()
    );
    Ok(path)
}

/// tiny_a.gguf for a test that needs it: `None` after `skip_or_fail` where the tools to build it
/// are missing; a panic where building it failed.
pub fn require_tiny_a(vectors: &Path) -> Option<PathBuf> {
    match tiny_a_model(vectors) {
        Ok(path) => Some(path),
        Err(TinyModelError::ToolsMissing(why)) => {
            skip_or_fail(&why);
            None
        }
        Err(TinyModelError::Failed(why)) => panic!("tiny_a.gguf: {why}"),
    }
}

/// A little-endian float32 `.npy` array (version 1–3, C order): its shape and data.
pub fn read_npy_f32(path: &Path) -> Result<(Vec<usize>, Vec<f32>), String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    parse_npy_f32(&bytes).map_err(|e| format!("{}: {e}", path.display()))
}

pub fn parse_npy_f32(bytes: &[u8]) -> Result<(Vec<usize>, Vec<f32>), String> {
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err("not a .npy file (bad magic)".into());
    }
    let major = bytes[6];
    let (header_len, header_start) = match major {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 if bytes.len() >= 12 => (u32::from_le_bytes(bytes[8..12].try_into().unwrap()) as usize, 12),
        _ => return Err(format!("unsupported .npy version {major}")),
    };
    let data_start = header_start + header_len;
    let header = bytes
        .get(header_start..data_start)
        .ok_or("header runs past the end of the file")?;
    let header = std::str::from_utf8(header).map_err(|_| "header is not text")?;
    if !header.contains("'descr': '<f4'") {
        return Err(format!("expected dtype '<f4', header is {}", header.trim()));
    }
    if header.contains("'fortran_order': True") {
        return Err("Fortran-order arrays are not supported".into());
    }
    let shape_text = header
        .split("'shape': (")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .ok_or("header has no shape")?;
    let shape: Vec<usize> = shape_text
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<usize>().map_err(|_| format!("bad shape entry '{s}'")))
        .collect::<Result<_, _>>()?;
    let n: usize = shape.iter().product();
    let data = &bytes[data_start..];
    if data.len() != n * 4 {
        return Err(format!(
            "shape {shape:?} needs {} data bytes, file has {}",
            n * 4,
            data.len()
        ));
    }
    let values = data
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    Ok((shape, values))
}

/// Write a little-endian float32 C-order `.npy` (version 1.0), e.g. for compare_to_oracle.py.
pub fn write_npy_f32(path: &Path, shape: &[usize], data: &[f32]) -> Result<(), String> {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let shape_text = if dims.len() == 1 {
        format!("{},", dims[0])
    } else {
        dims.join(", ")
    };
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({shape_text}), }}");
    while !(10 + header.len() + 1).is_multiple_of(64) {
        header.push(' ');
    }
    header.push('\n');
    let mut bytes = Vec::with_capacity(10 + header.len() + data.len() * 4);
    bytes.extend_from_slice(b"\x93NUMPY\x01\x00");
    bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    for v in data {
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    std::fs::write(path, bytes).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// log-softmax in f64 over all entries (the oracle's logits are all finite).
pub fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&v| (v as f64 - max).exp()).sum();
    let lse = max + sum.ln();
    logits.iter().map(|&v| v as f64 - lse).collect()
}

/// The oracle's record of one teacher-forced position.
#[derive(Clone, Debug)]
pub struct OraclePosition {
    pub argmax: u32,
    pub margin12: f64,
    pub next_token: u32,
    pub next_logprob: f64,
    /// ds4's top-20 as (id, logit, logprob).
    pub top: Vec<(u32, f64, f64)>,
}

impl OraclePosition {
    pub fn from_json(v: &Value) -> Result<OraclePosition, String> {
        let num = |k: &str| v[k].as_f64().ok_or_else(|| format!("position lacks number '{k}'"));
        let top = v["top"]
            .as_array()
            .ok_or("position lacks 'top'")?
            .iter()
            .map(|t| match (t[0].as_u64(), t[1].as_f64(), t[2].as_f64()) {
                (Some(id), Some(logit), Some(lp)) => Ok((id as u32, logit, lp)),
                _ => Err(format!("bad top entry {t}")),
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(OraclePosition {
            argmax: num("argmax")? as u32,
            margin12: num("margin12")?,
            next_token: num("next_token")? as u32,
            next_logprob: num("next_logprob")?,
            top,
        })
    }
}

/// How one of our positions differs from the oracle's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PositionDelta {
    pub next_abs: f64,
    pub top_max_abs: f64,
    pub our_argmax: u32,
}

pub fn position_delta(oracle: &OraclePosition, logits: &[f32]) -> PositionDelta {
    let lp = log_softmax(logits);
    let next_abs = (lp[oracle.next_token as usize] - oracle.next_logprob).abs();
    let top_max_abs = oracle
        .top
        .iter()
        .map(|&(id, _, l)| (lp[id as usize] - l).abs())
        .fold(0.0, f64::max);
    PositionDelta {
        next_abs,
        top_max_abs,
        our_argmax: ds4_chat::engine::sampler::argmax(logits),
    }
}

/// The teacher-forced figures over all positions and their verdict.
#[derive(Clone, Debug, Default)]
pub struct PositionsReport {
    pub n: usize,
    pub next_mean: f64,
    pub next_max: f64,
    pub next_worst_pos: usize,
    pub top_max: f64,
    pub top_worst_pos: usize,
    /// (position, ds4 argmax, our argmax, ds4 margin12) where ds4's margin exceeded the tolerance.
    pub hard_argmax: Vec<(usize, u32, u32, f64)>,
    pub near_tie_argmax: usize,
}

impl PositionsReport {
    pub fn passes(&self, tol: &Tolerances) -> bool {
        self.n > 0
            && self.next_mean <= tol.next_mean
            && self.next_max <= tol.max_abs
            && self.top_max <= tol.max_abs
            && self.hard_argmax.is_empty()
    }
}

pub fn summarize_positions(oracle: &[OraclePosition], deltas: &[PositionDelta], tol: &Tolerances) -> PositionsReport {
    let mut r = PositionsReport {
        n: deltas.len(),
        ..Default::default()
    };
    let mut sum = 0.0;
    for (i, (o, d)) in oracle.iter().zip(deltas).enumerate() {
        sum += d.next_abs;
        if d.next_abs > r.next_max {
            r.next_max = d.next_abs;
            r.next_worst_pos = i;
        }
        if d.top_max_abs > r.top_max {
            r.top_max = d.top_max_abs;
            r.top_worst_pos = i;
        }
        if d.our_argmax != o.argmax {
            if o.margin12 > tol.margin {
                r.hard_argmax.push((i, o.argmax, d.our_argmax, o.margin12));
            } else {
                r.near_tie_argmax += 1;
            }
        }
    }
    if r.n > 0 {
        r.next_mean = sum / r.n as f64;
    }
    r
}

/// Full-vector figures at one position: rms Δ logprob, max |Δ|, KL(reference ‖ ours).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FullVectorReport {
    pub rms: f64,
    pub max_abs: f64,
    pub kl: f64,
    pub argmax_equal: bool,
}

impl FullVectorReport {
    pub fn passes(&self, tol: &Tolerances) -> bool {
        self.rms <= tol.last_rms && self.kl <= tol.last_kl
    }
}

pub fn compare_full_vector(reference: &[f32], ours: &[f32]) -> FullVectorReport {
    assert_eq!(reference.len(), ours.len(), "vector lengths differ");
    let lr = log_softmax(reference);
    let lo = log_softmax(ours);
    let (mut sq, mut max_abs, mut kl) = (0.0, 0.0f64, 0.0);
    for (&a, &b) in lr.iter().zip(&lo) {
        let d = b - a;
        sq += d * d;
        max_abs = max_abs.max(d.abs());
        kl += a.exp() * (a - b);
    }
    FullVectorReport {
        rms: (sq / lr.len() as f64).sqrt(),
        max_abs,
        kl,
        argmax_equal: ds4_chat::engine::sampler::argmax(reference) == ds4_chat::engine::sampler::argmax(ours),
    }
}

/// Greedy agreement: tokens must match up to and including the first step whose ds4 margin12 is at
/// most `margin`; a mismatch at such a near-tie step is allowed, and nothing after it is compared.
/// Returns (ok, steps agreeing before the comparison stopped). How many steps had to agree is
/// [`must_match_prefix`]; a caller sums it over its prompts and requires a stated minimum, so that a
/// run which compared nothing fails.
pub fn greedy_agreement(ours: &[u32], reference: &[u32], margins: &[f64], margin: f64) -> (bool, usize) {
    let near_tie = |i: usize| margins.get(i).copied().unwrap_or(0.0) <= margin;
    for (i, &b) in reference.iter().enumerate() {
        // A missing token (ours stopped early) counts as a mismatch.
        if ours.get(i) != Some(&b) {
            return (near_tie(i), i);
        }
        if near_tie(i) {
            return (true, i + 1);
        }
    }
    (true, reference.len())
}

/// Steps of ds4's greedy continuation that any correct engine must reproduce: all steps before the
/// first one whose margin12 is at most `margin` (that step itself may differ).
pub fn must_match_prefix(margins: &[f64], margin: f64) -> usize {
    margins.iter().position(|&m| m <= margin).unwrap_or(margins.len())
}

pub fn load_json(path: &Path) -> Result<Value, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: bad JSON: {e}", path.display()))
}

pub fn u32_list(v: &Value) -> Vec<u32> {
    v.as_array()
        .map(|a| a.iter().filter_map(|x| x.as_u64()).map(|x| x as u32).collect())
        .unwrap_or_default()
}

pub fn hex_bytes(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .filter_map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok())
        .collect()
}
