//! The prompt in chunks (batched prefill): the same layers as [`super::forward`]'s decode step, for many tokens
//! at once, with matrix-matrix products ([`crate::gpu::matmul`]) that decode each weight once per tile of 64
//! or 128 tokens instead of once per token.
//!
//! Order of work: a *span* of the prompt (up to `span` tokens) runs layer by layer; inside a layer, its tokens go
//! through in *chunks* of up to `chunk` tokens (the scratch buffers hold one chunk). A layer's states (KDA conv and
//! recurrence, MLA cache) only depend on that layer's earlier tokens, so running layer l for all the span's
//! tokens before layer l + 1 gives the decode path's result, and it lets a streamed MoE layer route the whole
//! span first and then read each expert the span selected once:
//!   * KDA: the conv and the delta rule go through the chunk's tokens in order inside one kernel each, the states
//!     carried in and out (equal to that many decode steps).
//!   * MLA: the chunk's latent rows are written to the cache first, then token t (position p + t) attends rows
//!     0..=p + t.
//!   * MoE, experts resident: routing, grouping of the (token, expert) pairs by expert (`moe_group`) and the
//!     experts' products stay on the GPU, each selected expert applied to all its tokens of the chunk.
//!   * MoE, experts streamed: the span's selections come back once per layer (one sync); the distinct experts
//!     are brought into the pool in waves that fit it (the ones already there first, each wave pinned while it
//!     runs), so each is read at most once per span; each wave adds its experts' weighted outputs to the tokens.
//!
//! Numerics: every sum is the decode path's except for the order of terms inside dot products (tiles) and, when
//! streaming, the order in which the shared expert and the waves' expert outputs are added; the logits agree
//! with the token-by-token path to f32 rounding (tests/prefill.rs).

use super::cache::{CacheStats, ExpertCache, NONE};
use super::forward::{Experts, LayerState, State, TensorOf};
use super::pool::{ExpertPool, RecordReader};
use super::weights::Weights;
use crate::clock::now_s;
use crate::gpu::matmul::{self, Rows};
use crate::gpu::matvec::Matrix;
use crate::gpu::{dequant, kda, mla, moe, norm, Gpu, Pass};
use crate::model::Config;

/// Tokens per chunk when the options say nothing. Bigger chunks give each expert more of a chunk's tokens per
/// weight decoded: a 2048-token prompt at Flash widths on the H100 prefilled at 0.141 ms/token in chunks of 256,
/// 0.112 of 512, 0.098 of 1024, 0.091 of 2048 (`lingtab bench --prompts 2048 --chunks 1,256,512,1024,2048`).
/// 1024 takes most of that for half of 2048's scratch (about 0.55 GB at Flash widths; a binding limit lowers it).
pub const DEFAULT_CHUNK: usize = 1024;
/// Tokens per span when the options say nothing (x and the FFN inputs of a span are kept: 2·span·hidden floats).
pub const DEFAULT_SPAN: usize = 2048;

/// The scratch of the chunked prefill: per-span rows (residual stream, FFN inputs, selections) and per-chunk rows.
pub struct Prefill {
    pub chunk: usize,
    pub span: usize,
    ids: wgpu::Buffer,
    /// residual stream and normed layer inputs of every token of the span
    x: wgpu::Buffer,
    h: wgpu::Buffer,
    sel: wgpu::Buffer,
    attn_out: wgpu::Buffer,
    ffn_out: wgpu::Buffer,
    // KDA
    qkv_pre: wgpu::Buffer,
    qkv: wgpu::Buffer,
    fa: wgpu::Buffer,
    beta_logits: wgpu::Buffer,
    gb: wgpu::Buffer,
    z: wgpu::Buffer,
    o: wgpu::Buffer,
    o_normed: wgpu::Buffer,
    // MLA
    q: wgpu::Buffer,
    kv: wgpu::Buffer,
    q_abs: wgpu::Buffer,
    latent_mix: wgpu::Buffer,
    /// a block of the chunk's attention scores (see [`mla::attention_by_products`])
    scores: wgpu::Buffer,
    heads_out: wgpu::Buffer,
    gate_logits: wgpu::Buffer,
    // FFN (the dense and shared FFNs and the experts' pairs share gu and act)
    gu: wgpu::Buffer,
    act: wgpu::Buffer,
    router_logits: wgpu::Buffer,
    groups: wgpu::Buffer,
    experts_out: wgpu::Buffer,
    /// slot of each expert of the wave being computed (streaming), NONE for the others
    wave_slots: wgpu::Buffer,
    /// the column slices' partial sums of a dense product split to fill the GPU ([`matmul::matmul_split`])
    partials: wgpu::Buffer,
    /// GPU bytes of all of the above.
    pub bytes: u64,
}

