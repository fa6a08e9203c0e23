// MoE routing (llama.cpp build_moe_ffn with sigmoid gating, exp_probs_b and expert groups), the clamped SwiGLU,
// the weighted sum of expert outputs, and the residual add. All f32.
// Every write is bounds-checked against the logical size and arrayLength: out-of-bounds writes are dropped on
// Vulkan but clamped onto the last element by Chromium.

fn sigmoid(x: f32) -> f32 {
    return 1.0 / (1.0 + exp(-x));
}

fn linear_index(wg: vec3<u32>, n_wg: vec3<u32>, lid: u32) -> u32 {
    return (wg.x + wg.y * n_wg.x) * 256u + lid;
}

// ── moe_route ──
// sel = [ids (n_used u32) | weights (n_used f32 bits) | group margin | expert margin (f32 bits)].
// Selection scores s = σ(logit) + bias; a group scores the sum of its two best s; the best n_group_used groups are
// kept; the n_used best s among them are picked in descending order. Ties: the lower index wins, for groups and
// experts alike. Weights come from the unbiased σ(logit). The margins (last kept − best dropped group score;
// last picked − best unpicked expert score in kept groups; +inf when nothing was dropped) let callers see near-ties.

const MAX_EXPERTS: u32 = 512u;
const MAX_GROUPS: u32 = 64u;
const MAX_USED: u32 = 32u;
const NONE: u32 = 0xffffffffu;
const INF_BITS: u32 = 0x7f800000u;
const MIN_WEIGHT_SUM: f32 = 6.103515625e-5; // 2^-14, llama.cpp's clamp of the weight sum

struct RouteParams {
    n_expert: u32,
    n_used: u32,
    n_group: u32,
    n_group_used: u32,
    norm: u32,
    scale: f32,
    // tokens routed (one workgroup each): token t's logits at t·n_expert, its selection at sel_offset + t·(2·n_used + 2)
    tokens: u32,
    sel_offset: u32,
}

@group(0) @binding(0) var<storage, read> route_logits: array<f32>;
@group(0) @binding(1) var<storage, read> route_bias: array<f32>;
@group(0) @binding(2) var<storage, read_write> route_sel: array<u32>;
@group(0) @binding(3) var<uniform> route_params: RouteParams;

var<workgroup> expert_scores: array<f32, MAX_EXPERTS>;
// σ(logit) of each expert: the picks' weights, without reading the logits again
var<workgroup> expert_gates: array<f32, MAX_EXPERTS>;
var<workgroup> group_scores: array<f32, MAX_GROUPS>;
var<workgroup> group_kept: array<bool, MAX_GROUPS>;
// each invocation's candidate of a pick round (two rounds' worth: the subgroup pick alternates halves)
var<workgroup> best_scores: array<f32, 512>;
var<workgroup> best_experts: array<u32, 512>;
var<workgroup> picked: array<u32, MAX_USED + 1u>; // the n_used picks, then the runner-up
var<private> route_token: u32;

fn store_sel(i: u32, bits: u32) {
    let words = 2u * route_params.n_used + 2u;
    let at = route_params.sel_offset + route_token * words + i;
    if (i < words && at < arrayLength(&route_sel)) {
        route_sel[at] = bits;
    }
}

fn route_logit(e: u32) -> f32 {
    return route_logits[route_token * route_params.n_expert + e];
}

// Candidate a (score, expert; NONE = no candidate) beats b: higher score, or equal score and lower index.
fn beats(score_a: f32, expert_a: u32, score_b: f32, expert_b: u32) -> bool {
    return expert_a != NONE && (expert_b == NONE || score_a > score_b || (score_a == score_b && expert_a < expert_b));
}

// Thread 0 keeps the best groups (a strict > scan, so the lower index wins ties) and writes the group margin.
fn keep_best_groups() {
    let p = route_params;
    var last_kept = 0.0;
    for (var j = 0u; j < p.n_group_used; j++) {
        var best = NONE;
        for (var g = 0u; g < p.n_group; g++) {
            if (!group_kept[g] && (best == NONE || group_scores[g] > group_scores[best])) {
                best = g;
            }
        }
        group_kept[best] = true;
        last_kept = group_scores[best];
    }
    var best_dropped = NONE;
    for (var g = 0u; g < p.n_group; g++) {
        if (!group_kept[g] && (best_dropped == NONE || group_scores[g] > group_scores[best_dropped])) {
            best_dropped = g;
        }
    }
    var margin = INF_BITS;
    if (best_dropped != NONE) {
        margin = bitcast<u32>(last_kept - group_scores[best_dropped]);
    }
    store_sel(2u * p.n_used, margin);
}

