use super::*;

fn params(temperature: f32, top_p: f32, top_k: u32, min_p: f32) -> SamplingParams {
    SamplingParams {
        temperature,
        top_p,
        top_k,
        min_p,
        seed: Some(42),
    }
}

/// Logits whose softmax (T = 1) is exactly proportional to `weights`.
fn logits_of(weights: &[f64]) -> Vec<f32> {
    weights
        .iter()
        .map(|&w| if w > 0.0 { w.ln() as f32 } else { f32::NEG_INFINITY })
        .collect()
}

/// Sample `n` times and check each id's frequency against `expected` probabilities within
/// 5 standard deviations of a binomial proportion (a false failure has odds below 1e-6 per id).
fn assert_frequencies(logits: &[f32], p: &SamplingParams, expected: &[f64], n: usize) {
    let mut s = Sampler::new(Some(12345));
    let mut counts = vec![0usize; logits.len()];
    for _ in 0..n {
        counts[s.sample(logits, p) as usize] += 1;
    }
    for (id, (&c, &e)) in counts.iter().zip(expected).enumerate() {
        let f = c as f64 / n as f64;
        let sigma = (e * (1.0 - e) / n as f64).sqrt();
        let tol = 5.0 * sigma + 1e-12;
        assert!(
            (f - e).abs() <= tol,
            "id {id}: frequency {f:.5}, expected {e:.5} ± {tol:.5} ({p:?})"
        );
    }
}

/// Reference values from a Python one-off of the generator in docs/sampler.md#generator:
/// `x = s or 0x9e3779b97f4a7c15; x ^= x>>12; x ^= (x<<25) mod 2^64; x ^= x>>27; out = x*0x2545f4914f6cdd1d mod 2^64`.
#[test]
fn rng_matches_independent_xorshift64star() {
    let mut r = Xorshift64Star::new(1);
    assert_eq!(r.next_u64(), 0x47e4_ce4b_896c_dd1d);
    assert_eq!(r.next_u64(), 0xabcf_a6a8_e079_651d);
    assert_eq!(r.next_u64(), 0xb9d1_0d8f_eb73_1f57);
    // State 0 is replaced by the golden-ratio constant.
    let mut z = Xorshift64Star::new(0);
    assert_eq!(z.next_u64(), 0x0d83_b3e2_9a21_487a);
    assert_eq!(z.next_u64(), 0x54c4_4c79_f1fe_9d67);
    // Uniforms: (out >> 40) & 0xffffff over 2^24; for seed 42 the top-24-bit integers are
    // 5688906, 13124075, 13256299.
    let mut u = Xorshift64Star::new(42);
    assert_eq!(u.next_unit_f32(), 5_688_906.0 / 16_777_216.0);
    assert_eq!(u.next_unit_f32(), 13_124_075.0 / 16_777_216.0);
    assert_eq!(u.next_unit_f32(), 13_256_299.0 / 16_777_216.0);
}

#[test]
fn greedy_takes_first_maximal_index_and_ignores_nan() {
    let logits = [1.0, f32::NAN, 3.0, 2.0, 3.0];
    let mut s = Sampler::new(Some(1));
    for t in [0.0, -1.0] {
        assert_eq!(s.sample(&logits, &params(t, 1.0, 0, 0.05)), 2);
    }
    assert_eq!(argmax(&[f32::NAN, f32::NEG_INFINITY]), 0);
    assert_eq!(argmax(&[f32::NAN, 0.5, f32::NAN]), 1);
}

/// Seed 42's first uniforms are 0.33909, 0.78226, 0.79014, 0.94404, 0.76439 (see the RNG test).
/// With probabilities [0.4, 0.1, 0.3, 0.2], id order cumulates to [0.4, 0.5, 0.8, 1.0] so the draws
/// are 0, 2, 2, 3, 2; sorted order (ids 0, 2, 3, 1) cumulates to [0.4, 0.7, 0.9, 1.0] so a
/// top_p just below 1 draws 0, 3, 3, 1, 3. This pins both the walk order and the RNG use.
#[test]
fn default_path_walks_ids_in_order_and_sorted_path_by_logit() {
    let logits = logits_of(&[0.4, 0.1, 0.3, 0.2]);
    let mut s = Sampler::new(Some(42));
    let p = params(1.0, 1.0, 0, 0.0);
    let got: Vec<u32> = (0..5).map(|_| s.sample(&logits, &p)).collect();
    assert_eq!(got, [0, 2, 2, 3, 2]);

    let mut s = Sampler::new(Some(42));
    let p = params(1.0, 0.999, 0, 0.0);
    let got: Vec<u32> = (0..5).map(|_| s.sample(&logits, &p)).collect();
    assert_eq!(got, [0, 3, 3, 1, 3]);

    // top_k = 4 keeps everything and draws in the same sorted order.
    let mut s = Sampler::new(Some(42));
    let got: Vec<u32> = (0..5).map(|_| s.sample(&logits, &params(1.0, 1.0, 4, 0.0))).collect();
    assert_eq!(got, [0, 3, 3, 1, 3]);
}

