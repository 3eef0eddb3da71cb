//! The products that finish their output units (kernels/matvec_heads_fast.hip,
//! kernels::head_fusions) against the fast launches they replace, run one after the other on the
//! same inputs: the same bits in every output (the heads, the kv row and its ring row, the SwiGLU's
//! output and its Q8_0 planes), launched
//! twice (the finishers put their counters back, so a second launch, as a replayed graph's, finishes
//! again), on grids where a block finishes several heads and where many blocks share a head.

use ds4_chat::backend::cpu::ops::Rope;
use ds4_chat::backend::hip::kernels::{self, QuantOut, RopeParams, row_flags as rf};
use ds4_chat::backend::hip::runtime::HipResult;
use ds4_chat::model::hparams::HParams;

use super::fast_matvec::{FEW_AND_DEFAULT_BLOCKS, finisher_result, run_fast};
use super::support::*;

/// Every check of this file.
pub fn run(gpu: &Gpu, rng: &mut CheckRng, emit: Emit) {
    // The query's up-projection into heads of the Flash width (512), fewer of them.
    for n_tok in [1usize, 2] {
        let name = format!("fast_heads.q8_0_normed_rows[1024x(6x512),{n_tok} tok]");
        emit(guard(&name, || check_normed_rows(gpu, rng, &name, (6, n_tok))));
    }
    // The shared expert's SwiGLU (4096 columns, 16 chunks a row; 2048 rows are 8 units of 256).
    for n_tok in [1usize, 2] {
        let name = format!("fast_heads.q8_0_swiglu_q8[4096x2048,{n_tok} tok]");
        emit(guard(&name, || {
            check_swiglu_quantized(gpu, rng, &name, (4096, 2048, n_tok))
        }));
    }
    // The indexer's query heads (the Flash head width, 128), fewer of them.
    for n_tok in [1usize, 2] {
        let name = format!("fast_heads.f16_normed_hadamard[1024x(12x128),{n_tok} tok]");
        emit(guard(&name, || check_normed_hadamard(gpu, rng, &name, (12, n_tok))));
    }
}

fn rope() -> RopeParams {
    RopeParams::from_rope(&Rope::for_layer(&HParams::flash(), true))
}

/// `ds4_matvec_q8_0_normed_rows_fast` against `ds4_matvec_q8_0_normed_fast` then
/// `ds4_rows_finish_pair_fast` (the query heads and a kv row with its ring store).
fn check_normed_rows(gpu: &Gpu, rng: &mut CheckRng, name: &str, (n_head, n_tok): (usize, usize)) -> Checked {
    let (n_in, d, ring_cap, pos0) = (1024usize, 512usize, 64usize, 300u32);
    let n_out = n_head * d;
    let nt = n_tok as u32;
    let case = Q8ProjCase::new(gpu, rng, (n_in, n_out, n_out, n_tok))?;
    let x = gpu.up(&random_vec(rng, n_tok * n_in, 3.0))?;
    let norm_w = gpu.up(&(0..n_in).map(|_| 1.0 + 0.5 * rng.next_f32()).collect::<Vec<f32>>())?;
    let kv = random_vec(rng, n_tok * d, 3.0);
    let kv_w = gpu.up(&(0..d).map(|_| 1.0 + 0.3 * rng.next_f32()).collect::<Vec<f32>>())?;
    let pos = gpu.up(&[pos0])?;
    let counter = gpu.up(&vec![0u32; n_tok * n_head])?;
    let eps = 1e-6;
    // The outputs (heads, kv row, ring) after the launches `fused` picks, on fresh kv and ring.
    let run = |fused: Option<kernels::FastGrids>| -> HipResult<Vec<u8>> {
        let (y, kv_d, ring) = (
            gpu.poisoned::<f32>(n_tok * n_out)?,
            gpu.up(&kv)?,
            gpu.poisoned::<f32>(ring_cap * d)?,
        );
        let proj = kernels::Q8Proj {
            y: y.ptr().0,
            ..case.proj
        };
        let grids = fused.unwrap_or_default();
        let normed = kernels::matvec_q8_0_normed(&proj, x.ptr().0, norm_w.ptr().0, eps, nt, grids)
            .expect("the normed launch takes this shape");
        let heads = kernels::rows_finish(
            y.ptr().0,
            0,
            0,
            pos.ptr().0,
            n_head as u32,
            d as u32,
            rf::NORM | rf::ROPE,
            1,
            rope(),
            eps,
            nt,
        );
        let kv_flags = rf::NORM | rf::ROPE | rf::E4M3 | rf::STORE_RING;
        let kv_row = kernels::rows_finish(
            kv_d.ptr().0,
            ring.ptr().0,
            kv_w.ptr().0,
            pos.ptr().0,
            1,
            d as u32,
            kv_flags,
            ring_cap as u32,
            rope(),
            eps,
            nt,
        );
        let pair = kernels::fused_rows_finish_pair(&heads, &kv_row).expect("a paired launch for these rows");
        match fused {
            Some(_) => gpu.run(
                &kernels::matvec_q8_0_normed_rows(&normed, &pair, counter.ptr().0)
                    .expect("the fused launch takes this shape"),
            )?,
            None => {
                gpu.run(&normed)?;
                gpu.run(&pair)?;
            }
        }
        let mut bytes = y.to_vec::<u8>()?;
        bytes.extend(kv_d.to_vec::<u8>()?);
        bytes.extend(ring.to_vec::<u8>()?);
        Ok(bytes)
    };
    let want = run(None)?;
    let (mut notes, mut pass) = (Vec::new(), true);
    for grids in FEW_AND_DEFAULT_BLOCKS {
        for launch in 0..2 {
            let got = run(Some(grids))?;
            let same = got == want;
            pass &= same;
            notes.push(format!(
                "grid {} launch {launch}: {}",
                grids.q8_0_max_blocks,
                if same { "same bytes" } else { "BYTES DIFFER" }
            ));
        }
    }
    finisher_result(name, &counter, pass, notes)
}

