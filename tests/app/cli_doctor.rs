//! `ds4-chat doctor` on fake machines: sysfs, procfs and /dev trees written under a temporary root
//! (read through `DS4_TEST_SYSFS_ROOT`, `DS4_TEST_PROCFS_ROOT`, `DS4_TEST_DEV_ROOT`) and a fake ROCm library. A
//! ready Strix Halo first, then one broken setup per test: each asserts the exact failing lines
//! and the exit status, through the library and through the binary.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use ds4_chat::cli::doctor::checks::{Status, diagnose, exit_code};
use ds4_chat::cli::doctor::probe::{Roots, gfx_name, probe};

const GIB: u64 = 1 << 30;

/// One fake machine; fields are what the tree will say.
struct Machine {
    gfx_version: Option<u64>,
    vram_total: u64,
    gtt_total: u64,
    perf_level: &'static str,
    pages_limit: Option<u64>,
    mem_available_gib: u64,
    kernel: &'static str,
    in_device_group: bool,
    dev_nodes: bool,
    rocm: bool,
}

/// A 128 GB Strix Halo set up as the README says.
fn ready() -> Machine {
    Machine {
        gfx_version: Some(110501),
        vram_total: 512 << 20,
        gtt_total: 120 * GIB,
        perf_level: "high",
        pages_limit: Some(31_457_280),
        mem_available_gib: 120,
        kernel: "6.14.0-15-generic",
        in_device_group: true,
        dev_nodes: true,
        rocm: true,
    }
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// Write `m` under a fresh directory named `name`; returns its roots.
fn build(name: &str, m: &Machine) -> Roots {
    let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("doctor-{name}"));
    let _ = std::fs::remove_dir_all(&root);
    let sys = root.join("sys");
    let proc = root.join("proc");
    let dev = root.join("dev");
    write(
        &sys.join("class/kfd/kfd/topology/nodes/0/properties"),
        "cpu_cores_count 32\ngfx_target_version 0\n",
    );
    if let Some(v) = m.gfx_version {
        write(
            &sys.join("class/kfd/kfd/topology/nodes/1/properties"),
            &format!("simd_count 80\ngfx_target_version {v}\n"),
        );
        let card = sys.join("class/drm/card1/device");
        write(&card.join("mem_info_vram_total"), &format!("{}\n", m.vram_total));
        write(&card.join("mem_info_gtt_total"), &format!("{}\n", m.gtt_total));
        write(
            &card.join("power_dpm_force_performance_level"),
            &format!("{}\n", m.perf_level),
        );
        write(&sys.join("class/drm/card1-eDP-1/status"), "connected\n");
    }
    if let Some(p) = m.pages_limit {
        write(&sys.join("module/ttm/parameters/pages_limit"), &format!("{p}\n"));
    }
    write(
        &proc.join("meminfo"),
        &format!(
            "MemTotal:       131072000 kB\nMemFree:        1000 kB\nMemAvailable:   {} kB\nCmaFree:        0 kB\n",
            m.mem_available_gib * 1024 * 1024
        ),
    );
    write(&proc.join("sys/kernel/osrelease"), &format!("{}\n", m.kernel));
    if m.dev_nodes {
        for node in ["kfd", "dri/renderD128"] {
            let p = dev.join(node);
            write(&p, "");
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o660)).unwrap();
        }
    }
    // Not the owner of the nodes (a different uid); in their group when the machine says so.
    let me = std::fs::metadata(&root).unwrap();
    let gid = me.gid();
    let groups = if m.in_device_group {
        format!("4 24 {gid}")
    } else {
        "4 24".to_string()
    };
    write(
        &proc.join("self/status"),
        &format!(
            "Name:\tds4-chat\nUid:\t{0}\t{0}\t{0}\t{0}\nGid:\t60001\t60001\t60001\t60001\nGroups:\t{groups}\n",
            me.uid() + 1
        ),
    );
    let lib = root.join("opt/rocm/lib/libamdhip64.so.6.4.60401");
    write(&lib, "");
    write(&root.join("opt/rocm/.info/version"), "7.0.2-17\n");
    std::os::unix::fs::symlink(&lib, root.join("opt/rocm/lib/libamdhip64.so.6")).unwrap();
    Roots {
        sys,
        proc,
        dev,
        hip_library: Some(if m.rocm {
            root.join("opt/rocm/lib/libamdhip64.so.6")
        } else {
            root.join("nowhere/libamdhip64.so")
        }),
    }
}

