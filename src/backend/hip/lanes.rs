//! Launch lanes: side streams that run a sublayer's independent chains beside the main stream
//! (kernels/README.md "Concurrent chains"). A chain is forked after the launches it depends on and
//! joined before the first launch that reads its results, each by one event: the side stream waits
//! for an event recorded on the main stream, and the main stream for one recorded on the side.
//! While the main stream captures the decode graph, the same events make each chain a parallel
//! branch of the graph (`Stream::wait_event`), so a replay runs the branches at once without a
//! single extra node.
//!
//! The chains write disjoint buffers (each sublayer names what its chains own), so running them at
//! once gives the same bits as running them in order: lanes change only when kernels run, never
//! what they compute, in both arithmetic modes. `DS4_HIP_LANES=0` (or a launch profile, which times
//! launches one at a time) issues everything on the main stream.
//!
//! Owns the side streams and their events; `Pass::fork` / `Pass::join` use them.

use super::runtime::{Event, HipContext, HipResult, Stream};
use crate::backend::knobs;

/// Environment variable that turns the side lanes off (`0`: every launch on the main stream).
pub const LANES_ENV: &str = "DS4_HIP_LANES";

/// Side lanes a sublayer uses at most (the attention sublayer's compressor, indexer compressor
/// and indexer query chains).
pub(super) const SIDE_LANES: usize = 3;

/// Whether `DS4_HIP_LANES` leaves the side lanes on (anything but `0`).
pub(super) fn lanes_enabled() -> bool {
    knobs::switch_on(LANES_ENV)
}

/// The side streams of a session and the events that fork and join them: none when lanes are off.
pub(super) struct Lanes {
    side: Vec<SideLane>,
}

struct SideLane {
    stream: Stream,
    /// Recorded on the main stream, waited for by this lane: the chain's start.
    fork: Event,
    /// Recorded on this lane, waited for by the main stream: the chain's end.
    join: Event,
}

impl Lanes {
    /// `SIDE_LANES` side streams when `on`, else none (every chain then runs on the main stream).
    pub(super) fn new(hip: &HipContext, on: bool) -> HipResult<Lanes> {
        let side = if on {
            (0..SIDE_LANES)
                .map(|_| {
                    Ok(SideLane {
                        stream: hip.stream()?,
                        fork: hip.event(false)?,
                        join: hip.event(false)?,
                    })
                })
                .collect::<HipResult<Vec<_>>>()?
        } else {
            Vec::new()
        };
        Ok(Lanes { side })
    }

    /// Whether chains run on side streams.
    pub(super) fn on(&self) -> bool {
        !self.side.is_empty()
    }

    /// Side lane `k`'s stream, `None` when lanes are off.
    pub(super) fn stream(&self, k: usize) -> Option<&Stream> {
        self.side.get(k).map(|l| &l.stream)
    }

    /// Start side lane `k` after everything issued so far on `main`.
    pub(super) fn fork(&self, k: usize, main: &Stream) -> HipResult<()> {
        let Some(l) = self.side.get(k) else { return Ok(()) };
        l.fork.record(main)?;
        l.stream.wait_event(&l.fork)
    }

    /// Make `main`'s later work wait for everything issued so far on side lane `k`.
    pub(super) fn join(&self, k: usize, main: &Stream) -> HipResult<()> {
        let Some(l) = self.side.get(k) else { return Ok(()) };
        l.join.record(&l.stream)?;
        main.wait_event(&l.join)
    }
}
