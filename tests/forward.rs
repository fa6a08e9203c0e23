//! The engine on the tiny-ling fixture against llama.cpp's f32 twin, natively (lavapipe). The browser runs the
//! same checks from `tests/web.rs`.
#![cfg(not(target_arch = "wasm32"))]

mod common;

use common::forward::{self, Case};
use lingtab::engine::{Engine, EngineOptions};
use lingtab::generate::sampler::argmax;
use lingtab::gguf::{parse_header, GgufWriter, SplitModel, Value};
use lingtab::gpu::Gpu;
use lingtab::source::MemorySource;
use lingtab::tiny::{TinyModel, TinyOptions};

use common::fixture::path as fixture;

fn engine(options: &EngineOptions) -> Engine {
    common::fixture::engine(&common::fixture::model(), options)
}

fn cases() -> Vec<Case> {
    let json = std::fs::read_to_string(fixture("golden/forward_cases.json")).unwrap();
    forward::cases(&json, |f| std::fs::read(fixture(&format!("golden/{f}"))).unwrap())
}

#[test]
fn logits_match_llama_cpp_f32_twin_on_every_fixture_case() {
    let mut engine = engine(&EngineOptions::default());
    for case in cases() {
        let (max_abs, rms, ours) = pollster::block_on(forward::check_logits(&mut engine, &case));
        let greedy = pollster::block_on(forward::check_greedy(&mut engine, &case, usize::MAX));
        // llama.cpp on the quantised file itself (8-bit activations): reported, not a target
        let q: Vec<f32> = bytemuck::pod_collect_to_vec(&std::fs::read(fixture(&format!("golden/{}.q.prefill_logits.f32", case.id))).unwrap());
        let diffs: Vec<f64> = ours.iter().flatten().zip(&q).map(|(a, b)| (a - b) as f64).collect();
        let q_rms = (diffs.iter().map(|d| d * d).sum::<f64>() / diffs.len() as f64).sqrt();
        let q_max = diffs.iter().fold(0f64, |m, d| m.max(d.abs()));
        eprintln!(
            "{:<13} {:>3} positions ({:>3} before a routing near-tie): max |Δ| {max_abs:.2e}, rms {rms:.2e}; greedy equal for {greedy:>2} steps; vs the quantised-activation run: max {q_max:.2}, rms {q_rms:.3}",
            case.id, case.tokens.len(), case.first_near_tie.min(case.tokens.len())
        );
    }
}

/// A GPU's kernels (products with a group of lanes a row, reduced behind barriers; a decode step's attention by
/// products) give llama.cpp's logits as well: the other tests here run on a CPU adapter, which takes others
/// ([`Gpu::cpu_kernels`]).
#[test]
fn a_gpus_products_match_llama_cpp_f32_twin() {
    let mut engine = engine(&EngineOptions::default());
    engine.gpu.set_cpu_kernels(false);
    // one token, and 21 through KDA, MLA and MoE layers, each with its greedy continuation (past 32 positions,
    // where the value product runs in column slices: tests/prefill.rs)
    for case in cases().into_iter().take(2) {
        let (max_abs, rms, _) = pollster::block_on(forward::check_logits(&mut engine, &case));
        let greedy = pollster::block_on(forward::check_greedy(&mut engine, &case, 8));
        eprintln!("{:<13} a GPU's products: max |Δ| {max_abs:.2e}, rms {rms:.2e}; greedy equal for {greedy} steps", case.id);
    }
    // and with the variants `lingtab bench --q4k-octets --four-sides --prefetch` tries (this is the only test here on a GPU's
    // products, so the setting reaches no other)
    lingtab::gpu::matvec::set_engine_trial(true, true, true);
    let trial = cases().into_iter().take(2).map(|case| pollster::block_on(forward::check_logits(&mut engine, &case))).collect::<Vec<_>>();
    lingtab::gpu::matvec::set_engine_trial(false, false, false);
    for (max_abs, rms, _) in trial {
        eprintln!("with Q4_K blocks by 8 lanes, four side by side, loaded ahead: max |Δ| {max_abs:.2e}, rms {rms:.2e}");
    }
}

#[test]
fn forced_small_binding_limit_gives_the_same_logits() {
    let tokens = [2949u32, 3536, 786, 0, 571, 2730];
    let mut normal = engine(&EngineOptions::default());
    // 256 KiB: output.weight (735 KiB) splits into 3 buffers, the expert pool (160 records of 125 KiB) into 80
    let mut small = engine(&EngineOptions { max_binding: Some(256 << 10), ..Default::default() });
    for &t in &tokens {
        let a = pollster::block_on(normal.step(t)).unwrap();
        let b = pollster::block_on(small.step(t)).unwrap();
        assert_eq!(a, b, "token {t}");
    }
}

