//! Synthetic ds4-layout models: deterministic random weights in the exact tensor layout and metadata
//! that ds4 and `model::Model` bind (docs/gguf.md#metadata, #tensors, docs/model.md#tiny-model), for tests,
//! `--demo` and `gen-model`.
//!
//! Layer: imports only `gguf`, `model` and `units` (src/lib.rs), so the backends' own tests can use it.
//!
//! Owns the choice of metadata values and weight distributions. Shapes come only from
//! `model::layout::tensor_plan` (single source); bytes on disk only from `gguf::writer`. Weight scales
//! follow ../shared/vectors/gen_tiny_gguf.py so activations stay of order 1 through every layer:
//! std 1/√fan_in, norm weights ≈ 1, sublayer output projections × 0.25, and "hot" FFN channels
//! (gate/up × 4, their down-projection inputs × 1/16) so the SwiGLU clamp actually fires.

pub mod blocks;
pub mod dspark;
pub mod rng;
pub mod vocab;

use std::path::Path;
use std::sync::Arc;

use crate::gguf::half::f32_to_f16;
use crate::gguf::reader::vt;
use crate::gguf::writer::{GgufLayout, TensorEntry};
use crate::gguf::{GgmlType, GgufError, GgufFile, MetaValue};
use crate::model::HParams;
use crate::model::hparams::ARCH;
use crate::model::layout::{ExpertTypes, TensorSpec, concrete_type, tensor_plan};

use rng::Stream;

/// Sublayer output gain (gen_tiny_gguf.py: OUT_GAIN).
const OUT_GAIN: f32 = 0.25;
/// Gain of hot FFN channels on gate/up, and damping of their down-projection inputs.
const HOT_GAIN: f32 = 4.0;
const HOT_DAMP: f32 = 1.0 / 16.0;
/// Generator identity recorded in the file.
pub const GENERATOR: &str = "ds4-chat genmodel/1";

/// Which model shape to write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preset {
    /// `HParams::tiny()` (docs/model.md#tiny-model, real vocabulary): ~110 MB.
    Tiny,
    /// `HParams::flash()`: the real DeepSeek V4 Flash shapes (80.76 GiB with q2 experts).
    Flash,
    /// `micro_hparams()`: the smallest file the loader binds (one layer, 16-token vocabulary, no
    /// tokenizer), ~370 KB: fuzz seeds and malformed-file tests.
    Micro,
}

impl Preset {
    pub fn hparams(self) -> HParams {
        match self {
            Preset::Tiny => HParams::tiny(),
            Preset::Flash => HParams::flash(),
            Preset::Micro => micro_hparams(),
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Preset::Tiny => "tiny",
            Preset::Flash => "flash",
            Preset::Micro => "micro",
        }
    }
}

/// Routed-expert quantization of the whole file (docs/gguf.md#quantization-mixes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpertMix {
    /// IQ2_XXS gate/up, Q2_K down (the shipped q2 file).
    Q2,
    /// Q4_K everywhere (the shipped q4 file).
    Q4,
    /// Q4_K on the last third of the layers, q2 elsewhere (like the shipped mixed files).
    Mixed,
}

impl ExpertMix {
    pub fn name(self) -> &'static str {
        match self {
            ExpertMix::Q2 => "q2",
            ExpertMix::Q4 => "q4",
            ExpertMix::Mixed => "mixed",
        }
    }

    /// Expert types of `layer` in a model of `n_layer` layers.
    pub fn layer_types(self, layer: usize, n_layer: usize) -> ExpertTypes {
        match self {
            ExpertMix::Q2 => ExpertTypes::Q2,
            ExpertMix::Q4 => ExpertTypes::Q4,
            ExpertMix::Mixed if layer >= n_layer - n_layer / 3 => ExpertTypes::Q4,
            ExpertMix::Mixed => ExpertTypes::Q2,
        }
    }
}

/// Everything that determines a synthetic file.
#[derive(Clone, Debug)]
pub struct GenSpec {
    pub hp: HParams,
    pub seed: u64,
    pub experts: ExpertMix,
    pub name: String,
    /// Write the `tokenizer.ggml.*` keys (the vendored vocabulary cut to n_vocab).
    pub tokenizer: bool,
}

