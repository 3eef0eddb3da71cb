//! `POST /v1/chat/completions` bodies: parsed from JSON and checked field by field into a
//! [`ChatRequest`], each refusal a 400 naming the field (`messages[2].role: "tool" is not one of
//! ...`). Sampling ranges are the engine's own (`engine::settings`), the same as the CLI's flags.
//!
//! Fields the engine has no use for (`user`, `frequency_penalty`, ...) are accepted and ignored, as
//! OpenAI-compatible servers do, so stock clients work; fields it cannot honour (`n` > 1, the
//! legacy `functions`) are refused. Tools, `tool_choice`, assistant `tool_calls` and `role: "tool"`
//! results are read here, their rules are tools.rs. Owns the request vocabulary. Must not do I/O or
//! touch the engine.

use serde_json::{Map, Value};

use crate::engine::events::SamplingParams;
use crate::engine::settings;
use crate::model::chat::{Message, Role, ThinkMode};
use crate::model::tools::{Json, ToolCall};

use super::error::ApiError;
use super::tools::{self, Tools};

/// A checked chat-completion request.
#[derive(Clone, Debug, PartialEq)]
pub struct ChatRequest {
    pub messages: Vec<Message>,
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk carries the usage.
    pub include_usage: bool,
    /// Fields given; the server's defaults fill the rest.
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<u32>,
    pub min_p: Option<f32>,
    pub seed: Option<u64>,
    pub max_tokens: Option<u32>,
    /// From `reasoning_effort`, `thinking` or `chat_template_kwargs.thinking`.
    pub think: Option<ThinkMode>,
    /// `tools` and `tool_choice`.
    pub tools: Tools,
}

impl ChatRequest {
    /// The sampler settings: the given fields over `defaults`.
    pub fn sampling(&self, defaults: &SamplingParams) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature.unwrap_or(defaults.temperature),
            top_p: self.top_p.unwrap_or(defaults.top_p),
            top_k: self.top_k.unwrap_or(defaults.top_k),
            min_p: self.min_p.unwrap_or(defaults.min_p),
            seed: self.seed.or(defaults.seed),
        }
    }
}

/// Parse and check a request body for the model served as `model_id`.
pub fn parse_chat_request(body: &[u8], model_id: &str) -> Result<ChatRequest, ApiError> {
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::status(400, format!("request body is not valid JSON: {e}").replace('\n', " "))
            .with_code("invalid_json")
    })?;
    let Value::Object(obj) = value else {
        return Err(ApiError::status(400, "request body must be a JSON object"));
    };
    // The same body with its objects' keys in order, for what goes into the prompt as JSON.
    let ordered = Json::parse(&String::from_utf8_lossy(body)).unwrap_or(Json::Null);
    let f = Fields(&obj);

    match f.get("model") {
        None => return Err(ApiError::field("model", "is required")),
        Some(Value::String(m)) if m == model_id => {}
        Some(Value::String(m)) => {
            return Err(ApiError {
                status: 404,
                message: format!("model: \"{m}\" is not served here (the model is \"{model_id}\")"),
                param: Some("model".into()),
                code: Some("model_not_found"),
            });
        }
        Some(_) => return Err(ApiError::field("model", "must be a string")),
    }
    let messages = parse_messages(f.get("messages"), ordered.get("messages"))?;
    let stream = f.bool("stream")?.unwrap_or(false);
    let include_usage = match f.get("stream_options") {
        None => None,
        Some(Value::Object(o)) => Fields(o).bool_named("include_usage", "stream_options.include_usage")?,
        Some(_) => return Err(ApiError::field("stream_options", "must be an object")),
    }
    .unwrap_or(false);
    if let Some(n) = f.int("n")?
        && n != 1
    {
        return Err(ApiError::field(
            "n",
            format!("{n}: only one choice (n = 1) is generated"),
        ));
    }
    for legacy in ["functions", "function_call"] {
        if f.get(legacy).is_some() {
            return Err(ApiError::field(
                legacy,
                "the legacy function fields are not supported: use tools",
            ));
        }
    }
    let mut tools = tools::openai_tools(ordered.get("tools"))?;
    tools.choice = tools::openai_choice(ordered.get("tool_choice"), &tools)?;
    let max_tokens = match (f.int("max_completion_tokens")?, f.int("max_tokens")?) {
        (Some(v), _) => Some(checked("max_completion_tokens", settings::check_max_tokens(v))?),
        (None, Some(v)) => Some(checked("max_tokens", settings::check_max_tokens(v))?),
        (None, None) => None,
    };
    Ok(ChatRequest {
        messages,
        stream,
        include_usage,
        temperature: f.number_checked("temperature", settings::check_temp)?,
        top_p: f.number_checked("top_p", settings::check_top_p)?,
        top_k: f.int_checked("top_k", settings::check_top_k)?,
        min_p: f.number_checked("min_p", settings::check_min_p)?,
        seed: f.int_checked("seed", settings::check_seed)?,
        max_tokens,
        think: parse_think(&f)?,
        tools,
    })
}

