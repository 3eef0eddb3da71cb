//! Fast-arithmetic twins (docs/arithmetic.md): for an exact kernel's launch, the launch of its
//! fast twin (kernels/*_fast.hip) with the same arguments, or `None` where the kernel has no twin
//! or the shapes miss the twin's preconditions (then the exact kernel runs, which is also within
//! the fast tolerances). The twins take the exact kernels' parameter lists, so the launch sequence
//! is built once and the arithmetic is chosen where it runs (`Pass::run`).

use super::abi::{
    ARGMAX_FAST, Arg, COMPRESSOR_POOL_FAST, GEMM_F16_MMA, GEMM_Q8_0_MMA, HC_MIX_FAST, HC_POST_FAST, HC_POST_PRE_FAST,
    HC_POST_PRE_TOKEN_FAST, HC_PRE_FUSED_FAST, HC_PRE_TOKEN_FAST, INDEXER_SCORES_DECODE_FAST, INDEXER_SCORES_FAST,
    KernelDef, MATVEC_F16_COLS_FAST, MATVEC_F16_FAST, MATVEC_F16_PAIR_COLS_FAST, MATVEC_F16_PAIR_FAST,
    MATVEC_Q8_0_COLS_FAST, MATVEC_Q8_0_FAST, MATVEC_Q8_0_SWIGLU_COLS_FAST, MATVEC_Q8_0_SWIGLU_FAST,
    RMS_NORM_QUANT_FAST, ROUTER_FAST, ROWS_FINISH_FAST, ROWS_FINISH_HADAMARD_FAST, kernel_def,
};
use super::attention_fast::ATTENTION_SPLIT_ROWS;
use super::launch::{BLOCK, Launch, blocks};
use super::moe::ExpertFormat;
use super::sample::SAMPLE_FAST_BLOCKS;
use crate::backend::knobs;

/// Tokens per block of the dense matrix-core GEMMs (kernels/gemm_fast.hip DS4_MM_TOKS); their row
/// tiles are the exact GEMMs' 64.
pub const MMA_TOKEN_TILE: u32 = 128;

/// Tokens from which the fast HC pre steps run one block per token (`ds4_hc_pre_token_fast`,
/// `ds4_hc_post_pre_token_fast`) instead of one block per mix row and token. A token's block reads
/// its 4 x 4096-float state once instead of 24 times and needs no cross-block finish, but walks the
/// 24 fn rows in turn; a few tokens finish sooner with a block per row (24 per token: one wave of a
/// large GPU up to about 5 tokens). At 16 tokens the row layout needs three waves, which the
/// per-token walk (one wave) should beat: an estimate, not a measured crossing. Both layouts give
/// the same bits.
pub const HC_TOKEN_BLOCKS_MIN_TOKENS: u32 = 16;

/// Dims per block of `ds4_compressor_pool_fast` (DS4_CPF_DIMS).
pub const COMPRESSOR_FAST_DIMS: u32 = 16;

/// Elements per lane chunk of the fast Q8_0 matvecs (DS4_Q8_0_CHUNK): n_in must be a multiple.
pub const Q8_0_FAST_CHUNK: u32 = 256;

/// Lanes per output row of the fast Q8_0 matvecs for rows of `n_in` elements (q8_0_fast_lanes).
pub fn q8_0_fast_lanes(n_in: u32) -> u32 {
    lanes_for_chunks(n_in / Q8_0_FAST_CHUNK)
}

/// Chunks per block round of the tiled fast Q8_0 matvecs (DS4_Q8T_ROUND): a round is 128 / nc rows
/// of nc = n_in / 256 chunks.
const Q8_0_FAST_ROUND: u32 = 128;

/// Most blocks of a tiled fast Q8_0 matvec grid: more rounds than this share blocks, in runs (a
/// block prefetches its next round while it computes this one, so a few rounds per block keep the
/// loads in flight; one round per block leaves them idle while it computes): 264 is two blocks per
/// multiprocessor of a 132-multiprocessor GPU, which decoded faster than 528 or 2048 blocks.
/// `DS4_HIP_Q8_BLOCKS` overrides it for tuning: the grid never changes the
/// bits, every round is computed the same way by whichever block takes it.
pub const Q8_0_FAST_MAX_BLOCKS: u32 = 264;

/// Environment variable overriding [`Q8_0_FAST_MAX_BLOCKS`].
pub const Q8_0_FAST_BLOCKS_ENV: &str = "DS4_HIP_Q8_BLOCKS";

/// Environment variable overriding [`ATTENTION_SPLIT_ROWS`].
pub const ATTENTION_ROWS_ENV: &str = "DS4_HIP_ATTENTION_ROWS";

