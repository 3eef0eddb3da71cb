//! Behaviour of the app state: keys → worker commands, slash commands, scrolling, history, paste,
//! clipboard and saving. Pure (no terminal): `App::on_key` / `App::on_engine_event` and the effects
//! they return, performed as the run loop does (`tui_common::settle`).

use crate::tui_common;

use std::time::Duration;

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers, MouseEvent, MouseEventKind};
use ds4_chat::engine::events::{Command, Event, FinishReason, TextKind};
use ds4_chat::model::chat::{Conversation, Role, ThinkMode};
use ds4_chat::tui::app::{Item, Phase};
use ds4_chat::tui::effect::Effect;
use tui_common::*;

fn submitted(cmds: &[Command]) -> &ds4_chat::engine::events::TurnRequest {
    cmds.iter()
        .find_map(|c| match c {
            Command::Submit(t) => Some(t),
            _ => None,
        })
        .expect("a Submit command")
}

#[test]
fn enter_submits_the_conversation_with_system_prompt_and_settings() {
    let mut app = ready_app();
    let cmds = send(&mut app, "hello");
    let t = submitted(&cmds);
    let roles: Vec<Role> = t.conversation.messages.iter().map(|m| m.role).collect();
    assert_eq!(roles, vec![Role::System, Role::User]);
    assert_eq!(t.conversation.messages[0].content, "You are a helpful assistant");
    assert_eq!(t.conversation.messages[1].content, "hello");
    assert_eq!(t.think, ThinkMode::High);
    assert_eq!(t.sampling.seed, Some(7));
    assert_eq!(app.phase, Phase::Busy);
    assert!(app.input.is_empty());
    // A second Enter while generating sends nothing.
    assert!(send(&mut app, "again").is_empty());
    // The finished turn is part of the next request (user + assistant with its reasoning).
    app.input.take();
    full_turn(&mut app, &["think"], &["four"], Duration::from_millis(10));
    let cmds = send(&mut app, "next");
    let m = &submitted(&cmds).conversation.messages;
    assert_eq!(m.len(), 4);
    assert_eq!(m[2].role, Role::Assistant);
    assert_eq!(m[2].content, "four");
    assert_eq!(m[2].reasoning.as_deref(), Some("think"));
}

#[test]
fn newline_keys_and_paste_keep_newlines() {
    let mut app = ready_app();
    type_text(&mut app, "a");
    app.on_key(alt(KeyCode::Enter));
    type_text(&mut app, "b");
    app.on_key(ctrl('j'));
    app.on_paste("c\r\nd");
    assert_eq!(app.input.text, "a\nb\nc\nd");
    let cmds = press(&mut app, key(KeyCode::Enter));
    assert_eq!(
        submitted(&cmds).conversation.messages.last().unwrap().content,
        "a\nb\nc\nd"
    );
}

#[test]
fn esc_cancels_generation_then_twice_quits() {
    let mut app = ready_app();
    send(&mut app, "hi");
    let cmds = press(&mut app, key(KeyCode::Esc));
    assert!(matches!(cmds.as_slice(), [Command::Cancel]));
    assert_eq!(app.phase, Phase::Cancelling);
    app.on_engine_event(Event::TurnFinished {
        reason: FinishReason::Cancelled,
        generated: 0,
        context_used: 12,
    });
    assert_eq!(app.phase, Phase::Idle);
    assert!(press(&mut app, key(KeyCode::Esc)).is_empty());
    assert!(!app.should_quit, "one Esc while idle only arms");
    app.on_key(key(KeyCode::Esc));
    assert!(app.should_quit);
}

#[test]
fn ctrl_c_cancels_while_generating_and_quits_when_idle() {
    let mut app = ready_app();
    send(&mut app, "hi");
    assert!(matches!(press(&mut app, ctrl('c')).as_slice(), [Command::Cancel]));
    assert!(!app.should_quit);
    app.on_engine_event(Event::TurnFinished {
        reason: FinishReason::Cancelled,
        generated: 0,
        context_used: 0,
    });
    app.on_key(ctrl('c'));
    assert!(app.should_quit);
}

#[test]
fn history_recall_with_up_and_down() {
    let mut app = ready_app();
    for m in ["first", "second"] {
        send(&mut app, m);
        app.on_engine_event(Event::TurnFinished {
            reason: FinishReason::Eos,
            generated: 0,
            context_used: 0,
        });
    }
    app.on_key(key(KeyCode::Up));
    assert_eq!(app.input.text, "second");
    app.on_key(key(KeyCode::Up));
    assert_eq!(app.input.text, "first");
    app.on_key(key(KeyCode::Down));
    assert_eq!(app.input.text, "second");
    app.on_key(key(KeyCode::Down));
    assert_eq!(app.input.text, "");
}

