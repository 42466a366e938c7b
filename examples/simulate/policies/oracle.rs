//! GREEDY TRUE-STATE policies: route with the replicas' **true** state, which
//! no router has. They are greedy heuristics (one request at a time), **not
//! upper bounds**; the bound is `bound.rs`.
//!
//! Both consider only the replicas `ours` would accept: `in_flight <
//! concurrency_threshold` and `in_flight + 1 ≤ load_factor × (mean + 1)`
//! (the same [`AffinityConfig`] as ours); when none is, every replica.
//!
//! `greedy_true_state`: among those, the one whose KV cache really holds the
//! longest prefix of the prompt; ties (e.g. nothing cached anywhere) go to
//! the lowest estimated TTFT below.
//!
//! `greedy_true_ttft`: for every replica `r`, estimate the request's TTFT there as
//! ```text
//! steps(r) · step_time(r) + prefill(backlog(r)) + prefill(cached(r) .. prompt)
//! ```
//! where `cached(r)` is the prompt prefix really present in `r`'s KV cache now,
//! `backlog(r)` the prefill tokens already queued or running on `r`,
//! `step_time(r)` the engine step time of `r`'s current decode batch and
//! `steps(r)` the number of chunked-prefill steps needed for backlog + this
//! prompt; pick the minimum (ties: fewer outstanding requests). It is greedy
//! (it does not plan for future requests), so it is an upper bound for
//! per-request routing quality, not a proven optimum; hit rate is reported for
//! it like for every policy.

use prefix_router::affinity::AffinityConfig;

use super::{Policy, Routed, View};
use crate::engine::SimRequest;

/// The greedy true-state policies.
pub struct Oracle {
    n: usize,
    cache_first: bool,
    load_factor: f64,
    threshold: u32,
}

impl Oracle {
    /// `n` replicas; `cache_first` = `greedy_true_state`, else
    /// `greedy_true_ttft`; the load bound of `cfg`.
    pub fn new(n: usize, cache_first: bool, cfg: &AffinityConfig) -> Oracle {
        Oracle {
            n,
            cache_first,
            load_factor: cfg.load_factor,
            threshold: cfg.concurrency_threshold,
        }
    }
}

impl Policy for Oracle {
    fn route(&mut self, _idx: u32, req: &SimRequest, view: &View<'_>) -> Routed {
        let m = view.model;
        let total: u32 = view.in_flight.iter().sum();
        let cap = self.load_factor * (f64::from(total) / self.n.max(1) as f64 + 1.0);
        let ok = |r: usize| {
            let l = view.in_flight[r];
            l < self.threshold && f64::from(l) + 1.0 <= cap
        };
        let any_ok = (0..self.n.min(view.in_flight.len())).any(ok);
        let mut best: Option<(usize, f64, u32)> = None;
        let mut best_cache: Option<(usize, u32, f64)> = None;
        let mut cached_max = 0;
        let mut cached = vec![0u32; self.n];
        for (r, rep) in view.replicas.iter().enumerate().take(self.n) {
            let c = rep.cached_tokens(req);
            cached[r] = c;
            cached_max = cached_max.max(c);
            let backlog = rep.backlog_tokens.max(0) as f64;
            let (n_dec, sum_ctx) = rep.decode_load();
            let step = m.step_base_s
                + f64::from(n_dec) * m.decode_s_per_seq
                + sum_ctx as f64 * m.decode_s_per_ctx_token;
            let work = backlog + f64::from(req.prompt_tokens - c);
            let per_step = f64::from(m.max_batched_tokens.saturating_sub(n_dec).max(1));
            let steps = (work / per_step).ceil().max(1.0);
            let est = steps * step
                + backlog * m.prefill_s_per_token
                + m.prefill_cost(c, req.prompt_tokens);
            let out = rep.outstanding();
            if any_ok && !ok(r) {
                continue;
            }
            if self.cache_first {
                let better = match best_cache {
                    None => true,
                    Some((_, bc, be)) => c > bc || (c == bc && est < be),
                };
                if better {
                    best_cache = Some((r, c, est));
                }
            }
            let better = match best {
                None => true,
                Some((_, e, o)) => est < e - 1e-9 || ((est - e).abs() <= 1e-9 && out < o),
            };
            if better {
                best = Some((r, est, out));
            }
        }
        let pick = best_cache
            .map(|(r, _, _)| r)
            .or(best.map(|(r, _, _)| r))
            .unwrap_or(0);
        Routed {
            replica: pick,
            spill: cached_max > 0 && cached[pick] < cached_max,
        }
    }
}
