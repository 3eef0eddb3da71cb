//! The GPU kernels seen from Rust: the table of kernel names with their C parameter lists, typed
//! launch builders (grid/block and argument packing for every kernel in `kernels/*.hip`), and the
//! AMD code objects that build.rs embedded.
//!
//! Owns the Rust mirror of the kernels' C ABI; the test `kernel_table_matches_sources` parses the
//! kernel sources and fails on any drift in names, order, names or kinds of parameters. Must not call
//! the HIP runtime: a [`Launch`] is plain data that `runtime.rs` executes (`hipModuleLaunchKernel`
//! with one pointer per argument, see [`Launch::packed`]), so this file also builds (and is tested)
//! without the `hip` feature.
//!
//! Conventions (kernels/prelude.h): device pointers are passed as `u64` addresses ([`DevPtr`], 0 =
//! null where a kernel accepts null); sizes are `u32`; every kernel runs 256-thread blocks; the
//! grids below do not depend on the device's wave size (32 or 64).
//!
//! Code objects: one per target, all kernels in one module. AMD targets are embedded at build time
//! (`ds4_kernels.<gfx>.hsaco`, [`embedded_code_object`]); NVIDIA ones are files
//! `$DS4_KERNEL_DIR/ds4_kernels.sm_<cc>.cubin` built by tools/build-kernels-nvcc.sh.
#![allow(clippy::too_many_arguments)]

use std::ffi::c_void;

/// A device address as passed to a kernel (8 bytes by value); 0 is the null pointer.
pub type DevPtr = u64;
/// The null device pointer, for the arguments documented as nullable.
pub const NULL: DevPtr = 0;

/// Threads per block of every kernel (kernels/prelude.h: DS4_BLOCK).
pub const BLOCK: u32 = 256;
/// Output rows per block of the matvec-style kernels (DS4_MV_ROWS, DS4_MOE_ROWS).
pub const MATVEC_ROWS: u32 = 8;
/// Rows per block of `ds4_attention_scores` (DS4_ATT_SCORE_ROWS); heads and dims per block of
/// `ds4_attention_values` (DS4_ATT_VAL_HEADS, DS4_ATT_VAL_DIMS).
pub const ATTENTION_SCORE_ROWS: u32 = 8;
pub const ATTENTION_VAL_HEADS: u32 = 8;
pub const ATTENTION_VAL_DIMS: u32 = 64;
/// Largest head_dim of the attention kernels (DS4_ATT_MAX_DIM) and of `ds4_rows_finish`.
pub const ATTENTION_MAX_DIM: u32 = 512;
pub const ROWS_MAX_DIM: u32 = 1024;
/// Compressed rows per block of `ds4_indexer_scores` (DS4_IDX_ROWS).
pub const INDEXER_ROWS: u32 = 16;

/// File stem of the kernel images (one module with every kernel).
pub const KERNEL_IMAGE_STEM: &str = "ds4_kernels";

/// The C type class of one kernel parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgKind {
    /// Any device pointer (`T*`).
    Ptr,
    /// `u32` (also `i32`-free: every integer parameter of the kernels is unsigned 32-bit).
    U32,
    /// `u64`.
    U64,
    /// `float`.
    F32,
}

/// One kernel argument value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Arg {
    Ptr(DevPtr),
    U32(u32),
    U64(u64),
    F32(f32),
}

impl Arg {
    pub fn kind(self) -> ArgKind {
        match self {
            Arg::Ptr(_) => ArgKind::Ptr,
            Arg::U32(_) => ArgKind::U32,
            Arg::U64(_) => ArgKind::U64,
            Arg::F32(_) => ArgKind::F32,
        }
    }

    /// The argument's bytes in the low end of an 8-byte little-endian slot.
    fn slot(self) -> u64 {
        match self {
            Arg::Ptr(p) | Arg::U64(p) => p,
            Arg::U32(v) => v as u64,
            Arg::F32(f) => f.to_bits() as u64,
        }
    }
}

/// One parameter of a kernel: its C name and kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Param {
    pub name: &'static str,
    pub kind: ArgKind,
}

/// A kernel of the module: `extern "C"` name and parameter list.
#[derive(Debug, PartialEq, Eq)]
pub struct KernelDef {
    pub name: &'static str,
    pub params: &'static [Param],
}

