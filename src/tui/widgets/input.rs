//! The multi-line input box: its editing state (text + cursor) and its rendering.
//!
//! Owns text editing only; what Enter means (send, slash command) is decided by `app`. Lines are
//! wrapped by character so the cursor position is exact.

use ratatui::Frame;
use ratatui::layout::{Position, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph};
use unicode_width::UnicodeWidthChar;

use super::Palette;

/// Most text rows the box grows to before it scrolls.
pub const MAX_ROWS: u16 = 8;

/// Text being typed and the cursor (a byte offset on a char boundary).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct InputState {
    pub text: String,
    pub cursor: usize,
}

impl InputState {
    pub fn is_empty(&self) -> bool {
        self.text.is_empty()
    }

    pub fn set(&mut self, text: &str) {
        self.text = text.to_string();
        self.cursor = self.text.len();
    }

    pub fn take(&mut self) -> String {
        self.cursor = 0;
        std::mem::take(&mut self.text)
    }

    pub fn insert_char(&mut self, c: char) {
        self.text.insert(self.cursor, c);
        self.cursor += c.len_utf8();
    }

    /// Inserts pasted text; CRLF and CR become LF, tabs become four spaces, other control
    /// characters are dropped.
    pub fn insert_str(&mut self, s: &str) {
        let clean: String = s
            .replace("\r\n", "\n")
            .replace('\r', "\n")
            .replace('\t', "    ")
            .chars()
            .filter(|&c| c == '\n' || !c.is_control())
            .collect();
        self.text.insert_str(self.cursor, &clean);
        self.cursor += clean.len();
    }

    fn prev_boundary(&self) -> Option<usize> {
        self.text[..self.cursor].char_indices().next_back().map(|(i, _)| i)
    }

    fn next_boundary(&self) -> Option<usize> {
        self.text[self.cursor..]
            .chars()
            .next()
            .map(|c| self.cursor + c.len_utf8())
    }

    pub fn backspace(&mut self) {
        if let Some(p) = self.prev_boundary() {
            self.text.replace_range(p..self.cursor, "");
            self.cursor = p;
        }
    }

    pub fn delete(&mut self) {
        if let Some(n) = self.next_boundary() {
            self.text.replace_range(self.cursor..n, "");
        }
    }

    pub fn left(&mut self) {
        if let Some(p) = self.prev_boundary() {
            self.cursor = p;
        }
    }

    pub fn right(&mut self) {
        if let Some(n) = self.next_boundary() {
            self.cursor = n;
        }
    }

    fn line_start(&self) -> usize {
        self.text[..self.cursor].rfind('\n').map_or(0, |i| i + 1)
    }

    fn line_end(&self) -> usize {
        self.text[self.cursor..]
            .find('\n')
            .map_or(self.text.len(), |i| self.cursor + i)
    }

    pub fn home(&mut self) {
        self.cursor = self.line_start();
    }

    pub fn end(&mut self) {
        self.cursor = self.line_end();
    }

    /// Deletes the word before the cursor (Ctrl+W).
    pub fn delete_word(&mut self) {
        let before = &self.text[..self.cursor];
        let trimmed = before.trim_end_matches(|c: char| c.is_whitespace());
        let start = trimmed.rfind(|c: char| c.is_whitespace()).map_or(0, |i| i + 1);
        self.text.replace_range(start..self.cursor, "");
        self.cursor = start;
    }

    /// Deletes from the line start to the cursor (Ctrl+U).
    pub fn delete_to_line_start(&mut self) {
        let s = self.line_start();
        self.text.replace_range(s..self.cursor, "");
        self.cursor = s;
    }

    /// Moves to the same column of the previous logical line; false when on the first line.
    pub fn up(&mut self) -> bool {
        let start = self.line_start();
        if start == 0 {
            return false;
        }
        let col = self.text[start..self.cursor].chars().count();
        let prev_start = self.text[..start - 1].rfind('\n').map_or(0, |i| i + 1);
        self.cursor = advance_chars(&self.text, prev_start, start - 1, col);
        true
    }

    /// Moves to the same column of the next logical line; false when on the last line.
    pub fn down(&mut self) -> bool {
        let end = self.line_end();
        if end == self.text.len() {
            return false;
        }
        let col = self.text[self.line_start()..self.cursor].chars().count();
        let next_start = end + 1;
        let next_end = self.text[next_start..]
            .find('\n')
            .map_or(self.text.len(), |i| next_start + i);
        self.cursor = advance_chars(&self.text, next_start, next_end, col);
        true
    }

