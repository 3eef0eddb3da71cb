//! The fast compressor pooling (kernels/compressor_fast.hip: the batch's emitted rows in parallel)
//! against ds4_compressor_pool: bitwise equal, emitted rows and the state left behind, at ratios 4
//! and 128, batches of 1, 37 and 256 tokens starting at, inside and right after a window.

use ds4_chat::backend::hip::kernels;
use ds4_chat::gguf::half::f32_to_f16;

use super::compressor::PoolBuffers;
use super::support::*;

/// Every check of this file.
pub fn run(gpu: &Gpu, rng: &mut CheckRng, emit: Emit) {
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
