//! Replica selection under load.
//!
//! Bounded-load walk (strategies `prefix` and `session`): take the ring owner of
//! the key unless its in-flight count `l` satisfies `l ≥ concurrency_threshold`
//! or `l > load_factor × (mean + 1)`, where `mean` is the mean in-flight count
//! over the available replicas. The `+ 1` is a slack of `load_factor` requests:
//! with the bare `load_factor × mean`, a replica holding a single request is
//! skipped whenever the cluster is lightly loaded (7 replicas, 1 in flight:
//! cap 0.18), which spilled 20–49 % of requests and halved the hit rate in the
//! benchmark; at high load the two are the same. Otherwise walk the ring
//! clockwise to the first
//! acceptable replica ([`Branch::Spill`]); if none is acceptable, take the least
//! loaded, ties broken by ring order ([`Branch::LeastLoaded`]).
//!
//! The secondary (retry) replica is the next available replica on the ring after
//! the primary, so a retry after a dead primary goes where the key would go if
//! the primary were removed from the ring.
//!
//! Cost: O(N) to sum the loads plus the candidate walk (which continues past
//! the primary to find the secondary, so the ring is walked once); no
//! allocation (see [`crate::ring`] for the walk's inline seen-set).

use crate::decision::{Branch, Decision};
use crate::ring::HashRing;

/// The load picture used for one decision.
#[derive(Debug, Clone, Copy)]
pub struct Loads<'a> {
    /// In-flight requests per endpoint (index = endpoint index).
    pub in_flight: &'a [u32],
    /// Optional availability per endpoint (health); `None` = all available.
    pub available: Option<&'a [bool]>,
    /// Requests on an endpoint that one count of `in_flight` stands for: 1
    /// when the counts are the endpoint's (one gateway, an engine's scrape,
    /// peers' counts added), the number of gateways when each counts only
    /// its own requests ([`Loads::scaled`]; read by
    /// [`crate::affinity`]'s spill price, module docs "Own counts").
    per_count: f64,
}

impl<'a> Loads<'a> {
    /// All endpoints available.
    pub fn new(in_flight: &'a [u32]) -> Loads<'a> {
        Loads {
            in_flight,
            available: None,
            per_count: 1.0,
        }
    }

    /// With availability per endpoint (health).
    pub fn with_available(in_flight: &'a [u32], available: &'a [bool]) -> Loads<'a> {
        Loads {
            available: Some(available),
            ..Loads::new(in_flight)
        }
    }

    /// Each count stands for `per_count` requests of its endpoint (below 1
    /// or not a number: 1).
    pub fn scaled(self, per_count: f64) -> Loads<'a> {
        Loads { per_count, ..self }
    }

    /// Requests of an endpoint one count stands for (≥ 1).
    pub fn per_count(&self) -> f64 {
        if self.per_count >= 1.0 {
            self.per_count
        } else {
            1.0
        }
    }

    /// In-flight count of endpoint `i` (0 if unknown).
    pub fn of(&self, i: usize) -> u32 {
        self.in_flight.get(i).copied().unwrap_or(0)
    }

    /// Is endpoint `i` available?
    pub fn is_available(&self, i: usize) -> bool {
        self.available
            .map_or(true, |a| a.get(i).copied().unwrap_or(false))
    }

    /// Do the available endpoints exist? When none is available every endpoint
    /// is treated as available (fail open: Envoy's retries and fallback decide).
    fn effective(self, n: usize) -> Loads<'a> {
        if (0..n).any(|i| self.is_available(i)) {
            self
        } else {
            Loads {
                available: None,
                ..self
            }
        }
    }

    /// Sum of the in-flight counts of the available endpoints among the
    /// first `n`, and how many are available. O(N): a plain slice sum (which
    /// the compiler vectorises) when every endpoint is available.
    pub fn total(&self, n: usize) -> (u64, u64) {
        match self.available {
            None => {
                let counts = self
                    .in_flight
                    .get(..n.min(self.in_flight.len()))
                    .unwrap_or(&[]);
                (counts.iter().map(|&l| u64::from(l)).sum(), n as u64)
            }
            Some(_) => {
                let (mut total, mut count) = (0u64, 0u64);
                for i in (0..n).filter(|&i| self.is_available(i)) {
                    total += u64::from(self.of(i));
                    count += 1;
                }
                (total, count)
            }
        }
    }

    fn mean(&self, n: usize) -> f64 {
        let (total, count) = self.total(n);
        if count == 0 {
            0.0
        } else {
            total as f64 / count as f64
        }
    }
}

