//! Shared by the `--features hip` integration tests that run the HIP backend without a GPU: builds the
//! HIP runtime on the CPU (kernels/emu/hip_api.cpp, with tools/build-hip-emu.sh) once per state of
//! its sources, shared by the test binaries, and points `DS4_HIP_LIBRARY` at it before the first HIP
//! call, so the unmodified
//! runtime layer, kernel module and forward pass run with every kernel executed by the emulator.
//! `DS4_EMU_WARP=64` builds a wave64 emulator (default wave32).
//!
//! Without a C++ compiler the tests print "SKIPPED" and pass, except under CI (tests/support/skip.rs),
//! where that is a failure.
#![allow(dead_code)]

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::OnceLock;

use ds4_chat::backend::DeviceSession;
use ds4_chat::backend::arithmetic::Arithmetic;
use ds4_chat::backend::hip::kernel_module::KernelModule;
use ds4_chat::backend::hip::{HipContext, HipOptions, HipSession};
use ds4_chat::engine::backend_open::{OpenedModel, PlacementRequest, open_device_model};
use ds4_chat::engine::events::{BackendChoice, WeightsMode};
use ds4_chat::genmodel::{ExpertMix, GenSpec, Preset, model_bytes};
use ds4_chat::gguf::GgufFile;
use ds4_chat::model::Model;
use ds4_chat::model::hparams::HParams;

/// A HipSession of `model` on the emulator, made directly so that a test chooses its `options`.
pub fn emulated_backend(model: Arc<Model>, ctx: usize, options: HipOptions) -> HipSession {
    let hip = HipContext::new().expect("emulated HIP runtime");
    let kernels = KernelModule::load(&hip).expect("kernel module");
    HipSession::new(hip, kernels, model, ctx, options).expect("HipSession on the emulator")
}

/// [`emulated_backend`] with the exact kernels whatever `options` says: these tests compare bits.
pub fn exact_backend(model: Arc<Model>, ctx: usize, options: HipOptions) -> HipSession {
    let options = HipOptions {
        arithmetic: Arithmetic::Exact,
        ..options
    };
    emulated_backend(model, ctx, options)
}

/// Build the emulator runtime and select it for this process; `None` (with "SKIPPED" and the reason
/// printed) when no C++ compiler is available, a panic under CI. Call before anything touches HIP;
/// safe to call from every test.
pub fn use_emulated_hip() -> Option<PathBuf> {
    static LIB: OnceLock<Option<PathBuf>> = OnceLock::new();
    LIB.get_or_init(|| {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let warp = std::env::var("DS4_EMU_WARP").unwrap_or_else(|_| "32".to_string());
        // Built once per source state and warp, shared by every test binary (the build is the
        // slowest step of a short emulator test): target/tmp/hip-emu/<hash of the sources>-wave<warp>.
        let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join("hip-emu")
            .join(format!("{:016x}-wave{warp}", sources_hash(&root)));
        let lib = out.join("libamdhip64.so.5");
        let built = if lib.is_file() {
            None
        } else {
            let partial = out.with_extension(format!("partial-{}", std::process::id()));
            let o = std::process::Command::new("bash")
                .arg(root.join("tools/build-hip-emu.sh"))
                .arg(&partial)
                .env("WARP", &warp)
                .output();
            if o.as_ref().is_ok_and(|o| o.status.success()) && std::fs::rename(&partial, &out).is_err() {
                // Another process put the same build in place first.
                let _ = std::fs::remove_dir_all(&partial);
            }
            Some(o)
        };
        match built {
            None => Some(select_emulator(lib)),
            Some(Ok(o)) if o.status.success() => Some(select_emulator(lib)),
            Some(Ok(o)) => {
                let err = String::from_utf8_lossy(&o.stderr);
                if err.contains("no C++ compiler") {
                    skip::skip_or_fail(&format!("the HIP emulator does not build here ({})", err.trim()));
                    None
                } else {
                    panic!("the HIP emulator does not build:\n{err}");
                }
            }
            Some(Err(e)) => panic!("run tools/build-hip-emu.sh: {e}"),
        }
    })
    .clone()
}

/// Points this process's HIP runtime at the emulator library `lib`.
fn select_emulator(lib: PathBuf) -> PathBuf {
    // SAFETY: called once, inside use_emulated_hip's OnceLock initializer, before any test of this
    // binary reads HIP's environment (every HIP test calls use_emulated_hip first).
    unsafe {
        std::env::set_var("DS4_HIP_LIBRARY", &lib);
        std::env::remove_var("DS4_KERNEL_DIR");
    }
    lib
}

/// A hash of what the emulator library is built from: every file under kernels/ (the emulator
/// and the kernels it compiles), the build script and the compiler it is told to use.
fn sources_hash(root: &std::path::Path) -> u64 {
    use std::hash::{Hash, Hasher};
    fn files(dir: &std::path::Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                files(&path, out);
            } else {
                out.push(path);
            }
        }
    }
    let mut paths = vec![root.join("tools/build-hip-emu.sh")];
    files(&root.join("kernels"), &mut paths);
    paths.sort();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for p in &paths {
        p.hash(&mut h);
        std::fs::read(p).unwrap_or_default().hash(&mut h);
    }
    std::env::var("CXX").unwrap_or_default().hash(&mut h);
    h.finish()
}

