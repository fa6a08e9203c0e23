//! Matrix-vector products, RMSNorm and argmax against f64 CPU references (weights dequantised by the
//! CPU reference, which is bit-exact with ggml).

use super::{assert_close, f32_bytes, poisoned, random_blocks, read_f32, Rand};
use lingtab::gpu::matvec::{self, Matrix, PoolChunk, Strided, Variant};
use lingtab::gpu::{norm, Gpu, Pass};
use lingtab::quant::{self, GgmlType};

/// `rows` random rows of `cols` values of `ty`, as bytes and as dequantised f64.
fn random_matrix(ty: GgmlType, rows: usize, cols: usize, rng: &mut Rand) -> (Vec<u8>, Vec<f64>) {
    let bytes = match ty {
        GgmlType::F32 => f32_bytes(&rng.normals(rows * cols, 0.1)),
        GgmlType::F16 => rng.normals(rows * cols, 0.1).iter().flat_map(|&v| half::f16::from_f32(v).to_le_bytes()).collect(),
        _ => random_blocks(ty, rows * cols / ty.block_elems(), rng.next_u64()),
    };
    let values = quant::dequantize_to_vec(ty, &bytes).unwrap().iter().map(|&v| v as f64).collect();
    (bytes, values)
}

fn reference(w: &[f64], x: &[f32], rows: usize, cols: usize) -> Vec<f64> {
    (0..rows).map(|r| (0..cols).map(|i| w[r * cols + i] * x[i] as f64).sum()).collect()
}

/// Tolerance for an f32 sum of `cols` products: relative to the sum of |terms|.
fn check(what: &str, got: &[f32], w: &[f64], x: &[f32], rows: usize, cols: usize) {
    let want = reference(w, x, rows, cols);
    let scale: Vec<f64> = (0..rows).map(|r| (0..cols).map(|i| (w[r * cols + i] * x[i] as f64).abs()).sum::<f64>()).collect();
    for r in 0..rows {
        let err = (got[r] as f64 - want[r]).abs();
        assert!(err <= 1e-5 * scale[r] + 1e-6, "{what} row {r}: GPU {} vs reference {} (|Δ| {err:.2e}, Σ|terms| {:.2e})", got[r], want[r], scale[r]);
    }
}

pub async fn matvec_every_type_matches_reference(gpu: &Gpu, variants: &[Variant]) {
    let seed = Rand::test_seed();
    let mut rng = Rand::new(seed);
    // Q4_K/Q6_K with 1, 2, 3, 5 and 18 blocks a row (one or two blocks side by side; with 5, the two sides'
    // lanes walk 3 and 2 blocks); 37 rows leave every variant a part-filled last workgroup
    let shapes = [(GgmlType::Q4_K, 512), (GgmlType::Q4_K, 768), (GgmlType::Q6_K, 768), (GgmlType::Q6_K, 256), (GgmlType::Q6_K, 512), (GgmlType::Q6_K, 1280), (GgmlType::Q6_K, 2560), (GgmlType::Q4_K, 4608), (GgmlType::Q5_0, 96), (GgmlType::Q8_0, 160), (GgmlType::F32, 2112), (GgmlType::F16, 64)];
    for (v, (ty, cols)) in variants.iter().flat_map(|&v| shapes.into_iter().map(move |s| (v, s))) {
        let rows = 37;
        let (bytes, w) = random_matrix(ty, rows, cols, &mut rng);
        // the matrix sits after some other bytes, x and y at offsets, as inside real buffers
        let lead = 2 * ty.block_bytes().max(4) * 4;
        let mut buffer_bytes = vec![0x55u8; lead];
        buffer_bytes.extend_from_slice(&bytes);
        let w_buf = gpu.upload("w", &buffer_bytes);
        let x = rng.normals(cols, 1.0);
        // x at an odd offset (read as f32) and at a multiple of 4 in whole vec4s (read as vec4)
        for x_at in [5usize, 4] {
            let mut x_padded = vec![7.0f32; x_at];
            x_padded.extend_from_slice(&x);
            x_padded.resize(x_padded.len().next_multiple_of(4), 7.0);
            let x_buf = gpu.upload("x", &f32_bytes(&x_padded));
            let y_buf = poisoned(gpu, "y", rows + 3);
            let m = Matrix { ty, rows: rows as u32, cols: cols as u32, byte_offset: lead as u64 };
            let mut pass = Pass::new();
            matvec::batched_as(v, gpu, &mut pass, &w_buf, m, 0, &x_buf, Strided::at(x_at as u32), &y_buf, Strided::at(3), 1);
            pass.submit(gpu);
            let y = read_f32(gpu, &y_buf, rows + 3).await;
            let name = v.name();
            assert!(y[..3].iter().all(|v| v.is_nan()), "{ty} {name}: wrote before y_offset");
            check(&format!("{ty}×{cols} {name} x at {x_at} (seed {seed})"), &y[3..], &w, &x, rows, cols);
        }
    }
}

