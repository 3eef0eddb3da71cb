//! Worker tests against a deterministic toy backend and a byte-level toy chat text, so event order,
//! cancel latency and panics are tested independently of the real engine. Test code only.

use super::*;
use crate::backend::{MemoryReport, Progress};
use crate::engine::events::TurnRequest;
use crate::model::chat::{Message, Role};
use std::time::Instant;

// Toy vocabulary: ids 0..=255 are bytes; then the specials.
const EOS: u32 = 256;
const USER: u32 = 257;
const ASSISTANT: u32 = 258;
const THINK: u32 = 259;
const END_THINK: u32 = 260;
const BOS: u32 = 261;
const N_VOCAB: usize = 262;

/// Behaviour of the toy model.
#[derive(Clone)]
struct FakeConfig {
    /// Tokens per prefill chunk (progress and cancel points).
    chunk: usize,
    /// Sleep per prefill chunk and per decoded token.
    delay: Duration,
    ctx: usize,
    reasoning_len: usize,
    answer_len: usize,
    /// Panic when the cache would reach this many tokens.
    panic_at: Option<usize>,
    /// Region the loader hands out for warm-up.
    warmup: Option<Arc<dyn MappedRegion>>,
}

impl Default for FakeConfig {
    fn default() -> Self {
        FakeConfig {
            chunk: 4,
            delay: Duration::ZERO,
            ctx: 4096,
            reasoning_len: 5,
            answer_len: 7,
            panic_at: None,
            warmup: None,
        }
    }
}

/// The toy model's rule: after `<think>` it writes `reasoning_len` letters and `</think>`; after
/// `</think>` it writes `answer_len` letters and EOS. The letter depends on the position.
fn next_token(tokens: &[u32], cfg: &FakeConfig) -> u32 {
    let Some(i) = tokens.iter().rposition(|&t| t == THINK || t == END_THINK) else {
        return EOS;
    };
    let since = tokens.len() - i - 1;
    let letter = b'a' as u32 + ((tokens.len() * 7 + 3) % 26) as u32;
    match tokens[i] {
        THINK if since < cfg.reasoning_len => letter,
        THINK => END_THINK,
        _ if since < cfg.answer_len => letter,
        _ => EOS,
    }
}

struct FakeSession {
    cfg: FakeConfig,
    tokens: Vec<u32>,
    logits: Vec<f32>,
}

impl FakeSession {
    fn push(&mut self, t: u32) {
        if self.cfg.panic_at == Some(self.tokens.len() + 1) {
            panic!("toy backend exploded at position {}", self.tokens.len());
        }
        self.tokens.push(t);
    }
    fn set_logits(&mut self) {
        self.logits.fill(0.0);
        self.logits[next_token(&self.tokens, &self.cfg) as usize] = 10.0;
    }
}

impl DeviceSession for FakeSession {
    fn name(&self) -> &'static str {
        "toy"
    }
    fn device_name(&self) -> String {
        "toy device".into()
    }
    fn ctx(&self) -> usize {
        self.cfg.ctx
    }
    fn n_past(&self) -> usize {
        self.tokens.len()
    }
    fn eval(&mut self, tokens: &[u32], progress: Progress<'_>) -> Result<(), BackendError> {
        let needed = self.tokens.len() + tokens.len();
        if needed >= self.cfg.ctx {
            return Err(BackendError::ContextFull {
                needed,
                ctx: self.cfg.ctx,
            });
        }
        crate::backend::eval_in_chunks(tokens, self.cfg.chunk, progress, |chunk| {
            std::thread::sleep(self.cfg.delay);
            for &t in chunk {
                self.push(t);
            }
            self.set_logits();
        })
    }
    fn logits(&self) -> &[f32] {
        &self.logits
    }
    fn reset(&mut self) {
        self.tokens.clear();
        self.logits.fill(0.0);
    }
    fn save_state(&self) -> Vec<u8> {
        self.tokens.iter().flat_map(|t| t.to_le_bytes()).collect()
    }
    fn load_state(&mut self, bytes: &[u8]) -> Result<(), BackendError> {
        self.tokens = bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect();
        self.set_logits();
        Ok(())
    }
    fn memory(&self) -> MemoryReport {
        MemoryReport {
            kv_bytes: 100 * self.tokens.len() as u64,
            scratch_bytes: 1000,
            ..Default::default()
        }
    }
}

