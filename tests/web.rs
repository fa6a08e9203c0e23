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
async fn kda_gates_match_cpu_reference() {
    common::kda::kda_gates_match_cpu_reference(&Gpu::new().await.expect("WebGPU adapter")).await;
}

#[wasm_bindgen_test]
async fn kda_head_norm_gate_matches_cpu_reference() {
    common::kda::kda_head_norm_gate_matches_cpu_reference(&Gpu::new().await.expect("WebGPU adapter")).await;
}

#[wasm_bindgen_test]
async fn kda_step_matches_the_four_references() {
    common::kda::kda_step_matches_the_four_references(&Gpu::new().await.expect("WebGPU adapter")).await;
}

#[wasm_bindgen_test]
async fn kda_delta_chunk_matches_the_reference() {
    common::kda::kda_delta_chunk_matches_the_reference(&Gpu::new().await.expect("WebGPU adapter")).await;
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
async fn mla_kv_row_and_rope_q_match_the_two_kernels() {
    common::mla_moe::mla_kv_row_and_rope_q_match_the_two_kernels(&Gpu::new().await.expect("WebGPU adapter")).await;
}

#[wasm_bindgen_test]
async fn mla_attention_matches_reference() {
    common::mla_moe::mla_attention_matches_reference(&Gpu::new().await.expect("WebGPU adapter")).await;
}

#[wasm_bindgen_test]
async fn mla_attention_by_products_matches_reference() {
    common::mla_moe::mla_attention_by_products_matches_reference(&Gpu::new().await.expect("WebGPU adapter")).await;
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
async fn moe_sum_norm_is_accumulate_then_rms_norm() {
    common::mla_moe::moe_sum_norm_is_accumulate_then_rms_norm(&Gpu::new().await.expect("WebGPU adapter")).await;
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
    let model = open_model(&first, |url| Ok(HttpSource::new(url))).await.unwrap();
    let parts: Vec<HttpSource> = lingtab::gguf::split_part_names(&first).unwrap().into_iter().map(HttpSource::new).collect();
    let gpu = Gpu::new().await.expect("WebGPU adapter");
    let mut engine = Engine::load(gpu, &model, &parts, &EngineOptions::default()).await.unwrap();
    let json = String::from_utf8(fetch_bytes(&format!("{base}/golden/forward_cases.json")).await).unwrap();
    let mut files = std::collections::HashMap::new();
    // two cases and 8 greedy steps each keep SwiftShader's time in check (a step takes it about 2 s): one token,
    // and 21 tokens through KDA, MLA and MoE layers (the native test compares every case's 32 steps)
    for case in ["hello", "sentence"] {
        let name = format!("{case}.f32.prefill_logits.f32");
        files.insert(name.clone(), fetch_bytes(&format!("{base}/golden/{name}")).await);
    }
    let cases = common::forward::cases(&json, |f| files.get(f).cloned().unwrap_or_default());
    for case in cases.iter().filter(|c| files.contains_key(&format!("{}.f32.prefill_logits.f32", c.id))) {
        let (max_abs, rms, _) = common::forward::check_logits(&mut engine, case).await;
        let greedy = common::forward::check_greedy(&mut engine, case, 8).await;
        log(&format!("browser {}: {} positions, max |Δ| {max_abs:.2e}, rms {rms:.2e}; greedy equal for {greedy} steps", case.id, case.tokens.len()));
        assert!(greedy > 0 || case.first_near_tie < case.tokens.len(), "case {}: no greedy step compared", case.id);
    }
}

#[wasm_bindgen_test]
async fn matvec_every_type_matches_reference() {
    // the engine's variants only: the others are options of lingtab bench-kernels, which is native (tests/gpu.rs
    // runs them all)
    common::matvec::matvec_every_type_matches_reference(&Gpu::new().await.expect("WebGPU adapter"), &lingtab::gpu::matvec::Variant::ENGINE).await;
}

#[wasm_bindgen_test]
async fn matvec_add_adds_the_product_to_y() {
    common::matvec::matvec_add_adds_the_product_to_y(&Gpu::new().await.expect("WebGPU adapter")).await;
}

#[wasm_bindgen_test]
async fn stacked_matvec_matches_each_product() {
    common::matvec::stacked_matvec_matches_each_product(&Gpu::new().await.expect("WebGPU adapter")).await;
}

#[wasm_bindgen_test]
async fn swiglu_products_match_activation_then_product() {
    common::matvec::swiglu_products_match_activation_then_product(&Gpu::new().await.expect("WebGPU adapter")).await;
}

#[wasm_bindgen_test]
async fn batched_matvec_matches_reference() {
    common::matvec::batched_matvec_matches_reference(&Gpu::new().await.expect("WebGPU adapter")).await;
}

#[wasm_bindgen_test]
async fn sliced_and_gated_products_match_the_three_dispatches() {
    common::matvec::sliced_and_gated_products_match_the_three_dispatches(&Gpu::new().await.expect("WebGPU adapter"), &lingtab::gpu::matvec::Variant::ENGINE).await;
}

#[wasm_bindgen_test]
async fn expert_matvec_reads_selected_slots() {
    common::matvec::expert_matvec_reads_selected_slots(&Gpu::new().await.expect("WebGPU adapter")).await;
}


#[wasm_bindgen_test]
async fn matmul_every_type_matches_reference() {
    common::matmul::matmul_every_type_matches_reference(&Gpu::new().await.expect("WebGPU adapter")).await;
}

#[wasm_bindgen_test]
async fn split_matmul_matches_reference() {
    common::matmul::split_matmul_matches_reference(&Gpu::new().await.expect("WebGPU adapter")).await;
}

#[wasm_bindgen_test]
async fn batched_matmul_matches_reference() {
    common::matmul::batched_matmul_matches_reference(&Gpu::new().await.expect("WebGPU adapter")).await;
}

#[wasm_bindgen_test]
async fn grouped_expert_matmul_reads_each_pairs_expert() {
    // the engine's tiles only: the others are options of lingtab bench, which is native (tests/gpu.rs runs them all)
    common::matmul::grouped_expert_matmul_reads_each_pairs_expert(&Gpu::new().await.expect("WebGPU adapter"), &lingtab::gpu::matmul::ExpertTiles::ENGINE).await;
}

#[wasm_bindgen_test]
async fn norm_products_match_norm_then_product() {
    common::matvec::norm_products_match_norm_then_product(&Gpu::new().await.expect("WebGPU adapter")).await;
}

#[wasm_bindgen_test]
async fn rms_norm_and_argmax_match_reference() {
    common::matvec::rms_norm_and_argmax_match_reference(&Gpu::new().await.expect("WebGPU adapter")).await;
}

// ---- stores in OPFS and ingest -------------------------------------------------------------------------------

mod store {
    use super::{fetch_bytes, log, test_server};
    use lingtab::engine::{Engine, EngineOptions};
    use lingtab::gguf::{parse_header, SplitModel};
    use lingtab::gpu::Gpu;
    use lingtab::ingest::{ingest, IngestOptions, PartHint};
    use lingtab::source::{BlobSource, HttpSource, RangeSource, RemoteIdentity, Tracked};
    use lingtab::store::{check_quota, check_value, estimate, open_complete, read_checks, read_manifest, space_verdict, Access, OpfsDir, OpfsReaders, ReadersError, StoreDir, StoreFile, StoreLayout, StorePartView, StoreState};
    use sha2::{Digest, Sha256};
    use std::cell::{Cell, RefCell};
    use std::rc::Rc;
    use wasm_bindgen::prelude::*;
    use wasm_bindgen::JsCast;
    use wasm_bindgen_futures::JsFuture;
    use wasm_bindgen_test::*;

    const NAMES: [&str; 2] = ["tiny-ling-00001-of-00002.gguf", "tiny-ling-00002-of-00002.gguf"];

    fn urls() -> Vec<String> {
        NAMES.iter().map(|n| format!("{}/fixtures/tiny-ling/{n}", test_server())).collect()
    }

    /// The fixture's parts as the server sends them whole (the independent copy the stores are checked against).
    async fn fixture_files() -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        for u in urls() {
            out.push(fetch_bytes(&u).await);
        }
        out
    }

    /// What a complete store's data file must hold: every kept byte of the GGUF files where the layout puts it
    /// (zeros in the alignment gaps).
    fn expected_data(files: &[Vec<u8>]) -> Vec<u8> {
        let headers = files.iter().map(|b| (parse_header(b, Some(b.len() as u64)).unwrap(), b.len() as u64)).collect();
        let layout = StoreLayout::from_model(&SplitModel::new(headers).unwrap()).unwrap();
        let mut data = vec![0u8; layout.data_len as usize];
        for p in layout.pieces.iter().filter(|p| p.store_offset < layout.data_len) {
            let at = p.store_offset as usize;
            data[at..at + p.len as usize].copy_from_slice(&files[p.part][p.file_offset as usize..(p.file_offset + p.len) as usize]);
        }
        data
    }

    /// The check values of the GGUF bytes, from the tensor tables (not the store's layout).
    fn checks_of(files: &[Vec<u8>]) -> lingtab::store::StoreChecks {
        use lingtab::model::layout::{role, Role, EXPERT_TENSORS};
        let model = SplitModel::new(files.iter().map(|b| (parse_header(b, Some(b.len() as u64)).unwrap(), b.len() as u64)).collect()).unwrap();
        let config = lingtab::model::Config::from_header(model.header()).unwrap();
        let n = config.n_expert as u64;
        let headers = model.parts.iter().zip(files).map(|(h, f)| check_value(&f[..h.data_start as usize])).collect();
        let mut checks = lingtab::store::StoreChecks { dense: Default::default(), experts: vec![None; config.n_layer], headers };
        for t in &model.tensors {
            let at = |from: u64, len: u64| &files[t.part][(t.file_offset + from) as usize..(t.file_offset + from + len) as usize];
            match role(&config, &t.info.name) {
                Role::Global | Role::Dense { .. } => {
                    checks.dense.insert(t.info.name.clone(), check_value(at(0, t.info.n_bytes())));
                }
                Role::Experts { layer } => {
                    let which = EXPERT_TENSORS.iter().position(|s| t.info.name == format!("blk.{layer}.{s}")).unwrap();
                    let per = t.info.n_bytes() / n;
                    let experts = checks.experts[layer].get_or_insert_with(|| vec![[0; 3]; n as usize]);
                    for e in 0..n {
                        experts[e as usize][which] = check_value(at(e * per, per));
                    }
                }
                _ => {}
            }
        }
        checks
    }

    /// A store name no earlier run left behind.
    async fn fresh_store(tag: &str) -> String {
        let name = format!("test-{tag}-{}", js_sys::Date::now() as u64);
        OpfsDir::delete(&name).await.unwrap();
        name
    }

    async fn read_file<D: StoreDir>(dir: &D, name: &str) -> Vec<u8> {
        let f = dir.open(name, false).await.unwrap().unwrap_or_else(|| panic!("{name} is missing"));
        let mut buf = vec![0u8; f.size().await.unwrap() as usize];
        f.read_at(0, &mut buf).await.unwrap();
        buf
    }

    async fn http_parts() -> (Vec<HttpSource>, Vec<PartHint>) {
        let parts: Vec<HttpSource> = urls().into_iter().map(HttpSource::new).collect();
        let mut hints = Vec::new();
        for p in &parts {
            let id = p.probe().await.unwrap();
            hints.push(PartHint { etag: id.etag, size: Some(id.size), sha256: id.sha256 });
        }
        (parts, hints)
    }

    fn message(e: JsValue) -> String {
        js_sys::Reflect::get(&e, &"message".into()).ok().and_then(|m| m.as_string()).unwrap_or_else(|| format!("{e:?}"))
    }

    fn get(v: &JsValue, k: &str) -> JsValue {
        js_sys::Reflect::get(v, &k.into()).unwrap()
    }

    /// Ingest over HTTP into OPFS (sync access handles, in this worker), then the engine loaded from the store
    /// gives bit-identical logits to the engine loaded from the GGUF over HTTP.
    #[wasm_bindgen_test]
    async fn opfs_store_ingested_over_http_gives_the_gguf_logits() {
        let name = fresh_store("logits").await;
        let files = fixture_files().await;
        let dir = OpfsDir::open(&name, true).await.unwrap().unwrap();
        assert_eq!(dir.access(), Access::Sync, "a dedicated worker has sync access handles");
        let (parts, hints) = http_parts().await;
        let began = js_sys::Date::now();
        let m = ingest(&dir, &parts, &hints, &IngestOptions { unit_bytes: 1 << 20, in_flight: 4 }, &mut |_| {}).await.unwrap();
        log(&format!("OPFS ingest of {} bytes: {:.0} ms", files.iter().map(|f| f.len()).sum::<usize>(), js_sys::Date::now() - began));
        assert_eq!(m.state, StoreState::Complete);
        for (p, f) in m.parts.iter().zip(&files) {
            assert_eq!(p.sha256.as_deref(), Some(format!("{:x}", Sha256::digest(f)).as_str()));
        }
        assert!(read_file(&dir, "data.bin").await == expected_data(&files), "the OPFS data file differs from the GGUF bytes laid out");
        for f in ["journal.bin", "tail.bin", "hash.json", "checks.log"] {
            assert!(dir.open(f, false).await.unwrap().is_none(), "{f} is left in a complete store");
        }
        assert!(read_checks(&dir).await.unwrap().is_some(), "a complete store has its check values");
        drop(dir);

        let dir = OpfsDir::open(&name, false).await.unwrap().unwrap();
        let (model, views) = open_complete(&dir).await.unwrap();
        let mut from_store = Engine::load(Gpu::new().await.expect("WebGPU adapter"), &model, &views, &EngineOptions::default()).await.unwrap();
        let http_model = lingtab::source::open_model(&urls()[0], |u| Ok(HttpSource::new(u))).await.unwrap();
        let http: Vec<HttpSource> = urls().into_iter().map(HttpSource::new).collect();
        let mut from_gguf = Engine::load(Gpu::new().await.expect("WebGPU adapter"), &http_model, &http, &EngineOptions::default()).await.unwrap();
        for t in [2949u32, 3536, 786] {
            let a = from_store.step(t).await.unwrap();
            let b = from_gguf.step(t).await.unwrap();
            assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()) && a.len() == b.len(), "logits differ at token {t}");
        }
        drop((from_store, views, dir));
        assert!(OpfsDir::delete(&name).await.unwrap());
    }

    /// Interruptions — a read that fails (what an abort does) and the ingest future dropped mid-way (what
    /// closing the tab does to the work in flight) — then a resume: the store is byte-identical to the GGUF
    /// bytes laid out, and the bytes fetched stay within the units in flight per interruption.
    #[wasm_bindgen_test]
    async fn an_interrupted_opfs_ingest_resumes_to_the_same_bytes() {
        let name = fresh_store("resume").await;
        let files = fixture_files().await;
        let total: u64 = files.iter().map(|f| f.len() as u64).sum();
        let unit = 512u64 << 10;
        let options = IngestOptions { unit_bytes: unit, in_flight: 3 };
        let fetched = Rc::new(Cell::new(0u64));
        let stop_after = Rc::new(Cell::new(u64::MAX));
        let tracked = |parts: Vec<HttpSource>| -> Vec<Tracked<HttpSource>> {
            let (fetched, stop_after) = (fetched.clone(), stop_after.clone());
            let on_read: Rc<dyn Fn(u64) -> Result<(), String>> = Rc::new(move |n| {
                // unit reads only (the header reads are 1 MiB, the probes 1 byte)
                if n > 1 && n <= unit {
                    fetched.set(fetched.get() + n);
                }
                if fetched.get() >= stop_after.get() { Err("stopped by the test".into()) } else { Ok(()) }
            });
            parts.into_iter().map(|inner| Tracked { inner, on_read: on_read.clone() }).collect()
        };
        // 1: stopped by a failing read after a third of the bytes
        let (parts, hints) = http_parts().await;
        stop_after.set(total / 3);
        let dir = OpfsDir::open(&name, true).await.unwrap().unwrap();
        let err = ingest(&dir, &tracked(parts), &hints, &options, &mut |_| {}).await.unwrap_err();
        assert!(err.contains("stopped by the test"), "{err}");
        assert_eq!(read_manifest(&dir).await.unwrap().unwrap().state, StoreState::Ingesting);
        drop(dir);
        // 2: the future dropped after a few more units were journaled
        stop_after.set(u64::MAX);
        let (parts, hints) = http_parts().await;
        let dir = OpfsDir::open(&name, false).await.unwrap().unwrap();
        let progress = Rc::new(RefCell::new(Vec::new()));
        let journaled_at_drop = {
            let parts = tracked(parts);
            // the 8th fetch event (seven units journaled) drops the ingest: no timer, so no race with it
            let (tx, rx) = futures_channel::oneshot::channel::<()>();
            let mut tx = Some(tx);
            let seen = progress.clone();
            let mut on_progress = move |p: &lingtab::ingest::Progress| {
                seen.borrow_mut().push(p.clone());
                if seen.borrow().iter().filter(|p| p.phase == lingtab::ingest::Phase::Fetch).count() == 8 {
                    let _ = tx.take().map(|tx| tx.send(()));
                }
            };
            let run = Box::pin(ingest(&dir, &parts, &hints, &options, &mut on_progress));
            match futures_util::future::select(run, rx).await {
                futures_util::future::Either::Left((r, _)) => panic!("the ingest ended before it was dropped: {r:?}"),
                futures_util::future::Either::Right(_) => {}
            }
            read_file(&dir, "journal.bin").await.len() / 4
        };
        assert!(journaled_at_drop > 0);
        let resumed_from = progress.borrow().iter().find(|p| p.phase == lingtab::ingest::Phase::Fetch).map(|p| p.bytes_done).unwrap();
        assert!(resumed_from > 0 && resumed_from < total, "the second run resumed from {resumed_from} of {total} bytes");
        drop(dir);
        // 3: resumed to the end
        let (parts, hints) = http_parts().await;
        let dir = OpfsDir::open(&name, false).await.unwrap().unwrap();
        let mut phases = Vec::new();
        let m = ingest(&dir, &tracked(parts), &hints, &options, &mut |p| phases.push((p.phase, p.bytes_done, p.bytes_total))).await.unwrap();
        assert_eq!(m.state, StoreState::Complete);
        assert_eq!(phases.last().unwrap(), &(lingtab::ingest::Phase::Done, total, total));
        assert!(read_file(&dir, "data.bin").await == expected_data(&files), "the resumed store differs from the GGUF bytes laid out");
        assert!(read_checks(&dir).await.unwrap() == Some(checks_of(&files)), "the resumed store's check values differ from the GGUF bytes'");
        let sent = fetched.get();
        log(&format!("resumed OPFS ingest: {sent} unit bytes fetched for {total}"));
        assert!(sent >= total && sent <= total + 2 * options.in_flight as u64 * unit, "fetched {sent} bytes for {total} with 2 interruptions");
        drop(dir);
        assert!(OpfsDir::delete(&name).await.unwrap());
    }

    /// The JS API: ingest with an AbortSignal (aborted from onProgress), storeInfo of the unfinished store, a
    /// resume, listStores, Engine.load({ store }) and deleteStore.
    #[wasm_bindgen_test]
    async fn js_api_ingest_aborts_resumes_lists_loads_and_deletes() {
        use lingtab::web::store::{delete_store, ingest_js, list_stores, store_info};
        let name = fresh_store("js").await;
        let files = fixture_files().await;
        let controller = web_sys::AbortController::new().unwrap();
        let events = Rc::new(RefCell::new(Vec::<JsValue>::new()));
        let on_progress = {
            let (events, controller) = (events.clone(), controller.clone());
            Closure::<dyn FnMut(JsValue)>::new(move |ev: JsValue| {
                events.borrow_mut().push(ev.clone());
                if get(&ev, "phase").as_string().as_deref() == Some("fetch") && get(&ev, "bytesDone").as_f64().unwrap() > 0.0 {
                    controller.abort();
                }
            })
        };
        let options = js_sys::Object::new();
        let set = |o: &js_sys::Object, k: &str, v: &JsValue| {
            js_sys::Reflect::set(o, &k.into(), v).unwrap();
        };
        set(&options, "model", &urls()[0].clone().into());
        set(&options, "store", &name.clone().into());
        set(&options, "unitBytes", &(256 * 1024).into());
        set(&options, "inFlight", &2.into());
        set(&options, "onProgress", on_progress.as_ref());
        set(&options, "signal", &controller.signal());
        let err = message(ingest_js(options.clone().into()).await.unwrap_err().into());
        assert!(err.contains("aborted"), "{err}");
        let ev = events.borrow()[0].clone();
        assert_eq!(get(&ev, "phase").as_string().as_deref(), Some("headers"));
        let info = store_info(name.clone()).await.unwrap();
        assert_eq!(get(&info, "state").as_string().as_deref(), Some("ingesting"));
        assert_eq!(get(&info, "model").as_string(), Some(urls()[0].clone()));
        // how far the stopped ingest got: the journaled units' bytes, at least the one the abort came after
        let total = files.iter().map(|f| f.len() as f64).sum::<f64>();
        let (done, of) = (get(&info, "bytesDone").as_f64().expect("bytesDone"), get(&info, "bytesTotal").as_f64().unwrap());
        log(&format!("storeInfo of the aborted ingest: bytesDone {done} of {of}"));
        assert!(of == total && done >= (256 * 1024) as f64 && done < total, "bytesDone {done} of {of} (GGUF {total})");
        let last_fetch = events.borrow().iter().rev().find(|e| get(e, "phase").as_string().as_deref() == Some("fetch")).map(|e| get(e, "bytesDone").as_f64().unwrap()).unwrap();
        assert!(done >= last_fetch, "storeInfo says {done} bytes done, the last progress event {last_fetch}");

        set(&options, "signal", &JsValue::UNDEFINED);
        set(&options, "onProgress", &JsValue::UNDEFINED);
        let summary = ingest_js(options.into()).await.unwrap();
        assert_eq!(get(&summary, "state").as_string().as_deref(), Some("complete"));
        assert_eq!((get(&summary, "bytesDone").as_f64(), get(&summary, "bytesTotal").as_f64()), (Some(total), Some(total)));
        let parts = js_sys::Array::from(&get(&summary, "parts"));
        for (p, f) in parts.iter().zip(&files) {
            assert_eq!(get(&p, "sha256").as_string(), Some(format!("{:x}", Sha256::digest(f))));
            assert_eq!(get(&p, "size").as_f64(), Some(f.len() as f64));
        }
        let listed = js_sys::Array::from(&list_stores().await.unwrap());
        let mine = listed.iter().find(|s| get(s, "name").as_string().as_deref() == Some(name.as_str())).expect("listStores lists the store");
        assert_eq!(get(&mine, "state").as_string().as_deref(), Some("complete"));
        assert_eq!(get(&mine, "bytes").as_f64(), Some(expected_data(&files).len() as f64));

        let load = js_sys::Object::new();
        set(&load, "store", &name.clone().into());
        let engine = lingtab::web::Engine::load(load.into()).await.unwrap();
        assert!(engine.stats().is_ok());
        engine.dispose();
        drop(engine);
        // a store whose files are open (an ingest or an engine holds them) is not deleted under it
        let holder = OpfsDir::open(&name, false).await.unwrap().unwrap();
        let _data = holder.open("data.bin", false).await.unwrap().unwrap();
        let busy = message(delete_store(name.clone()).await.unwrap_err().into());
        assert!(busy.contains("in use"), "deleting a store while its data file is open: {busy}");
        drop((_data, holder));
        assert!(delete_store(name.clone()).await.unwrap());
        assert!(store_info(name.clone()).await.unwrap().is_null());
        assert!(!delete_store(name.clone()).await.unwrap());
        let load = js_sys::Object::new();
        set(&load, "store", &name.clone().into());
        let missing = message(lingtab::web::Engine::load(load.into()).await.err().unwrap().into());
        assert!(missing.contains("no store named"), "{missing}");
    }

    /// Files the user picked (here Files made from the fetched bytes, given in the wrong order): ingested with
    /// no download into a store equal to the GGUF bytes laid out.
    #[wasm_bindgen_test]
    async fn picked_files_are_ingested_without_downloading() {
        use lingtab::web::store::ingest_js;
        let name = fresh_store("files").await;
        let files = fixture_files().await;
        let picked = js_sys::Array::new();
        for (bytes, n) in files.iter().zip(NAMES).rev() {
            let parts = js_sys::Array::of1(&js_sys::Uint8Array::from(&bytes[..]));
            picked.push(&web_sys::File::new_with_u8_array_sequence(&parts, n).unwrap());
        }
        // a BlobSource reads exactly the ranges asked for
        let part1 = BlobSource::from_file(picked.get(1).unchecked_into());
        assert_eq!(part1.read_range(1000, 77).await.unwrap(), (files[0][1000..1077].to_vec(), files[0].len() as u64));
        let options = js_sys::Object::new();
        js_sys::Reflect::set(&options, &"files".into(), &picked).unwrap();
        js_sys::Reflect::set(&options, &"store".into(), &name.clone().into()).unwrap();
        let summary = ingest_js(options.into()).await.unwrap();
        assert_eq!(get(&summary, "state").as_string().as_deref(), Some("complete"));
        let parts = js_sys::Array::from(&get(&summary, "parts"));
        for ((p, f), n) in parts.iter().zip(&files).zip(NAMES) {
            assert_eq!(get(&p, "source").as_string().as_deref(), Some(n), "parts in part order");
            assert_eq!(get(&p, "sha256").as_string(), Some(format!("{:x}", Sha256::digest(f))));
        }
        let dir = OpfsDir::open(&name, false).await.unwrap().unwrap();
        assert!(read_file(&dir, "data.bin").await == expected_data(&files));
        drop(dir);
        assert!(OpfsDir::delete(&name).await.unwrap());
    }

    /// The quota check: from the real estimate, and a store whose space is limited below what it needs fails
    /// before writing anything, with both numbers in the error.
    #[wasm_bindgen_test]
    async fn too_little_space_fails_before_writing_with_both_numbers() {
        let (quota, usage) = estimate().await.unwrap();
        log(&format!("navigator.storage.estimate(): quota {quota}, usage {usage}"));
        assert!(quota > usage);
        let available = quota - usage;
        assert!(check_quota(available, quota, usage).is_ok());
        let err = check_quota(available + 1, quota, usage).unwrap_err();
        assert!(err.contains(&format!("needs {} more bytes", available + 1)) && err.contains(&format!("allows this site {available} more")), "{err}");

        let name = fresh_store("quota").await;
        let files = fixture_files().await;
        let dir = OpfsDir::open(&name, true).await.unwrap().unwrap().limit_space(1 << 20);
        let (parts, hints) = http_parts().await;
        let err = ingest(&dir, &parts, &hints, &IngestOptions::default(), &mut |_| {}).await.unwrap_err();
        let headers = files.iter().map(|b| (parse_header(b, Some(b.len() as u64)).unwrap(), b.len() as u64)).collect();
        let needed = StoreLayout::from_model(&SplitModel::new(headers).unwrap()).unwrap().ingest_len;
        assert!(err.contains(&format!("needs {needed} more bytes")) && err.contains(&format!("allows this site {} more", 1 << 20)), "{err}");
        assert!(read_manifest(&dir).await.unwrap().is_none(), "a manifest was written");
        assert!(dir.open("data.bin", false).await.unwrap().is_none(), "a data file was made");
        drop(dir);
        assert!(OpfsDir::delete(&name).await.unwrap());

        // Chrome 138+'s static estimate (usage + min(10 GiB, disk)) does not refuse a bigger store up front: a
        // warning, and the writes meet the real quota (the page's e2e test shows that error)
        const GIB: u64 = 1 << 30;
        let usage = 123_456_789;
        let warning = space_verdict(77_000_000_000, usage + 10 * GIB, usage, None).unwrap().expect("a warning");
        assert!(warning.contains("77000000000") && warning.contains("not the real quota"), "{warning}");
        assert!(space_verdict(77_000_000_000, usage + 3 * GIB, usage, None).unwrap().is_some(), "a capped figure below 10 GiB (a small disk)");
        // … but a figure that is not the cap is the real quota: refused, with both numbers
        let err = space_verdict(77_000_000_000, usage + 5_000_000_000, usage, None).unwrap_err();
        assert!(err.contains("needs 77000000000 more bytes") && err.contains("allows this site 5000000000 more"), "{err}");
        assert!(space_verdict(77_000_000_000, usage + 11 * GIB, usage, None).is_err(), "more than the cap is not the cap");
        // a budget set on the store is authoritative too, whatever the estimate
        let err = space_verdict(2 << 20, usage + 10 * GIB, usage, Some(1 << 20)).unwrap_err();
        assert!(err.contains(&format!("needs {} more bytes", 2 << 20)) && err.contains(&format!("allows this site {} more", 1 << 20)), "{err}");
        assert_eq!(space_verdict(1 << 20, usage + 10 * GIB, usage, None), Ok(None));
        assert_eq!(space_verdict(1 << 20, usage + 10 * GIB, usage, Some(2 << 20)), Ok(None));
    }

    /// Check values in the browser: ingest writes them (equal to the GGUF bytes' own), and a byte changed in
    /// the OPFS data file afterwards makes `Engine.load({ store })` fail naming the layer and expert.
    #[wasm_bindgen_test]
    async fn a_byte_changed_in_the_opfs_data_file_fails_the_load() {
        let name = fresh_store("checks").await;
        let files = fixture_files().await;
        let dir = OpfsDir::open(&name, true).await.unwrap().unwrap();
        let (parts, hints) = http_parts().await;
        ingest(&dir, &parts, &hints, &IngestOptions { unit_bytes: 1 << 20, in_flight: 4 }, &mut |_| {}).await.unwrap();
        let checks = read_checks(&dir).await.unwrap().expect("a complete store has checks.json");
        assert!(checks == checks_of(&files), "the check values differ from the GGUF bytes'");
        let model = SplitModel::new(files.iter().map(|b| (parse_header(b, Some(b.len() as u64)).unwrap(), b.len() as u64)).collect()).unwrap();
        let layout = StoreLayout::from_model(&model).unwrap();
        let records = &layout.experts[0];
        let up = model.tensor(&format!("blk.{}.ffn_up_exps.weight", records.layer)).unwrap();
        let per = up.info.n_bytes() / 32;
        let slice = &files[up.part][(up.file_offset + 5 * per) as usize..(up.file_offset + 6 * per) as usize];
        assert_eq!(checks.expert(records.layer, 5, 1), Some(check_value(slice)));
        let t = model.tensors.iter().find(|t| t.info.name == "token_embd.weight").unwrap();
        assert_eq!(checks.dense.get("token_embd.weight"), Some(&check_value(&files[t.part][t.file_offset as usize..(t.file_offset + t.info.n_bytes()) as usize])));
        // one byte of expert 5's up rows changed in OPFS
        let data = dir.open("data.bin", false).await.unwrap().unwrap();
        let at = records.offset + 5 * records.stride + records.up + 11;
        let mut b = [0u8; 1];
        data.read_at(at, &mut b).await.unwrap();
        data.write_at(at, &[b[0] ^ 0x04]).await.unwrap();
        data.flush().await.unwrap();
        drop((data, dir));
        let load = js_sys::Object::new();
        js_sys::Reflect::set(&load, &"store".into(), &name.clone().into()).unwrap();
        let err = message(lingtab::web::Engine::load(load.into()).await.err().expect("the load fails").into());
        log(&format!("Engine.load of a changed store: {err}"));
        assert!(err.contains(&format!("layer {} expert 5: its up rows", records.layer)) && err.contains("changed on disk"), "{err}");
        assert!(OpfsDir::delete(&name).await.unwrap());
    }

    /// The async file API (what a window uses, where there are no sync handles): an ingest into it, atomic
    /// small-file replacement, and a load of the store through it.
    #[wasm_bindgen_test]
    async fn the_async_file_api_store_ingests_and_loads() {
        let name = fresh_store("async").await;
        let files = fixture_files().await;
        let dir = OpfsDir::open(&name, true).await.unwrap().unwrap().with_access(Access::Async);
        dir.write_atomic("probe.json", b"first").await.unwrap();
        dir.write_atomic("probe.json", b"second, longer").await.unwrap();
        assert_eq!(dir.read_all("probe.json").await.unwrap().as_deref(), Some(&b"second, longer"[..]));
        dir.remove("probe.json").await.unwrap();
        assert_eq!(dir.read_all("probe.json").await.unwrap(), None);
        let (parts, hints) = http_parts().await;
        let began = js_sys::Date::now();
        // large units: every flush of the async API commits (copies) the whole file
        let m = ingest(&dir, &parts, &hints, &IngestOptions { unit_bytes: 8 << 20, in_flight: 2 }, &mut |_| {}).await.unwrap();
        log(&format!("async-API OPFS ingest: {:.0} ms", js_sys::Date::now() - began));
        assert_eq!(m.state, StoreState::Complete);
        assert!(read_file(&dir, "data.bin").await == expected_data(&files));
        let (model, views) = open_complete(&dir).await.unwrap();
        let t = model.tensors.iter().find(|t| t.info.name == "token_embd.weight").unwrap();
        let (got, _) = views[t.part].read_range(t.file_offset, 4096).await.unwrap();
        assert!(got[..] == files[t.part][t.file_offset as usize..t.file_offset as usize + 4096]);
        drop((views, dir));
        assert!(OpfsDir::delete(&name).await.unwrap());
    }

    /// Servers that stall (`lingtab serve --faults`): the headers and half the body then silence, or no answer
    /// at all, the first time each range is asked for. `fetch` has no timeout of its own; the source leaves
    /// each stalled answer after its stall timeout and asks again, and the store is complete and right. A
    /// server that always stalls: a clear error after the retries, in bounded time, through the JS API's
    /// `stallTimeoutMs` as a page would meet it.
    #[wasm_bindgen_test]
    async fn stalled_answers_are_left_and_asked_again() {
        use lingtab::web::store::ingest_js;
        let files = fixture_files().await;
        for mode in ["stall-once", "silent-once"] {
            let name = fresh_store(mode).await;
            let tag = name.clone();
            let parts: Vec<HttpSource> = NAMES
                .iter()
                .map(|n| {
                    let mut s = HttpSource::new(format!("{}/faults/{mode}/fixtures/tiny-ling/{n}?{tag}", test_server())).with_stall_timeout_ms(300);
                    s.retries = 2;
                    s
                })
                .collect();
            let mut hints = Vec::new();
            for p in &parts {
                let id = p.probe().await.unwrap();
                hints.push(PartHint { etag: id.etag, size: Some(id.size), sha256: id.sha256 });
            }
            let dir = OpfsDir::open(&name, true).await.unwrap().unwrap();
            let began = js_sys::Date::now();
            let m = ingest(&dir, &parts, &hints, &IngestOptions { unit_bytes: 4 << 20, in_flight: 4 }, &mut |_| {}).await.unwrap();
            let faulty: u64 = String::from_utf8(fetch_bytes(&format!("{}/faults/count?{tag}", test_server())).await).unwrap().parse().unwrap();
            log(&format!("{mode}: {faulty} stalled answers left after 300 ms each; ingest {:.0} ms", js_sys::Date::now() - began));
            let units: u64 = files.iter().map(|f| (f.len() as u64).div_ceil(4 << 20)).sum();
            // the probes, the header reads and every unit stalled once
            assert!(faulty >= units + 2, "{mode}: {faulty} stalled answers for {units} units");
            assert_eq!(m.state, StoreState::Complete);
            assert!(read_file(&dir, "data.bin").await == expected_data(&files), "{mode}: the store differs from the GGUF bytes laid out");
            assert!(read_checks(&dir).await.unwrap() == Some(checks_of(&files)));
            drop(dir);
            assert!(OpfsDir::delete(&name).await.unwrap());
        }
        let name = fresh_store("stalls").await;
        let options = js_sys::Object::new();
        js_sys::Reflect::set(&options, &"model".into(), &format!("{}/faults/stall/fixtures/tiny-ling/{}?{name}", test_server(), NAMES[0]).into()).unwrap();
        js_sys::Reflect::set(&options, &"store".into(), &name.clone().into()).unwrap();
        js_sys::Reflect::set(&options, &"stallTimeoutMs".into(), &200.into()).unwrap();
        let began = js_sys::Date::now();
        let err = message(ingest_js(options.into()).await.unwrap_err().into());
        let took = js_sys::Date::now() - began;
        log(&format!("always stalling: {err} ({took:.0} ms)"));
        assert!(err.contains("no bytes from the server for 200 ms (it stalled)") && err.contains("(after 5 tries)"), "{err}");
        // five tries of 0.2 s and four pauses (0.2 + 0.4 + 0.8 + 1.6 s): far from hanging
        assert!(took < 20_000.0, "gave up after {took} ms");
        assert!(OpfsDir::delete(&name).await.is_ok());
    }

    /// Another tab, for the lock tests: a worker of this origin (it shares `navigator.locks` and OPFS with this
    /// one, as two tabs do) that takes a store's Web Lock as an ingest does and lets go when told, or asks for
    /// it exclusively without waiting as another tab's ingest would. `call(op)` resolves with its answer.
    fn other_tab() -> js_sys::Function {
        js_sys::Function::new_no_args(
            r#"
            const src = `
              let release = null;
              onmessage = async ({ data }) => {
                if (data.op === "hold") {
                  navigator.locks.request(data.name, { mode: "exclusive" }, () => new Promise((r) => { release = r; postMessage("held"); }));
                } else if (data.op === "release") {
                  release(); release = null; postMessage("released");
                } else if (data.op === "try") {
                  // as another tab's ingest asks: a few tries over a second (a lock just let go is released shortly after)
                  for (let i = 0; i < 20; i++) {
                    const got = await navigator.locks.request(data.name, { mode: "exclusive", ifAvailable: true }, (lock) => lock !== null);
                    if (got) return postMessage("got");
                    await new Promise((r) => setTimeout(r, 50));
                  }
                  postMessage("busy");
                }
              };`;
            const worker = new Worker(URL.createObjectURL(new Blob([src], { type: "text/javascript" })));
            return (op, name) => new Promise((resolve) => { worker.onmessage = ({ data }) => resolve(data); worker.postMessage({ op, name }); });
            "#,
        )
        .call0(&JsValue::NULL)
        .unwrap()
        .unchecked_into()
    }

    /// Waits `ms` milliseconds (setTimeout).
    async fn sleep_ms(ms: u32) {
        let p = js_sys::Promise::new(&mut |resolve, _| {
            let set_timeout: js_sys::Function = js_sys::Reflect::get(&js_sys::global(), &"setTimeout".into()).unwrap().unchecked_into();
            set_timeout.call2(&JsValue::NULL, &resolve, &ms.into()).unwrap();
        });
        JsFuture::from(p).await.unwrap();
    }

    /// `iterator.next()` of a JS async iterator.
    fn next_of(iterator: &JsValue) -> js_sys::Promise {
        let next: js_sys::Function = get(iterator, "next").unchecked_into();
        next.call0(iterator).unwrap().unchecked_into()
    }

    async fn ask(tab: &js_sys::Function, op: &str, store: &str) -> String {
        let p: js_sys::Promise = tab.call2(&JsValue::NULL, &op.into(), &lingtab::web::lock::lock_name(store).into()).unwrap().unchecked_into();
        JsFuture::from(p).await.unwrap().as_string().unwrap()
    }

    /// Two tabs and one store (Web Locks): while another tab ingests into it, an ingest here is refused ("being
    /// downloaded … in another tab"), or waits for it with `wait: true`; so are `Engine.load` and `deleteStore`.
    /// An engine loaded from the store holds it shared until disposed: another tab's ingest is refused, and so
    /// are an ingest and a delete here, and the engine keeps working; after `dispose` the store can be deleted.
    #[wasm_bindgen_test]
    async fn one_tab_at_a_time_ingests_a_store_and_none_while_an_engine_reads_it() {
        use lingtab::web::store::{delete_store, ingest_js};
        let name = fresh_store("locks").await;
        let set = |o: &js_sys::Object, k: &str, v: &JsValue| {
            js_sys::Reflect::set(o, &k.into(), v).unwrap();
        };
        let ingest_options = |wait: bool| {
            let o = js_sys::Object::new();
            set(&o, "model", &urls()[0].clone().into());
            set(&o, "store", &name.clone().into());
            set(&o, "unitBytes", &(8 << 20).into());
            if wait {
                set(&o, "wait", &true.into());
            }
            o
        };
        let load = || {
            let o = js_sys::Object::new();
            set(&o, "store", &name.clone().into());
            lingtab::web::Engine::load(o.into())
        };
        let summary = ingest_js(ingest_options(false).into()).await.unwrap();
        assert_eq!(get(&summary, "state").as_string().as_deref(), Some("complete"));

        let tab = other_tab();
        assert_eq!(ask(&tab, "hold", &name).await, "held");
        let busy = "is being downloaded or deleted in this or another tab or worker";
        let err = message(ingest_js(ingest_options(false).into()).await.unwrap_err().into());
        log(&format!("ingest while another tab ingests: {err}"));
        assert!(err.contains(busy) && err.contains("wait: true"), "{err}");
        let err = message(load().await.err().unwrap().into());
        assert!(err.contains(busy), "Engine.load while another tab ingests: {err}");
        let err = message(delete_store(name.clone()).await.unwrap_err().into());
        assert!(err.contains(busy), "deleteStore while another tab ingests: {err}");
        // with wait: true the ingest waits its turn, then runs (here: checks the complete store)
        let began = js_sys::Date::now();
        let waiting = ingest_js(ingest_options(true).into());
        let release_later = async {
            sleep_ms(400).await;
            ask(&tab, "release", &name).await
        };
        let (waited, released) = futures_util::future::join(waiting, release_later).await;
        assert_eq!(released, "released");
        assert_eq!(get(&waited.unwrap(), "state").as_string().as_deref(), Some("complete"));
        assert!(js_sys::Date::now() - began >= 400.0, "the waiting ingest ran before the other tab let go");

        // an engine holds the store shared while it lives
        let engine = load().await.unwrap();
        assert_eq!(ask(&tab, "try", &name).await, "busy", "another tab's ingest while an engine reads the store");
        let in_use = "is in use by an engine loaded from it";
        let err = message(ingest_js(ingest_options(false).into()).await.unwrap_err().into());
        log(&format!("ingest under an engine: {err}"));
        assert!(err.contains(in_use), "{err}");
        let err = message(delete_store(name.clone()).await.unwrap_err().into());
        assert!(err.contains(in_use), "deleteStore under an engine: {err}");
        let messages = js_sys::JSON::parse(r#"[{"role":"user","content":"Hi"}]"#).unwrap();
        let gen_options: js_sys::Object = js_sys::JSON::parse(r#"{"maxTokens":2,"temperature":0}"#).unwrap().unchecked_into();
        let stream = engine.generate(messages, Some(gen_options)).unwrap();
        let first = JsFuture::from(next_of(&stream)).await.unwrap();
        assert_eq!(get(&first, "done").as_bool(), Some(false), "the engine still generates");
        engine.dispose();
        // the generation does not go on after dispose (the store is let go of)
        let after = message(JsFuture::from(next_of(&stream)).await.unwrap_err());
        assert!(after.contains("disposed"), "{after}");
        assert_eq!(ask(&tab, "try", &name).await, "got", "another tab's ingest once the engine is disposed");
        assert!(delete_store(name.clone()).await.unwrap());
    }

    /// The JS API at its limits, on an engine loaded from a store: absurd load and generate options (NaN, negative,
    /// out of range) are errors naming the option; a message longer than the context is refused before any
    /// step; a second `generate` while one runs is refused and the first completes with the right tokens; a
    /// reply that fills the context ends with `context_full`; after each, the engine goes on. Then the GPU
    /// device is lost (destroyed, as a driver reset does): generation says so, and `Engine.load` again from the
    /// store (no download) gives a working engine with the same tokens.
    #[wasm_bindgen_test]
    async fn js_api_limits_and_a_lost_device_then_a_new_load() {
        use lingtab::web::store::ingest_js;
        let name = fresh_store("limits").await;
        let obj = |pairs: &[(&str, JsValue)]| {
            let o = js_sys::Object::new();
            for (k, v) in pairs {
                js_sys::Reflect::set(&o, &(*k).into(), v).unwrap();
            }
            o
        };
        ingest_js(obj(&[("model", urls()[0].clone().into()), ("store", name.clone().into()), ("unitBytes", (8 << 20).into())]).into()).await.unwrap();
        let n_ctx = 48;
        let t0 = js_sys::Date::now();
        let at = |what: &str| log(&format!("{what}: {:.1} s", (js_sys::Date::now() - t0) / 1000.0));
        let load = |extra: &[(&str, JsValue)]| {
            let o = obj(&[("store", name.clone().into()), ("contextLength", n_ctx.into())]);
            for (k, v) in extra {
                js_sys::Reflect::set(&o, &(*k).into(), v).unwrap();
            }
            lingtab::web::Engine::load(o.into())
        };
        for (option, value) in [("poolBytes", (-1.0).into()), ("poolBytes", f64::NAN.into()), ("gpuBudgetBytes", 0.into()), ("contextLength", 0.into()), ("contextLength", 1.5.into()), ("maxBindingBytes", "big".into())] {
            let err = message(load(&[(option, value)]).await.err().expect("an absurd load option").into());
            assert!(err.contains(&format!("options.{option} must be a positive integer")), "{option}: {err}");
        }
        let engine = load(&[]).await.unwrap();
        at("loaded");
        let user = |text: &str| js_sys::JSON::parse(&serde_json::json!([{ "role": "user", "content": text }]).to_string()).unwrap();
        let greedy = |max: u32| obj(&[("maxTokens", max.into()), ("temperature", 0.into()), ("thinking", false.into())]);
        // every event of a generation: (tokens, finish reason)
        async fn drain(stream: &JsValue) -> Result<(Vec<u32>, String), String> {
            drain_text(stream).await.map(|(tokens, finish, _)| (tokens, finish))
        }
        async fn drain_text(stream: &JsValue) -> Result<(Vec<u32>, String, String), String> {
            let mut tokens = Vec::new();
            let mut text = String::new();
            loop {
                let r = JsFuture::from(next_of(stream)).await.map_err(message)?;
                if get(&r, "done").as_bool() == Some(true) {
                    return Err("the stream ended without a finish reason".into());
                }
                let ev = get(&r, "value");
                if let Some(t) = get(&ev, "token").as_f64() {
                    tokens.push(t as u32);
                }
                text += &get(&ev, "text").as_string().unwrap_or_default();
                if let Some(f) = get(&ev, "finishReason").as_string() {
                    return Ok((tokens, f, text));
                }
            }
        }
        for (option, value) in [
            ("temperature", JsValue::from(f64::NAN)),
            ("temperature", (-1.0).into()),
            ("temperature", f64::INFINITY.into()),
            ("topP", 0.into()),
            ("topP", 1.5.into()),
            ("topK", (-1).into()),
            ("minP", 2.into()),
            ("repetitionPenalty", 0.into()),
            ("maxTokens", 0.into()),
            ("maxTokens", (-3).into()),
        ] {
            let o = greedy(2);
            js_sys::Reflect::set(&o, &option.into(), &value).unwrap();
            let err = message(engine.generate(user("Hi"), Some(o)).err().expect("an absurd generate option").into());
            let named = match option {
                "topP" => "top_p",
                "minP" => "min_p",
                "repetitionPenalty" => "repetition_penalty",
                o => o,
            };
            assert!(err.contains(named), "{option}: {err}");
        }
        let err = message(engine.generate(user(&"word ".repeat(300)), Some(greedy(2))).err().expect("a message beyond the context").into());
        assert!(err.contains(&format!("the context holds {n_ctx}")), "{err}");

        // two generations at once: the second is refused, the first completes (its tokens are checked against
        // the engine loaded anew below)
        let first = engine.generate(user("Hi"), Some(greedy(2))).unwrap();
        let head = JsFuture::from(next_of(&first)).await.unwrap();
        let err = message(engine.generate(user("Hi"), Some(greedy(2))).err().expect("a second generation at once").into());
        assert!(err.contains("a generation is already running"), "{err}");
        assert!(message(engine.prompt_tokens(user("Hi"), Some(false)).err().unwrap().into()).contains("already running"));
        let (mut beside, finish, mut reply) = drain_text(&first).await.unwrap();
        let head = get(&head, "value");
        reply.insert_str(0, &get(&head, "text").as_string().unwrap_or_default());
        if let Some(t) = get(&head, "token").as_f64() {
            beside.insert(0, t as u32);
        }
        log(&format!("greedy reply beside a refused one: {beside:?} ({finish})"));
        at("two at once");

        // a reply that fills the context, as the next turn of that chat (only the new turn's tokens run): its
        // message sized to leave a few positions
        let turn = |text: &str| {
            js_sys::JSON::parse(&serde_json::json!([{ "role": "user", "content": "Hi" }, { "role": "assistant", "content": reply }, { "role": "user", "content": text }]).to_string()).unwrap()
        };
        let mut words = 1;
        let (text, n) = loop {
            let text = "Hi ".repeat(words);
            let n = engine.prompt_tokens(turn(&text), Some(false)).unwrap().len();
            if n >= n_ctx - 4 {
                break (text, n);
            }
            words += 1;
        };
        assert!(n < n_ctx, "the prompt fills the context already");
        let (tokens, finish) = drain(&engine.generate(turn(&text), Some(greedy(1000))).unwrap()).await.unwrap();
        log(&format!("{n} prompt tokens in a context of {n_ctx}: {} tokens, then {finish}", tokens.len()));
        assert!(finish == "context_full" || finish == "stop", "{finish}");
        if finish == "context_full" {
            // every position left runs a token, and one more is generated but not run
            assert_eq!(tokens.len(), n_ctx - n + 1);
            assert_eq!(get(&engine.stats().unwrap(), "position").as_f64(), Some(n_ctx as f64));
        }
        at("context filled");
        // the engine is free again: a new generation is accepted (its steps after a full context are the
        // native tests' business), and stopped before it runs one
        let next = engine.generate(user("Hi"), Some(greedy(2))).expect("a generation after a full context");
        let stop: js_sys::Function = get(&next, "return").unchecked_into();
        JsFuture::from(js_sys::Promise::from(stop.call0(&next).unwrap())).await.unwrap();
        engine.reset().unwrap();

        // the device lost: generation says so, every time; a new load from the store works
        engine.destroy_device_for_tests();
        for _ in 0..2 {
            let err = match engine.generate(user("Hi"), Some(greedy(2))) {
                Err(e) => message(e.into()),
                Ok(stream) => drain(&stream).await.expect_err("a generation on a lost device"),
            };
            log(&format!("after the device was lost: {err}"));
            assert!(err.contains("GPU device was lost") && err.contains("load the engine again"), "{err}");
        }
        engine.dispose();
        at("device lost");
        let engine = load(&[]).await.unwrap();
        at("loaded again");
        let (fresh, _) = drain(&engine.generate(user("Hi"), Some(greedy(2))).unwrap()).await.unwrap();
        assert_eq!(fresh, beside, "the engine loaded again after the loss, and the generation that ran beside a refused one");
        at("done");
        engine.dispose();
        assert!(OpfsDir::delete(&name).await.unwrap());
    }

    /// Faults injected into a complete OPFS store while nothing uses it — data.bin cut short, a range of it
    /// zeroed, a file deleted, the manifest garbled or of another format version: `Engine.load({ store })`
    /// refuses naming what is wrong, and `ingest` into the store again mends it (the damaged runs fetched again,
    /// or everything when it cannot be checked) to the same bytes — or, for another version, refuses.
    #[wasm_bindgen_test]
    async fn a_damaged_opfs_store_is_named_by_the_load_and_mended_by_ingest() {
        use lingtab::web::store::ingest_js;
        let name = fresh_store("damage").await;
        let files = fixture_files().await;
        let intact = expected_data(&files);
        let layout = StoreLayout::from_model(&SplitModel::new(files.iter().map(|b| (parse_header(b, Some(b.len() as u64)).unwrap(), b.len() as u64)).collect()).unwrap()).unwrap();
        let runs: Vec<_> = layout.pieces.iter().filter(|p| p.store_offset < layout.data_len).copied().collect();
        let ingest_again = || {
            let o = js_sys::Object::new();
            js_sys::Reflect::set(&o, &"model".into(), &urls()[0].clone().into()).unwrap();
            js_sys::Reflect::set(&o, &"store".into(), &name.clone().into()).unwrap();
            js_sys::Reflect::set(&o, &"unitBytes".into(), &(8 << 20).into()).unwrap();
            ingest_js(o.into())
        };
        let load = || {
            let o = js_sys::Object::new();
            js_sys::Reflect::set(&o, &"store".into(), &name.clone().into()).unwrap();
            lingtab::web::Engine::load(o.into())
        };
        ingest_again().await.unwrap();
        // fixed per build (LINGTAB_TEST_SEED sweeps), so a failure repeats
        let mut seed = super::common::Rand::test_seed() | 1;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let kinds = ["data.bin cut short", "data.bin cut short", "a range of data.bin zeroed", "a range of data.bin zeroed", "a range of data.bin zeroed", "data.bin deleted", "checks.json deleted", "manifest.json garbled", "manifest.json of format version 2"];
        for kind in kinds {
            let dir = OpfsDir::open(&name, false).await.unwrap().unwrap();
            let want = match kind {
                "data.bin cut short" => {
                    let cut = 1 + next() % (layout.data_len - 1);
                    let data = dir.open("data.bin", false).await.unwrap().unwrap();
                    data.set_len(cut).await.unwrap();
                    data.flush().await.unwrap();
                    format!("data.bin is {cut} bytes, the manifest says {}", layout.data_len)
                }
                "a range of data.bin zeroed" => {
                    let p = loop {
                        let p = runs[(next() % runs.len() as u64) as usize];
                        if intact[p.store_offset as usize..(p.store_offset + p.len) as usize].iter().any(|&b| b != 0) {
                            break p;
                        }
                    };
                    let data = dir.open("data.bin", false).await.unwrap().unwrap();
                    data.write_at(p.store_offset, &vec![0u8; p.len.min(2048) as usize]).await.unwrap();
                    data.flush().await.unwrap();
                    "do not match their check value".to_string()
                }
                "data.bin deleted" => {
                    dir.remove("data.bin").await.unwrap();
                    "data.bin is missing".to_string()
                }
                "checks.json deleted" => {
                    dir.remove("checks.json").await.unwrap();
                    "checks.json is missing".to_string()
                }
                "manifest.json garbled" => {
                    dir.write_atomic("manifest.json", b"{\"format_version\": 1, \"sta").await.unwrap();
                    "manifest.json is unreadable".to_string()
                }
                _ => {
                    let mut m: serde_json::Value = serde_json::from_slice(&dir.read_all("manifest.json").await.unwrap().unwrap()).unwrap();
                    m["format_version"] = 2.into();
                    dir.write_atomic("manifest.json", &serde_json::to_vec(&m).unwrap()).await.unwrap();
                    "the store is of format version 2, this build of lingtab reads version 1".to_string()
                }
            };
            drop(dir);
            let err = message(load().await.err().unwrap_or_else(|| panic!("{kind}: an engine loaded from a damaged store")).into());
            log(&format!("{kind}: {err}"));
            // a zeroed range is named: a layer's expert, a tensor (blk.4.exp_probs_b.bias, output.weight) or a header
            let named = if kind.contains("zeroed") { err.contains(&want) && ["layer", "blk.", "weight", "header"].iter().any(|n| err.contains(n)) } else { err.contains(&want) };
            assert!(named, "{kind}: {err}");
            let repaired = ingest_again().await;
            let dir = OpfsDir::open(&name, false).await.unwrap().unwrap();
            if kind.contains("format version") {
                let err = message(repaired.err().expect("an ingest into a store of another format").into());
                assert!(err.contains(&want), "{kind}: {err}");
                // put back a manifest of this version, then the store is as it was
                let mut m: serde_json::Value = serde_json::from_slice(&dir.read_all("manifest.json").await.unwrap().unwrap()).unwrap();
                m["format_version"] = 1.into();
                dir.write_atomic("manifest.json", &serde_json::to_vec(&m).unwrap()).await.unwrap();
            } else {
                assert_eq!(get(&repaired.unwrap(), "state").as_string().as_deref(), Some("complete"), "{kind}");
            }
            assert!(read_file(&dir, "data.bin").await == intact, "{kind}: the store's bytes after the ingest differ from the GGUF bytes laid out");
            assert!(read_checks(&dir).await.unwrap() == Some(checks_of(&files)), "{kind}");
        }
        let engine = load().await.expect("the mended store loads");
        engine.dispose();
        assert!(OpfsDir::delete(&name).await.unwrap());
    }

    /// A fresh store with the fixture ingested over HTTP, and the fixture's bytes.
    async fn ingested(tag: &str) -> (String, Vec<Vec<u8>>) {
        let name = fresh_store(tag).await;
        let files = fixture_files().await;
        let dir = OpfsDir::open(&name, true).await.unwrap().unwrap();
        let (parts, hints) = http_parts().await;
        ingest(&dir, &parts, &hints, &IngestOptions { unit_bytes: 4 << 20, in_flight: 4 }, &mut |_| {}).await.unwrap();
        (name, files)
    }

    /// The store's parts read through `pool`, and its check values (the manifest and headers read without a
    /// handle, as `Engine.load({ store })` does).
    async fn parts_through(name: &str, pool: &OpfsReaders) -> (SplitModel, Vec<StorePartView<OpfsReaders>>, Option<lingtab::store::StoreChecks>) {
        let dir = OpfsDir::open(name, false).await.unwrap().unwrap().with_access(Access::Async);
        let (model, views) = open_complete(&dir).await.unwrap();
        let checks = read_checks(&dir).await.unwrap();
        (model, views.into_iter().map(|v| v.map_file(|_| pool.clone())).collect(), checks)
    }

    /// A part that, once armed, starts its next read, ends every reader of `pool` while that read is in
    /// flight (what a crashed reader worker looks like to the engine), then waits for the read.
    struct EndsReadersMidRead<S> {
        inner: S,
        pool: OpfsReaders,
        armed: Rc<Cell<bool>>,
    }

    impl<S: RangeSource> RangeSource for EndsReadersMidRead<S> {
        fn describe(&self) -> String {
            self.inner.describe()
        }
        async fn read_range(&self, start: u64, len: u64) -> Result<(Vec<u8>, u64), String> {
            let mut read = Box::pin(self.inner.read_range(start, len));
            if self.armed.replace(false) {
                // the first poll sends the read's chunks to the readers
                let first = futures_util::future::poll_fn(|cx| std::task::Poll::Ready(std::future::Future::poll(read.as_mut(), cx))).await;
                assert!(first.is_pending(), "the read finished without waiting for a reader");
                for i in 0..self.pool.len() {
                    self.pool.end_reader(i);
                }
            }
            read.await
        }
    }

    const TOKENS: [u32; 5] = [2949, 3536, 786, 0, 571];

    /// Experts streamed from an OPFS store through 1 and 4 reader workers (each its own read-only handle) into a
    /// pool of k+3 slots give the resident engine's logits bit for bit; a reader ended mid-read fails the step
    /// with a clear error, and the same engine then goes on (the reader started again) to the same logits.
    #[wasm_bindgen_test]
    async fn experts_read_by_opfs_reader_workers_give_the_resident_logits() {
        use lingtab::engine::{Engine, EngineOptions, Policy, Upload};
        let (name, _files) = ingested("readers").await;
        let dir = OpfsDir::open(&name, false).await.unwrap().unwrap();
        let (model, views) = open_complete(&dir).await.unwrap();
        let mut resident = Engine::load(Gpu::new().await.expect("WebGPU adapter"), &model, &views, &EngineOptions::default()).await.unwrap();
        drop((views, dir));
        let mut want = Vec::new();
        for t in TOKENS {
            want.push(resident.step(t).await.unwrap());
        }
        let (slot, k) = (resident.stats().slot_bytes, resident.config.n_expert_used as u32);
        let options = EngineOptions { pool_slots: Some(k + 3), policy: Some(Policy::Lru), ..Default::default() };
        for n in [1, 4] {
            let pool = OpfsReaders::open(&name, "data.bin", n).await.unwrap();
            assert_eq!(pool.len(), n);
            let (model, parts, checks) = parts_through(&name, &pool).await;
            assert!(checks.is_some());
            let mut engine = Engine::open_checked(Gpu::new().await.expect("WebGPU adapter"), &model, parts, checks, &options).await.unwrap();
            assert!(engine.is_streaming());
            for (t, want) in TOKENS.iter().zip(&want) {
                assert!(engine.step(*t).await.unwrap() == *want, "{n} readers, token {t}: logits differ from the resident engine's");
            }
            let s = engine.stats();
            let counts = pool.counts();
            log(&format!("{n} OPFS readers: {} misses, {:.1} MB of records; reads per reader {:?}", s.misses, s.bytes_read as f64 / 1e6, counts.iter().map(|c| c.reads).collect::<Vec<_>>()));
            assert!(s.misses > 0 && s.bytes_read > 0 && s.bytes_read <= s.misses * slot);
            // every byte the engine took (dense weights and records) came through the readers
            assert!(counts.iter().map(|c| c.bytes).sum::<u64>() >= s.bytes_read);
            assert!(counts.iter().filter(|c| c.reads > 0).count() == n, "every reader served reads: {counts:?}");
        }

        // a reader that stops mid-read
        let pool = OpfsReaders::open(&name, "data.bin", 4).await.unwrap();
        let (model, parts, checks) = parts_through(&name, &pool).await;
        let armed = Rc::new(Cell::new(false));
        let parts: Vec<_> = parts.into_iter().map(|inner| EndsReadersMidRead { inner, pool: pool.clone(), armed: armed.clone() }).collect();
        let mut engine = Engine::open_checked(Gpu::new().await.expect("WebGPU adapter"), &model, parts, checks, &options).await.unwrap();
        assert!(engine.step(TOKENS[0]).await.unwrap() == want[0]);
        // an empty cache: the next step misses
        engine.set_pool(k + 3, Policy::Lru, Upload::WriteBuffer).unwrap();
        armed.set(true);
        let err = engine.step(TOKENS[0]).await.expect_err("a step whose reader stopped mid-read");
        log(&format!("a reader ended mid-read: {err}"));
        assert!(err.contains("reading experts of layer") && err.contains("stopped before answering") && err.contains("data.bin"), "{err}");
        assert_eq!(engine.position(), 0, "a failed step forgets the half-updated sequence");
        for (t, want) in TOKENS.iter().zip(&want) {
            assert!(engine.step(*t).await.unwrap() == *want, "after the failure, token {t}: logits differ from the resident engine's");
        }
        assert_eq!(pool.restarts(), 4, "the ended readers were started again");
        drop((engine, pool));
        // the readers let go of the file when the engine does: a writer can open it again
        let dir = OpfsDir::open(&name, false).await.unwrap().unwrap();
        dir.open("data.bin", false).await.expect("the readers' handles are closed").unwrap();
        drop(dir);
        assert!(OpfsDir::delete(&name).await.unwrap());
    }

    /// The check values through the readers: a byte changed in an expert the router picks fails the step that
    /// reads it, naming the layer and expert.
    #[wasm_bindgen_test]
    async fn a_changed_expert_read_by_opfs_readers_fails_its_step() {
        use lingtab::engine::{Engine, EngineOptions};
        let (name, files) = ingested("readers-checks").await;
        let dir = OpfsDir::open(&name, false).await.unwrap().unwrap();
        let (model, views) = open_complete(&dir).await.unwrap();
        let mut resident = Engine::load(Gpu::new().await.expect("WebGPU adapter"), &model, &views, &EngineOptions::default()).await.unwrap();
        drop(views);
        resident.step(TOKENS[0]).await.unwrap();
        let (layer, selection) = resident.last_routing().await.unwrap().into_iter().next().expect("a MoE layer");
        let expert = selection.ids[0];
        drop(resident);
        let layout = StoreLayout::from_model(&SplitModel::new(files.iter().map(|b| (parse_header(b, Some(b.len() as u64)).unwrap(), b.len() as u64)).collect()).unwrap()).unwrap();
        let records = layout.experts.iter().find(|r| r.layer == layer).unwrap();
        let data = dir.open("data.bin", false).await.unwrap().unwrap();
        let at = records.offset + expert as u64 * records.stride + records.down + 3;
        let mut b = [0u8; 1];
        data.read_at(at, &mut b).await.unwrap();
        data.write_at(at, &[b[0] ^ 0x10]).await.unwrap();
        data.flush().await.unwrap();
        drop((data, dir));
        let pool = OpfsReaders::open(&name, "data.bin", 4).await.unwrap();
        let (model, parts, checks) = parts_through(&name, &pool).await;
        let options = EngineOptions { pool_slots: Some(8), ..Default::default() };
        let mut engine = Engine::open_checked(Gpu::new().await.expect("WebGPU adapter"), &model, parts, checks, &options).await.unwrap();
        let err = engine.step(TOKENS[0]).await.expect_err("the changed expert is read at the first step");
        log(&format!("a changed expert through the readers: {err}"));
        assert!(err.contains(&format!("reading experts of layer {layer}")) && err.contains(&format!("layer {layer} expert {expert}: its down rows")) && err.contains("changed on disk"), "{err}");
        drop((engine, pool));
        assert!(OpfsDir::delete(&name).await.unwrap());
    }

    /// The browser bench (`Engine.bench`, the same measurement and table as `lingtab bench`) on the fixture from a
    /// store, resident and with a small streaming pool. Beyond printing the table, what the counters must show:
    /// chunks need fewer dispatches per prompt token than token by token; a resident engine syncs once per
    /// decoded token and reads nothing from the store; a streaming chunked prefill reads fewer store bytes per
    /// prompt token than token by token (each expert once per span), and the bench leaves the engine usable and
    /// refuses options it cannot run with a clear error.
    #[wasm_bindgen_test]
    async fn the_browser_bench_prints_the_table() {
        let (name, _) = ingested("bench").await;
        let load = |pool_bytes: Option<f64>| {
            let o = js_sys::Object::new();
            js_sys::Reflect::set(&o, &"store".into(), &name.clone().into()).unwrap();
            js_sys::Reflect::set(&o, &"contextLength".into(), &64.into()).unwrap();
            if let Some(bytes) = pool_bytes {
                js_sys::Reflect::set(&o, &"poolBytes".into(), &bytes.into()).unwrap();
            }
            lingtab::web::Engine::load(o.into())
        };
        let options = js_sys::Object::new();
        // small: every token costs SwiftShader about 0.15–0.2 s, and each engine also runs the bench's warm-up
        js_sys::Reflect::set(&options, &"prompts".into(), &js_sys::Array::of1(&8.into())).unwrap();
        js_sys::Reflect::set(&options, &"decode".into(), &2.into()).unwrap();
        js_sys::Reflect::set(&options, &"chunks".into(), &js_sys::Array::of2(&1.into(), &8.into())).unwrap();
        let row = |rows: &js_sys::Array, phase: &str, chunk: f64, key: &str| -> f64 {
            let r = rows.iter().find(|r| get(r, "phase").as_string().as_deref() == Some(phase) && get(r, "chunk").as_f64() == Some(chunk)).unwrap_or_else(|| panic!("no {phase} row with chunk {chunk}"));
            get(&r, key).as_f64().unwrap_or_else(|| panic!("{phase} {chunk}: {key}"))
        };
        let mut tables = String::new();
        for pool in [None, Some(8.0 * 300_000.0)] {
            let engine = load(pool).await.unwrap();
            let result = JsFuture::from(engine.bench(options.clone().into()).unwrap()).await.unwrap();
            let rows = js_sys::Array::from(&get(&result, "rows"));
            let table = get(&result, "table").as_string().unwrap();
            assert_eq!(rows.length(), 3, "two prefills and a decode: {table}");
            assert_eq!(table.lines().count(), 4, "a header and a line per row: {table}");
            assert!(table.lines().next().unwrap().contains("tok/s"));
            assert!(row(&rows, "prefill", 8.0, "dispatchesPerToken") < row(&rows, "prefill", 1.0, "dispatchesPerToken") / 2.0, "{table}");
            assert!(row(&rows, "prefill", 8.0, "speedup") > 0.0);
            assert_eq!(row(&rows, "prefill", 8.0, "tokens"), 8.0);
            assert_eq!(row(&rows, "decode", 1.0, "tokens"), 2.0);
            match pool {
                None => {
                    assert_eq!(row(&rows, "decode", 1.0, "syncsPerToken"), 1.0, "resident decode: one readback per token\n{table}");
                    assert_eq!(row(&rows, "prefill", 1.0, "mbReadPerToken"), 0.0);
                    // the decode again with each step read back before the next is submitted, to compare
                    let plain = js_sys::Object::new();
                    for (k, v) in [("prompts", js_sys::Array::of1(&8.into()).into()), ("decode", JsValue::from(2)), ("chunks", js_sys::Array::of1(&8.into()).into()), ("runAhead", false.into())] {
                        js_sys::Reflect::set(&plain, &k.into(), &v).unwrap();
                    }
                    let result = JsFuture::from(engine.bench(plain.into()).unwrap()).await.unwrap();
                    let plain_rows = js_sys::Array::from(&get(&result, "rows"));
                    assert_eq!(row(&plain_rows, "decode", 1.0, "syncsPerToken"), 1.0);
                    log(&format!("browser decode: {:.1} ms a token run ahead, {:.1} without", row(&rows, "decode", 1.0, "msPerToken"), row(&plain_rows, "decode", 1.0, "msPerToken")));
                }
                Some(_) => {
                    assert!(row(&rows, "prefill", 8.0, "mbReadPerToken") < row(&rows, "prefill", 1.0, "mbReadPerToken"), "{table}");
                    assert!(row(&rows, "decode", 1.0, "mbReadPerToken") > 0.0, "{table}");
                }
            }
            assert!(get(&result, "bandwidthGBs").as_f64().unwrap() > 0.0);
            tables += &table;
            // the engine goes on after the bench, and refuses a bench it cannot run with a clear error
            let bad = js_sys::Object::new();
            js_sys::Reflect::set(&bad, &"prompts".into(), &js_sys::Array::of1(&1000.into())).unwrap();
            let err = message(JsFuture::from(engine.bench(bad.into()).unwrap()).await.unwrap_err());
            assert!(err.contains("do not fit the context"), "{err}");
            let bad = js_sys::Object::new();
            js_sys::Reflect::set(&bad, &"f16".into(), &"yes".into()).unwrap();
            let err = message(engine.bench(bad.into()).err().expect("f16: \"yes\" is refused").into());
            assert!(err.contains("f16 must be true or false"), "{err}");
            let bad = js_sys::Object::new();
            js_sys::Reflect::set(&bad, &"runAhead".into(), &1.into()).unwrap();
            let err = message(engine.bench(bad.into()).err().expect("runAhead: 1 is refused").into());
            assert!(err.contains("runAhead must be true or false"), "{err}");
            assert!(engine.stats().is_ok());
            engine.dispose();
        }
        log(&format!("browser bench (tiny fixture, SwiftShader):\n{tables}"));
        assert!(OpfsDir::delete(&name).await.unwrap());
    }

    /// Readers and writers of a store keep out of each other: readers cannot open a file a writer holds (a
    /// clear error, from the pool and from `Engine.load`), and while readers hold it no writer gets it and the
    /// store is not deleted. `Engine.load({ store, readers })` loads through them.
    #[wasm_bindgen_test]
    async fn opfs_readers_and_a_writer_keep_out_of_each_other() {
        use lingtab::web::store::delete_store;
        let (name, files) = ingested("readers-lock").await;
        let load = |readers: u32| {
            let o = js_sys::Object::new();
            js_sys::Reflect::set(&o, &"store".into(), &name.clone().into()).unwrap();
            js_sys::Reflect::set(&o, &"poolBytes".into(), &(8.0 * 300_000.0).into()).unwrap();
            js_sys::Reflect::set(&o, &"readers".into(), &readers.into()).unwrap();
            JsValue::from(o)
        };
        // a writer (what an ingest into the store holds)
        let writer = OpfsDir::open(&name, false).await.unwrap().unwrap();
        let held = writer.open("data.bin", false).await.unwrap().unwrap();
        let err = OpfsReaders::open(&name, "data.bin", 2).await.err().expect("readers of a file a writer holds");
        log(&format!("readers while a writer holds the file: {err:?}"));
        assert!(matches!(&err, ReadersError::Failed(m) if m.contains("being written elsewhere") && m.contains(&name)), "{err:?}");
        let err = message(lingtab::web::Engine::load(load(2)).await.err().expect("Engine.load while a writer holds the store").into());
        assert!(err.contains("Engine.load") && err.contains("being written elsewhere"), "{err}");
        drop((held, writer));

        let pool = OpfsReaders::open(&name, "data.bin", 3).await.unwrap();
        let total: u64 = expected_data(&files).len() as u64;
        assert_eq!(pool.file_size(), total);
        // a read across chunks and readers lands in order
        let mut got = vec![0u8; 3 << 20];
        pool.read_into(1000, &mut got).await.unwrap();
        assert!(got[..] == expected_data(&files)[1000..1000 + (3 << 20)], "bytes read by several readers differ from the store's");
        assert!(pool.counts().iter().all(|c| c.reads == 1), "{:?}", pool.counts());
        let err = pool.read_into(total - 10, &mut [0u8; 100]).await.unwrap_err();
        assert!(err.contains(&format!("the file is {total} bytes")), "{err}");
        let writer = OpfsDir::open(&name, false).await.unwrap().unwrap();
        let err = writer.open("data.bin", false).await.err().expect("a writer while readers hold the file");
        assert!(err.contains("open elsewhere"), "{err}");
        let busy = message(delete_store(name.clone()).await.unwrap_err().into());
        assert!(busy.contains("in use"), "{busy}");
        drop((writer, pool));

        // an engine reading in its own thread (readers: 0) opens the file read-only too: another engine's readers
        // share it (two tabs on one store)
        let own = lingtab::web::Engine::load(load(0)).await.unwrap();
        let engine = lingtab::web::Engine::load(load(4)).await.unwrap();
        let stats = engine.stats().unwrap();
        assert!(get(&get(&stats, "experts"), "poolSlots").as_f64().unwrap() >= 4.0);
        let busy = message(delete_store(name.clone()).await.unwrap_err().into());
        assert!(busy.contains("in use"), "an engine's readers hold the store: {busy}");
        own.dispose();
        engine.dispose();
        let bad = message(lingtab::web::Engine::load(load(99)).await.err().unwrap().into());
        assert!(bad.contains("options.readers must be a whole number from 0 to 32"), "{bad}");
        // the disposed engine's readers let go (a terminated worker's handle a moment later)
        let mut deleted = false;
        for _ in 0..20 {
            if let Ok(d) = delete_store(name.clone()).await {
                deleted = d;
                break;
            }
            sleep_ms(50).await;
        }
        assert!(deleted, "the store could not be deleted after the engine was disposed");
    }

    /// The browser HTTP source refuses an answer whose size or validator differs from the pinned identity.
    #[wasm_bindgen_test]
    async fn the_http_source_refuses_a_changed_file() {
        let url = urls()[0].clone();
        let real = HttpSource::new(url.clone()).probe().await.unwrap();
        let changed = HttpSource::new(url.clone());
        changed.expect(RemoteIdentity { etag: Some("another version".into()), ..real.clone() });
        let err = changed.read_range(0, 100).await.unwrap_err();
        assert!(err.contains("the file changed: ETag was \"another version\""), "{err}");
        let resized = HttpSource::new(url);
        resized.expect(RemoteIdentity { size: real.size + 1, ..real });
        let err = resized.read_range(0, 100).await.unwrap_err();
        assert!(err.contains("the file changed") && err.contains("bytes"), "{err}");
    }
}

/// An engine of the tiny fixture, its parts read over HTTP from the test server.
async fn fixture_engine(options: &lingtab::engine::EngineOptions) -> lingtab::engine::Engine {
    use lingtab::source::{open_model, HttpSource};
    let first = format!("{}/fixtures/tiny-ling/tiny-ling-00001-of-00002.gguf", test_server());
    let model = open_model(&first, |url| Ok(HttpSource::new(url))).await.unwrap();
    let parts = lingtab::gguf::split_part_names(&first).unwrap().into_iter().map(HttpSource::new).collect();
    lingtab::engine::Engine::open(Gpu::new().await.expect("WebGPU adapter"), &model, parts, options).await.unwrap()
}

/// Experts streamed over HTTP into a pool of one token's experts (split over several buffers by a small
/// binding limit) give the all-resident engine's logits, bit for bit, in the browser.
#[wasm_bindgen_test]
async fn streamed_experts_give_the_resident_logits_in_browser() {
    use lingtab::engine::{EngineOptions, Policy, Upload};
    let mut resident = fixture_engine(&EngineOptions::default()).await;
    let slot = resident.stats().slot_bytes;
    let k = resident.config.n_expert_used as u64;
    // writeBuffer uploads, and the mapped staging ring (mapAsync in the browser)
    let options = EngineOptions { pool_bytes: Some(k * slot), max_binding: Some(256 << 10), policy: Some(Policy::Lru), ..Default::default() };
    let mut streamed = fixture_engine(&options).await;
    let staged_options = EngineOptions { pool_bytes: Some((k + 3) * slot), upload: Some(Upload::StagingRing), ..Default::default() };
    let mut staged = fixture_engine(&staged_options).await;
    assert!(streamed.is_streaming() && staged.is_streaming() && !resident.is_streaming());
    for t in [2949u32, 3536, 786, 0, 571] {
        let a = resident.step(t).await.unwrap();
        assert!(a == streamed.step(t).await.unwrap(), "token {t}: streamed logits differ from the resident ones");
        assert!(a == staged.step(t).await.unwrap(), "token {t}: logits through the staging ring differ from the resident ones");
    }
    let s = streamed.stats();
    log(&format!("browser streaming: pool of {} slots, hit rate {:.1}%, {} misses, {:.1} MB read", s.pool_slots, 100.0 * s.hit_rate(), s.misses, s.bytes_read as f64 / 1e6));
    assert_eq!(s.hits + s.misses, 5 * k * streamed.config.moe_layers().count() as u64);
}

/// Greedy steps run ahead of their picks' readback in the browser as natively: the same picks as stepping one at a
/// time, and whatever follows (a feed through the step run ahead or past it, a step of another token, other
/// tokens, the end of the context) gives the logits of an engine fed the same tokens one by one.
#[wasm_bindgen_test]
async fn a_step_run_ahead_is_taken_or_undone_in_browser() {
    use lingtab::engine::EngineOptions;
    let options = EngineOptions { prefill_chunk: Some(1), ..Default::default() };
    let short = EngineOptions { n_ctx: Some(common::forward::RUN_AHEAD_PROMPT.len() + 2), ..options.clone() };
    common::forward::run_ahead_is_taken_or_undone(fixture_engine(&options).await, fixture_engine(&options).await, fixture_engine(&short).await).await;
}

/// The batched prefill in the browser: a prompt fed in chunks of 4 (experts resident, and streamed through a pool
/// of one token's experts split over several buffers) gives the token-by-token logits, and so do the decode steps
/// after it (the states agree).
#[wasm_bindgen_test]
async fn chunked_prefill_gives_the_token_by_token_logits_in_browser() {
    use common::forward::{MAX_ABS, MAX_RMS};
    use lingtab::engine::EngineOptions;
    let prompt = [2949u32, 3536, 786, 0, 571, 2730, 17, 900, 1500, 33];
    let token_options = EngineOptions { prefill_chunk: Some(1), ..Default::default() };
    let mut tokens = fixture_engine(&token_options).await;
    let want = tokens.feed(&prompt).await.unwrap();
    let next = want.iter().enumerate().fold(0, |best, (i, &v)| if v > want[best] { i } else { best }) as u32;
    let want_next = tokens.step(next).await.unwrap();
    let slot = tokens.stats().slot_bytes;
    let k = tokens.config.n_expert_used as u64;
    drop(tokens);
    let resident = EngineOptions { prefill_chunk: Some(4), ..Default::default() };
    let streamed = EngineOptions { pool_bytes: Some(k * slot), max_binding: Some(256 << 10), ..resident.clone() };
    for (what, options) in [("resident", resident), ("streamed", streamed)] {
        let mut engine = fixture_engine(&options).await;
        assert_eq!(engine.prefill_chunk(), 4);
        let got = engine.feed(&prompt).await.unwrap();
        let got_next = engine.step(next).await.unwrap();
        for (row, (a, b)) in [(&want, &got), (&want_next, &got_next)].into_iter().enumerate() {
            let max = a.iter().zip(b.iter()).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
            let rms = (a.iter().zip(b.iter()).map(|(x, y)| ((x - y) as f64).powi(2)).sum::<f64>() / a.len() as f64).sqrt() as f32;
            log(&format!("browser prefill, {what}, chunks of 4, row {row}: max |Δlogit| {max:.2e}, rms {rms:.2e}"));
            assert!(max <= MAX_ABS && rms <= MAX_RMS, "{what} row {row}: max |Δ| {max:.2e}, rms {rms:.2e}");
        }
    }
}
