//! Builders of the fast-arithmetic routing and routed-expert launches of kernels/moe_fast.hip that
//! replace two launches (docs/arithmetic.md#fast-arithmetic): the router's logits and its selection
//! (`ds4_matvec_f16_router_fast`), a routed gate/up and the Q8_K quantization of its output
//! (`ds4_moe_gate_up_<fmt>_q8k_fast`). Each gives the bits of the two fast twins run one after the
//! other, and is `None` where the launches miss the fused kernel's preconditions (then both run on
//! their own). The single-launch twins are chosen by `fast_twins`.

use super::abi::{DevPtr, MATVEC_F16_ROUTER_FAST, NULL, kernel_def};
use super::fast_twins::{FastGrids, arg, arg_u32, fast_twin, fast_twin_tuned};
use super::launch::{Launch, ptr, u};

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
    use super::*;

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
}
