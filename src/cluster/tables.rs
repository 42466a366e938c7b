//! The plugin's fixed set of shared-data keys and their encodings.
//!
//! Every value starts with a version byte ([`VERSION`]) so no value is empty
//! and a future layout can be told apart; a value that does not decode reads
//! as empty (never an error on the request path). Hosts are identified by
//! [`addr_hash`] (xxh3 of the `IP:port` string), never by a list position.
//!
//! | key | value | writers | cost per request |
//! | --- | --- | --- | --- |
//! | `members` | [`Snapshot`]: generation ‖ (flags, address)… | the polling VM | 1 get |
//! | `lease` | owner u64 ‖ expiry ms u64 | every root context (CAS) | 0 |
//! | `inflight` | (addr hash u64, count u32)… sorted | requests (CAS), reconcile | 1 get + 1 CAS set per change |
//! | `down` | (addr hash u64, until ms u64)… | requests (CAS), poller clears | 1 get |
//! | `engine` | (addr hash, time, sample)… ([`super::engines`]) | the polling VM | 1 get (with `engine`) |
//!
//! Bound: each table holds at most one entry per host of the current
//! membership plus hosts that left while still holding requests or a down
//! mark (pruned at the next reconcile / expiry): bytes, not keys.

use super::shared::{update, ShareError, SharedData};
use crate::hash::hash_id;

/// Layout version byte of every value.
pub const VERSION: u8 = 1;

/// Identity of a host in shared data.
pub fn addr_hash(addr: &str) -> u64 {
    hash_id(addr.as_bytes())
}

/// Key names of one plugin (namespace `prefix_router/<plugin>/`).
#[derive(Debug, Clone)]
pub struct Keys {
    /// Namespace, ending in `/`.
    pub prefix: String,
    /// Membership snapshot.
    pub members: String,
    /// Poll lease.
    pub lease: String,
    /// In-flight counts.
    pub inflight: String,
    /// Passive down marks.
    pub down: String,
    /// Engine samples ([`super::engines::EngineTable`]).
    pub engine: String,
}

impl Keys {
    /// Keys under `prefix_router/<plugin>/`. The namespace holds no
    /// configuration fingerprint: pushes keep counts, marks and the index.
    pub fn new(plugin: &str) -> Keys {
        let prefix = format!("prefix_router/{plugin}/");
        Keys {
            members: format!("{prefix}members"),
            lease: format!("{prefix}lease"),
            inflight: format!("{prefix}inflight"),
            down: format!("{prefix}down"),
            engine: format!("{prefix}engine"),
            prefix,
        }
    }
}

fn body(v: Option<&[u8]>) -> &[u8] {
    match v {
        Some([VERSION, rest @ ..]) => rest,
        _ => &[],
    }
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    b.get(at..at + 8)
        .and_then(|s| <[u8; 8]>::try_from(s).ok())
        .map(u64::from_le_bytes)
}

/// Host flag: not usable (health flags, draining, pending removal).
pub const UNAVAILABLE: u8 = 1;

/// The membership published by the polling VM.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Snapshot {
    /// Bumped on every change of the host list or its flags.
    pub generation: u64,
    /// `(address, flags)`, sorted by address.
    pub hosts: Vec<(String, u8)>,
}

impl Snapshot {
    /// Encode: version ‖ generation u64 ‖ (flags u8, len u8, address)….
    pub fn encode(&self) -> Vec<u8> {
        let mut v = vec![VERSION];
        v.extend_from_slice(&self.generation.to_le_bytes());
        for (a, f) in &self.hosts {
            let a = &a.as_bytes()[..a.len().min(255)];
            v.push(*f);
            v.push(a.len() as u8);
            v.extend_from_slice(a);
        }
        v
    }

    /// Decode; `None` if malformed.
    pub fn decode(v: &[u8]) -> Option<Snapshot> {
        let b = body(Some(v));
        let generation = u64_at(b, 0)?;
        let mut hosts = Vec::new();
        let mut i = 8;
        while i < b.len() {
            let f = *b.get(i)?;
            let n = usize::from(*b.get(i + 1)?);
            let a = std::str::from_utf8(b.get(i + 2..i + 2 + n)?).ok()?;
            hosts.push((a.to_string(), f));
            i += 2 + n;
        }
        Some(Snapshot { generation, hosts })
    }

    /// Generation of an encoded snapshot without decoding the hosts.
    pub fn generation_of(v: &[u8]) -> Option<u64> {
        u64_at(body(Some(v)), 0)
    }

