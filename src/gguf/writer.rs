//! GGUF v3 writer (synthetic models). Filled in by the foundation work.
