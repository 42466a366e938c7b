//! Envoy stats of the filter. Names come from [`Branch::as_str`] and
//! [`KeySource::as_str`], so stats, the decision header and logs agree.
//!
//! Counters: `prefix_router.branch.<branch>`, `prefix_router.source.<source>`,
//! `prefix_router.routing_id.rejected`, `prefix_router.upstream.mismatch`,
//! `prefix_router.error.<host_call>`; per endpoint (`.`/`:` → `_`):
//! `prefix_router.endpoint.<ep>.routed` (counter) and
//! `prefix_router.endpoint.<ep>.in_flight` (gauge); `affinity` prices learned
//! by the last worker that observed a stream: `prefix_router.cost.prefill_us_per_ktok`,
//! `prefix_router.cost.wait_us_per_request` and the mean first-token-to-end
//! time `prefix_router.cost.run_ms` (gauges). Per-endpoint stats
//! are defined on first use of an address (bounded by the hosts ever seen).
//! Live cluster view: `prefix_router.cluster.poll_ok`, `.poll_failed`,
//! `.reconciled` (in-flight counts corrected to `rq_active`), `.marked_down`
//! (passive health), `.no_members` (counters), `.generation`, `.members`,
//! `.available` (gauges); with `engine`: `.engine_scraped`,
//! `.engine_scrape_failed`, and per request `.engine_stale` (hosts without a
//! fresh sample), `.engine_saturated` (hosts left out), `.engine_lora`
//! (requests narrowed to an adapter tier).
//! Counter increments and gauge writes are batched in the VM and published
//! at the end of a request or on a tick ([`super::batch`]): a request's
//! counts appear in `/stats` when it ends, not when it is routed.
//! Envoy exposes wasm-defined stats as they are named here (Prometheus:
//! `/stats/prometheus` lists them with `.` → `_`).

use super::batch;
use super::host::{self, MetricKind};
use crate::cluster::engines::Effect;
use crate::cluster::sync::PollOutcome;
use crate::decision::{Branch, KeySource};
use std::cell::RefCell;
use std::collections::HashMap;

/// (routed counter, in-flight gauge) ids of one address.
type HostIds = (Option<u32>, Option<u32>);

/// Hasher of the per-address table: xxh3 of the address bytes. The std
/// default (SipHash-1-3, keyed against flooding) costs a few hundred wasm
/// instructions per lookup, 2–3 lookups per request; the keys here are
/// member addresses and the served `upstream.address` (Envoy's, never a
/// client's), so flooding is not a concern.
#[derive(Default)]
struct AddrHasher(u64);

