//! Tool calls in DeepSeek V4's prompt format (docs/prompt.md#tool-calls): the tool block of the
//! system part, the DSML text of an assistant's calls, and the JSON text both are made of.
//!
//! The official encoding writes JSON with Python's `json.dumps` (keys in the order given, `", "` and
//! `": "` separators, non-ASCII kept), so [`Json`] keeps object keys in document order (serde_json's
//! own `Value` sorts them) and [`Json::to_python`] writes that exact text. Owns these texts only;
//! where they go in a conversation is `chat`, reading calls back from the model is `dsml`. Must not
//! tokenize or touch the engine.

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::{Serialize, Serializer};

/// The marker of DeepSeek's tool markup (an added token of the vocabulary).
pub const DSML: &str = "｜DSML｜";
/// Opens and closes the block of an assistant's calls.
pub const CALLS_START: &str = "<｜DSML｜tool_calls>";
pub const CALLS_END: &str = "</｜DSML｜tool_calls>";
pub const INVOKE_START: &str = "<｜DSML｜invoke name=\"";
pub const INVOKE_END: &str = "</｜DSML｜invoke>";
pub const PARAM_START: &str = "<｜DSML｜parameter name=\"";
pub const PARAM_END: &str = "</｜DSML｜parameter>";

/// A JSON value whose objects keep their keys in document order.
#[derive(Clone, Debug, PartialEq)]
pub enum Json {
    Null,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    Str(String),
    Array(Vec<Json>),
    Object(Vec<(String, Json)>),
}

impl Json {
    /// Parse JSON text; errors are one line.
    pub fn parse(text: &str) -> Result<Json, String> {
        serde_json::from_str(text).map_err(|e| e.to_string().replace('\n', " "))
    }

    /// The value of `key` in an object.
    pub fn get(&self, key: &str) -> Option<&Json> {
        match self {
            Json::Object(fields) => fields.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Json::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The text Python's `json.dumps(value, ensure_ascii=False)` writes.
    pub fn to_python(&self) -> String {
        let mut out = String::new();
        self.write_python(&mut out);
        out
    }

    fn write_python(&self, out: &mut String) {
        match self {
            Json::Null => out.push_str("null"),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Int(i) => out.push_str(&i.to_string()),
            Json::UInt(u) => out.push_str(&u.to_string()),
            Json::Float(f) => out.push_str(&python_float(*f)),
            Json::Str(s) => python_string(s, out),
            Json::Array(items) => {
                out.push('[');
                for (i, v) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    v.write_python(out);
                }
                out.push(']');
            }
            Json::Object(fields) => {
                out.push('{');
                for (i, (k, v)) in fields.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    python_string(k, out);
                    out.push_str(": ");
                    v.write_python(out);
                }
                out.push('}');
            }
        }
    }

    /// The same value as serde_json's (key order lost), for comparing two values.
    pub fn to_value(&self) -> serde_json::Value {
        serde_json::from_str(&self.to_python()).unwrap_or(serde_json::Value::Null)
    }
}

/// A JSON string as `json.dumps(..., ensure_ascii=False)` escapes it.
fn python_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `repr` of a float: the shortest digits that read back, positional when the decimal
/// exponent is in -4..16, else `d.ddde±XX`; a whole number keeps `.0`.
fn python_float(f: f64) -> String {
    if !f.is_finite() {
        return if f.is_nan() {
            "NaN".into()
        } else if f > 0.0 {
            "Infinity".into()
        } else {
            "-Infinity".into()
        };
    }
    let sci = format!("{:e}", f.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| c.is_ascii_digit()).collect();
    let sign = if f.is_sign_negative() { "-" } else { "" };
    // Position of the decimal point after the first digit: value = 0.DIGITS × 10^point.
    let point = exp + 1;
    let body = if point > -4 && point <= 16 {
        if point <= 0 {
            format!("0.{}{digits}", "0".repeat((-point) as usize))
        } else if (point as usize) >= digits.len() {
            format!("{digits}{}.0", "0".repeat(point as usize - digits.len()))
        } else {
            format!("{}.{}", &digits[..point as usize], &digits[point as usize..])
        }
    } else {
        let rest = if digits.len() > 1 {
            format!(".{}", &digits[1..])
        } else {
            String::new()
        };
        let e = point - 1;
        format!("{}{rest}e{}{:02}", &digits[..1], if e < 0 { '-' } else { '+' }, e.abs())
    };
    format!("{sign}{body}")
}

impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Json, D::Error> {
        d.deserialize_any(JsonVisitor)
    }
}

struct JsonVisitor;

impl<'de> Visitor<'de> for JsonVisitor {
    type Value = Json;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_unit<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }
    fn visit_none<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }
    fn visit_bool<E>(self, b: bool) -> Result<Json, E> {
        Ok(Json::Bool(b))
    }
    fn visit_i64<E>(self, i: i64) -> Result<Json, E> {
        Ok(Json::Int(i))
    }
    fn visit_u64<E>(self, u: u64) -> Result<Json, E> {
        Ok(match i64::try_from(u) {
            Ok(i) => Json::Int(i),
            Err(_) => Json::UInt(u),
        })
    }
    fn visit_f64<E>(self, f: f64) -> Result<Json, E> {
        Ok(Json::Float(f))
    }
    fn visit_str<E>(self, s: &str) -> Result<Json, E> {
        Ok(Json::Str(s.to_string()))
    }
    fn visit_string<E>(self, s: String) -> Result<Json, E> {
        Ok(Json::Str(s))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json, A::Error> {
        let mut items = Vec::new();
        while let Some(v) = seq.next_element()? {
            items.push(v);
        }
        Ok(Json::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Json, A::Error> {
        let mut fields: Vec<(String, Json)> = Vec::new();
        while let Some((k, v)) = map.next_entry::<String, Json>()? {
            // A repeated key keeps its first place and its last value, as Python's dict does.
            match fields.iter_mut().find(|(key, _)| *key == k) {
                Some(slot) => slot.1 = v,
                None => fields.push((k, v)),
            }
        }
        Ok(Json::Object(fields))
    }
}

impl Serialize for Json {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.to_value().serialize(s)
    }
}

/// One call of a tool by the assistant: `arguments` is the JSON text of an object.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ToolCall {
    /// The API's id of the call (not part of the prompt).
    #[serde(default)]
    pub id: String,
    pub name: String,
    pub arguments: String,
}

impl ToolCall {
    /// The same call: same name and equal argument values (ids and JSON spacing aside).
    pub fn same_call(&self, other: &ToolCall) -> bool {
        let value = |a: &str| serde_json::from_str::<serde_json::Value>(a).ok();
        self.name == other.name
            && match (value(&self.arguments), value(&other.arguments)) {
                (Some(a), Some(b)) => a == b,
                _ => self.arguments == other.arguments,
            }
    }
}

/// The tool part of the system prompt for tools whose definitions (`{"name", "description",
/// "parameters"}`, in the client's key order) are `schemas`, one `json.dumps` line each.
pub fn tools_block(schemas: &[String]) -> String {
    format!(
        "## Tools\n\n\
You have access to a set of tools to help answer the user's question. You can invoke tools by writing a \"<{DSML}tool_calls>\" block like the following:\n\n\
<{DSML}tool_calls>\n\
<{DSML}invoke name=\"$TOOL_NAME\">\n\
<{DSML}parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</{DSML}parameter>\n\
...\n\
</{DSML}invoke>\n\
<{DSML}invoke name=\"$TOOL_NAME2\">\n\
...\n\
</{DSML}invoke>\n\
</{DSML}tool_calls>\n\n\
String parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n\
If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside <think>...</think> BEFORE any tool calls or final response.\n\n\
Otherwise, output directly after </think> with tool calls or final response.\n\n\
### Available Tool Schemas\n\n\
{}\n\n\
You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n",
        schemas.join("\n")
    )
}

