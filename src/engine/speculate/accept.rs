//! The acceptance rules (docs/speculative.md#acceptance-rules): given a block's drafted tokens and
//! the target's logits after each prefix of it, how many drafts to keep and which token to append.
//!
//! * Greedy (temperature ≤ 0): the longest prefix of the draft equal to the target's argmax, then
//!   the target's argmax after it (its correction, or a bonus token when everything was accepted).
//!   The output is plain greedy decoding's.
//! * Exact speculative sampling: the output has the sampler's distribution, token by token.
//! * Opportunistic (ds4's mode): drafts kept while they equal the argmax, then a sampled token.
//!   Faster when sampling, but it does not follow the sampling distribution.
//!
//! Owns the rules. Reads the sampler's processed distribution (`Sampler::distribution`) instead of
//! filtering logits itself. Must not evaluate the model: the logits come in.

use super::drafter::Draft;
use crate::engine::events::SamplingParams;
use crate::engine::sampler::{Distribution, Sampler, argmax};

/// How drafts are accepted when sampling (temperature > 0). Under greedy decoding both are the greedy
/// rule.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SamplingRule {
    /// Exact speculative sampling: the sampler's distribution is preserved.
    #[default]
    Exact,
    /// Drafts kept while they equal the argmax, then a sampled token; not the sampler's distribution.
    Opportunistic,
}

impl SamplingRule {
    /// The setting's value (`speculate_sampling`, `--speculate-sampling`).
    pub fn parse(s: &str) -> Result<SamplingRule, String> {
        match s {
            "exact" => Ok(SamplingRule::Exact),
            "opportunistic" => Ok(SamplingRule::Opportunistic),
            _ => Err(format!("\"{s}\" is not one of exact, opportunistic")),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            SamplingRule::Exact => "exact",
            SamplingRule::Opportunistic => "opportunistic",
        }
    }
}

/// The target's logits over a verified block, one row per position: row i follows the block's
/// first i drafts (row 0 is the logits the session had before the block), so a block of k drafts
/// has k + 1 rows.
#[derive(Clone, Copy, Debug)]
pub struct BlockLogits<'a> {
    data: &'a [f32],
    vocab: usize,
}

impl<'a> BlockLogits<'a> {
    /// `data`: the rows back to back, `vocab` logits each.
    pub fn new(data: &'a [f32], vocab: usize) -> Result<BlockLogits<'a>, String> {
        if vocab == 0 || data.is_empty() || !data.len().is_multiple_of(vocab) {
            return Err(format!(
                "block logits: {} values are not whole rows of {vocab}",
                data.len()
            ));
        }
        Ok(BlockLogits { data, vocab })
    }

    pub fn rows(&self) -> usize {
        self.data.len() / self.vocab
    }

    pub fn row(&self, i: usize) -> &'a [f32] {
        &self.data[i * self.vocab..(i + 1) * self.vocab]
    }
}

/// What a rule decided for a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// How many drafts are kept (a prefix of the block).
    pub accepted: usize,
    /// The token to append after them: the target's correction at the first rejected draft, or its
    /// bonus token after the last draft when all were kept.
    pub next: u32,
}

/// Apply the rule that `params` and `rule` call for to `draft` against `logits`.
pub fn accept(
    rule: SamplingRule,
    draft: &Draft,
    logits: &BlockLogits<'_>,
    sampler: &mut Sampler,
    params: &SamplingParams,
) -> Result<Outcome, String> {
    if params.temperature <= 0.0 || params.temperature.is_nan() {
        return greedy(&draft.tokens, logits);
    }
    match rule {
        SamplingRule::Exact => exact(draft, logits, sampler, params),
        SamplingRule::Opportunistic => opportunistic(&draft.tokens, logits, sampler, params),
    }
}

fn check_rows(draft: &[u32], logits: &BlockLogits<'_>) -> Result<(), String> {
    if logits.rows() != draft.len() + 1 {
        return Err(format!(
            "a block of {} drafts needs {} logit rows, got {}",
            draft.len(),
            draft.len() + 1,
            logits.rows()
        ));
    }
    Ok(())
}

