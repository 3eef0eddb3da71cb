//! Opening the HIP backend for a model (the entry point `engine::backend_open` calls).
//!
//! Owns the checks made before any weights move: runtime and device present, kernels that load on
//! it, the weight placement supported. The device forward pass (`forward::HipBackend`) has been
//! validated against the CPU engine only on NVIDIA through the HIP-on-CUDA shim, not yet on AMD
//! hardware, so it is gated: it opens only when `DS4_HIP_FORWARD=1` is set; otherwise opening fails
//! with that reason after the checks and the engine falls back to the CPU backend, saying why.

use std::sync::Arc;

use crate::backend::Backend;
use crate::engine::events::WeightPlacement;
use crate::model::Model;

use super::forward::HipBackend;
use super::kernel_module::KernelModule;

/// Environment variable that enables the (not yet AMD-validated) device forward pass.
pub const FORWARD_ENV: &str = "DS4_HIP_FORWARD";
use super::runtime::HipContext;

/// Open the HIP backend for `model` with a cache of `ctx` tokens, or give the one-line reason it
/// cannot run here.
pub fn open_backend(model: Arc<Model>, weights: WeightPlacement, ctx: usize) -> Result<Box<dyn Backend>, String> {
    let hip = HipContext::new().map_err(|e| e.to_string())?;
    let kernels = KernelModule::load(&hip)?;
    if std::env::var(FORWARD_ENV).as_deref() != Ok("1") {
        return Err(format!(
            "the HIP forward pass is not validated on AMD hardware yet; set {FORWARD_ENV}=1 to use it ({} is usable and its kernels for {} load; selftest --backend hip checks them)",
            hip.name(),
            kernels.target
        ));
    }
    if weights == WeightPlacement::Map {
        return Err("the HIP forward pass supports copied weights only so far (--weights copy or auto)".into());
    }
    let backend = HipBackend::new(hip, kernels, model, ctx)?;
    Ok(Box::new(backend))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::genmodel::{ExpertMix, GenSpec, Preset, model_bytes};
    use crate::gguf::GgufFile;

    #[test]
    fn opening_gives_a_one_line_reason_and_never_a_half_backend() {
        // No AMD GPU here (CI, development machines): the reason names the runtime's answer. With a GPU
        // the reason is that the forward pass is not written yet. Either way the engine falls back.
        let bytes = model_bytes(&GenSpec::new(Preset::Micro, 1, ExpertMix::Q2)).unwrap();
        let model = Arc::new(Model::bind(Arc::new(GgufFile::from_bytes(bytes).unwrap())).unwrap());
        for placement in [WeightPlacement::Auto, WeightPlacement::Map, WeightPlacement::Copy] {
            match open_backend(model.clone(), placement, 64) {
                Ok(_) if std::env::var(FORWARD_ENV).as_deref() == Ok("1") => {}
                Ok(_) => panic!("the HIP backend must not open without {FORWARD_ENV}=1"),
                Err(e) => {
                    eprintln!("{e}");
                    assert!(e.starts_with("no AMD GPU: ") || e.contains("not validated"), "{e}");
                    assert!(!e.contains('\n'), "{e}");
                }
            }
        }
    }
}
