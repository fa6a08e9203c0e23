//! The `bailingmoe3` hyper-parameters, read from GGUF metadata (ling-architecture.md §1), with the fallbacks
//! llama.cpp applies and a clear refusal of the variants lingtab does not implement.

use crate::gguf::{Header, Value};
use serde::Serialize;
use std::fmt;

pub const ARCH: &str = "bailingmoe3";

/// Most blocks a file may have (llama.cpp's LLAMA_MAX_LAYERS): per-block vectors are sized by `block_count`
/// before any tensor is looked at, so an absurd count must be refused, not allocated.
pub const MAX_BLOCKS: usize = 512;
/// Limits of the routing kernel (`moe_route`'s workgroup arrays); 512 experts is also llama.cpp's
/// LLAMA_MAX_EXPERTS and Ling 3.0 Flash's count.
pub const MAX_EXPERTS: usize = 512;
pub const MAX_EXPERT_GROUPS: usize = 64;
pub const MAX_EXPERTS_USED: usize = 32;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Attention {
    /// Kimi delta attention: a recurrent layer (head_count_kv = 0).
    Kda,
    /// Multi-head latent attention (head_count_kv > 0).
    Mla,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Config {
    /// Blocks in the file, MTP blocks included.
    pub block_count: usize,
    /// Multi-token-prediction blocks at the end (skipped by the engine).
    pub nextn_predict_layers: usize,
    /// Trunk layers the engine runs (block_count − nextn_predict_layers).
    pub n_layer: usize,
    pub hidden: usize,
    pub ff_dense: usize,
    pub n_head: usize,
    /// Attention kind of each trunk layer.
    pub attention: Vec<Attention>,
    pub rms_eps: f32,
    pub context_length: usize,
    pub vocab_size: usize,
    // KDA
    pub kda_head_dim: usize,
    pub conv_kernel: usize,
    pub gate_lower_bound: f32,
    // MLA
    pub kv_lora_rank: usize,
    pub key_length_mla: usize,
    pub value_length_mla: usize,
    pub rope_dim: usize,
    pub rope_freq_base: f32,
    // FFN / MoE
    pub n_dense_lead: usize,
    pub n_expert: usize,
    pub n_expert_used: usize,
    pub n_expert_group: usize,
    pub n_group_used: usize,
    pub ff_expert: usize,
    pub ff_shared: usize,
    pub n_shared_expert: usize,
    pub expert_weights_norm: bool,
    pub expert_weights_scale: f32,
    /// SwiGLU limit per trunk layer for routed experts (0 = no clamp).
    pub clamp_exp: Vec<f32>,
    /// SwiGLU limit per trunk layer for the shared expert and the dense lead layers (llama.cpp's `build_ffn`).
    pub clamp_shexp: Vec<f32>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for ConfigError {}

fn err<T>(msg: impl Into<String>) -> Result<T, ConfigError> {
    Err(ConfigError(msg.into()))
}

struct Keys<'a>(&'a Header);

impl Keys<'_> {
    fn name(key: &str) -> String {
        format!("{ARCH}.{key}")
    }
    fn opt(&self, key: &str) -> Option<&Value> {
        self.0.get(&Self::name(key))
    }
    fn uint(&self, key: &str) -> Result<usize, ConfigError> {
        match self.opt(key) {
            None => err(format!("missing metadata key {}", Self::name(key))),
            Some(v) => {
                let x = v.as_u64().ok_or_else(|| ConfigError(format!("{} is not an unsigned integer: {v:?}", Self::name(key))))?;
                // (a wasm32 usize is 32 bits: a larger value must not wrap into a plausible one)
                usize::try_from(x).map_err(|_| ConfigError(format!("{} is {x}, too large for this platform", Self::name(key))))
            }
        }
    }
    fn uint_or(&self, key: &str, default: usize) -> Result<usize, ConfigError> {
        if self.opt(key).is_some() { self.uint(key) } else { Ok(default) }
    }
    fn float(&self, key: &str) -> Result<f32, ConfigError> {
        match self.opt(key) {
            None => err(format!("missing metadata key {}", Self::name(key))),
            Some(v) => v.as_f64().map(|x| x as f32).ok_or_else(|| ConfigError(format!("{} is not a number: {v:?}", Self::name(key)))),
        }
    }
    fn float_or(&self, key: &str, default: f32) -> Result<f32, ConfigError> {
        if self.opt(key).is_some() { self.float(key) } else { Ok(default) }
    }
    fn bool_or(&self, key: &str, default: bool) -> Result<bool, ConfigError> {
        match self.opt(key) {
            None => Ok(default),
            Some(v) => v.as_bool().ok_or_else(|| ConfigError(format!("{} is not a bool: {v:?}", Self::name(key)))),
        }
    }
    /// A per-block array, or a scalar meaning "every block" (llama.cpp's get_key_or_arr).
    fn per_block_f32(&self, key: &str, blocks: usize) -> Result<Vec<f32>, ConfigError> {
        match self.opt(key) {
            None => Ok(vec![0.0; blocks]),
            Some(Value::Array(_, items)) => {
                if items.len() != blocks {
                    return err(format!("{} has {} entries, block_count is {blocks}", Self::name(key), items.len()));
                }
                items.iter().map(|v| v.as_f64().map(|x| x as f32).ok_or_else(|| ConfigError(format!("{} holds a non-number", Self::name(key))))).collect()
            }
            Some(v) => v.as_f64().map(|x| vec![x as f32; blocks]).ok_or_else(|| ConfigError(format!("{} is not a number or array", Self::name(key)))),
        }
    }
    fn per_block_u64(&self, key: &str, blocks: usize) -> Result<Vec<u64>, ConfigError> {
        match self.opt(key) {
            None => err(format!("missing metadata key {}", Self::name(key))),
            Some(Value::Array(_, items)) => {
                if items.len() != blocks {
                    return err(format!("{} has {} entries, block_count is {blocks}", Self::name(key), items.len()));
                }
                items.iter().map(|v| v.as_u64().ok_or_else(|| ConfigError(format!("{} holds a non-integer", Self::name(key))))).collect()
            }
            Some(v) => v.as_u64().map(|x| vec![x; blocks]).ok_or_else(|| ConfigError(format!("{} is not an integer or array", Self::name(key)))),
        }
    }
}

