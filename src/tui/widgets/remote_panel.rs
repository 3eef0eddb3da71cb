//! The side panel's body when the answers come from a server (`--remote`): time to first token,
//! the server's own usage and timings, context used, where the endpoint is and which model answers;
//! the gauges that only the in-process engine has (warm-up, residency, KV cache, device) say
//! "remote" rather than disappearing. The decode rate and sparkline above it are the panel's own.

use ratatui::style::Style;
use ratatui::text::{Line, Span};

use super::side_panel::{gauge_line, kv, section, settings_lines};
use super::{Palette, fmt_count, fmt_secs};
use crate::tui::app::App;

/// The lines below the sparkline in remote mode.
pub fn body_lines(app: &App, w: usize, p: &Palette) -> Vec<Line<'static>> {
    let m = &app.metrics;
    let dim = Style::default().fg(p.dim);
    let mut out = Vec::new();
    let ttft = m.live.as_ref().and_then(|l| l.prefill_latency);
    out.push(kv("TTFT", ttft.map_or("–".into(), |t| fmt_secs(t.as_secs_f64())), p));
    // The server's figures of the last turn, when it sends them.
    match &m.server {
        Some(s) => {
            let prefill = match (s.prefill_ms, s.prefill_tps) {
                (Some(ms), Some(tps)) => Some(format!("prefill {} · {tps:.0} t/s", fmt_secs(ms / 1000.0))),
                (Some(ms), None) => Some(format!("prefill {}", fmt_secs(ms / 1000.0))),
                (None, Some(tps)) => Some(format!("prefill {tps:.0} t/s")),
                (None, None) => None,
            };
            let decode = s.decode_tps.map(|r| format!("decode {r:.1} t/s"));
            let mut first = true;
            for text in [prefill, decode].into_iter().flatten() {
                out.push(kv(if first { "Server" } else { "" }, text, p));
                first = false;
            }
            if let Some(n) = s.prompt_tokens {
                let cached = s
                    .cached_tokens
                    .map_or(String::new(), |c| format!(" ({} cached)", fmt_count(c as u64)));
                out.push(kv("Prompt", format!("{} tok{cached}", fmt_count(n as u64)), p));
            }
            if let Some(n) = s.completion_tokens {
                out.push(kv("Answer", format!("{} tok", fmt_count(n as u64)), p));
            }
            if first && s.prompt_tokens.is_none() && s.completion_tokens.is_none() {
                out.push(kv("Server", "no usage sent".into(), p));
            }
        }
        None => out.push(kv("Server", "–".into(), p)),
    }
    // Context: the server's size when its model list says.
    let ctx = m.model.as_ref().map_or(0, |i| i.ctx);
    if ctx > 0 {
        out.push(kv(
            "Context",
            format!("{} / {}", fmt_count(m.context_used as u64), fmt_count(ctx as u64)),
            p,
        ));
        let frac = m.context_used as f64 / ctx as f64;
        out.push(gauge_line(frac, w, if frac > 0.9 { p.error } else { p.good }));
    } else {
        out.push(kv("Context", format!("{} / ?", fmt_count(m.context_used as u64)), p));
    }

    out.push(section("Server", w, p));
    out.push(kv("Endpoint", String::new(), p));
    out.push(Line::from(Span::styled(
        format!(" {}", m.endpoint().unwrap_or_default()),
        dim,
    )));
    let model = m.model.as_ref().map_or("–".to_string(), |i| i.name.clone());
    out.push(kv("Model", String::new(), p));
    out.push(Line::from(Span::styled(format!(" {model}"), dim)));
    for key in ["Warm-up", "Resident", "KV cache", "Device"] {
        out.push(kv(key, "remote".into(), p));
    }
    out.extend(settings_lines(app, w, p));
    out
}
