//! One decode step recorded as GPU dispatches, in llama.cpp's order (bailingmoe3.cpp):
//!   x = embed(token)
//!   per layer: h = RMSNorm(x)·attn_norm; x += KDA(h) or MLA(h)
//!              h = RMSNorm(x)·ffn_norm;  x += dense SwiGLU(h), or routed experts(h) + shared expert(h)
//!   logits = output · (RMSNorm(x)·output_norm)
//! Routing stays on the GPU: the router writes the selection, the expert kernels look the selected experts
//! up in the pool's slot table, so with every expert resident a step needs no readback until its logits.
//! When experts are streamed, each MoE layer's selection comes back so the cache can fill the misses first.

use super::cache::{CacheStats, ExpertCache, NONE};
use super::pool::{ExpertPool, RecordReader};
use crate::clock::now_s;
use super::weights::{self, GpuTensor, Inputs, Weights};
use crate::gpu::matvec::{self, Matrix, Strided};
use crate::gpu::{dequant, kda, mla, moe, norm, Gpu, Pass};
use crate::model::{Attention, Config};

/// Per-layer state that outlives a step.
pub(super) enum LayerState {
    /// `consts`: the conv taps of q|k|v side by side, then dt_bias, ssm_a and ssm_norm ([`kda::StepLayout`]).
    Kda { conv: wgpu::Buffer, recurrent: wgpu::Buffer, consts: wgpu::Buffer },
    Mla { cache: wgpu::Buffer },
}

/// Every GPU buffer a step uses: per-layer states, then scratch vectors reused by every layer.
pub struct State {
    pub(super) layers: Vec<LayerState>,
    pub vocab: usize,
    x: wgpu::Buffer,
    pub(super) h: wgpu::Buffer,
    ffn_out: wgpu::Buffer,
    // KDA
    /// the projections of h: q|k|v (pre-conv), f_a, β logits, the output gate ([`weights::kda_input_offsets`])
    kda_in: wgpu::Buffer,
    o_normed: wgpu::Buffer,
    // MLA
    /// the projections of h: q, the latent kv, the head gate's logits ([`weights::mla_input_offsets`])
    mla_in: wgpu::Buffer,
    q_abs: wgpu::Buffer,
    latent_mix: wgpu::Buffer,
    /// attention's split partials (flash-decoding)
    /// the split attention's partials, or a long context's scores ([`mla::decode_by_products`])
    attn_scratch: wgpu::Buffer,
    /// the decode step's value product in column slices, before they are summed
    attn_slices: wgpu::Buffer,
    heads_out: wgpu::Buffer,
    // FFN
    gu: wgpu::Buffer,
    act: wgpu::Buffer,
    router_logits: wgpu::Buffer,
    /// each MoE layer's router output (kept per layer so its routing margins can be read after a step)
    pub sel: Vec<Option<wgpu::Buffer>>,
    /// the selected experts' outputs, then a riding shared expert's
    experts_out: wgpu::Buffer,
    shared_gu: wgpu::Buffer,
    shared_act: wgpu::Buffer,
    pub logits: wgpu::Buffer,
    pub argmax: wgpu::Buffer,
    /// Two mappable copies of the greedy pick, so that one step's pick can be read while the next step (run ahead
    /// on it) writes its own ([`Engine::next_greedy`](super::Engine::next_greedy)).
    pub picks: [wgpu::Buffer; 2],
    /// GPU bytes of all of the above.
    pub bytes: u64,
}

/// Bytes of a greedy pick as [`norm::argmax`] leaves it: the token id, then the maximum's bits.
pub(super) const PICK_BYTES: u64 = 8;

fn floats(gpu: &Gpu, label: &str, n: usize) -> wgpu::Buffer {
    gpu.storage_buffer(label, (n.max(1) * 4) as u64)
}

/// The widest FFN activation a step holds: a dense FFN's, a shared expert's, or the selected experts' and a shared
/// expert riding with them (one more expert's).
fn ff_max(c: &Config) -> usize {
    c.ff_dense.max(c.ff_shared).max((c.n_expert_used + 1) * c.ff_expert)
}

