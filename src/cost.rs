//! What a cache miss and a busy replica cost, learned from observed response
//! times.
//!
//! Model: time to first token on a replica ≈
//! `a + b · uncached_tokens + c · in_flight`, where `uncached_tokens` is the
//! router's estimate of the prompt tokens the replica must prefill and
//! `in_flight` the replica's in-flight count when the request was routed.
//! `b` is the **cache-break penalty per token** (prefill cost) and `c` the
//! **extra wait per in-flight request**: the two prices the affinity policy
//! compares ([`crate::affinity`]). They start from configured values and,
//! when learning is on, follow recursive least squares with exponential
//! forgetting (factor `forget`, ≈ the last `1/(1 − forget)` observations) on
//! every observed TTFT. Estimates are clamped to sane ranges so one outlier or
//! a degenerate stream (all requests alike) cannot make a price negative.
//!
//! Bounds (a long run of identical observations must not wind the estimator
//! up: with forgetting, the covariance `P` grows by `1/forget` per step in
//! every direction the data does not excite, until it overflows and learning
//! stops for good):
//! - observations outside [`OBS_LIMITS`] (negative, non-finite, a TTFT over
//!   10 minutes, more than 10 M tokens or 100 k in flight) are ignored;
//! - the trace of `P` is capped at [`MAX_TRACE`] (the prior's trace × 100):
//!   above it `P` is scaled down, which keeps the gain bounded and the next
//!   informative observation effective;
//! - if `P` or the estimates ever become non-finite, or `P` loses its positive
//!   diagonal, the model restarts from the prior at its current clamped prices
//!   (counted in [`CostModel::resets`]).
//!
//! **Floor** (`prefill_floor`, on by default): the prefill price used for
//! decisions is at least the configured `prefill_ms_per_ktok`. The regressor
//! is the router's *predicted* uncached tokens; every wrong prediction (an
//! expected hit that missed, a ladder lower bound) is noise in the regressor,
//! and least squares then biases the slope towards zero (errors in
//! variables). In the simulator's chat workload the learned price settled at
//! 12–21 ms per 1000 tokens against a true ≥ 30, so the cache-break penalty
//! looked cheap and 19 % of turns left their cache (hit 86.3 % against
//! 89.2 % with the floor, `docs/benchmarks.md`). The learned price still
//! counts when it is higher than the floor (a slower engine).
//!
//! **Ceiling** (the other direction, applied by the caller): the wait price
//! is biased *up* by the same errors (an evicted prefix's full prefill and
//! the queue ahead both grow with the in-flight count), so the affinity
//! policy prices an in-flight request at most at the configured price when
//! it prices queues by their tokens ([`crate::affinity`], "Wait price").
//!
//! **Run time** ([`CostModel::run_ms`]): the mean time from a response's
//! first token to its end (its decode), an exponential moving average over
//! about the last [`RUN_MEMORY`] streamed responses, 0 until one is seen
//! (nothing is configured). By Little's law on an engine's running batch,
//! a sequence slot frees every `run_ms / running` on average: the price of
//! waiting for one at the concurrency threshold ([`crate::affinity`], "Slot
//! wait").
//!
//! Cost: O(1) per observation (3×3 matrix update), no allocation. One model per
//! filter worker: each learns from the responses it proxies.

/// Initial prices and learning switch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostConfig {
    /// Initial prefill cost, milliseconds per 1000 uncached prompt tokens.
    pub prefill_ms_per_ktok: f64,
    /// Initial extra wait per in-flight request, milliseconds.
    pub wait_ms_per_request: f64,
    /// Learn from observed TTFTs.
    pub learn: bool,
    /// Forgetting factor in (0, 1].
    pub forget: f64,
    /// The configured prefill price is a floor of the learned one (see the
    /// module docs, "Floor").
    pub prefill_floor: bool,
}

impl Default for CostConfig {
    fn default() -> Self {
        CostConfig {
            prefill_ms_per_ktok: 50.0,
            wait_ms_per_request: 10.0,
            learn: true,
            forget: 0.999,
            prefill_floor: true,
        }
    }
}

