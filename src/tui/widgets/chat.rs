//! The chat pane: scrollable history of turns (user, dimmed collapsible reasoning, markdown answer),
//! app notes, the demo banner and the fatal-error block; and the cache of finished turns' wrapped
//! lines, which `App` refreshes after each update so that drawing only reads it.

use std::collections::HashMap;
use std::sync::Arc;

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;

use super::markdown::{self, wrap_spans};
use super::{Palette, fmt_count, fmt_secs};
use crate::engine::events::{FinishReason, ModelSource};
use crate::tui::app::{App, Item, Phase, Turn, TurnState};
use crate::tui::config::Theme;

const INDENT: &str = "  ";

/// True when the app runs the generated demo model.
pub fn is_demo(app: &App) -> bool {
    app.metrics.model.as_ref().is_some_and(|m| m.is_demo)
        || app
            .load
            .as_ref()
            .is_some_and(|l| matches!(l.source, ModelSource::Demo { .. }))
}

/// All chat lines at `width` columns, oldest first.
pub fn lines(app: &App, width: usize) -> Vec<Line<'static>> {
    blocks(app, width).iter().flat_map(|b| b.iter().cloned()).collect()
}

/// Number of chat lines at `width` columns.
pub fn line_count(app: &App, width: usize) -> usize {
    blocks(app, width).iter().map(|b| b.len()).sum()
}

/// Lines of one stretch of the chat, shared with the cache.
pub type ChatLines = Arc<Vec<Line<'static>>>;

/// What a finished turn's lines depend on: (turn id, width, selected, last item, reasoning shown,
/// light theme).
pub type ChatCacheKey = (u64, usize, bool, bool, bool, bool);

/// Wrapped lines of the finished turns, so a long history costs a lookup per turn per frame, not a
/// markdown pass. Holds the keys of the current items only (older ones are dropped on refresh).
#[derive(Clone, Debug, Default)]
pub struct ChatCache {
    lines: HashMap<ChatCacheKey, ChatLines>,
}

impl ChatCache {
    /// Turn layouts held.
    pub fn len(&self) -> usize {
        self.lines.len()
    }

    pub fn is_empty(&self) -> bool {
        self.lines.is_empty()
    }
}

/// The cache key of the finished turn `items[i]`; `None` for notes and turns in flight (those are
/// laid out on every frame).
fn cache_key(app: &App, i: usize, width: usize) -> Option<ChatCacheKey> {
    match &app.items[i] {
        Item::Turn(t) if !t.in_flight() => Some((
            t.id,
            width,
            app.selected == Some(i),
            i + 1 == app.items.len(),
            t.reasoning_visible(),
            app.config.theme == Theme::Light,
        )),
        _ => None,
    }
}

/// Lays out every finished turn of `app` missing from `cache` at `width`, and drops entries no
/// current turn uses.
pub fn refresh_cache(cache: &mut ChatCache, app: &App, width: usize) {
    let p = Palette::for_theme(app.config.theme);
    let mut live = 0;
    for (i, item) in app.items.iter().enumerate() {
        let (Item::Turn(t), Some(key)) = (item, cache_key(app, i, width)) else {
            continue;
        };
        live += 1;
        cache.lines.entry(key).or_insert_with(|| {
            let mut v = Vec::new();
            turn_lines(&mut v, t, width, key.2, key.3, &p);
            Arc::new(v)
        });
    }
    // Stale keys (another width, a toggled turn, removed turns) are dropped once they outnumber
    // the live ones, so a refresh per streamed token stays a lookup per turn.
    if cache.lines.len() > 2 * live + 16 {
        let keep: std::collections::HashSet<ChatCacheKey> =
            (0..app.items.len()).filter_map(|i| cache_key(app, i, width)).collect();
        cache.lines.retain(|k, _| keep.contains(k));
    }
}

