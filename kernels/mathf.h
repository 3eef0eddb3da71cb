// The float transcendental functions of the forward pass, one definition shared bit for bit with the
// CPU reference (src/backend/cpu/transcend.rs): ds4 calls glibc's expf/log1pf/sinf/cosf/log2f, the
// case A vectors are that close to those values, and a vendor's float function that differs in the
// last bit for some inputs moves activations across Q8 rounding boundaries. Every kernel calls these
// names, never expf/sinf/... directly.
//
// These are the algorithms glibc 2.36 runs on x86_64 with FMA, step for step as transcend.rs (whose
// module comment describes them: ARM optimized-routines' expf / sinf / cosf / log2f evaluated in
// double, and the fdlibm-style float log1pf). fma() stands exactly where the Rust code calls
// f64::mul_add; everything else is one IEEE operation per C operator, because the kernels are built
// without contraction (nvcc -fmad=false, clang and the emulator -ffp-contract=off). Needs IEEE float
// division and subnormals (no fast-math / flush-to-zero flags). The tables below are the Rust tables'
// bit patterns; the test transcend::tests::kernel_header_tables_match compares them.
#pragma once

// ---- bit casts --------------------------------------------------------------------------------
// One bit cast per pair of types: memcpy on the emulator, the intrinsic on NVIDIA, the builtin
// elsewhere.
#if defined(DS4_EMU)
#define DS4M_BIT_CAST(name, To, From, nvidia) \
    DS4_DEV To name(From x) {                  \
        To y;                                  \
        memcpy(&y, &x, sizeof(y));             \
        return y;                              \
    }
#elif defined(DS4_NVIDIA)
#define DS4M_BIT_CAST(name, To, From, nvidia) \
    DS4_DEV To name(From x) { return (To)nvidia(x); }
#else
#define DS4M_BIT_CAST(name, To, From, nvidia) \
    DS4_DEV To name(From x) { return __builtin_bit_cast(To, x); }
#endif
DS4M_BIT_CAST(ds4m_f2u, u32, float, __float_as_uint)
DS4M_BIT_CAST(ds4m_u2f, float, u32, __uint_as_float)
DS4M_BIT_CAST(ds4m_d2u, u64, double, __double_as_longlong)
DS4M_BIT_CAST(ds4m_u2d, double, u64, __longlong_as_double)
#undef DS4M_BIT_CAST