/// A product added to y (the residual adds of a decode step): exactly y + the plain product's output, for the
/// types the trunk's output products have; the rows before y_at keep their values.
pub async fn matvec_add_adds_the_product_to_y(gpu: &Gpu) {
    let seed = Rand::test_seed();
    let mut rng = Rand::new(seed);
    let rows = 70;
    // the CPU adapters' kernels (one invocation a row) and a GPU's (a group of lanes a row)
    for cpu_kernels in [true, false] {
        gpu.set_cpu_kernels(cpu_kernels);
        for (ty, cols) in [(GgmlType::Q4_K, 512), (GgmlType::Q6_K, 768), (GgmlType::Q8_0, 160), (GgmlType::F32, 96)] {
            let (bytes, w) = random_matrix(ty, rows, cols, &mut rng);
            let w_buf = gpu.upload("w", &bytes);
            let x = rng.normals(cols, 1.0);
            let x_buf = gpu.upload("x", &f32_bytes(&x));
            let y0 = rng.normals(rows + 3, 1.0);
            let plain = poisoned(gpu, "plain", rows + 3);
            let added = gpu.upload("added", &f32_bytes(&y0));
            let m = Matrix { ty, rows: rows as u32, cols: cols as u32, byte_offset: 0 };
            let mut pass = Pass::new();
            matvec::matvec(gpu, &mut pass, &w_buf, m, &x_buf, 0, &plain, 3);
            matvec::matvec_add(gpu, &mut pass, &w_buf, m, &x_buf, 0, &added, 3);
            pass.submit(gpu);
            let (plain, added) = (read_f32(gpu, &plain, rows + 3).await, read_f32(gpu, &added, rows + 3).await);
            check(&format!("{ty}×{cols} (seed {seed})"), &plain[3..], &w, &x, rows, cols);
            assert_eq!(added[..3], y0[..3], "{ty}: wrote before y_at");
            for r in 0..rows {
                assert_eq!(added[3 + r], y0[3 + r] + plain[3 + r], "{ty}×{cols} row {r}: y + W·x (seed {seed})");
            }
        }
    }
    gpu.set_cpu_kernels(true);
}

/// Stacked matrices (a KDA layer's projections): one dispatch writes each member's rows to its own place in y,
/// members of 1 row to many and out of y's order, with gaps in y left as they were; the same as each product alone.
pub async fn stacked_matvec_matches_each_product(gpu: &Gpu) {
    let seed = Rand::test_seed();
    let mut rng = Rand::new(seed);
    // the CPU adapters' kernels (one invocation a row) and a GPU's (a group of lanes a row)
    for cpu_kernels in [true, false] {
        gpu.set_cpu_kernels(cpu_kernels);
        for (ty, cols) in [(GgmlType::Q4_K, 512), (GgmlType::Q6_K, 768), (GgmlType::Q8_0, 160), (GgmlType::F32, 96)] {
            // (rows, where they go in y): a one-row member, members written in another order than they are stacked,
            // the last ending before y does
            let members = [(37usize, 200usize), (1, 5), (64, 100), (8, 300), (3, 0)];
            let y_len = 320;
            let mut stack = Vec::new();
            let mut matrices = Vec::new();
            let mut segments = Vec::new();
            let mut row = 0u32;
            for &(rows, y_at) in &members {
                let (bytes, w) = random_matrix(ty, rows, cols, &mut rng);
                segments.push(matvec::Segment { first_row: row, y_at: y_at as u32 });
                stack.extend_from_slice(&bytes);
                matrices.push(w);
                row += rows as u32;
            }
            let w_buf = gpu.upload("stack", &stack);
            let x = rng.normals(cols + 4, 1.0);
            let x_buf = gpu.upload("x", &f32_bytes(&x));
            let y_buf = poisoned(gpu, "y", y_len);
            let m = Matrix { ty, rows: row, cols: cols as u32, byte_offset: 0 };
            let mut pass = Pass::new();
            matvec::stacked(gpu, &mut pass, &w_buf, m, &segments, &x_buf, 4, &y_buf);
            pass.submit(gpu);
            let y = read_f32(gpu, &y_buf, y_len).await;
            let mut written = vec![false; y_len];
            for (i, &(rows, y_at)) in members.iter().enumerate() {
                check(&format!("{ty}×{cols} member {i} (seed {seed})"), &y[y_at..y_at + rows], &matrices[i], &x[4..], rows, cols);
                written[y_at..y_at + rows].iter_mut().for_each(|w| *w = true);
            }
            for (i, _) in written.iter().enumerate().filter(|(_, w)| !**w) {
                assert!(y[i].is_nan(), "{ty}: y[{i}] belongs to no member but was written");
            }
        }
    }
    gpu.set_cpu_kernels(true);
}

