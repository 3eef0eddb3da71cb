//! Model weights on the device, in one of two placements (`--weights`):
//!
//! * copy — the GGUF tensor-data section copied once into one device allocation, read from the
//!   file in 64 MiB chunks into four pinned (registered) staging buffers: while the device copies
//!   some, the host reads the next. A file mostly outside the page cache is read with O_DIRECT
//!   (from the disk straight into the pinned buffer, never through the page cache); a cached one
//!   with plain reads, which copy out of the page cache in parallel slices. Filesystems that refuse
//!   O_DIRECT (tmpfs) get plain reads, and the method says so. On unified memory the file's pages
//!   are dropped (`posix_fadvise(DONTNEED)`) behind every chunk, so RAM never holds the page cache
//!   and the device copy of the same bytes at once.
//! * map (zero copy) — the file mapping itself is registered with hipHostRegister (mapped, read-only
//!   where the runtime allows it) and kernels read the weights through its device address: for
//!   models that do not fit device memory, or when asked.
//!
//! Every bound tensor is then addressed by its file offset. Owns the placement, the read path and
//! the offset → device address mapping. Must not compute with the weights or decide which placement
//! to use (`backend::open_backend` does).

use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
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

/// Pinned staging buffers in flight: the host fills one while the device copies the others.
pub const STAGING_BUFFERS: usize = 4;

/// Alignment O_DIRECT needs of file offsets, lengths and buffer addresses (the logical block size
/// is at most this on the disks that matter; the staging buffers are page aligned).
pub const DIRECT_ALIGN: usize = 4096;

/// Threads that `pread` one staging chunk together: one thread copying out of the page cache
/// (about 5-10 GB/s) is slower than a PCIe 5 link or an APU's copy engine, and several O_DIRECT
/// requests in flight keep an NVMe queue busy.
const READ_THREADS: usize = 4;

/// How a file copy reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DirectReads {
    /// O_DIRECT unless the file is mostly in the page cache (`residency::mostly_cached`).
    Auto,
    Never,
    Always,
}

/// Read-path options of a file copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadOptions {
    pub direct: DirectReads,
    /// Drop the file's pages behind every chunk (`posix_fadvise(DONTNEED)`).
    pub drop_behind: bool,
}