// ---- tables (bit patterns; see transcend.rs for what each holds) -----------------------------
// In global memory; -DDS4M_CONST_TABLES=1 (an experiment, nvcc only) puts them in constant memory.
#if defined(DS4M_CONST_TABLES) && defined(DS4_NVIDIA)
#define DS4M_TABLE __constant__ static const
#else
#define DS4M_TABLE __device__ static const
#endif
// 2^(i/32) as double bits minus i << 47.
DS4M_TABLE unsigned long long ds4m_exp2_table[32] = {
    0x3ff0000000000000ull, 0x3fefd9b0d3158574ull, 0x3fefb5586cf9890full, 0x3fef9301d0125b51ull,
    0x3fef72b83c7d517bull, 0x3fef54873168b9aaull, 0x3fef387a6e756238ull, 0x3fef1e9df51fdee1ull,
    0x3fef06fe0a31b715ull, 0x3feef1a7373aa9cbull, 0x3feedea64c123422ull, 0x3feece086061892dull,
    0x3feebfdad5362a27ull, 0x3feeb42b569d4f82ull, 0x3feeab07dd485429ull, 0x3feea47eb03a5585ull,
    0x3feea09e667f3bcdull, 0x3fee9f75e8ec5f74ull, 0x3feea11473eb0187ull, 0x3feea589994cce13ull,
    0x3feeace5422aa0dbull, 0x3feeb737b0cdc5e5ull, 0x3feec49182a3f090ull, 0x3feed503b23e255dull,
    0x3feee89f995ad3adull, 0x3feeff76f2fb5e47ull, 0x3fef199bdd85529cull, 0x3fef3720dcef9069ull,
    0x3fef5818dcfba487ull, 0x3fef7c97337b9b5full, 0x3fefa4afa2a490daull, 0x3fefd0765b6e4540ull,
};
// 32-bit windows of the fraction bits of 2/pi sliding by one byte (entry i = bytes i-3 ..= i).
DS4M_TABLE unsigned int ds4m_four_over_pi[24] = {
    0x000000a2u, 0x0000a2f9u, 0x00a2f983u, 0xa2f9836eu, 0xf9836e4eu, 0x836e4e44u, 0x6e4e4415u, 0x4e441529u,
    0x441529fcu, 0x1529fc27u, 0x29fc2757u, 0xfc2757d1u, 0x2757d1f5u, 0x57d1f534u, 0xd1f534ddu, 0xf534ddc0u,
    0x34ddc0dbu, 0xddc0db62u, 0xc0db6295u, 0xdb629599u, 0x6295993cu, 0x95993c43u, 0x993c4390u, 0x3c439041u,
};
// (1/c, log2 c) pairs of the 16 log2 subintervals.
DS4M_TABLE unsigned long long ds4m_log2_table[32] = {
    0x3ff661ec79f8f3beull, 0xbfdefec65b963019ull, 0x3ff571ed4aaf883dull, 0xbfdb0b6832d4fca4ull,
    0x3ff49539f0f010b0ull, 0xbfd7418b0a1fb77bull, 0x3ff3c995b0b80385ull, 0xbfd39de91a6dcf7bull,
    0x3ff30d190c8864a5ull, 0xbfd01d9bf3f2b631ull, 0x3ff25e227b0b8ea0ull, 0xbfc97c1d1b3b7af0ull,
    0x3ff1bb4a4a1a343full, 0xbfc2f9e393af3c9full, 0x3ff12358f08ae5baull, 0xbfb960cbbf788d5cull,
    0x3ff0953f419900a7ull, 0xbfaa6f9db6475fceull, 0x3ff0000000000000ull, 0x0000000000000000ull,
    0x3fee608cfd9a47acull, 0x3fb338ca9f24f53dull, 0x3feca4b31f026aa0ull, 0x3fc476a9543891baull,
    0x3feb2036576afce6ull, 0x3fce840b4ac4e4d2ull, 0x3fe9c2d163a1aa2dull, 0x3fd40645f0c6651cull,
    0x3fe886e6037841edull, 0x3fd88e9c2c1b9ff8ull, 0x3fe767dcf5534862ull, 0x3fdce0a44eb17bccull,
};
// Two sets (quadrants 0-1, 2-3: cosine negated) of cosine c0..c4 then sine s1..s3 coefficients.
DS4M_TABLE unsigned long long ds4m_sincos_poly[16] = {
    0x3ff0000000000000ull, 0xbfdffffffd0c621cull, 0x3fa55553e1068f19ull, 0xbf56c087e89a359dull,
    0x3ef99343027bf8c3ull, 0xbfc555545995a603ull, 0x3f81107605230bc4ull, 0xbf2994eb3774cf24ull,
    0xbff0000000000000ull, 0x3fdffffffd0c621cull, 0xbfa55553e1068f19ull, 0x3f56c087e89a359dull,
    0xbef99343027bf8c3ull, 0xbfc555545995a603ull, 0x3f81107605230bc4ull, 0xbf2994eb3774cf24ull,
};

// ---- exp --------------------------------------------------------------------------------------
DS4_DEV float ds4_expf(float x) {
    const u32 abstop = (ds4m_f2u(x) >> 20) & 0x7ffu;
    if (abstop >= 0x42bu) {
        if (ds4m_f2u(x) == 0xff800000u) return 0.0f;
        if (abstop >= 0x7f8u) return x + x;
        if (x > ds4m_u2f(0x42b17217u)) return ds4m_u2f(0x7f800000u);
        if (x < ds4m_u2f(0xc2cff1b4u)) return 0.0f;
        if (x < ds4m_u2f(0xc2ce8ecfu)) return ds4m_u2f(1u);
    }
    const double inv_ln2_n = 0x1.71547652b82fep+5, shift = 0x1.8p+52;
    const double xd = (double)x;
    const double kd_shifted = fma(inv_ln2_n, xd, shift);
    const u64 ki = ds4m_d2u(kd_shifted);
    const double kd = kd_shifted - shift;
    const double r = fma(inv_ln2_n, xd, -kd);
    const double s = ds4m_u2d(ds4m_exp2_table[ki % 32u] + (ki << 47));
    const double z = fma(0x1.c6af84b912394p-20, r, 0x1.ebfce50fac4f3p-13);
    const double r2 = r * r;
    double y = fma(0x1.62e42ff0c52d6p-6, r, 1.0);
    y = fma(z, r2, y);
    return (float)(y * s);
}

