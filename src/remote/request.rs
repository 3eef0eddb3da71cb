//! The body of `POST /v1/chat/completions` for one turn: the conversation, streaming with usage,
//! the sampling settings and the think mode.
//!
//! Owns the mapping of a `TurnRequest` onto the fields the servers read. The think mode goes into
//! `chat_template_kwargs` (`thinking`, `reasoning_effort`), where vLLM's and SGLang's DeepSeek V4
//! templates and `ds4-chat serve` read it. `top_k` and `min_p` are extensions vLLM, SGLang and
//! llama-server accept; `top_k` 0 (off) is left out. Earlier answers go back without their
//! reasoning (DeepSeek's template drops it too).

use serde_json::{Value, json};

use crate::engine::events::TurnRequest;
use crate::model::chat::{Role, ThinkMode};

pub fn body(model: &str, req: &TurnRequest) -> Value {
    let messages: Vec<Value> = req
        .conversation
        .messages
        .iter()
        .map(|m| {
            let role = match m.role {
                Role::System => "system",
                Role::User => "user",
                Role::Assistant => "assistant",
            };
            json!({ "role": role, "content": m.content })
        })
        .collect();
    let kwargs = match req.think {
        ThinkMode::Off => json!({ "thinking": false }),
        ThinkMode::High => json!({ "thinking": true, "reasoning_effort": "high" }),
        ThinkMode::Max => json!({ "thinking": true, "reasoning_effort": "max" }),
    };
    let s = &req.sampling;
    let mut body = json!({
        "model": model,
        "messages": messages,
        "stream": true,
        "stream_options": { "include_usage": true },
        "max_tokens": req.max_tokens,
        "temperature": s.temperature,
        "top_p": s.top_p,
        "min_p": s.min_p,
        "chat_template_kwargs": kwargs,
    });
    if s.top_k > 0 {
        body["top_k"] = json!(s.top_k);
    }
    if let Some(seed) = s.seed {
        body["seed"] = json!(seed);
    }
    body
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::chat::Message;

    fn msg(role: Role, content: &str, reasoning: Option<&str>) -> Message {
        Message {
            role,
            ..Message::assistant(content, reasoning.map(str::to_string))
        }
    }

    #[test]
    fn conversation_sampling_and_think_mode() {
        let mut req = TurnRequest::greedy(
            vec![
                msg(Role::System, "Be brief.", None),
                msg(Role::User, "Hi", None),
                msg(Role::Assistant, "Hello!", Some("greet back")),
                msg(Role::User, "Why is the sky blue?", None),
            ],
            ThinkMode::Max,
            64,
        );
        req.sampling.seed = Some(9);
        let b = body("m1", &req);
        assert_eq!(b["model"], "m1");
        assert_eq!(b["stream"], true);
        assert_eq!(b["stream_options"]["include_usage"], true);
        assert_eq!(b["max_tokens"], 64);
        assert_eq!(b["temperature"], 0.0);
        assert_eq!(b["seed"], 9);
        assert!(b.get("top_k").is_none(), "top_k 0 is left out");
        assert_eq!(
            b["chat_template_kwargs"],
            json!({"thinking": true, "reasoning_effort": "max"})
        );
        let roles: Vec<&str> = b["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["role"].as_str().unwrap())
            .collect();
        assert_eq!(roles, ["system", "user", "assistant", "user"]);
        assert_eq!(b["messages"][2], json!({"role": "assistant", "content": "Hello!"}));

        req.think = ThinkMode::Off;
        req.sampling.top_k = 40;
        req.sampling.seed = None;
        let b = body("m1", &req);
        assert_eq!(b["chat_template_kwargs"], json!({"thinking": false}));
        assert_eq!(b["top_k"], 40);
        assert!(b.get("seed").is_none());
    }
}
