//! Dense kernels against the CPU reference: fill, RMSNorm with both activation quantizations, the
//! Q8_0 / F16 / K-quant matvecs and GEMMs (bitwise), the F16 pair matvec and the Q8_0 SwiGLU matvec.

use ds4_chat::backend::cpu::ops::rms_norm;
use ds4_chat::backend::cpu::quant::{Q8_0Act, quantize_q8_0};
use ds4_chat::backend::hip::kernels::{self, ExpertFormat};

use super::support::*;

/// Every check of this file, with its shapes.
pub fn run(gpu: &Gpu, rng: &mut CheckRng, emit: Emit) {
    // The selftest's one kernel launch (a user's check of the module) is this suite's fill check.
    gpu.launched.borrow_mut().insert(kernels::FILL_F32.name);
    emit(ds4_chat::backend::hip::selftest::check_fill(
        &gpu.ctx,
        &gpu.kernels,
        rng,
    ));
    // The side lanes' fork and join, captured and replayed (src/backend/hip/lanes.rs).
    emit(ds4_chat::backend::hip::selftest::check_fork_join(
        &gpu.ctx,
        &gpu.kernels,
        rng,
    ));
    let r = guard("kernel.rms_norm_quant", || check_rms_norm_quant(gpu, rng, &mut *emit));
    emit(r);
    for (n_in, n_out, rows_per_group, n_tok, gemm) in [
        (4096usize, 1029usize, 1029usize, 2usize, false),
        (1024, 96, 24, 2, false),
        (4096, 1029, 1088, 70, true),
        (1024, 512, 128, 33, true),
    ] {
        let kind = if gemm { "gemm" } else { "matvec" };
        let name = format!("kernel.{kind}_q8_0[{n_in}x{n_out},group {rows_per_group},{n_tok} tok]");
        let shape = (n_in, n_out, rows_per_group, n_tok);
        emit(guard(&name, || check_matvec_q8_0(gpu, rng, &name, shape, gemm)));
    }
    for (n_in, n_out, n_tok, gemm) in [(2056usize, 77usize, 3usize, false), (2056, 77, 70, true)] {
        let kind = if gemm { "gemm" } else { "matvec" };
        let name = format!("kernel.{kind}_f16[{n_in}x{n_out},{n_tok} tok]");
        let shape = (n_in, n_out, n_tok);
        emit(guard(&name, || check_matvec_f16(gpu, rng, &name, shape, gemm)));
    }
    for (n_tok, gemm) in [(2usize, false), (67, true)] {
        let kind = if gemm { "gemm" } else { "matvec" };
        let name = format!("kernel.{kind}_q8_0_swiglu[{n_tok} tok]");
        emit(guard(&name, || check_matvec_q8_0_swiglu(gpu, rng, &name, n_tok, gemm)));
    }
    emit(guard("kernel.matvec_f16_pair", || check_matvec_f16_pair(gpu, rng)));
    for fmt in ExpertFormat::ALL {
        let name = format!("kernel.matvec_{}[4096x203]", fmt_name(fmt));
        emit(guard(&name, || check_matvec_k(gpu, rng, &name, fmt, 4096, 203)));
    }
}

/// RMSNorm + both activation quantizations of 3 rows (n = 4096, row stride 4100), with weight.
/// The normed output is compared with the CPU RMSNorm; the quantized outputs with the CPU
/// quantization of the GPU's own normed rows (isolating quantization from norm rounding).
fn check_rms_norm_quant(gpu: &Gpu, rng: &mut CheckRng, emit: Emit) -> Checked {
    let (rows, n, stride, eps) = (3usize, 4096usize, 4100usize, 1e-6f32);
    let x = random_vec(rng, rows * stride, 3.0);
    let w: Vec<f32> = (0..n).map(|_| 1.0 + 0.2 * rng.next_f32()).collect();
    let (x_d, w_d) = (gpu.up(&x)?, gpu.up(&w)?);
    let q = QuantOutBuffers::poisoned(gpu, rows * n)?;
    let o = q.planes();
    gpu.run(&kernels::rms_norm_quant(
        o,
        x_d.ptr().0,
        w_d.ptr().0,
        n as u32,
        stride as u32,
        rows as u32,
        kernels::NQ_NORM,
        eps,
    ))?;
    let [out, q0_q, q0_d, qk_q, qk_d, qk_bs] = &q.0;
    let got_out = out.to_vec::<f32>()?;
    let mut want_out = vec![0f32; rows * n];
    for r in 0..rows {
        rms_norm(
            &mut want_out[r * n..(r + 1) * n],
            &x[r * stride..r * stride + n],
            Some(&w),
            eps,
        );
    }
    // Quantization of the GPU's normed rows on the CPU.
    let (g0q, g0d) = (q0_q.to_vec::<i8>()?, q0_d.to_vec::<f32>()?);
    let (gkq, gkd, gkb) = (qk_q.to_vec::<i8>()?, qk_d.to_vec::<f32>()?, qk_bs.to_vec::<i16>()?);
    let (mut w0q, mut w0d, mut wk) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..rows {
        let row = &got_out[r * n..(r + 1) * n];
        let mut a = Q8_0Act::with_len(n);
        quantize_q8_0(row, &mut a);
        w0q.extend_from_slice(&a.qs);
        w0d.extend_from_slice(&a.scales);
        wk.extend(q8k_blocks(row));
    }
    let wkp = q8k_planes(&wk);
    emit(same_codes(
        "kernel.rms_norm_quant.q8_0_codes",
        &g0q,
        &w0q,
        format!("{rows}x{n}"),
    ));
    emit(same_bits(
        "kernel.rms_norm_quant.q8_0_scales",
        &g0d,
        &w0d,
        String::new(),
    ));
    emit(same_codes(
        "kernel.rms_norm_quant.q8_k_codes",
        &gkq,
        &wkp.q,
        format!("{rows}x{n}"),
    ));
    emit(same_bits(
        "kernel.rms_norm_quant.q8_k_scales",
        &gkd,
        &wkp.d,
        String::new(),
    ));
    // The block sums must be exactly the sums of the GPU's own codes.
    let sums: Vec<f32> = gkq
        .chunks_exact(16)
        .map(|c| c.iter().map(|&q| q as f32).sum())
        .collect();
    let gkb_f: Vec<f32> = gkb.iter().map(|&s| s as f32).collect();
    emit(same_bits(
        "kernel.rms_norm_quant.q8_k_bsums",
        &gkb_f,
        &sums,
        "vs own codes".into(),
    ));
    Ok(same_bits(
        "kernel.rms_norm_quant.out",
        &got_out,
        &want_out,
        format!("{rows} rows of {n}, stride {stride}, with weight"),
    ))
}

