//! kernels/INDEX.md, generated: every kernel of the kernel table (`kernels::ALL_KERNELS`) by
//! operation, with its source file, the Rust modules that build its launches (those of
//! src/backend/hip/kernels/ that name the kernel's constant) and the check groups of this suite
//! that launched it in a full run on the wave32 emulator.
//!
//! The suite compares the committed file with the one it generates after a full emulator run and
//! fails when they differ; tools/kernel-index.sh rewrites the committed file.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use ds4_chat::backend::hip::kernels::{ALL_KERNELS, KernelDef};

/// The committed index.
pub fn committed_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels/INDEX.md")
}

/// Where a full run writes the index it generated (tools/kernel-index.sh copies it over the committed one).
pub fn generated_path() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("kernel-index/INDEX.md")
}

/// The Rust constant of a kernel in the table: its symbol without `ds4_`, upper case.
fn constant(def: &KernelDef) -> String {
    def.name.trim_start_matches("ds4_").to_ascii_uppercase()
}

/// Whether `text` names `word` as a whole identifier.
fn names(text: &str, word: &str) -> bool {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices(word).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + word.len()..].chars().next();
        !before.is_some_and(ident) && !after.is_some_and(ident)
    })
}

/// (module name, source) of the builder modules: src/backend/hip/kernels/*.rs except the table
/// (`abi`), the module root and its unit tests.
fn builder_modules() -> Vec<(String, String)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/backend/hip/kernels");
    let mut modules: Vec<(String, String)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .map(|p| {
            let stem = p.file_stem().and_then(|s| s.to_str()).unwrap_or_default().to_string();
            let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (stem, text)
        })
        .filter(|(stem, _)| !["abi", "mod", "tests"].contains(&stem.as_str()))
        .collect();
    modules.sort();
    modules
}

fn join(items: &BTreeSet<String>) -> String {
    if items.is_empty() {
        "–".to_string()
    } else {
        items.iter().map(|s| format!("`{s}`")).collect::<Vec<_>>().join(", ")
    }
}

/// The index for the launches `groups_of` (kernel → the check groups that launched it).
pub fn generate(groups_of: &BTreeMap<&str, BTreeSet<&str>>) -> String {
    let abi = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/backend/hip/kernels/abi.rs"))
        .expect("src/backend/hip/kernels/abi.rs");
    let modules = builder_modules();
    // op -> (sources, exact kernels, fast kernels, builders, groups)
    type OpRow = (
        BTreeSet<String>,
        Vec<String>,
        Vec<String>,
        BTreeSet<String>,
        BTreeSet<String>,
    );
    let mut ops: BTreeMap<&str, OpRow> = BTreeMap::new();
    let mut kernel_rows = Vec::new();
    for def in ALL_KERNELS {
        let konst = constant(def);
        assert!(
            abi.contains(&format!("{konst} = \"{}\"", def.name)),
            "{}: the kernel table's constant is not {konst} (the index derives it from the symbol)",
            def.name
        );
        let builders: BTreeSet<String> = modules
            .iter()
            .filter(|(_, text)| names(text, &konst))
            .map(|(m, _)| format!("{m}.rs"))
            .collect();
        let groups: BTreeSet<String> = groups_of
            .get(def.name)
            .map(|g| g.iter().map(|s| s.to_string()).collect())
            .unwrap_or_default();
        let row = ops.entry(def.op()).or_default();
        row.0.insert(def.source.to_string());
        let list = if def.is_fast() { &mut row.2 } else { &mut row.1 };
        list.push(format!("`{}`", def.name));
        row.3.extend(builders.iter().cloned());
        row.4.extend(groups.iter().cloned());
        kernel_rows.push(format!(
            "| `{}` | {} | {} | `{}` | {} | {} |",
            def.name,
            def.op(),
            if def.is_fast() { "fast" } else { "exact" },
            def.source,
            join(&builders),
            join(&groups)
        ));
    }
    let mut s = String::new();
    s.push_str("# Kernel index\n\n");
    s.push_str(
        "Generated from the kernel table (`src/backend/hip/kernels/abi.rs`, `ALL_KERNELS`) and the launches of \
         the kernel checks (`tests/hip_kernels`) in a full run on the wave32 emulator; do not edit by hand. \
         `cargo test --release --features hip --test hip_kernels` fails when this file is stale and \
         `tools/kernel-index.sh` rewrites it. kernels/README.md describes the operations and their contracts.\n\n",
    );
    s.push_str(
        "Sources are under `kernels/`, Rust builders under `src/backend/hip/kernels/` (the modules that name the \
         kernel's constant in the table), check groups are modules of `tests/hip_kernels/` \
         (`DS4_KERNEL_CHECKS=<group>,...` runs only those).\n\n",
    );
    s.push_str("## Operations\n\n");
    s.push_str("| op | sources | exact kernels | fast kernels | Rust builders | check groups |\n");
    s.push_str("|---|---|---|---|---|---|\n");
    for (op, (sources, exact, fast, builders, groups)) in &ops {
        let list = |v: &Vec<String>| if v.is_empty() { "–".to_string() } else { v.join(", ") };
        s.push_str(&format!(
            "| {op} | {} | {} | {} | {} | {} |\n",
            join(sources),
            list(exact),
            list(fast),
            join(builders),
            join(groups)
        ));
    }
    s.push_str("\n## Kernels\n\n");
    s.push_str("| kernel | op | arithmetic | source | Rust builders | check groups |\n");
    s.push_str("|---|---|---|---|---|---|\n");
    for row in kernel_rows {
        s.push_str(&row);
        s.push('\n');
    }
    s
}
