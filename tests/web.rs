//! Browser tests: wasm-bindgen-test in headless Chromium, in a dedicated worker (where OPFS sync access
//! handles exist), on WebGPU (SwiftShader in CI). A test that needs WebGPU fails — never skips — without it.
#![cfg(target_arch = "wasm32")]

use lingtab::gguf::{parse_header, SplitModel};
use lingtab::gpu::Gpu;
use lingtab::model::Config;
use lingtab::tiny::{TinyModel, TinyOptions};
use wasm_bindgen::JsCast;
use wasm_bindgen_futures::JsFuture;
use wasm_bindgen_test::*;

mod common;

wasm_bindgen_test_configure!(run_in_dedicated_worker);

fn log(msg: &str) {
    web_sys::console::log_1(&msg.into());
}

#[wasm_bindgen_test]
async fn webgpu_adapter_is_present() {
    let gpu = Gpu::new().await.expect("WebGPU adapter (Chromium with --enable-unsafe-webgpu --use-webgpu-adapter=swiftshader)");
    log(&format!("browser WebGPU adapter: {}", gpu.summary));
    assert_eq!(gpu.summary.backend, "BrowserWebGpu");
    assert!(gpu.summary.max_storage_buffer_binding_size >= 128 << 20);
}

#[wasm_bindgen_test]
async fn dequant_kernels_match_cpu_reference() {
    common::dequant::dequant_kernels_match_cpu_reference(&Gpu::new().await.expect("WebGPU adapter")).await;
}

#[wasm_bindgen_test]
async fn kda_conv_matches_cpu_reference() {
    common::kda::kda_conv_matches_cpu_reference(&Gpu::new().await.expect("WebGPU adapter")).await;
}

#[wasm_bindgen_test]
async fn kda_gates_match_cpu_reference() {
    common::kda::kda_gates_match_cpu_reference(&Gpu::new().await.expect("WebGPU adapter")).await;
}

#[wasm_bindgen_test]
async fn kda_delta_matches_cpu_reference() {
    common::kda::kda_delta_matches_cpu_reference(&Gpu::new().await.expect("WebGPU adapter")).await;
}

#[wasm_bindgen_test]
async fn kda_head_norm_gate_matches_cpu_reference() {
    common::kda::kda_head_norm_gate_matches_cpu_reference(&Gpu::new().await.expect("WebGPU adapter")).await;
}

#[wasm_bindgen_test]
async fn mla_kv_row_matches_reference() {
    common::mla_moe::mla_kv_row_matches_reference(&Gpu::new().await.expect("WebGPU adapter")).await;
}

#[wasm_bindgen_test]
async fn mla_rope_q_matches_reference() {
    common::mla_moe::mla_rope_q_matches_reference(&Gpu::new().await.expect("WebGPU adapter")).await;
}

#[wasm_bindgen_test]
async fn mla_attention_matches_reference() {
    common::mla_moe::mla_attention_matches_reference(&Gpu::new().await.expect("WebGPU adapter")).await;
}

#[wasm_bindgen_test]
async fn mla_head_gate_matches_reference() {
    common::mla_moe::mla_head_gate_matches_reference(&Gpu::new().await.expect("WebGPU adapter")).await;
}

#[wasm_bindgen_test]
async fn moe_route_matches_reference() {
    common::mla_moe::moe_route_matches_reference(&Gpu::new().await.expect("WebGPU adapter")).await;
}

#[wasm_bindgen_test]
async fn moe_route_ties_pick_lower_index() {
    common::mla_moe::moe_route_ties_pick_lower_index(&Gpu::new().await.expect("WebGPU adapter")).await;
}

#[wasm_bindgen_test]
async fn swiglu_matches_reference() {
    common::mla_moe::swiglu_matches_reference(&Gpu::new().await.expect("WebGPU adapter")).await;
}

#[wasm_bindgen_test]
async fn moe_accumulate_matches_reference() {
    common::mla_moe::moe_accumulate_matches_reference(&Gpu::new().await.expect("WebGPU adapter")).await;
}

#[wasm_bindgen_test]
async fn add_matches_reference() {
    common::mla_moe::add_matches_reference(&Gpu::new().await.expect("WebGPU adapter")).await;
}

#[wasm_bindgen_test]
fn make_tiny_model_reads_back_in_wasm() {
    let mut options = TinyOptions::tiny(7);
    options.layers = 3;
    options.dense_lead = 1;
    options.vocab = 600;
    options.experts = 8;
    options.expert_groups = 4;
    options.groups_used = 2;
    options.experts_used = 2;
    let model = TinyModel::plan(options).unwrap();
    let parts = model.to_parts().unwrap();
    let headers = parts.iter().map(|p| (parse_header(p, Some(p.len() as u64)).unwrap(), p.len() as u64)).collect();
    let split = SplitModel::new(headers).unwrap();
    let config = Config::from_header(split.header()).unwrap();
    assert_eq!((config.n_layer, config.n_expert, config.vocab_size), (3, 8, 600));
    assert_eq!(split.tensors.len(), model.writer.tensors.len());
}

