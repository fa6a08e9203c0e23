// Matrix-vector products over ggml rows read straight from their GGUF bytes: y[r] = Σ_i W[r, i]·x[i].
// A workgroup of 256 is split into lane groups of `lanes` invocations (for Q4_K and Q6_K 16 per 256-value
// block, or 8 per Q6_K block (Q6K_LANES), one or two blocks side by side; 4..32 for the other types: one per
// 32-value sub-block);
// each lane group computes ROWS neighbouring rows at once, so every x value it loads serves ROWS rows and each
// lane has ROWS rows' loads in flight. Lanes walk their row in whole blocks, the lanes of a block reading
// neighbouring words; one reduction through workgroup memory at the end. workgroup_id.z selects a matrix:
//   matvec          batch b: weights at w_offset + b·w_stride, x at x_offset + b·x_stride, y at y_offset + b·y_stride
//                   (per-head MLA products, or a single product with one batch)
//   matvec_experts  batch j: the j-th selected expert, sel[j], read from its slot of the expert pool
//                   (slots[slot_base + sel[j]]); only slots in this pool buffer (`chunk`) are computed here.
// Prepended with quant.wgsl; the bindings come with each entry point. matvec.rs sets ROWS and MAGIC per variant.

struct Params {
    rows: u32,
    cols: u32,
    row_bytes: u32,
    // (the kernel's TY; matvec.rs fills it in all the same)
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
    // invocations per row: 16 or 32 for Q4_K/Q6_K, a power of two in 4..32 otherwise
    lanes: u32,
    // 1: y[r] += the product (a residual added in the same pass, one dispatch fewer); 0: y[r] = it
    accumulate: u32,
    // Stacked matrices (several that read the same x, rows back to back in one buffer, one dispatch for all):
    // rows from starts[s] on are segment s's: row starts[s] + i goes to y_at + ys[s] + i (y_at: y_offset, plus
    // the batch's stride). 0 segments: row r goes to y_at + r.
    segments: u32,
    starts: array<vec4<u32>, 2>,
    ys: array<vec4<u32>, 2>,
    // SwiGLU variants: x holds [gate (glu_ff) | up (glu_ff)] per batch, and the product's input is their
    // activation (moe.wgsl's swiglu, with its clamp when glu_limit > 1e-6)
    glu_ff: u32,
    glu_limit: f32,
    // RMSNorm variants: the product's input is rms_norm(x)·norm_w with this ε (see stage_x)
    norm_eps: f32,
    // experts only: batch shared_z (none when it is past the grid) is the layer's shared expert, read from pool
    // slot shared_slot, its SwiGLU clamped at glu_limit_shared
    shared_z: u32,
    shared_slot: u32,
    glu_limit_shared: f32,
    // summed-slices variants: x is the sum of `slices` vectors `slice_stride` floats apart, the partial sums of a
    // product split by columns (see stage_x)
    slices: u32,
    slice_stride: u32,
    // gated variants: batch b's outputs times σ(gate_logits[gate_offset + b]) (see scaled)
    gate_offset: u32,
}

const WG: u32 = 256u;
// rows per lane group
const ROWS: u32 = 2u;
// quants to f32 through the exponent bits of 2^23 (an OR and a subtraction) rather than an int conversion
const MAGIC: bool = true;
// the matrices' ggml type: matvec.rs builds a kernel per type, so each keeps one type's code (on SwiftShader, the
// browser tests' CPU WebGPU, a decode step of the tiny model took 1.4× as long with every type's code behind a
// branch on p.ty; on the H100 a Flash-width step 1.05×)
const TY: u32 = 12u;
var<workgroup> partial: array<f32, WG * ROWS>;
// the SwiGLU variants' clamp for this workgroup's batch (each entry point sets it before staging x)
var<private> glu_limit: f32;

// Lanes a subgroup is sure to hold, and the sum of v over each aligned run of `width` (≤ SUBGROUP) of them.
// Without subgroups (this version) SUBGROUP is 1 and the sums go through workgroup memory; on a device with
// them matvec.rs swaps in a version that shuffles (lane groups are aligned runs of local_invocation_index,
// which is how every driver fills subgroups of a one-dimensional workgroup).
const SUBGROUP: u32 = 1u;
fn subgroup_sum(v: f32, width: u32) -> f32 { return v; }