/// Clamp ranges of the learned prices.
const PREFILL_RANGE: (f64, f64) = (0.5, 100_000.0);
const WAIT_RANGE: (f64, f64) = (0.0, 10_000.0);
/// Largest observation accepted: (uncached tokens, in-flight, TTFT ms).
pub const OBS_LIMITS: (f64, f64, f64) = (1e7, 1e5, 600_000.0);
/// Prior covariance (diagonal): intercept ms, ms per ktok, ms per request.
const PRIOR: [f64; 3] = [1e4, 1e4, 1e2];
/// Cap on the trace of the covariance: 100 × the prior's.
pub const MAX_TRACE: f64 = 100.0 * (PRIOR[0] + PRIOR[1] + PRIOR[2]);
/// Responses the run-time average remembers (its weight is `1 / RUN_MEMORY`).
pub const RUN_MEMORY: f64 = 100.0;

/// The online estimator.
#[derive(Debug, Clone)]
pub struct CostModel {
    cfg: CostConfig,
    theta: [f64; 3],
    p: [[f64; 3]; 3],
    observations: u64,
    resets: u64,
    /// Mean first-token-to-end time, ms (0: none observed).
    run_ms: f64,
}

fn prior() -> [[f64; 3]; 3] {
    [
        [PRIOR[0], 0.0, 0.0],
        [0.0, PRIOR[1], 0.0],
        [0.0, 0.0, PRIOR[2]],
    ]
}

impl CostModel {
    /// A model at the configured prices.
    pub fn new(cfg: CostConfig) -> CostModel {
        CostModel {
            cfg,
            theta: [0.0, cfg.prefill_ms_per_ktok, cfg.wait_ms_per_request],
            p: prior(),
            observations: 0,
            resets: 0,
            run_ms: 0.0,
        }
    }

    /// Times the estimator was restarted from the prior after diverging.
    pub fn resets(&self) -> u64 {
        self.resets
    }

    /// Trace of the covariance (bounded by [`MAX_TRACE`]).
    pub fn covariance_trace(&self) -> f64 {
        self.p[0][0] + self.p[1][1] + self.p[2][2]
    }

    /// Keep `P` bounded and the state finite (see the module docs).
    fn stabilise(&mut self) {
        let finite = self
            .theta
            .iter()
            .chain(self.p.iter().flatten())
            .all(|v| v.is_finite());
        let trace = self.covariance_trace();
        if !finite || (0..3).any(|i| self.p[i][i] <= 0.0) {
            let (b, c) = self.prices();
            let intercept = if self.theta[0].is_finite() {
                self.theta[0].clamp(-OBS_LIMITS.2, OBS_LIMITS.2)
            } else {
                0.0
            };
            self.theta = [intercept, b, c];
            self.p = prior();
            self.resets += 1;
        } else if trace > MAX_TRACE {
            let k = MAX_TRACE / trace;
            for v in self.p.iter_mut().flatten() {
                *v *= k;
            }
        }
    }

    /// Prefill cost of `tokens` uncached tokens, milliseconds (at the
    /// floored price, see the module docs).
    pub fn prefill_ms(&self, tokens: f64) -> f64 {
        let b = self.learned_prefill_ms_per_ktok();
        let b = if self.cfg.prefill_floor {
            b.max(self.cfg.prefill_ms_per_ktok)
        } else {
            b
        };
        b * tokens / 1000.0
    }

    /// The learned prefill price before the floor, ms per 1000 tokens.
    pub fn learned_prefill_ms_per_ktok(&self) -> f64 {
        clamp(self.theta[1], PREFILL_RANGE)
    }

    /// Extra wait for `requests` more in-flight requests, milliseconds.
    pub fn wait_ms(&self, requests: f64) -> f64 {
        clamp(self.theta[2], WAIT_RANGE) * requests
    }

    /// The configured (initial) prices and learning switch.
    pub fn config(&self) -> CostConfig {
        self.cfg
    }

    /// Observations so far.
    pub fn observations(&self) -> u64 {
        self.observations
    }

    /// Current (clamped) prices: (ms per 1000 tokens, ms per in-flight request).
    pub fn prices(&self) -> (f64, f64) {
        (self.prefill_ms(1000.0), self.wait_ms(1.0))
    }

    /// Mean time from a streamed response's first token to its end, ms (module
    /// docs, "Run time"); 0 until one was observed or with learning off.
    pub fn run_ms(&self) -> f64 {
        self.run_ms
    }

