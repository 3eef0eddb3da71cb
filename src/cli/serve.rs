//! `ds4-chat serve MODEL`: the OpenAI-compatible server (`serve::`, docs/serve.md). Owns the flags
//! and their checks.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;

use super::CliResult;
use crate::engine::events::{LoadRequest, ModelSource, SamplingParams};
use crate::engine::settings::{self, named};
use crate::model::chat::ThinkMode;
use crate::serve::auth::ApiKey;
use crate::serve::{ServeOptions, TurnDefaults};

/// Seed of the `--demo` model (the chat app's default).
const DEMO_SEED: u64 = 1;

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
    /// Context size in tokens.
    #[arg(short = 'c', long, default_value_t = 32768, allow_negative_numbers = true)]
    pub ctx: i64,
    /// Requests that may wait while one generates; more get 429.
    #[arg(long, default_value_t = 16)]
    pub queue: usize,
    /// Largest request body in bytes; larger get 413.
    #[arg(long, default_value_t = DEFAULT_MAX_BODY)]
    pub max_body_bytes: usize,
    /// Think mode of requests that do not choose one (reasoning_effort, thinking).
    #[command(flatten)]
    pub think: super::ThinkArgs,
    #[command(flatten)]
    pub placement: super::PlacementArgs,
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
    let ctx = named("--ctx", settings::check_ctx(a.ctx, settings::MIN_CLI_CTX, None))?;
    let placement = a.placement.checked()?;
    Ok(ServeOptions {
        addr,
        load: LoadRequest {
            source,
            ctx,
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
            sampling: SamplingParams::default(),
            // ds4's CLI and server think by default.
            think: a.think.requested().unwrap_or(ThinkMode::High),
            max_tokens: u32::MAX,
        },
    })
}

pub fn run(args: Args) -> CliResult {
    crate::serve::run(options(&args)?)
}
