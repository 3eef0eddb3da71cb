//! `ds4-chat serve MODEL`: the OpenAI-compatible server (`serve::`, docs/serve.md). Owns the flags
//! and their checks.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;

use super::CliResult;
use crate::engine::events::{LoadRequest, ModelSource};
use crate::engine::prompt_store::PromptStoreSettings;
use crate::serve::auth::ApiKey;
use crate::serve::{ServeOptions, TurnDefaults};

/// Seed of the `--demo` model (the chat app's default).
const DEMO_SEED: u64 = 1;

/// The prompt cache's directory under the data directory (docs/serve.md#prompt-cache).
const PROMPT_CACHE_DIR: &str = "prompt-cache";

/// Default request body limit (a 1M-token prompt is about 4 MB of text).
const DEFAULT_MAX_BODY: usize = 8 << 20;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Model file (ds4 GGUF).
    #[arg(required_unless_present = "demo")]
    pub model: Option<PathBuf>,
    /// Serve the tiny generated demo model (random text; for trying clients) instead of a file.
    #[arg(long, conflicts_with = "model")]
    pub demo: bool,
    /// Address to listen on; anything but loopback needs --api-key-env.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port, printed at start).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Environment variable holding the API key clients must send as `Authorization: Bearer KEY`.
    #[arg(long, value_name = "VAR")]
    pub api_key_env: Option<String>,
    /// The model's name in the API (default: the file name without .gguf).
    #[arg(long)]
    pub model_name: Option<String>,
    /// Context size in tokens (2 ..= 1048576) [default: 32768].
    #[arg(short = 'c', long, value_name = "N", allow_negative_numbers = true)]
    pub ctx: Option<i64>,
    /// Requests that may wait while one generates; more get 429.
    #[arg(long, default_value_t = 16)]
    pub queue: usize,
    /// Largest request body in bytes; larger get 413.
    #[arg(long, default_value_t = DEFAULT_MAX_BODY)]
    pub max_body_bytes: usize,
    /// Disk budget of the prompt cache in GiB (KV snapshots of prompt prefixes in the data
    /// directory, kept across requests and restarts); 0 turns it off [default: 8].
    #[arg(long, value_name = "GIB")]
    pub prompt_cache_gib: Option<f64>,
    /// Think mode of requests that do not choose one (reasoning_effort, thinking).
    #[command(flatten)]
    pub think: super::ThinkArgs,
    #[command(flatten)]
    pub placement: super::PlacementArgs,
    #[command(flatten)]
    pub config: super::ConfigArg,
}

/// `--host` and `--port` as one address (a name such as `localhost` is resolved).
fn resolve(host: &str, port: u16) -> Result<SocketAddr, String> {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("--host {host}: {e}"))?
        .next()
        .ok_or_else(|| format!("--host {host}: resolves to no address"))
}

fn options(a: &Args) -> Result<ServeOptions, String> {
    let (source, file_id) = match (&a.model, a.demo) {
        (Some(p), false) if p.is_file() => (
            ModelSource::File(p.clone()),
            p.file_stem().map(|s| s.to_string_lossy().into_owned()),
        ),
        (Some(p), false) => return Err(format!("{}: no such model file", p.display())),
        (None, true) => (ModelSource::Demo { seed: DEMO_SEED }, Some("ds4-demo".to_string())),
        _ => return Err("give a model file or --demo".into()),
    };
    let key = match &a.api_key_env {
        Some(var) => ApiKey::from_env(var)?,
        None => ApiKey::none(),
    };
    let model_id = a.model_name.clone().or(file_id).unwrap_or_else(|| "ds4".to_string());
    let addr = resolve(&a.host, a.port)?;
    // The config file's settings, with no answer limit unless it sets `max_tokens`; the flags win.
    let base = super::Config {
        max_tokens: u32::MAX,
        ..Default::default()
    };
    let mut c = a.config.load(base)?;
    super::apply_cli_ctx(a.ctx, &mut c)?;
    a.placement.apply(&mut c)?;
    a.think.apply(&mut c);
    if let Some(v) = a.prompt_cache_gib {
        c.prompt_cache_budget =
            crate::tui::config::parse_budget_gib(v).map_err(|e| format!("--prompt-cache-gib: {e}"))?;
    }
    let placement = super::placement_of(&c);
    Ok(ServeOptions {
        addr,
        load: LoadRequest {
            source,
            ctx: c.ctx,
            backend: placement.backend,
            weights: placement.weights,
            arithmetic: placement.arithmetic,
            threads: placement.threads,
        },
        model_id,
        key,
        queue: a.queue,
        max_body: a.max_body_bytes,
        defaults: TurnDefaults {
            // Requests that set none of these get the config's (ds4's defaults; thinking on).
            sampling: c.sampling.clone(),
            think: c.think,
            max_tokens: c.max_tokens,
        },
        speculate: c.speculate,
        speculate_sampling: c.speculate_sampling,
        dspark: c.dspark.clone(),
        prompt_cache: prompt_cache(c.prompt_cache_budget),
    })
}

/// The prompt cache's place, `prompt-cache` in the data directory; None when the budget is 0 or
/// there is no data directory (no home).
fn prompt_cache(budget: u64) -> Option<PromptStoreSettings> {
    if budget == 0 {
        return None;
    }
    let Some(data) = crate::sessions::store::data_dir() else {
        eprintln!("ds4-chat serve: no data directory (no home directory and no DS4_DATA_DIR): prompt cache off");
        return None;
    };
    Some(PromptStoreSettings {
        dir: data.join(PROMPT_CACHE_DIR),
        budget,
    })
}

pub fn run(args: Args) -> CliResult {
    crate::serve::run(options(&args)?)
}
