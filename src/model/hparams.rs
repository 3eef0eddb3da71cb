//! DeepSeek V4 Flash hyperparameters, read from GGUF metadata (docs/model.md#hyperparameters,
//! docs/gguf.md#metadata, docs/model.md#layer-schedule).
//!
//! Owns the metadata keys, their validation and the layer schedule. Every dimension comes from the
//! file, so tiny models of the same architecture load through the same code. Must not look at
//! tensors (`layout.rs` does).

use crate::gguf::{GgufError, GgufFile, MetaValue};

pub const ARCH: &str = "deepseek4";

/// Every hyperparameter the engine uses. Names follow docs/model.md#hyperparameters.
#[derive(Clone, Debug, PartialEq)]
pub struct HParams {
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_vocab: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    /// Head dim D (key = value length).
    pub head_dim: usize,
    /// Rotary dims R (the last R of each head).
    pub n_rot: usize,
    pub q_lora_rank: usize,
    pub o_lora_rank: usize,
    pub n_out_group: usize,
    pub n_expert: usize,
    pub n_expert_used: usize,
    pub n_ff_exp: usize,
    pub n_expert_shared: usize,
    pub n_hash_layer: usize,
    pub sliding_window: usize,
    pub idx_n_head: usize,
    pub idx_head_dim: usize,
    pub idx_top_k: usize,
    pub n_hc: usize,
    pub sinkhorn_iters: usize,
    /// Compression ratio per layer: 0, 4 or 128.
    pub compress_ratios: Vec<u32>,
    /// SwiGLU clamp per layer.
    pub swiglu_clamp: Vec<f32>,
    pub rope_freq_base: f32,
    pub rope_scaling_factor: f32,
    pub yarn_beta_fast: f32,
    pub yarn_beta_slow: f32,
    pub rope_orig_ctx: u64,
    pub compress_rope_freq_base: f32,
    pub expert_weights_scale: f32,
    pub expert_weights_norm: bool,
    pub rms_eps: f32,
    pub hc_eps: f32,
    /// Training context (informational).
    pub context_length: u64,
}

