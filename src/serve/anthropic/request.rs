//! `POST /v1/messages` bodies: Anthropic's Messages API checked field by field into a
//! [`MessagesRequest`], each refusal a 400 naming the field. Content blocks map onto the
//! conversation as DeepSeek's format holds them: `text` is text, `thinking` the reasoning,
//! `tool_use` an assistant's call, `tool_result` a tool's result in the user turn.
//!
//! `thinking: {"type": "enabled", "budget_tokens": N}` is high thinking, or max from
//! [`MAX_THINKING_BUDGET`] tokens on; `{"type": "disabled"}` is off (docs/serve.md#anthropic-messages-api).
//! The `model` field may name any model (agents send their own names); the reply names the served
//! one. Owns this vocabulary. Must not do I/O or touch the engine.

use crate::engine::events::SamplingParams;
use crate::engine::settings;
use crate::model::chat::{Message, Role, ThinkMode};
use crate::model::tools::{Json, ToolCall};

use super::super::error::ApiError;
use super::super::tools::{self, Tools};

/// A thinking budget of this many tokens or more asks for Think Max.
pub const MAX_THINKING_BUDGET: i64 = 32_768;
/// Anthropic's least thinking budget.
const MIN_THINKING_BUDGET: i64 = 1024;
/// Most stop sequences.
const MAX_STOP_SEQUENCES: usize = 16;

/// A checked Messages API request.
#[derive(Clone, Debug, PartialEq)]
pub struct MessagesRequest {
    pub messages: Vec<Message>,
    pub tools: Tools,
    pub stream: bool,
    pub max_tokens: u32,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<u32>,
    pub think: Option<ThinkMode>,
    pub stop_sequences: Vec<String>,
}

impl MessagesRequest {
    pub fn sampling(&self, defaults: &SamplingParams) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature.unwrap_or(defaults.temperature),
            top_p: self.top_p.unwrap_or(defaults.top_p),
            top_k: self.top_k.unwrap_or(defaults.top_k),
            ..defaults.clone()
        }
    }
}

fn checked<T>(field: &str, r: Result<T, String>) -> Result<T, ApiError> {
    r.map_err(|why| ApiError::field(field, why))
}

/// A field of an object; `null` counts as absent.
fn field<'a>(o: &'a Json, k: &str) -> Option<&'a Json> {
    o.get(k).filter(|v| **v != Json::Null)
}

fn string<'a>(o: &'a Json, k: &str, name: &str) -> Result<Option<&'a str>, ApiError> {
    match field(o, k) {
        None => Ok(None),
        Some(Json::Str(s)) => Ok(Some(s)),
        Some(_) => Err(ApiError::field(name, "must be a string")),
    }
}

fn number(o: &Json, k: &str) -> Result<Option<f64>, ApiError> {
    match field(o, k) {
        None => Ok(None),
        Some(Json::Int(i)) => Ok(Some(*i as f64)),
        Some(Json::UInt(u)) => Ok(Some(*u as f64)),
        Some(Json::Float(f)) => Ok(Some(*f)),
        Some(_) => Err(ApiError::field(k, "must be a number")),
    }
}

fn int(o: &Json, k: &str, name: &str) -> Result<Option<i64>, ApiError> {
    match field(o, k) {
        None => Ok(None),
        Some(Json::Int(i)) => Ok(Some(*i)),
        Some(Json::UInt(_)) => Err(ApiError::field(name, "is too large")),
        Some(_) => Err(ApiError::field(name, "must be an integer")),
    }
}