impl std::hash::Hasher for AddrHasher {
    fn write(&mut self, bytes: &[u8]) {
        self.0 = xxhash_rust::xxh3::xxh3_64_with_seed(bytes, self.0);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

type AddrMap<V> = HashMap<String, V, std::hash::BuildHasherDefault<AddrHasher>>;

/// Metric ids of one VM.
pub struct Stats {
    branch: Vec<Option<u32>>,
    source: Vec<Option<u32>>,
    routing_id_rejected: Option<u32>,
    upstream_mismatch: Option<u32>,
    error_shared_data: Option<u32>,
    error_header: Option<u32>,
    error_body: Option<u32>,
    /// Per address: (routed counter, in-flight gauge).
    hosts: RefCell<AddrMap<HostIds>>,
    cluster: [Option<u32>; 13],
    prefill_us_per_ktok: Option<u32>,
    wait_us_per_request: Option<u32>,
    run_ms: Option<u32>,
}

/// `prefix_router.cluster.*` stats: (is a counter, name).
const CLUSTER_STATS: [(bool, &str); 13] = [
    (true, "poll_ok"),
    (true, "poll_failed"),
    (true, "reconciled"),
    (true, "marked_down"),
    (true, "no_members"),
    (false, "generation"),
    (false, "members"),
    (false, "available"),
    (true, "engine_scraped"),
    (true, "engine_scrape_failed"),
    (true, "engine_stale"),
    (true, "engine_saturated"),
    (true, "engine_lora"),
];
const C_POLL_OK: usize = 0;
const C_POLL_FAILED: usize = 1;
const C_RECONCILED: usize = 2;
const C_MARKED_DOWN: usize = 3;
const C_NO_MEMBERS: usize = 4;
const C_GENERATION: usize = 5;
const C_MEMBERS: usize = 6;
const C_AVAILABLE: usize = 7;
const C_SCRAPED: usize = 8;
const C_SCRAPE_FAILED: usize = 9;
const C_STALE: usize = 10;
const C_SATURATED: usize = 11;
const C_LORA: usize = 12;

/// Errors counted in `prefix_router.error.<what>`.
#[derive(Debug, Clone, Copy)]
pub enum HostFailure {
    /// A shared-data call failed (counts may be off; routing continues).
    SharedData,
    /// Setting or reading a header failed.
    Header,
    /// Reading the body failed (routed without key).
    Body,
}

/// Define one metric (a failure is logged; the metric is then not counted).
pub(super) fn define(kind: MetricKind, name: &str) -> Option<u32> {
    match host::define_metric(kind, name) {
        Ok(id) => Some(id),
        Err(e) => {
            log::warn!("cannot define metric {name}: {e}");
            None
        }
    }
}

/// Stat-safe form of an endpoint (`10.0.0.1:8000` → `10_0_0_1_8000`).
pub fn endpoint_label(ep: &str) -> String {
    ep.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

impl Stats {
    /// Define the fixed metrics (per-endpoint ones are defined on first use).
    pub fn define() -> Stats {
        let c = MetricKind::Counter;
        let g = MetricKind::Gauge;
        Stats {
            branch: Branch::ALL
                .iter()
                .map(|b| define(c, &format!("prefix_router.branch.{}", b.as_str())))
                .collect(),
            source: KeySource::ALL
                .iter()
                .map(|s| define(c, &format!("prefix_router.source.{}", s.as_str())))
                .collect(),
            routing_id_rejected: define(c, "prefix_router.routing_id.rejected"),
            upstream_mismatch: define(c, "prefix_router.upstream.mismatch"),
            error_shared_data: define(c, "prefix_router.error.shared_data"),
            error_header: define(c, "prefix_router.error.header"),
            error_body: define(c, "prefix_router.error.body"),
            hosts: RefCell::new(AddrMap::default()),
            cluster: CLUSTER_STATS.map(|(kind, name)| {
                define(
                    if kind { c } else { g },
                    &format!("prefix_router.cluster.{name}"),
                )
            }),
            prefill_us_per_ktok: define(g, "prefix_router.cost.prefill_us_per_ktok"),
            wait_us_per_request: define(g, "prefix_router.cost.wait_us_per_request"),
            run_ms: define(g, "prefix_router.cost.run_ms"),
        }
    }

    /// The (routed, in-flight) metric ids of an address, defined on first use.
    fn host(&self, addr: &str) -> HostIds {
        let Ok(mut hosts) = self.hosts.try_borrow_mut() else {
            return (None, None);
        };
        if let Some(ids) = hosts.get(addr) {
            return *ids; // the common case: no key allocation
        }
        *hosts.entry(addr.to_string()).or_insert_with(|| {
            let label = endpoint_label(addr);
            (
                define(
                    MetricKind::Counter,
                    &format!("prefix_router.endpoint.{label}.routed"),
                ),
                define(
                    MetricKind::Gauge,
                    &format!("prefix_router.endpoint.{label}.in_flight"),
                ),
            )
        })
    }

    /// Define the per-endpoint metrics of every member (gauges start at 0,
    /// so every replica has them before its first request).
    pub fn members(&self, endpoints: &[String]) {
        for e in endpoints {
            self.host(e);
        }
    }

    /// Count a request left unrouted for want of members.
    pub fn no_members(&self) {
        Self::bump(self.cluster[C_NO_MEMBERS]);
    }

    /// Count a passive down mark.
    pub fn marked_down(&self) {
        Self::bump(self.cluster[C_MARKED_DOWN]);
    }

    /// Count a stored engine sample.
    pub fn scraped(&self) {
        Self::bump(self.cluster[C_SCRAPED]);
    }

    /// Count a failed engine scrape.
    pub fn scrape_failed(&self) {
        Self::bump(self.cluster[C_SCRAPE_FAILED]);
    }

    /// Count what the engine view did to one request.
    pub fn engine_effect(&self, e: &Effect) {
        for (i, n) in [
            (C_STALE, e.stale),
            (C_SATURATED, e.saturated),
            (C_LORA, usize::from(e.lora_tier.is_some())),
        ] {
            if let (Some(id), true) = (self.cluster[i], n > 0) {
                batch::add(id, n as i64);
            }
        }
    }

    /// Count a failed admin poll.
    pub fn poll_failed(&self) {
        Self::bump(self.cluster[C_POLL_FAILED]);
    }

    /// Record a successful admin poll.
    pub fn polled(&self, o: &PollOutcome) {
        Self::bump(self.cluster[C_POLL_OK]);
        if let Some(id) = self.cluster[C_RECONCILED] {
            batch::add(id, o.reconciled.len() as i64);
        }
        for (addr, n) in &o.reconciled {
            self.in_flight_now(addr, *n);
        }
        for (i, v) in [
            (C_GENERATION, o.generation),
            (C_MEMBERS, o.members as u64),
            (C_AVAILABLE, o.available as u64),
        ] {
            if let Some(id) = self.cluster[i] {
                batch::gauge(id, v);
            }
        }
    }

    fn bump(id: Option<u32>) {
        if let Some(id) = id {
            batch::add(id, 1);
        }
    }

    /// Count one decision.
    pub fn decision(&self, branch: Branch, source: KeySource, endpoint: &str) {
        let b = Branch::ALL.iter().position(|x| *x == branch);
        let s = KeySource::ALL.iter().position(|x| *x == source);
        Self::bump(b.and_then(|i| self.branch.get(i).copied().flatten()));
        Self::bump(s.and_then(|i| self.source.get(i).copied().flatten()));
        Self::bump(self.host(endpoint).0);
    }

    /// Count an ignored routing id.
    pub fn routing_id_rejected(&self) {
        Self::bump(self.routing_id_rejected);
    }

    /// Count a request served by another host than the primary.
    pub fn upstream_mismatch(&self) {
        Self::bump(self.upstream_mismatch);
    }

    /// Count a failed host call.
    pub fn failure(&self, what: HostFailure) {
        Self::bump(match what {
            HostFailure::SharedData => self.error_shared_data,
            HostFailure::Header => self.error_header,
            HostFailure::Body => self.error_body,
        });
    }

    /// Publish the `affinity` cost model's current prices (this worker's).
    pub fn prices(&self, prefill_ms_per_ktok: f64, wait_ms_per_request: f64) {
        for (id, ms) in [
            (self.prefill_us_per_ktok, prefill_ms_per_ktok),
            (self.wait_us_per_request, wait_ms_per_request),
        ] {
            if let Some(id) = id {
                batch::gauge(id, (ms * 1000.0).max(0.0) as u64);
            }
        }
    }

    /// Publish the `affinity` cost model's mean first-token-to-end time
    /// (this worker's, [`crate::cost::CostModel::run_ms`]).
    pub fn run_time(&self, ms: f64) {
        if let Some(id) = self.run_ms {
            batch::gauge(id, ms.max(0.0) as u64);
        }
    }

    /// Publish an endpoint's in-flight count now (a request took, moved or
    /// released it). Not batched: the value is the count right after this VM's
    /// CAS update, and a VM that published it 100 ms later could overwrite a
    /// newer value published by another worker (a gauge is a set, not a sum).
    /// A metric write is within the noise in the host-call price table.
    pub fn in_flight_now(&self, endpoint: &str, value: u32) {
        if let Some(id) = self.host(endpoint).1 {
            batch::gauge_now(id, u64::from(value));
        }
    }
}