macro_rules! kernel_defs {
    ($( $(#[$doc:meta])* $konst:ident = $name:literal ( $($p:ident : $k:ident),* $(,)? ); )*) => {
        $( $(#[$doc])* pub const $konst: KernelDef = KernelDef {
            name: $name,
            params: &[$(Param { name: stringify!($p), kind: ArgKind::$k }),*],
        }; )*
        /// Every kernel of the module, in source order of kernels/ds4.hip's includes.
        pub const ALL_KERNELS: &[&KernelDef] = &[$(&$konst),*];
    };
}

kernel_defs! {
    /// kernels/norm_quant.hip
    EMBED_HC = "ds4_embed_hc"(hc: Ptr, emb: Ptr, tokens: Ptr, n_embd: U32, n_hc: U32, n_vocab: U32, n_tok: U32);
    FILL_F32 = "ds4_fill_f32"(x: Ptr, n: U64, v: F32);
    RMS_NORM_QUANT = "ds4_rms_norm_quant"(out: Ptr, q0_q: Ptr, q0_d: Ptr, qk_q: Ptr, qk_d: Ptr, qk_bs: Ptr, x: Ptr,
        w: Ptr, n: U32, x_stride: U32, flags: U32, eps: F32);
    /// kernels/matvec.hip
    MATVEC_Q8_0 = "ds4_matvec_q8_0"(y: Ptr, w: Ptr, xq: Ptr, xd: Ptr, n_in: U32, n_out: U32, rows_per_group: U32,
        x_stride: U32);
    MATVEC_Q8_0_SWIGLU = "ds4_matvec_q8_0_swiglu"(mid: Ptr, wg: Ptr, wu: Ptr, xq: Ptr, xd: Ptr, n_in: U32, n_ff: U32,
        limit: F32);
    MATVEC_F16 = "ds4_matvec_f16"(y: Ptr, w: Ptr, x: Ptr, n_in: U32, n_out: U32, x_stride: U32);
    MATVEC_F16_PAIR = "ds4_matvec_f16_pair"(y0: Ptr, y1: Ptr, w0: Ptr, w1: Ptr, x: Ptr, n_in: U32, n_out: U32,
        x_stride: U32);
    /// kernels/moe.hip
    ROUTER = "ds4_router"(sel: Ptr, selw: Ptr, logits: Ptr, bias: Ptr, tid2eid: Ptr, tokens: Ptr, n_expert: U32,
        n_used: U32, weight_scale: F32, n_tok: U32);
    MOE_GATE_UP_IQ2_XXS = "ds4_moe_gate_up_iq2_xxs"(mid: Ptr, gate: Ptr, up: Ptr, xq: Ptr, xd: Ptr, xbs: Ptr,
        sel: Ptr, selw: Ptr, n_in: U32, n_ff: U32, n_used: U32, limit: F32);
    MOE_DOWN_IQ2_XXS = "ds4_moe_down_iq2_xxs"(out: Ptr, down: Ptr, mq: Ptr, md: Ptr, mbs: Ptr, sel: Ptr, n_ff: U32,
        n_out: U32, n_used: U32);
    MOE_GATE_UP_Q2_K = "ds4_moe_gate_up_q2_k"(mid: Ptr, gate: Ptr, up: Ptr, xq: Ptr, xd: Ptr, xbs: Ptr, sel: Ptr,
        selw: Ptr, n_in: U32, n_ff: U32, n_used: U32, limit: F32);
    MOE_DOWN_Q2_K = "ds4_moe_down_q2_k"(out: Ptr, down: Ptr, mq: Ptr, md: Ptr, mbs: Ptr, sel: Ptr, n_ff: U32,
        n_out: U32, n_used: U32);
    MOE_GATE_UP_Q4_K = "ds4_moe_gate_up_q4_k"(mid: Ptr, gate: Ptr, up: Ptr, xq: Ptr, xd: Ptr, xbs: Ptr, sel: Ptr,
        selw: Ptr, n_in: U32, n_ff: U32, n_used: U32, limit: F32);
    MOE_DOWN_Q4_K = "ds4_moe_down_q4_k"(out: Ptr, down: Ptr, mq: Ptr, md: Ptr, mbs: Ptr, sel: Ptr, n_ff: U32,
        n_out: U32, n_used: U32);
    MATVEC_IQ2_XXS = "ds4_matvec_iq2_xxs"(y: Ptr, w: Ptr, xq: Ptr, xd: Ptr, xbs: Ptr, n_in: U32, n_out: U32);
    MATVEC_Q2_K = "ds4_matvec_q2_k"(y: Ptr, w: Ptr, xq: Ptr, xd: Ptr, xbs: Ptr, n_in: U32, n_out: U32);
    MATVEC_Q4_K = "ds4_matvec_q4_k"(y: Ptr, w: Ptr, xq: Ptr, xd: Ptr, xbs: Ptr, n_in: U32, n_out: U32);
    /// kernels/hc.hip
    HC_MIX = "ds4_hc_mix"(mix: Ptr, hc: Ptr, fn_w: Ptr, n_in: U32, n_mix: U32, eps: F32);
    HC_PRE_FINISH = "ds4_hc_pre_finish"(x_out: Ptr, split_out: Ptr, mix: Ptr, hc: Ptr, scale: Ptr, base: Ptr,
        n_embd: U32, n_hc: U32, iters: U32, eps_hc: F32);
    HC_PRE_FUSED = "ds4_hc_pre_fused"(split_out: Ptr, xn: Ptr, q0_q: Ptr, q0_d: Ptr, qk_q: Ptr, qk_d: Ptr,
        qk_bs: Ptr, mix: Ptr, counter: Ptr, hc: Ptr, fn_w: Ptr, scale: Ptr, base: Ptr, norm_w: Ptr, n_embd: U32,
        n_hc: U32, iters: U32, eps_rms: F32, eps_hc: F32, eps_norm: F32);
    HC_HEAD_FINISH = "ds4_hc_head_finish"(x_out: Ptr, mix: Ptr, hc: Ptr, scale: Ptr, base: Ptr, n_embd: U32,
        n_hc: U32, eps_hc: F32);
    HC_POST = "ds4_hc_post"(hc_out: Ptr, hc_in: Ptr, y: Ptr, y2: Ptr, split: Ptr, n_embd: U32, n_hc: U32);
    /// kernels/rows.hip
    ROWS_FINISH = "ds4_rows_finish"(x: Ptr, ring: Ptr, w: Ptr, pos: Ptr, n_head: U32, head_dim: U32, n_rot: U32,
        flags: U32, n_tok: U32, emit_ratio: U32, row_cap: U32, ring_cap: U32, theta_scale: F32, freq_scale: F32,
        ext_factor: F32, corr_low: F32, corr_high: F32, mscale: F32, eps: F32);
    /// kernels/attention.hip
    ATTENTION_SCORES = "ds4_attention_scores"(sc: Ptr, q: Ptr, ring: Ptr, comp: Ptr, comp_sel: Ptr, pos: Ptr,
        n_head: U32, head_dim: U32, ring_cap: U32, window: U32, n_comp_avail: U32, ratio: U32, top_k: U32,
        sc_stride: U32, scale: F32);
    ATTENTION_SOFTMAX = "ds4_attention_softmax"(sc: Ptr, inv: Ptr, sinks: Ptr, comp_sel: Ptr, pos: Ptr, n_head: U32,
        window: U32, n_comp_avail: U32, ratio: U32, top_k: U32, sc_stride: U32);
    ATTENTION_VALUES = "ds4_attention_values"(out: Ptr, sc: Ptr, inv: Ptr, ring: Ptr, comp: Ptr, comp_sel: Ptr,
        pos: Ptr, n_head: U32, head_dim: U32, ring_cap: U32, window: U32, n_comp_avail: U32, ratio: U32, top_k: U32,
        sc_stride: U32);
    /// kernels/compressor.hip
    COMPRESSOR_POOL = "ds4_compressor_pool"(comp_rows: Ptr, state_kv: Ptr, state_score: Ptr, kv_cur: Ptr,
        sc_cur: Ptr, ape: Ptr, pos: Ptr, head_dim: U32, ratio: U32, n_tok: U32, comp_cap: U32);
    /// kernels/indexer.hip
    INDEXER_SCORES = "ds4_indexer_scores"(scores: Ptr, qi: Ptr, w: Ptr, krows: Ptr, pos: Ptr, n_head: U32,
        n_comp_avail: U32, ratio: U32, top_k: U32, score_stride: U32, w_scale: F32);
    INDEXER_TOPK = "ds4_indexer_topk"(sel: Ptr, scores: Ptr, pos: Ptr, score_stride: U32, n_comp_avail: U32,
        ratio: U32, top_k: U32);
    /// kernels/sample.hip
    ARGMAX = "ds4_argmax"(out: Ptr, logits: Ptr, n: U32);
    SAMPLE_MIN_P = "ds4_sample_min_p"(out: Ptr, logits: Ptr, n: U32, temp: F32, min_p: F32, u01: F32);
    /// kernels/gemm.hip
    GEMM_Q8_0 = "ds4_gemm_q8_0"(y: Ptr, w: Ptr, xq: Ptr, xd: Ptr, n_in: U32, n_out: U32, rows_per_group: U32,
        x_stride: U32, n_tok: U32);
    GEMM_Q8_0_SWIGLU = "ds4_gemm_q8_0_swiglu"(mid: Ptr, wg: Ptr, wu: Ptr, xq: Ptr, xd: Ptr, n_in: U32, n_ff: U32,
        limit: F32, n_tok: U32);
    MOE_GROUP = "ds4_moe_group"(pairs: Ptr, tiles: Ptr, n_tiles: Ptr, sel: Ptr, n_tok: U32, n_used: U32,
        n_expert: U32, min_cols: U32);
    MOE_GEMM_GATE_UP_IQ2_XXS = "ds4_moe_gemm_gate_up_iq2_xxs"(mid: Ptr, gate: Ptr, up: Ptr, xq: Ptr, xd: Ptr,
        xbs: Ptr, pairs: Ptr, tiles: Ptr, n_tiles: Ptr, selw: Ptr, n_in: U32, n_ff: U32, n_used: U32, limit: F32);
    MOE_GEMM_GATE_UP_Q2_K = "ds4_moe_gemm_gate_up_q2_k"(mid: Ptr, gate: Ptr, up: Ptr, xq: Ptr, xd: Ptr, xbs: Ptr,
        pairs: Ptr, tiles: Ptr, n_tiles: Ptr, selw: Ptr, n_in: U32, n_ff: U32, n_used: U32, limit: F32);
    MOE_GEMM_GATE_UP_Q4_K = "ds4_moe_gemm_gate_up_q4_k"(mid: Ptr, gate: Ptr, up: Ptr, xq: Ptr, xd: Ptr, xbs: Ptr,
        pairs: Ptr, tiles: Ptr, n_tiles: Ptr, selw: Ptr, n_in: U32, n_ff: U32, n_used: U32, limit: F32);
    MOE_GEMM_DOWN_IQ2_XXS = "ds4_moe_gemm_down_iq2_xxs"(outp: Ptr, down: Ptr, mq: Ptr, md: Ptr, mbs: Ptr,
        pairs: Ptr, tiles: Ptr, n_tiles: Ptr, n_ff: U32, n_out: U32, n_used: U32);
    MOE_GEMM_DOWN_Q2_K = "ds4_moe_gemm_down_q2_k"(outp: Ptr, down: Ptr, mq: Ptr, md: Ptr, mbs: Ptr, pairs: Ptr,
        tiles: Ptr, n_tiles: Ptr, n_ff: U32, n_out: U32, n_used: U32);
    MOE_GEMM_DOWN_Q4_K = "ds4_moe_gemm_down_q4_k"(outp: Ptr, down: Ptr, mq: Ptr, md: Ptr, mbs: Ptr, pairs: Ptr,
        tiles: Ptr, n_tiles: Ptr, n_ff: U32, n_out: U32, n_used: U32);
    MOE_SUM = "ds4_moe_sum"(out: Ptr, outp: Ptr, n_out: U32, n_used: U32);
    GEMM_F16 = "ds4_gemm_f16"(y: Ptr, w: Ptr, x: Ptr, n_in: U32, n_out: U32, x_stride: U32, n_tok: U32);
    /// kernels/mathf.h (selftest of the transcendental functions)
    TEST_MATHF = "ds4_test_mathf"(out: Ptr, input: Ptr, n: U32, which: U32);
}

/// Look a kernel up by name.
pub fn kernel_def(name: &str) -> Option<&'static KernelDef> {
    ALL_KERNELS.iter().copied().find(|k| k.name == name)
}

/// One kernel launch as plain data: which kernel, the launch shape and the argument values.
#[derive(Clone, Debug, PartialEq)]
pub struct Launch {
    pub kernel: &'static KernelDef,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_bytes: u32,
    pub args: Vec<Arg>,
}

impl Launch {
    /// Builds a launch, checking the arguments against the kernel's parameter list (a mismatch is a
    /// bug in this file, caught by the tests that call every builder).
    fn new(kernel: &'static KernelDef, grid: [u32; 3], args: Vec<Arg>) -> Launch {
        assert_eq!(args.len(), kernel.params.len(), "{}: argument count", kernel.name);
        for (a, p) in args.iter().zip(kernel.params) {
            assert_eq!(a.kind(), p.kind, "{}: argument {}", kernel.name, p.name);
        }
        assert!(grid.iter().all(|&g| g > 0), "{}: empty grid {grid:?}", kernel.name);
        Launch {
            kernel,
            grid,
            block: [BLOCK, 1, 1],
            shared_bytes: 0,
            args,
        }
    }

    /// The arguments packed for `hipModuleLaunchKernel`'s `kernelParams`.
    pub fn packed(&self) -> PackedArgs {
        PackedArgs {
            slots: self.args.iter().map(|a| a.slot()).collect(),
        }
    }
}

/// Bridge to the runtime (`runtime.rs`): the launch shape and the arguments in its types, so a
/// launch runs as `module.function(l.kernel.name)?.launch(&stream, l.dims(), &mut l.kernel_args())`.
#[cfg(feature = "hip")]
impl Launch {
    pub fn dims(&self) -> super::runtime::LaunchDims {
        super::runtime::LaunchDims {
            grid: self.grid,
            block: self.block,
            shared_bytes: self.shared_bytes,
        }
    }

    pub fn kernel_args(&self) -> super::runtime::KernelArgs {
        let mut a = super::runtime::KernelArgs::new();
        for arg in &self.args {
            match *arg {
                Arg::Ptr(p) => a.push(super::runtime::DevicePtr(p)),
                Arg::U32(v) => a.push(v),
                Arg::U64(v) => a.push(v),
                Arg::F32(v) => a.push(v),
            };
        }
        a
    }
}

/// Argument values in 8-byte little-endian slots, one per argument.
pub struct PackedArgs {
    slots: Vec<u64>,
}

impl PackedArgs {
    /// One pointer per argument, for `kernelParams` (valid while `self` lives and is not moved).
    pub fn pointers(&mut self) -> Vec<*mut c_void> {
        self.slots
            .iter_mut()
            .map(|s| (s as *mut u64).cast::<c_void>())
            .collect()
    }

    /// The raw slots (for tests and for runtimes that pack arguments themselves).
    pub fn slots(&self) -> &[u64] {
        &self.slots
    }
}

fn blocks(n: u32, per_block: u32) -> u32 {
    n.div_ceil(per_block).max(1)
}

fn ptr(p: DevPtr) -> Arg {
    Arg::Ptr(p)
}
fn u(v: u32) -> Arg {
    Arg::U32(v)
}
fn f(v: f32) -> Arg {
    Arg::F32(v)
}

// ---------------------------------------------------------------------------------------------
// Typed builders. Shapes and layouts are documented on the kernels (kernels/*.hip); each builder
// states the kernel and the launch grid it computes.
// ---------------------------------------------------------------------------------------------

/// `ds4_embed_hc`: HC state [n_tok][n_hc][n_embd] from F16 embedding rows of device token ids.
pub fn embed_hc(hc: DevPtr, emb: DevPtr, tokens: DevPtr, n_embd: u32, n_hc: u32, n_vocab: u32, n_tok: u32) -> Launch {
    Launch::new(
        &EMBED_HC,
        [blocks(n_embd, BLOCK), n_tok, 1],
        vec![ptr(hc), ptr(emb), ptr(tokens), u(n_embd), u(n_hc), u(n_vocab), u(n_tok)],
    )
}

/// `ds4_fill_f32`: x[0..n) = v.
pub fn fill_f32(x: DevPtr, n: u64, v: f32) -> Launch {
    let g = n.div_ceil(BLOCK as u64).max(1);
    assert!(g <= u32::MAX as u64, "fill_f32: {n} floats is too many for one launch");
    Launch::new(&FILL_F32, [g as u32, 1, 1], vec![ptr(x), Arg::U64(n), f(v)])
}

/// Which function `ds4_test_mathf` applies (kernels/mathf.h; `backend::cpu::transcend` on the host).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MathFn {
    Exp = 0,
    Ln1p = 1,
    Sin = 2,
    Cos = 3,
    Log2 = 4,
}

