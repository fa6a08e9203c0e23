//! KDA kernels against f64 CPU references written from the spec (ling-architecture.md §5), on fresh random
//! inputs, over several consecutive tokens so the conv and delta state updates are checked too.
//!
//! Tolerance |Δ| ≤ 1e-5 + 1e-4·|want|: the GPU rounds in f32 (6e-8 relative per operation) through sums of
//! ≤ 256 terms and WGSL's `exp`, which may be off by 3 + 2·|x| ULP (≈ 2e-6 relative at |x| ≈ 10, reachable in
//! the gates); the state feeds back over four tokens, but decay (e^g < 1) and β < 1 keep errors from growing.
//! Values are O(0.01..1); atol covers cancellation near zero (≈ 1e-7·Σ|terms|). Runs use < 1% of it, while a
//! wrong ε form, decay index or state shift misses by ≫ 1e-3.

use super::{assert_close, f32_bytes, read_f32, Rand};
use lingtab::gpu::{kda, Gpu, Pass};

const ATOL: f64 = 1e-5;
const RTOL: f64 = 1e-4;
const EPS: f32 = 1e-6;
/// NaN floats after the logical end of every buffer a kernel writes: they must stay NaN, since a kernel may
/// be handed buffers larger than it needs (and the web clamps out-of-bounds writes onto the last element).
const TAIL: usize = 256;
/// gate_lower_bound of Ling 3.0 Flash.
const LOWER_BOUND: f32 = -5.0;

