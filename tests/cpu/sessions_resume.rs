//! Kept sessions on the CPU engine (docs/sessions.md): a cache carried through the KV snapshot file
//! continues bitwise like the uninterrupted session; damaged snapshots are refused with one line;
//! a saved conversation resumes in the worker from its snapshot (or, when the snapshot is unusable,
//! by reading the conversation again) and its next answer is the uninterrupted one. The ignored
//! `time_to_ready_*` test measures resuming an 8k-token conversation against prefilling it again.

use crate::sessions_common;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ds4_chat::backend::arithmetic::Arithmetic;
use ds4_chat::engine::events::{
    BackendChoice, Command, Event, LoadRequest, ModelSource, ResumeRequest, TurnRequest, WeightsMode,
};
use ds4_chat::engine::loader::EngineLoader;
use ds4_chat::engine::worker::Worker;
use ds4_chat::genmodel::{ExpertMix, tiny_model};
use ds4_chat::model::Model;
use ds4_chat::model::chat::{Message, ThinkMode};
use ds4_chat::sessions::store::TranscriptIds;
use ds4_chat::sessions::{ModelIdentity, snapshot};
use sessions_common::{carry, continue_both, cpu_session, tokens};

fn demo_model() -> Arc<Model> {
    Arc::new(Model::bind(tiny_model(1, ExpertMix::Q2).unwrap()).unwrap())
}

/// 40 tokens (past the 16-token window, several ratio-4 rows, a ratio-128 state filling) as one
/// prefill, carried through the file, then 6 more tokens: bitwise the uninterrupted session's.
#[test]
fn a_resumed_cache_continues_bitwise_like_the_uninterrupted_session() {
    let model = demo_model();
    let all = tokens(46, 3, model.hp.n_vocab);
    let (held, then) = all.split_at(40);
    let mut uninterrupted = cpu_session(&model, 128);
    uninterrupted.eval(held, &mut |_, _| true).unwrap();
    let mut resumed = cpu_session(&model, 128);
    carry(&model, uninterrupted.as_ref(), held, resumed.as_mut());
    continue_both(resumed.as_mut(), uninterrupted.as_mut(), then, "CPU to CPU");
    // A session of another context (and so other capacities) resumes the same cache too.
    let mut wider = cpu_session(&model, 256);
    let mut again = cpu_session(&model, 128);
    again.eval(held, &mut |_, _| true).unwrap();
    carry(&model, again.as_ref(), held, wider.as_mut());
    continue_both(wider.as_mut(), again.as_mut(), then, "context 128 to 256");
}

/// Every kind of damage is refused with one line saying what is wrong, before anything is imported.
#[test]
fn damaged_snapshots_are_refused_with_one_line_each() {
    let model = demo_model();
    let hp = &model.hp;
    let id = ModelIdentity::of(&model.file);
    let held = tokens(20, 5, hp.n_vocab);
    let mut b = cpu_session(&model, 64);
    b.eval(&held, &mut |_, _| true).unwrap();
    let rows = b.export_cache().unwrap();
    let good = snapshot::encode(id, hp, &held, &rows);
    assert!(snapshot::decode(&good, id, hp).is_ok());
    let resum = |mut v: Vec<u8>| {
        let n = v.len() - 8;
        let sum = ds4_chat::sessions::identity::hash64(&v[..n]);
        v[n..].copy_from_slice(&sum.to_le_bytes());
        v
    };
    let patch = |at: usize, bytes: &[u8]| {
        let mut v = good.clone();
        v[at..at + bytes.len()].copy_from_slice(bytes);
        resum(v)
    };
    let mut other_shape = hp.clone();
    other_shape.sliding_window += 1;
    let mut flipped = good.clone();
    flipped[good.len() / 2] ^= 0x40;
    let mut longer = good.clone();
    longer.extend_from_slice(&[0; 16]);
    let mut out_of_vocab = held.clone();
    out_of_vocab[3] = hp.n_vocab as u32 + 7;
    let first_token_at = 8 + 4 + 4 + 16 + 20 + 4 + 8;
    let cases: Vec<(&str, Vec<u8>, ModelIdentity, &str)> = vec![
        ("empty file", Vec::new(), id, "too short"),
        (
            "other file type",
            b"PK\x03\x04 a zip file, not a snapshot".to_vec(),
            id,
            "bad magic",
        ),
        ("foreign version", patch(8, &2u32.to_le_bytes()), id, "version 2"),
        ("truncated", good[..good.len() * 2 / 3].to_vec(), id, "checksum"),
        ("truncated header", good[..20].to_vec(), id, "truncated"),
        ("flipped bit", flipped, id, "checksum"),
        ("trailing bytes", longer, id, "checksum"),
        (
            "other model size",
            good.clone(),
            ModelIdentity {
                file_size: id.file_size + 1,
                ..id
            },
            "another model file",
        ),
        (
            "other model hash",
            good.clone(),
            ModelIdentity {
                header_hash: id.header_hash ^ 1,
                ..id
            },
            "another model file",
        ),
        (
            "other shape",
            snapshot::encode(id, &other_shape, &held, &rows),
            id,
            "sliding window",
        ),
        (
            "token outside the vocabulary",
            snapshot::encode(id, hp, &out_of_vocab, &rows),
            id,
            "outside the vocabulary",
        ),
        (
            "token ids changed",
            patch(first_token_at, &[1, 0, 0, 0]),
            id,
            "do not match their hash",
        ),
        (
            "token count changed",
            patch(first_token_at - 12, &19u32.to_le_bytes()),
            id,
            "hash",
        ),
    ];
    assert!(cases.len() >= 10);
    for (what, bytes, want_id, says) in cases {
        let e = snapshot::decode(&bytes, want_id, hp).expect_err(what);
        assert!(!e.is_empty() && !e.contains('\n'), "{what}: not one line: {e:?}");
        assert!(e.contains(says), "{what}: {e:?} does not say {says:?}");
    }
    // Rows of the wrong size never reach the backend's cache.
    let mut short = rows.clone();
    short.layers[2].raw.pop();
    let mut fresh = cpu_session(&model, 64);
    assert!(fresh.import_cache(&short, &held).is_err());
    assert_eq!(fresh.n_past(), 0);
}

