//! Integration tests of LoRA adapter slots (`--max-loras`, `--lora-load-ms`) and of reported-
//! metric overrides (`--report-*`, `POST /admin/metrics-override`), read back through the
//! filter's own Prometheus reader (`prefix_router::engine`). The real binary runs on a loopback
//! port (`support::Emu`).

use std::time::Instant;

use hyper::Method;
use prefix_router::engine::{lora_tier, parse_metrics, saturated, EngineLimits, EngineSample};
use replica_emulator::client::Client;
use serde_json::{json, Value};

mod support;
use support::Emu;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

async fn sample(c: &Client) -> EngineSample {
    let (s, b) = c.call(Method::GET, "/metrics", "").await.expect("metrics");
    assert_eq!(s, 200);
    parse_metrics(&b)
}

/// Non-streamed chat with `model`; returns the wall time in ms.
async fn chat_ms(c: &Client, model: &str) -> f64 {
    let body =
        json!({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1});
    let t = Instant::now();
    let (s, b) = c
        .call(Method::POST, "/v1/chat/completions", body.to_string())
        .await
        .expect("chat");
    assert_eq!(s, 200, "{}", String::from_utf8_lossy(&b));
    t.elapsed().as_secs_f64() * 1e3
}

/// `--lora-load-ms` below, and a bound for a request that loads nothing (it takes about 1 ms
/// with zero prefill and decode costs; the margin absorbs a loaded machine).
const LOAD_MS: f64 = 300.0;
const RESIDENT_MS: f64 = 250.0;

#[test]
fn adapters_load_into_lru_slots_at_a_cost_and_show_in_metrics() {
    let emu = Emu::start(&[
        "--lora-adapters",
        "a,b,c",
        "--max-loras",
        "2",
        "--lora-load-ms",
        "300",
        "--prefill-overhead-ms",
        "0",
        "--prefill-us-per-token",
        "0",
        "--decode-ms-per-token",
        "0",
    ]);
    rt().block_on(async {
        let c = Client::new(&emu.url()).unwrap();
        let s = sample(&c).await;
        assert_eq!((s.max_lora, s.loras_running.len()), (Some(2), 0));
        assert_eq!(lora_tier(&s, "a"), 1); // free slot

        assert!(
            chat_ms(&c, "a").await >= LOAD_MS,
            "first use loads the adapter"
        );
        assert!(chat_ms(&c, "a").await < RESIDENT_MS, "resident: no load");
        assert!(
            chat_ms(&c, "emulated-model").await < RESIDENT_MS,
            "base model: no adapter"
        );
        assert!(chat_ms(&c, "b").await >= LOAD_MS);
        let s = sample(&c).await;
        assert_eq!(s.loras_running, ["a", "b"]);
        assert_eq!((lora_tier(&s, "b"), lora_tier(&s, "c")), (0, 2)); // full

        assert!(chat_ms(&c, "c").await >= LOAD_MS); // evicts a (least recently used)
        assert_eq!(sample(&c).await.loras_running, ["b", "c"]);
        assert!(chat_ms(&c, "a").await >= LOAD_MS, "evicted: loads again");
        let (_, st) = c.call(Method::GET, "/admin/state", "").await.unwrap();
        let st: Value = serde_json::from_slice(&st).unwrap();
        assert_eq!(st["lora_loads"], 4);
        assert_eq!(st["lora_resident"], json!(["c", "a"]));
    });
}

#[test]
fn unlimited_adapters_are_all_resident_and_free() {
    let emu = Emu::start(&["--lora-adapters", "x,y", "--lora-load-ms", "500"]);
    rt().block_on(async {
        let c = Client::new(&emu.url()).unwrap();
        let s = sample(&c).await;
        assert_eq!(
            (s.loras_running.clone(), s.max_lora),
            (vec!["x".to_string(), "y".into()], Some(2))
        );
        assert!(chat_ms(&c, "y").await < 400.0);
    });
}

#[test]
fn reported_queue_and_kv_usage_can_be_forced() {
    let emu = Emu::start(&["--report-waiting", "7"]);
    let limits = EngineLimits {
        max_queue: 128.0,
        max_kv_usage: 0.9,
    };
    rt().block_on(async {
        let c = Client::new(&emu.url()).unwrap();
        let s = sample(&c).await;
        assert_eq!(
            (s.waiting, s.running, s.kv_usage),
            (Some(7.0), Some(0.0), Some(0.0))
        );
        assert!(!saturated(&s, &limits));

        let set = |body: &'static str| c.call(Method::POST, "/admin/metrics-override", body);
        let (st, _) = set(r#"{"waiting": 500, "kv_usage": 0.95}"#).await.unwrap();
        assert_eq!(st, 200);
        let s = sample(&c).await;
        assert_eq!((s.waiting, s.kv_usage), (Some(500.0), Some(0.95)));
        assert!(saturated(&s, &limits));

        let (st, _) = c
            .call(Method::POST, "/admin/metrics-override?kv_usage=0.95", "")
            .await
            .unwrap();
        assert_eq!(st, 200);
        let s = sample(&c).await;
        assert_eq!((s.waiting, s.kv_usage), (Some(0.0), Some(0.95)));
        assert!(saturated(&s, &limits));

        for bad in [r#"{"kv_usage": 2}"#, r#"{"queue": 1}"#, "not json"] {
            assert_eq!(set(bad).await.unwrap().0, 400, "{bad}");
        }
        assert_eq!(set("{}").await.unwrap().0, 200);
        let s = sample(&c).await;
        assert_eq!((s.waiting, s.kv_usage), (Some(0.0), Some(0.0)));
        // an admin path: works while the replica fails on purpose
        c.call(Method::POST, "/admin/fail?mode=503", "")
            .await
            .unwrap();
        assert_eq!(set(r#"{"running": 3}"#).await.unwrap().0, 200);
        let (_, st) = c.call(Method::GET, "/admin/state", "").await.unwrap();
        let st: Value = serde_json::from_slice(&st).unwrap();
        assert_eq!(st["metrics_override"]["running"], 3.0);
    });
}
