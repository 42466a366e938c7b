//! Predicted vs delivered (`src/filter/delivered.rs`): the filter reads the engine's
//! `cached_tokens` from the response as it passes (JSON and SSE), compares it with what
//! it predicted, counts surprises per endpoint, writes an access-log field, and corrects
//! its index when a replica evicted prefixes behind its back.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};

use crate::harness::client::Client;
use crate::harness::procs::wait_for;
use crate::harness::stats::Stats;
use crate::harness::workload::{text, MODEL};
use crate::harness::World;

/// A request of prefix group `g` (a 6,000-character system prompt) with a unique question.
fn request(g: usize, i: usize, stream: bool) -> String {
    let mut v = json!({
        "model": MODEL,
        "messages": [
            {"role": "system", "content": text(&format!("group{g}"), 6000)},
            {"role": "user", "content": format!("question {i} of group {g}: what now?")}
        ],
        "max_tokens": 4,
        "stream": stream
    });
    if stream {
        v["stream_options"] = json!({"include_usage": true});
    }
    v.to_string()
}

/// `key=value` pairs of the access log's `usage=` field.
fn usage_fields(line: &str) -> BTreeMap<String, String> {
    let Some((_, rest)) = line.split_once(" usage=") else {
        return BTreeMap::new();
    };
    rest.split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn cached_in(body: &str) -> Option<u64> {
    // JSON body, or the SSE event that carries the usage.
    let from = |v: &Value| v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64();
    if let Ok(v) = serde_json::from_str::<Value>(body) {
        return from(&v);
    }
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find_map(|v| from(&v))
}

/// Cached tokens the replicas delivered and the filter predicted between two stats snapshots,
/// asserting that more than `min_cached` were delivered and that the two are within `tol`
/// (relative); returns (predicted, delivered, relative gap).
fn steady_prediction(s: &Stats, warm: &Stats, min_cached: u64, tol: f64) -> (u64, u64, f64) {
    let steady = |name: &str| s.get(name) - warm.get(name);
    let cached = steady("prefix_router.delivered.cached_tokens");
    let predicted = steady("prefix_router.delivered.predicted_tokens");
    assert!(cached > min_cached, "the repeats hit: {cached}");
    let err = (predicted as f64 - cached as f64).abs() / cached as f64;
    assert!(
        err <= tol,
        "predicted {predicted} vs delivered {cached} cached tokens: {:.1} % apart",
        err * 100.0
    );
    (predicted, cached, err)
}

fn prometheus(w: &World) -> String {
    w.envoy.admin("/stats/prometheus")
}

/// A prompt past the hashed window (`prefix_length`, 65 536 characters by default): a
/// 120 000-character system prompt (30 000 tokens) repeated with new questions. The
/// router hashes only the window, but a holder of the whole window is expected to hold
/// the rest too, sized from the body (`AffinityConfig::beyond_window`,
/// `router::prompt_chars`): once warm, the prediction matches what the replica delivered
/// within 5 % (counting the window only, it was 16 384 tokens against ≈ 30 000).
#[test]
fn a_prompt_past_the_window_is_predicted_whole() {
    let w = World::start("delivered-window", &World::replicas(3), |c| {
        c.with("strategy", json!("affinity"))
    });
    let system = text("longdoc", 120_000);
    let body = |i: usize| {
        json!({
            "model": MODEL,
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": format!("question {i}: what now?")}
            ],
            "max_tokens": 4
        })
        .to_string()
    };
    let mut warm = None;
    for i in 0..6 {
        if i == 2 {
            warm = Some(w.envoy.wait_idle());
        }
        let reply = w.chat(&body(i));
        assert_eq!(reply.status, 200, "{}", reply.body);
    }
    let s = w.envoy.wait_idle();
    let warm = warm.unwrap();
    // Four warm requests, each ≈ 30 000 tokens cached: far past the window's 16 384.
    let (predicted, cached, err) = steady_prediction(&s, &warm, 4 * 25_000, 0.05);
    eprintln!(
        "past the window: predicted {predicted} vs delivered {cached} cached tokens ({:.2} %)",
        err * 100.0
    );
}

