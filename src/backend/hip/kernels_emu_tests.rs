//! The GPU kernels run on the CPU emulator (kernels/emu) against the CPU reference engine
//! (src/backend/cpu), through the same [`Launch`] builders the HIP backend uses. This checks the
//! kernel math, the launch grids and the argument packing without a GPU, for wave size 32 and 64.
//!
//! The emulator library is compiled at test time with the first of clang++-19 / clang++ / g++
//! found (skipped with a message when there is none); a kernel that does not compile there fails.
//! Exactness: the matvec and GEMM kernels (Q8_0, F16, K-quant experts, shared expert) compute the
//! CPU reference's float operations in its order and are compared bit for bit (`same_bits`). Other
//! kernels sum in a different order than the sequential CPU code (warp trees, split partial sums),
//! so they agree to float rounding, about 1e-6 relative per sum; those tests allow a stated
//! tolerance relative to the magnitude of the summed terms (`close`). Quantizer outputs are compared
//! exactly when the kernel and the reference quantize identical inputs.

use super::*;
use crate::backend::cpu::{attention, compressor, hc, indexer, moe, ops, quant};
use crate::gguf::half::{f32_to_f16, round_f16};
use crate::model::hparams::HParams;
use std::ffi::{CString, c_char, c_int};
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

type LaunchFn = unsafe extern "C" fn(*const c_char, *const u32, *const u32, *mut *mut c_void) -> c_int;
type NameFn = unsafe extern "C" fn(c_int) -> *const c_char;

struct Emu {
    launch: LaunchFn,
    name: NameFn,
    warp: u32,
}

fn compiler() -> Option<&'static str> {
    ["clang++-19", "clang++", "g++"].into_iter().find(|c| {
        std::process::Command::new(c)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

fn build_emu(warp: u32) -> Option<Mutex<Emu>> {
    let Some(cxx) = compiler() else {
        eprintln!("kernels emulator: SKIPPED (no clang++-19, clang++ or g++ on PATH)");
        return None;
    };
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let lib = PathBuf::from(env!("OUT_DIR")).join(format!("libds4emu{warp}.{}.so", std::process::id()));
    let out = std::process::Command::new(cxx)
        .args([
            "-std=c++17",
            "-O1",
            "-ffp-contract=off",
            "-fPIC",
            "-shared",
            "-U_FORTIFY_SOURCE",
            "-DDS4_EMU",
        ])
        .arg(format!("-DDS4_EMU_WARP={warp}"))
        .arg(format!("-I{}", root.join("kernels/emu").display()))
        .arg(format!("-I{}", root.join("kernels").display()))
        .arg(root.join("kernels/emu/emu_lib.cpp"))
        .arg("-o")
        .arg(&lib)
        .output()
        .expect("run the C++ compiler");
    assert!(
        out.status.success(),
        "kernels do not compile for the CPU emulator ({cxx}):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = CString::new(lib.to_str().unwrap()).unwrap();
    // SAFETY: loading a library we just built; symbols looked up by their C names and types.
    unsafe {
        let h = libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        assert!(!h.is_null(), "dlopen {}", lib.display());
        let sym = |n: &str| {
            let c = CString::new(n).unwrap();
            let p = libc::dlsym(h, c.as_ptr());
            assert!(!p.is_null(), "emulator lacks {n}");
            p
        };
        let launch: LaunchFn = std::mem::transmute(sym("ds4emu_launch"));
        let name: NameFn = std::mem::transmute(sym("ds4emu_kernel_name"));
        let ws: unsafe extern "C" fn() -> c_int = std::mem::transmute(sym("ds4emu_warp_size"));
        assert_eq!(ws() as u32, warp);
        let _ = std::fs::remove_file(&lib);
        Some(Mutex::new(Emu { launch, name, warp }))
    }
}

fn emu(warp: u32) -> Option<&'static Mutex<Emu>> {
    static E32: OnceLock<Option<Mutex<Emu>>> = OnceLock::new();
    static E64: OnceLock<Option<Mutex<Emu>>> = OnceLock::new();
    let cell = if warp == 32 { &E32 } else { &E64 };
    cell.get_or_init(|| build_emu(warp)).as_ref()
}

/// Runs `f` once per emulated wave size (32, 64); skipped without a compiler. The decode-style
/// kernels run on the first 3 tokens of a batch only (the emulator switches fibers at every
/// shuffle, so it is slow); the GEMMs run on batches that cross their 64-column tiles.
fn each_warp(f: impl Fn(&Emu)) {
    for warp in [32, 64] {
        let Some(m) = emu(warp) else { return };
        let e = m.lock().unwrap_or_else(|p| p.into_inner());
        f(&e);
    }
}

impl Emu {
    fn run(&self, l: &Launch) {
        let mut packed = l.packed();
        let mut ptrs = packed.pointers();
        let name = CString::new(l.kernel.name).unwrap();
        // SAFETY: the arguments match the kernel (checked by Launch::new); every pointer argument is a
        // live host buffer of the test, sized as the kernel's documentation requires.
        let rc = unsafe { (self.launch)(name.as_ptr(), l.grid.as_ptr(), l.block.as_ptr(), ptrs.as_mut_ptr()) };
        assert_eq!(
            rc, 0,
            "{} failed in the emulator (wave {}): rc {rc}",
            l.kernel.name, self.warp
        );
    }
}

// ---- helpers -------------------------------------------------------------------------------

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Uniform in [-1, 1).
    fn f(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.f() * scale).collect()
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

fn p<T>(v: &[T]) -> DevPtr {
    v.as_ptr() as DevPtr
}
fn pm<T>(v: &mut [T]) -> DevPtr {
    v.as_mut_ptr() as DevPtr
}

/// Device view of Q8_K activation planes (codes, scales, 16-element sums) held in host memory.
fn q8k_ptrs(q: &[i8], d: &[f32], bsums: &[i16]) -> Q8K {
    Q8K {
        q: p(q),
        d: p(d),
        bsums: p(bsums),
    }
}

/// |got - want| <= rel * scale + 1e-6 for every element, where scale is the magnitude of the terms.
fn close(what: &str, got: &[f32], want: &[f32], rel: f32, scale: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for i in 0..got.len() {
        let tol = rel * scale[i].abs().max(want[i].abs()) + 1e-6;
        assert!(
            (got[i] - want[i]).abs() <= tol,
            "{what}[{i}]: kernel {} vs reference {} (tol {tol})",
            got[i],
            want[i]
        );
    }
}

/// Bitwise equality: the matvec and GEMM kernels compute the CPU reference's float operations in its
/// order (kernels/formats.h "arithmetic of the CPU reference dots"), so no tolerance applies.
fn same_bits(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for i in 0..got.len() {
        assert!(
            got[i].to_bits() == want[i].to_bits(),
            "{what}[{i}]: kernel {} ({:#010x}) vs reference {} ({:#010x})",
            got[i],
            got[i].to_bits(),
            want[i],
            want[i].to_bits()
        );
    }
}

/// Random weight rows of a block format with sane f16 scales at the given byte offsets.
fn random_rows(
    rng: &mut Rng,
    rows: usize,
    n: usize,
    block_elems: usize,
    block_bytes: usize,
    f16_at: &[usize],
) -> Vec<u8> {
    let mut w = rng.bytes(rows * n / block_elems * block_bytes);
    for blk in w.chunks_exact_mut(block_bytes) {
        for &o in f16_at {
            let v = f32_to_f16(0.002 + 0.01 * (rng.f() + 1.0));
            blk[o..o + 2].copy_from_slice(&v.to_le_bytes());
        }
    }
    w
}

/// Q8_K activation planes (q, d, bsums) of rows of x, quantized by the CPU reference.
fn q8k_planes(x: &[f32], n: usize) -> (Vec<i8>, Vec<f32>, Vec<i16>) {
    let mut blocks = vec![quant::BlockQ8K::default(); x.len() / 256];
    quant::quantize_q8_k(x, &mut blocks);
    let mut q = Vec::new();
    let mut d = Vec::new();
    let mut bs = Vec::new();
    for b in &blocks {
        q.extend_from_slice(&b.qs);
        d.push(b.d);
        bs.extend_from_slice(&b.bsums);
    }
    assert_eq!(q.len() % n, 0);
    (q, d, bs)
}

fn q8k_blocks(x: &[f32]) -> Vec<quant::BlockQ8K> {
    let mut blocks = vec![quant::BlockQ8K::default(); x.len() / 256];
    quant::quantize_q8_k(x, &mut blocks);
    blocks
}

fn f16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|&x| f32_to_f16(x).to_le_bytes()).collect()
}
fn f16_words(v: &[f32]) -> Vec<u16> {
    v.iter().map(|&x| f32_to_f16(x)).collect()
}

// ---- tests ---------------------------------------------------------------------------------

#[test]
fn emulator_registers_every_kernel() {
    each_warp(|e| {
        let mut names = Vec::new();
        // SAFETY: the emulator returns static NUL-terminated names, NULL past the end.
        unsafe {
            let mut i = 0;
            loop {
                let n = (e.name)(i);
                if n.is_null() {
                    break;
                }
                names.push(std::ffi::CStr::from_ptr(n).to_str().unwrap().to_string());
                i += 1;
            }
        }
        let mut ours: Vec<String> = ALL_KERNELS.iter().map(|k| k.name.to_string()).collect();
        // Emulator-only test entries are not kernels of the module.
        names.retain(|n| !n.starts_with("ds4_emutest_"));
        names.sort();
        ours.sort();
        assert_eq!(names, ours);
    });
}