fn score_of(expert: u32) -> f32 {
    if (expert == NONE) {
        return 0.0;
    }
    return expert_scores[expert];
}

// pick_best: the best of the workgroup's candidates `mine` in round `round`, returned to every invocation (all
// call it). A tree through workgroup memory, ten barriers; moe.rs puts a subgroup version in its place (marked
// by these comments) where the device shuffles across subgroups.
fn pick_best(mine: u32, lid: u32, round: u32) -> u32 {
    best_experts[lid] = mine;
    best_scores[lid] = score_of(mine);
    workgroupBarrier();
    for (var stride = 128u; stride > 0u; stride >>= 1u) {
        if (lid < stride && beats(best_scores[lid + stride], best_experts[lid + stride], best_scores[lid], best_experts[lid])) {
            best_scores[lid] = best_scores[lid + stride];
            best_experts[lid] = best_experts[lid + stride];
        }
        workgroupBarrier();
    }
    let best = best_experts[0];
    // every invocation has read the winner before the next round writes
    workgroupBarrier();
    return best;
}
// pick_best end

// One workgroup per token; each invocation owns experts lid and lid + 256.
@compute @workgroup_size(256)
fn moe_route(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) n_wg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let p = route_params;
    let token = wg.x + wg.y * n_wg.x;
    if (token >= p.tokens) { return; }
    route_token = token;
    let group_size = p.n_expert / p.n_group;
    for (var e = lid; e < p.n_expert; e += 256u) {
        let gate = sigmoid(route_logit(e));
        expert_gates[e] = gate;
        expert_scores[e] = gate + route_bias[e];
    }
    workgroupBarrier();
    if (lid < p.n_group) {
        var first = -3.4e38;
        var second = -3.4e38;
        for (var e = lid * group_size; e < (lid + 1u) * group_size; e++) {
            let s = expert_scores[e];
            if (s > first) {
                second = first;
                first = s;
            } else if (s > second) {
                second = s;
            }
        }
        group_scores[lid] = first + second;
        group_kept[lid] = false;
    }
    workgroupBarrier();
    if (lid == 0u) {
        keep_best_groups();
    }
    workgroupBarrier();

    var candidates = array<u32, 2>(lid, lid + 256u);
    for (var c = 0u; c < 2u; c++) {
        if (candidates[c] >= p.n_expert || !group_kept[candidates[c] / group_size]) {
            candidates[c] = NONE;
        }
    }
    // n_used rounds of a workgroup argmax, plus one for the runner-up
    for (var j = 0u; j <= p.n_used; j++) {
        var mine = candidates[0];
        if (beats(score_of(candidates[1]), candidates[1], score_of(mine), mine)) {
            mine = candidates[1];
        }
        let best = pick_best(mine, lid, j);
        // (only invocation 0 reads the picks back)
        if (lid == 0u) {
            picked[j] = best;
        }
        for (var c = 0u; c < 2u; c++) {
            if (candidates[c] == best) {
                candidates[c] = NONE;
            }
        }
    }

    if (lid == 0u) {
        var sum = 0.0;
        for (var j = 0u; j < p.n_used; j++) {
            sum += expert_gates[picked[j]];
        }
        let denominator = max(sum, MIN_WEIGHT_SUM);
        for (var j = 0u; j < p.n_used; j++) {
            var weight = expert_gates[picked[j]];
            if (p.norm != 0u) {
                weight /= denominator;
            }
            if (p.scale != 0.0 && p.scale != 1.0) {
                weight *= p.scale;
            }
            store_sel(j, picked[j]);
            store_sel(p.n_used + j, bitcast<u32>(weight));
        }
        let runner_up = picked[p.n_used];
        var margin = INF_BITS;
        if (runner_up != NONE) {
            margin = bitcast<u32>(expert_scores[picked[p.n_used - 1u]] - expert_scores[runner_up]);
        }
        store_sel(2u * p.n_used + 1u, margin);
    }
}

// ── swiglu: act[z·ff + j] = a(gu[z·2ff + j], gu[z·2ff + ff + j]) for z < n ──
// a(g, u) = SiLU(g)·u, or min(SiLU(g), limit)·clamp(u, −limit, limit) when limit > 1e-6 (llama.cpp's threshold).

struct SwigluParams {
    ff: u32,
    n: u32,
    limit: f32,
}

@group(0) @binding(0) var<storage, read> swiglu_gu: array<f32>;
@group(0) @binding(1) var<storage, read_write> swiglu_act: array<f32>;
@group(0) @binding(2) var<uniform> swiglu_params: SwigluParams;

