//! Fast-arithmetic fusions of two launches into one (docs/arithmetic.md#fast-arithmetic) built by
//! the sublayers: two Q8_0 matvecs of the same activations (`ds4_matvec_q8_0_pair_fast`), a Q8_0
//! matvec and the quantization of its output (`ds4_matvec_q8_0_q8_fast`), two row finishes of the
//! same tokens (`ds4_rows_finish_pair_fast`), the router's logits and its selection
//! (`ds4_matvec_f16_router_fast`), a routed gate/up and the Q8_K quantization of its output
//! (`ds4_moe_gate_up_<fmt>_q8k_fast`), a row norm and the Q8_0 projection of its planes
//! (`ds4_matvec_q8_0_normed_fast`). Each gives the bits of the two fast
//! twins run one after the other, and is `None` where the launches miss the fused kernel's
//! preconditions (then both run on their own). The fused HC post + pre, which the launcher finds by
//! itself, is in `fast.rs`.

use super::abi::{
    Arg, DevPtr, MATVEC_F16_ROUTER_FAST, MATVEC_Q8_0_NORMED_FAST, MATVEC_Q8_0_PAIR_FAST, MATVEC_Q8_0_Q8_FAST, NULL,
    ROWS_FINISH_PAIR_FAST, kernel_def,
};
use super::fast::{FastGrids, arg, arg_u32, fast_twin, fast_twin_tuned, q8_0_fast_blocks, q8_0_tiled, q8_0_tiled_rows};
use super::launch::{BLOCK, Launch, f, ptr, u};
use super::matvec::Q8Proj;

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

/// Most elements of the row `matvec_q8_0_normed` norms: one 8-element strip a thread (the
/// kernel's DS4_Q8N_MAX).
const Q8_0_NORMED_MAX_IN: u32 = 8 * BLOCK;

/// One launch for `kernels::norm_rows` of the f32 rows `x` (n_in floats each, contiguous, weight
/// `norm_w`, into `p`'s Q8_0 planes) followed by `p`, the plain Q8_0 projection of those planes, for
/// `n_tok` tokens: `ds4_matvec_q8_0_normed_fast`, with the bits of the two fast launches; the
/// planes are not written. `None` unless `p` is one group of the tiled shapes with n_in at most
/// Q8_0_NORMED_MAX_IN, contiguous activation rows and 16-byte aligned pointers.
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
        p.rows_per_group >= p.n_out && p.x_stride == n_in && aligned && q8_0_tiled(n_in) && n_in <= Q8_0_NORMED_MAX_IN;
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

/// One launch for two `ds4_rows_finish` launches (`kernels::rows_finish`) of the same tokens,
/// positions, row width and RoPE, both of which have the fast twin, neither emitting compressed
/// rows: `first`'s rows on the first blocks, `second`'s after them.
pub fn fused_rows_finish_pair(first: &Launch, second: &Launch) -> Option<Launch> {
    let is_rows = |l: &Launch| {
        l.kernel.name == "ds4_rows_finish"
            && fast_twin(l).is_some_and(|t| t.kernel.name == "ds4_rows_finish_fast")
            && arg(l, "emit_ratio") == Arg::U32(0)
    };
    const SHARED: [&str; 11] = [
        "pos",
        "head_dim",
        "n_rot",
        "n_tok",
        "theta_scale",
        "freq_scale",
        "ext_factor",
        "corr_low",
        "corr_high",
        "mscale",
        "eps",
    ];
    let same = SHARED.iter().all(|n| arg(first, n) == arg(second, n)) && first.grid[1] == second.grid[1];
    if !(is_rows(first) && is_rows(second) && same) {
        return None;
    }
    let args = ROWS_FINISH_PAIR_FAST
        .params
        .iter()
        .map(|p| match p.name.strip_suffix('2') {
            Some(name) => arg(second, name),
            None => arg(first, p.name),
        })
        .collect();
    let blocks = arg_u32(first, "n_head") + arg_u32(second, "n_head");
    Some(Launch::new(&ROWS_FINISH_PAIR_FAST, [blocks, first.grid[1], 1], args))
}

/// One launch for the router's logits (`logits`, an exact `ds4_matvec_f16` launch) and its
/// selection (`router`, a `ds4_router` launch reading them): `ds4_matvec_f16_router_fast`, whose last
/// block of each token runs the selection, with the bits of the two fast twins. `counter`: u32
/// [n_tok], zero before the launch (the finishers put it back). `None` unless both launches have
/// their fast twins, the product writes the n_expert logits the router reads, for the same tokens.
pub fn matvec_f16_router(logits: &Launch, router: &Launch, counter: DevPtr) -> Option<Launch> {
    let product = fast_twin(logits).filter(|t| t.kernel.name == "ds4_matvec_f16_fast")?;
    let fits = router.kernel.name == "ds4_router"
        && arg(&product, "y") == arg(router, "logits")
        && arg(&product, "n_out") == arg(router, "n_expert")
        && u(product.grid[1]) == arg(router, "n_tok")
        && counter.is_multiple_of(4);
    fits.then(|| {
        let args = MATVEC_F16_ROUTER_FAST
            .params
            .iter()
            .map(|p| match p.name {
                "counter" => ptr(counter),
                "n_in" | "w" | "x" | "x_stride" => arg(&product, p.name),
                name => arg(router, name),
            })
            .collect();
        Launch::new(&MATVEC_F16_ROUTER_FAST, product.grid, args)
    })
}

