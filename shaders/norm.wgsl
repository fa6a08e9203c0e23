// RMSNorm: one workgroup per row (a row is one token's vector: a few thousand values).
//   rms_norm      y = x / √(mean x² + ε) · w   (ggml rms_norm then mul), rows of any length
//   moe_sum_norm  a decode token's MoE residual add and the next RMSNorm in one dispatch: x += Σ_j w_j·out_j +
//                 shared (moe.wgsl's moe_accumulate, the same sums in the same order), then y = rms_norm(x)·w

struct Params {
    n: u32,
    eps: f32,
    x_offset: u32,
    y_offset: u32,
    // rows (one workgroup each): row t at x_offset + t·x_stride, y_offset + t·y_stride
    rows: u32,
    x_stride: u32,
    y_stride: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

const WG: u32 = 256u;
var<workgroup> partial: array<f32, 256>;
// values per invocation a row may have to be held in registers (rows of up to 4096; norm.rs sizes moe_sum_norm's
// to its row): a row held is loaded once, all its loads issued before the first is used (a loop that uses each
// load before the next waits a memory latency per value). Those loads are unconditional, their index clamped into
// the row (a lane past its end loads a value it never uses): a load behind a branch is issued only once the
// branch is taken, so the driver issued them one latency apart.
const HELD: u32 = 16u;
const EXPERTS_AT_ONCE: u32 = 8u;

// Σ over the workgroup of every invocation's `value` (every invocation calls it, once per dispatch).
fn workgroup_sum(value: f32, lid: u32) -> f32 {
    partial[lid] = value;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) { partial[lid] += partial[lid + s]; }
        workgroupBarrier();
    }
    return partial[0];
}

// y[y_at + i] = v / √(mean v² + ε) · w[i] for a row of n values held as `v` (value i = lid + k·WG at v[k]).
// The weights are loaded before the reduction, so their latency passes behind it.
fn store_norm_held(v: array<f32, HELD>, n: u32, eps: f32, y_at: u32, lid: u32) {
    var acc = 0.0;
    var weight: array<f32, HELD>;
    for (var k = 0u; k < HELD; k++) {
        weight[k] = w[min(lid + k * WG, n - 1u)];
        if (lid + k * WG < n) { acc += v[k] * v[k]; }
    }
    let scale = 1.0 / sqrt(workgroup_sum(acc, lid) / f32(n) + eps);
    for (var k = 0u; k < HELD; k++) {
        let i = lid + k * WG;
        let out = y_at + i;
        if (i < n && out < arrayLength(&y)) { y[out] = (v[k] * scale) * weight[k]; }
    }
}

@compute @workgroup_size(256)
fn rms_norm(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) n_wg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let row = wg.x + wg.y * n_wg.x;
    if (row >= p.rows) { return; }
    let x_at = p.x_offset + row * p.x_stride;
    let y_at = p.y_offset + row * p.y_stride;
    if (p.n <= WG * HELD) {
        var v: array<f32, HELD>;
        for (var k = 0u; k < HELD; k++) {
            v[k] = x[x_at + min(lid + k * WG, p.n - 1u)];
        }
        store_norm_held(v, p.n, p.eps, y_at, lid);
        return;
    }
    var acc = 0.0;
    for (var i = lid; i < p.n; i += WG) {
        let value = x[x_at + i];
        acc += value * value;
    }
    let scale = 1.0 / sqrt(workgroup_sum(acc, lid) / f32(p.n) + p.eps);
    for (var i = lid; i < p.n; i += WG) {
        let out = y_at + i;
        if (out < arrayLength(&y)) { y[out] = (x[x_at + i] * scale) * w[i]; }
    }
}

// ── moe_sum_norm: one workgroup, rows of up to WG·HELD ──

struct SumNormParams {
    hidden: u32,
    n_used: u32,
    eps: f32,
    // where the shared expert's output starts in sum_shared
    shared_at: u32,
}

// the residual row, updated in place (rms_norm's x is read-only: this entry point binds its own)
@group(0) @binding(0) var<storage, read_write> sum_x: array<f32>;
// (w and y at 1 and 2) the experts' outputs in selection order, the selection (ids, then weights as f32 bits),
// the shared expert's output
@group(0) @binding(3) var<storage, read> sum_expert_out: array<f32>;
@group(0) @binding(4) var<storage, read> sum_sel: array<u32>;
@group(0) @binding(5) var<storage, read> sum_shared: array<f32>;
@group(0) @binding(6) var<uniform> sum_params: SumNormParams;

@compute @workgroup_size(256)
fn moe_sum_norm(@builtin(local_invocation_index) lid: u32) {
    let n = sum_params.hidden;
    let n_used = sum_params.n_used;
    let last = n - 1u;
    // the residual and the shared expert's output first, then expert by expert, each expert's values of the row
    // loaded together
    var v: array<f32, HELD>;
    var shared_out: array<f32, HELD>;
    for (var k = 0u; k < HELD; k++) {
        let i = min(lid + k * WG, last);
        v[k] = sum_x[i];
        shared_out[k] = sum_shared[sum_params.shared_at + i];
    }
    var routed: array<f32, HELD>;
    for (var j0 = 0u; j0 < n_used; j0 += EXPERTS_AT_ONCE) {
        // EXPERTS_AT_ONCE experts' loads in flight together: a loop of known length the driver unrolls. An
        // expert past n_used adds 0·(the last expert's values), which leaves every sum as it was
        for (var dj = 0u; dj < EXPERTS_AT_ONCE; dj++) {
            let j = min(j0 + dj, n_used - 1u);
            let weight = select(0.0, bitcast<f32>(sum_sel[n_used + j]), j0 + dj < n_used);
            for (var k = 0u; k < HELD; k++) {
                routed[k] += weight * sum_expert_out[j * n + min(lid + k * WG, last)];
            }
        }
    }
    for (var k = 0u; k < HELD; k++) {
        v[k] = v[k] + (routed[k] + shared_out[k]);
        let i = lid + k * WG;
        if (i < n && i < arrayLength(&sum_x)) { sum_x[i] = v[k]; }
    }
    store_norm_held(v, n, sum_params.eps, 0u, lid);
}
