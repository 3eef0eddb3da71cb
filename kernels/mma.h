// Matrix-core tiles (fast arithmetic mode only): one 16 x 16 output tile per group of 32 threads
// ("MMA group": threads 32g .. 32g + 31 of a block), whatever the target does underneath:
//   gfx11 (RDNA3, wave32)   v_wmma_*_16x16x16 (__builtin_amdgcn_wmma_*_w32)
//   gfx12 (RDNA4, wave32)   v_wmma_*_16x16x16 (__builtin_amdgcn_wmma_*_w32_gfx12)
//   sm_80+ (NVIDIA)         mma.sync m16n8k32 (int8) / m16n8k16 (f16), two per tile
//   emulator, wave32        the gfx11 builtins, emulated in kernels/emu/hip/hip_runtime.h
//   anything else           a scalar loop over shared memory (same results up to sum order)
//
// Operands are k-contiguous rows in shared memory: A holds the tile's 16 rows, B its 16 columns,
// each as a row of K elements at stride `ld` (elements) from the first, 16-byte aligned rows.
// The tile computes acc[m][n] += sum_k A[m][k] * B[n][k]. Every path distributes A and B over the
// lanes the same way (a lane's k positions in A match its k positions in B), so an operand loader
// serves both sides. Each lane owns 8 accumulator elements; mma_row(e) / mma_col(e) say which.
//
// int8 tiles take K = 32 (one Q8_0 block: exact i32 sums); f16 tiles take K = 16 with f32
// accumulation (the products are exact, the sum order is the hardware's).
#pragma once
#include "prelude.h"

#if defined(DS4_EMU) && DS4_EMU_WARP == 32
#define DS4_MMA_WMMA 11  // the emulated gfx11 builtins
#elif defined(DS4_EMU)
#define DS4_MMA_SCALAR 1
#elif defined(__GFX11__) && DS4_WARP == 32
#define DS4_MMA_WMMA 11
#elif defined(__GFX12__) && DS4_WARP == 32
#define DS4_MMA_WMMA 12
#elif defined(DS4_NVIDIA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define DS4_MMA_PTX 1
#else
#define DS4_MMA_SCALAR 1
#endif

#define DS4_MMA_GROUP 32  // threads per MMA group

DS4_DEV u32 mma_lane() { return threadIdx.x % DS4_MMA_GROUP; }
DS4_DEV u32 mma_group() { return threadIdx.x / DS4_MMA_GROUP; }

struct MmaAccI {
    int v[8];
};
struct MmaAccF {
    float v[8];
};
DS4_DEV void mma_zero(MmaAccI& a) {
#pragma unroll
    for (int e = 0; e < 8; ++e) a.v[e] = 0;
}
DS4_DEV void mma_zero(MmaAccF& a) {
#pragma unroll
    for (int e = 0; e < 8; ++e) a.v[e] = 0.0f;
}

// Tile row / column of this lane's accumulator element e (0 .. 7).
DS4_DEV u32 mma_row(int e) {
    const u32 l = mma_lane();
#if defined(DS4_MMA_PTX)
    return l / 4 + 8 * ((e % 4) / 2);
#elif DS4_MMA_WMMA == 12
    return (u32)e + 8 * (l / 16);
#else
    return 2 * (u32)e + l / 16;
#endif
}
DS4_DEV u32 mma_col(int e) {
    const u32 l = mma_lane();
#if defined(DS4_MMA_PTX)
    return 8 * (e / 4) + 2 * (l % 4) + (e % 2);
#else
    return l % 16;
#endif
}

