//! The other strategies and the routing id: round robin, least request, session affinity,
//! and tenants separated by their routing id under `prefix`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::harness::procs::wait_for;
use crate::harness::workload::{chat, chat_with, text};
use crate::harness::{ReplicaOpts, World};

/// `round_robin` needs no body: 9 POSTs and a GET rotate over the 3 replicas through one
/// cluster-wide ticket (exactly 3 POSTs each whatever worker thread took them), with
/// decision `round_robin`.
#[test]
fn round_robin_rotates_over_every_replica() {
    let w = World::start("round-robin", &World::replicas(3), |c| {
        c.with("strategy", json!("round_robin"))
    });
    let body = chat(&text("rr", 400), "same body every time");
    let mut count: BTreeMap<String, usize> = BTreeMap::new();
    for _ in 0..9 {
        let reply = w.chat(&body);
        assert_eq!(reply.status, 200, "{}", reply.body);
        *count.entry(w.served_by(&reply)).or_default() += 1;
    }
    assert!(
        count.len() == 3 && count.values().all(|n| *n == 3),
        "round robin placed 9 requests as {count:?}"
    );
    let get = w.client.get(&w.envoy.url("/v1/models")).expect("GET");
    assert!(get.replica().is_some());
    let s = w.envoy.wait_idle();
    assert_eq!(
        s.branch("round_robin"),
        10,
        "{}",
        s.dump("prefix_router.branch")
    );
    for (id, req) in w.fleet.all_model_requests() {
        assert_eq!(
            req["headers"]["x-prefix-router-decision"], "round_robin",
            "{id}"
        );
    }
}

/// `least_request`: while one replica holds a long stream, short requests go to the
/// others (decision `least_request`).
#[test]
fn least_request_avoids_the_busy_replica() {
    let opts = ReplicaOpts {
        decode_ms_per_token: 20.0,
        ..ReplicaOpts::default()
    };
    let w = World::start("least-request", &vec![opts; 3], |c| {
        c.with("strategy", json!("least_request"))
    });
    let sys = text("lr", 400);
    let url = w.envoy.url("/v1/chat/completions");
    let client = w.client.clone();
    let body = chat_with(&sys, "hold", 150, true);
    let hold = std::thread::spawn(move || {
        let s = client.post_streaming(&url, &body).expect("hold");
        let id = s
            .headers
            .iter()
            .find(|(k, _)| k == "x-replica-id")
            .map(|(_, v)| v.clone())
            .expect("x-replica-id");
        (id, s.finish().expect("hold body"))
    });
    let eps = w.fleet.endpoints();
    let busy = wait_for(Duration::from_secs(5), || {
        let s = w.envoy.stats();
        eps.iter().find(|e| s.in_flight(e) == 1).cloned()
    })
    .expect("the hold never showed in flight");
    let t0 = Instant::now();
    for i in 0..6 {
        let reply = w.chat(&chat_with(&sys, &format!("short {i}"), 2, false));
        assert_eq!(reply.status, 200, "{}", reply.body);
        assert_ne!(
            w.served_by(&reply),
            busy,
            "request {i} went to the busy replica"
        );
    }
    assert!(
        t0.elapsed() < Duration::from_secs(2),
        "short requests overlapped the hold only partly"
    );
    let (held_on, reply) = hold.join().expect("hold thread");
    assert_eq!(reply.status, 200);
    assert_eq!(w.fleet.by_id(&held_on).addr(), busy);
    let s = w.envoy.wait_idle();
    assert_eq!(
        s.branch("least_request"),
        7,
        "{}",
        s.dump("prefix_router.branch")
    );
}

/// `session` with `affinity_header`: every request of a session lands on one replica
/// whatever its body; sessions spread; no id → `no_key`; an id longer than 64
/// characters is rejected (counted) and routed without it.
#[test]
fn session_strategy_keeps_each_session_on_one_replica() {
    let w = World::start("session", &World::replicas(3), |c| {
        c.with("strategy", json!("session"))
            .with("affinity_header", json!("x-session-id"))
    });
    let url = w.envoy.url("/v1/chat/completions");
    let mut used = BTreeSet::new();
    for s in 0..12 {
        let sid = format!("session-{s}");
        let mut at = BTreeSet::new();
        for q in 0..4 {
            let body = chat(&text(&format!("turn-{s}-{q}"), 300), "different every turn");
            let reply = w
                .client
                .post(
                    &url,
                    body.as_bytes(),
                    &[("content-type", "application/json"), ("x-session-id", &sid)],
                )
                .expect("request");
            assert_eq!(reply.status, 200, "{}", reply.body);
            at.insert(w.served_by(&reply));
        }
        assert_eq!(at.len(), 1, "session {sid} split over {at:?}");
        used.extend(at);
    }
    assert!(used.len() >= 2, "12 sessions all on {used:?}");
    let _ = w.chat(&chat("no session", "x"));
    let long_id = "s".repeat(65);
    let _ = w
        .client
        .post(
            &url,
            chat("long id", "x").as_bytes(),
            &[
                ("content-type", "application/json"),
                ("x-session-id", &long_id),
            ],
        )
        .expect("request");
    let s = w.envoy.wait_idle();
    assert_eq!(
        s.source("routing_id"),
        48,
        "{}",
        s.dump("prefix_router.source")
    );
    assert_eq!(s.branch("hit"), 48, "{}", s.dump("prefix_router.branch"));
    assert_eq!(s.branch("no_key"), 2, "{}", s.dump("prefix_router.branch"));
    assert_eq!(s.get("prefix_router.routing_id.rejected"), 1);
}

/// `prefix` with `affinity_header`: 16 tenants send the same prompt; each tenant sticks
/// to one replica and the tenants do not all share one (the id is mixed into the key).
#[test]
fn routing_id_separates_tenants_with_the_same_prompt() {
    let w = World::start("tenants", &World::replicas(3), |c| {
        c.with("affinity_header", json!("x-tenant"))
    });
    let body = chat(&text("shared-system-prompt", 2500), "same question");
    let url = w.envoy.url("/v1/chat/completions");
    let mut used = BTreeSet::new();
    for t in 0..16 {
        let tenant = format!("tenant-{t}");
        let mut at = BTreeSet::new();
        for _ in 0..3 {
            let reply = w
                .client
                .post(
                    &url,
                    body.as_bytes(),
                    &[("content-type", "application/json"), ("x-tenant", &tenant)],
                )
                .expect("request");
            assert_eq!(reply.status, 200, "{}", reply.body);
            at.insert(w.served_by(&reply));
        }
        assert_eq!(at.len(), 1, "{tenant} split over {at:?}");
        used.extend(at);
    }
    assert!(
        used.len() >= 2,
        "16 tenants with one prompt all on {used:?}"
    );
    let s = w.envoy.wait_idle();
    // Default `affinity`: each tenant's prefix is placed once, then found in the index.
    assert_eq!(s.branch("cold"), 16, "{}", s.dump("prefix_router.branch"));
    assert_eq!(s.branch("hit"), 32, "{}", s.dump("prefix_router.branch"));
}
