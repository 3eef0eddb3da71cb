//! Slash commands: the table (each command named once, with its argument hint, help line and
//! handler) that also feeds the help screen and Tab completion, the handlers, and one small value
//! parser per command that takes an argument.
//!
//! Owns `SLASH_COMMANDS`, what Enter does with the typed line (`App::enter`) and completion.

use std::path::PathBuf;

use super::transcript;
use super::{App, Item, Phase};
use crate::engine::events::{Command, ModelInfo};
use crate::engine::settings;
use crate::model::chat::ThinkMode;
use crate::tui::config;
use crate::tui::effect::Effect;

/// A command's handler: the app, the command's name (for messages) and the argument (trimmed).
pub type Handler = fn(&mut App, &'static str, &str) -> Vec<Effect>;

/// One slash command.
#[derive(Clone, Copy, Debug)]
pub struct SlashCommand {
    pub name: &'static str,
    /// Other names that run it (not completed, not listed).
    pub aliases: &'static [&'static str],
    /// Argument hint ("" when it takes none).
    pub arg: &'static str,
    pub help: &'static str,
    /// Refused while an answer is in flight.
    pub needs_idle: bool,
    pub run: Handler,
}

const fn cmd(name: &'static str, arg: &'static str, help: &'static str, run: Handler) -> SlashCommand {
    SlashCommand {
        name,
        aliases: &[],
        arg,
        help,
        needs_idle: false,
        run,
    }
}

const fn idle_only(c: SlashCommand) -> SlashCommand {
    SlashCommand { needs_idle: true, ..c }
}

/// Every slash command, in the help screen's order.
pub const SLASH_COMMANDS: &[SlashCommand] = &[
    cmd("/help", "", "show keys and commands", |app, _, _| {
        app.show_help = true;
        Vec::new()
    }),
    cmd("/think", "", "reasoning on (high)", |app, _, _| {
        app.set_think(ThinkMode::High)
    }),
    cmd("/nothink", "", "reasoning off", |app, _, _| {
        app.set_think(ThinkMode::Off)
    }),
    cmd("/think-max", "", "max reasoning (big ctx)", |app, _, _| {
        app.set_think(ThinkMode::Max)
    }),
    cmd("/system", "TEXT", "system prompt (none)", App::system_command),
    cmd("/temp", "X", "temperature (0 greedy)", |app, name, arg| {
        let applied = temp_value(arg).map(|x| app.config.sampling.temperature = x);
        app.set_sampling(name, arg, applied)
    }),
    cmd("/top-p", "X", "nucleus mass (0, 1]", |app, name, arg| {
        let applied = top_p_value(arg).map(|x| app.config.sampling.top_p = x);
        app.set_sampling(name, arg, applied)
    }),
    cmd("/min-p", "X", "min-p cut [0, 1]", |app, name, arg| {
        let applied = min_p_value(arg).map(|x| app.config.sampling.min_p = x);
        app.set_sampling(name, arg, applied)
    }),
    cmd("/seed", "N", "seed (random: none)", |app, name, arg| {
        match seed_value(arg) {
            Ok(seed) => {
                app.config.sampling.seed = seed;
                let what = seed.map_or("seed: random".to_string(), |s| format!("seed {s}"));
                app.sampling_changed(what)
            }
            Err(e) => app.error_status(format!("{name}: {e}")),
        }
    }),
    idle_only(cmd(
        "/ctx",
        "N",
        "new session of N tokens",
        |app, name, arg| match ctx_value(arg, app.metrics.model.as_ref()) {
            Ok(ctx) => app.change_context(ctx),
            Err(e) => app.error_status(format!("{name}: {e}")),
        },
    )),
    cmd("/clear", "", "forget conversation", |app, _, _| app.clear()),
    idle_only(cmd("/retry", "", "regenerate last answer", App::retry)),
    idle_only(cmd("/edit", "", "edit last message", App::edit_last)),
    cmd("/save", "FILE", "save as .json or .md", App::save_command),
    cmd("/sessions", "", "list kept sessions", App::sessions_command),
    cmd("/load", "N|ID", "open a kept session", App::load_command),
    cmd("/new", "", "start a new session", App::new_command),
    cmd("/delete", "N|ID", "delete a kept session", App::delete_command),
    cmd("/rename", "TEXT", "rename this session", App::rename_command),
    SlashCommand {
        aliases: &["/exit", "/q"],
        ..cmd("/quit", "", "leave", |app, _, _| {
            app.should_quit = true;
            Vec::new()
        })
    },
];

