//! A conversation as a file: pretty JSON (the `Conversation` type, read back by serde) or a
//! markdown document, chosen by the file's extension.
//!
//! Owns the two formats only; writing the file is the run loop's (`tui::effect`).

use std::path::Path;

use crate::model::chat::{Conversation, Role};

/// The file contents for `path`: markdown for `.md` / `.markdown`, JSON for anything else.
pub fn render(conv: &Conversation, path: &Path) -> Result<String, String> {
    let is_md = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("md") || e.eq_ignore_ascii_case("markdown"));
    if is_md {
        Ok(conversation_markdown(conv))
    } else {
        serde_json::to_string_pretty(conv)
            .map(|s| s + "\n")
            .map_err(|e| e.to_string())
    }
}

/// A conversation as a markdown document.
pub fn conversation_markdown(conv: &Conversation) -> String {
    let mut s = String::from("# ds4-chat conversation\n");
    for m in &conv.messages {
        let who = match m.role {
            Role::System => "System",
            Role::User => "User",
            Role::Assistant => "Assistant",
        };
        s.push_str(&format!("\n## {who}\n\n"));
        if let Some(r) = &m.reasoning {
            for l in r.lines() {
                s.push_str(&format!("> {l}\n"));
            }
            s.push('\n');
        }
        s.push_str(m.content.trim_end());
        s.push('\n');
    }
    s
}
