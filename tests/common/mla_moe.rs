//! MLA attention and MoE routing/activation kernels against f64 CPU references on fresh random inputs.
//! Output buffers start as NaN, so anything a kernel fails to write (or writes where it must not) shows.

use super::{assert_close, f32_bytes, poisoned, read_f32, Rand};
use lingtab::gpu::moe::{selection_words, Selection};
use lingtab::gpu::{mla, moe, norm, Gpu, Pass};

/// Logs a line on the console of the harness (stderr natively, the browser console on the web).
fn report(msg: &str) {
    #[cfg(target_arch = "wasm32")]
    web_sys::console::log_1(&msg.into());
    #[cfg(not(target_arch = "wasm32"))]
    eprintln!("{msg}");
}

/// [`assert_close`], then reports the largest error, so the tolerances can be judged against what is seen.
fn check(what: &str, got: &[f32], want: &[f64], atol: f64, rtol: f64) {
    assert_close(what, got, want, atol, rtol);
    let max_err = got.iter().zip(want).map(|(&g, &w)| (g as f64 - w).abs()).fold(0.0, f64::max);
    let max_want = want.iter().fold(0.0, |m: f64, w| m.max(w.abs()));
    report(&format!("{what}: max |Δ| {max_err:.2e} (max |want| {max_want:.2e}, tolerance {atol:.0e} + {rtol:.0e}·|want|)"));
}

