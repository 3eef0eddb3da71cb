//! Anthropic's Messages API (`POST /v1/messages`) on the same engine turn as the OpenAI route:
//! `request` (body checks and the mapping of content blocks), `reply` (JSON shapes and errors),
//! `stream` (the event stream). Errors are answered in Anthropic's shape by routes.rs; the API key
//! may come as `x-api-key` or as a Bearer token (auth.rs).
//!
//! Owns the flow of one Messages request. Must not parse bodies (request.rs) or write JSON shapes
//! itself (reply.rs).

pub mod reply;
pub mod request;
pub mod stream;

use std::net::TcpStream;

use super::calls::ReplyShaper;
use super::disconnect::HangupWatch;
use super::error::ApiError;
use super::http;
use super::server::Server;
use super::turn::{run_collected, run_turn};
use request::MessagesRequest;

/// Serve one checked Messages request on `stream`.
pub fn serve(server: &Server, stream: &mut TcpStream, mut req: MessagesRequest) -> Result<(), ApiError> {
    let sampling = req.sampling(&server.defaults.sampling);
    let turn = server.turn_request(&mut req.messages, &req.tools, req.think, sampling, req.max_tokens);
    let think = turn.think;
    let watch = HangupWatch::start(stream);
    let slot = server.queue.acquire()?;
    if watch.gone() {
        return Ok(());
    }
    let id = reply::message_id();
    let worker = server.worker();
    let shaper = ReplyShaper::new(&req.tools, "toolu_").with_stops(req.stop_sequences.clone());
    if req.stream {
        let mut sink = stream::Streamed::new(stream, id, server.model_id.clone(), shaper);
        // A stop sequence ends the turn through the sink, which is not a hang-up.
        let gone = || watch.gone();
        let outcome = run_turn(&worker, turn, &mut sink, &gone);
        drop(worker);
        drop(slot);
        let mut outcome = outcome?;
        let stopped = sink.reply.stopped.is_some();
        outcome.client_gone &= !stopped;
        let rest = sink.reply.finish();
        sink.send(rest);
        server.record(&outcome, &sink.reply, think.thinking());
        if let Some(e) = &outcome.error
            && let Some(sse) = &mut sink.sse
        {
            sse.named_event("error", &reply::error_body(&ApiError::status(500, e.clone())));
        }
        let stop = reply::stop_reason(outcome.finish, sink.reply.calls.len(), sink.reply.stopped.as_deref());
        sink.finish(stop, &outcome.usage);
        watch.stop();
        return Ok(());
    }
    let Some((outcome, shaper)) = run_collected(server, (worker, slot), turn, shaper, watch)? else {
        return Ok(());
    };
    let stop = reply::stop_reason(outcome.finish, shaper.calls.len(), shaper.stopped.as_deref());
    let body = reply::message(
        &reply::message_id(),
        &server.model_id,
        reply::content_blocks(&shaper, think.thinking()),
        Some((stop, shaper.stopped.as_deref())),
        &outcome.usage,
    );
    let _ = http::write_json(stream, 200, &body);
    Ok(())
}