// 2^23 as f32 bits: OR-ing a byte into the mantissa gives 2^23 + byte exactly
const EXP23: u32 = 0x4b000000u;

// The four bytes of `q` as f32, less `bias` (exact: small integers).
fn bytes_f32(q: u32, bias: f32) -> vec4<f32> {
    if (MAGIC) {
        let b = vec4<u32>(q & 0xffu, (q >> 8u) & 0xffu, (q >> 16u) & 0xffu, q >> 24u) | vec4<u32>(EXP23);
        return bitcast<vec4<f32>>(b) - vec4<f32>(8388608.0 + bias);
    }
    return vec4<f32>(unpack4xU8(q)) - vec4<f32>(bias);
}

// x[i], and x[i..i+4] for i a multiple of 4. matvec.rs binds x as array<vec4<f32>> (and swaps these two lines
// for single loads) when every x offset is a multiple of 4: scalar loads of 16-byte strided lanes cost a warp
// four times the cache wavefronts, and x is read once per block for every lane.
fn x1(i: u32) -> f32 { return x[i]; }
fn x4(i: u32) -> vec4<f32> { return vec4<f32>(x[i], x[i + 1u], x[i + 2u], x[i + 3u]); }

// The SwiGLU variants (matvec.rs swaps these for a version that computes the activation of the batch's
// [gate | up] into workgroup memory, once per workgroup, and has x1/x4 read it there): the down product of an
// FFN then needs no swiglu dispatch before it. The RMSNorm variants likewise stage norm.wgsl's rms_norm of x
// (its sums in its order) and have the first workgroup write it out too: the MoE router's product is then the
// FFN's norm as well; the summed-slices variants stage the sum of a split product's partial outputs
// (matmul_sum_slices' sums in its order), so the product after a split one needs no sum_slices dispatch before
// it. Returns where rows_dot finds x: `xb`, or 0 in workgroup memory.
fn stage_x(xb: u32, lid: u32, first: bool) -> u32 { return xb; }

// Words i.. of a row read from byte 4·i + s/8 (s 0 or 16: Q6_K blocks are 210 bytes, so every other one starts
// mid-word). The branch is uniform where the rows of a warp share an alignment (row bytes a multiple of 4).
fn word_at(i: u32, s: u32) -> u32 {
    if (s == 0u) { return weights[i]; }
    return (weights[i] >> 16u) | (weights[i + 1u] << 16u);
}

// Q6_K lane t (0..16) of a block: values 4·(t%8)..+4 of each of the four 32-value quarters of half t/8.
fn q6k_x(xb: u32, t: u32) -> array<vec4<f32>, 4> {
    let i = xb + (t / 8u) * 128u + (t % 8u) * 4u;
    return array<vec4<f32>, 4>(x4(i), x4(i + 32u), x4(i + 64u), x4(i + 96u));
}

// The sums of each x4 of q6k_x, times 32: the quants' offset of 32, taken off once per quarter.
fn q6k_bias(xs: array<vec4<f32>, 4>) -> vec4<f32> {
    let one = vec4<f32>(32.0);
    return vec4<f32>(dot(xs[0], one), dot(xs[1], one), dot(xs[2], one), dot(xs[3], one));
}

fn q6k_dot(block: u32, t: u32, xs: array<vec4<f32>, 4>, bias: vec4<f32>) -> f32 {
    let half = t / 8u;
    let l0 = (t % 8u) * 4u;
    // every word below is at a multiple of 4 bytes from the block's start
    let s = (block & 2u) * 8u;
    let w = block >> 2u;
    let lo = word_at(w + half * 16u + l0 / 4u, s); // quarters 0 (low nibbles) and 2 (high)
    let hi = word_at(w + half * 16u + 8u + l0 / 4u, s); // quarters 1 and 3
    let h = word_at(w + 32u + half * 8u + l0 / 4u, s); // 2 high bits of each quarter
    // int8 scales: quarter q of this lane's 16-value group is scale 8·half + l0/16 + 2q
    let sa = word_at(w + 48u + half * 2u, s);
    let sb = word_at(w + 49u + half * 2u, s);
    let d = unpack2x16float(word_at(w + 52u, s)).x;
    let k = (l0 / 16u) * 8u;
    let q0 = (lo & 0x0f0f0f0fu) | ((h << 4u) & 0x30303030u);
    let q1 = (hi & 0x0f0f0f0fu) | ((h << 2u) & 0x30303030u);
    let q2 = ((lo >> 4u) & 0x0f0f0f0fu) | (h & 0x30303030u);
    let q3 = ((hi >> 4u) & 0x0f0f0f0fu) | ((h >> 2u) & 0x30303030u);
    let sc = vec4<f32>(vec4<i32>(vec4<u32>(sa << (24u - k), sa << (8u - k), sb << (24u - k), sb << (8u - k))) >> vec4<u32>(24u));
    let dots = vec4<f32>(dot(bytes_f32(q0, 0.0), xs[0]), dot(bytes_f32(q1, 0.0), xs[1]), dot(bytes_f32(q2, 0.0), xs[2]), dot(bytes_f32(q3, 0.0), xs[3]));
    return d * dot(sc, dots - bias);
}

