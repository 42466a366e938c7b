//! The load one host is routed on, from this gateway's live in-flight count
//! and the engine's last scraped sample: the rule the filter applies
//! ([`crate::cluster::engines::apply`]) and the simulator's `ours` reuses
//! (`--ours engine_load=…`), so both measure the same code.
//!
//! A sample is up to `engine.refresh_ms` old (500 ms in the shipped
//! `envoy/envoy.yaml`), while our own in-flight count is live. Taking the
//! sample as it is keeps a replica that has just drained "loaded" for up to
//! a period, and misses the requests we sent since. So the poller stores,
//! with each sample, this gateway's in-flight count for that host at the
//! time the sample was stored (`own_then`), and the load is
//!
//! ```text
//! delta:  own_now + max(0, (waiting + running) − own_then) + waiting
//! ```
//!
//! - `own_now`: our requests, live (the ones we sent since the sample count,
//!   the ones that ended since do not);
//! - `max(0, engine − own_then)`: the engine's requests that are not ours as
//!   of the sample (other gateways' traffic; in one gateway about 0);
//! - `+ waiting`: queued requests count twice. A new request waits for every
//!   queued prefill, a running (decoding) one only slows its steps a little,
//!   so in-flight counts alone rank a replica with a queue like one busy
//!   decoding.
//!
//! The result is never below `own_now` (our live count is a lower bound of
//! what the host holds). A sample stored without `own_then` (an older poller)
//! falls back to the previous rule, `max(own_now, waiting + running) +
//! waiting` ("queued"). A sample with neither count leaves `own_now`.
//!
//! Cost: O(1), no allocation. Counts are clamped to `u32`; NaN, negative or
//! infinite fields read as unknown (the parser never stores them).

use super::{engine_load, EngineSample};

/// Which rule combines the sample with our counts (the simulator compares
/// them; the filter always uses [`LoadRule::Delta`] when it has `own_then`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadRule {
    /// `max(own_now, waiting + running)` (the filter before the fourth session).
    Max,
    /// `max(own_now, waiting + running) + waiting` (fourth session).
    Queued,
    /// `own_now + max(0, waiting + running − own_then) + waiting` (module docs).
    Delta,
}

fn count(x: f64) -> u32 {
    if x.is_finite() && x > 0.0 {
        x.min(f64::from(u32::MAX)) as u32
    } else {
        0
    }
}

/// The host's load in requests; see the module docs. `own_then`: our
/// in-flight count for the host when the sample was stored (`None`: unknown,
/// then `Delta` reads as `Queued`).
pub fn host_load(
    rule: LoadRule,
    own_now: u32,
    sample: &EngineSample,
    own_then: Option<u32>,
) -> u32 {
    let Some(engine) = engine_load(sample).map(count) else {
        return own_now;
    };
    let waiting = count(sample.waiting.unwrap_or(0.0));
    match (rule, own_then) {
        (LoadRule::Max, _) => own_now.max(engine),
        (LoadRule::Delta, Some(then)) => own_now
            .saturating_add(engine.saturating_sub(then))
            .saturating_add(waiting),
        (LoadRule::Queued | LoadRule::Delta, _) => own_now.max(engine).saturating_add(waiting),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn s(waiting: f64, running: f64) -> EngineSample {
        EngineSample {
            waiting: Some(waiting),
            running: Some(running),
            ..EngineSample::default()
        }
    }

    #[test]
    fn delta_counts_our_requests_live_and_others_from_the_sample() {
        // The sample saw 3 waiting + 5 running while we had 6 there: 2 are
        // someone else's. Since then ours went 6 → 2 (drained): 2 + 2 + 3.
        assert_eq!(host_load(LoadRule::Delta, 2, &s(3.0, 5.0), Some(6)), 7);
        // The stale sample alone would keep it at max(2, 8) + 3 = 11.
        assert_eq!(host_load(LoadRule::Queued, 2, &s(3.0, 5.0), Some(6)), 11);
        assert_eq!(host_load(LoadRule::Max, 2, &s(3.0, 5.0), Some(6)), 8);
        // We sent 4 more since a sample of an idle host: 4, where `max`
        // with a fresh own count gives the same, and the waiting term is 0.
        assert_eq!(host_load(LoadRule::Delta, 4, &s(0.0, 0.0), Some(0)), 4);
        // One gateway, sample equal to ours: the queue is what is added.
        assert_eq!(host_load(LoadRule::Delta, 5, &s(2.0, 3.0), Some(5)), 7);
    }

    #[test]
    fn never_below_our_live_count_and_missing_parts() {
        for rule in [LoadRule::Max, LoadRule::Queued, LoadRule::Delta] {
            for then in [None, Some(0), Some(50)] {
                assert!(
                    host_load(rule, 9, &s(0.0, 1.0), then) >= 9,
                    "{rule:?} {then:?}"
                );
            }
            // No counts in the sample: our own count.
            assert_eq!(host_load(rule, 3, &EngineSample::default(), Some(1)), 3);
        }
        // Unknown own count at the sample: the queued rule.
        assert_eq!(host_load(LoadRule::Delta, 2, &s(3.0, 5.0), None), 11);
        // Only `running` known: no waiting term.
        let r = EngineSample {
            running: Some(4.0),
            ..EngineSample::default()
        };
        assert_eq!(host_load(LoadRule::Delta, 1, &r, Some(1)), 4);
        // Absurd values saturate instead of wrapping.
        assert_eq!(
            host_load(LoadRule::Delta, u32::MAX, &s(1e12, 1e12), Some(0)),
            u32::MAX
        );
        assert_eq!(
            host_load(LoadRule::Delta, 1, &s(f64::NAN, -3.0), Some(0)),
            1
        );
    }
}
