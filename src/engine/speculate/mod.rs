//! Speculative decoding's engine side (docs/speculative.md): the drafter boundary and its drafters
//! (`drafter`, `prompt_lookup`, `replay`), the rules that accept a block of drafted tokens against
//! the target's logits (`accept`), and the scheduler that decides how many tokens to draft and backs
//! off when drafting does not pay (`schedule`).
//!
//! Owns proposing tokens, judging them against logits and the draft-length policy: pure logic over
//! token ids, logits and timings. Must not evaluate the model or touch a device session or its
//! caches (`backend::`), and must not know about the clients (`tui`, `serve`, `remote`, `cli`). The
//! decode loop that runs a cycle is `engine::generate::generate_speculative`.

pub mod accept;
pub mod drafter;
pub mod prompt_lookup;
pub mod replay;
pub mod schedule;

/// The `speculate` setting (`--speculate`, config key `speculate`): which drafter proposes tokens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Speculate {
    /// Plain decode, one token per step.
    #[default]
    Off,
    /// Prompt lookup (`prompt_lookup`).
    Ngram,
}

impl Speculate {
    /// `off` or `ngram`; the error is one line.
    pub fn parse(s: &str) -> Result<Speculate, String> {
        match s {
            "off" => Ok(Speculate::Off),
            "ngram" => Ok(Speculate::Ngram),
            "dspark" => Err("\"dspark\" is not available yet (off, ngram)".into()),
            _ => Err(format!("\"{s}\" is not one of off, ngram")),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Speculate::Off => "off",
            Speculate::Ngram => "ngram",
        }
    }

    /// A fresh drafter for one session; `None` for `Off`.
    pub fn drafter(self) -> Option<Box<dyn drafter::Drafter>> {
        match self {
            Speculate::Off => None,
            Speculate::Ngram => Some(Box::new(prompt_lookup::PromptLookup::default())),
        }
    }
}
