//! Tool calls in DeepSeek V4's prompt format: the renderer against golden renderings made
//! independently (tests/fixtures/tool_render: a Python implementation of DeepSeek's published
//! encoding and the official tokenizer through the HF `tokenizers` package; its make_cases.py says
//! how to regenerate), and the streaming call parser: every rendered call block read back with the
//! text split at every byte, malformed blocks given back as text with a warning, and calls after
//! reasoning that mentions the markup, decoded token by token.

use crate::common;

use std::sync::Arc;

use ds4_chat::engine::chat_text::ChatAdapter;
use ds4_chat::engine::events::TextKind;
use ds4_chat::engine::worker::ChatText;
use ds4_chat::gguf::GgufFile;
use ds4_chat::model::chat::{Conversation, Message, Role, ThinkMode};
use ds4_chat::model::checkpoint::Generation;
use ds4_chat::model::detok::StreamDecoder;
use ds4_chat::model::dsml::{CallParser, Piece, split_answer};
use ds4_chat::model::tokenizer::Tokenizer;
use ds4_chat::model::tools::{Json, ToolCall, calls_block};

fn fixture() -> Json {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/tool_render/cases.json");
    Json::parse(&std::fs::read_to_string(path).expect("read cases.json")).expect("cases.json parses")
}

fn s<'a>(j: &'a Json, k: &str) -> &'a str {
    j.get(k).and_then(Json::as_str).unwrap_or_else(|| panic!("field {k}"))
}

fn array<'a>(j: &'a Json, k: &str) -> &'a [Json] {
    match j.get(k) {
        Some(Json::Array(a)) => a,
        _ => &[],
    }
}

/// A fixture case as the conversation the API layer builds.
fn conversation(case: &Json) -> Conversation {
    let messages = array(case, "messages")
        .iter()
        .map(|m| {
            let content = m.get("content").and_then(Json::as_str).unwrap_or("").to_string();
            match s(m, "role") {
                "system" => Message::system(content),
                "user" => Message::user(content),
                "tool" => Message::tool_result(s(m, "tool_call_id"), content),
                "assistant" => {
                    let calls = array(m, "tool_calls")
                        .iter()
                        .map(|c| ToolCall {
                            id: s(c, "id").into(),
                            name: s(c.get("function").unwrap(), "name").into(),
                            arguments: s(c.get("function").unwrap(), "arguments").into(),
                        })
                        .collect();
                    let reasoning = m.get("reasoning_content").and_then(Json::as_str).map(str::to_string);
                    Message::assistant_calls(content, reasoning, calls)
                }
                other => panic!("role {other}"),
            }
        })
        .collect();
    Conversation {
        messages,
        tools: array(case, "tools").iter().map(Json::to_python).collect(),
    }
}

fn ids(case: &Json) -> Vec<u32> {
    array(case, "ids")
        .iter()
        .map(|v| match v {
            Json::Int(i) => *i as u32,
            _ => panic!("id"),
        })
        .collect()
}

#[test]
fn renderings_equal_the_official_encoding_and_tokenizer() {
    let tok = common::gguf_tokenizer();
    let cases = fixture();
    let cases = array(&cases, "cases");
    assert!(cases.len() >= 20, "{} cases", cases.len());
    for case in cases {
        let name = s(case, "name");
        let think = match s(case, "think") {
            "off" => ThinkMode::Off,
            "high" => ThinkMode::High,
            "max" => ThinkMode::Max,
            other => panic!("{other}"),
        };
        let generation = match s(case, "generation") {
            "preview" => Generation::Preview,
            _ => Generation::V0731,
        };
        let conv = conversation(case);
        let text = conv.render_text(think, generation);
        assert_eq!(text, s(case, "text"), "{name}: text");
        assert_eq!(tok.encode(&text), ids(case), "{name}: ids");
    }
}

