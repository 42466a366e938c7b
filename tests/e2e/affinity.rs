//! The `affinity` strategy (the default): longest known prefix through the shared
//! index, across Envoy worker VMs, and the cost model learning from streamed responses.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::{json, Value};

use crate::harness::client::Client;
use crate::harness::workload::{chat_with, text, MODEL};
use crate::harness::{ReplicaOpts, World};

/// A conversation's body after `turns` user turns (and the assistant answers between).
fn conversation(tag: &str, turns: usize, stream: bool) -> String {
    let mut messages = vec![json!({"role": "system", "content": text(tag, 600)})];
    for t in 0..turns {
        messages.push(json!({"role": "user", "content": format!("[{tag}] question {t}: {}", "why is that so? ".repeat(30))}));
        if t + 1 < turns {
            messages.push(json!({"role": "assistant", "content": format!("[{tag}] answer {t}: {}", "because of the rules. ".repeat(25))}));
        }
    }
    json!({"model": MODEL, "messages": messages, "max_tokens": 4, "stream": stream}).to_string()
}

fn cached_tokens(body: &str) -> u64 {
    let v: Value = serde_json::from_str(body).unwrap_or(Value::Null);
    v["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0)
}

/// Eight conversations of five turns, interleaved. Every turn's text grows past
/// the previous one (so a fixed-length key of the whole prompt would change every
/// turn), yet each conversation stays on one replica: turn 1 is `cold` (ring
/// placement), turns 2–5 are `hit` (the index knows the earlier turns), and the
/// replica's own cache reports cached tokens for them. The conversations spread
/// over several replicas.
#[test]
fn growing_conversations_stay_on_their_replica() {
    let w = World::start("affinity-chat", &World::replicas(4), |c| {
        c.with("strategy", json!("affinity"))
    });
    let mut placed: BTreeMap<usize, BTreeSet<String>> = BTreeMap::new();
    for turn in 1..=5 {
        for conv in 0..8 {
            let reply = w.chat(&conversation(&format!("conv{conv}"), turn, false));
            assert_eq!(reply.status, 200, "conv {conv} turn {turn}: {}", reply.body);
            let decision = reply.header("x-prefix-router-decision").map(str::to_string);
            // The decision header reaches the upstream, not the client: read it
            // from the replica's request log instead.
            let _ = decision;
            placed.entry(conv).or_default().insert(w.served_by(&reply));
            if turn > 1 {
                assert!(
                    cached_tokens(&reply.body) > 100,
                    "conv {conv} turn {turn}: the replica reused nothing: {}",
                    reply.body
                );
            }
        }
    }
    for (conv, replicas) in &placed {
        assert_eq!(replicas.len(), 1, "conversation {conv} moved: {replicas:?}");
    }
    let used: BTreeSet<&String> = placed.values().flatten().collect();
    assert!(used.len() >= 2, "8 conversations on one replica: {used:?}");

    let s = w.envoy.wait_idle();
    assert_eq!(s.branch("cold"), 8, "{}", s.dump("prefix_router"));
    assert_eq!(s.branch("hit"), 32, "{}", s.dump("prefix_router"));
    assert_eq!(s.branch_total(), 40);
    for ep in w.fleet.endpoints() {
        assert_eq!(s.in_flight(&ep), 0, "{ep} still counted in flight");
    }
    // Upstreams saw the decision header, never the target header.
    let mut seen = BTreeMap::new();
    for (_, r) in w.fleet.all_model_requests() {
        let d = r["headers"]["x-prefix-router-decision"]
            .as_str()
            .unwrap_or("-")
            .to_string();
        *seen.entry(d).or_insert(0) += 1;
        assert!(r["headers"].get("x-gateway-destination-endpoint").is_none());
    }
    assert_eq!(seen.get("hit"), Some(&32), "{seen:?}");
}

/// Streamed responses teach the cost model: after a few streams the learned
/// prefill price (gauge, µs per 1000 uncached tokens) is published and differs
/// from the configured starting price, and the mean first-token-to-end time
/// (gauge, ms: the slot wait's run time) is published.
#[test]
fn streamed_responses_teach_the_cost_model() {
    let slow = ReplicaOpts {
        prefill_us_per_token: 400.0,
        decode_ms_per_token: 5.0,
        ..ReplicaOpts::default()
    };
    let w = World::start("affinity-cost", &[slow.clone(), slow.clone(), slow], |c| {
        c.with("strategy", json!("affinity"))
            .with("prefill_ms_per_ktok", json!(5.0))
    });
    for i in 0..12 {
        let reply = w.chat(&conversation(&format!("cost{i}"), 1 + i % 3, true));
        assert_eq!(reply.status, 200, "stream {i}: {}", reply.body);
        assert!(
            reply.body.contains("data: "),
            "not a stream: {}",
            reply.body
        );
    }
    let s = w.envoy.wait_idle();
    let price = s.find("prefix_router.cost.prefill_us_per_ktok");
    assert!(
        matches!(price, Some(p) if p > 0 && p != 5_000),
        "learned prefill price not published or unchanged: {price:?}\n{}",
        s.dump("prefix_router.cost")
    );
    // The streams' first token to end (their decode), learned at their end.
    let run = s.find("prefix_router.cost.run_ms");
    assert!(
        matches!(run, Some(ms) if ms > 0),
        "run time not published: {run:?}\n{}",
        s.dump("prefix_router.cost")
    );
}

/// A streamed prompt's index entry stays *pending* until its first token (streaming
/// servers send their headers before the prefill), and a repeat that arrives well into
/// that prefill waits for it on the holder (`pending_progress`) instead of prefilling
/// the prompt again elsewhere. 3 replicas at 1 ms per prompt token; the router's
/// prices fixed at the same 1 000 ms per 1 000 tokens, budget 500 ms, `load_factor` 1
/// (one request in flight puts the holder over the relative bound, so its queue is
/// priced). The repeat comes 1.2 s into a ~3 s prefill: the holder's queue (3 s) is
/// dearer than the budget, so without the rule, or with the entry confirmed at the
/// headers, it spills.
#[test]
fn a_repeat_waits_for_a_streamed_prefill_under_way() {
    let slow = ReplicaOpts {
        prefill_us_per_token: 1000.0,
        ..ReplicaOpts::default()
    };
    let w = World::start(
        "affinity-pending",
        &[slow.clone(), slow.clone(), slow],
        |c| {
            c.with("strategy", json!("affinity"))
                .with("learn_costs", json!(false))
                .with("prefill_ms_per_ktok", json!(1000.0))
                .with("routing_budget_ms", json!(500.0))
                .with("load_factor", json!(1.0))
        },
    );
    let doc = text("pending-doc", 12_000);
    let body = |stream: bool| chat_with(&doc, "summarise the document", 4, stream);
    let t0 = std::time::Instant::now();
    let mut first = w
        .client
        .post_streaming(&w.envoy.url("/v1/chat/completions"), &body(true))
        .expect("first request");
    assert_eq!(first.status, 200);
    let holder = first
        .headers
        .iter()
        .find(|(k, _)| k == "x-replica-id")
        .map(|(_, v)| v.clone())
        .expect("x-replica-id");
    std::thread::sleep(Duration::from_millis(1200));
    let sent = t0.elapsed();
    let repeat = std::thread::spawn({
        let client = Client::new(Duration::from_secs(30));
        let url = w.envoy.url("/v1/chat/completions");
        let b = body(false);
        move || client.post_json(&url, &b)
    });
    assert!(first.first_chunk().expect("first token") > 0);
    let ttft = t0.elapsed();
    assert!(
        ttft > sent + Duration::from_millis(500),
        "the prefill ({ttft:?}) must still run when the repeat is sent ({sent:?})"
    );
    let _ = first.finish();
    let repeat = repeat.join().expect("repeat thread").expect("repeat");
    assert_eq!(repeat.status, 200, "{}", repeat.body);
    assert_eq!(
        repeat.replica(),
        Some(holder.as_str()),
        "the repeat left the holder:\n{}",
        w.envoy.log_tail(2000)
    );
    let s = w.envoy.wait_idle();
    assert_eq!(
        s.get("prefix_router.branch.spill"),
        0,
        "{}",
        s.dump("branch")
    );
}