/// Parse and check a request body.
pub fn parse_messages_request(body: &[u8]) -> Result<MessagesRequest, ApiError> {
    let text = std::str::from_utf8(body).map_err(|_| ApiError::status(400, "request body is not UTF-8"))?;
    let root = Json::parse(text)
        .map_err(|e| ApiError::status(400, format!("request body is not valid JSON: {e}")).with_code("invalid_json"))?;
    if !matches!(root, Json::Object(_)) {
        return Err(ApiError::status(400, "request body must be a JSON object"));
    }
    if string(&root, "model", "model")?.is_none() {
        return Err(ApiError::field("model", "is required"));
    }
    let max_tokens = match int(&root, "max_tokens", "max_tokens")? {
        Some(v) => checked("max_tokens", settings::check_max_tokens(v))?,
        None => return Err(ApiError::field("max_tokens", "is required")),
    };
    let stream = match field(&root, "stream") {
        None => false,
        Some(Json::Bool(b)) => *b,
        Some(_) => return Err(ApiError::field("stream", "must be true or false")),
    };
    let mut tools = tools::anthropic_tools(field(&root, "tools"))?;
    tools.choice = tools::anthropic_choice(field(&root, "tool_choice"), &tools)?;
    let mut messages = system_messages(field(&root, "system"))?;
    messages.extend(conversation(field(&root, "messages"))?);
    let stop_sequences = match field(&root, "stop_sequences") {
        None => Vec::new(),
        Some(Json::Array(items)) if items.len() <= MAX_STOP_SEQUENCES => items
            .iter()
            .map(|s| match s {
                Json::Str(s) if !s.is_empty() => Ok(s.clone()),
                _ => Err(ApiError::field("stop_sequences", "must hold non-empty strings")),
            })
            .collect::<Result<_, _>>()?,
        Some(_) => {
            return Err(ApiError::field(
                "stop_sequences",
                format!("must be an array of at most {MAX_STOP_SEQUENCES} strings"),
            ));
        }
    };
    Ok(MessagesRequest {
        messages,
        tools,
        stream,
        max_tokens,
        temperature: number(&root, "temperature")?
            .map(|v| checked("temperature", settings::check_temp(v)))
            .transpose()?,
        top_p: number(&root, "top_p")?
            .map(|v| checked("top_p", settings::check_top_p(v)))
            .transpose()?,
        top_k: int(&root, "top_k", "top_k")?
            .map(|v| checked("top_k", settings::check_top_k(v)))
            .transpose()?,
        think: thinking(field(&root, "thinking"))?,
        stop_sequences,
    })
}

/// `thinking`: enabled (with a budget) or disabled; see the module comment for the mapping.
fn thinking(v: Option<&Json>) -> Result<Option<ThinkMode>, ApiError> {
    let Some(t) = v else { return Ok(None) };
    match string(t, "type", "thinking.type")? {
        Some("disabled") => Ok(Some(ThinkMode::Off)),
        Some("adaptive") => Ok(Some(ThinkMode::High)),
        Some("enabled") => match int(t, "budget_tokens", "thinking.budget_tokens")? {
            Some(b) if b < MIN_THINKING_BUDGET => Err(ApiError::field(
                "thinking.budget_tokens",
                format!("{b} is below the least budget, {MIN_THINKING_BUDGET}"),
            )),
            Some(b) if b >= MAX_THINKING_BUDGET => Ok(Some(ThinkMode::Max)),
            Some(_) => Ok(Some(ThinkMode::High)),
            None => Err(ApiError::field(
                "thinking.budget_tokens",
                "is required when thinking is enabled",
            )),
        },
        Some(other) => Err(ApiError::field(
            "thinking.type",
            format!("\"{other}\" is not one of enabled, disabled, adaptive"),
        )),
        None => Err(ApiError::field("thinking.type", "is required")),
    }
}

/// `system`: a string or an array of text blocks (joined).
fn system_messages(v: Option<&Json>) -> Result<Vec<Message>, ApiError> {
    let text = match v {
        None => return Ok(Vec::new()),
        Some(Json::Str(s)) => s.clone(),
        Some(Json::Array(blocks)) => {
            let mut text = Vec::new();
            for (i, b) in blocks.iter().enumerate() {
                let at = format!("system[{i}]");
                match string(b, "type", &format!("{at}.type"))? {
                    Some("text") => {}
                    _ => return Err(ApiError::field(format!("{at}.type"), "must be \"text\"")),
                }
                match string(b, "text", &format!("{at}.text"))? {
                    Some(t) => text.push(t.to_string()),
                    None => return Err(ApiError::field(format!("{at}.text"), "is required")),
                }
            }
            text.join("\n\n")
        }
        Some(_) => return Err(ApiError::field("system", "must be a string or an array of text blocks")),
    };
    Ok(vec![Message::system(text)])
}

