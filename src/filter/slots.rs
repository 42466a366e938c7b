//! The `affinity` prefix index's slot table in proxy-wasm shared data.
//!
//! One shared-data key per slot, `prefix_router/<plugin>/i/<slot>` (no configuration
//! fingerprint: a push keeps the index; holders are address ids, see
//! [`crate::cluster::view::AddrSlots`]),
//! holding the 16-byte entry of [`crate::index`]. Shared data has no delete,
//! which the direct-mapped design expects: a slot is only ever overwritten,
//! so memory stays bounded by `index_slots` keys. Writes are unconditional
//! (last writer wins): the index is approximate by design. Costs: get ≈ 0.8 µs,
//! set ≈ 0.2 µs. Host failures read as "unknown" and are counted, never fatal.

use super::host;
use crate::index::{SlotStore, SlotValue, ENTRY_BYTES};
use std::cell::Cell;

/// Slot table of one plugin configuration.
pub struct SharedSlots<'p> {
    prefix: &'p str,
    /// Host calls that failed during this request.
    pub failures: Cell<u32>,
}

impl<'p> SharedSlots<'p> {
    /// Slots under `prefix` (the plugin's shared-data namespace).
    pub fn new(prefix: &'p str) -> SharedSlots<'p> {
        SharedSlots {
            prefix,
            failures: Cell::new(0),
        }
    }

    fn key(&self, slot: u32) -> String {
        format!("{}i/{slot:x}", self.prefix)
    }

    fn failed(&self) {
        self.failures.set(self.failures.get() + 1);
    }
}

impl SlotStore for SharedSlots<'_> {
    fn get(&self, slot: u32) -> Option<SlotValue> {
        match host::shared_get(&self.key(slot)) {
            Ok((Some(v), _)) => <SlotValue>::try_from(v.as_slice()).ok(),
            Ok((None, _)) => None,
            Err(_) => {
                self.failed();
                None
            }
        }
    }

    fn set(&mut self, slot: u32, value: SlotValue) {
        if host::shared_set(&self.key(slot), &value[..ENTRY_BYTES], 0).is_err() {
            self.failed();
        }
    }
}
