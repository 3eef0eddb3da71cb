//! The float transcendental functions of the forward pass (exp, ln(1 + x), sin, cos, log2), one
//! definition shared bit for bit with the GPU kernels (kernels/mathf.h `ds4_expf` …).
//!
//! Why: ds4 calls glibc's float functions, and the case A vectors are that close to them that a
//! one-ulp difference in a softmax weight or a RoPE angle (which then moves an activation across a
//! Q8 rounding boundary) shows in the tolerances: evaluating these in double and rounding once
//! differs from glibc in ~1% of inputs and moves two case A prompts outside the README limits. So
//! these are glibc's values, and the kernels must compute the very same bits.
//!
//! How: portable re-implementations of the algorithms glibc 2.36 runs on x86_64 with FMA (its
//! `ifunc` picks the variants compiled with -mfma). `exp`, `sin`/`cos` and `log2` are the
//! double-evaluated float algorithms published in ARM's optimized-routines (expf: 32-entry 2^(i/32)
//! table + cubic; sinf/cosf: one-step reduction by pi/2 below 120, a 4/pi fixed-point product
//! above, and short even/odd polynomials; log2f: 16-entry 1/c, log2(c) table + quartic); `ln_1p`
//! is the fdlibm-style float log1pf that glibc 2.36 still ships (not an ifunc, no FMA). Which
//! products glibc's binary fuses into FMA was read off its disassembly; `f64::mul_add` stands
//! exactly there and nowhere else (Rust never contracts on its own), and the kernels call `fma`
//! at the same places. The constants are those of the algorithms' published tables (checked by
//! the tests below against independently computed values where they have a closed form).
//!
//! Inputs outside the engine's ranges are handled like glibc too (overflow, underflow, NaN, ±inf,
//! subnormals). NaN results carry glibc's bits on x86 (the tests compare them too); a GPU may
//! return another NaN, which the kernel tests accept.
//!
//! Owns only these scalar functions and their tables (mirrored in kernels/mathf.h; the test
//! `kernel_header_tables_match` keeps the two in step).

/// The NaN of an invalid operation on x (x = ±inf, or a domain error), computed as glibc does (an
/// IEEE invalid operation, so a NaN input comes back quieted with its payload).
#[allow(clippy::eq_op)]
#[inline]
fn invalid(x: f32) -> f32 {
    (x - x) / (x - x)
}

// ---------------------------------------------------------------------------------------------
// Entry points
// ---------------------------------------------------------------------------------------------

/// Defines `pub fn $name(x: f32) -> f32` running `$body`. On x86_64 CPUs with FMA the body is
/// compiled with the feature enabled so that `mul_add` is one instruction; elsewhere `mul_add` is a
/// call to the C library's correctly rounded `fma`. Both give the same bits; the first is ~4x faster.
macro_rules! entry_point {
    ($(#[$doc:meta])* $name:ident => $body:ident) => {
        $(#[$doc])*
        #[inline]
        pub fn $name(x: f32) -> f32 {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "fma")]
                fn with_fma(x: f32) -> f32 {
                    $body(x)
                }
                if std::arch::is_x86_feature_detected!("fma") {
                    // SAFETY: the CPU has FMA (checked on the line above).
                    return unsafe { with_fma(x) };
                }
            }
            $body(x)
        }
    };
}

entry_point!(
    /// e^x, bitwise glibc 2.36 `expf` (x86_64 FMA variant).
    exp => exp_body
);
entry_point!(
    /// sin x, bitwise glibc 2.36 `sinf` (x86_64 FMA variant).
    sin => sin_body
);
entry_point!(
    /// cos x, bitwise glibc 2.36 `cosf` (x86_64 FMA variant).
    cos => cos_body
);
entry_point!(
    /// log2 x, bitwise glibc 2.36 `log2f` (x86_64 FMA variant).
    log2 => log2_body
);

// ---------------------------------------------------------------------------------------------
// exp
// ---------------------------------------------------------------------------------------------

