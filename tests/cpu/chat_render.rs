//! Chat prompt rendering (docs/prompt.md) against tests/fixtures/chat_render_cases.json: the expected texts
//! were written out by hand from ds4_server.c's renderer and the expected ids come from the official
//! tokenizer (tools/make_tokenizer_corpus.py); the one-shot prompts are the ids ds4 itself produced for
//! the shared test vectors (case A).

use crate::common;

use ds4_chat::model::chat::{Conversation, Message, THINK_MAX_PREFIX, ThinkMode, Transcript, one_shot_prompt};
use ds4_chat::model::tokenizer::Tokenizer;
use serde_json::Value;

fn fixture() -> Value {
    let s = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/chat_render_cases.json"
    ))
    .expect("chat fixture present");
    serde_json::from_str(&s).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn mode(v: &Value) -> ThinkMode {
    match v.as_str().unwrap() {
        "Off" | "none" => ThinkMode::Off,
        "High" | "high" => ThinkMode::High,
        "Max" | "max" => ThinkMode::Max,
        other => panic!("unknown mode {other}"),
    }
}

/// Runs `check(tokenizer, name, case)` on every case of the fixture's `form`.
fn for_each_case(form: &str, mut check: impl FnMut(&Tokenizer, &str, &Value)) {
    let tok = common::gguf_tokenizer();
    let f = fixture();
    for case in f[form].as_array().unwrap() {
        check(tok, case["name"].as_str().unwrap(), case);
    }
}

fn conversation(v: &Value) -> Conversation {
    let mut c = Conversation::new();
    for m in v.as_array().unwrap() {
        let content = m["content"].as_str().unwrap();
        c.push(match m["role"].as_str().unwrap() {
            "system" => Message::system(content),
            "user" => Message::user(content),
            "assistant" => Message::assistant(content, m["reasoning"].as_str().map(str::to_string)),
            r => panic!("role {r}"),
        });
    }
    c
}

#[test]
fn fixture_matches_vendored_tokenizer_and_prefix() {
    let f = fixture();
    assert_eq!(
        f["tokenizer_sha256"],
        ds4_chat::model::tokenizer::VENDORED_TOKENIZER_SHA256
    );
    assert_eq!(f["max_prefix"], THINK_MAX_PREFIX);
    let tok = common::gguf_tokenizer();
    assert_eq!(tok.encode_plain(THINK_MAX_PREFIX), ids(&f["max_prefix_ids"]));
}

#[test]
fn server_form_renders_exact_text_and_official_ids() {
    for_each_case("server_form", |tok, name, case| {
        let conv = conversation(&case["messages"]);
        let r = conv.render(tok, mode(&case["think"]), case["ctx"].as_u64().unwrap() as u32);
        assert_eq!(r.text, case["text"].as_str().unwrap(), "{name}: text");
        assert_eq!(r.ids, ids(&case["ids"]), "{name}: ids");
        assert_eq!(r.think, mode(&case["effective"]), "{name}: effective mode");
        assert_eq!(tok.decode(&r.ids), r.text, "{name}: ids spell the text");
    });
}

#[test]
fn transcript_form_appends_turns_and_sampled_tokens() {
    for_each_case("transcript_form", |tok, name, case| {
        let think = mode(&case["think"]);
        let ctx = case["ctx"].as_u64().unwrap() as u32;
        let mut t = Transcript::new(tok, case["system"].as_str().unwrap(), think, ctx);
        for turn in case["turns"].as_array().unwrap() {
            let before = t.ids().to_vec();
            let start = t.begin_turn(tok, turn["user"].as_str().unwrap(), think, ctx);
            assert_eq!(start.think, think);
            assert_eq!(start.first_changed, before.len(), "{name}: nothing cached is rewritten");
            assert_eq!(&t.ids()[..before.len()], &before[..], "{name}: append only");
            assert_eq!(
                t.len() as u64,
                turn["prompt_len"].as_u64().unwrap(),
                "{name}: prompt length"
            );
            for id in ids(&turn["sampled"]) {
                t.push_sampled(id);
            }
            t.end_turn(tok, false);
        }
        assert_eq!(t.ids(), &ids(&case["ids"])[..], "{name}: ids");
        assert_eq!(tok.decode(t.ids()), case["text"].as_str().unwrap(), "{name}: bytes");
    });
}

