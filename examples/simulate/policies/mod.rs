//! Routing policies compared by the simulator.
//!
//! Every policy sees a [`View`]: the time and the router's per-replica
//! in-flight counts (what the filter keeps in shared data). Only the oracle
//! reads the replicas' true state, and only GIE reads scraped engine metrics
//! (50 ms old at most), as its real deployment does.
//!
//! | name | source of the algorithm |
//! |---|---|
//! | `random`, `round_robin`, `least_request_core`, `session`, `sagemaker` | our routing core (`Router::select`), strategies `random`, `round_robin`, `least_request`, `session`, `prefix` |
//! | `least_request` | Envoy `LEAST_REQUEST`: power of two random choices |
//! | `chwbl` | KubeAI `PrefixHash` (consistent hashing with bounded loads) |
//! | `gie` | Gateway API Inference Extension / llm-d EPP, approximate prefix scorer |
//! | `sglang` | SGLang router `cache_aware` (CLI defaults) |
//! | `greedy_true_state` | true cache state: longest really-cached prefix under ours' load bound (a greedy heuristic, not a bound) |
//! | `greedy_true_ttft` | true cache and queue state, greedy minimum estimated TTFT under ours' load bound |
//! | `ours` | `prefix_router::affinity` (longest known prefix + cost-aware spill) |
//! | `ours_2x` | `ours` in two independent Envoys (own index, own in-flight counts), requests split at random |
//! | `MODE/N[/DELAY]` | `ours` in N gateways with the multi-gateway options of `gateways.rs` |
//!
//! Baselines take parameters in their name, `base:k=v/k=v` (see
//! [`PARAMS`]); `*_tuned` names are the best settings of a sweep
//! (`examples/simulate/README.md`, "Fair baselines").

pub mod basic;
pub mod chwbl;
pub mod gateways;
pub mod gie;
pub mod lru;
pub mod oracle;
pub mod ours;
pub mod ours_feedback;
pub mod sglang;

use prefix_router::{Config, Router};

use crate::engine::SimRequest;
use crate::model::ModelParams;
use crate::replica::{Metrics, Replica};

/// The filter's queue picture (`src/cluster/queued.rs`, `Queued::start`):
/// add the expected uncached prompt tokens of a request routed to replica
/// `r` to its count (`q`: `None` without the picture). Returns the tokens
/// (rounded), to be taken off by [`queue_finish`] at the first token.
pub fn queue_start(q: Option<&mut Vec<u32>>, r: usize, tokens: f64) -> u32 {
    let t = tokens.round() as u32;
    if let Some(x) = q.and_then(|q| q.get_mut(r)) {
        *x = x.saturating_add(t);
    }
    t
}

/// The filter's `Queued::finish` at the first response byte: take the
/// `tokens` that [`queue_start`] added for replica `r` off its count.
pub fn queue_finish(q: Option<&mut Vec<u32>>, r: usize, tokens: u32) {
    if let Some(x) = q.and_then(|q| q.get_mut(r)) {
        *x = x.saturating_sub(tokens);
    }
}

/// First-token times by request, for the filter's run-time observation
/// ([`prefix_router::cost::CostModel::observe_run`]: a streamed response's
/// first token to its end).
#[derive(Debug, Default, Clone)]
pub struct RunClock(Vec<f64>);

impl RunClock {
    /// Request `idx` gave its first token at `now` (s).
    pub fn first_token(&mut self, idx: u32, now: f64) {
        let i = idx as usize;
        if self.0.len() <= i {
            self.0.resize(i + 1, f64::NAN);
        }
        self.0[i] = now;
    }

    /// Request `idx` ended at `now` (s): its first-token-to-end time, ms
    /// (`None` without a first token; once per request).
    pub fn done(&mut self, idx: u32, now: f64) -> Option<f64> {
        let t = self.0.get_mut(idx as usize)?;
        let first = std::mem::replace(t, f64::NAN);
        first.is_finite().then(|| (now - first).max(0.0) * 1000.0)
    }
}

