//! The HTTP side of a remote worker, over `ureq` (a small blocking client: docs/remote.md says why):
//! the model list (`GET /v1/models`), opening a chat-completions stream, and every failure as one
//! line that names the endpoint and what to check.
//!
//! Owns the agent's timeouts, the request headers (API key) and the wording of the errors;
//! reading the opened stream is `stream`.

use std::io;
use std::time::Duration;

use serde_json::Value;

use super::chunk::{clip, error_text};
use super::target::RemoteTarget;

/// How long connecting may take (a server that is up accepts at once).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest error body read (the message is clipped to one line anyway).
const ERROR_BODY_LIMIT: u64 = 64 * 1024;

/// A model the server lists, with its context when it says (vLLM's and our `max_model_len`).
#[derive(Clone, Debug, PartialEq)]
pub struct ServedModel {
    pub id: String,
    pub ctx: Option<u32>,
}

/// An opened stream: the body of a 200 answer.
pub type StreamBody = ureq::BodyReader<'static>;

pub struct Client {
    agent: ureq::Agent,
    pub target: RemoteTarget,
}

impl Client {
    pub fn new(target: RemoteTarget) -> Client {
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(CONNECT_TIMEOUT))
            // Every read, the response head included: a server silent this long has failed.
            .timeout_per_read(Some(target.timeout))
            .user_agent(concat!("ds4-chat/", env!("CARGO_PKG_VERSION")))
            .build();
        Client {
            agent: config.into(),
            target,
        }
    }

    fn with_key<B>(&self, mut req: ureq::RequestBuilder<B>) -> ureq::RequestBuilder<B> {
        if let Some(key) = &self.target.api_key {
            req = req.header("Authorization", format!("Bearer {key}"));
        }
        req
    }

    /// `GET /v1/models`.
    pub fn models(&self) -> Result<Vec<ServedModel>, String> {
        let url = self.target.url("models");
        let resp = self
            .with_key(self.agent.get(&url))
            .call()
            .map_err(|e| self.transport_error(e))?;
        let status = resp.status().as_u16();
        let mut body = resp.into_body();
        let text = body
            .with_config()
            .limit(4 << 20)
            .read_to_string()
            .map_err(|e| self.transport_error(e))?;
        if status != 200 {
            return Err(self.status_error(status, &text, None));
        }
        parse_models(&text).map_err(|why| format!("{url}: {why}"))
    }

    /// `POST /v1/chat/completions` with `body`; the stream's body on a 200 answer.
    pub fn open_stream(&self, body: &Value, model: &str) -> Result<StreamBody, String> {
        let url = self.target.url("chat/completions");
        let resp = self
            .with_key(self.agent.post(&url))
            .header("Accept", "text/event-stream")
            .content_type("application/json")
            .send(body.to_string())
            .map_err(|e| self.transport_error(e))?;
        let status = resp.status().as_u16();
        let body = resp.into_body();
        if status != 200 {
            let text = body
                .into_with_config()
                .limit(ERROR_BODY_LIMIT)
                .lossy_utf8(true)
                .read_to_string()
                .unwrap_or_default();
            return Err(self.status_error(status, &text, Some(model)));
        }
        Ok(body.into_reader())
    }

    /// A failure before any answer: connection refused, unknown host, timeout, broken connection.
    pub fn transport_error(&self, e: ureq::Error) -> String {
        let base = &self.target.base;
        match e {
            ureq::Error::Io(io) => self.io_error(&io),
            ureq::Error::Timeout(_) => self.timeout_error(),
            ureq::Error::HostNotFound => format!("cannot find the host of {base} (check the URL)"),
            ureq::Error::ConnectionFailed => format!("cannot connect to {base}"),
            other => format!("{base}: {}", clip(&other.to_string(), 200)),
        }
    }

    /// A failure while reading: a timeout, the connection reset or cut.
    pub fn io_error(&self, e: &io::Error) -> String {
        let base = &self.target.base;
        if let Some(inner) = e.get_ref().and_then(|i| i.downcast_ref::<ureq::Error>())
            && matches!(inner, ureq::Error::Timeout(_))
        {
            return self.timeout_error();
        }
        match e.kind() {
            io::ErrorKind::ConnectionRefused => {
                format!("cannot connect to {base}: connection refused (is the server running?)")
            }
            io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => self.timeout_error(),
            io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted | io::ErrorKind::UnexpectedEof => {
                format!("the connection to {base} broke off ({e})")
            }
            _ => format!("{base}: {}", clip(&e.to_string(), 200)),
        }
    }

    fn timeout_error(&self) -> String {
        format!(
            "{} sent nothing for {} s (timeout; `timeout` in [remote] sets it)",
            self.target.base,
            self.target.timeout.as_secs()
        )
    }

    /// An HTTP error status, with the server's own message.
    pub fn status_error(&self, status: u16, body: &str, model: Option<&str>) -> String {
        let base = &self.target.base;
        let msg = server_message(body);
        let said = if msg.is_empty() {
            String::new()
        } else {
            format!(": {msg}")
        };
        match status {
            401 | 403 => format!(
                "{base} refused the request ({status}{}){said} — give the key with --api-key-env VAR",
                if status == 401 { " Unauthorized" } else { " Forbidden" }
            ),
            404 => match model {
                Some(m) => format!("{base} does not serve the model {m} (404){said}"),
                None => format!("{base}: not found (404){said} — is it an OpenAI-compatible /v1 endpoint?"),
            },
            429 => format!("{base} is busy (429){said}; try again"),
            500..=599 => format!("server error {status} from {base}{said}"),
            _ => format!("{base} answered {status}{said}"),
        }
    }
}