// The Q6_K variants with 8 lanes a block (matvec.rs sets Q6K_LANES): lane t (0..8) takes values 8·(t%4)..+8 of
// each of the four 32-value quarters of half t/4, so its scale and d words serve twice the values.
const Q6K_LANES: u32 = 16u;

fn q6k_x8(xb: u32, t: u32) -> array<vec4<f32>, 8> {
    let i = xb + (t / 4u) * 128u + (t % 4u) * 8u;
    return array<vec4<f32>, 8>(x4(i), x4(i + 4u), x4(i + 32u), x4(i + 36u), x4(i + 64u), x4(i + 68u), x4(i + 96u), x4(i + 100u));
}

fn q6k_bias8(xs: array<vec4<f32>, 8>) -> vec4<f32> {
    let one = vec4<f32>(32.0);
    return vec4<f32>(dot(xs[0] + xs[1], one), dot(xs[2] + xs[3], one), dot(xs[4] + xs[5], one), dot(xs[6] + xs[7], one));
}

// The words lane t (of 8) of a Q6_K block reads: its quants' (lo: quarters 0 and 2, hi: 1 and 3, h: the 2 high
// bits of each quarter), then its two scale words and d's.
struct Q6kWords {
    lo: vec2<u32>,
    hi: vec2<u32>,
    h: vec2<u32>,
    scales_d: vec3<u32>,
}

fn q6k_fetch8(block: u32, t: u32) -> Q6kWords {
    let half = t / 4u;
    let l0 = (t % 4u) * 8u;
    let s = (block & 2u) * 8u;
    let w = block >> 2u;
    let at = w + half * 16u + l0 / 4u;
    let hat = w + 32u + half * 8u + l0 / 4u;
    return Q6kWords(
        vec2<u32>(word_at(at, s), word_at(at + 1u, s)),
        vec2<u32>(word_at(at + 8u, s), word_at(at + 9u, s)),
        vec2<u32>(word_at(hat, s), word_at(hat + 1u, s)),
        vec3<u32>(word_at(w + 48u + half * 2u, s), word_at(w + 49u + half * 2u, s), word_at(w + 52u, s)));
}

fn q6k_dot8(block: u32, t: u32, xs: array<vec4<f32>, 8>, bias: vec4<f32>) -> f32 {
    return q6k_dot8_words(q6k_fetch8(block, t), t, xs, bias);
}

fn q6k_dot8_words(f: Q6kWords, t: u32, xs: array<vec4<f32>, 8>, bias: vec4<f32>) -> f32 {
    let l0 = (t % 4u) * 8u;
    let lo = f.lo;
    let hi = f.hi;
    let h = f.h;
    let sa = f.scales_d.x;
    let sb = f.scales_d.y;
    let d = unpack2x16float(f.scales_d.z).x;
    let k = (l0 / 16u) * 8u;
    let m4 = vec2<u32>(0x0f0f0f0fu);
    let m2 = vec2<u32>(0x30303030u);
    let q0 = (lo & m4) | ((h << vec2<u32>(4u)) & m2);
    let q1 = (hi & m4) | ((h << vec2<u32>(2u)) & m2);
    let q2 = ((lo >> vec2<u32>(4u)) & m4) | (h & m2);
    let q3 = ((hi >> vec2<u32>(4u)) & m4) | ((h >> vec2<u32>(2u)) & m2);
    let sc = vec4<f32>(vec4<i32>(vec4<u32>(sa << (24u - k), sa << (8u - k), sb << (24u - k), sb << (8u - k))) >> vec4<u32>(24u));
    let dots = vec4<f32>(
        dot(bytes_f32(q0.x, 0.0), xs[0]) + dot(bytes_f32(q0.y, 0.0), xs[1]),
        dot(bytes_f32(q1.x, 0.0), xs[2]) + dot(bytes_f32(q1.y, 0.0), xs[3]),
        dot(bytes_f32(q2.x, 0.0), xs[4]) + dot(bytes_f32(q2.y, 0.0), xs[5]),
        dot(bytes_f32(q3.x, 0.0), xs[6]) + dot(bytes_f32(q3.y, 0.0), xs[7]));
    return d * dot(sc, dots - bias);
}

