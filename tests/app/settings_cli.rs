//! Every out-of-range setting of `run`, `score`, `bench`, the chat app's flags and its config file
//! ends the process with exit status 1 and one stderr line naming the flag or key.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A model path that is never opened: the settings are checked before the file is read.
fn unopened_model() -> PathBuf {
    std::env::temp_dir().join("ds4-chat-settings-test-no-such-model.gguf")
}

/// Runs the binary with `args`; asserts exit 1 and one stderr line, and returns that line.
fn refused(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_ds4-chat"))
        .args(args)
        .env("HOME", std::env::temp_dir())
        .output()
        .expect("spawn ds4-chat");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "{args:?}: one line expected, got {stderr:?}");
    stderr.trim_end().to_string()
}

/// Flags (and their values) and the refusal that must follow them.
type Case = (Vec<&'static str>, String);

const CTX: &str = "2 ..= 1048576";
const APP_CTX: &str = "256 ..= 1048576";
const TEMP: &str = "0 ..= 10";
const TOP_P: &str = "0 < top_p <= 1";
const UNIT: &str = "0 ..= 1";
const TOP_K: &str = "0 ..= 1024";
const THREADS: &str = "0 ..= 4096";
const MAX_TOKENS: &str = "1 ..= 4294967295";
const BACKENDS: &str = "auto, hip, cpu";
const WEIGHTS: &str = "auto, copy, map";

/// The line refusing `value` for the flag or key `name`, outside `range`.
fn out_of_range(name: &str, value: &str, range: &str) -> String {
    format!("{name}: {value} is out of range ({range})")
}

/// The line refusing `value` for the flag or key `name`, not among `choices`.
fn not_one_of(name: &str, value: &str, choices: &str) -> String {
    format!("{name}: \"{value}\" is not one of {choices}")
}

/// `flag value`, out of `range`.
fn range_case(flag: &'static str, value: &'static str, range: &str) -> Case {
    (vec![flag, value], out_of_range(flag, value, range))
}

/// `flag value`, not among `choices`.
fn choice_case(flag: &'static str, value: &'static str, choices: &str) -> Case {
    (vec![flag, value], not_one_of(flag, value, choices))
}

/// `args`, refused with `want`.
fn case(args: &[&'static str], want: &str) -> Case {
    (args.to_vec(), want.to_string())
}

/// Each case's flags, between `before` and `after`, must be refused with exactly its line.
fn assert_refused(before: &[&str], after: &[&str], cases: &[Case]) {
    for (flags, want) in cases {
        let args: Vec<&str> = before.iter().chain(flags.iter()).chain(after).copied().collect();
        assert_eq!(refused(&args), format!("ds4-chat: {want}"), "{flags:?}");
    }
}

/// The context, sampling, thread and backend settings: `run` and the chat app refuse them alike
/// (each with its own smallest context).
fn shared_cases(ctx_range: &str) -> Vec<Case> {
    vec![
        range_case("--ctx", "99999999999", ctx_range),
        range_case("--max-tokens", "0", MAX_TOKENS),
        range_case("--temp", "-1", TEMP),
        range_case("--temp", "NaN", TEMP),
        range_case("--top-p", "5", TOP_P),
        range_case("--top-p", "0", TOP_P),
        range_case("--min-p", "-0.5", UNIT),
        range_case("--min-p", "2", UNIT),
        range_case("--top-k", "1025", TOP_K),
        range_case("--top-k", "-1", TOP_K),
        case(&["--seed", "-2"], "--seed: -2 is negative"),
        range_case("--threads", "5000", THREADS),
        range_case("--threads", "-4", THREADS),
        choice_case("--backend", "cuda", BACKENDS),
        choice_case("--speculate", "eagle", "off, ngram, dspark"),
        range_case("--dspark-confidence", "1.5", UNIT),
        range_case("--dspark-confidence", "-0.1", UNIT),
        choice_case("--dspark-convention", "eagle", "reference, ds4"),
    ]
}

/// `assert_refused` for `subcommand -m model`.
fn assert_subcommand_refuses(subcommand: &str, model: &Path, after: &[&str], cases: &[Case]) {
    assert_refused(&[subcommand, "-m", model.to_str().unwrap()], after, cases);
}

#[test]
fn run_refuses_each_setting_out_of_range() {
    let mut cases = shared_cases(CTX);
    cases.extend([
        range_case("--ctx", "1", CTX),
        case(&["-n", "0"], &out_of_range("--max-tokens", "0", MAX_TOKENS)),
        range_case("--logprobs-top-k", "129", "1 ..= 128"),
        choice_case("--weights", "mmap", WEIGHTS),
    ]);
    assert_subcommand_refuses("run", &unopened_model(), &["-p", "hi"], &cases);
}

#[test]
fn score_refuses_each_setting_out_of_range() {
    let cases = [
        range_case("--ctx", "99999999999", CTX),
        range_case("--threads", "-1", THREADS),
        choice_case("--backend", "gpu0", BACKENDS),
    ];
    assert_subcommand_refuses("score", &unopened_model(), &["--tokens", "1,2"], &cases);
}

#[test]
fn bench_refuses_each_setting_out_of_range() {
    let cases = [
        case(
            &["--ctx-max", "99999999999"],
            &out_of_range("--ctx-max + --gen-tokens", "100000000064", CTX),
        ),
        case(&["--ctx-start", "0"], "--ctx-start 0 must be in 1..=--ctx-max 8192"),
        range_case("--threads", "9999", THREADS),
        choice_case("--backend", "rocm", BACKENDS),
        choice_case("--weights", "disk", WEIGHTS),
        case(&["--peak-gbps", "-3"], "--peak-gbps: -3 is not a positive bandwidth"),
    ];
    assert_subcommand_refuses("bench", &unopened_model(), &[], &cases);
}

/// `run`, `serve` and `bench` read the same config file as the app: a bad key there is their
/// one-line refusal, naming the file and the key.
#[test]
fn run_serve_and_bench_read_the_config_file() {
    let file = std::env::temp_dir().join(format!("ds4-chat-settings-test-{}.toml", std::process::id()));
    std::fs::write(&file, "backend = \"cuda\"\n").unwrap();
    let (model, config) = (unopened_model(), file.to_str().unwrap().to_string());
    let want = format!(
        "ds4-chat: config {config}: {}",
        not_one_of("key `backend`", "cuda", BACKENDS)
    );
    for args in [
        vec!["run", "-m", model.to_str().unwrap(), "-p", "hi"],
        vec!["serve", "--demo"],
        vec!["bench", "-m", model.to_str().unwrap()],
    ] {
        let mut args = args.clone();
        args.extend(["--config", &config]);
        assert_eq!(refused(&args), want, "{args:?}");
    }
    std::fs::remove_file(&file).unwrap();
}

/// The chat app checks its flags and config file before it needs a terminal; with stdout not a
/// terminal (as here) the first bad setting is the one line printed.
#[test]
fn chat_app_refuses_bad_flags_and_config_keys() {
    let cases = shared_cases(APP_CTX);
    let empty = std::env::temp_dir().join(format!("ds4-chat-settings-empty-{}.toml", std::process::id()));
    std::fs::write(&empty, "").unwrap();
    assert_refused(&["--demo", "--config", empty.to_str().unwrap()], &[], &cases);
    let keys = [
        ("ctx = 99999999999", out_of_range("key `ctx`", "99999999999", APP_CTX)),
        ("temp = -1.0", out_of_range("key `temp`", "-1", TEMP)),
        ("top_p = 5.0", out_of_range("key `top_p`", "5", TOP_P)),
        ("min_p = -0.1", out_of_range("key `min_p`", "-0.1", UNIT)),
        ("top_k = 1025", out_of_range("key `top_k`", "1025", TOP_K)),
        ("seed = -1", "key `seed`: -1 is negative".to_string()),
        ("max_tokens = 0", out_of_range("key `max_tokens`", "0", MAX_TOKENS)),
        ("threads = 4097", out_of_range("key `threads`", "4097", THREADS)),
        ("backend = \"cuda\"", not_one_of("key `backend`", "cuda", BACKENDS)),
        ("weights = \"mmap\"", not_one_of("key `weights`", "mmap", WEIGHTS)),
        (
            "speculate = \"eagle\"",
            not_one_of("key `speculate`", "eagle", "off, ngram, dspark"),
        ),
        (
            "dspark_confidence = 2.0",
            out_of_range("key `dspark_confidence`", "2", UNIT),
        ),
        (
            "dspark_convention = \"eagle\"",
            not_one_of("key `dspark_convention`", "eagle", "reference, ds4"),
        ),
        (
            "think = \"maybe\"",
            not_one_of("key `think`", "maybe", "off, high, max"),
        ),
    ];
    let file = std::env::temp_dir().join(format!("ds4-chat-settings-bad-{}.toml", std::process::id()));
    for (line, want) in keys {
        std::fs::write(&file, format!("{line}\n")).unwrap();
        let got = refused(&["--demo", "--config", file.to_str().unwrap()]);
        assert_eq!(got, format!("ds4-chat: config {}: {want}", file.display()), "{line}");
    }
    let _ = std::fs::remove_file(&file);
    let _ = std::fs::remove_file(&empty);
}

/// Flags and the config file accept the same backend names.
#[test]
fn backend_names_are_the_same_for_flags_and_config() {
    use ds4_chat::engine::events::BackendChoice;
    for (name, want) in [
        ("auto", BackendChoice::Auto),
        ("hip", BackendChoice::Hip),
        ("gpu", BackendChoice::Hip),
        ("cpu", BackendChoice::Cpu),
    ] {
        let c = ds4_chat::tui::config::parse(&format!("backend = \"{name}\"\n")).unwrap();
        assert_eq!(c.backend, want, "{name}");
        assert_eq!(ds4_chat::engine::settings::parse_backend(name), Ok(want), "{name}");
    }
}

/// A micro model file that states a short context length (64 tokens unless said), removed on drop.
pub(crate) struct ShortModel(pub(crate) PathBuf);

impl ShortModel {
    fn write(tag: &str) -> ShortModel {
        ShortModel::with_context(tag, 64)
    }

    /// The 3-layer micro model stating a context of `ctx` tokens, in a temporary file removed on drop.
    pub(crate) fn with_context(tag: &str, ctx: u64) -> ShortModel {
        use ds4_chat::genmodel::{ExpertMix, GenSpec, Preset, SyntheticModel};
        let mut spec = GenSpec::new(Preset::Micro, 3, ExpertMix::Q2);
        spec.hp.context_length = ctx;
        let path = std::env::temp_dir().join(format!("ds4-chat-settings-{tag}-{}.gguf", std::process::id()));
        SyntheticModel::new(&spec)
            .unwrap()
            .write_file(&path, 1, |_| {})
            .unwrap();
        ShortModel(path)
    }
}

impl Drop for ShortModel {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Once the model is open, the same context rule takes the length the model states, for `run`,
/// `score` and `bench` alike.
#[test]
fn subcommands_refuse_a_context_longer_than_the_model_states() {
    let model = ShortModel::write("ctx64");
    let m = model.0.to_str().unwrap();
    let over = &out_of_range("--ctx", "65", "2 ..= 64, the model's context length");
    let cpu = ["--backend", "cpu"];
    for subcommand in ["run", "score"] {
        assert_subcommand_refuses(
            subcommand,
            &model.0,
            &["--tokens", "1,2"],
            &[case(&["--ctx", "65"], over)],
        );
    }
    let bench = ["--ctx-start", "4", "--ctx-max", "8", "--gen-tokens", "56"];
    let bench_over = out_of_range("--ctx-max + --gen-tokens", "65", "2 ..= 64, the model's context length");
    assert_subcommand_refuses("bench", &model.0, &cpu, &[case(&bench, &bench_over)]);
    // Within the model's length the check passes: `score` runs on the CPU and prints its result.
    let out = Command::new(env!("CARGO_BIN_EXE_ds4-chat"))
        .args(["score", "-m", m, "--ctx", "64", "--tokens", "1,2", "--backend", "cpu"])
        .output()
        .expect("spawn ds4-chat");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// `bench` names every tuning variable it ran with on stderr, and says so when none was set.
#[test]
fn bench_prints_the_knobs_it_ran_with() {
    let model = ShortModel::write("knobs");
    let bench = |vars: &[(&str, &str)]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ds4-chat"));
        cmd.args(["bench", "-m", model.0.to_str().unwrap(), "--backend", "cpu", "-t", "1"])
            .args([
                "--ctx-start",
                "4",
                "--ctx-max",
                "8",
                "--step-incr",
                "4",
                "--gen-tokens",
                "2",
            ])
            .args(["--peak-gbps", "1", "--config", "/nonexistent/ds4-chat.toml"]);
        for k in ds4_chat::backend::knobs::KNOBS {
            cmd.env_remove(k.name);
        }
        let out = cmd.envs(vars.iter().copied()).output().expect("spawn ds4-chat");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{stderr}");
        let line = stderr.lines().find(|l| l.starts_with("knobs: ")).map(str::to_string);
        line.unwrap_or_else(|| panic!("no knobs line: {stderr}"))
    };
    assert_eq!(bench(&[]), "knobs: none (all defaults)");
    assert_eq!(
        bench(&[("DS4_LOAD_THREADS", "3"), ("DS4_HIP_Q8_BLOCKS", "132")]),
        "knobs: DS4_HIP_Q8_BLOCKS=132 DS4_LOAD_THREADS=3"
    );
}

/// docs/configuration.md against the code: the flags of every command (clap's tree), the config
/// file's keys (the parser's own list), the environment variables (the registry, and every
/// `"DS4_…"` string in src/ and build.rs) and the removed variables.
mod configuration_docs {
    use std::collections::BTreeSet;
    use std::path::Path;

    use clap::CommandFactory;
    use ds4_chat::backend::knobs::{KNOBS, REMOVED};

    const DOC: &str = "docs/configuration.md";

    /// The table rows under `## section` (and, when given, `### sub`), as trimmed cells.
    fn rows(doc: &str, section: &str, sub: Option<&str>) -> Vec<Vec<String>> {
        let (mut h2, mut h3) = (String::new(), String::new());
        let mut out = Vec::new();
        for line in doc.lines() {
            if let Some(t) = line.strip_prefix("## ") {
                (h2, h3) = (t.trim().to_string(), String::new());
            } else if let Some(t) = line.strip_prefix("### ") {
                h3 = t.trim().to_string();
            } else if h2 == section
                && sub.is_none_or(|s| s == h3)
                && (sub.is_some() || h3 != "Removed")
                && line.starts_with("| ")
                && line.contains('`')
            {
                let cells = line.trim().trim_matches('|').split('|').map(|c| c.trim().to_string());
                out.push(cells.collect());
            }
        }
        out
    }

    /// The first `` `--flag` `` or `` `NAME` `` of a cell, without the backticks.
    fn first_code(cell: &str) -> String {
        cell.split('`').nth(1).unwrap_or("").to_string()
    }

    fn compare(what: &str, documented: &BTreeSet<String>, code: &BTreeSet<String>) {
        assert!(!code.is_empty(), "{what}: the code's list is empty");
        assert!(!documented.is_empty(), "{what}: {DOC} lists none");
        let missing: Vec<_> = code.difference(documented).collect();
        let extra: Vec<_> = documented.difference(code).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "{what}: missing from {DOC}: {missing:?}; in {DOC} but not in the code: {extra:?}"
        );
    }

    fn doc() -> String {
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(DOC)).unwrap()
    }

    #[test]
    fn every_flag_of_every_command_is_documented() {
        let root = ds4_chat::cli::Cli::command();
        let mut code = BTreeSet::new();
        let mut commands = vec![("app".to_string(), &root)];
        commands.extend(root.get_subcommands().map(|c| (c.get_name().to_string(), c)));
        for (name, cmd) in commands {
            for a in cmd.get_arguments() {
                if let Some(long) = a.get_long().filter(|l| !["help", "version"].contains(l)) {
                    code.insert(format!("{name} --{long}"));
                }
            }
        }
        assert!(code.len() > 60, "{code:?}");
        let mut documented = BTreeSet::new();
        for row in rows(&doc(), "Flags", None) {
            for command in row[0].split(',') {
                assert!(
                    documented.insert(format!("{} {}", command.trim(), first_code(&row[1]))),
                    "{row:?} twice"
                );
            }
        }
        compare("flags", &documented, &code);
    }

    /// The keys the config parser knows, from its own "expected one of" list.
    fn parser_keys(text: &str) -> Vec<String> {
        let e = ds4_chat::tui::config::parse(text).unwrap_err();
        let list = e.split("expected one of").nth(1).unwrap_or_else(|| panic!("{e}"));
        list.split('`').skip(1).step_by(2).map(str::to_string).collect()
    }

    #[test]
    fn every_config_key_is_documented() {
        let mut code: BTreeSet<String> = parser_keys("no_such_key = 1\n").into_iter().collect();
        assert!(code.remove("remote"), "{code:?}");
        code.extend(
            parser_keys("[remote]\nno_such_key = 1\n")
                .into_iter()
                .map(|k| format!("remote.{k}")),
        );
        let documented = rows(&doc(), "Config file keys", None)
            .iter()
            .map(|r| first_code(&r[0]))
            .collect();
        compare("config keys", &documented, &code);
    }

    /// Every `"DS4_…` string literal in `text` outside its `#[cfg(test)]` module.
    fn ds4_literals(text: &str, into: &mut BTreeSet<String>) {
        let text = text.split("#[cfg(test)]\nmod tests").next().unwrap();
        for (i, _) in text.match_indices("\"DS4_") {
            let name: String = text[i + 1..]
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            // A prefix test such as `starts_with("DS4_")` names no variable.
            if name.len() > "DS4_".len() {
                into.insert(name);
            }
        }
    }

    fn sources(dir: &Path, into: &mut BTreeSet<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                sources(&path, into);
            } else if path.extension().is_some_and(|e| e == "rs") {
                ds4_literals(&std::fs::read_to_string(&path).unwrap(), into);
            }
        }
    }

    #[test]
    fn every_environment_variable_is_registered_and_documented() {
        let doc = doc();
        let runtime = rows(&doc, "Environment variables", None);
        // The registry, row for row: name, the rule its error states, default and meaning.
        for k in KNOBS {
            let row = runtime
                .iter()
                .find(|r| first_code(&r[0]) == k.name)
                .unwrap_or_else(|| panic!("{} is registered but not in {DOC}", k.name));
            assert_eq!(
                (row[1].as_str(), row[2].as_str(), row[3].as_str()),
                (k.kind.expected().as_str(), k.default, k.meaning),
                "{DOC}'s row of {} differs from the registry",
                k.name
            );
        }
        let registered: BTreeSet<String> = KNOBS.iter().map(|k| k.name.to_string()).collect();
        let documented: BTreeSet<String> = runtime.iter().map(|r| first_code(&r[0])).collect();
        compare("environment variables", &documented, &registered);
        let removed: BTreeSet<String> = REMOVED.iter().map(|(n, _)| n.to_string()).collect();
        let documented_removed = rows(&doc, "Environment variables", Some("Removed"))
            .iter()
            .map(|r| first_code(&r[0]))
            .collect();
        compare("removed variables", &documented_removed, &removed);
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut build = BTreeSet::new();
        ds4_literals(&std::fs::read_to_string(root.join("build.rs")).unwrap(), &mut build);
        let documented_build: BTreeSet<String> = rows(&doc, "Build-time variables", None)
            .iter()
            .map(|r| first_code(&r[0]))
            .filter(|n| n.starts_with("DS4_"))
            .collect();
        compare("build-time variables", &documented_build, &build);
        // Nothing in src/ names a variable the tables do not know.
        let mut named = BTreeSet::new();
        sources(&root.join("src"), &mut named);
        assert!(named.len() >= registered.len() / 2, "{named:?}");
        let known: BTreeSet<String> = registered
            .iter()
            .chain(&removed)
            .chain(&documented_build)
            .cloned()
            .collect();
        let unknown: Vec<_> = named.difference(&known).collect();
        assert!(
            unknown.is_empty(),
            "src/ names variables that are neither registered in backend::knobs nor build-time: {unknown:?}"
        );
    }

    #[test]
    fn a_malformed_or_removed_variable_is_a_one_line_error() {
        for (var, value, want) in [
            (
                "DS4_HIP_Q8_BLOCKS",
                "many",
                "DS4_HIP_Q8_BLOCKS=many: expected a whole number from 1 to 1048576",
            ),
            ("DS4_HIP_GRAPH", "off", "DS4_HIP_GRAPH=off: expected 0 or 1"),
            ("DS4_HIP_EXACT", "1", "DS4_HIP_EXACT is no longer read: use --exact"),
        ] {
            let out = std::process::Command::new(env!("CARGO_BIN_EXE_ds4-chat"))
                .args(["inspect", "no-such-file.gguf"])
                .env(var, value)
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{stderr}");
            assert_eq!(stderr.lines().count(), 1, "{stderr}");
            assert!(
                stderr.starts_with(&format!("ds4-chat: {want}")),
                "{var}={value}: {stderr}"
            );
        }
    }
}
