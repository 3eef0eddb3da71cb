//! The DSpark support file (docs/dspark.md#support-file): DeepSeek's drafter for the 0731 weights,
//! shipped by ds4 as a GGUF of its own beside the main model. Its metadata (block size, Markov rank,
//! noise token, target layers), the tensor table of its stages computed from the main model's
//! hyperparameters, the binding that checks every tensor's presence, type and shape, and the weight
//! bytes a draft pass reads (docs/dspark.md#cost).
//!
//! Owns names, shape formulas, validation and byte counts; the forward pass is
//! `backend::cpu::dspark`. Every defect is one line naming the file and the tensor or key. Must not
//! compute with the weights.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::gguf::{GgmlType, GgufError, GgufFile, MetaValue, TensorInfo};

use super::hparams::HParams;
use super::layout::{TensorSpec, TypeRule, WeightGroup, check_plan};

/// ds4's file name for the 0731 support file, looked for next to the main model.
pub const SUPPORT_FILE_NAME: &str = "DeepSeek-V4-Flash-DSpark-support-0731.gguf";
/// Largest block ds4 accepts (`DS4_DSPARK_MAX_BLOCK_SIZE`).
pub const MAX_BLOCK_SIZE: usize = 16;
/// Most target layers ds4 reads from the metadata array.
pub const MAX_TARGETS: usize = 8;
/// Fewest stages of a DSpark file (ds4's detection; fewer is a legacy MTP file or no drafter).
pub const MIN_STAGES: usize = 3;
/// The confidence threshold ds4 uses on CUDA and ROCm (docs/dspark.md#confidence-cut).
pub const DEFAULT_CONFIDENCE: f32 = 0.7;
/// The context window of DeepSeek's reference drafter, in rows (docs/dspark.md#conventions).
pub const REFERENCE_WINDOW: usize = 128;

/// The support file next to `model` under ds4's name, when it exists.
pub fn beside(model: &Path) -> Option<PathBuf> {
    let p = model.parent().unwrap_or(Path::new(".")).join(SUPPORT_FILE_NAME);
    p.is_file().then_some(p)
}

/// The four metadata keys ds4 reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DsparkMeta {
    /// Draft rows per block (the anchor and block_size − 1 noise tokens).
    pub block_size: usize,
    /// Width of the Markov head's token state.
    pub markov_rank: usize,
    /// The token that fills the block after the anchor.
    pub noise_token: u32,
    /// 0-based main-model layers whose outputs condition the drafter, strictly increasing.
    pub targets: Vec<usize>,
}

/// Which of DeepSeek's reference and ds4's choices the drafter follows where they differ
/// (docs/dspark.md#conventions).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DsparkConvention {
    /// DeepSeek's reference: context KV `kv_norm(wkv(main_x))`, a 128-row sliding window of context
    /// rows before the anchor, confidence read from the pre-norm hidden.
    #[default]
    Reference,
    /// ds4: context KV through the stage's HC pre and `attn_norm`, the window of the last batch of
    /// captured rows, the newest context row repeated in the block at the anchor's position,
    /// confidence read from the post-norm hidden.
    Ds4,
}

impl DsparkConvention {
    /// `reference` or `ds4`; the error is one line.
    pub fn parse(s: &str) -> Result<DsparkConvention, String> {
        match s {
            "reference" => Ok(DsparkConvention::Reference),
            "ds4" => Ok(DsparkConvention::Ds4),
            _ => Err(format!("\"{s}\" is not one of reference, ds4")),
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            DsparkConvention::Reference => "reference",
            DsparkConvention::Ds4 => "ds4",
        }
    }
}

/// The three spellings ds4 accepts for each key, in the order it tries them.
fn spellings(k: &str) -> [String; 3] {
    [
        format!("deepseek4.dspark.{k}"),
        format!("deepseek4.dspark_{k}"),
        format!("dspark.{k}"),
    ]
}

fn find<'a>(g: &'a GgufFile, k: &str) -> Result<(String, &'a MetaValue), GgufError> {
    spellings(k)
        .into_iter()
        .find_map(|s| g.get(&s).map(|v| (s, v)))
        .ok_or_else(|| {
            GgufError::msg(format!(
                "missing metadata key 'dspark.{k}' (nor its deepseek4. spellings)"
            ))
        })
}

