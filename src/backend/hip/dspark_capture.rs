//! The device side of DSpark's target-row capture (docs/dspark.md#capture): after each target
//! layer of a batch, one `ds4_copy_spans` launch copies the HC state (n_hc × n_embd floats a token,
//! the layer's output) of the batch's last `keep` tokens at most (the host capture keeps no more)
//! into that target's slot of `rows`; the session then reads them back and hands them to the host
//! capture (`backend::cpu::dspark_capture`), which takes the mean over the streams in the CPU
//! reference's order. A session makes one only when a drafter is attached, so a session without
//! one launches nothing more.
//!
//! The copy's source and length are in a span table on the device, one entry per (target, HC
//! buffer, batch size): a launch names its entry by address, so the decode graph and the verify
//! graphs (captured once per batch size, `decode.rs`) replay it unchanged, and the HC buffer a
//! batch ends a layer in (`Pass::advance_hc`, fixed for a batch size and arithmetic) picks its
//! entry when the launch is issued.
//!
//! Owns the capture buffers and their span table; what is kept on the host and when is
//! `session/dspark.rs`'s.

use super::kernels::{self, COPY_SPAN_WORDS, DevPtr};
use super::runtime::{DeviceBuffer, HipContext, HipResult};

/// The HC rows of the target layers of the last batch, on the device.
pub(super) struct DeviceCapture {
    /// The target layers (main-model layer indices), in the drafter's order.
    targets: Vec<usize>,
    n_max: usize,
    /// Rows a slot holds: the last `min(n, slot_rows)` of a batch of n.
    slot_rows: usize,
    hc_dim: usize,
    /// targets × slot_rows × hc_dim floats: target slot s, row r at `(s · slot_rows + r) · hc_dim`.
    rows: DeviceBuffer,
    /// `COPY_SPAN_WORDS` u64 per entry, entry `(s · 2 + alt) · n_max + n − 1` copying the kept rows
    /// of a batch of n from the HC buffer `alt` (0 `hc`, 1 `hc_alt`) into slot s.
    table: DeviceBuffer,
}

impl DeviceCapture {
    /// Buffers for `targets` of a session whose batches take up to `n_max` tokens of `hc_dim`
    /// floats each, the HC state living in `hc` or `hc_alt`, keeping a batch's last `keep` rows.
    pub(super) fn new(
        hip: &HipContext,
        targets: &[usize],
        (n_max, keep): (usize, usize),
        hc_dim: usize,
        [hc, hc_alt]: [DevPtr; 2],
    ) -> HipResult<DeviceCapture> {
        let slot_rows = n_max.min(keep.max(1));
        let rows = hip.alloc(4 * targets.len() * slot_rows * hc_dim)?;
        let mut words = Vec::with_capacity(COPY_SPAN_WORDS * 2 * targets.len() * n_max);
        for s in 0..targets.len() {
            let dst = rows.ptr().0 + (4 * s * slot_rows * hc_dim) as u64;
            for base in [hc, hc_alt] {
                for n in 1..=n_max {
                    let kept = n.min(slot_rows);
                    let src = base + (4 * (n - kept) * hc_dim) as u64;
                    words.extend([src, dst, (kept * hc_dim) as u64]);
                }
            }
        }
        let table = hip.upload(&words)?;
        Ok(DeviceCapture {
            targets: targets.to_vec(),
            n_max,
            slot_rows,
            hc_dim,
            rows,
            table,
        })
    }

    /// The target layers, in the drafter's order.
    pub(super) fn targets(&self) -> &[usize] {
        &self.targets
    }

    /// Rows of a batch of `n` the slots hold: its last ones.
    pub(super) fn kept_rows(&self, n: usize) -> usize {
        n.min(self.slot_rows)
    }

    /// The launch that copies the kept rows of a batch of `n` of layer `layer`'s output (in
    /// `hc_alt` when `in_alt`) into its slot; `None` when `layer` is not a target.
    pub(super) fn copy_launch(&self, layer: usize, in_alt: bool, n: usize) -> Option<kernels::Launch> {
        let s = self.targets.iter().position(|&t| t == layer)?;
        assert!(
            n >= 1 && n <= self.n_max,
            "capture of {n} rows, buffers for {}",
            self.n_max
        );
        let entry = (2 * s + usize::from(in_alt)) * self.n_max + n - 1;
        let at = self.table.ptr().0 + (8 * COPY_SPAN_WORDS * entry) as u64;
        Some(kernels::copy_spans(at, 1))
    }

    /// Read the first `dst.len() / hc_dim` rows of target slot `slot` (the last batch's kept rows)
    /// into `dst` (synchronous).
    pub(super) fn read(&self, slot: usize, dst: &mut [f32]) -> HipResult<()> {
        self.rows.copy_to_host(4 * slot * self.slot_rows * self.hc_dim, dst)
    }

    /// Device bytes held.
    pub(super) fn len_bytes(&self) -> usize {
        self.rows.len_bytes() + self.table.len_bytes()
    }
}