/// Six groups, five requests each, half of them streamed with `include_usage`: the filter
/// reads every response's usage (JSON and SSE); once each group has been seen twice (the
/// engine's first hit confirms the exact shared depth) its prediction matches what the
/// replicas delivered within 2 %; no surprise is counted; every access-log line carries
/// `branch= predicted= delivered=`; and Prometheus gets the per-replica stats as one family
/// with an `endpoint` label.
#[test]
fn predicted_matches_delivered_on_a_steady_workload() {
    let w = World::start("delivered-steady", &World::replicas(3), |c| {
        c.with("strategy", json!("affinity"))
    });
    let mut delivered_by_client = 0u64;
    let mut warm = None;
    for i in 0..5 {
        if i == 2 {
            warm = Some(w.envoy.wait_idle());
        }
        for g in 0..6 {
            let stream = (i + g) % 2 == 1;
            let reply = w.chat(&request(g, i, stream));
            assert_eq!(reply.status, 200, "{}", reply.body);
            delivered_by_client += cached_in(&reply.body)
                .unwrap_or_else(|| panic!("no usage in the response: {}", reply.body));
        }
    }
    let s = w.envoy.wait_idle();
    let warm = warm.unwrap();
    assert_eq!(
        s.get("prefix_router.delivered.responses"),
        30,
        "{}",
        s.dump("delivered")
    );
    assert_eq!(s.get("prefix_router.delivered.unreported"), 0);
    let cached = s.get("prefix_router.delivered.cached_tokens");
    assert_eq!(
        cached, delivered_by_client,
        "the filter read what the client got"
    );
    let (predicted, cached, err) = steady_prediction(&s, &warm, 18 * 1000, 0.02);
    eprintln!(
        "steady state: predicted {predicted} vs delivered {cached} cached tokens ({:.2} %); all 30: predicted {} delivered {}",
        err * 100.0,
        s.get("prefix_router.delivered.predicted_tokens"),
        s.get("prefix_router.delivered.cached_tokens")
    );
    let surprises: u64 = s.matching("surprise").iter().map(|(_, v)| *v).sum();
    assert_eq!(surprises, 0, "{}", s.dump("surprise"));

    let lines = w.envoy.wait_access_log(30);
    let fields: Vec<_> = lines.iter().map(|l| usage_fields(l)).collect();
    assert_eq!(fields.len(), 30, "{lines:#?}");
    let mut logged = 0u64;
    for (f, line) in fields.iter().zip(&lines) {
        for k in ["branch", "predicted", "delivered", "prompt", "surprise"] {
            assert!(f.contains_key(k), "{k} missing: {line}");
        }
        assert_eq!(f["surprise"], "none", "{line}");
        logged += f["delivered"]
            .parse::<u64>()
            .unwrap_or_else(|_| panic!("{line}"));
        if f["branch"] == "hit" {
            assert!(f["predicted"].parse::<u64>().unwrap() > 1000, "{line}");
        }
    }
    assert_eq!(logged, delivered_by_client);

    // One Prometheus family per stat, the replica as a label (histograms appear after
    // Envoy's stats flush, every 5 s).
    let text = wait_for(Duration::from_secs(12), || {
        let t = prometheus(&w);
        t.contains("prefix_router_endpoint_delivered_cached_tokens_count{")
            .then_some(t)
    })
    .unwrap_or_else(|| {
        let t = prometheus(&w);
        let ours: Vec<&str> = t.lines().filter(|l| l.contains("prefix_router")).collect();
        panic!(
            "no delivered histogram in Prometheus output:\n{}",
            ours.join("\n")
        )
    });
    for ep in w.fleet.endpoints() {
        let label = format!("endpoint=\"{}\"", ep.replace(['.', ':'], "_"));
        assert!(
            text.lines()
                .any(|l| l.starts_with("prefix_router_endpoint_routed{") && l.contains(&label)),
            "no routed counter labelled {label}"
        );
    }
    assert!(
        !text.contains("prefix_router_endpoint_127_0_0_1"),
        "endpoint left in a metric name"
    );
}

/// Six prefix groups warmed (two requests each) on one replica, whose cache is then
/// reset behind the router's back (what a restart does); `horizons`: the filter's
/// `eviction_horizons`. Returns the world and the replica's `expected_hit_got_miss`
/// counter name (still 0).
fn warmed_then_reset(name: &str, horizons: bool) -> (World, String) {
    let w = World::start(name, &World::replicas(1), |c| {
        c.with("strategy", json!("affinity"))
            .with("eviction_horizons", json!(horizons))
    });
    for g in 0..6 {
        for i in 0..2 {
            assert_eq!(w.chat(&request(g, i, false)).status, 200);
        }
    }
    // Entries strictly older than the requests that follow (the index clock is 100 ms).
    std::thread::sleep(Duration::from_millis(250));
    let ep = w.fleet.endpoints()[0].clone();
    let r = Client::new(Duration::from_secs(5))
        .post(&format!("http://{ep}/admin/reset-cache"), b"", &[])
        .expect("reset-cache");
    assert_eq!(r.status, 200);
    let miss_name = format!(
        "prefix_router.endpoint.{}.surprise.expected_hit_got_miss",
        ep.replace(['.', ':'], "_")
    );
    assert_eq!(w.envoy.stats().get(&miss_name), 0);
    (w, miss_name)
}

