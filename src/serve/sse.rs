//! Server-sent events over a chunked HTTP/1.1 response: each event is `data: <json>\n\n` in its own
//! chunk, written and flushed as soon as it exists, and the stream ends with `data: [DONE]` (the
//! OpenAI streaming convention). Anthropic's streams name each event (`event: <name>` before the
//! data) and end without `[DONE]`. The format is a few lines of text, so no crate is needed for it.
//!
//! Owns the event framing. A failed write means the client is gone; the caller cancels.

use std::io::Write;
use std::net::TcpStream;

use serde_json::Value;

use super::http;

pub struct SseWriter<'a> {
    stream: &'a mut TcpStream,
    /// A write failed: the client is gone and nothing more is sent.
    broken: bool,
}

impl<'a> SseWriter<'a> {
    /// Send the response head (200, `text/event-stream`, chunked).
    pub fn start(stream: &'a mut TcpStream) -> SseWriter<'a> {
        let _ = stream.set_nodelay(true);
        let head = http::head(200, "text/event-stream", None);
        let broken = stream.write_all(head.as_bytes()).is_err();
        SseWriter { stream, broken }
    }

    fn chunk(&mut self, payload: &str) -> bool {
        if self.broken {
            return false;
        }
        let framed = format!("{:x}\r\n{payload}\r\n", payload.len());
        self.broken = self.stream.write_all(framed.as_bytes()).is_err();
        !self.broken
    }

    /// One `data:` event; false when the client is gone.
    pub fn event(&mut self, data: &Value) -> bool {
        self.chunk(&format!("data: {data}\n\n"))
    }

    /// One named event (`event: <name>` then `data: <json>`); false when the client is gone.
    pub fn named_event(&mut self, name: &str, data: &Value) -> bool {
        self.chunk(&format!("event: {name}\ndata: {data}\n\n"))
    }

    /// The end of the chunked body, without `[DONE]`.
    pub fn end(mut self) {
        if !self.broken {
            let _ = self.stream.write_all(b"0\r\n\r\n");
            self.broken = true;
        }
    }

    /// `data: [DONE]` and the end of the chunked body.
    pub fn done(mut self) {
        if self.chunk("data: [DONE]\n\n") {
            let _ = self.stream.write_all(b"0\r\n\r\n");
        }
    }

    /// Whether every write so far reached the socket.
    pub fn alive(&self) -> bool {
        !self.broken
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::net::TcpListener;

    #[test]
    fn events_are_chunks_ending_with_done() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let reader = std::thread::spawn(move || {
            let mut c = TcpStream::connect(addr).unwrap();
            let mut out = String::new();
            c.read_to_string(&mut out).unwrap();
            out
        });
        let (mut s, _) = l.accept().unwrap();
        let mut w = SseWriter::start(&mut s);
        assert!(w.event(&serde_json::json!({"a": 1})));
        w.done();
        drop(s);
        let out = reader.join().unwrap();
        let body = out.split("\r\n\r\n").nth(1).unwrap();
        assert!(out.starts_with("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"));
        assert!(out.contains("Transfer-Encoding: chunked\r\n"));
        assert_eq!(body, "f\r\ndata: {\"a\":1}\n\n\r\ne\r\ndata: [DONE]\n\n\r\n0");
    }
}
