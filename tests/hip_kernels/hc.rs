//! Hyper-connection kernels against the CPU reference: the embedding into the HC streams, the pre
//! mix (plain and fused with RMSNorm and both quantizations), the post combination and the head.

use ds4_chat::backend::cpu::hc::{post as hc_post_ref, split_sinkhorn, weighted_sum};
use ds4_chat::backend::cpu::ops::{rms_norm, sigmoid_stable};
use ds4_chat::backend::cpu::quant::{Q8_0Act, dot_f16, quantize_q8_0};
use ds4_chat::backend::hip::kernels::{self, Launch, QuantOut};
use ds4_chat::backend::hip::runtime::{DeviceBuffer, HipResult};
use ds4_chat::gguf::GgmlType;

use super::support::*;

/// Every check of this file.
pub fn run(gpu: &Gpu, rng: &mut CheckRng, emit: Emit) {
    emit(guard("kernel.embed_hc", || check_embed_hc(gpu, rng)));
    let r = guard("kernel.hc_pre.x_out", || check_hc_pre(gpu, rng, &mut *emit));
    emit(r);
    let r = guard("kernel.hc_pre_fused.xn", || check_hc_pre_fused(gpu, rng, &mut *emit));
    emit(r);
    let post_name = |y2| format!("kernel.hc_post[{}]", if y2 { "y+y2" } else { "y" });
    each(gpu, rng, emit, [false, true], post_name, check_hc_post);
    emit(guard("kernel.hc_head_finish", || check_hc_head(gpu, rng)));
}

