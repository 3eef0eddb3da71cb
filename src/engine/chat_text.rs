//! The worker's `ChatText` over the real tokenizer, the live transcript
//! (docs/prompt.md#live-transcript) and the streaming detokenizer
//! (docs/prompt.md#decoding-and-streaming).
//!
//! Prefix reuse: the session cache cannot be rolled back (docs/model.md#checkpoints), so the prompt of
//! every turn must extend the tokens already cached. The live transcript does exactly that: the sampled
//! tokens (reasoning included) stay in it verbatim and each turn only appends. A snapshot of the
//! transcript is kept at every turn boundary; a conversation continues from the longest snapshot it
//! starts with (the last one in a plain chat; an earlier one after a retry or an edit, whose prefix the
//! session restores from its checkpoint), and whatever the snapshots do not cover (a loaded chat, an
//! edited assistant message) is replayed in the same live form, assistant messages re-tokenized from
//! text.
//!
//! Owns only the glue; rendering rules live in `model::chat`, decoding in `model::detok`. Must not
//! touch the session.

use std::sync::{Arc, Mutex};

use crate::model::Model;
use crate::model::chat::{Conversation, Message, Role, ThinkMode, Transcript, Turn, turns};
use crate::model::detok::{StreamDecoder, TextDelta};
use crate::model::tokenizer::Tokenizer;
use crate::model::{dsml, tools};

use super::events::{FinishReason, TextKind};
use super::worker::{ChatText, TextStream};

/// What a turn's stream emitted, kept to recognise the assistant message in the next conversation.
#[derive(Default)]
struct Streamed {
    reasoning: String,
    answer: String,
}

/// Most turn snapshots kept (token vectors only, so cheap).
const MAX_SNAPSHOTS: usize = 256;

pub struct ChatAdapter {
    tok: Arc<Tokenizer>,
    ctx: u32,
    /// Transcripts at turn boundaries with the messages they stand for (each ends with our
    /// assistant reply), oldest first. A new conversation continues from the longest one whose
    /// messages it starts with, so retries and edits reuse the exact sampled ids and the session
    /// can restore its checkpoint of that prefix.
    snapshots: Vec<(Vec<Message>, Transcript)>,
    /// The turn in flight: the messages of its prompt and its transcript (turn open).
    open: Option<(Vec<Message>, Transcript)>,
    streamed: Arc<Mutex<Streamed>>,
    /// The start (system part) of the last prompt, its messages and mode: `shared_prefix`'s
    /// length, kept so an unchanged system prompt is not tokenized again every turn.
    shared: Option<(Vec<Message>, ThinkMode, Transcript)>,
    /// Whether the last prompt began with `shared`.
    shared_matches: bool,
}

/// The factory the loader uses: the model's tokenizer, for a session of `ctx` tokens.
pub fn for_model(model: &Model, ctx: u32) -> Result<Box<dyn ChatText>, String> {
    let tok = Tokenizer::from_gguf(&model.file).map_err(|e| e.to_string())?;
    Ok(Box::new(ChatAdapter::new(Arc::new(tok), ctx)))
}

/// Whether two messages are the same turn for the transcript: same role, text and calls, ignoring
/// surrounding whitespace (a client may trim), an empty reasoning versus none, and call ids.
fn same_message(a: &Message, b: &Message) -> bool {
    let r = |m: &Message| m.reasoning.as_deref().unwrap_or("").trim().to_string();
    a.role == b.role
        && a.content.trim() == b.content.trim()
        && r(a) == r(b)
        && a.is_tool_result() == b.is_tool_result()
        && a.tool_calls.len() == b.tool_calls.len()
        && a.tool_calls.iter().zip(&b.tool_calls).all(|(x, y)| x.same_call(y))
}

/// The messages a transcript stands for. With tools in play, the system messages become one
/// holding the whole system part (the tool block included), so a change of tools is a change of
/// the first message.
fn key_messages(conv: &Conversation) -> Vec<Message> {
    if !conv.tool_context() {
        return conv.messages.clone();
    }
    let system = conv.system_text();
    let rest = conv.messages.iter().filter(|m| m.role != Role::System).cloned();
    (!system.is_empty())
        .then(|| Message::system(system))
        .into_iter()
        .chain(rest)
        .collect()
}