/// Bit patterns of 2^(i/32) (i = 0..31) as doubles, minus i << 47, so that adding the scaled
/// integer part k << 47 of the reduced argument gives 2^(k/32 + i/32) in one integer add.
pub(crate) const EXP2_TABLE: [u64; 32] = [
    0x3ff0000000000000,
    0x3fefd9b0d3158574,
    0x3fefb5586cf9890f,
    0x3fef9301d0125b51,
    0x3fef72b83c7d517b,
    0x3fef54873168b9aa,
    0x3fef387a6e756238,
    0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715,
    0x3feef1a7373aa9cb,
    0x3feedea64c123422,
    0x3feece086061892d,
    0x3feebfdad5362a27,
    0x3feeb42b569d4f82,
    0x3feeab07dd485429,
    0x3feea47eb03a5585,
    0x3feea09e667f3bcd,
    0x3fee9f75e8ec5f74,
    0x3feea11473eb0187,
    0x3feea589994cce13,
    0x3feeace5422aa0db,
    0x3feeb737b0cdc5e5,
    0x3feec49182a3f090,
    0x3feed503b23e255d,
    0x3feee89f995ad3ad,
    0x3feeff76f2fb5e47,
    0x3fef199bdd85529c,
    0x3fef3720dcef9069,
    0x3fef5818dcfba487,
    0x3fef7c97337b9b5f,
    0x3fefa4afa2a490da,
    0x3fefd0765b6e4540,
];
/// 32 / ln 2.
const EXP_INV_LN2_N: f64 = f64::from_bits(0x40471547652b82fe);
/// 1.5 * 2^52: adding it rounds a double of magnitude < 2^51 to an integer held in the low bits.
const EXP_SHIFT: f64 = f64::from_bits(0x4338000000000000);
/// Cubic for 2^(r/32) - 1 on |r| <= 1/2, coefficients of r^3, r^2, r.
const EXP_C0: f64 = f64::from_bits(0x3ebc6af84b912394);
const EXP_C1: f64 = f64::from_bits(0x3f2ebfce50fac4f3);
const EXP_C2: f64 = f64::from_bits(0x3f962e42ff0c52d6);
/// Above this e^x overflows (largest float below ln 2^128).
const EXP_OVERFLOW: f32 = f32::from_bits(0x42b17217);
/// Below this e^x rounds to 0 (ln 2^-150).
const EXP_UNDERFLOW: f32 = f32::from_bits(0xc2cff1b4);
/// Below this (and above the previous) e^x rounds to the smallest subnormal (ln 2^-149).
const EXP_MAY_UNDERFLOW: f32 = f32::from_bits(0xc2ce8ecf);

#[inline(always)]
fn exp_body(x: f32) -> f32 {
    let abstop = (x.to_bits() >> 20) & 0x7ff;
    if abstop >= 0x42b {
        // |x| >= 88, inf or NaN.
        if x.to_bits() == 0xff80_0000 {
            return 0.0;
        }
        if abstop >= 0x7f8 {
            return x + x;
        }
        if x > EXP_OVERFLOW {
            return f32::INFINITY;
        }
        if x < EXP_UNDERFLOW {
            return 0.0;
        }
        if x < EXP_MAY_UNDERFLOW {
            // glibc returns tiny * tiny with tiny = 1.25 * 2^-75, which rounds to 2^-149.
            return f32::from_bits(1);
        }
    }
    let xd = x as f64;
    // x * 32/ln2 = k + r, k the nearest integer: the shift's add is fused with the product.
    let kd_shifted = EXP_INV_LN2_N.mul_add(xd, EXP_SHIFT);
    let ki = kd_shifted.to_bits();
    let kd = kd_shifted - EXP_SHIFT;
    let r = EXP_INV_LN2_N.mul_add(xd, -kd);
    // 2^(k/32): table entry of k mod 32, exponent bits from the low bits of k (two's complement).
    let s = f64::from_bits(EXP2_TABLE[(ki % 32) as usize].wrapping_add(ki << 47));
    let z = EXP_C0.mul_add(r, EXP_C1);
    let r2 = r * r;
    let y = EXP_C2.mul_add(r, 1.0);
    let y = z.mul_add(r2, y);
    (y * s) as f32
}

// ---------------------------------------------------------------------------------------------
// ln(1 + x)
// ---------------------------------------------------------------------------------------------

const LN2_HI: f32 = f32::from_bits(0x3f317180);
const LN2_LO: f32 = f32::from_bits(0x3717f7d1);
/// Coefficients of the series of log((1 + s) / (1 - s)) = 2s + s * (Lp1 s^2 + ... + Lp7 s^14).
const LP: [f32; 7] = [
    f32::from_bits(0x3f2aaaab),
    f32::from_bits(0x3ecccccd),
    f32::from_bits(0x3e924925),
    f32::from_bits(0x3e638e29),
    f32::from_bits(0x3e3a3325),
    f32::from_bits(0x3e1cd04f),
    f32::from_bits(0x3e178897),
];

