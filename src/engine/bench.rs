//! The benchmark behind `lingtab bench` and the browser's `bench()`: prefill and decode on a loaded engine,
//! with what each token cost: GPU↔CPU syncs, dispatches, submissions, store bytes read and uploaded, cache
//! hits. Rows of one table; the same code natively and in the browser, so the two tables compare.

use super::Engine;
use crate::clock::now_s;
use crate::gpu::kernel::KernelTime;
use crate::gpu::{bandwidth, Gpu, GpuCounters, Pass};

/// What to run on each engine.
#[derive(Clone, Debug)]
pub struct BenchPlan {
    /// Prompt lengths (tokens) to prefill.
    pub prompts: Vec<usize>,
    /// Tokens decoded (greedy) after each prompt.
    pub decode: usize,
    /// Prefill chunk sizes to compare; 1 is token by token, the baseline (run first).
    pub chunks: Vec<usize>,
    /// Seed of the prompts' token ids.
    pub seed: u64,
}

#[derive(Clone, Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BenchRow {
    /// "resident" or the streaming pool ("pool 5%").
    pub mode: String,
    /// "prefill" or "decode".
    pub phase: String,
    /// The prompt's length (for decode: the context the decode starts from).
    pub prompt: usize,
    /// Prefill chunk (1 = token by token); decode rows have 1.
    pub chunk: usize,
    pub tokens: u64,
    pub seconds: f64,
    pub tokens_per_s: f64,
    pub ms_per_token: f64,
    /// µs per token per trunk layer (the head's share included), to set beside per-layer figures of other engines.
    pub us_per_token_per_layer: f64,
    /// Prefill: tok/s over the token-by-token prefill of the same prompt in the same run.
    pub speedup: Option<f64>,
    pub syncs_per_token: f64,
    pub dispatches_per_token: f64,
    pub submits_per_token: f64,
    /// CPU time per token spent encoding and submitting the recorded dispatches (bind groups, command buffers).
    pub encode_ms_per_token: f64,
    /// Time per token the CPU waited in readbacks for the GPU; ms_per_token less this is CPU time the GPU
    /// did not overlap (recording, encoding, the expert cache, store reads).
    pub wait_ms_per_token: f64,
    pub mb_read_per_token: f64,
    pub mb_uploaded_per_token: f64,
    pub hit_rate: f64,
    /// Decode: bytes a token must read ÷ the bandwidth measured in this run, and ms/token over it.
    pub floor_ms_per_token: Option<f64>,
    pub times_floor: Option<f64>,
    /// With the GPU profiling (`lingtab bench --profile`): time by kernel, slowest first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub kernels: Vec<KernelTime>,
    /// With a timeline recorded (`lingtab bench --timeline`): where the GPU's time went in the stream itself.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeline: Option<crate::gpu::timeline::Timeline>,
}

/// Token ids for a prompt: a seeded stream over the vocabulary (the engine's speed does not depend on them,
/// and the same seed gives every mode the same prompt).
pub fn prompt_tokens(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % vocab as u64) as u32
        })
        .collect()
}

struct Mark {
    at: f64,
    gpu: GpuCounters,
}

fn mark(engine: &Engine) -> Mark {
    // what ran before the stretch is not the stretch's
    engine.gpu.take_profile();
    engine.gpu.discard_timeline();
    Mark { at: now_s(), gpu: engine.gpu.counters() }
}

fn row(engine: &Engine, mode: &str, phase: &str, prompt: usize, chunk: usize, tokens: u64, since: Mark) -> BenchRow {
    let seconds = now_s() - since.at;
    let c = engine.gpu.counters();
    let s = engine.stats();
    let n = tokens.max(1) as f64;
    BenchRow {
        mode: mode.into(),
        phase: phase.into(),
        prompt,
        chunk,
        tokens,
        seconds,
        tokens_per_s: n / seconds,
        ms_per_token: 1e3 * seconds / n,
        us_per_token_per_layer: 1e6 * seconds / n / engine.config.n_layer.max(1) as f64,
        speedup: None,
        syncs_per_token: (c.readbacks - since.gpu.readbacks) as f64 / n,
        dispatches_per_token: (c.dispatches - since.gpu.dispatches) as f64 / n,
        submits_per_token: (c.submits - since.gpu.submits) as f64 / n,
        encode_ms_per_token: 1e3 * (c.encode_s - since.gpu.encode_s) / n,
        wait_ms_per_token: 1e3 * (c.wait_s - since.gpu.wait_s) / n,
        mb_read_per_token: s.bytes_read as f64 / n / 1e6,
        mb_uploaded_per_token: s.bytes_uploaded as f64 / n / 1e6,
        hit_rate: s.hit_rate(),
        floor_ms_per_token: None,
        times_floor: None,
        kernels: engine.gpu.take_profile(),
        timeline: None,
    }
}

