//! `lingtab ingest`: GGUF parts over HTTP Range into a store folder, with a progress line.

use crate::gguf::split_part_names;
use crate::ingest::{ingest, IngestOptions, PartHint, Phase, Progress, LING_FLASH_BASE, LING_FLASH_PARTS};
use crate::source::HttpSource;
use crate::store::FsDir;
use std::io::Write;
use std::path::Path;

#[derive(clap::Args, Debug)]
pub struct IngestArgs {
    /// URL of the first part (the others are found from its `-0000N-of-0000M` name), or one per part, repeated;
    /// none: the pinned Ling 3.0 Flash Q4_K_M parts
    #[arg(long = "url")]
    pub urls: Vec<String>,
    /// The store folder (made when missing; an unfinished ingest there is resumed)
    #[arg(long)]
    pub store: std::path::PathBuf,
    /// Expected sha256 of each part, in order (repeat); otherwise a sha256 ETag is used when the server sends one
    #[arg(long = "sha256")]
    pub sha256: Vec<String>,
    /// Bytes of part file per unit of work (the most an interruption refetches per request in flight)
    #[arg(long, default_value_t = 16 << 20)]
    pub unit_bytes: u64,
    /// Requests in flight
    #[arg(long, default_value_t = 6)]
    pub in_flight: usize,
    /// Seconds a connection may stay silent (no bytes of an answer) before its request is retried
    #[arg(long, default_value_t = crate::source::DEFAULT_STALL_TIMEOUT.as_secs_f64())]
    pub stall_timeout: f64,
    /// Tries per request after the first (transport errors, stalls, 5xx/429, short bodies)
    #[arg(long, default_value_t = 4)]
    pub retries: u32,
    /// No progress line
    #[arg(long)]
    pub quiet: bool,
}

fn mb(x: u64) -> f64 {
    x as f64 / 1e6
}

fn line(p: &Progress) -> String {
    let phase = p.phase.as_str();
    let pct = if p.bytes_total > 0 { 100.0 * p.bytes_done as f64 / p.bytes_total as f64 } else { 0.0 };
    let eta = p.eta_s.map(|s| format!("{:.0}s", s)).unwrap_or_else(|| "?".into());
    format!("{phase:>7} {pct:5.1}% {:.1}/{:.1} MB {:.1} MB/s ETA {eta}", mb(p.bytes_done), mb(p.bytes_total), mb(p.rate as u64))
}

pub fn run(args: &IngestArgs) -> Result<(), String> {
    let (urls, mut hints): (Vec<String>, Vec<PartHint>) = if args.urls.is_empty() {
        LING_FLASH_PARTS
            .iter()
            .map(|(name, size, sha)| (format!("{LING_FLASH_BASE}{name}"), PartHint { etag: None, size: Some(*size), sha256: Some(sha.to_string()) }))
            .unzip()
    } else if args.urls.len() == 1 {
        let names = split_part_names(&args.urls[0]).map_err(|e| e.to_string())?;
        let n = names.len();
        (names, vec![PartHint::default(); n])
    } else {
        let n = args.urls.len();
        (args.urls.clone(), vec![PartHint::default(); n])
    };
    if !args.sha256.is_empty() {
        if args.sha256.len() != urls.len() {
            return Err(format!("--sha256 given {} times for {} parts", args.sha256.len(), urls.len()));
        }
        for (h, s) in hints.iter_mut().zip(&args.sha256) {
            h.sha256 = Some(s.to_ascii_lowercase());
        }
    }
    if !(args.stall_timeout.is_finite() && args.stall_timeout > 0.0) {
        return Err(format!("--stall-timeout must be a positive number of seconds, not {}", args.stall_timeout));
    }
    let stall = std::time::Duration::from_secs_f64(args.stall_timeout);
    let sources: Vec<HttpSource> = urls
        .iter()
        .map(|u| {
            let mut s = HttpSource::new(u).with_stall_timeout(stall);
            s.retries = args.retries;
            s
        })
        .collect();
    // one ingest of a store at a time, and none while an engine reads it
    let dir = FsDir::new(&args.store)?.hold(crate::store::Hold::Exclusive)?;
    let options = IngestOptions { unit_bytes: args.unit_bytes, in_flight: args.in_flight };
    let quiet = args.quiet;
    let mut last = std::time::Instant::now() - std::time::Duration::from_secs(1);
    let mut on_progress = |p: &Progress| {
        if quiet {
            return;
        }
        if p.phase == Phase::Done || last.elapsed().as_millis() >= 200 {
            last = std::time::Instant::now();
            eprint!("\r{}\x1b[K", line(p));
            let _ = std::io::stderr().flush();
        }
    };
    let manifest = pollster::block_on(async {
        for (s, h) in sources.iter().zip(hints.iter_mut()) {
            let id = s.probe().await?;
            if let Some(want) = h.size {
                if want != id.size {
                    return Err(format!("{}: the server says {} bytes, the pinned size is {want}", s.describe_url(), id.size));
                }
            }
            h.size = Some(id.size);
            h.etag = id.etag.clone();
            if h.sha256.is_none() {
                h.sha256 = id.sha256.clone();
            }
        }
        ingest(&dir, &sources, &hints, &options, &mut on_progress).await
    })?;
    if !quiet {
        eprintln!();
    }
    let total: u64 = manifest.parts.iter().map(|p| p.size).sum();
    eprintln!("{}: complete, {} parts, {:.1} MB of GGUF, store {:.1} MB", Path::new(&args.store).display(), manifest.parts.len(), mb(total), mb(manifest.data_len));
    Ok(())
}
