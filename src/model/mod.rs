//! The DeepSeek V4 Flash model description: hyperparameters, tensor layout and binding, tokenizer,
//! chat rendering and streaming detokenization.
//!
//! Owns what the model *is*, down to the kind of each streamed text piece (`detok::TextKind`); must
//! not execute it (that is `backend::` and `engine::`). Layer: imports only `gguf` and `units`
//! (src/lib.rs).

pub mod accounting;
pub mod chat;
pub mod checkpoint;
pub mod detok;
pub mod dsml;
pub mod dspark;
pub mod hparams;
pub mod layout;
pub mod tokenizer;
pub mod tools;
pub mod weights;

pub use hparams::HParams;
pub use weights::Model;
