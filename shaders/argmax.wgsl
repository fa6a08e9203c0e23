// The greedy pick: out[0] = index of the largest of x[0..n) (ties: the lower index), out[1] = its value bits.

struct Params {
    n: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@group(0) @binding(2) var<uniform> p: Params;

const WG: u32 = 256u;
var<workgroup> best_value: array<f32, 256>;
var<workgroup> best_index: array<u32, 256>;

@compute @workgroup_size(256)
fn argmax(@builtin(local_invocation_index) lid: u32) {
    var v = bitcast<f32>(0xff7fffffu); // -FLT_MAX (a decimal literal may round past it)
    var idx = 0xffffffffu;
    for (var i = lid; i < p.n; i += WG) {
        // strictly greater keeps the lowest index among equal values within this lane
        if (x[i] > v || idx == 0xffffffffu) { v = x[i]; idx = i; }
    }
    best_value[lid] = v;
    best_index[lid] = idx;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            let ov = best_value[lid + s];
            let oi = best_index[lid + s];
            if (oi != 0xffffffffu && (best_index[lid] == 0xffffffffu || ov > best_value[lid] || (ov == best_value[lid] && oi < best_index[lid]))) {
                best_value[lid] = ov;
                best_index[lid] = oi;
            }
        }
        workgroupBarrier();
    }
    if (lid == 0u && arrayLength(&out) >= 2u) {
        out[0] = best_index[0];
        out[1] = bitcast<u32>(best_value[0]);
    }
}
