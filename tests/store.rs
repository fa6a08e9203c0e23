//! Store and ingest natively: the tiny-ling parts (made by `make-tiny`) served over real HTTP with Range
//! requests on 127.0.0.1 — `lingtab serve`'s router, and a test server that can misbehave — ingested into a
//! temporary store, then loaded by the engine.
#![cfg(not(target_arch = "wasm32"))]

use axum::body::Body;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, Response, StatusCode};
use lingtab::engine::{Engine, EngineOptions};
use lingtab::gguf::{parse_header, SplitModel};
use lingtab::gpu::Gpu;
use lingtab::ingest::{ingest, IngestOptions, PartHint};
use lingtab::source::{FileSource, HttpSource, RangeSource};
use lingtab::store::{check_value, open_complete, read_checks, read_manifest, FsDir, StoreChecks, StoreState};
use sha2::{Digest, Sha256};
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

const NAMES: [&str; 2] = ["tiny-ling-00001-of-00002.gguf", "tiny-ling-00002-of-00002.gguf"];

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-ling")
}

fn temp_store(tag: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let p = std::env::temp_dir().join(format!("lingtab-store-{}-{tag}-{}", std::process::id(), N.fetch_add(1, Ordering::SeqCst)));
    let _ = std::fs::remove_dir_all(&p);
    p
}

/// How the test server misbehaves.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Good,
    /// 200 with the whole file to every Range request
    Full200,
    /// Content-Range off by one byte (body of the right length)
    WrongContentRange,
    /// the body is shorter than the range (every time)
    ShortBody,
    /// the ETag changes after this many requests
    EtagChangesAfter(usize),
    /// one byte of every answer flipped (ETag still the sha256 of the real file)
    Corrupt,
    /// the connection drops mid-body on the first request for each unit
    Drops,
    /// headers and half the body, then silence (the connection kept open): the first request for each range
    StallsOnce,
    /// the same on every request
    Stalls,
    /// no answer at all (the connection kept open) on every request
    Silent,
}

struct Served {
    files: Vec<(String, Vec<u8>, String)>,
    mode: Mutex<Mode>,
    requests: AtomicUsize,
    /// bytes sent for requests of 2..=unit bytes (unit fetches; header reads and probes excluded)
    unit_bytes_sent: AtomicU64,
    unit: u64,
    delay_ms: u64,
    dropped: Mutex<std::collections::HashSet<(String, u64)>>,
    /// answers that stalled (or were never sent)
    stalls: AtomicUsize,
}

async fn handle(State(st): State<Arc<Served>>, UrlPath(name): UrlPath<String>, headers: HeaderMap) -> Response<Body> {
    let n = st.requests.fetch_add(1, Ordering::SeqCst);
    if st.delay_ms > 0 {
        tokio::time::sleep(std::time::Duration::from_millis(st.delay_ms)).await;
    }
    let Some((_, bytes, sha)) = st.files.iter().find(|f| f.0 == name) else {
        return Response::builder().status(404).body(Body::empty()).unwrap();
    };
    let mode = *st.mode.lock().unwrap();
    let etag = match mode {
        Mode::EtagChangesAfter(k) if n >= k => "\"changed\"".to_string(),
        _ => format!("\"{sha}\""),
    };
    let total = bytes.len() as u64;
    let range = headers.get("range").and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("bytes=")).and_then(|v| {
        let (a, b) = v.split_once('-')?;
        Some((a.parse::<u64>().ok()?, b.parse::<u64>().ok()?))
    });
    let Some((a, b)) = range else {
        return Response::builder().status(200).header("etag", etag).body(Body::from(bytes.clone())).unwrap();
    };
    if mode == Mode::Full200 {
        return Response::builder().status(200).header("etag", etag).body(Body::from(bytes.clone())).unwrap();
    }
    if a >= total {
        return Response::builder().status(416).header("content-range", format!("bytes */{total}")).body(Body::empty()).unwrap();
    }
    let b = b.min(total - 1);
    let mut body = bytes[a as usize..=b as usize].to_vec();
    let len = body.len() as u64;
    if len > 1 && len <= st.unit {
        st.unit_bytes_sent.fetch_add(len, Ordering::SeqCst);
    }
    if mode == Mode::Drops && len > 1 && st.dropped.lock().unwrap().insert((name.clone(), a)) {
        // half the body, then the connection breaks
        let half = axum::body::Bytes::from(body[..body.len() / 2].to_vec());
        let items: Vec<Result<axum::body::Bytes, std::io::Error>> = vec![Ok(half), Err(std::io::Error::other("dropped"))];
        return Response::builder()
            .status(StatusCode::PARTIAL_CONTENT)
            .header("content-range", format!("bytes {a}-{b}/{total}"))
            .header("content-length", len.to_string())
            .header("etag", etag)
            .body(Body::from_stream(futures_util::stream::iter(items)))
            .unwrap();
    }
    let stall = match mode {
        Mode::Stalls | Mode::Silent => len > 1,
        Mode::StallsOnce => len > 1 && st.dropped.lock().unwrap().insert((name.clone(), a)),
        _ => false,
    };
    if stall {
        st.stalls.fetch_add(1, Ordering::SeqCst);
        if mode == Mode::Silent {
            std::future::pending::<()>().await;
        }
        use futures_util::StreamExt;
        let half = axum::body::Bytes::from(body[..body.len() / 2].to_vec());
        let silence = futures_util::stream::iter([Ok::<_, std::io::Error>(half)]).chain(futures_util::stream::pending());
        return Response::builder()
            .status(StatusCode::PARTIAL_CONTENT)
            .header("content-range", format!("bytes {a}-{b}/{total}"))
            .header("content-length", len.to_string())
            .header("etag", etag)
            .body(Body::from_stream(silence))
            .unwrap();
    }
    let mut cr = format!("bytes {a}-{b}/{total}");
    match mode {
        Mode::WrongContentRange => cr = format!("bytes {}-{}/{total}", a + 1, b + 1),
        Mode::ShortBody if body.len() > 1 => body.truncate(body.len() / 2),
        Mode::Corrupt if len > 1 => body[len as usize / 2] ^= 0x5a,
        _ => {}
    }
    Response::builder()
        .status(StatusCode::PARTIAL_CONTENT)
        .header("content-range", cr)
        .header("accept-ranges", "bytes")
        .header("etag", etag)
        .body(Body::from(body))
        .unwrap()
}

/// Starts a server on 127.0.0.1 in a background thread; returns its base URL.
fn start(router: axum::Router) -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            axum::serve(listener, router).await.unwrap();
        });
    });
    format!("http://{}", rx.recv().unwrap())
}

fn test_server(mode: Mode, unit: u64, delay_ms: u64) -> (String, Arc<Served>) {
    let files = NAMES
        .iter()
        .map(|n| {
            let bytes = std::fs::read(fixture_dir().join(n)).unwrap();
            let sha = format!("{:x}", Sha256::digest(&bytes));
            (n.to_string(), bytes, sha)
        })
        .collect();
    let st = Arc::new(Served { files, mode: Mutex::new(mode), requests: AtomicUsize::new(0), unit_bytes_sent: AtomicU64::new(0), unit, delay_ms, dropped: Default::default(), stalls: AtomicUsize::new(0) });
    let router = axum::Router::new().route("/tiny/resolve/main/{name}", axum::routing::get(handle)).with_state(st.clone());
    (format!("{}/tiny/resolve/main", start(router)), st)
}

/// `lingtab serve`'s own router over the fixture folder, laid out like Hugging Face's resolve URLs.
fn serve_fixtures() -> String {
    let router = lingtab::cli::serve::router(&[("/org/tiny/resolve/main".to_string(), fixture_dir())]);
    format!("{}/org/tiny/resolve/main", start(router))
}

