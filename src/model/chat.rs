//! Chat conversation type and rendering to the exact DS4 prompt bytes and ids (spec §6).
//!
//! Owns the conversation model and the two rendering forms (from scratch, §6.2; live append, §6.3).
//! Must not touch sessions or backends.

use serde::{Deserialize, Serialize};

/// Reasoning mode of a turn (spec §6.1): off renders `</think>`, high and max render `<think>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum ThinkMode {
    Off,
    #[default]
    High,
    /// Honoured only when ctx >= 393216; otherwise it becomes High.
    Max,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    System,
    User,
    Assistant,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    pub role: Role,
    pub content: String,
    /// Reasoning text of an assistant turn (without the tags).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
}

/// A whole chat: system prompt and alternating turns.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Conversation {
    pub messages: Vec<Message>,
}
