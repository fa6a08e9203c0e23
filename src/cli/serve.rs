//! `lingtab serve`: a static file server with HTTP Range support (tower-http's ServeDir), for the page, the
//! wasm package and models laid out like Hugging Face's `resolve` URLs.

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
    let mut app = Router::new();
    // longest prefixes first, so /pkg is not swallowed by /
    let mut mounts = mounts.to_vec();
    mounts.sort_by_key(|(p, _)| std::cmp::Reverse(p.len()));
    for (prefix, dir) in mounts {
        let service = ServeDir::new(dir).append_index_html_on_directories(true);
        app = if prefix.is_empty() { app.fallback_service(service) } else { app.nest_service(&prefix, service) };
    }
    // Like huggingface.co: any origin may read, and scripts may see the range and validator headers.
    use axum::http::{header, HeaderValue};
    app.layer(SetResponseHeaderLayer::overriding(header::ACCESS_CONTROL_ALLOW_ORIGIN, HeaderValue::from_static("*")))
        .layer(SetResponseHeaderLayer::overriding(
            header::ACCESS_CONTROL_EXPOSE_HEADERS,
            HeaderValue::from_static("Content-Range, Content-Length, Accept-Ranges, ETag, Last-Modified"),
        ))
        .layer(SetResponseHeaderLayer::overriding(header::CACHE_CONTROL, HeaderValue::from_static("no-cache")))
}

pub fn run(host: &str, port: u16, mounts: Vec<(String, PathBuf)>) -> Result<(), String> {
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
        axum::serve(listener, router(&mounts)).await.map_err(|e| e.to_string())
    })
}