async fn read_u32(gpu: &Gpu, buffer: &wgpu::Buffer, n: usize) -> Vec<u32> {
    let bytes = gpu.read_back(buffer, n as u64 * 4).await.unwrap();
    bytemuck::pod_collect_to_vec(&bytes[..n * 4])
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// ggml RoPE NORM: adjacent pairs, θ_p built by repeated f32 multiplication from θ_0 = pos, cos/sin exact.
fn rope_reference(x: &[f32], pos: u32, base: f32) -> Vec<f64> {
    let step = mla::rope_step(base, x.len() as u32);
    let mut theta = pos as f32;
    let mut out = Vec::with_capacity(x.len());
    for pair in x.chunks(2) {
        let (x0, x1, t) = (pair[0] as f64, pair[1] as f64, theta as f64);
        out.push(x0 * t.cos() - x1 * t.sin());
        out.push(x0 * t.sin() + x1 * t.cos());
        theta *= step;
    }
    out
}

// (kv_lora_rank, rope dims, d_nope, RoPE base): Ling Flash's shape and a small odd one.
const MLA_SHAPES: [(u32, u32, u32, f32); 2] = [(512, 64, 128, 6.0e6), (96, 16, 24, 1.0e4)];

pub async fn mla_kv_row_matches_reference(gpu: &Gpu) {
    let seed = Rand::test_seed();
    let mut rng = Rand::new(seed);
    let eps = 1e-6;
    let n_ctx = 40;
    for (rank, rope_dim, _, base) in MLA_SHAPES {
        let step_exact = (base as f64).powf(-2.0 / rope_dim as f64);
        assert!((mla::rope_step(base, rope_dim) as f64 - step_exact).abs() <= 1e-7 * step_exact, "rope_step({base}, {rope_dim})");
        let width = (rank + rope_dim) as usize;
        let norm_w: Vec<f32> = (0..rank).map(|_| 1.0 + 0.3 * rng.normal()).collect();
        let norm_w_buf = gpu.upload("norm_w", &f32_bytes(&norm_w));
        let cache = poisoned(gpu, "cache", n_ctx * width);
        let mut pass = Pass::new();
        let mut want_rows = Vec::new();
        for pos in [0u32, 37, 5] {
            let std = rng.uniform(0.2, 3.0);
            let kv = rng.normals(width, std);
            // kv after the query in one buffer, as a decode step's projections hold it
            let kv_at = 3 * pos as usize + 7;
            let mut projections = rng.normals(kv_at, 5.0);
            projections.extend_from_slice(&kv);
            mla::kv_row(gpu, &mut pass, &gpu.upload("projections", &f32_bytes(&projections)), kv_at as u32, &norm_w_buf, &cache, pos, rank, rope_dim, eps, base);
            let (c_raw, k_pe) = kv.split_at(rank as usize);
            let mean_sq = c_raw.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / rank as f64;
            let inv_rms = 1.0 / (mean_sq + eps as f64).sqrt();
            let mut row: Vec<f64> = c_raw.iter().zip(&norm_w).map(|(&v, &w)| v as f64 * inv_rms * w as f64).collect();
            row.extend(rope_reference(k_pe, pos, base));
            want_rows.push((pos as usize, row));
        }
        pass.submit(gpu);
        let got = read_f32(gpu, &cache, n_ctx * width).await;
        for (pos, want) in &want_rows {
            let what = format!("kv row {pos} (R {rank}, r {rope_dim}, seed {seed})");
            check(&what, &got[pos * width..][..width], want, 1e-5, 1e-5);
        }
        for (row, values) in got.chunks(width).enumerate() {
            if !want_rows.iter().any(|(pos, _)| *pos == row) {
                assert!(values.iter().all(|v| v.is_nan()), "kv_row wrote into row {row} (seed {seed})");
            }
        }
    }
}

pub async fn mla_rope_q_matches_reference(gpu: &Gpu) {
    let seed = Rand::test_seed();
    let mut rng = Rand::new(seed);
    let n_head = 3;
    for (rank, rope_dim, d_nope, base) in MLA_SHAPES {
        // large positions check the angle reduction: θ_0 = pos
        for pos in [0u32, 37, 4099, 200_000] {
            let std = rng.uniform(0.2, 3.0);
            let q = rng.normals((n_head * (d_nope + rope_dim)) as usize, std);
            let width = (rank + rope_dim) as usize;
            let q_abs = poisoned(gpu, "q_abs", n_head as usize * width);
            let mut pass = Pass::new();
            mla::rope_q(gpu, &mut pass, &gpu.upload("q", &f32_bytes(&q)), &q_abs, pos, n_head, d_nope, rope_dim, rank, base);
            pass.submit(gpu);
            let got = read_f32(gpu, &q_abs, n_head as usize * width).await;
            for (h, (row, q_head)) in got.chunks(width).zip(q.chunks((d_nope + rope_dim) as usize)).enumerate() {
                let (absorbed, rotated) = row.split_at(rank as usize);
                assert!(absorbed.iter().all(|v| v.is_nan()), "rope_q wrote into head {h}'s absorbed part (seed {seed})");
                let what = format!("q_pe head {h} pos {pos} (R {rank}, r {rope_dim}, seed {seed})");
                check(&what, rotated, &rope_reference(&q_head[d_nope as usize..], pos, base), 1e-5, 1e-5);
            }
        }
    }
}

/// A decode step's cache row and query RoPE in one dispatch (mla_kv_row_rope_q): the same cache and q_abs,
/// bit for bit, as mla_kv_row then mla_rope_q (each checked against its reference above), from the step's
/// projections (q at 0, kv after it), nothing written elsewhere.
pub async fn mla_kv_row_and_rope_q_match_the_two_kernels(gpu: &Gpu) {
    let seed = Rand::test_seed();
    let mut rng = Rand::new(seed);
    let (n_head, n_ctx, eps) = (3u32, 40usize, 1e-6);
    for (rank, rope_dim, d_nope, base) in MLA_SHAPES {
        let width = (rank + rope_dim) as usize;
        let norm_w: Vec<f32> = (0..rank).map(|_| 1.0 + 0.3 * rng.normal()).collect();
        let norm_w_buf = gpu.upload("norm_w", &f32_bytes(&norm_w));
        for pos in [0u32, 37, 5] {
            let q_len = (n_head * (d_nope + rope_dim)) as usize;
            // q, then a gap, then kv, as a decode step's projections hold them
            let kv_at = q_len + 5;
            let std = rng.uniform(0.2, 3.0);
            let projections = rng.normals(kv_at + width + 3, std);
            let projections = gpu.upload("projections", &f32_bytes(&projections));
            let [(cache_a, q_a), (cache_b, q_b)] = [0, 1].map(|_| (poisoned(gpu, "cache", n_ctx * width), poisoned(gpu, "q_abs", n_head as usize * width + 1)));
            let mut pass = Pass::new();
            mla::kv_row(gpu, &mut pass, &projections, kv_at as u32, &norm_w_buf, &cache_a, pos, rank, rope_dim, eps, base);
            mla::rope_q(gpu, &mut pass, &projections, &q_a, pos, n_head, d_nope, rope_dim, rank, base);
            mla::kv_row_and_rope_q(gpu, &mut pass, &projections, kv_at as u32, &norm_w_buf, &cache_b, &q_b, pos, n_head, d_nope, rank, rope_dim, eps, base);
            pass.submit(gpu);
            let what = format!("pos {pos} (R {rank}, r {rope_dim}, seed {seed})");
            let bits = |v: Vec<f32>| v.iter().map(|f| f.to_bits()).collect::<Vec<u32>>();
            let (cache_a, cache_b) = (read_f32(gpu, &cache_a, n_ctx * width).await, read_f32(gpu, &cache_b, n_ctx * width).await);
            assert!(cache_a[pos as usize * width..][..width].iter().all(|v| !v.is_nan()), "{what}: mla_kv_row wrote its row");
            assert_eq!(bits(cache_a), bits(cache_b), "{what}: the caches");
            let (q_a, q_b) = (read_f32(gpu, &q_a, n_head as usize * width + 1).await, read_f32(gpu, &q_b, n_head as usize * width + 1).await);
            assert_eq!(bits(q_a), bits(q_b), "{what}: q_abs (its absorbed parts and the word past it unwritten by both)");
        }
    }
}

/// One head's attention output (f64): softmax over the rows of q·row/√d_qk, then the rows' first `rank` values
/// weighed by it.
fn reference_attention(q: &[f32], rows: &[&[f32]], rank: u32, d_qk: u32) -> Vec<f64> {
    let scores: Vec<f64> = rows.iter().map(|row| q.iter().zip(*row).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() / (d_qk as f64).sqrt()).collect();
    let max = scores.iter().cloned().fold(f64::MIN, f64::max);
    let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
    let total: f64 = weights.iter().sum();
    (0..rank as usize).map(|rho| rows.iter().zip(&weights).map(|(row, w)| w * row[rho] as f64).sum::<f64>() / total).collect()
}

pub async fn mla_attention_matches_reference(gpu: &Gpu) {
    let seed = Rand::test_seed();
    let mut rng = Rand::new(seed);
    let n_head = 3u32;
    let n_ctx = 1100u32;
    for (rank, rope_dim, d_nope, _) in MLA_SHAPES {
        let width = (rank + rope_dim) as usize;
        let d_qk = d_nope + rope_dim;
        // 300 spans two chunks of 256 rows, the last one partial, and the default splits it 2 ways (3 heads);
        // 1099: the default's 5 splits of 220 rows, and 2 splits of 550 rows (3 chunks each). Explicit splits:
        // 1 (one workgroup per head), 3 (uneven), 32 at pos 0 and 37 (most splits empty).
        for (pos, splits) in [(0u32, None), (0, Some(32)), (37, Some(32)), (150, Some(3)), (300, None), (300, Some(1)), (1099, None), (1099, Some(2))] {
            let std = rng.uniform(0.3, 2.0);
            let q_abs = rng.normals(n_head as usize * width, std);
            let mut cache = rng.normals(n_ctx as usize * width, 1.0);
            // rows after pos must not be read: make them loud
            cache[(pos as usize + 1) * width..].iter_mut().for_each(|v| *v *= 1000.0);
            let out = poisoned(gpu, "attention out", (n_head * rank) as usize);
            let partials = poisoned(gpu, "attention partials", mla::partial_floats(n_head, rank, 1));
            let mut pass = Pass::new();
            let (q_buf, cache_buf) = (gpu.upload("q_abs", &f32_bytes(&q_abs)), gpu.upload("cache", &f32_bytes(&cache)));
            match splits {
                Some(splits) => mla::attention_split(gpu, &mut pass, &q_buf, &cache_buf, &partials, &out, pos, 1, n_head, rank, rope_dim, d_qk, splits),
                None => mla::attention(gpu, &mut pass, &q_buf, &cache_buf, &partials, &out, pos, n_head, rank, rope_dim, d_qk),
            }
            pass.submit(gpu);
            let got = read_f32(gpu, &out, (n_head * rank) as usize).await;

            let rows: Vec<&[f32]> = cache.chunks(width).take(pos as usize + 1).collect();
            let want: Vec<f64> = q_abs.chunks(width).flat_map(|q| reference_attention(q, &rows, rank, d_qk)).collect();
            let split = splits.unwrap_or_else(|| mla::splits_for(pos + 1, n_head, mla::MAX_SPLITS));
            check(&format!("attention pos {pos}, {split} splits (R {rank}, r {rope_dim}, seed {seed})"), &got, &want, 1e-5, 1e-5);
        }
    }
}

/// The prefill's attention as products (scores, softmax rows, values) for a chunk of tokens, causally, against
/// the f64 reference: score scratch for the whole chunk, for a few tokens per block (several blocks), and for one;
/// the scratch poisoned so a stale score shows; rows past the chunk loud. The second shape's width is not whole
/// 32-dim steps: it takes the online-softmax kernel.
pub async fn mla_attention_by_products_matches_reference(gpu: &Gpu) {
    let seed = Rand::test_seed();
    let mut rng = Rand::new(seed);
    let n_head = 3u32;
    let n_ctx = 720usize;
    // decode steps whose attention left its value product's slices (widths of whole 32-dim steps, past 32 rows)
    let mut sliced = 0;
    for (rank, rope_dim, d_nope, _) in MLA_SHAPES {
        let width = (rank + rope_dim) as usize;
        let d_qk = d_nope + rope_dim;
        // block Some(0): a decode step, with a decode step's scratch (its value product in column slices)
        for (pos, tokens, block) in [(0u32, 1u32, None), (0, 40, None), (5, 40, Some(7)), (300, 70, Some(1)), (300, 70, Some(64)), (40, 1, Some(0)), (700, 1, Some(0))] {
            let std = rng.uniform(0.3, 2.0);
            let q_abs = rng.normals((tokens * n_head) as usize * width, std);
            let mut cache = rng.normals(mla::cache_rows(n_ctx) * width, 1.0);
            let end = (pos + tokens) as usize;
            cache[end * width..].iter_mut().for_each(|v| *v *= 1000.0);
            let out = poisoned(gpu, "attention out", (tokens * n_head * rank) as usize + 5);
            let rows_all = mla::cache_rows(end) as u32;
            let floats = match block {
                Some(0) => {
                    assert!(mla::decode_by_products(pos + 1), "pos {pos} should take the products in a decode step");
                    mla::decode_scratch_floats(n_head as usize, rank as usize, n_ctx)
                }
                Some(b) => (b * n_head * rows_all) as usize,
                None => mla::score_floats(n_head as usize, n_ctx, tokens as usize, u32::MAX as u64).unwrap(),
            };
            let scores = poisoned(gpu, "scores", floats);
            let slices = block.filter(|&b| b == 0).map(|_| poisoned(gpu, "value slices", mla::value_slice_floats(n_head as usize, rank as usize)));
            let mut pass = Pass::new();
            let (q_buf, cache_buf) = (gpu.upload("q_abs", &f32_bytes(&q_abs)), gpu.upload("cache", &f32_bytes(&cache)));
            mla::attention_by_products(gpu, &mut pass, &q_buf, &cache_buf, &scores, slices.as_ref(), &out, pos, tokens, n_head, rank, rope_dim, d_qk);
            pass.submit(gpu);
            let got = read_f32(gpu, &out, (tokens * n_head * rank) as usize + 5).await;
            assert!(got[(tokens * n_head * rank) as usize..].iter().all(|v| v.is_nan()), "wrote past the outputs (seed {seed})");
            let mut want = Vec::new();
            for (i, q) in q_abs.chunks(width).enumerate() {
                let t = i / n_head as usize;
                let rows: Vec<&[f32]> = cache.chunks(width).take(pos as usize + t + 1).collect();
                want.extend(reference_attention(q, &rows, rank, d_qk));
            }
            let what = format!("attention by products pos {pos}, {tokens} tokens, block {block:?} (R {rank}, r {rope_dim}, seed {seed})");
            // f32 scores of 576-term sums summed tile by tile, their rounding amplified by the softmax: up to
            // ~1.1e-5 seen on SwiftShader (7.6e-6 on lavapipe); a wrong row, mask or block is off by ~1e-1
            check(&what, &got[..want.len()], &want, 3e-5, 1e-5);
            if block == Some(0) {
                // the decode step's form, which leaves the value product's column slices for the product after it
                let parts = poisoned(gpu, "value slices", mla::value_slice_floats(n_head as usize, rank as usize));
                let out = poisoned(gpu, "attention out", (n_head * rank) as usize);
                let mut pass = Pass::new();
                let left = mla::decode_attention_by_products(gpu, &mut pass, &q_buf, &cache_buf, &scores, &parts, &out, pos, n_head, rank, rope_dim, d_qk);
                pass.submit(gpu);
                let summed = match left {
                    Some(slices) => {
                        assert!(slices.count > 1, "{what}: one slice is summed in place");
                        let p = read_f32(gpu, &parts, (slices.count * slices.stride) as usize).await;
                        (0..(n_head * rank) as usize).map(|i| (0..slices.count as usize).fold(0f32, |t, s| t + p[s * slices.stride as usize + i])).collect()
                    }
                    None => read_f32(gpu, &out, (n_head * rank) as usize).await,
                };
                sliced += left.is_some() as usize;
                check(&format!("{what}, slices left"), &summed, &want, 3e-5, 1e-5);
            }
        }
    }
    assert!(sliced > 0, "no decode step left its slices (seed {seed})");
}

pub async fn mla_head_gate_matches_reference(gpu: &Gpu) {
    let seed = Rand::test_seed();
    let mut rng = Rand::new(seed);
    let n_head = 3u32;
    for d_v in [128u32, 40] {
        let o = rng.normals((n_head * d_v) as usize, 2.0);
        let gate_logits = rng.normals(n_head as usize, 3.0);
        let o_buf = gpu.upload("o", &f32_bytes(&o));
        // the logits after other values in their buffer, as a decode step's projections hold them
        let gate_at = d_v as usize + 3;
        let mut projections = rng.normals(gate_at, 5.0);
        projections.extend_from_slice(&gate_logits);
        let mut pass = Pass::new();
        mla::head_gate(gpu, &mut pass, &o_buf, &gpu.upload("projections", &f32_bytes(&projections)), gate_at as u32, n_head, d_v);
        pass.submit(gpu);
        let got = read_f32(gpu, &o_buf, o.len()).await;
        let want: Vec<f64> = o.iter().enumerate().map(|(i, &v)| v as f64 * sigmoid(gate_logits[i / d_v as usize] as f64)).collect();
        check(&format!("head gate d_v {d_v} (seed {seed})"), &got, &want, 1e-6, 1e-5);
    }
}

/// A router configuration, as [`moe::route`] takes it.
#[derive(Clone, Copy, Debug)]
struct Router {
    n_expert: u32,
    n_group: u32,
    n_group_used: u32,
    n_used: u32,
    norm: bool,
    scale: f32,
}

struct RouteReference {
    ids: Vec<u32>,
    weights: Vec<f64>,
    group_margin: f64,
    expert_margin: f64,
    /// The smallest non-zero score gap the result depends on (group boundary, order of the picks, last pick vs
    /// runner-up): below the f32 noise the GPU may decide either way.
    closest_call: f64,
    weight_sum_floored: bool,
    /// Groups, best first.
    groups_by_score: Vec<usize>,
    /// The experts of the kept groups, best first.
    experts_by_score: Vec<usize>,
}

/// build_moe_ffn's routing in f64, ties to the lower index.
fn route_reference(r: Router, logits: &[f32], bias: &[f32]) -> RouteReference {
    let p: Vec<f64> = logits.iter().map(|&l| sigmoid(l as f64)).collect();
    let s: Vec<f64> = p.iter().zip(bias).map(|(p, &b)| p + b as f64).collect();
    let size = (r.n_expert / r.n_group) as usize;
    let best_first = |score: &dyn Fn(usize) -> f64, a: &usize, b: &usize| score(*b).total_cmp(&score(*a)).then(a.cmp(b));
    let group_scores: Vec<f64> = s
        .chunks(size)
        .map(|group| {
            let mut sorted = group.to_vec();
            sorted.sort_by(|a, b| b.total_cmp(a));
            sorted[0] + sorted.get(1).copied().unwrap_or(f64::MIN)
        })
        .collect();
    let mut groups: Vec<usize> = (0..r.n_group as usize).collect();
    groups.sort_by(|a, b| best_first(&|g| group_scores[g], a, b));
    let (kept, dropped) = groups.split_at(r.n_group_used as usize);
    let group_margin = dropped.first().map_or(f64::INFINITY, |&d| group_scores[kept[kept.len() - 1]] - group_scores[d]);
    let mut experts: Vec<usize> = (0..r.n_expert as usize).filter(|e| kept.contains(&(e / size))).collect();
    experts.sort_by(|a, b| best_first(&|e| s[e], a, b));
    let k = r.n_used as usize;
    let expert_margin = experts.get(k).map_or(f64::INFINITY, |&e| s[experts[k - 1]] - s[e]);
    let decisive_gaps = experts.windows(2).take(k).map(|w| s[w[0]] - s[w[1]]).chain([group_margin]);
    let closest_call = decisive_gaps.filter(|&g| g != 0.0).fold(f64::INFINITY, f64::min);
    let ids = &experts[..k];
    let sum: f64 = ids.iter().map(|&e| p[e]).sum();
    let denominator = sum.max(6.103515625e-5);
    let scale = if r.scale != 0.0 && r.scale != 1.0 { r.scale as f64 } else { 1.0 };
    let weights = ids.iter().map(|&e| if r.norm { p[e] / denominator } else { p[e] } * scale).collect();
    RouteReference {
        ids: ids.iter().map(|&e| e as u32).collect(),
        weights,
        group_margin,
        expert_margin,
        closest_call,
        weight_sum_floored: r.norm && sum < 6.103515625e-5,
        groups_by_score: groups,
        experts_by_score: experts,
    }
}

/// The selection of one token's `logits`, routed alone and as the middle token of three (a chunk's routing: both
/// must give the reference's selection).
async fn route_once(gpu: &Gpu, r: Router, logits: &[f32], bias: &[f32]) -> [Selection; 2] {
    let words = selection_words(r.n_used);
    let bias_buf = gpu.upload("exp_probs_b", &f32_bytes(bias));
    let sel = poisoned(gpu, "sel", words);
    let mut pass = Pass::new();
    moe::route(gpu, &mut pass, &gpu.upload("router logits", &f32_bytes(logits)), &bias_buf, &sel, r.n_expert, r.n_used, r.n_group, r.n_group_used, r.norm, r.scale);
    pass.submit(gpu);
    let alone = Selection::from_words(&read_u32(gpu, &sel, words).await, r.n_used);
    // the other two tokens: the logits reversed, and shifted by one expert
    let mut chunk: Vec<f32> = logits.iter().rev().copied().collect();
    chunk.extend_from_slice(logits);
    chunk.extend(logits.iter().cycle().skip(1).take(logits.len()));
    let sels = poisoned(gpu, "sels", 1 + 3 * words);
    let mut pass = Pass::new();
    moe::route_tokens(gpu, &mut pass, &gpu.upload("chunk logits", &f32_bytes(&chunk)), &bias_buf, &sels, 1, 3, r.n_expert, r.n_used, r.n_group, r.n_group_used, r.norm, r.scale);
    pass.submit(gpu);
    let read = read_u32(gpu, &sels, 1 + 3 * words).await;
    [alone, Selection::from_words(&read[1 + words..1 + 2 * words], r.n_used)]
}

fn check_selections(what: &str, got: &[Selection; 2], want: &RouteReference) {
    check_selection(&format!("{what}, alone"), &got[0], want);
    check_selection(&format!("{what}, in a chunk"), &got[1], want);
}

fn check_selection(what: &str, got: &Selection, want: &RouteReference) {
    assert_eq!(got.ids, want.ids, "{what}: expert ids");
    check(&format!("{what} weights"), &got.weights, &want.weights, 1e-7, 1e-5);
    for (name, got, want) in
        [("group margin", got.group_margin, want.group_margin), ("expert margin", got.expert_margin, want.expert_margin)]
    {
        let close = if want.is_infinite() { got as f64 == want } else { (got as f64 - want).abs() <= 1e-5 };
        assert!(close, "{what}: {name} GPU {got} vs reference {want}");
    }
}

/// Scores further apart than this are decided the same way by the GPU's f32 and the f64 reference.
const CLEAR_GAP: f64 = 1e-4;

/// Random router inputs whose decisive gaps are all clear ("shift" moves the logits, e.g. far negative so that
/// Σσ falls under the 2⁻¹⁴ floor).
fn separated_inputs(rng: &mut Rand, r: Router, shift: f32, seed: u64) -> (Vec<f32>, Vec<f32>, RouteReference) {
    for _ in 0..100 {
        let logits: Vec<f32> = rng.normals(r.n_expert as usize, 2.0).iter().map(|l| l + shift).collect();
        let bias = rng.normals(r.n_expert as usize, 0.3);
        let reference = route_reference(r, &logits, &bias);
        if reference.closest_call > CLEAR_GAP {
            return (logits, bias, reference);
        }
    }
    panic!("no router inputs without near-ties for {r:?} (seed {seed})");
}

const ROUTERS: [Router; 5] = [
    Router { n_expert: 512, n_group: 8, n_group_used: 4, n_used: 8, norm: true, scale: 2.5 }, // Ling Flash
    Router { n_expert: 24, n_group: 4, n_group_used: 2, n_used: 3, norm: true, scale: 1.0 },
    Router { n_expert: 40, n_group: 1, n_group_used: 1, n_used: 5, norm: false, scale: 0.0 },
    Router { n_expert: 64, n_group: 8, n_group_used: 8, n_used: 8, norm: true, scale: 2.5 },
    Router { n_expert: 300, n_group: 4, n_group_used: 3, n_used: 32, norm: true, scale: 1.5 },
];

pub async fn moe_route_matches_reference(gpu: &Gpu) {
    let seed = Rand::test_seed();
    let mut rng = Rand::new(seed);
    for r in ROUTERS {
        let (logits, bias, want) = separated_inputs(&mut rng, r, 0.0, seed);
        check_selections(&format!("route {r:?} (seed {seed})"), &route_once(gpu, r, &logits, &bias).await, &want);
    }
    let tiny_probabilities = Router { n_expert: 64, n_group: 4, n_group_used: 2, n_used: 4, norm: true, scale: 2.5 };
    let (logits, bias, want) = separated_inputs(&mut rng, tiny_probabilities, -20.0, seed);
    assert!(want.weight_sum_floored, "logits near −20 should put Σσ under 2⁻¹⁴");
    let what = format!("route with floored weight sum (seed {seed})");
    check_selections(&what, &route_once(gpu, tiny_probabilities, &logits, &bias).await, &want);
}

pub async fn moe_route_ties_pick_lower_index(gpu: &Gpu) {
    let seed = Rand::test_seed();
    let mut rng = Rand::new(seed);
    for r in [ROUTERS[0], ROUTERS[1]] {
        // everything equal: the first groups and their first experts, in index order
        let (logit, bias) = (rng.normal(), 0.3 * rng.normal());
        let n = r.n_expert as usize;
        let want = route_reference(r, &vec![logit; n], &vec![bias; n]);
        assert_eq!(want.ids, (0..r.n_used).collect::<Vec<_>>());
        let what = format!("route, all scores equal, {r:?} (seed {seed})");
        check_selections(&what, &route_once(gpu, r, &vec![logit; n], &vec![bias; n]).await, &want);

        // exact ties at both boundaries: the best dropped group becomes a copy of the last kept one, then the
        // runner-up expert a copy of the last pick; retried until nothing else comes close
        let size = n / r.n_group as usize;
        let (k, g_u) = (r.n_used as usize, r.n_group_used as usize);
        let mut attempts = 0;
        let (logits, bias, want) = loop {
            attempts += 1;
            assert!(attempts <= 100, "no clean tie construction for {r:?} (seed {seed})");
            let (mut logits, mut bias, separated) = separated_inputs(&mut rng, r, 0.0, seed);
            let (last_kept, best_dropped) = (separated.groups_by_score[g_u - 1], separated.groups_by_score[g_u]);
            logits.copy_within(last_kept * size..(last_kept + 1) * size, best_dropped * size);
            bias.copy_within(last_kept * size..(last_kept + 1) * size, best_dropped * size);
            let group_tied = route_reference(r, &logits, &bias);
            let (last_pick, runner_up) = (group_tied.experts_by_score[k - 1], group_tied.experts_by_score[k]);
            logits[runner_up] = logits[last_pick];
            bias[runner_up] = bias[last_pick];
            let reference = route_reference(r, &logits, &bias);
            if reference.group_margin == 0.0 && reference.expert_margin == 0.0 && reference.closest_call > CLEAR_GAP {
                break (logits, bias, reference);
            }
        };
        let what = format!("route, ties at the group and expert boundaries, {r:?} (seed {seed})");
        check_selections(&what, &route_once(gpu, r, &logits, &bias).await, &want);
    }
}

pub async fn swiglu_matches_reference(gpu: &Gpu) {
    let seed = Rand::test_seed();
    let mut rng = Rand::new(seed);
    // (ff, n, limit): dense/shared and expert batches, no clamp, Ling's clamps, and a limit under the 1e-6 threshold
    for (ff, n, limit) in [(300u32, 1u32, 0.0f32), (300, 5, 4.0), (768, 8, 7.0), (100, 3, 1e-7)] {
        let std = rng.uniform(3.0, 5.0);
        let gu = rng.normals((2 * ff * n) as usize, std);
        let act = poisoned(gpu, "act", (ff * n) as usize);
        let mut pass = Pass::new();
        moe::swiglu(gpu, &mut pass, &gpu.upload("gate|up", &f32_bytes(&gu)), &act, ff, n, limit);
        pass.submit(gpu);
        let got = read_f32(gpu, &act, (ff * n) as usize).await;
        let clamped = limit as f64 > 1e-6;
        let (mut gates_clamped, mut ups_clamped) = (0, 0);
        let mut want = Vec::new();
        for expert in gu.chunks(2 * ff as usize) {
            let (gate, up) = expert.split_at(ff as usize);
            for (&g, &u) in gate.iter().zip(up) {
                let (silu, u, l) = (g as f64 * sigmoid(g as f64), u as f64, limit as f64);
                if clamped {
                    gates_clamped += (silu > l) as usize;
                    ups_clamped += (u.abs() > l) as usize;
                    want.push(silu.min(l) * u.clamp(-l, l));
                } else {
                    want.push(silu * u);
                }
            }
        }
        if clamped {
            assert!(gates_clamped > 0 && ups_clamped > 0, "limit {limit}: inputs never hit the clamp (seed {seed})");
        }
        check(&format!("swiglu ff {ff} n {n} limit {limit} (seed {seed})"), &got, &want, 1e-6, 1e-5);
    }
}

pub async fn moe_accumulate_matches_reference(gpu: &Gpu) {
    let seed = Rand::test_seed();
    let mut rng = Rand::new(seed);
    for (hidden, n_used, with_shared) in [(300u32, 8u32, true), (2560, 3, true), (300, 5, false)] {
        let (h, k) = (hidden as usize, n_used as usize);
        let expert_out = rng.normals(k * h, 1.0);
        let weights: Vec<f32> = (0..k).map(|_| rng.uniform(0.05, 1.0)).collect();
        let mut sel: Vec<u32> = (0..k).map(|_| (rng.next_u64() % 512) as u32).collect();
        sel.extend(weights.iter().map(|w| w.to_bits()));
        sel.extend([f32::INFINITY.to_bits(), 0.5f32.to_bits()]);
        let shared = rng.normals(h, 1.0);
        let x = rng.normals(h, 3.0);
        let x_buf = gpu.upload("x", &f32_bytes(&x));
        let shared_buf = gpu.upload("shared", &f32_bytes(&shared));
        let mut pass = Pass::new();
        let (out_buf, sel_buf) = (gpu.upload("expert out", &f32_bytes(&expert_out)), gpu.upload("sel", bytemuck::cast_slice(&sel)));
        if with_shared {
            moe::accumulate(gpu, &mut pass, &out_buf, &sel_buf, &shared_buf, &x_buf, hidden, n_used);
        } else {
            moe::accumulate_routed(gpu, &mut pass, &out_buf, &sel_buf, &x_buf, hidden, n_used);
        }
        pass.submit(gpu);
        let got = read_f32(gpu, &x_buf, h).await;
        let want: Vec<f64> = (0..h)
            .map(|i| {
                let routed: f64 = (0..k).map(|j| weights[j] as f64 * expert_out[j * h + i] as f64).sum();
                x[i] as f64 + routed + if with_shared { shared[i] as f64 } else { 0.0 }
            })
            .collect();
        check(&format!("accumulate H {hidden} k {n_used} shared {with_shared} (seed {seed})"), &got, &want, 1e-5, 1e-6);
    }
}

/// The fused residual add and RMSNorm of a decode step equals moe_accumulate then rms_norm bit for bit (the same
/// sums in the same order), for rows held in registers up to the longest it takes; nothing past h's row is
/// written.
pub async fn moe_sum_norm_is_accumulate_then_rms_norm(gpu: &Gpu) {
    let seed = Rand::test_seed();
    let mut rng = Rand::new(seed);
    for (hidden, n_used) in [(300u32, 8u32), (2560, 8), (norm::SUM_NORM_MAX, 3)] {
        let (h, k) = (hidden as usize, n_used as usize);
        let mut routed_out = rng.normals(k * h, 1.0);
        let shared_out = rng.normals(h, 1.0);
        // at one width the shared expert's output follows the routed ones' in their buffer, as when it rides with them
        let riding = hidden == 2560;
        if riding {
            routed_out.extend_from_slice(&shared_out);
        }
        let expert_out = gpu.upload("expert out", &f32_bytes(&routed_out));
        let mut sel: Vec<u32> = (0..k).map(|_| (rng.next_u64() % 512) as u32).collect();
        sel.extend((0..k).map(|_| rng.uniform(0.05, 1.0).to_bits()));
        sel.extend([f32::INFINITY.to_bits(), 0.5f32.to_bits()]);
        let sel = gpu.upload("sel", bytemuck::cast_slice(&sel));
        let shared = gpu.upload("shared", &f32_bytes(&shared_out));
        let w = gpu.upload("norm weight", &f32_bytes(&(0..h).map(|_| 1.0 + 0.1 * rng.normal()).collect::<Vec<f32>>()));
        let x = f32_bytes(&rng.normals(h, 3.0));
        let (x_apart, x_fused) = (gpu.upload("x", &x), gpu.upload("x", &x));
        let (y_apart, y_fused) = (poisoned(gpu, "y", h + 3), poisoned(gpu, "y", h + 3));
        let eps = 1e-6;
        let mut pass = Pass::new();
        moe::accumulate(gpu, &mut pass, &expert_out, &sel, &shared, &x_apart, hidden, n_used);
        norm::rms_norm(gpu, &mut pass, &x_apart, 0, &w, &y_apart, 0, hidden, eps);
        let (shared_in, shared_at) = if riding { (&expert_out, hidden * n_used) } else { (&shared, 0) };
        norm::moe_sum_norm(gpu, &mut pass, &expert_out, &sel, shared_in, shared_at, n_used, &x_fused, &w, &y_fused, hidden, eps);
        pass.submit(gpu);
        let what = format!("H {hidden} k {n_used} (seed {seed})");
        let (xa, xf) = (read_f32(gpu, &x_apart, h).await, read_f32(gpu, &x_fused, h).await);
        assert!(xa.iter().zip(&xf).all(|(a, b)| a.to_bits() == b.to_bits()), "x, {what}");
        let (ya, yf) = (read_f32(gpu, &y_apart, h + 3).await, read_f32(gpu, &y_fused, h + 3).await);
        assert!(ya[..h].iter().zip(&yf[..h]).all(|(a, b)| a.to_bits() == b.to_bits() && a.is_finite()), "h, {what}");
        assert!(yf[h..].iter().all(|v| v.is_nan()), "written past the row, {what}");
    }
}

pub async fn add_matches_reference(gpu: &Gpu) {
    let seed = Rand::test_seed();
    let mut rng = Rand::new(seed);
    for n in [1000usize, 70_001] {
        let (x, y) = (rng.normals(n, 2.0), rng.normals(n, 2.0));
        let x_buf = gpu.upload("x", &f32_bytes(&x));
        let mut pass = Pass::new();
        moe::add(gpu, &mut pass, &x_buf, &gpu.upload("y", &f32_bytes(&y)), n as u32);
        pass.submit(gpu);
        let got = read_f32(gpu, &x_buf, n).await;
        let want: Vec<f64> = x.iter().zip(&y).map(|(&a, &b)| a as f64 + b as f64).collect();
        // one f32 rounding of an exact sum
        check(&format!("add n {n} (seed {seed})"), &got, &want, 0.0, 6e-8);
    }
}