impl MathFn {
    pub const ALL: [MathFn; 5] = [MathFn::Exp, MathFn::Ln1p, MathFn::Sin, MathFn::Cos, MathFn::Log2];

    /// The host function the kernel must reproduce bit for bit.
    pub fn host(self) -> fn(f32) -> f32 {
        use crate::backend::cpu::transcend;
        match self {
            MathFn::Exp => transcend::exp,
            MathFn::Ln1p => transcend::ln_1p,
            MathFn::Sin => transcend::sin,
            MathFn::Cos => transcend::cos,
            MathFn::Log2 => transcend::log2,
        }
    }
}

/// `ds4_test_mathf`: out[i] = f(input[i]) for i < n (selftest of kernels/mathf.h).
pub fn test_mathf(out: DevPtr, input: DevPtr, n: u32, which: MathFn) -> Launch {
    Launch::new(
        &TEST_MATHF,
        [blocks(n, BLOCK), 1, 1],
        vec![ptr(out), ptr(input), u(n), u(which as u32)],
    )
}

/// Flags of [`rms_norm_quant`]: apply RMSNorm (else plain quantization of x).
pub const NQ_NORM: u32 = 1;

/// Outputs of [`rms_norm_quant`]; `NULL` entries are not produced.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QuantOut {
    /// f32 [rows][n]: the (normed) row.
    pub out: DevPtr,
    /// Q8_0 activation planes: q int8 [rows][n], d f32 [rows][n/32].
    pub q8_0_q: DevPtr,
    pub q8_0_d: DevPtr,
    /// Q8_K activation planes: q int8 [rows][n], d f32 [rows][n/256], bsums i16 [rows][n/16].
    pub q8_k_q: DevPtr,
    pub q8_k_d: DevPtr,
    pub q8_k_bs: DevPtr,
}

/// `ds4_rms_norm_quant`: per row of n floats (row r at x + r*x_stride), optional RMSNorm times w
/// (w may be NULL), then the requested outputs. Grid (rows).
pub fn rms_norm_quant(
    o: QuantOut,
    x: DevPtr,
    w: DevPtr,
    n: u32,
    x_stride: u32,
    rows: u32,
    flags: u32,
    eps: f32,
) -> Launch {
    Launch::new(
        &RMS_NORM_QUANT,
        [rows, 1, 1],
        vec![
            ptr(o.out),
            ptr(o.q8_0_q),
            ptr(o.q8_0_d),
            ptr(o.q8_k_q),
            ptr(o.q8_k_d),
            ptr(o.q8_k_bs),
            ptr(x),
            ptr(w),
            u(n),
            u(x_stride),
            u(flags),
            f(eps),
        ],
    )
}

/// Plain quantization (no norm, no f32 copy) of `rows` contiguous rows of `n` floats into the Q8_0
/// and/or Q8_K planes of `o`. The blocks never cross 256 elements, so rows whose length is a multiple
/// of 256 are launched as 256-element rows: same output layout, one block per 256 values instead of
/// one block looping over a long row (a single 8192-wide row took ~9 us of mostly serial chunks).
pub fn quantize_rows(o: QuantOut, x: DevPtr, n: u32, rows: u32) -> Launch {
    debug_assert!(o.out == NULL, "quantize_rows writes only the quantized planes");
    let (n, rows) = if n.is_multiple_of(256) {
        (256, rows * (n / 256))
    } else {
        (n, rows)
    };
    rms_norm_quant(o, x, NULL, n, n, rows, 0, 0.0)
}

/// `ds4_matvec_q8_0`: y[t][r] = W[r] · x_t (Q8_0 weights, Q8_0 activations). Plain projection:
/// `rows_per_group = n_out`, `x_stride = n_in`; grouped output projection (spec §3.4 step 12):
/// `rows_per_group = O_r`, `x_stride = G * n_in`. Grid (ceil(n_out/8), n_tok).
pub fn matvec_q8_0(
    y: DevPtr,
    w: DevPtr,
    xq: DevPtr,
    xd: DevPtr,
    n_in: u32,
    n_out: u32,
    rows_per_group: u32,
    x_stride: u32,
    n_tok: u32,
) -> Launch {
    Launch::new(
        &MATVEC_Q8_0,
        [blocks(n_out, MATVEC_ROWS), n_tok, 1],
        vec![
            ptr(y),
            ptr(w),
            ptr(xq),
            ptr(xd),
            u(n_in),
            u(n_out),
            u(rows_per_group),
            u(x_stride),
        ],
    )
}

/// `ds4_matvec_q8_0_swiglu`: shared-expert gate/up + clamped SwiGLU. Grid (ceil(n_ff/8), n_tok).
pub fn matvec_q8_0_swiglu(
    mid: DevPtr,
    wg: DevPtr,
    wu: DevPtr,
    xq: DevPtr,
    xd: DevPtr,
    n_in: u32,
    n_ff: u32,
    limit: f32,
    n_tok: u32,
) -> Launch {
    Launch::new(
        &MATVEC_Q8_0_SWIGLU,
        [blocks(n_ff, MATVEC_ROWS), n_tok, 1],
        vec![ptr(mid), ptr(wg), ptr(wu), ptr(xq), ptr(xd), u(n_in), u(n_ff), f(limit)],
    )
}

/// `ds4_matvec_f16`: y[t][r] = W[r] · x_t (F16 weights, f32 activations). Grid (ceil(n_out/8), n_tok).
pub fn matvec_f16(y: DevPtr, w: DevPtr, x: DevPtr, n_in: u32, n_out: u32, x_stride: u32, n_tok: u32) -> Launch {
    Launch::new(
        &MATVEC_F16,
        [blocks(n_out, MATVEC_ROWS), n_tok, 1],
        vec![ptr(y), ptr(w), ptr(x), u(n_in), u(n_out), u(x_stride)],
    )
}

/// `ds4_matvec_f16_pair`: y0 = W0·x, y1 = W1·x (same shapes). Grid (ceil(2*n_out/8), n_tok).
pub fn matvec_f16_pair(
    y0: DevPtr,
    y1: DevPtr,
    w0: DevPtr,
    w1: DevPtr,
    x: DevPtr,
    n_in: u32,
    n_out: u32,
    x_stride: u32,
    n_tok: u32,
) -> Launch {
    Launch::new(
        &MATVEC_F16_PAIR,
        [blocks(2 * n_out, MATVEC_ROWS), n_tok, 1],
        vec![
            ptr(y0),
            ptr(y1),
            ptr(w0),
            ptr(w1),
            ptr(x),
            u(n_in),
            u(n_out),
            u(x_stride),
        ],
    )
}

/// `ds4_router`: expert ids and weights per token (bias and tid2eid may be NULL; tokens is read
/// only for hash layers). Grid (n_tok).
pub fn router(
    sel: DevPtr,
    selw: DevPtr,
    logits: DevPtr,
    bias: DevPtr,
    tid2eid: DevPtr,
    tokens: DevPtr,
    n_expert: u32,
    n_used: u32,
    weight_scale: f32,
    n_tok: u32,
) -> Launch {
    assert!(
        n_expert <= 1024 && n_used <= 16,
        "router: n_expert {n_expert} / n_used {n_used} too large"
    );
    Launch::new(
        &ROUTER,
        [n_tok, 1, 1],
        vec![
            ptr(sel),
            ptr(selw),
            ptr(logits),
            ptr(bias),
            ptr(tid2eid),
            ptr(tokens),
            u(n_expert),
            u(n_used),
            f(weight_scale),
            u(n_tok),
        ],
    )
}

/// Routed-expert weight formats that have kernels (GGML type ids, spec §1.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpertFormat {
    Iq2Xxs,
    Q2K,
    Q4K,
}

impl ExpertFormat {
    /// From a GGML type id; `None` for types without expert kernels.
    pub fn from_ggml_type(t: u32) -> Option<ExpertFormat> {
        match t {
            16 => Some(ExpertFormat::Iq2Xxs),
            10 => Some(ExpertFormat::Q2K),
            12 => Some(ExpertFormat::Q4K),
            _ => None,
        }
    }

    fn gate_up(self) -> &'static KernelDef {
        match self {
            ExpertFormat::Iq2Xxs => &MOE_GATE_UP_IQ2_XXS,
            ExpertFormat::Q2K => &MOE_GATE_UP_Q2_K,
            ExpertFormat::Q4K => &MOE_GATE_UP_Q4_K,
        }
    }

    fn down(self) -> &'static KernelDef {
        match self {
            ExpertFormat::Iq2Xxs => &MOE_DOWN_IQ2_XXS,
            ExpertFormat::Q2K => &MOE_DOWN_Q2_K,
            ExpertFormat::Q4K => &MOE_DOWN_Q4_K,
        }
    }

    fn gemm_gate_up(self) -> &'static KernelDef {
        match self {
            ExpertFormat::Iq2Xxs => &MOE_GEMM_GATE_UP_IQ2_XXS,
            ExpertFormat::Q2K => &MOE_GEMM_GATE_UP_Q2_K,
            ExpertFormat::Q4K => &MOE_GEMM_GATE_UP_Q4_K,
        }
    }

    fn gemm_down(self) -> &'static KernelDef {
        match self {
            ExpertFormat::Iq2Xxs => &MOE_GEMM_DOWN_IQ2_XXS,
            ExpertFormat::Q2K => &MOE_GEMM_DOWN_Q2_K,
            ExpertFormat::Q4K => &MOE_GEMM_DOWN_Q4_K,
        }
    }

    fn matvec(self) -> &'static KernelDef {
        match self {
            ExpertFormat::Iq2Xxs => &MATVEC_IQ2_XXS,
            ExpertFormat::Q2K => &MATVEC_Q2_K,
            ExpertFormat::Q4K => &MATVEC_Q4_K,
        }
    }
}

