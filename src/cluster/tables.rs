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
//! | `inflight` | [`InFlight`]: (addr hash u64, in-flight u32, queued tokens u32, share u8)… sorted | requests (CAS), reconcile | 1 get at routing (the picture); takes, releases, queued tokens and share bumps wait in the VM ([`super::request::Releases`]) and are written netted per host in one CAS update when 10 ms old, on the tick, or at an idle end with a non-zero net (none for a request that started and ended in between) |
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
        read_value(s, key)
    }

    /// Create the key (empty table) if it is missing, so CAS updates race safely.
    pub fn init<S: SharedData + ?Sized>(s: &S, key: &str) -> Result<(), ShareError> {
        init_value(s, key, &[VERSION])
    }

    /// CAS-update with `f`; `seen` is a previous read to try first.
    pub fn modify<S: SharedData + ?Sized>(
        s: &S,
        key: &str,
        seen: Option<(Table<V>, u32)>,
        f: impl FnMut(&mut Table<V>),
    ) -> Result<Table<V>, ShareError> {
        modify_value(s, key, seen, f)
    }
}

/// A value kept in shared data: how it decodes and encodes.
trait Value: Sized {
    fn decode_value(v: Option<&[u8]>) -> Self;
    fn encode_value(&self) -> Vec<u8>;
}

impl<V: Cell> Value for Table<V> {
    fn decode_value(v: Option<&[u8]>) -> Self {
        Table::decode(v)
    }
    fn encode_value(&self) -> Vec<u8> {
        self.encode()
    }
}

impl Value for InFlight {
    fn decode_value(v: Option<&[u8]>) -> Self {
        InFlight::decode(v)
    }
    fn encode_value(&self) -> Vec<u8> {
        self.encode()
    }
}

fn read_value<T: Value, S: SharedData + ?Sized>(s: &S, key: &str) -> Result<(T, u32), ShareError> {
    let (v, cas) = s.get(key)?;
    Ok((T::decode_value(v.as_deref()), cas))
}

fn init_value<S: SharedData + ?Sized>(s: &S, key: &str, empty: &[u8]) -> Result<(), ShareError> {
    match s.get(key)? {
        (Some(_), _) => Ok(()),
        (None, _) => s.set(key, empty, 0),
    }
}

/// Bounded CAS loop: `f` on the value (`seen` first, then fresh reads).
fn modify_value<T: Value, S: SharedData + ?Sized>(
    s: &S,
    key: &str,
    mut seen: Option<(T, u32)>,
    mut f: impl FnMut(&mut T),
) -> Result<T, ShareError> {
    for _ in 0..super::shared::MAX_CAS_ATTEMPTS {
        let (mut t, cas) = match seen.take() {
            Some(x) => x,
            None => read_value(s, key)?,
        };
        f(&mut t);
        match s.set(key, &t.encode_value(), cas) {
            Ok(()) => return Ok(t),
            Err(ShareError::CasMismatch) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(ShareError::CasMismatch)
}

/// Layout version byte of the [`InFlight`] value (per-host load: in-flight
/// count, queued-prefill tokens, request-share count). Version [`VERSION`]
/// (1) is the earlier in-flight-only layout, still decoded (its queued and
/// share counts read as 0), so a value left by an older build is not lost.
pub const LOAD_VERSION: u8 = 2;

/// One host's entry in the [`InFlight`] value.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostLoad {
    /// Requests in flight (taken at routing, released at the end).
    pub inflight: u32,
    /// Prompt tokens queued for prefill ([`super::queued`]).
    pub queued: u32,
    /// Requests routed recently ([`crate::share`]: fading u8 count).
    pub share: u8,
}

impl HostLoad {
    /// Bytes of one encoded entry after its 8-byte host hash.
    const WIDTH: usize = 9;
    /// Bytes of one entry of the version-1 layout (in-flight only).
    const WIDTH_V1: usize = 4;
}

/// The per-host load of this Envoy's workers, one shared-data value that
/// every take and release already CASes: the in-flight count, the prompt
/// tokens queued for prefill ([`super::queued`]) and the request-share count
/// ([`crate::share`]). Routing reads it once and writes it once (one get +
/// one CAS set for all three); before, each lived in its own value (3 gets
/// and up to 3 sets per request).
///
/// Encoding: [`LOAD_VERSION`] ‖ (addr hash u64, in-flight u32, queued u32,
/// share u8)… sorted by hash, little-endian; an entry whose three counts are
/// 0 is not stored. A value that does not decode (unknown version, length
/// not a whole number of entries, entries not sorted) reads as empty with
/// [`InFlight::corrupt`] set, which callers count as a shared-data failure;
/// the next CAS write replaces it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InFlight {
    /// Entries, sorted by hash.
    pub entries: Vec<(u64, HostLoad)>,
    /// The value read did not decode (the table is then empty).
    pub corrupt: bool,
}

