//! Which model file a session and its KV snapshot belong to: the file's size and a 64-bit hash of
//! its header (metadata and tensor table, everything before the tensor data). Two files with the
//! same tensors and metadata are the same model for a snapshot; a re-quantized or other file is not.
//! A model generated in memory (`--demo`) hashes all its bytes, so two demo seeds differ while one
//! seed keeps its identity from run to run.
//!
//! Owns the identity and the hash it uses (also the snapshot's checksum).

use crate::gguf::reader::GgufFile;

/// A model file's identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ModelIdentity {
    pub file_size: u64,
    pub header_hash: u64,
}

impl ModelIdentity {
    pub fn of(file: &GgufFile) -> ModelIdentity {
        let bytes = file.bytes();
        let hashed = if file.path.is_some() {
            &bytes[..(file.data_offset as usize).min(bytes.len())]
        } else {
            bytes
        };
        ModelIdentity {
            file_size: bytes.len() as u64,
            header_hash: hash64(hashed),
        }
    }

    /// "SIZE-HASH" (decimal size, 16 hex digits), as session files store it.
    pub fn to_text(self) -> String {
        format!("{}-{:016x}", self.file_size, self.header_hash)
    }

    pub fn parse(s: &str) -> Option<ModelIdentity> {
        let (size, hash) = s.split_once('-')?;
        Some(ModelIdentity {
            file_size: size.parse().ok()?,
            header_hash: u64::from_str_radix(hash, 16).ok()?,
        })
    }
}

/// A fast non-cryptographic 64-bit hash (eight bytes per step, multiply-rotate mixing): it detects
/// changed, torn and truncated files; it does not defend against deliberate forgery.
pub fn hash64(bytes: &[u8]) -> u64 {
    let mut h = Hasher::default();
    h.update(bytes);
    h.finish()
}

/// Streaming form of [`hash64`]: the same result whatever pieces the bytes come in.
#[derive(Clone, Debug)]
pub struct Hasher {
    state: u64,
    pending: [u8; 8],
    n_pending: usize,
    len: u64,
}

const K1: u64 = 0x9E37_79B9_7F4A_7C15;
const K2: u64 = 0xC2B2_AE3D_27D4_EB4F;

impl Default for Hasher {
    fn default() -> Hasher {
        Hasher {
            state: 0x243F_6A88_85A3_08D3,
            pending: [0; 8],
            n_pending: 0,
            len: 0,
        }
    }
}

impl Hasher {
    fn word(&mut self, w: u64) {
        self.state = (self.state ^ w.wrapping_mul(K2)).rotate_left(31).wrapping_mul(K1);
    }

    pub fn update(&mut self, mut bytes: &[u8]) {
        self.len += bytes.len() as u64;
        if self.n_pending > 0 {
            let take = (8 - self.n_pending).min(bytes.len());
            self.pending[self.n_pending..self.n_pending + take].copy_from_slice(&bytes[..take]);
            self.n_pending += take;
            bytes = &bytes[take..];
            if self.n_pending < 8 {
                return;
            }
            self.word(u64::from_le_bytes(self.pending));
            self.n_pending = 0;
        }
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.word(u64::from_le_bytes(c.try_into().expect("8 bytes")));
        }
        let rest = chunks.remainder();
        self.pending[..rest.len()].copy_from_slice(rest);
        self.n_pending = rest.len();
    }

    pub fn finish(&self) -> u64 {
        let mut s = self.clone();
        let mut last = [0u8; 8];
        last[..s.n_pending].copy_from_slice(&s.pending[..s.n_pending]);
        s.word(u64::from_le_bytes(last));
        s.word(s.len);
        let mut x = s.state;
        x ^= x >> 33;
        x = x.wrapping_mul(0xFF51_AFD7_ED55_8CCD);
        x ^= x >> 33;
        x
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_sees_every_byte_and_the_length_and_ignores_how_bytes_are_split() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7 % 251) as u8).collect();
        let whole = hash64(&data);
        let mut h = Hasher::default();
        for piece in data.chunks(13) {
            h.update(piece);
        }
        assert_eq!(h.finish(), whole);
        let mut flipped = data.clone();
        flipped[500] ^= 1;
        assert_ne!(hash64(&flipped), whole);
        assert_ne!(hash64(&data[..999]), whole);
        // Trailing zero bytes change the length, so the hash too.
        assert_ne!(hash64(&[0u8; 3]), hash64(&[0u8; 4]));
    }

    #[test]
    fn identity_text_round_trips() {
        let id = ModelIdentity {
            file_size: 145_854_528,
            header_hash: 0x0123_4567_89ab_cdef,
        };
        assert_eq!(id.to_text(), "145854528-0123456789abcdef");
        assert_eq!(ModelIdentity::parse(&id.to_text()), Some(id));
        assert_eq!(ModelIdentity::parse("12"), None);
    }
}