/// Ingests the two parts from `base` into `store` the way `lingtab ingest` does (probe, then ingest).
fn ingest_from(base: &str, store: &std::path::Path, options: &IngestOptions) -> Result<lingtab::store::Manifest, String> {
    ingest_with(base, store, options, |mut s| {
        s.retries = 1;
        s
    })
}

/// [`ingest_from`] with the sources set up by `configure` (retries, stall timeout).
fn ingest_with(base: &str, store: &std::path::Path, options: &IngestOptions, configure: impl Fn(HttpSource) -> HttpSource) -> Result<lingtab::store::Manifest, String> {
    let sources: Vec<HttpSource> = NAMES.iter().map(|n| configure(HttpSource::new(&format!("{base}/{n}")))).collect();
    let dir = FsDir::new(store)?;
    pollster::block_on(async {
        let mut hints = Vec::new();
        for s in &sources {
            let id = s.probe().await?;
            hints.push(PartHint { etag: id.etag, size: Some(id.size), sha256: id.sha256 });
        }
        ingest(&dir, &sources, &hints, options, &mut |_| {}).await
    })
}

fn gguf_engine() -> Engine {
    let parts: Vec<FileSource> = NAMES.iter().map(|n| FileSource::open(&fixture_dir().join(n)).unwrap()).collect();
    let headers = NAMES.iter().map(|n| {
        let bytes = std::fs::read(fixture_dir().join(n)).unwrap();
        (parse_header(&bytes, Some(bytes.len() as u64)).unwrap(), bytes.len() as u64)
    });
    let model = SplitModel::new(headers.collect()).unwrap();
    pollster::block_on(async { Engine::load(Gpu::new().await.unwrap(), &model, &parts, &EngineOptions::default()).await.unwrap() })
}

fn store_engine(store: &std::path::Path) -> Engine {
    let dir = FsDir::new(store).unwrap();
    pollster::block_on(async {
        let (model, parts) = open_complete(&dir).await.unwrap();
        Engine::load(Gpu::new().await.unwrap(), &model, &parts, &EngineOptions::default()).await.unwrap()
    })
}

/// The check values of the tiny model, computed here from the GGUF files' bytes and their tensor tables
/// (not through the store's layout): every dense tensor whole, every expert's slice of each expert tensor.
fn checks_from_the_ggufs() -> StoreChecks {
    let files: Vec<Vec<u8>> = NAMES.iter().map(|n| std::fs::read(fixture_dir().join(n)).unwrap()).collect();
    let model = SplitModel::new(files.iter().map(|b| (parse_header(b, Some(b.len() as u64)).unwrap(), b.len() as u64)).collect()).unwrap();
    let config = lingtab::model::Config::from_header(model.header()).unwrap();
    let n_expert = config.n_expert as u64;
    let headers = model.parts.iter().zip(&files).map(|(h, f)| check_value(&f[..h.data_start as usize])).collect();
    let mut checks = StoreChecks { dense: Default::default(), experts: vec![None; config.n_layer], headers };
    let bytes_of = |t: &lingtab::gguf::SplitTensor, from: u64, len: u64| &files[t.part][(t.file_offset + from) as usize..(t.file_offset + from + len) as usize];
    for t in &model.tensors {
        use lingtab::model::layout::Role;
        match lingtab::model::layout::role(&config, &t.info.name) {
            Role::Global | Role::Dense { .. } => {
                checks.dense.insert(t.info.name.clone(), check_value(bytes_of(t, 0, t.info.n_bytes())));
            }
            Role::Experts { layer } => {
                let which = lingtab::model::layout::EXPERT_TENSORS.iter().position(|s| t.info.name == format!("blk.{layer}.{s}")).unwrap();
                let per = t.info.n_bytes() / n_expert;
                let experts = checks.experts[layer].get_or_insert_with(|| vec![[0; 3]; n_expert as usize]);
                for e in 0..n_expert {
                    experts[e as usize][which] = check_value(bytes_of(t, e * per, per));
                }
            }
            _ => {}
        }
    }
    assert!(checks.experts.iter().flatten().flatten().flatten().all(|&v| v != 0));
    checks
}

fn store_checks(store: &std::path::Path) -> StoreChecks {
    pollster::block_on(read_checks(&FsDir::new(store).unwrap())).unwrap().expect("a complete store has checks.json")
}

#[test]
fn ingest_over_http_then_the_store_gives_the_gguf_logits() {
    let base = serve_fixtures();
    let store = temp_store("logits");
    let m = ingest_from(&base, &store, &IngestOptions { unit_bytes: 64 << 10, in_flight: 4 }).unwrap();
    assert_eq!(m.state, StoreState::Complete);
    assert!(!store.join("journal.bin").exists());
    assert_eq!(std::fs::metadata(store.join("data.bin")).unwrap().len(), m.data_len);
    // the sha256 of each part, computed in file order from the store, is the file's
    for (p, n) in m.parts.iter().zip(NAMES) {
        assert_eq!(p.sha256.as_deref().unwrap(), format!("{:x}", Sha256::digest(std::fs::read(fixture_dir().join(n)).unwrap())));
    }
    // the check values computed while ingesting are those of the GGUF's bytes
    assert_eq!(store_checks(&store), checks_from_the_ggufs());
    // ingesting again into a complete store does nothing and succeeds
    ingest_from(&base, &store, &IngestOptions { unit_bytes: 64 << 10, in_flight: 4 }).unwrap();
    let mut a = gguf_engine();
    let mut b = store_engine(&store);
    for t in [2949u32, 3536, 786, 0, 571, 2730] {
        let x = pollster::block_on(a.step(t)).unwrap();
        let y = pollster::block_on(b.step(t)).unwrap();
        assert_eq!(x, y, "logits from the store differ from the GGUF's at token {t}");
    }
    std::fs::remove_dir_all(&store).unwrap();
}

fn assert_not_complete(store: &std::path::Path) {
    let dir = FsDir::new(store).unwrap();
    if let Some(m) = pollster::block_on(read_manifest(&dir)).unwrap() {
        assert_eq!(m.state, StoreState::Ingesting);
    }
    assert!(pollster::block_on(open_complete(&dir)).is_err());
}

#[test]
fn hostile_servers_give_clear_errors_and_no_complete_store() {
    let cases: [(Mode, &str); 5] = [
        (Mode::Full200, "answered 200"),
        (Mode::WrongContentRange, "Content-Range"),
        (Mode::ShortBody, "got "),
        (Mode::EtagChangesAfter(8), "the file changed: ETag"),
        (Mode::Corrupt, "sha256"),
    ];
    for (mode, want) in cases {
        let (base, _st) = test_server(mode, 1 << 20, 0);
        let store = temp_store("hostile");
        let err = ingest_from(&base, &store, &IngestOptions { unit_bytes: 1 << 20, in_flight: 2 }).unwrap_err();
        eprintln!("{mode:?}: {err}");
        assert!(err.contains(want), "{mode:?}: the error {err:?} does not mention {want:?}");
        assert_not_complete(&store);
        std::fs::remove_dir_all(&store).unwrap();
    }
}

#[test]
fn dropped_connections_are_retried() {
    let (base, _st) = test_server(Mode::Drops, 1 << 20, 0);
    let store = temp_store("drops");
    let m = ingest_from(&base, &store, &IngestOptions { unit_bytes: 1 << 20, in_flight: 2 }).unwrap();
    assert_eq!(m.state, StoreState::Complete);
    std::fs::remove_dir_all(&store).unwrap();
}

