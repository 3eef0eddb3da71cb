//! The routed experts against the CPU reference: the router (top-k with bias, hash), the decode expert
//! kernels and the grouped expert GEMMs (bitwise, every tile class), for each expert format.

use ds4_chat::backend::cpu::moe::top_k_desc;
use ds4_chat::backend::cpu::ops::softplus;
use ds4_chat::backend::cpu::quant::BlockQ8K;
use ds4_chat::backend::hip::kernels::{self, ExpertFormat, Launch};
use ds4_chat::backend::hip::runtime::{DeviceBuffer, HipResult};

use super::moe_case::*;
use super::support::*;

/// Every check of this file, with its shapes.
pub fn run(gpu: &Gpu, rng: &mut CheckRng, emit: Emit) {
    for (n_tok, gemm) in [(2usize, false), (45, true)] {
        let kind = if gemm { "moe_gemm" } else { "moe" };
        for fmt in ExpertFormat::ALL {
            let name = format!("kernel.{kind}_gate_up_{}[{n_tok} tok]", fmt_name(fmt));
            emit(guard(&name, || check_moe_gate_up(gpu, rng, &name, fmt, n_tok, gemm)));
            let name = format!("kernel.{kind}_down_{}[{n_tok} tok]", fmt_name(fmt));
            emit(guard(&name, || check_moe_down(gpu, rng, &name, fmt, n_tok, gemm)));
        }
    }
    for fmt in ExpertFormat::ALL.into_iter().filter(|_| !wave_rerun()) {
        let name = format!("kernel.moe_gemm_tile_classes_{}[bitwise vs 64-wide]", fmt_name(fmt));
        let r = guard(&name, || check_moe_gemm_tile_classes(gpu, rng, &name, fmt, &mut *emit));
        emit(r);
    }
    let router_name = |hash| format!("kernel.router[{}]", if hash { "hash" } else { "topk+bias" });
    each(gpu, rng, emit, [false, true], router_name, check_router);
}

const MOE_SHAPE: (usize, usize, usize, usize) = (768, 512, 8, 3); // n_in, n_ff, n_expert, n_used

/// Runs ds4_moe_group for `sel` (narrowest column class `min_cols`) and returns the tile buffers
/// (kept alive by the caller).
pub fn expert_tiles(
    gpu: &Gpu,
    sel: &DeviceBuffer,
    n_tok: usize,
    n_used: usize,
    n_expert: usize,
    min_cols: u32,
) -> HipResult<(kernels::ExpertTiles, [DeviceBuffer; 3])> {
    let max_tiles = kernels::moe_max_tiles(n_tok as u32, n_used as u32, n_expert as u32);
    let pairs = gpu.poisoned::<u32>(n_tok * n_used)?;
    let tiles = gpu.poisoned::<u32>((kernels::MOE_TILE_WORDS * max_tiles) as usize)?;
    let n_tiles = gpu.poisoned::<u32>(1)?;
    gpu.run(&kernels::moe_group(
        pairs.ptr().0,
        tiles.ptr().0,
        n_tiles.ptr().0,
        sel.ptr().0,
        n_tok as u32,
        n_used as u32,
        n_expert as u32,
        min_cols,
    ))?;
    let t = kernels::ExpertTiles {
        pairs: pairs.ptr().0,
        tiles: tiles.ptr().0,
        n_tiles: n_tiles.ptr().0,
        max_tiles,
    };
    Ok((t, [pairs, tiles, n_tiles]))
}