/// ln(1 + x) (the router's softplus), bitwise glibc 2.36 `log1pf` (float arithmetic throughout, no
/// FMA: glibc's log1pf is not an ifunc).
#[inline]
pub fn ln_1p(x: f32) -> f32 {
    let hx = x.to_bits() as i32;
    let ax = hx & 0x7fff_ffff;
    // k: power of two taken out of 1 + x; f: 1 + x = 2^k (1 + f) with f in [sqrt(2)/2 - 1, sqrt(2) - 1];
    // c: rounding error of 1 + x, relative; hu: the mantissa bits used to pick the branch.
    let mut k = 1i32;
    let mut f = 0f32;
    let mut c = 0f32;
    let mut hu = 0i32;
    if hx < 0x3ed4_13d7 {
        // x < 0.41422 (or negative)
        if ax >= 0x3f80_0000 {
            // x <= -1 (or a negative NaN)
            if x == -1.0 {
                return f32::NEG_INFINITY;
            }
            return invalid(x);
        }
        if ax < 0x3100_0000 {
            // |x| < 2^-29
            if ax < 0x2480_0000 {
                return x;
            }
            return x - x * x * 0.5;
        }
        if hx > 0 || hx <= 0xbe95_f61f_u32 as i32 {
            // -0.2929 < x < 0.41422: no reduction.
            k = 0;
            f = x;
            hu = 1;
        }
    }
    if hx >= 0x7f80_0000 {
        return x + x;
    }
    if k != 0 {
        let u;
        if hx < 0x5a00_0000 {
            u = 1.0 + x;
            hu = u.to_bits() as i32;
            k = (hu >> 23) - 127;
            c = if k > 0 { 1.0 - (u - x) } else { x - (u - 1.0) };
            c /= u;
        } else {
            u = x;
            hu = u.to_bits() as i32;
            k = (hu >> 23) - 127;
            c = 0.0;
        }
        hu &= 0x007f_ffff;
        let un = if hu < 0x3504f7 {
            f32::from_bits((hu | 0x3f80_0000) as u32)
        } else {
            k += 1;
            let v = f32::from_bits((hu | 0x3f00_0000) as u32);
            hu = (0x0080_0000 - hu) >> 2;
            v
        };
        f = un - 1.0;
    }
    let hfsq = 0.5 * f * f;
    if hu == 0 {
        // |f| < 2^-20
        if f == 0.0 {
            if k == 0 {
                return 0.0;
            }
            c += k as f32 * LN2_LO;
            return k as f32 * LN2_HI + c;
        }
        let r = hfsq * (1.0 - LP[0] * f);
        if k == 0 {
            return f - r;
        }
        return k as f32 * LN2_HI - ((r - (k as f32 * LN2_LO + c)) - f);
    }
    let s = f / (2.0 + f);
    let z = s * s;
    let r = z * (LP[0] + z * (LP[1] + z * (LP[2] + z * (LP[3] + z * (LP[4] + z * (LP[5] + z * LP[6]))))));
    if k == 0 {
        f - (hfsq - s * (hfsq + r))
    } else {
        k as f32 * LN2_HI - ((hfsq - (s * (hfsq + r) + (k as f32 * LN2_LO + c))) - f)
    }
}

// ---------------------------------------------------------------------------------------------
// sin, cos
// ---------------------------------------------------------------------------------------------

/// Polynomials of one half-turn: cosine c0 + c1 x^2 + ... + c4 x^8 and sine x + s1 x^3 + s2 x^5 +
/// s3 x^7 on |x| <= pi/4. The second set (quadrants 2 and 3) has the cosine negated.
struct SinCosPoly {
    c: [f64; 5],
    s: [f64; 3],
}
const SINCOS_POLY_0: SinCosPoly = SinCosPoly {
    c: [
        f64::from_bits(0x3ff0000000000000),
        f64::from_bits(0xbfdffffffd0c621c),
        f64::from_bits(0x3fa55553e1068f19),
        f64::from_bits(0xbf56c087e89a359d),
        f64::from_bits(0x3ef99343027bf8c3),
    ],
    s: [
        f64::from_bits(0xbfc555545995a603),
        f64::from_bits(0x3f81107605230bc4),
        f64::from_bits(0xbf2994eb3774cf24),
    ],
};
const SINCOS_POLY: [SinCosPoly; 2] = [
    SINCOS_POLY_0,
    SinCosPoly {
        c: negated(SINCOS_POLY_0.c),
        s: SINCOS_POLY_0.s,
    },
];

