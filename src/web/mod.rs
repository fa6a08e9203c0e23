//! The JavaScript API (wasm-bindgen), shaped like the APIs web developers know:
//!
//! ```js
//! const engine = await Engine.load({ model: "https://…/model-00001-of-00002.gguf", onProgress, signal });
//! for await (const ev of engine.generate(messages, { maxTokens: 256, temperature: 0.7, signal })) {
//!   output.textContent += ev.text;
//! }
//! ```
//! Errors reach JS as `Error`s with the engine's message, never as panics.

use crate::generate::{FinishReason, GenerateOptions, GenerationState, SamplingOptions, Session};
use crate::gpu::Gpu;
use crate::model::chat::{Message, Role, ToolCall};
use crate::model::summary::summary;
use crate::model::Tokenizer;
use crate::source::{self, HttpSource, Tracked};
use serde::{Deserialize, Serialize};
use std::cell::RefCell;
use std::rc::Rc;
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;

pub mod lock;
pub mod store;

#[wasm_bindgen(start)]
fn start() {
    console_error_panic_hook::set_once();
}

#[wasm_bindgen(typescript_custom_section)]
const TYPES: &str = r#"
/** Where the model comes from and how to load it. */
export interface LoadOptions {
  /** URL of the first GGUF part (the others are found by their -0000N-of-0000M names), or every part's URL. */
  model?: string | string[];
  /** Instead of `model`: the name of a complete store (see `ingest`), loaded from OPFS without the network. */
  store?: string;
  /** Context length in tokens (default: the model's, at most 4096). */
  contextLength?: number;
  /** Largest buffer a kernel may bind, in bytes (default: the adapter's limit). */
  maxBindingBytes?: number;
  /** GPU bytes for the routed-expert pool (default: every expert resident). A smaller pool streams experts from
   * the store (or the URLs) as the router asks for them; at least one token's experts must fit. */
  poolBytes?: number;
  /** Instead of poolBytes: GPU bytes for everything; the pool gets what the dense weights and states leave. */
  gpuBudgetBytes?: number;
  /** Eviction policy of a streaming pool: "hot" (decaying frequency, the default), "hot:0.9", or "lru". */
  policy?: string;
  /** With `store`: how many reader workers read it at once, each with its own read-only OPFS handle (default 4;
   * 0 reads in the engine's own thread). Where reader workers are not available (no read-only sync access
   * handles, a page policy against blob: workers) one reader is used, with a note in the console. */
  readers?: number;
  /** Prompt tokens per chunk of the batched prefill (default 1024; 1 feeds prompts token by token). */
  prefillChunk?: number;
  /** Called as the weights arrive. */
  onProgress?: (progress: LoadProgress) => void;
  /** Aborts the load. */
  signal?: AbortSignal;
}

export interface LoadProgress {
  phase: "header" | "weights";
  /** Bytes read so far. */
  loaded: number;
  /** Bytes to read in all. */
  total: number;
}

export interface ToolCall {
  name: string;
  /** Argument values: strings are rendered as they are, anything else as its JSON text. */
  arguments: Record<string, unknown>;
}

export interface ChatMessage {
  role: "system" | "user" | "assistant" | "tool";
  content: string;
  /** An earlier assistant turn's reasoning (kept in the prompt). */
  reasoning_content?: string;
  tool_calls?: ToolCall[];
}

export interface GenerateOptions {
  /** Tokens to generate at most (default 512). */
  maxTokens?: number;
  /** 0 picks the most likely token (greedy); default 0.8 (llama.cpp's defaults throughout). */
  temperature?: number;
  /** Keep the k most likely tokens (default 40; 0 = off). */
  topK?: number;
  /** Keep the most likely tokens up to this probability mass (default 0.95; 1 = off). */
  topP?: number;
  /** Drop tokens below this fraction of the top token's probability (default 0.05; 0 = off). */
  minP?: number;
  /** Divide the logits of recent tokens by this (default 1 = off). */
  repetitionPenalty?: number;
  /** Subtract this from the logits of recent tokens (default 0 = off). */
  presencePenalty?: number;
  /** Seed of the sampler: the same seed, prompt and options give the same reply. */
  seed?: number;
  /** Let the model reason in <think>…</think> first (default true). */
  thinking?: boolean;
  /** Strings that end the reply (not included in it). */
  stop?: string[];
  /** Aborts the generation within one token; the engine stays usable. */
  signal?: AbortSignal;
}

