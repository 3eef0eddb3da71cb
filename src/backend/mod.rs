//! Compute backends: the CPU reference (always built) and HIP (feature `hip`).
//!
//! Owns the execution of the forward pass on a device behind two narrow traits, shaped like ds4.h's
//! engine/session boundary: a `DeviceModel` is the model loaded once onto a device (the file
//! mapping, and on a GPU the device context, the kernels and the weights' device copy); a
//! `DeviceSession` is one cache of `ctx` tokens and its logits opened from it. Also the host facts
//! that decide whether and where a model fits: the memory guard (`memguard`), the budget of a GPU
//! weight copy (`copy_budget`), the page-cache residency of the model file (`residency`).
//!
//! Weight placement, one type per role: the request (`WeightsMode`, from `--weights`), the decision
//! (`hip::open::PlacementPlan`), the report (`PlacementReport`).
//!
//! Layer: imports only `units`, `gguf`, `model` and `genmodel` (src/lib.rs). Must not know about
//! chat, text, sampling or the UI; token ids in, logits out.

pub mod agreement;
pub mod arithmetic;
pub mod cache_rows;
pub mod copy_budget;
pub mod cpu;
pub mod dspark;
#[cfg(feature = "hip")]
pub mod hip;
pub mod knobs;
pub mod memguard;
pub mod payload;
pub mod residency;
// The kernel table is plain data: its tests run in builds without the `hip` feature too.
#[cfg(all(test, not(feature = "hip")))]
#[path = "hip/kernels/mod.rs"]
#[allow(dead_code, unused_imports)]
mod hip_kernels;

use std::fmt;
use std::sync::Arc;

use crate::model::Model;

/// Failure of a backend operation, as a value.
#[derive(Debug, Clone, PartialEq)]
pub enum BackendError {
    /// The prompt or generation does not fit the context (docs/prompt.md#stop-conditions).
    ContextFull {
        needed: usize,
        ctx: usize,
    },
    /// A progress callback asked to stop; the state is consistent up to `done` tokens.
    Cancelled {
        done: usize,
    },
    /// A checkpoint that does not belong to this model/context.
    BadCheckpoint(String),
    /// Device or runtime failure.
    Device(String),
    Other(String),
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BackendError::ContextFull { needed, ctx } => {
                write!(
                    f,
                    "context full: {needed} tokens needed, context is {ctx} (raise --ctx)"
                )
            }
            BackendError::Cancelled { done } => write!(f, "cancelled after {done} tokens"),
            BackendError::BadCheckpoint(m) => write!(f, "bad checkpoint: {m}"),
            BackendError::Device(m) => write!(f, "device error: {m}"),
            BackendError::Other(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for BackendError {}

/// Memory a backend holds for a session.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct MemoryReport {
    /// KV cache, compressed rows and compressor/indexer state.
    pub kv_bytes: u64,
    /// Activations and other scratch.
    pub scratch_bytes: u64,
    /// Weights resident in device memory (0 for CPU / zero-copy).
    pub device_weight_bytes: u64,
    /// Device memory used/total when known.
    pub device_used: Option<u64>,
    pub device_total: Option<u64>,
}

/// The weight placement asked for (`--weights`; GPU backends only): the request that
/// `hip::open::plan_placement` turns into a `PlacementPlan`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum WeightsMode {
    /// Copy to device memory when it fits, else map.
    #[default]
    Auto,
    Copy,
    Map,
}

/// Where a GPU backend placed the model's weights (`--weights`), for the side panel, logs and `bench`.
#[derive(Clone, Debug, PartialEq)]
pub struct PlacementReport {
    /// Copied into device memory (true) or read in place through the registered file mapping.
    pub copied: bool,
    /// Bytes copied or mapped.
    pub bytes: u64,
    /// Time the copy (or the registration) took.
    pub seconds: f64,
    /// Why this placement: auto's reason, or why the one asked for was not possible. Empty when the
    /// placement asked for was used as it is.
    pub reason: String,
}

impl PlacementReport {
    /// "copy" or "map".
    pub fn mode(&self) -> &'static str {
        if self.copied { "copy" } else { "map" }
    }

    /// One line: "copy: 12.30 GiB to device memory in 4.10 s (3.22 GB/s)", then the reason if any.
    pub fn summary(&self) -> String {
        let size = if self.bytes >= crate::units::GIB {
            crate::units::fmt_gib(self.bytes, 2)
        } else {
            crate::units::fmt_bytes(self.bytes)
        };
        let mut s = if self.copied {
            format!(
                "copy: {size} to device memory in {:.2} s ({:.2} GB/s)",
                self.seconds,
                self.bytes as f64 / self.seconds.max(1e-9) / 1e9
            )
        } else {
            format!(
                "map: {size} read in place (zero-copy), registered in {:.2} s",
                self.seconds
            )
        };
        if !self.reason.is_empty() {
            s.push_str("; ");
            s.push_str(&self.reason);
        }
        s
    }
}