/// Bytes of a buffer of `n` floats, as [`floats`] makes it.
fn float_bytes(n: usize) -> u64 {
    (n.max(1) * 4) as u64
}

impl State {
    /// GPU bytes [`State::new`] allocates for `n_ctx` tokens and a vocabulary of `vocab` (known before any
    /// allocation, so a context too large for the device or budget is refused first), and the largest
    /// per-layer cache among them (one buffer, bound whole by the MLA kernels).
    pub fn bytes_needed(c: &Config, n_ctx: usize, vocab: usize) -> (u64, u64) {
        let (h, d_kda, nh) = (c.hidden, c.kda_dim(), c.n_head);
        let latent = c.kv_lora_rank + c.rope_dim;
        let mut total = 0;
        let mut largest_cache = 0;
        for kind in &c.attention {
            match kind {
                Attention::Kda => {
                    total += float_bytes(3 * d_kda * (c.conv_kernel - 1)) + float_bytes(nh * c.kda_head_dim * c.kda_head_dim) + float_bytes(kda_layout(c).consts_floats() as usize);
                }
                Attention::Mla => {
                    let cache = float_bytes(mla::cache_rows(n_ctx) * latent);
                    largest_cache = largest_cache.max(cache);
                    total += cache;
                }
            }
        }
        let k = c.n_expert_used;
        let ff_max = ff_max(c);
        let scratch = [
            h, h, h, weights::kda_inputs_floats(c), d_kda,
            weights::mla_inputs_floats(c), nh * latent, nh * c.kv_lora_rank, mla::decode_scratch_floats(nh, c.kv_lora_rank, n_ctx), mla::value_slice_floats(nh, c.kv_lora_rank), nh * c.value_length_mla,
            2 * ff_max, ff_max, c.n_expert, (k + 1) * h, 2 * c.ff_shared, c.ff_shared, vocab,
        ];
        total += scratch.iter().map(|&n| float_bytes(n)).sum::<u64>() + norm::ARGMAX_BYTES + 2 * PICK_BYTES;
        let selection = (moe::selection_words(k as u32) as u64 * 4).max(4).next_multiple_of(4);
        total += (0..c.n_layer).filter(|&l| c.is_moe_layer(l)).count() as u64 * selection;
        (total, largest_cache)
    }

