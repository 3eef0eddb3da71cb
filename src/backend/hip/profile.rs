//! Per-kernel device time of the HIP forward pass, for performance work: with `DS4_HIP_PROFILE=1`
//! every launch is bracketed by two timing events, and when the backend is dropped a table of
//! device milliseconds per kernel (calls, total, share) goes to stderr. Costs two event records per
//! launch, so it is off by default. `DS4_HIP_PROFILE=shapes` keeps one row per kernel and launch
//! shape (grid and integer arguments), which tells apart the matrices one matvec kernel serves.
//! Owns only the timing; must not change what is launched.

use std::cell::RefCell;
use std::collections::BTreeMap;

use super::kernels::Launch;
use super::runtime::{Event, HipContext, Stream};

/// Environment variable that turns the profile on.
pub const PROFILE_ENV: &str = "DS4_HIP_PROFILE";

#[derive(Default)]
struct Totals {
    calls: u64,
    ms: f64,
}

/// A table row: the kernel, and in the per-shape mode its launch shape (`Launch::shape`).
type Key = (&'static str, String);
/// Start and stop events of one launch, and its row.
type Bracket = (Event, Event, Key);

/// Launch timings; inert unless enabled.
pub struct LaunchProfile {
    ctx: Option<HipContext>,
    /// Event pairs, reused across steps; `used` of them are recorded and not yet read.
    events: RefCell<(Vec<Bracket>, usize)>,
    totals: RefCell<BTreeMap<Key, Totals>>,
    by_shape: bool,
}

impl LaunchProfile {
    /// Whether launches are being timed (`DS4_HIP_PROFILE=1`).
    pub fn is_on(&self) -> bool {
        self.ctx.is_some()
    }

    pub fn from_env(ctx: &HipContext) -> LaunchProfile {
        let mode = crate::backend::knobs::value(PROFILE_ENV)
            .ok()
            .flatten()
            .unwrap_or_default();
        let by_shape = mode == "shapes";
        LaunchProfile {
            ctx: (mode == "1" || by_shape).then(|| ctx.clone()),
            events: RefCell::new((Vec::new(), 0)),
            totals: RefCell::new(BTreeMap::new()),
            by_shape,
        }
    }

    /// Time `enqueue` (which enqueues `launch` on `stream`) under the launch's kernel, and in the
    /// per-shape mode its shape too.
    pub fn time<T, E>(&self, launch: &Launch, stream: &Stream, enqueue: impl FnOnce() -> Result<T, E>) -> Result<T, E> {
        let Some(ctx) = &self.ctx else { return enqueue() };
        let mut ev = self.events.borrow_mut();
        let i = ev.1;
        if i == ev.0.len() {
            match (ctx.event(true), ctx.event(true)) {
                (Ok(a), Ok(b)) => ev.0.push((a, b, (launch.kernel.name, String::new()))),
                _ => return enqueue(),
            }
        }
        let shape = if self.by_shape { launch.shape() } else { String::new() };
        ev.0[i].2 = (launch.kernel.name, shape);
        let _ = ev.0[i].0.record(stream);
        let r = enqueue();
        let _ = ev.0[i].1.record(stream);
        ev.1 += 1;
        r
    }

    /// Fold the recorded launches into the totals (after the stream was synchronized).
    pub fn collect(&self) {
        if self.ctx.is_none() {
            return;
        }
        let mut ev = self.events.borrow_mut();
        let mut totals = self.totals.borrow_mut();
        for (start, stop, key) in &ev.0[..ev.1] {
            if let Ok(ms) = stop.elapsed_ms_since(start) {
                let t = totals.entry(key.clone()).or_default();
                t.calls += 1;
                t.ms += ms as f64;
            }
        }
        ev.1 = 0;
    }

    /// The table, largest total first.
    pub fn report(&self) -> String {
        let totals = self.totals.borrow();
        let sum: f64 = totals.values().map(|t| t.ms).sum();
        let mut rows: Vec<_> = totals.iter().collect();
        rows.sort_by(|a, b| b.1.ms.total_cmp(&a.1.ms));
        let mut out = format!("{PROFILE_ENV}: device time per kernel ({sum:.1} ms in all)\n");
        for ((name, shape), t) in rows {
            out.push_str(&format!(
                "  {name:<28}{shape} {:>8} calls {:>10.2} ms {:>6.1}% {:>8.2} us/call\n",
                t.calls,
                t.ms,
                100.0 * t.ms / sum.max(1e-9),
                1e3 * t.ms / t.calls.max(1) as f64
            ));
        }
        out
    }
}

impl Drop for LaunchProfile {
    fn drop(&mut self) {
        if self.is_on() && !self.totals.borrow().is_empty() {
            eprint!("{}", self.report());
        }
    }
}