/// Environment variable that puts the decode split's slices on matrix cores, at least this many rows
/// a slice (a multiple of 16, e.g. `ATTENTION_SPLIT_MMA_ROWS`; 0 or unset: the CUDA-core split).
pub const ATTENTION_MMA_ENV: &str = "DS4_HIP_ATTENTION_MMA";

/// Environment variable overriding the routed gate/up's rows per block ([`MOE_FAST_ROWS`]).
pub const MOE_ROWS_ENV: &str = "DS4_HIP_MOE_ROWS";

/// Most tokens of a batch whose indexer scores run `ds4_indexer_scores_decode_fast` (32 rows a
/// block) rather than `ds4_indexer_scores_fast` (128): a decode step's few hundred rows spread over
/// four times the blocks, while a prefill batch keeps the longer tiles that stage each token's
/// queries once per 128 rows. Both are within the fast tolerance of the exact kernel; their bits
/// differ (the decode twin adds four partial dots a score).
pub const INDEXER_DECODE_MAX_TOKENS: u32 = 4;
/// The environment variable that overrides [`INDEXER_DECODE_MAX_TOKENS`] (`FastGrids::from_env`).
pub const INDEXER_DECODE_TOKENS_ENV: &str = "DS4_HIP_INDEXER_DECODE_TOKENS";

/// The work split a session's fast kernels use where it is a tuning choice: `HipOptions::fast_grids`,
/// passed to [`fast_twin_tuned`] and the attention sublayer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FastGrids {
    /// Most blocks of a tiled fast Q8_0 matvec ([`Q8_0_FAST_MAX_BLOCKS`]; never changes the bits).
    pub q8_0_max_blocks: u32,
    /// Rows per slice at least of the split decode attention ([`ATTENTION_SPLIT_ROWS`]): the slices'
    /// partial sums are merged in another order, so the bits may change, within the fast tolerances.
    pub attention_rows: u32,
    /// Rows per slice at least of the split decode attention on matrix cores (0, the default: the
    /// CUDA-core split with `attention_rows`; `ATTENTION_SPLIT_MMA_ROWS` when asked for). Used where
    /// the device has 32-lane warps and head_dim is a multiple of 64; f16 tiles, so other bits than
    /// the CUDA-core split's, within the kernel bounds of docs/arithmetic.md.
    pub attention_mma_rows: u32,
    /// Output rows per block of the fast routed gate/up kernels ([`MOE_FAST_ROWS`]; a power of two
    /// from 8 to 256, never changes the bits).
    pub moe_rows: u32,
    /// Most tokens for which the indexer scores run 32 rows a block instead of 128
    /// ([`INDEXER_DECODE_MAX_TOKENS`]; the two sum a score's dot in different orders).
    pub indexer_decode_tokens: u32,
}

impl Default for FastGrids {
    fn default() -> FastGrids {
        FastGrids {
            q8_0_max_blocks: Q8_0_FAST_MAX_BLOCKS,
            attention_rows: ATTENTION_SPLIT_ROWS,
            attention_mma_rows: 0,
            moe_rows: MOE_FAST_ROWS,
            indexer_decode_tokens: INDEXER_DECODE_MAX_TOKENS,
        }
    }
}

impl FastGrids {
    /// The defaults with `DS4_HIP_Q8_BLOCKS` (a positive block count), `DS4_HIP_ATTENTION_ROWS`
    /// (a multiple of 8 from 8 to 256), `DS4_HIP_ATTENTION_MMA` (0, or a multiple of 16 from 16 to
    /// 256), `DS4_HIP_MOE_ROWS` (a power of two from 8 to 256) and
    /// `DS4_HIP_INDEXER_DECODE_TOKENS` (a token count, 0: never) applied; malformed is a one-line error naming it.
    pub fn from_env() -> Result<FastGrids, String> {
        // The ranges are the registry's (backend::knobs), the same rules as the validators below.
        let q8 = knobs::number::<u32>(Q8_0_FAST_BLOCKS_ENV)?;
        let rows = knobs::number::<u32>(ATTENTION_ROWS_ENV)?;
        let mma = knobs::number::<u32>(ATTENTION_MMA_ENV)?;
        let moe = knobs::number::<u32>(MOE_ROWS_ENV)?;
        let idx = knobs::number::<u32>(INDEXER_DECODE_TOKENS_ENV)?;
        Ok(FastGrids {
            q8_0_max_blocks: q8.unwrap_or(Q8_0_FAST_MAX_BLOCKS),
            attention_rows: rows.unwrap_or(ATTENTION_SPLIT_ROWS),
            attention_mma_rows: mma.unwrap_or(0),
            moe_rows: moe.unwrap_or(MOE_FAST_ROWS),
            indexer_decode_tokens: idx.unwrap_or(INDEXER_DECODE_MAX_TOKENS),
        })
    }

