//! Peak device memory bandwidth, for `bench`'s roofline column on a GPU: a large device-to-device
//! copy timed with device events, counting the bytes read plus the bytes written (a decode step
//! only reads its weights, and a copy is the simplest kernel that streams memory at the rate the
//! memory system sustains both ways; docs/model.md#weight-bytes-per-token takes weight bytes per token
//! against this figure).
//!
//! Owns the measurement only; `cli::bench` decides when to use it (`--peak-gbps` overrides it).

use super::runtime::HipContext;

/// Largest copy measured: large enough to defeat the caches (the H200's L2 is 50 MiB, Strix Halo's
/// infinity cache 32 MiB), small enough to leave room next to a loaded model.
const MAX_COPY_BYTES: u64 = 512 << 20;

/// Timed copies; the best one counts (the first ones may pay for page mapping and clocks rising).
const REPEATS: usize = 6;

/// (GB/s read + written, bytes per copy) of the best of several device-to-device copies on `ctx`'s
/// device, sized to an eighth of the free memory (at most 512 MiB).
pub fn measure_copy_gbps(ctx: &HipContext) -> Result<(f64, u64), String> {
    let e = |e: super::runtime::HipError| format!("device bandwidth probe: {e}");
    ctx.bind_thread().map_err(e)?;
    let (free, _) = ctx.mem_info().map_err(e)?;
    let bytes = (free / 8).min(MAX_COPY_BYTES) / (1 << 20) * (1 << 20);
    if bytes == 0 {
        return Err(format!(
            "device bandwidth probe: only {} MiB of device memory free",
            free >> 20
        ));
    }
    let n = bytes as usize;
    let src = ctx.alloc(n).map_err(e)?;
    let mut dst = ctx.alloc(n).map_err(e)?;
    let stream = ctx.stream().map_err(e)?;
    let (start, end) = (ctx.event(true).map_err(e)?, ctx.event(true).map_err(e)?);
    let mut best = 0f64;
    for _ in 0..REPEATS {
        start.record(&stream).map_err(e)?;
        dst.copy_from_device_async(0, &src, 0, n, &stream).map_err(e)?;
        end.record(&stream).map_err(e)?;
        end.synchronize().map_err(e)?;
        let ms = end.elapsed_ms_since(&start).map_err(e)? as f64;
        if ms > 0.0 {
            best = best.max(2.0 * bytes as f64 / (ms * 1e-3) / 1e9);
        }
    }
    if best <= 0.0 {
        return Err("device bandwidth probe: the copies took no measurable time".into());
    }
    Ok((best, bytes))
}
