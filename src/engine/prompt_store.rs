//! The prompt store (docs/serve.md#prompt-cache): KV snapshots of prompt prefixes on disk, so a
//! request reuses the longest prefix any earlier request left, from another conversation or from
//! before a restart. Files are the sessions' snapshots (`sessions::snapshot`, backend-neutral rows
//! bound to the model's identity and shape), written atomically, under a disk budget (least
//! recently used first, `sessions::budget`).
//!
//! Keys: a file is named `IDENTITY-ARITHMETIC-KIND-TOKENHASH-N.kv`. The model's identity and the
//! arithmetic its rows were computed in (`exact` for the CPU and the GPU's exact kernels, which
//! agree bit for bit; `fast` for the GPU's fast ones) decide which files a session may use, so a
//! directory shared by several models or settings never mixes them; the context does not matter
//! (the rows of `n` tokens are the same in every context). `N` tokens with hash `TOKENHASH`
//! (`snapshot::token_hash`) say which prefix it holds. The index, read from the files' heads at
//! start-up, maps (length, hash) to the entry; a lookup hashes the prompt once, stopping at every
//! stored length, and checks the tokens of a hit.
//!
//! Owns the directory's index, lookup, the save policy's bookkeeping (which kinds supersede which)
//! and the one-line notices about files it skips. Must not know about text, chat templates or the
//! device session (`prompt_cache` restores what this returns).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use crate::backend::cache_rows::CacheRows;
use crate::model::hparams::HParams;
use crate::sessions::identity::Hasher;
use crate::sessions::{ModelIdentity, atomic, budget, snapshot};

/// Prompt prefixes shorter than this are not stored: prefilling them costs about as little as
/// reading a file, and every short request would leave one.
pub const MIN_STORED_TOKENS: usize = 64;

/// Where the store lives and how much disk it may take.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PromptStoreSettings {
    pub dir: PathBuf,
    /// Bytes of `.kv` files the directory may hold (all models' together).
    pub budget: u64,
}

/// Why a state was stored; part of the file name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoredKind {
    /// The end of a prompt's shared part (system prompt and tools): what other conversations with
    /// the same start reuse.
    Prefix,
    /// A conversation at the end of a turn: what its next request (or the same conversation after
    /// a restart) reuses. A newer turn of the same conversation supersedes it.
    Turn,
}

impl StoredKind {
    fn name(self) -> &'static str {
        match self {
            StoredKind::Prefix => "prefix",
            StoredKind::Turn => "turn",
        }
    }

    fn parse(s: &str) -> Option<StoredKind> {
        match s {
            "prefix" => Some(StoredKind::Prefix),
            "turn" => Some(StoredKind::Turn),
            _ => None,
        }
    }
}

struct Entry {
    tokens: Vec<u32>,
    path: PathBuf,
    kind: StoredKind,
}

/// (token count, token hash): the index key of a stored prefix.
type Key = (usize, u64);

/// The stored prefixes of one model in one arithmetic.
pub struct PromptStore {
    settings: PromptStoreSettings,
    id: ModelIdentity,
    hp: HParams,
    /// `IDENTITY-ARITHMETIC`, the start of this store's file names.
    prefix: String,
    entries: HashMap<Key, Entry>,
    /// How many entries have each token count (the lengths a lookup stops at).
    lengths: BTreeMap<usize, usize>,
    notices: Vec<String>,
}

/// The arithmetic part of a file name: the GPU's `fast` rows differ from the CPU's, its `exact` ones
/// do not (docs/arithmetic.md).
pub fn arithmetic_key(arithmetic: Option<crate::backend::arithmetic::Arithmetic>) -> &'static str {
    arithmetic.map_or("exact", |a| a.as_str())
}

