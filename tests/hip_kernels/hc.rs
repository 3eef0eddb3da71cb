//! Hyper-connection kernels against the CPU reference: the embedding into the HC streams, the pre
//! mix (plain and fused with RMSNorm and both quantizations), the post combination and the head.

use ds4_chat::backend::cpu::hc::{post as hc_post_ref, split_sinkhorn, weighted_sum};
use ds4_chat::backend::cpu::ops::{rms_norm, sigmoid_stable};
use ds4_chat::backend::cpu::quant::{BlockQ8K, Q8_0Act, dot_f16, quantize_q8_0, quantize_q8_k};
use ds4_chat::backend::hip::kernels::{self, QuantOut};
use ds4_chat::backend::hip::runtime::HipResult;
use ds4_chat::gguf::GgmlType;

use super::support::*;

/// Every check of this file.
pub fn run(gpu: &Gpu, rng: &mut CheckRng, emit: &mut dyn FnMut(CheckResult)) {
    emit(guard("kernel.embed_hc", || check_embed_hc(gpu, rng)));
    let r = guard("kernel.hc_pre.x_out", || check_hc_pre(gpu, rng, &mut *emit));
    emit(r);
    let r = guard("kernel.hc_pre_fused.xn", || check_hc_pre_fused(gpu, rng, &mut *emit));
    emit(r);
    for with_y2 in [false, true] {
        let name = if with_y2 {
            "kernel.hc_post[y+y2]"
        } else {
            "kernel.hc_post[y]"
        };
        emit(guard(name, || check_hc_post(gpu, rng, name, with_y2)));
    }
    emit(guard("kernel.hc_head_finish", || check_hc_head(gpu, rng)));
}

fn check_embed_hc(gpu: &Gpu, rng: &mut CheckRng) -> HipResult<CheckResult> {
    let (n_vocab, n_embd, n_hc) = (1000usize, 520usize, 4usize);
    let emb = random_weights(rng, GgmlType::F16, n_embd, n_vocab);
    // The last id is out of range: the kernel writes zeros for it.
    let tokens: Vec<u32> = vec![0, 999, rng.int_in(1, 998) as u32, n_vocab as u32];
    let n_tok = tokens.len();
    let (e_d, t_d) = (gpu.up(&emb)?, gpu.up(&tokens)?);
    let hc = gpu.poisoned::<f32>(n_tok * n_hc * n_embd)?;
    gpu.run(&kernels::embed_hc(
        hc.ptr().0,
        e_d.ptr().0,
        t_d.ptr().0,
        n_embd as u32,
        n_hc as u32,
        n_vocab as u32,
        n_tok as u32,
    ))?;
    let got = hc.to_vec::<f32>()?;
    let mut want = Vec::new();
    for &tok in &tokens {
        let row: Vec<f32> = if (tok as usize) < n_vocab {
            let b = &emb[tok as usize * n_embd * 2..(tok as usize + 1) * n_embd * 2];
            b.chunks_exact(2)
                .map(|h| ds4_chat::gguf::half::f16_to_f32(u16::from_le_bytes([h[0], h[1]])))
                .collect()
        } else {
            vec![0.0; n_embd]
        };
        for _ in 0..n_hc {
            want.extend_from_slice(&row);
        }
    }
    Ok(same_bits(
        "kernel.embed_hc",
        &got,
        &want,
        format!("{n_tok} tokens (one out of range)"),
    ))
}

