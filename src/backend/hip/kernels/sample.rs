//! Builders of kernels/sample.hip: greedy and min-p sampling on the device.

use super::abi::{ARGMAX, DevPtr, SAMPLE_MIN_P};
use super::launch::{Launch, f, ptr, u};

/// Words `ds4_argmax` and `ds4_sample_min_p` write: the token id, then 1 when the host's uniform
/// draw was used (0 for greedy and for the cases where the host path draws nothing).
pub const SAMPLE_OUT_WORDS: usize = 2;

/// Blocks of the fast greedy pick (`ds4_argmax_fast`, at most kernels/sample_fast.hip
/// DS4_ARGMAX_MAX_BLOCKS): the vocabulary's 16-byte words spread over them, a few a thread.
pub const ARGMAX_FAST_BLOCKS: u32 = 32;

/// Words of the buffer the sampling kernels write (`out`): the [`SAMPLE_OUT_WORDS`], then the fast
/// greedy pick's scratch: its blocks' counter (word 2, zero before the first launch; the kernel puts
/// it back) and a (value, id) pair per block from word 4.
pub const SAMPLE_BUFFER_WORDS: usize = 4 + 2 * ARGMAX_FAST_BLOCKS as usize;

/// `ds4_argmax`: out[0] = first index of the largest logit (NaN never wins; 0 when none is above
/// -inf), the host's `sampler::argmax`. Grid (1). `out`: [`SAMPLE_BUFFER_WORDS`] words, word 2 zero
/// (the fast twin's scratch).
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
