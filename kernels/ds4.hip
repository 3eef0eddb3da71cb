// ds4-chat GPU kernels: the single translation unit compiled into one code object per target
// (gfx11xx/gfx12xx code objects by build.rs via tools/build-kernels-amd.sh, sm_90 cubin by
// tools/build-kernels-nvcc.sh, the CPU emulator by tools/build-hip-emu.sh).
//
// One operation per pair of files: <op>.hip holds the exact kernels (bit for bit the CPU reference,
// kernels/prelude.h "arithmetic contract") and <op>_fast.hip the fast-arithmetic ones
// (docs/arithmetic.md), selected by HipOptions::arithmetic. All kernels are extern "C" with the
// argument lists documented in their header comments and mirrored in the kernel table,
// src/backend/hip/kernels/abi.rs. kernels/INDEX.md lists every kernel by operation.
#include "norm_quant.hip"
#include "matvec.hip"
#include "matvec_cols.hip"
#include "moe.hip"
#include "hc.hip"
#include "rows.hip"
#include "attention.hip"
#include "compressor.hip"
#include "indexer.hip"
#include "sample.hip"
#include "gemm.hip"
#include "gemm_fast.hip"
#include "attention_fast.hip"
#include "compressor_fast.hip"
#include "norm_quant_fast.hip"
#include "hc_fast.hip"
#include "rows_fast.hip"
#include "matvec_fast.hip"
#include "matvec_cols_fast.hip"
#include "moe_fast.hip"
#include "sample_fast.hip"
#include "indexer_fast.hip"
