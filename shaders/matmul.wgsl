// Matrix-matrix products over ggml rows read straight from their GGUF bytes, for a chunk of tokens:
// Y[t][r] = Σ_i W[r, i]·X[t][i]. A workgroup computes a tile of 64 rows × 64 tokens. Per step of 32 columns
// (one sub-block in every block format) it decodes the tile's weights once into workgroup memory (8 values per
// invocation), loads the tile's inputs beside them, and each invocation accumulates 4 rows × 4 tokens. So a
// weight is decoded once per 64 tokens instead of once per token.
//   matmul          grid (row tile, token tile, batch b): the matrix at w_offset + b·w_stride bytes; token t reads
//                   x[x_offset + b·x_batch + t·x_stride ..] and writes y[y_offset + b·y_batch + t·y_stride + r]
//                   (one matrix, or one per head for MLA's absorbed products).
//   matmul_experts  grid (row tile, entry of the expert tile list written by moe_group): the entry's expert is read
//                   from its pool slot; the entry's tokens are pairs p = token·k + j from the list, reading x row
//                   p / x_div (at x_offset + row·x_stride) and writing y row p (at y_offset + p·y_stride).
// Prepended with quant.wgsl. Workgroup memory: 16 KiB (WebGPU's default limit). Every write is bounds-checked.

const TILE_ROWS: u32 = 64u;
const TILE_TOKENS: u32 = 64u;
const STEP: u32 = 32u;

struct Params {
    rows: u32,
    cols: u32,
    row_bytes: u32,
    ty: u32,
    w_offset: u32,
    w_stride: u32,
    x_offset: u32,
    x_stride: u32,
    x_batch: u32,
    y_offset: u32,
    y_stride: u32,
    y_batch: u32,
    tokens: u32,
    // experts only
    slot_bytes: u32,
    slots_per_chunk: u32,
    chunk: u32,
    x_div: u32,
    list_at: u32,
}

@group(0) @binding(0) var<storage, read> weights: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;

// [column k of the step][group of 4 rows] and [column k][group of 4 tokens]
var<workgroup> w_tile: array<vec4<f32>, 512>;
var<workgroup> x_tile: array<vec4<f32>, 512>;

// a little-endian u32 at any byte offset (two aligned loads at most)
fn w_word(b: u32) -> u32 {
    let i = b >> 2u;
    let s = (b & 3u) * 8u;
    if (s == 0u) { return weights[i]; }
    return (weights[i] >> s) | (weights[i + 1u] << (32u - s));
}

// Values col .. col+7 of the row starting at byte `row` (col is a multiple of 8), in ggml's arithmetic.
fn decode8(ty: u32, row: u32, col: u32) -> array<f32, 8> {
    var out: array<f32, 8>;
    switch ty {
        case 12u: { // Q4_K: 8 nibbles of one sub-block, one scale and min
            let block = row + (col / 256u) * 144u;
            let s = (col % 256u) / 32u;
            let sm = q4_k_scale_min(block, s);
            let d1 = w_f16(block) * sm.x;
            let m1 = w_f16(block + 2u) * sm.y;
            let qs = block + 16u + (s / 2u) * 32u + (col % 32u);
            let shift = (s % 2u) * 4u;
            let lo = w_word(qs);
            let hi = w_word(qs + 4u);
            for (var n = 0u; n < 4u; n++) {
                out[n] = d1 * f32((lo >> (8u * n + shift)) & 15u) - m1;
                out[n + 4u] = d1 * f32((hi >> (8u * n + shift)) & 15u) - m1;
            }
        }
        case 14u: { // Q6_K: 8 low nibbles and 2-bit highs, one int8 scale
            let block = row + (col / 256u) * 210u;
            let sb = (col % 256u) / 32u;
            let half = sb / 4u;
            let quarter = sb % 4u;
            let l0 = col % 32u;
            let ql = block + half * 64u + select(0u, 32u, quarter == 1u || quarter == 3u) + l0;
            let qh = block + 128u + half * 32u + l0;
            let ql_shift = select(0u, 4u, quarter >= 2u);
            let ds = w_f16(block + 208u) * f32(sign_extend8(w_byte(block + 192u + half * 8u + l0 / 16u + 2u * quarter)));
            let ql0 = w_word(ql);
            let ql1 = w_word(ql + 4u);
            let qh0 = w_word(qh);
            let qh1 = w_word(qh + 4u);
            for (var n = 0u; n < 4u; n++) {
                let a = i32(((ql0 >> (8u * n + ql_shift)) & 15u) | (((qh0 >> (8u * n + 2u * quarter)) & 3u) << 4u)) - 32;
                let b = i32(((ql1 >> (8u * n + ql_shift)) & 15u) | (((qh1 >> (8u * n + 2u * quarter)) & 3u) << 4u)) - 32;
                out[n] = ds * f32(a);
                out[n + 4u] = ds * f32(b);
            }
        }
        default: {
            for (var n = 0u; n < 8u; n++) {
                out[n] = row_value(ty, row, col + n);
            }
        }
    }
    return out;
}

