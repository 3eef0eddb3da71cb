//! Reading an assistant's tool calls back out of its streamed answer text (docs/prompt.md#tool-calls).
//!
//! [`CallParser`] takes the answer as it is decoded, in chunks split anywhere (even inside a UTF-8
//! character, through [`CallParser::push_bytes`]), and gives back plain text, each call as soon as
//! its `</｜DSML｜invoke>` has arrived, and warnings. The text before a call block loses its trailing
//! blank lines (the format puts a blank line before the block). A block that breaks the format is
//! given back as plain text (with the whitespace before it) and a warning, never an error: a
//! model's slip must not fail a request.
//!
//! Owns the parsing. Must not know the API shapes that carry calls (that is `serve`).

use super::tools::{CALLS_END, CALLS_START, INVOKE_END, INVOKE_START, Json, PARAM_END, PARAM_START, ToolCall};

/// What the parser gives back, in order.
#[derive(Clone, Debug, PartialEq)]
pub enum Piece {
    Text(String),
    /// A complete call (its `id` is empty: the API assigns one).
    Call(ToolCall),
    /// A malformed block, given back as text just before this.
    Warning(String),
}

#[derive(Debug)]
enum State {
    Text,
    /// Inside a call block: `raw` is its text since the block start or the last call given back.
    Block {
        raw: String,
    },
}

/// The streaming parser of one answer.
#[derive(Debug)]
pub struct CallParser {
    state: State,
    /// Text received and not yet given back.
    pending: String,
    /// Bytes of an incomplete UTF-8 character (push_bytes).
    partial: Vec<u8>,
    calls: usize,
}

impl Default for CallParser {
    fn default() -> Self {
        CallParser::new()
    }
}

/// Why an invoke could not be read yet.
enum Need {
    More,
    Bad(String),
}

impl CallParser {
    pub fn new() -> CallParser {
        CallParser {
            state: State::Text,
            pending: String::new(),
            partial: Vec::new(),
            calls: 0,
        }
    }

    /// Calls given back so far.
    pub fn calls(&self) -> usize {
        self.calls
    }

    /// Feed decoded text.
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.pending.push_str(text);
        let mut out = Vec::new();
        self.run(&mut out);
        out
    }

    /// Feed raw bytes; an incomplete trailing character waits for the next push.
    pub fn push_bytes(&mut self, bytes: &[u8]) -> Vec<Piece> {
        self.partial.extend_from_slice(bytes);
        let valid = match std::str::from_utf8(&self.partial) {
            Ok(s) => s.len(),
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            // Bytes that can never be UTF-8 are replaced, as the detokenizer does.
            Err(_) => {
                let text = String::from_utf8_lossy(&std::mem::take(&mut self.partial)).into_owned();
                return self.push(&text);
            }
        };
        let rest = self.partial.split_off(valid);
        let text = String::from_utf8(std::mem::replace(&mut self.partial, rest)).unwrap_or_default();
        self.push(&text)
    }

    /// The end of the answer: whatever is held is given back; an unterminated block as text.
    pub fn finish(&mut self) -> Vec<Piece> {
        let mut out = Vec::new();
        if !self.partial.is_empty() {
            self.pending
                .push_str(&String::from_utf8_lossy(&std::mem::take(&mut self.partial)));
        }
        self.run(&mut out);
        let pending = std::mem::take(&mut self.pending);
        match std::mem::replace(&mut self.state, State::Text) {
            State::Text => text(&mut out, pending),
            State::Block { raw } => {
                text(&mut out, raw + &pending);
                out.push(Piece::Warning("the answer ended inside a tool call block".into()));
            }
        }
        out
    }

    fn run(&mut self, out: &mut Vec<Piece>) {
        loop {
            let progressed = match &mut self.state {
                State::Text => self.run_text(out),
                State::Block { .. } => self.run_block(out),
            };
            if !progressed {
                return;
            }
        }
    }

    /// Give back text up to a block start (then enter the block) or up to what might still become
    /// one; a trailing whitespace run is held too, as it is dropped before a block.
    fn run_text(&mut self, out: &mut Vec<Piece>) -> bool {
        if let Some(p) = self.pending.find(CALLS_START) {
            let before = self.pending[..p].trim_end().to_string();
            // The blank line before a block is dropped, unless the block turns out malformed.
            let raw = format!("{}{CALLS_START}", &self.pending[before.len()..p]);
            text(out, before);
            self.pending.drain(..p + CALLS_START.len());
            self.state = State::Block { raw };
            return true;
        }
        let held = partial_suffix(&self.pending, CALLS_START);
        let cut = self.pending.len() - held;
        let cut = self.pending[..cut].trim_end().len();
        let given: String = self.pending.drain(..cut).collect();
        text(out, given);
        false
    }

    /// Read the next invoke or the block end; false when more text is needed.
    fn run_block(&mut self, out: &mut Vec<Piece>) -> bool {
        let State::Block { raw } = &mut self.state else {
            return false;
        };
        let body = self.pending.trim_start();
        let ws = self.pending.len() - body.len();
        if body.is_empty() {
            return false;
        }
        if body.starts_with(CALLS_END) {
            self.pending.drain(..ws + CALLS_END.len());
            self.state = State::Text;
            return true;
        }
        if CALLS_END.starts_with(body) || INVOKE_START.starts_with(body) {
            return false;
        }
        let bad = |raw: &mut String, why: String| (std::mem::take(raw), why);
        let failure = if let Some(invoke) = body.strip_prefix(INVOKE_START) {
            match read_invoke(invoke) {
                Ok((call, used)) => {
                    self.pending.drain(..ws + INVOKE_START.len() + used);
                    raw.clear();
                    self.calls += 1;
                    out.push(Piece::Call(call));
                    return true;
                }
                Err(Need::More) => return false,
                Err(Need::Bad(why)) => bad(raw, why),
            }
        } else {
            let shown: String = body.chars().take(24).collect();
            bad(raw, format!("expected an invoke or the block end, found \"{shown}\""))
        };
        let (raw, why) = failure;
        text(out, raw);
        out.push(Piece::Warning(format!("malformed tool call given back as text: {why}")));
        // The rest is read as text again (it may hold a later, well-formed block).
        self.state = State::Text;
        true
    }
}

