//! Every environment variable the binary reads at run time, in one registry (name, kind, default,
//! one-line meaning), and the one parser for them (docs/configuration.md#environment-variables).
//!
//! User settings are flags and config-file keys (`cli`, `tui::config`); the variables here are the
//! tuning and diagnostic knobs of the HIP backend and the weight loader, the runtime's paths, one
//! documented fallback (`DS4_DATA_DIR`) and the test hooks (`DS4_TEST_*`). One convention for all:
//! unset or empty is the default; a switch is `0` or `1`; a number is a whole number in its range; a
//! choice is one of its words; anything else is the one-line error `NAME=VALUE: expected …`, never
//! ignored. [`validate`] checks every variable that is set once at start (the CLI calls it before any
//! subcommand runs), so the readers below may fall back to the default without hiding a bad value.
//! Depends on nothing else in the crate.

use std::str::FromStr;

/// What a variable holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `0` (off) or `1` (on).
    Switch,
    /// A whole number in `min ..= max` that also satisfies `rule`.
    Int { min: u64, max: u64, rule: IntRule },
    /// One of these words.
    Choice(&'static [&'static str]),
    /// Free text: a path, a device name or a list; any value is accepted.
    Text,
}

/// An extra rule on a whole number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IntRule {
    Any,
    /// A multiple of this.
    MultipleOf(u64),
    /// 0, or a multiple of this (0 turns the mechanism off).
    ZeroOrMultipleOf(u64),
    /// A power of two.
    PowerOfTwo,
}

/// Why a variable exists (the sections of the table in docs/configuration.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Group {
    /// Fallback of a user setting that has no flag.
    Setting,
    /// Where the runtime or kernels come from.
    Path,
    /// Changes a work split or pipeline shape; results stay within the arithmetic's contract.
    Tuning,
    /// Measurement aids (profiles, attribution); may make results wrong, and says so.
    Diagnostic,
    /// Read only so the test suite can reach a code path; not for users.
    Test,
}

/// One registered variable.
#[derive(Clone, Copy, Debug)]
pub struct Knob {
    pub name: &'static str,
    pub kind: Kind,
    pub group: Group,
    /// The default as documented (a value, or how it is chosen).
    pub default: &'static str,
    /// One line: what it changes.
    pub meaning: &'static str,
}

const fn int(min: u64, max: u64, rule: IntRule) -> Kind {
    Kind::Int { min, max, rule }
}

const fn knob(name: &'static str, kind: Kind, group: Group, default: &'static str, meaning: &'static str) -> Knob {
    Knob {
        name,
        kind,
        group,
        default,
        meaning,
    }
}

use Group::{Diagnostic, Path, Setting, Test, Tuning};
use IntRule::{Any, MultipleOf, PowerOfTwo, ZeroOrMultipleOf};

pub const DATA_DIR: &str = "DS4_DATA_DIR";
pub const HIP_LIBRARY: &str = "DS4_HIP_LIBRARY";
pub const HIP_DEVICE: &str = "DS4_HIP_DEVICE";
pub const HIP_TARGET: &str = "DS4_HIP_TARGET";
pub const KERNEL_DIR: &str = "DS4_KERNEL_DIR";
pub const ROCM_PATH: &str = "ROCM_PATH";
pub const HIP_Q8_BLOCKS: &str = "DS4_HIP_Q8_BLOCKS";
pub const HIP_ATTENTION_ROWS: &str = "DS4_HIP_ATTENTION_ROWS";
pub const HIP_ATTENTION_MMA: &str = "DS4_HIP_ATTENTION_MMA";
pub const HIP_MOE_ROWS: &str = "DS4_HIP_MOE_ROWS";
pub const HIP_INDEXER_DECODE_TOKENS: &str = "DS4_HIP_INDEXER_DECODE_TOKENS";
pub const HIP_PREFILL_CHUNK: &str = "DS4_HIP_PREFILL_CHUNK";
pub const HIP_MATVEC_TOKENS: &str = "DS4_HIP_MATVEC_TOKENS";
pub const HIP_GRAPH: &str = "DS4_HIP_GRAPH";
pub const HIP_LANES: &str = "DS4_HIP_LANES";
pub const HIP_OVERLAP: &str = "DS4_HIP_OVERLAP";
pub const LOAD_MODE: &str = "DS4_LOAD_MODE";
pub const LOAD_THREADS: &str = "DS4_LOAD_THREADS";
pub const LOAD_CHUNK_MIB: &str = "DS4_LOAD_CHUNK_MIB";
pub const LOAD_BUFFERS: &str = "DS4_LOAD_BUFFERS";
pub const LOAD_DROP_CACHE: &str = "DS4_LOAD_DROP_CACHE";
pub const HIP_PROFILE: &str = "DS4_HIP_PROFILE";
pub const HIP_REPEAT: &str = "DS4_HIP_REPEAT";
pub const TEST_PANIC: &str = "DS4_TEST_PANIC";
pub const TEST_SYSFS_ROOT: &str = "DS4_TEST_SYSFS_ROOT";
pub const TEST_PROCFS_ROOT: &str = "DS4_TEST_PROCFS_ROOT";
pub const TEST_DEV_ROOT: &str = "DS4_TEST_DEV_ROOT";
pub const TEST_SERVE_SCRIPT: &str = "DS4_TEST_SERVE_SCRIPT";

