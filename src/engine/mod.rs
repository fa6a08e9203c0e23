//! The engine: one `bailingmoe3` decode step on the GPU — token and position in, logits out — with the KDA
//! recurrent and conv states and the MLA latent cache held on the GPU, and routed experts read from the pool.
//! llama.cpp's `src/models/bailingmoe3.cpp` is the reference; `forward.rs` follows its order of operations.

pub mod bench;
pub mod cache;
mod forward;
pub mod pool;
mod prefill;
pub mod weights;

use crate::gguf::SplitModel;
use crate::gpu::moe::{selection_words, Selection};
use crate::gpu::Gpu;
use crate::model::Config;
use crate::source::RangeSource;
use crate::store::StoreChecks;
pub use cache::{CacheStats, Policy};
pub use forward::set_layers_per_submit;
use cache::ExpertCache;
use forward::{Experts, State, StepToken, PICK_BYTES};
pub use pool::Upload;
use pool::{ExpertPool, ExpertTensors, PartsReader};
use weights::Weights;

#[derive(Clone, Debug, Default)]
pub struct EngineOptions {
    /// Context length (tokens); default: the model's, capped at 4096.
    pub n_ctx: Option<usize>,
    /// Largest buffer a kernel may bind; default: the adapter's limit. Smaller values force tensors and the
    /// expert pool to be split over several buffers (the same path the real 330 MB head takes).
    pub max_binding: Option<u64>,
    /// GPU bytes for the expert pool; default: every expert resident. Smaller pools stream experts from the
    /// model's source as the router asks for them ([`Engine::open`]).
    pub pool_bytes: Option<u64>,
    /// GPU bytes the engine may use in all: the pool gets what the dense weights and states leave.
    pub gpu_budget_bytes: Option<u64>,
    /// Pool size in slots, raised to one token's experts if below (benchmarks; overrides the byte sizes).
    pub pool_slots: Option<u32>,
    /// Eviction policy of a streaming pool (default [`Policy::DEFAULT`]).
    pub policy: Option<Policy>,
    /// How streamed records reach the pool (default `writeBuffer`; see `bench-stream --uploads`).
    pub upload: Option<Upload>,
    /// Tokens per chunk of the batched prefill ([`Engine::feed`]); 1 feeds the prompt token by token, like
    /// [`Engine::step`]. Default [`DEFAULT_PREFILL_CHUNK`]; lowered to what the binding limit allows (token by
    /// token when not even two tokens' scratch fits one binding).
    pub prefill_chunk: Option<usize>,
    /// Tokens the prefill runs layer by layer at once (a streamed MoE layer reads each expert they select once);
    /// default [`DEFAULT_PREFILL_SPAN`], at least the chunk.
    pub prefill_span: Option<usize>,
    /// Whether a decode step computes the matrices of a layer that read the same input (a KDA layer's six
    /// projections, a SwiGLU's gate and up) as one product per type, stacked in one buffer at load (default);
    /// false: one product per matrix (`lingtab bench --no-stacks`, to compare; and to test both ways).
    pub stack_products: Option<bool>,
    /// Whether a decode step runs an MoE layer's shared expert with its selected experts, as one more batch of
    /// their products from a pool slot of its own, where its matrices are laid out as theirs (default); false:
    /// as products of its own (`lingtab bench --no-riding`, to compare; and to test both ways).
    pub shared_rides: Option<bool>,
}

pub use prefill::{DEFAULT_CHUNK as DEFAULT_PREFILL_CHUNK, DEFAULT_SPAN as DEFAULT_PREFILL_SPAN};

impl EngineOptions {
    /// Options from the environment: `LINGTAB_MAX_BINDING` (bytes) forces a small binding limit.
    pub fn from_env() -> EngineOptions {
        #[cfg(not(target_arch = "wasm32"))]
        let max_binding = std::env::var("LINGTAB_MAX_BINDING").ok().and_then(|v| v.parse().ok());
        #[cfg(target_arch = "wasm32")]
        let max_binding = None;
        EngineOptions { max_binding, ..Default::default() }
    }
}

/// GPU memory the engine holds, by what it is for.
#[derive(Clone, Debug, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuBytes {
    pub dense_weights: u64,
    pub expert_pool: u64,
    /// KDA states, MLA caches and scratch vectors (the prefill's too).
    pub states: u64,
}

