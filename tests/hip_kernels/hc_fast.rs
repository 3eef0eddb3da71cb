//! The fast twins of the hyper-connection, norm and row steps of decode (kernels/hc_fast.hip,
//! norm_quant_fast.hip, rows_fast.hip) against their exact kernels on the same random inputs, in
//! the Flash model's shapes (n_embd 4096, n_hc 4, 64 heads of 512) and odd sizes. Each twin writes
//! its own set of output buffers. Floats: within FAST_TOL × max|exact| (f32 trees instead of the
//! exact f64 or sequential sums: a few ulps of the largest partial sums). Quantized codes: a code may
//! differ only by one step and only where the exact kernel's scaled value lies within TIE_GAP of a
//! rounding midpoint (the fast value crossed it); those ties are counted in the report.

use ds4_chat::backend::cpu::ops::Rope;
use ds4_chat::backend::hip::kernels::{self, Launch, NQ_NORM, NULL, QuantOut};
use ds4_chat::backend::hip::runtime::{DeviceBuffer, DeviceCopy, HipResult};
use ds4_chat::gguf::half::f32_to_f16;
use ds4_chat::model::hparams::HParams;

use super::support::*;

/// The HC split against the exact one: its mix logits are 16,384-term F16 dots (Flash) summed in
/// another order, whose absolute difference the softmax and 20 Sinkhorn passes turn into about the
/// same relative difference of every split entry; 1e-5 of max|split| (2) leaves no margin for that.
pub const SPLIT_TOL: f64 = 1e-4;
/// A differing code is a tie when the exact value / scale lies this close to k + 1/2 (the fast value
/// differs by ~1e-6 relative, so by < 2e-4 in code units).
const TIE_GAP: f64 = 1e-3;

