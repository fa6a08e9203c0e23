// KDA (Kimi delta attention): the causal depthwise conv on q|k|v, the forget gate and β, the gated delta rule
// on the per-head state (llama.cpp's fused gated-delta-net order), and the per-head RMSNorm with the output
// gate; for one decode token all in kda_step, for a prefill chunk step by step. All f32.
// Every write is checked against the logical size and arrayLength: Chromium clamps an out-of-bounds write onto
// the last element instead of dropping it.

const WORKGROUP: u32 = 256u;

fn sigmoid(x: f32) -> f32 {
    return 1.0 / (1.0 + exp(-x));
}

// The wrappers spread large grids over x and y (see `Gpu::grid`).
fn workgroup_index(wg: vec3<u32>, n_wg: vec3<u32>) -> u32 {
    return wg.x + wg.y * n_wg.x;
}

// ---------------------------------------------------------------------------------------------------------------
// kda_gates: one invocation per channel of g; the first n_head invocations also write β.

struct GateParams {
    n_head: u32,
    head_dim: u32,
    lower_bound: f32,
    // token t (grid z): fa at t·D, β logits at t·n_head, outputs at t·(D + n_head)
    tokens: u32,
}

@group(0) @binding(0) var<storage, read> gate_fa: array<f32>;
@group(0) @binding(1) var<storage, read> gate_dt_bias: array<f32>;
@group(0) @binding(2) var<storage, read> gate_a: array<f32>;
@group(0) @binding(3) var<storage, read> gate_beta_logits: array<f32>;
@group(0) @binding(4) var<storage, read_write> gate_gb: array<f32>;
@group(0) @binding(5) var<uniform> gate_params: GateParams;

fn store_gate(token: u32, i: u32, value: f32) {
    let row = gate_params.n_head * (gate_params.head_dim + 1u);
    if (i < row && token * row + i < arrayLength(&gate_gb)) {
        gate_gb[token * row + i] = value;
    }
}

@compute @workgroup_size(256)
fn kda_gates(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) n_wg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let c = workgroup_index(wg, n_wg) * WORKGROUP + lid;
    let t = wg.z;
    let dim = gate_params.n_head * gate_params.head_dim;
    if (t >= gate_params.tokens) { return; }
    if (c < dim) {
        let a = gate_a[c / gate_params.head_dim];
        store_gate(t, c, gate_params.lower_bound * sigmoid(a * (gate_fa[t * dim + c] + gate_dt_bias[c])));
    }
    if (c < gate_params.n_head) {
        store_gate(t, dim + c, sigmoid(gate_beta_logits[t * gate_params.n_head + c]));
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Workgroup memory of the per-head kernels (one workgroup per head, head_dim ≤ WORKGROUP).

var<workgroup> sum_a: array<f32, WORKGROUP>;
var<workgroup> sum_b: array<f32, WORKGROUP>;
var<workgroup> q_hat: array<f32, WORKGROUP>;
var<workgroup> k_hat: array<f32, WORKGROUP>;
var<workgroup> decay: array<f32, WORKGROUP>;

// Tree sums of sum_a (and sum_b) into element 0; lanes at or beyond head_dim must have stored zeros.
fn tree_sum_a(lid: u32) {
    for (var stride = WORKGROUP / 2u; stride > 0u; stride >>= 1u) {
        if (lid < stride) { sum_a[lid] += sum_a[lid + stride]; }
        workgroupBarrier();
    }
}

fn tree_sum_ab(lid: u32) {
    for (var stride = WORKGROUP / 2u; stride > 0u; stride >>= 1u) {
        if (lid < stride) {
            sum_a[lid] += sum_a[lid + stride];
            sum_b[lid] += sum_b[lid + stride];
        }
        workgroupBarrier();
    }
}

// The delta rule's sums over a value column's DC_LANES lanes (aligned neighbours), in every lane of the column:
// through sum_a (u) or sum_b (o), a barrier each, lane order. The next call's writes to the same array come
// after the other's barrier, which every lane reaches only once it has read. Every invocation calls them.
// column sums:
fn column_sum_a(v: f32, lid: u32) -> f32 {
    sum_a[lid] = v;
    workgroupBarrier();
    let first = lid - lid % DC_LANES;
    var total = 0.0;
    for (var l = 0u; l < DC_LANES; l++) { total += sum_a[first + l]; }
    return total;
}
fn column_sum_b(v: f32, lid: u32) -> f32 {
    sum_b[lid] = v;
    workgroupBarrier();
    let first = lid - lid % DC_LANES;
    var total = 0.0;
    for (var l = 0u; l < DC_LANES; l++) { total += sum_b[first + l]; }
    return total;
}
// column sums end

// ---------------------------------------------------------------------------------------------------------------
// kda_head_norm_gate: one workgroup per head; lane j < head_dim owns element j.

struct NormGateParams {
    n_head: u32,
    head_dim: u32,
    eps: f32,
}

@group(0) @binding(0) var<storage, read> norm_o: array<f32>;
@group(0) @binding(1) var<storage, read> norm_w: array<f32>;
@group(0) @binding(2) var<storage, read> norm_z: array<f32>;
@group(0) @binding(3) var<storage, read_write> norm_y: array<f32>;
@group(0) @binding(4) var<uniform> norm_params: NormGateParams;

@compute @workgroup_size(256)
fn kda_head_norm_gate(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) n_wg: vec3<u32>,
                      @builtin(local_invocation_index) lid: u32) {
    let h = workgroup_index(wg, n_wg);
    if (h >= norm_params.n_head) { return; }
    let d = norm_params.head_dim;
    let i = h * d + lid;
    var o = 0.0;
    if (lid < d) { o = norm_o[i]; }
    sum_a[lid] = o * o;
    workgroupBarrier();
    tree_sum_a(lid);
    let inv_rms = 1.0 / sqrt(sum_a[0] / f32(d) + norm_params.eps);
    if (lid < d && i < norm_params.n_head * d && i < arrayLength(&norm_y)) {
        norm_y[i] = o * inv_rms * norm_w[lid] * sigmoid(norm_z[i]);
    }
}