/// Load bounds of the bounded-load walk.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// In-flight count at which a replica is skipped.
    pub concurrency_threshold: u32,
    /// Cap relative to the mean in-flight count.
    pub load_factor: f64,
}

/// Bounded-load walk from `key` on `ring`; see the module docs.
pub fn bounded(ring: &HashRing, key: u64, loads: Loads<'_>, bounds: Bounds) -> Decision {
    let n = ring.len();
    let loads = loads.effective(n);
    let cap = bounds.load_factor * (loads.mean(n) + 1.0);
    let accept = |i: usize| {
        let l = loads.of(i);
        loads.is_available(i) && l < bounds.concurrency_threshold && f64::from(l) <= cap
    };
    let mut walk = ring.candidates(key);
    let mut chosen = None;
    let mut first = true;
    let mut least: Option<usize> = None;
    for c in walk.by_ref() {
        if accept(c) {
            chosen = Some((c, if first { Branch::Hit } else { Branch::Spill }));
            break;
        }
        if loads.is_available(c) && least.map_or(true, |b| loads.of(c) < loads.of(b)) {
            least = Some(c);
        }
        first = false;
    }
    let (primary, branch) = match chosen {
        Some(c) => c,
        None => (least.unwrap_or(0), Branch::LeastLoaded),
    };
    // Secondary: the next available replica after the primary in ring order.
    // When the walk stopped at the primary it continues from there; otherwise
    // (least loaded) walk again up to it, then wrap around.
    let after = match chosen {
        Some(_) => walk.find(|&c| loads.is_available(c)),
        None => ring
            .candidates(key)
            .skip_while(|&c| c != primary)
            .skip(1)
            .find(|&c| loads.is_available(c)),
    };
    let secondary = after.or_else(|| {
        ring.candidates(key)
            .take_while(|&c| c != primary)
            .find(|&c| loads.is_available(c))
    });
    Decision {
        primary,
        secondary,
        branch,
    }
}

/// Least in-flight replica, scanning from `start` (a rotating ticket) so ties
/// do not always fall on the same replica. Secondary: the next least loaded.
pub fn least_request(n: usize, loads: Loads<'_>, start: u64, branch: Branch) -> Decision {
    let loads = loads.effective(n);
    let mut best: Option<usize> = None;
    let mut second: Option<usize> = None;
    let off = if n == 0 {
        0
    } else {
        (start % n as u64) as usize
    };
    for i in (0..n)
        .map(|k| (off + k) % n)
        .filter(|&i| loads.is_available(i))
    {
        match best {
            Some(b) if loads.of(i) >= loads.of(b) => {
                if second.map_or(true, |s| loads.of(i) < loads.of(s)) {
                    second = Some(i);
                }
            }
            _ => {
                second = best;
                best = Some(i);
            }
        }
    }
    Decision {
        primary: best.unwrap_or(0),
        secondary: second,
        branch,
    }
}

