//! Envoy stats of the filter. Names come from [`Branch::as_str`] and
//! [`KeySource::as_str`], so stats, the decision header and logs agree.
//!
//! Counters: `prefix_router.branch.<branch>`, `prefix_router.source.<source>`,
//! `prefix_router.routing_id.rejected`, `prefix_router.upstream.mismatch`,
//! `prefix_router.error.<host_call>`; per endpoint (`.`/`:` → `_`):
//! `prefix_router.endpoint.<ep>.routed` (counter) and
//! `prefix_router.endpoint.<ep>.in_flight` (gauge); `affinity` prices learned
//! by the last worker that observed a stream: `prefix_router.cost.prefill_us_per_ktok`
//! and `prefix_router.cost.wait_us_per_request` (gauges).
//! Envoy exposes wasm-defined stats as they are named here (Prometheus:
//! `/stats/prometheus` lists them with `.` → `_`).

use super::host::{self, MetricKind};
use crate::decision::{Branch, KeySource};

/// Metric ids of one VM.
pub struct Stats {
    branch: Vec<Option<u32>>,
    source: Vec<Option<u32>>,
    routing_id_rejected: Option<u32>,
    upstream_mismatch: Option<u32>,
    error_shared_data: Option<u32>,
    error_header: Option<u32>,
    error_body: Option<u32>,
    routed: Vec<Option<u32>>,
    in_flight: Vec<Option<u32>>,
    prefill_us_per_ktok: Option<u32>,
    wait_us_per_request: Option<u32>,
}

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
    /// Define every metric for `endpoints`.
    pub fn define(endpoints: &[String]) -> Stats {
        let c = MetricKind::Counter;
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
            routed: endpoints
                .iter()
                .map(|e| {
                    define(
                        c,
                        &format!("prefix_router.endpoint.{}.routed", endpoint_label(e)),
                    )
                })
                .collect(),
            prefill_us_per_ktok: define(
                MetricKind::Gauge,
                "prefix_router.cost.prefill_us_per_ktok",
            ),
            wait_us_per_request: define(
                MetricKind::Gauge,
                "prefix_router.cost.wait_us_per_request",
            ),
            in_flight: endpoints
                .iter()
                .map(|e| {
                    define(
                        MetricKind::Gauge,
                        &format!("prefix_router.endpoint.{}.in_flight", endpoint_label(e)),
                    )
                })
                .collect(),
        }
    }

    fn bump(id: Option<u32>) {
        if let Some(id) = id {
            host::increment_metric(id, 1);
        }
    }

    /// Count one decision.
    pub fn decision(&self, branch: Branch, source: KeySource, endpoint: usize) {
        let b = Branch::ALL.iter().position(|x| *x == branch);
        let s = KeySource::ALL.iter().position(|x| *x == source);
        Self::bump(b.and_then(|i| self.branch.get(i).copied().flatten()));
        Self::bump(s.and_then(|i| self.source.get(i).copied().flatten()));
        Self::bump(self.routed.get(endpoint).copied().flatten());
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
                host::record_metric(id, (ms * 1000.0).max(0.0) as u64);
            }
        }
    }

    /// Publish an endpoint's in-flight count.
    pub fn in_flight(&self, endpoint: usize, value: u32) {
        if let Some(id) = self.in_flight.get(endpoint).copied().flatten() {
            host::record_metric(id, u64::from(value));
        }
    }
}
