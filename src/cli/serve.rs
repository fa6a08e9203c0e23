//! `lingtab serve`: a static file server with HTTP Range support (tower-http's ServeDir), for the page, the
//! wasm package and models laid out like Hugging Face's `resolve` URLs. With `--faults`, the same files are
//! also served by routes that stall on purpose ([`fault_routes`]), for the browser tests of stalled downloads.

use axum::Router;
use std::path::PathBuf;
use tower_http::services::ServeDir;
use tower_http::set_header::SetResponseHeaderLayer;

/// One `URL_PREFIX=DIR` mount.
pub fn parse_mount(s: &str) -> Result<(String, PathBuf), String> {
    let (prefix, dir) = s.split_once('=').ok_or_else(|| format!("--mount {s:?}: expected URL_PREFIX=DIR"))?;
    if !prefix.starts_with('/') {
        return Err(format!("--mount {s:?}: the URL prefix must start with /"));
    }
    Ok((prefix.trim_end_matches('/').to_string(), PathBuf::from(dir)))
}

pub fn router(mounts: &[(String, PathBuf)]) -> Router {
    with_headers(static_routes(mounts))
}

fn static_routes(mounts: &[(String, PathBuf)]) -> Router {
    let mut app = Router::new();
    // longest prefixes first, so /pkg is not swallowed by /
    let mut mounts = mounts.to_vec();
    mounts.sort_by_key(|(p, _)| std::cmp::Reverse(p.len()));
    for (prefix, dir) in mounts {
        let service = ServeDir::new(dir).append_index_html_on_directories(true);
        app = if prefix.is_empty() { app.fallback_service(service) } else { app.nest_service(&prefix, service) };
    }
    app
}

fn with_headers(app: Router) -> Router {
    // Like huggingface.co: any origin may read, and scripts may see the range and validator headers.
    use axum::http::{header, HeaderValue};
    app.layer(SetResponseHeaderLayer::overriding(header::ACCESS_CONTROL_ALLOW_ORIGIN, HeaderValue::from_static("*")))
        .layer(SetResponseHeaderLayer::overriding(
            header::ACCESS_CONTROL_EXPOSE_HEADERS,
            HeaderValue::from_static("Content-Range, Content-Length, Accept-Ranges, ETag, Last-Modified"),
        ))
        .layer(SetResponseHeaderLayer::overriding(header::CACHE_CONTROL, HeaderValue::from_static("no-cache")))
}

/// How a fault route misbehaves on a Range request.
#[derive(Clone, Copy, PartialEq)]
enum Fault {
    /// The headers and half the body, then silence with the connection open — every time.
    Stall,
    /// The same, the first time each range of each file is asked for; later asks are answered in full.
    StallOnce,
    /// No answer at all (the connection open, nothing sent), the first time each range is asked for.
    SilentOnce,
}

struct Faults {
    mounts: Vec<(String, PathBuf)>,
    /// (path and query, range) asked for so far
    seen: std::sync::Mutex<std::collections::HashSet<(String, u64, u64)>>,
    /// faulty answers per query string (a test tags its URLs with one to count its own)
    faulty: std::sync::Mutex<std::collections::HashMap<String, u64>>,
}