fn report(line: &str) {
    #[cfg(target_arch = "wasm32")]
    web_sys::console::log_1(&line.into());
    #[cfg(not(target_arch = "wasm32"))]
    eprintln!("{line}");
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

fn widen(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

/// `values` followed by [`TAIL`] NaNs.
fn upload_with_tail(gpu: &Gpu, label: &str, values: &[f32]) -> wgpu::Buffer {
    let mut padded = values.to_vec();
    padded.resize(values.len() + TAIL, f32::NAN);
    gpu.upload(label, &f32_bytes(&padded))
}

/// An output of `n` floats poisoned with NaN, so an element the kernel fails to write is caught.
fn poisoned_with_tail(gpu: &Gpu, label: &str, n: usize) -> wgpu::Buffer {
    upload_with_tail(gpu, label, &vec![f32::NAN; n])
}

/// Checks every buffer of a case against its reference (seed in the failure message) and keeps the largest
/// |Δ| and the largest |Δ| / (atol + rtol·|want|) for the report.
struct Checker {
    seed: u64,
    max_abs_error: f64,
    max_tolerance_used: f64,
}

impl Checker {
    fn new(seed: u64) -> Checker {
        Checker { seed, max_abs_error: 0.0, max_tolerance_used: 0.0 }
    }

    /// Compares the first `want.len()` floats of `buffer` and checks that its tail is still NaN.
    async fn check(&mut self, gpu: &Gpu, what: &str, buffer: &wgpu::Buffer, want: &[f64]) {
        let what = format!("{what} (seed {})", self.seed);
        let got = read_f32(gpu, buffer, want.len() + TAIL).await;
        let (got, tail) = got.split_at(want.len());
        assert!(tail.iter().all(|x| x.is_nan()), "{what}: written beyond the logical end");
        assert_close(&what, got, want, ATOL, RTOL);
        for (&g, &w) in got.iter().zip(want) {
            let error = (g as f64 - w).abs();
            self.max_abs_error = self.max_abs_error.max(error);
            self.max_tolerance_used = self.max_tolerance_used.max(error / (ATOL + RTOL * w.abs()));
        }
    }

    fn report(&self, case: &str) {
        report(&format!(
            "{case}: max |GPU − f64 reference| {:.3e}, at most {:.1}% of the tolerance (atol {ATOL:e}, rtol {RTOL:e}, seed {})",
            self.max_abs_error,
            100.0 * self.max_tolerance_used,
            self.seed
        ));
    }
}

/// One token of the causal conv; `state` (K−1 per channel, oldest first) is shifted in place.
fn conv_reference(x: &[f64], w: &[f64], state: &mut [f64], kernel_size: usize) -> Vec<f64> {
    let past_len = kernel_size - 1;
    (0..x.len())
        .map(|c| {
            let past = &mut state[past_len * c..][..past_len];
            let taps = &w[kernel_size * c..][..kernel_size];
            let sum = past.iter().zip(taps).map(|(s, w)| s * w).sum::<f64>() + taps[past_len] * x[c];
            past.rotate_left(1);
            past[past_len - 1] = x[c];
            sum * sigmoid(sum)
        })
        .collect()
}

fn gates_reference(fa: &[f64], dt_bias: &[f64], a: &[f64], beta_logits: &[f64], head_dim: usize, lower_bound: f64) -> Vec<f64> {
    let g = (0..fa.len()).map(|c| lower_bound * sigmoid(a[c / head_dim] * (fa[c] + dt_bias[c])));
    g.chain(beta_logits.iter().map(|&b| sigmoid(b))).collect()
}

fn l2_normalised(x: &[f64], eps: f64) -> Vec<f64> {
    let scale = 1.0 / x.iter().map(|v| v * v).sum::<f64>().sqrt().max(eps);
    x.iter().map(|v| v * scale).collect()
}

/// One token of the gated delta rule (§5.6), in the fused op's order; `state[h·d·d + j·d + i] = S_h[i][j]`.
fn delta_reference(qkv: &[f64], gb: &[f64], state: &mut [f64], n_head: usize, d: usize, eps: f64) -> Vec<f64> {
    let dim = n_head * d;
    let mut o = vec![0.0; dim];
    for h in 0..n_head {
        let q = l2_normalised(&qkv[h * d..][..d], eps);
        let k = l2_normalised(&qkv[dim + h * d..][..d], eps);
        let v = &qkv[2 * dim + h * d..][..d];
        let g = &gb[h * d..][..d];
        let beta = gb[dim + h];
        let s = &mut state[h * d * d..][..d * d];
        for j in 0..d {
            let column = &mut s[j * d..][..d];
            for (i, m) in column.iter_mut().enumerate() {
                *m *= g[i].exp();
            }
            let u: f64 = column.iter().zip(&k).map(|(m, k)| m * k).sum();
            let delta = beta * (v[j] - u);
            for (m, k) in column.iter_mut().zip(&k) {
                *m += k * delta;
            }
            o[h * d + j] = column.iter().zip(&q).map(|(m, q)| m * q).sum::<f64>() / (d as f64).sqrt();
        }
    }
    o
}

fn head_norm_gate_reference(o: &[f64], w: &[f64], z: &[f64], d: usize, eps: f64) -> Vec<f64> {
    o.chunks(d)
        .zip(z.chunks(d))
        .flat_map(|(o, z)| {
            let inv_rms = 1.0 / (o.iter().map(|v| v * v).sum::<f64>() / d as f64 + eps).sqrt();
            o.iter().zip(w).zip(z).map(move |((o, w), z)| o * inv_rms * w * sigmoid(*z))
        })
        .collect()
}

pub async fn kda_gates_match_cpu_reference(gpu: &Gpu) {
    let seed = Rand::test_seed();
    let mut rng = Rand::new(seed);
    let mut checker = Checker::new(seed);
    for (n_head, head_dim) in [(3, 96), (2, 128), (32, 128), (5, 7)] {
        let dim = n_head * head_dim;
        let fa = rng.normals(dim, 2.0);
        let dt_bias = rng.normals(dim, 1.0);
        let a: Vec<f32> = rng.normals(n_head, 1.0).iter().map(|x| x.exp()).collect();
        let beta_logits = rng.normals(n_head, 2.0);
        let gb = poisoned_with_tail(gpu, "gb", dim + n_head);
        let mut pass = Pass::new();
        let upload = |label, v: &[f32]| gpu.upload(label, &f32_bytes(v));
        let (fa_buf, dt_buf, a_buf, beta_buf) = (upload("fa", &fa), upload("dt bias", &dt_bias), upload("ssm_a", &a), upload("beta logits", &beta_logits));
        kda::gates_tokens(gpu, &mut pass, &fa_buf, &dt_buf, &a_buf, &beta_buf, &gb, n_head as u32, head_dim as u32, LOWER_BOUND, 1);
        pass.submit(gpu);
        let want = gates_reference(&widen(&fa), &widen(&dt_bias), &widen(&a), &widen(&beta_logits), head_dim, LOWER_BOUND as f64);
        checker.check(gpu, &format!("gates, {n_head} heads of {head_dim}"), &gb, &want).await;
    }
    checker.report("kda_gates");
}

/// Head 0 is scaled so its mean square is comparable to ε, which checks where ε enters.
pub async fn kda_head_norm_gate_matches_cpu_reference(gpu: &Gpu) {
    let seed = Rand::test_seed();
    let mut rng = Rand::new(seed);
    let mut checker = Checker::new(seed);
    for (n_head, head_dim) in [(3, 96), (2, 128), (1, 256), (4, 37)] {
        let dim = n_head * head_dim;
        let mut o = rng.normals(dim, 0.3);
        o[..head_dim].iter_mut().for_each(|x| *x *= 3e-3);
        let w: Vec<f32> = rng.normals(head_dim, 0.2).iter().map(|x| 1.0 + x).collect();
        let z = rng.normals(dim, 2.0);
        let y = poisoned_with_tail(gpu, "normed", dim);
        let upload = |label, v: &[f32]| gpu.upload(label, &f32_bytes(v));
        let (o_buf, w_buf, z_buf) = (upload("o", &o), upload("ssm_norm", &w), upload("z", &z));
        let mut pass = Pass::new();
        kda::head_norm_gate(gpu, &mut pass, &o_buf, &w_buf, &z_buf, &y, n_head as u32, head_dim as u32, EPS);
        pass.submit(gpu);
        let want = head_norm_gate_reference(&widen(&o), &widen(&w), &widen(&z), head_dim, EPS as f64);
        checker.check(gpu, &format!("head norm gate, {n_head} heads of {head_dim}"), &y, &want).await;
    }
    checker.report("kda_head_norm_gate");
}

/// The decode kernel (`kda_step`): conv, gates, delta rule and output norm of every head in one dispatch,
/// against the four references in turn; three tokens through one conv and one delta state, inputs at the
/// offsets a decode step's projections put them; head dims below, at and not dividing the workgroup size, every
/// conv kernel size 2..=8. On the second token head 0's q is made tiny (its inputs and conv state scaled by
/// 1e-8), so the `max(‖q‖, ε)` floor is exercised.
pub async fn kda_step_matches_the_four_references(gpu: &Gpu) {
    let seed = Rand::test_seed();
    let mut rng = Rand::new(seed);
    let mut checker = Checker::new(seed);
    for (n_head, head_dim, kernel_size) in [(3, 96, 4), (2, 128, 4), (4, 37, 3), (1, 256, 2), (2, 200, 5), (5, 7, 6), (2, 64, 7), (1, 32, 8)] {
        let dim = n_head * head_dim;
        let layout = kda::StepLayout { n_head: n_head as u32, head_dim: head_dim as u32, kernel_size: kernel_size as u32, fa_at: (3 * dim + 2) as u32, beta_at: (4 * dim + 2) as u32, z_at: (4 * dim + n_head + 3) as u32 };
        let taps = rng.normals(3 * dim * kernel_size, 0.5);
        let dt_bias = rng.normals(dim, 1.0);
        let a: Vec<f32> = rng.normals(n_head, 1.0).iter().map(|x| x.exp()).collect();
        let norm_w: Vec<f32> = rng.normals(head_dim, 0.2).iter().map(|x| 1.0 + x).collect();
        let consts: Vec<f32> = [&taps[..], &dt_bias, &a, &norm_w].concat();
        assert_eq!(consts.len(), layout.consts_floats() as usize);
        let conv0 = rng.normals(3 * dim * (kernel_size - 1), 1.0);
        let state0 = rng.normals(dim * head_dim, 0.5);
        let consts_buf = gpu.upload("consts", &f32_bytes(&consts));
        let (conv_buf, state_buf) = (upload_with_tail(gpu, "conv state", &conv0), upload_with_tail(gpu, "delta state", &state0));
        let (mut conv, mut state) = (widen(&conv0), widen(&state0));
        for token in 0..3 {
            let mut input = rng.normals(layout.z_at as usize + dim, 1.0);
            if token == 1 {
                // head 0's q channels: inputs and conv state scaled down, so its post-conv q is far below ε
                input[..head_dim].iter_mut().for_each(|q| *q *= 1e-8);
                let past = kernel_size - 1;
                conv[..head_dim * past].iter_mut().for_each(|s| *s *= 1e-8);
                let narrowed: Vec<f32> = conv.iter().map(|&v| v as f32).collect();
                gpu.queue.write_buffer(&conv_buf, 0, &f32_bytes(&narrowed));
                conv = widen(&narrowed);
            }
            let y = poisoned_with_tail(gpu, "step y", dim);
            let mut pass = Pass::new();
            kda::step(gpu, &mut pass, &gpu.upload("input", &f32_bytes(&input)), &consts_buf, &conv_buf, &state_buf, &y, layout, LOWER_BOUND, EPS);
            pass.submit(gpu);
            let input = widen(&input);
            let at = |from: u32, n: usize| input[from as usize..from as usize + n].to_vec();
            let qkv = conv_reference(&input[..3 * dim], &widen(&taps), &mut conv, kernel_size);
            let gb = gates_reference(&at(layout.fa_at, dim), &widen(&dt_bias), &widen(&a), &at(layout.beta_at, n_head), head_dim, LOWER_BOUND as f64);
            let o = delta_reference(&qkv, &gb, &mut state, n_head, head_dim, EPS as f64);
            let want = head_norm_gate_reference(&o, &widen(&norm_w), &at(layout.z_at, dim), head_dim, EPS as f64);
            let at = format!("{n_head} heads of {head_dim}, K {kernel_size}, token {token}");
            checker.check(gpu, &format!("step y, {at}"), &y, &want).await;
            checker.check(gpu, &format!("step conv state, {at}"), &conv_buf, &conv).await;
            checker.check(gpu, &format!("step delta state, {at}"), &state_buf, &state).await;
        }
    }
    checker.report("kda_step");
}

/// The prefill's delta rule (`delta_tokens`, kda_delta_chunk): T tokens through one delta state, equal to T
/// steps of the reference. The kernel stages a block of tokens' q̂|k̂|e^g in workgroup memory at a time (8 tokens,
/// 4 at head dim 256): token counts that fill blocks and leave one part-filled, a single token, head dims below,
/// at and not dividing a workgroup's 32 value columns.
pub async fn kda_delta_chunk_matches_the_reference(gpu: &Gpu) {
    let seed = Rand::test_seed();
    let mut rng = Rand::new(seed);
    let mut checker = Checker::new(seed);
    for (n_head, head_dim, tokens) in [(2, 128, 13), (1, 256, 9), (3, 37, 17), (2, 7, 8), (1, 64, 1)] {
        let dim = n_head * head_dim;
        let (mut qkv, mut gb) = (Vec::new(), Vec::new());
        for _ in 0..tokens {
            // q and k come L2-normalised (kda_qk_norm's work)
            let mut token = rng.normals(3 * dim, 1.0);
            for part in token[..2 * dim].chunks_mut(head_dim) {
                let norm = part.iter().map(|v| v * v).sum::<f32>().sqrt();
                part.iter_mut().for_each(|v| *v /= norm);
            }
            qkv.extend(token);
            gb.extend(rng.normals(dim, 1.0).iter().map(|&x| LOWER_BOUND * sigmoid(x as f64) as f32));
            gb.extend(rng.normals(n_head, 1.0).iter().map(|&x| sigmoid(x as f64) as f32));
        }
        let state0 = rng.normals(dim * head_dim, 0.5);
        let state_buf = upload_with_tail(gpu, "delta state", &state0);
        let o = poisoned_with_tail(gpu, "delta o", tokens * dim);
        let mut pass = Pass::new();
        let (qkv_buf, gb_buf) = (gpu.upload("q|k|v", &f32_bytes(&qkv)), gpu.upload("gates", &f32_bytes(&gb)));
        kda::delta_tokens(gpu, &mut pass, &qkv_buf, &gb_buf, &state_buf, &o, n_head as u32, head_dim as u32, tokens as u32);
        pass.submit(gpu);
        let mut state = widen(&state0);
        let mut want = Vec::new();
        for t in 0..tokens {
            let (qkv, gb) = (widen(&qkv[t * 3 * dim..][..3 * dim]), widen(&gb[t * (dim + n_head)..][..dim + n_head]));
            want.extend(delta_reference(&qkv, &gb, &mut state, n_head, head_dim, EPS as f64));
        }
        let at = format!("{n_head} heads of {head_dim}, {tokens} tokens");
        checker.check(gpu, &format!("delta o, {at}"), &o, &want).await;
        checker.check(gpu, &format!("delta state, {at}"), &state_buf, &state).await;
    }
    checker.report("kda_delta_chunk");
}
