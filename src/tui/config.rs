//! The chat app's configuration file (`~/.config/ds4-chat/config.toml`) and its validation.
//!
//! Owns the file format (documented in `config/default.toml`), its location and the one-line errors
//! for unknown keys and bad values. Command-line flags are applied on top by `cli::chat`. Must not
//! start the engine or touch the terminal.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::engine::events::{BackendChoice, SamplingParams, WeightPlacement};
use crate::model::chat::ThinkMode;

/// Smallest and largest context the app accepts (DeepSeek V4 Flash is trained to 1M tokens).
pub const MIN_CTX: u32 = 256;
pub const MAX_CTX: u32 = 1 << 20;

/// ds4's CLI default system prompt (spec §6.1), used when the file has no `system` key.
pub const DEFAULT_SYSTEM: &str = "You are a helpful assistant";

/// Colour scheme of the UI.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Theme {
    #[default]
    Dark,
    Light,
}

/// The file as written: every key optional, unknown keys rejected.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    ctx: Option<i64>,
    backend: Option<String>,
    weights: Option<String>,
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
}

/// The resolved settings of one app run (file defaults, then file values, then CLI flags).
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub ctx: u32,
    pub backend: BackendChoice,
    pub weights: WeightPlacement,
    pub threads: usize,
    pub think: ThinkMode,
    /// Empty string: no system prompt.
    pub system: String,
    pub sampling: SamplingParams,
    pub max_tokens: u32,
    pub side_panel: bool,
    pub theme: Theme,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            ctx: 32768,
            backend: BackendChoice::Auto,
            weights: WeightPlacement::Auto,
            threads: 0,
            think: ThinkMode::High,
            system: DEFAULT_SYSTEM.to_string(),
            sampling: SamplingParams::default(),
            max_tokens: 16384,
            side_panel: true,
            theme: Theme::Dark,
        }
    }
}

/// Where the config file lives (`directories` project dirs; `None` when no home directory is known).
pub fn config_path() -> Option<PathBuf> {
    directories::ProjectDirs::from("", "", "ds4-chat").map(|d| d.config_dir().join("config.toml"))
}

