// CPU emulation of the device-side HIP names the ds4 kernels use, for tests on machines without a
// GPU (tests/hip_kernels, tests/hip_emu*). Selected by -DDS4_EMU with -Ikernels/emu, so that
// kernels/prelude.h's `#include <hip/hip_runtime.h>` lands here.
//
// Model: the blocks of a launch run one after another; the threads of a block are cooperative
// fibers (ucontext) on one OS thread, switching only at __syncthreads, shuffles and warp syncs. So
// `__shared__` can simply be `static` (one block alive at a time), atomics need no locking, and a
// kernel whose threads do not all reach a barrier deadlocks loudly instead of silently working.
// DS4_EMU_WARP (32 or 64) sets the emulated wave size.
#pragma once
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <type_traits>

#ifndef DS4_EMU_WARP
#define DS4_EMU_WARP 32
#endif

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static

struct ds4emu_dim3 {
    unsigned x, y, z;
};
extern ds4emu_dim3 threadIdx, blockIdx, blockDim, gridDim;

void __syncthreads();
void ds4emu_warp_sync();
void ds4emu_shfl_exchange(uint64_t mine, unsigned src_thread, uint64_t* out);

// The value of v in lane `src` of this thread's wave.
template <typename T>
inline T ds4emu_shfl_lane(T v, unsigned src) {
    static_assert(sizeof(T) <= 8, "shuffle of a type wider than 8 bytes");
    uint64_t bits = 0, got = 0;
    memcpy(&bits, &v, sizeof(T));
    ds4emu_shfl_exchange(bits, threadIdx.x - threadIdx.x % DS4_EMU_WARP + src, &got);
    T r;
    memcpy(&r, &got, sizeof(T));
    return r;
}
// Within aligned segments of `width` lanes: lane ^ mask, and lane `src_lane` of the segment.
template <typename T>
inline T __shfl_xor(T v, int mask, int width = DS4_EMU_WARP) {
    const unsigned lane = threadIdx.x % DS4_EMU_WARP;
    const unsigned seg = lane / (unsigned)width * (unsigned)width;
    return ds4emu_shfl_lane(v, seg + ((lane - seg) ^ (unsigned)mask) % (unsigned)width);
}
template <typename T>
inline T __shfl(T v, int src_lane, int width = DS4_EMU_WARP) {
    const unsigned lane = threadIdx.x % DS4_EMU_WARP;
    return ds4emu_shfl_lane(v, lane / (unsigned)width * (unsigned)width + (unsigned)src_lane % (unsigned)width);
}

template <typename A, typename B>
inline typename std::common_type<A, B>::type min(A a, B b) {
    typedef typename std::common_type<A, B>::type C;
    return (C)a < (C)b ? (C)a : (C)b;
}
template <typename A, typename B>
inline typename std::common_type<A, B>::type max(A a, B b) {
    typedef typename std::common_type<A, B>::type C;
    return (C)a > (C)b ? (C)a : (C)b;
}

inline unsigned atomicAdd(unsigned* p, unsigned v) {
    unsigned o = *p;
    *p = o + v;
    return o;
}
inline void __threadfence() {}
inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline unsigned __float_as_uint(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    return u;
}

struct alignas(16) int4 {
    int x, y, z, w;
};
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
struct alignas(8) int2 {
    int x, y;
};
struct alignas(8) float2 {
    float x, y;
};
inline int4 make_int4(int x, int y, int z, int w) { return int4{x, y, z, w}; }
inline int2 make_int2(int x, int y) { return int2{x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }

// ---------------------------------------------------------------------------------------------
// WMMA (kernels/mma.h): the gfx11 wave32 builtins the matrix-core tiles call, with the hardware's
// lane layout (RDNA3 ISA, v_wmma_*_16x16x16): operand lane l holds row (A) or column (B) l % 16,
// element i = k (lanes 16-31 repeat lanes 0-15); result element e of lane l is D[2e + l / 16][l % 16].
// The lanes' operands meet in ds4emu_warp_gather (one warp barrier pair per call).
// ---------------------------------------------------------------------------------------------
template <typename T, int N>
struct ds4emu_vec {
    T v[N];
    T& operator[](int i) { return v[i]; }
    const T& operator[](int i) const { return v[i]; }
};
typedef ds4emu_vec<_Float16, 16> ds4emu_v16h;
typedef ds4emu_vec<_Float16, 8> ds4emu_v8h;
typedef ds4emu_vec<float, 8> ds4emu_v8f;
typedef ds4emu_vec<int, 8> ds4emu_v8i;
typedef ds4emu_vec<int, 4> ds4emu_v4i;
typedef ds4emu_vec<int, 2> ds4emu_v2i;

// Copies `bytes` (<= 64) from every lane of this thread's wave into all[lane * bytes].
void ds4emu_warp_gather(const void* mine, unsigned bytes, void* all);

#if DS4_EMU_WARP == 32  // wave32 instructions (the wave64 emulator runs mma.h's scalar fallback)
inline ds4emu_v8f __builtin_amdgcn_wmma_f32_16x16x16_f16_w32(ds4emu_v16h a, ds4emu_v16h b, ds4emu_v8f c) {
    ds4emu_v16h as[32], bs[32];
    ds4emu_warp_gather(&a, sizeof a, as);
    ds4emu_warp_gather(&b, sizeof b, bs);
    const unsigned l = threadIdx.x % 32;
    for (int e = 0; e < 8; ++e) {
        const unsigned m = 2 * e + l / 16, n = l % 16;
        float s = c[e];
        for (int k = 0; k < 16; ++k) s += (float)as[m][k] * (float)bs[n][k];
        c[e] = s;
    }
    return c;
}

inline ds4emu_v8i __builtin_amdgcn_wmma_i32_16x16x16_iu8_w32(bool a_signed, ds4emu_v4i a, bool b_signed,
                                                              ds4emu_v4i b, ds4emu_v8i c, bool clamp) {
    ds4emu_v4i as[32], bs[32];
    ds4emu_warp_gather(&a, sizeof a, as);
    ds4emu_warp_gather(&b, sizeof b, bs);
    const unsigned l = threadIdx.x % 32;
    auto byte = [](const ds4emu_v4i& v, int k, bool sgn) {
        const unsigned u = ((unsigned)v[k / 4] >> (8 * (k % 4))) & 0xffu;
        return sgn ? (int)(signed char)u : (int)u;
    };
    for (int e = 0; e < 8; ++e) {
        const unsigned m = 2 * e + l / 16, n = l % 16;
        long long s = c[e];
        for (int k = 0; k < 16; ++k) s += (long long)byte(as[m], k, a_signed) * byte(bs[n], k, b_signed);
        if (clamp) s = s > 2147483647LL ? 2147483647LL : s < -2147483648LL ? -2147483648LL : s;
        c[e] = (int)(unsigned)(unsigned long long)s;
    }
    return c;
}
#endif
