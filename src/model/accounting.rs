//! Byte accounting of a DS4 model (docs/model.md#memory-figures): bytes by element type and weight group,
//! weight bytes read per decoded token (docs/model.md#weight-bytes-per-token) and KV-cache bytes per context
//! token (docs/model.md#kv-bytes-per-token).
//!
//! Owns the arithmetic only. It works on a `TensorBytes` table, built either from a bound `Model`
//! (each layer by its own types, so mixed files are right) or from the layout plan (no file needed,
//! e.g. for the 81 GiB Flash shape). `inspect`, the bench and the TUI share it.

use crate::gguf::GgmlType;

use super::hparams::HParams;
use super::layout::WeightGroup;
use super::weights::Model;

/// One tensor as the accounting sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorBytes {
    pub name: String,
    pub ty: GgmlType,
    pub dims: Vec<u64>,
    pub nbytes: u64,
    pub group: WeightGroup,
}

/// The table of a bound model (every planned tensor the file holds).
pub fn table_from_model(m: &Model) -> Vec<TensorBytes> {
    m.grouped_tensors()
        .into_iter()
        .map(|(group, t)| TensorBytes {
            name: t.name.clone(),
            ty: t.ty,
            dims: t.dims.clone(),
            nbytes: t.nbytes,
            group,
        })
        .collect()
}

/// Weight bytes read to decode one token, by component (docs/model.md#weight-bytes-per-token rows).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct PerTokenBytes {
    /// n_expert_used × (gate + up + down) expert matrices per layer.
    pub routed_experts: u64,
    pub shared_expert: u64,
    /// q_a, q_b, kv, output_a, output_b.
    pub attention_projections: u64,
    /// Attention KV compressors (ape, kv, gate, norm).
    pub compressors: u64,
    /// Indexer q_b, proj and its compressor.
    pub indexer: u64,
    /// HC control (fn, scale, base) of every sublayer plus the output HC.
    pub hc_control: u64,
    /// Router (ffn_gate_inp, exp_probs_b) and one tid2eid row on hash layers.
    pub router: u64,
    pub lm_head: u64,
    /// One row of token_embd.
    pub embedding_row: u64,
    /// RMSNorm weights and attention sinks.
    pub norms_and_sinks: u64,
}

impl PerTokenBytes {
    pub fn total(&self) -> u64 {
        self.routed_experts
            + self.shared_expert
            + self.attention_projections
            + self.compressors
            + self.indexer
            + self.hc_control
            + self.router
            + self.lm_head
            + self.embedding_row
            + self.norms_and_sinks
    }