/// A next-token choice a backend can make on its device from the logits of the last eval, so only
/// the token id comes back instead of n_vocab floats (`engine::sampler` decides when one matches
/// its host path, and supplies the uniform draw).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum DeviceSample {
    /// The first index of the largest logit (NaN never wins; 0 when none is above -inf).
    Greedy,
    /// The default path (docs/sampler.md#id-order-path, top_k 0 and top_p 1): weights exp((l - max) /
    /// temperature) of the finite logits, those below min_p dropped, the walk in id order until u01
    /// times their sum is used up.
    MinP { temperature: f32, min_p: f32, u01: f32 },
}

/// A token picked on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DevicePick {
    pub token: u32,
    /// Whether the uniform draw was used: false for greedy, and where the host path draws nothing
    /// (no finite logit, or no token kept).
    pub drew: bool,
}

/// Progress callback for long evaluations: `(done, total)` tokens; return `false` to stop at the next
/// chunk/token boundary (the backend then returns `BackendError::Cancelled`).
pub type Progress<'a> = &'a mut dyn FnMut(usize, usize) -> bool;

/// What every backend's `eval` refuses before evaluating anything: a token that would sit at a
/// position ≥ ctx (`ContextFull`) and a token id outside the vocabulary.
pub fn check_eval_tokens(tokens: &[u32], n_past: usize, ctx: usize, n_vocab: usize) -> Result<(), BackendError> {
    let needed = n_past + tokens.len();
    if needed > ctx {
        return Err(BackendError::ContextFull { needed, ctx });
    }
    match tokens.iter().find(|&&t| t as usize >= n_vocab) {
        Some(bad) => Err(BackendError::Other(format!(
            "token id {bad} is outside the vocabulary ({n_vocab})"
        ))),
        None => Ok(()),
    }
}

/// The error of a backend without a block verify (`DeviceSession::verify`).
pub fn no_block_verify(backend: &str) -> BackendError {
    BackendError::Other(format!("the {backend} backend has no block verify"))
}

/// Evaluates `tokens` as chunks of at most `chunk` through `run`, asking `progress` after every
/// chunk but the last whether to go on: a stop returns `Cancelled` with the tokens done. The end is
/// reported as `(total, total)`.
pub fn eval_in_chunks(
    tokens: &[u32],
    chunk: usize,
    progress: Progress<'_>,
    mut run: impl FnMut(&[u32]),
) -> Result<(), BackendError> {
    let total = tokens.len();
    let mut done = 0;
    for part in tokens.chunks(chunk.max(1)) {
        run(part);
        done += part.len();
        if done < total && !progress(done, total) {
            return Err(BackendError::Cancelled { done });
        }
    }
    progress(total, total);
    Ok(())
}

/// A model loaded once onto one device. Sessions opened from it share the model and everything the
/// device holds for it (kernels, weights); opening one reads nothing from the model file and moves no
/// weights, it only allocates the session's cache and scratch.
pub trait DeviceModel: Send {
    /// "cpu" or "hip".
    fn name(&self) -> &'static str;
    /// Human-readable device name.
    fn device_name(&self) -> String;
    /// The model every session of this engine runs.
    fn model(&self) -> &Arc<Model>;
    /// Where the weights live on a GPU engine; `None` when they are read from the file mapping on the
    /// host (the CPU).
    fn weights_placement(&self) -> Option<PlacementReport> {
        None
    }
    /// A session with an empty cache of `ctx` tokens. A GPU engine checks first that the session's
    /// cache and scratch fit the free device memory.
    fn open_session(&self, ctx: usize) -> Result<Box<dyn DeviceSession>, BackendError>;
}

