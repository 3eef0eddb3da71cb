//! Shared helpers of the TUI tests: synthetic worker events, key presses and plain-text snapshots of
//! a ratatui `TestBackend` buffer (tests/snapshots/*.txt; `UPDATE_SNAPSHOTS=1` rewrites them).

#![allow(dead_code)]

use std::path::PathBuf;
use std::time::Duration;

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ds4_chat::engine::events::{
    Command, Event, FinishReason, LoadRequest, ModelInfo, ModelSource, Residency, TextKind, WarmupPhase,
};
use ds4_chat::model::chat::ThinkMode;
use ds4_chat::tui::app::App;
use ds4_chat::tui::config::Config;
use ds4_chat::tui::effect::Effect;
use ratatui::Terminal;
use ratatui::backend::TestBackend;

pub const GIB: u64 = 1 << 30;

pub fn key(code: KeyCode) -> KeyEvent {
    KeyEvent::new(code, KeyModifiers::NONE)
}

pub fn ctrl(c: char) -> KeyEvent {
    KeyEvent::new(KeyCode::Char(c), KeyModifiers::CONTROL)
}

pub fn alt(code: KeyCode) -> KeyEvent {
    KeyEvent::new(code, KeyModifiers::ALT)
}

/// Performs `effects` as the run loop does (a save writes its file and its outcome goes back to the
/// app; a clipboard copy is dropped) and returns the commands for the worker.
pub fn settle(app: &mut App, effects: Vec<Effect>) -> Vec<Command> {
    let mut commands = Vec::new();
    for e in effects {
        match e {
            Effect::Engine(c) => commands.push(c),
            Effect::SaveTranscript { path, contents } => {
                let outcome = ds4_chat::tui::effect::save_transcript(path, &contents);
                let more = app.update(outcome);
                commands.extend(settle(app, more));
            }
            Effect::CopyToClipboard(_) => {}
            Effect::Session(store, op) => {
                let outcome = ds4_chat::tui::session_io::perform(&store, op);
                let more = app.update(ds4_chat::tui::event::AppEvent::Session(outcome));
                commands.extend(settle(app, more));
            }
        }
    }
    commands
}

/// Presses `k`; returns the commands produced.
pub fn press(app: &mut App, k: KeyEvent) -> Vec<Command> {
    let effects = app.on_key(k);
    settle(app, effects)
}

/// Types `text` key by key; returns the commands produced.
pub fn type_text(app: &mut App, text: &str) -> Vec<Command> {
    text.chars().flat_map(|c| press(app, key(KeyCode::Char(c)))).collect()
}

/// Types `text` and presses Enter.
pub fn send(app: &mut App, text: &str) -> Vec<Command> {
    let mut c = type_text(app, text);
    c.extend(press(app, key(KeyCode::Enter)));
    c
}

/// A seeded config (so the panel shows a fixed seed) with a 32k context.
pub fn config() -> Config {
    let mut c = Config::default();
    c.sampling.seed = Some(7);
    c
}

pub fn file_app() -> App {
    let load = LoadRequest {
        source: ModelSource::File("/models/DeepSeek-V4-Flash-q2.gguf".into()),
        ctx: 32768,
        backend: Default::default(),
        weights: Default::default(),
        arithmetic: Default::default(),
        threads: 0,
    };
    let mut app = App::new(config(), "DeepSeek-V4-Flash-q2.gguf".into(), Some(load));
    app.on_resize(110, 32);
    app
}

pub fn model_info() -> ModelInfo {
    ModelInfo {
        name: "DeepSeek V4 Flash".into(),
        file_bytes: 81 * GIB,
        n_layer: 43,
        n_vocab: 129280,
        ctx: 32768,
        context_length: 1 << 20,
        backend: "hip".into(),
        device: "Radeon 8060S (gfx1151)".into(),
        arithmetic: None,
        fallback_reason: None,
        kv_bytes: 3 * GIB / 2,
        scratch_bytes: GIB / 4,
        weight_bytes_per_token: 6 * GIB,
        is_demo: false,
        think_max_available: false,
        weights: None,
        endpoint: None,
        identity: "86973087744-00000000000000f1".into(),
    }
}

/// Loaded, warm-up 30 of 81 GiB after 10 s, residency sampled.
pub fn loaded_warming(app: &mut App) {
    app.on_engine_event(Event::LoadStarted {
        what: "DeepSeek-V4-Flash-q2.gguf".into(),
    });
    app.on_engine_event(Event::Loaded(model_info()));
    app.on_engine_event(Event::WarmupProgress {
        phase: WarmupPhase::PageIn,
        done_bytes: 30 * GIB,
        total_bytes: 81 * GIB,
        elapsed: Duration::from_secs(10),
    });
    app.on_engine_event(Event::Residency(Residency {
        total_bytes: 81 * GIB,
        resident_bytes: 30 * GIB,
        routed_experts: (26 * GIB, 75 * GIB),
        dense: (3 * GIB, 4 * GIB),
        embed_head: (GIB, 2 * GIB),
        device_bytes: 0,
        probe_time: Duration::from_millis(3),
    }));
}

