//! The repository's documentation holds together and the tree carries no development diary
//! (CONTRIBUTING.md, "House rules"):
//! * every relative link in the README, CONTRIBUTING.md, docs/, kernels/README.md and
//!   tests/hip-on-cuda/README.md resolves to a file in the tree, and a `#anchor` to a heading of the
//!   target (GitHub's slug rules);
//! * README.md stays a front door: at most 150 lines, its first code block holds the two commands;
//! * no tracked text file names numbered work runs, calls on test machines, our own tracker's issue
//!   numbers, which test machine could be had, or the run logs that used to record them.
//!
//! Needs `git` (the tracked-file list is `git ls-files`); a checkout without it fails with that reason.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;

const README_MAX_LINES: usize = 150;
/// A scan of fewer files than this did not see the tree (a wrong root or a failed `git ls-files`).
const MIN_FILES_SCANNED: usize = 100;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn tracked_files() -> Vec<String> {
    let out = Command::new("git")
        .args(["ls-files", "-z"])
        .current_dir(root())
        .output()
        .expect("repo_docs needs git on PATH to list the tracked files");
    assert!(
        out.status.success(),
        "git ls-files failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let list = String::from_utf8(out.stdout).expect("tracked paths are UTF-8");
    list.split('\0').filter(|p| !p.is_empty()).map(str::to_string).collect()
}

/// The tracked files a file's text can be read from (deleted-but-not-staged paths are skipped).
fn read_text(rel: &str) -> Option<String> {
    let bytes = std::fs::read(root().join(rel)).ok()?;
    if bytes.contains(&0) {
        return None;
    }
    String::from_utf8(bytes).ok()
}

// ---------------------------------------------------------------------------------------------
// Markdown: links and heading anchors

/// The markdown files whose links are checked.
fn linked_docs(tracked: &[String]) -> Vec<String> {
    tracked
        .iter()
        .filter(|p| {
            matches!(
                p.as_str(),
                "README.md" | "CONTRIBUTING.md" | "kernels/README.md" | "tests/hip-on-cuda/README.md"
            ) || (p.starts_with("docs/") && p.ends_with(".md"))
        })
        .cloned()
        .collect()
}

/// The lines of a markdown file outside fenced code blocks, with inline code spans blanked out.
fn prose_lines(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut fence: Option<&str> = None;
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_start();
        let marker = if t.starts_with("```") {
            Some("```")
        } else if t.starts_with("~~~") {
            Some("~~~")
        } else {
            None
        };
        match (fence, marker) {
            (None, Some(m)) => fence = Some(m),
            (Some(f), Some(m)) if f == m => fence = None,
            (None, None) => out.push((i + 1, blank_code_spans(line))),
            _ => {}
        }
    }
    out
}

fn blank_code_spans(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut in_code = false;
    for c in line.chars() {
        if c == '`' {
            in_code = !in_code;
            out.push(' ');
        } else {
            out.push(if in_code { ' ' } else { c });
        }
    }
    out
}

/// Targets of inline links `[text](target)` and reference definitions `[label]: target`.
fn link_targets(line: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let t = line.trim_start();
    if t.starts_with('[')
        && let Some(end) = t.find("]:")
        && let Some(target) = t[end + 2..].split_whitespace().next()
    {
        targets.push(target.trim_matches(|c| c == '<' || c == '>').to_string());
    }
    let bytes = line.as_bytes();
    let mut i = 0;
    while let Some(pos) = line[i..].find("](") {
        let start = i + pos + 2;
        let mut depth = 1;
        let mut end = start;
        while end < bytes.len() {
            match bytes[end] {
                b'(' => depth += 1,
                b')' => {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                _ => {}
            }
            end += 1;
        }
        let inner = line[start..end.min(line.len())].trim();
        if let Some(target) = inner.split_whitespace().next() {
            targets.push(target.trim_matches(|c| c == '<' || c == '>').to_string());
        }
        i = end.min(line.len());
        if i >= line.len() {
            break;
        }
    }
    targets
}

/// GitHub's anchor for a heading text: lower case, markdown links reduced to their text, every
/// character other than letters, digits, spaces, `-` and `_` dropped, spaces turned into `-`.
fn slug(heading: &str) -> String {
    let mut text = String::new();
    let mut rest = heading;
    // [text](url) -> text
    while let Some(open) = rest.find('[') {
        let Some(mid) = rest[open..].find("](") else { break };
        let Some(close) = rest[open + mid..].find(')') else {
            break;
        };
        text.push_str(&rest[..open]);
        text.push_str(&rest[open + 1..open + mid]);
        rest = &rest[open + mid + close + 1..];
    }
    text.push_str(rest);
    text.trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c),
            _ => None,
        })
        .collect()
}

