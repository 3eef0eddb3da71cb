//! Model weights resident in device memory: the GGUF tensor-data section copied once, through two
//! pinned staging buffers (double-buffered asynchronous uploads), into one device allocation; every
//! bound tensor is then addressed by its file offset.
//!
//! Owns the upload and the offset → device address mapping. Must not compute with the weights.
//!
//! The zero-copy alternative (`DeviceWeights::map`) registers the file mapping itself with
//! hipHostRegister (mapped, read-only) so kernels read the weights through the device address of
//! host memory: the placement for unified-memory APUs (Strix Halo) where the model does not fit the
//! device heap.

use std::sync::Arc;
use std::time::Instant;

use crate::gguf::{GgufFile, TensorInfo};
use crate::model::Model;
use crate::model::weights::ExpertTensor;

use super::runtime::{DeviceBuffer, DevicePtr, HipContext, HipResult, HostRegistration, PinnedBuffer};

enum Store {
    /// A device copy of the data section.
    Device(DeviceBuffer),
    /// The registered file mapping (kept alive by the Arc); the address of file byte 0.
    Mapped {
        _registration: HostRegistration<'static>,
        _file: Arc<GgufFile>,
        base: DevicePtr,
        len: usize,
    },
}

/// Size of each pinned staging buffer.
const STAGING_BYTES: usize = 64 << 20;

/// The tensor-data section of a model file on the device.
pub struct DeviceWeights {
    store: Store,
    /// File offset of the first byte of the store.
    base: u64,
    /// Seconds the upload took and bytes moved (for logs and the selftest).
    pub upload_seconds: f64,
}

impl DeviceWeights {
    /// Copy the model's tensor data to `ctx`'s device. `progress(done, total)` is called per chunk.
    pub fn upload(
        ctx: &HipContext,
        model: &Model,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<DeviceWeights, String> {
        let file = &model.file;
        let base = file.data_offset;
        let end = file.file_size();
        let total = end.saturating_sub(base) as usize;
        let (free, _) = ctx.mem_info().map_err(|e| e.to_string())?;
        if total as u64 > free {
            return Err(format!(
                "model weights need {:.1} GiB of device memory, {:.1} GiB free on {}",
                total as f64 / (1u64 << 30) as f64,
                free as f64 / (1u64 << 30) as f64,
                ctx.name()
            ));
        }
        let t0 = Instant::now();
        let buf = upload_bytes(ctx, &file.bytes()[base as usize..end as usize], progress).map_err(|e| e.to_string())?;
        Ok(DeviceWeights {
            store: Store::Device(buf),
            base,
            upload_seconds: t0.elapsed().as_secs_f64(),
        })
    }

    /// Zero-copy placement: register the model's file mapping (mapped, read-only) and address the
    /// tensors through its device address. Fails with the runtime's reason when the mapping cannot be
    /// registered (then copy instead).
    pub fn map(ctx: &HipContext, model: &Model) -> Result<DeviceWeights, String> {
        let file = model.file.clone();
        let (ptr, len) = file.mapping();
        let t0 = Instant::now();
        // SAFETY: the mapping stays alive as long as `_file` (an Arc held next to the registration),
        // and a registered read-only mapping is never written through.
        let registration = unsafe { HostRegistration::from_raw(ctx, ptr as *mut _, len, true, true) }
            .map_err(|e| format!("cannot map the weights into the device address space: {e}"))?;
        let base = registration.device_ptr().map_err(|e| e.to_string())?;
        Ok(DeviceWeights {
            store: Store::Mapped {
                _registration: registration,
                _file: file,
                base,
                len,
            },
            base: 0,
            upload_seconds: t0.elapsed().as_secs_f64(),
        })
    }

    pub fn is_mapped(&self) -> bool {
        matches!(self.store, Store::Mapped { .. })
    }

    fn start(&self) -> DevicePtr {
        match &self.store {
            Store::Device(b) => b.ptr(),
            Store::Mapped { base, .. } => *base,
        }
    }

    pub fn len_bytes(&self) -> usize {
        match &self.store {
            Store::Device(b) => b.len_bytes(),
            Store::Mapped { len, .. } => *len,
        }
    }

    /// Device address of a bound tensor.
    pub fn tensor(&self, t: &TensorInfo) -> DevicePtr {
        debug_assert!(t.offset >= self.base && t.offset + t.nbytes <= self.base + self.len_bytes() as u64);
        self.start().offset((t.offset - self.base) as usize)
    }

    /// Device address of routed expert `e` of a 3-D expert tensor.
    pub fn expert(&self, t: &ExpertTensor, e: usize) -> DevicePtr {
        self.start().offset((t.expert_offset(e) - self.base) as usize)
    }

    /// Copy a tensor's bytes, as the device sees them, back to the host (verification).
    pub fn read_back(&self, ctx: &HipContext, t: &TensorInfo, out: &mut [u8]) -> HipResult<()> {
        // SAFETY: the tensor lies inside the store (bounds checked at parse time) and `out` is a
        // host slice of the requested length.
        unsafe { ctx.copy_device_to_host(self.tensor(t), out) }
    }
}

/// Copy `bytes` to a new device buffer through two pinned staging buffers: while the device copies
/// one, the host fills the other (the event of each buffer's last copy says when it is free again).
pub fn upload_bytes(ctx: &HipContext, bytes: &[u8], progress: &mut dyn FnMut(u64, u64)) -> HipResult<DeviceBuffer> {
    let mut dev = ctx.alloc(bytes.len())?;
    let stream = ctx.stream()?;
    let chunk = STAGING_BYTES.min(bytes.len().max(1));
    let mut staging = [PinnedBuffer::new(ctx, chunk)?, PinnedBuffer::new(ctx, chunk)?];
    let done = [ctx.event(false)?, ctx.event(false)?];
    let mut used = [false, false];
    for (i, part) in bytes.chunks(chunk).enumerate() {
        let k = i % 2;
        if used[k] {
            done[k].synchronize()?; // the copy out of this staging buffer has finished
        }
        staging[k].as_mut_slice()[..part.len()].copy_from_slice(part);
        dev.copy_from_pinned_async(i * chunk, &staging[k], part.len(), &stream)?;
        done[k].record(&stream)?;
        used[k] = true;
        progress((i * chunk + part.len()) as u64, bytes.len() as u64);
    }
    stream.synchronize()?;
    Ok(dev)
}
