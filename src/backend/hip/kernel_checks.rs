//! Kernel checks of the GPU selftest: each kernel of `kernels/*.hip` on random inputs (every weight
//! format, odd sizes) against the CPU reference (`backend::cpu::{quant, ops, moe}`).
//!
//! Owns the inputs, the reference composition and the tolerances. The reference math itself is the
//! CPU backend's; nothing here re-derives a format.
//!
//! Exactness: the matvec, GEMM and expert kernels compute the CPU reference's float operations in
//! its order (kernels/formats.h), so their outputs are compared bit for bit (`same_bits`).
//! Tolerances elsewhere: the GPU reduces in a different order (warp trees) than the CPU (sequential /
//! 8 lanes), so float results differ by rounding only. Matvec-style outputs are compared with
//! max|gpu − cpu| ≤ tol · max|cpu| over the whole output (tol 1e-4: rounding of a few-thousand-term
//! f32 sum is ~1e-6 of its magnitude, while a wrong block, scale or row gives errors of order 1).
//! Quantized codes may differ by one where x·(1/d) lands within an ulp of a rounding tie; such
//! codes are counted and allowed up to 1 % of the codes, never by more than one step.

use crate::backend::cpu::attention::{Visible, attend};
use crate::backend::cpu::compressor::{CompressorState, NEG_INF};
use crate::backend::cpu::hc::{post as hc_post_ref, split_sinkhorn, weighted_sum};
use crate::backend::cpu::indexer::top_k_mask;
use crate::backend::cpu::moe::{swiglu, top_k_desc};
use crate::backend::cpu::ops::{Rope, fp8_kv_round_trip, indexer_qat, rms_norm, sigmoid_stable, softplus};
use crate::backend::cpu::quant::dot_f32;
use crate::backend::cpu::quant::{
    BlockQ8K, Q8_0Act, QK_K, dot_f16, dot_iq2_xxs, dot_q2_k, dot_q4_k, dot_q8_0, quantize_q8_0, quantize_q8_k,
};
use crate::gguf::half::f32_to_f16;
use crate::gguf::half::round_f16;
use crate::model::hparams::HParams;

use super::checks::{CheckResult, CheckRng, Verdict};
use super::kernel_module::KernelModule;
use super::kernels::{self, ExpertFormat, Launch, Q8K, QuantOut};
use super::runtime::{DeviceBuffer, DeviceCopy, HipContext, HipError, HipResult, Stream};

/// Relative tolerance of matvec-style outputs (see the module comment).
const TOL_MATVEC: f64 = 1e-4;

struct Gpu<'a> {
    ctx: &'a HipContext,
    kernels: &'a KernelModule,
    stream: Stream,
    /// Names of the kernels launched so far (the coverage check lists the rest).
    launched: std::cell::RefCell<std::collections::BTreeSet<&'static str>>,
}

impl Gpu<'_> {
    fn up<T: DeviceCopy>(&self, data: &[T]) -> HipResult<DeviceBuffer> {
        self.ctx.upload(data)
    }

    /// A device buffer of `n` T's filled with a poison pattern (0xFF bytes: NaN for f32), so that
    /// unwritten outputs fail the comparison.
    fn poisoned<T: DeviceCopy>(&self, n: usize) -> HipResult<DeviceBuffer> {
        let mut b = self.ctx.alloc(n * std::mem::size_of::<T>())?;
        let len = b.len_bytes();
        b.fill_bytes_async(0, len, 0xFF, &self.stream)?;
        self.stream.synchronize()?;
        Ok(b)
    }

    fn run(&self, launch: &Launch) -> HipResult<()> {
        self.launched.borrow_mut().insert(launch.kernel.name);
        // SAFETY: every check sizes its buffers for the shapes it passes (documented per kernel).
        unsafe { self.kernels.launch(&self.stream, launch)? };
        self.stream.synchronize()
    }
}

/// Scaled comparison: passes when max|got − want| ≤ tol · max|want| and nothing is NaN.
fn close_scaled(name: &str, got: &[f32], want: &[f32], tol: f64, note: String) -> CheckResult {
    let scale = want
        .iter()
        .fold(0f64, |m, &v| m.max((v as f64).abs()))
        .max(f64::MIN_POSITIVE);
    let mut max_abs = 0f64;
    let mut max_rel = 0f64;
    let mut ok = got.len() == want.len();
    for (&g, &w) in got.iter().zip(want) {
        let d = (g as f64 - w as f64).abs();
        if !d.is_finite() {
            ok = false;
            max_abs = f64::INFINITY;
            continue;
        }
        max_abs = max_abs.max(d);
        if (w as f64).abs() > 1e-3 * scale {
            max_rel = max_rel.max(d / (w as f64).abs());
        }
    }
    ok &= max_abs <= tol * scale;
    CheckResult {
        name: name.to_string(),
        max_abs,
        max_rel,
        tol,
        verdict: if ok { Verdict::Pass } else { Verdict::Fail },
        note: format!("{note}; scale max|ref| {scale:.3e}"),
    }
}

/// Bitwise comparison, for the kernels that compute the CPU reference's float operations in its order
/// (matvecs, GEMMs, experts: kernels/formats.h): passes only when every output has the reference's
/// bits; max_abs / max_rel still say how far off a failing output is. (The SwiGLU outputs also need
/// ds4_expf to equal the CPU's expf bit for bit.)
fn same_bits(name: &str, got: &[f32], want: &[f32], note: String) -> CheckResult {
    let mut r = close_scaled(name, got, want, 0.0, note);
    let differ = got.iter().zip(want).filter(|(g, w)| g.to_bits() != w.to_bits()).count();
    let ok = got.len() == want.len() && differ == 0;
    r.verdict = if ok { Verdict::Pass } else { Verdict::Fail };
    r.note = format!("{}; {differ} of {} outputs differ in bits", r.note, want.len());
    r
}

/// Code comparison: differing codes must be off by one and at most 1 % of all codes.
fn codes_close(name: &str, got: &[i8], want: &[i8], note: String) -> CheckResult {
    let mut off = 0usize;
    let mut max_step = 0i32;
    for (&g, &w) in got.iter().zip(want) {
        let d = (g as i32 - w as i32).abs();
        if d != 0 {
            off += 1;
            max_step = max_step.max(d);
        }
    }
    let ok = got.len() == want.len() && max_step <= 1 && off * 100 <= got.len();
    CheckResult {
        name: name.to_string(),
        max_abs: max_step as f64,
        max_rel: off as f64 / got.len().max(1) as f64,
        tol: 0.01,
        verdict: if ok { Verdict::Pass } else { Verdict::Fail },
        note: format!("{note}; {off} of {} codes differ (max step {max_step})", got.len()),
    }
}

/// Random weight rows of `n_out` × `n_in` in a GGUF block format (GGML type id), as file bytes.
/// Every byte pattern is a valid block except the f16 scales, which are set to finite small values.
fn random_weights(rng: &mut CheckRng, ggml_type: u32, n_in: usize, n_out: usize) -> Vec<u8> {
    let f16 = |v: f32| f32_to_f16(v).to_le_bytes();
    let (block_elems, block_bytes) = match ggml_type {
        1 => (1, 2),      // F16
        8 => (32, 34),    // Q8_0
        10 => (256, 84),  // Q2_K
        12 => (256, 144), // Q4_K
        16 => (256, 66),  // IQ2_XXS
        t => panic!("random_weights: type {t}"),
    };
    assert_eq!(n_in % block_elems, 0);
    let mut out = vec![0u8; n_out * n_in / block_elems * block_bytes];
    rng.fill_bytes(&mut out);
    for blk in out.chunks_exact_mut(block_bytes) {
        let d = (0.002 + 0.01 * (rng.next_f32() + 1.0)) * if rng.next_u64() & 1 == 1 { -1.0 } else { 1.0 };
        let dmin = 0.004 * (rng.next_f32() + 1.0);
        match ggml_type {
            1 => blk.copy_from_slice(&f16(rng.next_f32())),
            8 | 16 => blk[0..2].copy_from_slice(&f16(d)),
            10 => {
                blk[80..82].copy_from_slice(&f16(d.abs()));
                blk[82..84].copy_from_slice(&f16(dmin));
            }
            12 => {
                blk[0..2].copy_from_slice(&f16(d.abs()));
                blk[2..4].copy_from_slice(&f16(dmin));
            }
            _ => unreachable!(),
        }
    }
    out
}

fn row_bytes(ggml_type: u32, n_in: usize) -> usize {
    match ggml_type {
        1 => 2 * n_in,
        8 => n_in / 32 * 34,
        10 => n_in / 256 * 84,
        12 => n_in / 256 * 144,
        16 => n_in / 256 * 66,
        t => panic!("row_bytes: type {t}"),
    }
}

fn expert_dot(fmt: ExpertFormat, row: &[u8], x: &[BlockQ8K]) -> f32 {
    match fmt {
        ExpertFormat::Iq2Xxs => dot_iq2_xxs(row, x),
        ExpertFormat::Q2K => dot_q2_k(row, x),
        ExpertFormat::Q4K => dot_q4_k(row, x),
    }
}

