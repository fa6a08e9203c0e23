// Big tiles multiplied in f16, for a device with `shader-f16`: matmul_big's tiling (128 rows × 128 tokens, 16
// columns a step, 8 rows × 8 tokens an invocation), with the step's decoded weights and inputs held in workgroup
// memory as f16 (half the bytes read per product, so two steps' tiles fit in matmul_big's 16 KiB: one barrier
// a step) and multiplied in f16, two products an instruction. Each step's 16 products of a (row, token) are
// summed in f16, then added into f32 sums, so the rounding of a sum is that of 16 terms, not of a whole row:
// about 2^-11 relative per weight, input and step, finer than llama.cpp's 8-bit activations (Q8_K) on its
// quantised path.
// (Tiles of 128 rows × 64 tokens, 8 rows × 4 tokens an invocation, made a 2048-token chunk no faster on the
// H100: 9,300 / 9,341 tok/s against 9,406 / 9,494, both with the tall expert tiles in f16, device run 23 of stop
// 38.)
// Appended to quant.wgsl and matmul.wgsl (its fetches, decoding and stores) behind `enable f16;` (matmul.rs).
// Every write is bounds-checked (big_store). The tile's layout and stores are matmul_big's (big_tile, big_store_all).

// Two buffers of [column k of the step][group of 4 rows or tokens], 32 groups (4 KiB each): a step is staged
// into one while the step before may still be read from the other, so a step needs one barrier, not two.
const HALF_BUFFER: u32 = 512u;
var<workgroup> w_half: array<vec4<f16>, 1024>;
var<workgroup> x_half: array<vec4<f16>, 1024>;

// A fetched step into buffer `buf` (0 or HALF_BUFFER) of the f16 tiles: 8 weights of tile row `slot` and 8
// inputs of tile token `slot`, columns part .. part+7 of the step (zeros where the row or token is not the tile's).
fn stage_half(prm: Params, f: Fetched, row_ok: bool, row_at: u32, col: u32, part: u32, slot: u32, buf: u32) {
    let w = decode_fetched(prm, f, row_ok, row_at, col);
    for (var n = 0u; n < 8u; n++) {
        w_half[buf + (part + n) * 32u + slot / 4u][slot % 4u] = f16(w[n]);
    }
    for (var n = 0u; n < 4u; n++) {
        x_half[buf + (part + n) * 32u + slot / 4u][slot % 4u] = f16(f.x0[n]);
        x_half[buf + (part + n + 4u) * 32u + slot / 4u][slot % 4u] = f16(f.x1[n]);
    }
}

@compute @workgroup_size(256)
fn matmul_big_f16(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let prm = p;
    // from the workgroup's id alone (a condition made of the struct would count as non-uniform, and Tint rejects
    // the barriers after it)
    if (wg.y * BIG_TOKENS >= prm.tokens || wg.x * BIG_ROWS >= prm.rows) { return; }
    let tile = big_tile(prm, wg, lid);
    let rg = tile.rg;
    let tg = tile.tg;
    var acc: array<vec4<f32>, 16>;
    var next = fetch_step(prm, tile.row_ok, tile.row_at, tile.loads, tile.x_base, tile.part);
    var buf = 0u;
    for (var k0 = 0u; k0 < prm.cols; k0 += BIG_STEP) {
        // this buffer was last read two steps ago: every invocation has passed the barrier after that
        stage_half(prm, next, tile.row_ok, tile.row_at, k0 + tile.part, tile.part, tile.load_index, buf);
        workgroupBarrier();
        if (k0 + BIG_STEP < prm.cols) { next = fetch_step(prm, tile.row_ok, tile.row_at, tile.loads, tile.x_base, k0 + BIG_STEP + tile.part); }
        if (tile.computes) {
            // constant indices only: a runtime index would put the sums in memory instead of registers
            var s: array<vec4<f16>, 16>;
            for (var k = 0u; k < BIG_STEP; k++) {
                let w0 = w_half[buf + k * 32u + rg];
                let w1 = w_half[buf + k * 32u + 16u + rg];
                let x0 = x_half[buf + k * 32u + tg];
                let x1 = x_half[buf + k * 32u + 16u + tg];
                s[0] += w0 * x0.x;
                s[1] += w0 * x0.y;
                s[2] += w0 * x0.z;
                s[3] += w0 * x0.w;
                s[4] += w0 * x1.x;
                s[5] += w0 * x1.y;
                s[6] += w0 * x1.z;
                s[7] += w0 * x1.w;
                s[8] += w1 * x0.x;
                s[9] += w1 * x0.y;
                s[10] += w1 * x0.z;
                s[11] += w1 * x0.w;
                s[12] += w1 * x1.x;
                s[13] += w1 * x1.y;
                s[14] += w1 * x1.z;
                s[15] += w1 * x1.w;
            }
            acc[0] += vec4<f32>(s[0]);
            acc[1] += vec4<f32>(s[1]);
            acc[2] += vec4<f32>(s[2]);
            acc[3] += vec4<f32>(s[3]);
            acc[4] += vec4<f32>(s[4]);
            acc[5] += vec4<f32>(s[5]);
            acc[6] += vec4<f32>(s[6]);
            acc[7] += vec4<f32>(s[7]);
            acc[8] += vec4<f32>(s[8]);
            acc[9] += vec4<f32>(s[9]);
            acc[10] += vec4<f32>(s[10]);
            acc[11] += vec4<f32>(s[11]);
            acc[12] += vec4<f32>(s[12]);
            acc[13] += vec4<f32>(s[13]);
            acc[14] += vec4<f32>(s[14]);
            acc[15] += vec4<f32>(s[15]);
        }
        buf = HALF_BUFFER - buf;
    }
    big_store_all(prm, tile, acc);
}
