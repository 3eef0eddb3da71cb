//! Shared helpers of the tokenizer integration tests: a metadata-only GGUF (no tensors) holding the
//! tokenizer keys, written with the crate's GGUF writer and read back through the reader.

#![allow(dead_code)]

use std::sync::OnceLock;

use ds4_chat::gguf::reader::vt;
use ds4_chat::gguf::writer::GgufLayout;
use ds4_chat::gguf::{GgufFile, MetaValue};
use ds4_chat::model::tokenizer::{Tokenizer, VocabTables};

/// GGUF v3 bytes with `general.architecture` and the tokenizer tables, no tensors.
pub fn tokenizer_gguf_bytes(arch: &str, tables: &VocabTables) -> Vec<u8> {
    let strings = |xs: &[String]| MetaValue::Array(vt::STRING, xs.iter().cloned().map(MetaValue::String).collect());
    let mut meta = vec![
        ("general.architecture".to_string(), MetaValue::String(arch.into())),
        ("tokenizer.ggml.model".to_string(), MetaValue::String("gpt2".into())),
        ("tokenizer.ggml.tokens".to_string(), strings(&tables.tokens)),
        ("tokenizer.ggml.merges".to_string(), strings(&tables.merges)),
    ];
    if let Some(types) = &tables.token_types {
        meta.push((
            "tokenizer.ggml.token_type".to_string(),
            MetaValue::Array(vt::I32, types.iter().map(|&t| MetaValue::I32(t)).collect()),
        ));
    }
    GgufLayout::new(&meta, &[])
        .expect("metadata-only layout")
        .to_vec(1 << 20, |_, _, _| {})
}

/// The vendored official vocabulary as GGUF tables (parsed once per test binary).
pub fn vendored_tables() -> &'static VocabTables {
    static T: OnceLock<VocabTables> = OnceLock::new();
    T.get_or_init(VocabTables::vendored)
}

/// A tokenizer built through `Tokenizer::from_gguf` from an in-memory GGUF (built once per test binary).
pub fn gguf_tokenizer() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| {
        let g = GgufFile::from_bytes(tokenizer_gguf_bytes("deepseek4", vendored_tables())).expect("test GGUF parses");
        Tokenizer::from_gguf(&g).expect("tokenizer builds from GGUF metadata")
    })
}

/// The same metadata-only GGUF written to a file (for the binary's tests).
pub fn tokenizer_gguf_file(name: &str, arch: &str) -> std::path::PathBuf {
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::write(&path, tokenizer_gguf_bytes(arch, vendored_tables())).expect("write test GGUF");
    path
}
