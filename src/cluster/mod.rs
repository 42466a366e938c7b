//! The live cluster view: membership, health and load shared by every worker
//! VM, kept apart from selection (discovery and health are *sources* that
//! feed [`crate::select`] / [`crate::affinity`] an availability vector, the
//! way pingora keeps discovery and health checks apart from `select_with`).
//!
//! - [`shared`]: the [`shared::SharedData`] trait (proxy-wasm shared data with
//!   CAS tokens) and an in-memory [`shared::MockShared`] with injectable
//!   failures, so everything here is tested natively;
//! - [`admin`]: parse Envoy's admin `/clusters?format=json` into the hosts of
//!   one cluster (address, availability from the health flags, `rq_active`);
//! - [`tables`]: the few shared-data keys of a plugin (membership snapshot,
//!   poll lease, in-flight counts and passive down marks keyed by address);
//! - [`engines`]: engine samples per host and their use (load, saturation,
//!   LoRA adapter tiers);
//! - [`view`]: one worker's routing view of a snapshot (the [`crate::Router`]
//!   over its addresses, availability, holder ids) and [`view::AddrSlots`],
//!   which keeps the prefix index's holders as address ids, not list positions.
//! - [`slots`]: the prefix index's slot table on [`shared::SharedData`], four
//!   slots (one four-way set) per key.
//!
//! Keys (namespace `prefix_router/<plugin name>/`, no configuration hash, so
//! a configuration push or a membership change keeps counts and index):
//! `members`, `lease`, `inflight`, `down`, `engine`, `rr`, and the index's
//! `i/<k>` (four slots per key: at most `index_slots / 4`, [`slots`], plus
//! the reserved slots of [`crate::pressure`] and [`crate::share`]). The set is fixed: it never grows with
//! pushes, generations or hosts (hosts live *inside* the table values, pruned
//! when they leave and hold nothing).

pub mod admin;
pub mod engines;
pub mod queued;
pub mod request;
pub mod shared;
pub mod slots;
pub mod sync;
pub mod tables;
pub mod view;
