//! Figures of one run and the tables/JSON built from them.
//!
//! - hit rate: cached prompt tokens / prompt tokens (vLLM's prefix-cache hit
//!   rate, counted at admission);
//! - TTFT: router arrival → first token, p50/p90/p99;
//! - throughput: output tokens / (last completion − first arrival);
//! - share: each replica's fraction of the requests (min and max);
//! - spill: fraction of requests the policy sent away from the replica it
//!   considered warm;
//! - max/mean: the busiest replica's request count over the mean (load skew),
//!   and the same for engine busy time.

use std::fmt::Write as _;

use serde_json::{json, Value};

use crate::engine::{RunResult, SimRequest};

/// Summary of one (workload, policy) run.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    /// Policy name.
    pub policy: String,
    /// Token-level prefix-cache hit rate.
    pub hit_rate: f64,
    /// TTFT percentiles, seconds.
    pub p50: f64,
    /// p90.
    pub p90: f64,
    /// p99.
    pub p99: f64,
    /// Mean TTFT.
    pub mean: f64,
    /// Output tokens per second.
    pub tokens_per_s: f64,
    /// Requests per second.
    pub requests_per_s: f64,
    /// Smallest replica share of requests.
    pub share_min: f64,
    /// Largest replica share.
    pub share_max: f64,
    /// Spill fraction.
    pub spill: f64,
    /// Max over mean of per-replica requests.
    pub max_mean_requests: f64,
    /// Max over mean of per-replica busy time.
    pub max_mean_busy: f64,
    /// Mean fraction of time replicas spend computing prefill.
    pub prefill_util: f64,
    /// Engine steps (all replicas).
    pub steps: u64,
    /// Requests completed / total.
    pub completed: usize,
    /// Total requests.
    pub total: usize,
    /// Wall time of the run, seconds.
    pub wall_s: f64,
    /// Policy-specific figures.
    pub extra: Vec<(String, f64)>,
}

