//! `ds4-chat serve` end to end: the real binary on a free port, driven by the official `openai`
//! Python package (tests/support/serve_api_client.py): completions equal to `ds4-chat run` with the
//! same seed and settings (streaming and not), usage with cached tokens, timings, the queue (one
//! waits, one is refused), clients that hang up, malformed requests, and the API key on a
//! non-loopback bind. Skips with a "SKIPPED" line where python3 or `openai` is missing (a failure
//! under CI).

use std::path::Path;
use std::sync::Mutex;

use super::serve_process::{self, BIN, Server};
use crate::support;

const CTX: &str = "4096";
const MAX_BODY: &str = "65536";
/// The servers of the two tests would compete for the CPU; the hang-up timing wants it calm.
pub(crate) static ONE_SERVER: Mutex<()> = Mutex::new(());

/// Start `serve` on port 0 over `model` with `extra` flags and `env` (serve_process.rs), at this
/// module's context.
pub(crate) fn start(model: &Path, extra: &[&str], env: &[(&str, &str)]) -> Result<Server, String> {
    serve_process::start(model, CTX, extra, env)
}

/// Run tests/support/serve_api_client.py; panics with its output when a check failed. The number
/// of checks passed.
fn run_client(args: &[&str]) -> usize {
    serve_process::run_python_client("serve_api_client.py", args)
}

#[test]
fn openai_client_against_serve() {
    if !serve_process::have_python_packages(&["openai"]) {
        return;
    }
    let _one = ONE_SERVER.lock().unwrap_or_else(|e| e.into_inner());
    let model = support::serve_tiny_model();
    let server = start(&model, &["--queue", "1", "--max-body-bytes", MAX_BODY], &[]).expect("serve starts");
    let passed = run_client(&[
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
    assert!(passed >= 60, "expected the full check list, got {passed} checks");
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
    if !serve_process::have_python_packages(&["openai"]) {
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