/// HC pre step: unweighted RMSNorm of the flattened streams, F16 control matvec, Sinkhorn
/// split, weighted stream sum, through ds4_hc_mix + ds4_hc_pre_finish: bitwise equal to the CPU
/// reference (the kernels follow its operation order). Flash shape per token with a smaller n_embd.
fn check_hc_pre(gpu: &Gpu, rng: &mut CheckRng, emit: &mut dyn FnMut(CheckResult)) -> HipResult<CheckResult> {
    let (n_hc, n_embd, n_tok, iters, eps_rms, eps_hc) = (4usize, 1024usize, 2usize, 20usize, 1e-6f32, 1e-6f32);
    let n_in = n_hc * n_embd;
    let n_mix = 2 * n_hc + n_hc * n_hc;
    let hc = random_vec(rng, n_tok * n_in, 2.0);
    let fn_w = random_weights(rng, GgmlType::F16, n_in, n_mix);
    let scale: Vec<f32> = (0..3).map(|_| 0.5 + 0.5 * (rng.next_f32() + 1.0)).collect();
    let base = random_vec(rng, n_mix, 0.5);
    let (hc_d, fn_d, sc_d, b_d) = (gpu.up(&hc)?, gpu.up(&fn_w)?, gpu.up(&scale)?, gpu.up(&base)?);
    let mix_d = gpu.poisoned::<f32>(n_tok * n_mix)?;
    let x_out = gpu.poisoned::<f32>(n_tok * n_embd)?;
    let split = gpu.poisoned::<f32>(n_tok * n_mix)?;
    gpu.run(&kernels::hc_mix(
        mix_d.ptr().0,
        hc_d.ptr().0,
        fn_d.ptr().0,
        n_in as u32,
        n_mix as u32,
        eps_rms,
        n_tok as u32,
    ))?;
    gpu.run(&kernels::hc_pre_finish(
        x_out.ptr().0,
        split.ptr().0,
        mix_d.ptr().0,
        hc_d.ptr().0,
        sc_d.ptr().0,
        b_d.ptr().0,
        n_embd as u32,
        n_hc as u32,
        iters as u32,
        eps_hc,
        n_tok as u32,
    ))?;
    let (got_x, got_split) = (x_out.to_vec::<f32>()?, split.to_vec::<f32>()?);
    let rb = GgmlType::F16.row_bytes(n_in);
    let (mut want_x, mut want_split) = (Vec::new(), Vec::new());
    for t in 0..n_tok {
        let xs = &hc[t * n_in..(t + 1) * n_in];
        let mut normed = vec![0f32; n_in];
        rms_norm(&mut normed, xs, None, eps_rms);
        let mix: Vec<f32> = (0..n_mix)
            .map(|o| dot_f16(&fn_w[o * rb..(o + 1) * rb], &normed))
            .collect();
        let (mut pre, mut post, mut comb) = (vec![0f32; n_hc], vec![0f32; n_hc], vec![0f32; n_hc * n_hc]);
        split_sinkhorn(&mix, &scale, &base, n_hc, iters, eps_hc, &mut pre, &mut post, &mut comb);
        let mut x = vec![0f32; n_embd];
        weighted_sum(&mut x, xs, &pre, n_embd);
        want_x.extend(x);
        want_split.extend(pre.iter().chain(&post).chain(&comb));
    }
    emit(same_bits(
        "kernel.hc_pre.split",
        &got_split,
        &want_split,
        format!("pre|post|comb, {iters} Sinkhorn iterations"),
    ));
    Ok(same_bits(
        "kernel.hc_pre.x_out",
        &got_x,
        &want_x,
        format!("{n_tok} tok, n_hc {n_hc}, n_embd {n_embd}"),
    ))
}

