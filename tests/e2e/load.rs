//! Load: the bounded-load spill and the shared in-flight counters.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::harness::procs::wait_for;
use crate::harness::workload::{chat, chat_with, completion, placement, text};
use crate::harness::{ReplicaOpts, World};

/// The ring owner (a slow replica) holds `concurrency_threshold` = 2 streaming requests:
/// new requests of the same prefix spill to the next replica on the ring (decision `spill`
/// in the upstream header and in the stats), while the held streams keep streaming (first
/// bytes long before the end: the filter does not buffer responses). Once they finish the
/// prefix returns to its owner.
#[test]
fn busy_owner_at_its_concurrency_threshold_spills() {
    let slow = ReplicaOpts {
        decode_ms_per_token: 50.0,
        ..ReplicaOpts::default()
    };
    let fast = ReplicaOpts::default();
    // `prefix` semantics (ring owner, spill to the ring successor); `affinity`'s
    // cost-aware spill is tested in affinity.rs.
    let w = World::start("spill", &[slow, fast.clone(), fast], |c| {
        c.with("strategy", json!("prefix"))
            .with("concurrency_threshold", json!(2))
            .with("load_factor", json!(100.0))
    });
    let r = w.router();
    let slow_addr = w.fleet.replicas[0].addr();
    // A prefix owned by the slow replica (bounded search).
    let sys = (0..500)
        .map(|i| text(&format!("spill-{i}"), 2400))
        .find(|s| placement(&r, chat(s, "q").as_bytes()).0 == slow_addr)
        .expect("some prefix is owned by r0");
    let (_, next) = placement(&r, chat(&sys, "q").as_bytes());
    let next = next.expect("a second replica");

    // Two long streams on the owner (100 tokens x 50 ms = 5 s each, a wide window on a loaded machine).
    let holds: Vec<_> = (0..2)
        .map(|i| {
            let client = w.client.clone();
            let url = w.envoy.url("/v1/chat/completions");
            let body = chat_with(&sys, &format!("hold {i}"), 100, true);
            std::thread::spawn(move || {
                let t0 = Instant::now();
                let mut s = client.post_streaming(&url, &body).expect("hold request");
                s.first_chunk().expect("first chunk");
                let first_chunk_after = t0.elapsed();
                let reply = s.finish().expect("hold body");
                (reply, first_chunk_after)
            })
        })
        .collect();
    let held = wait_for(Duration::from_secs(5), || {
        (w.envoy.stats().in_flight(&slow_addr) == 2).then_some(())
    });
    assert!(
        held.is_some(),
        "owner never showed 2 in flight:\n{}",
        w.envoy.stats().dump("in_flight")
    );
    // The replica's own count agrees with the filter's gauge.
    let running = wait_for(Duration::from_secs(3), || {
        (w.fleet.replicas[0].metric("vllm:num_requests_running") == Some(2.0)).then_some(())
    });
    assert!(
        running.is_some(),
        "owner replica does not report 2 running requests"
    );

    for i in 0..6 {
        let reply = w.chat(&chat(&sys, &format!("while busy {i}")));
        assert_eq!(reply.status, 200, "{}", reply.body);
        assert_eq!(
            w.served_by(&reply),
            next,
            "request {i} during the hold did not spill to the ring successor"
        );
    }
    let spilled: Vec<_> = w
        .fleet
        .by_addr(&next)
        .model_requests()
        .into_iter()
        .map(|r| r["headers"]["x-prefix-router-decision"].clone())
        .collect();
    assert_eq!(
        spilled,
        vec![json!("spill"); 6],
        "decision header on the spill target"
    );

    for h in holds {
        let (reply, first_chunk_after) = h.join().expect("hold thread");
        assert_eq!(reply.status, 200, "{}", reply.body);
        assert_eq!(
            w.served_by(&reply),
            slow_addr,
            "held stream not on the owner"
        );
        assert!(
            reply.elapsed >= Duration::from_secs(3),
            "hold finished too early ({:?}): the owner was not slow",
            reply.elapsed
        );
        assert!(
            first_chunk_after < Duration::from_millis(1500),
            "first stream bytes after {first_chunk_after:?} of {:?}: response buffered?",
            reply.elapsed
        );
        assert!(
            reply.body.contains("data:"),
            "not an SSE body: {}",
            reply.body
        );
    }

    w.envoy.wait_idle();
    let back = w.chat(&chat(&sys, "after the hold"));
    assert_eq!(
        w.served_by(&back),
        slow_addr,
        "prefix did not return to its owner"
    );

    let s = w.envoy.wait_idle();
    assert_eq!(s.branch("spill"), 6, "{}", s.dump("prefix_router.branch"));
    assert_eq!(s.branch("hit"), 3, "{}", s.dump("prefix_router.branch"));
    assert_eq!(s.branch_total(), 9);
}

