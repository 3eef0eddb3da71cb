//! The suite's device, report and input helpers: one `Gpu` (a HIP context, the project's kernel module
//! and a stream) whose launches are recorded for the coverage check; the comparisons with their
//! bitwise comparisons; random weights in every GGUF block format the kernels read; Q8_K activation planes.
//!
//! Every comparison is bitwise: the kernels compute the CPU reference's float operations in its order
//! (kernels/prelude.h, "arithmetic contract"), including the reductions, the quantizers and the
//! transcendental functions, so each output has the reference's bits (`same_bits`, which also tells
//! -0 from +0) and each quantized code is the reference's code (`same_codes`). max_abs / max_rel
//! still say how far off a failing output is.

use std::cell::RefCell;
use std::collections::BTreeSet;

use ds4_chat::backend::cpu::moe::swiglu;
use ds4_chat::backend::cpu::quant::{
    BlockQ8K, Q8_0Act, dot_f16, dot_iq2_xxs, dot_q2_k, dot_q4_k, dot_q8_0, quantize_q8_0, quantize_q8_k,
};
use ds4_chat::backend::hip::kernel_module::KernelModule;
use ds4_chat::backend::hip::kernels::{self, DevPtr, ExpertFormat, Launch, Q8Act, Q8K, Q8Proj, Q8Swiglu, QuantOut};
use ds4_chat::backend::hip::runtime::{DeviceBuffer, DeviceCopy, HipContext, HipResult, Stream};
use ds4_chat::gguf::GgmlType;
use ds4_chat::gguf::half::f32_to_f16;

pub use ds4_chat::backend::hip::selftest::{CheckResult, CheckRng, Verdict};

/// What a check returns: its result, or the device error that stopped it (a FAIL line, [`guard`]).
pub type Checked = HipResult<CheckResult>;

/// Where a group's checks report their results.
pub type Emit<'a> = &'a mut dyn FnMut(CheckResult);

/// Whether this is the emulator's rerun for another wave size (`DS4_EMU_WARP` set by
/// `wave64_emulator_passes_the_same_checks`): the checks of per-thread code (the transcendental
/// functions) and of shuffle-free kernels (the grouped GEMMs' tile classes) already ran at wave32.
pub fn wave_rerun() -> bool {
    std::env::var("DS4_EMU_WARP").is_ok_and(|w| w != "32")
}

/// The device the checks run on, with the names of the kernels launched so far.
pub struct Gpu {
    pub ctx: HipContext,
    pub kernels: KernelModule,
    pub stream: Stream,
    pub launched: RefCell<BTreeSet<&'static str>>,
}

impl Gpu {
    pub fn open() -> Result<Gpu, String> {
        let ctx = HipContext::new().map_err(|e| e.to_string())?;
        let kernels = KernelModule::load(&ctx)?;
        let stream = ctx.stream().map_err(|e| e.to_string())?;
        Ok(Gpu {
            ctx,
            kernels,
            stream,
            launched: RefCell::default(),
        })
    }

    pub fn up<T: DeviceCopy>(&self, data: &[T]) -> HipResult<DeviceBuffer> {
        self.ctx.upload(data)
    }

    /// A device buffer of `n` T's filled with a poison pattern (0xFF bytes: NaN for f32), so that
    /// unwritten outputs fail the comparison.
    pub fn poisoned<T: DeviceCopy>(&self, n: usize) -> HipResult<DeviceBuffer> {
        let mut b = self.ctx.alloc(n * std::mem::size_of::<T>())?;
        self.repoison([&mut b])?;
        Ok(b)
    }

    /// Fills `bufs` with the poison pattern again, so that a second launch must rewrite them.
    pub fn repoison<'a>(&self, bufs: impl IntoIterator<Item = &'a mut DeviceBuffer>) -> HipResult<()> {
        for b in bufs {
            let len = b.len_bytes();
            b.fill_bytes_async(0, len, 0xFF, &self.stream)?;
        }
        self.stream.synchronize()
    }

    /// The Q8_K activation planes of `blocks` on the device.
    pub fn up_q8k(&self, blocks: &[BlockQ8K]) -> HipResult<Q8kDevice> {
        let p = q8k_planes(blocks);
        Ok(Q8kDevice([self.up(&p.q)?, self.up(&p.d)?, self.up(&p.bsums)?]))
    }

    /// The CPU's Q8_0 quantization of `x` and its upload.
    pub fn up_q8_0(&self, x: &[f32]) -> HipResult<(Q8_0Act, Q8_0Device)> {
        let mut act = Q8_0Act::with_len(x.len());
        quantize_q8_0(x, &mut act);
        let dev = Q8_0Device([self.up(&act.qs)?, self.up(&act.scales)?]);
        Ok((act, dev))
    }

    pub fn run(&self, launch: &Launch) -> HipResult<()> {
        self.launched.borrow_mut().insert(launch.kernel.name);
        // SAFETY: every check sizes its buffers for the shapes it passes (documented per kernel).
        unsafe { self.kernels.launch(&self.stream, launch, true)? };
        self.stream.synchronize()
    }
}

