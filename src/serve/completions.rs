//! `POST /v1/chat/completions`: a checked request becomes one engine turn, answered as one JSON
//! completion or as a stream of chunks (SSE). The response head of a stream is sent only once the
//! engine has accepted the prompt, so a prompt that overflows the context is still a plain 400.
//! The answer text goes through the call reader (calls.rs): calls are `tool_calls` (one delta per
//! call, whole, with its id), the rest `content`.
//!
//! Owns the flow of one completion request. The slot (queue.rs) is held from before the turn is
//! submitted until its last event is read.

use std::net::TcpStream;

use crate::engine::events::TextKind;

use super::calls::{ReplyEvent, ReplyShaper};
use super::disconnect::HangupWatch;
use super::error::ApiError;
use super::http;
use super::request::ChatRequest;
use super::responses::{self, CompletionId};
use super::server::Server;
use super::sse::SseWriter;
use super::turn::{TurnSink, run_collected, run_turn};

/// A streaming turn: chunks as the text comes; the reply is also kept for the reply memory.
struct Streamed<'a> {
    stream: Option<&'a mut TcpStream>,
    sse: Option<SseWriter<'a>>,
    id: &'a CompletionId,
    reply: ReplyShaper,
}

impl Streamed<'_> {
    fn send(&mut self, events: Vec<ReplyEvent>) -> bool {
        let Some(sse) = &mut self.sse else { return false };
        for e in events {
            let chunk = match &e {
                ReplyEvent::Reasoning(t) => responses::text_chunk(self.id, TextKind::Reasoning, t),
                ReplyEvent::Content(t) => responses::text_chunk(self.id, TextKind::Answer, t),
                ReplyEvent::Call { index, call } => responses::call_chunk(self.id, *index, call),
            };
            sse.event(&chunk);
        }
        sse.alive()
    }
}

impl TurnSink for Streamed<'_> {
    fn started(&mut self) -> bool {
        let Some(stream) = self.stream.take() else { return false };
        let mut sse = SseWriter::start(stream);
        let alive = sse.event(&responses::role_chunk(self.id));
        self.sse = Some(sse);
        alive
    }
    fn text(&mut self, kind: TextKind, text: &str) -> bool {
        let events = self.reply.push(kind, text);
        self.send(events)
    }
}

/// Serve one checked completion request on `stream`.
pub fn serve(server: &Server, stream: &mut TcpStream, mut req: ChatRequest) -> Result<(), ApiError> {
    let sampling = req.sampling(&server.defaults.sampling);
    let max_tokens = req.max_tokens.unwrap_or(server.defaults.max_tokens);
    let turn = server.turn_request(&mut req.messages, &req.tools, req.think, sampling, max_tokens);
    let think = turn.think;
    let watch = HangupWatch::start(stream);
    let slot = server.queue.acquire()?;
    if watch.gone() {
        return Ok(());
    }
    let id = CompletionId::new(&server.model_id);
    let worker = server.worker();
    let gone = || watch.gone();
    let reply = ReplyShaper::new(&req.tools, "call_");
    if req.stream {
        let mut sink = Streamed {
            stream: Some(stream),
            sse: None,
            id: &id,
            reply,
        };
        let outcome = run_turn(&worker, turn, &mut sink, &gone);
        drop(worker);
        drop(slot);
        let outcome = outcome?;
        let rest = sink.reply.finish();
        sink.send(rest);
        server.record(&outcome, &sink.reply, think.thinking());
        if let Some(mut sse) = sink.sse {
            if let Some(e) = &outcome.error {
                sse.event(&ApiError::status(500, e.clone()).body());
            }
            let finish = responses::reply_finish_reason(outcome.finish, sink.reply.calls.len());
            sse.event(&responses::finish_chunk(&id, finish, &outcome.usage, &outcome.timings));
            if req.include_usage {
                sse.event(&responses::usage_chunk(&id, &outcome.usage, &outcome.timings));
            }
            sse.done();
        }
        watch.stop();
        return Ok(());
    }
    let Some((outcome, reply)) = run_collected(server, (worker, slot), turn, reply, watch)? else {
        return Ok(());
    };
    let reasoning = think.thinking().then_some(reply.reasoning.as_str());
    let body = responses::completion(&id, &reply, reasoning, outcome.finish, &outcome.usage, &outcome.timings);
    let _ = http::write_json(stream, 200, &body);
    Ok(())
}
