//! The layer order of src/lib.rs holds: every `crate::` path (and every `super::` path that climbs to
//! the crate root) in src/ names a top-level module to the left of the importing file's own in the
//! `layers:` line of src/lib.rs's doc comment, and the top-level modules import each other without a
//! cycle. `#[cfg(test)]` code counts like any other. Comments and string literals are not code and
//! are skipped.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

const SRC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src");

/// The rank of each top-level module from the `layers:` line of src/lib.rs: `a → b → {c, d} → e`
/// gives a 0, b 1, c and d 2, e 3.
fn layer_ranks(lib: &str) -> BTreeMap<String, usize> {
    let line = lib
        .lines()
        .find_map(|l| l.trim_start_matches("//!").trim().strip_prefix("layers:"))
        .expect("src/lib.rs's doc comment has no `layers:` line");
    let mut ranks = BTreeMap::new();
    for (rank, step) in line.split('→').enumerate() {
        for name in step.trim().trim_start_matches('{').trim_end_matches('}').split(',') {
            let name = name.trim();
            assert!(
                !name.is_empty() && name.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
                "src/lib.rs: `{name}` in the layers line is not a module name"
            );
            assert!(
                ranks.insert(name.to_string(), rank).is_none(),
                "src/lib.rs: `{name}` is twice in the layers line"
            );
        }
    }
    ranks
}

/// The `pub mod x;` / `mod x;` declarations of src/lib.rs.
fn declared_modules(lib: &str) -> BTreeSet<String> {
    lib.lines()
        .filter_map(|l| {
            let l = l.trim();
            let l = l.strip_prefix("pub ").unwrap_or(l);
            l.strip_prefix("mod ")?.strip_suffix(';').map(str::to_string)
        })
        .collect()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `text` with comments, string literals and char literals blanked out (newlines kept, so offsets
/// and line numbers stay those of the file).
fn code_only(text: &str) -> Vec<char> {
    let s: Vec<char> = text.chars().collect();
    let mut out = s.clone();
    let blank = |out: &mut Vec<char>, from: usize, to: usize| {
        for c in &mut out[from..to.min(s.len())] {
            if *c != '\n' {
                *c = ' ';
            }
        }
    };
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut i = 0;
    while i < s.len() {
        let next = s.get(i + 1).copied();
        if s[i] == '/' && next == Some('/') {
            let end = s[i..].iter().position(|&c| c == '\n').map_or(s.len(), |p| i + p);
            blank(&mut out, i, end);
            i = end;
        } else if s[i] == '/' && next == Some('*') {
            let (mut depth, mut j) = (1, i + 2);
            while j < s.len() && depth > 0 {
                if s[j] == '/' && s.get(j + 1) == Some(&'*') {
                    depth += 1;
                    j += 2;
                } else if s[j] == '*' && s.get(j + 1) == Some(&'/') {
                    depth -= 1;
                    j += 2;
                } else {
                    j += 1;
                }
            }
            blank(&mut out, i, j);
            i = j;
        } else if s[i] == 'r' && (i == 0 || !ident(s[i - 1]) || s[i - 1] == 'b') && matches!(next, Some('#' | '"')) {
            // A raw string r"..." / r#"..."#, or an identifier starting with r.
            let hashes = s[i + 1..].iter().take_while(|&&c| c == '#').count();
            if s.get(i + 1 + hashes) != Some(&'"') {
                i += 1;
                continue;
            }
            let mut j = i + 2 + hashes;
            while j < s.len()
                && !(s[j] == '"' && s[j + 1..].iter().take(hashes).filter(|&&c| c == '#').count() == hashes)
            {
                j += 1;
            }
            let end = j + 1 + hashes;
            blank(&mut out, i, end);
            i = end;
        } else if s[i] == '"' {
            let mut j = i + 1;
            while j < s.len() && s[j] != '"' {
                j += if s[j] == '\\' { 2 } else { 1 };
            }
            blank(&mut out, i, j + 1);
            i = j + 1;
        } else if s[i] == '\'' {
            // A char literal ('x', '\n', '\u{..}'), or a lifetime ('a), which stays.
            if next == Some('\\') {
                let end = s[i + 2..]
                    .iter()
                    .position(|&c| c == '\'')
                    .map_or(s.len(), |p| i + 2 + p + 1);
                blank(&mut out, i, end);
                i = end;
            } else if s.get(i + 2) == Some(&'\'') {
                blank(&mut out, i, i + 3);
                i += 3;
            } else {
                i += 1;
            }
        } else {
            i += 1;
        }
    }
    out
}

/// One path from a file to another top-level module.
struct Import {
    line: usize,
    target: String,
    text: String,
}

/// The module path of a file below src/: src/a/b.rs and src/a/b/mod.rs are [a, b].
fn module_path(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let last = parts.pop().unwrap();
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" {
        parts.push(stem.to_string());
    }
    parts
}

/// The first segment of each item of a `{...}` use group starting at `at` (just after the `{`).
fn group_heads(code: &[char], at: usize) -> Vec<String> {
    let mut heads = Vec::new();
    let (mut depth, mut item_start, mut j) = (0usize, true, at);
    let mut current = String::new();
    while j < code.len() {
        let c = code[j];
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                item_start = true;
                current.clear();
            }
            c if depth == 0 && item_start => {
                if c.is_alphanumeric() || c == '_' {
                    current.push(c);
                } else if !current.is_empty() {
                    heads.push(std::mem::take(&mut current));
                    item_start = false;
                }
            }
            _ => {}
        }
        j += 1;
    }
    if item_start && !current.is_empty() {
        heads.push(current);
    }
    heads
}