pub fn warm_done(app: &mut App) {
    app.on_engine_event(Event::WarmupDone {
        total_bytes: 81 * GIB,
        elapsed: Duration::from_secs(27),
    });
}

/// The file-model app loaded and warmed up, ready for a prompt.
pub fn ready_app() -> App {
    let mut app = file_app();
    loaded_warming(&mut app);
    warm_done(&mut app);
    app
}

/// The worker starting a turn of `prompt_tokens` fresh tokens (nothing reused) in `think` mode.
pub fn turn_started(app: &mut App, prompt_tokens: u32, think: ThinkMode) {
    app.on_engine_event(Event::TurnStarted {
        prompt_tokens,
        reused_tokens: 0,
        think,
        note: None,
    });
}

/// A whole turn as the worker reports it: prefill, reasoning, answer, finish. Each token takes
/// `step` (so the turn's decode rate is 1 / step). Returns the commands the finish produced (the
/// session's snapshot when sessions are kept).
pub fn full_turn(app: &mut App, reasoning: &[&str], answer: &[&str], step: Duration) -> Vec<Command> {
    turn_started(app, 20, ThinkMode::High);
    app.on_engine_event(Event::PrefillDone {
        tokens: 20,
        elapsed: Duration::from_millis(400),
    });
    stream(app, TextKind::Reasoning, reasoning, step);
    stream(app, TextKind::Answer, answer, step);
    let n = (reasoning.len() + answer.len()) as u32;
    let effects = app.on_engine_event(Event::TurnFinished {
        reason: FinishReason::Eos,
        generated: n,
        context_used: 20 + n,
    });
    settle(app, effects)
}

pub fn stream(app: &mut App, kind: TextKind, pieces: &[&str], step: Duration) {
    for p in pieces {
        app.on_engine_event(Event::Text {
            kind,
            text: p.to_string(),
        });
        app.on_engine_event(Event::TokenTiming { step: 0, elapsed: step });
    }
}

/// Renders `app` at `w`×`h` and returns the screen as plain text (rows with trailing spaces cut).
pub fn screen(app: &App, w: u16, h: u16) -> String {
    let mut app = app.clone();
    app.on_resize(w, h);
    let mut t = Terminal::new(TestBackend::new(w, h)).unwrap();
    draw_text(&mut t, &app)
}

/// Draws `app` on an existing test terminal (as the run loop draws frame after frame) and returns
/// the screen as plain text.
pub fn draw_text(t: &mut Terminal<TestBackend>, app: &App) -> String {
    t.draw(|f| ds4_chat::tui::ui::draw(f, app)).unwrap();
    let buf = t.backend().buffer().clone();
    let (w, h) = (buf.area.width, buf.area.height);
    let mut out = String::new();
    for y in 0..h {
        let mut row = String::new();
        let mut skip = 0;
        for x in 0..w {
            if skip > 0 {
                skip -= 1;
                continue;
            }
            let sym = buf[(x, y)].symbol();
            row.push_str(sym);
            skip = unicode_width::UnicodeWidthStr::width(sym).saturating_sub(1);
        }
        out.push_str(row.trim_end());
        out.push('\n');
    }
    out
}

/// The roles of the `messages` of a saved conversation (a `/save` JSON file or a session file), in order.
pub fn message_roles(saved: &serde_json::Value) -> Vec<&str> {
    saved["messages"]
        .as_array()
        .expect("a messages array")
        .iter()
        .map(|m| m["role"].as_str().expect("a role string"))
        .collect()
}

/// Asserts that the screen `s` shows every one of `texts`.
pub fn assert_shows(s: &str, texts: &[&str]) {
    for t in texts {
        assert!(s.contains(t), "{t:?} is not on the screen:\n{s}");
    }
}

/// Compares `text` with tests/snapshots/`name`.txt (rewrites it when UPDATE_SNAPSHOTS=1).
pub fn assert_snapshot(name: &str, text: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/snapshots")
        .join(format!("{name}.txt"));
    if std::env::var("UPDATE_SNAPSHOTS").is_ok_and(|v| v == "1") {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|_| panic!("missing snapshot {} (run with UPDATE_SNAPSHOTS=1)", path.display()));
    if want != text {
        panic!(
            "snapshot {} differs (UPDATE_SNAPSHOTS=1 rewrites it)\n--- want\n{want}\n--- got\n{text}",
            path.display()
        );
    }
}
