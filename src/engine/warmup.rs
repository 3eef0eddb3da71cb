//! Weight warm-up: fault the model mapping into the page cache before the first prompt needs it,
//! so the first turn does not crawl through 81 GiB of page faults one expert at a time.
//!
//! Several threads take 16 MiB chunks in file order; each chunk is `madvise(WILLNEED)`-ed (one big
//! readahead request) and then read one byte per page, which both waits for the data and maps the
//! page in this process (so later `mincore` passes and decode steps find the PTEs present). Advising
//! per chunk rather than the whole file keeps every request cancellable within one chunk.
//!
//! Policy (the worker's): the warm-up runs in the background while the worker waits for commands
//! and reports progress at 5 Hz. A prompt submitted meanwhile does not wait: the warm-up pauses
//! (within one chunk), the turn runs — faulting in what it touches itself — and the warm-up resumes
//! when the turn ends. Cancel with no turn in flight stops it; a load or shutdown stops it too.
//! GPU copy modes report their streaming to device memory through the same progress fields.
//!
//! Owns the threads and the chunk bookkeeping. Must not decide when to warm (that is the worker).

use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::backend::residency::{MappedRegion, page_size};

/// Bytes per unit of work: large enough for efficient readahead, small enough that pause/stop
/// take effect within tens of milliseconds even on a slow disk.
pub const WARMUP_CHUNK: usize = 16 << 20;

const RUNNING: u8 = 0;
const PAUSED: u8 = 1;
const STOPPED: u8 = 2;

struct Shared {
    region: Arc<dyn MappedRegion>,
    next_chunk: AtomicUsize,
    done_bytes: AtomicU64,
    state: AtomicU8,
    /// Wakes paused threads.
    gate: (Mutex<()>, Condvar),
    clock: Mutex<Clock>,
}

/// Active time: wall time minus paused spans (so GiB/s and ETA ignore the pauses).
struct Clock {
    started: Instant,
    paused_at: Option<Instant>,
    paused_total: Duration,
}

/// A warm-up in progress.
pub struct WarmupJob {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

/// Progress of a warm-up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WarmupStatus {
    pub done_bytes: u64,
    pub total_bytes: u64,
    /// Active (unpaused) time.
    pub elapsed: Duration,
    /// All chunks are done.
    pub finished: bool,
}

/// Threads for a warm-up: page faults wait on I/O, so a few more than cores helps, but more than 8
/// only adds seek contention.
pub fn default_warmup_threads() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get()).clamp(2, 8)
}

impl WarmupJob {
    /// Start warming `region` with `threads` threads (at least 1).
    pub fn start(region: Arc<dyn MappedRegion>, threads: usize) -> WarmupJob {
        let shared = Arc::new(Shared {
            region,
            next_chunk: AtomicUsize::new(0),
            done_bytes: AtomicU64::new(0),
            state: AtomicU8::new(RUNNING),
            gate: (Mutex::new(()), Condvar::new()),
            clock: Mutex::new(Clock {
                started: Instant::now(),
                paused_at: None,
                paused_total: Duration::ZERO,
            }),
        });
        let threads = (0..threads.max(1))
            .map(|i| {
                let s = shared.clone();
                std::thread::Builder::new()
                    .name(format!("ds4-warmup-{i}"))
                    .spawn(move || warm_chunks(&s))
                    .expect("spawn warm-up thread")
            })
            .collect();
        WarmupJob { shared, threads }
    }

    pub fn status(&self) -> WarmupStatus {
        let total = self.shared.region.region().len() as u64;
        let done = self.shared.done_bytes.load(Ordering::Acquire);
        let c = self.shared.clock.lock().unwrap_or_else(|e| e.into_inner());
        let now = c.paused_at.unwrap_or_else(Instant::now);
        WarmupStatus {
            done_bytes: done,
            total_bytes: total,
            elapsed: now.duration_since(c.started).saturating_sub(c.paused_total),
            finished: done >= total,
        }
    }

    /// Hold the threads after their current chunk (a turn is running).
    pub fn pause(&self) {
        if let Some(mut c) = self.switch(RUNNING, PAUSED) {
            c.paused_at = Some(Instant::now());
        }
    }

    pub fn resume(&self) {
        if let Some(mut c) = self.switch(PAUSED, RUNNING) {
            if let Some(p) = c.paused_at.take() {
                c.paused_total += p.elapsed();
            }
            let _g = self.shared.gate.0.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.gate.1.notify_all();
        }
    }