/// A resident pool split over several buffers holds each layer's experts in one of them, and a layer's expert
/// products visit only the buffers holding its experts: a step costs the dispatches of a one-buffer pool, with
/// the same logits.
#[test]
fn a_pool_in_several_buffers_costs_no_more_dispatches() {
    let tokens = [2949u32, 3536, 786, 0];
    let mut one = engine(&EngineOptions::default());
    let (slot, n_expert) = (one.stats().slot_bytes, one.config.n_expert as u64);
    // room for one and a half layers' experts per buffer: rounded down to whole layers, one each
    let mut split = engine(&EngineOptions { max_binding: Some(slot * n_expert * 3 / 2), ..Default::default() });
    let moe_layers = one.config.moe_layers().count();
    assert_eq!(one.pool_buffers(), 1);
    assert_eq!(split.pool_buffers(), moe_layers);
    for &t in &tokens {
        let before = [one.gpu.counters().dispatches, split.gpu.counters().dispatches];
        let a = pollster::block_on(one.step(t)).unwrap();
        let b = pollster::block_on(split.step(t)).unwrap();
        assert_eq!(a, b, "token {t}");
        assert_eq!(one.gpu.counters().dispatches - before[0], split.gpu.counters().dispatches - before[1], "token {t}");
    }
}

/// A timeline (`lingtab bench --timeline`) accounts for every dispatch of the steps it covers, by kernel, and for
/// no more time than they took: each submission's time is the sum of its dispatches' times, the busy and idle
/// time together fit inside the wall-clock time, and recording it leaves the logits as they were.
#[test]
fn a_timeline_accounts_for_every_dispatch_and_changes_no_logits() {
    let tokens = [2949u32, 3536, 786, 0];
    let mut plain = engine(&EngineOptions::default());
    let mut timed = engine(&EngineOptions::default());
    assert!(timed.gpu.has_timeline(), "{}: the test adapter has timestamps inside compute passes", timed.gpu.summary);
    timed.gpu.start_timeline().unwrap();
    let before = timed.gpu.counters().dispatches;
    let began = std::time::Instant::now();
    for &t in &tokens {
        let a = pollster::block_on(plain.step(t)).unwrap();
        let b = pollster::block_on(timed.step(t)).unwrap();
        assert_eq!(a, b, "token {t}");
    }
    let wall_ms = began.elapsed().as_secs_f64() * 1e3;
    let timeline = pollster::block_on(timed.gpu.take_timeline()).unwrap().expect("a timeline is being recorded");
    let dispatches: u64 = timeline.kernels.iter().map(|k| k.dispatches).sum();
    assert_eq!(dispatches, timed.gpu.counters().dispatches - before);
    assert!(timeline.kernels.iter().any(|k| k.kernel.contains("kda_step")) && timeline.kernels.iter().any(|k| k.kernel.contains("argmax")), "{:?}", timeline.kernels);
    let summed: f64 = timeline.kernels.iter().map(|k| k.ms).sum();
    assert!((summed - timeline.busy_ms).abs() <= 1e-6 * timeline.busy_ms.max(1.0), "kernels {summed} ms, submissions {} ms", timeline.busy_ms);
    // by kernel and grid: the same dispatches and time, each kernel split by its grids
    let by_grid: u64 = timeline.grids.iter().map(|k| k.dispatches).sum();
    let grid_ms: f64 = timeline.grids.iter().map(|k| k.ms).sum();
    assert_eq!(by_grid, dispatches);
    assert!((grid_ms - summed).abs() <= 1e-6 * summed.max(1.0), "by grid {grid_ms} ms, by kernel {summed} ms");
    for k in &timeline.kernels {
        let of_kernel: Vec<_> = timeline.grids.iter().filter(|g| g.kernel.strip_prefix(k.kernel.as_str()).is_some_and(|rest| rest.starts_with(" ["))).collect();
        assert!(!of_kernel.is_empty() && of_kernel.iter().map(|g| g.dispatches).sum::<u64>() == k.dispatches, "{}: {of_kernel:?}", k.kernel);
    }
    assert!(timeline.busy_ms > 0.0 && timeline.busy_ms + timeline.idle_ms <= wall_ms, "busy {} + idle {} ms in {wall_ms} ms", timeline.busy_ms, timeline.idle_ms);
    // taken: the next take starts empty
    let next = pollster::block_on(timed.gpu.take_timeline()).unwrap().unwrap();
    assert!(next.kernels.is_empty() && next.busy_ms == 0.0);
}

