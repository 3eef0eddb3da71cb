//! The JSON of a streamed chat completion (`chat.completion.chunk`): text deltas (answer and
//! reasoning), the finish reason, and the `usage` and `timings` objects servers add.
//!
//! Owns reading one event's data into a `Chunk`, tolerant of the servers' variations: reasoning as
//! `reasoning_content` (SGLang, llama-server, ds4-server, DeepSeek's API) or `reasoning` (newer
//! vLLM); `timings` with llama-server's names (also what `ds4-chat serve` sends); an `error`
//! object in place of a chunk (a server failing mid-stream).

use serde_json::Value;

use crate::engine::events::ServerReport;

/// What one chunk carries; absent parts are `None`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Chunk {
    pub reasoning: Option<String>,
    pub content: Option<String>,
    pub finish_reason: Option<String>,
    /// The server's figures (`usage`, `timings`), when this chunk has either.
    pub report: Option<ServerReport>,
}

/// Reads one event's data. `Err` is a one-line message: the server's own error, or data that is
/// not a chunk.
pub fn parse(data: &str) -> Result<Chunk, String> {
    let v: Value = serde_json::from_str(data).map_err(|e| {
        format!(
            "the server sent a stream event that is not JSON ({e}): {}",
            clip(data, 80)
        )
    })?;
    if let Some(e) = v.get("error") {
        return Err(format!("the server reported an error mid-stream: {}", error_text(e)));
    }
    let mut chunk = Chunk::default();
    if let Some(choice) = v.get("choices").and_then(Value::as_array).and_then(|c| c.first()) {
        let delta = choice.get("delta").or_else(|| choice.get("message"));
        if let Some(d) = delta {
            chunk.content = text(d, "content");
            chunk.reasoning = text(d, "reasoning_content").or_else(|| text(d, "reasoning"));
        }
        chunk.finish_reason = choice.get("finish_reason").and_then(Value::as_str).map(str::to_string);
    }
    chunk.report = report(v.get("usage"), v.get("timings"));
    Ok(chunk)
}

/// A non-empty string field.
fn text(v: &Value, key: &str) -> Option<String> {
    v.get(key)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

fn report(usage: Option<&Value>, timings: Option<&Value>) -> Option<ServerReport> {
    let usage = usage.filter(|u| u.is_object());
    let timings = timings.filter(|t| t.is_object());
    if usage.is_none() && timings.is_none() {
        return None;
    }
    let u32_at = |v: Option<&Value>, key: &str| v.and_then(|v| v.get(key)).and_then(Value::as_u64).map(|n| n as u32);
    let f64_at = |key: &str| timings.and_then(|t| t.get(key)).and_then(Value::as_f64);
    let cached = usage
        .and_then(|u| u.get("prompt_tokens_details"))
        .and_then(|d| d.get("cached_tokens"))
        .and_then(Value::as_u64)
        .map(|n| n as u32)
        .or_else(|| u32_at(timings, "cache_n"));
    Some(ServerReport {
        prompt_tokens: u32_at(usage, "prompt_tokens"),
        cached_tokens: cached,
        completion_tokens: u32_at(usage, "completion_tokens").or_else(|| u32_at(timings, "predicted_n")),
        prefill_ms: f64_at("prompt_ms"),
        prefill_tps: f64_at("prompt_per_second"),
        decode_tps: f64_at("predicted_per_second"),
    })
}

/// The message of an OpenAI-style error value (`{"message": …}` or a plain string).
pub fn error_text(e: &Value) -> String {
    let msg = match e {
        Value::String(s) => s.clone(),
        Value::Object(o) => o
            .get("message")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| e.to_string()),
        other => other.to_string(),
    };
    clip(&msg, 200)
}

/// `s` on one line, at most `max` characters.
pub fn clip(s: &str, max: usize) -> String {
    let one_line = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if one_line.chars().count() <= max {
        one_line
    } else {
        let cut: String = one_line.chars().take(max).collect();
        format!("{cut}…")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deltas_of_answer_and_reasoning() {
        let c = parse(r#"{"choices":[{"index":0,"delta":{"reasoning_content":"hmm"},"finish_reason":null}]}"#).unwrap();
        assert_eq!((c.reasoning.as_deref(), c.content.as_deref()), (Some("hmm"), None));
        let c = parse(r#"{"choices":[{"delta":{"reasoning":"vllm"}}]}"#).unwrap();
        assert_eq!(c.reasoning.as_deref(), Some("vllm"));
        let c = parse(r#"{"choices":[{"delta":{"content":"Hi","reasoning_content":null}}]}"#).unwrap();
        assert_eq!((c.reasoning, c.content.as_deref()), (None, Some("Hi")));
        let c = parse(r#"{"choices":[{"delta":{"role":"assistant","content":""}}]}"#).unwrap();
        assert_eq!(c, Chunk::default());
        let c = parse(r#"{"choices":[{"delta":{},"finish_reason":"length"}]}"#).unwrap();
        assert_eq!(c.finish_reason.as_deref(), Some("length"));
    }

    #[test]
    fn usage_and_timings() {
        let c = parse(
            r#"{"choices":[],"usage":{"prompt_tokens":120,"completion_tokens":30,"total_tokens":150,
                "prompt_tokens_details":{"cached_tokens":100}},
               "timings":{"prompt_n":20,"prompt_ms":40.0,"prompt_per_second":500.0,
                "predicted_n":30,"predicted_ms":600.0,"predicted_per_second":50.0,"cache_n":100}}"#,
        )
        .unwrap();
        assert_eq!(
            c.report,
            Some(ServerReport {
                prompt_tokens: Some(120),
                cached_tokens: Some(100),
                completion_tokens: Some(30),
                prefill_ms: Some(40.0),
                prefill_tps: Some(500.0),
                decode_tps: Some(50.0),
            })
        );
        // Timings alone (llama-server without include_usage): the counts come from there.
        let c = parse(r#"{"choices":[],"timings":{"predicted_n":7,"cache_n":3}}"#).unwrap();
        let r = c.report.unwrap();
        assert_eq!(
            (r.completion_tokens, r.cached_tokens, r.prompt_tokens),
            (Some(7), Some(3), None)
        );
        assert_eq!(parse(r#"{"choices":[],"usage":null}"#).unwrap().report, None);
    }

    #[test]
    fn errors_are_one_line() {
        let e = parse(r#"{"error":{"message":"out of memory\nin layer 3","code":500}}"#).unwrap_err();
        assert!(e.contains("out of memory in layer 3") && !e.contains('\n'), "{e}");
        let e = parse(r#"{"error":"boom"}"#).unwrap_err();
        assert!(e.ends_with("boom"), "{e}");
        let e = parse("not json at all").unwrap_err();
        assert!(e.contains("not JSON") && e.contains("not json at all"), "{e}");
        assert_eq!(clip(&"x".repeat(300), 5), "xxxxx…");
    }
}
