//! The tmux harness of the end-to-end tests (tests/tui_tmux.rs, tests/remote_tmux.rs): a private
//! tmux server per test, a pane running a shell, keys in and the screen out, and the shell's
//! `EXIT=n` line once the app has ended.
//!
//! Without tmux a test is skipped with a message, except under CI, where it must run
//! (tests/support/skip.rs).

#![allow(dead_code)]

use std::process::Command;
use std::time::{Duration, Instant};

pub struct Tmux {
    socket: String,
}

impl Tmux {
    /// A fresh tmux server with one `cols`×`rows` pane running `sh`, which is then given
    /// `command`; `None` (after printing why) when tmux is missing outside CI.
    pub fn open(test: &str, cols: u16, rows: u16, command: &str) -> Option<Tmux> {
        let have_tmux = Command::new("tmux")
            .arg("-V")
            .output()
            .is_ok_and(|o| o.status.success());
        if !have_tmux {
            crate::support::skip_or_fail("tmux is not installed (the TUI end-to-end tests need it)");
            return None;
        }
        // A fresh server name per start: a server just killed (the same test starting again) may
        // still hold its socket.
        static STARTS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let start = STARTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let t = Tmux {
            socket: format!("ds4chat-{test}-{}-{start}", std::process::id()),
        };
        let (x, y) = (cols.to_string(), rows.to_string());
        t.run(&["new-session", "-d", "-s", "e2e", "-x", &x, "-y", &y, "sh"]);
        std::thread::sleep(Duration::from_millis(300));
        t.command(command);
        Some(t)
    }

    /// Types `command` into the pane's shell and runs it.
    pub fn command(&self, command: &str) {
        self.literal(command);
        self.keys(&["Enter"]);
    }

    pub fn run(&self, args: &[&str]) -> String {
        // CI may run without TERM; the tmux client refuses to start without a usable one.
        let out = Command::new("tmux")
            .env("TERM", "xterm-256color")
            .arg("-L")
            .arg(&self.socket)
            .args(args)
            .output()
            .expect("run tmux");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn screen(&self) -> String {
        self.run(&["capture-pane", "-p", "-t", "e2e"])
    }

    pub fn alternate_on(&self) -> String {
        self.run(&["display", "-p", "-t", "e2e", "#{alternate_on}"])
            .trim()
            .to_string()
    }

    pub fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "e2e"];
        args.extend_from_slice(keys);
        self.run(&args);
    }

    pub fn literal(&self, text: &str) {
        self.run(&["send-keys", "-t", "e2e", "-l", text]);
    }

    /// Polls the screen until `pred` holds; panics with the last screen after `secs`.
    pub fn wait(&self, what: &str, secs: u64, pred: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        loop {
            let s = self.screen();
            if pred(&s) {
                return s;
            }
            if start.elapsed() > Duration::from_secs(secs) {
                panic!("timed out after {secs} s waiting for {what}; screen:\n{s}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .arg("-L")
            .arg(&self.socket)
            .arg("kill-server")
            .output();
    }
}

/// Quits the app with Esc twice (the second within the double-press window) and returns the screen
/// once the shell has printed the app's exit status.
pub fn quit_with_esc(t: &Tmux) -> String {
    t.keys(&["Escape"]);
    std::thread::sleep(Duration::from_millis(200));
    t.keys(&["Escape"]);
    t.wait("the app to exit", 30, |s| exit_line(s).is_some())
}

/// The shell's "EXIT=n" line once the app has ended.
pub fn exit_line(s: &str) -> Option<String> {
    s.lines()
        .find(|l| l.starts_with("EXIT=") && l[5..].starts_with(|c: char| c.is_ascii_digit()))
        .map(str::to_string)
}

/// Tokens of the newest answer, from its header ("DeepSeek  12 tok"); 0 while it has none.
pub fn tokens_shown(screen: &str) -> u32 {
    screen
        .lines()
        .filter_map(|l| l.find("▌ DeepSeek").map(|i| &l[i + "▌ DeepSeek".len()..]))
        .next_back()
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}
