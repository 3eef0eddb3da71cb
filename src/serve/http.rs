//! HTTP/1.1 on a plain `TcpStream`: reading one request (head parsed by `httparse`, body by
//! `Content-Length` under a size limit) and writing one response. Every response closes the
//! connection (`Connection: close`), so one connection carries one request and the server owns the
//! socket for its whole life: that is what lets it notice a client that hangs up (disconnect.rs).
//!
//! Owns the wire framing and its limits. Must not know the API's routes or JSON shapes.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::error::{ApiError, reason_phrase};

/// Largest request head (request line and headers).
pub const MAX_HEAD_BYTES: usize = 16 * 1024;
/// Most headers in a request.
const MAX_HEADERS: usize = 64;
/// How long a client may take to send its request.
pub const READ_TIMEOUT: Duration = Duration::from_secs(30);
/// After refusing a body unread, how long its bytes are drained so that closing does not reset the
/// connection before the client has read the refusal.
const DRAIN_TIME: Duration = Duration::from_secs(2);

/// One parsed request.
#[derive(Debug)]
pub struct Request {
    pub method: String,
    /// The path without the query string.
    pub path: String,
    /// Header names lower-cased.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// Why no request could be read: answer with the error, or (client gone, nothing sent) just close.
#[derive(Debug)]
pub enum ReadError {
    Respond(ApiError),
    Gone,
}

fn position(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Read one request from `stream`, refusing a body over `max_body` bytes.
pub fn read_request(stream: &mut TcpStream, max_body: usize) -> Result<Request, ReadError> {
    let _ = stream.set_read_timeout(Some(READ_TIMEOUT));
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(p) = position(&buf, b"\r\n\r\n") {
            break p + 4;
        }
        if buf.len() > MAX_HEAD_BYTES {
            return Err(ReadError::Respond(ApiError::status(
                431,
                format!("request head over {MAX_HEAD_BYTES} bytes"),
            )));
        }
        match stream.read(&mut chunk) {
            Ok(0) => return Err(ReadError::Gone),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) && !buf.is_empty() => {
                return Err(ReadError::Respond(ApiError::status(
                    408,
                    "request head not received in time",
                )));
            }
            Err(_) => return Err(ReadError::Gone),
        }
    };
    let mut header_slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut parsed = httparse::Request::new(&mut header_slots);
    match parsed.parse(&buf[..head_end]) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) | Err(_) => {
            return Err(ReadError::Respond(ApiError::status(400, "malformed HTTP request head")));
        }
    }
    let method = parsed.method.unwrap_or_default().to_string();
    let target = parsed.path.unwrap_or("/");
    let path = target.split('?').next().unwrap_or("/").to_string();
    let headers: Vec<(String, String)> = parsed
        .headers
        .iter()
        .map(|h| {
            (
                h.name.to_ascii_lowercase(),
                String::from_utf8_lossy(h.value).trim().to_string(),
            )
        })
        .collect();
    let mut req = Request {
        method,
        path,
        headers,
        body: Vec::new(),
    };
    if req
        .header("transfer-encoding")
        .is_some_and(|v| !v.eq_ignore_ascii_case("identity"))
    {
        return Err(ReadError::Respond(ApiError::status(
            411,
            "chunked request bodies are not supported: send Content-Length",
        )));
    }
    let length = match req.header("content-length") {
        None => 0,
        Some(v) => v.parse::<usize>().map_err(|_| {
            ReadError::Respond(ApiError::status(400, format!("Content-Length \"{v}\" is not a number")))
        })?,
    };
    if length > max_body {
        return Err(ReadError::Respond(
            ApiError::status(413, format!("request body is {length} bytes, the limit is {max_body}"))
                .with_code("request_too_large"),
        ));
    }
    if req
        .header("expect")
        .is_some_and(|v| v.eq_ignore_ascii_case("100-continue"))
        && buf.len() == head_end
        && length > 0
    {
        let _ = stream.write_all(b"HTTP/1.1 100 Continue\r\n\r\n");
    }
    let mut body = buf.split_off(head_end);
    body.truncate(length);
    while body.len() < length {
        let want = (length - body.len()).min(chunk.len());
        match stream.read(&mut chunk[..want]) {
            Ok(0) | Err(_) => return Err(ReadError::Gone),
            Ok(n) => body.extend_from_slice(&chunk[..n]),
        }
    }
    req.body = body;
    Ok(req)
}