// Q4_K lane t (0..16) of a block: bytes 8·(t%4)..+8 of 64-value chunk t/4, low nibbles (sub-block 2c, values
// 64c + 8·(t%4)..) then high (sub-block 2c+1, 32 values on).
fn q4k_x(xb: u32, t: u32) -> array<vec4<f32>, 4> {
    let i = xb + (t / 4u) * 64u + (t % 4u) * 8u;
    return array<vec4<f32>, 4>(x4(i), x4(i + 4u), x4(i + 32u), x4(i + 36u));
}

// The sums of the low-nibble and the high-nibble x of q4k_x (for the mins).
fn q4k_sums(xs: array<vec4<f32>, 4>) -> vec2<f32> {
    return vec2<f32>(dot(xs[0] + xs[1], vec4<f32>(1.0)), dot(xs[2] + xs[3], vec4<f32>(1.0)));
}

// The 6-bit scales and mins of sub-blocks 2c and 2c+1 of the Q4_K block at word w (bytes k, k+1 of the 12
// scale bytes' packing): (scale 2c, scale 2c+1, min 2c, min 2c+1).
fn q4k_scales(w: u32, c: u32) -> vec4<u32> {
    return q4k_scales_of(weights[w + 1u], weights[w + 2u], weights[w + 3u], c);
}

// q4k_scales from the three scale words s0, s1, s2.
fn q4k_scales_of(s0: u32, s1: u32, s2: u32, c: u32) -> vec4<u32> {
    let k = (c % 2u) * 16u;
    let low = vec2<u32>(s0 >> k, s1 >> k); // sub-blocks 0..3: 6 bits of bytes 4+j, 8+j
    let mixed = s2 >> k; // sub-blocks 4..7: 4 bits of byte 8+j, top 2 of bytes j, 4+j
    if (c < 2u) {
        return vec4<u32>(low.x, low.x >> 8u, low.y, low.y >> 8u) & vec4<u32>(63u);
    }
    let m = vec2<u32>(mixed, mixed >> 8u);
    let sc = (m & vec2<u32>(15u)) | (((vec2<u32>(low.x, low.x >> 8u) >> vec2<u32>(6u)) & vec2<u32>(3u)) << vec2<u32>(4u));
    let mn = ((m >> vec2<u32>(4u)) & vec2<u32>(15u)) | (((vec2<u32>(low.y, low.y >> 8u) >> vec2<u32>(6u)) & vec2<u32>(3u)) << vec2<u32>(4u));
    return vec4<u32>(sc, mn);
}

// (Loading two blocks' words before either block's arithmetic made a decode token slower on the H100: 1.447 ms
// against 1.368, 8 layers at Flash's widths, device run 22 of stop 38.)
fn q4k_dot(block: u32, t: u32, xs: array<vec4<f32>, 4>, sums: vec2<f32>) -> f32 {
    let c = t / 4u;
    let w = block >> 2u;
    let dm = unpack2x16float(weights[w]);
    let scales = q4k_scales(w, c);
    let sc = scales.xy;
    let mn = scales.zw;
    let q = w + 4u + c * 8u + (t % 4u) * 2u;
    let a = weights[q];
    let b = weights[q + 1u];
    let lo = dot(bytes_f32(a & 0x0f0f0f0fu, 0.0), xs[0]) + dot(bytes_f32(b & 0x0f0f0f0fu, 0.0), xs[1]);
    let hi = dot(bytes_f32((a >> 4u) & 0x0f0f0f0fu, 0.0), xs[2]) + dot(bytes_f32((b >> 4u) & 0x0f0f0f0fu, 0.0), xs[3]);
    return dm.x * (f32(sc.x) * lo + f32(sc.y) * hi) - dm.y * dot(vec2<f32>(mn), sums);
}