/// The chat as consecutive blocks of lines. Finished turns come from the app's cache when it holds
/// them at `width` (it does after every update); otherwise they are laid out here, without storing.
pub fn blocks(app: &App, width: usize) -> Vec<ChatLines> {
    let p = Palette::for_theme(app.config.theme);
    let p = &p;
    let mut blocks: Vec<ChatLines> = Vec::new();
    let mut out: Vec<Line<'static>> = Vec::new();
    let text = |s: &str, style: Style| wrap_spans(vec![Span::styled(s.to_string(), style)], width, vec![], vec![]);
    if is_demo(app) {
        out.extend(text(
            "DEMO: a tiny random model of the DeepSeek V4 Flash architecture, generated in memory. Its answers are random text; the speeds are real for this tiny model.",
            Style::default().fg(p.warn).add_modifier(Modifier::BOLD),
        ));
        out.push(Line::default());
    }
    if app.items.is_empty() {
        match &app.phase {
            Phase::Loading => {
                let what = app.metrics.loading.clone().unwrap_or_else(|| "model".into());
                out.extend(text(&format!("Loading {what}…"), Style::default().fg(p.dim)));
            }
            Phase::Failed(_) => {}
            _ => out.extend(text(
                "Type a message and press Enter. F1 or ? shows keys and /commands.",
                Style::default().fg(p.dim),
            )),
        }
    }
    let selected = app.selected;
    for (i, item) in app.items.iter().enumerate() {
        match item {
            Item::Note { text: t, error } => {
                let style = if *error {
                    Style::default().fg(p.error)
                } else {
                    Style::default().fg(p.dim).add_modifier(Modifier::ITALIC)
                };
                let mark = if *error { "✖ " } else { "· " };
                out.extend(wrap_spans(
                    vec![Span::styled(t.clone(), style)],
                    width,
                    vec![Span::styled(mark, style)],
                    vec![Span::raw(INDENT)],
                ));
                out.push(Line::default());
            }
            Item::Turn(t) => {
                let is_last = i + 1 == app.items.len();
                let sel = selected == Some(i);
                if t.in_flight() {
                    turn_lines(&mut out, t, width, sel, is_last, p);
                    continue;
                }
                let cached = cache_key(app, i, width)
                    .and_then(|key| app.chat_cache.lines.get(&key).cloned())
                    .unwrap_or_else(|| {
                        let mut v = Vec::new();
                        turn_lines(&mut v, t, width, sel, is_last, p);
                        Arc::new(v)
                    });
                blocks.push(Arc::new(std::mem::take(&mut out)));
                blocks.push(cached);
            }
        }
    }
    if let Phase::Failed(msg) = &app.phase {
        let style = Style::default().fg(p.error).add_modifier(Modifier::BOLD);
        out.extend(wrap_spans(
            vec![Span::styled(msg.clone(), Style::default().fg(p.error))],
            width,
            vec![Span::styled("✖ error: ", style)],
            vec![Span::raw(INDENT)],
        ));
        out.extend(text("Press Esc, q or Ctrl+C to quit.", Style::default().fg(p.dim)));
    }
    blocks.push(Arc::new(out));
    blocks
}

