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

// Σ over the 32 values of task `sb` of the row at byte `row`, times x. `xb` is where the x of sub-block `sb`
// starts (the 32 consecutive values most types' tasks cover). Q4_K and Q6_K tasks instead cover the values one
// stretch of packed bytes holds, read as whole words: a task is 1/8 of a 256-value block either way, so every
// value is covered once and the lanes of a row read neighbouring words.
fn dot32(row: u32, sb: u32, xb: u32) -> f32 {
    var acc = 0.0;
    switch p.ty {
        case 12u: { // Q4_K: task t = bytes 16·(t%2).. of 64-value chunk t/2: low nibbles, then high (32 values on)
            let block = row + (sb / 8u) * 144u;
            let t = sb % 8u;
            let c = t / 2u;
            let dm = unpack2x16float(weights[block >> 2u]);
            let lo = q4_k_scale_min(block, 2u * c);
            let hi = q4_k_scale_min(block, 2u * c + 1u);
            let qw = (block + 16u + c * 32u + (t % 2u) * 16u) >> 2u;
            let xl = xb - t * 32u + c * 64u + (t % 2u) * 16u;
            var q_lo = 0.0;
            var q_hi = 0.0;
            var x_lo = 0.0;
            var x_hi = 0.0;
            for (var i = 0u; i < 4u; i++) {
                let w = weights[qw + i];
                for (var b = 0u; b < 4u; b++) {
                    let a = x[xl + 4u * i + b];
                    let z = x[xl + 32u + 4u * i + b];
                    let byte = w >> (8u * b);
                    q_lo += f32(byte & 15u) * a;
                    q_hi += f32((byte >> 4u) & 15u) * z;
                    x_lo += a;
                    x_hi += z;
                }
            }
            acc = dm.x * (lo.x * q_lo + hi.x * q_hi) - dm.y * (lo.y * x_lo + hi.y * x_hi);
        }
        case 14u: { // Q6_K: task t = values 8·(t%4).. of each quarter of half t/4 (4 scales, 8 values each)
            let block = row + (sb / 8u) * 210u;
            let t = sb % 8u;
            let half = t / 4u;
            let l0 = (t % 4u) * 8u;
            let xq = xb - t * 32u + half * 128u + l0;
            let ql = block + half * 64u + l0;
            let qh = block + 128u + half * 32u + l0;
            var a0 = 0.0;
            var a1 = 0.0;
            var a2 = 0.0;
            var a3 = 0.0;
            for (var i = 0u; i < 2u; i++) {
                let lo = w_u32_even(ql + 4u * i);
                let hi = w_u32_even(ql + 32u + 4u * i);
                let h = w_u32_even(qh + 4u * i);
                for (var b = 0u; b < 4u; b++) {
                    let s = 8u * b;
                    let hb = h >> s;
                    let xi = xq + 4u * i + b;
                    a0 += f32(i32(((lo >> s) & 15u) | ((hb & 3u) << 4u)) - 32) * x[xi];
                    a1 += f32(i32(((hi >> s) & 15u) | (((hb >> 2u) & 3u) << 4u)) - 32) * x[xi + 32u];
                    a2 += f32(i32(((lo >> (s + 4u)) & 15u) | (((hb >> 4u) & 3u) << 4u)) - 32) * x[xi + 64u];
                    a3 += f32(i32(((hi >> (s + 4u)) & 15u) | (((hb >> 6u) & 3u) << 4u)) - 32) * x[xi + 96u];
                }
            }
            let sc = block + 192u + half * 8u + l0 / 16u;
            let d = w_f16(block + 208u);
            acc = d * (f32(sign_extend8(w_byte(sc))) * a0 + f32(sign_extend8(w_byte(sc + 2u))) * a1
                     + f32(sign_extend8(w_byte(sc + 4u))) * a2 + f32(sign_extend8(w_byte(sc + 6u))) * a3);
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
