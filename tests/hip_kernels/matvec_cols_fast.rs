//! The fast column matvecs (kernels/matvec_cols_fast.hip) against the fast single-token matvecs
//! (kernels/matvec_fast.hip), bitwise, for every block size 2..=8: per column the same lane dots,
//! row sums and K-slice sums in the same order, only the weight loads shared, so each column must
//! have the bits of the fast kernel for that token alone (its launch over the same tokens, one grid
//! row per token). Shapes as matvec_fast's: Q8_0 rows of 1, 4, 16, 32 and 64 tiled chunks (whole
//! rows a warp tile, and rows split over warps), grouped rows, the untiled path; few blocks a grid
//! (several rounds a block); the fused pair and quantized products against their single-token forms.

use ds4_chat::backend::hip::kernels::{self, FastGrids, Launch, Q8Proj};
use ds4_chat::backend::hip::runtime::{DeviceBuffer, HipResult};
use ds4_chat::gguf::GgmlType;

use super::matvec_cols::{BLOCK_SIZES, check_f16, check_q8_0, check_swiglu, proj_into};
use super::matvec_fast::FEW_AND_DEFAULT_BLOCKS;
use super::support::*;

/// Every check of this file.
pub fn run(gpu: &Gpu, rng: &mut CheckRng, emit: Emit) {
    // (n_in, n_out, rows_per_group): 1, 4, 16, 32 and 64 chunks a row, grouped, 3 chunks (untiled).
    let q8_0 = [
        (256usize, 131usize, 131usize),
        (1024, 200, 50),
        (4096, 37, 37),
        (8192, 21, 7),
        (16384, 9, 9),
        (768, 45, 45),
    ];
    for (n_in, n_out, group) in q8_0 {
        for n in BLOCK_SIZES {
            let name = format!("matvec_cols_fast.q8_0[{n_in}x{n_out},group {group},{n} tok]");
            emit(guard(&name, || {
                check_q8_0(gpu, rng, &name, (n_in, n_out, group, n), true)
            }));
        }
    }
    // At least 19 rows, so that some gate is positive (matvec_fast's swiglu cases say why); rows of
    // 4, 16 and 32 tiled chunks take the register-held form.
    for (n_in, n_ff) in [
        (4096usize, 45usize),
        (1024, 37),
        (8192, 21),
        (16384, 21),
        (512, 19),
        (768, 23),
    ] {
        for n in BLOCK_SIZES {
            let name = format!("matvec_cols_fast.q8_0_swiglu[{n_in}x{n_ff},{n} tok]");
            emit(guard(&name, || check_swiglu(gpu, rng, &name, (n_in, n_ff, n), true)));
        }
    }
    for (n_in, n_out, pair) in [(4096usize, 77usize, false), (1032, 37, false), (1024, 21, true)] {
        for n in BLOCK_SIZES {
            let op = if pair { "f16_pair" } else { "f16" };
            let name = format!("matvec_cols_fast.{op}[{n_in}x{n_out},{n} tok]");
            emit(guard(&name, || {
                check_f16(gpu, rng, &name, (n_in, n_out, n, pair), true)
            }));
        }
    }
    // Few blocks: each takes several rounds in turn (8192 columns: K split over warps).
    for (n_in, n_out) in [(8192usize, 64usize), (1024, 600)] {
        let name = format!("matvec_cols_fast.q8_0_few_blocks[{n_in}x{n_out},5 tok]");
        emit(guard(&name, || check_few_blocks(gpu, rng, &name, (n_in, n_out, 5))));
    }
    // The query and kv down-projections' shape; a short second matrix.
    for (n_in, n0, n1) in [(4096usize, 64usize, 24usize), (1024, 32, 13)] {
        for n in BLOCK_SIZES {
            let name = format!("matvec_cols_fast.q8_0_pair[{n_in}x({n0}+{n1}),{n} tok]");
            emit(guard(&name, || check_pair(gpu, rng, &name, (n_in, n0, n1, n))));
        }
    }
    // The attention's grouped low-rank output (4096-column groups), K split (8192), 64 rows a round.
    for (n_in, n_out, group) in [(4096usize, 256usize, 64usize), (8192, 96, 96), (512, 192, 192)] {
        for n in BLOCK_SIZES {
            let name = format!("matvec_cols_fast.q8_0_quantized[{n_in}x{n_out},group {group},{n} tok]");
            emit(guard(&name, || {
                check_quantized(gpu, rng, &name, (n_in, n_out, group, n))
            }));
        }
    }
}

