//! The fast-mode prefill kernels against their exact sequences on random inputs. Compressor pooling
//! (kernels/compressor_fast.hip) must be bitwise equal to ds4_compressor_pool: emitted rows and the
//! state left behind, at ratios 4 and 128, batches of 1, 37 and 256 tokens starting at, inside and
//! right after a window.
//!
//! The fast-mode prefill attention (kernels/attention_prefill_fast.hip) against the exact sequence
//! (scores → softmax → weighted values, itself bitwise equal to the CPU reference: group
//! `attention`) on random inputs: batches of 1, 37 and 256 tokens over the window only, over
//! compressed rows, and over the indexer's selection of them.
//!
//! Bound: q, the rows and the softmax weights enter the tiles as f16 (11-bit significands, relative
//! error <= 2^-11 each) with f32 sums, so a score s = scale·Σ q_i k_i moves by at most
//! 2^-10·scale·Σ|q_i k_i| and an output by that times the spread of the rows it mixes plus the
//! weights' and rows' own 2^-11. With the inputs below (|q|, |row| <= 1, head_dim 512) that is a few
//! 1e-3 of max|row| at worst; outputs are averages of the rows, so max|ref| is smaller than max|row|
//! and the check bounds |fast − exact| by ATT_TOL · max|row| (the reported max_abs is absolute).

use ds4_chat::backend::hip::kernels;
use ds4_chat::gguf::half::{f32_to_f16, round_f16};

use super::attention_case::{AttentionCase, attention_shape};
use super::cache::PoolBuffers;
use super::support::*;

/// |fast − exact| <= ATT_TOL · max|visible row| (see the file comment); also the bound of the decode
/// split's slices on matrix cores (fast_attention.rs), the same tiles.
pub(super) const ATT_TOL: f64 = 2e-3;

/// ATT_TOL · max|visible row| as `close_scaled`'s tolerance (relative to max|want|), and max|row|.
pub(super) fn att_tol_scaled(case: &AttentionCase, want: &[f32]) -> (f64, f64) {
    let row_max = case
        .ring
        .iter()
        .chain(&case.comp)
        .fold(0f64, |m, &v| m.max(v.abs() as f64));
    let ref_max = want.iter().fold(0f64, |m, &v| m.max(v.abs() as f64));
    (ATT_TOL * row_max / ref_max.max(f64::MIN_POSITIVE), row_max)
}

