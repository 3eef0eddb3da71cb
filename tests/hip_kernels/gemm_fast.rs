//! The fast-mode GEMMs on matrix tiles (kernels/gemm_fast.hip, kernels/mma.h) against the CPU
//! reference dots, within 1e-5 x max|ref|: on the wave32 emulator the tiles run the emulated gfx11
//! WMMA builtins, on the wave64 rerun the scalar fallback, on a GPU its matrix cores.
//!
//! Why 1e-5 holds: the Q8_0 tiles sum each block's 32 code products exactly in i32 and differ from
//! the reference only in how the per-block float terms are added (fused); the F16 tiles split every
//! activation into two f16 halves (about 22 significant bits) with f32 accumulation.
//!
//! The quantized twins of kernels/gemm_quant_fast.hip (shared-expert SwiGLU, grouped routed
//! experts) run against their exact twins on the same launches (`kernels::fast_twin`): only their
//! integer sums change order, so they are held to 1e-5 and the note counts outputs whose bits differ
//! (expected: none).

use ds4_chat::backend::cpu::quant::{dot_f16, dot_q8_0};
use ds4_chat::backend::hip::kernels::{self, ExpertFormat, Launch};
use ds4_chat::backend::hip::runtime::{DeviceBuffer, HipResult};
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
    for (n_in, n_ff, n_tok) in [(1024usize, 200usize, 150usize), (512, 64, 9)] {
        let name = format!("kernel.gemm_q8_0_swiglu_mma[{n_in}x{n_ff},{n_tok} tok]");
        emit(guard(&name, || {
            check_gemm_q8_0_swiglu_mma(gpu, rng, &name, (n_in, n_ff, n_tok))
        }));
    }
    for fmt in EXPERT_FORMATS {
        let name = format!("kernel.moe_gemm_mma_{}[vs exact]", fmt_name(fmt));
        let r = guard(&name, || check_moe_gemm_mma(gpu, rng, &name, fmt, &mut *emit));
        emit(r);
    }
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

/// Runs `exact` and then its fast twin into the same output buffer; returns both outputs.
fn exact_and_twin(gpu: &Gpu, exact: &Launch, out: &DeviceBuffer) -> HipResult<(Vec<f32>, Vec<f32>)> {
    let twin = mma_twin(exact);
    gpu.run(exact)?;
    let want = out.to_vec::<f32>()?;
    gpu.run(&twin)?;
    Ok((out.to_vec::<f32>()?, want))
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

fn check_gemm_q8_0_swiglu_mma(
    gpu: &Gpu,
    rng: &mut CheckRng,
    name: &str,
    (n_in, n_ff, n_tok): (usize, usize, usize),
) -> HipResult<CheckResult> {
    let (wg, wu) = (
        random_weights(rng, GgmlType::Q8_0, n_in, n_ff),
        random_weights(rng, GgmlType::Q8_0, n_in, n_ff),
    );
    let x = random_vec(rng, n_tok * n_in, 2.0);
    let (_, x_d) = gpu.up_q8_0(&x)?;
    let (wg_d, wu_d) = (gpu.up(&wg)?, gpu.up(&wu)?);
    let mid = gpu.poisoned::<f32>(n_tok * n_ff)?;
    let sw = kernels::Q8Swiglu {
        mid: mid.ptr().0,
        wg: wg_d.ptr().0,
        wu: wu_d.ptr().0,
        x: x_d.act(),
        n_in: n_in as u32,
        n_ff: n_ff as u32,
        limit: 2.0,
    };
    let exact = kernels::gemm_q8_0_swiglu(&sw, n_tok as u32);
    let (got, want) = exact_and_twin(gpu, &exact, &mid)?;
    Ok(close_counting_bits(name, &got, &want, format!("{n_tok} tokens")))
}

/// The grouped routed-expert twins on the exact kernels' launches, for pair counts per expert
/// [`kernels::TILE_CLASS_COUNTS`] (partial, full and several tiles per expert, an expert with none)
/// and a row count (203) that ends inside a tile; `.gate_up` and `.down` are emitted, the returned
/// result covers both.
fn check_moe_gemm_mma(
    gpu: &Gpu,
    rng: &mut CheckRng,
    name: &str,
    fmt: ExpertFormat,
    emit: &mut dyn FnMut(CheckResult),
) -> HipResult<CheckResult> {
    let (n_in, n_ff, n_out, n_used, limit) = (512usize, 512usize, 203usize, 2usize, 2.0f32);
    let n_expert = kernels::TILE_CLASS_COUNTS.len();
    let sel = kernels::selection_with_counts(&kernels::TILE_CLASS_COUNTS, rng.next_u64());
    let n_tok = sel.len() / n_used;
    let ty = fmt_type(fmt);
    let gate = gpu.up(&random_weights(rng, ty, n_in, n_ff * n_expert))?;
    let up = gpu.up(&random_weights(rng, ty, n_in, n_ff * n_expert))?;
    let down = gpu.up(&random_weights(rng, ty, n_ff, n_out * n_expert))?;
    let x = gpu.up_q8k(&q8k_blocks(&random_vec(rng, n_tok * n_in, 2.0)))?;
    let mids = gpu.up_q8k(&q8k_blocks(&random_vec(rng, n_tok * n_used * n_ff, 1.5)))?;
    let selw: Vec<f32> = (0..sel.len()).map(|_| 0.2 + 0.5 * (rng.next_f32() + 1.0)).collect();
    let (s_d, sw_d) = (gpu.up(&sel)?, gpu.up(&selw)?);
    let (tiles, _keep) = super::moe::expert_tiles(gpu, &s_d, n_tok, n_used, n_expert, kernels::MOE_MIN_COLS)?;
    let mid = gpu.poisoned::<f32>(n_tok * n_used * n_ff)?;
    let outp = gpu.poisoned::<f32>(n_tok * n_used * n_out)?;
    let gate_up = kernels::moe_gemm_gate_up(
        fmt,
        mid.ptr().0,
        gate.ptr().0,
        up.ptr().0,
        x.planes(),
        tiles,
        sw_d.ptr().0,
        n_in as u32,
        n_ff as u32,
        n_used as u32,
        limit,
    );
    let down_l = kernels::moe_gemm_down(
        fmt,
        outp.ptr().0,
        down.ptr().0,
        mids.planes(),
        tiles,
        n_ff as u32,
        n_out as u32,
        n_used as u32,
    );
    let note = format!(
        "{n_tok} tok x {n_used}, pairs per expert {:?}",
        kernels::TILE_CLASS_COUNTS
    );
    let (got_m, want_m) = exact_and_twin(gpu, &gate_up, &mid)?;
    emit(close_counting_bits(
        &format!("{name}.gate_up"),
        &got_m,
        &want_m,
        note.clone(),
    ));
    let (got_o, want_o) = exact_and_twin(gpu, &down_l, &outp)?;
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
    gpu.run(&mma_twin(&kernels::gemm_q8_0(&proj, n_tok as u32)))?;
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
    gpu.run(&mma_twin(&kernels::gemm_f16(
        y.ptr().0,
        w_d.ptr().0,
        x_d.ptr().0,
        n_in as u32,
        n_out as u32,
        x_stride as u32,
        n_tok as u32,
    )))?;
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
