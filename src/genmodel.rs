//! Synthetic ds4-layout model writer (gen-model, --demo). Filled in by the foundation work.