/// Reads the config file at `path`; a missing file gives the defaults.
pub fn load(path: &Path) -> Result<Config, String> {
    match std::fs::read_to_string(path) {
        Ok(text) => parse(&text).map_err(|e| format!("config {}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Config::default()),
        Err(e) => Err(format!("config {}: cannot read: {e}", path.display())),
    }
}

/// Parses and validates config text. Errors are one line and name the key.
pub fn parse(text: &str) -> Result<Config, String> {
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
    let mut c = Config::default();
    if let Some(v) = file.ctx {
        c.ctx = parse_ctx(v).map_err(|e| format!("key `ctx`: {e}"))?;
    }
    if let Some(v) = file.backend {
        c.backend = parse_backend(&v).map_err(|e| format!("key `backend`: {e}"))?;
    }
    if let Some(v) = file.weights {
        c.weights = parse_weights(&v).map_err(|e| format!("key `weights`: {e}"))?;
    }
    if let Some(v) = file.threads {
        c.threads = usize::try_from(v)
            .ok()
            .filter(|&t| t <= 4096)
            .ok_or_else(|| format!("key `threads`: {v} is out of range (0 ..= 4096)"))?;
    }
    if let Some(v) = file.think {
        c.think = parse_think(&v).map_err(|e| format!("key `think`: {e}"))?;
    }
    if let Some(v) = file.system {
        c.system = v;
    }
    if let Some(v) = file.temp {
        c.sampling.temperature = check_temp(v).map_err(|e| format!("key `temp`: {e}"))?;
    }
    if let Some(v) = file.top_p {
        c.sampling.top_p = check_top_p(v).map_err(|e| format!("key `top_p`: {e}"))?;
    }
    if let Some(v) = file.top_k {
        c.sampling.top_k = u32::try_from(v)
            .ok()
            .filter(|&k| k <= 1024)
            .ok_or_else(|| format!("key `top_k`: {v} is out of range (0 ..= 1024)"))?;
    }
    if let Some(v) = file.min_p {
        c.sampling.min_p = check_min_p(v).map_err(|e| format!("key `min_p`: {e}"))?;
    }
    if let Some(v) = file.seed {
        c.sampling.seed = Some(u64::try_from(v).map_err(|_| format!("key `seed`: {v} is negative"))?);
    }
    if let Some(v) = file.max_tokens {
        c.max_tokens = u32::try_from(v)
            .ok()
            .filter(|&m| m >= 1)
            .ok_or_else(|| format!("key `max_tokens`: {v} is out of range (1 ..= {})", u32::MAX))?;
    }
    if let Some(v) = file.side_panel {
        c.side_panel = v;
    }
    if let Some(v) = file.theme {
        c.theme = v;
    }
    Ok(c)
}

pub fn parse_ctx(v: i64) -> Result<u32, String> {
    if (MIN_CTX as i64..=MAX_CTX as i64).contains(&v) {
        Ok(v as u32)
    } else {
        Err(format!("{v} is out of range ({MIN_CTX} ..= {MAX_CTX})"))
    }
}

pub fn parse_backend(s: &str) -> Result<BackendChoice, String> {
    match s {
        "auto" => Ok(BackendChoice::Auto),
        "hip" => Ok(BackendChoice::Hip),
        "cpu" => Ok(BackendChoice::Cpu),
        _ => Err(format!("\"{s}\" is not one of auto, hip, cpu")),
    }
}

pub fn parse_weights(s: &str) -> Result<WeightPlacement, String> {
    match s {
        "auto" => Ok(WeightPlacement::Auto),
        "copy" => Ok(WeightPlacement::Copy),
        "map" => Ok(WeightPlacement::Map),
        _ => Err(format!("\"{s}\" is not one of auto, copy, map")),
    }
}

pub fn parse_think(s: &str) -> Result<ThinkMode, String> {
    match s {
        "off" | "none" => Ok(ThinkMode::Off),
        "high" | "on" => Ok(ThinkMode::High),
        "max" => Ok(ThinkMode::Max),
        _ => Err(format!("\"{s}\" is not one of off, high, max")),
    }
}

/// Temperature: 0 (greedy) ..= 10, finite.
pub fn check_temp(v: f64) -> Result<f32, String> {
    if v.is_finite() && (0.0..=10.0).contains(&v) {
        Ok(v as f32)
    } else {
        Err(format!("{v} is out of range (0 ..= 10)"))
    }
}

/// Nucleus mass: (0, 1].
pub fn check_top_p(v: f64) -> Result<f32, String> {
    if v.is_finite() && v > 0.0 && v <= 1.0 {
        Ok(v as f32)
    } else {
        Err(format!("{v} is out of range (0 < top_p <= 1)"))
    }
}

/// Min-p cut relative to the top token: [0, 1].
pub fn check_min_p(v: f64) -> Result<f32, String> {
    if v.is_finite() && (0.0..=1.0).contains(&v) {
        Ok(v as f32)
    } else {
        Err(format!("{v} is out of range (0 ..= 1)"))
    }
}

pub fn think_name(t: ThinkMode) -> &'static str {
    match t {
        ThinkMode::Off => "off",
        ThinkMode::High => "high",
        ThinkMode::Max => "max",
    }
}

pub fn backend_name(b: BackendChoice) -> &'static str {
    match b {
        BackendChoice::Auto => "auto",
        BackendChoice::Hip => "hip",
        BackendChoice::Cpu => "cpu",
    }
}

pub fn weights_name(w: WeightPlacement) -> &'static str {
    match w {
        WeightPlacement::Auto => "auto",
        WeightPlacement::Copy => "copy",
        WeightPlacement::Map => "map",
    }
}
