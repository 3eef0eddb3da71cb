//! Builders of kernels/sample.hip: greedy and min-p sampling on the device.

use super::abi::{ARGMAX, DevPtr, SAMPLE_MIN_P};
use super::launch::{Launch, f, ptr, u};

/// Words `ds4_argmax` and `ds4_sample_min_p` write: the token id, then 1 when the host's uniform
/// draw was used (0 for greedy and for the cases where the host path draws nothing).
pub const SAMPLE_OUT_WORDS: usize = 2;

/// `ds4_argmax`: out[0] = first index of the largest logit (NaN never wins; 0 when none is above
/// -inf), the host's `sampler::argmax`. Grid (1).
pub fn argmax(out: DevPtr, logits: DevPtr, n: u32) -> Launch {
    Launch::new(&ARGMAX, [1, 1, 1], vec![ptr(out), ptr(logits), u(n)])
}

/// `ds4_sample_min_p`: default sampler path with the host's uniform draw u01; out[0] = id, out[1] =
/// whether the draw was used. Grid (1).
pub fn sample_min_p(out: DevPtr, logits: DevPtr, n: u32, temp: f32, min_p: f32, u01: f32) -> Launch {
    Launch::new(
        &SAMPLE_MIN_P,
        [1, 1, 1],
        vec![ptr(out), ptr(logits), u(n), f(temp), f(min_p), f(u01)],
    )
}
