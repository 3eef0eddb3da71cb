//! Streaming-friendly markdown to styled, wrapped terminal lines.
//!
//! Line-based on purpose: a half-received answer renders sensibly at every token (an unclosed
//! fence is a code block so far, an unclosed `**` is literal text). Handles headings, emphasis,
//! strikethrough, inline code, bullet and numbered lists, block quotes, rules and fenced code
//! blocks with a language label. Owns word wrapping for the chat pane too.

use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use unicode_segmentation::UnicodeSegmentation;
use unicode_width::UnicodeWidthChar;

use super::Palette;

/// Renders `text` as markdown wrapped to `width` columns, each line starting with `indent`.
pub fn render(text: &str, width: usize, indent: &str, base: Style, p: &Palette) -> Vec<Line<'static>> {
    let mut out = Vec::new();
    let mut in_code: Option<String> = None;
    for raw in text.split('\n') {
        let line = raw.replace('\t', "    ");
        let trimmed = line.trim_start();
        if let Some(rest) = trimmed.strip_prefix("```") {
            if in_code.is_some() {
                in_code = None;
                out.push(code_rule(width, indent, "", false, p));
            } else {
                let lang = rest.trim().to_string();
                out.push(code_rule(width, indent, &lang, true, p));
                in_code = Some(lang);
            }
            continue;
        }
        if in_code.is_some() {
            let style = Style::default().fg(p.code_fg).bg(p.code_bg);
            let prefix = vec![
                Span::raw(indent.to_string()),
                Span::styled("│ ", Style::default().fg(p.dim)),
            ];
            out.extend(wrap_chars(&line, style, width, prefix));
            continue;
        }
        out.extend(render_block_line(&line, width, indent, base, p));
    }
    out
}

fn code_rule(width: usize, indent: &str, lang: &str, opening: bool, p: &Palette) -> Line<'static> {
    let label = if lang.is_empty() {
        String::new()
    } else {
        format!(" {lang} ")
    };
    let avail = width.saturating_sub(indent.len() + 1 + label.chars().count()).min(40);
    Line::from(vec![
        Span::raw(indent.to_string()),
        Span::styled(if opening { "╭" } else { "╰" }.to_string(), Style::default().fg(p.dim)),
        Span::styled(label, Style::default().fg(p.accent).add_modifier(Modifier::BOLD)),
        Span::styled("─".repeat(avail), Style::default().fg(p.dim)),
    ])
}

fn render_block_line(line: &str, width: usize, indent: &str, base: Style, p: &Palette) -> Vec<Line<'static>> {
    let trimmed = line.trim_start();
    let lead = line.len() - trimmed.len();
    // Headings: `#`..`######` then a space.
    let hashes = trimmed.chars().take_while(|&c| c == '#').count();
    if (1..=6).contains(&hashes) && trimmed[hashes..].starts_with(' ') {
        let mut style = base.fg(p.heading).add_modifier(Modifier::BOLD);
        if hashes == 1 {
            style = style.add_modifier(Modifier::UNDERLINED);
        }
        let spans = inline(trimmed[hashes + 1..].trim(), style, p);
        return wrap_spans(
            spans,
            width,
            vec![Span::raw(indent.to_string())],
            vec![Span::raw(indent.to_string())],
        );
    }
    // Horizontal rule.
    let compact: String = trimmed.chars().filter(|c| !c.is_whitespace()).collect();
    if compact.len() >= 3 && (compact.chars().all(|c| c == '-') || compact.chars().all(|c| c == '*')) {
        let n = width.saturating_sub(indent.len()).min(40);
        return vec![Line::from(vec![
            Span::raw(indent.to_string()),
            Span::styled("─".repeat(n), Style::default().fg(p.dim)),
        ])];
    }
    // Block quote.
    if let Some(rest) = trimmed.strip_prefix('>') {
        let style = base.fg(p.dim).add_modifier(Modifier::ITALIC);
        let prefix = vec![
            Span::raw(indent.to_string()),
            Span::styled("▎ ", Style::default().fg(p.dim)),
        ];
        return wrap_spans(inline(rest.trim_start(), style, p), width, prefix.clone(), prefix);
    }
    // Lists: "- ", "* ", "+ ", "N. ", "N) ".
    let pad = " ".repeat(lead.min(12));
    let bullet = if let Some(rest) = ["- ", "* ", "+ "].iter().find_map(|b| trimmed.strip_prefix(b)) {
        Some(("• ".to_string(), rest))
    } else {
        let digits = trimmed.chars().take_while(|c| c.is_ascii_digit()).count();
        let after = &trimmed[digits..];
        if (1..=9).contains(&digits) && (after.starts_with(". ") || after.starts_with(") ")) {
            Some((format!("{}. ", &trimmed[..digits]), &after[2..]))
        } else {
            None
        }
    };
    if let Some((marker, rest)) = bullet {
        let first = vec![
            Span::raw(format!("{indent}{pad}")),
            Span::styled(marker.clone(), Style::default().fg(p.accent)),
        ];
        let cont = vec![Span::raw(format!(
            "{indent}{pad}{}",
            " ".repeat(marker.chars().count())
        ))];
        return wrap_spans(inline(rest, base, p), width, first, cont);
    }
    let prefix = vec![Span::raw(indent.to_string())];
    wrap_spans(inline(line, base, p), width, prefix.clone(), prefix)
}

