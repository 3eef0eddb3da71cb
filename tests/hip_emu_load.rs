//! The single-copy weight load on the HIP runtime emulator (every hip* call runs on the CPU): the
//! bytes on the device equal the file through O_DIRECT reads (a file on a disk filesystem under
//! target/), through plain reads, from the file mapping registered chunk by chunk, and from
//! /dev/shm (tmpfs, which refuses O_DIRECT before Linux 6.6; the forced refusal is a unit test in
//! weight_load.rs); the file's pages are gone from the page cache after a load that drops them
//! behind, where the filesystem honours DONTNEED; the multi-threaded staging pipeline keeps every
//! byte across many chunks and a padded tail.
//!
//! One test function: the emulator is selected through process environment variables before the
//! HIP runtime is first loaded. Run with `--features hip`.
#![cfg(feature = "hip")]

mod hip_emu;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ds4_chat::backend::hip::HipContext;
use ds4_chat::backend::hip::weights::{DIRECT_ALIGN, DeviceWeights, LoadOptions, ReadMode, Staging, upload_with};
use ds4_chat::backend::residency::file_cached_bytes;
use ds4_chat::genmodel::{ExpertMix, GenSpec, Preset, SyntheticModel};
use ds4_chat::model::Model;

fn write_model(path: &Path) {
    let mut spec = GenSpec::new(Preset::Tiny, 11, ExpertMix::Q2);
    spec.hp.n_vocab = 512;
    spec.hp.n_layer = 2;
    spec.hp.n_hash_layer = 1;
    spec.hp.compress_ratios = vec![0, 4];
    spec.hp.swiglu_clamp = vec![10.0; 2];
    spec.tokenizer = false;
    SyntheticModel::new(&spec).unwrap().write_file(path, 1, |_| {}).unwrap();
    // Written pages are dirty until written back, and DONTNEED only drops clean pages.
    std::fs::File::open(path).unwrap().sync_all().unwrap();
}

fn drop_pages(path: &Path) {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path).unwrap();
    // SAFETY: advice on an open descriptor.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
}

fn cached(path: &Path) -> u64 {
    file_cached_bytes(&std::fs::File::open(path).unwrap()).unwrap()
}

/// Every tensor as the device sees it equals the file's bytes.
fn assert_device_equals_file(ctx: &HipContext, model: &Model, w: &DeviceWeights) {
    let mut tensors = 0;
    for (_, t) in model.grouped_tensors() {
        let mut back = vec![0u8; t.nbytes as usize];
        w.read_back(ctx, t, &mut back).unwrap();
        assert!(
            back == model.data(t),
            "tensor {} differs on the device ({})",
            t.name,
            w.method
        );
        tensors += 1;
    }
    assert!(tensors > 10, "{tensors}");
}

/// Load `path` (no drop-behind), check that the load says it used `method`, and compare the device
/// copy with the file; everything is released on return.
fn load_and_compare(ctx: &HipContext, path: &Path, mode: ReadMode, method: &str) {
    let (model, w) = load(ctx, path, mode, false);
    assert!(w.method.starts_with(method), "{}", w.method);
    assert_device_equals_file(ctx, &model, &w);
}

fn load(ctx: &HipContext, path: &Path, mode: ReadMode, drop_behind: bool) -> (Arc<Model>, DeviceWeights) {
    let model = Arc::new(Model::open(path).unwrap());
    let opts = options(mode, drop_behind);
    let mut last = (0, 0);
    let w = DeviceWeights::upload_with_options(ctx, &model, opts, &mut |d, t| last = (d, t)).unwrap();
    assert_eq!(last, (w.len_bytes() as u64, w.len_bytes() as u64));
    (model, w)
}

/// Small chunks, so the tiny model crosses several of them on three reader threads.
fn options(mode: ReadMode, drop_behind: bool) -> LoadOptions {
    let staging = Staging {
        chunk_bytes: 1 << 20,
        buffers: 6,
        threads: 3,
    };
    LoadOptions {
        mode,
        drop_behind,
        staging,
    }
}

