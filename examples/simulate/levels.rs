//! Load levels relative to the saturation rate.
//!
//! **Saturation** of a workload on `n` replicas is measured, not assumed: the
//! arrival-rate multiplier `m*` (arrival times divided by `m`; chat think
//! times unchanged) at which a cache-blind router (`least_request_core`)
//! stops keeping up. "Stops keeping up" = its p90 TTFT exceeds
//! `5 × p90(light) + 1 s`, where `light` is the run at `m = 0.25`: below
//! saturation queues are short and p90 stays within a small factor of the
//! unloaded value; past it queues grow for the whole run and p90 jumps by
//! orders of magnitude. Search: double `m` from 1 until saturated (or down
//! from 1 until not), then 5 bisection steps (±3 % of `m*`).
//! Cost: about 8–10 simulator runs of one policy, on the prepared requests
//! (only arrival times change).
//!
//! A level `x` (e.g. 0.5, 0.8, 0.95) then runs every policy at `x · m*`.
//!
//! A run with too few requests may not overload the fleet at any rate: up
//! to the cap ([`MAX_MULT`]) the probe's p90 stays under the limit. Then
//! [`Saturation::reached`] is false, the levels are fractions of the cap and
//! their labels say so (until the twenty-fourth session the search returned
//! ×63.5 as if saturated). Example: the fast mode's chat, 1 200
//! conversations, each with at most one request in flight: ≤ 171 sequences
//! per replica at 7 replicas, under vLLM's 256, so nothing ever queues for a
//! slot and TTFT stays short however fast conversations arrive (the full
//! mode's 12 000 saturate 7 replicas at ×1.27). Compressing think times too
//! does not change that (measured: still unsaturated at ×64 on 7 replicas).

use std::time::Instant;

use crate::engine::{self, Arrival, Limits, SimRequest};
use crate::model::ModelParams;
use crate::policies::{self, KeyBook};
use crate::report;

/// Copy of `reqs` with absolute arrival times divided by `mult`.
pub fn with_load(reqs: &[SimRequest], mult: f64) -> Vec<SimRequest> {
    let mult = if mult.is_finite() && mult > 0.0 {
        mult
    } else {
        1.0
    };
    reqs.iter()
        .map(|r| {
            let mut r = r.clone();
            if let Arrival::At(t) = r.arrival {
                r.arrival = Arrival::At(t / mult);
            }
            r
        })
        .collect()
}

/// The probe policy.
pub const PROBE: &str = "least_request_core";

fn p90_at(
    reqs: &[SimRequest],
    mult: f64,
    book: &KeyBook,
    n: usize,
    model: &ModelParams,
    limits: &Limits,
) -> Result<f64, String> {
    let scaled = with_load(reqs, mult);
    let ours = policies::ours::OursParams::default();
    let mut p = policies::build(PROBE, book, n, 1, model, &ours)?;
    let res = engine::run(p.as_mut(), &scaled, model, n, limits)?;
    let s = report::summarize(PROBE, &scaled, &res, 0.0);
    Ok(if s.completed < s.total {
        f64::INFINITY
    } else {
        s.p90
    })
}

/// Largest multiplier the search tries.
pub const MAX_MULT: f64 = 64.0;

/// Result of the saturation search.
#[derive(Debug, Clone)]
pub struct Saturation {
    /// `m*`, or [`MAX_MULT`] when not reached.
    pub mult: f64,
    /// Was the probe saturated at or below [`MAX_MULT`]?
    pub reached: bool,
    /// One line: how it was found.
    pub why: String,
}