/// Fused HC pre step + sublayer input norm + activation quantization (one launch), against the CPU
/// chain RMSNorm → F16 control matvec → Sinkhorn → weighted sum → RMSNorm·w; the quantized planes
/// against the CPU quantization of the GPU's own xn. Launched twice with the outputs poisoned in
/// between: the second launch must give the same results (its per-token counters were reset by
/// the first, which captured-graph replay relies on).
fn check_hc_pre_fused(gpu: &Gpu, rng: &mut CheckRng, emit: &mut dyn FnMut(CheckResult)) -> HipResult<CheckResult> {
    let (n_hc, n_embd, n_tok, iters) = (4usize, 1024usize, 2usize, 20usize);
    let eps = kernels::HcEps {
        rms: 1e-6,
        hc: 1e-6,
        norm: 1e-6,
    };
    let n_in = n_hc * n_embd;
    let n_mix = 2 * n_hc + n_hc * n_hc;
    let hc = random_vec(rng, n_tok * n_in, 2.0);
    let fn_w = random_weights(rng, GgmlType::F16, n_in, n_mix);
    let scale: Vec<f32> = (0..3).map(|_| 0.5 + 0.5 * (rng.next_f32() + 1.0)).collect();
    let base = random_vec(rng, n_mix, 0.5);
    let norm_w: Vec<f32> = (0..n_embd).map(|_| 1.0 + 0.2 * rng.next_f32()).collect();
    let (hc_d, fn_d, sc_d, b_d, nw_d) = (
        gpu.up(&hc)?,
        gpu.up(&fn_w)?,
        gpu.up(&scale)?,
        gpu.up(&base)?,
        gpu.up(&norm_w)?,
    );
    let part = gpu.poisoned::<f32>(n_tok * n_mix)?;
    let counter = gpu.up(&vec![0u32; n_tok])?;
    let split = gpu.poisoned::<f32>(n_tok * n_mix)?;
    let xn = gpu.poisoned::<f32>(n_tok * n_embd)?;
    let q0_q = gpu.poisoned::<i8>(n_tok * n_embd)?;
    let q0_d = gpu.poisoned::<f32>(n_tok * n_embd / q8_0_block())?;
    let qk_q = gpu.poisoned::<i8>(n_tok * n_embd)?;
    let qk_d = gpu.poisoned::<f32>(n_tok * n_embd / q8k_block())?;
    let qk_bs = gpu.poisoned::<i16>(n_tok * n_embd / 16)?;
    let o = QuantOut {
        out: xn.ptr().0,
        q8_0_q: q0_q.ptr().0,
        q8_0_d: q0_d.ptr().0,
        q8_k_q: qk_q.ptr().0,
        q8_k_d: qk_d.ptr().0,
        q8_k_bs: qk_bs.ptr().0,
    };
    let launch = kernels::hc_pre_fused(
        split.ptr().0,
        o,
        part.ptr().0,
        counter.ptr().0,
        hc_d.ptr().0,
        fn_d.ptr().0,
        sc_d.ptr().0,
        b_d.ptr().0,
        nw_d.ptr().0,
        n_embd as u32,
        n_hc as u32,
        iters as u32,
        eps,
        n_tok as u32,
    );
    gpu.run(&launch)?;
    // Poison every output, then launch again.
    let mut outs = [split, xn, q0_q, q0_d, qk_q, qk_d, qk_bs];
    for b in outs.iter_mut() {
        let n = b.len_bytes();
        b.fill_bytes_async(0, n, 0xFF, &gpu.stream)?;
    }
    gpu.run(&launch)?;
    let [split, xn, q0_q, _q0_d, qk_q, _qk_d, _qk_bs] = outs;
    let (got_split, got_xn) = (split.to_vec::<f32>()?, xn.to_vec::<f32>()?);
    let (got_q0, got_qk) = (q0_q.to_vec::<i8>()?, qk_q.to_vec::<i8>()?);
    let rb = GgmlType::F16.row_bytes(n_in);
    let (mut want_split, mut want_xn, mut want_q0, mut want_qk) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for t in 0..n_tok {
        let xs = &hc[t * n_in..(t + 1) * n_in];
        let mut normed = vec![0f32; n_in];
        rms_norm(&mut normed, xs, None, eps.rms);
        let mix: Vec<f32> = (0..n_mix)
            .map(|o| dot_f16(&fn_w[o * rb..(o + 1) * rb], &normed))
            .collect();
        let (mut pre, mut post, mut comb) = (vec![0f32; n_hc], vec![0f32; n_hc], vec![0f32; n_hc * n_hc]);
        split_sinkhorn(&mix, &scale, &base, n_hc, iters, eps.hc, &mut pre, &mut post, &mut comb);
        let mut x = vec![0f32; n_embd];
        weighted_sum(&mut x, xs, &pre, n_embd);
        let mut x_n = vec![0f32; n_embd];
        rms_norm(&mut x_n, &x, Some(&norm_w), eps.norm);
        want_xn.extend(x_n);
        want_split.extend(pre.iter().chain(&post).chain(&comb));
        let row = &got_xn[t * n_embd..(t + 1) * n_embd];
        let mut a = Q8_0Act::with_len(n_embd);
        quantize_q8_0(row, &mut a);
        want_q0.extend(a.qs);
        let mut b = vec![BlockQ8K::default(); n_embd / q8k_block()];
        quantize_q8_k(row, &mut b);
        want_qk.extend(q8k_planes(&b).q);
    }
    emit(same_bits(
        "kernel.hc_pre_fused.split",
        &got_split,
        &want_split,
        "second launch".into(),
    ));
    emit(same_codes(
        "kernel.hc_pre_fused.q8_0_codes",
        &got_q0,
        &want_q0,
        "of the GPU's xn".into(),
    ));
    emit(same_codes(
        "kernel.hc_pre_fused.q8_k_codes",
        &got_qk,
        &want_qk,
        "of the GPU's xn".into(),
    ));
    Ok(same_bits(
        "kernel.hc_pre_fused.xn",
        &got_xn,
        &want_xn,
        format!("{n_tok} tok, n_hc {n_hc}, n_embd {n_embd}, second launch"),
    ))
}

