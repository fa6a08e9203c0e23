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
