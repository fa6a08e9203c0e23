//! Browser benchmark (prints tables; asserts only that the bytes read are the store's): expert records read
//! from an OPFS store through one handle in this worker and through pools of 1, 2, 4 and 8 reader workers, then
//! the engine's record-read time per token with a streaming pool. Not part of `.ci/test`. A bigger model than
//! the fixture gives records of the real size (flash widths: about 3.5 MB each):
//!
//! ```sh
//! target/debug/lingtab make-tiny --out target/bench-opfs --geometry flash --layers 3 --vocab 4000 --name bench
//! target/debug/lingtab serve --port 18501 --mount /fixtures=tests/fixtures --mount /bench=target/bench-opfs &
//! python3 tests/web_bench_evict.py --port 18502 &     # optional: the cold rows
//! CHROMEDRIVER=/usr/bin/chromedriver WASM_BINDGEN_TEST_TIMEOUT=1800 LINGTAB_TEST_SERVER=http://127.0.0.1:18501 \
//!   LINGTAB_BENCH_MODEL=/bench/bench-00001-of-00002.gguf LINGTAB_BENCH_EVICT=http://127.0.0.1:18502 \
//!   cargo test --target wasm32-unknown-unknown --test web_bench -- --nocapture
//! ```
//! (`LINGTAB_BENCH_MODEL` is a path on the server; without it the tiny fixture is used. `LINGTAB_BENCH_EVICT`:
//! the address of `tests/web_bench_evict.py`, which drops the store's data file from the page cache before each
//! cold configuration; without it only warm rows. `LINGTAB_BENCH_MB` caps the megabytes read per configuration
//! (default 1024), `LINGTAB_BENCH_ROUNDS` the rounds (default 3).)
#![cfg(target_arch = "wasm32")]

use lingtab::clock::now_s;
use lingtab::engine::{Engine, EngineOptions, Policy};
use lingtab::gpu::Gpu;
use lingtab::ingest::{ingest, IngestOptions, PartHint};
use lingtab::model::Config;
use lingtab::source::{open_model, HttpSource};
use lingtab::store::{open_complete, read_checks, read_manifest, Access, OpfsDir, OpfsReaders, StoreChecks, StoreDir, StoreFile, StoreLayout, StoreState, DATA_FILE};
use wasm_bindgen::JsCast;
use wasm_bindgen_test::*;

wasm_bindgen_test_configure!(run_in_dedicated_worker);

fn log(msg: &str) {
    web_sys::console::log_1(&msg.into());
}

fn server() -> &'static str {
    env!("LINGTAB_TEST_SERVER", "the bench needs LINGTAB_TEST_SERVER (a `lingtab serve` address)")
}

fn model_url() -> String {
    format!("{}{}", server(), option_env!("LINGTAB_BENCH_MODEL").unwrap_or("/fixtures/tiny-ling/tiny-ling-00001-of-00002.gguf"))
}

/// The bench model in an OPFS store (ingested over HTTP unless a complete store of it is there already).
async fn bench_store() -> String {
    let url = model_url();
    let name = format!("bench-{}", url.rsplit('/').next().unwrap().trim_end_matches(".gguf"));
    let dir = OpfsDir::open(&name, true).await.unwrap().unwrap();
    if read_manifest(&dir).await.unwrap().is_some_and(|m| m.state == StoreState::Complete) {
        return name;
    }
    let parts: Vec<HttpSource> = lingtab::gguf::split_part_names(&url).unwrap().into_iter().map(HttpSource::new).collect();
    let mut hints = Vec::new();
    for p in &parts {
        let id = p.probe().await.unwrap();
        hints.push(PartHint { etag: id.etag, size: Some(id.size), sha256: id.sha256 });
    }
    let began = now_s();
    let m = ingest(&dir, &parts, &hints, &IngestOptions { unit_bytes: 16 << 20, in_flight: 4 }, &mut |_| {}).await.unwrap();
    log(&format!("ingested {url} into OPFS store {name:?}: {:.0} MB in {:.1} s", m.data_len as f64 / 1e6, now_s() - began));
    name
}

/// Drops the store's data file (`len` bytes) from the page cache through `tests/web_bench_evict.py` when
/// `LINGTAB_BENCH_EVICT` names it (the address of that server); false when there is none.
async fn evict(len: u64) -> bool {
    let Some(base) = option_env!("LINGTAB_BENCH_EVICT") else { return false };
    let scope: web_sys::WorkerGlobalScope = js_sys::global().unchecked_into();
    let url = format!("{base}/evict?size={len}");
    let response: web_sys::Response = wasm_bindgen_futures::JsFuture::from(scope.fetch_with_str(&url)).await.unwrap().unchecked_into();
    let body = wasm_bindgen_futures::JsFuture::from(response.text().unwrap()).await.unwrap().as_string().unwrap();
    assert!(response.ok() && !body.contains("\"evicted\": 0"), "{url}: {} {body} (is the profile under the server's --roots?)", response.status());
    true
}

