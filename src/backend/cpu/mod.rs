//! CPU reference backend (docs/model.md, docs/arithmetic.md): the full DeepSeek V4 Flash forward pass, generic
//! over every dimension read from the file, with chunked layer-major prefill and single-token decode.
//!
//! Module map: `quant` (activation quantization, dot products), `matvec` (row-parallel drivers),
//! `ops` (norms, RoPE, FP8/FP4 simulations), `hc` (hyper-connections), `attention`, `compressor`,
//! `indexer`, `moe`, `cache` (per-layer KV state), `resolved` (weight views), `forward` (the pass),
//! `state` (checkpoint payload). This file owns `CpuBackend`, the `Backend` implementation.

pub mod attention;
pub mod cache;
pub mod compressor;
pub mod forward;
pub mod hc;
pub mod indexer;
pub mod matvec;
pub mod moe;
pub mod ops;
pub mod quant;
pub mod reduce;
pub mod resolved;
pub mod state;
pub mod transcend;

use std::sync::Arc;

use crate::model::weights::Model;

use super::{Backend, EngineError, MemoryReport, Progress};
use cache::LayerCache;
use forward::{Engine, Scratch};
use ops::Rope;
use resolved::Resolved;

/// Tokens per prefill chunk: progress and cancellation are honoured between chunks.
pub const PREFILL_CHUNK: usize = 128;

pub struct CpuBackend {
    model: Arc<Model>,
    pool: rayon::ThreadPool,
    ctx: usize,
    w: Resolved,
    ropes: Vec<Rope>,
    caches: Vec<LayerCache>,
    scratch: Scratch,
    tokens: Vec<u32>,
    logits: Vec<f32>,
}

impl CpuBackend {
    /// A backend with an empty cache for `ctx` tokens; `threads` 0 = all cores.
    pub fn new(model: Arc<Model>, ctx: usize, threads: usize) -> Result<CpuBackend, EngineError> {
        let hp = &model.hp;
        if ctx < 2 {
            return Err(EngineError::Other(format!(
                "context {ctx} is too small (need at least 2)"
            )));
        }
        if hp.n_head_kv != 1 {
            return Err(EngineError::Other(format!(
                "model has {} KV heads; the DS4 engine supports exactly 1",
                hp.n_head_kv
            )));
        }
        if !hp.idx_head_dim.is_power_of_two() || hp.head_dim < hp.n_rot || hp.idx_head_dim < hp.n_rot {
            return Err(EngineError::Other(format!(
                "unsupported head dims: head {} / indexer {} / rope {} (indexer width must be a power of two)",
                hp.head_dim, hp.idx_head_dim, hp.n_rot
            )));
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("ds4-cpu-{i}"))
            .build()
            .map_err(|e| EngineError::Other(format!("cannot start the CPU thread pool: {e}")))?;
        let w = Resolved::new(&model);
        let ropes = forward::layer_ropes(hp);
        let caches = (0..hp.n_layer).map(|l| LayerCache::new(hp, l, ctx)).collect();
        let scratch = Scratch::new(hp, ctx, PREFILL_CHUNK.min(ctx));
        let logits = vec![0.0; hp.n_vocab];
        Ok(CpuBackend {
            tokens: Vec::with_capacity(ctx),
            model,
            pool,
            ctx,
            w,
            ropes,
            caches,
            scratch,
            logits,
        })
    }

    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// Token ids currently in the cache.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Per-layer caches (read-only; for inspection and component tests).
    pub fn caches(&self) -> &[LayerCache] {
        &self.caches
    }

    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    fn run_chunk(&mut self, chunk: &[u32], want_logits: bool) {
        let engine = Engine {
            hp: &self.model.hp,
            file: self.model.file.bytes(),
            w: &self.w,
            pool: &self.pool,
            ropes: &self.ropes,
        };
        let p0 = self.tokens.len();
        engine.forward_chunk(
            chunk,
            p0,
            &mut self.caches,
            &mut self.scratch,
            want_logits.then_some(&mut self.logits[..]),
        );
        self.tokens.extend_from_slice(chunk);
    }

    /// Reset compressor rows that belong to no live window (docs/model.md#compressor), as ds4 does after a
    /// prefill.
    fn clear_stale_compressor_rows(&mut self) {
        let n = self.tokens.len();
        for c in &mut self.caches {
            for (_, st) in c.comp.iter_mut().chain(c.index.iter_mut()) {
                st.clear_stale(n);
            }
        }
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn device_name(&self) -> String {
        format!("CPU ({} threads)", self.pool.current_num_threads())
    }

    fn ctx(&self) -> usize {
        self.ctx
    }

    fn n_past(&self) -> usize {
        self.tokens.len()
    }

    /// Every position must be below ctx: a token that would sit at position ≥ ctx is refused with
    /// `ContextFull` before anything is evaluated. (That a *prompt* must be strictly shorter than
    /// ctx, docs/prompt.md#stop-conditions, is the session's rule: `Session::sync`.)
    fn eval(&mut self, tokens: &[u32], progress: Progress<'_>) -> Result<(), EngineError> {
        if tokens.is_empty() {
            return Ok(());
        }
        let needed = self.tokens.len() + tokens.len();
        if needed > self.ctx {
            return Err(EngineError::ContextFull { needed, ctx: self.ctx });
        }
        let n_vocab = self.model.hp.n_vocab;
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= n_vocab) {
            return Err(EngineError::Other(format!(
                "token id {bad} is outside the vocabulary ({n_vocab})"
            )));
        }
        let total = tokens.len();
        let chunk = self.scratch.n_max;
        let mut done = 0;
        while done < total {
            let end = (done + chunk).min(total);
            let last = end == total;
            // Logits after each chunk's last token (one head evaluation per chunk), so that a cancel
            // leaves `logits()` consistent with the cache at `done`.
            self.run_chunk(&tokens[done..end], true);
            done = end;
            if !last && !progress(done, total) {
                self.clear_stale_compressor_rows();
                return Err(EngineError::Cancelled { done });
            }
        }
        if total > 1 {
            self.clear_stale_compressor_rows();
        }
        progress(total, total);
        Ok(())
    }

    fn logits(&self) -> &[f32] {
        &self.logits
    }

    fn reset(&mut self) {
        self.tokens.clear();
        for c in &mut self.caches {
            c.reset();
        }
        self.logits.fill(0.0);
    }

    fn save_state(&self) -> Vec<u8> {
        state::save(self)
    }

    fn load_state(&mut self, bytes: &[u8]) -> Result<(), EngineError> {
        state::load(self, bytes)
    }

    fn memory(&self) -> MemoryReport {
        MemoryReport {
            kv_bytes: self.caches.iter().map(|c| c.bytes() as u64).sum(),
            scratch_bytes: (self.scratch.bytes() + self.logits.len() * 4) as u64,
            device_weight_bytes: 0,
            device_used: None,
            device_total: None,
        }
    }
}
