//! The project's kernel module on a device: picks and loads the code object, resolves every kernel of
//! `kernels::ALL_KERNELS`, and executes `kernels::Launch` values on a stream.
//!
//! Owns image selection: `$DS4_KERNEL_DIR/ds4_kernels.sm_<cc>.cubin` when that variable is set (the
//! NVIDIA test shim), else the embedded AMD code objects tried in turn. The runtime's ABI-safe calls
//! cannot read the device's gfx name (the GcnArchName attribute was retired in ROCm 6 and the property
//! struct changed layout), so the loader lets the runtime decide: a code object for
//! another ISA is refused by hipModuleLoadData (hipErrorNoBinaryForGpu / hipErrorInvalidImage) and the
//! next one is tried. `$DS4_HIP_TARGET` restricts the choice to one embedded target.

use std::collections::HashMap;

use super::kernels::{self, ALL_KERNELS, KERNEL_IMAGE_STEM, KernelDef, Launch};
use super::runtime::{Function, HipContext, HipResult, LaunchDims, Module, Stream};

/// Environment variable naming one embedded AMD target to use (e.g. gfx1151).
pub const TARGET_ENV: &str = "DS4_HIP_TARGET";

/// Every kernel of the project, loaded on one device.
pub struct KernelModule {
    _module: Module,
    functions: HashMap<&'static str, Function>,
    /// "gfx1151", "sm_90", ...
    pub target: String,
    /// Where the image came from ("embedded" or a file path).
    pub source: String,
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
        let wanted = std::env::var(TARGET_ENV).ok().filter(|t| !t.is_empty());
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
            target,
            source,
        })
    }

    pub fn function(&self, def: &KernelDef) -> &Function {
        // Every entry of ALL_KERNELS was resolved in `resolve`.
        &self.functions[def.name]
    }

    /// Enqueue one launch.
    ///
    /// # Safety
    /// The device pointers in `launch.args` must address live buffers large enough for the shapes
    /// the kernel is given (the argument kinds and count were checked when the `Launch` was built).
    pub unsafe fn launch(&self, stream: &Stream, launch: &Launch) -> HipResult<()> {
        let dims = LaunchDims {
            grid: launch.grid,
            block: launch.block,
            shared_bytes: launch.shared_bytes,
        };
        let mut args = launch.packed();
        unsafe { self.function(launch.kernel).launch(stream, dims, &mut args) }
    }
}
