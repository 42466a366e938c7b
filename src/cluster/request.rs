//! One request's lifecycle against shared data, generic over [`SharedData`]
//! so it is unit-tested natively (the filter's `http.rs` only adds host
//! calls, headers and stats around these):
//! 1. [`picture`]: the loads, queued-prefill tokens, request-share counts
//!    and usable hosts the request is routed on (the in-flight value holds
//!    the first three: one get; down marks, engine samples: ≤ 3 gets in all;
//!    the down marks come from a per-VM [`DownCache`], read at most every
//!    100 ms);
//! 2. [`Slot::take_later`]: count the request on its primary, with its
//!    queued tokens and share count ([`Joined`]), in this VM's waiting
//!    changes ([`Releases`]: no host call; written in one CAS update of
//!    `inflight` when due, on the tick, or when the VM goes idle — not at
//!    all if the request ended before); [`Slot::take`] writes at once;
//! 3. [`Slot::moved_later`] / [`Slot::moved`]: at response headers, a retry
//!    or the fallback used another host: move the count there;
//!    [`Slot::primary_failed`] tells the caller to mark the primary down
//!    ([`super::sync::mark_failed`]);
//! 4. [`Slot::release`]: exactly once at the end, whatever happened; or
//!    [`Slot::release_later`]: the release joins this VM's [`Releases`].
//!
//! Counts are keyed by address, so a membership change or a configuration
//! push between 2 and 4 releases the right host.

use super::engines::{self, Effect, EngineTable};
use super::shared::{ShareError, SharedData};
use super::tables::{addr_hash, Down, InFlight, Keys};
use super::view::View;
use crate::config::{Config, Strategy};
use std::cell::RefCell;

/// The down marks as this VM last read them: `picture` reads the shared
/// table at most once per [`DownCache::MAX_AGE_MS`] instead of once per
/// request (one shared-data get, its copy into the VM and its decode saved
/// on almost every request).
///
/// Invariants: a mark this VM writes (passive health) or clears (its poll)
/// is seen by its next request ([`DownCache::invalidate`] after the write);
/// a mark written by another worker is seen within `MAX_AGE_MS` (before
/// this cache: at once). During that window the other worker's dead host may
/// still be picked here, and Envoy's retry on the secondary serves the
/// request, as it does for the request that found the host dead. A failed
/// read is not cached (the next request reads again); expiry of a cached
/// mark is checked against the request's own clock, so a mark never
/// outlives its `until`.
#[derive(Debug, Default)]
pub struct DownCache {
    cell: RefCell<Option<(Down, u64)>>,
}

impl DownCache {
    /// How old the cached table may be (the stats/poll tick period).
    pub const MAX_AGE_MS: u64 = 100;

    /// Forget the cached table (this VM just wrote the marks).
    pub fn invalidate(&self) {
        if let Ok(mut c) = self.cell.try_borrow_mut() {
            *c = None;
        }
    }

    /// `f` on the marks as of at most `MAX_AGE_MS` before `now_ms` (read
    /// from shared data if the cached copy is older, or absent). The bool is
    /// true when the read failed (`f` then sees no marks).
    pub fn with<S: SharedData + ?Sized, R>(
        &self,
        s: &S,
        k: &Keys,
        now_ms: u64,
        f: impl FnOnce(&Down) -> R,
    ) -> (R, bool) {
        let Ok(mut c) = self.cell.try_borrow_mut() else {
            // Re-entered (cannot happen in a single-threaded VM): read through.
            return match Down::read(s, &k.down) {
                Ok((d, _)) => (f(&d), false),
                Err(_) => (f(&Down::default()), true),
            };
        };
        let fresh = c
            .as_ref()
            .is_some_and(|(_, at)| *at <= now_ms && now_ms - *at < Self::MAX_AGE_MS);
        if !fresh {
            match Down::read(s, &k.down) {
                Ok((d, _)) => *c = Some((d, now_ms)),
                Err(_) => {
                    *c = None;
                    return (f(&Down::default()), true);
                }
            }
        }
        match c.as_ref() {
            Some((d, _)) => (f(d), false),
            None => (f(&Down::default()), false),
        }
    }
}

/// This VM's changes to the in-flight value not written yet, netted per
/// host: in-flight takes (+1) and releases (−1), queued-prefill tokens
/// added and taken off, request-share bumps.
///
/// A take ([`Slot::take_later`]), a move ([`Slot::moved_later`]), a
/// release ([`Slot::release_later`]) and a queued take-off
/// ([`super::queued::Queued::finish_later`]) make no host call: they change
/// the host's net entry here. [`Releases::flush`] writes every non-zero net
/// change in one CAS update (one get + one set; none if every net is 0).
/// The filter flushes:
/// - at a request end that leaves the VM idle (then the VM holds no
///   request, so its contribution must be 0: a request that started and
///   ended between two flushes nets to 0 and costs **no** shared-data write
///   at all; one that was published writes its release at once);
/// - at routing, when the oldest unwritten change is [`Releases::PUBLISH_MS`]
///   old (with the picture's read: one CAS set, [`Releases::due`]);
/// - on every tick ([`Releases::PUBLISH_MS`]), and before the poller
///   reconciles with Envoy's `rq_active`.
///
/// Invariants: this VM's own pictures are exact at once (they add the net
/// changes, [`Releases::overlay`]). Another worker sees this VM's requests
/// with a delay of at most one publish period (10 ms, plus timer jitter): a
/// request younger than that is not counted there (the host looks less busy
/// than it is, by the requests other workers routed in the last 10 ms), and
/// a release is seen up to 10 ms late (busier). A request that ends before it
/// was written is never seen by another worker. At rest every count is exact
/// (the idle flush). A failed write keeps the changes for the next one; at
/// most [`Releases::MAX`] hosts are tracked (beyond, zero entries are
/// reused, then the oldest is dropped and the poller's reconcile with
/// Envoy's `rq_active` repairs the count, as for a VM that died).
///
/// Steady state allocates nothing: an entry whose net returns to 0 is kept
/// (its address string too) for the host's next request.
#[derive(Debug, Default)]
pub struct Releases {
    changes: RefCell<Vec<Change>>,
    /// Host time (ms) of the first change since the last write, while any
    /// net change is non-zero.
    since_ms: std::cell::Cell<Option<u64>>,
    /// The latest host time (ms) this VM gave (routing): the time of a
    /// change made without a clock read (a release, a take-off).
    clock_ms: std::cell::Cell<u64>,
}

