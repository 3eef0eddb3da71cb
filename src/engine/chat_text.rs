//! The worker's `ChatText` over the real tokenizer, the live transcript (spec §6.3) and the streaming
//! detokenizer (spec §5.4).
//!
//! Prefix reuse: the session cache cannot be rolled back (spec §4.3), so the prompt of every turn must
//! extend the tokens already cached. The live transcript does exactly that: the sampled tokens
//! (reasoning included) stay in it verbatim and each turn only appends. When the client's
//! conversation no longer matches what the transcript holds (an edited or retried message, a loaded
//! chat), the transcript is rebuilt from the conversation in the same live form — assistant messages
//! re-tokenized from their text — so later turns append to it again.
//!
//! Owns only the glue; rendering rules live in `model::chat`, decoding in `model::detok`. Must not
//! touch the session.

use std::sync::{Arc, Mutex};

use crate::model::Model;
use crate::model::chat::{Conversation, Message, Role, ThinkMode, Transcript};
use crate::model::detok::StreamDecoder;
use crate::model::tokenizer::Tokenizer;

use super::events::{FinishReason, TextKind};
use super::worker::{ChatText, TextStream};

/// What a turn's stream emitted, kept to recognise the assistant message in the next conversation.
#[derive(Default)]
struct Streamed {
    reasoning: String,
    answer: String,
}

pub struct ChatAdapter {
    tok: Arc<Tokenizer>,
    ctx: u32,
    transcript: Option<Transcript>,
    /// The messages the transcript holds, ending with our assistant reply once a turn is done.
    committed: Vec<Message>,
    streamed: Arc<Mutex<Streamed>>,
}

/// The factory the loader uses: the model's tokenizer, for a session of `ctx` tokens.
pub fn for_model(model: &Model, ctx: u32) -> Result<Box<dyn ChatText>, String> {
    let tok = Tokenizer::from_gguf(&model.file).map_err(|e| e.to_string())?;
    Ok(Box::new(ChatAdapter::new(Arc::new(tok), ctx)))
}

/// Whether two messages are the same turn for the transcript: same role and text, ignoring
/// surrounding whitespace (a client may trim) and an empty reasoning versus none.
fn same_message(a: &Message, b: &Message) -> bool {
    let r = |m: &Message| m.reasoning.as_deref().unwrap_or("").trim().to_string();
    a.role == b.role && a.content.trim() == b.content.trim() && r(a) == r(b)
}

impl ChatAdapter {
    /// `ctx` decides whether Think Max is honoured (spec §6.1); the worker sets the session's value.
    pub fn new(tok: Arc<Tokenizer>, ctx: u32) -> ChatAdapter {
        ChatAdapter {
            tok,
            ctx,
            transcript: None,
            committed: Vec::new(),
            streamed: Arc::default(),
        }
    }

    /// A transcript of `history` (no open turn) in the live form.
    fn rebuild(&self, history: &[Message], think: ThinkMode) -> Transcript {
        let tok = &*self.tok;
        let system: Vec<&str> = history
            .iter()
            .filter(|m| m.role == Role::System)
            .map(|m| m.content.as_str())
            .collect();
        let mut t = Transcript::new(tok, &system.join("\n\n"), think, self.ctx);
        for (i, m) in history.iter().enumerate() {
            match m.role {
                Role::System => {}
                Role::User => {
                    // The past turn's mode: thinking when its reply carries reasoning.
                    let thought = history
                        .get(i + 1)
                        .is_some_and(|n| n.role == Role::Assistant && n.reasoning.is_some());
                    let mode = match (thought, think) {
                        (false, _) => ThinkMode::Off,
                        (true, ThinkMode::Max) => ThinkMode::Max,
                        (true, _) => ThinkMode::High,
                    };
                    t.begin_turn(tok, &m.content, mode, self.ctx);
                }
                Role::Assistant if t.turn_open() => {
                    if let Some(r) = &m.reasoning {
                        for id in tok.encode_plain(r) {
                            t.push_sampled(id);
                        }
                    }
                    t.push_sampled(tok.specials().think_end);
                    for id in tok.encode_plain(&m.content) {
                        t.push_sampled(id);
                    }
                    t.end_turn(tok, false);
                }
                // An assistant message with no user turn before it cannot be represented live.
                Role::Assistant => {}
            }
        }
        t
    }
}

impl ChatText for ChatAdapter {
    fn prompt(&mut self, conv: &Conversation, think: ThinkMode, _live: &[u32]) -> Result<Vec<u32>, String> {
        let Some((last, history)) = conv.messages.split_last() else {
            return Err("the conversation is empty".into());
        };
        if last.role != Role::User {
            return Err("the conversation must end with a user message".into());
        }
        let continues = self.transcript.is_some()
            && history.len() == self.committed.len()
            && history.iter().zip(&self.committed).all(|(a, b)| same_message(a, b));
        if !continues {
            self.transcript = Some(self.rebuild(history, think));
        }
        let t = self.transcript.as_mut().expect("set above");
        t.begin_turn(&self.tok, &last.content, think, self.ctx);
        self.committed = conv.messages.clone();
        *self.streamed.lock().unwrap_or_else(|e| e.into_inner()) = Streamed::default();
        Ok(t.ids().to_vec())
    }

    fn turn_done(&mut self, _conv: &Conversation, generated: &[u32], reason: FinishReason) {
        let Some(t) = &mut self.transcript else { return };
        for &id in generated {
            t.push_sampled(id);
        }
        let interrupted = reason == FinishReason::Cancelled;
        t.end_turn(&self.tok, interrupted);
        if interrupted && generated.is_empty() {
            // The transcript dropped the turn; so does the history it stands for.
            self.committed.pop();
        } else {
            let s = self.streamed.lock().unwrap_or_else(|e| e.into_inner());
            let thinking = t.ids().contains(&self.tok.specials().think_start) || !s.reasoning.is_empty();
            self.committed.push(Message {
                role: Role::Assistant,
                content: s.answer.clone(),
                reasoning: thinking.then(|| s.reasoning.clone()),
            });
        }
    }

    fn forget(&mut self) {
        self.transcript = None;
        self.committed.clear();
    }

    fn eos(&self) -> u32 {
        self.tok.specials().eos
    }

    fn stream(&self, think: ThinkMode) -> Box<dyn TextStream> {
        Box::new(AdapterStream {
            dec: StreamDecoder::new(self.tok.clone(), think.thinking()),
            record: self.streamed.clone(),
        })
    }
}

struct AdapterStream {
    dec: StreamDecoder,
    record: Arc<Mutex<Streamed>>,
}

impl AdapterStream {
    fn record(&self, pieces: &[(TextKind, String)]) {
        let mut r = self.record.lock().unwrap_or_else(|e| e.into_inner());
        for (k, s) in pieces {
            match k {
                TextKind::Reasoning => r.reasoning.push_str(s),
                TextKind::Answer => r.answer.push_str(s),
            }
        }
    }
}

impl TextStream for AdapterStream {
    fn push(&mut self, token: u32, out: &mut Vec<(TextKind, String)>) {
        let start = out.len();
        self.dec.push(token, out);
        self.record(&out[start..]);
    }

    fn finish(&mut self, out: &mut Vec<(TextKind, String)>) {
        let start = out.len();
        self.dec.finish(out);
        self.record(&out[start..]);
    }
}
