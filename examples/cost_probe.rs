//! Instruction and allocation counts of the routing core per request, for the
//! cost check of the test suite (`scripts/cost.sh`, run by `./build.sh test`).
//!
//! Each case runs one routing decision `ITERS` (= [`iters`]) times inside [`measured_region`]
//! (after one warm-up call outside it, so lazy initialisation is not counted).
//! Under `valgrind --tool=callgrind --collect-atstart=no
//! --toggle-collect='*measured_region*' --dump-after='*measured_region*'`
//! every case leaves one dump whose instruction total / `ITERS` is the cost of
//! one request; callgrind counts are the same on every run of the same binary,
//! whatever else the machine is doing. Allocations are counted by a wrapping
//! global allocator and printed with each case (exact, no valgrind needed).
//!
//! Cases (the filter's defaults unless stated):
//! - `affinity/<size>`: `Router::key` + `Router::select_affinity` over an
//!   in-memory [`VecStore`] that already knows the body (steady state of a
//!   repeated prefix: one lookup hit, one slot rewrite), 7 replicas;
//! - `prefix/<size>`: `Router::key` + `Router::select` (strategy `prefix`);
//! - `fleet/<n>/{warm,cold}`: the routing decision for `n` replicas (ring
//!   build excluded): `Router::key` of a 1 KiB chat body + index lookup,
//!   choice and record, warm (known prefix) and cold (an index that never
//!   remembers: ring placement every time);
//! - `decide/<n>/{warm,cold}`: the same without the key (precomputed), to show
//!   what grows with `n`;
//! - `key*/<size>`, `keytiny/*`, `keychat64/*`: the routing key and its
//!   parts (see [`key_parts`] and [`key_chat64`]);
//! - `usage/json1k`, `usage/json16k`, `usage/sse200`: the response scanner
//!   (`read_usage`) over a non-streamed chat completion with a 1 or 16 KiB
//!   answer, and over a 200-event stream (one chunk per event, the usage
//!   last), per response.
//!
//! ```sh
//! cargo run --release --example cost_probe            # list cases and allocations
//! bash scripts/cost.sh                                # callgrind counts vs the baseline
//! ```
#[path = "common/responses.rs"]
mod responses;

use prefix_router::alloc_count::{allocations, Counting};
use prefix_router::cost::CostModel;
use prefix_router::hash::{PrefixHasher, BLOCK_UNITS};
use prefix_router::index::{SlotStore, SlotValue, VecStore};
use prefix_router::json::{Scanner, ELEMENT_END};
use prefix_router::usage::UsageScanner;
use prefix_router::{Body, Config, Loads, Router, RoutingKey};
use std::hint::black_box;

