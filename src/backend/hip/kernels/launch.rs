//! A kernel launch as plain data ([`Launch`]: kernel, grid, block, argument values), checked
//! against the kernel's parameter list when it is built, and the helpers the typed builders share.

use super::abi::{Arg, DevPtr, KernelArgs, KernelDef};

/// Threads per block of every kernel (kernels/prelude.h: DS4_BLOCK).
pub const BLOCK: u32 = 256;

/// One kernel launch as plain data: which kernel, the launch shape and the argument values.
#[derive(Clone, Debug, PartialEq)]
pub struct Launch {
    pub kernel: &'static KernelDef,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_bytes: u32,
    pub args: Vec<Arg>,
}

impl Launch {
    /// Builds a launch, checking the arguments against the kernel's parameter list (a mismatch is a
    /// bug in this file, caught by the tests that call every builder).
    pub(super) fn new(kernel: &'static KernelDef, grid: [u32; 3], args: Vec<Arg>) -> Launch {
        assert_eq!(args.len(), kernel.params.len(), "{}: argument count", kernel.name);
        for (a, p) in args.iter().zip(kernel.params) {
            assert_eq!(a.kind(), p.kind, "{}: argument {}", kernel.name, p.name);
        }
        assert!(grid.iter().all(|&g| g > 0), "{}: empty grid {grid:?}", kernel.name);
        Launch {
            kernel,
            grid,
            block: [BLOCK, 1, 1],
            shared_bytes: 0,
            args,
        }
    }

    /// The launch's shape for the per-shape profile: grid, then each integer argument by name
    /// (" grid 256x1x1 n_in=1024 n_out=32768").
    pub fn shape(&self) -> String {
        let [x, y, z] = self.grid;
        let mut s = format!(" grid {x}x{y}x{z}");
        for (a, p) in self.args.iter().zip(self.kernel.params) {
            if let Arg::U32(v) = a {
                s.push_str(&format!(" {}={v}", p.name));
            }
        }
        s
    }

    /// The arguments packed for `hipModuleLaunchKernel`'s `kernelParams`.
    pub fn packed(&self) -> KernelArgs {
        let mut args = KernelArgs::new();
        for &a in &self.args {
            args.push(a);
        }
        args
    }
}

pub(super) fn blocks(n: u32, per_block: u32) -> u32 {
    n.div_ceil(per_block).max(1)
}

pub(super) fn ptr(p: DevPtr) -> Arg {
    Arg::Ptr(p)
}
pub(super) fn u(v: u32) -> Arg {
    Arg::U32(v)
}
pub(super) fn f(v: f32) -> Arg {
    Arg::F32(v)
}
