//! Experts streamed into a GPU pool far smaller than the model's experts, natively (lavapipe): the logits are
//! the all-resident engine's, bit for bit, for every pool size from one token's experts to all of them, and
//! the cache's counters add up. The browser runs the same check from `tests/web.rs`.
#![cfg(not(target_arch = "wasm32"))]

mod common;

use common::fixture::{self, path};
use lingtab::engine::{Engine, EngineOptions, Policy, Upload};
use lingtab::gpu::Gpu;
use lingtab::source::FileSource;

const PARTS: [&str; 2] = ["tiny-ling-00001-of-00002.gguf", "tiny-ling-00002-of-00002.gguf"];
/// The fixture's "sentence" prompt, then a few more tokens (both in the vocabulary).
const TOKENS: [u32; 12] = [2949, 3536, 786, 0, 571, 2730, 17, 900, 1500, 33, 2949, 3536];

fn open(dir: &std::path::Path, options: &EngineOptions) -> Result<Engine, String> {
    let parts: Vec<FileSource> = PARTS.iter().map(|n| FileSource::open(&dir.join(n)).unwrap()).collect();
    pollster::block_on(async { Engine::open(Gpu::new().await.unwrap(), &fixture::model(), parts, options).await })
}

fn run(engine: &mut Engine) -> Vec<Vec<f32>> {
    TOKENS.iter().map(|&t| pollster::block_on(engine.step(t)).unwrap()).collect()
}

fn fixture_dir() -> std::path::PathBuf {
    path("")
}

#[test]
fn every_pool_size_gives_the_resident_logits() {
    let mut resident = fixture::engine(&fixture::model(), &EngineOptions::default());
    assert!(!resident.is_streaming());
    let want = run(&mut resident);
    let slot = resident.stats().slot_bytes;
    let (k, moe_layers) = (resident.config.n_expert_used as u64, resident.config.moe_layers().count() as u64);
    let total = moe_layers * resident.config.n_expert as u64;
    for (slots, policy) in [(k, Policy::Lru), (k, Policy::DEFAULT), (k + 1, Policy::Lru), (16, Policy::DEFAULT), (40, Policy::Lru), (100, Policy::DEFAULT), (total - 1, Policy::Lru)] {
        let options = EngineOptions { pool_bytes: Some(slots * slot), policy: Some(policy), ..Default::default() };
        let mut engine = open(&fixture_dir(), &options).unwrap();
        assert!(engine.is_streaming());
        let got = run(&mut engine);
        assert!(got == want, "pool of {slots} slots ({policy:?}): logits differ from the resident engine's");
        let s = engine.stats().clone();
        let lookups = TOKENS.len() as u64 * moe_layers * k;
        assert_eq!(s.hits + s.misses, lookups, "{slots} slots");
        assert_eq!(s.layer_hits.iter().sum::<u64>() + s.layer_misses.iter().sum::<u64>(), lookups);
        assert_eq!(s.syncs, TOKENS.len() as u64 * (moe_layers + 1), "one routing readback per MoE layer and one for the logits");
        // records are at most a slot (layers whose down rows are Q6_K have the largest)
        assert!(s.bytes_read <= s.misses * slot && s.bytes_read >= s.misses * slot / 2, "{} bytes read for {} misses", s.bytes_read, s.misses);
        // only the first `slots` misses can land in empty slots; every later one evicts
        assert!(s.evictions >= s.misses.saturating_sub(slots) && s.evictions <= s.misses, "{} evictions for {} misses", s.evictions, s.misses);
        eprintln!("pool {slots:>3} slots {:<8} hit rate {:5.1}% misses {:>4} evictions {:>4} read {:.1} MB", policy.name(), 100.0 * s.hit_rate(), s.misses, s.evictions, s.bytes_read as f64 / 1e6);
        // a second prompt after reset: the cache is kept, the logits still equal
        engine.reset();
        resident.reset();
        let a = pollster::block_on(engine.step(TOKENS[3])).unwrap();
        let b = pollster::block_on(resident.step(TOKENS[3])).unwrap();
        assert!(a == b);
        resident.reset();
    }
}