    /// These grids for the fast Q8_0 column kernels (kernels/matvec_cols_fast.hip): half the tiled
    /// matvecs' most blocks, as their columns' registers leave room for one block a multiprocessor
    /// where the one-token kernels fit two (docs/benchmarks.md#fast-q8_0-column-matvecs-per-shape:
    /// faster at n = 6 on every Flash shape).
    pub fn for_q8_0_columns(self) -> FastGrids {
        FastGrids {
            q8_0_max_blocks: self.q8_0_max_blocks.div_ceil(2),
            ..self
        }
    }
}

/// Whether the fast Q8_0 matvecs take rows of `n_in` elements on their tiled path (q8_tiled): whole
/// chunks, a power-of-two count of them up to 128.
pub fn q8_0_tiled(n_in: u32) -> bool {
    let nc = n_in / Q8_0_FAST_CHUNK;
    n_in.is_multiple_of(Q8_0_FAST_CHUNK) && nc.is_power_of_two() && nc <= Q8_0_FAST_ROUND
}

/// Rows per round of the tiled fast Q8_0 matvecs for rows of `n_in` elements (`q8_0_tiled`).
pub fn q8_0_tiled_rows(n_in: u32) -> u32 {
    Q8_0_FAST_ROUND / (n_in / Q8_0_FAST_CHUNK)
}

/// Whether `n` may be the split decode attention's shortest slice (`DS4_HIP_ATTENTION_ROWS`): whole
/// rounds of the kernels' slice length, at most the rows whose addresses a block stages. The
/// variable's range in `backend::knobs` must say the same (checked by the tests below).
#[cfg(test)]
fn attention_rows_valid(n: u32) -> bool {
    use super::attention_fast::ATTENTION_SLICE_ROUND;
    n.is_multiple_of(ATTENTION_SLICE_ROUND) && (ATTENTION_SLICE_ROUND..=256).contains(&n)
}

/// Whether `n` may be the fast routed gate/up's rows per block (`DS4_HIP_MOE_ROWS`): a power of two
/// dividing the 256-element units the quantizing twin finishes, at least a row per warp.
#[cfg(test)]
fn moe_rows_valid(n: u32) -> bool {
    n.is_power_of_two() && (8..=256).contains(&n)
}

/// Blocks of the fast Q8_0 matvecs for `n_out` rows of `n_in` elements: the tiled path's rounds
/// (`q8_0_tiled`) in at most `max_blocks` blocks, else a block per 256 / G rows.
pub fn q8_0_fast_blocks(n_in: u32, n_out: u32, max_blocks: u32) -> u32 {
    if q8_0_tiled(n_in) {
        let rounds = blocks(n_out, q8_0_tiled_rows(n_in));
        blocks(rounds, rounds.div_ceil(max_blocks.max(1)))
    } else {
        blocks(n_out, BLOCK / q8_0_fast_lanes(n_in))
    }
}

/// Threads per output row of the fast F16 matvecs (f16_fast_threads): the power of two <= n_in / 32,
/// so a thread reads 4 to 7 16-byte words of the row, at least 1 and at most a block.
pub fn f16_fast_threads(n_in: u32) -> u32 {
    let words_per_4 = (n_in / 8 / 4).max(1);
    (1u32 << words_per_4.ilog2()).min(BLOCK)
}

/// The fast matvecs' lanes per row for rows of `chunks` lane chunks (kernels' q8_0_fast_lanes).
fn lanes_for_chunks(chunks: u32) -> u32 {
    chunks.next_power_of_two().clamp(1, 32)
}

/// The value of `l`'s parameter `name`.
pub(super) fn arg(l: &Launch, name: &str) -> Arg {
    let i = l.kernel.params.iter().position(|p| p.name == name);
    i.map(|i| l.args[i])
        .unwrap_or_else(|| panic!("{}: no parameter {name}", l.kernel.name))
}

/// Row width of `ds4_rows_finish_hadamard_fast` (kernels/rows_fast.hip DS4_ROWH_DIM: the indexer's
/// head dim), and its rows a block (DS4_ROWH_ROWS, any wave size).
pub const ROWS_HADAMARD_DIM: u32 = 128;
pub const ROWS_HADAMARD_PER_BLOCK: u32 = 8;

/// Output rows per block of the fast routed-expert kernels by default (the down kernels'
/// DS4_MOE_FAST_ROWS, any wave size; the gate/up kernels take any grid, FastGrids::moe_rows).
pub const MOE_FAST_ROWS: u32 = 16;