fn checked<T>(field: &str, r: Result<T, String>) -> Result<T, ApiError> {
    r.map_err(|why| ApiError::field(field, why))
}

/// Typed access to the fields of a JSON object; `null` counts as absent (the `openai` client never
/// sends it, but other clients do).
struct Fields<'a>(&'a Map<String, Value>);

impl Fields<'_> {
    fn get(&self, k: &str) -> Option<&Value> {
        self.0.get(k).filter(|v| !v.is_null())
    }

    fn bool(&self, k: &str) -> Result<Option<bool>, ApiError> {
        self.bool_named(k, k)
    }

    fn bool_named(&self, k: &str, name: &str) -> Result<Option<bool>, ApiError> {
        match self.get(k) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(ApiError::field(name, "must be true or false")),
        }
    }

    fn number(&self, k: &str) -> Result<Option<f64>, ApiError> {
        match self.get(k) {
            None => Ok(None),
            Some(Value::Number(n)) => Ok(n.as_f64()),
            Some(_) => Err(ApiError::field(k, "must be a number")),
        }
    }

    fn int(&self, k: &str) -> Result<Option<i64>, ApiError> {
        match self.get(k) {
            None => Ok(None),
            Some(Value::Number(n)) => match (n.as_i64(), n.as_u64()) {
                (Some(v), _) => Ok(Some(v)),
                (None, Some(_)) => Err(ApiError::field(k, format!("{n} is too large"))),
                (None, None) => Err(ApiError::field(k, format!("{n} is not an integer"))),
            },
            Some(_) => Err(ApiError::field(k, "must be an integer")),
        }
    }

    /// A number field passed through the setting's range check (the app's and the flags' one).
    fn number_checked<T>(&self, k: &str, check: fn(f64) -> Result<T, String>) -> Result<Option<T>, ApiError> {
        self.number(k)?.map(|v| checked(k, check(v))).transpose()
    }

    /// An integer field passed through the setting's range check.
    fn int_checked<T>(&self, k: &str, check: fn(i64) -> Result<T, String>) -> Result<Option<T>, ApiError> {
        self.int(k)?.map(|v| checked(k, check(v))).transpose()
    }

    fn string(&self, k: &str, name: &str) -> Result<Option<&str>, ApiError> {
        match self.get(k) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(ApiError::field(name, "must be a string")),
        }
    }
}