/// Per-head products like MLA's absorbed k_b: matrix b at a byte stride, x and y strided.
pub async fn batched_matvec_matches_reference(gpu: &Gpu) {
    let seed = Rand::test_seed();
    let mut rng = Rand::new(seed);
    let (ty, rows, cols, heads) = (GgmlType::Q5_0, 96, 128, 3);
    let (bytes, w) = random_matrix(ty, rows * heads, cols, &mut rng);
    let w_buf = gpu.upload("w", &bytes);
    let (x_stride, y_stride) = (192u32, 100u32);
    let x = rng.normals(heads * x_stride as usize, 1.0);
    let x_buf = gpu.upload("x", &f32_bytes(&x));
    let y_buf = poisoned(gpu, "y", heads * y_stride as usize);
    let m = Matrix { ty, rows: rows as u32, cols: cols as u32, byte_offset: 0 };
    let stride = (rows * cols / 32 * 22) as u64;
    let mut pass = Pass::new();
    matvec::batched(gpu, &mut pass, &w_buf, m, stride, &x_buf, Strided { offset: 0, stride: x_stride }, &y_buf, Strided { offset: 0, stride: y_stride }, heads as u32);
    pass.submit(gpu);
    let y = read_f32(gpu, &y_buf, heads * y_stride as usize).await;
    for h in 0..heads {
        let xs = &x[h * x_stride as usize..][..cols];
        check(&format!("head {h} (seed {seed})"), &y[h * y_stride as usize..][..rows], &w[h * rows * cols..][..rows * cols], xs, rows, cols);
        assert!(y[h * y_stride as usize + rows..(h + 1) * y_stride as usize].iter().all(|v| v.is_nan()), "head {h}: wrote past its rows");
    }
}

