use super::*;
use crate::engine::sampler::Xorshift64Star;
use crate::engine::speculate::drafter::Drafter;
use crate::engine::speculate::replay::ReplayDrafter;

fn params(temperature: f32, top_p: f32, top_k: u32, min_p: f32) -> SamplingParams {
    SamplingParams {
        temperature,
        top_p,
        top_k,
        min_p,
        seed: None,
    }
}

fn draft(tokens: &[u32]) -> Draft {
    Draft {
        tokens: tokens.to_vec(),
        q: Vec::new(),
    }
}

/// Logits whose softmax at temperature 1 is proportional to `weights`.
fn logits_of(weights: &[f64]) -> Vec<f32> {
    weights.iter().map(|&w| w.ln() as f32).collect()
}

/// Rows with the given argmaxes over a vocabulary of 4 (the argmax gets logit 3, the others 0..2).
fn rows_with_argmax(tops: &[u32]) -> Vec<f32> {
    tops.iter()
        .flat_map(|&top| (0..4u32).map(move |id| if id == top { 3.0 } else { id as f32 * 0.5 }))
        .collect()
}

#[test]
fn greedy_keeps_the_prefix_equal_to_the_argmax_and_appends_the_target_token() {
    let data = rows_with_argmax(&[2, 1, 3]);
    let rows = BlockLogits::new(&data, 4).unwrap();
    let g = |d: &[u32]| greedy(d, &rows).unwrap();
    // All drafts right: both kept, the bonus token from the last row.
    assert_eq!(g(&[2, 1]), Outcome { accepted: 2, next: 3 });
    // Second draft wrong: one kept, the target's correction.
    assert_eq!(g(&[2, 0]), Outcome { accepted: 1, next: 1 });
    // First draft wrong: nothing kept, even though the second would match.
    assert_eq!(g(&[0, 1]), Outcome { accepted: 0, next: 2 });
    // Ties go to the lower id, as in plain greedy decoding.
    let tie = [1.0, 5.0, 5.0];
    let rows = BlockLogits::new(&tie, 3).unwrap();
    assert_eq!(greedy(&[], &rows).unwrap(), Outcome { accepted: 0, next: 1 });
}

#[test]
fn blocks_of_the_wrong_shape_are_refused() {
    let data = rows_with_argmax(&[2, 1, 3]);
    let rows = BlockLogits::new(&data, 4).unwrap();
    let e = greedy(&[2], &rows).unwrap_err();
    assert!(e.contains("needs 2 logit rows, got 3"), "{e}");
    assert!(BlockLogits::new(&data, 5).unwrap_err().contains("not whole rows"));
    assert!(BlockLogits::new(&[], 4).is_err());
    assert!(BlockLogits::new(&data, 0).is_err());
}

/// Under greedy settings every rule is the greedy rule, and spends no draws.
#[test]
fn every_rule_is_greedy_at_temperature_zero() {
    let data = rows_with_argmax(&[2, 1, 3]);
    let rows = BlockLogits::new(&data, 4).unwrap();
    for rule in [SamplingRule::Exact, SamplingRule::Opportunistic] {
        for tokens in [[2, 1], [2, 0], [0, 1], [3, 3]] {
            let mut s = Sampler::new(Some(1));
            let got = accept(rule, &draft(&tokens), &rows, &mut s, &params(0.0, 1.0, 0, 0.05)).unwrap();
            assert_eq!(got, greedy(&tokens, &rows).unwrap());
            assert_eq!(
                exact(&draft(&tokens), &rows, &mut s, &params(0.0, 1.0, 0, 0.05)).unwrap(),
                got
            );
        }
    }
}

/// Opportunistic keeps a draft equal to the argmax whatever the draw would have been, and the token
/// after is the sampler's draw from the row where it stopped.
#[test]
fn opportunistic_keeps_argmax_drafts_and_samples_at_the_mismatch() {
    // Row 0: argmax 0 with probability 0.5; row 1: argmax 2; row 2: flat-ish.
    let mut data = logits_of(&[0.5, 0.3, 0.2]);
    data.extend(logits_of(&[0.2, 0.3, 0.5]));
    data.extend(logits_of(&[0.3, 0.3, 0.4]));
    let rows = BlockLogits::new(&data, 3).unwrap();
    let p = params(1.0, 1.0, 0, 0.0);
    for seed in 0..200 {
        let mut s = Sampler::new(Some(seed));
        let got = accept(SamplingRule::Opportunistic, &draft(&[0, 1]), &rows, &mut s, &p).unwrap();
        assert_eq!(got.accepted, 1, "seed {seed}");
        assert_eq!(got.next, Sampler::new(Some(seed)).sample(rows.row(1), &p));
        let all = opportunistic(&[0, 2], &rows, &mut Sampler::new(Some(seed)), &p).unwrap();
        assert_eq!(all.accepted, 2);
        assert_eq!(all.next, Sampler::new(Some(seed)).sample(rows.row(2), &p));
    }
}

