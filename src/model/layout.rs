//! Which tensor plays which role: trunk block, MTP block or global; dense weight or routed-expert stack.
//! The store layout and `inspect`'s totals both derive from this, so they agree.

use super::Config;
use crate::gguf::SplitModel;
use serde::Serialize;

/// Routed-expert stacks (ne2 = expert index), in the order a per-expert record holds them.
pub const EXPERT_TENSORS: [&str; 3] = ["ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"];

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Weights outside any block (embeddings, final norm, head).
    Global,
    /// A dense weight of trunk block `layer`.
    Dense { layer: usize },
    /// A routed-expert stack of trunk block `layer`.
    Experts { layer: usize },
    /// Part of a multi-token-prediction block (not used for decoding).
    Mtp { layer: usize },
}

/// `blk.12.attn_q.weight` → (12, "attn_q.weight").
pub fn split_block_name(name: &str) -> Option<(usize, &str)> {
    let rest = name.strip_prefix("blk.")?;
    let dot = rest.find('.')?;
    Some((rest[..dot].parse().ok()?, &rest[dot + 1..]))
}

pub fn role(config: &Config, name: &str) -> Role {
    match split_block_name(name) {
        None => Role::Global,
        Some((layer, _)) if layer >= config.n_layer => Role::Mtp { layer },
        Some((layer, suffix)) if EXPERT_TENSORS.contains(&suffix) => Role::Experts { layer },
        Some((layer, _)) => Role::Dense { layer },
    }
}

/// Byte totals by role.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Totals {
    pub dense_bytes: u64,
    pub expert_bytes: u64,
    pub mtp_bytes: u64,
    /// Per MoE trunk layer: bytes of one expert's gate + up + down rows.
    pub expert_record_bytes: Vec<(usize, u64)>,
}

impl Totals {
    pub fn of(config: &Config, model: &SplitModel) -> Totals {
        let mut t = Totals::default();
        let mut per_layer = std::collections::BTreeMap::<usize, u64>::new();
        for tensor in &model.tensors {
            let bytes = tensor.info.n_bytes();
            match role(config, &tensor.info.name) {
                Role::Global | Role::Dense { .. } => t.dense_bytes += bytes,
                Role::Mtp { .. } => t.mtp_bytes += bytes,
                Role::Experts { layer } => {
                    t.expert_bytes += bytes;
                    *per_layer.entry(layer).or_default() += bytes / config.n_expert as u64;
                }
            }
        }
        t.expert_record_bytes = per_layer.into_iter().collect();
        t
    }
    pub fn max_record_bytes(&self) -> u64 {
        self.expert_record_bytes.iter().map(|r| r.1).max().unwrap_or(0)
    }
}

/// Every tensor the trunk needs, with its ggml dims (trailing 1s dropped), derived from the config alone.
pub fn expected_tensors(c: &Config) -> Vec<(String, Vec<u64>)> {
    let u = |x: usize| x as u64;
    let (h, nh, d, dk) = (u(c.hidden), u(c.n_head), u(c.kda_head_dim), u(c.kda_dim()));
    let (r, rope, d_qk, d_nope, d_v) = (u(c.kv_lora_rank), u(c.rope_dim), u(c.key_length_mla), u(c.d_nope()), u(c.value_length_mla));
    let (e, fe, fs, fd, v, k) = (u(c.n_expert), u(c.ff_expert), u(c.ff_shared), u(c.ff_dense), u(c.vocab_size), u(c.conv_kernel));
    let mut out: Vec<(String, Vec<u64>)> = vec![
        ("token_embd.weight".into(), vec![h, v]),
        ("output_norm.weight".into(), vec![h]),
    ];
    for (l, attention) in c.attention.iter().enumerate() {
        let mut layer: Vec<(&str, Vec<u64>)> = vec![("attn_norm.weight", vec![h]), ("ffn_norm.weight", vec![h])];
        match attention {
            super::Attention::Kda => layer.extend([
                ("attn_q.weight", vec![h, dk]),
                ("attn_k.weight", vec![h, dk]),
                ("attn_v.weight", vec![h, dk]),
                ("ssm_conv1d_q.weight", vec![k, 1, dk]),
                ("ssm_conv1d_k.weight", vec![k, 1, dk]),
                ("ssm_conv1d_v.weight", vec![k, 1, dk]),
                ("ssm_f_a.weight", vec![h, dk]),
                ("ssm_dt.bias", vec![dk]),
                ("ssm_a", vec![1, nh]),
                ("ssm_beta.weight", vec![h, nh]),
                ("ssm_g_a.weight", vec![h, dk]),
                ("ssm_norm.weight", vec![d]),
                ("attn_output.weight", vec![dk, h]),
            ]),
            super::Attention::Mla => layer.extend([
                ("attn_q.weight", vec![h, nh * d_qk]),
                ("attn_kv_a_mqa.weight", vec![h, r + rope]),
                ("attn_kv_a_norm.weight", vec![r]),
                ("attn_k_b.weight", vec![d_nope, r, nh]),
                ("attn_v_b.weight", vec![r, d_v, nh]),
                ("attn_gate.weight", vec![h, nh]),
                ("attn_output.weight", vec![nh * d_v, h]),
            ]),
        }
        if c.is_moe_layer(l) {
            layer.extend([
                ("ffn_gate_inp.weight", vec![h, e]),
                ("exp_probs_b.bias", vec![e]),
                ("ffn_gate_exps.weight", vec![h, fe, e]),
                ("ffn_up_exps.weight", vec![h, fe, e]),
                ("ffn_down_exps.weight", vec![fe, h, e]),
                ("ffn_gate_shexp.weight", vec![h, fs]),
                ("ffn_up_shexp.weight", vec![h, fs]),
                ("ffn_down_shexp.weight", vec![fs, h]),
            ]);
        } else {
            layer.extend([("ffn_gate.weight", vec![h, fd]), ("ffn_up.weight", vec![h, fd]), ("ffn_down.weight", vec![fd, h])]);
        }
        out.extend(layer.into_iter().map(|(name, dims)| (format!("blk.{l}.{name}"), dims)));
    }
    out
}

/// Checks that the model has every tensor the trunk needs, with the dims the config implies (and the head,
/// `output.weight`, when present; llama.cpp falls back to the embeddings without it).
pub fn check_tensors(c: &Config, model: &SplitModel) -> Result<(), String> {
    let trim = |dims: &[u64]| -> Vec<u64> {
        let mut d = dims.to_vec();
        while d.len() > 1 && d.last() == Some(&1) {
            d.pop();
        }
        d
    };
    let mut expected = expected_tensors(c);
    if model.tensor("output.weight").is_some() {
        expected.push(("output.weight".into(), vec![c.hidden as u64, c.vocab_size as u64]));
    }
    for (name, dims) in expected {
        let t = model.tensor(&name).ok_or_else(|| format!("the model has no tensor {name:?}; it is incomplete or not a Ling 3.0 file"))?;
        if trim(&t.info.dims) != trim(&dims) {
            return Err(format!("tensor {name:?} has dims {:?}; the config implies {dims:?}", t.info.dims));
        }
    }
    Ok(())
}
