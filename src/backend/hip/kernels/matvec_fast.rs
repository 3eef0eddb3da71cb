//! Builders of the fast-arithmetic products of kernels/matvec_fast.hip that replace two or more
//! fast launches (docs/arithmetic.md#fast-arithmetic); the plain fast matvecs are the exact ones'
//! twins (`fast_twins`). Built by the sublayers from the launches they replace:
//! * two Q8_0 matvecs of the same activations (`ds4_matvec_q8_0_pair_fast`), a Q8_0 matvec and the
//!   Q8_0 quantization of its output (`ds4_matvec_q8_0_q8_fast`), a row norm and the Q8_0
//!   projection of its planes (`ds4_matvec_q8_0_normed_fast`);
//! * products whose blocks finish their output units: the query's normed up-projection with the
//!   row finish of the query heads and the kv row (`ds4_matvec_q8_0_normed_rows_fast`), the
//!   indexer's query norm, F16 query heads and their Hadamard rows
//!   (`ds4_matvec_f16_normed_hadamard_fast`), and the shared expert's SwiGLU with the Q8_0 of its
//!   output (`ds4_matvec_q8_0_swiglu_q8_fast`). The block that completes a unit (a head, 256 rows)
//!   finishes it, counting on a u32 [n_tok][units] counter that is zero before the launch (the
//!   finishers put it back).
//!
//! Each gives the bits of the fast launches it replaces, and is `None` where they miss its
//! preconditions (then those run).

use super::abi::{
    Arg, DevPtr, MATVEC_F16_NORMED_HADAMARD_FAST, MATVEC_Q8_0_NORMED_FAST, MATVEC_Q8_0_NORMED_ROWS_FAST,
    MATVEC_Q8_0_PAIR_FAST, MATVEC_Q8_0_Q8_FAST, MATVEC_Q8_0_SWIGLU_Q8_FAST, NULL,
};
use super::fast_twins::{FastGrids, arg, arg_u32, fast_twin, q8_0_fast_blocks, q8_0_tiled, q8_0_tiled_rows};
use super::launch::{BLOCK, Launch, f, ptr, u};
use super::matvec::Q8Proj;
use super::norm_quant::NQ_NORM;

/// The parameters of `ds4_matvec_q8_0_normed_rows_fast` that come from the normed product.
const NORMED_PRODUCT: [&str; 8] = ["y", "w", "x", "norm_w", "n_in", "n_out", "x_stride", "eps"];

/// Most elements of the row the fused kernels norm (their DS4_Q8N_MAX: one 8-element strip a thread).
const NORMED_MAX_IN: u32 = 8 * BLOCK;

/// One launch for `normed` (a `ds4_matvec_q8_0_normed_fast` launch: `kernels::matvec_q8_0_normed`)
/// and `rows` (a `ds4_rows_finish_pair_fast` launch: `kernels::fused_rows_finish_pair`) whose first
/// rows are the product's output heads; the pair's second rows (the kv row, an earlier launch's) go
/// to the first blocks. `None` unless the heads tile the product's rows, for the same tokens.
pub fn matvec_q8_0_normed_rows(normed: &Launch, rows: &Launch, counter: DevPtr) -> Option<Launch> {
    let n_tok = normed.grid[1];
    let heads = arg_u32(rows, "n_head") * arg_u32(rows, "head_dim");
    let fits = normed.kernel.name == "ds4_matvec_q8_0_normed_fast"
        && rows.kernel.name == "ds4_rows_finish_pair_fast"
        && arg(rows, "x") == arg(normed, "y")
        && heads == arg_u32(normed, "n_out")
        && rows.grid[1] == n_tok
        && arg(rows, "n_tok") == u(n_tok)
        && counter.is_multiple_of(4);
    if !fits {
        return None;
    }
    let n_head2 = arg_u32(rows, "n_head2");
    let args = MATVEC_Q8_0_NORMED_ROWS_FAST
        .params
        .iter()
        .map(|p| match p.name {
            "counter" => ptr(counter),
            "row_w" => arg(rows, "w"),
            "row_eps" => arg(rows, "eps"),
            name if NORMED_PRODUCT.contains(&name) => arg(normed, name),
            name => arg(rows, name),
        })
        .collect();
    // The second rows' blocks come out of the product's (it keeps at least one).
    let blocks = normed.grid[0].max(n_head2 + 1);
    Some(Launch::new(&MATVEC_Q8_0_NORMED_ROWS_FAST, [blocks, n_tok, 1], args))
}