/// The critical values of the chi-square distribution at p = 0.01, for 1 to 6 degrees of freedom.
const CHI2_CRITICAL_P01: [f64; 6] = [6.635, 9.210, 11.345, 13.277, 15.086, 16.812];

/// Pearson's statistic of `counts` against `expected` probabilities over the tokens with a nonzero
/// expectation (df = their number − 1), after checking that tokens expected never were never drawn.
fn chi_square(counts: &[u64], expected: &[f64]) -> (f64, usize) {
    let n: u64 = counts.iter().sum();
    let mut stat = 0.0;
    let mut cells = 0;
    for (id, (&c, &e)) in counts.iter().zip(expected).enumerate() {
        if e == 0.0 {
            assert_eq!(c, 0, "token {id} has probability 0 but was emitted {c} times");
            continue;
        }
        let want = e * n as f64;
        stat += (c as f64 - want).powi(2) / want;
        cells += 1;
    }
    (stat, cells - 1)
}

/// `draws` single-draft blocks from `logits` under `p`, each emitting its first token through
/// `rule` (which gets the draft, the block and the sampler); the counts of the emitted tokens and
/// how many drafts were accepted.
fn first_tokens(
    logits: &[f32],
    p: &SamplingParams,
    draws: usize,
    seed: u64,
    mut make_draft: impl FnMut() -> Draft,
    rule: impl Fn(&Draft, &BlockLogits<'_>, &mut Sampler, &SamplingParams) -> Outcome,
) -> (Vec<u64>, u64) {
    let vocab = logits.len();
    // The second row does not matter to the first token.
    let data: Vec<f32> = logits.iter().chain(logits).copied().collect();
    let rows = BlockLogits::new(&data, vocab).unwrap();
    let mut s = Sampler::new(Some(seed));
    let mut counts = vec![0u64; vocab];
    let mut accepted = 0;
    for _ in 0..draws {
        let d = make_draft();
        let o = rule(&d, &rows, &mut s, p);
        let first = if o.accepted > 0 { d.tokens[0] } else { o.next };
        counts[first as usize] += 1;
        accepted += o.accepted.min(1) as u64;
    }
    (counts, accepted)
}

/// Three sampler settings over weights [0.30, 0.25, 0.20, 0.12, 0.08, 0.05] and the distribution
/// each gives (worked out by hand):
/// * top_k 4 (sorted path): the four highest, renormalised over 0.87;
/// * T 1, min_p 0.2 (id-order path): weights below 0.2 · 0.30 = 0.06 dropped (id 5), the rest
///   renormalised over 0.95;
/// * T 0.5, top_p 0.9, min_p 0.1 (sorted path): weights squared, [0.09, 0.0625, 0.04, 0.0144,
///   0.0064, 0.0025] / 0.2158; the running mass 0.417, 0.707, 0.892, 0.959 reaches 0.9 at id 3, and
///   id 3's 0.0667 is above 0.1 · 0.417, so ids 0..=3 are kept, renormalised over 0.2069.
fn settings() -> Vec<(SamplingParams, Vec<f64>)> {
    let w = [0.30, 0.25, 0.20, 0.12, 0.08, 0.05];
    let sq: Vec<f64> = w.iter().map(|x| x * x).collect();
    let kept_sq: f64 = sq[..4].iter().sum();
    vec![
        (
            params(1.0, 1.0, 4, 0.0),
            w.iter()
                .enumerate()
                .map(|(i, x)| if i < 4 { x / 0.87 } else { 0.0 })
                .collect(),
        ),
        (
            params(1.0, 1.0, 0, 0.2),
            w.iter()
                .enumerate()
                .map(|(i, x)| if i < 5 { x / 0.95 } else { 0.0 })
                .collect(),
        ),
        (
            params(0.5, 0.9, 0, 0.1),
            sq.iter()
                .enumerate()
                .map(|(i, x)| if i < 4 { x / kept_sq } else { 0.0 })
                .collect(),
        ),
    ]
}

const DRAWS: usize = 100_000;

/// The sampler's distribution is the hand-worked one (to f32 rounding), so the chi-square tests
/// below compare against the distribution `Sampler::sample` draws from.
#[test]
fn the_distribution_is_the_one_the_sampler_draws_from() {
    let logits = logits_of(&[0.30, 0.25, 0.20, 0.12, 0.08, 0.05]);
    for (p, expected) in settings() {
        let mut s = Sampler::new(Some(3));
        let dist = s.distribution(&logits, &p);
        for (id, &e) in expected.iter().enumerate() {
            let got = dist.probability(id as u32) as f64;
            assert!((got - e).abs() < 1e-5, "{p:?} id {id}: {got} vs {e}");
        }
        // And `sample` draws from it (5 standard deviations per id over 100k draws).
        let mut counts = [0u64; 6];
        for _ in 0..DRAWS {
            counts[s.sample(&logits, &p) as usize] += 1;
        }
        let (stat, df) = chi_square(&counts, &expected);
        assert!(stat < CHI2_CRITICAL_P01[df - 1], "plain sampling {p:?}: chi² {stat:.2}");
    }
}

/// Exact speculative sampling with a deterministic draft: over 100k single-draft blocks, the first
/// emitted token has the sampler's distribution, for a draft that is likely (id 0), unlikely (id 3)
/// and one the sampler cannot pick (id 5, outside top-k or cut by min-p). Pearson's chi-square
/// must stay below the critical value at p = 0.01 for df = (tokens the sampler can pick) − 1: 11.345
/// for df 3, 13.277 for df 4. The draft is also accepted as often as the sampler would pick it
/// (within 5 standard deviations of a binomial proportion).
#[test]
fn exact_sampling_preserves_the_distribution_for_one_hot_drafts() {
    let logits = logits_of(&[0.30, 0.25, 0.20, 0.12, 0.08, 0.05]);
    for (si, (p, expected)) in settings().into_iter().enumerate() {
        for x in [0u32, 3, 5] {
            let (counts, accepted) = first_tokens(
                &logits,
                &p,
                DRAWS,
                100 + si as u64 * 10 + x as u64,
                || draft(&[x]),
                |d, rows, s, p| exact(d, rows, s, p).unwrap(),
            );
            let (stat, df) = chi_square(&counts, &expected);
            let critical = CHI2_CRITICAL_P01[df - 1];
            assert!(
                stat < critical,
                "setting {si}, draft {x}: chi² {stat:.3} ≥ {critical} (df {df}), counts {counts:?}"
            );
            let rate = accepted as f64 / DRAWS as f64;
            let e = expected[x as usize];
            let tol = 5.0 * (e * (1.0 - e) / DRAWS as f64).sqrt() + 1e-12;
            assert!(
                (rate - e).abs() <= tol,
                "setting {si}, draft {x}: accepted {rate:.4}, p(x) {e:.4}"
            );
        }
    }
}

/// The general rule, for a drafter that samples its tokens from q: x ~ q (a q that puts mass on
/// tokens the sampler cannot pick), accept with min(1, p/q), else draw from max(0, p − q). The first
/// token has the sampler's distribution (chi-square at p = 0.01, df 3: 11.345).
#[test]
fn exact_sampling_preserves_the_distribution_for_sampled_drafts() {
    let logits = logits_of(&[0.30, 0.25, 0.20, 0.12, 0.08, 0.05]);
    let (p, expected) = settings().remove(0);
    let q = [0.1f32, 0.1, 0.3, 0.1, 0.2, 0.2];
    let mut drafter_rng = Xorshift64Star::new(77);
    let (counts, _) = first_tokens(
        &logits,
        &p,
        DRAWS,
        31,
        || {
            let u = drafter_rng.next_unit_f32();
            let mut acc = 0.0;
            let x = q.iter().position(|&w| {
                acc += w;
                u < acc
            });
            Draft {
                tokens: vec![x.unwrap_or(5) as u32],
                q: q.to_vec(),
            }
        },
        |d, rows, s, p| exact(d, rows, s, p).unwrap(),
    );
    let (stat, df) = chi_square(&counts, &expected);
    assert!(
        stat < CHI2_CRITICAL_P01[df - 1],
        "chi² {stat:.3} (df {df}), counts {counts:?}"
    );
}

/// The test can fail: rules that do not preserve the distribution exceed the critical value by far.
/// Always accepting the draft emits it every time; accepting with p(x) but redrawing from the whole
/// of p on rejection (x not removed) makes x too likely: p + (1 − p)·p = 0.571 instead of 0.345.
#[test]
fn the_chi_square_test_rejects_wrong_rules() {
    let logits = logits_of(&[0.30, 0.25, 0.20, 0.12, 0.08, 0.05]);
    let (p, expected) = settings().remove(0);
    let critical = CHI2_CRITICAL_P01[2];
    let (always, _) = first_tokens(
        &logits,
        &p,
        DRAWS,
        5,
        || draft(&[0]),
        |d, _, _, _| Outcome {
            accepted: d.len(),
            next: 0,
        },
    );
    let (stat, _) = chi_square(&always, &expected);
    assert!(stat > 100.0 * critical, "always-accept chi² only {stat:.1}");
    let (redraw_from_p, _) = first_tokens(
        &logits,
        &p,
        DRAWS,
        6,
        || draft(&[0]),
        |d, rows, s, p| {
            let mut dist = s.distribution(rows.row(0), p);
            if dist.uniform() < dist.probability(d.tokens[0]) {
                Outcome { accepted: 1, next: 0 }
            } else {
                Outcome {
                    accepted: 0,
                    next: dist.draw(),
                }
            }
        },
    );
    let (stat, _) = chi_square(&redraw_from_p, &expected);
    assert!(stat > 100.0 * critical, "redraw-from-p chi² only {stat:.1}");
}

/// A small deterministic stand-in for the target: logits over 24 tokens from a hash of the last
/// three tokens, peaked enough that sampling often repeats itself.
fn target_logits(history: &[u32]) -> Vec<f32> {
    let tail = &history[history.len().saturating_sub(3)..];
    let seed = tail
        .iter()
        .fold(0x1234_5678u64, |h, &t| (h ^ t as u64).wrapping_mul(0x100_0000_01b3));
    let mut rng = Xorshift64Star::new(seed);
    (0..24).map(|_| (rng.next_u64() % 1000) as f32 / 200.0).collect()
}

/// With the block's logits equal to plain decoding's, exact speculative sampling emits plain
/// sampling's tokens for the same seed: 300 tokens, on the id-order and the sorted paths, with drafts
/// that are right 70% of the time (the replay drafter over the plain output). Acceptances and
/// rejections both occur, so the comparison covers both branches.
#[test]
fn exact_sampling_reproduces_plain_sampling_for_the_same_seed() {
    let prompt = vec![1u32, 2, 3];
    for p in [
        params(0.8, 1.0, 0, 0.05),
        params(1.0, 0.9, 0, 0.0),
        params(0.7, 1.0, 8, 0.05),
    ] {
        let mut plain = prompt.clone();
        let mut s = Sampler::new(Some(42));
        for _ in 0..300 {
            let t = s.sample(&target_logits(&plain), &p);
            plain.push(t);
        }
        let mut replay = ReplayDrafter::new(prompt.len(), plain[prompt.len()..].to_vec(), 0.7, 24, 9).unwrap();
        let mut spec = prompt.clone();
        let mut s = Sampler::new(Some(42));
        let (mut accepted, mut rejected) = (0, 0);
        let mut d = Draft::default();
        while spec.len() < plain.len() {
            replay.propose(&spec, 5, &mut d);
            let mut h = spec.clone();
            let mut data = target_logits(&h);
            for &t in &d.tokens {
                h.push(t);
                data.extend(target_logits(&h));
            }
            let rows = BlockLogits::new(&data, 24).unwrap();
            let o = accept(SamplingRule::Exact, &d, &rows, &mut s, &p).unwrap();
            accepted += o.accepted;
            rejected += usize::from(o.accepted < d.len());
            spec.extend_from_slice(&d.tokens[..o.accepted]);
            spec.push(o.next);
        }
        assert_eq!(spec[..plain.len()], plain[..], "{p:?}");
        assert!(
            accepted > 100 && rejected > 20,
            "{p:?}: {accepted} accepted, {rejected} rejected"
        );
    }
}

#[test]
fn the_setting_names_each_rule_and_refuses_others() {
    for rule in [SamplingRule::Exact, SamplingRule::Opportunistic] {
        assert_eq!(SamplingRule::parse(rule.name()), Ok(rule));
    }
    let err = SamplingRule::parse("greedy").unwrap_err();
    assert_eq!(err, "\"greedy\" is not one of exact, opportunistic");
}
