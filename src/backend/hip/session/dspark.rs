//! `HipSession`'s DSpark drafter (`DeviceSession::dspark`, docs/dspark.md#on-the-hip-backend): the
//! target rows are captured on the device (`dspark_capture.rs`) and read back after every batch
//! into the CPU drafter's capture (`backend::cpu::dspark_capture`), and the draft stages run on the
//! host (`backend::cpu::dspark`) over the main model's file for the embedding and the LM head.
//!
//! Owns when rows are read back and what the host capture keeps: a batch's last `CAPTURE_ROWS` rows
//! (older ones would be dropped by the capture at once), rows past a commit's kept count dropped,
//! every row dropped by a reset or a restored cache, as the CPU session does.

use std::sync::{Arc, Mutex};

use super::HipSession;
use crate::backend::BackendError;
use crate::backend::cpu::CpuModel;
use crate::backend::cpu::dspark::CAPTURE_ROWS;
use crate::backend::cpu::dspark_capture::Capture;
use crate::backend::dspark::DsparkForward;
use crate::backend::hip::dspark_capture::DeviceCapture;
use crate::backend::hip::pass::{dev, p0};
use crate::model::dspark::{DsparkConvention, DsparkModel};

/// The capture of an attached drafter: the device copies and the host rows the drafter reads.
pub(super) struct SessionCapture {
    pub(super) device: DeviceCapture,
    host: Arc<Mutex<Capture>>,
    /// One target's HC rows read back (rows × hc_dim).
    staging: Vec<f32>,
}

impl HipSession {
    /// Attach DSpark's drafter of `support`: capture its target layers from the next batch on and
    /// run its stages on the host (a second call replaces the first).
    pub(super) fn attach_dspark(
        &mut self,
        support: Arc<DsparkModel>,
        convention: DsparkConvention,
    ) -> Result<Box<dyn DsparkForward>, BackendError> {
        self.hip.bind_thread().map_err(dev)?;
        let cpu = CpuModel::new(self.model.clone(), 0)?;
        let hp = &self.model.hp;
        let targets = &support.meta.targets;
        let hc = [p0(&self.acts.hc), p0(&self.acts.hc_alt)];
        let sizes = (self.acts.n_max, CAPTURE_ROWS);
        let device = DeviceCapture::new(&self.hip, targets, sizes, hp.hc_dim(), hc).map_err(dev)?;
        let host = Arc::new(Mutex::new(Capture::new(targets, hp.n_embd, hp.n_hc, CAPTURE_ROWS)));
        self.scratch_bytes += device.len_bytes() as u64;
        if let Some(old) = self.dspark.take() {
            self.scratch_bytes -= old.device.len_bytes() as u64;
        }
        self.dspark = Some(SessionCapture {
            device,
            host: host.clone(),
            staging: Vec::new(),
        });
        // The captured graphs were made without the copies.
        self.decode_graph = None;
        self.verify.drop_graphs();
        Ok(Box::new(cpu.dspark_over(support, convention, host)))
    }

    /// After a batch of `n` tokens at positions `p0..` (stream synchronized): its target rows to
    /// the host capture, the last `CAPTURE_ROWS` of them.
    pub(super) fn capture_batch(&mut self, p0: usize, n: usize) -> Result<(), BackendError> {
        let Some(c) = self.dspark.as_mut() else {
            return Ok(());
        };
        let hcd = self.model.hp.hc_dim();
        let kept = c.device.kept_rows(n);
        let mut host = c.host.lock().unwrap_or_else(|e| e.into_inner());
        c.staging.resize(kept * hcd, 0.0);
        for (slot, &layer) in c.device.targets().iter().enumerate() {
            c.device.read(slot, &mut c.staging).map_err(dev)?;
            host.layer_output(layer, &c.staging, kept);
        }
        host.chunk_done(p0 + n - kept, kept);
        Ok(())
    }

    /// Apply `f` to the host capture, when a drafter is attached.
    pub(super) fn with_capture(&self, f: impl FnOnce(&mut Capture)) {
        if let Some(c) = &self.dspark {
            f(&mut c.host.lock().unwrap_or_else(|e| e.into_inner()));
        }
    }
}
