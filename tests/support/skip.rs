//! Skipping a check that cannot run here, the one way every integration test does it: a line
//! `SKIPPED: <test>: <why>` written to the process's stderr itself, which the test harness does not
//! capture (it captures only the print macros), so a plain `cargo test` shows it; and under CI a
//! skip of a required check is a failure instead.
//!
//! Included by tests/support/mod.rs and, on its own, by tests/hip_emu/mod.rs (whose users do not all
//! have tests/support).

#![allow(dead_code)]

use std::io::Write;

/// True when running under CI: `CI` set to anything but empty, `0` or `false` (CI services set
/// `CI=true`, some `CI=1`).
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !matches!(v.trim().to_ascii_lowercase().as_str(), "" | "0" | "false"))
}

/// A required check that cannot run here (a missing tool CI installs): under CI a panic naming
/// `why`; elsewhere a "SKIPPED" line naming the test and `why`.
pub fn skip_or_fail(why: &str) {
    if in_ci() {
        panic!("{why}; CI is set, so this is a failure, not a skip");
    }
    write_line(why);
}

/// A part of a test that this machine cannot check (a filesystem without the feature it needs): a
/// "SKIPPED" line, under CI too, since CI's filesystem may lack it as well.
pub fn skip_part(why: &str) {
    write_line(why);
}

fn write_line(why: &str) {
    let test = std::thread::current().name().unwrap_or("test").to_string();
    // One write, so the line is not split by the harness's own output.
    let _ = std::io::stderr().write_all(format!("\nSKIPPED: {test}: {why}\n").as_bytes());
}