// ---------------------------------------------------------------------------------------------
// Operand fragments
// ---------------------------------------------------------------------------------------------
#if defined(DS4_MMA_WMMA)
#if defined(DS4_EMU)
typedef ds4emu_v16h ds4_v16h;
typedef ds4emu_v8h ds4_v8h;
typedef ds4emu_v8f ds4_v8f;
typedef ds4emu_v8i ds4_v8i;
typedef ds4emu_v4i ds4_v4i;
typedef ds4emu_v2i ds4_v2i;
// Operand loads from shared memory (memcpy: the emulator's vectors are plain structs).
template <class T>
DS4_DEV void mma_ld(T& dst, const void* p) {
    memcpy(&dst, p, sizeof dst);
}
#else
typedef _Float16 ds4_v16h __attribute__((ext_vector_type(16)));
typedef _Float16 ds4_v8h __attribute__((ext_vector_type(8)));
typedef float ds4_v8f __attribute__((ext_vector_type(8)));
typedef int ds4_v8i __attribute__((ext_vector_type(8)));
typedef int ds4_v4i __attribute__((ext_vector_type(4)));
typedef int ds4_v2i __attribute__((ext_vector_type(2)));
// Operand loads from shared memory (rows 16-byte aligned: one ds_read per vector).
template <class T>
DS4_DEV void mma_ld(T& dst, const void* p) {
    dst = *(const T*)p;
}
#endif
#if DS4_MMA_WMMA == 11
// gfx11: lane l holds row l % 16, all 16 k (lanes 16-31 repeat lanes 0-15).
struct MmaFragI8 {
    ds4_v4i k[2];  // k 0-15, k 16-31
};
struct MmaFragF16 {
    ds4_v16h k;
};
DS4_DEV void mma_load(MmaFragI8& f, const i8* p, u32 ld) {
    const i8* r = p + (mma_lane() % 16) * ld;
    mma_ld(f.k[0], r);
    mma_ld(f.k[1], r + 16);
}
DS4_DEV void mma_load(MmaFragF16& f, const u16* p, u32 ld) { mma_ld(f.k, p + (mma_lane() % 16) * ld); }
#else
// gfx12: lane l holds row l % 16, half of k (lanes 0-15 the first, 16-31 the second half).
struct MmaFragI8 {
    ds4_v2i k[2];
};
struct MmaFragF16 {
    ds4_v8h k;
};
DS4_DEV void mma_load(MmaFragI8& f, const i8* p, u32 ld) {
    const i8* r = p + (mma_lane() % 16) * ld + 8 * (mma_lane() / 16);
    mma_ld(f.k[0], r);
    mma_ld(f.k[1], r + 16);
}
DS4_DEV void mma_load(MmaFragF16& f, const u16* p, u32 ld) {
    mma_ld(f.k, p + (mma_lane() % 16) * ld + 8 * (mma_lane() / 16));
}
#endif
// One target builtin per tile shape (gfx11 and gfx12 differ only in the operand widths).
#if DS4_MMA_WMMA == 11
#define DS4_WMMA_IU8 __builtin_amdgcn_wmma_i32_16x16x16_iu8_w32
#define DS4_WMMA_F16 __builtin_amdgcn_wmma_f32_16x16x16_f16_w32
#else
#define DS4_WMMA_IU8 __builtin_amdgcn_wmma_i32_16x16x16_iu8_w32_gfx12
#define DS4_WMMA_F16 __builtin_amdgcn_wmma_f32_16x16x16_f16_w32_gfx12
#endif
// Runs `step` on the accumulator as the builtins' vector type V.
template <class V, class Acc, class Step>
DS4_DEV void wmma_on(Acc& acc, Step&& step) {
    V c;
#pragma unroll
    for (int e = 0; e < 8; ++e) c[e] = acc.v[e];
    c = step(c);
#pragma unroll
    for (int e = 0; e < 8; ++e) acc.v[e] = c[e];
}
DS4_DEV void mma_i8(MmaAccI& acc, const MmaFragI8& a, const MmaFragI8& b) {
    wmma_on<ds4_v8i>(acc, [&](ds4_v8i c) {
#pragma unroll
        for (int h = 0; h < 2; ++h) c = DS4_WMMA_IU8(true, a.k[h], true, b.k[h], c, false);
        return c;
    });
}
DS4_DEV void mma_f16(MmaAccF& acc, const MmaFragF16& a, const MmaFragF16& b) {
    wmma_on<ds4_v8f>(acc, [&](ds4_v8f c) { return DS4_WMMA_F16(a.k, b.k, c); });
}

