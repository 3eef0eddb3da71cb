//! Speculative decoding's engine side (docs/speculative.md): the drafter boundary and its drafters
//! (`drafter`, `prompt_lookup`, `replay`), the rules that accept a block of drafted tokens against
//! the target's logits (`accept`), and the scheduler that decides how many tokens to draft and backs
//! off when drafting does not pay (`schedule`).
//!
//! Owns proposing tokens, judging them against logits and the draft-length policy: pure logic over
//! token ids, logits and timings. Must not evaluate the model or touch a device session or its
//! caches (`backend::`), and must not know about the clients (`tui`, `serve`, `remote`, `cli`). The
//! worker wires it into a turn once the backends have a block verifier.

pub mod accept;
pub mod drafter;
pub mod prompt_lookup;
pub mod replay;
pub mod schedule;
