// MLA (multi-head latent attention) in the absorbed form, one decode step, all f32.
// A cache row is [c (rank) | RoPE(k_pe) (rope_dim)]; the value of a row is its first `rank` floats (c).
// Every write is bounds-checked against the logical size and arrayLength: out-of-bounds writes are dropped on
// Vulkan but clamped onto the last element by Chromium.

// ── RoPE, ggml mode NORM: adjacent pairs (x_2p, x_2p+1) rotated by θ_p = pos·step^p ──

// ggml builds θ by repeated f32 multiplication (θ_0 = pos, θ_p+1 = θ_p·step), so do the same.
fn rope_theta(pos: u32, pair: u32, step: f32) -> f32 {
    var theta = f32(pos);
    for (var i = 0u; i < pair; i++) {
        theta *= step;
    }
    return theta;
}

// (cos θ, sin θ) to about 1e-7 for |θ| < 2^18·π/2. The built-ins promise only 2^-11 absolute near zero and
// lose more on large arguments, while θ_0 = pos reaches the context length.
fn cos_sin(theta: f32) -> vec2<f32> {
    let k = round(theta * 0.63661977236758134); // nearest multiple of π/2
    // θ − k·π/2 with π/2 split in pieces: the first three have 6 significant bits, so k·piece is exact for k < 2^18
    var x = theta - k * 1.5625;
    x -= k * 0.008056640625;
    x -= k * 0.00023651123046875;
    x -= k * 3.1749393656355096e-06;
    x -= k * 6.223371969669989e-14;
    // minimax polynomials on [−π/4, π/4] (Cephes sinf/cosf)
    let z = x * x;
    let s = ((-1.9515295891e-4 * z + 8.3321608736e-3) * z - 1.6666654611e-1) * z * x + x;
    let c = ((2.443315711809948e-5 * z - 1.388731625493765e-3) * z + 4.166664568298827e-2) * z * z - 0.5 * z + 1.0;
    switch ((i32(k) % 4 + 4) % 4) {
        case 0: { return vec2<f32>(c, s); }
        case 1: { return vec2<f32>(-s, c); }
        case 2: { return vec2<f32>(-c, -s); }
        default: { return vec2<f32>(s, -c); }
    }
}

fn rope_pair(x: vec2<f32>, pos: u32, pair: u32, step: f32) -> vec2<f32> {
    let cs = cos_sin(rope_theta(pos, pair, step));
    return vec2<f32>(x.x * cs.x - x.y * cs.y, x.x * cs.y + x.y * cs.x);
}

// ── mla_kv_row: cache[pos] = [RMSNorm(c_raw)·norm_w | RoPE(k_pe, pos)] from kv = [c_raw (rank) | k_pe (rope_dim)] ──

struct KvRowParams {
    pos: u32,
    rank: u32,
    rope_dim: u32,
    eps: f32,
    rope_step: f32,
    // tokens (one workgroup each): token t's kv at kv_offset + t·(rank + rope_dim), written to row pos + t
    tokens: u32,
    kv_offset: u32,
}

@group(0) @binding(0) var<storage, read> kv: array<f32>;
@group(0) @binding(1) var<storage, read> kv_norm_w: array<f32>;
@group(0) @binding(2) var<storage, read_write> kv_cache: array<f32>;
@group(0) @binding(3) var<uniform> kv_params: KvRowParams;

var<workgroup> kv_sum_sq: array<f32, 256>;

fn store_cache(p: KvRowParams, row_start: u32, i: u32, value: f32) {
    let at = row_start + i;
    if (i < p.rank + p.rope_dim && at < arrayLength(&kv_cache)) {
        kv_cache[at] = value;
    }
}

// One workgroup per token.
@compute @workgroup_size(256)
fn mla_kv_row(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) n_wg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let token = wg.x + wg.y * n_wg.x;
    if (token >= kv_params.tokens) { return; }
    kv_row(kv_params, token, lid);
}

