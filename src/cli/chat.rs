//! The default command: `ds4-chat MODEL.gguf` (or `--demo`, or `--remote URL`) opens the chat TUI.
//!
//! Owns the flags, their merge over the config file, the no-model message and starting the worker
//! (the engine's, or the remote one on an OpenAI-compatible server).
//! The UI itself is `tui::`.

use super::CliResult;
use crate::engine::events::{Command, LoadRequest, ModelSource};
use crate::engine::loader::EngineLoader;
use crate::engine::settings::named;
use crate::engine::worker::Worker;
use crate::remote::RemoteTarget;
use crate::sessions::store::Store;
use crate::tui::app::App;
use crate::tui::app::sessions::{OpenWhich, SessionsState};
use crate::tui::config::{self, Config};
use crate::tui::{self, EngineLink};

#[derive(clap::Args, Debug, Default)]
pub struct Args {
    /// GGUF model file.
    pub model: Option<std::path::PathBuf>,
    /// Run on a tiny generated model of the real architecture (random answers).
    #[arg(long)]
    pub demo: bool,
    /// Seed of the generated demo model.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub demo_seed: u64,
    /// Context size in tokens.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub ctx: Option<i64>,
    #[command(flatten)]
    pub placement: super::PlacementArgs,
    #[command(flatten)]
    pub think: super::ThinkArgs,
    #[command(flatten)]
    pub generation: super::GenerationArgs,
    /// Chat with an OpenAI-compatible server (vLLM, SGLang, llama-server, ds4-server, `ds4-chat
    /// serve`) instead of a local model, e.g. http://gpu-box:8000/v1.
    #[arg(long, value_name = "URL")]
    pub remote: Option<String>,
    /// With --remote: the served model to ask for (default: the first the server lists).
    #[arg(long = "model", value_name = "NAME")]
    pub remote_model: Option<String>,
    /// With --remote: the environment variable holding the API key (sent as a Bearer token).
    #[arg(long, value_name = "VAR")]
    pub api_key_env: Option<String>,
    #[command(flatten)]
    pub config: super::ConfigArg,
    /// Print the config file path and exit.
    #[arg(long)]
    pub print_config: bool,
    /// Open the most recent kept session of this model file.
    #[arg(long, conflicts_with = "session")]
    pub resume: bool,
    /// Open the kept session ID (or its number in /sessions).
    #[arg(long, value_name = "ID")]
    pub session: Option<String>,
}

/// How to get a model, printed when none is given.
pub const NO_MODEL_HELP: &str = "no model given.
  Get the GGUF from Hugging Face (antirez/deepseek-v4-gguf; the q2 file, ~81 GiB):
    hf download antirez/deepseek-v4-gguf \\
      DeepSeek-V4-Flash-IQ2XXS-w2Q2K-AProjQ8-SExpQ8-OutQ8-chat-v2-imatrix.gguf --local-dir .
  then run:  ds4-chat DeepSeek-V4-Flash-IQ2XXS-w2Q2K-AProjQ8-SExpQ8-OutQ8-chat-v2-imatrix.gguf
  or try the app on a tiny generated model (random answers):  ds4-chat --demo";

/// Applies the flags over `c` (flags win). Errors name the flag.
pub fn apply_flags(mut c: Config, a: &Args) -> Result<Config, String> {
    if let Some(v) = a.ctx {
        c.ctx = named("--ctx", config::parse_ctx(v))?;
    }
    a.placement.apply(&mut c)?;
    a.think.apply(&mut c);
    a.generation.apply(&mut c)?;
    if let Some(v) = &a.remote {
        c.remote.url = Some(v.clone());
    }
    if let Some(v) = &a.remote_model {
        c.remote.model = Some(v.clone());
    }
    if let Some(v) = &a.api_key_env {
        c.remote.api_key_env = Some(v.clone());
    }
    Ok(c)
}

/// Starts the engine worker with the application loader; it loads the model on `Command::Load`.
pub fn spawn_engine() -> EngineLink {
    EngineLink::from_worker(Worker::spawn(Box::new(EngineLoader::new())))
}

/// The app, its engine link and a setup error to report on exit.
type Opened = (App, Option<EngineLink>, Option<String>);