#elif defined(DS4_MMA_PTX)
// sm_80+: g = lane / 4, t = lane % 4. r[0] = row g, r[1] = row g + 8 at k0; r[2], r[3] the same rows
// at k0 + K/2 (int8: k0 = 4t, 4 bytes; f16: k0 = 2t, 2 halves). As an A operand that is the
// m16 fragment {r0, r1, r2, r3}; as B the two n8 fragments {r0, r2} (columns g) and {r1, r3} (g + 8).
struct MmaFragI8 {
    u32 r[4];
};
struct MmaFragF16 {
    u32 r[4];
};
DS4_DEV void mma_load_rows(u32 (&r)[4], const u8* p, u32 ld_bytes, u32 k0_bytes, u32 half_bytes) {
    const u32 g = mma_lane() / 4;
    const u8* a = p + g * ld_bytes + k0_bytes;
    r[0] = *(const u32*)a;
    r[1] = *(const u32*)(a + 8 * ld_bytes);
    r[2] = *(const u32*)(a + half_bytes);
    r[3] = *(const u32*)(a + 8 * ld_bytes + half_bytes);
}
DS4_DEV void mma_load(MmaFragI8& f, const i8* p, u32 ld) { mma_load_rows(f.r, (const u8*)p, ld, 4 * (mma_lane() % 4), 16); }
DS4_DEV void mma_load(MmaFragF16& f, const u16* p, u32 ld) {
    mma_load_rows(f.r, (const u8*)p, 2 * ld, 4 * (mma_lane() % 4), 16);
}
DS4_DEV void mma_i8(MmaAccI& acc, const MmaFragI8& a, const MmaFragI8& b) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        asm volatile(
            "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};"
            : "+r"(acc.v[4 * h]), "+r"(acc.v[4 * h + 1]), "+r"(acc.v[4 * h + 2]), "+r"(acc.v[4 * h + 3])
            : "r"(a.r[0]), "r"(a.r[1]), "r"(a.r[2]), "r"(a.r[3]), "r"(b.r[h]), "r"(b.r[h + 2]));
    }
}
DS4_DEV void mma_f16(MmaAccF& acc, const MmaFragF16& a, const MmaFragF16& b) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};"
            : "+f"(acc.v[4 * h]), "+f"(acc.v[4 * h + 1]), "+f"(acc.v[4 * h + 2]), "+f"(acc.v[4 * h + 3])
            : "r"(a.r[0]), "r"(a.r[1]), "r"(a.r[2]), "r"(a.r[3]), "r"(b.r[h]), "r"(b.r[h + 2]));
    }
}

#else
// Scalar fallback: a fragment is where its rows are; the product loops over shared memory.
struct MmaFragI8 {
    const i8* p;
    u32 ld;
};
struct MmaFragF16 {
    const u16* p;
    u32 ld;
};
DS4_DEV void mma_load(MmaFragI8& f, const i8* p, u32 ld) { f = MmaFragI8{p, ld}; }
DS4_DEV void mma_load(MmaFragF16& f, const u16* p, u32 ld) { f = MmaFragF16{p, ld}; }
DS4_DEV void mma_i8(MmaAccI& acc, const MmaFragI8& a, const MmaFragI8& b) {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        const i8* x = a.p + mma_row(e) * a.ld;
        const i8* y = b.p + mma_col(e) * b.ld;
        int s = acc.v[e];
        for (int k = 0; k < 32; ++k) s += (int)x[k] * (int)y[k];
        acc.v[e] = s;
    }
}
DS4_DEV void mma_f16(MmaAccF& acc, const MmaFragF16& a, const MmaFragF16& b) {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        const u16* x = a.p + mma_row(e) * a.ld;
        const u16* y = b.p + mma_col(e) * b.ld;
        float s = acc.v[e];
        for (int k = 0; k < 16; ++k) s = fmaf(f16_to_f32(x[k]), f16_to_f32(y[k]), s);
        acc.v[e] = s;
    }
}
#endif
