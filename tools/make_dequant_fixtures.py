#!/usr/bin/env python3
"""Write the dequantization fixtures of tests/dequant_fixtures.rs (formats: docs/gguf.md#block-formats).

For every element type ds4-chat dequantizes (F32, F16, BF16, Q8_0, Q2_K, Q4_K, IQ2_XXS) this draws
random, valid raw bytes -- every byte random except f16 block scales, which are redrawn until finite --
and records the f32 values that the PyPI `gguf` package's reference dequantizer
(gguf.quants.dequantize) computes from them.  The Rust test compares bit for bit, so it needs no
Python at test time; this script is only rerun to regenerate the fixtures.

Files per type NAME (lower case): NAME.bin = the raw little-endian blocks, NAME.f32 = the expected
values as little-endian f32.  Deterministic (fixed seed).

usage: pip install numpy gguf; python3 tools/make_dequant_fixtures.py [OUT_DIR]
"""

import os
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGML_QUANT_SIZES
from gguf.quants import dequantize

SEED = 20261130

# type -> (file name, number of blocks, byte offsets of the f16 scales inside one block)
CASES = [
    (T.F32, "f32", 384, []),
    (T.F16, "f16", 768, []),
    (T.BF16, "bf16", 768, []),
    (T.Q8_0, "q8_0", 40, [0]),
    (T.Q2_K, "q2_k", 5, [80, 82]),
    (T.Q4_K, "q4_k", 5, [0, 2]),
    (T.IQ2_XXS, "iq2_xxs", 5, [0]),
]


def finite_f16(rng, n):
    """n random f16 bit patterns that are finite (exponent field != 31), incl. zeros and subnormals."""
    bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint32)
    bad = (bits & 0x7C00) == 0x7C00
    while bad.any():
        bits[bad] = rng.integers(0, 1 << 16, size=int(bad.sum()), dtype=np.uint32)
        bad = (bits & 0x7C00) == 0x7C00
    return bits.astype("<u2")


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "dequant")
    os.makedirs(out_dir, exist_ok=True)
    rng = np.random.default_rng(SEED)
    for qtype, name, n_blocks, scale_offsets in CASES:
        block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
        raw = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
        for off in scale_offsets:
            s = finite_f16(rng, n_blocks)
            # Most scales of moderate size (like real files); keep some raw random finite ones too.
            moderate = rng.random(n_blocks) < 0.75
            s[moderate] = (rng.standard_normal(int(moderate.sum())) * 0.05).astype("<f2").view("<u2")
            raw[:, off : off + 2] = s.view(np.uint8).reshape(n_blocks, 2)
        if qtype == T.F32:
            # Random f32 bits are mostly huge/NaN; use normals plus some special values.
            v = rng.standard_normal(n_blocks).astype("<f4")
            v[:8] = np.array([0.0, -0.0, np.inf, -np.inf, 1e-45, -3.4e38, 1.0, -1.0], dtype="<f4")
            raw = v.view(np.uint8).reshape(n_blocks, 4)
        expected = np.asarray(dequantize(raw.reshape(-1).copy(), qtype), dtype=np.float32).reshape(-1)
        assert expected.size == n_blocks * block_elems, (name, expected.size)
        raw.reshape(-1).tofile(os.path.join(out_dir, name + ".bin"))
        expected.astype("<f4").tofile(os.path.join(out_dir, name + ".f32"))
        print(f"{name:8s} {n_blocks:4d} blocks  {raw.size:6d} B in  {expected.size * 4:6d} B out")


if __name__ == "__main__":
    main()