/// One host's net change not written yet.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Change {
    hash: u64,
    /// The host's address (for its gauge); empty when only its hash is known.
    addr: String,
    inflight: i32,
    queued: i64,
    shares: u32,
}

impl Change {
    fn is_zero(&self) -> bool {
        self.inflight == 0 && self.queued == 0 && self.shares == 0
    }
}

impl Releases {
    /// Most hosts with changes kept.
    pub const MAX: usize = 1024;
    /// Longest time a change waits while the VM is busy (the tick period).
    pub const PUBLISH_MS: u64 = 10;

    /// Nothing waits (every net change is 0).
    pub fn is_empty(&self) -> bool {
        self.changes
            .try_borrow()
            .map_or(true, |c| c.iter().all(Change::is_zero))
    }

    /// Is a write due at `now_ms` (a change waits for [`Releases::PUBLISH_MS`])?
    pub fn due(&self, now_ms: u64) -> bool {
        self.clock_ms.set(now_ms);
        self.since_ms
            .get()
            .is_some_and(|t| now_ms.saturating_sub(t) >= Self::PUBLISH_MS)
            && !self.is_empty()
    }

    /// `f` on host `hash`'s entry (created or reused); `addr` names it if known.
    fn change(
        &self,
        hash: u64,
        addr: Option<&str>,
        now_ms: Option<u64>,
        f: impl FnOnce(&mut Change),
    ) {
        let Ok(mut c) = self.changes.try_borrow_mut() else {
            return;
        };
        let i = match c.iter().position(|x| x.hash == hash) {
            Some(i) => i,
            None => {
                if c.len() >= Self::MAX {
                    match c.iter().position(Change::is_zero) {
                        Some(z) => {
                            c.swap_remove(z);
                        }
                        None => {
                            c.remove(0);
                        }
                    }
                }
                c.push(Change {
                    hash,
                    ..Change::default()
                });
                c.len() - 1
            }
        };
        if let Some(x) = c.get_mut(i) {
            if let Some(a) = addr.filter(|a| x.addr != *a) {
                a.clone_into(&mut x.addr);
            }
            f(x);
        }
        if let Some(t) = now_ms {
            self.clock_ms.set(t);
        }
        if self.since_ms.get().is_none() {
            self.since_ms.set(Some(self.clock_ms.get()));
        }
    }

    /// A take of `joined` on `addr` at `now_ms` waits here.
    fn take(&self, addr: &str, joined: Joined, now_ms: u64) {
        self.change(addr_hash(addr), Some(addr), Some(now_ms), |x| {
            x.inflight = x.inflight.saturating_add(1);
            x.queued = x.queued.saturating_add(i64::from(joined.queued_tokens));
            x.shares = x.shares.saturating_add(u32::from(joined.share));
        });
    }

    /// A release of `addr` waits here.
    fn push(&self, addr: &str) {
        self.change(addr_hash(addr), Some(addr), None, |x| {
            x.inflight = x.inflight.saturating_sub(1);
        });
    }

    /// A queued-prefill take-off of `tokens` on host `hash` waits here.
    pub fn push_queued(&self, hash: u64, tokens: u32) {
        self.change(hash, None, None, |x| {
            x.queued = x.queued.saturating_sub(i64::from(tokens));
        });
    }

    /// Apply the net changes to `t` (counts saturate at 0).
    fn apply(&self, t: &mut InFlight) {
        if let Ok(c) = self.changes.try_borrow() {
            for x in c.iter().filter(|x| !x.is_zero()) {
                let mut v = t.load(x.hash);
                v.inflight = v.inflight.saturating_add_signed(x.inflight);
                t.put(x.hash, v);
                if x.queued != 0 {
                    t.add_queued(x.hash, x.queued);
                }
                for _ in 0..x.shares.min(512) {
                    t.bump_share(x.hash);
                }
            }
        }
    }

    /// [`Releases::apply`] on the per-member values of `view` (`loads`,
    /// `queued`, `shares`: as [`View::loads`], [`View::queued`] and
    /// [`View::shares`] give them), without a copy of the table: the same
    /// saturating arithmetic, host by host (a share count saturates at 255
    /// instead of halving every host: the picture of a moment).
    /// O(changes × members).
    fn overlay(
        &self,
        view: &View,
        loads: &mut [u32],
        mut queued: Option<&mut [u32]>,
        mut shares: Option<&mut [u8]>,
    ) {
        let Ok(c) = self.changes.try_borrow() else {
            return;
        };
        let n = loads.len();
        for x in c.iter().filter(|x| !x.is_zero()) {
            let Some(i) = (0..n).find(|&i| view.hash(i) == Some(x.hash)) else {
                continue;
            };
            if let Some(l) = loads.get_mut(i) {
                *l = l.saturating_add_signed(x.inflight);
            }
            if let Some(q) = queued.as_deref_mut().and_then(|q| q.get_mut(i)) {
                let v = (i64::from(*q) + x.queued).clamp(0, i64::from(u32::MAX));
                *q = u32::try_from(v).unwrap_or(0);
            }
            if let Some(s) = shares.as_deref_mut().and_then(|s| s.get_mut(i)) {
                let v = u32::from(*s).saturating_add(x.shares).min(255);
                *s = u8::try_from(v).unwrap_or(u8::MAX);
            }
        }
    }

    /// The gauges of the hosts whose in-flight count changed, as in `t`
    /// (each once), and zero every change (entries are kept for reuse).
    fn written(&self, t: &InFlight, out: &mut Vec<Gauge>) {
        if let Ok(mut c) = self.changes.try_borrow_mut() {
            for x in c.iter_mut() {
                if x.inflight != 0 && !x.addr.is_empty() && !out.iter().any(|(a, _)| *a == x.addr) {
                    out.push((x.addr.clone(), t.get(x.hash)));
                }
                x.inflight = 0;
                x.queued = 0;
                x.shares = 0;
            }
        }
        self.since_ms.set(None);
    }

