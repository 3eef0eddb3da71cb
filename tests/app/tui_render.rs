//! Render tests of the TUI on ratatui's TestBackend: each scenario feeds synthetic worker events to
//! `App`, checks the figures it must show (computed here from the event values) and compares the
//! whole screen with a committed plain-text snapshot (tests/snapshots/; UPDATE_SNAPSHOTS=1 rewrites).

use crate::tui_common;

use std::time::Duration;

use crossterm::event::KeyCode;
use ds4_chat::engine::events::{Event, ModelSource, TextKind};
use ds4_chat::tui::app::{App, Phase};
use tui_common::*;

const W: u16 = 110;
const H: u16 = 32;

/// Renders `app` at `size`, asserts that the screen shows every one of `texts` and matches the
/// snapshot `name`.
fn assert_screen(app: &App, (w, h): (u16, u16), name: &str, texts: &[&str]) {
    let s = screen(app, w, h);
    assert_shows(&s, texts);
    assert_snapshot(name, &s);
}

#[test]
fn warmup_screen_shows_progress_rate_and_eta() {
    let mut app = file_app();
    loaded_warming(&mut app);
    // 30 GiB of 81 GiB in 10 s: 37%, 3.00 GiB/s, ETA 51 GiB / 3 GiB/s = 17.0 s.
    assert_screen(
        &app,
        (W, H),
        "warmup",
        &[
            "Warm-up  37% ETA 17.0 s",
            "30.0/81.0 GiB 3.00 GiB/s",
            "Resident 30.0/81.0 GiB",
            "experts    26.0/75.0 GiB",
            "Radeon 8060S (gfx1151)",
        ],
    );
}

#[test]
fn idle_screen_after_one_turn() {
    let mut app = ready_app();
    send(&mut app, "What is 2+2?");
    full_turn(
        &mut app,
        &["The user asks ", "a sum."],
        &["# Answer\n", "It is **4**.\n", "- one\n- two"],
        Duration::from_millis(25),
    );
    assert_eq!(app.phase, Phase::Idle);
    // 5 tokens of 25 ms each: 40.0 t/s; prefill 20 tokens in 400 ms.
    assert_screen(
        &app,
        (W, H),
        "idle",
        &[
            "40.0 t/s",
            "20 tok in 400 ms",
            "▸ Reasoning · 5 words",
            "• one",
            "Context  25 / 32k",
            "● ready",
        ],
    );
}

#[test]
fn prefill_in_progress_shows_bar_and_eta() {
    let mut app = ready_app();
    send(&mut app, "Summarise this long document please.");
    turn_started(&mut app, 4096, ds4_chat::model::chat::ThinkMode::High);
    app.on_engine_event(Event::PrefillProgress {
        done: 1024,
        total: 4096,
        elapsed: Duration::from_secs(2),
    });
    // 1024 of 4096 in 2 s: 25%, ETA 3072 / 512 t/s = 6.0 s.
    assert_screen(
        &app,
        (W, H),
        "prefill",
        &["Prefill  25% ETA 6.0 s", "1.0k / 4.1k tok", "◐ prefill 25%"],
    );
}

fn streaming_app() -> App {
    let mut app = ready_app();
    send(&mut app, "Write hello world in Rust.");
    turn_started(&mut app, 30, ds4_chat::model::chat::ThinkMode::High);
    app.on_engine_event(Event::PrefillDone {
        tokens: 30,
        elapsed: Duration::from_millis(600),
    });
    stream(
        &mut app,
        TextKind::Reasoning,
        &["The user wants ", "a Rust program.\n", "Use println!."],
        Duration::from_millis(50),
    );
    app
}

#[test]
fn streaming_reasoning_is_open_while_thinking() {
    let app = streaming_app();
    let s = screen(&app, W, H);
    assert_shows(&s, &["▾ Thinking…", "│ The user wants a Rust program."]);
    // Three steps of 50 ms: 20.0 t/s live.
    assert_shows(&s, &["Decode   20.0 t/s live", "◉ generating 20.0 t/s"]);
    assert_snapshot("streaming_reasoning", &s);
}

#[test]
fn reasoning_collapses_when_the_answer_streams_and_tab_reopens_it() {
    let mut app = streaming_app();
    stream(
        &mut app,
        TextKind::Answer,
        &[
            "Here you go:\n",
            "```rust\n",
            "fn main() {\n",
            "    println!(\"hi\");\n",
            "}\n",
            "```\n",
            "Run it with `cargo run`.",
        ],
        Duration::from_millis(50),
    );
    let s = screen(&app, W, H);
    assert_shows(&s, &["▸ Reasoning · 8 words · Tab shows"]);
    assert!(!s.contains("│ The user wants"), "{s}");
    assert_shows(&s, &["╭ rust ─", "│     println!(\"hi\");", "╰────"]);
    assert_snapshot("streaming_collapsed", &s);
    app.on_key(key(KeyCode::Tab));
    let s = screen(&app, W, H);
    assert_shows(&s, &["│ The user wants a Rust program."]);
}