/// One launch for `norm` (an exact `ds4_rms_norm_quant` of one row a token into f32 `out` only:
/// `kernels::norm_rows`), `product` (an exact `ds4_matvec_f16` of that output) and `rows` (an exact
/// `ds4_rows_finish` of the product's output heads whose fast twin is
/// `ds4_rows_finish_hadamard_fast`): the normed row stays in each block's shared memory and is not
/// written. `None` unless all three have their fast twins, chain output to input for the same tokens,
/// the row fits one strip a thread and the heads tile the product's rows.
pub fn matvec_f16_normed_hadamard(norm: &Launch, product: &Launch, rows: &Launch, counter: DevPtr) -> Option<Launch> {
    let product = fast_twin(product).filter(|t| t.kernel.name == "ds4_matvec_f16_fast")?;
    fast_twin(norm).filter(|t| t.kernel.name == "ds4_rms_norm_quant_fast")?;
    fast_twin(rows).filter(|t| t.kernel.name == "ds4_rows_finish_hadamard_fast")?;
    let n_tok = product.grid[1];
    let n_in = arg_u32(&product, "n_in");
    let only_out = ["q0_q", "q0_d", "qk_q", "qk_d", "qk_bs"]
        .iter()
        .all(|&n| arg(norm, n) == ptr(NULL));
    let heads = arg_u32(rows, "n_head") * arg_u32(rows, "head_dim");
    let fits = norm.kernel.name == "ds4_rms_norm_quant"
        && only_out
        && arg(norm, "flags") == u(NQ_NORM)
        && arg(norm, "out") == arg(&product, "x")
        && arg(norm, "n") == u(n_in)
        && arg(&product, "x_stride") == u(n_in)
        && norm.grid[0] == n_tok
        && n_in <= NORMED_MAX_IN
        && arg(rows, "x") == arg(&product, "y")
        && arg(rows, "w") == ptr(NULL)
        && arg(rows, "emit_ratio") == u(0)
        && arg(rows, "n_tok") == u(n_tok)
        && heads == arg_u32(&product, "n_out")
        && counter.is_multiple_of(4);
    fits.then(|| {
        let args: Vec<Arg> = MATVEC_F16_NORMED_HADAMARD_FAST
            .params
            .iter()
            .map(|p| match p.name {
                "counter" => ptr(counter),
                "y" | "w" | "n_in" | "n_out" => arg(&product, p.name),
                "x" | "x_stride" => arg(norm, p.name),
                "norm_w" => arg(norm, "w"),
                "norm_eps" => arg(norm, "eps"),
                name => arg(rows, name),
            })
            .collect();
        Launch::new(&MATVEC_F16_NORMED_HADAMARD_FAST, product.grid, args)
    })
}

/// One launch for `swiglu` (an exact `ds4_matvec_q8_0_swiglu` launch) and `quant`
/// (`kernels::quantize_rows` of its mid rows into Q8_0 planes only, as rows of 256): the block that
/// completes a 256-row unit quantizes it; mid is written too. `None` unless the SwiGLU takes the
/// tiled fast path, its rows are whole units and `quant` quantizes exactly those rows.
pub fn matvec_q8_0_swiglu_quantized(swiglu: &Launch, quant: &Launch, counter: DevPtr) -> Option<Launch> {
    let twin = fast_twin(swiglu).filter(|t| t.kernel.name == "ds4_matvec_q8_0_swiglu_fast")?;
    let (n_ff, n_tok) = (arg_u32(swiglu, "n_ff"), twin.grid[1]);
    let only_q8_0 = ["out", "qk_q", "qk_d", "qk_bs", "w"]
        .iter()
        .all(|&n| arg(quant, n) == ptr(NULL));
    let fits = swiglu.kernel.name == "ds4_matvec_q8_0_swiglu"
        && quant.kernel.name == "ds4_rms_norm_quant"
        && only_q8_0
        && q8_0_tiled(arg_u32(swiglu, "n_in"))
        && arg(quant, "x") == arg(swiglu, "mid")
        && arg(quant, "n") == u(256)
        && arg(quant, "flags") == u(0)
        && n_ff.is_multiple_of(256)
        && quant.grid[0] == n_tok * (n_ff / 256)
        && counter.is_multiple_of(4);
    fits.then(|| {
        let args = MATVEC_Q8_0_SWIGLU_Q8_FAST
            .params
            .iter()
            .map(|p| match p.name {
                "q_out" => arg(quant, "q0_q"),
                "d_out" => arg(quant, "q0_d"),
                "counter" => ptr(counter),
                name => arg(swiglu, name),
            })
            .collect();
        Launch::new(&MATVEC_Q8_0_SWIGLU_Q8_FAST, twin.grid, args)
    })
}

