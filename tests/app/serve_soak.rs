//! `serve` under load and faults: concurrent clients send a deterministic mix of plain and streamed
//! completions (some sharing a system prompt, so the prompt cache on disk is written, restored and
//! evicted under a small budget), clients that hang up mid-stream, slow readers, oversized,
//! malformed and ill-typed bodies, unknown routes, heads cut off, and tool requests. The server
//! must stay up, answer every request it read with a 2xx or a 4xx (429 when the queue is full)
//! whose body is a JSON error, keep its memory bounded (the peak resident set of the second half of
//! the run no higher than the first half's plus a margin) and hold as many descriptors after as
//! before.
//!
//! A client refused with 429 backs off as the `openai` client does before its next request. CI runs
//! 200 requests from 8 clients; `DS4_SOAK=full` runs 2,000 from 32 (tests/README.md).

use std::io::{Read, Write};
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::serve_process::{DataDir, Server, connect, get, open_fds, parse_reply, post, post_head, rss_kib, start};
use crate::support;

const CTX: &str = "2048";
const MAX_BODY: usize = 65536;
/// How long any one request may take before the client gives up (the queue holds at most 16
/// requests of a few tenths of a second each).
const CLIENT_TIMEOUT: Duration = Duration::from_secs(120);
/// Growth of the peak resident set from the first half of the run to the second that still counts
/// as bounded (a leak of a few KiB per request would show as tens of MiB over the full run).
const RSS_MARGIN_KIB: u64 = 64 * 1024;

/// The kinds of request, in the order `kind_of` deals them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Kind {
    Plain,
    Streamed,
    SharedSystem,
    HangUpMidStream,
    SlowReader,
    Oversized,
    MalformedJson,
    BadField,
    /// A request with `tools`: refused (400) while the server has no tool calls, a completion once it
    /// has; either is a valid answer here.
    Tools,
    UnknownRoute,
    HeadCutOff,
}

/// Twenty slots per cycle: mostly completions, one of each fault.
fn kind_of(i: usize) -> Kind {
    match i % 20 {
        0..=5 => Kind::Plain,
        6..=9 => Kind::Streamed,
        10 | 11 => Kind::SharedSystem,
        12 => Kind::HangUpMidStream,
        13 => Kind::SlowReader,
        14 => Kind::Oversized,
        15 => Kind::MalformedJson,
        16 => Kind::BadField,
        17 => Kind::Tools,
        18 => Kind::UnknownRoute,
        _ => Kind::HeadCutOff,
    }
}

/// About 120 tokens shared by a third of the completions, in three variants.
fn shared_system(i: usize) -> String {
    let variant = i / 20 % 3;
    (0..24)
        .map(|r| format!("policy {variant}.{r}: answer briefly."))
        .collect::<Vec<_>>()
        .join(" ")
}

fn chat_body(i: usize, stream: bool, system: Option<String>, max_tokens: usize) -> String {
    let mut messages = Vec::new();
    if let Some(s) = system {
        messages.push(json!({"role": "system", "content": s}));
    }
    messages.push(json!({"role": "user", "content": format!("Request {i}: say a word.")}));
    json!({
        "model": "serve-tiny", "stream": stream, "stream_options": {"include_usage": true},
        "reasoning_effort": "none", "seed": i, "max_tokens": max_tokens, "messages": messages,
    })
    .to_string()
}

/// How long a client waits after its `n`th 429 in a row before its next request, as the `openai`
/// client does: 0.25 s doubling up to 4 s, with a jitter of up to a quarter from the request number.
fn backoff(n: u32, i: usize) -> Duration {
    let base = 250u64 << (n - 1).min(4);
    Duration::from_millis(base + base * (i as u64 * 7919 % 100) / 400)
}

/// What one request came to.
#[derive(Debug)]
enum Outcome {
    /// A status, whether the body had the shape it must have, and the cached prompt tokens it
    /// reported (0 when none).
    Answered {
        status: u16,
        well_formed: Result<(), String>,
        cached: u64,
    },
    /// The client hung up on purpose (mid-stream, or with half a head).
    HungUp,
    /// No answer (connection refused, reset, timeout): a failure.
    Failed(String),
}

