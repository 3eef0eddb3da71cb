//! The `/sessions` overlay: the kept sessions, most recent first, with date, tokens, model and
//! whether a KV snapshot is on disk; the selected row is highlighted (Up/Down, Enter opens).

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;

use super::{Palette, overlay_block};
use crate::sessions::store::{SessionSummary, format_time};

/// One row: "N. title · date · tokens · model [kv]".
pub fn row(n: usize, s: &SessionSummary) -> String {
    let kv = if s.has_snapshot { " · kv" } else { "" };
    format!(
        "{n:>2}. {} · {} · {} tokens · {}{kv}",
        if s.title.is_empty() { "(untitled)" } else { &s.title },
        format_time(s.updated),
        s.tokens,
        s.model
    )
}

pub fn render(frame: &mut Frame, area: Rect, list: &[SessionSummary], selected: usize, p: &Palette) {
    let w = area.width.saturating_sub(4).min(100);
    let visible = (area.height.saturating_sub(4) as usize).max(1);
    let h = (list.len().min(visible) as u16 + 2).min(area.height);
    let r = Rect::new(area.x + (area.width - w) / 2, area.y + (area.height - h) / 2, w, h);
    let first = selected.saturating_sub(visible - 1);
    let lines: Vec<Line> = list
        .iter()
        .enumerate()
        .skip(first)
        .take(visible)
        .map(|(i, s)| {
            let style = if i == selected {
                Style::default().fg(p.accent).add_modifier(Modifier::REVERSED)
            } else {
                Style::default()
            };
            Line::from(Span::styled(row(i + 1, s), style))
        })
        .collect();
    let block = overlay_block(frame, r, " Sessions · Enter opens · Esc closes ", p.accent);
    frame.render_widget(Paragraph::new(lines).block(block), r);
}
