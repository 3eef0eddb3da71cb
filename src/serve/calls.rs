//! The reply side of tool calls, shared by both APIs: the turn's streamed text split into reasoning,
//! answer text and calls (model::dsml), each call given an id, calls the request does not allow
//! given back as text, and the warnings of both (docs/serve.md#tool-calls). Stop sequences end the
//! answer text at their first match (the text that might still become one is held back).
//!
//! Owns that split and the ids. Must not know either API's JSON shapes.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::engine::events::TextKind;
use crate::model::dsml::{CallParser, Piece};
use crate::model::tools::{ToolCall, calls_block};

use super::tools::Tools;

/// One piece of a reply, in order.
#[derive(Clone, Debug, PartialEq)]
pub enum ReplyEvent {
    Reasoning(String),
    Content(String),
    /// A call, `index` counting from 0 within the reply.
    Call {
        index: usize,
        call: ToolCall,
    },
}

/// A new call id with `prefix` (`call_` for OpenAI, `toolu_` for Anthropic): unique in the process
/// and across restarts (the clock is part of it).
pub fn new_call_id(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    format!("{prefix}{nanos:016x}{n:08x}")
}

/// The split of one reply.
pub struct ReplyShaper {
    parser: Option<CallParser>,
    tools: Tools,
    id_prefix: &'static str,
    pub reasoning: String,
    pub content: String,
    pub calls: Vec<ToolCall>,
    pub warnings: Vec<String>,
    stops: Vec<String>,
    /// Answer text held back because a stop sequence may start in it.
    held: String,
    /// The stop sequence that ended the reply.
    pub stopped: Option<String>,
}

impl ReplyShaper {
    /// Calls are read only when the request has tools it allows to be called.
    pub fn new(tools: &Tools, id_prefix: &'static str) -> ReplyShaper {
        ReplyShaper {
            parser: tools.parse_calls().then(CallParser::new),
            tools: tools.clone(),
            id_prefix,
            reasoning: String::new(),
            content: String::new(),
            calls: Vec::new(),
            warnings: Vec::new(),
            stops: Vec::new(),
            held: String::new(),
            stopped: None,
        }
    }

    /// End the answer text at the first of `stops`.
    pub fn with_stops(mut self, stops: Vec<String>) -> ReplyShaper {
        self.stops = stops;
        self
    }

    pub fn push(&mut self, kind: TextKind, text: &str) -> Vec<ReplyEvent> {
        let mut out = Vec::new();
        if self.stopped.is_some() {
            return out;
        }
        match (kind, &mut self.parser) {
            (TextKind::Reasoning, _) => {
                self.reasoning.push_str(text);
                out.push(ReplyEvent::Reasoning(text.to_string()));
            }
            (TextKind::Answer, None) => self.content_event(text.to_string(), &mut out),
            (TextKind::Answer, Some(p)) => {
                let pieces = p.push(text);
                self.pieces(pieces, &mut out);
            }
        }
        out
    }

    /// The end of the reply: text held by the parser, an unterminated call as text.
    pub fn finish(&mut self) -> Vec<ReplyEvent> {
        let mut out = Vec::new();
        if self.stopped.is_some() {
            return out;
        }
        if let Some(p) = &mut self.parser {
            let pieces = p.finish();
            self.pieces(pieces, &mut out);
        }
        let held = std::mem::take(&mut self.held);
        self.emit(held, &mut out);
        out
    }

    fn emit(&mut self, text: String, out: &mut Vec<ReplyEvent>) {
        if text.is_empty() {
            return;
        }
        self.content.push_str(&text);
        match out.last_mut() {
            Some(ReplyEvent::Content(t)) => t.push_str(&text),
            _ => out.push(ReplyEvent::Content(text)),
        }
    }