#[test]
fn help_overlay() {
    let mut app = ready_app();
    app.on_key(key(KeyCode::F(1)));
    assert!(app.show_help);
    assert_screen(&app, (W, H), "help", &["Help · any key closes", "/retry", "Ctrl+Y"]);
    app.on_key(key(KeyCode::Char('x')));
    assert!(!app.show_help);
    assert!(app.input.is_empty(), "the closing key must not be typed");
}

#[test]
fn small_terminal_notice() {
    let mut app = file_app();
    loaded_warming(&mut app);
    assert_screen(&app, (59, 14), "small", &["terminal too small", "59×14, need 60×15"]);
    // 60×15 is enough, and the panel becomes a one-line strip below 100 columns.
    let s = screen(&app, 60, 15);
    assert!(!s.contains("terminal too small"), "{s}");
    assert_shows(&s, &["ctx 0/32k"]);
}

#[test]
fn fatal_error_is_shown_and_only_quit_works() {
    let mut app = file_app();
    app.on_engine_event(Event::LoadStarted {
        what: "DeepSeek-V4-Flash-q2.gguf".into(),
    });
    app.on_engine_event(Event::Error {
        message: "/models/DeepSeek-V4-Flash-q2.gguf: not a GGUF file (magic 0x00000000 at offset 0)".into(),
        fatal: true,
    });
    let s = screen(&app, W, H);
    assert!(
        s.contains("✖ error: /models/DeepSeek-V4-Flash-q2.gguf: not a GGUF file"),
        "{s}"
    );
    assert_shows(&s, &["Press Esc, q or Ctrl+C to quit."]);
    assert_snapshot("error", &s);
    assert!(send(&mut app, "hello").is_empty());
    assert!(app.should_quit, "Enter quits in the failed state");
}

#[test]
fn demo_banner_and_narrow_strip() {
    let load = ds4_chat::engine::events::LoadRequest {
        source: ModelSource::Demo { seed: 1 },
        ctx: 4096,
        backend: Default::default(),
        weights: Default::default(),
        arithmetic: Default::default(),
        threads: 0,
    };
    let mut app = App::new(config(), "demo model (seed 1)".into(), Some(load));
    let mut info = model_info();
    info.is_demo = true;
    info.backend = "cpu".into();
    info.ctx = 4096;
    app.on_engine_event(Event::Loaded(info));
    assert_screen(
        &app,
        (80, 24),
        "demo_narrow",
        &[
            "DEMO: a tiny random model",
            "Its answers are random text",
            "– t/s │ ctx 0/4.1k │ cpu │ think high",
        ],
    );
}

#[test]
fn panel_names_the_gpu_arithmetic() {
    let mut app = file_app();
    let mut info = model_info();
    info.arithmetic = Some(ds4_chat::backend::arithmetic::Arithmetic::Fast);
    app.on_engine_event(Event::Loaded(info));
    let s = screen(&app, W, H);
    assert!(s.contains("hip · fast"), "{s}");
}

#[test]
fn panel_shows_the_last_turns_speculation() {
    use ds4_chat::engine::generate::SpeculationFigures;
    let mut app = ready_app();
    let idle = screen(&app, W, H);
    assert!(!idle.contains("tok/cycle"), "{idle}");
    // 10 cycles committed 25 tokens (10 pending + 15 kept drafts): 2.50 tokens per cycle.
    app.on_engine_event(Event::Speculation(SpeculationFigures {
        cycles: 10,
        drafted: 30,
        accepted: 15,
        committed: 25,
    }));
    let s = screen(&app, W, H);
    assert_shows(&s, &["Drafts   2.50 tok/cycle", "15 of 30 kept"]);
}

#[test]
fn resize_mid_stream_keeps_rendering() {
    let mut app = streaming_app();
    for (w, h) in [(200, 60), (60, 15), (59, 30), (100, 15), (120, 40)] {
        let s = screen(&app, w, h);
        assert_eq!(s.lines().count(), h as usize);
        stream(&mut app, TextKind::Answer, &["more text "], Duration::from_millis(10));
    }
}

#[test]
fn live_stats_and_small_models_use_fitting_units() {
    let mut app = file_app();
    app.on_engine_event(Event::Loaded(model_info()));
    send(&mut app, "hi");
    full_turn(&mut app, &[], &["ok"], Duration::from_millis(20));
    app.on_engine_event(Event::Stats(ds4_chat::engine::events::LiveStats {
        prefill_tps: Some(50.0),
        prefill_latency: Some(Duration::from_millis(450)),
        context_used: 23,
        context_size: 32768,
        kv_bytes: 5 << 20,
        ..Default::default()
    }));
    app.on_engine_event(Event::Residency(ds4_chat::engine::events::Residency {
        total_bytes: 120 << 20,
        resident_bytes: 30 << 20,
        embed_head: (30 << 20, 60 << 20),
        ..Default::default()
    }));
    let s = screen(&app, W, H);
    assert_shows(
        &s,
        &[
            "Latency  450 ms 1st token",
            "50.0 t/s",
            "KV cache 5.0 MiB",
            "Resident 30.0/120.0 MiB",
            "embed+head 30.0/60.0 MiB",
            "Context  23 / 32k",
        ],
    );
}

