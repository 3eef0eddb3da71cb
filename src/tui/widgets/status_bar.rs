//! The one-line status bar: the app's state on the left, a transient message or key hints on the right.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;

use super::Palette;
use crate::tui::app::{App, Phase};

/// The left part: what the app is doing.
pub fn state_text(app: &App) -> String {
    match &app.phase {
        Phase::Loading => "◌ loading".to_string(),
        Phase::Idle => "● ready".to_string(),
        Phase::Cancelling => "◌ cancelling".to_string(),
        Phase::Failed(_) => "✖ error".to_string(),
        Phase::Busy => match app.metrics.prefill.as_ref() {
            Some(pf) if pf.total > 0 => format!("◐ prefill {:.0}%", 100.0 * pf.done as f64 / pf.total as f64),
            Some(_) => "◐ prefill".to_string(),
            None => match app.metrics.decode_tps() {
                Some(r) => format!("◉ generating {r:.1} t/s"),
                None => "◉ generating".to_string(),
            },
        },
    }
}

/// The right part: key hints for the current state.
pub fn hints(app: &App, width: u16) -> &'static str {
    let narrow = width < 100;
    if app.show_help {
        return "any key closes help";
    }
    match app.phase {
        Phase::Failed(_) => "Esc/q quit",
        Phase::Busy | Phase::Cancelling if narrow => "Esc cancel · F1 help",
        Phase::Busy | Phase::Cancelling => "Esc cancel · PgUp scroll · Tab reasoning · F1 help",
        _ if app.scroll_top.is_some() => "End follow · PgUp/PgDn scroll · F1 help",
        _ if narrow => "Enter send · F1 help · F2 panel · Esc Esc quit",
        _ => "Enter send · ↑ history · Tab reasoning · F1 help · F2 panel · Esc Esc quit",
    }
}

pub fn render(frame: &mut Frame, area: Rect, app: &App, p: &Palette) {
    let state = state_text(app);
    let state_color = match app.phase {
        Phase::Idle => p.good,
        Phase::Failed(_) => p.error,
        Phase::Busy => p.accent,
        _ => p.warn,
    };
    let right = match &app.status {
        Some(s) => Span::styled(s.clone(), Style::default().fg(p.warn)),
        None => Span::styled(hints(app, area.width), Style::default().fg(p.dim)),
    };
    let left = format!(" {state} ");
    let used = left.chars().count() + right.content.chars().count() + 1;
    let gap = (area.width as usize).saturating_sub(used);
    frame.render_widget(
        Paragraph::new(Line::from(vec![
            Span::styled(left, Style::default().fg(state_color).add_modifier(Modifier::BOLD)),
            Span::raw(" ".repeat(gap)),
            right,
        ])),
        area,
    );
}
