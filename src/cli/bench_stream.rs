//! `lingtab bench-stream`: the expert cache on one model, for each pool size and eviction policy, on the same
//! tokens (a greedy decode from a fixed prompt; the logits do not depend on the pool, so every run sees the
//! same routing). Prints hit rate, bytes read per token and the time split, with plain LRU as the baseline.

use super::run::ModelPath;
use crate::engine::{EngineOptions, Policy, Upload};

#[derive(clap::Args, Debug)]
pub struct BenchStreamArgs {
    /// Tokens decoded per run (after a 4-token prompt)
    #[arg(long, default_value_t = 128)]
    pub tokens: usize,
    /// Pool sizes as fractions of all the model's experts, comma-separated
    #[arg(long, default_value = "0.02,0.05,0.1,0.25")]
    pub pools: String,
    /// Policies, comma-separated (lru is always run first: it is the baseline)
    #[arg(long, default_value = "lru,hot:0.9,hot:0.7,hot:0.97")]
    pub policies: String,
    /// Upload paths to compare, comma-separated: write (queue.writeBuffer), staging (mapped staging ring)
    #[arg(long, default_value = "write")]
    pub uploads: String,
    /// Print the rows as JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(serde::Serialize)]
struct Row {
    pool_fraction: f64,
    pool_slots: u32,
    pool_mb: f64,
    policy: String,
    upload: String,
    tokens: u64,
    hit_rate: f64,
    hit_rate_vs_lru_points: f64,
    mb_read_per_token: f64,
    read_ms_per_token: f64,
    upload_ms_per_token: f64,
    wait_ms_per_token: f64,
    ms_per_token: f64,
    syncs_per_token: f64,
}

pub fn run(model: &ModelPath, args: &BenchStreamArgs, options: &EngineOptions) -> Result<(), String> {
    let pools: Vec<f64> = args.pools.split(',').map(|s| s.trim().parse::<f64>().map_err(|_| format!("--pools: {s:?} is not a number"))).collect::<Result<_, _>>()?;
    let uploads: Vec<Upload> = args.uploads.split(',').map(|s| Upload::parse(s.trim())).collect::<Result<_, _>>()?;
    let mut policies = vec![Policy::Lru];
    for p in args.policies.split(',') {
        let p = Policy::parse(p.trim())?;
        if !policies.contains(&p) {
            policies.push(p);
        }
    }
    // the smallest pool to open with; each run gets its own with set_pool
    let mut engine = model.load(&EngineOptions { pool_slots: Some(0), ..options.clone() })?;
    if !engine.is_streaming() {
        return Err("the model's experts all fit the smallest pool: nothing to stream".into());
    }
    let total = engine.config.moe_layers().count() as u64 * engine.config.n_expert as u64;
    let prompt = [1u32, 2, 3, 4].map(|t| t % engine.vocab_size() as u32);
    let mut rows: Vec<Row> = Vec::new();
    for &fraction in &pools {
        let slots = ((fraction * total as f64).round() as u32).max(engine.config.n_expert_used as u32);
        let mut lru_hits = 0.0;
        let runs = policies.iter().flat_map(|&p| uploads.iter().map(move |&u| (p, u)));
        for (policy, upload) in runs {
            engine.set_pool(slots, policy, upload)?;
            let began = crate::clock::now_s();
            pollster::block_on(async {
                let mut next = 0;
                for &t in &prompt {
                    next = engine.step_argmax(t).await?;
                }
                for _ in 0..args.tokens {
                    next = engine.step_argmax(next).await?;
                }
                Ok::<(), String>(())
            })?;
            let secs = crate::clock::now_s() - began;
            let s = engine.stats();
            let n = s.tokens.max(1) as f64;
            if policy == Policy::Lru && upload == uploads[0] {
                lru_hits = s.hit_rate();
            }
            rows.push(Row {
                pool_fraction: fraction,
                pool_slots: s.pool_slots,
                pool_mb: s.pool_slots as f64 * s.slot_bytes as f64 / 1e6,
                policy: policy.name(),
                upload: format!("{upload:?}"),
                tokens: s.tokens,
                hit_rate: s.hit_rate(),
                hit_rate_vs_lru_points: 100.0 * (s.hit_rate() - lru_hits),
                mb_read_per_token: s.bytes_read as f64 / n / 1e6,
                read_ms_per_token: 1e3 * s.read_s / n,
                upload_ms_per_token: 1e3 * s.upload_s / n,
                wait_ms_per_token: 1e3 * s.wait_s / n,
                ms_per_token: 1e3 * secs / n,
                syncs_per_token: s.syncs as f64 / n,
            });
            if !args.json {
                print_row(rows.last().unwrap(), rows.len() == 1);
            }
        }
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows).unwrap());
    }
    Ok(())
}

fn print_row(r: &Row, header: bool) {
    if header {
        println!(
            "{:>6} {:>6} {:>9} {:<9} {:<12} {:>6} {:>8} {:>8} {:>9} {:>8} {:>9} {:>8} {:>8} {:>6}",
            "pool%", "slots", "pool MB", "policy", "upload", "tokens", "hit %", "vs LRU", "MB/token", "read ms", "upload ms", "wait ms", "ms/tok", "syncs"
        );
    }
    println!(
        "{:>6.1} {:>6} {:>9.1} {:<9} {:<12} {:>6} {:>8.1} {:>+8.1} {:>9.2} {:>8.2} {:>9.2} {:>8.2} {:>8.2} {:>6.1}",
        100.0 * r.pool_fraction,
        r.pool_slots,
        r.pool_mb,
        r.policy,
        r.upload,
        r.tokens,
        100.0 * r.hit_rate,
        r.hit_rate_vs_lru_points,
        r.mb_read_per_token,
        r.read_ms_per_token,
        r.upload_ms_per_token,
        r.wait_ms_per_token,
        r.ms_per_token,
        r.syncs_per_token
    );
}