/// Q8_K activation planes (see [`QuantOut`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Q8K {
    pub q: DevPtr,
    pub d: DevPtr,
    pub bsums: DevPtr,
}

/// `ds4_moe_gate_up_<fmt>`: mid[t][k][r] = swiglu(gate_e[r]·x_t, up_e[r]·x_t) * selw[t][k].
/// Grid (ceil(n_ff/8), n_used, n_tok).
pub fn moe_gate_up(
    fmt: ExpertFormat,
    mid: DevPtr,
    gate: DevPtr,
    up: DevPtr,
    x: Q8K,
    sel: DevPtr,
    selw: DevPtr,
    n_in: u32,
    n_ff: u32,
    n_used: u32,
    limit: f32,
    n_tok: u32,
) -> Launch {
    Launch::new(
        fmt.gate_up(),
        [blocks(n_ff, MATVEC_ROWS), n_used, n_tok],
        vec![
            ptr(mid),
            ptr(gate),
            ptr(up),
            ptr(x.q),
            ptr(x.d),
            ptr(x.bsums),
            ptr(sel),
            ptr(selw),
            u(n_in),
            u(n_ff),
            u(n_used),
            f(limit),
        ],
    )
}

/// Experts per token the per-token expert kernels handle (`DS4_MOE_MAX_USED` in kernels/moe.hip).
pub const MOE_MAX_USED: usize = 8;

/// `ds4_moe_down_<fmt>`: out[t][r] = Σ_k down_e[r]·mid_{t,k} (slot order), mid given as Q8_K rows
/// (t*n_used + k). Grid (ceil(n_out/8), n_tok).
pub fn moe_down(
    fmt: ExpertFormat,
    out: DevPtr,
    down: DevPtr,
    mid: Q8K,
    sel: DevPtr,
    n_ff: u32,
    n_out: u32,
    n_used: u32,
    n_tok: u32,
) -> Launch {
    Launch::new(
        fmt.down(),
        [blocks(n_out, MATVEC_ROWS), n_tok, 1],
        vec![
            ptr(out),
            ptr(down),
            ptr(mid.q),
            ptr(mid.d),
            ptr(mid.bsums),
            ptr(sel),
            u(n_ff),
            u(n_out),
            u(n_used),
        ],
    )
}

/// `ds4_matvec_<fmt>`: plain K-quant matvec with Q8_K activations. Grid (ceil(n_out/8), n_tok).
pub fn matvec_k(fmt: ExpertFormat, y: DevPtr, w: DevPtr, x: Q8K, n_in: u32, n_out: u32, n_tok: u32) -> Launch {
    Launch::new(
        fmt.matvec(),
        [blocks(n_out, MATVEC_ROWS), n_tok, 1],
        vec![ptr(y), ptr(w), ptr(x.q), ptr(x.d), ptr(x.bsums), u(n_in), u(n_out)],
    )
}

/// `ds4_hc_mix`: mix[t][o] = fn[o] · (X_t RMS-normalized with `eps`), one block per (o, t): the
/// sequential F16 dot of the CPU reference. Grid (n_mix, n_tok).
pub fn hc_mix(mix: DevPtr, hc: DevPtr, fn_w: DevPtr, n_in: u32, n_mix: u32, eps: f32, n_tok: u32) -> Launch {
    assert!(n_mix <= 24, "hc_mix: n_mix {n_mix} > 24");
    Launch::new(
        &HC_MIX,
        [n_mix, n_tok, 1],
        vec![ptr(mix), ptr(hc), ptr(fn_w), u(n_in), u(n_mix), f(eps)],
    )
}

/// `ds4_hc_pre_finish`: Sinkhorn split and weighted stream sum from `mix` [n_tok][2 n_hc + n_hc²];
/// split_out has the same shape. Grid (n_tok).
pub fn hc_pre_finish(
    x_out: DevPtr,
    split_out: DevPtr,
    mix: DevPtr,
    hc: DevPtr,
    scale: DevPtr,
    base: DevPtr,
    n_embd: u32,
    n_hc: u32,
    iters: u32,
    eps_hc: f32,
    n_tok: u32,
) -> Launch {
    assert!(n_hc <= 4, "hc_pre_finish: n_hc {n_hc} > 4");
    Launch::new(
        &HC_PRE_FINISH,
        [n_tok, 1, 1],
        vec![
            ptr(x_out),
            ptr(split_out),
            ptr(mix),
            ptr(hc),
            ptr(scale),
            ptr(base),
            u(n_embd),
            u(n_hc),
            u(iters),
            f(eps_hc),
        ],
    )
}

/// Eps values of the fused HC pre step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HcEps {
    /// RMS eps of the HC state norm, HC eps of the split, eps of the sublayer's input RMSNorm.
    pub rms: f32,
    pub hc: f32,
    pub norm: f32,
}

/// `ds4_hc_pre_fused`: the whole HC pre step (mix, Sinkhorn split, weighted sum) plus the sublayer's
/// input RMSNorm * norm_w and its quantizations, in one launch. `o.out` receives xn (may be NULL),
/// `o.q8_0_*` / `o.q8_k_*` its activations (NULL = not wanted). mix: f32 [n_tok][n_mix] scratch;
/// counter: u32 [n_tok], zeroed once before first use. n_embd <= 4096. Grid (n_mix, n_tok).
pub fn hc_pre_fused(
    split_out: DevPtr,
    o: QuantOut,
    mix: DevPtr,
    counter: DevPtr,
    hc: DevPtr,
    fn_w: DevPtr,
    scale: DevPtr,
    base: DevPtr,
    norm_w: DevPtr,
    n_embd: u32,
    n_hc: u32,
    iters: u32,
    eps: HcEps,
    n_tok: u32,
) -> Launch {
    assert!(
        n_embd <= 4096 && n_hc <= 4,
        "hc_pre_fused: n_embd {n_embd} > 4096 or n_hc {n_hc} > 4"
    );
    Launch::new(
        &HC_PRE_FUSED,
        [2 * n_hc + n_hc * n_hc, n_tok, 1],
        vec![
            ptr(split_out),
            ptr(o.out),
            ptr(o.q8_0_q),
            ptr(o.q8_0_d),
            ptr(o.q8_k_q),
            ptr(o.q8_k_d),
            ptr(o.q8_k_bs),
            ptr(mix),
            ptr(counter),
            ptr(hc),
            ptr(fn_w),
            ptr(scale),
            ptr(base),
            ptr(norm_w),
            u(n_embd),
            u(n_hc),
            u(iters),
            f(eps.rms),
            f(eps.hc),
            f(eps.norm),
        ],
    )
}

/// `ds4_hc_head_finish`: output-head stream weights and sum from `mix` [n_tok][n_hc] (a
/// [`hc_mix`] of output_hc_fn). Grid (n_tok).
pub fn hc_head_finish(
    x_out: DevPtr,
    mix: DevPtr,
    hc: DevPtr,
    scale: DevPtr,
    base: DevPtr,
    n_embd: u32,
    n_hc: u32,
    eps_hc: f32,
    n_tok: u32,
) -> Launch {
    Launch::new(
        &HC_HEAD_FINISH,
        [n_tok, 1, 1],
        vec![
            ptr(x_out),
            ptr(mix),
            ptr(hc),
            ptr(scale),
            ptr(base),
            u(n_embd),
            u(n_hc),
            f(eps_hc),
        ],
    )
}

/// `ds4_hc_post`: X' = post·(y + y2) + Mᵀ X (y2 may be NULL; hc_out may equal hc_in).
/// Grid (ceil(n_embd/256), n_tok).
pub fn hc_post(
    hc_out: DevPtr,
    hc_in: DevPtr,
    y: DevPtr,
    y2: DevPtr,
    split: DevPtr,
    n_embd: u32,
    n_hc: u32,
    n_tok: u32,
) -> Launch {
    Launch::new(
        &HC_POST,
        [blocks(n_embd, BLOCK), n_tok, 1],
        vec![ptr(hc_out), ptr(hc_in), ptr(y), ptr(y2), ptr(split), u(n_embd), u(n_hc)],
    )
}

/// Flags of [`rows_finish`] (kernels/rows.hip), applied in this order.
pub mod row_flags {
    pub const NORM: u32 = 1;
    pub const ROPE: u32 = 2;
    pub const ROPE_INVERSE: u32 = 4;
    pub const E4M3: u32 = 8;
    pub const HADAMARD_FP4: u32 = 16;
    pub const ROUND_F16: u32 = 32;
    pub const STORE_RING: u32 = 64;
}

/// RoPE parameters of one layer (spec §3.5), as the kernels take them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeParams {
    pub n_rot: u32,
    /// base^(-2/n_rot), computed on the host so every backend uses the same value.
    pub theta_scale: f32,
    pub freq_scale: f32,
    /// 1 with the YaRN blend, 0 without.
    pub ext_factor: f32,
    pub corr_low: f32,
    pub corr_high: f32,
    /// Factor on cos and sin: the YaRN magnitude m divided and multiplied back as the CPU reference
    /// does (`(1 / m) · m`, 1 for ds4's constants, but computed, not assumed).
    pub mscale: f32,
}

impl RopeParams {
    /// Dense (ratio-0) layers: plain rotation with `base`.
    pub fn plain(n_rot: u32, base: f32) -> RopeParams {
        RopeParams {
            n_rot,
            theta_scale: base.powf(-2.0 / n_rot as f32),
            freq_scale: 1.0,
            ext_factor: 0.0,
            corr_low: 0.0,
            corr_high: 0.0,
            mscale: 1.0,
        }
    }

