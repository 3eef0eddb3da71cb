//! The chat app's configuration file (`~/.config/ds4-chat/config.toml`) and its validation.
//!
//! Owns the file format (documented in `config/default.toml`), its location and the one-line errors
//! for unknown keys and bad values. Command-line flags are applied on top by `cli::chat`. Must not
//! start the engine or touch the terminal.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::backend::arithmetic::Arithmetic;
use crate::engine::events::{BackendChoice, SamplingParams, WeightsMode};
use crate::engine::speculate::Speculate;
use crate::engine::speculate::accept::SamplingRule;
use crate::engine::speculate::dspark::{DsparkSettings, check_confidence};
use crate::model::chat::ThinkMode;
use crate::model::dspark::DsparkConvention;

use crate::engine::settings::{
    MIN_APP_CTX, check_ctx, check_max_tokens, check_min_p, check_seed, check_temp, check_threads, check_top_k,
    check_top_p, named, parse_backend, parse_think, parse_weights,
};
pub use crate::engine::settings::{backend_name, think_name};

/// The app's context range (`MIN_APP_CTX ..= MAX_CTX`), for the config key and `--ctx`; the model's
/// own length is checked when it is loaded.
pub fn parse_ctx(v: i64) -> Result<u32, String> {
    check_ctx(v, MIN_APP_CTX, None)
}

/// Colour scheme of the UI.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Theme {
    #[default]
    Dark,
    Light,
}

/// The `[remote]` table as written.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileRemote {
    url: Option<String>,
    model: Option<String>,
    api_key_env: Option<String>,
    timeout: Option<i64>,
}

/// An OpenAI-compatible server to chat with instead of a local model (`[remote]`, `--remote`).
#[derive(Clone, Debug, PartialEq)]
pub struct RemoteConfig {
    /// Base URL; `None`: the local engine (unless `--remote` gives one).
    pub url: Option<String>,
    /// Model to ask for; `None`: the first one the server lists.
    pub model: Option<String>,
    /// Environment variable holding the API key (sent as a Bearer token).
    pub api_key_env: Option<String>,
    /// Seconds the server may send nothing before a turn gives up.
    pub timeout_secs: u64,
}

impl Default for RemoteConfig {
    fn default() -> Self {
        RemoteConfig {
            url: None,
            model: None,
            api_key_env: None,
            timeout_secs: crate::remote::target::DEFAULT_TIMEOUT_SECS,
        }
    }
}

/// Longest remote timeout accepted (a day).
pub const MAX_REMOTE_TIMEOUT_SECS: i64 = 86_400;

/// `timeout` of `[remote]`: 1 ..= a day, in seconds.
pub fn check_remote_timeout(v: i64) -> Result<u64, String> {
    if (1..=MAX_REMOTE_TIMEOUT_SECS).contains(&v) {
        Ok(v as u64)
    } else {
        Err(format!("{v} is out of range (1 ..= {MAX_REMOTE_TIMEOUT_SECS} seconds)"))
    }
}

/// The file as written: every key optional, unknown keys rejected.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    ctx: Option<i64>,
    backend: Option<String>,
    weights: Option<String>,
    arithmetic: Option<String>,
    threads: Option<i64>,
    think: Option<String>,
    system: Option<String>,
    temp: Option<f64>,
    top_p: Option<f64>,
    top_k: Option<i64>,
    min_p: Option<f64>,
    seed: Option<i64>,
    max_tokens: Option<i64>,
    side_panel: Option<bool>,
    theme: Option<Theme>,
    remote: Option<FileRemote>,
    sessions_budget_gib: Option<f64>,
    prompt_cache_gib: Option<f64>,
    speculate: Option<String>,
    speculate_sampling: Option<String>,
    dspark: Option<PathBuf>,
    dspark_confidence: Option<f64>,
    dspark_convention: Option<String>,
}

/// The resolved settings of one app run (file defaults, then file values, then CLI flags).
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub ctx: u32,
    pub backend: BackendChoice,
    pub weights: WeightsMode,
    /// The GPU kernels' arithmetic (fast, or exact = bit for bit the CPU engine).
    pub arithmetic: Arithmetic,
    pub threads: usize,
    pub think: ThinkMode,
    /// Empty string: no system prompt.
    pub system: String,
    pub sampling: SamplingParams,
    pub max_tokens: u32,
    pub side_panel: bool,
    pub theme: Theme,
    pub remote: RemoteConfig,
    /// Disk budget of the sessions' KV snapshots, bytes (docs/sessions.md#disk-budget).
    pub sessions_budget: u64,
    /// Disk budget of `serve`'s prompt cache, bytes; 0: off (docs/serve.md#prompt-cache).
    pub prompt_cache_budget: u64,
    /// Speculative decoding's drafter (docs/speculative.md); off: plain decode.
    pub speculate: Speculate,
    /// How drafts are accepted when sampling (docs/speculative.md#acceptance-rules).
    pub speculate_sampling: SamplingRule,
    /// The DSpark drafter's support file, confidence threshold and convention (docs/dspark.md).
    pub dspark: DsparkSettings,
}

/// Default disk budget of the KV snapshots: 4 GiB.
pub const DEFAULT_SESSIONS_BUDGET: u64 = 4 << 30;

/// Default disk budget of `serve`'s prompt cache: 8 GiB (a Flash snapshot of a 20k-token agent
/// context is a few hundred MB).
pub const DEFAULT_PROMPT_CACHE_BUDGET: u64 = 8 << 30;

