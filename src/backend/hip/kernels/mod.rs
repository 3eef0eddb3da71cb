//! The GPU kernels seen from Rust: the table of kernel names with their C parameter lists, typed
//! launch builders (grid/block and argument packing for every kernel in `kernels/*.hip`), and the
//! AMD code objects that build.rs embedded.
//!
//! Owns the Rust mirror of the kernels' C ABI; the test `kernel_table_matches_sources` parses the
//! kernel sources and fails on any drift in names, order, names or kinds of parameters. Must not call
//! the HIP runtime: a [`Launch`] is plain data that `kernel_module.rs` executes (`hipModuleLaunchKernel`
//! with one pointer per argument, see [`Launch::packed`]), so this module also builds (and is tested)
//! without the `hip` feature.
//!
//! Conventions (kernels/prelude.h): device pointers are passed as `u64` addresses ([`DevPtr`], 0 =
//! null where a kernel accepts null); sizes are `u32`; every kernel runs 256-thread blocks; the
//! grids below do not depend on the device's wave size (32 or 64).
//!
//! Code objects: one per target, all kernels in one module. AMD targets are embedded at build time
//! (`ds4_kernels.<gfx>.hsaco`, [`embedded_code_object`]); NVIDIA ones are files
//! `$DS4_KERNEL_DIR/ds4_kernels.sm_<cc>.cubin` built by tools/build-kernels-nvcc.sh.
//!
//! Files, one per kernel source (kernels/INDEX.md lists every kernel with its source, builders and
//! checks): `<op>` builds the exact kernels of kernels/<op>.hip and `<op>_fast` the fast launches of
//! kernels/<op>_fast.hip that replace more than one launch; `fast_twins` picks, for an exact launch,
//! its fast twin with the same arguments (docs/arithmetic.md). Besides: `abi` (parameter kinds, the
//! kernel table, the argument packer), `launch` ([`Launch`]), `code_objects` (the embedded images).
//! Every public item is re-exported here: callers name them `kernels::X`.

#![allow(clippy::too_many_arguments)]

mod abi;
mod attention;
mod attention_fast;
mod code_objects;
mod compressor;
mod fast_twins;
mod gemm;
mod hc;
mod indexer;
mod indexer_fast;
mod launch;
mod matvec;
mod matvec_cols;
mod matvec_cols_fast;
mod matvec_fast;
mod moe;
mod moe_fast;
mod norm_quant;
mod rows;
mod rows_fast;
mod sample;

pub use abi::*;
pub use attention::*;
pub use attention_fast::*;
pub use code_objects::*;
pub use compressor::*;
pub use fast_twins::*;
pub use gemm::*;
pub use hc::*;
pub use indexer::*;
pub use indexer_fast::*;
pub use launch::*;
pub use matvec::*;
pub use matvec_cols::*;
pub use matvec_cols_fast::*;
pub use matvec_fast::*;
pub use moe::*;
pub use moe_fast::*;
pub use norm_quant::*;
pub use rows::*;
pub use rows_fast::*;
pub use sample::*;

#[cfg(test)]
mod tests;
