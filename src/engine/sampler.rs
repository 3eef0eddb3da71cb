//! Next-token sampling with ds4's exact semantics (docs/sampler.md).
//!
//! Owns the xorshift64* generator and the three sampling paths (greedy, id-ordered full vocabulary,
//! sorted top-k/top-p), and which of them a backend may run on its device instead
//! (`device_request` / `accept_device`: greedy and the id-ordered path, with the draw taken here so
//! the generator advances exactly as on the host). Must not evaluate the model or touch sessions:
//! logits in, one token id out.
//!
//! Matching ds4 draw for draw matters: with the same seed and the same logits, `ds4 --seed S` and
//! `ds4-chat run --seed S` pick the same tokens. So the arithmetic mirrors ds4's: weights are f32
//! `exp((logit - max) / T)`, sums are f32 accumulated in the stated order, and the uniform draw is
//! the top 24 bits of the generator output.

use crate::backend::{DevicePick, DeviceSample};
use crate::engine::events::SamplingParams;

/// Most candidates the top-k path keeps (ds4 caps `top_k` the same way).
pub const MAX_TOP_K: u32 = 1024;

/// The xorshift64* generator ds4 samples with (docs/sampler.md#generator).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Xorshift64Star {
    state: u64,
}

impl Xorshift64Star {
    /// A zero state is legal here: it is replaced by the golden-ratio constant on first use, as in ds4.
    pub fn new(seed: u64) -> Self {
        Xorshift64Star { state: seed }
    }

    /// A seed from the clock and the process id, for runs without `--seed`.
    pub fn seed_from_time() -> u64 {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        now.as_secs() ^ ((std::process::id() as u64) << 32) ^ (now.subsec_nanos() as u64)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = if self.state == 0 {
            0x9e37_79b9_7f4a_7c15
        } else {
            self.state
        };
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.state = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [0, 1) with 24 bits of resolution (bits 40..64 of the output).
    pub fn next_unit_f32(&mut self) -> f32 {
        let bits = (self.next_u64() >> 40) & 0x00ff_ffff;
        bits as f32 / 16_777_216.0
    }
}

/// Index of the first maximal logit (NaN never wins; all `-inf`/NaN gives 0), as ds4's greedy pick.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0u32;
    let mut best_v = f32::NEG_INFINITY;
    for (i, &v) in logits.iter().enumerate() {
        if v > best_v {
            best_v = v;
            best = i as u32;
        }
    }
    best
}

#[derive(Clone, Copy, Debug)]
struct Candidate {
    id: u32,
    logit: f32,
    weight: f32,
}

/// Descending logit, ties to the lower id. This is the order ds4's top-k insertion produces, and the
/// order of its qsort on glibc ≤ 2.36 (a stable merge sort there; C does not promise an order for ties,
/// so other C libraries may differ; docs/sampler.md#sorted-paths).
fn by_logit_desc(a: &Candidate, b: &Candidate) -> std::cmp::Ordering {
    b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id))
}

/// The device form of one `Sampler::sample` call (see `Sampler::device_request`).
#[derive(Clone, Debug)]
pub struct DeviceRequest {
    /// What the backend computes on its device.
    pub how: DeviceSample,
    /// The generator after the uniform draw in `how`, kept when the device used the draw.
    after: Xorshift64Star,
}

/// The knobs of `Sampler::sample` after ds4's normalisation: out-of-range values mean "off".
fn knobs(params: &SamplingParams) -> (f32, f32) {
    let top_p = if params.top_p > 0.0 && params.top_p <= 1.0 {
        params.top_p
    } else {
        1.0
    };
    let min_p = if params.min_p > 0.0 { params.min_p } else { 0.0 };
    (top_p, min_p)
}

/// A sampler with its own generator and a reusable candidate buffer (no allocation per token once the
/// buffer has grown to the vocabulary size).
#[derive(Clone, Debug)]
pub struct Sampler {
    rng: Xorshift64Star,
    scratch: Vec<Candidate>,
}

impl Sampler {
    /// `None` seeds from the clock and pid (docs/sampler.md#defaults).
    pub fn new(seed: Option<u64>) -> Self {
        Sampler {
            rng: Xorshift64Star::new(seed.unwrap_or_else(Xorshift64Star::seed_from_time)),
            scratch: Vec::new(),
        }
    }

