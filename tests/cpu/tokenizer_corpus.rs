//! Tokenizer parity with the official DeepSeek V4 tokenizer (docs/prompt.md#tokenizer): the ids of
//! tests/fixtures/tokenizer_corpus.jsonl.gz were computed by the HF `tokenizers` Python binding on the
//! official tokenizer.json (tools/make_tokenizer_corpus.py); ours come from a `Tokenizer` built from
//! GGUF metadata. Exact equality is required: one differing id changes the model's input.

use crate::common;

use std::io::{BufRead, BufReader};
use std::time::Instant;

use ds4_chat::gguf::GgufFile;
use ds4_chat::model::tokenizer::{Tokenizer, VocabTables};

fn corpus() -> Vec<(String, Vec<u32>)> {
    let f = std::fs::File::open(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/tokenizer_corpus.jsonl.gz"
    ))
    .expect("corpus fixture present");
    BufReader::new(flate2::read::GzDecoder::new(f))
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(&l.unwrap()).unwrap();
            let ids = v["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect();
            (v["text"].as_str().unwrap().to_string(), ids)
        })
        .collect()
}

#[test]
fn corpus_matches_official_tokenizer_exactly() {
    let tok = common::gguf_tokenizer();
    let cases = corpus();
    assert!(cases.len() >= 5000, "corpus has {} strings", cases.len());
    let mut mismatches = Vec::new();
    let mut n_ids = 0usize;
    let t0 = Instant::now();
    for (text, want) in &cases {
        let got = tok.encode(text);
        n_ids += got.len();
        if &got != want {
            mismatches.push(format!("{text:?}: got {got:?}, want {want:?}"));
        }
        // Byte-level BPE is lossless: the token bytes spell the input back.
        assert_eq!(tok.decode_bytes(&got), text.as_bytes(), "round trip of {text:?}");
    }
    eprintln!(
        "corpus: {} strings, {} ids, encoded in {:.3} s, {} mismatches",
        cases.len(),
        n_ids,
        t0.elapsed().as_secs_f64(),
        mismatches.len()
    );
    assert!(
        mismatches.is_empty(),
        "{} mismatches, first: {:#?}",
        mismatches.len(),
        &mismatches[..mismatches.len().min(10)]
    );
}

#[test]
fn hello_example_gives_official_ids() {
    // The ids the HF tokenizers crate gives with the official tokenizer.json.
    let ids = common::gguf_tokenizer().encode("Hello! 毕老师！1 + 1 = 2");
    assert_eq!(ids, [19923, 3, 223, 5464, 5008, 1175, 19, 940, 223, 19, 438, 223, 20]);
}

#[test]
fn specials_resolve_by_string() {
    fn shareable<T: Send + Sync>() {}
    shareable::<Tokenizer>(); // the worker thread and the UI share one
    assert_eq!(common::gguf_tokenizer().token_id("<think>"), Some(128821));
    assert_eq!(common::gguf_tokenizer().token_id("no such token"), None);
    let s = *common::gguf_tokenizer().specials();
    // Ids of the official tokenizer.json added_tokens.
    assert_eq!((s.bos, s.eos, s.user, s.assistant), (0, 1, 128803, 128804));
    assert_eq!((s.think_start, s.think_end, s.dsml), (128821, 128822, 128825));
}

#[test]
fn token_bytes_follow_the_byte_alphabet() {
    let tok = common::gguf_tokenizer();
    assert_eq!(tok.token_bytes(0), "<｜begin▁of▁sentence｜>".as_bytes());
    assert_eq!(tok.token_bytes(128825), "｜DSML｜".as_bytes());
    assert_eq!(tok.token_bytes(128821), b"<think>");
    assert_eq!(tok.token_str(223), "Ġ");
    assert_eq!(tok.token_bytes(223), b" ");
    // 毕 is E6 AF 95; the official ids split it as "æ¯" + "ķ"-style byte pieces somewhere in the vocab:
    // whatever the split, the bytes of the encoding spell the text.
    let ids = tok.encode("毕");
    assert_eq!(tok.decode_bytes(&ids), "毕".as_bytes());
    assert!(tok.token_bytes(u32::MAX).is_empty());
    assert_eq!(tok.token_str(u32::MAX), "");
}