/// Every check of this file.
pub fn run(gpu: &Gpu, rng: &mut CheckRng, emit: Emit) {
    let all = Want {
        out: true,
        q8_0: true,
        q8_k: true,
    };
    // (n, rows, x_stride, norm, weights, outputs)
    let norm_cases = [
        (4096usize, 1usize, 4096usize, true, true, all),
        (4096, 2, 4096, true, true, Want::q8_0_only()),
        (1024, 3, 1536, true, true, all),
        (512, 64, 512, false, false, all),
        (8192, 1, 8192, true, false, all),
        (520, 3, 524, true, true, Want::out_only()),
        (256, 5, 256, false, true, all),
    ];
    for (n, rows, stride, norm, weighted, want) in norm_cases {
        let name = format!("hc_fast.rms_norm_quant[{n}x{rows},stride {stride},norm {norm},w {weighted}]");
        emit(guard(&name, || {
            check_rms_norm_quant(gpu, rng, &name, (n, rows, stride), norm, weighted, want)
        }));
    }
    // (n_embd, n_hc, n_tok, outputs)
    let pre_cases = [
        (4096usize, 4usize, 1usize, Want::q8_0_only()),
        (4096, 4, 2, all),
        (1000, 3, 2, Want::out_only()),
        (512, 2, 3, all),
        (256, 1, 1, all),
    ];
    for (n_embd, n_hc, n_tok, want) in pre_cases {
        let name = format!("hc_fast.hc_pre_fused[{n_embd}x{n_hc},{n_tok} tok]");
        emit(guard(&name, || {
            check_hc_pre_fused(gpu, rng, &name, (n_embd, n_hc, n_tok), want)
        }));
    }
    for (n_embd, n_hc, n_tok, with_y2, in_place) in [
        (4096usize, 4usize, 1usize, true, true),
        (4096, 4, 2, false, false),
        (1000, 3, 2, true, false),
        (70, 2, 1, false, true),
    ] {
        let name = format!("hc_fast.hc_post[{n_embd}x{n_hc},{n_tok} tok,y2 {with_y2},in place {in_place}]");
        emit(guard(&name, || {
            check_hc_post(gpu, rng, &name, (n_embd, n_hc, n_tok), with_y2, in_place)
        }));
    }
    // (n_embd, n_hc, n_tok, with_y2, outputs, the post in place)
    for (n_embd, n_hc, n_tok, with_y2, want, in_place) in [
        (4096usize, 4usize, 1usize, true, all, true),
        (4096, 4, 1, true, all, false),
        (4096, 4, 1, false, Want::q8_0_only(), true),
        (1000, 3, 2, true, Want::out_only(), false),
    ] {
        let name = format!("hc_fast.hc_post_pre[{n_embd}x{n_hc},{n_tok} tok,y2 {with_y2},in place {in_place}]");
        emit(guard(&name, || {
            check_hc_post_pre(gpu, rng, &name, (n_embd, n_hc, n_tok), with_y2, want, in_place)
        }));
    }
    // (n_embd, n_hc, n_tok, post: None = pre alone, Some(with_y2), outputs, the post in place)
    for (n_embd, n_hc, n_tok, post, want, in_place) in [
        (4096usize, 4usize, 3usize, None, all, true),
        (4096, 4, 9, Some(true), all, true),
        (4096, 4, 4, Some(true), all, false),
        (1000, 3, 2, Some(false), Want::out_only(), false),
        (512, 2, 5, None, Want::q8_0_only(), true),
        (256, 1, 1, Some(true), all, true),
    ] {
        let name = format!("hc_fast.hc_token_blocks[{n_embd}x{n_hc},{n_tok} tok,post {post:?},in place {in_place}]");
        emit(guard(&name, || {
            check_hc_token_blocks(gpu, rng, &name, (n_embd, n_hc, n_tok), post, want, in_place)
        }));
    }
    use kernels::row_flags as rf;
    let hp = HParams::flash();
    let (d, yarn) = (hp.head_dim, true);
    let rows_cases = [
        ("q", hp.n_head, d, 1, 1000, rf::NORM | rf::ROPE, !yarn),
        ("q 2 tok", 3, d, 2, 70_000, rf::NORM | rf::ROPE, yarn),
        ("out", hp.n_head, d, 1, 77, rf::ROPE | rf::ROPE_INVERSE, !yarn),
        (
            "kv",
            1,
            d,
            3,
            300,
            rf::NORM | rf::ROPE | rf::E4M3 | rf::STORE_RING,
            yarn,
        ),
        (
            "comp",
            1,
            d,
            2,
            4100,
            rf::NORM | rf::ROPE | rf::E4M3 | rf::ROUND_F16,
            yarn,
        ),
        ("odd", 3, 200, 2, 5, rf::NORM | rf::ROPE | rf::E4M3, !yarn),
        ("1024", 2, 1024, 1, 9, rf::NORM | rf::ROPE, !yarn),
        // The indexer's query heads and (as token rows) its compressed rows: the Hadamard twin.
        (
            "idx q",
            hp.idx_n_head,
            hp.idx_head_dim,
            1,
            3000,
            rf::ROPE | rf::HADAMARD_FP4,
            yarn,
        ),
        (
            "idx q 3 tok",
            5,
            hp.idx_head_dim,
            3,
            8,
            rf::ROPE | rf::HADAMARD_FP4,
            yarn,
        ),
        (
            "idx comp",
            1,
            hp.idx_head_dim,
            2,
            4100,
            rf::NORM | rf::ROPE | rf::HADAMARD_FP4 | rf::ROUND_F16,
            yarn,
        ),
    ];
    for (label, n_head, head_dim, n_tok, pos0, flags, yarn) in rows_cases {
        let name = format!("hc_fast.rows_finish[{label}: {n_head}x{head_dim},{n_tok} tok,pos {pos0}]");
        let shape = RowsShape {
            n_head,
            head_dim,
            n_tok,
            pos0,
        };
        emit(guard(&name, || check_rows_finish(gpu, rng, &name, shape, flags, yarn)));
    }
    for n_tok in [1usize, 3] {
        let name = format!("hc_fast.rows_finish_pair[q heads + kv,{n_tok} tok]");
        emit(guard(&name, || check_rows_finish_pair(gpu, rng, &name, n_tok)));
    }
}

/// Which outputs of the norm/quantize kernels a check asks for.
#[derive(Clone, Copy)]
struct Want {
    out: bool,
    q8_0: bool,
    q8_k: bool,
}

impl Want {
    fn q8_0_only() -> Want {
        Want {
            out: false,
            q8_0: true,
            q8_k: false,
        }
    }
    /// The same outputs and the f32 row (the exact runs: the tie check reads the exact values).
    fn with_out(self) -> Want {
        Want { out: true, ..self }
    }
    fn out_only() -> Want {
        Want {
            out: true,
            q8_0: false,
            q8_k: false,
        }
    }
}

/// The output planes of one run of a norm/quantize kernel (absent = not asked for).
struct QuantBufs {
    bufs: [Option<DeviceBuffer>; 6],
}

