//! Every GPU kernel (kernels/*.hip) against the CPU reference engine (`backend::cpu`) on random inputs
//! of every weight format and odd sizes, through the production launch builders
//! (`backend::hip::kernels`), kernel module and HIP runtime layer.
//!
//! Where it runs:
//! * CI and any machine without a GPU: on the CPU emulator of the HIP runtime (tests/hip_emu,
//!   kernels/emu/hip_api.cpp), wave32, and wave64 in a child process of this binary.
//! * A GPU: set `DS4_HIP_LIBRARY` to the HIP runtime (or the NVIDIA shim of tests/hip-on-cuda, with
//!   `DS4_KERNEL_DIR` naming the nvcc cubins) and run the compiled binary
//!   (`cargo test --release --features hip --test hip_kernels --no-run`); no emulator is built.
//!
//! Groups: one module per kernel source, `<op>` for kernels/<op>.hip and `<op>_fast` for
//! kernels/<op>_fast.hip, and `fast_twins` (the fast twins `kernels::fast_twin` picks, against their
//! exact kernels). `DS4_KERNEL_SEED` changes the random inputs (default 1);
//! `DS4_KERNEL_CHECKS=moe,hc` runs only those groups (the coverage check then does not apply, nor in
//! the wave64 rerun, which skips the checks that cannot depend on the wave size). Each check prints
//! one line; the test fails if any check fails, some kernel of the module was never launched, or
//! (after a full run on the wave32 emulator) kernels/INDEX.md differs from the index generated from
//! the kernel table and the groups' launches (`index`).
#![cfg(feature = "hip")]

#[path = "../hip_emu/mod.rs"]
mod hip_emu;

mod attention;
mod attention_case;
mod attention_fast;
mod compressor;
mod compressor_fast;
mod emulator;
mod fast_twins;
mod gemm;
mod gemm_fast;
mod hc;
mod hc_fast;
mod index;
mod indexer;
mod indexer_fast;
mod matvec;
mod matvec_cols;
mod matvec_cols_fast;
mod matvec_fast;
mod moe;
mod moe_case;
mod moe_fast;
mod norm_quant;
mod rows;
mod sample;
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::OnceLock;

use ds4_chat::backend::hip::kernels::ALL_KERNELS;
use support::{CheckResult, CheckRng, Gpu, Verdict};

/// Whether the HIP runtime was named from outside (a real device or the NVIDIA shim) rather than the
/// emulator this binary builds. Read once, before `use_emulated_hip` sets `DS4_HIP_LIBRARY` itself.
fn on_device() -> bool {
    static DEVICE: OnceLock<bool> = OnceLock::new();
    *DEVICE.get_or_init(|| std::env::var_os("DS4_HIP_LIBRARY").is_some())
}

/// The device of this process, or `None` when the emulator cannot be built here (no C++ compiler,
/// outside CI).
pub fn open_gpu() -> Option<Gpu> {
    if !on_device() && hip_emu::use_emulated_hip().is_none() {
        return None;
    }
    Some(Gpu::open().unwrap_or_else(|e| panic!("HIP device: {e}")))
}

type Group = fn(&Gpu, &mut CheckRng, &mut dyn FnMut(CheckResult));

/// The groups in run order, each named by its module.
macro_rules! groups {
    ($($group:ident),* $(,)?) => {
        &[$((stringify!($group), $group::run as Group)),*]
    };
}

const GROUPS: &[(&str, Group)] = groups!(
    norm_quant,
    matvec,
    matvec_cols,
    gemm,
    gemm_fast,
    moe,
    hc,
    attention,
    rows,
    compressor,
    indexer,
    sample,
    fast_twins,
    hc_fast,
    compressor_fast,
    matvec_fast,
    matvec_cols_fast,
    moe_fast,
    attention_fast,
    indexer_fast,
);

