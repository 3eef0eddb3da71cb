//! Chat conversation type and rendering to the exact DS4 prompt bytes and ids (docs/prompt.md).
//!
//! Owns the conversation model and the three rendering forms: the one-shot CLI prompt
//! (docs/prompt.md#one-shot-prompt, `run`), the from-scratch multi-turn prompt of the ds4 API server
//! (docs/prompt.md#server-prompt) and the live token transcript of the ds4 CLI REPL
//! (docs/prompt.md#live-transcript), which only ever appends so a cached session never re-prefills. Must not
//! touch sessions or backends.
//!
//! Text → ids: the server form renders text and tokenizes it with added-token recognition
//! ([`Tokenizer::encode`], the official tokenizer's behaviour; ds4 itself recognizes only the seven role
//! strings of docs/prompt.md#special-tokens there). The CLI forms tokenize each piece as plain text
//! ([`Tokenizer::encode_plain`], ds4's `bpe_tokenize_text`) and push the role ids directly, so a user typing
//! `<think>` cannot inject a control token.

use serde::{Deserialize, Serialize};

use super::checkpoint::Generation;
use super::tokenizer::{ASSISTANT_STR, BOS_STR, EOS_STR, THINK_END_STR, THINK_START_STR, Tokenizer, USER_STR};
use super::tools::{ToolCall, calls_block, tool_result, tools_block};

/// Reasoning mode of a turn (docs/prompt.md#think-modes): off renders `</think>`, high and max render `<think>`; the
/// text after BOS depends on the checkpoint generation ([`ThinkMode::effort_prefix`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum ThinkMode {
    Off,
    #[default]
    High,
    /// Honoured only when ctx >= 393216; otherwise it becomes High.
    Max,
}

/// Smallest context for which Think Max is honoured (ds4: 384K tokens).
pub const THINK_MAX_MIN_CTX: u32 = 393_216;

/// The "Absolute maximum" reasoning-effort text inserted right after BOS (docs/prompt.md#think-modes, exact bytes):
/// Think Max on preview files, Think High on 0731 files.
pub const THINK_MAX_PREFIX: &str = concat!(
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n",
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root ",
    "cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial ",
    "scenarios.\n",
    "Explicitly write out your entire deliberation process, documenting every intermediate step, considered ",
    "alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n"
);

/// The "Beyond maximum" reasoning-effort text of the 0731 chat template, Think Max on 0731 files
/// (exact bytes; the dash is U+2014 EM DASH).
pub const THINK_MAX_PREFIX_0731: &str = concat!(
    "Reasoning Effort: Beyond maximum \u{2014} exhaustive, relentless, and uncompromising.\n",
    "You MUST reason with the utmost depth and rigor, leaving absolutely nothing to chance: exhaustively ",
    "decompose the problem into its most fundamental components, trace every causal chain to its root, and ",
    "resolve the underlying cause rather than any surface symptom.\n",
    "Do not stop reasoning until you have independently verified the solution from multiple angles and are ",
    "certain that no assumption remains unchecked and no error remains undiscovered.\n\n"
);

/// System prompt of the one-shot CLI when none is given (no final period, as in ds4).
pub const DEFAULT_SYSTEM_PROMPT: &str = "You are a helpful assistant";

impl ThinkMode {
    /// The mode actually used with a context of `ctx` tokens: Max below [`THINK_MAX_MIN_CTX`] becomes
    /// High (ds4_think_mode_for_context).
    pub fn for_context(self, ctx: u32) -> ThinkMode {
        if self == ThinkMode::Max && ctx < THINK_MAX_MIN_CTX {
            ThinkMode::High
        } else {
            self
        }
    }

    /// The reasoning-effort text this (already effective) mode puts right after BOS with the chat
    /// template of `generation`: preview files only have one for Max; 0731 files have the
    /// "Absolute maximum" one for High and the "Beyond maximum" one for Max. Off has none.
    pub fn effort_prefix(self, generation: Generation) -> &'static str {
        match (generation, self) {
            (_, ThinkMode::Off) | (Generation::Preview, ThinkMode::High) => "",
            (Generation::Preview, ThinkMode::Max) | (Generation::V0731, ThinkMode::High) => THINK_MAX_PREFIX,
            (Generation::V0731, ThinkMode::Max) => THINK_MAX_PREFIX_0731,
        }
    }

    /// Whether the assistant turn opens with `<think>`.
    pub fn thinking(self) -> bool {
        self != ThinkMode::Off
    }

    fn tag(self) -> &'static str {
        if self.thinking() {
            THINK_START_STR
        } else {
            THINK_END_STR
        }
    }

    fn tag_id(self, tok: &Tokenizer) -> u32 {
        let s = tok.specials();
        if self.thinking() { s.think_start } else { s.think_end }
    }
}

