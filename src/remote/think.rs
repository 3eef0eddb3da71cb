//! Reasoning written inline in the answer text, `<think>…</think>`, for servers that do not split
//! it into `reasoning_content` (llama-server without a reasoning format, a vLLM or SGLang started
//! without `--reasoning-parser`).
//!
//! Owns the split of a stream of text pieces into reasoning and answer, with tags cut anywhere
//! across pieces. DeepSeek's template opens the think block in the prompt when thinking is on, so
//! such a server streams `reasoning…</think>answer` with no opening tag: the splitter then starts
//! in reasoning. A leading `<think>` is accepted (and dropped) either way.

use crate::model::detok::TextKind;

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

#[derive(Clone, Copy, Debug, PartialEq)]
enum State {
    /// Nothing but whitespace yet: the text may still open with `<think>`.
    Start,
    Reasoning,
    Answer,
}

/// Splits one turn's streamed text.
#[derive(Debug)]
pub struct ThinkSplitter {
    state: State,
    /// Where the text goes when it does not open with `<think>`.
    first: TextKind,
    /// Text held back: leading whitespace, or what may be the start of a tag.
    held: String,
}

impl ThinkSplitter {
    /// `reasoning_first`: the prompt opened the think block (thinking on).
    pub fn new(reasoning_first: bool) -> ThinkSplitter {
        ThinkSplitter {
            state: State::Start,
            first: if reasoning_first {
                TextKind::Reasoning
            } else {
                TextKind::Answer
            },
            held: String::new(),
        }
    }

    /// Splits `text`; whole pieces go to `out` (a partial tag is held until the next push).
    pub fn push(&mut self, text: &str, out: &mut Vec<(TextKind, String)>) {
        self.held.push_str(text);
        loop {
            match self.state {
                State::Start => {
                    let rest = self.held.trim_start();
                    if let Some(after) = rest.strip_prefix(OPEN) {
                        self.held = after.to_string();
                        self.state = State::Reasoning;
                    } else if OPEN.starts_with(rest) {
                        return; // whitespace or a partial "<think>": wait for more
                    } else {
                        self.state = match self.first {
                            TextKind::Reasoning => State::Reasoning,
                            TextKind::Answer => State::Answer,
                        };
                    }
                }
                State::Reasoning => {
                    if let Some(i) = self.held.find(CLOSE) {
                        let after = self.held.split_off(i + CLOSE.len());
                        self.held.truncate(i);
                        emit(out, TextKind::Reasoning, std::mem::take(&mut self.held));
                        self.held = after;
                        self.state = State::Answer;
                    } else {
                        let keep = partial_tag_len(&self.held, CLOSE);
                        let tail = self.held.split_off(self.held.len() - keep);
                        emit(out, TextKind::Reasoning, std::mem::replace(&mut self.held, tail));
                        return;
                    }
                }
                State::Answer => {
                    emit(out, TextKind::Answer, std::mem::take(&mut self.held));
                    return;
                }
            }
        }
    }

    /// The stream ended: what was held back is text after all.
    pub fn finish(&mut self, out: &mut Vec<(TextKind, String)>) {
        let kind = match self.state {
            State::Reasoning => TextKind::Reasoning,
            State::Start if self.held.trim().is_empty() => return,
            State::Start => self.first,
            State::Answer => TextKind::Answer,
        };
        emit(out, kind, std::mem::take(&mut self.held));
    }
}

fn emit(out: &mut Vec<(TextKind, String)>, kind: TextKind, text: String) {
    if !text.is_empty() {
        out.push((kind, text));
    }
}

/// Length of the longest suffix of `s` that is a proper prefix of `tag` (a tag cut by the piece
/// boundary).
fn partial_tag_len(s: &str, tag: &str) -> usize {
    (1..tag.len())
        .rev()
        .find(|&n| s.len() >= n && s.is_char_boundary(s.len() - n) && tag.starts_with(&s[s.len() - n..]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use TextKind::{Answer, Reasoning};

    /// Splits `pieces` and joins consecutive output of the same kind.
    fn split(reasoning_first: bool, pieces: &[&str]) -> Vec<(TextKind, String)> {
        let mut s = ThinkSplitter::new(reasoning_first);
        let mut out = Vec::new();
        for p in pieces {
            s.push(p, &mut out);
        }
        s.finish(&mut out);
        let mut joined: Vec<(TextKind, String)> = Vec::new();
        for (k, t) in out {
            match joined.last_mut() {
                Some((lk, lt)) if *lk == k => lt.push_str(&t),
                _ => joined.push((k, t)),
            }
        }
        joined
    }

    fn r(s: &str) -> (TextKind, String) {
        (Reasoning, s.into())
    }
    fn a(s: &str) -> (TextKind, String) {
        (Answer, s.into())
    }

    #[test]
    fn tags_in_one_piece() {
        assert_eq!(
            split(false, &["<think>why</think>Because."]),
            vec![r("why"), a("Because.")]
        );
        assert_eq!(split(false, &["\n<think>x</think>y"]), vec![r("x"), a("y")]);
        assert_eq!(split(false, &["plain answer"]), vec![a("plain answer")]);
    }

    #[test]
    fn tags_cut_at_every_position() {
        let text = "<think>let me see</think>The sea is blue.";
        for cut in 1..text.len() {
            let (x, y) = text.split_at(cut);
            assert_eq!(
                split(false, &[x, y]),
                vec![r("let me see"), a("The sea is blue.")],
                "cut at {cut}: {x:?} | {y:?}"
            );
        }
        // One byte at a time.
        let bytes: Vec<String> = text.chars().map(String::from).collect();
        let pieces: Vec<&str> = bytes.iter().map(String::as_str).collect();
        assert_eq!(split(true, &pieces), vec![r("let me see"), a("The sea is blue.")]);
    }

    #[test]
    fn opened_by_the_prompt() {
        // Thinking on: the template ends the prompt with <think>, the stream only closes it.
        assert_eq!(
            split(true, &["I should", " answer</th", "ink>", "Yes."]),
            vec![r("I should answer"), a("Yes.")]
        );
        // Never closed: all reasoning (a cut-off stream).
        assert_eq!(split(true, &["still thinking </thi"]), vec![r("still thinking </thi")]);
    }

    #[test]
    fn tag_like_text_stays_text() {
        assert_eq!(split(false, &["<thin", "king about it"]), vec![a("<thinking about it")]);
        assert_eq!(split(false, &["a < b"]), vec![a("a < b")]);
        // After the answer started, tags are literal.
        assert_eq!(split(false, &["x</think>y<think>z"]), vec![a("x</think>y<think>z")]);
        assert_eq!(split(true, &["é</think>ü"]), vec![r("é"), a("ü")]);
        assert_eq!(split(false, &["  ", "\n"]), vec![]);
    }
}
