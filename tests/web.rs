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
    let model = open_model(&first, |url| Ok(HttpSource::new(url))).await.unwrap();
    let parts: Vec<HttpSource> = lingtab::gguf::split_part_names(&first).unwrap().into_iter().map(HttpSource::new).collect();
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
async fn matmul_every_type_matches_reference() {
    common::matmul::matmul_every_type_matches_reference(&Gpu::new().await.expect("WebGPU adapter")).await;
}

#[wasm_bindgen_test]
async fn batched_matmul_matches_reference() {
    common::matmul::batched_matmul_matches_reference(&Gpu::new().await.expect("WebGPU adapter")).await;
}

#[wasm_bindgen_test]
async fn grouped_expert_matmul_reads_each_pairs_expert() {
    common::matmul::grouped_expert_matmul_reads_each_pairs_expert(&Gpu::new().await.expect("WebGPU adapter")).await;
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
    use lingtab::store::{check_quota, check_value, estimate, open_complete, read_checks, read_manifest, space_verdict, Access, OpfsDir, StoreDir, StoreFile, StoreLayout, StoreState};
    use sha2::{Digest, Sha256};
    use std::cell::{Cell, RefCell};
    use std::rc::Rc;
    use wasm_bindgen::prelude::*;
    use wasm_bindgen::JsCast;
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
        let mut checks = lingtab::store::StoreChecks { dense: Default::default(), experts: vec![None; config.n_layer] };
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

/// Experts streamed over HTTP into a pool of one token's experts (split over several buffers by a small
/// binding limit) give the all-resident engine's logits, bit for bit, in the browser.
#[wasm_bindgen_test]
async fn streamed_experts_give_the_resident_logits_in_browser() {
    use lingtab::engine::{Engine, EngineOptions, Policy, Upload};
    use lingtab::source::{open_model, HttpSource};
    let first = format!("{}/fixtures/tiny-ling/tiny-ling-00001-of-00002.gguf", test_server());
    let model = open_model(&first, |url| Ok(HttpSource::new(url))).await.unwrap();
    let parts = || -> Vec<HttpSource> { lingtab::gguf::split_part_names(&first).unwrap().into_iter().map(HttpSource::new).collect() };
    let mut resident = Engine::open(Gpu::new().await.expect("WebGPU adapter"), &model, parts(), &EngineOptions::default()).await.unwrap();
    let slot = resident.stats().slot_bytes;
    let k = resident.config.n_expert_used as u64;
    // writeBuffer uploads, and the mapped staging ring (mapAsync in the browser)
    let options = EngineOptions { pool_bytes: Some(k * slot), max_binding: Some(256 << 10), policy: Some(Policy::Lru), ..Default::default() };
    let mut streamed = Engine::open(Gpu::new().await.expect("WebGPU adapter"), &model, parts(), &options).await.unwrap();
    let staged_options = EngineOptions { pool_bytes: Some((k + 3) * slot), upload: Some(Upload::StagingRing), ..Default::default() };
    let mut staged = Engine::open(Gpu::new().await.expect("WebGPU adapter"), &model, parts(), &staged_options).await.unwrap();
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

/// The batched prefill in the browser: a prompt fed in chunks of 4 (experts resident, and streamed through a pool
/// of one token's experts split over several buffers) gives the token-by-token logits, and so do the decode steps
/// after it (the states agree).
#[wasm_bindgen_test]
async fn chunked_prefill_gives_the_token_by_token_logits_in_browser() {
    use common::forward::{MAX_ABS, MAX_RMS};
    use lingtab::engine::{Engine, EngineOptions};
    use lingtab::source::{open_model, HttpSource};
    let first = format!("{}/fixtures/tiny-ling/tiny-ling-00001-of-00002.gguf", test_server());
    let model = open_model(&first, |url| Ok(HttpSource::new(url))).await.unwrap();
    let parts = || -> Vec<HttpSource> { lingtab::gguf::split_part_names(&first).unwrap().into_iter().map(HttpSource::new).collect() };
    let prompt = [2949u32, 3536, 786, 0, 571, 2730, 17, 900, 1500, 33];
    let token_options = EngineOptions { prefill_chunk: Some(1), ..Default::default() };
    let mut tokens = Engine::open(Gpu::new().await.expect("WebGPU adapter"), &model, parts(), &token_options).await.unwrap();
    let want = tokens.feed(&prompt).await.unwrap();
    let next = want.iter().enumerate().fold(0, |best, (i, &v)| if v > want[best] { i } else { best }) as u32;
    let want_next = tokens.step(next).await.unwrap();
    let slot = tokens.stats().slot_bytes;
    let k = tokens.config.n_expert_used as u64;
    drop(tokens);
    let resident = EngineOptions { prefill_chunk: Some(4), ..Default::default() };
    let streamed = EngineOptions { pool_bytes: Some(k * slot), max_binding: Some(256 << 10), ..resident.clone() };
    for (what, options) in [("resident", resident), ("streamed", streamed)] {
        let mut engine = Engine::open(Gpu::new().await.expect("WebGPU adapter"), &model, parts(), &options).await.unwrap();
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