    /// Is `addr` listed and unavailable?
    pub fn unavailable(&self, addr: &str) -> bool {
        self.hosts
            .iter()
            .any(|(a, f)| a == addr && f & UNAVAILABLE != 0)
    }
}

/// Read the published snapshot.
pub fn read_snapshot<S: SharedData + ?Sized>(
    s: &S,
    k: &Keys,
) -> Result<Option<Snapshot>, ShareError> {
    Ok(s.get(&k.members)?.0.and_then(|v| Snapshot::decode(&v)))
}

/// Publish `hosts` if they differ from the current snapshot (generation + 1).
/// Returns the snapshot now published and the one it replaced.
pub fn publish<S: SharedData + ?Sized>(
    s: &S,
    k: &Keys,
    hosts: Vec<(String, u8)>,
) -> Result<(Snapshot, Option<Snapshot>), ShareError> {
    let mut out = (Snapshot::default(), None);
    update(s, &k.members, |cur| {
        let old = cur.and_then(Snapshot::decode);
        if old.as_ref().is_some_and(|o| o.hosts == hosts) {
            out = (old.clone().unwrap_or_default(), old.clone());
            return None;
        }
        let next = Snapshot {
            generation: old.as_ref().map_or(1, |o| o.generation + 1),
            hosts: hosts.clone(),
        };
        let bytes = next.encode();
        out = (next, old);
        Some(bytes)
    })?;
    Ok(out)
}

/// Take or renew the poll lease for `ttl_ms`. True if `owner` holds it now.
pub fn try_lease<S: SharedData + ?Sized>(
    s: &S,
    k: &Keys,
    owner: u64,
    now_ms: u64,
    ttl_ms: u64,
) -> Result<bool, ShareError> {
    let (v, cas) = s.get(&k.lease)?;
    let b = body(v.as_deref());
    let (holder, expiry) = (u64_at(b, 0).unwrap_or(0), u64_at(b, 8).unwrap_or(0));
    if holder != owner && expiry > now_ms {
        return Ok(false);
    }
    let mut new = vec![VERSION];
    new.extend_from_slice(&owner.to_le_bytes());
    new.extend_from_slice(&(now_ms + ttl_ms).to_le_bytes());
    match s.set(&k.lease, &new, cas) {
        Ok(()) => Ok(true),
        Err(ShareError::CasMismatch) => Ok(false),
        Err(e) => Err(e),
    }
}

/// A table of `(addr hash, value)` pairs sorted by hash.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Table<V> {
    /// Entries, sorted by hash.
    pub entries: Vec<(u64, V)>,
}

/// Fixed-width little-endian values of a [`Table`].
pub trait Cell: Copy + Default + PartialEq {
    /// Width in bytes.
    const WIDTH: usize;
    /// Append the encoding.
    fn put(self, out: &mut Vec<u8>);
    /// Decode `WIDTH` bytes.
    fn take(b: &[u8]) -> Option<Self>;
}

impl Cell for u32 {
    const WIDTH: usize = 4;
    fn put(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
    fn take(b: &[u8]) -> Option<u32> {
        <[u8; 4]>::try_from(b).ok().map(u32::from_le_bytes)
    }
}

impl Cell for u64 {
    const WIDTH: usize = 8;
    fn put(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
    fn take(b: &[u8]) -> Option<u64> {
        <[u8; 8]>::try_from(b).ok().map(u64::from_le_bytes)
    }
}

impl<V: Cell> Table<V> {
    /// Decode (malformed → empty).
    pub fn decode(v: Option<&[u8]>) -> Table<V> {
        let b = body(v);
        let w = 8 + V::WIDTH;
        if b.len() % w != 0 {
            return Table::default();
        }
        let entries = b
            .chunks_exact(w)
            .filter_map(|c| Some((u64_at(c, 0)?, V::take(c.get(8..)?)?)))
            .collect();
        Table { entries }
    }

    /// Encode.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(1 + self.entries.len() * (8 + V::WIDTH));
        v.push(VERSION);
        for (h, x) in &self.entries {
            v.extend_from_slice(&h.to_le_bytes());
            x.put(&mut v);
        }
        v
    }

    /// Value of `h` (default if absent).
    pub fn get(&self, h: u64) -> V {
        self.entries
            .binary_search_by_key(&h, |e| e.0)
            .map_or(V::default(), |i| self.entries[i].1)
    }

    /// Set `h` to `v`; a default value removes the entry.
    pub fn set(&mut self, h: u64, v: V) {
        match self.entries.binary_search_by_key(&h, |e| e.0) {
            Ok(i) if v == V::default() => {
                self.entries.remove(i);
            }
            Ok(i) => self.entries[i].1 = v,
            Err(_) if v == V::default() => {}
            Err(i) => self.entries.insert(i, (h, v)),
        }
    }