    /// Answer text: up to a stop sequence, holding back what might still become one.
    fn content_event(&mut self, text: String, out: &mut Vec<ReplyEvent>) {
        if self.stopped.is_some() {
            return;
        }
        if self.stops.is_empty() {
            return self.emit(text, out);
        }
        self.held.push_str(&text);
        let first = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()).map(|p| (p, s.clone())))
            .min_by_key(|(p, _)| *p);
        if let Some((p, stop)) = first {
            let before = self.held[..p].to_string();
            self.held.clear();
            self.emit(before, out);
            self.stopped = Some(stop);
            return;
        }
        let longest = self.stops.iter().map(String::len).max().unwrap_or(1);
        let mut keep = self.held.len().saturating_sub(longest - 1);
        while !self.held.is_char_boundary(keep) {
            keep -= 1;
        }
        let given: String = self.held.drain(..keep).collect();
        self.emit(given, out);
    }

    fn pieces(&mut self, pieces: Vec<Piece>, out: &mut Vec<ReplyEvent>) {
        for piece in pieces {
            match piece {
                Piece::Text(t) => self.content_event(t, out),
                Piece::Warning(w) => self.warnings.push(w),
                Piece::Call(call) if !self.tools.allows(&call.name) => {
                    self.warnings.push(format!(
                        "a call of \"{}\", which the request does not allow, given back as text",
                        call.name
                    ));
                    let text = calls_block(std::slice::from_ref(&call));
                    self.content_event(text.trim_start().to_string(), out);
                }
                Piece::Call(mut call) => {
                    call.id = new_call_id(self.id_prefix);
                    let index = self.calls.len();
                    self.calls.push(call.clone());
                    out.push(ReplyEvent::Call { index, call });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::tools::ToolChoice;

    fn tools(choice: ToolChoice) -> Tools {
        Tools {
            names: vec!["a".into(), "b".into()],
            schemas: vec!["{}".into(), "{}".into()],
            choice,
        }
    }

    const TWO_CALLS: &str = "Sure.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"a\">\n\
<｜DSML｜parameter name=\"x\" string=\"false\">1</｜DSML｜parameter>\n</｜DSML｜invoke>\n\
<｜DSML｜invoke name=\"b\">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";

    #[test]
    fn calls_get_ids_and_disallowed_calls_become_text() {
        let mut s = ReplyShaper::new(&tools(ToolChoice::Auto), "call_");
        let mut ev = s.push(TextKind::Answer, TWO_CALLS);
        ev.extend(s.finish());
        assert_eq!(ev[0], ReplyEvent::Content("Sure.".into()));
        assert!(
            matches!(&ev[1], ReplyEvent::Call { index: 0, call } if call.arguments == "{\"x\": 1}" && call.id.starts_with("call_"))
        );
        assert!(matches!(&ev[2], ReplyEvent::Call { index: 1, call } if call.name == "b"));
        assert_ne!(s.calls[0].id, s.calls[1].id);

        let mut named = ReplyShaper::new(&tools(ToolChoice::Named("b".into())), "toolu_");
        named.push(TextKind::Answer, TWO_CALLS);
        named.finish();
        assert_eq!(named.calls.len(), 1);
        assert!(
            named.content.contains("<｜DSML｜invoke name=\"a\">"),
            "{}",
            named.content
        );
        assert_eq!(named.warnings.len(), 1);

        let mut stop = ReplyShaper::new(&tools(ToolChoice::None), "msg").with_stops(vec!["END".into(), "XY".into()]);
        let mut got = Vec::new();
        for piece in ["ab", "cE", "N", "D more", "tail"] {
            got.extend(stop.push(TextKind::Answer, piece));
        }
        got.extend(stop.finish());
        assert_eq!(
            got,
            vec![ReplyEvent::Content("ab".into()), ReplyEvent::Content("c".into())]
        );
        assert_eq!(stop.stopped.as_deref(), Some("END"));
        assert_eq!(stop.content, "abc");

        let mut none = ReplyShaper::new(&tools(ToolChoice::None), "call_");
        none.push(TextKind::Answer, TWO_CALLS);
        none.finish();
        assert!(none.calls.is_empty());
        assert_eq!(none.content, TWO_CALLS);
    }
}
