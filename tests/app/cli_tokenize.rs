//! `ds4-chat tokenize` through the binary on a metadata-only GGUF (tokenizer keys, no tensors).

use crate::common;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_ds4-chat");
/// Official ids of the example (HF tokenizers on the official tokenizer.json).
const HELLO: &str = "Hello! 毕老师！1 + 1 = 2";
const HELLO_IDS: [u32; 13] = [19923, 3, 223, 5464, 5008, 1175, 19, 940, 223, 19, 438, 223, 20];

/// `ds4-chat tokenize OPTIONS --model MODEL TEXT`, run to completion.
fn tokenize(options: &[&str], model: &Path, text: &str) -> Output {
    Command::new(BIN)
        .arg("tokenize")
        .args(options)
        .arg("--model")
        .arg(model)
        .arg(text)
        .output()
        .unwrap()
}

#[test]
fn prints_official_ids_one_per_line_and_as_json() {
    let model = common::tokenizer_gguf_file("tok_cli_a.gguf", "deepseek4");
    let out = tokenize(&[], &model, HELLO);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    let ids: Vec<u32> = lines
        .iter()
        .map(|l| l.split('\t').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(ids, HELLO_IDS);
    assert_eq!(lines[0], "19923\tHello");
    assert_eq!(lines[2], "223\t ");
    // Each line's text is the token's bytes; together (no escapes needed here) they spell the input.
    let joined: String = lines.iter().map(|l| l.split_once('\t').unwrap().1).collect();
    assert_eq!(joined, HELLO);

    let out = tokenize(&["--json"], &model, "<｜User｜>hi\n");
    assert!(out.status.success());
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(stdout.lines().count(), 1);
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    // Official ids (Python tokenizers on tokenizer.json).
    assert_eq!(v["ids"], serde_json::json!([128803, 6366, 201]));
    assert_eq!(v["tokens"], serde_json::json!(["<｜User｜>", "hi", "\n"]));
}

#[test]
fn reads_stdin_and_plain_mode() {
    let model = common::tokenizer_gguf_file("tok_cli_b.gguf", "deepseek4");
    let mut child = Command::new(BIN)
        .args(["tokenize", "--json", "--plain", "--model"])
        .arg(&model)
        .arg("-")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all("<think>x".as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ids: Vec<u32> = v["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect();
    // Plain text: no added token, and the pieces spell the input.
    assert_eq!(ids, common::gguf_tokenizer().encode_plain("<think>x"));
    assert!(!ids.contains(&128821));
}

#[test]
fn rejects_other_architectures_and_missing_files() {
    let model = common::tokenizer_gguf_file("tok_cli_llama.gguf", "llama");
    let out = tokenize(&[], &model, "x");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("general.architecture is 'llama', expected 'deepseek4'"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");

    let out = tokenize(&[], Path::new("/nonexistent/model.gguf"), "x");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/model.gguf"));
}