fn unsigned(key: &str, v: &MetaValue) -> Result<u64, GgufError> {
    match *v {
        MetaValue::U8(x) => Ok(x as u64),
        MetaValue::U16(x) => Ok(x as u64),
        MetaValue::U32(x) => Ok(x as u64),
        MetaValue::U64(x) => Ok(x),
        MetaValue::I32(x) if x >= 0 => Ok(x as u64),
        MetaValue::I64(x) if x >= 0 => Ok(x as u64),
        ref o => Err(GgufError::msg(format!(
            "key '{key}': {} {}, expected a non-negative integer",
            o.type_name(),
            short(o)
        ))),
    }
}

fn short(v: &MetaValue) -> String {
    match v {
        MetaValue::String(s) => format!("{s:?}"),
        MetaValue::Array(_, a) => format!("of {} values", a.len()),
        o => o.as_f64().map(|x| x.to_string()).unwrap_or_default(),
    }
}

impl DsparkMeta {
    /// Read and check the keys against the main model (`hp`).
    pub fn read(g: &GgufFile, hp: &HParams) -> Result<DsparkMeta, GgufError> {
        let (k, v) = find(g, "block_size")?;
        let block_size = unsigned(&k, v)? as usize;
        if !(1..=MAX_BLOCK_SIZE).contains(&block_size) {
            return Err(GgufError::msg(format!(
                "key '{k}': block size {block_size}, expected 1..={MAX_BLOCK_SIZE}"
            )));
        }
        let (k, v) = find(g, "markov_rank")?;
        let markov_rank = unsigned(&k, v)? as usize;
        if markov_rank == 0 || !markov_rank.is_multiple_of(32) {
            return Err(GgufError::msg(format!(
                "key '{k}': Markov rank {markov_rank}, expected a positive multiple of 32"
            )));
        }
        let (k, v) = find(g, "noise_token_id")?;
        let noise = unsigned(&k, v)?;
        if noise >= hp.n_vocab as u64 {
            return Err(GgufError::msg(format!(
                "key '{k}': noise token {noise} is outside the main model's vocabulary ({})",
                hp.n_vocab
            )));
        }
        let (k, v) = find(g, "target_layer_ids")?;
        let Some(arr) = v.as_array() else {
            return Err(GgufError::msg(format!(
                "key '{k}': {}, expected an array of layer indices",
                v.type_name()
            )));
        };
        if arr.is_empty() {
            return Err(GgufError::msg(format!("key '{k}': no target layer")));
        }
        let mut targets = Vec::new();
        for x in arr.iter().take(MAX_TARGETS) {
            let l = unsigned(&k, x)? as usize;
            if l >= hp.n_layer {
                return Err(GgufError::msg(format!(
                    "key '{k}': target layer {l} is out of range (the main model has {} layers)",
                    hp.n_layer
                )));
            }
            if targets.last().is_some_and(|&p| l <= p) {
                return Err(GgufError::msg(format!(
                    "key '{k}': target layers {:?} are not strictly increasing",
                    arr.iter().filter_map(|x| x.as_u64()).collect::<Vec<_>>()
                )));
            }
            targets.push(l);
        }
        Ok(DsparkMeta {
            block_size,
            markov_rank,
            noise_token: noise as u32,
            targets,
        })
    }
}

/// The dense matrices: F16, F32 or Q8_0, as ds4's loader accepts.
const DENSE: TypeRule = TypeRule::AnyOf(&[GgmlType::Q8_0, GgmlType::F16, GgmlType::F32]);
/// `hc_*_fn`: F16 or F32.
const HC_FN: TypeRule = TypeRule::AnyOf(&[GgmlType::F16, GgmlType::F32]);
/// The grouped output projection and the shared expert run on Q8_0 activations (ds4's proposer
/// requires Q8_0 there too).
const Q8: TypeRule = TypeRule::Exact(GgmlType::Q8_0);
const F32: TypeRule = TypeRule::Exact(GgmlType::F32);