/// A record of the store: (layer, expert, offset, bytes).
type Record = (usize, u32, u64, u64);

/// Every expert record, in a fixed scattered order (a cache's misses are all over the file).
fn records(layout: &StoreLayout, n_expert: u32) -> Vec<Record> {
    let mut out: Vec<Record> = layout.experts.iter().flat_map(|r| (0..n_expert).map(move |e| (r.layer, e, r.offset + e as u64 * r.stride, r.record_bytes))).collect();
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for i in (1..out.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.swap(i, (x % (i as u64 + 1)) as usize);
    }
    out
}

/// Checks a record's gate, up and down rows against the store's check values.
fn verify(checks: &StoreChecks, layout: &StoreLayout, (layer, expert, _, _): Record, bytes: &[u8]) {
    let r = layout.experts.iter().find(|r| r.layer == layer).unwrap();
    let cuts = [r.gate, r.up, r.down, r.record_bytes];
    for which in 0..3 {
        checks.verify_expert(layer, expert, which, &bytes[cuts[which] as usize..cuts[which + 1] as usize]).unwrap();
    }
}

/// Reads `records` in batches of `batch` (one layer's misses, read together); seconds spent waiting for bytes.
async fn read_all<F: StoreFile>(file: &F, records: &[Record], batch: usize, checks: &StoreChecks, layout: &StoreLayout) -> f64 {
    let mut waited = 0.0;
    for group in records.chunks(batch) {
        let mut bufs: Vec<Vec<u8>> = group.iter().map(|r| vec![0u8; r.3 as usize]).collect();
        let began = now_s();
        futures_util::future::try_join_all(group.iter().zip(bufs.iter_mut()).map(|(r, buf)| file.read_at(r.2, buf))).await.unwrap();
        waited += now_s() - began;
        for (r, buf) in group.iter().zip(&bufs) {
            verify(checks, layout, *r, buf);
        }
    }
    waited
}

/// The two tables, then the store is deleted (the test runner leaves the browser's profile behind, store and all).
#[wasm_bindgen_test]
async fn opfs_reader_bench() {
    let name = bench_store().await;
    record_reads_by_reader_count(&name).await;
    engine_read_time_per_token_by_reader_count(&name).await;
    OpfsDir::delete(&name).await.unwrap();
}

