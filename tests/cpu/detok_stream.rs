//! Property test of the streaming detokenizer (docs/prompt.md#decoding-and-streaming): for random id sequences,
//! the streamed deltas equal a one-shot decode of the same bytes (`String::from_utf8_lossy`, then the text
//! split at the think tags), whatever the token boundaries, and stop at EOS.

use crate::common;

use ds4_chat::engine::events::TextKind;
use ds4_chat::model::chat::ThinkMode;
use ds4_chat::model::detok::{StreamDecoder, TextDelta};

/// splitmix64: a small deterministic generator for the property loop.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// The one-shot reference: lossy decode of all bytes, then split at the tags (earliest first).
fn reference(text: &str, mut kind: TextKind) -> Vec<(TextKind, String)> {
    let mut out: Vec<(TextKind, String)> = Vec::new();
    let push = |k: TextKind, s: &str, out: &mut Vec<(TextKind, String)>| {
        if s.is_empty() {
            return;
        }
        match out.last_mut() {
            Some((lk, ls)) if *lk == k => ls.push_str(s),
            _ => out.push((k, s.to_string())),
        }
    };
    let mut rest = text;
    loop {
        let open = rest.find("<think>").map(|p| (p, 7, TextKind::Reasoning));
        let close = rest.find("</think>").map(|p| (p, 8, TextKind::Answer));
        let next = match (open, close) {
            (Some(a), Some(b)) => Some(if a.0 < b.0 { a } else { b }),
            (a, b) => a.or(b),
        };
        match next {
            Some((p, len, k)) => {
                push(kind, &rest[..p], &mut out);
                kind = k;
                rest = &rest[p + len..];
            }
            None => {
                push(kind, rest, &mut out);
                return out;
            }
        }
    }
}

fn merged(events: &[TextDelta]) -> Vec<(TextKind, String)> {
    let mut out: Vec<(TextKind, String)> = Vec::new();
    for e in events {
        match out.last_mut() {
            Some((k, s)) if *k == e.kind => s.push_str(&e.text),
            _ => out.push((e.kind, e.text.clone())),
        }
    }
    out
}

#[test]
fn streaming_equals_one_shot_decode() {
    let tok = common::gguf_tokenizer();
    let s = *tok.specials();
    let n_vocab = tok.n_vocab();
    // Tokens whose bytes are not valid UTF-8 on their own (pieces of multi-byte characters).
    let partial: Vec<u32> = (0..n_vocab as u32)
        .filter(|&i| std::str::from_utf8(tok.token_bytes_ref(i)).is_err())
        .collect();
    assert!(partial.len() > 100, "{} partial-UTF-8 tokens", partial.len());
    // Ordinary tokens that spell tags across token boundaries.
    let tag_pieces: Vec<u32> = [
        "<", "</", "think", ">", "<th", "ink", "/", "<t", "hink>", "</th", "<think", "x",
    ]
    .iter()
    .flat_map(|p| tok.encode_plain(p))
    .collect();
    let mut rng = Rng(0x05EE_DD54_C4A7);
    let mut n_events = 0usize;
    for case in 0..3000 {
        let len = rng.below(48);
        let mut ids: Vec<u32> = Vec::with_capacity(len);
        for _ in 0..len {
            match rng.below(100) {
                0..=27 => ids.push(rng.below(n_vocab) as u32),
                28..=59 => ids.push(partial[rng.below(partial.len())]),
                60..=71 => ids.push(tag_pieces[rng.below(tag_pieces.len())]),
                72..=79 => {
                    // A tag spelled by ordinary tokens, cut at a random byte.
                    let tag = if rng.below(2) == 0 { "<think>" } else { "</think>" };
                    let cut = 1 + rng.below(tag.len() - 1);
                    ids.extend(tok.encode_plain(&tag[..cut]));
                    ids.extend(tok.encode_plain(&tag[cut..]));
                }
                80..=87 => ids.push(s.think_start),
                88..=95 => ids.push(s.think_end),
                96 => ids.push(s.eos),
                _ => ids.push(rng.below(256) as u32),
            }
        }
        let think = if case % 2 == 0 { ThinkMode::High } else { ThinkMode::Off };
        let start_kind = if think.thinking() {
            TextKind::Reasoning
        } else {
            TextKind::Answer
        };
        let mut d = StreamDecoder::new(tok, think);
        let mut events = Vec::new();
        for &id in &ids {
            events.extend(d.push(tok, id));
        }
        events.extend(d.finish());
        assert!(events.iter().all(|e| !e.text.is_empty()), "case {case}: empty delta");
        n_events += events.len();

        let upto = ids.iter().position(|&i| i == s.eos).unwrap_or(ids.len());
        let bytes = tok.decode_bytes(&ids[..upto]);
        let want = reference(&String::from_utf8_lossy(&bytes), start_kind);
        assert_eq!(merged(&events), want, "case {case}: ids {ids:?}");
    }
    eprintln!("3000 random sequences, {n_events} deltas");
}

#[test]
fn eos_stops_and_is_not_shown() {
    let tok = common::gguf_tokenizer();
    let s = *tok.specials();
    let mut d = StreamDecoder::new(tok, ThinkMode::High);
    let mut events = Vec::new();
    let reply = tok.encode("Let me see.</think>Four.");
    for &id in reply.iter().chain([s.eos].iter()).chain(tok.encode("ignored").iter()) {
        events.extend(d.push(tok, id));
    }
    assert!(d.stopped());
    events.extend(d.finish());
    assert_eq!(
        merged(&events),
        [
            (TextKind::Reasoning, "Let me see.".to_string()),
            (TextKind::Answer, "Four.".to_string())
        ]
    );
}

#[test]
fn multibyte_characters_split_over_tokens_stream_whole() {
    let tok = common::gguf_tokenizer();
    let text = "毕老师！👨‍👩‍👧‍👦 naïve café";
    let ids = tok.encode(text);
    let mut d = StreamDecoder::new(tok, ThinkMode::Off);
    let mut got = String::new();
    for &id in &ids {
        for e in d.push(tok, id) {
            assert_eq!(e.kind, TextKind::Answer);
            assert!(!e.text.contains('\u{FFFD}'), "a delta split a code point: {:?}", e.text);
            got.push_str(&e.text);
        }
    }
    assert!(d.finish().is_empty());
    assert_eq!(got, text);
}
