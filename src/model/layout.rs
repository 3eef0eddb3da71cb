//! The DS4 tensor inventory: every tensor's name, type rule, shape formula and weight group
//! (docs/gguf.md#tensors), as one table that the loader validates against and the synthetic-model writer emits.
//!
//! Owns names and shape formulas only; binding to file offsets is `weights.rs`.

use crate::gguf::{GgmlType, GgufError, GgufFile};

use super::hparams::HParams;

/// What type a tensor must have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TypeRule {
    Exact(GgmlType),
    /// A routed expert tensor: IQ2_XXS, Q2_K or Q4_K (gate and up of a layer share one type).
    RoutedExpert,
    /// Any of these types (the DSpark support file's dense matrices, `model::dspark`).
    AnyOf(&'static [GgmlType]),
}

impl TypeRule {
    pub fn accepts(self, t: GgmlType) -> bool {
        match self {
            TypeRule::Exact(e) => e == t,
            TypeRule::RoutedExpert => matches!(t, GgmlType::Iq2Xxs | GgmlType::Q2K | GgmlType::Q4K),
            TypeRule::AnyOf(ts) => ts.contains(&t),
        }
    }
    pub fn describe(self) -> String {
        match self {
            TypeRule::Exact(e) => e.name().to_string(),
            TypeRule::RoutedExpert => "IQ2_XXS, Q2_K or Q4_K".to_string(),
            TypeRule::AnyOf(ts) => ts.iter().map(|t| t.name()).collect::<Vec<_>>().join(", "),
        }
    }
}

/// Weight groups for byte accounting (inspect) and residency (mincore) reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WeightGroup {
    RoutedExperts,
    Attention,
    SharedExpert,
    EmbedHead,
    Other,
}

impl WeightGroup {
    pub const ALL: [WeightGroup; 5] = [
        WeightGroup::RoutedExperts,
        WeightGroup::Attention,
        WeightGroup::SharedExpert,
        WeightGroup::EmbedHead,
        WeightGroup::Other,
    ];
    pub fn name(self) -> &'static str {
        match self {
            WeightGroup::RoutedExperts => "routed experts",
            WeightGroup::Attention => "attention",
            WeightGroup::SharedExpert => "shared expert",
            WeightGroup::EmbedHead => "embedding+head",
            WeightGroup::Other => "other",
        }
    }
}

/// Which routed-expert tensor (for the type rule that gate and up share a type).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpertRole {
    Gate,
    Up,
    Down,
}

