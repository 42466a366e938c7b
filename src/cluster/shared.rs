//! Shared data behind a trait: the proxy-wasm key/value store every worker VM
//! of one `vm_id` sees, with compare-and-swap tokens.
//!
//! Semantics (proxy-wasm-cpp-host `shared_data.cc`, verified on Envoy 1.40):
//! `get` returns the value and its CAS token (a missing key is `(None, 0)`);
//! `set(key, value, 0)` writes unconditionally; `set(key, value, cas)` fails
//! with [`ShareError::CasMismatch`] if the key was written since `cas` was
//! read. A missing key accepts any CAS, so keys updated by CAS loops are
//! created once by the root context before requests race on them.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;

/// A failed shared-data call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShareError {
    /// The value changed since it was read.
    CasMismatch,
    /// Any other host status (raw code).
    Host(u32),
}

/// Upper bound on the attempts of one CAS update.
pub const MAX_CAS_ATTEMPTS: usize = 64;

/// The shared key/value store.
pub trait SharedData {
    /// Value and CAS token of `key`; a missing key is `(None, 0)`.
    fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, u32), ShareError>;
    /// Write `value`; `cas == 0` unconditionally.
    fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), ShareError>;
}

/// Read-modify-write `key` with CAS, at most [`MAX_CAS_ATTEMPTS`] times.
/// `f` gets the current value and returns the new one (`None`: leave as is).
pub fn update<S: SharedData + ?Sized>(
    s: &S,
    key: &str,
    mut f: impl FnMut(Option<&[u8]>) -> Option<Vec<u8>>,
) -> Result<bool, ShareError> {
    for _ in 0..MAX_CAS_ATTEMPTS {
        let (value, cas) = s.get(key)?;
        let Some(new) = f(value.as_deref()) else {
            return Ok(false);
        };
        match s.set(key, &new, cas) {
            Ok(()) => return Ok(true),
            Err(ShareError::CasMismatch) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(ShareError::CasMismatch)
}

/// In-memory shared data with the host's CAS semantics, a call counter and
/// injectable failures (tests, simulator).
#[derive(Debug, Default)]
pub struct MockShared {
    map: RefCell<BTreeMap<String, (Vec<u8>, u32)>>,
    next_cas: Cell<u32>,
    /// The next `n` calls (get or set) fail with `Host(10)`.
    pub fail_next: Cell<u32>,
    /// The next `n` sets fail with a CAS mismatch (a concurrent writer).
    pub race_next: Cell<u32>,
    /// Calls made.
    pub calls: Cell<u64>,
}

impl MockShared {
    /// An empty store.
    pub fn new() -> MockShared {
        MockShared::default()
    }

    /// Number of keys (what proxy-wasm cannot list; the bound tests use it).
    pub fn key_count(&self) -> usize {
        self.map.borrow().len()
    }

    /// Keys, sorted.
    pub fn keys(&self) -> Vec<String> {
        self.map.borrow().keys().cloned().collect()
    }

    fn failing(&self) -> Result<(), ShareError> {
        self.calls.set(self.calls.get() + 1);
        let n = self.fail_next.get();
        if n > 0 {
            self.fail_next.set(n - 1);
            return Err(ShareError::Host(10));
        }
        Ok(())
    }
}

impl SharedData for MockShared {
    fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, u32), ShareError> {
        self.failing()?;
        Ok(match self.map.borrow().get(key) {
            Some((v, c)) => (Some(v.clone()), *c),
            None => (None, 0),
        })
    }

    fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), ShareError> {
        self.failing()?;
        let r = self.race_next.get();
        if r > 0 && cas != 0 {
            self.race_next.set(r - 1);
            // Another writer got there first.
            let c = self.next_cas.get() + 1;
            self.next_cas.set(c);
            if let Some(e) = self.map.borrow_mut().get_mut(key) {
                e.1 = c;
            }
            return Err(ShareError::CasMismatch);
        }
        let mut map = self.map.borrow_mut();
        if let Some((_, cur)) = map.get(key) {
            if cas != 0 && cas != *cur {
                return Err(ShareError::CasMismatch);
            }
        }
        let c = self.next_cas.get() + 1;
        self.next_cas.set(c);
        map.insert(key.to_string(), (value.to_vec(), c));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn cas_semantics_and_bounded_update() {
        let s = MockShared::new();
        assert_eq!(s.get("k").unwrap(), (None, 0));
        s.set("k", b"a", 0).unwrap();
        let (_, c) = s.get("k").unwrap();
        s.set("k", b"b", 0).unwrap();
        assert_eq!(s.set("k", b"c", c), Err(ShareError::CasMismatch));
        s.race_next.set(3);
        assert!(update(&s, "k", |v| Some([v.unwrap_or(b""), b"+"].concat())).unwrap());
        assert_eq!(s.get("k").unwrap().0.unwrap(), b"b+");
        s.race_next.set(1000);
        assert_eq!(
            update(&s, "k", |_| Some(b"x".to_vec())),
            Err(ShareError::CasMismatch)
        );
        s.race_next.set(0);
        s.fail_next.set(1);
        assert_eq!(s.get("k"), Err(ShareError::Host(10)));
        assert_eq!(s.key_count(), 1);
    }
}
