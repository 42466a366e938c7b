//! The peer-exchange state of one Envoy in shared data (pure: works on any
//! [`SharedData`], the filter passes the host's): this gateway's log of its
//! own index writes, its epoch, and the pull cursors of its peers.
//!
//! Keys (under the plugin namespace `prefix_router/<plugin>/`, see [`PeerKeys`]):
//! - `peers/epoch`: u32, random per process, created once (CAS);
//! - `peers/head`: u64, the next write sequence (CAS increment, one per
//!   published record: a record reserves its `n` sequences at once);
//! - `peers/log/<seq mod capacity>`: `seq u64 ‖ slot u32 ‖ entry 24 B`
//!   (36 B). A ring: shared data has no delete, so memory is bounded by
//!   `capacity` keys. A reader drops an item whose stored `seq` is not the
//!   one it expects, so a wrapped ring never serves a stale item;
//! - `peers/cursor/<peer IP:port>`: `epoch u32 ‖ seq u64`, where the puller
//!   is in that peer's log (kept in shared data so that a lease moving to
//!   another VM does not restart every cursor at 0);
//! - `peers/snapshot`: u32, the next slot of the cold-start snapshot
//!   (`u32::MAX` once done): a new gateway also copies the peers' tables, in
//!   [`crate::peers::snapshot_span`]-slot chunks, since their logs hold only
//!   their own recent writes (what a dead gateway published lives on only in
//!   the survivors' tables).
//!
//! Concurrency: writers on several workers reserve disjoint sequence ranges
//! by CAS, then write their items; a reader that meets a reserved but not
//! yet written item stops its batch there (the next pull gets it). A hole
//! left by a failed write is skipped once it is older than [`HOLE_AGE`]
//! writes, and the puller counts it as lost.
//!
//! Publication filter ([`Publishing`], [`news`]): a slot write is **news**
//! when the slot was empty or held another tag (a new block), or its set of
//! holders changed, or its time is older than the refresh horizon (so peers'
//! copies do not expire while this gateway keeps a prefix warm). Warm repeats
//! (same tag, same holders, a recent time) and reorders (the same set of
//! holders with another one in front: a hot prefix served by its second
//! holder) are not logged: they would tell peers nothing they use. New blocks are published only for records that add a long
//! enough new extent (see [`Publishing`]), and only the blocks a peer's
//! lookup can use ([`PeerLadder`]: not a non-ladder last block with
//! `peers.ladder_last`, only the coarse ladder with `peers.publish_bits`).
//!
//! Costs: publishing a record = 1 CAS increment + 1 set per news write (+ 1
//! get per write, for the news test); serving a batch = 1 get of `head` + 1
//! get per item; all O(items).

use crate::cluster::shared::{update, ShareError, SharedData};
use crate::index::{
    on_ladder, Entry, IndexConfig, PrefixIndex, Sets, SlotStore, SlotValue, ENTRY_BYTES,
};
use crate::peers::Cursor;

/// Bytes of one log item in shared data.
pub const LOG_ITEM_BYTES: usize = 8 + 4 + ENTRY_BYTES;
/// A missing item older than this many writes is a hole (skipped, lost).
pub const HOLE_AGE: u64 = 1024;

/// Shared-data key names of the peer exchange.
#[derive(Debug, Clone)]
pub struct PeerKeys {
    /// Process epoch.
    pub epoch: String,
    /// Next sequence.
    pub head: String,
    /// Prefix of log items (`<log><hex index>`).
    pub log: String,
    /// Prefix of cursors (`<cursor><IP:port>`).
    pub cursor: String,
    /// Pull lease.
    pub lease: String,
    /// Snapshot progress of a cold start (next slot, `u32::MAX` when done).
    pub snapshot: String,
    /// Hosts of the peers cluster (u32, this gateway included), written by
    /// the puller, read by every worker's sync budget.
    pub hosts: String,
    /// The peers' queued tokens ([`crate::peers_queue::Exchange`]), written
    /// by the puller, read at routing.
    pub queues: String,
}

impl PeerKeys {
    /// Keys under the plugin namespace `prefix` (ending in `/`).
    pub fn new(prefix: &str) -> PeerKeys {
        PeerKeys {
            epoch: format!("{prefix}peers/epoch"),
            head: format!("{prefix}peers/head"),
            log: format!("{prefix}peers/log/"),
            cursor: format!("{prefix}peers/cursor/"),
            lease: format!("{prefix}peers/lease"),
            snapshot: format!("{prefix}peers/snapshot"),
            hosts: format!("{prefix}peers/hosts"),
            queues: format!("{prefix}peers/queues"),
        }
    }

    fn item(&self, seq: u64, capacity: u32) -> String {
        format!("{}{:x}", self.log, seq % u64::from(capacity.max(1)))
    }
}