// The products of one tile over all columns. Invocation lid decodes 8 columns of tile row lid / 4 and loads 8
// inputs of tile token lid / 4 (from x[x_base ..] when `loads`), then accumulates rows 4·(lid % 16) .. +3 for
// tokens 4·(lid / 16) .. +3 (when any of them is among the tile's `count`). Every invocation reaches the barriers.
fn tile_products(prm: Params, w_base: u32, row0: u32, x_base: u32, loads: bool, count: u32, lid: u32) -> array<vec4<f32>, 4> {
    let load_index = lid / 4u;
    let part = (lid % 4u) * 8u;
    let row = row0 + load_index;
    let row_ok = row < prm.rows;
    let row_at = w_base + row * prm.row_bytes;
    let row_group = lid % 16u;
    let token_group = lid / 16u;
    let computes = token_group * 4u < count;
    var acc: array<vec4<f32>, 4>;
    for (var k0 = 0u; k0 < prm.cols; k0 += STEP) {
        var w: array<f32, 8>;
        if (row_ok) { w = decode8(prm.ty, row_at, k0 + part); }
        for (var n = 0u; n < 8u; n++) {
            w_tile[(part + n) * 16u + load_index / 4u][load_index % 4u] = w[n];
        }
        for (var n = 0u; n < 8u; n++) {
            var v = 0.0;
            if (loads) { v = x[x_base + k0 + part + n]; }
            x_tile[(part + n) * 16u + load_index / 4u][load_index % 4u] = v;
        }
        workgroupBarrier();
        if (computes) {
            for (var k = 0u; k < STEP; k++) {
                let wv = w_tile[k * 16u + row_group];
                let xv = x_tile[k * 16u + token_group];
                acc[0] += wv * xv.x;
                acc[1] += wv * xv.y;
                acc[2] += wv * xv.z;
                acc[3] += wv * xv.w;
            }
        }
        workgroupBarrier();
    }
    return acc;
}

fn store(i: u32, v: f32) {
    if (i < arrayLength(&y)) { y[i] = v; }
}

// Writes this invocation's 4 rows of one token at y[base + r].
fn store_rows(prm: Params, base: u32, row0: u32, lid: u32, acc: vec4<f32>) {
    let r = row0 + (lid % 16u) * 4u;
    for (var c = 0u; c < 4u; c++) {
        if (r + c < prm.rows) { store(base + r + c, acc[c]); }
    }
}

// ---- dense (and per-head) products ----

@group(0) @binding(3) var<uniform> p: Params;

@compute @workgroup_size(256)
fn matmul(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let prm = p;
    let row0 = wg.x * TILE_ROWS;
    let t0 = wg.y * TILE_TOKENS;
    if (t0 >= prm.tokens || row0 >= prm.rows) { return; }
    let b = wg.z;
    let count = min(TILE_TOKENS, prm.tokens - t0);
    let load_index = lid / 4u;
    let x_base = prm.x_offset + b * prm.x_batch + (t0 + load_index) * prm.x_stride;
    let acc = tile_products(prm, prm.w_offset + b * prm.w_stride, row0, x_base, load_index < count, count, lid);
    for (var n = 0u; n < 4u; n++) {
        let token = (lid / 16u) * 4u + n;
        if (token < count) {
            store_rows(prm, prm.y_offset + b * prm.y_batch + (t0 + token) * prm.y_stride, row0, lid, acc[n]);
        }
    }
}

// ---- experts, from the tile list ----

// [0] entries in use; entry i at 4 + 4·i: (pool slot, start in the list, tokens); the list of pairs at list_at
@group(0) @binding(3) var<storage, read> groups: array<u32>;
@group(0) @binding(4) var<uniform> pe: Params;

@compute @workgroup_size(256)
fn matmul_experts(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let prm = pe;
    // the entry, made uniform through workgroup memory (as exact small floats; -1 = no entry)
    if (lid == 0u) {
        var info = vec4<f32>(-1.0, 0.0, 0.0, 0.0);
        if (wg.y < groups[0]) {
            let at = 4u + 4u * wg.y;
            info = vec4<f32>(f32(groups[at]), f32(groups[at + 1u]), f32(groups[at + 2u]), 0.0);
        }
        x_tile[0] = info;
    }
    let info = workgroupUniformLoad(&x_tile[0]);
    workgroupBarrier(); // everyone has read it before the tile loads overwrite it
    if (info.x < 0.0) { return; }
    let slot = u32(info.x);
    let row0 = wg.x * TILE_ROWS;
    if (slot / prm.slots_per_chunk != prm.chunk || row0 >= prm.rows) { return; }
    let start = u32(info.y);
    let count = min(u32(info.z), TILE_TOKENS);
    let load_index = lid / 4u;
    let loads = load_index < count;
    var x_base = 0u;
    if (loads) {
        x_base = prm.x_offset + (groups[prm.list_at + start + load_index] / prm.x_div) * prm.x_stride;
    }
    let w_base = (slot % prm.slots_per_chunk) * prm.slot_bytes + prm.w_offset;
    let acc = tile_products(prm, w_base, row0, x_base, loads, count, lid);
    for (var n = 0u; n < 4u; n++) {
        let token = (lid / 16u) * 4u + n;
        if (token < count) {
            let pair = groups[prm.list_at + start + token];
            store_rows(prm, prm.y_offset + pair * prm.y_stride, row0, lid, acc[n]);
        }
    }
}
