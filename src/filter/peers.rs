//! Peer exchange through Envoy (`peers` set): publish this gateway's index
//! writes, serve them to peers, pull the peers' writes on a tick and merge
//! them. The pure parts are [`crate::peers`] (wire codec, merge, cursor) and
//! [`crate::peers_log`] (the shared-data log); this file adds host calls.
//!
//! - **Publish** ([`publish`]): after an `affinity` record, the news writes
//!   (collected by [`crate::peers_log::Publishing`] under the address-id
//!   wrapper, so entries hold address ids) are appended to the log in shared
//!   data: every worker's writes, one ring per Envoy, `log_capacity` items.
//!   New blocks are published only when the record added at least
//!   `min_publish_chars` beyond the prefix known at routing; placement
//!   changes always ([`crate::peers_log::Publishing::outbox`]).
//! - **Serve** ([`intercept`]): a request to `peers.path` is answered by the
//!   filter itself (`proxy_send_local_response`), never forwarded: no or a
//!   wrong `x-prefix-router-peer` secret (constant-time comparison) → 403;
//!   another method or a query other than `since=<u64>` → 400; else 200 with
//!   the batch after `since` (at most `max_batch` entries). Pull only: nothing
//!   a client sends can write a table. Put `path` on an internal listener or
//!   behind mTLS anyway (the secret is a bearer credential).
//! - **Pull** ([`Puller`]): every `pull_ms`, the VM holding the peers lease
//!   (CAS in shared data, as the admin poll) lists the peers cluster's hosts
//!   from the admin `/clusters` (every `hosts_refresh_ms`) and calls each one
//!   (`dispatch_http_call` through `peers.cluster`, whose `override_host`
//!   policy sends the call to the host named in the target header) with its
//!   cursor. The response is decoded (validated before anything is merged),
//!   merged slot by slot into the local table, and the cursor advances (a
//!   gap counts `writes_lost`, a new peer epoch restarts it). A pull that
//!   fails, times out or returns garbage changes nothing but the counters; a
//!   request never waits for a pull; a failing peer (refused, timed out or
//!   garbage, each counted) is retried after `pull_ms · 2^failures` (at most
//!   1 s, [`crate::peers_backoff`]), each skipped pull counted in
//!   `pull_backoff`. A batch carrying this process's own epoch is our own
//!   listener: that host is skipped from then on.
//! - **Cold start**: a new gateway's cursors start at 0, so its first pull of
//!   each peer returns that peer's whole retained log; and it copies one live
//!   peer's table (`?slots=START`, [`snapshot_span`] slots per tick, filling
//!   only empty or same-tag slots), since a log holds only its own gateway's
//!   writes and a dead gateway's writes live on only in the survivors' tables.
//!   Once per process (`peers/snapshot` in shared data).
//!
//! `dispatch_http_call` goes through the SDK (not a raw import like
//! [`super::host`]): the SDK must register the token, or its dispatcher
//! panics when the response arrives. Envoy returns only Ok, BadArgument
//! (unknown cluster) or InternalFailure from `proxy_http_call`, which the SDK
//! maps to `Result`; the admin poll relies on the same call.
//!
//! - **Queues** (`share_queued`, default on, [`crate::peers_queue`]): every
//!   answer to a pull carries the serving gateway's queued-prefill tokens
//!   per replica in `x-prefix-router-queued`; the puller keeps each peer's
//!   last table (and its own at the start of the round) in `peers/queues`,
//!   and the routing path adds the fresh ones, extrapolated, to its own
//!   counts ([`with_peer_queues`]: one shared-data get per worker at most
//!   every queue period / 4, a VM-local copy between). Between index pulls,
//!   every `queue_ms` (default 25), the lease holder also pulls each known
//!   peer's table alone (`?queued`: an empty 200 whose header is the table;
//!   [`Puller::queue_round`]), since a pull period is too stale a picture
//!   for the p90 at N ≥ 2 (simulator, `docs/multi-gateway.md`, seventh
//!   session).
//!
//! Stats (`prefix_router.peers.*`): counters `pull_ok`, `pull_fail`
//! (= `pull_refused` + `pull_timeout`), `pull_refused`, `pull_timeout`,
//! `bad_batch` (garbage), `pull_backoff` (pulls skipped), `budget_refused`
//! (records whose new blocks the sync budget kept local), `writes_applied`, `writes_lost`, `writes_published`,
//! `served`, `served_bytes`, `pulled_bytes`, `unauthorized`, `bad_request`,
//! `snapshot_bytes` (served), `snapshot_applied`, `queues_received` (pulls
//! that carried a non-empty queue table), `queue_pulls` (queue-only pulls
//! answered); gauge `hosts`.

