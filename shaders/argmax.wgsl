// The greedy pick: out[0] = index of the largest of x[0..n) (ties: the lower index), out[1] = its value bits.
// Two dispatches of the same entry point, so a 157k-entry vocabulary is not one workgroup's serial walk:
//   stage 0: `parts` workgroups (at most PARTS; fewer for a short x, so each invocation has a few values: a CPU
//            WebGPU pays for every workgroup), workgroup g picks over x[g·WG ..] strided by parts·WG, into
//            out[2 + 2g ..];
//   stage 1: one workgroup picks among those `parts` partials, into out[0..2].

struct Params {
    n: u32,
    stage: u32,
    parts: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@group(0) @binding(2) var<uniform> p: Params;

const WG: u32 = 256u;
const PARTS: u32 = 256u;
const NONE: u32 = 0xffffffffu;
var<workgroup> best_value: array<f32, 256>;
var<workgroup> best_index: array<u32, 256>;

fn put(i: u32, v: u32) {
    if (i < arrayLength(&out)) { out[i] = v; }
}

@compute @workgroup_size(256)
fn argmax(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    var v = bitcast<f32>(0xff7fffffu); // -FLT_MAX (a decimal literal may round past it)
    var idx = NONE;
    if (p.stage == 0u) {
        for (var i = wg.x * WG + lid; i < p.n; i += clamp(p.parts, 1u, PARTS) * WG) {
            // strictly greater keeps the lowest index among equal values within this lane
            if (x[i] > v || idx == NONE) { v = x[i]; idx = i; }
        }
    } else if (lid < p.parts && 2u + 2u * lid + 1u < arrayLength(&out)) {
        idx = out[2u + 2u * lid];
        v = bitcast<f32>(out[3u + 2u * lid]);
    }
    best_value[lid] = v;
    best_index[lid] = idx;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            let ov = best_value[lid + s];
            let oi = best_index[lid + s];
            if (oi != NONE && (best_index[lid] == NONE || ov > best_value[lid] || (ov == best_value[lid] && oi < best_index[lid]))) {
                best_value[lid] = ov;
                best_index[lid] = oi;
            }
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        let at = select(0u, 2u + 2u * wg.x, p.stage == 0u);
        put(at, best_index[0]);
        put(at + 1u, bitcast<u32>(best_value[0]));
    }
}