/// The failing lines and exit status for `m`, with a binary that embeds gfx1151.
fn failures(name: &str, m: &Machine) -> (Vec<String>, i32) {
    let roots = build(name, m);
    lines_of(&roots, &["gfx1100", "gfx1151"], Status::Fail)
}

/// The report lines of `status` for the machine at `roots` with a binary embedding `embedded`,
/// and the exit code of the whole report.
fn lines_of(roots: &Roots, embedded: &[&str], status: Status) -> (Vec<String>, i32) {
    let mut facts = probe(roots, None, 32768);
    facts.embedded = embedded.iter().map(|t| t.to_string()).collect();
    let checks = diagnose(&facts);
    let lines = checks.iter().filter(|c| c.status == status).map(|c| c.line()).collect();
    (lines, exit_code(&checks))
}

/// The binary on `m` must exit 1 with every one of `lines` in its report.
fn assert_binary_fails_with(name: &str, m: &Machine, lines: &[&str]) {
    let (code, out) = run_binary(name, m);
    assert_eq!(code, 1, "{out}");
    for line in lines {
        assert!(out.contains(line), "{line:?} missing from {out}");
    }
}

/// The binary's exit status and stdout on `m` (its own embedded targets).
fn run_binary(name: &str, m: &Machine) -> (i32, String) {
    let roots = build(&format!("{name}-bin"), m);
    let root = roots.sys.parent().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ds4-chat"))
        .arg("doctor")
        .env("DS4_TEST_SYSFS_ROOT", root)
        .env("DS4_TEST_PROCFS_ROOT", root)
        .env("DS4_TEST_DEV_ROOT", root)
        .env("DS4_HIP_LIBRARY", roots.hip_library.unwrap())
        .env("HOME", root)
        .env("XDG_CONFIG_HOME", root.join("config"))
        .output()
        .unwrap();
    (out.status.code().unwrap(), String::from_utf8(out.stdout).unwrap())
}

#[test]
fn gfx_names_come_from_the_kfd_target_version() {
    for (version, name) in [
        (110501, "gfx1151"),
        (90402, "gfx942"),
        (100300, "gfx1030"),
        (120001, "gfx1201"),
    ] {
        assert_eq!(gfx_name(version), name);
    }
}

#[test]
fn a_ready_strix_halo_passes() {
    let (failing, code) = failures("ready", &ready());
    assert_eq!(failing, Vec::<String>::new());
    assert_eq!(code, 0);
    let roots = build("ready-lines", &ready());
    let mut facts = probe(&roots, None, 32768);
    facts.embedded = vec!["gfx1151".into()];
    let lines: Vec<String> = diagnose(&facts).iter().map(|c| c.line()).collect();
    assert!(
        lines[0].starts_with("ok    rocm         ") && lines[0].ends_with("libamdhip64.so.6 (7.0.2-17)"),
        "{lines:?}"
    );
    assert_eq!(lines[1], "ok    gpu          device 0 is gfx1151");
    assert_eq!(lines[2], "ok    gpu code     this binary embeds code for gfx1151");
    assert_eq!(
        lines[3],
        "ok    gtt          GPU-visible memory 120.0 GiB (ttm.pages_limit 31457280) >= the q2 file = 80.8 GiB"
    );
    assert_eq!(lines[4], "ok    carve-out    BIOS carve-out 0.5 GiB");
    assert_eq!(lines[5], "ok    perf level   power_dpm_force_performance_level high");
    assert_eq!(lines[6], "ok    kfd          /dev/kfd read-write");
    assert_eq!(lines[7], "ok    render node  /dev/dri/renderD128 read-write");
    assert_eq!(lines[8], "ok    kernel       Linux 6.14.0-15-generic");
    assert_eq!(lines[9], "ok    ram          usable RAM 118.0 GiB");
    assert_eq!(lines[10], "skip  model        no MODEL given");
    // The binary: ready only when it was built with GPU code for gfx1151.
    let (code, out) = run_binary("ready", &ready());
    let has_code = cfg!(feature = "hip") && out.contains("ok    gpu code");
    assert_eq!(code, if has_code { 0 } else { 1 }, "{out}");
    assert_eq!(out.lines().count(), if has_code { 12 } else { 11 }, "{out}");
}