export type FinishReason = "stop" | "stop_string" | "length" | "abort" | "context_full";

export interface GenerateEvent {
  /** New answer text (valid UTF-8: a character split across tokens waits for its last byte). */
  text: string;
  /** New reasoning text (inside <think>…</think>). */
  reasoning: string;
  /** The token this event came from (null on a final event without a token). */
  token: number | null;
  /** Set on the last event. */
  finishReason: FinishReason | null;
}

export interface BenchOptions {
  /** Prompt lengths (tokens) to prefill (default [128, 512]); each must fit the context with `decode`. */
  prompts?: number[];
  /** Tokens decoded (greedy) after each prompt (default 32). */
  decode?: number;
  /** Prefill chunk sizes to compare (default [1, 1024]; 1, token by token, is the baseline and runs first). */
  chunks?: number[];
  /** Seed of the prompts' token ids (default 1). */
  seed?: number;
  /** Big tiles (chunks of over 64 tokens) multiply in f16 where the adapter has `shader-f16` (default true);
   * false runs the f32 path, to compare. */
  f16?: boolean;
  /** A greedy decode submits each step before its pick is read back (default true); false steps and reads each
   * pick in turn, to compare. */
  runAhead?: boolean;
}

export interface BenchRow {
  mode: string; phase: "prefill" | "decode"; prompt: number; chunk: number; tokens: number; seconds: number;
  tokensPerS: number; msPerToken: number; usPerTokenPerLayer: number; speedup: number | null; syncsPerToken: number; dispatchesPerToken: number;
  submitsPerToken: number; encodeMsPerToken: number; waitMsPerToken: number; mbReadPerToken: number; mbUploadedPerToken: number; hitRate: number;
  floorMsPerToken: number | null; timesFloor: number | null;
}

/** What `Engine.bench` measured: the rows, the same table `lingtab bench` prints, and the memory-read rate. */
export interface BenchResult {
  bandwidthGBs: number;
  rows: BenchRow[];
  table: string;
}

export interface EngineStats {
  adapter: string;
  contextLength: number;
  /** Tokens the engine's state holds (prompt and reply). */
  position: number;
  promptTokens: number;
  generatedTokens: number;
  /** Generated tokens per second in the last generation. */
  tokensPerSecond: number;
  /** Prompt tokens per second in the last generation. */
  promptTokensPerSecond: number;
  /** The expert cache since the load ("resident" policy: every expert on the GPU, nothing streamed). */
  experts: ExpertCacheStats;
  /** GPU memory by what it holds. */
  gpuBytes: { denseWeights: number; expertPool: number; states: number };
}

export interface ExpertCacheStats {
  policy: string;
  poolSlots: number;
  slotBytes: number;
  /** Steps run (prompt and generated tokens). */
  tokens: number;
  hits: number;
  misses: number;
  evictions: number;
  /** hits / (hits + misses) */
  hitRate: number;
  /** Per trunk layer (dense layers stay 0). */
  layerHits: number[];
  layerMisses: number[];
  bytesRead: number;
  bytesUploaded: number;
  /** Seconds reading records, uploading them, and waiting for the GPU's routing. */
  readS: number;
  uploadS: number;
  waitS: number;
  /** GPU↔CPU round trips and command submissions. */
  syncs: number;
  submits: number;
}
"#;

/// Reader workers of a store by default: several reads at once (an SSD serves them in parallel), few enough
/// that their threads stay cheap.
const DEFAULT_READERS: usize = 4;
const MAX_READERS: usize = 32;

fn js_error(msg: impl AsRef<str>) -> JsError {
    JsError::new(msg.as_ref())
}

fn to_js<T: Serialize>(value: &T) -> Result<JsValue, JsError> {
    value.serialize(&serde_wasm_bindgen::Serializer::json_compatible()).map_err(|e| js_error(e.to_string()))
}

fn now_ms() -> f64 {
    crate::clock::now_s() * 1000.0
}

/// The engine's expert-cache counters as JS sees them (`ExpertCacheStats`, with the hit rate).
fn expert_stats(engine: &crate::engine::Engine) -> serde_json::Value {
    let cache = engine.stats();
    let mut experts = serde_json::to_value(cache).unwrap_or_default();
    experts["hitRate"] = cache.hit_rate().into();
    experts
}

fn get(obj: &JsValue, key: &str) -> Option<JsValue> {
    js_sys::Reflect::get(obj, &JsValue::from_str(key)).ok().filter(|v| !v.is_undefined() && !v.is_null())
}