/// One case: label, tokens, first position, heads, head_dim, ratio, compressed rows in the cache,
/// top_k (0 = no indexer selection).
type Case = (&'static str, usize, usize, usize, usize, usize, usize, usize);

pub fn run(gpu: &Gpu, rng: &mut CheckRng, emit: Emit) {
    let cases: [Case; 7] = [
        ("window only, 1 tok", 1, 300, 64, 512, 0, 0, 0),
        ("window only, 37 tok from 0", 37, 0, 64, 512, 0, 0, 0),
        ("window only, 256 tok", 256, 200, 8, 128, 0, 0, 0),
        ("ratio128 rows, 37 tok", 37, 5000, 64, 512, 128, 40, 0),
        ("ratio4 rows, 256 tok", 256, 100, 8, 128, 4, 90, 0),
        ("ratio4 +indexer sel, 37 tok", 37, 2000, 64, 512, 4, 510, 96),
        ("ratio4 +indexer sel, 256 tok", 256, 1000, 8, 128, 4, 314, 40),
    ];
    // The kernel's tiles are laid out for 32-lane warps: a 64-lane device keeps the exact sequence
    // (`Pass::attention_prefill_fast`), so the wave64 rerun has none of it to check.
    for case in cases.into_iter().filter(|_| !wave_rerun()) {
        let name = format!("kernel.attention_prefill_fast[{}]", case.0);
        emit(guard(&name, || check_case(gpu, rng, &name, case)));
    }
    for (ratio, pos0, n_tok, comp_cap) in [
        (4usize, 0usize, 37usize, 100usize),
        (4, 6, 256, 100),
        (4, 8, 1, 100),
        (4, 11, 1, 100),
        (4, 1000, 37, 255),
        (128, 0, 256, 100),
        (128, 130, 37, 100),
        (128, 255, 1, 100),
        (128, 200, 256, 3),
    ] {
        let name = format!("kernel.compressor_pool_fast[ratio {ratio}, {n_tok} tok at {pos0}, cap {comp_cap}]");
        emit(guard(&name, || {
            check_pool(gpu, rng, &name, ratio, pos0, n_tok, comp_cap)
        }));
    }
}

/// The fast pooling twin against ds4_compressor_pool from the same state, bitwise.
fn check_pool(
    gpu: &Gpu,
    rng: &mut CheckRng,
    name: &str,
    ratio: usize,
    pos0: usize,
    n_tok: usize,
    comp_cap: usize,
) -> Checked {
    let head_dim = 96usize;
    let c = if ratio == 4 { 2 } else { 1 };
    let width = c * head_dim;
    let state_rows = c * ratio;
    // A state as some earlier batch left it: random rows, some scores still at the initial -1e30.
    let skv = random_vec(rng, state_rows * width, 1.0);
    let ssc: Vec<f32> = random_vec(rng, state_rows * width, 2.0)
        .into_iter()
        .map(|v| if v > 1.6 { -1.0e30 } else { v })
        .collect();
    let kv = random_vec(rng, n_tok * width, 1.0);
    let sc = random_vec(rng, n_tok * width, 2.0);
    let ape: Vec<u16> = random_vec(rng, ratio * width, 0.5)
        .into_iter()
        .map(f32_to_f16)
        .collect();
    let rows0 = random_vec(rng, comp_cap * head_dim, 1.0);
    let mut outs = Vec::new();
    for fast in [false, true] {
        let pool = PoolBuffers::up(gpu, gpu.up(&rows0)?, [&skv, &ssc], [&kv, &sc], &ape, pos0)?;
        let l = pool.launch(head_dim, ratio, n_tok, comp_cap);
        let l = if fast {
            kernels::fast_twin(&l).expect("a pooling twin")
        } else {
            l
        };
        gpu.run(&l)?;
        let mut all = pool.rows.to_vec::<f32>()?;
        all.extend(pool.state()?);
        outs.push(all);
    }
    Ok(same_bits(
        name,
        &outs[1],
        &outs[0],
        format!("rows + state, head_dim {head_dim}"),
    ))
}

fn check_case(gpu: &Gpu, rng: &mut CheckRng, name: &str, case: Case) -> Checked {
    let (_, n_tok, pos0, n_head, head_dim, ratio, n_comp, top_k) = case;
    let window = 128usize;
    let ring_cap = window + n_tok - 1;
    let shape = attention_shape(n_head, head_dim, ring_cap, window, ratio, top_k);
    // Compressed rows are f16-rounded in the cache (ds4_rows_finish ROUND_F16).
    let case = AttentionCase::new(gpu, rng, shape, n_tok, pos0, n_comp, round_f16)?;
    let rows = case.rows();
    let exact = gpu.poisoned::<f32>(n_tok * n_head * head_dim)?;
    case.run_exact(gpu, &exact, rows)?;
    let fast = gpu.poisoned::<f32>(n_tok * n_head * head_dim)?;
    gpu.run(&kernels::attention_prefill_fast(
        &shape,
        fast.ptr().0,
        &case.inputs(),
        n_tok as u32,
    ))?;
    let (got, want) = (fast.to_vec::<f32>()?, exact.to_vec::<f32>()?);
    let (tol, row_max) = att_tol_scaled(&case, &want);
    let r = close_scaled(
        name,
        &got,
        &want,
        tol,
        format!(
            "{n_tok} tok at {pos0}, {n_head}x{head_dim}, up to {rows} rows; bound {ATT_TOL:e} x max|row| {row_max:.2}"
        ),
    );
    Ok(r)
}