#[test]
fn default_path_frequencies_match_softmax() {
    let logits = logits_of(&[0.4, 0.1, 0.3, 0.2]);
    assert_frequencies(&logits, &params(1.0, 1.0, 0, 0.0), &[0.4, 0.1, 0.3, 0.2], 100_000);
}

/// Temperature 2 takes square roots of the weights: [0.4, 0.1, 0.3, 0.2] → √w / Σ√w with
/// Σ√w = 0.632456 + 0.316228 + 0.547723 + 0.447214 = 1.943621.
#[test]
fn temperature_flattens_the_distribution() {
    let logits = logits_of(&[0.4, 0.1, 0.3, 0.2]);
    let sum = 0.4f64.sqrt() + 0.1f64.sqrt() + 0.3f64.sqrt() + 0.2f64.sqrt();
    let expected: Vec<f64> = [0.4f64, 0.1, 0.3, 0.2].iter().map(|w| w.sqrt() / sum).collect();
    assert!((expected[0] - 0.325405).abs() < 1e-5);
    assert_frequencies(&logits, &params(2.0, 1.0, 0, 0.0), &expected, 100_000);
}

/// min_p is relative to the top token: with weights [0.5, 0.3, 0.15, 0.05] and min_p 0.2 the
/// threshold is 0.2·0.5 = 0.1, so id 3 is dropped and the rest renormalise over 0.95.
#[test]
fn min_p_drops_tokens_below_a_fraction_of_the_top() {
    let logits = logits_of(&[0.5, 0.3, 0.15, 0.05]);
    let expected = [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.0];
    assert_frequencies(&logits, &params(1.0, 1.0, 0, 0.2), &expected, 100_000);
    // Same cut in the sorted path (top_p just below 1 keeps every survivor).
    assert_frequencies(&logits, &params(1.0, 0.9999, 0, 0.2), &expected, 100_000);
    // Negative min_p means off: every token is possible.
    assert_frequencies(&logits, &params(1.0, 1.0, 0, -0.5), &[0.5, 0.3, 0.15, 0.05], 100_000);
}

/// top_p keeps the shortest prefix (by descending probability) whose mass reaches top_p:
/// probabilities [0.2, 0.5, 0.3] sorted are 0.5 (id 1), 0.3 (id 2), 0.2 (id 0); top_p 0.7 keeps
/// 0.5 (< 0.7) then 0.8 (≥ 0.7, stop) → ids 1 and 2 with 5/8 and 3/8. top_p 0.45 keeps id 1 only.
#[test]
fn top_p_keeps_the_nucleus() {
    let logits = logits_of(&[0.2, 0.5, 0.3]);
    assert_frequencies(&logits, &params(1.0, 0.7, 0, 0.0), &[0.0, 0.625, 0.375], 100_000);
    assert_frequencies(&logits, &params(1.0, 0.45, 0, 0.0), &[0.0, 1.0, 0.0], 10_000);
    // top_p outside (0, 1] means off: same draws as the default path for the same seed.
    for bad in [0.0, -0.3, 1.5] {
        let mut a = Sampler::new(Some(7));
        let mut b = Sampler::new(Some(7));
        for _ in 0..200 {
            assert_eq!(
                a.sample(&logits, &params(1.0, bad, 0, 0.0)),
                b.sample(&logits, &params(1.0, 1.0, 0, 0.0))
            );
        }
    }
}

/// top_k 2 on probabilities [0.1, 0.4, 0.2, 0.3] keeps ids 1 and 3 and renormalises over them
/// only: 0.4/0.7 and 0.3/0.7.
#[test]
fn top_k_keeps_the_k_highest_and_renormalises_over_them() {
    let logits = logits_of(&[0.1, 0.4, 0.2, 0.3]);
    assert_frequencies(
        &logits,
        &params(1.0, 1.0, 2, 0.0),
        &[0.0, 4.0 / 7.0, 0.0, 3.0 / 7.0],
        100_000,
    );
    // min_p inside top_k is relative to the top of the kept set: 0.8·(0.4/0.7) = 0.457 > 0.3/0.7,
    // so only id 1 survives.
    assert_frequencies(&logits, &params(1.0, 1.0, 2, 0.8), &[0.0, 1.0, 0.0, 0.0], 10_000);
    // top_k larger than the vocabulary is clamped.
    assert_frequencies(&logits, &params(1.0, 1.0, 100, 0.0), &[0.1, 0.4, 0.2, 0.3], 100_000);
}