fn aborted(signal: &Option<JsValue>) -> bool {
    signal.as_ref().and_then(|s| get(s, "aborted")).and_then(|v| v.as_bool()).unwrap_or(false)
}

/// The WebGPU adapter lingtab would run on: name, backend, limits and features.
#[wasm_bindgen(js_name = adapterInfo)]
pub async fn adapter_info() -> Result<JsValue, JsError> {
    let gpu = Gpu::new().await.map_err(|e| js_error(e.0))?;
    to_js(&gpu.summary)
}

/// Reads a (split) GGUF's headers over HTTP Range requests from the URL of its first part and describes the
/// model: architecture, config, parts, tensors and byte totals (the object `lingtab inspect --json` prints).
#[wasm_bindgen(js_name = inspectModel)]
pub async fn inspect_model(first_part_url: String) -> Result<JsValue, JsError> {
    let model = source::open_model(&first_part_url, |url| Ok(HttpSource::new(url))).await.map_err(|e| js_error(&e))?;
    to_js(&summary(&model, false).map_err(|e| js_error(&e))?)
}

#[derive(Default, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
struct Stats {
    adapter: String,
    context_length: usize,
    position: usize,
    prompt_tokens: usize,
    generated_tokens: usize,
    tokens_per_second: f64,
    prompt_tokens_per_second: f64,
    experts: serde_json::Value,
    gpu_bytes: Option<crate::engine::GpuBytes>,
}