use super::host::{self, MetricKind, BUFFER_HTTP_CALL_RESPONSE_BODY};
use super::root::Plugin;
use super::stats::define;
use crate::cluster::admin::parse_clusters;
use crate::cluster::queued;
use crate::cluster::tables::{addr_hash, try_lease};
use crate::cluster::view::{holder_id, View};
use crate::hash::hash_id;
use crate::index::{PrefixIndex, SlotStore, SlotValue};
use crate::peers::{
    ct_eq, decode, encode, fill, merge, parse_query, record_bytes, snapshot_span, PeerError, Query,
};
use crate::peers_backoff::{classify, Backoff, Failure};
use crate::peers_budget::{Budget, Offer};
use crate::peers_config::{PeersParams, SECRET_HEADER};
use crate::peers_log::{self, NewsRule, PeerKeys, PeerLadder, Publishing};
use crate::peers_queue::{self, Exchange};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::time::Duration;

/// Largest holder id + 1 (address ids, see [`crate::cluster::view::holder_id`]).
const HOLDER_IDS: usize = 65_535;

#[link(wasm_import_module = "env")]
extern "C" {
    fn proxy_send_local_response(
        status_code: u32,
        details: *const u8,
        details_size: usize,
        body: *const u8,
        body_size: usize,
        headers: *const u8,
        headers_size: usize,
        grpc_status: i32,
    ) -> u32;
}

/// Answer the current request locally; every status is returned.
fn send_local(status: u32, headers: &[(&str, &str)], body: &[u8]) -> Result<(), host::HostError> {
    // proxy-wasm header map: count, (key len, value len)*, (key \0 value \0)*.
    let mut map = Vec::new();
    map.extend_from_slice(&(headers.len() as u32).to_le_bytes());
    for (k, v) in headers {
        map.extend_from_slice(&(k.len() as u32).to_le_bytes());
        map.extend_from_slice(&(v.len() as u32).to_le_bytes());
    }
    for (k, v) in headers {
        map.extend_from_slice(k.as_bytes());
        map.push(0);
        map.extend_from_slice(v.as_bytes());
        map.push(0);
    }
    let details = "prefix_router_peers";
    // SAFETY: pointers and lengths of live buffers.
    let code = unsafe {
        proxy_send_local_response(
            status,
            details.as_ptr(),
            details.len(),
            body.as_ptr(),
            body.len(),
            map.as_ptr(),
            map.len(),
            -1,
        )
    };
    if code == 0 {
        Ok(())
    } else {
        Err(host::HostError(code))
    }
}

/// Per-VM peer state shared by the root and the HTTP contexts.
pub struct Shared {
    keys: PeerKeys,
    /// This process's epoch.
    pub epoch: u32,
    layout: u32,
    slots: u32,
    ids: [Option<u32>; 20],
    /// This VM's sync budget ([`crate::peers_budget`]).
    budget: Cell<Budget>,
    /// Peers (hosts of the peers cluster but this one) and when read, ms.
    peers: Cell<(u64, usize)>,
    /// The queue exchange as this VM last read or wrote it, and when (ms):
    /// routing re-reads it at most every `pull_ms / 4` instead of one
    /// shared-data get and decode per request ([`with_peer_queues`]).
    exchange: RefCell<Option<(u64, Exchange)>>,
}

const S_PULL_OK: usize = 0;
const S_PULL_FAIL: usize = 1;
const S_BAD_BATCH: usize = 2;
const S_APPLIED: usize = 3;
const S_LOST: usize = 4;
const S_PUBLISHED: usize = 5;
const S_SERVED: usize = 6;
const S_SERVED_BYTES: usize = 7;
const S_PULLED_BYTES: usize = 8;
const S_UNAUTHORIZED: usize = 9;
const S_BAD_REQUEST: usize = 10;
const S_HOSTS: usize = 11;
const S_SNAPSHOT_BYTES: usize = 12;
const S_SNAPSHOT_APPLIED: usize = 13;
const S_PULL_TIMEOUT: usize = 14;
const S_PULL_REFUSED: usize = 15;
const S_PULL_BACKOFF: usize = 16;
const S_BUDGET_REFUSED: usize = 17;
const S_QUEUES: usize = 18;
const S_QUEUE_PULLS: usize = 19;
const NAMES: [&str; 20] = [
    "pull_ok",
    "pull_fail",
    "bad_batch",
    "writes_applied",
    "writes_lost",
    "writes_published",
    "served",
    "served_bytes",
    "pulled_bytes",
    "unauthorized",
    "bad_request",
    "hosts",
    "snapshot_bytes",
    "snapshot_applied",
    "pull_timeout",
    "pull_refused",
    "pull_backoff",
    "budget_refused",
    "queues_received",
    "queue_pulls",
];