/// Ties inside top_k keep the earlier id first: [1, 3, 3, 2] with k = 2 keeps ids 1 then 2, each
/// 0.5; seed 42's uniforms 0.339, 0.782 pick id 1 then id 2.
#[test]
fn top_k_ties_keep_the_lower_id_first() {
    let logits = [1.0, 3.0, 3.0, 2.0];
    let mut s = Sampler::new(Some(42));
    let p = params(1.0, 1.0, 2, 0.0);
    assert_eq!(s.sample(&logits, &p), 1);
    assert_eq!(s.sample(&logits, &p), 2);
}

#[test]
fn non_finite_logits_are_never_sampled() {
    let logits = [f32::NAN, 0.0, f32::INFINITY, f32::NEG_INFINITY, 0.0];
    for p in [
        params(1.0, 1.0, 0, 0.0),
        params(1.0, 0.9, 0, 0.0),
        params(1.0, 1.0, 3, 0.0),
        params(0.7, 0.95, 2, 0.05),
    ] {
        assert_frequencies(&logits, &p, &[0.0, 0.5, 0.0, 0.0, 0.5], 20_000);
    }
    // Nothing finite: fall back to argmax (first maximal, +inf wins).
    let mut s = Sampler::new(Some(3));
    assert_eq!(s.sample(&[f32::NAN, f32::INFINITY], &params(1.0, 1.0, 0, 0.0)), 1);
}

/// A plain transcription of docs/sampler.md#sampling-paths (two exp passes, a full stable sort, no
/// shortcuts), for checking that the pre-filters of the fast paths never change a draw.
fn reference_sample(logits: &[f32], p: &SamplingParams, rng: &mut Xorshift64Star) -> u32 {
    let t = p.temperature;
    if t <= 0.0 {
        return argmax(logits);
    }
    let top_p = if p.top_p > 0.0 && p.top_p <= 1.0 { p.top_p } else { 1.0 };
    let min_p = p.min_p.max(0.0);
    let finite: Vec<(u32, f32)> = logits
        .iter()
        .enumerate()
        .filter(|(_, v)| v.is_finite())
        .map(|(i, &v)| (i as u32, v))
        .collect();
    if finite.is_empty() {
        return argmax(logits);
    }
    let (best, max) = finite
        .iter()
        .fold((0, f32::NEG_INFINITY), |b, &(i, v)| if v > b.1 { (i, v) } else { b });
    let mut cand: Vec<(u32, f32, f32)>;
    let sum: f32;
    if p.top_k == 0 {
        if top_p >= 1.0 {
            let w = |v: f32| ((v - max) / t).exp();
            let s: f32 = finite.iter().map(|&(_, v)| w(v)).filter(|&x| x >= min_p).sum();
            let mut r = rng.next_unit_f32() * s;
            for &(i, v) in &finite {
                if w(v) >= min_p {
                    r -= w(v);
                    if r <= 0.0 {
                        return i;
                    }
                }
            }
            return best;
        }
        cand = finite.iter().map(|&(i, v)| (i, v, ((v - max) / t).exp())).collect();
        sum = cand.iter().map(|c| c.2).sum();
        cand.sort_by(|a, b| b.1.partial_cmp(&a.1).unwrap());
    } else {
        cand = finite.clone().into_iter().map(|(i, v)| (i, v, 0.0)).collect();
        cand.sort_by(|a, b| b.1.partial_cmp(&a.1).unwrap());
        cand.truncate((p.top_k as usize).min(MAX_TOP_K as usize));
        let m = cand[0].1;
        for c in cand.iter_mut() {
            c.2 = ((c.1 - m) / t).exp();
        }
        sum = cand.iter().map(|c| c.2).sum();
    }
    let min_prob = (cand[0].2 / sum) * min_p;
    let (mut kept_sum, mut kept) = (0.0f32, 0);
    for (i, c) in cand.iter().enumerate() {
        if i > 0 && c.2 / sum < min_prob {
            break;
        }
        kept_sum += c.2;
        kept += 1;
        if kept_sum / sum >= top_p {
            break;
        }
    }
    let mut r = rng.next_unit_f32() * kept_sum;
    for c in &cand[..kept] {
        r -= c.2;
        if r <= 0.0 {
            return c.0;
        }
    }
    cand[kept - 1].0
}

