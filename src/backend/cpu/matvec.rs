//! Row-parallel matrix × activation drivers over the backend's rayon pool (docs/arithmetic.md#dot-products:
//! threads split only output rows, so the thread count never changes a result).
//!
//! Owns `Mat` (a weight matrix located in the mapped file) and the batched products used by both
//! decode (one token) and prefill (many tokens: each weight row is read once for all tokens).
//! Must not allocate per call: quantized activations live in caller-owned scratch.

use rayon::prelude::*;

use crate::gguf::GgmlType;
use crate::model::weights::{ExpertTensor, TensorRef};

use super::quant::{self, BlockQ8K, Q8_0Act};

/// A 2-D weight matrix in the file: `n_out` rows of `n_in` elements starting at byte `off`.
#[derive(Clone, Copy, Debug)]
pub struct Mat {
    pub ty: GgmlType,
    pub off: usize,
    pub n_in: usize,
    pub n_out: usize,
    pub row_bytes: usize,
}

impl Mat {
    pub fn new(t: &TensorRef) -> Mat {
        let n_in = t.dims[0] as usize;
        let n_out = t.dims.get(1).copied().unwrap_or(1) as usize;
        Mat {
            ty: t.ty,
            off: t.offset as usize,
            n_in,
            n_out,
            row_bytes: t.ty.row_bytes(n_in),
        }
    }

    /// Expert `e` of a routed expert tensor.
    pub fn expert(t: &ExpertTensor, e: usize) -> Mat {
        Mat {
            ty: t.ty(),
            off: t.expert_offset(e) as usize,
            n_in: t.n_in(),
            n_out: t.n_out(),
            row_bytes: t.ty().row_bytes(t.n_in()),
        }
    }

    #[inline]
    pub fn row<'a>(&self, file: &'a [u8], o: usize) -> &'a [u8] {
        let s = self.off + o * self.row_bytes;
        &file[s..s + self.row_bytes]
    }
}

/// Raw output pointer shared by the row workers; every (token, row) cell is written by exactly one.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

/// Rows per parallel task: big enough to amortise scheduling, small enough to balance.
fn rows_per_task(n_out: usize, threads: usize) -> usize {
    (n_out / (threads * 8).max(1)).clamp(4, 256)
}

/// Fill `out[t·n_out + o] = f(o, t)` for all tokens t < n_tok and rows o < n_out, parallel over row
/// chunks (inner loop over tokens so a weight row stays in cache).
pub fn par_rows<F>(pool: &rayon::ThreadPool, out: &mut [f32], n_tok: usize, n_out: usize, f: F)
where
    F: Fn(usize, usize) -> f32 + Sync,
{
    assert!(out.len() >= n_tok * n_out);
    let ptr = OutPtr(out.as_mut_ptr());
    let chunk = rows_per_task(n_out, pool.current_num_threads());
    let n_chunks = n_out.div_ceil(chunk);
    let work = |c: usize| {
        let p = ptr;
        for o in c * chunk..((c + 1) * chunk).min(n_out) {
            for t in 0..n_tok {
                let v = f(o, t);
                // SAFETY: (t, o) is in bounds (asserted above) and owned by this chunk only.
                unsafe { *p.0.add(t * n_out + o) = v };
            }
        }
    };
    // Already on a pool worker (e.g. the per-token MoE of a prefill runs tokens in parallel): stay
    // serial rather than nest.
    if n_chunks <= 1 || pool.current_num_threads() <= 1 || rayon::current_thread_index().is_some() {
        (0..n_chunks).for_each(work);
    } else {
        pool.install(|| (0..n_chunks).into_par_iter().for_each(work));
    }
}

/// Quantize `n_tok` rows of `x` (each `n_in` wide) to Q8_0 into `q[0..n_tok]`.
pub fn quantize_rows_q8_0(x: &[f32], n_in: usize, n_tok: usize, q: &mut [Q8_0Act]) {
    for t in 0..n_tok {
        quant::quantize_q8_0(&x[t * n_in..(t + 1) * n_in], &mut q[t]);
    }
}

/// out[t] = W · x[t] for Q8_0 or F16 weights (F32 activations, quantized here to Q8_0 when the
/// weights are Q8_0, docs/arithmetic.md#products-by-weight-type).
/// `x` is `n_tok × w.n_in`, `out` is `n_tok × w.n_out`.
pub fn matmul(
    pool: &rayon::ThreadPool,
    file: &[u8],
    w: &Mat,
    x: &[f32],
    n_tok: usize,
    out: &mut [f32],
    q8: &mut [Q8_0Act],
) {
    match w.ty {
        GgmlType::Q8_0 => {
            quantize_rows_q8_0(x, w.n_in, n_tok, q8);
            matmul_q8_0_prequant(pool, file, w, q8, 0, n_tok, out);
        }
        GgmlType::F16 => {
            let n_in = w.n_in;
            par_rows(pool, out, n_tok, w.n_out, |o, t| {
                quant::dot_f16(w.row(file, o), &x[t * n_in..(t + 1) * n_in])
            });
        }
        GgmlType::F32 => {
            let n_in = w.n_in;
            par_rows(pool, out, n_tok, w.n_out, |o, t| {
                // ds4 accumulates F32 matvecs in double (docs/arithmetic.md#dot-products).
                let row = w.row(file, o);
                let xs = &x[t * n_in..(t + 1) * n_in];
                let mut acc = 0.0f64;
                for (i, &xv) in xs.iter().enumerate() {
                    let wv = f32::from_le_bytes([row[4 * i], row[4 * i + 1], row[4 * i + 2], row[4 * i + 3]]);
                    acc += wv as f64 * xv as f64;
                }
                acc as f32
            });
        }
        other => panic!("matmul: {other} weights are not a dense projection type"),
    }
}

/// Q8_0 weights against already-quantized activations. Row `o` reads the activation blocks starting at
/// element `(o / rows_per_group) · w.n_in` when `rows_per_group` > 0 (grouped output projection,
/// docs/model.md#grouped-output-projection), else at 0.
pub fn matmul_q8_0_prequant(
    pool: &rayon::ThreadPool,
    file: &[u8],
    w: &Mat,
    q8: &[Q8_0Act],
    rows_per_group: usize,
    n_tok: usize,
    out: &mut [f32],
) {
    let nb = w.n_in / quant::QK8_0;
    par_rows(pool, out, n_tok, w.n_out, |o, t| {
        let g = o.checked_div(rows_per_group).unwrap_or(0);
        let a = &q8[t];
        quant::dot_q8_0(
            w.row(file, o),
            &a.qs[g * w.n_in..(g + 1) * w.n_in],
            &a.scales[g * nb..(g + 1) * nb],
        )
    });
}

/// One routed expert matrix against one Q8_K activation: `out[o] = W_e[o] · x`
/// (docs/arithmetic.md#dot-products).
pub fn matvec_expert(pool: &rayon::ThreadPool, file: &[u8], w: &Mat, x: &[BlockQ8K], out: &mut [f32]) {
    let dot: fn(&[u8], &[BlockQ8K]) -> f32 = match w.ty {
        GgmlType::Iq2Xxs => quant::dot_iq2_xxs,
        GgmlType::Q2K => quant::dot_q2_k,
        GgmlType::Q4K => quant::dot_q4_k,
        other => panic!("routed expert type {other} has no Q8_K dot product"),
    };
    par_rows(pool, out, 1, w.n_out, |o, _| dot(w.row(file, o), x));
}