impl GenSpec {
    pub fn new(preset: Preset, seed: u64, experts: ExpertMix) -> GenSpec {
        GenSpec {
            hp: preset.hparams(),
            seed,
            experts,
            name: format!(
                "ds4-chat synthetic {} ({} experts, seed {seed})",
                preset.name(),
                experts.name()
            ),
            tokenizer: preset != Preset::Micro,
        }
    }

    /// The tiny preset cut to one layer of each compression kind (uncompressed, ratio 4 with the
    /// indexer, ratio 128), a 512-token vocabulary and no tokenizer: the smallest model that holds
    /// every kind of cache state (raw ring, compressed rows, compressor and indexer state), for tests
    /// of the decode paths.
    pub fn tiny_each_cache_kind(seed: u64, experts: ExpertMix) -> GenSpec {
        let mut spec = GenSpec::new(Preset::Tiny, seed, experts);
        spec.hp.n_vocab = 512;
        spec.hp.n_layer = 3;
        spec.hp.n_hash_layer = 1;
        spec.hp.compress_ratios = vec![0, 4, 128];
        spec.hp.swiglu_clamp = vec![10.0; 3];
        spec.tokenizer = false;
        spec
    }

    /// The spec with only the first `n` layers (same per-layer shapes, schedules cut to `n`): a
    /// smaller file whose every layer runs as in the full one, e.g. the Flash shapes on a GPU with
    /// less memory than the 43-layer file needs. `n` must be between 1 and the preset's layers.
    /// With `ExpertMix::Mixed` the Q4_K layers are the cut file's last third
    /// (`ExpertMix::layer_types`), not the full file's.
    pub fn with_layers(mut self, n: usize) -> Result<GenSpec, String> {
        let all = self.hp.n_layer;
        if n == 0 || n > all {
            return Err(format!("--layers {n}: the preset has {all} layers (give 1 to {all})"));
        }
        if n < all {
            self.hp.n_layer = n;
            self.hp.n_hash_layer = self.hp.n_hash_layer.min(n);
            self.hp.compress_ratios.truncate(n);
            self.hp.swiglu_clamp.truncate(n);
            self.name = format!("{}, first {n} of {all} layers", self.name);
        }
        Ok(self)
    }
}

/// The smallest hyperparameters that pass `HParams::validate` (rows stay whole 256-blocks): one
/// dense hash-routed layer, E = F = 256, one routed expert, 16 tokens.
pub fn micro_hparams() -> HParams {
    HParams {
        n_layer: 1,
        n_embd: 256,
        n_vocab: 16,
        n_head: 2,
        head_dim: 128,
        q_lora_rank: 32,
        o_lora_rank: 32,
        n_out_group: 1,
        n_expert: 1,
        n_expert_used: 1,
        n_ff_exp: 256,
        n_hash_layer: 1,
        sliding_window: 4,
        idx_n_head: 1,
        idx_top_k: 2,
        n_hc: 2,
        compress_ratios: vec![0],
        swiglu_clamp: vec![10.0],
        ..HParams::tiny()
    }
}

/// The planned tensors of a file: the layout plan with concrete types, `exp_probs_b` on non-hash
/// layers only (as in the shipped files, docs/model.md#file-sizes), in plan order.
pub fn plan_tensors(hp: &HParams, experts: ExpertMix) -> Vec<(TensorSpec, TensorEntry)> {
    tensor_plan(hp)
        .into_iter()
        .filter(|s| !(s.name.ends_with("exp_probs_b.bias") && s.layer.is_some_and(|l| hp.is_hash_layer(l))))
        .map(|s| {
            let ex = experts.layer_types(s.layer.unwrap_or(0), hp.n_layer);
            let entry = TensorEntry {
                name: s.name.clone(),
                ty: concrete_type(&s, ex),
                dims: s.dims.clone(),
            };
            (s, entry)
        })
        .collect()
}

