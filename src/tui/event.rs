//! One event channel for the app: an input thread (keys, paste, mouse, resize), a forwarder of the
//! engine's events, a signal thread (SIGTERM/SIGHUP) and the run loop itself (the outcome of an
//! effect it performed, the first terminal size) all feed it, and the main loop blocks on it with a
//! timeout (so an idle app sleeps; there is no tick: nothing on screen changes without an event).
//!
//! Owns only threads and the channel; decisions are `App`'s.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread;
use std::time::Duration;

use crossterm::event::{self as ct, KeyEvent, MouseEvent};

use crate::engine::events::Event;

/// Everything the main loop reacts to.
#[derive(Debug)]
pub enum AppEvent {
    Key(KeyEvent),
    Paste(String),
    Mouse(MouseEvent),
    Resize(u16, u16),
    Engine(Event),
    /// The engine's event channel closed (worker thread ended).
    EngineGone,
    /// SIGTERM or SIGHUP: restore the terminal and leave.
    Signal(i32),
    /// The run loop read or wrote the sessions directory (`Effect::Session`).
    Session(crate::tui::app::sessions::SessionOutcome),
    /// The run loop wrote (or failed to write) a transcript (`Effect::SaveTranscript`).
    TranscriptSaved {
        path: PathBuf,
        result: Result<(), String>,
    },
}

/// The channel and the threads that feed it; dropping it stops the input thread.
pub struct EventHub {
    tx: Sender<AppEvent>,
    rx: Receiver<AppEvent>,
    stop: Arc<AtomicBool>,
    signals: Option<signal_hook::iterator::Handle>,
}

impl Default for EventHub {
    fn default() -> Self {
        Self::new()
    }
}

impl EventHub {
    pub fn new() -> EventHub {
        let (tx, rx) = channel();
        EventHub {
            tx,
            rx,
            stop: Arc::new(AtomicBool::new(false)),
            signals: None,
        }
    }

    pub fn sender(&self) -> Sender<AppEvent> {
        self.tx.clone()
    }

    /// Reads terminal input on its own thread. It polls with a timeout only to notice `stop`.
    pub fn spawn_input(&self) {
        let tx = self.tx.clone();
        let stop = self.stop.clone();
        thread::Builder::new()
            .name("tui-input".into())
            .spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match ct::poll(Duration::from_millis(250)) {
                        Ok(true) => {}
                        Ok(false) => continue,
                        Err(_) => break,
                    }
                    let ev = match ct::read() {
                        Ok(ct::Event::Key(k)) => AppEvent::Key(k),
                        Ok(ct::Event::Paste(s)) => AppEvent::Paste(s),
                        Ok(ct::Event::Mouse(m)) => AppEvent::Mouse(m),
                        Ok(ct::Event::Resize(c, r)) => AppEvent::Resize(c, r),
                        Ok(_) => continue,
                        Err(_) => break,
                    };
                    if tx.send(ev).is_err() {
                        break;
                    }
                }
            })
            .expect("spawn input thread");
    }

    /// Forwards the engine's events into the channel, then `EngineGone`.
    pub fn spawn_engine_forwarder(&self, pump: super::EventPump) {
        let tx = self.tx.clone();
        thread::Builder::new()
            .name("tui-engine-events".into())
            .spawn(move || {
                pump(&mut |ev| tx.send(AppEvent::Engine(ev)).is_ok());
                let _ = tx.send(AppEvent::EngineGone);
            })
            .expect("spawn engine forwarder");
    }

    /// Turns SIGTERM and SIGHUP into `AppEvent::Signal`.
    pub fn spawn_signals(&mut self) -> std::io::Result<()> {
        use signal_hook::consts::{SIGHUP, SIGTERM};
        let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGHUP])?;
        self.signals = Some(signals.handle());
        let tx = self.tx.clone();
        thread::Builder::new().name("tui-signals".into()).spawn(move || {
            for s in signals.forever() {
                if tx.send(AppEvent::Signal(s)).is_err() {
                    return;
                }
            }
        })?;
        Ok(())
    }

    /// Waits up to `timeout` for the next event.
    pub fn next(&self, timeout: Duration) -> Option<AppEvent> {
        self.rx.recv_timeout(timeout).ok()
    }

    /// The next event if one is already queued.
    pub fn try_next(&self) -> Option<AppEvent> {
        self.rx.try_recv().ok()
    }
}

impl Drop for EventHub {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = &self.signals {
            h.close();
        }
    }
}
