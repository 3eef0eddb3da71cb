//! Choosing and opening the backend for a model: one place that decides HIP vs CPU and why.
//!
//! Owns the fallback policy (`--backend auto` takes the GPU when one is usable, else the CPU with the
//! reason stated). Used by the worker, `run`, `score` and `bench`. Must not run the model.

use std::sync::Arc;

use crate::backend::Backend;
use crate::backend::cpu::CpuBackend;
use crate::model::Model;

use super::events::{BackendChoice, WeightPlacement};

/// A backend ready for a session, and why it is not the one asked for (if so).
pub struct OpenedBackend {
    pub backend: Box<dyn Backend>,
    /// Set when `Auto` fell back to the CPU: the reason, shown to the user.
    pub fallback_reason: Option<String>,
}

/// Open `choice` for `model` with a cache of `ctx` tokens. `Hip` fails with the reason when no GPU
/// backend can run; `Auto` then falls back to the CPU.
pub fn open_backend(
    model: Arc<Model>,
    choice: BackendChoice,
    weights: WeightPlacement,
    ctx: usize,
    threads: usize,
) -> Result<OpenedBackend, String> {
    open_backend_with_progress(model, choice, weights, ctx, threads, &mut |_, _| {})
}

/// `open_backend` reporting a GPU weight copy: `upload(done, total)` bytes after every chunk.
pub fn open_backend_with_progress(
    model: Arc<Model>,
    choice: BackendChoice,
    weights: WeightPlacement,
    ctx: usize,
    threads: usize,
    upload: &mut dyn FnMut(u64, u64),
) -> Result<OpenedBackend, String> {
    let gpu_unavailable = match choice {
        BackendChoice::Cpu => None,
        BackendChoice::Hip | BackendChoice::Auto => match open_gpu(&model, weights, ctx, upload) {
            Ok(backend) => {
                return Ok(OpenedBackend {
                    backend,
                    fallback_reason: None,
                });
            }
            Err(reason) if choice == BackendChoice::Hip => return Err(format!("--backend hip: {reason}")),
            Err(reason) => Some(reason),
        },
    };
    let cpu = CpuBackend::new(model, ctx, threads).map_err(|e| e.to_string())?;
    Ok(OpenedBackend {
        backend: Box::new(cpu),
        fallback_reason: gpu_unavailable,
    })
}

#[cfg(feature = "hip")]
fn open_gpu(
    model: &Arc<Model>,
    weights: WeightPlacement,
    ctx: usize,
    upload: &mut dyn FnMut(u64, u64),
) -> Result<Box<dyn Backend>, String> {
    crate::backend::hip::open_backend_with_progress(model.clone(), weights, ctx, upload)
}

#[cfg(not(feature = "hip"))]
fn open_gpu(
    _model: &Arc<Model>,
    _weights: WeightPlacement,
    _ctx: usize,
    _upload: &mut dyn FnMut(u64, u64),
) -> Result<Box<dyn Backend>, String> {
    Err("this build has no GPU backend (rebuild with `--features hip`)".to_string())
}

/// Parse a `--backend` value.
pub fn parse_backend_choice(s: &str) -> Result<BackendChoice, String> {
    match s {
        "auto" => Ok(BackendChoice::Auto),
        "hip" | "gpu" => Ok(BackendChoice::Hip),
        "cpu" => Ok(BackendChoice::Cpu),
        other => Err(format!("backend '{other}': expected auto, hip or cpu")),
    }
}

/// Parse a `--weights` value.
pub fn parse_weight_placement(s: &str) -> Result<WeightPlacement, String> {
    match s {
        "auto" => Ok(WeightPlacement::Auto),
        "copy" => Ok(WeightPlacement::Copy),
        "map" => Ok(WeightPlacement::Map),
        other => Err(format!("weights '{other}': expected auto, copy or map")),
    }
}
