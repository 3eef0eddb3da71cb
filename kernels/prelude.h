// ds4-chat GPU kernels: the one header that hides the differences between AMD (clang -x hip,
// HIP headers) and NVIDIA (nvcc -x cu with kernels/cuda/hip/hip_runtime.h).
//
// Everything that differs between the vendors lives here: wave size, shuffles, the int8 dot4
// instruction, f16 conversion, launch bounds. The kernel sources use only the DS4_* names below.
//
// Conventions shared by every kernel (docs/model.md#tensor-conventions):
//   * All pointers are device pointers; every size/index argument is a 32-bit unsigned `u32`
//     unless it can exceed 2^32 (then `u64`). Floats are f32 scalars.
//   * Every kernel states its launch shape (grid, block) in its header comment. Block sizes are
//     fixed constants that do not depend on the wave size, so the host side (src/backend/hip/
//     kernels.rs) computes the same grid for wave32 and wave64 devices.
//   * Kernels never assume a wave of 32 where it matters: reductions use DS4_WARP, and the few
//     places that need groups of exactly 32 lanes use width-32 shuffles (valid on wave64 too).
#pragma once

#include <hip/hip_runtime.h>
#include <stdint.h>

typedef uint32_t u32;
typedef int32_t i32;
typedef uint64_t u64;
typedef uint16_t u16;
typedef int16_t i16;
typedef uint8_t u8;
typedef int8_t i8;

// ---------------------------------------------------------------------------------------------
// Wave size
// ---------------------------------------------------------------------------------------------
#if defined(DS4_EMU)
// CPU emulation for tests (kernels/emu): the emulated wave size is a build parameter.
#define DS4_WARP DS4_EMU_WARP
#elif defined(__HIP_PLATFORM_NVIDIA__) || defined(__CUDACC__)
#define DS4_NVIDIA 1
#define DS4_WARP 32
#elif defined(__AMDGCN_WAVEFRONT_SIZE)
#define DS4_AMD 1
#define DS4_WARP __AMDGCN_WAVEFRONT_SIZE
#elif defined(__HIP_DEVICE_COMPILE__)
#error "ds4 kernels: unknown device wave size (expected __AMDGCN_WAVEFRONT_SIZE from clang)"
#else
// Host pass of a HIP compile: device code is not generated, the value is irrelevant.
#define DS4_AMD 1
#define DS4_WARP 64
#endif

static_assert(DS4_WARP == 32 || DS4_WARP == 64, "wave size must be 32 or 64");

// Threads per block of (almost) every kernel; see each kernel's header for its grid.
#define DS4_BLOCK 256
#define DS4_WARPS_PER_BLOCK (DS4_BLOCK / DS4_WARP)

#define DS4_LAUNCH(threads) __launch_bounds__(threads)
#define DS4_DEV static __device__ __forceinline__

// ---------------------------------------------------------------------------------------------
// Shuffles and reductions
// ---------------------------------------------------------------------------------------------
DS4_DEV float warp_sum(float v) {
#pragma unroll
    for (int o = DS4_WARP / 2; o > 0; o >>= 1) v += __shfl_xor(v, o, DS4_WARP);
    return v;
}
DS4_DEV float warp_max(float v) {
#pragma unroll
    for (int o = DS4_WARP / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor(v, o, DS4_WARP));
    return v;
}
// Max over aligned groups of 32 lanes (one Q8_0 block per group), valid for wave32 and wave64.
DS4_DEV float group32_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor(v, o, 32));
    return v;
}

// Orders shared-memory writes of a warp before reads by other lanes of the same warp.
DS4_DEV void ds4_sync_warp() {
#if defined(DS4_EMU)
    ds4emu_warp_sync();
#elif defined(DS4_NVIDIA)
    __syncwarp();
#else
    __builtin_amdgcn_fence(__ATOMIC_RELEASE, "wavefront");
    __builtin_amdgcn_wave_barrier();
    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "wavefront");
#endif
}

