//! Agreement: independent Envoys place every prefix the same way, with no shared state.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::harness::workload::{chat, text};
use crate::harness::{workdir, Client, Envoy, EnvoyConfig, Fleet, ReplicaOpts};

/// Two Envoy processes over the same 4 replicas, the second with its endpoint lists
/// written in reverse order: each of 40 prefixes lands on the same replica through
/// either, and the prefixes use at least 3 replicas.
#[test]
fn two_envoys_send_each_prefix_to_the_same_replica() {
    let dir = workdir("two-envoys");
    let fleet = Fleet::start(&dir, 4, &ReplicaOpts::default());
    let eps = fleet.endpoints();
    let mut rev = eps.clone();
    rev.reverse();
    let a = Envoy::start(&dir, "envoy-a", &EnvoyConfig::prefix(&eps));
    let b = Envoy::start(&dir, "envoy-b", &EnvoyConfig::prefix(&rev));
    let client = Client::new(Duration::from_secs(15));
    let mut used = BTreeSet::new();
    for i in 0..40 {
        let body = chat(&text(&format!("agree-{i}"), 900), &format!("question {i}"));
        let via = |e: &Envoy| {
            let r = client
                .post_json(&e.url("/v1/chat/completions"), &body)
                .expect("request");
            assert_eq!(r.status, 200, "{}", r.body);
            r.replica().expect("x-replica-id").to_string()
        };
        let (ra, rb) = (via(&a), via(&b));
        assert_eq!(ra, rb, "prefix {i}: envoy-a chose {ra}, envoy-b chose {rb}");
        used.insert(ra);
    }
    assert!(used.len() >= 3, "40 prefixes used only {used:?}");
    assert_eq!(a.wait_idle().branch("hit"), 40);
    assert_eq!(b.wait_idle().branch("hit"), 40);
}