    /// Compressed layers and their indexer: `base` (160000 for Flash), frequency scale 1/`factor`
    /// and the YaRN ramp between the correction dims of beta_fast / beta_slow (spec §3.5).
    pub fn yarn(n_rot: u32, base: f32, factor: f32, orig_ctx: u32, beta_fast: f32, beta_slow: f32) -> RopeParams {
        let corr =
            |beta: f32| n_rot as f32 * (orig_ctx as f32 / (beta * 2.0 * std::f32::consts::PI)).ln() / (2.0 * base.ln());
        RopeParams {
            n_rot,
            theta_scale: base.powf(-2.0 / n_rot as f32),
            freq_scale: 1.0 / factor,
            ext_factor: 1.0,
            corr_low: corr(beta_fast).floor().max(0.0),
            corr_high: corr(beta_slow).ceil().min((n_rot - 1) as f32),
            mscale: {
                let m = 1.0 + 0.1 * (1.0 / (1.0 / factor)).ln();
                (1.0 / m) * m
            },
        }
    }
}

/// `ds4_rows_finish` on token rows: per-(token, head) row operations (flags from [`row_flags`]) on
/// x [n_tok][n_head][head_dim] in place; row t is at position pos0 + t, pos0 read from the device
/// word `pos` (the step parameters). ring and w may be NULL when unused. Grid (n_head, n_tok).
pub fn rows_finish(
    x: DevPtr,
    ring: DevPtr,
    w: DevPtr,
    pos: DevPtr,
    n_head: u32,
    head_dim: u32,
    flags: u32,
    ring_cap: u32,
    rope: RopeParams,
    eps: f32,
    n_tok: u32,
) -> Launch {
    rows_finish_launch(
        x, ring, w, pos, n_head, head_dim, flags, n_tok, 0, 0, ring_cap, rope, eps, n_tok,
    )
}

/// `ds4_rows_finish` on the compressed rows that the n_tok tokens at pos0 (device word `pos`)
/// emitted into `rows` [row_cap][head_dim] (spec §3.7, after [`compressor_pool`]): row c at RoPE
/// position c * ratio. Grid (1, `grid_rows`): at least the rows this batch emits
/// ([`compressor_emitted`]; [`compressor_max_emitted`] for any position), blocks past them exit.
pub fn rows_finish_emitted(
    rows: DevPtr,
    w: DevPtr,
    pos: DevPtr,
    head_dim: u32,
    flags: u32,
    ratio: u32,
    row_cap: u32,
    rope: RopeParams,
    eps: f32,
    n_tok: u32,
    grid_rows: u32,
) -> Launch {
    assert!(ratio > 0, "rows_finish_emitted: ratio 0");
    assert!(flags & row_flags::STORE_RING == 0, "rows_finish_emitted: no ring store");
    rows_finish_launch(
        rows,
        NULL,
        w,
        pos,
        1,
        head_dim,
        flags,
        n_tok,
        ratio,
        row_cap,
        1,
        rope,
        eps,
        grid_rows.max(1),
    )
}

fn rows_finish_launch(
    x: DevPtr,
    ring: DevPtr,
    w: DevPtr,
    pos: DevPtr,
    n_head: u32,
    head_dim: u32,
    flags: u32,
    n_tok: u32,
    emit_ratio: u32,
    row_cap: u32,
    ring_cap: u32,
    rope: RopeParams,
    eps: f32,
    grid_y: u32,
) -> Launch {
    assert!(
        head_dim <= ROWS_MAX_DIM,
        "rows_finish: head_dim {head_dim} > {ROWS_MAX_DIM}"
    );
    Launch::new(
        &ROWS_FINISH,
        [n_head, grid_y, 1],
        vec![
            ptr(x),
            ptr(ring),
            ptr(w),
            ptr(pos),
            u(n_head),
            u(head_dim),
            u(rope.n_rot),
            u(flags),
            u(n_tok),
            u(emit_ratio),
            u(row_cap),
            u(ring_cap.max(1)),
            f(rope.theta_scale),
            f(rope.freq_scale),
            f(rope.ext_factor),
            f(rope.corr_low),
            f(rope.corr_high),
            f(rope.mscale),
            f(eps),
        ],
    )
}

/// The fixed shape of one layer's attention (see kernels/attention.hip).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionShape {
    pub n_head: u32,
    pub head_dim: u32,
    /// Rows of the raw ring; must be >= window + (largest batch) - 1 (spec §4.2).
    pub ring_cap: u32,
    pub window: u32,
    /// Compression ratio (0 for dense layers).
    pub ratio: u32,
    /// Indexer top-k (used only when a selection list is passed).
    pub top_k: u32,
}

impl AttentionShape {
    /// Rows visible to the token at position p (raw + compressed, after the indexer selection when
    /// `selected`), with n_comp_avail compressed rows in the cache.
    pub fn visible_rows(&self, p: u32, n_comp_avail: u32, selected: bool) -> u32 {
        let n_raw = self.window.min(p + 1);
        // ratio 0 (dense layer): no compressed rows.
        let n_c = (p + 1).checked_div(self.ratio).map_or(0, |c| c.min(n_comp_avail));
        n_raw + if selected && n_c > self.top_k { self.top_k } else { n_c }
    }

    /// Floats of the score buffer of a batch of n_tok tokens none of which sees more than
    /// `max_rows` rows: [n_tok][n_head][max_rows] (`max_rows` is the launches' sc_stride).
    pub fn score_floats(&self, n_tok: u32, max_rows: u32) -> usize {
        n_tok as usize * self.n_head as usize * max_rows.max(1) as usize
    }
}

/// `ds4_attention_scores`, `ds4_attention_softmax`, `ds4_attention_values`: attention of the batch
/// q [n_tok][n_head][head_dim] at positions pos0.. (pos0 from the device word `pos`) over the ring
/// and the compressed rows, in the CPU reference's order; comp_sel is the indexer's [n_tok][top_k]
/// list or NULL. `max_rows` bounds the rows any token of the batch sees (the exact count when the
/// host knows the position, else the session's most): it sizes the score grid and is the stride of
/// `sc` ([`AttentionShape::score_floats`]); `inv` holds n_tok * n_head floats. Grids
/// (ceil(max_rows/8), n_tok), (n_head, n_tok), (n_head/8, head_dim/64, n_tok).
pub fn attention(
    shape: &AttentionShape,
    out: DevPtr,
    sc: DevPtr,
    inv: DevPtr,
    q: DevPtr,
    ring: DevPtr,
    comp: DevPtr,
    comp_sel: DevPtr,
    sinks: DevPtr,
    pos: DevPtr,
    n_comp_avail: u32,
    max_rows: u32,
    n_tok: u32,
) -> [Launch; 3] {
    assert!(
        shape.n_head.is_multiple_of(ATTENTION_VAL_HEADS)
            && shape.head_dim.is_multiple_of(ATTENTION_VAL_DIMS)
            && shape.head_dim <= ATTENTION_MAX_DIM,
        "attention: unsupported shape {shape:?}"
    );
    let scale = 1.0 / (shape.head_dim as f32).sqrt();
    let stride = max_rows.max(1);
    let scores = Launch::new(
        &ATTENTION_SCORES,
        [blocks(stride, ATTENTION_SCORE_ROWS), n_tok, 1],
        vec![
            ptr(sc),
            ptr(q),
            ptr(ring),
            ptr(comp),
            ptr(comp_sel),
            ptr(pos),
            u(shape.n_head),
            u(shape.head_dim),
            u(shape.ring_cap),
            u(shape.window),
            u(n_comp_avail),
            u(shape.ratio),
            u(shape.top_k),
            u(stride),
            f(scale),
        ],
    );
    let softmax = Launch::new(
        &ATTENTION_SOFTMAX,
        [shape.n_head, n_tok, 1],
        vec![
            ptr(sc),
            ptr(inv),
            ptr(sinks),
            ptr(comp_sel),
            ptr(pos),
            u(shape.n_head),
            u(shape.window),
            u(n_comp_avail),
            u(shape.ratio),
            u(shape.top_k),
            u(stride),
        ],
    );
    let values = Launch::new(
        &ATTENTION_VALUES,
        [
            shape.n_head / ATTENTION_VAL_HEADS,
            shape.head_dim / ATTENTION_VAL_DIMS,
            n_tok,
        ],
        vec![
            ptr(out),
            ptr(sc),
            ptr(inv),
            ptr(ring),
            ptr(comp),
            ptr(comp_sel),
            ptr(pos),
            u(shape.n_head),
            u(shape.head_dim),
            u(shape.ring_cap),
            u(shape.window),
            u(n_comp_avail),
            u(shape.ratio),
            u(shape.top_k),
            u(stride),
        ],
    );
    [scores, softmax, values]
}

/// Compressed rows a batch at pos0..pos0+n_tok emits: (first row index, count) (spec §3.7).
pub fn compressor_emitted(ratio: u32, pos0: u32, n_tok: u32) -> (u32, u32) {
    if ratio == 0 {
        return (0, 0);
    }
    let first = pos0 / ratio;
    (first, (pos0 + n_tok) / ratio - first)
}

/// The most compressed rows a batch of n_tok tokens can emit at any position: one every `ratio`
/// tokens, plus one when the batch straddles a boundary.
pub fn compressor_max_emitted(ratio: u32, n_tok: u32) -> u32 {
    if ratio == 0 || n_tok == 0 {
        0
    } else {
        (n_tok - 1) / ratio + 1
    }
}

/// `ds4_compressor_pool`: state update for the batch at pos0.. (device word `pos`) and raw pooled
/// rows into comp_rows; follow it with [`rows_finish_emitted`]. Grid (ceil(head_dim/256)).
pub fn compressor_pool(
    comp_rows: DevPtr,
    state_kv: DevPtr,
    state_score: DevPtr,
    kv_cur: DevPtr,
    sc_cur: DevPtr,
    ape: DevPtr,
    pos: DevPtr,
    head_dim: u32,
    ratio: u32,
    n_tok: u32,
    comp_cap: u32,
) -> Launch {
    assert!(ratio > 0, "compressor_pool: ratio 0");
    Launch::new(
        &COMPRESSOR_POOL,
        [blocks(head_dim, BLOCK), 1, 1],
        vec![
            ptr(comp_rows),
            ptr(state_kv),
            ptr(state_score),
            ptr(kv_cur),
            ptr(sc_cur),
            ptr(ape),
            ptr(pos),
            u(head_dim),
            u(ratio),
            u(n_tok),
            u(comp_cap),
        ],
    )
}

