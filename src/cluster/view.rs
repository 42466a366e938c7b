//! One worker's routing view of a membership snapshot, and the prefix index
//! kept in address terms.
//!
//! A [`View`] is rebuilt only when the snapshot's generation changes (one
//! ring build, O(N·V log(N·V)), ≈ 0.1 ms for 7 hosts × 256 points); every
//! request reuses it. The ring is built from **all** listed hosts, available
//! or not: a host failing its health check keeps its ring points and is only
//! skipped by the walk, so a health flap never rebuilds the ring and its keys
//! go to the ring successor (what removing it would do), then come back.
//!
//! [`AddrSlots`] wraps the index's slot store: entries hold [`holder_id`]s
//! (16 bits of the address hash) instead of positions in the endpoint list,
//! so they stay right when hosts are added, removed or reordered. On read,
//! a holder that is unknown is dropped, and a holder that is unusable (health,
//! passive down mark) is replaced by its **successor**: the first usable host
//! on the ring walk from the holder's own address hash. Every worker and every
//! Envoy computes the same successor, so the prefixes of a dead holder move
//! to one host instead of scattering; the next record writes the successor's
//! id, so the index migrates. Two members whose ids collide (probability
//! ≈ N²/131070) share index entries: a mis-hit, never a failure.

use super::tables::{addr_hash, Down, InFlight, Snapshot, UNAVAILABLE};
use crate::config::Config;
use crate::index::{Entry, SlotStore, SlotValue, ENTRY_BYTES, MAX_HOLDERS};
use crate::router::Router;
use std::collections::HashMap;

/// Index holder id of an address (stored as `id + 1` in an entry).
pub fn holder_id(addr: &str) -> u16 {
    (addr_hash(addr) % 65_535) as u16
}

/// Routing view of one membership generation.
#[derive(Debug, Clone)]
pub struct View {
    /// Snapshot generation (0: the configured `endpoints`).
    pub generation: u64,
    /// The routing core over this membership (endpoints sorted).
    pub router: Router,
    hashes: Vec<u64>,
    unavailable: Vec<bool>,
    by_id: HashMap<u16, usize>,
}

impl View {
    /// The view of the configured `endpoints` (static mode and bootstrap).
    pub fn from_config(base: &Config) -> View {
        let hosts: Vec<(String, u8)> = base.endpoints.iter().map(|e| (e.clone(), 0)).collect();
        View::new(base, 0, &hosts)
    }

    /// The view of a published snapshot.
    pub fn from_snapshot(base: &Config, s: &Snapshot) -> View {
        View::new(base, s.generation, &s.hosts)
    }

    fn new(base: &Config, generation: u64, hosts: &[(String, u8)]) -> View {
        let mut hosts = hosts.to_vec();
        hosts.sort();
        hosts.dedup_by(|a, b| a.0 == b.0);
        let mut config = base.clone();
        config.endpoints = hosts.iter().map(|h| h.0.clone()).collect();
        let mut by_id = HashMap::with_capacity(hosts.len());
        for (i, (a, _)) in hosts.iter().enumerate() {
            by_id.entry(holder_id(a)).or_insert(i);
        }
        View {
            generation,
            hashes: hosts.iter().map(|h| addr_hash(&h.0)).collect(),
            unavailable: hosts.iter().map(|h| h.1 & UNAVAILABLE != 0).collect(),
            by_id,
            router: Router::new(config),
        }
    }

    /// The same view with its index slot hash keyed by `secret`.
    pub fn keyed(mut self, secret: u64) -> View {
        self.router = self.router.with_index_secret(secret);
        self
    }

    /// Member addresses (sorted); decision indices refer to this list.
    pub fn endpoints(&self) -> &[String] {
        &self.router.config().endpoints
    }

    /// Address of member `i`.
    pub fn addr(&self, i: usize) -> Option<&str> {
        self.endpoints().get(i).map(String::as_str)
    }

    /// Shared-data identity of member `i`.
    pub fn hash(&self, i: usize) -> Option<u64> {
        self.hashes.get(i).copied()
    }

    /// Position of an address.
    pub fn position(&self, addr: &[u8]) -> Option<usize> {
        self.endpoints()
            .binary_search_by(|e| e.as_bytes().cmp(addr))
            .ok()
    }

