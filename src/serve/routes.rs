//! The endpoints: `GET /health`, `GET /v1/models`, `POST /v1/chat/completions`, `POST
//! /v1/messages`. Reads the request, checks the key (every `/v1/` route; `/health` is open, as in
//! llama-server), dispatches, and answers every failure with a JSON error: Anthropic's shape on
//! `/v1/messages`, OpenAI's elsewhere.
//!
//! Owns the route table. Must not parse JSON bodies (request.rs) or run turns (completions.rs).

use std::net::TcpStream;

use serde_json::json;

use super::error::ApiError;
use super::http::{self, ReadError};
use super::server::Server;

/// Serve one connection (one request) to its end.
pub fn handle(server: &Server, mut stream: TcpStream) {
    let mut anthropic = false;
    let result = match http::read_request(&mut stream, server.max_body) {
        Ok(req) => {
            anthropic = req.path.trim_end_matches('/').starts_with("/v1/messages");
            route(server, &mut stream, &req)
        }
        Err(ReadError::Respond(e)) => Err(e),
        Err(ReadError::Gone) => return,
    };
    if let Err(e) = result {
        let _ = match anthropic {
            true => http::write_json(&mut stream, e.status, &super::anthropic::reply::error_body(&e)),
            false => http::write_error(&mut stream, &e),
        };
    }
    http::finish(&mut stream);
}

fn route(server: &Server, stream: &mut TcpStream, req: &http::Request) -> Result<(), ApiError> {
    let path = req.path.trim_end_matches('/');
    let method = req.method.as_str();
    let allow = |allowed: &str| {
        if method == allowed {
            Ok(())
        } else {
            Err(ApiError::status(405, format!("{path} takes {allowed}, not {method}")))
        }
    };
    match path {
        "/health" => {
            allow("GET")?;
            let (generating, queued) = server.queue.load();
            let last = server.last_turn().map(|t| {
                json!({
                    "finish_reason": t.finish_reason,
                    "completion_tokens": t.completion_tokens,
                    "cached_tokens": t.cached_tokens,
                })
            });
            let body = json!({
                "status": "ok",
                "model": server.model_id,
                "generating": generating,
                "queued": queued,
                "last_turn": last,
            });
            let _ = http::write_json(stream, 200, &body);
            Ok(())
        }
        "/v1/models" => {
            allow("GET")?;
            server.key.check_request(req)?;
            let body = super::responses::model_list(&server.model_id, server.created, server.ctx);
            let _ = http::write_json(stream, 200, &body);
            Ok(())
        }
        "/v1/chat/completions" => {
            allow("POST")?;
            server.key.check_request(req)?;
            let chat = super::request::parse_chat_request(&req.body, &server.model_id)?;
            super::completions::serve(server, stream, chat)
        }
        "/v1/messages" => {
            allow("POST")?;
            server.key.check_request(req)?;
            let messages = super::anthropic::request::parse_messages_request(&req.body)?;
            super::anthropic::serve(server, stream, messages)
        }
        _ => Err(ApiError::status(404, format!("no route {method} {}", req.path))),
    }
}
