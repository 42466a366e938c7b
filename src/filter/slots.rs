//! The `affinity` prefix index's slot table in proxy-wasm shared data.
//!
//! One shared-data key per slot, `prefix_router/<plugin>/i/<slot>` (no configuration
//! fingerprint: a push keeps the index; holders are address ids, see
//! [`crate::cluster::view::AddrSlots`]),
//! holding the [`ENTRY_BYTES`]-byte (24) entry of [`crate::index`]. Shared data has no delete,
//! which the direct-mapped design expects: a slot is only ever overwritten,
//! so memory stays bounded by `index_slots` keys. Writes are unconditional
//! (last writer wins): the index is approximate by design. Costs: get ≈ 0.8 µs,
//! set ≈ 0.2 µs. Host failures read as "unknown" and are counted, never fatal.
//! Keys are written into one reused per-VM buffer ([`slot_key_into`]): no
//! allocation or `format!` per get/set.

use super::host;
use crate::index::{slot_key_into, SlotStore, SlotValue, ENTRY_BYTES};
use std::cell::{Cell, RefCell};

thread_local! {
    /// Key buffer of this VM (single-threaded), reused by every get/set.
    static KEY: RefCell<String> = const { RefCell::new(String::new()) };
}

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

    /// Run `f` on the key of `slot` (in the reused buffer; a fresh one if the
    /// buffer is somehow in use).
    fn with_key<R>(&self, slot: u32, f: impl FnOnce(&str) -> R) -> R {
        KEY.with(|k| match k.try_borrow_mut() {
            Ok(mut buf) => {
                slot_key_into(&mut buf, self.prefix, slot);
                f(&buf)
            }
            Err(_) => {
                let mut buf = String::new();
                slot_key_into(&mut buf, self.prefix, slot);
                f(&buf)
            }
        })
    }

    fn failed(&self) {
        self.failures.set(self.failures.get() + 1);
    }
}

impl SlotStore for SharedSlots<'_> {
    fn get(&self, slot: u32) -> Option<SlotValue> {
        if super::probe::off(super::probe::Ablate::Slots) {
            return None;
        }
        match self.with_key(slot, host::shared_get) {
            Ok((Some(v), _)) => <SlotValue>::try_from(v.as_slice()).ok(),
            Ok((None, _)) => None,
            Err(_) => {
                self.failed();
                None
            }
        }
    }

    fn set(&mut self, slot: u32, value: SlotValue) {
        if super::probe::off(super::probe::Ablate::Slots) {
            return;
        }
        if self
            .with_key(slot, |k| host::shared_set(k, &value[..ENTRY_BYTES], 0))
            .is_err()
        {
            self.failed();
        }
    }
}