impl Shared {
    /// Set up at configure: epoch (created once per process), layout, stats.
    ///
    /// # Errors
    /// Shared data failed (the configuration is refused).
    pub fn new(
        prefix: &str,
        params: &PeersParams,
        slots: u32,
        context_id: u32,
    ) -> Result<Shared, String> {
        let keys = PeerKeys::new(prefix);
        let fresh = hash_id(
            &[
                host::now_nanos().to_le_bytes(),
                u64::from(context_id).to_le_bytes(),
                super::secret::fresh(context_id).to_le_bytes(),
            ]
            .concat(),
        ) as u32;
        let epoch = peers_log::epoch(&host::HostShared, &keys, fresh.max(1))
            .map_err(|e| format!("cannot read or store the peers epoch: {e:?}"))?;
        let ids = std::array::from_fn(|i| {
            let kind = if i == S_HOSTS {
                MetricKind::Gauge
            } else {
                MetricKind::Counter
            };
            define(kind, &format!("prefix_router.peers.{}", NAMES[i]))
        });
        Ok(Shared {
            keys,
            epoch,
            layout: params.layout(slots),
            slots,
            ids,
            budget: Cell::new(Budget::new(
                f64::from(params.sync_budget_bp) / 10_000.0,
                params.min_publish_chars as usize,
            )),
            peers: Cell::new((0, 0)),
            exchange: RefCell::new(None),
        })
    }

    /// Peers of this gateway: the peers cluster's hosts (as the puller last
    /// listed them, in shared data) but this one; read at most once a
    /// second per VM.
    fn peer_count(&self) -> usize {
        self.peer_count_at(host::now_nanos() / 1_000_000)
    }

    /// [`Self::peer_count`] at `now` ms (a clock the caller already read).
    fn peer_count_at(&self, now: u64) -> usize {
        let (at, n) = self.peers.get();
        if at != 0 && now.saturating_sub(at) < 1000 {
            return n;
        }
        let n = match host::shared_get(&self.keys.hosts) {
            Ok((Some(v), _)) => <[u8; 4]>::try_from(v.as_slice())
                .map_or(0, |b| u32::from_le_bytes(b) as usize)
                .saturating_sub(1),
            _ => n,
        };
        self.peers.set((now.max(1), n));
        n
    }

    fn add(&self, stat: usize, n: u64) {
        if let Some(Some(id)) = self.ids.get(stat) {
            if n > 0 {
                host::increment_metric(*id, i64::try_from(n).unwrap_or(i64::MAX));
            }
        }
    }

    fn gauge(&self, stat: usize, v: u64) {
        if let Some(Some(id)) = self.ids.get(stat) {
            host::record_metric(*id, v);
        }
    }
}

/// Publish the news of one record of `chars` hashed characters that added
/// `new_chars` beyond the known prefix (`moved`: it put a known prefix on
/// another replica; see [`Publishing::outbox`]), within the sync budget
/// (`peers.sync_budget_bp`, [`crate::peers_budget`]: the record earns
/// credit for its `chars`; a refused record publishes its placement changes
/// only, counted in `budget_refused`).
pub fn publish<S: SlotStore>(
    p: &Plugin,
    writes: &Publishing<'_, S>,
    (chars, new_chars): (usize, usize),
    moved: bool,
) {
    let (Some(params), Some(s)) = (p.config().peers.as_ref(), p.peers.as_ref()) else {
        return;
    };
    let min = params.min_publish_chars as usize;
    let mut out = writes.outbox(new_chars, min, moved);
    if params.sync_budget_bp > 0 {
        let mut budget = s.budget.get();
        budget.earn(chars, s.peer_count());
        let offer = Offer {
            new_chars,
            bytes: record_bytes(&out, s.slots),
            blocks: new_chars >= min,
        };
        if !out.is_empty() && !budget.admit(offer) {
            out = writes.outbox(0, usize::MAX, moved);
            s.add(S_BUDGET_REFUSED, 1);
        }
        s.budget.set(budget);
    }
    if out.is_empty() {
        return;
    }
    match peers_log::append(&host::HostShared, &s.keys, params.log_capacity, &out) {
        Ok(_) => s.add(S_PUBLISHED, out.len() as u64),
        Err(_) => p.stats.failure(super::stats::HostFailure::SharedData),
    }
}

