//! The engine on the tiny-ling fixture against llama.cpp's f32 twin, natively (lavapipe). The browser runs the
//! same checks from `tests/web.rs`.
#![cfg(not(target_arch = "wasm32"))]

mod common;

use common::forward::{self, Case};
use lingtab::engine::{Engine, EngineOptions};
use lingtab::gguf::{parse_header, SplitModel};
use lingtab::gpu::Gpu;
use lingtab::source::FileSource;
use std::path::PathBuf;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-ling").join(name)
}

fn engine(options: &EngineOptions) -> Engine {
    let names = ["tiny-ling-00001-of-00002.gguf", "tiny-ling-00002-of-00002.gguf"];
    let parts: Vec<FileSource> = names.iter().map(|n| FileSource::open(&fixture(n)).unwrap()).collect();
    let headers = names.iter().map(|n| {
        let bytes = std::fs::read(fixture(n)).unwrap();
        (parse_header(&bytes, Some(bytes.len() as u64)).unwrap(), bytes.len() as u64)
    });
    let model = SplitModel::new(headers.collect()).unwrap();
    pollster::block_on(async { Engine::load(Gpu::new().await.unwrap(), &model, &parts, options).await.unwrap() })
}

fn cases() -> Vec<Case> {
    let json = std::fs::read_to_string(fixture("golden/forward_cases.json")).unwrap();
    forward::cases(&json, |f| std::fs::read(fixture(&format!("golden/{f}"))).unwrap())
}

#[test]
fn logits_match_llama_cpp_f32_twin_on_every_fixture_case() {
    let mut engine = engine(&EngineOptions::default());
    for case in cases() {
        let (max_abs, rms) = pollster::block_on(forward::check_logits(&mut engine, &case));
        let greedy = pollster::block_on(forward::check_greedy(&mut engine, &case));
        eprintln!("{:<13} {:>3} positions ({} before a routing near-tie): max |Δ| {max_abs:.2e}, rms {rms:.2e}; greedy equal for {greedy} steps",
            case.id, case.tokens.len(), case.first_near_tie.min(case.tokens.len()));
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
