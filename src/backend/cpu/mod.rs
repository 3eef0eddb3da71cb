//! CPU reference backend (docs/model.md, docs/arithmetic.md): the full DeepSeek V4 Flash forward pass, generic
//! over every dimension read from the file, with chunked layer-major prefill and single-token decode.
//!
//! Module map: `quant` (activation quantization, dot products), `matvec` (row-parallel drivers),
//! `ops` (norms, RoPE, FP8/FP4 simulations), `hc` (hyper-connections), `attention`, `compressor`,
//! `indexer`, `moe`, `cache` (per-layer KV state), `resolved` (weight views), `forward` (the pass),
//! `state` (checkpoint payload), `undo` (what a verified block overwrote, for its commit). This file
//! owns `CpuModel` (the model, its weight views and the thread pool, made once) and `CpuSession`, the
//! session opened from it (cache, scratch, logits, the pending verified block).

pub mod attention;
pub mod cache;
pub mod compressor;
pub mod dspark;
pub mod dspark_capture;
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
pub mod undo;

use std::sync::{Arc, Mutex};

use crate::model::weights::Model;

use super::{BackendError, DeviceSession, MemoryReport, Progress, check_eval_tokens, eval_in_chunks};
use cache::LayerCache;
use dspark_capture::Capture;
use forward::{ForwardPass, HeadOut, Scratch};
use ops::Rope;
use resolved::Resolved;
use undo::UndoLog;

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

    /// The DSpark forward of `support` over rows another backend's session captures into `capture`
    /// (a HIP session's: its drafter runs here, on the host).
    pub fn dspark_over(
        &self,
        support: Arc<crate::model::dspark::DsparkModel>,
        convention: crate::model::dspark::DsparkConvention,
        capture: Arc<Mutex<Capture>>,
    ) -> dspark::CpuDspark {
        dspark::CpuDspark::new(
            self.model.clone(),
            support,
            self.pool.clone(),
            &self.w,
            capture,
            convention,
        )
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
            block: Block::default(),
            capture: None,
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
    block: Block,
    /// The target rows a DSpark drafter reads, once one is attached (`dspark`).
    capture: Option<Arc<Mutex<Capture>>>,
}

/// The last verified block (docs/model.md#block-verify-and-commit).
#[derive(Default)]
struct Block {
    /// Its length while it waits for `commit`; `None` once committed.
    pending: Option<usize>,
    /// The logits after each of its tokens (token-major).
    logits: Vec<f32>,
    /// The logits before it: those after the last kept token when none is kept.
    logits_before: Vec<f32>,
    /// What its tokens overwrote in the caches.
    undo: UndoLog,
}

/// Which logits a chunk computes (`HeadOut` without the buffers).
#[derive(Clone, Copy, PartialEq)]
enum Head {
    Last,
    EveryWithUndo,
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

    fn run_chunk(&mut self, chunk: &[u32], head: Head) {
        let engine = ForwardPass {
            hp: &self.model.hp,
            file: self.model.file.bytes(),
            w: &self.w,
            pool: &self.pool,
            ropes: &self.ropes,
        };
        let p0 = self.tokens.len();
        let (out, undo) = match head {
            Head::Last => (HeadOut::Last(&mut self.logits[..]), None),
            Head::EveryWithUndo => (HeadOut::Every(&mut self.block.logits[..]), Some(&mut self.block.undo)),
        };
        let mut capture = self
            .capture
            .as_ref()
            .map(|c| c.lock().unwrap_or_else(|e| e.into_inner()));
        engine.forward_chunk(
            chunk,
            p0,
            &mut self.caches,
            &mut self.scratch,
            out,
            undo,
            capture.as_deref_mut(),
        );
        self.tokens.extend_from_slice(chunk);
    }

    /// Apply `f` to the DSpark capture, when one is attached.
    fn with_capture(&self, f: impl FnOnce(&mut Capture)) {
        if let Some(c) = &self.capture {
            f(&mut c.lock().unwrap_or_else(|e| e.into_inner()));
        }
    }

    /// Start capturing `targets` for a DSpark drafter (keeping the last `keep` rows) and return the
    /// shared capture; a second call replaces the first.
    pub fn attach_capture(&mut self, targets: &[usize], keep: usize) -> Arc<Mutex<Capture>> {
        let hp = &self.model.hp;
        let c = Arc::new(Mutex::new(Capture::new(targets, hp.n_embd, hp.n_hc, keep)));
        self.capture = Some(c.clone());
        c
    }