    /// Learn from one streamed response's time from first token to end
    /// (`ms`). Ignored when learning is off or `ms` is outside
    /// `[0, OBS_LIMITS.2]` (NaN included). Cost: O(1).
    pub fn observe_run(&mut self, ms: f64) {
        if !(self.cfg.learn && (0.0..=OBS_LIMITS.2).contains(&ms)) {
            return;
        }
        self.run_ms = if self.run_ms > 0.0 {
            self.run_ms + (ms - self.run_ms) / RUN_MEMORY
        } else {
            ms
        };
    }

    /// Learn from one response: `uncached_tokens` and `in_flight` as estimated
    /// when it was routed, `ttft_ms` as observed. Ignored when learning is off
    /// or an input is outside `[0, OBS_LIMITS]` (NaN included).
    pub fn observe(&mut self, uncached_tokens: f64, in_flight: f64, ttft_ms: f64) {
        let (u, l, t) = OBS_LIMITS;
        let sane = (0.0..=u).contains(&uncached_tokens)
            && (0.0..=l).contains(&in_flight)
            && (0.0..=t).contains(&ttft_ms);
        if !(self.cfg.learn && sane) {
            return;
        }
        let x = [1.0, uncached_tokens / 1000.0, in_flight];
        let lambda = self.cfg.forget.clamp(0.9, 1.0);
        // k = P x / (λ + xᵀ P x)
        let mut px = [0.0; 3];
        for (i, v) in px.iter_mut().enumerate() {
            *v = (0..3).map(|j| self.p[i][j] * x[j]).sum();
        }
        let denom = lambda + (0..3).map(|i| x[i] * px[i]).sum::<f64>();
        if !(denom.is_finite() && denom > 0.0) {
            self.stabilise();
            return;
        }
        let k = [px[0] / denom, px[1] / denom, px[2] / denom];
        let err = ttft_ms - (0..3).map(|i| self.theta[i] * x[i]).sum::<f64>();
        for (t, ki) in self.theta.iter_mut().zip(k) {
            *t += ki * err;
        }
        // P = (P − k xᵀ P) / λ
        let mut xp = [0.0; 3];
        for (j, v) in xp.iter_mut().enumerate() {
            *v = (0..3).map(|i| x[i] * self.p[i][j]).sum();
        }
        for (row, ki) in self.p.iter_mut().zip(k) {
            for (v, xpj) in row.iter_mut().zip(xp) {
                *v = (*v - ki * xpj) / lambda;
            }
        }
        self.stabilise();
        self.observations += 1;
    }
}