/// By default (`eviction_horizons` off) the misses after a cache reset are counted but
/// forget nothing: each of six warmed groups is predicted a hit and delivered a miss
/// (six surprises, not three), then hits again where it was.
#[test]
fn by_default_a_reset_replica_keeps_its_index_entries() {
    let (w, miss_name) = warmed_then_reset("delivered-noevict", false);
    for (n, g) in [5, 0, 1, 2, 3, 4].into_iter().enumerate() {
        let reply = w.chat(&request(g, 10, false));
        let cached = cached_in(&reply.body).unwrap_or(0);
        let misses = w.envoy.stats().get(&miss_name);
        assert!(
            cached < 100 && misses == n as u64 + 1,
            "group {g}: {cached} cached, {misses} surprises"
        );
    }
    for g in 0..6 {
        let reply = w.chat(&request(g, 11, false));
        let cached = cached_in(&reply.body).unwrap_or(0);
        assert!(cached > 1000, "group {g}: {cached} cached");
    }
    assert_eq!(w.envoy.wait_idle().get(&miss_name), 6);
}

/// With `eviction_horizons` (off by default): six groups are warmed on one replica,
/// whose cache is then reset behind the router's back (what a restart does). The newest group's next request, then the two oldest
/// ones', are predicted hits and delivered misses: three `expected_hit_got_miss`. Three
/// misses in a row raise the replica's eviction horizon to the newest entry among them,
/// so the three groups in between are no longer predicted hits (no further surprise:
/// without the feedback there would be six), and every group hits again, as predicted,
/// on its next request.
#[test]
fn an_evicted_replica_is_detected_and_the_index_recovers() {
    let (w, miss_name) = warmed_then_reset("delivered-evict", true);

    // Cached tokens of group `g`'s next request; the surprise count after it.
    let next = |g: usize, i: usize| {
        let reply = w.chat(&request(g, i, false));
        let cached = cached_in(&reply.body).unwrap_or(0);
        (cached, w.envoy.stats().get(&miss_name))
    };
    // Newest group, then the oldest two: predicted hits, delivered misses, counted.
    for (n, g) in [(1, 5), (2, 0), (3, 1)] {
        let (cached, misses) = next(g, 10);
        assert!(
            cached < 100 && misses == n,
            "group {g}: {cached} cached, {misses} surprises"
        );
    }
    // The groups in between: no longer predicted (the horizon), so no further surprise
    // (older prefixes of the evicted replica would otherwise still be predicted hits).
    for g in 2..5 {
        let (cached, misses) = next(g, 10);
        assert!(
            cached < 100 && misses == 3,
            "group {g}: {cached} cached, {misses} surprises"
        );
    }
    // Recovered: every group hits again, as predicted.
    for g in 0..6 {
        let (cached, misses) = next(g, 11);
        assert!(
            cached > 1000 && misses == 3,
            "group {g}: {cached} cached, {misses} surprises"
        );
    }
    let s = w.envoy.wait_idle();
    assert_eq!(s.get(&miss_name), 3);
    let lines = w.envoy.wait_access_log(24);
    assert_eq!(lines.len(), 24, "{lines:#?}");
    // After the reset: three surprises, three groups no longer predicted, six hits.
    let expected = [
        ("", "expected_hit_got_miss"),
        ("", "expected_hit_got_miss"),
        ("", "expected_hit_got_miss"),
        ("cold", "none"),
        ("cold", "none"),
        ("cold", "none"),
    ]
    .into_iter()
    .chain(std::iter::repeat(("hit", "none")).take(6));
    for (line, (branch, surprise)) in lines[12..].iter().zip(expected) {
        let f = usage_fields(line);
        let get = |k: &str| f.get(k).cloned().unwrap_or_default();
        if !branch.is_empty() {
            assert_eq!(get("branch"), branch, "{line}");
        }
        assert_eq!(get("surprise"), surprise, "{line}");
    }
}

