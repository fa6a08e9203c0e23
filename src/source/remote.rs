//! What both HTTP sources (native and browser) check on every answer: the `Content-Range`, and the file's
//! identity — its size and validator (`X-Linked-Etag`, else `ETag`, else `Last-Modified`) — against the first
//! answer's, so a file that changed between requests is refused rather than mixed in.

/// What the server said about the file on the first answer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RemoteIdentity {
    pub size: u64,
    pub etag: Option<String>,
    /// A sha256 found in `X-Linked-Etag`/`ETag` (as Hugging Face sends for LFS files).
    pub sha256: Option<String>,
}

/// `"abc"`, `W/"abc"` → `abc`.
pub fn strip_etag(v: &str) -> String {
    v.trim().trim_start_matches("W/").trim_matches('"').to_string()
}

pub fn as_sha256(etag: &str) -> Option<String> {
    (etag.len() == 64 && etag.bytes().all(|b| b.is_ascii_hexdigit())).then(|| etag.to_ascii_lowercase())
}

/// A stall timeout as people read it: "30 s", "250 ms".
pub fn describe_timeout_ms(ms: u64) -> String {
    if ms.is_multiple_of(1000) {
        format!("{} s", ms / 1000)
    } else {
        format!("{ms} ms")
    }
}

/// `bytes START-END/TOTAL` → (start, end inclusive, total).
pub fn parse_content_range(v: &str) -> Option<(u64, u64, u64)> {
    let rest = v.trim().strip_prefix("bytes ")?;
    let (range, total) = rest.split_once('/')?;
    let (a, b) = range.split_once('-')?;
    Some((a.trim().parse().ok()?, b.trim().parse().ok()?, total.trim().parse().ok()?))
}

/// The validator of an answer: X-Linked-Etag (Hugging Face's LFS sha256), else ETag, else Last-Modified.
pub fn validator(x_linked_etag: Option<String>, etag: Option<String>, last_modified: Option<String>) -> Option<String> {
    x_linked_etag.or(etag).map(|v| strip_etag(&v)).or_else(|| last_modified.map(|v| format!("last-modified: {v}")))
}

/// Records the first answer's identity, or checks a later answer's against it.
pub fn check_identity(known: &mut Option<RemoteIdentity>, url: &str, total: u64, validator: Option<String>) -> Result<(), String> {
    match known {
        None => {
            *known = Some(RemoteIdentity { size: total, sha256: validator.as_deref().and_then(as_sha256), etag: validator });
            Ok(())
        }
        Some(k) if k.size != total => Err(format!("{url}: the file changed: it was {} bytes, the server now says {total}", k.size)),
        Some(k) if k.etag.is_some() && validator != k.etag => Err(format!(
            "{url}: the file changed: ETag was {:?}, now {:?}",
            k.etag.as_deref().unwrap_or(""),
            validator.as_deref().unwrap_or("none")
        )),
        Some(_) => Ok(()),
    }
}

/// Checks a 206 answer's Content-Range against the bytes asked for; returns the inclusive end actually due.
pub fn check_range(url: &str, start: u64, end: u64, content_range: &str, total: u64) -> Result<u64, String> {
    let (a, b, _) = parse_content_range(content_range).ok_or_else(|| format!("{url}: unreadable Content-Range {content_range:?}"))?;
    let want_end = end.min(total.saturating_sub(1));
    if a != start || b != want_end {
        return Err(format!("{url}: asked for bytes {start}-{want_end}, the server sent Content-Range {content_range:?}"));
    }
    Ok(want_end)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn content_range() {
        assert_eq!(parse_content_range("bytes 0-9/100"), Some((0, 9, 100)));
        assert_eq!(parse_content_range("bytes */100"), None);
        assert!(as_sha256(&strip_etag("\"24ff06f1ab74546a91f7c07bd725b3015896bbe9dd82ab0e5838be9ed06a6dcf\"")).is_some());
        assert_eq!(check_range("u", 10, 19, "bytes 10-19/15", 15), Err("u: asked for bytes 10-14, the server sent Content-Range \"bytes 10-19/15\"".into()));
        assert_eq!(check_range("u", 10, 19, "bytes 10-14/15", 15), Ok(14));
    }

    #[test]
    fn identity_is_pinned_by_the_first_answer() {
        let mut known = None;
        check_identity(&mut known, "u", 100, Some("a".into())).unwrap();
        assert!(check_identity(&mut known, "u", 100, Some("a".into())).is_ok());
        assert!(check_identity(&mut known, "u", 100, Some("b".into())).unwrap_err().contains("ETag was \"a\", now \"b\""));
        assert!(check_identity(&mut known, "u", 101, Some("a".into())).unwrap_err().contains("it was 100 bytes"));
    }
}
