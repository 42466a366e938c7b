//! Several seeds of one workload: means and 95 % confidence intervals.
//!
//! For a figure `x` measured once per seed (`k` seeds), the report gives the
//! mean and the half-width `t(0.975, k − 1) · sd / √k` of the Student
//! interval (sd = sample standard deviation). Seeds change the synthetic
//! workloads (arrivals, lengths, groups) and every randomised policy; a
//! trace is the same file for every seed, so only the policies' randomness
//! varies there.

use std::fmt::Write as _;

use serde_json::{json, Value};

use crate::report::Summary;

/// Mean and 95 % half-width.
#[derive(Debug, Clone, Copy, Default)]
pub struct Ci {
    /// Mean over seeds.
    pub mean: f64,
    /// Half-width of the 95 % interval (0 with one seed).
    pub half: f64,
}

impl Ci {
    /// Of the samples `xs`.
    pub fn of(xs: &[f64]) -> Ci {
        let k = xs.len();
        if k == 0 {
            return Ci {
                mean: f64::NAN,
                half: f64::NAN,
            };
        }
        let mean = xs.iter().sum::<f64>() / k as f64;
        if k == 1 {
            return Ci { mean, half: 0.0 };
        }
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (k - 1) as f64;
        Ci {
            mean,
            half: t975(k - 1) * (var / k as f64).sqrt(),
        }
    }
}

/// Two-sided 95 % Student quantile for `df` degrees of freedom.
pub fn t975(df: usize) -> f64 {
    const T: [f64; 10] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    ];
    match df {
        0 => f64::NAN,
        1..=10 => T[df - 1],
        11..=20 => 2.2 - (df as f64 - 11.0) * 0.0064,
        21..=30 => 2.08 - (df as f64 - 21.0) * 0.0045,
        _ => 1.96,
    }
}

/// One policy over the seeds.
#[derive(Debug, Clone)]
pub struct Agg {
    /// Policy.
    pub policy: String,
    /// Hit rate (fraction).
    pub hit: Ci,
    /// Hit rate over the bound of the same seed.
    pub of_bound: Ci,
    /// TTFT p50, seconds.
    pub p50: Ci,
    /// TTFT p90, seconds.
    pub p90: Ci,
    /// TTFT p99, seconds.
    pub p99: Ci,
    /// Output tokens per second.
    pub tok_s: Ci,
    /// Smallest / largest replica share (worst over seeds).
    pub share: (f64, f64),
    /// Spill fraction.
    pub spill: Ci,
    /// Infinite-cache bound (same for every policy).
    pub bound: Ci,
}

/// Aggregate `(rows, bound)` per seed; rows are matched by policy name.
pub fn aggregate(runs: &[(Vec<Summary>, f64)]) -> Vec<Agg> {
    let Some((first, _)) = runs.first() else {
        return Vec::new();
    };
    first
        .iter()
        .map(|r0| {
            let rows: Vec<(&Summary, f64)> = runs
                .iter()
                .filter_map(|(rows, b)| {
                    rows.iter().find(|r| r.policy == r0.policy).map(|r| (r, *b))
                })
                .collect();
            let ci = |f: &dyn Fn(&Summary, f64) -> f64| {
                Ci::of(&rows.iter().map(|(r, b)| f(r, *b)).collect::<Vec<_>>())
            };
            Agg {
                policy: r0.policy.clone(),
                hit: ci(&|r, _| r.hit_rate),
                of_bound: ci(&|r, b| r.hit_rate / b),
                p50: ci(&|r, _| r.p50),
                p90: ci(&|r, _| r.p90),
                p99: ci(&|r, _| r.p99),
                tok_s: ci(&|r, _| r.tokens_per_s),
                share: (
                    rows.iter()
                        .map(|(r, _)| r.share_min)
                        .fold(f64::INFINITY, f64::min),
                    rows.iter().map(|(r, _)| r.share_max).fold(0.0, f64::max),
                ),
                spill: ci(&|r, _| r.spill),
                bound: ci(&|_, b| b),
            }
        })
        .collect()
}

/// Text table of the aggregate.
pub fn table(workload: &str, description: &str, agg: &[Agg], seeds: u64, n: usize) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\n== {workload} ({n} replicas, {seeds} seeds, mean ± 95 % CI): {description}"
    );
    if let Some(a) = agg.first() {
        let _ = writeln!(
            s,
            "   infinite-cache exact-prefix bound: {:.1} ± {:.1} % hit",
            100.0 * a.bound.mean,
            100.0 * a.bound.half
        );
    }
    let _ = writeln!(
        s,
        "{:<19} {:>12} {:>5} {:>7} {:>14} {:>8} {:>7} {:>13} {:>6}",
        "policy", "hit%", "%bd", "p50 ms", "p90 ms", "p99 ms", "tok/s", "share % min-max", "spill%"
    );
    for a in agg {
        let _ = writeln!(
            s,
            "{:<19} {:>6.1} ±{:>4.1} {:>5} {:>7.0} {:>7.0} ±{:>5.0} {:>8.0} {:>7.0} {:>6.1} - {:>4.1} {:>6.1}",
            a.policy,
            100.0 * a.hit.mean,
            100.0 * a.hit.half,
            // No bound (nothing repeats): no share of it.
            if a.of_bound.mean.is_finite() {
                format!("{:.0}", 100.0 * a.of_bound.mean)
            } else {
                "-".to_string()
            },
            1e3 * a.p50.mean,
            1e3 * a.p90.mean,
            1e3 * a.p90.half,
            1e3 * a.p99.mean,
            a.tok_s.mean,
            100.0 * a.share.0,
            100.0 * a.share.1,
            100.0 * a.spill.mean,
        );
    }
    s
}

/// JSON of the aggregate.
pub fn to_json(agg: &[Agg]) -> Value {
    let c = |x: Ci| json!({"mean": x.mean, "ci95": x.half});
    Value::Array(
        agg.iter()
            .map(|a| {
                json!({
                    "policy": a.policy,
                    "hit_rate": c(a.hit),
                    "share_of_bound": c(a.of_bound),
                    "bound_hit_rate": c(a.bound),
                    "ttft_ms": {
                        "p50": c(Ci { mean: 1e3 * a.p50.mean, half: 1e3 * a.p50.half }),
                        "p90": c(Ci { mean: 1e3 * a.p90.mean, half: 1e3 * a.p90.half }),
                        "p99": c(Ci { mean: 1e3 * a.p99.mean, half: 1e3 * a.p99.half }),
                    },
                    "output_tokens_per_s": c(a.tok_s),
                    "share": {"min": a.share.0, "max": a.share.1},
                    "spill_rate": c(a.spill),
                })
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn student_interval() {
        let c = Ci::of(&[1.0, 2.0, 3.0, 4.0, 5.0]);
        assert!((c.mean - 3.0).abs() < 1e-12);
        // sd = sqrt(2.5), t(4) = 2.776.
        assert!((c.half - 2.776 * (2.5f64 / 5.0).sqrt()).abs() < 1e-9);
        assert_eq!(Ci::of(&[7.0]).half, 0.0);
        assert!(t975(3) > t975(30));
    }
}
