//! The replay drafter: a measurement tool for benchmarks, not a way to speed anything up
//! (docs/speculative.md#replay-drafter). It knows the continuation the target will produce (a
//! plain greedy run's output) and proposes it with a chosen per-token acceptance a: each proposed
//! token is the true next token with probability a and a token the target cannot accept otherwise.
//! Against the greedy acceptance rule the measured per-token acceptance is then a, which isolates
//! the verify pass's speed from the quality of a real drafter.
//!
//! Owns the known continuation and its seeded generator. Must not be offered as a chat setting.

use super::drafter::{Draft, Drafter};
use crate::engine::sampler::Xorshift64Star;

/// Proposes a known continuation, each token kept with probability `acceptance`.
pub struct ReplayDrafter {
    prompt_len: usize,
    continuation: Vec<u32>,
    acceptance: f64,
    vocab: u32,
    rng: Xorshift64Star,
}

impl ReplayDrafter {
    /// `continuation`: the tokens the target produces after the `prompt_len` prompt tokens;
    /// `acceptance` in [0, 1]; `vocab`: the model's vocabulary size (wrong tokens are drawn from it);
    /// `seed`: the generator's seed, so that a benchmark is repeatable.
    pub fn new(
        prompt_len: usize,
        continuation: Vec<u32>,
        acceptance: f64,
        vocab: u32,
        seed: u64,
    ) -> Result<ReplayDrafter, String> {
        if !(0.0..=1.0).contains(&acceptance) {
            return Err(format!("replay acceptance {acceptance}: must be between 0 and 1"));
        }
        if vocab < 2 {
            return Err(format!(
                "replay drafter: a vocabulary of {vocab} tokens has no wrong token"
            ));
        }
        if let Some(&t) = continuation.iter().find(|&&t| t >= vocab) {
            return Err(format!(
                "replay continuation token {t} is outside the vocabulary of {vocab}"
            ));
        }
        Ok(ReplayDrafter {
            prompt_len,
            continuation,
            acceptance,
            vocab,
            rng: Xorshift64Star::new(seed),
        })
    }
}

/// Uniform in [0, 1) with 53 bits, so that the acceptance is met to double precision.
fn unit(rng: &mut Xorshift64Star) -> f64 {
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

impl Drafter for ReplayDrafter {
    fn name(&self) -> &'static str {
        "replay"
    }

    /// Nothing when the history has left the known continuation (its last token differs from the
    /// continuation's) or has reached its end.
    fn propose(&mut self, history: &[u32], max: usize, out: &mut Draft) {
        out.clear();
        let Some(done) = history.len().checked_sub(self.prompt_len) else {
            return;
        };
        if done > 0 && self.continuation.get(done - 1) != history.last() {
            return;
        }
        let upcoming = self.continuation.get(done..).unwrap_or(&[]);
        for &truth in upcoming.iter().take(max) {
            let token = if unit(&mut self.rng) < self.acceptance {
                truth
            } else {
                // Any of the other vocab − 1 tokens, uniformly.
                let offset = 1 + (self.rng.next_u64() % (self.vocab as u64 - 1)) as u32;
                ((truth as u64 + offset as u64) % self.vocab as u64) as u32
            };
            out.tokens.push(token);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Run the drafter against its own continuation as a greedy verifier would: accept the leading
    /// tokens equal to the truth, then append the true next token. Returns (accepted, compared)
    /// drafts, where a draft is compared when every draft before it in its block was accepted.
    fn measure(acceptance: f64, block: usize, tokens: usize, seed: u64) -> (usize, usize) {
        let vocab = 1000;
        let mut source = Xorshift64Star::new(seed ^ 0x5555);
        let prompt: Vec<u32> = (0..7).map(|_| (source.next_u64() % vocab as u64) as u32).collect();
        let continuation: Vec<u32> = (0..tokens).map(|_| (source.next_u64() % vocab as u64) as u32).collect();
        let mut d = ReplayDrafter::new(prompt.len(), continuation.clone(), acceptance, vocab, seed).unwrap();
        let mut history = prompt.clone();
        let (mut accepted, mut compared) = (0, 0);
        let mut draft = Draft::default();
        while history.len() < prompt.len() + tokens {
            let done = history.len() - prompt.len();
            d.propose(&history, block, &mut draft);
            assert_eq!(draft.len(), block.min(tokens - done));
            assert!(draft.tokens.iter().all(|&t| t < vocab));
            let ok = draft
                .tokens
                .iter()
                .zip(&continuation[done..])
                .take_while(|(a, b)| a == b)
                .count();
            accepted += ok;
            compared += (ok + 1).min(draft.len());
            let next = (done + ok + 1).min(tokens);
            history.extend_from_slice(&continuation[done..next]);
        }
        (accepted, compared)
    }

    /// Each compared draft is an independent trial kept with probability a, so the measured rate
    /// accepted / compared has standard deviation √(a(1 − a)/compared); the test allows 5 of them
    /// (a false failure has odds below 1e-6), and the extremes 0 and 1 are exact.
    #[test]
    fn measured_acceptance_is_the_chosen_one() {
        for (a, seed) in [(0.6, 1), (0.8, 2), (0.95, 3), (0.3, 4)] {
            let (accepted, compared) = measure(a, 5, 100_000, seed);
            let rate = accepted as f64 / compared as f64;
            let tol = 5.0 * (a * (1.0 - a) / compared as f64).sqrt();
            assert!(compared > 30_000, "{compared} compared drafts at a = {a}");
            assert!(
                (rate - a).abs() <= tol,
                "a = {a}: measured {rate:.4} ± {tol:.4} over {compared} drafts"
            );
        }
        // a = 1: blocks of 5 accepted drafts and a bonus token, 166 of them (996 tokens), then 4
        // accepted drafts reach the end.
        assert_eq!(measure(1.0, 5, 1000, 5), (834, 834));
        let (accepted, compared) = measure(0.0, 5, 1000, 6);
        assert_eq!((accepted, compared), (0, 1000));
    }

    #[test]
    fn off_the_continuation_it_proposes_nothing() {
        let mut d = ReplayDrafter::new(2, vec![5, 6, 7, 8], 1.0, 10, 1).unwrap();
        let mut out = Draft::default();
        d.propose(&[1, 2], 3, &mut out);
        assert_eq!(out.tokens, [5, 6, 7]);
        d.propose(&[1, 2, 5, 6], 3, &mut out);
        assert_eq!(out.tokens, [7, 8]);
        // The target wrote 9 where the continuation has 6.
        d.propose(&[1, 2, 5, 9], 3, &mut out);
        assert!(out.is_empty());
        d.propose(&[1], 3, &mut out);
        assert!(out.is_empty());
        d.propose(&[1, 2, 5, 6, 7, 8], 3, &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn bad_settings_are_refused() {
        assert!(
            ReplayDrafter::new(0, vec![1], 1.5, 10, 1)
                .err()
                .unwrap()
                .contains("between 0 and 1")
        );
        assert!(ReplayDrafter::new(0, vec![1], f64::NAN, 10, 1).is_err());
        assert!(
            ReplayDrafter::new(0, vec![1], 0.5, 1, 1)
                .err()
                .unwrap()
                .contains("no wrong token")
        );
        assert!(
            ReplayDrafter::new(0, vec![10], 0.5, 10, 1)
                .err()
                .unwrap()
                .contains("outside")
        );
    }
}