/// Serialized as OpenAI's lowercase role names; the capitalized names of older files still read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    #[serde(alias = "System")]
    System,
    #[serde(alias = "User")]
    User,
    #[serde(alias = "Assistant")]
    Assistant,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    pub role: Role,
    pub content: String,
    /// Reasoning text of an assistant turn (without the tags).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
    /// The tools an assistant turn called, after its text (docs/prompt.md#tool-calls).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// Set on a user-role message that is a tool's result: the id of the call it answers. The
    /// format has no tool role; results are part of the user turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl Message {
    fn plain(role: Role, content: String, reasoning: Option<String>) -> Message {
        Message {
            role,
            content,
            reasoning,
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }

    pub fn system(content: impl Into<String>) -> Message {
        Message::plain(Role::System, content.into(), None)
    }

    pub fn user(content: impl Into<String>) -> Message {
        Message::plain(Role::User, content.into(), None)
    }

    pub fn assistant(content: impl Into<String>, reasoning: Option<String>) -> Message {
        Message::plain(Role::Assistant, content.into(), reasoning)
    }

    /// An assistant turn that calls tools after its text.
    pub fn assistant_calls(content: impl Into<String>, reasoning: Option<String>, calls: Vec<ToolCall>) -> Message {
        Message {
            tool_calls: calls,
            ..Message::assistant(content, reasoning)
        }
    }

    /// A tool's result for the call `id`.
    pub fn tool_result(id: impl Into<String>, content: impl Into<String>) -> Message {
        Message {
            tool_call_id: Some(id.into()),
            ..Message::user(content)
        }
    }

    pub fn is_tool_result(&self) -> bool {
        self.tool_call_id.is_some()
    }
}

/// One turn of the rendered conversation (system messages aside).
#[derive(Clone, Debug, PartialEq)]
pub enum Turn<'a> {
    /// The text after `<｜User｜>`: one user message, or (with tools in play) a run of user
    /// messages and tool results joined by blank lines.
    User(String),
    Assistant(&'a Message),
}

/// A whole chat: system prompt and alternating turns, and the tools the assistant may call.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Conversation {
    pub messages: Vec<Message>,
    /// Each tool's definition (`{"name", "description", "parameters"}`) as Python's `json.dumps`
    /// writes it (`tools::Json::to_python`), in the order given.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<String>,
}

/// A prompt ready to prefill.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RenderedPrompt {
    /// The prompt as text (what the ids spell, role markers included).
    pub text: String,
    pub ids: Vec<u32>,
    /// The think mode actually used (Max may have become High, docs/prompt.md#think-modes).
    pub think: ThinkMode,
}

impl Conversation {
    pub fn new() -> Conversation {
        Conversation::default()
    }

    pub fn push(&mut self, m: Message) -> &mut Self {
        self.messages.push(m);
        self
    }

    /// Whether tools are in play: tools are given or the history holds calls or results. Then runs
    /// of user messages and results share one user turn, as in DeepSeek's encoding.
    pub fn tool_context(&self) -> bool {
        !self.tools.is_empty()
            || self
                .messages
                .iter()
                .any(|m| !m.tool_calls.is_empty() || m.is_tool_result())
    }

    /// The system part after BOS and the effort text: the system messages joined by blank lines,
    /// then, when tools are given, a blank line and the tool block (docs/prompt.md#tool-calls).
    pub fn system_text(&self) -> String {
        let system: Vec<&str> = self
            .messages
            .iter()
            .filter(|m| m.role == Role::System)
            .map(|m| m.content.as_str())
            .collect();
        let mut text = system.join("\n\n");
        if !self.tools.is_empty() {
            text.push_str("\n\n");
            text.push_str(&tools_block(&self.tools));
        }
        text
    }

