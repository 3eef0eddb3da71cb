//! Model weights on the device, in one of two placements (`--weights`):
//!
//! * copy — the GGUF tensor-data section copied once into one device allocation, chunk by chunk by
//!   several reader threads through pinned staging buffers (O_DIRECT from disk, plain reads from
//!   the page cache) or from the registered file mapping; `weight_load` owns that read path, its
//!   knobs and their per-device defaults. On unified memory the file's pages are dropped behind
//!   every chunk, so RAM never holds the page cache and the device copy of the same bytes at once.
//! * map (zero copy) — the file mapping itself is registered with hipHostRegister (mapped, read-only
//!   where the runtime allows it) and kernels read the weights through its device address: for
//!   models that do not fit device memory, or when asked.
//!
//! Every bound tensor is then addressed by its file offset. Owns the placement and the offset →
//! device address mapping. Must not compute with the weights or decide which placement to use
//! (`backend::open_backend` does).

use std::sync::Arc;
use std::time::Instant;

use crate::gguf::{GgufFile, TensorInfo};
use crate::model::Model;
use crate::model::weights::ExpertTensor;

use super::runtime::{DeviceBuffer, DevicePtr, HipContext, HipResult, HostRegistration};
use super::weight_load::FileReader;

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

pub use super::weight_load::{
    ChunkReader, DIRECT_ALIGN, LoadOptions, ReadMode, STAGING_BYTES, Staging, upload_registered, upload_with,
};

/// The tensor-data section of a model file on the device.
pub struct DeviceWeights {
    store: Store,
    /// File offset of the first byte of the store.
    base: u64,
    /// Seconds the copy (or the registration) took.
    pub upload_seconds: f64,
    /// How the bytes were placed, for logs: "pread through pinned staging", "registered read-only", ...
    pub method: String,
}

/// Bytes a copy placement moves to the device: the tensor-data section of the file.
pub fn data_section_bytes(file: &GgufFile) -> u64 {
    file.file_size().saturating_sub(file.data_offset)
}

impl DeviceWeights {
    /// Copy the model's tensor data to `ctx`'s device with the device's [`LoadOptions`].
    /// `progress(done, total)` is called per chunk.
    pub fn upload(
        ctx: &HipContext,
        model: &Model,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<DeviceWeights, String> {
        Self::upload_with_options(ctx, model, LoadOptions::for_device(ctx)?, progress)
    }

    /// [`DeviceWeights::upload`] with explicit read options. A model read from a file is read
    /// from it (see the module comment); an in-memory model (the demo, tests) is copied from
    /// memory through the same staging buffers.
    pub fn upload_with_options(
        ctx: &HipContext,
        model: &Model,
        options: LoadOptions,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<DeviceWeights, String> {
        let file = &model.file;
        let section = data_section_bytes(file);
        let (free, _) = ctx.mem_info().map_err(|e| e.to_string())?;
        if section > free {
            return Err(super::footprint::too_little_memory(
                section,
                free,
                &format!("for the weights on {}", ctx.name()),
            ));
        }
        let t0 = Instant::now();
        let staging = options.staging;
        let (buf, base, method) = match (&file.path, file.is_mapped()) {
            (Some(_), true) if options.mode == ReadMode::Register => {
                let size = file.file_size() as usize;
                let base = file.data_offset as usize / DIRECT_ALIGN * DIRECT_ALIGN;
                let (mapping, len) = file.mapping();
                debug_assert_eq!(len, size);
                // SAFETY: the model (and so the mapping) outlives this call; the file is not
                // written while it is loaded.
                let buf = unsafe { upload_registered(ctx, mapping, base, size - base, staging, progress)? };
                let method = format!("registered file mapping, chunk by chunk ({})", staging.describe());
                (buf, base as u64, method)
            }
            (Some(path), true) => {
                let size = file.file_size();
                // O_DIRECT reads whole aligned blocks: the store starts at the block holding the
                // first tensor byte (less than 4 KiB more on the device).
                let base = file.data_offset / DIRECT_ALIGN as u64 * DIRECT_ALIGN as u64;
                let reader = FileReader::open(path, base, size, options.mode, options.drop_behind)?;
                let total = (size - base) as usize;
                let read = |o: usize, out: &mut [u8]| reader.read(o, out);
                let buf = upload_with(ctx, total, DIRECT_ALIGN, staging, &read, progress)?;
                (buf, base, reader.method(&staging))
            }
            _ => {
                let base = file.data_offset;
                let bytes = &file.bytes()[base as usize..];
                let read = |offset: usize, out: &mut [u8]| {
                    out.copy_from_slice(&bytes[offset..offset + out.len()]);
                    Ok(())
                };
                let buf = upload_with(ctx, bytes.len(), 1, staging, &read, progress)?;
                (buf, base, "memory through pinned staging".to_string())
            }
        };
        Ok(DeviceWeights {
            store: Store::Device(buf),
            base,
            upload_seconds: t0.elapsed().as_secs_f64(),
            method,
        })
    }

    /// Zero-copy placement: register the model's file mapping (mapped; read-only first, plain if the
    /// runtime refuses that flag) and address the tensors through its device address. Fails with
    /// the runtime's answers when the mapping cannot be registered (the caller may copy instead).
    pub fn map(ctx: &HipContext, model: &Model) -> Result<DeviceWeights, String> {
        let file = model.file.clone();
        let (ptr, len) = file.mapping();
        let t0 = Instant::now();
        let mut refusals = Vec::new();
        for read_only in [true, false] {
            // SAFETY: the mapping stays alive as long as `_file` (an Arc held next to the
            // registration), and the device never writes through a weight pointer.
            match unsafe { HostRegistration::from_raw(ctx, ptr as *mut _, len, true, read_only) } {
                Ok(registration) => {
                    let base = registration.device_ptr().map_err(|e| e.to_string())?;
                    return Ok(DeviceWeights {
                        store: Store::Mapped {
                            _registration: registration,
                            _file: file,
                            base,
                            len,
                        },
                        base: 0,
                        upload_seconds: t0.elapsed().as_secs_f64(),
                        method: if read_only {
                            "registered file mapping (read-only)".into()
                        } else {
                            "registered file mapping".into()
                        },
                    });
                }
                Err(e) => refusals.push(format!("{}{e}", if read_only { "read-only: " } else { "plain: " })),
            }
        }
        Err(format!(
            "the runtime refused to register the {:.1} GiB file mapping ({})",
            len as f64 / (1u64 << 30) as f64,
            refusals.join("; ")
        ))
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