/// Byte-level chat rendering that is stable across turns: an assistant message renders exactly as
/// it was generated (`<think>` reasoning `</think>` content, then EOS).
struct FakeText;

fn render(conv: &Conversation, think: ThinkMode) -> Vec<u32> {
    let mut out = vec![BOS];
    for m in &conv.messages {
        match m.role {
            Role::System => out.extend(m.content.bytes().map(u32::from)),
            Role::User => {
                out.push(USER);
                out.extend(m.content.bytes().map(u32::from));
            }
            Role::Assistant => {
                out.push(ASSISTANT);
                if let Some(r) = &m.reasoning {
                    out.push(THINK);
                    out.extend(r.bytes().map(u32::from));
                }
                out.push(END_THINK);
                out.extend(m.content.bytes().map(u32::from));
                out.push(EOS);
            }
        }
    }
    out.push(ASSISTANT);
    out.push(if think == ThinkMode::Off { END_THINK } else { THINK });
    out
}

impl ChatText for FakeText {
    fn for_context(&self, _ctx: u32) -> Box<dyn ChatText> {
        Box::new(FakeText)
    }
    fn prompt(&mut self, conv: &Conversation, think: ThinkMode, _live: &[u32]) -> Result<Vec<u32>, String> {
        Ok(render(conv, think))
    }
    fn turn_done(&mut self, _: &Conversation, _: &[u32], _: FinishReason) {}
    fn forget(&mut self) {}
    fn eos(&self) -> u32 {
        EOS
    }
    fn stream(&self, think: ThinkMode) -> Box<dyn TextStream> {
        Box::new(FakeStream {
            kind: if think == ThinkMode::Off {
                TextKind::Answer
            } else {
                TextKind::Reasoning
            },
        })
    }
}

struct FakeStream {
    kind: TextKind,
}

impl TextStream for FakeStream {
    fn push(&mut self, token: u32, out: &mut Vec<(TextKind, String)>) {
        match token {
            END_THINK => self.kind = TextKind::Answer,
            t if t < 256 => out.push((self.kind, (t as u8 as char).to_string())),
            _ => {}
        }
    }
    fn finish(&mut self, _: &mut Vec<(TextKind, String)>) {}
}

struct FakeLoader {
    cfg: FakeConfig,
}

impl ModelLoader for FakeLoader {
    fn load(&mut self, req: &LoadRequest, _notice: &mut dyn FnMut(Event)) -> Result<LoadedModel, String> {
        if let crate::engine::events::ModelSource::File(p) = &req.source {
            return Err(format!("{}: no such toy model", p.display()));
        }
        Ok(LoadedModel {
            device_model: None,
            session: Box::new(FakeSession {
                cfg: self.cfg.clone(),
                tokens: Vec::new(),
                logits: vec![0.0; N_VOCAB],
            }),
            text: Box::new(FakeText),
            info: ModelInfo {
                name: "toy".into(),
                backend: "toy".into(),
                is_demo: true,
                ..Default::default()
            },
            warmup: self.cfg.warmup.clone(),
            residency: None,
        })
    }
}

fn load_request() -> LoadRequest {
    LoadRequest {
        source: crate::engine::events::ModelSource::Demo { seed: 1 },
        ctx: 4096,
        backend: Default::default(),
        weights: Default::default(),
        arithmetic: Default::default(),
        threads: 1,
    }
}

fn user(text: &str) -> Message {
    Message::user(text)
}

fn turn(messages: Vec<Message>, think: ThinkMode) -> TurnRequest {
    TurnRequest::greedy(messages, think, 10_000)
}

fn started(cfg: FakeConfig) -> Worker {
    let w = Worker::spawn(Box::new(FakeLoader { cfg }));
    w.send(Command::Load(load_request()));
    w
}

const WAIT: Duration = Duration::from_secs(20);

/// Events up to and including the first one `stop` accepts.
fn collect_until(w: &Worker, stop: impl Fn(&Event) -> bool) -> Vec<Event> {
    collect_until_within(w, WAIT, stop)
}

/// Events up to and including the first one `stop` accepts, each within `wait` of the last (shared
/// with the loader's end-to-end tests, which wait longer for a real model).
pub(crate) fn collect_until_within(w: &Worker, wait: Duration, stop: impl Fn(&Event) -> bool) -> Vec<Event> {
    let mut out = Vec::new();
    loop {
        let e = w.recv_timeout(wait).expect("worker went quiet");
        let done = stop(&e);
        out.push(e);
        if done {
            return out;
        }
    }
}