/// `ds4_indexer_scores`: scores [n_tok][score_stride] of the compressed indexer rows of the tokens
/// at pos0.. (device word `pos`) that see more than top_k rows. Grid (ceil(grid_rows/128), n_tok):
/// `grid_rows` >= the rows the batch's last token sees (n_comp_avail, or the capacity).
pub fn indexer_scores(
    scores: DevPtr,
    qi: DevPtr,
    w: DevPtr,
    krows: DevPtr,
    pos: DevPtr,
    n_head: u32,
    n_comp_avail: u32,
    ratio: u32,
    top_k: u32,
    score_stride: u32,
    w_scale: f32,
    grid_rows: u32,
    n_tok: u32,
) -> Launch {
    assert!(n_head <= 64, "indexer_scores: n_head {n_head} > 64");
    Launch::new(
        &INDEXER_SCORES,
        [blocks(grid_rows, INDEXER_ROWS), n_tok, 1],
        vec![
            ptr(scores),
            ptr(qi),
            ptr(w),
            ptr(krows),
            ptr(pos),
            u(n_head),
            u(n_comp_avail),
            u(ratio),
            u(top_k),
            u(score_stride),
            f(w_scale),
        ],
    )
}

/// `ds4_indexer_topk`: ascending top_k row lists sel [n_tok][top_k] of the tokens at pos0.. (device
/// word `pos`) that see more than top_k rows. Grid (n_tok).
pub fn indexer_topk(
    sel: DevPtr,
    scores: DevPtr,
    pos: DevPtr,
    score_stride: u32,
    n_comp_avail: u32,
    ratio: u32,
    top_k: u32,
    n_tok: u32,
) -> Launch {
    Launch::new(
        &INDEXER_TOPK,
        [n_tok, 1, 1],
        vec![
            ptr(sel),
            ptr(scores),
            ptr(pos),
            u(score_stride),
            u(n_comp_avail),
            u(ratio),
            u(top_k),
        ],
    )
}

/// Words `ds4_argmax` and `ds4_sample_min_p` write: the token id, then 1 when the host's uniform
/// draw was used (0 for greedy and for the cases where the host path draws nothing).
pub const SAMPLE_OUT_WORDS: usize = 2;

/// `ds4_argmax`: out[0] = first index of the largest logit (NaN never wins; 0 when none is above
/// -inf), the host's `sampler::argmax`. Grid (1).
pub fn argmax(out: DevPtr, logits: DevPtr, n: u32) -> Launch {
    Launch::new(&ARGMAX, [1, 1, 1], vec![ptr(out), ptr(logits), u(n)])
}

/// `ds4_sample_min_p`: default sampler path with the host's uniform draw u01; out[0] = id, out[1] =
/// whether the draw was used. Grid (1).
pub fn sample_min_p(out: DevPtr, logits: DevPtr, n: u32, temp: f32, min_p: f32, u01: f32) -> Launch {
    Launch::new(
        &SAMPLE_MIN_P,
        [1, 1, 1],
        vec![ptr(out), ptr(logits), u(n), f(temp), f(min_p), f(u01)],
    )
}

// ---------------------------------------------------------------------------------------------
// Prefill GEMMs (kernels/gemm.hip): 64 x 64 output tiles.
// ---------------------------------------------------------------------------------------------

/// Output tile edge of the GEMM kernels (DS4_GM_ROWS = DS4_GM_TOKS).
pub const GEMM_TILE: u32 = 64;

/// `ds4_gemm_q8_0`: batched Q8_0 projection with Q8_0 activations (grouped like
/// [`matvec_q8_0`]; rows_per_group must be a multiple of 64). Grid (ceil(n_out/64), ceil(n_tok/64)).
pub fn gemm_q8_0(
    y: DevPtr,
    w: DevPtr,
    xq: DevPtr,
    xd: DevPtr,
    n_in: u32,
    n_out: u32,
    rows_per_group: u32,
    x_stride: u32,
    n_tok: u32,
) -> Launch {
    assert!(
        rows_per_group.is_multiple_of(GEMM_TILE),
        "gemm_q8_0: rows_per_group {rows_per_group} % 64 != 0"
    );
    Launch::new(
        &GEMM_Q8_0,
        [blocks(n_out, GEMM_TILE), blocks(n_tok, GEMM_TILE), 1],
        vec![
            ptr(y),
            ptr(w),
            ptr(xq),
            ptr(xd),
            u(n_in),
            u(n_out),
            u(rows_per_group),
            u(x_stride),
            u(n_tok),
        ],
    )
}

/// `ds4_gemm_q8_0_swiglu`: batched shared-expert gate/up + SwiGLU. Grid (ceil(n_ff/64), ceil(n_tok/64)).
pub fn gemm_q8_0_swiglu(
    mid: DevPtr,
    wg: DevPtr,
    wu: DevPtr,
    xq: DevPtr,
    xd: DevPtr,
    n_in: u32,
    n_ff: u32,
    limit: f32,
    n_tok: u32,
) -> Launch {
    Launch::new(
        &GEMM_Q8_0_SWIGLU,
        [blocks(n_ff, GEMM_TILE), blocks(n_tok, GEMM_TILE), 1],
        vec![
            ptr(mid),
            ptr(wg),
            ptr(wu),
            ptr(xq),
            ptr(xd),
            u(n_in),
            u(n_ff),
            f(limit),
            u(n_tok),
        ],
    )
}

/// Column classes of the grouped expert tiles, narrowest first (kernels/gemm.hip `TileShape`,
/// `tile_class`): a class-C tile covers up to C pairs of one expert and 64, 128 or 256 weight rows.
pub const MOE_TILE_COLS: [u32; 7] = [8, 12, 16, 24, 32, 48, 64];
/// Narrowest column class the batched forward uses (`ds4_moe_group`'s `min_cols`).
pub const MOE_MIN_COLS: u32 = 8;
/// u32 words of one tile record of `ds4_moe_group`: (expert, first pair, count, column class).
pub const MOE_TILE_WORDS: u32 = 4;

/// Pairs per expert that exercise every column class and its edges (8/9, 12/13, 16/17, 24/25, 32/33,
/// 48/49, 64), experts with several full tiles, and an expert with none (total even, for 2 slots per
/// token): the selftest's and the emulator tests' grouping.
pub const TILE_CLASS_COUNTS: [usize; 18] = [1, 7, 8, 9, 12, 13, 16, 17, 24, 25, 32, 33, 48, 49, 64, 70, 132, 0];

/// Expert ids in which expert e occurs counts[e] times, in an order scrambled by `seed` (a test
/// selection for the grouped kernels, which need not see distinct experts per token).
pub fn selection_with_counts(counts: &[usize], seed: u64) -> Vec<u32> {
    let mut sel: Vec<u32> = counts
        .iter()
        .enumerate()
        .flat_map(|(e, &c)| std::iter::repeat_n(e as u32, c))
        .collect();
    let mut state = seed | 1;
    for i in (1..sel.len()).rev() {
        // xorshift64: any fixed scramble will do.
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        sel.swap(i, (state % (i as u64 + 1)) as usize);
    }
    sel
}

/// Upper bound of the expert tiles of a batch: ceil(n_pairs/64) + n_expert (each expert adds at most
/// one partial tile, whatever its column class). Size `tiles` as [`MOE_TILE_WORDS`] * this many u32.
pub fn moe_max_tiles(n_tok: u32, n_used: u32, n_expert: u32) -> u32 {
    (n_tok * n_used).div_ceil(GEMM_TILE) + n_expert
}

/// `ds4_moe_group`: pairs sorted by expert, tiles and the tile count, all on the device; an expert's
/// last partial tile gets the narrowest class of [`MOE_TILE_COLS`] from `min_cols` up that holds it
/// (`min_cols` = 64: every tile 64 wide). Grid (1).
pub fn moe_group(
    pairs: DevPtr,
    tiles: DevPtr,
    n_tiles: DevPtr,
    sel: DevPtr,
    n_tok: u32,
    n_used: u32,
    n_expert: u32,
    min_cols: u32,
) -> Launch {
    assert!(n_expert <= 1024, "moe_group: n_expert {n_expert} > 1024");
    assert!(
        MOE_TILE_COLS.contains(&min_cols),
        "moe_group: min_cols {min_cols} is not one of {MOE_TILE_COLS:?}"
    );
    Launch::new(
        &MOE_GROUP,
        [1, 1, 1],
        vec![
            ptr(pairs),
            ptr(tiles),
            ptr(n_tiles),
            ptr(sel),
            u(n_tok),
            u(n_used),
            u(n_expert),
            u(min_cols),
        ],
    )
}

/// Device buffers made by [`moe_group`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExpertTiles {
    pub pairs: DevPtr,
    pub tiles: DevPtr,
    pub n_tiles: DevPtr,
    /// [`moe_max_tiles`] of the batch (the launch grid's second dimension).
    pub max_tiles: u32,
}

/// `ds4_moe_gemm_gate_up_<fmt>`: grouped gate/up + SwiGLU, mid [n_tok][n_used][n_ff].
/// Grid (ceil(n_ff/64), max_tiles): sized for 64-row tiles; blocks of taller (narrower) tiles past n_ff exit.
pub fn moe_gemm_gate_up(
    fmt: ExpertFormat,
    mid: DevPtr,
    gate: DevPtr,
    up: DevPtr,
    x: Q8K,
    t: ExpertTiles,
    selw: DevPtr,
    n_in: u32,
    n_ff: u32,
    n_used: u32,
    limit: f32,
) -> Launch {
    Launch::new(
        fmt.gemm_gate_up(),
        [blocks(n_ff, GEMM_TILE), t.max_tiles.max(1), 1],
        vec![
            ptr(mid),
            ptr(gate),
            ptr(up),
            ptr(x.q),
            ptr(x.d),
            ptr(x.bsums),
            ptr(t.pairs),
            ptr(t.tiles),
            ptr(t.n_tiles),
            ptr(selw),
            u(n_in),
            u(n_ff),
            u(n_used),
            f(limit),
        ],
    )
}

