//! Policies that are our routing core as is (`Router::select` with the
//! strategy of their configuration), and Envoy's power-of-two least request.

use prefix_router::{Branch, Loads, Router};

use super::{Policy, Routed, View};
use crate::engine::SimRequest;
use crate::rng::Rng;

/// `Router::select` with the configured strategy. `ticket` is random for
/// `random`, a counter otherwise (round robin, least-request tie rotation),
/// exactly as the filter supplies it.
pub struct Core {
    router: Router,
    key: usize,
    rng: Rng,
    counter: u64,
    spill_least: bool,
}

impl Core {
    /// Wrap `router`; its keys are `Keys::core[key]`. `spill_least`: when
    /// the ring owner is over its threshold, go to the least-loaded replica
    /// (SageMaker: "routes the request to an instance with more available
    /// capacity") instead of the next one on the ring.
    pub fn new(router: Router, key: usize, seed: u64, spill_least: bool) -> Core {
        Core {
            router,
            key,
            rng: Rng::new(seed ^ 0xc0de),
            counter: 0,
            spill_least,
        }
    }
}

impl Policy for Core {
    fn route(&mut self, _idx: u32, req: &SimRequest, view: &View<'_>) -> Routed {
        let ticket = if self.router.config().strategy == prefix_router::Strategy::Random {
            self.rng.next_u64()
        } else {
            self.counter += 1;
            self.counter
        };
        let d = match req.keys.core.get(self.key) {
            Some(k) => self.router.select(k, Loads::new(view.in_flight), ticket),
            None => self.router.select(
                &self.router.key(prefix_router::Body::None, None),
                Loads::new(view.in_flight),
                ticket,
            ),
        };
        let spill = matches!(d.branch, Branch::Spill | Branch::LeastLoaded);
        let replica = if spill && self.spill_least {
            let l = view.in_flight;
            (0..l.len()).min_by_key(|&i| l[i]).unwrap_or(d.primary)
        } else {
            d.primary
        };
        Routed { replica, spill }
    }
}

/// Envoy `LEAST_REQUEST` with the default `choice_count` 2: two distinct
/// random replicas, the one with fewer active requests (the first on a tie).
pub struct PowerOfTwo {
    n: usize,
    rng: Rng,
}

impl PowerOfTwo {
    /// For `n` replicas.
    pub fn new(n: usize, seed: u64) -> PowerOfTwo {
        PowerOfTwo {
            n,
            rng: Rng::new(seed ^ 0x2c),
        }
    }
}

impl Policy for PowerOfTwo {
    fn route(&mut self, _idx: u32, _req: &SimRequest, view: &View<'_>) -> Routed {
        let n = self.n as u64;
        let a = self.rng.below(n) as usize;
        let mut b = self.rng.below(n.saturating_sub(1).max(1)) as usize;
        if self.n > 1 && b >= a {
            b += 1;
        }
        let b = b.min(self.n - 1);
        let pick = if view.in_flight[b] < view.in_flight[a] {
            b
        } else {
            a
        };
        Routed {
            replica: pick,
            spill: false,
        }
    }
}
