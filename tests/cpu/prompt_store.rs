//! The prompt store on the CPU engine (docs/serve.md#prompt-cache): a prompt restarts from the
//! longest stored prefix, also in a new session over a store opened again from its directory (a
//! restarted server), and continues bitwise like a session that evaluated it all; damaged, foreign
//! and other-arithmetic files are skipped with one line each; a newer turn supersedes the older
//! one of the same conversation; the budget evicts the least recently used.

use crate::sessions_common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ds4_chat::backend::DeviceSession;
use ds4_chat::engine::prompt_cache::{PromptCache, SyncReport};
use ds4_chat::engine::prompt_store::{MIN_STORED_TOKENS, PromptStore, PromptStoreSettings};
use ds4_chat::genmodel::{ExpertMix, tiny_model};
use ds4_chat::model::Model;
use ds4_chat::sessions::{ModelIdentity, snapshot};
use sessions_common::{cpu_session, same_bits, tokens};

const CTX: usize = 512;

fn demo_model(seed: u64) -> Arc<Model> {
    Arc::new(Model::bind(tiny_model(seed, ExpertMix::Q2).unwrap()).unwrap())
}

/// A scratch directory, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let d = std::env::temp_dir().join(format!("ds4-chat-prompt-store-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        Scratch(d)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn open(model: &Model, dir: &Path, budget: u64, arithmetic: &str) -> PromptStore {
    let settings = PromptStoreSettings {
        dir: dir.to_path_buf(),
        budget,
    };
    PromptStore::open(settings, ModelIdentity::of(&model.file), model.hp.clone(), arithmetic).expect("open the store")
}

/// A prompt cache with `store` over a fresh CPU session.
fn cache_with(model: &Arc<Model>, store: PromptStore) -> PromptCache {
    let mut c = PromptCache::new(cpu_session(model, CTX), 2);
    c.set_store(Some(store));
    c
}

fn sync(c: &mut PromptCache, prompt: &[u32], mark: Option<usize>) -> SyncReport {
    c.sync_marked(prompt, mark, &mut |_, _| true).expect("sync")
}

/// The logits after `prompt` evaluated from scratch.
fn reference(model: &Arc<Model>, prompt: &[u32]) -> Box<dyn DeviceSession> {
    let mut s = cpu_session(model, CTX);
    s.eval(prompt, &mut |_, _| true).unwrap();
    s
}

fn kv_files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".kv"))
        .collect();
    v.sort();
    v
}

/// A shared 100-token start, two questions: the second conversation (a new session over the store
/// opened again, as after a restart) evaluates only its question, and its logits and the next
/// tokens are bitwise those of the session that evaluated everything.
#[test]
fn a_new_session_starts_from_the_longest_stored_prefix_and_continues_bitwise() {
    let model = demo_model(1);
    let dir = Scratch::new("reuse");
    let vocab = model.hp.n_vocab;
    let shared = tokens(100, 7, vocab);
    let first: Vec<u32> = [shared.clone(), tokens(12, 8, vocab)].concat();
    let second: Vec<u32> = [shared.clone(), tokens(9, 9, vocab)].concat();

    let mut c = cache_with(&model, open(&model, &dir.0, 1 << 30, "exact"));
    let r = sync(&mut c, &first, Some(shared.len()));
    assert_eq!((r.reused, r.evaluated), (0, first.len()));
    let generated = tokens(5, 10, vocab);
    for &t in &generated {
        c.decode(t).unwrap();
    }
    c.persist();
    assert!(c.take_store_notices().is_empty());
    let files = kv_files(&dir.0);
    assert_eq!(files.len(), 2, "{files:?}");
    assert!(
        files
            .iter()
            .any(|f| f.contains("-exact-prefix-") && f.ends_with("-100.kv")),
        "{files:?}"
    );
    assert!(
        files
            .iter()
            .any(|f| f.contains("-exact-turn-") && f.ends_with("-117.kv")),
        "{files:?}"
    );
    drop(c);

    // "Restart": a new session, the store read again from its directory.
    let store = open(&model, &dir.0, 1 << 30, "exact");
    assert_eq!(store.len(), 2);
    assert_eq!(store.longest_prefix(&second), shared.len());
    let mut c = cache_with(&model, store);
    let r = sync(&mut c, &second, None);
    assert_eq!((r.reused, r.evaluated, r.restored), (shared.len(), 9, true));
    let mut want = reference(&model, &second);
    assert!(
        same_bits(c.logits(), want.logits()),
        "logits after a stored prefix differ"
    );
    for &t in &tokens(4, 11, vocab) {
        c.decode(t).unwrap();
        want.eval(&[t], &mut |_, _| true).unwrap();
        assert!(
            same_bits(c.logits(), want.logits()),
            "decode after a stored prefix differs"
        );
    }

    // The first conversation continued: from its turn's end (prompt and answer), not the prefix.
    let follow_up: Vec<u32> = [first.clone(), generated.clone(), tokens(6, 12, vocab)].concat();
    let mut c = cache_with(&model, open(&model, &dir.0, 1 << 30, "exact"));
    let r = sync(&mut c, &follow_up, None);
    assert_eq!((r.reused, r.evaluated), (first.len() + generated.len(), 6));
    assert!(same_bits(c.logits(), reference(&model, &follow_up).logits()));
    // Its end supersedes the conversation's older turn; the prefix stays.
    c.persist();
    let files = kv_files(&dir.0);
    assert_eq!(files.len(), 2, "{files:?}");
    assert!(
        files.iter().any(|f| f.ends_with(&format!("-{}.kv", follow_up.len()))),
        "{files:?}"
    );
    assert!(files.iter().any(|f| f.contains("-prefix-")), "{files:?}");
}

