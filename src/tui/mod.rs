//! The terminal UI: `App` state updated by pure functions that return effects, one event channel,
//! a pure render function and one file per widget (the ratatui template's app / event / tui / ui
//! split). The run loop here is the only place effects are performed.
//!
//! Owns everything drawn on the terminal. Layer: above `engine` and `remote`, beside `serve`
//! (src/lib.rs). Talks to the engine only through `engine::events::{Command, Event}`; never blocks on
//! it (the worker runs on its own thread).

pub mod app;
pub mod config;
pub mod effect;
pub mod event;
pub mod session_io;
pub mod terminal;
pub mod ui;
pub mod widgets;

use std::sync::mpsc::Sender;
use std::time::{Duration, Instant};

use app::App;
use effect::Effect;
use event::{AppEvent, EventHub};

use crate::engine::events::{Command, Event};

/// Frame interval while something changes (30 fps cap).
pub const FRAME: Duration = Duration::from_millis(33);
/// Longest the exit waits for the last turn's KV snapshot.
const SNAPSHOT_WAIT: Duration = Duration::from_secs(5);
/// How long an idle loop sleeps on the channel before looking again.
pub const IDLE_WAIT: Duration = Duration::from_secs(1);

/// Runs on the forwarder thread and hands every engine event to the callback until the engine's
/// channel closes or the callback returns false.
pub type EventPump = Box<dyn FnOnce(&mut dyn FnMut(Event) -> bool) + Send>;

/// The two ends of a running engine worker.
pub struct EngineLink {
    pub commands: Sender<Command>,
    pub events: EventPump,
}

impl EngineLink {
    /// A link owning the engine worker (it lives on the forwarder thread until its events end).
    pub fn from_worker(worker: crate::engine::worker::Worker) -> EngineLink {
        EngineLink {
            commands: worker.sender(),
            events: Box::new(move |f| {
                for ev in worker.events().iter() {
                    if !f(ev) {
                        return;
                    }
                }
            }),
        }
    }
}

/// Runs the app until the user quits or a signal arrives; the terminal is restored on every path.
/// Returns the final state (for the exit message).
pub fn run(mut app: App, engine: Option<EngineLink>) -> Result<App, String> {
    let mut terminal = terminal::init().map_err(|e| format!("cannot set up the terminal: {e}"))?;
    let mut hub = EventHub::new();
    hub.spawn_input();
    if let Err(e) = hub.spawn_signals() {
        app.status = Some(format!("signal handling unavailable: {e}"));
    }
    let commands = engine.map(|e| {
        hub.spawn_engine_forwarder(e.events);
        e.commands
    });
    let result = event_loop(&mut terminal, &mut app, &hub, commands.as_ref());
    // The conversation is kept on every way out: the snapshot of its last turn is waited for (a
    // little), then the session file is written.
    let deadline = Instant::now() + SNAPSHOT_WAIT;
    while app.sessions.snapshot_pending && Instant::now() < deadline {
        if let Some(AppEvent::Engine(ev @ Event::SnapshotSaved { .. })) = hub.next(FRAME) {
            let _ = app.update(AppEvent::Engine(ev));
        }
    }
    for effect in app.save_session() {
        if let Effect::Session(store, op) = effect {
            session_io::perform(&store, op);
        }
    }
    if let Some(c) = &commands {
        let _ = c.send(Command::Shutdown);
    }
    let restored = terminal::restore().map_err(|e| format!("cannot restore the terminal: {e}"));
    result.and(restored).map(|()| app)
}

fn event_loop(
    terminal: &mut terminal::Tui,
    app: &mut App,
    hub: &EventHub,
    commands: Option<&Sender<Command>>,
) -> Result<(), String> {
    let io = |e: std::io::Error| format!("terminal: {e}");
    let size = terminal.size().map_err(io)?;
    // The first size goes through the channel like every later one; the first frame follows it.
    let _ = hub.sender().send(AppEvent::Resize(size.width, size.height));
    let mut dirty = false;
    let mut last_draw = Instant::now() - FRAME;
    // Lets the end-to-end test check that a panic restores the terminal (read once, not per frame).
    let panic_after_first_frame =
        crate::backend::knobs::switch(crate::backend::knobs::TEST_PANIC, false).unwrap_or(false);
    loop {
        if dirty && last_draw.elapsed() >= FRAME {
            terminal.draw(|f| ui::draw(f, app)).map_err(io)?;
            last_draw = Instant::now();
            dirty = false;
            if panic_after_first_frame {
                panic!("test panic requested by DS4_TEST_PANIC");
            }
        }
        if app.should_quit {
            return Ok(());
        }
        let wait = if dirty {
            FRAME.saturating_sub(last_draw.elapsed())
        } else {
            IDLE_WAIT
        };
        let Some(first) = hub.next(wait) else { continue };
        // Apply everything already queued before drawing again (a token burst is one frame).
        let mut ev = Some(first);
        let mut n = 0;
        while let Some(e) = ev {
            for effect in app.update(e) {
                perform(effect, hub, commands);
            }
            n += 1;
            ev = if n < 4096 { hub.try_next() } else { None };
        }
        dirty = true;
    }
}

/// Performs one effect an update returned; an outcome the app must see comes back as an event.
fn perform(effect: Effect, hub: &EventHub, commands: Option<&Sender<Command>>) {
    match effect {
        Effect::Engine(cmd) => {
            if let Some(c) = commands
                && c.send(cmd).is_err()
            {
                let _ = hub.sender().send(AppEvent::EngineGone);
            }
        }
        Effect::SaveTranscript { path, contents } => {
            let _ = hub.sender().send(effect::save_transcript(path, &contents));
        }
        Effect::CopyToClipboard(text) => {
            let _ = terminal::copy_to_clipboard(&text);
        }
        Effect::Session(store, op) => {
            let _ = hub.sender().send(AppEvent::Session(session_io::perform(&store, op)));
        }
    }
}
