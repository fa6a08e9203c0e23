//! `make-tiny`: deterministic small `bailingmoe3` models with the real model's structure (2 dense lead layers,
//! MLA every 6th layer via the per-layer `head_count_kv` array, grouped sigmoid routing with `exp_probs_b`, a
//! shared expert, SwiGLU clamps on some layers, an MTP block, Q4_K_M's tensor types) and a real byte-level BPE
//! vocabulary trained by [`bpe_train`] on [`corpus`]. The demo and the tests run on these models.

pub mod bpe_train;
pub mod corpus;
mod rng;

use crate::gguf::{GgufError, GgufWriter, PartPlan, Value, ValueType};
use crate::quant::{self, GgmlType};
use rng::{hash_name, Rng};

/// The shape of a generated model. `tiny()` mirrors the shared tiny-ling fixture; `flash()` has Ling 3.0
/// Flash's real widths (for benchmarks) with fewer layers.
#[derive(Clone, Debug, PartialEq)]
pub struct TinyOptions {
    pub seed: u64,
    pub name: String,
    /// Trunk layers (MTP blocks come on top).
    pub layers: usize,
    pub mtp_layers: usize,
    pub hidden: usize,
    pub heads: usize,
    pub kda_head_dim: usize,
    pub kv_lora_rank: usize,
    pub rope_dim: usize,
    pub qk_nope_dim: usize,
    pub v_head_dim: usize,
    /// MLA layer period: layer l is MLA when (l+1) % period == 0 or l ≥ ⌊L/period⌋·period (HF's rule).
    pub mla_period: usize,
    pub dense_lead: usize,
    pub ff_dense: usize,
    pub experts: usize,
    pub experts_used: usize,
    pub expert_groups: usize,
    pub groups_used: usize,
    pub ff_expert: usize,
    pub ff_shared: usize,
    /// Total vocabulary, special tokens included; BPE merges fill what the corpus supports, reserved tokens pad.
    pub vocab: usize,
    pub context_length: usize,
    pub parts: usize,
    /// Routing skew: 0 leaves `exp_probs_b` small and uniform; s > 0 adds s·ln(E/(1+rank))/ln(E) to each
    /// expert's bias (rank: a seeded shuffle per layer), so a few experts are hot, as real MoE routing is.
    pub expert_skew: f32,
    /// Big Q4_K/Q6_K tensors as random blocks of the same spread instead of quantised normal values: minutes
    /// faster at flash widths, for benchmarks (speed does not depend on the values).
    pub fast_weights: bool,
}

impl TinyOptions {
    pub fn tiny(seed: u64) -> TinyOptions {
        TinyOptions {
            seed,
            name: "lingtab-tiny".into(),
            layers: 7,
            mtp_layers: 1,
            hidden: 256,
            heads: 2,
            kda_head_dim: 128,
            kv_lora_rank: 512,
            rope_dim: 64,
            qk_nope_dim: 128,
            v_head_dim: 128,
            mla_period: 6,
            dense_lead: 2,
            ff_dense: 512,
            experts: 32,
            experts_used: 4,
            expert_groups: 8,
            groups_used: 4,
            ff_expert: 256,
            ff_shared: 256,
            vocab: 3584,
            context_length: 8192,
            parts: 2,
            expert_skew: 0.0,
            fast_weights: false,
        }
    }
    /// Ling 3.0 Flash widths: H 2560, 32×128 KDA heads, MLA 512+64, 512 experts of 768, top-8, vocab 157184.
    pub fn flash(seed: u64, layers: usize) -> TinyOptions {
        TinyOptions {
            name: "lingtab-flash".into(),
            layers,
            hidden: 2560,
            heads: 32,
            ff_dense: 6144,
            experts: 512,
            experts_used: 8,
            ff_expert: 768,
            ff_shared: 768,
            vocab: 157184,
            context_length: 262144,
            ..TinyOptions::tiny(seed)
        }
    }
    pub fn blocks(&self) -> usize {
        self.layers + self.mtp_layers
    }
    /// True when trunk layer `l` is MLA; MTP blocks are always MLA.
    pub fn is_mla(&self, l: usize) -> bool {
        let g = self.mla_period.max(1);
        l >= self.layers || (l + 1) % g == 0 || l >= (self.layers / g) * g
    }
    fn validate(&self) -> Result<(), String> {
        let ok = self.layers > 0
            && self.dense_lead <= self.layers
            && self.experts > 0
            && self.expert_groups > 0
            && self.experts % self.expert_groups == 0
            && self.groups_used >= 1
            && self.groups_used <= self.expert_groups
            && self.experts_used >= 1
            && self.experts_used <= self.groups_used * (self.experts / self.expert_groups)
            && self.rope_dim % 2 == 0
            && self.hidden % 32 == 0
            && self.parts >= 1;
        if ok { Ok(()) } else { Err(format!("inconsistent make-tiny geometry: {self:?}")) }
    }
    /// Per trunk layer SwiGLU limits (0 = none): the routed experts of the last two layers and the shared
    /// experts of the last three are clamped, like Flash's last layers; the MTP blocks are not.
    fn clamps(&self) -> (Vec<f32>, Vec<f32>) {
        let n = self.layers;
        let (mut exp, mut shexp) = (vec![0f32; self.blocks()], vec![0f32; self.blocks()]);
        for l in self.dense_lead..n {
            if l + 2 >= n {
                exp[l] = 1.5;
            }
            if l + 3 >= n {
                shexp[l] = if l + 1 == n { 2.5 } else { 1.75 };
            }
        }
        (exp, shexp)
    }
}