    /// The DSpark forward of `support` over this session (`DeviceSession::dspark`), as its concrete
    /// type (tests read its logits and hidden rows).
    pub fn dspark_cpu(
        &mut self,
        support: Arc<crate::model::dspark::DsparkModel>,
        convention: crate::model::dspark::DsparkConvention,
    ) -> dspark::CpuDspark {
        let capture = self.attach_capture(&support.meta.targets, dspark::CAPTURE_ROWS);
        // The session's weights and pool are its engine's (shared Arcs): the one construction path.
        let engine = CpuModel {
            model: self.model.clone(),
            pool: self.pool.clone(),
            w: self.w.clone(),
        };
        engine.dspark_over(support, convention, capture)
    }

    /// The pending block, if any, stays as evaluated: its undo record is dropped.
    fn commit_whole_block(&mut self) {
        self.block.pending = None;
        self.block.undo.clear();
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
        self.commit_whole_block();
        // Logits after each chunk's last token (one head evaluation per chunk), so that a cancel
        // leaves `logits()` consistent with the cache at `done`.
        let chunk = self.scratch.n_max;
        let r = eval_in_chunks(tokens, chunk, progress, |part| self.run_chunk(part, Head::Last));
        if r.is_err() || tokens.len() > 1 {
            self.clear_stale_compressor_rows();
        }
        r
    }

    fn logits(&self) -> &[f32] {
        &self.logits
    }

    fn has_block_verify(&self) -> bool {
        true
    }

    /// One chunk of the forward pass with the head after every token and every cache write recorded
    /// (`undo.rs`): the same arithmetic as decode, so row i is bitwise the logits a decode of
    /// `tokens[..=i]` gives. The stale compressor rows are not reset (as after a decode step).
    fn verify(&mut self, tokens: &[u32]) -> Result<(), BackendError> {
        if tokens.is_empty() {
            return Err(BackendError::Other("block verify of an empty block".into()));
        }
        let max = self.scratch.n_max;
        if tokens.len() > max {
            return Err(BackendError::Other(format!(
                "a block of {} tokens is longer than the {max} one verify pass takes",
                tokens.len()
            )));
        }
        check_eval_tokens(tokens, self.tokens.len(), self.ctx, self.model.hp.n_vocab)?;
        self.commit_whole_block();
        let n_vocab = self.model.hp.n_vocab;
        self.block.logits.resize(tokens.len() * n_vocab, 0.0);
        self.block.logits_before.clone_from(&self.logits);
        self.run_chunk(tokens, Head::EveryWithUndo);
        self.logits
            .copy_from_slice(&self.block.logits[(tokens.len() - 1) * n_vocab..]);
        self.block.pending = Some(tokens.len());
        Ok(())
    }

    fn block_logits(&self) -> &[f32] {
        &self.block.logits
    }

    fn commit(&mut self, keep: usize) -> Result<(), BackendError> {
        let Some(n) = self.block.pending else {
            return Err(BackendError::Other(
                "commit without a verified block (verify first)".into(),
            ));
        };
        if keep > n {
            return Err(BackendError::Other(format!(
                "cannot keep {keep} tokens of a verified block of {n}"
            )));
        }
        self.block.pending = None;
        if keep < n {
            self.block.undo.undo_from(keep, &mut self.caches);
            self.tokens.truncate(self.tokens.len() - (n - keep));
            let len = self.tokens.len();
            self.with_capture(|c| c.truncate(len));
            let n_vocab = self.model.hp.n_vocab;
            match keep {
                0 => self.logits.copy_from_slice(&self.block.logits_before),
                k => self
                    .logits
                    .copy_from_slice(&self.block.logits[(k - 1) * n_vocab..k * n_vocab]),
            }
        }
        self.block.undo.clear();
        Ok(())
    }

    fn reset(&mut self) {
        self.commit_whole_block();
        self.tokens.clear();
        for c in &mut self.caches {
            c.reset();
        }
        self.logits.fill(0.0);
        self.with_capture(|c| c.clear());
    }

    fn dspark(
        &mut self,
        support: Arc<crate::model::dspark::DsparkModel>,
        convention: crate::model::dspark::DsparkConvention,
    ) -> Result<Box<dyn super::dspark::DsparkForward>, BackendError> {
        Ok(Box::new(self.dspark_cpu(support, convention)))
    }

    fn save_state(&self) -> Vec<u8> {
        state::save(self)
    }

    fn load_state(&mut self, bytes: &[u8]) -> Result<(), BackendError> {
        self.commit_whole_block();
        self.with_capture(|c| c.clear());
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
        self.commit_whole_block();
        self.with_capture(|c| c.clear());
        state::import(self, rows, tokens)
    }

    fn memory(&self) -> MemoryReport {
        MemoryReport {
            kv_bytes: self.caches.iter().map(|c| c.bytes() as u64).sum(),
            scratch_bytes: (self.scratch.bytes()
                + self.logits.len() * 4
                + self.capture.as_ref().map_or(0, |c| c.lock().map_or(0, |c| c.bytes())))
                as u64,
            device_weight_bytes: 0,
            device_used: None,
            device_total: None,
        }
    }
}
