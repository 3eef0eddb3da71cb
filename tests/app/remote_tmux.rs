//! End-to-end tests of `--remote` in tmux: the real binary against a fake OpenAI-compatible server
//! (tests/support/fake_openai.py, Python stdlib only). A prompt streams reasoning and answer with
//! the panel's remote figures; reasoning written inline as <think>…</think> is split; Esc closes
//! the stream (the server sees the client go); a 500, a stream cut mid-answer, a silent server
//! (timeout), a 401 and an unknown model are one-line messages; a server killed mid-answer gives a
//! message and the app keeps running. The same against our own `ds4-chat serve` on the tiny model.
//!
//! Skipped with a message when tmux or python3 is missing, except under CI (`CI` set, tests/support/skip.rs), where they
//! must run.

use crate::support;
use crate::tmux_common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tmux_common::{Tmux, exit_line, quit_with_esc, tokens_shown};

/// A server process of a test: killed and reaped on drop, or earlier by `kill`.
struct Reaped(Child);

impl Reaped {
    fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The fake server, its port, and what it printed (one line per request outcome).
struct FakeServer {
    child: Reaped,
    port: u16,
    log: Arc<Mutex<Vec<String>>>,
}

impl FakeServer {
    /// Starts tests/support/fake_openai.py on a free loopback port; `None` (after printing why)
    /// when python3 is missing outside CI.
    fn start(test: &str, extra: &[&str]) -> Option<FakeServer> {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/support/fake_openai.py");
        let spawned = Command::new("python3")
            .arg(&script)
            .args(["--port", "0"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn();
        let mut child = match spawned {
            Ok(c) => c,
            Err(e) => {
                support::skip_or_fail(&format!("{test}: cannot run python3: {e}"));
                return None;
            }
        };
        let mut lines = BufReader::new(child.stdout.take().expect("piped stdout")).lines();
        let first = lines.next().and_then(Result::ok).unwrap_or_default();
        let port = first
            .strip_prefix("PORT ")
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or_else(|| panic!("the fake server did not report its port: {first:?}"));
        let log = Arc::new(Mutex::new(Vec::new()));
        let sink = log.clone();
        std::thread::spawn(move || {
            for l in lines.map_while(Result::ok) {
                sink.lock().unwrap().push(l);
            }
        });
        Some(FakeServer {
            child: Reaped(child),
            port,
            log,
        })
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }

    /// Waits until the server has printed `line`.
    fn wait_log(&self, line: &str, secs: u64) {
        let start = Instant::now();
        while !self.log.lock().unwrap().iter().any(|l| l == line) {
            assert!(
                start.elapsed() < Duration::from_secs(secs),
                "the fake server never printed {line:?}; it printed {:?}",
                self.log.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn kill(&mut self) {
        self.child.kill();
    }
}

/// A config file with a silence timeout of `secs`.
fn config_file(name: &str, secs: u32) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::write(&p, format!("[remote]\ntimeout = {secs}\n")).unwrap();
    p
}

/// Runs `ds4-chat ARGS` in a fresh 200×44 tmux pane (wide, so each message stays on one line).
fn start_app(test: &str, env: &str, args: &str) -> Option<Tmux> {
    let bin = env!("CARGO_BIN_EXE_ds4-chat");
    let cmd = format!("{env} TERM=xterm-256color {bin} {args}; echo EXIT=$?");
    Tmux::open(test, 200, 44, &cmd)
}

/// Starts the app again in `t`'s shell with `args`, the server's key in FAKE_KEY and `--model model`.
fn start_again_with_key(t: &Tmux, args: &str, model: &str) {
    t.command(&format!(
        "FAKE_KEY=sekrit TERM=xterm-256color {} {args} --api-key-env FAKE_KEY --model {model}; echo EXIT=$?",
        env!("CARGO_BIN_EXE_ds4-chat")
    ));
}

/// A fake server started with `server_args` and the app in tmux talking to it (config
/// `{test}.toml`, a 2 s silence timeout), with the app's arguments; `None` when either is skipped.
fn app_against_fake_server(test: &str, server_args: &[&str]) -> Option<(FakeServer, Tmux, String)> {
    let server = FakeServer::start(test, server_args)?;
    let config = config_file(&format!("{test}.toml"), 2);
    let args = format!("--remote {} --config {}", server.url(), config.display());
    let t = start_app(test, "", &args)?;
    Some((server, t, args))
}

fn send(t: &Tmux, text: &str) {
    t.literal(text);
    t.keys(&["Enter"]);
}

/// The screen shows `text` on the last turn, the app is ready again.
fn ready_with(t: &Tmux, what: &str, text: &str) -> String {
    t.wait(what, 20, |s| s.contains(text) && s.contains("● ready"))
}

#[test]
fn remote_chat_against_a_fake_server() {
    let Some((mut server, t, _)) = app_against_fake_server("remote-chat", &[]) else {
        return;
    };
    let s = t.wait("the app to be ready", 30, |s| {
        s.contains("● ready") && s.contains("fake-model")
    });
    assert_eq!(t.alternate_on(), "1");
    for gauge in [
        "Warm-up  remote",
        "Resident remote",
        "KV cache remote",
        "Device   remote",
    ] {
        assert!(s.contains(gauge), "local gauges say remote: {gauge}\n{s}");
    }
    assert!(s.contains(&server.url()), "the panel names the endpoint\n{s}");

    // Reasoning streams first (reasoning_content), then the answer; the panel has the figures.
    send(&t, "Why is the sky blue?");
    t.wait("streamed reasoning", 20, |s| {
        s.contains("Thinking…") && s.contains("Rayleigh scattering")
    });
    let s = ready_with(&t, "the answer", "because air scatters blue light more than red.");
    assert!(
        s.contains("▸ Reasoning · 10 words"),
        "the reasoning folds once answered\n{s}"
    );
    assert!(s.contains("TTFT"), "{s}");
    assert!(s.contains("prefill 40 ms · 200 t/s"), "the server's timings\n{s}");
    assert!(s.contains("decode 20.0 t/s"), "{s}");
    assert!(s.contains("Prompt   20 tok (12 cached)"), "the server's usage\n{s}");
    assert!(
        s.contains("Context  42 / 4.1k"),
        "context from usage and max_model_len\n{s}"
    );

    // Reasoning inline in the content, tags cut across chunks.
    send(&t, "inline please");
    let s = ready_with(&t, "the inline answer", "Inline answer.");
    assert!(s.contains("▸ Reasoning · 2 words"), "{s}");
    assert!(!s.contains("<think>") && !s.contains("</th"), "tags are not shown\n{s}");

    // Esc closes the stream: the app is ready at once and the server sees the client go.
    send(&t, "a long story");
    t.wait("the long answer", 20, |s| s.contains("word3"));
    t.keys(&["Escape"]);
    t.wait("the cancel", 5, |s| s.contains("[cancelled]") && s.contains("● ready"));
    server.wait_log("DISCONNECTED", 10);

    // Failures are one line each; the app keeps going.
    send(&t, "fail now");
    ready_with(&t, "the 500", "✖ server error 500 from http://127.0.0.1");
    t.wait("the server's message", 5, |s| {
        s.contains(": the fake server failed on purpose")
    });
    send(&t, "cut me off");
    ready_with(&t, "the cut stream", "closed the stream before the answer finished");
    send(&t, "slow please");
    ready_with(&t, "the timeout", "sent nothing for 2 s (timeout");

    // The server dies mid-answer: a message, the app still runs; the next turn finds no server.
    send(&t, "another long story");
    t.wait("the second long answer", 20, |s| s.contains("word5"));
    server.kill();
    let s = t.wait("the broken stream", 20, |s| {
        s.contains("● ready") && (s.contains("broke off") || s.contains("closed the stream before"))
    });
    assert!(exit_line(&s).is_none(), "the app keeps running\n{s}");
    send(&t, "anyone there?");
    ready_with(
        &t,
        "the refused connection",
        "connection refused (is the server running?)",
    );

    // Quit: Esc twice.
    let s = quit_with_esc(&t);
    assert_eq!(exit_line(&s).as_deref(), Some("EXIT=0"), "{s}");
    assert_eq!(t.alternate_on(), "0");
}

#[test]
fn remote_api_key_and_unknown_model() {
    // No key: the model list is refused, the app says so and keeps running.
    let Some((server, t, args)) = app_against_fake_server("remote-auth", &["--api-key", "sekrit"]) else {
        return;
    };
    let s = t.wait("the 401", 30, |s| {
        s.contains("refused the request (401 Unauthorized): invalid API key")
    });
    assert!(s.contains("--api-key-env VAR") && s.contains("● ready"), "{s}");
    quit_with_esc(&t);

    // (The app's screens were on the alternate screen: the shell's screen has none of their text.)
    // A model the server does not list.
    start_again_with_key(&t, &args, "nope");
    t.wait("the unknown model", 30, |s| {
        s.contains("does not serve the model nope (it lists: fake-model)") && s.contains("● ready")
    });
    quit_with_esc(&t);

    // With the key and the right model: an answer.
    start_again_with_key(&t, &args, "fake-model");
    t.wait("the app to be ready", 30, |s| {
        s.contains("● ready") && s.contains("fake-model")
    });
    send(&t, "Why is the sky blue?");
    ready_with(&t, "the answer", "because air scatters blue light more than red.");
    server.wait_log("DONE", 5);
    assert!(
        server
            .log
            .lock()
            .unwrap()
            .iter()
            .filter(|l| *l == "UNAUTHORIZED")
            .count()
            >= 1
    );
}

/// `ds4-chat serve` on the tiny generated model (`support::serve_tiny_model`),
/// on a free loopback port; killed on drop.
struct OwnServe {
    child: Reaped,
    url: String,
}

impl OwnServe {
    fn start() -> OwnServe {
        let bin = env!("CARGO_BIN_EXE_ds4-chat");
        let model = support::serve_tiny_model();
        let mut child = Command::new(bin)
            .arg("serve")
            .arg(&model)
            .args(["--port", "0", "--backend", "cpu", "--threads", "2", "--ctx", "4096"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start ds4-chat serve");
        let mut lines = BufReader::new(child.stderr.take().expect("piped stderr")).lines();
        let mut seen = Vec::new();
        let url = loop {
            match lines.next() {
                Some(Ok(line)) => match line.split("listening on ").nth(1) {
                    Some(addr) => break format!("{}/v1", addr.trim()),
                    None => seen.push(line),
                },
                _ => panic!("serve ended before listening: {}", seen.join(" | ")),
            }
        };
        // Keep draining its log so the server never blocks on a full pipe.
        std::thread::spawn(move || lines.map_while(Result::ok).for_each(drop));
        OwnServe {
            child: Reaped(child),
            url,
        }
    }
}

#[test]
fn remote_chat_against_ds4_chat_serve() {
    let mut serve = OwnServe::start();
    // A loaded machine may keep the tiny model's answer waiting for seconds; no timeout here.
    let config = config_file("remote-serve.toml", 120);
    let args = format!(
        "--remote {} --config {} --seed 3 --max-tokens 300",
        serve.url,
        config.display()
    );
    let Some(t) = start_app("remote-serve", "", &args) else {
        return;
    };
    t.wait("the app to be ready", 60, |s| {
        s.contains("● ready") && s.contains("serve-tiny")
    });

    // A whole turn: reasoning streams (reasoning_content), then the server's figures show.
    send(&t, "Why is the sky blue?");
    t.wait("streamed reasoning", 60, |s| {
        s.contains("Thinking…") && tokens_shown(s) >= 5
    });
    let s = t.wait("the turn to end", 120, |s| {
        s.contains("● ready") && s.contains("Server   prefill")
    });
    assert!(s.contains("Reasoning ·"), "the reasoning is on screen\n{s}");
    assert!(
        s.contains("Prompt   ") && s.contains("Answer   "),
        "the server's usage\n{s}"
    );
    assert!(s.contains("decode ") && s.contains("Context  "), "{s}");

    // Esc mid-answer.
    send(&t, "Tell me more.");
    t.wait("the second answer", 60, |s| {
        s.contains("◉ generating") && tokens_shown(s) >= 5
    });
    t.keys(&["Escape"]);
    t.wait("the cancel", 10, |s| s.contains("[cancelled]") && s.contains("● ready"));

    // The server is killed mid-answer: one message, the app keeps running.
    send(&t, "And once more.");
    t.wait("the third answer", 60, |s| {
        s.contains("◉ generating") && tokens_shown(s) >= 3
    });
    serve.child.kill();
    let s = t.wait("the broken stream", 20, |s| {
        s.contains("● ready") && (s.contains("broke off") || s.contains("closed the stream before"))
    });
    assert!(exit_line(&s).is_none(), "the app keeps running\n{s}");
    let s = quit_with_esc(&t);
    assert_eq!(exit_line(&s).as_deref(), Some("EXIT=0"), "{s}");
}

/// llama.cpp's server through `llama-cpp-python[server]` on a tiny random llama GGUF
/// (tests/support/tiny_llama_gguf.py): an OpenAI-compatible server that is not ours. Not run by
/// default, nor in CI: the package builds llama.cpp from source, longer than CI's budget
/// (docs/remote.md#an-independent-server). Run with `--ignored` where it is installed.
#[test]
#[ignore = "needs llama-cpp-python[server] (pip install 'llama-cpp-python[server]' gguf numpy): cargo test --release --test app remote_chat_against_llama_cpp -- --ignored"]
fn remote_chat_against_llama_cpp_python_server() {
    let have = Command::new("python3")
        .args(["-c", "import llama_cpp.server, gguf, numpy"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        have,
        "python3 with llama_cpp.server, gguf and numpy is needed: pip install 'llama-cpp-python[server]' gguf numpy"
    );
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let model = dir.join("tiny-llama.gguf");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/support/tiny_llama_gguf.py");
    let out = Command::new("python3").arg(&script).arg(&model).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let _server = Reaped(
        Command::new("python3")
            .args(["-m", "llama_cpp.server", "--host", "127.0.0.1", "--n_ctx", "2048"])
            .args(["--model_alias", "tiny-llama", "--port", &port.to_string(), "--model"])
            .arg(&model)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start llama_cpp.server"),
    );
    let url = format!("http://127.0.0.1:{port}/v1");
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "llama_cpp.server did not listen"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let config = config_file("remote-llama.toml", 60);
    let args = format!("--remote {url} --config {} --max-tokens 48 --seed 1", config.display());
    let Some(t) = start_app("remote-llama", "", &args) else {
        return;
    };
    t.wait("the app to be ready", 60, |s| {
        s.contains("● ready") && s.contains("tiny-llama")
    });
    // Its chat template opens <think> in the prompt: the stream counts as reasoning.
    send(&t, "Why is the sky blue?");
    let s = t.wait("a finished answer", 120, |s| {
        s.contains("● ready") && tokens_shown(s) > 0 && s.contains("Reasoning ·")
    });
    assert!(s.contains("TTFT") && !s.contains("✖"), "{s}");
    let s = quit_with_esc(&t);
    assert_eq!(exit_line(&s).as_deref(), Some("EXIT=0"), "{s}");
}