// ---------------------------------------------------------------------------------------------------------------
// kda_step: a decode token's whole KDA core, one workgroup per head (a dispatch costs more than this work):
// 1. the conv (then SiLU) of the head's q, k and v channels: y_c = Σ_{i<K−1} w[K·c+i]·state[(K−1)·c+i] +
//    w[K·c+K−1]·x_c, the channel's state (its last K−1 inputs, oldest first) moved on by x_c;
// 2. the forget gate g_c = λ·σ(a_h·(f_a,c + dt_c)) (kda_gates' g) and β = σ(β logit);
// 3. the delta rule (kda_delta_chunk's for one token): q, k L2-normalised (x / max(‖x‖, ε)); with value column
//    j of S (state[h·d·d + j·d + i] = S[i][j]) reduced by DC_LANES lanes (lane l over i ≡ l mod DC_LANES): S
//    decays by e^g along i, u_j = Σ_i S[i][j] k̂_i, δ_j = β (v_j − u_j), S[i][j] += k̂_i δ_j, o_j = Σ_i S[i][j] q̂_i / √d;
// 4. kda_head_norm_gate: y = o / √(mean o² + ε) · ssm_norm · σ(z).

struct StepParams {
    n_head: u32,
    head_dim: u32,
    kernel_size: u32,
    eps: f32,
    lower_bound: f32,
    // in step_in (floats): q|k|v pre-conv at 0 (3·D, head-major each), then f_a, the β logits and z from these
    fa_offset: u32,
    beta_offset: u32,
    z_offset: u32,
    // in step_consts: the conv taps at 0 (K per channel of q|k|v, oldest first), then dt_bias (D), ssm_a
    // (n_head) and ssm_norm (head_dim) from these
    dt_offset: u32,
    a_offset: u32,
    norm_offset: u32,
}

@group(0) @binding(0) var<storage, read> step_in: array<f32>;
@group(0) @binding(1) var<storage, read> step_consts: array<f32>;
@group(0) @binding(2) var<storage, read_write> step_conv: array<f32>;
@group(0) @binding(3) var<storage, read_write> step_state: array<f32>;
@group(0) @binding(4) var<storage, read_write> step_out: array<f32>;
@group(0) @binding(5) var<uniform> step_params: StepParams;

