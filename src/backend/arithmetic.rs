//! `Arithmetic`: which contract a GPU backend's kernels follow (docs/arithmetic.md). `Exact`
//! reproduces the CPU engine bit for bit (the verification mode); `Fast` may reorder and fuse
//! sums (FMA contraction, tree and split reductions) while computing the same model, within the
//! tolerances the fast-mode tests state. Plain data, built without the `hip` feature so the CLI,
//! config and panel type-check everywhere.

use std::fmt;

/// The arithmetic contract of a session's kernels.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Arithmetic {
    /// Reordered, fused sums: the product's default.
    #[default]
    Fast,
    /// Bit-for-bit equal to the CPU engine.
    Exact,
}

impl Arithmetic {
    /// The config/CLI spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Arithmetic::Fast => "fast",
            Arithmetic::Exact => "exact",
        }
    }

    /// Parses the config value `"fast"` or `"exact"`; anything else is a one-line error naming it.
    pub fn parse(s: &str) -> Result<Arithmetic, String> {
        match s.trim() {
            "fast" => Ok(Arithmetic::Fast),
            "exact" => Ok(Arithmetic::Exact),
            other => Err(format!("arithmetic: expected \"fast\" or \"exact\", got {other:?}")),
        }
    }
}

impl fmt::Display for Arithmetic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_spellings_and_names_a_bad_value() {
        assert_eq!(Arithmetic::parse("fast"), Ok(Arithmetic::Fast));
        assert_eq!(Arithmetic::parse(" exact "), Ok(Arithmetic::Exact));
        let e = Arithmetic::parse("quick").unwrap_err();
        assert!(e.contains("arithmetic") && e.contains("quick"), "{e}");
        assert_eq!(Arithmetic::default(), Arithmetic::Fast);
        assert_eq!(Arithmetic::Exact.to_string(), "exact");
    }
}
