//! The typed boundary between the engine worker thread and its clients (the TUI, `run`, tests).
//!
//! Shaped like ds4.h's narrow engine/session API: commands go in, events come out, and nothing else
//! crosses. Owns only the message types; the worker (`worker.rs`) gives them meaning. Must not
//! reference terminal or widget types.

use std::time::Duration;

use crate::model::chat::{Conversation, Message, ThinkMode};
use crate::sessions::store::TranscriptIds;

// Types the messages carry that lower layers define (src/lib.rs): the weight placement asked for,
// the residency report and the kind of a text delta. Re-exported so a client needs only this module.
pub use crate::backend::WeightsMode;
pub use crate::backend::residency::Residency;
pub use crate::model::detok::TextKind;

/// Sampling settings of one turn (defaults: docs/sampler.md#defaults).
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 (or below) means greedy argmax.
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: u32,
    pub min_p: f32,
    /// `None`: seeded from time and pid.
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.05,
            seed: None,
        }
    }
}

/// Which backend executes the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum BackendChoice {
    /// HIP when a usable GPU is found, else CPU (with the reason reported).
    #[default]
    Auto,
    Hip,
    Cpu,
}

/// Where the model comes from.
#[derive(Clone, Debug)]
pub enum ModelSource {
    File(std::path::PathBuf),
    /// A tiny model of the real architecture generated in memory (`--demo`), with this seed.
    Demo {
        seed: u64,
    },
}

#[derive(Clone, Debug)]
pub struct LoadRequest {
    pub source: ModelSource,
    pub ctx: u32,
    pub backend: BackendChoice,
    pub weights: WeightsMode,
    /// The GPU kernels' arithmetic (ignored by the CPU engine).
    pub arithmetic: crate::backend::arithmetic::Arithmetic,
    /// Threads for CPU work (0 = all cores).
    pub threads: usize,
}

/// One user turn to generate an answer for.
#[derive(Clone, Debug)]
pub struct TurnRequest {
    /// The whole conversation so far, ending with the new user message.
    pub conversation: Conversation,
    pub think: ThinkMode,
    pub sampling: SamplingParams,
    /// Most tokens to generate (context room also limits it).
    pub max_tokens: u32,
}

impl TurnRequest {
    /// A greedy request (temperature 0, the other sampling settings default) over `messages`.
    pub fn greedy(messages: Vec<Message>, think: ThinkMode, max_tokens: u32) -> TurnRequest {
        TurnRequest {
            conversation: Conversation {
                messages,
                ..Conversation::default()
            },
            think,
            sampling: SamplingParams {
                temperature: 0.0,
                ..Default::default()
            },
            max_tokens,
        }
    }
}

/// Commands into the worker.
#[derive(Clone, Debug)]
pub enum Command {
    Load(LoadRequest),
    Submit(TurnRequest),
    /// Stop the prefill or generation in flight; honoured between two tokens or prefill chunks.
    /// With no turn in flight it stops a running warm-up (a last `WarmupProgress` says how far it
    /// got; no `WarmupDone` follows).
    Cancel,
    /// Forget the session (next turn prefills from scratch).
    Reset,
    /// Keep only the first `keep_tokens` tokens of the live session (/retry and /edit send it before the
    /// conversation is resubmitted). The cache cannot drop rows, so the session rebuilds the shorter
    /// state from its longest checkpoint that is a prefix of it and evaluates the rest
    /// (`PromptCache::rewind`, docs/model.md#checkpoints).
    Rewind {
        keep_tokens: u32,
    },
    /// Change the sampling of the turn in flight from its next token (each `Submit` brings its
    /// own settings, which replace this).
    SetSampling(SamplingParams),
    /// Speculative decoding for the turns that follow (docs/speculative.md); `Off` by default.
    SetSpeculate(crate::engine::speculate::Speculate),
    /// How drafts are accepted when sampling (`speculate_sampling`).
    SetSpeculateSampling(crate::engine::speculate::accept::SamplingRule),
    /// The DSpark drafter's settings (support file, confidence, convention) for `speculate` dspark.
    SetDspark(crate::engine::speculate::dspark::DsparkSettings),
    /// Write the session's cache and the tokens it holds to a KV snapshot file
    /// (docs/sessions.md#kv-snapshots); answered by `SnapshotSaved`.
    SaveSnapshot {
        path: std::path::PathBuf,
    },
    /// Open a saved conversation (answered by `Resumed`).
    Resume(ResumeRequest),
    /// Keep prompt prefixes on disk for the sessions that follow (serve's prompt cache,
    /// `engine::prompt_store`; None, the default: no store). Notices report files it skipped.
    SetPromptStore(Option<crate::engine::prompt_store::PromptStoreSettings>),
    Shutdown,
}