    /// Write the net changes (one get + one CAS set; none if every net is
    /// 0). Returns the changed hosts' counts now.
    ///
    /// # Errors
    /// Shared data failed: the changes keep waiting.
    pub fn flush<S: SharedData + ?Sized>(&self, s: &S, k: &Keys) -> Result<Vec<Gauge>, ShareError> {
        self.flush_seen(s, k, None)
    }

    /// [`Releases::flush`] trying `seen` (a recent read with its CAS token)
    /// first: one set when it is still current.
    ///
    /// # Errors
    /// Shared data failed: the changes keep waiting.
    pub fn flush_seen<S: SharedData + ?Sized>(
        &self,
        s: &S,
        k: &Keys,
        seen: Option<(InFlight, u32)>,
    ) -> Result<Vec<Gauge>, ShareError> {
        let mut out = Vec::new();
        if self.is_empty() {
            self.since_ms.set(None);
            return Ok(out);
        }
        let t = InFlight::modify(s, &k.inflight, seen, |t| self.apply(t))?;
        self.written(&t, &mut out);
        Ok(out)
    }
}

/// What a VM keeps between its requests: the down-mark cache and the
/// releases waiting to be written.
#[derive(Debug, Default)]
pub struct VmLocal {
    /// See [`DownCache`].
    pub downs: DownCache,
    /// See [`Releases`].
    pub releases: Releases,
    /// The last request's picture, whose vectors the next one reuses
    /// ([`picture_into`]).
    pub spare: RefCell<Picture>,
}

/// What one request is routed on.
#[derive(Debug, Clone, Default)]
pub struct Picture {
    /// Load per member (our in-flight counts, raised by engine load).
    pub loads: Vec<u32>,
    /// Prompt tokens queued for prefill per member ([`super::queued`]), with
    /// the `affinity` strategy; `None` otherwise or if the read failed.
    pub queued: Option<Vec<u32>>,
    /// Request-share counts per member ([`crate::share`]), with
    /// `share_factor > 0`; `None` otherwise or if the read failed.
    pub shares: Option<Vec<u8>>,
    /// Usable members (health, down marks, saturation, LoRA tier).
    pub usable: Vec<bool>,
    /// The in-flight table as read (to try first when taking the slot).
    pub snapshot: Option<(InFlight, u32)>,
    /// Shared-data reads that failed, and values that did not decode (the
    /// picture is then partial: unknown counts read as 0, unknown marks as
    /// none).
    pub failures: u32,
    /// What the engine view did (with `engine`).
    pub engine: Option<Effect>,
}

/// Read the picture for `view` at `now_ms`; `model` is the request's `model`;
/// `local`: this VM's down-mark cache and waiting changes (added to the
/// loads, queued tokens and shares; the snapshot is kept as read, for a
/// write with its CAS token).
pub fn picture<S: SharedData + ?Sized>(
    s: &S,
    k: &Keys,
    view: &View,
    cfg: &Config,
    model: Option<&str>,
    now_ms: u64,
    local: &VmLocal,
) -> Picture {
    let mut out = Picture::default();
    picture_into(s, k, view, cfg, model, now_ms, local, &mut out);
    out
}

/// [`picture`] into `out`, reusing its vectors (the filter keeps one
/// picture per VM: no allocation for them in steady state).
#[allow(clippy::too_many_arguments)]
pub fn picture_into<S: SharedData + ?Sized>(
    s: &S,
    k: &Keys,
    view: &View,
    cfg: &Config,
    model: Option<&str>,
    now_ms: u64,
    local: &VmLocal,
    out: &mut Picture,
) {
    let mut failures = 0;
    let snapshot = InFlight::read(s, &k.inflight)
        .map_err(|_| failures += 1)
        .ok();
    let affinity = cfg.strategy == Strategy::Affinity;
    let share = affinity && cfg.affinity.share_factor > 0.0;
    let empty = InFlight::default();
    let t = snapshot.as_ref().map_or(&empty, |(t, _)| t);
    view.fill(&mut out.loads, |h| t.get(h));
    // Queued and share counts only from a read that succeeded.
    let (mut queued, mut shares) = (out.queued.take(), out.shares.take());
    if snapshot.is_some() {
        if affinity {
            let q = queued.get_or_insert_with(Vec::new);
            view.fill(q, |h| t.load(h).queued);
            out.queued = queued;
        }
        if share {
            let v = shares.get_or_insert_with(Vec::new);
            view.fill(v, |h| t.load(h).share);
            out.shares = shares;
        }
    }
    // This VM's own changes not written yet (its takes, releases, take-offs):
    // its picture is exact even when the shared value lags.
    local.releases.overlay(
        view,
        &mut out.loads,
        out.queued.as_deref_mut(),
        out.shares.as_deref_mut(),
    );
    if t.corrupt {
        failures += 1;
    }
    let usable = &mut out.usable;
    let ((), failed) = local
        .downs
        .with(s, k, now_ms, |down| view.usable_into(down, now_ms, usable));
    failures += u32::from(failed);
    out.engine = cfg
        .engine
        .as_ref()
        .and_then(|e| match EngineTable::read(s, k) {
            Ok(t) => Some(engines::apply(
                view,
                &t,
                e,
                model,
                now_ms,
                &mut out.loads,
                &mut out.usable,
            )),
            Err(_) => {
                failures += 1;
                None
            }
        });
    out.snapshot = snapshot;
    out.failures = failures;
}

/// The in-flight slot of one request, by address.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Slot {
    /// The primary chosen at routing.
    pub primary: Option<String>,
    /// Where the count is held ([`Slot::holding`]).
    held: Held,
}

/// Where a [`Slot`]'s count is held: the primary needs no second copy of
/// its address (one allocation less per request).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
enum Held {
    #[default]
    Nowhere,
    Primary,
    Other(String),
}

/// A gauge update: (address, count now).
pub type Gauge = (String, u32);