// The Q4_K variants with 8 lanes a block (matvec.rs sets Q4K_LANES, as Q6K_LANES for Q6_K): lane t (0..8) takes
// bytes 16·(t%2)..+16 of 64-value chunk t/2, four words: values 64·(t/2) + 16·(t%2).. from their low nibbles and
// the 16 from 32 on from their high ones. A lane then has four words of quants in flight, not two, and the
// block's scale words serve twice the values.
const Q4K_LANES: u32 = 16u;

fn q4k_x8(xb: u32, t: u32) -> array<vec4<f32>, 8> {
    let i = xb + (t / 2u) * 64u + (t % 2u) * 16u;
    return array<vec4<f32>, 8>(x4(i), x4(i + 4u), x4(i + 8u), x4(i + 12u), x4(i + 32u), x4(i + 36u), x4(i + 40u), x4(i + 44u));
}

fn q4k_sums8(xs: array<vec4<f32>, 8>) -> vec2<f32> {
    let one = vec4<f32>(1.0);
    return vec2<f32>(dot(xs[0] + xs[1] + xs[2] + xs[3], one), dot(xs[4] + xs[5] + xs[6] + xs[7], one));
}

// The words lane t (of 8) of a Q4_K block reads: d|dmin and the three scale words, then its four of quants.
struct Q4kWords {
    head: vec4<u32>,
    q: vec4<u32>,
}

fn q4k_fetch8(block: u32, t: u32) -> Q4kWords {
    let w = block >> 2u;
    let q = w + 4u + (t / 2u) * 8u + (t % 2u) * 4u;
    return Q4kWords(vec4<u32>(weights[w], weights[w + 1u], weights[w + 2u], weights[w + 3u]), vec4<u32>(weights[q], weights[q + 1u], weights[q + 2u], weights[q + 3u]));
}

fn q4k_dot8(block: u32, t: u32, xs: array<vec4<f32>, 8>, sums: vec2<f32>) -> f32 {
    return q4k_dot8_words(q4k_fetch8(block, t), t, xs, sums);
}

fn q4k_dot8_words(f: Q4kWords, t: u32, xs: array<vec4<f32>, 8>, sums: vec2<f32>) -> f32 {
    let dm = unpack2x16float(f.head.x);
    let scales = q4k_scales_of(f.head.y, f.head.z, f.head.w, t / 2u);
    let a = f.q;
    let m4 = vec4<u32>(0x0f0f0f0fu);
    let l = a & m4;
    let h = (a >> vec4<u32>(4u)) & m4;
    let lo = dot(bytes_f32(l.x, 0.0), xs[0]) + dot(bytes_f32(l.y, 0.0), xs[1]) + dot(bytes_f32(l.z, 0.0), xs[2]) + dot(bytes_f32(l.w, 0.0), xs[3]);
    let hi = dot(bytes_f32(h.x, 0.0), xs[4]) + dot(bytes_f32(h.y, 0.0), xs[5]) + dot(bytes_f32(h.z, 0.0), xs[6]) + dot(bytes_f32(h.w, 0.0), xs[7]);
    return dm.x * (f32(scales.x) * lo + f32(scales.y) * hi) - dm.y * dot(vec2<f32>(scales.zw), sums);
}

// Four f32 weights from word w on.
fn f32x4_at(w: u32) -> vec4<f32> {
    return bitcast<vec4<f32>>(vec4<u32>(weights[w], weights[w + 1u], weights[w + 2u], weights[w + 3u]));
}

// The first row of this workgroup.
fn first_row(wg: vec3<u32>, n_wg: vec3<u32>) -> u32 {
    return (wg.x + wg.y * n_wg.x) * (WG / p.lanes) * ROWS;
}

// The prefetching variants (matvec.rs sets PREFETCH, for blocks by 8 lanes): a lane loads the words of its next
// block before it works through this one's, so its loads wait one memory latency in all, not one a block (the
// F32 rows below gained the same way). The last block's loads are repeated, not branched around: a load behind
// a branch is issued only once the branch is taken.
const PREFETCH: bool = false;

