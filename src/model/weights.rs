//! Binding of a GGUF file to the DS4 tensor layout: every tensor checked by name, type and shape
//! against `layout::tensor_plan` (docs/gguf.md#tensors), then exposed as typed per-layer views.
//!
//! Owns the validation and the `Model` handle (file + hyperparameters + bound tensors). Zero copy:
//! views are offsets into the mapping. Must not compute with the weights.

use std::path::Path;
use std::sync::Arc;

use crate::gguf::{GgmlType, GgufError, GgufFile, TensorInfo};

use super::hparams::HParams;
use super::layout::{WeightGroup, check_plan, tensor_plan};

/// A bound tensor: type, GGUF dims and its place in the file.
pub type TensorRef = TensorInfo;

/// Routed experts of one layer: `[in, out, n_expert]`, expert `e` is a contiguous `[in, out]` block.
#[derive(Clone, Debug)]
pub struct ExpertTensor {
    pub t: TensorRef,
}

impl ExpertTensor {
    pub fn ty(&self) -> GgmlType {
        self.t.ty
    }
    pub fn n_in(&self) -> usize {
        self.t.dims[0] as usize
    }
    pub fn n_out(&self) -> usize {
        self.t.dims[1] as usize
    }
    /// Bytes of one expert matrix (docs/model.md#tensor-conventions).
    pub fn expert_bytes(&self) -> usize {
        self.n_out() * self.ty().row_bytes(self.n_in())
    }
    /// Absolute file offset of expert `e`.
    pub fn expert_offset(&self, e: usize) -> u64 {
        self.t.offset + (e * self.expert_bytes()) as u64
    }
}

/// Compressor tensors of a compressed layer (attention or indexer).
#[derive(Clone, Debug)]
pub struct CompressorWeights {
    pub ape: TensorRef,
    pub kv: TensorRef,
    pub gate: TensorRef,
    pub norm: TensorRef,
}

#[derive(Clone, Debug)]
pub struct IndexerWeights {
    pub q_b: TensorRef,
    pub proj: TensorRef,
    pub compressor: CompressorWeights,
}

#[derive(Clone, Debug)]
pub struct LayerWeights {
    pub hc_attn_fn: TensorRef,
    pub hc_attn_scale: TensorRef,
    pub hc_attn_base: TensorRef,
    pub attn_norm: TensorRef,
    pub attn_q_a: TensorRef,
    pub attn_q_a_norm: TensorRef,
    pub attn_q_b: TensorRef,
    pub attn_kv: TensorRef,
    pub attn_kv_a_norm: TensorRef,
    pub attn_sinks: TensorRef,
    pub attn_output_a: TensorRef,
    pub attn_output_b: TensorRef,
    /// Present when the layer's compress ratio is not 0.
    pub compressor: Option<CompressorWeights>,
    /// Present on ratio-4 layers.
    pub indexer: Option<IndexerWeights>,
    pub hc_ffn_fn: TensorRef,
    pub hc_ffn_scale: TensorRef,
    pub hc_ffn_base: TensorRef,
    pub ffn_norm: TensorRef,
    pub ffn_gate_inp: TensorRef,
    pub exp_probs_b: Option<TensorRef>,
    pub ffn_gate_exps: ExpertTensor,
    pub ffn_up_exps: ExpertTensor,
    pub ffn_down_exps: ExpertTensor,
    pub ffn_gate_shexp: TensorRef,
    pub ffn_up_shexp: TensorRef,
    pub ffn_down_shexp: TensorRef,
    /// Hash layers only: `[K_e, V]` int32, row t = experts of token t.
    pub ffn_gate_tid2eid: Option<TensorRef>,
}

#[derive(Clone, Debug)]
pub struct Weights {
    pub token_embd: TensorRef,
    pub output_hc_base: TensorRef,
    pub output_hc_fn: TensorRef,
    pub output_hc_scale: TensorRef,
    pub output_norm: TensorRef,
    pub output: TensorRef,
    pub layers: Vec<LayerWeights>,
}

/// A loaded model: the mapped file, its hyperparameters and the bound tensors.
pub struct Model {
    pub file: Arc<GgufFile>,
    pub hp: HParams,
    pub w: Weights,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("file", &self.file)
            .field("hp", &self.hp)
            .finish()
    }
}

impl Model {
    /// Open, parse and bind a model file. Errors are one line naming the file.
    pub fn open(path: &Path) -> Result<Model, GgufError> {
        let file = GgufFile::open(path)?;
        Self::bind(file).map_err(|e| e.in_file(path))
    }