    /// Read from shared data with the CAS token.
    pub fn read<S: SharedData + ?Sized>(s: &S, key: &str) -> Result<(Table<V>, u32), ShareError> {
        let (v, cas) = s.get(key)?;
        Ok((Table::decode(v.as_deref()), cas))
    }

    /// Create the key (empty table) if it is missing, so CAS updates race safely.
    pub fn init<S: SharedData + ?Sized>(s: &S, key: &str) -> Result<(), ShareError> {
        match s.get(key)? {
            (Some(_), _) => Ok(()),
            (None, _) => s.set(key, &[VERSION], 0),
        }
    }

    /// CAS-update with `f`; `seen` is a previous read to try first.
    pub fn modify<S: SharedData + ?Sized>(
        s: &S,
        key: &str,
        mut seen: Option<(Table<V>, u32)>,
        mut f: impl FnMut(&mut Table<V>),
    ) -> Result<Table<V>, ShareError> {
        for _ in 0..super::shared::MAX_CAS_ATTEMPTS {
            let (mut t, cas) = match seen.take() {
                Some(x) => x,
                None => Table::read(s, key)?,
            };
            f(&mut t);
            match s.set(key, &t.encode(), cas) {
                Ok(()) => return Ok(t),
                Err(ShareError::CasMismatch) => continue,
                Err(e) => return Err(e),
            }
        }
        Err(ShareError::CasMismatch)
    }
}

/// In-flight counts per host (cluster-wide over this Envoy's workers).
pub type InFlight = Table<u32>;
/// Passive down marks: host → until (ms since the epoch).
pub type Down = Table<u64>;

impl InFlight {
    /// Add `delta` to host `h` (saturating at 0); returns its new count.
    pub fn add<S: SharedData + ?Sized>(
        s: &S,
        k: &Keys,
        h: u64,
        delta: i32,
        seen: Option<(InFlight, u32)>,
    ) -> Result<u32, ShareError> {
        let t = Table::modify(s, &k.inflight, seen, |t| {
            let v = t.get(h).saturating_add_signed(delta);
            t.set(h, v);
        })?;
        Ok(t.get(h))
    }

    /// Lower the count of every host Envoy reports above its own
    /// `rq_active` to it, and drop hosts Envoy no longer lists. Returns the
    /// hosts corrected (`(hash, ours, envoy's)`).
    ///
    /// Only downwards: a count above Envoy's is a lost release (a VM died
    /// between taking and releasing); a count below it is requests Envoy
    /// sees that we do not count (the poller's own scrapes, requests that
    /// reached the cluster without the filter's target), never ours to add.
    /// A request routed but not yet connected at poll time is dropped from
    /// the count and its release then saturates at 0: the count errs low
    /// for that request's lifetime and is exact again when it ends.
    pub fn reconcile<S: SharedData + ?Sized>(
        s: &S,
        k: &Keys,
        envoy: &[(u64, u32)],
    ) -> Result<Vec<(u64, u32, u32)>, ShareError> {
        let mut fixed = Vec::new();
        Table::modify(s, &k.inflight, None, |t: &mut InFlight| {
            fixed.clear();
            let old = std::mem::take(t);
            for &(h, rq) in envoy {
                let ours = old.get(h);
                if ours > rq {
                    fixed.push((h, ours, rq));
                }
                t.set(h, ours.min(rq));
            }
        })?;
        Ok(fixed)
    }
}

impl Down {
    /// Is `h` marked down at `now_ms`?
    pub fn is_down(&self, h: u64, now_ms: u64) -> bool {
        self.get(h) > now_ms
    }

    /// Mark `h` down until `until_ms` (expired marks are pruned).
    pub fn mark<S: SharedData + ?Sized>(
        s: &S,
        k: &Keys,
        h: u64,
        now_ms: u64,
        until_ms: u64,
    ) -> Result<(), ShareError> {
        Table::modify(s, &k.down, None, |t: &mut Down| {
            t.entries.retain(|e| e.1 > now_ms);
            t.set(h, until_ms.max(t.get(h)));
        })
        .map(|_| ())
    }