fn check_moe_gate_up(
    gpu: &Gpu,
    rng: &mut CheckRng,
    name: &str,
    fmt: ExpertFormat,
    n_tok: usize,
    gemm: bool,
) -> Checked {
    let (n_in, n_ff, n_expert, n_used) = MOE_SHAPE;
    let limit = 2.0f32; // small enough that some gate/up values clamp
    let case = GateUpCase::new(gpu, rng, fmt, MOE_SHAPE, (n_tok, limit, false))?;
    if gemm {
        let (tiles, _keep) = expert_tiles(gpu, case.sel(), n_tok, n_used, n_expert, kernels::MOE_MIN_COLS)?;
        gpu.run(&case.launch_gemm(tiles))?;
    } else {
        gpu.run(&case.launch())?;
    }
    let note = format!("{n_tok} tok, {n_used}/{n_expert} experts, {n_in}->{n_ff}, limit {limit}");
    same_bits_on(name, &case.mid, &case.want(), note)
}

fn check_moe_down(gpu: &Gpu, rng: &mut CheckRng, name: &str, fmt: ExpertFormat, n_tok: usize, gemm: bool) -> Checked {
    let (_, n_ff, n_expert, n_used) = MOE_SHAPE;
    let n_out = 203usize;
    let case = DownCase::new(gpu, rng, fmt, (n_ff, n_out, n_expert, n_used), (n_tok, false))?;
    if gemm {
        let (tiles, _keep) = expert_tiles(gpu, case.sel(), n_tok, n_used, n_expert, kernels::MOE_MIN_COLS)?;
        let outp = gpu.poisoned::<f32>(n_tok * n_used * n_out)?;
        gpu.run(&case.launch_gemm(&outp, tiles))?;
        let [out, outp] = [&case.out, &outp].map(|b| b.ptr().0);
        gpu.run(&kernels::moe_sum(out, outp, n_out as u32, n_used as u32, n_tok as u32))?;
    } else {
        gpu.run(&case.launch())?;
    }
    let note = format!("{n_tok} tok, {n_used}/{n_expert} experts, {n_ff}->{n_out}");
    same_bits_on(name, &case.out, &case.want(), note)
}

/// The expert grouping (`ds4_moe_group`) of a selection: pair ids by expert, and one tile
/// [expert, first pair, pairs, column class] per 64 pairs of an expert, the class being the narrowest
/// of [`kernels::MOE_TILE_COLS`] that holds the pairs and is at least `min_cols`.
fn expected_grouping(sel: &[u32], n_expert: usize, min_cols: u32) -> (Vec<u32>, Vec<[u32; 4]>) {
    let mut pairs = Vec::new();
    let mut tiles = Vec::new();
    for e in 0..n_expert as u32 {
        let mine: Vec<u32> = (0..sel.len() as u32).filter(|&p| sel[p as usize] == e).collect();
        for (i, part) in mine.chunks(64).enumerate() {
            let n = part.len() as u32;
            let cols = *kernels::MOE_TILE_COLS
                .iter()
                .find(|&&c| c >= min_cols && c >= n)
                .unwrap();
            tiles.push([e, (pairs.len() + 64 * i) as u32, n, cols]);
        }
        pairs.extend(mine);
    }
    (pairs, tiles)
}

/// The grouped expert GEMMs' case for pair counts per expert [`kernels::TILE_CLASS_COUNTS`] (partial,
/// full and several tiles per expert, an expert with none) and a row count (203) that ends inside a
/// tile: random expert weights, activations, mids and selection weights, on the host and the device.
pub struct TileClassCase {
    /// Tokens (the selection's pairs / `n_used`).
    pub n_tok: usize,
    fmt: ExpertFormat,
    n_expert: usize,
    sel: Vec<u32>,
    selw: Vec<f32>,
    gate_host: Vec<u8>,
    up_host: Vec<u8>,
    down_host: Vec<u8>,
    x_host: Vec<BlockQ8K>,
    mids_host: Vec<BlockQ8K>,
    /// Gate, up and down weights; selection and its weights.
    dev: [DeviceBuffer; 5],
    x: Q8kDevice,
    mids: Q8kDevice,
}

/// The tile-class case's n_in, n_ff, n_out, n_used and SwiGLU limit.
pub const TILE_CLASS_SHAPE: (usize, usize, usize, usize, f32) = (512, 512, 203, 2, 2.0);