/// Prefixes under the minimum are not written; a prompt the live session already extends is not
/// restored from disk (the live tokens are as long).
#[test]
fn short_prompts_leave_no_file() {
    let model = demo_model(1);
    let dir = Scratch::new("short");
    let mut c = cache_with(&model, open(&model, &dir.0, 1 << 30, "exact"));
    let short = tokens(MIN_STORED_TOKENS - 1, 3, model.hp.n_vocab);
    sync(&mut c, &short, Some(10));
    c.persist();
    assert!(kv_files(&dir.0).is_empty());
}

/// Files of this store's names that do not read (garbage, truncated, another model's header, a
/// flipped byte in the rows) are skipped with one line each and never used; a dead writer's
/// temporary file is deleted, a running one's kept; files of another arithmetic or model are not
/// ours and are left alone. The prompt is then evaluated in full and its logits are the reference
/// ones.
#[test]
fn damaged_and_foreign_files_are_skipped_with_one_line_each() {
    let model = demo_model(1);
    let other = demo_model(2);
    let dir = Scratch::new("damaged");
    let vocab = model.hp.n_vocab;
    let shared = tokens(80, 21, vocab);
    let prompt: Vec<u32> = [shared.clone(), tokens(5, 22, vocab)].concat();
    let mut c = cache_with(&model, open(&model, &dir.0, 1 << 30, "exact"));
    sync(&mut c, &prompt, Some(shared.len()));
    c.persist();
    let files = kv_files(&dir.0);
    let prefix = files.iter().find(|f| f.contains("-prefix-")).unwrap().clone();
    let turn = files.iter().find(|f| f.contains("-turn-")).unwrap().clone();
    drop(c);

    // Our names over bad contents.
    let ours = prefix.split("-exact-").next().unwrap().to_string();
    std::fs::write(
        dir.0.join(format!("{ours}-exact-prefix-0123456789abcdef-90.kv")),
        b"garbage",
    )
    .unwrap();
    let bytes = std::fs::read(dir.0.join(&turn)).unwrap();
    std::fs::write(
        dir.0.join(format!("{ours}-exact-turn-00000000000000aa-90.kv")),
        &bytes[..40],
    )
    .unwrap();
    // Another model's state of a prefix of the prompt, under our name for it.
    let part = &shared[..70];
    let foreign_rows = {
        let mut s = cpu_session(&other, CTX);
        s.eval(part, &mut |_, _| true).unwrap();
        s.export_cache().unwrap()
    };
    let foreign_id = ModelIdentity::of(&other.file);
    let name = format!("{ours}-exact-prefix-{:016x}-70.kv", snapshot::token_hash(part));
    snapshot::save(&dir.0.join(&name), foreign_id, &other.hp, part, &foreign_rows).unwrap();
    // Another arithmetic and another model's names: not ours.
    std::fs::copy(dir.0.join(&prefix), dir.0.join(prefix.replace("-exact-", "-fast-"))).unwrap();
    std::fs::write(
        dir.0.join("1-0000000000000000-exact-prefix-0123456789abcdef-90.kv"),
        b"x",
    )
    .unwrap();
    // The real prefix file, damaged in its rows (found by its head, refused when loaded).
    let mut damaged = std::fs::read(dir.0.join(&prefix)).unwrap();
    let at = damaged.len() / 2;
    damaged[at] ^= 0x40;
    std::fs::write(dir.0.join(&prefix), &damaged).unwrap();
    std::fs::remove_file(dir.0.join(&turn)).unwrap();
    // A write a killed server left (no process has PID 0 in /proc), and one of a running writer.
    let stale = format!(".{turn}.0.tmp");
    let live = format!(".{turn}.{}.tmp", std::process::id());
    std::fs::write(dir.0.join(&stale), b"part").unwrap();
    std::fs::write(dir.0.join(&live), b"part").unwrap();

    let mut store = open(&model, &dir.0, 1 << 30, "exact");
    let notices = store.take_notices();
    assert_eq!(notices.len(), 3, "{notices:#?}");
    for n in &notices {
        assert!(n.starts_with("prompt cache: skipped ") && !n.contains('\n'), "{n}");
    }
    assert!(
        notices
            .iter()
            .any(|n| n.contains("too short") || n.contains("truncated")),
        "{notices:#?}"
    );
    assert!(notices.iter().any(|n| n.contains("another model file")), "{notices:#?}");
    assert_eq!(store.len(), 1, "only the damaged-in-its-rows prefix reads by its head");
    if Path::new("/proc/self").exists() {
        assert!(!dir.0.join(&stale).exists(), "a dead writer's temporary file stays");
    }
    assert!(
        dir.0.join(&live).exists(),
        "a running writer's temporary file was deleted"
    );
    let mut c = cache_with(&model, store);
    let r = sync(&mut c, &prompt, None);
    assert_eq!((r.reused, r.evaluated), (0, prompt.len()), "a damaged file is not used");
    let notices = c.take_store_notices();
    assert_eq!(notices.len(), 1, "{notices:#?}");
    assert!(notices[0].contains("checksum mismatch"), "{notices:#?}");
    assert!(same_bits(c.logits(), reference(&model, &prompt).logits()));
    assert_eq!(c.store().unwrap().len(), 0);
    // A store of the fast arithmetic sees only its own copy.
    let fast = open(&model, &dir.0, 1 << 30, "fast");
    assert_eq!(fast.len(), 1);
}

