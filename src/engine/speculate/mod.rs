//! Speculative decoding's engine side (docs/speculative.md): the drafter boundary and its drafters
//! (`drafter`, `prompt_lookup`, `replay`, `dspark`), the rules that accept a block of drafted tokens against
//! the target's logits (`accept`), and the scheduler that decides how many tokens to draft and backs
//! off when drafting does not pay (`schedule`).
//!
//! Owns proposing tokens, judging them against logits and the draft-length policy: pure logic over
//! token ids, logits and timings. Must not evaluate the model or touch a device session or its
//! caches (`backend::`); the DSpark drafter runs its own model through the backend's
//! `DsparkForward`, attached once to the session (`dspark`). Must not know about the clients (`tui`, `serve`, `remote`, `cli`). The
//! decode loop that runs a cycle is `engine::generate::generate_speculative`.

pub mod accept;
pub mod drafter;
pub mod dspark;
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
    /// DeepSeek's DSpark drafter (`dspark`, docs/dspark.md).
    Dspark,
}

impl Speculate {
    /// `off`, `ngram` or `dspark`; the error is one line.
    pub fn parse(s: &str) -> Result<Speculate, String> {
        match s {
            "off" => Ok(Speculate::Off),
            "ngram" => Ok(Speculate::Ngram),
            "dspark" => Ok(Speculate::Dspark),
            _ => Err(format!("\"{s}\" is not one of off, ngram, dspark")),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Speculate::Off => "off",
            Speculate::Ngram => "ngram",
            Speculate::Dspark => "dspark",
        }
    }

    /// A fresh drafter that reads only tokens, for one session; `None` for `Off` and for `Dspark`,
    /// whose drafter is attached to the session (`dspark::DsparkSettings::attach`).
    pub fn drafter(self) -> Option<Box<dyn drafter::Drafter>> {
        match self {
            Speculate::Off | Speculate::Dspark => None,
            Speculate::Ngram => Some(Box::new(prompt_lookup::PromptLookup::default())),
        }
    }
}