    /// Moves the state from `from` to `to`; the clock, locked, when it did (else another call or
    /// `stop` got there first).
    fn switch(&self, from: u8, to: u8) -> Option<MutexGuard<'_, Clock>> {
        self.shared
            .state
            .compare_exchange(from, to, Ordering::AcqRel, Ordering::Acquire)
            .ok()?;
        Some(self.shared.clock.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Stop after the current chunks and join the threads; returns the final status.
    pub fn stop(mut self) -> WarmupStatus {
        self.shared.state.store(STOPPED, Ordering::Release);
        {
            let _g = self.shared.gate.0.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.gate.1.notify_all();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        self.status()
    }

    /// Wait for every chunk, reporting progress every `tick` through `report` (return false to
    /// stop early). For callers without an event loop (`run`, tests).
    pub fn wait(self, tick: Duration, report: &mut dyn FnMut(&WarmupStatus) -> bool) -> WarmupStatus {
        loop {
            let s = self.status();
            if s.finished || !report(&s) {
                return self.stop();
            }
            std::thread::sleep(tick);
        }
    }
}

impl Drop for WarmupJob {
    fn drop(&mut self) {
        self.shared.state.store(STOPPED, Ordering::Release);
        let _g = self.shared.gate.0.lock().unwrap_or_else(|e| e.into_inner());
        self.shared.gate.1.notify_all();
        // Threads are detached here; each exits after its current chunk.
    }
}

fn warm_chunks(s: &Shared) {
    let bytes = s.region.region();
    let page = page_size();
    let n_chunks = bytes.len().div_ceil(WARMUP_CHUNK);
    loop {
        match s.state.load(Ordering::Acquire) {
            STOPPED => return,
            PAUSED => {
                let g = s.gate.0.lock().unwrap_or_else(|e| e.into_inner());
                // Re-check under the lock so a resume between the load and the wait is not lost;
                // the timeout is a second guard.
                if s.state.load(Ordering::Acquire) == PAUSED {
                    let _ = s.gate.1.wait_timeout(g, Duration::from_millis(100));
                }
                continue;
            }
            _ => {}
        }
        let k = s.next_chunk.fetch_add(1, Ordering::AcqRel);
        if k >= n_chunks {
            return;
        }
        let start = k * WARMUP_CHUNK;
        let chunk = &bytes[start..(start + WARMUP_CHUNK).min(bytes.len())];
        advise_willneed(chunk, page);
        let mut sink = 0u8;
        // One byte per page, starting at the first page boundary inside the chunk (chunks start
        // page aligned for a mapping; the head byte covers an unaligned owned buffer).
        let first = (page - (chunk.as_ptr() as usize % page)) % page;
        if first != 0 {
            // SAFETY: index 0 is in bounds (chunks are non-empty).
            sink ^= unsafe { std::ptr::read_volatile(chunk.as_ptr()) };
        }
        let mut i = first;
        while i < chunk.len() {
            // SAFETY: `i < chunk.len()`; volatile so the read is not optimized away.
            sink ^= unsafe { std::ptr::read_volatile(chunk.as_ptr().add(i)) };
            i += page;
        }
        std::hint::black_box(sink);
        s.done_bytes.fetch_add(chunk.len() as u64, Ordering::AcqRel);
    }
}

/// `madvise(WILLNEED)` over the pages covering `chunk` (advisory: failures are ignored).
fn advise_willneed(chunk: &[u8], page: usize) {
    let start = chunk.as_ptr() as usize / page * page;
    let end = chunk.as_ptr() as usize + chunk.len();
    // SAFETY: advisory call on pages of a live mapping/allocation; it never changes contents.
    unsafe {
        libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_WILLNEED);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::residency::ResidencyProbe;
    use crate::backend::residency::tests::sparse_file;

    #[test]
    fn warms_an_uncached_file_with_monotone_progress() {
        // 40 MiB: three chunks (16 + 16 + 8), so several threads share the work.
        let len = 40 << 20;
        let (path, f) = sparse_file("warmup", len as u64);
        // SAFETY: read-only map of a file this test owns and does not modify.
        let map = unsafe { memmap2::Mmap::map(&f) }.unwrap();
        let map: Arc<dyn MappedRegion> = Arc::new(map);
        let mut probe = ResidencyProbe::whole(map.clone()).with_file(f.try_clone().ok());
        assert_eq!(probe.sample().resident_bytes, 0, "a never-read file is not cached");

        let job = WarmupJob::start(map, 3);
        let mut seen = Vec::new();
        let end = job.wait(Duration::from_millis(1), &mut |s| {
            seen.push(*s);
            true
        });
        assert!(end.finished && end.done_bytes == len as u64, "{end:?}");
        assert!(
            seen.windows(2)
                .all(|w| w[0].done_bytes <= w[1].done_bytes && w[0].elapsed <= w[1].elapsed),
            "progress not monotone"
        );
        assert!(seen.iter().all(|s| s.total_bytes == len as u64));
        assert_eq!(probe.sample().resident_bytes, len as u64);
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn pause_holds_and_stop_cancels() {
        // An anonymous 1 GiB region (64 chunks; reads map the shared zero page, so no RAM is used).
        let len = 1 << 30;
        let anon = memmap2::MmapOptions::new().len(len).map_anon().unwrap();
        let region: Arc<dyn MappedRegion> = Arc::new(anon.make_read_only().unwrap());
        let job = WarmupJob::start(region, 2);
        job.pause();
        // Whatever chunk each thread was in finishes; after that nothing moves.
        std::thread::sleep(Duration::from_millis(50));
        let a = job.status();
        std::thread::sleep(Duration::from_millis(100));
        let b = job.status();
        assert_eq!(a.done_bytes, b.done_bytes, "progress while paused");
        assert_eq!(a.elapsed, b.elapsed, "clock ran while paused");
        assert!(a.done_bytes < len as u64, "finished before the pause took effect");
        job.resume();
        let end = job.stop();
        assert!(end.done_bytes <= len as u64);
        // A fresh job runs to completion.
        let region: Arc<dyn MappedRegion> = Arc::new(vec![1u8; 3 << 20]);
        let end = WarmupJob::start(region, 2).wait(Duration::from_millis(1), &mut |_| true);
        assert_eq!((end.done_bytes, end.finished), (3 << 20, true));
    }
}