impl HParams {
    /// HC control width: 2·N_hc + N_hc².
    pub fn hc_mix(&self) -> usize {
        2 * self.n_hc + self.n_hc * self.n_hc
    }
    /// Flattened HC width N_hc·E.
    pub fn hc_dim(&self) -> usize {
        self.n_hc * self.n_embd
    }
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }
    /// Non-rotary head dims D − R (E4M3 region).
    pub fn head_dim_nope(&self) -> usize {
        self.head_dim - self.n_rot
    }
    /// Heads per output group.
    pub fn heads_per_group(&self) -> usize {
        self.n_head / self.n_out_group
    }
    /// Input width of one output group: D · H / G.
    pub fn group_dim(&self) -> usize {
        self.head_dim * self.heads_per_group()
    }
    pub fn ratio(&self, layer: usize) -> u32 {
        self.compress_ratios[layer]
    }
    pub fn is_hash_layer(&self, layer: usize) -> bool {
        layer < self.n_hash_layer
    }
    pub fn has_indexer(&self, layer: usize) -> bool {
        self.ratio(layer) == 4
    }
    /// Overlap factor of a compressed layer: 2 for ratio 4, 1 otherwise (docs/model.md#compressor).
    pub fn compress_overlap(&self, layer: usize) -> usize {
        if self.ratio(layer) == 4 { 2 } else { 1 }
    }

    /// ds4's fixed schedule (docs/model.md#layer-schedule): 0 for layers 0 and 1, then 4 on even and 128 on odd
    /// layers.
    pub fn ds4_ratio_schedule(n_layer: usize) -> Vec<u32> {
        (0..n_layer)
            .map(|l| {
                if l < 2 {
                    0
                } else if l % 2 == 0 {
                    4
                } else {
                    128
                }
            })
            .collect()
    }

    /// The exact DeepSeek V4 Flash values.
    pub fn flash() -> HParams {
        HParams {
            n_layer: 43,
            n_embd: 4096,
            n_vocab: 129280,
            n_head: 64,
            n_head_kv: 1,
            head_dim: 512,
            n_rot: 64,
            q_lora_rank: 1024,
            o_lora_rank: 1024,
            n_out_group: 8,
            n_expert: 256,
            n_expert_used: 6,
            n_ff_exp: 2048,
            n_expert_shared: 1,
            n_hash_layer: 3,
            sliding_window: 128,
            idx_n_head: 64,
            idx_head_dim: 128,
            idx_top_k: 512,
            n_hc: 4,
            sinkhorn_iters: 20,
            compress_ratios: Self::ds4_ratio_schedule(43),
            swiglu_clamp: vec![10.0; 43],
            rope_freq_base: 10000.0,
            rope_scaling_factor: 16.0,
            yarn_beta_fast: 32.0,
            yarn_beta_slow: 1.0,
            rope_orig_ctx: 65536,
            compress_rope_freq_base: 160000.0,
            expert_weights_scale: 1.5,
            expert_weights_norm: true,
            rms_eps: 1e-6,
            hc_eps: 1e-6,
            context_length: 1_048_576,
        }
    }

    /// The tiny test model of docs/model.md#tiny-model (real vocabulary so the real tokenizer works).
    pub fn tiny() -> HParams {
        let n_layer = 6;
        HParams {
            n_layer,
            n_embd: 256,
            n_vocab: 129280,
            n_head: 8,
            n_head_kv: 1,
            head_dim: 128,
            n_rot: 64,
            q_lora_rank: 64,
            o_lora_rank: 64,
            n_out_group: 2,
            n_expert: 16,
            n_expert_used: 4,
            n_ff_exp: 256,
            n_expert_shared: 1,
            n_hash_layer: 3,
            sliding_window: 16,
            idx_n_head: 4,
            idx_head_dim: 128,
            idx_top_k: 4,
            n_hc: 4,
            sinkhorn_iters: 20,
            compress_ratios: Self::ds4_ratio_schedule(n_layer),
            swiglu_clamp: vec![10.0; n_layer],
            context_length: 1_048_576,
            ..Self::flash()
        }
    }

    /// Read and validate from GGUF metadata. Integer keys accept any integer type (more lenient
    /// than ds4's strict u32, docs/gguf.md#metadata); errors name the key and say expected vs found.
    pub fn from_gguf(g: &GgufFile) -> Result<HParams, GgufError> {
        let arch = g.get("general.architecture").and_then(|v| v.as_str());
        match arch {
            Some(ARCH) => {}
            Some(other) => {
                return Err(GgufError::msg(format!(
                    "wrong model: general.architecture is '{other}', expected '{ARCH}' (DeepSeek V4 Flash)"
                )));
            }
            None => {
                return Err(GgufError::msg(format!(
                    "wrong model: key 'general.architecture' missing, expected '{ARCH}'"
                )));
            }
        }
        let key = |k: &str| format!("{ARCH}.{k}");
        let req = |k: &str| -> Result<&MetaValue, GgufError> {
            let full = key(k);
            g.get(&full)
                .ok_or_else(|| GgufError::msg(format!("missing metadata key '{full}'")))
        };
        let u = |k: &str| {
            read_as(&key(k), req(k)?, "an unsigned integer", |v| {
                v.as_u64().map(|x| x as usize)
            })
        };
        let u_opt = |k: &str| -> Result<usize, GgufError> { if g.get(&key(k)).is_some() { u(k) } else { Ok(0) } };
        let f = |k: &str| read_as(&key(k), req(k)?, "a number", |v| v.as_f64().map(|x| x as f32));
        let n_layer = u("block_count")?;
        if n_layer == 0 || n_layer > 4096 {
            return Err(GgufError::msg(format!(
                "key '{}': {n_layer} layers, expected 1..=4096",
                key("block_count")
            )));
        }
        let ratios_key = key("attention.compress_ratios");
        let ratios_v = req("attention.compress_ratios")?;
        let compress_ratios: Vec<u32> = match ratios_v.as_array() {
            Some(a) if a.len() >= n_layer => {
                let mut out = Vec::with_capacity(n_layer);
                for (i, x) in a.iter().take(n_layer).enumerate() {
                    let r = match *x {
                        MetaValue::U32(r) => r as i64,
                        MetaValue::I32(r) => r as i64,
                        ref o => return Err(wrong_type(&ratios_key, Some(i), "u32 or i32", o)),
                    };
                    if !matches!(r, 0 | 4 | 128) {
                        return Err(GgufError::msg(format!(
                            "key '{ratios_key}'[{i}]: ratio {r}, expected 0, 4 or 128"
                        )));
                    }
                    out.push(r as u32);
                }
                out
            }
            Some(a) => {
                return Err(GgufError::msg(format!(
                    "key '{ratios_key}': {} entries, expected at least {n_layer} (one per layer)",
                    a.len()
                )));
            }
            None => return Err(wrong_type(&ratios_key, None, "an array", ratios_v)),
        };
        let clamp_v = req("swiglu_clamp_exp")?;
        let swiglu_clamp: Vec<f32> = match clamp_v.as_array() {
            Some(a) if a.len() >= n_layer => {
                let mut out = Vec::with_capacity(n_layer);
                for (i, x) in a.iter().take(n_layer).enumerate() {
                    match *x {
                        MetaValue::F32(v) => out.push(v),
                        MetaValue::F64(v) => out.push(v as f32),
                        ref o => return Err(wrong_type(&key("swiglu_clamp_exp"), Some(i), "f32 or f64", o)),
                    }
                }
                out
            }
            _ => {
                let expected = format!("an array of at least {n_layer} floats");
                return Err(wrong_type(&key("swiglu_clamp_exp"), None, &expected, clamp_v));
            }
        };
        let norm_v = req("expert_weights_norm")?;
        let expert_weights_norm = match norm_v {
            MetaValue::Bool(b) => *b,
            o => return Err(wrong_type(&key("expert_weights_norm"), None, "bool", o)),
        };
        let hp = HParams {
            n_layer,
            n_embd: u("embedding_length")?,
            n_vocab: u("vocab_size")?,
            n_head: u("attention.head_count")?,
            n_head_kv: u("attention.head_count_kv")?,
            head_dim: u("attention.key_length")?,
            n_rot: u("rope.dimension_count")?,
            q_lora_rank: u("attention.q_lora_rank")?,
            o_lora_rank: u("attention.output_lora_rank")?,
            n_out_group: u("attention.output_group_count")?,
            n_expert: u("expert_count")?,
            n_expert_used: u("expert_used_count")?,
            n_ff_exp: u("expert_feed_forward_length")?,
            n_expert_shared: u("expert_shared_count")?,
            n_hash_layer: u("hash_layer_count")?,
            sliding_window: u("attention.sliding_window")?,
            idx_n_head: u("attention.indexer.head_count")?,
            idx_head_dim: u("attention.indexer.key_length")?,
            idx_top_k: u("attention.indexer.top_k")?,
            n_hc: u("hyper_connection.count")?,
            sinkhorn_iters: u("hyper_connection.sinkhorn_iterations")?,
            compress_ratios,
            swiglu_clamp,
            rope_freq_base: f("rope.freq_base")?,
            rope_scaling_factor: f("rope.scaling.factor")?,
            yarn_beta_fast: f("rope.scaling.yarn_beta_fast")?,
            yarn_beta_slow: f("rope.scaling.yarn_beta_slow")?,
            rope_orig_ctx: u("rope.scaling.original_context_length")? as u64,
            compress_rope_freq_base: f("attention.compress_rope_freq_base")?,
            expert_weights_scale: f("expert_weights_scale")?,
            expert_weights_norm,
            rms_eps: f("attention.layer_norm_rms_epsilon")?,
            hc_eps: f("hyper_connection.epsilon")?,
            context_length: g.get(&key("context_length")).and_then(|v| v.as_u64()).unwrap_or(0),
        };
        let value_length = u("attention.value_length")?;
        if value_length != hp.head_dim {
            return Err(GgufError::msg(format!(
                "key '{}': {value_length}, expected {} (value length must equal key length: K = V)",
                key("attention.value_length"),
                hp.head_dim
            )));
        }
        for k in ["expert_group_count", "expert_group_used_count"] {
            let v = u_opt(k)?;
            if v != 0 {
                return Err(GgufError::msg(format!(
                    "key '{}': {v}, expected 0 (no group-limited routing)",
                    key(k)
                )));
            }
        }
        hp.validate()?;
        Ok(hp)
    }

    /// Structural checks the engine relies on; each error names the key.
    pub fn validate(&self) -> Result<(), GgufError> {
        let k = |s: &str| format!("{ARCH}.{s}");
        let bad = |key: &str, msg: String| Err(GgufError::msg(format!("key '{}': {msg}", k(key))));
        let nz = [
            ("embedding_length", self.n_embd),
            ("vocab_size", self.n_vocab),
            ("attention.head_count", self.n_head),
            ("attention.key_length", self.head_dim),
            ("attention.q_lora_rank", self.q_lora_rank),
            ("attention.output_lora_rank", self.o_lora_rank),
            ("attention.output_group_count", self.n_out_group),
            ("expert_count", self.n_expert),
            ("expert_used_count", self.n_expert_used),
            ("expert_feed_forward_length", self.n_ff_exp),
            ("attention.sliding_window", self.sliding_window),
            ("attention.indexer.head_count", self.idx_n_head),
            ("attention.indexer.top_k", self.idx_top_k),
            ("hyper_connection.count", self.n_hc),
            ("hyper_connection.sinkhorn_iterations", self.sinkhorn_iters),
        ];
        for (key, v) in nz {
            if v == 0 {
                return bad(key, "0, expected a positive value".into());
            }
            if v > (1 << 24) {
                return bad(key, format!("{v} is implausibly large"));
            }
        }
        if self.n_head_kv != 1 {
            return bad(
                "attention.head_count_kv",
                format!("{}, expected 1 (one shared K=V row)", self.n_head_kv),
            );
        }
        if self.n_expert_shared != 1 {
            return bad("expert_shared_count", format!("{}, expected 1", self.n_expert_shared));
        }
        if self.n_rot == 0 || !self.n_rot.is_multiple_of(2) || self.n_rot >= self.head_dim {
            return bad(
                "rope.dimension_count",
                format!(
                    "{}, expected an even number below key_length {}",
                    self.n_rot, self.head_dim
                ),
            );
        }
        if !self.head_dim_nope().is_multiple_of(64) {
            return bad(
                "attention.key_length",
                format!(
                    "key_length − rope dims = {} is not a multiple of 64 (E4M3 blocks)",
                    self.head_dim_nope()
                ),
            );
        }
        if self.idx_head_dim != 128 {
            return bad(
                "attention.indexer.key_length",
                format!("{}, expected 128 (the indexer Hadamard is 128 wide)", self.idx_head_dim),
            );
        }
        if self.n_rot > self.idx_head_dim {
            return bad(
                "rope.dimension_count",
                format!("{} exceeds the indexer head dim {}", self.n_rot, self.idx_head_dim),
            );
        }
        if !self.n_head.is_multiple_of(self.n_out_group) {
            return bad(
                "attention.output_group_count",
                format!("{} does not divide head_count {}", self.n_out_group, self.n_head),
            );
        }
        if self.n_expert_used > self.n_expert {
            return bad(
                "expert_used_count",
                format!("{} exceeds expert_count {}", self.n_expert_used, self.n_expert),
            );
        }
        if self.n_hash_layer > self.n_layer {
            return bad(
                "hash_layer_count",
                format!("{} exceeds block_count {}", self.n_hash_layer, self.n_layer),
            );
        }
        if !self.n_embd.is_multiple_of(256) || !self.n_ff_exp.is_multiple_of(256) {
            return bad(
                "embedding_length",
                format!(
                    "embedding {} and expert width {} must be multiples of 256 (K-quant rows)",
                    self.n_embd, self.n_ff_exp
                ),
            );
        }
        for (key, v) in [
            ("attention.q_lora_rank", self.q_lora_rank),
            ("attention.output_lora_rank", self.o_lora_rank),
        ] {
            if !v.is_multiple_of(32) {
                return bad(key, format!("{v} is not a multiple of 32 (Q8_0 rows)"));
            }
        }
        if !self.expert_weights_norm {
            return bad("expert_weights_norm", "false, expected true".into());
        }
        Ok(())
    }
}

