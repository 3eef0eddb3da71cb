//! The thread that reads one chat-completions stream: it sends the request, frames the answer's
//! lines into server-sent events and parses each into a `Chunk`, handing them to the worker over a
//! channel.
//!
//! Owns the blocking reads, so the worker stays free to notice Esc: a cancelled turn drops the
//! receiving end, and this thread closes the connection at its next read (or when the silence
//! timeout ends a stalled one). The thread carries the worker's name, so a panic in it reaches the
//! worker as a closed channel instead of restoring the terminal.

use std::io::{BufRead, BufReader};
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, Sender};

use serde_json::Value;

use super::chunk::{self, Chunk};
use super::client::Client;
use super::sse::{SseEvent, SseParser};

/// What the reading thread reports, in order; `End` or `Failed` is the last message.
#[derive(Debug)]
pub enum StreamMsg {
    Chunk(Chunk),
    /// The stream ended: `done` when the server sent `[DONE]`, false when it just closed.
    End {
        done: bool,
    },
    /// A one-line error: the request was refused, the connection broke, a timeout, bad data.
    Failed(String),
}

/// Starts reading the stream of `body` (for `model`) on its own thread.
pub fn start(client: Arc<Client>, body: Value, model: String) -> Receiver<StreamMsg> {
    let (tx, rx) = mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name(crate::engine::worker::WORKER_THREAD.into())
        .spawn(move || read(&client, &body, &model, &tx));
    if let Err(e) = spawned {
        let (tx, rx) = mpsc::channel();
        let _ = tx.send(StreamMsg::Failed(format!("cannot start the stream reader: {e}")));
        return rx;
    }
    rx
}

fn read(client: &Client, body: &Value, model: &str, tx: &Sender<StreamMsg>) {
    let reader = match client.open_stream(body, model) {
        Ok(r) => r,
        Err(e) => {
            let _ = tx.send(StreamMsg::Failed(e));
            return;
        }
    };
    let mut lines = BufReader::new(reader);
    let mut sse = SseParser::default();
    let mut line = Vec::new();
    loop {
        line.clear();
        let event = match lines.read_until(b'\n', &mut line) {
            Ok(0) => {
                // Closed: an event still open counts; then the end, without [DONE].
                if let Some(ev) = sse.finish()
                    && !forward(ev, tx)
                {
                    return;
                }
                let _ = tx.send(StreamMsg::End { done: false });
                return;
            }
            Ok(_) => sse.line(&String::from_utf8_lossy(&line)),
            Err(e) => {
                let _ = tx.send(StreamMsg::Failed(client.io_error(&e)));
                return;
            }
        };
        if let Some(ev) = event
            && !forward(ev, tx)
        {
            return;
        }
    }
}

/// Hands one event on; false when reading must stop (the end, an error, or nobody listening).
fn forward(ev: SseEvent, tx: &Sender<StreamMsg>) -> bool {
    let msg = match ev {
        SseEvent::Done => {
            let _ = tx.send(StreamMsg::End { done: true });
            return false;
        }
        SseEvent::Data(data) => match chunk::parse(&data) {
            Ok(c) => StreamMsg::Chunk(c),
            Err(e) => {
                let _ = tx.send(StreamMsg::Failed(e));
                return false;
            }
        },
    };
    tx.send(msg).is_ok()
}
