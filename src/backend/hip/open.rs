//! The policy applied when the HIP engine opens (`engine.rs` runs it, in this order):
//! * runtime and device present, kernels that load on it, every expert type supported;
//! * the escape hatch `DS4_HIP_FORWARD=0` (`forward_enabled`): the device forward pass is validated
//!   against the CPU engine and the shared reference vectors on an NVIDIA H200 through the
//!   HIP-on-CUDA shim and on the CPU emulator, not yet on AMD hardware; the variable turns it off
//!   (the CPU backend is then used, with that reason);
//! * the memory guard: device memory (`hipMemGetInfo`) must hold the KV cache and scratch, plus the
//!   weights when they are copied, before anything is allocated ("too little device memory: need X,
//!   have Y"); on unified memory (integrated GPUs, gfx115x) a copy is pinned system RAM, so its
//!   budget is the GTT limit and the usable RAM instead (`backend::copy_budget`);
//! * `--weights auto|copy|map`: auto copies when the weights fit next to the session, else maps the
//!   file (zero copy); a refused registration falls back to a copy when that fits, else fails.
//!
//! Every failure is one line; `--backend auto` then falls back to the CPU with it as the reason.

use crate::backend::WeightsMode;
use crate::backend::copy_budget::{self, CopyBudget, DeviceFacts};
use crate::backend::memguard;
use crate::model::Model;
use crate::units::fmt_mib_or_gib;

use super::footprint::{SessionBytes, too_little_memory};
use super::runtime::HipContext;
use super::weights::DeviceWeights;

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

/// The placement chosen before anything is allocated.
#[derive(Clone, Debug, PartialEq)]
pub enum PlacementPlan {
    /// Copy; the string says why (empty when asked for).
    Copy(String),
    /// Map the file; when `copy_fallback` the copy fits too (used if registration is refused).
    Map { reason: String, copy_fallback: bool },
}

/// Decide the placement from device memory: `free`/`total` from hipMemGetInfo, `weight_bytes` to
/// copy, the `session` (KV + scratch) that lives in device memory either way. `host_refuses_copy`
/// gives the reason pinned host RAM cannot hold a copy (integrated GPUs), if so.
pub fn plan_placement(
    asked: WeightsMode,
    weight_bytes: u64,
    session: SessionBytes,
    free: u64,
    total: u64,
    device: &str,
    host_refuses_copy: &dyn Fn(u64) -> Option<String>,
) -> Result<PlacementPlan, String> {
    let session_need = session.kv + session.scratch + DEVICE_RESERVE;
    let copy_need = weight_bytes + session_need;
    let breakdown = |with_weights: bool| {
        format!(
            "free of {} on {device} ({}KV {} + scratch {} + reserve {})",
            fmt_mib_or_gib(total),
            if with_weights {
                format!("weights {} + ", fmt_mib_or_gib(weight_bytes))
            } else {
                String::new()
            },
            fmt_mib_or_gib(session.kv),
            fmt_mib_or_gib(session.scratch),
            fmt_mib_or_gib(DEVICE_RESERVE)
        )
    };
    if session_need > free {
        return Err(too_little_memory(
            if asked == WeightsMode::Map {
                session_need
            } else {
                copy_need
            },
            free,
            &format!("{}; use a smaller --ctx", breakdown(asked != WeightsMode::Map)),
        ));
    }
    let copy_refusal = if copy_need > free {
        Some(too_little_memory(copy_need, free, &breakdown(true)))
    } else {
        host_refuses_copy(weight_bytes)
    };
    match (asked, copy_refusal) {
        (WeightsMode::Copy, None) => Ok(PlacementPlan::Copy(String::new())),
        (WeightsMode::Copy, Some(why)) => Err(format!("{why}; use --weights map or a smaller --ctx")),
        (WeightsMode::Map, refusal) => Ok(PlacementPlan::Map {
            reason: String::new(),
            copy_fallback: refusal.is_none(),
        }),
        (WeightsMode::Auto, None) => Ok(PlacementPlan::Copy(format!(
            "auto: the weights fit device memory ({} of {} free)",
            fmt_mib_or_gib(copy_need),
            fmt_mib_or_gib(free)
        ))),
        (WeightsMode::Auto, Some(why)) => Ok(PlacementPlan::Map {
            reason: format!("auto: no room for a copy ({why})"),
            copy_fallback: false,
        }),
    }
}