#[test]
fn rms_norm_and_activation_quantization() {
    each_warp(|e| {
        let mut rng = Rng(7);
        let (n, rows) = (512usize, 3usize);
        let x = rng.vec(n * rows, 3.0);
        let w = rng.vec(n, 1.5);
        let mut out = vec![0f32; n * rows];
        let mut q0 = vec![0i8; n * rows];
        let mut d0 = vec![0f32; n * rows / 32];
        let mut qk = vec![0i8; n * rows];
        let mut dk = vec![0f32; n * rows / 256];
        let mut bk = vec![0i16; n * rows / 16];
        let o = QuantOut {
            out: pm(&mut out),
            q8_0_q: pm(&mut q0),
            q8_0_d: pm(&mut d0),
            q8_k_q: pm(&mut qk),
            q8_k_d: pm(&mut dk),
            q8_k_bs: pm(&mut bk),
        };
        e.run(&rms_norm_quant(
            o,
            p(&x),
            p(&w),
            n as u32,
            n as u32,
            rows as u32,
            NQ_NORM,
            1e-6,
        ));
        for r in 0..rows {
            let mut want = vec![0f32; n];
            ops::rms_norm(&mut want, &x[r * n..(r + 1) * n], Some(&w), 1e-6);
            same_bits("rms_norm", &out[r * n..(r + 1) * n], &want);
            // The quantizers see identical inputs, so codes and scales must be identical.
            let row = &out[r * n..(r + 1) * n];
            let mut a = quant::Q8_0Act::with_len(n);
            quant::quantize_q8_0(row, &mut a);
            assert_eq!(&q0[r * n..(r + 1) * n], &a.qs[..], "Q8_0 codes row {r}");
            assert_eq!(&d0[r * n / 32..(r + 1) * n / 32], &a.scales[..], "Q8_0 scales row {r}");
            let (q, d, bs) = q8k_planes(row, n);
            assert_eq!(&qk[r * n..(r + 1) * n], &q[..], "Q8_K codes row {r}");
            assert_eq!(&dk[r * n / 256..(r + 1) * n / 256], &d[..], "Q8_K scales row {r}");
            assert_eq!(&bk[r * n / 16..(r + 1) * n / 16], &bs[..], "Q8_K sums row {r}");
        }
        // A row shorter than one 256-chunk (Q8_0 only: 96 = 3 blocks, lanes past the end idle), and
        // a Q8_K row whose largest |v| occurs twice with opposite signs (the first one sets the sign).
        let short = rng.vec(96, 2.0);
        let (mut q0s, mut d0s) = (vec![0i8; 96], vec![0f32; 3]);
        let os = QuantOut {
            q8_0_q: pm(&mut q0s),
            q8_0_d: pm(&mut d0s),
            ..Default::default()
        };
        e.run(&quantize_rows(os, p(&short), 96, 1));
        let mut a = quant::Q8_0Act::with_len(96);
        quant::quantize_q8_0(&short, &mut a);
        assert_eq!((&q0s[..], &d0s[..]), (&a.qs[..], &a.scales[..]), "short Q8_0 row");
        let mut tie = rng.vec(256, 1.0);
        (tie[77], tie[200]) = (-5.0, 5.0);
        let (mut qt, mut dt, mut bt) = (vec![0i8; 256], vec![0f32; 1], vec![0i16; 16]);
        let ot = QuantOut {
            q8_k_q: pm(&mut qt),
            q8_k_d: pm(&mut dt),
            q8_k_bs: pm(&mut bt),
            ..Default::default()
        };
        e.run(&quantize_rows(ot, p(&tie), 256, 1));
        let (q, d, bs) = q8k_planes(&tie, 256);
        assert_eq!((&qt[..], &dt[..], &bt[..]), (&q[..], &d[..], &bs[..]), "Q8_K tie row");
        assert!(
            dt[0] > 0.0 && qt[77] == -127,
            "the first extreme (-5 at 77) sets the scale: d = m * -1/127"
        );
    });
}

/// Q8_0 matvec (grouped) and GEMM bitwise equal to quant::dot_q8_0. Shapes: 8 blocks per row (less
/// than one lane-group step), and 35 blocks (several steps of 16/32 blocks plus a partial one; a
/// partial GEMM stage of chunks) with 2 groups of 64 rows.
#[test]
fn q8_0_matvec_grouped_and_gemm() {
    each_warp(|e| {
        for (n_in, groups, rpg, n_tok) in [(256usize, 2usize, 64usize, 3usize), (1120, 2, 64, 66)] {
            let mut rng = Rng(11 + n_in as u64);
            let n_out = groups * rpg;
            let rb = n_in / 32 * 34;
            let w = random_rows(&mut rng, n_out, n_in, 32, 34, &[0]);
            let x = rng.vec(n_tok * groups * n_in, 2.0);
            let mut xq = Vec::new();
            let mut xd = Vec::new();
            for t in 0..n_tok {
                let mut a = quant::Q8_0Act::with_len(groups * n_in);
                quant::quantize_q8_0(&x[t * groups * n_in..(t + 1) * groups * n_in], &mut a);
                xq.extend_from_slice(&a.qs);
                xd.extend_from_slice(&a.scales);
            }
            let mut want = vec![0f32; n_tok * n_out];
            for t in 0..n_tok {
                for r in 0..n_out {
                    let g = r / rpg;
                    let q = &xq[t * groups * n_in + g * n_in..][..n_in];
                    let s = &xd[(t * groups * n_in + g * n_in) / 32..][..n_in / 32];
                    want[t * n_out + r] = quant::dot_q8_0(&w[r * rb..(r + 1) * rb], q, s);
                }
            }
            let (ni, no, g, xs) = (n_in as u32, n_out as u32, rpg as u32, (groups * n_in) as u32);
            let nd = 3.min(n_tok);
            let mut y = vec![0f32; n_tok * n_out];
            e.run(&matvec_q8_0(
                pm(&mut y),
                p(&w),
                p(&xq),
                p(&xd),
                ni,
                no,
                g,
                xs,
                nd as u32,
            ));
            same_bits("matvec_q8_0", &y[..nd * n_out], &want[..nd * n_out]);
            let mut y2 = vec![0f32; n_tok * n_out];
            e.run(&gemm_q8_0(
                pm(&mut y2),
                p(&w),
                p(&xq),
                p(&xd),
                ni,
                no,
                g,
                xs,
                n_tok as u32,
            ));
            same_bits("gemm_q8_0", &y2, &want);
        }
    });
}

/// F16 matvec, pair and GEMM bitwise equal to quant::dot_f16 (one sequential sum per row): a short
/// row (128) and a router-length one (4104: 16 full stages of 256 per row and a partial one).
#[test]
fn f16_matvec_pair_and_gemm() {
    each_warp(|e| {
        for (n_in, n_out, n_tok) in [(128usize, 20usize, 70usize), (4104, 11, 66)] {
            let mut rng = Rng(5 + n_in as u64);
            let wf = rng.vec(n_in * n_out, 0.5);
            let w = f16_words(&wf);
            let wb = f16_bytes(&wf);
            let x = rng.vec(n_in * n_tok, 1.0);
            let mut want = vec![0f32; n_tok * n_out];
            for t in 0..n_tok {
                for r in 0..n_out {
                    want[t * n_out + r] =
                        quant::dot_f16(&wb[r * 2 * n_in..(r + 1) * 2 * n_in], &x[t * n_in..(t + 1) * n_in]);
                }
            }
            let (ni, no, nt) = (n_in as u32, n_out as u32, n_tok as u32);
            let mut y = vec![0f32; n_tok * n_out];
            e.run(&matvec_f16(pm(&mut y), p(&w), p(&x), ni, no, ni, 3));
            same_bits("matvec_f16", &y[..3 * n_out], &want[..3 * n_out]);
            // The pair with two different matrices: W1 = W with its rows reversed.
            let w1: Vec<u16> = w.chunks(n_in).rev().flatten().copied().collect();
            let (mut y0, mut y1) = (vec![0f32; n_tok * n_out], vec![0f32; n_tok * n_out]);
            e.run(&matvec_f16_pair(
                pm(&mut y0),
                pm(&mut y1),
                p(&w),
                p(&w1),
                p(&x),
                ni,
                no,
                ni,
                3,
            ));
            same_bits("matvec_f16_pair.0", &y0[..3 * n_out], &want[..3 * n_out]);
            for t in 0..3 {
                let rev: Vec<f32> = want[t * n_out..(t + 1) * n_out].iter().rev().copied().collect();
                same_bits("matvec_f16_pair.1", &y1[t * n_out..(t + 1) * n_out], &rev);
            }
            let mut y2 = vec![0f32; n_tok * n_out];
            e.run(&gemm_f16(pm(&mut y2), p(&w), p(&x), ni, no, ni, nt));
            same_bits("gemm_f16", &y2, &want);
        }
    });
}

