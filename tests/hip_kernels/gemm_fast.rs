//! The fast-mode GEMMs on matrix tiles (kernels/gemm_fast.hip, kernels/mma.h) against the CPU
//! reference dots, within 1e-5 x max|ref|: on the wave32 emulator the tiles run the emulated gfx11
//! WMMA builtins, on the wave64 rerun the scalar fallback, on a GPU its matrix cores.
//!
//! Why 1e-5 holds: the Q8_0 tiles sum each block's 32 code products exactly in i32 and differ from
//! the reference only in how the per-block float terms are added (fused); the F16 tiles split every
//! activation into two f16 halves (about 22 significant bits) with f32 accumulation.
//!
//! The F16 tiles' operand loads take 16-byte loads when the shapes and pointers allow and element by
//! element otherwise (K not a multiple of 8, activations not 16-byte aligned): both paths are held
//! to the same bound.
//!
//! The quantized twins (shared-expert SwiGLU, grouped routed experts) run against their exact twins on the same launches (`kernels::fast_twin`): only their
//! integer sums change order, so they are held to 1e-5 and the note counts outputs whose bits differ
//! (expected: none).

use ds4_chat::backend::cpu::quant::dot_f16;
use ds4_chat::backend::hip::kernels::{self, ExpertFormat, Launch};
use ds4_chat::backend::hip::runtime::{DeviceBuffer, HipResult};
use ds4_chat::gguf::GgmlType;

use super::support::*;

/// The fast GEMMs' tolerance, relative to max|ref|.
const FAST_GEMM_TOL: f64 = 1e-5;

/// Every check of this file, with its shapes: partial row and token tiles, a K tail that is not a
/// whole stage, grouped projections.
pub fn run(gpu: &Gpu, rng: &mut CheckRng, emit: Emit) {
    let q8_0_name =
        |(n_in, n_out, group, n_tok)| format!("kernel.gemm_q8_0_mma[{n_in}x{n_out},group {group},{n_tok} tok]");
    let q8_0_cases = [(1056usize, 200usize, 256usize, 150usize), (1024, 512, 128, 70)];
    each(gpu, rng, emit, q8_0_cases, q8_0_name, check_gemm_q8_0_mma);
    let f16_name = |(n_in, n_out, n_tok)| format!("kernel.gemm_f16_mma[{n_in}x{n_out},{n_tok} tok]");
    let f16_cases = [(2056usize, 77usize, 150usize), (512, 130, 33)];
    each(gpu, rng, emit, f16_cases, f16_name, check_gemm_f16_mma);
    let swiglu_name = |(n_in, n_ff, n_tok)| format!("kernel.gemm_q8_0_swiglu_mma[{n_in}x{n_ff},{n_tok} tok]");
    let swiglu_cases = [(1024usize, 200usize, 150usize), (512, 64, 9)];
    each(gpu, rng, emit, swiglu_cases, swiglu_name, check_gemm_q8_0_swiglu_mma);
    for fmt in ExpertFormat::ALL {
        let name = format!("kernel.moe_gemm_mma_{}[vs exact]", fmt_name(fmt));
        let r = guard(&name, || check_moe_gemm_mma(gpu, rng, &name, fmt, &mut *emit));
        emit(r);
    }
    // Load paths of the F16 tiles the shapes above do not reach.
    let name = |(n_in, n_out, n_tok)| format!("kernel.gemm_f16_mma_load_paths[{n_in}x{n_out},{n_tok} tok]");
    let cases = [(1032usize, 70usize, 40usize), (1030, 65, 17)];
    each(gpu, rng, emit, cases, name, check_f16_load_paths);
}

/// The matrix-core twin of an exact GEMM launch (`kernels::fast_twin`).
fn mma_twin(exact: &Launch) -> Launch {
    let twin = kernels::fast_twin(exact).unwrap_or_else(|| panic!("{} has no fast twin", exact.kernel.name));
    assert!(
        twin.kernel.name.ends_with("_mma"),
        "{}: twin {}",
        exact.kernel.name,
        twin.kernel.name
    );
    twin
}

/// Runs `exact` and then (the output poisoned again) its matrix-core twin into the same output
/// buffer; returns (twin output, exact output).
fn exact_and_twin(gpu: &Gpu, exact: &Launch, out: &mut DeviceBuffer) -> HipResult<(Vec<f32>, Vec<f32>)> {
    let (want, got) = exact_then_twin(gpu, exact, &mma_twin(exact), &mut [out])?;
    Ok((f32s(&got[0]), f32s(&want[0])))
}

