//! The tiny-ling fixture on the native adapter, for the native test crates.

use lingtab::engine::{Engine, EngineOptions};
use lingtab::gguf::{parse_header, SplitModel};
use lingtab::gpu::Gpu;
use lingtab::source::FileSource;
use std::path::PathBuf;

const PARTS: [&str; 2] = ["tiny-ling-00001-of-00002.gguf", "tiny-ling-00002-of-00002.gguf"];

pub fn path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-ling").join(name)
}

pub fn model() -> SplitModel {
    let headers = PARTS.iter().map(|n| {
        let bytes = std::fs::read(path(n)).unwrap();
        (parse_header(&bytes, Some(bytes.len() as u64)).unwrap(), bytes.len() as u64)
    });
    SplitModel::new(headers.collect()).unwrap()
}

pub fn engine(model: &SplitModel, options: &EngineOptions) -> Engine {
    let parts: Vec<FileSource> = PARTS.iter().map(|n| FileSource::open(&path(n)).unwrap()).collect();
    pollster::block_on(async { Engine::load(Gpu::new().await.unwrap(), model, &parts, options).await.unwrap() })
}

/// [`engine`] opened to stream its experts (a pool below the model's experts, as the options size it).
pub fn open(model: &SplitModel, options: &EngineOptions) -> Engine {
    let parts: Vec<FileSource> = PARTS.iter().map(|n| FileSource::open(&path(n)).unwrap()).collect();
    pollster::block_on(async { Engine::open(Gpu::new().await.unwrap(), model, parts, options).await.unwrap() })
}
