//! Tokenizer metadata of synthetic models, built from the vendored official tokenizer.json
//! (`model::tokenizer::vendored_tokenizer_json`), exactly as ../shared/vectors/gen_tiny_gguf.py's
//! `load_tokenizer` does: ids are indices, added tokens override the BPE vocabulary at their ids,
//! gaps (none in the official file) become `[PADi]` with type 5.

use std::sync::Mutex;

use serde_json::Value;

use crate::gguf::{GgufError, MetaValue, reader::vt};
use crate::model::tokenizer::{VocabTables, vendored_tokenizer_json};

/// GGUF token types (llama.cpp convention).
const TYPE_NORMAL: i32 = 1;
const TYPE_CONTROL: i32 = 3;
const TYPE_USER_DEFINED: i32 = 4;
const TYPE_UNUSED: i32 = 5;

pub const BOS_TEXT: &str = "<｜begin▁of▁sentence｜>";
pub const EOS_TEXT: &str = "<｜end▁of▁sentence｜>";

/// Vocabulary as GGUF arrays.
#[derive(Clone)]
pub struct VocabMeta {
    pub tokens: Vec<String>,
    pub types: Vec<i32>,
    pub merges: Vec<String>,
    pub bos: u32,
    pub eos: u32,
}

/// Parse a tokenizer.json into `n_vocab` tokens (ids ≥ n_vocab are dropped), types and merges.
pub fn vocab_from_tokenizer_json(json: &[u8], n_vocab: usize) -> Result<VocabMeta, GgufError> {
    let bad = |what: &str| GgufError::msg(format!("tokenizer.json: {what}"));
    let tj: Value = serde_json::from_slice(json).map_err(|e| bad(&format!("not valid JSON: {e}")))?;
    let vocab = tj["model"]["vocab"]
        .as_object()
        .ok_or_else(|| bad("model.vocab is not an object"))?;
    let mut tokens: Vec<Option<String>> = vec![None; n_vocab];
    let mut types = vec![TYPE_NORMAL; n_vocab];
    for (tok, id) in vocab {
        let id = id
            .as_u64()
            .ok_or_else(|| bad(&format!("vocab id of '{tok}' is not an integer")))? as usize;
        if id < n_vocab {
            tokens[id] = Some(tok.clone());
        }
    }
    let added = tj["added_tokens"]
        .as_array()
        .ok_or_else(|| bad("added_tokens is not an array"))?;
    for a in added {
        let id = a["id"]
            .as_u64()
            .ok_or_else(|| bad("added token without an integer id"))? as usize;
        let content = a["content"]
            .as_str()
            .ok_or_else(|| bad("added token without content"))?;
        if id < n_vocab {
            tokens[id] = Some(content.to_string());
            types[id] = if a["special"].as_bool() == Some(true) {
                TYPE_CONTROL
            } else {
                TYPE_USER_DEFINED
            };
        }
    }
    let tokens: Vec<String> = tokens
        .into_iter()
        .enumerate()
        .map(|(i, t)| {
            t.unwrap_or_else(|| {
                types[i] = TYPE_UNUSED;
                format!("[PAD{i}]")
            })
        })
        .collect();
    let merges = tj["model"]["merges"]
        .as_array()
        .ok_or_else(|| bad("model.merges is not an array"))?;
    let merges = merges
        .iter()
        .map(|m| match m {
            Value::String(s) => Ok(s.clone()),
            Value::Array(p) if p.len() == 2 && p.iter().all(|x| x.is_string()) => Ok(format!(
                "{} {}",
                p[0].as_str().unwrap_or(""),
                p[1].as_str().unwrap_or("")
            )),
            _ => Err(bad("a merge is neither \"a b\" nor [a, b]")),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let find = |text: &str| tokens.iter().position(|t| t == text).map(|i| i as u32);
    let bos = find(BOS_TEXT).unwrap_or(0);
    let eos = find(EOS_TEXT).unwrap_or(1);
    Ok(VocabMeta {
        tokens,
        types,
        merges,
        bos,
        eos,
    })
}

/// The vendored tokenizer's vocabulary cut to `n_vocab` (parsed once per size and cached: tests and
/// `--demo` build several models).
pub fn vendored_vocab(n_vocab: usize) -> Result<VocabMeta, GgufError> {
    static CACHE: Mutex<Vec<(usize, VocabMeta)>> = Mutex::new(Vec::new());
    if let Some((_, v)) = CACHE
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .find(|(n, _)| *n == n_vocab)
    {
        return Ok(v.clone());
    }
    let v = vocab_from_tokenizer_json(&vendored_tokenizer_json(), n_vocab)?;
    CACHE
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push((n_vocab, v.clone()));
    Ok(v)
}

/// The tables of the vendored official tokenizer.json (all 129280 ids), laid out as
/// `gen_tiny_gguf.py` writes them.
pub fn vendored_tables() -> VocabTables {
    let v = vendored_vocab(129_280).expect("vendored tokenizer.json has the expected layout");
    VocabTables {
        tokens: v.tokens,
        token_types: Some(v.types),
        merges: v.merges,
    }
}

/// The `tokenizer.ggml.*` metadata entries.
pub fn tokenizer_metadata(v: VocabMeta) -> Vec<(String, MetaValue)> {
    let strings = |xs: Vec<String>| MetaValue::Array(vt::STRING, xs.into_iter().map(MetaValue::String).collect());
    vec![
        ("tokenizer.ggml.model".into(), MetaValue::String("gpt2".into())),
        ("tokenizer.ggml.pre".into(), MetaValue::String("joyai-llm".into())),
        ("tokenizer.ggml.tokens".into(), strings(v.tokens)),
        (
            "tokenizer.ggml.token_type".into(),
            MetaValue::Array(vt::I32, v.types.into_iter().map(MetaValue::I32).collect()),
        ),
        ("tokenizer.ggml.merges".into(), strings(v.merges)),
        ("tokenizer.ggml.bos_token_id".into(), MetaValue::U32(v.bos)),
        ("tokenizer.ggml.eos_token_id".into(), MetaValue::U32(v.eos)),
        ("tokenizer.ggml.padding_token_id".into(), MetaValue::U32(v.eos)),
        ("tokenizer.ggml.add_bos_token".into(), MetaValue::Bool(false)),
        ("tokenizer.ggml.add_eos_token".into(), MetaValue::Bool(false)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tokenizer::Tokenizer;

    #[test]
    fn vendored_vocab_has_every_id_and_the_specials() {
        let v = vendored_vocab(129280).unwrap();
        assert_eq!(v.tokens.len(), 129280);
        assert_eq!((v.bos, v.eos), (0, 1));
        assert_eq!(v.tokens[129279], "<｜image｜>");
        // 1283 added tokens; the official file has no gaps, so no token is "[PAD…]".
        assert_eq!(
            v.types
                .iter()
                .filter(|&&t| t == TYPE_CONTROL || t == TYPE_USER_DEFINED)
                .count(),
            1283
        );
        assert!(!v.types.contains(&TYPE_UNUSED));
        assert_eq!(v.merges.len(), 127741);
        assert_eq!(v.merges[0], "Ġ t");
    }

    #[test]
    fn gaps_and_pair_merges() {
        let json = br#"{"model":{"vocab":{"a":0,"b":2},"merges":[["a","b"],"b a"]},
            "added_tokens":[{"id":3,"content":"<x>","special":true}]}"#;
        let v = vocab_from_tokenizer_json(json, 5).unwrap();
        assert_eq!(v.tokens, ["a", "[PAD1]", "b", "<x>", "[PAD4]"]);
        assert_eq!(v.types, [1, 5, 1, 3, 5]);
        assert_eq!(v.merges, ["a b", "b a"]);
        assert!(vocab_from_tokenizer_json(b"{}", 5).is_err());
    }

    #[test]
    fn derived_added_tokens_equal_token_type_rule() {
        let tables = vendored_tables();
        let with_types = Tokenizer::from_tables(tables.clone()).unwrap();
        let derived = Tokenizer::from_tables(VocabTables {
            token_types: None,
            ..tables
        })
        .unwrap();
        assert_eq!(with_types.n_added(), 1283);
        assert_eq!(derived.n_added(), 1283);
        for id in 0..with_types.n_vocab() as u32 {
            assert_eq!(with_types.is_added(id), derived.is_added(id), "id {id}");
        }
        let text = "<｜begin▁of▁sentence｜>Hi<｜User｜>x<think>y</think>｜DSML｜<｜/table>｜DSML｜";
        assert_eq!(with_types.encode(text), derived.encode(text));
    }
}
