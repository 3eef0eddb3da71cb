// ds4-chat GPU kernels: the single translation unit compiled into one code object per target
// (gfx11xx/gfx12xx code objects by build.rs via tools/build-kernels-amd.sh, sm_90 cubin by
// tools/build-kernels-nvcc.sh). Each included file is one concept; all kernels are extern "C" with
// the argument lists documented in their header comments and mirrored in src/backend/hip/kernels.rs.
#include "norm_quant.hip"
#include "matvec.hip"
#include "moe.hip"
#include "hc.hip"
#include "rows.hip"
#include "attention.hip"
#include "compressor.hip"
#include "indexer.hip"
#include "sample.hip"
#include "gemm.hip"
#include "gemm_fast.hip"
#include "gemm_quant_fast.hip"
#include "attention_prefill_fast.hip"
#include "compressor_fast.hip"
// Fast-arithmetic twins of decode kernels (docs/arithmetic.md): selected by HipOptions::arithmetic.
#include "norm_quant_fast.hip"
#include "hc_fast.hip"
#include "rows_fast.hip"
#include "matvec_fast.hip"
#include "matvec_heads_fast.hip"
#include "moe_fast.hip"
#include "sample_fast.hip"
#include "attention_fast.hip"
#include "indexer_fast.hip"
