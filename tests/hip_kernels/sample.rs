//! Sampling and math kernels against the host: argmax and min-p sampling against the engine's
//! sampler (`engine::sampler`) on logits with ties, NaN and ±inf; the transcendental functions of
//! kernels/mathf.h bitwise against `backend::cpu::transcend`.

use ds4_chat::backend::hip::kernels::{self, SAMPLE_COUNTER_WORD};
use ds4_chat::engine::events::SamplingParams;
use ds4_chat::engine::sampler::{Sampler, Xorshift64Star, argmax as host_argmax};

use super::support::*;

/// Every check of this file.
pub fn run(gpu: &Gpu, rng: &mut CheckRng, emit: Emit) {
    emit(guard("kernel.argmax+sample_min_p[vs host sampler]", || {
        check_sampling(gpu, rng)
    }));
    for which in kernels::MathFn::ALL.into_iter().filter(|_| !wave_rerun()) {
        let name = format!("kernel.mathf[{which:?}, bitwise]");
        emit(guard(&name, || check_mathf(gpu, &name, which)));
    }
}

/// Device argmax (the exact kernel and its fast twin) must equal the host's argmax, and a device
/// min-p draw (the exact kernel and the fast form's two launches) the host sampler's draw with the
/// same uniform, except where the draw's target lies within the summation-order rounding bound of a
/// boundary between the two picks (the device sums the kept weights in another order). The fast
/// kernels share one buffer whose counter word must be back at 0 after each.
fn check_sampling(gpu: &Gpu, rng: &mut CheckRng) -> Checked {
    let name = "kernel.argmax+sample_min_p[vs host sampler]";
    let out = sample_buffer(gpu)?;
    let (mut draws, mut boundary_cases, mut failures) = (0usize, 0usize, Vec::new());
    for trial in 0..162 {
        let n = [1usize, 7, 256, 1000, 3001, 129_280][trial % 6];
        let scale = [0.5f32, 3.0, 12.0][trial % 3];
        let mut logits = random_vec(rng, n, scale);
        // Ties: a few copies of one value; specials sprinkled in by trial.
        for _ in 0..(n / 50).min(64) {
            let (i, j) = (rng.next_u64() as usize % n, rng.next_u64() as usize % n);
            logits[i] = logits[j];
        }
        for _ in 0..(trial % 4) {
            let i = rng.next_u64() as usize % n;
            logits[i] = [f32::NAN, f32::NEG_INFINITY, f32::INFINITY, -f32::NAN][trial % 4];
        }
        if trial % 23 == 0 {
            logits.fill(if trial % 2 == 0 { f32::NAN } else { f32::NEG_INFINITY });
        }
        let l_d = gpu.up(&logits)?;
        // The exact pick and its fast twin (split over blocks) must both be the host's.
        let pick = kernels::argmax(out.ptr().0, l_d.ptr().0, n as u32);
        for (kind, launch) in [("argmax", pick.clone()), ("fast argmax", twin_of(&pick))] {
            gpu.run(&launch)?;
            let got = out.to_vec::<u32>()?;
            let counter = got[SAMPLE_COUNTER_WORD];
            if (got[0], got[1], counter) != (host_argmax(&logits), 0, 0) {
                failures.push(format!(
                    "trial {trial}: {kind} {:?}, counter {counter}, host {}",
                    &got[..2],
                    host_argmax(&logits)
                ));
            }
        }

        let temperature = [0.3f32, 0.8, 1.5][trial % 3];
        let min_p = [0.0f32, 0.01, 0.2, 1.5][trial % 4];
        let params = SamplingParams {
            temperature,
            top_p: 1.0,
            top_k: 0,
            min_p,
            seed: None,
        };
        let seed = rng.next_u64();
        let u01 = Xorshift64Star::new(seed).next_unit_f32();
        let host = Sampler::new(Some(seed)).sample(&logits, &params);
        let draw = Draw {
            logits: &logits,
            temperature,
            min_p,
            u01,
            host,
        };
        // The exact draw and its fast form (two launches, sums in another order).
        let exact = kernels::sample_min_p(out.ptr().0, l_d.ptr().0, n as u32, temperature, min_p, u01);
        let fast = kernels::sample_min_p_fast(out.ptr().0, l_d.ptr().0, n as u32, temperature, min_p, u01);
        for (kind, launches) in [("min-p", vec![exact]), ("fast min-p", fast.to_vec())] {
            for launch in &launches {
                gpu.run(launch)?;
            }
            let got = out.to_vec::<u32>()?;
            match draw.judge(got[0], got[1] != 0) {
                Judged::NoDraw => {}
                Judged::Same => draws += 1,
                Judged::Boundary => {
                    draws += 1;
                    boundary_cases += 1;
                }
                Judged::Wrong(why) => failures.push(format!("trial {trial}, {kind}: {why}")),
            }
            if got[SAMPLE_COUNTER_WORD] != 0 {
                failures.push(format!(
                    "trial {trial}, {kind}: the counter word is {}, not back at 0",
                    got[SAMPLE_COUNTER_WORD]
                ));
            }
        }
    }
    if draws < 160 {
        failures.push(format!("too few draws compared: {draws}"));
    }
    Ok(CheckResult::measured(
        name,
        failures.len() as f64,
        0.0,
        0.0,
        failures.is_empty(),
        format!(
            "{draws} draws compared, {boundary_cases} at a rounding boundary{}",
            failures
                .first()
                .map(|f| format!("; {} failures, first: {f}", failures.len()))
                .unwrap_or_default()
        ),
    ))
}

