//! Reference dequantization (docs/gguf.md#block-formats) proven bit for bit against the PyPI `gguf` package.
//!
//! tests/fixtures/dequant/NAME.bin holds random valid blocks (finite f16 scales) and NAME.f32 the f32
//! values `gguf.quants.dequantize` computed from them (tools/make_dequant_fixtures.py, committed so
//! no Python is needed here). Tolerance: none — every output must have the oracle's exact bits
//! (NaN included), since the decoding is a fixed sequence of f32 multiplications.

use std::path::PathBuf;

use ds4_chat::gguf::GgmlType;
use ds4_chat::gguf::dequant::dequantize;

fn fixture(name: &str, ext: &str) -> Vec<u8> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/dequant/{name}.{ext}"));
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn check(ty: GgmlType, name: &str, min_blocks: usize) {
    let raw = fixture(name, "bin");
    let want: Vec<u32> = fixture(name, "f32")
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let bb = ty.block_bytes() as usize;
    assert_eq!(raw.len() % bb, 0, "{name}: fixture is not whole blocks");
    let n_blocks = raw.len() / bb;
    assert!(n_blocks >= min_blocks, "{name}: only {n_blocks} blocks");
    assert_eq!(
        want.len(),
        n_blocks * ty.block_elems() as usize,
        "{name}: expected-value count"
    );
    let got = dequantize(ty, &raw, want.len()).unwrap();
    let mut mismatches = 0;
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        if g.to_bits() != *w {
            if mismatches < 5 {
                eprintln!(
                    "{name}[{i}] (block {}): got {g:e} ({:#010x}), gguf says {:e} ({w:#010x})",
                    i / ty.block_elems() as usize,
                    g.to_bits(),
                    f32::from_bits(*w)
                );
            }
            mismatches += 1;
        }
    }
    assert_eq!(
        mismatches,
        0,
        "{name}: {mismatches} of {} values differ from gguf",
        want.len()
    );
    // The fixture must exercise the format, not only zeros.
    let nonzero = got.iter().filter(|v| **v != 0.0).count();
    assert!(nonzero > want.len() / 2, "{name}: only {nonzero} nonzero values");
}

/// One `#[test]` per format: `name: type, fixture, fewest blocks`.
macro_rules! fixture_tests {
    ($($test:ident: $ty:ident, $fixture:literal, $min_blocks:literal;)*) => {$(
        #[test]
        fn $test() {
            check(GgmlType::$ty, $fixture, $min_blocks);
        }
    )*};
}

fixture_tests! {
    f32_matches_gguf: F32, "f32", 256;
    f16_matches_gguf: F16, "f16", 512;
    bf16_matches_gguf: Bf16, "bf16", 512;
    q8_0_matches_gguf: Q8_0, "q8_0", 32;
    q2_k_matches_gguf: Q2K, "q2_k", 4;
    q4_k_matches_gguf: Q4K, "q4_k", 4;
    iq2_xxs_matches_gguf: Iq2Xxs, "iq2_xxs", 4;
}
