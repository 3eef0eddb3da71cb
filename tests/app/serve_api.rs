//! `ds4-chat serve` end to end: the real binary on a free port, driven by the official `openai`
//! Python package (tests/support/serve_api_client.py): completions equal to `ds4-chat run` with the
//! same seed and settings (streaming and not), usage with cached tokens, timings, the queue (one
//! waits, one is refused), clients that hang up, malformed requests, and the API key on a
//! non-loopback bind. Skips with a "SKIPPED" line where python3 or `openai` is missing (a failure
//! under CI).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::support;

const BIN: &str = env!("CARGO_BIN_EXE_ds4-chat");
const CTX: &str = "4096";
const MAX_BODY: &str = "65536";
/// The servers of the two tests would compete for the CPU; the hang-up timing wants it calm.
pub(crate) static ONE_SERVER: Mutex<()> = Mutex::new(());

fn client_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/serve_api_client.py")
}

/// Whether python3 with `openai` is here; else the skip (or CI failure) is reported.
fn have_openai() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import openai"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        support::skip_or_fail("python3 with the openai package is needed (pip install openai)");
    }
    ok
}

/// A running server, killed on drop.
pub(crate) struct Server {
    child: Child,
    pub(crate) base: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Start `serve` on port 0 with `extra` flags and `env`; Ok(server) once it listens, Err(stderr)
/// when it exits first.
pub(crate) fn start(model: &Path, extra: &[&str], env: &[(&str, &str)]) -> Result<Server, String> {
    let mut cmd = Command::new(BIN);
    cmd.arg("serve")
        .arg(model)
        .args(["--port", "0", "--backend", "cpu", "--threads", "2", "--ctx", CTX])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    // Owned by the guard from here on, so every path kills and reaps it.
    let mut server = Server {
        child: cmd.spawn().expect("start ds4-chat serve"),
        base: String::new(),
    };
    let stderr = server.child.stderr.take().expect("piped stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("[serve] {line}");
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut seen = Vec::new();
    while Instant::now() < deadline {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(line) => {
                if let Some(addr) = line.split("listening on ").nth(1) {
                    server.base = addr.trim().to_string();
                    return Ok(server);
                }
                seen.push(line);
            }
            Err(_) => {
                if let Ok(Some(status)) = server.child.try_wait() {
                    // The reader thread may still hold the last lines.
                    while let Ok(line) = rx.recv_timeout(Duration::from_millis(200)) {
                        seen.push(line);
                    }
                    return Err(format!("exited with {status}: {}", seen.join(" | ")));
                }
            }
        }
    }
    panic!("serve did not start listening within 120 s: {}", seen.join(" | "));
}

/// Run the client script; panics with its output when a check failed.
fn run_client(args: &[&str]) -> String {
    let out = Command::new("python3")
        .arg(client_script())
        .args(args)
        .output()
        .expect("run python3");
    let text = String::from_utf8_lossy(&[out.stdout, out.stderr].concat()).into_owned();
    println!("{text}");
    assert!(out.status.success(), "serve_api_client.py {}:\n{text}", args[0]);
    assert!(text.contains(" passed, 0 failed"), "{text}");
    text
}

#[test]
fn openai_client_against_serve() {
    if !have_openai() {
        return;
    }
    let _one = ONE_SERVER.lock().unwrap_or_else(|e| e.into_inner());
    let model = support::serve_tiny_model();
    let server = start(&model, &["--queue", "1", "--max-body-bytes", MAX_BODY], &[]).expect("serve starts");
    let text = run_client(&[
        "main",
        "--base",
        &server.base,
        "--model",
        "serve-tiny",
        "--bin",
        BIN,
        "--model-file",
        model.to_str().unwrap(),
        "--ctx",
        CTX,
        "--max-body",
        MAX_BODY,
    ]);
    let passed: usize = text
        .lines()
        .find_map(|l| l.strip_suffix(" passed, 0 failed"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    assert!(
        passed >= 60,
        "expected the full check list, got {passed} checks:\n{text}"
    );
}

#[test]
fn non_loopback_bind_needs_an_api_key() {
    let _one = ONE_SERVER.lock().unwrap_or_else(|e| e.into_inner());
    let model = support::serve_tiny_model();
    let refused = start(&model, &["--host", "0.0.0.0"], &[])
        .err()
        .expect("0.0.0.0 without a key is refused");
    assert!(
        refused.contains("needs an API key") && refused.contains("--api-key-env"),
        "{refused}"
    );
    let unset = start(
        &model,
        &["--host", "0.0.0.0", "--api-key-env", "DS4_SERVE_TEST_UNSET"],
        &[],
    )
    .err()
    .expect("an unset key variable is refused");
    assert!(
        unset.contains("DS4_SERVE_TEST_UNSET: the variable is not set"),
        "{unset}"
    );
    if !have_openai() {
        return;
    }
    let key = "test-key-0123456789";
    let server = start(
        &model,
        &["--host", "0.0.0.0", "--api-key-env", "DS4_SERVE_TEST_KEY"],
        &[("DS4_SERVE_TEST_KEY", key)],
    )
    .expect("0.0.0.0 with a key starts");
    assert!(server.base.starts_with("http://0.0.0.0:"), "{}", server.base);
    let local = server.base.replace("0.0.0.0", "127.0.0.1");
    run_client(&["auth", "--base", &local, "--model", "serve-tiny", "--key", key]);
}