/// The text of a `tool_result`'s content: a string or text blocks.
fn result_text(v: Option<&Json>, at: &str) -> Result<String, ApiError> {
    match v {
        None => Ok(String::new()),
        Some(Json::Str(s)) => Ok(s.clone()),
        Some(Json::Array(blocks)) => {
            let mut parts = Vec::new();
            for (k, b) in blocks.iter().enumerate() {
                let name = format!("{at}.content[{k}]");
                match (
                    string(b, "type", &format!("{name}.type"))?,
                    string(b, "text", &format!("{name}.text"))?,
                ) {
                    (Some("text"), Some(t)) => parts.push(t.to_string()),
                    _ => return Err(ApiError::field(name, "only text blocks are supported in a tool result")),
                }
            }
            Ok(parts.join("\n\n"))
        }
        Some(_) => Err(ApiError::field(
            format!("{at}.content"),
            "must be a string or an array of text blocks",
        )),
    }
}

/// `messages`: user and assistant turns, each a string or content blocks.
fn conversation(v: Option<&Json>) -> Result<Vec<Message>, ApiError> {
    let items = match v {
        None => return Err(ApiError::field("messages", "is required")),
        Some(Json::Array(a)) if a.is_empty() => return Err(ApiError::field("messages", "must not be empty")),
        Some(Json::Array(a)) => a,
        Some(_) => return Err(ApiError::field("messages", "must be an array of messages")),
    };
    let mut out = Vec::new();
    for (i, m) in items.iter().enumerate() {
        let role = match string(m, "role", &format!("messages[{i}].role"))? {
            Some("user") => Role::User,
            Some("assistant") => Role::Assistant,
            Some(other) => {
                return Err(ApiError::field(
                    format!("messages[{i}].role"),
                    format!("\"{other}\" is not one of user, assistant"),
                ));
            }
            None => return Err(ApiError::field(format!("messages[{i}].role"), "is required")),
        };
        match (role, field(m, "content")) {
            (_, None) => return Err(ApiError::field(format!("messages[{i}].content"), "is required")),
            (Role::User, Some(Json::Str(s))) => out.push(Message::user(s.clone())),
            (_, Some(Json::Str(s))) => out.push(Message::assistant(s.clone(), None)),
            (role, Some(Json::Array(blocks))) => blocks_into(role, blocks, i, &mut out)?,
            (_, Some(_)) => {
                return Err(ApiError::field(
                    format!("messages[{i}].content"),
                    "must be a string or an array of content blocks",
                ));
            }
        }
    }
    match out.last() {
        Some(m) if m.role == Role::User => Ok(out),
        _ => Err(ApiError::field(
            format!("messages[{}].role", items.len() - 1),
            "the last message must be from the user (a prefilled assistant turn is not supported)",
        )),
    }
}