/// A loaded model, ready to generate. One generation at a time.
#[wasm_bindgen]
pub struct Engine {
    /// `None` while a generation holds the session (or after `dispose`).
    session: Rc<RefCell<Option<Session>>>,
    stats: Rc<RefCell<Stats>>,
    disposed: Rc<RefCell<bool>>,
    /// The store's lock, shared, while the engine lives (loaded from a store): no ingest or delete meanwhile.
    store_lock: RefCell<Option<lock::StoreLock>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct JsGenerateOptions {
    max_tokens: Option<f64>,
    temperature: Option<f64>,
    top_k: Option<f64>,
    top_p: Option<f64>,
    min_p: Option<f64>,
    repetition_penalty: Option<f64>,
    presence_penalty: Option<f64>,
    seed: Option<f64>,
    thinking: Option<bool>,
    stop: Option<Vec<String>>,
}

#[derive(Deserialize)]
struct JsToolCall {
    name: String,
    #[serde(default)]
    arguments: serde_json::Map<String, serde_json::Value>,
}

#[derive(Deserialize)]
struct JsMessage {
    role: String,
    #[serde(default)]
    content: String,
    reasoning_content: Option<String>,
    #[serde(default)]
    tool_calls: Vec<JsToolCall>,
}

fn parse_messages(messages: JsValue) -> Result<Vec<Message>, JsError> {
    let parsed: Vec<JsMessage> = serde_wasm_bindgen::from_value(messages)
        .map_err(|e| js_error(format!("messages must be an array of {{role, content}} objects: {e}")))?;
    parsed
        .into_iter()
        .map(|m| {
            let role: Role = m.role.parse().map_err(js_error)?;
            let mut msg = Message::new(role, m.content);
            msg.reasoning = m.reasoning_content;
            msg.tool_calls = m
                .tool_calls
                .into_iter()
                .map(|c| ToolCall {
                    name: c.name,
                    arguments: c.arguments.into_iter().map(|(k, v)| (k, v.as_str().map(str::to_string).unwrap_or_else(|| v.to_string()))).collect(),
                })
                .collect();
            Ok(msg)
        })
        .collect()
}

/// Finite, in range, integral where it must be: a bad option is an error, never a silent default.
fn parse_generate_options(options: &JsValue) -> Result<GenerateOptions, JsError> {
    let o: JsGenerateOptions = if options.is_undefined() || options.is_null() {
        serde_json::from_str("{}").unwrap()
    } else {
        serde_wasm_bindgen::from_value(options.clone()).map_err(|e| js_error(format!("generate options: {e}")))?
    };
    let count = |name: &str, v: Option<f64>, default: usize| -> Result<usize, JsError> {
        match v {
            None => Ok(default),
            Some(x) if x.is_finite() && x >= 0.0 && x.fract() == 0.0 => Ok(x as usize),
            Some(x) => Err(js_error(format!("{name} must be a non-negative integer, got {x}"))),
        }
    };
    let mut sampling = SamplingOptions::default();
    if let Some(t) = o.temperature {
        sampling.temperature = t as f32;
    }
    sampling.top_k = count("topK", o.top_k, sampling.top_k)?;
    if let Some(p) = o.top_p {
        sampling.top_p = p as f32;
    }
    if let Some(p) = o.min_p {
        sampling.min_p = p as f32;
    }
    if let Some(p) = o.repetition_penalty {
        sampling.repetition_penalty = p as f32;
    }
    if let Some(p) = o.presence_penalty {
        sampling.presence_penalty = p as f32;
    }
    if let Some(seed) = o.seed {
        sampling.seed = count("seed", Some(seed), 0)? as u64;
    }
    sampling.validate().map_err(js_error)?;
    let max_tokens = count("maxTokens", o.max_tokens, 512)?;
    if max_tokens == 0 {
        return Err(js_error("maxTokens must be at least 1"));
    }
    Ok(GenerateOptions { max_tokens, sampling, stop: o.stop.unwrap_or_default(), thinking: o.thinking.unwrap_or(true) })
}

/// `BenchOptions` as the bench's plan, each value checked.
fn parse_bench_options(options: &JsValue) -> Result<crate::engine::bench::BenchPlan, JsError> {
    let count = |key: &str, v: &JsValue| -> Result<usize, JsError> {
        v.as_f64().filter(|x| x.fract() == 0.0 && *x >= 0.0 && *x <= 1e7).map(|x| x as usize).ok_or_else(|| js_error(format!("bench: {key} must hold whole numbers of tokens, not {v:?}")))
    };
    let list = |key: &str, default: &[usize]| -> Result<Vec<usize>, JsError> {
        match get(options, key) {
            None => Ok(default.to_vec()),
            Some(v) if js_sys::Array::is_array(&v) => js_sys::Array::from(&v).iter().map(|x| count(key, &x)).collect(),
            Some(v) => Err(js_error(format!("bench: {key} must be an array of numbers, not {v:?}"))),
        }
    };
    let prompts = list("prompts", &[128, 512])?;
    if prompts.iter().any(|&p| p == 0) {
        return Err(js_error("bench: a prompt holds at least one token"));
    }
    let mut chunks = vec![1];
    for c in list("chunks", &[1, crate::engine::DEFAULT_PREFILL_CHUNK])? {
        if c == 0 {
            return Err(js_error("bench: a chunk holds at least one token"));
        }
        if !chunks.contains(&c) {
            chunks.push(c);
        }
    }
    let decode = get(options, "decode").map(|v| count("decode", &v)).transpose()?.unwrap_or(32);
    let seed = get(options, "seed").map(|v| count("seed", &v)).transpose()?.unwrap_or(1) as u64;
    Ok(crate::engine::bench::BenchPlan { prompts, decode, chunks, seed })
}

/// A boolean of `BenchOptions` (`f16`: whether big tiles may multiply in f16; `runAhead`: whether decode steps run
/// ahead of their picks' readback), default true.
fn parse_bench_flag(options: &JsValue, name: &str) -> Result<bool, JsError> {
    match get(options, name) {
        None => Ok(true),
        Some(v) => v.as_bool().ok_or_else(|| js_error(format!("bench: {name} must be true or false, not {v:?}"))),
    }
}

#[wasm_bindgen]
impl Engine {
    /// Loads a model onto the WebGPU device: its GGUF headers and weights over HTTP Range requests (`model`), or
    /// from a complete OPFS store without the network (`store`).
    #[wasm_bindgen(unchecked_return_type = "Engine")]
    pub async fn load(#[wasm_bindgen(unchecked_param_type = "LoadOptions")] options: JsValue) -> Result<Engine, JsError> {
        let store_name = match get(&options, "store") {
            None => None,
            Some(v) => Some(v.as_string().ok_or_else(|| js_error("options.store must be the name of a store"))?),
        };
        let model_opt = get(&options, "model");
        if store_name.is_some() && model_opt.is_some() {
            return Err(js_error("Engine.load: give options.model or options.store, not both"));
        }
        let urls: Vec<String> = match (&model_opt, &store_name) {
            (_, Some(_)) => Vec::new(),
            (None, None) => {
                return Err(js_error("Engine.load: options.model (the URL of the first GGUF part) or options.store (the name of a complete store) is required"))
            }
            (Some(m), None) => match m.as_string() {
                Some(s) => crate::gguf::split_part_names(&s).map_err(|e| js_error(e.to_string()))?,
                None => serde_wasm_bindgen::from_value(m.clone()).map_err(|_| js_error("options.model must be a URL or an array of URLs"))?,
            },
        };
        let signal = get(&options, "signal");
        let on_progress = get(&options, "onProgress").and_then(|f| f.dyn_into::<js_sys::Function>().ok());
        let mut engine_options = crate::engine::EngineOptions::default();
        let positive = |name: &str| -> Result<Option<u64>, JsError> {
            match get(&options, name).map(|v| v.as_f64()) {
                None => Ok(None),
                Some(Some(x)) if x.is_finite() && x >= 1.0 && x.fract() == 0.0 => Ok(Some(x as u64)),
                Some(Some(x)) => Err(js_error(format!("options.{name} must be a positive integer, not {x}"))),
                Some(None) => Err(js_error(format!("options.{name} must be a positive integer, not a {}", get(&options, name).and_then(|v| v.js_typeof().as_string()).unwrap_or_default()))),
            }
        };
        engine_options.n_ctx = positive("contextLength")?.map(|x| x as usize);
        engine_options.max_binding = positive("maxBindingBytes")?;
        engine_options.pool_bytes = positive("poolBytes")?;
        engine_options.gpu_budget_bytes = positive("gpuBudgetBytes")?;
        engine_options.prefill_chunk = positive("prefillChunk")?.map(|x| x as usize);
        if let Some(p) = get(&options, "policy") {
            let p = p.as_string().ok_or_else(|| js_error("options.policy must be \"lru\", \"hot\" or \"hot:DECAY\""))?;
            engine_options.policy = Some(crate::engine::Policy::parse(&p).map_err(js_error)?);
        }
        let streams = engine_options.pool_bytes.is_some() || engine_options.gpu_budget_bytes.is_some();
        let readers = match get(&options, "readers").map(|v| v.as_f64()) {
            None => DEFAULT_READERS,
            Some(Some(x)) if x.is_finite() && (0.0..=MAX_READERS as f64).contains(&x) && x.fract() == 0.0 => x as usize,
            Some(_) => return Err(js_error(format!("options.readers must be a whole number from 0 to {MAX_READERS}"))),
        };

        let report = |phase: &str, loaded: u64, total: u64| {
            if let Some(f) = &on_progress {
                let ev = js_sys::Object::new();
                let _ = js_sys::Reflect::set(&ev, &"phase".into(), &phase.into());
                let _ = js_sys::Reflect::set(&ev, &"loaded".into(), &(loaded as f64).into());
                let _ = js_sys::Reflect::set(&ev, &"total".into(), &(total as f64).into());
                let _ = f.call1(&JsValue::NULL, &ev);
            }
        };
        if aborted(&signal) {
            return Err(js_error("Engine.load was aborted"));
        }
        report("header", 0, 0);
        // a complete store: headers and weights from OPFS, no network; held shared while the engine lives
        let store_lock = match &store_name {
            Some(name) => Some(
                lock::lock_store(name, lock::LockMode::Shared, false, None, "load it after that ends")
                    .await
                    .map_err(|e| js_error(format!("Engine.load: {e}")))?,
            ),
            None => None,
        };
        let (model, from_store) = match &store_name {
            Some(name) => {
                let (model, views) = store::open_store(name, readers).await?;
                (model, Some(views))
            }
            None => {
                let first = urls.first().ok_or_else(|| js_error("options.model lists no URL"))?.clone();
                let by_name = urls.clone();
                let model = source::open_model(&first, |url| {
                    // when every part was given, use them in order rather than derived names
                    let i = crate::gguf::split_part_names(&first).ok().and_then(|names| names.iter().position(|n| n == url));
                    Ok(HttpSource::new(i.and_then(|i| by_name.get(i).cloned()).unwrap_or_else(|| url.to_string())))
                })
                .await
                .map_err(js_error)?;
                (model, None)
            }
        };
        let totals = crate::model::layout::Totals::of(&crate::model::Config::from_header(model.header()).map_err(|e| js_error(e.to_string()))?, &model);
        // a streaming pool reads experts as the router asks, not at load
        let total = totals.dense_bytes + if streams { 0 } else { totals.expert_bytes };
        let loaded = Rc::new(RefCell::new(0u64));
        // the same sources serve the expert cache after the load: progress and the load's signal end with it
        let loading = Rc::new(std::cell::Cell::new(true));
        let on_read: Rc<dyn Fn(u64) -> Result<(), String>> = {
            let loaded = loaded.clone();
            let signal = signal.clone();
            let on_progress = on_progress.clone();
            let loading = loading.clone();
            Rc::new(move |n| {
                if !loading.get() {
                    return Ok(());
                }
                *loaded.borrow_mut() += n;
                if let Some(f) = &on_progress {
                    let ev = js_sys::Object::new();
                    let _ = js_sys::Reflect::set(&ev, &"phase".into(), &"weights".into());
                    let _ = js_sys::Reflect::set(&ev, &"loaded".into(), &(*loaded.borrow() as f64).into());
                    let _ = js_sys::Reflect::set(&ev, &"total".into(), &(total as f64).into());
                    let _ = f.call1(&JsValue::NULL, &ev);
                }
                if aborted(&signal) { Err("Engine.load was aborted".to_string()) } else { Ok(()) }
            })
        };
        let gpu = Gpu::new().await.map_err(|e| js_error(e.0))?;
        let adapter = gpu.summary.to_string();
        let engine = match from_store {
            Some(views) => {
                let parts: Vec<_> = views.into_iter().map(|inner| Tracked { inner, on_read: on_read.clone() }).collect();
                let checks = store::store_checks(store_name.as_deref()).await?;
                crate::engine::Engine::open_checked(gpu, &model, parts, checks, &engine_options).await
            }
            None => {
                let parts: Vec<Tracked<HttpSource>> = urls.iter().map(|url| Tracked { inner: HttpSource::new(url.clone()), on_read: on_read.clone() }).collect();
                crate::engine::Engine::open(gpu, &model, parts, &engine_options).await
            }
        }
        .map_err(js_error)?;
        loading.set(false);
        let tokenizer = Tokenizer::from_header(model.header()).map_err(|e| js_error(e.to_string()))?;
        let stats = Stats { adapter, context_length: engine.n_ctx, ..Default::default() };
        Ok(Engine {
            session: Rc::new(RefCell::new(Some(Session::new(engine, tokenizer)))),
            stats: Rc::new(RefCell::new(stats)),
            disposed: Rc::new(RefCell::new(false)),
            store_lock: RefCell::new(store_lock),
        })
    }