/// Speeds of a broken forward pass mean nothing: logits that are not all finite are an error.
fn check_finite(logits: &[f32], what: &str) -> Result<(), String> {
    match logits.iter().filter(|v| !v.is_finite()).count() {
        0 => Ok(()),
        n => Err(format!("{what}: {n} of {} logits are not finite", logits.len())),
    }
}

/// Runs `plan` on `engine`, appending rows labelled `mode`. A streaming engine starts every prefill from an
/// empty pool, so chunk sizes compare on equal terms. `bandwidth_gbs` (from [`read_bandwidth`]) gives the
/// decode rows their floor.
pub async fn run(engine: &mut Engine, mode: &str, plan: &BenchPlan, bandwidth_gbs: Option<f64>, rows: &mut Vec<BenchRow>) -> Result<(), String> {
    let vocab = engine.vocab_size();
    if let Some(&prompt) = plan.prompts.iter().find(|&&p| p + plan.decode > engine.n_ctx) {
        return Err(format!("a prompt of {prompt} tokens and {} decoded do not fit the context of {} tokens (--ctx)", plan.decode, engine.n_ctx));
    }
    // a warm-up through every path the rows time (each chunk size, a decode step), so that no row pays for
    // compiling pipelines or first allocations
    for &chunk in &plan.chunks {
        engine.set_prefill(chunk, None)?;
        let warm = prompt_tokens((2 * chunk + 1).min(engine.n_ctx.saturating_sub(2)).max(1), vocab, plan.seed ^ 0x5eed);
        let logits = engine.feed(&warm).await?;
        engine.step_argmax(crate::generate::sampler::argmax(&logits)).await?;
    }
    for &prompt in &plan.prompts {
        let tokens = prompt_tokens(prompt, vocab, plan.seed);
        let mut baseline: Option<f64> = None;
        let mut logits = Vec::new();
        for &chunk in &plan.chunks {
            engine.reset();
            if engine.is_streaming() {
                engine.empty_pool()?;
            }
            engine.set_prefill(chunk, None)?;
            let chunk = engine.prefill_chunk();
            engine.reset_stats();
            let since = mark(engine);
            logits = engine.feed(&tokens).await?;
            let mut r = row(engine, mode, "prefill", prompt, chunk, prompt as u64, since);
            check_finite(&logits, &format!("{mode}, a prompt of {prompt} tokens in chunks of {chunk}"))?;
            r.timeline = engine.gpu.take_timeline().await?;
            if chunk == 1 {
                baseline = Some(r.tokens_per_s);
            }
            r.speedup = baseline.map(|b| r.tokens_per_s / b);
            rows.push(r);
        }
        if plan.decode == 0 {
            continue;
        }
        let mut next = crate::generate::sampler::argmax(&logits);
        engine.reset_stats();
        let since = mark(engine);
        for _ in 0..plan.decode {
            next = engine.next_greedy(next).await?;
        }
        let mut r = row(engine, mode, "decode", prompt, 1, plan.decode as u64, since);
        r.timeline = engine.gpu.take_timeline().await?;
        if let Some(gbs) = bandwidth_gbs {
            let floor = 1e3 * engine.min_bytes_per_token() as f64 / (gbs * 1e9);
            r.floor_ms_per_token = Some(floor);
            r.times_floor = Some(r.ms_per_token / floor);
        }
        rows.push(r);
    }
    Ok(())
}

/// The adapter's memory-read rate in GB/s: the best of `rounds` rounds (and as many more as 0.3 s takes) of `reps`
/// reads of a buffer of up to `max_bytes` (and the adapter's binding limit), each round timed up to one
/// readback, after a warm-up. The best round, because a GPU that has just been idle (a model load) reads at half
/// speed or less until its clocks ramp up, and the floor must be what the memory can do.
pub async fn read_bandwidth(gpu: &Gpu, max_bytes: u64, reps: u32, rounds: u32) -> Result<f64, String> {
    let limits = gpu.device.limits();
    let bytes = max_bytes.min(limits.max_storage_buffer_binding_size as u64).min(limits.max_buffer_size) / 16 * 16;
    let data = gpu.storage_buffer("bandwidth data", bytes);
    let out = gpu.storage_buffer("bandwidth out", 16);
    let workgroups = 8192;
    let mut warm = Pass::new();
    bandwidth::read_all(gpu, &mut warm, &data, bytes, &out, workgroups);
    warm.submit(gpu);
    let mut best = 0f64;
    let mut result = gpu.read_back(&out, 4).await.map(|_| ()).map_err(|e| e.0);
    // rounds go on for at least MIN_SECONDS, so that a GPU that has just been idle has time to raise its clocks
    const MIN_SECONDS: f64 = 0.3;
    let start = now_s();
    let mut done = 0;
    while done < rounds.max(1) || (now_s() - start < MIN_SECONDS && done < 1000) {
        done += 1;
        if result.is_err() {
            break;
        }
        let began = now_s();
        let mut pass = Pass::new();
        for _ in 0..reps {
            bandwidth::read_all(gpu, &mut pass, &data, bytes, &out, workgroups);
        }
        pass.submit(gpu);
        result = gpu.read_back(&out, 4).await.map(|_| ()).map_err(|e| e.0);
        best = best.max(reps as f64 * bytes as f64 / (now_s() - began) / 1e9);
    }
    // the kept bind groups would keep the data buffer alive
    gpu.forget_bindings();
    result?;
    Ok(best)
}

