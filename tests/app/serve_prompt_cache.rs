//! `serve`'s prompt cache end to end (docs/serve.md#prompt-cache): a 4.5k-token system prompt with
//! one question, then with another question (a conversation of its own), then, after the server
//! was killed and started again on the same data directory, with a third. The second and the third
//! report the shared prefix as cached (`usage.prompt_tokens_details.cached_tokens`, and
//! `timings.prompt_n` evaluated tokens: the hard checks); their time to first token is a fraction of
//! the first one's (a loose check, 3×, against a measured ratio far above it; the figures are
//! printed).

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::serve_process::{DataDir, Server, connect, parse_reply, post_head, start};
use crate::support;

const CTX: &str = "8192";
/// 500 numbered rules: 4,501 tokens with BOS and the effort text (no thinking).
fn system_prompt() -> String {
    (0..500)
        .map(|i| format!("rule {i}: be concise and careful."))
        .collect::<Vec<_>>()
        .join(" ")
}

/// What a streamed completion gave.
struct Streamed {
    /// Time from sending the request to the first chunk with text.
    ttft: Duration,
    prompt_tokens: u64,
    cached_tokens: u64,
    /// `timings.prompt_n`: prompt tokens evaluated.
    evaluated: u64,
}

/// A streamed request with usage; `ttft` stops at the first chunk that carries answer text.
fn streamed(server: &Server, question: &str) -> Streamed {
    let body = json!({
        "model": "serve-tiny", "stream": true, "stream_options": {"include_usage": true},
        "reasoning_effort": "none", "seed": 1, "temperature": 0, "max_tokens": 8,
        "messages": [
            {"role": "system", "content": system_prompt()},
            {"role": "user", "content": question},
        ],
    })
    .to_string();
    let addr = server.addr();
    let mut s = connect(addr, Duration::from_secs(300)).expect("connect");
    let sent = Instant::now();
    s.write_all(format!("{}{body}", post_head(addr, "/v1/chat/completions", body.len())).as_bytes())
        .unwrap();
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    let mut ttft = None;
    loop {
        let n = s.read(&mut buf).expect("read the stream");
        if n == 0 {
            break;
        }
        raw.extend_from_slice(&buf[..n]);
        if ttft.is_none() && has_text(&raw) {
            ttft = Some(sent.elapsed());
        }
    }
    let reply = parse_reply(&raw).unwrap();
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert!(reply.body.trim_end().ends_with("data: [DONE]"), "{}", reply.body);
    let last: Value = reply
        .body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find(|v| v["usage"].is_object())
        .expect("a chunk with usage");
    let usage = &last["usage"];
    Streamed {
        ttft: ttft.unwrap_or_else(|| panic!("no text in the stream: {}", reply.body)),
        prompt_tokens: usage["prompt_tokens"].as_u64().unwrap(),
        cached_tokens: usage["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap(),
        evaluated: last["timings"]["prompt_n"].as_u64().unwrap(),
    }
}

/// Whether a stream so far holds a chunk with non-empty answer text.
fn has_text(raw: &[u8]) -> bool {
    let text = String::from_utf8_lossy(raw);
    text.match_indices("\"content\":\"")
        .any(|(i, m)| !text[i + m.len()..].starts_with('"'))
}

#[test]
fn a_shared_system_prompt_is_reused_across_conversations_and_restarts() {
    let model = support::serve_tiny_model();
    let data = DataDir::new("serve-prompt-cache");
    let data_env = data.env();
    let env = [("DS4_DATA_DIR", data_env.as_str())];

    let server = start(&model, CTX, &["--model-name", "serve-tiny"], &env).expect("serve starts");
    let first = streamed(&server, "What is two plus two?");
    assert!(
        first.prompt_tokens >= 4096,
        "the system prompt is {} tokens",
        first.prompt_tokens
    );
    assert_eq!((first.cached_tokens, first.evaluated), (0, first.prompt_tokens));
    let second = streamed(&server, "Name a colour.");
    // Everything but the question (user marker, text, assistant marker, think tag) came from the store.
    assert!(second.cached_tokens >= 4096, "cached {}", second.cached_tokens);
    assert_eq!(second.evaluated, second.prompt_tokens - second.cached_tokens);
    assert!(second.evaluated < 16, "evaluated {}", second.evaluated);
    // Killed as a crash would; the files written after each turn are whole (atomic writes).
    server.stop();

    let server = start(&model, CTX, &["--model-name", "serve-tiny"], &env).expect("serve starts again");
    let third = streamed(&server, "Say something else entirely.");
    assert!(
        third.cached_tokens >= 4096,
        "cached after a restart {}",
        third.cached_tokens
    );
    assert_eq!(third.evaluated, third.prompt_tokens - third.cached_tokens);
    assert!(third.evaluated < 16, "evaluated {}", third.evaluated);
    server.stop();

    let ratio = |d: Duration| first.ttft.as_secs_f64() / d.as_secs_f64();
    println!(
        "prompt cache: {} prompt tokens; time to first token uncached {:.3} s; another conversation {} cached, \
         {:.3} s ({:.0}x); after a restart {} cached, {:.3} s ({:.0}x)",
        first.prompt_tokens,
        first.ttft.as_secs_f64(),
        second.cached_tokens,
        second.ttft.as_secs_f64(),
        ratio(second.ttft),
        third.cached_tokens,
        third.ttft.as_secs_f64(),
        ratio(third.ttft),
    );
    // Loose: prefilling 4.5k tokens takes seconds on the CPU, restoring them tens of milliseconds.
    assert!(
        ratio(second.ttft) > 3.0 && ratio(third.ttft) > 3.0,
        "the cached requests were not faster"
    );
}