/// The engine's live transcript (what `serve` prefills) of a first turn with tools is the golden
/// rendering too: the system part with its tool block, then the user turn.
#[test]
fn first_turns_of_the_live_transcript_equal_the_official_encoding() {
    let gguf = GgufFile::from_bytes(common::tokenizer_gguf_bytes("deepseek4", common::vendored_tables())).unwrap();
    let tok = Arc::new(Tokenizer::from_gguf(&gguf).unwrap());
    let cases = fixture();
    let mut checked = 0;
    for case in array(&cases, "cases") {
        let conv = conversation(case);
        let first_turn = conv.messages.iter().filter(|m| m.role != Role::System).count() == 1;
        if !first_turn || s(case, "generation") != "preview" || conv.tools.is_empty() {
            continue;
        }
        let think = match s(case, "think") {
            "off" => ThinkMode::Off,
            "high" => ThinkMode::High,
            _ => ThinkMode::Max,
        };
        let mut live = ChatAdapter::new(tok.clone(), 1 << 20);
        let ids_live = live.prompt(&conv, think, &[]).expect("a prompt");
        assert_eq!(ids_live, ids(case), "{}", s(case, "name"));
        checked += 1;
    }
    assert!(checked >= 4, "only {checked} first turns with tools compared");
}

/// Every call block of the fixtures, and its calls.
fn call_blocks() -> Vec<(String, Vec<ToolCall>)> {
    let cases = fixture();
    let mut out = Vec::new();
    for case in array(&cases, "cases") {
        for m in conversation(case).messages {
            if m.role == Role::Assistant && !m.tool_calls.is_empty() {
                out.push((format!("{}{}", m.content, calls_block(&m.tool_calls)), m.tool_calls));
            }
        }
    }
    assert!(out.len() >= 15, "{} blocks", out.len());
    out
}

/// Feed `bytes` split at `cut` and collect text and calls (warnings must not occur).
fn parse_split(bytes: &[u8], cut: usize) -> (String, Vec<ToolCall>, Vec<String>) {
    let mut p = CallParser::new();
    let mut pieces = p.push_bytes(&bytes[..cut]);
    pieces.extend(p.push_bytes(&bytes[cut..]));
    pieces.extend(p.finish());
    let (mut text, mut calls, mut warnings) = (String::new(), Vec::new(), Vec::new());
    for piece in pieces {
        match piece {
            Piece::Text(t) => text.push_str(&t),
            Piece::Call(c) => calls.push(c),
            Piece::Warning(w) => warnings.push(w),
        }
    }
    (text, calls, warnings)
}

#[test]
fn every_rendered_call_block_reads_back_split_at_every_byte() {
    for (answer, calls) in call_blocks() {
        let bytes = answer.as_bytes();
        for cut in 0..=bytes.len() {
            let (text, got, warnings) = parse_split(bytes, cut);
            assert!(warnings.is_empty(), "cut {cut} of {answer:?}: {warnings:?}");
            assert_eq!(
                text,
                answer[..answer.find("\n\n<｜DSML｜").unwrap()].trim_end(),
                "cut {cut}"
            );
            assert_eq!(got.len(), calls.len(), "cut {cut} of {answer:?}");
            for (g, c) in got.iter().zip(&calls) {
                // Arguments that were not a JSON object come back as the one "arguments" string.
                let fallback = ToolCall {
                    arguments: Json::Object(vec![("arguments".into(), Json::Str(c.arguments.clone()))]).to_python(),
                    ..c.clone()
                };
                assert!(g.same_call(c) || g.same_call(&fallback), "cut {cut}: {g:?} vs {c:?}");
            }
        }
    }
}

