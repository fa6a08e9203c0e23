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

// ---- dequant_rows: the rows of token ids that lie in this buffer (embedding lookups of a chunk) ----
// Token t (grid z) with id in [first_row, first_row + rows) gets its row, at byte (id − first_row)·row_bytes, in
// dst[dst_offset + t·n_elements ..]; other ids are left to the other pieces of the tensor.

struct RowsParams {
    n_elements: u32,
    row_bytes: u32,
    ty: u32,
    dst_offset: u32,
    first_row: u32,
    rows: u32,
    tokens: u32,
}

@group(0) @binding(2) var<storage, read> rows_ids: array<u32>;
@group(0) @binding(3) var<uniform> rows_params: RowsParams;

@compute @workgroup_size(256)
fn dequant_rows(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) n_wg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let p = rows_params;
    let e = (wg.x + wg.y * n_wg.x) * 256u + lid;
    let t = wg.z;
    if (e >= p.n_elements || t >= p.tokens) { return; }
    let id = rows_ids[t];
    if (id < p.first_row || id - p.first_row >= p.rows) { return; }
    let out = p.dst_offset + t * p.n_elements + e;
    if (out < arrayLength(&dst)) {
        dst[out] = row_value(p.ty, (id - p.first_row) * p.row_bytes, e);
    }
}