/// Responses API: a chain of five `store: true` responses, each continuing the previous
/// one with only its new input (so its prompt alone says nothing about where the
/// conversation lives), stays on the replica that stores the conversation (the emulator,
/// like vLLM, answers 404 for an id it does not hold), and the replica's cache serves
/// the growing conversation.
#[test]
fn a_previous_response_id_chain_stays_on_one_replica() {
    response_chain("delivered-responses", false);
}

/// The same chain streamed (`stream: true`): the filter learns each response id from the
/// `response.id` of the Responses API's SSE events as they pass (`src/usage.rs`), and the
/// cached tokens from `response.completed`.
#[test]
fn a_streamed_previous_response_id_chain_stays_on_one_replica() {
    response_chain("delivered-responses-stream", true);
}

/// The response object of a `/v1/responses` reply: the JSON body, or the `response` of the
/// stream's `response.completed` event (whose events must also carry that response's id
/// in `response.created`).
fn response_object(body: &str) -> Value {
    if let Ok(v) = serde_json::from_str::<Value>(body) {
        return v;
    }
    let events: Vec<Value> = body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str(d).ok())
        .collect();
    let of = |kind: &str| {
        events
            .iter()
            .find(|e| e["type"] == kind)
            .map(|e| e["response"].clone())
            .unwrap_or_else(|| panic!("no {kind} event in {body}"))
    };
    let (created, completed) = (of("response.created"), of("response.completed"));
    assert_eq!(created["id"], completed["id"], "{body}");
    completed
}

fn response_chain(name: &str, stream: bool) {
    let w = World::start(name, &World::replicas(4), |c| {
        c.with("strategy", json!("affinity"))
    });
    let mut replicas = std::collections::BTreeSet::new();
    let mut previous: Option<String> = None;
    for turn in 0..5 {
        let mut body = json!({
            "model": MODEL,
            "input": format!("turn {turn}: {}", text(&format!("t{turn}"), 1500)),
            "max_output_tokens": 8,
            "store": true,
            "stream": stream
        });
        if turn == 0 {
            body["instructions"] = json!(text("responses-chain", 3000));
        }
        if let Some(p) = &previous {
            body["previous_response_id"] = json!(p);
        }
        let reply = w.post("/v1/responses", &body.to_string());
        assert_eq!(reply.status, 200, "turn {turn}: {}", reply.body);
        replicas.insert(w.served_by(&reply));
        let v = response_object(&reply.body);
        if turn > 0 {
            let cached = v["usage"]["input_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap_or(0);
            assert!(
                cached > 500,
                "turn {turn}: conversation not reused: {}",
                reply.body
            );
        }
        previous = v["id"].as_str().map(str::to_string);
    }
    assert_eq!(replicas.len(), 1, "the chain moved: {replicas:?}");
    // Every response was read as it passed: its usage counted, none unreported.
    let s = w.envoy.wait_idle();
    assert_eq!(
        s.get("prefix_router.delivered.responses"),
        5,
        "{}",
        s.dump("prefix_router")
    );
    assert_eq!(s.get("prefix_router.delivered.unreported"), 0);
    // An id nobody produced is routed like any request; the replica answers 404.
    let lost = json!({"model": MODEL, "input": "hello", "previous_response_id": "resp_unknown",
                      "stream": stream});
    assert_eq!(w.post("/v1/responses", &lost.to_string()).status, 404);
    let s = w.envoy.wait_idle();
    assert_eq!(s.get("prefix_router.source.responses"), 6);
}

/// `read_usage: false` turns the feature off: no response byte is read, nothing is counted
/// and the access-log field stays empty, while routing is unchanged.
#[test]
fn read_usage_false_reads_nothing() {
    let w = World::start("delivered-off", &World::replicas(2), |c| {
        c.with("strategy", json!("affinity"))
            .with("read_usage", json!(false))
    });
    for i in 0..3 {
        let reply = w.chat(&request(0, i, i == 1));
        assert_eq!(reply.status, 200, "{}", reply.body);
    }
    let s = w.envoy.wait_idle();
    assert_eq!(s.branch("hit"), 2, "{}", s.dump("prefix_router"));
    assert_eq!(s.get("prefix_router.delivered.responses"), 0);
    assert_eq!(s.get("prefix_router.delivered.unreported"), 0);
    for line in w.envoy.wait_access_log(3) {
        assert!(line.ends_with("usage=-"), "{line}");
    }
}
