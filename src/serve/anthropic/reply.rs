//! The Messages API's JSON shapes: a whole `message`, its content blocks, `usage` (with
//! `cache_read_input_tokens`), `stop_reason`, the events of a stream, and errors in Anthropic's
//! shape (`{"type": "error", "error": {"type", "message"}}`).
//!
//! Owns field names and values only. Must not do I/O.

use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{Value, json};

use crate::engine::events::FinishReason;
use crate::model::tools::{Json, ToolCall};

use super::super::calls::ReplyShaper;
use super::super::error::ApiError;
use super::super::turn::Usage;

/// A new message id.
pub fn message_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    format!(
        "msg_{:x}{:06x}",
        super::super::responses::unix_now(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Why the reply ended: a stop sequence, the token budget or context, tool calls, or its end.
pub fn stop_reason(finish: FinishReason, calls: usize, stop_sequence: Option<&str>) -> &'static str {
    match (finish, stop_sequence) {
        (_, Some(_)) => "stop_sequence",
        (FinishReason::Length | FinishReason::ContextFull, _) => "max_tokens",
        _ if calls > 0 => "tool_use",
        _ => "end_turn",
    }
}

/// `usage`: `input_tokens` counts the prompt tokens evaluated, `cache_read_input_tokens` those the
/// cache already held (Anthropic's split: their sum is the prompt).
pub fn usage(u: &Usage) -> Value {
    json!({
        "input_tokens": u.prompt_tokens.saturating_sub(u.cached_tokens),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": u.cached_tokens,
        "output_tokens": u.completion_tokens,
    })
}

/// A call's input object (its arguments are the JSON text of an object).
pub fn tool_input(call: &ToolCall) -> Value {
    Json::parse(&call.arguments).map_or_else(|_| json!({}), |j| j.to_value())
}

/// The `message` object; `content` is empty at a stream's start.
pub fn message(id: &str, model: &str, content: Vec<Value>, stop: Option<(&str, Option<&str>)>, u: &Usage) -> Value {
    json!({
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop.map(|(r, _)| r),
        "stop_sequence": stop.and_then(|(_, s)| s),
        "usage": usage(u),
    })
}

/// The content blocks of a whole reply: thinking (when the turn thought), text, tool uses.
pub fn content_blocks(reply: &ReplyShaper, thinking: bool) -> Vec<Value> {
    let mut blocks = Vec::new();
    if thinking && !reply.reasoning.is_empty() {
        blocks.push(json!({ "type": "thinking", "thinking": reply.reasoning, "signature": "" }));
    }
    if !reply.content.is_empty() {
        blocks.push(json!({ "type": "text", "text": reply.content }));
    }
    for c in &reply.calls {
        blocks.push(json!({ "type": "tool_use", "id": c.id, "name": c.name, "input": tool_input(c) }));
    }
    blocks
}

/// Anthropic's error type for a status.
fn error_type(status: u16) -> &'static str {
    match status {
        400 | 405 | 408 | 411 | 415 | 431 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        _ => "api_error",
    }
}

/// An error in Anthropic's shape.
pub fn error_body(e: &ApiError) -> Value {
    json!({ "type": "error", "error": { "type": error_type(e.status), "message": e.message } })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_splits_the_prompt_and_errors_have_anthropic_types() {
        let u = Usage {
            prompt_tokens: 100,
            cached_tokens: 60,
            completion_tokens: 7,
        };
        let v = usage(&u);
        assert_eq!(
            (v["input_tokens"].as_u64(), v["cache_read_input_tokens"].as_u64()),
            (Some(40), Some(60))
        );
        assert_eq!(v["output_tokens"], 7);
        let e = error_body(&ApiError::field("max_tokens", "is required"));
        assert_eq!(e["type"], "error");
        assert_eq!(e["error"]["type"], "invalid_request_error");
        assert_eq!(e["error"]["message"], "max_tokens: is required");
        assert_eq!(
            error_body(&ApiError::status(429, "busy"))["error"]["type"],
            "rate_limit_error"
        );
        assert_eq!(stop_reason(FinishReason::Eos, 1, None), "tool_use");
        assert_eq!(stop_reason(FinishReason::Eos, 0, None), "end_turn");
        assert_eq!(stop_reason(FinishReason::Length, 1, None), "max_tokens");
        assert_eq!(stop_reason(FinishReason::Cancelled, 0, Some("X")), "stop_sequence");
    }
}