pub(crate) fn is_finished(e: &Event) -> bool {
    matches!(e, Event::TurnFinished { .. })
}

/// Reasoning and answer text of a turn's events.
fn texts(events: &[Event]) -> (String, String) {
    let (mut r, mut a) = (String::new(), String::new());
    for e in events {
        if let Event::Text { kind, text } = e {
            match kind {
                TextKind::Reasoning => r.push_str(text),
                TextKind::Answer => a.push_str(text),
            }
        }
    }
    (r, a)
}

/// The toy model's output for a prompt, by its rule (independent of the worker).
/// Each `TokenTiming`'s step and elapsed time, in order.
fn token_timings(ev: &[Event]) -> Vec<(u32, Duration)> {
    ev.iter()
        .filter_map(|e| match e {
            Event::TokenTiming { step, elapsed, .. } => Some((*step, *elapsed)),
            _ => None,
        })
        .collect()
}

fn expected_output(prompt: &[u32], cfg: &FakeConfig) -> (String, String, usize) {
    let mut toks = prompt.to_vec();
    let (mut r, mut a) = (String::new(), String::new());
    let mut in_answer = *prompt.last().unwrap() == END_THINK;
    loop {
        let t = next_token(&toks, cfg);
        if t == EOS {
            return (r, a, toks.len() - prompt.len());
        }
        if t == END_THINK {
            in_answer = true;
        } else if in_answer {
            a.push(t as u8 as char);
        } else {
            r.push(t as u8 as char);
        }
        toks.push(t);
    }
}