/// One launch for a routed gate/up (`gate_up`, an exact per-token `ds4_moe_gate_up_<fmt>` launch)
/// and the Q8_K quantization of its mid rows (`quant`, `kernels::quantize_rows` of them as rows of
/// 256): `ds4_moe_gate_up_<fmt>_q8k_fast`, the last block of each 256-element unit quantizing it,
/// with the bits of the two fast twins. `counter`: u32 [n_tok][n_used][n_ff / 256], zero before the
/// launch (the finishers put it back). `None` unless the gate/up has its fast twin, n_ff is whole
/// units (each `grids.moe_rows` rows a block, a divisor of 256) and `quant` writes only the Q8_K
/// planes of exactly those rows.
pub fn moe_gate_up_quantized(gate_up: &Launch, quant: &Launch, counter: DevPtr, grids: FastGrids) -> Option<Launch> {
    let twin = fast_twin_tuned(gate_up, grids).filter(|t| t.kernel.name.starts_with("ds4_moe_gate_up_"))?;
    let (n_ff, n_used, n_tok) = (arg_u32(gate_up, "n_ff"), arg_u32(gate_up, "n_used"), gate_up.grid[2]);
    let only_q8_k = ["out", "q0_q", "q0_d", "w"].iter().all(|&n| arg(quant, n) == ptr(NULL));
    let fits = quant.kernel.name == "ds4_rms_norm_quant"
        && only_q8_k
        && arg(quant, "x") == arg(gate_up, "mid")
        && arg(quant, "n") == u(256)
        && arg(quant, "flags") == u(0)
        && n_ff.is_multiple_of(256)
        && 256 % grids.moe_rows == 0
        && quant.grid[0] == n_tok * n_used * (n_ff / 256)
        && counter.is_multiple_of(4);
    if !fits {
        return None;
    }
    let kernel = kernel_def(&twin.kernel.name.replace("_fast", "_q8k_fast"))?;
    let args = kernel
        .params
        .iter()
        .map(|p| match p.name {
            "mq" => arg(quant, "qk_q"),
            "md" => arg(quant, "qk_d"),
            "mbs" => arg(quant, "qk_bs"),
            "counter" => ptr(counter),
            name => arg(gate_up, name),
        })
        .collect();
    Some(Launch::new(kernel, twin.grid, args))
}

#[cfg(test)]
mod tests {
    use super::super::{DevPtr, Q8Act};
    use super::*;

    fn proj(y: DevPtr, w: DevPtr, n_in: u32, n_out: u32) -> Q8Proj {
        Q8Proj::plain(y, w, Q8Act { q: 0x100, d: 0x200 }, n_in, n_out)
    }

    #[test]
    fn two_row_finishes_of_the_same_tokens_pair_up() {
        use super::super::{RopeParams, row_flags as rf, rows_finish, rows_finish_emitted};
        let rope = RopeParams::from_rope(&crate::backend::cpu::ops::Rope::for_layer(
            &crate::model::hparams::HParams::flash(),
            true,
        ));
        let q = rows_finish(0x100, 0, 0, 0x40, 64, 512, rf::NORM | rf::ROPE, 1, rope, 1e-6, 1);
        let kv = rows_finish(
            0x200,
            0x300,
            0x400,
            0x40,
            1,
            512,
            rf::NORM | rf::ROPE | rf::E4M3 | rf::STORE_RING,
            2175,
            rope,
            1e-6,
            1,
        );
        let l = fused_rows_finish_pair(&q, &kv).expect("paired");
        assert_eq!((l.kernel.name, l.grid), ("ds4_rows_finish_pair_fast", [65, 1, 1]));
        let want = |name: &str, from: &Launch, as_name: &str| assert_eq!(arg(&l, name), arg(from, as_name), "{name}");
        for (name, from, as_name) in [
            ("x", &q, "x"),
            ("flags", &q, "flags"),
            ("ring_cap", &q, "ring_cap"),
            ("x2", &kv, "x"),
            ("ring2", &kv, "ring"),
            ("w2", &kv, "w"),
            ("n_head2", &kv, "n_head"),
            ("flags2", &kv, "flags"),
            ("ring_cap2", &kv, "ring_cap"),
            ("pos", &q, "pos"),
            ("eps", &q, "eps"),
        ] {
            want(name, from, as_name);
        }
        // Other tokens, other widths, emitted rows, the Hadamard rows (exact only): apart.
        let other_tok = rows_finish(0x200, 0x300, 0x400, 0x40, 1, 512, rf::NORM, 2175, rope, 1e-6, 2);
        assert!(fused_rows_finish_pair(&q, &other_tok).is_none());
        let narrow = rows_finish(0x200, 0, 0x400, 0x40, 1, 128, rf::NORM, 1, rope, 1e-6, 1);
        assert!(fused_rows_finish_pair(&q, &narrow).is_none());
        let emitted = rows_finish_emitted(0x200, 0x400, 0x40, 512, rf::NORM, 4, 1026, rope, 1e-6, 1, 1);
        assert!(fused_rows_finish_pair(&q, &emitted).is_none());
        let hadamard = rows_finish(0x200, 0, 0, 0x40, 1, 512, rf::ROPE | rf::HADAMARD_FP4, 1, rope, 1e-6, 1);
        assert!(fused_rows_finish_pair(&q, &hadamard).is_none());
    }