/// A 2xx body's shape, or a 4xx/5xx JSON error's.
fn check_body(status: u16, body: &str, streamed: bool) -> Result<(), String> {
    if status == 200 && streamed {
        return if body.trim_end().ends_with("data: [DONE]") {
            Ok(())
        } else {
            Err("a stream without data: [DONE]".into())
        };
    }
    let v: Value = serde_json::from_str(body).map_err(|e| format!("not JSON ({e}): {body:.200}"))?;
    let ok = if status == 200 {
        v["choices"][0]["message"].is_object() && v["usage"]["prompt_tokens"].is_u64()
    } else {
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty() && !m.contains('\n'))
    };
    if ok {
        Ok(())
    } else {
        Err(format!("{status} with {body:.200}"))
    }
}

/// The last `"cached_tokens":N` of a reply (a whole JSON body or a stream's usage chunk).
fn cached_tokens(body: &str) -> u64 {
    let key = "\"cached_tokens\":";
    body.rfind(key)
        .map(|i| {
            body[i + key.len()..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
        })
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

fn answered(reply: Result<super::serve_process::Reply, String>, streamed: bool) -> Outcome {
    match reply {
        Ok(r) => Outcome::Answered {
            status: r.status,
            well_formed: check_body(r.status, &r.body, streamed),
            cached: cached_tokens(&r.body),
        },
        Err(e) => Outcome::Failed(e),
    }
}

/// Sends `head` + `body` and reads `chunk` bytes at a time, sleeping `pause` between reads; with
/// `hang_up`, stops at the first SSE event and closes.
fn exchange(addr: &str, wire: &[u8], chunk: usize, pause: Duration, hang_up: bool) -> Result<Option<Vec<u8>>, String> {
    let mut s = connect(addr, CLIENT_TIMEOUT).map_err(|e| format!("connect: {e}"))?;
    s.write_all(wire).map_err(|e| format!("send: {e}"))?;
    let mut raw = Vec::new();
    let mut buf = vec![0u8; chunk];
    loop {
        let n = s
            .read(&mut buf)
            .map_err(|e| format!("read after {} bytes: {e}", raw.len()))?;
        if n == 0 {
            return Ok(Some(raw));
        }
        raw.extend_from_slice(&buf[..n]);
        if hang_up && raw.windows(6).any(|w| w == b"data: ") {
            return Ok(None);
        }
        if !pause.is_zero() {
            std::thread::sleep(pause);
        }
    }
}

fn run_one(addr: &str, i: usize) -> Outcome {
    let path = "/v1/chat/completions";
    let wire = |body: &str| format!("{}{body}", post_head(addr, path, body.len())).into_bytes();
    let small = 1 + i % 8;
    match kind_of(i) {
        Kind::Plain => answered(
            post(addr, path, &chat_body(i, false, None, small), CLIENT_TIMEOUT),
            false,
        ),
        Kind::Streamed => answered(post(addr, path, &chat_body(i, true, None, small), CLIENT_TIMEOUT), true),
        Kind::SharedSystem => {
            let streamed = i.is_multiple_of(2);
            let body = chat_body(i, streamed, Some(shared_system(i)), small);
            answered(post(addr, path, &body, CLIENT_TIMEOUT), streamed)
        }
        Kind::HangUpMidStream => {
            match exchange(addr, &wire(&chat_body(i, true, None, 64)), 256, Duration::ZERO, true) {
                Ok(None) => Outcome::HungUp,
                // Refused before streaming (429): a whole answer.
                Ok(Some(raw)) => answered(parse_reply(&raw), true),
                Err(e) => Outcome::Failed(e),
            }
        }
        Kind::SlowReader => {
            let got = exchange(
                addr,
                &wire(&chat_body(i, true, None, 16)),
                32,
                Duration::from_millis(5),
                false,
            );
            match got {
                Ok(Some(raw)) => answered(parse_reply(&raw), true),
                Ok(None) => unreachable!("no hang-up asked"),
                Err(e) => Outcome::Failed(e),
            }
        }
        Kind::Oversized => {
            // The head announces more than the limit; the server answers 413 without reading it.
            let mut bytes = post_head(addr, path, MAX_BODY + 1).into_bytes();
            bytes.extend_from_slice(&[b' '; 1024]);
            match exchange(addr, &bytes, 4096, Duration::ZERO, false) {
                Ok(Some(raw)) => answered(parse_reply(&raw), false),
                Ok(None) => unreachable!("no hang-up asked"),
                Err(e) => Outcome::Failed(e),
            }
        }
        Kind::MalformedJson => answered(
            post(
                addr,
                path,
                "{\"model\": \"serve-tiny\", \"messages\": [",
                CLIENT_TIMEOUT,
            ),
            false,
        ),
        Kind::BadField => {
            let body =
                json!({"model": "serve-tiny", "temperature": "hot", "messages": [{"role": "user", "content": "hi"}]});
            answered(post(addr, path, &body.to_string(), CLIENT_TIMEOUT), false)
        }
        Kind::Tools => {
            let body = json!({
                "model": "serve-tiny", "max_tokens": small, "reasoning_effort": "none",
                "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
                "tools": [{"type": "function", "function": {
                    "name": "get_weather", "description": "The weather in a city.",
                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
                }}],
            });
            answered(post(addr, path, &body.to_string(), CLIENT_TIMEOUT), false)
        }
        Kind::UnknownRoute => answered(get(addr, "/v1/no-such-route", CLIENT_TIMEOUT), false),
        Kind::HeadCutOff => match connect(addr, CLIENT_TIMEOUT) {
            Ok(mut s) => {
                let _ = s.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nContent-Le");
                let _ = s.shutdown(Shutdown::Both);
                Outcome::HungUp
            }
            Err(e) => Outcome::Failed(format!("connect: {e}")),
        },
    }
}

/// Waits until `/health` says nothing generates or waits, and the connections have closed.
fn wait_idle(server: &Server) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let health = get(server.addr(), "/health", Duration::from_secs(10)).map(|r| r.json());
        if let Ok(h) = &health
            && h["generating"] == json!(false)
            && h["queued"] == json!(0)
        {
            // Connection threads drain for up to a second after their answer (http::finish).
            std::thread::sleep(Duration::from_millis(1500));
            return health.unwrap();
        }
        assert!(Instant::now() < deadline, "the server did not become idle: {health:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn serve_stays_up_and_bounded_under_load_and_faults() {
    let full = std::env::var("DS4_SOAK").is_ok_and(|v| v == "full");
    let (requests, clients) = if full { (2000, 32) } else { (200, 8) };
    let model = support::serve_tiny_model();
    let data = DataDir::new("serve-soak");
    let data_env = data.env();
    // A prompt cache of 2 MiB: a few of the shared prefixes' files, so eviction runs all along.
    let max_body = MAX_BODY.to_string();
    // Half as many may wait as there are clients, so the queue fills and refuses (429) now and then.
    let queue = (clients / 2).to_string();
    let flags = [
        "--model-name",
        "serve-tiny",
        "--queue",
        &queue,
        "--max-body-bytes",
        &max_body,
        "--prompt-cache-gib",
        "0.002",
    ];
    let mut server = start(&model, CTX, &flags, &[("DS4_DATA_DIR", data_env.as_str())]).expect("serve starts");
    let pid = server.pid();
    // One completion first, so the weights and the first allocations are in before the baseline.
    let warm = post(
        server.addr(),
        "/v1/chat/completions",
        &chat_body(0, false, None, 4),
        CLIENT_TIMEOUT,
    )
    .unwrap();
    assert_eq!(warm.status, 200, "{}", warm.body);
    wait_idle(&server);
    let fds_before = open_fds(pid);
    let (_, rss_before) = rss_kib(pid);

    // The resident set, sampled every 50 ms: the peak of each half of the run.
    let done = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let halves = Arc::new(Mutex::new([0u64; 2]));
    let sampler = {
        let (done, stop, halves) = (done.clone(), stop.clone(), halves.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Acquire) {
                let (_, rss) = rss_kib(pid);
                let half = usize::from(done.load(Ordering::Acquire) >= requests / 2);
                let mut h = halves.lock().unwrap();
                h[half] = h[half].max(rss);
                drop(h);
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    let started = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let outcomes = Arc::new(Mutex::new(Vec::with_capacity(requests)));
    let workers: Vec<_> = (0..clients)
        .map(|_| {
            let (next, done, outcomes) = (next.clone(), done.clone(), outcomes.clone());
            let addr = server.addr().to_string();
            std::thread::spawn(move || {
                let mut refused_in_a_row = 0;
                loop {
                    let i = next.fetch_add(1, Ordering::AcqRel);
                    if i >= requests {
                        break;
                    }
                    let outcome = run_one(&addr, i + 1);
                    let refused = matches!(outcome, Outcome::Answered { status: 429, .. });
                    outcomes.lock().unwrap().push((kind_of(i + 1), outcome));
                    done.fetch_add(1, Ordering::AcqRel);
                    refused_in_a_row = if refused { refused_in_a_row + 1 } else { 0 };
                    if refused {
                        std::thread::sleep(backoff(refused_in_a_row, i));
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("a client thread panicked");
    }
    let wall = started.elapsed();
    let health = wait_idle(&server);
    stop.store(true, Ordering::Release);
    sampler.join().unwrap();
    let fds_after = open_fds(pid);
    let (peak, rss_after) = rss_kib(pid);
    let [first_half, second_half] = *halves.lock().unwrap();
    let alive = matches!(server.child.try_wait(), Ok(None));
    let cache_files = std::fs::read_dir(data.0.join("prompt-cache")).map_or(0, |d| d.count());
    drop(server);

    let outcomes = std::mem::take(&mut *outcomes.lock().unwrap());
    let mut by_status = std::collections::BTreeMap::new();
    let mut by_kind = std::collections::BTreeMap::new();
    let mut problems = Vec::new();
    let mut hung_up = 0;
    let mut shared_cached = 0;
    for (kind, o) in &outcomes {
        match o {
            Outcome::Answered {
                status,
                well_formed,
                cached,
            } => {
                if *kind == Kind::SharedSystem {
                    shared_cached += cached;
                }
                *by_status.entry(*status).or_insert(0usize) += 1;
                *by_kind.entry((*kind, *status)).or_insert(0usize) += 1;
                if let Err(e) = well_formed {
                    problems.push(format!("{kind:?}: {e}"));
                }
                let expected: &[u16] = match kind {
                    Kind::Plain | Kind::Streamed | Kind::SharedSystem | Kind::HangUpMidStream | Kind::SlowReader => {
                        &[200, 429]
                    }
                    Kind::Tools => &[200, 400, 429],
                    Kind::Oversized => &[413],
                    Kind::MalformedJson | Kind::BadField => &[400],
                    Kind::UnknownRoute => &[404],
                    Kind::HeadCutOff => &[],
                };
                if !expected.contains(status) {
                    problems.push(format!("{kind:?}: status {status}, expected one of {expected:?}"));
                }
            }
            Outcome::HungUp => hung_up += 1,
            Outcome::Failed(e) => problems.push(format!("{kind:?}: no answer: {e}")),
        }
    }
    println!(
        "soak: {requests} requests from {clients} clients in {:.1} s; answers by status {by_status:?}, {hung_up} hung up on purpose; \
         peak RSS {} MiB (resident {} MiB before, {} MiB after; peak of the first half {} MiB, second half {} MiB); \
         descriptors {fds_before} before, {fds_after} after; {cache_files} prompt-cache files at the end, \
         {shared_cached} prompt tokens cached for the shared-system requests; last turn {}",
        wall.as_secs_f64(),
        peak / 1024,
        rss_before / 1024,
        rss_after / 1024,
        first_half / 1024,
        second_half / 1024,
        health["last_turn"],
    );
    println!("soak: by kind and status {by_kind:?}");
    assert!(alive, "the server exited");
    assert_eq!(outcomes.len(), requests);
    assert!(
        problems.is_empty(),
        "{} problems:\n{}",
        problems.len(),
        problems.join("\n")
    );
    // Real work was done: most completions ran (not all refused) and every fault kind came up.
    assert!(
        by_status.get(&200).copied().unwrap_or(0) >= requests / 4,
        "{by_status:?}"
    );
    for s in [400, 404, 413] {
        assert!(by_status.contains_key(&s), "no {s} among {by_status:?}");
    }
    // The prompt cache worked under load: shared system prompts were restored from it.
    assert!(
        shared_cached > 0,
        "no request with a shared system prompt reported cached tokens"
    );
    assert!(
        fds_after <= fds_before,
        "descriptors leak: {fds_before} before, {fds_after} after"
    );
    assert!(
        second_half <= first_half + RSS_MARGIN_KIB,
        "memory grows: peak {first_half} KiB in the first half, {second_half} KiB in the second"
    );
}
