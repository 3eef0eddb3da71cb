//! Shared by the integration tests: a metadata-only GGUF holding the tokenizer keys (written with the
//! crate's GGUF writer), and locating the reference vectors and the case-A model.

#![allow(dead_code)]

use ds4_chat::gguf::reader::vt;
use ds4_chat::gguf::writer::GgufLayout;
use ds4_chat::gguf::{GgufFile, MetaValue};
use ds4_chat::model::tokenizer::{Tokenizer, VocabTables};
use ds4_chat::model::weights::Model;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

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
    T.get_or_init(ds4_chat::genmodel::vocab::vendored_tables)
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

#[path = "../support/mod.rs"]
mod support;

/// The case-A model of the reference vectors: `DS4_TINY_A`, else rebuilt (and cached) by the vectors'
/// own recipe through the harness in tests/support. `None` (after saying why) outside CI when absent.
pub fn model() -> Option<Arc<Model>> {
    static M: OnceLock<Option<Arc<Model>>> = OnceLock::new();
    M.get_or_init(|| {
        let path = match std::env::var_os("DS4_TINY_A") {
            Some(p) => PathBuf::from(p),
            None => {
                let v = support::require_vectors()?;
                match support::tiny_a_model(&v) {
                    Ok(p) => p,
                    Err(e) if support::in_ci() => panic!("cannot build tiny_a.gguf: {e}"),
                    Err(e) => {
                        eprintln!("SKIPPED: cannot build tiny_a.gguf: {e}");
                        return None;
                    }
                }
            }
        };
        Some(Arc::new(Model::open(&path).expect("open tiny_a.gguf")))
    })
    .clone()
}