/// Each coefficient with its sign flipped (exact).
const fn negated<const N: usize>(c: [f64; N]) -> [f64; N] {
    let mut out = c;
    let mut i = 0;
    while i < N {
        out[i] = -c[i];
        i += 1;
    }
    out
}
/// Sign of the sine argument in quadrants 0..3.
const SINCOS_SIGN: [f64; 4] = [1.0, -1.0, -1.0, 1.0];
/// 2/pi * 2^24: the quadrant lands in bits 24.. of the truncated product.
const HALF_PI_INV_2P24: f64 = f64::from_bits(0x41645f306dc9c883);
const HALF_PI: f64 = f64::from_bits(0x3ff921fb54442d18);
/// 2pi * 2^-64: converts the 2.62 fixed-point remainder of the large reduction to radians.
const PI_2P_M63: f64 = f64::from_bits(0x3c1921fb54442d18);

/// The first 192 fraction bits of 2/pi = 0.a2f9836e... (hex), i.e. of 4/pi with its binary point
/// moved by one.
const FOUR_OVER_PI_BYTES: [u8; 24] = [
    0xa2, 0xf9, 0x83, 0x6e, 0x4e, 0x44, 0x15, 0x29, 0xfc, 0x27, 0x57, 0xd1, 0xf5, 0x34, 0xdd, 0xc0, 0xdb, 0x62, 0x95,
    0x99, 0x3c, 0x43, 0x90, 0x41,
];
/// 32-bit windows of those bits sliding by one byte: entry i holds bytes i-3 ..= i (zeros before the start).
pub(crate) const FOUR_OVER_PI_WINDOWS: [u32; 24] = {
    let mut w = [0u32; 24];
    let mut i = 0;
    while i < 24 {
        let mut v = 0u32;
        let mut j = 0;
        while j < 4 {
            let b = i as i32 - 3 + j;
            v = (v << 8)
                | if b >= 0 {
                    FOUR_OVER_PI_BYTES[b as usize] as u32
                } else {
                    0
                };
            j += 1;
        }
        w[i] = v;
        i += 1;
    }
    w
};

/// Sine (n even) or cosine (n odd) polynomial of the reduced argument: `xs` is the reduced x with
/// the quadrant's sign applied, `x2` the square of the reduced x.
#[inline(always)]
fn sincos_poly(xs: f64, x2: f64, p: &SinCosPoly, n: u32) -> f32 {
    if n & 1 == 0 {
        let x3 = x2 * xs;
        let s1 = x2.mul_add(p.s[2], p.s[1]);
        let x7 = x2 * x3;
        let s = x3.mul_add(p.s[0], xs);
        s1.mul_add(x7, s) as f32
    } else {
        let x4 = x2 * x2;
        let c1 = x2.mul_add(p.c[1], p.c[0]);
        let c2 = x2.mul_add(p.c[4], p.c[3]);
        let x6 = x2 * x4;
        let c = x4.mul_add(p.c[2], c1);
        c2.mul_add(x6, c) as f32
    }
}

/// x - n pi/2 for |x| < 120 (one fused multiply-subtract: pi/2 as a double has enough bits there).
#[inline(always)]
fn reduce_fast(x: f64) -> (f64, u32) {
    let r = x * HALF_PI_INV_2P24;
    let n = ((r as i32).wrapping_add(0x80_0000)) >> 24;
    ((-(n as f64)).mul_add(HALF_PI, x), n as u32)
}

/// Reduction of |x| >= 120 (any finite float): the 24-bit mantissa times a 96-bit window of 4/pi
/// gives the position in the circle as a 2.62 fixed-point number exactly; returns (remainder in
/// radians in [-pi/4, pi/4], quadrant) for |x| (the caller folds in the sign).
#[inline(always)]
fn reduce_large(xi: u32) -> (f64, u32) {
    let arr = &FOUR_OVER_PI_WINDOWS[((xi >> 26) & 15) as usize..];
    let shift = (xi >> 23) & 7;
    let m = ((xi & 0x7f_ffff) | 0x80_0000) << shift;
    let lo = m.wrapping_mul(arr[0]) as u64;
    let mid = m as u64 * arr[4] as u64;
    let hi = m as u64 * arr[8] as u64;
    let mut res = ((hi >> 32) | (lo << 32)).wrapping_add(mid);
    let n = res.wrapping_add(1 << 61) >> 62;
    res = res.wrapping_sub(n << 62);
    ((res as i64) as f64 * PI_2P_M63, n as u32)
}