    /// The turns of the conversation (system messages left out).
    pub fn turns(&self) -> Vec<Turn<'_>> {
        turns(&self.messages, self.tool_context())
            .into_iter()
            .map(|(_, t)| t)
            .collect()
    }

    /// The server-form prompt text (docs/prompt.md#server-prompt) for an already effective think
    /// mode and the chat template of `generation`: BOS, [effort text], the system part, then the
    /// turns. An assistant turn directly after a user turn opens with `<｜Assistant｜>` and, when
    /// thinking and tools are given or it is the last assistant turn after the last user turn, its
    /// reasoning inside `<think>…</think>`; otherwise earlier reasoning is dropped (`</think>` only).
    /// Then its text, its calls in DSML and EOS. A conversation ending on a user turn ends with
    /// `<｜Assistant｜>` and the think tag.
    pub fn render_text(&self, think: ThinkMode, generation: Generation) -> String {
        let mut out = String::from(BOS_STR);
        out.push_str(think.effort_prefix(generation));
        out.push_str(&self.system_text());
        let keep_reasoning = !self.tools.is_empty();
        let turns = self.turns();
        let last_user = turns.iter().rposition(|t| matches!(t, Turn::User(_)));
        let mut pending_assistant = false;
        for (i, turn) in turns.iter().enumerate() {
            match turn {
                Turn::User(text) => {
                    out.push_str(USER_STR);
                    out.push_str(text);
                    pending_assistant = true;
                }
                Turn::Assistant(m) => {
                    if pending_assistant {
                        out.push_str(ASSISTANT_STR);
                        if think.thinking() && (keep_reasoning || last_user.is_none_or(|u| i > u)) {
                            out.push_str(THINK_START_STR);
                            out.push_str(m.reasoning.as_deref().unwrap_or(""));
                            out.push_str(THINK_END_STR);
                        } else {
                            out.push_str(THINK_END_STR);
                        }
                    }
                    out.push_str(&m.content);
                    out.push_str(&calls_block(&m.tool_calls));
                    out.push_str(EOS_STR);
                    pending_assistant = false;
                }
            }
        }
        if pending_assistant {
            out.push_str(ASSISTANT_STR);
            out.push_str(think.tag());
        }
        out
    }

    /// Render from scratch (docs/prompt.md#server-prompt) with the mode the context allows and the chat template of
    /// the tokenizer's file, tokenized with added-token recognition.
    pub fn render(&self, tok: &Tokenizer, requested: ThinkMode, ctx: u32) -> RenderedPrompt {
        let think = requested.for_context(ctx);
        let text = self.render_text(think, tok.generation());
        let ids = tok.encode(&text);
        RenderedPrompt { text, ids, think }
    }
}

/// The turns of `messages` (system messages left out), each with the index of its first message.
/// With `tool_context`, a run of user messages
/// and tool results is one user turn: the texts joined by blank lines, each result as
/// `<tool_result>…</tool_result>`, the results in the order of the calls of the last assistant turn
/// that made calls (by id; unknown ids first, keeping their order), as DeepSeek's encoding does.
pub fn turns(messages: &[Message], tool_context: bool) -> Vec<(usize, Turn<'_>)> {
    let mut out = Vec::new();
    let mut call_order: Vec<&str> = Vec::new();
    let mut run: Vec<&Message> = Vec::new();
    let mut run_start = 0;
    let flush = |run: &mut Vec<&Message>, out: &mut Vec<(usize, Turn<'_>)>, order: &[&str], start: usize| {
        if run.is_empty() {
            return;
        }
        let rank = |m: &Message| {
            let id = m.tool_call_id.as_deref().unwrap_or("");
            order.iter().position(|c| *c == id).unwrap_or(0)
        };
        let mut results: Vec<&Message> = run.iter().copied().filter(|m| m.is_tool_result()).collect();
        if results.len() > 1 && !order.is_empty() {
            results.sort_by_key(|m| rank(m));
        }
        let mut results = results.into_iter();
        let parts: Vec<String> = run
            .iter()
            .map(|m| match m.is_tool_result() {
                true => tool_result(results.next().map_or("", |r| r.content.as_str())),
                false => m.content.clone(),
            })
            .collect();
        out.push((start, Turn::User(parts.join("\n\n"))));
        run.clear();
    };
    for (i, m) in messages.iter().enumerate() {
        match m.role {
            Role::System => {}
            Role::User if tool_context => {
                if run.is_empty() {
                    run_start = i;
                }
                run.push(m);
            }
            Role::User => out.push((i, Turn::User(m.content.clone()))),
            Role::Assistant => {
                flush(&mut run, &mut out, &call_order, run_start);
                if !m.tool_calls.is_empty() {
                    call_order = m
                        .tool_calls
                        .iter()
                        .map(|c| c.id.as_str())
                        .filter(|id| !id.is_empty())
                        .collect();
                }
                out.push((i, Turn::Assistant(m)));
            }
        }
    }
    flush(&mut run, &mut out, &call_order, run_start);
    out
}