#[test]
fn sampling_commands_validate_and_send_set_sampling() {
    let mut app = ready_app();
    let cmds = send(&mut app, "/temp 0.7");
    match cmds.as_slice() {
        [Command::SetSampling(s)] => assert_eq!(s.temperature, 0.7),
        other => panic!("{other:?}"),
    }
    assert!(send(&mut app, "/top-p 2").is_empty());
    assert!(app.status.as_deref().unwrap().contains("/top-p"), "{:?}", app.status);
    assert_eq!(app.config.sampling.top_p, 1.0);
    assert!(send(&mut app, "/temp abc").is_empty());
    assert!(app.status.as_deref().unwrap().contains("not a number"));
    let cmds = send(&mut app, "/seed 99");
    assert!(matches!(cmds.as_slice(), [Command::SetSampling(s)] if s.seed == Some(99)));
    send(&mut app, "/min-p 0.1");
    assert_eq!(app.config.sampling.min_p, 0.1);
    send(&mut app, "/nothink");
    assert_eq!(app.config.think, ThinkMode::Off);
    send(&mut app, "/think-max");
    assert_eq!(app.config.think, ThinkMode::Max);
    assert!(app.status.as_deref().unwrap().contains("393216"));
    send(&mut app, "/system Be brief.");
    let cmds = send(&mut app, "x");
    assert_eq!(submitted(&cmds).conversation.messages[0].content, "Be brief.");
    assert_eq!(submitted(&cmds).think, ThinkMode::Max);
    assert!(send(&mut app, "/bogus").is_empty());
    assert!(app.status.as_deref().unwrap().contains("unknown command /bogus"));
}

#[test]
fn retry_and_edit_rewind_to_the_previous_turn() {
    let mut app = ready_app();
    send(&mut app, "one");
    full_turn(&mut app, &[], &["A"], Duration::from_millis(10)); // context_after = 21
    send(&mut app, "two");
    full_turn(&mut app, &[], &["B"], Duration::from_millis(10));
    let cmds = send(&mut app, "/retry");
    assert!(matches!(cmds[0], Command::Rewind { keep_tokens: 21 }), "{cmds:?}");
    let t = submitted(&cmds);
    let contents: Vec<&str> = t.conversation.messages.iter().map(|m| m.content.as_str()).collect();
    assert_eq!(contents, vec!["You are a helpful assistant", "one", "A", "two"]);
    full_turn(&mut app, &[], &["B2"], Duration::from_millis(10));
    let cmds = send(&mut app, "/edit");
    assert!(
        matches!(cmds.as_slice(), [Command::Rewind { keep_tokens: 21 }]),
        "{cmds:?}"
    );
    assert_eq!(app.input.text, "two");
    let turns = app.items.iter().filter(|i| matches!(i, Item::Turn(_))).count();
    assert_eq!(turns, 1);
}

#[test]
fn clear_resets_and_ctx_reloads() {
    let mut app = ready_app();
    send(&mut app, "one");
    full_turn(&mut app, &[], &["A"], Duration::from_millis(10));
    assert!(matches!(press(&mut app, ctrl('l')).as_slice(), [Command::Reset]));
    assert!(app.items.is_empty());
    let cmds = send(&mut app, "/ctx 4096");
    assert!(
        matches!(cmds.as_slice(), [Command::Reset, Command::Load(l)] if l.ctx == 4096),
        "{cmds:?}"
    );
    assert_eq!(app.phase, Phase::Loading);
    assert!(send(&mut app, "/ctx 10").is_empty());
    assert!(app.status.as_deref().unwrap().contains("out of range"));
    assert!(matches!(send(&mut app, "/clear").as_slice(), [Command::Reset]));
}

#[test]
fn ctx_stays_within_the_loaded_models_length() {
    let mut app = ready_app();
    app.metrics.model.as_mut().unwrap().context_length = 8192;
    assert!(send(&mut app, "/ctx 16384").is_empty());
    assert_eq!(
        app.status.as_deref(),
        Some("/ctx: 16384 is out of range (256 ..= 8192, the model's context length)")
    );
    let cmds = send(&mut app, "/ctx 8192");
    assert!(
        matches!(cmds.as_slice(), [Command::Reset, Command::Load(l)] if l.ctx == 8192),
        "{cmds:?}"
    );
}

#[test]
fn tab_toggles_reasoning_and_completes_slash_commands() {
    let mut app = ready_app();
    send(&mut app, "q");
    full_turn(&mut app, &["hmm"], &["ok"], Duration::from_millis(10));
    let Item::Turn(t) = &app.items[0] else { panic!() };
    assert!(!t.reasoning_visible(), "collapsed once the answer started");
    app.on_key(key(KeyCode::Tab));
    let Item::Turn(t) = &app.items[0] else { panic!() };
    assert!(t.reasoning_visible());
    type_text(&mut app, "/ret");
    assert_eq!(app.slash_matches().len(), 1);
    app.on_key(key(KeyCode::Tab));
    assert_eq!(app.input.text, "/retry");
    app.input.set("/s");
    let names: Vec<&str> = app.slash_matches().iter().map(|m| m.name).collect();
    assert_eq!(names, vec!["/system", "/seed", "/save", "/sessions"]);
}