var<workgroup> v_in: array<f32, WORKGROUP>;
// o_j of each value column, gathered for the head norm (lane j < head_dim owns j)
var<workgroup> o_column: array<f32, WORKGROUP>;

fn store_step_conv(i: u32, value: f32) {
    if (i < 3u * step_params.n_head * step_params.head_dim * (step_params.kernel_size - 1u) && i < arrayLength(&step_conv)) {
        step_conv[i] = value;
    }
}

fn store_step_state(i: u32, value: f32) {
    let d = step_params.head_dim;
    if (i < step_params.n_head * d * d && i < arrayLength(&step_state)) {
        step_state[i] = value;
    }
}

// Step 1 for channel c of q|k|v: the channel's last K−1 inputs (oldest first), loaded before any store (see
// the delta rule below), then the output, with the state moved on by the input. Loads here are unconditional,
// their indices clamped (a value past K−1 is loaded and never used): a load behind a branch is issued only once
// the branch is taken, so a loop of guarded loads waits a memory latency per load.
fn conv_past(c: u32) -> array<f32, MAX_CONV> {
    let past_len = step_params.kernel_size - 1u;
    let last = 3u * step_params.n_head * step_params.head_dim * past_len - 1u;
    var past: array<f32, MAX_CONV>;
    for (var i = 0u; i < MAX_CONV; i++) {
        past[i] = step_conv[min(past_len * c + min(i, past_len - 1u), last)];
    }
    return past;
}

fn step_conv_channel(c: u32, past: array<f32, MAX_CONV>) -> f32 {
    let past_len = step_params.kernel_size - 1u;
    let state_base = past_len * c;
    let w_base = step_params.kernel_size * c;
    let x = step_in[c];
    let tap_x = step_consts[w_base + past_len];
    var taps: array<f32, MAX_CONV>;
    for (var i = 0u; i < MAX_CONV; i++) {
        taps[i] = step_consts[w_base + min(i, past_len - 1u)];
    }
    var acc = 0.0;
    for (var i = 0u; i < MAX_CONV; i++) {
        if (i < past_len) { acc += taps[i] * past[i]; }
    }
    acc += tap_x * x;
    for (var i = 1u; i < MAX_CONV; i++) {
        if (i < past_len) { store_step_conv(state_base + i - 1u, past[i]); }
    }
    store_step_conv(state_base + past_len - 1u, x);
    return acc / (1.0 + exp(-acc));
}

// A lane's share of the state's value column `column` (head_base + j): key indices lane, lane + DC_LANES, ..
// Unconditional loads, the index clamped into the state (a lane past the head's end loads values it never uses),
// so the DC_SPAN loads are in flight together: behind a branch apiece they were issued a latency apart.
fn step_state_share(column: u32, lane: u32) -> array<f32, DC_SPAN> {
    let d = step_params.head_dim;
    let last = step_params.n_head * d * d - 1u;
    var s: array<f32, DC_SPAN>;
    for (var n = 0u; n < DC_SPAN; n++) {
        s[n] = step_state[min(column * d + lane + n * DC_LANES, last)];
    }
    return s;
}

