//! Safety: requests without a usable body, hostile headers and huge bodies are routed,
//! never hung, never rejected by the filter; the routing header never reaches a replica.

use std::time::Duration;

use prefix_router::{Body, Loads};
use serde_json::Value;

use crate::harness::stats::BRANCHES;
use crate::harness::workload::{chat, owner, text};
use crate::harness::{Client, World};

/// GET and an empty POST route at once (no body to wait for): answered by a replica
/// within 2 s, decision `no_key`, source `none`.
#[test]
fn get_and_empty_post_route_at_once() {
    let w = World::start("get", &World::replicas(3), |c| c);
    let quick = Client::new(Duration::from_secs(5));
    for path in ["/health", "/v1/models", "/metrics"] {
        let r = quick.get(&w.envoy.url(path)).expect("GET through Envoy");
        assert!(r.status < 500, "GET {path}: {}", r.status);
        assert!(
            r.replica().is_some(),
            "GET {path} not answered by a replica"
        );
        assert!(
            r.elapsed < Duration::from_secs(2),
            "GET {path} took {:?}",
            r.elapsed
        );
    }
    let r = quick
        .post(
            &w.envoy.url("/v1/chat/completions"),
            b"",
            &[("content-type", "application/json")],
        )
        .expect("empty POST through Envoy");
    assert!(
        r.replica().is_some(),
        "empty POST not answered by a replica: {}",
        r.status
    );
    assert!(
        r.elapsed < Duration::from_secs(2),
        "empty POST took {:?}",
        r.elapsed
    );

    let s = w.envoy.wait_idle();
    assert_eq!(s.branch("no_key"), 4, "{}", s.dump("prefix_router.branch"));
    assert_eq!(s.source("none"), 4, "{}", s.dump("prefix_router.source"));
    let decisions: Vec<Value> = w
        .fleet
        .replicas
        .iter()
        .flat_map(|r| r.requests())
        .filter(|r| r["headers"].get("x-prefix-router-decision").is_some())
        .map(|r| r["headers"]["x-prefix-router-decision"].clone())
        .collect();
    assert_eq!(decisions, vec![Value::from("no_key"); 4]);
}

/// Malformed JSON bodies (truncated twice, not JSON after `{`, a trailing comma) are
/// routed (branch `bad_input`, source `malformed`) and answered by a replica within the
/// client timeout, not hung or rejected by the filter.
#[test]
fn malformed_json_is_routed_not_hung() {
    let w = World::start("malformed", &World::replicas(3), |c| c);
    let quick = Client::new(Duration::from_secs(5));
    let bodies: [&[u8]; 4] = [
        br#"{"model":"m","messages":[{"role":"user","content":"hi"#,
        br#"{"model":"m","messages":[{"role":"user","content":"hi"}],}"#,
        b"{not json at all",
        br#"{"model":"m""#,
    ];
    for (i, b) in bodies.iter().enumerate() {
        let r = quick
            .post(
                &w.envoy.url("/v1/chat/completions"),
                b,
                &[("content-type", "application/json")],
            )
            .unwrap_or_else(|e| panic!("malformed body {i}: {e}"));
        assert!(
            r.replica().is_some(),
            "body {i} not answered by a replica: {} {}",
            r.status,
            r.body
        );
        assert!(
            r.status != 413 && r.status < 500,
            "body {i}: status {}",
            r.status
        );
    }
    let s = w.envoy.wait_idle();
    assert_eq!(s.branch("bad_input"), 4, "{}", s.dump("prefix_router"));
    assert_eq!(s.source("malformed"), 4, "{}", s.dump("prefix_router"));
}

/// A client that names a replica in `x-gateway-destination-endpoint` (single host or a
/// list) or forges the decision header is ignored (default strategy `affinity`): the
/// request lands on the ring owner (cold placement at idle, then the index) and the
/// upstream sees the filter's decision, not the forged one.
#[test]
fn client_supplied_target_header_is_ignored() {
    // Ring order at equal loads (the owner the core predicts), not the
    // default spread of new prefixes by pressure or by request share, which
    // depend on history.
    let w = World::start("spoof", &World::replicas(4), |c| c.ring_order());
    let r = w.router();
    let eps = w.fleet.endpoints();
    let url = w.envoy.url("/v1/chat/completions");
    let mut sent = 0;
    for t in 0..8 {
        let body = chat(&text(&format!("spoof-{t}"), 500), "hi");
        let want = owner(&r, body.as_bytes());
        for other in eps.iter().filter(|e| **e != want) {
            for forged in [other.clone(), format!("{other},{other}")] {
                let reply = w
                    .client
                    .post(
                        &url,
                        body.as_bytes(),
                        &[
                            ("content-type", "application/json"),
                            ("x-gateway-destination-endpoint", &forged),
                            ("x-prefix-router-decision", "forged"),
                        ],
                    )
                    .expect("request");
                sent += 1;
                assert_eq!(reply.status, 200, "{}", reply.body);
                assert_eq!(
                    w.served_by(&reply),
                    want,
                    "prefix {t}: forged target {forged} was obeyed"
                );
            }
        }
    }
    for (id, req) in w.fleet.all_model_requests() {
        let h = &req["headers"];
        let d = &h["x-prefix-router-decision"];
        // The default `affinity`: each prefix is placed once (`cold`), then known (`hit`).
        assert!(d == "hit" || d == "cold", "{id}: {h}");
        assert!(
            h.get("x-gateway-destination-endpoint").is_none(),
            "{id}: {h}"
        );
    }
    let s = w.envoy.wait_idle();
    assert_eq!(s.branch("cold"), 8, "{}", s.dump("prefix_router.branch"));
    assert_eq!(
        s.branch("hit"),
        sent - 8,
        "{}",
        s.dump("prefix_router.branch")
    );
}