// Token `token`'s cache row, by the whole workgroup (it has barriers: call from uniform control flow).
fn kv_row(row: KvRowParams, token: u32, lid: u32) {
    let rank = row.rank;
    let kv_at = row.kv_offset + token * (rank + row.rope_dim);
    let pos = row.pos + token;
    var sum_sq = 0.0;
    for (var i = lid; i < rank; i += 256u) {
        sum_sq += kv[kv_at + i] * kv[kv_at + i];
    }
    kv_sum_sq[lid] = sum_sq;
    workgroupBarrier();
    for (var stride = 128u; stride > 0u; stride >>= 1u) {
        if (lid < stride) {
            kv_sum_sq[lid] += kv_sum_sq[lid + stride];
        }
        workgroupBarrier();
    }
    let scale = 1.0 / sqrt(kv_sum_sq[0] / f32(rank) + row.eps);
    let row_start = pos * (rank + row.rope_dim);
    for (var i = lid; i < rank; i += 256u) {
        store_cache(row, row_start, i, (kv[kv_at + i] * scale) * kv_norm_w[i]);
    }
    for (var pair = lid; pair < row.rope_dim / 2u; pair += 256u) {
        let i = rank + 2u * pair;
        let rotated = rope_pair(vec2<f32>(kv[kv_at + i], kv[kv_at + i + 1u]), pos, pair, row.rope_step);
        store_cache(row, row_start, i, rotated.x);
        store_cache(row, row_start, i + 1u, rotated.y);
    }
}

// ── mla_kv_row_rope_q: a decode step's mla_kv_row and mla_rope_q in one dispatch (one token; both read its
// projections, q at 0 and kv at kv_offset of one buffer): workgroup 0 writes the cache row, the others rotate
// q_pe, an invocation per (head, pair) ──

struct KvRopeParams {
    pos: u32,
    rank: u32,
    rope_dim: u32,
    eps: f32,
    rope_step: f32,
    kv_offset: u32,
    n_head: u32,
    d_nope: u32,
}

@group(0) @binding(3) var<storage, read_write> kv_rope_q_abs: array<f32>;
@group(0) @binding(4) var<uniform> kv_rope_params: KvRopeParams;

@compute @workgroup_size(256)
fn mla_kv_row_rope_q(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) n_wg: vec3<u32>,
                     @builtin(local_invocation_index) lid: u32) {
    let p = kv_rope_params;
    let w = wg.x + wg.y * n_wg.x;
    if (w == 0u) {
        kv_row(KvRowParams(p.pos, p.rank, p.rope_dim, p.eps, p.rope_step, 1u, p.kv_offset), 0u, lid);
        return;
    }
    let index = (w - 1u) * 256u + lid;
    if (index >= p.n_head * (p.rope_dim / 2u)) { return; }
    let at = q_pe_pair(index, p.d_nope, p.rank, p.rope_dim);
    let rotated = rope_pair(vec2<f32>(kv[at.x], kv[at.x + 1u]), p.pos, at.z, p.rope_step);
    // (at.y + 1 is in its head's q_pe part, which ends at n_head·(rank + rope_dim))
    if (at.y + 1u < arrayLength(&kv_rope_q_abs)) {
        kv_rope_q_abs[at.y] = rotated.x;
        kv_rope_q_abs[at.y + 1u] = rotated.y;
    }
}

// ── mla_rope_q: q_abs[h·(rank + rope_dim) + rank ..] = RoPE(q_pe_h, pos), q = per head [q_nope | q_pe] ──

struct RopeQParams {
    pos: u32,
    n_head: u32,
    d_nope: u32,
    rank: u32,
    rope_dim: u32,
    rope_step: f32,
    // token t (grid z) at position pos + t: its q at t·n_head·(d_nope + rope_dim), its q_abs at t·n_head·(rank + rope_dim)
    tokens: u32,
}

@group(0) @binding(0) var<storage, read> rope_q_in: array<f32>;
@group(0) @binding(1) var<storage, read_write> rope_q_abs: array<f32>;
@group(0) @binding(2) var<uniform> rope_q_params: RopeQParams;

fn store_q_abs(token: u32, at: u32, value: f32) {
    let p = rope_q_params;
    let row = p.n_head * (p.rank + p.rope_dim);
    if (at < row && token * row + at < arrayLength(&rope_q_abs)) {
        rope_q_abs[token * row + at] = value;
    }
}