/// The app on the in-process engine (a model file or `--demo`).
fn open_local(config: Result<Config, String>, args: &Args) -> Result<Opened, String> {
    let source = match (&args.model, args.demo) {
        (Some(_), true) => return Err("give either a model file or --demo, not both".into()),
        (Some(p), false) => ModelSource::File(p.clone()),
        (None, true) => ModelSource::Demo { seed: args.demo_seed },
        (None, false) => return Err(NO_MODEL_HELP.into()),
    };
    if let ModelSource::File(p) = &source
        && !p.is_file()
    {
        return Err(format!("{}: no such model file", p.display()));
    }
    let label = match &source {
        ModelSource::File(p) => p
            .file_name()
            .map_or_else(|| p.display().to_string(), |n| n.to_string_lossy().into()),
        ModelSource::Demo { seed } => format!("demo model (seed {seed})"),
    };
    Ok(match config {
        Err(e) => (App::failed(Config::default(), label, e.clone()), None, Some(e)),
        Ok(cfg) => {
            let load = LoadRequest {
                source,
                ctx: cfg.ctx,
                backend: cfg.backend,
                weights: cfg.weights,
                arithmetic: cfg.arithmetic,
                threads: cfg.threads,
            };
            let link = spawn_engine();
            let _ = link.commands.send(Command::Load(load.clone()));
            let _ = link.commands.send(Command::SetSampling(cfg.sampling.clone()));
            let _ = link.commands.send(Command::SetSpeculate(cfg.speculate));
            let _ = link
                .commands
                .send(Command::SetSpeculateSampling(cfg.speculate_sampling));
            let _ = link.commands.send(Command::SetDspark(cfg.dspark.clone()));
            let budget = cfg.sessions_budget;
            let mut app = App::new(cfg, label, Some(load));
            app.sessions = SessionsState::new(Store::default_location(), budget);
            app.sessions.pending_open = match (&args.session, args.resume) {
                (Some(id), _) => Some(OpenWhich::Named(id.clone())),
                (None, true) => Some(OpenWhich::Latest),
                (None, false) => None,
            };
            (app, Some(link), None)
        }
    })
}

/// The app on an OpenAI-compatible server at `url` (`--remote`, or `[remote] url`).
fn open_remote(config: Result<Config, String>, url: String) -> Opened {
    let label = format!("remote {url}");
    let target = config.and_then(|cfg| {
        let r = &cfg.remote;
        let target = RemoteTarget::new(&url, r.model.clone(), r.api_key_env.as_deref(), r.timeout_secs)?;
        Ok((cfg, target))
    });
    match target {
        Err(e) => (App::failed(Config::default(), label, e.clone()), None, Some(e)),
        Ok((cfg, target)) => {
            let link = EngineLink::from_worker(crate::remote::spawn(target));
            (App::new(cfg, label, None), Some(link), None)
        }
    }
}

pub fn run(args: Args) -> CliResult {
    if args.print_config {
        match args.config.path() {
            Some(p) => println!("{}", p.display()),
            None => return Err("no home directory: cannot place the config file (use --config FILE)".into()),
        }
        return Ok(());
    }
    let local = args.model.is_some() || args.demo;
    if local && args.remote.is_some() {
        return Err("give one of a model file, --demo or --remote".into());
    }
    if local && (args.remote_model.is_some() || args.api_key_env.is_some()) {
        return Err("--model and --api-key-env name what to ask a --remote server for".into());
    }
    // A bad config file or flag opens the UI with the error (and the same error on exit).
    let config = args.config.load(Config::default()).and_then(|c| apply_flags(c, &args));
    let remote_url = match &config {
        Ok(c) if !local => c.remote.url.clone(),
        _ => args.remote.clone().filter(|_| !local),
    };
    let (app, engine, setup_error) = match remote_url {
        Some(url) => open_remote(config, url),
        None => open_local(config, &args)?,
    };
    if !std::io::IsTerminal::is_terminal(&std::io::stdout()) {
        return Err(setup_error.unwrap_or_else(|| {
            "the chat app needs a terminal (stdout is not a tty); `ds4-chat run` generates headlessly".into()
        }));
    }
    let app = tui::run(app, engine)?;
    if let Some(e) = setup_error {
        return Err(e);
    }
    if let tui::app::Phase::Failed(e) = app.phase {
        return Err(e);
    }
    Ok(())
}
