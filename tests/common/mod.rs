//! Shared by the integration tests: a metadata-only GGUF holding the tokenizer keys (written with the
//! crate's GGUF writer), and the case-A model of the reference vectors.

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

use crate::support;

/// The case-A model of the reference vectors: `DS4_TINY_A`, else rebuilt (and cached) by
/// tools/gen_tiny_gguf.py through the harness in tests/support. `None` after a "SKIPPED" line
/// naming the calling test where python3/numpy/gguf are missing (a failure under CI); a panic where
/// the rebuild fails.
pub fn model() -> Option<Arc<Model>> {
    static M: OnceLock<Result<Arc<Model>, String>> = OnceLock::new();
    let model = M.get_or_init(|| {
        let path = match std::env::var_os("DS4_TINY_A") {
            Some(p) => PathBuf::from(p),
            None => match support::tiny_a_model(&support::require_vectors()) {
                Ok(p) => p,
                Err(support::TinyModelError::ToolsMissing(why)) => return Err(why),
                Err(support::TinyModelError::Failed(why)) => panic!("tiny_a.gguf: {why}"),
            },
        };
        Ok(Arc::new(Model::open(&path).expect("open tiny_a.gguf")))
    });
    match model {
        Ok(m) => Some(m.clone()),
        Err(why) => {
            support::skip_or_fail(why);
            None
        }
    }
}

/// The second synthetic model (other dimensions): `DS4_TINY_B`, else tiny_b.gguf built (and cached)
/// by tools/gen_tiny_gguf.py from tests/data/tiny_b_config.json. `None` after a "SKIPPED" line where
/// python3/numpy/gguf are missing (a failure under CI).
pub fn tiny_b_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("DS4_TINY_B").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    match support::repo_model(&support::TINY_B) {
        Ok(p) => Some(p),
        Err(support::TinyModelError::ToolsMissing(why)) => {
            support::skip_or_fail(&why);
            None
        }
        Err(support::TinyModelError::Failed(why)) => panic!("tiny_b.gguf: {why}"),
    }
}
