//! MLA attention kernels for one decode step (`shaders/mla.wgsl`), absorbed form (architecture spec §6).
//! All buffers hold f32. A cache row is `[c (rank) | RoPE(k_pe) (rope_dim)]`, `rank + rope_dim` floats; the
//! value of a row is its first `rank` floats. Symbols: `rank` R = kv_lora_rank, `rope_dim` r, `d_nope`, `d_qk`,
//! `d_v` as in the spec.

use super::{Gpu, Pass, P};

const SHADER: &str = include_str!("../../shaders/mla.wgsl");
const LABEL: &str = "mla.wgsl";

/// `mla_attention` keeps up to this many output dims per workgroup in registers (4 per invocation).
pub const MAX_RANK: u32 = 1024;

fn assert_cache_holds(cache: &wgpu::Buffer, pos: u32, rank: u32, rope_dim: u32) {
    let needed = (pos as u64 + 1) * (rank + rope_dim) as u64 * 4;
    assert!(cache.size() >= needed, "a {}-byte cache cannot hold row {pos} ({needed} bytes needed)", cache.size());
}

/// The RoPE angle step `base^(−2/r)`, in f32 like ggml's `powf(freq_base, -2.0f/n_dims)`: the kernels build
/// θ_p = pos·step^p by repeated f32 multiplication, as ggml does.
pub fn rope_step(base: f32, rope_dim: u32) -> f32 {
    base.powf(-2.0 / rope_dim as f32)
}

/// Writes cache row `pos`: `cache[pos·(rank + rope_dim) ..][.. rank + rope_dim] =
/// [RMSNorm(kv[..rank])·norm_w | RoPE(kv[rank..], pos)]` with RMSNorm `x/√(mean x² + eps)`.
///
/// * `kv`: `rank + rope_dim` floats, `[c_raw | k_pe]` (the `attn_kv_a_mqa` output).
/// * `norm_w`: `rank` floats (`attn_kv_a_norm`).
/// * `cache`: at least `(pos + 1)·(rank + rope_dim)` floats; other rows are left alone.
#[allow(clippy::too_many_arguments)]
pub fn kv_row(
    gpu: &Gpu,
    pass: &mut Pass,
    kv: &wgpu::Buffer,
    norm_w: &wgpu::Buffer,
    cache: &wgpu::Buffer,
    pos: u32,
    rank: u32,
    rope_dim: u32,
    eps: f32,
    rope_base: f32,
) {
    kv_rows(gpu, pass, kv, norm_w, cache, pos, 1, rank, rope_dim, eps, rope_base);
}

/// [`kv_row`] for `tokens` tokens: token t's `kv` at `kv[t·(rank + rope_dim) ..]` becomes cache row `pos + t`.
#[allow(clippy::too_many_arguments)]
pub fn kv_rows(gpu: &Gpu, pass: &mut Pass, kv: &wgpu::Buffer, norm_w: &wgpu::Buffer, cache: &wgpu::Buffer, pos: u32, tokens: u32, rank: u32, rope_dim: u32, eps: f32, rope_base: f32) {
    assert!(rope_dim % 2 == 0, "RoPE dims come in pairs");
    assert!(tokens >= 1);
    assert_cache_holds(cache, pos + tokens - 1, rank, rope_dim);
    let kernel = gpu.kernel(LABEL, SHADER, "mla_kv_row");
    let params = [P::U(pos), P::U(rank), P::U(rope_dim), P::F(eps), P::F(rope_step(rope_base, rope_dim)), P::U(tokens)];
    pass.dispatch(gpu, &kernel, &[kv, norm_w, cache], &params, tokens);
}

/// RoPE of every head's q_pe into the tail of its absorbed query row: `q_abs[h·(rank + rope_dim) + rank ..]
/// [.. rope_dim] = RoPE(q[h·(d_nope + rope_dim) + d_nope ..][.. rope_dim], pos)`. The first `rank` floats of each
/// row (q̃_h = W_kb,h·q_nope,h) are another kernel's and are left alone.
///
/// * `q`: `n_head·(d_nope + rope_dim)` floats, per head `[q_nope | q_pe]` (the `attn_q` output).
/// * `q_abs`: `n_head·(rank + rope_dim)` floats.
#[allow(clippy::too_many_arguments)]
pub fn rope_q(
    gpu: &Gpu,
    pass: &mut Pass,
    q: &wgpu::Buffer,
    q_abs: &wgpu::Buffer,
    pos: u32,
    n_head: u32,
    d_nope: u32,
    rope_dim: u32,
    rank: u32,
    rope_base: f32,
) {
    rope_q_tokens(gpu, pass, q, q_abs, pos, 1, n_head, d_nope, rope_dim, rank, rope_base);
}

