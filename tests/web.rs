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