// Where RoPE pair `index` (head index / (rope_dim/2), pair index % (rope_dim/2)) of a token's query is: its first
// value in the token's q (per head [q_nope | q_pe]), in its q_abs (per head [absorbed (rank) | q_pe]), and the pair.
fn q_pe_pair(index: u32, d_nope: u32, rank: u32, rope_dim: u32) -> vec3<u32> {
    let n_pairs = rope_dim / 2u;
    let head = index / n_pairs;
    let pair = index % n_pairs;
    return vec3<u32>(head * (d_nope + rope_dim) + d_nope + 2u * pair, head * (rank + rope_dim) + rank + 2u * pair, pair);
}

// One invocation per (head, pair), grid z per token.
@compute @workgroup_size(64)
fn mla_rope_q(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) n_wg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let p = rope_q_params;
    let n_pairs = p.rope_dim / 2u;
    let index = (wg.x + wg.y * n_wg.x) * 64u + lid;
    let token = wg.z;
    if (index >= p.n_head * n_pairs || token >= p.tokens) { return; }
    let at = q_pe_pair(index, p.d_nope, p.rank, p.rope_dim);
    let src = token * p.n_head * (p.d_nope + p.rope_dim) + at.x;
    let rotated = rope_pair(vec2<f32>(rope_q_in[src], rope_q_in[src + 1u]), p.pos + token, at.z, p.rope_step);
    store_q_abs(token, at.y, rotated.x);
    store_q_abs(token, at.y + 1u, rotated.y);
}

// ── mla_attention: out[h·rank + ρ] = Σ_t softmax_t(q_abs_h·cache_t·scale)·cache_t[ρ], t = 0..=pos ──
// One workgroup per (head, token, split). Rows are taken ATTN_WG at a time with an online (running-max) softmax,
// so any pos works without a score buffer: each invocation scores one row of the chunk against the query (kept
// in workgroup memory), the chunk's max and sum come from tree reductions, then each invocation accumulates the
// output dims ρ ≡ lid (mod ATTN_WG) over the chunk's rows (neighbouring invocations read neighbouring floats).
// Decode has only n_head workgroups, too few to fill a large GPU, so its rows are split (flash-decoding): split s
// takes rows [s·rows_per_split, (s+1)·rows_per_split) and writes its partial (max, sum, unnormalised output) for
// mla_attention_combine. With one split the workgroup writes the output itself.
const ATTN_WG: u32 = 256u;
const ATTN_DIMS_PER_LANE: u32 = 4u;              // so rank ≤ 1024
const ATTN_MAX_WIDTH: u32 = 1152u;               // rank + rope_dim
const ATTN_LOWEST: f32 = -3.4e38;

struct AttentionParams {
    pos: u32,
    n_head: u32,
    rank: u32,
    rope_dim: u32,
    scale: f32,
    // token t at position pos + t attends rows 0..=pos + t; its queries at t·n_head·(rank + rope_dim), its
    // outputs at t·n_head·rank
    tokens: u32,
    // grid z = token·splits + split; a partial is [max, sum, acc (rank)] at ((t·n_head + h)·splits + s)·(rank + 2)
    splits: u32,
    rows_per_split: u32,
}

@group(0) @binding(0) var<storage, read> attn_q_abs: array<f32>;
@group(0) @binding(1) var<storage, read> attn_cache: array<f32>;
@group(0) @binding(2) var<storage, read_write> attn_out: array<f32>;
@group(0) @binding(3) var<storage, read_write> attn_partials: array<f32>;
@group(0) @binding(4) var<uniform> attn_params: AttentionParams;

var<workgroup> attn_q: array<f32, ATTN_MAX_WIDTH>;
var<workgroup> attn_weights: array<f32, ATTN_WG>;
var<workgroup> attn_reduce: array<f32, ATTN_WG>;

// The max (is_max) or sum of every invocation's v; every invocation must call it (it has barriers).
fn attn_reduce_all(v: f32, lid: u32, is_max: bool) -> f32 {
    attn_reduce[lid] = v;
    workgroupBarrier();
    for (var s = ATTN_WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            let other = attn_reduce[lid + s];
            attn_reduce[lid] = select(attn_reduce[lid] + other, max(attn_reduce[lid], other), is_max);
        }
        workgroupBarrier();
    }
    let total = attn_reduce[0];
    workgroupBarrier(); // the next call overwrites attn_reduce
    return total;
}