fn turn_lines(out: &mut Vec<Line<'static>>, t: &Turn, width: usize, selected: bool, is_last: bool, p: &Palette) {
    let bar = if selected { "▶ " } else { "▌ " };
    // User message.
    out.push(Line::from(vec![
        Span::styled(bar, Style::default().fg(p.user)),
        Span::styled("You", Style::default().fg(p.user).add_modifier(Modifier::BOLD)),
    ]));
    for l in t.user.split('\n') {
        out.extend(wrap_spans(
            vec![Span::raw(l.to_string())],
            width,
            vec![Span::raw(INDENT)],
            vec![Span::raw(INDENT)],
        ));
    }
    out.push(Line::default());

    // Assistant header with the turn's figures.
    let mut header = vec![
        Span::styled(bar, Style::default().fg(p.assistant)),
        Span::styled(
            "DeepSeek",
            Style::default().fg(p.assistant).add_modifier(Modifier::BOLD),
        ),
    ];
    let s = &t.stats;
    let mut facts = Vec::new();
    if s.generated > 0 {
        facts.push(format!("{} tok", s.generated));
    }
    if let Some(tps) = s.decode_tps().filter(|_| !t.in_flight()) {
        facts.push(format!("{tps:.1} t/s"));
    }
    if s.prefill_tokens > 0 && !t.in_flight() {
        facts.push(format!(
            "prefill {} in {}",
            fmt_count(s.prefill_tokens as u64),
            fmt_secs(s.prefill_time.as_secs_f64())
        ));
    }
    if !facts.is_empty() {
        header.push(Span::styled(
            format!("  {}", facts.join(" · ")),
            Style::default().fg(p.dim),
        ));
    }
    out.push(Line::from(header));
    if let Some(n) = &t.note {
        out.extend(wrap_spans(
            vec![Span::styled(n.clone(), Style::default().fg(p.warn))],
            width,
            vec![Span::raw(INDENT)],
            vec![Span::raw(INDENT)],
        ));
    }

    // Reasoning: dimmed, collapsible.
    let rstyle = Style::default().fg(p.dim).add_modifier(Modifier::ITALIC);
    if !t.reasoning.is_empty() {
        let words = t.reasoning.split_whitespace().count();
        let thinking_now = t.in_flight() && t.answer.is_empty();
        if t.reasoning_visible() {
            let label = if thinking_now { "Thinking…" } else { "Reasoning" };
            out.push(Line::from(vec![
                Span::raw(INDENT),
                Span::styled(
                    format!("▾ {label}"),
                    Style::default().fg(p.dim).add_modifier(Modifier::BOLD),
                ),
                Span::styled(format!(" · {words} words · Tab hides"), Style::default().fg(p.dim)),
            ]));
            let prefix = vec![Span::raw(INDENT), Span::styled("│ ", Style::default().fg(p.dim))];
            for l in t.reasoning.trim_start_matches('\n').split('\n') {
                out.extend(wrap_spans(
                    vec![Span::styled(l.to_string(), rstyle)],
                    width,
                    prefix.clone(),
                    prefix.clone(),
                ));
            }
            if thinking_now && let Some(last) = out.last_mut() {
                last.spans.push(Span::styled("▍", Style::default().fg(p.dim)));
            }
        } else {
            out.push(Line::from(vec![
                Span::raw(INDENT),
                Span::styled("▸ Reasoning", Style::default().fg(p.dim).add_modifier(Modifier::BOLD)),
                Span::styled(format!(" · {words} words · Tab shows"), Style::default().fg(p.dim)),
            ]));
        }
    }

    // Answer: markdown, rendered on every token.
    if !t.answer.is_empty() {
        out.extend(markdown::render(
            t.answer.trim_start_matches('\n'),
            width,
            INDENT,
            Style::default(),
            p,
        ));
        if t.in_flight()
            && let Some(last) = out.last_mut()
        {
            last.spans.push(Span::styled("▍", Style::default().fg(p.assistant)));
        }
    }
    if let Some(e) = &t.error {
        out.extend(wrap_spans(
            vec![Span::styled(e.clone(), Style::default().fg(p.error))],
            width,
            vec![Span::styled("  ✖ ", Style::default().fg(p.error))],
            vec![Span::raw("    ")],
        ));
    }
    match &t.state {
        TurnState::Done(FinishReason::Cancelled) if t.error.is_some() => {}
        TurnState::Done(FinishReason::ContextFull) if t.error.is_some() => {}
        TurnState::Queued => out.push(status_line("waiting for the engine…", p.dim)),
        TurnState::Prefill if t.reasoning.is_empty() && t.answer.is_empty() => {
            out.push(status_line("reading the prompt (prefill)…", p.dim))
        }
        TurnState::Done(FinishReason::Cancelled) => out.push(status_line("[cancelled]", p.warn)),
        TurnState::Done(FinishReason::Length) => out.push(status_line("[stopped: max_tokens reached]", p.warn)),
        TurnState::Done(FinishReason::ContextFull) => {
            out.push(status_line("[stopped: context full — /clear or a larger /ctx]", p.warn))
        }
        TurnState::Failed(m) => out.extend(wrap_spans(
            vec![Span::styled(m.clone(), Style::default().fg(p.error))],
            width,
            vec![Span::styled("  ✖ ", Style::default().fg(p.error))],
            vec![Span::raw("    ")],
        )),
        _ => {}
    }
    if !is_last || !t.in_flight() {
        out.push(Line::default());
    }
}

fn status_line(s: &str, color: ratatui::style::Color) -> Line<'static> {
    Line::from(vec![
        Span::raw(INDENT),
        Span::styled(s.to_string(), Style::default().fg(color).add_modifier(Modifier::ITALIC)),
    ])
}

/// Draws the visible window of the chat into `area` (the pane's inner area).
pub fn render(frame: &mut Frame, area: Rect, app: &App, p: &Palette) {
    let blocks = blocks(app, area.width as usize);
    let total: usize = blocks.iter().map(|b| b.len()).sum();
    let h = area.height as usize;
    let max_top = total.saturating_sub(h);
    let top = app.scroll_top.unwrap_or(max_top).min(max_top);
    let visible: Vec<Line> = blocks
        .iter()
        .flat_map(|b| b.iter())
        .skip(top)
        .take(h)
        .cloned()
        .collect();
    frame.render_widget(Paragraph::new(visible), area);
    if top < max_top && area.height > 0 {
        let msg = format!(" ↓ {} more lines · End follows ", max_top - top);
        let w = (msg.chars().count() as u16).min(area.width);
        let r = Rect::new(area.x + area.width - w, area.y + area.height - 1, w, 1);
        frame.render_widget(
            Paragraph::new(Span::styled(
                msg,
                Style::default().fg(p.warn).add_modifier(Modifier::REVERSED),
            )),
            r,
        );
    }
}
