//! End-to-end test of the real binary in tmux with `--demo` (real worker, real CPU engine, tiny
//! generated model): type a prompt, see streamed text and a non-zero decode rate, cancel with Esc,
//! /clear, resize the pane mid-session, quit, and check the terminal left the alternate screen.
//!
//! `resume_in_tmux` chats, quits, starts again with `--resume` and checks that the earlier turn is on
//! screen, restored from its KV snapshot, and that the next answer follows it. Every run keeps its
//! sessions in its own directory under the target dir (`DS4_DATA_DIR`), never in the home directory.
//!
//! Skipped with a message when tmux is missing, except under CI (`CI` set, tests/support/skip.rs), where it must run
//! (tests/tmux_common).
//! The mid-stream screen is written to target/tui-demo-screen.txt.

use crate::tmux_common;
use crate::tui_common;

use std::path::PathBuf;

use tmux_common::{Tmux, exit_line, quit_with_esc, tokens_shown};

/// The decode rate the side panel shows ("Decode   12.3 t/s").
fn panel_rate(screen: &str) -> Option<f64> {
    screen.lines().find_map(|l| {
        let i = l.find("Decode")?;
        let rest = l[i + "Decode".len()..].trim_start();
        rest.split_whitespace().next()?.parse::<f64>().ok()
    })
}

/// Where the runs of `test` keep their sessions.
fn data_dir(test: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("tui-e2e-data-{test}-{}", std::process::id()))
}

/// Starts `ds4-chat --demo EXTRA` in a fresh tmux server (120×36); `None` (after printing why) when
/// tmux is missing outside CI.
fn start(test: &str, env: &str, extra: &str) -> Option<Tmux> {
    let bin = env!("CARGO_BIN_EXE_ds4-chat");
    // A config path that does not exist: the built-in defaults, whatever the user's file says.
    let config = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("tui-e2e-no-config.toml");
    let cmd = format!(
        "{env} DS4_DATA_DIR={} TERM=xterm-256color {bin} --demo --config {} {extra}; echo EXIT=$?",
        data_dir(test).display(),
        config.display()
    );
    Tmux::open(test, 120, 36, &cmd)
}

/// The pid of `parent`'s child process called `name` (from /proc/PID/stat: "pid (comm) state ppid ...").
fn child_named(parent: i32, name: &str) -> Option<i32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
        let (head, tail) = stat.rsplit_once(')')?;
        let comm = head.split_once('(')?.1;
        let ppid: i32 = tail.split_whitespace().nth(1)?.parse().ok()?;
        (ppid == parent && comm == name).then_some(pid)
    })
}

#[test]
fn sigterm_and_sighup_restore_the_terminal() {
    for sig in ["TERM", "HUP"] {
        let Some(t) = start(&format!("sig{sig}"), "", "") else {
            return;
        };
        t.wait("the app to start", 120, |s| s.contains("ds4-chat · demo model"));
        assert_eq!(t.alternate_on(), "1");
        let pid = t.run(&["display", "-p", "-t", "e2e", "#{pane_pid}"]);
        // The app is the pane shell's child.
        let app = child_named(pid.trim().parse().unwrap(), "ds4-chat").expect("ds4-chat runs in the pane");
        let signal = if sig == "TERM" { libc::SIGTERM } else { libc::SIGHUP };
        // SAFETY: kill(2) on the pid of the app this test started, with a valid signal number.
        assert_eq!(unsafe { libc::kill(app, signal) }, 0);
        let s = t.wait("the app to exit", 30, |s| exit_line(s).is_some());
        assert_eq!(
            t.alternate_on(),
            "0",
            "SIG{sig}: the terminal must leave the alternate screen\n{s}"
        );
    }
}

#[test]
fn panic_restores_the_terminal() {
    let Some(t) = start("panic", "DS4_TEST_PANIC=1", "") else {
        return;
    };
    let s = t.wait("the app to exit", 120, |s| exit_line(s).is_some());
    assert_eq!(t.alternate_on(), "0", "{s}");
    assert!(
        s.contains("DS4_TEST_PANIC"),
        "the panic message must show on the normal screen:\n{s}"
    );
    assert_ne!(exit_line(&s).as_deref(), Some("EXIT=0"), "{s}");
}