/// `sessions_budget_gib`, `prompt_cache_gib` and `--prompt-cache-gib`: GiB, 0 (keep no snapshot)
/// up to 1,000,000.
pub fn parse_budget_gib(v: f64) -> Result<u64, String> {
    if !v.is_finite() || !(0.0..=1e6).contains(&v) {
        return Err(format!("{v} is not a size in GiB from 0 to 1000000"));
    }
    Ok((v * (1u64 << 30) as f64) as u64)
}

impl Default for Config {
    fn default() -> Self {
        Config {
            ctx: 32768,
            backend: BackendChoice::Auto,
            weights: WeightsMode::Auto,
            arithmetic: Arithmetic::Fast,
            threads: 0,
            think: ThinkMode::High,
            system: crate::model::chat::DEFAULT_SYSTEM_PROMPT.to_string(),
            sampling: SamplingParams::default(),
            max_tokens: 16384,
            side_panel: true,
            theme: Theme::Dark,
            remote: RemoteConfig::default(),
            sessions_budget: DEFAULT_SESSIONS_BUDGET,
            prompt_cache_budget: DEFAULT_PROMPT_CACHE_BUDGET,
            speculate: Speculate::Off,
            speculate_sampling: SamplingRule::Exact,
            dspark: DsparkSettings::default(),
        }
    }
}

/// Where the config file lives (`directories` project dirs; `None` when no home directory is known).
pub fn config_path() -> Option<PathBuf> {
    directories::ProjectDirs::from("", "", "ds4-chat").map(|d| d.config_dir().join("config.toml"))
}

/// Reads the config file at `path`; a missing file gives the defaults.
pub fn load(path: &Path) -> Result<Config, String> {
    load_over(path, Config::default())
}

/// The config file at `path` over `base` (a subcommand's own defaults, such as `run`'s longer
/// answers); a missing file gives `base`.
pub fn load_over(path: &Path, base: Config) -> Result<Config, String> {
    match std::fs::read_to_string(path) {
        Ok(text) => parse_over(&text, base).map_err(|e| format!("config {}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(base),
        Err(e) => Err(format!("config {}: cannot read: {e}", path.display())),
    }
}

/// Parses and validates config text. Errors are one line and name the key.
pub fn parse(text: &str) -> Result<Config, String> {
    parse_over(text, Config::default())
}

/// The keys of `text` over `base`.
pub fn parse_over(text: &str, base: Config) -> Result<Config, String> {
    let file: FileConfig = toml::from_str(text).map_err(|e| {
        let line = e
            .span()
            .map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1);
        let msg = e.message().replace('\n', " ");
        match line {
            Some(l) => format!("line {l}: {}", msg.trim()),
            None => msg.trim().to_string(),
        }
    })?;
    let mut c = base;
    if let Some(v) = file.ctx {
        c.ctx = named("key `ctx`", parse_ctx(v))?;
    }
    if let Some(v) = file.backend {
        c.backend = named("key `backend`", parse_backend(&v))?;
    }
    if let Some(v) = file.weights {
        c.weights = named("key `weights`", parse_weights(&v))?;
    }
    if let Some(v) = file.arithmetic {
        c.arithmetic = named("key `arithmetic`", Arithmetic::parse(&v))?;
    }
    if let Some(v) = file.threads {
        c.threads = named("key `threads`", check_threads(v))?;
    }
    if let Some(v) = file.think {
        c.think = named("key `think`", parse_think(&v))?;
    }
    if let Some(v) = file.system {
        c.system = v;
    }
    if let Some(v) = file.temp {
        c.sampling.temperature = named("key `temp`", check_temp(v))?;
    }
    if let Some(v) = file.top_p {
        c.sampling.top_p = named("key `top_p`", check_top_p(v))?;
    }
    if let Some(v) = file.top_k {
        c.sampling.top_k = named("key `top_k`", check_top_k(v))?;
    }
    if let Some(v) = file.min_p {
        c.sampling.min_p = named("key `min_p`", check_min_p(v))?;
    }
    if let Some(v) = file.seed {
        c.sampling.seed = Some(named("key `seed`", check_seed(v))?);
    }
    if let Some(v) = file.max_tokens {
        c.max_tokens = named("key `max_tokens`", check_max_tokens(v))?;
    }
    if let Some(v) = file.side_panel {
        c.side_panel = v;
    }
    if let Some(v) = file.theme {
        c.theme = v;
    }
    if let Some(r) = file.remote {
        c.remote.url = r.url;
        c.remote.model = r.model;
        c.remote.api_key_env = r.api_key_env;
        if let Some(v) = r.timeout {
            c.remote.timeout_secs = named("key `remote.timeout`", check_remote_timeout(v))?;
        }
    }
    if let Some(v) = file.sessions_budget_gib {
        c.sessions_budget = named("key `sessions_budget_gib`", parse_budget_gib(v))?;
    }
    if let Some(v) = file.prompt_cache_gib {
        c.prompt_cache_budget = named("key `prompt_cache_gib`", parse_budget_gib(v))?;
    }
    if let Some(v) = file.speculate {
        c.speculate = named("key `speculate`", Speculate::parse(&v))?;
    }
    if let Some(v) = file.speculate_sampling {
        c.speculate_sampling = named("key `speculate_sampling`", SamplingRule::parse(&v))?;
    }
    if let Some(v) = file.dspark {
        c.dspark.path = Some(v);
    }
    if let Some(v) = file.dspark_confidence {
        c.dspark.confidence = named("key `dspark_confidence`", check_confidence(v))?;
    }
    if let Some(v) = file.dspark_convention {
        c.dspark.convention = named("key `dspark_convention`", DsparkConvention::parse(&v))?;
    }
    Ok(c)
}
