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

use super::host::{self, HostShared, BUFFER_HTTP_CALL_RESPONSE_BODY};
use super::root::Plugin;
use crate::cluster::sync::apply_admin;
use crate::cluster::tables::try_lease;
use crate::config::Discovery;
use std::cell::Cell;
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
        if self.pending.get().is_some() && now.saturating_sub(self.sent_ms.get()) < 3 * period {
            return;
        }
        self.pending.set(None);
        match try_lease(&HostShared, &p.keys, self.owner, now, 3 * period) {
            Ok(true) => {}
            Ok(false) => return,
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

    /// A `dispatch_http_call` response. True if it was this poller's.
    pub fn response(&self, p: &Plugin, d: &Discovery, token: u32, body_size: usize) -> bool {
        if self.pending.get() != Some(token) {
            return false;
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
        let now = host::now_nanos() / 1_000_000;
        match apply_admin(&HostShared, &p.keys, &body, &d.cluster, now) {
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
