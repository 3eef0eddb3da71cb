//! The GGUF file format: container reading and writing, element types, reference dequantization.
//!
//! Owns bytes-on-disk concerns only. It must not know tensor names or DeepSeek shapes (`model::`
//! does) and must not compute with weights beyond reference dequantization (backends do). Layer: above
//! `units` only (src/lib.rs).

pub mod dequant;
pub mod error;
pub mod half;
pub mod iq2_tables;
pub mod reader;
pub mod types;
pub mod writer;

pub use error::GgufError;
pub use reader::{GgufFile, MetaValue, TensorInfo};
pub use types::GgmlType;
