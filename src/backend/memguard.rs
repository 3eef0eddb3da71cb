//! Memory guard: before a model is loaded, compare what the load will pin in memory with what the
//! machine has, and refuse with one line that gives the numbers and the fix, instead of letting the
//! kernel's OOM killer take down the desktop halfway through a load.
//!
//! What counts (and why):
//! * CPU backend, weights mapped from the file: the weights are page cache. Those pages are
//!   file-backed and clean, so the kernel reclaims them under pressure instead of killing anything;
//!   too little RAM makes decoding slow (experts re-read from disk every token), not fatal. Only
//!   the anonymous memory — the KV cache and scratch (docs/model.md#kv-cache, #kv-bytes-per-token) —
//!   must fit in MemAvailable minus a headroom for the desktop; weights that exceed the RAM left over
//!   only earn a warning.
//! * GPU, weights copied to device memory: copies are not reclaimable. On a discrete GPU weights +
//!   KV + scratch must fit the free VRAM. On unified memory (Strix Halo: the GPU allocates system RAM
//!   through GTT) they must fit both the GTT limit and MemAvailable, since every byte is pinned RAM.
//! * GPU mapping the file (zero copy): like the CPU case for the weights; KV/scratch in device memory.
//!
//! Owns the estimate formulas (pure functions of `HParams` and ctx) and the verdict; reading
//! /proc/meminfo and amdgpu sysfs is the only I/O here. Must not allocate the memory it checks.

use std::path::Path;

use crate::model::HParams;

/// Bytes of the CPU backend's KV cache and compressor/indexer state for `ctx` tokens
/// (docs/model.md#kv-cache, #kv-bytes-per-token). All rows are f32. Per layer: a raw window of min(W,
/// ctx) rows (at least 1) of `head_dim`; compressed layers add ctx/ratio + 2 compressed rows and two
/// compressor state tensors of (overlap·head_dim)·(overlap·ratio) floats; ratio-4 layers add as many
/// indexer rows of `idx_head_dim` and two indexer state tensors of
/// (overlap·idx_head_dim)·(overlap·ratio) floats.
pub fn cpu_kv_bytes(hp: &HParams, ctx: u64) -> u64 {
    let f = 4u64;
    let (hd, ihd) = (hp.head_dim as u64, hp.idx_head_dim as u64);
    let mut total = 0u64;
    for l in 0..hp.n_layer {
        total += (hp.sliding_window as u64).min(ctx).max(1) * hd * f;
        let ratio = hp.ratio(l) as u64;
        if ratio == 0 {
            continue;
        }
        let ov = hp.compress_overlap(l) as u64;
        let comp_cap = ctx / ratio + 2;
        total += comp_cap * hd * f + 2 * (ov * hd) * (ov * ratio) * f;
        if hp.has_indexer(l) {
            total += comp_cap * ihd * f + 2 * (ov * ihd) * (ov * ratio) * f;
        }
    }
    total
}

/// A generous estimate of the CPU backend's scratch: the logits plus, per token of a prefill chunk
/// of `chunk` tokens, the HC state, the query, the expert intermediates of every selected expert
/// and one vocabulary-wide row, all f32. The measured figure comes later from `DeviceSession::memory()`;
/// this only has to be an upper bound well inside the headroom.
pub fn cpu_scratch_estimate(hp: &HParams, chunk: u64) -> u64 {
    let per_token = 4 * hp.hc_dim() + hp.q_dim() + 2 * hp.n_ff_exp * (hp.n_expert_used + 1) + hp.n_embd * 8;
    (hp.n_vocab as u64 + chunk * per_token as u64) * 4
}

/// Where the weights will live once loaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightResidence {
    /// Mapped from the file (CPU, or GPU zero copy): reclaimable page cache.
    MappedFile,
    /// Copied to device memory; `unified` when device memory is system RAM (GTT, Strix Halo).
    DeviceCopy { unified: bool },
}

/// What a load will need.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryNeed {
    pub weight_bytes: u64,
    pub residence: WeightResidence,
    /// KV cache + state (see `cpu_kv_bytes`) and scratch.
    pub kv_bytes: u64,
    pub scratch_bytes: u64,
    /// The KV and scratch live in device memory (GPU backends) rather than host RAM.
    pub kv_on_device: bool,
    /// Host RAM the session's turn checkpoints can reach when the context is full (each holds the
    /// live cache rows, docs/model.md#checkpoints). Only warned about: short chats never get there.
    pub checkpoint_bytes: u64,
}