    /// Clear the marks of `hosts` (they came back healthy) and expired ones.
    pub fn clear<S: SharedData + ?Sized>(
        s: &S,
        k: &Keys,
        hosts: &[u64],
        now_ms: u64,
    ) -> Result<(), ShareError> {
        let (t, _) = Down::read(s, &k.down)?;
        if !t
            .entries
            .iter()
            .any(|e| e.1 <= now_ms || hosts.contains(&e.0))
        {
            return Ok(());
        }
        Table::modify(s, &k.down, None, |t: &mut Down| {
            t.entries.retain(|e| e.1 > now_ms && !hosts.contains(&e.0));
        })
        .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::super::shared::MockShared;
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn snapshot_round_trip_and_generations() {
        let s = MockShared::new();
        let k = Keys::new("p");
        let hosts = vec![
            ("127.0.0.1:1".to_string(), 0),
            ("[::1]:2".to_string(), UNAVAILABLE),
        ];
        let (a, old) = publish(&s, &k, hosts.clone()).unwrap();
        assert_eq!((a.generation, old), (1, None));
        assert_eq!(Snapshot::decode(&a.encode()), Some(a.clone()));
        assert_eq!(Snapshot::generation_of(&a.encode()), Some(1));
        assert!(a.unavailable("[::1]:2") && !a.unavailable("127.0.0.1:1"));
        // Same hosts: no new generation.
        let (b, _) = publish(&s, &k, hosts.clone()).unwrap();
        assert_eq!(b.generation, 1);
        let (c, old) = publish(&s, &k, hosts[..1].to_vec()).unwrap();
        assert_eq!((c.generation, old.map(|o| o.generation)), (2, Some(1)));
        assert_eq!(read_snapshot(&s, &k).unwrap(), Some(c));
        assert_eq!(Snapshot::decode(&[VERSION, 1, 2]), None);
    }

    #[test]
    fn lease_has_one_holder_until_it_expires() {
        let s = MockShared::new();
        let k = Keys::new("p");
        assert!(try_lease(&s, &k, 1, 1000, 3000).unwrap());
        assert!(!try_lease(&s, &k, 2, 2000, 3000).unwrap());
        assert!(try_lease(&s, &k, 1, 2000, 3000).unwrap()); // renew
        assert!(!try_lease(&s, &k, 2, 4999, 3000).unwrap());
        assert!(try_lease(&s, &k, 2, 5001, 3000).unwrap()); // expired: taken over
        s.race_next.set(1);
        assert!(!try_lease(&s, &k, 2, 5002, 3000).unwrap());
    }

    #[test]
    fn inflight_by_address_survives_and_reconciles() {
        let s = MockShared::new();
        let k = Keys::new("p");
        InFlight::init(&s, &k.inflight).unwrap();
        let (a, b) = (addr_hash("10.0.0.1:80"), addr_hash("10.0.0.2:80"));
        assert_eq!(InFlight::add(&s, &k, a, 1, None).unwrap(), 1);
        assert_eq!(InFlight::add(&s, &k, a, 1, None).unwrap(), 2);
        assert_eq!(InFlight::add(&s, &k, b, -1, None).unwrap(), 0); // never below 0
        s.race_next.set(2);
        assert_eq!(InFlight::add(&s, &k, b, 1, None).unwrap(), 1);
        // A lost release on `a` (Envoy says 1) and a host that left (b).
        let fixed = InFlight::reconcile(&s, &k, &[(a, 1)]).unwrap();
        assert_eq!(fixed, vec![(a, 2, 1)]);
        let (t, _) = InFlight::read(&s, &k.inflight).unwrap();
        assert_eq!((t.get(a), t.get(b), t.entries.len()), (1, 0, 1));
        // Envoy counting more (its own scrapes, unrouted requests): never raised.
        assert!(InFlight::reconcile(&s, &k, &[(a, 5)]).unwrap().is_empty());
        assert_eq!(InFlight::read(&s, &k.inflight).unwrap().0.get(a), 1);
        assert_eq!(InFlight::decode(Some(b"garbage")), InFlight::default());
    }

    #[test]
    fn down_marks_expire_and_clear() {
        let s = MockShared::new();
        let k = Keys::new("p");
        Down::init(&s, &k.down).unwrap();
        let (a, b) = (7u64, 9u64);
        Down::mark(&s, &k, a, 1000, 5000).unwrap();
        Down::mark(&s, &k, b, 1000, 2000).unwrap();
        let (t, _) = Down::read(&s, &k.down).unwrap();
        assert!(t.is_down(a, 1500) && t.is_down(b, 1500) && !t.is_down(b, 2000));
        Down::clear(&s, &k, &[a], 2500).unwrap();
        let (t, _) = Down::read(&s, &k.down).unwrap();
        assert!(t.entries.is_empty(), "{t:?}"); // a cleared, b expired
    }
}