/// What a policy may look at when routing.
pub struct View<'a> {
    /// Simulated time, seconds.
    pub now: f64,
    /// Router-side in-flight requests per replica.
    pub in_flight: &'a [u32],
    /// True replica state (oracle only).
    pub replicas: &'a [Replica],
    /// Last scraped engine metrics (metrics-based policies only).
    pub scraped: &'a [Metrics],
    /// Replica model (oracle only).
    pub model: &'a ModelParams,
}

/// A routing decision.
#[derive(Debug, Clone, Copy)]
pub struct Routed {
    /// Replica index.
    pub replica: usize,
    /// The policy sent the request away from the replica it considered warm.
    pub spill: bool,
}

/// A routing policy.
pub trait Policy: Send {
    /// Choose a replica for request `idx`.
    fn route(&mut self, idx: u32, req: &SimRequest, view: &View<'_>) -> Routed;
    /// Does the policy read scraped metrics?
    fn needs_scrape(&self) -> bool {
        false
    }
    /// The first token of a request arrived (observed TTFT).
    fn on_first_token(
        &mut self,
        _idx: u32,
        _req: &SimRequest,
        _replica: usize,
        _ttft: f64,
        _now: f64,
    ) {
    }
    /// The engine reported `cached` prompt tokens served from its cache for
    /// request `idx` on `replica` (known with the first token).
    fn on_delivered(&mut self, _idx: u32, _req: &SimRequest, _replica: usize, _cached: u32) {}
    /// Request `idx` finished on `replica` (its response ended) at `now` (s).
    fn on_done(&mut self, _idx: u32, _replica: usize, _now: f64) {}
    /// Extra figures for the report (name, value).
    fn extra(&self) -> Vec<(String, f64)> {
        Vec::new()
    }
}

/// Every policy, in report order.
pub const ALL: &[&str] = &[
    "random",
    "round_robin",
    "least_request",
    "least_request_core",
    "session",
    "sagemaker",
    "chwbl",
    "gie",
    "sglang",
    "greedy_true_state",
    "greedy_true_ttft",
    "ours",
    "ours_2x",
];

/// Default report order with the tuned baselines.
pub const DEFAULT: &[&str] = &[
    "random",
    "round_robin",
    "least_request",
    "least_request_core",
    "session",
    "sagemaker",
    "sagemaker_tuned",
    "chwbl",
    "chwbl_tuned",
    "gie",
    "gie_tuned",
    "sglang",
    "sglang_tuned",
    "greedy_true_state",
    "greedy_true_ttft",
    "ours",
    "ours_2x",
];

/// Parameters each baseline accepts (`name:k=v/k=v`) with their defaults
/// (the documented defaults the rows without parameters use).
pub const PARAMS: &[(&str, &[(&str, f64)])] = &[
    // prefix_length chars, concurrency_threshold, least = overflow to the
    // least loaded instead of walking the ring.
    (
        "sagemaker",
        &[("pl", 2048.0), ("th", 256.0), ("least", 0.0)],
    ),
    // KubeAI meanLoadFactor.
    ("chwbl", &[("lf", 1.25)]),
    // scorer weights, saturation thresholds.
    (
        "gie",
        &[
            ("wp", 3.0),
            ("wq", 2.0),
            ("wk", 2.0),
            ("satq", 5.0),
            ("satkv", 0.8),
        ],
    ),
    // cache_threshold, balance_abs_threshold, balance_rel_threshold.
    ("sglang", &[("cache", 0.3), ("abs", 64.0), ("rel", 1.5)]),
];

/// Best settings of the baseline sweep (README, "Fair baselines"), by name.
pub const TUNED: &[(&str, &str)] = &[
    ("sagemaker_tuned", "sagemaker:pl=4096/th=256/least=1"),
    ("chwbl_tuned", "chwbl:lf=2"),
    ("gie_tuned", "gie:wp=5/wq=1/satq=20"),
    ("sglang_tuned", "sglang:cache=0.1/abs=64/rel=1.5"),
];

/// Base of the multi-gateway policies `MODE/N[/DELAY]` ([`gateways`]).
pub const GATEWAYS: &str = "ours_gateways";

/// A policy name resolved to its base and parameters.
#[derive(Debug, Clone)]
pub struct Spec {
    /// Base policy (an entry of [`ALL`]).
    pub base: String,
    /// Parameter values (defaults filled in).
    pub params: Vec<(String, f64)>,
    /// `ours`/`ours_2x`: `k=v` overrides of `--ours` (any [`ours::OursParams::set`] name).
    pub ours: Vec<(String, String)>,
}

impl Spec {
    /// `base`'s parameters of ours: `--ours` with this name's overrides.
    ///
    /// # Errors
    /// Unknown parameter or bad value.
    pub fn ours_params(&self, base: &ours::OursParams) -> Result<ours::OursParams, String> {
        let mut p = base.clone();
        for (k, v) in &self.ours {
            p.set(k, v)?;
        }
        Ok(p)
    }
}

fn ours_label(p: &ours::OursParams) -> String {
    format!("ours_pl{}_vn{}", p.prefix_length, p.virtual_nodes)
}

impl Spec {
    /// Parameter `k` (0 when the base has no such parameter).
    pub fn get(&self, k: &str) -> f64 {
        self.params
            .iter()
            .find(|(n, _)| n == k)
            .map_or(0.0, |(_, v)| *v)
    }
}

/// Resolve `name` (`base`, `base:k=v/k=v` or a `*_tuned` alias).
///
/// # Errors
/// Unknown base or parameter, bad value.
pub fn resolve(name: &str) -> Result<Spec, String> {
    if gateways::is_name(name) {
        return Ok(Spec {
            base: GATEWAYS.to_string(),
            params: Vec::new(),
            ours: Vec::new(),
        });
    }
    let name = TUNED
        .iter()
        .find(|(t, _)| *t == name)
        .map_or(name, |(_, s)| *s);
    let (base, rest) = name.split_once(':').unwrap_or((name, ""));
    if !ALL.contains(&base) && !EXTRA.contains(&base) {
        return Err(format!(
            "unknown policy {base:?}; known: {}, {}",
            ALL.join(", "),
            TUNED.iter().map(|t| t.0).collect::<Vec<_>>().join(", ")
        ));
    }
    if base.starts_with("ours") {
        let mut ours = Vec::new();
        for kv in rest.split('/').filter(|s| !s.is_empty()) {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| format!("{name}: expected k=v, got {kv}"))?;
            ours::OursParams::default().set(k, v)?;
            ours.push((k.to_string(), v.to_string()));
        }
        return Ok(Spec {
            base: base.to_string(),
            params: Vec::new(),
            ours,
        });
    }
    let defaults: &[(&str, f64)] = PARAMS
        .iter()
        .find(|(b, _)| *b == base)
        .map_or(&[], |(_, d)| d);
    let mut params: Vec<(String, f64)> =
        defaults.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    for kv in rest.split('/').filter(|s| !s.is_empty()) {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| format!("{name}: expected k=v, got {kv}"))?;
        let v: f64 = v
            .parse()
            .ok()
            .filter(|x: &f64| x.is_finite())
            .ok_or_else(|| format!("{name}: bad value {v}"))?;
        let slot = params
            .iter_mut()
            .find(|(n, _)| n == k)
            .ok_or_else(|| format!("{name}: {base} has no parameter {k}"))?;
        slot.1 = v;
    }
    Ok(Spec {
        base: base.to_string(),
        params,
        ours: Vec::new(),
    })
}