/// Bytes of weight rows one warp of a fast routed-expert kernel stages at most (kernels/moe_fast.hip
/// MoeJob::BYTES): sized per kernel, so the Flash-shaped files' jobs (IQ2_XXS gate/up 2112 bytes,
/// Q2_K down 4032) leave few registers unused.
fn moe_fast_job_bytes(name: &str) -> u64 {
    let down = name.starts_with("ds4_moe_down");
    if name.ends_with("iq2_xxs") {
        if down { 3584 } else { 2560 }
    } else if name.ends_with("q2_k") {
        if down { 4096 } else { 3072 }
    } else if down {
        4608
    } else {
        5120
    }
}

/// Bytes of one expert row of `n` elements in the format a routed-expert kernel's name ends with;
/// `None` when the row is not whole super-blocks.
fn expert_row_bytes(name: &str, n: u32) -> Option<u64> {
    let format = ExpertFormat::ALL
        .into_iter()
        .find(|f| name.ends_with(&f.kernel_suffix()))?
        .ggml_type();
    let n = u64::from(n);
    (n.is_multiple_of(format.block_elems()) && n > 0)
        .then(|| format.bytes_for(n))
        .flatten()
}

/// Whether `rows` expert rows of `row` bytes make one 16-byte-aligned job of the fast kernels.
fn moe_fast_job_fits(name: &str, row: u64, rows: u32) -> bool {
    row.is_multiple_of(16) && (1..=8).contains(&rows) && row * u64::from(rows) <= moe_fast_job_bytes(name)
}

/// `<name>_fast` of a routed-expert decode kernel.
fn moe_fast_def(l: &Launch) -> &'static KernelDef {
    kernel_def(&format!("{}_fast", l.kernel.name)).expect("every routed-expert decode kernel has a _fast twin")
}

/// The value of `l`'s u32 parameter `name`.
pub(super) fn arg_u32(l: &Launch, name: &str) -> u32 {
    match arg(l, name) {
        Arg::U32(v) => v,
        other => panic!("{}: parameter {name} is not a u32 ({other:?})", l.kernel.name),
    }
}

/// Whether every pointer argument of `l` is 16-byte aligned (the fast twins' vector loads/stores).
fn ptrs_aligned16(l: &Launch) -> bool {
    l.args.iter().all(|a| !matches!(a, Arg::Ptr(p) if p % 16 != 0))
}

fn twin(l: &Launch, kernel: &'static KernelDef, grid: [u32; 3]) -> Launch {
    Launch::new(kernel, grid, l.args.clone())
}

/// The fast twin of `l` with the default grids ([`fast_twin_tuned`]): what the kernel checks run,
/// where the grid does not matter.
pub fn fast_twin(l: &Launch) -> Option<Launch> {
    fast_twin_tuned(l, FastGrids::default())
}

/// Whether an exact `ds4_hc_pre_fused` launch meets the fast HC pre kernels' preconditions.
fn hc_pre_fits(l: &Launch) -> bool {
    let n_embd = arg_u32(l, "n_embd");
    n_embd.is_multiple_of(8) && n_embd <= 4096 && arg_u32(l, "n_hc") <= 4 && ptrs_aligned16(l)
}