/// The status line and headers of a response with a body of `length` bytes of `content_type`.
pub fn head(status: u16, content_type: &str, length: Option<usize>) -> String {
    let mut h = format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: {content_type}\r\nConnection: close\r\nCache-Control: no-cache\r\n",
        reason_phrase(status)
    );
    match length {
        Some(n) => h.push_str(&format!("Content-Length: {n}\r\n")),
        None => h.push_str("Transfer-Encoding: chunked\r\n"),
    }
    if status == 401 {
        h.push_str("WWW-Authenticate: Bearer\r\n");
    }
    h.push_str("\r\n");
    h
}

/// Write a whole JSON response.
pub fn write_json(stream: &mut TcpStream, status: u16, body: &Value) -> std::io::Result<()> {
    let text = body.to_string();
    let mut out = head(status, "application/json", Some(text.len())).into_bytes();
    out.extend_from_slice(text.as_bytes());
    stream.write_all(&out)?;
    stream.flush()
}

pub fn write_error(stream: &mut TcpStream, e: &ApiError) -> std::io::Result<()> {
    write_json(stream, e.status, &e.body())
}

/// End the exchange: close our side, then read (and drop) what the client still sends for a short
/// while, so that unread request bytes do not turn the close into a reset that loses the response.
pub fn finish(stream: &mut TcpStream) {
    let _ = stream.shutdown(Shutdown::Write);
    let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
    let until = Instant::now() + DRAIN_TIME;
    let mut sink = [0u8; 16 * 1024];
    while Instant::now() < until {
        match stream.read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
    let _ = stream.shutdown(Shutdown::Both);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// Send `raw` to a fresh server socket and read the request from it.
    fn roundtrip(raw: &'static [u8], max_body: usize) -> Result<Request, ReadError> {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let client = std::thread::spawn(move || {
            let mut c = TcpStream::connect(addr).unwrap();
            c.write_all(raw).unwrap();
            let mut out = Vec::new();
            let _ = c.read_to_end(&mut out);
        });
        let (mut s, _) = l.accept().unwrap();
        let r = read_request(&mut s, max_body);
        drop(s);
        client.join().unwrap();
        r
    }

    #[test]
    fn reads_head_and_body() {
        let r = roundtrip(
            b"POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nAuthorization: Bearer k\r\n\r\nabcd",
            10,
        )
        .unwrap();
        assert_eq!((r.method.as_str(), r.path.as_str()), ("POST", "/v1/chat/completions"));
        assert_eq!(r.header("authorization"), Some("Bearer k"));
        assert_eq!(r.body, b"abcd");
    }

    #[test]
    fn refuses_oversized_chunked_and_malformed() {
        let status = |r: Result<Request, ReadError>| match r {
            Err(ReadError::Respond(e)) => e.status,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            status(roundtrip(
                b"POST / HTTP/1.1\r\nContent-Length: 11\r\n\r\nhello world",
                10
            )),
            413
        );
        assert_eq!(
            status(roundtrip(
                b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
                10
            )),
            411
        );
        assert_eq!(status(roundtrip(b"GARBAGE\x01 / HTTP/1.1\r\n\r\n", 10)), 400);
        assert_eq!(
            status(roundtrip(b"POST / HTTP/1.1\r\nContent-Length: ten\r\n\r\n", 10)),
            400
        );
    }
}
