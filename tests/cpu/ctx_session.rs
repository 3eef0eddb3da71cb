//! `/ctx N` on a loaded model file (the tiny preset, written to disk): it opens a new session on the
//! engine the worker keeps. The file is not loaded again (the loader runs once), nothing is paged
//! in again by a warm-up, and the new session has the new context.
//!
//! What a reload would re-read is counted from what the worker does: each `ModelLoader::load` maps
//! the file again and parses its directory (`data_offset` bytes), and each warm-up after the change
//! reads the mapping once more (its `PageIn` bytes; a GPU copy its `CopyToDevice` bytes). The
//! figures are printed for the record; the assertions are that both are zero and that the new
//! sessions come from the engine of the first load (the same `Arc<Model>`).

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ds4_chat::backend::{BackendError, DeviceModel, DeviceSession};
use ds4_chat::engine::events::{BackendChoice, Command, Event, LoadRequest, ModelSource, WarmupPhase};
use ds4_chat::engine::loader::EngineLoader;
use ds4_chat::engine::worker::{LoadedModel, ModelLoader, Worker};
use ds4_chat::genmodel::{ExpertMix, GenSpec, Preset, SyntheticModel};
use ds4_chat::gguf::GgufFile;
use ds4_chat::model::Model;

const WAIT: Duration = Duration::from_secs(120);

/// The models loaded, and the (context, model) of every session opened on an engine afterwards.
#[derive(Default)]
struct Record {
    models: Vec<Arc<Model>>,
    sessions: Vec<(usize, Arc<Model>)>,
}

/// The application's loader, counting how often a model is loaded and recording the sessions its
/// engines open.
struct CountingLoader {
    inner: EngineLoader,
    loads: Arc<AtomicUsize>,
    record: Arc<Mutex<Record>>,
}

impl ModelLoader for CountingLoader {
    fn load(&mut self, req: &LoadRequest, notice: &mut dyn FnMut(Event)) -> Result<LoadedModel, String> {
        self.loads.fetch_add(1, Ordering::SeqCst);
        let mut m = self.inner.load(req, notice)?;
        let engine = m.device_model.take().expect("the application's loader keeps an engine");
        self.record.lock().unwrap().models.push(engine.model().clone());
        m.device_model = Some(Box::new(RecordingModel {
            inner: engine,
            record: self.record.clone(),
        }));
        Ok(m)
    }
}

struct RecordingModel {
    inner: Box<dyn DeviceModel>,
    record: Arc<Mutex<Record>>,
}

impl DeviceModel for RecordingModel {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn device_name(&self) -> String {
        self.inner.device_name()
    }
    fn model(&self) -> &Arc<Model> {
        self.inner.model()
    }
    fn open_session(&self, ctx: usize) -> Result<Box<dyn DeviceSession>, BackendError> {
        let model = self.inner.model().clone();
        self.record.lock().unwrap().sessions.push((ctx, model));
        self.inner.open_session(ctx)
    }
}

fn request(path: &std::path::Path, ctx: u32) -> LoadRequest {
    LoadRequest {
        source: ModelSource::File(path.to_path_buf()),
        ctx,
        backend: BackendChoice::Cpu,
        weights: Default::default(),
        arithmetic: Default::default(),
        threads: 2,
    }
}

/// Events until `stop` matches one (included), or `None` when `within` passes first.
fn until(w: &Worker, within: Duration, stop: impl Fn(&Event) -> bool) -> (Vec<Event>, bool) {
    let end = Instant::now() + within;
    let mut out = Vec::new();
    while let Some(left) = end.checked_duration_since(Instant::now()) {
        match w.recv_timeout(left) {
            Some(e) => {
                let done = stop(&e);
                out.push(e);
                if done {
                    return (out, true);
                }
            }
            None => break,
        }
    }
    (out, false)
}

fn is_loaded(e: &Event) -> bool {
    matches!(e, Event::Loaded(_) | Event::Error { .. })
}

/// Bytes a warm-up or a device copy read in `ev` (the largest `done_bytes` of each phase).
fn reread_by_warmup(ev: &[Event]) -> u64 {
    let mut page_in = 0;
    let mut copy = 0;
    for e in ev {
        match e {
            Event::WarmupProgress {
                phase: WarmupPhase::PageIn,
                done_bytes,
                ..
            } => page_in = page_in.max(*done_bytes),
            Event::WarmupProgress {
                phase: WarmupPhase::CopyToDevice,
                done_bytes,
                ..
            } => copy = copy.max(*done_bytes),
            Event::WarmupDone { total_bytes, .. } => page_in = page_in.max(*total_bytes),
            _ => {}
        }
    }
    page_in + copy
}

struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn ctx_change_opens_a_session_without_reading_the_file_again() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-scratch");
    std::fs::create_dir_all(&dir).unwrap();
    let path = Scratch(dir.join(format!("ctx-session-{}.gguf", std::process::id())));
    let m = SyntheticModel::new(&GenSpec::new(Preset::Tiny, 5, ExpertMix::Q2)).unwrap();
    m.write_file(&path.0, 2, |_| {}).unwrap();
    let directory_bytes = GgufFile::open(&path.0).unwrap().data_offset;
    let file_bytes = std::fs::metadata(&path.0).unwrap().len();

    let loads = Arc::new(AtomicUsize::new(0));
    let record = Arc::new(Mutex::new(Record::default()));
    let w = Worker::spawn(Box::new(CountingLoader {
        inner: EngineLoader::new(),
        loads: loads.clone(),
        record: record.clone(),
    }));
    w.send(Command::Load(request(&path.0, 256)));
    let (ev, _) = until(&w, WAIT, |e| {
        matches!(e, Event::WarmupDone { .. } | Event::Error { .. })
    });
    assert!(matches!(ev.last(), Some(Event::WarmupDone { .. })), "{ev:?}");
    assert_eq!(loads.load(Ordering::SeqCst), 1);
    let Some(Event::Loaded(first)) = ev.iter().find(|e| matches!(e, Event::Loaded(_))) else {
        panic!("{ev:?}")
    };
    assert_eq!(first.ctx, 256);

    // The TUI's /ctx sends the same request with the new context.
    let start = Instant::now();
    w.send(Command::Load(request(&path.0, 512)));
    let (mut ev, _) = until(&w, WAIT, is_loaded);
    let took = start.elapsed();
    let Some(Event::Loaded(info)) = ev.last().cloned() else {
        panic!("{ev:?}")
    };
    // A warm-up restarted by the change would report within a second (the file is cached).
    let (more, _) = until(&w, Duration::from_secs(1), |e| matches!(e, Event::WarmupDone { .. }));
    ev.extend(more);
    let reloads = loads.load(Ordering::SeqCst) - 1;
    let reread = reloads as u64 * directory_bytes + reread_by_warmup(&ev);
    eprintln!(
        "/ctx 256 -> 512 on the tiny model ({file_bytes} bytes): {:.1} ms to Loaded, {reloads} model load(s), \
         {reread} bytes re-read (directory {directory_bytes} bytes per load + warm-up/copy)",
        took.as_secs_f64() * 1e3
    );
    assert_eq!((info.ctx, info.file_bytes), (512, file_bytes));
    assert!(
        info.kv_bytes > first.kv_bytes,
        "{} vs {}",
        info.kv_bytes,
        first.kv_bytes
    );
    assert_eq!(reloads, 0, "the model was loaded again");
    assert_eq!(reread, 0, "bytes of the model file were read again");
    {
        let r = record.lock().unwrap();
        assert_eq!(r.sessions.len(), 1);
        assert_eq!(r.sessions[0].0, 512);
        assert!(
            Arc::ptr_eq(&r.sessions[0].1, &r.models[0]),
            "the session runs another model"
        );
    }

    // A context the model does not support is refused; the session of the old context stays.
    w.send(Command::Load(request(&path.0, 1 << 30)));
    let (ev, _) = until(&w, WAIT, |e| {
        matches!(e, Event::Loaded(_) | Event::Error { fatal: true, .. })
    });
    let refusal = ev.iter().find_map(|e| match e {
        Event::Error { message, fatal: false } => Some(message.clone()),
        _ => None,
    });
    let refusal = refusal.unwrap_or_else(|| panic!("{ev:?}"));
    assert_eq!(
        refusal,
        "--ctx: 1073741824 is out of range (2 ..= 1048576); the context stays 512"
    );
    assert!(matches!(ev.last(), Some(Event::Loaded(i)) if i.ctx == 512), "{ev:?}");
    assert_eq!(loads.load(Ordering::SeqCst), 1);
    {
        // The refused context never reached the engine; the old one was opened again on it.
        let r = record.lock().unwrap();
        let ctxs: Vec<usize> = r.sessions.iter().map(|s| s.0).collect();
        assert_eq!(ctxs, [512, 512]);
        assert!(Arc::ptr_eq(&r.sessions[1].1, &r.models[0]));
    }

    // A different source still loads.
    w.send(Command::Load(LoadRequest {
        source: ModelSource::Demo { seed: 3 },
        ..request(&path.0, 512)
    }));
    let (ev, _) = until(&w, WAIT, is_loaded);
    assert!(matches!(ev.last(), Some(Event::Loaded(i)) if i.is_demo), "{ev:?}");
    assert_eq!(loads.load(Ordering::SeqCst), 2);
}
