//! Builders of kernels/attention_fast.hip: decode attention split over slices of rows (partial
//! softmax states per slice, then a merge with the sinks), the fast arithmetic's replacement of the
//! three exact attention launches for token-wise batches. The slices' partials come from CUDA-core
//! lanes (`ds4_attention_decode_split`, 8 heads a block) or from matrix cores
//! (`ds4_attention_decode_split_mma` in kernels/attention_prefill_fast.hip, 32 heads a block).

use super::abi::{
    ATTENTION_DECODE_MERGE, ATTENTION_DECODE_MERGE_Q8, ATTENTION_DECODE_SPLIT, ATTENTION_DECODE_SPLIT_MMA, Arg, DevPtr,
};
use super::attention::{ATTENTION_MAX_DIM, AttentionInputs, AttentionShape};
use super::attention_prefill::{ATTENTION_FAST_HEADS, attention_prefill_fast_fits};
use super::launch::{Launch, f, ptr, u};
use super::rows::RopeParams;

/// Heads per block of `ds4_attention_decode_split` (DS4_AFD_HEADS).
pub const ATTENTION_SPLIT_HEADS: u32 = 8;
/// Rows per slice at least, by default (the kernels' min_chunk, [`AttentionSplitPlan::min_rows`]).
/// A block's rows are a chain of dependent loads, so short slices on many blocks finish sooner: at a
/// 2k context (640 rows; 40 slices of 16 under the 64-slice cap then) fast decode measured 90.3 t/s
/// with 8, 90.0 with 16 and 88.3 with 32 on an H200 (Flash-shaped q2 file, interleaved runs,
/// 2026-12-02, tests/hip-on-cuda/run-bench.sh). The partials, n_head x head_dim floats
/// a slice, stay in the cache. `DS4_HIP_ATTENTION_ROWS` overrides it for tuning (`FastGrids`).
pub const ATTENTION_SPLIT_ROWS: u32 = 8;
/// Rows per slice at least of the matrix-core split (`ds4_attention_decode_split_mma`) when it is
/// asked for (`DS4_HIP_ATTENTION_MMA=16`; off by default, kernels/README.md): one 16-row
/// tile step a slice, so a 2k context's 640 rows are 40 slices of two blocks (32 heads each), one
/// wave. On an H100 it measured within the spread of the CUDA-core split (+0.5% / +0.3% at 2k / 8k,
/// 3 runs, 2026-12-06) and slices of 32 rows slower; its f16
/// operands made one confident argmax flip on the emulator's mixed tiny model (tests/hip_emu_fast.rs),
/// which the CUDA-core split does not.
pub const ATTENTION_SPLIT_MMA_ROWS: u32 = 16;
/// Dims of a head per block of the merges (DS4_AFM_DIMS).
pub const ATTENTION_MERGE_DIMS: u32 = 128;
/// Slice lengths are multiples of this (DS4_AFD_ROUND).
pub const ATTENTION_SLICE_ROUND: u32 = 8;
/// Most slices per token: bounds the merge and the partial buffer (128 slices of 65 rows at the
/// 8,320 rows of a ratio-128 layer at 1M tokens; the 640 rows of a 2k step in slices of 8, a
/// block each: a slice's rows are a chain of dependent loads, so shorter is sooner).
pub const ATTENTION_MAX_SPLITS: u32 = 128;

/// The partial buffers of a split decode attention, carved from one scratch buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionSplitPlan {
    /// Blocks per token (the split kernel's grid x, the partial buffers' slices per head): at
    /// least the slices any token of the batch uses.
    pub n_split: u32,
    /// The slice count a token's rows are divided by (kernels' afd_slices): fixed for a session and
    /// batch size, so the slices, and the bits, do not depend on the grid; a token with r rows uses
    /// ceil(r / max(min_rows, ceil(r / most_slices) rounded up to 8)) slices.
    pub most_slices: u32,
    /// Rows per slice at least (kernels' min_chunk): a multiple of [`ATTENTION_SLICE_ROUND`].
    pub min_rows: u32,
    /// Whether matrix cores compute the slices (`ds4_attention_decode_split_mma`; head_dim a
    /// multiple of 64, 32-lane warps) rather than CUDA-core lanes (`ds4_attention_decode_split`).
    /// The same slices and partial layout either way, so the same merge.
    pub matrix_cores: bool,
}