/// Every metadata key of docs/gguf.md#metadata with ds4's types (u32 strict integers, f32 floats, u32 ratio
/// array, f32 clamp array, bool norm flag), for `hp`.
pub fn hparams_metadata(hp: &HParams, name: &str) -> Vec<(String, MetaValue)> {
    let mut m: Vec<(String, MetaValue)> = vec![
        ("general.architecture".into(), MetaValue::String(ARCH.into())),
        ("general.name".into(), MetaValue::String(name.into())),
        ("general.alignment".into(), MetaValue::U32(32)),
    ];
    let k = |s: &str| format!("{ARCH}.{s}");
    let u32s: [(&str, usize); 25] = [
        ("block_count", hp.n_layer),
        ("embedding_length", hp.n_embd),
        ("vocab_size", hp.n_vocab),
        ("attention.head_count", hp.n_head),
        ("attention.head_count_kv", hp.n_head_kv),
        ("attention.key_length", hp.head_dim),
        ("attention.value_length", hp.head_dim),
        ("rope.dimension_count", hp.n_rot),
        ("attention.q_lora_rank", hp.q_lora_rank),
        ("attention.output_lora_rank", hp.o_lora_rank),
        ("attention.output_group_count", hp.n_out_group),
        ("expert_count", hp.n_expert),
        ("expert_used_count", hp.n_expert_used),
        ("expert_feed_forward_length", hp.n_ff_exp),
        ("expert_shared_count", hp.n_expert_shared),
        ("hash_layer_count", hp.n_hash_layer),
        ("expert_group_count", 0),
        ("expert_group_used_count", 0),
        ("attention.sliding_window", hp.sliding_window),
        ("attention.indexer.head_count", hp.idx_n_head),
        ("attention.indexer.key_length", hp.idx_head_dim),
        ("attention.indexer.top_k", hp.idx_top_k),
        ("hyper_connection.count", hp.n_hc),
        ("hyper_connection.sinkhorn_iterations", hp.sinkhorn_iters),
        ("rope.scaling.original_context_length", hp.rope_orig_ctx as usize),
    ];
    m.push((k("context_length"), MetaValue::U64(hp.context_length)));
    for (key, v) in u32s {
        m.push((k(key), MetaValue::U32(v as u32)));
    }
    m.push((
        k("attention.compress_ratios"),
        MetaValue::Array(vt::U32, hp.compress_ratios.iter().map(|&r| MetaValue::U32(r)).collect()),
    ));
    m.push((
        k("swiglu_clamp_exp"),
        MetaValue::Array(vt::F32, hp.swiglu_clamp.iter().map(|&c| MetaValue::F32(c)).collect()),
    ));
    let f32s = [
        ("rope.freq_base", hp.rope_freq_base),
        ("rope.scaling.factor", hp.rope_scaling_factor),
        ("rope.scaling.yarn_beta_fast", hp.yarn_beta_fast),
        ("rope.scaling.yarn_beta_slow", hp.yarn_beta_slow),
        ("attention.compress_rope_freq_base", hp.compress_rope_freq_base),
        ("expert_weights_scale", hp.expert_weights_scale),
        ("attention.layer_norm_rms_epsilon", hp.rms_eps),
        ("hyper_connection.epsilon", hp.hc_eps),
    ];
    for (key, v) in f32s {
        m.push((k(key), MetaValue::F32(v)));
    }
    m.push((k("expert_weights_norm"), MetaValue::Bool(hp.expert_weights_norm)));
    m
}

/// All metadata of a synthetic file: hyperparameters, tokenizer (vendored vocabulary cut to
/// `n_vocab`) and provenance.
pub fn model_metadata(spec: &GenSpec) -> Result<Vec<(String, MetaValue)>, GgufError> {
    let mut m = hparams_metadata(&spec.hp, &spec.name);
    if spec.tokenizer {
        m.extend(vocab::tokenizer_metadata(vocab::vendored_vocab(spec.hp.n_vocab)?));
    }
    m.push(("ds4_chat.generator".into(), MetaValue::String(GENERATOR.into())));
    m.push(("ds4_chat.seed".into(), MetaValue::U64(spec.seed)));
    m.push(("ds4_chat.experts".into(), MetaValue::String(spec.experts.name().into())));
    Ok(m)
}

/// How one tensor's values are drawn.
#[derive(Clone, Copy, Debug)]
enum Init {
    /// mean + std·N(0,1) per element (F32/F16) or per quantized value (std only).
    Normal { mean: f32, std: f32 },
    /// `[K_e, V]` int32: K_e distinct experts in [0, n_expert) per token.
    Tid2Eid { n_expert: u32, n_used: usize },
}