fn fmt_type(fmt: ExpertFormat) -> u32 {
    match fmt {
        ExpertFormat::Iq2Xxs => 16,
        ExpertFormat::Q2K => 10,
        ExpertFormat::Q4K => 12,
    }
}

fn fmt_name(fmt: ExpertFormat) -> &'static str {
    match fmt {
        ExpertFormat::Iq2Xxs => "iq2_xxs",
        ExpertFormat::Q2K => "q2_k",
        ExpertFormat::Q4K => "q4_k",
    }
}

/// Q8_K activation planes for the GPU: codes, scales, block sums (`kernels::Q8K` layout).
struct Q8kPlanes {
    q: Vec<i8>,
    d: Vec<f32>,
    bsums: Vec<i16>,
}

/// Q8_K activation planes already on the device (codes, scales, 16-element sums).
fn q8k_device(q: &DeviceBuffer, d: &DeviceBuffer, bsums: &DeviceBuffer) -> Q8K {
    Q8K {
        q: q.ptr().0,
        d: d.ptr().0,
        bsums: bsums.ptr().0,
    }
}

fn q8k_planes(blocks: &[BlockQ8K]) -> Q8kPlanes {
    Q8kPlanes {
        q: blocks.iter().flat_map(|b| b.qs).collect(),
        d: blocks.iter().map(|b| b.d).collect(),
        bsums: blocks.iter().flat_map(|b| b.bsums).collect(),
    }
}

fn random_vec(rng: &mut CheckRng, n: usize, amp: f32) -> Vec<f32> {
    (0..n).map(|_| amp * rng.next_f32()).collect()
}

/// Run one check; a device error or a panic (e.g. a launch builder's shape assertion) becomes a FAIL
/// line instead of ending the selftest.
fn guard(name: &str, check: impl FnOnce() -> HipResult<CheckResult>) -> CheckResult {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(check)) {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => CheckResult::error(name, e),
        Err(panic) => {
            let msg = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panic".to_string());
            CheckResult::error(name, format!("panicked: {msg}"))
        }
    }
}

/// Run every kernel check, reporting each as it finishes.
pub fn run_kernel_checks(
    ctx: &HipContext,
    kernels: &KernelModule,
    rng: &mut CheckRng,
    emit: &mut dyn FnMut(CheckResult),
) {
    let gpu = match ctx.stream() {
        Ok(stream) => Gpu {
            ctx,
            kernels,
            stream,
            launched: Default::default(),
        },
        Err(e) => return emit(CheckResult::error("kernel.stream", e)),
    };

    emit(guard("kernel.fill_f32", || check_fill(&gpu, rng)));
    let r = guard("kernel.rms_norm_quant", || check_rms_norm_quant(&gpu, rng, &mut *emit));
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
        emit(guard(&name, || check_matvec_q8_0(&gpu, rng, &name, shape, gemm)));
    }
    for (n_in, n_out, n_tok, gemm) in [(2056usize, 77usize, 3usize, false), (2056, 77, 70, true)] {
        let kind = if gemm { "gemm" } else { "matvec" };
        let name = format!("kernel.{kind}_f16[{n_in}x{n_out},{n_tok} tok]");
        let shape = (n_in, n_out, n_tok);
        emit(guard(&name, || check_matvec_f16(&gpu, rng, &name, shape, gemm)));
    }
    for (n_tok, gemm) in [(2usize, false), (67, true)] {
        let kind = if gemm { "gemm" } else { "matvec" };
        let name = format!("kernel.{kind}_q8_0_swiglu[{n_tok} tok]");
        emit(guard(&name, || check_matvec_q8_0_swiglu(&gpu, rng, &name, n_tok, gemm)));
    }
    emit(guard("kernel.matvec_f16_pair", || check_matvec_f16_pair(&gpu, rng)));
    emit(guard("kernel.embed_hc", || check_embed_hc(&gpu, rng)));
    let r = guard("kernel.hc_pre.x_out", || check_hc_pre(&gpu, rng, &mut *emit));
    emit(r);
    let r = guard("kernel.hc_pre_fused.xn", || check_hc_pre_fused(&gpu, rng, &mut *emit));
    emit(r);
    for with_y2 in [false, true] {
        let name = if with_y2 {
            "kernel.hc_post[y+y2]"
        } else {
            "kernel.hc_post[y]"
        };
        emit(guard(name, || check_hc_post(&gpu, rng, name, with_y2)));
    }
    for fmt in [ExpertFormat::Iq2Xxs, ExpertFormat::Q2K, ExpertFormat::Q4K] {
        let name = format!("kernel.matvec_{}[4096x203]", fmt_name(fmt));
        emit(guard(&name, || check_matvec_k(&gpu, rng, &name, fmt, 4096, 203)));
    }
    for (n_tok, gemm) in [(2usize, false), (45, true)] {
        let kind = if gemm { "moe_gemm" } else { "moe" };
        for fmt in [ExpertFormat::Iq2Xxs, ExpertFormat::Q2K, ExpertFormat::Q4K] {
            let name = format!("kernel.{kind}_gate_up_{}[{n_tok} tok]", fmt_name(fmt));
            emit(guard(&name, || check_moe_gate_up(&gpu, rng, &name, fmt, n_tok, gemm)));
            let name = format!("kernel.{kind}_down_{}[{n_tok} tok]", fmt_name(fmt));
            emit(guard(&name, || check_moe_down(&gpu, rng, &name, fmt, n_tok, gemm)));
        }
    }
    for fmt in [ExpertFormat::Iq2Xxs, ExpertFormat::Q2K, ExpertFormat::Q4K] {
        let name = format!("kernel.moe_gemm_tile_classes_{}[bitwise vs 64-wide]", fmt_name(fmt));
        emit(guard(&name, || check_moe_gemm_tile_classes(&gpu, rng, &name, fmt)));
    }
    for hash in [false, true] {
        let name = if hash {
            "kernel.router[hash]"
        } else {
            "kernel.router[topk+bias]"
        };
        emit(guard(name, || check_router(&gpu, rng, name, hash)));
    }
    emit(guard("kernel.argmax", || check_argmax(&gpu, rng)));
    emit(guard("kernel.sample_min_p", || check_sample_min_p(&gpu, rng)));
    emit(guard("kernel.hc_head_finish", || check_hc_head(&gpu, rng)));
    for (ratio, head_dim, pos0, n_tok) in [(4usize, 512usize, 5usize, 11usize), (4, 128, 0, 1), (128, 512, 120, 10)] {
        let name = format!("kernel.compressor_pool[ratio {ratio}, {n_tok} tok at {pos0}]");
        let r = guard(&name, || {
            check_compressor(&gpu, rng, &name, (ratio, head_dim, pos0, n_tok), &mut *emit)
        });
        emit(r);
    }
    for (n_tok, pos0, top_k) in [(1usize, 1203usize, 64usize), (5, 600, 100)] {
        let name = format!("kernel.indexer[{n_tok} tok at {pos0}, top {top_k}]");
        let r = guard(&format!("{name}.topk"), || {
            check_indexer(&gpu, rng, &name, (n_tok, pos0, top_k), &mut *emit)
        });
        emit(r);
    }
    for (label, n_tok, pos0, ratio, n_comp_avail, top_k) in [
        ("decode dense", 1usize, 200usize, 0usize, 0usize, 0usize),
        ("decode ratio4 +indexer sel", 1, 1000, 4, 250, 64),
        ("prefill 20 tok ratio128", 20, 130, 128, 1, 0),
        ("prefill 3 tok ratio4", 3, 37, 4, 9, 0),
    ] {
        let name = format!("kernel.attention[{label}]");
        let shape = (n_tok, pos0, ratio, n_comp_avail, top_k);
        emit(guard(&name, || check_attention(&gpu, rng, &name, shape)));
    }
    for v in [
        RowsVariant::Q,
        RowsVariant::QInverse,
        RowsVariant::Kv,
        RowsVariant::Indexer,
    ] {
        let name = format!("kernel.rows_finish[{v:?}]");
        let r = guard(&name, || check_rows_finish(&gpu, rng, &name, v, &mut *emit));
        emit(r);
    }
    for which in kernels::MathFn::ALL {
        let name = format!("kernel.mathf[{which:?}, bitwise]");
        emit(guard(&name, || check_mathf(&gpu, &name, which)));
    }
    // Every kernel of the module must have been exercised by some check above.
    let launched = gpu.launched.borrow();
    let missing: Vec<&str> = kernels::ALL_KERNELS
        .iter()
        .map(|k| k.name)
        .filter(|n| !launched.contains(n))
        .collect();
    emit(CheckResult {
        name: "kernel.coverage".into(),
        max_abs: missing.len() as f64,
        max_rel: 0.0,
        tol: 0.0,
        verdict: if missing.is_empty() {
            Verdict::Pass
        } else {
            Verdict::Fail
        },
        note: if missing.is_empty() {
            format!("all {} kernels exercised", kernels::ALL_KERNELS.len())
        } else {
            format!("not exercised: {}", missing.join(", "))
        },
    });
}