/// Floats per token of each per-chunk buffer, and the per-span ones, for sizing.
struct Widths {
    per_chunk_token: Vec<usize>,
    per_span_token: Vec<usize>,
}

fn widths(c: &Config) -> Widths {
    let (h, d, nh, k) = (c.hidden, c.kda_dim(), c.n_head, c.n_expert_used);
    let latent = c.kv_lora_rank + c.rope_dim;
    let ff = c.ff_dense.max(c.ff_shared).max(k * c.ff_expert);
    Widths {
        per_chunk_token: vec![
            h, h, 3 * d, 3 * d, d, nh, d + nh, d, d, d, nh * c.key_length_mla, latent, nh * latent, nh * c.kv_lora_rank,
            nh * c.value_length_mla, nh, 2 * ff, ff, c.n_expert, k * h,
        ],
        per_span_token: vec![h, h, moe::selection_words(k as u32)],
    }
}

/// Partial sums of a split product: two slices of the widest dense product over up to 512 of the chunk's
/// tokens (a product split more ways has fewer rows, and one over more tokens fills the GPU unsplit).
fn partial_floats(c: &Config, chunk: usize) -> usize {
    let widest = c.hidden.max(c.kda_dim()).max(c.n_head * c.key_length_mla).max(c.n_expert);
    2 * widest * chunk.min(512)
}

fn floats(gpu: &Gpu, label: &str, n: usize) -> wgpu::Buffer {
    gpu.storage_buffer(label, (n.max(1) * 4) as u64)
}

impl Prefill {
    /// The scratch the options ask for, or None for token by token (a chunk of 1, or a binding limit that does
    /// not hold two tokens' rows).
    pub fn for_options(gpu: &Gpu, c: &Config, chunk: Option<usize>, span: Option<usize>, n_ctx: usize, max_binding: u64) -> Option<Prefill> {
        let chunk = chunk.unwrap_or(DEFAULT_CHUNK).min(n_ctx);
        if chunk < 2 {
            return None;
        }
        let span = span.unwrap_or(DEFAULT_SPAN).clamp(chunk, n_ctx.max(chunk));
        Prefill::new(gpu, c, chunk, span, n_ctx, max_binding).ok()
    }

    /// GPU bytes of the scratch `for_options` would allocate (0 for token by token), for planning the load.
    pub fn bytes_needed(c: &Config, chunk: Option<usize>, span: Option<usize>, n_ctx: usize, max_binding: u64) -> u64 {
        let chunk = chunk.unwrap_or(DEFAULT_CHUNK).min(n_ctx);
        if chunk < 2 {
            return 0;
        }
        let span = span.unwrap_or(DEFAULT_SPAN).clamp(chunk, n_ctx.max(chunk));
        let Ok((chunk, span)) = Self::sizes(c, chunk, span, max_binding) else { return 0 };
        let Some(scores) = mla::score_floats(c.n_head, n_ctx, chunk, max_binding) else { return 0 };
        let w = widths(c);
        let bytes = |n: usize| (n.max(1) * 4) as u64;
        bytes(span)
            + w.per_span_token.iter().map(|&n| bytes(span * n)).sum::<u64>()
            + w.per_chunk_token.iter().map(|&n| bytes(chunk * n)).sum::<u64>()
            + bytes(group_words(c, chunk) as usize)
            + bytes(c.n_expert)
            + bytes(scores)
            + bytes(partial_floats(c, chunk))
    }

    /// Chunk and span lowered until every buffer fits `max_binding` bytes.
    fn sizes(c: &Config, chunk: usize, span: usize, max_binding: u64) -> Result<(usize, usize), String> {
        let w = widths(c);
        let widest_chunk = *w.per_chunk_token.iter().max().unwrap() as u64 * 4;
        let widest_span = *w.per_span_token.iter().max().unwrap() as u64 * 4;
        let mut chunk = chunk.clamp(1, (max_binding / widest_chunk) as usize);
        while chunk > 1 && group_words(c, chunk) * 4 > max_binding {
            chunk /= 2;
        }
        let span = span.max(chunk).min((max_binding / widest_span) as usize).max(1);
        let chunk = chunk.min(span);
        if chunk < 2 {
            return Err(format!("a binding limit of {max_binding} bytes leaves no room for a prefill chunk"));
        }
        Ok((chunk, span))
    }