/// Every path in `code` that reaches a top-level module: `crate::x`, `crate::{x, y}` and `super::`
/// chains that climb to the crate root (counting the inline `mod name { ... }` blocks around them).
fn imports(code: &[char], file_path: &[String]) -> Vec<Import> {
    let text: String = code.iter().collect();
    let line_of = |pos: usize| code[..pos].iter().filter(|&&c| c == '\n').count() + 1;
    // The offsets where inline modules open and close.
    let mut inline: Vec<(usize, usize)> = Vec::new();
    let mut stack: Vec<Option<usize>> = Vec::new();
    let bytes: Vec<char> = code.to_vec();
    for (i, &c) in bytes.iter().enumerate() {
        if c == '{' {
            let before: String = bytes[i.saturating_sub(80)..i].iter().collect();
            let is_mod = before.trim_end().rsplit_once("mod ").is_some_and(|(pre, name)| {
                let name = name.trim();
                !name.is_empty()
                    && name.chars().all(|c| c.is_alphanumeric() || c == '_')
                    && pre.chars().last().is_none_or(|c| !(c.is_alphanumeric() || c == '_'))
            });
            stack.push(is_mod.then_some(i));
        } else if c == '}'
            && let Some(Some(open)) = stack.pop()
        {
            inline.push((open, i));
        }
    }
    let depth_at = |pos: usize| inline.iter().filter(|&&(a, b)| a < pos && pos < b).count();

    let mut found = Vec::new();
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let char_pos = |byte: usize| chars.partition_point(|&(b, _)| b < byte);
    let mut search = 0;
    while let Some(off) = text[search..].find("::") {
        let at = search + off;
        search = at + 2;
        // The path's first segment: the identifier before this `::`, when it starts the path.
        let start = text[..at]
            .rfind(|c: char| !(c.is_alphanumeric() || c == '_'))
            .map_or(0, |p| p + 1);
        let head = &text[start..at];
        if start >= 2 && &text[start - 2..start] == "::" {
            continue;
        }
        if start >= 1 && text[..start].ends_with('$') {
            continue; // $crate in macros
        }
        let mut segments_left: Option<usize> = match head {
            "crate" => Some(0),
            "super" => {
                let mut levels = 1;
                let mut rest = at + 2;
                while text[rest..].starts_with("super::") {
                    levels += 1;
                    rest += "super::".len();
                }
                search = rest;
                let depth = file_path.len() + depth_at(char_pos(start));
                depth.checked_sub(levels).filter(|&d| d == 0)
            }
            _ => None,
        };
        let Some(0) = segments_left.take() else { continue };
        // Past `crate::` / the last `super::`: a module name or a `{` group.
        let mut rest = at + 2;
        while text[rest..].starts_with("super::") {
            rest += "super::".len();
        }
        let after = &text[rest..];
        let line = line_of(char_pos(start));
        let tail: String = after.chars().take_while(|&c| c != ';' && c != '\n').take(100).collect();
        let shown = format!("{}{tail}", &text[start..rest]).trim().to_string();
        let targets = if after.starts_with('{') {
            group_heads(code, char_pos(rest) + 1)
        } else {
            let name: String = after.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            vec![name]
        };
        for target in targets {
            if !target.is_empty() && target != "self" {
                found.push(Import {
                    line,
                    target,
                    text: shown.clone(),
                });
            }
        }
    }
    found
}

