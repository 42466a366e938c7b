//! The lifecycle of the live view, generic over [`SharedData`] so it is
//! unit-tested natively: the polling VM applies an admin response
//! ([`apply_admin`]); every worker follows the published snapshot
//! ([`Follower`]); requests mark a failed primary down ([`mark_failed`]).
//!
//! What happens when polls fail: nothing is published, so every worker keeps
//! routing on the last snapshot (or the configured `endpoints` before the
//! first success); the lease expires after 3 periods and another VM takes
//! over; down marks still expire on time. A request never waits for a poll.

use super::admin::{parse_clusters, HostStatus};
use super::shared::{ShareError, SharedData};
use super::tables::{
    addr_hash, publish, read_snapshot, Down, InFlight, Keys, Snapshot, UNAVAILABLE,
};
use super::view::View;
use crate::config::Config;
use std::cell::RefCell;
use std::rc::Rc;

/// How long a passive down mark lasts without a poll saying otherwise:
/// `max(10 s, 5 × refresh_ms)`.
pub fn down_ms(refresh_ms: u32) -> u64 {
    (u64::from(refresh_ms) * 5).max(10_000)
}

/// What one admin poll changed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PollOutcome {
    /// Generation now published.
    pub generation: u64,
    /// The snapshot changed (a new generation was published).
    pub changed: bool,
    /// Members and usable members.
    pub members: usize,
    /// Members without health flags.
    pub available: usize,
    /// In-flight counts lowered to Envoy's `rq_active`: (address, new count).
    pub reconciled: Vec<(String, u32)>,
}

/// Apply one `/clusters?format=json` response: publish the membership (new
/// generation only if it changed), clear the passive down marks of hosts the
/// poll shows recovered (unavailable in the previous snapshot, available now),
/// and lower in-flight counts to Envoy's `rq_active` (repairs lost releases
/// within one period; see [`InFlight::reconcile`]).
///
/// # Errors
/// The document does not parse (nothing is changed), or shared data failed.
pub fn apply_admin<S: SharedData + ?Sized>(
    s: &S,
    k: &Keys,
    json: &[u8],
    cluster: &str,
    now_ms: u64,
) -> Result<PollOutcome, String> {
    let hosts = parse_clusters(json, cluster)?;
    apply_hosts(s, k, &hosts, now_ms).map_err(|e| format!("shared data: {e:?}"))
}

/// [`apply_admin`] after parsing.
///
/// # Errors
/// Shared data failed.
pub fn apply_hosts<S: SharedData + ?Sized>(
    s: &S,
    k: &Keys,
    hosts: &[HostStatus],
    now_ms: u64,
) -> Result<PollOutcome, ShareError> {
    let list: Vec<(String, u8)> = hosts
        .iter()
        .map(|h| (h.addr.clone(), if h.available { 0 } else { UNAVAILABLE }))
        .collect();
    let (snap, old) = publish(s, k, list)?;
    let recovered: Vec<u64> = hosts
        .iter()
        .filter(|h| h.available && old.as_ref().is_some_and(|o| o.unavailable(&h.addr)))
        .map(|h| addr_hash(&h.addr))
        .collect();
    Down::clear(s, k, &recovered, now_ms)?;
    let envoy: Vec<(u64, u32)> = hosts
        .iter()
        .map(|h| (addr_hash(&h.addr), h.rq_active))
        .collect();
    let fixed = InFlight::reconcile(s, k, &envoy)?;
    let reconciled = fixed
        .iter()
        .filter_map(|&(h, _, now)| {
            hosts
                .iter()
                .find(|x| addr_hash(&x.addr) == h)
                .map(|x| (x.addr.clone(), now))
        })
        .collect();
    Ok(PollOutcome {
        generation: snap.generation,
        changed: old.map_or(true, |o| o.generation != snap.generation),
        members: hosts.len(),
        available: hosts.iter().filter(|h| h.available).count(),
        reconciled,
    })
}

/// One VM's current [`View`], rebuilt when the published generation changes.
pub struct Follower {
    base: Config,
    view: RefCell<Rc<View>>,
    secret: u64,
}