/// An MLA decode step's value product as one dispatch (matvec::batched_with): x the sum of the attention's column
/// slices, each head's outputs times σ of its gate logit. Bit for bit what sum_slices, the product and head_gate
/// give one after another (the same sums in the same order), for every variant; and near the f64 reference.
pub async fn sliced_and_gated_products_match_the_three_dispatches(gpu: &Gpu, variants: &[Variant]) {
    let seed = Rand::test_seed();
    let mut rng = Rand::new(seed);
    let heads = 3usize;
    for (v, (ty, rows, cols)) in variants.iter().flat_map(|&v| [(GgmlType::Q5_0, 40usize, 512usize), (GgmlType::Q4_K, 37, 512), (GgmlType::Q8_0, 40, 64)].into_iter().map(move |s| (v, s))) {
        let (bytes, w) = random_matrix(ty, rows * heads, cols, &mut rng);
        let w_buf = gpu.upload("w", &bytes);
        let m = Matrix { ty, rows: rows as u32, cols: cols as u32, byte_offset: 0 };
        let w_stride = ty.bytes_for((rows * cols) as u64).unwrap();
        // the gate logits after other values in their buffer, as a decode step's projections hold them
        let gate_at = 5u32;
        let logits = rng.normals(gate_at as usize + heads, 3.0);
        let logits_buf = gpu.upload("gate logits", &f32_bytes(&logits));
        for slices in [1u32, 3, matvec::MAX_SLICES] {
            // slice s of head h at (s·heads + h)·cols, as the attention's value product leaves them
            let stride = (heads * cols) as u32;
            let parts = rng.normals(slices as usize * heads * cols, 1.0);
            let parts_buf = gpu.upload("slices", &f32_bytes(&parts));
            let (summed, want_y, got_y) = (poisoned(gpu, "summed", heads * cols), poisoned(gpu, "y apart", heads * rows + 3), poisoned(gpu, "y", heads * rows + 3));
            let x_at = Strided { offset: 0, stride: cols as u32 };
            let y_at = Strided { offset: 0, stride: rows as u32 };
            let mut pass = Pass::new();
            lingtab::gpu::matmul::sum_slices(gpu, &mut pass, &parts_buf, cols as u32, heads as u32, slices, &summed, lingtab::gpu::matmul::Rows::new(0, cols as u32));
            matvec::batched_as(v, gpu, &mut pass, &w_buf, m, w_stride, &summed, x_at, &want_y, y_at, heads as u32);
            lingtab::gpu::mla::head_gate(gpu, &mut pass, &want_y, &logits_buf, gate_at, heads as u32, rows as u32);
            let gate = matvec::Gate { logits: &logits_buf, at: gate_at };
            matvec::batched_with_as(v, gpu, &mut pass, &w_buf, m, w_stride, &parts_buf, x_at, Some(matvec::Slices { count: slices, stride }), Some(gate), &got_y, y_at, heads as u32);
            pass.submit(gpu);
            let (want, got) = (read_f32(gpu, &want_y, heads * rows + 3).await, read_f32(gpu, &got_y, heads * rows + 3).await);
            let what = format!("{ty}×{cols} {} in {slices} slices (seed {seed})", v.name());
            assert!(got[heads * rows..].iter().all(|v| v.is_nan()), "{what}: wrote past the heads' rows");
            assert_eq!(got[..heads * rows].iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want[..heads * rows].iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "{what}: differs from sum_slices, the product and head_gate");
            for h in 0..heads {
                let x: Vec<f32> = (0..cols).map(|i| (0..slices as usize).fold(0f32, |t, s| t + parts[(s * heads + h) * cols + i])).collect();
                let gate = 1.0 / (1.0 + (-logits[gate_at as usize + h] as f64).exp());
                let ungated: Vec<f32> = got[h * rows..][..rows].iter().map(|&v| (v as f64 / gate) as f32).collect();
                check(&format!("{what} head {h}"), &ungated, &w[h * rows * cols..][..rows * cols], &x, rows, cols);
            }
        }
    }
}

/// Experts read from pool slots spread over two pool buffers, selected through `sel` and the slot table.
pub async fn expert_matvec_reads_selected_slots(gpu: &Gpu) {
    let seed = Rand::test_seed();
    let mut rng = Rand::new(seed);
    for v in Variant::ALL {
        for (ty, cols) in [(GgmlType::Q4_K, 256), (GgmlType::Q6_K, 768), (GgmlType::Q8_0, 64)] {
            experts_case(gpu, v, ty, 40, cols, None, None, &mut rng, seed).await;
        }
    }
    // with a shared expert riding as the last batch
    for (ty, cols) in [(GgmlType::Q4_K, 256), (GgmlType::Q8_0, 64)] {
        let v = Variant::for_matrix(gpu, Matrix { ty, rows: 40, cols, byte_offset: 0 });
        experts_case(gpu, v, ty, 40, cols as usize, None, Some(0.0), &mut rng, seed).await;
    }
}