    pub fn new(gpu: &Gpu, c: &Config, weights: &Weights, n_ctx: usize) -> Result<State, String> {
        let (h, d_kda, nh) = (c.hidden, c.kda_dim(), c.n_head);
        let k_conv = c.conv_kernel;
        let mut layers = Vec::with_capacity(c.n_layer);
        for (l, kind) in c.attention.iter().enumerate() {
            layers.push(match kind {
                Attention::Kda => {
                    // the q, k and v conv taps side by side, as one 3·D-channel conv, then the vectors the
                    // decode step's kda_step reads beside them (one binding for all)
                    let f32_of = |name: &str, floats: usize| -> Result<&GpuTensor, String> {
                        let t = weights.get(&format!("blk.{l}.{name}"))?;
                        if t.ty != crate::quant::GgmlType::F32 || t.dims.iter().product::<u64>() != floats as u64 {
                            return Err(format!("{}: expected {floats} F32 values", t.name));
                        }
                        Ok(t)
                    };
                    let mut parts = Vec::new();
                    for which in ["q", "k", "v"] {
                        let t = f32_of(&format!("ssm_conv1d_{which}.weight"), d_kda * k_conv)?;
                        if t.dims[0] as usize != k_conv {
                            return Err(format!("{}: expected F32 conv taps of width {k_conv}", t.name));
                        }
                        parts.push(t);
                    }
                    parts.extend([f32_of("ssm_dt.bias", d_kda)?, f32_of("ssm_a", nh)?, f32_of("ssm_norm.weight", c.kda_head_dim)?]);
                    let consts = floats(gpu, "KDA constants", kda_layout(c).consts_floats() as usize);
                    let mut encoder = gpu.device.create_command_encoder(&Default::default());
                    let mut at = 0;
                    for t in parts {
                        let bytes = t.dims.iter().product::<u64>() * 4;
                        encoder.copy_buffer_to_buffer(t.whole(), 0, &consts, at, bytes);
                        at += bytes;
                    }
                    gpu.queue.submit([encoder.finish()]);
                    LayerState::Kda {
                        conv: floats(gpu, "conv state", 3 * d_kda * (k_conv - 1)),
                        recurrent: floats(gpu, "KDA state", nh * c.kda_head_dim * c.kda_head_dim),
                        consts,
                    }
                }
                Attention::Mla => {
                    let rows = mla::cache_rows(n_ctx);
                    let bytes = (rows * (c.kv_lora_rank + c.rope_dim) * 4) as u64;
                    let limit = gpu.device.limits().max_storage_buffer_binding_size as u64;
                    if bytes > limit {
                        return Err(format!(
                            "an MLA cache of {n_ctx} tokens needs {bytes} bytes, above the adapter's maxStorageBufferBindingSize {limit}: use a shorter context"
                        ));
                    }
                    LayerState::Mla { cache: floats(gpu, "MLA cache", rows * (c.kv_lora_rank + c.rope_dim)) }
                }
            });
        }
        let vocab = weights.get("output.weight").or_else(|_| weights.get("token_embd.weight"))?.n_rows() as usize;
        let latent = c.kv_lora_rank + c.rope_dim;
        let k = c.n_expert_used;
        let ff_max = ff_max(c);
        let state = State {
            layers,
            vocab,
            x: floats(gpu, "x", h),
            h: floats(gpu, "h", h),
            ffn_out: floats(gpu, "ffn out", h),
            kda_in: floats(gpu, "KDA projections", weights::kda_inputs_floats(c)),
            o_normed: floats(gpu, "o normed", d_kda),
            mla_in: floats(gpu, "MLA projections", weights::mla_inputs_floats(c)),
            q_abs: floats(gpu, "q absorbed", nh * latent),
            latent_mix: floats(gpu, "latent mix", nh * c.kv_lora_rank),
            attn_scratch: floats(gpu, "attention partials or scores", mla::decode_scratch_floats(nh, c.kv_lora_rank, n_ctx)),
            attn_slices: floats(gpu, "attention value slices", mla::value_slice_floats(nh, c.kv_lora_rank)),
            heads_out: floats(gpu, "heads out", nh * c.value_length_mla),
            gu: floats(gpu, "gate|up", 2 * ff_max),
            act: floats(gpu, "act", ff_max),
            router_logits: floats(gpu, "router", c.n_expert),
            sel: (0..c.n_layer).map(|l| c.is_moe_layer(l).then(|| gpu.storage_buffer("selection", moe::selection_words(k as u32) as u64 * 4))).collect(),
            experts_out: floats(gpu, "experts out", (k + 1) * h),
            shared_gu: floats(gpu, "shared gate|up", 2 * c.ff_shared),
            shared_act: floats(gpu, "shared act", c.ff_shared),
            logits: floats(gpu, "logits", vocab),
            argmax: gpu.storage_buffer("argmax", norm::ARGMAX_BYTES),
            picks: [gpu.mappable_buffer("pick", PICK_BYTES), gpu.mappable_buffer("pick", PICK_BYTES)],
            bytes: 0,
        };
        let mut state = state;
        state.bytes = state.buffers().map(|b| b.size()).sum();
        debug_assert_eq!(state.bytes, Self::bytes_needed(c, n_ctx, vocab).0, "State::bytes_needed disagrees with State::new");
        state.clear(gpu);
        Ok(state)
    }

    fn buffers(&self) -> impl Iterator<Item = &wgpu::Buffer> {
        let layers = self.layers.iter().flat_map(|l| match l {
            LayerState::Kda { conv, recurrent, consts } => vec![conv, recurrent, consts],
            LayerState::Mla { cache } => vec![cache],
        });
        let scratch = [
            &self.x, &self.h, &self.ffn_out, &self.kda_in,
            &self.o_normed, &self.mla_in, &self.q_abs, &self.latent_mix, &self.attn_scratch, &self.attn_slices, &self.heads_out, &self.gu, &self.act,
            &self.router_logits, &self.experts_out, &self.shared_gu, &self.shared_act, &self.logits, &self.argmax, &self.picks[0], &self.picks[1],
        ];
        layers.chain(scratch).chain(self.sel.iter().flatten())
    }

