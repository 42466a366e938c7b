//! The issue-9 criterion, judged under every table that has `ours` and a
//! prefix-aware baseline, so a run on any trace says whether `ours` passes.
//!
//! Baselines: every row whose name starts with `sagemaker`, `chwbl`, `gie`
//! or `sglang` (documented defaults, `_tuned`, and `name:k=v` sweeps); not
//! random, least-request, session or the true-state greedy references.
//!
//! - **Hit rate**: the best baseline is the one with the highest mean hit
//!   rate over the seeds; per seed, `Δ = ours − best` (paired: same trace or
//!   workload seed), then the mean and 95 % Student CI of `Δ`. Passes when
//!   `Δ ≥ −0.5` points; "within the CI" when only `Δ + CI ≥ −0.5`.
//! - **p90 TTFT**: the lowest baseline is the one with the lowest mean p90;
//!   per seed `ours − lowest`, relative to the lowest's mean. Passes when
//!   the mean is `≤ 0`; "within the CI" when only `mean − CI ≤ 0`.
//!
//! With one seed the CI is 0 and "within the CI" never applies. The same
//! rule for many runs at once: `criterion.py` (trace seeds as the pairs).
//! Cost: O(seeds × policies).

use std::fmt;

use serde_json::{json, Value};

use crate::report::Summary;
use crate::stats::Ci;

/// Hit-rate tolerance, points.
const HIT_TOLERANCE: f64 = 0.5;

/// Is `policy` one of the prefix-aware baselines (a family of
/// [`crate::policies::PARAMS`], with or without parameters or `_tuned`)?
fn is_baseline(policy: &str) -> bool {
    crate::policies::PARAMS
        .iter()
        .any(|(family, _)| policy.starts_with(family))
}

/// One test's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pass {
    /// The mean passes.
    Yes,
    /// The mean fails, the 95 % CI reaches the bar.
    WithinCi,
    /// The CI does not reach the bar either.
    No,
}

impl Pass {
    fn as_str(self) -> &'static str {
        match self {
            Pass::Yes => "pass",
            Pass::WithinCi => "pass within the 95 % CI",
            Pass::No => "FAIL",
        }
    }
}

/// `ours` against the baselines over the seeds of one table.
#[derive(Debug, Clone)]
pub struct Verdict {
    /// Baseline with the highest mean hit rate.
    pub best: String,
    /// Its mean hit rate, points.
    pub best_hit: f64,
    /// `ours − best`, points, paired per seed.
    pub hit_delta: Ci,
    /// Hit-rate test.
    pub hit: Pass,
    /// Baseline with the lowest mean p90.
    pub lowest: String,
    /// Its mean p90, ms.
    pub lowest_p90_ms: f64,
    /// `ours − lowest` p90, % of the lowest's mean, paired per seed.
    pub p90_delta_pct: Ci,
    /// p90 test.
    pub p90: Pass,
    /// Seeds paired.
    pub seeds: usize,
}

/// Judge `ours` in `runs` (one `(rows, bound)` per seed). `None` without an
/// `ours` row or a baseline present in every seed.
pub fn judge(runs: &[(Vec<Summary>, f64)], ours: &str) -> Option<Verdict> {
    let (first, _) = runs.first()?;
    let row = |rows: &'_ [Summary], p: &str| -> Option<(f64, f64)> {
        rows.iter()
            .find(|r| r.policy == p)
            .map(|r| (100.0 * r.hit_rate, 1e3 * r.p90))
    };
    // Per seed (hit points, p90 ms) of `p`; None if any seed lacks it.
    let series = |p: &str| -> Option<Vec<(f64, f64)>> {
        runs.iter().map(|(rows, _)| row(rows, p)).collect()
    };
    let own = series(ours)?;
    let mean = |xs: &[(f64, f64)], f: fn(&(f64, f64)) -> f64| {
        xs.iter().map(f).sum::<f64>() / xs.len().max(1) as f64
    };
    let baselines: Vec<(String, Vec<(f64, f64)>)> = first
        .iter()
        .filter(|r| is_baseline(&r.policy))
        .filter_map(|r| series(&r.policy).map(|s| (r.policy.clone(), s)))
        .collect();
    let (best, best_s) = baselines
        .iter()
        .max_by(|a, b| mean(&a.1, |x| x.0).total_cmp(&mean(&b.1, |x| x.0)))?;
    let (lowest, low_s) = baselines
        .iter()
        .min_by(|a, b| mean(&a.1, |x| x.1).total_cmp(&mean(&b.1, |x| x.1)))?;
    let hit_delta = Ci::of(
        &own.iter()
            .zip(best_s)
            .map(|(o, b)| o.0 - b.0)
            .collect::<Vec<_>>(),
    );
    let lowest_p90_ms = mean(low_s, |x| x.1);
    let p90_delta_pct = Ci::of(
        &own.iter()
            .zip(low_s)
            .map(|(o, l)| 100.0 * (o.1 - l.1) / lowest_p90_ms.max(f64::MIN_POSITIVE))
            .collect::<Vec<_>>(),
    );
    let hit = if hit_delta.mean >= -HIT_TOLERANCE {
        Pass::Yes
    } else if hit_delta.mean + hit_delta.half >= -HIT_TOLERANCE {
        Pass::WithinCi
    } else {
        Pass::No
    };
    let p90 = if p90_delta_pct.mean <= 0.0 {
        Pass::Yes
    } else if p90_delta_pct.mean - p90_delta_pct.half <= 0.0 {
        Pass::WithinCi
    } else {
        Pass::No
    };
    Some(Verdict {
        best: best.clone(),
        best_hit: mean(best_s, |x| x.0),
        hit_delta,
        hit,
        lowest: lowest.clone(),
        lowest_p90_ms,
        p90_delta_pct,
        p90,
        seeds: own.len(),
    })
}