/// What a take writes besides the request's in-flight count, in the same
/// CAS update.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Joined {
    /// Prompt tokens to add to the primary's queued prefill ([`super::queued`]).
    pub queued_tokens: u32,
    /// Count the request in the primary's request share ([`crate::share`]).
    pub share: bool,
}

impl Slot {
    /// Count the request on `primary` (routing) at once: [`Slot::take_later`]
    /// then [`Releases::flush_seen`] with `seen` (the picture's read): one
    /// CAS set when `seen` is still current, else one get + one set per
    /// retry. Returns the gauges of the hosts written.
    ///
    /// # Errors
    /// Shared data failed: the request is counted in the VM's waiting
    /// changes (written by the next flush).
    pub fn take<S: SharedData + ?Sized>(
        &mut self,
        s: &S,
        k: &Keys,
        primary: &str,
        seen: Option<(InFlight, u32)>,
        releases: &Releases,
        joined: Joined,
    ) -> Result<Vec<Gauge>, ShareError> {
        self.take_later(primary, releases, joined, releases.clock_ms.get());
        releases.flush_seen(s, k, seen)
    }

    /// Count the request on `primary` (routing, at `now_ms`) in this VM's
    /// waiting changes, with its `joined` queued tokens and share count: no
    /// host call ([`Releases`] says when it is written).
    pub fn take_later(&mut self, primary: &str, releases: &Releases, joined: Joined, now_ms: u64) {
        if self.primary.as_deref() != Some(primary) {
            self.primary = Some(primary.to_string());
        }
        releases.take(primary, joined, now_ms);
        self.held = Held::Primary;
    }

    /// Did the primary fail this request? (`upstream`: the host that answered,
    /// `status_503`: the response is a 503.) Another host answered, or none
    /// did and the answer is a 503.
    pub fn primary_failed(&self, upstream: Option<&str>, status_503: bool) -> bool {
        match (self.primary.as_deref(), upstream) {
            (Some(p), Some(u)) => p != u,
            (Some(_), None) => status_503,
            (None, _) => false,
        }
    }

    /// The request is served by `actual`: move the count there if it is held
    /// elsewhere. Returns the gauge updates; `Err` if shared data failed (the
    /// slot then holds whatever it could keep, never two counts).
    ///
    /// # Errors
    /// Shared data failed.
    pub fn moved<S: SharedData + ?Sized>(
        &mut self,
        s: &S,
        k: &Keys,
        actual: &str,
    ) -> Result<Vec<Gauge>, ShareError> {
        let Some(held) = self.holding().map(str::to_string) else {
            return Ok(vec![]);
        };
        if held == actual {
            return Ok(vec![]);
        }
        let released = InFlight::add(s, k, addr_hash(&held), -1, None);
        let taken = InFlight::add(s, k, addr_hash(actual), 1, None);
        match (released, taken) {
            (Ok(a), Ok(b)) => {
                self.hold(actual);
                Ok(vec![(held, a), (actual.to_string(), b)])
            }
            (Ok(_), Err(e)) => {
                self.held = Held::Nowhere;
                Err(e)
            }
            (Err(e), Ok(_)) => {
                // Two counts held: give the new one back, keep the old.
                let _ = InFlight::add(s, k, addr_hash(actual), -1, None);
                Err(e)
            }
            (Err(e), Err(_)) => Err(e),
        }
    }

    /// [`Slot::moved`] in this VM's waiting changes (no host call).
    pub fn moved_later(&mut self, actual: &str, releases: &Releases) {
        let Some(held) = self.holding() else {
            return;
        };
        if held == actual {
            return;
        }
        releases.push(held);
        releases.take(actual, Joined::default(), releases.clock_ms.get());
        self.hold(actual);
    }

    /// The host whose count this request holds.
    pub fn holding(&self) -> Option<&str> {
        match &self.held {
            Held::Nowhere => None,
            Held::Primary => self.primary.as_deref(),
            Held::Other(a) => Some(a),
        }
    }

    /// The count is now held on `addr`.
    fn hold(&mut self, addr: &str) {
        self.held = if self.primary.as_deref() == Some(addr) {
            Held::Primary
        } else {
            Held::Other(addr.to_string())
        };
    }

    /// Release the count later (once; see [`Releases`]): no host call.
    /// Returns whether a count was held.
    pub fn release_later(&mut self, releases: &Releases) -> bool {
        match self.holding() {
            Some(held) => {
                releases.push(held);
                self.held = Held::Nowhere;
                true
            }
            None => false,
        }
    }

    /// Release the count (once; later calls do nothing).
    ///
    /// # Errors
    /// Shared data failed (the count is lost; the next poll's reconcile
    /// repairs it).
    pub fn release<S: SharedData + ?Sized>(
        &mut self,
        s: &S,
        k: &Keys,
    ) -> Option<Result<Gauge, ShareError>> {
        let held = self.holding()?.to_string();
        self.held = Held::Nowhere;
        Some(InFlight::add(s, k, addr_hash(&held), -1, None).map(|n| (held, n)))
    }
}

#[cfg(test)]
mod tests {
    use super::super::shared::MockShared;
    use super::super::sync::{apply_admin, mark_failed, Follower};
    use super::super::view::AddrSlots;
    use super::*;
    use crate::cost::CostModel;
    use crate::index::VecStore;
    use crate::router::Body;
    use crate::select::Loads;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn doc(hosts: &[(u16, bool)]) -> String {
        let hs: Vec<String> = hosts
            .iter()
            .map(|(port, ok)| {
                format!(
                    r#"{{"address":{{"socket_address":{{"address":"10.0.0.1","port_value":{port}}}}},"health_status":{{"failed_active_health_check":{}}}}}"#,
                    !ok
                )
            })
            .collect();
        format!(
            r#"{{"cluster_statuses":[{{"name":"llm","host_statuses":[{}]}}]}}"#,
            hs.join(",")
        )
    }

    struct World {
        s: MockShared,
        k: Keys,
        f: Follower,
        index: VecStore,
    }

