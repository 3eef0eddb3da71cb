//! The kernels' C ABI as Rust data: the parameter kinds, the table of every kernel with its `extern
//! "C"` name and parameter list (checked against kernels/*.hip by the test
//! `kernel_table_matches_sources`), and the one packing of argument values for
//! `hipModuleLaunchKernel` ([`KernelArgs`]).

use std::ffi::c_void;

/// A device address as passed to a kernel (8 bytes by value); 0 is the null pointer.
pub type DevPtr = u64;
/// The null device pointer, for the arguments documented as nullable.
pub const NULL: DevPtr = 0;

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

/// A kernel of the module: `extern "C"` name, the file under kernels/ that defines it and the
/// parameter list.
#[derive(Debug, PartialEq, Eq)]
pub struct KernelDef {
    pub name: &'static str,
    /// File name under kernels/: `<op>.hip` (exact arithmetic) or `<op>_fast.hip` (fast arithmetic),
    /// or `mathf.h` for the transcendental functions' self-test kernel.
    pub source: &'static str,
    pub params: &'static [Param],
}

impl KernelDef {
    /// The operation the kernel belongs to: its source file's stem without `_fast`.
    pub fn op(&self) -> &'static str {
        let stem = self.source.split('.').next().unwrap_or(self.source);
        stem.strip_suffix("_fast").unwrap_or(stem)
    }

    /// Whether the kernel is one of the fast-arithmetic variants (docs/arithmetic.md).
    pub fn is_fast(&self) -> bool {
        self.source.ends_with("_fast.hip")
    }
}

macro_rules! kernel_defs {
    ($( $source:literal { $( $konst:ident = $name:literal ( $($p:ident : $k:ident),* $(,)? ); )* } )*) => {
        $($( pub const $konst: KernelDef = KernelDef {
            name: $name,
            source: $source,
            params: &[$(Param { name: stringify!($p), kind: ArgKind::$k }),*],
        }; )*)*
        /// Every kernel of the module, by source file in the order of kernels/ds4.hip's includes.
        pub const ALL_KERNELS: &[&KernelDef] = &[$($(&$konst),*),*];
    };
}