/// The emulator-only entry of kernels/matvec.hip.
const EMUTEST_BLOCK_DOT_F16_SEQ: KernelDef = KernelDef {
    name: "ds4_emutest_block_dot_f16_seq",
    params: &[
        Param {
            name: "y",
            kind: ArgKind::Ptr,
        },
        Param {
            name: "w",
            kind: ArgKind::Ptr,
        },
        Param {
            name: "x",
            kind: ArgKind::Ptr,
        },
        Param {
            name: "x_scale",
            kind: ArgKind::F32,
        },
        Param {
            name: "n",
            kind: ArgKind::U32,
        },
    ],
};

/// block_dot_f16_seq (the block-cooperative sequential F16 dot the HC mix uses) equals the CPU's
/// flat_i = x_i * scale followed by quant::dot_f16 over flat, bit for bit: lengths 16384 (the HC mix:
/// 8 stages of 2048), 2056 (a stage and one 8-element step) and 8, scale 1 and a non-trivial scale.
#[test]
fn block_dot_f16_seq_is_the_sequential_reference() {
    each_warp(|e| {
        for (n, scale) in [(16384usize, 0.37f32), (2056, 1.0), (8, 3.5)] {
            let mut rng = Rng(41 + n as u64);
            let rows = 2;
            let wf = rng.vec(rows * n, 0.5);
            let (w, wb) = (f16_words(&wf), f16_bytes(&wf));
            let x = rng.vec(n, 2.0);
            let flat: Vec<f32> = x.iter().map(|&v| v * scale).collect();
            let want: Vec<f32> = (0..rows)
                .map(|r| quant::dot_f16(&wb[r * 2 * n..(r + 1) * 2 * n], &flat))
                .collect();
            let mut y = vec![f32::NAN; rows];
            e.run(&Launch {
                kernel: &EMUTEST_BLOCK_DOT_F16_SEQ,
                grid: [rows as u32, 1, 1],
                block: [256, 1, 1],
                shared_bytes: 0,
                args: vec![
                    Arg::Ptr(pm(&mut y)),
                    Arg::Ptr(p(&w)),
                    Arg::Ptr(p(&x)),
                    Arg::F32(scale),
                    Arg::U32(n as u32),
                ],
            });
            same_bits(&format!("block_dot_f16_seq n {n}"), &y, &want);
        }
    });
}

/// (format, block bytes, f16 offsets, reference dot)
type KFmt = (
    ExpertFormat,
    usize,
    &'static [usize],
    fn(&[u8], &[quant::BlockQ8K]) -> f32,
);
const KFORMATS: [KFmt; 3] = [
    (ExpertFormat::Iq2Xxs, 66, &[0], quant::dot_iq2_xxs),
    (ExpertFormat::Q2K, 84, &[80, 82], quant::dot_q2_k),
    (ExpertFormat::Q4K, 144, &[0, 2], quant::dot_q4_k),
];

/// The K-quant matvecs bitwise equal to quant::dot_iq2_xxs / dot_q2_k / dot_q4_k: 2 super-blocks
/// (within one lane-group step) and 19 (several steps of 8/16 super-blocks and a partial one).
#[test]
fn k_quant_matvecs_match_the_reference_dots() {
    each_warp(|e| {
        for (fmt, bb, f16_at, dot) in KFORMATS {
            for n_in in [512usize, 19 * 256] {
                let mut rng = Rng(3 + bb as u64 + n_in as u64);
                let (n_out, n_tok) = (12usize, 2usize);
                let rb = n_in / 256 * bb;
                let w = random_rows(&mut rng, n_out, n_in, 256, bb, f16_at);
                let x = rng.vec(n_in * n_tok, 1.0);
                let (xq, xd, xbs) = q8k_planes(&x, n_in);
                let mut want = vec![0f32; n_tok * n_out];
                for t in 0..n_tok {
                    let blocks = q8k_blocks(&x[t * n_in..(t + 1) * n_in]);
                    for r in 0..n_out {
                        want[t * n_out + r] = dot(&w[r * rb..(r + 1) * rb], &blocks);
                    }
                }
                let mut y = vec![0f32; n_tok * n_out];
                let a = q8k_ptrs(&xq, &xd, &xbs);
                e.run(&matvec_k(
                    fmt,
                    pm(&mut y),
                    p(&w),
                    a,
                    n_in as u32,
                    n_out as u32,
                    n_tok as u32,
                ));
                same_bits(&format!("matvec {fmt:?} n_in {n_in}"), &y, &want);
            }
        }
    });
}

#[test]
fn moe_experts_decode_and_grouped_gemm() {
    each_warp(|e| {
        for (fmt, bb, f16_at, dot) in KFORMATS {
            let mut rng = Rng(17 + bb as u64);
            // n_in 512 / n_ff 1280: 2 and 5 super-blocks (several chain steps, partial ones); 6 slots
            // for the down kernel's interleaved slot chains.
            let (n_exp, n_used, n_in, n_ff, n_out, n_tok) = (8usize, 6usize, 512usize, 1280usize, 64usize, 67usize);
            let rb_in = n_in / 256 * bb;
            let rb_ff = n_ff / 256 * bb;
            let gate = random_rows(&mut rng, n_exp * n_ff, n_in, 256, bb, f16_at);
            let up = random_rows(&mut rng, n_exp * n_ff, n_in, 256, bb, f16_at);
            let down = random_rows(&mut rng, n_exp * n_out, n_ff, 256, bb, f16_at);
            let x = rng.vec(n_in * n_tok, 1.0);
            let (xq, xd, xbs) = q8k_planes(&x, n_in);
            let sel: Vec<u32> = (0..n_tok * n_used).map(|i| ((i * 7 + i / 5) % n_exp) as u32).collect();
            let selw: Vec<f32> = (0..n_tok * n_used).map(|i| 0.5 + 0.1 * (i % 3) as f32).collect();
            let limit = 0.5f32;
            // Reference mids.
            let mut want_mid = vec![0f32; n_tok * n_used * n_ff];
            for t in 0..n_tok {
                let blocks = q8k_blocks(&x[t * n_in..(t + 1) * n_in]);
                for k in 0..n_used {
                    let ex = sel[t * n_used + k] as usize;
                    for r in 0..n_ff {
                        let row = (ex * n_ff + r) * rb_in;
                        let g = dot(&gate[row..row + rb_in], &blocks);
                        let u = dot(&up[row..row + rb_in], &blocks);
                        want_mid[(t * n_used + k) * n_ff + r] = moe::swiglu(g, u, limit) * selw[t * n_used + k];
                    }
                }
            }
            let a = q8k_ptrs(&xq, &xd, &xbs);
            let (ni, nf, no, nu, nt) = (n_in as u32, n_ff as u32, n_out as u32, n_used as u32, n_tok as u32);
            let mut mid = vec![0f32; want_mid.len()];
            e.run(&moe_gate_up(
                fmt,
                pm(&mut mid),
                p(&gate),
                p(&up),
                a,
                p(&sel),
                p(&selw),
                ni,
                nf,
                nu,
                limit,
                3,
            ));
            same_bits(
                &format!("moe_gate_up {fmt:?}"),
                &mid[..3 * n_used * n_ff],
                &want_mid[..3 * n_used * n_ff],
            );
            // Grouped GEMM path.
            let max_tiles = moe_max_tiles(nt, nu, n_exp as u32);
            let mut pairs = vec![0u32; n_tok * n_used];
            let mut tiles = vec![0u32; (MOE_TILE_WORDS * max_tiles) as usize];
            let mut n_tiles = vec![0u32; 1];
            e.run(&moe_group(
                pm(&mut pairs),
                pm(&mut tiles),
                pm(&mut n_tiles),
                p(&sel),
                nt,
                nu,
                n_exp as u32,
                MOE_MIN_COLS,
            ));
            let tl = ExpertTiles {
                pairs: p(&pairs),
                tiles: p(&tiles),
                n_tiles: p(&n_tiles),
                max_tiles,
            };
            let mut mid2 = vec![0f32; want_mid.len()];
            e.run(&moe_gemm_gate_up(
                fmt,
                pm(&mut mid2),
                p(&gate),
                p(&up),
                a,
                tl,
                p(&selw),
                ni,
                nf,
                nu,
                limit,
            ));
            same_bits(&format!("moe_gemm_gate_up {fmt:?}"), &mid2, &want_mid);
            // Down projection on the reference mids.
            let (mq, md, mbs) = q8k_planes(&want_mid, n_ff);
            let m = q8k_ptrs(&mq, &md, &mbs);
            let mut want = vec![0f32; n_tok * n_out];
            for t in 0..n_tok {
                for r in 0..n_out {
                    let mut acc = 0f32;
                    for k in 0..n_used {
                        let blocks = q8k_blocks(&want_mid[(t * n_used + k) * n_ff..][..n_ff]);
                        let row = (sel[t * n_used + k] as usize * n_out + r) * rb_ff;
                        acc += dot(&down[row..row + rb_ff], &blocks);
                    }
                    want[t * n_out + r] = acc;
                }
            }
            let mut out = vec![0f32; n_tok * n_out];
            e.run(&moe_down(fmt, pm(&mut out), p(&down), m, p(&sel), nf, no, nu, 3));
            same_bits(&format!("moe_down {fmt:?}"), &out[..3 * n_out], &want[..3 * n_out]);
            let mut outp = vec![0f32; n_tok * n_used * n_out];
            let mut out2 = vec![0f32; n_tok * n_out];
            e.run(&moe_gemm_down(fmt, pm(&mut outp), p(&down), m, tl, nf, no, nu));
            e.run(&moe_sum(pm(&mut out2), p(&outp), no, nu, nt));
            same_bits(&format!("moe_gemm_down {fmt:?}"), &out2, &want);
        }
    });
}

