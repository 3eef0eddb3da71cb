//! One launch sequence's view of a session (`Pass`): the borrowed model, device weights, activation
//! buffers, layer caches and kernel launcher, with the launch helpers every sublayer shares (counted
//! launches, the fused HC pre step, quantizations, projections that pick a matvec or a GEMM).
//!
//! `HipSession` makes one per eval, decode step or sample (`HipSession::pass`); the sublayers
//! (`attention_layer.rs`, `ffn_layer.rs`) and the sequence over the layers (`layers.rs`) are
//! methods of it. A sublayer's independent chains go to side lanes with `fork` / `join`
//! (`lanes.rs`).

use std::cell::Cell;

use crate::backend::BackendError;
use crate::backend::arithmetic::Arithmetic;
use crate::model::Model;
use crate::model::weights::{ExpertTensor, TensorRef};

use super::acts::Acts;
use super::cache::LayerState;
use super::dspark_capture::DeviceCapture;
use super::kernel_module::KernelModule;
use super::kernels::{
    self, DevPtr, ExpertFormat, GEMM_TILE, HcEps, NULL, Q8Act, Q8Proj, Q8Swiglu, QuantOut, RopeParams,
};
use super::lanes::{Lanes, SIDE_LANES};
use super::prefill;
use super::profile::LaunchProfile;
use super::runtime::{DeviceBuffer, Stream};
use super::weights::DeviceWeights;

/// The session state one launch sequence reads and writes, borrowed from `HipSession`.
pub(super) struct Pass<'a> {
    pub(super) model: &'a Model,
    pub(super) weights: &'a DeviceWeights,
    pub(super) acts: &'a Acts,
    pub(super) layers: &'a [LayerState],
    /// RoPE of every layer (`layers::layer_ropes`).
    pub(super) ropes: &'a [RopeParams],
    /// Batches up to this size take the decode kernels token by token (`prefill::token_wise`).
    pub(super) matvec_tokens: usize,
    /// The main stream: every launch outside a forked chain, and the capture of the decode graph.
    pub(super) stream: &'a Stream,
    /// The side lanes chains are forked to (none when lanes are off).
    pub(super) lanes: &'a Lanes,
    /// The side lane the launches go to now (inside `fork`), else the main stream.
    pub(super) lane: Cell<Option<usize>>,
    /// Side lanes forked and not yet joined, one bit each.
    pub(super) forked: Cell<u32>,
    pub(super) kernels: &'a KernelModule,
    pub(super) profile: &'a LaunchProfile,
    /// Fast arithmetic runs each launch's fast twin where it has one (`kernels::fast_twin`; the
    /// batched GEMMs' twins run on matrix cores).
    pub(super) arithmetic: Arithmetic,
    /// Grid sizes of the fast twins (`kernels::fast_twin_tuned`).
    pub(super) fast_grids: kernels::FastGrids,
    /// The device's lanes per warp (wave32 or wave64): kernels laid out for one of them ask it.
    pub(super) warp_size: u32,
    /// Fast arithmetic: an HC post held back by `launch` for the next sublayer's HC pre (the end of
    /// the sequence, `forward_tokens`, issues it with `flush_launches`).
    pub(super) pending_post: Cell<Option<kernels::Launch>>,
    /// Whether launches may overlap their predecessor where the device allows it
    /// (`KernelModule::launch`): on, except in a batch past the token-wise size (`forward_tokens`).
    pub(super) overlap: Cell<bool>,
    /// Whether the HC state is in `acts.hc_alt` rather than `acts.hc` (`advance_hc`).
    pub(super) hc_in_alt: Cell<bool>,
    /// A block verify (block.rs): the compressors' kv and gate projections go to each layer's
    /// place in `acts.block_redo` instead of the shared scratch, for a commit to walk again.
    pub(super) keep_compressor_inputs: bool,
    /// The target-row capture of an attached DSpark drafter: its copies follow each target layer.
    pub(super) dspark: Option<&'a DeviceCapture>,
}

/// A runtime error as the engine's device error.
pub(super) fn dev(e: impl std::fmt::Display) -> BackendError {
    BackendError::Device(e.to_string())
}

pub(super) fn p0(b: &DeviceBuffer) -> DevPtr {
    b.ptr().0
}

/// Q8_0 activations held in a quants buffer and a scales buffer.
pub(super) fn q8(q: &DeviceBuffer, d: &DeviceBuffer) -> Q8Act {
    Q8Act { q: p0(q), d: p0(d) }
}