fn parse_messages(v: Option<&Value>, ordered: Option<&Json>) -> Result<Vec<Message>, ApiError> {
    let items = match v {
        None => return Err(ApiError::field("messages", "is required")),
        Some(Value::Array(a)) if a.is_empty() => return Err(ApiError::field("messages", "must not be empty")),
        Some(Value::Array(a)) => a,
        Some(_) => return Err(ApiError::field("messages", "must be an array of messages")),
    };
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let name = |k: &str| format!("messages[{i}].{k}");
        let Value::Object(o) = item else {
            return Err(ApiError::field(format!("messages[{i}]"), "must be an object"));
        };
        let m = Fields(o);
        let (role, tool_result) = match m.string("role", &name("role"))? {
            None => return Err(ApiError::field(name("role"), "is required")),
            Some("system" | "developer") => (Role::System, false),
            Some("user") => (Role::User, false),
            Some("assistant") => (Role::Assistant, false),
            Some("tool") => (Role::User, true),
            Some(other) => {
                return Err(ApiError::field(
                    name("role"),
                    format!("\"{other}\" is not one of system, developer, user, assistant, tool"),
                ));
            }
        };
        let content = match m.get("content") {
            None if role == Role::Assistant || tool_result => String::new(),
            None => return Err(ApiError::field(name("content"), "is required")),
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(parts)) => text_parts(parts, &name("content"))?,
            Some(_) => {
                return Err(ApiError::field(
                    name("content"),
                    "must be a string or an array of text parts",
                ));
            }
        };
        let reasoning = match role {
            Role::Assistant => match m.string("reasoning_content", &name("reasoning_content"))? {
                Some(r) => Some(r.to_string()),
                None => m.string("reasoning", &name("reasoning"))?.map(str::to_string),
            },
            _ => None,
        };
        let message = if tool_result {
            match m.string("tool_call_id", &name("tool_call_id"))? {
                Some(id) if !id.is_empty() => Message::tool_result(id, content),
                _ => return Err(ApiError::field(name("tool_call_id"), "is required in a tool message")),
            }
        } else {
            let calls = match role {
                Role::Assistant => history_calls(
                    ordered.and_then(|o| match o {
                        Json::Array(items) => items.get(i),
                        _ => None,
                    }),
                    i,
                )?,
                _ => Vec::new(),
            };
            Message::assistant_calls(content, reasoning, calls)
        };
        out.push(Message { role, ..message });
    }
    match out.last() {
        Some(m) if m.role == Role::User => Ok(out),
        _ => Err(ApiError::field(
            format!("messages[{}].role", out.len() - 1),
            "the last message must be from the user or a tool",
        )),
    }
}

/// The `tool_calls` of an assistant message in the history:
/// `[{"id", "type": "function", "function": {"name", "arguments"}}]`.
fn history_calls(message: Option<&Json>, i: usize) -> Result<Vec<ToolCall>, ApiError> {
    let items = match message.and_then(|m| m.get("tool_calls")) {
        None | Some(Json::Null) => return Ok(Vec::new()),
        Some(Json::Array(items)) => items,
        Some(_) => return Err(ApiError::field(format!("messages[{i}].tool_calls"), "must be an array")),
    };
    let mut calls = Vec::with_capacity(items.len());
    for (j, c) in items.iter().enumerate() {
        let at = |k: &str| format!("messages[{i}].tool_calls[{j}].{k}");
        let id = match c.get("id") {
            Some(Json::Str(id)) if !id.is_empty() => id.clone(),
            _ => return Err(ApiError::field(at("id"), "is required")),
        };
        let f = c.get("function");
        let name = match f.and_then(|f| f.get("name")) {
            Some(Json::Str(n)) if !n.is_empty() => n.clone(),
            _ => return Err(ApiError::field(at("function.name"), "is required")),
        };
        let arguments = tools::call_arguments(f.and_then(|f| f.get("arguments")), &at("function.arguments"))?;
        calls.push(ToolCall { id, name, arguments });
    }
    Ok(calls)
}

/// The text of a content array: its `{"type": "text", "text": ...}` parts joined.
fn text_parts(parts: &[Value], name: &str) -> Result<String, ApiError> {
    let mut text = String::new();
    for (j, p) in parts.iter().enumerate() {
        let part = format!("{name}[{j}]");
        let Value::Object(o) = p else {
            return Err(ApiError::field(part, "must be an object"));
        };
        let f = Fields(o);
        match f.string("type", &format!("{part}.type"))? {
            Some("text") => {}
            Some(other) => {
                return Err(ApiError::field(
                    format!("{part}.type"),
                    format!("\"{other}\" is not supported (only text)"),
                ));
            }
            None => return Err(ApiError::field(format!("{part}.type"), "is required")),
        }
        match f.string("text", &format!("{part}.text"))? {
            Some(t) => text.push_str(t),
            None => return Err(ApiError::field(format!("{part}.text"), "is required")),
        }
    }
    Ok(text)
}

