//! The server's shared state and its accept loop: the engine worker (one loaded model), the
//! generation queue, the API key and the per-request defaults; one thread per connection, at most
//! [`MAX_CONNECTIONS`] at once.
//!
//! Owns start-up (load, then listen) and the state every request reads. Routing is routes.rs.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::engine::events::{Command, Event, LoadRequest, SamplingParams, TurnRequest};
use crate::engine::loader::EngineLoader;
use crate::engine::worker::Worker;
use crate::model::chat::{Conversation, Message, ThinkMode};

use super::auth::ApiKey;
use super::error::ApiError;
use super::http;
use super::queue::GenerationQueue;
use super::replies::Replies;
use super::tools::Tools;
use super::turn::TurnOutcome;

/// Most connections served at once; more get a 503 at once.
pub const MAX_CONNECTIONS: usize = 64;

/// What a request gets for the fields it leaves out.
#[derive(Clone, Debug)]
pub struct TurnDefaults {
    pub sampling: SamplingParams,
    pub think: ThinkMode,
    pub max_tokens: u32,
}

/// Everything `serve` needs to start.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    pub addr: SocketAddr,
    pub load: LoadRequest,
    /// The model's id in the API (`model` field, `/v1/models`).
    pub model_id: String,
    pub key: ApiKey,
    /// Requests that may wait behind the running generation.
    pub queue: usize,
    pub max_body: usize,
    pub defaults: TurnDefaults,
    /// Speculative decoding of every turn (docs/speculative.md).
    pub speculate: crate::engine::speculate::Speculate,
    pub speculate_sampling: crate::engine::speculate::accept::SamplingRule,
    /// The prompt cache on disk (docs/serve.md#prompt-cache); None: off.
    pub prompt_cache: Option<crate::engine::prompt_store::PromptStoreSettings>,
    /// The DSpark drafter's settings, for `speculate` dspark.
    pub dspark: crate::engine::speculate::dspark::DsparkSettings,
}

/// How the last turn ended, for `/health`.
#[derive(Clone, Debug, PartialEq)]
pub struct LastTurn {
    pub finish_reason: &'static str,
    pub completion_tokens: u32,
    pub cached_tokens: u32,
}

impl LastTurn {
    fn of(outcome: &TurnOutcome) -> LastTurn {
        LastTurn {
            finish_reason: if outcome.client_gone {
                "cancelled"
            } else if outcome.finish == crate::engine::events::FinishReason::Cancelled {
                "error"
            } else {
                super::responses::finish_reason(outcome.finish)
            },
            completion_tokens: outcome.usage.completion_tokens,
            cached_tokens: outcome.usage.cached_tokens,
        }
    }
}

pub struct Server {
    pub model_id: String,
    pub ctx: u32,
    pub created: u64,
    pub key: ApiKey,
    pub max_body: usize,
    pub defaults: TurnDefaults,
    pub queue: GenerationQueue,
    worker: Mutex<Worker>,
    replies: Mutex<Replies>,
    last_turn: Mutex<Option<LastTurn>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Server {
    /// The engine worker; only the holder of the generation slot uses it.
    pub fn worker(&self) -> MutexGuard<'_, Worker> {
        lock(&self.worker)
    }

    pub fn replies(&self) -> MutexGuard<'_, Replies> {
        lock(&self.replies)
    }

    pub fn last_turn(&self) -> Option<LastTurn> {
        lock(&self.last_turn).clone()
    }

    /// The engine turn of a checked request: its `messages` with the reasoning of this server's
    /// earlier replies put back (replies.rs), its `tools` in the prompt, its think mode or the
    /// server's.
    pub fn turn_request(
        &self,
        messages: &mut [Message],
        tools: &Tools,
        think: Option<ThinkMode>,
        sampling: SamplingParams,
        max_tokens: u32,
    ) -> TurnRequest {
        self.replies().restore_reasoning(messages);
        let mut conversation = Conversation {
            messages: messages.to_vec(),
            ..Conversation::default()
        };
        tools.apply(&mut conversation);
        TurnRequest {
            conversation,
            think: think.unwrap_or(self.defaults.think),
            sampling,
            max_tokens,
        }
    }

    /// Note a finished turn: for `/health`, and its reasoning for the next request (replies.rs).
    pub fn record(&self, outcome: &TurnOutcome, reply: &super::calls::ReplyShaper, thinking: bool) {
        *lock(&self.last_turn) = Some(LastTurn::of(outcome));
        if thinking && !outcome.client_gone {
            self.replies().remember(&reply.content, &reply.calls, &reply.reasoning);
        }
        for w in &reply.warnings {
            eprintln!("ds4-chat serve: warning: {w}");
        }
    }
}

