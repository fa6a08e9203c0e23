// RMSNorm and the greedy pick. One workgroup each (the vectors are one token's: a few thousand values).

struct Params {
    n: u32,
    eps: f32,
    x_offset: u32,
    y_offset: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

const WG: u32 = 256u;
var<workgroup> partial: array<f32, 256>;

// y[y_offset + i] = x[x_offset + i] / √(mean x² + ε) · w[i]   (ggml rms_norm then mul)
@compute @workgroup_size(256)
fn rms_norm(@builtin(local_invocation_index) lid: u32) {
    var acc = 0.0;
    for (var i = lid; i < p.n; i += WG) {
        let v = x[p.x_offset + i];
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
        let out = p.y_offset + i;
        if (out < arrayLength(&y)) { y[out] = (x[p.x_offset + i] * scale) * w[i]; }
    }
}