/// The fast twin of `l`, if it has one whose preconditions the shapes meet, with `grids`' sizes.
pub fn fast_twin_tuned(l: &Launch, grids: FastGrids) -> Option<Launch> {
    match l.kernel.name {
        // Rows in registers as 8-float strips per thread (kernels/hc_fast.hip, norm_quant_fast.hip).
        "ds4_hc_pre_fused" => {
            hc_pre_fits(l).then(|| hc_layout(twin(l, &HC_PRE_FUSED_FAST, l.grid), hc_per_token(l.grid[1])))
        }
        "ds4_rms_norm_quant" => {
            let n = arg_u32(l, "n");
            (n.is_multiple_of(8) && n <= 8192 && arg_u32(l, "x_stride").is_multiple_of(4) && ptrs_aligned16(l))
                .then(|| twin(l, &RMS_NORM_QUANT_FAST, l.grid))
        }
        "ds4_hc_post" => (arg_u32(l, "n_hc") <= 4).then(|| twin(l, &HC_POST_FAST, l.grid)),
        // The output head's mix: strips of 8 in flight, f32 sums (kernels/hc_fast.hip).
        "ds4_hc_mix" => {
            (arg_u32(l, "n_in").is_multiple_of(8) && ptrs_aligned16(l)).then(|| twin(l, &HC_MIX_FAST, l.grid))
        }
        // Rows in registers as element pairs (kernels/rows_fast.hip); the Hadamard/FP4 rows of 128
        // a warp each, with the exact kernel's bits.
        "ds4_rows_finish" => {
            use super::row_flags as rf;
            let (hd, n_rot, flags) = (arg_u32(l, "head_dim"), arg_u32(l, "n_rot"), arg_u32(l, "flags"));
            if flags & rf::HADAMARD_FP4 != 0 {
                let fits = hd == ROWS_HADAMARD_DIM && n_rot.is_multiple_of(2) && n_rot <= hd;
                return (fits && flags & (rf::E4M3 | rf::STORE_RING) == 0).then(|| {
                    let grid = [
                        arg_u32(l, "n_head").div_ceil(ROWS_HADAMARD_PER_BLOCK),
                        l.grid[1],
                        l.grid[2],
                    ];
                    twin(l, &ROWS_FINISH_HADAMARD_FAST, grid)
                });
            }
            (hd.is_multiple_of(2) && hd <= 1024 && n_rot.is_multiple_of(2) && ptrs_aligned16(l))
                .then(|| twin(l, &ROWS_FINISH_FAST, l.grid))
        }
        // The column kernels' twins (kernels/matvec_cols_fast.hip) take the same grid in one row,
        // with half the most blocks (`FastGrids::for_q8_0_columns`).
        "ds4_matvec_q8_0" | "ds4_matvec_q8_0_swiglu" | "ds4_matvec_q8_0_cols" | "ds4_matvec_q8_0_swiglu_cols" => {
            let n_in = arg_u32(l, "n_in");
            let (kernel, rows) = match l.kernel.name {
                "ds4_matvec_q8_0" => (&MATVEC_Q8_0_FAST, arg_u32(l, "n_out")),
                "ds4_matvec_q8_0_cols" => (&MATVEC_Q8_0_COLS_FAST, arg_u32(l, "n_out")),
                "ds4_matvec_q8_0_swiglu" => (&MATVEC_Q8_0_SWIGLU_FAST, arg_u32(l, "n_ff")),
                _ => (&MATVEC_Q8_0_SWIGLU_COLS_FAST, arg_u32(l, "n_ff")),
            };
            let grids = match l.kernel.name {
                "ds4_matvec_q8_0_cols" | "ds4_matvec_q8_0_swiglu_cols" => grids.for_q8_0_columns(),
                _ => grids,
            };
            (n_in.is_multiple_of(Q8_0_FAST_CHUNK) && n_in > 0).then(|| {
                let grid = q8_0_fast_blocks(n_in, rows, grids.q8_0_max_blocks);
                twin(l, kernel, [grid, l.grid[1], l.grid[2]])
            })
        }
        "ds4_matvec_f16" | "ds4_matvec_f16_pair" | "ds4_matvec_f16_cols" | "ds4_matvec_f16_pair_cols" => {
            let (n_in, n_out) = (arg_u32(l, "n_in"), arg_u32(l, "n_out"));
            let (kernel, rows) = match l.kernel.name {
                "ds4_matvec_f16" => (&MATVEC_F16_FAST, n_out),
                "ds4_matvec_f16_cols" => (&MATVEC_F16_COLS_FAST, n_out),
                "ds4_matvec_f16_pair" => (&MATVEC_F16_PAIR_FAST, 2 * n_out),
                _ => (&MATVEC_F16_PAIR_COLS_FAST, 2 * n_out),
            };
            let per_block = BLOCK / f16_fast_threads(n_in);
            (n_in.is_multiple_of(8) && n_in > 0)
                .then(|| twin(l, kernel, [blocks(rows, per_block), l.grid[1], l.grid[2]]))
        }
        // Split over blocks, the last one picks among their picks (scratch past the pick's words).
        "ds4_argmax" => Some(twin(l, &ARGMAX_FAST, [SAMPLE_FAST_BLOCKS, 1, 1])),
        // One warp a token (kernels/moe_fast.hip; bitwise the exact results).
        "ds4_router" => Some(twin(l, &ROUTER_FAST, l.grid)),
        "ds4_moe_gate_up_iq2_xxs" | "ds4_moe_gate_up_q2_k" | "ds4_moe_gate_up_q4_k" => {
            let row = expert_row_bytes(l.kernel.name, arg_u32(l, "n_in"))?;
            let grid = [blocks(arg_u32(l, "n_ff"), grids.moe_rows), l.grid[1], l.grid[2]];
            moe_fast_job_fits(l.kernel.name, row, 2).then(|| twin(l, moe_fast_def(l), grid))
        }
        "ds4_moe_down_iq2_xxs" | "ds4_moe_down_q2_k" | "ds4_moe_down_q4_k" => {
            let row = expert_row_bytes(l.kernel.name, arg_u32(l, "n_ff"))?;
            let grid = [blocks(arg_u32(l, "n_out"), MOE_FAST_ROWS), l.grid[1], l.grid[2]];
            moe_fast_job_fits(l.kernel.name, row, arg_u32(l, "n_used")).then(|| twin(l, moe_fast_def(l), grid))
        }
        // 32 rows per block for a few tokens, 128 for a batch (kernels/indexer_fast.hip), instead
        // of 16; the queries and the decode twin's rows are read as float4s.
        "ds4_indexer_scores"
            if ["qi", "krows"]
                .iter()
                .all(|&p| matches!(arg(l, p), Arg::Ptr(p) if p % 16 == 0)) =>
        {
            Some(if l.grid[1] <= grids.indexer_decode_tokens {
                twin(l, &INDEXER_SCORES_DECODE_FAST, [l.grid[0].div_ceil(2), l.grid[1], 1])
            } else {
                twin(l, &INDEXER_SCORES_FAST, [l.grid[0].div_ceil(8), l.grid[1], 1])
            })
        }
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
        // (kernels/gemm_fast.hip): `<name>_mma`, the same arguments and grid.
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
        // The batch's emitted rows in parallel (kernels/compressor_fast.hip; bitwise the exact results).
        "ds4_compressor_pool" => {
            let grid = [blocks(arg_u32(l, "head_dim"), COMPRESSOR_FAST_DIMS), 1, 1];
            Some(twin(l, &COMPRESSOR_POOL_FAST, grid))
        }
        _ => None,
    }
}

