//! MLA attention kernels (`shaders/mla.wgsl`), absorbed form (architecture spec §6): an online-softmax kernel
//! for short decode steps, and [`attention_by_products`] for prefill chunks and long contexts.
//! All buffers hold f32. A cache row is `[c (rank) | RoPE(k_pe) (rope_dim)]`, `rank + rope_dim` floats; the
//! value of a row is its first `rank` floats. Symbols: `rank` R = kv_lora_rank, `rope_dim` r, `d_nope`, `d_qk`,
//! `d_v` as in the spec.

use super::{Gpu, Pass, P};

const SHADER: &str = include_str!("../../shaders/mla.wgsl");
const LABEL: &str = "mla.wgsl";

/// `mla_attention` keeps up to this many output dims per workgroup in registers (4 per invocation).
pub const MAX_RANK: u32 = 1024;

/// Rows a cache for `n_ctx` tokens holds: whole 32-row steps, so the value product of
/// [`attention_by_products`] reads only cache rows, zero-weighted past the context; and 1/16 more steps, so a
/// decode step's value product always finds column slices that fit ([`value_slices`]: with 16 slices the
/// columns overrun the context by less than one slice). Without them a context of a prime number of steps ran
/// its last tokens' value products unsliced, 8 workgroups through every row (on the H100 at Flash's widths
/// 34 µs a layer against 27 sliced, and a decode token 1.45 ms against 1.40).
pub fn cache_rows(n_ctx: usize) -> usize {
    let steps = n_ctx.div_ceil(32).max(1);
    32 * (steps + steps.div_ceil(MAX_VALUE_SLICES as usize))
}

/// The longest context whose cache of `row_bytes` a row fits in `bytes` (0 if none does).
pub fn longest_context(row_bytes: u64, bytes: u64) -> usize {
    let mut steps = (bytes / row_bytes.max(1) / 32) as usize;
    while steps > 0 && cache_rows(32 * steps) as u64 * row_bytes > bytes {
        steps -= 1;
    }
    32 * steps
}

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
    kv_at: u32,
    norm_w: &wgpu::Buffer,
    cache: &wgpu::Buffer,
    pos: u32,
    rank: u32,
    rope_dim: u32,
    eps: f32,
    rope_base: f32,
) {
    kv_rows_at(gpu, pass, (kv, kv_at), norm_w, cache, pos, 1, rank, rope_dim, eps, rope_base);
}

/// [`kv_row`] for `tokens` tokens: token t's `kv` at `kv[t·(rank + rope_dim) ..]` becomes cache row `pos + t`.
#[allow(clippy::too_many_arguments)]
pub fn kv_rows(gpu: &Gpu, pass: &mut Pass, kv: &wgpu::Buffer, norm_w: &wgpu::Buffer, cache: &wgpu::Buffer, pos: u32, tokens: u32, rank: u32, rope_dim: u32, eps: f32, rope_base: f32) {
    kv_rows_at(gpu, pass, (kv, 0), norm_w, cache, pos, tokens, rank, rope_dim, eps, rope_base);
}

#[allow(clippy::too_many_arguments)]
fn kv_rows_at(gpu: &Gpu, pass: &mut Pass, kv: (&wgpu::Buffer, u32), norm_w: &wgpu::Buffer, cache: &wgpu::Buffer, pos: u32, tokens: u32, rank: u32, rope_dim: u32, eps: f32, rope_base: f32) {
    assert!(rope_dim % 2 == 0, "RoPE dims come in pairs");
    assert!(tokens >= 1);
    assert_cache_holds(cache, pos + tokens - 1, rank, rope_dim);
    let kernel = gpu.kernel(LABEL, SHADER, "mla_kv_row");
    let params = [P::U(pos), P::U(rank), P::U(rope_dim), P::F(eps), P::F(rope_step(rope_base, rope_dim)), P::U(tokens), P::U(kv.1)];
    let kv = kv.0;
    pass.dispatch(gpu, &kernel, &[kv, norm_w, cache], &params, tokens);
}

