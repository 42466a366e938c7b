//! The `affinity` prefix index's slot table in proxy-wasm shared data: the
//! core's [`crate::cluster::slots::SharedSlots`] (four slots per key, the
//! last 16 keys held for one callback, CAS on writes; costs and layout there)
//! on the host's shared data, switched off by the `slots` ablation probe.

use super::host::HostShared;
use super::probe::{off, Ablate};

/// The slot store of one host callback.
pub type SharedSlots<'p> = crate::cluster::slots::SharedSlots<'p, HostShared>;

/// The prefix index under `prefix` (`index_slots` slots).
pub fn index(prefix: &str, slots: u32) -> SharedSlots<'_> {
    SharedSlots::index(&HostShared, prefix, slots).enabled(!off(Ablate::Slots))
}

/// Another slot table under `prefix` (one key per slot).
pub fn plain(prefix: &str) -> SharedSlots<'_> {
    SharedSlots::new(&HostShared, prefix).enabled(!off(Ablate::Slots))
}
