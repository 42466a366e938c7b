//! Request bodies and the placement the routing core predicts for them.
//!
//! The expected replica of a body comes from the same pure core the filter runs
//! ([`prefix_router::Router`]) with the same plugin JSON at zero load: the tests then
//! check that the filter inside Envoy does what the core says, request by request.

use prefix_router::{Body, Config, Loads, Router};
use serde_json::json;

/// Model name sent in every body (the emulator serves any model unless `--strict-model`).
pub const MODEL: &str = "emulated-model";

/// Deterministic text of exactly `chars` characters, different for each `tag` from the
/// first characters on (like distinct system prompts of different tenants).
pub fn text(tag: &str, chars: usize) -> String {
    let mut s = String::with_capacity(chars + 64);
    let mut i = 0u32;
    while s.len() < chars {
        s.push_str(&format!(
            "[{tag}] You are assistant {tag}, rule {i}: answer briefly and cite sources. "
        ));
        i += 1;
    }
    s.truncate(chars);
    s
}

/// A chat completion body: `system` then `user`, `max_tokens` tokens, non-streaming.
pub fn chat(system: &str, user: &str) -> String {
    chat_with(system, user, 4, false)
}

/// A chat completion body with explicit length and streaming flag.
pub fn chat_with(system: &str, user: &str, max_tokens: u32, stream: bool) -> String {
    json!({
        "model": MODEL,
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": user}
        ],
        "max_tokens": max_tokens,
        "stream": stream
    })
    .to_string()
}

/// A completions body.
pub fn completion(prompt: &str) -> String {
    json!({"model": MODEL, "prompt": prompt, "max_tokens": 4}).to_string()
}

/// The routing core configured exactly like the filter.
pub fn router(filter_json: &str) -> Router {
    Router::new(Config::from_json(filter_json.as_bytes()).expect("valid filter config"))
}

/// `(primary, secondary)` the core picks for `body` at zero load, as `IP:port`.
pub fn placement(router: &Router, body: &[u8]) -> (String, Option<String>) {
    let eps = &router.config().endpoints;
    let key = router.key(Body::Complete(body), None);
    let zeros = vec![0u32; eps.len()];
    let d = router.select(&key, Loads::new(&zeros), 0);
    (eps[d.primary].clone(), d.secondary.map(|s| eps[s].clone()))
}

/// The ring owner of `body` at zero load.
pub fn owner(router: &Router, body: &[u8]) -> String {
    placement(router, body).0
}