impl LoadOptions {
    /// For `ctx`'s device: pages dropped behind on integrated GPUs (where the page cache and the
    /// copy share RAM); `DS4_LOAD_DIRECT` and `DS4_LOAD_DROP_CACHE` (0 or 1) override.
    pub fn for_device(ctx: &HipContext) -> LoadOptions {
        let env = |k: &str| std::env::var(k).ok();
        LoadOptions {
            direct: match env("DS4_LOAD_DIRECT").as_deref() {
                Some("0") => DirectReads::Never,
                Some("1") => DirectReads::Always,
                _ => DirectReads::Auto,
            },
            drop_behind: match env("DS4_LOAD_DROP_CACHE").as_deref() {
                Some("0") => false,
                Some("1") => true,
                _ => ctx.info().integrated,
            },
        }
    }
}

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
        Self::upload_with_options(ctx, model, LoadOptions::for_device(ctx), progress)
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
        let (buf, base, method) = match (&file.path, file.is_mapped()) {
            (Some(path), true) => {
                let size = file.file_size();
                // O_DIRECT reads whole aligned blocks: the store starts at the block holding the
                // first tensor byte (less than 4 KiB more on the device).
                let base = file.data_offset / DIRECT_ALIGN as u64 * DIRECT_ALIGN as u64;
                let mut reader = FileReader::open(path, base, size, options)?;
                let total = (size - base) as usize;
                let buf = upload_with(ctx, total, DIRECT_ALIGN, &mut |o, out| reader.read(o, out), progress)?;
                (buf, base, reader.method())
            }
            _ => {
                let base = file.data_offset;
                let bytes = &file.bytes()[base as usize..];
                let mut read = |offset: usize, out: &mut [u8]| {
                    out.copy_from_slice(&bytes[offset..offset + out.len()]);
                    Ok(())
                };
                let buf = upload_with(ctx, bytes.len(), 1, &mut read, progress)?;
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

/// Reads the file range `base..size` for a copy: O_DIRECT or plain, pages dropped behind.
struct FileReader<'p> {
    path: &'p Path,
    /// The plain descriptor: plain reads, and the one `posix_fadvise` applies to.
    plain: std::fs::File,
    /// The O_DIRECT descriptor while reads go through it.
    direct: Option<std::fs::File>,
    base: u64,
    size: u64,
    drop_behind: bool,
    threads: usize,
    /// Why reads are plain: "O_DIRECT off", "80% of the file in the page cache", "O_DIRECT refused: ...".
    plain_because: String,
}

impl<'p> FileReader<'p> {
    fn open(path: &'p Path, base: u64, size: u64, options: LoadOptions) -> Result<FileReader<'p>, String> {
        let plain = std::fs::File::open(path).map_err(|e| format!("{}: cannot open: {e}", path.display()))?;
        let cached = crate::engine::residency::file_cached_bytes(&plain).unwrap_or(0);
        let share = cached as f64 / size.max(1) as f64;
        let (direct, plain_because) = match options.direct {
            DirectReads::Never => (None, "O_DIRECT off".to_string()),
            DirectReads::Auto if share >= crate::engine::residency::MOSTLY_CACHED => {
                (None, format!("{:.0}% of the file in the page cache", 100.0 * share))
            }
            _ => match std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECT)
                .open(path)
            {
                Ok(f) => (Some(f), String::new()),
                Err(e) => (None, format!("O_DIRECT refused: {e}")),
            },
        };
        Ok(FileReader {
            path,
            plain,
            direct,
            base,
            size,
            drop_behind: options.drop_behind,
            threads: std::thread::available_parallelism()
                .map_or(1, |n| n.get())
                .min(READ_THREADS),
            plain_because,
        })
    }

    /// Fill `out` with the file's bytes from `base + offset`; `out` may run past the end of the
    /// file by less than [`DIRECT_ALIGN`] (that part is left as it was).
    fn read(&mut self, offset: usize, out: &mut [u8]) -> Result<(), String> {
        let at = self.base + offset as u64;
        let want = out.len().min((self.size - at) as usize);
        if let Some(f) = &self.direct {
            match read_parallel(f, self.path, at, out, want, self.threads) {
                Ok(()) => {
                    self.drop_behind(at, want);
                    return Ok(());
                }
                // Some filesystems accept the O_DIRECT open and refuse the reads.
                Err((msg, Some(libc::EINVAL))) if offset == 0 => {
                    self.direct = None;
                    self.plain_because = format!("O_DIRECT refused: {msg}");
                }
                Err((msg, _)) => return Err(msg),
            }
        }
        read_parallel(&self.plain, self.path, at, &mut out[..want], want, self.threads).map_err(|(m, _)| m)?;
        self.drop_behind(at, want);
        Ok(())
    }

    fn drop_behind(&self, at: u64, len: usize) {
        if self.drop_behind {
            // SAFETY: a plain system call on an open descriptor. It is advice: a filesystem that
            // ignores it leaves the pages cached, which costs RAM, not correctness.
            unsafe {
                libc::posix_fadvise(
                    self.plain.as_raw_fd(),
                    at as libc::off_t,
                    len as libc::off_t,
                    libc::POSIX_FADV_DONTNEED,
                )
            };
        }
    }

    /// For logs and tests: "O_DIRECT reads ..." or "plain reads (why) ...", and the drop.
    fn method(&self) -> String {
        let how = if self.direct.is_some() {
            "O_DIRECT reads".to_string()
        } else {
            format!("plain reads ({})", self.plain_because)
        };
        format!(
            "{how} through {STAGING_BUFFERS} pinned staging buffers{}",
            if self.drop_behind {
                ", page cache dropped behind"
            } else {
                ""
            }
        )
    }
}

/// A read error line and the OS error code behind it.
type ReadError = (String, Option<i32>);

/// Fill `out` from `file` at byte `at`, in up to `threads` parallel slices (multiples of
/// [`DIRECT_ALIGN`]); the first `want` bytes must arrive, the rest of `out` may lie past the end
/// of the file. Errors name the file and the offset.
fn read_parallel(
    file: &std::fs::File,
    path: &Path,
    at: u64,
    out: &mut [u8],
    want: usize,
    threads: usize,
) -> Result<(), ReadError> {
    let read = |pos: u64, part: &mut [u8], need: usize| -> Result<(), ReadError> {
        let mut done = 0;
        while done < need {
            match file.read_at(&mut part[done..], pos + done as u64) {
                Ok(0) => {
                    let at = pos + done as u64;
                    return Err((format!("{}: the file ends at offset {at}", path.display()), None));
                }
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    let at = pos + done as u64;
                    let msg = format!(
                        "{}: read of {} bytes at offset {at} failed: {e}",
                        path.display(),
                        part.len() - done
                    );
                    return Err((msg, e.raw_os_error()));
                }
            }
        }
        Ok(())
    };
    let slice = out
        .len()
        .div_ceil(threads.max(1))
        .max(1 << 20)
        .next_multiple_of(DIRECT_ALIGN);
    if out.len() <= slice {
        return read(at, out, want);
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = out
            .chunks_mut(slice)
            .enumerate()
            .map(|(i, part)| {
                let need = want.saturating_sub(i * slice).min(part.len());
                s.spawn(move || read(at + (i * slice) as u64, part, need))
            })
            .collect();
        handles.into_iter().try_for_each(|h| {
            h.join()
                .unwrap_or_else(|_| Err(("a read thread panicked".into(), None)))
        })
    })
}

