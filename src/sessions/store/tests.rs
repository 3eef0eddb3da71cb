use super::*;
use crate::model::chat::Message;

fn scratch(tag: &str) -> Store {
    let d = std::env::temp_dir().join(format!("ds4-chat-store-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    Store::at(d)
}

fn record(id: &str, updated: u64, identity: &str) -> SessionRecord {
    SessionRecord {
        version: SESSION_VERSION,
        id: id.into(),
        title: SessionRecord::title_from(&[Message::user("  \n first line of a question \nsecond")]),
        created: 1,
        updated,
        model: ModelRef {
            name: "tiny.gguf".into(),
            identity: identity.into(),
        },
        settings: SessionSettings {
            think: "high".into(),
            system: "be brief".into(),
            temperature: 0.5,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.05,
            seed: Some(7),
            max_tokens: 100,
        },
        messages: vec![
            Message::user("hi"),
            Message::assistant("hello", Some("thinking".into())),
        ],
        tokens: 42,
        transcript: Some(TranscriptIds {
            messages: 3,
            ids: vec![0, 5, 6],
        }),
    }
}

#[test]
fn a_session_round_trips_and_lists_newest_first_and_resolves_numbers_ids_and_prefixes() {
    let s = scratch("round");
    let a = record("20261201-100000-aaaa", 100, "10-00000000000000aa");
    let b = record("20261202-100000-bbbb", 200, "10-00000000000000bb");
    s.save(&a).unwrap();
    s.save(&b).unwrap();
    assert_eq!(s.load(&a.id).unwrap(), a);
    assert_eq!(a.title, "first line of a question");
    let text = std::fs::read_to_string(s.session_path(&a.id)).unwrap();
    assert!(text.contains("\"role\": \"user\"") && text.contains("\"role\": \"assistant\""));
    let (list, problems) = s.list();
    assert!(problems.is_empty());
    assert_eq!(list.iter().map(|x| x.id.as_str()).collect::<Vec<_>>(), [&b.id, &a.id]);
    assert_eq!(s.resolve("1").unwrap(), b.id);
    assert_eq!(s.resolve("2").unwrap(), a.id);
    assert_eq!(s.resolve("20261201").unwrap(), a.id);
    assert!(s.resolve("2026").unwrap_err().contains("names 2 sessions"));
    assert!(s.resolve("9").unwrap_err().starts_with("no session 9"));
    assert_eq!(s.latest_for("10-00000000000000aa"), Some(a.id.clone()));
    assert_eq!(s.latest_for("10-00000000000000cc"), None);
    std::fs::write(s.snapshot_path(&a.id), b"kv").unwrap();
    s.delete(&a.id).unwrap();
    assert!(!s.snapshot_path(&a.id).exists() && !s.session_path(&a.id).exists());
    std::fs::remove_dir_all(s.dir()).unwrap();
}

/// Damaged session files: each read fails with one line naming the session and the problem, and the
/// list still shows the good ones.
#[test]
fn damaged_session_files_are_rejected_with_one_line_each() {
    let s = scratch("damaged");
    let good = record("good", 5, "10-00000000000000aa");
    s.save(&good).unwrap();
    let text = serde_json::to_string_pretty(&good).unwrap();
    let edit = |from: &str, to: &str| text.replace(from, to);
    let cases: Vec<(&str, String, &str)> = vec![
        ("empty", String::new(), "not a session file"),
        ("garbage", "\u{0}\u{1}binary".into(), "not a session file"),
        ("truncated", text[..text.len() / 2].to_string(), "not a session file"),
        ("version", edit("\"version\": 1", "\"version\": 9"), "version 9"),
        ("other-id", text.clone(), "names session \"good\""),
        ("unknown-key", text.replacen('{', "{\"colour\": 1,", 1), "unknown field"),
        (
            "no-messages",
            edit("\"messages\"", "\"messagez\""),
            "not a session file",
        ),
        (
            "bad-role",
            edit("\"role\": \"user\"", "\"role\": \"robot\""),
            "not a session file",
        ),
        (
            "system-turn",
            edit("\"role\": \"user\"", "\"role\": \"system\""),
            "a system message among the turns",
        ),
        ("identity", edit("10-00000000000000aa", "ten"), "bad model identity"),
        (
            "transcript",
            edit("\"messages\": 3", "\"messages\": 30"),
            "the transcript stands for 30 messages",
        ),
    ];
    for (name, contents, want) in &cases {
        let contents = if *name == "other-id" {
            contents.clone()
        } else {
            contents.replace("\"id\": \"good\"", &format!("\"id\": \"{name}\""))
        };
        std::fs::write(s.session_path(name), contents).unwrap();
        let e = s.load(name).unwrap_err();
        assert!(!e.contains('\n'), "{name}: more than one line: {e}");
        assert!(e.starts_with(&format!("session {name}: ")), "{name}: {e}");
        assert!(e.contains(want), "{name}: {e:?} does not say {want:?}");
    }
    let (list, problems) = s.list();
    assert_eq!(list.len(), 1);
    assert_eq!(problems.len(), cases.len());
    std::fs::remove_dir_all(s.dir()).unwrap();
}

#[test]
fn times_and_ids_are_utc_calendar_dates() {
    // 2026-12-02 00:07:33 UTC.
    let t = 1_796_170_053;
    assert_eq!(format_time(t), "2026-12-02 00:07");
    let id = new_id(t);
    assert!(id.starts_with("20261202-000733-"), "{id}");
    assert_eq!(id.len(), "20261202-000733-1a2b".len());
    assert_eq!(format_time(0), "1970-01-01 00:00");
    // A leap day.
    assert_eq!(format_time(951_782_400), "2000-02-29 00:00");
}