/// A saved conversation to continue: the session starts over with the transcript's tokens, from
/// the snapshot when it holds exactly a prefix of them, else by evaluating them.
#[derive(Clone, Debug)]
pub struct ResumeRequest {
    /// The conversation (system message first when there is one).
    pub messages: Vec<Message>,
    /// The live transcript saved with it; `None`: the next turn renders the conversation anew.
    pub transcript: Option<TranscriptIds>,
    pub snapshot: Option<std::path::PathBuf>,
}

/// What a weight warm-up is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WarmupPhase {
    /// Faulting in the file mapping (CPU, or zero-copy GPU).
    PageIn,
    /// Streaming into device memory from the page cache (or memory).
    CopyToDevice,
    /// Streaming into device memory from the disk (the file mostly not in the page cache).
    CopyFromDisk,
}

/// Why a turn ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// End-of-sentence token sampled.
    Eos,
    /// `max_tokens` reached.
    Length,
    /// Context full.
    ContextFull,
    Cancelled,
}

/// Static facts about the loaded model and backend.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModelInfo {
    pub name: String,
    pub file_bytes: u64,
    pub n_layer: u32,
    pub n_vocab: u32,
    pub ctx: u32,
    /// The longest context the model states (0 when its file states none).
    pub context_length: u64,
    pub backend: String,
    pub device: String,
    /// The GPU kernels' arithmetic that ran; None on the CPU.
    pub arithmetic: Option<crate::backend::arithmetic::Arithmetic>,
    /// Why the engine fell back to CPU, if it did.
    pub fallback_reason: Option<String>,
    pub kv_bytes: u64,
    pub scratch_bytes: u64,
    pub weight_bytes_per_token: u64,
    /// True for the generated demo model: its answers are random text.
    pub is_demo: bool,
    /// The think mode actually used when the request asked for one the context cannot hold.
    pub think_max_available: bool,
    /// Where a GPU backend placed the weights (copy or map, bytes, time, why); None on the CPU.
    pub weights: Option<crate::backend::PlacementReport>,
    /// The OpenAI-compatible endpoint generating the answers (`--remote`); None for the in-process
    /// engine. Then the local figures (residency, warm-up, KV cache, device) do not apply.
    pub endpoint: Option<String>,
    /// The model file's identity (`sessions::ModelIdentity::to_text`); sessions and snapshots are
    /// bound to it.
    pub identity: String,
}

/// Device memory figures when the backend knows them.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DeviceMemory {
    pub used_bytes: u64,
    pub total_bytes: u64,
}

/// Live figures of the turn in flight (computed by `engine::metrics`), sent after the prefill, at most
/// every 250 ms while decoding, and once when the turn ends.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LiveStats {
    /// Decode tokens/s over the last few steps, and over the whole turn.
    pub decode_tps_now: Option<f64>,
    pub decode_tps_avg: Option<f64>,
    /// Prefill tokens/s over the tokens actually evaluated (the reused prefix excluded).
    pub prefill_tps: Option<f64>,
    /// Submit → first sampled token.
    pub prefill_latency: Option<Duration>,
    /// Submit → first visible answer (non-reasoning) text.
    pub first_answer_latency: Option<Duration>,
    /// Tokens generated so far in this turn.
    pub generated: u32,
    /// Tokens in the session / context size.
    pub context_used: u32,
    pub context_size: u32,
    /// From `DeviceSession::memory()`.
    pub kv_bytes: u64,
    pub scratch_bytes: u64,
    pub device_weight_bytes: u64,
    pub device_memory: Option<DeviceMemory>,
}