/// Inline markup: `code`, **bold**, *italic* / _italic_, ~~strike~~. Unmatched markers stay literal.
pub fn inline(text: &str, base: Style, p: &Palette) -> Vec<Span<'static>> {
    let mut spans: Vec<Span<'static>> = Vec::new();
    let mut plain = String::new();
    let mut rest = text;
    let flush = |plain: &mut String, spans: &mut Vec<Span<'static>>| {
        if !plain.is_empty() {
            spans.push(Span::styled(std::mem::take(plain), base));
        }
    };
    while let Some(c) = rest.chars().next() {
        let (marker, style): (&str, Style) = if rest.starts_with('`') {
            ("`", Style::default().fg(p.code_fg).bg(p.code_bg))
        } else if rest.starts_with("**") {
            ("**", base.add_modifier(Modifier::BOLD))
        } else if rest.starts_with("__") {
            ("__", base.add_modifier(Modifier::BOLD))
        } else if rest.starts_with("~~") {
            ("~~", base.add_modifier(Modifier::CROSSED_OUT))
        } else if rest.starts_with('*') || (rest.starts_with('_') && !plain.ends_with(|c: char| c.is_alphanumeric())) {
            (&rest[..1], base.add_modifier(Modifier::ITALIC))
        } else {
            plain.push(c);
            rest = &rest[c.len_utf8()..];
            continue;
        };
        let body = &rest[marker.len()..];
        match body.find(marker) {
            Some(end) if end > 0 && !body.starts_with(' ') => {
                flush(&mut plain, &mut spans);
                let inner = &body[..end];
                if marker == "`" {
                    spans.push(Span::styled(inner.to_string(), style));
                } else {
                    spans.extend(inline(inner, style, p));
                }
                rest = &body[end + marker.len()..];
            }
            _ => {
                plain.push_str(marker);
                rest = body;
            }
        }
    }
    flush(&mut plain, &mut spans);
    spans
}

fn char_width(c: char) -> usize {
    c.width().unwrap_or(0)
}

fn spans_width(spans: &[Span<'_>]) -> usize {
    spans
        .iter()
        .map(|s| s.content.chars().map(char_width).sum::<usize>())
        .sum()
}

/// Groups styled characters into spans of equal style.
fn to_spans(chars: &[(char, Style)]) -> Vec<Span<'static>> {
    let mut spans: Vec<Span<'static>> = Vec::new();
    for &(c, st) in chars {
        match spans.last_mut() {
            Some(last) if last.style == st => last.content.to_mut().push(c),
            _ => spans.push(Span::styled(c.to_string(), st)),
        }
    }
    spans
}

