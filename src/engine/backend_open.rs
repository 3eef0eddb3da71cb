//! Choosing and opening the engine for a model: one place that decides HIP vs CPU and why.
//!
//! Owns the fallback policy (`--backend auto` takes the GPU when one is usable, else the CPU with the
//! reason stated). Used by the worker, `run`, `score` and `bench`. Must not run the model.

use std::sync::Arc;

use crate::backend::arithmetic::Arithmetic;
use crate::backend::cpu::CpuModel;
use crate::backend::{DeviceModel, DeviceSession};
use crate::model::Model;

use super::events::{BackendChoice, WeightsMode};

/// Where an engine runs: the backend asked for, its GPU weight placement and arithmetic, and the
/// CPU threads (0 = all cores). `cli::PlacementArgs::checked` builds it from flags, the worker from
/// a `LoadRequest`; the default is the flags' default.
#[derive(Clone, Copy, Debug, Default)]
pub struct PlacementRequest {
    pub threads: usize,
    pub backend: BackendChoice,
    pub weights: WeightsMode,
    pub arithmetic: Arithmetic,
}

/// An engine and its first session, and why it is not the one asked for (if so).
pub struct OpenedModel {
    /// The model on its device; further sessions (another context) are opened from it.
    pub model: Box<dyn DeviceModel>,
    /// The first session, with a cache of the `ctx` tokens asked for.
    pub session: Box<dyn DeviceSession>,
    /// Set when `Auto` fell back to the CPU: the reason, shown to the user.
    pub fallback_reason: Option<String>,
}

/// Open `at.backend` for `model` and a first session with a cache of `ctx` tokens. `Hip` fails with
/// the reason when no GPU engine can run; `Auto` then falls back to the CPU. A GPU engine runs
/// `at.arithmetic`; the CPU engine is the reference and ignores it.
pub fn open_device_model(model: Arc<Model>, at: &PlacementRequest, ctx: usize) -> Result<OpenedModel, String> {
    open_device_model_with_progress(model, at, ctx, &mut |_, _| {})
}

/// `open_device_model` reporting a GPU weight copy: `upload(done, total)` bytes after every chunk.
pub fn open_device_model_with_progress(
    model: Arc<Model>,
    at: &PlacementRequest,
    ctx: usize,
    upload: &mut dyn FnMut(u64, u64),
) -> Result<OpenedModel, String> {
    super::settings::check_session_ctx(ctx, &model.hp)?;
    let gpu_unavailable = match at.backend {
        BackendChoice::Cpu => None,
        BackendChoice::Hip | BackendChoice::Auto => match open_gpu(&model, at.weights, at.arithmetic, ctx, upload) {
            Ok(opened) => return Ok(opened),
            Err(reason) if at.backend == BackendChoice::Hip => return Err(format!("--backend hip: {reason}")),
            Err(reason) => Some(reason),
        },
    };
    // The cache is allocated at once: refuse a context that cannot fit before trying.
    super::settings::check_ctx_fits_ram(
        &format!("--ctx {ctx}"),
        &model.hp,
        ctx as u64,
        crate::backend::cpu::PREFILL_CHUNK as u64,
    )?;
    let cpu = CpuModel::new(model, at.threads).map_err(|e| e.to_string())?;
    let backend = cpu.open_session(ctx).map_err(|e| e.to_string())?;
    Ok(OpenedModel {
        model: Box::new(cpu),
        session: backend,
        fallback_reason: gpu_unavailable,
    })
}

/// The GPU engine and its first session; a session that cannot open counts as the GPU being
/// unusable, so `Auto` falls back to the CPU then too.
fn open_gpu(
    model: &Arc<Model>,
    weights: WeightsMode,
    arithmetic: Arithmetic,
    ctx: usize,
    upload: &mut dyn FnMut(u64, u64),
) -> Result<OpenedModel, String> {
    #[cfg(feature = "hip")]
    {
        let engine = crate::backend::hip::open_model_with_progress(model.clone(), weights, ctx, arithmetic, upload)?;
        let backend = Box::new(engine.session(ctx)?);
        Ok(OpenedModel {
            model: Box::new(engine),
            session: backend,
            fallback_reason: None,
        })
    }
    #[cfg(not(feature = "hip"))]
    {
        let _ = (model, weights, arithmetic, ctx, upload);
        Err("this build has no GPU backend (rebuild with `--features hip`)".to_string())
    }
}
