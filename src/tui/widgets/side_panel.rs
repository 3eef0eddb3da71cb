//! The performance side panel (decode rate + sparkline, prefill, context, KV, speculation, warm-up,
//! residency, device memory, backend, think and sampling settings) and its one-line strip form for
//! narrow terminals. Everything shown comes from worker events (`App::metrics`). With a remote server
//! the body below the sparkline is `remote_panel`'s.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph, Sparkline};

use super::{Palette, bar, fmt_count, fmt_secs};
use crate::engine::events::WarmupPhase;
use crate::engine::metrics::tokens_per_second;
use crate::tui::app::App;
use crate::tui::config::think_name;
use crate::units::{fmt_bytes, fmt_bytes_pair};

pub(super) fn kv<'a>(key: &str, val: String, p: &Palette) -> Line<'a> {
    Line::from(vec![
        Span::styled(format!("{key:<9}"), Style::default().fg(p.dim)),
        Span::styled(val, Style::default().add_modifier(Modifier::BOLD)),
    ])
}

pub(super) fn gauge_line<'a>(frac: f64, width: usize, color: ratatui::style::Color) -> Line<'a> {
    Line::from(Span::styled(bar(frac, width), Style::default().fg(color)))
}

pub(super) fn section<'a>(title: &str, width: usize, p: &Palette) -> Line<'a> {
    let rest = width.saturating_sub(title.chars().count() + 3);
    Line::from(Span::styled(
        format!("─ {title} {}", "─".repeat(rest)),
        Style::default().fg(p.dim),
    ))
}