/// ds4_moe_group's tiles, computed on the host from its documented rule: experts in order, each
/// expert's pairs (stable in p) in tiles of 64, the rest in one tile of the narrowest column class
/// from min_cols up that holds it. Returns (pairs, tiles as [expert, first, count, cols]).
fn expected_grouping(sel: &[u32], n_expert: usize, min_cols: u32) -> (Vec<u32>, Vec<[u32; 4]>) {
    let mut pairs = Vec::new();
    let mut tiles = Vec::new();
    for e in 0..n_expert as u32 {
        let mine: Vec<u32> = (0..sel.len() as u32).filter(|&p| sel[p as usize] == e).collect();
        for (i, part) in mine.chunks(64).enumerate() {
            let n = part.len() as u32;
            let cols = *MOE_TILE_COLS.iter().find(|&&c| c >= min_cols && c >= n).unwrap();
            tiles.push([e, (pairs.len() + 64 * i) as u32, n, cols]);
        }
        pairs.extend(mine);
    }
    (pairs, tiles)
}

/// The grouped expert GEMMs give bitwise identical outputs in every tile column class (MOE_TILE_COLS,
/// from ds4_moe_group's min_cols) as with every tile 64 wide, for each expert format, pair counts
/// 0..132 per expert (TILE_CLASS_COUNTS: every class and its edges), a row count (203) that ends
/// inside a tile and two 256-row tall tiles (n_ff 512); and equal the CPU reference dots bit for bit
/// (every class runs the reference's per-super-block float expression in order, kernels/gemm.hip;
/// n_in 512 and n_ff 512: two super-blocks, each spanning 2, 4 or 8 stages depending on the class). The grouping itself
/// must equal the documented rule exactly. Wave 32 only: these kernels use no shuffles.
#[test]
fn grouped_expert_tile_classes_are_bitwise_identical() {
    let Some(m) = emu(32) else { return };
    let e = m.lock().unwrap_or_else(|p| p.into_inner());
    let (n_used, n_in, n_ff, n_out) = (2usize, 512usize, 512usize, 203usize);
    let n_exp = TILE_CLASS_COUNTS.len();
    let sel = selection_with_counts(&TILE_CLASS_COUNTS, 99);
    let n_tok = sel.len() / n_used;
    let (nt, nu) = (n_tok as u32, n_used as u32);
    let max_tiles = moe_max_tiles(nt, nu, n_exp as u32);
    for (fmt, bb, f16_at, dot) in KFORMATS {
        let mut rng = Rng(5 + bb as u64);
        let gate = random_rows(&mut rng, n_exp * n_ff, n_in, 256, bb, f16_at);
        let up = random_rows(&mut rng, n_exp * n_ff, n_in, 256, bb, f16_at);
        let down = random_rows(&mut rng, n_exp * n_out, n_ff, 256, bb, f16_at);
        let x = rng.vec(n_tok * n_in, 1.0);
        let (xq, xd, xbs) = q8k_planes(&x, n_in);
        let mids = rng.vec(n_tok * n_used * n_ff, 1.0);
        let (mq, md, mbs) = q8k_planes(&mids, n_ff);
        let selw: Vec<f32> = (0..sel.len()).map(|i| 0.5 + 0.1 * (i % 3) as f32).collect();
        let limit = 0.5f32;
        let mut runs: Vec<(u32, Vec<f32>, Vec<f32>)> = Vec::new();
        for min_cols in [64, 24, 8] {
            let mut pairs = vec![u32::MAX; sel.len()];
            let mut tiles = vec![u32::MAX; (MOE_TILE_WORDS * max_tiles) as usize];
            let mut n_tiles = vec![u32::MAX; 1];
            e.run(&moe_group(
                pm(&mut pairs),
                pm(&mut tiles),
                pm(&mut n_tiles),
                p(&sel),
                nt,
                nu,
                n_exp as u32,
                min_cols,
            ));
            let (want_pairs, want_tiles) = expected_grouping(&sel, n_exp, min_cols);
            assert_eq!(pairs, want_pairs, "moe_group pairs (min_cols {min_cols})");
            let got_tiles: Vec<[u32; 4]> = tiles
                .chunks(4)
                .take(n_tiles[0] as usize)
                .map(|t| [t[0], t[1], t[2], t[3]])
                .collect();
            assert_eq!(got_tiles, want_tiles, "moe_group tiles (min_cols {min_cols})");
            assert!(n_tiles[0] <= max_tiles);
            let tl = ExpertTiles {
                pairs: p(&pairs),
                tiles: p(&tiles),
                n_tiles: p(&n_tiles),
                max_tiles,
            };
            let mut mid = vec![f32::NAN; n_tok * n_used * n_ff];
            let a = q8k_ptrs(&xq, &xd, &xbs);
            e.run(&moe_gemm_gate_up(
                fmt,
                pm(&mut mid),
                p(&gate),
                p(&up),
                a,
                tl,
                p(&selw),
                n_in as u32,
                n_ff as u32,
                nu,
                limit,
            ));
            let mq8 = q8k_ptrs(&mq, &md, &mbs);
            let mut outp = vec![f32::NAN; n_tok * n_used * n_out];
            e.run(&moe_gemm_down(
                fmt,
                pm(&mut outp),
                p(&down),
                mq8,
                tl,
                n_ff as u32,
                n_out as u32,
                nu,
            ));
            runs.push((min_cols, mid, outp));
        }
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
        let (_, mid64, outp64) = &runs[0];
        for (min_cols, mid, outp) in &runs[1..] {
            assert!(
                bits(mid) == bits(mid64),
                "{fmt:?} gate/up: min_cols {min_cols} differs from all-64 tiles"
            );
            assert!(
                bits(outp) == bits(outp64),
                "{fmt:?} down: min_cols {min_cols} differs from all-64 tiles"
            );
        }
        // The classes against the CPU reference dots.
        let (rb_in, rb_ff) = (n_in / 256 * bb, n_ff / 256 * bb);
        let mut want_mid = vec![0f32; mid64.len()];
        let mut want_outp = vec![0f32; outp64.len()];
        for (pr, &ex) in sel.iter().enumerate() {
            let ex = ex as usize;
            let xb = q8k_blocks(&x[pr / n_used * n_in..][..n_in]);
            let mb = q8k_blocks(&mids[pr * n_ff..][..n_ff]);
            for r in 0..n_ff {
                let row = (ex * n_ff + r) * rb_in;
                let g = dot(&gate[row..row + rb_in], &xb);
                let u = dot(&up[row..row + rb_in], &xb);
                want_mid[pr * n_ff + r] = moe::swiglu(g, u, limit) * selw[pr];
            }
            for r in 0..n_out {
                let row = (ex * n_out + r) * rb_ff;
                want_outp[pr * n_out + r] = dot(&down[row..row + rb_ff], &mb);
            }
        }
        let (_, mid8, outp8) = &runs[runs.len() - 1];
        same_bits(&format!("moe_gemm_gate_up {fmt:?} classes"), mid8, &want_mid);
        same_bits(&format!("moe_gemm_down {fmt:?} classes"), outp8, &want_outp);
    }
}

#[test]
fn shared_expert_swiglu_matvec_and_gemm() {
    each_warp(|e| {
        let mut rng = Rng(23);
        // 40 blocks per row: several chain steps and a partial one, partial GEMM stages.
        let (n_in, n_ff, n_tok) = (1280usize, 72usize, 66usize);
        let rb = n_in / 32 * 34;
        let wg = random_rows(&mut rng, n_ff, n_in, 32, 34, &[0]);
        let wu = random_rows(&mut rng, n_ff, n_in, 32, 34, &[0]);
        let x = rng.vec(n_in * n_tok, 1.0);
        let mut xq = Vec::new();
        let mut xd = Vec::new();
        for t in 0..n_tok {
            let mut a = quant::Q8_0Act::with_len(n_in);
            quant::quantize_q8_0(&x[t * n_in..(t + 1) * n_in], &mut a);
            xq.extend_from_slice(&a.qs);
            xd.extend_from_slice(&a.scales);
        }
        let limit = 1.0;
        let mut want = vec![0f32; n_tok * n_ff];
        for t in 0..n_tok {
            for r in 0..n_ff {
                let q = &xq[t * n_in..(t + 1) * n_in];
                let s = &xd[t * n_in / 32..(t + 1) * n_in / 32];
                let g = quant::dot_q8_0(&wg[r * rb..(r + 1) * rb], q, s);
                let u = quant::dot_q8_0(&wu[r * rb..(r + 1) * rb], q, s);
                want[t * n_ff + r] = moe::swiglu(g, u, limit);
            }
        }
        let (ni, nf, nt) = (n_in as u32, n_ff as u32, n_tok as u32);
        let mut mid = vec![0f32; want.len()];
        e.run(&matvec_q8_0_swiglu(
            pm(&mut mid),
            p(&wg),
            p(&wu),
            p(&xq),
            p(&xd),
            ni,
            nf,
            limit,
            3,
        ));
        same_bits("matvec_q8_0_swiglu", &mid[..3 * n_ff], &want[..3 * n_ff]);
        let mut mid2 = vec![0f32; want.len()];
        e.run(&gemm_q8_0_swiglu(
            pm(&mut mid2),
            p(&wg),
            p(&wu),
            p(&xq),
            p(&xd),
            ni,
            nf,
            limit,
            nt,
        ));
        same_bits("gemm_q8_0_swiglu", &mid2, &want);
    });
}