impl TileClassCase {
    pub fn new(gpu: &Gpu, rng: &mut CheckRng, fmt: ExpertFormat) -> HipResult<TileClassCase> {
        let (n_in, n_ff, n_out, n_used, _) = TILE_CLASS_SHAPE;
        let n_expert = kernels::TILE_CLASS_COUNTS.len();
        let sel = kernels::selection_with_counts(&kernels::TILE_CLASS_COUNTS, rng.next_u64());
        let n_tok = sel.len() / n_used;
        let ty = fmt.ggml_type();
        let gate_host = random_weights(rng, ty, n_in, n_ff * n_expert);
        let up_host = random_weights(rng, ty, n_in, n_ff * n_expert);
        let down_host = random_weights(rng, ty, n_ff, n_out * n_expert);
        let x_host = q8k_blocks(&random_vec(rng, n_tok * n_in, 2.0));
        let mids_host = q8k_blocks(&random_vec(rng, n_tok * n_used * n_ff, 1.5));
        let selw: Vec<f32> = (0..sel.len()).map(|_| 0.2 + 0.5 * (rng.next_f32() + 1.0)).collect();
        let dev = [
            gpu.up(&gate_host)?,
            gpu.up(&up_host)?,
            gpu.up(&down_host)?,
            gpu.up(&sel)?,
            gpu.up(&selw)?,
        ];
        let (x, mids) = (gpu.up_q8k(&x_host)?, gpu.up_q8k(&mids_host)?);
        Ok(TileClassCase {
            fmt,
            n_tok,
            n_expert,
            sel,
            selw,
            gate_host,
            up_host,
            down_host,
            x_host,
            mids_host,
            dev,
            x,
            mids,
        })
    }

    /// The grouping of the selection with the narrowest column class `min_cols` ([`expert_tiles`]).
    pub fn tiles(&self, gpu: &Gpu, min_cols: u32) -> HipResult<(kernels::ExpertTiles, [DeviceBuffer; 3])> {
        expert_tiles(
            gpu,
            &self.dev[3],
            self.n_tok,
            TILE_CLASS_SHAPE.3,
            self.n_expert,
            min_cols,
        )
    }

    /// The grouped gate/up GEMM into `mid` (`n_tok * n_used * n_ff` f32).
    pub fn gate_up(&self, mid: &DeviceBuffer, tiles: kernels::ExpertTiles) -> Launch {
        let [gate, up, _, _, selw] = &self.dev;
        let (n_in, n_ff, _, n_used, limit) = TILE_CLASS_SHAPE;
        kernels::moe_gemm_gate_up(
            self.fmt,
            mid.ptr().0,
            gate.ptr().0,
            up.ptr().0,
            self.x.planes(),
            tiles,
            selw.ptr().0,
            n_in as u32,
            n_ff as u32,
            n_used as u32,
            limit,
        )
    }

    /// The grouped down GEMM of the mids into `outp` (`n_tok * n_used * n_out` f32).
    pub fn down(&self, outp: &DeviceBuffer, tiles: kernels::ExpertTiles) -> Launch {
        let (_, n_ff, n_out, n_used, _) = TILE_CLASS_SHAPE;
        kernels::moe_gemm_down(
            self.fmt,
            outp.ptr().0,
            self.dev[2].ptr().0,
            self.mids.planes(),
            tiles,
            n_ff as u32,
            n_out as u32,
            n_used as u32,
        )
    }
}