@compute @workgroup_size(256)
fn kda_step(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) n_wg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let h = workgroup_index(wg, n_wg);
    if (h >= step_params.n_head) { return; }
    let d = step_params.head_dim;
    let dim = step_params.n_head * d;
    let head_base = h * d;
    // the delta rule's first value columns of the state, loaded first: their latency passes behind the conv
    let lane = lid % DC_LANES;
    let col = lid / DC_LANES;
    var next_share = step_state_share(head_base + col, lane);

    // the conv of this head's channels, the decay e^g per key index (kda_gates' g), and β
    var q = 0.0;
    var k = 0.0;
    if (lid < d) {
        let c = head_base + lid;
        let past_q = conv_past(c);
        let past_k = conv_past(dim + c);
        let past_v = conv_past(2u * dim + c);
        q = step_conv_channel(c, past_q);
        k = step_conv_channel(dim + c, past_k);
        v_in[lid] = step_conv_channel(2u * dim + c, past_v);
        let a = step_consts[step_params.a_offset + h];
        let g = step_params.lower_bound * sigmoid(a * (step_in[step_params.fa_offset + c] + step_consts[step_params.dt_offset + c]));
        decay[lid] = exp(g);
    }
    let beta = sigmoid(step_in[step_params.beta_offset + h]);

    // step 3: L2 norms of q and k, then the state update
    sum_a[lid] = q * q;
    sum_b[lid] = k * k;
    workgroupBarrier();
    tree_sum_ab(lid);
    q_hat[lid] = q * (1.0 / max(sqrt(sum_a[0]), step_params.eps));
    k_hat[lid] = k * (1.0 / max(sqrt(sum_b[0]), step_params.eps));
    workgroupBarrier();

    // kda_delta_chunk's division of S: DC_LANES lanes per value column, lane l taking key indices l, l + DC_LANES,
    // .. (so a column's lanes read neighbouring words), DC_COLS columns at a time. A lane loads its whole share
    // before using any of it and stores it after: loads and stores of the same buffer interleaved in a loop would
    // each wait for the one before (a latency apiece). The next columns' share is loaded before these are used.
    let inv_sqrt_d = 1.0 / sqrt(f32(d));
    for (var j0 = 0u; j0 < d; j0 += DC_COLS) {
        let j = j0 + col;
        let valid = j < d;
        let column = (head_base + j) * d;
        var s = next_share;
        if (j0 + DC_COLS < d) { next_share = step_state_share(head_base + j + DC_COLS, lane); }
        var u = 0.0;
        for (var n = 0u; n < DC_SPAN; n++) {
            let i = lane + n * DC_LANES;
            if (valid && i < d) {
                s[n] *= decay[i];
                u += s[n] * k_hat[i];
            }
        }
        let delta = beta * (v_in[min(j, WORKGROUP - 1u)] - column_sum_a(u, lid));
        var o_part = 0.0;
        for (var n = 0u; n < DC_SPAN; n++) {
            let i = lane + n * DC_LANES;
            if (valid && i < d) {
                s[n] += k_hat[i] * delta;
                o_part += s[n] * q_hat[i];
            }
        }
        for (var n = 0u; n < DC_SPAN; n++) {
            let i = lane + n * DC_LANES;
            if (valid && i < d) { store_step_state(column + i, s[n]); }
        }
        let o_total = column_sum_b(o_part, lid);
        if (valid && lane == 0u) { o_column[j] = o_total * inv_sqrt_d; }
    }
    // every column's o is in o_column
    workgroupBarrier();
    var o = 0.0;
    if (lid < d) { o = o_column[lid]; }

    // kda_head_norm_gate
    sum_a[lid] = o * o;
    workgroupBarrier();
    tree_sum_a(lid);
    let inv_rms = 1.0 / sqrt(sum_a[0] / f32(d) + step_params.eps);
    let out = head_base + lid;
    if (lid < d && out < dim && out < arrayLength(&step_out)) {
        let z = step_in[step_params.z_offset + out];
        step_out[out] = o * inv_rms * step_consts[step_params.norm_offset + lid] * sigmoid(z);
    }
}

// ---------------------------------------------------------------------------------------------------------------
// The chunked prefill: the same steps for the T tokens of a chunk, each equal to T decode steps in order.
// Token t's vectors sit at t·(row width): q|k|v at t·3D, g|β at t·(D + n_head), outputs at t·D (or t·3D).

// kda_conv_chunk: one invocation per (channel, block of CONV_BLOCK tokens), grid (channel group, token block).
// An invocation loads its tokens' inputs and the K−1 before them together (the chunk's, or the conv state's
// before the chunk), then sums each token's taps in the decode kernel's order. The invocations of token block 0
// alone read the conv state, and each writes its channel's new one after reading it (the chunk's last K−1
// inputs, read from x): no invocation reads a state another writes. (One invocation a channel through every
// token in order waited a memory latency a token: 1.1 ms a layer for a 2048-token chunk on the H200.)

struct ConvChunkParams {
    channels: u32,
    kernel_size: u32,
    tokens: u32,
}

@group(0) @binding(0) var<storage, read> cc_x: array<f32>;
@group(0) @binding(1) var<storage, read> cc_w: array<f32>;
@group(0) @binding(2) var<storage, read_write> cc_state: array<f32>;
@group(0) @binding(3) var<storage, read_write> cc_y: array<f32>;
@group(0) @binding(4) var<uniform> cc_params: ConvChunkParams;

