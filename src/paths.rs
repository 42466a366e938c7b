//! Which request paths may enter the `affinity` index (config `paths`).
//!
//! The index is a fixed table shared by every client; a request recorded in
//! it evicts someone else's prefix. Only requests on the inference API paths
//! (default: the OpenAI ones vLLM and SGLang serve) are recorded, and only
//! after the upstream answered 2xx (see `src/filter/http.rs`), so junk POSTs
//! to other paths or bodies an engine refused never displace real prefixes.
//! Every request is still routed (looked up) whatever its path.
//!
//! Matching is **exact** on the path without its query string
//! (`/v1/chat/completions?x=1` matches `/v1/chat/completions`;
//! `/v1/chat/completions/extra` and `/v1/chat/completionsX` do not): the
//! engines serve exactly these paths, and a prefix match would let any
//! suffix in. Cost: one comparison per configured path (3 by default).

/// Default `paths`: OpenAI chat completions, completions and responses.
pub const DEFAULT_PATHS: [&str; 3] = ["/v1/chat/completions", "/v1/completions", "/v1/responses"];

/// Most entries in `paths`.
pub const MAX_PATHS: usize = 64;

/// Is `path` (the `:path` header, query string included) one of `paths`?
pub fn is_api_path(paths: &[String], path: &[u8]) -> bool {
    let end = path.iter().position(|&b| b == b'?').unwrap_or(path.len());
    let bare = &path[..end];
    paths.iter().any(|p| p.as_bytes() == bare)
}

/// Why a configured path is unusable, if it is.
pub fn check_path(p: &str) -> Result<(), String> {
    let ok = p.starts_with('/')
        && p.len() <= 256
        && p.bytes()
            .all(|b| b.is_ascii_graphic() && b != b'?' && b != b'#');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "must be an absolute request path (1-256 visible ASCII characters starting with '/', no query), got {p:?}"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn exact_match_without_query() {
        let paths: Vec<String> = DEFAULT_PATHS.iter().map(|s| s.to_string()).collect();
        for ok in [
            "/v1/chat/completions",
            "/v1/completions?stream=true",
            "/v1/responses",
        ] {
            assert!(is_api_path(&paths, ok.as_bytes()), "{ok}");
        }
        for no in [
            "/",
            "/upload",
            "/v1/chat/completionsX",
            "/v1/chat/completions/",
            "/v1/chat",
            "/V1/completions",
            "",
        ] {
            assert!(!is_api_path(&paths, no.as_bytes()), "{no}");
        }
        assert!(check_path("/v1/x").is_ok());
        for bad in ["v1/x", "/a b", "/a?b", ""] {
            assert!(check_path(bad).is_err(), "{bad}");
        }
    }
}