/// Every anchor a markdown file's headings produce (duplicates numbered `-1`, `-2`, … as GitHub does).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = BTreeSet::new();
    for (_, line) in prose_lines_raw(text) {
        let t = line.trim_start();
        let hashes = t.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&hashes) || !t[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(t[hashes..].trim().trim_end_matches('#').trim());
        let n = seen.entry(base.clone()).or_insert(0);
        out.insert(if *n == 0 { base.clone() } else { format!("{base}-{n}") });
        *n += 1;
    }
    out
}

/// Lines outside fenced code blocks, unchanged (headings keep their code spans for the slug).
fn prose_lines_raw(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut in_fence = false;
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_start();
        if t.starts_with("```") || t.starts_with("~~~") {
            in_fence = !in_fence;
        } else if !in_fence {
            out.push((i + 1, line.to_string()));
        }
    }
    out
}

/// Resolves `target` as written in `doc` (a repository-relative path) to a repository-relative
/// path, or says why it is not a relative link to check.
fn resolve(doc: &str, target: &str) -> Option<PathBuf> {
    if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
        return None;
    }
    if target.starts_with('/') {
        return Some(PathBuf::from("(an absolute path is not a link into the repository)"));
    }
    let dir = Path::new(doc).parent().unwrap_or(Path::new(""));
    let mut parts: Vec<String> = Vec::new();
    for comp in dir.join(target).components() {
        match comp {
            std::path::Component::ParentDir => {
                // A link above the repository root cannot resolve inside it.
                parts.pop()?;
            }
            std::path::Component::CurDir => {}
            std::path::Component::Normal(p) => parts.push(p.to_string_lossy().into_owned()),
            _ => return Some(PathBuf::from("/")), // absolute: never a file of the tree
        }
    }
    Some(parts.iter().collect())
}

fn broken_links(doc: &str, text: &str) -> Vec<String> {
    let mut broken = Vec::new();
    for (line_no, line) in prose_lines(text) {
        for target in link_targets(&line) {
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target.as_str(), None),
            };
            let file = if path.is_empty() {
                Some(PathBuf::from(doc))
            } else {
                match resolve(doc, path) {
                    Some(p) => Some(p),
                    None if target.contains("://") || target.starts_with("mailto:") => continue,
                    None => {
                        broken.push(format!("{doc}:{line_no}: {target} leaves the repository"));
                        continue;
                    }
                }
            };
            let Some(file) = file else { continue };
            let full = root().join(&file);
            if !full.exists() {
                broken.push(format!(
                    "{doc}:{line_no}: {target} -> {} does not exist",
                    file.display()
                ));
                continue;
            }
            if let Some(anchor) = anchor.filter(|a| !a.is_empty())
                && full.extension().is_some_and(|e| e == "md")
            {
                let target_text = std::fs::read_to_string(&full).unwrap_or_default();
                if !anchors(&target_text).contains(anchor) {
                    broken.push(format!(
                        "{doc}:{line_no}: {target}: no heading of {} has the anchor #{anchor}",
                        file.display()
                    ));
                }
            }
        }
    }
    broken
}