    /// Zeroes the recurrent and conv states.
    pub fn clear(&self, gpu: &Gpu) {
        let mut encoder = gpu.device.create_command_encoder(&Default::default());
        for layer in &self.layers {
            if let LayerState::Kda { conv, recurrent, .. } = layer {
                encoder.clear_buffer(conv, 0, None);
                encoder.clear_buffer(recurrent, 0, None);
            }
        }
        gpu.queue.submit([encoder.finish()]);
    }
}

/// How the routed experts reach the pool: all resident (the slot table never changes, no readback), or
/// streamed (per MoE layer the selection comes back, the cache maps it to slots and misses are filled).
pub enum Experts {
    Resident,
    Streaming { cache: ExpertCache, reader: Box<dyn RecordReader> },
}

/// Layers recorded per submission of a decode step (0: the whole step in one). Submitting every few layers
/// lets the GPU start on them while the CPU records the rest (recording and encoding a dispatch costs the CPU
/// about as much as running it costs the GPU); each submission costs its own overhead. 2 was as fast as 1 and
/// 19 % faster than one submission per step on the H100 (4 layers at Flash's widths).
static LAYERS_PER_SUBMIT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(2);

/// Sets [`LAYERS_PER_SUBMIT`] (`lingtab bench --layers-per-submit N`, to compare).
pub fn set_layers_per_submit(layers: usize) {
    LAYERS_PER_SUBMIT.store(layers, std::sync::atomic::Ordering::Relaxed);
}

/// The token a step embeds.
#[derive(Clone, Copy, Debug)]
pub enum StepToken {
    Id(u32),
    /// The greedy pick of the step before, read from `state.argmax` on the GPU: a step run before that pick has
    /// come back to the CPU.
    LastPick,
}

