//! The request side of tool calls, shared by both APIs: tool definitions checked and turned into
//! the JSON text the prompt holds, `tool_choice`, and what a choice does to the conversation
//! (docs/serve.md#tool-calls).
//!
//! `none` leaves the tools out of the prompt (the model is not told of them; anything it writes is
//! text). `required` and a named tool add one sentence to the last user turn asking for a call and
//! are checked on the reply (calls.rs): calls of other tools are given back as text. `auto` is the
//! plain format. Owns these rules. Must not do I/O or parse the model's output.

use crate::model::chat::{Conversation, Message};
use crate::model::tools::Json;

use super::error::ApiError;

/// What the client allows the model to do with its tools.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ToolChoice {
    #[default]
    Auto,
    None,
    Required,
    Named(String),
}

/// The tools of a request: names (to check calls) and each definition as the prompt writes it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Tools {
    pub names: Vec<String>,
    /// `{"name", "description", "parameters"}` in `json.dumps` form.
    pub schemas: Vec<String>,
    pub choice: ToolChoice,
}

impl Tools {
    /// Whether the reply is read for calls.
    pub fn parse_calls(&self) -> bool {
        !self.names.is_empty() && self.choice != ToolChoice::None
    }

    /// Whether a call of `name` is given back as a call (else as text).
    pub fn allows(&self, name: &str) -> bool {
        match &self.choice {
            ToolChoice::None => false,
            ToolChoice::Named(n) => n == name,
            _ => self.names.iter().any(|n| n == name),
        }
    }

    /// Put the tools into `conv` as the choice asks (see the module comment).
    pub fn apply(&self, conv: &mut Conversation) {
        if self.choice == ToolChoice::None {
            return;
        }
        conv.tools = self.schemas.clone();
        let ask = match &self.choice {
            ToolChoice::Required => "Answer with a call of one of the tools.".to_string(),
            ToolChoice::Named(n) => format!("Answer with a call of the tool `{n}`."),
            _ => return,
        };
        conv.messages.push(Message::user(ask));
    }
}

/// A tool name: 1 to 64 letters, digits, `_`, `-` or `.` (OpenAI's and Anthropic's rule), so it can
/// sit in the DSML `name="…"` attribute unescaped.
fn check_name(name: &str, field: &str) -> Result<(), ApiError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if ok {
        Ok(())
    } else {
        Err(ApiError::field(
            field,
            format!("\"{name}\" is not a tool name (1 to 64 of a-z A-Z 0-9 _ - .)"),
        ))
    }
}

/// A JSON Schema of parameters: an object, with `"type": "object"` when a type is given.
fn check_schema(schema: &Json, field: &str) -> Result<(), ApiError> {
    if !matches!(schema, Json::Object(_)) {
        return Err(ApiError::field(field, "must be a JSON Schema object"));
    }
    match schema.get("type") {
        None => Ok(()),
        Some(Json::Str(t)) if t == "object" => Ok(()),
        Some(_) => Err(ApiError::field(
            field,
            "must be a JSON Schema with \"type\": \"object\"",
        )),
    }
}

/// OpenAI's `tools`: `[{"type": "function", "function": {"name", "description"?, "parameters"?}}]`.
/// The function object goes into the prompt as given.
pub fn openai_tools(tools: Option<&Json>) -> Result<Tools, ApiError> {
    let mut out = Tools::default();
    for (i, t) in tool_objects(tools)?.iter().enumerate() {
        let at = |k: &str| format!("tools[{i}].{k}");
        match t.get("type").and_then(Json::as_str) {
            Some("function") => {}
            Some(other) => {
                return Err(ApiError::field(
                    at("type"),
                    format!("\"{other}\" is not supported (only \"function\")"),
                ));
            }
            None => return Err(ApiError::field(at("type"), "is required (\"function\")")),
        }
        let f = match t.get("function") {
            Some(f @ Json::Object(_)) => f,
            Some(_) => return Err(ApiError::field(at("function"), "must be an object")),
            None => return Err(ApiError::field(at("function"), "is required")),
        };
        let name = tool_name(f, &at("function.name"))?;
        if f.get("description")
            .is_some_and(|d| !matches!(d, Json::Str(_) | Json::Null))
        {
            return Err(ApiError::field(at("function.description"), "must be a string"));
        }
        if let Some(p) = f.get("parameters") {
            check_schema(p, &at("function.parameters"))?;
        }
        push_tool(&mut out, name, f.to_python(), &at("function.name"))?;
    }
    Ok(out)
}