// Its own copy of the skip helper (stateless): tests/hip_kernels includes this module without
// tests/support, while the binaries that have both load the file twice.
#[allow(clippy::duplicate_mod)]
#[path = "../support/skip.rs"]
pub mod skip;

/// The tiny preset (the full V4 layer structure: ratios [0,0,4,128,4,128], window 16, indexer top-k 4)
/// with a 512-token vocabulary, so the emulated output head stays cheap.
pub fn small_vocab_tiny(seed: u64, experts: ExpertMix) -> Arc<Model> {
    let mut spec = GenSpec::new(Preset::Tiny, seed, experts);
    spec.hp.n_vocab = 512;
    spec.tokenizer = false;
    let bytes = model_bytes(&spec).expect("generate the model");
    Arc::new(Model::bind(Arc::new(GgufFile::from_bytes(bytes).expect("parse"))).expect("bind"))
}

/// What the emulator has done on the calling thread since it started (operations run on the thread
/// that submits them, so a test's own backends are counted apart from other tests').
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThreadCounts {
    /// Kernels executed, directly or by graph replays.
    pub kernels_run: u64,
    /// Stream captures begun (decode graphs captured).
    pub captures: u64,
}

/// The emulator's counts for this thread (`ds4emu_thread_counts` in kernels/emu/hip_api.cpp).
pub fn thread_counts() -> ThreadCounts {
    type CountsFn = unsafe extern "C" fn(*mut u64, *mut u64);
    static COUNTS: OnceLock<usize> = OnceLock::new();
    let f = *COUNTS.get_or_init(|| {
        let lib = use_emulated_hip().expect("the emulated HIP runtime is in use");
        let path = CString::new(lib.as_os_str().as_bytes()).expect("library path without NUL");
        // SAFETY: the path names the emulator library the backend loads; dlopen of a loaded
        // library returns that same object (its thread-local counters).
        let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW) };
        assert!(!handle.is_null(), "dlopen {}", lib.display());
        // SAFETY: a live handle and a NUL-terminated name.
        let sym = unsafe { libc::dlsym(handle, c"ds4emu_thread_counts".as_ptr()) };
        assert!(!sym.is_null(), "the emulator library has no ds4emu_thread_counts");
        sym as usize
    });
    // SAFETY: the symbol is `void ds4emu_thread_counts(unsigned long long*, unsigned long long*)`.
    let f: CountsFn = unsafe { std::mem::transmute::<usize, CountsFn>(f) };
    let (mut kernels_run, mut captures) = (0u64, 0u64);
    // SAFETY: two valid pointers to u64 (unsigned long long).
    unsafe { f(&mut kernels_run, &mut captures) };
    ThreadCounts { kernels_run, captures }
}

/// Kernels the emulator runs on this thread while `f` runs.
pub fn kernels_run_by<T>(f: impl FnOnce() -> T) -> (T, u64) {
    let before = thread_counts().kernels_run;
    let out = f();
    (out, thread_counts().kernels_run - before)
}

/// One layer's session cache laid out like the CPU engine's `LayerCache`: rows as f32, oldest first.
#[derive(Clone, Debug, Default)]
pub struct LayerCacheView {
    /// Raw rows of the last min(n_past, window) positions, [rows][head_dim].
    pub raw: Vec<f32>,
    /// Compressed attention rows emitted so far, [rows][head_dim] (ratio != 0).
    pub comp: Vec<f32>,
    /// Indexer rows emitted so far, [rows][idx_head_dim] (ratio 4).
    pub index: Vec<f32>,
    /// Compressor kv and score state of the attention rows, then of the indexer rows.
    pub state: Vec<f32>,
}

/// Every layer's cache of a HIP session, as the backend-neutral rows it exports for session
/// snapshots (`DeviceSession::export_cache`, src/backend/cache_rows.rs): the ring read in position order.
pub fn hip_cache(b: &dyn DeviceSession, hp: &HParams) -> Vec<LayerCacheView> {
    let rows = b.export_cache().expect("the HIP session exports its cache");
    assert_eq!(rows.layers.len(), hp.n_layer, "one entry per layer");
    rows.layers
        .into_iter()
        .map(|l| {
            let mut v = LayerCacheView {
                raw: l.raw,
                ..LayerCacheView::default()
            };
            if let Some(c) = l.comp {
                v.comp = c.rows;
                v.state.extend(c.kv);
                v.state.extend(c.score);
            }
            if let Some(i) = l.index {
                v.index = i.rows;
                v.state.extend(i.kv);
                v.state.extend(i.score);
            }
            v
        })
        .collect()
}

/// `n` deterministic token ids (an LCG from `seed`) below `vocab`.
pub fn lcg_ids(n: usize, seed: u64, vocab: u64) -> Vec<u32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 33) % vocab) as u32
        })
        .collect()
}

/// `backend` opened on `model` with its weights copied, one CPU thread and the kernels'
/// `arithmetic`, and a first session of `ctx` tokens; a failure panics with its one line.
pub fn open_copied(model: &Arc<Model>, backend: BackendChoice, arithmetic: Arithmetic, ctx: usize) -> OpenedModel {
    let at = PlacementRequest {
        backend,
        weights: WeightsMode::Copy,
        arithmetic,
        threads: 1,
    };
    open_device_model(model.clone(), &at, ctx).unwrap_or_else(|e| panic!("{e}"))
}