fn store_partial(at: u32, value: f32) {
    if (at < arrayLength(&attn_partials)) {
        attn_partials[at] = value;
    }
}

@compute @workgroup_size(256)
fn mla_attention(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) n_wg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    let p = attn_params;
    let head = wg.x + wg.y * n_wg.x;
    let splits = max(p.splits, 1u);
    let token = wg.z / splits;
    let split = wg.z % splits;
    if (head >= p.n_head || token >= p.tokens) { return; } // uniform: the same for the whole workgroup
    let width = min(p.rank + p.rope_dim, ATTN_MAX_WIDTH);
    let q_start = (token * p.n_head + head) * width;
    for (var d = lid; d < width; d += ATTN_WG) {
        attn_q[d] = attn_q_abs[q_start + d];
    }
    workgroupBarrier();
    let n_rows = p.pos + token + 1u;
    var first_row = 0u;
    var end_row = n_rows;
    if (splits > 1u) {
        first_row = min(split * p.rows_per_split, n_rows);
        end_row = min(first_row + p.rows_per_split, n_rows);
    }
    var running_max = ATTN_LOWEST;
    var running_sum = 0.0;
    var acc: array<f32, ATTN_DIMS_PER_LANE>;
    for (var chunk_start = first_row; chunk_start < end_row; chunk_start += ATTN_WG) {
        let chunk_len = min(ATTN_WG, end_row - chunk_start);
        var score = ATTN_LOWEST;
        if (lid < chunk_len) {
            let row_start = (chunk_start + lid) * width;
            var dot = 0.0;
            for (var d = 0u; d < width; d++) {
                dot += attn_q[d] * attn_cache[row_start + d];
            }
            score = dot * p.scale;
        }
        let chunk_max = max(running_max, attn_reduce_all(score, lid, true));
        var weight = 0.0;
        if (lid < chunk_len) { weight = exp(score - chunk_max); }
        attn_weights[lid] = weight;
        let chunk_sum = attn_reduce_all(weight, lid, false); // its barriers also publish attn_weights
        let rescale = exp(running_max - chunk_max);
        running_sum = running_sum * rescale + chunk_sum;
        for (var j = 0u; j < ATTN_DIMS_PER_LANE; j++) {
            acc[j] *= rescale;
        }
        for (var row = 0u; row < chunk_len; row++) {
            let w = attn_weights[row];
            let row_start = (chunk_start + row) * width;
            for (var j = 0u; j < ATTN_DIMS_PER_LANE; j++) {
                let rho = lid + j * ATTN_WG;
                if (rho < p.rank) {
                    acc[j] += w * attn_cache[row_start + rho];
                }
            }
        }
        running_max = chunk_max;
        workgroupBarrier(); // the next chunk overwrites attn_weights
    }
    if (splits == 1u) {
        for (var j = 0u; j < ATTN_DIMS_PER_LANE; j++) {
            let rho = lid + j * ATTN_WG;
            let at = (token * p.n_head + head) * p.rank + rho;
            if (rho < p.rank && at < arrayLength(&attn_out)) {
                attn_out[at] = acc[j] / running_sum;
            }
        }
        return;
    }
    // an empty split leaves (lowest, 0, 0): the combine weighs it by exp(lowest − max) = 0
    let partial = ((token * p.n_head + head) * splits + split) * (p.rank + 2u);
    if (lid == 0u) {
        store_partial(partial, running_max);
        store_partial(partial + 1u, running_sum);
    }
    for (var j = 0u; j < ATTN_DIMS_PER_LANE; j++) {
        let rho = lid + j * ATTN_WG;
        if (rho < p.rank) {
            store_partial(partial + 2u + rho, acc[j]);
        }
    }
}

// ── mla_attention_combine: out[h·rank + ρ] = Σ_s e_s·acc_s[ρ] / Σ_s e_s·sum_s, e_s = exp(max_s − max) ──
// One workgroup per (head, token), over the partials mla_attention wrote (same params).

