//! The application's model loader: opens a GGUF file (or generates the in-memory demo model), creates
//! the engine with its first session and the chat text, checks memory before the cache is ever
//! written (memguard.rs), and hands the worker the mapping to warm up and probe. Later sessions on
//! the same engine (`/ctx`) pass the same context and memory checks (`open_session`).
//!
//! Owns the order of a load. The backend choice and its CPU fallback are `backend_open`'s. Must not
//! run turns (worker.rs) or compute kernels.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::{DeviceModel, DeviceSession, MemoryReport};
use crate::model::Model;
use crate::model::accounting::{table_from_model, weight_bytes_per_token};

use super::backend_open::{PlacementRequest, open_device_model_with_progress};
use super::events::{Event, LoadRequest, ModelInfo, ModelSource, WarmupPhase, WeightsMode};
use super::settings::check_session_ctx;
use super::worker::{ChatText, LoadedModel, ModelLoader, PROMPT_CACHE_CHECKPOINTS};
use crate::backend::memguard::{MemoryNeed, MemoryVerdict, WeightResidence, check_memory, read_host_memory};
use crate::backend::residency::{MappedRegion, ResidencyProbe, mostly_cached};

/// Least time between two weight-copy progress events (5 Hz, as the page-in warm-up).
const UPLOAD_TICK: Duration = Duration::from_millis(200);

/// Builds the chat text (tokenizer, renderer, streaming detokenizer) of a bound model.
pub type ChatTextFactory = fn(&Model, u32) -> Result<Box<dyn ChatText>, String>;

/// Loads real files and the demo model on the CPU backend.
pub struct EngineLoader {
    pub chat_text: ChatTextFactory,
}

impl EngineLoader {
    pub fn new() -> EngineLoader {
        EngineLoader {
            chat_text: super::chat_text::for_model,
        }
    }
}

impl Default for EngineLoader {
    fn default() -> Self {
        Self::new()
    }
}

/// The memory a load of `model` on the CPU backend holds, from the backend's own report (weights
/// mapped from the file). Checked after the backend is created and before anything touches the
/// cache: its buffers are zero pages until written, so creating it commits almost no RAM.
pub fn cpu_memory_need(model: &Model, mem: &MemoryReport) -> MemoryNeed {
    MemoryNeed {
        // An in-memory (demo) model is already allocated: only the cache is new.
        weight_bytes: if model.file.is_mapped() {
            model.file.file_size()
        } else {
            0
        },
        residence: WeightResidence::MappedFile,
        kv_bytes: mem.kv_bytes,
        scratch_bytes: mem.scratch_bytes,
        kv_on_device: false,
        checkpoint_bytes: PROMPT_CACHE_CHECKPOINTS as u64 * mem.kv_bytes,
    }
}

/// The host memory guard for a CPU session (GPU engines check device memory themselves when they
/// place weights and open sessions: memguard's `check_memory` with `GpuMemory`); the CPU cache lives
/// in host RAM. A warning becomes a notice, a refusal the error.
fn guard_host_memory(
    model: &Model,
    backend: &dyn DeviceSession,
    ctx: usize,
    notice: &mut dyn FnMut(Event),
) -> Result<(), String> {
    if backend.name() != "cpu" {
        return Ok(());
    }
    let need = cpu_memory_need(model, &backend.memory());
    match read_host_memory() {
        Ok(host) => match check_memory(&need, &host, None, &model.hp, ctx as u64) {
            MemoryVerdict::Fits => {}
            MemoryVerdict::Warn(message) => notice(Event::Notice { message }),
            MemoryVerdict::Refuse(message) => return Err(message),
        },
        Err(e) => notice(Event::Notice {
            message: format!("memory check skipped: {e}"),
        }),
    }
    Ok(())
}