/// Messages and events of one greedy turn through a worker.
struct Chat {
    worker: Worker,
}

fn load(ctx: u32) -> Chat {
    let worker = Worker::spawn(Box::new(EngineLoader::new()));
    worker.send(Command::Load(LoadRequest {
        source: ModelSource::Demo { seed: 1 },
        ctx,
        backend: BackendChoice::Cpu,
        weights: WeightsMode::Auto,
        arithmetic: Arithmetic::Exact,
        threads: 0,
    }));
    let chat = Chat { worker };
    chat.until(|e| matches!(e, Event::Loaded(_)), Duration::from_secs(120));
    chat
}

impl Chat {
    fn until(&self, mut done: impl FnMut(&Event) -> bool, limit: Duration) -> Vec<Event> {
        let start = Instant::now();
        let mut seen = Vec::new();
        while start.elapsed() < limit {
            if let Some(e) = self.worker.recv_timeout(Duration::from_millis(100)) {
                if let Event::Error { message, fatal: true } = &e {
                    panic!("worker: {message}");
                }
                let stop = done(&e);
                seen.push(e);
                if stop {
                    return seen;
                }
            }
        }
        panic!("no expected event within {limit:?}; saw {seen:?}");
    }

    /// One greedy turn; returns the answer text.
    fn turn(&self, messages: Vec<Message>, max_tokens: u32) -> String {
        self.worker.send(Command::Submit(TurnRequest::greedy(
            messages,
            ThinkMode::Off,
            max_tokens,
        )));
        let events = self.until(|e| matches!(e, Event::TurnFinished { .. }), Duration::from_secs(300));
        events
            .iter()
            .filter_map(|e| match e {
                Event::Text { text, .. } => Some(text.as_str()),
                _ => None,
            })
            .collect()
    }

    fn save(&self, path: PathBuf) -> (u32, Option<TranscriptIds>) {
        self.worker.send(Command::SaveSnapshot { path });
        match self
            .until(|e| matches!(e, Event::SnapshotSaved { .. }), Duration::from_secs(60))
            .pop()
        {
            Some(Event::SnapshotSaved {
                result,
                tokens,
                transcript,
                ..
            }) => {
                result.expect("snapshot written");
                (tokens, transcript)
            }
            _ => unreachable!(),
        }
    }

    /// Resume; returns (tokens, from snapshot, note, time to ready).
    fn resume(&self, req: ResumeRequest) -> (u32, bool, Option<String>, Duration) {
        self.worker.send(Command::Resume(req));
        match self
            .until(|e| matches!(e, Event::Resumed { .. }), Duration::from_secs(600))
            .pop()
        {
            Some(Event::Resumed {
                tokens,
                from_snapshot,
                note,
                elapsed,
            }) => (tokens, from_snapshot, note, elapsed),
            _ => unreachable!(),
        }
    }
}

