//! `ds4-chat serve`: an HTTP server on the engine worker speaking OpenAI's chat completions and
//! Anthropic's Messages API, with tool calls (docs/serve.md).
//!
//! One concept per file: `server` (state, start-up, accept loop), `routes` (endpoints), `http`
//! (HTTP/1.1 framing on std sockets, head parsing by `httparse`), `request` (body parsing and
//! validation), `completions` (one completion request), `turn` (one engine turn and its figures),
//! `sse` (event stream writer), `responses` (OpenAI JSON shapes), `tools` (tool definitions and
//! `tool_choice`), `calls` (a reply split into text and calls), `anthropic` (the Messages API),
//! `queue` (one generation at a time), `disconnect` (hang-up watcher), `auth` (bind policy and API
//! key), `replies` (reasoning of recent answers for cache reuse), `error` (API errors). Layer:
//! above `engine`, beside `tui` (src/lib.rs). Must not draw anything (`tui::`) nor reach the
//! backends except through the worker.

pub mod anthropic;
pub mod auth;
pub mod calls;
pub mod completions;
pub mod disconnect;
pub mod error;
pub mod http;
pub mod queue;
pub mod replies;
pub mod request;
pub mod responses;
pub mod routes;
pub mod server;
pub mod sse;
pub mod tools;
pub mod turn;

pub use server::{ServeOptions, TurnDefaults, run};
