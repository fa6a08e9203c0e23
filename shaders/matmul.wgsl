// Matrix-matrix products over ggml rows read straight from their GGUF bytes, for a chunk of tokens:
// Y[t][r] = Σ_i W[r, i]·X[t][i]. Three tilings, each stepping through the columns 32 (or 16) at a time (within
// one sub-block in every block format), so a weight is decoded once per tile of tokens instead of once per token:
//   * big tiles (more than 64 tokens): 128 rows × 128 tokens, 8 rows × 8 tokens per invocation (matmul_big).
//   * wide tiles (many tokens): 64 rows × 64 tokens per workgroup; per step the workgroup decodes the tile's
//     weights once into workgroup memory (8 values per invocation) beside the tokens' inputs, and each
//     invocation accumulates 4 rows × 4 tokens. 16 KiB of workgroup memory (WebGPU's default limit).
//   * row tiles (a few tokens): 128 rows × 16 tokens per workgroup; each invocation decodes 32 values of its own
//     row into registers and applies them to the (up to) 16 tokens' inputs in workgroup memory (2 KiB).
// Entry points (grid x: row tile):
//   matmul          wide; grid (row tile, token tile, batch b): the matrix at w_offset + b·w_stride bytes; token t
//                   reads x[x_offset + b·x_batch + t·x_stride ..], writes y[y_offset + b·y_batch + t·y_stride + r]
//                   (one matrix, or one per head for MLA's absorbed products).
//   matmul_rows     the same with row tiles; matmul_big with big tiles.
//   matmul_experts  wide, the columns split among idle invocations for few pairs; grid (row tile, entry of the
//                   tile list written by moe_group): the entry's expert is read from its pool slot; the entry's
//                   tokens are pairs p = token·k + j from the list, reading x row p / x_div (at x_offset +
//                   row·x_stride) and writing y row p (at y_offset + p·y_stride).
//   matmul_experts_rows  the same with row tiles, for chunks of at most 16 tokens.
//   matmul_experts_blocks  the same with block tiles (64 rows × 16 pairs, weights decoded into registers);
//                   matmul_experts_blocks_near with a row's 4 invocations side by side; matmul_experts_blocks_tall
//                   with 128 rows, two per invocation (the engine's, for chunks whose experts average at most 32
//                   pairs).
//   matmul_sum_slices  y[y_offset + t·y_stride + r] = Σ_s partials[(s·tokens + t)·rows + r]: the column slices of
//                   a product split to fill the GPU (the slices are batches of the entries above).
// Prepended with quant.wgsl. Every write is bounds-checked.

// the matrices' ggml type: matmul.rs builds each type's kernels apart (as matvec.rs does), each with one type's code
const TY: u32 = 12u;
const TILE_ROWS: u32 = 64u;
const TILE_TOKENS: u32 = 64u;
const STEP: u32 = 32u;