pub struct Engine {
    pub gpu: Gpu,
    pub config: Config,
    weights: Weights,
    pool: ExpertPool,
    experts: Experts,
    state: State,
    /// Scratch of the batched prefill (None: prompts go token by token).
    prefill: Option<prefill::Prefill>,
    /// Tokens whose effect the states hold, in order; the next step is at position `tokens.len()`.
    tokens: Vec<u32>,
    pub n_ctx: usize,
    stats: CacheStats,
    expert_tensors: ExpertTensors,
    max_binding: u64,
    /// A step [`Engine::next_greedy`] ran ahead: the states hold it after `tokens`.
    ahead: Option<Ahead>,
    /// Whether [`Engine::next_greedy`] runs the next step ahead (`lingtab bench --no-run-ahead` and the browser
    /// bench's `runAhead: false` compare).
    run_ahead: bool,
}

/// A decode step submitted before its token came back to the CPU (its token is the GPU's greedy pick of the step
/// before it). The states hold it; it is taken when the caller runs `token` next, and undone otherwise.
struct Ahead {
    token: u32,
    /// where its own pick lands ([`State::picks`]), once submission `done` has run
    pick_in: usize,
    done: wgpu::SubmissionIndex,
}

/// The states of a sequence and the prefill's scratch, as loaded.
struct Dense {
    state: State,
    prefill: Option<prefill::Prefill>,
}

/// Slots of the expert pool the options ask for (every expert when they ask for nothing).
fn pool_slots(config: &Config, tensors: &ExpertTensors, dense: u64, states: u64, options: &EngineOptions) -> Result<u32, String> {
    let (total, slot) = (tensors.total(), tensors.slot_bytes());
    if let Some(n) = options.pool_slots {
        return Ok((n as u64).clamp(config.n_expert_used as u64, total) as u32);
    }
    let bytes = match (options.pool_bytes, options.gpu_budget_bytes) {
        (Some(_), Some(_)) => return Err("give a pool size or a GPU budget, not both".into()),
        (Some(p), None) => p,
        (None, Some(budget)) => budget.checked_sub(dense + states).ok_or_else(|| {
            format!("a GPU budget of {budget} bytes does not hold the dense weights ({dense} bytes) and states ({states} bytes), let alone experts")
        })?,
        (None, None) => return Ok(total as u32),
    };
    let k = config.n_expert_used as u64;
    let n = (bytes / slot).min(total);
    if n < k {
        return Err(format!(
            "an expert pool of {bytes} bytes holds {n} expert records of {slot} bytes; a token needs {k} at once: give at least {} bytes",
            k * slot
        ));
    }
    Ok(n as u32)
}

/// What the engine will hold on the GPU, planned from the model's tensor table and the options before
/// anything is read or allocated: a context or pool that cannot fit is refused here, with the numbers.
struct Plan {
    config: Config,
    tensors: ExpertTensors,
    n_ctx: usize,
    max_binding: u64,
    dense: u64,
    states: u64,
    slots: u32,
}

impl Plan {
    fn new(gpu: &Gpu, model: &SplitModel, options: &EngineOptions) -> Result<Plan, String> {
        let config = Config::from_header(model.header()).map_err(|e| e.to_string())?;
        crate::model::layout::check_tensors(&config, model)?;
        if options.n_ctx == Some(0) {
            return Err("the context length must be at least 1 token".into());
        }
        let limits = gpu.device.limits();
        let max_binding = options.max_binding.unwrap_or(u64::MAX).min(limits.max_storage_buffer_binding_size as u64).min(limits.max_buffer_size);
        if max_binding < 4096 {
            return Err(format!("binding limit {max_binding} is too small"));
        }
        let n_ctx = options.n_ctx.unwrap_or(4096).min(config.context_length).max(1);
        let head = model.tensor("output.weight").or_else(|| model.tensor("token_embd.weight")).ok_or("the model has no output.weight or token_embd.weight")?;
        let vocab = (head.info.n_elements() / head.info.dims[0].max(1)) as usize;
        let (states, largest_cache) = forward::State::bytes_needed(&config, n_ctx, vocab);
        // an MLA cache is one buffer, bound whole (not split like the weights): the device's own limit
        let cache_limit = limits.max_storage_buffer_binding_size;
        if largest_cache > cache_limit {
            let per_row = ((config.kv_lora_rank + config.rope_dim) * 4) as u64;
            let most = crate::gpu::mla::longest_context(per_row, cache_limit);
            return Err(format!(
                "a context of {n_ctx} tokens needs an MLA cache of {largest_cache} bytes per MLA layer, above the {cache_limit} bytes a buffer binding may hold on this GPU (maxStorageBufferBindingSize): use a context of at most {most} tokens"
            ));
        }
        let tensors = ExpertTensors::of(&config, model)?;
        let tensors = if options.shared_rides == Some(false) { tensors.without_riders() } else { tensors };
        // a riding shared expert's slot holds a copy of dense weights: counted with them
        let riders = tensors.riding_layers().count() as u64 * tensors.slot_bytes();
        let dense = crate::model::layout::Totals::of(&config, model).dense_bytes + riders;
        let states = states + prefill::Prefill::bytes_needed(&config, options.prefill_chunk, options.prefill_span, n_ctx, max_binding);
        let slots = pool_slots(&config, &tensors, dense, states, options)?;
        Ok(Plan { config, tensors, n_ctx, max_binding, dense, states, slots })
    }

