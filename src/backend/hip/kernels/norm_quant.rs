//! Builders of kernels/norm_quant.hip (embedding into the HC state, fill, span copies, RMSNorm and the activation
//! quantizations) and of the transcendental self-test kernel of kernels/mathf.h.

use super::abi::{Arg, COPY_SPANS, DevPtr, EMBED_HC, FILL_F32, NULL, RMS_NORM_QUANT, TEST_MATHF};
use super::launch::{BLOCK, Launch, blocks, f, ptr, u};

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

/// Blocks per span of `ds4_copy_spans`: each block strides over its span, so any count covers it;
/// 64 keep a few hundred KiB per span in flight.
pub const COPY_SPAN_BLOCKS: u32 = 64;

/// Words of one entry of a `ds4_copy_spans` table: source address, destination address, 32-bit words.
pub const COPY_SPAN_WORDS: usize = 3;

/// `ds4_copy_spans`: the `n_spans` copies of the table at `spans` (`COPY_SPAN_WORDS` u64 each).
pub fn copy_spans(spans: DevPtr, n_spans: u32) -> Launch {
    Launch::new(
        &COPY_SPANS,
        [COPY_SPAN_BLOCKS, n_spans.max(1), 1],
        vec![ptr(spans), u(n_spans)],
    )
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

impl QuantOut {
    /// Only the Q8_0 planes: codes `q`, scales `d`.
    pub fn q8_0(q: DevPtr, d: DevPtr) -> QuantOut {
        QuantOut {
            q8_0_q: q,
            q8_0_d: d,
            ..Default::default()
        }
    }

    /// The six output pointers in the order the kernels that write them take them.
    pub(super) fn args(&self) -> [Arg; 6] {
        [
            self.out,
            self.q8_0_q,
            self.q8_0_d,
            self.q8_k_q,
            self.q8_k_d,
            self.q8_k_bs,
        ]
        .map(ptr)
    }
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
        [&o.args()[..], &[ptr(x), ptr(w), u(n), u(x_stride), u(flags), f(eps)]].concat(),
    )
}

/// The weighted RMSNorm of `rows` contiguous rows of `n` floats into the planes of `o`.
pub fn norm_rows(o: QuantOut, x: DevPtr, w: DevPtr, n: u32, rows: u32, eps: f32) -> Launch {
    rms_norm_quant(o, x, w, n, n, rows, NQ_NORM, eps)
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