/// The message of an error body: OpenAI's `{"error": {"message"}}`, FastAPI's `{"detail"}`, a
/// `{"message"}`, or the text itself.
pub fn server_message(body: &str) -> String {
    let Ok(v) = serde_json::from_str::<Value>(body) else {
        return clip(body, 200);
    };
    for key in ["error", "detail", "message"] {
        if let Some(e) = v.get(key) {
            return error_text(e);
        }
    }
    clip(body, 200)
}

/// The `data` list of a `/v1/models` answer.
pub fn parse_models(text: &str) -> Result<Vec<ServedModel>, String> {
    let v: Value = serde_json::from_str(text).map_err(|e| format!("the model list is not JSON ({e})"))?;
    let list = v
        .get("data")
        .and_then(Value::as_array)
        .ok_or("the model list has no `data` array (is this an OpenAI-compatible endpoint?)")?;
    Ok(list
        .iter()
        .filter_map(|m| {
            let id = m.get("id")?.as_str()?.to_string();
            let ctx = ["max_model_len", "context_length", "context_window"]
                .iter()
                .find_map(|k| m.get(*k).and_then(Value::as_u64))
                .map(|n| n.min(u32::MAX as u64) as u32);
            Some(ServedModel { id, ctx })
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client_at(port: u16) -> Client {
        Client::new(RemoteTarget::new(&format!("http://127.0.0.1:{port}/v1"), None, None, 7).unwrap())
    }

    fn client() -> Client {
        client_at(9)
    }

    #[test]
    fn model_lists() {
        let m = parse_models(r#"{"object":"list","data":[{"id":"a","max_model_len":65536},{"id":"b"}]}"#).unwrap();
        assert_eq!(
            m,
            vec![
                ServedModel {
                    id: "a".into(),
                    ctx: Some(65536)
                },
                ServedModel {
                    id: "b".into(),
                    ctx: None
                }
            ]
        );
        assert!(parse_models("{}").unwrap_err().contains("`data`"));
        assert!(parse_models("<html>").unwrap_err().contains("not JSON"));
    }

    #[test]
    fn status_errors_are_one_line_and_name_the_cause() {
        let c = client();
        let e = c.status_error(
            401,
            r#"{"error":{"message":"Invalid API key","type":"auth"}}"#,
            Some("m"),
        );
        assert!(
            e.contains("401") && e.contains("Invalid API key") && e.contains("--api-key-env"),
            "{e}"
        );
        let e = c.status_error(404, r#"{"detail":"Not Found"}"#, Some("deepseek"));
        assert!(
            e.contains("does not serve the model deepseek") && e.contains("Not Found"),
            "{e}"
        );
        let e = c.status_error(503, "upstream\nfailed", Some("m"));
        assert_eq!(e, "server error 503 from http://127.0.0.1:9/v1: upstream failed");
        let e = c.status_error(400, r#"{"message":"bad field `top_k`"}"#, None);
        assert!(e.ends_with("answered 400: bad field `top_k`"), "{e}");
    }

    #[test]
    fn refused_connection_is_named() {
        // A loopback port that was just free: nothing listens there.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let e = client_at(port).models().unwrap_err();
        assert!(
            e.contains("connection refused") && e.contains(&format!("127.0.0.1:{port}")),
            "{e}"
        );
        assert!(!e.contains('\n'));
    }
}