/// Which blocks of a record the peers are sent (`peers.ladder_last`,
/// `peers.publish_bits`; [`crate::peers_log::PeerLadder`]).
pub fn peer_ladder(c: &PeersParams, index: &PrefixIndex) -> PeerLadder {
    PeerLadder {
        ladder_bits: index.config().ladder_bits,
        publish_bits: c.publish_bits,
        ladder_last: c.ladder_last,
    }
}

/// The publication rule of [`crate::peers_log::Publishing`]: the refresh
/// horizon, and the offset of this filter's pending records (their
/// confirmation is news to the peers). Never used without `peers`.
pub fn news_rule(p: &Plugin) -> NewsRule {
    let refresh = p
        .config()
        .peers
        .as_ref()
        .map_or(u32::MAX, |c| c.refresh_publish_s.saturating_mul(10));
    // The router's `max_age_ms`, from which pending records are set back.
    let max_age = u64::from(p.config().affinity.index_ttl_s) * 1000;
    NewsRule::refresh(refresh).with_pending(max_age)
}

/// If the request is for the sync path, answer it here and return true (the
/// caller stops the filter chain). Called first in `on_http_request_headers`
/// with the request's serialised headers ([`crate::header_pairs`], read once
/// for the whole callback).
pub fn intercept(p: &Plugin, headers: &[u8]) -> bool {
    let (Some(params), Some(s)) = (p.config().peers.as_ref(), p.peers.as_ref()) else {
        return false;
    };
    let Some(path) = crate::header_pairs::value(headers, b":path") else {
        return false;
    };
    let (route, query) = match path.iter().position(|&b| b == b'?') {
        Some(i) => (&path[..i], &path[i + 1..]),
        None => (path, &b""[..]),
    };
    if route != params.path.as_bytes() {
        return false;
    }
    let deny = |status: u32, stat: usize, why: &str| {
        s.add(stat, 1);
        if let Err(e) = send_local(status, &[("content-type", "text/plain")], why.as_bytes()) {
            log::warn!("peers: cannot answer {status}: {e}");
        }
    };
    let secret = crate::header_pairs::value(headers, SECRET_HEADER.as_bytes());
    if !secret.is_some_and(|v| ct_eq(v, params.secret.as_bytes())) {
        deny(403, S_UNAUTHORIZED, "forbidden\n");
        return true;
    }
    let get = crate::header_pairs::value(headers, b":method") == Some(b"GET".as_slice());
    let read = match parse_query(query).filter(|_| get) {
        Some(Query::Since(since)) => peers_log::read_since(
            &host::HostShared,
            &s.keys,
            params.log_capacity,
            since,
            params.max_batch as usize,
        )
        .map(|r| (r, S_SERVED_BYTES)),
        Some(Query::Slots(start)) => Ok((snapshot(p, start, s.slots), S_SNAPSHOT_BYTES)),
        Some(Query::Queued) => {
            // The queue exchange between index pulls: the table only.
            answer(p, params.share_queued, b"");
            return true;
        }
        None => {
            deny(
                400,
                S_BAD_REQUEST,
                "expected GET ?since=<sequence>, ?slots=<start> or ?queued\n",
            );
            return true;
        }
    };
    match read {
        Ok(((from, items), stat)) => {
            let body = encode(from, items.iter(), s.layout, s.epoch, s.slots);
            s.add(S_SERVED, 1);
            s.add(stat, body.len() as u64);
            answer(p, params.share_queued && stat == S_SERVED_BYTES, &body);
        }
        Err(_) => {
            p.stats.failure(super::stats::HostFailure::SharedData);
            let _ = send_local(503, &[], b"");
        }
    }
    true
}

/// Answer a sync request 200 with `body`, and with `queues` this gateway's
/// queue table in [`peers_queue::HEADER`] (left out when empty).
fn answer(p: &Plugin, queues: bool, body: &[u8]) {
    let table = if queues {
        peers_queue::encode(own_queues(p))
    } else {
        String::new()
    };
    let mut headers = vec![("content-type", "application/octet-stream")];
    if !table.is_empty() {
        headers.push((peers_queue::HEADER, table.as_str()));
    }
    if let Err(e) = send_local(200, &headers, body) {
        log::warn!("peers: cannot answer a sync request: {e}");
    }
}

/// This gateway's queued-prefill tokens by holder id (the
/// `cluster::queued` table over the current view; empty if it cannot be read).
fn own_queues(p: &Plugin) -> Vec<(u16, u32)> {
    let view = p.follower.current(&host::HostShared, &p.keys);
    let Some(q) = queued::read(&host::HostShared, &p.keys, &view) else {
        return Vec::new();
    };
    q.iter()
        .enumerate()
        .filter_map(|(i, &t)| view.addr(i).map(|a| (holder_id(a), t)))
        .collect()
}