#[wasm_bindgen_test]
async fn opfs_sync_access_handle_round_trip() {
    let scope: web_sys::WorkerGlobalScope = js_sys::global().unchecked_into();
    let root: web_sys::FileSystemDirectoryHandle =
        JsFuture::from(scope.navigator().storage().get_directory()).await.expect("OPFS root").unchecked_into();
    let options = web_sys::FileSystemGetFileOptions::new();
    options.set_create(true);
    let file: web_sys::FileSystemFileHandle =
        JsFuture::from(root.get_file_handle_with_options("lingtab-test.bin", &options)).await.unwrap().unchecked_into();
    let handle: web_sys::FileSystemSyncAccessHandle =
        JsFuture::from(file.create_sync_access_handle()).await.expect("sync access handle (dedicated worker)").unchecked_into();
    let data: Vec<u8> = (0..1 << 16).map(|i| (i * 31 % 251) as u8).collect();
    let at = web_sys::FileSystemReadWriteOptions::new();
    at.set_at(12345.0);
    handle.write_with_u8_array_and_options(&data, &at).unwrap();
    handle.flush().unwrap();
    let mut back = vec![0u8; data.len()];
    let read = handle.read_with_u8_array_and_options(&mut back, &at).unwrap();
    handle.close();
    JsFuture::from(root.remove_entry("lingtab-test.bin")).await.unwrap();
    assert_eq!(read as usize, data.len());
    assert_eq!(back, data);
}

/// The local HTTP server `.ci/test` starts for the browser tests (serving `tests/fixtures` with Range support).
fn test_server() -> &'static str {
    env!("LINGTAB_TEST_SERVER", "browser tests need LINGTAB_TEST_SERVER (see .ci/test)")
}

async fn fetch_bytes(url: &str) -> Vec<u8> {
    let scope: web_sys::WorkerGlobalScope = js_sys::global().unchecked_into();
    let response: web_sys::Response = JsFuture::from(scope.fetch_with_str(url)).await.unwrap().unchecked_into();
    assert_eq!(response.status(), 200, "{url}");
    js_sys::Uint8Array::new(&JsFuture::from(response.array_buffer().unwrap()).await.unwrap()).to_vec()
}

/// The tiny-ling fixture end to end in the browser: its two GGUF parts read over HTTP Range requests, the
/// engine on WebGPU, logits and greedy continuations against llama.cpp's f32 twin.
#[wasm_bindgen_test]
async fn forward_pass_matches_llama_cpp_in_browser() {
    use lingtab::engine::{Engine, EngineOptions};
    use lingtab::source::{open_model, HttpSource};
    let base = format!("{}/fixtures/tiny-ling", test_server());
    let first = format!("{base}/tiny-ling-00001-of-00002.gguf");
    let model = open_model(&first, |url| Ok(HttpSource { url: url.to_string() })).await.unwrap();
    let parts: Vec<HttpSource> = lingtab::gguf::split_part_names(&first).unwrap().into_iter().map(|url| HttpSource { url }).collect();
    let gpu = Gpu::new().await.expect("WebGPU adapter");
    let mut engine = Engine::load(gpu, &model, &parts, &EngineOptions::default()).await.unwrap();
    let json = String::from_utf8(fetch_bytes(&format!("{base}/golden/forward_cases.json")).await).unwrap();
    let mut files = std::collections::HashMap::new();
    // two cases keep SwiftShader's time in check: one token, and 21 tokens through KDA, MLA and MoE layers
    for case in ["hello", "sentence"] {
        let name = format!("{case}.f32.prefill_logits.f32");
        files.insert(name.clone(), fetch_bytes(&format!("{base}/golden/{name}")).await);
    }
    let cases = common::forward::cases(&json, |f| files.get(f).cloned().unwrap_or_default());
    for case in cases.iter().filter(|c| files.contains_key(&format!("{}.f32.prefill_logits.f32", c.id))) {
        let (max_abs, rms, _) = common::forward::check_logits(&mut engine, case).await;
        let greedy = common::forward::check_greedy(&mut engine, case).await;
        log(&format!("browser {}: {} positions, max |Δ| {max_abs:.2e}, rms {rms:.2e}; greedy equal for {greedy} steps", case.id, case.tokens.len()));
        assert!(greedy > 0 || case.first_near_tie < case.tokens.len(), "case {}: no greedy step compared", case.id);
    }
}

#[wasm_bindgen_test]
async fn matvec_every_type_matches_reference() {
    common::matvec::matvec_every_type_matches_reference(&Gpu::new().await.expect("WebGPU adapter")).await;
}

#[wasm_bindgen_test]
async fn batched_matvec_matches_reference() {
    common::matvec::batched_matvec_matches_reference(&Gpu::new().await.expect("WebGPU adapter")).await;
}

#[wasm_bindgen_test]
async fn expert_matvec_reads_selected_slots() {
    common::matvec::expert_matvec_reads_selected_slots(&Gpu::new().await.expect("WebGPU adapter")).await;
}

#[wasm_bindgen_test]
async fn rms_norm_and_argmax_match_reference() {
    common::matvec::rms_norm_and_argmax_match_reference(&Gpu::new().await.expect("WebGPU adapter")).await;
}
