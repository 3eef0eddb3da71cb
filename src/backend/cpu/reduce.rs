//! The block summation order the CPU reference shares bit for bit with the GPU kernels
//! (kernels/prelude.h `block_sum`, `block_sum_f64`): a sum over a long row is split over 256 lanes,
//! each lane adds its terms in index order, and the 256 lane totals fold as 8 groups of 32 lanes (a
//! butterfly inside each group: lane l adds lane l ^ o for o = 16, 8, 4, 2, 1) whose totals are then
//! added in group order.
//!
//! Float addition is not associative, so the GPU can only reproduce the CPU's numbers if both add in
//! the same order. Used for the RMSNorm sum of squares (docs/model.md#rmsnorm), where ds4 keeps one running
//! double sum: the squares are exact in double and the sum is rounded to float afterwards, so this
//! order gives ds4's float scale in all but vanishingly rare cases (the case A figures are unchanged
//! to the last digit), while a GPU block runs it with the latency of a tree.
//!
//! Owns only the orders; the terms are computed by the callers.

/// Lanes of the block sum (threads of one GPU block).
pub const LANES: usize = 256;
/// Lanes of one butterfly group (a wave32, or half a wave64).
const GROUP: usize = 32;

/// Folds the 256 lane totals in the block order (`block_sum_f64` of kernels/prelude.h; the float
/// `block_sum` folds the same way).
pub fn fold_f64(lanes: &mut [f64; LANES]) -> f64 {
    let mut total = 0.0f64;
    for g in lanes.chunks_exact_mut(GROUP) {
        let mut o = GROUP / 2;
        while o > 0 {
            for l in 0..o {
                g[l] += g[l + o];
            }
            o /= 2;
        }
        total += g[0];
    }
    total
}

/// Σ x_i² in double: element i goes to lane i % 256 (each product is exact in double).
pub fn sum_squares_f64(x: &[f32]) -> f64 {
    let mut lanes = [0.0f64; LANES];
    for (i, &v) in x.iter().enumerate() {
        lanes[i % LANES] += v as f64 * v as f64;
    }
    fold_f64(&mut lanes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fold is a butterfly inside each group of 32, then the groups in order: checked against a
    /// direct simulation of 32 lanes exchanging with lane ^ o (every lane ends with the same value).
    #[test]
    fn fold_matches_a_lane_simulation() {
        let mut v = [0.0f64; LANES];
        for (i, x) in v.iter_mut().enumerate() {
            *x = ((i * 7919 % 1013) as f64 - 500.0) * 1.0e-3 * (1.0 + (i % 7) as f64 * 1.0e15);
        }
        let mut want = 0.0f64;
        for g in v.chunks_exact(GROUP) {
            let mut lane: Vec<f64> = g.to_vec();
            for o in [16, 8, 4, 2, 1] {
                let prev = lane.clone();
                for l in 0..GROUP {
                    lane[l] = prev[l] + prev[l ^ o];
                }
            }
            assert!(lane.iter().all(|&x| x == lane[0]));
            want += lane[0];
        }
        let mut w = v;
        assert_eq!(fold_f64(&mut w).to_bits(), want.to_bits());
        // A different order gives a different double here (the test would see a reordering).
        let seq: f64 = v.iter().sum();
        assert_ne!(seq.to_bits(), want.to_bits());
    }

    #[test]
    fn sum_squares_is_exact_for_small_integers() {
        let x: Vec<f32> = (0..1000).map(|i| (i % 13) as f32).collect();
        let want: f64 = x.iter().map(|&v| (v * v) as f64).sum();
        assert_eq!(sum_squares_f64(&x), want);
    }
}
