//! Matrix-matrix products of the batched prefill (`shaders/matmul.wgsl`) against f64 CPU references (weights
//! dequantised by the CPU reference, bit-exact with ggml), with outputs poisoned so a missing or stray write shows.

use super::{f32_bytes, poisoned, random_blocks, read_f32, Rand};
use lingtab::gpu::matmul::{self, ExpertTiles, Rows};
use lingtab::gpu::matvec::{Matrix, PoolChunk};
use lingtab::gpu::{moe, Gpu, Pass};
use lingtab::quant::{self, GgmlType};

fn random_matrix(ty: GgmlType, rows: usize, cols: usize, rng: &mut Rand) -> (Vec<u8>, Vec<f64>) {
    let bytes = match ty {
        GgmlType::F32 => f32_bytes(&rng.normals(rows * cols, 0.1)),
        GgmlType::F16 => rng.normals(rows * cols, 0.1).iter().flat_map(|&v| half::f16::from_f32(v).to_le_bytes()).collect(),
        _ => random_blocks(ty, rows * cols / ty.block_elems(), rng.next_u64()),
    };
    let values = quant::dequantize_to_vec(ty, &bytes).unwrap().iter().map(|&v| v as f64).collect();
    (bytes, values)
}

/// Error bounds of a product, relative to Σ|w·x| and absolute.
#[derive(Clone, Copy)]
struct Tolerance {
    relative: f64,
    absolute: f64,
}

/// f32 rounding of a long sum.
const F32_SUMS: Tolerance = Tolerance { relative: 1e-5, absolute: 1e-6 };

/// Big tiles in f16 (`shaders/matmul_f16.wgsl`): each weight and input rounded to f16 (2^-11 relative each), each
/// product rounded (2^-11), a step's 16 products summed in f16 (at most 15 roundings of 2^-11 of Σ|terms|), then
/// f32; 2^-25 absolute per f16 value below the normal range.
const F16_STEPS: Tolerance = Tolerance { relative: 18.0 / 2048.0, absolute: 1e-5 };

/// The bound a dense product of a `ty` matrix over `tokens` tokens is held to on this device.
fn tolerance(gpu: &Gpu, ty: GgmlType, tokens: usize) -> Tolerance {
    if matmul::multiplies_in_f16(gpu, ty, tokens as u32) {
        F16_STEPS
    } else {
        F32_SUMS
    }
}

/// Asserts `got` (row r at got[r]) is W·x within f32 rounding of a `cols`-term sum.
fn check_row(what: &str, got: &[f32], w: &[f64], x: &[f32], rows: usize, cols: usize) {
    check_row_within(what, got, w, x, rows, cols, F32_SUMS);
}

/// [`check_row`] within `tol`.
fn check_row_within(what: &str, got: &[f32], w: &[f64], x: &[f32], rows: usize, cols: usize, tol: Tolerance) {
    for r in 0..rows {
        let terms = (0..cols).map(|i| w[r * cols + i] * x[i] as f64);
        let want: f64 = terms.clone().sum();
        let scale: f64 = terms.map(f64::abs).sum();
        let err = (got[r] as f64 - want).abs();
        assert!(err <= tol.relative * scale + tol.absolute, "{what} row {r}: GPU {} vs reference {want} (|Δ| {err:.2e})", got[r]);
    }
}

