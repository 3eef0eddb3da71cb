//! Tokenizer built from GGUF metadata (spec §5). Filled in by the tokenizer work.