fn check_fill(gpu: &Gpu, rng: &mut CheckRng) -> HipResult<CheckResult> {
    let n = 1_000_003usize;
    let v = rng.next_f32() * 100.0;
    let buf = gpu.poisoned::<f32>(n)?;
    gpu.run(&kernels::fill_f32(buf.ptr().0, n as u64, v))?;
    let got = buf.to_vec::<f32>()?;
    Ok(CheckResult::close(
        "kernel.fill_f32",
        &got,
        &vec![v; n],
        0.0,
        format!("n={n}"),
    ))
}

/// RMSNorm + both activation quantizations of 3 rows (n = 4096, row stride 4100), with weight.
/// The normed output is compared with the CPU RMSNorm; the quantized outputs with the CPU
/// quantization of the GPU's own normed rows (isolating quantization from norm rounding).
fn check_rms_norm_quant(gpu: &Gpu, rng: &mut CheckRng, emit: &mut dyn FnMut(CheckResult)) -> HipResult<CheckResult> {
    let (rows, n, stride, eps) = (3usize, 4096usize, 4100usize, 1e-6f32);
    let x = random_vec(rng, rows * stride, 3.0);
    let w: Vec<f32> = (0..n).map(|_| 1.0 + 0.2 * rng.next_f32()).collect();
    let (x_d, w_d) = (gpu.up(&x)?, gpu.up(&w)?);
    let out = gpu.poisoned::<f32>(rows * n)?;
    let q0_q = gpu.poisoned::<i8>(rows * n)?;
    let q0_d = gpu.poisoned::<f32>(rows * n / 32)?;
    let qk_q = gpu.poisoned::<i8>(rows * n)?;
    let qk_d = gpu.poisoned::<f32>(rows * n / 256)?;
    let qk_bs = gpu.poisoned::<i16>(rows * n / 16)?;
    let o = QuantOut {
        out: out.ptr().0,
        q8_0_q: q0_q.ptr().0,
        q8_0_d: q0_d.ptr().0,
        q8_k_q: qk_q.ptr().0,
        q8_k_d: qk_d.ptr().0,
        q8_k_bs: qk_bs.ptr().0,
    };
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
        let mut b = vec![BlockQ8K::default(); n / QK_K];
        quantize_q8_k(row, &mut b);
        wk.extend(b);
    }
    let wkp = q8k_planes(&wk);
    emit(codes_close(
        "kernel.rms_norm_quant.q8_0_codes",
        &g0q,
        &w0q,
        format!("{rows}x{n}"),
    ));
    emit(CheckResult::close(
        "kernel.rms_norm_quant.q8_0_scales",
        &g0d,
        &w0d,
        1e-6,
        String::new(),
    ));
    emit(codes_close(
        "kernel.rms_norm_quant.q8_k_codes",
        &gkq,
        &wkp.q,
        format!("{rows}x{n}"),
    ));
    emit(CheckResult::close(
        "kernel.rms_norm_quant.q8_k_scales",
        &gkd,
        &wkp.d,
        1e-6,
        String::new(),
    ));
    // The block sums must be exactly the sums of the GPU's own codes.
    let sums: Vec<f32> = gkq
        .chunks_exact(16)
        .map(|c| c.iter().map(|&q| q as f32).sum())
        .collect();
    let gkb_f: Vec<f32> = gkb.iter().map(|&s| s as f32).collect();
    emit(CheckResult::close(
        "kernel.rms_norm_quant.q8_k_bsums",
        &gkb_f,
        &sums,
        0.0,
        "vs own codes".into(),
    ));
    Ok(CheckResult::close(
        "kernel.rms_norm_quant.out",
        &got_out,
        &want_out,
        1e-5,
        format!("{rows} rows of {n}, stride {stride}, with weight"),
    ))
}

/// Q8_0 matvec over 2 tokens; `rows_per_group < n_out` exercises the grouped output projection.
fn check_matvec_q8_0(
    gpu: &Gpu,
    rng: &mut CheckRng,
    name: &str,
    (n_in, n_out, rows_per_group, n_tok): (usize, usize, usize, usize),
    gemm: bool,
) -> HipResult<CheckResult> {
    let groups = n_out.div_ceil(rows_per_group);
    let x_stride = groups * n_in;
    let w = random_weights(rng, 8, n_in, n_out);
    let x = random_vec(rng, n_tok * x_stride, 2.0);
    let mut act = Q8_0Act::with_len(n_tok * x_stride);
    quantize_q8_0(&x, &mut act);
    let (w_d, xq_d, xd_d) = (gpu.up(&w)?, gpu.up(&act.qs)?, gpu.up(&act.scales)?);
    let y = gpu.poisoned::<f32>(n_tok * n_out)?;
    let build = if gemm { kernels::gemm_q8_0 } else { kernels::matvec_q8_0 };
    gpu.run(&build(
        y.ptr().0,
        w_d.ptr().0,
        xq_d.ptr().0,
        xd_d.ptr().0,
        n_in as u32,
        n_out as u32,
        rows_per_group as u32,
        x_stride as u32,
        n_tok as u32,
    ))?;
    let got = y.to_vec::<f32>()?;
    let rb = row_bytes(8, n_in);
    let mut want = vec![0f32; n_tok * n_out];
    for t in 0..n_tok {
        for r in 0..n_out {
            let off = t * x_stride + (r / rows_per_group) * n_in;
            want[t * n_out + r] = dot_q8_0(
                &w[r * rb..(r + 1) * rb],
                &act.qs[off..off + n_in],
                &act.scales[off / 32..(off + n_in) / 32],
            );
        }
    }
    Ok(same_bits(name, &got, &want, format!("{n_tok} tokens")))
}

fn check_matvec_f16(
    gpu: &Gpu,
    rng: &mut CheckRng,
    name: &str,
    (n_in, n_out, n_tok): (usize, usize, usize),
    gemm: bool,
) -> HipResult<CheckResult> {
    let x_stride = n_in + 4;
    let w = random_weights(rng, 1, n_in, n_out);
    let x = random_vec(rng, n_tok * x_stride, 2.0);
    let (w_d, x_d) = (gpu.up(&w)?, gpu.up(&x)?);
    let y = gpu.poisoned::<f32>(n_tok * n_out)?;
    let build = if gemm { kernels::gemm_f16 } else { kernels::matvec_f16 };
    gpu.run(&build(
        y.ptr().0,
        w_d.ptr().0,
        x_d.ptr().0,
        n_in as u32,
        n_out as u32,
        x_stride as u32,
        n_tok as u32,
    ))?;
    let got = y.to_vec::<f32>()?;
    let rb = row_bytes(1, n_in);
    let mut want = vec![0f32; n_tok * n_out];
    for t in 0..n_tok {
        for r in 0..n_out {
            want[t * n_out + r] = dot_f16(&w[r * rb..(r + 1) * rb], &x[t * x_stride..t * x_stride + n_in]);
        }
    }
    Ok(same_bits(
        name,
        &got,
        &want,
        format!("{n_tok} tokens, x stride {x_stride}"),
    ))
}

fn check_matvec_k(
    gpu: &Gpu,
    rng: &mut CheckRng,
    name: &str,
    fmt: ExpertFormat,
    n_in: usize,
    n_out: usize,
) -> HipResult<CheckResult> {
    let n_tok = 2usize;
    let w = random_weights(rng, fmt_type(fmt), n_in, n_out);
    let x = random_vec(rng, n_tok * n_in, 2.0);
    let mut blocks = vec![BlockQ8K::default(); n_tok * n_in / QK_K];
    quantize_q8_k(&x, &mut blocks);
    let p = q8k_planes(&blocks);
    let (w_d, q_d, d_d, b_d) = (gpu.up(&w)?, gpu.up(&p.q)?, gpu.up(&p.d)?, gpu.up(&p.bsums)?);
    let y = gpu.poisoned::<f32>(n_tok * n_out)?;
    let xk = q8k_device(&q_d, &d_d, &b_d);
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
    let rb = row_bytes(fmt_type(fmt), n_in);
    let bpt = n_in / QK_K;
    let mut want = vec![0f32; n_tok * n_out];
    for t in 0..n_tok {
        for r in 0..n_out {
            want[t * n_out + r] = expert_dot(fmt, &w[r * rb..(r + 1) * rb], &blocks[t * bpt..(t + 1) * bpt]);
        }
    }
    Ok(same_bits(name, &got, &want, format!("{n_tok} tokens")))
}

/// Distinct random experts per token and positive weights.
fn random_selection(rng: &mut CheckRng, n_tok: usize, n_used: usize, n_expert: usize) -> (Vec<u32>, Vec<f32>) {
    let mut sel = Vec::new();
    for _ in 0..n_tok {
        let mut chosen: Vec<u32> = Vec::new();
        while chosen.len() < n_used {
            let e = rng.int_in(0, n_expert as i64 - 1) as u32;
            if !chosen.contains(&e) {
                chosen.push(e);
            }
        }
        sel.extend(chosen);
    }
    let selw = (0..n_tok * n_used)
        .map(|_| 0.2 + 0.5 * (rng.next_f32() + 1.0))
        .collect();
    (sel, selw)
}

const MOE_SHAPE: (usize, usize, usize, usize) = (768, 512, 8, 3); // n_in, n_ff, n_expert, n_used

