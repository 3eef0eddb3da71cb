// L2 prefetch of weights a later launch reads, launched on a side lane beside latency-bound work
// (src/backend/hip/lanes.rs, kernels/README.md "Concurrent chains"): while the main stream runs
// kernels that leave DRAM idle (the HC step, the norms, the attention), the lines of the next large
// matrix are asked for, so its matvec reads them from L2. The hint (kernels/prelude.h prefetch_l2)
// exists on sm_90 only; elsewhere this kernel does nothing and the host does not launch it.
#pragma once
#include "prelude.h"

// Prefetches the regions base + sel[i] * stride, i < n_sel, of `bytes` bytes each (the selected
// experts of a stacked expert tensor), or [base, base + bytes) when sel is null. Every region lies
// inside one allocation. Grid (any), block 256: the 128-byte lines grid-stride.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_prefetch_l2(const u8* base, const u32* sel, u64 stride,
                                                                  u64 bytes, u32 n_sel) {
    if (bytes == 0) return;
    const u32 n = sel ? n_sel : 1;
    const u64 lines = (bytes + 127) / 128, step = (u64)gridDim.x * blockDim.x;
    for (u32 i = 0; i < n; ++i) {
        const u8* region = base + (sel ? (u64)sel[i] * stride : 0);
        for (u64 l = (u64)blockIdx.x * blockDim.x + threadIdx.x; l < lines; l += step)
            prefetch_l2(region + min(l * 128, bytes - 1));
    }
}