#[test]
fn stalled_answers_time_out_and_are_retried_to_a_correct_store() {
    let (base, st) = test_server(Mode::StallsOnce, 1 << 20, 0);
    let store = temp_store("stalls");
    let stall = std::time::Duration::from_millis(300);
    let m = ingest_with(&base, &store, &IngestOptions { unit_bytes: 1 << 20, in_flight: 3 }, |s| {
        let mut s = s.with_stall_timeout(stall);
        s.retries = 2;
        s
    })
    .unwrap();
    let stalls = st.stalls.load(Ordering::SeqCst);
    let units: usize = NAMES.iter().map(|n| std::fs::metadata(fixture_dir().join(n)).unwrap().len().div_ceil(1 << 20) as usize).sum();
    eprintln!("{stalls} stalled answers (every range's first), each left after {stall:?} and asked again");
    // every unit's first answer (and each header read's) stalled
    assert!(stalls >= units, "{stalls} stalls for {units} units");
    assert_eq!(m.state, StoreState::Complete);
    for (p, n) in m.parts.iter().zip(NAMES) {
        assert_eq!(p.sha256.as_deref().unwrap(), format!("{:x}", Sha256::digest(std::fs::read(fixture_dir().join(n)).unwrap())));
    }
    assert_eq!(store_checks(&store), checks_from_the_ggufs());
    std::fs::remove_dir_all(&store).unwrap();
}

#[test]
fn a_server_that_keeps_stalling_gives_a_clear_error_in_bounded_time() {
    for mode in [Mode::Stalls, Mode::Silent] {
        let (base, st) = test_server(mode, 1 << 20, 0);
        let store = temp_store("stalling");
        let began = std::time::Instant::now();
        let err = ingest_with(&base, &store, &IngestOptions { unit_bytes: 1 << 20, in_flight: 2 }, |s| {
            let mut s = s.with_stall_timeout(std::time::Duration::from_millis(250));
            s.retries = 2;
            s
        })
        .unwrap_err();
        let took = began.elapsed();
        eprintln!("{mode:?}: {err} ({took:?}, {} stalled answers)", st.stalls.load(Ordering::SeqCst));
        assert!(err.contains("no bytes from the server for 250 ms (it stalled") && err.contains("(after 3 tries)"), "{mode:?}: {err}");
        // three tries of 0.25 s and two pauses (0.2 s, 0.4 s): far from hanging
        assert!(took < std::time::Duration::from_secs(20), "{mode:?}: gave up after {took:?}");
        assert_not_complete(&store);
        std::fs::remove_dir_all(&store).unwrap();
    }
}

#[test]
fn a_part_of_the_wrong_size_is_refused() {
    let (base, _st) = test_server(Mode::Good, 1 << 20, 0);
    let store = temp_store("size");
    let sources: Vec<HttpSource> = NAMES.iter().map(|n| HttpSource::new(&format!("{base}/{n}"))).collect();
    let real = std::fs::metadata(fixture_dir().join(NAMES[1])).unwrap().len();
    let hints = vec![PartHint::default(), PartHint { size: Some(real + 1), ..Default::default() }];
    let dir = FsDir::new(&store).unwrap();
    let err = pollster::block_on(ingest(&dir, &sources, &hints, &IngestOptions::default(), &mut |_| {})).unwrap_err();
    assert!(err.contains(&format!("expected {}", real + 1)), "{err}");
    assert_not_complete(&store);
    std::fs::remove_dir_all(&store).unwrap();
}

#[test]
fn a_changed_source_is_refused_on_resume() {
    let (base, st) = test_server(Mode::Good, 4096, 0);
    let store = temp_store("changed");
    // a first run that the server breaks half-way (ETag changes) leaves an ingesting store
    *st.mode.lock().unwrap() = Mode::EtagChangesAfter(10);
    assert!(ingest_from(&base, &store, &IngestOptions { unit_bytes: 4096, in_flight: 1 }).is_err());
    // the server now serves the "new" file from the start: the store from the old one is refused
    *st.mode.lock().unwrap() = Mode::EtagChangesAfter(0);
    let err = ingest_from(&base, &store, &IngestOptions { unit_bytes: 4096, in_flight: 1 }).unwrap_err();
    assert!(err.contains("another source"), "{err}");
    assert_not_complete(&store);
    std::fs::remove_dir_all(&store).unwrap();
}