/// `ds4_moe_gemm_down_<fmt>`: grouped down projection per pair, outp [n_tok * n_used][n_out]; then
/// [`moe_sum`]. Grid (ceil(n_out/64), max_tiles), as for [`moe_gemm_gate_up`].
pub fn moe_gemm_down(
    fmt: ExpertFormat,
    outp: DevPtr,
    down: DevPtr,
    mid: Q8K,
    t: ExpertTiles,
    n_ff: u32,
    n_out: u32,
    n_used: u32,
) -> Launch {
    Launch::new(
        fmt.gemm_down(),
        [blocks(n_out, GEMM_TILE), t.max_tiles.max(1), 1],
        vec![
            ptr(outp),
            ptr(down),
            ptr(mid.q),
            ptr(mid.d),
            ptr(mid.bsums),
            ptr(t.pairs),
            ptr(t.tiles),
            ptr(t.n_tiles),
            u(n_ff),
            u(n_out),
            u(n_used),
        ],
    )
}

/// `ds4_moe_sum`: out[t] = Σ_k outp[t*n_used + k] in slot order. Grid (ceil(n_out/256), n_tok).
pub fn moe_sum(out: DevPtr, outp: DevPtr, n_out: u32, n_used: u32, n_tok: u32) -> Launch {
    Launch::new(
        &MOE_SUM,
        [blocks(n_out, BLOCK), n_tok, 1],
        vec![ptr(out), ptr(outp), u(n_out), u(n_used)],
    )
}

/// The routed experts of a batch (spec §3.9 step 5) on device buffers: gate/up + SwiGLU into `mid`,
/// its Q8_K quantization, the down projection into `out` [n_tok][n_out] (n_out = n_in).
#[derive(Clone, Copy, Debug)]
pub struct RoutedExperts {
    pub fmt_gate_up: ExpertFormat,
    pub fmt_down: ExpertFormat,
    /// All-expert weight tensors.
    pub gate: DevPtr,
    pub up: DevPtr,
    pub down: DevPtr,
    /// Q8_K token activations [n_tok][n_in].
    pub x: Q8K,
    /// Router output: expert ids u32 and weights f32, [n_tok][n_used].
    pub sel: DevPtr,
    pub selw: DevPtr,
    /// f32 [n_tok][n_used][n_ff] and its Q8_K planes.
    pub mid: DevPtr,
    pub mid_q: Q8K,
    pub out: DevPtr,
    pub n_in: u32,
    pub n_ff: u32,
    pub n_used: u32,
    pub n_expert: u32,
    /// SwiGLU clamp of the layer.
    pub limit: f32,
}

/// Grouping buffers of [`RoutedExperts::launches`] for a batch: [`moe_group`]'s outputs and the
/// per-pair down outputs `outp` f32 [n_tok * n_used][n_out].
#[derive(Clone, Copy, Debug)]
pub struct ExpertGrouping {
    pub tiles: ExpertTiles,
    pub outp: DevPtr,
    /// [`moe_group`]'s `min_cols` ([`MOE_MIN_COLS`] in the forward pass).
    pub min_cols: u32,
}

impl RoutedExperts {
    /// The launches, in order: per token (decode kernels, `grouping` None) or grouped by expert
    /// ([`moe_group`], the grouped GEMMs and [`moe_sum`]).
    pub fn launches(&self, n_tok: u32, grouping: Option<ExpertGrouping>) -> Vec<Launch> {
        let mid_quant = quantize_rows(
            QuantOut {
                q8_k_q: self.mid_q.q,
                q8_k_d: self.mid_q.d,
                q8_k_bs: self.mid_q.bsums,
                ..Default::default()
            },
            self.mid,
            self.n_ff,
            self.n_used * n_tok,
        );
        let (fg, fd) = (self.fmt_gate_up, self.fmt_down);
        let (n_in, n_ff, n_used) = (self.n_in, self.n_ff, self.n_used);
        let Some(g) = grouping else {
            return vec![
                moe_gate_up(
                    fg, self.mid, self.gate, self.up, self.x, self.sel, self.selw, n_in, n_ff, n_used, self.limit,
                    n_tok,
                ),
                mid_quant,
                moe_down(fd, self.out, self.down, self.mid_q, self.sel, n_ff, n_in, n_used, n_tok),
            ];
        };
        let t = g.tiles;
        vec![
            moe_group(
                t.pairs,
                t.tiles,
                t.n_tiles,
                self.sel,
                n_tok,
                n_used,
                self.n_expert,
                g.min_cols,
            ),
            moe_gemm_gate_up(
                fg, self.mid, self.gate, self.up, self.x, t, self.selw, n_in, n_ff, n_used, self.limit,
            ),
            mid_quant,
            moe_gemm_down(fd, g.outp, self.down, self.mid_q, t, n_ff, n_in, n_used),
            moe_sum(self.out, g.outp, n_in, n_used, n_tok),
        ]
    }
}

/// `ds4_gemm_f16`: batched F16-weight projection, f32 activations. Grid (ceil(n_out/64), ceil(n_tok/64)).
pub fn gemm_f16(y: DevPtr, w: DevPtr, x: DevPtr, n_in: u32, n_out: u32, x_stride: u32, n_tok: u32) -> Launch {
    Launch::new(
        &GEMM_F16,
        [blocks(n_out, GEMM_TILE), blocks(n_tok, GEMM_TILE), 1],
        vec![ptr(y), ptr(w), ptr(x), u(n_in), u(n_out), u(x_stride), u(n_tok)],
    )
}

// ---------------------------------------------------------------------------------------------
// Code objects
// ---------------------------------------------------------------------------------------------

// Generated by build.rs: `EMBEDDED_CODE_OBJECTS: &[(&str, &[u8])]` and `EMBEDDED_NOTE: &str`.
include!(concat!(env!("OUT_DIR"), "/ds4_code_objects.rs"));

/// The target name of a device: "gfx1151" from an AMD arch string such as
/// "gfx1151:sramecc-:xnack-", "sm_90" from a compute capability.
pub fn amd_target(gcn_arch_name: &str) -> &str {
    gcn_arch_name.split(':').next().unwrap_or("").trim()
}

/// File name of a kernel image for a target: `ds4_kernels.gfx1151.hsaco`, `ds4_kernels.sm_90.cubin`.
pub fn kernel_image_file(target: &str) -> String {
    let ext = if target.starts_with("sm_") { "cubin" } else { "hsaco" };
    format!("{KERNEL_IMAGE_STEM}.{target}.{ext}")
}

/// The embedded AMD code object for `target` (e.g. "gfx1151"), or a one-line reason naming the
/// targets that were built and how to add one.
pub fn embedded_code_object(target: &str) -> Result<&'static [u8], String> {
    if let Some((_, bytes)) = EMBEDDED_CODE_OBJECTS.iter().find(|(t, _)| *t == target) {
        return Ok(bytes);
    }
    let built: Vec<&str> = EMBEDDED_CODE_OBJECTS.iter().map(|(t, _)| *t).collect();
    Err(format!(
        "no GPU kernels for {target}: this binary has kernels for [{}] ({EMBEDDED_NOTE}); rebuild with \
         DS4_HIP_ARCHS={target} cargo build --release --features hip",
        built.join(", ")
    ))
}