/// Q8_0 matvec over 2 tokens; `rows_per_group < n_out` exercises the grouped output projection.
fn check_matvec_q8_0(
    gpu: &Gpu,
    rng: &mut CheckRng,
    name: &str,
    shape: (usize, usize, usize, usize),
    gemm: bool,
) -> Checked {
    let case = Q8ProjCase::new(gpu, rng, shape)?;
    let build = if gemm { kernels::gemm_q8_0 } else { kernels::matvec_q8_0 };
    let n_tok = shape.3;
    gpu.run(&build(&case.proj, n_tok as u32))?;
    same_bits_on(name, &case.y, &case.want(), format!("{n_tok} tokens"))
}

fn check_matvec_f16(
    gpu: &Gpu,
    rng: &mut CheckRng,
    name: &str,
    (n_in, n_out, n_tok): (usize, usize, usize),
    gemm: bool,
) -> Checked {
    let x_stride = n_in + 4;
    let case = F16ProjCase::new(gpu, rng, 1, (n_in, n_out, n_tok), x_stride)?;
    let build = if gemm { kernels::gemm_f16 } else { kernels::matvec_f16 };
    gpu.run(&case.single(build))?;
    Ok(same_bits(
        name,
        &case.got()?,
        &case.want(),
        format!("{n_tok} tokens, x stride {x_stride}"),
    ))
}

fn check_matvec_k(gpu: &Gpu, rng: &mut CheckRng, name: &str, fmt: ExpertFormat, n_in: usize, n_out: usize) -> Checked {
    let n_tok = 2usize;
    let w = random_weights(rng, fmt.ggml_type(), n_in, n_out);
    let blocks = q8k_blocks(&random_vec(rng, n_tok * n_in, 2.0));
    let (w_d, x_d) = (gpu.up(&w)?, gpu.up_q8k(&blocks)?);
    let y = gpu.poisoned::<f32>(n_tok * n_out)?;
    let xk = x_d.planes();
    gpu.run(&kernels::matvec_k(
        fmt,
        y.ptr().0,
        w_d.ptr().0,
        xk,
        n_in as u32,
        n_out as u32,
        n_tok as u32,
    ))?;
    let got = y.to_vec::<f32>()?;
    let rb = fmt.ggml_type().row_bytes(n_in);
    let bpt = n_in / q8k_block();
    let mut want = vec![0f32; n_tok * n_out];
    for t in 0..n_tok {
        for r in 0..n_out {
            want[t * n_out + r] = expert_dot(fmt, &w[r * rb..(r + 1) * rb], &blocks[t * bpt..(t + 1) * bpt]);
        }
    }
    Ok(same_bits(name, &got, &want, format!("{n_tok} tokens")))
}

fn check_matvec_f16_pair(gpu: &Gpu, rng: &mut CheckRng) -> Checked {
    let (n_in, n_out, n_tok) = (1024usize, 37usize, 2usize);
    let case = F16ProjCase::new(gpu, rng, 2, (n_in, n_out, n_tok), n_in)?;
    gpu.run(&case.pair())?;
    Ok(same_bits(
        "kernel.matvec_f16_pair",
        &case.got()?,
        &case.want(),
        format!("2 x {n_in}x{n_out}, {n_tok} tok"),
    ))
}

fn check_matvec_q8_0_swiglu(gpu: &Gpu, rng: &mut CheckRng, name: &str, n_tok: usize, gemm: bool) -> Checked {
    let (n_in, n_ff, limit) = (2048usize, 101usize, 3.0f32);
    let case = Q8SwigluCase::new(gpu, rng, (n_in, n_ff, n_tok), limit)?;
    let build = if gemm {
        kernels::gemm_q8_0_swiglu
    } else {
        kernels::matvec_q8_0_swiglu
    };
    gpu.run(&build(&case.sw, n_tok as u32))?;
    let note = format!("{n_in}->{n_ff}, {n_tok} tok, limit {limit}");
    same_bits_on(name, &case.mid, &case.want(), note)
}
