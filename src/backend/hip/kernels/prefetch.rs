//! Builder of kernels/prefetch.hip: the L2 prefetch of weights a later launch reads, for a side lane
//! beside latency-bound work (sm_90 only: the AMD targets have no prefetch hint, and there the
//! kernel does nothing).

use super::abi::{Arg, DevPtr, NULL, PREFETCH_L2};
use super::launch::{Launch, ptr, u};

/// Blocks of a prefetch launch: enough threads to issue a large matrix's line hints in a few
/// microseconds, few enough to leave the multiprocessors to the main stream's kernels.
pub const PREFETCH_BLOCKS: u32 = 64;

/// `ds4_prefetch_l2` of the `bytes` bytes at `base`.
pub fn prefetch_l2(base: DevPtr, bytes: u64) -> Launch {
    launch(base, NULL, 0, bytes, 0)
}

/// `ds4_prefetch_l2` of the `n_sel` regions `base + sel[i] * stride` of `bytes` bytes each (`sel`: a
/// device array of u32, e.g. a token's selected experts in a stacked expert tensor).
pub fn prefetch_l2_selected(base: DevPtr, sel: DevPtr, stride: u64, bytes: u64, n_sel: u32) -> Launch {
    launch(base, sel, stride, bytes, n_sel)
}

fn launch(base: DevPtr, sel: DevPtr, stride: u64, bytes: u64, n_sel: u32) -> Launch {
    let args = vec![ptr(base), ptr(sel), Arg::U64(stride), Arg::U64(bytes), u(n_sel)];
    Launch::new(&PREFETCH_L2, [PREFETCH_BLOCKS, 1, 1], args)
}