/// The fast column matvec on 3 blocks and on the default grid against the single-token fast
/// matvec: the same bits (the grid never changes them).
fn check_few_blocks(gpu: &Gpu, rng: &mut CheckRng, name: &str, (n_in, n_out, n): (usize, usize, usize)) -> Checked {
    let case = Q8ProjCase::new(gpu, rng, (n_in, n_out, n_out, n))?;
    gpu.run(&twin_of(&kernels::matvec_q8_0(&case.proj, n as u32)))?;
    let want = case.y.to_vec::<f32>()?;
    let (mut notes, mut pass) = (Vec::new(), true);
    for grids in FEW_AND_DEFAULT_BLOCKS {
        let y = gpu.poisoned::<f32>(n * n_out)?;
        let proj = proj_into(&case.proj, &y);
        let twin = kernels::fast_twin_tuned(&kernels::matvec_q8_0_cols(&proj, n as u32), grids).expect("a fast twin");
        gpu.run(&twin)?;
        let got = same_bits(name, &y.to_vec::<f32>()?, &want, format!("grid {}", twin.grid[0]));
        pass &= got.verdict == Verdict::Pass;
        notes.push(got.note);
    }
    Ok(all_passed(name, pass, notes))
}

/// A check made of several bitwise comparisons: `pass` when all of them passed, their notes joined.
fn all_passed(name: &str, pass: bool, notes: Vec<String>) -> CheckResult {
    CheckResult::measured(name, f64::from(u8::from(!pass)), 0.0, 0.0, pass, notes.join("; "))
}

/// Runs `launch` and returns the bytes of `outs`, poisoned before.
fn outputs(gpu: &Gpu, launch: &Launch, outs: &mut [&mut DeviceBuffer]) -> HipResult<Vec<u8>> {
    gpu.repoison(outs.iter_mut().map(|b| &mut **b))?;
    gpu.run(launch)?;
    let mut bytes = Vec::new();
    for b in outs.iter() {
        bytes.extend(b.to_vec::<u8>()?);
    }
    Ok(bytes)
}

/// `ds4_matvec_q8_0_pair_cols_fast` against `ds4_matvec_q8_0_pair_fast` over the same tokens (one
/// grid row each): the same bytes, on 3 blocks and on the default grid.
fn check_pair(gpu: &Gpu, rng: &mut CheckRng, name: &str, (n_in, n0, n1, n): (usize, usize, usize, usize)) -> Checked {
    let (_, x_d) = gpu.up_q8_0(&random_vec(rng, n * n_in, 2.0))?;
    let w0 = gpu.up(&random_weights(rng, GgmlType::Q8_0, n_in, n0))?;
    let w1 = gpu.up(&random_weights(rng, GgmlType::Q8_0, n_in, n1))?;
    let (mut y0, mut y1) = (gpu.poisoned::<f32>(n * n0)?, gpu.poisoned::<f32>(n * n1)?);
    let proj = |y: &DeviceBuffer, w: &DeviceBuffer, rows: usize| {
        Q8Proj::plain(y.ptr().0, w.ptr().0, x_d.act(), n_in as u32, rows as u32)
    };
    let (p0, p1) = (proj(&y0, &w0, n0), proj(&y1, &w1, n1));
    let single = kernels::paired_matvec_q8_0(&p0, &p1, n as u32, FastGrids::default()).expect("paired");
    let want = outputs(gpu, &single, &mut [&mut y0, &mut y1])?;
    let (mut notes, mut pass) = (Vec::new(), true);
    for grids in FEW_AND_DEFAULT_BLOCKS {
        let cols =
            kernels::paired_matvec_q8_0_cols(&p0, &p1, n as u32, grids).expect("the column pair takes this shape");
        let same = outputs(gpu, &cols, &mut [&mut y0, &mut y1])? == want;
        pass &= same;
        notes.push(format!(
            "{} grid {}: {}",
            cols.kernel.name,
            cols.grid[0],
            if same { "same bytes" } else { "BYTES DIFFER" }
        ));
    }
    Ok(all_passed(name, pass, notes))
}

/// `ds4_matvec_q8_0_q8_cols_fast` against `ds4_matvec_q8_0_q8_fast` over the same tokens: the same
/// codes and scales, on 3 blocks and on the default grid.
fn check_quantized(
    gpu: &Gpu,
    rng: &mut CheckRng,
    name: &str,
    (n_in, n_out, group, n): (usize, usize, usize, usize),
) -> Checked {
    let case = Q8ProjCase::new(gpu, rng, (n_in, n_out, group, n))?;
    let (mut q, mut d) = (gpu.poisoned::<i8>(n * n_out)?, gpu.poisoned::<f32>(n * n_out / 32)?);
    let planes = (q.ptr().0, d.ptr().0);
    let single = kernels::matvec_q8_0_quantized(&case.proj, planes, n as u32, FastGrids::default()).expect("fused");
    let want = outputs(gpu, &single, &mut [&mut q, &mut d])?;
    let (mut notes, mut pass) = (Vec::new(), true);
    for grids in FEW_AND_DEFAULT_BLOCKS {
        let cols = kernels::matvec_q8_0_quantized_cols(&case.proj, planes, n as u32, grids)
            .expect("the column form takes this shape");
        let same = outputs(gpu, &cols, &mut [&mut q, &mut d])? == want;
        pass &= same;
        notes.push(format!(
            "{} grid {}: {}",
            cols.kernel.name,
            cols.grid[0],
            if same { "same codes and scales" } else { "BYTES DIFFER" }
        ));
    }
    Ok(all_passed(name, pass, notes))
}