impl fmt::Display for Verdict {
    /// One line: `criterion (ours vs baselines): hit … ; p90 …`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ci = |c: Ci, digits: usize| {
            if self.seeds > 1 {
                format!(" ± {:.*}", digits, c.half)
            } else {
                String::new()
            }
        };
        write!(
            f,
            "   criterion (issue 9; `ours` against the prefix-aware baselines, {}): \
             hit {:+.2}{} points against the best, {} ({:.2} %): {}; \
             p90 {:+.1}{} % against the lowest, {} ({:.0} ms): {}",
            if self.seeds == 1 {
                "1 seed".to_string()
            } else {
                format!("{} seeds, paired", self.seeds)
            },
            self.hit_delta.mean,
            ci(self.hit_delta, 2),
            self.best,
            self.best_hit,
            self.hit.as_str(),
            self.p90_delta_pct.mean,
            ci(self.p90_delta_pct, 1),
            self.lowest,
            self.lowest_p90_ms,
            self.p90.as_str(),
        )
    }
}

/// JSON of a verdict.
pub fn to_json(v: &Verdict) -> Value {
    json!({
        "best_hit_baseline": v.best,
        "best_hit_rate_points": v.best_hit,
        "hit_delta_points": {"mean": v.hit_delta.mean, "ci95": v.hit_delta.half},
        "hit": v.hit.as_str(),
        "lowest_p90_baseline": v.lowest,
        "lowest_p90_ms": v.lowest_p90_ms,
        "p90_delta_percent": {"mean": v.p90_delta_pct.mean, "ci95": v.p90_delta_pct.half},
        "p90": v.p90.as_str(),
        "seeds": v.seeds,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(policy: &str, hit: f64, p90_ms: f64) -> Summary {
        Summary {
            policy: policy.into(),
            hit_rate: hit / 100.0,
            p90: p90_ms / 1e3,
            ..Summary::default()
        }
    }

    fn seed(ours: (f64, f64), others: &[(&str, f64, f64)]) -> (Vec<Summary>, f64) {
        let mut rows: Vec<Summary> = others.iter().map(|&(p, h, q)| row(p, h, q)).collect();
        rows.push(row("ours", ours.0, ours.1));
        (rows, 0.9)
    }

    #[test]
    fn picks_the_best_hit_and_lowest_p90_among_prefix_aware_baselines_only() {
        let others = [
            ("greedy_true_state", 90.0, 10.0),
            ("random", 10.0, 5.0),
            ("sglang", 60.0, 120.0),
            ("gie_tuned", 61.0, 110.0),
            ("sagemaker:pl=4096/th=16/least=1", 59.0, 100.0),
        ];
        let v = judge(&[seed((60.7, 99.0), &others)], "ours").expect("verdict");
        assert_eq!(v.best, "gie_tuned");
        assert_eq!(v.lowest, "sagemaker:pl=4096/th=16/least=1");
        assert!((v.hit_delta.mean + 0.3).abs() < 1e-9);
        assert_eq!((v.hit, v.p90), (Pass::Yes, Pass::Yes));
        // 0.6 points under the best, 2 % over the lowest p90: both fail.
        let v = judge(&[seed((60.4, 102.0), &others)], "ours").expect("verdict");
        assert_eq!((v.hit, v.p90), (Pass::No, Pass::No));
        assert!((v.p90_delta_pct.mean - 2.0).abs() < 1e-9);
        let line = v.to_string();
        assert!(line.contains("FAIL") && line.contains("-0.60"), "{line}");
    }

    #[test]
    fn seeds_are_paired_and_a_mean_miss_inside_the_ci_is_told_apart() {
        // Δ per seed −0.2, −1.2, −0.4: mean −0.6, its CI reaches −0.5.
        let runs = [
            seed((60.0, 100.0), &[("sglang", 60.2, 101.0)]),
            seed((70.0, 100.0), &[("sglang", 71.2, 99.0)]),
            seed((50.0, 100.0), &[("sglang", 50.4, 101.0)]),
        ];
        let v = judge(&runs, "ours").expect("verdict");
        assert!((v.hit_delta.mean + 0.6).abs() < 1e-9, "{v:?}");
        assert_eq!(v.hit, Pass::WithinCi);
        // p90: −1, +1, −1 ms → mean −0.33 ms: passes.
        assert_eq!(v.p90, Pass::Yes);
        assert_eq!(v.seeds, 3);
        // Unpaired, the hit rates' spread over seeds (≈ 10 points) would
        // hide any difference; paired, a steady −1 fails.
        let steady = [
            seed((59.0, 100.0), &[("sglang", 60.0, 100.0)]),
            seed((69.0, 100.0), &[("sglang", 70.0, 100.0)]),
            seed((49.0, 100.0), &[("sglang", 50.0, 100.0)]),
        ];
        assert_eq!(judge(&steady, "ours").map(|v| v.hit), Some(Pass::No));
    }

    #[test]
    fn no_verdict_without_ours_or_a_baseline() {
        assert!(judge(&[seed((50.0, 1.0), &[("random", 10.0, 1.0)])], "ours").is_none());
        assert!(judge(&[(vec![row("sglang", 1.0, 1.0)], 0.5)], "ours").is_none());
        assert!(judge(&[], "ours").is_none());
    }
}