/// Host memory from /proc/meminfo, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostMemory {
    pub total: u64,
    pub available: u64,
}

/// GPU memory limits when known (amdgpu sysfs or the HIP runtime), in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpuMemory {
    pub vram_total: u64,
    pub vram_used: u64,
    /// GTT (system RAM the GPU may map); the binding limit on unified-memory APUs.
    pub gtt_total: u64,
    pub gtt_used: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub enum MemoryVerdict {
    Fits,
    /// It will run, with a caveat the user should see (slow decoding, memory tight at a full
    /// context); the line says why.
    Warn(String),
    /// Loading would exhaust memory; the line gives the numbers and the fix.
    Refuse(String),
}

/// RAM kept free for the desktop and the rest of the system: 1 GiB or 5 % of RAM, whichever is more.
pub fn headroom(total: u64) -> u64 {
    (1u64 << 30).max(total / 20)
}

fn gib(b: u64) -> String {
    crate::units::fmt_gib(b, 1)
}

/// The largest power-of-two context (at least 4096) whose CPU KV + scratch fits in `budget` bytes.
pub fn largest_ctx_fitting(hp: &HParams, budget: u64, scratch: u64) -> Option<u64> {
    let mut best = None;
    let mut ctx = 4096u64;
    while ctx <= hp.context_length.max(4096) {
        if cpu_kv_bytes(hp, ctx) + scratch <= budget {
            best = Some(ctx);
        }
        ctx *= 2;
    }
    best
}

/// The verdict for loading with `need` on a machine with `host` (and `gpu` where known). `hp` and
/// `ctx` are only used to suggest a context that would fit.
pub fn check_memory(
    need: &MemoryNeed,
    host: &HostMemory,
    gpu: Option<&GpuMemory>,
    hp: &HParams,
    ctx: u64,
) -> MemoryVerdict {
    let room = host.available.saturating_sub(headroom(host.total));
    let cache = need.kv_bytes + need.scratch_bytes;
    let suggest = |budget: u64| match largest_ctx_fitting(hp, budget, need.scratch_bytes) {
        Some(c) if c < ctx => format!("use --ctx {c} or smaller"),
        _ => "use a smaller --ctx".to_string(),
    };
    match need.residence {
        WeightResidence::DeviceCopy { unified } => {
            let pinned = need.weight_bytes + cache;
            if let Some(g) = gpu {
                let (limit, used, what) = if unified {
                    (g.gtt_total, g.gtt_used, "GTT")
                } else {
                    (g.vram_total, g.vram_used, "VRAM")
                };
                let free = limit.saturating_sub(used);
                if limit > 0 && pinned > free {
                    let fix = if unified {
                        "raise the GTT limit (Strix Halo: kernel parameter ttm.pages_limit, then reboot; \
                         amdgpu.gttsize is deprecated), use --weights map, or a smaller --ctx"
                    } else {
                        "use --weights map, or a smaller --ctx"
                    };
                    return MemoryVerdict::Refuse(format!(
                        "not enough GPU memory: weights {} + KV {} + scratch {} = {} to copy, {what} has {} free \
                         of {}; {fix}",
                        gib(need.weight_bytes),
                        gib(need.kv_bytes),
                        gib(need.scratch_bytes),
                        gib(pinned),
                        gib(free),
                        gib(limit)
                    ));
                }
            }
            if unified && pinned > room {
                return MemoryVerdict::Refuse(format!(
                    "not enough memory: weights {} + KV {} + scratch {} = {} of pinned RAM, {} available \
                     (MemAvailable {} minus {} headroom); close programs, use --weights map, or {}",
                    gib(need.weight_bytes),
                    gib(need.kv_bytes),
                    gib(need.scratch_bytes),
                    gib(pinned),
                    gib(room),
                    gib(host.available),
                    gib(headroom(host.total)),
                    suggest(room.saturating_sub(need.weight_bytes))
                ));
            }
            MemoryVerdict::Fits
        }
        WeightResidence::MappedFile => {
            if !need.kv_on_device && cache > room {
                return MemoryVerdict::Refuse(format!(
                    "not enough memory for the context: KV cache {} + scratch {} = {}, {} available \
                     (MemAvailable {} minus {} headroom); {}, or close programs",
                    gib(need.kv_bytes),
                    gib(need.scratch_bytes),
                    gib(cache),
                    gib(room),
                    gib(host.available),
                    gib(headroom(host.total)),
                    suggest(room)
                ));
            }
            if cache + need.checkpoint_bytes > room {
                return MemoryVerdict::Warn(format!(
                    "memory is tight for a full context: KV cache {} + scratch {} + turn checkpoints {} = {}, \
                     {} available; long chats may exhaust it ({})",
                    gib(need.kv_bytes),
                    gib(need.scratch_bytes),
                    gib(need.checkpoint_bytes),
                    gib(cache + need.checkpoint_bytes),
                    gib(room),
                    suggest(room / 3)
                ));
            }
            let anon = if need.kv_on_device { 0 } else { cache };
            let cacheable = host.total.saturating_sub(anon + headroom(host.total));
            if need.weight_bytes > cacheable {
                return MemoryVerdict::Warn(format!(
                    "weights {} exceed the {} of RAM left for the page cache: decoding will re-read weights \
                     from disk every token (slow)",
                    gib(need.weight_bytes),
                    gib(cacheable)
                ));
            }
            MemoryVerdict::Fits
        }
    }
}

