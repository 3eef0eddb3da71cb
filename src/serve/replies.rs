//! The server's memory of its own recent replies, so a follow-up request continues the cached
//! conversation. OpenAI clients send earlier assistant turns back as `content` only, dropping the
//! `reasoning_content` they were streamed; the engine's live transcript keeps the reasoning tokens
//! it sampled, and a message without them would not match it, so the whole prompt would be
//! evaluated again. An assistant message that arrives without reasoning and whose text and tool
//! calls are those of one of our recent answers gets that answer's reasoning back before the turn
//! is submitted.
//!
//! Owns the remembered (answer, reasoning) pairs. Must not touch the engine.

use std::collections::VecDeque;

use crate::model::chat::{Message, Role};
use crate::model::tools::ToolCall;

/// Replies remembered (text only, so cheap).
const REMEMBERED: usize = 64;

#[derive(Default)]
pub struct Replies {
    /// (answer, calls, reasoning) of recent thinking turns, oldest first.
    recent: VecDeque<(String, Vec<ToolCall>, String)>,
}

impl Replies {
    /// Remember a reply that had reasoning.
    pub fn remember(&mut self, answer: &str, calls: &[ToolCall], reasoning: &str) {
        if self.recent.len() == REMEMBERED {
            self.recent.pop_front();
        }
        self.recent
            .push_back((answer.trim().to_string(), calls.to_vec(), reasoning.to_string()));
    }

    /// Give assistant messages without reasoning the reasoning of the newest matching reply.
    pub fn restore_reasoning(&self, messages: &mut [Message]) {
        for m in messages
            .iter_mut()
            .filter(|m| m.role == Role::Assistant && m.reasoning.is_none())
        {
            let text = m.content.trim();
            let same_calls = |calls: &[ToolCall]| {
                calls.len() == m.tool_calls.len() && calls.iter().zip(&m.tool_calls).all(|(a, b)| a.same_call(b))
            };
            if let Some((_, _, r)) = self
                .recent
                .iter()
                .rev()
                .find(|(a, calls, _)| a == text && same_calls(calls))
            {
                m.reasoning = Some(r.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasoning_is_restored_only_where_missing_and_matching() {
        let mut r = Replies::default();
        r.remember("The answer.", &[], "thought");
        let call = ToolCall {
            id: "x".into(),
            name: "f".into(),
            arguments: "{}".into(),
        };
        r.remember("", std::slice::from_ref(&call), "called");
        let mut msgs = vec![
            Message::user("q"),
            Message::assistant(" The answer.\n", None),
            Message::assistant("other", None),
            Message::assistant("The answer.", Some("kept".into())),
            Message::assistant_calls(
                "",
                None,
                vec![ToolCall {
                    id: "y".into(),
                    ..call.clone()
                }],
            ),
            Message::assistant("", None),
        ];
        r.restore_reasoning(&mut msgs);
        assert_eq!(msgs[4].reasoning.as_deref(), Some("called"));
        assert_eq!(msgs[5].reasoning, None);
        assert_eq!(msgs[1].reasoning.as_deref(), Some("thought"));
        assert_eq!(msgs[2].reasoning, None);
        assert_eq!(msgs[3].reasoning.as_deref(), Some("kept"));
    }
}