/// The tensor table of a support file with `n_stages` stages for the main model `hp` and `meta`,
/// in the order ds4's later quantizer writes it (stage 0 block, stage 0 extras, the other blocks,
/// the last stage's extras).
pub fn tensor_plan(hp: &HParams, meta: &DsparkMeta, n_stages: usize) -> Vec<TensorSpec> {
    use WeightGroup as G;
    let (e, v, hc) = (hp.n_embd as u64, hp.n_vocab as u64, hp.n_hc as u64);
    let (hcd, mix) = (hp.hc_dim() as u64, hp.hc_mix() as u64);
    let (qr, d) = (hp.q_lora_rank as u64, hp.head_dim as u64);
    let (ff, ne) = (hp.n_ff_exp as u64, hp.n_expert as u64);
    let low = (hp.n_out_group * hp.o_lora_rank) as u64;
    let rank = meta.markov_rank as u64;
    let mut out = Vec::new();
    let mut push = |name: String, rule: TypeRule, dims: Vec<u64>, group: G, stage: usize| {
        out.push(TensorSpec::new(name, rule, dims, group, Some(stage)));
    };
    for s in 0..n_stages {
        let p = |x: &str| format!("mtp.{s}.{x}");
        push(p("hc_attn_base.weight"), F32, vec![mix], G::Other, s);
        push(p("hc_attn_fn.weight"), HC_FN, vec![hcd, mix], G::Other, s);
        push(p("hc_attn_scale.weight"), F32, vec![3], G::Other, s);
        push(p("attn_sinks.weight"), F32, vec![hp.n_head as u64], G::Other, s);
        push(p("attn_q_a.weight"), DENSE, vec![e, qr], G::Attention, s);
        push(p("attn_q_a_norm.weight"), F32, vec![qr], G::Other, s);
        push(
            p("attn_q_b.weight"),
            DENSE,
            vec![qr, hp.q_dim() as u64],
            G::Attention,
            s,
        );
        push(p("attn_kv.weight"), DENSE, vec![e, d], G::Attention, s);
        push(p("attn_kv_a_norm.weight"), F32, vec![d], G::Other, s);
        push(
            p("attn_output_a.weight"),
            Q8,
            vec![hp.group_dim() as u64, low],
            G::Attention,
            s,
        );
        push(p("attn_output_b.weight"), DENSE, vec![low, e], G::Attention, s);
        push(p("attn_norm.weight"), F32, vec![e], G::Other, s);
        push(p("hc_ffn_base.weight"), F32, vec![mix], G::Other, s);
        push(p("hc_ffn_fn.weight"), HC_FN, vec![hcd, mix], G::Other, s);
        push(p("hc_ffn_scale.weight"), F32, vec![3], G::Other, s);
        push(p("ffn_gate_inp.weight"), DENSE, vec![e, ne], G::Other, s);
        push(p("exp_probs_b.bias"), F32, vec![ne], G::Other, s);
        push(p("ffn_norm.weight"), F32, vec![e], G::Other, s);
        push(
            p("ffn_gate_exps.weight"),
            TypeRule::RoutedExpert,
            vec![e, ff, ne],
            G::RoutedExperts,
            s,
        );
        push(
            p("ffn_up_exps.weight"),
            TypeRule::RoutedExpert,
            vec![e, ff, ne],
            G::RoutedExperts,
            s,
        );
        push(
            p("ffn_down_exps.weight"),
            TypeRule::RoutedExpert,
            vec![ff, e, ne],
            G::RoutedExperts,
            s,
        );
        push(p("ffn_gate_shexp.weight"), Q8, vec![e, ff], G::SharedExpert, s);
        push(p("ffn_up_shexp.weight"), Q8, vec![e, ff], G::SharedExpert, s);
        push(p("ffn_down_shexp.weight"), Q8, vec![ff, e], G::SharedExpert, s);
        if s == 0 {
            let width = (meta.targets.len() * hp.n_embd) as u64;
            push(p("main_proj.weight"), DENSE, vec![width, e], G::Other, s);
            push(p("main_norm.weight"), F32, vec![e], G::Other, s);
        }
        if s + 1 == n_stages {
            push(p("norm.weight"), F32, vec![e], G::Other, s);
            push(p("hc_head_base.weight"), F32, vec![hc], G::Other, s);
            push(p("hc_head_fn.weight"), HC_FN, vec![hcd, hc], G::Other, s);
            push(p("hc_head_scale.weight"), F32, vec![1], G::Other, s);
            push(p("markov_head.markov_w1.weight"), DENSE, vec![rank, v], G::EmbedHead, s);
            push(p("markov_head.markov_w2.weight"), DENSE, vec![rank, v], G::EmbedHead, s);
            push(p("confidence_head.proj.weight"), DENSE, vec![e + rank, 1], G::Other, s);
        }
    }
    out
}