impl AttentionSplitPlan {
    /// The plan for a batch of `n_tok` tokens none of which sees more than `max_rows` rows, slices of
    /// at least `min_rows` rows, and `scratch_floats` floats of scratch for the partials, computed on
    /// `matrix_cores` or not; `None` when the shape or `min_rows` misses the kernels' preconditions or
    /// not even one slice fits (the exact launches then run).
    pub fn new(
        shape: &AttentionShape,
        n_tok: u32,
        max_rows: u32,
        scratch_floats: usize,
        min_rows: u32,
        matrix_cores: bool,
    ) -> Option<Self> {
        let shape_ok = min_rows.is_multiple_of(ATTENTION_SLICE_ROUND)
            && min_rows > 0
            && shape.n_head.is_multiple_of(ATTENTION_SPLIT_HEADS)
            && shape.head_dim.is_multiple_of(4)
            && shape.head_dim > 0
            && shape.head_dim <= ATTENTION_MAX_DIM
            && (!matrix_cores || attention_prefill_fast_fits(shape));
        if !shape_ok || n_tok == 0 {
            return None;
        }
        let per_slice = n_tok as usize * shape.n_head as usize * (shape.head_dim as usize + 2);
        let most_slices = (scratch_floats / per_slice).min(ATTENTION_MAX_SPLITS as usize) as u32;
        let n_split = max_rows.max(1).div_ceil(min_rows).min(most_slices);
        (n_split > 0).then_some(AttentionSplitPlan {
            n_split,
            most_slices,
            min_rows,
            matrix_cores,
        })
    }

    /// Floats of the partial values [n_tok][n_head][n_split][head_dim]; the (max, sum) pairs
    /// [n_tok][n_head][n_split][2] follow them in the scratch buffer.
    pub fn acc_floats(&self, shape: &AttentionShape, n_tok: u32) -> usize {
        n_tok as usize * shape.n_head as usize * self.n_split as usize * shape.head_dim as usize
    }
}

/// `ds4_attention_decode_split` then `ds4_attention_decode_merge`: the attention of
/// `kernels::attention` (same rows, selection and sinks, same output layout) with the rows of
/// each token split over `plan.n_split` slices; `scratch` holds the partials
/// ([`AttentionSplitPlan::acc_floats`] + 2 n_tok n_head n_split floats). Grids
/// (n_split, n_head / 8, n_tok) and (ceil(head_dim / 128), n_head, n_tok).
pub fn attention_decode_split(
    shape: &AttentionShape,
    plan: AttentionSplitPlan,
    out: DevPtr,
    scratch: DevPtr,
    io: &AttentionInputs,
    n_tok: u32,
) -> [Launch; 2] {
    let (split, merge_args) = split_and_merge_args(shape, plan, scratch, io, n_tok);
    let merge = Launch::new(
        &ATTENTION_DECODE_MERGE,
        merge_grid(shape, n_tok),
        [vec![ptr(out)], merge_args].concat(),
    );
    [split, merge]
}

/// [`attention_decode_split`] with the merge's next two steps fused into it
/// (`ds4_attention_decode_merge_q8`): the heads' inverse RoPE (`rope`) and their Q8_0 codes `q_out`
/// [n_tok][n_head][head_dim] and scales `d_out` [n_tok][n_head][head_dim / 32], with the bits of
/// the merge, `ds4_rows_finish_fast` (RoPE | ROPE_INVERSE) and `ds4_rms_norm_quant_fast` (no norm)
/// in turn; the f32 output is not written. `None` unless head_dim % 32 == 0 and n_rot is even and
/// at most head_dim.
pub fn attention_decode_split_q8(
    shape: &AttentionShape,
    plan: AttentionSplitPlan,
    rope: RopeParams,
    (q_out, d_out): (DevPtr, DevPtr),
    scratch: DevPtr,
    io: &AttentionInputs,
    n_tok: u32,
) -> Option<[Launch; 2]> {
    let fits = shape.head_dim.is_multiple_of(32) && rope.n_rot.is_multiple_of(2) && rope.n_rot <= shape.head_dim;
    if !fits {
        return None;
    }
    let (split, merge_args) = split_and_merge_args(shape, plan, scratch, io, n_tok);
    let args = [
        vec![ptr(q_out), ptr(d_out)],
        merge_args,
        vec![u(rope.n_rot)],
        rope.angle_args().to_vec(),
    ]
    .concat();
    Some([
        split,
        Launch::new(&ATTENTION_DECODE_MERGE_Q8, merge_grid(shape, n_tok), args),
    ])
}

/// The merges' grid: blocks of [`ATTENTION_MERGE_DIMS`] dims of a head.
fn merge_grid(shape: &AttentionShape, n_tok: u32) -> [u32; 3] {
    [shape.head_dim.div_ceil(ATTENTION_MERGE_DIMS), shape.n_head, n_tok]
}

