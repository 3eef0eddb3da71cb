//! Shared by the `--features hip` integration tests that run the HIP backend without a GPU: builds the
//! HIP runtime on the CPU (kernels/emu/hip_api.cpp, the same command as tools/build-hip-emu.sh) once
//! per test binary and points `DS4_HIP_LIBRARY` at it before the first HIP call, so the unmodified
//! runtime layer, kernel module and forward pass run with every kernel executed by the emulator.
//! `DS4_EMU_WARP=64` builds a wave64 emulator (default wave32).
//!
//! Without a C++ compiler the tests print "SKIPPED" and pass, except under CI (`CI=true`), where that
//! is a failure.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::OnceLock;

use ds4_chat::genmodel::{ExpertMix, GenSpec, Preset, model_bytes};
use ds4_chat::gguf::GgufFile;
use ds4_chat::model::Model;
use std::sync::Arc;

/// Build the emulator runtime and select it for this process; `None` (with "SKIPPED" and the reason
/// printed) when no C++ compiler is available, a panic under CI. Call before anything touches HIP;
/// safe to call from every test.
pub fn use_emulated_hip() -> Option<PathBuf> {
    static LIB: OnceLock<Option<PathBuf>> = OnceLock::new();
    LIB.get_or_init(|| {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("hip-emu-{}", std::process::id()));
        let warp = std::env::var("DS4_EMU_WARP").unwrap_or_else(|_| "32".to_string());
        let built = std::process::Command::new("bash")
            .arg(root.join("tools/build-hip-emu.sh"))
            .arg(&out)
            .env("WARP", &warp)
            .output();
        match built {
            Ok(o) if o.status.success() => {
                let lib = out.join("libamdhip64.so.5");
                // SAFETY: set once, inside the OnceLock initializer, before any test of this binary
                // reads HIP's environment (every HIP test calls this function first).
                unsafe {
                    std::env::set_var("DS4_HIP_LIBRARY", &lib);
                    std::env::set_var("DS4_HIP_FORWARD", "1");
                    std::env::remove_var("DS4_KERNEL_DIR");
                }
                Some(lib)
            }
            Ok(o) => {
                let err = String::from_utf8_lossy(&o.stderr);
                if err.contains("no C++ compiler") {
                    let msg = format!("HIP emulator tests: SKIPPED ({})", err.trim());
                    assert!(!under_ci(), "{msg}; CI=true, so this is a failure");
                    // Straight to stderr: the test harness captures eprintln! of passing tests.
                    use std::io::Write;
                    let _ = writeln!(std::io::stderr(), "\n*** {msg} ***\n");
                    None
                } else {
                    panic!("the HIP emulator does not build:\n{err}");
                }
            }
            Err(e) => panic!("run tools/build-hip-emu.sh: {e}"),
        }
    })
    .clone()
}

/// True when running under CI (`CI=true`), where a missing C++ compiler is a failure, not a skip.
pub fn under_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// The tiny preset (the full V4 layer structure: ratios [0,0,4,128,4,128], window 16, indexer top-k 4)
/// with a 512-token vocabulary, so the emulated output head stays cheap.
pub fn small_vocab_tiny(seed: u64, experts: ExpertMix) -> Arc<Model> {
    let mut spec = GenSpec::new(Preset::Tiny, seed, experts);
    spec.hp.n_vocab = 512;
    spec.tokenizer = false;
    let bytes = model_bytes(&spec).expect("generate the model");
    Arc::new(Model::bind(Arc::new(GgufFile::from_bytes(bytes).expect("parse"))).expect("bind"))
}