const MAX_CONV: u32 = 8u;
const CONV_BLOCK: u32 = 8u;

// Channel c's input at chunk position s − (K−1) (s < K−1: the state's, oldest first).
fn conv_input(c: u32, s: u32, past_len: u32) -> f32 {
    if (s < past_len) { return cc_state[past_len * c + s]; }
    return cc_x[(s - past_len) * cc_params.channels + c];
}

@compute @workgroup_size(256)
fn kda_conv_chunk(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let p = cc_params;
    let c = wg.x * WORKGROUP + lid;
    let t0 = wg.y * CONV_BLOCK;
    if (c >= p.channels || t0 >= p.tokens || p.kernel_size > MAX_CONV) { return; }
    let past_len = p.kernel_size - 1u;
    var w: array<f32, MAX_CONV>;
    for (var i = 0u; i < MAX_CONV; i++) {
        if (i < p.kernel_size) { w[i] = cc_w[p.kernel_size * c + i]; }
    }
    // window[m]: the input at position t0 − (K−1) + m, for the block's tokens and the K−1 before
    var window: array<f32, CONV_BLOCK + MAX_CONV>;
    for (var m = 0u; m < CONV_BLOCK + MAX_CONV; m++) {
        if (m < CONV_BLOCK + past_len && t0 + m < p.tokens + past_len) { window[m] = conv_input(c, t0 + m, past_len); }
    }
    if (t0 == 0u) {
        // the new state, after this invocation's reads of the old: the inputs at chunk positions tokens − (K−1) ..
        // tokens − 1 (in conv_input's numbering tokens .. tokens + K − 2), all read before any is written
        var new_state: array<f32, MAX_CONV>;
        for (var i = 0u; i < MAX_CONV; i++) {
            if (i < past_len) { new_state[i] = conv_input(c, p.tokens + i, past_len); }
        }
        for (var i = 0u; i < past_len; i++) {
            let at = past_len * c + i;
            if (at < arrayLength(&cc_state)) { cc_state[at] = new_state[i]; }
        }
    }
    for (var tt = 0u; tt < CONV_BLOCK; tt++) {
        if (t0 + tt < p.tokens) {
            // the decode kernel's order: the past taps oldest first, then the current input
            var acc = 0.0;
            var current = 0.0;
            var w_current = 0.0;
            for (var i = 0u; i < MAX_CONV; i++) {
                if (i < past_len) { acc += w[i] * window[tt + i]; }
                if (i == past_len) {
                    current = window[tt + i];
                    w_current = w[i];
                }
            }
            acc += w_current * current;
            let out = (t0 + tt) * p.channels + c;
            if (out < arrayLength(&cc_y)) { cc_y[out] = acc / (1.0 + exp(-acc)); }
        }
    }
}

// kda_qk_norm: q and k of every (token, head) L2-normalised in place (x / max(‖x‖₂, eps), as kda_step does),
// one workgroup each, so the recurrence below needs no reductions for them.

struct QkNormParams {
    n_head: u32,
    head_dim: u32,
    eps: f32,
    tokens: u32,
}

@group(0) @binding(0) var<storage, read_write> qn_qkv: array<f32>;
@group(0) @binding(1) var<uniform> qn_params: QkNormParams;

@compute @workgroup_size(256)
fn kda_qk_norm(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) n_wg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let p = qn_params;
    let index = workgroup_index(wg, n_wg);
    if (index >= p.n_head * p.tokens) { return; }
    let t = index / p.n_head;
    let h = index % p.n_head;
    let d = p.head_dim;
    let dim = p.n_head * d;
    let q_at = t * 3u * dim + h * d + lid;
    let k_at = q_at + dim;
    var q = 0.0;
    var k = 0.0;
    if (lid < d) {
        q = qn_qkv[q_at];
        k = qn_qkv[k_at];
    }
    sum_a[lid] = q * q;
    sum_b[lid] = k * k;
    workgroupBarrier();
    tree_sum_ab(lid);
    if (lid < d && k_at < arrayLength(&qn_qkv)) {
        qn_qkv[q_at] = q * (1.0 / max(sqrt(sum_a[0]), p.eps));
        qn_qkv[k_at] = k * (1.0 / max(sqrt(sum_b[0]), p.eps));
    }
}