fn u64_of(v: Option<&[u8]>) -> u64 {
    v.and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map_or(0, u64::from_le_bytes)
}

/// The process epoch: the stored one, or `fresh` stored now (a lost race
/// reads the winner's).
///
/// # Errors
/// Shared data failed.
pub fn epoch<S: SharedData + ?Sized>(s: &S, k: &PeerKeys, fresh: u32) -> Result<u32, ShareError> {
    let read = |v: Option<Vec<u8>>| {
        v.and_then(|b| <[u8; 4]>::try_from(b.as_slice()).ok())
            .map(u32::from_le_bytes)
    };
    let (v, cas) = s.get(&k.epoch)?;
    if let Some(e) = read(v) {
        return Ok(e);
    }
    let _ = s.set(&k.epoch, &fresh.to_le_bytes(), cas);
    Ok(read(s.get(&k.epoch)?.0).unwrap_or(fresh))
}

/// Append `writes` to the log (`capacity` items kept). Returns the sequence
/// of the first one.
///
/// # Errors
/// Shared data failed (the writes are not published; some may be, partly).
pub fn append<S: SharedData + ?Sized>(
    s: &S,
    k: &PeerKeys,
    capacity: u32,
    writes: &[(u32, SlotValue)],
) -> Result<u64, ShareError> {
    if writes.is_empty() {
        return Ok(0);
    }
    let mut first = 0;
    update(s, &k.head, |v| {
        first = u64_of(v);
        Some(
            first
                .wrapping_add(writes.len() as u64)
                .to_le_bytes()
                .to_vec(),
        )
    })?;
    let mut item = [0u8; LOG_ITEM_BYTES];
    for (i, (slot, value)) in writes.iter().enumerate() {
        let seq = first + i as u64;
        item[..8].copy_from_slice(&seq.to_le_bytes());
        item[8..12].copy_from_slice(&slot.to_le_bytes());
        item[12..].copy_from_slice(value);
        s.set(&k.item(seq, capacity), &item, 0)?;
    }
    Ok(first)
}

/// The writes a peer whose cursor is at `since` pulls: at most `max` items
/// from `max(since, oldest kept)`, as `(from_seq, items)` (contiguous).
///
/// # Errors
/// Shared data failed.
pub fn read_since<S: SharedData + ?Sized>(
    s: &S,
    k: &PeerKeys,
    capacity: u32,
    since: u64,
    max: usize,
) -> Result<(u64, Vec<(u32, SlotValue)>), ShareError> {
    let head = u64_of(s.get(&k.head)?.0.as_deref());
    let oldest = head.saturating_sub(u64::from(capacity));
    let mut from = since.clamp(oldest, head);
    let mut items = Vec::new();
    let mut seq = from;
    while seq < head && items.len() < max {
        let (v, _) = s.get(&k.item(seq, capacity))?;
        let parsed = v.as_deref().and_then(|b| {
            let b = <&[u8; LOG_ITEM_BYTES]>::try_from(b).ok()?;
            let stored = u64::from_le_bytes(b[..8].try_into().ok()?);
            let slot = u32::from_le_bytes(b[8..12].try_into().ok()?);
            let value = SlotValue::try_from(&b[12..]).ok()?;
            Some((stored, slot, value))
        });
        match parsed {
            Some((stored, slot, value)) if stored == seq => items.push((slot, value)),
            // Not written yet (reserved by a writer) or overwritten: stop;
            // an old hole at the start of the batch is skipped instead.
            _ if items.is_empty() && head - seq > HOLE_AGE => from = seq + 1,
            _ => break,
        }
        seq += 1;
    }
    Ok((from, items))
}

/// The cursor of peer `addr` (default: nothing pulled yet).
pub fn cursor<S: SharedData + ?Sized>(s: &S, k: &PeerKeys, addr: &str) -> Cursor {
    let key = format!("{}{addr}", k.cursor);
    match s.get(&key) {
        Ok((Some(b), _)) if b.len() == 12 => Cursor {
            epoch: b[..4].try_into().ok().map(u32::from_le_bytes),
            seq: u64_of(b.get(4..)),
        },
        _ => Cursor::default(),
    }
}

/// Store the cursor of peer `addr`.
///
/// # Errors
/// Shared data failed.
pub fn store_cursor<S: SharedData + ?Sized>(
    s: &S,
    k: &PeerKeys,
    addr: &str,
    c: &Cursor,
) -> Result<(), ShareError> {
    let mut v = Vec::with_capacity(12);
    v.extend_from_slice(&c.epoch.unwrap_or(0).to_le_bytes());
    v.extend_from_slice(&c.seq.to_le_bytes());
    s.set(&format!("{}{addr}", k.cursor), &v, 0)
}