/// Targets with an embedded code object.
pub fn embedded_targets() -> Vec<&'static str> {
    EMBEDDED_CODE_OBJECTS.iter().map(|(t, _)| *t).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// (name, [(param name, kind)]) of every `extern "C" __global__` kernel in kernels/*.hip.
    fn parse_kernel_sources() -> Vec<(String, Vec<(String, ArgKind)>)> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels");
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "hip") || p.ends_with("mathf.h"))
            .collect();
        files.sort();
        let mut out = Vec::new();
        for file in files {
            let src = std::fs::read_to_string(&file).unwrap();
            let mut rest = src.as_str();
            while let Some(i) = rest.find("extern \"C\" __global__") {
                rest = &rest[i..];
                let v = rest.find(" void ").expect("void after extern C");
                let open = rest[v..].find('(').unwrap() + v;
                let name = rest[v + 6..open].trim().to_string();
                let close = rest[open..].find(')').unwrap() + open;
                let params = rest[open + 1..close]
                    .split(',')
                    .map(|p| {
                        let p = p.split_whitespace().collect::<Vec<_>>().join(" ");
                        let pname = p.rsplit([' ', '*']).next().unwrap().to_string();
                        let kind = if p.contains('*') {
                            ArgKind::Ptr
                        } else if p.starts_with("u32 ") {
                            ArgKind::U32
                        } else if p.starts_with("u64 ") {
                            ArgKind::U64
                        } else if p.starts_with("float ") {
                            ArgKind::F32
                        } else {
                            panic!("{}: {name}: unsupported parameter type in '{p}'", file.display())
                        };
                        (pname, kind)
                    })
                    .collect();
                out.push((name, params));
                rest = &rest[close..];
            }
        }
        out
    }

    #[test]
    fn kernel_table_matches_sources() {
        let parsed = parse_kernel_sources();
        assert_eq!(parsed.len(), ALL_KERNELS.len(), "kernel count: sources vs ALL_KERNELS");
        for (name, params) in &parsed {
            let def = kernel_def(name).unwrap_or_else(|| panic!("{name} is in kernels/ but not in ALL_KERNELS"));
            let ours: Vec<(String, ArgKind)> = def.params.iter().map(|p| (p.name.to_string(), p.kind)).collect();
            assert_eq!(&ours, params, "{name}: parameter list differs from the source");
        }
    }

    #[test]
    fn every_kernel_is_included_by_the_translation_unit() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels");
        let tu = std::fs::read_to_string(root.join("ds4.hip")).unwrap();
        for e in std::fs::read_dir(&root).unwrap() {
            let p = e.unwrap().path();
            let fname = p.file_name().unwrap().to_str().unwrap().to_string();
            if fname.ends_with(".hip") && fname != "ds4.hip" {
                assert!(
                    tu.contains(&format!("#include \"{fname}\"")),
                    "kernels/ds4.hip does not include {fname}"
                );
            }
        }
    }

    #[test]
    fn iq2_grid_header_matches_rust_table() {
        let h = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels/iq2xxs_grid.h")).unwrap();
        let vals: Vec<u64> = h
            .split(|c: char| !c.is_ascii_alphanumeric())
            .filter_map(|w| w.strip_prefix("0x")?.strip_suffix("ull"))
            .map(|w| u64::from_str_radix(w, 16).unwrap())
            .collect();
        assert_eq!(vals.as_slice(), &crate::gguf::iq2_tables::IQ2XXS_GRID[..]);
    }

    #[test]
    fn packed_arguments_are_little_endian_slots() {
        let l = fill_f32(0x1234_5678_9abc, 1000, -1.0e30);
        let mut p = l.packed();
        assert_eq!(p.slots(), &[0x1234_5678_9abc, 1000, (-1.0e30f32).to_bits() as u64]);
        let ptrs = p.pointers();
        // SAFETY: each pointer addresses one live u64 slot of `p`.
        let third = unsafe { *(ptrs[2] as *const f32) };
        assert_eq!(third, -1.0e30);
        assert_eq!(l.grid, [4, 1, 1]);
    }

    #[test]
    fn builders_cover_every_kernel_with_matching_arguments() {
        // Launch::new asserts count and kinds; here every builder is called once with Flash shapes.
        let rope = RopeParams::yarn(64, 160000.0, 16.0, 65536, 32.0, 1.0);
        let shape = AttentionShape {
            n_head: 64,
            head_dim: 512,
            ring_cap: 2304,
            window: 128,
            ratio: 4,
            top_k: 512,
        };
        let att = attention(&shape, 1, 2, 3, 4, 5, 6, 7, 8, 9, 1000, 640, 1);
        let q8k = Q8K { q: 1, d: 2, bsums: 3 };
        let mut launches = vec![
            embed_hc(1, 2, 3, 4096, 4, 129280, 1),
            fill_f32(1, 10, 0.0),
            rms_norm_quant(QuantOut::default(), 1, 0, 4096, 4096, 1, NQ_NORM, 1e-6),
            matvec_q8_0(1, 2, 3, 4, 4096, 1024, 1024, 4096, 1),
            matvec_q8_0_swiglu(1, 2, 3, 4, 5, 4096, 2048, 10.0, 1),
            matvec_f16(1, 2, 3, 4096, 256, 4096, 1),
            matvec_f16_pair(1, 2, 3, 4, 5, 4096, 1024, 4096, 1),
            router(1, 2, 3, 0, 0, 4, 256, 6, 1.5, 1),
            hc_mix(1, 2, 3, 16384, 24, 1e-6, 1),
            hc_pre_finish(1, 2, 3, 4, 5, 6, 4096, 4, 20, 1e-6, 1),
            hc_head_finish(1, 2, 3, 4, 5, 4096, 4, 1e-6, 1),
            hc_pre_fused(
                1,
                QuantOut::default(),
                2,
                3,
                4,
                5,
                6,
                7,
                8,
                4096,
                4,
                20,
                HcEps {
                    rms: 1e-6,
                    hc: 1e-6,
                    norm: 1e-6,
                },
                1,
            ),
            hc_post(1, 1, 2, 0, 3, 4096, 4, 1),
            rows_finish(
                1,
                2,
                3,
                4,
                1,
                512,
                row_flags::NORM | row_flags::ROPE,
                2304,
                rope,
                1e-6,
                1,
            ),
            rows_finish_emitted(1, 2, 3, 512, row_flags::NORM, 4, 1026, rope, 1e-6, 1, 1),
            compressor_pool(1, 2, 3, 4, 5, 6, 7, 512, 4, 1, 1026),
            indexer_scores(1, 2, 3, 4, 5, 64, 1000, 4, 512, 1024, 0.011, 1000, 1),
            indexer_topk(1, 2, 3, 1024, 1000, 4, 512, 1),
            argmax(1, 2, 129280),
            sample_min_p(1, 2, 129280, 1.0, 0.05, 0.5),
        ];
        launches.extend(att);
        for fmt in [ExpertFormat::Iq2Xxs, ExpertFormat::Q2K, ExpertFormat::Q4K] {
            launches.push(moe_gate_up(fmt, 1, 2, 3, q8k, 4, 5, 4096, 2048, 6, 10.0, 1));
            launches.push(moe_down(fmt, 1, 2, q8k, 4, 2048, 4096, 6, 1));
            launches.push(matvec_k(fmt, 1, 2, q8k, 4096, 4096, 1));
            let t = ExpertTiles {
                pairs: 1,
                tiles: 2,
                n_tiles: 3,
                max_tiles: moe_max_tiles(2048, 6, 256),
            };
            launches.push(moe_gemm_gate_up(fmt, 1, 2, 3, q8k, t, 4, 4096, 2048, 6, 10.0));
            launches.push(moe_gemm_down(fmt, 1, 2, q8k, t, 2048, 4096, 6));
        }
        launches.push(gemm_q8_0(1, 2, 3, 4, 4096, 1024, 1024, 4096, 2048));
        launches.push(gemm_q8_0_swiglu(1, 2, 3, 4, 5, 4096, 2048, 10.0, 2048));
        launches.push(moe_group(1, 2, 3, 4, 2048, 6, 256, MOE_MIN_COLS));
        launches.push(moe_sum(1, 2, 4096, 6, 2048));
        launches.push(gemm_f16(1, 2, 3, 4096, 1024, 4096, 2048));
        launches.push(test_mathf(1, 2, 1000, MathFn::Sin));
        let mut names: Vec<&str> = launches.iter().map(|l| l.kernel.name).collect();
        names.sort();
        names.dedup();
        let mut all: Vec<&str> = ALL_KERNELS.iter().map(|k| k.name).collect();
        all.sort();
        assert_eq!(
            names, all,
            "a kernel without a builder (or a builder for an unknown kernel)"
        );
    }

    #[test]
    fn launch_grids_for_flash_decode() {
        // 1024 q_a rows, 8 per block.
        assert_eq!(matvec_q8_0(1, 2, 3, 4, 4096, 1024, 1024, 4096, 1).grid, [128, 1, 1]);
        // LM head: 129280 rows -> 16160 blocks.
        assert_eq!(
            matvec_q8_0(1, 2, 3, 4, 4096, 129280, 129280, 4096, 1).grid,
            [16160, 1, 1]
        );
        // 6 experts x 2048 rows for 2 tokens.
        let l = moe_gate_up(ExpertFormat::Q4K, 1, 2, 3, Q8K::default(), 4, 5, 4096, 2048, 6, 10.0, 2);
        assert_eq!(l.grid, [256, 6, 2]);
        assert_eq!(hc_mix(1, 2, 3, 16384, 24, 1e-6, 1).grid, [24, 1, 1]);
        // Prefill: 2048 tokens x 6 slots = 192 full tiles + at most one partial tile per expert.
        assert_eq!(moe_max_tiles(2048, 6, 256), 192 + 256);
        assert_eq!(gemm_q8_0(1, 2, 3, 4, 4096, 32768, 32768, 1024, 2048).grid, [512, 32, 1]);
    }

    #[test]
    fn attention_visibility_and_grids() {
        let s = AttentionShape {
            n_head: 64,
            head_dim: 512,
            ring_cap: 2304,
            window: 128,
            ratio: 4,
            top_k: 512,
        };
        // p = 2: 3 raw rows, no compressed row yet (first one at p = 3).
        assert_eq!(s.visible_rows(2, 0, false), 3);
        // p = 3: 4 raw + 1 compressed.
        assert_eq!(s.visible_rows(3, 1, false), 5);
        // p = 4000: 128 raw + min(1000, 1000) compressed, or 512 with the indexer selection.
        assert_eq!(s.visible_rows(4000, 1000, false), 1128);
        assert_eq!(s.visible_rows(4000, 1000, true), 640);
        // Scores of a decode step over 640 rows; the score grid has a block per 8 rows.
        assert_eq!(s.score_floats(1, 640), 64 * 640);
        let [scores, softmax, values] = attention(&s, 1, 2, 3, 4, 5, 6, 7, 8, 9, 1000, 640, 1);
        assert_eq!(
            (scores.grid, softmax.grid, values.grid),
            ([80, 1, 1], [64, 1, 1], [8, 8, 1])
        );
    }

    #[test]
    fn compressor_emission_rows() {
        // Decode at p = 3 (ratio 4) emits row 0; p = 4 emits nothing.
        assert_eq!(compressor_emitted(4, 3, 1), (0, 1));
        assert_eq!(compressor_emitted(4, 4, 1).1, 0);
        // A 2048-token chunk from 0 emits rows 0..511 (ratio 4) and 0..15 (ratio 128).
        assert_eq!(compressor_emitted(4, 0, 2048), (0, 512));
        assert_eq!(compressor_emitted(128, 0, 2048), (0, 16));
        // Chunk 100..300 at ratio 128: p = 127 and 255 emit rows 0 and 1.
        assert_eq!(compressor_emitted(128, 100, 200), (0, 2));
        // The most rows a batch emits bounds every position's count (the emitted-rows grid).
        for (ratio, n) in [(4u32, 1u32), (4, 3), (4, 4), (4, 5), (128, 1), (128, 200), (128, 256)] {
            let most = (0..600).map(|p| compressor_emitted(ratio, p, n).1).max().unwrap();
            assert_eq!(compressor_max_emitted(ratio, n), most, "ratio {ratio}, {n} tokens");
        }
    }

    #[test]
    fn yarn_parameters_for_flash() {
        // spec §3.5: corr dims 15.453 / 24.708 -> low 15, high 25 for Flash.
        let r = RopeParams::yarn(64, 160000.0, 16.0, 65536, 32.0, 1.0);
        assert_eq!((r.corr_low, r.corr_high), (15.0, 25.0));
        assert_eq!(r.freq_scale, 1.0 / 16.0);
        assert!((r.theta_scale - 160000f32.powf(-1.0 / 32.0)).abs() < 1e-9);
        assert_eq!(RopeParams::plain(64, 10000.0).ext_factor, 0.0);
    }

    #[test]
    fn targets_and_file_names() {
        assert_eq!(amd_target("gfx1151:sramecc-:xnack-"), "gfx1151");
        assert_eq!(amd_target("gfx1100"), "gfx1100");
        assert_eq!(kernel_image_file("gfx1151"), "ds4_kernels.gfx1151.hsaco");
        assert_eq!(kernel_image_file("sm_90"), "ds4_kernels.sm_90.cubin");
        let e = embedded_code_object("gfx9999").unwrap_err();
        assert!(
            e.contains("no GPU kernels for gfx9999") && e.contains("DS4_HIP_ARCHS=gfx9999"),
            "{e}"
        );
    }
}
