//! Speculative decoding on the HIP backend (its block verify, src/backend/hip/session/verify.rs) on
//! the kernel emulator in exact arithmetic, against plain decode on the same backend: the checks of
//! tests/speculative_common, tolerance zero (an exact verify is bitwise the decode steps).
//! Runs with `cargo test --release --features hip --test emu speculative::`.
#![cfg(feature = "hip")]

use std::sync::Arc;

use ds4_chat::backend::DeviceSession;
use ds4_chat::backend::hip::{HipOptions, HipSession};
use ds4_chat::model::Model;

use crate::hip_emu;
use crate::small_model::three_layer_model;
use crate::speculative_common::{CTX, check_greedy_prompt_lookup, plain_greedy};

/// Tokens generated per prompt on the emulator, and its prompts: two whose greedy continuations
/// prompt lookup drafts for (and misses) within that many tokens.
const EMU_GEN: usize = 24;
const EMU_PROMPTS: [usize; 2] = [1, 3];

fn open(model: &Arc<Model>) -> Box<dyn DeviceSession> {
    let options = HipOptions {
        prefill_chunk: 64,
        ..HipOptions::default()
    };
    let b: HipSession = hip_emu::exact_backend(model.clone(), CTX, options);
    Box::new(b)
}

#[test]
fn greedy_speculative_decode_equals_plain_decode_on_the_emulator() {
    if hip_emu::use_emulated_hip().is_none() {
        return;
    }
    let model = three_layer_model();
    let open = || open(&model);
    // The emulator runs a tiny model's pass in about a second: two prompts of EMU_GEN tokens, drafts
    // of 4. The CPU checks run 4 prompts of 256 tokens with every draft setting, the replay drafter
    // and the logprob dumps; what those rest on here, a verified block's logits and caches equal to
    // the decode steps' bit for bit, is tests/emu/verify.rs.
    let cases = plain_greedy(&open, EMU_GEN, &EMU_PROMPTS);
    check_greedy_prompt_lookup(&open, &cases, &[Some(4)]);
}
