//! Per-request cost of the routing core (extraction + hashing + selection) on an
//! OpenAI chat body of a given size, for instruction counting:
//!
//! ```sh
//! cargo build --release --example extract_cost
//! valgrind --tool=callgrind target/release/examples/extract_cost 16 0    # baseline (setup only)
//! valgrind --tool=callgrind target/release/examples/extract_cost 16 100  # + 100 requests
//! ```
//! (difference / 100 = instructions per request; callgrind counts are
//! repeatable whatever else the machine is doing).
use prefix_router::{Body, Config, Loads, Router};
/// A chat body of about `kb` KiB: a system prompt and a user message.
fn body(kb: usize) -> String {
    let sys = "You are a helpful assistant.\nFollow the rules: be concise, cite sources. "
        .repeat(kb * 1024 / 2 / 70 + 1);
    let user = "Please summarise the following document:\n\"lorem ipsum\" dolor sit amet. "
        .repeat(kb * 1024 / 2 / 75 + 1);
    serde_json::json!({"model":"llama-3.1-70b","messages":[{"role":"system","content":sys},{"role":"user","content":user}],"max_tokens":64,"stream":true}).to_string()
}
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let kb: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(16);
    let n: usize = std::env::args()
        .nth(2)
        .and_then(|a| a.parse().ok())
        .unwrap_or(100);
    let r = Router::new(Config::from_json(br#"{"endpoints":["10.0.0.1:80","10.0.0.2:80","10.0.0.3:80","10.0.0.4:80","10.0.0.5:80","10.0.0.6:80","10.0.0.7:80"]}"#)?);
    let b = body(kb);
    let mut acc = 0u64;
    for _ in 0..n {
        let k = r.key(Body::Complete(b.as_bytes()), None);
        let d = r.select(&k, Loads::new(&[1, 2, 3, 4, 5, 6, 7]), 3);
        acc = acc.wrapping_add(k.key.unwrap_or(0) ^ d.primary as u64);
    }
    println!("{kb} KiB ({} bytes) x{n}: {acc:x}", b.len());
    Ok(())
}