// ---------------------------------------------------------------------------------------------
// Dependent launches (kernels/README.md, "Dependent launches")
// ---------------------------------------------------------------------------------------------
// Every kernel calls ds4_grid_sync() once in every block, before it reads anything an earlier
// launch wrote, before its first global store and before it returns. On sm_90 a launch may then
// start while the previous one runs (the host sets the programmatic serialization attribute there):
// the wait returns once the previous grid has completed and its writes are visible, and the
// trigger after it lets the next launch's blocks start. What a block does before the call reads
// only the weights, which no launch writes. Elsewhere launches are serialized anyway: a no-op.
DS4_DEV void ds4_grid_sync() {
#if defined(DS4_NVIDIA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory");
#endif
}

DS4_DEV u32 lane_id() { return threadIdx.x % DS4_WARP; }
DS4_DEV u32 warp_id() { return threadIdx.x / DS4_WARP; }

// Whether this block's `add` brings `*counter` (u32, 0 before the launch) to `total`: the blocks
// that write a unit count what they wrote, and the one that completes it finishes it; that block
// puts the counter back, so a replayed graph counts again. Every thread of the block calls it after
// writing what the finishing block will read; that block reads those writes with volatile loads
// (another block's writes are not in this block's caches).
DS4_DEV bool last_arrival_of(u32* counter, u32 add, u32 total) {
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(counter, add) + add == total;
    __syncthreads();
    if (!last) return false;
    __threadfence();
    if (threadIdx.x == 0) *counter = 0;
    return true;
}
// Whether this block is the last of the `n` blocks that count on `*counter` (last_arrival_of).
DS4_DEV bool last_block_of(u32* counter, u32 n) { return last_arrival_of(counter, 1u, n); }