impl InFlight {
    /// Decode; a missing value is an empty table, a malformed one an empty
    /// table marked [`InFlight::corrupt`].
    pub fn decode(v: Option<&[u8]>) -> InFlight {
        let Some(v) = v else {
            return InFlight::default();
        };
        let parsed = match v {
            [LOAD_VERSION, rest @ ..] => Self::entries_of(rest, HostLoad::WIDTH, |c| {
                Some(HostLoad {
                    inflight: u32::take(c.get(..4)?)?,
                    queued: u32::take(c.get(4..8)?)?,
                    share: *c.get(8)?,
                })
            }),
            [VERSION, rest @ ..] => Self::entries_of(rest, HostLoad::WIDTH_V1, |c| {
                Some(HostLoad {
                    inflight: u32::take(c)?,
                    ..HostLoad::default()
                })
            }),
            _ => None,
        };
        match parsed {
            Some(entries) => InFlight {
                entries,
                corrupt: false,
            },
            None => InFlight {
                entries: Vec::new(),
                corrupt: true,
            },
        }
    }

    /// Entries of width `8 + w`, strictly sorted by hash; `None` if malformed.
    fn entries_of(
        b: &[u8],
        w: usize,
        cell: impl Fn(&[u8]) -> Option<HostLoad>,
    ) -> Option<Vec<(u64, HostLoad)>> {
        if b.len() % (8 + w) != 0 {
            return None;
        }
        let mut out: Vec<(u64, HostLoad)> = Vec::with_capacity(b.len() / (8 + w));
        for c in b.chunks_exact(8 + w) {
            let h = u64_at(c, 0)?;
            if out.last().is_some_and(|l| l.0 >= h) {
                return None;
            }
            out.push((h, cell(c.get(8..)?)?));
        }
        Some(out)
    }

    /// Encode ([`LOAD_VERSION`] layout).
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(1 + self.entries.len() * (8 + HostLoad::WIDTH));
        v.push(LOAD_VERSION);
        for (h, x) in &self.entries {
            v.extend_from_slice(&h.to_le_bytes());
            v.extend_from_slice(&x.inflight.to_le_bytes());
            v.extend_from_slice(&x.queued.to_le_bytes());
            v.push(x.share);
        }
        v
    }

    /// Everything known of host `h` (zeros if absent).
    pub fn load(&self, h: u64) -> HostLoad {
        self.entries
            .binary_search_by_key(&h, |e| e.0)
            .ok()
            .and_then(|i| self.entries.get(i))
            .map_or(HostLoad::default(), |e| e.1)
    }

    /// Set everything known of host `h`; all zeros removes the entry.
    pub fn put(&mut self, h: u64, v: HostLoad) {
        match self.entries.binary_search_by_key(&h, |e| e.0) {
            Ok(i) if v == HostLoad::default() => {
                self.entries.remove(i);
            }
            Ok(i) => {
                if let Some(e) = self.entries.get_mut(i) {
                    e.1 = v;
                }
            }
            Err(_) if v == HostLoad::default() => {}
            Err(i) => self.entries.insert(i, (h, v)),
        }
    }

    /// In-flight count of host `h` (0 if absent).
    pub fn get(&self, h: u64) -> u32 {
        self.load(h).inflight
    }

    /// Set the in-flight count of host `h`.
    pub fn set(&mut self, h: u64, n: u32) {
        let mut v = self.load(h);
        v.inflight = n;
        self.put(h, v);
    }

    /// Add `tokens` to (or, negative, take them off) host `h`'s queued
    /// prefill, saturating at 0.
    pub fn add_queued(&mut self, h: u64, tokens: i64) {
        let mut v = self.load(h);
        let q = (i64::from(v.queued) + tokens).clamp(0, i64::from(u32::MAX));
        v.queued = u32::try_from(q).unwrap_or(0);
        self.put(h, v);
    }

    /// Count one routed request for host `h` in the request-share counts: +1,
    /// halving every host's count first if `h`'s is at 255 (the fading
    /// memory of [`crate::share`]).
    pub fn bump_share(&mut self, h: u64) {
        if self.load(h).share == u8::MAX {
            for e in self.entries.iter_mut() {
                e.1.share /= 2;
            }
            self.entries.retain(|e| e.1 != HostLoad::default());
        }
        let mut v = self.load(h);
        v.share = v.share.saturating_add(1);
        self.put(h, v);
    }

    /// Read from shared data with the CAS token.
    pub fn read<S: SharedData + ?Sized>(s: &S, key: &str) -> Result<(InFlight, u32), ShareError> {
        read_value(s, key)
    }

    /// Create the key (empty table) if it is missing, so CAS updates race safely.
    pub fn init<S: SharedData + ?Sized>(s: &S, key: &str) -> Result<(), ShareError> {
        init_value(s, key, &[LOAD_VERSION])
    }

    /// CAS-update with `f`; `seen` is a previous read to try first (a
    /// corrupt value is replaced: the result is no longer marked corrupt).
    pub fn modify<S: SharedData + ?Sized>(
        s: &S,
        key: &str,
        seen: Option<(InFlight, u32)>,
        mut f: impl FnMut(&mut InFlight),
    ) -> Result<InFlight, ShareError> {
        modify_value(s, key, seen, |t: &mut InFlight| {
            f(t);
            t.corrupt = false;
        })
    }

    /// Add `delta` to host `h` (saturating at 0); returns its new count.
    pub fn add<S: SharedData + ?Sized>(
        s: &S,
        k: &Keys,
        h: u64,
        delta: i32,
        seen: Option<(InFlight, u32)>,
    ) -> Result<u32, ShareError> {
        let t = InFlight::modify(s, &k.inflight, seen, |t| {
            let v = t.get(h).saturating_add_signed(delta);
            t.set(h, v);
        })?;
        Ok(t.get(h))
    }

    /// Lower the count of every host Envoy reports above its own
    /// `rq_active` to it, and drop hosts Envoy no longer lists. Returns the
    /// hosts corrected (`(hash, ours, envoy's)`). The queued and share counts
    /// of listed hosts are kept (queued ones are dropped by
    /// [`super::queued::reconcile`]).
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
        InFlight::modify(s, &k.inflight, None, |t: &mut InFlight| {
            fixed.clear();
            let old = std::mem::take(t);
            for &(h, rq) in envoy {
                let mut ours = old.load(h);
                if ours.inflight > rq {
                    fixed.push((h, ours.inflight, rq));
                }
                ours.inflight = ours.inflight.min(rq);
                t.put(h, ours);
            }
        })?;
        Ok(fixed)
    }
}