/// One min-p draw of the device against the host sampler's pick `host` for the same uniform.
struct Draw<'a> {
    logits: &'a [f32],
    temperature: f32,
    min_p: f32,
    u01: f32,
    host: u32,
}

enum Judged {
    /// No finite logit or nothing kept: the device drew nothing and picked the host's id.
    NoDraw,
    /// A draw that picked the host's id.
    Same,
    /// A draw that picked another id, within the summation-order rounding bound of every boundary
    /// between the two.
    Boundary,
    Wrong(String),
}

impl Draw<'_> {
    /// The device's (id, whether it drew) against the host: the kept weights as the host computes
    /// them, the exact cumulative sums and the target u01 * S; a different id passes only when the
    /// target lies within the rounding bound of every boundary between the two picks. The bound
    /// covers the host's sequential sum (2 kept + 2 roundings of S) and the longest add chain of either
    /// device layout: the exact kernel's 256 chunks of ceil(n / 256) ids, or the fast form's 32 shares
    /// of 256 runs (kernels/sample_fast.hip: 31 share sums, a 255-long tree and the run).
    fn judge(&self, dev: u32, drew: bool) -> Judged {
        let (logits, n) = (self.logits, self.logits.len());
        let finite: Vec<usize> = (0..n).filter(|&i| logits[i].is_finite()).collect();
        // The first maximum (finite logits compare totally).
        let Some(&best) = finite
            .iter()
            .max_by(|&&a, &&b| logits[a].partial_cmp(&logits[b]).unwrap().then(b.cmp(&a)))
        else {
            return if (dev, drew) == (self.host, false) {
                Judged::NoDraw
            } else {
                Judged::Wrong(format!("no finite logit, device ({dev}, {drew}), host {}", self.host))
            };
        };
        let mx = logits[best];
        let kept: Vec<(usize, f32)> = finite
            .iter()
            .map(|&i| (i, ((logits[i] - mx) / self.temperature).exp()))
            .filter(|&(_, w)| w >= self.min_p)
            .collect();
        if kept.is_empty() {
            return if (dev, drew) == (best as u32, false) && self.host == best as u32 {
                Judged::NoDraw
            } else {
                Judged::Wrong(format!(
                    "nothing kept (min_p {}): device ({dev}, {drew}), host {}, first max {best}",
                    self.min_p, self.host
                ))
            };
        }
        if !drew {
            return Judged::Wrong("the draw must be used when tokens are kept".into());
        }
        if dev == self.host {
            return Judged::Same;
        }
        // Exact cumulative sums and target.
        let mut c = Vec::with_capacity(kept.len());
        let mut acc = 0f64;
        for &(_, w) in &kept {
            acc += w as f64;
            c.push(acc);
        }
        let s = acc;
        let t = self.u01 as f64 * s;
        let exact_chain = 255 + n.div_ceil(256);
        let fast_run = n.div_ceil(kernels::SAMPLE_FAST_BLOCKS as usize).div_ceil(1024) * 4;
        let fast_chain = kernels::SAMPLE_FAST_BLOCKS as usize - 1 + 255 + fast_run;
        let unit = (2f64).powi(-24);
        let bound = unit * s * ((2 * kept.len() + 2) + (2 * exact_chain.max(fast_chain) + 2)) as f64;
        // Position of a pick in the walk: its index among the kept ids; the rounding fallback (the
        // first maximum after the walk ran out) counts as past the last.
        let position = |id: u32| -> Vec<usize> {
            let mut v: Vec<usize> = kept.iter().position(|&(i, _)| i as u32 == id).into_iter().collect();
            if id == best as u32 {
                v.push(kept.len());
            }
            v
        };
        let excused = position(self.host).iter().any(|&a| {
            position(dev).iter().any(|&b| {
                let (lo, hi) = (a.min(b), a.max(b));
                (lo..hi).all(|k| (t - c[k.min(c.len() - 1)]).abs() <= bound)
            })
        });
        if excused {
            Judged::Boundary
        } else {
            Judged::Wrong(format!(
                "device picked {dev}, host {}, u01 {}: T = {t:.6e} is not within the rounding bound \
                 {bound:.3e} of the boundaries between them (S = {s:.6e})",
                self.host, self.u01
            ))
        }
    }
}

/// kernels/mathf.h against `backend::cpu::transcend`, bitwise (both NaN counts as equal: NaN payloads
/// are the hardware's): a stride through all 2^32 bit patterns, the specials, and the engine's hot
/// ranges (softmax/SwiGLU exponents, RoPE angles up to 1e6 across the 120 reduction switch, softplus
/// arguments, log2 of small block maxima and subnormals).
fn check_mathf(gpu: &Gpu, name: &str, which: kernels::MathFn) -> Checked {
    let sweep = |lo: f64, hi: f64, n: u32| (0..n).map(move |i| (lo + (hi - lo) * i as f64 / (n - 1) as f64) as f32);
    let mut input: Vec<f32> = (0..=u32::MAX / 4099).map(|i| f32::from_bits(i * 4099)).collect();
    input.extend([
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::from_bits(1),
        -1.0,
        1.0,
    ]);
    input.extend(sweep(-110.0, 90.0, 100_000));
    input.extend(sweep(-130.0, 130.0, 20_000));
    input.extend(sweep(0.0, 1.2e6, 100_000));
    input.extend(sweep(-0.999, 50.0, 50_000));
    input.extend((1u32..0x0080_0000).step_by(4099).map(f32::from_bits));
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
    Ok(CheckResult::measured(
        name,
        bad as f64,
        0.0,
        0.0,
        bad == 0,
        format!("{bad} of {n} outputs differ from transcend.rs{first}"),
    ))
}
