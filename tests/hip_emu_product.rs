//! The HIP backend as a product feature, end to end on the HIP runtime emulator (kernels/emu,
//! tools/build-hip-emu.sh: every hip* call and kernel runs on the CPU): weight placement (copy
//! through pinned staging, zero-copy map, auto), the device memory guard, save/load of the device
//! session, the worker's upload events, `bench --backend hip` (and the `knobs:` line it prints).
//!
//! One test function: the emulator is selected through process environment variables (tests/hip_emu
//! sets DS4_HIP_LIBRARY before the HIP runtime is first loaded; this test then changes
//! DS4_EMU_MEM_MIB); with a single test in this binary no other thread
//! reads the environment meanwhile. Skipped with a message when no C++ compiler is present. Run with
//! `--features hip`.
#![cfg(feature = "hip")]

mod hip_emu;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ds4_chat::backend::arithmetic::Arithmetic;
use ds4_chat::backend::hip::footprint::session_bytes;
use ds4_chat::backend::hip::open_model_with_progress;
use ds4_chat::backend::hip::prefill::PREFILL_CHUNK;
use ds4_chat::backend::hip::weights::{DeviceWeights, data_section_bytes};
use ds4_chat::backend::hip::{HipContext, bandwidth};
use ds4_chat::backend::hip::{open_backend, open_backend_with_progress};

/// Every check here compares bits with the CPU engine: the exact contract.
const EXACT: Arithmetic = Arithmetic::Exact;
use ds4_chat::backend::{BackendError, DeviceModel, DeviceSession};
use ds4_chat::engine::backend_open::{self, PlacementRequest};
use ds4_chat::engine::events::{BackendChoice, Command as WorkerCommand, Event, LoadRequest, ModelSource};
use ds4_chat::engine::events::{WarmupPhase, WeightsMode};
use ds4_chat::genmodel::{ExpertMix, GenSpec, SyntheticModel};
use ds4_chat::model::Model;