/// `glu`: the experts' x is the SwiGLU activation (this clamp limit) of [gate | up] pairs, read by experts_glu.
/// `shared`: a shared expert (in a slot no selected expert has) rides as batch k, its SwiGLU clamped at this limit
/// (experts_and_shared; `v` must be the variant the engine picks).
#[allow(clippy::too_many_arguments)]
async fn experts_case(gpu: &Gpu, v: Variant, ty: GgmlType, rows: usize, cols: usize, glu: Option<f32>, shared: Option<f32>, rng: &mut Rand, seed: u64) {
    let (slots_per_chunk, n_chunks, n_expert) = (3u32, 2u32, 8u32);
    let part_offset = ty.block_bytes() as u64 * 6; // the matrix starts inside the record, after other rows
    let matrix_bytes = (rows * cols / ty.block_elems() * ty.block_bytes()) as u64;
    let slot_bytes = (part_offset + matrix_bytes).next_multiple_of(256);
    // pool content: every slot holds a different random matrix
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
    // layer 1 of a 2-layer table; experts 5, 2, 7 selected, living in slots 4, 0, 2
    let mut table = vec![u32::MAX; 2 * n_expert as usize];
    for (e, s) in [(5usize, 4u32), (2, 0), (7, 2), (1, 5)] {
        table[n_expert as usize + e] = s;
    }
    let sel = [5u32, 2, 7];
    let k = sel.len();
    // the slot of each batch: the selected experts', then the shared expert's (slot 3: no expert's)
    let mut batch_slots: Vec<usize> = sel.iter().map(|&e| table[n_expert as usize + e as usize] as usize).collect();
    let mut limits = vec![glu.unwrap_or(0.0); k];
    if let Some(limit) = shared {
        batch_slots.push(3);
        limits.push(limit);
    }
    let batches = batch_slots.len();
    let table_buf = gpu.upload("slots", bytemuck::cast_slice(&table));
    let sel_buf = gpu.upload("sel", bytemuck::cast_slice(&sel));
    let width = if glu.is_some() { 2 * cols } else { cols };
    let x_in = rng.normals(batches * width, 1.5);
    let x: Vec<f32> = match glu {
        Some(_) => x_in.chunks(width).zip(&limits).flat_map(|(gu, &limit)| swiglu(&gu[..cols], &gu[cols..], limit)).collect(),
        None => x_in.clone(),
    };
    let x_buf = gpu.upload("x", &f32_bytes(&x_in));
    let y_buf = poisoned(gpu, "y", batches * rows + 1);
    let m = Matrix { ty, rows: rows as u32, cols: cols as u32, byte_offset: part_offset };
    let mut pass = Pass::new();
    for (index, buffer) in chunks.iter().enumerate() {
        let chunk = PoolChunk { buffer, index: index as u32, slots_per_chunk, slot_bytes };
        let (x_at, y_at) = (Strided { offset: 0, stride: width as u32 }, Strided { offset: 0, stride: rows as u32 });
        let glu = glu.map(|limit| matvec::Glu { ff: cols as u32, limit });
        match (shared, glu) {
            (Some(limit), _) => matvec::experts_and_shared(gpu, &mut pass, chunk, m, &sel_buf, &table_buf, n_expert, k as u32, Some(matvec::SharedExpert { slot: 3, glu_limit: limit }), &x_buf, x_at, glu, &y_buf, y_at),
            (None, Some(glu)) => matvec::experts_glu(gpu, &mut pass, chunk, m, &sel_buf, &table_buf, n_expert, k as u32, &x_buf, x_at, glu, &y_buf, y_at),
            (None, None) => matvec::experts_as(v, gpu, &mut pass, chunk, m, &sel_buf, &table_buf, n_expert, k as u32, &x_buf, x_at, &y_buf, y_at),
        }
    }
    pass.submit(gpu);
    let y = read_f32(gpu, &y_buf, batches * rows + 1).await;
    for (j, &slot) in batch_slots.iter().enumerate() {
        let what = format!("{ty}×{cols} {} batch {j} in slot {slot}, limit {} (seed {seed})", v.name(), limits[j]);
        check(&what, &y[j * rows..][..rows], &slot_values[slot], &x[j * cols..][..cols], rows, cols);
    }
    assert!(y[batches * rows].is_nan(), "written past the last batch");
}

/// moe.wgsl's SwiGLU activation, in f32: SiLU(g)·u, or min(SiLU(g), limit)·clamp(u, ±limit) for limit > 1e-6.
fn swiglu(gate: &[f32], up: &[f32], limit: f32) -> Vec<f32> {
    gate.iter()
        .zip(up)
        .map(|(&g, &u)| {
            let silu = g / (1.0 + (-g).exp());
            if limit > 1e-6 { silu.min(limit) * u.clamp(-limit, limit) } else { silu * u }
        })
        .collect()
}