/// [`kv_row`] and [`rope_q`] of one decode step in one dispatch: `projections` holds the step's q (per head
/// `[q_nope | q_pe]`) at 0 and its kv at `kv_at`.
#[allow(clippy::too_many_arguments)]
pub fn kv_row_and_rope_q(gpu: &Gpu, pass: &mut Pass, projections: &wgpu::Buffer, kv_at: u32, norm_w: &wgpu::Buffer, cache: &wgpu::Buffer, q_abs: &wgpu::Buffer, pos: u32, n_head: u32, d_nope: u32, rank: u32, rope_dim: u32, eps: f32, rope_base: f32) {
    assert!(rope_dim % 2 == 0, "RoPE dims come in pairs");
    assert!(kv_at >= n_head * (d_nope + rope_dim), "the kv projection after the query");
    assert!(q_abs.size() >= (n_head * (rank + rope_dim)) as u64 * 4, "q_abs holds every head's row");
    assert_cache_holds(cache, pos, rank, rope_dim);
    let kernel = gpu.kernel(LABEL, SHADER, "mla_kv_row_rope_q");
    let params = [P::U(pos), P::U(rank), P::U(rope_dim), P::F(eps), P::F(rope_step(rope_base, rope_dim)), P::U(kv_at), P::U(n_head), P::U(d_nope)];
    pass.dispatch(gpu, &kernel, &[projections, norm_w, cache, q_abs], &params, 1 + (n_head * rope_dim / 2).div_ceil(256));
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

/// At most this many splits of a head's rows (flash-decoding): a scratch of
/// [`partial_floats`]`(n_head, rank, 1)` floats holds them for one token.
pub const MAX_SPLITS: u32 = 32;
/// Splits are added until a step has about this many workgroups: decode has one per head (32 for Ling), far too
/// few to fill a large GPU once each walks a long context.
const TARGET_WORKGROUPS: u32 = 256;
/// A split takes at least one workgroup's chunk of rows (256), so short contexts stay in one workgroup per head.
const MIN_ROWS_PER_SPLIT: u32 = 256;

/// Floats of the scratch [`attention_tokens`] needs to split `tokens` tokens' rows [`MAX_SPLITS`] ways: per
/// (token, head, split) a partial `[max, sum, unnormalised output (rank)]`.
pub fn partial_floats(n_head: u32, rank: u32, tokens: u32) -> usize {
    MAX_SPLITS as usize * (split_bytes(n_head, rank, tokens) / 4) as usize
}

/// Bytes of one split's partials for `tokens` tokens.
fn split_bytes(n_head: u32, rank: u32, tokens: u32) -> u64 {
    tokens as u64 * n_head as u64 * (rank as u64 + 2) * 4
}

/// How many ways to split each head's `n_rows` rows, with `parallel` (head, token) workgroups already, and
/// room for `capacity` splits in the scratch.
pub fn splits_for(n_rows: u32, parallel: u32, capacity: u32) -> u32 {
    let by_rows = n_rows.div_ceil(MIN_ROWS_PER_SPLIT);
    let by_grid = TARGET_WORKGROUPS.div_ceil(parallel.max(1));
    by_rows.min(by_grid).min(capacity).clamp(1, MAX_SPLITS)
}

/// Causal attention of every head over cache rows `0..=pos`: `s_t = (q_abs_h · cache_t)/√d_qk` over all
/// `rank + rope_dim` dims, `p = softmax(s)`, `out[h·rank + ρ] = Σ_t p_t·cache_t[ρ]` for ρ < rank (the latent
/// output ō_h, before W_vb). An online softmax, so no score buffer and any `pos`; a long context is split
/// across workgroups and combined (see [`splits_for`]).
///
/// * `q_abs`: `n_head·(rank + rope_dim)` floats, per head `[q̃_h | RoPE(q_pe_h)]`.
/// * `cache`: at least `(pos + 1)·(rank + rope_dim)` floats (rows after `pos` are not read).
/// * `partials`: scratch; up to [`partial_floats`]`(n_head, rank, 1)` floats are used, fewer splits if smaller.
/// * `out`: `n_head·rank` floats.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    gpu: &Gpu,
    pass: &mut Pass,
    q_abs: &wgpu::Buffer,
    cache: &wgpu::Buffer,
    partials: &wgpu::Buffer,
    out: &wgpu::Buffer,
    pos: u32,
    n_head: u32,
    rank: u32,
    rope_dim: u32,
    d_qk: u32,
) {
    attention_tokens(gpu, pass, q_abs, cache, partials, out, pos, 1, n_head, rank, rope_dim, d_qk);
}

