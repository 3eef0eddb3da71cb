//! The compressor's kernel (kernels/compressor.hip) against the CPU reference: the pooling at ratio 4
//! and 128, across and within windows, bitwise.

use ds4_chat::backend::cpu::compressor::{CompressorState, NEG_INF};
use ds4_chat::backend::hip::kernels::{self, Launch};
use ds4_chat::backend::hip::runtime::{DeviceBuffer, HipResult};
use ds4_chat::gguf::half::f32_to_f16;

use super::support::*;

/// Every check of this file, with its shapes.
pub fn run(gpu: &Gpu, rng: &mut CheckRng, emit: Emit) {
    for (ratio, head_dim, pos0, n_tok) in [(4usize, 512usize, 5usize, 11usize), (4, 128, 0, 1), (128, 512, 120, 10)] {
        let name = format!("kernel.compressor_pool[ratio {ratio}, {n_tok} tok at {pos0}]");
        let r = guard(&name, || {
            check_compressor(gpu, rng, &name, (ratio, head_dim, pos0, n_tok), &mut *emit)
        });
        emit(r);
    }
}

/// Compressor state update and pooling against `CompressorState::push`, starting from a
/// random mid-stream state; checks the emitted rows and the final kv/score state.
fn check_compressor(
    gpu: &Gpu,
    rng: &mut CheckRng,
    name: &str,
    shape: (usize, usize, usize, usize),
    emit: Emit,
) -> Checked {
    let (ratio, head_dim, pos0, n_tok) = shape;
    let comp_cap = 64usize;
    let mut cpu = CompressorState::new(ratio, head_dim);
    let w = cpu.width();
    // A state as left by earlier tokens: random rows, some never-written rows (NEG_INF scores).
    for (k, s) in cpu.kv.iter_mut().zip(cpu.score.iter_mut()) {
        *k = rng.next_f32();
        *s = if rng.next_u64().is_multiple_of(5) {
            NEG_INF
        } else {
            2.0 * rng.next_f32()
        };
    }
    let kv_cur = random_vec(rng, n_tok * w, 1.0);
    let sc_cur = random_vec(rng, n_tok * w, 2.0);
    let ape_bits: Vec<u16> = (0..ratio * w).map(|_| f32_to_f16(0.5 * rng.next_f32())).collect();
    let ape: Vec<f32> = ape_bits.iter().map(|&h| ds4_chat::gguf::half::f16_to_f32(h)).collect();
    let comp = gpu.poisoned::<f32>(comp_cap * head_dim)?;
    let state = [cpu.kv.as_slice(), &cpu.score];
    let pool = PoolBuffers::up(gpu, comp, state, [&kv_cur, &sc_cur], &ape_bits, pos0)?;
    gpu.run(&pool.launch(head_dim, ratio, n_tok, comp_cap))?;
    let comp_all = pool.rows.to_vec::<f32>()?;
    let (mut got_rows, mut want_rows) = (Vec::new(), Vec::new());
    let mut row = vec![0f32; head_dim];
    for t in 0..n_tok {
        let p = pos0 + t;
        if cpu.push(
            &kv_cur[t * w..(t + 1) * w],
            &sc_cur[t * w..(t + 1) * w],
            &ape,
            p,
            &mut row,
        ) {
            let r = (p + 1) / ratio - 1;
            want_rows.extend_from_slice(&row);
            got_rows.extend_from_slice(&comp_all[r * head_dim..(r + 1) * head_dim]);
        }
    }
    let state_got = pool.state()?;
    let mut state_want = cpu.kv.clone();
    state_want.extend(&cpu.score);
    emit(same_bits(
        &format!("{name}.state"),
        &state_got,
        &state_want,
        "kv|score".into(),
    ));
    let emitted = want_rows.len() / head_dim;
    Ok(same_bits(
        name,
        &got_rows,
        &want_rows,
        format!("{emitted} rows emitted, head_dim {head_dim}"),
    ))
}

/// The device operands of `ds4_compressor_pool`: the pooled rows it writes, the kv and score state
/// it updates, the batch's kv and score rows, the f16 positional biases and the position word.
pub struct PoolBuffers {
    pub rows: DeviceBuffer,
    state: [DeviceBuffer; 2],
    batch: [DeviceBuffer; 2],
    ape: DeviceBuffer,
    pos: DeviceBuffer,
}

impl PoolBuffers {
    /// Uploads the state ([kv, score]), the batch's rows ([kv, score]), the biases and pos0 beside `rows`.
    pub fn up(
        gpu: &Gpu,
        rows: DeviceBuffer,
        state: [&[f32]; 2],
        batch: [&[f32]; 2],
        ape: &[u16],
        pos0: usize,
    ) -> HipResult<PoolBuffers> {
        Ok(PoolBuffers {
            rows,
            state: [gpu.up(state[0])?, gpu.up(state[1])?],
            batch: [gpu.up(batch[0])?, gpu.up(batch[1])?],
            ape: gpu.up(ape)?,
            pos: gpu.up(&[pos0 as u32])?,
        })
    }

    /// `ds4_compressor_pool` of `n_tok` tokens over these buffers.
    pub fn launch(&self, head_dim: usize, ratio: usize, n_tok: usize, comp_cap: usize) -> Launch {
        let [rows, kv, score, kv_cur, sc_cur, ape, pos] = [
            &self.rows,
            &self.state[0],
            &self.state[1],
            &self.batch[0],
            &self.batch[1],
            &self.ape,
            &self.pos,
        ]
        .map(|b| b.ptr().0);
        let [head_dim, ratio, n_tok, comp_cap] = [head_dim, ratio, n_tok, comp_cap].map(|v| v as u32);
        kernels::compressor_pool(
            rows, kv, score, kv_cur, sc_cur, ape, pos, head_dim, ratio, n_tok, comp_cap,
        )
    }

    /// The state after the launches: kv, then score.
    pub fn state(&self) -> HipResult<Vec<f32>> {
        let mut all = self.state[0].to_vec::<f32>()?;
        all.extend(self.state[1].to_vec::<f32>()?);
        Ok(all)
    }
}