fn starts_with(history: &[Message], prefix: &[Message]) -> bool {
    history.len() >= prefix.len() && history.iter().zip(prefix).all(|(a, b)| same_message(a, b))
}

impl ChatAdapter {
    /// `ctx` decides whether Think Max is honoured (docs/prompt.md#think-modes).
    pub fn new(tok: Arc<Tokenizer>, ctx: u32) -> ChatAdapter {
        ChatAdapter {
            tok,
            ctx,
            snapshots: Vec::new(),
            open: None,
            streamed: Arc::default(),
            shared: None,
            shared_matches: false,
        }
    }

    /// Append the turns of `history` from message `done` on (no open turn) to `t` in the live
    /// form: user turns opened with the mode their reply used, assistant replies re-tokenized from
    /// their text (their calls in DSML, with added-token recognition for the markers).
    fn replay(&self, t: &mut Transcript, history: &[Message], done: usize, think: ThinkMode, tool_context: bool) {
        let tok = &*self.tok;
        let all = turns(history, tool_context);
        for (k, (first, turn)) in all.iter().enumerate() {
            if *first < done {
                continue;
            }
            match turn {
                Turn::User(text) => {
                    let thought = all
                        .get(k + 1)
                        .is_some_and(|(_, n)| matches!(n, Turn::Assistant(a) if a.reasoning.is_some()));
                    let mode = match (thought, think) {
                        (false, _) => ThinkMode::Off,
                        (true, ThinkMode::Max) => ThinkMode::Max,
                        (true, _) => ThinkMode::High,
                    };
                    t.begin_turn(tok, text, mode, self.ctx);
                }
                Turn::Assistant(m) if t.turn_open() => {
                    if let Some(r) = &m.reasoning {
                        t.push_all(&tok.encode_plain(r));
                        t.push_sampled(tok.specials().think_end);
                    }
                    t.push_all(&tok.encode_plain(&m.content));
                    t.push_all(&tok.encode(&tools::calls_block(&m.tool_calls)));
                    t.end_turn(tok, false);
                }
                // An assistant message with no user turn before it cannot be represented live.
                Turn::Assistant(_) => {}
            }
        }
        if t.turn_open() {
            t.end_turn(tok, false);
        }
    }

    /// The transcript of `history`: from the longest matching snapshot, else from scratch (the
    /// system part tokenized with added-token recognition when it holds the tool block).
    fn transcript_for(&self, history: &[Message], think: ThinkMode, conv: &Conversation) -> Transcript {
        let best = self
            .snapshots
            .iter()
            .filter(|(m, _)| starts_with(history, m))
            .max_by_key(|(m, _)| m.len());
        let (mut t, done) = match best {
            Some((m, t)) => (t.clone(), m.len()),
            None => self.start_of(history, think, !conv.tools.is_empty()),
        };
        self.replay(&mut t, history, done, think, conv.tool_context());
        t
    }

    /// The transcript of `history`'s leading system messages (BOS, effort text, system text, and
    /// the tool block when `with_tools`: tokenized with added-token recognition) and how many
    /// messages that took.
    fn start_of(&self, history: &[Message], think: ThinkMode, with_tools: bool) -> (Transcript, usize) {
        let system: Vec<&str> = history
            .iter()
            .take_while(|m| m.role == Role::System)
            .map(|m| m.content.as_str())
            .collect();
        let n = system.len();
        let text = system.join("\n\n");
        let t = match with_tools {
            true => Transcript::new_encoded(&self.tok, &text, think, self.ctx),
            false => Transcript::new(&self.tok, &text, think, self.ctx),
        };
        (t, n)
    }
}

impl ChatText for ChatAdapter {
    fn for_context(&self, ctx: u32) -> Box<dyn ChatText> {
        Box::new(ChatAdapter::new(self.tok.clone(), ctx))
    }