fn check_embed_hc(gpu: &Gpu, rng: &mut CheckRng) -> Checked {
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
fn check_hc_pre(gpu: &Gpu, rng: &mut CheckRng, emit: Emit) -> Checked {
    let (n_hc, n_embd, n_tok, iters, eps_rms, eps_hc) = (4usize, 1024usize, 2usize, 20usize, 1e-6f32, 1e-6f32);
    let n_in = n_hc * n_embd;
    let n_mix = 2 * n_hc + n_hc * n_hc;
    let inp = HcInputs::random(rng, n_tok, n_in, n_mix, 3);
    let [hc_d, fn_d, sc_d, b_d] = inp.upload(gpu)?;
    let x_out = gpu.poisoned::<f32>(n_tok * n_embd)?;
    let split = gpu.poisoned::<f32>(n_tok * n_mix)?;
    let mix_d = launch_hc_mix(gpu, &hc_d, &fn_d, n_in, n_mix, eps_rms, n_tok)?;
    let mixed = hc_mixed(&mix_d, &hc_d, &sc_d, &b_d, n_embd, n_hc);
    let (x_p, split_p) = (x_out.ptr().0, split.ptr().0);
    gpu.run(&kernels::hc_pre_finish(
        x_p,
        split_p,
        &mixed,
        iters as u32,
        eps_hc,
        n_tok as u32,
    ))?;
    let (got_x, got_split) = (x_out.to_vec::<f32>()?, split.to_vec::<f32>()?);
    let (mut want_x, mut want_split) = (Vec::new(), Vec::new());
    for t in 0..n_tok {
        let (x, split) = inp.ref_pre(t, n_hc, n_embd, iters, eps_rms, eps_hc);
        want_x.extend(x);
        want_split.extend(split);
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
fn check_hc_pre_fused(gpu: &Gpu, rng: &mut CheckRng, emit: Emit) -> Checked {
    let case = HcPreFused::new(gpu, rng)?;
    let (n_hc, n_embd, n_tok, iters, eps) = (case.n_hc, case.n_embd, case.n_tok, case.iters, case.eps);
    let mut split = gpu.poisoned::<f32>(n_tok * case.n_mix)?;
    let mut q = QuantOutBuffers::poisoned(gpu, n_tok * n_embd)?;
    let launch = case.launch(&split, q.planes());
    gpu.run(&launch)?;
    // Poison every output, then launch again.
    gpu.repoison(std::iter::once(&mut split).chain(&mut q.0))?;
    gpu.run(&launch)?;
    let [xn, q0_q, _, qk_q, _, _] = &q.0;
    let (got_split, got_xn) = (split.to_vec::<f32>()?, xn.to_vec::<f32>()?);
    let (got_q0, got_qk) = (q0_q.to_vec::<i8>()?, qk_q.to_vec::<i8>()?);
    let (mut want_split, mut want_xn, mut want_q0, mut want_qk) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for t in 0..n_tok {
        let (x, split) = case.inp.ref_pre(t, n_hc, n_embd, iters, eps.rms, eps.hc);
        let mut x_n = vec![0f32; n_embd];
        rms_norm(&mut x_n, &x, Some(&case.norm_w), eps.norm);
        want_xn.extend(x_n);
        want_split.extend(split);
        let row = &got_xn[t * n_embd..(t + 1) * n_embd];
        let mut a = Q8_0Act::with_len(n_embd);
        quantize_q8_0(row, &mut a);
        want_q0.extend(a.qs);
        want_qk.extend(q8k_planes(&q8k_blocks(row)).q);
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
fn check_hc_post(gpu: &Gpu, rng: &mut CheckRng, name: &str, with_y2: bool) -> Checked {
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
fn check_hc_head(gpu: &Gpu, rng: &mut CheckRng) -> Checked {
    let (n_hc, n_embd, n_tok, eps_rms, eps_hc) = (4usize, 1024usize, 2usize, 1e-6f32, 1e-6f32);
    let n_in = n_hc * n_embd;
    let inp = HcInputs::random(rng, n_tok, n_in, n_hc, 1);
    let [hc_d, fn_d, sc_d, b_d] = inp.upload(gpu)?;
    let x_out = gpu.poisoned::<f32>(n_tok * n_embd)?;
    let mix = launch_hc_mix(gpu, &hc_d, &fn_d, n_in, n_hc, eps_rms, n_tok)?;
    let mixed = hc_mixed(&mix, &hc_d, &sc_d, &b_d, n_embd, n_hc);
    gpu.run(&kernels::hc_head_finish(x_out.ptr().0, &mixed, eps_hc, n_tok as u32))?;
    let got = x_out.to_vec::<f32>()?;
    let mut want = Vec::new();
    for t in 0..n_tok {
        let (xs, mix) = inp.ref_mix(t, n_hc, eps_rms);
        let w: Vec<f32> = mix
            .iter()
            .zip(&inp.base)
            .map(|(&m, &b)| sigmoid_stable(m * inp.scale[0] + b) + eps_hc)
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

/// The fused HC pre step's shape (4 streams of 1024, 2 tokens, 20 Sinkhorn iterations) with its
/// random inputs and norm weight on the device; the exact kernel's check and its fast twin's share it.
pub struct HcPreFused {
    pub n_hc: usize,
    pub n_embd: usize,
    pub n_tok: usize,
    pub n_mix: usize,
    pub iters: usize,
    pub eps: kernels::HcEps,
    inp: HcInputs,
    norm_w: Vec<f32>,
    /// Streams, control weights, scales, biases, norm weight, partial sums, per-token counters.
    dev: [DeviceBuffer; 7],
}

impl HcPreFused {
    pub fn new(gpu: &Gpu, rng: &mut CheckRng) -> HipResult<HcPreFused> {
        let (n_hc, n_embd, n_tok, iters) = (4usize, 1024usize, 2usize, 20usize);
        let eps = kernels::HcEps {
            rms: 1e-6,
            hc: 1e-6,
            norm: 1e-6,
        };
        let n_mix = 2 * n_hc + n_hc * n_hc;
        let inp = HcInputs::random(rng, n_tok, n_hc * n_embd, n_mix, 3);
        let norm_w: Vec<f32> = (0..n_embd).map(|_| 1.0 + 0.2 * rng.next_f32()).collect();
        let [hc_d, fn_d, sc_d, b_d] = inp.upload(gpu)?;
        let dev = [
            hc_d,
            fn_d,
            sc_d,
            b_d,
            gpu.up(&norm_w)?,
            gpu.poisoned::<f32>(n_tok * n_mix)?,
            gpu.up(&vec![0u32; n_tok])?,
        ];
        Ok(HcPreFused {
            n_hc,
            n_embd,
            n_tok,
            n_mix,
            iters,
            eps,
            inp,
            norm_w,
            dev,
        })
    }

    /// The launch writing the split into `split` and xn (and the planes `o` names) into `o`.
    pub fn launch(&self, split: &DeviceBuffer, o: QuantOut) -> Launch {
        let [hc, fn_w, scale, base, norm_w, part, counter] = &self.dev;
        let shape = (self.n_embd, self.n_hc, self.n_tok);
        hc_pre_fused_on(
            split,
            o,
            [part, counter],
            [hc, fn_w, scale, base, norm_w],
            shape,
            self.iters,
            self.eps,
        )
    }
}

/// `ds4_hc_pre_fused` over device buffers: the split into `split`, xn (and the planes `o` names)
/// into `o`, with the partial sums and per-token counters `mix_counter`, from `inputs`: the streams,
/// control weights, scales, biases and norm weight; `shape` is (n_embd, n_hc, n_tok).
pub fn hc_pre_fused_on(
    split: &DeviceBuffer,
    o: QuantOut,
    mix_counter: [&DeviceBuffer; 2],
    inputs: [&DeviceBuffer; 5],
    (n_embd, n_hc, n_tok): (usize, usize, usize),
    iters: usize,
    eps: kernels::HcEps,
) -> Launch {
    let [mix, counter] = mix_counter.map(|b| b.ptr().0);
    let [hc, fn_w, scale, base, norm_w] = inputs.map(|b| b.ptr().0);
    let [n_embd, n_hc, iters, n_tok] = [n_embd, n_hc, iters, n_tok].map(|v| v as u32);
    let split = split.ptr().0;
    kernels::hc_pre_fused(
        split, o, mix, counter, hc, fn_w, scale, base, norm_w, n_embd, n_hc, iters, eps, n_tok,
    )
}

/// Random HC inputs: `n_tok` tokens' flattened streams, the F16 control weights (`n_out` rows of
/// `n_in`), `n_scale` scales and `n_out` biases, drawn in that order.
struct HcInputs {
    hc: Vec<f32>,
    fn_w: Vec<u8>,
    scale: Vec<f32>,
    base: Vec<f32>,
    n_in: usize,
}

/// The finishing steps' inputs on the device buffers of a check.
fn hc_mixed(
    mix: &DeviceBuffer,
    hc: &DeviceBuffer,
    scale: &DeviceBuffer,
    base: &DeviceBuffer,
    n_embd: usize,
    n_hc: usize,
) -> kernels::HcMixed {
    kernels::HcMixed {
        mix: mix.ptr().0,
        hc: hc.ptr().0,
        scale: scale.ptr().0,
        base: base.ptr().0,
        n_embd: n_embd as u32,
        n_hc: n_hc as u32,
    }
}

impl HcInputs {
    fn random(rng: &mut CheckRng, n_tok: usize, n_in: usize, n_out: usize, n_scale: usize) -> HcInputs {
        let hc = random_vec(rng, n_tok * n_in, 2.0);
        let fn_w = random_weights(rng, GgmlType::F16, n_in, n_out);
        let scale = (0..n_scale).map(|_| 0.5 + 0.5 * (rng.next_f32() + 1.0)).collect();
        let base = random_vec(rng, n_out, 0.5);
        HcInputs {
            hc,
            fn_w,
            scale,
            base,
            n_in,
        }
    }

    /// The streams, control weights, scales and biases on the device, in that order.
    fn upload(&self, gpu: &Gpu) -> HipResult<[DeviceBuffer; 4]> {
        Ok([
            gpu.up(&self.hc)?,
            gpu.up(&self.fn_w)?,
            gpu.up(&self.scale)?,
            gpu.up(&self.base)?,
        ])
    }

    /// CPU reference of the control mix of token `t`: unweighted RMSNorm of its streams, then the
    /// F16 matvec (`n_out` outputs). Returns the token's streams with the mix.
    fn ref_mix(&self, t: usize, n_out: usize, eps_rms: f32) -> (&[f32], Vec<f32>) {
        let n_in = self.n_in;
        let xs = &self.hc[t * n_in..(t + 1) * n_in];
        let mut normed = vec![0f32; n_in];
        rms_norm(&mut normed, xs, None, eps_rms);
        let rb = GgmlType::F16.row_bytes(n_in);
        let mix = (0..n_out)
            .map(|o| dot_f16(&self.fn_w[o * rb..(o + 1) * rb], &normed))
            .collect();
        (xs, mix)
    }

    /// CPU reference of the HC pre step of token `t`: the mix, the Sinkhorn split, the weighted
    /// stream sum. Returns the sum and the split (pre|post|comb).
    fn ref_pre(
        &self,
        t: usize,
        n_hc: usize,
        n_embd: usize,
        iters: usize,
        eps_rms: f32,
        eps_hc: f32,
    ) -> (Vec<f32>, Vec<f32>) {
        let (xs, mix) = self.ref_mix(t, 2 * n_hc + n_hc * n_hc, eps_rms);
        let (mut pre, mut post, mut comb) = (vec![0f32; n_hc], vec![0f32; n_hc], vec![0f32; n_hc * n_hc]);
        split_sinkhorn(
            &mix,
            &self.scale,
            &self.base,
            n_hc,
            iters,
            eps_hc,
            &mut pre,
            &mut post,
            &mut comb,
        );
        let mut x = vec![0f32; n_embd];
        weighted_sum(&mut x, xs, &pre, n_embd);
        (x, pre.into_iter().chain(post).chain(comb).collect())
    }
}

/// Launch ds4_hc_mix into a fresh poisoned buffer of `n_tok * n_out` mixes and return it.
fn launch_hc_mix(
    gpu: &Gpu,
    hc_d: &DeviceBuffer,
    fn_d: &DeviceBuffer,
    n_in: usize,
    n_out: usize,
    eps_rms: f32,
    n_tok: usize,
) -> HipResult<DeviceBuffer> {
    let mix = gpu.poisoned::<f32>(n_tok * n_out)?;
    gpu.run(&kernels::hc_mix(
        mix.ptr().0,
        hc_d.ptr().0,
        fn_d.ptr().0,
        n_in as u32,
        n_out as u32,
        eps_rms,
        n_tok as u32,
    ))?;
    Ok(mix)
}