#[test]
fn malformed_blocks_become_text_with_a_warning() {
    let good = "<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" string=\"true\">x</｜DSML｜parameter>\n</｜DSML｜invoke>";
    let cases = [
        // A number that is not JSON.
        "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"n\" string=\"false\">12abc</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
        // string= neither true nor false.
        "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"n\" string=\"maybe\">1</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
        // A repeated parameter.
        "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" string=\"true\">1</｜DSML｜parameter>\n<｜DSML｜parameter name=\"a\" string=\"true\">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
        // Junk between invokes.
        "<｜DSML｜tool_calls>\nhello\n</｜DSML｜tool_calls>",
        // The answer ends inside the block.
        "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" string=\"true\">x",
    ];
    for bad in cases.iter().flat_map(|c| [c.to_string(), format!("Here: {c}")]) {
        let bad = bad.as_str();
        let bytes = bad.as_bytes();
        for cut in 0..=bytes.len() {
            let (text, calls, warnings) = parse_split(bytes, cut);
            assert!(calls.is_empty(), "{bad:?} cut {cut}: {calls:?}");
            assert_eq!(warnings.len(), 1, "{bad:?} cut {cut}");
            assert_eq!(text, bad, "{bad:?} cut {cut}: all of it comes back as text");
        }
    }
    // A well-formed call before a malformed one is still a call; the rest is text.
    let mixed = format!(
        "<｜DSML｜tool_calls>\n{good}\n<｜DSML｜invoke name=\"g\">\n<｜DSML｜parameter oops</｜DSML｜invoke>\n</｜DSML｜tool_calls>"
    );
    let (text, calls, warnings) = parse_split(mixed.as_bytes(), 0);
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].arguments, r#"{"a": "x"}"#);
    assert_eq!(warnings.len(), 1);
    assert!(text.trim_start().starts_with("<｜DSML｜invoke name=\"g\">"), "{text:?}");
    // Text after a block and a second block.
    let (content, calls) = split_answer(&format!(
        "A\n\n<｜DSML｜tool_calls>\n{good}\n</｜DSML｜tool_calls> B <｜DSML｜tool_calls>\n{good}\n</｜DSML｜tool_calls>"
    ));
    assert_eq!((content.as_str(), calls.len()), ("A B", 2));
}

#[test]
fn calls_after_reasoning_decode_token_by_token() {
    let tok = common::gguf_tokenizer();
    // The reasoning mentions the markup; only the answer's block is a call.
    let reasoning = "I could write <｜DSML｜tool_calls> here, but not inside thinking.";
    let calls = vec![ToolCall {
        id: String::new(),
        name: "get_weather".into(),
        arguments: r#"{"city": "Paris", "days": [1, 2]}"#.into(),
    }];
    let answer = format!("Checking.{}", calls_block(&calls));
    let ids = tok.encode(&format!("{reasoning}</think>{answer}"));
    assert!(
        ids.contains(&tok.specials().dsml),
        "the markers are the DSML added token"
    );
    let mut dec = StreamDecoder::new(tok, ThinkMode::High);
    let mut parser = CallParser::new();
    let (mut thought, mut text, mut got) = (String::new(), String::new(), Vec::new());
    let mut take = |deltas: Vec<ds4_chat::model::detok::TextDelta>, parser: &mut CallParser| {
        for d in deltas {
            match d.kind {
                TextKind::Reasoning => thought.push_str(&d.text),
                TextKind::Answer => {
                    for piece in parser.push(&d.text) {
                        match piece {
                            Piece::Text(t) => text.push_str(&t),
                            Piece::Call(c) => got.push(c),
                            Piece::Warning(w) => panic!("{w}"),
                        }
                    }
                }
            }
        }
    };
    for &id in &ids {
        take(dec.push(tok, id), &mut parser);
    }
    take(dec.finish(), &mut parser);
    for piece in parser.finish() {
        assert!(!matches!(piece, Piece::Warning(_)));
        if let Piece::Text(t) = piece {
            text.push_str(&t);
        }
    }
    assert_eq!(thought, reasoning);
    assert_eq!(text, "Checking.");
    assert_eq!(got.len(), 1);
    assert!(got[0].same_call(&calls[0]), "{:?}", got[0]);
}
