//! # prefix-router
//!
//! Prefix-aware, load-bounded routing of LLM inference requests, as an Envoy
//! proxy-wasm HTTP filter.
//!
//! The crate has two layers:
//! - a **pure routing core** with no proxy-wasm dependency, built and tested
//!   natively (and on wasm32 with `wasm-bindgen-test`), reused by the simulator:
//!   [`config`] (serde + validation), [`extract`] (body → prefix text hashes),
//!   [`hash`] (chained xxh3 blocks), [`ring`] (consistent hashing with virtual
//!   nodes), [`select`] (bounded-load selection), [`decision`] (the reason of
//!   every decision), [`router`] (the facade);
//! - a **thin proxy-wasm adapter** (`filter`, only on `wasm32-wasip1`) that
//!   buffers the body, keeps per-host in-flight counts in shared data, sets the
//!   `override_host` header and counts every decision in Envoy stats.
//!
//! ```
//! use prefix_router::{Body, Config, Loads, Router};
//! let cfg = Config::from_json(br#"{"endpoints":["10.0.0.1:8000","10.0.0.2:8000"]}"#).unwrap();
//! let router = Router::new(cfg);
//! let body = br#"{"model":"m","messages":[{"role":"user","content":"hello"}]}"#;
//! let key = router.key(Body::Complete(body), None);
//! let decision = router.select(&key, Loads::new(&[0, 0]), 0);
//! assert_eq!(decision.branch.as_str(), "hit");
//! ```
#![warn(missing_docs)]

pub mod affinity;
pub mod config;
pub mod cost;
pub mod decision;
pub mod extract;
pub mod hash;
pub mod index;
pub mod json;
pub mod ring;
pub mod router;
pub mod select;

#[cfg(all(target_arch = "wasm32", target_os = "wasi"))]
mod filter;

pub use config::{Config, ConfigError, Strategy};
pub use decision::{Branch, Decision, KeySource};
pub use router::{Body, Router, RoutingId, RoutingKey};
pub use select::Loads;
