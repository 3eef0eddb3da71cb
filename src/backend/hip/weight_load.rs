//! The read path of a weight copy: how file bytes reach device memory, chunk by chunk.
//!
//! Several reader threads each take the next chunk, fill a staging slot with it and hand it to the
//! thread that owns the stream, which enqueues the host → device copy and returns the slot once
//! the copy's event has passed. One thread copying out of the page cache (about 5-10 GB/s) is far
//! slower than a PCIe 5 link or an APU's copy engine, and several O_DIRECT requests in flight keep
//! an NVMe queue busy, hence the threads. The modes (`DS4_LOAD_MODE`):
//!
//! * `direct` — O_DIRECT reads (disk → pinned buffer, never through the page cache);
//! * `buffered` — plain reads (page cache → pinned buffer);
//! * `register` — no staging copy: each chunk of the file mapping is registered (page-locked) and
//!   the device copies it straight from there, then it is unregistered;
//! * `auto` (default) — O_DIRECT unless the file is mostly in the page cache, else plain reads.
//!
//! Filesystems that refuse O_DIRECT (tmpfs before Linux 6.6) get plain reads, and the method says
//! so. With drop-behind (default on integrated GPUs, where the page cache and the device copy
//! share RAM) the file's pages are dropped (`posix_fadvise(DONTNEED)`) behind every chunk read.
//!
//! Knobs (environment, read once per load): `DS4_LOAD_THREADS`, `DS4_LOAD_CHUNK_MIB`,
//! `DS4_LOAD_BUFFERS`, `DS4_LOAD_MODE`, `DS4_LOAD_DROP_CACHE` (0 or 1). Defaults: see
//! [`Staging::defaults`]. Owns the pipeline and the file reads; `weights` decides what to place.

use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, mpsc};

use super::env::env_number;
use super::runtime::{DeviceBuffer, HipContext, HostRegistration, PinnedBuffer};

/// Default chunk (and pinned staging buffer) size.
pub const STAGING_BYTES: usize = 64 << 20;

/// Chunk size on discrete GPUs: smaller chunks keep more reader threads and copies in flight.
pub const DISCRETE_CHUNK_BYTES: usize = 16 << 20;

/// Alignment O_DIRECT needs of file offsets, lengths and buffer addresses (the logical block size
/// is at most this on the disks that matter; the staging buffers are page aligned).
pub const DIRECT_ALIGN: usize = 4096;

/// How a file copy reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadMode {
    /// O_DIRECT unless the file is mostly in the page cache (`residency::mostly_cached`).
    Auto,
    /// O_DIRECT (plain reads where the filesystem refuses it).
    Direct,
    /// Plain reads.
    Buffered,
    /// Register the file mapping chunk by chunk and copy from it (no staging buffers).
    Register,
}

impl ReadMode {
    /// `DS4_LOAD_MODE` (auto | direct | buffered | register); the older `DS4_LOAD_DIRECT` (0 or 1)
    /// still selects buffered or direct.
    fn from_env() -> Result<ReadMode, String> {
        match std::env::var("DS4_LOAD_MODE").ok().as_deref() {
            Some("auto") => return Ok(ReadMode::Auto),
            Some("direct") => return Ok(ReadMode::Direct),
            Some("buffered") => return Ok(ReadMode::Buffered),
            Some("register") => return Ok(ReadMode::Register),
            Some(other) => {
                return Err(format!(
                    "DS4_LOAD_MODE={other}: expected auto, direct, buffered or register"
                ));
            }
            None => {}
        }
        Ok(match std::env::var("DS4_LOAD_DIRECT").ok().as_deref() {
            Some("0") => ReadMode::Buffered,
            Some("1") => ReadMode::Direct,
            _ => ReadMode::Auto,
        })
    }
}

/// The shape of the pipeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Staging {
    /// Bytes per chunk (and per pinned staging buffer).
    pub chunk_bytes: usize,
    /// Staging slots: pinned buffers (or registered chunks) being filled or copied.
    pub buffers: usize,
    /// Reader threads.
    pub threads: usize,
}

