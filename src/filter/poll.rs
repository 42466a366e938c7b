//! The admin poll, run by whichever VM holds the lease.
//!
//! Every root context ticks every `refresh_ms`. On a tick it takes or renews
//! the lease (`lease` key, CAS, 3 periods) and, if it holds it and no poll of
//! its own is outstanding, dispatches `GET /clusters?format=json` to
//! `admin_cluster` (≈ 1 ms on loopback). The response is applied by
//! [`crate::cluster::sync::apply_admin`]: membership snapshot, recovered
//! hosts' down marks cleared, in-flight counts reconciled with `rq_active`.
//! A failed or timed-out poll changes nothing (counted in
//! `prefix_router.cluster.poll_failed`); routing goes on with the last view.
//!
//! With `engine`, the lease holder also scrapes every member's
//! `metrics_path` every `engine.refresh_ms`: one `dispatch_http_call` per host
//! through `cluster` with the target header naming that host (override_host
//! sends it there), parsed by [`crate::engine::parse_metrics`] and stored in
//! the `engine` key ([`crate::cluster::engines::EngineTable`]) with this
//! Envoy's in-flight count of the host at that moment (one more get), which
//! makes the load live ([`crate::engine::load`]). A failed
//! scrape is counted (`prefix_router.engine.scrape_failed`) and its host's
//! sample goes stale; requests never wait for a scrape.

use super::host::{self, HostShared, BUFFER_HTTP_CALL_RESPONSE_BODY};
use super::root::Plugin;
use crate::cluster::engines::{EngineTable, Stored};
use crate::cluster::sync::apply_admin;
use crate::cluster::tables::{addr_hash, try_lease};
use crate::config::Discovery;
use crate::engine::parse_metrics;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::time::Duration;

/// Poll state of one VM.
#[derive(Default)]
pub struct Poller {
    /// Lease owner id of this VM (random at configure).
    pub owner: u64,
    /// Token of the outstanding admin call.
    pending: Cell<Option<u32>>,
    /// When the outstanding call was sent (ms), to forget a lost one.
    sent_ms: Cell<u64>,
    /// Outstanding scrapes: token → (host, sent at ms).
    scrapes: RefCell<HashMap<u32, (String, u64)>>,
    /// Last scrape round (ms).
    scraped_ms: Cell<u64>,
    /// This VM held the lease at its last tick.
    leader: Cell<bool>,
}

impl Poller {
    /// A poller with lease owner id `owner`.
    pub fn new(owner: u64) -> Poller {
        Poller {
            owner,
            ..Poller::default()
        }
    }

    /// On tick: poll if this VM holds the lease.
    pub fn tick(&self, p: &Plugin, d: &Discovery) {
        let now = host::now_nanos() / 1_000_000;
        let period = u64::from(d.refresh_ms);
        if self.leader.get() {
            self.scrape(p, d, now);
        }
        if now.saturating_sub(self.sent_ms.get()) < period {
            return; // ticks run at the faster of the two periods
        }
        if self.pending.get().is_some() && now.saturating_sub(self.sent_ms.get()) < 3 * period {
            return;
        }
        self.pending.set(None);
        match try_lease(&HostShared, &p.keys, self.owner, now, 3 * period) {
            Ok(true) => self.leader.set(true),
            Ok(false) => {
                self.leader.set(false);
                return;
            }
            Err(_) => {
                p.stats.poll_failed();
                return;
            }
        }
        let headers = vec![
            (":method", "GET"),
            (":path", "/clusters?format=json"),
            (":authority", "envoy-admin"),
        ];
        let timeout = Duration::from_millis(period.clamp(20, 5000));
        // The SDK registers the token so the response reaches this root context.
        match proxy_wasm::hostcalls::dispatch_http_call(
            &d.admin_cluster,
            headers,
            None,
            vec![],
            timeout,
        ) {
            Ok(token) => {
                self.pending.set(Some(token));
                self.sent_ms.set(now);
            }
            Err(e) => {
                log::warn!(
                    "admin poll: cannot call cluster {:?}: {e:?}",
                    d.admin_cluster
                );
                p.stats.poll_failed();
            }
        }
    }

