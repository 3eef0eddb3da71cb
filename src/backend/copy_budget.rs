//! Where a GPU copy of the weights has to fit, per kind of device.
//!
//! A discrete GPU copies into its own memory: the budget is what `hipMemGetInfo` reports free. An
//! integrated GPU (the `integrated` device property, or a gfx115x APU such as Strix Halo) has no
//! memory of its own worth counting: a copy is system RAM the GPU reaches through GTT, pinned and
//! never reclaimable. So its budget is the smaller of the GTT room (the `ttm.pages_limit` the kernel
//! allows, minus what GTT already holds) and the usable RAM (MemAvailable minus CmaFree, which the
//! kernel counts as available but only hands to movable allocations, minus 2 GiB kept for the
//! rest of the system). The copy on unified memory is the fast placement (weights read at the
//! memory's full bandwidth, no MMU-notifier queue evictions), so `--weights auto` takes it whenever
//! it fits that budget, and maps the file otherwise.
//!
//! Owns this arithmetic as pure functions of device properties and memory counters; the callers
//! read those (HIP runtime, /proc/meminfo, amdgpu sysfs). Must not allocate or place anything.

use super::memguard::{GpuMemory, meminfo_field};

/// RAM a copy on unified memory always leaves to the rest of the system.
pub const UNIFIED_RAM_KEEP: u64 = 2 << 30;

/// What the runtime says about the device.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceFacts {
    pub name: String,
    /// The gfx target (gfx1151, gfx942, ...); empty when unknown.
    pub gfx: String,
    /// The runtime's `integrated` device attribute.
    pub integrated: bool,
    /// `hipMemGetInfo`: free and total device memory.
    pub free: u64,
    pub total: u64,
}

/// The host's memory counters that bound a copy on unified memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnifiedFacts {
    /// GTT limit and use from amdgpu sysfs (`mem_info_gtt_total`, `mem_info_gtt_used`); 0 when unknown.
    pub gtt_total: u64,
    pub gtt_used: u64,
    /// /proc/meminfo MemAvailable and CmaFree.
    pub mem_available: u64,
    pub cma_free: u64,
}

/// The memory a copy placement may fill: `free` of `total`, with a description of where it comes
/// from for the reason line.
#[derive(Clone, Debug, PartialEq)]
pub struct CopyBudget {
    pub free: u64,
    pub total: u64,
    /// "Radeon 8060S (unified memory: GTT 100.0 of 120.0 GiB free, usable RAM 110.0 GiB)".
    pub label: String,
    pub unified: bool,
}

/// Whether the device shares system RAM: the runtime says so, or it is a gfx115x APU (whose
/// runtimes have not always set the attribute).
pub fn is_unified(integrated: bool, gfx: &str) -> bool {
    integrated || gfx.starts_with("gfx115")
}

/// RAM a pinned copy may take: MemAvailable minus CmaFree, keeping [`UNIFIED_RAM_KEEP`].
pub fn usable_ram(mem_available: u64, cma_free: u64) -> u64 {
    mem_available.saturating_sub(cma_free).saturating_sub(UNIFIED_RAM_KEEP)
}

fn gib(b: u64) -> String {
    crate::units::fmt_gib(b, 1)
}