fn read_exchange(s: &Shared) -> Exchange {
    match host::shared_get(&s.keys.queues) {
        Ok((Some(b), _)) => Exchange::from_bytes(&b).unwrap_or_default(),
        _ => Exchange::default(),
    }
}

fn write_exchange(p: &Plugin, s: &Shared, ex: &Exchange) {
    if host::shared_set(&s.keys.queues, &ex.to_bytes(), 0).is_err() {
        p.stats.failure(super::stats::HostFailure::SharedData);
    }
    if let Ok(mut c) = s.exchange.try_borrow_mut() {
        *c = Some((host::now_nanos() / 1_000_000, ex.clone()));
    }
}

/// This gateway's queued tokens (`own`, in `view` order) plus the peers'
/// fresh ones at routing, extrapolated ([`Exchange::estimate`]; a table
/// older than 3 pull periods is ignored). `None` (use `own`) without
/// `share_queued` or without a fresh peer.
/// Requests of a replica one in-flight count of the picture stands for
/// ([`crate::select::Loads::per_count`], the floor of the
/// spill price): with `peers` and no `engine` block each gateway counts
/// only its own requests, so this one and its peers (as last listed);
/// else 1 (one gateway, or loads raised by the engines' own counts).
/// `now_ms`: the request's clock. Cost: at most one shared-data get per
/// second per VM, no clock read.
pub fn load_scale(p: &Plugin, now_ms: u64) -> f64 {
    match (&p.config().engine, p.peers.as_ref()) {
        (None, Some(s)) => (s.peer_count_at(now_ms) + 1) as f64,
        _ => 1.0,
    }
}

pub fn with_peer_queues(p: &Plugin, view: &View, own: &[u32], now_ms: u64) -> Option<Vec<u32>> {
    let (Some(params), Some(s)) = (p.config().peers.as_ref(), p.peers.as_ref()) else {
        return None;
    };
    let period = u64::from(params.queue_period_ms()?);
    // Fresh: ≤ 3 index pull periods (a peer of an older version, which
    // answers `?queued` 400, still sends its table with every index pull).
    let max_age = 3 * u64::from(params.pull_ms);
    let reread_ms = period / 4;
    let mut q = own.to_vec();
    let position = |id| view.position_of_id(id);
    let fresh = match s.exchange.try_borrow_mut() {
        Ok(mut c) => {
            if c.as_ref()
                .map_or(true, |(at, _)| now_ms.saturating_sub(*at) >= reread_ms)
            {
                *c = Some((now_ms, read_exchange(s)));
            }
            c.as_ref()
                .map_or(0, |(_, ex)| ex.estimate(&mut q, position, now_ms, max_age))
        }
        // Never borrowed twice (one thread, no re-entry); if it were, read.
        Err(_) => read_exchange(s).estimate(&mut q, position, now_ms, max_age),
    };
    (fresh > 0).then_some(q)
}

/// The non-empty slots of `[start, start + snapshot_span(slots))` (one get each),
/// as `(start, items)`.
fn snapshot(p: &Plugin, start: u32, slots: u32) -> (u64, Vec<(u32, SlotValue)>) {
    let table = p.index_slots();
    let end = start.saturating_add(snapshot_span(slots)).min(slots);
    let items = (start..end)
        .filter_map(|slot| table.get(slot).map(|v| (slot, v)))
        .collect();
    (u64::from(start), items)
}

/// `GET path` to peer `addr` through the peers cluster (`override_host`
/// reads the target header); the token, or `None` if Envoy refused.
fn dispatch(
    params: &PeersParams,
    target: &str,
    addr: &str,
    path: &str,
    timeout: u64,
) -> Option<u32> {
    let headers = vec![
        (":method", "GET"),
        (":path", path),
        (":authority", addr),
        (target, addr),
        (SECRET_HEADER, params.secret.as_str()),
    ];
    proxy_wasm::hostcalls::dispatch_http_call(
        &params.cluster,
        headers,
        None,
        vec![],
        Duration::from_millis(timeout),
    )
    .ok()
}

/// The next snapshot chunk to fetch (`None`: done, or shared data failed).
fn snapshot_next(s: &Shared) -> Option<u32> {
    match host::shared_get(&s.keys.snapshot) {
        Ok((None, _)) => Some(0),
        Ok((Some(v), _)) => <[u8; 4]>::try_from(v.as_slice())
            .ok()
            .map(u32::from_le_bytes)
            .filter(|&n| n < s.slots),
        Err(_) => None,
    }
}