/// Down products that compute their input as a SwiGLU's activation of [gate | up] (no swiglu dispatch before
/// them): the same as the product of the activations, dense (written or added to y) and for selected experts,
/// with and without the clamp.
pub async fn swiglu_products_match_activation_then_product(gpu: &Gpu) {
    let seed = Rand::test_seed();
    let mut rng = Rand::new(seed);
    let rows = 70;
    // the CPU adapters' kernels (one invocation a row) and a GPU's (a group of lanes a row)
    for cpu_kernels in [true, false] {
        gpu.set_cpu_kernels(cpu_kernels);
        for (ty, cols) in [(GgmlType::Q4_K, 768), (GgmlType::Q6_K, 512), (GgmlType::Q8_0, 96), (GgmlType::Q4_K, matvec::GLU_MAX_COLS as usize)] {
            for limit in [0.0f32, 1.5] {
                let (bytes, w) = random_matrix(ty, rows, cols, &mut rng);
                let w_buf = gpu.upload("w", &bytes);
                // [gate | up] after other values, as the FFN's products leave them
                let lead = 4;
                let gu = rng.normals(lead + 2 * cols, 1.5);
                let act = swiglu(&gu[lead..lead + cols], &gu[lead + cols..], limit);
                let gu_buf = gpu.upload("gate|up", &f32_bytes(&gu));
                let y0 = rng.normals(rows + 3, 1.0);
                let (written, added) = (poisoned(gpu, "written", rows + 3), gpu.upload("added", &f32_bytes(&y0)));
                let m = Matrix { ty, rows: rows as u32, cols: cols as u32, byte_offset: 0 };
                let glu = matvec::Glu { ff: cols as u32, limit };
                let mut pass = Pass::new();
                matvec::matvec_glu(gpu, &mut pass, &w_buf, m, &gu_buf, lead as u32, glu, &written, 3, false);
                matvec::matvec_glu(gpu, &mut pass, &w_buf, m, &gu_buf, lead as u32, glu, &added, 3, true);
                pass.submit(gpu);
                let (written, added) = (read_f32(gpu, &written, rows + 3).await, read_f32(gpu, &added, rows + 3).await);
                let what = format!("{ty}×{cols} limit {limit} (seed {seed})");
                assert!(written[..3].iter().all(|v| v.is_nan()), "{what}: wrote before y_at");
                check(&what, &written[3..], &w, &act, rows, cols);
                assert_eq!(added[..3], y0[..3], "{what}: wrote before y_at");
                for r in 0..rows {
                    assert_eq!(added[3 + r], y0[3 + r] + written[3 + r], "{what} row {r}: y + W·a(gu)");
                }
            }
        }
        for (ty, cols) in [(GgmlType::Q4_K, 768), (GgmlType::Q6_K, 256)] {
            for limit in [0.0f32, 1.5] {
                let v = Variant::for_matrix(gpu, Matrix { ty, rows: 40, cols: cols as u32, byte_offset: 0 });
                experts_case(gpu, v, ty, 40, cols, Some(limit), None, &mut rng, seed).await;
                // a riding shared expert with a clamp of its own
                experts_case(gpu, v, ty, 40, cols, Some(limit), Some(if limit == 0.0 { 0.8 } else { 0.0 }), &mut rng, seed).await;
            }
        }
    }
    gpu.set_cpu_kernels(true);
}

