//! The `affinity` prefix index's slot table in shared data ([`SharedData`]:
//! proxy-wasm's in the filter, `src/filter/slots.rs`; [`super::shared::MockShared`] in tests).
//!
//! **Four slots per key.** Table slots `4k` to `4k + 3` (one four-way set,
//! [`crate::index::Sets`], [`SLOTS_PER_KEY`]) share the key `prefix_router/<plugin>/i/<k>`
//! (no configuration fingerprint: a push keeps the index; holders are
//! address ids, see [`crate::cluster::view::AddrSlots`]), whose value is
//! their four [`ENTRY_BYTES`]-byte (24) entries, `4k` first (an all-zero
//! entry: empty). So a probe or a write reads its whole set with one get,
//! and the table holds `index_slots / 4` keys (the per-key overhead of
//! Envoy's map, about 150 bytes, is paid once per four entries).
//! Slots past the table (the reserved ones of [`crate::pressure`] and
//! [`crate::share`]) keep one key each, `…/i/<slot>` with one entry.
//!
//! **Keys kept.** The store keeps the last [`HELD`] keys it read or wrote
//! (values and CAS) for its own lifetime, one host callback: a get of a
//! slot under one of them is free (the other slot of a set just probed,
//! a set the lookup probed and the pending record then writes), and a set
//! writes the key's four entries with the three it does not change taken
//! from there (a set of a slot under another key reads that key first). The write is conditional on
//! the CAS read with it; on a mismatch (another worker wrote the set in
//! between) the key is read again and written once more, unconditionally
//! (a key's first write is unconditional too: proxy-wasm has no
//! create-if-absent, a missing key reads with CAS 0):
//! the index is approximate by design, so a lost write between two
//! workers in the same microseconds is acceptable, a lost *other* entry
//! is what the CAS avoids. A value of another length (an older filter's
//! single entry or two-way pair under the same key) reads as four empty
//! slots and is overwritten. Shared data has no delete, which the design expects:
//! a slot is only ever overwritten, so memory stays bounded by
//! `index_slots / 4` keys. Costs: get ≈ 0.8 µs, set ≈ 0.2 µs. Host
//! failures read as "unknown" and are counted, never fatal. Keys are
//! written into one reused per-VM buffer ([`slot_key_into`]): no
//! allocation or `format!` per get/set.

use super::shared::{ShareError, SharedData};
use crate::index::{slot_key_into, SlotStore, SlotValue, ENTRY_BYTES, SLOTS_PER_KEY};
use std::cell::{Cell, RefCell};

thread_local! {
    /// Key buffer of this VM (single-threaded), reused by every get/set.
    static KEY: RefCell<String> = const { RefCell::new(String::new()) };
}

/// Keys a store keeps for its callback: a lookup probes at most about a
/// dozen sets and the pending record after it writes into most of them.
pub const HELD: usize = 16;

/// The last [`HELD`] keys a store read or wrote in one callback (with
/// whatever it keeps of them), the oldest replaced first: the policy of
/// [`SharedSlots`] and of the count of gets of [`crate::index::VecStore`],
/// one code for both. `same` tells whether two items are of one key.
/// Cost: a scan of ≤ [`HELD`] items per call, no allocation.
#[derive(Debug, Clone, Copy)]
pub struct Memo<T: Copy> {
    items: [Option<T>; HELD],
    next: usize,
}

impl<T: Copy> Memo<T> {
    /// Nothing kept.
    pub const fn new() -> Memo<T> {
        Memo {
            items: [None; HELD],
            next: 0,
        }
    }

    /// The kept item `is` picks, if any.
    pub fn find(&self, is: impl Fn(&T) -> bool) -> Option<T> {
        self.items.iter().flatten().find(|x| is(x)).copied()
    }

    /// Keep `x`, in place of the item of its key (`same`), else of the
    /// oldest.
    pub fn keep(&mut self, x: T, same: impl Fn(&T) -> bool) {
        let at = self
            .items
            .iter()
            .position(|y| y.as_ref().is_some_and(&same));
        let at = at.unwrap_or_else(|| {
            let n = self.next;
            self.next = (n + 1) % HELD;
            n
        });
        if let Some(y) = self.items.get_mut(at) {
            *y = Some(x);
        }
    }