    /// Scratch for chunks of up to `chunk` tokens and spans of up to `span`, both lowered until every buffer
    /// fits `max_binding` bytes.
    pub fn new(gpu: &Gpu, c: &Config, chunk: usize, span: usize, n_ctx: usize, max_binding: u64) -> Result<Prefill, String> {
        let (chunk, span) = Self::sizes(c, chunk, span, max_binding)?;
        let scores = mla::score_floats(c.n_head, n_ctx, chunk, max_binding)
            .ok_or_else(|| format!("one token's attention scores over {n_ctx} tokens do not fit a {max_binding}-byte binding"))?;
        let k = c.n_expert_used;
        let (h, d, nh) = (c.hidden, c.kda_dim(), c.n_head);
        let latent = c.kv_lora_rank + c.rope_dim;
        let ff = c.ff_dense.max(c.ff_shared).max(k * c.ff_expert);
        let t = chunk;
        let mut p = Prefill {
            chunk,
            span,
            ids: floats(gpu, "prefill ids", span),
            x: floats(gpu, "prefill x", span * h),
            h: floats(gpu, "prefill h", span * h),
            sel: floats(gpu, "prefill selections", span * moe::selection_words(k as u32)),
            attn_out: floats(gpu, "prefill attn out", t * h),
            ffn_out: floats(gpu, "prefill ffn out", t * h),
            qkv_pre: floats(gpu, "prefill qkv pre-conv", t * 3 * d),
            qkv: floats(gpu, "prefill qkv", t * 3 * d),
            fa: floats(gpu, "prefill f_a", t * d),
            beta_logits: floats(gpu, "prefill beta logits", t * nh),
            gb: floats(gpu, "prefill g|beta", t * (d + nh)),
            z: floats(gpu, "prefill z", t * d),
            o: floats(gpu, "prefill o", t * d),
            o_normed: floats(gpu, "prefill o normed", t * d),
            q: floats(gpu, "prefill q", t * nh * c.key_length_mla),
            kv: floats(gpu, "prefill kv", t * latent),
            q_abs: floats(gpu, "prefill q absorbed", t * nh * latent),
            latent_mix: floats(gpu, "prefill latent mix", t * nh * c.kv_lora_rank),
            scores: floats(gpu, "prefill attention scores", scores),
            heads_out: floats(gpu, "prefill heads out", t * nh * c.value_length_mla),
            gate_logits: floats(gpu, "prefill head gate", t * nh),
            gu: floats(gpu, "prefill gate|up", t * 2 * ff),
            act: floats(gpu, "prefill act", t * ff),
            router_logits: floats(gpu, "prefill router", t * c.n_expert),
            groups: floats(gpu, "prefill expert groups", group_words(c, t) as usize),
            experts_out: floats(gpu, "prefill experts out", t * k * h),
            wave_slots: floats(gpu, "prefill wave slots", c.n_expert),
            partials: floats(gpu, "prefill split partials", partial_floats(c, chunk)),
            bytes: 0,
        };
        p.bytes = p.buffers().map(|b| b.size()).sum();
        debug_assert_eq!(p.bytes, Self::bytes_needed(c, Some(chunk), Some(span), n_ctx, max_binding), "Prefill::bytes_needed disagrees with Prefill::new");
        Ok(p)
    }

    fn buffers(&self) -> impl Iterator<Item = &wgpu::Buffer> {
        [
            &self.ids, &self.x, &self.h, &self.sel, &self.attn_out, &self.ffn_out, &self.qkv_pre, &self.qkv, &self.fa, &self.beta_logits, &self.gb,
            &self.z, &self.o, &self.o_normed, &self.q, &self.kv, &self.q_abs, &self.latent_mix, &self.scores, &self.heads_out, &self.gate_logits, &self.gu,
            &self.act, &self.router_logits, &self.groups, &self.experts_out, &self.wave_slots, &self.partials,
        ]
        .into_iter()
    }
}

/// The tiles of one chunk's expert products.
fn chunk_expert_tiles(c: &Config, tokens: usize) -> matmul::ExpertTiles {
    matmul::expert_tiles(tokens as u32, (tokens * c.n_expert_used) as u32, c.n_expert as u32)
}