/// The planes read back.
struct QuantHost {
    out: Vec<f32>,
    q0_q: Vec<i8>,
    q0_d: Vec<f32>,
    qk_q: Vec<i8>,
    qk_d: Vec<f32>,
    qk_bs: Vec<i16>,
}

impl QuantBufs {
    fn new(gpu: &Gpu, rows: usize, n: usize, want: Want) -> HipResult<QuantBufs> {
        let m = rows * n;
        let some = |on: bool, b: HipResult<DeviceBuffer>| if on { b.map(Some) } else { Ok(None) };
        Ok(QuantBufs {
            bufs: [
                some(want.out, gpu.poisoned::<f32>(m))?,
                some(want.q8_0, gpu.poisoned::<i8>(m))?,
                some(want.q8_0, gpu.poisoned::<f32>(m / 32))?,
                some(want.q8_k, gpu.poisoned::<i8>(m))?,
                some(want.q8_k, gpu.poisoned::<f32>(m / 256))?,
                some(want.q8_k, gpu.poisoned::<i16>(m / 16))?,
            ],
        })
    }

    fn outs(&self) -> QuantOut {
        let p = |i: usize| self.bufs[i].as_ref().map_or(NULL, |b| b.ptr().0);
        QuantOut {
            out: p(0),
            q8_0_q: p(1),
            q8_0_d: p(2),
            q8_k_q: p(3),
            q8_k_d: p(4),
            q8_k_bs: p(5),
        }
    }

    fn read(&self) -> HipResult<QuantHost> {
        Ok(QuantHost {
            out: read_opt(&self.bufs[0])?,
            q0_q: read_opt(&self.bufs[1])?,
            q0_d: read_opt(&self.bufs[2])?,
            qk_q: read_opt(&self.bufs[3])?,
            qk_d: read_opt(&self.bufs[4])?,
            qk_bs: read_opt(&self.bufs[5])?,
        })
    }
}

fn read_opt<T: DeviceCopy + Default + Clone>(b: &Option<DeviceBuffer>) -> HipResult<Vec<T>> {
    b.as_ref().map_or(Ok(Vec::new()), |b| b.to_vec::<T>())
}

/// Codes of blocks of `block` elements: the fast code may differ from the exact one only by one step
/// at a tie of the exact value `x` (x / d within TIE_GAP of k + 1/2). A block whose maximum element
/// changed sign between the runs (the Q8_K scale is signed) compares the negated codes. Returns
/// (pass, differing codes, ties).
fn codes_at_ties(
    fast: &[i8],
    exact: &[i8],
    d_fast: &[f32],
    d_exact: &[f32],
    x: &[f32],
    block: usize,
) -> (bool, usize, usize) {
    let (mut ok, mut differ, mut ties) = (fast.len() == exact.len(), 0, 0);
    for (i, (&f, &e)) in fast.iter().zip(exact).enumerate() {
        let b = i / block;
        let flip = d_fast[b].is_sign_negative() != d_exact[b].is_sign_negative() && d_exact[b] != 0.0;
        let f = if flip { -(f as i32) } else { f as i32 };
        if f == e as i32 {
            continue;
        }
        differ += 1;
        let tie = x.get(i).is_some_and(|&v| {
            let t = (v as f64 / d_exact[b] as f64).abs();
            ((t - t.floor()) - 0.5).abs() <= TIE_GAP
        });
        // Without the f32 output no exact value is known: one step is all that can be checked.
        ok &= (f - e as i32).abs() <= 1 && (tie || x.is_empty());
        ties += usize::from(tie);
    }
    (ok, differ, ties)
}

