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
// each group's two best scores, its score (their sum), its rank among the groups, and the groups by rank
var<workgroup> group_first: array<f32, MAX_GROUPS>;
var<workgroup> group_second: array<f32, MAX_GROUPS>;
var<workgroup> group_scores: array<f32, MAX_GROUPS>;
var<workgroup> group_rank: array<u32, MAX_GROUPS>;
var<workgroup> groups_by_rank: array<u32, MAX_GROUPS>;
// the experts that can be picked: the n_used + 1 best of each kept group, at (group rank, rank in the group)
var<workgroup> candidates: array<u32, MAX_EXPERTS>;
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

// Candidate a (score, index) beats b: a higher score, or an equal score and a lower index (a strict order).
fn beats(score_a: f32, index_a: u32, score_b: f32, index_b: u32) -> bool {
    return score_a > score_b || (score_a == score_b && index_a < index_b);
}

// Expert e's rank among the experts of its group (how many beat it), when e is an expert.
fn rank_in_group(e: u32, group_size: u32) -> u32 {
    if (e >= route_params.n_expert) { return NONE; }
    let first = (e / group_size) * group_size;
    let s = expert_scores[e];
    var rank = 0u;
    for (var f = first; f < first + group_size; f++) {
        if (beats(expert_scores[f], f, s, e)) { rank++; }
    }
    return rank;
}

// One workgroup per token; each invocation owns experts lid and lid + 256. Every choice is by rank (how many
// candidates beat one), with no rounds: each expert's rank in its group gives the groups' two best scores; each
// group's rank among the groups says whether it is kept; an expert among the n_used picks or the runner-up is
// beaten by none but the n_used best of each kept group (had a group n_used + 1 experts that beat it, it would
// be beaten by more than n_used), so its rank among those candidates is its rank among all kept experts.
@compute @workgroup_size(256)
fn moe_route(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) n_wg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let p = route_params;
    let token = wg.x + wg.y * n_wg.x;
    if (token >= p.tokens) { return; }
    route_token = token;
    let group_size = p.n_expert / p.n_group;
    // both experts' loads before either is used (the index clamped: a load behind a branch waits for it)
    let experts = vec2<u32>(lid, lid + 256u);
    let last = p.n_expert - 1u;
    let logits = vec2<f32>(route_logit(min(experts.x, last)), route_logit(min(experts.y, last)));
    let bias = vec2<f32>(route_bias[min(experts.x, last)], route_bias[min(experts.y, last)]);
    for (var c = 0u; c < 2u; c++) {
        if (experts[c] < p.n_expert) {
            let gate = sigmoid(logits[c]);
            expert_gates[experts[c]] = gate;
            expert_scores[experts[c]] = gate + bias[c];
        }
    }
    if (lid < MAX_GROUPS) {
        group_first[lid] = -3.4e38;
        group_second[lid] = -3.4e38;
    }
    if (lid <= MAX_USED) { picked[lid] = NONE; }
    workgroupBarrier();

    // a group scores the sum of its best two (the experts of rank 0 and 1 in it)
    let ranks = vec2<u32>(rank_in_group(experts.x, group_size), rank_in_group(experts.y, group_size));
    for (var c = 0u; c < 2u; c++) {
        let g = experts[c] / group_size;
        if (ranks[c] == 0u) { group_first[g] = expert_scores[experts[c]]; }
        if (ranks[c] == 1u) { group_second[g] = expert_scores[experts[c]]; }
    }
    workgroupBarrier();
    if (lid < p.n_group) { group_scores[lid] = group_first[lid] + group_second[lid]; }
    workgroupBarrier();
    if (lid < p.n_group) {
        let s = group_scores[lid];
        var rank = 0u;
        for (var g = 0u; g < p.n_group; g++) {
            if (beats(group_scores[g], g, s, lid)) { rank++; }
        }
        group_rank[lid] = rank;
        groups_by_rank[rank] = lid;
    }
    workgroupBarrier();

    let per_group = min(p.n_used + 1u, group_size);
    for (var c = 0u; c < 2u; c++) {
        if (ranks[c] < per_group) {
            let group_at = group_rank[experts[c] / group_size];
            if (group_at < p.n_group_used) { candidates[group_at * per_group + ranks[c]] = experts[c]; }
        }
    }
    workgroupBarrier();
    let n_candidates = p.n_group_used * per_group;
    for (var i = lid; i < n_candidates; i += 256u) {
        let e = candidates[i];
        let s = expert_scores[e];
        var rank = 0u;
        for (var m = 0u; m < n_candidates; m++) {
            let f = candidates[m];
            if (beats(expert_scores[f], f, s, e)) { rank++; }
        }
        if (rank <= p.n_used) { picked[rank] = e; }
    }
    workgroupBarrier();

    // pick j's weight, by invocation j (each sums the picks' gates in the same order)
    if (lid < p.n_used) {
        var sum = 0.0;
        for (var j = 0u; j < p.n_used; j++) {
            sum += expert_gates[picked[j]];
        }
        let denominator = max(sum, MIN_WEIGHT_SUM);
        var weight = expert_gates[picked[lid]];
        if (p.norm != 0u) {
            weight /= denominator;
        }
        if (p.scale != 0.0 && p.scale != 1.0) {
            weight *= p.scale;
        }
        store_sel(lid, picked[lid]);
        store_sel(p.n_used + lid, bitcast<u32>(weight));
    }
    if (lid == 0u) {
        var group_margin = INF_BITS;
        if (p.n_group_used < p.n_group) {
            group_margin = bitcast<u32>(group_scores[groups_by_rank[p.n_group_used - 1u]] - group_scores[groups_by_rank[p.n_group_used]]);
        }
        store_sel(2u * p.n_used, group_margin);
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