#[test]
fn cached_finished_turns_follow_tab_retry_and_resize() {
    let mut app = file_app();
    app.on_engine_event(Event::Loaded(model_info()));
    send(&mut app, "first question");
    full_turn(&mut app, &["secret plan"], &["first answer"], Duration::from_millis(10));
    let mut t = ratatui::Terminal::new(ratatui::backend::TestBackend::new(W, H)).unwrap();
    let s = draw_text(&mut t, &app);
    assert!(s.contains("first answer") && !s.contains("secret plan"), "{s}");
    app.on_key(key(KeyCode::Tab));
    let s = draw_text(&mut t, &app);
    assert!(s.contains("│ secret plan"), "Tab must re-render a cached turn:\n{s}");
    send(&mut app, "/retry");
    full_turn(&mut app, &["other plan"], &["second answer"], Duration::from_millis(10));
    let s = draw_text(&mut t, &app);
    assert!(s.contains("second answer") && !s.contains("first answer"), "{s}");
    app.on_resize(70, 20);
    let mut narrow = ratatui::Terminal::new(ratatui::backend::TestBackend::new(70, 20)).unwrap();
    let s = draw_text(&mut narrow, &app);
    assert!(
        s.contains("second answer") && s.lines().all(|l| l.chars().count() <= 70),
        "{s}"
    );
}

#[test]
fn finished_turns_are_laid_out_in_update_and_drawing_only_reads_them() {
    let mut app = file_app();
    app.on_engine_event(Event::Loaded(model_info()));
    send(&mut app, "first question");
    assert!(app.chat_cache.is_empty(), "a turn in flight is laid out on every frame");
    full_turn(&mut app, &["plan"], &["first answer"], Duration::from_millis(10));
    assert_eq!(app.chat_cache.len(), 1, "the finished turn is laid out by the update");
    // Stale layouts (other widths) are dropped: the cache stays bounded however often it resizes.
    for w in 60..=120 {
        app.on_resize(w, 30);
    }
    assert!(app.chat_cache.len() <= 2 + 16 + 1, "{}", app.chat_cache.len());
    let mut t = ratatui::Terminal::new(ratatui::backend::TestBackend::new(120, 30)).unwrap();
    let from_cache = draw_text(&mut t, &app);
    let mut uncached = app.clone();
    uncached.chat_cache = Default::default();
    let mut t = ratatui::Terminal::new(ratatui::backend::TestBackend::new(120, 30)).unwrap();
    assert_eq!(draw_text(&mut t, &uncached), from_cache);
    assert!(from_cache.contains("first answer"), "{from_cache}");
}

#[test]
fn remote_panel_shows_the_server_and_says_remote_for_local_gauges() {
    use ds4_chat::engine::events::{LiveStats, ModelInfo, ServerReport};
    let mut app = App::new(config(), "remote http://gpu:8000/v1".into(), None);
    app.on_resize(W, H);
    app.on_engine_event(Event::Loaded(ModelInfo {
        name: "deepseek-ai/DeepSeek-V4-Flash".into(),
        ctx: 65536,
        backend: "remote".into(),
        device: "http://gpu:8000/v1".into(),
        endpoint: Some("http://gpu:8000/v1".into()),
        ..Default::default()
    }));
    send(&mut app, "Why?");
    full_turn(&mut app, &["hmm "], &["Because."], Duration::from_millis(25));
    app.on_engine_event(Event::Stats(LiveStats {
        prefill_latency: Some(Duration::from_millis(350)),
        context_used: 1534,
        context_size: 65536,
        ..Default::default()
    }));
    app.on_engine_event(Event::Server(ServerReport {
        prompt_tokens: Some(1234),
        cached_tokens: Some(1000),
        completion_tokens: Some(300),
        prefill_ms: Some(120.0),
        prefill_tps: Some(1950.0),
        decode_tps: Some(45.25),
    }));
    let s = screen(&app, W, H);
    for want in [
        "TTFT     350 ms",
        "Server   prefill 120 ms · 1950 t/s",
        "decode 45.2 t/s",
        "Prompt   1.2k tok (1.0k cached)",
        "Answer   300 tok",
        "Context  1.5k / 65k",
        " http://gpu:8000/v1",
        " deepseek-ai/DeepSeek-V4-Flash",
        "Warm-up  remote",
        "Resident remote",
        "KV cache remote",
        "Device   remote",
    ] {
        assert!(s.contains(want), "missing {want:?}\n{s}");
    }
    // /ctx cannot change a server's context.
    send(&mut app, "/ctx 8192");
    assert_eq!(
        app.status.as_deref(),
        Some("/ctx: the server sets the context of a remote model")
    );
    // The narrow strip: time to first token instead of the prefill.
    let s = screen(&app, 80, 24);
    assert!(
        s.contains("ttft 350 ms") && s.contains("ctx 1.5k/65k") && s.contains("remote"),
        "{s}"
    );
}