/// Hot FFN channels (gen_tiny_gguf.py): the last `width` of the `ff` channels.
#[derive(Clone, Copy, Debug)]
enum Hot {
    None,
    /// Rows are FFN channels (row r is channel r mod ff): gate/up gain.
    Rows {
        ff: usize,
        width: usize,
    },
    /// Columns are FFN channels: down-projection damping.
    Cols {
        ff: usize,
        width: usize,
    },
}

impl Hot {
    #[inline]
    fn gain(self, row: usize, col: usize) -> f32 {
        match self {
            Hot::None => 1.0,
            Hot::Rows { ff, width } if row % ff >= ff - width => HOT_GAIN,
            Hot::Cols { ff, width } if col >= ff - width => HOT_DAMP,
            _ => 1.0,
        }
    }
}

/// Hot channel count: a whole 256-block when the FFN is wide enough to keep the hot channels in their
/// own Q8_K/Q2_K block (as the oracle generator does), else the last 1/16 of the channels.
fn hot_width(ff: usize) -> usize {
    if ff >= 512 { 256 } else { ff / 16 }
}

/// A tensor with its generator.
struct Recipe {
    ty: GgmlType,
    row_len: usize,
    init: Init,
    hot: Hot,
    stream: Stream,
}

fn recipe(spec: &TensorSpec, ty: GgmlType, hp: &HParams, seed: u64) -> Recipe {
    let isq = |n: usize| 1.0 / (n as f32).sqrt();
    let (e, ff) = (hp.n_embd, hp.n_ff_exp);
    // The name without its `blk.N.` (main model) or `mtp.N.` (DSpark support file) prefix.
    let base = ["blk.", "mtp."]
        .iter()
        .find_map(|p| spec.name.strip_prefix(p))
        .map_or(spec.name.as_str(), |r| r.split_once('.').map_or(r, |(_, rest)| rest));
    let n = |mean: f32, std: f32| Init::Normal { mean, std };
    let norm_w = n(1.0, 0.3);
    let hw = hot_width(ff);
    let (init, hot) = match base {
        "token_embd.weight" => (n(0.0, 1.0), Hot::None),
        "output_hc_base.weight" => (n(0.0, 0.5), Hot::None),
        "output_hc_fn.weight" | "hc_attn_fn.weight" | "hc_ffn_fn.weight" => (n(0.0, isq(hp.hc_dim())), Hot::None),
        "output_hc_scale.weight" => (n(1.0, 0.1), Hot::None),
        "hc_attn_scale.weight" | "hc_ffn_scale.weight" => (n(1.0, 0.25), Hot::None),
        "hc_attn_base.weight" | "hc_ffn_base.weight" => (n(0.0, 0.5), Hot::None),
        "output.weight" => (n(0.0, 2.0 * isq(e)), Hot::None),
        "attn_q_b.weight" | "indexer.attn_q_b.weight" => (n(0.0, isq(hp.q_lora_rank)), Hot::None),
        "attn_sinks.weight" => (n(0.0, 1.0), Hot::None),
        "attn_output_a.weight" => (n(0.0, isq(hp.group_dim())), Hot::None),
        "attn_output_b.weight" => (n(0.0, OUT_GAIN * isq(hp.n_out_group * hp.o_lora_rank)), Hot::None),
        "attn_compressor_ape.weight" | "indexer_compressor_ape.weight" => (n(0.0, 0.5), Hot::None),
        "exp_probs_b.bias" => (n(0.0, 0.1), Hot::None),
        "ffn_gate_exps.weight" | "ffn_up_exps.weight" | "ffn_gate_shexp.weight" | "ffn_up_shexp.weight" => {
            (n(0.0, isq(e)), Hot::Rows { ff, width: hw })
        }
        "ffn_down_exps.weight" | "ffn_down_shexp.weight" => (n(0.0, OUT_GAIN * isq(ff)), Hot::Cols { ff, width: hw }),
        // DSpark support file (`dspark`): the conditioning projection, the HC head, the Markov and
        // confidence heads.
        "main_proj.weight" => (n(0.0, isq(spec.dims[0] as usize)), Hot::None),
        "hc_head_fn.weight" => (n(0.0, isq(hp.hc_dim())), Hot::None),
        "hc_head_base.weight" => (n(0.0, 0.5), Hot::None),
        "hc_head_scale.weight" => (n(1.0, 0.1), Hot::None),
        "markov_head.markov_w1.weight" => (n(0.0, 1.0), Hot::None),
        "markov_head.markov_w2.weight" | "confidence_head.proj.weight" => {
            (n(0.0, isq(spec.dims[0] as usize)), Hot::None)
        }
        "ffn_gate_tid2eid.weight" => (
            Init::Tid2Eid {
                n_expert: hp.n_expert as u32,
                n_used: hp.n_expert_used,
            },
            Hot::None,
        ),
        b if b.ends_with("norm.weight") => (norm_w, Hot::None),
        // Remaining projections from the embedding: q_a, kv, compressor/indexer kv and gate,
        // indexer proj, router.
        _ => (n(0.0, isq(e)), Hot::None),
    };
    Recipe {
        ty,
        row_len: spec.dims[0] as usize,
        init,
        hot,
        stream: Stream::new(seed, &spec.name),
    }
}