#[test]
fn imports_follow_the_layer_order_of_lib_rs() {
    let lib = fs::read_to_string(Path::new(SRC).join("lib.rs")).unwrap();
    let ranks = layer_ranks(&lib);
    let declared = declared_modules(&lib);
    let unranked: Vec<_> = declared.iter().filter(|m| !ranks.contains_key(*m)).collect();
    assert!(
        unranked.is_empty(),
        "src/lib.rs declares {unranked:?} but its layers line does not place them"
    );
    let undeclared: Vec<_> = ranks.keys().filter(|m| !declared.contains(*m)).collect();
    assert!(
        undeclared.is_empty(),
        "src/lib.rs's layers line names {undeclared:?}, which it does not declare"
    );

    let mut files = Vec::new();
    rust_files(Path::new(SRC), &mut files);
    files.sort();
    let (mut scanned, mut checked) = (0, 0);
    let mut violations = Vec::new();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for path in &files {
        let rel = path.strip_prefix(SRC).unwrap();
        let module = module_path(rel);
        // The crate root and the binary are above every layer.
        if module == ["lib"] || module == ["main"] {
            continue;
        }
        let top = &module[0];
        let Some(&own) = ranks.get(top) else {
            panic!(
                "src/{}: the top-level module `{top}` is not in src/lib.rs's layers line",
                rel.display()
            );
        };
        scanned += 1;
        let code = code_only(&fs::read_to_string(path).unwrap());
        for import in imports(&code, &module) {
            checked += 1;
            if import.target == *top {
                continue;
            }
            let Some(&theirs) = ranks.get(&import.target) else {
                violations.push(format!(
                    "src/{}:{}: `{}` names `{}`, not a top-level module of src/lib.rs",
                    rel.display(),
                    import.line,
                    import.text,
                    import.target
                ));
                continue;
            };
            edges.entry(top.clone()).or_default().insert(import.target.clone());
            if theirs >= own {
                violations.push(format!(
                    "src/{}:{}: `{top}` imports `{}` (`{}`), which is not below it in src/lib.rs's layers line",
                    rel.display(),
                    import.line,
                    import.target,
                    import.text
                ));
            }
        }
    }
    // The scan must have seen the tree: far more files and imports than these floors.
    assert!(scanned > 100, "scanned only {scanned} files under {SRC}");
    assert!(checked > 100, "found only {checked} imports under {SRC}");
    assert!(
        violations.is_empty(),
        "imports against the layer order:\n{}",
        violations.join("\n")
    );
    if let Some(cycle) = find_cycle(&edges) {
        panic!("import cycle between top-level modules: {}", cycle.join(" → "));
    }
}

/// A cycle in the module graph, as the modules along it, if there is one.
fn find_cycle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|n| n == node) {
            let mut cycle = path[i..].to_vec();
            cycle.push(node.to_string());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in edges.get(node).into_iter().flatten() {
            if let Some(c) = visit(next, edges, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    edges.keys().find_map(|n| visit(n, edges, &mut Vec::new(), &mut done))
}

#[test]
fn the_scanner_sees_imports_and_skips_comments_and_strings() {
    let src = "use crate::model::Model;\n\
               use crate::{gguf::GgufFile, units};\n\
               // use crate::engine::Nothing;\n\
               /* crate::tui */ let s = \"crate::serve\"; let c = '\"';\n\
               fn f<'a>(x: &'a str) { crate::backend::run(x) }\n\
               mod tests { use super::super::remote::X; }\n";
    let code = code_only(src);
    let found: Vec<(usize, String)> = imports(&code, &["engine".to_string(), "worker".to_string()])
        .into_iter()
        .map(|i| (i.line, i.target))
        .collect();
    let want: Vec<(usize, String)> = [(1, "model"), (2, "gguf"), (2, "units"), (5, "backend")]
        .into_iter()
        .map(|(l, t)| (l, t.to_string()))
        .collect();
    // `super::super` from engine::worker::tests reaches `engine` (not the crate root): no import.
    assert_eq!(found, want);
    let root = imports(
        &code_only("mod tests { use super::super::super::remote::X; }"),
        &["a".into(), "b".into()],
    );
    assert_eq!(root.iter().map(|i| i.target.as_str()).collect::<Vec<_>>(), ["remote"]);

    let ranks = layer_ranks("//! layers: a → b → {c, d} → e\n");
    assert_eq!(
        ranks.into_iter().collect::<Vec<_>>(),
        [
            ("a".to_string(), 0),
            ("b".to_string(), 1),
            ("c".to_string(), 2),
            ("d".to_string(), 2),
            ("e".to_string(), 3)
        ]
    );
    let cyclic: BTreeMap<String, BTreeSet<String>> = [("a", "b"), ("b", "c"), ("c", "a")]
        .into_iter()
        .map(|(x, y)| (x.to_string(), BTreeSet::from([y.to_string()])))
        .collect();
    assert_eq!(
        find_cycle(&cyclic),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
}