    fn check_usable(&self) -> Result<(), JsError> {
        if *self.disposed.borrow() {
            return Err(js_error("this engine was disposed; load a new one"));
        }
        if self.session.borrow().is_none() {
            return Err(js_error("a generation is already running on this engine: finish it, or stop it with its signal or return()"));
        }
        Ok(())
    }

    /// Streams a reply to `messages`: `for await (const ev of engine.generate(messages, options))`.
    #[wasm_bindgen(unchecked_return_type = "AsyncIterableIterator<GenerateEvent>")]
    pub fn generate(
        &self,
        #[wasm_bindgen(unchecked_param_type = "ChatMessage[]")] messages: JsValue,
        #[wasm_bindgen(unchecked_param_type = "GenerateOptions")] options: Option<js_sys::Object>,
    ) -> Result<JsValue, JsError> {
        let options: JsValue = options.map(JsValue::from).unwrap_or(JsValue::UNDEFINED);
        self.check_usable()?;
        let messages = parse_messages(messages)?;
        let generate_options = parse_generate_options(&options)?;
        let signal = get(&options, "signal");
        let mut session = self.session.borrow_mut().take().expect("checked above");
        let state = match session.begin(&messages, generate_options) {
            Ok(state) => state,
            Err(e) => {
                *self.session.borrow_mut() = Some(session);
                return Err(js_error(e));
            }
        };
        let iterator = GenerationStream {
            inner: Rc::new(RefCell::new(IteratorState { session: Some(session), state: Some(state), signal, started: now_ms(), first_token_at: None, returned: false })),
            home: self.session.clone(),
            stats: self.stats.clone(),
            disposed: self.disposed.clone(),
        };
        let value: JsValue = iterator.into();
        // make it async-iterable: obj[Symbol.asyncIterator] = function () { return this }
        let this_fn = js_sys::Function::new_no_args("return this");
        js_sys::Reflect::set(&value, &js_sys::Symbol::async_iterator(), &this_fn).map_err(|_| js_error("cannot make the generation iterable"))?;
        Ok(value)
    }