/// One result for all planes of a norm/quantize output: floats within FAST_TOL, codes at ties only,
/// Q8_K block sums the sums of the fast codes.
fn compare_quant(name: &str, fast: &QuantHost, exact: &QuantHost, note: String) -> CheckResult {
    let exact_out: &[f32] = if fast.out.is_empty() { &[] } else { &exact.out };
    let mut r = close_scaled(name, &fast.out, exact_out, FAST_TOL, note);
    let mut fail = |why: String| {
        r.verdict = Verdict::Fail;
        r.note += &format!("; {why}");
    };
    let mut notes = Vec::new();
    for (q, d, plane, block) in [
        ((&fast.q0_q, &exact.q0_q), (&fast.q0_d, &exact.q0_d), "q8_0", 32),
        ((&fast.qk_q, &exact.qk_q), (&fast.qk_d, &exact.qk_d), "q8_k", 256),
    ] {
        if q.1.is_empty() {
            continue;
        }
        let (abs_f, abs_e): (Vec<f32>, Vec<f32>) = (
            d.0.iter().map(|v| v.abs()).collect(),
            d.1.iter().map(|v| v.abs()).collect(),
        );
        if close_scaled("", &abs_f, &abs_e, FAST_TOL, String::new()).verdict != Verdict::Pass {
            fail(format!("{plane} scales differ beyond {FAST_TOL:e}"));
        }
        let (ok, differ, ties) = codes_at_ties(q.0, q.1, d.0, d.1, &exact.out, block);
        if !ok {
            fail(format!("{plane}: {differ} codes differ, only {ties} at ties"));
        }
        notes.push(format!("{plane} {differ} of {} codes differ ({ties} ties)", q.1.len()));
    }
    if !exact.qk_bs.is_empty() {
        let sums_ok = fast
            .qk_bs
            .iter()
            .zip(fast.qk_q.chunks_exact(16))
            .all(|(&s, c)| s as i32 == c.iter().map(|&v| v as i32).sum::<i32>());
        if !sums_ok || fast.qk_bs.len() != exact.qk_bs.len() {
            fail("q8_k block sums are not the sums of the codes".into());
        }
    }
    if !notes.is_empty() {
        r.note += &format!("; {}", notes.join(", "));
    }
    r
}

fn check_rms_norm_quant(
    gpu: &Gpu,
    rng: &mut CheckRng,
    name: &str,
    (n, rows, stride): (usize, usize, usize),
    norm: bool,
    weighted: bool,
    want: Want,
) -> Checked {
    let x = random_vec(rng, rows * stride, 3.0);
    let w: Vec<f32> = (0..n).map(|_| 1.0 + 0.3 * rng.next_f32()).collect();
    let (x_d, w_d) = (gpu.up(&x)?, gpu.up(&w)?);
    let (exact_out, fast_out) = (
        QuantBufs::new(gpu, rows, n, want.with_out())?,
        QuantBufs::new(gpu, rows, n, want)?,
    );
    let flags = if norm { NQ_NORM } else { 0 };
    let w_ptr = if weighted { w_d.ptr().0 } else { NULL };
    let launch = |o: &QuantBufs| {
        kernels::rms_norm_quant(
            o.outs(),
            x_d.ptr().0,
            w_ptr,
            n as u32,
            stride as u32,
            rows as u32,
            flags,
            1e-6,
        )
    };
    gpu.run(&launch(&exact_out))?;
    gpu.run(&twin_of(&launch(&fast_out)))?;
    Ok(compare_quant(
        name,
        &fast_out.read()?,
        &exact_out.read()?,
        format!("{rows} rows"),
    ))
}

/// The fused HC pre step, launched twice on each kernel (the per-token counters reset themselves, as
/// the decode graph replays it): the repeat must give the same bits.
fn check_hc_pre_fused(
    gpu: &Gpu,
    rng: &mut CheckRng,
    name: &str,
    (n_embd, n_hc, n_tok): (usize, usize, usize),
    want: Want,
) -> Checked {
    let iters = 20;
    let n_mix = 2 * n_hc + n_hc * n_hc;
    let inputs = HcPreInputs::new(gpu, rng, (n_embd, n_hc, n_tok))?;
    let hc_d = gpu.up(&inputs.hc)?;
    // One set of outputs, mix scratch and counters per kernel.
    let set = |want: Want| -> HipResult<_> {
        Ok((
            gpu.poisoned::<f32>(n_tok * n_mix)?,
            gpu.poisoned::<f32>(n_tok * n_mix)?,
            gpu.up(&vec![0u32; n_tok])?,
            QuantBufs::new(gpu, n_tok, n_embd, want)?,
        ))
    };
    let (exact_set, fast_set) = (set(want.with_out())?, set(want)?);
    let launch = |(split, mix, counter, o): &(DeviceBuffer, DeviceBuffer, DeviceBuffer, QuantBufs)| {
        inputs.launch(&hc_d, split, o.outs(), [mix, counter], (n_embd, n_hc, n_tok))
    };
    let (exact, fast) = (launch(&exact_set), twin_of(&launch(&fast_set)));
    let mut runs = Vec::new();
    for _ in 0..2 {
        gpu.run(&exact)?;
        gpu.run(&fast)?;
        runs.push((
            exact_set.0.to_vec::<f32>()?,
            fast_set.0.to_vec::<f32>()?,
            fast_set.3.read()?.out,
        ));
    }
    let repeat_ok = runs[0].1 == runs[1].1 && runs[0].2 == runs[1].2;
    let (split_exact, split_fast) = (&runs[1].0, &runs[1].1);
    let split = close_scaled("", split_fast, split_exact, SPLIT_TOL, String::new());
    let mut r = compare_quant(
        name,
        &fast_set.3.read()?,
        &exact_set.3.read()?,
        format!(
            "split max diff {:.2e} (scale {:.2e}, tol {SPLIT_TOL:e}), {iters} Sinkhorn iterations; repeat identical: {repeat_ok}",
            split.max_abs,
            split_exact.iter().fold(0f32, |m, v| m.max(v.abs()))
        ),
    );
    if !repeat_ok || split.verdict != Verdict::Pass {
        r.verdict = Verdict::Fail;
    }
    Ok(r)
}