/// Shared by sin (`cos_shift` 0) and cos (1): the quadrant n of the reduced argument, shifted by one
/// for cos, picks sine or cosine polynomial; n (and the input's sign) pick the signs.
#[inline(always)]
fn sin_cos(y: f32, cos_shift: u32) -> f32 {
    let x = y as f64;
    let abstop = (y.to_bits() >> 20) & 0x7ff;
    if abstop < 0x3f4 {
        // |y| < pi/4
        if abstop < 0x398 {
            // |y| < 2^-12: sin y = y, cos y = 1 after rounding.
            return if cos_shift == 0 { y } else { 1.0 };
        }
        return sincos_poly(x, x * x, &SINCOS_POLY[0], cos_shift);
    }
    let (r, n, q) = if abstop < 0x42f {
        // |y| < 120
        let (r, n) = reduce_fast(x);
        (r, n, n)
    } else if abstop < 0x7f8 {
        let xi = y.to_bits();
        let (r, n) = reduce_large(xi);
        (r, n, n.wrapping_add(xi >> 31))
    } else {
        // inf or NaN
        return invalid(y);
    };
    let p = &SINCOS_POLY[((q >> 1) & 1) as usize];
    sincos_poly(r * SINCOS_SIGN[(q & 3) as usize], r * r, p, n ^ cos_shift)
}

#[inline(always)]
fn sin_body(x: f32) -> f32 {
    sin_cos(x, 0)
}

#[inline(always)]
fn cos_body(x: f32) -> f32 {
    sin_cos(x, 1)
}

// ---------------------------------------------------------------------------------------------
// log2
// ---------------------------------------------------------------------------------------------

/// (1/c, log2 c) for the 16 subintervals of [0x3f330000, 2 * 0x3f330000) (as float bits) that the
/// mantissa is reduced to; c is near each subinterval's center.
pub(crate) const LOG2_TABLE: [(u64, u64); 16] = [
    (0x3ff661ec79f8f3be, 0xbfdefec65b963019),
    (0x3ff571ed4aaf883d, 0xbfdb0b6832d4fca4),
    (0x3ff49539f0f010b0, 0xbfd7418b0a1fb77b),
    (0x3ff3c995b0b80385, 0xbfd39de91a6dcf7b),
    (0x3ff30d190c8864a5, 0xbfd01d9bf3f2b631),
    (0x3ff25e227b0b8ea0, 0xbfc97c1d1b3b7af0),
    (0x3ff1bb4a4a1a343f, 0xbfc2f9e393af3c9f),
    (0x3ff12358f08ae5ba, 0xbfb960cbbf788d5c),
    (0x3ff0953f419900a7, 0xbfaa6f9db6475fce),
    (0x3ff0000000000000, 0x0000000000000000),
    (0x3fee608cfd9a47ac, 0x3fb338ca9f24f53d),
    (0x3feca4b31f026aa0, 0x3fc476a9543891ba),
    (0x3feb2036576afce6, 0x3fce840b4ac4e4d2),
    (0x3fe9c2d163a1aa2d, 0x3fd40645f0c6651c),
    (0x3fe886e6037841ed, 0x3fd88e9c2c1b9ff8),
    (0x3fe767dcf5534862, 0x3fdce0a44eb17bcc),
];
/// log2(1 + r) ~ A3 r + A2 r^2 + A1 r^3 + A0 r^4.
const LOG2_A: [f64; 4] = [
    f64::from_bits(0xbfd712b6f70a7e4d),
    f64::from_bits(0x3fdecabf496832e0),
    f64::from_bits(0xbfe715479ffae3de),
    f64::from_bits(0x3ff715475f35c8b8),
];
const LOG2_OFF: u32 = 0x3f33_0000;

