//! `doctor`'s verdicts: one [`Check`] per line, computed from the probed [`Facts`] alone.
//!
//! Why these: on a Strix Halo (gfx1151, unified memory) the GPU sees system RAM through GTT, whose
//! limit is half the RAM unless `ttm.pages_limit` raises it (amdgpu.gttsize is deprecated); a BIOS
//! carve-out takes RAM away from GTT; ROCm needs /dev/kfd and a render node the user may open
//! (groups render and video); `power_dpm_force_performance_level=high` measured +5 % decode and
//! +20 % prefill. Owns the thresholds and the fix texts.

use super::probe::{Access, Facts, ModelFile, Rocm};
use crate::backend::copy_budget::{is_unified, usable_ram};

const GIB: u64 = 1 << 30;

/// Size of the current q2 file: the reference when no model is named.
pub const Q2_FILE_BYTES: u64 = 86_720_111_488;

/// A carve-out above this takes RAM that GTT and the page cache need on a unified device.
pub const CARVE_OUT_LIMIT: u64 = 4 * GIB;

/// Oldest kernel whose amdgpu drives gfx1151 with ROCm.
pub const MIN_KERNEL: (u32, u32) = (6, 11);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Ok,
    /// Works, but slower or riskier than it could be; does not fail the run.
    Warn,
    Fail,
    /// Not applicable without something an earlier line reported missing.
    Skip,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Check {
    pub status: Status,
    pub name: &'static str,
    pub detail: String,
    /// What to do about a Warn or Fail.
    pub fix: String,
}

impl Check {
    fn ok(name: &'static str, detail: String) -> Check {
        Check {
            status: Status::Ok,
            name,
            detail,
            fix: String::new(),
        }
    }

    fn bad(status: Status, name: &'static str, detail: String, fix: &str) -> Check {
        Check {
            status,
            name,
            detail,
            fix: fix.to_string(),
        }
    }

    fn skip(name: &'static str, why: &str) -> Check {
        Check {
            status: Status::Skip,
            name,
            detail: why.to_string(),
            fix: String::new(),
        }
    }

    /// "FAIL  gtt          <detail>; fix: <fix>".
    pub fn line(&self) -> String {
        let status = match self.status {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "FAIL",
            Status::Skip => "skip",
        };
        let mut l = format!("{status:<5} {:<12} {}", self.name, self.detail);
        if !self.fix.is_empty() {
            l.push_str("; fix: ");
            l.push_str(&self.fix);
        }
        l
    }
}

fn gib(b: u64) -> String {
    format!("{:.1} GiB", b as f64 / GIB as f64)
}