/// The budget a copy must fit on `dev`. Discrete devices: the device's free memory. Unified
/// devices: min(GTT free, usable RAM) of the GTT limit; without amdgpu's GTT counters min(device
/// free, usable RAM) of the device's total; without any counters the device's numbers, said so.
pub fn copy_budget(dev: &DeviceFacts, host: Option<&UnifiedFacts>) -> CopyBudget {
    if !is_unified(dev.integrated, &dev.gfx) {
        return CopyBudget {
            free: dev.free,
            total: dev.total,
            label: dev.name.clone(),
            unified: false,
        };
    }
    let Some(h) = host else {
        return CopyBudget {
            free: dev.free,
            total: dev.total,
            label: format!("{} (unified memory; GTT and RAM counters unreadable)", dev.name),
            unified: true,
        };
    };
    let ram = usable_ram(h.mem_available, h.cma_free);
    let (free, total, gtt) = if h.gtt_total > 0 {
        let gtt_free = h.gtt_total.saturating_sub(h.gtt_used);
        (
            gtt_free.min(ram),
            h.gtt_total,
            format!("GTT {} of {} free", gib(gtt_free), gib(h.gtt_total)),
        )
    } else {
        // No amdgpu counters (a runtime that is not amdgpu's, an emulator): the runtime's own
        // numbers, still capped by the RAM a pinned copy may take.
        (
            dev.free.min(ram),
            dev.total,
            format!(
                "no GTT counters, device memory {} of {} free",
                gib(dev.free),
                gib(dev.total)
            ),
        )
    };
    CopyBudget {
        free,
        total,
        label: format!(
            "{} (unified memory: {gtt}, usable RAM {} = MemAvailable {} - CmaFree {} - {} kept)",
            dev.name,
            gib(ram),
            gib(h.mem_available),
            gib(h.cma_free),
            gib(UNIFIED_RAM_KEEP)
        ),
        unified: true,
    }
}

/// The unified-memory counters from meminfo text and amdgpu's counters (when found).
pub fn unified_facts(meminfo: &str, gpu: Option<&GpuMemory>) -> Option<UnifiedFacts> {
    Some(UnifiedFacts {
        gtt_total: gpu.map_or(0, |g| g.gtt_total),
        gtt_used: gpu.map_or(0, |g| g.gtt_used),
        mem_available: meminfo_field(meminfo, "MemAvailable")?,
        cma_free: meminfo_field(meminfo, "CmaFree").unwrap_or(0),
    })
}

