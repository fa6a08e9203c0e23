//! The JavaScript API (wasm-bindgen). Errors reach JS as `Error`s with the engine's message, never as panics.

use crate::gpu::Gpu;
use crate::model::summary::summary;
use crate::source::{self, HttpSource};
use serde::Serialize;
use wasm_bindgen::prelude::*;

#[wasm_bindgen(start)]
fn start() {
    console_error_panic_hook::set_once();
}

fn to_js<T: Serialize>(value: &T) -> Result<JsValue, JsError> {
    value.serialize(&serde_wasm_bindgen::Serializer::json_compatible()).map_err(|e| JsError::new(&e.to_string()))
}

/// The WebGPU adapter lingtab would run on: name, backend, limits and features.
#[wasm_bindgen(js_name = adapterInfo)]
pub async fn adapter_info() -> Result<JsValue, JsError> {
    let gpu = Gpu::new().await.map_err(|e| JsError::new(&e.0))?;
    to_js(&gpu.summary)
}

/// Reads a (split) GGUF's headers over HTTP Range requests from the URL of its first part and describes the
/// model: architecture, config, parts, tensors and byte totals (the object `lingtab inspect --json` prints).
#[wasm_bindgen(js_name = inspectModel)]
pub async fn inspect_model(first_part_url: String) -> Result<JsValue, JsError> {
    let model = source::open_model(&first_part_url, |url| Ok(HttpSource { url: url.to_string() }))
        .await
        .map_err(|e| JsError::new(&e))?;
    to_js(&summary(&model, false).map_err(|e| JsError::new(&e))?)
}