fn parse_kernel(release: &str) -> Option<(u32, u32)> {
    let mut it = release.split(|c: char| !c.is_ascii_digit());
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

/// Bytes a copy of the model needs next to its KV cache: the named file, else the q2 file.
fn needed(f: &Facts) -> (u64, String) {
    match &f.model {
        Some(m) if m.what.is_ok() && m.dspark_bytes > 0 => (
            m.bytes + m.dspark_bytes + m.session_bytes,
            format!(
                "model + DSpark support + KV at ctx {} = {}",
                f.ctx,
                gib(m.bytes + m.dspark_bytes + m.session_bytes)
            ),
        ),
        Some(m) if m.what.is_ok() => (
            m.bytes + m.session_bytes,
            format!("model + KV at ctx {} = {}", f.ctx, gib(m.bytes + m.session_bytes)),
        ),
        _ => (Q2_FILE_BYTES, format!("the q2 file = {}", gib(Q2_FILE_BYTES))),
    }
}

fn node_check(name: &'static str, path: &str, a: &Access) -> Check {
    let groups_fix = "sudo usermod -aG render,video $USER, then log out and in";
    match a {
        Access::ReadWrite => Check::ok(name, format!("{path} read-write")),
        Access::Denied { gid } => Check::bad(
            Status::Fail,
            name,
            format!("{path} not accessible (owned by group {gid}, which this user is not in)"),
            groups_fix,
        ),
        Access::Missing => Check::bad(
            Status::Fail,
            name,
            format!("{path} missing"),
            "load the amdgpu kernel driver (modprobe amdgpu); ROCm needs it",
        ),
    }
}

/// Every check, in output order.
pub fn diagnose(f: &Facts) -> Vec<Check> {
    let mut out = Vec::new();
    let rocm_major = |v: &str| v.split('.').next().and_then(|m| m.parse::<u32>().ok());
    let gfx115 = f.gpu.as_ref().is_some_and(|g| g.gfx.starts_with("gfx115"));
    out.push(match &f.rocm {
        Rocm::Found { path, version } => {
            let detail = format!(
                "{} ({})",
                path.display(),
                version.as_deref().unwrap_or("version unknown")
            );
            match version.as_deref().and_then(rocm_major) {
                Some(major) if gfx115 && major < 7 => Check::bad(
                    Status::Fail,
                    "rocm",
                    format!("{detail}: gfx115x needs ROCm 7.0 or newer"),
                    "install ROCm 7 (amdgpu-install --usecase=rocm --no-dkms)",
                ),
                _ => Check::ok("rocm", detail),
            }
        }
        Rocm::Missing { looked_in } => Check::bad(
            Status::Fail,
            "rocm",
            format!("libamdhip64 not found (looked in {looked_in})"),
            "install ROCm 7 (the HIP runtime), or set DS4_HIP_LIBRARY to libamdhip64.so",
        ),
    });
    let Some(gpu) = &f.gpu else {
        out.push(Check::bad(
            Status::Fail,
            "gpu",
            "no AMD GPU in the KFD topology (/sys/class/kfd/kfd/topology/nodes)".into(),
            "load the amdgpu driver on a machine with an AMD GPU; ds4-chat runs on the CPU otherwise",
        ));
        for name in ["gpu code", "gtt", "carve-out", "perf level"] {
            out.push(Check::skip(name, "no GPU"));
        }
        push_host_checks(f, &mut out, false);
        return out;
    };
    out.push(Check::ok("gpu", format!("device 0 is {}", gpu.gfx)));
    out.push(if f.embedded.contains(&gpu.gfx) {
        Check::ok("gpu code", format!("this binary embeds code for {}", gpu.gfx))
    } else if f.embedded.is_empty() {
        Check::bad(
            Status::Fail,
            "gpu code",
            "this binary has no GPU code (built without --features hip)".into(),
            &format!("cargo build --release --features hip with DS4_HIP_ARCHS={}", gpu.gfx),
        )
    } else {
        Check::bad(
            Status::Fail,
            "gpu code",
            format!(
                "this binary has no code for {} (it has {})",
                gpu.gfx,
                f.embedded.join(", ")
            ),
            &format!("rebuild with DS4_HIP_ARCHS={}", gpu.gfx),
        )
    });
    let unified = is_unified(false, &gpu.gfx);
    let (need, need_what) = needed(f);
    let pages = f.ttm_pages_limit.map_or("ttm.pages_limit not set".to_string(), |p| {
        format!("ttm.pages_limit {p}")
    });
    out.push(match (unified, gpu.gtt_total) {
        (false, _) => Check::ok(
            "gtt",
            format!(
                "discrete GPU: {} VRAM, the weights are copied when they fit it",
                gpu.vram_total.map_or("unknown".into(), gib)
            ),
        ),
        (true, None) => Check::bad(
            Status::Fail,
            "gtt",
            "mem_info_gtt_total unreadable".into(),
            "check that amdgpu drives the GPU (ls /sys/class/drm/card*/device/mem_info_gtt_total)",
        ),
        (true, Some(gtt)) if gtt < need => {
            let ram = f.mem_total.unwrap_or(128 * GIB);
            let target = ram.saturating_sub(8 * GIB);
            Check::bad(
                Status::Fail,
                "gtt",
                format!("GPU-visible memory {} ({pages}) < {need_what}", gib(gtt)),
                &format!(
                    "add ttm.pages_limit={} ({} in 4 KiB pages) to the kernel command line and reboot \
                     (amdgpu.gttsize is deprecated)",
                    target / 4096,
                    gib(target)
                ),
            )
        }
        (true, Some(gtt)) => Check::ok(
            "gtt",
            format!("GPU-visible memory {} ({pages}) >= {need_what}", gib(gtt)),
        ),
    });
    out.push(match (unified, gpu.vram_total) {
        (false, _) => Check::skip("carve-out", "discrete GPU"),
        (true, Some(v)) if v > CARVE_OUT_LIMIT => Check::bad(
            Status::Fail,
            "carve-out",
            format!("BIOS reserves {} of RAM as VRAM, which GTT cannot use", gib(v)),
            "set the UMA frame buffer to its minimum (512 MiB) in the BIOS; the GPU gets its memory through GTT",
        ),
        (true, v) => Check::ok(
            "carve-out",
            format!("BIOS carve-out {}", v.map_or("unknown".into(), gib)),
        ),
    });
    out.push(match gpu.perf_level.as_deref() {
        Some("high") => Check::ok("perf level", "power_dpm_force_performance_level high".into()),
        Some(level) => Check::bad(
            Status::Warn,
            "perf level",
            format!("power_dpm_force_performance_level {level} (high measured +5% decode, +20% prefill)"),
            &format!(
                "echo high | sudo tee {}",
                gpu.card.as_ref().map_or_else(
                    || "/sys/class/drm/card0/device/power_dpm_force_performance_level".to_string(),
                    |c| format!("{}/power_dpm_force_performance_level", c.display())
                )
            ),
        ),
        None => Check::skip("perf level", "power_dpm_force_performance_level unreadable"),
    });
    push_host_checks(f, &mut out, unified);
    out
}

/// Device nodes, kernel, RAM and the model file: checked with or without a GPU.
fn push_host_checks(f: &Facts, out: &mut Vec<Check>, unified: bool) {
    out.push(node_check("kfd", "/dev/kfd", &f.kfd));
    out.push(match &f.render {
        Some((p, a)) => node_check(
            "render node",
            &format!("/dev/dri/{}", p.file_name().unwrap_or_default().display()),
            a,
        ),
        None => node_check("render node", "/dev/dri/renderD*", &Access::Missing),
    });
    out.push(match f.kernel.as_deref().map(|r| (r, parse_kernel(r))) {
        Some((r, Some(v))) if v >= MIN_KERNEL => Check::ok("kernel", format!("Linux {r}")),
        Some((r, _)) => Check::bad(
            Status::Fail,
            "kernel",
            format!("Linux {r} is older than {}.{}", MIN_KERNEL.0, MIN_KERNEL.1),
            "upgrade to a Linux 6.14 or newer kernel (amdgpu support for gfx1151 and large GTT)",
        ),
        None => Check::skip("kernel", "osrelease unreadable"),
    });
    out.push(match f.mem_available {
        None => Check::skip("ram", "meminfo unreadable"),
        Some(avail) => {
            let usable = usable_ram(avail, f.cma_free);
            let (need, need_what) = needed(f);
            if unified && usable < need {
                Check::bad(
                    Status::Fail,
                    "ram",
                    format!(
                        "usable RAM {} (MemAvailable {} - CmaFree {} - 2.0 GiB kept) < {need_what}",
                        gib(usable),
                        gib(avail),
                        gib(f.cma_free)
                    ),
                    "close programs (the copy needs the RAM pinned), or run with --weights map",
                )
            } else {
                Check::ok("ram", format!("usable RAM {}", gib(usable)))
            }
        }
    });
    out.push(match &f.model {
        None => Check::skip("model", "no MODEL given"),
        Some(m) => match &m.what {
            Err(e) => Check::bad(
                Status::Fail,
                "model",
                format!("{}: {e}", m.path.display()),
                "download the q2 file again (hf download antirez/deepseek-v4-gguf ...)",
            ),
            Ok(what) => Check::ok(
                "model",
                format!(
                    "{what}, {}, on {}, {} in the page cache",
                    gib(m.bytes),
                    m.filesystem,
                    m.cached_bytes.map_or("unknown".into(), gib)
                ),
            ),
        },
    });
    if let Some(m) = f.model.as_ref().filter(|m| m.what.is_ok()) {
        match &m.dspark {
            None => {}
            Some(Ok(summary)) => out.push(Check::ok("dspark", format!("{summary}, {}", gib(m.dspark_bytes)))),
            Some(Err(e)) => out.push(Check::bad(
                Status::Fail,
                "dspark",
                e.clone(),
                "download the support file again (ds4's download_model.sh ds4f-dspark) or move it away",
            )),
        }
        out.push(Check::ok("ctx", ctx_need(f.ctx, m)));
    }
}

/// What `--ctx` costs next to the weights (docs/memory.md).
fn ctx_need(ctx: u32, m: &ModelFile) -> String {
    format!(
        "--ctx {ctx} needs KV {} + scratch {}; with the model {} (pass --ctx N to see another)",
        crate::units::fmt_mib_or_gib(m.kv_bytes),
        crate::units::fmt_mib_or_gib(m.session_bytes - m.kv_bytes),
        gib(m.bytes + m.session_bytes)
    )
}

/// Exit status: 0 when no check failed.
pub fn exit_code(checks: &[Check]) -> i32 {
    i32::from(checks.iter().any(|c| c.status == Status::Fail))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_releases_parse() {
        assert_eq!(parse_kernel("6.14.0-15-generic"), Some((6, 14)));
        assert_eq!(parse_kernel("6.8.0"), Some((6, 8)));
        assert_eq!(parse_kernel("x"), None);
        assert!(parse_kernel("6.8.0").unwrap() < MIN_KERNEL);
    }
}
