//! Load paths of the matrix-tile GEMMs (kernels/gemm_fast.hip) that the `gemm_fast` group's shapes
//! do not reach: ds4_gemm_f16_mma reads its operands with 16-byte loads when the shapes and pointers
//! allow and element by element otherwise (K not a multiple of 8, activations not 16-byte aligned).
//! Each path is held to the CPU reference at the `gemm_fast` tolerance.

use ds4_chat::backend::cpu::quant::dot_f16;
use ds4_chat::backend::hip::kernels;
use ds4_chat::gguf::GgmlType;

use super::support::*;

/// Relative to max|ref|, as for every fast GEMM (tests/hip_kernels/gemm_fast.rs).
const TOL: f64 = 1e-5;

pub fn run(gpu: &Gpu, rng: &mut CheckRng, emit: Emit) {
    let name = |(n_in, n_out, n_tok)| format!("kernel.gemm_f16_mma_load_paths[{n_in}x{n_out},{n_tok} tok]");
    let cases = [(1032usize, 70usize, 40usize), (1030, 65, 17)];
    each(gpu, rng, emit, cases, name, check_f16_load_paths);
}

/// Runs ds4_gemm_f16_mma on activations at a 16-byte aligned address (x stride a multiple of 4:
/// 16-byte loads when n_in % 8 == 0) and on the rows one float further on (element loads), each
/// against the CPU dot of its rows.
fn check_f16_load_paths(
    gpu: &Gpu,
    rng: &mut CheckRng,
    name: &str,
    (n_in, n_out, n_tok): (usize, usize, usize),
) -> Checked {
    let x_stride = n_in.next_multiple_of(4) + 4;
    let w = random_weights(rng, GgmlType::F16, n_in, n_out);
    // One spare float at the end: the shifted view's last row ends at x[1 + (n_tok - 1) * x_stride + n_in].
    let x = random_vec(rng, n_tok * x_stride + 1, 2.0);
    let (w_d, x_d) = (gpu.up(&w)?, gpu.up(&x)?);
    let rb = GgmlType::F16.row_bytes(n_in);
    let mut last = None;
    for (off, how) in [(0usize, "aligned"), (1, "one float off")] {
        let y = gpu.poisoned::<f32>(n_tok * n_out)?;
        let exact = kernels::gemm_f16(
            y.ptr().0,
            w_d.ptr().0,
            x_d.ptr().0 + 4 * off as u64,
            n_in as u32,
            n_out as u32,
            x_stride as u32,
            n_tok as u32,
        );
        let twin = kernels::fast_twin(&exact).expect("ds4_gemm_f16 has a fast twin");
        gpu.run(&twin)?;
        let got = y.to_vec::<f32>()?;
        let want: Vec<f32> = (0..n_tok * n_out)
            .map(|i| {
                let (t, r) = (i / n_out, i % n_out);
                let row = off + t * x_stride;
                dot_f16(&w[r * rb..(r + 1) * rb], &x[row..row + n_in])
            })
            .collect();
        let r = close_scaled(name, &got, &want, TOL, format!("x {how}, stride {x_stride}"));
        if r.verdict == Verdict::Fail {
            return Ok(r);
        }
        last = Some(r);
    }
    Ok(last.expect("two runs"))
}
