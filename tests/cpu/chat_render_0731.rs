//! The reasoning-effort text after BOS for every think mode and both checkpoint generations: the
//! preview files (no text for high, "Absolute maximum" for max) and the 0731 files ("Absolute
//! maximum" for high, "Beyond maximum" for max), recognised from `quantize.imatrix.file`. The
//! expected bytes are spelled out here, independently of the crate's constants.

use crate::common;

use ds4_chat::gguf::writer::GgufLayout;
use ds4_chat::gguf::{GgufFile, MetaValue};
use ds4_chat::model::chat::{Conversation, Message, ThinkMode, Transcript, one_shot_prompt};
use ds4_chat::model::checkpoint::Generation;
use ds4_chat::model::tokenizer::Tokenizer;

const BOS: &str = "<｜begin▁of▁sentence｜>";

const ABSOLUTE: &str = "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n\
You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root cause, \
rigorously stress-testing your logic against all potential paths, edge cases, and adversarial scenarios.\n\
Explicitly write out your entire deliberation process, documenting every intermediate step, considered \
alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n";

const BEYOND: &str = "Reasoning Effort: Beyond maximum \u{2014} exhaustive, relentless, and uncompromising.\n\
You MUST reason with the utmost depth and rigor, leaving absolutely nothing to chance: exhaustively decompose \
the problem into its most fundamental components, trace every causal chain to its root, and resolve the \
underlying cause rather than any surface symptom.\n\
Do not stop reasoning until you have independently verified the solution from multiple angles and are certain \
that no assumption remains unchecked and no error remains undiscovered.\n\n";

/// A metadata-only GGUF with the tokenizer and, when given, `quantize.imatrix.file`.
fn tokenizer_with_imatrix(imatrix: Option<&str>) -> Tokenizer {
    let plain = common::tokenizer_gguf_bytes("deepseek4", common::vendored_tables());
    let g = GgufFile::from_bytes(plain).unwrap();
    let mut meta: Vec<(String, MetaValue)> = g.metadata.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    if let Some(f) = imatrix {
        meta.push(("quantize.imatrix.file".into(), MetaValue::String(f.into())));
    }
    let bytes = GgufLayout::new(&meta, &[]).unwrap().to_vec(1 << 20, |_, _, _| {});
    Tokenizer::from_gguf(&GgufFile::from_bytes(bytes).unwrap()).unwrap()
}

fn tokenizers() -> [(Generation, Tokenizer); 2] {
    [
        (
            Generation::Preview,
            tokenizer_with_imatrix(Some("gguf/DeepSeek-V4-Flash-chat-v2-routed-moe-ds4-1p5m-fixed.dat")),
        ),
        (
            Generation::V0731,
            tokenizer_with_imatrix(Some("gguf/DeepSeek-V4-Flash-0731-chat-v2-routed-moe-ds4.dat")),
        ),
    ]
}

fn expected_effort(generation: Generation, think: ThinkMode) -> &'static str {
    match (generation, think) {
        (_, ThinkMode::Off) => "",
        (Generation::Preview, ThinkMode::High) => "",
        (Generation::Preview, ThinkMode::Max) => ABSOLUTE,
        (Generation::V0731, ThinkMode::High) => ABSOLUTE,
        (Generation::V0731, ThinkMode::Max) => BEYOND,
    }
}

#[test]
fn the_dash_is_an_em_dash_and_the_texts_end_in_a_blank_line() {
    let at = BEYOND.find("maximum ").unwrap() + "maximum ".len();
    assert_eq!(&BEYOND.as_bytes()[at..at + 4], b"\xe2\x80\x94 ");
    for t in [ABSOLUTE, BEYOND] {
        assert!(t.ends_with(".\n\n") && t.matches('\n').count() == 4, "{t:?}");
    }
    assert_eq!(ABSOLUTE, ds4_chat::model::chat::THINK_MAX_PREFIX);
    assert_eq!(BEYOND, ds4_chat::model::chat::THINK_MAX_PREFIX_0731);
}