    /// Pick the next token from `logits` under `params` (docs/sampler.md#sampling-paths).
    pub fn sample(&mut self, logits: &[f32], params: &SamplingParams) -> u32 {
        let temperature = params.temperature;
        if temperature <= 0.0 || temperature.is_nan() {
            return argmax(logits);
        }
        // Out-of-range knobs fall back to "off", as in ds4.
        let (top_p, min_p) = knobs(params);
        if params.top_k == 0 {
            if top_p >= 1.0 {
                self.sample_id_order(logits, temperature, min_p)
            } else {
                self.sample_sorted_full(logits, temperature, top_p, min_p)
            }
        } else {
            let k = params.top_k.min(MAX_TOP_K).min(logits.len() as u32) as usize;
            self.sample_top_k(logits, temperature, k, top_p, min_p)
        }
    }

    /// The device form of `sample(logits, params)` when the path needs no sort: greedy, and the
    /// id-ordered path (top_k off, top_p 1), whose uniform draw is taken from a copy of the
    /// generator. `None` for the sorted paths (sample on the host). Give the backend's pick to
    /// `accept_device`.
    pub fn device_request(&self, params: &SamplingParams) -> Option<DeviceRequest> {
        let temperature = params.temperature;
        if temperature <= 0.0 || temperature.is_nan() {
            return Some(DeviceRequest {
                how: DeviceSample::Greedy,
                after: self.rng.clone(),
            });
        }
        let (top_p, min_p) = knobs(params);
        if params.top_k != 0 || top_p < 1.0 {
            return None;
        }
        let mut after = self.rng.clone();
        let u01 = after.next_unit_f32();
        Some(DeviceRequest {
            how: DeviceSample::MinP {
                temperature,
                min_p,
                u01,
            },
            after,
        })
    }

    /// The token the device picked for `req`, advancing the generator as `sample` would have: by
    /// the one draw when the host path draws (it does not when no logit is finite or no token is
    /// kept, which the device reports).
    pub fn accept_device(&mut self, req: DeviceRequest, pick: DevicePick) -> u32 {
        if pick.drew {
            self.rng = req.after;
        }
        pick.token
    }

    /// Default path (top_k off, top_p 1): weights relative to the top token, tokens whose weight is
    /// below `min_p` dropped, and the draw walks ids in increasing order (not sorted;
    /// docs/sampler.md#id-order-path).
    fn sample_id_order(&mut self, logits: &[f32], temperature: f32, min_p: f32) -> u32 {
        let Some((best, max_logit)) = finite_max(logits) else {
            return argmax(logits);
        };
        let surely_below = SurelyBelow::new(min_p);
        // One pass keeps the surviving (id, weight) pairs in id order; the sum and the walk then use
        // exactly the weights and order ds4 uses.
        let sum = self.weigh_finite(logits, max_logit, temperature, |x| {
            if surely_below.skips(x) {
                return None;
            }
            let w = x.exp();
            (w >= min_p).then_some(w)
        });
        if !(sum > 0.0 && sum.is_finite()) {
            return best;
        }
        let mut r = self.rng.next_unit_f32() * sum;
        for c in &self.scratch {
            r -= c.weight;
            if r <= 0.0 {
                return c.id;
            }
        }
        best
    }

    /// Fill the scratch, in id order, with the finite tokens that `weight` keeps: it gets
    /// x = (logit − max_logit) / temperature and gives the token's weight, or `None` to drop it.
    /// Returns the sum of the kept weights, added in id order.
    fn weigh_finite(
        &mut self,
        logits: &[f32],
        max_logit: f32,
        temperature: f32,
        weight: impl Fn(f32) -> Option<f32>,
    ) -> f32 {
        self.scratch.clear();
        let mut sum = 0.0f32;
        for (i, &v) in logits.iter().enumerate() {
            if !v.is_finite() {
                continue;
            }
            if let Some(w) = weight((v - max_logit) / temperature) {
                self.scratch.push(Candidate {
                    id: i as u32,
                    logit: v,
                    weight: w,
                });
                sum += w;
            }
        }
        sum
    }