/// A snapshot chunk arrived: fill the gaps of the local table with it and
/// move on to the next chunk (a refused chunk is fetched again).
fn snapshot_apply(p: &Plugin, s: &Shared, start: u32, body: &[u8]) {
    let span = snapshot_span(s.slots);
    let Ok(batch) = decode(body, s.layout, span as usize, s.slots, HOLDER_IDS) else {
        s.add(S_BAD_BATCH, 1);
        return;
    };
    if batch.epoch == s.epoch || batch.from_seq != u64::from(start) {
        s.add(S_BAD_BATCH, 1);
        return;
    }
    let mut table = p.index_slots();
    let sets = crate::router::index_config(p.config()).sets();
    let applied = batch
        .entries
        .iter()
        .filter(|(slot, v)| fill(&mut table, sets, *slot, v))
        .count();
    s.add(S_SNAPSHOT_APPLIED, applied as u64);
    let next = start.saturating_add(span);
    let next = if next >= s.slots { u32::MAX } else { next };
    if host::shared_set(&s.keys.snapshot, &next.to_le_bytes(), 0).is_err()
        || table.failures.get() > 0
    {
        p.stats.failure(super::stats::HostFailure::SharedData);
    }
}

/// What an outstanding call of the puller is.
enum Call {
    Hosts,
    Pull(String),
    /// A snapshot chunk starting at this slot.
    Snapshot(u32),
    /// A queue-only pull of this peer (`?queued`).
    Queue(String),
}

/// Pull state of one VM (the lease holder pulls).
#[derive(Default)]
pub struct Puller {
    owner: u64,
    hosts: RefCell<Vec<String>>,
    hosts_at: Cell<u64>,
    last_tick: Cell<u64>,
    /// Start of the last queue round (index pulls carry the tables too).
    last_queue: Cell<u64>,
    calls: RefCell<HashMap<u32, (Call, u64)>>,
    /// Failing peers (down, slow or answering garbage).
    backoff: RefCell<Backoff>,
}

impl Puller {
    /// A puller with lease owner id `owner`.
    pub fn new(owner: u64) -> Puller {
        Puller {
            owner,
            ..Puller::default()
        }
    }

    /// On tick: if a pull round is due and this VM holds the lease, refresh
    /// the peer list when due and pull every peer without an outstanding call.
    pub fn tick(&self, p: &Plugin) {
        let (Some(params), Some(s)) = (p.config().peers.as_ref(), p.peers.as_ref()) else {
            return;
        };
        let now = host::now_nanos() / 1_000_000;
        let period = u64::from(params.pull_ms);
        if now.saturating_sub(self.last_tick.get()) < period {
            self.queue_round(p, params, s, now);
            return;
        }
        self.last_tick.set(now);
        self.last_queue.set(now);
        let mut lease_keys = p.keys.clone();
        lease_keys.lease.clone_from(&s.keys.lease);
        if !matches!(
            try_lease(&host::HostShared, &lease_keys, self.owner, now, 3 * period),
            Ok(true)
        ) {
            return;
        }
        if params.share_queued {
            // The own table at the start of the round (the extrapolation's base).
            let mut ex = read_exchange(s);
            ex.own_at_round = own_queues(p);
            write_exchange(p, s, &ex);
        }
        let Ok(mut calls) = self.calls.try_borrow_mut() else {
            return;
        };
        let timeout = u64::from(params.timeout_ms);
        // Forget calls Envoy never answered (it always does, after the time-out).
        calls.retain(|_, (_, sent)| now.saturating_sub(*sent) < 2 * timeout + period);
        let hosts_due =
            now.saturating_sub(self.hosts_at.get()) >= u64::from(params.hosts_refresh_ms);
        if hosts_due && !calls.values().any(|(c, _)| matches!(c, Call::Hosts)) {
            let headers = vec![
                (":method", "GET"),
                (":path", "/clusters?format=json"),
                (":authority", "envoy-admin"),
            ];
            match proxy_wasm::hostcalls::dispatch_http_call(
                &params.admin_cluster,
                headers,
                None,
                vec![],
                Duration::from_millis(timeout.max(100)),
            ) {
                Ok(token) => {
                    calls.insert(token, (Call::Hosts, now));
                    self.hosts_at.set(now);
                }
                Err(e) => log::warn!("peers: cannot call {:?}: {e:?}", params.admin_cluster),
            }
        }
        let target = p.config().target_header.as_str();
        let Ok(hosts) = self.hosts.try_borrow() else {
            return;
        };
        let Ok(backoff) = self.backoff.try_borrow().map(|b| b.clone()) else {
            return;
        };
        let mut live_peer = None;
        for addr in hosts.iter() {
            let cursor = peers_log::cursor(&host::HostShared, &s.keys, addr);
            if cursor.epoch == Some(s.epoch) {
                continue; // our own listener
            }
            if cursor.epoch.is_some() && !backoff.failing(addr) {
                live_peer.get_or_insert(addr);
            }
            let busy = calls
                .values()
                .any(|(c, _)| matches!(c, Call::Pull(a) if a == addr));
            if busy {
                continue;
            }
            if !backoff.ready(addr, now) {
                s.add(S_PULL_BACKOFF, 1);
                continue;
            }
            let path = format!("{}?since={}", params.path, cursor.seq);
            match dispatch(params, target, addr, &path, timeout) {
                Some(token) => {
                    calls.insert(token, (Call::Pull(addr.clone()), now));
                }
                None => self.failed(s, addr, period, Failure::Refused),
            }
        }
        // Cold start: copy a live peer's table, one chunk per tick.
        let next = snapshot_next(s);
        let busy = calls.values().any(|(c, _)| matches!(c, Call::Snapshot(_)));
        if let (Some(start), Some(addr), false) = (next, live_peer, busy) {
            let path = format!("{}?slots={start}", params.path);
            if let Some(token) = dispatch(params, target, addr, &path, timeout) {
                calls.insert(token, (Call::Snapshot(start), now));
            }
        }
    }