/// Float outputs of a fast twin: max|fast − exact| ≤ FAST_TOL · max|exact| (the exact kernel's
/// products summed in another order differ by a few ulps of the largest partial sums).
pub const FAST_TOL: f64 = 1e-5;

/// Runs `check` on every case under the name `name(case)` and emits each result.
pub fn each<C: Copy>(
    gpu: &Gpu,
    rng: &mut CheckRng,
    emit: Emit,
    cases: impl IntoIterator<Item = C>,
    name: impl Fn(C) -> String,
    check: impl Fn(&Gpu, &mut CheckRng, &str, C) -> Checked,
) {
    for case in cases {
        let name = name(case);
        emit(guard(&name, || check(gpu, rng, &name, case)));
    }
}

/// Run one check; a device error or a panic (e.g. a launch builder's shape assertion) becomes a FAIL
/// line instead of ending the suite.
pub fn guard(name: &str, check: impl FnOnce() -> Checked) -> CheckResult {
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

/// Scaled comparison (the figures of `same_bits`): passes when max|got − want| ≤ tol · max|want| and nothing is NaN.
pub fn close_scaled(name: &str, got: &[f32], want: &[f32], tol: f64, note: String) -> CheckResult {
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
    CheckResult::measured(
        name,
        max_abs,
        max_rel,
        tol,
        ok,
        format!("{note}; scale max|ref| {scale:.3e}"),
    )
}

/// Bitwise comparison: passes only when every output has the reference's bits (so -0 differs from
/// +0); max_abs / max_rel still say how far off a failing output is.
pub fn same_bits(name: &str, got: &[f32], want: &[f32], note: String) -> CheckResult {
    let mut r = close_scaled(name, got, want, 0.0, note);
    let differ = got.iter().zip(want).filter(|(g, w)| g.to_bits() != w.to_bits()).count();
    let ok = got.len() == want.len() && differ == 0;
    r.verdict = if ok { Verdict::Pass } else { Verdict::Fail };
    r.note = format!("{}; {differ} of {} outputs differ in bits", r.note, want.len());
    r
}

/// [`same_bits`] of the f32s in `got` (read back from the device) against `want`.
pub fn same_bits_on(name: &str, got: &DeviceBuffer, want: &[f32], note: String) -> Checked {
    Ok(same_bits(name, &got.to_vec::<f32>()?, want, note))
}

/// Code comparison: every quantized code must be the reference's; max_abs is the largest step off.
pub fn same_codes(name: &str, got: &[i8], want: &[i8], note: String) -> CheckResult {
    let off = got.iter().zip(want).filter(|(g, w)| g != w).count();
    let max_step = got
        .iter()
        .zip(want)
        .map(|(&g, &w)| (g as i32 - w as i32).abs())
        .max()
        .unwrap_or(0);
    let ok = got.len() == want.len() && off == 0;
    let note = format!("{note}; {off} of {} codes differ (max step {max_step})", got.len());
    CheckResult::measured(
        name,
        max_step as f64,
        off as f64 / got.len().max(1) as f64,
        0.0,
        ok,
        note,
    )
}

/// Random weight rows of `n_out` × `n_in` in a GGUF block format, as file bytes. Every byte pattern
/// is a valid block except the f16 scales, which are set to finite small values.
pub fn random_weights(rng: &mut CheckRng, ty: GgmlType, n_in: usize, n_out: usize) -> Vec<u8> {
    let f16 = |v: f32| f32_to_f16(v).to_le_bytes();
    let block_bytes = ty.block_bytes() as usize;
    let mut out = vec![0u8; n_out * ty.row_bytes(n_in)];
    rng.fill_bytes(&mut out);
    for blk in out.chunks_exact_mut(block_bytes) {
        let d = (0.002 + 0.01 * (rng.next_f32() + 1.0)) * if rng.next_u64() & 1 == 1 { -1.0 } else { 1.0 };
        let dmin = 0.004 * (rng.next_f32() + 1.0);
        match ty {
            GgmlType::F16 => blk.copy_from_slice(&f16(rng.next_f32())),
            GgmlType::Q8_0 | GgmlType::Iq2Xxs => blk[0..2].copy_from_slice(&f16(d)),
            GgmlType::Q2K => {
                blk[80..82].copy_from_slice(&f16(d.abs()));
                blk[82..84].copy_from_slice(&f16(dmin));
            }
            GgmlType::Q4K => {
                blk[0..2].copy_from_slice(&f16(d.abs()));
                blk[2..4].copy_from_slice(&f16(dmin));
            }
            t => panic!("random_weights: no kernel reads {t} weights"),
        }
    }
    out
}

/// Elements per Q8_K activation block (the expert kernels' activation format).
pub fn q8k_block() -> usize {
    GgmlType::Q8K.block_elems() as usize
}

/// Elements per Q8_0 activation block (the dense matvecs' activation format).
pub fn q8_0_block() -> usize {
    GgmlType::Q8_0.block_elems() as usize
}

pub fn expert_dot(fmt: ExpertFormat, row: &[u8], x: &[BlockQ8K]) -> f32 {
    match fmt {
        ExpertFormat::Iq2Xxs => dot_iq2_xxs(row, x),
        ExpertFormat::Q2K => dot_q2_k(row, x),
        ExpertFormat::Q4K => dot_q4_k(row, x),
    }
}

pub fn fmt_name(fmt: ExpertFormat) -> String {
    fmt.ggml_type().name().to_lowercase()
}

/// Q8_K activation planes for the GPU: codes, scales, block sums (`kernels::Q8K` layout).
pub struct Q8kPlanes {
    pub q: Vec<i8>,
    pub d: Vec<f32>,
    pub bsums: Vec<i16>,
}

/// Q8_K activation planes on the device (codes, scales, 16-element sums), from [`Gpu::up_q8k`].
pub struct Q8kDevice([DeviceBuffer; 3]);

impl Q8kDevice {
    /// The planes as the launch builders take them.
    pub fn planes(&self) -> Q8K {
        let [q, d, bsums] = &self.0;
        Q8K {
            q: q.ptr().0,
            d: d.ptr().0,
            bsums: bsums.ptr().0,
        }
    }
}

/// Q8_0 activations on the device (codes, scales), from [`Gpu::up_q8_0`].
pub struct Q8_0Device([DeviceBuffer; 2]);

impl Q8_0Device {
    /// The activations as the launch builders take them.
    pub fn act(&self) -> Q8Act {
        let [q, d] = &self.0;
        Q8Act {
            q: q.ptr().0,
            d: d.ptr().0,
        }
    }
}

/// The CPU's Q8_K quantization of `x` (a whole number of blocks).
pub fn q8k_blocks(x: &[f32]) -> Vec<BlockQ8K> {
    let mut b = vec![BlockQ8K::default(); x.len() / q8k_block()];
    quantize_q8_k(x, &mut b);
    b
}

pub fn q8k_planes(blocks: &[BlockQ8K]) -> Q8kPlanes {
    Q8kPlanes {
        q: blocks.iter().flat_map(|b| b.qs).collect(),
        d: blocks.iter().map(|b| b.d).collect(),
        bsums: blocks.iter().flat_map(|b| b.bsums).collect(),
    }
}

/// A check of outputs that must agree item for item: `differ` items differ (reported as max_abs);
/// it passes when none does and `ok`, the check's other conditions, holds.
pub fn count_differ(name: &str, differ: usize, ok: bool, note: String) -> CheckResult {
    CheckResult::measured(name, differ as f64, 0.0, 0.0, differ == 0 && ok, note)
}

pub fn random_vec(rng: &mut CheckRng, n: usize, amp: f32) -> Vec<f32> {
    (0..n).map(|_| amp * rng.next_f32()).collect()
}

/// Output bytes read back as the f32s they hold.
pub fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// The bytes of each output buffer.
pub type Outputs = Vec<Vec<u8>>;

/// Runs `exact`, reads `outs`, poisons them, runs `twin` (which writes the same outputs) and reads
/// them again: (exact outputs, twin outputs).
pub fn exact_then_twin(
    gpu: &Gpu,
    exact: &Launch,
    twin: &Launch,
    outs: &mut [&mut DeviceBuffer],
) -> HipResult<(Outputs, Outputs)> {
    let read = |outs: &[&mut DeviceBuffer]| outs.iter().map(|b| b.to_vec::<u8>()).collect::<HipResult<Vec<_>>>();
    gpu.run(exact)?;
    let a = read(outs)?;
    gpu.repoison(outs.iter_mut().map(|b| &mut **b))?;
    gpu.run(twin)?;
    Ok((a, read(outs)?))
}

/// A sampling buffer (`kernels::SAMPLE_BUFFER_WORDS` words) as a decode session holds it: the
/// fast launches' counter word zero, every other word poisoned.
pub fn sample_buffer(gpu: &Gpu) -> HipResult<DeviceBuffer> {
    let mut words = vec![0xdead_beefu32; kernels::SAMPLE_BUFFER_WORDS];
    words[kernels::SAMPLE_COUNTER_WORD] = 0;
    gpu.up(&words)
}

/// The fast twin of `exact` (which must have one for these shapes).
pub fn twin_of(exact: &Launch) -> Launch {
    kernels::fast_twin(exact).unwrap_or_else(|| panic!("{} has no fast twin here", exact.kernel.name))
}

/// [`exact_then_twin`] with the exact launch's fast twin (`kernels::fast_twin`).
pub fn exact_and_fast(gpu: &Gpu, exact: &Launch, outs: &mut [&mut DeviceBuffer]) -> HipResult<(Outputs, Outputs)> {
    exact_then_twin(gpu, exact, &twin_of(exact), outs)
}

/// Runs `exact` and its fast twin into `outs` and compares every output (one buffer's after the
/// other) within FAST_TOL.
pub fn fast_within_tol(gpu: &Gpu, name: &str, exact: &Launch, outs: &mut [&mut DeviceBuffer], note: String) -> Checked {
    fast_within(gpu, name, exact, outs, FAST_TOL, note)
}

/// [`fast_within_tol`] with a kernel's own justified bound `tol` in place of [`FAST_TOL`].
pub fn fast_within(
    gpu: &Gpu,
    name: &str,
    exact: &Launch,
    outs: &mut [&mut DeviceBuffer],
    tol: f64,
    note: String,
) -> Checked {
    let (a, f) = exact_and_fast(gpu, exact, outs)?;
    let (fast, exact): (Vec<f32>, Vec<f32>) = (
        f.iter().flat_map(|b| f32s(b)).collect(),
        a.iter().flat_map(|b| f32s(b)).collect(),
    );
    Ok(close_scaled(name, &fast, &exact, tol, note))
}

/// A Q8_0 projection of random weights and activations on the device (grouped when
/// `rows_per_group < n_out`: the activation rows are then `groups * n_in` apart), with its CPU dots.
pub struct Q8ProjCase {
    /// The launch builders' operands; `proj.y` is [`Q8ProjCase::y`].
    pub proj: Q8Proj,
    /// The output, poisoned: `n_tok * n_out` f32.
    pub y: DeviceBuffer,
    w: Vec<u8>,
    act: Q8_0Act,
    n_tok: usize,
    _operands: (DeviceBuffer, Q8_0Device),
}

impl Q8ProjCase {
    pub fn new(
        gpu: &Gpu,
        rng: &mut CheckRng,
        (n_in, n_out, rows_per_group, n_tok): (usize, usize, usize, usize),
    ) -> HipResult<Q8ProjCase> {
        let x_stride = n_out.div_ceil(rows_per_group) * n_in;
        let w = random_weights(rng, GgmlType::Q8_0, n_in, n_out);
        let x = random_vec(rng, n_tok * x_stride, 2.0);
        let (act, x_d) = gpu.up_q8_0(&x)?;
        let w_d = gpu.up(&w)?;
        let y = gpu.poisoned::<f32>(n_tok * n_out)?;
        let proj = Q8Proj {
            rows_per_group: rows_per_group as u32,
            x_stride: x_stride as u32,
            ..Q8Proj::plain(y.ptr().0, w_d.ptr().0, x_d.act(), n_in as u32, n_out as u32)
        };
        Ok(Q8ProjCase {
            proj,
            y,
            w,
            act,
            n_tok,
            _operands: (w_d, x_d),
        })
    }

    /// The CPU reference: y[t][r] = W[r] · (token t's activation row of r's group).
    pub fn want(&self) -> Vec<f32> {
        let p = &self.proj;
        let (n_in, n_out, rpg, stride) = (
            p.n_in as usize,
            p.n_out as usize,
            p.rows_per_group as usize,
            p.x_stride as usize,
        );
        let (rb, qb) = (GgmlType::Q8_0.row_bytes(n_in), q8_0_block());
        (0..self.n_tok * n_out)
            .map(|i| {
                let (t, r) = (i / n_out, i % n_out);
                let off = t * stride + (r / rpg) * n_in;
                dot_q8_0(
                    &self.w[r * rb..(r + 1) * rb],
                    &self.act.qs[off..off + n_in],
                    &self.act.scales[off / qb..(off + n_in) / qb],
                )
            })
            .collect()
    }
}

/// The Q8_0 SwiGLU projection (gate and up rows of random weights, random activations) on the
/// device, with its CPU reference.
pub struct Q8SwigluCase {
    /// The launch builders' operands; `sw.mid` is [`Q8SwigluCase::mid`].
    pub sw: Q8Swiglu,
    /// The output, poisoned: `n_tok * n_ff` f32.
    pub mid: DeviceBuffer,
    wg: Vec<u8>,
    wu: Vec<u8>,
    act: Q8_0Act,
    n_tok: usize,
    _operands: (DeviceBuffer, DeviceBuffer, Q8_0Device),
}

impl Q8SwigluCase {
    pub fn new(
        gpu: &Gpu,
        rng: &mut CheckRng,
        (n_in, n_ff, n_tok): (usize, usize, usize),
        limit: f32,
    ) -> HipResult<Q8SwigluCase> {
        let wg = random_weights(rng, GgmlType::Q8_0, n_in, n_ff);
        let wu = random_weights(rng, GgmlType::Q8_0, n_in, n_ff);
        let x = random_vec(rng, n_tok * n_in, 2.0);
        let (act, x_d) = gpu.up_q8_0(&x)?;
        let (g_d, u_d) = (gpu.up(&wg)?, gpu.up(&wu)?);
        let mid = gpu.poisoned::<f32>(n_tok * n_ff)?;
        let sw = Q8Swiglu {
            mid: mid.ptr().0,
            wg: g_d.ptr().0,
            wu: u_d.ptr().0,
            x: x_d.act(),
            n_in: n_in as u32,
            n_ff: n_ff as u32,
            limit,
        };
        Ok(Q8SwigluCase {
            sw,
            mid,
            wg,
            wu,
            act,
            n_tok,
            _operands: (g_d, u_d, x_d),
        })
    }

    /// The CPU reference: swiglu(Wg[r] · x_t, Wu[r] · x_t, limit).
    pub fn want(&self) -> Vec<f32> {
        let (n_in, n_ff) = (self.sw.n_in as usize, self.sw.n_ff as usize);
        let (rb, qb) = (GgmlType::Q8_0.row_bytes(n_in), q8_0_block());
        let mut want = vec![0f32; self.n_tok * n_ff];
        for t in 0..self.n_tok {
            let (q, d) = (
                &self.act.qs[t * n_in..(t + 1) * n_in],
                &self.act.scales[t * n_in / qb..(t + 1) * n_in / qb],
            );
            for r in 0..n_ff {
                let g = dot_q8_0(&self.wg[r * rb..(r + 1) * rb], q, d);
                let u = dot_q8_0(&self.wu[r * rb..(r + 1) * rb], q, d);
                want[t * n_ff + r] = swiglu(g, u, self.sw.limit);
            }
        }
        want
    }
}

/// A launch builder of an F16 projection: (y, w, x, n_in, n_out, x_stride, n_tok).
pub type F16Builder = fn(DevPtr, DevPtr, DevPtr, u32, u32, u32, u32) -> Launch;

/// F16 projections of one activation set: `n_weights` random weight matrices, activation rows
/// `x_stride` apart, and one poisoned output per matrix, with their CPU dots.
pub struct F16ProjCase {
    pub ws: Vec<DeviceBuffer>,
    pub x: DeviceBuffer,
    pub ys: Vec<DeviceBuffer>,
    pub shape: (u32, u32, u32),
    pub x_stride: u32,
    w_host: Vec<Vec<u8>>,
    x_host: Vec<f32>,
}

impl F16ProjCase {
    pub fn new(
        gpu: &Gpu,
        rng: &mut CheckRng,
        n_weights: usize,
        (n_in, n_out, n_tok): (usize, usize, usize),
        x_stride: usize,
    ) -> HipResult<F16ProjCase> {
        let w_host: Vec<Vec<u8>> = (0..n_weights)
            .map(|_| random_weights(rng, GgmlType::F16, n_in, n_out))
            .collect();
        let x_host = random_vec(rng, n_tok * x_stride, 2.0);
        let ws = w_host.iter().map(|w| gpu.up(w)).collect::<HipResult<Vec<_>>>()?;
        let x = gpu.up(&x_host)?;
        let ys = (0..n_weights)
            .map(|_| gpu.poisoned::<f32>(n_tok * n_out))
            .collect::<HipResult<Vec<_>>>()?;
        Ok(F16ProjCase {
            ws,
            x,
            ys,
            shape: (n_in as u32, n_out as u32, n_tok as u32),
            x_stride: x_stride as u32,
            w_host,
            x_host,
        })
    }

    /// The CPU reference, one matrix's outputs after the other: y[t][r] = W[r] · x_t.
    pub fn want(&self) -> Vec<f32> {
        let (n_in, n_out, n_tok) = (self.shape.0 as usize, self.shape.1 as usize, self.shape.2 as usize);
        let (rb, stride) = (GgmlType::F16.row_bytes(n_in), self.x_stride as usize);
        let mut want = Vec::with_capacity(self.w_host.len() * n_tok * n_out);
        for w in &self.w_host {
            for t in 0..n_tok {
                for r in 0..n_out {
                    want.push(dot_f16(
                        &w[r * rb..(r + 1) * rb],
                        &self.x_host[t * stride..t * stride + n_in],
                    ));
                }
            }
        }
        want
    }

    /// The first matrix's projection by `build` (`kernels::matvec_f16`, `gemm_f16` or a twin's
    /// builder) into the first output.
    pub fn single(&self, build: F16Builder) -> Launch {
        let (n_in, n_out, n_tok) = self.shape;
        let [y, w, x] = [&self.ys[0], &self.ws[0], &self.x].map(|b| b.ptr().0);
        build(y, w, x, n_in, n_out, self.x_stride, n_tok)
    }

    /// The pair projection (`kernels::matvec_f16_pair`) of the first two matrices.
    pub fn pair(&self) -> Launch {
        let (n_in, n_out, n_tok) = self.shape;
        let [y0, y1, w0, w1, x] = [&self.ys[0], &self.ys[1], &self.ws[0], &self.ws[1], &self.x].map(|b| b.ptr().0);
        kernels::matvec_f16_pair(y0, y1, w0, w1, x, n_in, n_out, self.x_stride, n_tok)
    }

    /// Every output, one matrix's after the other.
    pub fn got(&self) -> HipResult<Vec<f32>> {
        let mut got = Vec::new();
        for y in &self.ys {
            got.extend(y.to_vec::<f32>()?);
        }
        Ok(got)
    }
}

/// Poisoned outputs of a norm kernel that writes both activation quantizations, for `n` elements:
/// the f32 output, its Q8_0 codes and scales, its Q8_K codes, scales and 16-element sums.
pub struct QuantOutBuffers(pub [DeviceBuffer; 6]);

impl QuantOutBuffers {
    pub fn poisoned(gpu: &Gpu, n: usize) -> HipResult<QuantOutBuffers> {
        Ok(QuantOutBuffers([
            gpu.poisoned::<f32>(n)?,
            gpu.poisoned::<i8>(n)?,
            gpu.poisoned::<f32>(n / q8_0_block())?,
            gpu.poisoned::<i8>(n)?,
            gpu.poisoned::<f32>(n / q8k_block())?,
            gpu.poisoned::<i16>(n / 16)?,
        ]))
    }

    /// The outputs as the launch builders take them.
    pub fn planes(&self) -> QuantOut {
        let [out, q0_q, q0_d, qk_q, qk_d, qk_bs] = &self.0;
        QuantOut {
            out: out.ptr().0,
            q8_0_q: q0_q.ptr().0,
            q8_0_d: q0_d.ptr().0,
            q8_k_q: qk_q.ptr().0,
            q8_k_d: qk_d.ptr().0,
            q8_k_bs: qk_bs.ptr().0,
        }
    }
}