/// Runs the step for `token` at position `pos`; logits land in `state.logits`, the greedy pick in
/// `state.argmax` (and, with `pick_to`, in `state.picks[pick_to]` too). Resident experts: one submission, no
/// readback. Streamed experts: one readback per MoE layer. Returns the last submission.
#[allow(clippy::too_many_arguments)]
pub async fn run_step(gpu: &Gpu, c: &Config, w: &Weights, pool: &mut ExpertPool, s: &State, experts: &mut Experts, stats: &mut CacheStats, token: StepToken, pos: u32, pick_to: Option<usize>) -> Result<wgpu::SubmissionIndex, String> {
    let mut pass = Pass::new();
    let hidden = c.hidden as u32;
    let eps = c.rms_eps;

    let embd = w.get("token_embd.weight")?;
    match token {
        StepToken::Id(token) => {
            let (piece, offset) = embd.row(token as u64);
            dequant::record(gpu, &mut pass, &piece.buffer, embd.ty, offset, hidden, &s.x, 0);
        }
        // the pick is the first word of the argmax; each piece of the table writes the row if it holds it
        StepToken::LastPick => {
            for piece in &embd.pieces {
                dequant::record_rows(gpu, &mut pass, &piece.buffer, embd.ty, embd.row_bytes(), piece.first_row, piece.rows, &s.argmax, 1, hidden, &s.x, 0);
            }
        }
    }

    let every = LAYERS_PER_SUBMIT.load(std::sync::atomic::Ordering::Relaxed);
    // true when the MoE layer before has left this layer's attention input in h (the residual add and the
    // norm after it in one dispatch)
    let mut normed = false;
    for l in 0..c.n_layer {
        if every > 0 && l > 0 && l % every == 0 && !pass.is_empty() {
            std::mem::take(&mut pass).submit(gpu);
            stats.submits += 1;
        }
        let t = |name: &str| w.get(&format!("blk.{l}.{name}"));
        let p = &mut pass;
        if !std::mem::take(&mut normed) {
            norm::rms_norm(gpu, p, &s.x, 0, t("attn_norm.weight")?.whole(), &s.h, 0, hidden, eps);
        }
        match &s.layers[l] {
            LayerState::Kda { conv, recurrent, consts } => kda_layer(gpu, p, c, w, l, s, conv, recurrent, consts)?,
            LayerState::Mla { cache } => mla_layer(gpu, p, c, w, l, s, cache, pos)?,
        }

        let ffn_norm = t("ffn_norm.weight")?.whole();
        if c.is_moe_layer(l) {
            let sel = s.sel[l].as_ref().expect("MoE layers have a selection buffer");
            moe_route(gpu, p, c, &t, s, ffn_norm, sel)?;
            match experts {
                Experts::Resident => {
                    stats.hits += c.n_expert_used as u64;
                    stats.layer_hits[l] += c.n_expert_used as u64;
                }
                Experts::Streaming { cache, reader } => {
                    std::mem::take(&mut pass).submit(gpu);
                    stats.submits += 1;
                    serve_layer(gpu, c, pool, cache, reader.as_ref(), sel, l, stats).await?;
                }
            }
            let next_norm = if l + 1 < c.n_layer { w.get(&format!("blk.{}.attn_norm.weight", l + 1))? } else { w.get("output_norm.weight")? };
            normed = moe_experts(gpu, &mut pass, c, w, s, pool, sel, l, next_norm.whole())?;
        } else {
            let f = c.ff_dense as u32;
            norm::rms_norm(gpu, p, &s.x, 0, ffn_norm, &s.h, 0, hidden, eps);
            w.products(gpu, p, l, Inputs::Swiglu, &s.h, &s.gu)?;
            down_of_swiglu(gpu, p, t("ffn_down.weight")?, &s.gu, f, c.clamp_shexp[l], &s.act, &s.x, true);
        }
    }
    let p = &mut pass;
    if !normed {
        norm::rms_norm(gpu, p, &s.x, 0, w.get("output_norm.weight")?.whole(), &s.h, 0, hidden, eps);
    }
    w.get("output.weight").or_else(|_| w.get("token_embd.weight"))?.matvec(gpu, p, &s.h, 0, &s.logits, 0);
    norm::argmax(gpu, p, &s.logits, s.vocab as u32, &s.argmax);
    let submitted = pass.submit_then_copy(gpu, pick_to.map(|i| (&s.argmax, &s.picks[i], PICK_BYTES)));
    stats.submits += 1;
    if let Experts::Streaming { cache, .. } = experts {
        cache.end_token();
    }
    Ok(submitted)
}

/// Brings layer `l`'s selected experts into the pool: reads the selection back, maps it to slots, reads the
/// misses' records and queues their upload and slot-table entries (they land before the next submission).
#[allow(clippy::too_many_arguments)]
async fn serve_layer(gpu: &Gpu, c: &Config, pool: &mut ExpertPool, cache: &mut ExpertCache, reader: &dyn RecordReader, sel: &wgpu::Buffer, l: usize, stats: &mut CacheStats) -> Result<(), String> {
    let k = c.n_expert_used;
    let began = now_s();
    let words = gpu.read_back(sel, k as u64 * 4).await.map_err(|e| e.0)?;
    stats.wait_s += now_s() - began;
    stats.syncs += 1;
    let ids: Vec<u32> = bytemuck::pod_collect_to_vec(&words[..k * 4]);
    if let Some(bad) = ids.iter().find(|&&e| e >= pool.n_expert) {
        return Err(format!("layer {l}: the router selected expert {bad} of {} (a GPU fault?)", pool.n_expert));
    }
    let plan = cache.plan(l, &ids);
    let misses = plan.fills.len() as u64;
    stats.hits += k as u64 - misses;
    stats.misses += misses;
    stats.layer_hits[l] += k as u64 - misses;
    stats.layer_misses[l] += misses;
    if plan.fills.is_empty() {
        return Ok(());
    }
    let wanted: Vec<u32> = plan.fills.iter().map(|f| f.expert).collect();
    let began = now_s();
    let records = match reader.read(l, &wanted).await {
        Ok(r) => r,
        Err(e) => {
            for f in &plan.fills {
                cache.forget(f.slot);
            }
            return Err(format!("reading experts of layer {l}: {e}"));
        }
    };
    stats.read_s += now_s() - began;
    let began = now_s();
    for fill in &plan.fills {
        if let Some(old) = fill.evicted {
            pool.map(gpu, (old / pool.n_expert) as usize, old % pool.n_expert, NONE);
            stats.evictions += 1;
            stats.bytes_uploaded += 4;
        }
    }
    let batch: Vec<(u32, &[u8])> = plan.fills.iter().zip(&records).map(|(f, r)| (f.slot, r.as_slice())).collect();
    if let Err(e) = pool.fill_batch(gpu, &batch).await {
        for f in &plan.fills {
            cache.forget(f.slot);
        }
        return Err(e);
    }
    for (fill, record) in plan.fills.iter().zip(&records) {
        stats.bytes_read += record.len() as u64;
        stats.bytes_uploaded += record.len() as u64 + 4;
        pool.map(gpu, l, fill.expert, fill.slot);
    }
    stats.upload_s += now_s() - began;
    Ok(())
}