/// How a tensor's values are drawn.
#[derive(Clone, Copy, Debug)]
enum Init {
    /// N(0, gain / √fan_in), fan_in = row length.
    Normal { gain: f64 },
    /// 1 + 0.1·N(0, 1) (norm weights).
    NormWeight,
    Uniform { lo: f64, hi: f64 },
    /// 0.4·N(0, 1), plus 1 on the current-token tap (the last of each channel's taps).
    ConvTaps { kernel: usize },
    Gaussian { std: f64 },
    /// Gaussian plus the routing skew of [`TinyOptions::expert_skew`].
    SkewedBias { std: f64 },
}

struct Planned {
    ty: GgmlType,
    init: Init,
}

/// A model planned but not yet written: the GGUF writer (metadata + tensor table) and how to draw each tensor.
pub struct TinyModel {
    pub options: TinyOptions,
    pub writer: GgufWriter,
    plan: Vec<Planned>,
}

/// llama.cpp's `use_more_bits`: the layers Q4_K_M gives Q6_K for ffn_down and attn_v.
/// Tensors above this many values are generated in parallel chunks of [`CHUNK_VALUES`].
const BIG_TENSOR: u64 = 1 << 26;
const CHUNK_VALUES: u64 = 1 << 22;
/// With `fast_weights`, tensors from this many values on are random blocks (smaller ones, norms and routers
/// among them, keep their quantised values).
const FAST_MIN_VALUES: u64 = 1 << 20;

fn use_more_bits(i: usize, n: usize) -> bool {
    i < n / 8 || i >= 7 * n / 8 || (i as isize - (n / 8) as isize) % 3 == 2
}

/// The type Q4_K_M would choose, falling back like llama-quantize when rows are not whole super-blocks.
fn fit_type(preferred: GgmlType, row: usize) -> GgmlType {
    if row % preferred.block_elems() == 0 {
        return preferred;
    }
    let fallback = if preferred == GgmlType::Q6_K { GgmlType::Q8_0 } else { GgmlType::Q5_0 };
    if row % fallback.block_elems() == 0 { fallback } else { GgmlType::F32 }
}