#[test]
fn demo_chat_in_tmux() {
    let Some(t) = start("chat", "", "--ctx 4096 --nothink --seed 3 --threads 2") else {
        return;
    };

    // Loaded: the demo banner and the ready state, on the alternate screen.
    t.wait("the app to be ready", 120, |s| {
        s.contains("● ready") && s.contains("DEMO")
    });
    assert_eq!(t.alternate_on(), "1", "the app must use the alternate screen");

    // A prompt streams an answer and the panel shows a non-zero decode rate.
    t.literal("Tell me about the sea.");
    t.keys(&["Enter"]);
    let mid = t.wait("streamed text and a decode rate", 120, |s| {
        s.contains("◉ generating") && panel_rate(s).is_some_and(|r| r > 0.0) && s.contains("▍") && tokens_shown(s) >= 8
    });
    let out = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/tui-demo-screen.txt");
    let _ = std::fs::write(&out, &mid);
    eprintln!("mid-stream screen (also in {}):\n{mid}", out.display());

    // Esc cancels.
    t.keys(&["Escape"]);
    t.wait("the cancel to land", 60, |s| {
        s.contains("[cancelled]") && s.contains("● ready")
    });

    // /clear forgets the conversation.
    t.literal("/clear");
    t.keys(&["Enter"]);
    t.wait("the conversation to clear", 30, |s| {
        s.contains("conversation cleared") && !s.contains("Tell me about the sea.")
    });

    // Resize: below 100 columns the panel becomes a one-line strip.
    t.run(&["resize-window", "-t", "e2e", "-x", "80", "-y", "24"]);
    t.wait("the narrow layout", 30, |s| {
        s.lines().count() <= 24 && s.contains(" t/s │ ") && s.contains("│ ctx ") && !s.contains("Performance (F2)")
    });
    // Too small, then big again.
    t.run(&["resize-window", "-t", "e2e", "-x", "50", "-y", "12"]);
    t.wait("the too-small notice", 30, |s| s.contains("terminal too small"));
    t.run(&["resize-window", "-t", "e2e", "-x", "120", "-y", "36"]);
    t.wait("the wide layout", 30, |s| s.contains("Performance (F2)"));

    // Quit with Esc twice: the shell is back and the alternate screen is left.
    quit(&t);
}

/// Esc twice: the app exits with status 0 and leaves the alternate screen.
fn quit(t: &Tmux) {
    let s = quit_with_esc(t);
    assert_eq!(exit_line(&s).as_deref(), Some("EXIT=0"), "{s}");
    assert_eq!(t.alternate_on(), "0", "the terminal must leave the alternate screen");
}

#[test]
fn resume_in_tmux() {
    let flags = "--ctx 4096 --nothink --seed 3 --threads 2 --max-tokens 16";
    let data = data_dir("resume");
    let _ = std::fs::remove_dir_all(&data);
    let Some(t) = start("resume", "", flags) else {
        return;
    };
    t.wait("the app to be ready", 120, |s| s.contains("● ready"));
    t.literal("What is the capital of Mars?");
    t.keys(&["Enter"]);
    t.wait("the first answer", 120, |s| {
        s.contains("● ready") && tokens_shown(s) > 0 && s.contains("What is the capital of Mars?")
    });
    quit(&t);
    drop(t);
    let sessions = data.join("sessions");
    let names: Vec<String> = std::fs::read_dir(&sessions)
        .expect("the sessions directory")
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names.iter().any(|n| n.ends_with(".json")) && names.iter().any(|n| n.ends_with(".kv")),
        "{names:?}"
    );
    let json = sessions.join(names.iter().find(|n| n.ends_with(".json")).unwrap());
    let read = || -> serde_json::Value { serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap() };
    let first_ids = read()["transcript"]["ids"].as_array().unwrap().clone();
    assert!(!first_ids.is_empty());

    // Again with --resume: the earlier turn is on screen, the cache came from the snapshot.
    let Some(t) = start("resume", "", &format!("{flags} --resume")) else {
        return;
    };
    let s = t.wait("the resumed session", 120, |s| {
        s.contains("● ready") && s.contains("What is the capital of Mars?") && s.contains("from its KV snapshot")
    });
    eprintln!("resumed screen:\n{s}");
    t.literal("And of Venus?");
    t.keys(&["Enter"]);
    // Ready again with a second answer header that counts tokens (the restored turn's header shows
    // no figures), so a screen from before the Enter was read does not pass.
    t.wait("the next answer", 120, |s| {
        s.contains("● ready")
            && s.matches("▌ DeepSeek").count() == 2
            && tokens_shown(s) > 0
            && s.contains("What is the capital of Mars?")
    });
    quit(&t);
    // The session file now holds both turns, lowercase roles, and a transcript that extends the
    // first one's (the second answer followed the first turn's tokens).
    let rec = read();
    let roles = tui_common::message_roles(&rec);
    assert_eq!(roles, ["user", "assistant", "user", "assistant"]);
    assert_eq!(rec["messages"][2]["content"], "And of Venus?");
    let ids = rec["transcript"]["ids"].as_array().unwrap();
    assert!(
        ids.len() > first_ids.len() && ids.starts_with(&first_ids),
        "the second turn does not extend the first"
    );
    let _ = std::fs::remove_dir_all(&data);
}
