//! `serve`'s prompt cache end to end (docs/serve.md#prompt-cache): a 4.5k-token system prompt with
//! one question, then with another question (a conversation of its own), then, after the server
//! was killed and started again on the same data directory, with a third. The second and the third
//! report the shared prefix as cached (`usage.prompt_tokens_details.cached_tokens`, and
//! `timings.prompt_n` evaluated tokens: the hard checks); their time to first token is a fraction of
//! the first one's (a loose check, 3×, against a measured ratio far above it; the figures are
//! printed). An agent's turns share more than the system prompt: two conversations with the same
//! system prompt and tools (over 4k tokens together) and different questions, on the OpenAI route
//! (`cached_tokens`) and on the Anthropic one (`cache_read_input_tokens`), reuse the whole start.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use ds4_chat::gguf::GgufFile;
use ds4_chat::model::tokenizer::Tokenizer;

use super::serve_process::{DataDir, Server, connect, parse_reply, post, post_head, start};
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

/// An agent's tools: 8 functions with long descriptions, about 2.2k tokens in the tool block.
fn agent_tools() -> Vec<(String, String, Value)> {
    (0..8)
        .map(|i| {
            let description = (0..12)
                .map(|j| format!("step {j}: read the file, check the result and report it."))
                .collect::<Vec<_>>()
                .join(" ");
            let schema = json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "the file to work on"},
                    "limit": {"type": "integer", "description": "the most lines to read"},
                },
                "required": ["path"],
            });
            (format!("tool_{i}"), format!("Tool {i}. {description}"), schema)
        })
        .collect()
}

/// An agent's system prompt: 220 numbered rules, 2,420 tokens; with `agent_tools` over 4.6k.
fn agent_system(route: &str) -> String {
    (0..220)
        .map(|i| format!("{route} rule {i}: be concise and careful."))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Prompt tokens, cached tokens (`prompt_tokens_details.cached_tokens`) and evaluated tokens
/// (`timings.prompt_n`) of a non-streamed chat completion with the agent's system prompt and tools.
fn openai_agent_turn(server: &Server, question: &str) -> (u64, u64, u64) {
    let tools: Vec<Value> = agent_tools()
        .into_iter()
        .map(|(name, description, parameters)| {
            json!({"type": "function", "function": {"name": name, "description": description, "parameters": parameters}})
        })
        .collect();
    let body = json!({
        "model": "serve-tiny", "reasoning_effort": "none", "seed": 1, "temperature": 0, "max_tokens": 4,
        "tools": tools, "tool_choice": "auto",
        "messages": [
            {"role": "system", "content": agent_system("openai")},
            {"role": "user", "content": question},
        ],
    })
    .to_string();
    let reply = post(server.addr(), "/v1/chat/completions", &body, Duration::from_secs(300)).expect("a reply");
    assert_eq!(reply.status, 200, "{}", reply.body);
    let v = reply.json();
    let n = |x: &Value| x.as_u64().unwrap_or_else(|| panic!("no count in {v}"));
    (
        n(&v["usage"]["prompt_tokens"]),
        n(&v["usage"]["prompt_tokens_details"]["cached_tokens"]),
        n(&v["timings"]["prompt_n"]),
    )
}

/// Evaluated (`input_tokens`) and cached (`cache_read_input_tokens`) tokens of a non-streamed
/// Messages API request with the agent's system prompt and tools.
fn anthropic_agent_turn(server: &Server, question: &str) -> (u64, u64) {
    let tools: Vec<Value> = agent_tools()
        .into_iter()
        .map(|(name, description, schema)| json!({"name": name, "description": description, "input_schema": schema}))
        .collect();
    let body = json!({
        "model": "claude-agent", "max_tokens": 4, "temperature": 0,
        "thinking": {"type": "disabled"},
        "system": agent_system("anthropic"), "tools": tools,
        "messages": [{"role": "user", "content": question}],
    })
    .to_string();
    let reply = post(server.addr(), "/v1/messages", &body, Duration::from_secs(300)).expect("a reply");
    assert_eq!(reply.status, 200, "{}", reply.body);
    let v = reply.json();
    let n = |x: &Value| x.as_u64().unwrap_or_else(|| panic!("no count in {v}"));
    (
        n(&v["usage"]["input_tokens"]),
        n(&v["usage"]["cache_read_input_tokens"]),
    )
}

/// An agent's turns from two conversations that share the system prompt and the tools (over 4k
/// tokens together, the tool block about half) but not the question: the second reuses the whole
/// shared start on both routes. Each route has its own system prompt, so its first request starts
/// cold.
#[test]
fn an_agents_system_prompt_and_tools_are_reused_across_conversations() {
    let model = support::serve_tiny_model();
    let data = DataDir::new("serve-prompt-cache-tools");
    let data_env = data.env();
    let server = start(
        &model,
        CTX,
        &["--model-name", "serve-tiny"],
        &[("DS4_DATA_DIR", data_env.as_str())],
    )
    .expect("serve starts");
    // The system text alone is under 4k tokens: a 4k cached start holds the tool block too.
    let tok = Tokenizer::from_gguf(&GgufFile::open(&model).expect("open the tiny model")).expect("tokenizer");
    for route in ["openai", "anthropic"] {
        let n = tok.encode_plain(&agent_system(route)).len();
        assert!((1500..4096).contains(&n), "the {route} system text is {n} tokens");
    }

    let (prompt, cached, evaluated) = openai_agent_turn(&server, "Which tool reads a file?");
    assert!(prompt >= 4096, "system prompt and tools are {prompt} tokens");
    assert_eq!((cached, evaluated), (0, prompt));
    let (prompt2, cached2, evaluated2) = openai_agent_turn(&server, "List the tools you have.");
    assert!(cached2 >= 4096, "OpenAI route: cached {cached2} of {prompt2}");
    assert_eq!(evaluated2, prompt2 - cached2);
    assert!(evaluated2 < 16, "OpenAI route: evaluated {evaluated2}");

    let (input, read) = anthropic_agent_turn(&server, "Which tool reads a file?");
    assert!(input >= 4096, "system prompt and tools are {input} tokens");
    assert_eq!(read, 0, "the first request of this system prompt");
    let (input2, read2) = anthropic_agent_turn(&server, "List the tools you have.");
    assert!(read2 >= 4096, "Anthropic route: cache_read_input_tokens {read2}");
    assert!(input2 < 16, "Anthropic route: input_tokens {input2}");
    println!(
        "prompt cache with tools: OpenAI {prompt} prompt tokens, another conversation {cached2} cached \
         ({evaluated2} evaluated); Anthropic {input} input tokens, another conversation {read2} cache read \
         ({input2} input)"
    );
}
