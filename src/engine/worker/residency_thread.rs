//! The thread that samples how much of the model mapping is resident, at most once a second, and
//! sends `Event::Residency` straight to the client.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::backend::residency::ResidencyProbe;
use crate::engine::events::Event;

pub(super) struct ResidencyThread {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl ResidencyThread {
    pub(super) fn start(mut probe: ResidencyProbe, tx: Sender<Event>) -> ResidencyThread {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name("ds4-residency".into())
            .spawn(move || {
                while !s.load(Ordering::Acquire) {
                    let r = probe.sample();
                    let wait = ResidencyProbe::next_interval(r.probe_time);
                    if tx.send(Event::Residency(r)).is_err() {
                        return;
                    }
                    // Sleep in short steps so stopping is prompt.
                    let until = Instant::now() + wait;
                    while Instant::now() < until && !s.load(Ordering::Acquire) {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                }
            })
            .expect("spawn the residency thread");
        ResidencyThread { stop, thread }
    }

    pub(super) fn stop(self) {
        self.stop.store(true, Ordering::Release);
        let _ = self.thread.join();
    }
}