impl TinyModel {
    pub fn plan(options: TinyOptions) -> Result<TinyModel, String> {
        options.validate()?;
        let o = &options;
        let (h, nh, d) = (o.hidden as u64, o.heads as u64, o.kda_head_dim as u64);
        let kda = nh * d;
        let (r, rope, nope, dv) = (o.kv_lora_rank as u64, o.rope_dim as u64, o.qk_nope_dim as u64, o.v_head_dim as u64);
        let (e, fe, fs, fd) = (o.experts as u64, o.ff_expert as u64, o.ff_shared as u64, o.ff_dense as u64);
        let vocab = bpe_vocab(o.vocab)?;
        let v = vocab.tokens.len() as u64;

        let mut w = GgufWriter::new();
        let arch = crate::model::config::ARCH;
        let key = |k: &str| format!("{arch}.{k}");
        let u32v = |x: usize| Value::U32(x as u32);
        let (clamp_exp, clamp_shexp) = o.clamps();
        let f32_array = |xs: &[f32]| Value::Array(ValueType::F32, xs.iter().map(|&x| Value::F32(x)).collect());
        w.set("general.architecture", Value::String(arch.into()));
        w.set("general.type", Value::String("model".into()));
        w.set("general.name", Value::String(format!("{} (seed {})", o.name, o.seed)));
        w.set("general.license", Value::String("mit".into()));
        w.set("general.file_type", Value::U32(15));
        w.set("general.quantization_version", Value::U32(2));
        w.set(&key("block_count"), u32v(o.blocks()));
        w.set(&key("context_length"), u32v(o.context_length));
        w.set(&key("embedding_length"), u32v(o.hidden));
        w.set(&key("feed_forward_length"), u32v(o.ff_dense));
        w.set(&key("attention.head_count"), u32v(o.heads));
        w.set(&key("attention.head_count_kv"), Value::Array(ValueType::U32, (0..o.blocks()).map(|l| Value::U32(o.is_mla(l) as u32)).collect()));
        w.set(&key("attention.layer_norm_rms_epsilon"), Value::F32(1e-6));
        w.set(&key("attention.kv_lora_rank"), u32v(o.kv_lora_rank));
        w.set(&key("attention.key_length"), u32v(o.kv_lora_rank + o.rope_dim));
        w.set(&key("attention.value_length"), u32v(o.kv_lora_rank));
        w.set(&key("attention.key_length_mla"), u32v(o.qk_nope_dim + o.rope_dim));
        w.set(&key("attention.value_length_mla"), u32v(o.v_head_dim));
        w.set(&key("rope.dimension_count"), u32v(o.rope_dim));
        w.set(&key("rope.freq_base"), Value::F32(6.0e6));
        w.set(&key("ssm.conv_kernel"), u32v(4));
        w.set(&key("kda.head_dim"), u32v(o.kda_head_dim));
        w.set(&key("kda.safe_gate"), Value::Bool(true));
        w.set(&key("kda.gate_lower_bound"), Value::F32(-5.0));
        w.set(&key("expert_count"), u32v(o.experts));
        w.set(&key("expert_used_count"), u32v(o.experts_used));
        w.set(&key("expert_group_count"), u32v(o.expert_groups));
        w.set(&key("expert_group_used_count"), u32v(o.groups_used));
        w.set(&key("expert_gating_func"), Value::U32(2));
        w.set(&key("expert_weights_norm"), Value::Bool(true));
        w.set(&key("expert_weights_scale"), Value::F32(2.5));
        w.set(&key("expert_feed_forward_length"), u32v(o.ff_expert));
        w.set(&key("expert_shared_feed_forward_length"), u32v(o.ff_shared));
        w.set(&key("expert_shared_count"), Value::U32(1));
        w.set(&key("leading_dense_block_count"), u32v(o.dense_lead));
        w.set(&key("nextn_predict_layers"), u32v(o.mtp_layers));
        w.set(&key("swiglu_clamp_exp"), f32_array(&clamp_exp));
        w.set(&key("swiglu_clamp_shexp"), f32_array(&clamp_shexp));
        w.set(&key("vocab_size"), Value::U32(v as u32));
        w.set("tokenizer.ggml.model", Value::String("gpt2".into()));
        w.set("tokenizer.ggml.pre", Value::String("bailingmoe2".into()));
        w.set("tokenizer.ggml.tokens", Value::Array(ValueType::String, vocab.tokens.iter().map(|t| Value::String(t.clone())).collect()));
        w.set("tokenizer.ggml.token_type", Value::Array(ValueType::I32, vocab.types.iter().map(|&t| Value::I32(t)).collect()));
        w.set("tokenizer.ggml.merges", Value::Array(ValueType::String, vocab.merges.iter().map(|m| Value::String(m.clone())).collect()));
        for (k, text) in [("bos", "<|startoftext|>"), ("eos", "<|role_end|>"), ("padding", "<|endoftext|>"), ("cls", "[CLS]")] {
            let id = vocab.tokens.iter().position(|t| t == text).expect("special tokens are always in the vocabulary");
            w.set(&format!("tokenizer.ggml.{k}_token_id"), Value::U32(id as u32));
        }
        w.set("tokenizer.ggml.add_bos_token", Value::Bool(false));
        w.set("tokenizer.ggml.add_eos_token", Value::Bool(false));

        // (name, dims, preferred type, init)
        let mut tensors: Vec<(String, Vec<u64>, GgmlType, Init)> = Vec::new();
        let q4 = GgmlType::Q4_K;
        let f32t = GgmlType::F32;
        let normal = |gain: f64| Init::Normal { gain };
        let residual = normal(0.25);
        tensors.push(("output.weight".into(), vec![h, v], GgmlType::Q6_K, normal(2.5)));
        tensors.push(("output_norm.weight".into(), vec![h], f32t, Init::NormWeight));
        tensors.push(("token_embd.weight".into(), vec![h, v], q4, Init::Gaussian { std: 1.0 }));
        let kda_layers: Vec<usize> = (0..o.blocks()).filter(|&l| !o.is_mla(l)).collect();
        for l in 0..o.blocks() {
            let more_bits = use_more_bits(l, o.blocks());
            let down_ty = if more_bits { GgmlType::Q6_K } else { q4 };
            let mut block: Vec<(&str, Vec<u64>, GgmlType, Init)> = vec![
                ("attn_norm.weight", vec![h], f32t, Init::NormWeight),
                ("ffn_norm.weight", vec![h], f32t, Init::NormWeight),
            ];
            if o.is_mla(l) {
                block.extend([
                    ("attn_q.weight", vec![h, nh * (nope + rope)], q4, normal(1.0)),
                    ("attn_kv_a_mqa.weight", vec![h, r + rope], q4, normal(1.0)),
                    ("attn_kv_a_norm.weight", vec![r], f32t, Init::NormWeight),
                    ("attn_k_b.weight", vec![nope, r, nh], q4, normal(1.0)),
                    ("attn_v_b.weight", vec![r, dv, nh], q4, normal(1.0)),
                    ("attn_gate.weight", vec![h, nh], q4, normal(1.0)),
                    ("attn_output.weight", vec![nh * dv, h], q4, residual),
                ]);
            } else {
                let wv = kda_layers.iter().position(|&k| k == l).unwrap();
                let v_ty = if use_more_bits(wv, kda_layers.len()) { GgmlType::Q6_K } else { q4 };
                block.extend([
                    ("attn_q.weight", vec![h, kda], q4, normal(1.0)),
                    ("attn_k.weight", vec![h, kda], q4, normal(1.0)),
                    ("attn_v.weight", vec![h, kda], v_ty, normal(1.0)),
                    ("ssm_conv1d_q.weight", vec![4, 1, kda, 1], f32t, Init::ConvTaps { kernel: 4 }),
                    ("ssm_conv1d_k.weight", vec![4, 1, kda, 1], f32t, Init::ConvTaps { kernel: 4 }),
                    ("ssm_conv1d_v.weight", vec![4, 1, kda, 1], f32t, Init::ConvTaps { kernel: 4 }),
                    ("ssm_f_a.weight", vec![h, kda], q4, normal(1.0)),
                    ("ssm_dt.bias", vec![kda], f32t, Init::Uniform { lo: -2.0, hi: 1.0 }),
                    ("ssm_a", vec![1, nh], f32t, Init::Uniform { lo: 0.5, hi: 3.0 }),
                    ("ssm_beta.weight", vec![h, nh], q4, normal(1.0)),
                    ("ssm_g_a.weight", vec![h, kda], q4, normal(1.0)),
                    ("ssm_norm.weight", vec![d], f32t, Init::NormWeight),
                    ("attn_output.weight", vec![kda, h], q4, residual),
                ]);
            }
            if l < o.dense_lead {
                block.extend([
                    ("ffn_gate.weight", vec![h, fd], q4, normal(1.0)),
                    ("ffn_up.weight", vec![h, fd], q4, normal(1.0)),
                    ("ffn_down.weight", vec![fd, h], down_ty, residual),
                ]);
            } else {
                block.extend([
                    ("ffn_gate_inp.weight", vec![h, e], f32t, normal(1.0)),
                    ("exp_probs_b.bias", vec![e], f32t, if o.expert_skew > 0.0 { Init::SkewedBias { std: 0.08 } } else { Init::Gaussian { std: 0.08 } }),
                    ("ffn_gate_exps.weight", vec![h, fe, e], q4, normal(1.0)),
                    ("ffn_up_exps.weight", vec![h, fe, e], q4, normal(1.0)),
                    ("ffn_down_exps.weight", vec![fe, h, e], down_ty, residual),
                    ("ffn_gate_shexp.weight", vec![h, fs], q4, normal(1.0)),
                    ("ffn_up_shexp.weight", vec![h, fs], q4, normal(1.0)),
                    ("ffn_down_shexp.weight", vec![fs, h], down_ty, residual),
                ]);
            }
            if l >= o.layers {
                block.extend([
                    ("nextn.eh_proj.weight", vec![2 * h, h], q4, normal(1.0)),
                    ("nextn.enorm.weight", vec![h], f32t, Init::NormWeight),
                    ("nextn.hnorm.weight", vec![h], f32t, Init::NormWeight),
                    ("layer_output_norm.weight", vec![h], f32t, Init::NormWeight),
                ]);
            }
            // llama-quantize writes a block's tensors sorted by name
            block.sort_by(|a, b| a.0.cmp(b.0));
            for (suffix, dims, ty, init) in block {
                tensors.push((format!("blk.{l}.{suffix}"), dims, ty, init));
            }
        }

        let mut plan = Vec::with_capacity(tensors.len());
        for (name, dims, ty, init) in tensors {
            let ty = fit_type(ty, dims[0] as usize);
            w.add_tensor(&name, ty, &dims).map_err(|e| e.to_string())?;
            plan.push(Planned { ty, init });
        }
        Ok(TinyModel { options, writer: w, plan })
    }