impl Follower {
    /// Start from the configured `endpoints`.
    pub fn new(base: Config) -> Follower {
        let view = Rc::new(View::from_config(&base));
        Follower {
            base,
            view: RefCell::new(view),
            secret: 0,
        }
    }

    /// Key every view's index slot hash with the process secret
    /// ([`crate::Router::with_index_secret`]).
    pub fn with_index_secret(self, secret: u64) -> Follower {
        let view = Rc::new(View::from_config(&self.base).keyed(secret));
        Follower {
            view: RefCell::new(view),
            secret,
            ..self
        }
    }

    fn build(&self, snap: &Snapshot) -> Rc<View> {
        Rc::new(View::from_snapshot(&self.base, snap).keyed(self.secret))
    }

    /// The configuration (membership-independent fields).
    pub fn config(&self) -> &Config {
        &self.base
    }

    /// The view to route on. Static mode: always the configured endpoints.
    /// Discovery: one get of `members`; rebuild on a new generation; on a
    /// failed read or before the first poll, the last view.
    pub fn current<S: SharedData + ?Sized>(&self, s: &S, k: &Keys) -> Rc<View> {
        let cur = self.view.borrow().clone();
        if self.base.discovery.is_none() {
            return cur;
        }
        let Ok((Some(bytes), _)) = s.get(&k.members) else {
            return cur;
        };
        if Snapshot::generation_of(&bytes) == Some(cur.generation) {
            return cur;
        }
        match Snapshot::decode(&bytes) {
            Some(snap) => {
                let v = self.build(&snap);
                *self.view.borrow_mut() = v.clone();
                v
            }
            None => cur,
        }
    }

    /// Read the snapshot eagerly (after a configuration push: keep the
    /// membership the previous configuration learned).
    pub fn adopt<S: SharedData + ?Sized>(&self, s: &S, k: &Keys) {
        if self.base.discovery.is_some() {
            if let Ok(Some(snap)) = read_snapshot(s, k) {
                *self.view.borrow_mut() = self.build(&snap);
            }
        }
    }
}

/// A request's primary failed (another host served it, or the connection
/// failed): mark it down for every worker until a poll shows it recovered or
/// [`down_ms`] passes.
///
/// # Errors
/// Shared data failed.
pub fn mark_failed<S: SharedData + ?Sized>(
    s: &S,
    k: &Keys,
    addr: &str,
    now_ms: u64,
    refresh_ms: u32,
) -> Result<(), ShareError> {
    Down::mark(s, k, addr_hash(addr), now_ms, now_ms + down_ms(refresh_ms))
}

#[cfg(test)]
mod tests {
    use super::super::shared::MockShared;
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn doc(hosts: &[(&str, u16, bool, u32)]) -> String {
        let hs: Vec<String> = hosts
            .iter()
            .map(|(ip, port, ok, rq)| {
                format!(
                    r#"{{"address":{{"socket_address":{{"address":"{ip}","port_value":{port}}}}},"stats":[{{"name":"rq_active","value":"{rq}"}}],"health_status":{{"failed_active_health_check":{}}}}}"#,
                    !ok
                )
            })
            .collect();
        format!(
            r#"{{"cluster_statuses":[{{"name":"llm","host_statuses":[{}]}}]}}"#,
            hs.join(",")
        )
    }

