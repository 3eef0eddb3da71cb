//! The help overlay (F1 / `?`): keys and slash commands in a centred two-column box, both read from
//! their tables (`app::keys::KEY_BINDINGS`, `app::commands::SLASH_COMMANDS`).

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;

use super::{Palette, overlay_block};
use crate::tui::app::commands::SLASH_COMMANDS;
use crate::tui::app::keys::KEY_BINDINGS;

pub fn render(frame: &mut Frame, area: Rect, p: &Palette) {
    let key_style = Style::default().fg(p.accent).add_modifier(Modifier::BOLD);
    let head = Style::default().add_modifier(Modifier::BOLD);
    let mut keys = vec![Line::from(Span::styled("Keys", head))];
    keys.extend(KEY_BINDINGS.iter().filter(|b| b.in_help).map(|b| {
        Line::from(vec![
            Span::styled(format!("{:<11}", b.label), key_style),
            Span::raw(b.help),
        ])
    }));
    let mut cmds = vec![Line::from(Span::styled("Commands", head))];
    cmds.extend(SLASH_COMMANDS.iter().map(|c| {
        Line::from(vec![
            Span::styled(format!("{:<13}", format!("{} {}", c.name, c.arg)), key_style),
            Span::raw(c.help),
        ])
    }));
    let two_cols = area.width >= 78;
    let rows = if two_cols {
        keys.len().max(cmds.len())
    } else {
        keys.len() + cmds.len() + 1
    };
    let w = if two_cols { 78 } else { area.width.min(40) };
    let h = (rows as u16 + 2).min(area.height);
    let r = Rect::new(area.x + (area.width - w) / 2, area.y + (area.height - h) / 2, w, h);
    let block = overlay_block(frame, r, " Help · any key closes ", p.accent);
    let inner = block.inner(r);
    frame.render_widget(block, r);
    let inner = Rect::new(inner.x + 1, inner.y, inner.width.saturating_sub(1), inner.height);
    if two_cols {
        let [a, b] = Layout::horizontal([Constraint::Length(38), Constraint::Min(0)]).areas(inner);
        frame.render_widget(Paragraph::new(keys), a);
        frame.render_widget(Paragraph::new(cmds), b);
    } else {
        keys.push(Line::default());
        keys.extend(cmds);
        frame.render_widget(Paragraph::new(keys), inner);
    }
}