/// Passive down marks: host → until (ms since the epoch).
pub type Down = Table<u64>;

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
        let bad = InFlight::decode(Some(b"garbage"));
        assert!(bad.corrupt && bad.entries.is_empty());
        assert!(!InFlight::decode(None).corrupt);
    }

    #[test]
    fn one_value_holds_in_flight_queued_and_share_counts() {
        let (a, b) = (addr_hash("10.0.0.1:80"), addr_hash("10.0.0.2:80"));
        let mut t = InFlight::default();
        t.set(a, 2);
        t.add_queued(a, 700);
        t.add_queued(b, 30);
        t.bump_share(b);
        let back = InFlight::decode(Some(&t.encode()));
        assert_eq!(back, t);
        let want = HostLoad {
            inflight: 0,
            queued: 30,
            share: 1,
        };
        assert_eq!((back.load(a).queued, back.load(b)), (700, want));
        // Counts saturate at 0; an entry whose counts are all 0 is dropped.
        t.add_queued(b, -100);
        t.set(a, 0);
        t.add_queued(a, -700);
        assert_eq!(
            t.entries,
            vec![(
                b,
                HostLoad {
                    share: 1,
                    ..HostLoad::default()
                }
            )]
        );
        // The share count fades: at 255 every count is halved first.
        for _ in 0..254 {
            t.bump_share(b);
        }
        t.bump_share(a);
        assert_eq!((t.load(b).share, t.load(a).share), (255, 1));
        t.bump_share(b);
        assert_eq!((t.load(b).share, t.load(a).share), (128, 0));
        assert_eq!(
            t.entries.len(),
            1,
            "a's entry held nothing but a count of 0"
        );
        // The earlier layout (version 1, in-flight only) still decodes.
        let mut v1 = vec![VERSION];
        v1.extend_from_slice(&a.to_le_bytes());
        v1.extend_from_slice(&5u32.to_le_bytes());
        let old = InFlight::decode(Some(&v1));
        assert_eq!((old.corrupt, old.get(a), old.load(a).queued), (false, 5, 0));
        // Malformed: a partial entry, unsorted entries, an unknown version.
        let good = t.encode();
        for bad in [
            &good[..good.len() - 1],
            &[&[LOAD_VERSION][..], &good[1..], &good[1..]].concat()[..],
            &[&[9u8][..], &good[1..]].concat()[..],
        ] {
            let d = InFlight::decode(Some(bad));
            assert!(d.corrupt && d.entries.is_empty(), "{bad:?}");
        }
    }

    #[test]
    fn a_corrupt_value_is_replaced_by_the_next_update() {
        let s = MockShared::new();
        let k = Keys::new("p");
        s.set(&k.inflight, b"\x02garbage", 0).unwrap();
        let (t, _) = InFlight::read(&s, &k.inflight).unwrap();
        assert!(t.corrupt);
        assert_eq!(InFlight::add(&s, &k, 7, 1, None).unwrap(), 1);
        let (t, _) = InFlight::read(&s, &k.inflight).unwrap();
        assert!(!t.corrupt && t.get(7) == 1);
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