impl Config {
    pub fn from_header(h: &Header) -> Result<Config, ConfigError> {
        match h.architecture() {
            Some(ARCH) => {}
            Some(other) => return err(format!("this GGUF is a {other:?} model; lingtab runs {ARCH:?} (Ling 3.0) models only")),
            None => return err("this GGUF has no general.architecture key; it is not a complete model (for a split model, give the first part)"),
        }
        let k = Keys(h);
        // Variants of the architecture lingtab does not implement: refuse rather than compute something else.
        if k.opt("attention.q_lora_rank").is_some_and(|v| v.as_u64() != Some(0)) {
            return err("this model uses a q LoRA for MLA (attention.q_lora_rank); lingtab implements the plain attn_q form of Ling 3.0 Flash only");
        }
        if k.opt("rope.dimension_sections").is_some() {
            return err("this model uses M-RoPE (rope.dimension_sections, a vision-language file); lingtab implements text-only RoPE");
        }
        if let Some(v) = k.opt("rope.scaling.type") {
            match v.as_str() {
                Some("none") | Some("linear") if k.float_or("rope.scaling.factor", 1.0)? == 1.0 => {}
                _ => return err(format!("RoPE scaling {v:?} is not implemented by lingtab")),
            }
        }
        let gating = k.uint("expert_gating_func")?;
        if gating != 2 {
            return err(format!("expert_gating_func is {gating}; lingtab implements sigmoid gating (2) only"));
        }
        if !k.bool_or("kda.safe_gate", true)? {
            return err("kda.safe_gate is false; Ling 3.0 (and llama.cpp) use the safe gate only");
        }
        let gate_lower_bound = k.float("kda.gate_lower_bound")?;
        if !(gate_lower_bound < 0.0) {
            return err(format!("kda.gate_lower_bound must be negative, got {gate_lower_bound}"));
        }

        let block_count = k.uint("block_count")?;
        if block_count > MAX_BLOCKS {
            return err(format!("block_count is {block_count}; at most {MAX_BLOCKS} blocks are supported (as in llama.cpp)"));
        }
        let nextn_predict_layers = k.uint_or("nextn_predict_layers", 0)?;
        if block_count == 0 || nextn_predict_layers >= block_count {
            return err(format!("block_count {block_count} with {nextn_predict_layers} MTP blocks leaves no trunk layer"));
        }
        let n_layer = block_count - nextn_predict_layers;
        let head_count_kv = k.per_block_u64("attention.head_count_kv", block_count)?;
        let attention = head_count_kv[..n_layer].iter().map(|&n| if n == 0 { Attention::Kda } else { Attention::Mla }).collect();

        let n_expert = k.uint("expert_count")?;
        let n_expert_used = k.uint("expert_used_count")?;
        let n_expert_group = k.uint_or("expert_group_count", 1)?.max(1);
        let n_group_used = k.uint_or("expert_group_used_count", n_expert_group)?;
        let ff_expert = k.uint("expert_feed_forward_length")?;
        let n_shared_expert = k.uint("expert_shared_count")?;
        let vocab_size = match k.opt("vocab_size") {
            Some(_) => k.uint("vocab_size")?,
            None => h.get("tokenizer.ggml.tokens").and_then(Value::as_array).map(|a| a.len()).unwrap_or(0),
        };
        let mut clamp_exp = k.per_block_f32("swiglu_clamp_exp", block_count)?;
        let mut clamp_shexp = k.per_block_f32("swiglu_clamp_shexp", block_count)?;
        clamp_exp.truncate(n_layer);
        clamp_shexp.truncate(n_layer);

        let c = Config {
            block_count,
            nextn_predict_layers,
            n_layer,
            hidden: k.uint("embedding_length")?,
            ff_dense: k.uint("feed_forward_length")?,
            n_head: k.uint("attention.head_count")?,
            attention,
            rms_eps: k.float("attention.layer_norm_rms_epsilon")?,
            context_length: k.uint("context_length")?,
            vocab_size,
            kda_head_dim: k.uint("kda.head_dim")?,
            conv_kernel: k.uint("ssm.conv_kernel")?,
            gate_lower_bound,
            kv_lora_rank: k.uint("attention.kv_lora_rank")?,
            key_length_mla: k.uint("attention.key_length_mla")?,
            value_length_mla: k.uint("attention.value_length_mla")?,
            rope_dim: k.uint("rope.dimension_count")?,
            rope_freq_base: k.float_or("rope.freq_base", 10000.0)?,
            n_dense_lead: k.uint("leading_dense_block_count")?,
            n_expert,
            n_expert_used,
            n_expert_group,
            n_group_used,
            ff_expert,
            // llama.cpp: absent ⇒ expert ff × max(1, shared count)
            ff_shared: match k.opt("expert_shared_feed_forward_length") {
                Some(_) => k.uint("expert_shared_feed_forward_length")?,
                None => ff_expert.checked_mul(n_shared_expert.max(1)).ok_or_else(|| ConfigError(format!("expert_feed_forward_length {ff_expert} × expert_shared_count {n_shared_expert} overflows")))?,
            },
            n_shared_expert,
            expert_weights_norm: k.bool_or("expert_weights_norm", false)?,
            expert_weights_scale: k.float_or("expert_weights_scale", 1.0)?,
            clamp_exp,
            clamp_shexp,
        };
        let key_length = k.uint_or("attention.key_length", c.kv_lora_rank.saturating_add(c.rope_dim))?;
        c.validate(key_length)?;
        Ok(c)
    }

