//! Build script: GPU kernel code objects for the `hip` feature.
//!
//! Always writes `$OUT_DIR/ds4_code_objects.rs` (included by
//! src/backend/hip/kernels/code_objects.rs) with the embedded AMD code objects. Without the `hip`
//! feature the table is empty and nothing is compiled, so the default build stays fast.
//!
//! With `hip`, kernels/ds4.hip is compiled by tools/build-kernels-amd.sh (one bare code object per
//! target; clang and device-library discovery are documented there) for the targets in
//! `DS4_HIP_ARCHS` (comma or space separated; default gfx1151, gfx1100, gfx1201) and embedded with
//! `include_bytes!`; the runtime picks the one matching the device. If no suitable compiler is found
//! the build fails with the script's one-line reason, unless `DS4_SKIP_AMD_KERNELS=1`: then the
//! binary has no embedded AMD kernels and says so at run time (NVIDIA kernels always come from
//! `$DS4_KERNEL_DIR`, built by tools/build-kernels-nvcc.sh).

use std::env;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

const DEFAULT_ARCHS: &str = "gfx1151 gfx1100 gfx1201";

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=kernels");
    println!("cargo:rerun-if-changed=tools/build-kernels-amd.sh");
    for var in [
        "DS4_HIP_ARCHS",
        "DS4_HIP_CLANG",
        "DS4_ROCM_DEVLIBS",
        "ROCM_PATH",
        "DS4_SKIP_AMD_KERNELS",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));
    let table = out.join("ds4_code_objects.rs");

    if env::var_os("CARGO_FEATURE_HIP").is_none() {
        write_table(&table, &[], "built without the hip feature");
        return;
    }

    let archs_var = env::var("DS4_HIP_ARCHS").unwrap_or_else(|_| DEFAULT_ARCHS.to_string());
    let archs: Vec<String> = archs_var
        .split([',', ' '])
        .filter(|a| !a.is_empty())
        .map(str::to_string)
        .collect();
    for a in &archs {
        if !a.starts_with("gfx") || !a[3..].chars().all(|c| c.is_ascii_hexdigit()) || a.len() < 6 {
            panic!("DS4_HIP_ARCHS: '{a}' is not an AMD target like gfx1151");
        }
    }
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let kdir = out.join("kernels");
    let run = Command::new("bash")
        .arg(manifest.join("tools/build-kernels-amd.sh"))
        .arg(&kdir)
        .args(&archs)
        .output();
    let skip = env::var("DS4_SKIP_AMD_KERNELS").is_ok_and(|v| v == "1");
    let failure = match &run {
        Err(e) => Some(format!("cannot run bash tools/build-kernels-amd.sh: {e}")),
        Ok(o) if !o.status.success() => {
            let err = String::from_utf8_lossy(&o.stderr);
            let last = err
                .lines()
                .rev()
                .find(|l| l.starts_with("kernels:"))
                .unwrap_or("kernel compilation failed");
            Some(format!("{last}\n{err}"))
        }
        Ok(_) => None,
    };
    if let Some(msg) = failure {
        if skip {
            println!(
                "cargo:warning=no embedded AMD kernels (DS4_SKIP_AMD_KERNELS=1): {}",
                msg.lines().next().unwrap_or("")
            );
            write_table(&table, &[], "AMD kernel compilation skipped (DS4_SKIP_AMD_KERNELS=1)");
            return;
        }
        panic!("{msg}\n(set DS4_SKIP_AMD_KERNELS=1 to build without embedded AMD kernels)");
    }
    let stdout = String::from_utf8_lossy(&run.as_ref().unwrap().stdout).to_string();
    for line in stdout.lines().filter(|l| l.starts_with("kernels:")) {
        println!("cargo:warning={line}");
    }
    let objects: Vec<(String, PathBuf)> = archs
        .iter()
        .map(|a| (a.clone(), kdir.join(format!("ds4_kernels.{a}.hsaco"))))
        .collect();
    write_table(&table, &objects, "compiled by build.rs");
}

fn write_table(path: &Path, objects: &[(String, PathBuf)], note: &str) {
    let mut s = String::new();
    s.push_str("/// (target, code object) for every AMD target compiled into this binary.\n");
    s.push_str("pub static EMBEDDED_CODE_OBJECTS: &[(&str, &[u8])] = &[\n");
    for (arch, file) in objects {
        let _ = writeln!(s, "    ({arch:?}, include_bytes!({:?})),", file.display().to_string());
    }
    s.push_str("];\n");
    let _ = writeln!(
        s,
        "/// How the table above was made.\npub const EMBEDDED_NOTE: &str = {note:?};"
    );
    std::fs::write(path, s).expect("write ds4_code_objects.rs");
}