/// The split launch and the merge's arguments after its output(s).
fn split_and_merge_args(
    shape: &AttentionShape,
    plan: AttentionSplitPlan,
    scratch: DevPtr,
    io: &AttentionInputs,
    n_tok: u32,
) -> (Launch, Vec<Arg>) {
    let part_ml = scratch + 4 * plan.acc_floats(shape, n_tok) as u64;
    let scale = 1.0 / (shape.head_dim as f32).sqrt();
    let (kernel, heads) = match plan.matrix_cores {
        true => (&ATTENTION_DECODE_SPLIT_MMA, ATTENTION_FAST_HEADS),
        false => (&ATTENTION_DECODE_SPLIT, ATTENTION_SPLIT_HEADS),
    };
    let split = Launch::new(
        kernel,
        [plan.n_split, shape.n_head.div_ceil(heads), n_tok],
        [
            &[ptr(scratch), ptr(part_ml), ptr(io.q)][..],
            &io.row_args(shape),
            &[u(plan.n_split), u(plan.most_slices), u(plan.min_rows), f(scale)],
        ]
        .concat(),
    );
    let merge_args = vec![
        ptr(scratch),
        ptr(part_ml),
        ptr(io.sinks),
        ptr(io.comp_sel),
        ptr(io.pos),
        u(shape.n_head),
        u(shape.head_dim),
        u(shape.window),
        u(io.n_comp_avail),
        u(shape.ratio),
        u(shape.top_k),
        u(plan.n_split),
        u(plan.most_slices),
        u(plan.min_rows),
    ];
    (split, merge_args)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_plan_aims_at_the_slice_rows_within_the_scratch() {
        let s = AttentionShape::flash_ratio4();
        let big = usize::MAX / 2;
        let plan = |rows, scratch| AttentionSplitPlan::new(&s, 1, rows, scratch, ATTENTION_SPLIT_ROWS, false);
        assert_eq!(plan(640, big).unwrap().n_split, 80);
        assert_eq!(plan(17, big).unwrap().n_split, 3);
        assert_eq!(plan(8320, big).unwrap().n_split, 128);
        // The scratch of a decode-only session (one token's scores over 640 rows) holds one slice.
        let one = plan(640, 64 * 640).unwrap();
        assert_eq!((one.n_split, one.most_slices), (1, 1));
        // Fewer rows (a direct launch at an early position) change the grid, not the slicing.
        let early = plan(100, big).unwrap();
        assert_eq!((early.n_split, early.most_slices, early.min_rows), (13, 128, 8));
        assert!(plan(640, 64 * 513).is_none());
        let odd = AttentionShape { n_head: 12, ..s };
        assert!(AttentionSplitPlan::new(&odd, 1, 640, big, 32, false).is_none());
        // Longer slices: fewer blocks.
        assert_eq!(AttentionSplitPlan::new(&s, 1, 640, big, 16, false).unwrap().n_split, 40);
        assert_eq!(AttentionSplitPlan::new(&s, 1, 640, big, 32, false).unwrap().n_split, 20);
        assert!(AttentionSplitPlan::new(&s, 1, 640, big, 12, false).is_none());
        assert!(AttentionSplitPlan::new(&s, 1, 640, big, 0, false).is_none());
        // Matrix cores: the same slicing, head_dim a multiple of 64.
        let mma = AttentionSplitPlan::new(&s, 1, 640, big, ATTENTION_SPLIT_MMA_ROWS, true).unwrap();
        assert_eq!((mma.n_split, mma.min_rows, mma.matrix_cores), (40, 16, true));
        let narrow = AttentionShape { head_dim: 96, ..s };
        assert!(AttentionSplitPlan::new(&narrow, 1, 640, big, 16, true).is_none());
        assert!(AttentionSplitPlan::new(&narrow, 1, 640, big, 16, false).is_some());
        let plan = AttentionSplitPlan {
            n_split: 20,
            most_slices: 64,
            min_rows: 32,
            matrix_cores: false,
        };
        let io = AttentionInputs {
            q: 3,
            ring: 4,
            comp: 5,
            comp_sel: 6,
            sinks: 7,
            pos: 8,
            n_comp_avail: 100,
        };
        let [a, b] = attention_decode_split(&s, plan, 1, 0x1000, &io, 1);
        assert_eq!((a.grid, b.grid), ([20, 8, 1], [4, 64, 1]));
        assert_eq!(a.args[1], ptr(0x1000 + 4 * 64 * 20 * 512));
        // On matrix cores: 32 heads a block, the same partials and merge.
        let on_mma = AttentionSplitPlan {
            matrix_cores: true,
            ..plan
        };
        let [c, d] = attention_decode_split(&s, on_mma, 1, 0x1000, &io, 1);
        assert_eq!(
            (c.kernel.name, c.grid, d.grid),
            ("ds4_attention_decode_split_mma", [20, 2, 1], [4, 64, 1])
        );
        assert_eq!((c.args.clone(), d.args.clone()), (a.args.clone(), b.args.clone()));
    }
}
