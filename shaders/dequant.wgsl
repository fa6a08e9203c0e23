// Dequantisation of ggml blocks into f32, one invocation per output element.
// Blocks are read straight from their GGUF bytes (bound as u32 words); the arithmetic is ggml's, so the
// results equal the CPU reference in `quant` bit for bit (every scale × quant product is exact in f32).

struct Params {
    n_elements: u32,
    // byte offset of the first block inside `src`
    src_byte_offset: u32,
}

@group(0) @binding(0) var<storage, read> src: array<u32>;
@group(0) @binding(1) var<storage, read_write> dst: array<f32>;
@group(0) @binding(2) var<uniform> params: Params;

fn byte_at(i: u32) -> u32 {
    let b = params.src_byte_offset + i;
    return (src[b >> 2u] >> ((b & 3u) * 8u)) & 0xffu;
}

// an f16 at a 2-byte aligned byte offset
fn f16_at(i: u32) -> f32 {
    let b = params.src_byte_offset + i;
    let pair = unpack2x16float(src[b >> 2u]);
    return select(pair.x, pair.y, (b & 2u) != 0u);
}

fn element_index(wg: vec3<u32>, n_wg: vec3<u32>, lid: u32) -> u32 {
    return (wg.x + wg.y * n_wg.x) * 256u + lid;
}

fn store(e: u32, value: f32) {
    if (e < params.n_elements && e < arrayLength(&dst)) {
        dst[e] = value;
    }
}

// Q4_K: 256 elements in 144 bytes: d, dmin (f16), 12 bytes of packed 6-bit scales/mins, 128 bytes of nibbles.
fn q4k_scale_min(base: u32, s: u32) -> vec2<u32> {
    if (s < 4u) {
        return vec2<u32>(byte_at(base + 4u + s) & 63u, byte_at(base + 8u + s) & 63u);
    }
    let sc = (byte_at(base + 8u + s) & 15u) | ((byte_at(base + s) >> 6u) << 4u);
    let m = (byte_at(base + 8u + s) >> 4u) | ((byte_at(base + 4u + s) >> 6u) << 4u);
    return vec2<u32>(sc, m);
}

@compute @workgroup_size(256)
fn dequant_q4_k(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) n_wg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let e = element_index(wg, n_wg, lid);
    if (e >= params.n_elements) { return; }
    let base = (e / 256u) * 144u;
    let j = e % 256u;
    let chunk = j / 64u;
    let l = j % 64u;
    let q_byte = byte_at(base + 16u + chunk * 32u + (l % 32u));
    let high = l >= 32u;
    let q = select(q_byte & 15u, q_byte >> 4u, high);
    let sm = q4k_scale_min(base, chunk * 2u + select(0u, 1u, high));
    let d1 = f16_at(base) * f32(sm.x);
    let m1 = f16_at(base + 2u) * f32(sm.y);
    store(e, d1 * f32(q) - m1);
}

// Q6_K: 256 elements in 210 bytes: ql[128], qh[64], int8 scales[16], d (f16).
@compute @workgroup_size(256)
fn dequant_q6_k(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) n_wg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let e = element_index(wg, n_wg, lid);
    if (e >= params.n_elements) { return; }
    let base = (e / 256u) * 210u;
    let j = e % 256u;
    let half = j / 128u;          // which 128-element half
    let r = j % 128u;
    let quarter = r / 32u;        // 0..3: which of the four interleaved 32-runs
    let l = r % 32u;
    let ql = byte_at(base + half * 64u + l + select(0u, 32u, quarter == 1u || quarter == 3u));
    let qh = byte_at(base + 128u + half * 32u + l);
    let low4 = select(ql & 15u, ql >> 4u, quarter >= 2u);
    let q = i32(low4 | (((qh >> (2u * quarter)) & 3u) << 4u)) - 32;
    let sc_byte = byte_at(base + 192u + half * 8u + l / 16u + 2u * quarter);
    let sc = i32(sc_byte << 24u) >> 24u;  // sign-extend the int8 scale
    let d = f16_at(base + 208u);
    store(e, d * f32(sc) * f32(q));
}

// Q5_0: 32 elements in 22 bytes: d (f16), qh (u32, the fifth bits), 16 bytes of nibbles.
@compute @workgroup_size(256)
fn dequant_q5_0(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) n_wg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let e = element_index(wg, n_wg, lid);
    if (e >= params.n_elements) { return; }
    let base = (e / 32u) * 22u;
    let j = e % 32u;
    let qh = byte_at(base + 2u) | (byte_at(base + 3u) << 8u) | (byte_at(base + 4u) << 16u) | (byte_at(base + 5u) << 24u);
    let qs = byte_at(base + 6u + (j % 16u));
    let low4 = select(qs & 15u, qs >> 4u, j >= 16u);
    let q = i32(low4 | (((qh >> j) & 1u) << 4u)) - 16;
    store(e, f16_at(base) * f32(q));
}

// Q8_0: 32 elements in 34 bytes: d (f16), 32 int8.
@compute @workgroup_size(256)
fn dequant_q8_0(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) n_wg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let e = element_index(wg, n_wg, lid);
    if (e >= params.n_elements) { return; }
    let base = (e / 32u) * 34u;
    let q = i32(byte_at(base + 2u + e % 32u) << 24u) >> 24u;
    store(e, f16_at(base) * f32(q));
}
