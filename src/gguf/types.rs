//! GGML element types that ds4 files use (docs/gguf.md#element-types, #block-formats): ids, block geometry and
//! byte sizes.
//!
//! Owns only the static description of each type. Decoding lives in `dequant.rs`; dot products live in
//! the backends. Unknown ids stay raw `u32` until checked here, so a corrupt file can never produce an
//! out-of-range enum value.

use std::fmt;

/// A GGML tensor element type that ds4-chat understands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    Q8_0,
    Q2K,
    Q4K,
    Q8K,
    Iq2Xxs,
    I32,
    Bf16,
}

impl GgmlType {
    pub const ALL: [GgmlType; 9] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q8_0,
        GgmlType::Q2K,
        GgmlType::Q4K,
        GgmlType::Q8K,
        GgmlType::Iq2Xxs,
        GgmlType::I32,
        GgmlType::Bf16,
    ];

    /// Maps a raw GGML type id; `None` for ids this program does not read.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        Some(match id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            8 => GgmlType::Q8_0,
            10 => GgmlType::Q2K,
            12 => GgmlType::Q4K,
            15 => GgmlType::Q8K,
            16 => GgmlType::Iq2Xxs,
            26 => GgmlType::I32,
            30 => GgmlType::Bf16,
            _ => return None,
        })
    }

    pub fn id(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q8_0 => 8,
            GgmlType::Q2K => 10,
            GgmlType::Q4K => 12,
            GgmlType::Q8K => 15,
            GgmlType::Iq2Xxs => 16,
            GgmlType::I32 => 26,
            GgmlType::Bf16 => 30,
        }
    }

    /// Name as GGML and the `gguf` Python package spell it.
    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "F32",
            GgmlType::F16 => "F16",
            GgmlType::Q8_0 => "Q8_0",
            GgmlType::Q2K => "Q2_K",
            GgmlType::Q4K => "Q4_K",
            GgmlType::Q8K => "Q8_K",
            GgmlType::Iq2Xxs => "IQ2_XXS",
            GgmlType::I32 => "I32",
            GgmlType::Bf16 => "BF16",
        }
    }

    /// Elements per block (1 for plain types).
    pub fn block_elems(self) -> u64 {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::I32 | GgmlType::Bf16 => 1,
            GgmlType::Q8_0 => 32,
            GgmlType::Q2K | GgmlType::Q4K | GgmlType::Q8K | GgmlType::Iq2Xxs => 256,
        }
    }

    /// Bytes per block (docs/gguf.md#element-types).
    pub fn block_bytes(self) -> u64 {
        match self {
            GgmlType::F32 | GgmlType::I32 => 4,
            GgmlType::F16 | GgmlType::Bf16 => 2,
            GgmlType::Q8_0 => 34,
            GgmlType::Q2K => 84,
            GgmlType::Q4K => 144,
            GgmlType::Q8K => 292,
            GgmlType::Iq2Xxs => 66,
        }
    }

    /// Bytes of `n` elements, rounded up to whole blocks; `None` on overflow.
    pub fn bytes_for(self, n: u64) -> Option<u64> {
        n.div_ceil(self.block_elems()).checked_mul(self.block_bytes())
    }

    /// Bytes of one row of `n` elements; the row must hold whole blocks.
    pub fn row_bytes(self, n: usize) -> usize {
        debug_assert!(
            (n as u64).is_multiple_of(self.block_elems()),
            "{} row of {n} is not whole blocks",
            self.name()
        );
        n / self.block_elems() as usize * self.block_bytes() as usize
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_block_sizes_are_ggmls() {
        for t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t.id()), Some(t));
        }
        assert_eq!(GgmlType::from_id(2), None);
        assert_eq!(GgmlType::Q8_0.bytes_for(4096 * 1024), Some(4_456_448));
        assert_eq!(GgmlType::Iq2Xxs.bytes_for(4096 * 2048 * 256), Some(553_648_128));
        assert_eq!(GgmlType::Q2K.bytes_for(2048 * 4096 * 256), Some(704_643_072));
        assert_eq!(GgmlType::Q4K.bytes_for(4096 * 2048 * 256), Some(1_207_959_552));
        assert_eq!(GgmlType::Q8_0.row_bytes(4096), 4352);
    }
}