// The same dot computed by one thread (the reference's eight lanes as eight accumulators, so eight
// independent add chains): a and b 16-byte aligned, n % 8 == 0.
DS4_DEV float thread_dot8_f32(const float* a, const float* b, u32 n) {
    float l[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    for (u32 i = 0; i < n; i += 8) {
        const float4 a0 = *(const float4*)(a + i), a1 = *(const float4*)(a + i + 4);
        const float4 b0 = *(const float4*)(b + i), b1 = *(const float4*)(b + i + 4);
        l[0] += a0.x * b0.x;
        l[1] += a0.y * b0.y;
        l[2] += a0.z * b0.z;
        l[3] += a0.w * b0.w;
        l[4] += a1.x * b1.x;
        l[5] += a1.y * b1.y;
        l[6] += a1.z * b1.z;
        l[7] += a1.w * b1.w;
    }
    return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

// f32 dot of two rows of n elements (n % 8 == 0) in the CPU reference's order (cpu/quant.rs
// dot_f32): lane k of an aligned group of 8 lanes sums the products of elements k, k + 8, ... in
// order, then the lanes fold as ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)). Called by all 8
// lanes of the group; every lane of the group returns the dot.
DS4_DEV float dot8_f32(const float* a, const float* b, u32 n) {
    float l = 0.0f;
    // Unrolled so the loads of later elements issue before the earlier products are added.
#pragma unroll 8
    for (u32 i = threadIdx.x % 8; i < n; i += 8) l += a[i] * b[i];
    l += __shfl_xor(l, 4, 8);
    l += __shfl_xor(l, 2, 8);
    l += __shfl_xor(l, 1, 8);
    return l;
}

// Block-wide sums for blockDim.x == DS4_BLOCK in the order the CPU reference shares
// (src/backend/cpu/reduce.rs): a butterfly inside each aligned group of 32 threads (width-32
// shuffles, so wave32 and wave64 agree), then the DS4_GROUPS32 group totals added in group order.
// `scratch` needs DS4_GROUPS32 entries. Every thread returns the total. Contains __syncthreads():
// call from all threads.
#define DS4_GROUPS32 (DS4_BLOCK / 32)
// The first half of block_sum_of: the total of the thread's aligned group of 32, in every thread
// of the group. Kernels folding several values at once use it to keep block_sum's bits.
template <typename T>
DS4_DEV T group32_sum(T v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor(v, o, 32);
    return v;
}
template <typename T>
DS4_DEV T block_sum_of(T v, T* scratch) {
    v = group32_sum(v);
    __syncthreads();
    if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
    __syncthreads();
    T t = T(0);
#pragma unroll
    for (int g = 0; g < DS4_GROUPS32; ++g) t += scratch[g];
    return t;
}
DS4_DEV float block_sum(float v, float* scratch) { return block_sum_of(v, scratch); }
DS4_DEV double block_sum_f64(double v, double* scratch) { return block_sum_of(v, scratch); }
DS4_DEV float block_max(float v, float* scratch) {
    v = warp_max(v);
    __syncthreads();
    if (lane_id() == 0) scratch[warp_id()] = v;
    __syncthreads();
    float t = scratch[0];
#pragma unroll
    for (int w = 1; w < DS4_WARPS_PER_BLOCK; ++w) t = fmaxf(t, scratch[w]);
    return t;
}

// ---------------------------------------------------------------------------------------------
// int8 dot4: sum of 4 signed byte products plus c
// ---------------------------------------------------------------------------------------------
DS4_DEV int dot4_i8(int a, int b, int c) {
#if defined(DS4_NVIDIA)
    return __dp4a(a, b, c);
#elif defined(__GFX11__) || defined(__GFX12__)
    // RDNA3/4: v_dot4_i32_iu8 with both operands signed.
    return __builtin_amdgcn_sudot4(true, a, true, b, c, false);
#elif defined(__gfx906__) || defined(__gfx908__) || defined(__gfx90a__) || defined(__gfx940__) || \
    defined(__gfx941__) || defined(__gfx942__) || defined(__gfx1030__) || defined(__gfx1031__) ||  \
    defined(__gfx1032__) || defined(__gfx1034__) || defined(__gfx1035__) || defined(__gfx1036__)
    // v_dot4_i32_i8 ("dot1-insts").
    return __builtin_amdgcn_sdot4(a, b, c, false);
#else
    // Portable fallback for parts without a dot instruction.
    return c + (int)(i8)(a) * (int)(i8)(b) + (int)(i8)(a >> 8) * (int)(i8)(b >> 8) +
           (int)(i8)(a >> 16) * (int)(i8)(b >> 16) + (int)(i8)(a >> 24) * (int)(i8)(b >> 24);
#endif
}

// ---------------------------------------------------------------------------------------------
// f16 <-> f32 (IEEE binary16, round to nearest even; docs/gguf.md#f16)
// ---------------------------------------------------------------------------------------------
DS4_DEV float f16_to_f32(u16 h) {
#if defined(DS4_NVIDIA)
    return __half2float(__ushort_as_half(h));
#else
    return (float)__builtin_bit_cast(_Float16, h);
#endif
}
DS4_DEV u16 f32_to_f16_bits(float f) {
#if defined(DS4_NVIDIA)
    return __half_as_ushort(__float2half_rn(f));
#else
    return __builtin_bit_cast(u16, (_Float16)f);
#endif
}
// Value rounded through f16 and back: how every cached row is stored (docs/model.md#kv-cache).
DS4_DEV float round_f16(float f) { return f16_to_f32(f32_to_f16_bits(f)); }

// Round half to even, as C lrintf in the default FP mode (docs/arithmetic.md#activation-quantization).
DS4_DEV int round_even_i(float x) { return (int)rintf(x); }

// Unaligned little-endian loads for block formats whose blocks are only 2-byte aligned.
DS4_DEV u32 load_u32_2a(const u8* p) {
    const u16* q = (const u16*)p;
    return (u32)q[0] | ((u32)q[1] << 16);
}

// Reciprocals as ds4's -ffast-math build evaluates its divisions by constants (x/127 becomes
// x * (float)(1/127), etc.); the CPU reference (src/backend/cpu/quant.rs, ops.rs) does the same, so
// activation codes and FP8/FP4 block scales land on the same side of every rounding boundary.
#define DS4_RCP127 ((float)(1.0 / 127.0))
#define DS4_RCP448 ((float)(1.0 / 448.0))
#define DS4_RCP6 ((float)(1.0 / 6.0))

// The "negative infinity" sentinel of the model (docs/model.md#hyperparameters, DS4_NEG_INF): a finite float.
#define DS4_NEG_INF (-1.0e30f)

// Arithmetic contract with the CPU reference: every kernel computes the CPU engine's float operations
// in the CPU engine's order, so its results are bitwise equal to the reference's. The build never
// contracts a*b+c into a fused multiply-add (nvcc -fmad=false, clang -ffp-contract=off); where the
// reference fuses (Rust mul_add), the kernel calls fmaf. The transcendental functions are ds4_*.
#include "mathf.h"
