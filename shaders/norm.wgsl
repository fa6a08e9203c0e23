// RMSNorm: one workgroup per row (a row is one token's vector: a few thousand values).

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

// y[y_offset + i] = x[x_offset + i] / √(mean x² + ε) · w[i]   (ggml rms_norm then mul)
@compute @workgroup_size(256)
fn rms_norm(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) n_wg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let row = wg.x + wg.y * n_wg.x;
    if (row >= p.rows) { return; }
    let x_at = p.x_offset + row * p.x_stride;
    let y_at = p.y_offset + row * p.y_stride;
    var acc = 0.0;
    for (var i = lid; i < p.n; i += WG) {
        let v = x[x_at + i];
        acc += v * v;
    }
    partial[lid] = acc;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) { partial[lid] += partial[lid + s]; }
        workgroupBarrier();
    }
    let scale = 1.0 / sqrt(partial[0] / f32(p.n) + p.eps);
    for (var i = lid; i < p.n; i += WG) {
        let out = y_at + i;
        if (out < arrayLength(&y)) { y[out] = (x[x_at + i] * scale) * w[i]; }
    }
}
