//! The front ends, end to end: the terminal app (rendered and driven through tmux), `doctor`,
//! `tokenize`, the flags and configuration file (and docs/configuration.md against the code),
//! `serve` against the OpenAI and Anthropic clients (tool loops on a scripted engine), its prompt
//! cache across restarts and under load and faults, `--remote`, and sessions surviving a kill.
//!
//! One test binary of modules, so the crate is linked once for all of them (tests/README.md).

#[path = "../common/mod.rs"]
mod common;
#[path = "../support/mod.rs"]
mod support;
#[path = "../tmux_common/mod.rs"]
mod tmux_common;
#[path = "../tui_common/mod.rs"]
mod tui_common;

mod cli_bench;
mod cli_doctor;
mod cli_tokenize;
mod dspark_support;
mod remote_tmux;
mod serve_api;
mod serve_process;
mod serve_prompt_cache;
mod serve_soak;
mod serve_tools;
mod sessions_kill;
mod settings_cli;
mod tui_app;
mod tui_config;
mod tui_render;
mod tui_sessions;
mod tui_tmux;