impl ExpertRole {
    /// The role of the routed-expert tensor `name` (`…ffn_{gate,up,down}_exps.weight`), if it is one.
    pub fn of_name(name: &str) -> Option<ExpertRole> {
        if name.ends_with("ffn_gate_exps.weight") {
            Some(ExpertRole::Gate)
        } else if name.ends_with("ffn_up_exps.weight") {
            Some(ExpertRole::Up)
        } else if name.ends_with("ffn_down_exps.weight") {
            Some(ExpertRole::Down)
        } else {
            None
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct TensorSpec {
    pub name: String,
    pub rule: TypeRule,
    /// GGUF order (dim 0 contiguous).
    pub dims: Vec<u64>,
    pub optional: bool,
    pub group: WeightGroup,
    /// Layer index, `None` for global tensors.
    pub layer: Option<usize>,
    pub expert_role: Option<ExpertRole>,
}

impl TensorSpec {
    /// A required tensor; its expert role follows from its name (`ExpertRole::of_name`).
    pub fn new(name: String, rule: TypeRule, dims: Vec<u64>, group: WeightGroup, layer: Option<usize>) -> TensorSpec {
        TensorSpec {
            expert_role: ExpertRole::of_name(&name),
            name,
            rule,
            dims,
            optional: false,
            group,
            layer,
        }
    }
}

/// Expert quant types of one layer as written by the synthetic-model writer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpertTypes {
    pub gate_up: GgmlType,
    pub down: GgmlType,
}

impl ExpertTypes {
    /// The shipped q2 file: IQ2_XXS gate/up, Q2_K down.
    pub const Q2: ExpertTypes = ExpertTypes {
        gate_up: GgmlType::Iq2Xxs,
        down: GgmlType::Q2K,
    };
    /// The shipped q4 file: Q4_K everywhere.
    pub const Q4: ExpertTypes = ExpertTypes {
        gate_up: GgmlType::Q4K,
        down: GgmlType::Q4K,
    };
}

/// The full tensor table for `hp`, in the order the shipped files store them (globals first, then
/// layer by layer). `exp_probs_b` is listed on non-hash layers as optional.
pub fn tensor_plan(hp: &HParams) -> Vec<TensorSpec> {
    use GgmlType::*;
    use WeightGroup as G;
    let (e, v, hc) = (hp.n_embd as u64, hp.n_vocab as u64, hp.n_hc as u64);
    let hc_dim = hp.hc_dim() as u64;
    let mix = hp.hc_mix() as u64;
    let qr = hp.q_lora_rank as u64;
    let d = hp.head_dim as u64;
    let mut out = Vec::new();
    let mut push = |name: String, rule: TypeRule, dims: Vec<u64>, group: G, layer: Option<usize>| {
        out.push(TensorSpec::new(name, rule, dims, group, layer));
    };
    let x = TypeRule::Exact;
    push("token_embd.weight".into(), x(F16), vec![e, v], G::EmbedHead, None);
    push("output_hc_base.weight".into(), x(F32), vec![hc], G::Other, None);
    push("output_hc_fn.weight".into(), x(F16), vec![hc_dim, hc], G::Other, None);
    push("output_hc_scale.weight".into(), x(F32), vec![1], G::Other, None);
    push("output_norm.weight".into(), x(F32), vec![e], G::Other, None);
    push("output.weight".into(), x(Q8_0), vec![e, v], G::EmbedHead, None);
    for l in 0..hp.n_layer {
        let p = |s: &str| format!("blk.{l}.{s}");
        let ly = Some(l);
        let ratio = hp.ratio(l) as u64;
        push(p("hc_attn_fn.weight"), x(F16), vec![hc_dim, mix], G::Other, ly);
        push(p("hc_attn_scale.weight"), x(F32), vec![3], G::Other, ly);
        push(p("hc_attn_base.weight"), x(F32), vec![mix], G::Other, ly);
        push(p("attn_norm.weight"), x(F32), vec![e], G::Other, ly);
        push(p("attn_q_a.weight"), x(Q8_0), vec![e, qr], G::Attention, ly);
        push(p("attn_q_a_norm.weight"), x(F32), vec![qr], G::Other, ly);
        push(
            p("attn_q_b.weight"),
            x(Q8_0),
            vec![qr, hp.q_dim() as u64],
            G::Attention,
            ly,
        );
        push(p("attn_kv.weight"), x(Q8_0), vec![e, d], G::Attention, ly);
        push(p("attn_kv_a_norm.weight"), x(F32), vec![d], G::Other, ly);
        push(p("attn_sinks.weight"), x(F32), vec![hp.n_head as u64], G::Other, ly);
        push(
            p("attn_output_a.weight"),
            x(Q8_0),
            vec![hp.group_dim() as u64, (hp.n_out_group * hp.o_lora_rank) as u64],
            G::Attention,
            ly,
        );
        push(
            p("attn_output_b.weight"),
            x(Q8_0),
            vec![(hp.n_out_group * hp.o_lora_rank) as u64, e],
            G::Attention,
            ly,
        );
        if ratio != 0 {
            let cw = hp.compress_overlap(l) as u64 * d;
            push(
                p("attn_compressor_ape.weight"),
                x(F16),
                vec![cw, ratio],
                G::Attention,
                ly,
            );
            push(p("attn_compressor_kv.weight"), x(F16), vec![e, cw], G::Attention, ly);
            push(p("attn_compressor_gate.weight"), x(F16), vec![e, cw], G::Attention, ly);
            push(p("attn_compressor_norm.weight"), x(F32), vec![d], G::Other, ly);
        }
        if hp.has_indexer(l) {
            let di = hp.idx_head_dim as u64;
            push(
                p("indexer.attn_q_b.weight"),
                x(F16),
                vec![qr, hp.idx_n_head as u64 * di],
                G::Attention,
                ly,
            );
            push(
                p("indexer.proj.weight"),
                x(F16),
                vec![e, hp.idx_n_head as u64],
                G::Attention,
                ly,
            );
            push(
                p("indexer_compressor_ape.weight"),
                x(F16),
                vec![2 * di, ratio],
                G::Attention,
                ly,
            );
            push(
                p("indexer_compressor_kv.weight"),
                x(F16),
                vec![e, 2 * di],
                G::Attention,
                ly,
            );
            push(
                p("indexer_compressor_gate.weight"),
                x(F16),
                vec![e, 2 * di],
                G::Attention,
                ly,
            );
            push(p("indexer_compressor_norm.weight"), x(F32), vec![di], G::Other, ly);
        }
        push(p("hc_ffn_fn.weight"), x(F16), vec![hc_dim, mix], G::Other, ly);
        push(p("hc_ffn_scale.weight"), x(F32), vec![3], G::Other, ly);
        push(p("hc_ffn_base.weight"), x(F32), vec![mix], G::Other, ly);
        push(p("ffn_norm.weight"), x(F32), vec![e], G::Other, ly);
        push(
            p("ffn_gate_inp.weight"),
            x(F16),
            vec![e, hp.n_expert as u64],
            G::Other,
            ly,
        );
        let (ff, ne) = (hp.n_ff_exp as u64, hp.n_expert as u64);
        push(
            p("ffn_gate_exps.weight"),
            TypeRule::RoutedExpert,
            vec![e, ff, ne],
            G::RoutedExperts,
            ly,
        );
        push(
            p("ffn_up_exps.weight"),
            TypeRule::RoutedExpert,
            vec![e, ff, ne],
            G::RoutedExperts,
            ly,
        );
        push(
            p("ffn_down_exps.weight"),
            TypeRule::RoutedExpert,
            vec![ff, e, ne],
            G::RoutedExperts,
            ly,
        );
        push(p("ffn_gate_shexp.weight"), x(Q8_0), vec![e, ff], G::SharedExpert, ly);
        push(p("ffn_up_shexp.weight"), x(Q8_0), vec![e, ff], G::SharedExpert, ly);
        push(p("ffn_down_shexp.weight"), x(Q8_0), vec![ff, e], G::SharedExpert, ly);
        if hp.is_hash_layer(l) {
            push(
                p("ffn_gate_tid2eid.weight"),
                x(I32),
                vec![hp.n_expert_used as u64, v],
                G::Other,
                ly,
            );
        }
        push(p("exp_probs_b.bias"), x(F32), vec![hp.n_expert as u64], G::Other, ly);
    }
    for s in &mut out {
        if s.name.ends_with("exp_probs_b.bias") {
            s.optional = true;
        }
    }
    out
}

/// Checks every tensor of `plan` in `g`: present (unless optional), of a type its rule accepts, of
/// its planned shape, and a routed expert's up of its gate's type. The errors name the tensor; a
/// shape error ends with `shape_hint` where one is given (what a wrong shape most likely means).
pub fn check_plan(g: &GgufFile, plan: &[TensorSpec], shape_hint: Option<&str>) -> Result<(), GgufError> {
    for s in plan {
        let Some(t) = g.tensor(&s.name) else {
            if s.optional {
                continue;
            }
            return Err(GgufError::msg(format!(
                "missing tensor '{}' (expected {} {:?})",
                s.name,
                s.rule.describe(),
                s.dims
            )));
        };
        if !s.rule.accepts(t.ty) {
            return Err(GgufError::at(
                t.offset,
                format!("tensor '{}': type {}, expected {}", s.name, t.ty, s.rule.describe()),
            ));
        }
        if t.dims != s.dims {
            let hint = shape_hint.map(|h| format!(" ({h})")).unwrap_or_default();
            return Err(GgufError::at(
                t.offset,
                format!(
                    "tensor '{}': shape {}, expected {:?}{hint}",
                    s.name,
                    t.shape_string(),
                    s.dims
                ),
            ));
        }
        if s.rule == TypeRule::RoutedExpert && s.expert_role == Some(ExpertRole::Up) {
            let gate_name = s.name.replace("ffn_up_exps", "ffn_gate_exps");
            if let Some(gt) = g.tensor(&gate_name)
                && gt.ty != t.ty
            {
                return Err(GgufError::at(
                    t.offset,
                    format!(
                        "tensor '{}': type {}, expected {} (gate and up must share a type)",
                        s.name, t.ty, gt.ty
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// Concrete type of a planned tensor for a writer, given the layer's expert types.
pub fn concrete_type(spec: &TensorSpec, experts: ExpertTypes) -> GgmlType {
    match (spec.rule, spec.expert_role) {
        (TypeRule::Exact(t), _) => t,
        (TypeRule::RoutedExpert, Some(ExpertRole::Down)) => experts.down,
        (TypeRule::RoutedExpert, _) => experts.gate_up,
        (TypeRule::AnyOf(ts), _) => ts[0],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan_bytes(hp: &HParams, ex: ExpertTypes, with_bias_on_hash: bool) -> u64 {
        tensor_plan(hp)
            .iter()
            .filter(|s| !(s.optional && s.layer.is_some_and(|l| hp.is_hash_layer(l)) && !with_bias_on_hash))
            .map(|s| concrete_type(s, ex).bytes_for(s.dims.iter().product()).unwrap())
            .sum()
    }

    #[test]
    fn flash_file_sizes_match_the_shipped_files() {
        let hp = HParams::flash();
        // docs/model.md#file-sizes: q2 80.76 GiB, q4 153.32 GiB with exp_probs_b on layers 3..42.
        let q2 = plan_bytes(&hp, ExpertTypes::Q2, false) as f64 / (1u64 << 30) as f64;
        let q4 = plan_bytes(&hp, ExpertTypes::Q4, false) as f64 / (1u64 << 30) as f64;
        assert!((q2 - 80.76).abs() < 0.005, "q2 {q2}");
        assert!((q4 - 153.32).abs() < 0.005, "q4 {q4}");
    }
}