/// The parameters of one call: each argument on its own line, a string raw with `string="true"`,
/// any other value as JSON with `string="false"`. Arguments that are not a JSON object become one
/// string parameter named `arguments` (the official encoding's fallback).
fn parameters(arguments: &str) -> String {
    let fields = match Json::parse(arguments) {
        Ok(Json::Object(fields)) => fields,
        _ => vec![("arguments".to_string(), Json::Str(arguments.to_string()))],
    };
    let lines: Vec<String> = fields
        .iter()
        .map(|(k, v)| {
            let (is_str, value) = match v {
                Json::Str(s) => ("true", s.clone()),
                other => ("false", other.to_python()),
            };
            format!("{PARAM_START}{k}\" string=\"{is_str}\">{value}{PARAM_END}")
        })
        .collect();
    lines.join("\n")
}

/// The DSML text of an assistant's calls, blank line first (it follows the message text).
pub fn calls_block(calls: &[ToolCall]) -> String {
    if calls.is_empty() {
        return String::new();
    }
    let invokes: Vec<String> = calls
        .iter()
        .map(|c| {
            format!(
                "{INVOKE_START}{}\">\n{}\n{INVOKE_END}",
                c.name,
                parameters(&c.arguments)
            )
        })
        .collect();
    format!("\n\n{CALLS_START}\n{}\n{CALLS_END}", invokes.join("\n"))
}

/// A tool's result as the user turn holds it.
pub fn tool_result(content: &str) -> String {
    format!("<tool_result>{content}</tool_result>")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_dumps_keeps_order_spacing_and_unicode() {
        let j = Json::parse(r#"{"b":1,"a":[true,null,"x\"y\n\u0001é"],"c":{"z":1.5,"y":-0.0}}"#).unwrap();
        assert_eq!(
            j.to_python(),
            r#"{"b": 1, "a": [true, null, "x\"y\n\u0001é"], "c": {"z": 1.5, "y": -0.0}}"#
        );
        assert_eq!(
            Json::parse(r#"{"a":1,"b":2,"a":3}"#).unwrap().to_python(),
            r#"{"a": 3, "b": 2}"#
        );
    }

    #[test]
    fn floats_print_as_python_repr() {
        for (f, s) in [
            (1.0, "1.0"),
            (0.5, "0.5"),
            (100.0, "100.0"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.5e-7, "1.5e-07"),
            (-2.25, "-2.25"),
            (123456.789, "123456.789"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
        ] {
            assert_eq!(python_float(f), s, "{f}");
        }
    }

    #[test]
    fn calls_render_parameters_by_type() {
        let calls = [
            ToolCall {
                id: "a".into(),
                name: "get".into(),
                arguments: r#"{"city":"Paris","days":3,"opts":{"u":"c"}}"#.into(),
            },
            ToolCall {
                id: "b".into(),
                name: "raw".into(),
                arguments: "not json".into(),
            },
        ];
        assert_eq!(
            calls_block(&calls),
            "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get\">\n\
<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n\
<｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n\
<｜DSML｜parameter name=\"opts\" string=\"false\">{\"u\": \"c\"}</｜DSML｜parameter>\n</｜DSML｜invoke>\n\
<｜DSML｜invoke name=\"raw\">\n<｜DSML｜parameter name=\"arguments\" string=\"true\">not json</｜DSML｜parameter>\n\
</｜DSML｜invoke>\n</｜DSML｜tool_calls>"
        );
        assert!(calls[0].same_call(&ToolCall {
            id: "other".into(),
            name: "get".into(),
            arguments: r#"{"days": 3, "opts": {"u": "c"}, "city": "Paris"}"#.into(),
        }));
    }
}
