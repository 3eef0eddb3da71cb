//! `HipModel`: a model placed once on one HIP device (the device context, the kernel module and the
//! weights, copied or mapped) from which sessions (`HipSession`: KV ring, compressed rows,
//! activations, logits) are opened. Every session shares the three; opening one allocates only its
//! own buffers, after the memory guard has checked that they fit next to the weights.
//!
//! Owns opening (`open_model_with_progress`, `open_backend*`: runtime, kernels, the
//! `DS4_HIP_FORWARD=0` escape hatch, then the weights placed by `open.rs`'s policy), the sharing and
//! the per-session memory check. The forward pass is `backend.rs`'s.

use std::sync::Arc;

use crate::backend::WeightsMode;
use crate::backend::arithmetic::Arithmetic;
use crate::backend::{BackendError, DeviceModel, DeviceSession, PlacementReport};
use crate::model::Model;

use super::footprint::{ctx_hint, session_bytes};
use super::kernel_module::KernelModule;
use super::open::{
    DEVICE_RESERVE, FORWARD_ENV, copy_budget_of, forward_enabled, place_weights, plan_placement, unified_memory,
};
use super::options::HipOptions;
use super::runtime::HipContext;
use super::session::{HipSession, placement_of};
use super::weights::{DeviceWeights, data_section_bytes};

/// Open the HIP backend for `model` with a cache of `ctx` tokens, or give the one-line reason it
/// cannot run here.
pub fn open_backend(
    model: Arc<Model>,
    weights: WeightsMode,
    ctx: usize,
    arithmetic: Arithmetic,
) -> Result<Box<dyn DeviceSession>, String> {
    open_backend_with_progress(model, weights, ctx, arithmetic, &mut |_, _| {})
}

/// `open_backend` reporting the weight copy: `progress(done, total)` bytes after every chunk.
pub fn open_backend_with_progress(
    model: Arc<Model>,
    weights: WeightsMode,
    ctx: usize,
    arithmetic: Arithmetic,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Box<dyn DeviceSession>, String> {
    let engine = open_model_with_progress(model, weights, ctx, arithmetic, progress)?;
    Ok(Box::new(engine.session(ctx)?))
}

/// Place `model`'s weights on the device for sessions of about `ctx` tokens (the placement plan
/// counts one such session), reporting a copy as `progress(done, total)` bytes after every chunk.
/// Its sessions run `arithmetic` (`DS4_HIP_EXACT=1` forces exact).
pub fn open_model_with_progress(
    model: Arc<Model>,
    weights: WeightsMode,
    ctx: usize,
    arithmetic: Arithmetic,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<HipModel, String> {
    let hip = HipContext::new().map_err(|e| e.to_string())?;
    let kernels = KernelModule::load(&hip)?;
    if !forward_enabled() {
        return Err(format!(
            "{FORWARD_ENV}=0 turns the HIP forward pass off ({} is usable and its kernels for {} load; selftest --backend hip checks them)",
            hip.name(),
            kernels.target
        ));
    }
    HipSession::check_model(&model)?;
    let chunk = HipOptions::from_env(unified_memory(&hip, &kernels.target))?.prefill_chunk;
    let session = session_bytes(&model.hp, ctx, chunk);
    let budget = copy_budget_of(&hip, &kernels.target)?;
    let weight_bytes = data_section_bytes(&model.file);
    let plan = plan_placement(
        weights,
        weight_bytes,
        session,
        budget.free,
        budget.total,
        &budget.label,
        &|_| None,
    )
    .map_err(|e| {
        let on_device = if weights == WeightsMode::Map { 0 } else { weight_bytes };
        let room = budget.free.saturating_sub(on_device + DEVICE_RESERVE);
        format!("{e}; {}", ctx_hint(&model.hp, ctx, room, chunk))
    })?;
    let (placed, reason) = place_weights(&hip, &model, plan, progress)?;
    Ok(HipModel::new(hip, kernels, model, placed, reason).with_arithmetic(arithmetic))
}

/// The model on one HIP device, ready to open sessions.
pub struct HipModel {
    hip: HipContext,
    kernels: Arc<KernelModule>,
    model: Arc<Model>,
    weights: Arc<DeviceWeights>,
    /// Why the weights were placed as they are (for `weights_placement`).
    reason: String,
    /// The sessions' arithmetic contract.
    arithmetic: Arithmetic,
}

impl HipModel {
    /// An engine over weights already placed on `hip`'s device; `reason` says why that placement.
    pub fn new(
        hip: HipContext,
        kernels: KernelModule,
        model: Arc<Model>,
        weights: DeviceWeights,
        reason: String,
    ) -> HipModel {
        HipModel {
            hip,
            kernels: Arc::new(kernels),
            model,
            weights: Arc::new(weights),
            reason,
            arithmetic: Arithmetic::default(),
        }
    }

    /// The engine whose sessions run `arithmetic` (`DS4_HIP_EXACT=1` still forces exact).
    pub fn with_arithmetic(mut self, arithmetic: Arithmetic) -> HipModel {
        self.arithmetic = arithmetic;
        self
    }

    /// The weights every session reads.
    pub fn weights(&self) -> &Arc<DeviceWeights> {
        &self.weights
    }

    /// A session of `ctx` tokens, or the memory guard's one line when its cache and scratch do not
    /// fit the free device memory.
    pub fn session(&self, ctx: usize) -> Result<HipSession, String> {
        let (free, total) = self.hip.mem_info().map_err(|e| e.to_string())?;
        let options = HipOptions {
            arithmetic: self.arithmetic.with_env(),
            ..HipOptions::from_env(unified_memory(&self.hip, &self.kernels.target))?
        };
        // With the weights in place, nothing but the session is left to fit: the placement plan
        // for zero further weight bytes is exactly that check, with the same message.
        let session = session_bytes(&self.model.hp, ctx, options.prefill_chunk);
        plan_placement(WeightsMode::Map, 0, session, free, total, self.hip.name(), &|_| None).map_err(|e| {
            let room = free.saturating_sub(DEVICE_RESERVE);
            format!("{e}; {}", ctx_hint(&self.model.hp, ctx, room, options.prefill_chunk))
        })?;
        HipSession::with_weights(
            self.hip.clone(),
            self.kernels.clone(),
            self.model.clone(),
            ctx,
            self.weights.clone(),
            self.reason.clone(),
            options,
        )
    }
}

impl DeviceModel for HipModel {
    fn name(&self) -> &'static str {
        "hip"
    }

    fn device_name(&self) -> String {
        self.hip.name().to_string()
    }

    fn model(&self) -> &Arc<Model> {
        &self.model
    }

    fn weights_placement(&self) -> Option<PlacementReport> {
        Some(placement_of(&self.weights, self.reason.clone()))
    }

    fn open_session(&self, ctx: usize) -> Result<Box<dyn DeviceSession>, BackendError> {
        self.session(ctx)
            .map(|b| Box::new(b) as Box<dyn DeviceSession>)
            .map_err(BackendError::Other)
    }
}
