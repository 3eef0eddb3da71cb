//! Tool loops through `ds4-chat serve` with the official `openai` and `anthropic` Python packages
//! (tests/support/serve_tools_client.py): a random tiny model does not call tools by itself, so the
//! server runs with the scripted engine (`DS4_TEST_SERVE_SCRIPT`, engine::scripted), which replies
//! with given token ids behind the real HTTP server, renderer, call parser and prompt cache. Each
//! client asks for a call, sends the result back and gets the model's answer, streamed and not;
//! bad tool input gets one-line 400s in each API's error shape. The same clients then run plain
//! requests on the tiny model itself, with an API key (`x-api-key` and Bearer). Skips with a
//! "SKIPPED" line where python3, `openai` or `anthropic` is missing (a failure under CI).

use std::path::Path;
use std::process::Command;

use ds4_chat::gguf::GgufFile;
use ds4_chat::model::tokenizer::Tokenizer;

use crate::serve_api::{ONE_SERVER, start};
use crate::serve_process;
use crate::support;

const CLIENT: &str = "serve_tools_client.py";

/// Whether python3 with both clients is here; else the skip (or CI failure) is reported.
fn have_clients() -> bool {
    serve_process::have_python_packages(&["openai", "anthropic"])
}

/// The scripted replies as token ids: the script's texts tokenized with added-token recognition, as
/// the model would sample them (`</think>` and the DSML markers are single tokens).
fn write_script(model: &Path) -> std::path::PathBuf {
    let out = Command::new("python3")
        .arg(serve_process::python_client(CLIENT))
        .arg("script")
        .output()
        .expect("run python3");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let texts: Vec<String> = serde_json::from_slice(&out.stdout).expect("the script is a JSON list");
    let tok = Tokenizer::from_gguf(&GgufFile::open(model).expect("open the tiny model")).expect("tokenizer");
    let dsml = tok.specials().dsml;
    let turns: Vec<Vec<u32>> = texts.iter().map(|t| tok.encode(t)).collect();
    assert!(
        turns.iter().filter(|ids| ids.contains(&dsml)).count() >= 5,
        "the calls use the DSML token"
    );
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join("serve-tools-script.json");
    std::fs::write(&path, serde_json::json!({ "turns": turns }).to_string()).expect("write the script");
    path
}

#[test]
fn openai_and_anthropic_clients_run_tool_loops() {
    if !have_clients() {
        return;
    }
    let _one = ONE_SERVER.lock().unwrap_or_else(|e| e.into_inner());
    let model = support::serve_tiny_model();
    let script = write_script(&model);
    let server = start(&model, &[], &[("DS4_TEST_SERVE_SCRIPT", script.to_str().unwrap())]).expect("serve starts");
    let passed = serve_process::run_python_client(CLIENT, &["loop", "--base", &server.base, "--model", "serve-tiny"]);
    assert!(passed >= 47, "expected the full check list, got {passed} checks");
}

#[test]
fn anthropic_client_plain_requests_with_a_key() {
    if !have_clients() {
        return;
    }
    let _one = ONE_SERVER.lock().unwrap_or_else(|e| e.into_inner());
    let model = support::serve_tiny_model();
    let key = "tools-key-0123456789";
    let server = start(
        &model,
        &["--host", "0.0.0.0", "--api-key-env", "DS4_SERVE_TOOLS_KEY"],
        &[("DS4_SERVE_TOOLS_KEY", key)],
    )
    .expect("serve starts");
    let local = server.base.replace("0.0.0.0", "127.0.0.1");
    let passed = serve_process::run_python_client(
        CLIENT,
        &["plain", "--base", &local, "--model", "serve-tiny", "--key", key],
    );
    assert!(passed >= 7, "expected the full check list, got {passed} checks");
}
