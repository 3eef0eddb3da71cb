//! Server-sent events framing (the WHATWG `text/event-stream` format) as the chat-completions
//! stream uses it: `data:` lines, joined with newlines until a blank line ends the event; comment
//! lines (`:` keep-alives), `event:`, `id:` and `retry:` fields are read and dropped.
//!
//! Owns the line-level state machine only; what the data means is `chunk`.

/// One event's data, or the `[DONE]` sentinel that ends an OpenAI stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SseEvent {
    Data(String),
    Done,
}

/// Collects the lines of one event.
#[derive(Debug, Default)]
pub struct SseParser {
    data: String,
    has_data: bool,
}

impl SseParser {
    /// Feeds one line (its `\n` or `\r\n` may still be attached); returns the event a blank line
    /// completes.
    pub fn line(&mut self, line: &str) -> Option<SseEvent> {
        let line = line.strip_suffix('\n').unwrap_or(line);
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.is_empty() {
            return self.dispatch();
        }
        if line.starts_with(':') {
            return None;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        if field == "data" {
            if self.has_data {
                self.data.push('\n');
            }
            self.data.push_str(value);
            self.has_data = true;
        }
        None
    }

    /// The event still open when the stream ends (a server that closes without the final blank
    /// line).
    pub fn finish(&mut self) -> Option<SseEvent> {
        self.dispatch()
    }

    fn dispatch(&mut self) -> Option<SseEvent> {
        if !std::mem::take(&mut self.has_data) {
            return None;
        }
        let data = std::mem::take(&mut self.data);
        Some(if data.trim() == "[DONE]" {
            SseEvent::Done
        } else {
            SseEvent::Data(data)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Vec<SseEvent> {
        let mut p = SseParser::default();
        let mut out: Vec<SseEvent> = text.split_inclusive('\n').filter_map(|l| p.line(l)).collect();
        out.extend(p.finish());
        out
    }

    fn data(s: &str) -> SseEvent {
        SseEvent::Data(s.into())
    }

    #[test]
    fn events_end_at_blank_lines() {
        let got = parse("data: {\"a\":1}\n\ndata:{\"b\":2}\r\n\r\ndata: [DONE]\n\n");
        assert_eq!(got, vec![data("{\"a\":1}"), data("{\"b\":2}"), SseEvent::Done]);
    }

    #[test]
    fn multi_line_data_is_joined_and_other_fields_dropped() {
        let got = parse(": keep-alive\n\nevent: message\nid: 7\nretry: 10\ndata: one\ndata:  two\n\n");
        // Only one space after the colon is part of the syntax; the second belongs to the value.
        assert_eq!(got, vec![data("one\n two")]);
    }

    #[test]
    fn comment_only_and_empty_events_yield_nothing() {
        assert_eq!(parse(":ping\n\n\n\nevent: x\n\n"), vec![]);
        assert_eq!(parse("data\n\n"), vec![data("")]);
    }

    #[test]
    fn an_event_left_open_at_the_end_is_delivered() {
        assert_eq!(parse("data: {\"x\":1}\n"), vec![data("{\"x\":1}")]);
        assert_eq!(parse("data: [DONE]"), vec![SseEvent::Done]);
    }
}