/// The command called `name` (or one of its aliases).
pub fn find(name: &str) -> Option<&'static SlashCommand> {
    SLASH_COMMANDS
        .iter()
        .find(|c| c.name == name || c.aliases.contains(&name))
}

/// `/temp X`: the sampling temperature.
pub fn temp_value(arg: &str) -> Result<f32, String> {
    settings::parse_temp(arg)
}

/// `/top-p X`: the nucleus mass.
pub fn top_p_value(arg: &str) -> Result<f32, String> {
    settings::parse_top_p(arg)
}

/// `/min-p X`: the min-p cut.
pub fn min_p_value(arg: &str) -> Result<f32, String> {
    settings::parse_min_p(arg)
}

/// `/seed N`: a fixed seed, or random (no argument, or "random").
pub fn seed_value(arg: &str) -> Result<Option<u64>, String> {
    if arg.is_empty() || arg == "random" {
        return Ok(None);
    }
    settings::parse_seed(arg).map(Some)
}

/// `/ctx N`: the context size in tokens, within the loaded model's context length.
pub fn ctx_value(arg: &str, model: Option<&ModelInfo>) -> Result<u32, String> {
    settings::parse_app_ctx(arg, model.map(|m| m.context_length))
}

impl App {
    /// Enter in the input box: runs a slash command or sends the message.
    pub(super) fn enter(&mut self) -> Vec<Effect> {
        let text = self.input.text.trim_end().to_string();
        if text.trim().is_empty() {
            return Vec::new();
        }
        if text.starts_with('/') {
            self.input.take();
            self.history.push(text.clone());
            self.history_pos = None;
            return self.slash(&text);
        }
        match self.phase {
            // While loading the turn is queued behind `Load` in the worker's command channel.
            Phase::Busy | Phase::Cancelling => {
                self.status = Some("generating — Esc cancels".into());
                Vec::new()
            }
            _ => {
                self.input.take();
                self.history.push(text.clone());
                self.history_pos = None;
                self.submit(text)
            }
        }
    }

    /// Runs a slash command line.
    pub fn slash(&mut self, line: &str) -> Vec<Effect> {
        let (name, arg) = match line.split_once(char::is_whitespace) {
            Some((c, a)) => (c, a.trim()),
            None => (line, ""),
        };
        let Some(command) = find(name) else {
            return self.error_status(format!("unknown command {name} (/help lists them)"));
        };
        if command.needs_idle && self.is_busy() {
            return self.error_status(format!("{}: wait for the answer or press Esc", command.name));
        }
        (command.run)(self, command.name, arg)
    }