/// [`attention`] for `tokens` tokens of a chunk, causally: token t (position `pos + t`) attends cache rows
/// `0..=pos + t`; its queries at `q_abs[t·n_head·(rank + rope_dim) ..]`, its outputs at `out[t·n_head·rank ..]`.
/// It splits the rows as far as `partials` holds [`partial_floats`] for.
#[allow(clippy::too_many_arguments)]
pub fn attention_tokens(gpu: &Gpu, pass: &mut Pass, q_abs: &wgpu::Buffer, cache: &wgpu::Buffer, partials: &wgpu::Buffer, out: &wgpu::Buffer, pos: u32, tokens: u32, n_head: u32, rank: u32, rope_dim: u32, d_qk: u32) {
    let capacity = (partials.size() / split_bytes(n_head, rank, tokens).max(1)).min(MAX_SPLITS as u64) as u32;
    let splits = splits_for(pos + tokens, n_head * tokens, capacity);
    attention_split(gpu, pass, q_abs, cache, partials, out, pos, tokens, n_head, rank, rope_dim, d_qk, splits);
}

/// [`attention_tokens`] with each head's rows split `splits` ways, `⌈(pos + tokens)/splits⌉` rows each (the
/// last token's count; earlier tokens of a chunk may leave a split empty). With `splits > 1`, `partials` must
/// hold [`partial_floats`]`(n_head, rank, tokens)·splits/MAX_SPLITS` floats and a second dispatch combines them.
#[allow(clippy::too_many_arguments)]
pub fn attention_split(gpu: &Gpu, pass: &mut Pass, q_abs: &wgpu::Buffer, cache: &wgpu::Buffer, partials: &wgpu::Buffer, out: &wgpu::Buffer, pos: u32, tokens: u32, n_head: u32, rank: u32, rope_dim: u32, d_qk: u32, splits: u32) {
    assert!(tokens >= 1);
    assert_cache_holds(cache, pos + tokens - 1, rank, rope_dim);
    assert!(rank <= MAX_RANK, "kv_lora_rank {rank} > {MAX_RANK}");
    assert!(rank + rope_dim <= MAX_RANK + 128, "kv_lora_rank + rope_dim {} > {}", rank + rope_dim, MAX_RANK + 128); // ATTN_MAX_WIDTH
    assert!((1..=MAX_SPLITS).contains(&splits), "{splits} splits: 1 to {MAX_SPLITS}");
    if splits > 1 {
        let needed = split_bytes(n_head, rank, tokens) * splits as u64;
        assert!(partials.size() >= needed, "a {}-byte scratch cannot hold {splits} splits ({needed} bytes needed)", partials.size());
    }
    let kernel = gpu.kernel(LABEL, SHADER, "mla_attention");
    let scale = 1.0 / (d_qk as f32).sqrt(); // llama.cpp: kq_scale = 1.0f/sqrtf(float(n_embd_head_k_mla))
    let rows_per_split = (pos + tokens).div_ceil(splits);
    let params = [P::U(pos), P::U(n_head), P::U(rank), P::U(rope_dim), P::F(scale), P::U(tokens), P::U(splits), P::U(rows_per_split)];
    let (x, y) = gpu.grid(n_head);
    pass.dispatch_3d(gpu, &kernel, &[q_abs, cache, out, partials], &params, (x, y, tokens * splits));
    if splits > 1 {
        let combine = gpu.kernel(LABEL, SHADER, "mla_attention_combine");
        pass.dispatch_3d(gpu, &combine, &[partials, out], &params, (x, y, tokens));
    }
}