    fn base() -> Config {
        Config::from_json(br#"{"endpoints":["10.0.0.1:80"],"cluster":"llm","admin_cluster":"a"}"#)
            .unwrap()
    }

    #[test]
    fn poll_publishes_follows_and_survives_failures() {
        let s = MockShared::new();
        let k = Keys::new("t");
        InFlight::init(&s, &k.inflight).unwrap();
        Down::init(&s, &k.down).unwrap();
        let f = Follower::new(base());
        // Before any poll: the bootstrap endpoints.
        assert_eq!(f.current(&s, &k).endpoints(), ["10.0.0.1:80"]);
        let d1 = doc(&[("10.0.0.2", 80, true, 0), ("10.0.0.3", 80, true, 0)]);
        let o = apply_admin(&s, &k, d1.as_bytes(), "llm", 0).unwrap();
        assert_eq!((o.generation, o.changed, o.members), (1, true, 2));
        let v = f.current(&s, &k);
        assert_eq!(v.endpoints(), ["10.0.0.2:80", "10.0.0.3:80"]);
        // Same document: same generation, same Rc (no rebuild).
        assert!(
            !apply_admin(&s, &k, d1.as_bytes(), "llm", 10)
                .unwrap()
                .changed
        );
        assert!(Rc::ptr_eq(&v, &f.current(&s, &k)));
        // A failing poll changes nothing; a failing read keeps the last view.
        assert!(apply_admin(&s, &k, b"<html>", "llm", 20).is_err());
        s.fail_next.set(1);
        assert!(Rc::ptr_eq(&v, &f.current(&s, &k)));
        // A new follower (configuration push) adopts the published membership.
        let g = Follower::new(base());
        g.adopt(&s, &k);
        assert_eq!(g.current(&s, &k).generation, 1);
    }

    #[test]
    fn down_marks_clear_on_recovery_and_counts_reconcile() {
        let s = MockShared::new();
        let k = Keys::new("t");
        InFlight::init(&s, &k.inflight).unwrap();
        Down::init(&s, &k.down).unwrap();
        let a = "10.0.0.2:80";
        apply_admin(
            &s,
            &k,
            doc(&[("10.0.0.2", 80, true, 0)]).as_bytes(),
            "llm",
            0,
        )
        .unwrap();
        // A request saw the primary fail; a release was lost (count 3, Envoy 1).
        mark_failed(&s, &k, a, 1000, 1000).unwrap();
        InFlight::add(&s, &k, addr_hash(a), 3, None).unwrap();
        // The poll still says healthy (health check not run yet): mark stays.
        let o = apply_admin(
            &s,
            &k,
            doc(&[("10.0.0.2", 80, true, 1)]).as_bytes(),
            "llm",
            1500,
        )
        .unwrap();
        assert_eq!(o.reconciled, vec![(a.to_string(), 1)]);
        let (down, _) = Down::read(&s, &k.down).unwrap();
        assert!(down.is_down(addr_hash(a), 1500));
        let (t, _) = InFlight::read(&s, &k.inflight).unwrap();
        assert_eq!(t.get(addr_hash(a)), 1);
        // Health check fails, then passes again: the mark is cleared.
        apply_admin(
            &s,
            &k,
            doc(&[("10.0.0.2", 80, false, 0)]).as_bytes(),
            "llm",
            2000,
        )
        .unwrap();
        apply_admin(
            &s,
            &k,
            doc(&[("10.0.0.2", 80, true, 0)]).as_bytes(),
            "llm",
            3000,
        )
        .unwrap();
        let (down, _) = Down::read(&s, &k.down).unwrap();
        assert!(!down.is_down(addr_hash(a), 3000));
    }

    #[test]
    fn key_count_is_bounded_over_pushes_and_churn() {
        let s = MockShared::new();
        for push in 0..100u32 {
            // A new configuration (another VM generation) each time: same keys.
            let k = Keys::new("plugin");
            InFlight::init(&s, &k.inflight).unwrap();
            Down::init(&s, &k.down).unwrap();
            let f = Follower::new(base());
            f.adopt(&s, &k);
            let hosts: Vec<(String, u16, bool, u32)> = (0..3 + push % 5)
                .map(|i| (format!("10.1.{}.{i}", push % 7), 80, i != 1, i))
                .collect();
            let hs: Vec<(&str, u16, bool, u32)> = hosts
                .iter()
                .map(|(a, p, o, r)| (a.as_str(), *p, *o, *r))
                .collect();
            apply_admin(&s, &k, doc(&hs).as_bytes(), "llm", u64::from(push) * 1000).unwrap();
            let v = f.current(&s, &k);
            mark_failed(&s, &k, v.addr(0).unwrap(), u64::from(push) * 1000, 1000).unwrap();
        }
        assert_eq!(s.key_count(), 3, "{:?}", s.keys()); // members, inflight, down
        let (t, _) = InFlight::read(&s, &Keys::new("plugin").inflight).unwrap();
        assert!(t.entries.len() <= 7, "{t:?}");
    }
}