    /// top_k off, top_p < 1: all finite tokens sorted by logit; the normaliser is the whole vocabulary.
    fn sample_sorted_full(&mut self, logits: &[f32], temperature: f32, top_p: f32, min_p: f32) -> u32 {
        let Some((best, max_logit)) = finite_max(logits) else {
            return argmax(logits);
        };
        let sum = self.weigh_finite(logits, max_logit, temperature, |x| Some(x.exp()));
        if !(sum > 0.0 && sum.is_finite()) {
            return best;
        }
        // The min_p cut stops at the first candidate whose weight is below min_p times the top weight
        // (exp(0) = 1), and those come last in sorted order: leave out the ones clearly below (by a
        // relative 1e-4, far above f32 rounding) before sorting; the top token always stays. The sum
        // above already counted them, as ds4's does.
        let keep_from = min_p * (1.0 - 1e-4);
        self.scratch.retain(|c| c.weight >= keep_from || c.logit == max_logit);
        self.scratch.sort_unstable_by(by_logit_desc);
        self.draw_sorted(sum, top_p, min_p).unwrap_or(best)
    }

    /// top_k > 0: the k highest logits (ties to the lower id), normalised over those k only, then the
    /// same min_p/top_p cut and sorted draw as the top_p path.
    fn sample_top_k(&mut self, logits: &[f32], temperature: f32, k: usize, top_p: f32, min_p: f32) -> u32 {
        self.scratch.clear();
        self.scratch.extend(
            logits
                .iter()
                .enumerate()
                .filter(|(_, v)| v.is_finite())
                .map(|(i, &v)| Candidate {
                    id: i as u32,
                    logit: v,
                    weight: 0.0,
                }),
        );
        if self.scratch.is_empty() || k == 0 {
            return argmax(logits);
        }
        let k = k.min(self.scratch.len());
        if k < self.scratch.len() {
            self.scratch.select_nth_unstable_by(k - 1, by_logit_desc);
            self.scratch.truncate(k);
        }
        self.scratch.sort_unstable_by(by_logit_desc);
        let max_logit = self.scratch[0].logit;
        let mut sum = 0.0f32;
        for c in self.scratch.iter_mut() {
            c.weight = ((c.logit - max_logit) / temperature).exp();
            sum += c.weight;
        }
        let first = self.scratch[0].id;
        if !(sum > 0.0 && sum.is_finite()) {
            return first;
        }
        self.draw_sorted(sum, top_p, min_p).unwrap_or(first)
    }

    /// Cut the sorted `scratch` (keep the first; then keep while the probability is at least
    /// `min_p` times the top one, stopping once the kept mass reaches `top_p`, inclusive) and draw in
    /// sorted order. `None` when nothing is kept.
    fn draw_sorted(&mut self, sum: f32, top_p: f32, min_p: f32) -> Option<u32> {
        let first = self.scratch.first()?;
        let min_prob = (first.weight / sum) * min_p;
        let mut kept_sum = 0.0f32;
        let mut kept = 0usize;
        for (i, c) in self.scratch.iter().enumerate() {
            if i > 0 && c.weight / sum < min_prob {
                break;
            }
            kept_sum += c.weight;
            kept += 1;
            if kept_sum / sum >= top_p {
                break;
            }
        }
        if kept == 0 {
            return None;
        }
        let mut r = self.rng.next_unit_f32() * kept_sum;
        for c in &self.scratch[..kept] {
            r -= c.weight;
            if r <= 0.0 {
                return Some(c.id);
            }
        }
        Some(self.scratch[kept - 1].id)
    }
}

/// A cheap, conservative pre-check for "exp(x) < min_p": true only when x is below ln(min_p) by a margin
/// far larger than exp's rounding error, so skipping the exact test never changes a decision.
struct SurelyBelow {
    ln_min_p: f32,
}

impl SurelyBelow {
    fn new(min_p: f32) -> Self {
        SurelyBelow {
            ln_min_p: if min_p > 0.0 {
                min_p.ln() - 1e-3
            } else {
                f32::NEG_INFINITY
            },
        }
    }

    fn skips(&self, x: f32) -> bool {
        x < self.ln_min_p
    }
}

/// First index of the largest finite logit and its value; `None` when no logit is finite.
fn finite_max(logits: &[f32]) -> Option<(u32, f32)> {
    let mut best: Option<(u32, f32)> = None;
    for (i, &v) in logits.iter().enumerate() {
        if v.is_finite() && best.is_none_or(|(_, b)| v > b) {
            best = Some((i as u32, v));
        }
    }
    best
}

#[cfg(test)]
mod tests {
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
}