    impl World {
        fn new() -> World {
            let cfg =
                Config::from_json(br#"{"cluster":"llm","admin_cluster":"a","refresh_ms":100}"#)
                    .unwrap();
            let s = MockShared::new();
            let k = Keys::new("t");
            InFlight::init(&s, &k.inflight).unwrap();
            Down::init(&s, &k.down).unwrap();
            World {
                index: VecStore::new(cfg.affinity.index_slots),
                f: Follower::new(cfg),
                s,
                k,
            }
        }

        /// Two available hosts, 10.0.0.1:1 and :2, polled at 0.
        fn with_two_hosts() -> World {
            let w = World::new();
            apply_admin(
                &w.s,
                &w.k,
                doc(&[(1, true), (2, true)]).as_bytes(),
                "llm",
                0,
            )
            .unwrap();
            w
        }

        /// Route like the filter: picture, affinity over address ids, take.
        fn route(&mut self, body: &str, now: u64) -> (Slot, Option<String>) {
            let view = self.f.current(&self.s, &self.k);
            let p = picture(
                &self.s,
                &self.k,
                &view,
                self.f.config(),
                None,
                now,
                &VmLocal::default(),
            );
            let key = view.router.key(Body::Complete(body.as_bytes()), None);
            let cost = CostModel::new(view.router.cost_config());
            let mut slots = AddrSlots::new(&mut self.index, &view, &p.usable);
            let loads = Loads::with_available(&p.loads, &p.usable);
            let (d, _) =
                view.router
                    .select_affinity(&key, body.len(), loads, &mut slots, &cost, now, 0);
            let secondary = view
                .takeover(d.primary, &p.usable)
                .and_then(|s| view.addr(s))
                .map(str::to_string);
            let mut slot = Slot::default();
            slot.take(
                &self.s,
                &self.k,
                view.addr(d.primary).unwrap(),
                p.snapshot,
                &Releases::default(),
                Joined::default(),
            )
            .unwrap();
            (slot, secondary)
        }

        fn count(&self, addr: &str) -> u32 {
            InFlight::read(&self.s, &self.k.inflight)
                .unwrap()
                .0
                .get(addr_hash(addr))
        }
    }

    #[test]
    fn route_retry_release_poll_failure_and_reload() {
        let mut w = World::new();
        apply_admin(
            &w.s,
            &w.k,
            doc(&[(1, true), (2, true), (3, true)]).as_bytes(),
            "llm",
            0,
        )
        .unwrap();
        let hot = format!(
            r#"{{"messages":[{{"role":"user","content":"{}"}}]}}"#,
            "shared prompt ".repeat(600)
        );
        // Route and finish one request: the count goes up and back to 0.
        let (mut a, _) = w.route(&hot, 10);
        let holder = a.primary.clone().unwrap();
        assert_eq!(w.count(&holder), 1);
        assert!(!a.primary_failed(Some(&holder), false));
        assert_eq!(a.release(&w.s, &w.k).unwrap().unwrap(), (holder.clone(), 0));
        assert!(a.release(&w.s, &w.k).is_none(), "released twice");
        // The holder dies: the next request is retried on its secondary.
        let (mut b, secondary) = w.route(&hot, 20);
        assert_eq!(b.primary.as_deref(), Some(holder.as_str()));
        let secondary = secondary.unwrap();
        assert!(b.primary_failed(Some(&secondary), false));
        mark_failed(&w.s, &w.k, &holder, 30, 100).unwrap();
        let g = b.moved(&w.s, &w.k, &secondary).unwrap();
        assert_eq!(g, vec![(holder.clone(), 0), (secondary.clone(), 1)]);
        // Meanwhile requests of the prefix go straight to that successor.
        for t in 0..5 {
            let (mut c, _) = w.route(&hot, 40 + t);
            assert_eq!(c.primary.as_deref(), Some(secondary.as_str()));
            c.release(&w.s, &w.k).unwrap().unwrap();
        }
        // A failing poll and a reload (configuration push) change nothing.
        assert!(apply_admin(&w.s, &w.k, b"oops", "llm", 50).is_err());
        w.s.fail_next.set(1);
        assert!(apply_admin(&w.s, &w.k, doc(&[(1, true)]).as_bytes(), "llm", 55).is_err());
        let cfg = w.f.config().clone();
        w.f = Follower::new(cfg);
        w.f.adopt(&w.s, &w.k);
        assert_eq!(w.f.current(&w.s, &w.k).endpoints().len(), 3);
        let (mut d, _) = w.route(&hot, 60);
        assert_eq!(d.primary.as_deref(), Some(secondary.as_str()));
        // Releases after the reload hit the right hosts: everything back to 0.
        d.release(&w.s, &w.k).unwrap().unwrap();
        b.release(&w.s, &w.k).unwrap().unwrap();
        for port in 1..=3 {
            assert_eq!(w.count(&format!("10.0.0.1:{port}")), 0);
        }
        // A 503 with no upstream also counts as a failed primary.
        assert!(d.primary_failed(None, true) && !d.primary_failed(None, false));
    }

    #[test]
    fn shared_data_failures_degrade_never_double_count() {
        let mut w = World::with_two_hosts();
        let view = w.f.current(&w.s, &w.k);
        // Every read failing: a partial picture (zeros, all usable), counted.
        w.s.fail_next.set(2);
        let p = picture(
            &w.s,
            &w.k,
            &view,
            w.f.config(),
            None,
            5,
            &VmLocal::default(),
        );
        assert_eq!(
            (p.failures, p.loads, p.usable),
            (2, vec![0, 0], vec![true, true])
        );
        let (mut a, _) = w.route("{\"prompt\":\"x\"}", 10);
        let held = a.holding().unwrap().to_string();
        let other = if held.ends_with(":1") {
            "10.0.0.1:2"
        } else {
            "10.0.0.1:1"
        };
        // The move fails half way (release ok, take fails): hold nothing.
        w.s.fail_next.set(0);
        w.s.race_next.set(0);
        let s2 = MockShared::new(); // a store where every call fails
        s2.fail_next.set(100);
        assert!(a.moved(&s2, &w.k, other).is_err());
        assert_eq!(a.holding(), Some(held.as_str()));
        assert_eq!(w.count(&held), 1);
        a.moved(&w.s, &w.k, other).unwrap();
        a.release(&w.s, &w.k).unwrap().unwrap();
        assert_eq!((w.count(&held), w.count(other)), (0, 0));
    }

