//! Opening the HIP backend for a model (called by `engine::backend_open`).
//!
//! Owns the decision "can the GPU run this model now?". The device is probed for real, so the
//! reason given for a CPU fallback is the true one (no library, no device, or — until the HIP forward
//! pass lands — a usable GPU whose forward pass is not wired yet). Must not run kernels itself.

use std::sync::Arc;

use super::runtime::HipContext;
use crate::backend::Backend;
use crate::engine::events::WeightPlacement;
use crate::model::Model;

/// A HIP `Backend` for `model`, or the one-line reason none can run.
pub fn open_backend(_model: Arc<Model>, _weights: WeightPlacement, _ctx: usize) -> Result<Box<dyn Backend>, String> {
    let ctx = HipContext::new().map_err(|e| e.to_string())?;
    Err(format!(
        "GPU {} found, but the HIP forward pass is not wired into the engine yet (kernels: `ds4-chat selftest --backend hip`)",
        ctx.name()
    ))
}