#[test]
fn the_generation_comes_from_the_imatrix_key() {
    let [(_, preview), (_, v0731)] = tokenizers();
    assert_eq!(preview.generation(), Generation::Preview);
    assert_eq!(v0731.generation(), Generation::V0731);
    assert_eq!(tokenizer_with_imatrix(None).generation(), Generation::Preview);
}

#[test]
fn server_form_bytes_for_every_mode_and_generation() {
    let mut c = Conversation::new();
    c.push(Message::system("You are a helpful assistant"))
        .push(Message::user("What is 2+2?"));
    for (generation, tok) in tokenizers() {
        for think in [ThinkMode::Off, ThinkMode::High, ThinkMode::Max] {
            let r = c.render(&tok, think, 1 << 20);
            let tag = if think == ThinkMode::Off { "</think>" } else { "<think>" };
            let want = format!(
                "{BOS}{}You are a helpful assistant<｜User｜>What is 2+2?<｜Assistant｜>{tag}",
                expected_effort(generation, think)
            );
            assert_eq!(r.text, want, "{generation:?} {think:?}");
            assert_eq!(r.ids, tok.encode(&want), "{generation:?} {think:?}");
        }
        // Below 384K Max is High: on 0731 files that still renders the "Absolute maximum" text.
        let r = c.render(&tok, ThinkMode::Max, 32768);
        assert!(r.text[BOS.len()..].starts_with(expected_effort(generation, ThinkMode::High)));
    }
}

#[test]
fn one_shot_ids_for_every_mode_and_generation() {
    for (generation, tok) in tokenizers() {
        let s = *tok.specials();
        for think in [ThinkMode::Off, ThinkMode::High, ThinkMode::Max] {
            let r = one_shot_prompt(&tok, "sys", "q", think, 1 << 20);
            let mut want = vec![s.bos];
            want.extend(tok.encode_plain(expected_effort(generation, think)));
            want.extend(tok.encode_plain("sys"));
            want.push(s.user);
            want.extend(tok.encode_plain("q"));
            want.push(s.assistant);
            want.push(if think == ThinkMode::Off {
                s.think_end
            } else {
                s.think_start
            });
            assert_eq!(r.ids, want, "{generation:?} {think:?}");
            assert_eq!(tok.decode(&r.ids), r.text);
        }
    }
}

#[test]
fn the_transcript_swaps_the_effort_text_when_the_mode_changes() {
    let [_, (_, tok)] = tokenizers();
    let ctx = 1 << 20;
    let mut t = Transcript::new(&tok, "sys", ThinkMode::High, ctx);
    let absolute = tok.encode_plain(ABSOLUTE);
    assert_eq!(t.ids()[1..1 + absolute.len()], absolute[..]);
    t.begin_turn(&tok, "a", ThinkMode::High, ctx);
    t.push_sampled(42);
    t.end_turn(&tok, false);
    let before = t.ids().to_vec();
    // High to Max on a 0731 file: the text after BOS is replaced, the rest kept.
    let start = t.begin_turn(&tok, "b", ThinkMode::Max, ctx);
    assert_eq!(start.first_changed, 1);
    let beyond = tok.encode_plain(BEYOND);
    assert_eq!(t.ids()[1..1 + beyond.len()], beyond[..]);
    assert_eq!(
        t.ids()[1 + beyond.len()..1 + beyond.len() + before.len() - 1 - absolute.len()],
        before[1 + absolute.len()..]
    );
    // Off removes it.
    t.end_turn(&tok, false);
    let start = t.begin_turn(&tok, "c", ThinkMode::Off, ctx);
    assert_eq!(start.first_changed, 1);
    assert_eq!(
        t.ids()[1..1 + tok.encode_plain("sys").len()],
        tok.encode_plain("sys")[..]
    );
}