/// Tile entries of one chunk's expert groups.
fn chunk_tiles(c: &Config, tokens: usize) -> u32 {
    matmul::max_tiles((tokens * c.n_expert_used) as u32, c.n_expert as u32, chunk_expert_tiles(c, tokens).pairs())
}

/// Words of a chunk's expert groups, for tiles of any kind (those of the fewest pairs need the most entries).
fn group_words(c: &Config, tokens: usize) -> u64 {
    let pairs = (tokens * c.n_expert_used) as u32;
    moe::group_list_at(matmul::max_tiles(pairs, c.n_expert as u32, matmul::ROW_TOKENS.min(matmul::BLOCK_PAIRS))) as u64 + pairs as u64
}

/// What a span needs besides the GPU buffers.
pub struct Span<'a> {
    pub gpu: &'a Gpu,
    pub config: &'a Config,
    pub weights: &'a Weights,
    pub state: &'a State,
    pub scratch: &'a Prefill,
}

/// Runs `tokens` (at most `scratch.span`) at positions `pos0 ..`: every layer's states advance as after that many
/// decode steps; the last token's logits land in `state.logits`, its greedy pick in `state.argmax`.
pub async fn run_span(s: &Span<'_>, pool: &mut ExpertPool, experts: &mut Experts, stats: &mut CacheStats, tokens: &[u32], pos0: u32) -> Result<(), String> {
    let (gpu, c, w, p) = (s.gpu, s.config, s.weights, s.scratch);
    let n = tokens.len();
    assert!(n >= 1 && n <= p.span, "{n} tokens for a span of {}", p.span);
    let hidden = c.hidden as u32;
    let eps = c.rms_eps;
    let mut pass = Pass::new();

    gpu.queue.write_buffer(&p.ids, 0, bytemuck::cast_slice(tokens));
    let embd = w.get("token_embd.weight")?;
    for piece in &embd.pieces {
        dequant::record_rows(gpu, &mut pass, &piece.buffer, embd.ty, embd.row_bytes(), piece.first_row, piece.rows, &p.ids, n as u32, hidden, &p.x, 0);
    }
    let chunks: Vec<(usize, usize)> = (0..n).step_by(p.chunk).map(|c0| (c0, p.chunk.min(n - c0))).collect();

    for l in 0..c.n_layer {
        let t = |name: &str| w.get(&format!("blk.{l}.{name}"));
        for &(c0, m) in &chunks {
            let at = (c0 * c.hidden) as u32;
            let pass = &mut pass;
            norm::rms_norm_rows(gpu, pass, &p.x, at, hidden, t("attn_norm.weight")?.whole(), &p.h, at, hidden, hidden, eps, m as u32);
            match &s.state.layers[l] {
                LayerState::Kda { conv, recurrent, consts } => kda_chunk(gpu, pass, c, &t, p, c0, m, conv, recurrent, consts)?,
                LayerState::Mla { cache } => mla_chunk(gpu, pass, c, &t, p, c0, m, cache, pos0 + c0 as u32)?,
            }
            moe::add_at(gpu, pass, &p.x, at, &p.attn_out, 0, m as u32 * hidden);
            norm::rms_norm_rows(gpu, pass, &p.x, at, hidden, t("ffn_norm.weight")?.whole(), &p.h, at, hidden, hidden, eps, m as u32);
            if !c.is_moe_layer(l) {
                let f = c.ff_dense as u32;
                let x_at = Rows::new(at, hidden);
                t("ffn_gate.weight")?.matmul(gpu, pass, m as u32, &p.h, x_at, &p.gu, Rows::new(0, 2 * f), &p.partials);
                t("ffn_up.weight")?.matmul(gpu, pass, m as u32, &p.h, x_at, &p.gu, Rows::new(f, 2 * f), &p.partials);
                moe::swiglu(gpu, pass, &p.gu, &p.act, f, m as u32, c.clamp_shexp[l]);
                t("ffn_down.weight")?.matmul(gpu, pass, m as u32, &p.act, Rows::new(0, f), &p.ffn_out, Rows::new(0, hidden), &p.partials);
                moe::add_at(gpu, pass, &p.x, at, &p.ffn_out, 0, m as u32 * hidden);
                continue;
            }
            route_chunk(gpu, pass, c, &t, p, c0, m)?;
            shared_expert(gpu, pass, c, &t, p, c0, m, l)?;
            match experts {
                Experts::Resident => {
                    let slot_base = l as u32 * pool.n_expert;
                    experts_chunk(gpu, pass, c, p, pool, &pool.table, slot_base, c0, m, l)?;
                    let (k, sel_at) = (c.n_expert_used as u32, sel_offset(c, c0));
                    moe::accumulate_tokens(gpu, pass, &p.experts_out, &p.sel, sel_at, &p.ffn_out, &p.x, at, hidden, k, m as u32);
                }
                // the shared expert now; the routed experts once the whole span is routed
                Experts::Streaming { .. } => moe::add_at(gpu, pass, &p.x, at, &p.ffn_out, 0, m as u32 * hidden),
            }
        }
        if c.is_moe_layer(l) {
            let k = c.n_expert_used as u64;
            match experts {
                Experts::Resident => {
                    stats.hits += n as u64 * k;
                    stats.layer_hits[l] += n as u64 * k;
                }
                Experts::Streaming { cache, reader } => {
                    std::mem::take(&mut pass).submit(gpu);
                    stats.submits += 1;
                    stream_layer(s, pool, cache, reader.as_ref(), stats, &chunks, l).await?;
                    continue;
                }
            }
        }
        // one submission per layer, so the GPU starts while the next layer is recorded
        std::mem::take(&mut pass).submit(gpu);
        stats.submits += 1;
    }

    let last = ((n - 1) * c.hidden) as u32;
    norm::rms_norm(gpu, &mut pass, &p.x, last, w.get("output_norm.weight")?.whole(), &s.state.h, 0, hidden, eps);
    w.get("output.weight").or_else(|_| w.get("token_embd.weight"))?.matvec(gpu, &mut pass, &s.state.h, 0, &s.state.logits, 0);
    norm::argmax(gpu, &mut pass, &s.state.logits, s.state.vocab as u32, &s.state.argmax);
    pass.submit(gpu);
    stats.submits += 1;
    if let Experts::Streaming { cache, .. } = experts {
        for _ in 0..n {
            cache.end_token();
        }
    }
    Ok(())
}

