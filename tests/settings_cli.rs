//! Every out-of-range setting of `run`, `score`, `bench`, the chat app's flags and its config file
//! ends the process with exit status 1 and one stderr line naming the flag or key.

use std::path::PathBuf;
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

/// Each case's flags, between `before` and `after`, must be refused with exactly its line.
fn assert_refused(before: &[&str], after: &[&str], cases: &[(&[&str], &str)]) {
    for (flags, want) in cases {
        let args: Vec<&str> = before.iter().chain(flags.iter()).chain(after).copied().collect();
        assert_eq!(refused(&args), format!("ds4-chat: {want}"), "{flags:?}");
    }
}

#[test]
fn run_refuses_each_setting_out_of_range() {
    let m = unopened_model();
    let m = m.to_str().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (
            &["--ctx", "99999999999"],
            "--ctx: 99999999999 is out of range (2 ..= 1048576)",
        ),
        (&["--ctx", "1"], "--ctx: 1 is out of range (2 ..= 1048576)"),
        (&["--temp", "-1"], "--temp: -1 is out of range (0 ..= 10)"),
        (&["--temp", "NaN"], "--temp: NaN is out of range (0 ..= 10)"),
        (&["--top-p", "5"], "--top-p: 5 is out of range (0 < top_p <= 1)"),
        (&["--top-p", "0"], "--top-p: 0 is out of range (0 < top_p <= 1)"),
        (&["--min-p", "-0.5"], "--min-p: -0.5 is out of range (0 ..= 1)"),
        (&["--top-k", "1025"], "--top-k: 1025 is out of range (0 ..= 1024)"),
        (&["--top-k", "-1"], "--top-k: -1 is out of range (0 ..= 1024)"),
        (&["--seed", "-2"], "--seed: -2 is negative"),
        (&["-n", "0"], "--max-tokens: 0 is out of range (1 ..= 4294967295)"),
        (&["--threads", "5000"], "--threads: 5000 is out of range (0 ..= 4096)"),
        (
            &["--logprobs-top-k", "129"],
            "--logprobs-top-k: 129 is out of range (1 ..= 128)",
        ),
        (
            &["--backend", "cuda"],
            "--backend: \"cuda\" is not one of auto, hip, cpu",
        ),
        (
            &["--weights", "mmap"],
            "--weights: \"mmap\" is not one of auto, copy, map",
        ),
    ];
    assert_refused(&["run", "-m", m], &["-p", "hi"], cases);
}

#[test]
fn score_refuses_each_setting_out_of_range() {
    let m = unopened_model();
    let m = m.to_str().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (
            &["--ctx", "99999999999"],
            "--ctx: 99999999999 is out of range (2 ..= 1048576)",
        ),
        (&["--threads", "-1"], "--threads: -1 is out of range (0 ..= 4096)"),
        (
            &["--backend", "gpu0"],
            "--backend: \"gpu0\" is not one of auto, hip, cpu",
        ),
    ];
    assert_refused(&["score", "-m", m], &["--tokens", "1,2"], cases);
}

#[test]
fn bench_refuses_each_setting_out_of_range() {
    let m = unopened_model();
    let m = m.to_str().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (
            &["--ctx-max", "99999999999"],
            "--ctx-max + --gen-tokens: 100000000064 is out of range (2 ..= 1048576)",
        ),
        (&["--ctx-start", "0"], "--ctx-start 0 must be in 1..=--ctx-max 8192"),
        (&["--threads", "9999"], "--threads: 9999 is out of range (0 ..= 4096)"),
        (
            &["--backend", "rocm"],
            "--backend: \"rocm\" is not one of auto, hip, cpu",
        ),
        (
            &["--weights", "disk"],
            "--weights: \"disk\" is not one of auto, copy, map",
        ),
        (&["--peak-gbps", "-3"], "--peak-gbps: -3 is not a positive bandwidth"),
    ];
    assert_refused(&["bench", "-m", m], &[], cases);
}