/// Dense products over 1 to 70 tokens (row tiles below 17 tokens, wide tiles to 64, big ones above, partial
/// tiles every way),
/// the matrix at a byte offset, x and y strided with offsets; nothing written outside the product's rows.
pub async fn matmul_every_type_matches_reference(gpu: &Gpu) {
    let seed = Rand::test_seed();
    let mut rng = Rand::new(seed);
    let cases = [(GgmlType::Q4_K, 512, 70), (GgmlType::Q6_K, 256, 17), (GgmlType::Q4_K, 256, 3), (GgmlType::Q6_K, 768, 66), (GgmlType::Q5_0, 128, 5), (GgmlType::Q8_0, 96, 20), (GgmlType::F32, 64, 9), (GgmlType::F32, 96, 33), (GgmlType::F16, 160, 1)];
    for (ty, cols, tokens) in cases {
        let rows = 150; // two row tiles and a partial one of either kind
        let (bytes, w) = random_matrix(ty, rows, cols, &mut rng);
        let lead = 2 * ty.block_bytes().max(4) * 4;
        let mut buffer_bytes = vec![0x55u8; lead];
        buffer_bytes.extend_from_slice(&bytes);
        let w_buf = gpu.upload("w", &buffer_bytes);
        let (x_at, y_at) = (Rows::new(5, cols as u32 + 3), Rows::new(2, rows as u32 + 7));
        let x = rng.normals(5 + tokens * x_at.stride as usize, 1.0);
        let x_buf = gpu.upload("x", &f32_bytes(&x));
        let y_len = 2 + tokens * y_at.stride as usize;
        let y_buf = poisoned(gpu, "y", y_len);
        let m = Matrix { ty, rows: rows as u32, cols: cols as u32, byte_offset: lead as u64 };
        let mut pass = Pass::new();
        matmul::matmul(gpu, &mut pass, &w_buf, m, tokens as u32, &x_buf, x_at, &y_buf, y_at);
        pass.submit(gpu);
        let y = read_f32(gpu, &y_buf, y_len).await;
        let tol = tolerance(gpu, ty, tokens);
        let f16 = matmul::multiplies_in_f16(gpu, ty, tokens as u32);
        let what = format!("{ty} × {tokens} tokens{} (seed {seed})", if f16 { " in f16" } else { "" });
        assert!(y[..2].iter().all(|v| v.is_nan()), "{what}: wrote before y's offset");
        for t in 0..tokens {
            let row = &y[2 + t * y_at.stride as usize..][..y_at.stride as usize];
            let xt = &x[5 + t * x_at.stride as usize..][..cols];
            check_row_within(&format!("{what}, token {t}"), row, &w, xt, rows, cols, tol);
            assert!(row[rows..].iter().all(|v| v.is_nan()), "{what}, token {t}: wrote past its rows");
        }
    }
}

/// Dense products of few rows, whose columns [`matmul::matmul_split`] splits into slices (as many as the partial
/// sums' scratch holds) and adds back: the result equals W·x for each token, nothing written outside its rows;
/// over row, wide and big tiles, a quantised and an f32 matrix, and a scratch that holds fewer slices.
pub async fn split_matmul_matches_reference(gpu: &Gpu) {
    let seed = Rand::test_seed();
    let mut rng = Rand::new(seed);
    let cases = [(GgmlType::Q4_K, 40, 1024, 70, 1 << 20), (GgmlType::Q6_K, 130, 768, 5, 1 << 20), (GgmlType::F32, 24, 1280, 200, 1 << 20), (GgmlType::Q4_K, 40, 2048, 33, 2 * 40 * 33)];
    for (ty, rows, cols, tokens, capacity) in cases {
        let (bytes, w) = random_matrix(ty, rows, cols, &mut rng);
        let w_buf = gpu.upload("w", &bytes);
        let (x_at, y_at) = (Rows::new(3, cols as u32 + 5), Rows::new(1, rows as u32 + 4));
        let x = rng.normals(3 + tokens * x_at.stride as usize, 1.0);
        let x_buf = gpu.upload("x", &f32_bytes(&x));
        let y_len = 1 + tokens * y_at.stride as usize;
        let y_buf = poisoned(gpu, "y", y_len);
        let partials = gpu.storage_buffer("partials", 4 * capacity as u64);
        let m = Matrix { ty, rows: rows as u32, cols: cols as u32, byte_offset: 0 };
        let slices = matmul::split_slices(m, tokens as u32, capacity as u64);
        let what = format!("{ty} {rows}×{cols} × {tokens} tokens in {slices} slices (seed {seed})");
        let want_slices = if capacity < 1 << 20 { 2 } else { cols / 256 };
        assert_eq!(slices as usize, want_slices, "{what}: a product of a few tiles takes every slice the scratch holds");
        let mut pass = Pass::new();
        matmul::matmul_split(gpu, &mut pass, &w_buf, m, tokens as u32, &x_buf, x_at, &y_buf, y_at, &partials);
        pass.submit(gpu);
        let y = read_f32(gpu, &y_buf, y_len).await;
        assert!(y[0].is_nan(), "{what}: wrote before y's offset");
        for t in 0..tokens {
            let row = &y[1 + t * y_at.stride as usize..][..y_at.stride as usize];
            let xt = &x[3 + t * x_at.stride as usize..][..cols];
            check_row_within(&format!("{what}, token {t}"), row, &w, xt, rows, cols, tolerance(gpu, ty, tokens));
            assert!(row[rows..].iter().all(|v| v.is_nan()), "{what}, token {t}: wrote past its rows");
        }
    }
}