#[test]
fn transcript_max_prefix_toggles_and_interrupts_roll_back() {
    let tok = common::gguf_tokenizer();
    let f = fixture();
    let case = f["transcript_form"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "max_nosystem")
        .unwrap();
    let prefix_len = ids(&f["max_prefix_ids"]).len();
    let turns = case["turns"].as_array().unwrap();
    let all = ids(&case["ids"]);

    // Turn 1 with Max at a large context, turn 2 requested Max at a small one: the prefix goes away.
    let mut t = Transcript::new(tok, "", ThinkMode::Max, 400_000);
    t.begin_turn(tok, turns[0]["user"].as_str().unwrap(), ThinkMode::Max, 400_000);
    ids(&turns[0]["sampled"]).into_iter().for_each(|id| t.push_sampled(id));
    t.end_turn(tok, false);
    let start = t.begin_turn(tok, turns[1]["user"].as_str().unwrap(), ThinkMode::Max, 4096);
    assert_eq!(start.think, ThinkMode::High);
    assert_eq!(start.first_changed, 1);
    ids(&turns[1]["sampled"]).into_iter().for_each(|id| t.push_sampled(id));
    t.end_turn(tok, false);
    // High and Max both open with <think>, so the rest equals the official ids without the prefix.
    let through_turn2 = turns[2]["prompt_len"].as_u64().unwrap() as usize;
    let user3_len = 1 + tok.encode_plain(turns[2]["user"].as_str().unwrap()).len() + 2;
    let want: Vec<u32> = [&all[..1], &all[1 + prefix_len..through_turn2 - user3_len]].concat();
    assert_eq!(t.ids(), &want[..]);

    // An interrupted turn with no sampled token disappears; with one token it is closed by EOS.
    let before = t.ids().to_vec();
    t.begin_turn(tok, "stop me", ThinkMode::High, 4096);
    assert!(t.turn_open());
    t.end_turn(tok, true);
    assert_eq!(t.ids(), &before[..]);
    t.begin_turn(tok, "stop me", ThinkMode::High, 4096);
    t.push_sampled(42);
    t.end_turn(tok, true);
    assert_eq!(t.ids().last(), Some(&tok.specials().eos));
    assert_eq!(t.ids()[t.len() - 2], 42);
}

#[test]
fn one_shot_prompts_match_ds4_test_vectors() {
    for_each_case("cli_prompts", |tok, name, case| {
        let spec = &case["prompt_spec"];
        let ctx = case["ctx"].as_u64().unwrap() as u32;
        let want = ids(&case["prompt_tokens"]);
        let r = if spec["kind"] == "rendered" {
            one_shot_prompt(tok, "", spec["text"].as_str().unwrap(), ThinkMode::Off, ctx)
        } else {
            let think = if spec["think"].as_bool().unwrap() {
                ThinkMode::High
            } else {
                ThinkMode::Off
            };
            assert_eq!(think, mode(&case["think_mode"]));
            one_shot_prompt(
                tok,
                spec["system"].as_str().unwrap(),
                spec["user"].as_str().unwrap(),
                think,
                ctx,
            )
        };
        assert_eq!(r.ids, want, "{name}");
        assert_eq!(tok.decode(&r.ids), r.text, "{name}: text");
    });
}

#[test]
fn one_shot_prompt_with_max_and_specials_in_text() {
    let tok = common::gguf_tokenizer();
    let s = *tok.specials();
    let r = one_shot_prompt(tok, "", "hi <think>", ThinkMode::Max, 393_216);
    assert_eq!(r.think, ThinkMode::Max);
    let mut want = vec![s.bos];
    want.extend(tok.encode_plain(THINK_MAX_PREFIX));
    want.push(s.user);
    want.extend(tok.encode_plain("hi <think>"));
    want.extend([s.assistant, s.think_start]);
    assert_eq!(r.ids, want);
    // The user's "<think>" stays text: only the final tag is the control token.
    assert_eq!(r.ids.iter().filter(|&&i| i == s.think_start).count(), 1);
    let r = one_shot_prompt(tok, "sys", "q", ThinkMode::Max, 1000);
    assert_eq!(r.think, ThinkMode::High);
    assert_eq!(
        r.ids[1..],
        [
            tok.encode_plain("sys"),
            vec![s.user],
            tok.encode_plain("q"),
            vec![s.assistant, s.think_start]
        ]
        .concat()[..]
    );
}