/// `v` clamped to `range`; NaN reads as the lower bound.
fn clamp(v: f64, range: (f64, f64)) -> f64 {
    if v.is_nan() {
        range.0
    } else {
        v.clamp(range.0, range.1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    /// Feed 5000 observations of the system 20 ms + 33 ms per 1000 tokens + 4 ms
    /// per in-flight request (± 5 ms of noise if `noisy`), then check the prices.
    fn learn_linear_system(m: &mut CostModel, seed: u64, noisy: bool) {
        let mut s = seed;
        for _ in 0..5000 {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let u = ((s >> 33) % 9000) as f64;
            let l = ((s >> 20) % 40) as f64;
            let noise = if noisy {
                ((s >> 50) % 11) as f64 - 5.0
            } else {
                0.0
            };
            m.observe(u, l, 20.0 + 0.033 * u + 4.0 * l + noise);
        }
        let (b, c) = m.prices();
        assert!((b - 33.0).abs() < 1.0, "prefill {b}");
        assert!((c - 4.0).abs() < 0.3, "wait {c}");
    }

    fn unfloored() -> CostConfig {
        CostConfig {
            prefill_floor: false,
            ..CostConfig::default()
        }
    }

    #[test]
    fn learns_the_prices_of_a_linear_system() {
        let mut m = CostModel::new(unfloored());
        assert_eq!(m.prices(), (50.0, 10.0));
        learn_linear_system(&mut m, 1, true);
        assert_eq!(m.observations(), 5000);
    }

    #[test]
    fn the_configured_prefill_price_is_a_floor() {
        // The system's 33 ms per 1000 tokens is learned, but the floor (the
        // configured 50) is what placement pays; the wait price is learned.
        let mut m = CostModel::new(CostConfig::default());
        let mut s = 3u64;
        let mut feed = |m: &mut CostModel, per_token: f64| {
            for _ in 0..5000 {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let (u, l) = (((s >> 33) % 9000) as f64, ((s >> 20) % 40) as f64);
                m.observe(u, l, 20.0 + per_token * u + 4.0 * l);
            }
        };
        feed(&mut m, 0.033);
        let (b, c) = m.prices();
        assert_eq!(b, 50.0);
        assert!((c - 4.0).abs() < 0.3, "wait {c}");
        assert!((m.learned_prefill_ms_per_ktok() - 33.0).abs() < 1.0);
        // Above the floor, the learned price is used.
        feed(&mut m, 0.08);
        assert!((m.prices().0 - 80.0).abs() < 2.0, "{:?}", m.prices());
    }

    #[test]
    fn prices_stay_in_range_and_learning_can_be_off() {
        let mut m = CostModel::new(CostConfig::default());
        for _ in 0..100 {
            m.observe(1000.0, 10.0, -1e9);
        }
        let (b, c) = m.prices();
        assert!(b >= PREFILL_RANGE.0 && c >= WAIT_RANGE.0);
        let mut off = CostModel::new(CostConfig {
            learn: false,
            ..CostConfig::default()
        });
        off.observe(1000.0, 1.0, 5000.0);
        off.observe(f64::NAN, 1.0, 5.0);
        assert_eq!(off.prices(), (50.0, 10.0));
        assert_eq!(off.observations(), 0);
    }

    #[test]
    fn the_run_time_averages_streams_and_ignores_garbage() {
        let mut m = CostModel::new(CostConfig::default());
        assert_eq!(m.run_ms(), 0.0);
        // The first observation is taken whole, later ones move it by
        // 1 / RUN_MEMORY of the difference.
        m.observe_run(2000.0);
        assert_eq!(m.run_ms(), 2000.0);
        m.observe_run(3000.0);
        assert!((m.run_ms() - (2000.0 + 1000.0 / RUN_MEMORY)).abs() < 1e-9);
        // Garbage is ignored.
        let before = m.run_ms();
        for ms in [-1.0, f64::NAN, f64::INFINITY, OBS_LIMITS.2 * 2.0] {
            m.observe_run(ms);
        }
        assert_eq!(m.run_ms(), before);
        // About RUN_MEMORY × 5 observations bring it within 1 % of a new level.
        for _ in 0..(RUN_MEMORY as usize * 5) {
            m.observe_run(500.0);
        }
        assert!((m.run_ms() - 500.0).abs() < 0.01 * before);
        // Learning off: nothing is learned.
        let mut off = CostModel::new(CostConfig {
            learn: false,
            ..CostConfig::default()
        });
        off.observe_run(1000.0);
        assert_eq!(off.run_ms(), 0.0);
    }

    #[test]
    fn absurd_observations_are_ignored() {
        let mut m = CostModel::new(CostConfig::default());
        for (u, l, t) in [
            (1000.0, 1.0, 1e12),
            (1000.0, 1.0, -5.0),
            (-1.0, 1.0, 50.0),
            (1e9, 1.0, 50.0),
            (1000.0, 1e7, 50.0),
            (f64::INFINITY, 1.0, 50.0),
            (1000.0, f64::NAN, 50.0),
        ] {
            m.observe(u, l, t);
        }
        assert_eq!(m.observations(), 0);
        assert_eq!(m.prices(), (50.0, 10.0));
    }

    #[test]
    fn no_windup_after_a_long_unexciting_stretch() {
        let mut m = CostModel::new(CostConfig {
            forget: 0.99,
            ..unfloored()
        });
        // 100 000 identical observations (an idle cluster, one prompt size):
        // without a bound the covariance grows by 1/0.99 per step in the
        // unexcited directions and overflows after about 70 000 of them (with
        // the default 0.999, after about 700 000).
        for _ in 0..100_000 {
            m.observe(0.0, 0.0, 20.0);
        }
        assert!(
            m.covariance_trace() <= MAX_TRACE,
            "{}",
            m.covariance_trace()
        );
        assert!(m.covariance_trace().is_finite());
        // It still learns a new system afterwards.
        learn_linear_system(&mut m, 7, false);
    }
}