    /// Forget the items `same` picks.
    pub fn forget(&mut self, same: impl Fn(&T) -> bool) {
        for y in self.items.iter_mut() {
            if y.as_ref().is_some_and(&same) {
                *y = None;
            }
        }
    }
}

impl<T: Copy> Default for Memo<T> {
    fn default() -> Memo<T> {
        Memo::new()
    }
}

/// A set's entries: one shared-data value of the index table.
type Entries = [u8; SLOTS_PER_KEY as usize * ENTRY_BYTES];

/// A key read or written in this callback: its number, value and CAS (0
/// after our own write: the host's new CAS is not known).
#[derive(Clone, Copy)]
struct Held {
    key: u32,
    entries: Entries,
    cas: u32,
}

/// Slot table of one plugin configuration, for one host callback.
pub struct SharedSlots<'p, D: SharedData + ?Sized> {
    shared: &'p D,
    prefix: &'p str,
    /// Slots stored [`SLOTS_PER_KEY`] per key (`0..grouped`); 0: every slot alone.
    grouped: u32,
    /// Off: every get misses and every set is dropped (the filter's
    /// `slots` ablation probe).
    enabled: bool,
    /// The keys read or written in this callback.
    held: RefCell<Memo<Held>>,
    /// Host calls that failed during this callback.
    pub failures: Cell<u32>,
}

impl<'p, D: SharedData + ?Sized> SharedSlots<'p, D> {
    /// Slots under `prefix`, one key each (tables other than the index).
    pub fn new(shared: &'p D, prefix: &'p str) -> SharedSlots<'p, D> {
        SharedSlots::index(shared, prefix, 0)
    }

    /// The prefix index under `prefix`: slots below `slots` four per key,
    /// the reserved ones above it alone (see the module docs).
    pub fn index(shared: &'p D, prefix: &'p str, slots: u32) -> SharedSlots<'p, D> {
        SharedSlots {
            shared,
            prefix,
            grouped: slots,
            enabled: true,
            held: RefCell::new(Memo::new()),
            failures: Cell::new(0),
        }
    }

    /// The same store, on or off (see `enabled`).
    pub fn enabled(self, on: bool) -> SharedSlots<'p, D> {
        SharedSlots {
            enabled: on,
            ..self
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

    /// The entries under `key`, read unless held (a failed read: four
    /// empty slots, not held).
    fn entries_of(&self, key: u32) -> Option<Held> {
        if let Some(h) = self.find(key) {
            return Some(h);
        }
        let held = match self.with_key(key, |k| self.shared.get(k)) {
            Ok((v, cas)) => Held {
                key,
                entries: v
                    .and_then(|v| <Entries>::try_from(v.as_slice()).ok())
                    .unwrap_or([0; SLOTS_PER_KEY as usize * ENTRY_BYTES]),
                cas,
            },
            Err(_) => {
                self.failed();
                return None;
            }
        };
        self.keep(held);
        Some(held)
    }

    /// The held copy of `key`, if any.
    fn find(&self, key: u32) -> Option<Held> {
        self.held.try_borrow().ok()?.find(|h| h.key == key)
    }

    /// Hold `h` (in place of its key's copy, else of the oldest).
    fn keep(&self, h: Held) {
        if let Ok(mut all) = self.held.try_borrow_mut() {
            all.keep(h, |x| x.key == h.key);
        }
    }

    /// Forget `key` (a failed or refused write).
    fn drop_key(&self, key: u32) {
        if let Ok(mut all) = self.held.try_borrow_mut() {
            all.forget(|x| x.key == key);
        }
    }

    /// Write `value` into way `way` of `key`'s set (see the module docs).
    fn write_way(&mut self, key: u32, way: usize, value: &SlotValue) {
        for attempt in 0..2 {
            let Some(mut h) = self.entries_of(key) else {
                return;
            };
            let at = way * ENTRY_BYTES;
            h.entries[at..at + ENTRY_BYTES].copy_from_slice(value);
            let cas = if attempt == 0 { h.cas } else { 0 };
            match self.with_key(key, |k| self.shared.set(k, &h.entries, cas)) {
                Ok(()) => {
                    self.keep(Held { cas: 0, ..h });
                    return;
                }
                Err(ShareError::CasMismatch) if attempt == 0 => self.drop_key(key),
                Err(_) => {
                    self.drop_key(key);
                    self.failed();
                    return;
                }
            }
        }
    }
}

