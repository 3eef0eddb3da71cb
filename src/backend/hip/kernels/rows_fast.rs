//! Builders of the fast-arithmetic row finishes of kernels/rows_fast.hip that replace two launches
//! (docs/arithmetic.md#fast-arithmetic): two row finishes of the same tokens
//! (`ds4_rows_finish_pair_fast`), with the bits of the two fast twins run one after the other, or
//! `None` where the launches miss the fused kernel's preconditions (then both run on their own).
//! The single-launch twins are chosen by `fast_twins`.

use super::abi::{Arg, ROWS_FINISH_PAIR_FAST};
use super::fast_twins::{arg, arg_u32, fast_twin};
use super::launch::Launch;

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
