//! How closely two backends agree on next-token distributions: the comparison of one logits vector
//! against a reference, and the verdict over a run of positions. Used by `selftest --backend hip
//! --forward`, the emulator tests of the HIP backend and anything else that checks a backend against
//! the CPU engine. Must not run a backend itself.
//!
//! The verdict is bitwise equality. The HIP kernels compute the CPU engine's float operations in its
//! order (kernels/prelude.h, "arithmetic contract"; the kernel suite tests/hip_kernels checks every
//! kernel bit for bit), so on the same model and tokens the device's logits are the CPU's to the bit,
//! on the emulator and on a GPU alike. Any differing bit is a defect: a kernel that left the
//! contract, a wrong launch, a stale cache row. The figures next to it (max |Δ logit|, max |Δ logprob|
//! over the reference's top 20, argmax agreement and the reference's top-2 margin) only say how far
//! off a failing position is: a lone quantizer rounding flip moves one position's distribution and
//! the positions around it agree again, while a structural mistake (RoPE, routing, a cache offset)
//! moves most positions after it by far more.

/// How many of the reference's most likely tokens the log-probability comparison covers.
pub const TOP: usize = 20;
/// Reference top-1/top-2 logit margin above which an argmax difference counts as a confident flip
/// (reported, to tell a near tie from a real disagreement).
pub const CONFIDENT_MARGIN: f32 = 1.0;

/// Comparison of one logits vector with the reference's.
#[derive(Clone, Copy, Debug)]
pub struct LogitDiff {
    /// Max |Δ logit| over the whole vocabulary.
    pub max_logit: f64,
    /// Max |Δ logprob| over the reference's top [`TOP`].
    pub max_logprob: f64,
    /// Reference top-1 minus top-2 logit.
    pub ref_margin: f32,
    /// Whether both pick the same argmax.
    pub same_argmax: bool,
    /// Whether every logit has the reference's bits.
    pub identical: bool,
}

impl LogitDiff {
    /// The argmax differs although the reference was confident.
    pub fn confident_flip(&self) -> bool {
        !self.same_argmax && self.ref_margin > CONFIDENT_MARGIN
    }
}

fn log_sum_exp(x: &[f32]) -> f64 {
    let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    m + x.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln()
}

/// Indices of the `k` largest values, largest first.
pub fn top_k(x: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..x.len()).collect();
    let k = k.min(x.len());
    if k == 0 {
        return Vec::new();
    }
    idx.select_nth_unstable_by(k - 1, |&a, &b| x[b].total_cmp(&x[a]));
    idx.truncate(k);
    idx.sort_by(|&a, &b| x[b].total_cmp(&x[a]));
    idx
}

/// Compare `other` with `reference` (same vocabulary). NaN anywhere counts as an infinite difference.
pub fn compare_logits(other: &[f32], reference: &[f32]) -> LogitDiff {
    assert_eq!(other.len(), reference.len(), "logits of different vocabularies");
    assert!(reference.len() >= 2, "need at least two logits");
    let worst = |a: f64, b: f64| if b.is_nan() { f64::INFINITY } else { a.max(b) };
    let max_logit = other
        .iter()
        .zip(reference)
        .map(|(&g, &c)| (g as f64 - c as f64).abs())
        .fold(0.0, worst);
    let (lo, lr) = (log_sum_exp(other), log_sum_exp(reference));
    let top = top_k(reference, TOP);
    let max_logprob = top
        .iter()
        .map(|&i| ((other[i] as f64 - lo) - (reference[i] as f64 - lr)).abs())
        .fold(0.0, worst);
    LogitDiff {
        max_logit,
        max_logprob,
        ref_margin: reference[top[0]] - reference[top[1]],
        same_argmax: top_k(other, 1)[0] == top[0],
        identical: other.iter().zip(reference).all(|(a, b)| a.to_bits() == b.to_bits()),
    }
}

/// The comparisons of a run of positions, and its verdict.
#[derive(Clone, Debug, Default)]
pub struct Agreement {
    pub positions: Vec<LogitDiff>,
}

impl Agreement {
    pub fn push(&mut self, d: LogitDiff) {
        self.positions.push(d);
    }

    fn sorted_logprob(&self) -> Vec<f64> {
        let mut v: Vec<f64> = self.positions.iter().map(|d| d.max_logprob).collect();
        v.sort_by(f64::total_cmp);
        v
    }

