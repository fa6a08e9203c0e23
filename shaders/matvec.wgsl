// Matrix-vector products over ggml rows read straight from their GGUF bytes: y[r] = Σ_i W[r, i]·x[i].
// Each row gets `lanes` invocations (a power of two ≤ 64, about one per 32-value sub-block, so short rows do not
// leave most of a workgroup idle); a workgroup of 64 handles 64 / lanes rows. Each invocation takes sub-blocks
// (one scale each) in turn, and the row's lanes sum their partial dots. workgroup_id.z selects a matrix of a batch:
//   matvec          batch b: weights at w_offset + b·w_stride, x at x_offset + b·x_stride, y at y_offset + b·y_stride
//                   (per-head MLA products, or a single product with one batch)
//   matvec_experts  batch j: the j-th selected expert, sel[j], read from its slot of the expert pool
//                   (slots[slot_base + sel[j]]); only slots in this pool buffer (`chunk`) are computed here.
// Prepended with quant.wgsl; the bindings come with each entry point.

struct Params {
    rows: u32,
    cols: u32,
    row_bytes: u32,
    ty: u32,
    w_offset: u32,
    w_stride: u32,
    x_offset: u32,
    x_stride: u32,
    y_offset: u32,
    y_stride: u32,
    // experts only
    slot_bytes: u32,
    slot_base: u32,
    slots_per_chunk: u32,
    chunk: u32,
    // invocations per row (power of two ≤ 64)
    lanes: u32,
}

const WG: u32 = 64u;
var<workgroup> partial: array<f32, 64>;

// Σ over the 32 values of sub-block `sb` of the row at byte `row`, times x[xb ..].
fn dot32(row: u32, sb: u32, xb: u32) -> f32 {
    var acc = 0.0;
    switch p.ty {
        case 12u: { // Q4_K
            let block = row + (sb / 8u) * 144u;
            let s = sb % 8u;
            let sm = q4_k_scale_min(block, s);
            let d1 = w_f16(block) * sm.x;
            let m1 = w_f16(block + 2u) * sm.y;
            let qs = block + 16u + (s / 2u) * 32u;
            let shift = (s % 2u) * 4u;
            for (var l = 0u; l < 32u; l++) {
                let q = (w_byte(qs + l) >> shift) & 15u;
                acc += (d1 * f32(q) - m1) * x[xb + l];
            }
        }
        case 14u: { // Q6_K
            let block = row + (sb / 8u) * 210u;
            let half = (sb % 8u) / 4u;
            let quarter = sb % 4u;
            let d = w_f16(block + 208u);
            let ql = block + half * 64u + select(0u, 32u, quarter == 1u || quarter == 3u);
            let qh = block + 128u + half * 32u;
            let ql_shift = select(0u, 4u, quarter >= 2u);
            for (var l = 0u; l < 32u; l++) {
                let low4 = (w_byte(ql + l) >> ql_shift) & 15u;
                let q = i32(low4 | (((w_byte(qh + l) >> (2u * quarter)) & 3u) << 4u)) - 32;
                let sc = sign_extend8(w_byte(block + 192u + half * 8u + l / 16u + 2u * quarter));
                acc += (d * f32(sc)) * f32(q) * x[xb + l];
            }
        }
        default: {
            for (var l = 0u; l < 32u; l++) {
                acc += row_value(p.ty, row, sb * 32u + l) * x[xb + l];
            }
        }
    }
    return acc;
}

// The first row of this workgroup, and this invocation's row within the batch matrix.
fn first_row(wg: vec3<u32>, n_wg: vec3<u32>) -> u32 {
    return (wg.x + wg.y * n_wg.x) * (WG / p.lanes);
}

// This invocation's share of the dot product of a row (when `valid`), summed over the row's lanes.
// Every invocation reaches the barriers, valid or not, so control flow stays uniform.
fn row_dot(row: u32, xb: u32, lid: u32, valid: bool) -> f32 {
    let lane = lid % p.lanes;
    var acc = 0.0;
    if (valid) {
        for (var sb = lane; sb < p.cols / 32u; sb += p.lanes) {
            acc += dot32(row, sb, xb + sb * 32u);
        }
    }
    partial[lid] = acc;
    workgroupBarrier();
    for (var s = p.lanes / 2u; s > 0u; s >>= 1u) {
        if (lane < s) { partial[lid] += partial[lid + s]; }
        workgroupBarrier();
    }
    return partial[lid - lane];
}

fn store(i: u32, v: f32) {
    if (i < arrayLength(&y)) { y[i] = v; }
}

// ---- dense entry point (matvec_experts.wgsl replaces everything from here on) ----

@group(0) @binding(0) var<storage, read> weights: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

@compute @workgroup_size(64)
fn matvec(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) n_wg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let r = first_row(wg, n_wg) + lid / p.lanes;
    let valid = r < p.rows;
    let b = wg.z;
    let total = row_dot(p.w_offset + b * p.w_stride + r * p.row_bytes, p.x_offset + b * p.x_stride, lid, valid);
    if (valid && lid % p.lanes == 0u) { store(p.y_offset + b * p.y_stride + r, total); }
}
