//! MoE kernels for one decode step (`shaders/moe.wgsl`, architecture spec §7–8): the group-limited sigmoid
//! router, the clamped SwiGLU, the weighted sum of expert outputs, and the residual add. All f32.

use super::{Gpu, Pass, P};

const SHADER: &str = include_str!("../../shaders/moe.wgsl");
const LABEL: &str = "moe.wgsl";

/// Limits of `moe_route` (its workgroup arrays); `Config` refuses models beyond them.
pub const MAX_EXPERTS: u32 = crate::model::config::MAX_EXPERTS as u32;
pub const MAX_GROUPS: u32 = crate::model::config::MAX_EXPERT_GROUPS as u32;
pub const MAX_USED: u32 = crate::model::config::MAX_EXPERTS_USED as u32;

/// Words in a router output for `n_used` experts: ids, weights, two margins.
pub fn selection_words(n_used: u32) -> usize {
    2 * n_used as usize + 2
}

/// A router output read back from the GPU.
#[derive(Clone, Debug, PartialEq)]
pub struct Selection {
    /// Expert ids, best first.
    pub ids: Vec<u32>,
    pub weights: Vec<f32>,
    /// Score of the last kept group − the best dropped group's (+∞ when every group is kept).
    pub group_margin: f32,
    /// Score of the last picked expert − the best unpicked one in the kept groups (+∞ when none is left).
    pub expert_margin: f32,
}

impl Selection {
    pub fn from_words(words: &[u32], n_used: u32) -> Selection {
        let k = n_used as usize;
        assert!(words.len() >= selection_words(n_used), "a selection of {k} needs {} words", selection_words(n_used));
        Selection {
            ids: words[..k].to_vec(),
            weights: words[k..2 * k].iter().map(|&w| f32::from_bits(w)).collect(),
            group_margin: f32::from_bits(words[2 * k]),
            expert_margin: f32::from_bits(words[2 * k + 1]),
        }
    }
}

/// Routes one token (llama.cpp `build_moe_ffn`, sigmoid gating with `exp_probs_b` and expert groups).
/// Scores `s = σ(logit) + bias` pick the experts; a group's score is the sum of its two best `s` (groups are
/// `n_expert / n_group` contiguous experts); the `n_group_used` best groups are kept, and the `n_used` best
/// experts in them are taken in descending order. Ties go to the lower index (groups and experts).
/// Weights: `σ(logit_e)`, divided by `max(Σ_j σ(logit_ej), 2⁻¹⁴)` when `norm`, then × `scale` unless it is 0 or 1.
///
/// * `logits`: `n_expert` floats (`ffn_gate_inp` applied to the normed input).
/// * `bias`: `n_expert` floats (`exp_probs_b`).
/// * `sel`: [`selection_words`]`(n_used)` words: `[ids (n_used u32) | weights (n_used f32) | group margin (f32) |
///   expert margin (f32)]`, read with [`Selection::from_words`]; the weights are what [`accumulate`] reads.
#[allow(clippy::too_many_arguments)]
pub fn route(
    gpu: &Gpu,
    pass: &mut Pass,
    logits: &wgpu::Buffer,
    bias: &wgpu::Buffer,
    sel: &wgpu::Buffer,
    n_expert: u32,
    n_used: u32,
    n_group: u32,
    n_group_used: u32,
    norm: bool,
    scale: f32,
) {
    assert!((1..=MAX_EXPERTS).contains(&n_expert), "{n_expert} experts (1..={MAX_EXPERTS})");
    assert!((1..=MAX_GROUPS).contains(&n_group) && n_expert % n_group == 0, "{n_expert} experts in {n_group} groups");
    assert!((1..=n_group).contains(&n_group_used), "{n_group_used} of {n_group} groups");
    assert!(n_group_used == n_group || n_expert / n_group >= 2, "groups are scored by their two best experts");
    assert!((1..=MAX_USED).contains(&n_used), "{n_used} experts per token (1..={MAX_USED})");
    assert!(n_used <= n_group_used * (n_expert / n_group), "{n_used} experts from {n_group_used} groups of {}", n_expert / n_group);
    let kernel = gpu.kernel(LABEL, SHADER, "moe_route");
    let params = [P::U(n_expert), P::U(n_used), P::U(n_group), P::U(n_group_used), P::U(norm as u32), P::F(scale)];
    pass.dispatch(gpu, &kernel, &[logits, bias, sel], &params, 1);
}

/// The gated activation of `n` FFNs (experts, or 1 for a dense/shared FFN):
/// `act[z·ff + j] = a(gu[z·2ff + j], gu[z·2ff + ff + j])`, `a(g, u) = SiLU(g)·u`, or with `limit > 1e-6`
/// `min(SiLU(g), limit)·clamp(u, −limit, limit)` (swiglu_clamp_exp / _shexp).
///
/// * `gu`: `n·2·ff` floats, per FFN `[gate (ff) | up (ff)]`.
/// * `act`: `n·ff` floats.
pub fn swiglu(gpu: &Gpu, pass: &mut Pass, gu: &wgpu::Buffer, act: &wgpu::Buffer, ff: u32, n: u32, limit: f32) {
    let kernel = gpu.kernel(LABEL, SHADER, "swiglu");
    pass.dispatch(gpu, &kernel, &[gu, act], &[P::U(ff), P::U(n), P::F(limit)], (n * ff).div_ceil(256));
}

/// Adds the FFN output to the residual stream: `x[h] += (Σ_j w_j·expert_out[j·hidden + h]) + shared[h]`, the
/// sum in selection order, the shared expert's output added to it, then the whole to `x`.
///
/// * `expert_out`: `n_used·hidden` floats, the experts' down projections in selection order.
/// * `sel`: the router output ([`route`]); the weights are words `n_used..2·n_used`.
/// * `shared`: `hidden` floats, the shared expert's output.
/// * `x`: `hidden` floats, updated in place.
#[allow(clippy::too_many_arguments)]
pub fn accumulate(
    gpu: &Gpu,
    pass: &mut Pass,
    expert_out: &wgpu::Buffer,
    sel: &wgpu::Buffer,
    shared: &wgpu::Buffer,
    x: &wgpu::Buffer,
    hidden: u32,
    n_used: u32,
) {
    let kernel = gpu.kernel(LABEL, SHADER, "moe_accumulate");
    pass.dispatch(gpu, &kernel, &[expert_out, sel, x, shared], &[P::U(hidden), P::U(n_used)], hidden.div_ceil(256));
}

/// [`accumulate`] for a model without a shared expert: `x[h] += Σ_j w_j·expert_out[j·hidden + h]`.
pub fn accumulate_routed(
    gpu: &Gpu,
    pass: &mut Pass,
    expert_out: &wgpu::Buffer,
    sel: &wgpu::Buffer,
    x: &wgpu::Buffer,
    hidden: u32,
    n_used: u32,
) {
    let kernel = gpu.kernel(LABEL, SHADER, "moe_accumulate_routed");
    pass.dispatch(gpu, &kernel, &[expert_out, sel, x], &[P::U(hidden), P::U(n_used)], hidden.div_ceil(256));
}

/// `x[i] += y[i]` for `i < n` (residual adds).
pub fn add(gpu: &Gpu, pass: &mut Pass, x: &wgpu::Buffer, y: &wgpu::Buffer, n: u32) {
    let kernel = gpu.kernel(LABEL, SHADER, "add");
    pass.dispatch(gpu, &kernel, &[x, y], &[P::U(n)], n.div_ceil(256));
}