/// A decode step over at least this many cache rows runs [`attention_by_products`]: its products keep the
/// cache reads coalesced where the online-softmax kernel reads one row per invocation, and with the value
/// product in column slices they were faster at every context measured (128 to 2048 rows, H200).
const PRODUCTS_FROM_ROWS: u32 = 1;

pub fn decode_by_products(rows: u32) -> bool {
    rows >= PRODUCTS_FROM_ROWS
}

/// Floats of a decode step's attention scratch: the split kernel's partials, or one token's scores.
pub fn decode_scratch_floats(n_head: usize, rank: usize, n_ctx: usize) -> usize {
    partial_floats(n_head as u32, rank as u32, 1).max(n_head * cache_rows(n_ctx))
}

/// Floats of the score scratch [`attention_by_products`] takes for a prefill of `chunk`-token chunks in an
/// `n_ctx` context: room for a whole chunk's scores up to 64 MiB (or `max_binding`), and never less than one
/// token's (None when even that does not fit the binding limit).
pub fn score_floats(n_head: usize, n_ctx: usize, chunk: usize, max_binding: u64) -> Option<usize> {
    let per_token = n_head * cache_rows(n_ctx);
    let cap = ((64usize << 20) / 4).min((max_binding / 4) as usize);
    (per_token <= (max_binding / 4) as usize).then(|| (per_token * chunk).min(cap.max(per_token)))
}

/// [`attention_tokens`] as matrix products, for a prefill chunk: many tokens share every cache row, so for a block
/// of tokens (as many as `scores` holds rows for) the scores of all their heads against the cache rows are one
/// product (`S = Q̃·Cᵀ`, the query rows `t·n_head + h`), a softmax per row applies the scale and the causal mask
/// (`mla_softmax_rows`), and the outputs are a second product with the cache rows' values (`P·C[.., ..rank]`).
/// Same inputs and outputs as [`attention_tokens`]; the cache must hold [`cache_rows`] rows past `pos + tokens`.
/// Widths the products cannot step through 32 at a time go to [`attention_tokens`] (`scores` as its scratch).
#[allow(clippy::too_many_arguments)]
pub fn attention_by_products(gpu: &Gpu, pass: &mut Pass, q_abs: &wgpu::Buffer, cache: &wgpu::Buffer, scores: &wgpu::Buffer, slices_scratch: Option<&wgpu::Buffer>, out: &wgpu::Buffer, pos: u32, tokens: u32, n_head: u32, rank: u32, rope_dim: u32, d_qk: u32) {
    let left = attention_by_products_into(gpu, pass, q_abs, cache, scores, slices_scratch, out, pos, tokens, n_head, rank, rope_dim, d_qk, false);
    debug_assert!(left.is_none());
}

/// [`attention_by_products`] for one token (a decode step), whose value product, where it runs in column slices,
/// leaves its partial outputs in `slices_scratch` unsummed: then the slices are returned, query q's partial of
/// slice s at `(s·n_head + q)·rank` (for [`super::matvec::batched_with`], which adds them as it reads them: a
/// dispatch fewer); None where the outputs are in `out`.
#[allow(clippy::too_many_arguments)]
pub fn decode_attention_by_products(gpu: &Gpu, pass: &mut Pass, q_abs: &wgpu::Buffer, cache: &wgpu::Buffer, scores: &wgpu::Buffer, slices_scratch: &wgpu::Buffer, out: &wgpu::Buffer, pos: u32, n_head: u32, rank: u32, rope_dim: u32, d_qk: u32) -> Option<super::matvec::Slices> {
    attention_by_products_into(gpu, pass, q_abs, cache, scores, Some(slices_scratch), out, pos, 1, n_head, rank, rope_dim, d_qk, true)
}