/// The think mode a request asks for: `reasoning_effort` (none/minimal/low/medium/high/max), else
/// a thinking switch: `thinking` (true/false or DeepSeek's `{"type": "enabled"|"disabled"}`) or
/// vLLM's `chat_template_kwargs.thinking`, refined by `chat_template_kwargs.reasoning_effort`
/// (where vLLM's and SGLang's DeepSeek V4 templates read the effort, and what `--remote` sends).
fn parse_think(f: &Fields<'_>) -> Result<Option<ThinkMode>, ApiError> {
    if let Some(e) = f.string("reasoning_effort", "reasoning_effort")? {
        return effort(e, "reasoning_effort").map(Some);
    }
    if let Some(v) = f.get("thinking") {
        return switch(v, "thinking").map(Some);
    }
    match f.get("chat_template_kwargs") {
        None => Ok(None),
        Some(Value::Object(o)) => {
            let on = match o.get("thinking").filter(|v| !v.is_null()) {
                Some(v) => Some(switch(v, "chat_template_kwargs.thinking")?),
                None => None,
            };
            let level = match o.get("reasoning_effort").filter(|v| !v.is_null()) {
                Some(Value::String(e)) => Some(effort(e, "chat_template_kwargs.reasoning_effort")?),
                Some(_) => {
                    return Err(ApiError::field(
                        "chat_template_kwargs.reasoning_effort",
                        "must be a string",
                    ));
                }
                None => None,
            };
            Ok(match (on, level) {
                (Some(ThinkMode::Off), _) => Some(ThinkMode::Off),
                (_, Some(l)) => Some(l),
                (on, None) => on,
            })
        }
        Some(_) => Err(ApiError::field("chat_template_kwargs", "must be an object")),
    }
}

/// A `reasoning_effort` value as a think mode.
fn effort(e: &str, field: &str) -> Result<ThinkMode, ApiError> {
    match e {
        "none" | "minimal" => Ok(ThinkMode::Off),
        "low" | "medium" | "high" => Ok(ThinkMode::High),
        "max" | "xhigh" => Ok(ThinkMode::Max),
        other => Err(ApiError::field(
            field,
            format!("\"{other}\" is not one of none, minimal, low, medium, high, max"),
        )),
    }
}