/// True for characters that join the preceding one into a grapheme (combining and spacing marks,
/// ZWJ, variation selectors), found by asking the grapheme segmenter about "a" + `c`.
fn attaches(c: char) -> bool {
    if (c as u32) < 0x300 {
        return false;
    }
    let mut buf = [0u8; 8];
    buf[0] = b'a';
    let n = 1 + c.encode_utf8(&mut buf[1..]).len();
    std::str::from_utf8(&buf[..n]).is_ok_and(|s| s.graphemes(true).count() == 1)
}

/// Drops what terminals disagree about: control characters (a random demo token can be ESC or BEL)
/// and marks with nothing to attach to (at the start or after a space: terminals and
/// `unicode-width` size such orphans differently, which shifts the rest of the row).
fn displayable(chars: Vec<(char, Style)>) -> Vec<(char, Style)> {
    let mut out: Vec<(char, Style)> = Vec::with_capacity(chars.len());
    for (c, st) in chars {
        if c.is_control() {
            continue;
        }
        if attaches(c) && out.last().is_none_or(|p| p.0.is_whitespace()) {
            continue;
        }
        out.push((c, st));
    }
    out
}

/// Greedy word wrap of styled spans to `width` columns. The first row starts with `first`, later
/// rows with `cont` (hanging indent). Words longer than a row are split by character.
pub fn wrap_spans(
    spans: Vec<Span<'static>>,
    width: usize,
    first: Vec<Span<'static>>,
    cont: Vec<Span<'static>>,
) -> Vec<Line<'static>> {
    let chars: Vec<(char, Style)> = spans
        .iter()
        .flat_map(|s| s.content.chars().map(move |c| (c, s.style)))
        .collect();
    let chars = displayable(chars);
    // Split into alternating runs of whitespace and non-whitespace.
    let mut words: Vec<&[(char, Style)]> = Vec::new();
    let mut start = 0;
    for i in 1..=chars.len() {
        if i == chars.len() || chars[i].0.is_whitespace() != chars[i - 1].0.is_whitespace() {
            if i > start {
                words.push(&chars[start..i]);
            }
            start = i;
        }
    }
    let mut lines = Vec::new();
    let mut prefix = first;
    let mut cur: Vec<(char, Style)> = Vec::new();
    let mut avail = width.saturating_sub(spans_width(&prefix)).max(1);
    let mut used = 0;
    let mut wrapped = false;
    let mut push_line = |prefix: &mut Vec<Span<'static>>, cur: &mut Vec<(char, Style)>| {
        while cur.last().is_some_and(|c| c.0 == ' ') {
            cur.pop();
        }
        let mut l = std::mem::replace(prefix, cont.clone());
        l.extend(to_spans(cur));
        lines.push(Line::from(l));
        cur.clear();
    };
    for w in words {
        let ww: usize = w.iter().map(|c| char_width(c.0)).sum();
        let is_space = w[0].0.is_whitespace();
        if used + ww <= avail {
            // Spaces that would start a wrapped row are dropped.
            if !(is_space && used == 0 && wrapped) {
                cur.extend_from_slice(w);
                used += ww;
            }
            continue;
        }
        if is_space {
            // A space run that overflows ends the row and is dropped.
            push_line(&mut prefix, &mut cur);
            avail = width.saturating_sub(spans_width(&prefix)).max(1);
            used = 0;
            wrapped = true;
            continue;
        }
        if used > 0 {
            push_line(&mut prefix, &mut cur);
            avail = width.saturating_sub(spans_width(&prefix)).max(1);
            used = 0;
            wrapped = true;
        }
        for &(c, st) in w {
            let cw = char_width(c);
            if used + cw > avail && used > 0 {
                push_line(&mut prefix, &mut cur);
                avail = width.saturating_sub(spans_width(&prefix)).max(1);
                used = 0;
                wrapped = true;
            }
            cur.push((c, st));
            used += cw;
        }
    }
    push_line(&mut prefix, &mut cur);
    lines
}