/// Anthropic's `tools`: `[{"name", "description"?, "input_schema"}]`, written into the prompt as
/// the function object `{"name", "description", "parameters"}` the format expects.
pub fn anthropic_tools(tools: Option<&Json>) -> Result<Tools, ApiError> {
    let mut out = Tools::default();
    for (i, t) in tool_objects(tools)?.iter().enumerate() {
        let at = |k: &str| format!("tools[{i}].{k}");
        if let Some(kind) = t.get("type").and_then(Json::as_str)
            && kind != "custom"
        {
            return Err(ApiError::field(
                at("type"),
                format!("\"{kind}\" is not supported (server tools are not run here)"),
            ));
        }
        let name = tool_name(t, &at("name"))?;
        let schema = match t.get("input_schema") {
            Some(s) => s,
            None => return Err(ApiError::field(at("input_schema"), "is required")),
        };
        check_schema(schema, &at("input_schema"))?;
        let mut function = vec![("name".to_string(), Json::Str(name.to_string()))];
        match t.get("description") {
            Some(d @ Json::Str(_)) => function.push(("description".into(), d.clone())),
            None | Some(Json::Null) => {}
            Some(_) => return Err(ApiError::field(at("description"), "must be a string")),
        }
        function.push(("parameters".into(), schema.clone()));
        push_tool(&mut out, name, Json::Object(function).to_python(), &at("name"))?;
    }
    Ok(out)
}

/// The items of a `tools` field (none when it is absent or null), each an object.
fn tool_objects(tools: Option<&Json>) -> Result<&[Json], ApiError> {
    let items = match tools {
        None | Some(Json::Null) => return Ok(&[]),
        Some(Json::Array(items)) => items,
        Some(_) => return Err(ApiError::field("tools", "must be an array of tools")),
    };
    match items.iter().position(|t| !matches!(t, Json::Object(_))) {
        Some(i) => Err(ApiError::field(format!("tools[{i}]"), "must be an object")),
        None => Ok(items),
    }
}

/// The tool name of `object` (its `name`, reported as `field`): a string, and a valid name.
fn tool_name<'a>(object: &'a Json, field: &str) -> Result<&'a str, ApiError> {
    let name = match object.get("name") {
        Some(Json::Str(n)) => n,
        Some(_) => return Err(ApiError::field(field, "must be a string")),
        None => return Err(ApiError::field(field, "is required")),
    };
    check_name(name, field)?;
    Ok(name)
}

fn push_tool(out: &mut Tools, name: &str, schema: String, field: &str) -> Result<(), ApiError> {
    if out.names.iter().any(|n| n == name) {
        return Err(ApiError::field(field, format!("\"{name}\" is defined twice")));
    }
    out.names.push(name.to_string());
    out.schemas.push(schema);
    Ok(())
}

/// A named choice must name a defined tool, and a choice that asks for a call needs tools.
fn check_choice(choice: ToolChoice, tools: &Tools, field: &str) -> Result<ToolChoice, ApiError> {
    match &choice {
        ToolChoice::Named(n) if !tools.names.iter().any(|t| t == n) => {
            Err(ApiError::field(field, format!("\"{n}\" is not one of the tools given")))
        }
        ToolChoice::Required if tools.names.is_empty() => {
            Err(ApiError::field(field, "asks for a tool call, but no tools are given"))
        }
        _ => Ok(choice),
    }
}

/// OpenAI's `tool_choice`: "auto", "none", "required" or `{"type": "function", "function": {"name"}}`.
pub fn openai_choice(v: Option<&Json>, tools: &Tools) -> Result<ToolChoice, ApiError> {
    let choice = match v {
        None | Some(Json::Null) => ToolChoice::Auto,
        Some(Json::Str(s)) => match s.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            other => {
                return Err(ApiError::field(
                    "tool_choice",
                    format!("\"{other}\" is not one of auto, none, required or a named function"),
                ));
            }
        },
        Some(o @ Json::Object(_)) => match (
            o.get("type").and_then(Json::as_str),
            o.get("function").and_then(|f| f.get("name")).and_then(Json::as_str),
        ) {
            (Some("function"), Some(name)) => ToolChoice::Named(name.to_string()),
            _ => {
                return Err(ApiError::field(
                    "tool_choice",
                    "must be {\"type\": \"function\", \"function\": {\"name\": ...}}",
                ));
            }
        },
        Some(_) => return Err(ApiError::field("tool_choice", "must be a string or an object")),
    };
    check_choice(choice, tools, "tool_choice")
}