fn rows_dot_prefetched(rows: array<u32, ROWS>, lane: u32, xb: u32) -> array<f32, ROWS> {
    let t = lane % 8u;
    let side = max(p.lanes / 8u, 1u); // never 0: every loop must end (kernel.rs)
    let blocks = p.cols / 256u;
    let block_bytes = select(144u, 210u, TY == 14u);
    var acc: array<f32, ROWS>;
    var next4: array<Q4kWords, ROWS>;
    var next6: array<Q6kWords, ROWS>;
    let first = min(lane / 8u, blocks - 1u);
    for (var r = 0u; r < ROWS; r++) {
        if (TY == 14u) { next6[r] = q6k_fetch8(rows[r] + first * block_bytes, t); } else { next4[r] = q4k_fetch8(rows[r] + first * block_bytes, t); }
    }
    for (var blk = lane / 8u; blk < blocks; blk += side) {
        let now4 = next4;
        let now6 = next6;
        let ahead = min(blk + side, blocks - 1u) * block_bytes;
        for (var r = 0u; r < ROWS; r++) {
            if (TY == 14u) { next6[r] = q6k_fetch8(rows[r] + ahead, t); } else { next4[r] = q4k_fetch8(rows[r] + ahead, t); }
        }
        let at = xb + blk * 256u;
        if (TY == 14u) {
            let xs = q6k_x8(at, t);
            let bias = q6k_bias8(xs);
            for (var r = 0u; r < ROWS; r++) { acc[r] += q6k_dot8_words(now6[r], t, xs, bias); }
        } else {
            let xs = q4k_x8(at, t);
            let sums = q4k_sums8(xs);
            for (var r = 0u; r < ROWS; r++) { acc[r] += q4k_dot8_words(now4[r], t, xs, sums); }
        }
    }
    return acc;
}

// Row `first + ROWS·(lid / lanes) + r` of the matrix whose row 0 is at byte `base` (r < ROWS), dotted with the x
// at `xb`; rows past p.rows read the last row instead (results dropped by the caller). Every invocation reaches
// the barriers. Returns, for lane 0 of each group, its ROWS sums.
fn rows_dot(base: u32, first: u32, xb: u32, lid: u32) -> array<f32, ROWS> {
    let lane = lid % p.lanes;
    let row0 = first + ROWS * (lid / p.lanes);
    var rows: array<u32, ROWS>;
    for (var r = 0u; r < ROWS; r++) {
        rows[r] = base + min(row0 + r, p.rows - 1u) * p.row_bytes;
    }
    var acc: array<f32, ROWS>;
    switch TY {
        case 12u, 14u: {
            if (PREFETCH && ((TY == 14u && Q6K_LANES == 8u) || (TY == 12u && Q4K_LANES == 8u))) {
                acc = rows_dot_prefetched(rows, lane, xb);
                break;
            }
            let per_block = select(Q4K_LANES, Q6K_LANES, TY == 14u);
            let t = lane % per_block;
            let side = max(p.lanes / per_block, 1u); // never 0: every loop must end (kernel.rs)
            let block_bytes = select(144u, 210u, TY == 14u);
            for (var blk = lane / per_block; blk < p.cols / 256u; blk += side) {
                let xb = xb + blk * 256u;
                if (TY == 14u && Q6K_LANES == 8u) {
                    let xs = q6k_x8(xb, t);
                    let bias = q6k_bias8(xs);
                    for (var r = 0u; r < ROWS; r++) { acc[r] += q6k_dot8(rows[r] + blk * block_bytes, t, xs, bias); }
                } else if (TY == 14u) {
                    let xs = q6k_x(xb, t);
                    let bias = q6k_bias(xs);
                    for (var r = 0u; r < ROWS; r++) { acc[r] += q6k_dot(rows[r] + blk * block_bytes, t, xs, bias); }
                } else if (Q4K_LANES == 8u) {
                    let xs = q4k_x8(xb, t);
                    let sums = q4k_sums8(xs);
                    for (var r = 0u; r < ROWS; r++) { acc[r] += q4k_dot8(rows[r] + blk * block_bytes, t, xs, sums); }
                } else {
                    let xs = q4k_x(xb, t);
                    let sums = q4k_sums(xs);
                    for (var r = 0u; r < ROWS; r++) { acc[r] += q4k_dot(rows[r] + blk * block_bytes, t, xs, sums); }
                }
            }
        }
        case 0u: {
            // F32 (the MoE router): a lane's neighbours read the neighbouring four values, as one vec4 each. Four
            // steps' loads are issued before any is used: a step that used its loads before the next waited a
            // memory latency apiece (the router's 2560 columns are 20 steps of a lane). Sums in step order.
            let step = 4u * max(p.lanes, 1u);
            var i = 4u * lane;
            for (; i + 3u * step < p.cols; i += 4u * step) {
                var xv: array<vec4<f32>, 4>;
                for (var u = 0u; u < 4u; u++) { xv[u] = x4(xb + i + u * step); }
                for (var r = 0u; r < ROWS; r++) {
                    var wv: array<vec4<f32>, 4>;
                    for (var u = 0u; u < 4u; u++) { wv[u] = f32x4_at((rows[r] >> 2u) + i + u * step); }
                    for (var u = 0u; u < 4u; u++) { acc[r] += dot(wv[u], xv[u]); }
                }
            }
            for (; i < p.cols; i += step) {
                let xv = x4(xb + i);
                for (var r = 0u; r < ROWS; r++) { acc[r] += dot(f32x4_at((rows[r] >> 2u) + i), xv); }
            }
        }
        default: {
            for (var sb = lane; sb < p.cols / 32u; sb += max(p.lanes, 1u)) {
                for (var l = 0u; l < 32u; l++) {
                    let xv = x1(xb + sb * 32u + l);
                    for (var r = 0u; r < ROWS; r++) { acc[r] += row_value(TY, rows[r], sb * 32u + l) * xv; }
                }
            }
        }
    }
    // lanes sum: the lanes of a group summed, `shuffled` neighbours by subgroup shuffles, the rest through
    // workgroup memory (the whole-rows variants, one invocation a row, leave out everything to "lanes sum end")
    let shuffled = max(min(p.lanes, SUBGROUP), 1u);
    for (var r = 0u; r < ROWS; r++) { acc[r] = subgroup_sum(acc[r], shuffled); }
    if (shuffled < p.lanes) {
        for (var r = 0u; r < ROWS; r++) { partial[r * WG + lid] = acc[r]; }
        workgroupBarrier();
        for (var s = p.lanes / 2u; s >= shuffled; s >>= 1u) {
            if (lane < s) {
                for (var r = 0u; r < ROWS; r++) { partial[r * WG + lid] += partial[r * WG + lid + s]; }
            }
            workgroupBarrier();
        }
        for (var r = 0u; r < ROWS; r++) { acc[r] = partial[r * WG + lid]; }
    }
    // lanes sum end
    return acc;
}