/// One launch for two plain Q8_0 projections of the same activations (`first` then `second`, each
/// one group, x_stride = n_in) for `n_tok` tokens: the rounds of `first`'s rows, then `second`'s.
/// `first`'s rows must fill whole rounds of the tiled product (q8_0_tiled_rows).
pub fn paired_matvec_q8_0(first: &Q8Proj, second: &Q8Proj, n_tok: u32, grids: FastGrids) -> Option<Launch> {
    let plain = |p: &Q8Proj| p.rows_per_group >= p.n_out && p.x_stride == p.n_in;
    let same_x = first.x == second.x && first.n_in == second.n_in;
    let aligned = [first.y, first.w, second.y, second.w].iter().all(|p| p % 16 == 0);
    let n_in = first.n_in;
    let fits = same_x
        && plain(first)
        && plain(second)
        && aligned
        && q8_0_tiled(n_in)
        && first.n_out.is_multiple_of(q8_0_tiled_rows(n_in));
    fits.then(|| {
        let grid = q8_0_fast_blocks(n_in, first.n_out + second.n_out, grids.q8_0_max_blocks);
        let args: Vec<Arg> = vec![
            ptr(first.y),
            ptr(second.y),
            ptr(first.w),
            ptr(second.w),
            ptr(first.x.q),
            ptr(first.x.d),
            u(n_in),
            u(first.n_out),
            u(second.n_out),
        ];
        Launch::new(&MATVEC_Q8_0_PAIR_FAST, [grid, n_tok, 1], args)
    })
}

/// One launch for a Q8_0 projection and the Q8_0 quantization of its output rows
/// (`kernels::quantize_rows` of `p.y`'s rows into codes `q`, scales `d`) for `n_tok` tokens:
/// `ds4_matvec_q8_0_q8_fast`, with the bits of the two fast launches; the f32 rows are not written.
/// `None` unless the tiled shapes hold, the rows are whole Q8_0 blocks and a round's rows divide 32
/// or are a multiple of it.
pub fn matvec_q8_0_quantized(p: &Q8Proj, (q, d): (DevPtr, DevPtr), n_tok: u32, grids: FastGrids) -> Option<Launch> {
    let n_in = p.n_in;
    let fits = q8_0_tiled(n_in) && p.n_out.is_multiple_of(32) && {
        let rows = q8_0_tiled_rows(n_in);
        rows.is_multiple_of(32) || 32 % rows == 0
    };
    fits.then(|| {
        let grid = q8_0_fast_blocks(n_in, p.n_out, grids.q8_0_max_blocks);
        // The matvec's operands after its output, in their order (`Q8Proj::args`).
        let args = [&[ptr(q), ptr(d)][..], &p.args()[1..]].concat();
        Launch::new(&MATVEC_Q8_0_Q8_FAST, [grid, n_tok, 1], args)
    })
}

/// One launch for `kernels::norm_rows` of the f32 rows `x` (n_in floats each, contiguous, weight
/// `norm_w`, into `p`'s Q8_0 planes) followed by `p`, the plain Q8_0 projection of those planes, for
/// `n_tok` tokens: `ds4_matvec_q8_0_normed_fast`, with the bits of the two fast launches; the
/// planes are not written. `None` unless `p` is one group of the tiled shapes with n_in at most
/// NORMED_MAX_IN, contiguous activation rows and 16-byte aligned pointers.
pub fn matvec_q8_0_normed(
    p: &Q8Proj,
    x: DevPtr,
    norm_w: DevPtr,
    eps: f32,
    n_tok: u32,
    grids: FastGrids,
) -> Option<Launch> {
    let n_in = p.n_in;
    let aligned = [p.y, p.w, x, norm_w].iter().all(|a| a % 16 == 0);
    let fits =
        p.rows_per_group >= p.n_out && p.x_stride == n_in && aligned && q8_0_tiled(n_in) && n_in <= NORMED_MAX_IN;
    fits.then(|| {
        let grid = q8_0_fast_blocks(n_in, p.n_out, grids.q8_0_max_blocks);
        let args = vec![
            ptr(p.y),
            ptr(p.w),
            ptr(x),
            ptr(norm_w),
            u(n_in),
            u(p.n_out),
            u(n_in),
            f(eps),
        ];
        Launch::new(&MATVEC_Q8_0_NORMED_FAST, [grid, n_tok, 1], args)
    })
}