    /// Between index pulls, every `queue_ms` (`peers.queue_ms`, shorter
    /// than `pull_ms`): if this VM holds the lease, take the own table as
    /// the extrapolation's base and pull every known peer's queue table
    /// (`?queued`; peers whose epoch is known and not ours, not backing
    /// off, without an outstanding queue pull). A failed queue pull costs
    /// nothing but its staleness (the index pull counts and backs off).
    fn queue_round(&self, p: &Plugin, params: &PeersParams, s: &Shared, now: u64) {
        let Some(q) = params.queue_period_ms().filter(|&q| q < params.pull_ms) else {
            return;
        };
        if now.saturating_sub(self.last_queue.get()) < u64::from(q) {
            return;
        }
        self.last_queue.set(now);
        let mut lease_keys = p.keys.clone();
        lease_keys.lease.clone_from(&s.keys.lease);
        let lease_ms = 3 * u64::from(params.pull_ms);
        if !matches!(
            try_lease(&host::HostShared, &lease_keys, self.owner, now, lease_ms),
            Ok(true)
        ) {
            return;
        }
        let mut ex = read_exchange(s);
        ex.own_at_round = own_queues(p);
        write_exchange(p, s, &ex);
        let (Ok(mut calls), Ok(hosts), Ok(backoff)) = (
            self.calls.try_borrow_mut(),
            self.hosts.try_borrow(),
            self.backoff.try_borrow(),
        ) else {
            return;
        };
        let target = p.config().target_header.as_str();
        let timeout = u64::from(params.timeout_ms.min(params.pull_ms));
        let path = format!("{}?queued", params.path);
        for addr in hosts.iter() {
            let cursor = peers_log::cursor(&host::HostShared, &s.keys, addr);
            let peer = cursor.epoch.is_some_and(|e| e != s.epoch);
            let busy = calls
                .values()
                .any(|(c, _)| matches!(c, Call::Queue(a) if a == addr));
            if !peer || busy || backoff.failing(addr) {
                continue;
            }
            if let Some(token) = dispatch(params, target, addr, &path, timeout) {
                calls.insert(token, (Call::Queue(addr.clone()), now));
            }
        }
    }

    /// Keep `addr`'s queue table from the last call's response header
    /// ([`peers_queue::decode`]; a missing header is an empty table,
    /// garbage is ignored).
    fn store_queues(&self, p: &Plugin, s: &Shared, addr: &str) {
        let table = match host::http_call_response_header(peers_queue::HEADER) {
            Ok(Some(v)) => peers_queue::decode(&v),
            _ => Some(Vec::new()),
        };
        if let Some(t) = table {
            if !t.is_empty() {
                s.add(S_QUEUES, 1);
            }
            let mut ex = read_exchange(s);
            ex.set_peer(addr_hash(addr), host::now_nanos() / 1_000_000, t);
            write_exchange(p, s, &ex);
        }
    }