#[test]
fn the_staging_ring_upload_gives_the_same_logits() {
    let mut resident = fixture::engine(&fixture::model(), &EngineOptions::default());
    let want = run(&mut resident);
    let slot = resident.stats().slot_bytes;
    for slots in [4, 12] {
        let options = EngineOptions { pool_bytes: Some(slots * slot), upload: Some(Upload::StagingRing), max_binding: Some(512 << 10), ..Default::default() };
        let mut engine = open(&fixture_dir(), &options).unwrap();
        assert_eq!(engine.upload_path(), Upload::StagingRing);
        assert!(run(&mut engine) == want, "staging ring, {slots} slots");
        assert!(engine.stats().misses > 0);
    }
}

#[test]
fn a_split_pool_streams_the_same_logits() {
    // a 256 KiB binding limit puts two slots in each pool buffer: experts land in different buffers
    let mut resident = fixture::engine(&fixture::model(), &EngineOptions::default());
    let want = run(&mut resident);
    let slot = resident.stats().slot_bytes;
    let options = EngineOptions { pool_bytes: Some(9 * slot), max_binding: Some(256 << 10), ..Default::default() };
    let mut engine = open(&fixture_dir(), &options).unwrap();
    assert!(run(&mut engine) == want);
}

#[test]
fn pools_below_one_tokens_experts_are_refused_with_the_numbers() {
    let resident = fixture::engine(&fixture::model(), &EngineOptions::default());
    let slot = resident.stats().slot_bytes;
    let k = resident.config.n_expert_used as u64;
    let err = open(&fixture_dir(), &EngineOptions { pool_bytes: Some((k - 1) * slot), ..Default::default() }).err().unwrap();
    assert!(err.contains(&format!("holds {} expert records", k - 1)) && err.contains(&format!("at least {}", k * slot)), "{err}");
    let err = open(&fixture_dir(), &EngineOptions { gpu_budget_bytes: Some(1 << 20), ..Default::default() }).err().unwrap();
    assert!(err.contains("does not hold the dense weights"), "{err}");
    // a budget that leaves room for a few slots streams
    let b = resident.gpu_bytes();
    let budget = b.dense_weights + b.states + 6 * slot;
    let engine = open(&fixture_dir(), &EngineOptions { gpu_budget_bytes: Some(budget), ..Default::default() }).unwrap();
    assert!(engine.is_streaming());
    assert_eq!(engine.stats().pool_slots, 6);
}