/// Runs ds4_moe_group for `sel` (narrowest column class `min_cols`) and returns the tile buffers
/// (kept alive by the caller).
fn expert_tiles(
    gpu: &Gpu,
    sel: &DeviceBuffer,
    n_tok: usize,
    n_used: usize,
    n_expert: usize,
    min_cols: u32,
) -> HipResult<(kernels::ExpertTiles, [DeviceBuffer; 3])> {
    let max_tiles = kernels::moe_max_tiles(n_tok as u32, n_used as u32, n_expert as u32);
    let pairs = gpu.poisoned::<u32>(n_tok * n_used)?;
    let tiles = gpu.poisoned::<u32>((kernels::MOE_TILE_WORDS * max_tiles) as usize)?;
    let n_tiles = gpu.poisoned::<u32>(1)?;
    gpu.run(&kernels::moe_group(
        pairs.ptr().0,
        tiles.ptr().0,
        n_tiles.ptr().0,
        sel.ptr().0,
        n_tok as u32,
        n_used as u32,
        n_expert as u32,
        min_cols,
    ))?;
    let t = kernels::ExpertTiles {
        pairs: pairs.ptr().0,
        tiles: tiles.ptr().0,
        n_tiles: n_tiles.ptr().0,
        max_tiles,
    };
    Ok((t, [pairs, tiles, n_tiles]))
}

fn check_moe_gate_up(
    gpu: &Gpu,
    rng: &mut CheckRng,
    name: &str,
    fmt: ExpertFormat,
    n_tok: usize,
    gemm: bool,
) -> HipResult<CheckResult> {
    let (n_in, n_ff, n_expert, n_used) = MOE_SHAPE;
    let limit = 2.0f32; // small enough that some gate/up values clamp
    let ty = fmt_type(fmt);
    let gate = random_weights(rng, ty, n_in, n_ff * n_expert);
    let up = random_weights(rng, ty, n_in, n_ff * n_expert);
    let x = random_vec(rng, n_tok * n_in, 2.0);
    let mut blocks = vec![BlockQ8K::default(); n_tok * n_in / QK_K];
    quantize_q8_k(&x, &mut blocks);
    let p = q8k_planes(&blocks);
    let (sel, selw) = random_selection(rng, n_tok, n_used, n_expert);
    let (g_d, u_d) = (gpu.up(&gate)?, gpu.up(&up)?);
    let (q_d, d_d, b_d) = (gpu.up(&p.q)?, gpu.up(&p.d)?, gpu.up(&p.bsums)?);
    let (s_d, sw_d) = (gpu.up(&sel)?, gpu.up(&selw)?);
    let mid = gpu.poisoned::<f32>(n_tok * n_used * n_ff)?;
    let xk = q8k_device(&q_d, &d_d, &b_d);
    if gemm {
        let (tiles, _keep) = expert_tiles(gpu, &s_d, n_tok, n_used, n_expert, kernels::MOE_MIN_COLS)?;
        gpu.run(&kernels::moe_gemm_gate_up(
            fmt,
            mid.ptr().0,
            g_d.ptr().0,
            u_d.ptr().0,
            xk,
            tiles,
            sw_d.ptr().0,
            n_in as u32,
            n_ff as u32,
            n_used as u32,
            limit,
        ))?;
    } else {
        gpu.run(&kernels::moe_gate_up(
            fmt,
            mid.ptr().0,
            g_d.ptr().0,
            u_d.ptr().0,
            xk,
            s_d.ptr().0,
            sw_d.ptr().0,
            n_in as u32,
            n_ff as u32,
            n_used as u32,
            limit,
            n_tok as u32,
        ))?;
    }
    let got = mid.to_vec::<f32>()?;
    let rb = row_bytes(ty, n_in);
    let bpt = n_in / QK_K;
    let mut want = vec![0f32; n_tok * n_used * n_ff];
    for t in 0..n_tok {
        let xb = &blocks[t * bpt..(t + 1) * bpt];
        for k in 0..n_used {
            let e = sel[t * n_used + k] as usize;
            for r in 0..n_ff {
                let row = (e * n_ff + r) * rb;
                let g = expert_dot(fmt, &gate[row..row + rb], xb);
                let u = expert_dot(fmt, &up[row..row + rb], xb);
                want[(t * n_used + k) * n_ff + r] = swiglu(g, u, limit) * selw[t * n_used + k];
            }
        }
    }
    Ok(same_bits(
        name,
        &got,
        &want,
        format!("{n_tok} tok, {n_used}/{n_expert} experts, {n_in}->{n_ff}, limit {limit}"),
    ))
}

fn check_moe_down(
    gpu: &Gpu,
    rng: &mut CheckRng,
    name: &str,
    fmt: ExpertFormat,
    n_tok: usize,
    gemm: bool,
) -> HipResult<CheckResult> {
    let (_, n_ff, n_expert, n_used) = MOE_SHAPE;
    let n_out = 203usize;
    let ty = fmt_type(fmt);
    let down = random_weights(rng, ty, n_ff, n_out * n_expert);
    let mids = random_vec(rng, n_tok * n_used * n_ff, 1.5);
    let mut blocks = vec![BlockQ8K::default(); n_tok * n_used * n_ff / QK_K];
    quantize_q8_k(&mids, &mut blocks);
    let p = q8k_planes(&blocks);
    let (sel, _) = random_selection(rng, n_tok, n_used, n_expert);
    let dn_d = gpu.up(&down)?;
    let (q_d, d_d, b_d) = (gpu.up(&p.q)?, gpu.up(&p.d)?, gpu.up(&p.bsums)?);
    let s_d = gpu.up(&sel)?;
    let out = gpu.poisoned::<f32>(n_tok * n_out)?;
    let mk = q8k_device(&q_d, &d_d, &b_d);
    if gemm {
        let (tiles, _keep) = expert_tiles(gpu, &s_d, n_tok, n_used, n_expert, kernels::MOE_MIN_COLS)?;
        let outp = gpu.poisoned::<f32>(n_tok * n_used * n_out)?;
        gpu.run(&kernels::moe_gemm_down(
            fmt,
            outp.ptr().0,
            dn_d.ptr().0,
            mk,
            tiles,
            n_ff as u32,
            n_out as u32,
            n_used as u32,
        ))?;
        gpu.run(&kernels::moe_sum(
            out.ptr().0,
            outp.ptr().0,
            n_out as u32,
            n_used as u32,
            n_tok as u32,
        ))?;
    } else {
        gpu.run(&kernels::moe_down(
            fmt,
            out.ptr().0,
            dn_d.ptr().0,
            mk,
            s_d.ptr().0,
            n_ff as u32,
            n_out as u32,
            n_used as u32,
            n_tok as u32,
        ))?;
    }
    let got = out.to_vec::<f32>()?;
    let rb = row_bytes(ty, n_ff);
    let bpr = n_ff / QK_K;
    let mut want = vec![0f32; n_tok * n_out];
    for t in 0..n_tok {
        for r in 0..n_out {
            let mut acc = 0f32;
            for k in 0..n_used {
                let e = sel[t * n_used + k] as usize;
                let row = (e * n_out + r) * rb;
                let m = &blocks[(t * n_used + k) * bpr..(t * n_used + k + 1) * bpr];
                acc += expert_dot(fmt, &down[row..row + rb], m);
            }
            want[t * n_out + r] = acc;
        }
    }
    Ok(same_bits(
        name,
        &got,
        &want,
        format!("{n_tok} tok, {n_used}/{n_expert} experts, {n_ff}->{n_out}"),
    ))
}

