//! The decode step: one token through the launch sequence of `layers.rs`, captured once into a
//! graph and replayed at every position (`DS4_HIP_GRAPH=0`: direct launches of the same kernels),
//! the step parameters the host writes before it (position and token ids, one asynchronous copy
//! from pinned memory), and the next token picked on the device (greedy and the default min-p path),
//! of which 8 bytes come back.
//!
//! A captured step bakes in every device pointer of the session; they live as long as the backend,
//! so the graph is never re-captured.

use crate::backend::{BackendError, DevicePick, DeviceSample};

use super::acts::{Acts, STEP_TOKENS};
use super::kernels::{self, Launch};
use super::pass::{Pass, dev};
use super::runtime::{CaptureMode, GraphExec, PinnedBuffer, Stream};
use crate::backend::knobs;

/// Environment variable that turns the captured decode graph off (`0`: direct launches).
pub const GRAPH_ENV: &str = "DS4_HIP_GRAPH";

/// Whether `DS4_HIP_GRAPH` leaves the decode graph on (anything but `0`).
pub(super) fn graph_enabled() -> bool {
    knobs::switch_on(GRAPH_ENV)
}

/// A launch sequence captured as a graph (the decode step, a verify or commit of the block verify),
/// and the kernel launches one replay runs.
pub(super) struct DecodeGraph {
    exec: GraphExec,
    pub(super) launches: u64,
}

impl DecodeGraph {
    /// Capture the one-token sequence of `pass` (step parameters read from the device at replay).
    /// The launches issued while capturing are not counted; each replay counts them.
    pub(super) fn capture(pass: &Pass) -> Result<DecodeGraph, BackendError> {
        DecodeGraph::capture_launches(pass, "the decode graph", || pass.forward_tokens(1, true, None))
    }

    /// Capture the launches `issue` makes on `pass`'s stream (`what` names the graph in errors):
    /// the decode step, and the block verify's passes (session/verify.rs). The sequence must read
    /// every position from the step parameters (layers.rs), as a replay runs at any position.
    pub(super) fn capture_launches(
        pass: &Pass,
        what: &str,
        issue: impl FnOnce() -> Result<(), BackendError>,
    ) -> Result<DecodeGraph, BackendError> {
        let before = pass.acts.launches.get();
        pass.stream.begin_capture(CaptureMode::ThreadLocal).map_err(dev)?;
        let issued = issue();
        let captured = pass.stream.end_capture();
        let hint = |e: String| BackendError::Device(format!("capturing {what}: {e} (set {GRAPH_ENV}=0)"));
        issued.map_err(|e| hint(e.to_string()))?;
        let exec = captured
            .and_then(|g| g.instantiate())
            .map_err(|e| hint(e.to_string()))?;
        let launches = pass.acts.launches.get() - before;
        pass.acts.launches.set(before);
        Ok(DecodeGraph { exec, launches })
    }

    /// One replay (step parameters already written) on `stream`.
    pub(super) fn replay(&self, acts: &Acts, stream: &Stream) -> Result<(), BackendError> {
        self.exec.launch(stream).map_err(dev)?;
        acts.launches.set(acts.launches.get() + self.launches);
        Ok(())
    }
}

/// Write the step parameters of a batch of `tokens` at `pos0` to the device through the pinned
/// `staging` buffer: one asynchronous copy, stream-ordered before the launches that read it. The
/// staging buffer is rewritten only after the stream has passed the last copy (every eval and
/// sample ends with a synchronize).
pub(super) fn write_step(
    acts: &mut Acts,
    staging: &mut PinnedBuffer,
    stream: &Stream,
    pos0: usize,
    tokens: &[u32],
) -> Result<(), BackendError> {
    let host = staging.as_mut_slice();
    host[..4].copy_from_slice(&(pos0 as u32).to_le_bytes());
    let ids = &mut host[4 * STEP_TOKENS..];
    for (dst, t) in ids.chunks_exact_mut(4).zip(tokens) {
        dst.copy_from_slice(&t.to_le_bytes());
    }
    let bytes = 4 * (STEP_TOKENS + tokens.len());
    acts.step.copy_from_pinned_async(0, staging, bytes, stream).map_err(dev)
}

/// The launches that pick the next token from `acts.logits` into `acts.sampled`: one exact kernel
/// (fast mode runs its twin, `kernels::fast_twin`), or in fast mode the min-p draw's two launches
/// (`kernels::sample_min_p_fast`).
pub(super) fn sample_launches(acts: &Acts, n_vocab: usize, how: DeviceSample, fast: bool) -> Vec<Launch> {
    let (out, logits) = (acts.sampled.ptr().0, acts.logits.ptr().0);
    let n = n_vocab as u32;
    match how {
        DeviceSample::Greedy => vec![kernels::argmax(out, logits, n)],
        DeviceSample::MinP {
            temperature,
            min_p,
            u01,
        } => {
            if fast {
                kernels::sample_min_p_fast(out, logits, n, temperature, min_p, u01).to_vec()
            } else {
                vec![kernels::sample_min_p(out, logits, n, temperature, min_p, u01)]
            }
        }
    }
}

/// The token [`sample_launches`] picked, through the pinned `staging` buffer (synchronizes).
pub(super) fn read_pick(acts: &Acts, staging: &mut PinnedBuffer, stream: &Stream) -> Result<DevicePick, BackendError> {
    let bytes = 4 * kernels::SAMPLE_OUT_WORDS;
    acts.sampled
        .copy_to_pinned_async(0, staging, bytes, stream)
        .map_err(dev)?;
    stream.synchronize().map_err(dev)?;
    let w = staging.as_slice();
    let word = |i: usize| u32::from_le_bytes([w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]]);
    Ok(DevicePick {
        token: word(0),
        drew: word(1) != 0,
    })
}
