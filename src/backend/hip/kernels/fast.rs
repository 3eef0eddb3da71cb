//! Fast-arithmetic twins (docs/arithmetic.md): for an exact kernel's launch, the launch of its
//! fast twin (kernels/*_fast.hip) with the same arguments, or `None` where the kernel has no twin
//! or the shapes miss the twin's preconditions (then the exact kernel runs, which is also within
//! the fast tolerances). The twins take the exact kernels' parameter lists, so the launch sequence
//! is built once and the arithmetic is chosen where it runs (`Pass::run`).

use super::abi::{
    ARGMAX_FAST, Arg, GEMM_F16_MMA, GEMM_Q8_0_MMA, HC_PRE_FUSED_FAST, INDEXER_SCORES_FAST, KernelDef, MATVEC_F16_FAST,
    MATVEC_F16_PAIR_FAST, MATVEC_Q8_0_FAST, MATVEC_Q8_0_SWIGLU_FAST, kernel_def,
};
use super::launch::{BLOCK, Launch, blocks};

/// Tokens per block of the dense matrix-core GEMMs (kernels/gemm_fast.hip DS4_MM_TOKS); their row
/// tiles are the exact GEMMs' 64.
pub const MMA_TOKEN_TILE: u32 = 128;

/// Elements per lane chunk of the fast Q8_0 matvecs (DS4_Q8_0_CHUNK): n_in must be a multiple.
pub const Q8_0_FAST_CHUNK: u32 = 256;

/// Lanes per output row of the fast Q8_0 matvecs for rows of `n_in` elements (q8_0_fast_lanes).
pub fn q8_0_fast_lanes(n_in: u32) -> u32 {
    lanes_for_chunks(n_in / Q8_0_FAST_CHUNK)
}

/// Lanes per output row of the fast F16 matvecs, a lane per 8 elements (16 bytes) of a step.
pub fn f16_fast_lanes(n_in: u32) -> u32 {
    lanes_for_chunks(n_in / 8)
}

/// The fast matvecs' lanes per row for rows of `chunks` lane chunks (kernels' q8_0_fast_lanes).
fn lanes_for_chunks(chunks: u32) -> u32 {
    chunks.next_power_of_two().clamp(1, 32)
}

/// The value of `l`'s u32 parameter `name`.
fn arg_u32(l: &Launch, name: &str) -> u32 {
    let i = l.kernel.params.iter().position(|p| p.name == name);
    match i.map(|i| l.args[i]) {
        Some(Arg::U32(v)) => v,
        other => panic!("{}: no u32 parameter {name} ({other:?})", l.kernel.name),
    }
}

fn twin(l: &Launch, kernel: &'static KernelDef, grid: [u32; 3]) -> Launch {
    Launch::new(kernel, grid, l.args.clone())
}