/// Expert of slot `k` for token `t`: K distinct experts drawn by rejection from the token's words.
fn tid2eid(s: &Stream, t: u64, k: usize, n_expert: u32, n_used: usize) -> u32 {
    let mut chosen = [u32::MAX; 64];
    let mut have = 0;
    let mut j = t << 12;
    while have <= k {
        let e = (s.word(j) % n_expert as u64) as u32;
        j += 1;
        if !chosen[..have].contains(&e) {
            chosen[have] = e;
            have += 1;
        }
    }
    debug_assert!(n_used <= 64 && k < n_used);
    chosen[k]
}

impl Recipe {
    /// Fill bytes `[start, start + out.len())` of this tensor (whole blocks).
    fn fill(&self, start: u64, out: &mut [u8]) {
        let bb = self.ty.block_bytes() as usize;
        let be = self.ty.block_elems() as usize;
        let first = start / bb as u64;
        let s = &self.stream;
        let wpb = blocks::words_per_block(self.ty);
        // Row and column of the first block; advanced incrementally (no division per element).
        let mut row = (first * be as u64 / self.row_len as u64) as usize;
        let mut col = (first * be as u64 % self.row_len as u64) as usize;
        let blocks = out.chunks_exact_mut(bb).enumerate();
        match (self.init, self.ty) {
            (Init::Tid2Eid { n_expert, n_used }, _) => {
                for (i, blk) in blocks {
                    let b = first + i as u64;
                    let (t, k) = (b / n_used as u64, (b % n_used as u64) as usize);
                    blk.copy_from_slice(&tid2eid(s, t, k, n_expert, n_used).to_le_bytes());
                }
                return;
            }
            (Init::Normal { mean, std }, GgmlType::F32) => {
                for (i, blk) in blocks {
                    let v = mean + std * self.hot.gain(row, col) * s.normal(first + i as u64);
                    blk.copy_from_slice(&v.to_le_bytes());
                    col += 1;
                    if col == self.row_len {
                        (row, col) = (row + 1, 0);
                    }
                }
                return;
            }
            (Init::Normal { mean, std }, GgmlType::F16) => {
                for (i, blk) in blocks {
                    let v = mean + std * self.hot.gain(row, col) * s.normal(first + i as u64);
                    blk.copy_from_slice(&f32_to_f16(v).to_le_bytes());
                    col += 1;
                    if col == self.row_len {
                        (row, col) = (row + 1, 0);
                    }
                }
                return;
            }
            _ => {}
        }
        let Init::Normal { std, .. } = self.init else {
            unreachable!()
        };
        for (i, blk) in blocks {
            let w0 = (first + i as u64) * wpb;
            let g = std * self.hot.gain(row, col);
            match self.ty {
                // Column damping may vary inside a 32-block when the hot width is small.
                GgmlType::Q8_0 if matches!(self.hot, Hot::Cols { .. }) => {
                    let stds: [f32; 32] = std::array::from_fn(|j| std * self.hot.gain(row, col + j));
                    blocks::q8_0_with(s, w0, &stds, blk)
                }
                GgmlType::Q8_0 => blocks::q8_0(s, w0, g, blk),
                GgmlType::Iq2Xxs => blocks::iq2_xxs(s, w0, g, blk),
                GgmlType::Q2K => blocks::q2_k(s, w0, g, blk),
                GgmlType::Q4K => blocks::q4_k(s, w0, g, blk),
                other => unreachable!("no synthetic {other} weights in the plan"),
            }
            col += be;
            if col == self.row_len {
                (row, col) = (row + 1, 0);
            }
        }
    }
}