/// The one-shot CLI prompt (docs/prompt.md#one-shot-prompt, ds4_cli.c build_prompt): BOS, [effort text], [system],
/// `<｜User｜>`, prompt, `<｜Assistant｜>`, think tag, each text piece tokenized on its own as plain text.
/// A prompt that starts with the BOS string is taken as fully rendered and tokenized with added-token
/// recognition (its think mode is then whatever it spells; `think` reports the requested one).
pub fn one_shot_prompt(tok: &Tokenizer, system: &str, prompt: &str, requested: ThinkMode, ctx: u32) -> RenderedPrompt {
    let think = requested.for_context(ctx);
    if prompt.starts_with(BOS_STR) {
        return RenderedPrompt {
            text: prompt.to_string(),
            ids: tok.encode(prompt),
            think,
        };
    }
    let s = tok.specials();
    let mut text = String::from(BOS_STR);
    let mut ids = vec![s.bos];
    let effort = think.effort_prefix(tok.generation());
    if !effort.is_empty() {
        text.push_str(effort);
        ids.extend(tok.encode_plain(effort));
    }
    if !system.is_empty() {
        text.push_str(system);
        ids.extend(tok.encode_plain(system));
    }
    text.push_str(USER_STR);
    ids.push(s.user);
    text.push_str(prompt);
    ids.extend(tok.encode_plain(prompt));
    text.push_str(ASSISTANT_STR);
    ids.push(s.assistant);
    text.push_str(think.tag());
    ids.push(think.tag_id(tok));
    RenderedPrompt { text, ids, think }
}

/// What [`Transcript::begin_turn`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TurnStart {
    /// The think mode actually used.
    pub think: ThinkMode,
    /// Tokens before this index are unchanged from before the call (a cached session may keep them);
    /// it is smaller than the old length only when the effort text after BOS changed.
    pub first_changed: usize,
}

/// The live token transcript of a chat (docs/prompt.md#live-transcript, ds4 CLI REPL): BOS, [effort text], [system];
/// then per turn `<｜User｜>` + user text + `<｜Assistant｜>` + think tag, every sampled token (reasoning
/// included, never re-rendered) and EOS. It only grows, except that a think mode with another effort
/// text replaces the one after BOS (which invalidates the cache from position 1) and an
/// interrupted turn that produced nothing is rolled back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transcript {
    ids: Vec<u32>,
    /// The effort text right after BOS ("" when absent) and its token count.
    effort: &'static str,
    effort_len: usize,
    /// Length before the open turn's user tokens (None when no turn is open).
    open_turn: Option<usize>,
    /// Tokens sampled in the open turn.
    generated: usize,
}

impl Transcript {
    /// BOS, then the effort text of `requested` as honoured at `ctx`, then the system text (if any).
    pub fn new(tok: &Tokenizer, system: &str, requested: ThinkMode, ctx: u32) -> Transcript {
        let mut t = Transcript {
            ids: vec![tok.specials().bos],
            effort: "",
            effort_len: 0,
            open_turn: None,
            generated: 0,
        };
        t.set_effort(tok, requested.for_context(ctx));
        if !system.is_empty() {
            t.ids.extend(tok.encode_plain(system));
        }
        t
    }

    /// As [`Transcript::new`], with the system text tokenized with added-token recognition (a
    /// system part holding the tool block, whose DSML markers are added tokens).
    pub fn new_encoded(tok: &Tokenizer, system: &str, requested: ThinkMode, ctx: u32) -> Transcript {
        let mut t = Transcript::new(tok, "", requested, ctx);
        t.ids.extend(tok.encode(system));
        t
    }

    /// Append sampled-equivalent ids to the open turn (a replayed assistant reply).
    pub fn push_all(&mut self, ids: &[u32]) {
        for &id in ids {
            self.push_sampled(id);
        }
    }