/// Parse /proc/meminfo text (values in kB).
pub fn parse_meminfo(text: &str) -> Option<HostMemory> {
    Some(HostMemory {
        total: meminfo_field(text, "MemTotal")?,
        available: meminfo_field(text, "MemAvailable")?,
    })
}

/// One /proc/meminfo field (`name: N kB`), in bytes.
pub fn meminfo_field(text: &str, name: &str) -> Option<u64> {
    let line = text
        .lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(':'))?;
    let kb: u64 = line[name.len() + 1..].split_whitespace().next()?.parse().ok()?;
    Some(kb * 1024)
}

/// Host memory now; an error line names the file.
pub fn read_host_memory() -> Result<HostMemory, String> {
    let text = std::fs::read_to_string("/proc/meminfo").map_err(|e| format!("/proc/meminfo: {e}"))?;
    parse_meminfo(&text).ok_or_else(|| "/proc/meminfo: MemTotal or MemAvailable missing".to_string())
}

/// amdgpu's memory counters for a DRM device directory (e.g. /sys/class/drm/card0/device).
pub fn read_amdgpu_memory(device_dir: &Path) -> Option<GpuMemory> {
    let read = |name: &str| -> Option<u64> { std::fs::read_to_string(device_dir.join(name)).ok()?.trim().parse().ok() };
    Some(GpuMemory {
        vram_total: read("mem_info_vram_total")?,
        vram_used: read("mem_info_vram_used").unwrap_or(0),
        gtt_total: read("mem_info_gtt_total").unwrap_or(0),
        gtt_used: read("mem_info_gtt_used").unwrap_or(0),
    })
}

