//! The draft-length scheduler (docs/speculative.md#scheduler): before each cycle it says how many
//! tokens to draft, 0 meaning a plain decode step, from what drafting has cost and earned so far.
//!
//! It is told the wall time of every plain step and of every verify (with the block's draft count
//! and how many drafts were accepted), and keeps running estimates of the plain step's time, the
//! verify's time for each draft count, and the per-token acceptance. A cycle of k drafts costs
//! verify(k) and yields 1 + a + a² + … + a^k tokens on average at acceptance a; the scheduler picks
//! the k with the lowest expected time per token, and drafts only while that is below a plain step
//! by a margin. When drafting does not pay it backs off: plain steps for a pause that doubles
//! after each failed probe (4, 8, … 128 cycles), then a short probe. With acceptance 0 the long-run
//! cost is one short probe per 128 plain steps, so speculation stays within a fraction of a percent
//! of plain decoding.
//!
//! Owns the timing estimates and the back-off state of one session. Must not time anything itself:
//! the caller measures and reports.

/// Weight of a new timing in the running averages.
const TIMING_WEIGHT: f64 = 0.2;
/// Decay of the acceptance counts per drafting cycle (an effective memory of about 7 cycles).
const ACCEPT_DECAY: f64 = 0.85;
/// Pseudo-counts the acceptance estimate starts from: one accepted in two compared (0.5).
const PRIOR_ACCEPTED: f64 = 1.0;
const PRIOR_COMPARED: f64 = 2.0;
/// The extra verify cost of one more drafted token, in plain steps, assumed until measured.
const PRIOR_ROW_COST: f64 = 0.25;
/// Drafting must be expected to be at least this much faster than plain decoding.
const PAY_MARGIN: f64 = 0.02;
/// The shortest and the longest back-off, in plain cycles.
const MIN_BACKOFF: u32 = 4;
pub const MAX_BACKOFF: u32 = 128;
/// Drafts in a probe after a back-off.
const PROBE_LEN: usize = 2;
/// After this many cycles without a plain step, one plain step refreshes its timing.
const REFRESH_PLAIN: u32 = 64;

/// Expected tokens a cycle yields with `k` drafts at per-token acceptance `a`: the accepted prefix
/// plus the target's own token, 1 + a + … + a^k.
pub fn expected_tokens(a: f64, k: usize) -> f64 {
    (0..=k).map(|i| a.powi(i as i32)).sum()
}

/// The draft-length policy of one session.
#[derive(Clone, Debug)]
pub struct DraftScheduler {
    max_draft: usize,
    /// Running average of a plain step's seconds.
    plain: Option<f64>,
    /// Running average of a verify's seconds, by draft count (index 0 unused).
    verify: Vec<Option<f64>>,
    /// Decayed counts of accepted and compared drafts (a draft is compared when every draft before it
    /// in its block was accepted).
    accepted: f64,
    compared: f64,
    /// Plain cycles left before the next probe.
    pause: u32,
    /// The next pause's length.
    backoff: u32,
    /// Cycles since the last plain step.
    since_plain: u32,
}

impl DraftScheduler {
    /// At most `max_draft` drafts per cycle.
    pub fn new(max_draft: usize) -> DraftScheduler {
        DraftScheduler {
            max_draft,
            plain: None,
            verify: vec![None; max_draft + 1],
            accepted: PRIOR_ACCEPTED,
            compared: PRIOR_COMPARED,
            pause: 0,
            backoff: MIN_BACKOFF,
            since_plain: 0,
        }
    }

    /// How many tokens to draft for the next cycle; 0: decode one token plainly.
    pub fn next_len(&mut self) -> usize {
        if self.plain.is_none() || self.max_draft == 0 || self.since_plain >= REFRESH_PLAIN {
            return 0;
        }
        if self.pause > 0 {
            self.pause -= 1;
            return 0;
        }
        self.best_len().unwrap_or(PROBE_LEN.min(self.max_draft))
    }

    /// A plain decode step took `secs`.
    pub fn record_plain(&mut self, secs: f64) {
        self.plain = Some(average(self.plain, secs));
        self.since_plain = 0;
    }