    /// What an out-of-memory (or other GPU) error while loading says, with what the load asked for.
    fn explain(&self, error: &str) -> String {
        let pool = self.slots as u64 * self.tensors.slot_bytes();
        format!(
            "the GPU could not hold the engine ({error}): it asked for {} bytes (dense weights {}, states for {} tokens {}, expert pool {pool}); give a smaller expert pool or GPU budget (poolBytes/gpuBudgetBytes, --pool-bytes/--gpu-budget) or a shorter context",
            self.dense + self.states + pool,
            self.dense,
            self.n_ctx,
            self.states
        )
    }
}

impl Engine {
    /// Dense weights, states and the prefill's scratch (the pool is the caller's).
    async fn load_dense<S: RangeSource>(gpu: &Gpu, plan: &Plan, model: &SplitModel, parts: &[S], checks: Option<&StoreChecks>, options: &EngineOptions) -> Result<(Weights, Dense), String> {
        let weights = Weights::load(gpu, &plan.config, model, plan.max_binding, options.stack_products.unwrap_or(true), parts, checks).await?;
        let state = State::new(gpu, &plan.config, &weights, plan.n_ctx)?;
        let prefill = prefill::Prefill::for_options(gpu, &plan.config, options.prefill_chunk, options.prefill_span, plan.n_ctx, plan.max_binding);
        Ok((weights, Dense { state, prefill }))
    }

    #[allow(clippy::too_many_arguments)]
    fn assemble(gpu: Gpu, config: Config, weights: Weights, pool: ExpertPool, experts: Experts, dense: Dense, n_ctx: usize, policy: &str, expert_tensors: ExpertTensors, max_binding: u64) -> Engine {
        let stats = CacheStats::new(policy, pool.routed_slots, pool.slot_bytes, config.n_layer);
        let Dense { state, prefill } = dense;
        Engine { gpu, config, weights, pool, experts, state, prefill, tokens: Vec::new(), n_ctx, stats, expert_tensors, max_binding, ahead: None, run_ahead: true }
    }

    /// Uploads the dense weights and every expert (all resident) of `model`, whose parts are `parts`.
    /// For a pool smaller than the experts, use [`Engine::open`], which keeps the parts to stream from.
    pub async fn load<S: RangeSource>(gpu: Gpu, model: &SplitModel, parts: &[S], options: &EngineOptions) -> Result<Engine, String> {
        let plan = Plan::new(&gpu, model, options)?;
        if (plan.slots as u64) < plan.tensors.total() {
            return Err(format!("a pool of {} experts (of {}) streams experts: load with Engine::open", plan.slots, plan.tensors.total()));
        }
        let loaded = gpu
            .catching(|e| plan.explain(e), async {
                let (weights, state) = Self::load_dense(&gpu, &plan, model, parts, None, options).await?;
                let reader = PartsReader { parts: parts.iter().collect::<Vec<&S>>(), tensors: plan.tensors.clone(), checks: None };
                let mut pool = ExpertPool::load_resident(&gpu, &plan.tensors, plan.config.n_layer, plan.max_binding, &reader).await?;
                pool.fill_shared(&gpu, &weights)?;
                Ok((weights, state, pool))
            })
            .await;
        let (weights, state, pool) = loaded?;
        let Plan { config, tensors, n_ctx, max_binding, .. } = plan;
        Ok(Self::assemble(gpu, config, weights, pool, Experts::Resident, state, n_ctx, "resident", tensors, max_binding))
    }

