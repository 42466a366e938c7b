//! Per-peer back-off of the puller (pure; the filter's [`crate::filter`]
//! puller keeps one [`Backoff`] per VM and passes the clock).
//!
//! A peer that is down (connection refused, reset, an HTTP error), slow (the
//! pull timed out) or answers garbage (a batch [`crate::peers::decode`]
//! refuses) must cost nothing but its own staleness. Each failure is
//! classified ([`Failure`], counted by the caller in its own stat) and the
//! peer is not pulled again before `period · 2^failures`, capped at
//! [`MAX_BACKOFF_MS`] (the exponent is capped too, so the arithmetic never
//! overflows): a peer failing for `T` ms is pulled at most about
//! `log2(MAX_BACKOFF_MS / period) + T / MAX_BACKOFF_MS` times, against
//! `T / period` without back-off. One good batch clears its state, so a
//! peer that comes back is pulled again within [`MAX_BACKOFF_MS`].
//!
//! Memory: one entry per failing peer address (the peers cluster's hosts,
//! bounded by the cluster). Cost: one hash-map lookup per peer per tick.

use std::collections::HashMap;

/// Longest wait before pulling a failing peer again, ms.
pub const MAX_BACKOFF_MS: u64 = 1_000;
/// Largest exponent of the wait (`period · 2^MAX_SHIFT` ≥ the cap for any
/// `period` ≥ 16 ms).
const MAX_SHIFT: u32 = 6;

/// Why a pull failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// Connection refused or reset, no cluster, an HTTP status other than
    /// 200 before the time-out (the peer is down or refused us).
    Refused,
    /// No answer within the pull's time-out (the peer is slow or hung).
    Timeout,
    /// A 200 whose body is not a valid batch.
    Garbage,
}

/// Classify a pull answered with `status` (`None`: no response headers, a
/// reset) after `elapsed_ms`, for a time-out of `timeout_ms`: `None` for a
/// 200 (the body is judged by the decoder). Envoy answers a timed-out call
/// with a local 504 (or no headers) once the time-out has passed, so
/// anything that took at least 90 % of it counts as a time-out.
pub fn classify(status: Option<&[u8]>, elapsed_ms: u64, timeout_ms: u64) -> Option<Failure> {
    if status == Some(b"200".as_slice()) {
        return None;
    }
    if status == Some(b"504".as_slice()) || elapsed_ms.saturating_mul(10) >= timeout_ms * 9 {
        Some(Failure::Timeout)
    } else {
        Some(Failure::Refused)
    }
}

/// Back-off state of the peers (see the module docs).
#[derive(Debug, Default, Clone)]
pub struct Backoff {
    /// Failing peers: address → (consecutive failures, next pull at ms).
    peers: HashMap<String, (u32, u64)>,
}

impl Backoff {
    /// Record a failure of `addr` at `now` with the pull `period`; returns
    /// the wait before the next pull, ms.
    pub fn fail(&mut self, addr: &str, now: u64, period: u64) -> u64 {
        let e = self.peers.entry(addr.to_string()).or_insert((0, 0));
        e.0 = e.0.saturating_add(1);
        let wait = period
            .max(1)
            .saturating_mul(1 << e.0.min(MAX_SHIFT))
            .min(MAX_BACKOFF_MS.max(period));
        e.1 = now.saturating_add(wait);
        wait
    }

    /// A good batch from `addr`: pull it every period again.
    pub fn ok(&mut self, addr: &str) {
        self.peers.remove(addr);
    }

    /// May `addr` be pulled at `now`?
    pub fn ready(&self, addr: &str, now: u64) -> bool {
        !matches!(self.peers.get(addr), Some(&(_, at)) if now < at)
    }

    /// Is `addr` failing (not yet answered a good batch since its last failure)?
    pub fn failing(&self, addr: &str) -> bool {
        self.peers.contains_key(addr)
    }

    /// Consecutive failures of `addr`.
    pub fn failures(&self, addr: &str) -> u32 {
        self.peers.get(addr).map_or(0, |e| e.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn failures_are_classified() {
        assert_eq!(classify(Some(b"200"), 10, 250), None);
        assert_eq!(classify(Some(b"200"), 900, 250), None);
        assert_eq!(classify(Some(b"503"), 3, 250), Some(Failure::Refused));
        assert_eq!(classify(None, 3, 250), Some(Failure::Refused));
        assert_eq!(classify(Some(b"404"), 3, 250), Some(Failure::Refused));
        assert_eq!(classify(Some(b"504"), 3, 250), Some(Failure::Timeout));
        assert_eq!(classify(None, 250, 250), Some(Failure::Timeout));
        assert_eq!(classify(Some(b"503"), 230, 250), Some(Failure::Timeout));
    }

    #[test]
    fn the_wait_doubles_up_to_the_cap_and_a_good_batch_clears_it() {
        let mut b = Backoff::default();
        assert!(b.ready("a", 0));
        let waits: Vec<u64> = (0..8).map(|_| b.fail("a", 0, 100)).collect();
        assert_eq!(waits, [200, 400, 800, 1000, 1000, 1000, 1000, 1000]);
        assert_eq!(b.failures("a"), 8);
        assert!(!b.ready("a", 999) && b.ready("a", 1000));
        assert!(b.ready("b", 0) && !b.failing("b"));
        b.ok("a");
        assert!(b.ready("a", 0) && !b.failing("a"));
        // A period above the cap is never shortened; a huge count never overflows.
        assert_eq!(b.fail("c", 5, 4000), 4000);
        for _ in 0..100 {
            b.fail("d", u64::MAX - 1, u64::MAX / 2);
        }
        assert!(!b.ready("d", u64::MAX - 1));
    }

    #[test]
    fn a_peer_failing_for_a_window_is_pulled_a_bounded_number_of_times() {
        // The puller's loop: pull when ready, every 100 ms tick, for 10 s.
        let mut b = Backoff::default();
        let mut pulls = 0;
        for tick in 0..100u64 {
            let now = tick * 100;
            if b.ready("bad", now) {
                pulls += 1;
                b.fail("bad", now, 100);
            }
        }
        // 100 pulls without back-off; with it 3 to reach the cap, then one a second.
        assert!(pulls <= 3 + 10 + 1, "{pulls}");
        assert!(pulls >= 10, "{pulls}");
    }
}
