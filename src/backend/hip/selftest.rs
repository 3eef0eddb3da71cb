//! `ds4-chat selftest --backend hip`: what a user runs to check their GPU. The HIP runtime's smoke
//! checks (copies, memset, pinned and mapped host memory, events, module launch, graph capture and
//! replay, a capture forked to a second stream and joined), the project's kernel module loaded and one kernel launched, and a model's weights placed
//! on the device and read back. The kernels' arithmetic against the CPU reference is the test suite
//! tests/hip_kernels; `cli::selftest::forward` compares the whole forward pass on a model.
//!
//! Owns the check logic and its report values. Must not print or parse arguments (`cli/selftest.rs`
//! does).

use std::time::Instant;

use super::kernel_module::KernelModule;
use super::kernels;
use super::runtime::{
    CaptureMode, DevicePtr, HipContext, HipResult, HostRegistration, KernelArgs, LaunchDims, PinnedBuffer,
};

/// Outcome of one check.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    Pass,
    Fail,
    /// Not run, with the reason (e.g. no kernel image for this device).
    Skip(String),
}

/// One line of the selftest report.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckResult {
    pub name: String,
    pub max_abs: f64,
    pub max_rel: f64,
    /// The bound `max_abs` and `max_rel` were held to (0 for exact checks).
    pub tol: f64,
    pub verdict: Verdict,
    /// Extra facts (bandwidth, sizes, the error that stopped the check).
    pub note: String,
}

impl CheckResult {
    /// A measured check: how far off it was, the bound it was held to, and whether it passed.
    pub fn measured(name: &str, max_abs: f64, max_rel: f64, tol: f64, ok: bool, note: String) -> CheckResult {
        CheckResult {
            name: name.to_string(),
            max_abs,
            max_rel,
            tol,
            verdict: if ok { Verdict::Pass } else { Verdict::Fail },
            note,
        }
    }

    fn skip(name: &str, why: String) -> CheckResult {
        CheckResult {
            name: name.to_string(),
            max_abs: 0.0,
            max_rel: 0.0,
            tol: 0.0,
            verdict: Verdict::Skip(why),
            note: String::new(),
        }
    }

    pub fn error(name: &str, err: impl std::fmt::Display) -> CheckResult {
        CheckResult {
            name: name.to_string(),
            max_abs: f64::NAN,
            max_rel: f64::NAN,
            tol: 0.0,
            verdict: Verdict::Fail,
            note: err.to_string(),
        }
    }

    /// Exact comparison of bytes: max_abs counts differing bytes.
    pub fn exact(name: &str, got: &[u8], want: &[u8], note: String) -> CheckResult {
        let diff = if got.len() != want.len() {
            got.len().abs_diff(want.len())
        } else {
            got.iter().zip(want).filter(|(a, b)| a != b).count()
        };
        let note = if diff == 0 {
            note
        } else {
            format!("{diff} bytes differ; {note}")
        };
        CheckResult::measured(name, diff as f64, 0.0, 0.0, diff == 0, note)
    }

    /// Float comparison: passes when every element is within `tol` absolutely or relatively.
    pub fn close(name: &str, got: &[f32], want: &[f32], tol: f64, note: String) -> CheckResult {
        let (max_abs, max_rel, ok) = compare(got, want, tol);
        CheckResult::measured(name, max_abs, max_rel, tol, ok, note)
    }
}

/// The report line: status, name, how far off against the bound, notes (or why it was skipped).
impl std::fmt::Display for CheckResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (status, detail) = match &self.verdict {
            Verdict::Pass => ("PASS", &self.note),
            Verdict::Fail => ("FAIL", &self.note),
            Verdict::Skip(why) => ("SKIP", why),
        };
        write!(
            f,
            "{status} {:<40} max_abs {:<10.3e} max_rel {:<10.3e} tol {:<8.1e} {detail}",
            self.name, self.max_abs, self.max_rel, self.tol
        )
    }
}