/// Kernels built without wgpu's forced loop bounding and index clamps (the engine's default natively) compute
/// what fully checked ones compute: the same logits through a chunked prefill of more than 64 tokens (big tiles,
/// tall expert tiles and row tiles over the chunk's remainder) and decode steps, and the same greedy picks.
#[test]
fn kernels_with_and_without_wgpu_checks_give_the_same_logits() {
    let prompt: Vec<u32> = (0..70u32).map(|i| i.wrapping_mul(2654435761) % 3500).collect();
    let options = EngineOptions { prefill_chunk: Some(66), ..Default::default() };
    let mut unchecked = engine(&options);
    let mut checked = engine(&options);
    checked.gpu.set_checked_kernels(true);
    let a = pollster::block_on(unchecked.feed(&prompt)).unwrap();
    let b = pollster::block_on(checked.feed(&prompt)).unwrap();
    assert_nearly_equal(&a, &b, "prefill");
    let mut next = argmax(&a);
    for step in 0..4 {
        let a = pollster::block_on(unchecked.step(next)).unwrap();
        let b = pollster::block_on(checked.step(next)).unwrap();
        assert_nearly_equal(&a, &b, &format!("step {step}"));
        assert_eq!(argmax(&a), argmax(&b), "step {step}");
        next = argmax(&a);
    }
}

/// Equal but for the driver's choice of fused multiply-adds in unrolled loops: far inside the forward-pass
/// tolerance against llama.cpp (1e-4).
fn assert_nearly_equal(a: &[f32], b: &[f32], what: &str) {
    assert_eq!(a.len(), b.len());
    let worst = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
    assert!(worst <= 1e-5, "{what}: max |Δ| {worst:e}");
}

/// The matrices that read the same input computed as stacks (one dispatch per type) or one by one: the same
/// logits, bit for bit (each row's sum is the same arithmetic either way), and fewer dispatches stacked.
#[test]
fn stacked_and_separate_products_give_the_same_logits() {
    let tokens = [2949u32, 3536, 786, 0, 571, 2730];
    let mut stacked = engine(&EngineOptions::default());
    let mut separate = engine(&EngineOptions { stack_products: Some(false), ..Default::default() });
    // every layer's attention inputs and its SwiGLU have a stack each (two where types differ), none when off
    let groups = 2 * stacked.config.n_layer;
    assert!(stacked.stack_count() >= groups, "{} stacks for {groups} groups", stacked.stack_count());
    assert_eq!(separate.stack_count(), 0);
    let mut dispatches = [0u64; 2];
    for &t in &tokens {
        let logits: Vec<Vec<f32>> = [&mut stacked, &mut separate]
            .into_iter()
            .enumerate()
            .map(|(i, e)| {
                let before = e.gpu.counters().dispatches;
                let logits = pollster::block_on(e.step(t)).unwrap();
                dispatches[i] += e.gpu.counters().dispatches - before;
                logits
            })
            .collect();
        assert_eq!(logits[0], logits[1], "token {t}");
    }
    assert!(dispatches[0] < dispatches[1], "stacked {} vs separate {} dispatches", dispatches[0], dispatches[1]);
}

/// An MoE layer's shared expert run as one more batch of its selected experts' products (from a pool slot of its
/// own), or as products of its own: the same logits within the drivers' choice of fused multiply-adds, two
/// dispatches fewer per MoE layer riding; with every expert resident, and streamed into a pool split over
/// buffers (its shared experts' slots after the cache's, in buffers of their own).
#[test]
fn shared_experts_riding_or_apart_give_the_same_logits() {
    let tokens = [2949u32, 3536, 786, 0, 571, 2730];
    let mut riding = engine(&EngineOptions::default());
    let mut apart = engine(&EngineOptions { shared_rides: Some(false), ..Default::default() });
    let slot = riding.stats().slot_bytes;
    let streaming_options = EngineOptions { pool_bytes: Some(12 * slot), max_binding: Some(4 * slot), ..Default::default() };
    let mut streaming = common::fixture::open(&common::fixture::model(), &streaming_options);
    assert!(streaming.is_streaming());
    let moe_layers = riding.config.moe_layers().count() as u64;
    for &t in &tokens {
        let before = [riding.gpu.counters().dispatches, apart.gpu.counters().dispatches];
        let a = pollster::block_on(riding.step(t)).unwrap();
        let b = pollster::block_on(apart.step(t)).unwrap();
        let c = pollster::block_on(streaming.step(t)).unwrap();
        assert_nearly_equal(&a, &b, &format!("token {t}, riding or apart"));
        assert_eq!(a, c, "token {t}, resident or streamed");
        let dispatches = [riding.gpu.counters().dispatches - before[0], apart.gpu.counters().dispatches - before[1]];
        assert_eq!(dispatches[0] + 2 * moe_layers, dispatches[1], "token {t}: dispatches riding and apart");
    }
    // the riders' slots are dense weights' copies, counted with them
    let (r, a) = (riding.gpu_bytes(), apart.gpu_bytes());
    assert_eq!(r.dense_weights, a.dense_weights + moe_layers * slot);
    assert_eq!(r.expert_pool, a.expert_pool);
}