#[test]
fn gtt_at_the_default_62_gib() {
    let m = Machine {
        gtt_total: 62 * GIB,
        pages_limit: None,
        ..ready()
    };
    let (failing, code) = failures("gtt62", &m);
    assert_eq!(
        failing,
        [
            "FAIL  gtt          GPU-visible memory 62.0 GiB (ttm.pages_limit not set) < the q2 file = 80.8 GiB; fix: \
          add ttm.pages_limit=30670848 (117.0 GiB in 4 KiB pages) to the kernel command line and reboot \
          (amdgpu.gttsize is deprecated)"
        ]
    );
    assert_eq!(code, 1);
    assert_binary_fails_with("gtt62", &m, &[&failing[0]]);
}

#[test]
fn a_96_gib_bios_carve_out() {
    let m = Machine {
        vram_total: 96 * GIB,
        gtt_total: 16 * GIB,
        mem_available_gib: 28,
        ..ready()
    };
    let (failing, code) = failures("carve96", &m);
    assert_eq!(
        failing,
        [
            "FAIL  gtt          GPU-visible memory 16.0 GiB (ttm.pages_limit 31457280) < the q2 file = 80.8 GiB; fix: \
             add ttm.pages_limit=30670848 (117.0 GiB in 4 KiB pages) to the kernel command line and reboot \
             (amdgpu.gttsize is deprecated)",
            "FAIL  carve-out    BIOS reserves 96.0 GiB of RAM as VRAM, which GTT cannot use; fix: set the UMA frame \
             buffer to its minimum (512 MiB) in the BIOS; the GPU gets its memory through GTT",
            "FAIL  ram          usable RAM 26.0 GiB (MemAvailable 28.0 GiB - CmaFree 0.0 GiB - 2.0 GiB kept) < the q2 \
             file = 80.8 GiB; fix: close programs (the copy needs the RAM pinned), or run with --weights map",
        ]
    );
    assert_eq!(code, 1);
}

#[test]
fn a_user_outside_the_render_group() {
    let m = Machine {
        in_device_group: false,
        ..ready()
    };
    let (failing, code) = failures("nogroup", &m);
    let gid = std::fs::metadata(env!("CARGO_TARGET_TMPDIR")).unwrap().gid();
    let fix = "fix: sudo usermod -aG render,video $USER, then log out and in";
    assert_eq!(
        failing,
        [
            format!(
                "FAIL  kfd          /dev/kfd not accessible (owned by group {gid}, which this user is not in); {fix}"
            ),
            format!(
                "FAIL  render node  /dev/dri/renderD128 not accessible (owned by group {gid}, which this user is not in); {fix}"
            ),
        ]
    );
    assert_eq!(code, 1);
    assert_binary_fails_with("nogroup", &m, &[&failing[1]]);
}

#[test]
fn no_rocm_installed() {
    let m = Machine { rocm: false, ..ready() };
    let (failing, code) = failures("norocm", &m);
    assert_eq!(failing.len(), 1, "{failing:?}");
    assert!(failing[0].starts_with("FAIL  rocm         libamdhip64 not found (looked in DS4_HIP_LIBRARY="));
    assert!(failing[0].ends_with(
        "nowhere/libamdhip64.so); fix: install ROCm 7 (the HIP runtime), or set DS4_HIP_LIBRARY to libamdhip64.so"
    ));
    assert_eq!(code, 1);
    assert_binary_fails_with("norocm", &m, &["FAIL  rocm "]);
}

#[test]
fn rocm_6_on_a_gfx1151() {
    let roots = build("rocm6", &ready());
    std::fs::write(
        roots.sys.parent().unwrap().join("opt/rocm/.info/version"),
        "6.4.1-60401\n",
    )
    .unwrap();
    let (failing, code) = lines_of(&roots, &["gfx1151"], Status::Fail);
    assert_eq!(failing.len(), 1, "{failing:?}");
    assert!(
        failing[0].ends_with(
            "libamdhip64.so.6 (6.4.1-60401): gfx115x needs ROCm 7.0 or newer; fix: install ROCm 7 \
             (amdgpu-install --usecase=rocm --no-dkms)"
        ),
        "{failing:?}"
    );
    assert_eq!(code, 1);
}

