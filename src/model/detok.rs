//! Streaming detokenizer (spec §5.4). Filled in by the tokenizer work.