/// The grouped expert GEMMs in every column class against the all-64-wide tiling (`min_cols` 64,
/// the tiling before the classes existed): gate/up mids and per-pair down outputs must be
/// bitwise identical, because every class accumulates each output over the same chunks in the same
/// order with the same float expression (kernels/gemm.hip). Pair counts per expert:
/// [`kernels::TILE_CLASS_COUNTS`]; fails too if the grouping did not use every class.
fn check_moe_gemm_tile_classes(gpu: &Gpu, rng: &mut CheckRng, name: &str, fmt: ExpertFormat) -> HipResult<CheckResult> {
    let (n_in, n_ff, n_out, n_used, limit) = (512usize, 512usize, 203usize, 2usize, 2.0f32);
    let n_expert = kernels::TILE_CLASS_COUNTS.len();
    let sel = kernels::selection_with_counts(&kernels::TILE_CLASS_COUNTS, rng.next_u64());
    let n_tok = sel.len() / n_used;
    let ty = fmt_type(fmt);
    let gate = gpu.up(&random_weights(rng, ty, n_in, n_ff * n_expert))?;
    let up = gpu.up(&random_weights(rng, ty, n_in, n_ff * n_expert))?;
    let down = gpu.up(&random_weights(rng, ty, n_ff, n_out * n_expert))?;
    let planes = |v: &[f32]| {
        let mut blocks = vec![BlockQ8K::default(); v.len() / QK_K];
        quantize_q8_k(v, &mut blocks);
        let p = q8k_planes(&blocks);
        Ok::<_, HipError>([gpu.up(&p.q)?, gpu.up(&p.d)?, gpu.up(&p.bsums)?])
    };
    let q8k = |b: &[DeviceBuffer; 3]| q8k_device(&b[0], &b[1], &b[2]);
    let x = planes(&random_vec(rng, n_tok * n_in, 2.0))?;
    let mids = planes(&random_vec(rng, n_tok * n_used * n_ff, 1.5))?;
    let selw: Vec<f32> = (0..sel.len()).map(|_| 0.2 + 0.5 * (rng.next_f32() + 1.0)).collect();
    let (s_d, sw_d) = (gpu.up(&sel)?, gpu.up(&selw)?);
    let mut outputs = Vec::new();
    let mut classes = Vec::new();
    for min_cols in [64, kernels::MOE_MIN_COLS] {
        let (tiles, keep) = expert_tiles(gpu, &s_d, n_tok, n_used, n_expert, min_cols)?;
        let mid = gpu.poisoned::<f32>(n_tok * n_used * n_ff)?;
        let outp = gpu.poisoned::<f32>(n_tok * n_used * n_out)?;
        gpu.run(&kernels::moe_gemm_gate_up(
            fmt,
            mid.ptr().0,
            gate.ptr().0,
            up.ptr().0,
            q8k(&x),
            tiles,
            sw_d.ptr().0,
            n_in as u32,
            n_ff as u32,
            n_used as u32,
            limit,
        ))?;
        gpu.run(&kernels::moe_gemm_down(
            fmt,
            outp.ptr().0,
            down.ptr().0,
            q8k(&mids),
            tiles,
            n_ff as u32,
            n_out as u32,
            n_used as u32,
        ))?;
        let n_tiles = keep[2].to_vec::<u32>()?[0] as usize;
        let words = keep[1].to_vec::<u32>()?;
        classes = words.chunks(4).take(n_tiles).map(|t| t[3]).collect();
        let mut bytes: Vec<u8> = mid.to_vec::<f32>()?.iter().flat_map(|v| v.to_le_bytes()).collect();
        bytes.extend(outp.to_vec::<f32>()?.iter().flat_map(|v| v.to_le_bytes()));
        outputs.push(bytes);
    }
    let mut r = CheckResult::exact(
        name,
        &outputs[1],
        &outputs[0],
        format!(
            "{n_tok} tok x {n_used}, pairs per expert {:?}, tile classes {classes:?}",
            kernels::TILE_CLASS_COUNTS
        ),
    );
    if !kernels::MOE_TILE_COLS.iter().all(|c| classes.contains(c)) {
        r.verdict = Verdict::Fail;
        r.note = format!("grouping did not use every column class: {}", r.note);
    }
    Ok(r)
}

/// Router (spec §3.9): top-k of sqrt(softplus(logit)) + bias, or hash-table experts; weights are
/// the unbiased probs normalised by their sum and scaled. Ids must match exactly; weights to 1e-5.
fn check_router(gpu: &Gpu, rng: &mut CheckRng, name: &str, hash: bool) -> HipResult<CheckResult> {
    let (n_expert, n_used, n_tok, scale) = (256usize, 6usize, 3usize, 1.5f32);
    let logits = random_vec(rng, n_tok * n_expert, 4.0);
    let bias = random_vec(rng, n_expert, 0.05);
    let tokens: Vec<u32> = (0..n_tok).map(|_| rng.int_in(0, 99) as u32).collect();
    let table: Vec<u32> = (0..100 * n_used)
        .map(|_| rng.int_in(0, n_expert as i64 - 1) as u32)
        .collect();
    let (l_d, b_d, t_d, tab_d) = (gpu.up(&logits)?, gpu.up(&bias)?, gpu.up(&tokens)?, gpu.up(&table)?);
    let sel = gpu.poisoned::<u32>(n_tok * n_used)?;
    let selw = gpu.poisoned::<f32>(n_tok * n_used)?;
    gpu.run(&kernels::router(
        sel.ptr().0,
        selw.ptr().0,
        l_d.ptr().0,
        if hash { kernels::NULL } else { b_d.ptr().0 },
        if hash { tab_d.ptr().0 } else { kernels::NULL },
        t_d.ptr().0,
        n_expert as u32,
        n_used as u32,
        scale,
        n_tok as u32,
    ))?;
    let (got_sel, got_w) = (sel.to_vec::<u32>()?, selw.to_vec::<f32>()?);
    let mut want_sel = Vec::new();
    let mut want_w = Vec::new();
    for t in 0..n_tok {
        let probs: Vec<f32> = logits[t * n_expert..(t + 1) * n_expert]
            .iter()
            .map(|&z| softplus(z).sqrt())
            .collect();
        let ids: Vec<usize> = if hash {
            table[tokens[t] as usize * n_used..(tokens[t] as usize + 1) * n_used]
                .iter()
                .map(|&e| e as usize)
                .collect()
        } else {
            let biased: Vec<f32> = probs.iter().zip(&bias).map(|(p, b)| p + b).collect();
            let mut idx = vec![0usize; n_used];
            top_k_desc(&biased, n_used, &mut idx);
            idx
        };
        let sum = ids.iter().map(|&e| probs[e]).sum::<f32>().max(6.103_515_6e-5);
        want_sel.extend(ids.iter().map(|&e| e as u32));
        want_w.extend(ids.iter().map(|&e| probs[e] / sum * scale));
    }
    let mut r = CheckResult::close(name, &got_w, &want_w, 1e-5, format!("{n_tok} tok, {n_used}/{n_expert}"));
    if got_sel != want_sel {
        r.verdict = Verdict::Fail;
        r.note = format!("expert ids differ: gpu {got_sel:?} cpu {want_sel:?}");
    }
    Ok(r)
}

fn check_argmax(gpu: &Gpu, rng: &mut CheckRng) -> HipResult<CheckResult> {
    let n = 129_280usize;
    let mut logits = random_vec(rng, n, 10.0);
    let at = rng.int_in(0, n as i64 - 1) as usize;
    logits[at] = 11.0; // above every other draw (|x| < 10)
    logits[(at + 17) % n] = f32::NAN; // non-finite logits are skipped
    let l_d = gpu.up(&logits)?;
    let out = gpu.poisoned::<u32>(kernels::SAMPLE_OUT_WORDS)?;
    gpu.run(&kernels::argmax(out.ptr().0, l_d.ptr().0, n as u32))?;
    let got = out.to_vec::<u32>()?[0];
    Ok(CheckResult::close(
        "kernel.argmax",
        &[got as f32],
        &[at as f32],
        0.0,
        format!("n={n}, max at {at}, one NaN"),
    ))
}

fn check_matvec_f16_pair(gpu: &Gpu, rng: &mut CheckRng) -> HipResult<CheckResult> {
    let (n_in, n_out, n_tok) = (1024usize, 37usize, 2usize);
    let w0 = random_weights(rng, 1, n_in, n_out);
    let w1 = random_weights(rng, 1, n_in, n_out);
    let x = random_vec(rng, n_tok * n_in, 2.0);
    let (w0_d, w1_d, x_d) = (gpu.up(&w0)?, gpu.up(&w1)?, gpu.up(&x)?);
    let (y0, y1) = (gpu.poisoned::<f32>(n_tok * n_out)?, gpu.poisoned::<f32>(n_tok * n_out)?);
    gpu.run(&kernels::matvec_f16_pair(
        y0.ptr().0,
        y1.ptr().0,
        w0_d.ptr().0,
        w1_d.ptr().0,
        x_d.ptr().0,
        n_in as u32,
        n_out as u32,
        n_in as u32,
        n_tok as u32,
    ))?;
    let mut got = y0.to_vec::<f32>()?;
    got.extend(y1.to_vec::<f32>()?);
    let rb = row_bytes(1, n_in);
    let mut want = Vec::new();
    for w in [&w0, &w1] {
        for t in 0..n_tok {
            for r in 0..n_out {
                want.push(dot_f16(&w[r * rb..(r + 1) * rb], &x[t * n_in..(t + 1) * n_in]));
            }
        }
    }
    Ok(same_bits(
        "kernel.matvec_f16_pair",
        &got,
        &want,
        format!("2 x {n_in}x{n_out}, {n_tok} tok"),
    ))
}

fn check_matvec_q8_0_swiglu(
    gpu: &Gpu,
    rng: &mut CheckRng,
    name: &str,
    n_tok: usize,
    gemm: bool,
) -> HipResult<CheckResult> {
    let (n_in, n_ff, limit) = (2048usize, 101usize, 3.0f32);
    let wg = random_weights(rng, 8, n_in, n_ff);
    let wu = random_weights(rng, 8, n_in, n_ff);
    let x = random_vec(rng, n_tok * n_in, 2.0);
    let mut act = Q8_0Act::with_len(n_tok * n_in);
    quantize_q8_0(&x, &mut act);
    let (g_d, u_d, xq_d, xd_d) = (gpu.up(&wg)?, gpu.up(&wu)?, gpu.up(&act.qs)?, gpu.up(&act.scales)?);
    let mid = gpu.poisoned::<f32>(n_tok * n_ff)?;
    let build = if gemm {
        kernels::gemm_q8_0_swiglu
    } else {
        kernels::matvec_q8_0_swiglu
    };
    gpu.run(&build(
        mid.ptr().0,
        g_d.ptr().0,
        u_d.ptr().0,
        xq_d.ptr().0,
        xd_d.ptr().0,
        n_in as u32,
        n_ff as u32,
        limit,
        n_tok as u32,
    ))?;
    let got = mid.to_vec::<f32>()?;
    let rb = row_bytes(8, n_in);
    let mut want = vec![0f32; n_tok * n_ff];
    for t in 0..n_tok {
        let (q, d) = (
            &act.qs[t * n_in..(t + 1) * n_in],
            &act.scales[t * n_in / 32..(t + 1) * n_in / 32],
        );
        for r in 0..n_ff {
            let g = dot_q8_0(&wg[r * rb..(r + 1) * rb], q, d);
            let u = dot_q8_0(&wu[r * rb..(r + 1) * rb], q, d);
            want[t * n_ff + r] = swiglu(g, u, limit);
        }
    }
    Ok(same_bits(
        name,
        &got,
        &want,
        format!("{n_in}->{n_ff}, {n_tok} tok, limit {limit}"),
    ))
}