#[allow(clippy::too_many_arguments)]
fn attention_by_products_into(gpu: &Gpu, pass: &mut Pass, q_abs: &wgpu::Buffer, cache: &wgpu::Buffer, scores: &wgpu::Buffer, slices_scratch: Option<&wgpu::Buffer>, out: &wgpu::Buffer, pos: u32, tokens: u32, n_head: u32, rank: u32, rope_dim: u32, d_qk: u32, keep_slices: bool) -> Option<super::matvec::Slices> {
    use super::matmul::{self, Rows};
    use super::matvec::{Matrix, Strided};
    assert!(tokens >= 1 && (!keep_slices || tokens == 1), "slices are left for one token's step only");
    let width = rank + rope_dim;
    if width % 32 != 0 || rank % 32 != 0 {
        attention_tokens(gpu, pass, q_abs, cache, scores, out, pos, tokens, n_head, rank, rope_dim, d_qk);
        return None;
    }
    let last_cols = (pos + tokens).next_multiple_of(32);
    assert_cache_holds(cache, last_cols - 1, rank, rope_dim);
    let capacity = (scores.size() / 4) as u32;
    let block = (capacity / (n_head * last_cols)).min(tokens);
    assert!(block >= 1, "a {}-byte score scratch cannot hold one token's scores ({} rows of {n_head} heads)", scores.size(), last_cols);
    let scale = 1.0 / (d_qk as f32).sqrt(); // llama.cpp: kq_scale = 1.0f/sqrtf(float(n_embd_head_k_mla))
    let softmax = gpu.kernel(LABEL, SHADER, "mla_softmax_rows");
    let cache_capacity = (cache.size() / (4 * width as u64)) as u32;
    let slice_capacity = slices_scratch.map_or(0, |parts| (parts.size() / 4) as u32);
    let mut left = None;
    for t0 in (0..tokens).step_by(block as usize) {
        let b = block.min(tokens - t0);
        let n_rows = pos + t0 + b;
        let queries = b * n_head;
        // few queries (a decode step) leave the value product a handful of workgroups walking every row: split
        // its columns (the rows) into slices, summed after, as far as the scratch and the cache rows allow
        let (slices, slice_cols) = value_slices(n_rows, queries, rank, capacity, slice_capacity, cache_capacity);
        let cols = slices * slice_cols;
        let rows_of_cache = Matrix { ty: crate::quant::GgmlType::F32, rows: n_rows, cols: width, byte_offset: 0 };
        if queries <= FEW_QUERIES {
            // a decode step: the few queries would give the product a handful of tiles (3 workgroups at 128 rows);
            // as one matrix-vector product per query, it has workgroups over every row of every query
            let (x_at, y_at) = (Strided { offset: t0 * n_head * width, stride: width }, Strided { offset: 0, stride: cols });
            super::matvec::batched(gpu, pass, cache, rows_of_cache, 0, q_abs, x_at, scores, y_at, queries);
        } else {
            matmul::matmul(gpu, pass, cache, rows_of_cache, queries, q_abs, Rows::new(t0 * n_head * width, width), scores, Rows::new(0, cols));
        }
        let params = [P::U(pos + t0), P::U(n_head), P::F(scale), P::U(cols), P::U(queries)];
        pass.dispatch(gpu, &softmax, &[scores], &params, queries);
        let out_at = t0 * n_head * rank;
        match slices_scratch.filter(|_| slices > 1) {
            None => matmul::matmul_by_columns(gpu, pass, cache, 0, rank, cols, width, queries, scores, Rows::new(0, cols), out, Rows::new(out_at, rank)),
            Some(parts) => {
                let n = queries * rank;
                matmul::matmul_by_column_slices(gpu, pass, cache, 0, rank, slice_cols, width, slices, queries, scores, Rows::new(0, cols), parts, Rows::new(0, rank), n);
                if keep_slices {
                    left = Some(super::matvec::Slices { count: slices, stride: n });
                } else {
                    matmul::sum_slices(gpu, pass, parts, rank, queries, slices, out, Rows::new(out_at, rank));
                }
            }
        }
    }
    left
}

/// Queries (tokens × heads) up to this score by matrix-vector products and slice the value product.
const FEW_QUERIES: u32 = 64;