/// `close_scaled` at [`FAST_GEMM_TOL`], the note counting outputs whose bits differ.
fn close_counting_bits(name: &str, got: &[f32], want: &[f32], note: String) -> CheckResult {
    let differ = got.iter().zip(want).filter(|(g, w)| g.to_bits() != w.to_bits()).count();
    close_scaled(
        name,
        got,
        want,
        FAST_GEMM_TOL,
        format!("{note}; {differ} of {} outputs differ in bits", want.len()),
    )
}

fn check_gemm_q8_0_swiglu_mma(gpu: &Gpu, rng: &mut CheckRng, name: &str, shape: (usize, usize, usize)) -> Checked {
    let mut case = Q8SwigluCase::new(gpu, rng, shape, 2.0)?;
    let n_tok = shape.2;
    let exact = kernels::gemm_q8_0_swiglu(&case.sw, n_tok as u32);
    let (got, want) = exact_and_twin(gpu, &exact, &mut case.mid)?;
    Ok(close_counting_bits(name, &got, &want, format!("{n_tok} tokens")))
}

/// The grouped routed-expert twins on the exact kernels' launches, on the tile-class case of the
/// exact kernels' check (`moe::TileClassCase`); `.gate_up` and `.down` are emitted, the returned
/// result covers both.
fn check_moe_gemm_mma(gpu: &Gpu, rng: &mut CheckRng, name: &str, fmt: ExpertFormat, emit: Emit) -> Checked {
    let case = super::moe::TileClassCase::new(gpu, rng, fmt)?;
    let (_, n_ff, n_out, n_used, _) = super::moe::TILE_CLASS_SHAPE;
    let n_tok = case.n_tok;
    let (tiles, _keep) = case.tiles(gpu, kernels::MOE_MIN_COLS)?;
    let mut mid = gpu.poisoned::<f32>(n_tok * n_used * n_ff)?;
    let mut outp = gpu.poisoned::<f32>(n_tok * n_used * n_out)?;
    let note = format!(
        "{n_tok} tok x {n_used}, pairs per expert {:?}",
        kernels::TILE_CLASS_COUNTS
    );
    let (got_m, want_m) = exact_and_twin(gpu, &case.gate_up(&mid, tiles), &mut mid)?;
    emit(close_counting_bits(
        &format!("{name}.gate_up"),
        &got_m,
        &want_m,
        note.clone(),
    ));
    let (got_o, want_o) = exact_and_twin(gpu, &case.down(&outp, tiles), &mut outp)?;
    emit(close_counting_bits(
        &format!("{name}.down"),
        &got_o,
        &want_o,
        note.clone(),
    ));
    Ok(close_counting_bits(
        name,
        &[got_m, got_o].concat(),
        &[want_m, want_o].concat(),
        note,
    ))
}

fn check_gemm_q8_0_mma(gpu: &Gpu, rng: &mut CheckRng, name: &str, shape: (usize, usize, usize, usize)) -> Checked {
    let case = Q8ProjCase::new(gpu, rng, shape)?;
    let n_tok = shape.3;
    gpu.run(&mma_twin(&kernels::gemm_q8_0(&case.proj, n_tok as u32)))?;
    Ok(close_scaled(
        name,
        &case.y.to_vec::<f32>()?,
        &case.want(),
        FAST_GEMM_TOL,
        format!("{n_tok} tokens"),
    ))
}

fn check_gemm_f16_mma(
    gpu: &Gpu,
    rng: &mut CheckRng,
    name: &str,
    (n_in, n_out, n_tok): (usize, usize, usize),
) -> Checked {
    let x_stride = n_in + 4;
    let case = F16ProjCase::new(gpu, rng, 1, (n_in, n_out, n_tok), x_stride)?;
    gpu.run(&mma_twin(&case.single(kernels::gemm_f16)))?;
    Ok(close_scaled(
        name,
        &case.got()?,
        &case.want(),
        FAST_GEMM_TOL,
        format!("{n_tok} tokens, x stride {x_stride}"),
    ))
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
        let r = close_scaled(name, &got, &want, FAST_GEMM_TOL, format!("x {how}, stride {x_stride}"));
        if r.verdict == Verdict::Fail {
            return Ok(r);
        }
        last = Some(r);
    }
    Ok(last.expect("two runs"))
}