    /// Like [`Engine::load`], and keeps `parts`: with a pool smaller than the experts (`pool_bytes`,
    /// `gpu_budget_bytes`), experts are read from them as the router asks, into a cache of GPU slots.
    pub async fn open<S: RangeSource + 'static>(gpu: Gpu, model: &SplitModel, parts: Vec<S>, options: &EngineOptions) -> Result<Engine, String> {
        Self::open_checked(gpu, model, parts, None, options).await
    }

    /// [`Engine::open`] on a store's parts, with the store's check values: every dense tensor and every expert
    /// record read is checked before it goes to the GPU, so bytes changed on disk are an error, never output.
    pub async fn open_checked<S: RangeSource + 'static>(gpu: Gpu, model: &SplitModel, parts: Vec<S>, checks: Option<StoreChecks>, options: &EngineOptions) -> Result<Engine, String> {
        let plan = Plan::new(&gpu, model, options)?;
        let slots = plan.slots;
        let policy = options.policy.unwrap_or(Policy::DEFAULT);
        let loaded = gpu
            .catching(|e| plan.explain(e), async {
                let (weights, state) = Self::load_dense(&gpu, &plan, model, &parts, checks.as_ref(), options).await?;
                let reader = PartsReader { parts, tensors: plan.tensors.clone(), checks: checks.map(std::rc::Rc::new) };
                if slots as u64 >= plan.tensors.total() {
                    let mut pool = ExpertPool::load_resident(&gpu, &plan.tensors, plan.config.n_layer, plan.max_binding, &reader).await?;
                    pool.fill_shared(&gpu, &weights)?;
                    return Ok((weights, state, pool, Experts::Resident));
                }
                let mut pool = ExpertPool::new(&gpu, &plan.tensors, plan.config.n_layer, slots, plan.max_binding)?;
                pool.fill_shared(&gpu, &weights)?;
                if options.upload == Some(Upload::StagingRing) {
                    pool.use_staging(&gpu, plan.config.n_expert_used as u32);
                }
                let cache = ExpertCache::new(plan.config.n_layer, plan.tensors.n_expert, slots, policy);
                Ok((weights, state, pool, Experts::Streaming { cache, reader: Box::new(reader) }))
            })
            .await;
        let (weights, state, pool, experts) = loaded?;
        let name = if matches!(experts, Experts::Resident) { "resident".to_string() } else { policy.name() };
        let Plan { config, tensors, n_ctx, max_binding, .. } = plan;
        Ok(Self::assemble(gpu, config, weights, pool, experts, state, n_ctx, &name, tensors, max_binding))
    }

    /// Gives a streaming engine a new, empty pool of `slots` slots and a cache with `policy` (benchmarks compare
    /// pool sizes and policies on one load); the sequence and the counters start over.
    pub fn set_pool(&mut self, slots: u32, policy: Policy, upload: Upload) -> Result<(), String> {
        let Experts::Streaming { reader, .. } = std::mem::replace(&mut self.experts, Experts::Resident) else {
            return Err("the engine holds every expert: open it with a pool size to stream".into());
        };
        let tensors = &self.expert_tensors;
        let k = self.config.n_expert_used as u32;
        let slots = slots.clamp(k, tensors.total() as u32);
        // the old pool goes first, so both never hold GPU memory at once
        self.pool = ExpertPool::new(&self.gpu, tensors, self.config.n_layer, k, self.max_binding)?;
        self.pool = ExpertPool::new(&self.gpu, tensors, self.config.n_layer, slots, self.max_binding)?;
        self.pool.fill_shared(&self.gpu, &self.weights)?;
        if upload == Upload::StagingRing {
            self.pool.use_staging(&self.gpu, k);
        }
        self.experts = Experts::Streaming { cache: ExpertCache::new(self.config.n_layer, tensors.n_expert, slots, policy), reader };
        self.reset();
        self.stats = CacheStats::new(&policy.name(), slots, self.pool.slot_bytes, self.config.n_layer);
        Ok(())
    }

    /// Empties a streaming engine's pool (same size, policy and upload path), so a run starts cold.
    pub fn empty_pool(&mut self) -> Result<(), String> {
        let Experts::Streaming { cache, .. } = &self.experts else { return Ok(()) };
        let (slots, policy) = (cache.n_slots(), cache.policy);
        self.set_pool(slots, policy, self.pool.upload_path())
    }

    /// True when experts are streamed into a pool smaller than the model's experts.
    pub fn is_streaming(&self) -> bool {
        matches!(self.experts, Experts::Streaming { .. })
    }

    /// Counters of the expert cache and the steps so far.
    /// How many stacked products a decode step runs per token ([`EngineOptions::stack_products`]).
    pub fn stack_count(&self) -> usize {
        self.weights.stack_count()
    }

    pub fn stats(&self) -> &CacheStats {
        &self.stats
    }

    pub fn upload_path(&self) -> Upload {
        self.pool.upload_path()
    }

    /// How many buffers the expert pool is split over (each at most the binding limit).
    pub fn pool_buffers(&self) -> usize {
        self.pool.chunks.len()
    }

    /// Zeroes the counters (not the cache).
    pub fn reset_stats(&mut self) {
        self.stats = CacheStats::new(&self.stats.policy, self.stats.pool_slots, self.stats.slot_bytes, self.config.n_layer);
    }

    pub fn gpu_bytes(&self) -> GpuBytes {
        let prefill = self.prefill.as_ref().map_or(0, |p| p.bytes);
        // a riding shared expert's slot holds a copy of dense weights: counted with them, not with the pool
        let riders = (self.pool.n_slots - self.pool.routed_slots) as u64 * self.pool.slot_bytes;
        GpuBytes { dense_weights: self.weights.bytes + riders, expert_pool: self.pool.gpu_bytes() - riders, states: self.state.bytes + prefill }
    }

    /// Bytes one decode step must read at the least: every dense tensor once (the embedding table only its
    /// token's row, unless it is also the head) and k expert records per MoE layer. Divided by the measured
    /// memory bandwidth, this is the step's floor.
    pub fn min_bytes_per_token(&self) -> u64 {
        let tied_head = !self.weights.tensors.contains_key("output.weight");
        let dense: u64 = self
            .weights
            .tensors
            .values()
            .map(|t| if t.name == "token_embd.weight" && !tied_head { t.row_bytes() } else { t.n_rows() * t.row_bytes() })
            .sum();
        let k = self.config.n_expert_used as u64;
        let experts: u64 = self.expert_tensors.layouts.iter().flatten().map(|r| k * r.bytes).sum();
        dense + experts
    }

    pub fn vocab_size(&self) -> usize {
        self.state.vocab
    }
    pub fn position(&self) -> usize {
        self.tokens.len()
    }
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Forgets the sequence: zero recurrent and conv states (the MLA cache is overwritten as positions refill).
    pub fn reset(&mut self) {
        self.state.clear(&self.gpu);
        self.tokens.clear();
        self.ahead = None;
    }

    /// Whether [`Engine::next_greedy`] runs a step ahead (default true; false to compare).
    pub fn set_run_ahead(&mut self, on: bool) {
        self.run_ahead = on;
    }

    fn check_token(&self, token: u32) -> Result<(), String> {
        if token as usize >= self.state.vocab {
            return Err(format!("token id {token} is outside the vocabulary (size {})", self.state.vocab));
        }
        if self.tokens.len() >= self.n_ctx {
            return Err(format!("the context is full: {} tokens (context length {})", self.tokens.len(), self.n_ctx));
        }
        Ok(())
    }

    /// Runs a step at position `pos` (its pick also copied to `state.picks[pick_to]`). A failure part-way (an
    /// expert that cannot be read) leaves the states half-updated, so the sequence is forgotten: the next feed
    /// starts over.
    async fn run_step(&mut self, token: StepToken, pos: usize, pick_to: Option<usize>) -> Result<wgpu::SubmissionIndex, String> {
        if let Err(e) = self.gpu.check().map_err(|e| e.0) {
            self.reset();
            return Err(e);
        }
        let result = forward::run_step(&self.gpu, &self.config, &self.weights, &mut self.pool, &self.state, &mut self.experts, &mut self.stats, token, pos as u32, pick_to).await;
        match result {
            Ok(_) => self.stats.tokens += 1,
            Err(_) => self.reset(),
        }
        result
    }

    /// Runs `token` at the next position: takes the step run ahead when it was for `token`, else undoes it first.
    async fn advance(&mut self, token: u32) -> Result<(), String> {
        self.check_token(token)?;
        if self.take_ahead(token).await?.is_some() {
            return Ok(());
        }
        self.run_step(StepToken::Id(token), self.tokens.len(), None).await?;
        self.tokens.push(token);
        Ok(())
    }

    /// The step run ahead, when it was for `token` (it now counts as run). One for another token is undone: the
    /// states cannot step back, so they start over and run the tokens before it again.
    async fn take_ahead(&mut self, token: u32) -> Result<Option<Ahead>, String> {
        let Some(ahead) = self.ahead.take() else { return Ok(None) };
        if ahead.token == token {
            self.tokens.push(token);
            return Ok(Some(ahead));
        }
        let tokens = std::mem::take(&mut self.tokens);
        self.reset();
        if !tokens.is_empty() {
            self.run_tokens(&tokens).await?;
        }
        Ok(None)
    }

    /// Runs `tokens` from the current position (batched when there is a prefill and more than one), without
    /// reading anything back; the logits of the last land in the states' logits buffer.
    async fn run_tokens(&mut self, tokens: &[u32]) -> Result<(), String> {
        if self.prefill.is_some() && tokens.len() > 1 {
            return self.prefill(tokens).await;
        }
        for &t in tokens {
            self.check_token(t)?;
            self.run_step(StepToken::Id(t), self.tokens.len(), None).await?;
            self.tokens.push(t);
        }
        Ok(())
    }

    /// Runs `token` at the next position and returns the logits.
    pub async fn step(&mut self, token: u32) -> Result<Vec<f32>, String> {
        self.advance(token).await?;
        self.read_logits().await
    }

    async fn read_logits(&mut self) -> Result<Vec<f32>, String> {
        self.stats.syncs += 1;
        let bytes = self.gpu.read_back(&self.state.logits, self.state.vocab as u64 * 4).await.map_err(|e| e.0)?;
        Ok(bytemuck::pod_collect_to_vec(&bytes[..self.state.vocab * 4]))
    }

    /// Runs `token` and returns only the greedy pick (argmax on the GPU; 8 bytes read back).
    pub async fn step_argmax(&mut self, token: u32) -> Result<u32, String> {
        self.advance(token).await?;
        self.stats.syncs += 1;
        let bytes = self.gpu.read_back(&self.state.argmax, PICK_BYTES).await.map_err(|e| e.0)?;
        Ok(u32::from_le_bytes(bytes[..4].try_into().unwrap()))
    }

    /// [`Engine::step_argmax`] for a greedy decode loop, which runs each pick next: with every expert resident, the
    /// step for the pick is submitted before the pick is read back (it embeds the pick on the GPU), so the GPU runs
    /// it while the CPU reads the pick, hands it on and records the step after. The states then hold that step; a
    /// next call with the pick takes it, anything else ([`Engine::feed`] of other tokens, a step of another token)
    /// undoes it first. Streaming engines, and the last position of the context, step as `step_argmax` does.
    pub async fn next_greedy(&mut self, token: u32) -> Result<u32, String> {
        self.check_token(token)?;
        let (pick_in, done) = match self.take_ahead(token).await? {
            Some(ahead) => (ahead.pick_in, ahead.done),
            None => {
                let done = self.run_step(StepToken::Id(token), self.tokens.len(), Some(0)).await?;
                self.tokens.push(token);
                (0, done)
            }
        };
        let mut ahead = None;
        if self.run_ahead && !self.is_streaming() && self.tokens.len() < self.n_ctx {
            let next_in = 1 - pick_in;
            let done = self.run_step(StepToken::LastPick, self.tokens.len(), Some(next_in)).await?;
            ahead = Some((next_in, done));
        }
        self.stats.syncs += 1;
        let read = self.gpu.read_mapped(&self.state.picks[pick_in], done, PICK_BYTES).await;
        let pick = match read {
            Ok(bytes) => u32::from_le_bytes(bytes[..4].try_into().unwrap()),
            Err(e) => {
                self.reset();
                return Err(e.0);
            }
        };
        if pick as usize >= self.state.vocab {
            self.reset();
            return Err(format!("the GPU's greedy pick {pick} is outside the vocabulary (size {}): a GPU fault?", self.state.vocab));
        }
        self.ahead = ahead.map(|(pick_in, done)| Ahead { token: pick, pick_in, done });
        Ok(pick)
    }

    /// The routing of the last decode step, per MoE layer (read back from the GPU; for checks against references,
    /// where a near-tie in routing may legitimately go the other way). A chunked prefill does not update it; a
    /// step [`Engine::next_greedy`] ran ahead does.
    pub async fn last_routing(&self) -> Result<Vec<(usize, Selection)>, String> {
        let k = self.config.n_expert_used as u32;
        let mut out = Vec::new();
        for (l, sel) in self.state.sel.iter().enumerate() {
            if let Some(buffer) = sel {
                let bytes = self.gpu.read_back(buffer, selection_words(k) as u64 * 4).await.map_err(|e| e.0)?;
                out.push((l, Selection::from_words(&bytemuck::pod_collect_to_vec::<u8, u32>(&bytes), k)));
            }
        }
        Ok(out)
    }

    /// Brings the states to the end of `tokens`: continues when they extend the tokens already fed, else
    /// starts over (the KDA state cannot step back). Returns the logits after the last token.
    pub async fn feed(&mut self, tokens: &[u32]) -> Result<Vec<f32>, String> {
        if tokens.is_empty() {
            return Err("no tokens to feed".into());
        }
        if tokens.len() > self.n_ctx {
            return Err(format!("{} tokens do not fit the context length {}", tokens.len(), self.n_ctx));
        }
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= self.state.vocab) {
            return Err(format!("token id {bad} is outside the vocabulary (size {})", self.state.vocab));
        }
        // a step run ahead is kept when the tokens go on through it; they may end with it (its logits are there)
        if let Some(ahead) = self.ahead.take() {
            if tokens.len() > self.tokens.len() && tokens.starts_with(&self.tokens) && tokens[self.tokens.len()] == ahead.token {
                self.tokens.push(ahead.token);
                if tokens.len() == self.tokens.len() {
                    return self.read_logits().await;
                }
            } else {
                self.reset();
            }
        }
        let extends = tokens.len() > self.tokens.len() && tokens.starts_with(&self.tokens);
        if !extends {
            self.reset();
        }
        let start = self.tokens.len();
        self.run_tokens(&tokens[start..]).await?;
        self.read_logits().await
    }

    /// Tokens per chunk of the batched prefill (1: prompts go token by token).
    pub fn prefill_chunk(&self) -> usize {
        self.prefill.as_ref().map_or(1, |p| p.chunk)
    }

    /// Tokens per span of the batched prefill (run layer by layer at once).
    pub fn prefill_span(&self) -> usize {
        self.prefill.as_ref().map_or(1, |p| p.span)
    }

    /// New prefill scratch for chunks of `chunk` tokens and spans of `span` (1: token by token; benchmarks compare
    /// both on one load). The sequence starts over.
    pub fn set_prefill(&mut self, chunk: usize, span: Option<usize>) -> Result<(), String> {
        self.prefill = None;
        self.gpu.forget_bindings();
        self.prefill = prefill::Prefill::for_options(&self.gpu, &self.config, Some(chunk), span, self.n_ctx, self.max_binding);
        self.reset();
        Ok(())
    }

    /// Runs `tokens` at the next positions with the batched prefill, span by span; the logits of the last land
    /// in the states' logits buffer. A failure part-way forgets the sequence, like [`Engine::advance`].
    async fn prefill(&mut self, tokens: &[u32]) -> Result<(), String> {
        if self.tokens.len() + tokens.len() > self.n_ctx {
            return Err(format!("{} more tokens do not fit the context ({} of {} used)", tokens.len(), self.tokens.len(), self.n_ctx));
        }
        self.gpu.check().map_err(|e| e.0)?;
        let scratch = self.prefill.as_ref().expect("prefill scratch");
        let span = prefill::Span { gpu: &self.gpu, config: &self.config, weights: &self.weights, state: &self.state, scratch };
        for part in tokens.chunks(scratch.span) {
            let pos = self.tokens.len() as u32;
            if let Err(e) = prefill::run_span(&span, &mut self.pool, &mut self.experts, &mut self.stats, part, pos).await {
                self.state.clear(&self.gpu);
                self.tokens.clear();
                return Err(e);
            }
            self.tokens.extend_from_slice(part);
            self.stats.tokens += part.len() as u64;
        }
        Ok(())
    }
}