/// The first amdgpu device's counters, if any.
pub fn find_amdgpu_memory() -> Option<GpuMemory> {
    let dir = std::fs::read_dir("/sys/class/drm").ok()?;
    let mut cards: Vec<_> = dir
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("card") && !n.contains('-'))
        })
        .collect();
    cards.sort();
    cards.iter().find_map(|c| read_amdgpu_memory(&c.join("device")))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: f64 = 1e6;

    #[test]
    fn flash_kv_bytes_match_the_documented_figures() {
        let hp = HParams::flash();
        // Raw windows 43 × 128 × 512 × 4 B = 11,272,192 B (11.27 MB), states 12.2 MB fixed,
        // compressed rows at 4K = 56.6 MB (docs/model.md#kv-bytes-per-token).
        let raw = 43 * 128 * 512 * 4u64;
        assert_eq!(raw, 11_272_192);
        let states = 21 * (2 * 8192 + 2 * 2048) * 4 + 20 * (2 * 65536) * 4u64;
        assert!((states as f64 / MB - 12.2).abs() < 0.05, "{states}");
        let at4k = cpu_kv_bytes(&hp, 4096) - raw - states;
        // Tolerance 0.05 MB: the documented figure is rounded to one decimal.
        assert!((at4k as f64 / MB - 56.6).abs() < 0.05, "{at4k}");
        let at1m = cpu_kv_bytes(&hp, 1_048_576) - raw - states;
        assert!((at1m as f64 / 1e9 - 14.43).abs() < 0.005, "{at1m}");
    }

    #[test]
    fn flash_kv_grows_13760_bytes_per_token() {
        // docs/model.md#kv-bytes-per-token: 21 ratio-4 layers × 640 B + 20 ratio-128 layers × 16 B per
        // token. Exact when both contexts are multiples of 128 and above the raw window.
        let hp = HParams::flash();
        let n = 65536u64;
        assert_eq!(cpu_kv_bytes(&hp, 2 * n) - cpu_kv_bytes(&hp, n), n * 13_760);
    }

    #[test]
    fn tiny_ctx_clamps_raw_window() {
        let hp = HParams::flash();
        // ctx 1: one raw row per layer, comp_cap = 0 + 2 rows.
        let expected = 43 * 512 * 4
            + 21 * (2 * 512 * 4 + 2 * 128 * 4 + (2 * 8192 + 2 * 2048) * 4)
            + 20 * (2 * 512 * 4 + 2 * 65536 * 4);
        assert_eq!(cpu_kv_bytes(&hp, 1), expected);
    }

    #[test]
    fn meminfo_parses_kb() {
        let text = "MemTotal:       24576000 kB\nMemFree:         1000 kB\nMemAvailable:   12288000 kB\n";
        assert_eq!(
            parse_meminfo(text),
            Some(HostMemory {
                total: 24_576_000 * 1024,
                available: 12_288_000 * 1024
            })
        );
        assert_eq!(parse_meminfo("MemTotal: 5 kB\n"), None);
        assert!(read_host_memory().unwrap().total > 0);
    }

    fn gib_u(v: f64) -> u64 {
        (v * crate::units::GIB as f64) as u64
    }

    fn host_gib(total: f64, available: f64) -> HostMemory {
        HostMemory {
            total: gib_u(total),
            available: gib_u(available),
        }
    }

    #[test]
    fn mapped_weights_only_warn_but_kv_must_fit() {
        let hp = HParams::flash();
        let host = host_gib(24.0, 20.0);
        let need = |ctx: u64| MemoryNeed {
            weight_bytes: gib_u(80.76),
            residence: WeightResidence::MappedFile,
            kv_bytes: cpu_kv_bytes(&hp, ctx),
            scratch_bytes: cpu_scratch_estimate(&hp, 64),
            kv_on_device: false,
            checkpoint_bytes: 0,
        };
        // 32K context: KV ≈ 0.47 GB fits; 81 GiB of weights cannot stay cached in 24 GiB → Warn.
        match check_memory(&need(32768), &host, None, &hp, 32768) {
            MemoryVerdict::Warn(m) => assert!(m.contains("80.8 GiB"), "{m}"),
            v => panic!("{v:?}"),
        }
        // 1M context needs ≈ 14.5 GB of KV: refused on a host with 4 GiB available.
        let small = host_gib(8.0, 4.0);
        match check_memory(&need(1_048_576), &small, None, &hp, 1_048_576) {
            MemoryVerdict::Refuse(m) => {
                // 4 GiB available minus 1 GiB headroom = 3 GiB; 2^17 = 131072 needs ≈ 1.8 GB, 2^18 ≈ 3.6 GB.
                assert!(m.contains("3.0 GiB available"), "{m}");
                assert!(m.contains("--ctx 131072"), "{m}");
            }
            v => panic!("{v:?}"),
        }
    }

    #[test]
    fn checkpoints_that_could_exhaust_ram_are_warned_about() {
        let hp = HParams::flash();
        let host = host_gib(64.0, 20.0);
        // 512K context: KV 6.7 GiB fits the 16.8 GiB left (20 minus 3.2 GiB headroom), two full
        // checkpoints on top do not; 256K (3.4 GiB, three copies 10.1 GiB) would.
        let kv = cpu_kv_bytes(&hp, 524_288);
        let need = MemoryNeed {
            weight_bytes: gib_u(1.0),
            residence: WeightResidence::MappedFile,
            kv_bytes: kv,
            scratch_bytes: 0,
            kv_on_device: false,
            checkpoint_bytes: 2 * kv,
        };
        match check_memory(&need, &host, None, &hp, 524_288) {
            MemoryVerdict::Warn(m) => assert!(m.contains("turn checkpoints") && m.contains("--ctx 262144"), "{m}"),
            v => panic!("{v:?}"),
        }
        let roomy = host_gib(64.0, 40.0);
        assert_eq!(check_memory(&need, &roomy, None, &hp, 524_288), MemoryVerdict::Fits);
    }

    #[test]
    fn unified_copy_checks_gtt_and_ram() {
        let hp = HParams::flash();
        let need = MemoryNeed {
            weight_bytes: gib_u(80.76),
            residence: WeightResidence::DeviceCopy { unified: true },
            kv_bytes: cpu_kv_bytes(&hp, 32768),
            scratch_bytes: 0,
            kv_on_device: true,
            checkpoint_bytes: 0,
        };
        let host = host_gib(128.0, 120.0);
        // Default GTT limit of half the RAM (64 GiB) cannot hold 81 GiB of weights.
        let gtt = GpuMemory {
            vram_total: gib_u(0.5),
            vram_used: 0,
            gtt_total: gib_u(64.0),
            gtt_used: gib_u(1.0),
        };
        match check_memory(&need, &host, Some(&gtt), &hp, 32768) {
            MemoryVerdict::Refuse(m) => assert!(
                m.contains("GTT has 63.0 GiB free") && m.contains("ttm.pages_limit"),
                "{m}"
            ),
            v => panic!("{v:?}"),
        }
        let big = GpuMemory {
            gtt_total: gib_u(120.0),
            ..gtt
        };
        assert_eq!(check_memory(&need, &host, Some(&big), &hp, 32768), MemoryVerdict::Fits);
        // Same GTT limit but the desktop holds most of the RAM: pinned copies would OOM.
        let busy = host_gib(128.0, 60.0);
        assert!(matches!(
            check_memory(&need, &busy, Some(&big), &hp, 32768),
            MemoryVerdict::Refuse(_)
        ));
    }

    /// docs/memory.md#dspark: the 0731 DSpark support file (5,989,108,652 B of tensors, ds4's
    /// layout) and the CPU drafter's rows (12 MiB of captured target rows, 768 KiB of context KV)
    /// on a 128 GB Strix Halo with the q2 file copied (unified memory, GTT raised to 120 GiB as
    /// `doctor` advises, 124 GiB available): a 64k context still fits, with the numbers the doc gives.
    #[test]
    fn strix_halo_holds_a_64k_context_with_the_dspark_support_file() {
        use crate::model::dspark::{DsparkMeta, session_bytes, tensor_plan};
        use crate::model::layout::{ExpertTypes, concrete_type};
        let hp = HParams::flash();
        let q2: u64 = crate::model::layout::tensor_plan(&hp)
            .iter()
            .filter(|s| !(s.optional && s.layer.is_some_and(|l| hp.is_hash_layer(l))))
            .map(|s| {
                concrete_type(s, ExpertTypes::Q2)
                    .bytes_for(s.dims.iter().product())
                    .unwrap()
            })
            .sum();
        let meta = DsparkMeta {
            block_size: 5,
            markov_rank: 256,
            noise_token: 128_799,
            targets: vec![40, 41, 42],
        };
        let support: u64 = tensor_plan(&hp, &meta, 3)
            .iter()
            .map(|s| {
                let f16_fn = s.name.contains(".hc_") && s.name.ends_with("_fn.weight");
                let ty = match s.rule {
                    _ if f16_fn => crate::gguf::GgmlType::F16,
                    crate::model::layout::TypeRule::RoutedExpert => concrete_type(s, ExpertTypes::Q2),
                    crate::model::layout::TypeRule::AnyOf(t) => t[0],
                    crate::model::layout::TypeRule::Exact(t) => t,
                };
                ty.bytes_for(s.dims.iter().product()).unwrap()
            })
            .sum();
        assert_eq!(support, 5_989_108_652);
        let drafter = session_bytes(&hp, &meta, 3, 256, 128);
        assert_eq!(drafter, 12_582_912 + 786_432);
        let ctx = 65_536;
        let kv = cpu_kv_bytes(&hp, ctx);
        let scratch = cpu_scratch_estimate(&hp, 1024);
        let need = MemoryNeed {
            weight_bytes: q2 + support,
            residence: WeightResidence::DeviceCopy { unified: true },
            kv_bytes: kv + drafter,
            scratch_bytes: scratch,
            kv_on_device: true,
            checkpoint_bytes: 0,
        };
        let gpu = GpuMemory {
            vram_total: 512 << 20,
            vram_used: 0,
            gtt_total: gib_u(120.0),
            gtt_used: 0,
        };
        let pinned = need.weight_bytes + need.kv_bytes + need.scratch_bytes;
        // 80.76 GiB + 5.58 GiB + KV 0.87 GiB + scratch 0.61 GiB = 87.82 GiB (docs/memory.md#dspark).
        let g = |b: u64| format!("{:.2}", b as f64 / (1u64 << 30) as f64);
        assert_eq!(
            (g(q2), g(support), g(kv + drafter), g(scratch), g(pinned)),
            (
                "80.76".into(),
                "5.58".into(),
                "0.87".into(),
                "0.61".into(),
                "87.82".into()
            )
        );
        assert_eq!(
            check_memory(&need, &host_gib(128.0, 124.0), Some(&gpu), &hp, ctx),
            MemoryVerdict::Fits
        );
    }
}