    /// A verify of `drafted` drafts took `secs` and `accepted` of them were kept.
    pub fn record_verify(&mut self, drafted: usize, accepted: usize, secs: f64) {
        if drafted == 0 {
            self.record_plain(secs);
            return;
        }
        let accepted = accepted.min(drafted);
        if let Some(slot) = self.verify.get_mut(drafted) {
            *slot = Some(average(*slot, secs));
        }
        let compared = if accepted < drafted { accepted + 1 } else { accepted };
        self.accepted = self.accepted * ACCEPT_DECAY + accepted as f64;
        self.compared = self.compared * ACCEPT_DECAY + compared as f64;
        self.since_plain += 1;
        if self.best_len().is_some() {
            self.backoff = MIN_BACKOFF;
        } else {
            self.pause = self.backoff;
            self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// The estimated per-token acceptance.
    pub fn acceptance(&self) -> f64 {
        self.accepted / self.compared
    }

    /// The draft count with the lowest expected time per token, when that beats a plain step by the
    /// margin.
    fn best_len(&self) -> Option<usize> {
        let step = self.plain?;
        let a = self.acceptance();
        let (k, rate) = (1..=self.max_draft)
            .map(|k| (k, expected_tokens(a, k) / self.verify_cost(k, step)))
            .max_by(|x, y| x.1.total_cmp(&y.1))?;
        (rate * step > 1.0 + PAY_MARGIN).then_some(k)
    }

    /// The expected verify time for `k` drafts: measured, or interpolated between the measured counts
    /// (a plain step standing for 0 drafts), or extrapolated past the largest with the slope of the
    /// last two (the prior slope when nothing is measured).
    fn verify_cost(&self, k: usize, step: f64) -> f64 {
        if let Some(t) = self.verify[k] {
            return t;
        }
        let point = |i: usize| if i == 0 { Some(step) } else { self.verify[i] };
        let below = (0..k).rev().find(|&i| point(i).is_some()).unwrap_or(0);
        let cost_below = point(below).unwrap_or(step);
        if let Some(above) = (k + 1..=self.max_draft).find(|&i| self.verify[i].is_some()) {
            let cost_above = point(above).unwrap_or(step);
            let f = (k - below) as f64 / (above - below) as f64;
            return cost_below + f * (cost_above - cost_below);
        }
        let slope = match (0..below).rev().find(|&i| point(i).is_some()) {
            Some(lower) => ((cost_below - point(lower).unwrap_or(step)) / (below - lower) as f64).max(0.0),
            None => PRIOR_ROW_COST * step,
        };
        cost_below + slope * (k - below) as f64
    }
}

fn average(old: Option<f64>, new: f64) -> f64 {
    match old {
        Some(old) => old + TIMING_WEIGHT * (new - old),
        None => new,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::sampler::Xorshift64Star;

    /// A simulated target: a plain step costs 1 (±3% jitter), a verify of k drafts 1 + row_cost·k
    /// (same jitter), and each draft is accepted with probability `acceptance(tokens so far)` until
    /// the first rejection.
    struct Sim {
        row_cost: f64,
        rng: Xorshift64Star,
    }

    #[derive(Debug, Default)]
    struct Run {
        tokens: usize,
        time: f64,
        drafting_cycles: usize,
        /// The drafting cycle count when the scheduler first backed off, if it did.
        first_backoff: Option<usize>,
    }

    impl Run {
        /// Throughput relative to plain decoding (1 token per unit of time).
        fn speedup(&self) -> f64 {
            self.tokens as f64 / self.time
        }
    }

    impl Sim {
        fn jitter(&mut self) -> f64 {
            1.0 + 0.06 * (self.rng.next_unit_f32() as f64 - 0.5)
        }

        fn run(&mut self, s: &mut DraftScheduler, tokens: usize, acceptance: impl Fn(usize) -> f64) -> Run {
            let mut run = Run::default();
            while run.tokens < tokens {
                let k = s.next_len();
                if k == 0 {
                    let t = self.jitter();
                    s.record_plain(t);
                    run.time += t;
                    run.tokens += 1;
                    continue;
                }
                let a = acceptance(run.tokens);
                let accepted = (0..k).take_while(|_| (self.rng.next_unit_f32() as f64) < a).count();
                let t = (1.0 + self.row_cost * k as f64) * self.jitter();
                s.record_verify(k, accepted, t);
                run.time += t;
                run.tokens += accepted + 1;
                run.drafting_cycles += 1;
                if s.pause > 0 && run.first_backoff.is_none() {
                    run.first_backoff = Some(run.drafting_cycles);
                }
            }
            run
        }
    }

    fn sim(seed: u64) -> Sim {
        Sim {
            row_cost: 0.15,
            rng: Xorshift64Star::new(seed),
        }
    }

    #[test]
    fn expected_tokens_is_the_geometric_sum() {
        assert_eq!(expected_tokens(0.0, 5), 1.0);
        assert_eq!(expected_tokens(1.0, 5), 6.0);
        assert!((expected_tokens(0.8, 5) - (1.0 - 0.8f64.powi(6)) / 0.2).abs() < 1e-12);
    }

    /// Acceptance 0: drafting stops within 6 drafting cycles, after that only probes of 2 drafts
    /// cost anything (one per at most 128 plain steps once the back-off has grown), and 4000 tokens
    /// take at most 1/0.97 of plain decoding's time. Expected: about 3 wasted cycles at 0.15 extra
    /// each and some 40 probes at 0.3 extra, under 0.5% in all.
    #[test]
    fn acceptance_zero_backs_off_and_stays_near_plain_speed() {
        for seed in 1..=5 {
            let mut s = DraftScheduler::new(8);
            let run = sim(seed).run(&mut s, 4000, |_| 0.0);
            assert!(
                run.first_backoff.is_some_and(|c| c <= 6),
                "seed {seed}: first back-off after {:?} drafting cycles",
                run.first_backoff
            );
            assert!(
                run.speedup() >= 0.97,
                "seed {seed}: {:.4}× plain ({run:?})",
                run.speedup()
            );
            assert!(run.drafting_cycles <= 6 + 45, "seed {seed}: {run:?}");
            assert!(s.acceptance() < 0.05);
        }
    }

    /// Acceptance 0.8 with a verify of k drafts costing 1 + 0.15·k steps: the best fixed block (4 or
    /// 5 drafts) gives 1 + 0.8 + … + 0.8^5 = 3.69 tokens per 1.75 steps, 2.11× plain. The scheduler
    /// must keep drafting and reach at least 1.9× over 4000 tokens (its estimates start from priors
    /// and it takes a plain step every 64 cycles to keep the plain timing fresh).
    #[test]
    fn acceptance_point_eight_keeps_drafting_and_beats_plain() {
        let best = (1..=8)
            .map(|k| expected_tokens(0.8, k) / (1.0 + 0.15 * k as f64))
            .fold(0.0, f64::max);
        assert!((best - 2.108).abs() < 0.01, "best fixed block: {best}");
        for seed in 1..=5 {
            let mut s = DraftScheduler::new(8);
            let run = sim(seed).run(&mut s, 4000, |_| 0.8);
            assert_eq!(run.first_backoff, None, "seed {seed}: backed off ({run:?})");
            assert!(
                run.speedup() >= 1.9,
                "seed {seed}: {:.3}× plain ({run:?})",
                run.speedup()
            );
        }
    }

    /// Acceptance that comes back: 0 for the first 2000 tokens, 0.9 after. The scheduler is backed
    /// off by then (a pause of at most 128 cycles), probes, resumes drafting, and the last 2000
    /// tokens run at least 1.6× plain (a fixed block of 8 would give 2.79×).
    #[test]
    fn drafting_resumes_when_acceptance_returns() {
        for seed in 1..=5 {
            let mut s = DraftScheduler::new(8);
            let mut sim = sim(seed);
            let first = sim.run(&mut s, 2000, |_| 0.0);
            assert!(first.speedup() >= 0.97, "seed {seed}: {first:?}");
            let second = sim.run(&mut s, 2000, |_| 0.9);
            assert!(
                second.speedup() >= 1.6,
                "seed {seed}: {:.3}× plain ({second:?})",
                second.speedup()
            );
        }
    }

    /// The verify-cost model: measured counts as measured, others interpolated from their measured
    /// neighbours (a plain step standing for 0 drafts) or extrapolated with the last slope.
    #[test]
    fn unmeasured_draft_counts_are_interpolated_and_extrapolated() {
        let mut s = DraftScheduler::new(8);
        assert_eq!(s.next_len(), 0, "no plain timing yet");
        s.record_plain(1.0);
        assert!((s.verify_cost(4, 1.0) - (1.0 + 4.0 * PRIOR_ROW_COST)).abs() < 1e-12);
        s.record_verify(2, 2, 1.4);
        s.record_verify(6, 6, 2.2);
        assert_eq!(s.verify_cost(2, 1.0), 1.4);
        assert!((s.verify_cost(1, 1.0) - 1.2).abs() < 1e-12);
        assert!((s.verify_cost(4, 1.0) - 1.8).abs() < 1e-12);
        assert!((s.verify_cost(8, 1.0) - 2.6).abs() < 1e-12);
        // A count above the maximum updates the acceptance but not the table.
        s.record_verify(9, 0, 5.0);
        assert_eq!(s.verify.len(), 9);
    }
}