/// Across every kind of request (chat, GET, malformed, raw, forged header), no replica
/// ever receives `x-gateway-destination-endpoint`, and every request that passed the
/// filter carries a valid `x-prefix-router-decision`.
#[test]
fn upstreams_never_see_the_target_header() {
    let w = World::start("strip", &World::replicas(3), |c| c);
    let base = w.envoy.url("");
    let sys = text("strip", 3000);
    let _ = w.chat(&chat(&sys, "a"));
    let _ = w.client.get(&format!("{base}/v1/models")).expect("get");
    let _ = w
        .client
        .post(
            &format!("{base}/v1/completions"),
            b"{broken",
            &[("content-type", "application/json")],
        )
        .expect("malformed");
    let _ = w
        .client
        .post(
            &format!("{base}/v1/completions"),
            sys.as_bytes(),
            &[("content-type", "text/plain")],
        )
        .expect("raw");
    let _ = w
        .client
        .post(
            &format!("{base}/v1/chat/completions"),
            chat(&sys, "b").as_bytes(),
            &[
                ("content-type", "application/json"),
                ("x-gateway-destination-endpoint", "127.0.0.1:1"),
            ],
        )
        .expect("forged");
    let mut seen = 0;
    for rep in &w.fleet.replicas {
        for req in rep.requests() {
            let h = &req["headers"];
            assert!(
                h.get("x-gateway-destination-endpoint").is_none(),
                "replica {} saw the target header: {req}",
                rep.id
            );
            if req["path"] == "/health" && h.get("x-prefix-router-decision").is_none() {
                continue; // Envoy's own health check, not a proxied request
            }
            let d = h["x-prefix-router-decision"].as_str().unwrap_or("<none>");
            assert!(
                BRANCHES.contains(&d),
                "replica {}: decision {d:?} in {req}",
                rep.id
            );
            seen += 1;
        }
    }
    assert_eq!(seen, 5, "expected the 5 proxied requests at the replicas");
}

/// A 3 MiB chat body (above `max_body_bytes` = 768 KiB, the listener limit of 1 MiB and
/// the 2 MiB a single read may deliver) is routed on its raw prefix (source `oversize`),
/// five times to the same replica, never answered 413 and never hung; a 200 KiB prompt
/// below the limit is parsed as chat.
#[test]
fn huge_body_is_routed_on_its_raw_prefix() {
    // Ring order at equal loads (see `client_supplied_target_header_is_ignored`).
    let w = World::start("oversize", &World::replicas(3), |c| c.ring_order());
    let r = w.router();
    let big = chat(&text("huge", 3 << 20), "and the question");
    assert!(big.len() > 3 << 20);
    let max = r.config().max_body_bytes;
    let key = r.key(Body::Oversize(&big.as_bytes()[..max]), None);
    let eps = &r.config().endpoints;
    let want = eps[r.select(&key, Loads::new(&vec![0; eps.len()]), 0).primary].clone();
    let slow = Client::new(Duration::from_secs(30));
    for i in 0..5 {
        let reply = slow
            .post(
                &w.envoy.url("/v1/chat/completions"),
                big.as_bytes(),
                &[("content-type", "application/json")],
            )
            .unwrap_or_else(|e| panic!("oversize request {i}: {e}"));
        assert_ne!(reply.status, 413, "Envoy refused the body: {}", reply.body);
        assert!(
            reply.status < 500,
            "oversize {i}: {} {}",
            reply.status,
            reply.body
        );
        assert_eq!(
            w.served_by(&reply),
            want,
            "oversize {i} not on the raw-prefix owner"
        );
    }
    let long = chat(&text("long", 200 << 10), "q");
    let reply = w.chat(&long);
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(w.served_by(&reply), owner(&r, long.as_bytes()));

    let s = w.envoy.wait_idle();
    assert_eq!(
        s.source("oversize"),
        5,
        "{}",
        s.dump("prefix_router.source")
    );
    assert_eq!(s.source("chat"), 1, "{}", s.dump("prefix_router.source"));
    assert_eq!(s.branch_total(), 6);
}