    #[test]
    fn down_marks_are_cached_for_at_most_max_age() {
        let w = World::with_two_hosts();
        let view = w.f.current(&w.s, &w.k);
        let local = VmLocal::default();
        let cache = &local.downs;
        let usable = |now| picture(&w.s, &w.k, &view, w.f.config(), None, now, &local).usable;
        assert_eq!(usable(1000), vec![true, true]);
        // Another worker marks host 1 down: not seen until the cache is 100 ms old.
        mark_failed(&w.s, &w.k, "10.0.0.1:1", 1010, 100_000).unwrap();
        let calls = w.s.calls.get();
        assert_eq!(usable(1050), vec![true, true]);
        assert_eq!(usable(1099), vec![true, true]);
        assert_eq!(
            w.s.calls.get() - calls,
            2,
            "in-flight only: no down-mark get"
        );
        let marked = usable(1100);
        assert_eq!(marked, vec![false, true]);
        // This VM's own write is seen at once.
        mark_failed(&w.s, &w.k, "10.0.0.1:2", 1110, 100_000).unwrap();
        assert_eq!(usable(1120), vec![false, true], "cached");
        cache.invalidate();
        assert_eq!(usable(1121), vec![false, false]);
        // A clock that goes back reads again; a failed read is not cached.
        assert_eq!(usable(900), vec![false, false]);
        w.s.fail_next.set(2);
        let p = picture(&w.s, &w.k, &view, w.f.config(), None, 2000, &local);
        assert_eq!((p.failures, p.usable), (2, vec![true, true]));
        let calls = w.s.calls.get();
        assert_eq!(usable(2001), vec![false, false]);
        assert_eq!(w.s.calls.get() - calls, 2, "a failed read is not cached");
    }

    /// The request-share counts kept in the in-flight value (read with the
    /// picture, bumped by the take) route exactly like the same counts kept
    /// in the index's slot store (`Router::note_routed`), request by request;
    /// and routing makes one get + one CAS set for the counts, the queued
    /// tokens and the share.
    #[test]
    fn share_and_queued_counts_ride_on_the_in_flight_value() {
        let cfg = Config::from_json(
            br#"{"cluster":"llm","admin_cluster":"a","share_factor":1.0,"learn_costs":false}"#,
        )
        .unwrap();
        let (s, k) = (MockShared::new(), Keys::new("t"));
        InFlight::init(&s, &k.inflight).unwrap();
        Down::init(&s, &k.down).unwrap();
        let hosts: Vec<(u16, bool)> = (1..=4).map(|p| (p, true)).collect();
        apply_admin(&s, &k, doc(&hosts).as_bytes(), "llm", 0).unwrap();
        let f = Follower::new(cfg.clone());
        let view = f.current(&s, &k);
        let n = view.endpoints().len();
        let cost = CostModel::new(view.router.cost_config());
        let local = VmLocal::default();
        let slots = cfg.affinity.index_slots;
        let (mut reference, mut folded) = (VecStore::new(slots), VecStore::new(slots));
        let (mut diverted, mut rng) = (0, 12345u64);
        for i in 0..400u64 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let g = rng % 6;
            let body = format!(
                r#"{{"messages":[{{"role":"system","content":"group {g} {}"}},{{"role":"user","content":"q{i}"}}]}}"#,
                "shared instructions ".repeat(60)
            );
            let key = view.router.key(Body::Complete(body.as_bytes()), None);
            let now = 1000 + i;
            // Reference: the counts in the slot store.
            let want = {
                let mut st = AddrSlots::new(&mut reference, &view, &[]);
                let (_, c, known) = view.router.choose_affinity(
                    &key,
                    body.len(),
                    Loads::new(&vec![0; n]),
                    &st,
                    &cost,
                    now,
                    i,
                );
                view.router
                    .record_affinity(&mut st, &key.blocks, known.as_ref(), c.primary, now);
                view.router.note_routed(&mut st, c.primary);
                c
            };
            // Folded: the picture's read, the take's update.
            let calls = s.calls.get();
            let p = picture(&s, &k, &view, &cfg, None, now, &local);
            assert!(p.queued.is_some() && p.shares.is_some());
            let mut st =
                AddrSlots::new(&mut folded, &view, &p.usable).with_shares(p.shares.as_deref());
            let l = Loads::with_available(&p.loads, &p.usable);
            let (_, c, known) =
                view.router
                    .choose_affinity(&key, body.len(), l, &st, &cost, now, i);
            assert_eq!(c, want, "request {i}");
            diverted += usize::from(c.reason != crate::affinity::Reason::Warm && known.is_some());
            view.router
                .record_affinity(&mut st, &key.blocks, known.as_ref(), c.primary, now);
            view.router.note_routed(&mut st, c.primary); // dropped: the take counts it
            let addr = view.addr(c.primary).unwrap();
            let mut slot = Slot::default();
            let joined = Joined {
                queued_tokens: 100,
                share: true,
            };
            slot.take(&s, &k, addr, p.snapshot, &local.releases, joined)
                .unwrap();
            let mut q = crate::cluster::queued::Queued::default();
            q.joined(addr, 100);
            // One get (picture) + one set (take); the down marks are read
            // every 100 ms (`DownCache`).
            let downs = u64::from(i % DownCache::MAX_AGE_MS == 0);
            assert_eq!(s.calls.get() - calls, 2 + downs, "request {i}");
            assert_eq!(
                crate::cluster::queued::read(&s, &k, &view).unwrap()[c.primary],
                100
            );
            // Its end: the take-off and the release wait, one update writes both.
            q.finish_later(&local.releases);
            assert!(slot.release_later(&local.releases));
            local.releases.flush(&s, &k).unwrap();
        }
        assert!(diverted > 0, "the share bound never acted");
        let (t, _) = InFlight::read(&s, &k.inflight).unwrap();
        let shares = view.shares(&t);
        let want: Vec<u8> = (0..n)
            .map(|r| crate::share::Share::read(&reference, n).of(r))
            .collect();
        assert_eq!(shares, want);
        assert_eq!((view.loads(&t), view.queued(&t)), (vec![0; n], vec![0; n]));
        assert_eq!(
            crate::share::Share::read(&folded, n),
            crate::share::Share::default()
        );
    }