// kda_delta_chunk: the gated delta rule through the chunk's tokens, grid (column group, head). The value
// columns of S are independent (u_j, the update and o_j touch column j only), so a workgroup takes DC_COLS
// columns, DC_LANES invocations each, every invocation holding ≤ DC_SPAN key indices of its column (i ≡ lane mod
// DC_LANES, so a column's lanes read neighbouring words) in registers for the whole chunk. Per token: decay,
// u_j = Σ_i S[i][j] k̂_i, δ_j = β(v_j − u_j), S[i][j] += k̂_i δ_j, o_j = Σ_i S[i][j] q̂_i / √d — kda_step's order;
// q and k come normalised by kda_qk_norm.

const DC_LANES: u32 = 8u;
const DC_COLS: u32 = 32u;
const DC_SPAN: u32 = 32u; // so head_dim ≤ 256; kda.rs sets it to the model's head_dim / DC_LANES

struct DeltaChunkParams {
    n_head: u32,
    head_dim: u32,
    tokens: u32,
}

@group(0) @binding(0) var<storage, read> dc_qkv: array<f32>;
@group(0) @binding(1) var<storage, read> dc_gb: array<f32>;
@group(0) @binding(2) var<storage, read_write> dc_state: array<f32>;
@group(0) @binding(3) var<storage, read_write> dc_o: array<f32>;
@group(0) @binding(4) var<uniform> dc_params: DeltaChunkParams;

// The chunk's vectors staged in workgroup memory a block of tokens at a time (loaded together, neighbouring
// invocations reading neighbouring words), so a token's step reads no global memory: per token of the block,
// q̂ | k̂ | e^g of the head (3·head_dim), then the block's v of this workgroup's columns and its β.
const DC_STAGE: u32 = 3072u;
const DC_TOKENS: u32 = 8u;
var<workgroup> dc_stage: array<f32, DC_STAGE>;
var<workgroup> dc_v: array<f32, DC_TOKENS * DC_COLS>;
var<workgroup> dc_beta: array<f32, DC_TOKENS>;

// A block's values as an invocation loads them, before they are staged: its shares (value lid + r·WORKGROUP) of
// the block's q|k (count·2·head_dim ≤ 2/3 of DC_STAGE) and g (count·head_dim ≤ 1/3), one of its v and its β.
// The loads are unconditional, their indices clamped into the block (a value past it is loaded and never
// staged), so they are in flight together: the staging loop that loaded behind a bound apiece waited a memory
// latency per value. The next block's are loaded before this block's tokens are stepped through, so their
// latency passes behind that work.
const DC_QK_SHARE: u32 = 8u;
const DC_G_SHARE: u32 = 4u;
struct DeltaBlock {
    qk: array<f32, DC_QK_SHARE>,
    g: array<f32, DC_G_SHARE>,
    v: f32,
    beta: f32,
}

// Block `count` (≥ 1) tokens from t0 of head h, for the workgroup of value columns from j0.
fn load_delta_block(h: u32, j0: u32, t0: u32, count: u32, lid: u32) -> DeltaBlock {
    let d = dc_params.head_dim;
    let dim = dc_params.n_head * d;
    let gb_row = dim + dc_params.n_head;
    var b: DeltaBlock;
    for (var r = 0u; r < DC_QK_SHARE; r++) {
        let at = min(lid + r * WORKGROUP, count * 2u * d - 1u);
        let t = t0 + at / (2u * d);
        let within = at % (2u * d);
        b.qk[r] = dc_qkv[t * 3u * dim + (within / d) * dim + h * d + within % d];
    }
    for (var r = 0u; r < DC_G_SHARE; r++) {
        let at = min(lid + r * WORKGROUP, count * d - 1u);
        b.g[r] = dc_gb[(t0 + at / d) * gb_row + h * d + at % d];
    }
    let v_at = min(lid, count * DC_COLS - 1u);
    let jj = min(j0 + v_at % DC_COLS, d - 1u);
    b.v = dc_qkv[(t0 + v_at / DC_COLS) * 3u * dim + 2u * dim + h * d + jj];
    b.beta = dc_gb[(t0 + min(lid, count - 1u)) * gb_row + dim + h];
    return b;
}