#[inline(always)]
fn log2_body(x: f32) -> f32 {
    let mut ix = x.to_bits();
    if ix == 0x3f80_0000 {
        return 0.0;
    }
    if ix.wrapping_sub(0x0080_0000) >= 0x7f00_0000 {
        // x < 2^-126, inf or NaN
        if ix.wrapping_mul(2) == 0 {
            return f32::NEG_INFINITY;
        }
        if ix == 0x7f80_0000 {
            return x;
        }
        if ix & 0x8000_0000 != 0 || ix.wrapping_mul(2) >= 0xff00_0000 {
            return invalid(x);
        }
        // Subnormal: scale into the normal range, then take the scale back out of the exponent.
        ix = (x * 8_388_608.0).to_bits().wrapping_sub(23 << 23);
    }
    // x = 2^k z with z in [OFF, 2 OFF) (float bits); the table subinterval holding z gives c.
    let tmp = ix.wrapping_sub(LOG2_OFF);
    let i = ((tmp >> 19) % 16) as usize;
    let top = tmp & 0xff80_0000;
    let iz = ix.wrapping_sub(top);
    let k = (tmp as i32) >> 23;
    let (invc, logc) = (f64::from_bits(LOG2_TABLE[i].0), f64::from_bits(LOG2_TABLE[i].1));
    let z = f32::from_bits(iz) as f64;
    let r = z.mul_add(invc, -1.0);
    let y0 = logc + k as f64;
    let r2 = r * r;
    let y = r.mul_add(LOG2_A[1], LOG2_A[2]);
    let y = r2.mul_add(LOG2_A[0], y);
    let p = r.mul_add(LOG2_A[3], y0);
    r2.mul_add(y, p) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_second_sincos_set_is_the_first_with_the_cosine_negated() {
        let c = SINCOS_POLY[1].c.map(f64::to_bits);
        let want = [
            0xbff0000000000000,
            0x3fdffffffd0c621c,
            0xbfa55553e1068f19,
            0x3f56c087e89a359d,
            0xbef99343027bf8c3,
        ];
        assert_eq!(c, want);
        assert_eq!(SINCOS_POLY[1].s.map(f64::to_bits), SINCOS_POLY_0.s.map(f64::to_bits));
    }

    /// The comparison with the platform's float functions is meaningful only where they are glibc's
    /// FMA variants (x86_64 glibc on a CPU with FMA, as this project's machines and CI).
    fn libm_is_glibc_fma() -> bool {
        #[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
        {
            if std::arch::is_x86_feature_detected!("fma") {
                return true;
            }
            // Straight to stderr, past the test harness's capture, like tests/support/skip.rs.
            let _ = std::io::Write::write_all(
                &mut std::io::stderr(),
                b"\nSKIPPED: transcend vs libm: CPU without FMA, glibc picks other variants\n",
            );
            false
        }
        #[cfg(not(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu")))]
        {
            let _ = std::io::Write::write_all(
                &mut std::io::stderr(),
                b"\nSKIPPED: transcend vs libm: not x86_64 glibc, the reference algorithms differ\n",
            );
            false
        }
    }

    type Pair = (&'static str, fn(f32) -> f32, fn(f32) -> f32);
    const FUNCS: [Pair; 5] = [
        ("exp", exp, f32::exp),
        ("ln_1p", ln_1p, f32::ln_1p),
        ("sin", sin, f32::sin),
        ("cos", cos, f32::cos),
        ("log2", log2, f32::log2),
    ];

    /// Equal bits, or both NaN (NaN payloads of invalid operations are the hardware's).
    fn same(a: f32, b: f32) -> bool {
        a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
    }

    /// Counts mismatches of `ours` against `libm` over the inputs; panics listing the first few.
    fn compare(name: &str, ours: fn(f32) -> f32, libm: fn(f32) -> f32, inputs: impl Iterator<Item = f32>) -> usize {
        let mut n = 0usize;
        let mut bad = Vec::new();
        for x in inputs {
            n += 1;
            let (a, b) = (ours(x), libm(x));
            if a.to_bits() != b.to_bits() {
                bad.push(format!(
                    "{name}({x:e} = {:#010x}): ours {a:e} ({:#010x}), libm {b:e} ({:#010x})",
                    x.to_bits(),
                    a.to_bits(),
                    b.to_bits()
                ));
            }
        }
        assert!(
            bad.is_empty(),
            "{} of {n} differ:\n{}",
            bad.len(),
            bad[..bad.len().min(10)].join("\n")
        );
        n
    }

    /// Every 4099th bit pattern (all signs, exponents, NaN and inf included): ~1M inputs.
    fn stride_all() -> impl Iterator<Item = f32> {
        (0..=u32::MAX / 4099).map(|i| f32::from_bits(i * 4099)).chain([
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::MIN_POSITIVE,
            f32::from_bits(1),
            f32::MAX,
            -1.0,
            1.0,
        ])
    }

    /// `count` evenly spaced floats of [lo, hi] (rounded to float).
    fn sweep(lo: f64, hi: f64, count: u32) -> impl Iterator<Item = f32> {
        (0..count).map(move |i| (lo + (hi - lo) * i as f64 / (count - 1) as f64) as f32)
    }

    #[test]
    fn strided_bit_patterns_match_glibc() {
        if !libm_is_glibc_fma() {
            return;
        }
        for (name, ours, libm) in FUNCS {
            compare(name, ours, libm, stride_all());
            // NaN inputs of both signs, quiet and signaling, and the domain errors: the same NaN bits.
            let nans = (0x7f80_0001u32..=0x7fff_ffff)
                .step_by(257)
                .flat_map(|b| [b, b | 0x8000_0000]);
            compare(name, ours, libm, nans.map(f32::from_bits));
            compare(name, ours, libm, sweep(-1e30, -1.0, 1000));
        }
    }

    #[test]
    fn hot_ranges_match_glibc() {
        if !libm_is_glibc_fma() {
            return;
        }
        // Softmax / sigmoid / SwiGLU arguments, across the overflow and underflow edges.
        compare("exp", exp, f32::exp, sweep(-110.0, 90.0, 2_000_000));
        // Every float of [-1, 1] near 0 is too many; consecutive floats around 0.5 and 2.
        compare("exp", exp, f32::exp, (0x3f00_0000u32..0x3f04_0000).map(f32::from_bits));
        // RoPE angles pos * theta^-k: dense at small angles, and up to 1e6 (large reduction above 120).
        for (name, ours, libm) in [FUNCS[2], FUNCS[3]] {
            compare(name, ours, libm, sweep(0.0, 2e5, 1_000_000));
            compare(name, ours, libm, sweep(-130.0, 130.0, 500_000));
            compare(name, ours, libm, sweep(2e5, 1.2e6, 200_000));
        }
        // Softplus ln(1 + e^z): arguments in (0, inf); log2 of quantizer block maxima.
        compare("ln_1p", ln_1p, f32::ln_1p, sweep(0.0, 50.0, 500_000));
        compare("ln_1p", ln_1p, f32::ln_1p, sweep(-0.999, 0.5, 500_000));
        compare("log2", log2, f32::log2, sweep(1e-3, 1e3, 500_000));
        compare(
            "log2",
            log2,
            f32::log2,
            (1u32..0x0010_0000).step_by(7).map(f32::from_bits),
        );
    }

    /// Every one of the 2^32 inputs per function, bit for bit (NaN payloads included; about a
    /// minute per function on one core in a release build).
    /// `cargo test --release --lib transcend -- --ignored`.
    #[test]
    #[ignore = "every 2^32 input of each function, about a minute a function: run by hand with --ignored"]
    fn exhaustive_match_glibc() {
        if !libm_is_glibc_fma() {
            return;
        }
        for (name, ours, libm) in FUNCS {
            let mut bad = 0u64;
            let mut first = None;
            for b in 0..=u32::MAX {
                let x = f32::from_bits(b);
                if ours(x).to_bits() != libm(x).to_bits() {
                    bad += 1;
                    first.get_or_insert(b);
                }
            }
            eprintln!("{name}: {bad} of 2^32 inputs differ from glibc (first {first:#x?})");
            assert_eq!(bad, 0, "{name}");
        }
    }

    /// The bodies compiled without the FMA feature (mul_add = the C library's fma) give the same
    /// bits as the entry points (hardware FMA where the CPU has it).
    #[test]
    fn portable_and_fma_paths_agree() {
        let bodies: [Pair; 4] = [
            ("exp", exp_body, exp),
            ("sin", sin_body, sin),
            ("cos", cos_body, cos),
            ("log2", log2_body, log2),
        ];
        for (name, body, entry) in bodies {
            for x in (0..=u32::MAX / 65_537).map(|i| f32::from_bits(i * 65_537)) {
                let (a, b) = (body(x), entry(x));
                assert!(same(a, b), "{name}({x:e}): portable {a:e}, entry {b:e}");
            }
        }
    }

    #[test]
    fn tables_hold_their_closed_forms() {
        // 2^(i/32), rounded to double: within half an ulp of the f64 evaluation, which is itself
        // within one ulp, so at most one ulp apart.
        for (i, &t) in EXP2_TABLE.iter().enumerate() {
            let v = f64::from_bits(t.wrapping_add((i as u64) << 47));
            let want = (i as f64 / 32.0).exp2();
            assert!((v - want).abs() <= f64::EPSILON * want, "2^({i}/32): {v} vs {want}");
        }
        // 2/pi: the leading 64 bits of the expansion, rounded to double, vs 2/pi in f64.
        let top = FOUR_OVER_PI_WINDOWS[3] as u64;
        let next = FOUR_OVER_PI_WINDOWS[7] as u64;
        let v = ((top << 32) | next) as f64 / 2f64.powi(64);
        assert!((v - std::f64::consts::FRAC_2_PI).abs() <= f64::EPSILON, "2/pi: {v}");
        for i in 0..24 {
            // Windows overlap by three bytes.
            if i >= 1 {
                assert_eq!(FOUR_OVER_PI_WINDOWS[i] >> 8, FOUR_OVER_PI_WINDOWS[i - 1] & 0xff_ffff);
            }
        }
        // log2 table: 1/c * c == 1 within rounding and log2(c) agrees with the f64 log2.
        for (i, &(invc, logc)) in LOG2_TABLE.iter().enumerate() {
            let (invc, logc) = (f64::from_bits(invc), f64::from_bits(logc));
            assert!(((1.0 / invc).log2() - logc).abs() < 1e-15, "log2 table {i}");
        }
        // The constants with closed forms.
        assert!((EXP_INV_LN2_N - 32.0 / std::f64::consts::LN_2).abs() <= f64::EPSILON * 64.0);
        assert_eq!(HALF_PI, std::f64::consts::FRAC_PI_2);
        assert!((HALF_PI_INV_2P24 - 2.0 / std::f64::consts::PI * 16_777_216.0).abs() <= 2e-16 * 2e7);
        assert_eq!(PI_2P_M63, 2.0 * std::f64::consts::PI / 2f64.powi(64));
        assert_eq!((LN2_HI as f64 + LN2_LO as f64) as f32, std::f32::consts::LN_2);
    }

    #[test]
    fn special_values() {
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp(89.0), f32::INFINITY);
        assert_eq!(exp(-104.0), 0.0);
        assert_eq!(exp(-103.5).to_bits(), 1);
        assert_eq!(exp(0.0), 1.0);
        assert!(exp(f32::NAN).is_nan());
        assert_eq!(ln_1p(-1.0), f32::NEG_INFINITY);
        assert!(ln_1p(-2.0).is_nan());
        assert_eq!(ln_1p(f32::INFINITY), f32::INFINITY);
        assert_eq!(ln_1p(0.0), 0.0);
        assert!(sin(f32::INFINITY).is_nan() && cos(f32::NEG_INFINITY).is_nan());
        assert_eq!(cos(0.0), 1.0);
        assert_eq!(sin(-0.0).to_bits(), (-0.0f32).to_bits());
        assert_eq!(log2(0.0), f32::NEG_INFINITY);
        assert_eq!(log2(1.0), 0.0);
        assert_eq!(log2(8.0), 3.0);
        assert_eq!(log2(f32::from_bits(1)), -149.0);
        assert!(log2(-1.0).is_nan());
    }

    /// kernels/mathf.h carries the same tables as hex constants; parse them and compare.
    #[test]
    fn kernel_header_tables_match() {
        let h = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels/mathf.h"))
            .expect("read kernels/mathf.h");
        let array = |name: &str| -> Vec<u64> {
            let at = h
                .find(&format!("{name}["))
                .unwrap_or_else(|| panic!("mathf.h lacks {name}"));
            let open = h[at..].find('{').unwrap() + at;
            let close = h[open..].find('}').unwrap() + open;
            h[open + 1..close]
                .split(',')
                .map(str::trim)
                .filter(|w| !w.is_empty())
                .map(|w| {
                    let w = w.trim_end_matches(['u', 'l', 'U', 'L']).trim_start_matches("0x");
                    u64::from_str_radix(w, 16).unwrap_or_else(|_| panic!("{name}: bad constant {w}"))
                })
                .collect()
        };
        assert_eq!(array("ds4m_exp2_table"), EXP2_TABLE);
        assert_eq!(
            array("ds4m_four_over_pi"),
            FOUR_OVER_PI_WINDOWS.iter().map(|&w| w as u64).collect::<Vec<_>>()
        );
        let log2: Vec<u64> = LOG2_TABLE.iter().flat_map(|&(a, b)| [a, b]).collect();
        assert_eq!(array("ds4m_log2_table"), log2);
        let sc: Vec<u64> = SINCOS_POLY
            .iter()
            .flat_map(|p| p.c.iter().chain(&p.s).map(|v| v.to_bits()))
            .collect();
        assert_eq!(array("ds4m_sincos_poly"), sc);
    }
}