@compute @workgroup_size(256)
fn swiglu(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) n_wg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let p = swiglu_params;
    let i = linear_index(wg, n_wg, lid);
    if (i >= p.n * p.ff || i >= arrayLength(&swiglu_act)) { return; }
    let row = (i / p.ff) * 2u * p.ff + i % p.ff;
    let g = swiglu_gu[row];
    var up = swiglu_gu[row + p.ff];
    var silu = g / (1.0 + exp(-g));
    if (p.limit > 1e-6) {
        silu = min(silu, p.limit);
        up = clamp(up, -p.limit, p.limit);
    }
    swiglu_act[i] = silu * up;
}

// ── moe_accumulate: x[h] += (Σ_j w_j·out[j·hidden + h]) + shared[h], summed in selection order ──
// moe_accumulate_routed: the same without a shared expert.
// moe_accumulate_wave: x[h] += Σ_j w_j·out[j·hidden + h] over the selected experts mapped in `acc_wave_slots`
// only (the experts of one wave of a streamed prefill; the others' outputs are not computed yet).
// Token t (grid z) of a chunk: x at x_offset + t·hidden, shared at t·hidden, out at t·n_used·hidden, its selection at
// sel_offset + t·(2·n_used + 2).

struct AccumulateParams {
    hidden: u32,
    n_used: u32,
    x_offset: u32,
    sel_offset: u32,
    slot_base: u32,
}

@group(0) @binding(0) var<storage, read> acc_expert_out: array<f32>;
@group(0) @binding(1) var<storage, read> acc_sel: array<u32>;
@group(0) @binding(2) var<storage, read_write> acc_x: array<f32>;
@group(0) @binding(3) var<storage, read> acc_shared: array<f32>;
@group(0) @binding(4) var<uniform> acc_params: AccumulateParams;
@group(0) @binding(3) var<uniform> acc_routed_params: AccumulateParams;
@group(0) @binding(3) var<storage, read> acc_wave_slots: array<u32>;
@group(0) @binding(4) var<uniform> acc_wave_params: AccumulateParams;

fn routed_sum(h: u32, token: u32, p: AccumulateParams) -> f32 {
    let sel = p.sel_offset + token * (2u * p.n_used + 2u);
    let out = token * p.n_used * p.hidden + h;
    var sum = 0.0;
    // a constant bound, so the loads of every output are issued before the first is used
    for (var j = 0u; j < MAX_USED; j++) {
        if (j >= p.n_used) { continue; }
        sum += bitcast<f32>(acc_sel[sel + p.n_used + j]) * acc_expert_out[out + j * p.hidden];
    }
    return sum;
}

@compute @workgroup_size(256)
fn moe_accumulate(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) n_wg: vec3<u32>,
                  @builtin(local_invocation_index) lid: u32) {
    let p = acc_params;
    let h = (wg.x + wg.y * n_wg.x) * 256u + lid;
    let i = p.x_offset + wg.z * p.hidden + h;
    if (h < p.hidden && i < arrayLength(&acc_x)) {
        acc_x[i] = acc_x[i] + (routed_sum(h, wg.z, p) + acc_shared[wg.z * p.hidden + h]);
    }
}

@compute @workgroup_size(256)
fn moe_accumulate_routed(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) n_wg: vec3<u32>,
                         @builtin(local_invocation_index) lid: u32) {
    let p = acc_routed_params;
    let h = (wg.x + wg.y * n_wg.x) * 256u + lid;
    let i = p.x_offset + wg.z * p.hidden + h;
    if (h < p.hidden && i < arrayLength(&acc_x)) {
        acc_x[i] = acc_x[i] + routed_sum(h, wg.z, p);
    }
}

@compute @workgroup_size(256)
fn moe_accumulate_wave(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) n_wg: vec3<u32>,
                       @builtin(local_invocation_index) lid: u32) {
    let p = acc_wave_params;
    let h = (wg.x + wg.y * n_wg.x) * 256u + lid;
    let i = p.x_offset + wg.z * p.hidden + h;
    if (h >= p.hidden || i >= arrayLength(&acc_x)) { return; }
    let sel = p.sel_offset + wg.z * (2u * p.n_used + 2u);
    let out = wg.z * p.n_used * p.hidden + h;
    var sum = 0.0;
    for (var j = 0u; j < p.n_used; j++) {
        if (acc_wave_slots[p.slot_base + acc_sel[sel + j]] != NONE) {
            sum += bitcast<f32>(acc_sel[sel + p.n_used + j]) * acc_expert_out[out + j * p.hidden];
        }
    }
    acc_x[i] = acc_x[i] + sum;
}