/// The host memory a DSpark drafter on a session of backend `backend_name` (with the memory report
/// `mem`) makes the load hold (docs/memory.md#dspark). Its weights are mapped like the model's, and
/// its captured rows and context-KV rows are host scratch (`model::dspark::session_bytes`): on the
/// CPU they join the session's own need; on a GPU session, whose weights and cache the device guard
/// already checked, the drafter's host part is checked alone (the device's capture buffer is counted
/// in the session's report and was allocated, or refused by name, when the drafter was attached).
pub fn dspark_memory_need(
    model: &Model,
    support: &crate::model::dspark::DsparkModel,
    backend_name: &str,
    mem: &MemoryReport,
) -> MemoryNeed {
    let mut need = if backend_name == "cpu" {
        cpu_memory_need(model, mem)
    } else {
        MemoryNeed {
            weight_bytes: 0,
            residence: WeightResidence::MappedFile,
            kv_bytes: 0,
            scratch_bytes: 0,
            kv_on_device: false,
            checkpoint_bytes: 0,
        }
    };
    if support.file.is_mapped() {
        need.weight_bytes += support.file.file_size();
    }
    need.scratch_bytes += crate::model::dspark::session_bytes(
        &model.hp,
        &support.meta,
        support.stages.len(),
        crate::backend::cpu::dspark::CAPTURE_ROWS,
        crate::model::dspark::REFERENCE_WINDOW,
    );
    need
}

/// The host memory guard with a DSpark drafter attached to `backend` (`dspark_memory_need`).
/// `Ok(Some(line))` is a warning to show.
pub fn guard_dspark_memory(
    model: &Model,
    support: &crate::model::dspark::DsparkModel,
    backend: &dyn DeviceSession,
    ctx: usize,
) -> Result<Option<String>, String> {
    let need = dspark_memory_need(model, support, backend.name(), &backend.memory());
    match read_host_memory() {
        Ok(host) => match check_memory(&need, &host, None, &model.hp, ctx as u64) {
            MemoryVerdict::Fits => Ok(None),
            MemoryVerdict::Warn(m) => Ok(Some(m)),
            MemoryVerdict::Refuse(m) => Err(m),
        },
        Err(e) => Ok(Some(format!("memory check skipped: {e}"))),
    }
}

/// A session of `ctx` tokens on the engine of a loaded model, checked as a load checks its first
/// one: the context range, then the memory its cache needs. Reads nothing from the model file and
/// moves no weights.
pub fn open_session(
    engine: &dyn DeviceModel,
    ctx: usize,
    notice: &mut dyn FnMut(Event),
) -> Result<Box<dyn DeviceSession>, String> {
    check_session_ctx(ctx, &engine.model().hp)?;
    let backend = engine.open_session(ctx).map_err(|e| e.to_string())?;
    guard_host_memory(engine.model(), backend.as_ref(), ctx, notice)?;
    Ok(backend)
}