    /// Position of the member whose [`holder_id`] is `id`.
    pub fn position_of_id(&self, id: u16) -> Option<usize> {
        self.by_id.get(&id).copied()
    }

    /// Usable members: not flagged by the admin poll, not marked down.
    pub fn usable(&self, down: &Down, now_ms: u64) -> Vec<bool> {
        let mut out = Vec::new();
        self.usable_into(down, now_ms, &mut out);
        out
    }

    /// [`View::usable`] into `out` (cleared first; its capacity is kept).
    pub fn usable_into(&self, down: &Down, now_ms: u64, out: &mut Vec<bool>) {
        out.clear();
        out.extend(
            self.hashes
                .iter()
                .zip(&self.unavailable)
                .map(|(&h, &u)| !u && !down.is_down(h, now_ms)),
        );
    }

    /// `out` = `f(hash)` of every member, in member order (cleared first;
    /// its capacity is kept).
    pub fn fill<T>(&self, out: &mut Vec<T>, f: impl Fn(u64) -> T) {
        out.clear();
        out.extend(self.hashes.iter().map(|&h| f(h)));
    }

    /// In-flight counts in member order.
    pub fn loads(&self, t: &InFlight) -> Vec<u32> {
        self.hashes.iter().map(|&h| t.get(h)).collect()
    }

    /// Queued-prefill tokens in member order ([`super::queued`]).
    pub fn queued(&self, t: &InFlight) -> Vec<u32> {
        self.hashes.iter().map(|&h| t.load(h).queued).collect()
    }

    /// Request-share counts in member order ([`crate::share`]).
    pub fn shares(&self, t: &InFlight) -> Vec<u8> {
        self.hashes.iter().map(|&h| t.load(h).share).collect()
    }

    /// Where a retry of a request to member `i` should go: the host that
    /// takes over `i`'s prefixes if `i` is dead (its [`View::successor`] with
    /// `i` excluded), so a retried request and the requests after it meet on
    /// one replica.
    /// No allocation: [`View::successor`]'s walk with `i` excluded in place.
    pub fn takeover(&self, i: usize, usable: &[bool]) -> Option<usize> {
        let any = usable.iter().any(|&x| x);
        let n = self.hashes.len();
        if !any && n == 0 {
            return Some(i); // no members: "all usable" (as `successor` with an empty slice)
        }
        // None usable: every member but `i` counts as usable (fail open).
        let ok = |c: usize| {
            c != i
                && if any {
                    usable.get(c).copied().unwrap_or(false)
                } else {
                    c < n
                }
        };
        let h = self.hash(i)?;
        self.router.ring().candidates(h).find(|&c| ok(c))
    }

    /// The usable host that takes over member `i`'s prefixes.
    pub fn successor(&self, i: usize, usable: &[bool]) -> Option<usize> {
        // An empty slice means "all usable" (fail open).
        let ok = |c: usize| usable.is_empty() || usable.get(c).copied().unwrap_or(false);
        if ok(i) {
            return Some(i);
        }
        let h = self.hash(i)?;
        self.router.ring().candidates(h).find(|&c| c != i && ok(c))
    }
}

/// A [`SlotStore`] whose entries hold address ids (see the module docs).
///
/// With [`AddrSlots::with_shares`] the request-share slots
/// ([`crate::share::slot_value`]) are served from counts the caller read
/// with the in-flight value (no get), and writes to them are dropped: the
/// filter counts the routed request in its take's CAS update instead
/// ([`super::request::Joined::share`]).
pub struct AddrSlots<'a, S> {
    inner: &'a mut S,
    view: &'a View,
    usable: &'a [bool],
    shares: Option<&'a [u8]>,
}