/// What a slot write tells the peers (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum News {
    /// A warm repeat: same tag, same holders, a recent time.
    None,
    /// Same tag, the same set of holders in another order, a recent time: a
    /// warm request served by a holder that was not the front one. Peers
    /// that know the prefix already have this set (the order only says which
    /// holder this gateway used last), so it is not published.
    Reorder,
    /// Same tag, another set of holders (a spill, or a holder learned from
    /// a peer that this gateway now serves first), or a time older than the
    /// refresh horizon: always published.
    Placement,
    /// A new block (the slot was empty or held another tag): published
    /// when the record's new extent is long enough (see [`Publishing`]).
    Block,
    /// The confirmation of this gateway's own **pending** entry (same tag,
    /// same holders, a time set back by the pending offset, see
    /// [`crate::index::PrefixIndex::record_pending`]): pending entries are
    /// never published, so to the peers this is as new as a [`News::Block`]
    /// and follows its rule, unless the record moved a known prefix to
    /// another replica (then it is a placement).
    Confirmed,
}

/// When a slot write is news (see [`news`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NewsRule {
    /// Refresh horizon, deciseconds: a warm repeat over an entry older than
    /// this is published so that peers' copies do not expire.
    pub refresh_ds: u32,
    /// Offset of pending entries, deciseconds (`max_age − PENDING_MS`; 0:
    /// no pending records). A same-tag, same-holders write over an entry
    /// whose age is in `[offset, offset + PENDING_MS]` confirms a pending
    /// entry.
    pub pending_ds: u32,
}

impl NewsRule {
    /// Only the refresh horizon (no pending records).
    pub fn refresh(refresh_ds: u32) -> NewsRule {
        NewsRule {
            refresh_ds,
            pending_ds: 0,
        }
    }

    /// Pending entries written with `max_age_ms` (their offset is
    /// `max_age_ms − PENDING_MS`).
    pub fn with_pending(self, max_age_ms: u64) -> NewsRule {
        let back = crate::index::pending_offset_ms(max_age_ms) / 100;
        NewsRule {
            pending_ds: u32::try_from(back).unwrap_or(u32::MAX),
            ..self
        }
    }

    fn confirms(&self, age_ds: u32) -> bool {
        let window = (crate::index::PENDING_MS / 100) as u32 + 1;
        self.pending_ds > 0 && age_ds >= self.pending_ds && age_ds - self.pending_ds <= window
    }
}

/// Classify writing `new` over `old`. A value that is not an index entry
/// (the per-gateway counters of [`crate::pressure`], zero tag, outside the
/// table) is never news: peers would refuse a batch carrying it. A new
/// length stamp alone ([`crate::index::Entry::stamp`]) is not either: it
/// rides along with the next write that is.
pub fn news(old: Option<&SlotValue>, new: &SlotValue, rule: NewsRule) -> News {
    let Some(n) = Entry::decode(new) else {
        return News::None;
    };
    let Some(o) = old.and_then(Entry::decode) else {
        return News::Block;
    };
    let age = n.time.wrapping_sub(o.time);
    if o.marked_key() != n.marked_key() {
        News::Block
    } else if o.holders != n.holders {
        let same_set = n.holders.iter().flatten().count() == o.holders.iter().flatten().count()
            && n.holders
                .iter()
                .all(|h| h.is_none() || o.holders.contains(h));
        if same_set && age < rule.refresh_ds {
            News::Reorder
        } else {
            News::Placement
        }
    } else if rule.confirms(age) {
        News::Confirmed
    } else if age >= rule.refresh_ds {
        News::Placement
    } else {
        News::None
    }
}

/// Which blocks of a request the peers are sent (`peers.publish_last`,
/// `peers.publish_bits`; `docs/multi-gateway.md`, ninth session). The local
/// table is written as before; only the outbox ([`Publishing::withhold`])
/// leaves out:
/// - with `ladder_last`, the request's **last block when it is not a
///   ladder position**: a peer's lookup probes ladder positions and the
///   last block of its own request, so it finds such a block only for an
///   exact repeat of the whole prompt (a longer prompt, the next chat
///   turn, probes ladder positions only), and the deepest ladder position
///   below it is within a factor `1 + 2^(1 − ladder_bits)` of its depth;
/// - with `publish_bits` below `ladder_bits`, the **ladder positions**
///   `p` whose `p + 1` has more than `publish_bits` significant bits
///   (2 of 3 bits: two positions per octave instead of four), except the
///   last block (it carries the last-block mark of a continuation). The
///   receiving lookup searches the coarse positions
///   ([`crate::index::IndexConfig::peer_bits`]), so what a peer finds is
///   at least the deepest coarse position at or below the true depth: a
///   factor `1 + 2^(1 − publish_bits)` (1.5 for 2 bits).
///
/// Blocks that are neither (the search paths of confirmed depths and end
/// marks) are published as before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerLadder {
    /// The local index's `ladder_bits`.
    pub ladder_bits: u32,
    /// Significant bits of the published ladder positions (0 or
    /// ≥ `ladder_bits`: all of them).
    pub publish_bits: u32,
    /// The last block only when it is a ladder position.
    pub ladder_last: bool,
}

