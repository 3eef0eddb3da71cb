// The float transcendental functions of the forward pass, one definition shared bit for bit with the
// CPU reference (src/backend/cpu/transcend.rs): ds4 calls glibc's expf/log1pf/sinf/cosf/log2f, the
// case A vectors are that close to those values, and a vendor's float function that differs in the
// last bit for some inputs moves activations across Q8 rounding boundaries. Every kernel calls these
// names, never expf/sinf/... directly.
#pragma once

DS4_DEV float ds4_expf(float x) { return expf(x); }
DS4_DEV float ds4_log1pf(float x) { return log1pf(x); }
DS4_DEV float ds4_sinf(float x) { return sinf(x); }
DS4_DEV float ds4_cosf(float x) { return cosf(x); }
DS4_DEV float ds4_log2f(float x) { return log2f(x); }