#[test]
fn an_unknown_gfx_target() {
    let m = Machine {
        gfx_version: Some(120500),
        ..ready()
    };
    let (failing, code) = failures("gfx1250", &m);
    assert_eq!(
        failing,
        [
            "FAIL  gpu code     this binary has no code for gfx1250 (it has gfx1100, gfx1151); fix: rebuild with \
          DS4_HIP_ARCHS=gfx1250"
        ]
    );
    assert_eq!(code, 1);
}

#[test]
fn no_gpu_at_all_still_reports_the_rest() {
    let m = Machine {
        gfx_version: None,
        dev_nodes: false,
        ..ready()
    };
    let roots = build("nogpu", &m);
    let facts = probe(&roots, None, 32768);
    let lines: Vec<String> = diagnose(&facts).iter().map(|c| c.line()).collect();
    assert_eq!(
        lines[1],
        "FAIL  gpu          no AMD GPU in the KFD topology (/sys/class/kfd/kfd/topology/nodes); fix: load the amdgpu \
         driver on a machine with an AMD GPU; ds4-chat runs on the CPU otherwise"
    );
    for (i, name) in ["gpu code", "gtt", "carve-out", "perf level"].iter().enumerate() {
        assert_eq!(lines[2 + i], format!("skip  {name:<12} no GPU"));
    }
    let fix = "fix: load the amdgpu kernel driver (modprobe amdgpu); ROCm needs it";
    assert_eq!(lines[6], format!("FAIL  kfd          /dev/kfd missing; {fix}"));
    assert_eq!(lines[7], format!("FAIL  render node  /dev/dri/renderD* missing; {fix}"));
    assert_eq!(lines[8], "ok    kernel       Linux 6.14.0-15-generic");
    assert_eq!(exit_code(&diagnose(&facts)), 1);
    assert_binary_fails_with("nogpu", &m, &[&lines[1], &lines[6]]);
}

#[test]
fn an_old_kernel() {
    let m = Machine {
        kernel: "6.8.0-45-generic",
        ..ready()
    };
    let (failing, code) = failures("oldkernel", &m);
    assert_eq!(
        failing,
        [
            "FAIL  kernel       Linux 6.8.0-45-generic is older than 6.11; fix: upgrade to a Linux 6.14 or newer kernel \
          (amdgpu support for gfx1151 and large GTT)"
        ]
    );
    assert_eq!(code, 1);
}

#[test]
fn too_little_free_ram_for_a_pinned_copy() {
    let m = Machine {
        mem_available_gib: 60,
        ..ready()
    };
    let (failing, code) = failures("busyram", &m);
    assert_eq!(
        failing,
        [
            "FAIL  ram          usable RAM 58.0 GiB (MemAvailable 60.0 GiB - CmaFree 0.0 GiB - 2.0 GiB kept) < the q2 \
          file = 80.8 GiB; fix: close programs (the copy needs the RAM pinned), or run with --weights map"
        ]
    );
    assert_eq!(code, 1);
}

#[test]
fn the_performance_level_only_warns() {
    let m = Machine {
        perf_level: "auto",
        ..ready()
    };
    let roots = build("perfauto", &m);
    let (warn, code) = lines_of(&roots, &["gfx1151"], Status::Warn);
    assert_eq!(warn.len(), 1);
    assert!(
        warn[0].starts_with(
            "warn  perf level   power_dpm_force_performance_level auto (high measured +5% decode, +20% prefill); \
             fix: echo high | sudo tee "
        ) && warn[0].ends_with("/sys/class/drm/card1/device/power_dpm_force_performance_level"),
        "{warn:?}"
    );
    assert_eq!(code, 0);
}

#[test]
fn a_model_file_is_described() {
    let roots = build("model", &ready());
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("doctor-model");
    let not_gguf = dir.join("DeepSeek-V4-Flash-IQ2XXS-w2Q2K-AProjQ8-SExpQ8-OutQ8-chat-v2-imatrix-0731.gguf");
    std::fs::write(&not_gguf, b"not a gguf").unwrap();
    let facts = probe(&roots, Some(&not_gguf), 32768);
    let model = diagnose(&facts).into_iter().find(|c| c.name == "model").unwrap();
    assert_eq!(model.status, Status::Fail);
    assert!(
        model
            .line()
            .starts_with(&format!("FAIL  model        {}: ", not_gguf.display())),
        "{}",
        model.line()
    );
    let m = facts.model.unwrap();
    assert_eq!(m.bytes, 10);
}