/// The rows as a fixed-width table.
pub fn table(rows: &[BenchRow]) -> String {
    let mut out = format!(
        "{:<12} {:<8} {:>6} {:>5} {:>9} {:>9} {:>9} {:>8} {:>7} {:>7} {:>9} {:>7} {:>7} {:>7} {:>8} {:>8} {:>8} {:>6}\n",
        "mode", "phase", "prompt", "chunk", "tok/s", "ms/tok", "µs/tok/L", "speedup", "syncs", "submits", "dispatch", "enc ms", "wait ms", "MB rd", "MB up", "hit %", "floor ms", "×floor"
    );
    let opt = |v: Option<f64>, digits: usize| v.map(|v| format!("{v:.digits$}")).unwrap_or_else(|| "-".into());
    for r in rows {
        out += &format!(
            "{:<12} {:<8} {:>6} {:>5} {:>9.1} {:>9.3} {:>9.1} {:>8} {:>7.2} {:>7.2} {:>9.1} {:>7.3} {:>7.3} {:>7.2} {:>8.2} {:>8.1} {:>8} {:>6}\n",
            r.mode,
            r.phase,
            r.prompt,
            r.chunk,
            r.tokens_per_s,
            r.ms_per_token,
            r.us_per_token_per_layer,
            opt(r.speedup, 1),
            r.syncs_per_token,
            r.submits_per_token,
            r.dispatches_per_token,
            r.encode_ms_per_token,
            r.wait_ms_per_token,
            r.mb_read_per_token,
            r.mb_uploaded_per_token,
            100.0 * r.hit_rate,
            opt(r.floor_ms_per_token, 3),
            opt(r.times_floor, 1),
        );
    }
    out
}

/// Each row's timeline ([`crate::gpu::timeline`]): the GPU's time per token in its submissions and between them,
/// then the `top` kernels by their time in the stream.
pub fn timeline_table(rows: &[BenchRow], top: usize) -> String {
    let mut out = String::new();
    for r in rows {
        let Some(t) = &r.timeline else { continue };
        let n = r.tokens.max(1) as f64;
        out += &format!(
            "{} {} prompt {} chunk {}: GPU {:.3} ms/tok in submissions, {:.3} ms/tok idle between them ({:.3} ms/tok measured with the timestamps)\n",
            r.mode, r.phase, r.prompt, r.chunk, t.busy_ms / n, t.idle_ms / n, r.ms_per_token
        );
        for (heading, times) in [("by kernel", &t.kernels), ("by kernel and workgroup grid", &t.grids)] {
            out += &format!("  {heading}:\n");
            for k in times.iter().take(top) {
                out += &format!(
                    "  {:>6.1}%  {:>9.3} ms/tok  {:>8.1} dispatches/tok  {:>8.1} µs each  {}\n",
                    100.0 * k.ms / t.busy_ms.max(1e-12),
                    k.ms / n,
                    k.dispatches as f64 / n,
                    1e3 * k.ms / k.dispatches.max(1) as f64,
                    k.kernel
                );
            }
        }
    }
    out
}

/// Each profiled row's kernels (the `top` slowest), under the row's name.
pub fn profile_table(rows: &[BenchRow], top: usize) -> String {
    let mut out = String::new();
    for r in rows.iter().filter(|r| !r.kernels.is_empty()) {
        let total: f64 = r.kernels.iter().map(|k| k.ms).sum();
        out += &format!("{} {} prompt {} chunk {}: {:.3} ms of GPU work per token\n", r.mode, r.phase, r.prompt, r.chunk, total / r.tokens.max(1) as f64);
        for k in r.kernels.iter().take(top) {
            out += &format!("  {:>6.1}%  {:>9.3} ms/tok  {:>8.1} dispatches/tok  {}\n", 100.0 * k.ms / total.max(1e-12), k.ms / r.tokens.max(1) as f64, k.dispatches as f64 / r.tokens.max(1) as f64, k.kernel);
        }
    }
    out
}
