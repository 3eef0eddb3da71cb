//! Sampling and math kernels against the host: argmax and min-p sampling against the engine's
//! sampler (`engine::sampler`) on logits with ties, NaN and ±inf; the transcendental functions of
//! kernels/mathf.h bitwise against `backend::cpu::transcend`.

use ds4_chat::backend::hip::kernels::{self, SAMPLE_BUFFER_WORDS};
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

/// Device argmax must equal the host's argmax, and a device min-p draw the host sampler's draw with
/// the same uniform, except where the draw's target lies within the summation-order rounding bound
/// of a boundary between the two picks (the device sums the kept weights in another order).
fn check_sampling(gpu: &Gpu, rng: &mut CheckRng) -> Checked {
    let name = "kernel.argmax+sample_min_p[vs host sampler]";
    // The sampling words, then the fast pick's scratch (its counter zero, kernels::SAMPLE_BUFFER_WORDS).
    let mut words = vec![0xdead_beefu32; SAMPLE_BUFFER_WORDS];
    words[2] = 0;
    let out = gpu.up(&words)?;
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
            if (got[0], got[1], got[2]) != (host_argmax(&logits), 0, 0) {
                failures.push(format!(
                    "trial {trial}: {kind} {:?}, host {}",
                    &got[..3],
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
        gpu.run(&kernels::sample_min_p(
            out.ptr().0,
            l_d.ptr().0,
            n as u32,
            temperature,
            min_p,
            u01,
        ))?;
        let got = out.to_vec::<u32>()?;
        let (dev, drew) = (got[0], got[1] != 0);
        // The kept weights as the host computes them.
        let finite: Vec<usize> = (0..n).filter(|&i| logits[i].is_finite()).collect();
        // The first maximum (finite logits compare totally).
        let Some(&best) = finite
            .iter()
            .max_by(|&&a, &&b| logits[a].partial_cmp(&logits[b]).unwrap().then(b.cmp(&a)))
        else {
            if (dev, drew) != (host, false) {
                failures.push(format!(
                    "trial {trial}: no finite logit, device ({dev}, {drew}), host {host}"
                ));
            }
            continue;
        };
        let mx = logits[best];
        let kept: Vec<(usize, f32)> = finite
            .iter()
            .map(|&i| (i, ((logits[i] - mx) / temperature).exp()))
            .filter(|&(_, w)| w >= min_p)
            .collect();
        if kept.is_empty() {
            if (dev, drew) != (best as u32, false) || host != best as u32 {
                failures.push(format!(
                    "trial {trial}: nothing kept (min_p {min_p}): device ({dev}, {drew}), host {host}, first max {best}"
                ));
            }
            continue;
        }
        if !drew {
            failures.push(format!("trial {trial}: the draw must be used when tokens are kept"));
        }
        draws += 1;
        if dev == host {
            continue;
        }
        // Exact cumulative sums and target.
        let mut c = Vec::with_capacity(kept.len());
        let mut acc = 0f64;
        for &(_, w) in &kept {
            acc += w as f64;
            c.push(acc);
        }
        let s = acc;
        let t = u01 as f64 * s;
        let chunk = n.div_ceil(256);
        let unit = (2f64).powi(-24);
        let bound = unit * s * ((2 * kept.len() + 2) + (2 * (255 + chunk) + 2)) as f64;
        // Position of a pick in the walk: its index among the kept ids; the rounding fallback (the
        // first maximum after the walk ran out) counts as past the last.
        let position = |id: u32| -> Vec<usize> {
            let mut v: Vec<usize> = kept.iter().position(|&(i, _)| i as u32 == id).into_iter().collect();
            if id == best as u32 {
                v.push(kept.len());
            }
            v
        };
        let excused = position(host).iter().any(|&a| {
            position(dev).iter().any(|&b| {
                let (lo, hi) = (a.min(b), a.max(b));
                (lo..hi).all(|k| (t - c[k.min(c.len() - 1)]).abs() <= bound)
            })
        });
        if !excused {
            failures.push(format!(
                "trial {trial}: device picked {dev}, host {host}, u01 {u01}: T = {t:.6e} is not within the \
                 rounding bound {bound:.3e} of the boundaries between them (S = {s:.6e})"
            ));
        }
        boundary_cases += 1;
    }
    if draws < 80 {
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
