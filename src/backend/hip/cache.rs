//! The session cache on the device: one `LayerState` per layer (raw KV ring, compressed rows and
//! compressor/indexer state), allocated from the plan of `footprint::layer_plans`.

use crate::model::hparams::HParams;

use super::footprint::layer_plans;
use super::runtime::{DeviceBuffer, HipContext};

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