impl PromptStore {
    /// Opens (creates) the directory and indexes this model's files. Files of other models or
    /// arithmetic are left alone; one of ours that does not read back is skipped with a notice.
    pub fn open(
        settings: PromptStoreSettings,
        id: ModelIdentity,
        hp: HParams,
        arithmetic: &str,
    ) -> Result<PromptStore, String> {
        std::fs::create_dir_all(&settings.dir)
            .map_err(|e| format!("prompt cache: cannot create {}: {e}", settings.dir.display()))?;
        let mut store = PromptStore {
            prefix: format!("{}-{arithmetic}", id.to_text()),
            settings,
            id,
            hp,
            entries: HashMap::new(),
            lengths: BTreeMap::new(),
            notices: Vec::new(),
        };
        let rd = std::fs::read_dir(&store.settings.dir)
            .map_err(|e| format!("prompt cache: cannot read {}: {e}", store.settings.dir.display()))?;
        let mut names: Vec<String> = rd
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        for name in names {
            if atomic::is_temporary(&name) {
                store.remove_stale_temporary(&name);
                continue;
            }
            let Some((kind, key)) = store.parse_name(&name) else {
                continue;
            };
            let path = store.settings.dir.join(&name);
            match snapshot::read_tokens(&path, store.id, &store.hp) {
                Ok(tokens) if (tokens.len(), snapshot::token_hash(&tokens)) == key => {
                    store.insert(key, Entry { tokens, path, kind })
                }
                Ok(_) => store.notices.push(format!(
                    "prompt cache: skipped {name}: its tokens do not match its name"
                )),
                Err(e) => store.notices.push(format!("prompt cache: skipped {name}: {e}")),
            }
        }
        Ok(store)
    }

    /// Deletes `name` when it is the temporary file of one of this store's writes whose writer no
    /// longer runs (a server killed mid-write), so crashes do not fill the disk. Only where `/proc`
    /// says which processes run; a live writer's file is left alone.
    fn remove_stale_temporary(&mut self, name: &str) {
        let Some((file, pid)) = name
            .strip_prefix('.')
            .and_then(|n| n.strip_suffix(".tmp"))
            .and_then(|n| n.rsplit_once('.'))
        else {
            return;
        };
        let proc = Path::new("/proc");
        if self.parse_name(file).is_some()
            && pid.parse::<u32>().is_ok()
            && proc.join("self").exists()
            && !proc.join(pid).exists()
        {
            let _ = std::fs::remove_file(self.settings.dir.join(name));
        }
    }

    /// The kind and key a file name of this store gives; None for other files.
    fn parse_name(&self, name: &str) -> Option<(StoredKind, Key)> {
        let rest = name.strip_prefix(&self.prefix)?.strip_prefix('-')?;
        let rest = rest.strip_suffix(&format!(".{}", budget::SNAPSHOT_EXT))?;
        let mut parts = rest.split('-');
        let kind = StoredKind::parse(parts.next()?)?;
        let hash = u64::from_str_radix(parts.next()?, 16).ok()?;
        let n: usize = parts.next()?.parse().ok()?;
        parts.next().is_none().then_some((kind, (n, hash)))
    }

    fn file_name(&self, kind: StoredKind, (n, hash): Key) -> String {
        format!(
            "{}-{}-{hash:016x}-{n}.{}",
            self.prefix,
            kind.name(),
            budget::SNAPSHOT_EXT
        )
    }

    fn insert(&mut self, key: Key, entry: Entry) {
        if self.entries.insert(key, entry).is_none() {
            *self.lengths.entry(key.0).or_default() += 1;
        }
    }

    fn remove(&mut self, key: Key) -> Option<Entry> {
        let e = self.entries.remove(&key)?;
        if let Some(c) = self.lengths.get_mut(&key.0) {
            *c -= 1;
            if *c == 0 {
                self.lengths.remove(&key.0);
            }
        }
        Some(e)
    }

    pub fn settings(&self) -> &PromptStoreSettings {
        &self.settings
    }

    /// Stored prefixes of this model.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether exactly `tokens` are stored.
    pub fn contains(&self, tokens: &[u32]) -> bool {
        let key = (tokens.len(), snapshot::token_hash(tokens));
        self.entries.get(&key).is_some_and(|e| e.tokens == tokens)
    }