#[test]
fn full_turn_event_order() {
    let cfg = FakeConfig::default();
    let w = started(cfg.clone());
    let req = turn(vec![user("hello there")], ThinkMode::High);
    let prompt = render(&req.conversation, ThinkMode::High);
    w.send(Command::Submit(req));
    let ev = collect_until(&w, is_finished);

    // Load first, then the turn in order.
    assert!(matches!(ev[0], Event::LoadStarted { .. }), "{:?}", ev[0]);
    let Event::Loaded(info) = &ev[1] else {
        panic!("{:?}", ev[1])
    };
    assert_eq!((info.ctx, info.kv_bytes, info.scratch_bytes), (4096, 0, 1000));
    let Event::TurnStarted {
        prompt_tokens,
        reused_tokens,
        think,
        ..
    } = &ev[2]
    else {
        panic!("{:?}", ev[2])
    };
    assert_eq!(
        (*prompt_tokens as usize, *reused_tokens, *think),
        (prompt.len(), 0, ThinkMode::High)
    );
    let order: Vec<&str> = ev[3..]
        .iter()
        .map(|e| match e {
            Event::PrefillProgress { .. } => "progress",
            Event::PrefillDone { .. } => "done",
            Event::Stats(_) => "stats",
            Event::Text { .. } => "text",
            Event::TokenTiming { .. } => "timing",
            Event::TurnFinished { .. } => "finished",
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    let first_done = order.iter().position(|&k| k == "done").unwrap();
    assert!(order[..first_done].iter().all(|&k| k == "progress"));
    assert_eq!(order[first_done + 1], "stats");
    assert_eq!(order[order.len() - 2..], ["stats", "finished"]);
    // Progress is monotone and ends at the total.
    let progress: Vec<(u32, u32)> = ev
        .iter()
        .filter_map(|e| match e {
            Event::PrefillProgress { done, total, .. } => Some((*done, *total)),
            _ => None,
        })
        .collect();
    assert!(progress.windows(2).all(|w| w[0].0 < w[1].0));
    assert_eq!(*progress.last().unwrap(), (prompt.len() as u32, prompt.len() as u32));
    // Every decoded token's timing, numbered 1..=n, each after its text.
    let (reasoning, answer, n) = expected_output(&prompt, &cfg);
    assert_eq!((reasoning.len(), answer.len()), (cfg.reasoning_len, cfg.answer_len));
    assert_eq!(texts(&ev), (reasoning, answer));
    let steps: Vec<u32> = token_timings(&ev).into_iter().map(|(step, _)| step).collect();
    assert_eq!(steps, (1..=n as u32).collect::<Vec<_>>());
    let Event::TurnFinished {
        reason,
        generated,
        context_used,
    } = ev.last().unwrap()
    else {
        unreachable!()
    };
    assert_eq!(*reason, FinishReason::Eos);
    assert_eq!(*generated as usize, n);
    assert_eq!(*context_used as usize, prompt.len() + n);
    let Some(Event::Stats(s)) = ev.iter().rev().find(|e| matches!(e, Event::Stats(_))) else {
        unreachable!()
    };
    assert_eq!(
        (s.generated as usize, s.context_used, s.context_size),
        (n, *context_used, 4096)
    );
    assert_eq!(s.kv_bytes, 100 * *context_used as u64);
    assert!(s.prefill_latency.is_some() && s.first_answer_latency >= s.prefill_latency);
    let rest = w.shutdown();
    assert!(matches!(rest.last(), Some(Event::ShutdownComplete)), "{rest:?}");
}

/// Send Cancel once `ready` sees an event; returns the events and the Cancel → TurnFinished latency.
fn cancel_when(w: &Worker, ready: impl Fn(&Event) -> bool) -> (Vec<Event>, Duration) {
    let mut ev = collect_until(w, |e| ready(e) || is_finished(e));
    assert!(!is_finished(ev.last().unwrap()), "turn ended before the cancel point");
    let t0 = Instant::now();
    w.send(Command::Cancel);
    ev.extend(collect_until(w, is_finished));
    (ev, t0.elapsed())
}

fn finished(ev: &[Event]) -> (FinishReason, u32, u32) {
    match ev.last() {
        Some(Event::TurnFinished {
            reason,
            generated,
            context_used,
        }) => (*reason, *generated, *context_used),
        e => panic!("{e:?}"),
    }
}

/// The first `TurnStarted`'s reused prefix and the first `PrefillDone`'s evaluated tokens.
fn prefix_counts(ev: &[Event]) -> (Option<u32>, Option<u32>) {
    let (mut reused, mut evaluated) = (None, None);
    for e in ev {
        match e {
            Event::TurnStarted { reused_tokens, .. } => _ = reused.get_or_insert(*reused_tokens),
            Event::PrefillDone { tokens, .. } => _ = evaluated.get_or_insert(*tokens),
            _ => {}
        }
    }
    (reused, evaluated)
}

fn reused(ev: &[Event]) -> u32 {
    prefix_counts(ev).0.expect("TurnStarted")
}

fn prefill_evaluated(ev: &[Event]) -> u32 {
    prefix_counts(ev).1.expect("PrefillDone")
}

/// Asserts that the turn in `ev` reused a prefix of `prefix` tokens and ended for `reason`.
fn assert_reused_and_ended(ev: &[Event], prefix: u32, reason: FinishReason) {
    assert_eq!((reused(ev), finished(ev).0), (prefix, reason));
}

#[test]
fn cancel_during_prefill_keeps_the_prefix() {
    // 4-token chunks at 20 ms each: a 400-byte prompt takes ≈ 2 s to prefill.
    let cfg = FakeConfig {
        delay: Duration::from_millis(20),
        ..Default::default()
    };
    let w = started(cfg);
    let req = turn(vec![user(&"x".repeat(400))], ThinkMode::Off);
    w.send(Command::Submit(req.clone()));
    let (ev, latency) = cancel_when(&w, |e| matches!(e, Event::PrefillProgress { done, .. } if *done >= 40));
    let (reason, generated, used) = finished(&ev);
    assert_eq!((reason, generated), (FinishReason::Cancelled, 0));
    assert!((40..400).contains(&used), "{used}");
    // At most one chunk (20 ms) plus scheduling; generous bound for a loaded 2-core machine.
    assert!(latency < Duration::from_millis(500), "{latency:?}");
    assert!(!ev.iter().any(|e| matches!(e, Event::PrefillDone { .. })));
    // Resubmit: the cached part is reused and the turn completes.
    w.send(Command::Submit(req));
    let ev = collect_until(&w, is_finished);
    assert_reused_and_ended(&ev, used, FinishReason::Eos);
    eprintln!("toy cancel latency during prefill: {latency:?}");
}

#[test]
fn cancel_during_decode_then_continue() {
    let cfg = FakeConfig {
        delay: Duration::from_millis(10),
        reasoning_len: 3,
        answer_len: 100_000,
        ..Default::default()
    };
    let w = started(cfg);
    let first = turn(vec![user("hi")], ThinkMode::High);
    w.send(Command::Submit(first.clone()));
    let (ev, latency) = cancel_when(&w, |e| matches!(e, Event::TokenTiming { step: 20, .. }));
    let (reason, generated, used) = finished(&ev);
    assert_eq!(reason, FinishReason::Cancelled);
    assert!(generated >= 20);
    // Cancel is answered within a decode step plus scheduling: a responsiveness promise, with a
    // bound generous enough for a loaded 2-core machine.
    assert!(latency < Duration::from_millis(500), "{latency:?}");
    // Every generated token was decoded into the cache.
    let prompt_len = render(&first.conversation, ThinkMode::High).len() as u32;
    assert_eq!(used, prompt_len + generated);
    // The UI keeps the partial answer and asks again: the whole cache is reused.
    let (reasoning, answer) = texts(&ev);
    let mut messages = first.conversation.messages.clone();
    messages.push(Message::assistant(answer, Some(reasoning)));
    messages.push(user("go on"));
    w.send(Command::Submit(turn(messages, ThinkMode::Off)));
    let (ev2, _) = cancel_when(&w, |e| matches!(e, Event::TokenTiming { step: 2, .. }));
    assert_reused_and_ended(&ev2, used, FinishReason::Cancelled);
    eprintln!("toy cancel latency during decode: {latency:?}");
}

#[test]
fn limits_end_the_turn() {
    let cfg = FakeConfig {
        answer_len: 1000,
        ctx: 64,
        ..Default::default()
    };
    let w = started(cfg);
    let mut req = turn(vec![user("abc")], ThinkMode::Off);
    req.max_tokens = 5;
    w.send(Command::Submit(req.clone()));
    let ev = collect_until(&w, is_finished);
    assert_eq!(finished(&ev).0, FinishReason::Length);
    assert_eq!(finished(&ev).1, 5);
    // Context: prompt 7 tokens; generation stops when one more token would fill the context.
    req.max_tokens = 10_000;
    w.send(Command::Reset);
    w.send(Command::Submit(req.clone()));
    let ev = collect_until(&w, is_finished);
    let (reason, generated, used) = finished(&ev);
    assert_eq!(reason, FinishReason::ContextFull);
    assert_eq!(used, 63);
    assert_eq!(generated, 64 - 7 - 1);
    // A prompt longer than the context is refused as a value.
    w.send(Command::Submit(turn(vec![user(&"y".repeat(100))], ThinkMode::Off)));
    let ev = collect_until(&w, is_finished);
    assert!(
        ev.iter()
            .any(|e| matches!(e, Event::Error { fatal: false, message } if message.contains("raise --ctx")))
    );
    assert_eq!(finished(&ev).0, FinishReason::ContextFull);
}

#[test]
fn panic_becomes_a_fatal_error_and_the_worker_survives() {
    let cfg = FakeConfig {
        panic_at: Some(30),
        ..Default::default()
    };
    let w = started(cfg);
    w.send(Command::Submit(turn(vec![user(&"z".repeat(40))], ThinkMode::Off)));
    let ev = collect_until(&w, |e| matches!(e, Event::Error { .. }));
    match ev.last() {
        Some(Event::Error { message, fatal: true }) => assert!(message.contains("toy backend exploded"), "{message}"),
        e => panic!("{e:?}"),
    }
    // The turn still ends, so a client waiting for it is released.
    let ev = collect_until(&w, |_| true);
    assert_eq!(finished(&ev), (FinishReason::Cancelled, 0, 0));
    // The model is gone; the worker still answers.
    w.send(Command::Submit(turn(vec![user("a")], ThinkMode::Off)));
    let ev = collect_until(&w, is_finished);
    assert!(
        ev.iter()
            .any(|e| matches!(e, Event::Error { fatal: false, message } if message == "no model loaded"))
    );
    w.send(Command::Load(load_request()));
    let ev = collect_until(&w, |e| matches!(e, Event::Loaded(_) | Event::Error { .. }));
    assert!(matches!(ev.last(), Some(Event::Loaded(_))));
}

#[test]
fn load_failure_is_an_error_value() {
    let w = Worker::spawn(Box::new(FakeLoader {
        cfg: FakeConfig::default(),
    }));
    let mut req = load_request();
    req.source = crate::engine::events::ModelSource::File("/nonexistent.gguf".into());
    w.send(Command::Load(req));
    let ev = collect_until(&w, |e| matches!(e, Event::Error { .. }));
    assert!(matches!(ev.last(), Some(Event::Error { fatal: true, message }) if message.contains("/nonexistent.gguf")));
}

#[test]
fn warmup_yields_to_a_turn_and_completes() {
    // A 512 MiB anonymous region (32 chunks; reads map the zero page, no RAM used).
    let anon = memmap2::MmapOptions::new().len(512 << 20).map_anon().unwrap();
    let cfg = FakeConfig {
        warmup: Some(Arc::new(anon.make_read_only().unwrap())),
        ..Default::default()
    };
    let w = started(cfg);
    w.send(Command::Submit(turn(vec![user("warm")], ThinkMode::Off)));
    let mut ev = collect_until(&w, |e| matches!(e, Event::WarmupDone { .. }));
    assert!(ev.iter().any(is_finished), "turn did not run during the warm-up");
    let progress: Vec<(u64, Duration)> = ev
        .iter()
        .filter_map(|e| match e {
            Event::WarmupProgress {
                done_bytes, elapsed, ..
            } => Some((*done_bytes, *elapsed)),
            _ => None,
        })
        .collect();
    assert!(progress.windows(2).all(|w| w[0].0 <= w[1].0 && w[0].1 <= w[1].1));
    assert_eq!(progress.last().unwrap().0, 512 << 20);
    ev.clear();
}

/// Loads the in-memory tiny model (docs/model.md#tiny-model) on the real CPU backend; the chat text
/// stays the toy byte-level one (its ids are valid ids of the real vocabulary), so this measures the
/// real engine. `vocab` cuts the vocabulary (and drops the tokenizer), so that greedy output repeats
/// itself within a few hundred tokens and prompt lookup finds matches.
struct TinyLoader {
    vocab: Option<usize>,
}

impl ModelLoader for TinyLoader {
    fn load(&mut self, req: &LoadRequest, _notice: &mut dyn FnMut(Event)) -> Result<LoadedModel, String> {
        use crate::genmodel::{ExpertMix, GenSpec, Preset, model_bytes};
        let mut spec = GenSpec::new(Preset::Tiny, 7, ExpertMix::Q2);
        if let Some(v) = self.vocab {
            spec.hp.n_vocab = v;
            spec.tokenizer = false;
        }
        let file = crate::gguf::GgufFile::from_bytes(model_bytes(&spec).map_err(|e| e.to_string())?);
        let model =
            Arc::new(crate::model::Model::bind(Arc::new(file.map_err(|e| e.to_string())?)).map_err(|e| e.to_string())?);
        let backend =
            crate::backend::cpu::CpuSession::new(model, req.ctx as usize, req.threads).map_err(|e| e.to_string())?;
        Ok(LoadedModel {
            device_model: None,
            session: Box::new(backend),
            text: Box::new(FakeText),
            info: ModelInfo::default(),
            warmup: None,
            residency: None,
        })
    }
}

#[test]
fn real_tiny_model_cancel_latency_and_prefix_reuse() {
    let t = Instant::now();
    let w = Worker::spawn(Box::new(TinyLoader { vocab: None }));
    let mut load = load_request();
    load.ctx = 1024;
    load.threads = 2;
    w.send(Command::Load(load));
    let ev = collect_until(&w, |e| matches!(e, Event::Loaded(_) | Event::Error { .. }));
    let Some(Event::Loaded(info)) = ev.last() else {
        panic!("{ev:?}")
    };
    eprintln!("tiny model loaded in {:?}", t.elapsed());
    // The memory guard's formula (memguard.rs, from docs/model.md#kv-cache) against what the CPU
    // backend allocated, and its scratch estimate is an upper bound of the real scratch.
    let hp = crate::model::HParams::tiny();
    assert_eq!(info.kv_bytes, crate::backend::memguard::cpu_kv_bytes(&hp, 1024));
    let estimate = crate::backend::memguard::cpu_scratch_estimate(&hp, crate::backend::cpu::PREFILL_CHUNK as u64);
    assert!(info.scratch_bytes <= estimate, "{} > {estimate}", info.scratch_bytes);
    // Decode: the toy text never emits EOS for the real model, so the turn runs until cancelled.
    let first = turn(vec![user("Tell me a story about a cat.")], ThinkMode::Off);
    w.send(Command::Submit(first.clone()));
    let (ev, decode_latency) = cancel_when(&w, |e| matches!(e, Event::TokenTiming { step: 8, .. }));
    let (reason, generated, used) = finished(&ev);
    assert_eq!(reason, FinishReason::Cancelled);
    let steps: Vec<Duration> = token_timings(&ev).into_iter().map(|(_, elapsed)| elapsed).collect();
    // Prefill: a 260-token prompt (chunks of 128, 128, 4), cancelled once the first chunk is in:
    // the second chunk completes, the third is left for the resubmitted turn.
    let long = turn(vec![user(&format!("{}c", "ab ".repeat(85)))], ThinkMode::Off);
    w.send(Command::Submit(long.clone()));
    let (ev2, prefill_latency) = cancel_when(&w, |e| matches!(e, Event::PrefillProgress { done, .. } if *done > 0));
    let (reason2, _, used2) = finished(&ev2);
    let marks: Vec<String> = ev2
        .iter()
        .filter_map(|e| match e {
            Event::PrefillProgress { done, elapsed, .. } => Some(format!("{done}@{elapsed:?}")),
            _ => None,
        })
        .collect();
    eprintln!("prefill progress {marks:?}, cancelled with {used2} cached");
    assert_eq!(reason2, FinishReason::Cancelled);
    assert!(used2 > 0 && used2 < 260, "{used2}");
    w.send(Command::Submit(long));
    let (ev3, _) = cancel_when(&w, |e| matches!(e, Event::TokenTiming { step: 1, .. }));
    assert_eq!(reused(&ev3), used2);
    eprintln!(
        "real tiny model: {generated} tokens ({used} in context), decode steps {steps:?}; cancel latency: decode {decode_latency:?}, prefill {prefill_latency:?}"
    );
}

#[test]
fn retry_restores_a_checkpoint_and_rewind_keeps_a_prefix() {
    let cfg = FakeConfig::default();
    let w = started(cfg);
    let req = turn(vec![user("same question")], ThinkMode::High);
    let prompt_len = render(&req.conversation, ThinkMode::High).len() as u32;
    w.send(Command::Submit(req.clone()));
    let first = collect_until(&w, is_finished);
    // Retry: the prompt is not an extension of the cache (which holds the answer too), so the
    // session restores the checkpoint taken after the prompt: nothing is evaluated again and greedy
    // sampling writes the same answer.
    w.send(Command::Submit(req.clone()));
    let retry = collect_until(&w, is_finished);
    assert_eq!(prefill_evaluated(&retry), 0);
    assert_eq!(texts(&retry), texts(&first));
    // Rewind to 3 tokens: the next turn reuses exactly those.
    w.send(Command::Rewind { keep_tokens: 3 });
    w.send(Command::Submit(req));
    let after = collect_until(&w, is_finished);
    assert_eq!(reused(&after), 3);
    assert_eq!(prefill_evaluated(&after), prompt_len - 3);
    assert_eq!(texts(&after), texts(&first));
}

#[test]
fn only_a_different_context_keeps_the_engine() {
    use crate::engine::events::{BackendChoice, ModelSource, WeightsMode};
    let file = |p: &str| LoadRequest {
        source: ModelSource::File(p.into()),
        ..load_request()
    };
    let base = file("/m/a.gguf");
    assert!(same_engine(
        &base,
        &LoadRequest {
            ctx: 77,
            ..base.clone()
        }
    ));
    assert!(!same_engine(&base, &file("/m/b.gguf")));
    assert!(!same_engine(&base, &load_request()));
    assert!(same_engine(
        &load_request(),
        &LoadRequest {
            ctx: 9,
            ..load_request()
        }
    ));
    let demo_seed_2 = LoadRequest {
        source: ModelSource::Demo { seed: 2 },
        ..load_request()
    };
    assert!(!same_engine(&load_request(), &demo_seed_2));
    for other in [
        LoadRequest {
            backend: BackendChoice::Cpu,
            ..base.clone()
        },
        LoadRequest {
            weights: WeightsMode::Map,
            ..base.clone()
        },
        LoadRequest {
            threads: 3,
            ..base.clone()
        },
    ] {
        assert!(!same_engine(&base, &other), "{other:?}");
    }
}

mod speculative;
