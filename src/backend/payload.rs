//! Little-endian byte payloads of session checkpoints (`Backend::save_state` / `load_state`): the
//! writers and the bounds-checked reader both backends' formats are built from (cpu/state.rs for the
//! checkpoint payload of docs/model.md#checkpoints, hip/backend/state.rs for the device session). Owns
//! the byte encoding only; the layouts and their validation belong to the backends.

use super::EngineError;

pub fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub fn put_f32s(out: &mut Vec<u8>, v: &[f32]) {
    for x in v {
        out.extend_from_slice(&x.to_le_bytes());
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

    pub fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], EngineError> {
        let left = self.bytes.len() - self.at;
        if left < n {
            return Err(EngineError::BadCheckpoint(format!(
                "truncated at byte {} reading {what} ({n} bytes needed, {left} left)",
                self.at
            )));
        }
        let s = &self.bytes[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }

    pub fn u32(&mut self, what: &str) -> Result<u32, EngineError> {
        let s = self.take(4, what)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }

    pub fn f32s(&mut self, dst: &mut [f32], what: &str) -> Result<(), EngineError> {
        let s = self.take(dst.len() * 4, what)?;
        for (d, c) in dst.iter_mut().zip(s.chunks_exact(4)) {
            *d = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        }
        Ok(())
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
            EngineError::BadCheckpoint("truncated at byte 12 reading the count (4 bytes needed, 0 left)".into())
        );
    }
}