/// Saturation multiplier `m*` of `reqs` on `n` replicas (see the module
/// docs) and a one-line account of the search.
///
/// # Errors
/// When a run hits the deadline.
pub fn saturation(
    reqs: &[SimRequest],
    n: usize,
    model: &ModelParams,
    deadline: Instant,
    label: &str,
) -> Result<Saturation, String> {
    let book = KeyBook::new(
        &[PROBE.to_string()],
        n,
        &policies::ours::OursParams::default(),
    )?;
    let limits = Limits {
        deadline: Some(deadline),
        progress_every_s: 0.0,
        label: format!("{label} saturation search"),
    };
    let light = p90_at(reqs, 0.25, &book, n, model, &limits)?;
    let limit = 5.0 * light + 1.0;
    let saturated =
        |m: f64| -> Result<bool, String> { Ok(p90_at(reqs, m, &book, n, model, &limits)? > limit) };
    let (mut lo, mut hi);
    if saturated(1.0)? {
        hi = 1.0;
        while hi > 0.3 && saturated(hi / 2.0)? {
            hi /= 2.0;
        }
        lo = (hi / 2.0).max(0.25);
    } else {
        lo = 1.0;
        hi = 2.0;
        while !saturated(hi)? {
            if hi >= MAX_MULT {
                return Ok(Saturation {
                    mult: MAX_MULT,
                    reached: false,
                    why: format!(
                        "not saturated at ×{MAX_MULT:.0} of the nominal rate, the search's cap \
                         ({PROBE} p90 ≤ 5 × {:.0} ms + 1 s): too few requests to overload \
                         {n} replicas; levels are fractions of ×{MAX_MULT:.0}",
                        light * 1e3
                    ),
                });
            }
            lo = hi;
            hi *= 2.0;
        }
    }
    for _ in 0..5 {
        let mid = (lo + hi) / 2.0;
        if saturated(mid)? {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    let m = (lo + hi) / 2.0;
    Ok(Saturation {
        mult: m,
        reached: true,
        why: format!(
            "saturation ×{m:.2} of the nominal rate ({PROBE} p90 > 5 × {:.0} ms + 1 s above it)",
            light * 1e3
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::{self, Knobs};

    #[test]
    fn saturation_scales_with_the_fleet() {
        let k = Knobs {
            scale: 0.08,
            load: 1.0,
            seed: 1,
        };
        let w = workload::unique(&k);
        let book = KeyBook::new(
            &[PROBE.to_string()],
            2,
            &policies::ours::OursParams::default(),
        )
        .unwrap();
        let reqs = workload::prepare(&w.specs, &book, 1).unwrap();
        let model = ModelParams::default();
        let far = Instant::now() + std::time::Duration::from_secs(60);
        let m2 = saturation(&reqs, 2, &model, far, "t").unwrap().mult;
        let m4 = saturation(&reqs, 4, &model, far, "t").unwrap().mult;
        // Twice the replicas sustain about twice the rate (more with better
        // balancing across more replicas; the search resolves ±3 %).
        assert!(m4 > 1.5 * m2 && m4 < 3.0 * m2, "{m2} {m4}");
        // Arrivals are divided by the multiplier.
        let s = with_load(&reqs, 2.0);
        if let (Arrival::At(a), Arrival::At(b)) = (reqs[10].arrival, s[10].arrival) {
            assert!((a / 2.0 - b).abs() < 1e-12);
        }
    }

    #[test]
    fn a_cap_without_saturation_is_said_not_reported_as_a_saturation() {
        let k = Knobs {
            scale: 0.02,
            load: 1.0,
            seed: 1,
        };
        let model = ModelParams::default();
        let far = Instant::now() + std::time::Duration::from_secs(60);
        let book = |n| {
            KeyBook::new(
                &[PROBE.to_string()],
                n,
                &policies::ours::OursParams::default(),
            )
        };
        // 36 short prompts cannot overload 64 replicas.
        let few = workload::prepare(&workload::unique(&k).specs, &book(64).unwrap(), 1).unwrap();
        let sat = saturation(&few, 64, &model, far, "t").unwrap();
        assert!(!sat.reached && sat.mult == MAX_MULT, "{sat:?}");
        assert!(sat.why.contains("not saturated"), "{}", sat.why);
        // The same prompts on one replica do saturate, under the cap.
        let sat = saturation(&few, 1, &model, far, "t").unwrap();
        assert!(sat.reached && sat.mult < MAX_MULT, "{sat:?}");
    }
}