/// The chat app checks its flags and config file before it needs a terminal; with stdout not a
/// terminal (as here) the first bad setting is the one line printed.
#[test]
fn chat_app_refuses_bad_flags_and_config_keys() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["--ctx", "99999999999"],
            "--ctx: 99999999999 is out of range (256 ..= 1048576)",
        ),
        (&["--temp", "-1"], "--temp: -1 is out of range (0 ..= 10)"),
        (&["--top-p", "5"], "--top-p: 5 is out of range (0 < top_p <= 1)"),
        (&["--top-k", "2000"], "--top-k: 2000 is out of range (0 ..= 1024)"),
        (&["--min-p", "2"], "--min-p: 2 is out of range (0 ..= 1)"),
        (&["--seed", "-1"], "--seed: -1 is negative"),
        (
            &["--max-tokens", "0"],
            "--max-tokens: 0 is out of range (1 ..= 4294967295)",
        ),
        (&["--threads", "-4"], "--threads: -4 is out of range (0 ..= 4096)"),
        (
            &["--backend", "cuda"],
            "--backend: \"cuda\" is not one of auto, hip, cpu",
        ),
    ];
    let empty = std::env::temp_dir().join(format!("ds4-chat-settings-empty-{}.toml", std::process::id()));
    std::fs::write(&empty, "").unwrap();
    assert_refused(&["--demo", "--config", empty.to_str().unwrap()], &[], cases);
    let keys = [
        (
            "ctx = 99999999999",
            "key `ctx`: 99999999999 is out of range (256 ..= 1048576)",
        ),
        ("temp = -1.0", "key `temp`: -1 is out of range (0 ..= 10)"),
        ("top_p = 5.0", "key `top_p`: 5 is out of range (0 < top_p <= 1)"),
        ("min_p = -0.1", "key `min_p`: -0.1 is out of range (0 ..= 1)"),
        ("top_k = 1025", "key `top_k`: 1025 is out of range (0 ..= 1024)"),
        ("seed = -1", "key `seed`: -1 is negative"),
        (
            "max_tokens = 0",
            "key `max_tokens`: 0 is out of range (1 ..= 4294967295)",
        ),
        ("threads = 4097", "key `threads`: 4097 is out of range (0 ..= 4096)"),
        (
            "backend = \"cuda\"",
            "key `backend`: \"cuda\" is not one of auto, hip, cpu",
        ),
        (
            "weights = \"mmap\"",
            "key `weights`: \"mmap\" is not one of auto, copy, map",
        ),
        (
            "think = \"maybe\"",
            "key `think`: \"maybe\" is not one of off, high, max",
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

/// A micro model file that states a context length of 64 tokens, removed on drop.
struct ShortModel(PathBuf);

impl ShortModel {
    fn write() -> ShortModel {
        use ds4_chat::genmodel::{ExpertMix, GenSpec, Preset, SyntheticModel};
        let mut spec = GenSpec::new(Preset::Micro, 3, ExpertMix::Q2);
        spec.hp.context_length = 64;
        let path = std::env::temp_dir().join(format!("ds4-chat-settings-ctx64-{}.gguf", std::process::id()));
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
    let model = ShortModel::write();
    let m = model.0.to_str().unwrap();
    let over = "--ctx: 65 is out of range (2 ..= 64, the model's context length)";
    let cpu = ["--backend", "cpu"];
    assert_refused(&["run", "-m", m], &["--tokens", "1,2"], &[(&["--ctx", "65"], over)]);
    assert_refused(&["score", "-m", m], &["--tokens", "1,2"], &[(&["--ctx", "65"], over)]);
    let bench: &[&str] = &["--ctx-start", "4", "--ctx-max", "8", "--gen-tokens", "56"];
    assert_refused(
        &["bench", "-m", m],
        &cpu,
        &[(
            bench,
            "--ctx-max + --gen-tokens: 65 is out of range (2 ..= 64, the model's context length)",
        )],
    );
    // Within the model's length the check passes: `score` runs on the CPU and prints its result.
    let out = Command::new(env!("CARGO_BIN_EXE_ds4-chat"))
        .args(["score", "-m", m, "--ctx", "64", "--tokens", "1,2", "--backend", "cpu"])
        .output()
        .expect("spawn ds4-chat");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}
