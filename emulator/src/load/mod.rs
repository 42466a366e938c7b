//! `prefix-load`: the workload driver (see `cli` for flags, `workload` for the workloads,
//! `runner` for what is measured, `report` for the summary and the comparison table, `trace` for
//! Mooncake-style trace files replayed with `--trace`).

pub mod cli;
pub mod report;
pub mod rng;
pub mod runner;
pub mod trace;
pub mod workload;