/// What an OpenAI-compatible server reported about a finished turn (its `usage` and `timings`
/// objects); each figure is `None` when the server did not send it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ServerReport {
    pub prompt_tokens: Option<u32>,
    /// Prompt tokens the server took from its prefix cache.
    pub cached_tokens: Option<u32>,
    pub completion_tokens: Option<u32>,
    pub prefill_ms: Option<f64>,
    pub prefill_tps: Option<f64>,
    pub decode_tps: Option<f64>,
}

/// Events out of the worker, in order.
#[derive(Clone, Debug)]
pub enum Event {
    LoadStarted {
        what: String,
    },
    Loaded(ModelInfo),
    /// At 5 Hz while the weights are faulted in (or copied to the device); GiB/s and ETA come from
    /// `engine::metrics::transfer_rate`. `elapsed` excludes the pauses while turns ran.
    WarmupProgress {
        phase: WarmupPhase,
        done_bytes: u64,
        total_bytes: u64,
        elapsed: Duration,
    },
    WarmupDone {
        total_bytes: u64,
        elapsed: Duration,
    },
    Residency(Residency),
    DeviceMemory(DeviceMemory),
    /// A turn was accepted; `think` is the mode actually used (max may drop to high,
    /// docs/prompt.md#think-modes). `reused_tokens` is the live cache prefix the prompt extends; when
    /// the session restores a turn checkpoint instead (retry, edit), `PrefillDone::tokens` (the tokens
    /// actually evaluated) is the authoritative figure.
    TurnStarted {
        prompt_tokens: u32,
        reused_tokens: u32,
        think: ThinkMode,
        note: Option<String>,
    },
    PrefillProgress {
        done: u32,
        total: u32,
        elapsed: Duration,
    },
    /// `tokens`: prompt tokens evaluated (the reused prefix excluded).
    PrefillDone {
        tokens: u32,
        elapsed: Duration,
    },
    /// Text of one or more sampled tokens, always whole UTF-8.
    Text {
        kind: TextKind,
        text: String,
    },
    /// One decoded token's timing: `elapsed` is the duration of this step (sample + evaluate).
    TokenTiming {
        step: u32,
        elapsed: Duration,
    },
    /// Live metrics snapshot of the turn in flight.
    Stats(LiveStats),
    /// The server's own figures of the turn (remote worker only), before its `TurnFinished`.
    Server(ServerReport),
    /// Speculative decoding's figures of the turn (docs/speculative.md), before its
    /// `TurnFinished`; only for a turn that decoded with a drafter.
    Speculation(crate::engine::generate::SpeculationFigures),
    TurnFinished {
        reason: FinishReason,
        generated: u32,
        context_used: u32,
    },
    /// Something the user should know that is not an error (e.g. "weights exceed RAM: decoding
    /// will read from disk").
    Notice {
        message: String,
    },
    /// A failure, as a value. `fatal` means the model is unusable (load failed, worker died).
    Error {
        message: String,
        fatal: bool,
    },
    /// A `SaveSnapshot` finished: the file's size or why it failed (the old file is kept), with
    /// the tokens it holds and the live transcript the session file stores.
    SnapshotSaved {
        path: std::path::PathBuf,
        result: Result<u64, String>,
        tokens: u32,
        transcript: Option<TranscriptIds>,
    },
    /// A `Resume` finished: the cache holds `tokens` tokens, restored from the snapshot or
    /// evaluated again (`note` then says why), after `elapsed`.
    Resumed {
        tokens: u32,
        from_snapshot: bool,
        elapsed: Duration,
        note: Option<String>,
    },
    ShutdownComplete,
}
