//! Synthetic DSpark support files (docs/dspark.md#support-file): the tensor table of
//! `model::dspark::tensor_plan` for a main model's shapes, ds4's metadata keys, and the same
//! deterministic seeded weights as the main synthetic models (`super::recipe`).
//!
//! Owns the choice of the support file's metadata values (ds4's for the Flash shapes, scaled down
//! for smaller models) and its tensor types (ds4's quantizer: Q8_0 dense, F16 `hc_*_fn`, F32
//! vectors, IQ2_XXS/Q2_K routed experts).

use crate::gguf::reader::vt;
use crate::gguf::writer::{GgufLayout, TensorEntry};
use crate::gguf::{GgmlType, GgufError, MetaValue};
use crate::model::HParams;
use crate::model::dspark::{DsparkMeta, MIN_STAGES, tensor_plan};
use crate::model::layout::{ExpertRole, TypeRule};

use super::{GENERATOR, SyntheticModel, recipe};

/// ds4's noise token for the Flash vocabulary.
const FLASH_NOISE_TOKEN: u32 = 128_799;

/// The metadata a support file for `hp` carries: ds4's values on the Flash shapes (block 5, rank
/// 256, noise token 128799, the last three layers); a rank of 32 for models narrower than Flash and
/// the last vocabulary entry as the noise token when the vocabulary is smaller.
pub fn meta_for(hp: &HParams) -> DsparkMeta {
    let n_targets = hp.n_layer.min(3);
    DsparkMeta {
        block_size: 5,
        markov_rank: if hp.n_embd >= 4096 { 256 } else { 32 },
        noise_token: FLASH_NOISE_TOKEN.min(hp.n_vocab as u32 - 1),
        targets: (hp.n_layer - n_targets..hp.n_layer).collect(),
    }
}

/// The metadata keys of a support file with `meta` (the spellings of ds4's quantizer).
pub fn support_metadata(meta: &DsparkMeta, n_stages: usize, seed: u64) -> Vec<(String, MetaValue)> {
    let u = |v: usize| MetaValue::U32(v as u32);
    vec![
        (
            "general.architecture".into(),
            MetaValue::String("deepseek4-dspark".into()),
        ),
        (
            "general.name".into(),
            MetaValue::String(format!("ds4-chat synthetic DSpark support (seed {seed})")),
        ),
        ("general.alignment".into(), MetaValue::U32(32)),
        ("dspark.block_size".into(), u(meta.block_size)),
        ("dspark.markov_rank".into(), u(meta.markov_rank)),
        ("dspark.noise_token_id".into(), MetaValue::U32(meta.noise_token)),
        (
            "dspark.target_layer_ids".into(),
            MetaValue::Array(vt::U32, meta.targets.iter().map(|&l| u(l)).collect()),
        ),
        ("dspark.stage_count".into(), u(n_stages)),
        ("dspark.n_layers".into(), u(n_stages)),
        ("ds4_chat.generator".into(), MetaValue::String(GENERATOR.into())),
        ("ds4_chat.seed".into(), MetaValue::U64(seed)),
    ]
}

/// The concrete type ds4's quantizer writes for a planned support tensor.
fn support_type(rule: TypeRule, role: Option<ExpertRole>) -> GgmlType {
    match (rule, role) {
        (TypeRule::RoutedExpert, Some(ExpertRole::Down)) => GgmlType::Q2K,
        (TypeRule::RoutedExpert, _) => GgmlType::Iq2Xxs,
        (TypeRule::AnyOf(ts), _) => ts[0],
        (TypeRule::Exact(t), _) => t,
    }
}

/// The tensors of a support file for `hp` with `meta`, with the types ds4's quantizer writes.
pub fn support_entries(hp: &HParams, meta: &DsparkMeta) -> Vec<TensorEntry> {
    tensor_plan(hp, meta, MIN_STAGES)
        .into_iter()
        .map(|s| TensorEntry {
            ty: support_type(s.rule, s.expert_role),
            name: s.name,
            dims: s.dims,
        })
        .collect()
}

/// A support file for the main model `hp` with `meta`, seeded weights.
pub fn support_model(hp: &HParams, meta: &DsparkMeta, seed: u64) -> Result<SyntheticModel, GgufError> {
    hp.validate()?;
    let plan = tensor_plan(hp, meta, MIN_STAGES);
    let entries = support_entries(hp, meta);
    let recipes = plan
        .iter()
        .zip(&entries)
        .map(|(s, e)| recipe(s, e.ty, hp, seed))
        .collect();
    let layout = GgufLayout::new(&support_metadata(meta, MIN_STAGES, seed), &entries)?;
    Ok(SyntheticModel { layout, recipes })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flash_support_layout_is_ds4s_file() {
        // 81 tensors, 5,989,108,652 tensor bytes (../shared: ds4's 0731 support file, 5.58 GiB).
        let hp = HParams::flash();
        let meta = meta_for(&hp);
        assert_eq!((meta.block_size, meta.markov_rank, meta.noise_token), (5, 256, 128_799));
        assert_eq!(meta.targets, vec![40, 41, 42]);
        let m = support_model(&hp, &meta, 1).unwrap();
        assert_eq!(m.layout.tensors.len(), 81);
        assert_eq!(m.layout.tensor_bytes(), 5_989_108_652);
    }
}