    fn validate(&self, key_length: usize) -> Result<(), ConfigError> {
        // Checked in order, each only once the ones before it hold (a later one may divide by or multiply
        // what an earlier one bounds).
        let checks: [(&dyn Fn() -> bool, &dyn Fn() -> String); 13] = [
            (&|| self.hidden > 0 && self.n_head > 0 && self.kda_head_dim > 0, &|| "hidden size, head count and KDA head dim must be positive".into()),
            (&|| (1..=MAX_EXPERTS).contains(&self.n_expert), &|| format!("expert_count {} must be in 1..={MAX_EXPERTS}", self.n_expert)),
            (&|| (1..=MAX_EXPERTS_USED.min(self.n_expert)).contains(&self.n_expert_used), &|| format!("expert_used_count {} must be in 1..={}", self.n_expert_used, MAX_EXPERTS_USED.min(self.n_expert))),
            (&|| self.n_expert_group <= MAX_EXPERT_GROUPS && self.n_expert % self.n_expert_group == 0, &|| format!("{} experts do not divide into {} groups (at most {MAX_EXPERT_GROUPS})", self.n_expert, self.n_expert_group)),
            (&|| self.n_group_used >= 1 && self.n_group_used <= self.n_expert_group, &|| format!("expert_group_used_count {} must be in 1..={}", self.n_group_used, self.n_expert_group)),
            (&|| self.n_group_used * (self.n_expert / self.n_expert_group) >= self.n_expert_used, &|| "the groups kept hold fewer experts than are used".into()),
            (&|| self.rope_dim % 2 == 0 && self.rope_dim < self.key_length_mla, &|| format!("rope dims {} must be even and below key_length_mla {}", self.rope_dim, self.key_length_mla)),
            (&|| self.kv_lora_rank.checked_add(self.rope_dim) == Some(key_length), &|| format!("attention.key_length {key_length} must equal kv_lora_rank + rope dims = {}", self.kv_lora_rank as u128 + self.rope_dim as u128)),
            // the widths the engine derives (KDA inner width, all heads' q and v) must fit a usize
            (&|| self.n_head.checked_mul(self.kda_head_dim.max(self.key_length_mla).max(self.value_length_mla)).is_some(), &|| format!("{} heads of widths {}, {} and {} overflow", self.n_head, self.kda_head_dim, self.key_length_mla, self.value_length_mla)),
            (&|| self.conv_kernel >= 1 && self.conv_kernel <= 16, &|| format!("ssm.conv_kernel {} is out of range", self.conv_kernel)),
            (&|| self.n_dense_lead <= self.n_layer, &|| "leading_dense_block_count exceeds the layer count".into()),
            (&|| self.vocab_size > 0 && self.context_length > 0, &|| "vocab size and context length must be positive".into()),
            (&|| self.vocab_size <= i32::MAX as usize, &|| format!("vocab size {} does not fit 32-bit token ids", self.vocab_size)),
        ];
        for (ok, msg) in checks {
            if !ok() {
                return err(format!("inconsistent {ARCH} config: {}", msg()));
            }
        }
        Ok(())
    }

    pub fn d_nope(&self) -> usize {
        self.key_length_mla - self.rope_dim
    }
    /// KDA inner width: heads × head dim.
    pub fn kda_dim(&self) -> usize {
        self.n_head * self.kda_head_dim
    }
    pub fn is_moe_layer(&self, layer: usize) -> bool {
        layer >= self.n_dense_lead
    }
    pub fn moe_layers(&self) -> impl Iterator<Item = usize> + '_ {
        self.n_dense_lead..self.n_layer
    }
}
