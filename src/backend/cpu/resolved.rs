//! The model as the CPU engine reads it: every matrix as a `Mat` (a location in the mapped file) and
//! the small F32/F16 vectors (norms, sinks, biases, HC scales, compressor `ape`) copied out as f32 once.
//!
//! Owns the translation from the bound tensors (`model::weights`) to compute views; no math.

use crate::gguf::half::f16_to_f32;
use crate::gguf::{GgmlType, GgufFile};
use crate::model::weights::{CompressorWeights, ExpertTensor, Model, TensorRef};

use super::matvec::Mat;

/// Element values of a small F32 / F16 / I32 tensor as f32 (I32 is kept as raw i32 by `ints`).
pub fn floats(model: &Model, t: &TensorRef) -> Vec<f32> {
    floats_in(&model.file, t)
}

/// `floats` of a tensor of any mapped file (the DSpark support file's vectors).
pub fn floats_in(file: &GgufFile, t: &TensorRef) -> Vec<f32> {
    let b = file.tensor_data(t);
    match t.ty {
        GgmlType::F32 => b
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        GgmlType::F16 => b
            .chunks_exact(2)
            .map(|c| f16_to_f32(u16::from_le_bytes([c[0], c[1]])))
            .collect(),
        other => panic!("tensor {}: {other} is not a float vector type", t.name),
    }
}

pub fn ints(model: &Model, t: &TensorRef) -> Vec<i32> {
    model
        .data(t)
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

pub struct HcW {
    pub fn_: Mat,
    pub scale: Vec<f32>,
    pub base: Vec<f32>,
}

pub struct CompW {
    pub kv: Mat,
    pub gate: Mat,
    /// `[coff·hd, ratio]`: row `slot` is contiguous.
    pub ape: Vec<f32>,
    pub norm: Vec<f32>,
}

impl HcW {
    fn new(m: &Model, fn_: &TensorRef, scale: &TensorRef, base: &TensorRef) -> HcW {
        HcW {
            fn_: Mat::new(fn_),
            scale: floats(m, scale),
            base: floats(m, base),
        }
    }
}

impl CompW {
    fn new(m: &Model, c: &CompressorWeights) -> CompW {
        CompW {
            kv: Mat::new(&c.kv),
            gate: Mat::new(&c.gate),
            ape: floats(m, &c.ape),
            norm: floats(m, &c.norm),
        }
    }
}

pub struct IndexerW {
    pub q_b: Mat,
    pub proj: Mat,
    pub comp: CompW,
}

pub struct LayerW {
    pub hc_attn: HcW,
    pub attn_norm: Vec<f32>,
    pub q_a: Mat,
    pub q_a_norm: Vec<f32>,
    pub q_b: Mat,
    pub kv: Mat,
    pub kv_norm: Vec<f32>,
    pub sinks: Vec<f32>,
    pub out_a: Mat,
    pub out_b: Mat,
    pub comp: Option<CompW>,
    pub indexer: Option<IndexerW>,
    pub hc_ffn: HcW,
    pub ffn_norm: Vec<f32>,
    pub router: Mat,
    pub router_bias: Option<Vec<f32>>,
    pub gate_exps: ExpertTensor,
    pub up_exps: ExpertTensor,
    pub down_exps: ExpertTensor,
    pub gate_sh: Mat,
    pub up_sh: Mat,
    pub down_sh: Mat,
    /// Hash layers: `[K_e, V]`, row t = the experts of token t.
    pub tid2eid: Option<Vec<i32>>,
    pub clamp: f32,
}

pub struct HeadW {
    pub embd: Mat,
    pub hc_fn: Mat,
    pub hc_base: Vec<f32>,
    pub hc_scale: Vec<f32>,
    pub norm: Vec<f32>,
    pub output: Mat,
}

pub struct Resolved {
    pub layers: Vec<LayerW>,
    pub head: HeadW,
}

impl Resolved {
    pub fn new(m: &Model) -> Resolved {
        let layers =
            m.w.layers
                .iter()
                .enumerate()
                .map(|(l, lw)| LayerW {
                    hc_attn: HcW::new(m, &lw.hc_attn_fn, &lw.hc_attn_scale, &lw.hc_attn_base),
                    attn_norm: floats(m, &lw.attn_norm),
                    q_a: Mat::new(&lw.attn_q_a),
                    q_a_norm: floats(m, &lw.attn_q_a_norm),
                    q_b: Mat::new(&lw.attn_q_b),
                    kv: Mat::new(&lw.attn_kv),
                    kv_norm: floats(m, &lw.attn_kv_a_norm),
                    sinks: floats(m, &lw.attn_sinks),
                    out_a: Mat::new(&lw.attn_output_a),
                    out_b: Mat::new(&lw.attn_output_b),
                    comp: lw.compressor.as_ref().map(|c| CompW::new(m, c)),
                    indexer: lw.indexer.as_ref().map(|i| IndexerW {
                        q_b: Mat::new(&i.q_b),
                        proj: Mat::new(&i.proj),
                        comp: CompW::new(m, &i.compressor),
                    }),
                    hc_ffn: HcW::new(m, &lw.hc_ffn_fn, &lw.hc_ffn_scale, &lw.hc_ffn_base),
                    ffn_norm: floats(m, &lw.ffn_norm),
                    router: Mat::new(&lw.ffn_gate_inp),
                    router_bias: lw.exp_probs_b.as_ref().map(|t| floats(m, t)),
                    gate_exps: lw.ffn_gate_exps.clone(),
                    up_exps: lw.ffn_up_exps.clone(),
                    down_exps: lw.ffn_down_exps.clone(),
                    gate_sh: Mat::new(&lw.ffn_gate_shexp),
                    up_sh: Mat::new(&lw.ffn_up_shexp),
                    down_sh: Mat::new(&lw.ffn_down_shexp),
                    tid2eid: lw.ffn_gate_tid2eid.as_ref().map(|t| ints(m, t)),
                    clamp: m.hp.swiglu_clamp[l],
                })
                .collect();
        let w = &m.w;
        Resolved {
            layers,
            head: HeadW {
                embd: Mat::new(&w.token_embd),
                hc_fn: Mat::new(&w.output_hc_fn),
                hc_base: floats(m, &w.output_hc_base),
                hc_scale: floats(m, &w.output_hc_scale),
                norm: floats(m, &w.output_norm),
                output: Mat::new(&w.output),
            },
        }
    }
}