/// A synthetic file ready to be written: layout plus one generator per tensor.
pub struct SyntheticModel {
    pub layout: GgufLayout,
    recipes: Vec<Recipe>,
}

impl SyntheticModel {
    pub fn new(spec: &GenSpec) -> Result<SyntheticModel, GgufError> {
        spec.hp.validate()?;
        let planned = plan_tensors(&spec.hp, spec.experts);
        let recipes = planned
            .iter()
            .map(|(s, e)| recipe(s, e.ty, &spec.hp, spec.seed))
            .collect();
        let entries: Vec<TensorEntry> = planned.into_iter().map(|(_, e)| e).collect();
        let layout = GgufLayout::new(&model_metadata(spec)?, &entries)?;
        Ok(SyntheticModel { layout, recipes })
    }

    /// Bytes `[start, start + out.len())` of tensor `t`.
    pub fn fill(&self, t: usize, start: u64, out: &mut [u8]) {
        self.recipes[t].fill(start, out)
    }

    /// The whole file in memory (parallel over the rayon pool).
    pub fn to_bytes(&self) -> Vec<u8> {
        self.layout.to_vec(1 << 20, |t, s, b| self.fill(t, s, b))
    }

    /// Stream to `path` with `threads` writer threads (0 = all cores); never holds the file in RAM.
    pub fn write_file(&self, path: &Path, threads: usize, progress: impl Fn(u64) + Sync) -> Result<(), GgufError> {
        self.layout
            .write_file_parallel(path, threads, 32 << 20, |t, s, b| self.fill(t, s, b), progress)
    }
}

/// The whole file of `spec` in memory.
pub fn model_bytes(spec: &GenSpec) -> Result<Vec<u8>, GgufError> {
    Ok(SyntheticModel::new(spec)?.to_bytes())
}