#[test]
fn every_kernel_matches_the_cpu_reference() {
    let Some(gpu) = open_gpu() else { return };
    let seed = std::env::var("DS4_KERNEL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let only = std::env::var("DS4_KERNEL_CHECKS").ok().filter(|s| !s.is_empty());
    println!(
        "kernel checks on {} ({} kernels for {}, {}), seed {seed}",
        gpu.ctx.info().summary(),
        ALL_KERNELS.len(),
        gpu.kernels.target,
        gpu.kernels.source
    );
    let mut rng = CheckRng::new(seed);
    let mut results = Vec::new();
    let mut last = std::time::Instant::now();
    let mut emit = |r: CheckResult| {
        println!("{r} [{:.2} s]", last.elapsed().as_secs_f64());
        last = std::time::Instant::now();
        results.push(r);
    };
    if let Some(o) = only.as_deref() {
        let unknown: Vec<&str> = o.split(',').filter(|g| !GROUPS.iter().any(|(n, _)| n == g)).collect();
        assert!(
            unknown.is_empty(),
            "DS4_KERNEL_CHECKS names no group {} (groups: {})",
            unknown.join(", "),
            GROUPS.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
        );
    }
    // kernel -> the groups that launched it
    let mut groups_of: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for &(name, group) in GROUPS {
        if only.as_deref().is_none_or(|o| o.split(',').any(|g| g == name)) {
            let t0 = std::time::Instant::now();
            group(&gpu, &mut rng, &mut emit);
            println!("group {name}: {:.1} s", t0.elapsed().as_secs_f64());
            for kernel in std::mem::take(&mut *gpu.launched.borrow_mut()) {
                groups_of.entry(kernel).or_default().insert(name);
            }
        }
    }
    if only.is_none() && !support::wave_rerun() {
        let missing: Vec<&str> = ALL_KERNELS
            .iter()
            .map(|k| k.name)
            .filter(|n| !groups_of.contains_key(n))
            .collect();
        assert!(missing.is_empty(), "kernels no check launched: {}", missing.join(", "));
        if !on_device() {
            check_index(&groups_of);
        }
    }
    let failed: Vec<&str> = results
        .iter()
        .filter(|r| r.verdict == Verdict::Fail)
        .map(|r| r.name.as_str())
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} kernel checks failed: {}",
        failed.len(),
        results.len(),
        failed.join(", ")
    );
}

/// kernels/INDEX.md against the index generated from the kernel table and this run's launches (a
/// full run on the wave32 emulator: the launches do not depend on the random inputs). The generated
/// index is written to `index::generated_path()` first, for tools/kernel-index.sh.
fn check_index(groups_of: &BTreeMap<&str, BTreeSet<&str>>) {
    let generated = index::generate(groups_of);
    let out = index::generated_path();
    std::fs::create_dir_all(out.parent().expect("a parent directory")).expect("create the index's directory");
    std::fs::write(&out, &generated).unwrap_or_else(|e| panic!("{}: {e}", out.display()));
    let committed = std::fs::read_to_string(index::committed_path()).unwrap_or_default();
    assert!(
        committed == generated,
        "kernels/INDEX.md is stale (the kernel table, the builders or the checks changed): run \
         tools/kernel-index.sh, or copy {} over it",
        out.display()
    );
}

/// The wave64 emulator runs this binary's tests again in a child process (a process loads one HIP
/// runtime, and the emulator's wave size is fixed when it is built).
#[test]
fn wave64_emulator_passes_the_same_checks() {
    if on_device() || std::env::var_os("DS4_EMU_WARP").is_some() || hip_emu::use_emulated_hip().is_none() {
        return;
    }
    let exe = std::env::current_exe().expect("this test binary");
    let out = std::process::Command::new(exe)
        .args(["--skip", "wave64_emulator_passes_the_same_checks", "--nocapture"])
        .env("DS4_EMU_WARP", "64")
        .env_remove("DS4_HIP_LIBRARY")
        .output()
        .expect("run this test binary again");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("wave64:\n{text}");
    assert!(
        out.status.success(),
        "the wave64 emulator fails the kernel checks (output above)"
    );
}
