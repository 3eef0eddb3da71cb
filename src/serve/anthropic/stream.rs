//! A streamed Messages API reply: `message_start` once the prompt is evaluated (its usage then
//! known), each content block opened, filled by deltas (`thinking_delta`, `text_delta`, a tool use's
//! whole input as one `input_json_delta`) and closed, then `message_delta` with the stop reason and
//! usage and `message_stop`.
//!
//! Owns the block order of one stream. Must not run the turn (mod.rs does).

use std::net::TcpStream;

use serde_json::{Value, json};

use crate::engine::events::TextKind;

use super::super::calls::{ReplyEvent, ReplyShaper};
use super::super::sse::SseWriter;
use super::super::turn::{TurnSink, Usage};
use super::reply;

/// The kind of the open content block.
#[derive(Clone, Copy, PartialEq)]
enum Block {
    Thinking,
    Text,
}

pub struct Streamed<'a> {
    stream: Option<&'a mut TcpStream>,
    pub sse: Option<SseWriter<'a>>,
    id: String,
    model: String,
    pub reply: ReplyShaper,
    started: bool,
    open: Option<Block>,
    /// Index of the next block.
    next: usize,
}

impl<'a> Streamed<'a> {
    pub fn new(stream: &'a mut TcpStream, id: String, model: String, reply: ReplyShaper) -> Streamed<'a> {
        Streamed {
            stream: Some(stream),
            sse: None,
            id,
            model,
            reply,
            started: false,
            open: None,
            next: 0,
        }
    }

    fn event(&mut self, name: &str, data: Value) -> bool {
        match &mut self.sse {
            Some(sse) => sse.named_event(name, &data),
            None => false,
        }
    }

    /// `message_start`, once.
    pub fn start_message(&mut self, usage: &Usage) {
        if self.started {
            return;
        }
        self.started = true;
        let m = reply::message(&self.id, &self.model, Vec::new(), None, usage);
        self.event("message_start", json!({ "type": "message_start", "message": m }));
    }

    fn close_block(&mut self) {
        if self.open.take().is_some() {
            let index = self.next - 1;
            self.event(
                "content_block_stop",
                json!({ "type": "content_block_stop", "index": index }),
            );
        }
    }

    fn open_block(&mut self, block: Value) -> usize {
        self.close_block();
        let index = self.next;
        self.next += 1;
        self.event(
            "content_block_start",
            json!({ "type": "content_block_start", "index": index, "content_block": block }),
        );
        index
    }

    fn delta(&mut self, index: usize, delta: Value) {
        self.event(
            "content_block_delta",
            json!({ "type": "content_block_delta", "index": index, "delta": delta }),
        );
    }

    /// Send the reply's events as blocks; false when the client is gone.
    pub fn send(&mut self, events: Vec<ReplyEvent>) -> bool {
        if self.sse.is_none() {
            return false;
        }
        self.start_message(&Usage::default());
        for e in events {
            match e {
                ReplyEvent::Reasoning(t) => {
                    if self.open != Some(Block::Thinking) {
                        self.open_block(json!({ "type": "thinking", "thinking": "", "signature": "" }));
                        self.open = Some(Block::Thinking);
                    }
                    self.delta(self.next - 1, json!({ "type": "thinking_delta", "thinking": t }));
                }
                ReplyEvent::Content(t) => {
                    if self.open != Some(Block::Text) {
                        self.open_block(json!({ "type": "text", "text": "" }));
                        self.open = Some(Block::Text);
                    }
                    self.delta(self.next - 1, json!({ "type": "text_delta", "text": t }));
                }
                ReplyEvent::Call { call, .. } => {
                    let index =
                        self.open_block(json!({ "type": "tool_use", "id": call.id, "name": call.name, "input": {} }));
                    let input = reply::tool_input(&call).to_string();
                    self.delta(index, json!({ "type": "input_json_delta", "partial_json": input }));
                    self.event(
                        "content_block_stop",
                        json!({ "type": "content_block_stop", "index": index }),
                    );
                }
            }
        }
        self.sse.as_ref().is_some_and(SseWriter::alive)
    }

    /// Close the open block, then `message_delta` and `message_stop`.
    pub fn finish(mut self, stop_reason: &str, usage: &Usage) {
        self.start_message(usage);
        self.close_block();
        let stop_sequence = self.reply.stopped.clone();
        self.event(
            "message_delta",
            json!({
                "type": "message_delta",
                "delta": { "stop_reason": stop_reason, "stop_sequence": stop_sequence },
                "usage": reply::usage(usage),
            }),
        );
        self.event("message_stop", json!({ "type": "message_stop" }));
        if let Some(sse) = self.sse.take() {
            sse.end();
        }
    }
}

impl TurnSink for Streamed<'_> {
    fn started(&mut self) -> bool {
        let Some(stream) = self.stream.take() else { return false };
        let sse = SseWriter::start(stream);
        let alive = sse.alive();
        self.sse = Some(sse);
        alive
    }
    fn prefilled(&mut self, usage: &Usage) {
        self.start_message(usage);
    }
    fn text(&mut self, kind: TextKind, text: &str) -> bool {
        let events = self.reply.push(kind, text);
        self.send(events) && self.reply.stopped.is_none()
    }
}