/// The tiny model (docs/model.md#tiny-model, real vocabulary) as an in-memory file, for tests and the TUI's
/// --demo.
pub fn tiny_model(seed: u64, experts: ExpertMix) -> Result<Arc<GgufFile>, GgufError> {
    let bytes = SyntheticModel::new(&GenSpec::new(Preset::Tiny, seed, experts))?.to_bytes();
    GgufFile::from_bytes(bytes).map(Arc::new)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flash_q2_plan_matches_the_shipped_file() {
        // Tensor bytes summed independently from the per-tensor byte column of docs/gguf.md#tensors:
        // globals, 43 common layer sets, 21 ratio-4 and 20 ratio-128 extras, 3 tid2eid, 40 biases.
        let globals = 1_059_061_760 + 16 + 131_072 + 4 + 16_384 + 562_626_560u64;
        let common = 2 * (786_432 + 12 + 96)
            + 16_384
            + 4_456_448
            + 4_096
            + 35_651_584
            + 2_228_224
            + 2_048
            + 256
            + 2 * 35_651_584
            + 16_384
            + 2_097_152
            + 2 * 553_648_128
            + 704_643_072
            + 3 * 8_912_896u64;
        let r4 = 8_192 + 2 * 8_388_608 + 2_048 + 16_777_216 + 524_288 + 2_048 + 2 * 2_097_152 + 512u64;
        let r128 = 131_072 + 2 * 4_194_304 + 2_048u64;
        let want = globals + 43 * common + 21 * r4 + 20 * r128 + 3 * 3_102_720 + 40 * 1_024;
        assert_eq!(want, 86_714_775_900);
        let planned = plan_tensors(&HParams::flash(), ExpertMix::Q2);
        // 1328 tensors, as in the shipped q2 file.
        assert_eq!(planned.len(), 1328);
        let bytes: u64 = planned
            .iter()
            .map(|(_, e)| e.ty.bytes_for(e.dims.iter().product()).unwrap())
            .sum();
        assert_eq!(bytes, want);
        // 80.76 GiB (docs/model.md#file-sizes).
        assert!((bytes as f64 / (1u64 << 30) as f64 - 80.76).abs() < 0.005);
    }

    #[test]
    fn flash_cut_to_its_first_layers_keeps_their_tensors() {
        // --layers 24: the first 24 layers' tensors exactly as in the full plan (names, types,
        // dims), the globals, nothing of layers 24..43; about 46 GiB.
        let full = plan_tensors(&HParams::flash(), ExpertMix::Q2);
        let spec = GenSpec::new(Preset::Flash, 1, ExpertMix::Q2).with_layers(24).unwrap();
        assert_eq!(
            (
                spec.hp.n_layer,
                spec.hp.compress_ratios.len(),
                spec.hp.swiglu_clamp.len()
            ),
            (24, 24, 24)
        );
        let cut = plan_tensors(&spec.hp, ExpertMix::Q2);
        let keep = |t: &TensorSpec| t.layer.is_none_or(|l| l < 24);
        let want: Vec<_> = full.iter().filter(|(t, _)| keep(t)).map(|(_, e)| e).collect();
        assert_eq!(cut.iter().map(|(_, e)| e).collect::<Vec<_>>(), want);
        let m = SyntheticModel::new(&spec).unwrap();
        let gib = m.layout.file_size as f64 / (1u64 << 30) as f64;
        assert!((45.0..47.0).contains(&gib), "{gib}");
        // All layers leaves the spec as it was; 0 and more than the preset's are refused.
        let same = GenSpec::new(Preset::Flash, 1, ExpertMix::Q2).with_layers(43).unwrap();
        assert_eq!(same.hp, HParams::flash());
        for n in [0, 44] {
            let e = GenSpec::new(Preset::Flash, 1, ExpertMix::Q2)
                .with_layers(n)
                .unwrap_err();
            assert!(e.contains("the preset has 43 layers"), "{e}");
        }
    }

    #[test]
    fn flash_file_layout_without_writing_it() {
        // The whole layout (metadata with the 129,280-token vocabulary, directory, padding) of the
        // 81 GiB file is computed without generating any weight. A synthetic Flash file written by
        // another implementation was 86,720,106,496 bytes in all; ours differs only by its metadata.
        let m = SyntheticModel::new(&GenSpec::new(Preset::Flash, 1, ExpertMix::Q2)).unwrap();
        assert_eq!(m.layout.tensors.len(), 1328);
        assert_eq!(m.layout.tensor_bytes(), 86_714_775_900);
        assert!(m.layout.tensors.iter().all(|t| t.offset % 32 == 0));
        assert!(
            m.layout.file_size.abs_diff(86_720_106_496) < 1 << 20,
            "{}",
            m.layout.file_size
        );
        let q4 = plan_tensors(&HParams::flash(), ExpertMix::Q4);
        let q4_bytes: u64 = q4
            .iter()
            .map(|(_, e)| e.ty.bytes_for(e.dims.iter().product()).unwrap())
            .sum();
        // 153.32 GiB (docs/model.md#file-sizes).
        assert!((q4_bytes as f64 / (1u64 << 30) as f64 - 153.32).abs() < 0.005);
    }

    #[test]
    fn micro_model_binds_and_is_small() {
        let bytes = model_bytes(&GenSpec::new(Preset::Micro, 5, ExpertMix::Q2)).unwrap();
        assert!(bytes.len() < 400_000, "{}", bytes.len());
        let f = Arc::new(GgufFile::from_bytes(bytes).unwrap());
        let m = crate::model::Model::bind(f).unwrap();
        assert_eq!(m.hp, micro_hparams());
        assert!(m.file.get("tokenizer.ggml.tokens").is_none());
    }

    #[test]
    fn mixed_puts_q4_on_the_last_third() {
        let n = 43;
        let q4: Vec<usize> = (0..n)
            .filter(|&l| ExpertMix::Mixed.layer_types(l, n) == ExpertTypes::Q4)
            .collect();
        assert_eq!(q4, (29..43).collect::<Vec<_>>());
        assert_eq!(ExpertMix::Mixed.layer_types(3, 6), ExpertTypes::Q2);
        assert_eq!(ExpertMix::Mixed.layer_types(4, 6), ExpertTypes::Q4);
    }

    #[test]
    fn tid2eid_rows_are_distinct_experts() {
        let s = Stream::new(1, "t");
        for t in 0..500 {
            let row: Vec<u32> = (0..6).map(|k| tid2eid(&s, t, k, 16, 6)).collect();
            let mut d = row.clone();
            d.sort();
            d.dedup();
            assert_eq!(d.len(), 6, "token {t}: {row:?}");
            assert!(row.iter().all(|&e| e < 16));
        }
    }
}