impl PeerLadder {
    /// Everything is published (neither lever on).
    pub fn publishes_all(&self) -> bool {
        !self.ladder_last && (self.publish_bits == 0 || self.publish_bits >= self.ladder_bits)
    }

    /// Is block `p` of an `n`-block request published?
    pub fn publishes(&self, p: usize, n: usize) -> bool {
        let ladder = on_ladder(p, self.ladder_bits);
        if p + 1 == n {
            !self.ladder_last || ladder
        } else {
            !ladder
                || self.publish_bits == 0
                || self.publish_bits >= self.ladder_bits
                || on_ladder(p, self.publish_bits)
        }
    }
}

/// A block [`Publishing::withhold`] keeps local.
#[derive(Debug, Clone, Copy)]
struct Withheld {
    /// Its slot and tag.
    at: (u32, u64),
    /// For the deepest known block: slot and tag of the deepest published
    /// ladder block below it.
    stand_in: Option<(u32, u64)>,
}

/// A [`SlotStore`] that collects the news among the writes going through it
/// (wrap the raw table, under [`crate::cluster::view::AddrSlots`], so that
/// logged entries hold address ids, the same in every gateway).
///
/// [`Publishing::outbox`] keeps every [`News::Placement`] write and the
/// [`News::Block`] / [`News::Confirmed`] writes only if the record added at
/// least `min_new_chars` characters beyond the prefix known at routing (or,
/// for confirmations, moved the known prefix to another replica): a short
/// new tail (a new question after a shared system prompt, a unique short
/// prompt, placed cold or not) is cheap to prefill again and would dominate
/// the sync traffic, while the shared part it follows was published when it
/// was new.
pub struct Publishing<'a, S: SlotStore> {
    inner: &'a mut S,
    rule: NewsRule,
    enabled: bool,
    /// Slot and tag of the blocks kept local ([`Publishing::withhold`]),
    /// each with the slot and tag of its stand-in: the deepest published
    /// ladder block below it.
    withheld: Vec<Withheld>,
    /// The table's sets (a withheld block is written to any slot of its
    /// own slot's set, [`crate::index::Sets`]).
    sets: Sets,
    /// News writes, in order, with their kind.
    pub writes: Vec<(u32, SlotValue, News)>,
}