/// Whether `auto` copies: weights plus the session (KV, scratch, reserve) fit the budget.
pub fn auto_copies(budget: &CopyBudget, weight_bytes: u64, session_bytes: u64) -> bool {
    weight_bytes + session_bytes <= budget.free
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn strix(gfx: &str, integrated: bool) -> DeviceFacts {
        // What a Strix Halo reports through hipMemGetInfo with a 512 MiB carve-out.
        DeviceFacts {
            name: "Radeon 8060S".into(),
            gfx: gfx.into(),
            integrated,
            free: GIB / 2,
            total: GIB / 2,
        }
    }

    fn h200() -> DeviceFacts {
        DeviceFacts {
            name: "H200".into(),
            gfx: String::new(),
            integrated: false,
            free: 139 * GIB,
            total: 140 * GIB,
        }
    }

    // 128 GB Strix Halo, ttm.pages_limit raised to 120 GiB, a desktop holding 6 GiB.
    fn roomy() -> UnifiedFacts {
        UnifiedFacts {
            gtt_total: 120 * GIB,
            gtt_used: GIB,
            mem_available: 118 * GIB,
            cma_free: 0,
        }
    }

    const FLASH_Q2: u64 = 86_720_111_488;
    const SESSION_32K: u64 = GIB;

    #[test]
    fn unified_is_the_attribute_or_a_gfx115x_target() {
        assert!(is_unified(true, "gfx1100"));
        assert!(is_unified(false, "gfx1151"));
        assert!(is_unified(false, "gfx1150"));
        assert!(!is_unified(false, "gfx1100"));
        assert!(!is_unified(false, ""));
    }

    #[test]
    fn usable_ram_subtracts_cma_and_keeps_two_gib() {
        assert_eq!(usable_ram(100 * GIB, 10 * GIB), 88 * GIB);
        assert_eq!(usable_ram(GIB, 0), 0);
        assert_eq!(usable_ram(3 * GIB, 2 * GIB), 0);
    }

    #[test]
    fn strix_halo_copies_the_q2_file_when_gtt_and_ram_allow() {
        for dev in [strix("gfx1151", true), strix("gfx1151", false)] {
            let b = copy_budget(&dev, Some(&roomy()));
            assert!(b.unified);
            // min(GTT 119 GiB free, usable RAM 118 - 2 = 116 GiB).
            assert_eq!((b.free, b.total), (116 * GIB, 120 * GIB));
            assert!(auto_copies(&b, FLASH_Q2, SESSION_32K), "{b:?}");
            assert!(
                b.label.contains("GTT 119.0 GiB of 120.0 GiB free") && b.label.contains("usable RAM 116.0 GiB"),
                "{}",
                b.label
            );
        }
    }

    /// On a Strix Halo (gfx1151, integrated) host with `roomy()`'s memory figures as `edit` changes
    /// them: `free` bytes for a copy, too few for the Q2 file with a session of `session` bytes, so
    /// auto maps it.
    fn assert_strix_halo_maps(edit: impl FnOnce(&mut UnifiedFacts), free: u64, session: u64) {
        let mut host = roomy();
        edit(&mut host);
        let b = copy_budget(&strix("gfx1151", true), Some(&host));
        assert_eq!(b.free, free, "{b:?}");
        assert!(!auto_copies(&b, FLASH_Q2, session), "{b:?}");
    }

    #[test]
    fn strix_halo_maps_when_the_gtt_limit_is_the_default_half() {
        // Without ttm.pages_limit the GTT limit is half the RAM: 62 GiB cannot hold 80.8 GiB.
        assert_strix_halo_maps(|h| h.gtt_total = 62 * GIB, 61 * GIB, SESSION_32K);
    }

    #[test]
    fn strix_halo_maps_when_ram_is_taken_or_held_by_cma() {
        // GTT allows it, but the desktop holds 40 GiB: 78 - 2 = 76 GiB usable.
        assert_strix_halo_maps(|h| h.mem_available = 78 * GIB, 76 * GIB, SESSION_32K);
        // CMA pages count as available but a pinned copy cannot use them.
        assert_strix_halo_maps(|h| h.cma_free = 32 * GIB, 84 * GIB, 4 * GIB);
    }

    #[test]
    fn unified_without_gtt_counters_uses_device_memory_capped_by_ram() {
        let h = UnifiedFacts {
            gtt_total: 0,
            gtt_used: 0,
            ..roomy()
        };
        let big = DeviceFacts {
            free: 200 * GIB,
            total: 256 * GIB,
            ..strix("gfx1151", true)
        };
        let b = copy_budget(&big, Some(&h));
        assert_eq!((b.free, b.total), (116 * GIB, 256 * GIB));
        assert!(
            b.label
                .contains("no GTT counters, device memory 200.0 GiB of 256.0 GiB free"),
            "{}",
            b.label
        );
        let b = copy_budget(&strix("gfx1151", true), Some(&h));
        assert_eq!((b.free, b.total), (GIB / 2, GIB / 2));
        // No counters at all: the device's own numbers, and the label says why.
        let b = copy_budget(&strix("gfx1151", true), None);
        assert_eq!(b.free, GIB / 2);
        assert!(b.label.contains("unreadable"));
    }

    #[test]
    fn discrete_gpus_keep_device_memory_whatever_the_host_has() {
        let b = copy_budget(&h200(), Some(&UnifiedFacts::default()));
        assert_eq!((b.free, b.total, b.unified), (139 * GIB, 140 * GIB, false));
        assert_eq!(b.label, "H200");
        assert!(auto_copies(&b, FLASH_Q2, SESSION_32K));
        let small = DeviceFacts {
            name: "RX 7900 XTX".into(),
            gfx: "gfx1100".into(),
            free: 23 * GIB,
            total: 24 * GIB,
            ..h200()
        };
        assert!(!auto_copies(
            &copy_budget(&small, Some(&roomy())),
            FLASH_Q2,
            SESSION_32K
        ));
    }

    #[test]
    fn facts_come_from_meminfo_text() {
        let text = "MemTotal: 131072000 kB\nMemAvailable: 120000000 kB\nCmaFree: 65536 kB\n";
        let gpu = GpuMemory {
            gtt_total: 100,
            gtt_used: 10,
            ..GpuMemory::default()
        };
        let f = unified_facts(text, Some(&gpu)).unwrap();
        assert_eq!(f.mem_available, 120_000_000 * 1024);
        assert_eq!(f.cma_free, 65536 * 1024);
        assert_eq!((f.gtt_total, f.gtt_used), (100, 10));
        assert_eq!(unified_facts("MemTotal: 1 kB\n", None), None);
        assert_eq!(unified_facts("MemAvailable: 1 kB\n", None).unwrap().cma_free, 0);
    }
}