/// The inputs of an HC pre step: state, fn, scale, base, norm weights.
struct HcPreInputs {
    hc: Vec<f32>,
    dev: [DeviceBuffer; 4],
}

impl HcPreInputs {
    fn new(gpu: &Gpu, rng: &mut CheckRng, (n_embd, n_hc, n_tok): (usize, usize, usize)) -> HipResult<HcPreInputs> {
        let n_in = n_hc * n_embd;
        let n_mix = 2 * n_hc + n_hc * n_hc;
        let hc = random_vec(rng, n_tok * n_in, 2.0);
        // The mix logits of the model are O(1): F16 weights of about 3 / sqrt(n_in) (not the ±1 of
        // random_weights, whose ±100 logits saturate every sigmoid and softmax).
        let amp = 3.0 / (n_in as f32).sqrt();
        let fn_w: Vec<u16> = random_vec(rng, n_in * n_mix, amp).into_iter().map(f32_to_f16).collect();
        let scale: Vec<f32> = (0..3).map(|_| 0.5 + 0.5 * (rng.next_f32() + 1.0)).collect();
        let base = random_vec(rng, n_mix, 0.5);
        let norm_w: Vec<f32> = (0..n_embd).map(|_| 1.0 + 0.2 * rng.next_f32()).collect();
        Ok(HcPreInputs {
            hc,
            dev: [gpu.up(&fn_w)?, gpu.up(&scale)?, gpu.up(&base)?, gpu.up(&norm_w)?],
        })
    }

    /// `ds4_hc_pre_fused` on the state at `hc` into `split`, `o`, with its `mix` and `counter`.
    fn launch(
        &self,
        hc: &DeviceBuffer,
        split: &DeviceBuffer,
        o: QuantOut,
        mix_counter: [&DeviceBuffer; 2],
        shape: (usize, usize, usize),
    ) -> Launch {
        let [fn_w, scale, base, norm_w] = &self.dev;
        let eps = kernels::HcEps {
            rms: 1e-6,
            hc: 1e-6,
            norm: 1e-6,
        };
        super::hc::hc_pre_fused_on(split, o, mix_counter, [hc, fn_w, scale, base, norm_w], shape, 20, eps)
    }
}

/// Random inputs of an HC post followed by an HC pre on the same state (y, y2, the post's split).
struct HcPostPreCase {
    shape: (usize, usize, usize),
    inputs: HcPreInputs,
    post: [DeviceBuffer; 3],
}

impl HcPostPreCase {
    fn new(gpu: &Gpu, rng: &mut CheckRng, shape: (usize, usize, usize)) -> HipResult<HcPostPreCase> {
        let (n_embd, n_hc, n_tok) = shape;
        let n_mix = 2 * n_hc + n_hc * n_hc;
        let inputs = HcPreInputs::new(gpu, rng, shape)?;
        let y = random_vec(rng, n_tok * n_embd, 1.0);
        let y2 = random_vec(rng, n_tok * n_embd, 1.0);
        let post_split: Vec<f32> = (0..n_tok * n_mix).map(|_| 0.5 * (rng.next_f32() + 1.0)).collect();
        Ok(HcPostPreCase {
            shape,
            inputs,
            post: [gpu.up(&y)?, gpu.up(&y2)?, gpu.up(&post_split)?],
        })
    }

