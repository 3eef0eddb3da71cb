//! The prompt-lookup drafter (docs/speculative.md#prompt-lookup): it proposes the continuation of
//! the longest earlier occurrence of the history's last n tokens, trying n from a maximum down to a
//! minimum; among occurrences of the same length the most recent wins. No weights: it pays where
//! the output repeats the conversation (code edits, quoting, summaries, tool output).
//!
//! Owns the n-gram index over one session's history. The index is kept up to date incrementally
//! (each appended token adds one entry per n, each rewound token removes them), so a proposal costs
//! a few hash lookups however long the history is.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use super::drafter::{Draft, Drafter};

/// Longest n-gram the drafter matches (a setting above it is refused).
pub const MAX_NGRAM: usize = 8;

/// The default n-gram lengths: a single repeated token predicts too little to be worth a verify.
pub const DEFAULT_NGRAM: (usize, usize) = (2, 4);

/// No earlier position in a chain.
const NONE: u32 = u32::MAX;

/// The n-gram keys are already well-mixed 64-bit hashes; the map only folds the high bits into the
/// low ones its buckets use.
#[derive(Default)]
struct PremixedHasher(u64);

impl Hasher for PremixedHasher {
    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 29)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | b as u64;
        }
    }

    fn write_u64(&mut self, x: u64) {
        self.0 = x;
    }
}

type ChainHeads = HashMap<u64, u32, BuildHasherDefault<PremixedHasher>>;