fn scratch_dir() -> PathBuf {
    let d = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("target/test-scratch/hip-emu-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The tiny architecture cut down for the emulator's speed: a 512-token vocabulary and three
/// layers — uncompressed, ratio 4 with the indexer, ratio 128 — so every kind of device state
/// (raw ring, compressed rows, compressor and indexer state) is present. No tokenizer.
fn write_model(path: &Path, seed: u64) {
    let spec = GenSpec::tiny_each_cache_kind(seed, ExpertMix::Q2);
    SyntheticModel::new(&spec).unwrap().write_file(path, 1, |_| {}).unwrap();
}

fn set_env(key: &str, value: &str) {
    // SAFETY: this binary has a single test, and no thread of it reads the environment concurrently
    // (the emulator reads DS4_EMU_MEM_MIB on this thread, inside the calls made here).
    unsafe { std::env::set_var(key, value) };
}

fn eval(b: &mut dyn DeviceSession, tokens: &[u32]) -> Vec<Vec<f32>> {
    tokens
        .iter()
        .map(|&t| {
            b.eval(&[t], &mut |_, _| true).unwrap();
            b.logits().to_vec()
        })
        .collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn hip_backend_product_features_on_the_emulator() {
    let Some(lib) = hip_emu::use_emulated_hip() else {
        return;
    };
    let dir = scratch_dir();
    set_env("DS4_EMU_MEM_MIB", "16384");
    let path = dir.join("tiny512.gguf");
    write_model(&path, 7);
    let model = Arc::new(Model::open(&path).unwrap());
    let timed = |what: &str, step: &dyn Fn()| {
        let t = Instant::now();
        step();
        eprintln!("{what}: {:.1} s", t.elapsed().as_secs_f64());
    };
    timed("placement", &|| placement_copy_and_map(&model));
    timed("save/load", &|| save_and_load(&model));
    timed("sessions", &|| sessions_share_the_engine(&model));
    timed("memory guard", &|| memory_guard(&model));
    timed("auto open", &|| auto_opens_the_device(&model));
    timed("worker", &worker_reports_the_upload);
    timed("bench", &|| bench_on_the_gpu(&path, &lib));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Copy (pread through pinned staging) and map (registered file mapping) place the same bytes and
/// give bitwise the same logits; auto copies when the weights fit; the session allocates exactly
/// what the memory guard counted; progress ends at the data section's size.
fn placement_copy_and_map(model: &Arc<Model>) {
    let ctx = HipContext::new().unwrap();
    let total = data_section_bytes(&model.file);
    let mut calls = Vec::new();
    let copied = DeviceWeights::upload(&ctx, model, &mut |d, t| calls.push((d, t))).unwrap();
    assert!(copied.method.contains("through pinned staging ("), "{}", copied.method);
    assert!(!copied.is_mapped());
    // The copy starts at the 4 KiB block holding the first tensor byte (O_DIRECT alignment).
    let placed = copied.len_bytes() as u64;
    assert!(placed >= total && placed < total + 4096, "{placed} vs {total}");
    assert_eq!(calls.last(), Some(&(placed, placed)));
    assert!(
        calls.windows(2).all(|w| w[0].0 < w[1].0),
        "progress not increasing: {calls:?}"
    );
    let mapped = DeviceWeights::map(&ctx, model).unwrap();
    assert!(mapped.is_mapped() && mapped.method.starts_with("registered file mapping"));
    // Every tensor as the device sees it equals the file's bytes, in both placements.
    for (_, t) in model.grouped_tensors() {
        let want = model.data(t);
        for w in [&copied, &mapped] {
            let mut back = vec![0u8; t.nbytes as usize];
            w.read_back(&ctx, t, &mut back).unwrap();
            assert!(back == want, "tensor {} differs on the device", t.name);
        }
    }
    drop((copied, mapped));

    let tokens = [77u32, 300];
    let mut logits = Vec::new();
    for asked in [WeightsMode::Auto, WeightsMode::Map] {
        let (free_before, _) = ctx.mem_info().unwrap();
        let mut b = open_backend(model.clone(), asked, 16, EXACT).unwrap();
        let p = b.weights_placement().unwrap();
        let mem = b.memory();
        let s = session_bytes(&model.hp, 16, PREFILL_CHUNK);
        assert_eq!(mem.kv_bytes, s.kv);
        let (free_after, _) = ctx.mem_info().unwrap();
        // What the device handed out is the footprint the guard counted (plus the weights when
        // copied); the emulator rounds each allocation up to 256 bytes, at most 512 buffers here.
        let used = free_before - free_after;
        let counted = s.kv + s.scratch + if p.copied { placed } else { 0 };
        assert!(
            used >= counted && used <= counted + 512 * 256,
            "used {used}, counted {counted}"
        );
        if asked == WeightsMode::Auto {
            assert!(p.copied && p.reason.starts_with("auto: the weights fit"), "{p:?}");
            assert_eq!((p.bytes, mem.device_weight_bytes), (placed, placed));
        } else {
            assert!(!p.copied && p.reason.is_empty(), "{p:?}");
            assert_eq!((p.bytes, mem.device_weight_bytes), (model.file.file_size(), 0));
        }
        eprintln!("{}", p.summary());
        logits.push(eval(b.as_mut(), &tokens));
    }
    for (a, b) in logits[0].iter().zip(&logits[1]) {
        assert_eq!(bits(a), bits(b), "copy and map placements disagree");
    }
}

/// Save after N tokens, run M more, load, re-run the same M: the logits are bitwise identical, in
/// the same backend and in a fresh one with a larger context. Bad payloads are refused and leave the
/// session as it was.
fn save_and_load(model: &Arc<Model>) {
    let prefix = [3u32, 9, 200, 41, 17];
    let more = [8u32, 450, 2];
    let mut a = open_backend(model.clone(), WeightsMode::Copy, 12, EXACT).unwrap();
    eval(a.as_mut(), &prefix);
    let saved_logits = a.logits().to_vec();
    let state = a.save_state();
    let first = eval(a.as_mut(), &more);
    a.load_state(&state).unwrap();
    assert_eq!(a.n_past(), prefix.len());
    assert_eq!(bits(a.logits()), bits(&saved_logits));
    let again = eval(a.as_mut(), &more);
    for (x, y) in first.iter().zip(&again) {
        assert_eq!(bits(x), bits(y), "logits after load_state differ");
    }
    // The reference for the whole sequence evaluated token by token from scratch in a new session.
    let mut fresh = open_backend(model.clone(), WeightsMode::Copy, 32, EXACT).unwrap();
    fresh.load_state(&state).unwrap();
    let restored = eval(fresh.as_mut(), &more);
    for (x, y) in first.iter().zip(&restored) {
        assert_eq!(bits(x), bits(y), "logits after loading into another session differ");
    }
    // Refusals: truncated, a trailing byte, a CPU payload, a context too small; state unchanged.
    let n_before = a.n_past();
    let truncated = &state[..state.len() - 1];
    let mut trailing = state.clone();
    trailing.push(0);
    let mut cpu = ds4_chat::backend::cpu::CpuSession::new(model.clone(), 12, 1).unwrap();
    cpu.eval(&prefix, &mut |_, _| true).unwrap();
    let cpu_state = cpu.save_state();
    for (bytes, want) in [
        (truncated, "truncated at byte"),
        (&trailing[..], "1 bytes after the last layer"),
        (&cpu_state[..], "magic"),
        (&[][..], "truncated at byte 0"),
    ] {
        match a.load_state(bytes) {
            Err(BackendError::BadCheckpoint(m)) => assert!(m.contains(want), "{m}"),
            r => panic!("{r:?}"),
        }
        assert_eq!(a.n_past(), n_before);
    }
    let mut small = open_backend(model.clone(), WeightsMode::Copy, 4, EXACT).unwrap();
    match small.load_state(&state) {
        Err(BackendError::BadCheckpoint(m)) => assert!(m.contains("do not fit this session's context 4"), "{m}"),
        r => panic!("{r:?}"),
    }
    // The session state survives the refusals: both sessions hold the same 8 tokens.
    let x = eval(a.as_mut(), &[99]);
    let y = eval(fresh.as_mut(), &[99]);
    assert_eq!(bits(&x[0]), bits(&y[0]), "a refused payload changed the session");
}

/// Sessions opened from one engine share its weights: a second session (another context) allocates
/// only its own KV and scratch while the weights stay where they are, its logits are bitwise those
/// of a backend opened from scratch, and a session that does not fit next to the weights is refused
/// by the memory guard with its one line.
fn sessions_share_the_engine(model: &Arc<Model>) {
    let hip = HipContext::new().unwrap();
    let mut copied = 0;
    let engine = open_model_with_progress(model.clone(), WeightsMode::Copy, 16, EXACT, &mut |d, _| copied = d).unwrap();
    // Progress ends at the bytes placed (the data section from its aligned block on, see above).
    assert_eq!(
        copied,
        engine.weights_placement().expect("a HIP engine places weights").bytes
    );
    assert!(copied >= data_section_bytes(&model.file) && copied < data_section_bytes(&model.file) + 4096);
    let groups = model.grouped_tensors();
    let probe = groups[0].1;
    let weights_at = engine.weights().tensor(probe);
    let tokens = [77u32, 300, 5];
    let mut first = engine.session(16).unwrap();
    let first_logits = eval(&mut first, &tokens);

    let (free_before, _) = hip.mem_info().unwrap();
    let mut second = engine.open_session(32).unwrap();
    let (free_after, _) = hip.mem_info().unwrap();
    let s = session_bytes(&model.hp, 32, PREFILL_CHUNK);
    let used = free_before - free_after;
    assert!(
        used >= s.kv + s.scratch && used <= s.kv + s.scratch + 512 * 256,
        "a second session took {used} bytes, its KV + scratch are {}",
        s.kv + s.scratch
    );
    assert_eq!(engine.weights().tensor(probe), weights_at);
    assert_eq!(second.weights_placement(), engine.weights_placement());
    let got = eval(second.as_mut(), &tokens);
    let mut fresh = open_backend(model.clone(), WeightsMode::Copy, 32, EXACT).unwrap();
    let want = eval(fresh.as_mut(), &tokens);
    for ((g, w), f) in got.iter().zip(&want).zip(&first_logits) {
        assert_eq!(bits(g), bits(w), "a second session differs from a fresh backend");
        assert_eq!(bits(g), bits(f), "sessions of one engine differ");
    }
    drop(fresh);

    // Room for the weights and these two sessions, not for a third.
    let (free, total) = hip.mem_info().unwrap();
    let in_use_mib = (total - free).div_ceil(1 << 20);
    set_env("DS4_EMU_MEM_MIB", &(in_use_mib + 1).to_string());
    let e = engine.session(16).err().expect("no room for another session");
    assert!(
        e.starts_with("too little device memory: need ")
            && e.contains("use a smaller --ctx; --ctx 16 needs KV ")
            && !e.contains('\n'),
        "{e}"
    );
    set_env("DS4_EMU_MEM_MIB", "16384");
    drop((first, second));
    let mut third = engine.session(16).unwrap();
    assert_eq!(bits(&eval(&mut third, &tokens)[2]), bits(&first_logits[2]));
}

/// With DS4_EMU_MEM_MIB the emulated device has that much memory: a copy that does not fit is
/// refused with "too little device memory: need X, have Y" before anything is allocated, auto maps
/// instead, and a session that does not fit at all is refused whatever the placement.
fn memory_guard(model: &Arc<Model>) {
    let weights = data_section_bytes(&model.file);
    let s = session_bytes(&model.hp, 16, PREFILL_CHUNK);
    let mib = |b: u64| b.div_ceil(1 << 20);
    // Room for the session and the reserve but not for the weights as well.
    let tight = mib(s.kv + s.scratch + (64 << 20)) + mib(weights) / 2;
    set_env("DS4_EMU_MEM_MIB", &tight.to_string());
    let e = open_backend(model.clone(), WeightsMode::Copy, 16, EXACT)
        .err()
        .expect("copy must be refused");
    assert!(e.starts_with("too little device memory: need "), "{e}");
    assert!(
        e.contains(&format!("of {}.0 MiB on", tight)) && !e.contains('\n'),
        "{e}"
    );
    let b = open_backend(model.clone(), WeightsMode::Auto, 16, EXACT).unwrap();
    let p = b.weights_placement().unwrap();
    assert!(
        !p.copied
            && p.reason
                .starts_with("auto: no room for a copy (too little device memory"),
        "{p:?}"
    );
    drop(b);
    set_env("DS4_EMU_MEM_MIB", "8");
    for asked in [WeightsMode::Auto, WeightsMode::Map, WeightsMode::Copy] {
        let e = open_backend(model.clone(), asked, 16, EXACT).err().expect("refused");
        assert!(
            e.starts_with("too little device memory: need ") && e.contains("have "),
            "{e}"
        );
    }
    set_env("DS4_EMU_MEM_MIB", "16384");
}

/// The engine on `backend` (exact arithmetic, one CPU thread, a 16-token cache) as the worker opens it.
fn open_exact(model: &Arc<Model>, backend: BackendChoice) -> Result<backend_open::OpenedModel, String> {
    let placement = PlacementRequest {
        backend,
        arithmetic: EXACT,
        threads: 1,
        ..Default::default()
    };
    backend_open::open_device_model(model.clone(), &placement, 16)
}

/// `--backend auto` opens the device when one is usable, with no fallback reason.
fn auto_opens_the_device(model: &Arc<Model>) {
    let o = open_exact(model, BackendChoice::Auto).unwrap();
    assert_eq!((o.session.name(), o.fallback_reason), ("hip", None));
    // Progress through the engine entry point ends at the bytes placed: the data section, from the
    // start of the 4 KiB block holding its first byte.
    let mut last = (0, 0);
    let b = open_backend_with_progress(model.clone(), WeightsMode::Copy, 16, EXACT, &mut |d, t| last = (d, t)).unwrap();
    let placed = b.weights_placement().unwrap().bytes;
    assert_eq!(last, (placed, placed));
    assert!(placed >= data_section_bytes(&model.file) && placed < data_section_bytes(&model.file) + 4096);
}

/// A load through the worker (the demo model: the worker needs a tokenizer, and a load evaluates
/// nothing) streams the copy as WarmupProgress(CopyToDevice) events, ends with WarmupDone, and the
/// loaded model says where the weights are.
fn worker_reports_the_upload() {
    use ds4_chat::engine::loader::EngineLoader;
    use ds4_chat::engine::worker::Worker;
    let w = Worker::spawn(Box::new(EngineLoader::new()));
    let request = |ctx| LoadRequest {
        source: ModelSource::Demo { seed: 2 },
        ctx,
        backend: BackendChoice::Hip,
        weights: WeightsMode::Copy,
        arithmetic: EXACT,
        threads: 1,
    };
    let until_loaded = || {
        let mut events = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(120);
        while Instant::now() < deadline {
            match w.recv_timeout(Duration::from_millis(100)) {
                Some(e @ (Event::Loaded(_) | Event::Error { .. })) => {
                    events.push(e);
                    break;
                }
                Some(e) => events.push(e),
                None => {}
            }
        }
        events
    };
    w.send(WorkerCommand::Load(request(64)));
    let events = until_loaded();
    let demo = ds4_chat::genmodel::tiny_model(2, ExpertMix::Q2).unwrap();
    let total = data_section_bytes(&demo);
    let progress: Vec<(u64, u64)> = events
        .iter()
        .filter_map(|e| match e {
            Event::WarmupProgress {
                phase: WarmupPhase::CopyToDevice,
                done_bytes,
                total_bytes,
                ..
            } => Some((*done_bytes, *total_bytes)),
            _ => None,
        })
        .collect();
    assert_eq!(progress.last(), Some(&(total, total)), "{events:?}");
    assert!(
        events
            .iter()
            .any(|e| matches!(e, Event::WarmupDone { total_bytes, .. } if *total_bytes == total))
    );
    let Some(Event::Loaded(info)) = events.last() else {
        panic!("{events:?}")
    };
    assert_eq!(info.backend, "hip");
    let p = info.weights.as_ref().expect("placement in the model info");
    assert!(p.copied && p.bytes == total, "{p:?}");

    // `/ctx 128`: a new session on the loaded engine, nothing copied again.
    w.send(WorkerCommand::Load(request(128)));
    let events = until_loaded();
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, Event::WarmupProgress { .. } | Event::WarmupDone { .. })),
        "{events:?}"
    );
    let Some(Event::Loaded(resized)) = events.last() else {
        panic!("{events:?}")
    };
    assert_eq!((resized.ctx, &resized.weights), (128, &info.weights));
    assert!(resized.kv_bytes > info.kv_bytes);
}

/// `bench --backend hip`: placement and load time printed, the peak measured on the device, CSV rows.
fn bench_on_the_gpu(path: &Path, lib: &Path) {
    let out = Command::new(env!("CARGO_BIN_EXE_ds4-chat"))
        .args(["bench", "--backend", "hip", "--weights", "copy", "-m"])
        .arg(path)
        .args([
            "--ctx-start",
            "2",
            "--ctx-max",
            "3",
            "--step-incr",
            "1",
            "--gen-tokens",
            "1",
        ])
        .env("DS4_HIP_LIBRARY", lib)
        .env("DS4_EMU_MEM_MIB", "512")
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stderr}");
    eprint!("{stderr}");
    assert!(
        stderr.contains("weights copy: ") && stderr.contains("backend ready in"),
        "{stderr}"
    );
    assert!(stderr.contains("measured device copy of"), "{stderr}");
    assert!(
        stderr
            .lines()
            .any(|l| l.starts_with("knobs: ") && l.contains("DS4_HIP_LIBRARY=")),
        "bench names the variables it ran with: {stderr}"
    );
    let rows: Vec<&str> = stdout.lines().collect();
    assert_eq!(rows.len(), 3, "{stdout}");
    assert!(rows[1].starts_with("2,2,") && rows[2].starts_with("3,1,"), "{stdout}");
    // The device probe itself: positive GB/s over a whole number of MiB (an eighth of 256 MiB).
    set_env("DS4_EMU_MEM_MIB", "256");
    let (gbps, bytes) = bandwidth::measure_copy_gbps(&HipContext::new().unwrap()).unwrap();
    assert!(gbps > 0.0 && bytes >= 1 << 20 && bytes % (1 << 20) == 0);
}