/// The blocks of one message: a user's text and tool results become messages in order; an
/// assistant's thinking, text and tool uses become one assistant message.
fn blocks_into(role: Role, blocks: &[Json], i: usize, out: &mut Vec<Message>) -> Result<(), ApiError> {
    let mut text = String::new();
    let mut reasoning: Option<String> = None;
    let mut calls = Vec::new();
    // A user's consecutive text blocks are one message, joined by blank lines.
    let mut user_text: Vec<&str> = Vec::new();
    let flush = |user_text: &mut Vec<&str>, out: &mut Vec<Message>| {
        if !user_text.is_empty() {
            out.push(Message::user(user_text.join("\n\n")));
            user_text.clear();
        }
    };
    for (j, b) in blocks.iter().enumerate() {
        let at = format!("messages[{i}].content[{j}]");
        let kind = string(b, "type", &format!("{at}.type"))?;
        match (role, kind) {
            (_, Some("text")) => match string(b, "text", &format!("{at}.text"))? {
                Some(t) if role == Role::User => user_text.push(t),
                Some(t) => text.push_str(t),
                None => return Err(ApiError::field(format!("{at}.text"), "is required")),
            },
            (Role::User, Some("tool_result")) => {
                let id = match string(b, "tool_use_id", &format!("{at}.tool_use_id"))? {
                    Some(id) if !id.is_empty() => id,
                    _ => return Err(ApiError::field(format!("{at}.tool_use_id"), "is required")),
                };
                flush(&mut user_text, out);
                out.push(Message::tool_result(id, result_text(field(b, "content"), &at)?));
            }
            (Role::Assistant, Some("thinking")) => {
                let t = string(b, "thinking", &format!("{at}.thinking"))?.unwrap_or("");
                reasoning.get_or_insert_with(String::new).push_str(t);
            }
            (Role::Assistant, Some("redacted_thinking")) => {}
            (Role::Assistant, Some("tool_use")) => {
                let id = match string(b, "id", &format!("{at}.id"))? {
                    Some(id) if !id.is_empty() => id.to_string(),
                    _ => return Err(ApiError::field(format!("{at}.id"), "is required")),
                };
                let name = match string(b, "name", &format!("{at}.name"))? {
                    Some(n) if !n.is_empty() => n.to_string(),
                    _ => return Err(ApiError::field(format!("{at}.name"), "is required")),
                };
                let arguments = tools::call_arguments(field(b, "input"), &format!("{at}.input"))?;
                calls.push(ToolCall { id, name, arguments });
            }
            (_, Some(other)) => {
                return Err(ApiError::field(
                    format!("{at}.type"),
                    format!(
                        "\"{other}\" is not supported in a {} message",
                        if role == Role::User { "user" } else { "assistant" }
                    ),
                ));
            }
            (_, None) => return Err(ApiError::field(format!("{at}.type"), "is required")),
        }
    }
    flush(&mut user_text, out);
    if role == Role::Assistant {
        out.push(Message::assistant_calls(text, reasoning, calls));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: &str) -> Result<MessagesRequest, ApiError> {
        parse_messages_request(body.as_bytes())
    }

    #[test]
    fn blocks_map_onto_the_conversation() {
        let r = parse(
            r#"{"model":"claude-x","max_tokens":100,"system":[{"type":"text","text":"S"}],
                "thinking":{"type":"enabled","budget_tokens":2048},
                "tools":[{"name":"ls","input_schema":{"type":"object"}}],"tool_choice":{"type":"any"},
                "messages":[{"role":"user","content":"q"},
                  {"role":"assistant","content":[{"type":"thinking","thinking":"hm","signature":"s"},{"type":"text","text":"Let me look."},
                     {"type":"tool_use","id":"t1","name":"ls","input":{"path":"/","all":true}}]},
                  {"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"a b"}]},{"type":"text","text":"and?"}]}]}"#,
        )
        .unwrap();
        assert_eq!(r.think, Some(ThinkMode::High));
        assert_eq!(r.tools.choice, tools::ToolChoice::Required);
        let m = &r.messages;
        assert_eq!(m.len(), 5);
        assert_eq!((m[0].role, m[0].content.as_str()), (Role::System, "S"));
        assert_eq!(m[2].reasoning.as_deref(), Some("hm"));
        assert_eq!(m[2].content, "Let me look.");
        assert_eq!(m[2].tool_calls[0].arguments, r#"{"path": "/", "all": true}"#);
        assert_eq!(
            (m[3].tool_call_id.as_deref(), m[3].content.as_str()),
            (Some("t1"), "a b")
        );
        assert_eq!((m[4].role, m[4].content.as_str()), (Role::User, "and?"));
    }

    #[test]
    fn refusals_name_the_field() {
        let refused = |body: &str| parse(body).unwrap_err().param.unwrap_or_default();
        let user = r#""messages":[{"role":"user","content":"q"}]"#;
        assert_eq!(refused(&format!(r#"{{"model":"m",{user}}}"#)), "max_tokens");
        assert_eq!(
            refused(&format!(
                r#"{{"model":"m","max_tokens":5,{user},"thinking":{{"type":"enabled","budget_tokens":10}}}}"#
            )),
            "thinking.budget_tokens"
        );
        assert_eq!(
            refused(&format!(
                r#"{{"model":"m","max_tokens":5,{user},"tools":[{{"name":"x","input_schema":"no"}}]}}"#
            )),
            "tools[0].input_schema"
        );
        assert_eq!(
            refused(
                r#"{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"tool_result","content":"r"}]}]}"#
            ),
            "messages[0].content[0].tool_use_id"
        );
        assert_eq!(
            refused(r#"{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"image"}]}]}"#),
            "messages[0].content[0].type"
        );
        assert_eq!(
            refused(&format!(
                r#"{{"model":"m","max_tokens":5,{user},"tool_choice":{{"type":"tool","name":"nope"}}}}"#
            )),
            "tool_choice"
        );
        let ok = parse(&format!(
            r#"{{"model":"m","max_tokens":5,{user},"thinking":{{"type":"enabled","budget_tokens":40000}}}}"#
        ))
        .unwrap();
        assert_eq!(ok.think, Some(ThinkMode::Max));
    }
}