impl<D: SharedData + ?Sized> SlotStore for SharedSlots<'_, D> {
    fn get(&self, slot: u32) -> Option<SlotValue> {
        if !self.enabled {
            return None;
        }
        if slot < self.grouped {
            let h = self.entries_of(slot / SLOTS_PER_KEY)?;
            let at = (slot % SLOTS_PER_KEY) as usize * ENTRY_BYTES;
            return <SlotValue>::try_from(&h.entries[at..at + ENTRY_BYTES])
                .ok()
                .filter(|v| *v != [0; ENTRY_BYTES]);
        }
        match self.with_key(slot, |k| self.shared.get(k)) {
            Ok((Some(v), _)) => <SlotValue>::try_from(v.as_slice()).ok(),
            Ok((None, _)) => None,
            Err(_) => {
                self.failed();
                None
            }
        }
    }

    fn set(&mut self, slot: u32, value: SlotValue) {
        if !self.enabled {
            return;
        }
        if slot < self.grouped {
            let way = (slot % SLOTS_PER_KEY) as usize;
            self.write_way(slot / SLOTS_PER_KEY, way, &value);
            return;
        }
        if self
            .with_key(slot, |k| self.shared.set(k, &value[..ENTRY_BYTES], 0))
            .is_err()
        {
            self.failed();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::shared::MockShared;
    use crate::index::{Entry, IndexConfig, PrefixIndex, VecStore};
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn entry(tag: u64, time: u32) -> SlotValue {
        Entry {
            tag: tag << 8,
            time,
            holders: crate::index::pad([Some(1), None, None]),
        }
        .encode()
    }

    #[test]
    fn a_set_s_four_slots_share_a_key_and_reserved_slots_keep_theirs() {
        let m = MockShared::new();
        let mut s = SharedSlots::index(&m, "p/", 64);
        s.set(6, entry(5, 10));
        s.set(7, entry(9, 11));
        s.set(u32::MAX, entry(3, 12));
        assert_eq!(
            m.keys(),
            vec!["p/i/1".to_string(), "p/i/ffffffff".to_string()]
        );
        // A fresh callback reads the set (slots 4-7) with one get, every
        // way intact; the next set is another key.
        let t = SharedSlots::index(&m, "p/", 64);
        let calls = m.calls.get();
        assert_eq!(t.get(6), Some(entry(5, 10)));
        assert_eq!(t.get(7), Some(entry(9, 11)));
        assert_eq!((t.get(4), t.get(5)), (None, None));
        assert_eq!(m.calls.get() - calls, 1, "key 1");
        assert_eq!(t.get(8), None);
        assert_eq!(m.calls.get() - calls, 2, "keys 1 and 2");
        assert_eq!(t.get(u32::MAX), Some(entry(3, 12)));
        // Ungrouped (another table): one key per slot.
        let mut u = SharedSlots::new(&m, "q/");
        u.set(6, entry(5, 10));
        assert_eq!(u.get(6), Some(entry(5, 10)));
        assert!(m.keys().contains(&"q/i/6".to_string()));
    }

    #[test]
    fn a_callback_keeps_up_to_held_keys_the_oldest_replaced_first() {
        let m = MockShared::new();
        let mut s = SharedSlots::index(&m, "p/", 1024);
        let held = HELD as u32;
        let w = SLOTS_PER_KEY;
        for k in 0..held {
            assert_eq!(s.get(w * k), None);
        }
        // Their other slots, and writes into them: no read.
        let calls = m.calls.get();
        for k in 0..held {
            for i in 1..w {
                assert_eq!(s.get(w * k + i), None);
            }
        }
        let x = 2 * w + 1;
        s.set(x, entry(9, 11));
        assert_eq!(m.calls.get() - calls, 1, "the write alone");
        // One key more replaces the oldest (key 0): read again.
        assert_eq!(s.get(w * held), None);
        let calls = m.calls.get();
        assert_eq!((s.get(0), s.get(x)), (None, Some(entry(9, 11))));
        assert_eq!(m.calls.get() - calls, 1, "key 0 only");
    }

    #[test]
    fn a_concurrent_write_of_the_other_slot_is_kept() {
        let m = MockShared::new();
        SharedSlots::index(&m, "p/", 64).set(7, entry(8, 1));
        let mut a = SharedSlots::index(&m, "p/", 64);
        let mut b = SharedSlots::index(&m, "p/", 64);
        // Both callbacks read set 1; b writes slot 7, then a writes slot 6
        // with the CAS of its stale read: refused, read again, b's kept.
        // (A key's first write cannot be conditional: proxy-wasm has no
        // create-if-absent, CAS 0 writes unconditionally.)
        assert_eq!((a.get(6), b.get(6)), (None, None));
        b.set(7, entry(9, 11));
        a.set(6, entry(5, 10));
        let c = SharedSlots::index(&m, "p/", 64);
        assert_eq!(
            (c.get(6), c.get(7)),
            (Some(entry(5, 10)), Some(entry(9, 11)))
        );
        assert_eq!(a.failures.get() + b.failures.get(), 0);
        // A writer that keeps racing: the second write is unconditional.
        m.race_next.set(5);
        let mut d = SharedSlots::index(&m, "p/", 64);
        d.set(7, entry(4, 12));
        let c = SharedSlots::index(&m, "p/", 64);
        assert_eq!(
            (c.get(6), c.get(7)),
            (Some(entry(5, 10)), Some(entry(4, 12)))
        );
    }

    #[test]
    fn failures_and_foreign_values_read_as_empty() {
        let m = MockShared::new();
        // An older filter's single entry or two-way pair under a set's
        // key: four empty slots, overwritten whole by the next write.
        for old in [entry(5, 10).to_vec(), [entry(5, 10), entry(6, 10)].concat()] {
            m.set("p/i/1", &old, 0).unwrap();
            let s = SharedSlots::index(&m, "p/", 64);
            assert_eq!(
                (s.get(4), s.get(5), s.get(6), s.get(7)),
                (None, None, None, None)
            );
        }
        let mut s = SharedSlots::index(&m, "p/", 64);
        s.set(7, entry(9, 11));
        assert_eq!(m.get("p/i/1").unwrap().0.map(|v| v.len()), Some(96));
        // A failed read: unknown, counted; a failed write: counted.
        let t = SharedSlots::index(&m, "p/", 64);
        m.fail_next.set(1);
        assert_eq!(t.get(7), None);
        assert_eq!(t.failures.get(), 1);
        let mut w = SharedSlots::index(&m, "p/", 64);
        m.fail_next.set(2);
        w.set(6, entry(1, 1));
        assert!(w.failures.get() >= 1);
        m.fail_next.set(0);
        // Off: nothing read, nothing written.
        let mut off = SharedSlots::index(&m, "p/", 64).enabled(false);
        assert_eq!(off.get(7), None);
        off.set(7, entry(2, 2));
        assert_eq!(SharedSlots::index(&m, "p/", 64).get(7), Some(entry(9, 11)));
    }

    #[test]
    fn the_index_on_shared_data_reads_as_on_a_vec() {
        // The same lookups and records on the grouped shared-data table and
        // on the simulator's VecStore: the same answers, and the VecStore
        // counts the host calls the filter makes (one callback each).
        let idx = PrefixIndex::new(IndexConfig {
            slots: 256,
            ..IndexConfig::default()
        });
        let m = MockShared::new();
        let mut v = VecStore::new(256);
        let chain = |c: u64| -> Vec<u64> {
            (0..20u64)
                .map(|i| (c << 32 | i).wrapping_mul(0x9e37_79b9_7f4a_7c15))
                .collect()
        };
        for c in 0..40u64 {
            let (b, now, r) = (chain(c % 25), 1000 * c, (c % 5) as usize);
            let mut s = SharedSlots::index(&m, "p/", 256);
            let calls = m.calls.get();
            let k = idx.lookup(&s, &b, now);
            idx.record(&mut s, &b, k.as_ref(), r, now);
            v.new_callback();
            let ops = v.gets() + v.sets();
            let kv = idx.lookup(&v, &b, now);
            idx.record(&mut v, &b, kv.as_ref(), r, now);
            assert_eq!(k, kv, "chain {c}");
            assert_eq!(
                m.calls.get() - calls,
                v.gets() + v.sets() - ops,
                "chain {c}"
            );
        }
        assert!(m.key_count() <= 128);
        for c in 0..25 {
            let s = SharedSlots::index(&m, "p/", 256);
            assert_eq!(
                idx.lookup(&s, &chain(c), 50_000),
                idx.lookup(&v, &chain(c), 50_000)
            );
        }
    }
}
