//! The OpenAI JSON shapes the server answers with: the model list, a whole `chat.completion`, the
//! `chat.completion.chunk`s of a stream, `usage` (with `prompt_tokens_details.cached_tokens`) and the
//! `timings` object (llama-server's field names: `prompt_n`, `prompt_ms`, `prompt_per_second`,
//! `predicted_n`, `predicted_ms`, `predicted_per_second`, `draft_n` and `draft_n_accepted` when the
//! turn decoded speculatively, plus `cache_n`).
//!
//! Owns field names and values only. Must not do I/O.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use crate::engine::events::{FinishReason, TextKind};
use crate::model::tools::ToolCall;

use super::turn::{Timings, Usage};

/// Seconds since the epoch (`created`).
pub fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Identity of one completion, shared by all chunks of a stream.
#[derive(Clone, Debug)]
pub struct CompletionId {
    pub id: String,
    pub created: u64,
    pub model: String,
}

impl CompletionId {
    pub fn new(model: &str) -> CompletionId {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let created = unix_now();
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        CompletionId {
            id: format!("chatcmpl-{created:x}{n:04x}"),
            created,
            model: model.to_string(),
        }
    }
}

/// OpenAI's `finish_reason`: EOS is "stop"; the token budget or a full context is "length".
pub fn finish_reason(r: FinishReason) -> &'static str {
    match r {
        FinishReason::Eos | FinishReason::Cancelled => "stop",
        FinishReason::Length | FinishReason::ContextFull => "length",
    }
}

/// The finish reason of a reply: "tool_calls" when it ended on its own after calling tools.
pub fn reply_finish_reason(r: FinishReason, calls: usize) -> &'static str {
    match r {
        FinishReason::Eos if calls > 0 => "tool_calls",
        r => finish_reason(r),
    }
}

/// One call in a message's `tool_calls`.
fn tool_call(c: &ToolCall) -> Value {
    json!({
        "id": c.id,
        "type": "function",
        "function": { "name": c.name, "arguments": c.arguments },
    })
}

pub fn usage(u: &Usage) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": { "cached_tokens": u.cached_tokens },
    })
}

pub fn timings(t: &Timings, u: &Usage) -> Value {
    let per_token = |n: u32, ms: f64| if n == 0 { 0.0 } else { ms / n as f64 };
    let mut v = json!({
        "cache_n": u.cached_tokens,
        "prompt_n": t.prompt_n,
        "prompt_ms": t.prompt_ms,
        "prompt_per_token_ms": per_token(t.prompt_n, t.prompt_ms),
        "prompt_per_second": t.prompt_per_second(),
        "predicted_n": t.predicted_n,
        "predicted_ms": t.predicted_ms,
        "predicted_per_token_ms": per_token(t.predicted_n, t.predicted_ms),
        "predicted_per_second": t.predicted_per_second(),
    });
    if let Some((drafted, accepted)) = t.draft {
        v["draft_n"] = json!(drafted);
        v["draft_n_accepted"] = json!(accepted);
    }
    v
}

/// `GET /v1/models`.
pub fn model_list(model: &str, created: u64, ctx: u32) -> Value {
    json!({
        "object": "list",
        "data": [{
            "id": model,
            "object": "model",
            "created": created,
            "owned_by": "ds4-chat",
            "max_model_len": ctx,
        }],
    })
}

/// A whole (non-streaming) completion; `content` is null when the reply is only calls.
pub fn completion(
    id: &CompletionId,
    reply: &super::calls::ReplyShaper,
    reasoning: Option<&str>,
    finish: FinishReason,
    u: &Usage,
    t: &Timings,
) -> Value {
    let content = match reply.content.is_empty() && !reply.calls.is_empty() {
        true => Value::Null,
        false => Value::String(reply.content.clone()),
    };
    let mut message = json!({ "role": "assistant", "content": content });
    if let Some(r) = reasoning {
        message["reasoning_content"] = Value::String(r.to_string());
    }
    if !reply.calls.is_empty() {
        message["tool_calls"] = reply.calls.iter().map(tool_call).collect();
    }
    json!({
        "id": id.id,
        "object": "chat.completion",
        "created": id.created,
        "model": id.model,
        "choices": [{
            "index": 0,
            "message": message,
            "logprobs": null,
            "finish_reason": reply_finish_reason(finish, reply.calls.len()),
        }],
        "usage": usage(u),
        "timings": timings(t, u),
    })
}