/// (max abs error, max rel error, all within tolerance). An element passes when
/// |got − want| ≤ tol · max(1, |want|); NaN never passes; a length mismatch fails.
pub fn compare(got: &[f32], want: &[f32], tol: f64) -> (f64, f64, bool) {
    if got.len() != want.len() {
        return (f64::INFINITY, f64::INFINITY, false);
    }
    let (mut max_abs, mut max_rel, mut ok) = (0f64, 0f64, true);
    for (&g, &w) in got.iter().zip(want) {
        let (g, w) = (g as f64, w as f64);
        let abs = (g - w).abs();
        if !abs.is_finite() {
            return (f64::INFINITY, f64::INFINITY, false);
        }
        max_abs = max_abs.max(abs);
        max_rel = max_rel.max(abs / w.abs().max(f64::MIN_POSITIVE));
        ok &= abs <= tol * w.abs().max(1.0);
    }
    (max_abs, max_rel, ok)
}

/// Deterministic random numbers for check inputs (SplitMix64; quality is ample for test data).
pub struct CheckRng(u64);

impl CheckRng {
    pub fn new(seed: u64) -> CheckRng {
        CheckRng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn fill_bytes(&mut self, out: &mut [u8]) {
        for chunk in out.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }

    /// Uniform in [-1, 1).
    pub fn next_f32(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// Uniform integer in [lo, hi].
    pub fn int_in(&mut self, lo: i64, hi: i64) -> i64 {
        lo + (self.next_u64() % (hi - lo + 1) as u64) as i64
    }
}

/// What to run.
#[derive(Clone, Debug)]
pub struct CheckOptions {
    pub seed: u64,
    /// A model whose weights are uploaded and read back (device residency check).
    pub model: Option<std::sync::Arc<crate::model::Model>>,
}

/// Name stem of the shim's own test kernels (tests/hip-on-cuda/selftest_kernels.hip).
pub const SELFTEST_KERNEL_STEM: &str = "ds4_selftest";

/// Run every check, calling `report` as each finishes (so a hang or crash shows how far it got).
pub fn run_all(ctx: &HipContext, opts: &CheckOptions, report: &mut dyn FnMut(&CheckResult)) -> Vec<CheckResult> {
    let mut results = Vec::new();
    let mut emit = |r: CheckResult, results: &mut Vec<CheckResult>| {
        report(&r);
        results.push(r);
    };
    let mut rng = CheckRng::new(opts.seed);
    for bytes in [1usize, 4097, (64 << 20) + 3] {
        emit(check_roundtrip(ctx, bytes, &mut rng), &mut results);
    }
    emit(check_memset(ctx, &mut rng), &mut results);
    emit(check_d2d_and_events(ctx, &mut rng), &mut results);
    emit(check_pinned(ctx, &mut rng), &mut results);
    for r in check_test_kernels(ctx, &mut rng) {
        emit(r, &mut results);
    }
    match KernelModule::load(ctx) {
        Ok(module) => {
            let r = CheckResult {
                name: "kernel.module_load".into(),
                max_abs: 0.0,
                max_rel: 0.0,
                tol: 0.0,
                verdict: Verdict::Pass,
                note: format!(
                    "{} kernels for {} ({})",
                    kernels::ALL_KERNELS.len(),
                    module.target,
                    module.source
                ),
            };
            emit(r, &mut results);
            emit(check_fill(ctx, &module, &mut rng), &mut results);
            emit(check_fork_join(ctx, &module, &mut rng), &mut results);
        }
        Err(e) => emit(CheckResult::error("kernel.module_load", e), &mut results),
    }
    if let Some(model) = &opts.model {
        emit(check_weight_upload(ctx, model, false), &mut results);
        emit(check_weight_upload(ctx, model, true), &mut results);
    }
    results
}

fn wrap(name: &str, f: impl FnOnce() -> HipResult<CheckResult>) -> CheckResult {
    f().unwrap_or_else(|e| CheckResult::error(name, e))
}

/// One launch of the project's module: `ds4_fill_f32` over an odd length, every element checked.
pub fn check_fill(ctx: &HipContext, module: &KernelModule, rng: &mut CheckRng) -> CheckResult {
    let name = "kernel.fill_f32";
    wrap(name, || {
        let n = 1_000_003usize;
        let v = rng.next_f32() * 100.0;
        let buf = ctx.alloc(n * 4)?;
        let stream = ctx.stream()?;
        // SAFETY: the buffer holds n floats, the length the launch is given.
        unsafe { module.launch(&stream, &kernels::fill_f32(buf.ptr().0, n as u64, v), true)? };
        stream.synchronize()?;
        let got = buf.to_vec::<f32>()?;
        Ok(CheckResult::close(name, &got, &vec![v; n], 0.0, format!("n={n}")))
    })
}

/// The side lanes' capture (src/backend/hip/lanes.rs): a graph captured on one stream with a
/// branch forked to a second stream by an event and joined back by another. Main fills `a`; the
/// branch copies `a` to `b` (after the fill, by the fork) while main fills `c`; main then copies
/// `b` to `d` (after the copy, by the join). Replayed once, after `d` is zeroed: `d` holds the
/// fill's value only when both edges held, and `c` the other fill's.
pub fn check_fork_join(ctx: &HipContext, module: &KernelModule, rng: &mut CheckRng) -> CheckResult {
    let name = "graph.fork_join";
    wrap(name, || {
        let n = 262_147usize;
        let (va, vc) = (rng.next_f32() * 100.0 + 1.0, rng.next_f32() * 100.0 - 200.0);
        let bytes = n * 4;
        let (a, mut b, c, mut d) = (
            ctx.alloc(bytes)?,
            ctx.alloc(bytes)?,
            ctx.alloc(bytes)?,
            ctx.alloc(bytes)?,
        );
        let (main, side) = (ctx.stream()?, ctx.stream()?);
        let (fork, join) = (ctx.event(false)?, ctx.event(false)?);
        main.begin_capture(CaptureMode::ThreadLocal)?;
        let captured = (|| {
            // SAFETY: each buffer holds n floats, the length the launches are given.
            unsafe { module.launch(&main, &kernels::fill_f32(a.ptr().0, n as u64, va), true)? };
            fork.record(&main)?;
            side.wait_event(&fork)?;
            b.copy_from_device_async(0, &a, 0, bytes, &side)?;
            // SAFETY: as above.
            unsafe { module.launch(&main, &kernels::fill_f32(c.ptr().0, n as u64, vc), true)? };
            join.record(&side)?;
            main.wait_event(&join)?;
            d.copy_from_device_async(0, &b, 0, bytes, &main)
        })();
        let graph = main.end_capture();
        captured?;
        let exec = graph?.instantiate()?;
        d.fill_bytes_async(0, bytes, 0, &main)?;
        exec.launch(&main)?;
        main.synchronize()?;
        let (got_c, got_d) = (c.to_vec::<f32>()?, d.to_vec::<f32>()?);
        let mut got = got_d;
        got.extend_from_slice(&got_c);
        let mut want = vec![va; n];
        want.extend(std::iter::repeat_n(vc, n));
        Ok(CheckResult::close(
            name,
            &got,
            &want,
            0.0,
            format!("n={n}: fill, fork, copy beside a fill, join, copy"),
        ))
    })
}

fn check_roundtrip(ctx: &HipContext, bytes: usize, rng: &mut CheckRng) -> CheckResult {
    let name = format!("runtime.copy_roundtrip[{bytes}B]");
    wrap(&name, || {
        let mut host = vec![0u8; bytes];
        rng.fill_bytes(&mut host);
        let t0 = Instant::now();
        let dev = ctx.upload(&host)?;
        let mut back = vec![0u8; bytes];
        dev.copy_to_host(0, &mut back)?;
        let secs = t0.elapsed().as_secs_f64();
        Ok(CheckResult::exact(
            &name,
            &back,
            &host,
            format!(
                "H2D+D2H {:.2} GB/s (pageable, wall clock)",
                2.0 * bytes as f64 / secs / 1e9
            ),
        ))
    })
}

fn check_memset(ctx: &HipContext, rng: &mut CheckRng) -> CheckResult {
    let name = "runtime.memset_async";
    wrap(name, || {
        let bytes = 1_000_003usize;
        let mut host = vec![0u8; bytes];
        rng.fill_bytes(&mut host);
        let mut dev = ctx.upload(&host)?;
        let stream = ctx.stream()?;
        // Fill an odd interior range; the bytes around it must keep their random values.
        let (off, len) = (1234usize, 777_777usize);
        dev.fill_bytes_async(off, len, 0xA5, &stream)?;
        stream.synchronize()?;
        let back = dev.to_vec::<u8>()?;
        host[off..off + len].fill(0xA5);
        Ok(CheckResult::exact(
            name,
            &back,
            &host,
            format!("{len} bytes at offset {off}"),
        ))
    })
}

fn check_d2d_and_events(ctx: &HipContext, rng: &mut CheckRng) -> CheckResult {
    let name = "runtime.d2d_copy_events";
    wrap(name, || {
        let bytes = 256usize << 20;
        let mut host = vec![0u8; bytes];
        rng.fill_bytes(&mut host);
        let src = ctx.upload(&host)?;
        let mut dst = ctx.alloc(bytes)?;
        let stream = ctx.stream()?;
        let (start, stop) = (ctx.event(true)?, ctx.event(true)?);
        // Warm-up, then a timed copy.
        dst.copy_from_device_async(0, &src, 0, bytes, &stream)?;
        dst.fill_bytes_async(0, bytes, 0, &stream)?;
        start.record(&stream)?;
        dst.copy_from_device_async(0, &src, 0, bytes, &stream)?;
        stop.record(&stream)?;
        stop.synchronize()?;
        let ms = stop.elapsed_ms_since(&start)?;
        let back = dst.to_vec::<u8>()?;
        let mut r = CheckResult::exact(
            name,
            &back,
            &host,
            format!(
                "256 MiB D2D in {ms:.3} ms = {:.0} GB/s (read+write)",
                2.0 * bytes as f64 / (ms as f64 * 1e6)
            ),
        );
        if !(ms > 0.0 && ms.is_finite()) {
            r.verdict = Verdict::Fail;
            r.note = format!("event elapsed time {ms} ms is not positive");
        }
        Ok(r)
    })
}

fn check_pinned(ctx: &HipContext, rng: &mut CheckRng) -> CheckResult {
    let name = "runtime.pinned_async_copies";
    wrap(name, || {
        let bytes = (16usize << 20) + 5;
        let mut up = PinnedBuffer::new(ctx, bytes)?;
        rng.fill_bytes(up.as_mut_slice());
        let mut down = PinnedBuffer::new(ctx, bytes)?;
        let mut dev = ctx.alloc(bytes)?;
        let stream = ctx.stream()?;
        let (start, stop) = (ctx.event(true)?, ctx.event(true)?);
        start.record(&stream)?;
        dev.copy_from_pinned_async(0, &up, bytes, &stream)?;
        dev.copy_to_pinned_async(0, &mut down, bytes, &stream)?;
        stop.record(&stream)?;
        stream.synchronize()?;
        let ms = stop.elapsed_ms_since(&start)?;
        Ok(CheckResult::exact(
            name,
            down.as_slice(),
            up.as_slice(),
            format!("pinned H2D+D2H {:.1} GB/s", 2.0 * bytes as f64 / (ms as f64 * 1e6)),
        ))
    })
}

/// Launch, graph capture/replay and mapped host memory, with the shim's own tiny kernels:
/// `ds4_test_axpy(float* y, const float* x, float a, int n)`: y[i] += a·x[i].
fn check_test_kernels(ctx: &HipContext, rng: &mut CheckRng) -> Vec<CheckResult> {
    let names = ["kernel.launch_axpy", "graph.capture_replay", "host.mapped_read"];
    let image = match ctx.kernel_image_override(SELFTEST_KERNEL_STEM) {
        Ok(Some((_, bytes))) => bytes,
        Ok(None) => {
            let why = format!(
                "no {SELFTEST_KERNEL_STEM} image for this device (set {} to a folder with {SELFTEST_KERNEL_STEM}.sm_XY.cubin)",
                super::runtime::KERNEL_DIR_ENV
            );
            return names.iter().map(|n| CheckResult::skip(n, why.clone())).collect();
        }
        Err(e) => return names.iter().map(|n| CheckResult::error(n, &e)).collect(),
    };
    let module = match ctx.load_module(&image) {
        Ok(m) => m,
        Err(e) => return names.iter().map(|n| CheckResult::error(n, e.clone())).collect(),
    };
    let axpy = match module.function("ds4_test_axpy") {
        Ok(f) => f,
        Err(e) => return names.iter().map(|n| CheckResult::error(n, e.clone())).collect(),
    };
    // Small integers and a = 0.5: every sum below is exact in f32, so the checks are exact (tol 0).
    let n = 100_003usize;
    let x: Vec<f32> = (0..n).map(|_| rng.int_in(-64, 64) as f32).collect();
    let y0: Vec<f32> = (0..n).map(|_| rng.int_in(-1000, 1000) as f32).collect();
    let a = 0.5f32;
    let dims = LaunchDims::linear((n as u32).div_ceil(256), 256);
    // ds4_test_axpy(y, x, a, n): y += a * x.
    let axpy_args = |y: DevicePtr, x: DevicePtr| {
        let mut args = KernelArgs::new();
        args.push(y).push(x).push(a).push(n as i32);
        args
    };
    let mut out = Vec::new();

    out.push(wrap(names[0], || {
        let x_dev = ctx.upload(&x)?;
        let y_dev = ctx.upload(&y0)?;
        let stream = ctx.stream()?;
        let mut args = axpy_args(y_dev.ptr(), x_dev.ptr());
        // SAFETY: argument list matches ds4_test_axpy; buffers outlive the synchronize below.
        unsafe { axpy.launch(&stream, dims, &mut args)? };
        stream.synchronize()?;
        let got = y_dev.to_vec::<f32>()?;
        let want: Vec<f32> = y0.iter().zip(&x).map(|(y, x)| y + a * x).collect();
        Ok(CheckResult::close(names[0], &got, &want, 0.0, format!("n={n}")))
    }));

    out.push(wrap(names[1], || {
        let x_dev = ctx.upload(&x)?;
        let y_dev = ctx.upload(&y0)?;
        let stream = ctx.stream()?;
        let mut args = axpy_args(y_dev.ptr(), x_dev.ptr());
        stream.begin_capture(CaptureMode::ThreadLocal)?;
        for _ in 0..3 {
            // SAFETY: as above; captured launches run only at replay, before the synchronize.
            let launched = unsafe { axpy.launch(&stream, dims, &mut args) };
            if let Err(e) = launched {
                let _ = stream.end_capture();
                return Err(e);
            }
        }
        let graph = stream.end_capture()?;
        let exec = graph.instantiate()?;
        let replays = 5;
        let (start, stop) = (ctx.event(true)?, ctx.event(true)?);
        start.record(&stream)?;
        for _ in 0..replays {
            exec.launch(&stream)?;
        }
        stop.record(&stream)?;
        stream.synchronize()?;
        let ms = stop.elapsed_ms_since(&start)?;
        let got = y_dev.to_vec::<f32>()?;
        let k = (3 * replays) as f32;
        let want: Vec<f32> = y0.iter().zip(&x).map(|(y, x)| y + k * a * x).collect();
        Ok(CheckResult::close(
            names[1],
            &got,
            &want,
            0.0,
            format!(
                "3 launches captured, {replays} replays, {:.1} us/replay",
                ms as f64 * 1e3 / replays as f64
            ),
        ))
    }));

    out.push(wrap(names[2], || {
        // The kernel reads x straight from registered host memory through its device address.
        let mut host_x: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
        let reg = HostRegistration::new(ctx, &mut host_x, true)?;
        let x_mapped = reg.device_ptr()?;
        let y_dev = ctx.upload(&y0)?;
        let stream = ctx.stream()?;
        let mut args = axpy_args(y_dev.ptr(), x_mapped);
        // SAFETY: argument list matches; the registration outlives the synchronize.
        unsafe { axpy.launch(&stream, dims, &mut args)? };
        stream.synchronize()?;
        let got = y_dev.to_vec::<f32>()?;
        drop(reg);
        let want: Vec<f32> = y0.iter().zip(&x).map(|(y, x)| y + a * x).collect();
        Ok(CheckResult::close(
            names[2],
            &got,
            &want,
            0.0,
            format!("n={n}, x in mapped host memory"),
        ))
    }));
    out
}

/// Upload a model's tensor data through the pinned staging path and read every bound tensor back,
/// byte-exact.
fn check_weight_upload(ctx: &HipContext, model: &crate::model::Model, mapped: bool) -> CheckResult {
    let name = if mapped {
        "weights.map_readback"
    } else {
        "weights.upload_readback"
    };
    let placed = if mapped {
        super::weights::DeviceWeights::map(ctx, model)
    } else {
        super::weights::DeviceWeights::upload(ctx, model, &mut |_, _| {})
    };
    let w = match placed {
        Ok(w) => w,
        Err(e) => return CheckResult::error(name, e),
    };
    let mut differing = 0usize;
    let mut tensors = 0usize;
    for (_, t) in model.grouped_tensors() {
        let mut back = vec![0u8; t.nbytes as usize];
        if let Err(e) = w.read_back(ctx, t, &mut back) {
            return CheckResult::error(name, e);
        }
        tensors += 1;
        differing += back.iter().zip(model.data(t)).filter(|(a, b)| a != b).count();
    }
    let ok = differing == 0 && tensors > 0;
    CheckResult::measured(
        name,
        differing as f64,
        0.0,
        0.0,
        ok,
        format!(
            "{tensors} tensors, {:.1} MiB placed in {:.3} s = {:.2} GB/s ({}); {differing} bytes differ",
            w.len_bytes() as f64 / (1u64 << 20) as f64,
            w.upload_seconds,
            w.len_bytes() as f64 / w.upload_seconds.max(1e-9) / 1e9,
            if mapped {
                "registered file mapping"
            } else {
                "pinned staging"
            }
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compare_uses_abs_below_one_and_rel_above() {
        // tol 1e-3: |want| ≤ 1 → absolute 1e-3; |want| = 1000 → 1.0 allowed.
        assert!(compare(&[0.0005], &[0.0], 1e-3).2);
        assert!(!compare(&[0.002], &[0.0], 1e-3).2);
        assert!(compare(&[1000.9], &[1000.0], 1e-3).2);
        assert!(!compare(&[1001.5], &[1000.0], 1e-3).2);
        let (abs, rel, ok) = compare(&[1.0, 2.5], &[1.0, 2.0], 0.3);
        assert!((abs - 0.5).abs() < 1e-12 && (rel - 0.25).abs() < 1e-12 && ok);
    }

    #[test]
    fn compare_never_passes_nan_or_length_mismatch() {
        assert!(!compare(&[f32::NAN], &[1.0], 1e9).2);
        assert!(!compare(&[1.0], &[f32::NAN], 1e9).2);
        assert!(!compare(&[1.0, 2.0], &[1.0], 1.0).2);
    }

    #[test]
    fn exact_check_counts_differing_bytes() {
        let r = CheckResult::exact("x", &[1, 2, 3, 4], &[1, 0, 3, 0], String::new());
        assert_eq!(r.verdict, Verdict::Fail);
        assert_eq!(r.max_abs, 2.0);
        assert_eq!(
            CheckResult::exact("x", &[5; 9], &[5; 9], String::new()).verdict,
            Verdict::Pass
        );
    }

    #[test]
    fn rng_is_deterministic_and_spread() {
        let (mut a, mut b) = (CheckRng::new(7), CheckRng::new(7));
        let xs: Vec<f32> = (0..1000).map(|_| a.next_f32()).collect();
        let ys: Vec<f32> = (0..1000).map(|_| b.next_f32()).collect();
        assert_eq!(xs, ys);
        assert!(xs.iter().all(|x| (-1.0..1.0).contains(x)));
        let mean = xs.iter().sum::<f32>() / 1000.0;
        assert!(mean.abs() < 0.1, "mean {mean}"); // 1000 uniform draws: sd of the mean ≈ 0.018
        let mut c = CheckRng::new(1);
        assert!((0..1000).map(|_| c.int_in(-3, 3)).all(|v| (-3..=3).contains(&v)));
    }
}