fn check_embed_hc(gpu: &Gpu, rng: &mut CheckRng) -> HipResult<CheckResult> {
    let (n_vocab, n_embd, n_hc) = (1000usize, 520usize, 4usize);
    let emb = random_weights(rng, 1, n_embd, n_vocab);
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
                .map(|h| crate::gguf::half::f16_to_f32(u16::from_le_bytes([h[0], h[1]])))
                .collect()
        } else {
            vec![0.0; n_embd]
        };
        for _ in 0..n_hc {
            want.extend_from_slice(&row);
        }
    }
    Ok(CheckResult::close(
        "kernel.embed_hc",
        &got,
        &want,
        0.0,
        format!("{n_tok} tokens (one out of range)"),
    ))
}

/// HC pre step (spec §3.2): unweighted RMSNorm of the flattened streams, F16 control matvec, Sinkhorn
/// split, weighted stream sum, through ds4_hc_mix + ds4_hc_pre_finish: bitwise equal to the CPU
/// reference (the kernels follow its operation order). Flash shape per token with a smaller n_embd.
fn check_hc_pre(gpu: &Gpu, rng: &mut CheckRng, emit: &mut dyn FnMut(CheckResult)) -> HipResult<CheckResult> {
    let (n_hc, n_embd, n_tok, iters, eps_rms, eps_hc) = (4usize, 1024usize, 2usize, 20usize, 1e-6f32, 1e-6f32);
    let n_in = n_hc * n_embd;
    let n_mix = 2 * n_hc + n_hc * n_hc;
    let hc = random_vec(rng, n_tok * n_in, 2.0);
    let fn_w = random_weights(rng, 1, n_in, n_mix);
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
    let rb = row_bytes(1, n_in);
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
    let fn_w = random_weights(rng, 1, n_in, n_mix);
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
    let q0_d = gpu.poisoned::<f32>(n_tok * n_embd / 32)?;
    let qk_q = gpu.poisoned::<i8>(n_tok * n_embd)?;
    let qk_d = gpu.poisoned::<f32>(n_tok * n_embd / 256)?;
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
    let rb = row_bytes(1, n_in);
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
        let mut b = vec![BlockQ8K::default(); n_embd / QK_K];
        quantize_q8_k(row, &mut b);
        want_qk.extend(q8k_planes(&b).q);
    }
    emit(same_bits(
        "kernel.hc_pre_fused.split",
        &got_split,
        &want_split,
        "second launch".into(),
    ));
    emit(codes_close(
        "kernel.hc_pre_fused.q8_0_codes",
        &got_q0,
        &want_q0,
        "of the GPU's xn".into(),
    ));
    emit(codes_close(
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

/// HC post (spec §3.3) with a random split (post weights and combine matrix), y2 optional.
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
    Ok(close_scaled(
        name,
        &got,
        &want,
        1e-5,
        format!("{n_tok} tok, n_hc {n_hc}, n_embd {n_embd}"),
    ))
}

/// Scaled comparison for outputs that pass through a quantizer (E4M3, FP4): an input that lands
/// within rounding of a quantization boundary may round to the neighbouring code, so up to
/// `max_frac` of the elements may exceed `tol · max|want|`; NaN never passes.
fn close_mostly(name: &str, got: &[f32], want: &[f32], tol: f64, max_frac: f64, note: String) -> CheckResult {
    let mut r = close_scaled(name, got, want, tol, note);
    let scale = want
        .iter()
        .fold(0f64, |m, &v| m.max((v as f64).abs()))
        .max(f64::MIN_POSITIVE);
    let off = got
        .iter()
        .zip(want)
        .filter(|(g, w)| {
            let d = (**g as f64 - **w as f64).abs();
            d.is_nan() || d > tol * scale
        })
        .count();
    let frac = off as f64 / want.len().max(1) as f64;
    let ok = got.len() == want.len() && got.iter().all(|g| g.is_finite()) && frac <= max_frac;
    r.verdict = if ok { Verdict::Pass } else { Verdict::Fail };
    r.note = format!(
        "{}; {off} of {} elements beyond tol (allowed {:.1} %)",
        r.note,
        want.len(),
        max_frac * 100.0
    );
    r
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum RowsVariant {
    /// Attention q rows: RMSNorm (no weight) + plain RoPE (dense layer).
    Q,
    /// Inverse RoPE (attention output de-rotation, spec §3.4).
    QInverse,
    /// KV row of a compressed layer: RMSNorm with weight, YaRN RoPE, E4M3 on the non-rope dims, f16
    /// rounding, stored into the raw ring (spec §3.4, §3.6, §4.2).
    Kv,
    /// Indexer q rows: YaRN RoPE + Hadamard-128 and FP4 (spec §3.6, §3.8).
    Indexer,
}

fn check_rows_finish(
    gpu: &Gpu,
    rng: &mut CheckRng,
    name: &str,
    v: RowsVariant,
    emit: &mut dyn FnMut(CheckResult),
) -> HipResult<CheckResult> {
    use kernels::row_flags as f;
    let hp = HParams::flash();
    let eps = 1e-6f32;
    let (n_head, head_dim, n_tok, pos0, flags, compressed) = match v {
        RowsVariant::Q => (3usize, hp.head_dim, 2usize, 1000usize, f::NORM | f::ROPE, false),
        RowsVariant::QInverse => (2, hp.head_dim, 2, 77, f::ROPE | f::ROPE_INVERSE, false),
        RowsVariant::Kv => (
            1,
            hp.head_dim,
            3,
            300,
            f::NORM | f::ROPE | f::E4M3 | f::ROUND_F16 | f::STORE_RING,
            true,
        ),
        RowsVariant::Indexer => (4, hp.idx_head_dim, 2, 4100, f::ROPE | f::HADAMARD_FP4, true),
    };
    let ring_cap = 256usize;
    let x = random_vec(rng, n_tok * n_head * head_dim, 3.0);
    let w: Vec<f32> = (0..head_dim).map(|_| 1.0 + 0.3 * rng.next_f32()).collect();
    let use_w = v == RowsVariant::Kv;
    let x_d = gpu.up(&x)?;
    let w_d = gpu.up(&w)?;
    let ring = gpu.poisoned::<f32>(ring_cap * head_dim)?;
    let pos_d = gpu.up(&[pos0 as u32])?;
    let rope = if compressed {
        kernels::RopeParams::yarn(
            hp.n_rot as u32,
            hp.compress_rope_freq_base,
            hp.rope_scaling_factor,
            hp.rope_orig_ctx as u32,
            hp.yarn_beta_fast,
            hp.yarn_beta_slow,
        )
    } else {
        kernels::RopeParams::plain(hp.n_rot as u32, hp.rope_freq_base)
    };
    gpu.run(&kernels::rows_finish(
        x_d.ptr().0,
        if flags & f::STORE_RING != 0 {
            ring.ptr().0
        } else {
            kernels::NULL
        },
        if use_w { w_d.ptr().0 } else { kernels::NULL },
        pos_d.ptr().0,
        n_head as u32,
        head_dim as u32,
        flags,
        ring_cap as u32,
        rope,
        eps,
        n_tok as u32,
    ))?;
    let got = x_d.to_vec::<f32>()?;
    let cpu_rope = Rope::for_layer(&hp, compressed);
    let mut want = x.clone();
    for t in 0..n_tok {
        for h in 0..n_head {
            let row = &mut want[(t * n_head + h) * head_dim..(t * n_head + h + 1) * head_dim];
            if flags & f::NORM != 0 {
                let src = row.to_vec();
                rms_norm(row, &src, if use_w { Some(&w) } else { None }, eps);
            }
            cpu_rope.apply(row, head_dim, pos0 + t, flags & f::ROPE_INVERSE != 0);
            if flags & f::E4M3 != 0 {
                fp8_kv_round_trip(row, head_dim - hp.n_rot);
            }
            if flags & f::HADAMARD_FP4 != 0 {
                indexer_qat(row);
            }
            if flags & f::ROUND_F16 != 0 {
                row.iter_mut().for_each(|x| *x = round_f16(*x));
            }
        }
    }
    let quantized = flags & (f::E4M3 | f::HADAMARD_FP4) != 0;
    let note = format!("{n_tok} tok x {n_head} heads x {head_dim}, pos {pos0}");
    if flags & f::STORE_RING != 0 {
        let ring_all = ring.to_vec::<f32>()?;
        let mut got_ring = Vec::new();
        for t in 0..n_tok {
            let r = (pos0 + t) % ring_cap;
            got_ring.extend_from_slice(&ring_all[r * head_dim..(r + 1) * head_dim]);
        }
        emit(close_mostly(
            &format!("{name}.ring"),
            &got_ring,
            &want,
            1e-4,
            0.005,
            format!("rows at pos % {ring_cap}"),
        ));
    }
    Ok(if quantized {
        close_mostly(name, &got, &want, 1e-4, 0.005, note)
    } else {
        close_scaled(name, &got, &want, 1e-5, note)
    })
}

/// Attention with sinks over the raw ring and the compressed rows (spec §3.4, pitfall 8) against the
/// CPU `attend`, for decode (split rows + combine) and batched prefill, with and without the
/// indexer's row selection. `shape` = (n_tok, pos0, ratio, n_comp_avail, top_k; 0 = no selection).
fn check_attention(
    gpu: &Gpu,
    rng: &mut CheckRng,
    name: &str,
    shape: (usize, usize, usize, usize, usize),
) -> HipResult<CheckResult> {
    let (n_tok, pos0, ratio, n_comp_avail, top_k) = shape;
    let (n_head, head_dim, window, ring_cap) = (16usize, 512usize, 128usize, 256usize);
    let q = random_vec(rng, n_tok * n_head * head_dim, 1.0);
    let ring = random_vec(rng, ring_cap * head_dim, 1.0);
    let comp = random_vec(rng, n_comp_avail.max(1) * head_dim, 1.0);
    let sinks = random_vec(rng, n_head, 2.0);
    // Ascending distinct selections of top_k rows among the visible compressed rows of each token.
    let mut sel: Vec<u32> = Vec::new();
    let visible_comp = |p: usize| (p + 1).checked_div(ratio).map_or(0, |c| c.min(n_comp_avail));
    for t in 0..n_tok {
        let n_c = visible_comp(pos0 + t);
        let mut rows: Vec<u32> = Vec::new();
        if top_k > 0 {
            let mut all: Vec<u32> = (0..n_c as u32).collect();
            for i in (1..all.len()).rev() {
                all.swap(i, rng.int_in(0, i as i64) as usize);
            }
            rows = all.into_iter().take(top_k.min(n_c)).collect();
            rows.sort_unstable();
            rows.resize(top_k, 0);
        }
        sel.extend(rows);
    }
    let att = kernels::AttentionShape {
        n_head: n_head as u32,
        head_dim: head_dim as u32,
        ring_cap: ring_cap as u32,
        window: window as u32,
        ratio: ratio as u32,
        top_k: top_k as u32,
    };
    let selected = top_k > 0;
    let rows = att.visible_rows((pos0 + n_tok - 1) as u32, n_comp_avail as u32, selected);
    let (q_d, r_d, c_d, s_d) = (gpu.up(&q)?, gpu.up(&ring)?, gpu.up(&comp)?, gpu.up(&sinks)?);
    let sel_d = gpu.up(&if sel.is_empty() { vec![0u32] } else { sel.clone() })?;
    let out = gpu.poisoned::<f32>(n_tok * n_head * head_dim)?;
    // A score stride of 3 spare rows (as a captured decode graph sizes it for the session): the
    // spare score blocks exit and the output is the same.
    let sc = gpu.poisoned::<f32>(att.score_floats(n_tok as u32, rows + 3))?;
    let inv = gpu.poisoned::<f32>(n_tok * n_head)?;
    let pos_d = gpu.up(&[pos0 as u32])?;
    for launch in kernels::attention(
        &att,
        out.ptr().0,
        sc.ptr().0,
        inv.ptr().0,
        q_d.ptr().0,
        r_d.ptr().0,
        c_d.ptr().0,
        if selected { sel_d.ptr().0 } else { kernels::NULL },
        s_d.ptr().0,
        pos_d.ptr().0,
        n_comp_avail as u32,
        rows + 3,
        n_tok as u32,
    ) {
        gpu.run(&launch)?;
    }
    let got = out.to_vec::<f32>()?;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("1-thread pool");
    let mut want = vec![0f32; n_tok * n_head * head_dim];
    for t in 0..n_tok {
        let p = pos0 + t;
        let first = (p + 1).saturating_sub(window);
        let raw: Vec<f32> = (first..=p)
            .flat_map(|pos| {
                ring[(pos % ring_cap) * head_dim..(pos % ring_cap + 1) * head_dim]
                    .iter()
                    .copied()
            })
            .collect();
        let n_c = visible_comp(p);
        let allowed: Option<Vec<bool>> = (selected && n_c > top_k).then(|| {
            let mut a = vec![false; n_c];
            for &r in &sel[t * top_k..(t + 1) * top_k] {
                a[r as usize] = true;
            }
            a
        });
        let vis = Visible {
            raw: &raw,
            comp: &comp[..n_c * head_dim],
            allowed: allowed.as_deref(),
        };
        let mut scores = vec![0f32; n_head * (raw.len() / head_dim + n_c).max(1)];
        let qt = &q[t * n_head * head_dim..(t + 1) * n_head * head_dim];
        attend(
            &pool,
            qt,
            &vis,
            &sinks,
            head_dim,
            &mut want[t * n_head * head_dim..(t + 1) * n_head * head_dim],
            &mut scores,
        );
    }
    Ok(same_bits(
        name,
        &got,
        &want,
        format!(
            "{n_tok} tok at {pos0}, {n_head}x{head_dim}, {rows} rows (stride {})",
            rows + 3
        ),
    ))
}

/// Default sampler path (spec §7.2) on two finite logits (every other logit −inf, so skipped): the
/// draw must pick the first id when u01·(p_a + p_b) ≤ p_a and the second otherwise; min_p = 1 keeps
/// only the maximum. Exact ids.
fn check_sample_min_p(gpu: &Gpu, rng: &mut CheckRng) -> HipResult<CheckResult> {
    let n = 50_000usize;
    let (a, b) = (rng.int_in(0, 20_000) as usize, rng.int_in(30_000, 49_999) as usize);
    let mut logits = vec![f32::NEG_INFINITY; n];
    let (la, lb, temp) = (1.0f32, 0.5f32, 0.8f32);
    logits[a] = la;
    logits[b] = lb;
    let pb = ((lb - la) / temp).exp(); // p_a = 1 (the maximum)
    let boundary = 1.0 / (1.0 + pb); // u01 below it picks a
    let l_d = gpu.up(&logits)?;
    let out = gpu.poisoned::<u32>(kernels::SAMPLE_OUT_WORDS)?;
    let mut got = Vec::new();
    let mut want = Vec::new();
    for (u01, min_p) in [
        (boundary * 0.5, 0.0f32),
        (boundary + (1.0 - boundary) * 0.5, 0.0),
        (0.99, 1.0),
    ] {
        gpu.run(&kernels::sample_min_p(
            out.ptr().0,
            l_d.ptr().0,
            n as u32,
            temp,
            min_p,
            u01,
        ))?;
        got.push(out.to_vec::<u32>()?[0] as f32);
        want.push(if u01 <= boundary || min_p >= 1.0 {
            a as f32
        } else {
            b as f32
        });
    }
    Ok(CheckResult::close(
        "kernel.sample_min_p",
        &got,
        &want,
        0.0,
        format!("ids {a}/{b}, boundary u01 {boundary:.4}; draws below, above, and min_p=1"),
    ))
}

/// Output-head HC reduction (spec §3.10): unweighted RMSNorm of the streams, F16 head control,
/// stable sigmoid weights + eps, weighted stream sum.
fn check_hc_head(gpu: &Gpu, rng: &mut CheckRng) -> HipResult<CheckResult> {
    let (n_hc, n_embd, n_tok, eps_rms, eps_hc) = (4usize, 1024usize, 2usize, 1e-6f32, 1e-6f32);
    let n_in = n_hc * n_embd;
    let hc = random_vec(rng, n_tok * n_in, 2.0);
    let fn_w = random_weights(rng, 1, n_in, n_hc);
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
    let rb = row_bytes(1, n_in);
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

/// Compressor state update and pooling (spec §3.7) against `CompressorState::push`, starting from a
/// random mid-stream state; checks the emitted rows and the final kv/score state.
fn check_compressor(
    gpu: &Gpu,
    rng: &mut CheckRng,
    name: &str,
    shape: (usize, usize, usize, usize),
    emit: &mut dyn FnMut(CheckResult),
) -> HipResult<CheckResult> {
    let (ratio, head_dim, pos0, n_tok) = shape;
    let comp_cap = 64usize;
    let mut cpu = CompressorState::new(ratio, head_dim);
    let w = cpu.width();
    // A state as left by earlier tokens: random rows, some never-written rows (NEG_INF scores).
    for (k, s) in cpu.kv.iter_mut().zip(cpu.score.iter_mut()) {
        *k = rng.next_f32();
        *s = if rng.next_u64().is_multiple_of(5) {
            NEG_INF
        } else {
            2.0 * rng.next_f32()
        };
    }
    let kv_cur = random_vec(rng, n_tok * w, 1.0);
    let sc_cur = random_vec(rng, n_tok * w, 2.0);
    let ape_bits: Vec<u16> = (0..ratio * w).map(|_| f32_to_f16(0.5 * rng.next_f32())).collect();
    let ape: Vec<f32> = ape_bits.iter().map(|&h| crate::gguf::half::f16_to_f32(h)).collect();
    let (skv_d, ssc_d) = (gpu.up(&cpu.kv)?, gpu.up(&cpu.score)?);
    let (kv_d, sc_d, ape_d) = (gpu.up(&kv_cur)?, gpu.up(&sc_cur)?, gpu.up(&ape_bits)?);
    let comp = gpu.poisoned::<f32>(comp_cap * head_dim)?;
    let pos_d = gpu.up(&[pos0 as u32])?;
    gpu.run(&kernels::compressor_pool(
        comp.ptr().0,
        skv_d.ptr().0,
        ssc_d.ptr().0,
        kv_d.ptr().0,
        sc_d.ptr().0,
        ape_d.ptr().0,
        pos_d.ptr().0,
        head_dim as u32,
        ratio as u32,
        n_tok as u32,
        comp_cap as u32,
    ))?;
    let comp_all = comp.to_vec::<f32>()?;
    let (mut got_rows, mut want_rows) = (Vec::new(), Vec::new());
    let mut row = vec![0f32; head_dim];
    for t in 0..n_tok {
        let p = pos0 + t;
        if cpu.push(
            &kv_cur[t * w..(t + 1) * w],
            &sc_cur[t * w..(t + 1) * w],
            &ape,
            p,
            &mut row,
        ) {
            let r = (p + 1) / ratio - 1;
            want_rows.extend_from_slice(&row);
            got_rows.extend_from_slice(&comp_all[r * head_dim..(r + 1) * head_dim]);
        }
    }
    let (got_kv, got_sc) = (skv_d.to_vec::<f32>()?, ssc_d.to_vec::<f32>()?);
    let mut state_got = got_kv;
    state_got.extend(got_sc);
    let mut state_want = cpu.kv.clone();
    state_want.extend(&cpu.score);
    emit(CheckResult::close(
        &format!("{name}.state"),
        &state_got,
        &state_want,
        0.0,
        "kv|score".into(),
    ));
    let emitted = want_rows.len() / head_dim;
    Ok(close_scaled(
        name,
        &got_rows,
        &want_rows,
        TOL_MATVEC,
        format!("{emitted} rows emitted, head_dim {head_dim}"),
    ))
}

/// Lightning indexer (spec §3.8): scores Σ_h max(0, k·q_h)·w_h·scale over the visible compressed rows
/// (against the CPU formula with `dot_f32`), then the top-k selection of the GPU's own scores
/// against `top_k_mask` (ties to the lower row), exact.
fn check_indexer(
    gpu: &Gpu,
    rng: &mut CheckRng,
    name: &str,
    shape: (usize, usize, usize),
    emit: &mut dyn FnMut(CheckResult),
) -> HipResult<CheckResult> {
    let (n_tok, pos0, top_k) = shape;
    let (n_head, head_dim, ratio) = (64usize, 128usize, 4usize);
    let n_comp_avail = (pos0 + n_tok) / ratio;
    let score_stride = n_comp_avail + 3;
    let qi = random_vec(rng, n_tok * n_head * head_dim, 1.0);
    let w = random_vec(rng, n_tok * n_head, 1.0);
    let mut krows = random_vec(rng, n_comp_avail * head_dim, 1.0);
    // Two identical rows give an exact score tie for the selection's tie rule.
    let dup = krows[..head_dim].to_vec();
    krows[head_dim..2 * head_dim].copy_from_slice(&dup);
    let w_scale = 1.0 / ((head_dim * n_head) as f32).sqrt();
    let (q_d, w_d, k_d) = (gpu.up(&qi)?, gpu.up(&w)?, gpu.up(&krows)?);
    let scores = gpu.poisoned::<f32>(n_tok * score_stride)?;
    let sel = gpu.poisoned::<u32>(n_tok * top_k)?;
    let pos_d = gpu.up(&[pos0 as u32])?;
    gpu.run(&kernels::indexer_scores(
        scores.ptr().0,
        q_d.ptr().0,
        w_d.ptr().0,
        k_d.ptr().0,
        pos_d.ptr().0,
        n_head as u32,
        n_comp_avail as u32,
        ratio as u32,
        top_k as u32,
        score_stride as u32,
        w_scale,
        n_comp_avail as u32,
        n_tok as u32,
    ))?;
    gpu.run(&kernels::indexer_topk(
        sel.ptr().0,
        scores.ptr().0,
        pos_d.ptr().0,
        score_stride as u32,
        n_comp_avail as u32,
        ratio as u32,
        top_k as u32,
        n_tok as u32,
    ))?;
    let (got_scores_all, got_sel) = (scores.to_vec::<f32>()?, sel.to_vec::<u32>()?);
    let (mut got_s, mut want_s) = (Vec::new(), Vec::new());
    let mut sel_mismatch = Vec::new();
    for t in 0..n_tok {
        let n_c = ((pos0 + t + 1) / ratio).min(n_comp_avail);
        // Tokens that see at most top_k rows use no selection: the kernels skip them.
        if n_c <= top_k {
            continue;
        }
        let row_scores = &got_scores_all[t * score_stride..t * score_stride + n_c];
        got_s.extend_from_slice(row_scores);
        for c in 0..n_c {
            let k = &krows[c * head_dim..(c + 1) * head_dim];
            let mut acc = 0f32;
            for h in 0..n_head {
                let q = &qi[(t * n_head + h) * head_dim..(t * n_head + h + 1) * head_dim];
                acc += dot_f32(k, q).max(0.0) * (w[t * n_head + h] * w_scale);
            }
            want_s.push(acc);
        }
        if n_c > top_k {
            let mut allowed = vec![false; n_c];
            top_k_mask(row_scores, top_k, &mut allowed);
            let want_sel: Vec<u32> = (0..n_c as u32).filter(|&c| allowed[c as usize]).collect();
            if got_sel[t * top_k..(t + 1) * top_k] != want_sel[..] {
                sel_mismatch.push(t);
            }
        }
    }
    emit(close_scaled(
        &format!("{name}.scores"),
        &got_s,
        &want_s,
        TOL_MATVEC,
        format!("{n_tok} tok, {n_head} heads, {n_comp_avail} rows"),
    ));
    Ok(CheckResult {
        name: format!("{name}.topk"),
        max_abs: sel_mismatch.len() as f64,
        max_rel: 0.0,
        tol: 0.0,
        verdict: if sel_mismatch.is_empty() {
            Verdict::Pass
        } else {
            Verdict::Fail
        },
        note: if sel_mismatch.is_empty() {
            format!("selection of the GPU scores equals top_k_mask for all {n_tok} tokens")
        } else {
            format!("selection differs for tokens {sel_mismatch:?}")
        },
    })
}

/// kernels/mathf.h on the device against `backend::cpu::transcend` (glibc's values), bitwise: every
/// 4099th of the 2^32 bit patterns (NaN, inf, subnormals included) plus dense sweeps of the engine's
/// ranges (exp arguments [-110, 90], RoPE angles [0, 1.2e6], softplus [-0.999, 50]), ~1.3M inputs.
/// Both NaN counts as equal (NaN payloads are the hardware's). max_abs = number of differing outputs.
fn check_mathf(gpu: &Gpu, name: &str, which: kernels::MathFn) -> HipResult<CheckResult> {
    let sweep = |lo: f64, hi: f64, n: u32| (0..n).map(move |i| (lo + (hi - lo) * i as f64 / (n - 1) as f64) as f32);
    let mut input: Vec<f32> = (0..=u32::MAX / 4099).map(|i| f32::from_bits(i * 4099)).collect();
    input.extend(sweep(-110.0, 90.0, 100_000));
    input.extend(sweep(0.0, 1.2e6, 100_000));
    input.extend(sweep(-0.999, 50.0, 50_000));
    let n = input.len();
    let in_d = gpu.up(&input)?;
    let out = gpu.poisoned::<f32>(n)?;
    gpu.run(&kernels::test_mathf(out.ptr().0, in_d.ptr().0, n as u32, which))?;
    let got = out.to_vec::<f32>()?;
    let host = which.host();
    let mut bad = 0usize;
    let mut first = String::new();
    for (&x, &y) in input.iter().zip(&got) {
        let want = host(x);
        if want.to_bits() != y.to_bits() && !(want.is_nan() && y.is_nan()) {
            if bad == 0 {
                first = format!("; first: x {x:e} ({:#010x}) gpu {y:e} cpu {want:e}", x.to_bits());
            }
            bad += 1;
        }
    }
    Ok(CheckResult {
        name: name.to_string(),
        max_abs: bad as f64,
        max_rel: 0.0,
        tol: 0.0,
        verdict: if bad == 0 { Verdict::Pass } else { Verdict::Fail },
        note: format!("{bad} of {n} outputs differ from transcend.rs{first}"),
    })
}