#[cfg(test)]
mod tests {
    use super::super::{
        FastGrids, Q8Act, Q8Proj, QuantOut, RopeParams, fused_rows_finish_pair, matvec_f16, matvec_q8_0_normed,
        norm_rows, row_flags as rf, rows_finish,
    };
    use super::*;
    use crate::backend::cpu::ops::Rope;
    use crate::model::hparams::HParams;

    fn rope() -> RopeParams {
        RopeParams::from_rope(&Rope::for_layer(&HParams::flash(), true))
    }

    /// The Flash query chain's launches: the normed up-projection into 64 heads of 512 at 0x1000,
    /// and the pair of row finishes of those heads and of the kv row at 0x2000.
    fn query_chain(q: DevPtr) -> (Launch, Launch) {
        let q_b = Q8Proj::plain(0x1000, 0x10000, Q8Act { q: 0x100, d: 0x200 }, 1024, 64 * 512);
        let normed = matvec_q8_0_normed(&q_b, 0x300, 0x400, 1e-6, 1, FastGrids::default()).expect("normed");
        let q_rows = rows_finish(q, NULL, NULL, 0x40, 64, 512, rf::NORM | rf::ROPE, 1, rope(), 1e-6, 1);
        let kv_rows = rows_finish(
            0x2000,
            0x3000,
            0x500,
            0x40,
            1,
            512,
            rf::NORM | rf::ROPE | rf::E4M3 | rf::STORE_RING,
            256,
            rope(),
            1e-6,
            1,
        );
        (normed, fused_rows_finish_pair(&q_rows, &kv_rows).expect("paired"))
    }

    #[test]
    fn the_query_heads_finish_in_their_up_projection() {
        let (normed, rows) = query_chain(0x1000);
        let l = matvec_q8_0_normed_rows(&normed, &rows, 0x80).expect("fused");
        assert_eq!(l.kernel.name, "ds4_matvec_q8_0_normed_rows_fast");
        assert_eq!(l.grid, [normed.grid[0], 1, 1]);
        assert_eq!(arg(&l, "counter"), ptr(0x80));
        assert_eq!(arg(&l, "w"), arg(&normed, "w"));
        assert_eq!(arg(&l, "row_w"), arg(&rows, "w"));
        assert_eq!(arg(&l, "eps"), arg(&normed, "eps"));
        assert_eq!(arg(&l, "row_eps"), arg(&rows, "eps"));
        assert_eq!(arg(&l, "x2"), ptr(0x2000));
        assert_eq!(arg(&l, "ring2"), ptr(0x3000));
        assert_eq!(arg(&l, "n_head"), u(64));
        // Rows that are not the product's output, or a misaligned counter: no fusion.
        let (normed, other) = query_chain(0x1800);
        assert!(matvec_q8_0_normed_rows(&normed, &other, 0x80).is_none());
        assert!(matvec_q8_0_normed_rows(&normed, &rows, 0x82).is_none());
    }

    /// The Flash indexer's query chain: the norm of the 1024-wide down-projection, its F16
    /// projection into 64 heads of 128 and their RoPE and Hadamard rows.
    fn indexer_chain(flags: u32) -> (Launch, Launch, Launch) {
        let norm = norm_rows(
            QuantOut {
                out: 0x1000,
                ..Default::default()
            },
            0x2000,
            0x3000,
            1024,
            1,
            1e-6,
        );
        let product = matvec_f16(0x4000, 0x10000, 0x1000, 1024, 64 * 128, 1024, 1);
        let rows = rows_finish(0x4000, NULL, NULL, 0x40, 64, 128, flags, 1, rope(), 1e-6, 1);
        (norm, product, rows)
    }