/// The registry, in the order of docs/configuration.md's table.
pub const KNOBS: &[Knob] = &[
    knob(
        DATA_DIR,
        Kind::Text,
        Setting,
        "~/.local/share/ds4-chat",
        "Data directory of the kept sessions (`sessions/` under it) and of `serve`'s prompt cache (`prompt-cache/`).",
    ),
    knob(
        HIP_LIBRARY,
        Kind::Text,
        Path,
        "searched",
        "The HIP runtime library to load instead of searching the usual names.",
    ),
    knob(HIP_DEVICE, int(0, 255, Any), Path, "0", "Ordinal of the GPU to open."),
    knob(
        HIP_TARGET,
        Kind::Text,
        Path,
        "the device's",
        "Use only this embedded kernel target (e.g. gfx1151).",
    ),
    knob(
        KERNEL_DIR,
        Kind::Text,
        Path,
        "unset",
        "Load kernels from `<dir>/ds4_kernels.sm_XY.cubin` (NVIDIA test shim).",
    ),
    knob(
        ROCM_PATH,
        Kind::Text,
        Path,
        "/opt/rocm",
        "Where `doctor` looks for the ROCm runtime.",
    ),
    knob(
        HIP_Q8_BLOCKS,
        int(1, 1 << 20, Any),
        Tuning,
        "264",
        "Most blocks of a fast Q8_0 matvec grid.",
    ),
    knob(
        HIP_ATTENTION_ROWS,
        int(8, 256, MultipleOf(8)),
        Tuning,
        "8",
        "Rows per slice of the fast decode attention split.",
    ),
    knob(
        HIP_ATTENTION_MMA,
        int(0, 256, ZeroOrMultipleOf(16)),
        Tuning,
        "0",
        "Rows per slice at least on matrix cores (0: the CUDA-core split).",
    ),
    knob(
        HIP_MOE_ROWS,
        int(8, 256, PowerOfTwo),
        Tuning,
        "16",
        "Rows per block of the fast routed-expert gate/up.",
    ),
    knob(
        HIP_INDEXER_DECODE_TOKENS,
        int(0, 1 << 20, Any),
        Tuning,
        "4",
        "Most batch tokens whose indexer scores run the decode kernel (0: never).",
    ),
    knob(
        HIP_PREFILL_CHUNK,
        int(1, 1 << 20, Any),
        Tuning,
        "2048 (1024 unified memory)",
        "Tokens per prefill chunk.",
    ),
    knob(
        HIP_MATVEC_TOKENS,
        int(1, 1 << 20, Any),
        Tuning,
        "64",
        "Most batch tokens that run the token-wise decode kernels instead of GEMMs.",
    ),
    knob(
        HIP_GRAPH,
        Kind::Switch,
        Tuning,
        "1",
        "Replay the decode step as a captured graph (0: direct launches).",
    ),
    knob(
        HIP_LANES,
        Kind::Switch,
        Tuning,
        "1",
        "Run independent chains on side streams (0: all on the main stream).",
    ),
    knob(
        HIP_OVERLAP,
        Kind::Switch,
        Tuning,
        "1",
        "Overlapped launches where the target has them (NVIDIA sm_90+).",
    ),
    knob(
        LOAD_MODE,
        Kind::Choice(&["auto", "direct", "buffered", "register"]),
        Tuning,
        "auto",
        "How a weight copy reads the file: O_DIRECT, plain reads or a registered mapping.",
    ),
    knob(
        LOAD_THREADS,
        int(1, 256, Any),
        Tuning,
        "4 integrated, 16 discrete",
        "Reader threads of a weight copy (capped at the CPUs).",
    ),
    knob(
        LOAD_CHUNK_MIB,
        int(1, 4096, Any),
        Tuning,
        "64 integrated, 16 discrete",
        "MiB per read chunk and staging buffer of a weight copy.",
    ),
    knob(
        LOAD_BUFFERS,
        int(1, 1024, Any),
        Tuning,
        "2 or 4 per thread",
        "Pinned staging buffers of a weight copy.",
    ),
    knob(
        LOAD_DROP_CACHE,
        Kind::Switch,
        Tuning,
        "1 integrated, 0 discrete",
        "Drop the file's pages behind each chunk of a weight copy.",
    ),
    knob(
        HIP_PROFILE,
        Kind::Choice(&["0", "1", "shapes"]),
        Diagnostic,
        "0",
        "Time every kernel launch (1), or per launch shape (shapes), and print the table.",
    ),
    knob(
        HIP_REPEAT,
        Kind::Text,
        Diagnostic,
        "unset",
        "Comma-separated kernels run twice per decode step: timing attribution, wrong outputs.",
    ),
    knob(
        TEST_PANIC,
        Kind::Switch,
        Test,
        "0",
        "Test hook: the chat app panics after its first frame (terminal restore check).",
    ),
    knob(
        TEST_SYSFS_ROOT,
        Kind::Text,
        Test,
        "/",
        "Test hook: `doctor` reads `<root>/sys` instead of /sys.",
    ),
    knob(
        TEST_PROCFS_ROOT,
        Kind::Text,
        Test,
        "/",
        "Test hook: `doctor` reads `<root>/proc` instead of /proc.",
    ),
    knob(
        TEST_DEV_ROOT,
        Kind::Text,
        Test,
        "/",
        "Test hook: `doctor` reads `<root>/dev` instead of /dev.",
    ),
    knob(
        TEST_SERVE_SCRIPT,
        Kind::Text,
        Test,
        "unset",
        "Test hook: `serve` replies with the token ids of this JSON file, one list per turn.",
    ),
];

