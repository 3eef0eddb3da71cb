//! Counter-based pseudo-random numbers for synthetic weights.
//!
//! Word `j` of a stream is a pure function of (stream key, j) — splitmix64's output mix applied to
//! key + j·φ — so any block of any tensor can be generated independently, in any order, on any
//! thread, and the file bytes never depend on how the work was split.

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// splitmix64's finalizer: a bijective avalanche mix of one u64.
#[inline]
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// 64-bit FNV-1a of a name (stream keys are derived from tensor names).
pub fn fnv1a(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// One independent random stream (e.g. one tensor of one seed).
#[derive(Clone, Copy, Debug)]
pub struct Stream {
    key: u64,
}

impl Stream {
    pub fn new(seed: u64, name: &str) -> Stream {
        Stream {
            key: mix64(mix64(seed ^ 0x6473_3463_6861_7421) ^ fnv1a(name)),
        }
    }

    /// Word `j` of the stream.
    #[inline]
    pub fn word(&self, j: u64) -> u64 {
        mix64(self.key.wrapping_add(j.wrapping_mul(GOLDEN)))
    }

    /// Uniform in [0, 1) from word `j` (53 bits).
    #[inline]
    pub fn uniform(&self, j: u64) -> f64 {
        (self.word(j) >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Approximately standard normal from word `j`: the sum of four 16-bit uniforms (Irwin–Hall,
    /// mean 2, variance 1/3), centred and scaled to unit variance. Bounded by ±2√3, which is all a
    /// synthetic weight needs, and one word per value keeps generation cheap.
    #[inline]
    pub fn normal(&self, j: u64) -> f32 {
        let w = self.word(j);
        let s = (w & 0xffff) + ((w >> 16) & 0xffff) + ((w >> 32) & 0xffff) + (w >> 48);
        ((s as f32 + 2.0) * (1.0 / 65536.0) - 2.0) * 1.732_050_8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normal_has_unit_moments_and_streams_differ() {
        let s = Stream::new(1, "x");
        let n = 200_000u64;
        let (mut m1, mut m2) = (0f64, 0f64);
        for j in 0..n {
            let v = s.normal(j) as f64;
            m1 += v;
            m2 += v * v;
        }
        let (mean, var) = (m1 / n as f64, m2 / n as f64 - (m1 / n as f64).powi(2));
        // Sampling error of the mean is 1/√n ≈ 0.0022, of the variance ≈ √(2/n)·0.9 ≈ 0.003.
        assert!(mean.abs() < 0.01, "mean {mean}");
        assert!((var - 1.0).abs() < 0.015, "var {var}");
        assert_ne!(Stream::new(1, "x").word(0), Stream::new(2, "x").word(0));
        assert_ne!(Stream::new(1, "x").word(0), Stream::new(1, "y").word(0));
        assert_eq!(Stream::new(7, "x").word(5), Stream::new(7, "x").word(5));
    }
}