impl<'a, S: SlotStore> Publishing<'a, S> {
    /// Wrap `inner` with the refresh horizon `refresh_ds` (no pending
    /// confirmations, see [`Publishing::with_rule`]). Not `enabled`: a plain
    /// pass-through (no extra get, nothing collected).
    pub fn new(inner: &'a mut S, refresh_ds: u32, enabled: bool) -> Publishing<'a, S> {
        Publishing::with_rule(inner, NewsRule::refresh(refresh_ds), enabled)
    }

    /// Wrap `inner` with `rule` (see [`news`]).
    pub fn with_rule(inner: &'a mut S, rule: NewsRule, enabled: bool) -> Publishing<'a, S> {
        Publishing {
            inner,
            rule,
            enabled,
            withheld: Vec::new(),
            sets: IndexConfig::default().sets(),
            writes: Vec::new(),
        }
    }

    /// Keep the blocks of `blocks` that `ladder` does not publish out of
    /// the outbox (they are still written to the local table). `known`:
    /// the depth the request's lookup found (0: none). When the deepest
    /// known block (rewritten by the record) is withheld, its **placement**
    /// (a refresh past the horizon, a new holder set, or a confirmed move
    /// to another replica: what a warm exact repeat writes, and nothing
    /// else) is published under its **stand-in**, the deepest published
    /// ladder block below it (same holders and time, no mark): the peers
    /// find the prompt there, so their copy stays fresh and learns the new
    /// holder. Cost: one keyed hash per withheld block (≤ the ladder
    /// positions + 1) and one for the stand-in, one pass over the
    /// positions; nothing when `ladder` publishes everything or the wrapper
    /// is not enabled. Also takes the table's sets from `index`: the
    /// outbox names each write by its key's own slot
    /// ([`Sets::wire_slot`]), so call it before recording when publishing
    /// (without it: the default table's sets).
    pub fn withhold(
        &mut self,
        index: &PrefixIndex,
        blocks: &[u64],
        known: usize,
        ladder: PeerLadder,
    ) {
        self.sets = index.sets();
        if !self.enabled || ladder.publishes_all() {
            return;
        }
        let n = blocks.len();
        let mut stand_in = None;
        self.withheld.clear();
        for (p, &key) in blocks.iter().enumerate() {
            if !ladder.publishes(p, n) {
                self.withheld.push(Withheld {
                    at: index.place(key),
                    stand_in: stand_in
                        .filter(|_| p + 1 == known)
                        .map(|q: usize| index.place(blocks[q])),
                });
            } else if on_ladder(p, ladder.ladder_bits) {
                stand_in = Some(p);
            }
        }
    }

    /// The stand-in of `slot`'s write when it is a withheld block
    /// (`Some(None)`: withheld, no stand-in); `None`: not withheld.
    fn withheld(&self, slot: u32, entry: Option<&Entry>) -> Option<Option<(u32, u64)>> {
        if self.withheld.is_empty() {
            return None;
        }
        let tag = entry?.key_tag();
        self.withheld
            .iter()
            .find(|w| w.at.1 == tag && self.sets.same(w.at.0, slot))
            .map(|w| w.stand_in)
    }

    /// The writes to publish for a record that added `new_chars` characters
    /// beyond the known prefix (see the type docs); `moved`: the record put
    /// a known prefix on a replica that was not its front holder.
    pub fn outbox(
        &self,
        new_chars: usize,
        min_new_chars: usize,
        moved: bool,
    ) -> Vec<(u32, SlotValue)> {
        let blocks = new_chars >= min_new_chars;
        self.writes
            .iter()
            .filter(|w| match w.2 {
                News::Placement => true,
                News::Block => blocks,
                News::Confirmed => blocks || moved,
                News::None | News::Reorder => false,
            })
            .filter_map(|w| {
                let e = Entry::decode(&w.1);
                match self.withheld(w.0, e.as_ref()) {
                    // The key's own slot, whichever way of its set it is in.
                    None => Some((self.sets.wire_slot(w.0, e.map_or(0, |e| e.tag)), w.1)),
                    // The deepest known block's placement moves to the
                    // stand-in; new blocks have their ladder blocks published
                    // with them.
                    Some(Some((slot, tag)))
                        if w.2 == News::Placement || (w.2 == News::Confirmed && moved) =>
                    {
                        Some((slot, Entry { tag, ..e? }.encode()))
                    }
                    Some(_) => None,
                }
            })
            .collect()
    }
}

impl<S: SlotStore> SlotStore for Publishing<'_, S> {
    fn get(&self, slot: u32) -> Option<SlotValue> {
        self.inner.get(slot)
    }

    fn set(&mut self, slot: u32, value: SlotValue) {
        if !self.enabled {
            self.inner.set(slot, value);
            return;
        }
        let old = self.inner.get(slot);
        self.inner.set(slot, value);
        let kind = news(old.as_ref(), &value, self.rule);
        if kind != News::None {
            self.writes.push((slot, value, kind));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::shared::MockShared;
    use crate::index::{
        ladder, unmarked, IndexConfig, Known, PendingBlocks, PrefixIndex, VecStore,
    };
    use crate::peers::{self, decode, encode, entry, layout, merge};
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn log_round_trip_bounded_and_wrapping() {
        let s = MockShared::new();
        let k = PeerKeys::new("prefix_router/p/");
        let w: Vec<(u32, SlotValue)> = (0..10u32)
            .map(|i| (i, entry(u64::from(i) + 1, i, &[i as u16])))
            .collect();
        assert_eq!(append(&s, &k, 8, &w[..3]).unwrap(), 0);
        assert_eq!(append(&s, &k, 8, &w[3..]).unwrap(), 3);
        // 10 written, capacity 8: the oldest kept is seq 2.
        let (from, items) = read_since(&s, &k, 8, 0, 100).unwrap();
        assert_eq!((from, items.len()), (2, 8));
        assert_eq!(items[0], w[2]);
        assert_eq!(items[7], w[9]);
        let (from, items) = read_since(&s, &k, 8, 7, 2).unwrap();
        assert_eq!((from, items), (7, w[7..9].to_vec()));
        let (from, items) = read_since(&s, &k, 8, 10, 100).unwrap();
        assert_eq!((from, items.len()), (10, 0));
        // The log never holds more than `capacity` item keys (+ head).
        assert_eq!(
            s.keys().iter().filter(|x| x.contains("peers/log/")).count(),
            8
        );
        // Through the wire codec: what a peer pulls decodes and merges.
        let lay = layout(64, &[]);
        let wire = encode(from, items.iter(), lay, 5, 64);
        assert_eq!(decode(&wire, lay, 100, 64, 65_535).unwrap().from_seq, 10);
    }

    #[test]
    fn a_reserved_but_unwritten_item_stops_the_batch_and_an_old_hole_is_skipped() {
        let s = MockShared::new();
        let k = PeerKeys::new("x/");
        append(&s, &k, 4096, &[(1, entry(1, 1, &[0]))]).unwrap();
        // A writer reserved seqs 1..3 but has not written them yet.
        s.set(&k.head, &3u64.to_le_bytes(), 0).unwrap();
        let (from, items) = read_since(&s, &k, 4096, 0, 10).unwrap();
        assert_eq!((from, items.len()), (0, 1));
        let (from, items) = read_since(&s, &k, 4096, 1, 10).unwrap();
        assert_eq!((from, items.len()), (1, 0));
        // Much later the hole is skipped (the puller counts it lost).
        let w: Vec<(u32, SlotValue)> = (0..HOLE_AGE as u32 + 2)
            .map(|i| (i, entry(7, i, &[1])))
            .collect();
        append(&s, &k, 4096, &w).unwrap();
        let (from, items) = read_since(&s, &k, 4096, 1, 10).unwrap();
        assert_eq!((from, items.len()), (3, 10));
    }

    #[test]
    fn epoch_is_created_once_and_cursors_round_trip() {
        let s = MockShared::new();
        let k = PeerKeys::new("x/");
        assert_eq!(epoch(&s, &k, 11).unwrap(), 11);
        assert_eq!(epoch(&s, &k, 22).unwrap(), 11);
        assert_eq!(cursor(&s, &k, "127.0.0.1:1"), Cursor::default());
        let c = Cursor {
            epoch: Some(9),
            seq: 1234,
        };
        store_cursor(&s, &k, "127.0.0.1:1", &c).unwrap();
        assert_eq!(cursor(&s, &k, "127.0.0.1:1"), c);
        assert_eq!(cursor(&s, &k, "127.0.0.1:2"), Cursor::default());
    }

    #[test]
    fn only_news_is_published() {
        let a = entry(5 << 8, 100, &[1]);
        let r = NewsRule::refresh(1200);
        assert_eq!(news(None, &a, r), News::Block);
        assert_eq!(news(Some(&a), &entry(5 << 8, 150, &[1]), r), News::None);
        assert_eq!(
            news(Some(&a), &entry(5 << 8, 1300, &[1]), r),
            News::Placement
        );
        assert_eq!(
            news(Some(&a), &entry(5 << 8, 150, &[2, 1]), r),
            News::Placement
        );
        assert_eq!(news(Some(&a), &entry(6 << 8, 150, &[1]), r), News::Block);
        // A new length stamp alone (the record of a request that went on
        // past the block) is not news; an end mark is another key.
        assert_eq!(
            news(Some(&a), &entry((5 << 8) | 7, 150, &[1]), r),
            News::None
        );
        let marked = entry((5 << 8) | (1 << 47), 150, &[1]);
        assert_eq!(news(Some(&a), &marked, r), News::Block);
        // A hot prefix served by its other holder: the same set, not news;
        // a new holder in the set, or the same set past the horizon, is.
        let two = entry(5 << 8, 100, &[1, 2]);
        assert_eq!(
            news(Some(&two), &entry(5 << 8, 150, &[2, 1]), r),
            News::Reorder
        );
        assert_eq!(
            news(Some(&two), &entry(5 << 8, 150, &[3, 1, 2]), r),
            News::Placement
        );
        assert_eq!(
            news(Some(&two), &entry(5 << 8, 150, &[2]), r),
            News::Placement
        );
        assert_eq!(
            news(Some(&two), &entry(5 << 8, 1300, &[2, 1]), r),
            News::Placement
        );
        // Through the index: a first record is all news, a warm repeat is none,
        // and the published writes rebuild the same knowledge on a peer.
        let idx = PrefixIndex::new(IndexConfig {
            slots: 4096,
            ..IndexConfig::default()
        });
        let blocks: Vec<u64> = (1..=24u64)
            .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .collect();
        let mut table = VecStore::new(4096);
        let mut p = Publishing::new(&mut table, 1200, true);
        let sets = idx.record(&mut p, &blocks, None, 3, 10_000);
        assert_eq!(p.outbox(24 * 256, 1024, false).len(), sets);
        // A short prompt (new extent under the threshold) publishes nothing new.
        assert!(p.outbox(3 * 256, 1024, false).is_empty());
        let first = p.outbox(24 * 256, 1024, false);
        let known = idx.lookup(&table, &blocks, 11_000);
        let mut p = Publishing::new(&mut table, 1200, true);
        idx.record(&mut p, &blocks, known.as_ref(), 3, 11_000);
        assert!(
            p.writes.is_empty(),
            "a warm repeat is not news: {:?}",
            p.writes.len()
        );
        // The same prefix served by another replica: a placement change,
        // published even though nothing new was added.
        let mut p = Publishing::new(&mut table, 1200, true);
        idx.record(&mut p, &blocks, known.as_ref(), 4, 11_500);
        let moved = p.outbox(0, 1024, false);
        assert!(!moved.is_empty());
        assert_eq!(moved.len(), p.writes.len());
        // A 2-block extension of the known prefix: new blocks, under the threshold.
        let mut longer = blocks.clone();
        longer.extend([77, 78]);
        let known = idx.lookup(&table, &longer, 12_000);
        assert_eq!(known.map(|k| k.depth), Some(24));
        let mut p = Publishing::new(&mut table, 1200, true);
        idx.record(&mut p, &longer, known.as_ref(), 4, 12_000);
        assert!(p.writes.iter().any(|w| w.2 == News::Block));
        assert!(p.outbox(2 * 256, 1024, false).iter().all(|w| p
            .writes
            .iter()
            .any(|x| x.0 == w.0 && x.2 == News::Placement)));
        let mut peer = VecStore::new(4096);
        for (slot, v) in &first {
            peers::merge(&mut peer, idx.sets(), *slot, v);
        }
        assert_eq!(
            idx.lookup(&peer, &blocks, 11_000).map(|k| k.depth),
            Some(24)
        );
        // merge is also what the puller applies: idempotent.
        assert!(merge(&mut peer, idx.sets(), first[0].0, &first[0].1).is_none());
    }

    #[test]
    fn a_peer_ladder_withholds_what_peers_cannot_use() {
        let cfg = IndexConfig {
            slots: 1 << 16,
            ..unmarked()
        };
        let idx = PrefixIndex::new(cfg);
        let tolerant = PrefixIndex::new(IndexConfig {
            peer_bits: 2,
            ..cfg
        });
        let key = |i: u64| i.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x55;
        // 45 blocks: the last one (44) is not a ladder position.
        let blocks: Vec<u64> = (1..=45u64).map(key).collect();
        let mut longer = blocks.clone();
        longer.extend((100..120u64).map(key));
        let publish = |ladder: PeerLadder, blocks: &[u64]| {
            let mut table = VecStore::new(1 << 16);
            let mut p = Publishing::new(&mut table, 1200, true);
            p.withhold(&idx, blocks, 0, ladder);
            idx.record(&mut p, blocks, None, 3, 10_000);
            let out = p.outbox(usize::MAX, 0, false);
            let mut peer = VecStore::new(1 << 16);
            for (slot, v) in &out {
                peers::merge(&mut peer, idx.sets(), *slot, v);
            }
            // The local table is the same whatever is published.
            let local = idx.lookup(&table, blocks, 10_000).map(|k| k.depth);
            assert_eq!(local, Some(blocks.len()));
            (out.len(), peer)
        };
        let all = PeerLadder {
            ladder_bits: 3,
            publish_bits: 0,
            ladder_last: false,
        };
        assert!(all.publishes_all());
        let (n_all, peer_all) = publish(all, &blocks);
        let last = PeerLadder {
            ladder_last: true,
            ..all
        };
        let (n_last, peer_last) = publish(last, &blocks);
        assert_eq!(n_last + 1, n_all, "the last block is kept local");
        // A longer prompt (the next turn) finds the same depth either way;
        // only an exact repeat needed the last block.
        for peer in [&peer_all, &peer_last] {
            assert_eq!(idx.lookup(peer, &longer, 0).map(|k| k.depth), Some(40));
        }
        assert_eq!(idx.lookup(&peer_all, &blocks, 0).map(|k| k.depth), Some(45));
        assert_eq!(
            idx.lookup(&peer_last, &blocks, 0).map(|k| k.depth),
            Some(40)
        );
        // The coarse ladder: 2-bit positions (0–3, 5, 7, 11, 15, 23, 31).
        let coarse = PeerLadder {
            publish_bits: 2,
            ..last
        };
        let (n_coarse, peer_coarse) = publish(coarse, &blocks);
        assert_eq!(n_coarse, ladder(44, 2).count());
        assert_eq!(
            tolerant.lookup(&peer_coarse, &longer, 0).map(|k| k.depth),
            Some(32)
        );
        // A last block on the fine ladder (39: a continuation's mark) is
        // published even when it is not a coarse position.
        assert!(coarse.publishes(39, 40) && !coarse.publishes(39, 41));
        assert!(!coarse.publishes(44, 45) && last.publishes(39, 41));
        let (_, peer_mark) = publish(coarse, &blocks[..40]);
        let k = tolerant.lookup(&peer_mark, &longer, 0);
        assert_eq!(k.map(|k| (k.depth, k.entry.is_end())), Some((40, true)));
    }

    #[test]
    fn an_exact_repeat_moves_its_placement_to_the_stand_in() {
        let idx = PrefixIndex::new(IndexConfig {
            slots: 1 << 16,
            ..unmarked()
        });
        let ladder = PeerLadder {
            ladder_bits: 3,
            publish_bits: 0,
            ladder_last: true,
        };
        // 45 blocks: the last one (44) is withheld, its stand-in is 39.
        let blocks: Vec<u64> = (1..=45u64)
            .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x77)
            .collect();
        let (mut table, mut peer) = (VecStore::new(1 << 16), VecStore::new(1 << 16));
        let send = |table: &mut VecStore,
                    peer: &mut VecStore,
                    known: Option<&Known>,
                    r: usize,
                    at: u64| {
            let mut p = Publishing::new(table, 1200, true);
            p.withhold(&idx, &blocks, known.map_or(0, |k| k.depth), ladder);
            idx.record(&mut p, &blocks, known, r, at);
            let moved = known.is_some_and(|k| k.entry.holders().next() != Some(r));
            let out = p.outbox(usize::MAX, 0, moved);
            for (slot, v) in &out {
                peers::merge(peer, idx.sets(), *slot, v);
            }
            out.len()
        };
        send(&mut table, &mut peer, None, 3, 10_000);
        let at_peer = |peer: &VecStore| {
            idx.lookup(peer, &blocks, 20_000)
                .map(|k| (k.depth, k.entry))
        };
        assert_eq!(at_peer(&peer).map(|k| k.0), Some(40));
        // The same prompt served by replica 5 (a spill): one write, under
        // block 39, with the new holder in front and no mark.
        let known = idx.lookup(&table, &blocks, 11_000);
        assert_eq!(known.map(|k| k.depth), Some(45));
        assert_eq!(send(&mut table, &mut peer, known.as_ref(), 5, 11_000), 1);
        let (_, e) = at_peer(&peer).unwrap();
        assert_eq!(
            (e.holders[0], e.holders[1], e.is_end()),
            (Some(5), Some(3), false)
        );
        // A warm repeat past the refresh horizon (120 s) refreshes it there.
        let known = idx.lookup(&table, &blocks, 200_000);
        assert_eq!(send(&mut table, &mut peer, known.as_ref(), 5, 200_000), 1);
        assert_eq!(at_peer(&peer).unwrap().1.time, crate::index::decis(200_000));
        // A warm repeat within the horizon sends nothing.
        let known = idx.lookup(&table, &blocks, 201_000);
        assert_eq!(send(&mut table, &mut peer, known.as_ref(), 5, 201_000), 0);
        // The local table still has the last block (an exact repeat: one get).
        table.new_callback();
        let before = table.gets();
        assert_eq!(
            idx.lookup(&table, &blocks, 201_000).map(|k| k.depth),
            Some(45)
        );
        assert_eq!(table.gets() - before, 1);
    }

    #[test]
    fn a_confirmed_pending_entry_follows_the_block_rule() {
        // The filter's sequence: a cold placement writes a pending record
        // (local only, time set back), the 2xx record confirms it.
        let idx = PrefixIndex::new(IndexConfig {
            slots: 4096,
            ..unmarked()
        });
        let max_age = 600_000;
        let rule = NewsRule::refresh(1200).with_pending(max_age);
        let blocks: Vec<u64> = (1..=3u64).map(|i| i.wrapping_mul(0x9e37_79b9)).collect();
        let mut table = VecStore::new(4096);
        // The pending record at routing, on a table.
        let pending = |t: &mut VecStore| {
            let at = (1_000_000, max_age);
            idx.record_pending(t, &blocks, None, 2, at, PendingBlocks::All)
        };
        pending(&mut table);
        let mut p = Publishing::with_rule(&mut table, rule, true);
        let sets = idx.record(&mut p, &blocks, None, 2, 1_000_400);
        assert_eq!(p.writes.len(), sets);
        assert!(p.writes.iter().all(|w| w.2 == News::Confirmed));
        // A short unique prompt placed cold: nothing published; a long one,
        // or one that moved a known prefix: published.
        assert!(p.outbox(3 * 256, 1024, false).is_empty());
        assert_eq!(p.outbox(3 * 256, 1024, true).len(), sets);
        assert_eq!(p.outbox(3 * 256, 512, false).len(), sets);
        // Without the pending offset the same writes looked like refreshes
        // (always published: the old rule's leak).
        let mut table = VecStore::new(4096);
        pending(&mut table);
        let mut p = Publishing::new(&mut table, 1200, true);
        idx.record(&mut p, &blocks, None, 2, 1_000_400);
        assert_eq!(p.outbox(3 * 256, 1024, false).len(), sets);
        // A refresh long after (older than the pending window) is a placement.
        let old = entry(5, 0, &[1]);
        assert_eq!(
            news(Some(&old), &entry(5, 9_000, &[1]), rule),
            News::Placement
        );
        assert_eq!(
            news(Some(&old), &entry(5, 5_700, &[1]), rule),
            News::Confirmed
        );
    }
}