/// Stages named in the file: 1 + the largest N of an `mtp.N.` tensor (0 when none).
pub fn stage_count(g: &GgufFile) -> usize {
    g.tensors
        .iter()
        .filter_map(|t| t.name.strip_prefix("mtp.")?.split_once('.')?.0.parse::<usize>().ok())
        .map(|n| n + 1)
        .max()
        .unwrap_or(0)
}

/// One stage's tensors (by the suffix after `mtp.N.`).
#[derive(Clone, Debug)]
pub struct StageTensors {
    pub tensors: Vec<TensorInfo>,
}

impl StageTensors {
    /// The tensor of this stage named `suffix`; the plan guarantees it exists.
    pub fn get(&self, suffix: &str) -> &TensorInfo {
        self.tensors
            .iter()
            .find(|t| {
                t.name
                    .split_once('.')
                    .and_then(|(_, r)| r.split_once('.'))
                    .is_some_and(|(_, s)| s == suffix)
            })
            .unwrap_or_else(|| panic!("DSpark stage tensor {suffix} was validated at load"))
    }
}

/// A bound support file: the mapping, its metadata and every stage's tensors, checked against the
/// main model it drafts for.
pub struct DsparkModel {
    pub file: Arc<GgufFile>,
    pub meta: DsparkMeta,
    pub stages: Vec<StageTensors>,
}

impl std::fmt::Debug for DsparkModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DsparkModel")
            .field("file", &self.file.display_name())
            .field("meta", &self.meta)
            .field("stages", &self.stages.len())
            .finish()
    }
}

impl DsparkModel {
    /// Open and bind `path` for the main model `hp`; the error is one line naming the file.
    pub fn open(path: &Path, hp: &HParams) -> Result<DsparkModel, GgufError> {
        let file = GgufFile::open(path).map_err(|e| e.in_file(path))?;
        Self::bind(file, hp).map_err(|e| e.in_file(path))
    }

    /// Bind an already-parsed file.
    pub fn bind(file: Arc<GgufFile>, hp: &HParams) -> Result<DsparkModel, GgufError> {
        let g = &file;
        let n_stages = stage_count(g);
        if n_stages < MIN_STAGES {
            return Err(GgufError::msg(format!(
                "not a DSpark support file: {n_stages} mtp.N stages, expected at least {MIN_STAGES}"
            )));
        }
        let meta = DsparkMeta::read(g, hp)?;
        let plan = tensor_plan(hp, &meta, n_stages);
        check_plan(
            g,
            &plan,
            Some("from the main model's shapes: a support file for another model?"),
        )?;
        let stages = (0..n_stages)
            .map(|st| StageTensors {
                tensors: plan
                    .iter()
                    .filter(|s| s.layer == Some(st))
                    .filter_map(|s| g.tensor(&s.name).cloned())
                    .collect(),
            })
            .collect();
        Ok(DsparkModel {
            file: file.clone(),
            meta,
            stages,
        })
    }

    /// Bytes of every bound tensor.
    pub fn tensor_bytes(&self) -> u64 {
        self.stages
            .iter()
            .flat_map(|s| &s.tensors)
            .map(|t| t.ty.bytes_for(t.n_elements()).unwrap_or(0))
            .sum()
    }

    /// Bound tensors.
    pub fn n_tensors(&self) -> usize {
        self.stages.iter().map(|s| s.tensors.len()).sum()
    }

    /// One line for `inspect`, `doctor` and logs.
    pub fn summary(&self) -> String {
        format!(
            "DSpark support: {} stages, block {}, Markov rank {}, noise token {}, target layers {:?}, {} tensors, {}",
            self.stages.len(),
            self.meta.block_size,
            self.meta.markov_rank,
            self.meta.noise_token,
            self.meta.targets,
            self.n_tensors(),
            crate::units::fmt_gib(self.tensor_bytes(), 2)
        )
    }
}

/// Bytes a drafter session holds besides the support file's weights for the main model `hp` with
/// `meta` (docs/memory.md#dspark): the captured target rows (`capture_rows` rows of
/// targets × n_embd f32) and one context-KV row per window row and stage (head_dim f32).
pub fn session_bytes(hp: &HParams, meta: &DsparkMeta, n_stages: usize, capture_rows: usize, window: usize) -> u64 {
    let capture = capture_rows * meta.targets.len() * hp.n_embd * 4;
    let kv = window * n_stages * hp.head_dim * 4;
    (capture + kv) as u64
}

