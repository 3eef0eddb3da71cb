//! Streaming detokenizer (docs/prompt.md#decoding-and-streaming, #stop-conditions): sampled ids in, text deltas
//! out.
//!
//! Owns turning token bytes into display text while a turn streams: deltas are always whole UTF-8 (a
//! trailing incomplete sequence is held until the next token completes it, and flushed lossily at the
//! end), reasoning is told apart from the answer at `<think>` / `</think>` (the tags are never shown; they
//! are matched on the byte stream, so a tag split over several tokens is found too, and a partial tag
//! at the end is held back), and EOS ends the stream without being shown. Must not sample or render
//! prompts.
//!
//! The concatenated output always equals `String::from_utf8_lossy` of all token bytes with the tags
//! removed: holding back only ever delays bytes, and a tag (ASCII) always ends any pending invalid
//! sequence, so cutting there changes nothing.

use super::chat::ThinkMode;
use super::tokenizer::{THINK_END_STR, THINK_START_STR, Tokenizer};

/// Which stream a text delta belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TextKind {
    Reasoning,
    Answer,
}

/// A piece of display text of one kind (never empty, always whole UTF-8).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TextDelta {
    pub kind: TextKind,
    pub text: String,
}

/// Incremental decoder of one assistant turn.
#[derive(Clone, Debug)]
pub struct StreamDecoder {
    kind: TextKind,
    /// Bytes received but not yet shown: an incomplete UTF-8 tail or a possible tag prefix.
    pending: Vec<u8>,
    eos: u32,
    stopped: bool,
}

const TAGS: [(&[u8], TextKind); 2] = [
    (THINK_START_STR.as_bytes(), TextKind::Reasoning),
    (THINK_END_STR.as_bytes(), TextKind::Answer),
];

impl StreamDecoder {
    /// A decoder for a turn rendered with `think`: a turn opened with `<think>` starts in reasoning.
    pub fn new(tok: &Tokenizer, think: ThinkMode) -> StreamDecoder {
        let kind = if think.thinking() {
            TextKind::Reasoning
        } else {
            TextKind::Answer
        };
        Self::with_kind(tok.specials().eos, kind)
    }

    /// A decoder starting in `kind` that stops at `eos`.
    pub fn with_kind(eos: u32, kind: TextKind) -> StreamDecoder {
        StreamDecoder {
            kind,
            pending: Vec::new(),
            eos,
            stopped: false,
        }
    }

    /// Feed one sampled id. EOS stops the stream (it is not shown) and flushes everything; ids after
    /// the stop are ignored.
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Vec<TextDelta> {
        if self.stopped {
            return Vec::new();
        }
        if id == self.eos {
            self.stopped = true;
            return self.drain(true);
        }
        self.pending.extend_from_slice(tok.token_bytes_ref(id));
        self.drain(false)
    }

    /// Flush everything held back (end of turn for any reason): an incomplete UTF-8 tail becomes
    /// U+FFFD, a partial tag is shown as text.
    pub fn finish(&mut self) -> Vec<TextDelta> {
        self.stopped = true;
        self.drain(true)
    }

    /// Whether EOS was seen (or `finish` called).
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// The kind the next text will have.
    pub fn kind(&self) -> TextKind {
        self.kind
    }

    fn drain(&mut self, last: bool) -> Vec<TextDelta> {
        let mut out = Vec::new();
        // Complete tags: show what precedes them, switch kind, drop the tag.
        while let Some((pos, len, kind)) = find_tag(&self.pending) {
            let (text, _) = decode_lossy(&self.pending[..pos], true);
            push_delta(&mut out, self.kind, text);
            self.kind = kind;
            self.pending.drain(..pos + len);
        }
        // A suffix that may grow into a tag is held; what precedes it ends with ASCII '<' next, so any
        // incomplete sequence before it is final.
        let hold_tag = if last { 0 } else { partial_tag_suffix(&self.pending) };
        let avail = self.pending.len() - hold_tag;
        let (text, used) = decode_lossy(&self.pending[..avail], last || hold_tag > 0);
        push_delta(&mut out, self.kind, text);
        self.pending.drain(..used);
        out
    }
}

fn push_delta(out: &mut Vec<TextDelta>, kind: TextKind, text: String) {
    if text.is_empty() {
        return;
    }
    match out.last_mut() {
        Some(d) if d.kind == kind => d.text.push_str(&text),
        _ => out.push(TextDelta { kind, text }),
    }
}

/// Earliest complete tag in `b`: (position, length, kind after it).
fn find_tag(b: &[u8]) -> Option<(usize, usize, TextKind)> {
    (0..b.len()).find_map(|i| {
        TAGS.iter()
            .find(|(t, _)| b[i..].starts_with(t))
            .map(|&(t, k)| (i, t.len(), k))
    })
}