/// One fast launch for an HC post followed by the next sublayer's HC pre
/// (`ds4_hc_post_pre_fast`): `pre` (`ds4_hc_pre_fused`) must read the state `post` (`ds4_hc_post`)
/// writes (in place, or from its `hc_in` to another buffer), for the same tokens and shapes, and
/// `pre` must have its fast twin. `None` otherwise (then both run on their own).
pub fn fused_hc_post_pre(post: &Launch, pre: &Launch) -> Option<Launch> {
    if post.kernel.name != "ds4_hc_post" || pre.kernel.name != "ds4_hc_pre_fused" {
        return None;
    }
    let same_state = arg(post, "hc_out") == arg(pre, "hc") && post.grid[1] == pre.grid[1];
    let same_shape = ["n_embd", "n_hc"].iter().all(|n| arg_u32(post, n) == arg_u32(pre, n));
    if !(same_state && same_shape && ptrs_aligned16(post) && hc_pre_fits(pre)) {
        return None;
    }
    let args: Vec<Arg> = HC_POST_PRE_FAST
        .params
        .iter()
        .map(|p| match p.name {
            "y" | "y2" | "hc_in" | "hc_out" => arg(post, p.name),
            "post_split" => arg(post, "split"),
            name => arg(pre, name),
        })
        .collect();
    // pre's own grid is the per-row layout.
    Some(hc_layout(
        Launch::new(&HC_POST_PRE_FAST, pre.grid, args),
        hc_per_token(pre.grid[1]),
    ))
}

/// A fast HC pre launch (`ds4_hc_pre_fused_fast` / `ds4_hc_post_pre_fast`, a block per mix row and
/// token, or their `*_token_fast` twins, a block per token) in the layout asked for: the same
/// arguments, the grid (n_mix, n_tok) or (1, n_tok). Both layouts give the same bits. Any other
/// launch is returned unchanged.
pub fn hc_layout(l: Launch, per_token: bool) -> Launch {
    let (row, token) = match l.kernel.name {
        "ds4_hc_pre_fused_fast" | "ds4_hc_pre_token_fast" => (&HC_PRE_FUSED_FAST, &HC_PRE_TOKEN_FAST),
        "ds4_hc_post_pre_fast" | "ds4_hc_post_pre_token_fast" => (&HC_POST_PRE_FAST, &HC_POST_PRE_TOKEN_FAST),
        _ => return l,
    };
    let (n_hc, n_tok) = (arg_u32(&l, "n_hc"), l.grid[1]);
    if per_token {
        Launch::new(token, [1, n_tok, 1], l.args)
    } else {
        Launch::new(row, [2 * n_hc + n_hc * n_hc, n_tok, 1], l.args)
    }
}

/// The HC pre layout for `n_tok` tokens (`HC_TOKEN_BLOCKS_MIN_TOKENS`).
pub fn hc_per_token(n_tok: u32) -> bool {
    n_tok >= HC_TOKEN_BLOCKS_MIN_TOKENS
}

