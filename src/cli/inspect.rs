//! `ds4-chat inspect FILE [--json]`: validate a model file (parse + bind) and print its
//! architecture, hyperparameters and byte accounting (docs/model.md#memory-figures,
//! `model::accounting`).

use std::path::PathBuf;

use serde_json::json;

use super::CliResult;
use crate::model::Model;
use crate::model::accounting::{Accounting, account, table_from_model};
use crate::model::checkpoint::{Generation, describe_file};
use crate::model::dspark::DsparkModel;
use crate::units::fmt_gib;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The GGUF model file.
    pub file: PathBuf,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// A DSpark support file to check against the model (docs/dspark.md#support-file) [default:
    /// ds4's file name next to the model, when there].
    #[arg(long, value_name = "FILE")]
    pub dspark: Option<PathBuf>,
}

pub fn run(args: Args) -> CliResult {
    let model = Model::open(&args.file).map_err(|e| e.to_string())?;
    let acc = account(&model.hp, &table_from_model(&model));
    let support = match args.dspark.clone().or_else(|| crate::model::dspark::beside(&args.file)) {
        Some(p) => Some(DsparkModel::open(&p, &model.hp).map_err(|e| e.to_string())?),
        None => None,
    };
    if args.json {
        let mut v = to_json(&model, &acc);
        if let Some(d) = &support {
            v["dspark"] = json!({
                "file": d.file.display_name(),
                "stages": d.stages.len(),
                "block_size": d.meta.block_size,
                "markov_rank": d.meta.markov_rank,
                "noise_token_id": d.meta.noise_token,
                "target_layer_ids": d.meta.targets,
                "n_tensors": d.n_tensors(),
                "tensor_bytes": d.tensor_bytes(),
            });
        }
        println!("{}", serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?);
    } else {
        print_text(&model, &acc);
        if let Some(d) = &support {
            println!("dspark        {}: {}", d.file.display_name(), d.summary());
        }
    }
    Ok(())
}

fn str_meta(m: &Model, key: &str) -> String {
    m.file.get(key).and_then(|v| v.as_str()).unwrap_or("").to_string()
}

/// The file summary as JSON (stable keys; bytes as integers).
pub fn to_json(m: &Model, acc: &Accounting) -> serde_json::Value {
    let hp = &m.hp;
    json!({
        "file": m.file.display_name(),
        "file_bytes": m.file.file_size(),
        "architecture": str_meta(m, "general.architecture"),
        "name": str_meta(m, "general.name"),
        "checkpoint": describe_file(&m.file),
        "generation": Generation::of(&m.file).label(),
        "hparams": {
            "n_layer": hp.n_layer, "n_embd": hp.n_embd, "n_vocab": hp.n_vocab, "n_head": hp.n_head,
            "n_head_kv": hp.n_head_kv, "head_dim": hp.head_dim, "n_rot": hp.n_rot,
            "q_lora_rank": hp.q_lora_rank, "o_lora_rank": hp.o_lora_rank, "n_out_group": hp.n_out_group,
            "n_expert": hp.n_expert, "n_expert_used": hp.n_expert_used, "n_ff_exp": hp.n_ff_exp,
            "n_expert_shared": hp.n_expert_shared, "n_hash_layer": hp.n_hash_layer,
            "sliding_window": hp.sliding_window, "idx_n_head": hp.idx_n_head, "idx_head_dim": hp.idx_head_dim,
            "idx_top_k": hp.idx_top_k, "n_hc": hp.n_hc, "sinkhorn_iters": hp.sinkhorn_iters,
            "compress_ratios": hp.compress_ratios, "swiglu_clamp": hp.swiglu_clamp,
            "rope_freq_base": hp.rope_freq_base, "rope_scaling_factor": hp.rope_scaling_factor,
            "yarn_beta_fast": hp.yarn_beta_fast, "yarn_beta_slow": hp.yarn_beta_slow,
            "rope_orig_ctx": hp.rope_orig_ctx, "compress_rope_freq_base": hp.compress_rope_freq_base,
            "expert_weights_scale": hp.expert_weights_scale, "expert_weights_norm": hp.expert_weights_norm,
            "rms_eps": hp.rms_eps, "hc_eps": hp.hc_eps, "context_length": hp.context_length,
        },
        "n_tensors": acc.n_tensors,
        "tensor_bytes": acc.tensor_bytes,
        "bytes_by_type": acc.by_type.iter().map(|(t, b)| (t.name().to_string(), json!(b))).collect::<serde_json::Map<_, _>>(),
        "bytes_by_group": acc.by_group.iter().map(|(g, b)| (g.name().to_string(), json!(b))).collect::<serde_json::Map<_, _>>(),
        "weight_bytes_per_token": acc.per_token,
        "weight_bytes_per_token_total": acc.per_token.total(),
        "kv_bytes_per_context_token": acc.kv_bytes_per_context_token,
    })
}

