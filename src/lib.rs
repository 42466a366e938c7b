//! # prefix-router
//!
//! Prefix-aware, load-bounded routing of LLM inference requests, as an Envoy
//! proxy-wasm HTTP filter.
//!
//! The crate has two layers:
//! - a **pure routing core** with no proxy-wasm dependency, built and tested
//!   natively (and on wasm32 with `wasm-bindgen-test`), reused by the simulator:
//!   [`config`] (serde + validation), [`extract`] and [`json`] (body → prefix
//!   text, one zero-copy pass), [`hash`] (chained block hashes, [`blockhash`]), [`ring`]
//!   (consistent hashing with virtual nodes), [`select`] (bounded-load
//!   selection), [`index`] (four-way set-associative index of recently routed blocks),
//!   [`affinity`] (longest known prefix, cost-aware spill), [`cost`] (prices
//!   learned from observed TTFT), [`decision`] (the reason of every decision),
//!   [`router`] (the facade), [`engine`] (load the replicas report in their
//!   Prometheus metrics: vLLM, SGLang, llama.cpp), [`usage`] (what the engine
//!   delivered, read from the response as it passes), [`feedback`] (the index
//!   corrected by what was delivered), [`responses`] (Responses API
//!   conversations pinned to the replica that stores them), [`peers`] (index
//!   writes exchanged between gateway Envoys);
//! - a **thin proxy-wasm adapter** (`filter`, only on `wasm32-wasip1`) that
//!   buffers the body, keeps per-host in-flight counts and the prefix index in
//!   shared data, sets the `override_host` header and counts every decision in
//!   Envoy stats.
//!
//! ```
//! use prefix_router::cost::CostModel;
//! use prefix_router::index::VecStore;
//! use prefix_router::{Body, Config, Loads, Router};
//! let cfg = Config::from_json(br#"{"endpoints":["10.0.0.1:8000","10.0.0.2:8000"]}"#).unwrap();
//! let router = Router::new(cfg); // strategy `affinity` by default
//! let mut index = VecStore::new(router.config().affinity.index_slots); // shared data in the filter
//! let cost = CostModel::new(router.cost_config());
//! let body = br#"{"model":"m","messages":[{"role":"user","content":"hello"}]}"#;
//! let key = router.key(Body::Complete(body), None);
//! let loads = [0, 0];
//! let (first, _) = router.select_affinity(&key, body.len(), Loads::new(&loads), &mut index, &cost, 0, 0);
//! assert_eq!(first.branch.as_str(), "cold"); // nothing known: ring placement
//! let (again, _) = router.select_affinity(&key, body.len(), Loads::new(&loads), &mut index, &cost, 10, 1);
//! assert_eq!(again.branch.as_str(), "hit"); // the index knows who has it
//! assert_eq!(again.primary, first.primary);
//! ```
#![warn(missing_docs)]

pub mod affinity;
pub mod alloc_count;
pub mod blockhash;
pub mod bytescan;
pub mod cluster;
pub mod config;
pub mod cost;
pub mod decision;
pub mod engine;
pub mod extract;
pub mod feedback;
pub mod hash;
pub mod header_pairs;
pub mod index;
pub mod json;
pub mod paths;
pub mod peers;
pub mod peers_backoff;
pub mod peers_budget;
pub mod peers_config;
pub mod peers_log;
pub mod peers_queue;
pub mod pressure;
pub mod responses;
pub mod ring;
pub mod router;
pub mod select;
pub mod share;
pub mod usage;

#[cfg(all(target_arch = "wasm32", target_os = "wasi"))]
mod filter;

pub use config::{Config, ConfigError, Strategy};
pub use decision::{Branch, Decision, KeySource};
pub use router::{Body, Router, RoutingId, RoutingKey};
pub use select::Loads;