/// `ds4_matvec_f16_normed_hadamard_fast` against `ds4_rms_norm_quant_fast` (f32 out),
/// `ds4_matvec_f16_fast` and `ds4_rows_finish_hadamard_fast` (RoPE and Hadamard/FP4 rows).
fn check_normed_hadamard(gpu: &Gpu, rng: &mut CheckRng, name: &str, (n_head, n_tok): (usize, usize)) -> Checked {
    let (n_in, d, pos0) = (1024usize, 128usize, 4100u32);
    let n_out = n_head * d;
    let nt = n_tok as u32;
    let mut case = F16ProjCase::new(gpu, rng, 1, (n_in, n_out, n_tok), n_in)?;
    let norm_w = gpu.up(&(0..n_in).map(|_| 1.0 + 0.5 * rng.next_f32()).collect::<Vec<f32>>())?;
    let xn = gpu.poisoned::<f32>(n_tok * n_in)?;
    let pos = gpu.up(&[pos0])?;
    let counter = gpu.up(&vec![0u32; n_tok * n_head])?;
    let eps = 1e-6;
    let [y, w, x] = [&case.ys[0], &case.ws[0], &case.x].map(|b| b.ptr().0);
    let norm = kernels::norm_rows(
        QuantOut {
            out: xn.ptr().0,
            ..Default::default()
        },
        x,
        norm_w.ptr().0,
        n_in as u32,
        nt,
        eps,
    );
    let product = kernels::matvec_f16(y, w, xn.ptr().0, n_in as u32, n_out as u32, n_in as u32, nt);
    let flags = rf::ROPE | rf::HADAMARD_FP4;
    let rows = kernels::rows_finish(y, 0, 0, pos.ptr().0, n_head as u32, d as u32, flags, 1, rope(), eps, nt);
    run_fast(gpu, &[norm.clone(), product.clone(), rows.clone()])?;
    let want = case.ys[0].to_vec::<f32>()?;
    let fused = kernels::matvec_f16_normed_hadamard(&norm, &product, &rows, counter.ptr().0)
        .expect("the fused launch takes this shape");
    let (mut notes, mut pass) = (Vec::new(), true);
    for launch in 0..2 {
        gpu.repoison([&mut case.ys[0]])?;
        gpu.run(&fused)?;
        let got = same_bits(name, &case.ys[0].to_vec::<f32>()?, &want, format!("launch {launch}"));
        pass &= got.verdict == Verdict::Pass;
        notes.push(got.note);
    }
    finisher_result(name, &counter, pass, notes)
}

/// `ds4_matvec_q8_0_swiglu_q8_fast` against `ds4_matvec_q8_0_swiglu_fast` then the fast Q8_0 of its
/// output as rows of 256 (the shared expert's mid row and its planes).
fn check_swiglu_quantized(
    gpu: &Gpu,
    rng: &mut CheckRng,
    name: &str,
    (n_in, n_ff, n_tok): (usize, usize, usize),
) -> Checked {
    let nt = n_tok as u32;
    let case = Q8SwigluCase::new(gpu, rng, (n_in, n_ff, n_tok), 7.0)?;
    let counter = gpu.up(&vec![0u32; n_tok * n_ff / 256])?;
    let run = |fused: bool| -> HipResult<Vec<u8>> {
        let (mid, q, d) = (
            gpu.poisoned::<f32>(n_tok * n_ff)?,
            gpu.poisoned::<i8>(n_tok * n_ff)?,
            gpu.poisoned::<f32>(n_tok * n_ff / 32)?,
        );
        let s = kernels::Q8Swiglu {
            mid: mid.ptr().0,
            ..case.sw
        };
        let swiglu = kernels::matvec_q8_0_swiglu(&s, nt);
        let quant = kernels::quantize_rows(QuantOut::q8_0(q.ptr().0, d.ptr().0), mid.ptr().0, n_ff as u32, nt);
        match fused {
            true => gpu.run(
                &kernels::matvec_q8_0_swiglu_quantized(&swiglu, &quant, counter.ptr().0)
                    .expect("the fused launch takes this shape"),
            )?,
            false => run_fast(gpu, &[swiglu, quant])?,
        }
        let mut bytes = mid.to_vec::<u8>()?;
        bytes.extend(q.to_vec::<u8>()?);
        bytes.extend(d.to_vec::<u8>()?);
        Ok(bytes)
    };
    let want = run(false)?;
    let (mut notes, mut pass) = (Vec::new(), true);
    for launch in 0..2 {
        let same = run(true)? == want;
        pass &= same;
        notes.push(format!(
            "launch {launch}: {}",
            if same { "same bytes" } else { "BYTES DIFFER" }
        ));
    }
    finisher_result(name, &counter, pass, notes)
}