/// Per-head products over several tokens (MLA's absorbed k_b): matrix b at a byte stride, batch and token strides.
pub async fn batched_matmul_matches_reference(gpu: &Gpu) {
    let seed = Rand::test_seed();
    let mut rng = Rand::new(seed);
    for tokens in [4usize, 33, 130] {
        let (ty, rows, cols, heads) = (GgmlType::Q5_0, 96, 128, 3);
        let (bytes, w) = random_matrix(ty, rows * heads, cols, &mut rng);
        let w_buf = gpu.upload("w", &bytes);
        let (x_batch, y_batch) = (192u32, 100u32);
        let (x_at, y_at) = (Rows::new(0, heads as u32 * x_batch), Rows::new(0, heads as u32 * y_batch));
        let x = rng.normals(tokens * x_at.stride as usize, 1.0);
        let x_buf = gpu.upload("x", &f32_bytes(&x));
        let y_len = tokens * y_at.stride as usize;
        let y_buf = poisoned(gpu, "y", y_len);
        let m = Matrix { ty, rows: rows as u32, cols: cols as u32, byte_offset: 0 };
        let stride = (rows * cols / 32 * 22) as u64;
        let mut pass = Pass::new();
        matmul::batched(gpu, &mut pass, &w_buf, m, stride, heads as u32, tokens as u32, &x_buf, x_at, x_batch, &y_buf, y_at, y_batch);
        pass.submit(gpu);
        let y = read_f32(gpu, &y_buf, y_len).await;
        for t in 0..tokens {
            for h in 0..heads {
                let at = t * y_at.stride as usize + h * y_batch as usize;
                let xs = &x[t * x_at.stride as usize + h * x_batch as usize..][..cols];
                check_row_within(&format!("token {t} of {tokens}, head {h} (seed {seed})"), &y[at..][..rows], &w[h * rows * cols..][..rows * cols], xs, rows, cols, tolerance(gpu, ty, tokens));
                assert!(y[at + rows..at + y_batch as usize].iter().all(|v| v.is_nan()), "token {t} head {h}: wrote past its rows");
            }
        }
    }
}