    /// On fresh state and output buffers, `issue` runs the exact launches of the HC post (in place,
    /// or to a second state buffer the pre then reads; y2 only `with_y2`) and HC pre, its own way;
    /// returns the bytes of every output: the state (both buffers), the split, the mix logits, the
    /// normed input and its planes.
    fn outputs(
        &self,
        gpu: &Gpu,
        (with_y2, in_place): (bool, bool),
        want: Want,
        issue: impl Fn(&Launch, &Launch) -> HipResult<()>,
    ) -> HipResult<Vec<u8>> {
        let (n_embd, n_hc, n_tok) = self.shape;
        let n_mix = 2 * n_hc + n_hc * n_hc;
        let [y, y2, post_split] = &self.post;
        let hc_in = gpu.up(&self.inputs.hc)?;
        let out_buf = gpu.poisoned::<f32>(self.inputs.hc.len())?;
        let hc = if in_place { &hc_in } else { &out_buf };
        let split = gpu.poisoned::<f32>(n_tok * n_mix)?;
        let (mix, counter) = (gpu.poisoned::<f32>(n_tok * n_mix)?, gpu.up(&vec![0u32; n_tok])?);
        let o = QuantBufs::new(gpu, n_tok, n_embd, want)?;
        let post = kernels::hc_post(
            hc.ptr().0,
            hc_in.ptr().0,
            y.ptr().0,
            if with_y2 { y2.ptr().0 } else { NULL },
            post_split.ptr().0,
            n_embd as u32,
            n_hc as u32,
            n_tok as u32,
        );
        let pre = self.inputs.launch(hc, &split, o.outs(), [&mix, &counter], self.shape);
        issue(&post, &pre)?;
        let mut bytes = hc_in.to_vec::<u8>()?;
        if !in_place {
            bytes.extend(out_buf.to_vec::<u8>()?);
        }
        bytes.extend(split.to_vec::<u8>()?);
        bytes.extend(mix.to_vec::<u8>()?);
        for b in o.bufs.iter().flatten() {
            bytes.extend(b.to_vec::<u8>()?);
        }
        Ok(bytes)
    }
}

/// Two runs' output bytes must be equal: a count_differ result naming what the runs were.
fn same_bytes(name: &str, runs: [Vec<u8>; 2], what: &str) -> CheckResult {
    let differ = runs[0].iter().zip(&runs[1]).filter(|(a, b)| a != b).count();
    count_differ(
        name,
        differ,
        runs[0].len() == runs[1].len(),
        format!("{differ} of {} output bytes differ {what}", runs[0].len()),
    )
}

/// The fused HC post + HC pre (`kernels::fused_hc_post_pre`) against the two fast twins launched one
/// after the other: the same bits in every output.
fn check_hc_post_pre(
    gpu: &Gpu,
    rng: &mut CheckRng,
    name: &str,
    shape: (usize, usize, usize),
    with_y2: bool,
    want: Want,
    in_place: bool,
) -> Checked {
    let case = HcPostPreCase::new(gpu, rng, shape)?;
    let apart = case.outputs(gpu, (with_y2, in_place), want, |post, pre| {
        gpu.run(&twin_of(post))?;
        gpu.run(&twin_of(pre))
    })?;
    let fused = case.outputs(gpu, (with_y2, in_place), want, |post, pre| {
        gpu.run(&kernels::fused_hc_post_pre(post, pre).expect("a fused launch for these shapes"))
    })?;
    Ok(same_bytes(
        name,
        [apart, fused],
        "from hc_post_fast + hc_pre_fused_fast",
    ))
}

/// The one-block-per-token HC pre steps (`kernels::hc_layout`, `*_token_fast`) against the
/// block-per-mix-row ones on the same inputs (`post`: None = the HC pre alone, else fused with an HC
/// post, with or without y2): the same bits in every output.
fn check_hc_token_blocks(
    gpu: &Gpu,
    rng: &mut CheckRng,
    name: &str,
    shape: (usize, usize, usize),
    post: Option<bool>,
    want: Want,
    in_place: bool,
) -> Checked {
    let case = HcPostPreCase::new(gpu, rng, shape)?;
    let run = |per_token: bool| {
        case.outputs(gpu, (post.unwrap_or(false), in_place), want, |post_l, pre| {
            let fast = match post {
                None => twin_of(pre),
                Some(_) => kernels::fused_hc_post_pre(post_l, pre).expect("a fused launch for these shapes"),
            };
            gpu.run(&kernels::hc_layout(fast, per_token))
        })
    };
    Ok(same_bytes(
        name,
        [run(false)?, run(true)?],
        "between a block per token and a block per mix row",
    ))
}