/// Whether `hip`'s device (kernels for `gfx`) shares system RAM (`backend::copy_budget::is_unified`):
/// its prefill chunk default and its copy budget depend on it.
pub fn unified_memory(hip: &HipContext, gfx: &str) -> bool {
    copy_budget::is_unified(hip.info().integrated, gfx)
}

/// The memory a copy must fit: device memory on a discrete GPU; on unified memory the GTT limit
/// and the usable RAM (`backend::copy_budget`), read from amdgpu sysfs and /proc/meminfo.
pub(super) fn copy_budget_of(hip: &HipContext, gfx: &str) -> Result<CopyBudget, String> {
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
        .and_then(|t| copy_budget::unified_facts(&t, memguard::find_amdgpu_memory().as_ref()));
    Ok(copy_budget::copy_budget(&dev, host.as_ref()))
}

/// Place the weights as planned; returns them with the reason for the side panel.
pub(super) fn place_weights(
    hip: &HipContext,
    model: &Model,
    plan: PlacementPlan,
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
        PlacementPlan::Copy(reason) => {
            let w = DeviceWeights::upload(hip, model, progress)?;
            let reason = with_method(reason, &w);
            Ok((w, reason))
        }
        PlacementPlan::Map { reason, copy_fallback } => match DeviceWeights::map(hip, model) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::genmodel::{ExpertMix, GenSpec, Preset, model_bytes};
    use crate::gguf::GgufFile;
    use std::sync::Arc;

    #[test]
    fn opening_gives_a_one_line_reason_and_never_a_half_backend() {
        // No AMD GPU here (CI, development machines): the reason names the runtime's answer. With a GPU
        // and the gate closed the reason is the gate. Either way the engine falls back.
        let bytes = model_bytes(&GenSpec::new(Preset::Micro, 1, ExpertMix::Q2)).unwrap();
        let model = Arc::new(Model::bind(Arc::new(GgufFile::from_bytes(bytes).unwrap())).unwrap());
        for placement in [WeightsMode::Auto, WeightsMode::Map, WeightsMode::Copy] {
            match super::super::open_backend(model.clone(), placement, 64, Default::default()) {
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
        // Device session state 100 + 36 + 64 reserve = 200 MiB; weights 800 MiB; a copy needs 1000 MiB.
        let plan = |asked, free| plan_placement(asked, 800 * MIB, session(), free, 4096 * MIB, "dev", &no_host_limit);
        assert!(matches!(plan(WeightsMode::Auto, 1000 * MIB), Ok(PlacementPlan::Copy(r)) if r.starts_with("auto: ")));
        match plan(WeightsMode::Auto, 999 * MIB) {
            Ok(PlacementPlan::Map {
                reason,
                copy_fallback: false,
            }) => {
                assert!(reason.contains("need 1000.0 MiB, have 999.0 MiB"), "{reason}");
            }
            p => panic!("{p:?}"),
        }
        // Map asked: a copy that fits is kept as the fallback for a refused registration.
        assert_eq!(
            plan(WeightsMode::Map, 1000 * MIB),
            Ok(PlacementPlan::Map {
                reason: String::new(),
                copy_fallback: true
            })
        );
        // Copy asked but too big: one line with both numbers and the fixes.
        let e = plan(WeightsMode::Copy, 999 * MIB).unwrap_err();
        assert!(
            e.starts_with("too little device memory: need 1000.0 MiB, have 999.0 MiB free of 4.00 GiB on dev"),
            "{e}"
        );
        assert!(e.contains("weights 800.0 MiB + KV 100.0 MiB + scratch 36.0 MiB") && e.ends_with("--ctx"));
        // Not even the session fits: refused whatever the placement.
        for asked in [WeightsMode::Auto, WeightsMode::Map, WeightsMode::Copy] {
            let e = plan(asked, 199 * MIB).unwrap_err();
            assert!(e.starts_with("too little device memory: need "), "{e}");
            assert!(e.contains("have 199.0 MiB") && !e.contains('\n'), "{e}");
        }
        let e = plan(WeightsMode::Map, 199 * MIB).unwrap_err();
        assert!(e.starts_with("too little device memory: need 200.0 MiB"), "{e}");
    }

    /// docs/memory.md "1M tokens": with the q2 Flash file copied, a 1,048,576-token session fits an
    /// H200 (2048-token chunks) and a 128 GB Strix Halo with the GTT limit raised to 120 GiB and a
    /// desktop holding 6 GiB (1024-token chunks); the default half-RAM GTT limit maps instead.
    #[test]
    fn a_million_token_session_of_the_q2_file_is_placed_on_an_h200_and_a_strix_halo() {
        use crate::backend::copy_budget::{DeviceFacts, UnifiedFacts, copy_budget};
        use crate::backend::hip::footprint::session_bytes;
        use crate::backend::hip::prefill::{PREFILL_CHUNK, PREFILL_CHUNK_UNIFIED};
        use crate::model::hparams::HParams;
        const GIB: u64 = 1 << 30;
        const FLASH_Q2: u64 = 86_720_111_488;
        let hp = HParams::flash();
        let device = |name: &str, gfx: &str, integrated: bool, free: u64, total: u64| DeviceFacts {
            name: name.into(),
            gfx: gfx.into(),
            integrated,
            free,
            total,
        };
        let place = |dev: &DeviceFacts, host: Option<&UnifiedFacts>, chunk: usize| {
            let b = copy_budget(dev, host);
            let s = session_bytes(&hp, 1 << 20, chunk);
            plan_placement(
                WeightsMode::Copy,
                FLASH_Q2,
                s,
                b.free,
                b.total,
                &b.label,
                &no_host_limit,
            )
        };
        let h200 = device("H200", "", false, 139 * GIB, 140 * GIB);
        assert!(matches!(place(&h200, None, PREFILL_CHUNK), Ok(PlacementPlan::Copy(_))));
        let strix = device("Radeon 8060S", "gfx1151", true, GIB / 2, GIB / 2);
        let raised = UnifiedFacts {
            gtt_total: 120 * GIB,
            gtt_used: GIB,
            mem_available: 118 * GIB,
            cma_free: 0,
        };
        assert!(matches!(
            place(&strix, Some(&raised), PREFILL_CHUNK_UNIFIED),
            Ok(PlacementPlan::Copy(_))
        ));
        let default_gtt = UnifiedFacts {
            gtt_total: 62 * GIB,
            ..raised
        };
        let e = place(&strix, Some(&default_gtt), PREFILL_CHUNK_UNIFIED).unwrap_err();
        assert!(e.starts_with("too little device memory: need "), "{e}");
    }

    #[test]
    fn host_ram_limits_a_copy_on_integrated_gpus() {
        let refuse = |_: u64| Some("not enough memory: pinned RAM".to_string());
        let plan = |asked| plan_placement(asked, 800 * MIB, session(), 4096 * MIB, 4096 * MIB, "apu", &refuse);
        assert!(
            matches!(plan(WeightsMode::Auto), Ok(PlacementPlan::Map { copy_fallback: false, reason }) if reason.contains("pinned RAM"))
        );
        assert!(plan(WeightsMode::Copy).unwrap_err().contains("pinned RAM"));
    }
}