    /// Slash commands matching what is typed (for completion hints).
    pub fn slash_matches(&self) -> Vec<&'static SlashCommand> {
        let t = self.input.text.as_str();
        if !t.starts_with('/') || t.contains(char::is_whitespace) {
            return Vec::new();
        }
        SLASH_COMMANDS.iter().filter(|c| c.name.starts_with(t)).collect()
    }

    /// Tab on a partly typed command: completes it (and a space when it takes an argument), or
    /// extends it to the longest prefix the matches share.
    pub(super) fn complete_slash(&mut self) {
        let m = self.slash_matches();
        if let Some(first) = m.first() {
            let text = if m.len() == 1 {
                format!("{}{}", first.name, if first.arg.is_empty() { "" } else { " " })
            } else {
                m.iter().fold(first.name.to_string(), |acc, c| {
                    acc.chars()
                        .zip(c.name.chars())
                        .take_while(|(a, b)| a == b)
                        .map(|(a, _)| a)
                        .collect()
                })
            };
            self.input.set(&text);
        }
    }

    fn sampling_changed(&mut self, what: String) -> Vec<Effect> {
        self.status = Some(what);
        vec![Effect::Engine(Command::SetSampling(self.config.sampling.clone()))]
    }

    /// Reports a sampling setting: applied (the value was stored) or why not.
    fn set_sampling(&mut self, name: &str, arg: &str, applied: Result<(), String>) -> Vec<Effect> {
        match applied {
            Ok(()) => self.sampling_changed(format!("{name} {arg}")),
            Err(e) => self.error_status(format!("{name}: {e}")),
        }
    }

    fn set_think(&mut self, t: ThinkMode) -> Vec<Effect> {
        self.config.think = t;
        let mut msg = format!("thinking: {}", config::think_name(t));
        if t == ThinkMode::Max && self.metrics.endpoint().is_none() && self.config.ctx < 393_216 {
            msg.push_str(" (needs ctx >= 393216; the engine will use high)");
        }
        self.status = Some(msg);
        Vec::new()
    }

    fn system_command(&mut self, _name: &'static str, arg: &str) -> Vec<Effect> {
        if arg.is_empty() {
            let cur = if self.config.system.is_empty() {
                "(none)".to_string()
            } else {
                self.config.system.clone()
            };
            self.note(format!("system prompt: {cur}"), false);
        } else if arg == "none" {
            self.config.system.clear();
            self.status = Some("system prompt cleared".into());
        } else {
            self.config.system = arg.to_string();
            self.status = Some("system prompt set".into());
        }
        Vec::new()
    }

    /// `/ctx N`: clears the conversation and asks the worker for a context of `ctx` tokens.
    fn change_context(&mut self, ctx: u32) -> Vec<Effect> {
        if self.metrics.endpoint().is_some() {
            return self.error_status("/ctx: the server sets the context of a remote model".into());
        }
        self.config.ctx = ctx;
        let mut effects = self.clear();
        if let Some(mut load) = self.load.clone() {
            load.ctx = ctx;
            self.load = Some(load.clone());
            self.phase = Phase::Loading;
            effects.push(Effect::Engine(Command::Load(load)));
        }
        self.status = Some(format!("context {ctx}: new session, conversation cleared"));
        effects
    }

    /// Session tokens after the turn before `idx` (what a rewind keeps).
    fn tokens_before(&self, idx: usize) -> u32 {
        self.items[..idx]
            .iter()
            .rev()
            .find_map(|i| match i {
                Item::Turn(t) => Some(t.stats.context_after.unwrap_or(0)),
                _ => None,
            })
            .unwrap_or(0)
    }

    /// Removes the last turn (and the notes after it); returns its user message and the session
    /// tokens to keep.
    fn take_last_turn(&mut self) -> Option<(String, u32)> {
        let idx = self.last_turn_index()?;
        let keep = self.tokens_before(idx);
        let Item::Turn(t) = self.items.remove(idx) else {
            unreachable!("last_turn_index points at a turn")
        };
        self.items.truncate(idx);
        Some((t.user, keep))
    }

    fn retry(&mut self, name: &'static str, _arg: &str) -> Vec<Effect> {
        let Some((user, keep)) = self.take_last_turn() else {
            return self.error_status(format!("{name}: nothing to regenerate"));
        };
        let mut effects = vec![Effect::Engine(Command::Rewind { keep_tokens: keep })];
        effects.extend(self.submit(user));
        effects
    }

    fn edit_last(&mut self, name: &'static str, _arg: &str) -> Vec<Effect> {
        let Some((user, keep)) = self.take_last_turn() else {
            return self.error_status(format!("{name}: no message to edit"));
        };
        self.input.set(&user);
        self.metrics.context_used = keep;
        self.status = Some("editing the last message; Enter resends".into());
        vec![Effect::Engine(Command::Rewind { keep_tokens: keep })]
    }

    /// `/save FILE`: the conversation as markdown (`.md`) or JSON (anything else), written by the
    /// run loop; the outcome comes back as `AppEvent::TranscriptSaved`.
    fn save_command(&mut self, name: &'static str, arg: &str) -> Vec<Effect> {
        if arg.is_empty() {
            return self.error_status(format!("{name}: give a file name (.json or .md)"));
        }
        let path = PathBuf::from(arg);
        match transcript::render(&self.conversation_for_export(), &path) {
            Ok(contents) => {
                self.status = Some(format!("saving {arg}…"));
                vec![Effect::SaveTranscript { path, contents }]
            }
            Err(e) => self.error_status(format!("{name}: {e}")),
        }
    }
}
