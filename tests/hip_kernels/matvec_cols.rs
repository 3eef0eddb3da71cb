//! The column matvecs (kernels/matvec_cols.hip: a block of 2 to 8 tokens in one grid row, each
//! weight read once) against the single-token matvecs of kernels/matvec.hip, bitwise, for every
//! block size 2..=8: each column must have the bits of the single-token kernel for that token
//! alone (its launch over the same tokens, one grid row per token, is what a decode step runs for
//! each of them), and so the CPU reference's. Shapes: the Flash width (4096 inputs), small rows, a
//! grouped projection, row counts that are not whole blocks of 8 rows.

use ds4_chat::backend::hip::kernels::{self, Launch, Q8Proj, Q8Swiglu};
use ds4_chat::backend::hip::runtime::{DeviceBuffer, HipResult};

use super::support::*;

/// Block sizes of a verify pass.
pub const BLOCK_SIZES: std::ops::RangeInclusive<usize> = 2..=kernels::MATVEC_COLS as usize;

/// Every check of this file.
pub fn run(gpu: &Gpu, rng: &mut CheckRng, emit: Emit) {
    // (n_in, n_out, rows_per_group): Flash's width, a grouped projection, small rows; n_out % 8 != 0.
    for (n_in, n_out, group) in [(4096usize, 77usize, 77usize), (1024, 96, 24), (256, 45, 45)] {
        for n in BLOCK_SIZES {
            let name = format!("matvec_cols.q8_0[{n_in}x{n_out},group {group},{n} tok]");
            emit(guard(&name, || {
                check_q8_0(gpu, rng, &name, (n_in, n_out, group, n), false)
            }));
        }
    }
    for (n_in, n_ff) in [(4096usize, 45usize), (512, 19)] {
        for n in BLOCK_SIZES {
            let name = format!("matvec_cols.q8_0_swiglu[{n_in}x{n_ff},{n} tok]");
            emit(guard(&name, || check_swiglu(gpu, rng, &name, (n_in, n_ff, n), false)));
        }
    }
    for (n_in, n_out, pair) in [(4096usize, 77usize, false), (1032, 37, false), (1024, 21, true)] {
        for n in BLOCK_SIZES {
            let op = if pair { "f16_pair" } else { "f16" };
            let name = format!("matvec_cols.{op}[{n_in}x{n_out},{n} tok]");
            emit(guard(&name, || {
                check_f16(gpu, rng, &name, (n_in, n_out, n, pair), false)
            }));
        }
    }
}

/// Runs `single` (a single-token kernel over n tokens, one grid row each) and then `cols` (its
/// column kernel over the same tokens), both writing `outs`, or their fast twins when `fast`; the
/// column kernel passes when every output has the single-token kernel's bits. Returns the
/// comparison and the single-token outputs (f32).
pub fn same_as_single(
    gpu: &Gpu,
    name: &str,
    (single, cols): (&Launch, &Launch),
    outs: &mut [&mut DeviceBuffer],
    fast: bool,
    note: String,
) -> HipResult<(CheckResult, Vec<f32>)> {
    let (single, cols) = match fast {
        true => (twin_of(single), twin_of(cols)),
        false => (single.clone(), cols.clone()),
    };
    assert!(
        cols.kernel.name.contains("_cols"),
        "{} is no column kernel",
        cols.kernel.name
    );
    let (want, got) = exact_then_twin(gpu, &single, &cols, outs)?;
    let flat = |o: Vec<Vec<u8>>| -> Vec<f32> { o.iter().flat_map(|b| f32s(b)).collect() };
    let want = flat(want);
    let note = format!("{note}: {} against {}", cols.kernel.name, single.kernel.name);
    Ok((same_bits(name, &flat(got), &want, note), want))
}

/// Both comparisons passed: the column kernel against the single-token kernel and that one against
/// the CPU reference (exact kernels).
fn both(mut cols: CheckResult, reference: CheckResult) -> CheckResult {
    if reference.verdict != Verdict::Pass {
        cols.verdict = Verdict::Fail;
    }
    cols.note = format!(
        "{}; single-token kernel vs CPU reference: {}",
        cols.note, reference.note
    );
    cols
}

pub fn check_q8_0(
    gpu: &Gpu,
    rng: &mut CheckRng,
    name: &str,
    (n_in, n_out, group, n): (usize, usize, usize, usize),
    fast: bool,
) -> Checked {
    let mut case = Q8ProjCase::new(gpu, rng, (n_in, n_out, group, n))?;
    let launches = (
        &kernels::matvec_q8_0(&case.proj, n as u32),
        &kernels::matvec_q8_0_cols(&case.proj, n as u32),
    );
    let (r, single) = same_as_single(gpu, name, launches, &mut [&mut case.y], fast, format!("{n} tokens"))?;
    Ok(match fast {
        true => r,
        false => both(r, same_bits(name, &single, &case.want(), String::new())),
    })
}

pub fn check_swiglu(
    gpu: &Gpu,
    rng: &mut CheckRng,
    name: &str,
    (n_in, n_ff, n): (usize, usize, usize),
    fast: bool,
) -> Checked {
    let mut case = Q8SwigluCase::new(gpu, rng, (n_in, n_ff, n), 7.0)?;
    let sw: Q8Swiglu = case.sw;
    let launches = (
        &kernels::matvec_q8_0_swiglu(&sw, n as u32),
        &kernels::matvec_q8_0_swiglu_cols(&sw, n as u32),
    );
    let note = format!("{n} tokens, clamp 7");
    let (r, single) = same_as_single(gpu, name, launches, &mut [&mut case.mid], fast, note)?;
    Ok(match fast {
        true => r,
        false => both(r, same_bits(name, &single, &case.want(), String::new())),
    })
}

/// F16 rows (one matrix, or the pair of two) with activation rows 4 floats longer than a row.
pub fn check_f16(
    gpu: &Gpu,
    rng: &mut CheckRng,
    name: &str,
    (n_in, n_out, n, pair): (usize, usize, usize, bool),
    fast: bool,
) -> Checked {
    let x_stride = n_in + 4;
    let mut case = F16ProjCase::new(gpu, rng, 1 + usize::from(pair), (n_in, n_out, n), x_stride)?;
    let launches = match pair {
        true => {
            let (y0, y1, w0, w1, x) = (
                case.ys[0].ptr().0,
                case.ys[1].ptr().0,
                case.ws[0].ptr().0,
                case.ws[1].ptr().0,
                case.x.ptr().0,
            );
            let (i, o, s, t) = (n_in as u32, n_out as u32, x_stride as u32, n as u32);
            (
                kernels::matvec_f16_pair(y0, y1, w0, w1, x, i, o, s, t),
                kernels::matvec_f16_pair_cols(y0, y1, w0, w1, x, i, o, s, t),
            )
        }
        false => (case.single(kernels::matvec_f16), case.single(kernels::matvec_f16_cols)),
    };
    let want = case.want();
    let mut outs: Vec<&mut DeviceBuffer> = case.ys.iter_mut().collect();
    let note = format!("{n} tokens, x stride {x_stride}");
    let (r, single) = same_as_single(gpu, name, (&launches.0, &launches.1), &mut outs, fast, note)?;
    Ok(match fast {
        true => r,
        false => both(r, same_bits(name, &single, &want, String::new())),
    })
}

/// A [`Q8Proj`] of the case's operands writing `y`.
pub fn proj_into(proj: &Q8Proj, y: &DeviceBuffer) -> Q8Proj {
    Q8Proj { y: y.ptr().0, ..*proj }
}