    /// Wraps the text to `width` columns: rows of (byte start, byte end) and the cursor's (row, col).
    pub fn layout(&self, width: usize) -> (Vec<(usize, usize)>, (usize, usize)) {
        let width = width.max(1);
        let mut rows = Vec::new();
        let mut cursor_rc = (0, 0);
        let mut row_start = 0;
        let mut col = 0;
        for (i, c) in self.text.char_indices() {
            if i == self.cursor {
                cursor_rc = (rows.len(), col);
            }
            if c == '\n' {
                rows.push((row_start, i));
                row_start = i + 1;
                col = 0;
                continue;
            }
            let w = c.width().unwrap_or(0);
            if col + w > width {
                rows.push((row_start, i));
                row_start = i;
                col = 0;
                if i == self.cursor {
                    cursor_rc = (rows.len(), 0);
                }
            }
            col += w;
        }
        if self.cursor >= self.text.len() {
            if col >= width {
                rows.push((row_start, self.text.len()));
                row_start = self.text.len();
                col = 0;
            }
            cursor_rc = (rows.len(), col);
        }
        rows.push((row_start, self.text.len()));
        (rows, cursor_rc)
    }

    /// Rows of text the box needs at `width` (at least 1, at most `MAX_ROWS`).
    pub fn rows_needed(&self, width: usize) -> u16 {
        (self.layout(width).0.len() as u16).clamp(1, MAX_ROWS)
    }
}

fn advance_chars(text: &str, start: usize, end: usize, n: usize) -> usize {
    text[start..end].char_indices().nth(n).map_or(end, |(i, _)| start + i)
}

/// Draws the box: a border with `title`, the wrapped text scrolled so the cursor shows, and the
/// terminal cursor when `focused`.
pub fn render(
    frame: &mut Frame,
    area: Rect,
    input: &InputState,
    title: Line<'_>,
    hint: &str,
    focused: bool,
    p: &Palette,
) {
    let block = Block::default()
        .borders(Borders::ALL)
        .border_style(Style::default().fg(if focused { p.accent } else { p.dim }))
        .title(title);
    let inner = block.inner(area);
    frame.render_widget(block, area);
    if inner.width == 0 || inner.height == 0 {
        return;
    }
    let (rows, (crow, ccol)) = input.layout(inner.width as usize);
    let height = inner.height as usize;
    let first = (crow + 1).saturating_sub(height);
    let lines: Vec<Line> = if input.text.is_empty() {
        vec![Line::from(Span::styled(
            hint.to_string(),
            Style::default().fg(p.dim).add_modifier(Modifier::ITALIC),
        ))]
    } else {
        rows.iter()
            .skip(first)
            .take(height)
            .map(|&(s, e)| Line::from(input.text[s..e].to_string()))
            .collect()
    };
    frame.render_widget(Paragraph::new(lines), inner);
    if focused {
        frame.set_cursor_position(Position::new(
            inner.x + (ccol as u16).min(inner.width.saturating_sub(1)),
            inner.y + (crow - first) as u16,
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn editing_and_line_moves() {
        let mut s = InputState::default();
        s.insert_str("ab\r\ncdé");
        assert_eq!(s.text, "ab\ncdé");
        s.backspace();
        assert_eq!(s.text, "ab\ncd");
        assert!(s.up());
        assert_eq!(s.cursor, 2); // end of "ab"
        assert!(!s.up());
        s.home();
        assert!(s.down());
        assert_eq!(s.cursor, 3);
        s.end();
        s.delete_word();
        assert_eq!(s.text, "ab\n");
    }

    #[test]
    fn layout_wraps_and_places_cursor() {
        let mut s = InputState::default();
        s.insert_str("abcdef\ngh");
        let (rows, cur) = s.layout(4);
        assert_eq!(rows, vec![(0, 4), (4, 6), (7, 9)]);
        assert_eq!(cur, (2, 2));
        s.set("abcd");
        let (rows, cur) = s.layout(4);
        assert_eq!(rows.len(), 2);
        assert_eq!(cur, (1, 0));
    }
}