kernel_defs! {
    "norm_quant.hip" {
        EMBED_HC = "ds4_embed_hc"(hc: Ptr, emb: Ptr, tokens: Ptr, n_embd: U32, n_hc: U32, n_vocab: U32, n_tok: U32);
        FILL_F32 = "ds4_fill_f32"(x: Ptr, n: U64, v: F32);
        COPY_SPANS = "ds4_copy_spans"(spans: Ptr, n_spans: U32);
        RMS_NORM_QUANT = "ds4_rms_norm_quant"(out: Ptr, q0_q: Ptr, q0_d: Ptr, qk_q: Ptr, qk_d: Ptr, qk_bs: Ptr, x: Ptr,
            w: Ptr, n: U32, x_stride: U32, flags: U32, eps: F32);
    }
    "matvec.hip" {
        MATVEC_Q8_0 = "ds4_matvec_q8_0"(y: Ptr, w: Ptr, xq: Ptr, xd: Ptr, n_in: U32, n_out: U32, rows_per_group: U32,
            x_stride: U32);
        MATVEC_Q8_0_SWIGLU = "ds4_matvec_q8_0_swiglu"(mid: Ptr, wg: Ptr, wu: Ptr, xq: Ptr, xd: Ptr, n_in: U32, n_ff: U32,
            limit: F32);
        MATVEC_F16 = "ds4_matvec_f16"(y: Ptr, w: Ptr, x: Ptr, n_in: U32, n_out: U32, x_stride: U32);
        MATVEC_F16_PAIR = "ds4_matvec_f16_pair"(y0: Ptr, y1: Ptr, w0: Ptr, w1: Ptr, x: Ptr, n_in: U32, n_out: U32,
            x_stride: U32);
    }
    "matvec_cols.hip" {
        MATVEC_Q8_0_COLS = "ds4_matvec_q8_0_cols"(y: Ptr, w: Ptr, xq: Ptr, xd: Ptr, n_in: U32, n_out: U32,
            rows_per_group: U32, x_stride: U32, n_tok: U32);
        MATVEC_Q8_0_SWIGLU_COLS = "ds4_matvec_q8_0_swiglu_cols"(mid: Ptr, wg: Ptr, wu: Ptr, xq: Ptr, xd: Ptr, n_in: U32,
            n_ff: U32, limit: F32, n_tok: U32);
        MATVEC_F16_COLS = "ds4_matvec_f16_cols"(y: Ptr, w: Ptr, x: Ptr, n_in: U32, n_out: U32, x_stride: U32,
            n_tok: U32);
        MATVEC_F16_PAIR_COLS = "ds4_matvec_f16_pair_cols"(y0: Ptr, y1: Ptr, w0: Ptr, w1: Ptr, x: Ptr, n_in: U32,
            n_out: U32, x_stride: U32, n_tok: U32);
    }
    "moe.hip" {
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
    }
    "hc.hip" {
        HC_MIX = "ds4_hc_mix"(mix: Ptr, hc: Ptr, fn_w: Ptr, n_in: U32, n_mix: U32, eps: F32);
        HC_PRE_FINISH = "ds4_hc_pre_finish"(x_out: Ptr, split_out: Ptr, mix: Ptr, hc: Ptr, scale: Ptr, base: Ptr,
            n_embd: U32, n_hc: U32, iters: U32, eps_hc: F32);
        HC_PRE_FUSED = "ds4_hc_pre_fused"(split_out: Ptr, xn: Ptr, q0_q: Ptr, q0_d: Ptr, qk_q: Ptr, qk_d: Ptr,
            qk_bs: Ptr, mix: Ptr, counter: Ptr, hc: Ptr, fn_w: Ptr, scale: Ptr, base: Ptr, norm_w: Ptr, n_embd: U32,
            n_hc: U32, iters: U32, eps_rms: F32, eps_hc: F32, eps_norm: F32);
        HC_HEAD_FINISH = "ds4_hc_head_finish"(x_out: Ptr, mix: Ptr, hc: Ptr, scale: Ptr, base: Ptr, n_embd: U32,
            n_hc: U32, eps_hc: F32);
        HC_POST = "ds4_hc_post"(hc_out: Ptr, hc_in: Ptr, y: Ptr, y2: Ptr, split: Ptr, n_embd: U32, n_hc: U32);
    }
    "rows.hip" {
        ROWS_FINISH = "ds4_rows_finish"(x: Ptr, ring: Ptr, w: Ptr, pos: Ptr, n_head: U32, head_dim: U32, n_rot: U32,
            flags: U32, n_tok: U32, emit_ratio: U32, row_cap: U32, ring_cap: U32, theta_scale: F32, freq_scale: F32,
            ext_factor: F32, corr_low: F32, corr_high: F32, mscale: F32, eps: F32);
    }
    "attention.hip" {
        ATTENTION_SCORES = "ds4_attention_scores"(sc: Ptr, q: Ptr, ring: Ptr, comp: Ptr, comp_sel: Ptr, pos: Ptr,
            n_head: U32, head_dim: U32, ring_cap: U32, window: U32, n_comp_avail: U32, ratio: U32, top_k: U32,
            sc_stride: U32, scale: F32);
        ATTENTION_SOFTMAX = "ds4_attention_softmax"(sc: Ptr, inv: Ptr, sinks: Ptr, comp_sel: Ptr, pos: Ptr, n_head: U32,
            window: U32, n_comp_avail: U32, ratio: U32, top_k: U32, sc_stride: U32);
        ATTENTION_VALUES = "ds4_attention_values"(out: Ptr, sc: Ptr, inv: Ptr, ring: Ptr, comp: Ptr, comp_sel: Ptr,
            pos: Ptr, n_head: U32, head_dim: U32, ring_cap: U32, window: U32, n_comp_avail: U32, ratio: U32, top_k: U32,
            sc_stride: U32);
    }
    "compressor.hip" {
        COMPRESSOR_POOL = "ds4_compressor_pool"(comp_rows: Ptr, state_kv: Ptr, state_score: Ptr, kv_cur: Ptr,
            sc_cur: Ptr, ape: Ptr, pos: Ptr, head_dim: U32, ratio: U32, n_tok: U32, comp_cap: U32);
    }
    "indexer.hip" {
        INDEXER_SCORES = "ds4_indexer_scores"(scores: Ptr, qi: Ptr, w: Ptr, krows: Ptr, pos: Ptr, n_head: U32,
            n_comp_avail: U32, ratio: U32, top_k: U32, score_stride: U32, w_scale: F32);
        INDEXER_TOPK = "ds4_indexer_topk"(sel: Ptr, scores: Ptr, pos: Ptr, score_stride: U32, n_comp_avail: U32,
            ratio: U32, top_k: U32);
    }
    "sample.hip" {
        ARGMAX = "ds4_argmax"(out: Ptr, logits: Ptr, n: U32);
        SAMPLE_MIN_P = "ds4_sample_min_p"(out: Ptr, logits: Ptr, n: U32, temp: F32, min_p: F32, u01: F32);
    }
    "gemm.hip" {
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
    }
    "gemm_fast.hip" {
        GEMM_Q8_0_MMA = "ds4_gemm_q8_0_mma"(y: Ptr, w: Ptr, xq: Ptr, xd: Ptr, n_in: U32, n_out: U32,
            rows_per_group: U32, x_stride: U32, n_tok: U32);
        GEMM_F16_MMA = "ds4_gemm_f16_mma"(y: Ptr, w: Ptr, x: Ptr, n_in: U32, n_out: U32, x_stride: U32, n_tok: U32);
        GEMM_Q8_0_SWIGLU_MMA = "ds4_gemm_q8_0_swiglu_mma"(mid: Ptr, wg: Ptr, wu: Ptr, xq: Ptr, xd: Ptr, n_in: U32,
            n_ff: U32, limit: F32, n_tok: U32);
        MOE_GEMM_GATE_UP_IQ2_XXS_MMA = "ds4_moe_gemm_gate_up_iq2_xxs_mma"(mid: Ptr, gate: Ptr, up: Ptr, xq: Ptr,
            xd: Ptr, xbs: Ptr, pairs: Ptr, tiles: Ptr, n_tiles: Ptr, selw: Ptr, n_in: U32, n_ff: U32, n_used: U32,
            limit: F32);
        MOE_GEMM_DOWN_IQ2_XXS_MMA = "ds4_moe_gemm_down_iq2_xxs_mma"(outp: Ptr, down: Ptr, mq: Ptr, md: Ptr, mbs: Ptr,
            pairs: Ptr, tiles: Ptr, n_tiles: Ptr, n_ff: U32, n_out: U32, n_used: U32);
        MOE_GEMM_GATE_UP_Q2_K_MMA = "ds4_moe_gemm_gate_up_q2_k_mma"(mid: Ptr, gate: Ptr, up: Ptr, xq: Ptr,
            xd: Ptr, xbs: Ptr, pairs: Ptr, tiles: Ptr, n_tiles: Ptr, selw: Ptr, n_in: U32, n_ff: U32, n_used: U32,
            limit: F32);
        MOE_GEMM_DOWN_Q2_K_MMA = "ds4_moe_gemm_down_q2_k_mma"(outp: Ptr, down: Ptr, mq: Ptr, md: Ptr, mbs: Ptr,
            pairs: Ptr, tiles: Ptr, n_tiles: Ptr, n_ff: U32, n_out: U32, n_used: U32);
        MOE_GEMM_GATE_UP_Q4_K_MMA = "ds4_moe_gemm_gate_up_q4_k_mma"(mid: Ptr, gate: Ptr, up: Ptr, xq: Ptr,
            xd: Ptr, xbs: Ptr, pairs: Ptr, tiles: Ptr, n_tiles: Ptr, selw: Ptr, n_in: U32, n_ff: U32, n_used: U32,
            limit: F32);
        MOE_GEMM_DOWN_Q4_K_MMA = "ds4_moe_gemm_down_q4_k_mma"(outp: Ptr, down: Ptr, mq: Ptr, md: Ptr, mbs: Ptr,
            pairs: Ptr, tiles: Ptr, n_tiles: Ptr, n_ff: U32, n_out: U32, n_used: U32);
    }
    "attention_fast.hip" {
        ATTENTION_PREFILL_FAST = "ds4_attention_prefill_fast"(out: Ptr, q: Ptr, ring: Ptr, comp: Ptr, comp_sel: Ptr,
            sinks: Ptr, pos: Ptr, n_head: U32, head_dim: U32, ring_cap: U32, window: U32, n_comp_avail: U32, ratio: U32,
            top_k: U32, scale: F32);
        ATTENTION_DECODE_SPLIT_MMA = "ds4_attention_decode_split_mma"(part_acc: Ptr, part_ml: Ptr, q: Ptr, ring: Ptr,
            comp: Ptr, comp_sel: Ptr, pos: Ptr, n_head: U32, head_dim: U32, ring_cap: U32, window: U32,
            n_comp_avail: U32, ratio: U32, top_k: U32, n_split: U32, most_slices: U32, min_chunk: U32, scale: F32);
        ATTENTION_DECODE_SPLIT = "ds4_attention_decode_split"(part_acc: Ptr, part_ml: Ptr, q: Ptr, ring: Ptr,
            comp: Ptr, comp_sel: Ptr, pos: Ptr, n_head: U32, head_dim: U32, ring_cap: U32, window: U32,
            n_comp_avail: U32, ratio: U32, top_k: U32, n_split: U32, most_slices: U32, min_chunk: U32, scale: F32);
        ATTENTION_DECODE_MERGE = "ds4_attention_decode_merge"(out: Ptr, part_acc: Ptr, part_ml: Ptr, sinks: Ptr,
            comp_sel: Ptr, pos: Ptr, n_head: U32, head_dim: U32, window: U32, n_comp_avail: U32, ratio: U32,
            top_k: U32, n_split: U32, most_slices: U32, min_chunk: U32);
        ATTENTION_DECODE_MERGE_Q8 = "ds4_attention_decode_merge_q8"(q_out: Ptr, d_out: Ptr, part_acc: Ptr,
            part_ml: Ptr, sinks: Ptr, comp_sel: Ptr, pos: Ptr, n_head: U32, head_dim: U32, window: U32,
            n_comp_avail: U32, ratio: U32, top_k: U32, n_split: U32, most_slices: U32, min_chunk: U32, n_rot: U32,
            theta_scale: F32, freq_scale: F32, ext_factor: F32, corr_low: F32, corr_high: F32, mscale: F32);
    }
    "compressor_fast.hip" {
        COMPRESSOR_POOL_FAST = "ds4_compressor_pool_fast"(comp_rows: Ptr, state_kv: Ptr, state_score: Ptr,
            kv_cur: Ptr, sc_cur: Ptr, ape: Ptr, pos: Ptr, head_dim: U32, ratio: U32, n_tok: U32, comp_cap: U32);
    }
    "norm_quant_fast.hip" {
        RMS_NORM_QUANT_FAST = "ds4_rms_norm_quant_fast"(out: Ptr, q0_q: Ptr, q0_d: Ptr, qk_q: Ptr, qk_d: Ptr,
            qk_bs: Ptr, x: Ptr, w: Ptr, n: U32, x_stride: U32, flags: U32, eps: F32);
    }
    "hc_fast.hip" {
        HC_PRE_FUSED_FAST = "ds4_hc_pre_fused_fast"(split_out: Ptr, xn: Ptr, q0_q: Ptr, q0_d: Ptr, qk_q: Ptr,
            qk_d: Ptr, qk_bs: Ptr, mix: Ptr, counter: Ptr, hc: Ptr, fn_w: Ptr, scale: Ptr, base: Ptr, norm_w: Ptr,
            n_embd: U32, n_hc: U32, iters: U32, eps_rms: F32, eps_hc: F32, eps_norm: F32);
        HC_POST_PRE_FAST = "ds4_hc_post_pre_fast"(split_out: Ptr, xn: Ptr, q0_q: Ptr, q0_d: Ptr, qk_q: Ptr,
            qk_d: Ptr, qk_bs: Ptr, mix: Ptr, counter: Ptr, hc_in: Ptr, hc_out: Ptr, y: Ptr, y2: Ptr, post_split: Ptr, fn_w: Ptr,
            scale: Ptr, base: Ptr, norm_w: Ptr, n_embd: U32, n_hc: U32, iters: U32, eps_rms: F32, eps_hc: F32,
            eps_norm: F32);
        HC_PRE_TOKEN_FAST = "ds4_hc_pre_token_fast"(split_out: Ptr, xn: Ptr, q0_q: Ptr, q0_d: Ptr, qk_q: Ptr,
            qk_d: Ptr, qk_bs: Ptr, mix: Ptr, counter: Ptr, hc: Ptr, fn_w: Ptr, scale: Ptr, base: Ptr, norm_w: Ptr,
            n_embd: U32, n_hc: U32, iters: U32, eps_rms: F32, eps_hc: F32, eps_norm: F32);
        HC_POST_PRE_TOKEN_FAST = "ds4_hc_post_pre_token_fast"(split_out: Ptr, xn: Ptr, q0_q: Ptr, q0_d: Ptr,
            qk_q: Ptr, qk_d: Ptr, qk_bs: Ptr, mix: Ptr, counter: Ptr, hc_in: Ptr, hc_out: Ptr, y: Ptr, y2: Ptr,
            post_split: Ptr, fn_w: Ptr, scale: Ptr, base: Ptr, norm_w: Ptr, n_embd: U32, n_hc: U32, iters: U32, eps_rms: F32,
            eps_hc: F32, eps_norm: F32);
        HC_POST_FAST = "ds4_hc_post_fast"(hc_out: Ptr, hc_in: Ptr, y: Ptr, y2: Ptr, split: Ptr, n_embd: U32,
            n_hc: U32);
        HC_MIX_FAST = "ds4_hc_mix_fast"(mix: Ptr, hc: Ptr, fn_w: Ptr, n_in: U32, n_mix: U32, eps: F32);
    }
    "rows_fast.hip" {
        ROWS_FINISH_FAST = "ds4_rows_finish_fast"(x: Ptr, ring: Ptr, w: Ptr, pos: Ptr, n_head: U32, head_dim: U32,
            n_rot: U32, flags: U32, n_tok: U32, emit_ratio: U32, row_cap: U32, ring_cap: U32, theta_scale: F32,
            freq_scale: F32, ext_factor: F32, corr_low: F32, corr_high: F32, mscale: F32, eps: F32);
        ROWS_FINISH_HADAMARD_FAST = "ds4_rows_finish_hadamard_fast"(x: Ptr, ring: Ptr, w: Ptr, pos: Ptr, n_head: U32,
            head_dim: U32, n_rot: U32, flags: U32, n_tok: U32, emit_ratio: U32, row_cap: U32, ring_cap: U32,
            theta_scale: F32, freq_scale: F32, ext_factor: F32, corr_low: F32, corr_high: F32, mscale: F32, eps: F32);
        ROWS_FINISH_PAIR_FAST = "ds4_rows_finish_pair_fast"(x: Ptr, ring: Ptr, w: Ptr, n_head: U32, flags: U32,
            ring_cap: U32, x2: Ptr, ring2: Ptr, w2: Ptr, n_head2: U32, flags2: U32, ring_cap2: U32, pos: Ptr,
            head_dim: U32, n_rot: U32, n_tok: U32, theta_scale: F32, freq_scale: F32, ext_factor: F32, corr_low: F32,
            corr_high: F32, mscale: F32, eps: F32);
    }
    "matvec_fast.hip" {
        MATVEC_Q8_0_FAST = "ds4_matvec_q8_0_fast"(y: Ptr, w: Ptr, xq: Ptr, xd: Ptr, n_in: U32, n_out: U32,
            rows_per_group: U32, x_stride: U32);
        MATVEC_Q8_0_Q8_FAST = "ds4_matvec_q8_0_q8_fast"(q_out: Ptr, d_out: Ptr, w: Ptr, xq: Ptr, xd: Ptr, n_in: U32,
            n_out: U32, rows_per_group: U32, x_stride: U32);
        MATVEC_Q8_0_NORMED_FAST = "ds4_matvec_q8_0_normed_fast"(y: Ptr, w: Ptr, x: Ptr, norm_w: Ptr, n_in: U32,
            n_out: U32, x_stride: U32, eps: F32);
        MATVEC_Q8_0_PAIR_FAST = "ds4_matvec_q8_0_pair_fast"(y0: Ptr, y1: Ptr, w0: Ptr, w1: Ptr, xq: Ptr, xd: Ptr,
            n_in: U32, n_out0: U32, n_out1: U32);
        MATVEC_Q8_0_SWIGLU_FAST = "ds4_matvec_q8_0_swiglu_fast"(mid: Ptr, wg: Ptr, wu: Ptr, xq: Ptr, xd: Ptr,
            n_in: U32, n_ff: U32, limit: F32);
        MATVEC_F16_FAST = "ds4_matvec_f16_fast"(y: Ptr, w: Ptr, x: Ptr, n_in: U32, n_out: U32, x_stride: U32);
        MATVEC_F16_PAIR_FAST = "ds4_matvec_f16_pair_fast"(y0: Ptr, y1: Ptr, w0: Ptr, w1: Ptr, x: Ptr, n_in: U32,
            n_out: U32, x_stride: U32);
        MATVEC_Q8_0_NORMED_ROWS_FAST = "ds4_matvec_q8_0_normed_rows_fast"(y: Ptr, w: Ptr, x: Ptr, norm_w: Ptr,
            n_in: U32, n_out: U32, x_stride: U32, eps: F32, counter: Ptr, ring: Ptr, row_w: Ptr, n_head: U32,
            flags: U32, ring_cap: U32, x2: Ptr, ring2: Ptr, w2: Ptr, n_head2: U32, flags2: U32, ring_cap2: U32,
            pos: Ptr, head_dim: U32, n_rot: U32, n_tok: U32, theta_scale: F32, freq_scale: F32, ext_factor: F32,
            corr_low: F32, corr_high: F32, mscale: F32, row_eps: F32);
        MATVEC_F16_NORMED_HADAMARD_FAST = "ds4_matvec_f16_normed_hadamard_fast"(y: Ptr, w: Ptr, x: Ptr,
            norm_w: Ptr, n_in: U32, n_out: U32, x_stride: U32, norm_eps: F32, counter: Ptr, pos: Ptr, n_head: U32,
            head_dim: U32, n_rot: U32, flags: U32, n_tok: U32, theta_scale: F32, freq_scale: F32, ext_factor: F32,
            corr_low: F32, corr_high: F32, mscale: F32, eps: F32);
        MATVEC_Q8_0_SWIGLU_Q8_FAST = "ds4_matvec_q8_0_swiglu_q8_fast"(mid: Ptr, q_out: Ptr, d_out: Ptr, counter: Ptr,
            wg: Ptr, wu: Ptr, xq: Ptr, xd: Ptr, n_in: U32, n_ff: U32, limit: F32);
    }
    "matvec_cols_fast.hip" {
        MATVEC_Q8_0_COLS_FAST = "ds4_matvec_q8_0_cols_fast"(y: Ptr, w: Ptr, xq: Ptr, xd: Ptr, n_in: U32, n_out: U32,
            rows_per_group: U32, x_stride: U32, n_tok: U32);
        MATVEC_Q8_0_Q8_COLS_FAST = "ds4_matvec_q8_0_q8_cols_fast"(q_out: Ptr, d_out: Ptr, w: Ptr, xq: Ptr, xd: Ptr,
            n_in: U32, n_out: U32, rows_per_group: U32, x_stride: U32, n_tok: U32);
        MATVEC_Q8_0_PAIR_COLS_FAST = "ds4_matvec_q8_0_pair_cols_fast"(y0: Ptr, y1: Ptr, w0: Ptr, w1: Ptr, xq: Ptr,
            xd: Ptr, n_in: U32, n_out0: U32, n_out1: U32, n_tok: U32);
        MATVEC_Q8_0_SWIGLU_COLS_FAST = "ds4_matvec_q8_0_swiglu_cols_fast"(mid: Ptr, wg: Ptr, wu: Ptr, xq: Ptr, xd: Ptr,
            n_in: U32, n_ff: U32, limit: F32, n_tok: U32);
        MATVEC_F16_COLS_FAST = "ds4_matvec_f16_cols_fast"(y: Ptr, w: Ptr, x: Ptr, n_in: U32, n_out: U32, x_stride: U32,
            n_tok: U32);
        MATVEC_F16_PAIR_COLS_FAST = "ds4_matvec_f16_pair_cols_fast"(y0: Ptr, y1: Ptr, w0: Ptr, w1: Ptr, x: Ptr,
            n_in: U32, n_out: U32, x_stride: U32, n_tok: U32);
    }
    "moe_fast.hip" {
        ROUTER_FAST = "ds4_router_fast"(sel: Ptr, selw: Ptr, logits: Ptr, bias: Ptr, tid2eid: Ptr, tokens: Ptr,
            n_expert: U32, n_used: U32, weight_scale: F32, n_tok: U32);
        MATVEC_F16_ROUTER_FAST = "ds4_matvec_f16_router_fast"(sel: Ptr, selw: Ptr, logits: Ptr, counter: Ptr, w: Ptr,
            x: Ptr, bias: Ptr, tid2eid: Ptr, tokens: Ptr, n_in: U32, n_expert: U32, n_used: U32, weight_scale: F32,
            x_stride: U32);
        MOE_GATE_UP_IQ2_XXS_FAST = "ds4_moe_gate_up_iq2_xxs_fast"(mid: Ptr, gate: Ptr, up: Ptr, xq: Ptr, xd: Ptr,
            xbs: Ptr, sel: Ptr, selw: Ptr, n_in: U32, n_ff: U32, n_used: U32, limit: F32);
        MOE_GATE_UP_Q2_K_FAST = "ds4_moe_gate_up_q2_k_fast"(mid: Ptr, gate: Ptr, up: Ptr, xq: Ptr, xd: Ptr, xbs: Ptr,
            sel: Ptr, selw: Ptr, n_in: U32, n_ff: U32, n_used: U32, limit: F32);
        MOE_GATE_UP_Q4_K_FAST = "ds4_moe_gate_up_q4_k_fast"(mid: Ptr, gate: Ptr, up: Ptr, xq: Ptr, xd: Ptr, xbs: Ptr,
            sel: Ptr, selw: Ptr, n_in: U32, n_ff: U32, n_used: U32, limit: F32);
        MOE_GATE_UP_IQ2_XXS_Q8K_FAST = "ds4_moe_gate_up_iq2_xxs_q8k_fast"(mid: Ptr, mq: Ptr, md: Ptr, mbs: Ptr, counter: Ptr,
            gate: Ptr, up: Ptr, xq: Ptr, xd: Ptr, xbs: Ptr, sel: Ptr, selw: Ptr, n_in: U32, n_ff: U32, n_used: U32,
            limit: F32);
        MOE_GATE_UP_Q2_K_Q8K_FAST = "ds4_moe_gate_up_q2_k_q8k_fast"(mid: Ptr, mq: Ptr, md: Ptr, mbs: Ptr, counter: Ptr,
            gate: Ptr, up: Ptr, xq: Ptr, xd: Ptr, xbs: Ptr, sel: Ptr, selw: Ptr, n_in: U32, n_ff: U32, n_used: U32,
            limit: F32);
        MOE_GATE_UP_Q4_K_Q8K_FAST = "ds4_moe_gate_up_q4_k_q8k_fast"(mid: Ptr, mq: Ptr, md: Ptr, mbs: Ptr, counter: Ptr,
            gate: Ptr, up: Ptr, xq: Ptr, xd: Ptr, xbs: Ptr, sel: Ptr, selw: Ptr, n_in: U32, n_ff: U32, n_used: U32,
            limit: F32);
        MOE_DOWN_IQ2_XXS_FAST = "ds4_moe_down_iq2_xxs_fast"(out: Ptr, down: Ptr, mq: Ptr, md: Ptr, mbs: Ptr, sel: Ptr,
            n_ff: U32, n_out: U32, n_used: U32);
        MOE_DOWN_Q2_K_FAST = "ds4_moe_down_q2_k_fast"(out: Ptr, down: Ptr, mq: Ptr, md: Ptr, mbs: Ptr, sel: Ptr,
            n_ff: U32, n_out: U32, n_used: U32);
        MOE_DOWN_Q4_K_FAST = "ds4_moe_down_q4_k_fast"(out: Ptr, down: Ptr, mq: Ptr, md: Ptr, mbs: Ptr, sel: Ptr,
            n_ff: U32, n_out: U32, n_used: U32);
    }
    "sample_fast.hip" {
        ARGMAX_FAST = "ds4_argmax_fast"(out: Ptr, logits: Ptr, n: U32);
        SAMPLE_MIN_P_MAX_FAST = "ds4_sample_min_p_max_fast"(out: Ptr, logits: Ptr, n: U32, temp: F32, min_p: F32,
            u01: F32);
        SAMPLE_MIN_P_DRAW_FAST = "ds4_sample_min_p_draw_fast"(out: Ptr, logits: Ptr, n: U32, temp: F32, min_p: F32,
            u01: F32);
    }
    "indexer_fast.hip" {
        INDEXER_SCORES_FAST = "ds4_indexer_scores_fast"(scores: Ptr, qi: Ptr, w: Ptr, krows: Ptr, pos: Ptr,
            n_head: U32, n_comp_avail: U32, ratio: U32, top_k: U32, score_stride: U32, w_scale: F32);
        INDEXER_SCORES_DECODE_FAST = "ds4_indexer_scores_decode_fast"(scores: Ptr, qi: Ptr, w: Ptr, krows: Ptr,
            pos: Ptr, n_head: U32, n_comp_avail: U32, ratio: U32, top_k: U32, score_stride: U32, w_scale: F32);
        INDEXER_TOPK_SEGMENTS = "ds4_indexer_topk_segments"(sel: Ptr, scores: Ptr, pos: Ptr, score_stride: U32,
            n_comp_avail: U32, ratio: U32, top_k: U32, seg: U32);
        INDEXER_TOPK_MERGE = "ds4_indexer_topk_merge"(sel: Ptr, scores: Ptr, pos: Ptr, score_stride: U32,
            n_comp_avail: U32, ratio: U32, top_k: U32, seg: U32);
    }
    "mathf.h" {
        TEST_MATHF = "ds4_test_mathf"(out: Ptr, input: Ptr, n: U32, which: U32);
    }
}