pub(super) type TensorOf<'a> = dyn Fn(&str) -> Result<&'a GpuTensor, String> + 'a;

#[allow(clippy::too_many_arguments)]
fn kda_layer(gpu: &Gpu, p: &mut Pass, c: &Config, w: &Weights, l: usize, s: &State, conv: &wgpu::Buffer, recurrent: &wgpu::Buffer, consts: &wgpu::Buffer) -> Result<(), String> {
    let t = |name: &str| w.get(&format!("blk.{l}.{name}"));
    // q, k, v, f_a, β and g_a all read h: one dispatch per stack of them (weights::kda_input_offsets says
    // where each lands in kda_in), then the conv, gates, delta rule and output norm in one more
    w.products(gpu, p, l, Inputs::Attention, &s.h, &s.kda_in)?;
    kda::step(gpu, p, &s.kda_in, consts, conv, recurrent, &s.o_normed, kda_layout(c), c.gate_lower_bound, c.rms_eps);
    // the residual: x += W_o·o
    t("attn_output.weight")?.matvec_add(gpu, p, &s.o_normed, 0, &s.x, 0);
    Ok(())
}

/// Where kda_step finds its inputs: in `kda_in` as [`weights::kda_input_offsets`] lays it out.
fn kda_layout(c: &Config) -> kda::StepLayout {
    let (fa_at, beta_at, z_at) = weights::kda_input_offsets(c);
    kda::StepLayout { n_head: c.n_head as u32, head_dim: c.kda_head_dim as u32, kernel_size: c.conv_kernel as u32, fa_at, beta_at, z_at }
}