/// A product of x's RMSNorm computed in the product ([`matvec::Norm`]): the norm it leaves in `out` matches an
/// f64 RMSNorm, nothing is written past it, and the product is the matrix times that norm, for the router's type
/// and for quantised rows up to the longest a norm product takes.
pub async fn norm_products_match_norm_then_product(gpu: &Gpu) {
    let seed = Rand::test_seed();
    let mut rng = Rand::new(seed);
    let rows = 70;
    for (ty, cols) in [(GgmlType::F32, 2560), (GgmlType::Q4_K, 768), (GgmlType::Q4_K, matvec::NORM_MAX_COLS as usize)] {
        let (bytes, w) = random_matrix(ty, rows, cols, &mut rng);
        let w_buf = gpu.upload("w", &bytes);
        let lead = 4;
        let x = rng.normals(lead + cols, 3.0);
        let norm_w: Vec<f32> = (0..cols).map(|_| 1.0 + 0.1 * rng.normal()).collect();
        let (x_buf, norm_w_buf) = (gpu.upload("x", &f32_bytes(&x)), gpu.upload("norm w", &f32_bytes(&norm_w)));
        let (out, y) = (poisoned(gpu, "norm out", cols + 2), poisoned(gpu, "y", rows + 3));
        let eps = 1e-6f32;
        let m = Matrix { ty, rows: rows as u32, cols: cols as u32, byte_offset: 0 };
        let mut pass = Pass::new();
        matvec::matvec_norm(gpu, &mut pass, &w_buf, m, &x_buf, lead as u32, matvec::Norm { w: &norm_w_buf, eps, out: &out }, &y, 3);
        pass.submit(gpu);
        let what = format!("{ty}×{cols} (seed {seed})");
        let xs = &x[lead..];
        let mean_sq = xs.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / cols as f64;
        let want: Vec<f64> = xs.iter().zip(&norm_w).map(|(&v, &wi)| v as f64 / (mean_sq + eps as f64).sqrt() * wi as f64).collect();
        let normed = read_f32(gpu, &out, cols + 2).await;
        assert_close(&format!("norm of {what}"), &normed[..cols], &want, 1e-6, 1e-5);
        assert!(normed[cols..].iter().all(|v| v.is_nan()), "{what}: wrote past the norm");
        let y = read_f32(gpu, &y, rows + 3).await;
        assert!(y[..3].iter().all(|v| v.is_nan()), "{what}: wrote before y_at");
        check(&what, &y[3..], &w, &normed[..cols], rows, cols);
    }
}

pub async fn rms_norm_and_argmax_match_reference(gpu: &Gpu) {
    let seed = Rand::test_seed();
    let mut rng = Rand::new(seed);
    // rows held in registers (up to 4096 values: 300, exactly 4096) and one too long for that (5000)
    for n in [300usize, 4096, 5000] {
        let x: Vec<f32> = (0..n + 4).map(|_| rng.normal() * 3.0).collect();
        let w: Vec<f32> = (0..n).map(|_| 1.0 + 0.1 * rng.normal()).collect();
        let eps = 1e-6f32;
        let (x_buf, w_buf) = (gpu.upload("x", &f32_bytes(&x)), gpu.upload("w", &f32_bytes(&w)));
        let y_buf = poisoned(gpu, "y", n + 2);
        let mut pass = Pass::new();
        norm::rms_norm(gpu, &mut pass, &x_buf, 4, &w_buf, &y_buf, 2, n as u32, eps);
        pass.submit(gpu);
        let y = read_f32(gpu, &y_buf, n + 2).await;
        let xs = &x[4..];
        let mean_sq = xs.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / n as f64;
        let want: Vec<f64> = xs.iter().zip(&w).map(|(&v, &wi)| v as f64 / (mean_sq + eps as f64).sqrt() * wi as f64).collect();
        assert_close(&format!("rms_norm of {n} (seed {seed})"), &y[2..], &want, 1e-6, 1e-5);
        assert!(y[0].is_nan() && y[1].is_nan());
    }

    // argmax: a tie between two maxima picks the lower index across the first stage's workgroups (a vocabulary
    // of Ling's size: all of them), the maximum also last or first; then, in the same out buffer, shorter rows
    // on fewer workgroups (5000 values: 5; 1001: one), whose second stage must not read the longer rows' partials
    // (their maxima are higher)
    let out = gpu.upload("out", &vec![0xFF; norm::ARGMAX_BYTES as usize]);
    for (n, ties) in [(157184usize, [131072 + 5, 70001]), (157184, [157183, 157183]), (157184, [0, 65536]), (5000, [4999, 2050]), (1001, [700, 333])] {
        let mut logits = rng.normals(n, 2.0);
        for &t in &ties {
            logits[t] = 20.0 + n as f32 / 1e4;
        }
        let l_buf = gpu.upload("logits", &f32_bytes(&logits));
        let mut pass = Pass::new();
        norm::argmax(gpu, &mut pass, &l_buf, n as u32, &out);
        pass.submit(gpu);
        let got = gpu.read_back(&out, 8).await.unwrap();
        assert_eq!(u32::from_le_bytes(got[..4].try_into().unwrap()) as usize, *ties.iter().min().unwrap(), "argmax of {n} values, maxima at {ties:?}");
        assert_eq!(f32::from_le_bytes(got[4..8].try_into().unwrap()), 20.0 + n as f32 / 1e4);
    }
}
