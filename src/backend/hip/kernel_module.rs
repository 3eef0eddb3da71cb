//! The project's kernel module on a device: picks and loads the code object, resolves every kernel of
//! `kernels::ALL_KERNELS`, and executes `kernels::Launch` values on a stream.
//!
//! Owns image selection: `$DS4_KERNEL_DIR/ds4_kernels.sm_<cc>.cubin` when that variable is set (the
//! NVIDIA test shim), else the embedded AMD code objects tried in turn. The runtime's ABI-safe calls
//! cannot read the device's gfx name (the GcnArchName attribute was retired in ROCm 6 and the property
//! struct changed layout), so the loader lets the runtime decide: a code object for
//! another ISA is refused by hipModuleLoadData (hipErrorNoBinaryForGpu / hipErrorInvalidImage) and the
//! next one is tried. `$DS4_HIP_TARGET` restricts the choice to one embedded target.
//!
//! Owns the launch order too: on NVIDIA sm_90 and later a launch may start while the previous
//! kernel of its stream runs when the caller asks (`launch`: the token-wise batches; every kernel
//! awaits its predecessor in `ds4_grid_sync`, kernels/README.md "Dependent launches"), unless
//! `DS4_HIP_OVERLAP=0`. AMD launches stay serial: HIP has no such order there.

use std::collections::HashMap;

use super::kernels::{self, ALL_KERNELS, KERNEL_IMAGE_STEM, KernelDef, Launch};
use super::runtime::{Function, HipContext, HipResult, LaunchDims, LaunchOrder, Module, Stream};
use crate::backend::knobs;

/// Environment variable naming one embedded AMD target to use (e.g. gfx1151).
pub const TARGET_ENV: &str = "DS4_HIP_TARGET";

/// Switch (`0` = off) for overlapped launches on the targets that have them.
pub const OVERLAP_ENV: &str = "DS4_HIP_OVERLAP";

/// The order of every launch on `target`: overlapped on NVIDIA sm_90 and later (griddepcontrol),
/// when `enabled`; serial elsewhere.
pub fn launch_order(target: &str, enabled: bool) -> LaunchOrder {
    let cc = target.strip_prefix("sm_").and_then(|cc| cc.parse::<u32>().ok());
    match cc {
        Some(cc) if cc >= 90 && enabled => LaunchOrder::Overlapped,
        _ => LaunchOrder::Serial,
    }
}

/// Every kernel of the project, loaded on one device.
pub struct KernelModule {
    _module: Module,
    functions: HashMap<&'static str, Function>,
    /// "gfx1151", "sm_90", ...
    pub target: String,
    /// Where the image came from ("embedded" or a file path).
    pub source: String,
    /// How every launch is ordered after the previous kernel of its stream.
    pub order: LaunchOrder,
}

impl KernelModule {
    /// Load the kernels for `ctx`'s device, or say why none fit.
    pub fn load(ctx: &HipContext) -> Result<KernelModule, String> {
        if let Some((path, bytes)) = ctx.kernel_image_override(KERNEL_IMAGE_STEM)? {
            let (major, minor) = ctx.info().compute_capability;
            let module = ctx
                .load_module(&bytes)
                .map_err(|e| format!("kernel image {}: {e}", path.display()))?;
            return Self::resolve(module, format!("sm_{major}{minor}"), path.display().to_string());
        }
        let wanted = knobs::value(TARGET_ENV)?;
        let targets: Vec<&str> = kernels::embedded_targets()
            .into_iter()
            .filter(|t| wanted.as_deref().is_none_or(|w| w == *t))
            .collect();
        if targets.is_empty() {
            let err = kernels::embedded_code_object(wanted.as_deref().unwrap_or("this device")).err();
            return Err(err.unwrap_or_else(|| "no embedded GPU kernels".to_string()));
        }
        let mut refusals = Vec::new();
        for target in targets {
            let image = kernels::embedded_code_object(target)?;
            match ctx.load_module(image) {
                Ok(module) => return Self::resolve(module, target.to_string(), "embedded".to_string()),
                Err(e) => refusals.push(format!(
                    "{target}: {}",
                    e.to_string().replace("hipModuleLoadData returned ", "")
                )),
            }
        }
        Err(format!(
            "no embedded GPU kernels load on {} ({}); rebuild with DS4_HIP_ARCHS=<its gfx target>",
            ctx.name(),
            refusals.join(", ")
        ))
    }

    fn resolve(module: Module, target: String, source: String) -> Result<KernelModule, String> {
        let mut functions = HashMap::new();
        for def in ALL_KERNELS {
            let f = module
                .function(def.name)
                .map_err(|e| format!("kernel image for {target} ({source}) lacks {}: {e}", def.name))?;
            functions.insert(def.name, f);
        }
        Ok(KernelModule {
            _module: module,
            functions,
            order: launch_order(&target, knobs::switch_on(OVERLAP_ENV)),
            target,
            source,
        })
    }

    pub fn function(&self, def: &KernelDef) -> &Function {
        // Every entry of ALL_KERNELS was resolved in `resolve`.
        &self.functions[def.name]
    }

    /// Enqueue one launch, overlapping the previous kernel of `stream` where the device allows it
    /// (`order`) and `overlap` asks for it.
    ///
    /// # Safety
    /// The device pointers in `launch.args` must address live buffers large enough for the shapes
    /// the kernel is given (the argument kinds and count were checked when the `Launch` was built).
    pub unsafe fn launch(&self, stream: &Stream, launch: &Launch, overlap: bool) -> HipResult<()> {
        let dims = LaunchDims {
            grid: launch.grid,
            block: launch.block,
            shared_bytes: launch.shared_bytes,
        };
        let mut args = launch.packed();
        let order = if overlap { self.order } else { LaunchOrder::Serial };
        unsafe {
            self.function(launch.kernel)
                .launch_ordered(stream, dims, &mut args, order)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_nvidia_sm_90_and_later_overlap_launches() {
        for (target, order) in [
            ("sm_90", LaunchOrder::Overlapped),
            ("sm_100", LaunchOrder::Overlapped),
            ("sm_89", LaunchOrder::Serial),
            ("sm_80", LaunchOrder::Serial),
            ("gfx1151", LaunchOrder::Serial),
            ("gfx90a", LaunchOrder::Serial),
            ("sm_", LaunchOrder::Serial),
        ] {
            assert_eq!(launch_order(target, true), order, "{target}");
            assert_eq!(
                launch_order(target, false),
                LaunchOrder::Serial,
                "{target}, switched off"
            );
        }
    }
}
