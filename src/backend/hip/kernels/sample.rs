//! Builders of kernels/sample.hip: greedy and min-p sampling on the device.

use super::abi::{ARGMAX, DevPtr, SAMPLE_MIN_P, SAMPLE_MIN_P_DRAW_FAST, SAMPLE_MIN_P_MAX_FAST};
use super::launch::{Launch, f, ptr, u};

/// Words `ds4_argmax` and `ds4_sample_min_p` write: the token id, then 1 when the host's uniform
/// draw was used (0 for greedy and for the cases where the host path draws nothing).
pub const SAMPLE_OUT_WORDS: usize = 2;

/// Blocks of the fast sampling launches (`ds4_argmax_fast`, `ds4_sample_min_p_*_fast`; at most
/// kernels/sample_fast.hip DS4_SAMPLE_MAX_BLOCKS): the vocabulary spread over them, a few 16-byte
/// words a thread.
pub const SAMPLE_FAST_BLOCKS: u32 = 32;

/// Words of the buffer the sampling kernels write (`out`): the [`SAMPLE_OUT_WORDS`], then the fast
/// kernels' scratch (kernels/sample_fast.hip): their blocks' counter (word 2, zero before the first
/// launch; each launch puts it back), the min-p draw's first finite maximum (word 3) and four words
/// per block from word 4.
pub const SAMPLE_BUFFER_WORDS: usize = 4 + 4 * SAMPLE_FAST_BLOCKS as usize;

/// The word of the sampling buffer that counts the fast launches' finished blocks: zero before the
/// first launch, and each launch's last block puts it back to zero.
pub const SAMPLE_COUNTER_WORD: usize = 2;

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

/// The fast form of [`sample_min_p`] (kernels/sample_fast.hip): the first finite maximum over
/// [`SAMPLE_FAST_BLOCKS`] blocks, then the draw over as many; the same arguments, `out` of
/// [`SAMPLE_BUFFER_WORDS`] words with word 2 zero. Its sums are taken in another order than the
/// exact kernel's, so a draw may differ only within float rounding of a boundary between two ids.
pub fn sample_min_p_fast(out: DevPtr, logits: DevPtr, n: u32, temp: f32, min_p: f32, u01: f32) -> [Launch; 2] {
    let exact = sample_min_p(out, logits, n, temp, min_p, u01);
    let grid = [SAMPLE_FAST_BLOCKS, 1, 1];
    [&SAMPLE_MIN_P_MAX_FAST, &SAMPLE_MIN_P_DRAW_FAST].map(|k| Launch::new(k, grid, exact.args.clone()))
}