#[test]
fn hyper_connection_pre_post_and_head() {
    each_warp(|e| {
        let mut rng = Rng(29);
        // n_in = 3072: three tiles of the sequential dot (a partial tile: the mix check below).
        let (n_embd, n_hc, n_tok) = (768usize, 4usize, 2usize);
        let n_in = n_embd * n_hc;
        let n_mix = 2 * n_hc + n_hc * n_hc;
        let hcs = rng.vec(n_in * n_tok, 2.0);
        let fnf = rng.vec(n_mix * n_in, 0.05);
        let fnw = f16_words(&fnf);
        let fnb = f16_bytes(&fnf);
        let scale = [0.7f32, 1.3, 0.9];
        let base = rng.vec(n_mix, 0.5);
        let mut part = vec![0f32; n_tok * n_mix];
        let mut x_out = vec![0f32; n_tok * n_embd];
        let mut split = vec![0f32; n_tok * n_mix];
        e.run(&hc_mix(
            pm(&mut part),
            p(&hcs),
            p(&fnw),
            n_in as u32,
            n_mix as u32,
            1e-6,
            n_tok as u32,
        ));
        e.run(&hc_pre_finish(
            pm(&mut x_out),
            pm(&mut split),
            p(&part),
            p(&hcs),
            p(&scale),
            p(&base),
            n_embd as u32,
            n_hc as u32,
            20,
            1e-6,
            n_tok as u32,
        ));
        for t in 0..n_tok {
            let xs = &hcs[t * n_in..(t + 1) * n_in];
            let mut flat = vec![0f32; n_in];
            ops::rms_norm(&mut flat, xs, None, 1e-6);
            let mix: Vec<f32> = (0..n_mix)
                .map(|o| quant::dot_f16(&fnb[o * 2 * n_in..(o + 1) * 2 * n_in], &flat))
                .collect();
            same_bits("hc mix", &part[t * n_mix..(t + 1) * n_mix], &mix);
            let (mut pre, mut post, mut comb) = (vec![0f32; n_hc], vec![0f32; n_hc], vec![0f32; n_hc * n_hc]);
            hc::split_sinkhorn(&mix, &scale, &base, n_hc, 20, 1e-6, &mut pre, &mut post, &mut comb);
            let want_split: Vec<f32> = pre.iter().chain(&post).chain(&comb).copied().collect();
            same_bits("hc split", &split[t * n_mix..(t + 1) * n_mix], &want_split);
            let mut want_x = vec![0f32; n_embd];
            hc::weighted_sum(&mut want_x, xs, &pre, n_embd);
            same_bits("hc x_in", &x_out[t * n_embd..(t + 1) * n_embd], &want_x);
        }
        // The mix alone over 1500 columns (a partial last tile), 3 rows.
        {
            let n = 1500usize;
            let x = rng.vec(n, 2.0);
            let wf = rng.vec(3 * n, 0.05);
            let mut mix = vec![0f32; 3];
            e.run(&hc_mix(pm(&mut mix), p(&x), p(&f16_words(&wf)), n as u32, 3, 1e-6, 1));
            let mut flat = vec![0f32; n];
            ops::rms_norm(&mut flat, &x, None, 1e-6);
            let wb = f16_bytes(&wf);
            let want: Vec<f32> = (0..3)
                .map(|o| quant::dot_f16(&wb[o * 2 * n..(o + 1) * 2 * n], &flat))
                .collect();
            same_bits("hc mix, 1500 columns", &mix, &want);
        }
        // The fused launch: same split, and xn / Q8_0 / Q8_K of RMSNorm(x) * norm_w, identical to
        // the unfused kernels (same code, same order), so compared exactly.
        let norm_w = rng.vec(n_embd, 1.0);
        let mut counter = vec![0u32; n_tok];
        let mut split2 = vec![0f32; n_tok * n_mix];
        let mut xn = vec![0f32; n_tok * n_embd];
        let mut q0 = vec![0i8; n_tok * n_embd];
        let mut d0 = vec![0f32; n_tok * n_embd / 32];
        let mut qk = vec![0i8; n_tok * n_embd];
        let mut dk = vec![0f32; n_tok * n_embd / 256];
        let mut bk = vec![0i16; n_tok * n_embd / 16];
        let o = QuantOut {
            out: pm(&mut xn),
            q8_0_q: pm(&mut q0),
            q8_0_d: pm(&mut d0),
            q8_k_q: pm(&mut qk),
            q8_k_d: pm(&mut dk),
            q8_k_bs: pm(&mut bk),
        };
        let eps = HcEps {
            rms: 1e-6,
            hc: 1e-6,
            norm: 1e-6,
        };
        for _replay in 0..2 {
            e.run(&hc_pre_fused(
                pm(&mut split2),
                o,
                pm(&mut part),
                pm(&mut counter),
                p(&hcs),
                p(&fnw),
                p(&scale),
                p(&base),
                p(&norm_w),
                n_embd as u32,
                n_hc as u32,
                20,
                eps,
                n_tok as u32,
            ));
            assert_eq!(counter, vec![0u32; n_tok], "the last block resets the counters");
            assert_eq!(split2, split, "fused split");
            let mut xn_ref = vec![0f32; n_tok * n_embd];
            let mut q0r = vec![0i8; n_tok * n_embd];
            let mut d0r = vec![0f32; n_tok * n_embd / 32];
            let mut qkr = vec![0i8; n_tok * n_embd];
            let mut dkr = vec![0f32; n_tok * n_embd / 256];
            let mut bkr = vec![0i16; n_tok * n_embd / 16];
            let or = QuantOut {
                out: pm(&mut xn_ref),
                q8_0_q: pm(&mut q0r),
                q8_0_d: pm(&mut d0r),
                q8_k_q: pm(&mut qkr),
                q8_k_d: pm(&mut dkr),
                q8_k_bs: pm(&mut bkr),
            };
            let (ne, nt) = (n_embd as u32, n_tok as u32);
            e.run(&rms_norm_quant(or, p(&x_out), p(&norm_w), ne, ne, nt, NQ_NORM, 1e-6));
            assert_eq!(xn, xn_ref, "fused xn");
            assert_eq!(
                (&q0, &d0, &qk, &dk, &bk),
                (&q0r, &d0r, &qkr, &dkr, &bkr),
                "fused quantizations"
            );
        }
        // Post, in place, with y + y2.
        let y = rng.vec(n_embd * n_tok, 1.0);
        let y2 = rng.vec(n_embd * n_tok, 1.0);
        let mut hc_new = hcs.clone();
        e.run(&hc_post(
            pm(&mut hc_new),
            p(&hcs),
            p(&y),
            p(&y2),
            p(&split),
            n_embd as u32,
            n_hc as u32,
            n_tok as u32,
        ));
        for t in 0..n_tok {
            let s = &split[t * n_mix..(t + 1) * n_mix];
            let yy: Vec<f32> = (0..n_embd).map(|d| y[t * n_embd + d] + y2[t * n_embd + d]).collect();
            let mut want = vec![0f32; n_in];
            hc::post(
                &mut want,
                &yy,
                &hcs[t * n_in..(t + 1) * n_in],
                &s[n_hc..2 * n_hc],
                &s[2 * n_hc..],
                n_embd,
            );
            same_bits("hc post", &hc_new[t * n_in..(t + 1) * n_in], &want);
        }
        // Output head weights (n_mix = n_hc, stable sigmoid, one scale).
        let hfn = rng.vec(n_hc * n_in, 0.05);
        let hbase = rng.vec(n_hc, 0.5);
        let hscale = [0.8f32];
        let mut part2 = vec![0f32; n_tok * n_hc];
        let mut y_head = vec![0f32; n_tok * n_embd];
        let hw = f16_words(&hfn);
        e.run(&hc_mix(
            pm(&mut part2),
            p(&hcs),
            p(&hw),
            n_in as u32,
            n_hc as u32,
            1e-6,
            n_tok as u32,
        ));
        e.run(&hc_head_finish(
            pm(&mut y_head),
            p(&part2),
            p(&hcs),
            p(&hscale),
            p(&hbase),
            n_embd as u32,
            n_hc as u32,
            1e-6,
            n_tok as u32,
        ));
        let hb = f16_bytes(&hfn);
        for t in 0..n_tok {
            let xs = &hcs[t * n_in..(t + 1) * n_in];
            let mut flat = vec![0f32; n_in];
            ops::rms_norm(&mut flat, xs, None, 1e-6);
            let w: Vec<f32> = (0..n_hc)
                .map(|h| {
                    ops::sigmoid_stable(
                        quant::dot_f16(&hb[h * 2 * n_in..(h + 1) * 2 * n_in], &flat) * hscale[0] + hbase[h],
                    ) + 1e-6
                })
                .collect();
            let mut want = vec![0f32; n_embd];
            hc::weighted_sum(&mut want, xs, &w, n_embd);
            same_bits("hc head", &y_head[t * n_embd..(t + 1) * n_embd], &want);
        }
    });
}

