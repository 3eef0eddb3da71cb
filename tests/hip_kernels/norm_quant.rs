//! The norm and quantization kernels (kernels/norm_quant.hip) against the CPU reference, bitwise:
//! fill (the module self-test's check), RMSNorm with both activation quantizations; and the side
//! lanes' fork and join (src/backend/hip/lanes.rs), captured and replayed with fill launches.

use ds4_chat::backend::cpu::ops::rms_norm;
use ds4_chat::backend::cpu::quant::{Q8_0Act, quantize_q8_0};
use ds4_chat::backend::hip::kernels;

use super::support::*;

/// Every check of this file.
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
    let r = guard("kernel.copy_spans", || check_copy_spans(gpu, rng));
    emit(r);
}

/// Span copies (the block verify's keep and restore of the compressor states): spans of 0, 1, odd
/// and multi-block lengths from one random source into a poisoned destination, some placed back to
/// back. Every word of a span arrives with its bits (NaN payloads and -0 included) and no word
/// outside the spans is written.
fn check_copy_spans(gpu: &Gpu, rng: &mut CheckRng) -> Checked {
    let n = 70_000usize;
    let mut src: Vec<u32> = (0..n).map(|_| rng.next_f32().to_bits() ^ 0x8000_0000).collect();
    src[3] = 0x7fc0_1234; // a NaN with a payload
    src[4] = 0x8000_0000; // -0
    let src_d = gpu.up(&src)?;
    let dst_d = gpu.poisoned::<u32>(n)?;
    // (source word, destination word, words)
    let spans = [
        (0usize, 5usize, 7usize),
        (100, 12, 0),
        (3, 12, 2),
        (1000, 20_000, 40_001),
        (20, 60_001, 1),
    ];
    let table: Vec<u64> = spans
        .iter()
        .flat_map(|&(s, d, w)| [src_d.ptr().0 + 4 * s as u64, dst_d.ptr().0 + 4 * d as u64, w as u64])
        .collect();
    let table_d = gpu.up(&table)?;
    gpu.run(&kernels::copy_spans(table_d.ptr().0, spans.len() as u32))?;
    let got = dst_d.to_vec::<u32>()?;
    let mut want = vec![u32::MAX; n];
    for &(s, d, w) in &spans {
        want[d..d + w].copy_from_slice(&src[s..s + w]);
    }
    let differ = got.iter().zip(&want).filter(|(a, b)| a != b).count();
    Ok(count_differ(
        "kernel.copy_spans",
        differ,
        differ == 0,
        format!(
            "{} spans, {} words",
            spans.len(),
            spans.iter().map(|s| s.2).sum::<usize>()
        ),
    ))
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