#[test]
fn scrolling_stops_following_and_end_follows_again() {
    let mut app = ready_app();
    app.on_resize(110, 20);
    send(&mut app, "long");
    turn_started(&mut app, 5, ThinkMode::Off);
    let lines: Vec<String> = (0..60).map(|i| format!("line {i}\n")).collect();
    let pieces: Vec<&str> = lines.iter().map(String::as_str).collect();
    stream(&mut app, TextKind::Answer, &pieces, Duration::from_millis(5));
    app.on_key(key(KeyCode::PageUp));
    let top = app.scroll_top.expect("scrolled up");
    let before = screen(&app, 110, 20);
    stream(
        &mut app,
        TextKind::Answer,
        &["line 60\n", "line 61\n"],
        Duration::from_millis(5),
    );
    assert_eq!(app.scroll_top, Some(top));
    let after = screen(&app, 110, 20);
    let first_chat_row = |s: &str| s.lines().nth(1).unwrap()[..60].to_string();
    assert_eq!(
        first_chat_row(&before),
        first_chat_row(&after),
        "the view must not move while scrolled up"
    );
    app.on_mouse(MouseEvent {
        kind: MouseEventKind::ScrollUp,
        column: 0,
        row: 0,
        modifiers: KeyModifiers::NONE,
    });
    assert_eq!(app.scroll_top, Some(top - 3));
    app.on_key(key(KeyCode::End));
    assert_eq!(app.scroll_top, None);
    assert!(screen(&app, 110, 20).contains("line 61"));
}

#[test]
fn ctrl_y_copies_the_last_answer() {
    let mut app = ready_app();
    assert!(app.on_key(ctrl('y')).is_empty());
    assert_eq!(app.status.as_deref(), Some("no answer to copy yet"));
    send(&mut app, "q");
    full_turn(&mut app, &["r"], &["the ", "answer"], Duration::from_millis(10));
    match app.on_key(ctrl('y')).as_slice() {
        [Effect::CopyToClipboard(text)] => assert_eq!(text, "the answer"),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        ds4_chat::tui::terminal::osc52("the answer"),
        "\x1b]52;c;dGhlIGFuc3dlcg==\x07" // base64("the answer")
    );
}

