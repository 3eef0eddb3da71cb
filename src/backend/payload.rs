//! Little-endian byte payloads of session checkpoints (`DeviceSession::save_state` / `load_state`): the
//! writers and the bounds-checked reader both backends' formats are built from (cpu/state.rs for the
//! checkpoint payload of docs/model.md#checkpoints, hip/session/state.rs for the device session). Owns
//! the byte encoding only; the layouts and their validation belong to the backends.

use std::borrow::Cow;

use super::BackendError;
use crate::gguf::half::{f16_to_f32, f32_to_f16};

/// Element width word of [`put_rows`]: the rows follow as f16.
const ROWS_F16: u32 = 2;
/// Element width word of [`put_rows`]: the rows follow as f32.
const ROWS_F32: u32 = 4;

pub fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub fn put_f32s(out: &mut Vec<u8>, v: &[f32]) {
    for x in v {
        out.extend_from_slice(&x.to_le_bytes());
    }
}

/// Cache rows given as little-endian f32 bytes: a u32 element width, then the values as f16 when
/// every one of them converts back to the same f32 bits (cache rows are stored f16-rounded, so this
/// halves a checkpoint without changing a bit), else as the f32 bytes unchanged.
pub fn put_rows(out: &mut Vec<u8>, f32_bytes: &[u8]) {
    let halves: Option<Vec<u16>> = f32_bytes
        .chunks_exact(4)
        .map(|c| {
            let x = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            let h = f32_to_f16(x);
            (f16_to_f32(h).to_bits() == x.to_bits()).then_some(h)
        })
        .collect();
    match halves {
        Some(h) => {
            put_u32(out, ROWS_F16);
            out.reserve(2 * h.len());
            for v in h {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        None => {
            put_u32(out, ROWS_F32);
            out.extend_from_slice(f32_bytes);
        }
    }
}

/// Reads a payload front to back; running out of bytes is a `BadCheckpoint` naming the field.
pub struct PayloadReader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> PayloadReader<'a> {
    pub fn new(bytes: &'a [u8]) -> PayloadReader<'a> {
        PayloadReader { bytes, at: 0 }
    }

    pub fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], BackendError> {
        let left = self.bytes.len() - self.at;
        if left < n {
            return Err(BackendError::BadCheckpoint(format!(
                "truncated at byte {} reading {what} ({n} bytes needed, {left} left)",
                self.at
            )));
        }
        let s = &self.bytes[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }

    pub fn u32(&mut self, what: &str) -> Result<u32, BackendError> {
        let s = self.take(4, what)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }

    pub fn f32s(&mut self, dst: &mut [f32], what: &str) -> Result<(), BackendError> {
        let s = self.take(dst.len() * 4, what)?;
        for (d, c) in dst.iter_mut().zip(s.chunks_exact(4)) {
            *d = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        }
        Ok(())
    }

    /// `n` values written by [`put_rows`], as little-endian f32 bytes.
    pub fn rows(&mut self, n: usize, what: &str) -> Result<Cow<'a, [u8]>, BackendError> {
        match self.u32(&format!("{what} element width"))? {
            ROWS_F32 => Ok(Cow::Borrowed(self.take(4 * n, what)?)),
            ROWS_F16 => {
                let s = self.take(2 * n, what)?;
                let mut v = Vec::with_capacity(4 * n);
                for c in s.chunks_exact(2) {
                    v.extend_from_slice(&f16_to_f32(u16::from_le_bytes([c[0], c[1]])).to_le_bytes());
                }
                Ok(Cow::Owned(v))
            }
            w => Err(BackendError::BadCheckpoint(format!(
                "{what}: element width {w}, expected {ROWS_F16} or {ROWS_F32}"
            ))),
        }
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.bytes.len() - self.at
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_truncation_names_the_field() {
        let mut out = Vec::new();
        put_u32(&mut out, 7);
        put_f32s(&mut out, &[1.5, -2.0]);
        let mut r = PayloadReader::new(&out);
        assert_eq!(r.u32("a").unwrap(), 7);
        let mut v = [0f32; 2];
        r.f32s(&mut v, "b").unwrap();
        assert_eq!(v, [1.5, -2.0]);
        assert_eq!(r.remaining(), 0);
        let e = r.u32("the count").unwrap_err();
        assert_eq!(
            e,
            BackendError::BadCheckpoint("truncated at byte 12 reading the count (4 bytes needed, 0 left)".into())
        );
    }

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        let mut out = Vec::new();
        put_f32s(&mut out, v);
        out
    }

    /// f16-exact rows take 2 bytes a value and come back bit for bit; one inexact value keeps the
    /// block f32; an unknown width is refused.
    #[test]
    fn rows_are_f16_exactly_when_lossless() {
        let exact = f32_bytes(&[1.5, -0.0, 65504.0, 2.0f32.powi(-24), -3.25]);
        let mut out = Vec::new();
        put_rows(&mut out, &exact);
        assert_eq!(out.len(), 4 + 2 * 5);
        let inexact = f32_bytes(&[1.5, 1.0 + 2.0f32.powi(-20)]);
        put_rows(&mut out, &inexact);
        assert_eq!(out.len(), 4 + 2 * 5 + 4 + 4 * 2);
        let mut r = PayloadReader::new(&out);
        assert_eq!(&*r.rows(5, "a").unwrap(), &exact[..]);
        assert_eq!(&*r.rows(2, "b").unwrap(), &inexact[..]);
        assert_eq!(r.remaining(), 0);
        let mut bad = Vec::new();
        put_u32(&mut bad, 3);
        assert!(
            matches!(PayloadReader::new(&bad).rows(0, "c"), Err(BackendError::BadCheckpoint(m)) if m.contains("element width 3"))
        );
    }
}