    fn prompt(&mut self, conv: &Conversation, think: ThinkMode, _live: &[u32]) -> Result<Vec<u32>, String> {
        let messages = key_messages(conv);
        match messages.last() {
            None => return Err("the conversation is empty".into()),
            Some(m) if m.role != Role::User => {
                return Err("the conversation must end with a user message".into());
            }
            Some(_) => {}
        }
        let tool_context = conv.tool_context();
        let all = turns(&messages, tool_context);
        let Some((first, Turn::User(text))) = all.last() else {
            return Err("the conversation must end with a user message".into());
        };
        let mut t = self.transcript_for(&messages[..*first], think, conv);
        t.begin_turn(&self.tok, text, think, self.ctx);
        let ids = t.ids().to_vec();
        let history = &messages[..*first];
        let system = history.iter().take_while(|m| m.role == Role::System).count();
        let with_tools = !conv.tools.is_empty();
        let unchanged = self
            .shared
            .as_ref()
            .is_some_and(|(m, mode, _)| *mode == think && starts_with(history, m) && m.len() == system);
        if !unchanged {
            let (start, _) = self.start_of(history, think, with_tools);
            self.shared = Some((history[..system].to_vec(), think, start));
        }
        self.shared_matches = self
            .shared
            .as_ref()
            .is_some_and(|(_, _, start)| ids.starts_with(start.ids()));
        self.open = Some((messages, t));
        *self.streamed.lock().unwrap_or_else(|e| e.into_inner()) = Streamed::default();
        Ok(ids)
    }

    fn turn_done(&mut self, _conv: &Conversation, generated: &[u32], reason: FinishReason) {
        let Some((mut messages, mut t)) = self.open.take() else {
            return;
        };
        for &id in generated {
            t.push_sampled(id);
        }
        let interrupted = reason == FinishReason::Cancelled;
        t.end_turn(&self.tok, interrupted);
        if interrupted && generated.is_empty() {
            // The transcript dropped the turn (ds4 run_chat_turn); nothing new to remember.
            return;
        }
        let s = self.streamed.lock().unwrap_or_else(|e| e.into_inner());
        let thinking = generated.contains(&self.tok.specials().think_end) || !s.reasoning.is_empty();
        // The reply as a client sends it back: the text without its call block, and the calls.
        let (content, calls) = dsml::split_answer(&s.answer);
        messages.push(Message::assistant_calls(
            content,
            thinking.then(|| s.reasoning.clone()),
            calls,
        ));
        drop(s);
        if self.snapshots.len() == MAX_SNAPSHOTS {
            self.snapshots.remove(0);
        }
        self.snapshots.push((messages, t));
    }

    fn forget(&mut self) {
        self.snapshots.clear();
        self.open = None;
    }

    fn shared_prefix(&self) -> Option<usize> {
        let (_, _, start) = self.shared.as_ref()?;
        self.shared_matches.then(|| start.len())
    }

    fn transcript(&self) -> Option<crate::sessions::store::TranscriptIds> {
        self.snapshots
            .last()
            .map(|(m, t)| crate::sessions::store::TranscriptIds {
                messages: m.len(),
                ids: t.ids().to_vec(),
            })
    }

    fn resume(&mut self, messages: &[Message], ids: &[u32]) -> Result<(), String> {
        let t = Transcript::resumed(&self.tok, ids.to_vec())?;
        self.forget();
        self.snapshots.push((messages.to_vec(), t));
        Ok(())
    }

    fn eos(&self) -> u32 {
        self.tok.specials().eos
    }

    fn stream(&self, think: ThinkMode) -> Box<dyn TextStream> {
        Box::new(AdapterStream {
            dec: StreamDecoder::new(&self.tok, think),
            tok: self.tok.clone(),
            record: self.streamed.clone(),
        })
    }
}

struct AdapterStream {
    dec: StreamDecoder,
    tok: Arc<Tokenizer>,
    record: Arc<Mutex<Streamed>>,
}

impl AdapterStream {
    fn forward(&self, deltas: Vec<TextDelta>, out: &mut Vec<(TextKind, String)>) {
        let mut r = self.record.lock().unwrap_or_else(|e| e.into_inner());
        for d in deltas {
            match d.kind {
                TextKind::Reasoning => r.reasoning.push_str(&d.text),
                TextKind::Answer => r.answer.push_str(&d.text),
            }
            out.push((d.kind, d.text));
        }
    }
}

impl TextStream for AdapterStream {
    fn push(&mut self, token: u32, out: &mut Vec<(TextKind, String)>) {
        let d = self.dec.push(&self.tok, token);
        self.forward(d, out);
    }

    fn finish(&mut self, out: &mut Vec<(TextKind, String)>) {
        let d = self.dec.finish();
        self.forward(d, out);
    }
}
