//! Kept sessions in the app (docs/sessions.md), pure (no terminal, no worker): a finished turn asks
//! the worker for a KV snapshot and then writes the session file; `/sessions`, Enter, `/load`,
//! `/new`, `/rename`, `/delete`; `/save` exports the turn in progress with lowercase roles.

use crate::tui_common;

use std::path::PathBuf;
use std::time::Duration;

use crossterm::event::KeyCode;
use ds4_chat::engine::events::{Command, Event, TextKind};
use ds4_chat::sessions::store::{Store, TranscriptIds};
use ds4_chat::tui::app::sessions::SessionsState;
use ds4_chat::tui::app::{App, Item, Phase};
use tui_common::*;

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ds4-chat-tui-sessions-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn app_keeping_sessions(dir: &std::path::Path) -> App {
    let mut app = file_app();
    app.sessions = SessionsState::new(Some(Store::at(dir.to_path_buf())), 1 << 30);
    loaded_warming(&mut app);
    warm_done(&mut app);
    app
}

/// A turn that finishes: the snapshot command, then the worker's answer, which writes the file.
fn finished_turn(app: &mut App, user: &str, answer: &str) -> PathBuf {
    send(app, user);
    let cmds = full_turn(app, &[], &[answer], Duration::from_millis(5));
    let path = match cmds.as_slice() {
        [Command::SaveSnapshot { path }] => path.clone(),
        other => panic!("expected one SaveSnapshot, got {other:?}"),
    };
    // What the worker does: the snapshot goes first (creating the directory).
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, b"snapshot bytes").unwrap();
    let effects = app.on_engine_event(Event::SnapshotSaved {
        path: path.clone(),
        result: Ok(14),
        tokens: 31,
        transcript: Some(TranscriptIds {
            messages: 3,
            ids: vec![0, 1, 2, 3],
        }),
    });
    assert!(settle(app, effects).is_empty());
    path
}

#[test]
fn a_finished_turn_is_kept_and_a_kept_session_opens_again() {
    let dir = scratch("keep");
    let mut app = app_keeping_sessions(&dir);
    let kv = finished_turn(&mut app, "What is 2+2?\nthink hard", "4");
    let id = app.sessions.id.clone();
    assert_eq!(kv, dir.join(format!("{id}.kv")));
    let store = Store::at(dir.clone());
    let rec = store.load(&id).unwrap();
    assert_eq!(rec.title, "What is 2+2?");
    assert_eq!(rec.messages.len(), 2);
    assert_eq!(rec.tokens, 31);
    assert_eq!(rec.model.identity, model_info().identity);
    let text = std::fs::read_to_string(store.session_path(&id)).unwrap();
    assert!(text.contains("\"role\": \"user\"") && text.contains("\"role\": \"assistant\""));

    // /new: an empty chat with another id; the kept one stays.
    let cmds = send(&mut app, "/new");
    assert!(cmds.iter().any(|c| matches!(c, Command::Reset)));
    assert!(app.items.is_empty() && app.sessions.id != id);

    // /sessions lists it; Enter opens it: the turns are back and the worker resumes it.
    send(&mut app, "/sessions");
    assert_eq!(app.sessions.list.as_ref().map(Vec::len), Some(1));
    assert!(screen(&app, 110, 32).contains("1. What is 2+2?"));
    let cmds = press(&mut app, key(KeyCode::Enter));
    assert!(app.sessions.list.is_none());
    let resume = cmds
        .iter()
        .find_map(|c| match c {
            Command::Resume(r) => Some(r),
            _ => None,
        })
        .expect("a Resume command");
    assert_eq!(resume.snapshot.as_ref(), Some(&kv));
    assert_eq!(resume.transcript.as_ref().map(|t| t.ids.len()), Some(4));
    assert_eq!(resume.messages.len(), 3, "system prompt and the two turns");
    assert_eq!(app.sessions.id, id);
    assert!(matches!(&app.items[0], Item::Turn(t) if t.user.starts_with("What is 2+2?") && t.answer == "4"));
    assert_eq!(app.phase, Phase::Loading);
    app.on_engine_event(Event::Resumed {
        tokens: 31,
        from_snapshot: true,
        elapsed: Duration::from_millis(120),
        note: None,
    });
    assert_eq!(app.phase, Phase::Idle);
    assert_eq!(
        app.status.as_deref(),
        Some("resumed: 31 tokens from its KV snapshot in 0.12 s")
    );

    // /rename keeps the new title; /load names it by number; /delete removes it.
    send(&mut app, "/rename Arithmetic");
    assert_eq!(store.load(&id).unwrap().title, "Arithmetic");
    send(&mut app, "/load 7");
    assert!(matches!(app.items.last(), Some(Item::Note { text, error: true }) if text.contains("no session 7")));
    send(&mut app, "/delete 1");
    assert_eq!(app.status.as_deref(), Some(format!("deleted session {id}").as_str()));
    assert!(!store.session_path(&id).exists() && !kv.exists());
    assert_ne!(app.sessions.id, id, "the deleted session is no longer the open one");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn resume_flag_opens_the_latest_session_of_this_model_once_it_is_loaded() {
    let dir = scratch("resume");
    let mut first = app_keeping_sessions(&dir);
    finished_turn(&mut first, "first question", "first answer");
    let mut app = file_app();
    app.sessions = SessionsState::new(Some(Store::at(dir.clone())), 1 << 30);
    app.sessions.pending_open = Some(ds4_chat::tui::app::sessions::OpenWhich::Latest);
    let effects = app.on_engine_event(Event::Loaded(model_info()));
    let cmds = settle(&mut app, effects);
    assert!(cmds.iter().any(|c| matches!(c, Command::Resume(_))), "{cmds:?}");
    assert!(matches!(&app.items[0], Item::Turn(t) if t.user == "first question"));
    // A snapshot the worker could not use: the notice is shown, the conversation is open.
    app.on_engine_event(Event::Resumed {
        tokens: 20,
        from_snapshot: false,
        elapsed: Duration::from_secs(2),
        note: Some("snapshot x not used: checksum mismatch; reading the conversation again".into()),
    });
    assert!(matches!(&app.items[1], Item::Note { text, error: false } if text.contains("checksum")));
    assert_eq!(app.phase, Phase::Idle);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn save_exports_the_turn_in_progress_with_lowercase_roles() {
    let dir = scratch("export");
    std::fs::create_dir_all(&dir).unwrap();
    let mut app = app_keeping_sessions(&dir.join("sessions"));
    send(&mut app, "Tell me a story");
    turn_started(&mut app, 10, ds4_chat::model::chat::ThinkMode::High);
    stream(&mut app, TextKind::Answer, &["Once ", "upon"], Duration::from_millis(5));
    let json = dir.join("c.json");
    send(&mut app, &format!("/save {}", json.display()));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let roles = message_roles(&v);
    assert_eq!(roles, ["system", "user", "assistant"]);
    assert_eq!(v["messages"][2]["content"], "Once upon");
    let md = dir.join("c.md");
    send(&mut app, &format!("/save {}", md.display()));
    assert!(
        std::fs::read_to_string(&md)
            .unwrap()
            .contains("## Assistant\n\nOnce upon\n")
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
