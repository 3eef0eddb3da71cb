//! `bench --replay-acceptance` on the CPU engine: the replay drafter runs through the real decode
//! loop and block verify, and the tokens it hands out are the plain run's (the CPU engine is exact,
//! so equality is the property, with no tolerance: docs/speculative.md#measuring).

use std::process::Command;

use crate::settings_cli::ShortModel;

/// The numbers before each of `words` in `line` ("5 cycles, 9 drafted" → [5, 9]).
fn counts(line: &str, words: &[&str]) -> Vec<usize> {
    words
        .iter()
        .map(|w| {
            let before = line.split(w).next().unwrap_or_else(|| panic!("no `{w}` in: {line}"));
            let n = before.trim_end().rsplit(' ').next().unwrap();
            n.parse().unwrap_or_else(|_| panic!("no count before `{w}` in: {line}"))
        })
        .collect()
}

#[test]
fn replay_drafter_output_equals_plain_decode_on_the_cpu() {
    let model = ShortModel::with_context("bench-replay", 256);
    let out = Command::new(env!("CARGO_BIN_EXE_ds4-chat"))
        .args(["bench", "-m", model.0.to_str().unwrap(), "--backend", "cpu", "-t", "1"])
        .args(["--ctx-start", "16", "--ctx-max", "16", "--gen-tokens", "48"])
        .args(["--replay-acceptance", "0,0.8"])
        .output()
        .expect("spawn ds4-chat");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let line = |a: &str| {
        stderr
            .lines()
            .find(|l| l.contains(&format!("replay acceptance {a}:")))
            .unwrap_or_else(|| panic!("no replay line for {a}:\n{stderr}"))
            .to_string()
    };
    for a in ["0", "0.8"] {
        let l = line(a);
        let [same, total] = counts(&l, &[" of ", " tokens equal"])[..] else {
            unreachable!()
        };
        assert_eq!((same, total), (48, 48), "{l}");
    }
    // At 0.8 drafts were verified and kept (so the equality compared verified blocks, not only
    // plain steps; the scheduler decides how many); at 0 none was kept.
    let [drafted, accepted] = counts(&line("0.8"), &[" drafted", " accepted"])[..] else {
        unreachable!()
    };
    assert!(drafted > 0 && accepted > 0, "{}", line("0.8"));
    assert_eq!(counts(&line("0"), &[" accepted"]), vec![0]);
}