fn rope_pair(hp: &HParams) -> (ops::Rope, RopeParams) {
    let cpu = ops::Rope::for_layer(hp, true);
    let gpu = RopeParams::yarn(
        hp.n_rot as u32,
        hp.compress_rope_freq_base,
        hp.rope_scaling_factor,
        hp.rope_orig_ctx as u32,
        hp.yarn_beta_fast,
        hp.yarn_beta_slow,
    );
    (cpu, gpu)
}

#[test]
fn row_ops_norm_rope_fp8_fp4_and_ring() {
    each_warp(|e| {
        let hp = HParams::flash();
        let (rope_cpu, rope) = rope_pair(&hp);
        let mut rng = Rng(31);
        let (hd, n_tok, pos0, cap) = (128usize, 3usize, 70u32, 8u32);
        let n_rot = hp.n_rot;
        let x = rng.vec(hd * n_tok, 4.0);
        let w = rng.vec(hd, 1.2);
        // KV path: norm (weight) + RoPE + E4M3 + ring store.
        let mut xk = x.clone();
        let mut ring = vec![0f32; cap as usize * hd];
        let fl = row_flags::NORM | row_flags::ROPE | row_flags::E4M3 | row_flags::STORE_RING;
        e.run(&rows_finish(
            pm(&mut xk),
            pm(&mut ring),
            p(&w),
            p(&[pos0]),
            1,
            hd as u32,
            fl,
            cap,
            rope,
            1e-6,
            n_tok as u32,
        ));
        for t in 0..n_tok {
            let mut want = x[t * hd..(t + 1) * hd].to_vec();
            ops::rms_norm_inplace(&mut want, Some(&w), 1e-6);
            rope_cpu.apply(&mut want, hd, pos0 as usize + t, false);
            ops::fp8_kv_round_trip(&mut want, hd - n_rot);
            same_bits("kv row", &xk[t * hd..(t + 1) * hd], &want);
            let slot = (pos0 as usize + t) % cap as usize;
            let wr: Vec<f32> = want.iter().map(|&v| round_f16(v)).collect();
            same_bits("ring row", &ring[slot * hd..(slot + 1) * hd], &wr);
        }
        // Indexer query heads: RoPE + Hadamard + FP4, 2 heads per token.
        let fl = row_flags::ROPE | row_flags::HADAMARD_FP4;
        let mut xi = x.clone();
        e.run(&rows_finish(
            pm(&mut xi),
            NULL,
            NULL,
            p(&[pos0]),
            n_tok as u32,
            hd as u32,
            fl,
            1,
            rope,
            1e-6,
            1,
        ));
        for h in 0..n_tok {
            let mut want = x[h * hd..(h + 1) * hd].to_vec();
            rope_cpu.apply(&mut want, hd, pos0 as usize, false);
            ops::indexer_qat(&mut want);
            same_bits("indexer head", &xi[h * hd..(h + 1) * hd], &want);
        }
        // Attention output: inverse RoPE on 4 heads of 128.
        let mut xo = x.clone();
        let fl = row_flags::ROPE | row_flags::ROPE_INVERSE;
        e.run(&rows_finish(
            pm(&mut xo),
            NULL,
            NULL,
            p(&[5000u32]),
            n_tok as u32,
            hd as u32,
            fl,
            1,
            rope,
            1e-6,
            1,
        ));
        let mut want = x.clone();
        rope_cpu.apply(&mut want, hd, 5000, true);
        same_bits("inverse rope", &xo, &want);
    });
}

#[test]
fn attention_over_ring_and_compressed_rows() {
    each_warp(|e| {
        let mut rng = Rng(37);
        let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
        let (n_head, hd, window, cap, ratio, top_k) = (8usize, 128usize, 32usize, 64usize, 4usize, 6usize);
        let shape = AttentionShape {
            n_head: n_head as u32,
            head_dim: hd as u32,
            ring_cap: cap as u32,
            window: window as u32,
            ratio: ratio as u32,
            top_k: top_k as u32,
        };
        let n_comp_avail = 12usize;
        let ring = rng.vec(cap * hd, 1.0);
        let comp = rng.vec(n_comp_avail * hd, 1.0);
        let sinks = rng.vec(n_head, 1.0);
        for (pos0, n_tok, with_sel) in [(5usize, 1usize, false), (45, 3, false), (45, 3, true), (30, 1, true)] {
            let q = rng.vec(n_tok * n_head * hd, 0.3);
            // Per token: top_k distinct visible rows (5 is invertible modulo the row counts used).
            let mut sel_sorted = Vec::new();
            for t in 0..n_tok {
                let n_c = ((pos0 + t + 1) / ratio).min(n_comp_avail);
                let mut s: Vec<u32> = (0..top_k).map(|i| ((i * 5 + 1) % n_c.max(1)) as u32).collect();
                s.sort();
                sel_sorted.extend(s);
            }
            // A score stride with spare rows (as the captured decode graph sizes it for the session):
            // the spare score blocks exit and the output is the same.
            let rows = shape.visible_rows((pos0 + n_tok - 1) as u32, n_comp_avail as u32, with_sel) + 5;
            let mut sc = vec![0f32; shape.score_floats(n_tok as u32, rows)];
            let mut inv = vec![0f32; n_tok * n_head];
            let mut out = vec![0f32; n_tok * n_head * hd];
            let selp = if with_sel { p(&sel_sorted) } else { NULL };
            for l in attention(
                &shape,
                pm(&mut out),
                pm(&mut sc),
                pm(&mut inv),
                p(&q),
                p(&ring),
                p(&comp),
                selp,
                p(&sinks),
                p(&[pos0 as u32]),
                n_comp_avail as u32,
                rows,
                n_tok as u32,
            ) {
                e.run(&l);
            }
            for t in 0..n_tok {
                let pos = pos0 + t;
                let n_raw = window.min(pos + 1);
                let raw: Vec<f32> = (0..n_raw)
                    .flat_map(|i| {
                        let slot = (pos + 1 - n_raw + i) % cap;
                        ring[slot * hd..(slot + 1) * hd].to_vec()
                    })
                    .collect();
                let n_c = ((pos + 1) / ratio).min(n_comp_avail);
                let mut allowed = vec![true; n_c];
                if with_sel && n_c > top_k {
                    allowed.fill(false);
                    for &s in &sel_sorted[t * top_k..(t + 1) * top_k] {
                        allowed[s as usize] = true;
                    }
                }
                let vis = attention::Visible {
                    raw: &raw,
                    comp: &comp[..n_c * hd],
                    allowed: Some(&allowed),
                };
                let mut want = vec![0f32; n_head * hd];
                let mut scores = vec![0f32; n_head * (n_raw + n_c)];
                attention::attend(
                    &pool,
                    &q[t * n_head * hd..(t + 1) * n_head * hd],
                    &vis,
                    &sinks,
                    hd,
                    &mut want,
                    &mut scores,
                );
                same_bits(
                    &format!("attention p={pos} sel={with_sel}"),
                    &out[t * n_head * hd..(t + 1) * n_head * hd],
                    &want,
                );
            }
        }
        // A long span: 100 raw rows over a 128-row ring at p = 300 (more rows than the values kernel
        // stages at once).
        let shape2 = AttentionShape {
            window: 100,
            ring_cap: 128,
            ratio: 0,
            ..shape
        };
        let ring2 = rng.vec(128 * hd, 1.0);
        let q = rng.vec(n_head * hd, 0.3);
        let mut sc = vec![0f32; shape2.score_floats(1, 100)];
        let mut inv = vec![0f32; n_head];
        let mut out = vec![0f32; n_head * hd];
        for l in attention(
            &shape2,
            pm(&mut out),
            pm(&mut sc),
            pm(&mut inv),
            p(&q),
            p(&ring2),
            NULL,
            NULL,
            p(&sinks),
            p(&[300u32]),
            0,
            100,
            1,
        ) {
            e.run(&l);
        }
        let raw: Vec<f32> = (0..100)
            .flat_map(|i| ring2[((201 + i) % 128) * hd..][..hd].to_vec())
            .collect();
        let vis = attention::Visible {
            raw: &raw,
            comp: &[],
            allowed: None,
        };
        let mut want = vec![0f32; n_head * hd];
        let mut scores = vec![0f32; n_head * 100];
        attention::attend(&pool, &q, &vis, &sinks, hd, &mut want, &mut scores);
        same_bits("attention over 100 rows", &out, &want);
    });
}

