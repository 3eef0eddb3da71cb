//! Shared by the integration tests: a metadata-only GGUF holding the tokenizer keys (written with the
//! crate's GGUF writer), and locating the reference vectors and the case-A model.

#![allow(dead_code)]

use ds4_chat::gguf::reader::vt;
use ds4_chat::gguf::writer::GgufLayout;
use ds4_chat::gguf::{GgufFile, MetaValue};
use ds4_chat::model::tokenizer::{Tokenizer, VocabTables};
use ds4_chat::model::weights::Model;
use std::path::{Path, PathBuf};
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

const TINY_A_SHA256: &str = "78e4ad2fa157c5f8be6f2332d32e849a67fbc4a24195cbcdc62ad2391b15a57f";

pub fn vectors_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("DS4_VECTORS") {
        return Some(PathBuf::from(d));
    }
    // The repository checkout sits next to shared/ (worktrees one level deeper).
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    ["../shared/vectors", "../../shared/vectors"]
        .iter()
        .map(|r| root.join(r))
        .find(|d| d.join("case_a/manifest.json").exists())
}

fn build_tiny_a(vectors: &Path) -> Result<PathBuf, String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/ds4-vectors");
    let out = dir.join("tiny_a.gguf");
    if out.exists() {
        return Ok(out);
    }
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let tok_gz = Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/deepseek-v4-tokenizer.json.gz");
    let tok = dir.join("tokenizer.json");
    let mut s = String::new();
    use std::io::Read;
    flate2::read::GzDecoder::new(std::fs::File::open(&tok_gz).map_err(|e| format!("{}: {e}", tok_gz.display()))?)
        .read_to_string(&mut s)
        .map_err(|e| format!("{}: {e}", tok_gz.display()))?;
    std::fs::write(&tok, s).map_err(|e| e.to_string())?;
    let tmp = dir.join(format!("tiny_a.{}.tmp", std::process::id()));
    let st = std::process::Command::new("python3")
        .arg(vectors.join("gen_tiny_gguf.py"))
        .arg("--config")
        .arg(vectors.join("case_a.json"))
        .arg("--tokenizer")
        .arg(&tok)
        .arg("--out")
        .arg(&tmp)
        .status()
        .map_err(|e| format!("python3: {e}"))?;
    if !st.success() {
        return Err(format!(
            "gen_tiny_gguf.py failed ({st}); needs `pip install numpy gguf`"
        ));
    }
    std::fs::rename(&tmp, &out).map_err(|e| e.to_string())?;
    Ok(out)
}

pub fn model() -> Option<Arc<Model>> {
    static M: OnceLock<Option<Arc<Model>>> = OnceLock::new();
    M.get_or_init(|| {
        let path = match std::env::var_os("DS4_TINY_A") {
            Some(p) => PathBuf::from(p),
            None => {
                let v = vectors_dir()?;
                match build_tiny_a(&v) {
                    Ok(p) => p,
                    Err(e) => {
                        eprintln!("SKIP: cannot build tiny_a.gguf: {e}");
                        return None;
                    }
                }
            }
        };
        let bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        assert_eq!(
            bytes,
            145_854_528,
            "{}: not the case-A model (sha256 {TINY_A_SHA256})",
            path.display()
        );
        Some(Arc::new(Model::open(&path).expect("open tiny_a.gguf")))
    })
    .clone()
}
