//! The engine: one `bailingmoe3` decode step on the GPU — token and position in, logits out — with the KDA
//! recurrent and conv states and the MLA latent cache held on the GPU, and routed experts read from the pool.
//! llama.cpp's `src/models/bailingmoe3.cpp` is the reference; `forward.rs` follows its order of operations.

mod forward;
pub mod pool;
pub mod weights;

use crate::gguf::SplitModel;
use crate::gpu::moe::{selection_words, Selection};
use crate::gpu::Gpu;
use crate::model::Config;
use crate::source::RangeSource;
use forward::State;
use pool::ExpertPool;
use weights::Weights;

#[derive(Clone, Debug, Default)]
pub struct EngineOptions {
    /// Context length (tokens); default: the model's, capped at 4096.
    pub n_ctx: Option<usize>,
    /// Largest buffer a kernel may bind; default: the adapter's limit. Smaller values force tensors and the
    /// expert pool to be split over several buffers (the same path the real 330 MB head takes).
    pub max_binding: Option<u64>,
}

impl EngineOptions {
    /// Options from the environment: `LINGTAB_MAX_BINDING` (bytes) forces a small binding limit.
    pub fn from_env() -> EngineOptions {
        #[cfg(not(target_arch = "wasm32"))]
        let max_binding = std::env::var("LINGTAB_MAX_BINDING").ok().and_then(|v| v.parse().ok());
        #[cfg(target_arch = "wasm32")]
        let max_binding = None;
        EngineOptions { n_ctx: None, max_binding }
    }
}

pub struct Engine {
    pub gpu: Gpu,
    pub config: Config,
    weights: Weights,
    pool: ExpertPool,
    state: State,
    /// Tokens whose effect the states hold, in order; the next step is at position `tokens.len()`.
    tokens: Vec<u32>,
    pub n_ctx: usize,
}

impl Engine {
    /// Uploads the dense weights and every expert (all resident) of `model`, whose parts are `parts`.
    pub async fn load<S: RangeSource>(gpu: Gpu, model: &SplitModel, parts: &[S], options: &EngineOptions) -> Result<Engine, String> {
        let config = Config::from_header(model.header()).map_err(|e| e.to_string())?;
        crate::model::layout::check_tensors(&config, model)?;
        let limits = gpu.device.limits();
        let max_binding = options.max_binding.unwrap_or(u64::MAX).min(limits.max_storage_buffer_binding_size as u64).min(limits.max_buffer_size);
        if max_binding < 4096 {
            return Err(format!("binding limit {max_binding} is too small"));
        }
        let n_ctx = options.n_ctx.unwrap_or(4096).min(config.context_length).max(1);
        let weights = Weights::load(&gpu, &config, model, max_binding, parts).await?;
        let pool = ExpertPool::load_resident(&gpu, &config, model, max_binding, parts).await?;
        let state = State::new(&gpu, &config, &weights, n_ctx)?;
        Ok(Engine { gpu, config, weights, pool, state, tokens: Vec::new(), n_ctx })
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

    /// Runs `token` at the next position and returns the logits.
    pub async fn step(&mut self, token: u32) -> Result<Vec<f32>, String> {
        self.check_token(token)?;
        let pos = self.tokens.len() as u32;
        forward::record_step(&self.gpu, &self.config, &self.weights, &self.pool, &self.state, token, pos)?;
        self.tokens.push(token);
        let bytes = self.gpu.read_back(&self.state.logits, self.state.vocab as u64 * 4).await.map_err(|e| e.0)?;
        Ok(bytemuck::pod_collect_to_vec(&bytes[..self.state.vocab * 4]))
    }

    /// Runs `token` and returns only the greedy pick (argmax on the GPU; 8 bytes read back).
    pub async fn step_argmax(&mut self, token: u32) -> Result<u32, String> {
        self.check_token(token)?;
        let pos = self.tokens.len() as u32;
        forward::record_step(&self.gpu, &self.config, &self.weights, &self.pool, &self.state, token, pos)?;
        self.tokens.push(token);
        let bytes = self.gpu.read_back(&self.state.argmax, 8).await.map_err(|e| e.0)?;
        Ok(u32::from_le_bytes(bytes[..4].try_into().unwrap()))
    }

    /// The routing of the last step, per MoE layer (read back from the GPU; for checks against references,
    /// where a near-tie in routing may legitimately go the other way).
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
        let extends = tokens.len() > self.tokens.len() && tokens.starts_with(&self.tokens);
        if !extends {
            self.reset();
        }
        let start = self.tokens.len();
        let mut logits = Vec::new();
        for (i, &t) in tokens[start..].iter().enumerate() {
            if start + i + 1 == tokens.len() {
                logits = self.step(t).await?;
            } else {
                let pos = self.tokens.len() as u32;
                forward::record_step(&self.gpu, &self.config, &self.weights, &self.pool, &self.state, t, pos)?;
                self.tokens.push(t);
            }
        }
        Ok(logits)
    }
}
