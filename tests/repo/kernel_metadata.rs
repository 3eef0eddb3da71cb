//! The gfx1151 (Strix Halo) code object's own resource metadata and the decode projection tools
//! (docs/strix-halo-projection.md):
//!
//! * no hot kernel (fast-mode decode and prefill) uses scratch memory on gfx1151: register spills
//!   there would put a slow memory round trip into every wave. `tools/kernel-metadata.py --check`
//!   builds kernels/ds4.hip for gfx1151 with tools/build-kernels-amd.sh (cached in
//!   target/kernel-metadata/ by a hash of the kernel sources) and reads `llvm-readelf --notes`;
//! * the Python unit tests of that tool and of tools/project-strix-halo.py pass.
//!
//! Without clang-19/ROCm or python3 a check prints a "SKIPPED" line; under CI=true it fails.

use crate::support;

use std::path::Path;
use std::process::Command;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn have(cmd: &str, arg: &str) -> bool {
    Command::new(cmd).arg(arg).output().is_ok_and(|o| o.status.success())
}

/// A HIP-capable clang as tools/build-kernels-amd.sh looks for it.
fn have_hip_clang() -> bool {
    if std::env::var_os("DS4_HIP_CLANG").is_some() {
        return true;
    }
    if std::env::var_os("ROCM_PATH").is_some_and(|rocm| Path::new(&rocm).join("llvm/bin/clang").exists()) {
        return true;
    }
    ["clang-19", "/usr/lib/llvm-19/bin/clang", "clang-20", "clang-21"]
        .iter()
        .any(|c| have(c, "--version"))
}

#[test]
fn hot_kernels_use_no_scratch_on_gfx1151() {
    if !have("python3", "--version") {
        return support::skip_or_fail("python3 not found");
    }
    if !have_hip_clang() {
        return support::skip_or_fail("no HIP-capable clang (apt-get install clang-19 lld-19 llvm-19)");
    }
    let out = Command::new("python3")
        .arg(repo().join("tools/kernel-metadata.py"))
        .args(["--arch", "gfx1151", "--check"])
        .current_dir(repo())
        .output()
        .expect("run tools/kernel-metadata.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // The table on the terminal even when the test passes (scratch lines name the cold spills).
    eprintln!("{stdout}");
    assert!(
        out.status.success(),
        "tools/kernel-metadata.py --check failed: {}",
        stderr.trim()
    );
    // The table is real: the decode matvec is there, with wave32 and a VGPR count.
    let row = stdout
        .lines()
        .find(|l| l.starts_with("| ds4_matvec_q8_0_fast |"))
        .unwrap_or_else(|| panic!("no ds4_matvec_q8_0_fast row in:\n{stdout}"));
    let cells: Vec<&str> = row.split('|').map(str::trim).collect();
    let vgprs: u32 = cells[2].parse().expect("VGPR count");
    assert!((1..=256).contains(&vgprs), "{row}");
    assert_eq!(cells[7], "32", "gfx1151 kernels run in wave32: {row}");
}

#[test]
fn strix_tools_unit_tests() {
    if !have("python3", "--version") {
        return support::skip_or_fail("python3 not found");
    }
    support::run_ok(
        Command::new("python3")
            .arg(repo().join("tools/test_strix_tools.py"))
            .current_dir(repo()),
        "tools/test_strix_tools.py",
    );
}