// ── moe_group: the (token, expert) pairs of a chunk grouped by expert, for matmul_experts ──
// Pair p = t·n_used + j is token t's j-th selected expert. Writes into `group_out`: at list_at, the pairs sorted
// by expert (in any order within an expert: each pair's products do not depend on its neighbours); at 4 + 4·i,
// tile entry i = (pool slot, start in the list, pairs ≤ tile_tokens) for every expert that has a slot in
// `group_slots` (slot_base + expert; NONE = not in the pool, or not in this wave) and pairs; at 0, the entries.
// One workgroup.

struct GroupParams {
    tokens: u32,
    n_used: u32,
    sel_offset: u32,
    n_expert: u32,
    slot_base: u32,
    tile_tokens: u32,
    max_tiles: u32,
    list_at: u32,
}

@group(0) @binding(0) var<storage, read> group_sel: array<u32>;
@group(0) @binding(1) var<storage, read> group_slots: array<u32>;
@group(0) @binding(2) var<storage, read_write> group_out: array<u32>;
@group(0) @binding(3) var<uniform> group_params: GroupParams;

var<workgroup> group_counts: array<atomic<u32>, MAX_EXPERTS>;
var<workgroup> group_cursor: array<atomic<u32>, MAX_EXPERTS>;
var<workgroup> group_start: array<u32, MAX_EXPERTS>;
var<workgroup> group_first_tile: array<u32, MAX_EXPERTS>;

fn store_group(i: u32, v: u32) {
    if (i < arrayLength(&group_out)) { group_out[i] = v; }
}

fn pair_expert(pair: u32) -> u32 {
    let p = group_params;
    return group_sel[p.sel_offset + (pair / p.n_used) * (2u * p.n_used + 2u) + pair % p.n_used];
}

@compute @workgroup_size(256)
fn moe_group(@builtin(local_invocation_index) lid: u32) {
    let p = group_params;
    let pairs = p.tokens * p.n_used;
    for (var e = lid; e < p.n_expert; e += 256u) {
        atomicStore(&group_counts[e], 0u);
        atomicStore(&group_cursor[e], 0u);
    }
    workgroupBarrier();
    for (var pair = lid; pair < pairs; pair += 256u) {
        let e = pair_expert(pair);
        if (e < p.n_expert) { atomicAdd(&group_counts[e], 1u); }
    }
    workgroupBarrier();
    if (lid == 0u) {
        var start = 0u;
        var tiles = 0u;
        for (var e = 0u; e < p.n_expert; e++) {
            let n = atomicLoad(&group_counts[e]);
            group_start[e] = start;
            start += n;
            group_first_tile[e] = tiles;
            if (n > 0u && group_slots[p.slot_base + e] != NONE) {
                tiles += (n + p.tile_tokens - 1u) / p.tile_tokens;
            }
        }
        store_group(0u, min(tiles, p.max_tiles));
    }
    workgroupBarrier();
    for (var e = lid; e < p.n_expert; e += 256u) {
        let n = atomicLoad(&group_counts[e]);
        let slot = group_slots[p.slot_base + e];
        if (n > 0u && slot != NONE) {
            for (var first = 0u; first < n; first += max(p.tile_tokens, 1u)) {
                let tile = group_first_tile[e] + first / p.tile_tokens;
                if (tile < p.max_tiles) {
                    store_group(4u + 4u * tile, slot);
                    store_group(5u + 4u * tile, group_start[e] + first);
                    store_group(6u + 4u * tile, min(p.tile_tokens, n - first));
                    store_group(7u + 4u * tile, e);
                }
            }
        }
    }
    for (var pair = lid; pair < pairs; pair += 256u) {
        let e = pair_expert(pair);
        if (e < p.n_expert) {
            let at = group_start[e] + atomicAdd(&group_cursor[e], 1u);
            if (at < pairs) { store_group(p.list_at + at, pair); }
        }
    }
}

// ── add: x[x_offset + i] += y[y_offset + i] (residual adds) ──

struct AddParams {
    n: u32,
    x_offset: u32,
    y_offset: u32,
}

@group(0) @binding(0) var<storage, read_write> add_x: array<f32>;
@group(0) @binding(1) var<storage, read> add_y: array<f32>;
@group(0) @binding(2) var<uniform> add_params: AddParams;

@compute @workgroup_size(256)
fn add(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) n_wg: vec3<u32>,
       @builtin(local_invocation_index) lid: u32) {
    let i = linear_index(wg, n_wg, lid);
    let at = add_params.x_offset + i;
    if (i < add_params.n && at < arrayLength(&add_x)) {
        add_x[at] += add_y[add_params.y_offset + i];
    }
}
