//! The worker's speculative turns (prompt lookup, block verify through the prompt cache).

use super::*;

/// A greedy turn of a tiny model (CPU) with `speculate`: its events.
fn tiny_turn(speculate: crate::engine::speculate::Speculate, max_tokens: u32) -> Vec<Event> {
    let w = Worker::spawn(Box::new(TinyLoader { vocab: Some(512) }));
    let mut load = load_request();
    load.ctx = 1024;
    load.threads = 2;
    w.send(Command::SetSpeculate(speculate));
    w.send(Command::Load(load));
    collect_until(&w, |e| matches!(e, Event::Loaded(_) | Event::Error { .. }));
    let prompt = "the cat sat on the mat; the cat sat on the mat; the cat sat on the mat; the cat";
    w.send(Command::Submit(TurnRequest::greedy(
        vec![user(prompt)],
        ThinkMode::Off,
        max_tokens,
    )));
    collect_until(&w, is_finished)
}

/// The worker's speculative turn (prompt lookup, block verify through the prompt cache) hands out
/// plain decoding's text, token count and context use; the drafter proposed tokens and some were
/// accepted.
#[test]
fn speculative_turn_equals_plain_turn() {
    use crate::engine::speculate::Speculate;
    let plain = tiny_turn(Speculate::Off, 200);
    let spec = tiny_turn(Speculate::Ngram, 200);
    assert_eq!(texts(&spec), texts(&plain));
    assert_eq!(finished(&spec), finished(&plain));
    assert_eq!(finished(&plain).1, 200);
    assert!(!plain.iter().any(|e| matches!(e, Event::Speculation(_))));
    let figures = spec
        .iter()
        .find_map(|e| match e {
            Event::Speculation(f) => Some(*f),
            _ => None,
        })
        .expect("a speculative turn reports its figures");
    eprintln!("worker speculative turn: {figures:?}");
    assert!(figures.drafted > 0 && figures.accepted > 0, "{figures:?}");
}