    /// The token ids the chat template gives for `messages` (what `generate` feeds before its reply).
    #[wasm_bindgen(js_name = promptTokens)]
    pub fn prompt_tokens(
        &self,
        #[wasm_bindgen(unchecked_param_type = "ChatMessage[]")] messages: JsValue,
        thinking: Option<bool>,
    ) -> Result<Vec<u32>, JsError> {
        self.check_usable()?;
        let messages = parse_messages(messages)?;
        let text = crate::model::chat::render(&messages, thinking.unwrap_or(true));
        Ok(self.session.borrow().as_ref().expect("checked").tokenizer.encode(&text, true))
    }

    /// Runs `lingtab bench`'s measurement on this engine: prefill per prompt length and chunk size, then a greedy
    /// decode, with syncs, dispatches, submissions, store bytes and cache hits per token. The conversation is
    /// forgotten (the bench uses the engine's states).
    #[wasm_bindgen(unchecked_return_type = "Promise<BenchResult>")]
    pub fn bench(&self, #[wasm_bindgen(unchecked_param_type = "BenchOptions")] options: JsValue) -> Result<js_sys::Promise, JsError> {
        self.check_usable()?;
        let plan = parse_bench_options(&options)?;
        let f16 = parse_bench_flag(&options, "f16")?;
        let run_ahead = parse_bench_flag(&options, "runAhead")?;
        let mut session = self.session.borrow_mut().take().expect("checked above");
        let home = self.session.clone();
        let disposed = self.disposed.clone();
        Ok(wasm_bindgen_futures::future_to_promise(async move {
            let engine = &mut session.engine;
            let (chunk, span) = (engine.prefill_chunk(), engine.prefill_span());
            let mode = if engine.is_streaming() { format!("pool {}", engine.stats().pool_slots) } else { "resident".to_string() };
            let mut rows = Vec::new();
            engine.gpu.set_f16(f16);
            engine.set_run_ahead(run_ahead);
            let measured = async {
                let bandwidth = crate::engine::bench::read_bandwidth(&engine.gpu, 256 << 20, 10, 3).await?;
                crate::engine::bench::run(engine, &mode, &plan, Some(bandwidth), &mut rows).await?;
                Ok::<f64, String>(bandwidth)
            }
            .await;
            engine.gpu.set_f16(true);
            engine.set_run_ahead(true);
            let restored = engine.set_prefill(chunk, Some(span));
            session.reset();
            if !*disposed.borrow() {
                *home.borrow_mut() = Some(session);
            }
            let bandwidth = measured.map_err(|e| JsValue::from(js_error(e)))?;
            restored.map_err(|e| JsValue::from(js_error(e)))?;
            let table = crate::engine::bench::table(&rows);
            to_js(&serde_json::json!({ "bandwidthGBs": bandwidth, "rows": rows, "table": table })).map_err(JsValue::from)
        }))
    }

