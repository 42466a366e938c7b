//! End-to-end tests of the prefix-router filter inside a real Envoy 1.40.
//!
//! Every test starts its own `replica-emulator` upstreams and its own Envoy (with
//! `--concurrency 2`, so two worker VMs share the in-flight counts) on free loopback
//! ports, loads the release `.wasm`, sends real HTTP requests and checks where they
//! landed (`x-replica-id`), what the upstream saw (`/debug/requests`), Envoy's stats and
//! its log. The expected replica of a prefix comes from the routing core at zero load.
//!
//! Run with `./build.sh test` (builds and installs everything), or after building:
//! `ENVOY_BIN=... cargo test --features e2e --test e2e`.

// Test code: a failed expectation panics, which is how a test fails. (The crate's lint
// table denies these for library code.)
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod harness;

mod affinity;
mod agreement;
mod bad_config;
mod cluster;
mod delivered;
mod failover;
mod gateways;
mod hostile;
mod load;
mod routing;
mod safety;
mod share;
mod soak;
mod strategies;