/// `/faults/{stall,stall-once,silent-once}/PATH[?TAG]`: the file a mount serves at `/PATH`, with Range requests
/// answered 206 (a validator from its size and time) except for the fault; "once" counts per path, tag and
/// range. Reads only the range asked for. `/faults/count?TAG`: how many faulty answers went to URLs with `TAG`.
pub fn fault_routes(mounts: &[(String, PathBuf)]) -> Router {
    use axum::extract::{Path as UrlPath, State};
    use axum::http::{HeaderMap, StatusCode};
    use axum::response::Response;
    let state = std::sync::Arc::new(Faults { mounts: mounts.to_vec(), seen: Default::default(), faulty: Default::default() });
    async fn count(State(st): State<std::sync::Arc<Faults>>, uri: axum::http::Uri) -> String {
        st.faulty.lock().unwrap().get(uri.query().unwrap_or("")).copied().unwrap_or(0).to_string()
    }
    async fn handle(State(st): State<std::sync::Arc<Faults>>, UrlPath((mode, path)): UrlPath<(String, String)>, uri: axum::http::Uri, headers: HeaderMap) -> Response {
        let plain = |status: StatusCode| Response::builder().status(status).body(axum::body::Body::empty()).unwrap();
        let fault = match mode.as_str() {
            "stall" => Fault::Stall,
            "stall-once" => Fault::StallOnce,
            "silent-once" => Fault::SilentOnce,
            _ => return plain(StatusCode::NOT_FOUND),
        };
        let url_path = format!("/{path}");
        let found = st.mounts.iter().filter(|(p, _)| url_path.starts_with(&format!("{p}/"))).max_by_key(|(p, _)| p.len());
        let Some((prefix, dir)) = found else { return plain(StatusCode::NOT_FOUND) };
        let rest = &url_path[prefix.len() + 1..];
        if rest.split('/').any(|c| c.is_empty() || c == "." || c == "..") {
            return plain(StatusCode::NOT_FOUND);
        }
        let Ok(file) = std::fs::File::open(dir.join(rest)) else { return plain(StatusCode::NOT_FOUND) };
        let Ok(meta) = file.metadata() else { return plain(StatusCode::NOT_FOUND) };
        let total = meta.len();
        let modified = meta.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).map(|d| d.as_nanos()).unwrap_or(0);
        let etag = format!("\"{total}-{modified}\"");
        let range = headers.get("range").and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("bytes=")).and_then(|v| {
            let (a, b) = v.split_once('-')?;
            Some((a.parse::<u64>().ok()?, b.parse::<u64>().ok()?))
        });
        let Some((a, b)) = range else { return plain(StatusCode::BAD_REQUEST) };
        if a >= total || b < a {
            return Response::builder().status(StatusCode::RANGE_NOT_SATISFIABLE).header("content-range", format!("bytes */{total}")).body(axum::body::Body::empty()).unwrap();
        }
        let b = b.min(total - 1);
        let mut body = vec![0u8; (b + 1 - a) as usize];
        if std::os::unix::fs::FileExt::read_exact_at(&file, &mut body, a).is_err() {
            return plain(StatusCode::INTERNAL_SERVER_ERROR);
        }
        let tag = uri.query().unwrap_or("").to_string();
        let first_time = st.seen.lock().unwrap().insert((format!("{url_path}?{tag}"), a, b));
        let faulty = fault == Fault::Stall || first_time;
        if faulty {
            *st.faulty.lock().unwrap().entry(tag).or_default() += 1;
        }
        if faulty && fault == Fault::SilentOnce {
            std::future::pending::<()>().await;
        }
        let answer = Response::builder()
            .status(StatusCode::PARTIAL_CONTENT)
            .header("content-range", format!("bytes {a}-{b}/{total}"))
            .header("content-length", body.len().to_string())
            .header("etag", etag);
        if faulty {
            use futures_util::StreamExt;
            let half = axum::body::Bytes::from(body[..body.len() / 2].to_vec());
            let stalled = futures_util::stream::iter([Ok::<_, std::io::Error>(half)]).chain(futures_util::stream::pending());
            return answer.body(axum::body::Body::from_stream(stalled)).unwrap();
        }
        answer.body(axum::body::Body::from(body)).unwrap()
    }
    Router::new().route("/faults/count", axum::routing::get(count)).route("/faults/{mode}/{*path}", axum::routing::get(handle)).with_state(state)
}

pub fn run(host: &str, port: u16, mounts: Vec<(String, PathBuf)>, faults: bool) -> Result<(), String> {
    for (prefix, dir) in &mounts {
        if !dir.is_dir() {
            return Err(format!("--mount {prefix}={}: not a directory", dir.display()));
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(|e| e.to_string())?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind((host, port)).await.map_err(|e| format!("cannot listen on {host}:{port}: {e}"))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        for (prefix, dir) in &mounts {
            println!("serving {} at http://{addr}{}/", dir.display(), prefix);
        }
        println!("lingtab is at http://{addr}/");
        let app = if faults {
            println!("fault routes (stalls, for tests) at http://{addr}/faults/{{stall,stall-once,silent-once}}/");
            // the fault routes first: a mount at / would take their paths
            with_headers(fault_routes(&mounts).merge(static_routes(&mounts)))
        } else {
            router(&mounts)
        };
        axum::serve(listener, app).await.map_err(|e| e.to_string())
    })
}