/// HC post with a random split (post weights and combine matrix), y2 optional.
fn check_hc_post(gpu: &Gpu, rng: &mut CheckRng, name: &str, with_y2: bool) -> HipResult<CheckResult> {
    let (n_hc, n_embd, n_tok) = (4usize, 1000usize, 3usize);
    let n_mix = 2 * n_hc + n_hc * n_hc;
    let hc_in = random_vec(rng, n_tok * n_hc * n_embd, 2.0);
    let y = random_vec(rng, n_tok * n_embd, 1.0);
    let y2 = random_vec(rng, n_tok * n_embd, 1.0);
    let split: Vec<f32> = (0..n_tok * n_mix).map(|_| rng.next_f32() + 1.0).collect();
    let (h_d, y_d, y2_d, s_d) = (gpu.up(&hc_in)?, gpu.up(&y)?, gpu.up(&y2)?, gpu.up(&split)?);
    let out = gpu.poisoned::<f32>(n_tok * n_hc * n_embd)?;
    gpu.run(&kernels::hc_post(
        out.ptr().0,
        h_d.ptr().0,
        y_d.ptr().0,
        if with_y2 { y2_d.ptr().0 } else { kernels::NULL },
        s_d.ptr().0,
        n_embd as u32,
        n_hc as u32,
        n_tok as u32,
    ))?;
    let got = out.to_vec::<f32>()?;
    let mut want = vec![0f32; n_tok * n_hc * n_embd];
    for t in 0..n_tok {
        let sp = &split[t * n_mix..(t + 1) * n_mix];
        let yt: Vec<f32> = (0..n_embd)
            .map(|d| y[t * n_embd + d] + if with_y2 { y2[t * n_embd + d] } else { 0.0 })
            .collect();
        let base = t * n_hc * n_embd;
        hc_post_ref(
            &mut want[base..base + n_hc * n_embd],
            &yt,
            &hc_in[base..base + n_hc * n_embd],
            &sp[n_hc..2 * n_hc],
            &sp[2 * n_hc..],
            n_embd,
        );
    }
    Ok(same_bits(
        name,
        &got,
        &want,
        format!("{n_tok} tok, n_hc {n_hc}, n_embd {n_embd}"),
    ))
}

/// Output-head HC reduction: unweighted RMSNorm of the streams, F16 head control,
/// stable sigmoid weights + eps, weighted stream sum.
fn check_hc_head(gpu: &Gpu, rng: &mut CheckRng) -> HipResult<CheckResult> {
    let (n_hc, n_embd, n_tok, eps_rms, eps_hc) = (4usize, 1024usize, 2usize, 1e-6f32, 1e-6f32);
    let n_in = n_hc * n_embd;
    let hc = random_vec(rng, n_tok * n_in, 2.0);
    let fn_w = random_weights(rng, GgmlType::F16, n_in, n_hc);
    let scale = vec![0.5 + 0.5 * (rng.next_f32() + 1.0)];
    let base = random_vec(rng, n_hc, 0.5);
    let (hc_d, fn_d, sc_d, b_d) = (gpu.up(&hc)?, gpu.up(&fn_w)?, gpu.up(&scale)?, gpu.up(&base)?);
    let mix = gpu.poisoned::<f32>(n_tok * n_hc)?;
    let x_out = gpu.poisoned::<f32>(n_tok * n_embd)?;
    gpu.run(&kernels::hc_mix(
        mix.ptr().0,
        hc_d.ptr().0,
        fn_d.ptr().0,
        n_in as u32,
        n_hc as u32,
        eps_rms,
        n_tok as u32,
    ))?;
    gpu.run(&kernels::hc_head_finish(
        x_out.ptr().0,
        mix.ptr().0,
        hc_d.ptr().0,
        sc_d.ptr().0,
        b_d.ptr().0,
        n_embd as u32,
        n_hc as u32,
        eps_hc,
        n_tok as u32,
    ))?;
    let got = x_out.to_vec::<f32>()?;
    let rb = GgmlType::F16.row_bytes(n_in);
    let mut want = Vec::new();
    for t in 0..n_tok {
        let xs = &hc[t * n_in..(t + 1) * n_in];
        let mut normed = vec![0f32; n_in];
        rms_norm(&mut normed, xs, None, eps_rms);
        let w: Vec<f32> = (0..n_hc)
            .map(|h| sigmoid_stable(dot_f16(&fn_w[h * rb..(h + 1) * rb], &normed) * scale[0] + base[h]) + eps_hc)
            .collect();
        let mut x = vec![0f32; n_embd];
        weighted_sum(&mut x, xs, &w, n_embd);
        want.extend(x);
    }
    Ok(same_bits(
        "kernel.hc_head_finish",
        &got,
        &want,
        format!("{n_tok} tok, n_hc {n_hc}, n_embd {n_embd}"),
    ))
}
