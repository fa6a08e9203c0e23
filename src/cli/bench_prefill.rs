//! `lingtab bench-prefill`: one prompt fed token by token and in chunks of each size asked for, on one load;
//! prints the prompt rate, µs per token per layer and the speedup over token by token, and with `--pool` (experts
//! streamed into a pool of that fraction of the model's experts) the store bytes read per prompt token.

use super::run::ModelPath;
use crate::engine::{EngineOptions, Policy, Upload};

#[derive(clap::Args, Debug)]
pub struct BenchPrefillArgs {
    /// Prompt tokens
    #[arg(long, default_value_t = 2048)]
    pub tokens: usize,
    /// Chunk sizes to run, comma-separated; 1 = token by token (the baseline, run first)
    #[arg(long, default_value = "1,64,256")]
    pub chunks: String,
    /// Tokens of the token-by-token run (default: all of them); its rate stands for the whole prompt's
    #[arg(long)]
    pub baseline_tokens: Option<usize>,
    /// Stream experts into a pool of this fraction of the model's experts (default: all resident)
    #[arg(long)]
    pub pool: Option<f64>,
    /// Tokens per span (run layer by layer at once)
    #[arg(long)]
    pub span: Option<usize>,
    /// Runs per chunk size (the best is reported; the first run also compiles the kernels)
    #[arg(long, default_value_t = 2)]
    pub repeat: usize,
    /// Print the rows as JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(serde::Serialize)]
struct Row {
    chunk: usize,
    span: usize,
    tokens: usize,
    seconds: f64,
    tokens_per_s: f64,
    us_per_token_per_layer: f64,
    speedup: f64,
    mb_read_per_token: f64,
    read_reduction: f64,
    syncs: u64,
    submits: u64,
}

pub fn run(model: &ModelPath, args: &BenchPrefillArgs, options: &EngineOptions) -> Result<(), String> {
    let mut chunks: Vec<usize> = args.chunks.split(',').map(|s| s.trim().parse::<usize>().map_err(|_| format!("--chunks: {s:?} is not a number"))).collect::<Result<_, _>>()?;
    chunks.sort_unstable();
    chunks.dedup();
    let open = match args.pool {
        Some(_) => EngineOptions { pool_slots: Some(0), ..options.clone() },
        None => options.clone(),
    };
    let mut engine = model.load(&EngineOptions { n_ctx: Some(options.n_ctx.unwrap_or(0).max(args.tokens)), ..open })?;
    let vocab = engine.vocab_size() as u32;
    // a fixed pseudo-random prompt (the routing, and so the experts read, depend on it)
    let prompt: Vec<u32> = (0..args.tokens as u64).map(|i| ((i * 2654435761 + 12345) % vocab as u64) as u32).collect();
    let layers = engine.config.n_layer as f64;
    let total_experts = engine.config.moe_layers().count() as u64 * engine.config.n_expert as u64;
    let mut rows: Vec<Row> = Vec::new();
    for &chunk in &chunks {
        let n = if chunk == 1 { args.baseline_tokens.unwrap_or(args.tokens).clamp(2, args.tokens) } else { args.tokens };
        let mut best: Option<Row> = None;
        for _ in 0..args.repeat.max(1) {
            engine.set_prefill(chunk, args.span)?;
            if let Some(fraction) = args.pool {
                let slots = ((fraction * total_experts as f64).round() as u32).max(engine.config.n_expert_used as u32);
                engine.set_pool(slots, options.policy.unwrap_or(Policy::DEFAULT), options.upload.unwrap_or(Upload::WriteBuffer))?;
            }
            engine.reset_stats();
            let began = crate::clock::now_s();
            pollster::block_on(engine.feed(&prompt[..n]))?;
            let secs = crate::clock::now_s() - began;
            let s = engine.stats();
            let row = Row {
                chunk: engine.prefill_chunk(),
                span: engine.prefill_span(),
                tokens: n,
                seconds: secs,
                tokens_per_s: n as f64 / secs,
                us_per_token_per_layer: 1e6 * secs / n as f64 / layers,
                speedup: 0.0,
                mb_read_per_token: s.bytes_read as f64 / n as f64 / 1e6,
                read_reduction: 0.0,
                syncs: s.syncs,
                submits: s.submits,
            };
            if best.as_ref().is_none_or(|b| row.seconds < b.seconds) {
                best = Some(row);
            }
        }
        rows.push(best.unwrap());
    }
    let (base_rate, base_read) = (rows[0].tokens_per_s, rows[0].mb_read_per_token);
    for r in &mut rows {
        r.speedup = r.tokens_per_s / base_rate;
        r.read_reduction = if r.mb_read_per_token > 0.0 { base_read / r.mb_read_per_token } else { 0.0 };
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows).unwrap());
        return Ok(());
    }
    println!("prefill of {} tokens, {} layers, experts {} on {}", args.tokens, layers, match args.pool {
        Some(f) => format!("streamed into a pool of {:.1}% of them", 100.0 * f),
        None => "resident".to_string(),
    }, engine.gpu.summary);
    println!("{:>6} {:>6} {:>7} {:>9} {:>10} {:>14} {:>8} {:>10} {:>9} {:>6} {:>8}", "chunk", "span", "tokens", "seconds", "tok/s", "µs/tok/layer", "speedup", "MB read/tok", "read ÷", "syncs", "submits");
    for r in &rows {
        println!(
            "{:>6} {:>6} {:>7} {:>9.3} {:>10.1} {:>14.2} {:>7.1}× {:>10.3} {:>8.1}× {:>6} {:>8}",
            r.chunk, r.span, r.tokens, r.seconds, r.tokens_per_s, r.us_per_token_per_layer, r.speedup, r.mb_read_per_token, r.read_reduction, r.syncs, r.submits
        );
    }
    Ok(())
}