    pub fn median_logprob(&self) -> f64 {
        let v = self.sorted_logprob();
        if v.is_empty() { 0.0 } else { v[v.len() / 2] }
    }

    pub fn max_logprob(&self) -> f64 {
        self.sorted_logprob().last().copied().unwrap_or(0.0)
    }

    pub fn mean_logprob(&self) -> f64 {
        let n = self.positions.len().max(1) as f64;
        self.positions.iter().map(|d| d.max_logprob).sum::<f64>() / n
    }

    /// Positions whose logits are bit-identical to the reference's.
    pub fn identical(&self) -> usize {
        self.positions.iter().filter(|d| d.identical).count()
    }

    pub fn confident(&self) -> usize {
        self.positions
            .iter()
            .filter(|d| d.ref_margin > CONFIDENT_MARGIN)
            .count()
    }

    pub fn confident_flips(&self) -> usize {
        self.positions.iter().filter(|d| d.confident_flip()).count()
    }

    /// One line of figures.
    pub fn summary(&self) -> String {
        format!(
            "{} positions, {} bitwise equal; top-{TOP} |dlogprob| median {:.4} mean {:.4} max {:.4}; argmax flips {} of {} confident (margin > {CONFIDENT_MARGIN})",
            self.positions.len(),
            self.identical(),
            self.median_logprob(),
            self.mean_logprob(),
            self.max_logprob(),
            self.confident_flips(),
            self.confident()
        )
    }