/// The grouped expert GEMMs in every column class (`min_cols` 64, 24 and the smallest) for pair
/// counts per expert [`kernels::TILE_CLASS_COUNTS`] (every class and its edges), a row count (203)
/// that ends inside a tile and two 256-row tall tiles: the grouping must equal the documented rule
/// exactly (`.grouping`), every class's outputs must be bitwise identical to the all-64-wide tiling
/// (each class accumulates every output over the same chunks in the same order, kernels/gemm.hip),
/// and the smallest classes' outputs equal the CPU reference dots bit for bit (`.vs_cpu`).
fn check_moe_gemm_tile_classes(gpu: &Gpu, rng: &mut CheckRng, name: &str, fmt: ExpertFormat, emit: Emit) -> Checked {
    let case = TileClassCase::new(gpu, rng, fmt)?;
    let (n_in, n_ff, n_out, n_used, limit) = TILE_CLASS_SHAPE;
    let (n_tok, n_expert, sel) = (case.n_tok, case.n_expert, &case.sel);
    let mut outputs: Vec<(Vec<f32>, Vec<f32>)> = Vec::new();
    let mut classes = Vec::new();
    let mut grouping_errors = Vec::new();
    for min_cols in [64, 24, kernels::MOE_MIN_COLS] {
        let (tiles, keep) = case.tiles(gpu, min_cols)?;
        let mid = gpu.poisoned::<f32>(n_tok * n_used * n_ff)?;
        let outp = gpu.poisoned::<f32>(n_tok * n_used * n_out)?;
        gpu.run(&case.gate_up(&mid, tiles))?;
        gpu.run(&case.down(&outp, tiles))?;
        let n_tiles = keep[2].to_vec::<u32>()?[0] as usize;
        let words = keep[1].to_vec::<u32>()?;
        let got_tiles: Vec<[u32; 4]> = words
            .chunks(4)
            .take(n_tiles)
            .map(|t| [t[0], t[1], t[2], t[3]])
            .collect();
        let (want_pairs, want_tiles) = expected_grouping(sel, n_expert, min_cols);
        if keep[0].to_vec::<u32>()? != want_pairs || got_tiles != want_tiles {
            grouping_errors.push(min_cols);
        }
        classes = got_tiles.iter().map(|t| t[3]).collect();
        outputs.push((mid.to_vec::<f32>()?, outp.to_vec::<f32>()?));
    }
    emit(CheckResult::measured(
        &format!("{name}.grouping"),
        grouping_errors.len() as f64,
        0.0,
        0.0,
        grouping_errors.is_empty(),
        format!("pairs and tiles differ from the rule for min_cols {grouping_errors:?}"),
    ));
    // The smallest classes against the CPU reference dots.
    let want_mid = ref_gate_up(
        fmt,
        &case.gate_host,
        &case.up_host,
        &case.x_host,
        sel,
        &case.selw,
        (n_in, n_ff, n_used),
        limit,
    );
    let want_outp = ref_down(fmt, &case.down_host, &case.mids_host, sel, (n_ff, n_out));
    let (mid_small, outp_small) = &outputs[outputs.len() - 1];
    let vs_cpu = same_bits(
        &format!("{name}.vs_cpu"),
        &[mid_small.as_slice(), outp_small.as_slice()].concat(),
        &[want_mid, want_outp].concat(),
        format!("min_cols {}", kernels::MOE_MIN_COLS),
    );
    emit(vs_cpu);
    let (mid64, outp64) = &outputs[0];
    let all64 = [mid64.as_slice(), outp64.as_slice()].concat();
    let differ = outputs[1..]
        .iter()
        .map(|(m, o)| [m.as_slice(), o.as_slice()].concat())
        .filter(|v| v.iter().zip(&all64).any(|(a, b)| a.to_bits() != b.to_bits()))
        .count();
    let all_classes = kernels::MOE_TILE_COLS.iter().all(|c| classes.contains(c));
    Ok(count_differ(
        name,
        differ,
        all_classes,
        format!(
            "{differ} of 2 narrower tilings differ from all-64 in bits; {n_tok} tok x {n_used}, pairs per expert {:?}, tile classes {classes:?}{}",
            kernels::TILE_CLASS_COUNTS,
            if all_classes {
                ""
            } else {
                "; the grouping did not use every column class"
            }
        ),
    ))
}

