//! The dense GEMMs of kernels/gemm.hip against the CPU reference, bitwise: Q8_0 (grouped rows
//! too), F16 and Q8_0 SwiGLU over batches of tokens, through the matvec checks (tests/hip_kernels/
//! matvec.rs) with their `gemm` flag. The grouped routed-expert GEMMs of the same file are checked
//! by group `moe`, with the per-token expert kernels they replace.

use super::matvec::{check_matvec_f16, check_matvec_q8_0, check_matvec_q8_0_swiglu};
use super::support::*;

/// Every check of this file, with its shapes.
pub fn run(gpu: &Gpu, rng: &mut CheckRng, emit: Emit) {
    for (n_in, n_out, rows_per_group, n_tok) in [(4096usize, 1029usize, 1088usize, 70usize), (1024, 512, 128, 33)] {
        let name = format!("kernel.gemm_q8_0[{n_in}x{n_out},group {rows_per_group},{n_tok} tok]");
        let shape = (n_in, n_out, rows_per_group, n_tok);
        emit(guard(&name, || check_matvec_q8_0(gpu, rng, &name, shape, true)));
    }
    let (n_in, n_out, n_tok) = (2056usize, 77usize, 70usize);
    let name = format!("kernel.gemm_f16[{n_in}x{n_out},{n_tok} tok]");
    emit(guard(&name, || {
        check_matvec_f16(gpu, rng, &name, (n_in, n_out, n_tok), true)
    }));
    let name = "kernel.gemm_q8_0_swiglu[67 tok]";
    emit(guard(name, || check_matvec_q8_0_swiglu(gpu, rng, name, 67, true)));
}