#[test]
fn fast_paths_draw_exactly_like_the_plain_algorithm() {
    let mut cases_rng = Xorshift64Star::new(2024);
    let mut cases = 0;
    for round in 0..300 {
        let n = 50 + (cases_rng.next_u64() % 400) as usize;
        // Coarse values make ties common; a few non-finite entries.
        let mut logits: Vec<f32> = (0..n).map(|_| (cases_rng.next_u64() % 60) as f32 / 8.0).collect();
        logits[(cases_rng.next_u64() as usize) % n] = f32::NAN;
        logits[(cases_rng.next_u64() as usize) % n] = f32::NEG_INFINITY;
        let temperature = [0.5f32, 1.0, 2.0][round % 3];
        for &(top_p, top_k, min_p) in &[
            (1.0, 0, 0.05),
            (1.0, 0, 0.0),
            (0.9, 0, 0.05),
            (0.5, 0, 0.0),
            (0.95, 0, 0.3),
            (1.0, 5, 0.05),
            (0.8, 7, 0.0),
            (1.0, 0, 1.5),
            (0.9, 0, 1.5),
        ] {
            let p = SamplingParams {
                temperature,
                top_p,
                top_k,
                min_p,
                seed: None,
            };
            let seed = cases_rng.next_u64();
            let mut fast = Sampler::new(Some(seed));
            let mut plain = Xorshift64Star::new(seed);
            for _ in 0..5 {
                assert_eq!(
                    fast.sample(&logits, &p),
                    reference_sample(&logits, &p, &mut plain),
                    "{p:?}"
                );
                cases += 1;
            }
        }
    }
    assert_eq!(cases, 300 * 9 * 5);
}

/// The device form draws exactly as the host path: the same u01 as the host's next draw, the
/// generator advanced only when the pick used it, nothing for greedy, and no device form for
/// the sorted paths.
#[test]
fn device_requests_draw_as_the_host_path() {
    let seed = 77;
    let logits: Vec<f32> = (0..300).map(|i| ((i * 37) % 101) as f32 / 25.0).collect();
    assert!(
        Sampler::new(Some(seed))
            .device_request(&params(0.8, 0.9, 0, 0.0))
            .is_none()
    );
    assert!(
        Sampler::new(Some(seed))
            .device_request(&params(0.8, 1.0, 40, 0.0))
            .is_none()
    );
    let greedy = params(0.0, 1.0, 0, 0.0);
    let mut s = Sampler::new(Some(seed));
    let req = s.device_request(&greedy).unwrap();
    assert_eq!(req.how, DeviceSample::Greedy);
    assert_eq!(s.accept_device(req, DevicePick { token: 5, drew: false }), 5);
    let p = params(0.7, 1.0, 0, 0.05);
    // Host: two samples. Device: the first through a request (its u01 is the host's draw), the
    // second on the host; the second picks must agree, so the generators are in step.
    let mut host = Sampler::new(Some(seed));
    let first = host.sample(&logits, &p);
    let second = host.sample(&logits, &p);
    let mut dev = Sampler::new(Some(seed));
    let req = dev.device_request(&p).unwrap();
    let DeviceSample::MinP {
        temperature,
        min_p,
        u01,
    } = req.how
    else {
        panic!("expected the min-p path, got {:?}", req.how)
    };
    assert_eq!((temperature, min_p), (0.7, 0.05));
    assert_eq!(u01, Xorshift64Star::new(seed).next_unit_f32());
    assert_eq!(
        dev.accept_device(
            req,
            DevicePick {
                token: first,
                drew: true
            }
        ),
        first
    );
    assert_eq!(dev.sample(&logits, &p), second);
    // A pick that did not use the draw leaves the generator where it was.
    let mut unused = Sampler::new(Some(seed));
    let req = unused.device_request(&p).unwrap();
    unused.accept_device(req, DevicePick { token: 0, drew: false });
    assert_eq!(unused.sample(&logits, &p), first);
}

#[test]
fn same_seed_same_draws_on_a_large_vocabulary() {
    let logits: Vec<f32> = (0..5000).map(|i| ((i * 7919) % 1000) as f32 / 100.0).collect();
    let p = params(0.8, 0.9, 0, 0.05);
    let mut a = Sampler::new(Some(99));
    let mut b = Sampler::new(Some(99));
    let da: Vec<u32> = (0..50).map(|_| a.sample(&logits, &p)).collect();
    let db: Vec<u32> = (0..50).map(|_| b.sample(&logits, &p)).collect();
    assert_eq!(da, db);
    // Every draw is a token inside the nucleus: its logit is within T·ln(1/min_p) of the top.
    let cut = 9.99 - 0.8 * (1.0f32 / 0.05).ln();
    assert!(da.iter().all(|&id| logits[id as usize] >= cut - 1e-4));
}
