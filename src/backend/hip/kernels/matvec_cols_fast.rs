//! Builders of the fast column launches of kernels/matvec_cols_fast.hip that replace two fast
//! launches (the column forms of `matvec_fast`'s `paired_matvec_q8_0` and `matvec_q8_0_quantized`):
//! the same preconditions, the bits of the launches they replace in each column, one grid row for
//! a block of 2..=`MATVEC_COLS` tokens. The plain fast column matvecs are the exact column
//! kernels' twins (`fast_twins`). The other decode fusions (the normed and row-finishing products,
//! the router's, the shared expert's quantized SwiGLU) have no column form: a column batch runs the
//! launches they replace, whose weight reads are the column products'.

use super::abi::DevPtr;
use super::abi::{KernelDef, MATVEC_Q8_0_PAIR_COLS_FAST, MATVEC_Q8_0_Q8_COLS_FAST};
use super::fast_twins::{FastGrids, q8_0_tiled};
use super::launch::{Launch, u};
use super::matvec::Q8Proj;
use super::matvec_cols::checked;
use super::matvec_fast::{matvec_q8_0_quantized, paired_matvec_q8_0};

/// The column kernel `kernel` for `n_tok` tokens in place of the single-token fused launch `l` (built
/// with `FastGrids::for_q8_0_columns`): its arguments and then n_tok, its blocks in one grid row.
fn columns_of(l: Launch, kernel: &'static KernelDef, n_tok: u32) -> Launch {
    Launch::new(kernel, [l.grid[0], 1, 1], [l.args, vec![u(checked(n_tok))]].concat())
}

/// `kernels::paired_matvec_q8_0` for `n_tok` column tokens (`ds4_matvec_q8_0_pair_cols_fast`).
pub fn paired_matvec_q8_0_cols(first: &Q8Proj, second: &Q8Proj, n_tok: u32, grids: FastGrids) -> Option<Launch> {
    paired_matvec_q8_0(first, second, 1, grids.for_q8_0_columns())
        .map(|l| columns_of(l, &MATVEC_Q8_0_PAIR_COLS_FAST, n_tok))
}

/// `kernels::matvec_q8_0_quantized` for `n_tok` column tokens (`ds4_matvec_q8_0_q8_cols_fast`).
pub fn matvec_q8_0_quantized_cols(
    p: &Q8Proj,
    planes: (DevPtr, DevPtr),
    n_tok: u32,
    grids: FastGrids,
) -> Option<Launch> {
    matvec_q8_0_quantized(p, planes, 1, grids.for_q8_0_columns())
        .map(|l| columns_of(l, &MATVEC_Q8_0_Q8_COLS_FAST, n_tok))
}

/// Whether the fast Q8_0 column kernels take a shape in their register-held form
/// (kernels/matvec_cols_fast.hip `q8_held`): tiled rows of `warp_size / 8` to 32 chunks of 256, and
/// the 4 rows a lane holds in one activation group (`rows_per_group` a multiple of 4, or at least
/// `n_rows`). Other shapes reload every column's activations each round.
pub fn q8_0_cols_held(n_in: u32, n_rows: u32, rows_per_group: u32, warp_size: u32) -> bool {
    let chunks = n_in / 256;
    q8_0_tiled(n_in)
        && (warp_size / 8..=32).contains(&chunks)
        && (rows_per_group.is_multiple_of(4) || rows_per_group >= n_rows)
}