    /// Bind an already-parsed file.
    pub fn bind(file: Arc<GgufFile>) -> Result<Model, GgufError> {
        let hp = HParams::from_gguf(&file)?;
        let w = bind_weights(&file, &hp)?;
        Ok(Model { file, hp, w })
    }

    /// Zero-copy bytes of a bound tensor.
    pub fn data(&self, t: &TensorRef) -> &[u8] {
        self.file.tensor_data(t)
    }

    /// Every bound tensor with its weight group (inspect, residency).
    pub fn grouped_tensors(&self) -> Vec<(WeightGroup, &TensorRef)> {
        let plan = tensor_plan(&self.hp);
        plan.iter()
            .filter_map(|s| self.file.tensor(&s.name).map(|t| (s.group, t)))
            .collect()
    }
}

fn bind_weights(g: &GgufFile, hp: &HParams) -> Result<Weights, GgufError> {
    // Validate every planned tensor first: presence, type rule, shape.
    check_plan(g, &tensor_plan(hp), None)?;
    let get = |name: &str| -> TensorRef { g.tensor(name).cloned().expect("validated above") };
    let opt = |name: &str| -> Option<TensorRef> { g.tensor(name).cloned() };
    let mut layers = Vec::with_capacity(hp.n_layer);
    for l in 0..hp.n_layer {
        let n = |s: &str| format!("blk.{l}.{s}");
        // The attention's and the indexer's compressors: the same four tensors under two prefixes.
        let compressor_at = |prefix: &str| {
            let part = |s: &str| get(&n(&format!("{prefix}_compressor_{s}.weight")));
            CompressorWeights {
                ape: part("ape"),
                kv: part("kv"),
                gate: part("gate"),
                norm: part("norm"),
            }
        };
        let compressor = (hp.ratio(l) != 0).then(|| compressor_at("attn"));
        let indexer = hp.has_indexer(l).then(|| IndexerWeights {
            q_b: get(&n("indexer.attn_q_b.weight")),
            proj: get(&n("indexer.proj.weight")),
            compressor: compressor_at("indexer"),
        });
        layers.push(LayerWeights {
            hc_attn_fn: get(&n("hc_attn_fn.weight")),
            hc_attn_scale: get(&n("hc_attn_scale.weight")),
            hc_attn_base: get(&n("hc_attn_base.weight")),
            attn_norm: get(&n("attn_norm.weight")),
            attn_q_a: get(&n("attn_q_a.weight")),
            attn_q_a_norm: get(&n("attn_q_a_norm.weight")),
            attn_q_b: get(&n("attn_q_b.weight")),
            attn_kv: get(&n("attn_kv.weight")),
            attn_kv_a_norm: get(&n("attn_kv_a_norm.weight")),
            attn_sinks: get(&n("attn_sinks.weight")),
            attn_output_a: get(&n("attn_output_a.weight")),
            attn_output_b: get(&n("attn_output_b.weight")),
            compressor,
            indexer,
            hc_ffn_fn: get(&n("hc_ffn_fn.weight")),
            hc_ffn_scale: get(&n("hc_ffn_scale.weight")),
            hc_ffn_base: get(&n("hc_ffn_base.weight")),
            ffn_norm: get(&n("ffn_norm.weight")),
            ffn_gate_inp: get(&n("ffn_gate_inp.weight")),
            exp_probs_b: opt(&n("exp_probs_b.bias")),
            ffn_gate_exps: ExpertTensor {
                t: get(&n("ffn_gate_exps.weight")),
            },
            ffn_up_exps: ExpertTensor {
                t: get(&n("ffn_up_exps.weight")),
            },
            ffn_down_exps: ExpertTensor {
                t: get(&n("ffn_down_exps.weight")),
            },
            ffn_gate_shexp: get(&n("ffn_gate_shexp.weight")),
            ffn_up_shexp: get(&n("ffn_up_shexp.weight")),
            ffn_down_shexp: get(&n("ffn_down_shexp.weight")),
            ffn_gate_tid2eid: if hp.is_hash_layer(l) {
                Some(get(&n("ffn_gate_tid2eid.weight")))
            } else {
                None
            },
        });
    }
    Ok(Weights {
        token_embd: get("token_embd.weight"),
        output_hc_base: get("output_hc_base.weight"),
        output_hc_fn: get("output_hc_fn.weight"),
        output_hc_scale: get("output_hc_scale.weight"),
        output_norm: get("output_norm.weight"),
        output: get("output.weight"),
        layers,
    })
}