/// Writes bytes `offset..offset + chunk.len()` of the data to place into `chunk`.
pub type ChunkReader<'a> = dyn FnMut(usize, &mut [u8]) -> Result<(), String> + 'a;

/// Fill a new device buffer of `total` bytes chunk by chunk: `read(offset, chunk)` writes bytes
/// `offset..offset+chunk.len()` into a pinned staging buffer (the last chunk's length rounded up
/// to `align`, so it may reach past `total`), which the device then copies while the host fills
/// the next ones (the event of each buffer's last copy says when it is free again).
/// `progress(done, total)` follows every chunk.
pub fn upload_with(
    ctx: &HipContext,
    total: usize,
    align: usize,
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
    let align = align.max(1);
    let chunk = STAGING_BYTES.min(total.max(1)).next_multiple_of(align);
    let buffers = STAGING_BUFFERS.min(total.div_ceil(chunk).max(1));
    let mut staging = (0..buffers)
        .map(|_| PinnedBuffer::new(ctx, chunk))
        .collect::<Result<Vec<_>, _>>()
        .map_err(hip)?;
    let done = (0..buffers)
        .map(|_| ctx.event(false))
        .collect::<Result<Vec<_>, _>>()
        .map_err(hip)?;
    let mut used = vec![false; buffers];
    let mut offset = 0usize;
    let mut i = 0usize;
    while offset < total {
        let n = chunk.min(total - offset);
        let k = i % buffers;
        if used[k] {
            done[k].synchronize().map_err(hip)?; // the copy out of this staging buffer has finished
        }
        read(offset, &mut staging[k].as_mut_slice()[..n.next_multiple_of(align)])?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch_file(name: &str, len: usize) -> (std::path::PathBuf, Vec<u8>) {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-scratch");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{name}-{}", std::process::id()));
        let bytes: Vec<u8> = (0..len).map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8).collect();
        std::fs::write(&path, &bytes).unwrap();
        (path, bytes)
    }

    #[test]
    fn refused_direct_reads_fall_back_to_plain_ones_and_say_so() {
        // A staging buffer O_DIRECT cannot use (not block aligned) makes the kernel refuse the
        // first read with EINVAL, as filesystems without O_DIRECT support do.
        let (path, bytes) = scratch_file("direct-refused", 3 * DIRECT_ALIGN + 100);
        let options = LoadOptions {
            direct: DirectReads::Always,
            drop_behind: false,
        };
        let mut reader = FileReader::open(&path, 0, bytes.len() as u64, options).unwrap();
        assert_eq!(reader.method(), "O_DIRECT reads through 4 pinned staging buffers");
        let padded = bytes.len().next_multiple_of(DIRECT_ALIGN);
        let mut backing = vec![0u8; padded + 2];
        let skew = if backing.as_ptr() as usize % 512 == 511 { 2 } else { 1 };
        let out = &mut backing[skew..skew + padded];
        reader.read(0, out).unwrap();
        assert!(out[..bytes.len()] == bytes[..]);
        assert!(
            reader.method().starts_with("plain reads (O_DIRECT refused: ") && reader.method().contains("offset 0"),
            "{}",
            reader.method()
        );
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn direct_reads_fill_aligned_chunks_up_to_the_end_of_the_file() {
        let (path, bytes) = scratch_file("direct-tail", 5 * DIRECT_ALIGN + 321);
        let options = LoadOptions {
            direct: DirectReads::Always,
            drop_behind: true,
        };
        let base = DIRECT_ALIGN as u64;
        let mut reader = FileReader::open(&path, base, bytes.len() as u64, options).unwrap();
        // A page-aligned buffer: two chunks of two blocks, the second running past the end.
        let layout = std::alloc::Layout::from_size_align(4 * DIRECT_ALIGN, DIRECT_ALIGN).unwrap();
        // SAFETY: non-zero size; freed below with the same layout.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        // SAFETY: a fresh allocation of that many bytes.
        let buf = unsafe { std::slice::from_raw_parts_mut(ptr, 4 * DIRECT_ALIGN) };
        let mut got = Vec::new();
        for offset in [0, 2 * DIRECT_ALIGN, 4 * DIRECT_ALIGN] {
            let want = (bytes.len() - base as usize - offset).min(2 * DIRECT_ALIGN);
            reader.read(offset, &mut buf[..2 * DIRECT_ALIGN]).unwrap();
            got.extend_from_slice(&buf[..want]);
        }
        assert!(got == bytes[base as usize..]);
        assert_eq!(
            reader.method(),
            "O_DIRECT reads through 4 pinned staging buffers, page cache dropped behind"
        );
        // SAFETY: allocated above with this layout.
        unsafe { std::alloc::dealloc(ptr, layout) };
        std::fs::remove_file(&path).unwrap();
    }
}
