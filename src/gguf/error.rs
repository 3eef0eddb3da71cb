//! One error type for everything that reads or validates a model file.
//!
//! Every message is one line that names the file, and where it helps the byte offset, the key or the
//! tensor, with what was expected and what was found. Nothing here panics.

use std::fmt;
use std::path::Path;

#[derive(Debug, Clone, PartialEq)]
pub struct GgufError {
    /// The file, when known (parsing from a byte slice has none).
    pub file: Option<String>,
    /// Byte offset in the file where the problem was found.
    pub offset: Option<u64>,
    pub message: String,
}

impl GgufError {
    pub fn at(offset: u64, message: impl Into<String>) -> Self {
        GgufError {
            file: None,
            offset: Some(offset),
            message: message.into(),
        }
    }

    pub fn msg(message: impl Into<String>) -> Self {
        GgufError {
            file: None,
            offset: None,
            message: message.into(),
        }
    }

    /// Attach the file name (kept if one is already set).
    pub fn in_file(mut self, path: &Path) -> Self {
        if self.file.is_none() {
            self.file = Some(path.display().to_string());
        }
        self
    }
}

impl fmt::Display for GgufError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(file) = &self.file {
            write!(f, "{file}: ")?;
        }
        if let Some(off) = self.offset {
            write!(f, "offset {off} (0x{off:x}): ")?;
        }
        f.write_str(&self.message)
    }
}

impl std::error::Error for GgufError {}