pub(super) fn expert_format(t: &ExpertTensor) -> ExpertFormat {
    ExpertFormat::from_ggml_type(t.ty()).expect("expert types are checked in HipSession::new")
}

impl Pass<'_> {
    pub(super) fn run(&self, launch: &kernels::Launch) -> Result<(), BackendError> {
        let twin = match self.arithmetic {
            Arithmetic::Fast => kernels::fast_twin_tuned(launch, self.fast_grids),
            Arithmetic::Exact => None,
        };
        let launch = twin.as_ref().unwrap_or(launch);
        let stream = self.launch_stream();
        // Attribution runs only (repeat.rs): the same launch once more, before the counted one.
        if super::repeat::repeats(launch.kernel.name, self.overlap.get()) {
            // SAFETY: as below; the kernel reads and writes the same buffers twice.
            self.profile
                .time(launch, stream, || unsafe { self.kernels.launch(stream, launch, true) })
                .map_err(|e| BackendError::Device(format!("{}: {e}", launch.kernel.name)))?;
        }
        // SAFETY: every buffer was sized in `new` for the model's shapes and `ctx` (positions are
        // checked against ctx in `eval`), and the weight pointers address tensors of the uploaded file.
        self.profile
            .time(launch, stream, || unsafe {
                self.kernels.launch(stream, launch, self.overlap.get())
            })
            .map_err(|e| BackendError::Device(format!("{}: {e}", launch.kernel.name)))
    }

    /// The stream launches go to now: the forked lane's inside `fork`, else the main stream.
    fn launch_stream(&self) -> &Stream {
        self.lane
            .get()
            .and_then(|k| self.lanes.stream(k))
            .unwrap_or(self.stream)
    }

    /// Issue `chain`'s launches on side lane `k` (lanes.rs): they start after every launch issued
    /// so far and run beside the main stream's later launches until `join(k)`. The caller
    /// guarantees that nothing the main stream issues before the join reads or writes a buffer the
    /// chain writes, or writes one it reads. With lanes off, the chain runs on the main stream.
    pub(super) fn fork<R>(&self, k: usize, chain: impl FnOnce() -> Result<R, BackendError>) -> Result<R, BackendError> {
        assert!(k < SIDE_LANES, "fork: lane {k} of {SIDE_LANES}");
        assert!(self.lane.get().is_none(), "fork: lane {k} inside a chain");
        // An HC post held back for the next HC pre is the main stream's: issue it first.
        self.flush_launches()?;
        if !self.lanes.on() {
            return chain();
        }
        self.lanes.fork(k, self.stream).map_err(dev)?;
        self.forked.set(self.forked.get() | 1 << k);
        self.lane.set(Some(k));
        let issued = chain();
        self.lane.set(None);
        issued
    }

    /// Make the main stream's later launches wait for side lane `k`'s chain (nothing when it was
    /// not forked since its last join).
    pub(super) fn join(&self, k: usize) -> Result<(), BackendError> {
        if self.forked.get() & (1 << k) == 0 {
            return Ok(());
        }
        self.forked.set(self.forked.get() & !(1 << k));
        self.lanes.join(k, self.stream).map_err(dev)
    }

    /// Join every side lane still forked: a sublayer ends with all its chains joined.
    pub(super) fn join_all(&self) -> Result<(), BackendError> {
        (0..SIDE_LANES).try_for_each(|k| self.join(k))
    }

    pub(super) fn w(&self, t: &TensorRef) -> DevPtr {
        self.weights.tensor(t).0
    }

    /// Whether a batch of `n` tokens runs the decode kernels token by token (`prefill::token_wise`).
    pub(super) fn token_wise<N: Into<u64>>(&self, n: N) -> bool {
        prefill::token_wise(self.matvec_tokens, n.into())
    }

    /// Whether a batch of `n` tokens takes the fast-mode decode fusions: fast arithmetic and a
    /// token-wise batch (the fused kernels are the decode kernels' twins).
    pub(super) fn fast_token_wise<N: Into<u64>>(&self, n: N) -> bool {
        self.is_fast() && self.token_wise(n)
    }

    /// Whether a batch of `n` tokens runs the column matvecs (`prefill::columns`: 2 to
    /// `COLUMN_MAX_TOKENS` tokens, each weight read once for all of them).
    pub(super) fn columns<N: Into<u64>>(&self, n: N) -> bool {
        prefill::columns(self.matvec_tokens, n.into())
    }

    /// Whether a batch of `n` tokens takes the fast-mode decode fusions that have no column form
    /// (the normed products): fast arithmetic and a token-wise batch that does not run the column
    /// matvecs. A column batch runs the launches they replace.
    pub(super) fn fast_token_fusions<N: Into<u64> + Copy>(&self, n: N) -> bool {
        self.fast_token_wise(n) && !self.columns(n)
    }

    /// Whether the launches run in fast arithmetic.
    pub(super) fn is_fast(&self) -> bool {
        self.arithmetic == Arithmetic::Fast
    }

    /// Every launch of the sequence goes through here (counted for `launch_count`). In fast mode an
    /// HC post waits for the next launch: the next sublayer's HC pre takes it into one launch
    /// (`kernels::fused_hc_post_pre`), any other launch, or `flush_launches`, issues it first.
    pub(super) fn launch(&self, l: &kernels::Launch) -> Result<(), BackendError> {
        if let Some(post) = self.pending_post.take() {
            if let Some(fused) = kernels::fused_hc_post_pre(&post, l) {
                return self.launch_now(&fused);
            }
            self.launch_now(&post)?;
        }
        if self.is_fast() && l.kernel.name == kernels::HC_POST.name {
            self.pending_post.set(Some(l.clone()));
            return Ok(());
        }
        self.launch_now(l)
    }

    /// Issues the launch `launch` still holds back: call at the end of a launch sequence.
    pub(super) fn flush_launches(&self) -> Result<(), BackendError> {
        match self.pending_post.take() {
            Some(post) => self.launch_now(&post),
            None => Ok(()),
        }
    }

    fn launch_now(&self, l: &kernels::Launch) -> Result<(), BackendError> {
        self.acts.launches.set(self.acts.launches.get() + 1);
        self.run(l)
    }

    /// Q8_0 planes (codes `q`, scales `d`) of `rows` rows of `n` floats at `x`: the activation
    /// quantization before a Q8_0 projection (docs/arithmetic.md#dot-products).
    pub(super) fn quantize_q8_0(&self, q: DevPtr, d: DevPtr, x: DevPtr, n: u32, rows: u32) -> Result<(), BackendError> {
        self.launch(&kernels::quantize_rows(QuantOut::q8_0(q, d), x, n, rows))
    }

    /// Two `ds4_rows_finish` launches of the same tokens (`kernels::rows_finish`): one launch in fast
    /// arithmetic where `kernels::fused_rows_finish_pair` takes them.
    pub(super) fn launch_rows_pair(
        &self,
        first: &kernels::Launch,
        second: &kernels::Launch,
    ) -> Result<(), BackendError> {
        if self.is_fast()
            && let Some(paired) = kernels::fused_rows_finish_pair(first, second)
        {
            return self.launch(&paired);
        }
        self.launch(first)?;
        self.launch(second)
    }

    /// `ds4_rows_finish` in place on the `n_head` rows of `head_dim` floats of every batch token at `x`
    /// (query heads, indexer queries, attention output: no ring store, no norm weight).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn head_rows_in_place(
        &self,
        x: DevPtr,
        pos: DevPtr,
        n_head: u32,
        head_dim: u32,
        flags: u32,
        rope: RopeParams,
        nt: u32,
    ) -> Result<(), BackendError> {
        let eps = self.model.hp.rms_eps;
        self.launch(&kernels::rows_finish(
            x, NULL, NULL, pos, n_head, head_dim, flags, 1, rope, eps, nt,
        ))
    }

    /// HC pre of a sublayer and its input norm (docs/model.md#hc-pre, then the attention or FFN norm),
    /// fused: the split goes to `split`, the normed input to `xn` and its Q8_0 planes (plus Q8_K for
    /// the FFN's routed experts when `q8_k`). `w` = [hc fn, hc scale, hc base, norm weight] of the
    /// sublayer.
    pub(super) fn hc_pre(&self, split: DevPtr, q8_k: bool, w: [&TensorRef; 4], nt: u32) -> Result<(), BackendError> {
        let hp = &self.model.hp;
        let a = &self.acts;
        let p0 = |b: &DeviceBuffer| b.ptr().0;
        let (ne, nhc) = (hp.n_embd as u32, hp.n_hc as u32);
        let mut quant = QuantOut {
            out: p0(&a.xn),
            ..QuantOut::q8_0(p0(&a.xq), p0(&a.xd))
        };
        if q8_k {
            (quant.q8_k_q, quant.q8_k_d, quant.q8_k_bs) = (p0(&a.kq), p0(&a.kd), p0(&a.kbs));
        }
        self.launch(&kernels::hc_pre_fused(
            split,
            quant,
            p0(&a.mix),
            p0(&a.counter),
            self.hc_state(),
            self.w(w[0]),
            self.w(w[1]),
            self.w(w[2]),
            self.w(w[3]),
            ne,
            nhc,
            hp.sinkhorn_iters as u32,
            self.hc_eps(),
            nt,
        ))
    }

    /// The buffer holding the HC state now (`acts.hc` after the embedding, `advance_hc` then).
    pub(super) fn hc_state(&self) -> DevPtr {
        let a = &self.acts;
        p0(if self.hc_in_alt.get() { &a.hc_alt } else { &a.hc })
    }

    /// Where an HC post of `n` tokens reads and writes the state: (hc_out, hc_in). In place, except
    /// in fast arithmetic for batches whose fused HC post + pre runs a block per mix row: those
    /// write out of place, every block its share of the state, instead of one block all of it
    /// after the others have read it (kernels/hc_fast.hip), and the state moves to the other buffer.
    pub(super) fn advance_hc(&self, n: u32) -> (DevPtr, DevPtr) {
        let hc_in = self.hc_state();
        let out_of_place =
            self.is_fast() && !kernels::hc_per_token(n) && n as usize <= super::acts::hc_alt_tokens(self.acts.n_max);
        if !out_of_place {
            return (hc_in, hc_in);
        }
        self.hc_in_alt.set(!self.hc_in_alt.get());
        (self.hc_state(), hc_in)
    }

    pub(super) fn hc_eps(&self) -> HcEps {
        let hp = &self.model.hp;
        HcEps {
            rms: hp.hc_eps,
            hc: hp.hc_eps,
            norm: hp.rms_eps,
        }
    }

    /// y[t] = W · x_t for Q8_0 weights and Q8_0 activations: a matvec for one token, the column
    /// matvec for a verify block that takes it (`q8_columns`), the tiled GEMM for a chunk (when the
    /// group size fits its 64-row tiles; on matrix cores in fast mode).
    pub(super) fn proj_q8_0(&self, p: &Q8Proj, n: u32) -> Result<(), BackendError> {
        let product = if self.q8_columns(p, n) {
            kernels::matvec_q8_0_cols
        } else if self.token_wise(n) || !p.rows_per_group.is_multiple_of(GEMM_TILE) {
            kernels::matvec_q8_0
        } else {
            kernels::gemm_q8_0
        };
        self.launch(&product(p, n))
    }

    /// Whether a Q8_0 projection of a block of `n` runs the column kernel (`columns`). In fast
    /// arithmetic a shape the register-held form does not take (`kernels::q8_0_cols_held`) reloads
    /// every column's activations each round, which costs more than the shared weight reads save
    /// on rows a warp covers in K-slices (more than `warp_size / 2` chunks of 256,
    /// kernels/matvec_fast.hip `DS4_Q8T_CHUNKS`) and on grouped rows; those take the one-token
    /// kernel over the block instead, with the same bits
    /// (docs/benchmarks.md#fast-q8_0-column-matvecs-per-shape).
    fn q8_columns(&self, p: &Q8Proj, n: u32) -> bool {
        let held = kernels::q8_0_cols_held(p.n_in, p.n_out, p.rows_per_group, self.warp_size);
        let sliced = p.n_in > self.warp_size / 2 * 256;
        self.columns(n) && !(self.is_fast() && !held && (sliced || p.rows_per_group < p.n_out))
    }

    /// `proj_q8_0(first)` and `proj_q8_0(second)`, two projections of the same activations: in fast
    /// arithmetic one launch for token-wise batches (`kernels::paired_matvec_q8_0`, or its column
    /// form for a verify block: the same bits).
    pub(super) fn proj_q8_0_pair(&self, first: &Q8Proj, second: &Q8Proj, n: u32) -> Result<(), BackendError> {
        let paired = |columns| match columns {
            true => kernels::paired_matvec_q8_0_cols(first, second, n, self.fast_grids),
            false => kernels::paired_matvec_q8_0(first, second, n, self.fast_grids),
        };
        if self.launch_fast_fusion(n, self.columns(n), paired)? {
            return Ok(());
        }
        self.proj_q8_0(first, n)?;
        self.proj_q8_0(second, n)
    }

    /// `proj_q8_0` of `p` followed by the Q8_0 quantization of its output rows into `planes` (codes,
    /// scales): one launch in fast arithmetic for token-wise batches where
    /// `kernels::matvec_q8_0_quantized` (or its column form) takes the shape (the f32 output is then
    /// not written).
    pub(super) fn proj_q8_0_quantized(&self, p: &Q8Proj, planes: (DevPtr, DevPtr), n: u32) -> Result<(), BackendError> {
        let fused = |columns| match columns {
            true => kernels::matvec_q8_0_quantized_cols(p, planes, n, self.fast_grids),
            false => kernels::matvec_q8_0_quantized(p, planes, n, self.fast_grids),
        };
        if self.launch_fast_fusion(n, self.q8_columns(p, n), fused)? {
            return Ok(());
        }
        self.proj_q8_0(p, n)?;
        self.quantize_q8_0(planes.0, planes.1, p.y, p.n_out, n)
    }

    /// In fast arithmetic for a token-wise batch of `n`, the fused launch `fusion(columns)` builds
    /// (`columns`: its column form, for a verify block that takes it) where it takes the shape.
    /// Whether it ran; where not, the caller issues the unfused launches.
    fn launch_fast_fusion(
        &self,
        n: u32,
        columns: bool,
        fusion: impl FnOnce(bool) -> Option<kernels::Launch>,
    ) -> Result<bool, BackendError> {
        if !self.fast_token_wise(n) {
            return Ok(false);
        }
        match fusion(columns) {
            Some(launch) => self.launch(&launch).map(|()| true),
            None => Ok(false),
        }
    }

    /// The shared expert's gate/up + SwiGLU of `n` tokens.
    pub(super) fn swiglu_q8_0(&self, s: &Q8Swiglu, n: u32) -> Result<(), BackendError> {
        self.launch(&self.swiglu_product(s, n))
    }

    /// The launch `swiglu_q8_0` issues (for a fusion to take it in): the matvec for one token, the
    /// column matvec for a verify block, the GEMM for a chunk.
    pub(super) fn swiglu_product(&self, s: &Q8Swiglu, n: u32) -> kernels::Launch {
        let product = if self.columns(n) {
            kernels::matvec_q8_0_swiglu_cols
        } else if self.token_wise(n) {
            kernels::matvec_q8_0_swiglu
        } else {
            kernels::gemm_q8_0_swiglu
        };
        product(s, n)
    }

    /// y[t] = W · x_t for F16 weights and f32 activations (matvec for one token, column matvec for a
    /// verify block, GEMM for a chunk: on matrix cores in fast mode).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn proj_f16(
        &self,
        y: DevPtr,
        w: DevPtr,
        x: DevPtr,
        n_in: u32,
        n_out: u32,
        x_stride: u32,
        n: u32,
    ) -> Result<(), BackendError> {
        self.launch(&self.f16_product(y, w, x, n_in, n_out, x_stride, n))
    }

    /// The launch `proj_f16` issues (for a fusion to take it in).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn f16_product(
        &self,
        y: DevPtr,
        w: DevPtr,
        x: DevPtr,
        n_in: u32,
        n_out: u32,
        x_stride: u32,
        n: u32,
    ) -> kernels::Launch {
        let product = if self.columns(n) {
            kernels::matvec_f16_cols
        } else if self.token_wise(n) {
            kernels::matvec_f16
        } else {
            kernels::gemm_f16
        };
        product(y, w, x, n_in, n_out, x_stride, n)
    }

    /// y0[t] = W0 · x_t and y1[t] = W1 · x_t (F16, the same shapes) in one launch for a token-wise
    /// batch of `n` tokens: the pair matvec, or its column form for a verify block.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn f16_pair_product(
        &self,
        (y0, y1): (DevPtr, DevPtr),
        (w0, w1): (DevPtr, DevPtr),
        x: DevPtr,
        n_in: u32,
        n_out: u32,
        x_stride: u32,
        n: u32,
    ) -> kernels::Launch {
        let product = match self.columns(n) {
            true => kernels::matvec_f16_pair_cols,
            false => kernels::matvec_f16_pair,
        };
        product(y0, y1, w0, w1, x, n_in, n_out, x_stride, n)
    }
}