fn pct(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// `SIM_DUMP=DIR`: one CSV per run, `DIR/<policy>.csv`, one line per
/// request (index, arrival s, replica, prompt tokens, cached tokens, TTFT s,
/// spill, completion s, output tokens, previous turn's index or −1), for
/// offline diagnosis of the TTFT tail (`tail_diag.py`) and of chat turns
/// (`turn_diag.py`). Errors are printed, never fatal.
fn dump(dir: &str, policy: &str, reqs: &[SimRequest], res: &RunResult) {
    use std::fmt::Write as _;
    let mut s = String::from("idx,arrived,replica,prompt,cached,ttft,spill,done,output,prev\n");
    for (i, (r, c)) in reqs.iter().zip(&res.records).enumerate() {
        let prev = match r.arrival {
            crate::engine::Arrival::After { prev, .. } => i64::from(prev),
            crate::engine::Arrival::At(_) => -1,
        };
        let _ = writeln!(
            s,
            "{i},{:.6},{},{},{},{:.6},{},{:.6},{},{prev}",
            c.arrived,
            c.replica,
            r.prompt_tokens,
            c.cached,
            c.ttft,
            u8::from(c.spill),
            c.done,
            r.output_tokens
        );
    }
    let name: String = policy
        .chars()
        .map(|ch| if ch.is_ascii_alphanumeric() { ch } else { '_' })
        .collect();
    let path = std::path::Path::new(dir).join(format!("{name}.csv"));
    if let Err(e) = std::fs::write(&path, s) {
        eprintln!("SIM_DUMP: cannot write {}: {e}", path.display());
    }
}

/// Summarise `res`.
pub fn summarize(policy: &str, reqs: &[SimRequest], res: &RunResult, wall_s: f64) -> Summary {
    let n = res.received.len().max(1);
    let (mut cached, mut prompt, mut out) = (0u64, 0u64, 0u64);
    let mut ttft: Vec<f64> = Vec::with_capacity(reqs.len());
    let mut per = vec![0u64; n];
    let mut spills = 0usize;
    let mut first = f64::INFINITY;
    for (r, rec) in reqs.iter().zip(&res.records) {
        if rec.ttft.is_finite() {
            cached += u64::from(rec.cached);
            prompt += u64::from(r.prompt_tokens);
            ttft.push(rec.ttft);
        }
        if rec.done.is_finite() {
            out += u64::from(r.output_tokens);
        }
        first = first.min(rec.arrived);
        if let Some(c) = per.get_mut(rec.replica as usize) {
            *c += 1;
        }
        spills += usize::from(rec.spill);
    }
    ttft.sort_by(f64::total_cmp);
    if let Ok(dir) = std::env::var("SIM_DUMP") {
        dump(&dir, policy, reqs, res);
    }
    if std::env::var("SIM_DEBUG").is_ok() {
        let mut hit: Vec<f64> = reqs
            .iter()
            .zip(&res.records)
            .filter(|(r, c)| c.ttft.is_finite() && c.cached * 2 >= r.prompt_tokens)
            .map(|(_, c)| c.ttft)
            .collect();
        let mut miss: Vec<f64> = reqs
            .iter()
            .zip(&res.records)
            .filter(|(r, c)| c.ttft.is_finite() && c.cached * 2 < r.prompt_tokens)
            .map(|(_, c)| c.ttft)
            .collect();
        hit.sort_by(f64::total_cmp);
        miss.sort_by(f64::total_cmp);
        eprintln!(
            "{policy}: hits {} p50 {:.0} p90 {:.0} | misses {} p50 {:.0} p90 {:.0}",
            hit.len(),
            1e3 * pct(&hit, 0.5),
            1e3 * pct(&hit, 0.9),
            miss.len(),
            1e3 * pct(&miss, 0.5),
            1e3 * pct(&miss, 0.9)
        );
    }
    let total: u64 = per.iter().sum();
    let share = |c: u64| c as f64 / total.max(1) as f64;
    let mean_req = total as f64 / n as f64;
    let busy_mean = res.busy.iter().sum::<f64>() / n as f64;
    let span = (res.end - first).max(1e-9);
    Summary {
        policy: policy.to_string(),
        hit_rate: cached as f64 / prompt.max(1) as f64,
        p50: pct(&ttft, 0.5),
        p90: pct(&ttft, 0.9),
        p99: pct(&ttft, 0.99),
        mean: ttft.iter().sum::<f64>() / ttft.len().max(1) as f64,
        tokens_per_s: out as f64 / span,
        requests_per_s: res.completed as f64 / span,
        share_min: per.iter().copied().map(share).fold(f64::INFINITY, f64::min),
        share_max: per.iter().copied().map(share).fold(0.0, f64::max),
        spill: spills as f64 / reqs.len().max(1) as f64,
        max_mean_requests: per.iter().copied().max().unwrap_or(0) as f64 / mean_req.max(1e-9),
        max_mean_busy: res.busy.iter().copied().fold(0.0, f64::max) / busy_mean.max(1e-9),
        prefill_util: res.prefill.iter().sum::<f64>() / (n as f64 * span),
        steps: res.steps,
        completed: res.completed,
        total: reqs.len(),
        wall_s,
        extra: Vec::new(),
    }
}

/// A text table of one workload; `bound` = infinite-cache hit rate.
pub fn table(workload: &str, description: &str, rows: &[Summary], bound: f64) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "\n== {workload}: {description}");
    let _ = writeln!(
        s,
        "   infinite-cache exact-prefix bound: {:.1} % hit (`%bd` = hit / bound)",
        100.0 * bound
    );
    let _ = writeln!(
        s,
        "{:<19} {:>6} {:>5} {:>8} {:>8} {:>8} {:>8} {:>7} {:>13} {:>6} {:>6} {:>6} {:>5} {:>6}",
        "policy",
        "hit%",
        "%bd",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "mean ms",
        "tok/s",
        "share % min-max",
        "spill%",
        "max/mn",
        "busy",
        "pf%",
        "wall"
    );
    for r in rows {
        let _ = writeln!(
            s,
            "{:<19} {:>6.1} {:>5} {:>8.0} {:>8.0} {:>8.0} {:>8.0} {:>7.0} {:>6.1} - {:>4.1} {:>6.1} {:>6.2} {:>6.2} {:>5.1} {:>5.1}s{}",
            r.policy,
            100.0 * r.hit_rate,
            // No bound (nothing repeats): no share of it.
            if bound > 0.0 {
                format!("{:.0}", 100.0 * r.hit_rate / bound)
            } else {
                "-".to_string()
            },
            1e3 * r.p50,
            1e3 * r.p90,
            1e3 * r.p99,
            1e3 * r.mean,
            r.tokens_per_s,
            100.0 * r.share_min,
            100.0 * r.share_max,
            100.0 * r.spill,
            r.max_mean_requests,
            r.max_mean_busy,
            100.0 * r.prefill_util,
            r.wall_s,
            if r.completed < r.total {
                format!("  ({} of {} done)", r.completed, r.total)
            } else {
                String::new()
            }
        );
    }
    s
}

/// JSON of one summary.
pub fn to_json(r: &Summary) -> Value {
    let extra: serde_json::Map<String, Value> =
        r.extra.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
    json!({
        "policy": r.policy,
        "hit_rate": r.hit_rate,
        "ttft_ms": {"p50": 1e3 * r.p50, "p90": 1e3 * r.p90, "p99": 1e3 * r.p99, "mean": 1e3 * r.mean},
        "throughput": {"output_tokens_per_s": r.tokens_per_s, "requests_per_s": r.requests_per_s},
        "share": {"min": r.share_min, "max": r.share_max},
        "spill_rate": r.spill,
        "max_over_mean": {"requests": r.max_mean_requests, "busy_time": r.max_mean_busy},
        "prefill_utilization": r.prefill_util,
        "engine_steps": r.steps,
        "completed": r.completed,
        "total": r.total,
        "wall_s": r.wall_s,
        "extra": extra,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workload_without_repeats_has_no_share_of_its_bound() {
        let row = Summary {
            policy: "ours".into(),
            hit_rate: 0.25,
            completed: 1,
            total: 1,
            ..Summary::default()
        };
        let none = table("w", "d", std::slice::from_ref(&row), 0.0);
        let line = none.lines().last().unwrap_or_default();
        assert!(!line.contains("NaN") && !line.contains("inf"), "{line}");
        assert_eq!(line.split_whitespace().nth(2), Some("-"), "{line}");
        let half = table("w", "d", &[row], 0.5);
        let line = half.lines().last().unwrap_or_default();
        assert_eq!(line.split_whitespace().nth(2), Some("50"), "{line}");
    }
}
