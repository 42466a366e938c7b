//! Failover: a dead or refusing replica costs a retry, never a failed request.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::harness::workload::{chat, placement, text};
use crate::harness::World;
use prefix_router::cluster::view::View;

/// Kill one of 3 replicas. Requests whose ring owner is the dead one are retried on
/// their secondary (the ring successor): the first one by a retry (attempt 2), which
/// marks the dead replica down for every worker, the later ones directly, before
/// Envoy's health check notices. Every request succeeds; the filter counts each
/// retried request in `prefix_router.upstream.mismatch`.
#[test]
fn killed_replica_every_request_still_succeeds() {
    // Slow health checks, so the first burst runs while Envoy still thinks the replica is up.
    // Ring placement at equal loads (the plan below), not the default spread
    // of new prefixes by pressure or by request share, which depend on what
    // came before.
    let mut w = World::start("killed", &World::replicas(3), |mut c| {
        c.hc_interval_ms = 5000;
        c.ring_order()
    });
    let r = w.router();
    let bodies: Vec<String> = (0..30)
        .map(|i| chat(&text(&format!("failover-{i}"), 800), "hi"))
        .collect();
    let plan: Vec<(String, Option<String>)> =
        bodies.iter().map(|b| placement(&r, b.as_bytes())).collect();
    let mut owned: BTreeMap<String, usize> = BTreeMap::new();
    for (p, _) in &plan {
        *owned.entry(p.clone()).or_default() += 1;
    }
    let (victim, n_victim) = owned
        .iter()
        .max_by_key(|(_, n)| **n)
        .map(|(a, n)| (a.clone(), *n))
        .expect("owners");
    assert!(n_victim >= 5, "too few prefixes on one replica: {owned:?}");
    let vi = w
        .fleet
        .replicas
        .iter()
        .position(|x| x.addr() == victim)
        .expect("victim");
    w.fleet.replicas[vi].kill();

    // The first request owned by the victim is retried on the host that takes
    // over the victim's prefixes (its successor by address); once the victim is
    // marked down, new keys go to their own ring successor (the plan's secondary).
    let view = View::from_config(r.config());
    let takeover = view
        .position(victim.as_bytes())
        .and_then(|v| view.takeover(v, &vec![true; view.endpoints().len()]))
        .and_then(|t| view.addr(t))
        .map(str::to_string);
    let mut first_victim_request = true;
    for (i, b) in bodies.iter().enumerate() {
        let reply = w.chat(b);
        assert_eq!(
            reply.status, 200,
            "request {i} failed after the kill: {}",
            reply.body
        );
        let at = w.served_by(&reply);
        assert_ne!(at, victim);
        let (primary, secondary) = &plan[i];
        if *primary == victim {
            let first = std::mem::replace(&mut first_victim_request, false);
            assert!(
                Some(&at) == secondary.as_ref() || (first && Some(&at) == takeover.as_ref()),
                "request {i} went to {at}, not its secondary {secondary:?} (takeover {takeover:?})"
            );
        } else {
            assert_eq!(at, *primary, "request {i} left its live owner");
        }
    }
    // Passive health: the first retried request marks the victim down for every
    // worker, so later requests of its prefixes go straight to the ring successor
    // (one retry per worker that raced the mark at most, not one per request).
    let s = w.envoy.wait_idle();
    let mismatched = s.get("prefix_router.upstream.mismatch");
    assert!(
        (1..=2).contains(&mismatched) && s.get("prefix_router.cluster.marked_down") >= 1,
        "{}",
        s.dump("prefix_router")
    );
    let log = w.envoy.wait_access_log(bodies.len());
    let retried = log.iter().filter(|l| l.contains("attempts=2")).count();
    assert_eq!(
        retried as u64,
        mismatched,
        "access log:\n{}",
        log.join("\n")
    );

    // After the health check marks it down, requests keep succeeding.
    w.envoy.wait_health(
        std::slice::from_ref(&victim),
        false,
        Duration::from_secs(15),
    );
    for (i, b) in bodies.iter().enumerate() {
        let reply = w.chat(b);
        assert_eq!(
            reply.status, 200,
            "request {i} failed with the replica marked down"
        );
        assert_ne!(w.served_by(&reply), victim);
    }
    w.envoy.wait_idle();
}

/// A replica answering 503 ("overloaded / loading") is retried elsewhere: every request
/// succeeds and none is answered by the refusing replica.
#[test]
fn replica_answering_503_is_retried_elsewhere() {
    // Ring placement at equal loads (see `killed_replica_every_request_still_succeeds`).
    let w = World::start("503", &World::replicas(3), |c| c.ring_order());
    let sick = w.fleet.replicas[0].addr();
    w.fleet.replicas[0].set_fail("503");
    let mut owned_by_sick = 0;
    let r = w.router();
    for i in 0..30 {
        let body = chat(&text(&format!("busy-{i}"), 700), "q");
        if placement(&r, body.as_bytes()).0 == sick {
            owned_by_sick += 1;
        }
        let reply = w.chat(&body);
        assert_eq!(
            reply.status, 200,
            "request {i}: {} {}",
            reply.status, reply.body
        );
        assert_ne!(w.served_by(&reply), sick);
    }
    assert!(
        owned_by_sick > 0,
        "no prefix was owned by the 503 replica: test proves nothing"
    );
    w.envoy.wait_idle();
}