// The block into workgroup memory: per token q̂ | k̂ | e^g, then v and β (every invocation calls it).
fn stage_delta_block(b: DeltaBlock, count: u32, lid: u32) {
    let d = dc_params.head_dim;
    let per_token = 3u * d;
    for (var r = 0u; r < DC_QK_SHARE; r++) {
        let at = lid + r * WORKGROUP;
        if (at < count * 2u * d) { dc_stage[(at / (2u * d)) * per_token + at % (2u * d)] = b.qk[r]; }
    }
    for (var r = 0u; r < DC_G_SHARE; r++) {
        let at = lid + r * WORKGROUP;
        if (at < count * d) { dc_stage[(at / d) * per_token + 2u * d + at % d] = exp(b.g[r]); }
    }
    if (lid < count * DC_COLS) { dc_v[lid] = b.v; }
    if (lid < count) { dc_beta[lid] = b.beta; }
}

@compute @workgroup_size(256)
fn kda_delta_chunk(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let p = dc_params;
    let h = wg.y;
    if (h >= p.n_head) { return; }
    let d = p.head_dim;
    let dim = p.n_head * d;
    let lane = lid % DC_LANES;
    let col = lid / DC_LANES;
    let j0 = wg.x * DC_COLS;
    let j = j0 + col;
    let valid = j < d;
    let column = (h * d + j) * d;
    // the lane's share of the state, loaded unconditionally (see DeltaBlock), the index clamped into the state
    let state_last = dim * d - 1u;
    var s: array<f32, DC_SPAN>;
    for (var n = 0u; n < DC_SPAN; n++) {
        s[n] = dc_state[min(column + lane + n * DC_LANES, state_last)];
    }
    let inv_sqrt_d = 1.0 / sqrt(f32(d));
    let per_token = 3u * d;
    let block = max(min(DC_STAGE / per_token, DC_TOKENS), 1u);
    var loaded: DeltaBlock;
    if (p.tokens > 0u) { loaded = load_delta_block(h, j0, 0u, min(block, p.tokens), lid); }
    for (var t0 = 0u; t0 < p.tokens; t0 += block) {
        let count = min(block, p.tokens - t0);
        // every read of the block before is done (with subgroup sums, no barrier per token orders them)
        workgroupBarrier();
        stage_delta_block(loaded, count, lid);
        workgroupBarrier();
        let t1 = t0 + block;
        if (t1 < p.tokens) { loaded = load_delta_block(h, j0, t1, min(block, p.tokens - t1), lid); }
        for (var tt = 0u; tt < count; tt++) {
            let q_at = tt * per_token;
            let k_at = q_at + d;
            let g_at = k_at + d;
            var u = 0.0;
            for (var n = 0u; n < DC_SPAN; n++) {
                let i = lane + n * DC_LANES;
                if (valid && i < d) {
                    let decayed = s[n] * dc_stage[g_at + i];
                    s[n] = decayed;
                    u += decayed * dc_stage[k_at + i];
                }
            }
            let delta = dc_beta[tt] * (dc_v[tt * DC_COLS + col] - column_sum_a(u, lid));
            var o = 0.0;
            for (var n = 0u; n < DC_SPAN; n++) {
                let i = lane + n * DC_LANES;
                if (valid && i < d) {
                    let updated = s[n] + dc_stage[k_at + i] * delta;
                    s[n] = updated;
                    o += updated * dc_stage[q_at + i];
                }
            }
            let o_total = column_sum_b(o, lid);
            if (valid && lane == 0u) {
                let out = (t0 + tt) * dim + h * d + j;
                if (out < arrayLength(&dc_o)) { dc_o[out] = o_total * inv_sqrt_d; }
            }
        }
    }
    for (var n = 0u; n < DC_SPAN; n++) {
        let i = lane + n * DC_LANES;
        let at = column + i;
        if (valid && i < d && at < arrayLength(&dc_state)) { dc_state[at] = s[n]; }
    }
}