fn text(out: &mut Vec<Piece>, s: String) {
    if s.is_empty() {
        return;
    }
    if let Some(Piece::Text(t)) = out.last_mut() {
        t.push_str(&s);
    } else {
        out.push(Piece::Text(s));
    }
}

/// Length of the longest proper prefix of `marker` that `s` ends with.
fn partial_suffix(s: &str, marker: &str) -> usize {
    (1..marker.len())
        .rev()
        .find(|&k| marker.is_char_boundary(k) && s.ends_with(&marker[..k]))
        .unwrap_or(0)
}

/// A cursor over an invoke's text; every literal it expects may be cut short by the chunking.
struct Cursor<'a> {
    s: &'a str,
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn rest(&self) -> &'a str {
        &self.s[self.pos..]
    }

    fn literal(&mut self, lit: &str, what: &str) -> Result<(), Need> {
        let rest = self.rest();
        if rest.starts_with(lit) {
            self.pos += lit.len();
            Ok(())
        } else if lit.starts_with(rest) {
            Err(Need::More)
        } else {
            Err(Need::Bad(format!("expected {what}")))
        }
    }

    /// The text up to `delim` (which is consumed).
    fn until(&mut self, delim: &str) -> Result<&'a str, Need> {
        let rest = self.rest();
        match rest.find(delim) {
            Some(p) => {
                self.pos += p + delim.len();
                Ok(&rest[..p])
            }
            None => Err(Need::More),
        }
    }

    /// Skip whitespace; the end of the text may still be followed by more.
    fn space(&mut self) -> Result<(), Need> {
        let rest = self.rest();
        let trimmed = rest.trim_start();
        self.pos += rest.len() - trimmed.len();
        if trimmed.is_empty() { Err(Need::More) } else { Ok(()) }
    }
}

/// One invoke after `<｜DSML｜invoke name="`: the call and the bytes read (through its end tag).
fn read_invoke(s: &str) -> Result<(ToolCall, usize), Need> {
    let mut c = Cursor { s, pos: 0 };
    let name = c.until("\"")?;
    if name.is_empty() || name.contains(['<', '>', '\n']) {
        return Err(Need::Bad(format!("bad tool name \"{name}\"")));
    }
    c.literal(">", "\">\" after the tool name")?;
    let mut fields: Vec<(String, Json)> = Vec::new();
    loop {
        c.space()?;
        let rest = c.rest();
        if rest.starts_with(INVOKE_END) {
            c.pos += INVOKE_END.len();
            break;
        }
        if INVOKE_END.starts_with(rest) || PARAM_START.starts_with(rest) {
            return Err(Need::More);
        }
        c.literal(PARAM_START, "a parameter or the invoke end")?;
        let key = c.until("\"")?.to_string();
        c.literal(" string=\"", "string=\"true|false\"")?;
        let is_str = match c.until("\"")? {
            "true" => true,
            "false" => false,
            other => return Err(Need::Bad(format!("string=\"{other}\" is not true or false"))),
        };
        c.literal(">", "\">\" after string=")?;
        let raw = c.until(PARAM_END)?;
        if fields.iter().any(|(k, _)| *k == key) {
            return Err(Need::Bad(format!("parameter \"{key}\" given twice")));
        }
        let value = if is_str {
            Json::Str(raw.to_string())
        } else {
            Json::parse(raw.trim()).map_err(|e| Need::Bad(format!("parameter \"{key}\": {e}")))?
        };
        fields.push((key, value));
    }
    let call = ToolCall {
        id: String::new(),
        name: name.to_string(),
        arguments: Json::Object(fields).to_python(),
    };
    Ok((call, c.pos))
}

/// A whole answer split at once: its text (without the call blocks) and its calls.
pub fn split_answer(answer: &str) -> (String, Vec<ToolCall>) {
    let mut p = CallParser::new();
    let mut pieces = p.push(answer);
    pieces.extend(p.finish());
    let mut content = String::new();
    let mut calls = Vec::new();
    for piece in pieces {
        match piece {
            Piece::Text(t) => content.push_str(&t),
            Piece::Call(c) => calls.push(c),
            Piece::Warning(_) => {}
        }
    }
    (content, calls)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partial_marker_is_held_and_text_before_a_block_loses_its_blank_line() {
        let mut p = CallParser::new();
        assert_eq!(p.push("Hi <｜DS"), vec![Piece::Text("Hi".into())]);
        assert_eq!(p.push("x"), vec![Piece::Text(" <｜DSx".into())]);
        assert_eq!(p.push("\n\n"), vec![]);
        let out = p.push("<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>");
        assert_eq!(
            out,
            vec![Piece::Call(ToolCall {
                id: String::new(),
                name: "f".into(),
                arguments: "{}".into()
            })]
        );
        assert_eq!(p.finish(), vec![]);
    }
}