    /// Counters of the engine and its last generation.
    #[wasm_bindgen(unchecked_return_type = "EngineStats")]
    pub fn stats(&self) -> Result<JsValue, JsError> {
        let mut stats = self.stats.borrow().clone();
        if let Some(session) = self.session.borrow().as_ref() {
            stats.position = session.engine.position();
            stats.experts = expert_stats(&session.engine);
            stats.gpu_bytes = Some(session.engine.gpu_bytes());
        }
        to_js(&stats)
    }

    /// Forgets the conversation: the next generation starts from an empty state.
    pub fn reset(&self) -> Result<(), JsError> {
        self.check_usable()?;
        self.session.borrow_mut().as_mut().expect("checked").reset();
        Ok(())
    }

    /// Releases the GPU memory (and the store, for an engine loaded from one); the engine cannot be used
    /// afterwards.
    pub fn dispose(&self) {
        *self.disposed.borrow_mut() = true;
        self.session.borrow_mut().take();
        self.store_lock.borrow_mut().take();
    }
}

impl Engine {
    /// Destroys the engine's GPU device, as a driver reset or a crashed GPU process would (for the tests of what
    /// follows: every later call says the device was lost, and a new `Engine.load` works). Not in the JS API.
    #[doc(hidden)]
    pub fn destroy_device_for_tests(&self) {
        if let Some(session) = self.session.borrow().as_ref() {
            session.engine.gpu.device.destroy();
        }
    }
}

struct IteratorState {
    session: Option<Session>,
    state: Option<GenerationState>,
    signal: Option<JsValue>,
    started: f64,
    first_token_at: Option<f64>,
    /// set by `return()`: a `next()` still running hands the session back when it ends
    returned: bool,
}

/// One generation, an async iterator of `GenerateEvent`s (created by `Engine.generate`).
#[wasm_bindgen]
pub struct GenerationStream {
    inner: Rc<RefCell<IteratorState>>,
    home: Rc<RefCell<Option<Session>>>,
    stats: Rc<RefCell<Stats>>,
    /// The engine's: a generation does not go on after `dispose()` (the store it reads is let go of then).
    disposed: Rc<RefCell<bool>>,
}

fn done_result(value: JsValue, done: bool) -> JsValue {
    let r = js_sys::Object::new();
    let _ = js_sys::Reflect::set(&r, &"value".into(), &value);
    let _ = js_sys::Reflect::set(&r, &"done".into(), &done.into());
    r.into()
}

#[wasm_bindgen]
impl GenerationStream {
    /// The next event (`{ value, done }`), as the async-iterator protocol asks.
    pub fn next(&self) -> js_sys::Promise {
        let inner = self.inner.clone();
        let home = self.home.clone();
        let stats = self.stats.clone();
        let disposed = self.disposed.clone();
        wasm_bindgen_futures::future_to_promise(async move {
            if *disposed.borrow() {
                // the engine's GPU memory goes with its session, here rather than when the iterator is collected
                let mut s = inner.borrow_mut();
                s.state = None;
                s.session = None;
                return Err(js_error("this engine was disposed; load a new one").into());
            }
            let (mut session, mut state, signal) = {
                let mut s = inner.borrow_mut();
                let Some(state) = s.state.take() else { return Ok(done_result(JsValue::UNDEFINED, true)) };
                let session = s.session.take().ok_or_else(|| JsValue::from(js_error("next() called again before the previous call finished")))?;
                (session, state, s.signal.clone())
            };
            if aborted(&signal) {
                state.abort();
            }
            let result = state.next(&mut session).await;
            let now = now_ms();
            let mut s = inner.borrow_mut();
            let finished = s.returned || !matches!(&result, Ok(Some(ev)) if ev.finish.is_none());
            {
                let mut st = stats.borrow_mut();
                st.position = session.engine.position();
                // the engine is out of `Engine.session` while a generation runs: its counters are copied here
                st.experts = expert_stats(&session.engine);
                st.gpu_bytes = Some(session.engine.gpu_bytes());
                st.prompt_tokens = state.prompt_tokens().len();
                st.generated_tokens = state.tokens().len();
                // the first call feeds the prompt: its time is the prompt's; later calls are one token each
                let first = *s.first_token_at.get_or_insert(now);
                if first == now {
                    st.prompt_tokens_per_second = st.prompt_tokens as f64 / ((now - s.started) / 1000.0).max(1e-9);
                }
                st.tokens_per_second = (st.generated_tokens.saturating_sub(1)) as f64 / ((now - first) / 1000.0).max(1e-9);
            }
            if *disposed.borrow() {
                // disposed while this step ran: nothing goes back to the engine, the session is freed
                s.state = None;
            } else if finished {
                // the engine is free again
                *home.borrow_mut() = Some(session);
            } else {
                s.session = Some(session);
                s.state = Some(state);
            }
            match result {
                Err(e) => Err(js_error(e).into()),
                Ok(None) => Ok(done_result(JsValue::UNDEFINED, true)),
                Ok(Some(ev)) => {
                    let obj = js_sys::Object::new();
                    let _ = js_sys::Reflect::set(&obj, &"text".into(), &ev.text.into());
                    let _ = js_sys::Reflect::set(&obj, &"reasoning".into(), &ev.reasoning.into());
                    let _ = js_sys::Reflect::set(&obj, &"token".into(), &ev.token.map(|t| JsValue::from(t)).unwrap_or(JsValue::NULL));
                    let finish = ev.finish.map(|f: FinishReason| JsValue::from_str(f.as_str())).unwrap_or(JsValue::NULL);
                    let _ = js_sys::Reflect::set(&obj, &"finishReason".into(), &finish);
                    Ok(done_result(obj.into(), false))
                }
            }
        })
    }

    /// Stops the generation (what `break` in a `for await` loop calls); the engine stays usable.
    #[wasm_bindgen(js_name = "return")]
    pub fn return_(&self) -> js_sys::Promise {
        let mut s = self.inner.borrow_mut();
        s.state = None;
        s.returned = true;
        if let Some(session) = s.session.take() {
            if !*self.disposed.borrow() {
                *self.home.borrow_mut() = Some(session);
            }
        }
        js_sys::Promise::resolve(&done_result(JsValue::UNDEFINED, true))
    }
}
