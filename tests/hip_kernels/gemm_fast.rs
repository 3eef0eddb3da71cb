//! The fast-mode GEMMs on matrix tiles (kernels/gemm_fast.hip, kernels/mma.h) against the CPU
//! reference dots, within 1e-5 x max|ref|: on the wave32 emulator the tiles run the emulated gfx11
//! WMMA builtins, on the wave64 rerun the scalar fallback, on a GPU its matrix cores.
//!
//! Why 1e-5 holds: the Q8_0 tiles sum each block's 32 code products exactly in i32 and differ from
//! the reference only in how the per-block float terms are added (fused); the F16 tiles split every
//! activation into two f16 halves (about 22 significant bits) with f32 accumulation.

use ds4_chat::backend::cpu::quant::{dot_f16, dot_q8_0};
use ds4_chat::backend::hip::kernels;
use ds4_chat::backend::hip::runtime::HipResult;
use ds4_chat::gguf::GgmlType;

use super::support::*;

/// The fast GEMMs' tolerance, relative to max|ref|.
const FAST_GEMM_TOL: f64 = 1e-5;

/// Every check of this file, with its shapes: partial row and token tiles, a K tail that is not a
/// whole stage, grouped projections.
pub fn run(gpu: &Gpu, rng: &mut CheckRng, emit: &mut dyn FnMut(CheckResult)) {
    for (n_in, n_out, rows_per_group, n_tok) in [(1056usize, 200usize, 256usize, 150usize), (1024, 512, 128, 70)] {
        let name = format!("kernel.gemm_q8_0_mma[{n_in}x{n_out},group {rows_per_group},{n_tok} tok]");
        let shape = (n_in, n_out, rows_per_group, n_tok);
        emit(guard(&name, || check_gemm_q8_0_mma(gpu, rng, &name, shape)));
    }
    for (n_in, n_out, n_tok) in [(2056usize, 77usize, 150usize), (512, 130, 33)] {
        let name = format!("kernel.gemm_f16_mma[{n_in}x{n_out},{n_tok} tok]");
        emit(guard(&name, || {
            check_gemm_f16_mma(gpu, rng, &name, (n_in, n_out, n_tok))
        }));
    }
}

fn check_gemm_q8_0_mma(
    gpu: &Gpu,
    rng: &mut CheckRng,
    name: &str,
    (n_in, n_out, rows_per_group, n_tok): (usize, usize, usize, usize),
) -> HipResult<CheckResult> {
    let x_stride = n_out.div_ceil(rows_per_group) * n_in;
    let w = random_weights(rng, GgmlType::Q8_0, n_in, n_out);
    let x = random_vec(rng, n_tok * x_stride, 2.0);
    let (act, x_d) = gpu.up_q8_0(&x)?;
    let w_d = gpu.up(&w)?;
    let y = gpu.poisoned::<f32>(n_tok * n_out)?;
    let proj = kernels::Q8Proj {
        rows_per_group: rows_per_group as u32,
        x_stride: x_stride as u32,
        ..kernels::Q8Proj::plain(y.ptr().0, w_d.ptr().0, x_d.act(), n_in as u32, n_out as u32)
    };
    gpu.run(&kernels::gemm_q8_0_mma(&proj, n_tok as u32))?;
    let got = y.to_vec::<f32>()?;
    let rb = GgmlType::Q8_0.row_bytes(n_in);
    let qb = q8_0_block();
    let want: Vec<f32> = (0..n_tok * n_out)
        .map(|i| {
            let (t, r) = (i / n_out, i % n_out);
            let off = t * x_stride + (r / rows_per_group) * n_in;
            dot_q8_0(
                &w[r * rb..(r + 1) * rb],
                &act.qs[off..off + n_in],
                &act.scales[off / qb..(off + n_in) / qb],
            )
        })
        .collect();
    Ok(close_scaled(
        name,
        &got,
        &want,
        FAST_GEMM_TOL,
        format!("{n_tok} tokens"),
    ))
}

fn check_gemm_f16_mma(
    gpu: &Gpu,
    rng: &mut CheckRng,
    name: &str,
    (n_in, n_out, n_tok): (usize, usize, usize),
) -> HipResult<CheckResult> {
    let x_stride = n_in + 4;
    let w = random_weights(rng, GgmlType::F16, n_in, n_out);
    let x = random_vec(rng, n_tok * x_stride, 2.0);
    let (w_d, x_d) = (gpu.up(&w)?, gpu.up(&x)?);
    let y = gpu.poisoned::<f32>(n_tok * n_out)?;
    gpu.run(&kernels::gemm_f16_mma(
        y.ptr().0,
        w_d.ptr().0,
        x_d.ptr().0,
        n_in as u32,
        n_out as u32,
        x_stride as u32,
        n_tok as u32,
    ))?;
    let got = y.to_vec::<f32>()?;
    let rb = GgmlType::F16.row_bytes(n_in);
    let want: Vec<f32> = (0..n_tok * n_out)
        .map(|i| {
            let (t, r) = (i / n_out, i % n_out);
            dot_f16(&w[r * rb..(r + 1) * rb], &x[t * x_stride..t * x_stride + n_in])
        })
        .collect();
    Ok(close_scaled(
        name,
        &got,
        &want,
        FAST_GEMM_TOL,
        format!("{n_tok} tokens, x stride {x_stride}"),
    ))
}