@group(0) @binding(0) var<storage, read> combine_partials: array<f32>;
@group(0) @binding(1) var<storage, read_write> combine_out: array<f32>;
@group(0) @binding(2) var<uniform> combine_params: AttentionParams;

@compute @workgroup_size(256)
fn mla_attention_combine(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) n_wg: vec3<u32>,
                         @builtin(local_invocation_index) lid: u32) {
    let p = combine_params;
    let head = wg.x + wg.y * n_wg.x;
    let token = wg.z;
    if (head >= p.n_head || token >= p.tokens) { return; }
    let stride = p.rank + 2u;
    let first = (token * p.n_head + head) * p.splits * stride;
    var max_all = ATTN_LOWEST;
    for (var s = 0u; s < p.splits; s++) {
        max_all = max(max_all, combine_partials[first + s * stride]);
    }
    var total = 0.0;
    for (var s = 0u; s < p.splits; s++) {
        let at = first + s * stride;
        total += exp(combine_partials[at] - max_all) * combine_partials[at + 1u];
    }
    for (var rho = lid; rho < p.rank; rho += ATTN_WG) {
        var mixed = 0.0;
        for (var s = 0u; s < p.splits; s++) {
            let at = first + s * stride;
            mixed += exp(combine_partials[at] - max_all) * combine_partials[at + 2u + rho];
        }
        let out_at = (token * p.n_head + head) * p.rank + rho;
        if (out_at < arrayLength(&combine_out)) {
            combine_out[out_at] = mixed / total;
        }
    }
}

// ── mla_softmax_rows: the prefill's scores, in place: row q (query q = t·n_head + h of token t at position
// first_pos + t) becomes softmax(scale·s) over its rows 0..=first_pos + t, and 0 after them up to `cols` ──
// (The chunked prefill computes all scores of a block of tokens as a matrix product with the cache rows,
// this, and the values as a second product: many tokens share every cache row, unlike a decode step.)

struct SoftmaxParams {
    first_pos: u32,
    n_head: u32,
    scale: f32,
    cols: u32,
    queries: u32,
}

@group(0) @binding(0) var<storage, read_write> sm_scores: array<f32>;
@group(0) @binding(1) var<uniform> sm_params: SoftmaxParams;

@compute @workgroup_size(256)
fn mla_softmax_rows(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) n_wg: vec3<u32>,
                    @builtin(local_invocation_index) lid: u32) {
    let p = sm_params;
    let q = wg.x + wg.y * n_wg.x;
    if (q >= p.queries) { return; } // uniform
    let n = min(p.first_pos + q / p.n_head + 1u, p.cols);
    let start = q * p.cols;
    var m = ATTN_LOWEST;
    for (var j = lid; j < n; j += ATTN_WG) {
        m = max(m, sm_scores[start + j] * p.scale);
    }
    let row_max = attn_reduce_all(m, lid, true);
    var sum = 0.0;
    for (var j = lid; j < n; j += ATTN_WG) {
        sum += exp(sm_scores[start + j] * p.scale - row_max);
    }
    let total = attn_reduce_all(sum, lid, false);
    for (var j = lid; j < p.cols; j += ATTN_WG) {
        let at = start + j;
        if (at < arrayLength(&sm_scores)) {
            var v = 0.0;
            if (j < n) { v = exp(sm_scores[at] * p.scale - row_max) / total; }
            sm_scores[at] = v;
        }
    }
}

// ── mla_head_gate: o[h·d_v + a] *= σ(gate_logits[gate_offset + h]) ──

struct HeadGateParams {
    n_head: u32,
    d_v: u32,
    gate_offset: u32,
}

@group(0) @binding(0) var<storage, read_write> gate_o: array<f32>;
@group(0) @binding(1) var<storage, read> gate_logits: array<f32>;
@group(0) @binding(2) var<uniform> gate_params: HeadGateParams;

@compute @workgroup_size(256)
fn mla_head_gate(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) n_wg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    let i = (wg.x + wg.y * n_wg.x) * 256u + lid;
    if (i < gate_params.n_head * gate_params.d_v && i < arrayLength(&gate_o)) {
        gate_o[i] *= 1.0 / (1.0 + exp(-gate_logits[gate_params.gate_offset + i / gate_params.d_v]));
    }
}