/// The `ticket`-th available replica (random when `ticket` is random, round
/// robin when it is a counter). Secondary: the next available one. O(N), no
/// allocation.
pub fn by_ticket(n: usize, loads: Loads<'_>, ticket: u64, branch: Branch) -> Decision {
    let loads = loads.effective(n);
    let avail = || (0..n).filter(move |&i| loads.is_available(i));
    let count = avail().count();
    if count == 0 {
        return Decision {
            primary: 0,
            secondary: None,
            branch,
        };
    }
    let k = (ticket % count as u64) as usize;
    let secondary = if count > 1 {
        avail().nth((k + 1) % count)
    } else {
        None
    };
    Decision {
        primary: avail().nth(k).unwrap_or(0),
        secondary,
        branch,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::hash_id;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn ring(n: usize) -> HashRing {
        let eps: Vec<String> = (0..n).map(|i| format!("127.0.0.1:{}", 9000 + i)).collect();
        HashRing::build(&eps, 128)
    }
    const B: Bounds = Bounds {
        concurrency_threshold: 4,
        load_factor: 1.25,
    };

    #[test]
    fn idle_cluster_hits_owner() {
        let r = ring(5);
        for k in 0..100u64 {
            let key = hash_id(&k.to_le_bytes());
            let d = bounded(&r, key, Loads::new(&[0; 5]), B);
            assert_eq!(d.branch, Branch::Hit);
            assert_eq!(d.primary, r.owner(key).unwrap());
            assert_ne!(d.secondary, Some(d.primary));
            assert!(d.secondary.is_some());
        }
    }

    #[test]
    fn owner_at_threshold_spills_to_ring_successor() {
        let r = ring(5);
        let key = hash_id(b"k");
        let order: Vec<usize> = r.candidates(key).collect();
        let mut loads = [3u32; 5];
        loads[order[0]] = 4; // at the threshold
        let d = bounded(&r, key, Loads::new(&loads), B);
        assert_eq!(d.branch, Branch::Spill);
        assert_eq!(d.primary, order[1]);
    }

    #[test]
    fn owner_above_load_factor_spills() {
        let r = ring(4);
        let key = hash_id(b"z");
        let order: Vec<usize> = r.candidates(key).collect();
        let mut loads = [1u32; 4];
        loads[order[0]] = 5; // mean 2, cap 1.25 × 3 = 3.75
        let d = bounded(
            &r,
            key,
            Loads::new(&loads),
            Bounds {
                concurrency_threshold: 100,
                load_factor: 1.25,
            },
        );
        assert_eq!((d.primary, d.branch), (order[1], Branch::Spill));
        // Equal loads are always within the cap.
        let d = bounded(
            &r,
            key,
            Loads::new(&[7; 4]),
            Bounds {
                concurrency_threshold: 100,
                load_factor: 1.0,
            },
        );
        assert_eq!((d.primary, d.branch), (order[0], Branch::Hit));
    }

    #[test]
    fn light_load_does_not_spill() {
        const LIGHT: Bounds = Bounds {
            concurrency_threshold: 256,
            load_factor: 1.25,
        };
        // 7 replicas, the owner holds one request, nothing else in flight.
        let r = ring(7);
        let key = hash_id(b"light");
        let owner = r.owner(key).unwrap();
        let mut loads = [0u32; 7];
        loads[owner] = 1;
        let d = bounded(&r, key, Loads::new(&loads), LIGHT);
        assert_eq!((d.primary, d.branch), (owner, Branch::Hit));
        // Two in flight on the owner alone is above 1.25 × (2/7 + 1).
        loads[owner] = 2;
        let d = bounded(&r, key, Loads::new(&loads), LIGHT);
        assert_eq!(d.branch, Branch::Spill);
    }

    #[test]
    fn all_overloaded_takes_least_loaded() {
        let r = ring(3);
        let d = bounded(&r, 42, Loads::new(&[9, 5, 7]), B);
        assert_eq!((d.primary, d.branch), (1, Branch::LeastLoaded));
    }

    #[test]
    fn unavailable_replicas_are_skipped_and_fail_open() {
        let r = ring(3);
        let key = hash_id(b"q");
        let owner = r.owner(key).unwrap();
        let mut avail = [true; 3];
        avail[owner] = false;
        let d = bounded(&r, key, Loads::with_available(&[0; 3], &avail), B);
        assert_ne!(d.primary, owner);
        assert_ne!(d.secondary, Some(owner));
        let none = [false; 3];
        let d = bounded(&r, key, Loads::with_available(&[0; 3], &none), B);
        assert_eq!((d.primary, d.branch), (owner, Branch::Hit));
    }

    #[test]
    fn least_request_rotates_ties() {
        let d1 = least_request(3, Loads::new(&[0, 0, 0]), 0, Branch::LeastRequest);
        let d2 = least_request(3, Loads::new(&[0, 0, 0]), 1, Branch::LeastRequest);
        assert_ne!(d1.primary, d2.primary);
        let d = least_request(3, Loads::new(&[5, 1, 3]), 0, Branch::LeastRequest);
        assert_eq!((d.primary, d.secondary), (1, Some(2)));
    }

    #[test]
    fn ticket_cycles() {
        let picks: Vec<usize> = (0..6)
            .map(|t| by_ticket(3, Loads::new(&[0; 3]), t, Branch::RoundRobin).primary)
            .collect();
        assert_eq!(picks, vec![0, 1, 2, 0, 1, 2]);
    }
}