    /// A `dispatch_http_call` response; true if it was this puller's.
    pub fn response(&self, p: &Plugin, token: u32, body_size: usize) -> bool {
        let Some((call, sent)) = self
            .calls
            .try_borrow_mut()
            .ok()
            .and_then(|mut c| c.remove(&token))
        else {
            return false;
        };
        let (Some(params), Some(s)) = (p.config().peers.as_ref(), p.peers.as_ref()) else {
            return true;
        };
        let status = host::http_call_response_header(":status").ok().flatten();
        let body = match (
            status.as_deref(),
            host::buffer(BUFFER_HTTP_CALL_RESPONSE_BODY, 0, body_size),
        ) {
            (Some(b"200"), Ok(b)) => b.unwrap_or_default(),
            (st, _) => {
                if let Call::Pull(addr) = &call {
                    let elapsed = (host::now_nanos() / 1_000_000).saturating_sub(sent);
                    let why = classify(st, elapsed, u64::from(params.timeout_ms))
                        .unwrap_or(Failure::Refused);
                    self.failed(s, addr, u64::from(params.pull_ms), why);
                }
                return true;
            }
        };
        match call {
            Call::Hosts => match parse_clusters(&body, &params.cluster) {
                Ok(hosts) => {
                    let list: Vec<String> = hosts.into_iter().map(|h| h.addr).collect();
                    s.gauge(S_HOSTS, list.len() as u64);
                    let n = u32::try_from(list.len()).unwrap_or(u32::MAX);
                    if host::shared_set(&s.keys.hosts, &n.to_le_bytes(), 0).is_err() {
                        p.stats.failure(super::stats::HostFailure::SharedData);
                    }
                    if let Ok(mut h) = self.hosts.try_borrow_mut() {
                        *h = list;
                    }
                }
                Err(e) => log::warn!("peers: admin /clusters: {e}"),
            },
            Call::Pull(addr) => self.apply(p, params, s, &addr, &body),
            Call::Snapshot(start) => snapshot_apply(p, s, start, &body),
            Call::Queue(addr) => {
                s.add(S_QUEUE_PULLS, 1);
                if params.share_queued {
                    self.store_queues(p, s, &addr);
                }
            }
        }
        true
    }

    /// A pull of `addr` failed (`why`): count it (`pull_fail` and
    /// `pull_refused` / `pull_timeout`, or `bad_batch` for garbage) and back
    /// off ([`Backoff::fail`]: `period · 2^failures`, at most
    /// [`crate::peers_backoff::MAX_BACKOFF_MS`]), so a dead, hung or
    /// garbage-answering peer costs one pull a second, not one every tick,
    /// and a peer that comes back is pulled again within a second.
    fn failed(&self, s: &Shared, addr: &str, period: u64, why: Failure) {
        match why {
            Failure::Refused => s.add(S_PULL_REFUSED, 1),
            Failure::Timeout => s.add(S_PULL_TIMEOUT, 1),
            Failure::Garbage => s.add(S_BAD_BATCH, 1),
        }
        if why != Failure::Garbage {
            s.add(S_PULL_FAIL, 1);
        }
        let now = host::now_nanos() / 1_000_000;
        if let Ok(mut b) = self.backoff.try_borrow_mut() {
            b.fail(addr, now, period);
        }
    }

    /// Decode, merge and advance the cursor of `addr`.
    fn apply(&self, p: &Plugin, params: &PeersParams, s: &Shared, addr: &str, body: &[u8]) {
        s.add(S_PULLED_BYTES, body.len() as u64);
        let batch = match decode(
            body,
            s.layout,
            params.max_batch as usize,
            s.slots,
            HOLDER_IDS,
        ) {
            Ok(b) => b,
            Err(e) => {
                if e == PeerError::Layout {
                    log::warn!("peers: {addr} has another layout (secret or index_slots differ)");
                }
                self.failed(s, addr, u64::from(params.pull_ms), Failure::Garbage);
                return;
            }
        };
        if let Ok(mut b) = self.backoff.try_borrow_mut() {
            b.ok(addr);
        }
        let mut cursor = peers_log::cursor(&host::HostShared, &s.keys, addr);
        if batch.epoch == s.epoch {
            // Our own listener: remember it and skip it from now on.
            cursor.epoch = Some(s.epoch);
            let _ = peers_log::store_cursor(&host::HostShared, &s.keys, addr, &cursor);
            return;
        }
        s.add(S_PULL_OK, 1);
        if params.share_queued {
            self.store_queues(p, s, addr);
        }
        let lost = cursor.advance(&batch);
        s.add(S_LOST, lost);
        let mut slots = p.index_slots();
        let sets = crate::router::index_config(p.config()).sets();
        let mut applied = 0;
        for (slot, value) in &batch.entries {
            if merge(&mut slots, sets, *slot, value).is_some() {
                applied += 1;
            }
        }
        s.add(S_APPLIED, applied);
        if slots.failures.get() > 0
            || peers_log::store_cursor(&host::HostShared, &s.keys, addr, &cursor).is_err()
        {
            p.stats.failure(super::stats::HostFailure::SharedData);
        }
    }
}