/// Look a kernel up by name.
pub fn kernel_def(name: &str) -> Option<&'static KernelDef> {
    ALL_KERNELS.iter().copied().find(|k| k.name == name)
}

/// Kernel arguments by value, packed for `hipModuleLaunchKernel`'s `kernelParams`: one 8-byte
/// little-endian slot per argument, the value in its low bytes (covers the size and alignment of
/// every pointer and scalar parameter).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelArgs {
    slots: Vec<u64>,
}

impl KernelArgs {
    pub fn new() -> KernelArgs {
        KernelArgs::default()
    }

    /// Append one argument.
    pub fn push(&mut self, value: impl Into<Arg>) -> &mut KernelArgs {
        self.slots.push(value.into().slot());
        self
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// One pointer per argument, for `kernelParams` (valid while `self` is neither moved nor pushed to).
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

impl From<u32> for Arg {
    fn from(v: u32) -> Arg {
        Arg::U32(v)
    }
}

/// A C `int` argument: its two's-complement bits, as the kernels' unsigned 32-bit parameters.
impl From<i32> for Arg {
    fn from(v: i32) -> Arg {
        Arg::U32(v as u32)
    }
}

impl From<u64> for Arg {
    fn from(v: u64) -> Arg {
        Arg::U64(v)
    }
}

impl From<f32> for Arg {
    fn from(v: f32) -> Arg {
        Arg::F32(v)
    }
}
