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
    route_tokens(gpu, pass, logits, bias, sel, 0, 1, n_expert, n_used, n_group, n_group_used, norm, scale);
}

/// [`route`] for `tokens` tokens: token t's logits at `logits[t·n_expert ..]`, its selection at word
/// `sel_offset + t·`[`selection_words`]`(n_used)` of `sel`.
#[allow(clippy::too_many_arguments)]
pub fn route_tokens(
    gpu: &Gpu,
    pass: &mut Pass,
    logits: &wgpu::Buffer,
    bias: &wgpu::Buffer,
    sel: &wgpu::Buffer,
    sel_offset: u32,
    tokens: u32,
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
    let params = [P::U(n_expert), P::U(n_used), P::U(n_group), P::U(n_group_used), P::U(norm as u32), P::F(scale), P::U(tokens), P::U(sel_offset)];
    pass.dispatch(gpu, &kernel, &[logits, bias, sel], &params, tokens);
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
    accumulate_tokens(gpu, pass, expert_out, sel, 0, shared, x, 0, hidden, n_used, 1);
}

/// [`accumulate`] for `tokens` tokens of a chunk: token t's expert outputs at `expert_out[t·n_used·hidden ..]`,
/// its selection at word `sel_offset + t·`[`selection_words`]`(n_used)`, its shared output at `shared[t·hidden ..]`
/// and its residual row at `x[x_offset + t·hidden ..]`.
#[allow(clippy::too_many_arguments)]
pub fn accumulate_tokens(gpu: &Gpu, pass: &mut Pass, expert_out: &wgpu::Buffer, sel: &wgpu::Buffer, sel_offset: u32, shared: &wgpu::Buffer, x: &wgpu::Buffer, x_offset: u32, hidden: u32, n_used: u32, tokens: u32) {
    let kernel = gpu.kernel(LABEL, SHADER, "moe_accumulate");
    let params = [P::U(hidden), P::U(n_used), P::U(x_offset), P::U(sel_offset), P::U(0)];
    pass.dispatch_3d(gpu, &kernel, &[expert_out, sel, x, shared], &params, (hidden.div_ceil(256), 1, tokens));
}

/// One wave of a streamed prefill: `x[x_offset + t·hidden + h] += Σ_j w_j·expert_out[(t·n_used + j)·hidden + h]`
/// over the selected experts j that `wave_slots[slot_base + expert]` maps (the experts computed in this wave).
#[allow(clippy::too_many_arguments)]
pub fn accumulate_wave(gpu: &Gpu, pass: &mut Pass, expert_out: &wgpu::Buffer, sel: &wgpu::Buffer, sel_offset: u32, wave_slots: &wgpu::Buffer, slot_base: u32, x: &wgpu::Buffer, x_offset: u32, hidden: u32, n_used: u32, tokens: u32) {
    let kernel = gpu.kernel(LABEL, SHADER, "moe_accumulate_wave");
    let params = [P::U(hidden), P::U(n_used), P::U(x_offset), P::U(sel_offset), P::U(slot_base)];
    pass.dispatch_3d(gpu, &kernel, &[expert_out, sel, x, wave_slots], &params, (hidden.div_ceil(256), 1, tokens));
}

/// Groups the (token, expert) pairs of `tokens` tokens by expert for [`super::matmul::experts`]: reads the
/// selections at word `sel_offset` of `sel`, looks experts up in `slots[slot_base + e]` (u32::MAX: skipped), and
/// writes into `groups` the tile entries (at most `max_tiles`) and, at word `list_at`, the pairs by expert.
/// `groups` holds `list_at + tokens·n_used` words; `list_at` = 4 + 4·`max_tiles`.
#[allow(clippy::too_many_arguments)]
pub fn group(gpu: &Gpu, pass: &mut Pass, sel: &wgpu::Buffer, sel_offset: u32, tokens: u32, n_used: u32, n_expert: u32, slots: &wgpu::Buffer, slot_base: u32, tile_tokens: u32, max_tiles: u32, groups: &wgpu::Buffer) {
    assert!((1..=MAX_EXPERTS).contains(&n_expert), "{n_expert} experts (1..={MAX_EXPERTS})");
    let list_at = group_list_at(max_tiles);
    assert!(groups.size() >= (list_at as u64 + (tokens * n_used) as u64) * 4, "group buffer too small");
    let kernel = gpu.kernel(LABEL, SHADER, "moe_group");
    let params = [P::U(tokens), P::U(n_used), P::U(sel_offset), P::U(n_expert), P::U(slot_base), P::U(tile_tokens), P::U(max_tiles), P::U(list_at)];
    pass.dispatch(gpu, &kernel, &[sel, slots, groups], &params, 1);
}

/// Word offset of the pair list in a group buffer of `max_tiles` entries.
pub fn group_list_at(max_tiles: u32) -> u32 {
    4 + 4 * max_tiles
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
    pass.dispatch(gpu, &kernel, &[expert_out, sel, x], &[P::U(hidden), P::U(n_used), P::U(0), P::U(0), P::U(0)], hidden.div_ceil(256));
}

/// `x[i] += y[i]` for `i < n` (residual adds).
pub fn add(gpu: &Gpu, pass: &mut Pass, x: &wgpu::Buffer, y: &wgpu::Buffer, n: u32) {
    add_at(gpu, pass, x, 0, y, 0, n);
}

/// `x[x_offset + i] += y[y_offset + i]` for `i < n`.
pub fn add_at(gpu: &Gpu, pass: &mut Pass, x: &wgpu::Buffer, x_offset: u32, y: &wgpu::Buffer, y_offset: u32, n: u32) {
    let kernel = gpu.kernel(LABEL, SHADER, "add");
    pass.dispatch(gpu, &kernel, &[x, y], &[P::U(n), P::U(x_offset), P::U(y_offset)], n.div_ceil(256));
}