fn sagemaker_label(s: &Spec) -> String {
    format!(
        "sagemaker_pl{}_th{}",
        s.get("pl") as u64,
        s.get("th") as u64
    )
}

/// Policies run only when named (`--policies`): `ours` with engine feedback
/// (`policies/ours_feedback.rs`), on one and on two gateways.
pub const EXTRA: &[&str] = &["ours_feedback", "ours_feedback_2x"];

/// Endpoint names of `n` replicas (sorted order = replica index for ≤ 9).
pub fn endpoints(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| format!("10.0.{}.{}:8000", i / 200, i % 200 + 1))
        .collect()
}

/// The core router configurations the selected policies need, by label;
/// `Keys::core[i]` is computed with `routers[i]`.
pub struct KeyBook {
    /// (label, router).
    pub routers: Vec<(String, Router)>,
}

/// `concurrency_threshold` of the `session` and `sagemaker` baselines: vLLM's
/// `max_num_seqs` (256), the in-flight count at which a replica starts to
/// queue. (The core's default, 64, makes both spill most requests at the
/// chat workload's concurrency.)
pub const BASELINE_THRESHOLD: u32 = 256;

/// Header carrying the session id for the `session` policy.
pub const SESSION_HEADER: &str = "x-session-id";

impl KeyBook {
    /// Routers for `policies` on `n` replicas.
    pub fn new(policies: &[String], n: usize, ours: &ours::OursParams) -> Result<KeyBook, String> {
        let eps = serde_json::to_string(&endpoints(n)).map_err(|e| e.to_string())?;
        let mut routers: Vec<(String, Router)> = Vec::new();
        let mut add = |label: &str, extra: String| -> Result<(), String> {
            if routers.iter().any(|(l, _)| l == label) {
                return Ok(());
            }
            let json = format!(r#"{{"endpoints":{eps}{extra}}}"#);
            let cfg = Config::from_json(json.as_bytes()).map_err(|e| format!("{label}: {e}"))?;
            routers.push((label.to_string(), Router::new(cfg)));
            Ok(())
        };
        for p in policies {
            let spec = resolve(p)?;
            match spec.base.as_str() {
                "random" => add("random", r#","strategy":"random""#.into())?,
                "round_robin" => add("round_robin", r#","strategy":"round_robin""#.into())?,
                "least_request_core" => {
                    add("least_request", r#","strategy":"least_request""#.into())?
                }
                "session" => add(
                    "session",
                    format!(
                        r#","strategy":"session","affinity_header":"{SESSION_HEADER}","concurrency_threshold":{BASELINE_THRESHOLD}"#
                    ),
                )?,
                "sagemaker" => add(
                    &sagemaker_label(&spec),
                    format!(
                        r#","strategy":"prefix","prefix_length":{},"concurrency_threshold":{},"load_factor":100"#,
                        spec.get("pl") as u64,
                        spec.get("th") as u32
                    ),
                )?,
                "ours" | "ours_2x" | "ours_feedback" | "ours_feedback_2x" | GATEWAYS => {
                    let o = spec.ours_params(ours)?;
                    add(
                        &ours_label(&o),
                        format!(
                            r#","strategy":"prefix","prefix_length":{},"virtual_nodes":{}"#,
                            o.prefix_length, o.virtual_nodes
                        ),
                    )?
                }
                _ => {}
            }
        }
        Ok(KeyBook { routers })
    }

    /// Index of `label` in [`KeyBook::routers`].
    pub fn index(&self, label: &str) -> Option<usize> {
        self.routers.iter().position(|(l, _)| l == label)
    }

    /// Characters of message text any key extractor reads (≥ GIE's 16 384).
    pub fn max_chars(&self) -> usize {
        self.routers
            .iter()
            .map(|(_, r)| r.config().prefix_length)
            .max()
            .unwrap_or(0)
            .max(gie::MAX_CHARS)
            + 64
    }
}

/// `o` with the index secret of run `seed`. The filter draws its secret
/// per Envoy process (`src/filter/secret.rs`); it moves every slot, so which
/// keys collide, and through them the decisions of a loaded fleet. On a trace,
/// whose requests do not depend on the seed, this is what `--seeds` varies for
/// `ours` (before, every seed of a trace gave the same run). Seed 1 keeps
/// secret 0, so every single-seed figure is unchanged.
fn with_run_secret(mut o: ours::OursParams, seed: u64) -> ours::OursParams {
    o.index.secret = seed.wrapping_sub(1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    o
}

/// Build policy `name`.
pub fn build(
    name: &str,
    book: &KeyBook,
    n: usize,
    seed: u64,
    model: &ModelParams,
    ours: &ours::OursParams,
) -> Result<Box<dyn Policy>, String> {
    let core = |label: &str| -> Result<(usize, Router), String> {
        let i = book
            .index(label)
            .ok_or_else(|| format!("no router for {label}"))?;
        Ok((i, book.routers[i].1.clone()))
    };
    let spec = resolve(name)?;
    // The `ours` family: its parameters with this run's index secret, and
    // the shared router of that configuration.
    let ours_core = || -> Result<(ours::OursParams, usize, Router), String> {
        let o = with_run_secret(spec.ours_params(ours)?, seed);
        let (i, router) = core(&ours_label(&o))?;
        Ok((o, i, router))
    };
    Ok(match spec.base.as_str() {
        "random" | "round_robin" | "least_request_core" | "session" => {
            let label = if name == "least_request_core" {
                "least_request"
            } else {
                name
            };
            let (i, router) = core(label)?;
            Box::new(basic::Core::new(router, i, seed, false))
        }
        "sagemaker" => {
            let (i, router) = core(&sagemaker_label(&spec))?;
            Box::new(basic::Core::new(router, i, seed, spec.get("least") != 0.0))
        }
        "least_request" => Box::new(basic::PowerOfTwo::new(n, seed)),
        "chwbl" => Box::new(chwbl::Chwbl::new(n, spec.get("lf"), 256)),
        "gie" => Box::new(gie::Gie::new(
            n,
            model.kv_blocks as usize,
            seed,
            gie::Weights {
                prefix: spec.get("wp"),
                queue: spec.get("wq"),
                kv: spec.get("wk"),
                sat_waiting: spec.get("satq") as u32,
                sat_kv: spec.get("satkv"),
            },
        )),
        "sglang" => Box::new(sglang::CacheAware::new(
            n,
            seed,
            sglang::Thresholds {
                cache: spec.get("cache"),
                balance_abs: spec.get("abs") as u32,
                balance_rel: spec.get("rel"),
            },
        )),
        "greedy_true_state" => Box::new(oracle::Oracle::new(n, true, &ours.affinity)),
        "greedy_true_ttft" => Box::new(oracle::Oracle::new(n, false, &ours.affinity)),
        "ours" => {
            let (o, i, router) = ours_core()?;
            Box::new(ours::Ours::new(router, i, o, model)?)
        }
        "ours_2x" => {
            let (o, i, router) = ours_core()?;
            Box::new(ours::OursMulti::new(router, i, o, model, 2, n, seed)?)
        }
        "ours_feedback" | "ours_feedback_2x" => {
            let (o, i, router) = ours_core()?;
            let m = if spec.base == "ours_feedback" { 1 } else { 2 };
            Box::new(ours_feedback::OursFeedback::new(router, i, o, m, n, seed))
        }
        GATEWAYS => {
            let (o, i, router) = ours_core()?;
            Box::new(gateways::build(name, router, i, &o, n, seed)?)
        }
        other => {
            return Err(format!(
                "unknown policy {other:?}; known: {}",
                ALL.join(", ")
            ))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_seed_draws_its_own_index_secret_and_seed_1_keeps_0() {
        let o = ours::OursParams::default();
        assert_eq!(with_run_secret(o.clone(), 1).index.secret, 0);
        let secrets: Vec<u64> = (1..=6)
            .map(|s| with_run_secret(o.clone(), s).index.secret)
            .collect();
        for (i, a) in secrets.iter().enumerate() {
            for b in &secrets[i + 1..] {
                assert_ne!(a, b, "two seeds drew the same secret: {secrets:?}");
            }
        }
    }
}