/// The lines below the sparkline.
fn body_lines(app: &App, w: usize, p: &Palette) -> Vec<Line<'static>> {
    let m = &app.metrics;
    let mut out = Vec::new();
    // Prefill: live progress while it runs, else the last turn's figures.
    if let Some(pf) = m.prefill.as_ref().filter(|pf| pf.total > 0) {
        let frac = pf.done as f64 / pf.total as f64;
        let eta = pf.eta_secs().map_or("–".to_string(), fmt_secs);
        out.push(kv("Prefill", format!("{:.0}% ETA {eta}", frac * 100.0), p));
        out.push(gauge_line(frac, w, p.accent));
        out.push(Line::from(Span::styled(
            format!("{} / {} tok", fmt_count(pf.done as u64), fmt_count(pf.total as u64)),
            Style::default().fg(p.dim),
        )));
    } else if let Some((tokens, t)) = m.last_prefill {
        let s = t.as_secs_f64();
        out.push(kv(
            "Prefill",
            format!("{} tok in {}", fmt_count(tokens as u64), fmt_secs(s)),
            p,
        ));
        let live = m.live.as_ref();
        let tps = live
            .and_then(|l| l.prefill_tps)
            .or_else(|| tokens_per_second(tokens as u64, t))
            .unwrap_or(0.0);
        out.push(kv("", format!("{tps:.1} t/s"), p));
        if let Some(lat) = live.and_then(|l| l.prefill_latency) {
            out.push(kv("Latency", format!("{} 1st token", fmt_secs(lat.as_secs_f64())), p));
        }
    } else {
        out.push(kv("Prefill", "–".into(), p));
    }
    // Context and KV.
    let ctx = m.model.as_ref().map_or(app.config.ctx, |i| i.ctx).max(1);
    out.push(kv(
        "Context",
        format!("{} / {}", fmt_count(m.context_used as u64), fmt_count(ctx as u64)),
        p,
    ));
    let cfrac = m.context_used as f64 / ctx as f64;
    out.push(gauge_line(cfrac, w, if cfrac > 0.9 { p.error } else { p.good }));
    let kv_bytes = m.live.as_ref().map(|l| l.kv_bytes).filter(|&b| b > 0);
    if let Some(b) = kv_bytes.or(m.model.as_ref().map(|i| i.kv_bytes)) {
        out.push(kv("KV cache", fmt_bytes(b), p));
    }
    if let Some(f) = m.speculation.filter(|f| f.cycles > 0) {
        out.push(kv("Drafts", format!("{:.2} tok/cycle", f.tokens_per_cycle()), p));
        out.push(kv("", format!("{} of {} kept", f.accepted, f.drafted), p));
    }

    out.push(section("Model", w, p));
    if let Some(wu) = &m.warmup {
        let frac = if wu.total_bytes > 0 {
            wu.done_bytes as f64 / wu.total_bytes as f64
        } else {
            1.0
        };
        let what = match wu.phase {
            WarmupPhase::PageIn => "Warm-up",
            WarmupPhase::CopyToDevice | WarmupPhase::CopyFromDisk => "Upload",
        };
        if wu.finished {
            out.push(kv(what, format!("done in {}", fmt_secs(wu.elapsed.as_secs_f64())), p));
        } else {
            let eta = wu.eta_secs().map_or("–".to_string(), fmt_secs);
            out.push(kv(what, format!("{:.0}% ETA {eta}", frac * 100.0), p));
            out.push(gauge_line(frac, w, p.warn));
        }
        out.push(Line::from(Span::styled(
            format!(
                "{} {:.2} GiB/s{}",
                fmt_bytes_pair(wu.done_bytes, wu.total_bytes),
                wu.rate_gib_s(),
                match wu.phase {
                    WarmupPhase::PageIn => "",
                    WarmupPhase::CopyToDevice => " from cache",
                    WarmupPhase::CopyFromDisk => " from disk",
                }
            ),
            Style::default().fg(p.dim),
        )));
    }
    if let Some(r) = &m.residency {
        let frac = if r.total_bytes > 0 {
            r.resident_bytes as f64 / r.total_bytes as f64
        } else {
            0.0
        };
        out.push(kv("Resident", fmt_bytes_pair(r.resident_bytes, r.total_bytes), p));
        out.push(gauge_line(frac, w, p.accent));
        for (name, (res, tot)) in [
            ("experts", r.routed_experts),
            ("dense", r.dense),
            ("embed+head", r.embed_head),
        ] {
            if tot > 0 {
                out.push(Line::from(Span::styled(
                    format!(" {name:<10} {}", fmt_bytes_pair(res, tot)),
                    Style::default().fg(p.dim),
                )));
            }
        }
        if r.device_bytes > 0 {
            out.push(kv("On GPU", fmt_bytes(r.device_bytes), p));
        }
    } else if let Some(b) = m.live.as_ref().map(|l| l.device_weight_bytes).filter(|&b| b > 0) {
        out.push(kv("On GPU", fmt_bytes(b), p));
    }
    if let Some(dm) = m.live.as_ref().and_then(|l| l.device_memory).or(m.device_memory)
        && dm.total_bytes > 0
    {
        out.push(kv("VRAM", fmt_bytes_pair(dm.used_bytes, dm.total_bytes), p));
    }
    match &m.model {
        Some(info) => {
            // Which file: "ds4 q2 imatrix (0731)" for ds4's published files.
            out.push(kv("File", info.name.clone(), p));
            // A GPU says which arithmetic its kernels run ("hip · fast").
            let backend = match info.arithmetic {
                Some(a) => format!("{} · {a}", info.backend),
                None => info.backend.clone(),
            };
            out.push(kv("Backend", backend, p));
            if !info.device.is_empty() {
                out.push(Line::from(Span::styled(
                    format!(" {}", info.device),
                    Style::default().fg(p.dim),
                )));
            }
            out.push(kv(
                "Layers",
                format!("{} · vocab {}", info.n_layer, fmt_count(info.n_vocab as u64)),
                p,
            ));
            if let Some(wp) = &info.weights {
                out.push(kv("Weights", format!("{} {}", wp.mode(), fmt_bytes(wp.bytes)), p));
            }
        }
        None => out.push(kv(
            "Backend",
            format!("{} (loading)", crate::tui::config::backend_name(app.config.backend)),
            p,
        )),
    }

    out.extend(settings_lines(app, w, p));
    out
}

/// The Settings section (think mode and sampling), the same in both modes.
pub(super) fn settings_lines(app: &App, w: usize, p: &Palette) -> Vec<Line<'static>> {
    let s = &app.config.sampling;
    vec![
        section("Settings", w, p),
        kv("Think", think_name(app.config.think).to_string(), p),
        kv("Temp", format!("{}  top_p {}", s.temperature, s.top_p), p),
        kv("min_p", format!("{}  top_k {}", s.min_p, s.top_k), p),
        kv("Seed", s.seed.map_or("random".to_string(), |v| v.to_string()), p),
    ]
}

