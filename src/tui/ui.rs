//! The pure render function: `draw(frame, &app)` lays out the screen and calls the widgets.
//!
//! Owns the screen layout (chat pane, side panel or strip, input box, status bar, overlays and the
//! "terminal too small" notice). Reads `App`, never changes it.

use ratatui::Frame;
use ratatui::layout::{Alignment, Constraint, Layout, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph, Wrap};

use super::app::{App, Phase};
use super::widgets::{self, Palette, overlay_block};

/// Smallest usable terminal.
pub const MIN_COLS: u16 = 60;
pub const MIN_ROWS: u16 = 15;
/// Width from which the full side panel fits next to the chat.
pub const PANEL_MIN_COLS: u16 = 100;
pub const PANEL_WIDTH: u16 = 36;

/// Screen regions of one frame.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Areas {
    pub chat: Rect,
    pub panel: Option<Rect>,
    /// One-line metrics strip used instead of the panel on narrow terminals.
    pub strip: Option<Rect>,
    pub input: Rect,
    pub status: Rect,
}

/// Splits `area` for `app`; `None` when the terminal is too small.
pub fn layout(area: Rect, app: &App) -> Option<Areas> {
    if area.width < MIN_COLS || area.height < MIN_ROWS {
        return None;
    }
    let input_rows = app.input.rows_needed(area.width.saturating_sub(2) as usize) + 2;
    let strip_rows = u16::from(app.side_panel && area.width < PANEL_MIN_COLS);
    let [main, strip, input, status] = Layout::vertical([
        Constraint::Min(3),
        Constraint::Length(strip_rows),
        Constraint::Length(input_rows),
        Constraint::Length(1),
    ])
    .areas(area);
    let (chat, panel) = if app.side_panel && area.width >= PANEL_MIN_COLS {
        let [c, p] = Layout::horizontal([Constraint::Min(20), Constraint::Length(PANEL_WIDTH)]).areas(main);
        (c, Some(p))
    } else {
        (main, None)
    };
    Some(Areas {
        chat,
        panel,
        strip: (strip_rows > 0).then_some(strip),
        input,
        status,
    })
}

/// Inner (text) area of the chat pane.
pub fn chat_inner(chat: Rect) -> Rect {
    // One column of margin on the right so text never touches the side panel.
    let r = chat_block("").inner(chat);
    Rect::new(r.x, r.y, r.width.saturating_sub(1), r.height)
}

fn chat_block(title: &str) -> Block<'_> {
    Block::default().borders(Borders::TOP).title(title)
}

/// Text width of the chat pane at the app's terminal size; `None` when the terminal is too small.
pub fn chat_width(app: &App) -> Option<usize> {
    let area = Rect::new(0, 0, app.size.0, app.size.1);
    layout(area, app).map(|a| chat_inner(a.chat).width as usize)
}

/// (total chat lines, visible rows) at the app's terminal size; used for scrolling.
pub fn chat_geometry(app: &App) -> (usize, usize) {
    let area = Rect::new(0, 0, app.size.0, app.size.1);
    match layout(area, app) {
        Some(a) => {
            let inner = chat_inner(a.chat);
            (
                widgets::chat::line_count(app, inner.width as usize),
                inner.height as usize,
            )
        }
        None => (0, 1),
    }
}

/// Draws the whole screen for `app`.
pub fn draw(frame: &mut Frame, app: &App) {
    let area = frame.area();
    let p = Palette::for_theme(app.config.theme);
    let Some(a) = layout(area, app) else {
        draw_too_small(frame, area, &p);
        return;
    };
    let title = format!(" ds4-chat · {} ", app.model_label);
    let block = chat_block(&title).border_style(Style::default().fg(p.dim));
    let inner = chat_inner(a.chat);
    frame.render_widget(block, a.chat);
    widgets::chat::render(frame, inner, app, &p);
    if let Some(panel) = a.panel {
        widgets::side_panel::render(frame, panel, app, &p);
    }
    if let Some(strip) = a.strip {
        widgets::side_panel::render_strip(frame, strip, app, &p);
    }
    let (title, hint) = input_title(app, &p);
    let focused = !app.show_help && !matches!(app.phase, Phase::Failed(_));
    widgets::input::render(frame, a.input, &app.input, title, &hint, focused, &p);
    draw_slash_hints(frame, a, app, &p);
    widgets::status_bar::render(frame, a.status, app, &p);
    if app.show_help {
        widgets::help::render(frame, area, &p);
    }
    if let Some(list) = &app.sessions.list {
        widgets::sessions::render(frame, area, list, app.sessions.selected, &p);
    }
}

fn input_title(app: &App, p: &Palette) -> (Line<'static>, String) {
    let (label, hint) = match &app.phase {
        Phase::Loading => (
            " Message (model loading) ",
            "Enter sends; the answer starts once the model is loaded",
        ),
        Phase::Busy => (" Message ", "generating… Esc cancels"),
        Phase::Cancelling => (" Message ", "cancelling…"),
        Phase::Failed(_) => (" Message ", "the model is unusable: press Esc or q to quit"),
        Phase::Idle => (
            " Message ",
            "Enter sends · Alt+Enter or Ctrl+J newline · / commands · ? help",
        ),
    };
    (
        Line::from(Span::styled(
            label,
            Style::default().fg(p.accent).add_modifier(Modifier::BOLD),
        )),
        hint.to_string(),
    )
}

fn draw_slash_hints(frame: &mut Frame, a: Areas, app: &App, p: &Palette) {
    let matches = app.slash_matches();
    if matches.is_empty() || app.show_help {
        return;
    }
    let rows = (matches.len() as u16).min(a.chat.height.saturating_sub(1)).max(1);
    let width = 52.min(a.input.width);
    let area = Rect::new(a.input.x + 1, a.input.y.saturating_sub(rows + 2), width, rows + 2);
    let lines: Vec<Line> = matches
        .iter()
        .take(rows as usize)
        .map(|c| {
            Line::from(vec![
                Span::styled(
                    format!("{:<11}", c.name),
                    Style::default().fg(p.accent).add_modifier(Modifier::BOLD),
                ),
                Span::styled(format!("{:<5}", c.arg), Style::default().fg(p.warn)),
                Span::styled(c.help.to_string(), Style::default().fg(p.dim)),
            ])
        })
        .collect();
    let block = overlay_block(frame, area, " Tab completes ", p.dim);
    frame.render_widget(Paragraph::new(lines).block(block), area);
}

fn draw_too_small(frame: &mut Frame, area: Rect, p: &Palette) {
    let text = vec![
        Line::from(Span::styled(
            "terminal too small",
            Style::default().fg(p.warn).add_modifier(Modifier::BOLD),
        )),
        Line::from(format!("{}×{}, need {MIN_COLS}×{MIN_ROWS}", area.width, area.height)),
        Line::from("enlarge the window · Ctrl+C quits"),
    ];
    let h = (text.len() as u16).min(area.height);
    let y = area.y + area.height.saturating_sub(h) / 2;
    frame.render_widget(
        Paragraph::new(text)
            .alignment(Alignment::Center)
            .wrap(Wrap { trim: true }),
        Rect::new(area.x, y, area.width, h),
    );
}