    #[test]
    fn deferred_releases_ride_on_the_next_take_or_a_flush() {
        let w = World::with_two_hosts();
        let view = w.f.current(&w.s, &w.k);
        let local = VmLocal::default();
        let (a1, a2) = ("10.0.0.1:1", "10.0.0.1:2");
        let take = |slot: &mut Slot, addr: &str| {
            let p = picture(&w.s, &w.k, &view, w.f.config(), None, 10, &local);
            let loads = p.loads.clone();
            let g = slot
                .take(
                    &w.s,
                    &w.k,
                    addr,
                    p.snapshot,
                    &local.releases,
                    Joined::default(),
                )
                .unwrap();
            (loads, g)
        };
        let (mut x, mut y, mut z) = (Slot::default(), Slot::default(), Slot::default());
        take(&mut x, a1);
        take(&mut y, a1);
        assert_eq!(w.count(a1), 2);
        // x ends while y is live: nothing written, but this VM's next
        // picture already sees it ended, and its take writes both at once.
        let calls = w.s.calls.get();
        assert!(x.release_later(&local.releases));
        assert!(!x.release_later(&local.releases), "released twice");
        assert_eq!(w.s.calls.get(), calls, "no host call at the release");
        assert_eq!(w.count(a1), 2, "other workers see it one flush late");
        let calls = w.s.calls.get();
        let (loads, mut gauges) = take(&mut z, a2);
        assert_eq!(loads[view.position(a1.as_bytes()).unwrap()], 1);
        assert_eq!(w.s.calls.get() - calls, 2, "one get + one CAS set");
        gauges.sort();
        assert_eq!(gauges, vec![(a1.to_string(), 1), (a2.to_string(), 1)]);
        assert!(local.releases.is_empty());
        assert_eq!((w.count(a1), w.count(a2)), (1, 1));
        // A failed take keeps them; a flush writes them.
        y.release_later(&local.releases);
        z.release_later(&local.releases);
        w.s.fail_next.set(1);
        assert!(local.releases.flush(&w.s, &w.k).is_err());
        assert!(!local.releases.is_empty());
        let mut g = local.releases.flush(&w.s, &w.k).unwrap();
        g.sort();
        assert_eq!(g, vec![(a1.to_string(), 0), (a2.to_string(), 0)]);
        assert_eq!((w.count(a1), w.count(a2)), (0, 0));
        assert_eq!(local.releases.flush(&w.s, &w.k).unwrap(), vec![]);
    }

    /// One request at a time, each release left waiting (the filter writes
    /// it at once when its VM goes idle; this is the worst case of a VM
    /// whose requests overlap): every picture still sees exact
    /// loads and queued tokens, each routing is one get + one CAS set (the
    /// release rides on it), and one flush (the tick) leaves the table at 0.
    #[test]
    fn a_single_worker_sees_exact_counts_with_releases_left_waiting() {
        let w = World::with_two_hosts();
        let view = w.f.current(&w.s, &w.k);
        let local = VmLocal::default();
        let addrs = ["10.0.0.1:1", "10.0.0.1:2"];
        for i in 0..40 {
            let calls = w.s.calls.get();
            let p = picture(&w.s, &w.k, &view, w.f.config(), None, 10, &local);
            assert_eq!(p.loads, vec![0, 0], "request {i}");
            assert_eq!(p.queued, Some(vec![0, 0]), "request {i}");
            let addr = addrs[i % 2];
            let mut slot = Slot::default();
            let joined = Joined {
                queued_tokens: 50,
                share: false,
            };
            slot.take(&w.s, &w.k, addr, p.snapshot, &local.releases, joined)
                .unwrap();
            // Down marks: read once per DownCache::MAX_AGE_MS (the clock stands).
            let downs = u64::from(i == 0);
            assert_eq!(w.s.calls.get() - calls, 2 + downs, "request {i}");
            assert_eq!(w.count(addr), 1, "request {i}: counted once");
            let mut q = crate::cluster::queued::Queued::default();
            q.joined(addr, 50);
            let calls = w.s.calls.get();
            q.finish_later(&local.releases);
            assert!(slot.release_later(&local.releases));
            assert_eq!(
                w.s.calls.get(),
                calls,
                "request {i}: no host call at its end"
            );
        }
        assert_eq!(w.count(addrs[1]), 1, "other workers see it one tick late");
        local.releases.flush(&w.s, &w.k).unwrap();
        let (t, _) = InFlight::read(&w.s, &w.k.inflight).unwrap();
        assert_eq!((view.loads(&t), view.queued(&t)), (vec![0, 0], vec![0, 0]));
    }