/// Requests per measured region: 10, or `COST_PROBE_ITERS` (the wasm fuel
/// count, `scripts/cost-wasm.sh --fuel`, runs each case with 0 and with N
/// requests and takes the difference: setup and warm-up cancel out).
fn iters() -> u64 {
    std::env::var("COST_PROBE_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10)
}

/// Allocations counted per routing ([`prefix_router::alloc_count`]).
#[global_allocator]
static GLOBAL: Counting = Counting;

/// The only region callgrind counts (see the module docs). Never inlined, so
/// the toggle finds it by name.
#[inline(never)]
fn measured_region(n: u64, f: &mut dyn FnMut() -> u64) -> u64 {
    let mut acc = 0u64;
    for _ in 0..n {
        acc = acc.wrapping_add(f());
    }
    black_box(acc)
}

/// [`chat_body`] and the texts of its two messages.
fn chat_parts(bytes: usize, variant: u64) -> (String, [String; 2]) {
    let words = [
        "the",
        "assistant",
        "must",
        "answer",
        "questions",
        "about",
        "billing",
        "orders",
        "shipping",
        "returns",
        "policy",
        "customer",
        "support",
        "politely",
        "and",
        "never",
    ];
    let mut s = 0x9e37_79b9_7f4a_7c15u64 ^ variant;
    let mut prose = |n: usize| {
        let mut out = String::with_capacity(n + 16);
        while out.len() < n {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            out.push_str(words[(s >> 60) as usize]);
            out.push(' ');
        }
        out.truncate(n);
        out
    };
    let head = r#"{"model":"bench-model","messages":[{"role":"system","content":""#;
    let system = format!("Tenant {variant}. ");
    let mid = r#""},{"role":"user","content":""#;
    let tail = r#""}],"max_tokens":64,"stream":false}"#;
    let room = bytes
        .saturating_sub(head.len() + system.len() + mid.len() + tail.len())
        .max(16);
    let user = (room / 8).max(8);
    let (system, user) = (system + &prose(room - user), prose(user));
    let body = format!("{head}{system}{mid}{user}{tail}");
    (body, [system, user])
}

/// A chat body of exactly `bytes` bytes (system prompt + user message, plain
/// ASCII prose, like the overhead benchmark's).
fn chat_body(bytes: usize, variant: u64) -> String {
    chat_parts(bytes, variant).0
}

fn endpoints(n: usize) -> String {
    (0..n)
        .map(|i| format!("\"10.{}.{}.{}:8000\"", i / 65536, (i / 256) % 256, i % 256))
        .collect::<Vec<_>>()
        .join(",")
}

fn router(strategy: &str, n: usize) -> Router {
    let json = format!(
        r#"{{"strategy":"{strategy}","endpoints":[{}]}}"#,
        endpoints(n)
    );
    match Config::from_json(json.as_bytes()) {
        Ok(c) => Router::new(c),
        Err(e) => {
            eprintln!("cost_probe: bad config: {e}");
            std::process::exit(2)
        }
    }
}

fn loads(n: usize) -> Vec<u32> {
    (0..n).map(|i| (i % 5) as u32).collect()
}

/// An index that never remembers anything: every decision is a cold placement.
struct Forgetful;

impl SlotStore for Forgetful {
    fn get(&self, _slot: u32) -> Option<SlotValue> {
        None
    }
    fn set(&mut self, _slot: u32, value: SlotValue) {
        black_box(value);
    }
}

/// Whether the command line selects this case: no argument selects all, else
/// a case runs when its name starts with one of the arguments (profiling one
/// case: `cost_probe affinity/16k` under `valgrind --tool=callgrind`).
fn selected(name: &str) -> bool {
    let mut args = std::env::args().skip(1).peekable();
    args.peek().is_none() || args.any(|a| name.starts_with(&a))
}

/// Run one case: warm-up outside the counted region, then [`iters`] requests
/// inside it; prints the case name and allocations per request.
fn case(name: &str, mut f: impl FnMut() -> u64) {
    if !selected(name) {
        return;
    }
    black_box(f());
    let before = allocations();
    black_box(measured_region(iters(), &mut f));
    let allocs = allocations() - before;
    match timing_rounds() {
        Some(rounds) => println!("{name} {:.0}", best_ns(rounds, &mut f)),
        None => println!(
            "{name} {} {:.1}",
            iters(),
            allocs as f64 / iters().max(1) as f64
        ),
    }
}

/// `COST_PROBE_TIME=<rounds>`: time each case instead of printing its
/// allocations (for the wasm32-wasip1 build under Node's V8, the filter's
/// runtime: `scripts/cost-wasm.sh`). Wall time, so only the best round of
/// `rounds` is reported.
fn timing_rounds() -> Option<u32> {
    std::env::var("COST_PROBE_TIME").ok()?.parse().ok()
}

/// Best time per request (ns) over `rounds` rounds of enough requests for
/// ~2 ms each, after ~100 ms of warm-up (V8 tiers hot wasm functions up from
/// its baseline compiler).
fn best_ns(rounds: u32, f: &mut dyn FnMut() -> u64) -> f64 {
    let warm = std::time::Instant::now();
    while warm.elapsed().as_millis() < 100 {
        black_box(f());
    }
    let t = std::time::Instant::now();
    black_box(f());
    let one = t.elapsed().as_nanos().max(1);
    let n = (2_000_000 / one).clamp(1, 100_000) as u32;
    let mut best = f64::INFINITY;
    for _ in 0..rounds {
        let t = std::time::Instant::now();
        for _ in 0..n {
            black_box(f());
        }
        best = best.min(t.elapsed().as_nanos() as f64 / f64::from(n));
    }
    best
}

fn end_to_end(strategy: &str, kb: usize) {
    let r = router(strategy, 7);
    let body = chat_body(kb * 1024, 1);
    let l = loads(7);
    let cost = CostModel::new(r.cost_config());
    let mut store = VecStore::new(r.config().affinity.index_slots);
    let mut now = 1_000u64;
    case(&format!("{strategy}/{kb}k"), || {
        let k = r.key(Body::Complete(black_box(body.as_bytes())), None);
        now += 1;
        let d = if strategy == "affinity" {
            r.select_affinity(&k, body.len(), Loads::new(&l), &mut store, &cost, now, now)
                .0
        } else {
            r.select(&k, Loads::new(&l), now)
        };
        k.key.unwrap_or(0) ^ d.primary as u64
    });
}

/// `fleet/<n>/*` (with the key) or `decide/<n>/*` (without).
fn fleet(n: usize, with_key: bool) {
    let r = router("affinity", n);
    let body = chat_body(1024, 2);
    let l = loads(n);
    let label = if with_key { "fleet" } else { "decide" };
    let mut warm = VecStore::new(r.config().affinity.index_slots);
    decision(
        &format!("{label}/{n}/warm"),
        &r,
        &body,
        &l,
        &mut warm,
        with_key,
    );
    decision(
        &format!("{label}/{n}/cold"),
        &r,
        &body,
        &l,
        &mut Forgetful,
        with_key,
    );
}

fn decision<S: SlotStore>(
    name: &str,
    r: &Router,
    body: &str,
    l: &[u32],
    store: &mut S,
    with_key: bool,
) {
    let fixed: RoutingKey = r.key(Body::Complete(body.as_bytes()), None);
    let cost = CostModel::new(r.cost_config());
    let mut now = 1_000u64;
    case(name, || {
        now += 1;
        let computed;
        let key = if with_key {
            computed = r.key(Body::Complete(black_box(body.as_bytes())), None);
            &computed
        } else {
            black_box(&fixed)
        };
        let (d, _) = r.select_affinity(key, body.len(), Loads::new(l), store, &cost, now, now);
        d.primary as u64
    });
}

/// `usage/<shape>`: the response scanner (`read_usage`) over one whole
/// response, chunk by chunk as Envoy hands them over.
fn usage(name: &str, chunks: &[Vec<u8>], sse: bool) {
    case(name, || {
        let mut s = if sse {
            UsageScanner::sse()
        } else {
            UsageScanner::new()
        };
        for c in chunks {
            s.feed(black_box(c));
        }
        s.into_usage().cached().unwrap_or(0)
    });
}

/// `key/<size>` and its parts (`affinity`'s 65,536-character key of a chat
/// body): `key` = `Router::key` (extract + per-block seeding); `keyscan` =
/// the validating JSON scan alone (no walk, no hash); `keyhash` = the
/// prefix hasher fed the two messages' texts directly (no JSON); `keyxxh`
/// = xxh64 of the text's 256-byte blocks alone (the block-hash floor).
fn key_parts(kb: usize) {
    let r = router("affinity", 7);
    let (body, texts) = chat_parts(kb * 1024, 1);
    let limit = r.config().prefix_length;
    case(&format!("key/{kb}k"), || {
        let k = r.key(Body::Complete(black_box(body.as_bytes())), None);
        k.key.unwrap_or(0)
    });
    case(&format!("keyextract/{kb}k"), || {
        let e = prefix_router::extract::extract(black_box(body.as_bytes()), limit, BLOCK_UNITS);
        e.map_or(0, |e| e.prefix.last().unwrap_or(0))
    });
    case(&format!("keyscan/{kb}k"), || {
        let mut n = 0u64;
        let ok = Scanner::new(black_box(body.as_bytes()))
            .object_members(|_, v| n += v.len() as u64)
            .is_ok();
        n + u64::from(ok)
    });
    case(&format!("keyhash/{kb}k"), || {
        let mut h = PrefixHasher::new(limit, BLOCK_UNITS);
        for t in &texts {
            h.push_str(black_box(t));
            h.end_element(ELEMENT_END);
        }
        h.finish().last().unwrap_or(0)
    });
    case(&format!("keyblock/{kb}k"), || {
        texts
            .iter()
            .flat_map(|t| black_box(t.as_bytes()).chunks(BLOCK_UNITS))
            .fold(0u64, |a, c| a ^ prefix_router::blockhash::block_hash(c))
    });
    case(&format!("keysplit/{kb}k"), || {
        texts.iter().fold(0u64, |a, t| {
            let mut b = black_box(t.as_bytes());
            let mut n = a;
            while !b.is_empty() {
                let (bytes, chars) = prefix_router::bytescan::split_chars(b, BLOCK_UNITS);
                n += chars as u64;
                b = &b[bytes..];
            }
            n
        })
    });
    case(&format!("keyxxh/{kb}k"), || {
        texts
            .iter()
            .flat_map(|t| black_box(t.as_bytes()).chunks(BLOCK_UNITS))
            .fold(0u64, |a, c| a ^ xxhash_rust::xxh64::xxh64(c, 0))
    });
}

/// `keychat64/*`: a chat of 64 short messages (~100 characters each, one
/// partial block per message: the shape of a long multi-turn conversation),
/// where the per-message work (the walk, each message's last block) counts
/// and no 256-byte plain block ever forms: `extract` (the whole key's text
/// part), `scan` (the validating scan alone), `hash` (the hasher fed the 64
/// texts directly, no JSON).
fn key_chat64() {
    let texts: Vec<String> = (0..64)
        .map(|i| {
            format!("message {i}: the assistant must answer questions about billing, orders and shipping politely.")
        })
        .collect();
    let body = format!(
        r#"{{"model":"m","messages":[{}]}}"#,
        texts
            .iter()
            .map(|t| format!(r#"{{"role":"user","content":"{t}"}}"#))
            .collect::<Vec<_>>()
            .join(",")
    );
    case("keychat64/extract", || {
        let e = prefix_router::extract::extract(black_box(body.as_bytes()), 65536, BLOCK_UNITS);
        e.map_or(0, |e| e.prefix.last().unwrap_or(0))
    });
    case("keychat64/scan", || {
        let mut n = 0u64;
        let ok = Scanner::new(black_box(body.as_bytes()))
            .object_members(|_, v| n += v.len() as u64)
            .is_ok();
        n + u64::from(ok)
    });
    case("keychat64/hash", || {
        let mut h = PrefixHasher::new(65536, BLOCK_UNITS);
        for t in &texts {
            h.push_str(black_box(t));
            h.end_element(ELEMENT_END);
        }
        h.finish().last().unwrap_or(0)
    });
}

fn main() {
    let tiny = br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
    case("keytiny/extract", || {
        let e = prefix_router::extract::extract(black_box(tiny), 65536, BLOCK_UNITS);
        e.map_or(0, |e| e.prefix.last().unwrap_or(0))
    });
    case("keytiny/scan", || {
        let mut n = 0u64;
        let ok = Scanner::new(black_box(tiny))
            .object_members(|_, v| n += v.len() as u64)
            .is_ok();
        n + u64::from(ok)
    });
    case("keytiny/hasher", || {
        let mut h = PrefixHasher::new(65536, BLOCK_UNITS);
        h.push_str(black_box("hi"));
        h.end_element(ELEMENT_END);
        h.finish().last().unwrap_or(0)
    });
    key_chat64();
    for kb in [1, 16, 64, 256] {
        end_to_end("affinity", kb);
        end_to_end("prefix", kb);
    }
    for kb in [1, 16, 64] {
        key_parts(kb);
    }
    for with_key in [true, false] {
        for n in [3, 10, 30, 100, 300, 1000] {
            fleet(n, with_key);
        }
    }
    usage("usage/json1k", &responses::json(1024), false);
    usage("usage/json16k", &responses::json(16 * 1024), false);
    usage("usage/sse200", &responses::sse(200), true);
}