/// The parts of a make-tiny model rewritten with edited metadata and without the tensor `drop`.
fn rewritten(edit: impl Fn(&mut Vec<(String, Value)>), drop: Option<&str>) -> Vec<MemorySource> {
    let mut options = TinyOptions::tiny(9);
    options.layers = 6;
    options.vocab = 700;
    let parts = TinyModel::plan(options).unwrap().to_parts().unwrap();
    let headers = parts.iter().map(|p| (parse_header(p, None).unwrap(), p.len() as u64)).collect();
    let model = SplitModel::new(headers).unwrap();
    let mut w = GgufWriter::new();
    w.metadata = model.header().metadata.clone();
    edit(&mut w.metadata);
    let kept: Vec<_> = model.tensors.iter().filter(|t| Some(t.info.name.as_str()) != drop).collect();
    for t in &kept {
        w.add_tensor(&t.info.name, t.info.ty, &t.info.dims).unwrap();
    }
    let files = w
        .to_parts(2, |i| {
            let t = kept[i];
            parts[t.part][t.file_offset as usize..(t.file_offset + t.info.n_bytes()) as usize].to_vec()
        })
        .unwrap();
    files.into_iter().enumerate().map(|(i, bytes)| MemorySource { name: format!("part {}", i + 1), bytes }).collect()
}

fn load_error(parts: &[MemorySource]) -> String {
    let headers = parts.iter().map(|p| (parse_header(&p.bytes, None).unwrap(), p.bytes.len() as u64)).collect();
    let model = SplitModel::new(headers).unwrap();
    match pollster::block_on(async { Engine::load(Gpu::new().await.unwrap(), &model, parts, &EngineOptions::default()).await }) {
        Ok(_) => panic!("the engine loaded a model it must refuse"),
        Err(e) => e,
    }
}

#[test]
fn models_of_another_architecture_or_missing_tensors_are_refused() {
    let llama = rewritten(|m| m.iter_mut().filter(|(k, _)| k == "general.architecture").for_each(|kv| kv.1 = Value::String("llama".into())), None);
    assert!(load_error(&llama).contains("\"llama\" model"));
    let missing = rewritten(|_| {}, Some("blk.5.attn_gate.weight"));
    assert!(load_error(&missing).contains("no tensor \"blk.5.attn_gate.weight\""));
    // the same model untouched loads
    let fine = rewritten(|_| {}, None);
    let headers = fine.iter().map(|p| (parse_header(&p.bytes, None).unwrap(), p.bytes.len() as u64)).collect();
    let model = SplitModel::new(headers).unwrap();
    pollster::block_on(async { Engine::load(Gpu::new().await.unwrap(), &model, &fine, &EngineOptions::default()).await }).unwrap();
}

#[test]
fn bad_input_gives_clear_errors() {
    let mut engine = engine(&EngineOptions { n_ctx: Some(3), ..Default::default() });
    let vocab = engine.vocab_size() as u32;
    assert!(pollster::block_on(engine.step(vocab)).unwrap_err().contains("outside the vocabulary"));
    for t in [1, 2, 3] {
        pollster::block_on(engine.step(t)).unwrap();
    }
    assert!(pollster::block_on(engine.step(4)).unwrap_err().contains("context is full"));
    // the engine stays usable
    engine.reset();
    assert_eq!(pollster::block_on(engine.step(5)).unwrap().len(), vocab as usize);
}

/// `next_greedy` runs each step ahead of its pick's readback; whatever follows gives the logits of an engine fed
/// the same tokens one by one (tests/common/forward.rs; the browser runs it too).
#[test]
fn a_step_run_ahead_is_taken_or_undone() {
    // token by token, so the engines run the same kernels and agree to the bit
    let options = EngineOptions { prefill_chunk: Some(1), ..Default::default() };
    let short = EngineOptions { n_ctx: Some(forward::RUN_AHEAD_PROMPT.len() + 2), ..options.clone() };
    pollster::block_on(forward::run_ahead_is_taken_or_undone(engine(&options), engine(&options), engine(&short)));
}
