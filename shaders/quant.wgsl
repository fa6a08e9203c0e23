// Reading ggml blocks straight from their GGUF bytes. Included (prepended at compile time) by the kernels that
// read weights; they declare `weights: array<u32>` holding the raw bytes. Arithmetic is ggml's: f16 scales
// widened to f32, scale × quant products (exact in f32), then one rounding.

fn w_byte(b: u32) -> u32 {
    return (weights[b >> 2u] >> ((b & 3u) * 8u)) & 0xffu;
}

// an f16 at a 2-byte aligned byte offset
fn w_f16(b: u32) -> f32 {
    let pair = unpack2x16float(weights[b >> 2u]);
    return select(pair.x, pair.y, (b & 2u) != 0u);
}

// a little-endian u32 at any byte offset
fn w_u32(b: u32) -> u32 {
    return w_byte(b) | (w_byte(b + 1u) << 8u) | (w_byte(b + 2u) << 16u) | (w_byte(b + 3u) << 24u);
}

// a little-endian u32 at an even byte offset (Q6_K blocks are 210 bytes: every other row starts mid-word)
fn w_u32_even(b: u32) -> u32 {
    let i = b >> 2u;
    if ((b & 2u) == 0u) { return weights[i]; }
    return (weights[i] >> 16u) | (weights[i + 1u] << 16u);
}

fn sign_extend8(v: u32) -> i32 {
    return i32(v << 24u) >> 24;
}

// Q4_K (256 values, 144 bytes): the 6-bit scale and min of sub-block s (0..8).
fn q4_k_scale_min(block: u32, s: u32) -> vec2<f32> {
    if (s < 4u) {
        return vec2<f32>(f32(w_byte(block + 4u + s) & 63u), f32(w_byte(block + 8u + s) & 63u));
    }
    let sc = (w_byte(block + 8u + s) & 15u) | ((w_byte(block + s) >> 6u) << 4u);
    let m = (w_byte(block + 8u + s) >> 4u) | ((w_byte(block + 4u + s) >> 6u) << 4u);
    return vec2<f32>(f32(sc), f32(m));
}

// Value j (0..256) of a Q4_K block.
fn q4_k_value(block: u32, j: u32) -> f32 {
    let chunk = j / 64u;
    let l = j % 64u;
    let high = l >= 32u;
    let q_byte = w_byte(block + 16u + chunk * 32u + (l % 32u));
    let q = select(q_byte & 15u, q_byte >> 4u, high);
    let sm = q4_k_scale_min(block, chunk * 2u + select(0u, 1u, high));
    return (w_f16(block) * sm.x) * f32(q) - w_f16(block + 2u) * sm.y;
}

// Value j (0..256) of a Q6_K block (210 bytes: ql[128], qh[64], int8 scales[16], d).
fn q6_k_value(block: u32, j: u32) -> f32 {
    let half = j / 128u;
    let r = j % 128u;
    let quarter = r / 32u;
    let l = r % 32u;
    let ql = w_byte(block + half * 64u + l + select(0u, 32u, quarter == 1u || quarter == 3u));
    let qh = w_byte(block + 128u + half * 32u + l);
    let low4 = select(ql & 15u, ql >> 4u, quarter >= 2u);
    let q = i32(low4 | (((qh >> (2u * quarter)) & 3u) << 4u)) - 32;
    let sc = sign_extend8(w_byte(block + 192u + half * 8u + l / 16u + 2u * quarter));
    return (w_f16(block + 208u) * f32(sc)) * f32(q);
}

// Value j (0..32) of a Q5_0 block (22 bytes: d, qh u32, qs[16]).
fn q5_0_value(block: u32, j: u32) -> f32 {
    let qh = w_u32(block + 2u);
    let qs = w_byte(block + 6u + (j % 16u));
    let low4 = select(qs & 15u, qs >> 4u, j >= 16u);
    return w_f16(block) * f32(i32(low4 | (((qh >> j) & 1u) << 4u)) - 16);
}

// Value j (0..32) of a Q8_0 block (34 bytes: d, int8 qs[32]).
fn q8_0_value(block: u32, j: u32) -> f32 {
    return w_f16(block) * f32(sign_extend8(w_byte(block + 2u + j)));
}

// ggml type ids, as in the GGUF tensor table
const TYPE_F32: u32 = 0u;
const TYPE_F16: u32 = 1u;
const TYPE_Q5_0: u32 = 6u;
const TYPE_Q8_0: u32 = 8u;
const TYPE_Q4_K: u32 = 12u;
const TYPE_Q6_K: u32 = 14u;

// Value i of a row of type `ty` starting at byte `row`.
fn row_value(ty: u32, row: u32, i: u32) -> f32 {
    switch ty {
        case 12u: { return q4_k_value(row + (i / 256u) * 144u, i % 256u); }
        case 14u: { return q6_k_value(row + (i / 256u) * 210u, i % 256u); }
        case 6u: { return q5_0_value(row + (i / 32u) * 22u, i % 32u); }
        case 8u: { return q8_0_value(row + (i / 32u) * 34u, i % 32u); }
        case 1u: { return w_f16(row + 2u * i); }
        default: { return bitcast<f32>(weights[(row >> 2u) + i]); }
    }
}