    #[test]
    fn the_indexer_heads_finish_in_their_normed_product() {
        let (norm, product, rows) = indexer_chain(rf::ROPE | rf::HADAMARD_FP4);
        let l = matvec_f16_normed_hadamard(&norm, &product, &rows, 0x80).expect("fused");
        assert_eq!(l.kernel.name, "ds4_matvec_f16_normed_hadamard_fast");
        assert_eq!(l.grid, fast_twin(&product).unwrap().grid);
        assert_eq!(arg(&l, "x"), ptr(0x2000));
        assert_eq!(arg(&l, "norm_w"), ptr(0x3000));
        assert_eq!(arg(&l, "y"), ptr(0x4000));
        assert_eq!(arg(&l, "flags"), u(rf::ROPE | rf::HADAMARD_FP4));
        assert_eq!(arg(&l, "head_dim"), u(128));
        // Without the Hadamard rows (another fast twin) or with a quantized norm: no fusion.
        let (norm, product, plain) = indexer_chain(rf::ROPE);
        assert!(matvec_f16_normed_hadamard(&norm, &product, &plain, 0x80).is_none());
        let quantized = norm_rows(QuantOut::q8_0(0x5000, 0x6000), 0x2000, 0x3000, 1024, 1, 1e-6);
        assert!(matvec_f16_normed_hadamard(&quantized, &product, &rows, 0x80).is_none());
    }

    #[test]
    fn the_shared_expert_quantizes_its_swiglu_output_in_one_launch() {
        use super::super::{Q8Swiglu, matvec_q8_0_swiglu, quantize_rows};
        let s = Q8Swiglu {
            mid: 0x1000,
            wg: 0x10000,
            wu: 0x20000,
            x: Q8Act { q: 0x100, d: 0x200 },
            n_in: 4096,
            n_ff: 2048,
            limit: 7.0,
        };
        let swiglu = matvec_q8_0_swiglu(&s, 1);
        let quant = quantize_rows(QuantOut::q8_0(0x3000, 0x4000), 0x1000, 2048, 1);
        let l = matvec_q8_0_swiglu_quantized(&swiglu, &quant, 0x80).expect("fused");
        assert_eq!(l.kernel.name, "ds4_matvec_q8_0_swiglu_q8_fast");
        assert_eq!(l.grid, fast_twin(&swiglu).unwrap().grid);
        assert_eq!((arg(&l, "q_out"), arg(&l, "d_out")), (ptr(0x3000), ptr(0x4000)));
        assert_eq!(arg(&l, "mid"), ptr(0x1000));
        // Another buffer's quantization, or an f32 copy as well: no fusion.
        let other = quantize_rows(QuantOut::q8_0(0x3000, 0x4000), 0x5000, 2048, 1);
        assert!(matvec_q8_0_swiglu_quantized(&swiglu, &other, 0x80).is_none());
        let with_out = quantize_rows(
            QuantOut {
                out: 0x6000,
                ..QuantOut::q8_0(0x3000, 0x4000)
            },
            0x1000,
            2048,
            1,
        );
        assert!(matvec_q8_0_swiglu_quantized(&swiglu, &with_out, 0x80).is_none());
    }

    fn proj(y: DevPtr, w: DevPtr, n_in: u32, n_out: u32) -> Q8Proj {
        Q8Proj::plain(y, w, Q8Act { q: 0x100, d: 0x200 }, n_in, n_out)
    }

    #[test]
    fn two_projections_of_one_activation_pair_up_on_whole_rounds() {
        let grids = FastGrids::default();
        // q_a (1024 rows) and kv (512 rows) of a Flash layer: 4096 inputs, rounds of 8 rows.
        let (qa, kv) = (proj(0x1000, 0x2000, 4096, 1024), proj(0x3000, 0x4000, 4096, 512));
        let l = paired_matvec_q8_0(&qa, &kv, 1, grids).expect("paired");
        assert_eq!(l.kernel.name, "ds4_matvec_q8_0_pair_fast");
        assert_eq!(l.grid, [q8_0_fast_blocks(4096, 1536, grids.q8_0_max_blocks), 1, 1]);
        assert_eq!(&l.args[6..], &[u(4096), u(1024), u(512)]);
        // The first matrix must end on a round; the activations must be the same.
        assert!(paired_matvec_q8_0(&proj(0x1000, 0x2000, 4096, 1020), &kv, 1, grids).is_none());
        let other_x = Q8Proj {
            x: Q8Act { q: 0x500, d: 0x200 },
            ..kv
        };
        assert!(paired_matvec_q8_0(&qa, &other_x, 1, grids).is_none());
        let grouped = Q8Proj {
            rows_per_group: 256,
            ..qa
        };
        assert!(paired_matvec_q8_0(&grouped, &kv, 1, grids).is_none());
    }
}
