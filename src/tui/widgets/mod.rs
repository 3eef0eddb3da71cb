//! The app's widgets, one file each, plus the colour palette they share.
//!
//! Every widget is a pure function of `App` (or a part of it) drawing into a `Frame` area.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::{Color, Style};
use ratatui::widgets::{Block, Borders, Clear};

use super::config::Theme;

pub mod chat;
pub mod help;
pub mod input;
pub mod markdown;
pub mod remote_panel;
pub mod sessions;
pub mod side_panel;
pub mod status_bar;

/// Clears `area` for an overlay (help, sessions, completions) and returns the bordered block, titled
/// `title` with a `border`-coloured frame, that the overlay draws in it.
pub fn overlay_block<'a>(frame: &mut Frame, area: Rect, title: &'a str, border: Color) -> Block<'a> {
    frame.render_widget(Clear, area);
    Block::default()
        .borders(Borders::ALL)
        .border_style(Style::default().fg(border))
        .title(title)
}

/// Colours of one theme.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Palette {
    pub user: Color,
    pub assistant: Color,
    pub accent: Color,
    pub heading: Color,
    pub dim: Color,
    pub code_fg: Color,
    pub code_bg: Color,
    pub error: Color,
    pub warn: Color,
    pub good: Color,
}

impl Palette {
    pub fn dark() -> Palette {
        Palette {
            user: Color::Cyan,
            assistant: Color::Green,
            accent: Color::LightBlue,
            heading: Color::LightMagenta,
            dim: Color::DarkGray,
            code_fg: Color::LightYellow,
            code_bg: Color::Rgb(40, 40, 48),
            error: Color::LightRed,
            warn: Color::Yellow,
            good: Color::LightGreen,
        }
    }

    pub fn light() -> Palette {
        Palette {
            user: Color::Blue,
            assistant: Color::Rgb(0, 110, 0),
            accent: Color::Blue,
            heading: Color::Magenta,
            dim: Color::Gray,
            code_fg: Color::Rgb(120, 60, 0),
            code_bg: Color::Rgb(235, 235, 240),
            error: Color::Red,
            warn: Color::Rgb(150, 100, 0),
            good: Color::Rgb(0, 120, 0),
        }
    }

    pub fn for_theme(t: Theme) -> Palette {
        match t {
            Theme::Dark => Palette::dark(),
            Theme::Light => Palette::light(),
        }
    }
}

/// Token counts: 950, 1.2k, 32k, 1.0M.
pub fn fmt_count(n: u64) -> String {
    if n >= 1_000_000 {
        format!("{:.1}M", n as f64 / 1e6)
    } else if n >= 10_000 {
        format!("{}k", n / 1000)
    } else if n >= 1000 {
        format!("{:.1}k", n as f64 / 1e3)
    } else {
        n.to_string()
    }
}

/// Durations: 850 ms, 3.2 s, 2m05s.
pub fn fmt_secs(s: f64) -> String {
    if !s.is_finite() {
        "–".to_string()
    } else if s < 1.0 {
        format!("{:.0} ms", s * 1000.0)
    } else if s < 60.0 {
        format!("{s:.1} s")
    } else {
        let t = s.round() as u64;
        format!("{}m{:02}s", t / 60, t % 60)
    }
}

/// A progress bar of `width` cells using eighth blocks.
pub fn bar(frac: f64, width: usize) -> String {
    let frac = if frac.is_finite() { frac.clamp(0.0, 1.0) } else { 0.0 };
    let eighths = (frac * width as f64 * 8.0).round() as usize;
    let full = eighths / 8;
    let part = eighths % 8;
    let mut s = "█".repeat(full);
    if full < width {
        if part > 0 {
            s.push([' ', '▏', '▎', '▍', '▌', '▋', '▊', '▉'][part]);
        } else {
            s.push('░');
        }
        s.push_str(&"░".repeat(width - full - 1));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(fmt_count(1234), "1.2k");
        assert_eq!(fmt_count(32768), "32k");
        assert_eq!(fmt_secs(0.25), "250 ms");
        assert_eq!(fmt_secs(125.0), "2m05s");
        assert_eq!(bar(0.5, 4), "██░░");
        assert_eq!(bar(1.0, 3), "███");
        assert_eq!(bar(0.0, 3), "░░░");
        assert_eq!(bar(0.5625, 2), "█▏");
    }
}