fn store(i: u32, v: f32) {
    if (i < arrayLength(&y)) { y[i] = select(v, y[i] + v, p.accumulate != 0u); }
}

// Where row `row` of the product goes: y_at + row, or its segment's place in y for stacked matrices.
fn y_index(y_at: u32, row: u32) -> u32 {
    var at = y_at + row;
    for (var s = 0u; s < min(p.segments, 8u); s++) {
        let start = p.starts[s / 4u][s % 4u];
        if (row >= start) { at = y_at + p.ys[s / 4u][s % 4u] + (row - start); }
    }
    return at;
}

// Lane 0 of each group writes its rows that exist.
fn store_rows(first: u32, lid: u32, y_at: u32, sums: array<f32, ROWS>) {
    if (lid % p.lanes != 0u) { return; }
    let row0 = first + ROWS * (lid / p.lanes);
    for (var r = 0u; r < ROWS; r++) {
        if (row0 + r < p.rows) { store(y_index(y_at, row0 + r), sums[r]); }
    }
}

// ---- dense entry point (matvec_experts.wgsl replaces everything from here on) ----

@group(0) @binding(0) var<storage, read> weights: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

// Batch b's sums as they are stored. The gated variants (matvec.rs swaps this for a version with a binding of gate
// logits) multiply them by σ of the batch's logit, as mla_head_gate multiplies o: an MLA layer's head-wise gate
// in its value product, a dispatch fewer.
fn scaled(sums: array<f32, ROWS>, b: u32) -> array<f32, ROWS> { return sums; }

@compute @workgroup_size(256)
fn matvec(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) n_wg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let first = first_row(wg, n_wg);
    // workgroups past the last row (a grid rounded up over two dimensions) do nothing
    if (first >= p.rows) { return; }
    let b = wg.z;
    glu_limit = p.glu_limit;
    let xb = stage_x(p.x_offset + b * p.x_stride, lid, all(wg == vec3<u32>(0u)));
    let sums = rows_dot(p.w_offset + b * p.w_stride, first, xb, lid);
    store_rows(first, lid, p.y_offset + b * p.y_stride, scaled(sums, b));
}