/// One more token into an n-gram hash (read from the n-gram's end backwards).
fn mix(h: u64, token: u32) -> u64 {
    (h.rotate_left(23) ^ token as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// The index for one n: hash chains over the end positions of every n-gram, as in zlib's matcher.
/// `heads` maps an n-gram's hash to its last end position, `prev[p]` links position p to the
/// previous end position with the same hash. Hash collisions only lengthen a chain: a lookup
/// compares the tokens before it takes a position.
struct NgramIndex {
    n: usize,
    heads: ChainHeads,
    prev: Vec<u32>,
}

impl NgramIndex {
    fn new(n: usize) -> NgramIndex {
        NgramIndex {
            n,
            heads: ChainHeads::default(),
            prev: Vec::new(),
        }
    }

    /// The hash of the n-gram ending at `end` (`end + 1 >= n`).
    fn hash(&self, tokens: &[u32], end: usize) -> u64 {
        tokens[end + 1 - self.n..=end]
            .iter()
            .rev()
            .fold(self.n as u64, |h, &t| mix(h, t))
    }

    /// Index the n-gram ending at `end`, the last token of `tokens`.
    fn push(&mut self, tokens: &[u32], end: usize) {
        debug_assert_eq!(self.prev.len(), end);
        let prev = if end + 1 >= self.n {
            let h = self.hash(tokens, end);
            self.heads.insert(h, end as u32).unwrap_or(NONE)
        } else {
            NONE
        };
        self.prev.push(prev);
    }

    /// Unindex the n-gram ending at `end`, the last indexed position (its chain head).
    fn pop(&mut self, tokens: &[u32], end: usize) {
        let prev = self.prev.pop().unwrap_or(NONE);
        if end + 1 >= self.n {
            let h = self.hash(tokens, end);
            if prev == NONE {
                self.heads.remove(&h);
            } else {
                self.heads.insert(h, prev);
            }
        }
    }

    /// The most recent end position `e < tokens.len() - 1` whose n-gram equals the history's last
    /// n tokens.
    fn latest_match(&self, tokens: &[u32]) -> Option<usize> {
        let len = tokens.len();
        if len < self.n + 1 {
            return None;
        }
        let suffix = &tokens[len - self.n..];
        let mut p = *self.heads.get(&self.hash(tokens, len - 1))?;
        while p != NONE {
            let end = p as usize;
            if end < len - 1 && tokens[end + 1 - self.n..=end] == *suffix {
                return Some(end);
            }
            p = self.prev[end];
        }
        None
    }
}

/// The prompt-lookup drafter over one session's history.
pub struct PromptLookup {
    /// The history indexed so far.
    tokens: Vec<u32>,
    /// One index per n, longest first.
    indexes: Vec<NgramIndex>,
}

impl PromptLookup {
    /// Match n-grams of `max_n` tokens down to `min_n` (1 ≤ min_n ≤ max_n ≤ `MAX_NGRAM`).
    pub fn new(min_n: usize, max_n: usize) -> Result<PromptLookup, String> {
        if !(1 <= min_n && min_n <= max_n && max_n <= MAX_NGRAM) {
            return Err(format!(
                "prompt lookup n-gram lengths {min_n}..={max_n}: need 1 ≤ min ≤ max ≤ {MAX_NGRAM}"
            ));
        }
        Ok(PromptLookup::with_lengths(min_n, max_n))
    }

    fn with_lengths(min_n: usize, max_n: usize) -> PromptLookup {
        PromptLookup {
            tokens: Vec::new(),
            indexes: (min_n..=max_n).rev().map(NgramIndex::new).collect(),
        }
    }

    /// Bring the index to `history`: keep the common prefix, unindex the rest of the old history,
    /// index the rest of the new one. Appending (the usual case) costs one entry per n per token, and
    /// checking that the history still starts with what was indexed one memory comparison.
    fn sync(&mut self, history: &[u32]) {
        let old = self.tokens.len();
        let common = if history.get(..old) == Some(&self.tokens[..]) {
            old
        } else {
            self.tokens.iter().zip(history).take_while(|(a, b)| a == b).count()
        };
        for end in (common..old).rev() {
            for index in &mut self.indexes {
                index.pop(&self.tokens, end);
            }
            self.tokens.pop();
        }
        for &t in &history[common..] {
            self.tokens.push(t);
            let end = self.tokens.len() - 1;
            for index in &mut self.indexes {
                index.push(&self.tokens, end);
            }
        }
    }
}

impl Default for PromptLookup {
    fn default() -> PromptLookup {
        PromptLookup::with_lengths(DEFAULT_NGRAM.0, DEFAULT_NGRAM.1)
    }
}

impl Drafter for PromptLookup {
    fn name(&self) -> &'static str {
        "ngram"
    }

    /// The tokens after the match, read on past the end of the history as if the text repeated with
    /// the match's period: a match ending d tokens before the last one predicts that the history goes
    /// on repeating its last d tokens (docs/speculative.md#prompt-lookup).
    fn propose(&mut self, history: &[u32], max: usize, out: &mut Draft) {
        out.clear();
        self.sync(history);
        if max == 0 {
            return;
        }
        let Some(end) = self.indexes.iter().find_map(|index| index.latest_match(&self.tokens)) else {
            return;
        };
        let len = self.tokens.len();
        for i in end + 1..end + 1 + max {
            let t = if i < len { self.tokens[i] } else { out.tokens[i - len] };
            out.tokens.push(t);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::sampler::Xorshift64Star;

    fn propose(d: &mut PromptLookup, history: &[u32], max: usize) -> Vec<u32> {
        let mut out = Draft::default();
        d.propose(history, max, &mut out);
        assert!(out.q.is_empty(), "prompt lookup is deterministic");
        out.tokens
    }

    /// The definition, by a full scan: for n from max_n down to min_n, the latest end position
    /// e < len − 1 whose n tokens equal the last n, and the periodic continuation after it.
    fn rescan(history: &[u32], min_n: usize, max_n: usize, max: usize) -> Vec<u32> {
        let len = history.len();
        for n in (min_n..=max_n).rev() {
            if len < n + 1 {
                continue;
            }
            let suffix = &history[len - n..];
            if let Some(end) = (n - 1..len - 1).rev().find(|&e| history[e + 1 - n..=e] == *suffix) {
                let mut seq = history.to_vec();
                for i in end + 1..end + 1 + max {
                    seq.push(seq[i]);
                }
                return seq[len..].to_vec();
            }
        }
        Vec::new()
    }

    /// A code edit: the function is being written out again and its earlier text is proposed.
    #[test]
    fn a_repeated_passage_is_proposed_from_its_earlier_copy() {
        // "fn add ( a , b ) { a + b }" then prose, then "fn add ( a ,".
        let code = [10, 11, 12, 13, 14, 15, 16, 17, 13, 18, 15, 19];
        let mut history: Vec<u32> = code.to_vec();
        history.extend([50, 51, 52, 53]);
        history.extend(&code[..5]);
        let mut d = PromptLookup::new(1, 4).unwrap();
        assert_eq!(propose(&mut d, &history, 5), [15, 16, 17, 13, 18]);
        // Read on through the history to its end: 16 tokens.
        assert_eq!(
            propose(&mut d, &history, 16),
            [15, 16, 17, 13, 18, 15, 19, 50, 51, 52, 53, 10, 11, 12, 13, 14]
        );
        assert_eq!(propose(&mut d, &history, 0), Vec::<u32>::new());
    }

    #[test]
    fn no_earlier_occurrence_proposes_nothing() {
        let mut d = PromptLookup::new(1, 4).unwrap();
        assert_eq!(propose(&mut d, &[1, 2, 3, 4, 5, 6], 4), Vec::<u32>::new());
        assert_eq!(propose(&mut d, &[], 4), Vec::<u32>::new());
        assert_eq!(propose(&mut d, &[7], 4), Vec::<u32>::new());
    }

    /// A match that ends right before the history's suffix reads on into the suffix and then
    /// repeats the period: [1 2 3 9 1 2 3] matches "1 2 3" at positions 0..=2, so the text after it
    /// is "9 1 2 3" and then "9" again.
    #[test]
    fn a_match_next_to_the_end_continues_with_its_period() {
        let mut d = PromptLookup::new(1, 4).unwrap();
        assert_eq!(propose(&mut d, &[1, 2, 3, 9, 1, 2, 3], 6), [9, 1, 2, 3, 9, 1]);
        // "a b a b": period 2.
        assert_eq!(propose(&mut d, &[4, 5, 4, 5], 5), [4, 5, 4, 5, 4]);
    }

    /// Overlapping repeats: in "7 7 7 7" the suffix "7 7 7" also ends one token earlier.
    #[test]
    fn overlapping_repeats_propose_the_run() {
        let mut d = PromptLookup::new(1, 4).unwrap();
        assert_eq!(propose(&mut d, &[3, 7, 7, 7, 7], 3), [7, 7, 7]);
        assert_eq!(propose(&mut d, &[7, 7], 2), [7, 7]);
    }

    /// The longest n that matches wins, and among matches of that n the most recent.
    #[test]
    fn longest_match_first_then_most_recent() {
        let mut d = PromptLookup::new(1, 4).unwrap();
        // "3 1 2" occurs at 0..=2 (followed by 5); "1 2" last occurred at 5..=6 (followed by 6).
        let h = [3, 1, 2, 5, 9, 1, 2, 6, 3, 1, 2];
        assert_eq!(propose(&mut d, &h, 2), [5, 9]);
        // Only "1 2" matches: the latest of its two occurrences.
        let h = [1, 2, 5, 1, 2, 6, 8, 1, 2];
        assert_eq!(propose(&mut d, &h, 2), [6, 8]);
    }

    /// n falls back from 4 to 2 when the longer suffixes have no earlier occurrence, and a minimum
    /// of 3 refuses the 2-token match.
    #[test]
    fn shorter_n_grams_are_tried_down_to_the_minimum() {
        let h = [1, 2, 3, 4, 9, 8, 3, 4];
        assert_eq!(propose(&mut PromptLookup::new(1, 4).unwrap(), &h, 3), [9, 8, 3]);
        assert_eq!(propose(&mut PromptLookup::new(3, 4).unwrap(), &h, 3), Vec::<u32>::new());
        assert_eq!(propose(&mut PromptLookup::new(1, 1).unwrap(), &[5, 6, 5], 2), [6, 5]);
    }

    #[test]
    fn the_default_matches_two_to_four_tokens() {
        let mut d = PromptLookup::default();
        assert_eq!(propose(&mut d, &[5, 6, 1, 2, 3, 4, 9, 2, 3, 4], 2), [9, 2]);
        assert_eq!(propose(&mut d, &[5, 6, 5], 2), Vec::<u32>::new());
    }

    #[test]
    fn bad_n_gram_lengths_are_refused() {
        for (lo, hi) in [(0, 3), (3, 2), (1, MAX_NGRAM + 1)] {
            let e = PromptLookup::new(lo, hi).err().unwrap();
            assert!(e.contains("n-gram lengths"), "{e}");
        }
    }

    /// The incremental index proposes what a full rescan of the history proposes, at every step of
    /// random histories that grow token by token, by several tokens, and are rewound and rewritten
    /// (small alphabets, so that matches of every length and long chains are common).
    #[test]
    fn incremental_index_equals_a_full_rescan() {
        let mut rng = Xorshift64Star::new(2026);
        let mut checked = 0usize;
        let mut proposed_some = 0usize;
        for round in 0..60 {
            let alphabet = 2 + (round % 5) as u64;
            let (min_n, max_n) = [(1, 4), (2, 3), (1, 8), (3, 6)][round % 4];
            let mut d = PromptLookup::new(min_n, max_n).unwrap();
            let mut history: Vec<u32> = Vec::new();
            for _ in 0..300 {
                match rng.next_u64() % 10 {
                    0 => {
                        let keep = (rng.next_u64() as usize) % (history.len() + 1);
                        history.truncate(keep);
                    }
                    1 => history.extend((0..1 + rng.next_u64() % 20).map(|_| (rng.next_u64() % alphabet) as u32)),
                    _ => history.push((rng.next_u64() % alphabet) as u32),
                }
                let max = (rng.next_u64() % 9) as usize;
                let got = propose(&mut d, &history, max);
                assert_eq!(
                    got,
                    rescan(&history, min_n, max_n, max),
                    "history {history:?}, n {min_n}..={max_n}"
                );
                checked += 1;
                proposed_some += usize::from(!got.is_empty());
            }
        }
        assert_eq!(checked, 60 * 300);
        assert!(
            proposed_some > checked / 2,
            "only {proposed_some} of {checked} steps had a match"
        );
    }

    /// A 64k-token history: each step appends a token and proposes, and the index's work per step
    /// stays one entry per n (checked by counting entries, not by timing).
    #[test]
    fn a_long_history_is_indexed_once() {
        let mut rng = Xorshift64Star::new(9);
        let mut history: Vec<u32> = (0..65_536).map(|_| (rng.next_u64() % 50_000) as u32).collect();
        let mut d = PromptLookup::new(1, 4).unwrap();
        propose(&mut d, &history, 5);
        // Repeat an earlier passage: the drafter finds it without rescanning.
        let passage = history[1000..1004].to_vec();
        history.extend_from_slice(&passage);
        assert_eq!(propose(&mut d, &history, 4), history[1004..1008]);
        assert_eq!(d.tokens.len(), history.len());
        for index in &d.indexes {
            assert_eq!(index.prev.len(), history.len());
            assert!(index.heads.len() <= history.len() + 1 - index.n);
        }
    }
}
