//! The row finishing kernel (kernels/rows.hip) against the CPU reference, bitwise: RMSNorm, RoPE
//! and its inverse, E4M3 KV rounding, the raw ring store, the indexer's Hadamard + FP4.

use ds4_chat::backend::cpu::ops::{Rope, fp8_kv_round_trip, indexer_qat, rms_norm};
use ds4_chat::backend::hip::kernels;
use ds4_chat::gguf::half::round_f16;
use ds4_chat::model::hparams::HParams;

use super::support::*;

/// Every check of this file.
pub fn run(gpu: &Gpu, rng: &mut CheckRng, emit: Emit) {
    for v in [
        RowsVariant::Q,
        RowsVariant::QInverse,
        RowsVariant::Kv,
        RowsVariant::Indexer,
    ] {
        let name = format!("kernel.rows_finish[{v:?}]");
        let r = guard(&name, || check_rows_finish(gpu, rng, &name, v, &mut *emit));
        emit(r);
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum RowsVariant {
    /// Attention q rows: RMSNorm (no weight) + plain RoPE (dense layer).
    Q,
    /// Inverse RoPE (attention output de-rotation).
    QInverse,
    /// KV row of a compressed layer: RMSNorm with weight, YaRN RoPE, E4M3 on the non-rope dims, f16
    /// rounding, stored into the raw ring.
    Kv,
    /// Indexer q rows: YaRN RoPE + Hadamard-128 and FP4.
    Indexer,
}

fn check_rows_finish(gpu: &Gpu, rng: &mut CheckRng, name: &str, v: RowsVariant, emit: Emit) -> Checked {
    use kernels::row_flags as f;
    let hp = HParams::flash();
    let eps = 1e-6f32;
    let (n_head, head_dim, n_tok, pos0, flags, compressed) = match v {
        RowsVariant::Q => (3usize, hp.head_dim, 2usize, 1000usize, f::NORM | f::ROPE, false),
        RowsVariant::QInverse => (2, hp.head_dim, 2, 77, f::ROPE | f::ROPE_INVERSE, false),
        RowsVariant::Kv => (
            1,
            hp.head_dim,
            3,
            300,
            f::NORM | f::ROPE | f::E4M3 | f::ROUND_F16 | f::STORE_RING,
            true,
        ),
        RowsVariant::Indexer => (4, hp.idx_head_dim, 2, 4100, f::ROPE | f::HADAMARD_FP4, true),
    };
    let ring_cap = 256usize;
    let x = random_vec(rng, n_tok * n_head * head_dim, 3.0);
    let w: Vec<f32> = (0..head_dim).map(|_| 1.0 + 0.3 * rng.next_f32()).collect();
    let use_w = v == RowsVariant::Kv;
    let x_d = gpu.up(&x)?;
    let w_d = gpu.up(&w)?;
    let ring = gpu.poisoned::<f32>(ring_cap * head_dim)?;
    let pos_d = gpu.up(&[pos0 as u32])?;
    // The engine's RoPE of the layer kind (YaRN for compressed rows, plain for dense ones).
    let rope = kernels::RopeParams::from_rope(&Rope::for_layer(&hp, compressed));
    gpu.run(&kernels::rows_finish(
        x_d.ptr().0,
        if flags & f::STORE_RING != 0 {
            ring.ptr().0
        } else {
            kernels::NULL
        },
        if use_w { w_d.ptr().0 } else { kernels::NULL },
        pos_d.ptr().0,
        n_head as u32,
        head_dim as u32,
        flags,
        ring_cap as u32,
        rope,
        eps,
        n_tok as u32,
    ))?;
    let got = x_d.to_vec::<f32>()?;
    let cpu_rope = Rope::for_layer(&hp, compressed);
    let mut want = x.clone();
    for t in 0..n_tok {
        for h in 0..n_head {
            let row = &mut want[(t * n_head + h) * head_dim..(t * n_head + h + 1) * head_dim];
            if flags & f::NORM != 0 {
                let src = row.to_vec();
                rms_norm(row, &src, if use_w { Some(&w) } else { None }, eps);
            }
            cpu_rope.apply(row, head_dim, pos0 + t, flags & f::ROPE_INVERSE != 0);
            if flags & f::E4M3 != 0 {
                fp8_kv_round_trip(row, head_dim - hp.n_rot);
            }
            if flags & f::HADAMARD_FP4 != 0 {
                indexer_qat(row);
            }
            if flags & f::ROUND_F16 != 0 {
                row.iter_mut().for_each(|x| *x = round_f16(*x));
            }
        }
    }
    let note = format!("{n_tok} tok x {n_head} heads x {head_dim}, pos {pos0}");
    if flags & f::STORE_RING != 0 {
        let ring_all = ring.to_vec::<f32>()?;
        let mut got_ring = Vec::new();
        for t in 0..n_tok {
            let r = (pos0 + t) % ring_cap;
            got_ring.extend_from_slice(&ring_all[r * head_dim..(r + 1) * head_dim]);
        }
        emit(same_bits(
            &format!("{name}.ring"),
            &got_ring,
            &want,
            format!("rows at pos % {ring_cap}"),
        ));
    }
    Ok(same_bits(name, &got, &want, note))
}