#[test]
fn compressor_pooling_and_row_finish() {
    each_warp(|e| {
        let hp = HParams::flash();
        let (rope_cpu, rope) = rope_pair(&hp);
        for (ratio, hd, indexer_row) in [(4usize, 128usize, false), (4, 128, true), (128, 64, false)] {
            let mut rng = Rng(41 + ratio as u64);
            let c = if ratio == 4 { 2 } else { 1 };
            let width = c * hd;
            let n_rot = if hd == 64 { 32 } else { 64 };
            let rope = RopeParams {
                n_rot: n_rot as u32,
                ..rope
            };
            let n_tokens = 2 * ratio + 3;
            let ape_f = rng.vec(ratio * width, 0.5);
            let ape = f16_words(&ape_f);
            let ape_r: Vec<f32> = ape_f.iter().map(|&v| round_f16(v)).collect();
            let norm = rng.vec(hd, 1.0);
            let kv = rng.vec(n_tokens * width, 1.0);
            let sc = rng.vec(n_tokens * width, 2.0);
            let comp_cap = n_tokens / ratio + 2;
            let mut st = compressor::CompressorState::new(ratio, hd);
            let mut skv = st.kv.clone();
            let mut ssc = st.score.clone();
            let mut rows = vec![0f32; comp_cap * hd];
            let mut want_rows = vec![0f32; comp_cap * hd];
            let mut n_emit = 0;
            // Feed in two batches (prefill chunk, then token by token) to cover both uses.
            let split_at = ratio + 1;
            for (b0, b1) in [(0, split_at), (split_at, split_at + 1), (split_at + 1, n_tokens)] {
                let nt = (b1 - b0) as u32;
                e.run(&compressor_pool(
                    pm(&mut rows),
                    pm(&mut skv),
                    pm(&mut ssc),
                    p(&kv[b0 * width..]),
                    p(&sc[b0 * width..]),
                    p(&ape),
                    p(&[b0 as u32]),
                    hd as u32,
                    ratio as u32,
                    nt,
                    comp_cap as u32,
                ));
                // The emitted rows are found on the device from the position; the grid holds the
                // most any batch of nt tokens emits (the blocks past this batch's rows exit).
                let kind = if indexer_row {
                    row_flags::HADAMARD_FP4
                } else {
                    row_flags::E4M3
                };
                let fl = row_flags::NORM | row_flags::ROPE | kind | row_flags::ROUND_F16;
                e.run(&rows_finish_emitted(
                    pm(&mut rows),
                    p(&norm),
                    p(&[b0 as u32]),
                    hd as u32,
                    fl,
                    ratio as u32,
                    comp_cap as u32,
                    rope,
                    1e-6,
                    nt,
                    compressor_max_emitted(ratio as u32, nt),
                ));
                for pos in b0..b1 {
                    let mut out = vec![0f32; hd];
                    if st.push(
                        &kv[pos * width..(pos + 1) * width],
                        &sc[pos * width..(pos + 1) * width],
                        &ape_r,
                        pos,
                        &mut out,
                    ) {
                        let kind = if indexer_row {
                            compressor::RowKind::Indexer
                        } else {
                            compressor::RowKind::Attention { n_nope: hd - n_rot }
                        };
                        let mut rope_c = rope_cpu;
                        rope_c.n_rot = n_rot;
                        compressor::finish_row(&mut out, &norm, 1e-6, &rope_c, ratio, pos, kind);
                        want_rows[n_emit * hd..(n_emit + 1) * hd]
                            .copy_from_slice(&out.iter().map(|&v| round_f16(v)).collect::<Vec<_>>());
                        n_emit += 1;
                    }
                }
            }
            assert_eq!(n_emit, n_tokens / ratio);
            same_bits(
                &format!("compressed rows r{ratio} idx={indexer_row}"),
                &rows[..n_emit * hd],
                &want_rows[..n_emit * hd],
            );
            same_bits("compressor state kv", &skv, &st.kv);
            same_bits("compressor state score", &ssc, &st.score);
        }
    });
}

#[test]
fn indexer_scores_and_top_k() {
    each_warp(|e| {
        let mut rng = Rng(43);
        // 6 heads: a partial round of heads on both wave sizes.
        let (n_head, hd, n_comp, ratio, top_k, pos0, n_tok) =
            (6usize, 128usize, 40usize, 4usize, 8usize, 150u32, 2usize);
        let qi = rng.vec(n_tok * n_head * hd, 1.0);
        let w = rng.vec(n_tok * n_head, 1.0);
        let mut krows = rng.vec(n_comp * hd, 1.0);
        // Two rows with equal scores, to exercise the tie rule.
        let dup = krows[3 * hd..4 * hd].to_vec();
        krows[9 * hd..10 * hd].copy_from_slice(&dup);
        let stride = 64usize;
        let mut scores = vec![0f32; n_tok * stride];
        let ws = 1.0 / ((hd * n_head) as f32).sqrt();
        e.run(&indexer_scores(
            pm(&mut scores),
            p(&qi),
            p(&w),
            p(&krows),
            p(&[pos0]),
            n_head as u32,
            n_comp as u32,
            ratio as u32,
            top_k as u32,
            stride as u32,
            ws,
            n_comp as u32,
            n_tok as u32,
        ));
        let mut sel = vec![u32::MAX; n_tok * top_k];
        e.run(&indexer_topk(
            pm(&mut sel),
            p(&scores),
            p(&[pos0]),
            stride as u32,
            n_comp as u32,
            ratio as u32,
            top_k as u32,
            n_tok as u32,
        ));
        for t in 0..n_tok {
            let n_c = ((pos0 as usize + t + 1) / ratio).min(n_comp);
            // cpu/indexer.rs `select`: acc += max(dot, 0) * (w * scale), heads in order.
            let want: Vec<f32> = (0..n_c)
                .map(|c| {
                    let mut acc = 0.0f32;
                    for h in 0..n_head {
                        let d = quant::dot_f32(&krows[c * hd..(c + 1) * hd], &qi[(t * n_head + h) * hd..][..hd]);
                        acc += d.max(0.0) * (w[t * n_head + h] * ws);
                    }
                    acc
                })
                .collect();
            same_bits("indexer scores", &scores[t * stride..t * stride + n_c], &want);
            let mut allowed = vec![false; n_c];
            indexer::top_k_mask(&scores[t * stride..t * stride + n_c], top_k, &mut allowed);
            let want_sel: Vec<u32> = (0..n_c as u32).filter(|&c| allowed[c as usize]).collect();
            assert_eq!(&sel[t * top_k..(t + 1) * top_k], &want_sel[..], "top-k token {t}");
        }
    });
}

#[test]
fn router_hash_and_biased_top_k() {
    each_warp(|e| {
        let mut rng = Rng(47);
        let (n_exp, n_used, n_tok) = (16usize, 4usize, 3usize);
        let mut logits = rng.vec(n_tok * n_exp, 3.0);
        logits[5] = logits[9]; // a tie
        logits[1] = 25.0; // softplus branches
        logits[2] = -25.0;
        let bias = rng.vec(n_exp, 0.2);
        let tokens = [7u32, 1, 30];
        let tid2eid: Vec<i32> = (0..32 * n_used).map(|i| ((i * 3) % n_exp) as i32).collect();
        for hash in [false, true] {
            let mut sel = vec![0u32; n_tok * n_used];
            let mut selw = vec![0f32; n_tok * n_used];
            let t2e = if hash { p(&tid2eid) } else { NULL };
            e.run(&router(
                pm(&mut sel),
                pm(&mut selw),
                p(&logits),
                p(&bias),
                t2e,
                p(&tokens),
                n_exp as u32,
                n_used as u32,
                1.5,
                n_tok as u32,
            ));
            for t in 0..n_tok {
                let probs: Vec<f32> = logits[t * n_exp..(t + 1) * n_exp]
                    .iter()
                    .map(|&z| ops::softplus(z).sqrt())
                    .collect();
                let chosen: Vec<usize> = if hash {
                    (0..n_used)
                        .map(|k| tid2eid[tokens[t] as usize * n_used + k] as usize)
                        .collect()
                } else {
                    let score: Vec<f32> = probs.iter().zip(&bias).map(|(p, b)| p + b).collect();
                    let mut idx = vec![0usize; n_used];
                    moe::top_k_desc(&score, n_used, &mut idx);
                    idx
                };
                let inv = 1.0 / chosen.iter().map(|&c| probs[c]).sum::<f32>().max(2f32.powi(-14)); // floor 6.103515625e-5
                let want_w: Vec<f32> = chosen.iter().map(|&c| probs[c] * 1.5 * inv).collect();
                let got: Vec<usize> = sel[t * n_used..(t + 1) * n_used].iter().map(|&s| s as usize).collect();
                assert_eq!(got, chosen, "router hash={hash} token {t}");
                same_bits("router weights", &selw[t * n_used..(t + 1) * n_used], &want_w);
            }
        }
    });
}