/// Word offset of token `c0`'s selection in the span's selections.
fn sel_offset(c: &Config, c0: usize) -> u32 {
    (c0 * moe::selection_words(c.n_expert_used as u32)) as u32
}

#[allow(clippy::too_many_arguments)]
fn kda_chunk(gpu: &Gpu, pass: &mut Pass, c: &Config, t: &TensorOf, p: &Prefill, c0: usize, m: usize, conv: &wgpu::Buffer, recurrent: &wgpu::Buffer, conv_w: &wgpu::Buffer) -> Result<(), String> {
    let (d, nh, hd) = (c.kda_dim() as u32, c.n_head as u32, c.kda_head_dim as u32);
    let (m32, hidden) = (m as u32, c.hidden as u32);
    let x_at = Rows::new((c0 * c.hidden) as u32, hidden);
    t("attn_q.weight")?.matmul(gpu, pass, m32, &p.h, x_at, &p.qkv_pre, Rows::new(0, 3 * d), &p.partials);
    t("attn_k.weight")?.matmul(gpu, pass, m32, &p.h, x_at, &p.qkv_pre, Rows::new(d, 3 * d), &p.partials);
    t("attn_v.weight")?.matmul(gpu, pass, m32, &p.h, x_at, &p.qkv_pre, Rows::new(2 * d, 3 * d), &p.partials);
    kda::conv_tokens(gpu, pass, &p.qkv_pre, conv_w, conv, &p.qkv, 3 * d, c.conv_kernel as u32, m32);
    t("ssm_f_a.weight")?.matmul(gpu, pass, m32, &p.h, x_at, &p.fa, Rows::new(0, d), &p.partials);
    t("ssm_beta.weight")?.matmul(gpu, pass, m32, &p.h, x_at, &p.beta_logits, Rows::new(0, nh), &p.partials);
    kda::gates_tokens(gpu, pass, &p.fa, t("ssm_dt.bias")?.whole(), t("ssm_a")?.whole(), &p.beta_logits, &p.gb, nh, hd, c.gate_lower_bound, m32);
    kda::qk_norm_tokens(gpu, pass, &p.qkv, nh, hd, c.rms_eps, m32);
    kda::delta_tokens(gpu, pass, &p.qkv, &p.gb, recurrent, &p.o, nh, hd, m32);
    t("ssm_g_a.weight")?.matmul(gpu, pass, m32, &p.h, x_at, &p.z, Rows::new(0, d), &p.partials);
    kda::head_norm_gate(gpu, pass, &p.o, t("ssm_norm.weight")?.whole(), &p.z, &p.o_normed, m32 * nh, hd, c.rms_eps);
    t("attn_output.weight")?.matmul(gpu, pass, m32, &p.o_normed, Rows::new(0, d), &p.attn_out, Rows::new(0, hidden), &p.partials);
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn mla_chunk(gpu: &Gpu, pass: &mut Pass, c: &Config, t: &TensorOf, p: &Prefill, c0: usize, m: usize, cache: &wgpu::Buffer, pos: u32) -> Result<(), String> {
    let (nh, rank, rope) = (c.n_head as u32, c.kv_lora_rank as u32, c.rope_dim as u32);
    let (d_qk, d_nope, d_v) = (c.key_length_mla as u32, c.d_nope() as u32, c.value_length_mla as u32);
    let (m32, hidden) = (m as u32, c.hidden as u32);
    let latent = rank + rope;
    let x_at = Rows::new((c0 * c.hidden) as u32, hidden);
    t("attn_q.weight")?.matmul(gpu, pass, m32, &p.h, x_at, &p.q, Rows::new(0, nh * d_qk), &p.partials);
    t("attn_kv_a_mqa.weight")?.matmul(gpu, pass, m32, &p.h, x_at, &p.kv, Rows::new(0, latent), &p.partials);
    mla::kv_rows(gpu, pass, &p.kv, t("attn_kv_a_norm.weight")?.whole(), cache, pos, m32, rank, rope, c.rms_eps, c.rope_freq_base);
    // absorbed queries: per head h, q̃_h = W_kb,h · q_nope,h for every token
    let kb = t("attn_k_b.weight")?;
    let kb_m = Matrix { ty: kb.ty, rows: rank, cols: d_nope, byte_offset: 0 };
    let kb_stride = rank as u64 * kb_m.row_bytes() as u64;
    matmul::batched(gpu, pass, kb.whole(), kb_m, kb_stride, nh, m32, &p.q, Rows::new(0, nh * d_qk), d_qk, &p.q_abs, Rows::new(0, nh * latent), latent);
    mla::rope_q_tokens(gpu, pass, &p.q, &p.q_abs, pos, m32, nh, d_nope, rope, rank, c.rope_freq_base);
    mla::attention_by_products(gpu, pass, &p.q_abs, cache, &p.scores, None, &p.latent_mix, pos, m32, nh, rank, rope, d_qk);
    let vb = t("attn_v_b.weight")?;
    let vb_m = Matrix { ty: vb.ty, rows: d_v, cols: rank, byte_offset: 0 };
    let vb_stride = d_v as u64 * vb_m.row_bytes() as u64;
    matmul::batched(gpu, pass, vb.whole(), vb_m, vb_stride, nh, m32, &p.latent_mix, Rows::new(0, nh * rank), rank, &p.heads_out, Rows::new(0, nh * d_v), d_v);
    t("attn_gate.weight")?.matmul(gpu, pass, m32, &p.h, x_at, &p.gate_logits, Rows::new(0, nh), &p.partials);
    mla::head_gate(gpu, pass, &p.heads_out, &p.gate_logits, 0, m32 * nh, d_v);
    t("attn_output.weight")?.matmul(gpu, pass, m32, &p.heads_out, Rows::new(0, nh * d_v), &p.attn_out, Rows::new(0, hidden), &p.partials);
    Ok(())
}

/// The router over the chunk's tokens; their selections land in the span's selections.
fn route_chunk(gpu: &Gpu, pass: &mut Pass, c: &Config, t: &TensorOf, p: &Prefill, c0: usize, m: usize) -> Result<(), String> {
    let e = c.n_expert as u32;
    let x_at = Rows::new((c0 * c.hidden) as u32, c.hidden as u32);
    t("ffn_gate_inp.weight")?.matmul(gpu, pass, m as u32, &p.h, x_at, &p.router_logits, Rows::new(0, e), &p.partials);
    let (k, groups, used) = (c.n_expert_used as u32, c.n_expert_group as u32, c.n_group_used as u32);
    moe::route_tokens(gpu, pass, &p.router_logits, t("exp_probs_b.bias")?.whole(), &p.sel, sel_offset(c, c0), m as u32, e, k, groups, used, c.expert_weights_norm, c.expert_weights_scale);
    Ok(())
}

/// The shared expert of the chunk's tokens into `ffn_out`.
#[allow(clippy::too_many_arguments)]
fn shared_expert(gpu: &Gpu, pass: &mut Pass, c: &Config, t: &TensorOf, p: &Prefill, c0: usize, m: usize, l: usize) -> Result<(), String> {
    let (fs, hidden, m32) = (c.ff_shared as u32, c.hidden as u32, m as u32);
    let x_at = Rows::new((c0 * c.hidden) as u32, hidden);
    t("ffn_gate_shexp.weight")?.matmul(gpu, pass, m32, &p.h, x_at, &p.gu, Rows::new(0, 2 * fs), &p.partials);
    t("ffn_up_shexp.weight")?.matmul(gpu, pass, m32, &p.h, x_at, &p.gu, Rows::new(fs, 2 * fs), &p.partials);
    moe::swiglu(gpu, pass, &p.gu, &p.act, fs, m32, c.clamp_shexp[l]);
    t("ffn_down_shexp.weight")?.matmul(gpu, pass, m32, &p.act, Rows::new(0, fs), &p.ffn_out, Rows::new(0, hidden), &p.partials);
    Ok(())
}

/// The routed experts of the chunk's pairs (token t's j-th expert: pair t·k + j) whose experts `slots` maps
/// (at `slot_base + expert`): grouped by expert, each expert's rows read once per 64 of its pairs, outputs in
/// `experts_out` row by pair.
#[allow(clippy::too_many_arguments)]
fn experts_chunk(gpu: &Gpu, pass: &mut Pass, c: &Config, p: &Prefill, pool: &ExpertPool, slots: &wgpu::Buffer, slot_base: u32, c0: usize, m: usize, l: usize) -> Result<(), String> {
    let (k, hidden, f) = (c.n_expert_used as u32, c.hidden as u32, c.ff_expert as u32);
    let layout = pool.layouts[l].ok_or_else(|| format!("layer {l} has no expert record layout"))?;
    let max_tiles = chunk_tiles(c, m);
    let list_at = moe::group_list_at(max_tiles);
    let tiles = chunk_expert_tiles(c, m);
    moe::group(gpu, pass, &p.sel, sel_offset(c, c0), m as u32, k, c.n_expert as u32, slots, slot_base, tiles.pairs(), max_tiles, &p.groups);
    let x_at = Rows::new((c0 * c.hidden) as u32, hidden);
    for ch in pool.chunks_of(l) {
        match layout.gate_up_fused() {
            Some(gate_up) => matmul::experts(gpu, pass, ch, gate_up, tiles, &p.groups, list_at, max_tiles, &p.h, x_at, k, &p.gu, Rows::new(0, 2 * f)),
            None => {
                matmul::experts(gpu, pass, ch, layout.gate, tiles, &p.groups, list_at, max_tiles, &p.h, x_at, k, &p.gu, Rows::new(0, 2 * f));
                matmul::experts(gpu, pass, ch, layout.up, tiles, &p.groups, list_at, max_tiles, &p.h, x_at, k, &p.gu, Rows::new(f, 2 * f));
            }
        }
    }
    moe::swiglu(gpu, pass, &p.gu, &p.act, f, m as u32 * k, c.clamp_exp[l]);
    for ch in pool.chunks_of(l) {
        matmul::experts(gpu, pass, ch, layout.down, tiles, &p.groups, list_at, max_tiles, &p.act, Rows::new(0, f), 1, &p.experts_out, Rows::new(0, hidden));
    }
    Ok(())
}

/// A streamed MoE layer after its span is routed: reads the selections back (one sync), then brings the distinct
/// experts into the pool in waves of at most the pool's slots (those already resident first), each read once,
/// and after each wave adds its experts' weighted outputs to the tokens that selected them.
async fn stream_layer(s: &Span<'_>, pool: &mut ExpertPool, cache: &mut ExpertCache, reader: &dyn RecordReader, stats: &mut CacheStats, chunks: &[(usize, usize)], l: usize) -> Result<(), String> {
    let (gpu, c, p) = (s.gpu, s.config, s.scratch);
    let (k, hidden) = (c.n_expert_used, c.hidden as u32);
    let words = moe::selection_words(k as u32);
    let n: usize = chunks.iter().map(|ch| ch.1).sum();
    let began = now_s();
    let bytes = gpu.read_back(&p.sel, (n * words * 4) as u64).await.map_err(|e| e.0)?;
    stats.wait_s += now_s() - began;
    stats.syncs += 1;
    let all: Vec<u32> = bytemuck::pod_collect_to_vec(&bytes[..n * words * 4]);
    let ids: Vec<&[u32]> = all.chunks(words).map(|w| &w[..k]).collect();
    if let Some(bad) = ids.iter().flat_map(|t| t.iter()).find(|&&e| e >= pool.n_expert) {
        return Err(format!("layer {l}: the router selected expert {bad} of {} (a GPU fault?)", pool.n_expert));
    }
    let mut distinct: Vec<u32> = ids.iter().flat_map(|t| t.iter().copied()).collect();
    distinct.sort_unstable();
    distinct.dedup();
    // the experts already in the pool first: they need no read, and a wave of them pins them before any eviction
    let (mut order, missing): (Vec<u32>, Vec<u32>) = distinct.iter().partition(|&&e| cache.slot(l, e).is_some());
    order.extend(missing);
    let n_slots = cache.n_slots() as usize;
    for wave in order.chunks(n_slots) {
        let mut in_wave = vec![false; pool.n_expert as usize];
        wave.iter().for_each(|&e| in_wave[e as usize] = true);
        let plan = cache.plan(l, wave);
        let misses = plan.fills.len() as u64;
        let pairs = ids.iter().flat_map(|t| t.iter()).filter(|&&e| in_wave[e as usize]).count() as u64;
        stats.hits += pairs - misses;
        stats.misses += misses;
        stats.layer_hits[l] += pairs - misses;
        stats.layer_misses[l] += misses;
        fill(gpu, pool, cache, reader, stats, &plan.fills, l, k).await?;
        let mut table = vec![NONE; pool.n_expert as usize];
        for (&e, &slot) in wave.iter().zip(&plan.slots) {
            table[e as usize] = slot;
        }
        gpu.queue.write_buffer(&p.wave_slots, 0, bytemuck::cast_slice(&table));
        let mut pass = Pass::new();
        for &(c0, m) in chunks {
            if !ids[c0..c0 + m].iter().any(|t| t.iter().any(|&e| in_wave[e as usize])) {
                continue;
            }
            experts_chunk(gpu, &mut pass, c, p, pool, &p.wave_slots, 0, c0, m, l)?;
            let at = (c0 * c.hidden) as u32;
            moe::accumulate_wave(gpu, &mut pass, &p.experts_out, &p.sel, sel_offset(c, c0), &p.wave_slots, 0, &p.x, at, hidden, k as u32, m as u32);
        }
        pass.submit(gpu);
        stats.submits += 1;
    }
    Ok(())
}

/// Reads the records of `fills` (k at a time, the staging ring's batch) into their slots and maps them. On a
/// failure the slots not filled yet are forgotten by the cache (the ones filled stay mapped and valid).
#[allow(clippy::too_many_arguments)]
async fn fill(gpu: &Gpu, pool: &mut ExpertPool, cache: &mut ExpertCache, reader: &dyn RecordReader, stats: &mut CacheStats, fills: &[super::cache::Fill], l: usize, k: usize) -> Result<(), String> {
    for fill in fills {
        if let Some(old) = fill.evicted {
            pool.map(gpu, (old / pool.n_expert) as usize, old % pool.n_expert, NONE);
            stats.evictions += 1;
            stats.bytes_uploaded += 4;
        }
    }
    let batch = k.max(1);
    for (i, part) in fills.chunks(batch).enumerate() {
        if let Err(e) = fill_part(gpu, pool, reader, stats, part, l).await {
            for f in &fills[i * batch..] {
                cache.forget(f.slot);
            }
            return Err(e);
        }
    }
    Ok(())
}

async fn fill_part(gpu: &Gpu, pool: &mut ExpertPool, reader: &dyn RecordReader, stats: &mut CacheStats, part: &[super::cache::Fill], l: usize) -> Result<(), String> {
    let wanted: Vec<u32> = part.iter().map(|f| f.expert).collect();
    let began = now_s();
    let records = reader.read(l, &wanted).await.map_err(|e| format!("reading experts of layer {l}: {e}"))?;
    stats.read_s += now_s() - began;
    let began = now_s();
    let slots: Vec<(u32, &[u8])> = part.iter().zip(&records).map(|(f, r)| (f.slot, r.as_slice())).collect();
    pool.fill_batch(gpu, &slots).await?;
    for (f, record) in part.iter().zip(&records) {
        stats.bytes_read += record.len() as u64;
        stats.bytes_uploaded += record.len() as u64 + 4;
        pool.map(gpu, l, f.expert, f.slot);
    }
    stats.upload_s += now_s() - began;
    Ok(())
}