/// The longest prefix of `draft` equal to the target's argmax, then the argmax after it
/// (`sampler::argmax`, so ties go to the lower id exactly as in plain greedy decoding).
pub fn greedy(draft: &[u32], logits: &BlockLogits<'_>) -> Result<Outcome, String> {
    check_rows(draft, logits)?;
    for (i, &x) in draft.iter().enumerate() {
        let best = argmax(logits.row(i));
        if best != x {
            return Ok(Outcome {
                accepted: i,
                next: best,
            });
        }
    }
    Ok(Outcome {
        accepted: draft.len(),
        next: argmax(logits.row(draft.len())),
    })
}

/// ds4's opportunistic rule: drafts kept while they equal the argmax, then the sampler draws the
/// next token from the logits at the first mismatch (or after the last draft).
pub fn opportunistic(
    draft: &[u32],
    logits: &BlockLogits<'_>,
    sampler: &mut Sampler,
    params: &SamplingParams,
) -> Result<Outcome, String> {
    check_rows(draft, logits)?;
    let accepted = draft
        .iter()
        .enumerate()
        .take_while(|&(i, &x)| argmax(logits.row(i)) == x)
        .count();
    Ok(Outcome {
        accepted,
        next: sampler.sample(logits.row(accepted), params),
    })
}

/// Exact speculative sampling over the sampler's processed distribution p at each position.
///
/// A deterministic draft token x (q one-hot at x) is accepted with probability p(x), and on
/// rejection the token comes from p with x removed and renormalised. That is done with one draw
/// y ~ p, the sampler's own draw, accepting x when y = x and otherwise appending y: P(accept) = p(x),
/// and a rejected y is distributed as p(y) / (1 − p(x)) over y ≠ x. The generator is spent exactly as
/// plain sampling spends it, so with the block's logits equal to plain decoding's the output is
/// plain sampling's, token for token, for the same seed.
///
/// A draft with distributions q (`Draft::q`) uses the general rule: accept x with probability
/// min(1, p(x)/q(x)), else draw from max(0, p − q) renormalised.
pub fn exact(
    draft: &Draft,
    logits: &BlockLogits<'_>,
    sampler: &mut Sampler,
    params: &SamplingParams,
) -> Result<Outcome, String> {
    check_rows(&draft.tokens, logits)?;
    for (i, &x) in draft.tokens.iter().enumerate() {
        let mut p = sampler.distribution(logits.row(i), params);
        let y = match draft.q_row(i) {
            None => p.draw(),
            Some(q) => {
                let q_x = q.get(x as usize).copied().unwrap_or(0.0) as f64;
                let p_x = p.probability(x) as f64;
                if (p.uniform() as f64) * q_x < p_x {
                    x
                } else {
                    draw_residual(p, q)
                }
            }
        };
        if y != x {
            return Ok(Outcome { accepted: i, next: y });
        }
    }
    let k = draft.tokens.len();
    Ok(Outcome {
        accepted: k,
        next: sampler.sample(logits.row(k), params),
    })
}

/// A draw from max(0, p − q) renormalised (p is zero outside its kept tokens, so only those can
/// have residual mass). When no mass is left (p ≤ q everywhere, which only rounding can cause after
/// a rejection), a draw from p.
fn draw_residual(mut p: Distribution<'_>, q: &[f32]) -> u32 {
    let residual = |(id, prob): (u32, f32)| {
        (
            id,
            (prob as f64 - q.get(id as usize).copied().unwrap_or(0.0) as f64).max(0.0),
        )
    };
    let total: f64 = p.probabilities().map(residual).map(|(_, r)| r).sum();
    if total <= 0.0 {
        return p.draw();
    }
    let mut r = p.uniform() as f64 * total;
    let mut last = None;
    for (id, mass) in p.probabilities().map(residual) {
        if mass > 0.0 {
            r -= mass;
            last = Some(id);
            if r < 0.0 {
                return id;
            }
        }
    }
    last.unwrap_or_else(|| p.draw())
}

#[cfg(test)]
mod tests;