/// Character wrap that keeps every space (code): rows of at most `width` columns after `prefix`.
pub fn wrap_chars(text: &str, style: Style, width: usize, prefix: Vec<Span<'static>>) -> Vec<Line<'static>> {
    let avail = width.saturating_sub(spans_width(&prefix)).max(1);
    let mut lines = Vec::new();
    let mut cur = String::new();
    let mut used = 0;
    for (c, _) in displayable(text.chars().map(|c| (c, style)).collect()) {
        let cw = char_width(c);
        if used + cw > avail && used > 0 {
            let mut l = prefix.clone();
            l.push(Span::styled(std::mem::take(&mut cur), style));
            lines.push(Line::from(l));
            used = 0;
        }
        cur.push(c);
        used += cw;
    }
    let mut l = prefix;
    l.push(Span::styled(cur, style));
    lines.push(Line::from(l));
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain(lines: &[Line<'_>]) -> Vec<String> {
        lines
            .iter()
            .map(|l| l.spans.iter().map(|s| s.content.as_ref()).collect())
            .collect()
    }

    #[test]
    fn wraps_words_with_hanging_indent() {
        let p = Palette::dark();
        let lines = render("- alpha beta gamma delta", 14, "  ", Style::default(), &p);
        assert_eq!(plain(&lines), vec!["  • alpha beta", "    gamma", "    delta"]);
    }

    #[test]
    fn inline_markup_styles_and_unclosed_markers() {
        let p = Palette::dark();
        let spans = inline("a **b** `c` *d* **e", Style::default(), &p);
        let text: String = spans.iter().map(|s| s.content.as_ref()).collect();
        assert_eq!(text, "a b c d **e");
        let b = spans.iter().find(|s| s.content == "b").unwrap();
        assert!(b.style.add_modifier.contains(Modifier::BOLD));
        let d = spans.iter().find(|s| s.content == "d").unwrap();
        assert!(d.style.add_modifier.contains(Modifier::ITALIC));
        let c = spans.iter().find(|s| s.content == "c").unwrap();
        assert_eq!(c.style.bg, Some(p.code_bg));
    }

    #[test]
    fn fenced_code_keeps_spaces_and_labels_language() {
        let p = Palette::dark();
        let lines = render("# Title\n```rust\n    let x = 1;\n", 30, "", Style::default(), &p);
        let t = plain(&lines);
        assert_eq!(t[0], "Title");
        assert!(t[1].starts_with("╭ rust ─"), "{:?}", t[1]);
        assert_eq!(t[2], "│     let x = 1;");
    }

    #[test]
    fn control_characters_are_dropped() {
        let lines = wrap_spans(vec![Span::raw("a\u{1b}[2Jb\u{7}c")], 20, vec![], vec![]);
        assert_eq!(plain(&lines), vec!["a[2Jbc"]);
        let lines = wrap_chars("x\u{1b}y", Style::default(), 20, vec![]);
        assert_eq!(plain(&lines), vec!["xy"]);
    }

    #[test]
    fn orphan_combining_marks_are_dropped() {
        // U+0C41 (Telugu vowel sign U) after a consonant stays; after a space or first it is dropped.
        let lines = wrap_spans(
            vec![Span::raw("\u{0C41}x \u{0C15}\u{0C41} \u{0C41}\u{0C41}y")],
            40,
            vec![],
            vec![],
        );
        assert_eq!(plain(&lines), vec!["x \u{0C15}\u{0C41} y"]);
    }

    #[test]
    fn long_word_is_split() {
        let lines = wrap_spans(vec![Span::raw("abcdefghij")], 4, vec![], vec![]);
        assert_eq!(plain(&lines), vec!["abcd", "efgh", "ij"]);
    }
}