    /// The bytes of tensor `i`, drawn from its own stream (seed, name) so any tensor can be made alone.
    pub fn tensor_bytes(&self, i: usize) -> Vec<u8> {
        let spec = &self.writer.tensors[i];
        let n: u64 = spec.dims.iter().product();
        let row = spec.dims[0] as usize;
        let planned = &self.plan[i];
        // flash-width stacks hold billions of values: cut them into row chunks, each with its own random
        // stream, generated and quantised on every core (small tensors keep one stream, as before)
        if let (Init::Normal { gain }, true) = (planned.init, n > BIG_TENSOR) {
            let std = gain / (row as f64).sqrt();
            let rows = n / row as u64;
            let rows_per_chunk = (CHUNK_VALUES / row as u64).max(1);
            let chunks: Vec<u64> = (0..rows.div_ceil(rows_per_chunk)).collect();
            let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(chunks.len()).max(1);
            let mut out: Vec<Vec<u8>> = vec![Vec::new(); chunks.len()];
            std::thread::scope(|scope| {
                for (t, slots) in out.chunks_mut(chunks.len().div_ceil(threads)).enumerate() {
                    let first = t * chunks.len().div_ceil(threads);
                    scope.spawn(move || {
                        for (j, slot) in slots.iter_mut().enumerate() {
                            let c = (first + j) as u64;
                            let count = rows_per_chunk.min(rows - c * rows_per_chunk) * row as u64;
                            let mut rng = Rng::new(self.options.seed ^ hash_name(&spec.name) ^ (c + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
                            if self.options.fast_weights {
                                if let Some(blocks) = random_blocks(planned.ty, count as usize, std, &mut rng) {
                                    *slot = blocks;
                                    continue;
                                }
                            }
                            let values: Vec<f32> = (0..count).map(|_| (rng.normal() * std) as f32).collect();
                            *slot = quant::quantize(planned.ty, &values).expect("generated values are finite and moderate");
                        }
                    });
                }
            });
            return out.concat();
        }
        let mut rng = Rng::new(self.options.seed ^ hash_name(&spec.name));
        let fast_std = match planned.init {
            Init::Normal { gain } => Some(gain / (row as f64).sqrt()),
            Init::Gaussian { std } => Some(std),
            _ => None,
        };
        if let (Some(std), true) = (fast_std, self.options.fast_weights && n >= FAST_MIN_VALUES) {
            if let Some(blocks) = random_blocks(planned.ty, n as usize, std, &mut rng) {
                return blocks;
            }
        }
        let values: Vec<f32> = match planned.init {
            Init::Normal { gain } => {
                let std = gain / (row as f64).sqrt();
                (0..n).map(|_| (rng.normal() * std) as f32).collect()
            }
            Init::Gaussian { std } => (0..n).map(|_| (rng.normal() * std) as f32).collect(),
            Init::SkewedBias { std } => {
                let mut values: Vec<f32> = (0..n).map(|_| (rng.normal() * std) as f32).collect();
                // a seeded shuffle gives each expert its popularity rank (hot experts spread over the groups)
                let mut rank: Vec<usize> = (0..n as usize).collect();
                for i in (1..rank.len()).rev() {
                    rank.swap(i, (rng.uniform() * (i + 1) as f64) as usize % (i + 1));
                }
                let ln_e = (n as f64).ln();
                for (v, r) in values.iter_mut().zip(rank) {
                    *v += (self.options.expert_skew as f64 * (n as f64 / (1 + r) as f64).ln() / ln_e) as f32;
                }
                values
            }
            Init::NormWeight => (0..n).map(|_| (1.0 + 0.1 * rng.normal()) as f32).collect(),
            Init::Uniform { lo, hi } => (0..n).map(|_| (lo + (hi - lo) * rng.uniform()) as f32).collect(),
            Init::ConvTaps { kernel } => {
                (0..n).map(|j| (0.4 * rng.normal() + if j as usize % kernel == kernel - 1 { 1.0 } else { 0.0 }) as f32).collect()
            }
        };
        quant::quantize(planned.ty, &values).expect("generated values are finite and moderate")
    }

    pub fn part_plans(&self) -> Result<Vec<PartPlan>, GgufError> {
        self.writer.plan(self.options.parts)
    }

    /// File names of the parts: `NAME-00001-of-00002.gguf`, … (or `NAME.gguf` for one part).
    pub fn file_names(&self) -> Vec<String> {
        let n = self.options.parts;
        if n == 1 {
            return vec![format!("{}.gguf", self.options.name)];
        }
        (1..=n).map(|i| format!("{}-{i:05}-of-{n:05}.gguf", self.options.name)).collect()
    }

    /// Every part in memory (small models, and wasm tests).
    pub fn to_parts(&self) -> Result<Vec<Vec<u8>>, GgufError> {
        self.writer.to_parts(self.options.parts, |i| self.tensor_bytes(i))
    }

    /// Writes the parts into `dir`, one tensor at a time (a flash-geometry model does not fit in memory twice).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn write_to_dir(&self, dir: &std::path::Path) -> std::io::Result<Vec<std::path::PathBuf>> {
        use std::io::{BufWriter, Write};
        std::fs::create_dir_all(dir)?;
        let plans = self.part_plans().map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?;
        let mut paths = Vec::new();
        for (plan, name) in plans.iter().zip(self.file_names()) {
            let path = dir.join(&name);
            // write to a temporary name first, so an interrupted run never leaves a plausible-looking part
            let tmp = dir.join(format!("{name}.partial"));
            let mut out = BufWriter::with_capacity(1 << 22, std::fs::File::create(&tmp)?);
            self.writer.write_part(plan, &mut out, |i| self.tensor_bytes(i))?;
            out.flush()?;
            drop(out);
            std::fs::rename(&tmp, &path)?;
            paths.push(path);
        }
        Ok(paths)
    }
}

/// `count` values of type `ty` as random blocks whose values spread evenly over the n levels of a block's range,
/// with standard deviation `std`: every quant drawn, every scale the largest. Only Q4_K and Q6_K (None for others).
fn random_blocks(ty: GgmlType, count: usize, std: f64, rng: &mut Rng) -> Option<Vec<u8>> {
    // n equally spaced levels over ±a have variance a²·(n+1)/(3(n−1))
    let levels: f64 = if ty == GgmlType::Q4_K { 16.0 } else { 64.0 };
    let half_range = std * (3.0 * (levels - 1.0) / (levels + 1.0)).sqrt();
    let f16 = |v: f64| half::f16::from_f64(v).to_le_bytes();
    let (header, at): (Vec<(usize, u8)>, usize) = match ty {
        // d·63·q − dmin·63 with q in 0..=15: all 12 scale bytes 0xff make every sub-block's scale and min 63
        GgmlType::Q4_K => {
            let (d, dmin) = (f16(2.0 * half_range / (63.0 * 15.0)), f16(half_range / 63.0));
            let mut h: Vec<(usize, u8)> = vec![(0, d[0]), (1, d[1]), (2, dmin[0]), (3, dmin[1])];
            h.extend((4..16).map(|i| (i, 0xff)));
            (h, 16)
        }
        // d·64·(q − 32) with q in 0..=63: the 16 int8 scales 64, the 192 quant bytes drawn
        GgmlType::Q6_K => {
            let d = f16(half_range / (64.0 * 32.0));
            let mut h: Vec<(usize, u8)> = (192..208).map(|i| (i, 64u8)).collect();
            h.extend([(208, d[0]), (209, d[1])]);
            (h, 0)
        }
        _ => return None,
    };
    let (elems, bytes) = (ty.block_elems(), ty.block_bytes());
    let quant_bytes = bytes - header.len();
    let mut out = vec![0u8; count / elems * bytes];
    for block in out.chunks_mut(bytes) {
        for (i, v) in &header {
            block[*i] = *v;
        }
        for word in block[at..at + quant_bytes].chunks_mut(8) {
            let r = rng.next_u64().to_le_bytes();
            word.copy_from_slice(&r[..word.len()]);
        }
    }
    Some(out)
}

/// The vocabulary of a tiny model.
pub struct Vocab {
    pub tokens: Vec<String>,
    pub types: Vec<i32>,
    pub merges: Vec<String>,
}

/// Ling's special tokens, in the order they follow the BPE tokens (llama.cpp token types: 3 CONTROL, 4 USER_DEFINED).
pub const SPECIAL_TOKENS: &[(&str, i32)] = &[
    ("<|startoftext|>", 3),
    ("<|endoftext|>", 3),
    ("[CLS]", 3),
    ("[gMASK]", 3),
    ("<|role_end|>", 3),
    ("<role>", 3),
    ("</role>", 3),
    ("<think>", 4),
    ("</think>", 4),
    ("<tool_call>", 4),
    ("</tool_call>", 4),
    ("<tool_response>", 4),
    ("</tool_response>", 4),
    ("<arg_key>", 4),
    ("</arg_key>", 4),
    ("<arg_value>", 4),
    ("</arg_value>", 4),
];
/// Reserved tokens after the named specials (Ling reserves some; the fixture has 3).
const MIN_RESERVED: usize = 3;

/// Trains BPE merges on the corpus so the vocabulary reaches `vocab_size` (256 byte tokens + merges + specials),
/// padding with `<|reserved_token_N|>` when the corpus supports fewer merges.
pub fn bpe_vocab(vocab_size: usize) -> Result<Vocab, String> {
    let fixed = 256 + SPECIAL_TOKENS.len() + MIN_RESERVED;
    if vocab_size < fixed {
        return Err(format!("vocab {vocab_size} is too small: at least {fixed} (bytes + special tokens)"));
    }
    let merges = bpe_train::train_bpe(corpus::CORPUS, vocab_size - fixed);
    let n_reserved = vocab_size - fixed - merges.len() + MIN_RESERVED;
    let reserved: Vec<String> = (0..n_reserved).map(|i| format!("<|reserved_token_{i}|>")).collect();
    let mut specials: Vec<(&str, i32)> = SPECIAL_TOKENS.to_vec();
    specials.extend(reserved.iter().map(|s| (s.as_str(), 3)));
    let (tokens, types, merges) = bpe_train::build_vocab(&merges, &specials);
    assert_eq!(tokens.len(), vocab_size);
    Ok(Vocab { tokens, types, merges })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fast blocks decode (by the ggml-exact reference) to values within ±1.75·std with the asked spread.
    #[test]
    fn random_blocks_spread_like_the_normal_init() {
        let std = 0.02;
        for ty in [GgmlType::Q4_K, GgmlType::Q6_K] {
            let bytes = random_blocks(ty, 256 * 512, std, &mut Rng::new(3)).unwrap();
            let values = quant::dequantize_to_vec(ty, &bytes).unwrap();
            assert_eq!(values.len(), 256 * 512);
            let bound = 1.75 * std;
            assert!(values.iter().all(|&v| (v as f64).abs() <= bound), "{ty}: a value past ±{bound}");
            let mean = values.iter().map(|&v| v as f64).sum::<f64>() / values.len() as f64;
            let sd = (values.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / values.len() as f64).sqrt();
            assert!((sd / std - 1.0).abs() < 0.05 && mean.abs() < 0.05 * std, "{ty}: mean {mean}, sd {sd} for std {std}");
        }
        assert!(random_blocks(GgmlType::Q8_0, 32, std, &mut Rng::new(3)).is_none());
    }
}