fn chunk(id: &CompletionId, choices: Value) -> Value {
    json!({
        "id": id.id,
        "object": "chat.completion.chunk",
        "created": id.created,
        "model": id.model,
        "choices": choices,
    })
}

/// The first chunk of a stream: the role.
pub fn role_chunk(id: &CompletionId) -> Value {
    chunk(
        id,
        json!([{ "index": 0, "delta": { "role": "assistant", "content": "" }, "logprobs": null, "finish_reason": null }]),
    )
}

/// A text delta: `content` for the answer, `reasoning_content` for the thinking.
pub fn text_chunk(id: &CompletionId, kind: TextKind, text: &str) -> Value {
    let delta = match kind {
        TextKind::Answer => json!({ "content": text }),
        TextKind::Reasoning => json!({ "reasoning_content": text }),
    };
    chunk(
        id,
        json!([{ "index": 0, "delta": delta, "logprobs": null, "finish_reason": null }]),
    )
}

/// A call delta: the whole call (id, name and arguments) at its index.
pub fn call_chunk(id: &CompletionId, index: usize, call: &ToolCall) -> Value {
    let mut c = tool_call(call);
    c["index"] = json!(index);
    chunk(
        id,
        json!([{ "index": 0, "delta": { "tool_calls": [c] }, "logprobs": null, "finish_reason": null }]),
    )
}

/// The chunk with the finish reason; it carries the timings (as llama-server's last chunk does).
pub fn finish_chunk(id: &CompletionId, finish: &'static str, u: &Usage, t: &Timings) -> Value {
    let mut c = chunk(
        id,
        json!([{ "index": 0, "delta": {}, "logprobs": null, "finish_reason": finish }]),
    );
    c["timings"] = timings(t, u);
    c
}

/// The usage chunk of `stream_options.include_usage`: no choices, the usage (and timings again).
pub fn usage_chunk(id: &CompletionId, u: &Usage, t: &Timings) -> Value {
    let mut c = chunk(id, json!([]));
    c["usage"] = usage(u);
    c["timings"] = timings(t, u);
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completion_has_usage_cached_tokens_and_timings() {
        let id = CompletionId::new("m");
        let u = Usage {
            prompt_tokens: 10,
            cached_tokens: 4,
            completion_tokens: 3,
        };
        let t = Timings {
            prompt_n: 6,
            prompt_ms: 12.0,
            predicted_n: 3,
            predicted_ms: 30.0,
            draft: Some((5, 2)),
        };
        let tools = super::super::tools::Tools::default();
        let mut reply = super::super::calls::ReplyShaper::new(&tools, "call_");
        reply.push(TextKind::Answer, "hi");
        let c = completion(&id, &reply, Some("why"), FinishReason::Length, &u, &t);
        assert_eq!(c["choices"][0]["message"]["content"], "hi");
        assert_eq!(c["choices"][0]["message"]["reasoning_content"], "why");
        assert_eq!(c["choices"][0]["finish_reason"], "length");
        assert_eq!(c["usage"]["total_tokens"], 13);
        assert_eq!(c["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
        assert_eq!(c["timings"]["prompt_per_second"], 500.0);
        assert_eq!(c["timings"]["predicted_per_second"], 100.0);
        assert_eq!(c["timings"]["cache_n"], 4);
        assert_eq!(
            (&c["timings"]["draft_n"], &c["timings"]["draft_n_accepted"]),
            (&json!(5), &json!(2))
        );
        let plain = Timings { draft: None, ..t };
        assert!(timings(&plain, &u).get("draft_n").is_none());
        let r = text_chunk(&id, TextKind::Reasoning, "x");
        assert_eq!(r["choices"][0]["delta"]["reasoning_content"], "x");
        assert!(r["choices"][0]["delta"].get("content").is_none());
    }
}
