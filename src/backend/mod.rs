//! Compute backends: the CPU reference (always built) and HIP (feature `hip`).
//!
//! Owns the execution of the forward pass on a device. Must not know about chat, tokens-as-text or
//! the UI.

pub mod cpu;
#[cfg(feature = "hip")]
pub mod hip;
