//! Opening the HIP backend for a model (the entry point `engine::backend_open` calls).
//!
//! Owns the checks made before any weights move and the weight placement policy:
//! * runtime and device present, kernels that load on it, every expert type supported;
//! * the escape hatch `DS4_HIP_FORWARD=0` (`forward_enabled`): the device forward pass is validated
//!   against the CPU engine and the shared reference vectors on an NVIDIA H200 through the
//!   HIP-on-CUDA shim and on the CPU emulator, not yet on AMD hardware; the variable turns it off
//!   (the CPU backend is then used, with that reason);
//! * the memory guard: device memory (`hipMemGetInfo`) must hold the KV cache and scratch, plus the
//!   weights when they are copied, before anything is allocated ("too little device memory: need X,
//!   have Y"); on an integrated GPU a copy is pinned system RAM, so memguard's host check applies too;
//! * `--weights auto|copy|map`: auto copies when the weights fit next to the session, else maps the
//!   file (zero copy); a refused registration falls back to a copy when that fits, else fails.
//!
//! Every failure is one line; `--backend auto` then falls back to the CPU with it as the reason.

use std::sync::Arc;

use crate::backend::Backend;
use crate::engine::events::WeightPlacement;
use crate::engine::memguard::{self, MemoryNeed, MemoryVerdict, WeightResidence};
use crate::model::Model;

use super::backend::HipBackend;
use super::footprint::{SessionBytes, fmt_size, session_bytes, too_little_memory};
use super::kernel_module::KernelModule;
use super::runtime::HipContext;
use super::weights::{DeviceWeights, data_section_bytes};

/// Environment variable that turns the device forward pass off (`0`).
pub const FORWARD_ENV: &str = "DS4_HIP_FORWARD";

/// Device memory kept free next to the weights and the session: allocation rounding, the runtime's
/// own buffers and the bench's bandwidth probe.
pub const DEVICE_RESERVE: u64 = 64 << 20;

/// Whether the forward pass may open here: unless `DS4_HIP_FORWARD=0`.
pub fn forward_enabled() -> bool {
    forward_enabled_by(std::env::var(FORWARD_ENV).ok().as_deref())
}

fn forward_enabled_by(env: Option<&str>) -> bool {
    env != Some("0")
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
    let hip = HipContext::new().map_err(|e| e.to_string())?;
    let kernels = KernelModule::load(&hip)?;
    if !forward_enabled() {
        return Err(format!(
            "{FORWARD_ENV}=0 turns the HIP forward pass off ({} is usable and its kernels for {} load; selftest --backend hip checks them)",
            hip.name(),
            kernels.target
        ));
    }
    HipBackend::check_model(&model)?;
    let session = session_bytes(&model.hp, ctx);
    let (free, total) = hip.mem_info().map_err(|e| e.to_string())?;
    let plan = plan_placement(
        weights,
        data_section_bytes(&model.file),
        session,
        free,
        total,
        hip.name(),
        &|w| copy_refused_by_host(&hip, w, session),
    )?;
    let (placed, reason) = place_weights(&hip, &model, plan, progress)?;
    let backend = HipBackend::with_weights(hip, kernels, model, ctx, placed, reason)?;
    Ok(Box::new(backend))
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

/// On an integrated GPU a copy is pinned system RAM: memguard's unified-memory check (GTT limit
/// from amdgpu sysfs when present, MemAvailable minus the desktop headroom) must pass too.
fn copy_refused_by_host(hip: &HipContext, weight_bytes: u64, session: SessionBytes) -> Option<String> {
    if !hip.info().integrated {
        return None;
    }
    let host = memguard::read_host_memory().ok()?;
    let need = MemoryNeed {
        weight_bytes,
        residence: WeightResidence::DeviceCopy { unified: true },
        kv_bytes: session.kv,
        scratch_bytes: session.scratch,
        kv_on_device: true,
        checkpoint_bytes: 0,
    };
    let gpu = memguard::find_amdgpu_memory();
    // hp/ctx only feed a --ctx suggestion, which a placement decision does not need.
    match memguard::check_memory(&need, &host, gpu.as_ref(), &crate::model::HParams::tiny(), 0) {
        MemoryVerdict::Refuse(m) => Some(m),
        MemoryVerdict::Fits | MemoryVerdict::Warn(_) => None,
    }
}

/// Place the weights as planned; returns them with the reason for the side panel.
fn place_weights(
    hip: &HipContext,
    model: &Model,
    plan: Plan,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(DeviceWeights, String), String> {
    match plan {
        Plan::Copy(reason) => Ok((DeviceWeights::upload(hip, model, progress)?, reason)),
        Plan::Map { reason, copy_fallback } => match DeviceWeights::map(hip, model) {
            Ok(w) => Ok((w, reason)),
            Err(e) if copy_fallback => {
                let w = DeviceWeights::upload(hip, model, progress)?;
                Ok((w, format!("map refused, copied instead: {e}")))
            }
            Err(e) => Err(format!("--weights map: {e}; a copy does not fit device memory either")),
        },
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
                Ok(_) => panic!("the HIP backend must not open with {FORWARD_ENV}=0"),
                Err(e) => {
                    eprintln!("{e}");
                    assert!(
                        e.starts_with("no AMD GPU: ")
                            || e.contains("turns the HIP forward pass off")
                            || forward_enabled(),
                        "{e}"
                    );
                    assert!(!e.contains('\n'), "{e}");
                }
            }
        }
    }

    #[test]
    fn only_the_variable_at_zero_turns_the_forward_pass_off() {
        assert!(forward_enabled_by(None));
        assert!(forward_enabled_by(Some("")));
        assert!(forward_enabled_by(Some("1")));
        assert!(!forward_enabled_by(Some("0")));
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