struct Params {
    rows: u32,
    cols: u32,
    row_bytes: u32,
    // (the kernel's TY; matmul.rs fills it in all the same)
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
    // f32 weights stored by columns (0: by rows): W[r, i] at byte w_offset + 4·(i·col_stride + r), row_bytes 4
    col_stride: u32,
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

// One step's loads for an invocation, issued a step early (before the barrier-bound compute of the step before,
// which then hides their latency): the raw words that hold 8 weights of a tile row, columns col .. col+7, and 8
// inputs of a tile token. Q4_K: d|dmin, the 12 scale bytes, 8 nibbles; Q6_K: 8 low nibbles, 8 high pairs, the
// scale's word, d's; F32: the values; other types are decoded from the weights when staged.
struct Fetched {
    w0: vec4<u32>,
    w1: vec4<u32>,
    x0: vec4<f32>,
    x1: vec4<f32>,
}

fn fetch_step(prm: Params, row_ok: bool, row: u32, loads: bool, x_base: u32, col: u32) -> Fetched {
    var f: Fetched;
    if (row_ok) {
        if (prm.col_stride != 0u) {
            let at = (row >> 2u) + col * prm.col_stride;
            let cs = prm.col_stride;
            f.w0 = vec4<u32>(weights[at], weights[at + cs], weights[at + 2u * cs], weights[at + 3u * cs]);
            f.w1 = vec4<u32>(weights[at + 4u * cs], weights[at + 5u * cs], weights[at + 6u * cs], weights[at + 7u * cs]);
        } else {
            switch TY {
                case 12u: {
                    let block = row + (col / 256u) * 144u;
                    let s = (col % 256u) / 32u;
                    let qs = block + 16u + (s / 2u) * 32u + (col % 32u);
                    f.w0 = vec4<u32>(w_word(block), w_word(block + 4u), w_word(block + 8u), w_word(block + 12u));
                    f.w1 = vec4<u32>(w_word(qs), w_word(qs + 4u), 0u, 0u);
                }
                case 14u: {
                    let block = row + (col / 256u) * 210u;
                    let sb = (col % 256u) / 32u;
                    let half = sb / 4u;
                    let quarter = sb % 4u;
                    let l0 = col % 32u;
                    let ql = block + half * 64u + select(0u, 32u, quarter == 1u || quarter == 3u) + l0;
                    let qh = block + 128u + half * 32u + l0;
                    f.w0 = vec4<u32>(w_word(ql), w_word(ql + 4u), w_word(qh), w_word(qh + 4u));
                    f.w1 = vec4<u32>(w_word(block + 192u + half * 8u + l0 / 16u + 2u * quarter), w_word(block + 208u), 0u, 0u);
                }
                case 0u: {
                    let at = (row >> 2u) + col;
                    f.w0 = vec4<u32>(weights[at], weights[at + 1u], weights[at + 2u], weights[at + 3u]);
                    f.w1 = vec4<u32>(weights[at + 4u], weights[at + 5u], weights[at + 6u], weights[at + 7u]);
                }
                default: {}
            }
        }
    }
    if (loads) {
        let at = x_base + col;
        f.x0 = vec4<f32>(x[at], x[at + 1u], x[at + 2u], x[at + 3u]);
        f.x1 = vec4<f32>(x[at + 4u], x[at + 5u], x[at + 6u], x[at + 7u]);
    }
    return f;
}

// Byte j of the words a, b, c (the 12 scale bytes of a Q4_K block).
fn byte_of(a: u32, b: u32, c: u32, j: u32) -> u32 {
    let word = select(select(c, b, j < 8u), a, j < 4u);
    return (word >> ((j % 4u) * 8u)) & 0xffu;
}

// d·scale and dmin·min of sub-block s of a Q4_K block from its first 16 bytes (d|dmin, then the 12 scale bytes),
// as quant.wgsl's q4_k_scale_min reads them.
fn q4_k_fetched_scale_min(head: vec4<u32>, s: u32) -> vec2<f32> {
    var sc: u32;
    var mn: u32;
    if (s < 4u) {
        sc = byte_of(head.y, head.z, head.w, s) & 63u;
        mn = byte_of(head.y, head.z, head.w, s + 4u) & 63u;
    } else {
        sc = (byte_of(head.y, head.z, head.w, s + 4u) & 15u) | ((byte_of(head.y, head.z, head.w, s - 4u) >> 6u) << 4u);
        mn = (byte_of(head.y, head.z, head.w, s + 4u) >> 4u) | ((byte_of(head.y, head.z, head.w, s) >> 6u) << 4u);
    }
    let dm = unpack2x16float(head.x);
    return vec2<f32>(dm.x * f32(sc), dm.y * f32(mn));
}

// The 8 weights of a fetch (columns col .. col+7 of the row at byte `row`, zeros when not `row_ok`), in ggml's
// arithmetic.
fn decode_fetched(prm: Params, f: Fetched, row_ok: bool, row: u32, col: u32) -> array<f32, 8> {
    var out: array<f32, 8>;
    if (!row_ok) { return out; }
    // f32 by columns or by rows: the fetch holds the values
    let ty = select(TY, TYPE_F32, prm.col_stride != 0u);
    switch ty {
        case 12u: { // Q4_K: 8 nibbles of one sub-block, one scale and min
            let s = (col % 256u) / 32u;
            let dm = q4_k_fetched_scale_min(f.w0, s);
            let d1 = dm.x;
            let m1 = dm.y;
            let shift = (s % 2u) * 4u;
            for (var n = 0u; n < 4u; n++) {
                out[n] = d1 * f32((f.w1.x >> (8u * n + shift)) & 15u) - m1;
                out[n + 4u] = d1 * f32((f.w1.y >> (8u * n + shift)) & 15u) - m1;
            }
        }
        case 14u: { // Q6_K: 8 low nibbles and 2-bit highs, one int8 scale
            let quarter = ((col % 256u) / 32u) % 4u;
            let ql_shift = select(0u, 4u, quarter >= 2u);
            let ds = unpack2x16float(f.w1.y).x * f32(sign_extend8(f.w1.x & 0xffu));
            for (var n = 0u; n < 4u; n++) {
                let a = i32(((f.w0.x >> (8u * n + ql_shift)) & 15u) | (((f.w0.z >> (8u * n + 2u * quarter)) & 3u) << 4u)) - 32;
                let b = i32(((f.w0.y >> (8u * n + ql_shift)) & 15u) | (((f.w0.w >> (8u * n + 2u * quarter)) & 3u) << 4u)) - 32;
                out[n] = ds * f32(a);
                out[n + 4u] = ds * f32(b);
            }
        }
        case 0u: {
            for (var n = 0u; n < 4u; n++) {
                out[n] = bitcast<f32>(f.w0[n]);
                out[n + 4u] = bitcast<f32>(f.w1[n]);
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

// A fetched step into workgroup memory: its 8 weights of a tile row and 8 inputs of a tile token (zeros where
// the row or token is not the tile's), at [column of the step][group of 4] with `groups` groups of 4 per
// column; `slot` is the tile row and token the invocation loads, `part` its first column within the step.
fn stage_step(prm: Params, f: Fetched, row_ok: bool, row_at: u32, col: u32, part: u32, slot: u32, groups: u32) {
    let w = decode_fetched(prm, f, row_ok, row_at, col);
    for (var n = 0u; n < 8u; n++) {
        w_tile[(part + n) * groups + slot / 4u][slot % 4u] = w[n];
    }
    for (var n = 0u; n < 4u; n++) {
        x_tile[(part + n) * groups + slot / 4u][slot % 4u] = f.x0[n];
        x_tile[(part + n + 4u) * groups + slot / 4u][slot % 4u] = f.x1[n];
    }
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
    var next = fetch_step(prm, row_ok, row_at, loads, x_base, part);
    for (var k0 = 0u; k0 < prm.cols; k0 += STEP) {
        stage_step(prm, next, row_ok, row_at, k0 + part, part, load_index, 16u);
        workgroupBarrier();
        if (k0 + STEP < prm.cols) { next = fetch_step(prm, row_ok, row_at, loads, x_base, k0 + STEP + part); }
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
    // constant indices only (a runtime index would put acc in memory instead of registers)
    let t = (lid / 16u) * 4u;
    let base = prm.y_offset + b * prm.y_batch + t0 * prm.y_stride;
    if (t < count) { store_rows(prm, base + t * prm.y_stride, row0, lid, acc[0]); }
    if (t + 1u < count) { store_rows(prm, base + (t + 1u) * prm.y_stride, row0, lid, acc[1]); }
    if (t + 2u < count) { store_rows(prm, base + (t + 2u) * prm.y_stride, row0, lid, acc[2]); }
    if (t + 3u < count) { store_rows(prm, base + (t + 3u) * prm.y_stride, row0, lid, acc[3]); }
}

// ---- big tiles (many tokens): 128 rows × 128 tokens, 16 columns per step, 8 rows × 8 tokens per invocation ----
// Twice the products per workgroup-memory read of the wide tile's 4 × 4; the same 16 KiB (w_tile and x_tile
// hold [column k of the step][group of 4 rows or tokens] for 32 groups).

const BIG_ROWS: u32 = 128u;
const BIG_TOKENS: u32 = 128u;
const BIG_STEP: u32 = 16u;

// One invocation's place in a big tile: what it loads (8 columns of tile row and token load_index, from part) and
// what it computes (rows 4·rg .. +3 and 64 + 4·rg .. +3, tokens 4·tg .. +3 and 64 + 4·tg .. +3).
struct BigTile {
    row0: u32,
    t0: u32,
    b: u32,
    count: u32,
    load_index: u32,
    part: u32,
    row_ok: bool,
    row_at: u32,
    loads: bool,
    x_base: u32,
    rg: u32,
    tg: u32,
    computes: bool,
}

fn big_tile(prm: Params, wg: vec3<u32>, lid: u32) -> BigTile {
    var t: BigTile;
    t.row0 = wg.x * BIG_ROWS;
    t.t0 = wg.y * BIG_TOKENS;
    t.b = wg.z;
    t.count = min(BIG_TOKENS, max(prm.tokens, t.t0) - t.t0);
    t.load_index = lid / 2u;
    t.part = (lid % 2u) * 8u;
    t.row_ok = t.row0 + t.load_index < prm.rows;
    t.row_at = prm.w_offset + t.b * prm.w_stride + (t.row0 + t.load_index) * prm.row_bytes;
    t.loads = t.load_index < t.count;
    t.x_base = prm.x_offset + t.b * prm.x_batch + (t.t0 + t.load_index) * prm.x_stride;
    t.rg = lid % 16u;
    t.tg = lid / 16u;
    t.computes = t.tg * 4u < t.count;
    return t;
}

@compute @workgroup_size(256)
fn matmul_big(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let prm = p;
    // from the workgroup's id alone (a condition made of the struct would count as non-uniform, and Tint rejects
    // the barriers after it)
    if (wg.y * BIG_TOKENS >= prm.tokens || wg.x * BIG_ROWS >= prm.rows) { return; }
    let tile = big_tile(prm, wg, lid);
    let rg = tile.rg;
    let tg = tile.tg;
    var acc: array<vec4<f32>, 16>;
    var next = fetch_step(prm, tile.row_ok, tile.row_at, tile.loads, tile.x_base, tile.part);
    for (var k0 = 0u; k0 < prm.cols; k0 += BIG_STEP) {
        stage_step(prm, next, tile.row_ok, tile.row_at, k0 + tile.part, tile.part, tile.load_index, 32u);
        workgroupBarrier();
        if (k0 + BIG_STEP < prm.cols) { next = fetch_step(prm, tile.row_ok, tile.row_at, tile.loads, tile.x_base, k0 + BIG_STEP + tile.part); }
        if (tile.computes) {
            for (var k = 0u; k < BIG_STEP; k++) {
                let w0 = w_tile[k * 32u + rg];
                let w1 = w_tile[k * 32u + 16u + rg];
                let x0 = x_tile[k * 32u + tg];
                let x1 = x_tile[k * 32u + 16u + tg];
                // constant indices only: a runtime index would put acc in memory instead of registers
                acc[0] += w0 * x0.x;
                acc[1] += w0 * x0.y;
                acc[2] += w0 * x0.z;
                acc[3] += w0 * x0.w;
                acc[4] += w0 * x1.x;
                acc[5] += w0 * x1.y;
                acc[6] += w0 * x1.z;
                acc[7] += w0 * x1.w;
                acc[8] += w1 * x0.x;
                acc[9] += w1 * x0.y;
                acc[10] += w1 * x0.z;
                acc[11] += w1 * x0.w;
                acc[12] += w1 * x1.x;
                acc[13] += w1 * x1.y;
                acc[14] += w1 * x1.z;
                acc[15] += w1 * x1.w;
            }
        }
        workgroupBarrier();
    }
    big_store_all(prm, tile, acc);
}

// The tile's sums: acc[0..4] hold rows 4·rg .. +3 of tokens 4·tg .. +3, acc[4..8] of tokens 64 + 4·tg .. +3;
// acc[8..16] the same tokens' rows 64 + 4·rg .. +3.
fn big_store_all(prm: Params, tile: BigTile, acc: array<vec4<f32>, 16>) {
    let y_base = prm.y_offset + tile.b * prm.y_batch + tile.t0 * prm.y_stride;
    let r = tile.row0 + tile.rg * 4u;
    let t = tile.tg * 4u;
    big_store(prm, y_base, r, t, tile.count, acc[0], acc[8]);
    big_store(prm, y_base, r, t + 1u, tile.count, acc[1], acc[9]);
    big_store(prm, y_base, r, t + 2u, tile.count, acc[2], acc[10]);
    big_store(prm, y_base, r, t + 3u, tile.count, acc[3], acc[11]);
    big_store(prm, y_base, r, t + 64u, tile.count, acc[4], acc[12]);
    big_store(prm, y_base, r, t + 65u, tile.count, acc[5], acc[13]);
    big_store(prm, y_base, r, t + 66u, tile.count, acc[6], acc[14]);
    big_store(prm, y_base, r, t + 67u, tile.count, acc[7], acc[15]);
}

// Token `token` of a big tile: rows r .. r+3 from `low`, rows r+64 .. r+67 from `high`.
fn big_store(prm: Params, y_base: u32, r: u32, token: u32, count: u32, low: vec4<f32>, high: vec4<f32>) {
    if (token >= count) { return; }
    let at = y_base + token * prm.y_stride;
    for (var c = 0u; c < 4u; c++) {
        if (r + c < prm.rows) { store(at + r + c, low[c]); }
        if (r + 64u + c < prm.rows) { store(at + r + 64u + c, high[c]); }
    }
}

// ---- row tiles ----

const ROW_TILE: u32 = 128u;
const ROW_TOKENS: u32 = 16u;

// [tile token][column k of the step / 4]
var<workgroup> token_tile: array<vec4<f32>, 128>;

// The raw words of one sub-block of a row (values col .. col+31, col a multiple of 32), fetched a step early as
// fetch_step's are: Q4_K: its 8 words of nibbles in q[0..8], d|dmin and the 12 scale bytes in s; Q6_K: 8 words of
// low nibbles in q[0..8] and 8 of high pairs in q[8..16], the scales' word and d's word in s; other types are
// decoded from the weights.
struct Fetched32 {
    q: array<u32, 16>,
    s: vec4<u32>,
}

fn fetch32(ty: u32, row: u32, col: u32) -> Fetched32 {
    var f: Fetched32;
    switch ty {
        case 12u: {
            let block = row + (col / 256u) * 144u;
            let qs = block + 16u + (((col % 256u) / 32u) / 2u) * 32u;
            for (var i = 0u; i < 8u; i++) {
                f.q[i] = w_word(qs + 4u * i);
            }
            f.s = vec4<u32>(w_word(block), w_word(block + 4u), w_word(block + 8u), w_word(block + 12u));
        }
        case 14u: {
            let block = row + (col / 256u) * 210u;
            let sb = (col % 256u) / 32u;
            let half = sb / 4u;
            let quarter = sb % 4u;
            let ql = block + half * 64u + select(0u, 32u, quarter == 1u || quarter == 3u);
            let qh = block + 128u + half * 32u;
            for (var i = 0u; i < 8u; i++) {
                f.q[i] = w_word(ql + 4u * i);
                f.q[i + 8u] = w_word(qh + 4u * i);
            }
            f.s = vec4<u32>(w_word(block + 192u + half * 8u + 2u * quarter), w_word(block + 208u), 0u, 0u);
        }
        default: {}
    }
    return f;
}

// Values col .. col+31 (one sub-block) of the row starting at byte `row`, from its fetch.
fn decode_fetched32(ty: u32, f: Fetched32, row: u32, col: u32) -> array<f32, 32> {
    var out: array<f32, 32>;
    switch ty {
        case 12u: { // Q4_K: the sub-block's nibbles share 32 bytes with its neighbour's
            let s = (col % 256u) / 32u;
            let dm = q4_k_fetched_scale_min(f.s, s);
            let shift = (s % 2u) * 4u;
            for (var i = 0u; i < 8u; i++) {
                for (var n = 0u; n < 4u; n++) {
                    out[4u * i + n] = dm.x * f32((f.q[i] >> (8u * n + shift)) & 15u) - dm.y;
                }
            }
        }
        case 14u: { // Q6_K: two int8 scales of 16 values each
            let quarter = ((col % 256u) / 32u) % 4u;
            let ql_shift = select(0u, 4u, quarter >= 2u);
            let d = unpack2x16float(f.s.y).x;
            let ds0 = d * f32(sign_extend8(f.s.x & 0xffu));
            let ds1 = d * f32(sign_extend8((f.s.x >> 8u) & 0xffu));
            for (var i = 0u; i < 8u; i++) {
                let ds = select(ds0, ds1, i >= 4u);
                for (var n = 0u; n < 4u; n++) {
                    let q = i32(((f.q[i] >> (8u * n + ql_shift)) & 15u) | (((f.q[i + 8u] >> (8u * n + 2u * quarter)) & 3u) << 4u)) - 32;
                    out[4u * i + n] = ds * f32(q);
                }
            }
        }
        default: {
            for (var n = 0u; n < 32u; n++) {
                out[n] = row_value(ty, row, col + n);
            }
        }
    }
    return out;
}

// Row `row` (when `row_ok`) times the tile's `count` tokens. Invocation lid loads inputs 4·(lid % 8) .. +3 of the
// step for tile token lid / 8 (from x[x_base ..] when `loads`). Every invocation reaches the barriers.
fn row_products(prm: Params, row_at: u32, row_ok: bool, x_base: u32, loads: bool, count: u32, lid: u32) -> array<f32, 16> {
    let load_token = lid / 8u;
    let part = (lid % 8u) * 4u;
    var acc: array<f32, 16>;
    // each step's weights and inputs are fetched during the step before (see fetch_step)
    var next_w: Fetched32;
    var next_x = vec4<f32>(0.0);
    if (row_ok) { next_w = fetch32(TY, row_at, 0u); }
    if (loads) { next_x = vec4<f32>(x[x_base + part], x[x_base + part + 1u], x[x_base + part + 2u], x[x_base + part + 3u]); }
    for (var k0 = 0u; k0 < prm.cols; k0 += STEP) {
        token_tile[load_token * 8u + part / 4u] = next_x;
        let fetched = next_w;
        workgroupBarrier();
        let k1 = k0 + STEP;
        if (k1 < prm.cols) {
            if (row_ok) { next_w = fetch32(TY, row_at, k1); }
            if (loads) {
                let at = x_base + k1 + part;
                next_x = vec4<f32>(x[at], x[at + 1u], x[at + 2u], x[at + 3u]);
            }
        }
        if (row_ok) {
            let w = decode_fetched32(TY, fetched, row_at, k0);
            for (var n = 0u; n < ROW_TOKENS; n++) {
                if (n < count) {
                    var sum = 0.0;
                    for (var i = 0u; i < 8u; i++) {
                        let xv = token_tile[n * 8u + i];
                        sum += w[4u * i] * xv.x + w[4u * i + 1u] * xv.y + w[4u * i + 2u] * xv.z + w[4u * i + 3u] * xv.w;
                    }
                    acc[n] += sum;
                }
            }
        }
        workgroupBarrier();
    }
    return acc;
}

@compute @workgroup_size(128)
fn matmul_rows(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let prm = p;
    let row0 = wg.x * ROW_TILE;
    let t0 = wg.y * ROW_TOKENS;
    if (t0 >= prm.tokens || row0 >= prm.rows) { return; }
    let b = wg.z;
    let count = min(ROW_TOKENS, prm.tokens - t0);
    let row = row0 + lid;
    let load_token = lid / 8u;
    let x_base = prm.x_offset + b * prm.x_batch + (t0 + load_token) * prm.x_stride;
    let w_base = prm.w_offset + b * prm.w_stride;
    let acc = row_products(prm, w_base + row * prm.row_bytes, row < prm.rows, x_base, load_token < count, count, lid);
    if (row < prm.rows) {
        for (var n = 0u; n < ROW_TOKENS; n++) {
            if (n < count) { store(prm.y_offset + b * prm.y_batch + (t0 + n) * prm.y_stride + row, acc[n]); }
        }
    }
}

// ---- experts, from the tile list ----
// Wide tiles (64 rows × up to 64 of the expert's pairs) whose compute adapts to the pairs: with G groups of 4
// pairs, the 16 invocations that would have held the other token groups instead split the step's 32 columns S
// ways (S = 16 / G rounded up to a power of two), and the S partial sums are added at the end. So a tile of 4
// pairs keeps every invocation busy, as one of 64 does.

// [0] entries in use; entry i at 4 + 4·i: (pool slot, start in the list, pairs); the list of pairs at list_at
@group(0) @binding(3) var<storage, read> groups: array<u32>;
@group(0) @binding(4) var<uniform> pe: Params;

var<workgroup> entry_info: vec4<u32>;

// Entry `i` of the tile list as (pool slot, start in the list, pairs), made uniform for the barriers (slot
// u32::MAX: no entry). Every invocation calls it.
fn tile_entry(i: u32, lid: u32) -> vec4<u32> {
    if (lid == 0u) {
        var info = vec4<u32>(0xffffffffu, 0u, 0u, 0u);
        if (i < groups[0]) {
            let at = 4u + 4u * i;
            info = vec4<u32>(groups[at], groups[at + 1u], groups[at + 2u], 0u);
        }
        entry_info = info;
    }
    return workgroupUniformLoad(&entry_info);
}

// Whether a workgroup of rows from row0 has work in an entry: an entry with pairs, whose slot is in this
// dispatch's pool buffer (uniform, so a workgroup returns as a whole).
fn entry_runs(prm: Params, info: vec4<u32>, row0: u32) -> bool {
    return info.x != 0xffffffffu && info.x / prm.slots_per_chunk == prm.chunk && row0 < prm.rows && info.z != 0u;
}

// Where the entry's expert's matrix starts in this pool buffer (bytes), where the entry's pair at list entry
// `entry` reads its input (floats), and where it writes its output row (floats).
fn entry_weights(prm: Params, slot: u32) -> u32 {
    return (slot % prm.slots_per_chunk) * prm.slot_bytes + prm.w_offset;
}
fn pair_input(prm: Params, entry: u32) -> u32 {
    return prm.x_offset + (groups[prm.list_at + entry] / prm.x_div) * prm.x_stride;
}
fn pair_output(prm: Params, entry: u32) -> u32 {
    return prm.y_offset + groups[prm.list_at + entry] * prm.y_stride;
}

// Partial sum j (invocation·4 + token of its group) kept in the tiles' memory once the steps are done.
fn set_partial(j: u32, v: vec4<f32>) {
    if (j < 512u) { w_tile[j] = v; } else { x_tile[j - 512u] = v; }
}
fn partial(j: u32) -> vec4<f32> {
    if (j < 512u) { return w_tile[j]; }
    return x_tile[j - 512u];
}

@compute @workgroup_size(256)
fn matmul_experts(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let prm = pe;
    let info = tile_entry(wg.y, lid);
    let slot = info.x;
    let row0 = wg.x * TILE_ROWS;
    if (!entry_runs(prm, info, row0)) { return; }
    let start = info.y;
    let count = min(info.z, TILE_TOKENS);
    let token_groups = (count + 3u) / 4u;
    let split = 16u / (1u << (32u - countLeadingZeros(token_groups - 1u)));
    let width = STEP / split;

    let load_index = lid / 4u;
    let part = (lid % 4u) * 8u;
    let row = row0 + load_index;
    let row_ok = row < prm.rows;
    let w_base = entry_weights(prm, slot);
    let row_at = w_base + row * prm.row_bytes;
    let loads = load_index < count;
    var x_base = 0u;
    if (loads) {
        x_base = pair_input(prm, start + load_index);
    }
    let row_group = lid % 16u;
    let token_group = (lid / 16u) / split;
    let quarter = (lid / 16u) % split;
    let computes = token_group < token_groups;
    var acc: array<vec4<f32>, 4>;
    var next = fetch_step(prm, row_ok, row_at, loads, x_base, part);
    for (var k0 = 0u; k0 < prm.cols; k0 += STEP) {
        stage_step(prm, next, row_ok, row_at, k0 + part, part, load_index, 16u);
        workgroupBarrier();
        if (k0 + STEP < prm.cols) { next = fetch_step(prm, row_ok, row_at, loads, x_base, k0 + STEP + part); }
        if (computes) {
            for (var k = quarter * width; k < quarter * width + width; k++) {
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
    // constant indices into acc only (a runtime index would put it in memory instead of registers)
    if (split > 1u) {
        set_partial(lid * 4u, acc[0]);
        set_partial(lid * 4u + 1u, acc[1]);
        set_partial(lid * 4u + 2u, acc[2]);
        set_partial(lid * 4u + 3u, acc[3]);
        workgroupBarrier();
        if (quarter == 0u) {
            for (var q = 1u; q < split; q++) {
                let j = (lid + 16u * q) * 4u;
                acc[0] += partial(j);
                acc[1] += partial(j + 1u);
                acc[2] += partial(j + 2u);
                acc[3] += partial(j + 3u);
            }
        }
    }
    if (!computes || quarter != 0u) { return; }
    let t = token_group * 4u;
    store_pair(prm, start + t, t < count, row0, lid, acc[0]);
    store_pair(prm, start + t + 1u, t + 1u < count, row0, lid, acc[1]);
    store_pair(prm, start + t + 2u, t + 2u < count, row0, lid, acc[2]);
    store_pair(prm, start + t + 3u, t + 3u < count, row0, lid, acc[3]);
}

// The tile's rows of the pair at list entry `entry`, when `used`.
fn store_pair(prm: Params, entry: u32, used: bool, row0: u32, lid: u32, v: vec4<f32>) {
    if (!used) { return; }
    store_rows(prm, pair_output(prm, entry), row0, lid, v);
}

// Row tiles over the tile list, for chunks of at most ROW_TOKENS tokens (so an entry has at most that many pairs:
// a token selects an expert once): 128 rows of the entry's expert per workgroup, each invocation decoding 32
// values of its row at a time into registers, as matmul_rows does. Few pairs per expert leave a wide tile's
// invocations mostly idle and its barriers dear on a CPU adapter.
@compute @workgroup_size(128)
fn matmul_experts_rows(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let prm = pe;
    let info = tile_entry(wg.y, lid);
    let slot = info.x;
    let row0 = wg.x * ROW_TILE;
    if (!entry_runs(prm, info, row0)) { return; }
    let start = info.y;
    let count = min(info.z, ROW_TOKENS);
    let load_token = lid / 8u;
    let loads = load_token < count;
    var x_base = 0u;
    if (loads) {
        x_base = pair_input(prm, start + load_token);
    }
    let row = row0 + lid;
    let w_base = entry_weights(prm, slot);
    let acc = row_products(prm, w_base + row * prm.row_bytes, row < prm.rows, x_base, loads, count, lid);
    if (row < prm.rows) {
        for (var n = 0u; n < ROW_TOKENS; n++) {
            if (n < count) { store(pair_output(prm, start + n) + row, acc[n]); }
        }
    }
}

// ---- experts on block tiles ----
// 64 rows × up to 16 of the expert's pairs per workgroup, 128 columns (half a K-quant block) per step, the
// weights decoded into registers instead of workgroup memory. With a few pairs per expert, a wide tile spends its
// time decoding weights into workgroup memory for a handful of products each; here each invocation decodes 32
// weights a step, their scales once, and applies them to every pair straight from registers. Each of a row's 4
// invocations (j = 0..3) holds, within each 32-column sub-block of the step, columns 4j .. 4j+3 and 16+4j ..
// 16+4j+3; it reads its row's words itself, a step early. The 4 add their sums at the end. The pairs' inputs are
// staged in workgroup memory, 8 columns per invocation, in two buffers taken in turn (block_x: one barrier a step).

const BLOCK_ROWS: u32 = 64u;
const BLOCK_PAIRS: u32 = 16u;
const BLOCK_STEP: u32 = 128u;

// One step's raw words of an invocation's 32 weights. Q4_K: q = the 4 words of nibbles (bytes 16i + 4j of the
// half block's 64), a = d|dmin and the 12 scale bytes. Q6_K: q = the low-nibble words (quarter parity p,
// column half i at q[2p + i]), a = the 2 high-pair words and the half block's 8 int8 scales, b = d's word.
// Other types are decoded from the weights.
struct FetchedBlock {
    q: vec4<u32>,
    a: vec4<u32>,
    b: u32,
}

fn fetch_block(ty: u32, row: u32, j: u32, col: u32) -> FetchedBlock {
    var f: FetchedBlock;
    let half = (col % 256u) / 128u;
    switch ty {
        case 12u: {
            let block = row + (col / 256u) * 144u;
            let qs = block + 16u + half * 64u + 4u * j;
            f.q = vec4<u32>(w_word(qs), w_word(qs + 16u), w_word(qs + 32u), w_word(qs + 48u));
            f.a = vec4<u32>(w_word(block), w_word(block + 4u), w_word(block + 8u), w_word(block + 12u));
        }
        case 14u: {
            let block = row + (col / 256u) * 210u;
            let ql = block + half * 64u + 4u * j;
            let qh = block + 128u + half * 32u + 4u * j;
            let sc = block + 192u + half * 8u;
            f.q = vec4<u32>(w_word(ql), w_word(ql + 16u), w_word(ql + 32u), w_word(ql + 48u));
            f.a = vec4<u32>(w_word(qh), w_word(qh + 16u), w_word(sc), w_word(sc + 4u));
            f.b = w_word(block + 208u);
        }
        default: {}
    }
    return f;
}

// 4 weights of a Q4_K sub-block from its nibbles in `q` (low or high by `shift`), with its scale and min `dm`.
fn q4k_weights(dm: vec2<f32>, q: u32, shift: u32) -> vec4<f32> {
    return dm.x * vec4<f32>(unpack4xU8((q >> shift) & 0x0f0f0f0fu)) - dm.y;
}

// 4 weights of quarter s of a Q6_K half block from their low-nibble word `ql` and high-pair word `qh`, with their
// scale `ds` (d times the int8 scale of their 16 columns).
fn q6k_weights(ds: f32, ql: u32, qh: u32, s: u32) -> vec4<f32> {
    let shift = select(0u, 4u, s >= 2u);
    let q = ((ql >> shift) & 0x0f0f0f0fu) | (((qh >> (2u * s)) & 0x03030303u) << 4u);
    return ds * (vec4<f32>(unpack4xU8(q)) - 32.0);
}

// The invocation's 8 weights of sub-block s (0..3) of the step at `col`: columns 4j .. +3 in [0], 16+4j .. +3
// in [1] (zeros past the row's end), in ggml's arithmetic. (Quants made f32 through 2^23's exponent bits, as
// matvec.wgsl's MAGIC, left a 2048-token chunk's speed as it was on the H100: 11,201 / 11,280 tok/s against
// 11,229 / 11,227, device run 22 of stop 38.)
fn decode_block(prm: Params, f: FetchedBlock, row: u32, j: u32, col: u32, s: u32) -> array<vec4<f32>, 2> {
    var w: array<vec4<f32>, 2>;
    switch TY {
        case 12u: { // Q4_K: sub-block 4·half + s; its low or high nibbles of 32-byte group s / 2
            let dm = q4_k_fetched_scale_min(f.a, ((col % 256u) / 128u) * 4u + s);
            let shift = (s % 2u) * 4u;
            let g = (s / 2u) * 2u;
            w[0] = q4k_weights(dm, f.q[g], shift);
            w[1] = q4k_weights(dm, f.q[g + 1u], shift);
        }
        case 14u: { // Q6_K: quarter s of the half block, an int8 scale per 16 columns
            let d = unpack2x16float(f.b).x;
            let p = (s % 2u) * 2u;
            let scales = select(f.a.z, f.a.w, s >= 2u);
            let ds0 = d * f32(sign_extend8((scales >> ((s % 2u) * 16u)) & 0xffu));
            let ds1 = d * f32(sign_extend8((scales >> ((s % 2u) * 16u + 8u)) & 0xffu));
            w[0] = q6k_weights(ds0, f.q[p], f.a.x, s);
            w[1] = q6k_weights(ds1, f.q[p + 1u], f.a.y, s);
        }
        default: {
            let c0 = col + 32u * s + 4u * j;
            for (var n = 0u; n < 4u; n++) {
                if (c0 + n < prm.cols) { w[0][n] = row_value(TY, row, c0 + n); }
                if (c0 + 16u + n < prm.cols) { w[1][n] = row_value(TY, row, c0 + 16u + n); }
            }
        }
    }
    return w;
}

// The block tiles' workgroup memory: the pairs' inputs in two buffers of [pair][column of the step / 4] (at 0
// and BLOCK_BUFFER), a step staged into one while the step before may still be read from the other, so a step
// needs one barrier, not two; once the steps are done, the rows' sums (row_sums).
const BLOCK_BUFFER: u32 = 512u;
var<workgroup> block_x: array<vec4<f32>, 1024>;

// The 8 weights of sub-block s times pair `pair`'s inputs in buffer `buf` of block_x.
fn block_dot(w: array<vec4<f32>, 2>, pair: u32, s: u32, j: u32, buf: u32) -> f32 {
    let at = buf + pair * 32u + 8u * s + j;
    return dot(w[0], block_x[at]) + dot(w[1], block_x[at + 4u]);
}

fn block_quad(w: array<vec4<f32>, 2>, pair: u32, s: u32, j: u32, buf: u32) -> vec4<f32> {
    return vec4<f32>(block_dot(w, pair, s, j, buf), block_dot(w, pair + 1u, s, j, buf), block_dot(w, pair + 2u, s, j, buf), block_dot(w, pair + 3u, s, j, buf));
}

// An invocation's 8 inputs of the step into buffer `buf` of block_x. Every invocation calls it, then the barrier:
// the buffer was last read two steps ago, and every invocation has passed the barrier after that.
fn stage_block_inputs(v: array<vec4<f32>, 2>, load_pair: u32, part: u32, buf: u32) {
    block_x[buf + load_pair * 32u + part / 4u] = v[0];
    block_x[buf + load_pair * 32u + part / 4u + 1u] = v[1];
}

// The 8 inputs an invocation stages for a step: columns col .. col+7 of its pair's x (zeros past the row, or
// with no pair to load).
fn block_step_inputs(prm: Params, x_base: u32, loads: bool, col: u32) -> array<vec4<f32>, 2> {
    var v: array<vec4<f32>, 2>;
    if (loads && col < prm.cols) {
        let at = x_base + col;
        v[0] = vec4<f32>(x[at], x[at + 1u], x[at + 2u], x[at + 3u]);
        v[1] = vec4<f32>(x[at + 4u], x[at + 5u], x[at + 6u], x[at + 7u]);
    }
    return v;
}

// The sums of row r's 4 invocations for pairs 4j .. 4j+3 (invocation j of the row finishes those), added through
// block_x's 16 KiB in one round. (Through 8 KiB, in two rounds, the block kernel ran 1.6× slower on the H100, a
// 512-token prompt at 4,442 tok/s against 7,218: probably because more of its workgroups then share an SM, and
// the L1 that serves a row's 4 invocations holds less of each.) Every invocation calls it, once the steps are
// done; it first waits until every invocation is done reading block_x (the last step's inputs, or the sums of a
// call before).
fn row_sums(acc: array<vec4<f32>, 4>, r: u32, j: u32) -> vec4<f32> {
    workgroupBarrier();
    let mine = 4u * (j * BLOCK_ROWS + r);
    block_x[mine] = acc[0];
    block_x[mine + 1u] = acc[1];
    block_x[mine + 2u] = acc[2];
    block_x[mine + 3u] = acc[3];
    workgroupBarrier();
    var total = block_x[4u * r + j];
    for (var jj = 1u; jj < 4u; jj++) { total += block_x[4u * (jj * BLOCK_ROWS + r) + j]; }
    return total;
}

// near: a row's 4 invocations are neighbours (a subgroup reads 8 rows, 16 neighbouring bytes of each); else
// j = lid / 64 (a subgroup reads the same columns of 32 rows, and its input reads are broadcasts).
fn experts_blocks(wg: vec3<u32>, lid: u32, near: bool) {
    let prm = pe;
    let info = tile_entry(wg.y, lid);
    let slot = info.x;
    let row0 = wg.x * BLOCK_ROWS;
    if (!entry_runs(prm, info, row0)) { return; }
    let start = info.y;
    let count = min(info.z, BLOCK_PAIRS);
    // computing: row r of the tile, column quarter j of each sub-block
    let j = select(lid / BLOCK_ROWS, lid % 4u, near);
    let r = select(lid % BLOCK_ROWS, lid / 4u, near);
    let row = row0 + r;
    let row_ok = row < prm.rows;
    let row_at = entry_weights(prm, slot) + row * prm.row_bytes;
    // loading inputs: 8 columns of the step, from `part`, of pair lid / 16
    let load_pair = lid / 16u;
    let part = (lid % 16u) * 8u;
    let loads = load_pair < count;
    var x_base = 0u;
    if (loads) {
        x_base = pair_input(prm, start + load_pair);
    }
    var acc: array<vec4<f32>, 4>;
    var next_w: FetchedBlock;
    if (row_ok) { next_w = fetch_block(TY, row_at, j, 0u); }
    var next_x = block_step_inputs(prm, x_base, loads, part);
    var buf = 0u;
    for (var k0 = 0u; k0 < prm.cols; k0 += BLOCK_STEP) {
        stage_block_inputs(next_x, load_pair, part, buf);
        let fetched = next_w;
        workgroupBarrier();
        let k1 = k0 + BLOCK_STEP;
        if (k1 < prm.cols) {
            if (row_ok) { next_w = fetch_block(TY, row_at, j, k1); }
            next_x = block_step_inputs(prm, x_base, loads, k1 + part);
        }
        if (row_ok) {
            for (var s = 0u; s < 4u; s++) {
                let w = decode_block(prm, fetched, row_at, j, k0, s);
                // constant indices into acc only (a runtime index would put it in memory instead of registers)
                acc[0] += block_quad(w, 0u, s, j, buf);
                if (count > 4u) { acc[1] += block_quad(w, 4u, s, j, buf); }
                if (count > 8u) { acc[2] += block_quad(w, 8u, s, j, buf); }
                if (count > 12u) { acc[3] += block_quad(w, 12u, s, j, buf); }
            }
        }
        buf = BLOCK_BUFFER - buf;
    }
    let total = row_sums(acc, r, j);
    if (!row_ok) { return; }
    for (var e = 0u; e < 4u; e++) {
        let n = 4u * j + e;
        if (n < count) {
            store(pair_output(prm, start + n) + row, total[e]);
        }
    }
}

@compute @workgroup_size(256)
fn matmul_experts_blocks(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    experts_blocks(wg, lid, false);
}

@compute @workgroup_size(256)
fn matmul_experts_blocks_near(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    experts_blocks(wg, lid, true);
}

// Tall block tiles: 128 rows × up to 16 pairs, each invocation two rows (r and r + 64) at the same columns, so
// every input read from workgroup memory serves both rows' weights: half the workgroup-memory reads of block
// tiles per product, for a second row's words and sums in registers. They multiply in f32 on every device: in
// f16 (the pairs' inputs staged as f16, each decoded weight converted, two products an instruction onto f16
// sums of 16 terms), a 2048-token chunk ran at 9,300–9,500 tok/s against 11,170–11,300 on the H100 (device run
// 23 of stop 38): probably the conversions of the weights each invocation decodes, or its f16 sums passed
// through functions as arrays, cost more than the products saved. With the pairs in the f16 vectors' lanes
// instead (an input vector of 4 pairs times each weight, no sums passed to functions) it ran at 11,407 and 11,473
// against 11,277 and 11,293 in f32 (run 25 of stop 39): no more than the f32 fused multiply-adds below gained
// without f16's rounding.
const TALL_ROWS: u32 = 128u;

// The 8 weights of sub-block s of two rows times the inputs of pairs `pair` .. `pair` + 3 in buffer `buf`, added
// onto those pairs' sums (a: row a's, b: row b's), each input read once. Each product is one fused multiply-add
// onto its sum (as two dot products added to the sum, 8 products were 10 instructions): on the H100 a 2048-token
// chunk prefilled at 11,368 and 11,371 tok/s against 11,177 and 11,272 (device run 25 of stop 39).
fn tall_quads(a: array<vec4<f32>, 2>, b: array<vec4<f32>, 2>, pair: u32, s: u32, j: u32, buf: u32, sum_a: vec4<f32>, sum_b: vec4<f32>) -> array<vec4<f32>, 2> {
    var out = array<vec4<f32>, 2>(sum_a, sum_b);
    for (var n = 0u; n < 4u; n++) {
        let at = buf + (pair + n) * 32u + 8u * s + j;
        let x0 = block_x[at];
        let x1 = block_x[at + 4u];
        out[0][n] = fma_8(a, x0, x1, out[0][n]);
        out[1][n] = fma_8(b, x0, x1, out[1][n]);
    }
    return out;
}

// sum + w[0]·x0 + w[1]·x1, one product at a time
fn fma_8(w: array<vec4<f32>, 2>, x0: vec4<f32>, x1: vec4<f32>, sum: f32) -> f32 {
    var t = fma(w[0].x, x0.x, sum);
    t = fma(w[0].y, x0.y, t);
    t = fma(w[0].z, x0.z, t);
    t = fma(w[0].w, x0.w, t);
    t = fma(w[1].x, x1.x, t);
    t = fma(w[1].y, x1.y, t);
    t = fma(w[1].z, x1.z, t);
    return fma(w[1].w, x1.w, t);
}

@compute @workgroup_size(256)
fn matmul_experts_blocks_tall(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let prm = pe;
    let info = tile_entry(wg.y, lid);
    let slot = info.x;
    let row0 = wg.x * TALL_ROWS;
    if (!entry_runs(prm, info, row0)) { return; }
    let start = info.y;
    let count = min(info.z, BLOCK_PAIRS);
    // computing: rows r and r + 64 of the tile, column quarter j of each sub-block (a subgroup: 32 rows' same
    // columns, its input reads broadcasts)
    let j = lid / BLOCK_ROWS;
    let r = lid % BLOCK_ROWS;
    let row_a = row0 + r;
    let row_b = row_a + BLOCK_ROWS;
    let a_ok = row_a < prm.rows;
    let b_ok = row_b < prm.rows;
    let at_a = entry_weights(prm, slot) + row_a * prm.row_bytes;
    let at_b = at_a + BLOCK_ROWS * prm.row_bytes;
    // loading inputs: 8 columns of the step, from `part`, of pair lid / 16
    let load_pair = lid / 16u;
    let part = (lid % 16u) * 8u;
    let loads = load_pair < count;
    var x_base = 0u;
    if (loads) {
        x_base = pair_input(prm, start + load_pair);
    }
    var acc_a: array<vec4<f32>, 4>;
    var acc_b: array<vec4<f32>, 4>;
    var next_a: FetchedBlock;
    var next_b: FetchedBlock;
    if (a_ok) { next_a = fetch_block(TY, at_a, j, 0u); }
    if (b_ok) { next_b = fetch_block(TY, at_b, j, 0u); }
    var next_x = block_step_inputs(prm, x_base, loads, part);
    var buf = 0u;
    for (var k0 = 0u; k0 < prm.cols; k0 += BLOCK_STEP) {
        stage_block_inputs(next_x, load_pair, part, buf);
        let fetched_a = next_a;
        let fetched_b = next_b;
        workgroupBarrier();
        let k1 = k0 + BLOCK_STEP;
        if (k1 < prm.cols) {
            if (a_ok) { next_a = fetch_block(TY, at_a, j, k1); }
            if (b_ok) { next_b = fetch_block(TY, at_b, j, k1); }
            next_x = block_step_inputs(prm, x_base, loads, k1 + part);
        }
        if (a_ok) {
            for (var s = 0u; s < 4u; s++) {
                let wa = decode_block(prm, fetched_a, at_a, j, k0, s);
                // a row past the matrix decodes nothing (types decoded from the weights would read past it)
                var wb: array<vec4<f32>, 2>;
                if (b_ok) { wb = decode_block(prm, fetched_b, at_b, j, k0, s); }
                // constant indices into the sums only (a runtime index would put them in memory)
                var q = tall_quads(wa, wb, 0u, s, j, buf, acc_a[0], acc_b[0]);
                acc_a[0] = q[0];
                acc_b[0] = q[1];
                if (count > 4u) { q = tall_quads(wa, wb, 4u, s, j, buf, acc_a[1], acc_b[1]); acc_a[1] = q[0]; acc_b[1] = q[1]; }
                if (count > 8u) { q = tall_quads(wa, wb, 8u, s, j, buf, acc_a[2], acc_b[2]); acc_a[2] = q[0]; acc_b[2] = q[1]; }
                if (count > 12u) { q = tall_quads(wa, wb, 12u, s, j, buf, acc_a[3], acc_b[3]); acc_a[3] = q[0]; acc_b[3] = q[1]; }
            }
        }
        buf = BLOCK_BUFFER - buf;
    }
    // row a's sums, then row b's through the same memory
    let total_a = row_sums(acc_a, r, j);
    let total_b = row_sums(acc_b, r, j);
    for (var e = 0u; e < 4u; e++) {
        let n = 4u * j + e;
        if (n < count) {
            let out = pair_output(prm, start + n);
            if (a_ok) { store(out + row_a, total_a[e]); }
            if (b_ok) { store(out + row_b, total_b[e]); }
        }
    }
}

// ---- experts on quad block tiles ----
// Tall block tiles (128 rows × up to 16 pairs) whose invocations hold 4 rows each, at a quarter of the columns a
// tall tile's hold: rows r, r + 32, r + 64, r + 96 (r = lid % 32) and, within each 32-column sub-block of the
// step, columns 4j .. 4j+3 (j = lid / 32: a subgroup holds 32 rows' same columns). Each input read from workgroup
// memory then serves 4 rows (16 multiply-adds), where a tall tile's serves 2 (8): a tall tile reads its inputs
// from workgroup memory once per 8 of its multiply-adds. Same tile list, same sums per product (each row's 32
// columns of a sub-block still reach its total through its own invocations' partial sums).

const QUAD_LANES: u32 = 32u;

// One step's raw words of an invocation's 4 rows' 16 weights, a row at a time. Q4_K: q = the nibble words of
// the step's two 32-byte groups at byte 4j, a = d|dmin and the 12 scale bytes. Q6_K: q = the low-nibble words
// of quarter parity 0 and 1 at byte 4j, a.x = the high-pair word, a.z/a.w the half block's int8 scales, b = d.
struct FetchedQuad {
    q: vec2<u32>,
    a: vec4<u32>,
    b: u32,
}

fn fetch_quad(ty: u32, row: u32, j: u32, col: u32) -> FetchedQuad {
    var f: FetchedQuad;
    let half = (col % 256u) / 128u;
    switch ty {
        case 12u: {
            let block = row + (col / 256u) * 144u;
            let qs = block + 16u + half * 64u + 4u * j;
            f.q = vec2<u32>(w_word(qs), w_word(qs + 32u));
            f.a = vec4<u32>(w_word(block), w_word(block + 4u), w_word(block + 8u), w_word(block + 12u));
        }
        case 14u: {
            let block = row + (col / 256u) * 210u;
            let ql = block + half * 64u + 4u * j;
            let sc = block + 192u + half * 8u;
            f.q = vec2<u32>(w_word(ql), w_word(ql + 32u));
            f.a = vec4<u32>(w_word(block + 128u + half * 32u + 4u * j), 0u, w_word(sc), w_word(sc + 4u));
            f.b = w_word(block + 208u);
        }
        default: {}
    }
    return f;
}

// The invocation's 4 weights of sub-block s (0..3) of the step at `col` in one row: columns 4j .. 4j+3 (zeros past
// the row's end), in ggml's arithmetic (decode_block's, for a quarter of its columns).
fn decode_quad(prm: Params, f: FetchedQuad, row: u32, j: u32, col: u32, s: u32) -> vec4<f32> {
    var w: vec4<f32>;
    switch TY {
        case 12u: { // Q4_K: sub-block 4·half + s; its low or high nibbles of 32-byte group s / 2
            let dm = q4_k_fetched_scale_min(f.a, ((col % 256u) / 128u) * 4u + s);
            w = q4k_weights(dm, f.q[s / 2u], (s % 2u) * 4u);
        }
        case 14u: { // Q6_K: quarter s of the half block, the int8 scale of its 16 columns that hold 4j
            let d = unpack2x16float(f.b).x;
            let scales = select(f.a.z, f.a.w, s >= 2u);
            let ds = d * f32(sign_extend8((scales >> ((s % 2u) * 16u + (j / 4u) * 8u)) & 0xffu));
            w = q6k_weights(ds, f.q[s % 2u], f.a.x, s);
        }
        default: {
            let c0 = col + 32u * s + 4u * j;
            for (var n = 0u; n < 4u; n++) {
                if (c0 + n < prm.cols) { w[n] = row_value(TY, row, c0 + n); }
            }
        }
    }
    return w;
}

// sum + w·x, one product at a time
fn fma_4(w: vec4<f32>, x: vec4<f32>, sum: f32) -> f32 {
    return fma(w.w, x.w, fma(w.z, x.z, fma(w.y, x.y, fma(w.x, x.x, sum))));
}

// The 4 weights of sub-block s of 4 rows times the inputs of pairs `pair` .. `pair` + 3 in buffer `buf`, added
// onto those pairs' sums of each row (sums[i][n]: row i, pair pair + n), each input read once.
fn quad_quads(w: array<vec4<f32>, 4>, pair: u32, s: u32, j: u32, buf: u32, sums: array<vec4<f32>, 4>) -> array<vec4<f32>, 4> {
    var out = sums;
    for (var n = 0u; n < 4u; n++) {
        let x = block_x[buf + (pair + n) * 32u + 8u * s + j];
        for (var i = 0u; i < 4u; i++) { out[i][n] = fma_4(w[i], x, out[i][n]); }
    }
    return out;
}

// The sums of one of the invocation's rows for pairs 2j and 2j + 1 (`acc`: its 16 partial sums of that row, pairs
// 4q .. 4q+3 at [q]), added over the row's 8 invocations (j = 0..7) through block_x in one round: each invocation
// leaves its 16 partial sums, then adds up two pairs' 8. Every invocation calls it, once the steps are done (it first waits until every
// invocation is done reading block_x).
fn quad_row_sums(acc: array<vec4<f32>, 4>, r: u32, j: u32) -> vec2<f32> {
    workgroupBarrier();
    let mine = 4u * (j * QUAD_LANES + r);
    block_x[mine] = acc[0];
    block_x[mine + 1u] = acc[1];
    block_x[mine + 2u] = acc[2];
    block_x[mine + 3u] = acc[3];
    workgroupBarrier();
    var total = vec2<f32>(0.0);
    for (var jj = 0u; jj < 8u; jj++) {
        let v = block_x[4u * (jj * QUAD_LANES + r) + j / 2u];
        total += select(v.xy, v.zw, j % 2u == 1u);
    }
    return total;
}

@compute @workgroup_size(256)
fn matmul_experts_blocks_quad(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let prm = pe;
    let info = tile_entry(wg.y, lid);
    let slot = info.x;
    let row0 = wg.x * TALL_ROWS;
    if (!entry_runs(prm, info, row0)) { return; }
    let start = info.y;
    let count = min(info.z, BLOCK_PAIRS);
    let j = lid / QUAD_LANES;
    let r = lid % QUAD_LANES;
    var ok: array<bool, 4>;
    var at: array<u32, 4>;
    let base = entry_weights(prm, slot);
    for (var i = 0u; i < 4u; i++) {
        let row = row0 + r + QUAD_LANES * i;
        ok[i] = row < prm.rows;
        at[i] = base + row * prm.row_bytes;
    }
    // loading inputs: 8 columns of the step, from `part`, of pair lid / 16
    let load_pair = lid / 16u;
    let part = (lid % 16u) * 8u;
    let loads = load_pair < count;
    var x_base = 0u;
    if (loads) {
        x_base = pair_input(prm, start + load_pair);
    }
    // sums of pairs 4q .. 4q+3, row i at [i]
    var acc0: array<vec4<f32>, 4>;
    var acc1: array<vec4<f32>, 4>;
    var acc2: array<vec4<f32>, 4>;
    var acc3: array<vec4<f32>, 4>;
    var next: array<FetchedQuad, 4>;
    for (var i = 0u; i < 4u; i++) {
        if (ok[i]) { next[i] = fetch_quad(TY, at[i], j, 0u); }
    }
    var next_x = block_step_inputs(prm, x_base, loads, part);
    var buf = 0u;
    for (var k0 = 0u; k0 < prm.cols; k0 += BLOCK_STEP) {
        stage_block_inputs(next_x, load_pair, part, buf);
        let fetched = next;
        workgroupBarrier();
        let k1 = k0 + BLOCK_STEP;
        if (k1 < prm.cols) {
            for (var i = 0u; i < 4u; i++) {
                if (ok[i]) { next[i] = fetch_quad(TY, at[i], j, k1); }
            }
            next_x = block_step_inputs(prm, x_base, loads, k1 + part);
        }
        for (var s = 0u; s < 4u; s++) {
            // a row past the matrix decodes nothing (types decoded from the weights would read past it)
            var w: array<vec4<f32>, 4>;
            for (var i = 0u; i < 4u; i++) {
                if (ok[i]) { w[i] = decode_quad(prm, fetched[i], at[i], j, k0, s); }
            }
            acc0 = quad_quads(w, 0u, s, j, buf, acc0);
            if (count > 4u) { acc1 = quad_quads(w, 4u, s, j, buf, acc1); }
            if (count > 8u) { acc2 = quad_quads(w, 8u, s, j, buf, acc2); }
            if (count > 12u) { acc3 = quad_quads(w, 12u, s, j, buf, acc3); }
        }
        buf = BLOCK_BUFFER - buf;
    }
    // row by row, the sums of the row's 8 invocations; this invocation stores pairs 2j, 2j + 1 of each
    for (var i = 0u; i < 4u; i++) {
        let total = quad_row_sums(array<vec4<f32>, 4>(acc0[i], acc1[i], acc2[i], acc3[i]), r, j);
        let row = row0 + r + QUAD_LANES * i;
        for (var e = 0u; e < 2u; e++) {
            let n = 2u * j + e;
            if (n < count && ok[i]) { store(pair_output(prm, start + n) + row, total[e]); }
        }
    }
}

// ---- the slices of a product split by columns, added ----

struct SumParams {
    rows: u32,
    tokens: u32,
    slices: u32,
    y_offset: u32,
    y_stride: u32,
}

@group(0) @binding(0) var<storage, read> partials: array<f32>;
@group(0) @binding(1) var<storage, read_write> sums: array<f32>;
@group(0) @binding(2) var<uniform> ps: SumParams;

@compute @workgroup_size(256)
fn matmul_sum_slices(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) n_wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let prm = ps;
    let n = prm.rows * prm.tokens;
    let i = (wg.x + wg.y * n_wg.x) * 256u + lid;
    if (i >= n) { return; }
    var total = 0.0;
    for (var s = 0u; s < prm.slices; s++) {
        total += partials[s * n + i];
    }
    let at = prm.y_offset + (i / prm.rows) * prm.y_stride + i % prm.rows;
    if (at < arrayLength(&sums)) { sums[at] = total; }
}