#[allow(clippy::too_many_arguments)]
fn mla_layer(gpu: &Gpu, p: &mut Pass, c: &Config, w: &Weights, l: usize, s: &State, cache: &wgpu::Buffer, pos: u32) -> Result<(), String> {
    let t = |name: &str| w.get(&format!("blk.{l}.{name}"));
    let (nh, rank, rope) = (c.n_head as u32, c.kv_lora_rank as u32, c.rope_dim as u32);
    let (d_qk, d_nope, d_v) = (c.key_length_mla as u32, c.d_nope() as u32, c.value_length_mla as u32);
    let latent = rank + rope;
    // q, kv and the gate logits all read h: one dispatch per stack (q at 0, then kv and the gate logits at
    // weights::mla_input_offsets)
    let (kv_at, gate_at) = weights::mla_input_offsets(c);
    w.products(gpu, p, l, Inputs::Attention, &s.h, &s.mla_in)?;
    // the cache row and the query's RoPE part (q_abs rows' tails) in one dispatch
    mla::kv_row_and_rope_q(gpu, p, &s.mla_in, kv_at, t("attn_kv_a_norm.weight")?.whole(), cache, &s.q_abs, pos, nh, d_nope, rank, rope, c.rms_eps, c.rope_freq_base);
    // absorbed query: q̃_h = W_kb,h · q_nope,h (per head: R rows of d_nope), written into q_abs row h
    let kb = t("attn_k_b.weight")?;
    let kb_m = Matrix { ty: kb.ty, rows: rank, cols: d_nope, byte_offset: 0 };
    let kb_stride = rank as u64 * kb_m.row_bytes() as u64;
    matvec::batched(gpu, p, kb.whole(), kb_m, kb_stride, &s.mla_in, Strided { offset: 0, stride: d_qk }, &s.q_abs, Strided { offset: 0, stride: latent }, nh);
    // the attention's value product in column slices leaves them unsummed: the value product below adds them
    let slices = if mla::decode_by_products(pos + 1) && !gpu.cpu_kernels() {
        mla::decode_attention_by_products(gpu, p, &s.q_abs, cache, &s.attn_scratch, &s.attn_slices, &s.latent_mix, pos, nh, rank, rope, d_qk)
    } else {
        mla::attention(gpu, p, &s.q_abs, cache, &s.attn_scratch, &s.latent_mix, pos, nh, rank, rope, d_qk);
        None
    };
    // o_h = σ(gate_h) · W_vb,h · (latent mix)_h (per head: d_v rows of R), the head-wise gate in the same dispatch
    let vb = t("attn_v_b.weight")?;
    let vb_m = Matrix { ty: vb.ty, rows: d_v, cols: rank, byte_offset: 0 };
    let vb_stride = d_v as u64 * vb_m.row_bytes() as u64;
    let latent = if slices.is_some() { &s.attn_slices } else { &s.latent_mix };
    let gate = matvec::Gate { logits: &s.mla_in, at: gate_at };
    matvec::batched_with(gpu, p, vb.whole(), vb_m, vb_stride, latent, Strided { offset: 0, stride: rank }, slices, Some(gate), &s.heads_out, Strided { offset: 0, stride: d_v }, nh);
    // the residual: x += W_o·o
    t("attn_output.weight")?.matvec_add(gpu, p, &s.heads_out, 0, &s.x, 0);
    Ok(())
}

/// An FFN's down product of its SwiGLU: `y (+)= down · a(gu)`, `gu` = [gate (ff) | up (ff)]. The product
/// computes the activations as it reads them where rows are short enough (one dispatch); otherwise they go
/// through `act` first.
#[allow(clippy::too_many_arguments)]
fn down_of_swiglu(gpu: &Gpu, p: &mut Pass, down: &GpuTensor, gu: &wgpu::Buffer, ff: u32, limit: f32, act: &wgpu::Buffer, y: &wgpu::Buffer, accumulate: bool) {
    if ff <= matvec::GLU_MAX_COLS {
        down.matvec_glu(gpu, p, gu, matvec::Glu { ff, limit }, y, accumulate);
    } else {
        moe::swiglu(gpu, p, gu, act, ff, 1, limit);
        if accumulate {
            down.matvec_add(gpu, p, act, 0, y, 0);
        } else {
            down.matvec(gpu, p, act, 0, y, 0);
        }
    }
}

/// The FFN's norm of x into h and the router's choice for it: the router's product computes the norm as it
/// reads x (and leaves it in h) where rows are short enough, a dispatch fewer.
#[allow(clippy::too_many_arguments)]
fn moe_route(gpu: &Gpu, p: &mut Pass, c: &Config, t: &TensorOf, s: &State, ffn_norm: &wgpu::Buffer, sel: &wgpu::Buffer) -> Result<(), String> {
    let router = t("ffn_gate_inp.weight")?;
    if c.hidden as u32 <= matvec::NORM_MAX_COLS {
        router.matvec_norm(gpu, p, &s.x, matvec::Norm { w: ffn_norm, eps: c.rms_eps, out: &s.h }, &s.router_logits, 0);
    } else {
        norm::rms_norm(gpu, p, &s.x, 0, ffn_norm, &s.h, 0, c.hidden as u32, c.rms_eps);
        router.matvec(gpu, p, &s.h, 0, &s.router_logits, 0);
    }
    let (k, groups, used) = (c.n_expert_used as u32, c.n_expert_group as u32, c.n_group_used as u32);
    moe::route(gpu, p, &s.router_logits, t("exp_probs_b.bias")?.whole(), sel, c.n_expert as u32, k, groups, used, c.expert_weights_norm, c.expert_weights_scale);
    Ok(())
}