/// Anthropic's `tool_choice`: `{"type": "auto" | "any" | "none" | "tool", "name"?}`.
pub fn anthropic_choice(v: Option<&Json>, tools: &Tools) -> Result<ToolChoice, ApiError> {
    let choice = match v {
        None | Some(Json::Null) => ToolChoice::Auto,
        Some(o @ Json::Object(_)) => match o.get("type").and_then(Json::as_str) {
            Some("auto") => ToolChoice::Auto,
            Some("any") => ToolChoice::Required,
            Some("none") => ToolChoice::None,
            Some("tool") => match o.get("name").and_then(Json::as_str) {
                Some(n) => ToolChoice::Named(n.to_string()),
                None => {
                    return Err(ApiError::field(
                        "tool_choice.name",
                        "is required with \"type\": \"tool\"",
                    ));
                }
            },
            Some(other) => {
                return Err(ApiError::field(
                    "tool_choice.type",
                    format!("\"{other}\" is not one of auto, any, tool, none"),
                ));
            }
            None => return Err(ApiError::field("tool_choice.type", "is required")),
        },
        Some(_) => return Err(ApiError::field("tool_choice", "must be an object")),
    };
    check_choice(choice, tools, "tool_choice")
}

/// Arguments of a call in a request's history: a JSON object, as text or as the object itself.
pub fn call_arguments(v: Option<&Json>, field: &str) -> Result<String, ApiError> {
    match v {
        None | Some(Json::Null) => Ok("{}".into()),
        Some(Json::Str(s)) => match Json::parse(s) {
            Ok(Json::Object(_)) => Ok(s.clone()),
            _ => Err(ApiError::field(field, "must be the JSON text of an object")),
        },
        Some(o @ Json::Object(_)) => Ok(o.to_python()),
        Some(_) => Err(ApiError::field(field, "must be a JSON object")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Json {
        Json::parse(s).unwrap()
    }

    #[test]
    fn openai_tools_keep_the_function_object_in_order() {
        let t = openai_tools(Some(&parse(
            r#"[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}},"description":"d"}}]"#,
        )))
        .unwrap();
        assert_eq!(t.names, ["get_weather"]);
        assert_eq!(
            t.schemas[0],
            r#"{"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}, "description": "d"}"#
        );
    }

    #[test]
    fn bad_tools_and_choices_name_the_field() {
        let bad = |tools: &str| openai_tools(Some(&parse(tools))).unwrap_err().param.unwrap();
        assert_eq!(bad(r#"{"a":1}"#), "tools");
        assert_eq!(bad(r#"[{"type":"function"}]"#), "tools[0].function");
        assert_eq!(bad(r#"[{"type":"retrieval","function":{}}]"#), "tools[0].type");
        assert_eq!(
            bad(r#"[{"type":"function","function":{"name":"a b"}}]"#),
            "tools[0].function.name"
        );
        assert_eq!(
            bad(r#"[{"type":"function","function":{"name":"a","parameters":{"type":"string"}}}]"#),
            "tools[0].function.parameters"
        );
        assert_eq!(
            bad(r#"[{"type":"function","function":{"name":"a","parameters":[1]}}]"#),
            "tools[0].function.parameters"
        );
        assert_eq!(
            bad(r#"[{"type":"function","function":{"name":"a"}},{"type":"function","function":{"name":"a"}}]"#),
            "tools[1].function.name"
        );
        let tools = openai_tools(Some(&parse(r#"[{"type":"function","function":{"name":"a"}}]"#))).unwrap();
        assert_eq!(
            openai_choice(Some(&parse(r#""sometimes""#)), &tools)
                .unwrap_err()
                .param
                .as_deref(),
            Some("tool_choice")
        );
        assert!(openai_choice(Some(&parse(r#"{"type":"function","function":{"name":"b"}}"#)), &tools).is_err());
        assert_eq!(
            openai_choice(Some(&parse(r#"{"type":"function","function":{"name":"a"}}"#)), &tools).unwrap(),
            ToolChoice::Named("a".into())
        );
        assert!(openai_choice(Some(&parse(r#""required""#)), &Tools::default()).is_err());
        assert_eq!(
            anthropic_choice(Some(&parse(r#"{"type":"any"}"#)), &tools).unwrap(),
            ToolChoice::Required
        );
        assert!(anthropic_choice(Some(&parse(r#"{"type":"sometimes"}"#)), &tools).is_err());
    }

    #[test]
    fn anthropic_tools_become_function_objects() {
        let t = anthropic_tools(Some(&parse(
            r#"[{"name":"ls","input_schema":{"type":"object","properties":{}},"description":"list"}]"#,
        )))
        .unwrap();
        assert_eq!(
            t.schemas[0],
            r#"{"name": "ls", "description": "list", "parameters": {"type": "object", "properties": {}}}"#
        );
    }
}