/// Router: top-k of sqrt(softplus(logit)) + bias, or hash-table experts; weights are
/// the unbiased probs normalised by their sum and scaled. Ids and weights must match exactly, for
/// the exact kernel and for its fast twin (one warp a token: the same selection and sums).
fn check_router(gpu: &Gpu, rng: &mut CheckRng, name: &str, hash: bool) -> Checked {
    let (n_expert, n_used, n_tok, scale) = (256usize, 6usize, 3usize, 1.5f32);
    let mut logits = random_vec(rng, n_tok * n_expert, 4.0);
    logits[5] = logits[9]; // a tie
    logits[1] = 25.0; // both softplus branches
    logits[2] = -25.0;
    let bias = random_vec(rng, n_expert, 0.05);
    let tokens: Vec<u32> = (0..n_tok).map(|_| rng.int_in(0, 99) as u32).collect();
    let table: Vec<u32> = (0..100 * n_used)
        .map(|_| rng.int_in(0, n_expert as i64 - 1) as u32)
        .collect();
    let (l_d, b_d, t_d, tab_d) = (gpu.up(&logits)?, gpu.up(&bias)?, gpu.up(&tokens)?, gpu.up(&table)?);
    let mut sel = gpu.poisoned::<u32>(n_tok * n_used)?;
    let mut selw = gpu.poisoned::<f32>(n_tok * n_used)?;
    let exact = kernels::router(
        sel.ptr().0,
        selw.ptr().0,
        l_d.ptr().0,
        if hash { kernels::NULL } else { b_d.ptr().0 },
        if hash { tab_d.ptr().0 } else { kernels::NULL },
        t_d.ptr().0,
        n_expert as u32,
        n_used as u32,
        scale,
        n_tok as u32,
    );
    gpu.run(&exact)?;
    let (got_sel, got_w) = (sel.to_vec::<u32>()?, selw.to_vec::<f32>()?);
    gpu.repoison([&mut sel, &mut selw])?;
    gpu.run(&kernels::fast_twin(&exact).expect("the router's fast twin"))?;
    let (fast_sel, fast_w) = (sel.to_vec::<u32>()?, selw.to_vec::<f32>()?);
    let mut want_sel = Vec::new();
    let mut want_w = Vec::new();
    for t in 0..n_tok {
        let probs: Vec<f32> = logits[t * n_expert..(t + 1) * n_expert]
            .iter()
            .map(|&z| softplus(z).sqrt())
            .collect();
        let ids: Vec<usize> = if hash {
            table[tokens[t] as usize * n_used..(tokens[t] as usize + 1) * n_used]
                .iter()
                .map(|&e| e as usize)
                .collect()
        } else {
            let biased: Vec<f32> = probs.iter().zip(&bias).map(|(p, b)| p + b).collect();
            let mut idx = vec![0usize; n_used];
            top_k_desc(&biased, n_used, &mut idx);
            idx
        };
        // The CPU engine's grouping (backend/cpu/moe.rs): pairwise for 6 experts, w·scale·(1/sum),
        // the sum floored at 2^-14.
        let w: Vec<f32> = ids.iter().map(|&e| probs[e]).collect();
        let sum = ((w[0] + w[1]) + (w[2] + w[3])) + (w[4] + w[5]);
        let inv = 1.0 / sum.max(2f32.powi(-14));
        want_sel.extend(ids.iter().map(|&e| e as u32));
        want_w.extend(w.iter().map(|&p| p * scale * inv));
    }
    let mut r = same_bits(name, &got_w, &want_w, format!("{n_tok} tok, {n_used}/{n_expert}"));
    if got_sel != want_sel {
        r.verdict = Verdict::Fail;
        r.note = format!("expert ids differ: gpu {got_sel:?} cpu {want_sel:?}");
    }
    let fast = same_bits(name, &fast_w, &want_w, String::new());
    if fast_sel != want_sel || fast.verdict != Verdict::Pass {
        r.verdict = Verdict::Fail;
        r.note = format!("fast twin differs: ids {fast_sel:?}, weights: {}", fast.note);
    } else {
        r.note += "; the fast twin's ids and weights too";
    }
    Ok(r)
}