    /// A closed transcript continued from saved ids (a resumed session): BOS first, every id in the
    /// vocabulary; the effort text after BOS is recognised so a later turn in another mode replaces
    /// it as usual.
    pub fn resumed(tok: &Tokenizer, ids: Vec<u32>) -> Result<Transcript, String> {
        if ids.first() != Some(&tok.specials().bos) {
            return Err("the saved transcript does not start with BOS".into());
        }
        if let Some(bad) = ids.iter().find(|&&id| id as usize >= tok.n_vocab()) {
            return Err(format!(
                "the saved transcript holds token {bad}, outside the vocabulary"
            ));
        }
        let mut best = ("", 0);
        for mode in [ThinkMode::Max, ThinkMode::High, ThinkMode::Off] {
            let effort = mode.effort_prefix(tok.generation());
            let enc = tok.encode_plain(effort);
            if !effort.is_empty() && enc.len() > best.1 && ids[1..].starts_with(&enc) {
                best = (effort, enc.len());
            }
        }
        Ok(Transcript {
            ids,
            effort: best.0,
            effort_len: best.1,
            open_turn: None,
            generated: 0,
        })
    }

    /// Put `think`'s effort text after BOS; returns 1 when the tokens changed.
    fn set_effort(&mut self, tok: &Tokenizer, think: ThinkMode) -> Option<usize> {
        let effort = think.effort_prefix(tok.generation());
        if effort == self.effort {
            return None;
        }
        let old_len = self.effort_len;
        let ids = tok.encode_plain(effort);
        self.effort_len = ids.len();
        self.effort = effort;
        self.ids.splice(1..1 + old_len, ids);
        Some(1)
    }

    /// Append a user turn and the assistant opening. A turn still open is closed first (as
    /// [`Transcript::end_turn`] with `interrupted = false`).
    pub fn begin_turn(&mut self, tok: &Tokenizer, user_text: &str, requested: ThinkMode, ctx: u32) -> TurnStart {
        if self.open_turn.is_some() {
            self.end_turn(tok, false);
        }
        let think = requested.for_context(ctx);
        let old_len = self.ids.len();
        let first_changed = self.set_effort(tok, think).unwrap_or(old_len);
        self.open_turn = Some(self.ids.len());
        self.generated = 0;
        let s = tok.specials();
        self.ids.push(s.user);
        self.ids.extend(tok.encode_plain(user_text));
        self.ids.push(s.assistant);
        self.ids.push(think.tag_id(tok));
        TurnStart { think, first_changed }
    }

    /// Append one sampled token (EOS is not pushed here: [`Transcript::end_turn`] does).
    pub fn push_sampled(&mut self, id: u32) {
        self.ids.push(id);
        self.generated += 1;
    }

    /// Close the open turn: EOS is appended, unless the turn was interrupted before any token was
    /// sampled, in which case the whole turn is removed (ds4 run_chat_turn).
    pub fn end_turn(&mut self, tok: &Tokenizer, interrupted: bool) {
        let Some(start) = self.open_turn.take() else {
            return;
        };
        if interrupted && self.generated == 0 {
            self.ids.truncate(start);
        } else {
            self.ids.push(tok.specials().eos);
        }
        self.generated = 0;
    }

    /// Whether a turn is open (begun and not yet ended).
    pub fn turn_open(&self) -> bool {
        self.open_turn.is_some()
    }

    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_needs_384k_context() {
        assert_eq!(ThinkMode::Max.for_context(393_215), ThinkMode::High);
        assert_eq!(ThinkMode::Max.for_context(393_216), ThinkMode::Max);
        assert_eq!(ThinkMode::Off.for_context(1), ThinkMode::Off);
        assert_eq!(ThinkMode::High.for_context(1 << 20), ThinkMode::High);
    }

    #[test]
    fn max_prefix_has_three_line_ends_plus_one() {
        assert_eq!(THINK_MAX_PREFIX.matches('\n').count(), 4);
        assert!(THINK_MAX_PREFIX.ends_with("unchecked.\n\n"));
        assert!(THINK_MAX_PREFIX.starts_with("Reasoning Effort: Absolute maximum"));
    }

    #[test]
    fn assistant_without_a_user_turn_has_no_assistant_marker() {
        let mut c = Conversation::new();
        c.push(Message::assistant("hi", None))
            .push(Message::assistant("again", None));
        assert_eq!(
            c.render_text(ThinkMode::Off, Generation::Preview),
            format!("{BOS_STR}hi{EOS_STR}again{EOS_STR}")
        );
    }
}