    /// (label, bytes) rows for display.
    pub fn rows(&self) -> [(&'static str, u64); 10] {
        [
            ("routed experts", self.routed_experts),
            ("shared expert", self.shared_expert),
            ("attention projections", self.attention_projections),
            ("compressors", self.compressors),
            ("indexer", self.indexer),
            ("HC control", self.hc_control),
            ("router", self.router),
            ("LM head", self.lm_head),
            ("embedding row", self.embedding_row),
            ("norms and sinks", self.norms_and_sinks),
        ]
    }
}

/// Bytes read per decoded token: every tensor a decode step touches, routed experts counted
/// `n_expert_used` times one expert's share, the embedding as one row.
pub fn weight_bytes_per_token(hp: &HParams, table: &[TensorBytes]) -> PerTokenBytes {
    let mut p = PerTokenBytes::default();
    for t in table {
        let base = t.name.rsplit('.').nth(1).unwrap_or("");
        let n = &t.name;
        if base.ends_with("_exps") {
            let n_exp = t.dims.get(2).copied().unwrap_or(1).max(1);
            p.routed_experts += t.nbytes / n_exp * hp.n_expert_used as u64;
        } else if base.ends_with("_shexp") {
            p.shared_expert += t.nbytes;
        } else if matches!(
            base,
            "attn_q_a" | "attn_q_b" | "attn_kv" | "attn_output_a" | "attn_output_b"
        ) && !n.contains("indexer")
        {
            p.attention_projections += t.nbytes;
        } else if base.starts_with("attn_compressor_") {
            p.compressors += t.nbytes;
        } else if n.contains(".indexer.") || base.starts_with("indexer_compressor_") {
            p.indexer += t.nbytes;
        } else if base.starts_with("hc_") || base.starts_with("output_hc_") {
            p.hc_control += t.nbytes;
        } else if base == "ffn_gate_inp" || base == "exp_probs_b" {
            p.router += t.nbytes;
        } else if base == "ffn_gate_tid2eid" {
            p.router += t.ty.bytes_for(t.dims[0]).unwrap_or(0);
        } else if n == "output.weight" {
            p.lm_head += t.nbytes;
        } else if n == "token_embd.weight" {
            p.embedding_row += t.nbytes / t.dims.get(1).copied().unwrap_or(1).max(1);
        } else {
            p.norms_and_sinks += t.nbytes;
        }
    }
    p
}

/// Growth of the compressed caches per token of context (docs/model.md#kv-bytes-per-token): a ratio-r layer
/// stores one f32 row of `head_dim` every r tokens, plus an indexer row of `idx_head_dim` on ratio-4 layers.
/// Flash: 21 × 640 B + 20 × 16 B = 13,760 B.
pub fn kv_bytes_per_context_token(hp: &HParams) -> f64 {
    (0..hp.n_layer)
        .filter(|&l| hp.ratio(l) != 0)
        .map(|l| {
            let width = hp.head_dim + if hp.has_indexer(l) { hp.idx_head_dim } else { 0 };
            (width * 4) as f64 / hp.ratio(l) as f64
        })
        .sum()
}

/// The complete accounting of a model.
#[derive(Clone, Debug, PartialEq)]
pub struct Accounting {
    pub n_tensors: usize,
    pub tensor_bytes: u64,
    /// Bytes per element type, in `GgmlType::ALL` order, types present only.
    pub by_type: Vec<(GgmlType, u64)>,
    /// Bytes per weight group, in `WeightGroup::ALL` order.
    pub by_group: Vec<(WeightGroup, u64)>,
    pub per_token: PerTokenBytes,
    pub kv_bytes_per_context_token: f64,
}

pub fn account(hp: &HParams, table: &[TensorBytes]) -> Accounting {
    let by_type = GgmlType::ALL
        .iter()
        .map(|&ty| (ty, table.iter().filter(|t| t.ty == ty).map(|t| t.nbytes).sum()))
        .filter(|&(_, b)| b > 0)
        .collect();
    let by_group = WeightGroup::ALL
        .iter()
        .map(|&g| (g, table.iter().filter(|t| t.group == g).map(|t| t.nbytes).sum()))
        .collect();
    Accounting {
        n_tensors: table.len(),
        tensor_bytes: table.iter().map(|t| t.nbytes).sum(),
        by_type,
        by_group,
        per_token: weight_bytes_per_token(hp, table),
        kv_bytes_per_context_token: kv_bytes_per_context_token(hp),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::layout::{ExpertTypes, concrete_type, tensor_plan};

    /// The table of the layout plan with per-layer expert types, `exp_probs_b` on non-hash layers only
    /// (as the shipped files, docs/model.md#file-sizes).
    pub fn table_from_plan(hp: &HParams, experts: impl Fn(usize) -> ExpertTypes) -> Vec<TensorBytes> {
        tensor_plan(hp)
            .into_iter()
            .filter(|s| !(s.optional && s.layer.is_some_and(|l| hp.is_hash_layer(l))))
            .map(|s| {
                let ty = concrete_type(&s, experts(s.layer.unwrap_or(0)));
                let n: u64 = s.dims.iter().product();
                TensorBytes {
                    nbytes: ty.bytes_for(n).unwrap_or(u64::MAX),
                    name: s.name,
                    ty,
                    dims: s.dims,
                    group: s.group,
                }
            })
            .collect()
    }

    fn flash(ex: ExpertTypes) -> Accounting {
        let hp = HParams::flash();
        account(&hp, &table_from_plan(&hp, |_| ex))
    }

    #[test]
    fn flash_per_token_bytes_match_the_documented_figures() {
        // docs/model.md#weight-bytes-per-token rows (GB = 1e9 B) and totals 9.56 GB (q2) / 11.38 GB (q4),
        // rounded to the shown digits, so each check allows half a unit of the last digit.
        let q2 = flash(ExpertTypes::Q2);
        let q4 = flash(ExpertTypes::Q4);
        let gb = |b: u64| b as f64 / 1e9;
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        // That table leaves out RMSNorm weights and sinks (≈1.8 MB); compare without them and
        // check they are that small.
        let spec_rows = |a: &Accounting| gb(a.per_token.total() - a.per_token.norms_and_sinks);
        assert!((spec_rows(&q2) - 9.56).abs() <= 0.005, "{}", spec_rows(&q2));
        assert!((spec_rows(&q4) - 11.38).abs() <= 0.005, "{}", spec_rows(&q4));
        assert!(q2.per_token.norms_and_sinks < 2_000_000);
        let p = &q2.per_token;
        assert!((mib(p.routed_experts) - 1741.0).abs() <= 0.5);
        assert!((mib(q4.per_token.routed_experts) - 3483.0).abs() <= 0.5);
        assert!((mib(p.shared_expert) - 1097.0).abs() <= 0.5);
        assert!((mib(p.attention_projections) - 4660.0).abs() <= 0.5);
        assert!((mib(p.compressors) - 499.0).abs() <= 0.5);
        assert!((mib(p.indexer) - 431.0).abs() <= 0.5);
        assert!((gb(p.hc_control) - 0.068).abs() <= 0.0005);
        assert!((gb(p.router) - 0.090).abs() <= 0.0005);
        assert!((mib(p.lm_head) - 537.0).abs() <= 0.5);
        assert_eq!(p.embedding_row, 8192);
        // Per-expert matrix triple (docs/model.md#file-sizes): 7,077,888 B q2, 14,155,776 B q4; × 6 × 43
        // layers.
        assert_eq!(p.routed_experts, 7_077_888 * 6 * 43);
        assert_eq!(q4.per_token.routed_experts, 14_155_776 * 6 * 43);
    }

    #[test]
    fn flash_kv_and_totals_match_the_documented_figures() {
        let hp = HParams::flash();
        assert_eq!(kv_bytes_per_context_token(&hp), 13_760.0);
        let q2 = flash(ExpertTypes::Q2);
        assert_eq!(q2.n_tensors, 1328);
        assert_eq!(q2.tensor_bytes, 86_714_775_900);
        assert_eq!(q2.by_group.iter().map(|g| g.1).sum::<u64>(), q2.tensor_bytes);
        assert_eq!(q2.by_type.iter().map(|g| g.1).sum::<u64>(), q2.tensor_bytes);
        // Routed experts: 43 layers × (2 × 553,648,128 IQ2_XXS + 704,643,072 Q2_K).
        let routed = q2
            .by_group
            .iter()
            .find(|g| g.0 == WeightGroup::RoutedExperts)
            .unwrap()
            .1;
        assert_eq!(routed, 43 * (2 * 553_648_128 + 704_643_072));
        let q2k = q2.by_type.iter().find(|g| g.0 == GgmlType::Q2K).unwrap().1;
        assert_eq!(q2k, 43 * 704_643_072);
    }
}
