//! KubeAI `PrefixHash`: consistent hashing with bounded loads (CHWBL).
//!
//! Source: `substratusai/kubeai` `internal/loadbalancer/balance_chwbl.go`.
//! Key = xxhash64 of the first `prefixCharLength` (100) characters of the
//! first user message; ring of `replication` (256) points per endpoint; walk
//! clockwise from the key and take the first endpoint with
//! `load + 1 ≤ (totalInFlight + 1) / n × meanLoadFactor` (any endpoint when
//! nothing is in flight); if none qualifies, the first endpoint of the walk.
//! Load = the proxy's own in-flight counts. (xxh3 instead of xxhash64 for the
//! key and ring points: the distribution is the same.)

use prefix_router::ring::HashRing;

use super::{endpoints, Policy, Routed, View};
use crate::engine::SimRequest;

/// The KubeAI balancer.
pub struct Chwbl {
    ring: HashRing,
    load_factor: f64,
}

impl Chwbl {
    /// `n` endpoints, `meanLoadFactor`, `replication`.
    pub fn new(n: usize, load_factor: f64, replication: u32) -> Chwbl {
        Chwbl {
            ring: HashRing::build(&endpoints(n), replication),
            load_factor,
        }
    }
}

/// KubeAI's `chwblLoadOK`.
pub fn load_ok(load: u32, total: u32, n: usize, factor: f64) -> bool {
    if total == 0 {
        return true;
    }
    let avg = f64::from(total + 1) / n as f64;
    f64::from(load) + 1.0 <= avg * factor
}

impl Policy for Chwbl {
    fn route(&mut self, _idx: u32, req: &SimRequest, view: &View<'_>) -> Routed {
        let total: u32 = view.in_flight.iter().sum();
        let n = view.in_flight.len();
        let mut first = None;
        for c in self.ring.candidates(req.keys.kubeai) {
            if first.is_none() {
                first = Some(c);
            }
            if load_ok(view.in_flight[c], total, n, self.load_factor) {
                return Routed {
                    replica: c,
                    spill: Some(c) != first,
                };
            }
        }
        Routed {
            replica: first.unwrap_or(0),
            spill: false,
        }
    }
}