/// 6 threads x 20 mixed requests at once (chat, completions, raw, GET, malformed JSON,
/// streams the client abandons after the first chunk): the per-endpoint in-flight gauges
/// rise while requests run and return to 0 afterwards, and both the branch and the
/// source counters add up to the number of requests.
#[test]
fn in_flight_counters_return_to_zero_and_stats_add_up() {
    let opts = ReplicaOpts {
        decode_ms_per_token: 3.0,
        ..ReplicaOpts::default()
    };
    let w = World::start("counters", &vec![opts; 3], |c| c);
    let endpoints = w.fleet.endpoints();

    let stop = Arc::new(AtomicBool::new(false));
    let peak = Arc::new(AtomicU64::new(0));
    let sampler = {
        let (stop, peak) = (stop.clone(), peak.clone());
        let admin = format!(
            "http://127.0.0.1:{}/stats?filter=in_flight",
            w.envoy.admin_port
        );
        let client = crate::harness::Client::new(Duration::from_secs(2));
        let eps = endpoints.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                if let Ok(r) = client.get(&admin) {
                    let s = crate::harness::Stats::parse(&r.body);
                    let sum: u64 = eps.iter().map(|e| s.in_flight(e)).sum();
                    peak.fetch_max(sum, Ordering::SeqCst);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };

    let threads: Vec<_> = (0..6)
        .map(|t| {
            let client = w.client.clone();
            let base = w.envoy.url("");
            std::thread::spawn(move || {
                let sys = text(&format!("load-{t}"), 1500);
                for j in 0..20 {
                    let chat_url = format!("{base}/v1/chat/completions");
                    match j % 6 {
                        0 => {
                            let r = client
                                .post_json(&chat_url, &chat_with(&sys, &format!("{j}"), 20, false));
                            assert_eq!(r.expect("chat").status, 200);
                        }
                        1 => {
                            let r = client
                                .post_json(&format!("{base}/v1/completions"), &completion(&sys));
                            assert_eq!(r.expect("completion").status, 200);
                        }
                        2 => {
                            let r = client.post(
                                &chat_url,
                                sys.as_bytes(),
                                &[("content-type", "text/plain")],
                            );
                            assert!(r.expect("raw").replica().is_some());
                        }
                        3 => {
                            let r = client.get(&format!("{base}/health"));
                            assert_eq!(r.expect("get").status, 200);
                        }
                        4 => {
                            let r =
                                client.post_json(&chat_url, r#"{"model":"m","messages":[{"role":"#);
                            assert!(r.expect("malformed").replica().is_some());
                        }
                        _ => {
                            let mut s = client
                                .post_streaming(&chat_url, &chat_with(&sys, "abandon", 200, true))
                                .expect("stream");
                            s.first_chunk().expect("first chunk");
                            drop(s); // client goes away mid-stream
                        }
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("client thread");
    }
    stop.store(true, Ordering::SeqCst);
    sampler.join().expect("sampler");

    let s = w.envoy.wait_idle();
    let total = 6 * 20;
    assert!(
        peak.load(Ordering::SeqCst) > 0,
        "in-flight gauges never rose above 0"
    );
    assert_eq!(
        s.branch_total(),
        total,
        "branches:\n{}",
        s.dump("prefix_router.branch")
    );
    assert_eq!(
        s.source_total(),
        total,
        "sources:\n{}",
        s.dump("prefix_router.source")
    );
    let per_thread = |kinds: &[u64]| -> u64 {
        (0..20u64).filter(|j| kinds.contains(&(j % 6))).count() as u64 * 6
    };
    assert_eq!(s.source("malformed"), per_thread(&[4]));
    assert_eq!(s.source("none"), per_thread(&[3]));
    assert_eq!(s.branch("bad_input"), per_thread(&[4]));
    assert_eq!(s.branch("no_key"), per_thread(&[3]));
}