/// The metadata value `v` at `key` as `read` converts it, or an error saying what was expected and
/// what was found.
fn read_as<T>(
    key: &str,
    v: &MetaValue,
    expected: &str,
    read: impl Fn(&MetaValue) -> Option<T>,
) -> Result<T, GgufError> {
    read(v).ok_or_else(|| {
        GgufError::msg(format!(
            "key '{key}': expected {expected}, found {} {v:?}",
            v.type_name()
        ))
    })
}

/// A metadata value of the wrong type: "key 'K': expected X, found T" (`entry` adds the index of
/// an array's entry after the key).
fn wrong_type(key: &str, entry: Option<usize>, expected: &str, found: &MetaValue) -> GgufError {
    let at = entry.map(|i| format!("[{i}]")).unwrap_or_default();
    GgufError::msg(format!(
        "key '{key}'{at}: expected {expected}, found {}",
        found.type_name()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flash_layer_schedule_is_ds4s() {
        let hp = HParams::flash();
        assert_eq!(hp.compress_ratios.iter().filter(|&&r| r == 4).count(), 21);
        assert_eq!(hp.compress_ratios.iter().filter(|&&r| r == 128).count(), 20);
        assert_eq!(hp.ratio(42), 4);
        assert_eq!(hp.hc_mix(), 24);
        assert_eq!(hp.group_dim(), 4096);
        hp.validate().unwrap();
        HParams::tiny().validate().unwrap();
    }
}