#[test]
fn save_writes_json_and_markdown() {
    let mut app = ready_app();
    send(&mut app, "What is 2+2?");
    full_turn(&mut app, &["add"], &["4"], Duration::from_millis(10));
    let dir = std::env::temp_dir().join(format!("ds4-chat-save-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("c.json");
    send(&mut app, &format!("/save {}", json.display()));
    let back: Conversation = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(back, app.conversation(None));
    assert_eq!(back.messages.len(), 3);
    let md = dir.join("c.md");
    send(&mut app, &format!("/save {}", md.display()));
    let text = std::fs::read_to_string(&md).unwrap();
    assert!(text.contains("## User\n\nWhat is 2+2?\n"), "{text}");
    assert!(text.contains("## Assistant\n\n> add\n\n4\n"), "{text}");
    assert_eq!(app.status.as_deref(), Some(format!("saved {}", md.display()).as_str()));
    send(&mut app, "/save /nonexistent-dir/x.json");
    assert!(app.status.as_deref().unwrap().contains("/nonexistent-dir/x.json"));
    std::fs::remove_dir_all(&dir).unwrap();
}

fn dir_entries(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn save_is_done_by_the_run_loop_and_a_failed_save_leaves_nothing_behind() {
    let mut app = ready_app();
    send(&mut app, "q");
    full_turn(&mut app, &[], &["a"], Duration::from_millis(10));
    let dir = std::env::temp_dir().join(format!("ds4-chat-save-atomic-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // The update only asks for the write; nothing is on disk until the effect is performed.
    let target = dir.join("t.json");
    type_text(&mut app, &format!("/save {}", target.display()));
    let effects = app.on_key(key(KeyCode::Enter));
    assert!(
        matches!(effects.as_slice(), [Effect::SaveTranscript { path, .. }] if *path == target),
        "{effects:?}"
    );
    assert!(!target.exists());
    settle(&mut app, effects);
    assert_eq!(dir_entries(&dir), vec!["t.json"]);
    // A file in a missing directory: one line naming the path, and nothing created.
    let missing = dir.join("missing").join("x.md");
    send(&mut app, &format!("/save {}", missing.display()));
    let status = app.status.clone().unwrap();
    assert!(
        status.starts_with(&format!("cannot save {}: ", missing.display())),
        "{status}"
    );
    assert!(!status.contains('\n'), "{status}");
    assert_eq!(dir_entries(&dir), vec!["t.json"]);
    // A target that cannot be replaced (a directory): the bytes were written to a temporary file
    // first, and it is gone after the failed rename.
    let taken = dir.join("taken.md");
    std::fs::create_dir(&taken).unwrap();
    send(&mut app, &format!("/save {}", taken.display()));
    assert!(
        app.status.as_deref().unwrap().starts_with("cannot save "),
        "{:?}",
        app.status
    );
    assert_eq!(dir_entries(&dir), vec!["t.json", "taken.md"]);
    assert!(dir_entries(&taken).is_empty());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn every_slash_command_is_in_help_and_completes() {
    use ds4_chat::tui::app::commands::{SLASH_COMMANDS, find};
    let mut app = ready_app();
    app.on_key(key(KeyCode::F(1)));
    let help = screen(&app, 110, 32);
    app.on_key(key(KeyCode::Esc));
    for c in SLASH_COMMANDS {
        let line = help
            .lines()
            .find(|l| l.contains(&format!(" {} {} ", c.name, c.arg)))
            .unwrap_or_else(|| panic!("{} missing from help:\n{help}", c.name));
        assert!(line.contains(c.help), "{line}");
        app.input.set(c.name);
        assert!(app.slash_matches().iter().any(|m| m.name == c.name), "{}", c.name);
        app.on_key(key(KeyCode::Tab));
        assert_eq!(app.input.text.trim_end(), c.name, "Tab on {}", c.name);
        for alias in c.aliases {
            assert_eq!(find(alias).map(|f| f.name), Some(c.name));
        }
    }
    app.input.take();
    send(&mut app, "/exit");
    assert!(app.should_quit, "an alias runs its command");
}

#[test]
fn every_key_in_the_table_reaches_its_action_and_help_lists_it() {
    use ds4_chat::tui::app::keys::{KEY_BINDINGS, Mods, When};
    let mut app = ready_app();
    app.on_key(key(KeyCode::F(1)));
    let help = screen(&app, 110, 32);
    for b in KEY_BINDINGS {
        if b.in_help {
            assert!(
                help.contains(&format!("{:<11}{}", b.label, b.help)),
                "{} missing:\n{help}",
                b.label
            );
        }
        for c in b.chords {
            let mut app = ready_app();
            app.history.push("earlier".into());
            match c.when {
                When::Always => app.input.set("x"),
                When::InputEmpty | When::ScrolledOrInputEmpty | When::RecallingOrInputEmpty => {}
                When::Recalling => app.history_pos = Some(0),
            }
            let mods = match c.mods {
                Mods::Ctrl => KeyModifiers::CONTROL,
                Mods::Modified => KeyModifiers::ALT,
                Mods::Any | Mods::NoCtrl | Mods::NoCtrlAlt | Mods::Bare => KeyModifiers::NONE,
            };
            let k = KeyEvent::new(c.code, mods);
            assert_eq!(app.key_action(&k), Some(c.action), "{} {:?}", b.label, c);
        }
    }
}

#[test]
fn nonfatal_error_stays_with_its_turn() {
    let mut app = ready_app();
    send(&mut app, "q");
    app.on_engine_event(Event::Error {
        message: "prompt is 40000 tokens, the context holds 32768".into(),
        fatal: false,
    });
    assert_eq!(app.phase, Phase::Busy, "the worker still ends the turn");
    app.on_engine_event(Event::TurnFinished {
        reason: FinishReason::ContextFull,
        generated: 0,
        context_used: 0,
    });
    assert_eq!(app.phase, Phase::Idle);
    assert!(screen(&app, 110, 32).contains("✖ prompt is 40000 tokens"));
}

#[test]
fn key_release_events_are_ignored() {
    let mut app = ready_app();
    let mut k = KeyEvent::new(KeyCode::Char('a'), KeyModifiers::NONE);
    k.kind = crossterm::event::KeyEventKind::Release;
    app.on_key(k);
    assert!(app.input.is_empty());
}

#[test]
fn a_message_sent_while_loading_is_queued_behind_the_load() {
    let mut app = file_app();
    assert_eq!(app.phase, Phase::Loading);
    let cmds = send(&mut app, "early");
    assert_eq!(submitted(&cmds).conversation.messages.last().unwrap().content, "early");
    assert_eq!(app.phase, Phase::Busy);
    // The load events that follow do not end the queued turn.
    loaded_warming(&mut app);
    assert_eq!(app.phase, Phase::Busy);
    full_turn(&mut app, &[], &["answer"], Duration::from_millis(10));
    assert_eq!(app.phase, Phase::Idle);
}
