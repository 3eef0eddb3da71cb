//! CPU reference backend (docs/model.md, docs/arithmetic.md): the full DeepSeek V4 Flash forward pass, generic
//! over every dimension read from the file, with chunked layer-major prefill and single-token decode.
//!
//! Module map: `quant` (activation quantization, dot products), `matvec` (row-parallel drivers),
//! `ops` (norms, RoPE, FP8/FP4 simulations), `hc` (hyper-connections), `attention`, `compressor`,
//! `indexer`, `moe`, `cache` (per-layer KV state), `resolved` (weight views), `forward` (the pass),
//! `state` (checkpoint payload). This file owns `CpuModel` (the model, its weight views and the
//! thread pool, made once) and `CpuSession`, the session opened from it (cache, scratch, logits).

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

use super::{BackendError, DeviceSession, MemoryReport, Progress, check_eval_tokens, eval_in_chunks};
use cache::LayerCache;
use forward::{ForwardPass, Scratch};
use ops::Rope;
use resolved::Resolved;

/// Tokens per prefill chunk: progress and cancellation are honoured between chunks.
pub const PREFILL_CHUNK: usize = 128;

/// The model on the CPU: the file mapping, the weight views (`Resolved`, which copies the small
/// vectors out of the file) and the thread pool, shared by every session opened from it.
pub struct CpuModel {
    model: Arc<Model>,
    pool: Arc<rayon::ThreadPool>,
    w: Arc<Resolved>,
}

impl CpuModel {
    /// The engine for `model`, or why the CPU engine cannot run it; `threads` 0 = all cores.
    pub fn new(model: Arc<Model>, threads: usize) -> Result<CpuModel, BackendError> {
        let hp = &model.hp;
        if hp.n_head_kv != 1 {
            return Err(BackendError::Other(format!(
                "model has {} KV heads; the DS4 engine supports exactly 1",
                hp.n_head_kv
            )));
        }
        if !hp.idx_head_dim.is_power_of_two() || hp.head_dim < hp.n_rot || hp.idx_head_dim < hp.n_rot {
            return Err(BackendError::Other(format!(
                "unsupported head dims: head {} / indexer {} / rope {} (indexer width must be a power of two)",
                hp.head_dim, hp.idx_head_dim, hp.n_rot
            )));
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("ds4-cpu-{i}"))
            .build()
            .map_err(|e| BackendError::Other(format!("cannot start the CPU thread pool: {e}")))?;
        let w = Arc::new(Resolved::new(&model));
        Ok(CpuModel {
            model,
            pool: Arc::new(pool),
            w,
        })
    }

    /// A session with an empty cache for `ctx` tokens.
    pub fn session(&self, ctx: usize) -> Result<CpuSession, BackendError> {
        if ctx < 2 {
            return Err(BackendError::Other(format!(
                "context {ctx} is too small (need at least 2)"
            )));
        }
        let hp = &self.model.hp;
        Ok(CpuSession {
            tokens: Vec::with_capacity(ctx),
            model: self.model.clone(),
            pool: self.pool.clone(),
            ctx,
            w: self.w.clone(),
            ropes: forward::layer_ropes(hp),
            caches: (0..hp.n_layer).map(|l| LayerCache::new(hp, l, ctx)).collect(),
            scratch: Scratch::new(hp, ctx, PREFILL_CHUNK.min(ctx)),
            logits: vec![0.0; hp.n_vocab],
        })
    }
}

impl super::DeviceModel for CpuModel {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn device_name(&self) -> String {
        cpu_device_name(&self.pool)
    }

    fn model(&self) -> &Arc<Model> {
        &self.model
    }

    fn open_session(&self, ctx: usize) -> Result<Box<dyn DeviceSession>, BackendError> {
        Ok(Box::new(self.session(ctx)?))
    }
}

fn cpu_device_name(pool: &rayon::ThreadPool) -> String {
    format!("CPU ({} threads)", pool.current_num_threads())
}

/// A session on the CPU engine: the per-layer caches, scratch and logits of `ctx` tokens.
pub struct CpuSession {
    model: Arc<Model>,
    pool: Arc<rayon::ThreadPool>,
    ctx: usize,
    w: Arc<Resolved>,
    ropes: Vec<Rope>,
    caches: Vec<LayerCache>,
    scratch: Scratch,
    tokens: Vec<u32>,
    logits: Vec<f32>,
}

impl CpuSession {
    /// A backend with an empty cache for `ctx` tokens on an engine of its own; `threads` 0 = all
    /// cores. (Sessions that share the model's weight views and threads come from `CpuModel`.)
    pub fn new(model: Arc<Model>, ctx: usize, threads: usize) -> Result<CpuSession, BackendError> {
        CpuModel::new(model, threads)?.session(ctx)
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
        let engine = ForwardPass {
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

impl DeviceSession for CpuSession {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn device_name(&self) -> String {
        cpu_device_name(&self.pool)
    }

    fn ctx(&self) -> usize {
        self.ctx
    }

    fn n_past(&self) -> usize {
        self.tokens.len()
    }

    /// Every position must be below ctx: a token that would sit at position ≥ ctx is refused with
    /// `ContextFull` before anything is evaluated. (That a *prompt* must be strictly shorter than
    /// ctx, docs/prompt.md#stop-conditions, is the session's rule: `PromptCache::sync`.)
    fn eval(&mut self, tokens: &[u32], progress: Progress<'_>) -> Result<(), BackendError> {
        if tokens.is_empty() {
            return Ok(());
        }
        check_eval_tokens(tokens, self.tokens.len(), self.ctx, self.model.hp.n_vocab)?;
        // Logits after each chunk's last token (one head evaluation per chunk), so that a cancel
        // leaves `logits()` consistent with the cache at `done`.
        let chunk = self.scratch.n_max;
        let r = eval_in_chunks(tokens, chunk, progress, |part| self.run_chunk(part, true));
        if r.is_err() || tokens.len() > 1 {
            self.clear_stale_compressor_rows();
        }
        r
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

    fn load_state(&mut self, bytes: &[u8]) -> Result<(), BackendError> {
        state::load(self, bytes)
    }

    fn export_cache(&self) -> Result<crate::backend::cache_rows::CacheRows, BackendError> {
        Ok(state::export(self))
    }

    fn import_cache(
        &mut self,
        rows: &crate::backend::cache_rows::CacheRows,
        tokens: &[u32],
    ) -> Result<(), BackendError> {
        state::import(self, rows, tokens)
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