async fn record_reads_by_reader_count(name: &str) {
    let dir = OpfsDir::open(&name, false).await.unwrap().unwrap();
    let (model, views) = open_complete(&dir.with_access(Access::Async)).await.unwrap();
    drop(views);
    let config = Config::from_header(model.header()).unwrap();
    let layout = StoreLayout::from_model(&model).unwrap();
    let checks = read_checks(&OpfsDir::open(&name, false).await.unwrap().unwrap().with_access(Access::Async)).await.unwrap().expect("check values");
    let cap_mb: u64 = option_env!("LINGTAB_BENCH_MB").and_then(|v| v.parse().ok()).unwrap_or(1024);
    let all = records(&layout, config.n_expert as u32);
    let mut take = 0;
    let mut bytes = 0u64;
    while take < all.len() && bytes < cap_mb << 20 {
        bytes += all[take].3;
        take += 1;
    }
    let set = &all[..take];
    let batch = config.n_expert_used;
    let mb = bytes as f64 / 1e6;
    log(&format!(
        "OPFS expert-record reads, store {name:?}: {take} records of {:.2} MB ({mb:.0} MB), in batches of {batch} read together, scattered order; check values verified outside the timing",
        set[0].3 as f64 / 1e6
    ));
    // one sync access handle in this worker (what the engine did before the pool: reads one after another),
    // then pools of readers; rounds go over every configuration in turn, so a busy machine slows them alike
    let own = OpfsDir::open(&name, false).await.unwrap().unwrap().read_only();
    let data = own.open(DATA_FILE, false).await.unwrap().unwrap();
    let counts = [1usize, 2, 4, 8];
    let mut pools = Vec::new();
    for n in counts {
        pools.push(OpfsReaders::open(&name, DATA_FILE, n).await.unwrap());
    }
    let rounds: usize = option_env!("LINGTAB_BENCH_ROUNDS").and_then(|v| v.parse().ok()).unwrap_or(3);
    // warm: the file in the page cache (as after the ingest); cold: dropped from it before each configuration
    let cold = evict(layout.data_len).await;
    let temps: &[bool] = if cold { &[false, true] } else { &[false] };
    let mut seconds = vec![vec![Vec::new(); 1 + counts.len()]; temps.len()];
    for _ in 0..rounds {
        for (c, &evicting) in temps.iter().enumerate() {
            for i in 0..1 + counts.len() {
                if evicting {
                    evict(layout.data_len).await;
                }
                let s = if i == 0 { read_all(&data, set, batch, &checks, &layout).await } else { read_all(&pools[i - 1], set, batch, &checks, &layout).await };
                seconds[c][i].push(s);
            }
        }
    }
    let median = |v: &Vec<f64>| {
        let mut v = v.clone();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let batches = set.len().div_ceil(batch) as f64;
    log(&format!("{rounds} rounds; MB/s of the median round (best round in brackets)"));
    for (c, &evicting) in temps.iter().enumerate() {
        log(&format!("{}:", if evicting { "cold (the data file dropped from the page cache before each)" } else { "warm (the data file in the page cache)" }));
        log("| readers | MB/s | × 1 reader | ms per batch of records |");
        log("|---|---|---|---|");
        let one = mb / median(&seconds[c][1]);
        for (i, s) in seconds[c].iter().enumerate() {
            let (rate, best) = (mb / median(s), mb / s.iter().cloned().fold(f64::INFINITY, f64::min));
            let label = if i == 0 { "this worker's own handle".to_string() } else { counts[i - 1].to_string() };
            log(&format!("| {label} | {rate:.0} ({best:.0}) | {:.2} | {:.1} |", rate / one, 1000.0 * median(s) / batches));
        }
    }
}

async fn engine_read_time_per_token_by_reader_count(name: &str) {
    let tokens: Vec<u32> = vec![1, 200, 33, 900, 57];
    let probe = open_model(&model_url(), |u| Ok(HttpSource::new(u))).await.unwrap();
    let config = Config::from_header(probe.header()).unwrap();
    let vocab = config.vocab_size as u32;
    let tokens: Vec<u32> = tokens.into_iter().map(|t| t % vocab).collect();
    let k = config.n_expert_used as u32;
    let options = EngineOptions { pool_slots: Some(2 * k), policy: Some(Policy::Lru), ..Default::default() };
    log(&format!("engine, store {name:?}: a streaming pool of {} slots (LRU), {} tokens", 2 * k, tokens.len()));
    log("| readers | misses/token | MB read/token | read_s/token | MB/s while reading | s/token |");
    log("|---|---|---|---|---|---|");
    let data_len = read_manifest(&OpfsDir::open(&name, false).await.unwrap().unwrap().with_access(Access::Async)).await.unwrap().unwrap().data_len;
    for n in [0usize, 1, 4] {
        let cold = evict(data_len).await;
        let dir = OpfsDir::open(&name, false).await.unwrap().unwrap();
        let checks = read_checks(&dir.with_access(Access::Async)).await.unwrap();
        let gpu = Gpu::new().await.expect("WebGPU adapter");
        let mut engine = if n == 0 {
            let dir = OpfsDir::open(&name, false).await.unwrap().unwrap().read_only();
            let (model, views) = open_complete(&dir).await.unwrap();
            Engine::open_checked(gpu, &model, views, checks, &options).await.unwrap()
        } else {
            let pool = OpfsReaders::open(&name, DATA_FILE, n).await.unwrap();
            let dir = OpfsDir::open(&name, false).await.unwrap().unwrap().with_access(Access::Async);
            let (model, views) = open_complete(&dir).await.unwrap();
            let views: Vec<_> = views.into_iter().map(|v| v.map_file(|_| pool.clone())).collect();
            Engine::open_checked(gpu, &model, views, checks, &options).await.unwrap()
        };
        // the first token warms the GPU's pipelines; counted from the second
        engine.step(tokens[0]).await.unwrap();
        engine.reset_stats();
        let began = now_s();
        for &t in &tokens[1..] {
            engine.step_argmax(t).await.unwrap();
        }
        let per = (now_s() - began) / (tokens.len() - 1) as f64;
        let s = engine.stats();
        let t = s.tokens as f64;
        let label = format!("{}{}", if n == 0 { "this worker's own handle".to_string() } else { n.to_string() }, if cold { " (cold)" } else { "" });
        log(&format!(
            "| {label} | {:.1} | {:.1} | {:.3} | {:.0} | {per:.2} |",
            s.misses as f64 / t,
            s.bytes_read as f64 / 1e6 / t,
            s.read_s / t,
            s.bytes_read as f64 / 1e6 / s.read_s.max(1e-9)
        ));
    }
}
