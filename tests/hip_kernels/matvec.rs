//! The matvec kernels (kernels/matvec.hip) against the CPU reference, bitwise: the Q8_0 (grouped
//! rows too), F16, F16 pair, Q8_0 SwiGLU and K-quant matvecs. The check functions take a `gemm`
//! flag: group `gemm` runs them on the GEMMs of kernels/gemm.hip.

use ds4_chat::backend::hip::kernels::{self, ExpertFormat};

use super::support::*;

/// Every check of this file, with its shapes.
pub fn run(gpu: &Gpu, rng: &mut CheckRng, emit: Emit) {
    for (n_in, n_out, rows_per_group, n_tok) in [(4096usize, 1029usize, 1029usize, 2usize), (1024, 96, 24, 2)] {
        let name = format!("kernel.matvec_q8_0[{n_in}x{n_out},group {rows_per_group},{n_tok} tok]");
        let shape = (n_in, n_out, rows_per_group, n_tok);
        emit(guard(&name, || check_matvec_q8_0(gpu, rng, &name, shape, false)));
    }
    let (n_in, n_out, n_tok) = (2056usize, 77usize, 3usize);
    let name = format!("kernel.matvec_f16[{n_in}x{n_out},{n_tok} tok]");
    emit(guard(&name, || {
        check_matvec_f16(gpu, rng, &name, (n_in, n_out, n_tok), false)
    }));
    let name = "kernel.matvec_q8_0_swiglu[2 tok]";
    emit(guard(name, || check_matvec_q8_0_swiglu(gpu, rng, name, 2, false)));
    emit(guard("kernel.matvec_f16_pair", || check_matvec_f16_pair(gpu, rng)));
    for fmt in ExpertFormat::ALL {
        let name = format!("kernel.matvec_{}[4096x203]", fmt_name(fmt));
        emit(guard(&name, || check_matvec_k(gpu, rng, &name, fmt, 4096, 203)));
    }
}

/// Q8_0 matvec over 2 tokens; `rows_per_group < n_out` exercises the grouped output projection.
pub fn check_matvec_q8_0(
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

pub fn check_matvec_f16(
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

pub fn check_matvec_q8_0_swiglu(gpu: &Gpu, rng: &mut CheckRng, name: &str, n_tok: usize, gemm: bool) -> Checked {
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
