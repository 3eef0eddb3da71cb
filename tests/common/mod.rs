//! Shared helpers of the tokenizer integration tests: a metadata-only GGUF v3 image holding the
//! tokenizer keys (the crate's GGUF writer is not used here so these tests stand on the reader alone).

#![allow(dead_code)]

use std::sync::OnceLock;

use ds4_chat::gguf::GgufFile;
use ds4_chat::model::tokenizer::{Tokenizer, VocabTables};

const GGUF_STRING: u32 = 8;
const GGUF_ARRAY: u32 = 9;
const GGUF_INT32: u32 = 5;

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_string_kv(out: &mut Vec<u8>, key: &str, value: &str) {
    put_str(out, key);
    out.extend_from_slice(&GGUF_STRING.to_le_bytes());
    put_str(out, value);
}

fn put_string_array_kv(out: &mut Vec<u8>, key: &str, values: &[String]) {
    put_str(out, key);
    out.extend_from_slice(&GGUF_ARRAY.to_le_bytes());
    out.extend_from_slice(&GGUF_STRING.to_le_bytes());
    out.extend_from_slice(&(values.len() as u64).to_le_bytes());
    for v in values {
        put_str(out, v);
    }
}

/// GGUF v3 bytes with `general.architecture` and the tokenizer tables, no tensors.
pub fn tokenizer_gguf_bytes(arch: &str, tables: &VocabTables) -> Vec<u8> {
    let n_kv = 4 + u64::from(tables.token_types.is_some());
    let mut out = Vec::with_capacity(8 << 20);
    out.extend_from_slice(b"GGUF");
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&0u64.to_le_bytes()); // tensors
    out.extend_from_slice(&n_kv.to_le_bytes());
    put_string_kv(&mut out, "general.architecture", arch);
    put_string_kv(&mut out, "tokenizer.ggml.model", "gpt2");
    put_string_array_kv(&mut out, "tokenizer.ggml.tokens", &tables.tokens);
    if let Some(types) = &tables.token_types {
        put_str(&mut out, "tokenizer.ggml.token_type");
        out.extend_from_slice(&GGUF_ARRAY.to_le_bytes());
        out.extend_from_slice(&GGUF_INT32.to_le_bytes());
        out.extend_from_slice(&(types.len() as u64).to_le_bytes());
        for t in types {
            out.extend_from_slice(&t.to_le_bytes());
        }
    }
    put_string_array_kv(&mut out, "tokenizer.ggml.merges", &tables.merges);
    out
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