impl ModelLoader for EngineLoader {
    fn load(&mut self, req: &LoadRequest, notice: &mut dyn FnMut(Event)) -> Result<LoadedModel, String> {
        let (model, is_demo) = match &req.source {
            ModelSource::File(path) => (Model::open(path).map_err(|e| e.to_string())?, false),
            ModelSource::Demo { seed } => {
                let file = crate::genmodel::tiny_model(*seed, crate::genmodel::ExpertMix::Q2)
                    .map_err(|e| format!("demo model: {e}"))?;
                (Model::bind(file).map_err(|e| format!("demo model: {e}"))?, true)
            }
        };
        let ctx = req.ctx as u64;
        let text = (self.chat_text)(&model, ctx as u32)?;
        let per_token = weight_bytes_per_token(&model.hp, &table_from_model(&model)).total();
        let model = Arc::new(model);
        // A GPU weight copy streams through the warm-up events (phase CopyFromDisk when the file
        // is mostly not in the page cache, else CopyToDevice), at most every UPLOAD_TICK and once
        // at the end.
        let copy_phase = match (&model.file.path, model.file.is_mapped()) {
            (Some(path), true) if !std::fs::File::open(path).is_ok_and(|f| mostly_cached(&f)) => {
                WarmupPhase::CopyFromDisk
            }
            _ => WarmupPhase::CopyToDevice,
        };
        let upload_start = Instant::now();
        let mut last_report: Option<Instant> = None;
        let mut upload = |done: u64, total: u64| {
            if done < total && last_report.is_some_and(|t| t.elapsed() < UPLOAD_TICK) {
                return;
            }
            last_report = Some(Instant::now());
            notice(Event::WarmupProgress {
                phase: copy_phase,
                done_bytes: done,
                total_bytes: total,
                elapsed: upload_start.elapsed(),
            });
        };
        let at = PlacementRequest {
            threads: req.threads,
            backend: req.backend,
            weights: req.weights,
            arithmetic: req.arithmetic,
        };
        let opened = open_device_model_with_progress(model.clone(), &at, ctx as usize, &mut upload)?;
        let backend = opened.session;
        let placement = backend.weights_placement();
        if let Some(p) = &placement {
            if p.copied {
                notice(Event::WarmupDone {
                    total_bytes: p.bytes,
                    elapsed: Duration::from_secs_f64(p.seconds),
                });
            }
            // Say so when the placement is not the plain answer to the request.
            // (A copy that could not use O_DIRECT says so too.)
            let plain = (p.reason.is_empty() || (p.copied && req.weights == WeightsMode::Auto))
                && !p.reason.contains("O_DIRECT refused");
            if !plain {
                notice(Event::Notice {
                    message: format!("weights: {}", p.summary()),
                });
            }
        }
        // Copied weights never read the mapping again: no page-in warm-up.
        let copied = placement.as_ref().is_some_and(|p| p.copied);
        guard_host_memory(&model, backend.as_ref(), ctx as usize, notice)?;
        let mapped = model.file.is_mapped();
        let info = ModelInfo {
            name: crate::model::checkpoint::describe_file(&model.file),
            file_bytes: model.file.file_size(),
            n_layer: model.hp.n_layer as u32,
            n_vocab: model.hp.n_vocab as u32,
            ctx: ctx as u32,
            context_length: model.hp.context_length,
            backend: backend.name().to_string(),
            device: backend.device_name(),
            arithmetic: backend.arithmetic(),
            fallback_reason: opened.fallback_reason,
            weight_bytes_per_token: per_token,
            is_demo,
            weights: placement.clone(),
            identity: crate::sessions::ModelIdentity::of(&model.file).to_text(),
            ..Default::default()
        };
        let region: Option<Arc<dyn MappedRegion>> =
            (mapped && !copied).then(|| model.file.clone() as Arc<dyn MappedRegion>);
        let residency = mapped.then(|| {
            let mut probe = ResidencyProbe::for_model(&model);
            probe.device_bytes = placement.as_ref().filter(|p| p.copied).map_or(0, |p| p.bytes);
            probe
        });
        Ok(LoadedModel {
            device_model: Some(opened.model),
            session: backend,
            text,
            info,
            warmup: region,
            residency,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::backend::memguard::cpu_kv_bytes;
    use crate::engine::events::{BackendChoice, Command, TextKind, TurnRequest};
    use crate::engine::worker::Worker;
    use crate::engine::worker::tests::{collect_until_within, is_finished};
    use crate::model::chat::{Message, ThinkMode};

    const WAIT: Duration = Duration::from_secs(60);

    fn until(w: &Worker, stop: impl Fn(&Event) -> bool) -> Vec<Event> {
        collect_until_within(w, WAIT, stop)
    }

    fn request(source: ModelSource, ctx: u32) -> LoadRequest {
        LoadRequest {
            source,
            ctx,
            backend: BackendChoice::Cpu,
            weights: Default::default(),
            arithmetic: Default::default(),
            threads: 2,
        }
    }

    fn turn(messages: Vec<Message>, think: ThinkMode, max_tokens: u32) -> TurnRequest {
        TurnRequest::greedy(messages, think, max_tokens)
    }

    /// (reused, evaluated, generated, context used, reasoning, answer, prompt tokens) of a turn.
    fn summary(ev: &[Event]) -> (u32, u32, u32, u32, String, String, u32) {
        let (mut reused, mut evaluated, mut generated, mut used, mut prompt) = (0, 0, 0, 0, 0);
        let (mut r, mut a) = (String::new(), String::new());
        for e in ev {
            match e {
                Event::TurnStarted {
                    reused_tokens,
                    prompt_tokens,
                    ..
                } => (reused, prompt) = (*reused_tokens, *prompt_tokens),
                Event::PrefillDone { tokens, .. } => evaluated = *tokens,
                Event::Text {
                    kind: TextKind::Reasoning,
                    text,
                } => r.push_str(text),
                Event::Text {
                    kind: TextKind::Answer,
                    text,
                } => a.push_str(text),
                Event::TurnFinished {
                    generated: g,
                    context_used,
                    ..
                } => (generated, used) = (*g, *context_used),
                _ => {}
            }
        }
        (reused, evaluated, generated, used, r, a, prompt)
    }

    /// The demo model end to end: real tokenizer, live transcript, CPU backend. A follow-up turn
    /// reuses the whole cache; a retry restores the checkpoint of its prompt; an edit of the last
    /// user message reuses the first turn.
    #[test]
    fn demo_model_chat_reuses_the_cache() {
        let w = Worker::spawn(Box::new(EngineLoader::new()));
        w.send(Command::Load(request(ModelSource::Demo { seed: 3 }, 512)));
        let ev = until(&w, |e| matches!(e, Event::Loaded(_) | Event::Error { .. }));
        let Some(Event::Loaded(info)) = ev.last() else {
            panic!("{ev:?}")
        };
        assert!(info.is_demo && info.backend == "cpu" && info.ctx == 512 && info.n_layer == 6);
        assert!(info.weight_bytes_per_token > 0 && info.kv_bytes == cpu_kv_bytes(&crate::model::HParams::tiny(), 512));

        let q1 = vec![Message::user("What is the capital of France?")];
        w.send(Command::Submit(turn(q1.clone(), ThinkMode::High, 6)));
        let (reused, evaluated, generated, used, r, a, _) = summary(&until(&w, is_finished));
        assert_eq!((reused, generated), (0, 6));
        assert_eq!(used, evaluated + generated);

        let mut q2 = q1.clone();
        q2.push(Message::assistant(a, Some(r)));
        q2.push(Message::user("And of Italy?"));
        w.send(Command::Submit(turn(q2.clone(), ThinkMode::High, 4)));
        let first = summary(&until(&w, is_finished));
        assert_eq!(first.0, used, "follow-up did not extend the cache");

        // Retry the same turn: the checkpoint after its prompt is restored, nothing re-evaluated,
        // and greedy sampling writes the same text.
        w.send(Command::Submit(turn(q2.clone(), ThinkMode::High, 4)));
        let retry = summary(&until(&w, is_finished));
        assert_eq!(retry.1, 0);
        assert_eq!((&retry.4, &retry.5), (&first.4, &first.5));

        // Edit the last user message: the checkpoint after turn 1's prompt is restored, so only
        // what follows it is evaluated (turn 1's answer, EOS and the edited turn).
        let mut edited = q2.clone();
        edited.last_mut().unwrap().content = "And of Spain?".into();
        w.send(Command::Submit(turn(edited.clone(), ThinkMode::High, 1)));
        let e = summary(&until(&w, is_finished));
        assert_eq!(e.1, e.6 - evaluated, "edit evaluated {} of {}", e.1, e.6);
    }

    /// A model file: memory guard passes, the mapping is warmed up and probed.
    #[test]
    fn model_file_is_warmed_and_probed() {
        use crate::genmodel::{ExpertMix, GenSpec, Preset, SyntheticModel};
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-scratch");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("tiny-{}.gguf", std::process::id()));
        let m = SyntheticModel::new(&GenSpec::new(Preset::Tiny, 5, ExpertMix::Q2)).unwrap();
        m.write_file(&path, 2, |_| {}).unwrap();
        let w = Worker::spawn(Box::new(EngineLoader::new()));
        w.send(Command::Load(request(ModelSource::File(path.clone()), 256)));
        let ev = until(&w, |e| matches!(e, Event::WarmupDone { .. } | Event::Error { .. }));
        let Some(Event::WarmupDone { total_bytes, .. }) = ev.last() else {
            panic!("{ev:?}")
        };
        let file_bytes = std::fs::metadata(&path).unwrap().len();
        assert_eq!(*total_bytes, file_bytes);
        let Some(Event::Loaded(info)) = ev.iter().find(|e| matches!(e, Event::Loaded(_))) else {
            panic!()
        };
        assert_eq!((info.file_bytes, info.is_demo), (file_bytes, false));
        // After the warm-up the whole file is resident; per-group totals cover the tensor bytes.
        let tensor_bytes: u64 = Model::open(&path)
            .unwrap()
            .grouped_tensors()
            .iter()
            .map(|(_, t)| t.nbytes)
            .sum();
        let r = loop {
            let e = until(&w, |e| matches!(e, Event::Residency(_)));
            if let Some(Event::Residency(r)) = e.last()
                && r.resident_bytes == r.total_bytes
            {
                break r.clone();
            }
        };
        assert_eq!(r.total_bytes, file_bytes);
        assert_eq!(r.routed_experts.1 + r.dense.1 + r.embed_head.1, tensor_bytes);
        assert_eq!(r.routed_experts.0, r.routed_experts.1);
        assert_eq!(r.embed_head.0, r.embed_head.1);
        drop(w);
        std::fs::remove_file(path).unwrap();
    }
}