/// Variables this binary no longer reads, and what replaces each: setting one is an error naming
/// the replacement, so an old script does not silently run with a different setting.
pub const REMOVED: &[(&str, &str)] = &[
    ("DS4_HIP_EXACT", "use --exact or the config key arithmetic = \"exact\""),
    (
        "DS4_HIP_FORWARD",
        "the HIP forward pass is always on; use --backend cpu to run on the CPU",
    ),
    ("DS4_LOAD_DIRECT", "use DS4_LOAD_MODE=direct or DS4_LOAD_MODE=buffered"),
    ("DS4_CHAT_TEST_PANIC", "renamed DS4_TEST_PANIC"),
    ("DS4_SYSFS_ROOT", "renamed DS4_TEST_SYSFS_ROOT"),
    ("DS4_PROCFS_ROOT", "renamed DS4_TEST_PROCFS_ROOT"),
    ("DS4_DEV_ROOT", "renamed DS4_TEST_DEV_ROOT"),
];

/// The registered variable `name`. Reading an unregistered name is a programming error, caught by
/// the registry's tests and docs/configuration.md's check.
pub fn knob_named(name: &str) -> Option<&'static Knob> {
    KNOBS.iter().find(|k| k.name == name)
}

impl Kind {
    /// What a value must be, for the error line.
    pub fn expected(&self) -> String {
        match *self {
            Kind::Switch => "0 or 1".into(),
            Kind::Choice(words) => format!("one of {}", words.join(", ")),
            Kind::Text => "any text".into(),
            Kind::Int { min, max, rule } => match rule {
                Any => format!("a whole number from {min} to {max}"),
                MultipleOf(m) => format!("a multiple of {m} from {min} to {max}"),
                ZeroOrMultipleOf(m) => format!("0 or a multiple of {m} up to {max}"),
                PowerOfTwo => format!("a power of two from {min} to {max}"),
            },
        }
    }

    /// Whether `v` (trimmed, non-empty) is a value of this kind.
    fn accepts(&self, v: &str) -> bool {
        match *self {
            Kind::Switch => v == "0" || v == "1",
            Kind::Choice(words) => words.contains(&v),
            Kind::Text => true,
            Kind::Int { min, max, rule } => v.parse::<u64>().is_ok_and(|n| {
                (min..=max).contains(&n)
                    && match rule {
                        Any => true,
                        MultipleOf(m) => n.is_multiple_of(m),
                        ZeroOrMultipleOf(m) => n == 0 || (n >= m && n.is_multiple_of(m)),
                        PowerOfTwo => n.is_power_of_two(),
                    }
            }),
        }
    }
}

/// `raw` checked against `knob`: `None` for empty (the default), else the trimmed value or the
/// one-line error `NAME=VALUE: expected …`.
pub fn check(knob: &Knob, raw: &str) -> Result<Option<String>, String> {
    let v = raw.trim();
    if v.is_empty() {
        Ok(None)
    } else if knob.kind.accepts(v) {
        Ok(Some(v.to_string()))
    } else {
        Err(format!("{}={raw}: expected {}", knob.name, knob.kind.expected()))
    }
}

/// The value of the registered variable `name` from the environment, checked; `None` when unset or
/// empty.
pub fn value(name: &str) -> Result<Option<String>, String> {
    let knob = knob_named(name).ok_or_else(|| format!("{name} is not a registered variable"))?;
    match std::env::var(name) {
        Ok(raw) => check(knob, &raw),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => Err(format!("{name}: the value is not UTF-8")),
    }
}