#[cfg(test)]
mod tests {
    use super::super::{
        ExpertFormat, ExpertTiles, NULL, Q8Act, Q8K, Q8Proj, Q8Swiglu, argmax, gemm_f16, gemm_q8_0, gemm_q8_0_swiglu,
        matvec_q8_0, matvec_q8_0_swiglu, moe_gemm_down, moe_gemm_gate_up,
    };
    use super::*;

    #[test]
    fn twins_keep_the_arguments_and_regrid_the_q8_0_matvecs() {
        let x = Q8Act { q: 3, d: 4 };
        let l = matvec_q8_0(&Q8Proj::plain(1, 2, x, 4096, 1000), 3);
        let f = fast_twin(&l).expect("a twin");
        assert_eq!(f.kernel.name, "ds4_matvec_q8_0_fast");
        assert_eq!(f.args, l.args);
        // 16 chunks per row: rounds of 8 rows, one a block.
        assert_eq!(f.grid, [1000u32.div_ceil(8), 3, 1]);
        // The LM head: 16,160 rounds in 261 runs of 62 (at most Q8_0_FAST_MAX_BLOCKS).
        assert_eq!(q8_0_fast_blocks(4096, 129280, Q8_0_FAST_MAX_BLOCKS), 261);
        // q_b (1,024 inputs, 32,768 rows): 1,024 rounds of 32 rows in 256 runs of 4.
        assert_eq!(q8_0_fast_blocks(1024, 32768, Q8_0_FAST_MAX_BLOCKS), 256);
        // 28 chunks (not a power of two): 32 lanes a row, 8 rows a block.
        assert_eq!(q8_0_fast_blocks(7168, 77, Q8_0_FAST_MAX_BLOCKS), 10);
        assert_eq!(q8_0_fast_lanes(4096), 16);
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
            ("ds4_matvec_q8_0_swiglu_fast", [100u32.div_ceil(16), 1, 1])
        );
        let a = fast_twin(&argmax(1, 2, 129280)).unwrap();
        assert_eq!((a.kernel.name, a.grid), ("ds4_argmax_fast", [SAMPLE_FAST_BLOCKS, 1, 1]));
        // The output head's mix: 16-byte strips, so aligned pointers and n_in % 8 == 0.
        let m = fast_twin(&super::super::hc_mix(16, 32, 48, 16384, 4, 1e-6, 1)).unwrap();
        assert_eq!((m.kernel.name, m.grid), ("ds4_hc_mix_fast", [4, 1, 1]));
        assert!(fast_twin(&super::super::hc_mix(16, 32, 48, 1004, 4, 1e-6, 1)).is_none());
        assert!(fast_twin(&super::super::hc_mix(16, 36, 48, 16384, 4, 1e-6, 1)).is_none());
        let r = super::super::router(1, 2, 3, 4, 0, 5, 256, 6, 1.5, 3);
        let rf = fast_twin(&r).unwrap();
        assert_eq!(
            (rf.kernel.name, rf.grid, &rf.args),
            ("ds4_router_fast", r.grid, &r.args)
        );
        let h = super::super::tests::flash_hc_pre_fused(1);
        let hf = fast_twin(&h).unwrap();
        assert_eq!(
            (hf.kernel.name, hf.grid, &hf.args),
            ("ds4_hc_pre_fused_fast", h.grid, &h.args)
        );
        // A batch: one block per token, the same arguments.
        let hb = super::super::tests::flash_hc_pre_fused(HC_TOKEN_BLOCKS_MIN_TOKENS);
        let hbf = fast_twin(&hb).unwrap();
        assert_eq!(
            (hbf.kernel.name, hbf.grid, &hbf.args),
            ("ds4_hc_pre_token_fast", [1, HC_TOKEN_BLOCKS_MIN_TOKENS, 1], &hb.args)
        );
        let below = super::super::tests::flash_hc_pre_fused(HC_TOKEN_BLOCKS_MIN_TOKENS - 1);
        assert_eq!(fast_twin(&below).unwrap().kernel.name, "ds4_hc_pre_fused_fast");
        assert_eq!(hc_layout(hbf.clone(), false).grid, [24, HC_TOKEN_BLOCKS_MIN_TOKENS, 1]);
        assert_eq!(hc_layout(hc_layout(hbf.clone(), false), true), hbf);
        // The fused HC post + pre takes the same layouts (the flash launch's state is at 64).
        let post = |n_tok| super::super::hc_post(64, 64, 144, 0, 160, 4096, 4, n_tok);
        let f1 = fused_hc_post_pre(&post(1), &h).unwrap();
        assert_eq!((f1.kernel.name, f1.grid), ("ds4_hc_post_pre_fast", [24, 1, 1]));
        assert_eq!((arg(&f1, "hc_in"), arg(&f1, "hc_out")), (Arg::Ptr(64), Arg::Ptr(64)));
        // Out of place: the post reads 32 and writes 64, where the pre reads.
        let apart = super::super::hc_post(64, 32, 144, 0, 160, 4096, 4, 1);
        let f2 = fused_hc_post_pre(&apart, &h).unwrap();
        assert_eq!((arg(&f2, "hc_in"), arg(&f2, "hc_out")), (Arg::Ptr(32), Arg::Ptr(64)));
        // A post writing elsewhere than the pre reads is not fused.
        let elsewhere = super::super::hc_post(96, 64, 144, 0, 160, 4096, 4, 1);
        assert!(fused_hc_post_pre(&elsewhere, &h).is_none());
        let fb = fused_hc_post_pre(&post(HC_TOKEN_BLOCKS_MIN_TOKENS), &hb).unwrap();
        assert_eq!(
            (fb.kernel.name, fb.grid),
            ("ds4_hc_post_pre_token_fast", [1, HC_TOKEN_BLOCKS_MIN_TOKENS, 1])
        );
        assert!(fast_twin(&super::super::fill_f32(NULL, 4, 0.0)).is_none());
        // F16: 4 to 7 words a thread (4096: 128 threads, 2 rows a block), at most a block a row.
        let f = fast_twin(&super::super::matvec_f16(1, 2, 3, 4096, 256, 4096, 2)).unwrap();
        assert_eq!((f.kernel.name, f.grid), ("ds4_matvec_f16_fast", [256 / 2, 2, 1]));
        assert_eq!(
            (f16_fast_threads(72), f16_fast_threads(65536), f16_fast_threads(1024)),
            (2, 256, 32)
        );
        let p = fast_twin(&super::super::matvec_f16_pair(1, 2, 3, 4, 5, 64, 10, 64, 1)).unwrap();
        assert_eq!((p.kernel.name, p.grid), ("ds4_matvec_f16_pair_fast", [1, 1, 1]));
    }

    #[test]
    fn attention_slice_rows_are_whole_rounds_up_to_256() {
        assert!([8, 16, 32, 256].into_iter().all(attention_rows_valid));
        assert!(![0, 4, 12, 264, 512].into_iter().any(attention_rows_valid));
        assert!(attention_rows_valid(FastGrids::default().attention_rows));
        assert!([8, 16, 64, 256].into_iter().all(moe_rows_valid));
        assert!(![0, 4, 24, 512].into_iter().any(moe_rows_valid));
        assert!(moe_rows_valid(FastGrids::default().moe_rows));
        // The environment variables accept exactly these values (backend::knobs is the parser).
        let accepts = |name: &str, n: u32| {
            crate::backend::knobs::check(crate::backend::knobs::knob_named(name).unwrap(), &n.to_string()).is_ok()
        };
        for n in 0..600 {
            assert_eq!(accepts(ATTENTION_ROWS_ENV, n), attention_rows_valid(n), "{n}");
            assert_eq!(accepts(MOE_ROWS_ENV, n), moe_rows_valid(n), "{n}");
            let mma = n == 0 || (n.is_multiple_of(16) && attention_rows_valid(n));
            assert_eq!(accepts(ATTENTION_MMA_ENV, n), mma, "{n}");
        }
        // ... and document these defaults (docs/configuration.md is checked against the registry).
        let g = FastGrids::default();
        for (name, value) in [
            (Q8_0_FAST_BLOCKS_ENV, g.q8_0_max_blocks),
            (ATTENTION_ROWS_ENV, g.attention_rows),
            (ATTENTION_MMA_ENV, g.attention_mma_rows),
            (MOE_ROWS_ENV, g.moe_rows),
            (INDEXER_DECODE_TOKENS_ENV, g.indexer_decode_tokens),
        ] {
            assert_eq!(
                crate::backend::knobs::knob_named(name).unwrap().default,
                value.to_string(),
                "{name}"
            );
        }
    }

    #[test]
    fn compressor_pooling_has_a_parallel_twin() {
        let l = super::super::compressor_pool(1, 2, 3, 4, 5, 6, 7, 512, 4, 2048, 100);
        let f = fast_twin(&l).unwrap();
        assert_eq!((f.kernel.name, &f.args), ("ds4_compressor_pool_fast", &l.args));
        assert_eq!(f.grid, [512 / COMPRESSOR_FAST_DIMS, 1, 1]);
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
        for fmt in ExpertFormat::ALL {
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