// ---- ln(1 + x) (float arithmetic only) --------------------------------------------------------
DS4_DEV float ds4_log1pf(float x) {
    const float ln2_hi = ds4m_u2f(0x3f317180u), ln2_lo = ds4m_u2f(0x3717f7d1u);
    const float lp1 = ds4m_u2f(0x3f2aaaabu), lp2 = ds4m_u2f(0x3ecccccdu), lp3 = ds4m_u2f(0x3e924925u),
                lp4 = ds4m_u2f(0x3e638e29u), lp5 = ds4m_u2f(0x3e3a3325u), lp6 = ds4m_u2f(0x3e1cd04fu),
                lp7 = ds4m_u2f(0x3e178897u);
    const i32 hx = (i32)ds4m_f2u(x);
    const i32 ax = hx & 0x7fffffff;
    i32 k = 1, hu = 0;
    float f = 0.0f, c = 0.0f;
    if (hx < 0x3ed413d7) {
        if (ax >= 0x3f800000) {
            if (x == -1.0f) return ds4m_u2f(0xff800000u);
            return (x - x) / (x - x);
        }
        if (ax < 0x31000000) {
            if (ax < 0x24800000) return x;
            return x - x * x * 0.5f;
        }
        if (hx > 0 || hx <= (i32)0xbe95f61fu) {
            k = 0;
            f = x;
            hu = 1;
        }
    }
    if (hx >= 0x7f800000) return x + x;
    if (k != 0) {
        float u;
        if (hx < 0x5a000000) {
            u = 1.0f + x;
            hu = (i32)ds4m_f2u(u);
            k = (hu >> 23) - 127;
            c = k > 0 ? 1.0f - (u - x) : x - (u - 1.0f);
            c /= u;
        } else {
            u = x;
            hu = (i32)ds4m_f2u(u);
            k = (hu >> 23) - 127;
            c = 0.0f;
        }
        hu &= 0x007fffff;
        float un;
        if (hu < 0x3504f7) {
            un = ds4m_u2f((u32)(hu | 0x3f800000));
        } else {
            k += 1;
            un = ds4m_u2f((u32)(hu | 0x3f000000));
            hu = (0x00800000 - hu) >> 2;
        }
        f = un - 1.0f;
    }
    const float hfsq = 0.5f * f * f;
    const float kf = (float)k;
    if (hu == 0) {
        if (f == 0.0f) {
            if (k == 0) return 0.0f;
            c += kf * ln2_lo;
            return kf * ln2_hi + c;
        }
        const float r = hfsq * (1.0f - lp1 * f);
        if (k == 0) return f - r;
        return kf * ln2_hi - ((r - (kf * ln2_lo + c)) - f);
    }
    const float s = f / (2.0f + f);
    const float z = s * s;
    const float r = z * (lp1 + z * (lp2 + z * (lp3 + z * (lp4 + z * (lp5 + z * (lp6 + z * lp7))))));
    if (k == 0) return f - (hfsq - s * (hfsq + r));
    return kf * ln2_hi - ((hfsq - (s * (hfsq + r) + (kf * ln2_lo + c))) - f);
}

// ---- sin, cos ---------------------------------------------------------------------------------
// Sine (n even) or cosine (n odd) polynomial; xs = reduced x with the quadrant's sign, x2 = its square.
DS4_DEV float ds4m_sincos_poly_eval(double xs, double x2, u32 set, u32 n) {
    const unsigned long long* p = ds4m_sincos_poly + 8u * set;
    if ((n & 1u) == 0u) {
        const double x3 = x2 * xs;
        const double s1 = fma(x2, ds4m_u2d(p[7]), ds4m_u2d(p[6]));
        const double x7 = x2 * x3;
        const double s = fma(x3, ds4m_u2d(p[5]), xs);
        return (float)fma(s1, x7, s);
    }
    const double x4 = x2 * x2;
    const double c1 = fma(x2, ds4m_u2d(p[1]), ds4m_u2d(p[0]));
    const double c2 = fma(x2, ds4m_u2d(p[4]), ds4m_u2d(p[3]));
    const double x6 = x2 * x4;
    const double c = fma(x4, ds4m_u2d(p[2]), c1);
    return (float)fma(c2, x6, c);
}