#[test]
fn a_file_truncated_under_the_engine_gives_a_clear_error_and_the_engine_recovers() {
    let dir = std::env::temp_dir().join(format!("lingtab-stream-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for n in PARTS {
        std::fs::copy(path(n), dir.join(n)).unwrap();
    }
    let resident = fixture::engine(&fixture::model(), &EngineOptions::default());
    let slot = resident.stats().slot_bytes;
    drop(resident);
    let mut engine = open(&dir, &EngineOptions { pool_bytes: Some(4 * slot), ..Default::default() }).unwrap();
    pollster::block_on(engine.step(TOKENS[0])).unwrap();
    // cut part 2 (where most expert stacks live) to its first 1000 bytes
    let f = std::fs::OpenOptions::new().write(true).open(dir.join(PARTS[1])).unwrap();
    f.set_len(1000).unwrap();
    let mut failed = None;
    for &t in &TOKENS[1..] {
        if let Err(e) = pollster::block_on(engine.step(t)) {
            failed = Some(e);
            break;
        }
    }
    let err = failed.expect("a truncated file must fail a step that misses");
    assert!(err.contains("reading experts of layer") && err.contains(PARTS[1]), "{err}");
    assert_eq!(engine.position(), 0, "a failed step forgets the half-updated sequence");
    // the file restored, the same engine goes on and gives the resident logits
    std::fs::copy(path(PARTS[1]), dir.join(PARTS[1])).unwrap();
    let mut resident = fixture::engine(&fixture::model(), &EngineOptions::default());
    assert!(run(&mut engine) == run(&mut resident));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_lost_device_is_a_clear_error_and_a_new_engine_runs() {
    let mut engine = fixture::engine(&fixture::model(), &EngineOptions::default());
    let want = pollster::block_on(engine.step(TOKENS[0])).unwrap();
    engine.gpu.device.destroy();
    let err = pollster::block_on(engine.step(TOKENS[1])).unwrap_err();
    // natively the loss shows first as the error of the next submission, in the browser as the lost callback
    eprintln!("after destroy(): {err}");
    assert!((err.contains("GPU device was lost") || err.contains("GPU reported an error")) && err.contains("load the engine again"), "{err}");
    // and again: every later call says so, none panics
    assert!(pollster::block_on(engine.step(TOKENS[1])).unwrap_err().contains("load the engine again"));
    drop(engine);
    // the model loads again on a new device and runs as before
    let mut fresh = fixture::engine(&fixture::model(), &EngineOptions::default());
    assert!(pollster::block_on(fresh.step(TOKENS[0])).unwrap() == want);
}

/// The fixture's parts, counting the bytes read from them, and running `on_read` at every read.
fn counted(on_read: impl Fn(u64) + 'static) -> (Vec<lingtab::source::Tracked<FileSource>>, std::rc::Rc<std::cell::Cell<u64>>) {
    let read = std::rc::Rc::new(std::cell::Cell::new(0u64));
    let on_read = std::rc::Rc::new(on_read);
    let parts = PARTS
        .iter()
        .map(|n| {
            let (read, on_read) = (read.clone(), on_read.clone());
            let on_read: std::rc::Rc<dyn Fn(u64) -> Result<(), String>> = std::rc::Rc::new(move |n| {
                read.set(read.get() + n);
                on_read(read.get());
                Ok(())
            });
            lingtab::source::Tracked { inner: FileSource::open(&path(n)).unwrap(), on_read }
        })
        .collect();
    (parts, read)
}

#[test]
fn a_context_or_pool_too_large_is_refused_before_anything_is_read_or_allocated() {
    let resident = fixture::engine(&fixture::model(), &EngineOptions::default());
    let slot = resident.stats().slot_bytes;
    let k = resident.config.n_expert_used as u64;
    let c = resident.config.clone();
    let b = resident.gpu_bytes();
    drop(resident);
    let try_on = |gpu: Gpu, options: EngineOptions| {
        let (parts, read) = counted(|_| {});
        let result = pollster::block_on(Engine::open(gpu, &fixture::model(), parts, &options));
        (result.err(), read.get())
    };
    let try_open = |options: EngineOptions| try_on(pollster::block_on(Gpu::new()).unwrap(), options);
    // on a device whose buffer bindings hold 1 MiB, an MLA cache (one buffer, bound whole) above that: the
    // longest context that fits is named, and loads
    let binding = 1u64 << 20;
    let small = || pollster::block_on(Gpu::with_limits(|l| l.max_storage_buffer_binding_size = binding as _)).unwrap();
    // (a cache holds whole 32-row steps, and 1/16 more: mla::cache_rows)
    let per_token = ((c.kv_lora_rank + c.rope_dim) * 4) as u64;
    let fits = lingtab::gpu::mla::longest_context(per_token, binding);
    assert!(fits < c.context_length, "the fixture's context is too short for this check");
    let (err, read) = try_on(small(), EngineOptions { n_ctx: Some(fits + 1), ..Default::default() });
    let err = err.expect("a context whose cache exceeds the binding limit");
    eprintln!("{err}");
    assert!(err.contains(&format!("a context of {} tokens needs an MLA cache of {} bytes", fits + 1, lingtab::gpu::mla::cache_rows(fits + 1) as u64 * per_token)) && err.contains(&format!("at most {fits} tokens")), "{err}");
    assert_eq!(read, 0, "refused after reading {read} bytes");
    let (err, _) = try_on(small(), EngineOptions { n_ctx: Some(fits), ..Default::default() });
    assert!(err.is_none(), "the context it names loads: {err:?}");
    // a budget below the dense weights and states, a pool below one token's experts, no context at all
    let (err, read) = try_open(EngineOptions { gpu_budget_bytes: Some(b.dense_weights), ..Default::default() });
    let err = err.unwrap();
    assert!(err.contains(&format!("a GPU budget of {} bytes does not hold the dense weights ({} bytes) and states ({} bytes)", b.dense_weights, b.dense_weights, b.states)), "{err}");
    assert_eq!(read, 0);
    let (err, read) = try_open(EngineOptions { pool_bytes: Some(k * slot - 1), ..Default::default() });
    assert!(err.unwrap().contains(&format!("give at least {} bytes", k * slot)));
    assert_eq!(read, 0);
    let (err, read) = try_open(EngineOptions { n_ctx: Some(0), ..Default::default() });
    assert!(err.unwrap().contains("context length must be at least 1"));
    assert_eq!(read, 0);
    // the states of a context count against a budget before anything is made: a budget that holds a short
    // context and a pool, given a long context, is refused with both numbers
    let short = 16;
    let short_states = b.states - (4096.min(c.context_length) - short) as u64 * per_token * c.attention.iter().filter(|a| matches!(a, lingtab::model::Attention::Mla)).count() as u64;
    let budget = b.dense_weights + short_states + 6 * slot;
    let (err, _) = try_open(EngineOptions { n_ctx: Some(short), gpu_budget_bytes: Some(budget), ..Default::default() });
    assert!(err.is_none(), "{err:?}");
    let (err, read) = try_open(EngineOptions { n_ctx: Some(4096), gpu_budget_bytes: Some(budget), ..Default::default() });
    let err = err.expect("a context whose states leave no room for one token's experts");
    eprintln!("{err}");
    assert!(err.contains(&format!("a GPU budget of {budget} bytes does not hold the dense weights ({} bytes) and states ({} bytes)", b.dense_weights, b.states)), "{err}");
    assert_eq!(read, 0);
}

#[test]
fn a_device_lost_while_loading_is_the_loads_error_and_a_load_on_a_new_device_runs() {
    let mut resident = fixture::engine(&fixture::model(), &EngineOptions::default());
    let want = run(&mut resident);
    drop(resident);
    for destroy_after in [1u64 << 10, 4 << 20, 16 << 20] {
        let gpu = pollster::block_on(Gpu::new()).unwrap();
        let device = gpu.device.clone();
        let destroyed = std::rc::Rc::new(std::cell::Cell::new(false));
        let flag = destroyed.clone();
        let (parts, _) = counted(move |read| {
            if read >= destroy_after && !flag.get() {
                flag.set(true);
                device.destroy();
            }
        });
        let result = pollster::block_on(Engine::open(gpu, &fixture::model(), parts, &EngineOptions::default()));
        assert!(destroyed.get(), "the load read fewer than {destroy_after} bytes");
        let err = result.err().unwrap_or_else(|| panic!("an engine loaded on a device destroyed after {destroy_after} bytes"));
        eprintln!("device destroyed after {destroy_after} bytes read: {err}");
        assert!(err.contains("GPU device was lost") && err.contains("load the engine again"), "{err}");
    }
    // the same files on a new device: the engine runs and gives the logits it gave before
    let mut engine = open(&fixture_dir(), &EngineOptions::default()).unwrap();
    assert!(run(&mut engine) == want);
}