fn check_hc_post(
    gpu: &Gpu,
    rng: &mut CheckRng,
    name: &str,
    (n_embd, n_hc, n_tok): (usize, usize, usize),
    with_y2: bool,
    in_place: bool,
) -> Checked {
    let n_mix = 2 * n_hc + n_hc * n_hc;
    let hc = random_vec(rng, n_tok * n_hc * n_embd, 2.0);
    let y = random_vec(rng, n_tok * n_embd, 1.0);
    let y2 = random_vec(rng, n_tok * n_embd, 1.0);
    let split: Vec<f32> = (0..n_tok * n_mix).map(|_| 0.5 * (rng.next_f32() + 1.0)).collect();
    let (y_d, y2_d, sp_d) = (gpu.up(&y)?, gpu.up(&y2)?, gpu.up(&split)?);
    let y2_ptr = if with_y2 { y2_d.ptr().0 } else { NULL };
    let mut got = Vec::new();
    for fast in [false, true] {
        let hc_in = gpu.up(&hc)?;
        let out = if in_place {
            None
        } else {
            Some(gpu.poisoned::<f32>(hc.len())?)
        };
        let out_ptr = out.as_ref().map_or(hc_in.ptr().0, |b| b.ptr().0);
        let l = kernels::hc_post(
            out_ptr,
            hc_in.ptr().0,
            y_d.ptr().0,
            y2_ptr,
            sp_d.ptr().0,
            n_embd as u32,
            n_hc as u32,
            n_tok as u32,
        );
        gpu.run(&if fast { twin_of(&l) } else { l })?;
        got.push(out.as_ref().unwrap_or(&hc_in).to_vec::<f32>()?);
    }
    Ok(close_scaled(name, &got[1], &got[0], FAST_TOL, format!("{n_tok} tok")))
}

#[derive(Clone, Copy)]
struct RowsShape {
    n_head: usize,
    head_dim: usize,
    n_tok: usize,
    pos0: usize,
}

/// `ds4_rows_finish` (token rows; the ring store with STORE_RING) and its fast twin on copies of
/// the same rows: the rows and the ring within FAST_TOL. With the E4M3 or f16 rounding flags, the
/// rows before rounding (the same launch without them) are held to FAST_TOL, and a rounded element
/// may then differ where its value crossed a rounding midpoint: by at most one step of the format
/// (|v| / 8 for E4M3, whose block scale may also have moved to the next power of two with its
/// maximum, |v| / 1024 for f16), counted in the report. The Hadamard/FP4 rows' twin
/// (`ds4_rows_finish_hadamard_fast`) must give the exact kernel's bits.
fn check_rows_finish(gpu: &Gpu, rng: &mut CheckRng, name: &str, sh: RowsShape, flags: u32, yarn: bool) -> Checked {
    use kernels::row_flags as rf;
    let hp = HParams::flash();
    let ring_cap = 256usize;
    let n = sh.n_tok * sh.n_head * sh.head_dim;
    let x = random_vec(rng, n, 3.0);
    let w: Vec<f32> = (0..sh.head_dim).map(|_| 1.0 + 0.3 * rng.next_f32()).collect();
    let (w_d, pos_d) = (gpu.up(&w)?, gpu.up(&[sh.pos0 as u32])?);
    // The engine's RoPE of the layer kind (YaRN for compressed rows, plain for dense ones).
    let rope = kernels::RopeParams::from_rope(&Rope::for_layer(&hp, yarn));
    // Rows (and ring) of the exact kernel and of the twin for one set of flags.
    let run_pair = |flags: u32| -> HipResult<[Vec<f32>; 2]> {
        let mut got = [Vec::new(), Vec::new()];
        for (i, fast) in [false, true].into_iter().enumerate() {
            let x_d = gpu.up(&x)?;
            let ring = gpu.poisoned::<f32>(ring_cap * sh.head_dim)?;
            let with_ring = flags & rf::STORE_RING != 0;
            let l = kernels::rows_finish(
                x_d.ptr().0,
                if with_ring { ring.ptr().0 } else { NULL },
                if flags & rf::NORM != 0 { w_d.ptr().0 } else { NULL },
                pos_d.ptr().0,
                sh.n_head as u32,
                sh.head_dim as u32,
                flags,
                ring_cap as u32,
                rope,
                1e-6,
                sh.n_tok as u32,
            );
            gpu.run(&if fast { twin_of(&l) } else { l })?;
            got[i] = x_d.to_vec::<f32>()?;
            if with_ring {
                // The rows the batch stored, in position order.
                let all = ring.to_vec::<f32>()?;
                for t in 0..sh.n_tok {
                    let r = (sh.pos0 + t) % ring_cap;
                    got[i].extend_from_slice(&all[r * sh.head_dim..(r + 1) * sh.head_dim]);
                }
            }
        }
        Ok(got)
    };
    let rounding = rf::E4M3 | rf::ROUND_F16;
    let [exact, fast] = run_pair(flags)?;
    if flags & rf::HADAMARD_FP4 != 0 {
        // ds4_rows_finish_hadamard_fast does the exact kernel's operations element by element.
        return Ok(same_bits(name, &fast, &exact, "ds4_rows_finish_hadamard_fast".into()));
    }
    if flags & rounding == 0 {
        return Ok(close_scaled(name, &fast, &exact, FAST_TOL, String::new()));
    }
    let [pre_exact, pre_fast] = run_pair(flags & !rounding & !rf::STORE_RING)?;
    let mut r = close_scaled(name, &pre_fast, &pre_exact, FAST_TOL, "before rounding".into());
    let scale = exact.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
    let step = if flags & rf::E4M3 != 0 { 1.0 / 8.0 } else { 1.0 / 1024.0 };
    let (mut differ, mut ok) = (0usize, fast.len() == exact.len());
    for (&f, &e) in fast.iter().zip(&exact) {
        let d = (f as f64 - e as f64).abs();
        if d > FAST_TOL * scale {
            differ += 1;
            ok &= d <= step * (e as f64).abs().max((f as f64).abs()) * 1.0001;
        }
    }
    if !ok {
        r.verdict = Verdict::Fail;
    }
    r.note += &format!("; after rounding {differ} of {} elements one step apart", exact.len());
    Ok(r)
}