/// [`rope_q`] for `tokens` tokens at positions `pos + t`: token t's q at `q[t·n_head·(d_nope + rope_dim) ..]`,
/// its absorbed rows at `q_abs[t·n_head·(rank + rope_dim) ..]`.
#[allow(clippy::too_many_arguments)]
pub fn rope_q_tokens(gpu: &Gpu, pass: &mut Pass, q: &wgpu::Buffer, q_abs: &wgpu::Buffer, pos: u32, tokens: u32, n_head: u32, d_nope: u32, rope_dim: u32, rank: u32, rope_base: f32) {
    assert!(rope_dim % 2 == 0, "RoPE dims come in pairs");
    let kernel = gpu.kernel(LABEL, SHADER, "mla_rope_q");
    let params = [P::U(pos), P::U(n_head), P::U(d_nope), P::U(rank), P::U(rope_dim), P::F(rope_step(rope_base, rope_dim)), P::U(tokens)];
    pass.dispatch_3d(gpu, &kernel, &[q, q_abs], &params, ((n_head * rope_dim / 2).div_ceil(64), 1, tokens));
}

/// Causal attention of every head over cache rows `0..=pos`: `s_t = (q_abs_h · cache_t)/√d_qk` over all
/// `rank + rope_dim` dims, `p = softmax(s)`, `out[h·rank + ρ] = Σ_t p_t·cache_t[ρ]` for ρ < rank (the latent
/// output ō_h, before W_vb). One workgroup per head with an online softmax, so no score buffer and any `pos`.
///
/// * `q_abs`: `n_head·(rank + rope_dim)` floats, per head `[q̃_h | RoPE(q_pe_h)]`.
/// * `cache`: at least `(pos + 1)·(rank + rope_dim)` floats (rows after `pos` are not read).
/// * `out`: `n_head·rank` floats.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    gpu: &Gpu,
    pass: &mut Pass,
    q_abs: &wgpu::Buffer,
    cache: &wgpu::Buffer,
    out: &wgpu::Buffer,
    pos: u32,
    n_head: u32,
    rank: u32,
    rope_dim: u32,
    d_qk: u32,
) {
    attention_tokens(gpu, pass, q_abs, cache, out, pos, 1, n_head, rank, rope_dim, d_qk);
}

/// [`attention`] for `tokens` tokens of a chunk, causally: token t (position `pos + t`) attends cache rows
/// `0..=pos + t`; its queries at `q_abs[t·n_head·(rank + rope_dim) ..]`, its outputs at `out[t·n_head·rank ..]`.
#[allow(clippy::too_many_arguments)]
pub fn attention_tokens(gpu: &Gpu, pass: &mut Pass, q_abs: &wgpu::Buffer, cache: &wgpu::Buffer, out: &wgpu::Buffer, pos: u32, tokens: u32, n_head: u32, rank: u32, rope_dim: u32, d_qk: u32) {
    assert!(tokens >= 1);
    assert_cache_holds(cache, pos + tokens - 1, rank, rope_dim);
    assert!(rank <= MAX_RANK, "kv_lora_rank {rank} > {MAX_RANK}");
    assert!(rank + rope_dim <= MAX_RANK + 128, "kv_lora_rank + rope_dim {} > {}", rank + rope_dim, MAX_RANK + 128); // ATTN_MAX_WIDTH
    let kernel = gpu.kernel(LABEL, SHADER, "mla_attention");
    let scale = 1.0 / (d_qk as f32).sqrt(); // llama.cpp: kq_scale = 1.0f/sqrtf(float(n_embd_head_k_mla))
    let params = [P::U(pos), P::U(n_head), P::U(rank), P::U(rope_dim), P::F(scale), P::U(tokens)];
    let (x, y) = gpu.grid(n_head);
    pass.dispatch_3d(gpu, &kernel, &[q_abs, cache, out], &params, (x, y, tokens));
}

/// The head-wise gate, in place: `o[h·d_v + a] *= σ(gate_logits[h])`.
///
/// * `o`: `n_head·d_v` floats (the per-head outputs after W_vb).
/// * `gate_logits`: `n_head` floats (`attn_gate` applied to the normed input).
pub fn head_gate(gpu: &Gpu, pass: &mut Pass, o: &wgpu::Buffer, gate_logits: &wgpu::Buffer, n_head: u32, d_v: u32) {
    let kernel = gpu.kernel(LABEL, SHADER, "mla_head_gate");
    pass.dispatch(gpu, &kernel, &[o, gate_logits], &[P::U(n_head), P::U(d_v)], (n_head * d_v).div_ceil(256));
}