impl Staging {
    /// Integrated GPUs: 4 threads, 64 MiB chunks, 8 buffers (512 MiB pinned, RAM the model
    /// shares; ds4's ROCm loader's layout). Discrete GPUs: 16 threads, 16 MiB chunks, 64 buffers
    /// (1 GiB pinned): the fastest of the H200 sweep from the page cache (80.76 GiB in 3.72 s,
    /// against 4.90 s at 8 threads × 64 MiB; tests/hip-on-cuda/results/h200-2026-12-02-s6-*).
    /// Threads are capped at the CPUs available.
    pub fn defaults(integrated: bool) -> Staging {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        if integrated {
            let threads = 4.min(cpus);
            Staging {
                chunk_bytes: STAGING_BYTES,
                buffers: 2 * threads,
                threads,
            }
        } else {
            let threads = 16.min(cpus);
            Staging {
                chunk_bytes: DISCRETE_CHUNK_BYTES,
                buffers: 4 * threads,
                threads,
            }
        }
    }

    /// [`Staging::defaults`] with `DS4_LOAD_THREADS`, `DS4_LOAD_CHUNK_MIB` and `DS4_LOAD_BUFFERS`
    /// applied.
    fn from_env(integrated: bool) -> Result<Staging, String> {
        let mut s = Staging::defaults(integrated);
        let num = |k: &str, max: usize| {
            env_number(
                k,
                |n: &usize| (1..=max).contains(n),
                &format!("a whole number from 1 to {max}"),
            )
        };
        if let Some(t) = num("DS4_LOAD_THREADS", 256)? {
            s.threads = t;
            s.buffers = 2 * t;
        }
        if let Some(mib) = num("DS4_LOAD_CHUNK_MIB", 4096)? {
            s.chunk_bytes = mib << 20;
        }
        if let Some(b) = num("DS4_LOAD_BUFFERS", 1024)? {
            s.buffers = b;
        }
        Ok(s)
    }

    /// "8 threads, 16 x 64 MiB buffers", for the method line.
    pub(super) fn describe(&self) -> String {
        format!(
            "{} threads, {} x {} MiB",
            self.threads,
            self.buffers,
            self.chunk_bytes >> 20
        )
    }
}

/// Read-path options of a file copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadOptions {
    pub mode: ReadMode,
    /// Drop the file's pages behind every chunk (`posix_fadvise(DONTNEED)`).
    pub drop_behind: bool,
    pub staging: Staging,
}

impl LoadOptions {
    /// For `ctx`'s device: [`Staging::defaults`] for its kind, pages dropped behind on integrated
    /// GPUs; the `DS4_LOAD_*` variables override. A malformed variable is an error naming it.
    pub fn for_device(ctx: &HipContext) -> Result<LoadOptions, String> {
        let integrated = ctx.info().integrated;
        Ok(LoadOptions {
            mode: ReadMode::from_env()?,
            drop_behind: match std::env::var("DS4_LOAD_DROP_CACHE").ok().as_deref() {
                Some("0") => false,
                Some("1") => true,
                _ => integrated,
            },
            staging: Staging::from_env(integrated)?,
        })
    }
}

/// Reads the file range `base..size` for a copy: O_DIRECT or plain, pages dropped behind. Shared
/// by the reader threads.
pub(super) struct FileReader<'p> {
    path: &'p Path,
    /// The plain descriptor: plain reads, and the one `posix_fadvise` applies to.
    plain: std::fs::File,
    /// The O_DIRECT descriptor, used while `direct_on` holds.
    direct: Option<std::fs::File>,
    direct_on: AtomicBool,
    base: u64,
    size: u64,
    drop_behind: bool,
    /// Why reads are plain: "O_DIRECT off", "80% of the file in the page cache", "O_DIRECT refused: ...".
    plain_because: Mutex<String>,
}

impl<'p> FileReader<'p> {
    /// `mode` is Auto, Direct or Buffered (Register does not read).
    pub(super) fn open(
        path: &'p Path,
        base: u64,
        size: u64,
        mode: ReadMode,
        drop_behind: bool,
    ) -> Result<Self, String> {
        let plain = std::fs::File::open(path).map_err(|e| format!("{}: cannot open: {e}", path.display()))?;
        let cached = crate::backend::residency::file_cached_bytes(&plain).unwrap_or(0);
        let share = cached as f64 / size.max(1) as f64;
        let (direct, plain_because) = match mode {
            ReadMode::Buffered | ReadMode::Register => (None, "O_DIRECT off".to_string()),
            ReadMode::Auto if share >= crate::backend::residency::MOSTLY_CACHED => {
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
            direct_on: AtomicBool::new(direct.is_some()),
            direct,
            base,
            size,
            drop_behind,
            plain_because: Mutex::new(plain_because),
        })
    }