fn print_text(m: &Model, acc: &Accounting) {
    let hp = &m.hp;
    println!(
        "file          {} ({} bytes, {})",
        m.file.display_name(),
        m.file.file_size(),
        fmt_gib(m.file.file_size(), 2)
    );
    println!(
        "architecture  {}   name: {}",
        str_meta(m, "general.architecture"),
        str_meta(m, "general.name")
    );
    println!(
        "checkpoint    {} ({} chat template)",
        describe_file(&m.file),
        Generation::of(&m.file).label()
    );
    println!(
        "layers {}  embd {}  vocab {}  heads {} (kv {})  head_dim {} (rope {})  q_lora {}  out groups {} × rank {}",
        hp.n_layer,
        hp.n_embd,
        hp.n_vocab,
        hp.n_head,
        hp.n_head_kv,
        hp.head_dim,
        hp.n_rot,
        hp.q_lora_rank,
        hp.n_out_group,
        hp.o_lora_rank
    );
    println!(
        "experts {} (used {}, shared {}, ffn {})  hash layers {}  window {}  indexer {}×{} top-k {}  HC {} ({} Sinkhorn iters)",
        hp.n_expert,
        hp.n_expert_used,
        hp.n_expert_shared,
        hp.n_ff_exp,
        hp.n_hash_layer,
        hp.sliding_window,
        hp.idx_n_head,
        hp.idx_head_dim,
        hp.idx_top_k,
        hp.n_hc,
        hp.sinkhorn_iters
    );
    println!(
        "rope base {} (compressed {}), YaRN factor {} beta {}/{} orig ctx {}  expert scale {}  eps {:e}/{:e}  context {}",
        hp.rope_freq_base,
        hp.compress_rope_freq_base,
        hp.rope_scaling_factor,
        hp.yarn_beta_fast,
        hp.yarn_beta_slow,
        hp.rope_orig_ctx,
        hp.expert_weights_scale,
        hp.rms_eps,
        hp.hc_eps,
        hp.context_length
    );
    let ratios: Vec<String> = hp.compress_ratios.iter().map(|r| r.to_string()).collect();
    println!("compress ratios [{}]", ratios.join(","));
    println!(
        "tensors       {}, {} bytes ({})",
        acc.n_tensors,
        acc.tensor_bytes,
        fmt_gib(acc.tensor_bytes, 2)
    );
    println!("by type:");
    for (t, b) in &acc.by_type {
        println!("  {:<22} {:>16} B  {:>11}", t.name(), b, fmt_gib(*b, 2));
    }
    println!("by group:");
    for (g, b) in &acc.by_group {
        println!("  {:<22} {:>16} B  {:>11}", g.name(), b, fmt_gib(*b, 2));
    }
    let total = acc.per_token.total();
    println!(
        "weight bytes read per decoded token: {} B = {:.2} GB ({})",
        total,
        total as f64 / 1e9,
        fmt_gib(total, 2)
    );
    for (label, b) in acc.per_token.rows() {
        println!(
            "  {:<22} {:>16} B  {:>9.1} MiB",
            label,
            b,
            b as f64 / (1u64 << 20) as f64
        );
    }
    println!(
        "KV cache growth per context token: {} B",
        acc.kv_bytes_per_context_token
    );
}
