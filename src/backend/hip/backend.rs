//! Opening the HIP engine for a model (the entry point `engine::backend_open` calls): the weights
//! placed once (`engine::HipEngine`), sessions opened from it.
//!
//! Owns the checks made before any weights move and the weight placement policy:
//! * runtime and device present, kernels that load on it, every expert type supported;
//! * the forward-pass gate (`forward_enabled`): the device forward pass is validated against the
//!   CPU engine and the shared reference vectors on an NVIDIA H200 through the HIP-on-CUDA shim and
//!   on the CPU emulator (tests/hip-on-cuda/results/), so it opens by default; `DS4_HIP_FORWARD=0`
//!   turns it off (the CPU backend is then used, with that reason);
//! * the memory guard: device memory (`hipMemGetInfo`) must hold the KV cache and scratch, plus the
//!   weights when they are copied, before anything is allocated ("too little device memory: need X,
//!   have Y"); on unified memory (integrated GPUs, gfx115x) a copy is pinned system RAM, so its
//!   budget is the GTT limit and the usable RAM instead (`engine::placement`);
//! * `--weights auto|copy|map`: auto copies when the weights fit next to the session, else maps the
//!   file (zero copy); a refused registration falls back to a copy when that fits, else fails.
//!
//! Every failure is one line; `--backend auto` then falls back to the CPU with it as the reason.

use std::sync::Arc;

use crate::backend::{Backend, WeightsPlacement};
use crate::engine::events::WeightPlacement;
use crate::engine::memguard;
use crate::engine::placement::{self, CopyBudget, DeviceFacts};
use crate::model::Model;

use super::engine::HipEngine;
use super::footprint::{SessionBytes, session_bytes};
use super::forward::HipBackend;
use super::kernel_module::KernelModule;
use super::runtime::HipContext;
use super::weights::{DeviceWeights, data_section_bytes};

/// Environment variable that enables the device forward pass before it is validated (`1`), or
/// turns it off once it is (`0`).
pub const FORWARD_ENV: &str = "DS4_HIP_FORWARD";

/// Whether the device forward pass has passed validation: `selftest --backend hip --forward`, the
/// kernel checks and the case A reference vectors on the H200 (2026-11-30, through the shim; no AMD
/// GPU was available). With `true`, `--backend auto` takes the GPU unless `DS4_HIP_FORWARD=0`.
pub const FORWARD_VALIDATED: bool = true;

/// Device memory kept free next to the weights and the session: allocation rounding, the runtime's
/// own buffers and the bench's bandwidth probe.
pub const DEVICE_RESERVE: u64 = 64 << 20;

/// Whether the forward pass may open here: validated (unless `DS4_HIP_FORWARD=0`), or enabled by
/// `DS4_HIP_FORWARD=1`.
pub fn forward_enabled() -> bool {
    forward_enabled_by(FORWARD_VALIDATED, std::env::var(FORWARD_ENV).ok().as_deref())
}

fn forward_enabled_by(validated: bool, env: Option<&str>) -> bool {
    match env {
        Some("1") => true,
        Some("0") => false,
        _ => validated,
    }
}

/// Bytes for messages: MiB below 1 GiB, else GiB.
pub fn fmt_size(b: u64) -> String {
    if b >= 1 << 30 {
        format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
    }
}

/// The memory guard's one line: "too little device memory: need X, have Y <detail>".
pub fn too_little_memory(need: u64, have: u64, detail: &str) -> String {
    format!(
        "too little device memory: need {}, have {} {detail}",
        fmt_size(need),
        fmt_size(have)
    )
}

/// Open the HIP backend for `model` with a cache of `ctx` tokens, or give the one-line reason it
/// cannot run here.
pub fn open_backend(model: Arc<Model>, weights: WeightPlacement, ctx: usize) -> Result<Box<dyn Backend>, String> {
    open_backend_with_progress(model, weights, ctx, &mut |_, _| {})
}

