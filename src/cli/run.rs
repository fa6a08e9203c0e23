//! `lingtab logits` and `lingtab greedy`: the engine on any `bailingmoe3` GGUF, fed token by token — how
//! anyone checks it against llama.cpp.

use super::inspect::open_model;
use crate::engine::{Engine, EngineOptions};
use crate::gguf::split_part_names;
use crate::gpu::Gpu;
use crate::source::FileSource;
use std::io::Write;
use std::path::Path;

/// Token ids from a comma list (`1,2,3`) or a file holding a JSON array.
pub fn parse_tokens(spec: &str) -> Result<Vec<u32>, String> {
    let text = if Path::new(spec).is_file() { std::fs::read_to_string(spec).map_err(|e| format!("{spec}: {e}"))? } else { spec.to_string() };
    let trimmed = text.trim();
    let ids: Result<Vec<u32>, String> = if trimmed.starts_with('[') {
        serde_json::from_str(trimmed).map_err(|e| format!("--tokens: not a JSON array of token ids: {e}"))
    } else {
        trimmed.split(',').map(|s| s.trim().parse::<u32>().map_err(|_| format!("--tokens: {s:?} is not a token id"))).collect()
    };
    let ids = ids?;
    if ids.is_empty() {
        return Err("--tokens: no token ids".into());
    }
    Ok(ids)
}

pub fn load_engine(first_part: &Path, options: &EngineOptions) -> Result<Engine, String> {
    let model = open_model(first_part)?;
    let names = split_part_names(&first_part.to_string_lossy()).map_err(|e| e.to_string())?;
    let parts = names.iter().map(|n| FileSource::open(Path::new(n))).collect::<Result<Vec<_>, _>>()?;
    pollster::block_on(async {
        let gpu = Gpu::new().await.map_err(|e| e.0)?;
        Engine::open(gpu, &model, parts, options).await
    })
}

/// Where a command's model is: a GGUF (first part) or a complete store.
pub enum ModelPath {
    Gguf(std::path::PathBuf),
    Store(std::path::PathBuf),
}

impl ModelPath {
    pub fn load(&self, options: &EngineOptions) -> Result<Engine, String> {
        match self {
            ModelPath::Gguf(p) => load_engine(p, options),
            ModelPath::Store(p) => load_engine_from_store(p, options),
        }
    }
}

/// Loads the engine from a complete store: headers, dense tensors and expert records read from the store's
/// data file; nothing else is touched.
pub fn load_engine_from_store(dir: &Path, options: &EngineOptions) -> Result<Engine, String> {
    if !dir.join(crate::store::MANIFEST_FILE).is_file() {
        return Err(format!("{}: no store here (no {})", dir.display(), crate::store::MANIFEST_FILE));
    }
    // held shared while the engine reads it (its part views keep the hold): no ingest meanwhile
    let dir = crate::store::FsDir::new(dir)?.hold(crate::store::Hold::Shared)?;
    pollster::block_on(async {
        let (model, parts) = crate::store::open_complete(&dir).await?;
        let checks = crate::store::read_checks(&dir).await?;
        let gpu = Gpu::new().await.map_err(|e| e.0)?;
        Engine::open_checked(gpu, &model, parts, checks, options).await
    })
}

/// Writes little-endian f32 logits, one row of `vocab` per input token, fed one token at a time. With
/// `margins`, also a JSON array with each position's smallest routing margins over the MoE layers
/// (`{"group": g, "expert": e}`), so a comparison can stop where routing is a near-tie.
pub fn logits(model: &ModelPath, tokens: &str, out: &Path, margins: Option<&Path>, options: &EngineOptions) -> Result<(), String> {
    let ids = parse_tokens(tokens)?;
    let mut engine = model.load(options)?;
    let file = std::fs::File::create(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let mut writer = std::io::BufWriter::new(file);
    let mut per_position = Vec::new();
    for &id in &ids {
        let row = pollster::block_on(engine.step(id))?;
        writer.write_all(bytemuck::cast_slice(&row)).map_err(|e| format!("{}: {e}", out.display()))?;
        if margins.is_some() {
            let routing = pollster::block_on(engine.last_routing())?;
            let min = |f: fn(&crate::gpu::moe::Selection) -> f32| routing.iter().map(|(_, s)| f(s)).fold(f32::INFINITY, f32::min);
            // JSON has no infinity: a margin with nothing dropped is reported as a large number
            let finite = |v: f32| if v.is_finite() { v } else { f32::MAX };
            per_position.push(serde_json::json!({"group": finite(min(|s| s.group_margin)), "expert": finite(min(|s| s.expert_margin))}));
        }
    }
    if let Some(path) = margins {
        std::fs::write(path, serde_json::to_string(&per_position).unwrap()).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    writer.flush().map_err(|e| format!("{}: {e}", out.display()))?;
    eprintln!("{} rows × {} logits written to {}", ids.len(), engine.vocab_size(), out.display());
    print_stats(&engine);
    Ok(())
}

/// Prints the greedy continuation (argmax, lowest id on ties) of `n` tokens as a JSON array.
pub fn greedy(model: &ModelPath, tokens: &str, n: usize, options: &EngineOptions) -> Result<(), String> {
    let ids = parse_tokens(tokens)?;
    let mut engine = model.load(options)?;
    let mut out = Vec::with_capacity(n);
    pollster::block_on(async {
        for &id in &ids[..ids.len() - 1] {
            engine.step_argmax(id).await?;
        }
        let mut next = engine.step_argmax(*ids.last().unwrap()).await?;
        for i in 0..n {
            out.push(next);
            if i + 1 < n {
                next = engine.next_greedy(next).await?;
            }
        }
        Ok::<(), String>(())
    })?;
    println!("{}", serde_json::to_string(&out).unwrap());
    print_stats(&engine);
    Ok(())
}

/// The expert cache's counters on stderr, when experts were streamed.
pub fn print_stats(engine: &Engine) {
    if !engine.is_streaming() {
        return;
    }
    let s = engine.stats();
    let tokens = s.tokens.max(1) as f64;
    eprintln!(
        "expert cache ({}, {} slots of {} bytes): hit rate {:.1}% ({} hits, {} misses, {} evictions); per token: {:.2} MB read, {:.2} MB uploaded, read {:.2} ms, upload {:.2} ms, routing wait {:.2} ms, {:.1} syncs",
        s.policy,
        s.pool_slots,
        s.slot_bytes,
        100.0 * s.hit_rate(),
        s.hits,
        s.misses,
        s.evictions,
        s.bytes_read as f64 / tokens / 1e6,
        s.bytes_uploaded as f64 / tokens / 1e6,
        1e3 * s.read_s / tokens,
        1e3 * s.upload_s / tokens,
        1e3 * s.wait_s / tokens,
        s.syncs as f64 / tokens
    );
    let per_layer: Vec<String> = s
        .layer_hits
        .iter()
        .zip(&s.layer_misses)
        .enumerate()
        .filter(|(_, (h, m))| **h + **m > 0)
        .map(|(l, (h, m))| format!("{l}:{:.0}%", 100.0 * *h as f64 / (*h + *m) as f64))
        .collect();
    eprintln!("hit rate per layer: {}", per_layer.join(" "));
}
