//! `POST /v1/chat/completions`: a checked request becomes one engine turn, answered as one JSON
//! completion or as a stream of chunks (SSE). The response head of a stream is sent only once the
//! engine has accepted the prompt, so a prompt that overflows the context is still a plain 400.
//!
//! Owns the flow of one completion request. The slot (queue.rs) is held from before the turn is
//! submitted until its last event is read.

use std::net::TcpStream;

use crate::engine::events::{FinishReason, TextKind, TurnRequest};
use crate::model::chat::Conversation;

use super::disconnect::HangupWatch;
use super::error::ApiError;
use super::http;
use super::request::ChatRequest;
use super::responses::{self, CompletionId};
use super::server::{LastTurn, Server};
use super::sse::SseWriter;
use super::turn::{TurnOutcome, TurnSink, run_turn};

/// A non-streaming turn's text.
#[derive(Default)]
struct Collected {
    answer: String,
    reasoning: String,
}

impl TurnSink for Collected {
    fn started(&mut self) -> bool {
        true
    }
    fn text(&mut self, kind: TextKind, text: &str) -> bool {
        match kind {
            TextKind::Answer => self.answer.push_str(text),
            TextKind::Reasoning => self.reasoning.push_str(text),
        }
        true
    }
}

/// A streaming turn: chunks as the text comes; the text is also kept for the reply memory.
struct Streamed<'a> {
    stream: Option<&'a mut TcpStream>,
    sse: Option<SseWriter<'a>>,
    id: &'a CompletionId,
    text: Collected,
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
        self.text.text(kind, text);
        match &mut self.sse {
            Some(sse) => sse.event(&responses::text_chunk(self.id, kind, text)),
            None => false,
        }
    }
}

/// Serve one checked completion request on `stream`.
pub fn serve(server: &Server, stream: &mut TcpStream, mut req: ChatRequest) -> Result<(), ApiError> {
    server.replies().restore_reasoning(&mut req.messages);
    let think = req.think.unwrap_or(server.defaults.think);
    let turn = TurnRequest {
        conversation: Conversation {
            messages: req.messages.clone(),
        },
        think,
        sampling: req.sampling(&server.defaults.sampling),
        max_tokens: req.max_tokens.unwrap_or(server.defaults.max_tokens),
    };
    let watch = HangupWatch::start(stream);
    let slot = server.queue.acquire()?;
    if watch.gone() {
        return Ok(());
    }
    let id = CompletionId::new(&server.model_id);
    let worker = server.worker();
    let gone = || watch.gone();
    if req.stream {
        let mut sink = Streamed {
            stream: Some(stream),
            sse: None,
            id: &id,
            text: Collected::default(),
        };
        let outcome = run_turn(&worker, turn, &mut sink, &gone);
        drop(worker);
        drop(slot);
        let outcome = outcome?;
        server.record(&outcome, &sink.text.answer, &sink.text.reasoning, think.thinking());
        if let Some(mut sse) = sink.sse {
            if let Some(e) = &outcome.error {
                sse.event(&ApiError::status(500, e.clone()).body());
            }
            sse.event(&responses::finish_chunk(
                &id,
                outcome.finish,
                &outcome.usage,
                &outcome.timings,
            ));
            if req.include_usage {
                sse.event(&responses::usage_chunk(&id, &outcome.usage, &outcome.timings));
            }
            sse.done();
        }
        watch.stop();
        return Ok(());
    }
    let mut text = Collected::default();
    let outcome = run_turn(&worker, turn, &mut text, &gone);
    drop(worker);
    drop(slot);
    let outcome = outcome?;
    server.record(&outcome, &text.answer, &text.reasoning, think.thinking());
    watch.stop();
    if outcome.client_gone {
        return Ok(());
    }
    if let Some(e) = outcome.error {
        return Err(ApiError::status(500, e));
    }
    let reasoning = think.thinking().then_some(text.reasoning.as_str());
    let body = responses::completion(
        &id,
        &text.answer,
        reasoning,
        outcome.finish,
        &outcome.usage,
        &outcome.timings,
    );
    let _ = http::write_json(stream, 200, &body);
    Ok(())
}

impl LastTurn {
    pub fn of(outcome: &TurnOutcome) -> LastTurn {
        LastTurn {
            finish_reason: if outcome.client_gone {
                "cancelled"
            } else if outcome.finish == FinishReason::Cancelled {
                "error"
            } else {
                responses::finish_reason(outcome.finish)
            },
            completion_tokens: outcome.usage.completion_tokens,
            cached_tokens: outcome.usage.cached_tokens,
        }
    }
}