#[test]
fn embedding_sampling_and_fill() {
    each_warp(|e| {
        let mut rng = Rng(53);
        let (n_embd, n_vocab) = (64usize, 10usize);
        let emb_f = rng.vec(n_embd * n_vocab, 1.0);
        let emb = f16_words(&emb_f);
        let tokens = [3u32, 9];
        let mut hcs = vec![0f32; 2 * 4 * n_embd];
        e.run(&embed_hc(
            pm(&mut hcs),
            p(&emb),
            p(&tokens),
            n_embd as u32,
            4,
            n_vocab as u32,
            2,
        ));
        for t in 0..2 {
            for h in 0..4 {
                for d in 0..n_embd {
                    assert_eq!(
                        hcs[(t * 4 + h) * n_embd + d],
                        round_f16(emb_f[tokens[t] as usize * n_embd + d])
                    );
                }
            }
        }
        let mut logits = rng.vec(1000, 5.0);
        logits[10] = f32::NAN;
        logits[700] = 9.0;
        logits[800] = 9.0;
        let mut out = [0u32; SAMPLE_OUT_WORDS];
        e.run(&argmax(pm(&mut out), p(&logits), 1000));
        assert_eq!(out[0], 700, "argmax: first of the tied maxima, NaN ignored");
        // Default sampler path against a sequential walk (spec §7.2).
        for u in [0.0f32, 0.3, 0.77, 0.999] {
            let (temp, min_p) = (0.8f32, 0.05f32);
            let m = logits
                .iter()
                .filter(|v| v.is_finite())
                .fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            let ps: Vec<f32> = logits
                .iter()
                .map(|&l| if l.is_finite() { ((l - m) / temp).exp() } else { 0.0 })
                .collect();
            let total: f32 = ps.iter().filter(|&&v| v >= min_p).sum();
            let mut r = u * total;
            let mut want = 0;
            for (i, &v) in ps.iter().enumerate() {
                if v < min_p || !logits[i].is_finite() {
                    continue;
                }
                want = i;
                r -= v;
                if r <= 0.0 {
                    break;
                }
            }
            e.run(&sample_min_p(pm(&mut out), p(&logits), 1000, temp, min_p, u));
            assert_eq!(out[0] as usize, want, "sample u={u}");
        }
        let mut v = vec![0f32; 300];
        e.run(&fill_f32(pm(&mut v), 300, -1.0e30));
        assert!(v.iter().all(|&x| x == -1.0e30));
    });
}

/// Device sampling against the host sampler (src/engine/sampler.rs) on many random logit vectors
/// with ties, NaN, -inf and +inf. Greedy: `ds4_argmax` equals the host `argmax` exactly. Min-p
/// path: `ds4_sample_min_p` with the host's draw u01 picks the host's token and reports the draw
/// used, except where the two float walks may legitimately part: the exact target T = u01 * S
/// (S, C_k: exact f64 sums of the kept weights) lies within the rounding bound of every cumulative
/// boundary C_k between the two picks. The bound is the first-order error of a float sum or walk of
/// positive terms, u * (additions on its longest chain) * S with u = 2^-24, for each side: the host
/// sums and walks all n kept weights in order; the kernel sums chunks of ceil(n/256) ids, then the 256
/// chunk sums, and walks chunk sums then one chunk.
#[test]
fn device_sampling_matches_the_host_sampler() {
    use crate::engine::events::SamplingParams;
    use crate::engine::sampler::{Sampler, Xorshift64Star, argmax as host_argmax};
    each_warp(|e| {
        let mut rng = Rng(59);
        let mut out = [0u32; SAMPLE_OUT_WORDS];
        let (mut trials, mut boundary_cases) = (0, 0);
        for trial in 0..160 {
            let n = [1usize, 7, 256, 1000, 3001][trial % 5];
            let scale = [0.5f32, 3.0, 12.0][trial % 3];
            let mut logits = rng.vec(n, scale);
            // Ties: a few copies of one value; specials sprinkled in by trial.
            for _ in 0..(n / 50) {
                let (i, j) = ((rng.next() as usize) % n, (rng.next() as usize) % n);
                logits[i] = logits[j];
            }
            for _ in 0..(trial % 4) {
                let i = (rng.next() as usize) % n;
                logits[i] = [f32::NAN, f32::NEG_INFINITY, f32::INFINITY, -f32::NAN][trial % 4];
            }
            if trial % 23 == 0 {
                logits.fill(if trial % 2 == 0 { f32::NAN } else { f32::NEG_INFINITY });
            }
            e.run(&argmax(pm(&mut out), p(&logits), n as u32));
            assert_eq!((out[0], out[1]), (host_argmax(&logits), 0), "argmax, trial {trial}");

            let temperature = [0.3f32, 0.8, 1.5][trial % 3];
            let min_p = [0.0f32, 0.01, 0.2, 1.5][trial % 4];
            let params = SamplingParams {
                temperature,
                top_p: 1.0,
                top_k: 0,
                min_p,
                seed: None,
            };
            let seed = rng.next();
            let u01 = Xorshift64Star::new(seed).next_unit_f32();
            let host = Sampler::new(Some(seed)).sample(&logits, &params);
            e.run(&sample_min_p(
                pm(&mut out),
                p(&logits),
                n as u32,
                temperature,
                min_p,
                u01,
            ));
            let (dev, drew) = (out[0], out[1] != 0);
            // The kept weights as the host computes them.
            let finite: Vec<usize> = (0..n).filter(|&i| logits[i].is_finite()).collect();
            // The first maximum (finite logits compare totally).
            let Some(&best) = finite
                .iter()
                .max_by(|&&a, &&b| logits[a].partial_cmp(&logits[b]).unwrap().then(b.cmp(&a)))
            else {
                assert_eq!((dev, drew), (host, false), "no finite logit, trial {trial}");
                continue;
            };
            let mx = logits[best];
            let kept: Vec<(usize, f32)> = finite
                .iter()
                .map(|&i| (i, ((logits[i] - mx) / temperature).exp()))
                .filter(|&(_, w)| w >= min_p)
                .collect();
            if kept.is_empty() {
                assert_eq!(
                    (dev, drew),
                    (best as u32, false),
                    "nothing kept (min_p {min_p}), trial {trial}"
                );
                assert_eq!(host, best as u32);
                continue;
            }
            assert!(drew, "trial {trial}: the draw must be used when tokens are kept");
            trials += 1;
            if dev == host {
                continue;
            }
            // Exact cumulative sums and target.
            let mut c = Vec::with_capacity(kept.len());
            let mut acc = 0f64;
            for &(_, w) in &kept {
                acc += w as f64;
                c.push(acc);
            }
            let s = acc;
            let t = u01 as f64 * s;
            let chunk = n.div_ceil(256);
            let unit = (2f64).powi(-24);
            let bound = unit * s * ((2 * kept.len() + 2) + (2 * (255 + chunk) + 2)) as f64;
            // Position of a pick in the walk: its index among the kept ids; the rounding fallback
            // (the first maximum after the walk ran out) counts as past the last.
            let position = |id: u32| -> Vec<usize> {
                let mut v: Vec<usize> = kept.iter().position(|&(i, _)| i as u32 == id).into_iter().collect();
                if id == best as u32 {
                    v.push(kept.len());
                }
                v
            };
            let excused = position(host).iter().any(|&a| {
                position(dev).iter().any(|&b| {
                    let (lo, hi) = (a.min(b), a.max(b));
                    (lo..hi).all(|k| (t - c[k.min(c.len() - 1)]).abs() <= bound)
                })
            });
            assert!(
                excused,
                "trial {trial}: device picked {dev}, host {host}, u01 {u01}: T = {t:.6e} is not within the \
                 rounding bound {bound:.3e} of the boundaries between them (S = {s:.6e})"
            );
            boundary_cases += 1;
        }
        eprintln!(
            "device min-p sampling: {trials} draws compared (wave {}), {boundary_cases} at a rounding boundary",
            e.warp
        );
        assert!(trials >= 80, "too few draws compared: {trials}");
    });
}

/// kernels/mathf.h against `backend::cpu::transcend`, bitwise (both NaN counts as equal: NaN
/// payloads are the hardware's): a stride through all 2^32 bit patterns plus the engine's hot
/// ranges (softmax/SwiGLU exponents, RoPE angles up to 1e6 across the 120 reduction switch,
/// softplus arguments, log2 of small block maxima and subnormals). One wave size suffices: the
/// functions are per thread.
#[test]
fn mathf_matches_transcend_bitwise() {
    let Some(m) = emu(32) else { return };
    let e = m.lock().unwrap_or_else(|p| p.into_inner());
    let sweep = |lo: f64, hi: f64, n: u32| (0..n).map(move |i| (lo + (hi - lo) * i as f64 / (n - 1) as f64) as f32);
    let mut input: Vec<f32> = (0..=u32::MAX / 65_537).map(|i| f32::from_bits(i * 65_537)).collect();
    input.extend([
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::from_bits(1),
        -1.0,
        1.0,
    ]);
    input.extend(sweep(-110.0, 90.0, 20_000));
    input.extend(sweep(-130.0, 130.0, 20_000));
    input.extend(sweep(0.0, 1.2e6, 20_000));
    input.extend(sweep(-0.999, 50.0, 10_000));
    input.extend((1u32..0x0080_0000).step_by(4099).map(f32::from_bits));
    let n = input.len();
    let mut out = vec![0f32; n];
    for which in MathFn::ALL {
        e.run(&test_mathf(pm(&mut out), p(&input), n as u32, which));
        let host = which.host();
        let bad: Vec<String> = input
            .iter()
            .zip(&out)
            .filter(|&(&x, &y)| {
                let want = host(x);
                want.to_bits() != y.to_bits() && !(want.is_nan() && y.is_nan())
            })
            .take(5)
            .map(|(&x, &y)| format!("x {x:e} ({:#010x}): kernel {y:e}, host {:e}", x.to_bits(), host(x)))
            .collect();
        assert!(
            bad.is_empty(),
            "{which:?}: kernel differs from transcend.rs:\n{}",
            bad.join("\n")
        );
    }
    eprintln!("mathf: {n} inputs per function, kernel == transcend.rs bitwise");
}
