//! `ds4-chat tokenize`: the ids a model file's tokenizer gives a text (docs/prompt.md#tokenizer;
//! `--dump-tokens`: docs/sampler.md#log-probability-dumps).
//!
//! Reads only the file's metadata (no weight is bound or touched). Output: one line per token,
//! `id<TAB>text`, where text is the token's decoded bytes with `\\`, `\n`, `\r`, `\t`, other control
//! characters and invalid UTF-8 bytes escaped (`\xNN`); with `--json`, exactly one line
//! `{"ids":[…],"tokens":[…]}`, each token's decoded text (bytes that are not valid UTF-8 are given as
//! the characters U+0080–U+00FF of the same value, as ds4's logprob dumps do).

use std::io::{Read, Write};
use std::path::PathBuf;

use super::CliResult;
use crate::gguf::GgufFile;
use crate::model::hparams::ARCH;
use crate::model::tokenizer::Tokenizer;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Model file (a ds4 DeepSeek V4 Flash GGUF; only its tokenizer metadata is read).
    #[arg(long, short = 'm')]
    pub model: PathBuf,
    /// Print one JSON line {"ids":[...],"tokens":[...]}.
    #[arg(long)]
    pub json: bool,
    /// Tokenize as plain text: role markers and other added-token strings are not recognized.
    #[arg(long)]
    pub plain: bool,
    /// The text, or `-` to read it from stdin (taken exactly, trailing newline included).
    pub text: String,
}

pub fn run(args: Args) -> CliResult {
    let text = if args.text == "-" {
        let mut buf = Vec::new();
        std::io::stdin()
            .read_to_end(&mut buf)
            .map_err(|e| format!("cannot read stdin: {e}"))?;
        String::from_utf8(buf)
            .map_err(|e| format!("stdin is not valid UTF-8 (byte {})", e.utf8_error().valid_up_to()))?
    } else {
        args.text.clone()
    };
    let tok = load_tokenizer(&args.model)?;
    let ids = if args.plain {
        tok.encode_plain(&text)
    } else {
        tok.encode(&text)
    };

    let mut out = String::new();
    if args.json {
        let tokens: Vec<String> = ids.iter().map(|&id| json_token_text(tok.token_bytes_ref(id))).collect();
        out.push_str(&serde_json::json!({ "ids": ids, "tokens": tokens }).to_string());
        out.push('\n');
    } else {
        for &id in &ids {
            out.push_str(&format!("{id}\t{}\n", escape_bytes(tok.token_bytes_ref(id))));
        }
    }
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(out.as_bytes())
        .and_then(|_| stdout.flush())
        .map_err(|e| format!("cannot write output: {e}"))
}

/// Open a model file for its tokenizer only: the architecture must be DeepSeek V4 Flash.
pub fn load_tokenizer(path: &std::path::Path) -> Result<Tokenizer, String> {
    let g = GgufFile::open(path).map_err(|e| e.to_string())?;
    match g.get("general.architecture").and_then(|v| v.as_str()) {
        Some(ARCH) => {}
        Some(other) => {
            return Err(format!(
                "{}: wrong model: general.architecture is '{other}', expected '{ARCH}' (DeepSeek V4 Flash)",
                path.display()
            ));
        }
        None => {
            return Err(format!(
                "{}: wrong model: key 'general.architecture' missing, expected '{ARCH}'",
                path.display()
            ));
        }
    }
    Tokenizer::from_gguf(&g).map_err(|e| e.to_string())
}

/// Token bytes for a terminal line: printable text as is, the rest escaped.
pub fn escape_bytes(b: &[u8]) -> String {
    let mut s = String::with_capacity(b.len());
    for chunk in b.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\\' => s.push_str("\\\\"),
                '\n' => s.push_str("\\n"),
                '\r' => s.push_str("\\r"),
                '\t' => s.push_str("\\t"),
                c if c.is_control() => {
                    if (c as u32) < 0x100 {
                        s.push_str(&format!("\\x{:02x}", c as u32));
                    } else {
                        s.push_str(&format!("\\u{{{:x}}}", c as u32));
                    }
                }
                c => s.push(c),
            }
        }
        for byte in chunk.invalid() {
            s.push_str(&format!("\\x{byte:02x}"));
        }
    }
    s
}

/// Token bytes as a JSON string value: the text when valid UTF-8, else every byte >= 0x80 as the
/// code point of the same value (ds4's convention in logprob dumps,
/// docs/sampler.md#log-probability-dumps).
pub fn json_token_text(b: &[u8]) -> String {
    match std::str::from_utf8(b) {
        Ok(s) => s.to_string(),
        Err(_) => b.iter().map(|&x| char::from(x)).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_controls_and_invalid_bytes() {
        assert_eq!(escape_bytes(b"a b"), "a b");
        assert_eq!(escape_bytes(b"\n\t\r\\"), "\\n\\t\\r\\\\");
        assert_eq!(escape_bytes(b"\x00\x7f"), "\\x00\\x7f");
        assert_eq!(escape_bytes("é毕".as_bytes()), "é毕");
        assert_eq!(escape_bytes(b"\xe6\xaf"), "\\xe6\\xaf");
        assert_eq!(escape_bytes("\u{2028}".as_bytes()), "\u{2028}");
        assert_eq!(escape_bytes("\u{85}".as_bytes()), "\\x85");
    }

    #[test]
    fn json_text_of_partial_utf8_uses_byte_code_points() {
        assert_eq!(json_token_text("毕".as_bytes()), "毕");
        assert_eq!(json_token_text(b"\xe6\xaf"), "\u{e6}\u{af}");
    }
}