/// Slices at most for the value product's columns; past ~128 workgroups a large GPU is full. (As many as a
/// summed-slices product adds: [`super::matvec::MAX_SLICES`].)
const MAX_VALUE_SLICES: u32 = super::matvec::MAX_SLICES;

/// Floats of the scratch a decode step's value product slices into (see [`attention_by_products`]).
pub fn value_slice_floats(n_head: usize, rank: usize) -> usize {
    MAX_VALUE_SLICES as usize * n_head * rank
}

/// How to slice the value product of `queries` queries over `n_rows` cache rows: (slices, columns per slice, a
/// multiple of 32), so the slices' columns cover the rows, their scores (`queries` × all columns) fit `capacity`
/// floats of score scratch, their partial outputs (`slices·queries·rank`) `slice_capacity` floats, and their
/// columns lie in `cache_rows`.
fn value_slices(n_rows: u32, queries: u32, rank: u32, capacity: u32, slice_capacity: u32, cache_rows: u32) -> (u32, u32) {
    let steps = n_rows.div_ceil(32);
    let whole = (1, steps * 32);
    if queries > FEW_QUERIES {
        return whole;
    }
    let mut slices = MAX_VALUE_SLICES.min(steps);
    while slices > 1 {
        let slice_cols = steps.div_ceil(slices) * 32;
        let n = steps.div_ceil(steps.div_ceil(slices)); // slices actually needed at that width
        let cols = n * slice_cols;
        if n > 1 && cols <= cache_rows && queries * cols <= capacity && n * queries * rank <= slice_capacity {
            return (n, slice_cols);
        }
        slices -= 1;
    }
    whole
}

/// The head-wise gate, in place: `o[h·d_v + a] *= σ(gate_logits[gate_at + h])`.
///
/// * `o`: `n_head·d_v` floats (the per-head outputs after W_vb).
/// * `gate_logits`: `n_head` floats from `gate_at` on (`attn_gate` applied to the normed input).
pub fn head_gate(gpu: &Gpu, pass: &mut Pass, o: &wgpu::Buffer, gate_logits: &wgpu::Buffer, gate_at: u32, n_head: u32, d_v: u32) {
    let kernel = gpu.kernel(LABEL, SHADER, "mla_head_gate");
    pass.dispatch(gpu, &kernel, &[o, gate_logits], &[P::U(n_head), P::U(d_v), P::U(gate_at)], (n_head * d_v).div_ceil(256));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A decode step's value product is sliced at every position of every context (from two steps of rows on),
    /// with its columns inside the cache, as a decode step's scratch allows (Flash's heads and rank).
    #[test]
    fn every_decode_position_finds_value_slices_in_the_cache() {
        let (n_head, rank) = (32usize, 512u32);
        for n_ctx in (1..=1200).chain([4096, 4097, 32 * 127, 32 * 131 + 5]) {
            let rows = cache_rows(n_ctx) as u32;
            let capacity = decode_scratch_floats(n_head, rank as usize, n_ctx) as u32;
            let slice_capacity = value_slice_floats(n_head, rank as usize) as u32;
            for n_rows in 1..=n_ctx as u32 {
                let (slices, slice_cols) = value_slices(n_rows, n_head as u32, rank, capacity, slice_capacity, rows);
                assert!(slices * slice_cols >= n_rows && slices * slice_cols <= rows, "n_ctx {n_ctx}, {n_rows} rows: {slices} × {slice_cols} columns in {rows}");
                if n_rows > 32 {
                    assert!(slices > 1, "n_ctx {n_ctx}, {n_rows} rows: unsliced");
                }
            }
        }
    }

    #[test]
    fn the_longest_context_is_the_last_that_fits() {
        let row = 576 * 4;
        for bytes in [row * 40, row * 70, row * 1000, row * 1000 + 7, 2_147_483_644] {
            let most = longest_context(row, bytes);
            assert!(most == 0 || cache_rows(most) as u64 * row <= bytes, "{bytes} bytes: {most} do not fit");
            assert!(cache_rows(most + 1) as u64 * row > bytes, "{bytes} bytes: {} fit too", most + 1);
        }
    }
}