fn xorshift(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

/// Units journaled so far in a store (4 bytes each; a torn last entry does not count).
fn journaled(store: &std::path::Path) -> u64 {
    std::fs::metadata(store.join("journal.bin")).map(|m| m.len() / 4).unwrap_or(0)
}

/// The files in a store folder, sorted.
fn files_in(store: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(store).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    names
}

#[test]
fn killed_ingests_resume_to_a_byte_identical_store_with_bounded_refetch() {
    let unit = 256u64 << 10;
    let in_flight = 2u64;
    let exe = env!("CARGO_BIN_EXE_lingtab");
    let (base, st) = test_server(Mode::Good, unit, 5);
    let run = |store: &std::path::Path| {
        std::process::Command::new(exe)
            .args(["ingest", "--quiet", "--url", &format!("{base}/{}", NAMES[0])])
            .args(["--store", store.to_str().unwrap(), "--unit-bytes", &unit.to_string(), "--in-flight", &in_flight.to_string()])
            .spawn()
            .unwrap()
    };
    // reference: one uninterrupted run
    let reference = temp_store("kill-ref");
    let began = std::time::Instant::now();
    assert!(run(&reference).wait().unwrap().success());
    let run_ms = began.elapsed().as_millis() as u64;
    let sizes: Vec<u64> = NAMES.iter().map(|n| std::fs::metadata(fixture_dir().join(n)).unwrap().len()).collect();
    let total: u64 = sizes.iter().sum();
    let n_units: u64 = sizes.iter().map(|s| s.div_ceil(unit)).sum();
    let clean_sent = st.unit_bytes_sent.swap(0, Ordering::SeqCst);
    assert_eq!(clean_sent, total);

    // Kills at points spread over the whole ingest: most runs when the journal reaches the next of a sorted
    // list of random unit counts (then a random few ms more, to land mid-unit as well as between units),
    // every fourth at a random early time (start-up, headers, the first units). The finishing steps have
    // their own test below (a kill there is too brief a target to hit at random).
    let store = temp_store("kill");
    let mut seed = 0x9e3779b97f4a7c15u64 ^ std::process::id() as u64;
    let mut targets: Vec<u64> = (0..9).map(|_| 1 + xorshift(&mut seed) % (n_units - 2)).collect();
    targets.sort_unstable();
    let mut targets = targets.into_iter();
    let (mut kills, mut mid_fetch) = (0u64, 0u64);
    for round in 0..12 {
        let mut child = run(&store);
        match (round % 4, targets.next()) {
            (1..=3, Some(target)) => {
                let deadline = std::time::Instant::now() + std::time::Duration::from_millis(run_ms * 4);
                while journaled(&store) < target && child.try_wait().unwrap().is_none() && std::time::Instant::now() < deadline {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                std::thread::sleep(std::time::Duration::from_millis(xorshift(&mut seed) % 15));
            }
            _ => std::thread::sleep(std::time::Duration::from_millis(xorshift(&mut seed) % 200)),
        }
        if child.try_wait().unwrap().is_none() {
            child.kill().unwrap();
            kills += 1;
            let at = journaled(&store);
            if at > 0 && at < n_units {
                mid_fetch += 1;
            }
        }
        child.wait().unwrap();
    }
    assert!(run(&store).wait().unwrap().success());
    let sent = st.unit_bytes_sent.load(Ordering::SeqCst);
    eprintln!("{kills} kills, {mid_fetch} mid-fetch (runs of {run_ms} ms, {n_units} units); unit bytes fetched {sent} for {total} bytes of GGUF");
    assert!(mid_fetch >= 6, "only {mid_fetch} of {kills} kills landed mid-fetch");
    // at most the units in flight are lost per interruption (requests answered but not yet journaled)
    assert!(sent <= total + kills * in_flight * unit, "fetched {sent} bytes; allowed {total} + {kills} × {in_flight} × {unit}");
    for f in ["data.bin", "manifest.json"] {
        assert!(std::fs::read(reference.join(f)).unwrap() == std::fs::read(store.join(f)).unwrap(), "{f} differs from the uninterrupted store's");
    }
    assert_eq!(files_in(&store), ["checks.json", "data.bin", "manifest.json"], "a complete store holds only its data, checks and manifest");
    // the check values survived every kill (logged before the hash state, the straddling run read back)
    assert_eq!(store_checks(&store), checks_from_the_ggufs());
    std::fs::remove_dir_all(&store).unwrap();
    std::fs::remove_dir_all(&reference).unwrap();
}

/// A store in the state a kill leaves at the very end of an ingest — every unit journaled, the running hash
/// not saved, the manifest not yet marked complete — made by hand from the GGUF files and the layout.
fn store_with_every_unit_in(reference: &std::path::Path, unit: u64, tag: &str) -> PathBuf {
    let store = temp_store(tag);
    std::fs::create_dir_all(&store).unwrap();
    std::fs::copy(reference.join("data.bin"), store.join("data.bin")).unwrap();
    let mut m: lingtab::store::Manifest = serde_json::from_slice(&std::fs::read(reference.join("manifest.json")).unwrap()).unwrap();
    m.state = StoreState::Ingesting;
    std::fs::write(store.join("manifest.json"), serde_json::to_vec_pretty(&m).unwrap()).unwrap();
    let files: Vec<Vec<u8>> = NAMES.iter().map(|n| std::fs::read(fixture_dir().join(n)).unwrap()).collect();
    let headers = files.iter().map(|b| (parse_header(b, Some(b.len() as u64)).unwrap(), b.len() as u64)).collect();
    let layout = lingtab::store::StoreLayout::from_model(&SplitModel::new(headers).unwrap()).unwrap();
    let mut tail = vec![0u8; (layout.ingest_len - layout.data_len) as usize];
    for p in layout.pieces.iter().filter(|p| p.store_offset >= layout.data_len) {
        let at = (p.store_offset - layout.data_len) as usize;
        tail[at..at + p.len as usize].copy_from_slice(&files[p.part][p.file_offset as usize..(p.file_offset + p.len) as usize]);
    }
    std::fs::write(store.join("tail.bin"), tail).unwrap();
    let n_units: u32 = files.iter().map(|f| (f.len() as u64).div_ceil(unit) as u32).sum();
    std::fs::write(store.join("journal.bin"), (0..n_units).flat_map(|u| u.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
    store
}

#[test]
fn a_store_killed_while_finishing_completes_without_fetching() {
    // (smaller than the header reads, which the server does not count as unit fetches)
    let unit = 512u64 << 10;
    let (base, st) = test_server(Mode::Good, unit, 0);
    let options = IngestOptions { unit_bytes: unit, in_flight: 2 };
    let reference = temp_store("finish-ref");
    ingest_from(&base, &reference, &options).unwrap();
    // killed after the last unit was journaled: the next run hashes from the store and completes
    let store = store_with_every_unit_in(&reference, unit, "finish");
    std::fs::write(store.join("manifest.json.tmp"), b"{ half a manif").unwrap();
    st.unit_bytes_sent.store(0, Ordering::SeqCst);
    let m = ingest_from(&base, &store, &options).unwrap();
    assert_eq!(m.state, StoreState::Complete);
    assert_eq!(st.unit_bytes_sent.load(Ordering::SeqCst), 0, "nothing is fetched again");
    for f in ["data.bin", "manifest.json"] {
        assert!(std::fs::read(reference.join(f)).unwrap() == std::fs::read(store.join(f)).unwrap(), "{f} differs from the uninterrupted store's");
    }
    assert_eq!(files_in(&store), ["checks.json", "data.bin", "manifest.json"]);
    // killed after the store was marked complete but before the cleanup: the leftovers go on the next open
    assert_eq!(store_checks(&store), checks_from_the_ggufs());
    for f in ["journal.bin", "tail.bin", "hash.json", "hash.json.tmp", "checks.log"] {
        std::fs::write(store.join(f), b"left over").unwrap();
    }
    let dir = FsDir::new(&store).unwrap();
    pollster::block_on(open_complete(&dir)).unwrap();
    assert_eq!(files_in(&store), ["checks.json", "data.bin", "manifest.json"]);
    // … or on the next ingest, which fetches nothing
    std::fs::write(store.join("journal.bin"), b"left over").unwrap();
    ingest_from(&base, &store, &options).unwrap();
    assert_eq!(files_in(&store), ["checks.json", "data.bin", "manifest.json"]);
    assert_eq!(st.unit_bytes_sent.load(Ordering::SeqCst), 0);
    std::fs::remove_dir_all(&store).unwrap();
    std::fs::remove_dir_all(&reference).unwrap();
}

#[test]
fn bytes_corrupted_in_the_store_fail_their_part_and_only_that_part_is_fetched_again() {
    let unit = 512u64 << 10;
    let (base, st) = test_server(Mode::Good, unit, 0);
    let options = IngestOptions { unit_bytes: unit, in_flight: 2 };
    let reference = temp_store("corrupt-ref");
    ingest_from(&base, &reference, &options).unwrap();
    let store = store_with_every_unit_in(&reference, unit, "corrupt");
    // one byte of part 2's first dense tensor
    let files: Vec<Vec<u8>> = NAMES.iter().map(|n| std::fs::read(fixture_dir().join(n)).unwrap()).collect();
    let headers = files.iter().map(|b| (parse_header(b, Some(b.len() as u64)).unwrap(), b.len() as u64)).collect();
    let layout = lingtab::store::StoreLayout::from_model(&SplitModel::new(headers).unwrap()).unwrap();
    let victim = layout.pieces.iter().find(|p| p.part == 1 && p.file_offset > 0 && p.store_offset < layout.data_len).unwrap();
    let mut data = std::fs::read(store.join("data.bin")).unwrap();
    data[victim.store_offset as usize] ^= 0x01;
    std::fs::write(store.join("data.bin"), &data).unwrap();
    st.unit_bytes_sent.store(0, Ordering::SeqCst);
    let err = ingest_from(&base, &store, &options).unwrap_err();
    eprintln!("{err}");
    let want = format!("{:x}", Sha256::digest(&files[1]));
    assert!(err.contains("part 2 (") && err.contains(&format!("expected {want}")) && err.contains("sha256 "), "{err}");
    assert_eq!(st.unit_bytes_sent.load(Ordering::SeqCst), 0);
    assert_not_complete(&store);
    // the next ingest fetches part 2 again, and part 2 only
    let m = ingest_from(&base, &store, &options).unwrap();
    assert_eq!(m.state, StoreState::Complete);
    assert_eq!(st.unit_bytes_sent.load(Ordering::SeqCst), files[1].len() as u64);
    // the check values of part 2's runs were recomputed from the refetched bytes
    assert_eq!(store_checks(&store), checks_from_the_ggufs());
    for f in ["data.bin", "manifest.json"] {
        assert!(std::fs::read(reference.join(f)).unwrap() == std::fs::read(store.join(f)).unwrap(), "{f} differs from the uninterrupted store's");
    }
    std::fs::remove_dir_all(&store).unwrap();
    std::fs::remove_dir_all(&reference).unwrap();
}

#[test]
fn the_store_part_view_reads_what_the_file_holds() {
    // every stored (non-tail) byte read through the view equals the GGUF's
    let base = serve_fixtures();
    let store = temp_store("view");
    ingest_from(&base, &store, &IngestOptions { unit_bytes: 100_003, in_flight: 3 }).unwrap();
    let dir = FsDir::new(&store).unwrap();
    let (model, views) = pollster::block_on(open_complete(&dir)).unwrap();
    let config = lingtab::model::Config::from_header(model.header()).unwrap();
    for t in &model.tensors {
        if matches!(lingtab::model::layout::role(&config, &t.info.name), lingtab::model::layout::Role::Mtp { .. }) {
            continue;
        }
        let file = std::fs::read(fixture_dir().join(NAMES[t.part])).unwrap();
        let want = &file[t.file_offset as usize..(t.file_offset + t.info.n_bytes()) as usize];
        let (got, _) = pollster::block_on(views[t.part].read_range(t.file_offset, t.info.n_bytes())).unwrap();
        assert!(got == want, "{}", t.info.name);
    }
    std::fs::remove_dir_all(&store).unwrap();
}

/// `lingtab greedy --store` with a small expert pool (streaming): (success, stdout, stderr).
fn greedy_from_store(store: &std::path::Path, pool_bytes: Option<u64>) -> (bool, String, String) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_lingtab"));
    cmd.args(["greedy", "--store", store.to_str().unwrap(), "--tokens", "2949,3536,786", "-n", "8"]);
    if let Some(b) = pool_bytes {
        cmd.args(["--pool-bytes", &b.to_string()]);
    }
    let out = cmd.output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn bytes_changed_in_a_complete_store_fail_the_load_naming_what_changed() {
    let base = serve_fixtures();
    let reference = temp_store("checks-ref");
    ingest_from(&base, &reference, &IngestOptions { unit_bytes: 64 << 10, in_flight: 4 }).unwrap();
    let files: Vec<Vec<u8>> = NAMES.iter().map(|n| std::fs::read(fixture_dir().join(n)).unwrap()).collect();
    let layout = lingtab::store::StoreLayout::from_model(&SplitModel::new(files.iter().map(|b| (parse_header(b, Some(b.len() as u64)).unwrap(), b.len() as u64)).collect()).unwrap()).unwrap();
    let records = &layout.experts[1];
    let n_expert = 32u64;
    // a pool of a few records streams experts (the tiny model has 32 per layer, 4 used per token)
    let small_pool = Some(records.stride * 10);
    let (ok, stdout, stderr) = greedy_from_store(&reference, small_pool);
    assert!(ok, "the intact store: {stderr}");
    let intact: Vec<u32> = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(intact.len(), 8);
    let copy = |tag: &str| {
        let store = temp_store(tag);
        std::fs::create_dir_all(&store).unwrap();
        for f in ["checks.json", "data.bin", "manifest.json"] {
            std::fs::copy(reference.join(f), store.join(f)).unwrap();
        }
        store
    };
    let flip = |store: &std::path::Path, offsets: &[u64]| {
        let mut data = std::fs::read(store.join("data.bin")).unwrap();
        for &o in offsets {
            data[o as usize] ^= 0x10;
        }
        std::fs::write(store.join("data.bin"), &data).unwrap();
    };

    // one byte of expert 5's up rows in layer L, every expert resident: the load reads it and fails
    let store = copy("checks-expert");
    flip(&store, &[records.offset + 5 * records.stride + records.up + 7]);
    let (ok, stdout, stderr) = greedy_from_store(&store, None);
    eprintln!("resident: {stderr}");
    assert!(!ok && stdout.trim().is_empty(), "no tokens from a changed store: {stdout}");
    assert!(stderr.contains(&format!("layer {} expert 5: its up rows", records.layer)) && stderr.contains("changed on disk"), "{stderr}");
    std::fs::remove_dir_all(&store).unwrap();

    // streaming from a small pool: a byte of every expert's gate rows in layer L changed, so whichever the
    // router picks first fails its check when it is read, before anything is printed
    let store = copy("checks-stream");
    flip(&store, &(0..n_expert).map(|e| records.offset + e * records.stride + records.gate + 100).collect::<Vec<_>>());
    let (ok, stdout, stderr) = greedy_from_store(&store, small_pool);
    eprintln!("streaming: {stderr}");
    assert!(!ok && stdout.trim().is_empty(), "no tokens from a changed store: {stdout}");
    assert!(stderr.contains(&format!("layer {} expert ", records.layer)) && stderr.contains("its gate rows") && stderr.contains("changed on disk"), "{stderr}");
    std::fs::remove_dir_all(&store).unwrap();

    // a byte of a dense tensor: the load fails naming it
    let store = copy("checks-dense");
    let dense = layout.dense.iter().find(|d| d.name.contains("attn") && d.len > 64).unwrap();
    flip(&store, &[dense.offset + dense.len / 2]);
    let (ok, stdout, stderr) = greedy_from_store(&store, small_pool);
    eprintln!("dense: {stderr}");
    assert!(!ok && stdout.trim().is_empty(), "{stdout}");
    assert!(stderr.contains(&format!("{}: its bytes in the store do not match", dense.name)) && stderr.contains("changed on disk"), "{stderr}");
    std::fs::remove_dir_all(&store).unwrap();

    // the intact store again: same tokens (the checks pass and change nothing)
    let (ok, stdout, _) = greedy_from_store(&reference, small_pool);
    assert!(ok);
    assert_eq!(serde_json::from_str::<Vec<u32>>(stdout.trim()).unwrap(), intact);
    std::fs::remove_dir_all(&reference).unwrap();
}

/// The cost of the check: xxh3-64 over 64 MiB against reading those bytes from a file (page cache).
#[test]
fn check_value_throughput() {
    let bytes: Vec<u8> = (0..64u64 << 20).map(|i| (i.wrapping_mul(0x9e3779b97f4a7c15) >> 56) as u8).collect();
    let path = temp_store("bench");
    std::fs::write(&path, &bytes).unwrap();
    let mut best_check = f64::MAX;
    let mut best_read = f64::MAX;
    let mut buf = vec![0u8; bytes.len()];
    for _ in 0..5 {
        let t = std::time::Instant::now();
        std::hint::black_box(check_value(std::hint::black_box(&bytes)));
        best_check = best_check.min(t.elapsed().as_secs_f64());
        let t = std::time::Instant::now();
        use std::io::Read;
        std::fs::File::open(&path).unwrap().read_exact(&mut buf).unwrap();
        best_read = best_read.min(t.elapsed().as_secs_f64());
    }
    let gb = bytes.len() as f64 / 1e9;
    eprintln!("check_value: {:.2} GB/s; reading the same 64 MiB from a cached file: {:.2} GB/s", gb / best_check, gb / best_read);
    std::fs::remove_file(&path).unwrap();
}

// ---- stores damaged while stopped ------------------------------------------------------------------------------

/// The tiny model's store layout, from the GGUF files.
fn fixture_layout() -> lingtab::store::StoreLayout {
    let files: Vec<Vec<u8>> = NAMES.iter().map(|n| std::fs::read(fixture_dir().join(n)).unwrap()).collect();
    let headers = files.iter().map(|b| (parse_header(b, Some(b.len() as u64)).unwrap(), b.len() as u64)).collect();
    lingtab::store::StoreLayout::from_model(&SplitModel::new(headers).unwrap()).unwrap()
}

/// The runs the data file keeps (headers, dense tensors, expert rows), and what a load that meets a change in
/// each says about it.
fn kept_runs(layout: &lingtab::store::StoreLayout) -> Vec<(lingtab::store::Piece, String)> {
    layout
        .pieces
        .iter()
        .filter(|p| p.store_offset < layout.data_len)
        .map(|p| {
            let what = if let Some(part) = layout.header_offsets.iter().position(|&o| o == p.store_offset) {
                format!("the header of part {} in the store does not match its check value", part + 1)
            } else if let Some(d) = layout.dense.iter().find(|d| d.offset == p.store_offset) {
                format!("{}: its bytes in the store do not match their check value", d.name)
            } else {
                let r = layout.experts.iter().rev().find(|r| r.offset <= p.store_offset).unwrap();
                let (e, within) = ((p.store_offset - r.offset) / r.stride, (p.store_offset - r.offset) % r.stride);
                let which = if within == r.gate { "gate" } else if within == r.up { "up" } else { "down" };
                format!("layer {} expert {e}: its {which} rows in the store do not match", r.layer)
            };
            (*p, what)
        })
        .collect()
}

fn copy_store(reference: &std::path::Path, tag: &str) -> PathBuf {
    let store = temp_store(tag);
    std::fs::create_dir_all(&store).unwrap();
    for f in ["checks.json", "data.bin", "manifest.json"] {
        std::fs::copy(reference.join(f), store.join(f)).unwrap();
    }
    store
}

/// Zeroes `len` bytes of `file` at `at` (in place).
fn zero_range(file: &std::path::Path, at: u64, len: u64) {
    use std::os::unix::fs::FileExt;
    std::fs::OpenOptions::new().write(true).open(file).unwrap().write_all_at(&vec![0u8; len as usize], at).unwrap();
}

/// A random range inside a random kept run whose bytes are not all zeros already: (run, offset, length).
fn random_damage(runs: &[(lingtab::store::Piece, String)], data: &[u8], seed: &mut u64) -> (usize, u64, u64) {
    loop {
        let i = (xorshift(seed) % runs.len() as u64) as usize;
        let p = runs[i].0;
        let len = 1 + xorshift(seed) % p.len.min(4096);
        let at = p.store_offset + xorshift(seed) % (p.len - len + 1);
        if data[at as usize..(at + len) as usize].iter().any(|&b| b != 0) {
            return (i, at, len);
        }
    }
}

/// Faults injected into a complete store while nothing runs — the data file cut short, a range of it zeroed,
/// a file deleted, the manifest or the check file garbled, a manifest of another format version. Each time:
/// `lingtab greedy --store` refuses with an error naming what is wrong (no tokens), and a new ingest into the
/// store mends it (fetching only the damaged runs when the store can still be checked, all of it when not)
/// into a store byte-identical to the intact one — or, for another format version, refuses and leaves it be.
#[test]
fn damage_to_a_stopped_complete_store_is_named_by_the_load_and_mended_by_ingesting_again() {
    let unit = 2u64 << 20;
    let (base, st) = test_server(Mode::Good, unit, 0);
    let options = IngestOptions { unit_bytes: unit, in_flight: 2 };
    let reference = temp_store("damage-ref");
    ingest_from(&base, &reference, &options).unwrap();
    let (ok, stdout, stderr) = greedy_from_store(&reference, None);
    assert!(ok, "{stderr}");
    let intact_tokens = stdout.trim().to_string();
    let intact = std::fs::read(reference.join("data.bin")).unwrap();
    let layout = fixture_layout();
    let runs = kept_runs(&layout);
    let total: u64 = NAMES.iter().map(|n| std::fs::metadata(fixture_dir().join(n)).unwrap().len()).sum();
    let data_len = layout.data_len;
    let mut seed = 0x51ab_c0de_u64 ^ std::process::id() as u64;
    eprintln!("seed {seed}");
    let mut tally: Vec<(String, usize)> = Vec::new();
    let mut count = |what: &str| match tally.iter_mut().find(|(w, _)| w == what) {
        Some((_, n)) => *n += 1,
        None => tally.push((what.to_string(), 1)),
    };

    // (what, how many times) → each time: the damage, what the load must say, the bytes a repair may fetch
    for round in 0..16 {
        let store = copy_store(&reference, "damage");
        let data_path = store.join("data.bin");
        let (kind, want, refetch_at_most): (&str, String, u64) = match round {
            0..=2 => {
                let cut = 1 + xorshift(&mut seed) % (data_len - 1);
                std::fs::OpenOptions::new().write(true).open(&data_path).unwrap().set_len(cut).unwrap();
                // the runs from the cut on are refetched
                let after: u64 = runs.iter().filter(|(p, _)| p.store_offset + p.len > cut).map(|(p, _)| p.len).sum();
                ("data.bin cut short", format!("data.bin is {cut} bytes, the manifest says {data_len}"), after)
            }
            3..=8 => {
                let (i, at, len) = random_damage(&runs, &intact, &mut seed);
                zero_range(&data_path, at, len);
                ("a range of data.bin zeroed", runs[i].1.clone(), runs[i].0.len)
            }
            9 => {
                std::fs::remove_file(&data_path).unwrap();
                ("data.bin deleted", "data.bin is missing".to_string(), total)
            }
            10 => {
                std::fs::remove_file(store.join("checks.json")).unwrap();
                ("checks.json deleted", "checks.json is missing".to_string(), total)
            }
            11 => {
                let m = std::fs::read(store.join("checks.json")).unwrap();
                let at = xorshift(&mut seed) % (m.len() as u64 - 64);
                zero_range(&store.join("checks.json"), at, 64);
                ("a range of checks.json zeroed", "checks.json is unreadable".to_string(), total)
            }
            12 => {
                std::fs::remove_file(store.join("manifest.json")).unwrap();
                ("manifest.json deleted", "no store here (no manifest.json)".to_string(), total)
            }
            13 => {
                std::fs::write(store.join("manifest.json"), b"{\"format_version\": 1, \"state\": \"compl").unwrap();
                ("manifest.json cut short", "manifest.json is unreadable".to_string(), total)
            }
            14 => {
                let m = std::fs::read(store.join("manifest.json")).unwrap();
                let at = xorshift(&mut seed) % (m.len() as u64 - 32);
                zero_range(&store.join("manifest.json"), at, 32);
                ("a range of manifest.json zeroed", "manifest.json is unreadable".to_string(), total)
            }
            _ => {
                let mut m: serde_json::Value = serde_json::from_slice(&std::fs::read(store.join("manifest.json")).unwrap()).unwrap();
                m["format_version"] = 2.into();
                std::fs::write(store.join("manifest.json"), serde_json::to_vec(&m).unwrap()).unwrap();
                ("manifest.json of format version 2", "the store is of format version 2, this build of lingtab reads version 1".to_string(), 0)
            }
        };
        let (ok, stdout, stderr) = greedy_from_store(&store, None);
        eprintln!("{kind}: {}", stderr.trim());
        assert!(!ok && stdout.trim().is_empty(), "{kind}: tokens from a damaged store: {stdout}");
        assert!(stderr.contains(&want), "{kind}: the error {stderr:?} does not say {want:?}");
        st.unit_bytes_sent.store(0, Ordering::SeqCst);
        let result = ingest_from(&base, &store, &options);
        let fetched = st.unit_bytes_sent.load(Ordering::SeqCst);
        if kind.contains("format version") {
            let err = result.unwrap_err();
            assert!(err.contains(&want), "{kind}: {err}");
            assert!(std::fs::read(&data_path).unwrap() == intact, "{kind}: a refused ingest changed data.bin");
            assert!(fetched <= 2 << 20, "{kind}: {fetched} bytes fetched beyond the headers' first reads");
        } else {
            assert_eq!(result.unwrap().state, StoreState::Complete, "{kind}");
            assert!(std::fs::read(&data_path).unwrap() == intact, "{kind}: the mended data.bin differs from the intact one");
            assert_eq!(files_in(&store), ["checks.json", "data.bin", "manifest.json"], "{kind}");
            assert_eq!(store_checks(&store), checks_from_the_ggufs(), "{kind}");
            // besides the headers' first reads (1 MiB of each part, to plan the layout): the damaged runs only
            // (all of them when the store cannot be checked), at most what the damage touched
            let header_reads = 2u64 << 20;
            let fetched = fetched - header_reads;
            if kind.contains("cut short") && kind.starts_with("data.bin") {
                assert!(fetched > 0 && fetched <= refetch_at_most, "{kind}: fetched {fetched} bytes to mend it, at most {refetch_at_most} due");
            } else {
                assert_eq!(fetched, refetch_at_most, "{kind}: bytes fetched to mend it");
            }
            eprintln!("  mended by ingesting again: {fetched} bytes fetched");
        }
        if round % 5 == 0 && !kind.contains("format version") {
            let (ok, stdout, stderr) = greedy_from_store(&store, None);
            assert!(ok, "{kind}: {stderr}");
            assert_eq!(stdout.trim(), intact_tokens, "{kind}: the mended store gives other tokens");
        }
        count(kind);
        std::fs::remove_dir_all(&store).unwrap();
    }
    eprintln!("faults: {tally:?}");
    std::fs::remove_dir_all(&reference).unwrap();
}

/// Hash state saved by the ingest in `store`: the first unit not hashed yet.
fn frontier_unit(store: &std::path::Path) -> Option<u64> {
    let saved: serde_json::Value = serde_json::from_slice(&std::fs::read(store.join("hash.json")).ok()?).ok()?;
    saved["next_unit"].as_u64()
}

/// (part, file offset) of unit `u` of the fixture cut into units of `unit` bytes.
fn unit_position(u: u64, unit: u64) -> (usize, u64) {
    let mut u = u;
    for (part, n) in NAMES.iter().enumerate() {
        let units = std::fs::metadata(fixture_dir().join(n)).unwrap().len().div_ceil(unit);
        if u < units {
            return (part, u * unit);
        }
        u -= units;
    }
    (NAMES.len(), 0)
}

/// Faults injected into a stopped, unfinished ingest: bytes of the data file already hashed zeroed (wholly
/// before the frontier, or in the run that straddles it), or not yet hashed; the checks log zeroed or cut
/// short; the journal zeroed; the hash state deleted; the tail cut short; the manifest garbled. Resuming gives
/// a store byte-identical to an uninterrupted one with the GGUF's check values, or first a clear sha256 error
/// that resets the part (then the next resume completes) — never a complete store with other bytes.
#[test]
fn damage_to_a_stopped_ingest_never_ends_in_a_complete_store_with_other_bytes() {
    let unit = 2u64 << 20;
    let (base, st) = test_server(Mode::Good, unit, 0);
    let options = IngestOptions { unit_bytes: unit, in_flight: 2 };
    let reference = temp_store("stopped-ref");
    ingest_from(&base, &reference, &options).unwrap();
    let intact = std::fs::read(reference.join("data.bin")).unwrap();
    let layout = fixture_layout();
    let runs = kept_runs(&layout);
    let total: u64 = NAMES.iter().map(|n| std::fs::metadata(fixture_dir().join(n)).unwrap().len()).sum();
    let mut seed = 0x0dd_ba11_u64 ^ std::process::id() as u64;
    eprintln!("seed {seed}");
    let kinds = [
        "hashed bytes of data.bin zeroed",
        "hashed bytes of the run at the frontier zeroed",
        "unhashed bytes of data.bin zeroed",
        "checks.log zeroed",
        "checks.log cut short",
        "a range of journal.bin zeroed",
        "hash.json deleted",
        "tail.bin cut short",
        "manifest.json garbled",
    ];
    let mut tally = vec![0usize; kinds.len()];
    let (mut two_runs, mut journaled_unhashed) = (0, 0);
    for round in 0..kinds.len() * 2 {
        let kind = kinds[round % kinds.len()];
        let began = std::time::Instant::now();
        let store = temp_store("stopped");
        // an ingest stopped after 30–80 % of the bytes (a read that fails, as an abort does)
        let stop_after = total * (30 + xorshift(&mut seed) % 50) / 100;
        let fetched = Rc::new(std::cell::Cell::new(0u64));
        let sources: Vec<lingtab::source::Tracked<HttpSource>> = NAMES
            .iter()
            .map(|n| {
                let fetched = fetched.clone();
                let mut inner = HttpSource::new(&format!("{base}/{n}"));
                inner.retries = 0;
                let on_read: Rc<dyn Fn(u64) -> Result<(), String>> = Rc::new(move |n| {
                    if n > 1 && n <= unit {
                        fetched.set(fetched.get() + n);
                    }
                    if fetched.get() >= stop_after { Err("stopped".into()) } else { Ok(()) }
                });
                lingtab::source::Tracked { inner, on_read }
            })
            .collect();
        let dir = FsDir::new(&store).unwrap();
        let err = pollster::block_on(async {
            let mut hints = Vec::new();
            for s in &sources {
                let id = s.inner.probe().await?;
                hints.push(PartHint { etag: id.etag, size: Some(id.size), sha256: id.sha256 });
            }
            ingest(&dir, &sources, &hints, &options, &mut |_| {}).await
        })
        .unwrap_err();
        assert!(err.contains("stopped"), "{err}");
        let frontier = unit_position(frontier_unit(&store).expect("a hash state"), unit);
        let hashed = |p: &lingtab::store::Piece| (p.part, p.file_offset + p.len) <= frontier;
        let pick = |seed: &mut u64, ok: &dyn Fn(&lingtab::store::Piece) -> bool| -> Option<lingtab::store::Piece> {
            let candidates: Vec<_> = runs.iter().map(|r| r.0).filter(|p| ok(p) && intact[p.store_offset as usize..(p.store_offset + p.len) as usize].iter().any(|&b| b != 0)).collect();
            (!candidates.is_empty()).then(|| candidates[(xorshift(seed) % candidates.len() as u64) as usize])
        };
        let data = store.join("data.bin");
        match kind {
            "hashed bytes of data.bin zeroed" => {
                let p = pick(&mut seed, &|p| hashed(p)).expect("runs before the frontier");
                zero_range(&data, p.store_offset, p.len.min(512));
            }
            "hashed bytes of the run at the frontier zeroed" => {
                // the run that straddles the frontier (else the last hashed one): its hashed prefix zeroed
                let straddling = runs.iter().map(|r| r.0).find(|p| p.part == frontier.0 && p.file_offset < frontier.1 && p.file_offset + p.len > frontier.1);
                match straddling {
                    Some(p) => zero_range(&data, p.store_offset, frontier.1 - p.file_offset),
                    None => {
                        let p = pick(&mut seed, &|p| hashed(p)).unwrap();
                        zero_range(&data, p.store_offset, p.len.min(512));
                    }
                }
            }
            "unhashed bytes of data.bin zeroed" => {
                // in a unit journaled past the frontier when there is one (its sha256 is still to come), else
                // in one not fetched yet (the fetch overwrites it)
                let journal = std::fs::read(store.join("journal.bin")).unwrap();
                let done: Vec<(usize, u64)> = journal.chunks_exact(4).map(|c| unit_position(u32::from_le_bytes(c.try_into().unwrap()) as u64, unit)).filter(|&u| u >= frontier).collect();
                let in_done = |p: &lingtab::store::Piece| done.iter().any(|&(part, at)| p.part == part && p.file_offset >= at && p.file_offset + p.len <= at + unit);
                match pick(&mut seed, &|p| !hashed(p) && in_done(p)) {
                    Some(p) => {
                        journaled_unhashed += 1;
                        zero_range(&data, p.store_offset, p.len.min(512))
                    }
                    None => {
                        let p = pick(&mut seed, &|p| !hashed(p)).unwrap();
                        zero_range(&data, p.store_offset, p.len.min(512))
                    }
                }
            }
            "checks.log zeroed" => {
                let n = std::fs::metadata(store.join("checks.log")).unwrap().len();
                zero_range(&store.join("checks.log"), 0, n);
            }
            "checks.log cut short" => {
                let n = std::fs::metadata(store.join("checks.log")).unwrap().len();
                std::fs::OpenOptions::new().write(true).open(store.join("checks.log")).unwrap().set_len(xorshift(&mut seed) % n.max(1)).unwrap();
            }
            "a range of journal.bin zeroed" => {
                let n = std::fs::metadata(store.join("journal.bin")).unwrap().len();
                let at = xorshift(&mut seed) % n.max(1);
                zero_range(&store.join("journal.bin"), at, (n - at).min(1 + xorshift(&mut seed) % 64));
            }
            "hash.json deleted" => std::fs::remove_file(store.join("hash.json")).unwrap(),
            "tail.bin cut short" => {
                let n = std::fs::metadata(store.join("tail.bin")).unwrap().len();
                std::fs::OpenOptions::new().write(true).open(store.join("tail.bin")).unwrap().set_len(xorshift(&mut seed) % n).unwrap();
            }
            _ => std::fs::write(store.join("manifest.json"), b"\0\0\0\0 not a manifest").unwrap(),
        }
        // resume; a part whose bytes fail their sha256 is reset by the first resume and fetched by the next
        let result = match ingest_from(&base, &store, &options) {
            Err(e) if e.contains("sha256") && e.contains("the store was reset for this part") => {
                eprintln!("{kind}: {e}");
                two_runs += 1;
                assert_not_complete(&store);
                ingest_from(&base, &store, &options)
            }
            other => other,
        };
        assert_eq!(result.unwrap_or_else(|e| panic!("{kind}: {e}")).state, StoreState::Complete);
        assert!(std::fs::read(&data).unwrap() == intact, "{kind} (round {round}): the resumed store's data.bin differs from an uninterrupted ingest's");
        assert_eq!(store_checks(&store), checks_from_the_ggufs(), "{kind}");
        assert_eq!(files_in(&store), ["checks.json", "data.bin", "manifest.json"], "{kind}");
        tally[round % kinds.len()] += 1;
        eprintln!("{kind}: resumed in {:?}", began.elapsed());
        std::fs::remove_dir_all(&store).unwrap();
    }
    eprintln!(
        "faults: {:?}; {journaled_unhashed} zeroed ranges in journaled units past the frontier; {two_runs} needed a second resume (a part reset by its sha256)",
        kinds.iter().zip(&tally).collect::<Vec<_>>()
    );
    let _ = st;
    std::fs::remove_dir_all(&reference).unwrap();
}

/// Two processes on one store: a second `lingtab ingest` while one runs is refused, and so is an engine
/// (`lingtab greedy --store`); while an engine holds the store, an ingest is refused (engines share it);
/// when the holders end, the store is whole and usable. (A killed holder's lock goes with it: the kill test
/// resumes after every kill.)
#[test]
fn one_ingest_of_a_store_at_a_time_and_none_while_an_engine_reads_it() {
    use lingtab::store::Hold;
    let unit = 1u64 << 20;
    let (base, _st) = test_server(Mode::Good, unit, 40);
    let store = temp_store("locks");
    let ingest_cmd = |store: &std::path::Path| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_lingtab"));
        cmd.args(["ingest", "--quiet", "--url", &format!("{base}/{}", NAMES[0]), "--store", store.to_str().unwrap(), "--unit-bytes", &unit.to_string(), "--in-flight", "1"]);
        cmd
    };
    let mut first = ingest_cmd(&store).spawn().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while journaled(&store) == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(first.try_wait().unwrap().is_none(), "the first ingest ended before the test could overlap it");
    let second = ingest_cmd(&store).output().unwrap();
    let err = String::from_utf8_lossy(&second.stderr);
    eprintln!("second ingest: {}", err.trim());
    assert!(!second.status.success() && err.contains("another lingtab process is ingesting into this store"), "{err}");
    let (ok, stdout, stderr) = greedy_from_store(&store, None);
    eprintln!("engine during the ingest: {}", stderr.trim());
    assert!(!ok && stdout.trim().is_empty() && stderr.contains("another lingtab process is ingesting into this store"), "{stderr}");
    assert!(first.wait().unwrap().success(), "the first ingest, undisturbed, completes");
    assert_eq!(store_checks(&store), checks_from_the_ggufs());

    // an engine's shared hold (taken here as `greedy --store` takes it): engines share, an ingest waits its turn
    let engine_hold = FsDir::new(&store).unwrap().hold(Hold::Shared).unwrap();
    let (ok, _, stderr) = greedy_from_store(&store, None);
    assert!(ok, "a second engine on the same store: {stderr}");
    let during = ingest_cmd(&store).output().unwrap();
    let err = String::from_utf8_lossy(&during.stderr);
    eprintln!("ingest under an engine: {}", err.trim());
    assert!(!during.status.success() && err.contains("a lingtab engine (another process) is running from this store"), "{err}");
    drop(engine_hold);
    assert!(ingest_cmd(&store).output().unwrap().status.success());
    std::fs::remove_dir_all(&store).unwrap();
}

/// Store bytes changed under a running streaming engine: an expert record overwritten in place, then data.bin
/// cut short. The step that reads them fails with a clear error (a step served from records already in the
/// pool gives the intact logits: those bytes were checked when they were read); no step gives other logits.
/// With the bytes put back the same engine gives the intact store's logits again.
#[test]
fn a_store_file_overwritten_or_cut_under_a_running_engine_is_a_clear_error_never_other_logits() {
    use std::io::{Seek, SeekFrom, Write};
    let base = serve_fixtures();
    let store = temp_store("under-engine");
    ingest_from(&base, &store, &IngestOptions { unit_bytes: 64 << 10, in_flight: 4 }).unwrap();
    let intact = std::fs::read(store.join("data.bin")).unwrap();
    let files: Vec<Vec<u8>> = NAMES.iter().map(|n| std::fs::read(fixture_dir().join(n)).unwrap()).collect();
    let layout = lingtab::store::StoreLayout::from_model(&SplitModel::new(files.iter().map(|b| (parse_header(b, Some(b.len() as u64)).unwrap(), b.len() as u64)).collect()).unwrap()).unwrap();
    let records = &layout.experts[1];
    let tokens = [2949u32, 3536, 786, 17, 1201, 99, 2500, 64, 3000, 5, 1800, 222];
    let mut resident = store_engine(&store);
    let want: Vec<Vec<f32>> = tokens.iter().map(|&t| pollster::block_on(resident.step(t)).unwrap()).collect();
    drop(resident);
    let dir = FsDir::new(&store).unwrap();
    let (model, parts) = pollster::block_on(open_complete(&dir)).unwrap();
    let options = EngineOptions { pool_bytes: Some(records.stride * 10), ..Default::default() };
    let checks = pollster::block_on(read_checks(&dir)).unwrap();
    assert!(checks.is_some());
    let mut engine = pollster::block_on(async { Engine::open_checked(Gpu::new().await.unwrap(), &model, parts, checks, &options).await.unwrap() });
    assert!(engine.is_streaming());
    // steps until one fails; every one before it must give the intact logits
    let run = |engine: &mut Engine| -> Result<(), String> {
        engine.reset();
        for (i, &t) in tokens.iter().enumerate() {
            let got = pollster::block_on(engine.step(t))?;
            assert!(got == want[i], "step {i} gave other logits than the intact store");
        }
        Ok(())
    };
    run(&mut engine).expect("the intact store");
    let data = || std::fs::OpenOptions::new().write(true).open(store.join("data.bin")).unwrap();

    // a byte of every expert's gate rows in layer L changed in place, as another program writing the file would
    let mut f = data();
    for e in 0..32u64 {
        f.seek(SeekFrom::Start(records.offset + e * records.stride + records.gate + 100)).unwrap();
        f.write_all(&[intact[(records.offset + e * records.stride + records.gate + 100) as usize] ^ 0x10]).unwrap();
    }
    f.sync_all().unwrap();
    let err = run(&mut engine).expect_err("changed expert records must fail the step that reads one");
    eprintln!("overwritten: {err}");
    assert!(err.contains(&format!("layer {} expert ", records.layer)) && err.contains("its gate rows") && err.contains("changed on disk"), "{err}");
    assert_eq!(engine.position(), 0, "a failed step forgets the half-updated sequence");
    std::fs::write(store.join("data.bin"), &intact).unwrap();
    run(&mut engine).expect("the bytes put back");

    // data.bin cut inside layer L's experts
    data().set_len(records.offset + records.stride / 2).unwrap();
    let err = run(&mut engine).expect_err("a cut data.bin must fail the step that reads past its end");
    eprintln!("cut: {err}");
    assert!(err.contains("reading experts of layer") && err.contains("data.bin"), "{err}");
    assert_eq!(engine.position(), 0);
    std::fs::write(store.join("data.bin"), &intact).unwrap();
    run(&mut engine).expect("the bytes put back");
    drop(engine);
    std::fs::remove_dir_all(&store).unwrap();
}