    /// Ok when every position's logits are the reference's bit for bit; else the positions that
    /// differ (see the module doc). A run of no positions compared nothing and fails.
    pub fn verdict(&self) -> Result<(), String> {
        if self.positions.is_empty() {
            return Err("no positions compared".to_string());
        }
        let differ: Vec<usize> = (0..self.positions.len())
            .filter(|&p| !self.positions[p].identical)
            .collect();
        if differ.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "logits differ in bits at {} of {} positions: {:?}",
                differ.len(),
                self.positions.len(),
                &differ[..differ.len().min(12)]
            ))
        }
    }

    /// The fast arithmetic's verdict on a model's forward pass (`selftest --forward`), the fast
    /// mode's criterion for the tiny random models: from position `from` on (a greedy continuation, each
    /// position's token the reference's argmax at the one before) both pick the same argmax up to
    /// the reference's first position whose margin is below [`CONFIDENT_MARGIN`]. Ok holds the
    /// positions that agreed before it. The positions before `from` (teacher-forced) are reported,
    /// not bounded: a random tiny model turns a near tie inside the network (an expert choice)
    /// into another state for every later position, so a long teacher-forced run can flip a
    /// confident argmax far from any visible near tie (mean top-20 |Δlogprob| 0.1 to 0.6, max above
    /// 1, on the H200 and the emulator, tests/emu/fast.rs), as ds4's own CUDA path parts from its
    /// CPU path. The case A vectors' bounds are tests/cpu/vectors.rs's, on the model they were written for.
    ///
    /// Fewer than `min_steps` greedy positions before the first near tie is a failure too: the
    /// check compared too little to say anything.
    pub fn greedy_prefix_verdict(&self, from: usize, min_steps: usize) -> Result<usize, String> {
        let agreed = self.greedy_prefix(from)?;
        if agreed < min_steps {
            return Err(format!(
                "only {agreed} greedy positions before the reference's first margin < {CONFIDENT_MARGIN}, fewer than the {min_steps} this check needs"
            ));
        }
        Ok(agreed)
    }

    fn greedy_prefix(&self, from: usize) -> Result<usize, String> {
        let mut agreed = 0;
        for (p, d) in self.positions.iter().enumerate().skip(from) {
            if d.ref_margin < CONFIDENT_MARGIN {
                break;
            }
            if !d.same_argmax {
                return Err(format!(
                    "greedy argmax differs at position {p} (the reference's margin {:.3} >= {CONFIDENT_MARGIN}) after {agreed} equal",
                    d.ref_margin
                ));
            }
            agreed += 1;
        }
        Ok(agreed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wave(n: usize) -> Vec<f32> {
        (0..n).map(|i| (i as f32 * 0.37).sin() * 3.0).collect()
    }

    #[test]
    fn a_constant_shift_changes_logits_but_not_logprobs() {
        let r = wave(100);
        let shifted: Vec<f32> = r.iter().map(|x| x + 2.0).collect();
        let d = compare_logits(&shifted, &r);
        assert!((d.max_logit - 2.0).abs() < 1e-5);
        assert!(d.max_logprob < 1e-4 && d.same_argmax && !d.confident_flip());
    }

    #[test]
    fn swapping_a_confident_top_two_is_a_flip_and_nan_is_infinite() {
        let mut r = wave(100);
        (r[0], r[1]) = (10.0, 8.0); // a confident reference: the rest stay within ±3
        let mut o = r.clone();
        o.swap(0, 1);
        let d = compare_logits(&o, &r);
        assert!(!d.same_argmax && d.confident_flip() && d.max_logprob >= 2.0 - 1e-4);
        o[5] = f32::NAN;
        assert!(compare_logits(&o, &r).max_logprob.is_infinite() || compare_logits(&o, &r).max_logit.is_infinite());
    }

    #[test]
    fn verdict_is_bitwise_equality() {
        let r = wave(100);
        let mut a = Agreement::default();
        a.push(compare_logits(&r, &r));
        assert_eq!(a.verdict(), Ok(()), "{}", a.summary());
        // One ulp at one logit of one position fails, and names the position.
        let mut o = r.clone();
        o[42] = f32::from_bits(o[42].to_bits() + 1);
        a.push(compare_logits(&o, &r));
        let e = a.verdict().unwrap_err();
        assert!(e.contains("1 of 2 positions") && e.contains("[1]"), "{e}");
        assert!(!a.positions[1].identical && a.positions[1].same_argmax);
        // -0 and +0 differ in bits.
        let (z, nz) = (vec![0.0f32, 1.0], vec![-0.0f32, 1.0]);
        assert!(!compare_logits(&nz, &z).identical);
    }

    #[test]
    fn the_fast_verdict_is_the_greedy_prefix_up_to_the_first_near_tie() {
        let r = wave(100);
        let top = top_k(&r, 1)[0];
        // A confident reference (margin > 1 over the runner-up).
        let mut confident = r.clone();
        confident[top] += 5.0;
        // A near tie: the runner-up within 0.5 of the top.
        let mut tie = r.clone();
        let second = top_k(&r, 2)[1];
        tie[second] = tie[top] - 0.5;
        let mut flipped = confident.clone();
        flipped[top] -= 10.0;
        let mut small = confident.clone();
        small[7] += 1e-3;
        let mut a = Agreement::default();
        // Teacher-forced positions before `from`: a confident flip there is reported, not failed.
        a.push(compare_logits(&flipped, &confident));
        assert_eq!(a.confident_flips(), 1);
        // The greedy part: small differences agree, then the first near tie ends the check, so the
        // confident flip after it does not count.
        a.push(compare_logits(&small, &confident));
        a.push(compare_logits(&confident, &confident));
        a.push(compare_logits(&tie, &tie));
        a.push(compare_logits(&flipped, &confident));
        assert_eq!(a.greedy_prefix_verdict(1, 2), Ok(2), "{}", a.summary());
        // Asking for more equal steps than came before the near tie fails.
        let e = a.greedy_prefix_verdict(1, 3).unwrap_err();
        assert!(
            e.contains("only 2 greedy positions") && e.contains("the 3 this check needs"),
            "{e}"
        );
        // From 0 the teacher-forced flip is in the greedy part: it fails and names the position.
        let e = a.greedy_prefix_verdict(0, 1).unwrap_err();
        assert!(e.contains("position 0") && e.contains("after 0 equal"), "{e}");
        // A confident flip before any near tie fails.
        let mut b = Agreement::default();
        b.push(compare_logits(&small, &confident));
        b.push(compare_logits(&flipped, &confident));
        let e = b.greedy_prefix_verdict(0, 1).unwrap_err();
        assert!(e.contains("position 1") && e.contains("after 1 equal"), "{e}");
        // Nothing to compare from past the end: a failure, not a vacuous pass.
        assert!(b.greedy_prefix_verdict(5, 1).is_err());
        // Nor does an empty run pass the bitwise verdict.
        assert_eq!(Agreement::default().verdict(), Err("no positions compared".to_string()));
    }
}