/// The experts of a chunk grouped on the GPU (`moe_group`) and applied from pool slots spread over two pool
/// buffers: every pair whose expert the table maps gets its expert's product, pairs of unmapped experts are left
/// alone. Over 70 tokens (wide tiles) the experts' pair counts (70: more than a tile, 1, 6, 12, 30, 18) give
/// every column split of a tile; on row and block tiles (16 pairs an entry) an expert of 70 pairs takes 5 entries,
/// and the others fill 1 to 4 of a block tile's groups of 4 pairs; over 16 (row tiles) they are 16, 1, 6 and 6,
/// with one expert not in the pool. Block tiles also take a Q8_0 matrix whose 96 columns end inside a step; in the
/// tall ones' last tiles (of 200, 130 and 70 rows) some invocations have both their rows, some one, some none.
/// Only the cases of the `kinds` given run.
pub async fn grouped_expert_matmul_reads_each_pairs_expert(gpu: &Gpu, kinds: &[ExpertTiles]) {
    let seed = Rand::test_seed();
    let mut rng = Rand::new(seed);
    let k_quants = [(GgmlType::Q6_K, 200, 256), (GgmlType::Q4_K, 130, 512)];
    let with_q8 = [(GgmlType::Q6_K, 200, 256), (GgmlType::Q4_K, 130, 512), (GgmlType::Q8_0, 70, 96)];
    let cases: [(usize, ExpertTiles, &[(GgmlType, usize, usize)]); 7] = [
        (70, ExpertTiles::Wide, &k_quants),
        (70, ExpertTiles::Rows, &k_quants),
        (70, ExpertTiles::Blocks, &with_q8),
        (70, ExpertTiles::BlocksNear, &with_q8),
        (70, ExpertTiles::BlocksTall, &with_q8),
        (70, ExpertTiles::BlocksQuad, &with_q8),
        (matmul::FEW_TOKENS as usize, ExpertTiles::Rows, &k_quants),
    ];
    for (tokens, tiles, types) in cases.into_iter().filter(|(_, tiles, _)| kinds.contains(tiles)) {
        for &(ty, rows, cols) in types {
            grouped_case(gpu, &mut rng, seed, ty, rows, cols, tokens, tiles).await;
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn grouped_case(gpu: &Gpu, rng: &mut Rand, seed: u64, ty: GgmlType, rows: usize, cols: usize, tokens: usize, tiles: ExpertTiles) {
    let tile_pairs = tiles.pairs();
    let (slots_per_chunk, n_chunks, n_expert, k) = (3u32, 2u32, 8u32, 2usize);
    let part_offset = 210u64 * 4; // the matrix starts inside the record, after other rows
    let matrix_bytes = rows as u64 * ty.bytes_for(cols as u64).unwrap();
    let slot_bytes = (part_offset + matrix_bytes).next_multiple_of(256);
    let mut chunks = Vec::new();
    let mut slot_values = Vec::new();
    for _ in 0..n_chunks {
        let mut bytes = vec![0u8; (slot_bytes * slots_per_chunk as u64) as usize];
        for s in 0..slots_per_chunk as usize {
            let (b, v) = random_matrix(ty, rows, cols, rng);
            bytes[s * slot_bytes as usize + part_offset as usize..][..b.len()].copy_from_slice(&b);
            slot_values.push(v);
        }
        chunks.push(gpu.upload("pool", &bytes));
    }
    // layer 1 of a 2-layer table: experts 5, 2, 7, 1, 4, 6 in slots 4, 0, 2, 5, 1, 3; expert 3 selected but not
    // in the pool
    let mut table = vec![u32::MAX; 2 * n_expert as usize];
    for (e, s) in [(5usize, 4u32), (2, 0), (7, 2), (1, 5), (4, 1), (6, 3)] {
        table[n_expert as usize + e] = s;
    }
    let table_buf = gpu.upload("slots", bytemuck::cast_slice(&table));
    // expert 5 in every token, the second pick by runs of tokens
    let words = moe::selection_words(k as u32);
    let second = |t: usize| match t {
        0 => 2u32,
        1..=6 => 7,
        7..=9 => 3,
        10..=21 => 4,
        22..=51 => 6,
        _ => 1,
    };
    let mut sel = vec![0u32; 1 + tokens * words]; // one word before the first selection
    for t in 0..tokens {
        sel[1 + t * words] = 5;
        sel[1 + t * words + 1] = second(t);
    }
    let sel_buf = gpu.upload("selections", bytemuck::cast_slice(&sel));
    let max_tiles = matmul::max_tiles((tokens * k) as u32, n_expert, tile_pairs);
    let list_at = moe::group_list_at(max_tiles);
    let groups = gpu.storage_buffer("groups", (list_at as u64 + (tokens * k) as u64) * 4);
    let x = rng.normals(3 + tokens * cols, 1.0);
    let x_buf = gpu.upload("x", &f32_bytes(&x));
    let y_stride = rows + 4;
    let y_buf = poisoned(gpu, "y", tokens * k * y_stride);
    let m = Matrix { ty, rows: rows as u32, cols: cols as u32, byte_offset: part_offset };
    let mut pass = Pass::new();
    moe::group(gpu, &mut pass, &sel_buf, 1, tokens as u32, k as u32, n_expert, &table_buf, n_expert, tile_pairs, max_tiles, &groups);
    for (index, buffer) in chunks.iter().enumerate() {
        let chunk = PoolChunk { buffer, index: index as u32, slots_per_chunk, slot_bytes };
        matmul::experts(gpu, &mut pass, chunk, m, tiles, &groups, list_at, max_tiles, &x_buf, Rows::new(3, cols as u32), k as u32, &y_buf, Rows::new(0, y_stride as u32));
    }
    pass.submit(gpu);
    let y = read_f32(gpu, &y_buf, tokens * k * y_stride).await;
    for t in 0..tokens {
        for j in 0..k {
            let e = sel[1 + t * words + j] as usize;
            let row = &y[(t * k + j) * y_stride..][..y_stride];
            let what = format!("{ty}, {tokens} tokens in {tiles:?} tiles: token {t} pick {j}: expert {e} (seed {seed})");
            match table[n_expert as usize + e] {
                u32::MAX => assert!(row.iter().all(|v| v.is_nan()), "{what}: not in the pool, yet written"),
                slot => {
                    check_row(&what, row, &slot_values[slot as usize], &x[3 + t * cols..][..cols], rows, cols);
                    assert!(row[rows..].iter().all(|v| v.is_nan()), "{what}: wrote past its rows");
                }
            }
        }
    }
}