    /// The length of the longest stored prefix of `prompt` (0: none).
    pub fn longest_prefix(&self, prompt: &[u32]) -> usize {
        let mut h = Hasher::default();
        let mut hashed = 0;
        let mut best = 0;
        for &n in self.lengths.range(1..=prompt.len()).map(|(n, _)| n) {
            for t in &prompt[hashed..n] {
                h.update(&t.to_le_bytes());
            }
            hashed = n;
            if self
                .entries
                .get(&(n, h.finish()))
                .is_some_and(|e| e.tokens == prompt[..n])
            {
                best = n;
            }
        }
        best
    }

    /// Reads the stored state of `prompt[..n]` (a length `longest_prefix` gave) and marks it used.
    /// A file that no longer reads back (damaged, deleted by another process's budget) leaves the
    /// index with a notice and gives None.
    pub fn load(&mut self, prompt: &[u32], n: usize) -> Option<CacheRows> {
        let key = (n, snapshot::token_hash(&prompt[..n]));
        let path = self.entries.get(&key)?.path.clone();
        match snapshot::load(&path, self.id, &self.hp) {
            Ok(s) if s.tokens == prompt[..n] => Some(s.rows),
            Ok(_) => {
                self.drop_entry(key, "it holds other tokens than its name says");
                None
            }
            Err(e) => {
                self.drop_entry(key, &e);
                None
            }
        }
    }

    fn drop_entry(&mut self, key: Key, why: &str) {
        if let Some(e) = self.remove(key) {
            let name = e
                .path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            self.notices.push(format!("prompt cache: skipped {name}: {why}"));
        }
    }

    /// Stores the state of `tokens` (`rows`) unless it is shorter than [`MIN_STORED_TOKENS`] or
    /// already stored (then it is only marked used). A `Turn` supersedes the stored turns that are
    /// its prefixes (the same conversation, earlier). Then the budget is enforced over the whole
    /// directory. A failed write is a notice; the store stays as it was.
    pub fn save(&mut self, tokens: &[u32], rows: &CacheRows, kind: StoredKind) {
        if tokens.len() < MIN_STORED_TOKENS {
            return;
        }
        let key = (tokens.len(), snapshot::token_hash(tokens));
        if let Some(e) = self.entries.get(&key).filter(|e| e.tokens == tokens) {
            budget::touch(&e.path);
            return;
        }
        let path = self.settings.dir.join(self.file_name(kind, key));
        if let Err(e) = snapshot::save(&path, self.id, &self.hp, tokens, rows) {
            self.notices.push(format!("prompt cache: {e}"));
            return;
        }
        self.insert(
            key,
            Entry {
                tokens: tokens.to_vec(),
                path,
                kind,
            },
        );
        if kind == StoredKind::Turn {
            let superseded: Vec<Key> = self
                .entries
                .iter()
                .filter(|(k, e)| k.0 < key.0 && e.kind == StoredKind::Turn && tokens.starts_with(&e.tokens))
                .map(|(k, _)| *k)
                .collect();
            for k in superseded {
                if let Some(e) = self.remove(k) {
                    let _ = std::fs::remove_file(&e.path);
                }
            }
        }
        self.enforce_budget();
    }

    /// Deletes the least recently used files of the directory (any model's) until the budget holds,
    /// and forgets ours that went.
    fn enforce_budget(&mut self) {
        let evicted = budget::enforce(&self.settings.dir, self.settings.budget, None);
        if evicted.is_empty() {
            return;
        }
        let gone: Vec<Key> = self
            .entries
            .iter()
            .filter(|(_, e)| evicted.contains(&e.path))
            .map(|(k, _)| *k)
            .collect();
        for k in gone {
            self.remove(k);
        }
    }

    /// A notice of the caller's about the store (a stored state its session could not import).
    pub fn push_notice(&mut self, notice: String) {
        self.notices.push(notice);
    }

    /// The notices since the last call (files skipped, writes that failed).
    pub fn take_notices(&mut self) -> Vec<String> {
        std::mem::take(&mut self.notices)
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.settings.dir
    }
}