/// One session on a `DeviceModel`: the model executing on one device with one live cache.
pub trait DeviceSession: Send {
    /// "cpu" or "hip".
    fn name(&self) -> &'static str;
    /// Human-readable device name.
    fn device_name(&self) -> String;
    /// The GPU kernels' arithmetic contract; `None` for the CPU engine (the reference).
    fn arithmetic(&self) -> Option<arithmetic::Arithmetic> {
        None
    }
    /// Context size the cache was made for.
    fn ctx(&self) -> usize;
    /// Tokens currently in the cache.
    fn n_past(&self) -> usize;
    /// Evaluate `tokens` at positions `n_past()..`, batched (prefill) when more than one; afterwards
    /// `logits()` holds the next-token logits after the last token. Cancel is honoured between
    /// chunks/tokens and leaves the cache consistent at the returned `done`.
    fn eval(&mut self, tokens: &[u32], progress: Progress<'_>) -> Result<(), BackendError>;
    /// Next-token logits after the last evaluated token (length n_vocab). A GPU backend copies them
    /// from the device on the first call after an eval.
    fn logits(&self) -> &[f32];
    /// Evaluate a block of draft tokens at positions `n_past()..` in one pass and keep what it
    /// overwrites, so `commit` can take any suffix of it back (docs/model.md#block-verify-and-commit).
    /// Afterwards the cache holds the whole block, `logits()` is the logits after its last token and
    /// `block_logits()` those after every token. Any other evaluation, reset or restore commits the
    /// whole block.
    /// Whether `verify`, `block_logits` and `commit` are implemented (speculative decoding falls
    /// back to plain decode where they are not).
    fn has_block_verify(&self) -> bool {
        false
    }
    fn verify(&mut self, tokens: &[u32]) -> Result<(), BackendError> {
        let _ = tokens;
        Err(no_block_verify(self.name()))
    }
    /// The logits after every token of the last verified block (block length × n_vocab, token-major).
    fn block_logits(&self) -> &[f32] {
        &[]
    }
    /// Keep the first `keep` tokens (0..=block length) of the last verified block and leave every
    /// cache exactly as if the rest had never been evaluated, re-evaluating nothing; `logits()` is then
    /// the logits after the last kept token.
    fn commit(&mut self, keep: usize) -> Result<(), BackendError> {
        let _ = keep;
        Err(no_block_verify(self.name()))
    }
    /// Attach a DSpark drafter (docs/dspark.md) for `support`, bound to this session's model: from
    /// now on the session captures the target layers' outputs of every evaluated position, and the
    /// returned forward drafts from them with `convention`.
    fn dspark(
        &mut self,
        support: Arc<crate::model::dspark::DsparkModel>,
        convention: crate::model::dspark::DsparkConvention,
    ) -> Result<Box<dyn dspark::DsparkForward>, BackendError> {
        let _ = (support, convention);
        Err(dspark::no_dspark(self.name()))
    }
    /// Pick the next token on the device from the last eval's logits; `None` when this backend has
    /// no device sampling (the caller then samples `logits()` on the host).
    fn sample_on_device(&mut self, how: DeviceSample) -> Option<Result<DevicePick, BackendError>> {
        let _ = how;
        None
    }
    /// Drop the whole cache.
    fn reset(&mut self);
    /// Serialize the cache and logits (docs/model.md#checkpoints).
    fn save_state(&self) -> Vec<u8>;
    /// Restore a state made by `save_state` of the same model and context.
    fn load_state(&mut self, bytes: &[u8]) -> Result<(), BackendError>;
    /// The cache and logits as backend-neutral rows (what a session's KV snapshot holds).
    fn export_cache(&self) -> Result<cache_rows::CacheRows, BackendError> {
        Err(BackendError::Other(format!(
            "the {} backend cannot export its cache",
            self.name()
        )))
    }
    /// Restore rows exported by any backend of the same model, holding `tokens`; a rejected one
    /// leaves the cache as it was.
    fn import_cache(&mut self, rows: &cache_rows::CacheRows, tokens: &[u32]) -> Result<(), BackendError> {
        let _ = (rows, tokens);
        Err(BackendError::Other(format!(
            "the {} backend cannot import a cache",
            self.name()
        )))
    }
    fn memory(&self) -> MemoryReport;
    /// Where the weights live on a GPU backend; `None` for backends that read the file mapping on
    /// the host (the CPU).
    fn weights_placement(&self) -> Option<PlacementReport> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::PlacementReport;

    #[test]
    fn placement_summary_is_one_line_with_size_time_and_reason() {
        let p = PlacementReport {
            copied: true,
            bytes: 3 << 30,
            seconds: 1.5,
            reason: "auto: fits".into(),
        };
        // 3 GiB = 3.221 GB in 1.5 s = 2.15 GB/s.
        assert_eq!(
            p.summary(),
            "copy: 3.00 GiB to device memory in 1.50 s (2.15 GB/s); auto: fits"
        );
        let m = PlacementReport {
            copied: false,
            bytes: 10 << 20,
            seconds: 0.004,
            reason: String::new(),
        };
        assert_eq!(
            m.summary(),
            "map: 10.0 MiB read in place (zero-copy), registered in 0.00 s"
        );
        assert_eq!((p.mode(), m.mode()), ("copy", "map"));
    }
}
