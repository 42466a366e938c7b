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
//! | `oracle` | true cache state: longest really-cached prefix under the bounded load |
//! | `oracle_ttft` | true cache and queue state, greedy minimum estimated TTFT |
//! | `ours` | `prefix_router::affinity` (longest known prefix + cost-aware spill) |
//! | `ours_2x` | `ours` in two independent Envoys (own index, own in-flight counts), requests split at random |
//! | `MODE/N[/DELAY]` | `ours` in N gateways with the multi-gateway options of `gateways.rs` |

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
    /// Request `idx` finished on `replica` (its response ended).
    fn on_done(&mut self, _idx: u32, _replica: usize) {}
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
    "oracle",
    "oracle_ttft",
    "ours",
    "ours_2x",
];

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
            let p = if gateways::is_name(p) {
                "ours"
            } else {
                p.as_str()
            };
            match p {
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
                    "sagemaker",
                    format!(
                        r#","strategy":"prefix","prefix_length":2048,"concurrency_threshold":{BASELINE_THRESHOLD},"load_factor":100"#
                    ),
                )?,
                "ours" | "ours_2x" | "ours_feedback" | "ours_feedback_2x" => add(
                    "ours",
                    format!(
                        r#","strategy":"prefix","prefix_length":{},"virtual_nodes":{}"#,
                        ours.prefix_length, ours.virtual_nodes
                    ),
                )?,
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
    Ok(match name {
        "random" | "round_robin" | "least_request_core" | "session" | "sagemaker" => {
            let label = if name == "least_request_core" {
                "least_request"
            } else {
                name
            };
            let (i, router) = core(label)?;
            Box::new(basic::Core::new(router, i, seed))
        }
        "least_request" => Box::new(basic::PowerOfTwo::new(n, seed)),
        "chwbl" => Box::new(chwbl::Chwbl::new(n, 1.25, 256)),
        "gie" => Box::new(gie::Gie::new(n, model.kv_blocks as usize, seed)),
        "sglang" => Box::new(sglang::CacheAware::new(n, seed)),
        "oracle" => Box::new(oracle::Oracle::new(n, true)),
        "oracle_ttft" => Box::new(oracle::Oracle::new(n, false)),
        "ours" => {
            let (i, router) = core("ours")?;
            Box::new(ours::Ours::new(router, i, ours.clone(), model)?)
        }
        "ours_2x" => {
            let (i, router) = core("ours")?;
            Box::new(ours::OursMulti::new(
                router,
                i,
                ours.clone(),
                model,
                2,
                n,
                seed,
            )?)
        }
        "ours_feedback" | "ours_feedback_2x" => {
            let (i, router) = core("ours")?;
            let m = if name == "ours_feedback" { 1 } else { 2 };
            Box::new(ours_feedback::OursFeedback::new(
                router,
                i,
                ours.clone(),
                m,
                n,
                seed,
            ))
        }
        gw if gateways::is_name(gw) => {
            let (i, router) = core("ours")?;
            Box::new(gateways::build(gw, router, i, ours, n, seed)?)
        }
        other => {
            return Err(format!(
                "unknown policy {other:?}; known: {}",
                ALL.join(", ")
            ))
        }
    })
}