/// Over the budget the least recently used files go first, whoever wrote them; a restored prefix
/// counts as used.
#[test]
fn the_budget_evicts_the_least_recently_used() {
    let model = demo_model(1);
    let dir = Scratch::new("budget");
    let vocab = model.hp.n_vocab;
    let prompts: Vec<Vec<u32>> = (0..3).map(|i| tokens(70, 30 + i, vocab)).collect();
    let mut c = cache_with(&model, open(&model, &dir.0, 1 << 30, "exact"));
    for p in &prompts {
        sync(&mut c, p, None);
        c.persist();
    }
    let files = kv_files(&dir.0);
    assert_eq!(files.len(), 3);
    let size = std::fs::metadata(dir.0.join(&files[0])).unwrap().len();
    // Mark the first one used (by restoring it), one second apart from the rest: file times may be
    // coarse.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let mut c = cache_with(&model, open(&model, &dir.0, 3 * size + size / 2, "exact"));
    let r = sync(&mut c, &prompts[0], None);
    assert_eq!(r.reused, prompts[0].len());
    // A fourth conversation needs room for one file: the least recently used (the second) goes.
    let fourth = tokens(70, 40, vocab);
    sync(&mut c, &fourth, None);
    c.persist();
    let store = c.store().unwrap();
    assert_eq!(store.len(), 3);
    assert_eq!(store.longest_prefix(&prompts[0]), 70);
    assert_eq!(store.longest_prefix(&prompts[1]), 0, "the least recently used went");
    assert_eq!(store.longest_prefix(&prompts[2]), 70);
    assert_eq!(store.longest_prefix(&fourth), 70);
    assert_eq!(kv_files(&dir.0).len(), 3);
}
