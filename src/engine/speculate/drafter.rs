//! The drafter boundary (docs/speculative.md#drafters): what a drafter is given, what it proposes,
//! and what it hears back. One drafter per session; it proposes tokens to follow the session's
//! history and the target model judges them (`accept`).
//!
//! Owns the `Drafter` trait and the `Draft` it fills. Must not know how a proposal is verified or
//! committed: a drafter sees tokens (and, when it asks for them, the target's hidden rows), never
//! the device session.

/// A proposal: the drafted tokens and, for a drafter that samples its tokens, the distribution each
/// one was drawn from.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Draft {
    /// The proposed tokens, in order.
    pub tokens: Vec<u32>,
    /// Empty for a deterministic drafter (each token's draft distribution is one-hot at the token,
    /// as for prompt lookup and for a greedy model drafter). Otherwise `tokens.len()` rows of the
    /// vocabulary's probabilities, row-major: row i is the distribution token i was drawn from, which
    /// exact speculative sampling needs (docs/speculative.md#acceptance-rules).
    pub q: Vec<f32>,
}

impl Draft {
    /// Empty the proposal, keeping its buffers.
    pub fn clear(&mut self) {
        self.tokens.clear();
        self.q.clear();
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Keep the first `n` tokens (and their distributions).
    pub fn truncate(&mut self, n: usize) {
        if n < self.tokens.len() {
            let vocab = self.q.len() / self.tokens.len().max(1);
            self.tokens.truncate(n);
            self.q.truncate(n * vocab);
        }
    }

    /// The distribution token `i` was drawn from, when the drafter gave distributions.
    pub fn q_row(&self, i: usize) -> Option<&[f32]> {
        if self.q.is_empty() || i >= self.tokens.len() {
            return None;
        }
        let vocab = self.q.len() / self.tokens.len();
        self.q.get(i * vocab..(i + 1) * vocab)
    }
}

/// The target's verdict on a proposal, told back to the drafter.
#[derive(Clone, Copy, Debug)]
pub struct Verdict<'a> {
    /// Tokens the drafter proposed.
    pub proposed: usize,
    /// How many of them the target accepted (a prefix).
    pub accepted: usize,
    /// The token the target appended after the accepted prefix (its correction, or the bonus token
    /// when every draft was accepted).
    pub next: u32,
    /// The target's hidden rows that `Drafter::hidden_layers` asked for: one row per token the cycle
    /// committed (the pending token, then the accepted drafts), each `hidden_layers().len()` vectors
    /// of the model's width; `None` when the drafter asked for none or the backend does not capture
    /// them.
    pub hidden: Option<&'a [f32]>,
}

/// A source of draft tokens for one session.
pub trait Drafter: Send {
    /// A short name for settings, panels and logs (`ngram`, `replay`).
    fn name(&self) -> &'static str;

    /// Clear `out` and fill it with at most `max` tokens that may follow `history`: the session's
    /// tokens so far, prompt and output, in order. Proposing nothing is allowed (the engine then
    /// decodes one token as usual). The history may have been rewound and rewritten since the last
    /// call (a new turn, a retried answer); the drafter must propose for the history it is given.
    fn propose(&mut self, history: &[u32], max: usize, out: &mut Draft);

    /// The verdict on the last proposal. Drafters that read only the history ignore it.
    fn observe(&mut self, _verdict: &Verdict<'_>) {}

    /// Target layers whose output the drafter reads (a model drafter conditioned on the target's
    /// hidden states, such as DSpark reading the last blocks' residual); empty for drafters that
    /// read only tokens. Their rows arrive in `Verdict::hidden`.
    fn hidden_layers(&self) -> &[usize] {
        &[]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draft_rows_follow_the_tokens() {
        let mut d = Draft {
            tokens: vec![5, 6, 7],
            q: (0..12).map(|i| i as f32).collect(),
        };
        assert_eq!(d.q_row(1), Some(&[4.0, 5.0, 6.0, 7.0][..]));
        assert_eq!(d.q_row(3), None);
        d.truncate(2);
        assert_eq!((d.tokens.as_slice(), d.q.len()), (&[5, 6][..], 8));
        assert_eq!(d.q_row(1), Some(&[4.0, 5.0, 6.0, 7.0][..]));
        let plain = Draft {
            tokens: vec![1, 2],
            q: Vec::new(),
        };
        assert_eq!(plain.q_row(0), None);
        d.clear();
        assert!(d.is_empty() && d.q.is_empty());
    }
}