/// The selected experts (read from their pool slots), the shared expert, and their sum added to `x`; where
/// rows are short enough, the same dispatch leaves `next_norm`'s RMSNorm of the new `x` in `h` (returns true).
/// A shared expert with a pool slot of its own rides with the selected experts, as one more batch of their
/// products (two dispatches fewer).
#[allow(clippy::too_many_arguments)]
fn moe_experts(gpu: &Gpu, p: &mut Pass, c: &Config, w: &Weights, s: &State, pool: &ExpertPool, sel: &wgpu::Buffer, l: usize, next_norm: &wgpu::Buffer) -> Result<bool, String> {
    let t = |name: &str| w.get(&format!("blk.{l}.{name}"));
    let (k, hidden) = (c.n_expert_used as u32, c.hidden as u32);
    let (f, fs) = (c.ff_expert as u32, c.ff_shared as u32);
    let layout = pool.layouts[l].ok_or_else(|| format!("layer {l} has no expert record layout"))?;
    let slot_base = l as u32 * pool.n_expert;
    let same_input = Strided { offset: 0, stride: 0 };
    let riding = pool.shared[l].map(|slot| matvec::SharedExpert { slot, glu_limit: c.clamp_shexp[l] });
    // the products of the selected experts, and of the shared expert where it rides (batch k, after them)
    let products = |p: &mut Pass, ch, m, x: &wgpu::Buffer, x_at, glu, y: &wgpu::Buffer, y_at| matvec::experts_and_shared(gpu, p, ch, m, sel, &pool.table, slot_base, k, riding, x, x_at, glu, y, y_at);
    for ch in pool.chunks_of(l) {
        match layout.gate_up_fused() {
            Some(gate_up) => products(p, ch, gate_up, &s.h, same_input, None, &s.gu, Strided { offset: 0, stride: 2 * f }),
            None => {
                products(p, ch, layout.gate, &s.h, same_input, None, &s.gu, Strided { offset: 0, stride: 2 * f });
                products(p, ch, layout.up, &s.h, same_input, None, &s.gu, Strided { offset: f, stride: 2 * f });
            }
        }
    }
    // the experts' down products compute their SwiGLU activations as they read them, where rows are short
    // enough (a dispatch fewer); otherwise the activations first
    let glu = (f <= matvec::GLU_MAX_COLS).then_some(matvec::Glu { ff: f, limit: c.clamp_exp[l] });
    if glu.is_none() {
        moe::swiglu(gpu, p, &s.gu, &s.act, f, k, c.clamp_exp[l]);
    }
    for ch in pool.chunks_of(l) {
        let out = Strided { offset: 0, stride: hidden };
        match glu {
            Some(glu) => products(p, ch, layout.down, &s.gu, Strided { offset: 0, stride: 2 * f }, Some(glu), &s.experts_out, out),
            None => products(p, ch, layout.down, &s.act, Strided { offset: 0, stride: f }, None, &s.experts_out, out),
        }
    }
    if riding.is_some() {
        // (the pool rides a shared expert only where the activations are the products' and the sum is fused)
        debug_assert!(glu.is_some() && hidden <= norm::SUM_NORM_MAX);
        norm::moe_sum_norm(gpu, p, &s.experts_out, sel, &s.experts_out, k * hidden, k, &s.x, next_norm, &s.h, hidden, c.rms_eps);
        return Ok(true);
    }
    // the shared expert
    w.products(gpu, p, l, Inputs::Swiglu, &s.h, &s.shared_gu)?;
    down_of_swiglu(gpu, p, t("ffn_down_shexp.weight")?, &s.shared_gu, fs, c.clamp_shexp[l], &s.shared_act, &s.ffn_out, false);
    if hidden <= norm::SUM_NORM_MAX {
        norm::moe_sum_norm(gpu, p, &s.experts_out, sel, &s.ffn_out, 0, k, &s.x, next_norm, &s.h, hidden, c.rms_eps);
        return Ok(true);
    }
    moe::accumulate(gpu, p, &s.experts_out, sel, &s.ffn_out, &s.x, hidden, k);
    Ok(false)
}