// cos_shift 0: sin, 1: cos.
DS4_DEV float ds4m_sin_cos(float y, u32 cos_shift) {
    const double x = (double)y;
    const u32 abstop = (ds4m_f2u(y) >> 20) & 0x7ffu;
    if (abstop < 0x3f4u) {
        if (abstop < 0x398u) return cos_shift == 0u ? y : 1.0f;
        return ds4m_sincos_poly_eval(x, x * x, 0u, cos_shift);
    }
    double r;
    u32 n, q;
    if (abstop < 0x42fu) {
        // |y| < 120: x - n pi/2 in one fused step.
        const double t = x * 0x1.45f306dc9c883p+23;
        const i32 ni = ((i32)t + 0x800000) >> 24;
        r = fma(-(double)ni, 0x1.921fb54442d18p+0, x);
        n = (u32)ni;
        q = n;
    } else if (abstop < 0x7f8u) {
        // Exact 2.62 fixed-point position of |y| in the circle from a 96-bit window of 2/pi.
        const u32 xi = ds4m_f2u(y);
        const unsigned int* arr = ds4m_four_over_pi + ((xi >> 26) & 15u);
        const u32 m = ((xi & 0x7fffffu) | 0x800000u) << ((xi >> 23) & 7u);
        const u64 lo = (u64)(u32)(m * arr[0]);
        const u64 mid = (u64)m * (u64)arr[4];
        const u64 hi = (u64)m * (u64)arr[8];
        u64 res = ((hi >> 32) | (lo << 32)) + mid;
        const u64 nn = (res + (1ull << 61)) >> 62;
        res -= nn << 62;
        r = (double)(long long)res * 0x1.921fb54442d18p-62;
        n = (u32)nn;
        q = n + (xi >> 31);
    } else {
        return (y - y) / (y - y);
    }
    const double sign = ((q + 1u) & 2u) ? -1.0 : 1.0;  // quadrants 0..3: + - - +
    return ds4m_sincos_poly_eval(r * sign, r * r, (q >> 1) & 1u, n ^ cos_shift);
}

DS4_DEV float ds4_sinf(float x) { return ds4m_sin_cos(x, 0u); }
DS4_DEV float ds4_cosf(float x) { return ds4m_sin_cos(x, 1u); }

// ---- log2 -------------------------------------------------------------------------------------
DS4_DEV float ds4_log2f(float x) {
    u32 ix = ds4m_f2u(x);
    if (ix == 0x3f800000u) return 0.0f;
    if (ix - 0x00800000u >= 0x7f000000u) {
        if (ix * 2u == 0u) return ds4m_u2f(0xff800000u);
        if (ix == 0x7f800000u) return x;
        if ((ix & 0x80000000u) || ix * 2u >= 0xff000000u) return (x - x) / (x - x);
        ix = ds4m_f2u(x * 0x1p23f) - (23u << 23);
    }
    const u32 tmp = ix - 0x3f330000u;
    const u32 i = (tmp >> 19) % 16u;
    const u32 top = tmp & 0xff800000u;
    const u32 iz = ix - top;
    const i32 k = (i32)tmp >> 23;
    const double invc = ds4m_u2d(ds4m_log2_table[2u * i]), logc = ds4m_u2d(ds4m_log2_table[2u * i + 1u]);
    const double z = (double)ds4m_u2f(iz);
    const double r = fma(z, invc, -1.0);
    const double y0 = logc + (double)k;
    const double r2 = r * r;
    double y = fma(r, 0x1.ecabf496832e0p-2, -0x1.715479ffae3dep-1);
    y = fma(r2, -0x1.712b6f70a7e4dp-2, y);
    const double p = fma(r, 0x1.715475f35c8b8p+0, y0);
    return (float)fma(r2, y, p);
}

// ---- test kernel ------------------------------------------------------------------------------
// Selftest / emulator check of the functions above against transcend.rs: out[i] = f(input[i]) for
// i < n, f = ds4_expf, ds4_log1pf, ds4_sinf, ds4_cosf, ds4_log2f for which = 0..4 (else NaN).
// Launch: grid (ceil(n / 256)), block 256.
extern "C" __global__ DS4_LAUNCH(DS4_BLOCK) void ds4_test_mathf(float* out, const float* input, u32 n, u32 which) {
    ds4_grid_sync();
    const u32 i = blockIdx.x * DS4_BLOCK + threadIdx.x;
    if (i >= n) return;
    const float x = input[i];
    float y;
    switch (which) {
        case 0: y = ds4_expf(x); break;
        case 1: y = ds4_log1pf(x); break;
        case 2: y = ds4_sinf(x); break;
        case 3: y = ds4_cosf(x); break;
        case 4: y = ds4_log2f(x); break;
        default: y = ds4m_u2f(0x7fc00000u); break;
    }
    out[i] = y;
}