/// Load the model (reporting progress on stderr), then bind the returned listener's address.
fn load(worker: &Worker, load: LoadRequest) -> Result<u32, String> {
    worker.send(Command::Load(load));
    loop {
        match worker.recv_timeout(Duration::from_secs(3600)) {
            Some(Event::Loaded(info)) => {
                if let Some(why) = &info.fallback_reason {
                    eprintln!("ds4-chat serve: using the CPU backend: {why}");
                }
                eprintln!(
                    "ds4-chat serve: loaded {} ({} backend, context {})",
                    info.name, info.backend, info.ctx
                );
                return Ok(info.ctx);
            }
            Some(Event::Error { message, fatal: true }) => return Err(message),
            Some(Event::Notice { message }) => eprintln!("ds4-chat serve: {message}"),
            Some(_) => {}
            None => return Err("the model did not load".into()),
        }
    }
}

/// Bind, load, and serve until the process ends.
pub fn run(opts: ServeOptions) -> Result<(), String> {
    super::auth::check_bind(&opts.addr, &opts.key)?;
    let listener = TcpListener::bind(opts.addr).map_err(|e| format!("cannot listen on {}: {e}", opts.addr))?;
    let bound = listener.local_addr().map_err(|e| e.to_string())?;
    let worker = Worker::spawn(crate::engine::scripted::with_test_script(
        Box::new(EngineLoader::new()),
    )?);
    worker.send(Command::SetSpeculate(opts.speculate));
    worker.send(Command::SetSpeculateSampling(opts.speculate_sampling));
    worker.send(Command::SetPromptStore(opts.prompt_cache));
    worker.send(Command::SetDspark(opts.dspark.clone()));
    let ctx = load(&worker, opts.load)?;
    let server = Arc::new(Server {
        model_id: opts.model_id,
        ctx,
        created: super::responses::unix_now(),
        key: opts.key,
        max_body: opts.max_body,
        defaults: opts.defaults,
        queue: GenerationQueue::new(opts.queue),
        worker: Mutex::new(worker),
        replies: Mutex::default(),
        last_turn: Mutex::default(),
    });
    eprintln!(
        "ds4-chat serve: model \"{}\" listening on http://{bound}",
        server.model_id
    );
    start_idle_drain(server.clone());
    let open = Arc::new(AtomicUsize::new(0));
    for conn in listener.incoming() {
        let Ok(mut stream) = conn else { continue };
        if open.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
            open.fetch_sub(1, Ordering::AcqRel);
            refuse_busy(&mut stream);
            continue;
        }
        let server = server.clone();
        let open_conn = open.clone();
        let spawned = std::thread::Builder::new()
            .name("ds4-serve-conn".into())
            .spawn(move || {
                super::routes::handle(&server, stream);
                open_conn.fetch_sub(1, Ordering::AcqRel);
            });
        if spawned.is_err() {
            open.fetch_sub(1, Ordering::AcqRel);
        }
    }
    Ok(())
}

/// How often the worker's events are read while no turn runs.
const IDLE_DRAIN_PERIOD: Duration = Duration::from_secs(2);

/// Between turns nobody reads the worker's events, but the residency sampler and a warm-up keep
/// sending them: read them every few seconds so they do not pile up, and log the ones meant for
/// people. A turn holds the worker's lock for its whole run, so this never takes a turn's events.
fn start_idle_drain(server: Arc<Server>) {
    let _ = std::thread::Builder::new()
        .name("ds4-serve-drain".into())
        .spawn(move || {
            loop {
                std::thread::sleep(IDLE_DRAIN_PERIOD);
                let Ok(worker) = server.worker.try_lock() else { continue };
                while let Some(event) = worker.try_recv() {
                    match event {
                        Event::Notice { message } => eprintln!("ds4-chat serve: {message}"),
                        Event::Error { message, .. } => eprintln!("ds4-chat serve: error: {message}"),
                        Event::WarmupDone { total_bytes, elapsed } => eprintln!(
                            "ds4-chat serve: weights warm ({} in {:.1} s)",
                            crate::units::fmt_bytes(total_bytes),
                            elapsed.as_secs_f64()
                        ),
                        _ => {}
                    }
                }
            }
        });
}

fn refuse_busy(stream: &mut TcpStream) {
    let e = ApiError::status(503, format!("too many connections (at most {MAX_CONNECTIONS})"));
    let _ = http::write_error(stream, &e);
    http::finish(stream);
}
