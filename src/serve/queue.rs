//! One generation at a time: requests take a ticket and run in ticket order; at most `capacity`
//! wait behind the running one, and a request that finds the queue full is refused (429) at once.
//!
//! Owns the ticket order and the counts `/health` reports. Must not know about the engine.

use std::sync::{Condvar, Mutex};

use super::error::ApiError;

#[derive(Default)]
struct Tickets {
    /// Tickets handed out.
    issued: u64,
    /// Tickets finished: ticket `t` runs when `t == finished`.
    finished: u64,
}

pub struct GenerationQueue {
    tickets: Mutex<Tickets>,
    turn_changed: Condvar,
    capacity: usize,
}

/// The running slot; dropping it lets the next ticket run.
pub struct Slot<'a> {
    queue: &'a GenerationQueue,
}

impl GenerationQueue {
    /// A queue where up to `capacity` requests wait behind the running one.
    pub fn new(capacity: usize) -> GenerationQueue {
        GenerationQueue {
            tickets: Mutex::default(),
            turn_changed: Condvar::new(),
            capacity,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Tickets> {
        self.tickets.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wait for the slot, or 429 when `capacity` requests already wait.
    pub fn acquire(&self) -> Result<Slot<'_>, ApiError> {
        let mut t = self.lock();
        let ahead = t.issued - t.finished;
        if ahead > self.capacity as u64 {
            return Err(ApiError::status(
                429,
                format!(
                    "server busy: one generation runs and {} wait (queue full); retry later",
                    ahead - 1
                ),
            )
            .with_code("rate_limit_exceeded"));
        }
        let mine = t.issued;
        t.issued += 1;
        while t.finished != mine {
            t = self.turn_changed.wait(t).unwrap_or_else(|e| e.into_inner());
        }
        Ok(Slot { queue: self })
    }

    /// (a generation runs, requests waiting).
    pub fn load(&self) -> (bool, u64) {
        let t = self.lock();
        let active = t.issued - t.finished;
        (active > 0, active.saturating_sub(1))
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.queue.lock().finished += 1;
        self.queue.turn_changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn one_runs_capacity_wait_and_the_rest_are_refused_in_order() {
        let q = Arc::new(GenerationQueue::new(1));
        let first = q.acquire().unwrap();
        assert_eq!(q.load(), (true, 0));
        let q2 = q.clone();
        let waiter = std::thread::spawn(move || {
            let _slot = q2.acquire().unwrap();
            q2.load()
        });
        while q.load().1 < 1 {
            std::thread::sleep(Duration::from_millis(2));
        }
        let refused = q.acquire().err().expect("queue of 1 is full");
        assert_eq!(refused.status, 429);
        drop(first);
        assert_eq!(waiter.join().unwrap(), (true, 0));
        assert_eq!(q.load(), (false, 0));
    }
}