    /// Fill `out` with the file's bytes from `base + offset`; `out` may run past the end of the
    /// file by less than [`DIRECT_ALIGN`] (that part is left as it was).
    pub(super) fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), String> {
        let at = self.base + offset as u64;
        let want = out.len().min((self.size - at) as usize);
        if let Some(f) = self.direct.as_ref().filter(|_| self.direct_on.load(Ordering::Relaxed)) {
            match read_at(f, self.path, at, out, want) {
                Ok(()) => {
                    self.drop_behind(at, want);
                    return Ok(());
                }
                // Some filesystems accept the O_DIRECT open and refuse the reads.
                Err((msg, Some(libc::EINVAL))) => {
                    if self.direct_on.swap(false, Ordering::Relaxed) {
                        *self.plain_because.lock().unwrap_or_else(|e| e.into_inner()) =
                            format!("O_DIRECT refused: {msg}");
                    }
                }
                Err((msg, _)) => return Err(msg),
            }
        }
        read_at(&self.plain, self.path, at, &mut out[..want], want).map_err(|(m, _)| m)?;
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

    /// For logs and tests: "O_DIRECT reads ..." or "plain reads (why) ...", the pipeline, the drop.
    pub(super) fn method(&self, staging: &Staging) -> String {
        let how = if self.direct_on.load(Ordering::Relaxed) {
            "O_DIRECT reads".to_string()
        } else {
            let why = self.plain_because.lock().unwrap_or_else(|e| e.into_inner());
            format!("plain reads ({why})")
        };
        format!(
            "{how} through pinned staging ({}){}",
            staging.describe(),
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

/// Fill `out` from `file` at byte `at`: the first `want` bytes must arrive, the rest of `out` may
/// lie past the end of the file. Errors name the file and the offset.
fn read_at(file: &std::fs::File, path: &Path, at: u64, out: &mut [u8], want: usize) -> Result<(), ReadError> {
    let mut done = 0;
    while done < want {
        match file.read_at(&mut out[done..], at + done as u64) {
            Ok(0) => {
                let at = at + done as u64;
                return Err((format!("{}: the file ends at offset {at}", path.display()), None));
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                let at = at + done as u64;
                let msg = format!(
                    "{}: read of {} bytes at offset {at} failed: {e}",
                    path.display(),
                    out.len() - done
                );
                return Err((msg, e.raw_os_error()));
            }
        }
    }
    Ok(())
}

/// Writes bytes `offset..offset + chunk.len()` of the data to place into `chunk`; called from
/// several threads at once.
pub type ChunkReader<'a> = dyn Fn(usize, &mut [u8]) -> Result<(), String> + Sync + 'a;

/// Fill a new device buffer of `total` bytes chunk by chunk through pinned staging buffers:
/// `read(offset, chunk)` writes bytes `offset..offset+chunk.len()` (the last chunk's length rounded
/// up to `align`, so it may reach past `total`; `staging.chunk_bytes` is rounded up to `align`).
/// `progress(done, total)` follows every chunk, in the order the copies are enqueued.
pub fn upload_with(
    ctx: &HipContext,
    total: usize,
    align: usize,
    staging: Staging,
    read: &ChunkReader<'_>,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<DeviceBuffer, String> {
    let align = align.max(1);
    let chunk = staging.chunk_bytes.min(total.max(1)).next_multiple_of(align);
    let (threads, slots) = pipeline_shape(staging, total, chunk);
    let mut pinned = (0..slots)
        .map(|_| PinnedBuffer::new(ctx, chunk))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    let slots: Vec<&mut [u8]> = pinned.iter_mut().map(|b| b.as_mut_slice()).collect();
    let fill = |slot: &mut &mut [u8], offset: usize, n: usize| -> Result<*const u8, String> {
        read(offset, &mut slot[..n.next_multiple_of(align)])?;
        Ok(slot.as_ptr())
    };
    copy_in_chunks(ctx, total, chunk, threads, slots, &fill, progress)
}

/// Copy `base..base+total` of the host range `mapping` (a file mapping, page aligned at `base`) to
/// a new device buffer by registering it chunk by chunk (read-only where the runtime allows) and
/// copying from the registered memory.
///
/// # Safety
/// `mapping..mapping+base+total` must stay mapped, and unchanged, for the whole call.
pub unsafe fn upload_registered(
    ctx: &HipContext,
    mapping: *const u8,
    base: usize,
    total: usize,
    staging: Staging,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<DeviceBuffer, String> {
    let chunk = staging.chunk_bytes.min(total.max(1)).next_multiple_of(DIRECT_ALIGN);
    let (threads, slots) = pipeline_shape(staging, total, chunk);
    let slots: Vec<Option<HostRegistration<'static>>> = (0..slots).map(|_| None).collect();
    let start = mapping as usize + base;
    let read_only = AtomicBool::new(true);
    let fill = |slot: &mut Option<HostRegistration<'static>>, offset: usize, n: usize| -> Result<*const u8, String> {
        *slot = None; // unregister the chunk this slot held (its copy has finished)
        let ptr = (start + offset) as *mut std::ffi::c_void;
        loop {
            let ro = read_only.load(Ordering::Relaxed);
            // SAFETY: the range lies inside the mapping, which the caller keeps alive and unchanged;
            // the registration is dropped before this function returns.
            match unsafe { HostRegistration::from_raw(ctx, ptr, n, false, ro) } {
                Ok(r) => {
                    *slot = Some(r);
                    return Ok(ptr as *const u8);
                }
                Err(_) if ro => read_only.store(false, Ordering::Relaxed),
                Err(e) => return Err(format!("cannot register the file mapping at offset {offset}: {e}")),
            }
        }
    };
    copy_in_chunks(ctx, total, chunk, threads, slots, &fill, progress)
}

/// Reader threads and slots for `total` bytes in chunks of `chunk`: no more threads than chunks,
/// at least one slot per thread.
fn pipeline_shape(staging: Staging, total: usize, chunk: usize) -> (usize, usize) {
    let chunks = total.div_ceil(chunk).max(1);
    let threads = staging.threads.clamp(1, chunks);
    (threads, staging.buffers.min(chunks).max(threads))
}

/// A filled slot on its way to the copy: slot index, the slot, device offset, bytes, host address.
type Filled<S> = (usize, S, usize, usize, usize);

/// The pipeline: `threads` workers each take a free slot and the next chunk, `fill(slot, offset,
/// n)` it (returning the host address to copy from), and pass it to this thread, which enqueues
/// the copy, records the slot's event and frees the oldest slots once at most `slots - threads`
/// copies are in flight (so a worker always finds a free slot). Only this thread calls the stream.
fn copy_in_chunks<S: Send>(
    ctx: &HipContext,
    total: usize,
    chunk: usize,
    threads: usize,
    slots: Vec<S>,
    fill: &(dyn Fn(&mut S, usize, usize) -> Result<*const u8, String> + Sync),
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
    let events = (0..slots.len())
        .map(|_| ctx.event(false))
        .collect::<Result<Vec<_>, _>>()
        .map_err(hip)?;
    let keep_free = threads;
    let max_pending = slots.len() - keep_free;
    let chunks = total.div_ceil(chunk);
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let (free_tx, free_rx) = mpsc::channel::<(usize, S)>();
    let free_rx = Mutex::new(free_rx);
    let (filled_tx, filled_rx) = mpsc::channel::<Result<Filled<S>, String>>();
    for (i, s) in slots.into_iter().enumerate() {
        let _ = free_tx.send((i, s));
    }
    let worker = |filled: mpsc::Sender<Result<Filled<S>, String>>| {
        let _ = ctx.bind_thread();
        loop {
            let got = free_rx.lock().unwrap_or_else(|e| e.into_inner()).recv();
            let Ok((k, mut slot)) = got else { return };
            let c = next.fetch_add(1, Ordering::Relaxed);
            if c >= chunks || stop.load(Ordering::Relaxed) {
                return;
            }
            let offset = c * chunk;
            let n = chunk.min(total - offset);
            let sent = match fill(&mut slot, offset, n) {
                Ok(addr) => filled.send(Ok((k, slot, offset, n, addr as usize))),
                Err(e) => filled.send(Err(e)),
            };
            if sent.is_err() {
                return;
            }
        }
    };
    let worker = &worker;
    std::thread::scope(|s| {
        for _ in 0..threads {
            let tx = filled_tx.clone();
            s.spawn(move || worker(tx));
        }
        drop(filled_tx);
        let mut pending = std::collections::VecDeque::new();
        let mut done = 0usize;
        let result = (|| -> Result<(), String> {
            for _ in 0..chunks {
                let (k, slot, offset, n, addr) = filled_rx
                    .recv()
                    .map_err(|_| "a weight reader thread stopped".to_string())??;
                // SAFETY: `addr..addr+n` is the slot's pinned buffer or registered chunk, which
                // stays with this thread (untouched) until the event recorded next has passed.
                unsafe { dev.copy_from_locked_host_async(offset, addr as *const u8, n, &stream) }.map_err(hip)?;
                events[k].record(&stream).map_err(hip)?;
                pending.push_back((k, slot));
                while pending.len() > max_pending {
                    let (k, slot) = pending.pop_front().expect("pending is not empty");
                    events[k].synchronize().map_err(hip)?;
                    let _ = free_tx.send((k, slot));
                }
                done += n;
                progress(done as u64, total as u64);
            }
            stream.synchronize().map_err(hip)
        })();
        // Wake and stop the workers; slots still pending are dropped once their copies finish.
        stop.store(true, Ordering::Relaxed);
        drop(free_tx);
        let _ = stream.synchronize();
        drop(pending);
        result
    })?;
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

    const ONE_THREAD: Staging = Staging {
        chunk_bytes: STAGING_BYTES,
        buffers: 4,
        threads: 1,
    };

    #[test]
    fn refused_direct_reads_fall_back_to_plain_ones_and_say_so() {
        // A staging buffer O_DIRECT cannot use (not block aligned) makes the kernel refuse the
        // first read with EINVAL, as filesystems without O_DIRECT support do.
        let (path, bytes) = scratch_file("direct-refused", 3 * DIRECT_ALIGN + 100);
        let reader = FileReader::open(&path, 0, bytes.len() as u64, ReadMode::Direct, false).unwrap();
        assert_eq!(
            reader.method(&ONE_THREAD),
            "O_DIRECT reads through pinned staging (1 threads, 4 x 64 MiB)"
        );
        let padded = bytes.len().next_multiple_of(DIRECT_ALIGN);
        let mut backing = vec![0u8; padded + 2];
        let skew = if backing.as_ptr() as usize % 512 == 511 { 2 } else { 1 };
        let out = &mut backing[skew..skew + padded];
        reader.read(0, out).unwrap();
        assert!(out[..bytes.len()] == bytes[..]);
        let method = reader.method(&ONE_THREAD);
        assert!(
            method.starts_with("plain reads (O_DIRECT refused: ") && method.contains("offset 0"),
            "{method}"
        );
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn direct_reads_fill_aligned_chunks_up_to_the_end_of_the_file() {
        let (path, bytes) = scratch_file("direct-tail", 5 * DIRECT_ALIGN + 321);
        let base = DIRECT_ALIGN as u64;
        let reader = FileReader::open(&path, base, bytes.len() as u64, ReadMode::Direct, true).unwrap();
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
            reader.method(&ONE_THREAD),
            "O_DIRECT reads through pinned staging (1 threads, 4 x 64 MiB), page cache dropped behind"
        );
        // SAFETY: allocated above with this layout.
        unsafe { std::alloc::dealloc(ptr, layout) };
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn the_pipeline_has_a_slot_for_every_thread_and_no_idle_threads() {
        let s = Staging {
            chunk_bytes: 64,
            buffers: 16,
            threads: 8,
        };
        assert_eq!(pipeline_shape(s, 64 * 100, 64), (8, 16));
        assert_eq!(pipeline_shape(s, 64 * 3, 64), (3, 3));
        assert_eq!(pipeline_shape(s, 1, 64), (1, 1));
        let few = Staging { buffers: 2, ..s };
        assert_eq!(pipeline_shape(few, 64 * 100, 64), (8, 8));
    }
}
