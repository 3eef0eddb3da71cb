//! The session cache on the device: one `LayerState` per layer (raw KV ring, compressed rows and
//! compressor/indexer state), allocated from the plan of `footprint::layer_plans`, and its read-back
//! for inspection (`LayerCacheView`).

use crate::backend::EngineError;
use crate::model::hparams::HParams;

use super::acts::ring_rows;
use super::footprint::layer_plans;
use super::kernels::DevPtr;
use super::runtime::{DeviceBuffer, DevicePtr, HipContext, Stream};

/// Device state of one layer (docs/model.md#kv-cache): the raw ring, compressed rows and compressor
/// states.
pub(super) struct LayerState {
    /// `acts::ring_rows` rows of head_dim floats, row = position % rows.
    pub(super) ring: DeviceBuffer,
    /// Compressed rows, compressor kv and score state (ratio != 0).
    pub(super) comp: Option<[DeviceBuffer; 3]>,
    /// Indexer rows and their compressor kv and score state (ratio 4).
    pub(super) index: Option<[DeviceBuffer; 3]>,
    pub(super) comp_cap: usize,
}

/// The layers of a session of `ctx` tokens with prefill chunks of `n_max` tokens, and their bytes.
pub(super) fn alloc_layers(
    hip: &HipContext,
    hp: &HParams,
    ctx: usize,
    n_max: usize,
) -> Result<(Vec<LayerState>, u64), String> {
    let f32s = |n: usize| hip.alloc(4 * n.max(1)).map_err(|e| e.to_string());
    let mut layers = Vec::with_capacity(hp.n_layer);
    let mut kv_bytes = 0u64;
    for plan in layer_plans(hp, ctx, n_max) {
        let mut alloc = |floats: usize| -> Result<DeviceBuffer, String> {
            let b = f32s(floats)?;
            kv_bytes += b.len_bytes() as u64;
            Ok(b)
        };
        let ring = alloc(plan.ring)?;
        let mut state = |s: Option<(usize, usize)>| -> Result<Option<[DeviceBuffer; 3]>, String> {
            s.map(|(rows, st)| Ok([alloc(rows)?, alloc(st)?, alloc(st)?]))
                .transpose()
        };
        let comp = state(plan.comp)?;
        let index = state(plan.index)?;
        layers.push(LayerState {
            ring,
            comp,
            index,
            comp_cap: plan.comp_cap,
        });
    }
    Ok((layers, kv_bytes))
}

/// `n` floats at device address `ptr`, after everything queued on `stream` (synchronizes).
pub(super) fn read_f32(hip: &HipContext, stream: &Stream, ptr: DevPtr, n: usize) -> Result<Vec<f32>, EngineError> {
    let dev = |e: super::runtime::HipError| EngineError::Device(e.to_string());
    stream.synchronize().map_err(dev)?;
    let mut bytes = vec![0u8; 4 * n];
    // SAFETY: callers pass a live device buffer or weight tensor of at least n floats.
    unsafe { hip.copy_device_to_host(DevicePtr(ptr), &mut bytes) }.map_err(dev)?;
    Ok(bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// One layer's device cache read back for inspection (tests, diagnostics), laid out like the CPU
/// engine's `LayerCache`: rows as f32, oldest first.
#[derive(Clone, Debug, Default)]
pub struct LayerCacheView {
    /// Raw rows of the last min(n_past, window) positions, [rows][head_dim].
    pub raw: Vec<f32>,
    /// Compressed attention rows emitted so far, [rows][head_dim] (ratio != 0).
    pub comp: Vec<f32>,
    /// Indexer rows emitted so far, [rows][idx_head_dim] (ratio 4).
    pub index: Vec<f32>,
    /// Compressor kv and score state of the attention rows, then of the indexer rows.
    pub state: Vec<f32>,
}

/// Every layer's cache after `n_past` tokens, read back (synchronizes `stream`; slow, for tests and
/// diagnostics). `n_max`: the session's prefill chunk (it sizes the rings).
pub(super) fn read_cache(
    hip: &HipContext,
    stream: &Stream,
    hp: &HParams,
    layers: &[LayerState],
    n_max: usize,
    n_past: usize,
) -> Result<Vec<LayerCacheView>, EngineError> {
    let read_f32 = |ptr: DevPtr, n: usize| read_f32(hip, stream, ptr, n);
    let p0 = |b: &DeviceBuffer| b.ptr().0;
    let rows = ring_rows(hp, n_max);
    let d = hp.head_dim;
    let mut out = Vec::with_capacity(hp.n_layer);
    for (l, ls) in layers.iter().enumerate() {
        let mut v = LayerCacheView::default();
        let ring = read_f32(p0(&ls.ring), rows * d)?;
        for pos in n_past.saturating_sub(hp.sliding_window)..n_past {
            let r = pos % rows;
            v.raw.extend_from_slice(&ring[r * d..(r + 1) * d]);
        }
        let ratio = hp.ratio(l) as usize;
        let n_comp = n_past.checked_div(ratio).unwrap_or(0).min(ls.comp_cap);
        for (st, width, dst) in [(&ls.comp, d, &mut v.comp), (&ls.index, hp.idx_head_dim, &mut v.index)] {
            if let Some(st) = st {
                dst.extend(read_f32(p0(&st[0]), n_comp * width)?);
                for b in &st[1..] {
                    v.state.extend(read_f32(p0(b), b.len_bytes() / 4)?);
                }
            }
        }
        out.push(v);
    }
    Ok(out)
}