/// The fast twin of `l`, if it has one whose preconditions the shapes meet.
pub fn fast_twin(l: &Launch) -> Option<Launch> {
    match l.kernel.name {
        "ds4_hc_pre_fused" => {
            let n_in = arg_u32(l, "n_embd") * arg_u32(l, "n_hc");
            n_in.is_multiple_of(8).then(|| twin(l, &HC_PRE_FUSED_FAST, l.grid))
        }
        "ds4_matvec_q8_0" | "ds4_matvec_q8_0_swiglu" => {
            let n_in = arg_u32(l, "n_in");
            let (kernel, rows) = if l.kernel.name == "ds4_matvec_q8_0" {
                (&MATVEC_Q8_0_FAST, arg_u32(l, "n_out"))
            } else {
                (&MATVEC_Q8_0_SWIGLU_FAST, arg_u32(l, "n_ff"))
            };
            let per_block = BLOCK / q8_0_fast_lanes(n_in);
            (n_in.is_multiple_of(Q8_0_FAST_CHUNK) && n_in > 0)
                .then(|| twin(l, kernel, [blocks(rows, per_block), l.grid[1], l.grid[2]]))
        }
        "ds4_matvec_f16" | "ds4_matvec_f16_pair" => {
            let (n_in, n_out) = (arg_u32(l, "n_in"), arg_u32(l, "n_out"));
            let (kernel, rows) = if l.kernel.name == "ds4_matvec_f16" {
                (&MATVEC_F16_FAST, n_out)
            } else {
                (&MATVEC_F16_PAIR_FAST, 2 * n_out)
            };
            let per_block = BLOCK / f16_fast_lanes(n_in);
            (n_in.is_multiple_of(8) && n_in > 0)
                .then(|| twin(l, kernel, [blocks(rows, per_block), l.grid[1], l.grid[2]]))
        }
        "ds4_argmax" => Some(twin(l, &ARGMAX_FAST, l.grid)),
        // 128 rows per block (kernels/indexer_fast.hip) instead of 16.
        "ds4_indexer_scores" => Some(twin(l, &INDEXER_SCORES_FAST, [l.grid[0].div_ceil(8), l.grid[1], 1])),
        // Batched prefill GEMMs on matrix cores (kernels/gemm_fast.hip): 128-token tiles.
        "ds4_gemm_q8_0" | "ds4_gemm_f16" => {
            let kernel = if l.kernel.name == "ds4_gemm_q8_0" {
                &GEMM_Q8_0_MMA
            } else {
                &GEMM_F16_MMA
            };
            let grid = [l.grid[0], blocks(arg_u32(l, "n_tok"), MMA_TOKEN_TILE), 1];
            Some(twin(l, kernel, grid))
        }
        // The shared expert's and the grouped routed experts' GEMMs on matrix cores
        // (kernels/gemm_quant_fast.hip): `<name>_mma`, the same arguments and grid.
        "ds4_gemm_q8_0_swiglu"
        | "ds4_moe_gemm_gate_up_iq2_xxs"
        | "ds4_moe_gemm_gate_up_q2_k"
        | "ds4_moe_gemm_gate_up_q4_k"
        | "ds4_moe_gemm_down_iq2_xxs"
        | "ds4_moe_gemm_down_q2_k"
        | "ds4_moe_gemm_down_q4_k" => {
            let kernel = kernel_def(&format!("{}_mma", l.kernel.name)).expect("every grouped GEMM has an _mma twin");
            Some(twin(l, kernel, l.grid))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::super::{
        ExpertFormat, ExpertTiles, HcEps, NULL, Q8Act, Q8K, Q8Proj, Q8Swiglu, QuantOut, argmax, gemm_f16, gemm_q8_0,
        gemm_q8_0_swiglu, hc_pre_fused, matvec_q8_0, matvec_q8_0_swiglu, moe_gemm_down, moe_gemm_gate_up,
    };
    use super::*;

    #[test]
    fn twins_keep_the_arguments_and_regrid_the_q8_0_matvecs() {
        let x = Q8Act { q: 3, d: 4 };
        let l = matvec_q8_0(&Q8Proj::plain(1, 2, x, 4096, 1000), 3);
        let f = fast_twin(&l).expect("a twin");
        assert_eq!(f.kernel.name, "ds4_matvec_q8_0_fast");
        assert_eq!(f.args, l.args);
        // 16 chunks per row: 16 lanes per row, 16 rows per block.
        assert_eq!(q8_0_fast_lanes(4096), 16);
        assert_eq!(f.grid, [1000u32.div_ceil(16), 3, 1]);
        assert_eq!(q8_0_fast_lanes(65536), 32);
        assert_eq!(q8_0_fast_lanes(256), 1);
        // No twin where a row is not whole chunks.
        assert!(fast_twin(&matvec_q8_0(&Q8Proj::plain(1, 2, x, 4096 + 32, 8), 1)).is_none());
        let x = Q8Act { q: 4, d: 5 };
        let sw = Q8Swiglu {
            mid: 1,
            wg: 2,
            wu: 3,
            x,
            n_in: 2048,
            n_ff: 100,
            limit: 7.0,
        };
        let s = fast_twin(&matvec_q8_0_swiglu(&sw, 1)).unwrap();
        assert_eq!(
            (s.kernel.name, s.grid),
            ("ds4_matvec_q8_0_swiglu_fast", [100u32.div_ceil(32), 1, 1])
        );
        assert_eq!(fast_twin(&argmax(1, 2, 129280)).unwrap().kernel.name, "ds4_argmax_fast");
        let eps = HcEps {
            rms: 1e-6,
            hc: 1e-6,
            norm: 1e-6,
        };
        let h = hc_pre_fused(1, QuantOut::default(), 2, 3, 4, 5, 6, 7, 8, 4096, 4, 20, eps, 1);
        let hf = fast_twin(&h).unwrap();
        assert_eq!(
            (hf.kernel.name, hf.grid, &hf.args),
            ("ds4_hc_pre_fused_fast", h.grid, &h.args)
        );
        assert!(fast_twin(&super::super::fill_f32(NULL, 4, 0.0)).is_none());
        // F16: a lane per 8 elements, at most 32 lanes per row.
        let f = fast_twin(&super::super::matvec_f16(1, 2, 3, 4096, 256, 4096, 2)).unwrap();
        assert_eq!((f.kernel.name, f.grid), ("ds4_matvec_f16_fast", [256 / 8, 2, 1]));
        let p = fast_twin(&super::super::matvec_f16_pair(1, 2, 3, 4, 5, 64, 10, 64, 1)).unwrap();
        assert_eq!((p.kernel.name, p.grid), ("ds4_matvec_f16_pair_fast", [1, 1, 1]));
    }

    #[test]
    fn the_batched_gemms_have_matrix_core_twins() {
        // Dense GEMMs: the same arguments on 128-token tiles.
        let proj = Q8Proj {
            rows_per_group: 512,
            x_stride: 8192,
            ..Q8Proj::plain(1, 2, Q8Act { q: 3, d: 4 }, 4096, 1024)
        };
        let g = gemm_q8_0(&proj, 300);
        let gf = fast_twin(&g).unwrap();
        assert_eq!((gf.kernel.name, &gf.args), ("ds4_gemm_q8_0_mma", &g.args));
        assert_eq!(gf.grid, [16, 300u32.div_ceil(MMA_TOKEN_TILE), 1]);
        let h = fast_twin(&gemm_f16(1, 2, 3, 4096, 100, 4096, 129)).unwrap();
        assert_eq!((h.kernel.name, h.grid), ("ds4_gemm_f16_mma", [2, 2, 1]));
        // The shared expert and every grouped expert GEMM: `_mma`, same arguments and grid.
        let tiles = ExpertTiles {
            pairs: 5,
            tiles: 6,
            n_tiles: 7,
            max_tiles: 40,
        };
        let q = Q8K { q: 8, d: 9, bsums: 10 };
        let sw = Q8Swiglu {
            mid: 1,
            wg: 2,
            wu: 3,
            x: Q8Act { q: 4, d: 5 },
            n_in: 4096,
            n_ff: 2048,
            limit: 7.0,
        };
        let mut exact = vec![gemm_q8_0_swiglu(&sw, 100)];
        for fmt in [ExpertFormat::Iq2Xxs, ExpertFormat::Q2K, ExpertFormat::Q4K] {
            exact.push(moe_gemm_gate_up(fmt, 1, 2, 3, q, tiles, 4, 4096, 2048, 6, 7.0));
            exact.push(moe_gemm_down(fmt, 1, 2, q, tiles, 2048, 4096, 6));
        }
        for l in exact {
            let f = fast_twin(&l).unwrap();
            assert_eq!(f.kernel.name, format!("{}_mma", l.kernel.name));
            assert_eq!((&f.args, f.grid), (&l.args, l.grid));
        }
    }
}
