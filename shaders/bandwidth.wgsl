// Reads every word of a buffer once (grid-stride, 16 bytes per load): the memory-read ceiling the benchmarks
// compare the products with. The xor of everything read decides a write nobody expects, so no compiler can
// drop the reads.

struct Params {
    n: u32, // vec4 words to read
}

@group(0) @binding(0) var<storage, read> data: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@group(0) @binding(2) var<uniform> p: Params;

@compute @workgroup_size(256)
fn read_all(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) n_wg: vec3<u32>) {
    let threads = n_wg.x * 256u;
    var acc = vec4<u32>(0u);
    for (var i = gid.x; i < p.n; i += threads) {
        acc ^= data[i];
    }
    let v = acc.x ^ acc.y ^ acc.z ^ acc.w;
    if (v == 0x9e3779b9u && arrayLength(&out) > 0u) { out[0] = v; }
}