/// A path knob (kept as the OS gave it, so a non-UTF-8 path works); `None` when unset or empty.
pub fn path(name: &str) -> Option<std::path::PathBuf> {
    debug_assert!(knob_named(name).is_some(), "{name} is not registered");
    std::env::var_os(name).filter(|v| !v.is_empty()).map(Into::into)
}

/// A whole-number knob as a `T`; `None` when unset.
pub fn number<T: FromStr>(name: &str) -> Result<Option<T>, String> {
    match value(name)? {
        None => Ok(None),
        Some(v) => v
            .parse::<T>()
            .map(Some)
            .map_err(|_| format!("{name}={v}: out of range for this build")),
    }
}

/// A switch knob: its value, or `default` when unset.
pub fn switch(name: &str, default: bool) -> Result<bool, String> {
    Ok(value(name)?.map_or(default, |v| v == "1"))
}

/// A switch that is on unless set to `0`, for code paths with no error return: [`validate`] has
/// already refused a malformed value at start.
pub fn switch_on(name: &str) -> bool {
    switch(name, true).unwrap_or(true)
}

/// Every registered variable that is set is well formed, and no removed one is set; else the first
/// problem as one line. Called once at start by the CLI.
pub fn validate() -> Result<(), String> {
    for (name, instead) in REMOVED {
        if std::env::var_os(name).is_some() {
            return Err(format!("{name} is no longer read: {instead} (docs/configuration.md)"));
        }
    }
    for k in KNOBS {
        value(k.name)?;
    }
    Ok(())
}

/// `NAME=VALUE` for every tuning and diagnostic variable set to a value (`bench`'s `knobs:` line).
pub fn non_default() -> Vec<String> {
    KNOBS
        .iter()
        .filter(|k| k.name.starts_with("DS4_") && matches!(k.group, Tuning | Diagnostic | Path))
        .filter_map(|k| value(k.name).ok().flatten().map(|v| format!("{}={v}", k.name)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(name: &str) -> &'static Knob {
        knob_named(name).unwrap()
    }

    #[test]
    fn one_convention_for_every_kind() {
        assert_eq!(check(k(HIP_GRAPH), " 0 "), Ok(Some("0".into())));
        assert_eq!(check(k(HIP_GRAPH), ""), Ok(None));
        assert_eq!(
            check(k(HIP_GRAPH), "off"),
            Err("DS4_HIP_GRAPH=off: expected 0 or 1".into())
        );
        assert_eq!(check(k(HIP_Q8_BLOCKS), "132"), Ok(Some("132".into())));
        assert_eq!(
            check(k(HIP_Q8_BLOCKS), "0"),
            Err("DS4_HIP_Q8_BLOCKS=0: expected a whole number from 1 to 1048576".into())
        );
        assert!(check(k(HIP_Q8_BLOCKS), "-3").is_err() && check(k(HIP_Q8_BLOCKS), "1.5").is_err());
        assert!(check(k(HIP_ATTENTION_ROWS), "24").is_ok() && check(k(HIP_ATTENTION_ROWS), "20").is_err());
        assert!(check(k(HIP_ATTENTION_MMA), "0").is_ok() && check(k(HIP_ATTENTION_MMA), "32").is_ok());
        assert!(check(k(HIP_ATTENTION_MMA), "8").is_err() && check(k(HIP_ATTENTION_MMA), "272").is_err());
        assert!(check(k(HIP_MOE_ROWS), "64").is_ok() && check(k(HIP_MOE_ROWS), "48").is_err());
        assert!(check(k(HIP_MOE_ROWS), "4").is_err());
        assert_eq!(
            check(k(LOAD_MODE), "fast"),
            Err("DS4_LOAD_MODE=fast: expected one of auto, direct, buffered, register".into())
        );
        assert_eq!(check(k(HIP_REPEAT), "a,b"), Ok(Some("a,b".into())));
        assert!(check(k(HIP_DEVICE), "x").is_err());
    }

    #[test]
    fn registry_names_are_unique_and_documented_in_one_line() {
        assert!(KNOBS.len() >= 20, "{}", KNOBS.len());
        for (i, a) in KNOBS.iter().enumerate() {
            assert!(KNOBS[i + 1..].iter().all(|b| b.name != a.name), "{} twice", a.name);
            assert!(
                !a.meaning.is_empty() && !a.meaning.contains('\n') && !a.default.is_empty(),
                "{}",
                a.name
            );
            assert_eq!(
                a.group == Test,
                a.name.starts_with("DS4_TEST_"),
                "{}: test hooks are DS4_TEST_*",
                a.name
            );
            assert!(
                REMOVED.iter().all(|(r, _)| r != &a.name),
                "{} is both kept and removed",
                a.name
            );
        }
    }
}