    /// Scrape every member's metrics if a round is due.
    fn scrape(&self, p: &Plugin, d: &Discovery, now: u64) {
        let Some(e) = &p.config().engine else { return };
        let period = u64::from(e.refresh_ms);
        if now.saturating_sub(self.scraped_ms.get()) < period {
            return;
        }
        self.scraped_ms.set(now);
        let Ok(mut scrapes) = self.scrapes.try_borrow_mut() else {
            return;
        };
        // Forget scrapes lost for 3 periods (the host's sample goes stale).
        scrapes.retain(|_, (_, sent)| now.saturating_sub(*sent) < 3 * period);
        let view = p.follower.current(&HostShared, &p.keys);
        let target = p.config().target_header.as_str();
        let timeout = Duration::from_millis(period.clamp(20, 5000));
        for addr in view.endpoints() {
            if scrapes.values().any(|(a, _)| a == addr) {
                continue;
            }
            let headers = vec![
                (":method", "GET"),
                (":path", e.metrics_path.as_str()),
                (":authority", addr.as_str()),
                (target, addr.as_str()),
            ];
            match proxy_wasm::hostcalls::dispatch_http_call(
                &d.cluster,
                headers,
                None,
                vec![],
                timeout,
            ) {
                Ok(token) => {
                    scrapes.insert(token, (addr.clone(), now));
                }
                Err(_) => p.stats.scrape_failed(),
            }
        }
    }

    /// A scrape response: parse and store, or count the failure.
    fn scraped(&self, p: &Plugin, token: u32, body_size: usize) -> bool {
        let Some((addr, _)) = self
            .scrapes
            .try_borrow_mut()
            .ok()
            .and_then(|mut s| s.remove(&token))
        else {
            return false;
        };
        let status = host::http_call_response_header(":status").ok().flatten();
        let body = match (
            status.as_deref(),
            host::buffer(BUFFER_HTTP_CALL_RESPONSE_BODY, 0, body_size),
        ) {
            (Some(b"200"), Ok(Some(b))) => b,
            _ => {
                p.stats.scrape_failed();
                return true;
            }
        };
        let sample = parse_metrics(&body);
        let now = host::now_nanos() / 1_000_000;
        let view = p.follower.current(&HostShared, &p.keys);
        let members: Vec<u64> = view.endpoints().iter().map(|a| addr_hash(a)).collect();
        let hash = addr_hash(&addr);
        let entry = Stored {
            hash,
            time_ms: now,
            own: EngineTable::own_count(&HostShared, &p.keys, hash),
            sample,
        };
        match EngineTable::store(&HostShared, &p.keys, &entry, &members) {
            Ok(()) => p.stats.scraped(),
            Err(_) => p.stats.scrape_failed(),
        }
        true
    }

    /// A `dispatch_http_call` response. True if it was this poller's.
    pub fn response(&self, p: &Plugin, d: &Discovery, token: u32, body_size: usize) -> bool {
        if self.pending.get() != Some(token) {
            return self.scraped(p, token, body_size);
        }
        self.pending.set(None);
        let status = host::http_call_response_header(":status").ok().flatten();
        if status.as_deref() != Some(b"200") {
            log::warn!(
                "admin poll: status {:?}",
                status.map(|s| String::from_utf8_lossy(&s).into_owned())
            );
            p.stats.poll_failed();
            return true;
        }
        let body = match host::buffer(BUFFER_HTTP_CALL_RESPONSE_BODY, 0, body_size) {
            Ok(Some(b)) => b,
            _ => {
                p.stats.poll_failed();
                return true;
            }
        };
        // This VM's waiting releases first: the reconcile lowers counts to
        // `rq_active`, which no longer counts those requests.
        super::local::flush_releases(p);
        let now = host::now_nanos() / 1_000_000;
        let applied = apply_admin(&HostShared, &p.keys, &body, &d.cluster, now);
        // Queued-prefill tokens of hosts with nothing in flight are leaks (a
        // worker that died between routing and the first byte): drop them.
        if crate::cluster::queued::reconcile(&HostShared, &p.keys).is_err() {
            p.stats.poll_failed();
        }
        super::local::marks_written(); // recovered hosts' marks may be cleared
        match applied {
            Ok(o) => {
                if o.changed {
                    log::info!(
                        "cluster {}: generation {} with {} hosts ({} available)",
                        d.cluster,
                        o.generation,
                        o.members,
                        o.available
                    );
                }
                p.stats.polled(&o);
            }
            Err(e) => {
                log::warn!("admin poll: {e}");
                p.stats.poll_failed();
            }
        }
        true
    }
}