/// Draws the full side panel.
pub fn render(frame: &mut Frame, area: Rect, app: &App, p: &Palette) {
    let block = Block::default()
        .borders(Borders::LEFT | Borders::TOP)
        .border_style(Style::default().fg(p.dim))
        .title(Span::styled(" Performance (F2) ", Style::default().fg(p.accent)));
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let inner = Rect::new(inner.x + 1, inner.y, inner.width.saturating_sub(1), inner.height);
    let w = inner.width as usize;
    let [head, spark, body] =
        Layout::vertical([Constraint::Length(1), Constraint::Length(2), Constraint::Min(0)]).areas(inner);
    let rate = app.metrics.decode_tps();
    let rate_text = rate.map_or("–".to_string(), |r| format!("{r:.1} t/s"));
    let live = if app.metrics.generating { " live" } else { "" };
    frame.render_widget(
        Paragraph::new(Line::from(vec![
            Span::styled(format!("{:<9}", "Decode"), Style::default().fg(p.dim)),
            Span::styled(rate_text, Style::default().fg(p.good).add_modifier(Modifier::BOLD)),
            Span::styled(live, Style::default().fg(p.dim)),
        ])),
        head,
    );
    let n = spark.width as usize;
    let rates = &app.metrics.rates;
    let data: Vec<u64> = rates
        .iter()
        .skip(rates.len().saturating_sub(n))
        .map(|r| (r * 10.0).round() as u64)
        .collect();
    // Headroom above the peak so a steady rate reads as a level line, not a solid block.
    let peak = data.iter().copied().max().unwrap_or(1).max(1);
    frame.render_widget(
        Sparkline::default()
            .data(&data)
            .max(peak + peak / 4)
            .style(Style::default().fg(p.good)),
        spark,
    );
    let lines = if app.metrics.endpoint().is_some() {
        super::remote_panel::body_lines(app, w, p)
    } else {
        body_lines(app, w, p)
    };
    frame.render_widget(Paragraph::new(lines), body);
}

/// Draws the one-line metrics strip (narrow terminals).
pub fn render_strip(frame: &mut Frame, area: Rect, app: &App, p: &Palette) {
    let m = &app.metrics;
    let mut parts: Vec<String> = Vec::new();
    parts.push(m.decode_tps().map_or("– t/s".to_string(), |r| format!("{r:.1} t/s")));
    if m.endpoint().is_some() {
        let ttft = m.live.as_ref().and_then(|l| l.prefill_latency);
        parts.push(format!(
            "ttft {}",
            ttft.map_or("–".into(), |t| fmt_secs(t.as_secs_f64()))
        ));
    } else if let Some(pf) = m.prefill.as_ref().filter(|pf| pf.total > 0) {
        parts.push(format!("prefill {:.0}%", 100.0 * pf.done as f64 / pf.total as f64));
    } else if let Some((tok, t)) = m.last_prefill {
        parts.push(format!(
            "prefill {} in {}",
            fmt_count(tok as u64),
            fmt_secs(t.as_secs_f64())
        ));
    }
    let ctx = m.model.as_ref().map_or(app.config.ctx, |i| i.ctx);
    let ctx = if ctx > 0 { fmt_count(ctx as u64) } else { "?".into() };
    parts.push(format!("ctx {}/{ctx}", fmt_count(m.context_used as u64)));
    if let Some(wu) = m.warmup.as_ref().filter(|w| !w.finished && w.total_bytes > 0) {
        parts.push(format!(
            "warm-up {:.0}%",
            100.0 * wu.done_bytes as f64 / wu.total_bytes as f64
        ));
    }
    if let Some(info) = &m.model {
        parts.push(info.backend.clone());
    }
    parts.push(format!("think {}", think_name(app.config.think)));
    frame.render_widget(
        Paragraph::new(Span::styled(
            format!(" {}", parts.join(" │ ")),
            Style::default().fg(p.dim),
        )),
        area,
    );
}