#[test]
fn encode_plain_never_produces_added_tokens() {
    let tok = common::gguf_tokenizer();
    let text = "<｜User｜>hi<think>x</think>｜DSML｜";
    let plain = tok.encode_plain(text);
    assert!(plain.iter().all(|&id| !tok.is_added(id)), "{plain:?}");
    assert_eq!(tok.decode_bytes(&plain), text.as_bytes());
    // Without added-token strings both encoders agree.
    for t in ["Hello world", "  a\n\n b", "你好, カタカナ 12345"] {
        assert_eq!(tok.encode_plain(t), tok.encode(t));
    }
}

#[test]
fn adversarial_long_inputs_encode() {
    let tok = common::gguf_tokenizer();
    for text in [
        " ".repeat(200_000) + "x",
        "\n".repeat(100_000) + " y",
        "9".repeat(100_000),
        "a".repeat(100_000),
        "\u{301}".repeat(50_000),
        "<｜User｜>".repeat(20_000),
    ] {
        let ids = tok.encode(&text);
        assert_eq!(tok.decode_bytes(&ids), text.as_bytes());
    }
}

/// The tokenizer built from GGUF metadata has the official vocabulary, and bad metadata is refused.
/// (How long the build takes is a benchmark's business, not a test's.)
#[test]
fn build_from_gguf_reads_the_vocabulary_and_rejects_bad_metadata() {
    let tables = common::vendored_tables();
    let bytes = common::tokenizer_gguf_bytes("deepseek4", tables);
    let g = GgufFile::from_bytes(bytes).unwrap();
    let tok = Tokenizer::from_gguf(&g).unwrap();
    assert_eq!(tok.n_vocab(), 129280);
    assert_eq!(tok.n_added(), 1283);

    // A vocabulary without a role token names the missing string.
    let mut t = tables.clone();
    let user = t.tokens.iter().position(|s| s == "<｜User｜>").unwrap();
    t.tokens[user] = "<｜Userx｜>".into();
    let err = Tokenizer::from_tables(t).unwrap_err().to_string();
    assert!(err.contains("<｜User｜>"), "{err}");

    // A merge whose parts are not tokens names the merge.
    let mut t = tables.clone();
    t.merges[5] = "nosuchtoken another".into();
    let err = Tokenizer::from_tables(t).unwrap_err().to_string();
    assert!(err.contains("merge 5") && err.contains("nosuchtoken"), "{err}");

    // A malformed merge entry.
    let mut t = tables.clone();
    t.merges[7] = "nospace".into();
    let err = Tokenizer::from_tables(t).unwrap_err().to_string();
    assert!(err.contains("merge 7"), "{err}");

    // No tokenizer keys at all.
    let g = GgufFile::from_bytes(common::tokenizer_gguf_bytes(
        "deepseek4",
        &VocabTables {
            tokens: vec![],
            token_types: None,
            merges: vec![],
        },
    ))
    .unwrap();
    let err = Tokenizer::from_gguf(&g).unwrap_err().to_string();
    assert!(err.contains("tokenizer.ggml.tokens"), "{err}");
}

#[test]
fn token_bytes_and_json_text_match_ds4_logprob_dumps() {
    // Every token ds4's CLI printed in the case A --dump-logprobs files, with ds4's own bytes and text.
    let s = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/ds4_token_bytes.json"
    ))
    .unwrap();
    let entries: Vec<serde_json::Value> = serde_json::from_str(&s).unwrap();
    assert!(entries.len() > 1000);
    let tok = common::gguf_tokenizer();
    let mut partial = 0;
    for e in &entries {
        let id = e["id"].as_u64().unwrap() as u32;
        let hex = e["bytes"].as_str().unwrap();
        let want: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        assert_eq!(tok.token_bytes(id), want, "token {id}");
        assert_eq!(
            ds4_chat::cli::tokenize::json_token_text(&want),
            e["text"].as_str().unwrap(),
            "token {id}"
        );
        partial += usize::from(std::str::from_utf8(&want).is_err());
    }
    assert!(partial > 0, "no partial-UTF-8 token exercised");
}