/// `open_backend` reporting the weight copy: `progress(done, total)` bytes after every chunk.
pub fn open_backend_with_progress(
    model: Arc<Model>,
    weights: WeightPlacement,
    ctx: usize,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Box<dyn Backend>, String> {
    let engine = open_engine_with_progress(model, weights, ctx, progress)?;
    Ok(Box::new(engine.session(ctx)?))
}

/// Place `model`'s weights on the device for sessions of about `ctx` tokens (the placement plan
/// counts one such session), reporting a copy as `progress(done, total)` bytes after every chunk.
pub fn open_engine_with_progress(
    model: Arc<Model>,
    weights: WeightPlacement,
    ctx: usize,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<HipEngine, String> {
    let hip = HipContext::new().map_err(|e| e.to_string())?;
    let kernels = KernelModule::load(&hip)?;
    if !forward_enabled() {
        return Err(format!(
            "the HIP forward pass is not validated on AMD hardware yet; set {FORWARD_ENV}=1 to use it ({} is usable and its kernels for {} load; selftest --backend hip checks them)",
            hip.name(),
            kernels.target
        ));
    }
    HipBackend::check_model(&model)?;
    let session = session_bytes(&model.hp, ctx);
    let budget = copy_budget_of(&hip, &kernels.target)?;
    let plan = plan_placement(
        weights,
        data_section_bytes(&model.file),
        session,
        budget.free,
        budget.total,
        &budget.label,
        &|_| None,
    )?;
    let (placed, reason) = place_weights(&hip, &model, plan, progress)?;
    Ok(HipEngine::new(hip, kernels, model, placed, reason))
}

/// The placement chosen before anything is allocated.
#[derive(Clone, Debug, PartialEq)]
pub enum Plan {
    /// Copy; the string says why (empty when asked for).
    Copy(String),
    /// Map the file; when `copy_fallback` the copy fits too (used if registration is refused).
    Map { reason: String, copy_fallback: bool },
}

/// Decide the placement from device memory: `free`/`total` from hipMemGetInfo, `weight_bytes` to
/// copy, the `session` (KV + scratch) that lives in device memory either way. `host_refuses_copy`
/// gives the reason pinned host RAM cannot hold a copy (integrated GPUs), if so.
pub fn plan_placement(
    asked: WeightPlacement,
    weight_bytes: u64,
    session: SessionBytes,
    free: u64,
    total: u64,
    device: &str,
    host_refuses_copy: &dyn Fn(u64) -> Option<String>,
) -> Result<Plan, String> {
    let session_need = session.kv + session.scratch + DEVICE_RESERVE;
    let copy_need = weight_bytes + session_need;
    let breakdown = |with_weights: bool| {
        format!(
            "free of {} on {device} ({}KV {} + scratch {} + reserve {})",
            fmt_size(total),
            if with_weights {
                format!("weights {} + ", fmt_size(weight_bytes))
            } else {
                String::new()
            },
            fmt_size(session.kv),
            fmt_size(session.scratch),
            fmt_size(DEVICE_RESERVE)
        )
    };
    if session_need > free {
        return Err(too_little_memory(
            if asked == WeightPlacement::Map {
                session_need
            } else {
                copy_need
            },
            free,
            &format!("{}; use a smaller --ctx", breakdown(asked != WeightPlacement::Map)),
        ));
    }
    let copy_refusal = if copy_need > free {
        Some(too_little_memory(copy_need, free, &breakdown(true)))
    } else {
        host_refuses_copy(weight_bytes)
    };
    match (asked, copy_refusal) {
        (WeightPlacement::Copy, None) => Ok(Plan::Copy(String::new())),
        (WeightPlacement::Copy, Some(why)) => Err(format!("{why}; use --weights map or a smaller --ctx")),
        (WeightPlacement::Map, refusal) => Ok(Plan::Map {
            reason: String::new(),
            copy_fallback: refusal.is_none(),
        }),
        (WeightPlacement::Auto, None) => Ok(Plan::Copy(format!(
            "auto: the weights fit device memory ({} of {} free)",
            fmt_size(copy_need),
            fmt_size(free)
        ))),
        (WeightPlacement::Auto, Some(why)) => Ok(Plan::Map {
            reason: format!("auto: no room for a copy ({why})"),
            copy_fallback: false,
        }),
    }
}

/// The memory a copy must fit: device memory on a discrete GPU; on unified memory the GTT limit
/// and the usable RAM (`engine::placement`), read from amdgpu sysfs and /proc/meminfo.
fn copy_budget_of(hip: &HipContext, gfx: &str) -> Result<CopyBudget, String> {
    let (free, total) = hip.mem_info().map_err(|e| e.to_string())?;
    let dev = DeviceFacts {
        name: hip.name().to_string(),
        gfx: gfx.to_string(),
        integrated: hip.info().integrated,
        free,
        total,
    };
    let host = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| placement::unified_facts(&t, memguard::find_amdgpu_memory().as_ref()));
    Ok(placement::copy_budget(&dev, host.as_ref()))
}

/// Place the weights as planned; returns them with the reason for the side panel.
fn place_weights(
    hip: &HipContext,
    model: &Model,
    plan: Plan,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(DeviceWeights, String), String> {
    // A copy's reason ends with how the file was read (O_DIRECT, or plain reads and why).
    let with_method = |reason: String, w: &DeviceWeights| {
        if reason.is_empty() {
            w.method.clone()
        } else {
            format!("{reason}; {}", w.method)
        }
    };
    match plan {
        Plan::Copy(reason) => {
            let w = DeviceWeights::upload(hip, model, progress)?;
            let reason = with_method(reason, &w);
            Ok((w, reason))
        }
        Plan::Map { reason, copy_fallback } => match DeviceWeights::map(hip, model) {
            Ok(w) => Ok((w, reason)),
            Err(e) if copy_fallback => {
                let w = DeviceWeights::upload(hip, model, progress)?;
                let reason = with_method(format!("map refused, copied instead: {e}"), &w);
                Ok((w, reason))
            }
            Err(e) => Err(format!("--weights map: {e}; a copy does not fit device memory either")),
        },
    }
}

/// The placement the backend reports, from the placed weights.
pub fn placement_of(w: &DeviceWeights, reason: String) -> WeightsPlacement {
    WeightsPlacement {
        copied: !w.is_mapped(),
        bytes: w.len_bytes() as u64,
        seconds: w.upload_seconds,
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::genmodel::{ExpertMix, GenSpec, Preset, model_bytes};
    use crate::gguf::GgufFile;

    #[test]
    fn opening_gives_a_one_line_reason_and_never_a_half_backend() {
        // No AMD GPU here (CI, development machines): the reason names the runtime's answer. With a GPU
        // and the gate closed the reason is the gate. Either way the engine falls back.
        let bytes = model_bytes(&GenSpec::new(Preset::Micro, 1, ExpertMix::Q2)).unwrap();
        let model = Arc::new(Model::bind(Arc::new(GgufFile::from_bytes(bytes).unwrap())).unwrap());
        for placement in [WeightPlacement::Auto, WeightPlacement::Map, WeightPlacement::Copy] {
            match open_backend(model.clone(), placement, 64) {
                Ok(_) if forward_enabled() => {}
                Ok(_) => panic!("the HIP backend must not open with the forward gate closed"),
                Err(e) => {
                    eprintln!("{e}");
                    assert!(
                        e.starts_with("no AMD GPU: ") || e.contains("not validated") || forward_enabled(),
                        "{e}"
                    );
                    assert!(!e.contains('\n'), "{e}");
                }
            }
        }
    }

    #[test]
    fn the_gate_is_one_constant_and_the_variable_overrides_it() {
        assert!(!forward_enabled_by(false, None));
        assert!(!forward_enabled_by(false, Some("")));
        assert!(forward_enabled_by(false, Some("1")));
        assert!(forward_enabled_by(true, None));
        assert!(!forward_enabled_by(true, Some("0")));
    }

    const MIB: u64 = 1 << 20;

    fn session() -> SessionBytes {
        SessionBytes {
            kv: 100 * MIB,
            scratch: 36 * MIB,
        }
    }

    fn no_host_limit(_: u64) -> Option<String> {
        None
    }

    #[test]
    fn auto_copies_when_weights_fit_and_maps_otherwise() {
        // Session 100 + 36 + 64 reserve = 200 MiB; weights 800 MiB; a copy needs 1000 MiB.
        let plan = |asked, free| plan_placement(asked, 800 * MIB, session(), free, 4096 * MIB, "dev", &no_host_limit);
        assert!(matches!(plan(WeightPlacement::Auto, 1000 * MIB), Ok(Plan::Copy(r)) if r.starts_with("auto: ")));
        match plan(WeightPlacement::Auto, 999 * MIB) {
            Ok(Plan::Map {
                reason,
                copy_fallback: false,
            }) => {
                assert!(reason.contains("need 1000.0 MiB, have 999.0 MiB"), "{reason}");
            }
            p => panic!("{p:?}"),
        }
        // Map asked: a copy that fits is kept as the fallback for a refused registration.
        assert_eq!(
            plan(WeightPlacement::Map, 1000 * MIB),
            Ok(Plan::Map {
                reason: String::new(),
                copy_fallback: true
            })
        );
        // Copy asked but too big: one line with both numbers and the fixes.
        let e = plan(WeightPlacement::Copy, 999 * MIB).unwrap_err();
        assert!(
            e.starts_with("too little device memory: need 1000.0 MiB, have 999.0 MiB free of 4.00 GiB on dev"),
            "{e}"
        );
        assert!(e.contains("weights 800.0 MiB + KV 100.0 MiB + scratch 36.0 MiB") && e.ends_with("--ctx"));
        // Not even the session fits: refused whatever the placement.
        for asked in [WeightPlacement::Auto, WeightPlacement::Map, WeightPlacement::Copy] {
            let e = plan(asked, 199 * MIB).unwrap_err();
            assert!(e.starts_with("too little device memory: need "), "{e}");
            assert!(e.contains("have 199.0 MiB") && !e.contains('\n'), "{e}");
        }
        let e = plan(WeightPlacement::Map, 199 * MIB).unwrap_err();
        assert!(e.starts_with("too little device memory: need 200.0 MiB"), "{e}");
    }

    #[test]
    fn host_ram_limits_a_copy_on_integrated_gpus() {
        let refuse = |_: u64| Some("not enough memory: pinned RAM".to_string());
        let plan = |asked| plan_placement(asked, 800 * MIB, session(), 4096 * MIB, 4096 * MIB, "apu", &refuse);
        assert!(
            matches!(plan(WeightPlacement::Auto), Ok(Plan::Map { copy_fallback: false, reason }) if reason.contains("pinned RAM"))
        );
        assert!(plan(WeightPlacement::Copy).unwrap_err().contains("pinned RAM"));
    }
}