fn scratch(tag: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("sessions-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn a_resumed_conversation_answers_like_the_uninterrupted_one() {
    let dir = scratch("worker");
    let path = dir.join("s.kv");
    let first = vec![Message::system("be brief"), Message::user("tell me about the sea")];
    let a = load(512);
    let answer1 = a.turn(first.clone(), 12);
    let (cached, transcript) = a.save(path.clone());
    let transcript = transcript.expect("the worker reports its transcript");
    assert_eq!(transcript.messages, 3);
    assert!(cached > 0 && transcript.ids.len() as u32 >= cached);
    let mut history = first.clone();
    history.push(Message::assistant(answer1.clone(), None));
    let mut second = history.clone();
    second.push(Message::user("and the mountains?"));
    let uninterrupted = a.turn(second.clone(), 12);

    // From the snapshot: ready with the same tokens, and the next answer is the same.
    let b = load(512);
    let req = ResumeRequest {
        messages: history.clone(),
        transcript: Some(transcript.clone()),
        snapshot: Some(path.clone()),
    };
    let (tokens, from_snapshot, note, _) = b.resume(req.clone());
    assert_eq!((tokens, from_snapshot, note), (cached, true, None));
    assert_eq!(b.turn(second.clone(), 12), uninterrupted);

    // A damaged snapshot: one line saying so, the conversation still opens (read again) and
    // continues.
    let mut bytes = std::fs::read(&path).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 1;
    std::fs::write(&path, &bytes).unwrap();
    let c = load(512);
    let (tokens, from_snapshot, note, _) = c.resume(req.clone());
    let note = note.expect("a notice");
    assert!(!from_snapshot && tokens == cached, "{tokens} {note}");
    assert!(note.contains("checksum") && !note.contains('\n'), "{note}");
    assert!(!c.turn(second.clone(), 12).is_empty());

    // A missing snapshot (evicted by the budget) reads the conversation again too.
    std::fs::remove_file(&path).unwrap();
    let (tokens, from_snapshot, note, _) = c.resume(req);
    assert!(!from_snapshot && tokens == cached);
    assert!(note.unwrap().contains("cannot read"));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Time to ready for a conversation of about 8k tokens: from its KV snapshot against reading it
/// again. `DS4_MODEL=FILE` measures a real model (default: the demo model on the CPU);
/// `DS4_BACKEND=hip|cpu|auto` picks the backend.
#[test]
#[ignore = "a measurement: cargo test --release --test cpu time_to_ready -- --ignored --nocapture"]
fn time_to_ready_of_an_8k_conversation_from_its_snapshot_and_read_again() {
    let source = match std::env::var_os("DS4_MODEL") {
        Some(p) => ModelSource::File(PathBuf::from(p)),
        None => ModelSource::Demo { seed: 1 },
    };
    let backend = match std::env::var("DS4_BACKEND").as_deref() {
        Ok("hip") => BackendChoice::Hip,
        Ok("auto") => BackendChoice::Auto,
        _ => BackendChoice::Cpu,
    };
    let worker = Worker::spawn(Box::new(EngineLoader::new()));
    worker.send(Command::Load(LoadRequest {
        source,
        ctx: 9216,
        backend,
        weights: WeightsMode::Auto,
        arithmetic: Arithmetic::Exact,
        threads: 0,
    }));
    let chat = Chat { worker };
    let loaded = chat.until(|e| matches!(e, Event::Loaded(_)), Duration::from_secs(600));
    let Some(Event::Loaded(info)) = loaded.last() else {
        unreachable!()
    };
    let words = [
        "sessions", "survive", "restarts", "because", "the", "cache", "is", "kept", "on", "disk.",
    ];
    let long: String = (0..7600).map(|i| words[i % words.len()]).collect::<Vec<_>>().join(" ");
    let messages = vec![Message::user(long)];
    let answer = chat.turn(messages.clone(), 4);
    let dir = scratch("ttr");
    let path = dir.join("s.kv");
    let t = Instant::now();
    let (cached, transcript) = chat.save(path.clone());
    let save_time = t.elapsed();
    let size = std::fs::metadata(&path).unwrap().len();
    let mut history = messages;
    history.push(Message::assistant(answer, None));
    let req = |snapshot: Option<PathBuf>| ResumeRequest {
        messages: history.clone(),
        transcript: transcript.clone(),
        snapshot,
    };
    let (n1, snap1, note1, from_snapshot) = chat.resume(req(Some(path.clone())));
    let (n2, snap2, _, read_again) = chat.resume(req(None));
    println!(
        "{} on {} ({}): {cached} tokens; snapshot {:.1} MiB written in {:.3} s; time to ready: from the snapshot {:.3} s, read again {:.3} s ({:.1}x)",
        info.name,
        info.backend,
        info.device,
        size as f64 / (1 << 20) as f64,
        save_time.as_secs_f64(),
        from_snapshot.as_secs_f64(),
        read_again.as_secs_f64(),
        read_again.as_secs_f64() / from_snapshot.as_secs_f64().max(1e-9)
    );
    assert!(cached >= 7600, "{cached} tokens");
    assert_eq!((n1, snap1, note1), (cached, true, None));
    assert_eq!((n2, snap2), (cached, false));
    assert!(from_snapshot < read_again, "the snapshot is not faster");
    std::fs::remove_dir_all(&dir).unwrap();
}