#[test]
fn every_relative_link_in_the_docs_resolves() {
    let tracked = tracked_files();
    let docs = linked_docs(&tracked);
    for must in ["README.md", "CONTRIBUTING.md", "docs/README.md"] {
        assert!(docs.iter().any(|d| d == must), "{must} is not tracked");
    }
    let mut broken = Vec::new();
    let mut links = 0;
    for doc in &docs {
        let text = read_text(doc).unwrap_or_else(|| panic!("{doc}: not readable as UTF-8 text"));
        links += prose_lines(&text)
            .iter()
            .map(|(_, l)| link_targets(l).len())
            .sum::<usize>();
        broken.extend(broken_links(doc, &text));
    }
    // The README alone links into docs/, LICENSE and CONTRIBUTING.md: far more than this.
    assert!(
        links >= 50,
        "only {links} links found in {} files: the link parser is broken",
        docs.len()
    );
    assert!(
        broken.is_empty(),
        "{} broken links:\n{}",
        broken.len(),
        broken.join("\n")
    );
}

#[test]
fn readme_is_a_front_door() {
    let text = read_text("README.md").expect("README.md");
    let lines = text.lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines, at most {README_MAX_LINES}"
    );
    let mut in_block = false;
    let mut first_block = String::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            if in_block {
                break;
            }
            in_block = true;
            continue;
        }
        if in_block {
            first_block.push_str(line);
            first_block.push('\n');
        } else {
            assert!(
                !line.starts_with("## "),
                "README.md: a section ({line}) comes before the two commands"
            );
        }
    }
    for command in ["cargo run --release -- --demo", "cargo test --release"] {
        assert!(
            first_block.contains(command),
            "README.md's first code block lacks `{command}`:\n{first_block}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The diary: what a line must not say

fn is_word_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Byte offsets where `word` starts as a whole word in `lower` (already lower case).
fn word_starts<'a>(lower: &'a str, word: &'a str) -> impl Iterator<Item = usize> + 'a {
    lower
        .match_indices(word)
        .map(|(i, _)| i)
        .filter(move |&i| lower[..i].chars().next_back().is_none_or(|c| !is_word_char(c)))
}

/// The digits right after `s[at..]` (an optional `#` first when `hash`), if any, and where they end.
fn number_at(s: &str, at: usize, hash: bool) -> Option<usize> {
    let mut rest = &s[at..];
    let mut start = at;
    if hash && rest.starts_with('#') {
        rest = &rest[1..];
        start += 1;
    }
    let digits = rest.chars().take_while(char::is_ascii_digit).count();
    if digits == 0 {
        return None;
    }
    let end = start + digits;
    s[end..]
        .chars()
        .next()
        .is_none_or(|c| !c.is_alphanumeric())
        .then_some(end)
}

/// A numbered work run: the word "session" (or "sessions") and a number. The app's own message for
/// a chat session id that does not exist ("no session" and the id) is not one.
fn run_number(lower: &str) -> bool {
    word_starts(lower, "session").any(|i| {
        let mut after = i + "session".len();
        if lower[after..].starts_with('s') {
            after += 1;
        }
        lower[after..].starts_with(' ') && number_at(lower, after + 1, false).is_some() && !lower[..i].ends_with("no ")
    })
}

/// A call on a test machine: "call" (or "calls") and a number.
fn machine_call(lower: &str) -> bool {
    word_starts(lower, "call").any(|i| {
        let mut after = i + "call".len();
        if lower[after..].starts_with('s') {
            after += 1;
        }
        lower[after..].starts_with(' ') && number_at(lower, after + 1, false).is_some()
    })
}

/// A run log's name: a run number as a file-name part, such as `-s` and one or two digits followed
/// by `-` or `.log`/`.txt`/`.csv`, or `s` and digits followed by `-call`.
fn run_log_name(lower: &str) -> bool {
    let b = lower.as_bytes();
    for (i, _) in lower.match_indices('s') {
        let digits = b[i + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
        if !(1..=2).contains(&digits) {
            continue;
        }
        let after = &lower[i + 1 + digits..];
        let prev = lower[..i].chars().next_back();
        if after.starts_with("-call") && prev.is_none_or(|c| !c.is_alphanumeric()) {
            return true;
        }
        if prev == Some('-')
            && (after.starts_with('-')
                || after.starts_with(".log")
                || after.starts_with(".txt")
                || after.starts_with(".csv"))
            && (lower.contains(".log") || lower.contains(".txt") || lower.contains(".csv") || lower.contains("call"))
        {
            return true;
        }
    }
    false
}

/// An issue or pull request number of our own tracker. Upstream ones are sources, and are named
/// with their project right before: "ds4", an owner/repository path, or "upstream".
fn own_issue(lower: &str) -> bool {
    for word in ["issue", "issues", "pr", "prs", "pull request"] {
        for i in word_starts(lower, word) {
            let after = i + word.len();
            if !lower[after..].starts_with(' ') || number_at(lower, after + 1, true).is_none() {
                continue;
            }
            let before = &lower[lower[..i].char_indices().rev().nth(23).map_or(0, |(j, _)| j)..i];
            if !(before.contains("ds4") || before.contains('/') || before.contains("upstream")) {
                return true;
            }
        }
    }
    false
}

/// Notes about which test machine could be had, and the run logs' old home. Each phrase is split
/// in two so that this file does not carry it.
const AVAILABILITY_PHRASES: [[&str; 2]; 7] = [
    ["could not be", " started"],
    ["could be", " started"],
    ["could start", " only"],
    ["no h200", " could"],
    ["no h100", " could"],
    ["starts", " refused"],
    ["hip-on-cuda/", "results"],
];

fn diary_kind(line: &str) -> Option<&'static str> {
    let lower = line.to_lowercase();
    if run_number(&lower) {
        Some("a run number")
    } else if machine_call(&lower) {
        Some("a call on a test machine")
    } else if run_log_name(&lower) {
        Some("a run log's name")
    } else if own_issue(&lower) {
        Some("an issue number of our tracker")
    } else if AVAILABILITY_PHRASES.iter().any(|p| lower.contains(&p.concat())) {
        Some("which test machine could be had")
    } else {
        None
    }
}

#[test]
fn the_diary_patterns_match_what_they_describe() {
    // Built from pieces so that this file carries none of the phrases it forbids.
    let s = |parts: &[&str]| parts.concat();
    for (line, kind) in [
        (s(&["Sess", "ion 28's benchmark"]), "a run number"),
        (s(&["as in sess", "ions 25-27"]), "a run number"),
        (
            s(&["measured in the second c", "all 2 of the day"]),
            "a call on a test machine",
        ),
        (s(&["see h200-2026-12-02-s", "11-call1.log"]), "a run log's name"),
        (s(&["(", "s19-", "call2)"]), "a run log's name"),
        (s(&["closing notes of iss", "ue 14"]), "an issue number of our tracker"),
        (s(&["Iss", "ue #17 item 8"]), "an issue number of our tracker"),
        (
            s(&["no H200 co", "uld be st", "arted that day"]),
            "which test machine could be had",
        ),
    ] {
        assert_eq!(diary_kind(&line), Some(kind), "{line}");
    }
    for line in [
        "if text.contains(\"no session 7\")",
        "a chat session over one backend",
        "ds4 PR #133, #863",
        "ROCm/rocm-systems issue #10834",
        "the call to hipInit returned 101",
        "sessions/ID.json",
        "s1 = x2.mul_add(p.s[2], p.s[1]);",
        "one session opened from it",
        "upstream issue 695",
    ] {
        assert_eq!(diary_kind(line), None, "{line}");
    }
}

#[test]
fn no_tracked_file_carries_the_development_diary() {
    let tracked = tracked_files();
    let mut scanned = 0;
    let mut hits = Vec::new();
    for path in &tracked {
        if path.starts_with("tests/fixtures/") {
            continue; // third-party reference data, kept byte for byte
        }
        let Some(text) = read_text(path) else { continue }; // binary, or gone from the work tree
        scanned += 1;
        for (i, line) in text.lines().enumerate() {
            if let Some(kind) = diary_kind(line) {
                hits.push(format!("{path}:{}: {kind}: {}", i + 1, line.trim()));
            }
        }
    }
    assert!(
        scanned > MIN_FILES_SCANNED,
        "scanned only {scanned} text files of {} tracked: the scan did not see the tree",
        tracked.len()
    );
    assert!(
        hits.is_empty(),
        "{} lines narrate the development instead of describing the project (history belongs to git):\n{}",
        hits.len(),
        hits.join("\n")
    );
}