/// A thinking switch: true/false or DeepSeek's `{"type": "enabled"|"disabled"}`.
fn switch(v: &Value, name: &str) -> Result<ThinkMode, ApiError> {
    let on = match v {
        Value::Bool(b) => *b,
        Value::Object(o) => match o.get("type").and_then(Value::as_str) {
            Some("enabled") => true,
            Some("disabled") => false,
            _ => {
                return Err(ApiError::field(
                    format!("{name}.type"),
                    "must be \"enabled\" or \"disabled\"",
                ));
            }
        },
        _ => return Err(ApiError::field(name, "must be true, false or {\"type\": \"enabled\"}")),
    };
    Ok(if on { ThinkMode::High } else { ThinkMode::Off })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: &str) -> Result<ChatRequest, ApiError> {
        parse_chat_request(body.as_bytes(), "m")
    }

    fn refused(body: &str) -> (u16, String) {
        let e = parse(body).unwrap_err();
        (e.status, e.param.unwrap_or_default())
    }

    #[test]
    fn a_full_request_maps_every_field() {
        let r = parse(
            r#"{"model":"m","stream":true,"stream_options":{"include_usage":true},
                "messages":[{"role":"system","content":"S"},{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
                            {"role":"assistant","content":"x","reasoning_content":"r"},{"role":"user","content":"q"}],
                "temperature":0,"top_p":0.9,"top_k":40,"min_p":0.1,"seed":7,"max_completion_tokens":12,
                "reasoning_effort":"none","user":"ignored","frequency_penalty":0}"#,
        )
        .unwrap();
        assert!(r.stream && r.include_usage);
        assert_eq!(r.messages.len(), 4);
        assert_eq!(r.messages[1].content, "ab");
        assert_eq!(r.messages[2].reasoning.as_deref(), Some("r"));
        let s = r.sampling(&SamplingParams::default());
        assert_eq!(
            (s.temperature, s.top_p, s.top_k, s.min_p, s.seed),
            (0.0, 0.9, 40, 0.1, Some(7))
        );
        assert_eq!(r.max_tokens, Some(12));
        assert_eq!(r.think, Some(ThinkMode::Off));
    }

    #[test]
    fn tool_calls_and_results_in_the_history() {
        let r = parse(
            r#"{"model":"m","tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"required",
                "messages":[{"role":"user","content":"q"},
                {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"b\":1,\"a\":2}"}}]},
                {"role":"tool","tool_call_id":"c1","content":"r"}]}"#,
        )
        .unwrap();
        assert_eq!(r.tools.names, ["f"]);
        assert_eq!(r.tools.choice, tools::ToolChoice::Required);
        assert_eq!(r.messages[1].tool_calls[0].arguments, r#"{"b":1,"a":2}"#);
        assert_eq!(r.messages[2].tool_call_id.as_deref(), Some("c1"));
        assert_eq!(r.messages[2].role, Role::User);
    }

    #[test]
    fn thinking_switches() {
        let base = r#""model":"m","messages":[{"role":"user","content":"q"}]"#;
        let think = |extra: &str| parse(&format!("{{{base},{extra}}}")).unwrap().think;
        assert_eq!(think(r#""thinking":{"type":"enabled"}"#), Some(ThinkMode::High));
        assert_eq!(think(r#""thinking":false"#), Some(ThinkMode::Off));
        assert_eq!(
            think(r#""chat_template_kwargs":{"thinking":true}"#),
            Some(ThinkMode::High)
        );
        assert_eq!(think(r#""reasoning_effort":"max""#), Some(ThinkMode::Max));
        // What `--remote` sends for --think-max, and a switch that turns it off.
        assert_eq!(
            think(r#""chat_template_kwargs":{"thinking":true,"reasoning_effort":"max"}"#),
            Some(ThinkMode::Max)
        );
        assert_eq!(
            think(r#""chat_template_kwargs":{"thinking":false,"reasoning_effort":"max"}"#),
            Some(ThinkMode::Off)
        );
        assert_eq!(parse(&format!("{{{base}}}")).unwrap().think, None);
    }

    #[test]
    fn refusals_name_the_field() {
        let user = r#"[{"role":"user","content":"q"}]"#;
        assert_eq!(refused("{"), (400, String::new()));
        assert_eq!(refused("[1]"), (400, String::new()));
        assert_eq!(refused(&format!(r#"{{"messages":{user}}}"#)), (400, "model".into()));
        assert_eq!(
            refused(&format!(r#"{{"model":"other","messages":{user}}}"#)),
            (404, "model".into())
        );
        assert_eq!(refused(r#"{"model":"m"}"#), (400, "messages".into()));
        assert_eq!(refused(r#"{"model":"m","messages":[]}"#), (400, "messages".into()));
        assert_eq!(
            refused(r#"{"model":"m","messages":[{"role":"tool","content":"x"}]}"#),
            (400, "messages[0].tool_call_id".into())
        );
        assert_eq!(
            refused(r#"{"model":"m","messages":[{"role":"critic","content":"x"}]}"#),
            (400, "messages[0].role".into())
        );
        assert_eq!(
            refused(
                r#"{"model":"m","messages":[{"role":"user","content":"q"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"array"}}}]}"#
            ),
            (400, "tools[0].function.parameters".into())
        );
        assert_eq!(
            refused(
                r#"{"model":"m","messages":[{"role":"user","content":"q"}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"always"}"#
            ),
            (400, "tool_choice".into())
        );
        assert_eq!(
            refused(
                r#"{"model":"m","messages":[{"role":"user","content":"q"},{"role":"assistant","tool_calls":[{"type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c","content":"r"}]}"#
            ),
            (400, "messages[1].tool_calls[0].id".into())
        );
        assert_eq!(
            refused(r#"{"model":"m","messages":[{"role":"user"}]}"#),
            (400, "messages[0].content".into())
        );
        assert_eq!(
            refused(r#"{"model":"m","messages":[{"role":"user","content":"q"},{"role":"assistant","content":"a"}]}"#),
            (400, "messages[1].role".into())
        );
        for (field, value) in [
            ("temperature", "\"hot\""),
            ("temperature", "-1"),
            ("top_p", "0"),
            ("top_k", "1.5"),
            ("top_k", "5000"),
            ("min_p", "2"),
            ("seed", "-1"),
            ("seed", "18446744073709551615"),
            ("max_tokens", "0"),
            ("stream", "\"yes\""),
            ("n", "2"),
            ("reasoning_effort", "\"extreme\""),
        ] {
            assert_eq!(
                refused(&format!(r#"{{"model":"m","messages":{user},"{field}":{value}}}"#)),
                (400, field.to_string()),
                "{field}: {value}"
            );
        }
        let e = parse(&format!(r#"{{"model":"m","messages":{user},"temperature":-1}}"#)).unwrap_err();
        assert!(
            e.message.starts_with("temperature: -1 is out of range"),
            "{}",
            e.message
        );
    }
}