/// Length of the longest suffix of `b` that is a proper prefix of a tag.
fn partial_tag_suffix(b: &[u8]) -> usize {
    let longest = TAGS.iter().map(|(t, _)| t.len() - 1).max().unwrap_or(0);
    (1..=longest.min(b.len()))
        .rev()
        .find(|&n| {
            TAGS.iter()
                .any(|(t, _)| n < t.len() && t.starts_with(&b[b.len() - n..]))
        })
        .unwrap_or(0)
}

/// Decode like `String::from_utf8_lossy` (one U+FFFD per maximal invalid subpart). Unless `complete`,
/// an incomplete sequence at the very end is left undecoded. Returns the text and the bytes used.
fn decode_lossy(b: &[u8], complete: bool) -> (String, usize) {
    let mut s = String::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match std::str::from_utf8(&b[i..]) {
            Ok(v) => {
                s.push_str(v);
                i = b.len();
            }
            Err(e) => {
                let valid = e.valid_up_to();
                // The prefix up to `valid` was just checked.
                s.push_str(std::str::from_utf8(&b[i..i + valid]).unwrap_or_default());
                match e.error_len() {
                    Some(n) => {
                        s.push('\u{FFFD}');
                        i += valid + n;
                    }
                    None if complete => {
                        s.push('\u{FFFD}');
                        i = b.len();
                    }
                    None => {
                        i += valid;
                        break;
                    }
                }
            }
        }
    }
    (s, i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes_decoder(kind: TextKind) -> StreamDecoder {
        StreamDecoder::with_kind(u32::MAX, kind)
    }

    fn feed(d: &mut StreamDecoder, b: &[u8]) -> Vec<TextDelta> {
        d.pending.extend_from_slice(b);
        d.drain(false)
    }

    fn delta(kind: TextKind, text: &str) -> TextDelta {
        TextDelta {
            kind,
            text: text.to_string(),
        }
    }

    #[test]
    fn holds_incomplete_utf8_until_completed() {
        let mut d = bytes_decoder(TextKind::Answer);
        let e = "é".as_bytes(); // C3 A9
        assert_eq!(feed(&mut d, b"caf"), [delta(TextKind::Answer, "caf")]);
        assert_eq!(feed(&mut d, &e[..1]), []);
        assert_eq!(feed(&mut d, &e[1..]), [delta(TextKind::Answer, "é")]);
        let emoji = "😀".as_bytes();
        assert_eq!(feed(&mut d, &emoji[..3]), []);
        assert_eq!(d.finish(), [delta(TextKind::Answer, "\u{FFFD}")]);
    }

    #[test]
    fn tags_switch_kind_and_are_never_shown() {
        let mut d = bytes_decoder(TextKind::Reasoning);
        assert_eq!(
            feed(&mut d, b"let me think</th"),
            [delta(TextKind::Reasoning, "let me think")]
        );
        assert_eq!(feed(&mut d, b"ink>The answer"), [delta(TextKind::Answer, "The answer")]);
        assert_eq!(feed(&mut d, b" is <"), [delta(TextKind::Answer, " is ")]);
        assert_eq!(feed(&mut d, b"b>"), [delta(TextKind::Answer, "<b>")]);
        assert_eq!(
            feed(&mut d, b"x<think>y"),
            [delta(TextKind::Answer, "x"), delta(TextKind::Reasoning, "y")]
        );
        assert_eq!(feed(&mut d, b"<thin"), []);
        assert_eq!(d.finish(), [delta(TextKind::Reasoning, "<thin")]);
    }

    #[test]
    fn invalid_bytes_before_a_partial_tag_are_final() {
        let mut d = bytes_decoder(TextKind::Answer);
        // E2 82 is an incomplete sequence; '<' proves it will never complete.
        assert_eq!(feed(&mut d, b"a\xE2\x82<"), [delta(TextKind::Answer, "a\u{FFFD}")]);
        assert_eq!(feed(&mut d, b"/think>b"), [delta(TextKind::Answer, "b")]);
    }

    #[test]
    fn partial_tag_suffix_lengths() {
        assert_eq!(partial_tag_suffix(b"abc"), 0);
        assert_eq!(partial_tag_suffix(b"abc<"), 1);
        assert_eq!(partial_tag_suffix(b"abc</thin"), 6);
        assert_eq!(partial_tag_suffix(b"<think"), 6);
        assert_eq!(partial_tag_suffix(b"<think>"), 0);
        assert_eq!(partial_tag_suffix(b"<tx"), 0);
    }
}
