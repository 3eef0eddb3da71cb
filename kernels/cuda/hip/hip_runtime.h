// Device-side HIP-on-CUDA compatibility header, used ONLY by the nvcc build
// (tools/build-kernels-nvcc.sh passes -Ikernels/cuda so that `#include <hip/hip_runtime.h>`
// resolves here). The HIP 5.2 NVIDIA headers that Debian ships do not compile with CUDA 12/13,
// and the kernels only need the device-side names below.
#pragma once
#include <cuda_runtime.h>
#include <cuda_fp16.h>

#ifndef __HIP_PLATFORM_NVIDIA__
#define __HIP_PLATFORM_NVIDIA__ 1
#endif

// HIP's shuffles take no mask; on NVIDIA every lane of the warp takes part in ours.
template <typename T>
__device__ __forceinline__ T __shfl_xor(T v, int lane_mask, int width = 32) {
    return __shfl_xor_sync(0xffffffffu, v, lane_mask, width);
}
template <typename T>
__device__ __forceinline__ T __shfl_down(T v, unsigned int delta, int width = 32) {
    return __shfl_down_sync(0xffffffffu, v, delta, width);
}
template <typename T>
__device__ __forceinline__ T __shfl_up(T v, unsigned int delta, int width = 32) {
    return __shfl_up_sync(0xffffffffu, v, delta, width);
}
template <typename T>
__device__ __forceinline__ T __shfl(T v, int src_lane, int width = 32) {
    return __shfl_sync(0xffffffffu, v, src_lane, width);
}