#[test]
fn single_copy_load_on_the_emulator() {
    let Some(_) = hip_emu::use_emulated_hip() else {
        return;
    };
    // SAFETY: the only test of this binary; no other thread reads the environment.
    unsafe { std::env::set_var("DS4_EMU_MEM_MIB", "4096") };
    let ctx = HipContext::new().unwrap();
    let dir =
        Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("target/test-scratch/hip-load-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tiny.gguf");
    write_model(&path);
    let size = std::fs::metadata(&path).unwrap().len();

    // O_DIRECT from a disk filesystem (target/ is not tmpfs on the machines this runs on).
    drop_pages(&path);
    load_and_compare(
        &ctx,
        &path,
        ReadMode::Direct,
        "O_DIRECT reads through pinned staging (3 threads, 6 x 1 MiB)",
    );

    // Auto on a file fully in the page cache: plain reads, said why.
    std::fs::read(&path).unwrap();
    load_and_compare(
        &ctx,
        &path,
        ReadMode::Auto,
        "plain reads (100% of the file in the page cache) through pinned staging",
    );

    // No staging copy: the file mapping registered chunk by chunk.
    load_and_compare(
        &ctx,
        &path,
        ReadMode::Register,
        "registered file mapping, chunk by chunk",
    );

    // Pages dropped behind the reads, where the filesystem honours DONTNEED. Pages the model's
    // own mapping holds (the header the parser read, with the kernel's fault-around) cannot be
    // dropped: that is the floor, measured with the model open.
    let model = Arc::new(Model::open(&path).unwrap());
    drop_pages(&path);
    let floor = cached(&path);
    let honours = floor < size / 4;
    std::fs::read(&path).unwrap();
    assert!(
        cached(&path) >= size / 2,
        "{} of {size} cached after reading the file",
        cached(&path)
    );
    let opts = options(ReadMode::Buffered, true);
    let w = DeviceWeights::upload_with_options(&ctx, &model, opts, &mut |_, _| {}).unwrap();
    // Measured before anything reads the tensors through the mapping again.
    let after = cached(&path);
    assert!(w.method.ends_with(", page cache dropped behind"), "{}", w.method);
    assert_device_equals_file(&ctx, &model, &w);
    drop((model, w));
    if honours {
        assert!(
            after <= floor,
            "{after} bytes cached after the load, {floor} held by the mapping, file {size}"
        );
        // Without the drop the same load leaves the file cached.
        drop_pages(&path);
        let (_m, _w) = load(&ctx, &path, ReadMode::Buffered, false);
        assert!(cached(&path) >= size / 2, "{} of {size}", cached(&path));
    } else {
        hip_emu::skip::skip_part("this filesystem ignores POSIX_FADV_DONTNEED: the page-drop check");
    }

    // The fallback where O_DIRECT is refused: tmpfs.
    let shm = Path::new("/dev/shm");
    if std::fs::metadata(shm).is_ok() && statfs_is_tmpfs(shm) {
        let p = shm.join(format!("ds4-load-{}.gguf", std::process::id()));
        std::fs::copy(&path, &p).unwrap();
        // tmpfs takes O_DIRECT since Linux 6.6; older kernels refuse it (the weights.rs unit tests
        // force the refusal on any kernel).
        let (model, w) = load(&ctx, &p, ReadMode::Direct, false);
        assert!(
            w.method.starts_with("plain reads (O_DIRECT refused: ") || w.method.starts_with("O_DIRECT reads"),
            "{}",
            w.method
        );
        assert_device_equals_file(&ctx, &model, &w);
        drop((model, w));
        std::fs::remove_file(&p).unwrap();
    } else {
        hip_emu::skip::skip_part("/dev/shm is not tmpfs here: the O_DIRECT fallback check");
    }

    // The pipeline on its own: many full chunks and a tail padded to the alignment, filled by
    // four threads in whatever order they finish; every byte lands where it belongs.
    let staging = Staging {
        chunk_bytes: 1 << 20,
        buffers: 6,
        threads: 4,
    };
    let total = 37 * staging.chunk_bytes + 12_345;
    let pattern = |i: usize| (i.wrapping_mul(2_654_435_761) >> 13) as u8;
    let read = |offset: usize, out: &mut [u8]| {
        assert_eq!(offset % staging.chunk_bytes, 0);
        assert_eq!(out.len() % DIRECT_ALIGN, 0);
        for (i, b) in out.iter_mut().enumerate() {
            *b = pattern(offset + i);
        }
        Ok(())
    };
    let (mut chunks, mut last) = (0, 0);
    let buf = upload_with(&ctx, total, DIRECT_ALIGN, staging, &read, &mut |d, _| {
        assert!(d > last);
        (chunks, last) = (chunks + 1, d);
    })
    .unwrap();
    assert_eq!((chunks, last), (38, total as u64));
    let mut back = vec![0u8; total];
    // SAFETY: `back` has the buffer's length.
    unsafe { ctx.copy_device_to_host(buf.ptr(), &mut back) }.unwrap();
    let wrong = back.iter().enumerate().filter(|(i, b)| **b != pattern(*i)).count();
    assert_eq!(wrong, 0);
    std::fs::remove_dir_all(&dir).unwrap();
}

fn statfs_is_tmpfs(p: &Path) -> bool {
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    let c = std::ffi::CString::new(PathBuf::from(p).into_os_string().into_encoded_bytes()).unwrap();
    // SAFETY: a zeroed statfs is a valid out-parameter; the path is NUL-terminated.
    let mut s: libc::statfs = unsafe { std::mem::zeroed() };
    (unsafe { libc::statfs(c.as_ptr(), &mut s) } == 0) && s.f_type as i64 == TMPFS_MAGIC
}
