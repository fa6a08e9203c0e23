// Dequantisation of whole rows into f32, one invocation per output element (embedding lookup, and the GPU's
// reading of every block format in tests). Prepended with quant.wgsl.

struct Params {
    n_elements: u32,
    // byte offset of the first block inside `weights`
    byte_offset: u32,
    // ggml type id
    ty: u32,
    // element offset of the output in `dst`
    dst_offset: u32,
}

@group(0) @binding(0) var<storage, read> weights: array<u32>;
@group(0) @binding(1) var<storage, read_write> dst: array<f32>;
@group(0) @binding(2) var<uniform> params: Params;

@compute @workgroup_size(256)
fn dequant(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) n_wg: vec3<u32>,
           @builtin(local_invocation_index) lid: u32) {
    let e = (wg.x + wg.y * n_wg.x) * 256u + lid;
    let out = params.dst_offset + e;
    if (e >= params.n_elements || out >= arrayLength(&dst)) { return; }
    dst[out] = row_value(params.ty, params.byte_offset, e);
}