impl<'a, S: SlotStore> AddrSlots<'a, S> {
    /// Wrap `inner` for `view` with the current usability. When no member
    /// is usable every one counts as usable (fail open, as selection does).
    pub fn new(inner: &'a mut S, view: &'a View, usable: &'a [bool]) -> AddrSlots<'a, S> {
        AddrSlots {
            inner,
            view,
            usable: if usable.iter().any(|&u| u) {
                usable
            } else {
                &[]
            },
            shares: None,
        }
    }

    /// Serve the request-share slots from `shares` (counts in member
    /// order, [`View::shares`]); `None`: from the inner store.
    pub fn with_shares(mut self, shares: Option<&'a [u8]>) -> AddrSlots<'a, S> {
        self.shares = shares;
        self
    }
}

impl<S: SlotStore> SlotStore for AddrSlots<'_, S> {
    fn get(&self, slot: u32) -> Option<SlotValue> {
        if let Some(v) = self.shares.and_then(|c| crate::share::slot_value(c, slot)) {
            return Some(v);
        }
        let raw = self.inner.get(slot)?;
        let Some(mut e) = Entry::decode(&raw) else {
            return Some(raw);
        };
        let mut out = [None; MAX_HOLDERS];
        let mut m = 0;
        for id in e.holders.iter().flatten() {
            let Some(&p) = self.view.by_id.get(id) else {
                continue;
            };
            let Some(s) = self.view.successor(p, self.usable) else {
                continue;
            };
            let s = u16::try_from(s).unwrap_or(u16::MAX);
            if !out[..m].contains(&Some(s)) {
                out[m] = Some(s);
                m += 1;
            }
        }
        e.holders = out;
        Some(e.encode())
    }

    fn set(&mut self, slot: u32, value: SlotValue) {
        if self.shares.is_some() && crate::share::is_slot(slot) {
            return; // counted by the take (see the type's docs)
        }
        let mut v = value;
        if let Some(mut e) = Entry::decode(&value) {
            for h in e.holders.iter_mut() {
                *h = h.and_then(|p| self.view.addr(usize::from(p)).map(holder_id));
            }
            v = e.encode();
        }
        self.inner.set(slot, v);
        debug_assert_eq!(v.len(), ENTRY_BYTES);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::CostModel;
    use crate::index::VecStore;
    use crate::router::Body;
    use crate::select::Loads;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn base() -> Config {
        Config::from_json(br#"{"cluster":"llm","admin_cluster":"admin"}"#).unwrap()
    }

    fn hosts(ports: &[u16]) -> Vec<(String, u8)> {
        ports
            .iter()
            .map(|p| (format!("10.0.0.{p}:8000"), 0))
            .collect()
    }

    fn snap(g: u64, h: Vec<(String, u8)>) -> View {
        View::from_snapshot(
            &base(),
            &Snapshot {
                generation: g,
                hosts: h,
            },
        )
    }

    /// Owner address of many keys under a view.
    fn owners(v: &View) -> Vec<String> {
        (0..4000u64)
            .map(|k| {
                let key = crate::hash::hash_id(&k.to_le_bytes());
                let o = v.router.ring().owner(key).unwrap();
                v.addr(o).unwrap().to_string()
            })
            .collect()
    }

    #[test]
    fn adding_a_host_moves_about_one_nth_of_keys_and_order_is_irrelevant() {
        let a = snap(1, hosts(&[1, 2, 3, 4]));
        let mut h = hosts(&[5, 1, 2, 3, 4]);
        let b = snap(2, h.clone());
        let (oa, ob) = (owners(&a), owners(&b));
        let moved: Vec<_> = oa.iter().zip(&ob).filter(|(x, y)| x != y).collect();
        // Every moved key went to the new host; ≈ 1/5 of keys moved.
        assert!(moved.iter().all(|(_, y)| y.as_str() == "10.0.0.5:8000"));
        let frac = moved.len() as f64 / oa.len() as f64;
        assert!((0.12..0.28).contains(&frac), "moved {frac}");
        h.reverse();
        assert_eq!(owners(&snap(3, h)), ob);
    }

    #[test]
    fn holders_survive_membership_changes_and_dead_holders_have_one_successor() {
        let v1 = snap(1, hosts(&[1, 2, 3]));
        let cost = CostModel::new(v1.router.cost_config());
        let mut store = VecStore::new(v1.router.config().affinity.index_slots);
        // 8000 characters (≈ 2000 tokens): a cache worth a few requests of wait.
        let body = format!(
            r#"{{"model":"m","messages":[{{"role":"user","content":"{}"}}]}}"#,
            "a long shared system prompt. ".repeat(276)
        );
        let body = body.as_bytes();
        let key = v1.router.key(Body::Complete(body), None);
        let all = vec![true; 3];
        let (d, _) = {
            let mut s = AddrSlots::new(&mut store, &v1, &all);
            v1.router
                .select_affinity(&key, body.len(), Loads::new(&[0; 3]), &mut s, &cost, 0, 0)
        };
        let holder = v1.addr(d.primary).unwrap().to_string();
        // Two hosts join in front of it in the sorted list: positions shift.
        let v2 = snap(
            2,
            hosts(&[0, 1, 2, 3, 4])
                .into_iter()
                .map(|(a, f)| (a.replace("10.0.0.0", "9.0.0.0"), f))
                .collect(),
        );
        let usable = vec![true; 5];
        let loads = [0; 5];
        let (d2, _) = {
            let mut s = AddrSlots::new(&mut store, &v2, &usable);
            v2.router.select_affinity(
                &key,
                body.len(),
                Loads::with_available(&loads, &usable),
                &mut s,
                &cost,
                100,
                1,
            )
        };
        assert_eq!(d2.branch.as_str(), "hit");
        assert_eq!(v2.addr(d2.primary), Some(holder.as_str()));
        // The holder dies: every request of the prefix goes to one successor.
        let hp = v2.position(holder.as_bytes()).unwrap();
        let mut usable = vec![true; 5];
        usable[hp] = false;
        let succ = v2.successor(hp, &usable).unwrap();
        assert_ne!(succ, hp);
        let mut pick = |usable: &[bool], loads: &[u32], t: u64| {
            let mut s = AddrSlots::new(&mut store, &v2, usable);
            let l = Loads::with_available(loads, usable);
            v2.router
                .select_affinity(&key, body.len(), l, &mut s, &cost, 200 + t, t)
                .0
        };
        for t in 0..20u64 {
            let mut loads = [0u32; 5];
            loads[(t as usize) % 5] = 1; // uneven loads must not scatter it
            let d = pick(&usable, &loads, t);
            assert_eq!(d.primary, succ, "request {t}");
            assert_ne!(d.secondary, Some(hp));
        }
        // Nothing usable (every host flagged): fail open, the entry still hits.
        let d = pick(&[false; 5], &[0; 5], 50);
        assert_eq!((d.primary, d.branch.as_str()), (succ, "hit"));
        // Revived: the prefix stays where it is now cached (the successor).
        let d = pick(&[true; 5], &[0; 5], 100);
        assert_eq!((d.primary, d.branch.as_str()), (succ, "hit"));
    }

    #[test]
    fn usable_and_loads_by_address() {
        let mut h = hosts(&[1, 2, 3]);
        h[1].1 = UNAVAILABLE;
        let v = snap(4, h);
        let mut down = Down::default();
        down.set(addr_hash("10.0.0.3:8000"), 5000);
        assert_eq!(v.usable(&down, 1000), vec![true, false, false]);
        assert_eq!(v.usable(&down, 6000), vec![true, false, true]);
        let mut t = InFlight::default();
        t.set(addr_hash("10.0.0.3:8000"), 4);
        t.set(addr_hash("10.9.9.9:1"), 9); // not a member: ignored
        assert_eq!(v.loads(&t), vec![0, 0, 4]);
        assert_eq!(v.position(b"10.0.0.2:8000"), Some(1));
        assert_eq!(v.successor(0, &[true, false, false]), Some(0));
        assert_eq!(v.successor(1, &[false, false, false]), None);
        assert_eq!(v.successor(1, &[]), Some(1)); // fail open
        let t = v.takeover(1, &[true, true, true]).unwrap();
        assert_ne!(t, 1);
        assert_eq!(v.successor(1, &[t == 0, false, t == 2]), Some(t));
    }

    /// `takeover` (no allocation) equals `successor` over a copy of
    /// `usable` with the member excluded (the former code), for every
    /// usable pattern of 5 members and every member, in and out of range.
    #[test]
    fn takeover_equals_successor_without_the_member() {
        let v = snap(4, hosts(&[1, 2, 3, 4, 5]));
        for bits in 0..32u32 {
            let usable: Vec<bool> = (0..5).map(|b| bits >> b & 1 == 1).collect();
            for i in 0..6 {
                let mut u = if usable.iter().any(|&x| x) {
                    usable.clone()
                } else {
                    vec![true; 5]
                };
                if let Some(x) = u.get_mut(i) {
                    *x = false;
                }
                assert_eq!(v.takeover(i, &usable), v.successor(i, &u), "{usable:?} {i}");
            }
        }
        let none = snap(4, hosts(&[]));
        assert_eq!(none.takeover(0, &[]), none.successor(0, &[]));
    }
}
