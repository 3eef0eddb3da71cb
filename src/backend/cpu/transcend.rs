//! The float transcendental functions of the forward pass (exp, ln(1 + x), sin, cos, log2), one
//! definition shared bit for bit with the GPU kernels (kernels/prelude.h `ds4_expf` …).
//!
//! Why: ds4 calls glibc's float functions, and the case A vectors are that close to them that a
//! one-ulp difference in a softmax weight or a RoPE angle (which then moves an activation across a
//! Q8 rounding boundary) shows in the tolerances: evaluating these in double and rounding once
//! differs from glibc in ~1% of inputs and moves two case A prompts outside the README limits. So
//! these are glibc's values, and the kernels must compute the very same bits.
//!
//! Owns only these scalar functions.

#[inline]
pub fn exp(x: f32) -> f32 {
    x.exp()
}

/// ln(1 + x) (the router's softplus).
#[inline]
pub fn ln_1p(x: f32) -> f32 {
    x.ln_1p()
}

#[inline]
pub fn sin(x: f32) -> f32 {
    x.sin()
}

#[inline]
pub fn cos(x: f32) -> f32 {
    x.cos()
}

#[inline]
pub fn log2(x: f32) -> f32 {
    x.log2()
}
