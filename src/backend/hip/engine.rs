//! `HipEngine`: a model placed once on one HIP device (the device context, the kernel module and the
//! weights, copied or mapped) from which sessions (`HipBackend`: KV ring, compressed rows,
//! activations, logits) are opened. Every session shares the three; opening one allocates only its
//! own buffers, after the memory guard has checked that they fit next to the weights.
//!
//! Owns the sharing and the per-session memory check. The placement policy and the checks made
//! before the weights move are `backend.rs`'s; the forward pass is `forward.rs`'s.

use std::sync::Arc;

use crate::backend::{Backend, Engine, EngineError, WeightsPlacement};
use crate::engine::events::WeightPlacement;
use crate::model::Model;

use super::backend::{placement_of, plan_placement};
use super::footprint::session_bytes;
use super::forward::HipBackend;
use super::kernel_module::KernelModule;
use super::runtime::HipContext;
use super::weights::DeviceWeights;

/// The model on one HIP device, ready to open sessions.
pub struct HipEngine {
    hip: HipContext,
    kernels: Arc<KernelModule>,
    model: Arc<Model>,
    weights: Arc<DeviceWeights>,
    /// Why the weights were placed as they are (for `weights_placement`).
    reason: String,
}

impl HipEngine {
    /// An engine over weights already placed on `hip`'s device; `reason` says why that placement.
    pub fn new(
        hip: HipContext,
        kernels: KernelModule,
        model: Arc<Model>,
        weights: DeviceWeights,
        reason: String,
    ) -> HipEngine {
        HipEngine {
            hip,
            kernels: Arc::new(kernels),
            model,
            weights: Arc::new(weights),
            reason,
        }
    }

    /// The weights every session reads.
    pub fn weights(&self) -> &Arc<DeviceWeights> {
        &self.weights
    }

    /// A session of `ctx` tokens, or the memory guard's one line when its cache and scratch do not
    /// fit the free device memory.
    pub fn session(&self, ctx: usize) -> Result<HipBackend, String> {
        let (free, total) = self.hip.mem_info().map_err(|e| e.to_string())?;
        // With the weights in place, nothing but the session is left to fit: the placement plan
        // for zero further weight bytes is exactly that check, with the same message.
        let session = session_bytes(&self.model.hp, ctx);
        plan_placement(WeightPlacement::Map, 0, session, free, total, self.hip.name(), &|_| {
            None
        })?;
        HipBackend::with_weights(
            self.hip.clone(),
            self.kernels.clone(),
            self.model.clone(),
            ctx,
            self.weights.clone(),
            self.reason.clone(),
        )
    }
}

impl Engine for HipEngine {
    fn name(&self) -> &'static str {
        "hip"
    }

    fn device_name(&self) -> String {
        self.hip.name().to_string()
    }

    fn model(&self) -> &Arc<Model> {
        &self.model
    }

    fn weights_placement(&self) -> Option<WeightsPlacement> {
        Some(placement_of(&self.weights, self.reason.clone()))
    }

    fn open_session(&self, ctx: usize) -> Result<Box<dyn Backend>, EngineError> {
        self.session(ctx)
            .map(|b| Box::new(b) as Box<dyn Backend>)
            .map_err(EngineError::Other)
    }
}
