//! Next-token sampling with ds4's exact semantics (docs/sampler.md).
//!
//! Owns the xorshift64* generator, the three sampling paths (greedy, id-ordered full vocabulary,
//! sorted top-k/top-p) and the processed distribution they draw from (`Distribution`, which
//! speculative sampling reads too), and which of them a backend may run on its device instead
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
        self.distribution(logits, params).draw()
    }

    /// The distribution `sample` draws from for `logits` under `params`, after temperature, top-k,
    /// top-p and min-p, with this sampler's generator for drawing from it. `sample` is this and one
    /// `Distribution::draw`; speculative sampling reads the same probabilities
    /// (docs/speculative.md#acceptance-rules).
    pub fn distribution(&mut self, logits: &[f32], params: &SamplingParams) -> Distribution<'_> {
        let pick = self.process(logits, params);
        Distribution {
            pick,
            kept: &self.scratch,
            rng: &mut self.rng,
        }
    }

    /// Fill the scratch with what the chosen path keeps, in its walk order (docs/sampler.md#sampling-paths).
    fn process(&mut self, logits: &[f32], params: &SamplingParams) -> Pick {
        let temperature = params.temperature;
        if temperature <= 0.0 || temperature.is_nan() {
            return Pick::Fixed(argmax(logits));
        }
        // Out-of-range knobs fall back to "off", as in ds4.
        let (top_p, min_p) = knobs(params);
        if params.top_k == 0 {
            if top_p >= 1.0 {
                self.process_id_order(logits, temperature, min_p)
            } else {
                self.process_sorted_full(logits, temperature, top_p, min_p)
            }
        } else {
            let k = params.top_k.min(MAX_TOP_K).min(logits.len() as u32) as usize;
            self.process_top_k(logits, temperature, k, top_p, min_p)
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
    fn process_id_order(&mut self, logits: &[f32], temperature: f32, min_p: f32) -> Pick {
        let Some((best, max_logit)) = finite_max(logits) else {
            return Pick::Fixed(argmax(logits));
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
            return Pick::Fixed(best);
        }
        Pick::Draw { sum, fallback: best }
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
    fn process_sorted_full(&mut self, logits: &[f32], temperature: f32, top_p: f32, min_p: f32) -> Pick {
        let Some((best, max_logit)) = finite_max(logits) else {
            return Pick::Fixed(argmax(logits));
        };
        let sum = self.weigh_finite(logits, max_logit, temperature, |x| Some(x.exp()));
        if !(sum > 0.0 && sum.is_finite()) {
            return Pick::Fixed(best);
        }
        // The min_p cut stops at the first candidate whose weight is below min_p times the top weight
        // (exp(0) = 1), and those come last in sorted order: leave out the ones clearly below (by a
        // relative 1e-4, far above f32 rounding) before sorting; the top token always stays. The sum
        // above already counted them, as ds4's does.
        let keep_from = min_p * (1.0 - 1e-4);
        self.scratch.retain(|c| c.weight >= keep_from || c.logit == max_logit);
        self.scratch.sort_unstable_by(by_logit_desc);
        self.cut_sorted(sum, top_p, min_p).unwrap_or(Pick::Fixed(best))
    }

    /// top_k > 0: the k highest logits (ties to the lower id), normalised over those k only, then the
    /// same min_p/top_p cut and sorted draw as the top_p path.
    fn process_top_k(&mut self, logits: &[f32], temperature: f32, k: usize, top_p: f32, min_p: f32) -> Pick {
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
            return Pick::Fixed(argmax(logits));
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
            return Pick::Fixed(first);
        }
        self.cut_sorted(sum, top_p, min_p).unwrap_or(Pick::Fixed(first))
    }

    /// Cut the sorted `scratch` (keep the first; then keep while the probability is at least
    /// `min_p` times the top one, stopping once the kept mass reaches `top_p`, inclusive), leaving the
    /// kept ones in the scratch for a draw in sorted order. `None` when nothing is kept.
    fn cut_sorted(&mut self, sum: f32, top_p: f32, min_p: f32) -> Option<Pick> {
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
        self.scratch.truncate(kept);
        Some(Pick::Draw {
            sum: kept_sum,
            fallback: self.scratch[kept - 1].id,
        })
    }
}

/// How a sampling step picks its token.
#[derive(Clone, Copy, Debug)]
enum Pick {
    /// Without a draw: greedy, or no finite logit, or no positive weight.
    Fixed(u32),
    /// `r = U · sum`, then walk the kept tokens subtracting each weight and take the first at which
    /// `r ≤ 0`; `fallback` when rounding leaves `r` above 0 after the last.
    Draw { sum: f32, fallback: u32 },
}

/// One sampling step's processed distribution (`Sampler::distribution`): the tokens it can pick with
/// their weights, in the order its draw walks them, and the sampler's generator to draw with.
pub struct Distribution<'a> {
    pick: Pick,
    kept: &'a [Candidate],
    rng: &'a mut Xorshift64Star,
}

impl Distribution<'_> {
    /// The tokens with a nonzero probability and their probabilities, in walk order: one token with
    /// probability 1 when the step picks without a draw. Every other token has probability 0.
    pub fn probabilities(&self) -> impl Iterator<Item = (u32, f32)> + '_ {
        let (fixed, draw) = match self.pick {
            Pick::Fixed(id) => (Some((id, 1.0)), None),
            Pick::Draw { sum, .. } => (None, Some(self.kept.iter().map(move |c| (c.id, c.weight / sum)))),
        };
        fixed.into_iter().chain(draw.into_iter().flatten())
    }

    /// The probability of `token` (0 when the step cannot pick it).
    pub fn probability(&self, token: u32) -> f32 {
        self.probabilities()
            .find(|&(id, _)| id == token)
            .map_or(0.0, |(_, p)| p)
    }

    /// The token `Sampler::sample` picks: one uniform draw from the generator when the step draws,
    /// none when it picks without one.
    pub fn draw(self) -> u32 {
        let (sum, fallback) = match self.pick {
            Pick::Fixed(id) => return id,
            Pick::Draw { sum, fallback } => (sum, fallback),
        };
        let mut r = self.rng.next_unit_f32() * sum;
        for c in self.kept {
            r -= c.weight;
            if r <= 0.0 {
                return c.id;
            }
        }
        fallback
    }

    /// A uniform number in [0, 1) from the sampler's generator (for rules that draw besides the
    /// token, such as speculative sampling's accept test).
    pub fn uniform(&mut self) -> f32 {
        self.rng.next_unit_f32()
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
mod tests;