/// What one draft pass read, as the backend reports it (`DsparkForward::reads`): the input of
/// `pass_bytes`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PassReads {
    /// Distinct routed experts each stage used over the block's draft rows.
    pub experts: Vec<usize>,
    /// The LM head ran: the first row's confidence passed.
    pub lm_head: bool,
    /// Rows whose Markov bias was computed (one per drafted token).
    pub markov_rows: usize,
    /// Rows whose confidence was read.
    pub confidence_rows: usize,
}

/// Weight bytes one draft pass reads (docs/dspark.md#cost), by part.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PassBytes {
    /// Every stage's tensors but its routed experts (attention, router, shared expert, HC).
    pub dense: u64,
    /// The distinct routed experts the stages used, each once.
    pub experts: u64,
    /// `main_proj` and `main_norm`.
    pub main_proj: u64,
    /// The HC head, the final norm, `markov_w2` once per Markov row, the `markov_w1` rows and the
    /// confidence head once per confidence read.
    pub heads: u64,
    /// The main model's LM head, once for the block's rows, when the first confidence passed.
    pub lm_head: u64,
}

impl PassBytes {
    pub fn total(&self) -> u64 {
        self.dense + self.experts + self.main_proj + self.heads + self.lm_head
    }
}

/// The weight bytes a draft pass reads from the support file's tensor sizes (`stages`), the main
/// model's LM head (`lm_head_bytes`) and what the pass used (`reads`): every dense weight of every
/// stage once (the block's rows share each read), each distinct expert once, `main_proj` once,
/// `markov_w2` once per drafted row (each row's Markov state needs the token before it), the LM head
/// once for all rows (docs/dspark.md#cost).
pub fn pass_bytes(stages: &[StageTensors], lm_head_bytes: u64, reads: &PassReads) -> PassBytes {
    let size = |t: &TensorInfo| t.ty.bytes_for(t.n_elements()).unwrap_or(t.nbytes);
    let suffix = |t: &TensorInfo| t.name.splitn(3, '.').nth(2).unwrap_or("").to_string();
    let mut b = PassBytes::default();
    for (st, stage) in stages.iter().enumerate() {
        for t in &stage.tensors {
            let sfx = suffix(t);
            let n = size(t);
            if sfx.ends_with("_exps.weight") {
                let per_expert = n / t.dims.last().copied().unwrap_or(1).max(1);
                b.experts += per_expert * reads.experts.get(st).copied().unwrap_or(0) as u64;
            } else if sfx.starts_with("main_") {
                b.main_proj += n;
            } else if sfx == "markov_head.markov_w2.weight" {
                b.heads += n * reads.markov_rows as u64;
            } else if sfx == "markov_head.markov_w1.weight" {
                let row = t.ty.bytes_for(t.dims[0]).unwrap_or(0);
                b.heads += row * reads.confidence_rows.max(reads.markov_rows) as u64;
            } else if sfx == "confidence_head.proj.weight" {
                b.heads += n * reads.confidence_rows as u64;
            } else if sfx == "norm.weight" || sfx.starts_with("hc_head_") {
                b.heads += n;
            } else {
                b.dense += n;
            }
        }
    }
    if reads.lm_head {
        b.lm_head = lm_head_bytes;
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::layout::ExpertRole;

    fn flash_meta() -> DsparkMeta {
        DsparkMeta {
            block_size: 5,
            markov_rank: 256,
            noise_token: 128_799,
            targets: vec![40, 41, 42],
        }
    }

    #[test]
    fn flash_plan_is_ds4s_81_tensors_and_5_58_gib() {
        // ../shared: 24 tensors × 3 stages + 2 (stage 0) + 7 (last stage) = 81 tensors, 5,989,108,652
        // bytes with ds4's quantizer types (Q8_0 dense, IQ2_XXS gate/up, Q2_K down, F16 hc_*_fn).
        let hp = HParams::flash();
        let plan = tensor_plan(&hp, &flash_meta(), 3);
        assert_eq!(plan.len(), 81);
        let bytes: u64 = plan
            .iter()
            .map(|s| {
                let ty = match (s.rule, s.expert_role) {
                    (TypeRule::RoutedExpert, Some(ExpertRole::Down)) => GgmlType::Q2K,
                    (TypeRule::RoutedExpert, _) => GgmlType::Iq2Xxs,
                    (TypeRule::AnyOf(t), _) => t[0],
                    (TypeRule::Exact(t), _) => t,
                };
                let ty = if s.name.contains("hc_") && s.name.ends_with("_fn.weight") {
                    GgmlType::F16
                } else {
                    ty
                };
                ty.bytes_for(s.dims.iter().product()).unwrap()
            })
            .sum();
        assert_eq!(bytes, 5_989_108_652);
    }

    #[test]
    fn session_bytes_of_flash() {
        // 256 captured rows × 3 × 4096 f32 = 12 MiB; 128 window rows × 3 stages × 512 f32 = 768 KiB.
        let b = session_bytes(&HParams::flash(), &flash_meta(), 3, 256, 128);
        assert_eq!(b, 12 * (1 << 20) + 768 * 1024);
    }

    /// The Flash plan with ds4's quantizer types, bound as a file would be.
    fn flash_stages() -> Vec<StageTensors> {
        let plan = tensor_plan(&HParams::flash(), &flash_meta(), 3);
        (0..3)
            .map(|st| StageTensors {
                tensors: plan
                    .iter()
                    .filter(|s| s.layer == Some(st))
                    .map(|s| {
                        let ty = match (s.rule, s.expert_role) {
                            (TypeRule::RoutedExpert, Some(ExpertRole::Down)) => GgmlType::Q2K,
                            (TypeRule::RoutedExpert, _) => GgmlType::Iq2Xxs,
                            _ if s.name.contains(".hc_") && s.name.ends_with("_fn.weight") => GgmlType::F16,
                            (TypeRule::AnyOf(t), _) => t[0],
                            (TypeRule::Exact(t), _) => t,
                        };
                        let n: u64 = s.dims.iter().product();
                        TensorInfo {
                            name: s.name.clone(),
                            dims: s.dims.clone(),
                            ty,
                            offset: 0,
                            nbytes: ty.bytes_for(n).unwrap(),
                        }
                    })
                    .collect(),
            })
            .collect()
    }

    #[test]
    fn draft_pass_bytes_of_flash() {
        // By hand (Q8_0 34 B per 32, IQ2_XXS 66 B per 256, Q2_K 84 B per 256, F16 2 B, F32 4 B):
        // a stage's dense tensors: q_a 4,456,448 + q_b 35,651,584 + kv 2,228,224 + out_a and out_b
        // 2 × 35,651,584 + router 1,114,112 + shared expert 3 × 8,912,896 + hc fn 2 × 786,432 +
        // norms, sinks, bias, base, scale 40,408 = 143,105,496 B; one expert: gate and up
        // 2 × 2,162,688 + down 2,752,512 = 7,077,888 B; main_proj 53,477,376 + main_norm 16,384;
        // heads: norm 16,384 + hc head 131,092 + 5 × markov_w2 35,164,160 + 5 × (w1 row 272 +
        // confidence 4,624) = 175,992,756 B; the Q8_0 LM head 562,626,560 B.
        let stages = flash_stages();
        let lm_head = 562_626_560;
        let full = PassReads {
            experts: vec![28, 28, 28],
            lm_head: true,
            markov_rows: 5,
            confidence_rows: 5,
        };
        let b = pass_bytes(&stages, lm_head, &full);
        assert_eq!(
            b,
            PassBytes {
                dense: 3 * 143_105_496,
                experts: 3 * 28 * 7_077_888,
                main_proj: 53_493_760,
                heads: 175_992_756,
                lm_head,
            }
        );
        assert_eq!(b.total(), 1_815_972_156);
        // The first confidence fails: no LM head, no Markov row, one confidence read.
        let cut = PassReads {
            experts: vec![20, 25, 30],
            lm_head: false,
            markov_rows: 0,
            confidence_rows: 1,
        };
        let b = pass_bytes(&stages, lm_head, &cut);
        assert_eq!((b.experts, b.lm_head), (75 * 7_077_888, 0));
        assert_eq!(b.heads, 16_384 + 131_092 + 272 + 4_624);
        assert_eq!(b.dense + b.main_proj, 3 * 143_105_496 + 53_493_760);
    }
}