    #[test]
    fn the_mid_quantization_joins_the_routed_gate_up() {
        use super::super::{ExpertFormat, Q8K, QuantOut, moe_gate_up, quantize_rows};
        let x = Q8K {
            q: 0x10,
            d: 0x20,
            bsums: 0x30,
        };
        let gate_up = |n_ff| {
            moe_gate_up(
                ExpertFormat::Iq2Xxs,
                0x100,
                0x200,
                0x300,
                x,
                0x400,
                0x500,
                4096,
                n_ff,
                6,
                7.0,
                1,
            )
        };
        let planes = QuantOut {
            q8_k_q: 0x600,
            q8_k_d: 0x700,
            q8_k_bs: 0x800,
            ..Default::default()
        };
        let quant = |mid, n_ff| quantize_rows(planes, mid, n_ff, 6);
        let l = moe_gate_up_quantized(&gate_up(2048), &quant(0x100, 2048), 0x900, FastGrids::default()).expect("fused");
        let twin = fast_twin(&gate_up(2048)).expect("the gate/up's twin");
        assert_eq!((l.kernel.name, l.grid), ("ds4_moe_gate_up_iq2_xxs_q8k_fast", twin.grid));
        for (name, want) in [
            ("mid", ptr(0x100)),
            ("mq", ptr(0x600)),
            ("md", ptr(0x700)),
            ("mbs", ptr(0x800)),
            ("counter", ptr(0x900)),
            ("gate", ptr(0x200)),
            ("up", ptr(0x300)),
            ("xq", ptr(0x10)),
            ("sel", ptr(0x400)),
            ("selw", ptr(0x500)),
            ("n_in", u(4096)),
            ("n_ff", u(2048)),
            ("n_used", u(6)),
        ] {
            assert_eq!(arg(&l, name), want, "{name}");
        }
        // Another buffer, rows of a partial unit, a Q8_0 quantization: apart.
        assert!(moe_gate_up_quantized(&gate_up(2048), &quant(0x180, 2048), 0x900, FastGrids::default()).is_none());
        assert!(moe_gate_up_quantized(&gate_up(2176), &quant(0x100, 2176), 0x900, FastGrids::default()).is_none());
        let q8_0 = quantize_rows(QuantOut::q8_0(0x600, 0x700), 0x100, 2048, 6);
        assert!(moe_gate_up_quantized(&gate_up(2048), &q8_0, 0x900, FastGrids::default()).is_none());
    }

    #[test]
    fn the_router_joins_the_product_of_its_logits() {
        use super::super::{matvec_f16, router};
        let (n_expert, n_used) = (256, 6);
        let logits = matvec_f16(0x100, 0x200, 0x300, 4096, n_expert, 4096, 1);
        let sel = router(0x400, 0x500, 0x100, 0x600, 0, 0x700, n_expert, n_used, 1.5, 1);
        let l = matvec_f16_router(&logits, &sel, 0x800).expect("fused");
        let product = fast_twin(&logits).expect("the product's twin");
        assert_eq!((l.kernel.name, l.grid), ("ds4_matvec_f16_router_fast", product.grid));
        for (name, want) in [
            ("sel", ptr(0x400)),
            ("selw", ptr(0x500)),
            ("logits", ptr(0x100)),
            ("counter", ptr(0x800)),
            ("w", ptr(0x200)),
            ("x", ptr(0x300)),
            ("bias", ptr(0x600)),
            ("tokens", ptr(0x700)),
            ("n_in", u(4096)),
            ("n_expert", u(n_expert)),
            ("n_used", u(n_used)),
            ("x_stride", u(4096)),
        ] {
            assert_eq!(arg(&l, name), want, "{name}");
        }
        // Another output, other tokens, other rows: apart.
        let elsewhere = router(0x400, 0x500, 0x900, 0x600, 0, 0x700, n_expert, n_used, 1.5, 1);
        assert!(matvec_f16_router(&logits, &elsewhere, 0x800).is_none());
        let two_tokens = router(0x400, 0x500, 0x100, 0x600, 0, 0x700, n_expert, n_used, 1.5, 2);
        assert!(matvec_f16_router(&logits, &two_tokens, 0x800).is_none());
        let fewer = matvec_f16(0x100, 0x200, 0x300, 4096, 128, 4096, 1);
        assert!(matvec_f16_router(&fewer, &sel, 0x800).is_none());
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