/// The paired row finishes (`kernels::fused_rows_finish_pair`: a layer's query heads and its kv row,
/// with the ring store) against the two fast twins launched one after the other: the same bits in
/// the rows and the ring.
fn check_rows_finish_pair(gpu: &Gpu, rng: &mut CheckRng, name: &str, n_tok: usize) -> Checked {
    use kernels::row_flags as rf;
    let hp = HParams::flash();
    let (d, n_head, ring_cap, pos0) = (hp.head_dim, hp.n_head, 256usize, 300u32);
    let q = random_vec(rng, n_tok * n_head * d, 3.0);
    let kv = random_vec(rng, n_tok * d, 3.0);
    let w: Vec<f32> = (0..d).map(|_| 1.0 + 0.3 * rng.next_f32()).collect();
    let (w_d, pos_d) = (gpu.up(&w)?, gpu.up(&[pos0])?);
    let rope = kernels::RopeParams::from_rope(&Rope::for_layer(&hp, true));
    let (nt, d32) = (n_tok as u32, d as u32);
    let run = |paired: bool| -> HipResult<Vec<u8>> {
        let (q_d, kv_d, ring) = (gpu.up(&q)?, gpu.up(&kv)?, gpu.poisoned::<f32>(ring_cap * d)?);
        let pos = pos_d.ptr().0;
        let heads = kernels::rows_finish(
            q_d.ptr().0,
            NULL,
            NULL,
            pos,
            n_head as u32,
            d32,
            rf::NORM | rf::ROPE,
            1,
            rope,
            1e-6,
            nt,
        );
        let kv_flags = rf::NORM | rf::ROPE | rf::E4M3 | rf::STORE_RING;
        let kv_row = kernels::rows_finish(
            kv_d.ptr().0,
            ring.ptr().0,
            w_d.ptr().0,
            pos,
            1,
            d32,
            kv_flags,
            ring_cap as u32,
            rope,
            1e-6,
            nt,
        );
        if paired {
            gpu.run(&kernels::fused_rows_finish_pair(&heads, &kv_row).expect("a paired launch for these rows"))?;
        } else {
            gpu.run(&twin_of(&heads))?;
            gpu.run(&twin_of(&kv_row))?;
        }
        let mut bytes = q_d.to_vec::<u8>()?;
        bytes.extend(kv_d.to_vec::<u8>()?);
        bytes.extend(ring.to_vec::<u8>()?);
        Ok(bytes)
    };
    Ok(same_bytes(
        name,
        [run(false)?, run(true)?],
        "from the two rows_finish_fast launches",
    ))
}