    /// Two workers (two `VmLocal`s on one store) routing with the takes
    /// left waiting (`Slot::take_later`, as the filter does): a request that
    /// starts and ends between writes costs no shared-data write and is
    /// never seen by the other worker; a request still live when a write is
    /// due (`PUBLISH_MS`, the tick) is seen by the other worker from then
    /// on, and its release at the end that leaves its VM idle is seen at
    /// once. Each VM's own picture is exact all along.
    #[test]
    fn takes_left_waiting_are_seen_by_other_workers_within_a_publish_period() {
        let w = World::with_two_hosts();
        let view = w.f.current(&w.s, &w.k);
        let (a, b) = (VmLocal::default(), VmLocal::default());
        let (h1, h2) = ("10.0.0.1:1", "10.0.0.1:2");
        let p1 = view.position(h1.as_bytes()).unwrap();
        let loads = |l: &VmLocal, now| picture(&w.s, &w.k, &view, w.f.config(), None, now, l).loads;
        let joined = Joined {
            queued_tokens: 40,
            share: false,
        };
        // Short requests one at a time on A: one get per picture, no write.
        loads(&a, 0); // the down-mark caches' first reads
        loads(&b, 0);
        for i in 0..50u64 {
            let now = 1 + i;
            let calls = w.s.calls.get();
            assert_eq!(loads(&a, now)[p1], 0, "request {i}");
            let mut slot = Slot::default();
            slot.take_later(h1, &a.releases, joined, now);
            assert!(!a.releases.due(now), "a fresh take is not due");
            assert_eq!(loads(&a, now)[p1], 1, "A's own picture counts it");
            assert_eq!(loads(&b, now)[p1], 0, "B does not see it yet");
            let mut q = crate::cluster::queued::Queued::default();
            q.joined(h1, 40);
            q.finish_later(&a.releases);
            assert!(slot.release_later(&a.releases));
            // The end leaves A idle: its flush has nothing to write.
            assert!(a.releases.is_empty(), "request {i}: nets to 0");
            assert!(a.releases.flush(&w.s, &w.k).unwrap().is_empty());
            let (t, _) = InFlight::read(&w.s, &w.k.inflight).unwrap();
            assert!(t.entries.is_empty(), "request {i}: nothing written");
            assert_eq!(
                w.s.calls.get() - calls,
                3 + 1,
                "pictures and the read above only"
            );
        }
        // A long request on A, then a second one 10 ms later: the second
        // routing finds the first take due and writes it with its picture.
        let mut long = Slot::default();
        long.take_later(h1, &a.releases, Joined::default(), 100);
        assert_eq!(loads(&b, 105)[p1], 0, "not written yet");
        let snapshot = picture(&w.s, &w.k, &view, w.f.config(), None, 110, &a).snapshot;
        let mut second = Slot::default();
        second.take_later(h2, &a.releases, Joined::default(), 110);
        assert!(a.releases.due(110), "the first take is PUBLISH_MS old");
        let calls = w.s.calls.get();
        let mut g = a.releases.flush_seen(&w.s, &w.k, snapshot).unwrap();
        assert_eq!(
            w.s.calls.get() - calls,
            1,
            "one CAS set with the picture's read"
        );
        g.sort();
        assert_eq!(g, vec![(h1.to_string(), 1), (h2.to_string(), 1)]);
        assert_eq!(loads(&b, 111), vec![1, 1], "B sees both");
        // B routes on h1 too (its own take waits), A's second request ends
        // while the long one lives: B still sees it (busier) until A writes.
        let mut on_b = Slot::default();
        on_b.take_later(h1, &b.releases, Joined::default(), 112);
        assert_eq!(loads(&b, 112), vec![2, 1]);
        assert!(second.release_later(&a.releases));
        assert_eq!(loads(&a, 113), vec![1, 0], "A's own picture is exact");
        assert_eq!(loads(&b, 113), vec![2, 1], "B: one publish period late");
        a.releases.flush(&w.s, &w.k).unwrap(); // the tick
        assert_eq!(loads(&b, 120), vec![2, 0]);
        // The long request ends and leaves A idle: written at once.
        assert!(long.release_later(&a.releases));
        assert_eq!(
            a.releases.flush(&w.s, &w.k).unwrap(),
            vec![(h1.to_string(), 0)]
        );
        assert_eq!(loads(&b, 121), vec![1, 0], "B's own waiting take");
        assert!(on_b.release_later(&b.releases));
        assert!(
            b.releases.flush(&w.s, &w.k).unwrap().is_empty(),
            "never written"
        );
        let (t, _) = InFlight::read(&w.s, &w.k.inflight).unwrap();
        assert!(t.entries.is_empty(), "at rest every count is 0: {t:?}");
    }

    /// A move (a retry served elsewhere) left waiting moves the count, and
    /// a failed write keeps every change for the next one.
    #[test]
    fn moves_and_failed_writes_keep_the_counts_right() {
        let w = World::with_two_hosts();
        let local = VmLocal::default();
        let (h1, h2) = ("10.0.0.1:1", "10.0.0.1:2");
        let mut s = Slot::default();
        s.take_later(h1, &local.releases, Joined::default(), 5);
        s.moved_later(h2, &local.releases);
        s.moved_later(h2, &local.releases); // again: nothing
        w.s.fail_next.set(1);
        assert!(local.releases.flush(&w.s, &w.k).is_err());
        assert_eq!(
            local.releases.flush(&w.s, &w.k).unwrap(),
            vec![(h2.to_string(), 1)]
        );
        assert_eq!((w.count(h1), w.count(h2)), (0, 1));
        assert_eq!(s.holding(), Some(h2));
        assert!(s.release_later(&local.releases));
        local.releases.flush(&w.s, &w.k).unwrap();
        assert_eq!((w.count(h1), w.count(h2)), (0, 0));
    }

    /// The picture subtracts waiting releases and take-offs per member
    /// exactly as applying them to a copy of the table would (saturating,
    /// a host outside the view ignored).
    #[test]
    fn subtracting_per_member_equals_applying_to_the_table() {
        let w = World::with_two_hosts();
        let view = w.f.current(&w.s, &w.k);
        let hosts = ["10.0.0.1:1", "10.0.0.1:2", "10.0.0.9:9"];
        let mut seed = 7u64;
        let mut rand = |n: u64| {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            (seed >> 33) % n
        };
        for round in 0..200 {
            let mut t = InFlight::default();
            for h in hosts {
                t.set(addr_hash(h), rand(4) as u32);
                t.add_queued(addr_hash(h), rand(300) as i64);
            }
            let r = Releases::default();
            for _ in 0..rand(6) {
                r.push(hosts[rand(3) as usize]);
            }
            for _ in 0..rand(4) {
                r.push_queued(addr_hash(hosts[rand(3) as usize]), rand(200) as u32);
            }
            let (mut loads, mut queued) = (view.loads(&t), view.queued(&t));
            r.overlay(&view, &mut loads, Some(&mut queued), None);
            let mut applied = t.clone();
            r.apply(&mut applied);
            assert_eq!(
                (loads, queued),
                (view.loads(&applied), view.queued(&applied)),
                "round {round}"
            );
        }
    }
}
