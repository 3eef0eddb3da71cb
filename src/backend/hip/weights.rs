//! Model weights on the device, in one of two placements (`--weights`, spec pitfalls on memory):
//!
//! * copy — the GGUF tensor-data section copied once into one device allocation. The file is read
//!   with `pread` straight into two pinned (registered) staging buffers, double-buffered: while the
//!   device copies one chunk, the host reads the next. Copying out of the file mapping instead would
//!   fault every page of the mapping in (and on gfx1151 makes the runtime stage pageable memory
//!   through its own small bounce buffers); `pread` fills the pinned chunk from the page cache in one
//!   system call per chunk and never grows the process's mapped footprint.
//! * map (zero copy) — the file mapping itself is registered with hipHostRegister (mapped, read-only
//!   where the runtime allows it) and kernels read the weights through its device address: the
//!   placement for unified-memory APUs (Strix Halo) or when the model does not fit device memory.
//!
//! Every bound tensor is then addressed by its file offset. Owns the placement and the offset →
//! device address mapping. Must not compute with the weights or decide which placement to use
//! (`backend::open_backend` does).

use std::os::unix::fs::FileExt;
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
pub const STAGING_BYTES: usize = 64 << 20;

/// Threads that `pread` one staging chunk together: one thread copying out of the page cache
/// (about 5-10 GB/s) is slower than a PCIe 5 link or an APU's copy engine, so a warm-cache load
/// reads each chunk in parallel slices.
const READ_THREADS: usize = 4;

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
    /// Copy the model's tensor data to `ctx`'s device. `progress(done, total)` is called per chunk.
    /// A model read from a file is `pread` into the pinned staging buffers; an in-memory model (the
    /// demo, tests) is copied from memory into them.
    pub fn upload(
        ctx: &HipContext,
        model: &Model,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<DeviceWeights, String> {
        let file = &model.file;
        let base = file.data_offset;
        let total = data_section_bytes(file) as usize;
        let (free, _) = ctx.mem_info().map_err(|e| e.to_string())?;
        if total as u64 > free {
            return Err(super::backend::too_little_memory(
                total as u64,
                free,
                &format!("for the weights on {}", ctx.name()),
            ));
        }
        let t0 = Instant::now();
        let (buf, method) = match (&file.path, file.is_mapped()) {
            (Some(path), true) => {
                let f = std::fs::File::open(path).map_err(|e| format!("{}: cannot open: {e}", path.display()))?;
                let threads = std::thread::available_parallelism()
                    .map_or(1, |n| n.get())
                    .min(READ_THREADS);
                let mut read =
                    |offset: usize, out: &mut [u8]| pread_parallel(&f, path, base + offset as u64, out, threads);
                (
                    upload_with(ctx, total, &mut read, progress)?,
                    "pread through pinned staging",
                )
            }
            _ => {
                let bytes = &file.bytes()[base as usize..];
                let mut read = |offset: usize, out: &mut [u8]| {
                    out.copy_from_slice(&bytes[offset..offset + out.len()]);
                    Ok(())
                };
                (
                    upload_with(ctx, total, &mut read, progress)?,
                    "memory through pinned staging",
                )
            }
        };
        Ok(DeviceWeights {
            store: Store::Device(buf),
            base,
            upload_seconds: t0.elapsed().as_secs_f64(),
            method: method.into(),
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

/// Fill `out` from `file` at byte `offset`, in `threads` parallel slices; errors name the file and
/// the offset.
fn pread_parallel(
    file: &std::fs::File,
    path: &std::path::Path,
    offset: u64,
    out: &mut [u8],
    threads: usize,
) -> Result<(), String> {
    let read = |at: u64, part: &mut [u8]| {
        file.read_exact_at(part, at).map_err(|e| {
            format!(
                "{}: read of {} bytes at offset {at} failed: {e}",
                path.display(),
                part.len()
            )
        })
    };
    let slice = out.len().div_ceil(threads.max(1)).max(1 << 20);
    if out.len() <= slice {
        return read(offset, out);
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = out
            .chunks_mut(slice)
            .enumerate()
            .map(|(i, part)| s.spawn(move || read(offset + (i * slice) as u64, part)))
            .collect();
        handles
            .into_iter()
            .try_for_each(|h| h.join().unwrap_or_else(|_| Err("a read thread panicked".into())))
    })
}

/// Writes bytes `offset..offset + chunk.len()` of the data to place into `chunk`.
pub type ChunkReader<'a> = dyn FnMut(usize, &mut [u8]) -> Result<(), String> + 'a;

/// Fill a new device buffer of `total` bytes chunk by chunk: `read(offset, chunk)` writes bytes
/// `offset..offset+chunk.len()` into a pinned staging buffer, which the device then copies while the
/// host fills the other one (the event of each buffer's last copy says when it is free again).
/// `progress(done, total)` follows every chunk.
pub fn upload_with(
    ctx: &HipContext,
    total: usize,
    read: &mut ChunkReader<'_>,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<DeviceBuffer, String> {
    let hip = |e: super::runtime::HipError| e.to_string();
    let mut dev = ctx.alloc(total).map_err(|e| {
        format!(
            "{e}: cannot allocate {:.2} GiB for the weights",
            total as f64 / (1u64 << 30) as f64
        )
    })?;
    let stream = ctx.stream().map_err(hip)?;
    let chunk = STAGING_BYTES.min(total.max(1));
    let mut staging = [
        PinnedBuffer::new(ctx, chunk).map_err(hip)?,
        PinnedBuffer::new(ctx, chunk).map_err(hip)?,
    ];
    let done = [ctx.event(false).map_err(hip)?, ctx.event(false).map_err(hip)?];
    let mut used = [false, false];
    let mut offset = 0usize;
    let mut i = 0usize;
    while offset < total {
        let n = chunk.min(total - offset);
        let k = i % 2;
        if used[k] {
            done[k].synchronize().map_err(hip)?; // the copy out of this staging buffer has finished
        }
        read(offset, &mut staging[k].as_mut_slice()[..n])?;
        dev.copy_from_pinned_async(offset, &staging[k], n, &stream)
            .map_err(hip)?;
        done[k].record(&stream).map_err(hip)?;
        used[k] = true;
        offset += n;
        i += 1;
        progress(offset as u64, total as u64);
    }
    stream.synchronize().map_err(hip)?;
    Ok(dev)
}
