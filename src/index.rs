//! Approximate index of recently routed prefix blocks: which replicas were
//! sent which prefixes, in a fixed table of slots.
//!
//! The filter keeps this table in proxy-wasm shared data, which has no delete
//! and costs ≈ 0.8 µs per get and ≈ 0.2 µs per set, so the index is a
//! **four-way set-associative table** of `slots` entries behind the
//! [`SlotStore`] trait (Vec-backed [`VecStore`] in tests and in the
//! simulator; shared-data-backed in the filter, four slots per key:
//! [`crate::cluster::slots`]). A block key `k` (a seeded chained hash from
//! [`crate::RoutingKey::blocks`], one per 256 characters of prefix, blocks
//! ending early at message boundaries) has its own slot
//! `(k >> 32) % slots` and lives there or in one of its set's other three
//! slots `slot ^ i` ([`Sets`]); a write takes the key's slot, else an
//! empty one, else the least recently used of the four, so memory is
//! bounded and old prefixes fade out as new ones take their slots (until
//! the twenty-fifth session the table was direct-mapped, [`IndexConfig::ways`]
//! = 1; until the twenty-eighth it was two-way).
//!
//! **Keyed placement.** Block keys are hashes of public text, so anyone could
//! compute which slot a prefix lives in and aim junk at it. The slot and the
//! tag are therefore taken from `xxh3(key, seed = secret)` where `secret`
//! ([`IndexConfig::secret`]) is drawn per Envoy process at start (the filter
//! takes it from the host's random source, see `src/filter/secret.rs`) and
//! never leaves it: without it a client cannot tell which slot a prefix uses
//! (one 8-byte xxh3 per probe or write, a few ns).
//!
//! Entry ([`ENTRY_BYTES`] = 24 bytes, little endian): `tag` (bits 9–46 of the keyed hash,
//! never all 0, plus bit 47: the end mark, bit 8: the signpost, and bits 0–7: the **length
//! stamp**, see below) ‖
//! `time` (u32, deciseconds on the caller's clock, wrapping) ‖ up to
//! [`MAX_HOLDERS`] replica indices as u16 `index + 1` (0 = none), most
//! recently routed first.
//!
//! **Ladder.** Writing every block of a new 64 KiB prefix would cost 256 sets,
//! so only the blocks at fixed *ladder* positions are written: positions `p`
//! where `p + 1` has at most `ladder_bits` significant bits (with 3 bits: 0–7,
//! 9, 11, 13, 15, 19, 23, 27, 31, 39, …, 255: 29 positions for 256 blocks, four
//! per octave), plus the request's last block. Every request uses the same
//! positions, so a prefix routed before has all its ladder blocks known.
//!
//! **Lookup** ([`PrefixIndex::lookup`]): blocks are chained, so "block `i` is
//! known" implies the whole prefix up to `i` was routed before. Probe the last
//! block (an exact repeat: one get), then gallop down the ladder positions
//! below it from the deepest (steps 1, 2, 4, …) to the first known one, and
//! binary-search between it and the last unknown one: one or two gets for a
//! deep shared prefix, about `2·log2 28 ≈ 10` at most for 256 blocks. Starting
//! from the deep end means a shallow block lost to a colliding key does not
//! hide a deep known prefix. The depth found is a lower
//! bound of the shared prefix, within a factor 1 + 2^(1 − ladder_bits) (1.25
//! for 3 bits). Entry age is not used during the search (deep entries are
//! refreshed more often than shallow ones); the caller judges the age of the
//! entry found. When the peers publish only a coarser ladder
//! ([`IndexConfig::peer_bits`], `peers.publish_bits`), a prefix learned from
//! them has no fine positions between the coarse ones: the lookup then
//! probes the deepest ladder position, searches the coarse positions the
//! same way, then the fine ones between the coarse hit and the coarse miss;
//! the depth found is at least the deepest coarse position at or below the
//! shared prefix (a factor `1 + 2^(1 − peer_bits)`), and on a table with
//! the full ladder it is the plain search's depth, with as many gets within
//! 1 % (unit test `a_coarse_peer_ladder_is_found_within_one_coarse_step`).
//!
//! **Record** ([`PrefixIndex::record`]): after routing to replica `r`, write
//! (each write reads its set first to place the entry: one get per write,
//! none when the filter's store holds that key already, [`VecStore`]):
//! - the deepest known block, with `r` moved to the front of its holders
//!   (this is how a hot prefix accumulates 2…[`MAX_HOLDERS`] replicas);
//! - every other ladder block of the request, holders = `[r]`, deepest first,
//!   at most `max_writes` of them (≤ 27 for 256 blocks with 3 bits). Rewriting
//!   the known ones too restores blocks that colliding keys overwrote, so the
//!   prefixes in use keep intact ladders while unused ones fade out;
//! - the last block (so an identical request is found with one get);
//! - the **end marks** ([`IndexConfig::end_marks`], on by default; a pending record,
//!   [`PrefixIndex::record_pending`], writes the last block's only): the request's last block (`n − 1`:
//!   it ends at a message boundary, [`crate::hash`], so the next turn
//!   shares it) and the one before (`n − 2`: the last whole block when the
//!   last one is a partial block a longer prompt does not share, e.g. a
//!   completions string) are written with bit 47 of their tag set, together
//!   with the blocks the lookup's gap search probes on its way to them
//!   (≤ `⌈log2(gap + 1)⌉` each, mostly shared, none for a ladder position),
//!   so a longer prompt extending this one finds exactly that depth and the
//!   mark: a **continuation** (the next turn of a
//!   conversation), which [`crate::affinity`] treats as warm whatever its
//!   share of the window. Only a block new to the index gets a mark; the
//!   deepest known block is rewritten without one, so a block that two
//!   prompts contain (a system prompt under which short prompts end) loses
//!   its mark when the second one is recorded. The path blocks on the way
//!   are **signposts** (below).
//! - without `end_marks`, the **last-block mark** ([`IndexConfig::last_mark`],
//!   on by default; inert with end marks): the last block, written anyway, carries the mark (no
//!   search path, no `n − 2` mark: no extra set). A longer prompt finds it
//!   when that block is a ladder position of its lookup (every block up to
//!   8, then four per octave): turn 2 of a conversation after a short first
//!   prompt and a long answer is then warm (in chat, such turns went cold
//!   under `min_match`). A pending record writes the same mark, so its
//!   confirmation changes no tag, and an exact repeat keeps it.
//!
//! **Signposts** ([`Entry::is_signpost`], bit 8 of the stored tag): the
//! blocks of an end mark's search path other than the mark itself. They
//! are written with the recording replica alone, and a session's path
//! often runs through the last blocks of a prompt that many sessions share
//! (they lie in the ladder gap before the session's own blocks). A lookup
//! that answered with such a block would see one holder where the ladder
//! block under it has several, and a hot shared prompt would narrow onto
//! whichever replicas wrote paths last (`agent` at 16 replicas: p90 +30 %,
//! `docs/benchmarks.md`, "Twenty-second session"). So the gap search
//! passes through signposts but never answers with one: the answer is the
//! end mark it reaches, else the deepest ladder block (with the last
//! block too: a signpost there is not an exact repeat). Blocks that
//! [`PrefixIndex::confirm`] writes are not signposts (they carry the
//! prefix's holders): an engine-confirmed depth is an answer. No extra
//! get or set; peers carry the bit with the tag.
//!
//! **Merging records** ([`IndexConfig::merge_record`], on): a record
//! rewrites the deepest known block with the recorded replica first, then
//! the holders the entry has *now* (read again: one get), then those its
//! lookup saw (≤ [`MAX_HOLDERS`]). Without it the record writes the
//! lookup's holders (no get), so a request looked up before a spill and
//! answered after it rewrites the entry without the spill's new holder.
//! With `rewrite_known` the known ladder blocks it rewrites are merged the
//! same way (one get each); the blocks new to the lookup are written with
//! the replica alone. The pending record (at routing, right after its
//! lookup) does not read.
//!
//! **Length stamp** ([`Entry::stamp`]): when a record rewrites the deepest
//! known block of a request that goes on past it, the low 8 bits of the tag
//! hold that request's block count (at most 255); every other write leaves
//! them 0 (an exact repeat and [`PrefixIndex::confirm`] keep them). A later
//! request whose deepest known block this is, and which is no longer than
//! the stamp, did not extend the request that wrote it: two prompts branched
//! off this block (**fan-out**: a shared prefix under several questions),
//! where the next turn of a conversation is longer than the turn before
//! ([`crate::affinity`], "Request share"). No extra get or set: the record
//! rewrites that block anyway.
//!
//! **Mirrored last block** ([`IndexConfig::mirror_from`]): for a prompt
//! that fills the hashed window (at least `prefix_length / 256` blocks, set
//! by [`crate::Router::new`]) the last block is also written under a second
//! key ([`mirror_key`]: another slot and tag), and a lookup whose last block
//! is missing probes it before the ladder. Why: that block alone says the
//! whole window is known, hence the prompt past it too
//! ([`crate::affinity::AffinityConfig::beyond_window`]); lost to a colliding
//! key, a 190 000-token document fell back to its deepest ladder block
//! (224 of 256) and was priced as 14 336 cached tokens on its holder: 177 000
//! phantom queued tokens there and, behind them, a spill of its next repeat
//! (a 17 s re-prefill; the public Mooncake trace at 32 replicas). With the
//! mirror both slots must be lost (p² instead of p). Cost, for such prompts
//! only: one set per record, one get per lookup that misses the last block.
//!
//! Invariants: a slot holds the entry of at most one key, and a write puts
//! a key in at most one slot of its set; lookups never
//! report a depth whose block key is not present with its exact 47-bit tag;
//! record writes at most `max_writes + 3 + 2⌈log2(gap + 1)⌉` slots (≤ 10
//! path blocks for 256 blocks with 3 bits, usually 0–4). A peer that merges entries treats
//! two tags that differ only in the mark as different keys (the incoming
//! one wins): marks are hints, never needed for correctness.
//!
//! Approximation: a block whose set two newer keys took is lost; the
//! binary search then reports a shallower known prefix (never a false one, up
//! to tag collisions: 39 key bits, of which the slot fixes those above bit
//! 31 for tables up to 2^16 slots, so ≈ 2^-24 per probe of a slot another
//! key holds; a probe compares up to two entries).

/// Longest a warm exact repeat leaves its entry's time unrefreshed
/// ([`PrefixIndex::record_unneeded`], [`refresh_skip_ms`]), milliseconds.
pub const REFRESH_SKIP_MS: u64 = 1_000;

/// The freshness bound of [`PrefixIndex::record_unneeded`] for an index
/// whose entries expire after `max_age_ms` and whose refreshes are
/// published to peers when older than `publish_ms` (`None`: no peers):
/// the least of [`REFRESH_SKIP_MS`], 1 % of the TTL and `publish_ms`.
///
/// Why that is safe: an entry may then look up to this much older than
/// its last use. Against the TTL that is ≤ 1 % (a 600 s TTL: 1 s); under
/// a 10 s TTL only a write of the very same value (same 100 ms clock
/// step) is skipped; a pending entry looks `max_age − PENDING_MS` old, far beyond
/// it, so its confirmation is always written; an eviction horizon
/// ([`crate::feedback`]) needs misses spread over seconds and drops at
/// most the entries last used within the bound of it; and a warm repeat
/// is published to peers only over an entry older than `publish_ms`, never
/// skipped here, so the peers see the same refreshes (or earlier ones).
pub fn refresh_skip_ms(max_age_ms: u64, publish_ms: Option<u64>) -> u64 {
    REFRESH_SKIP_MS
        .min(max_age_ms / 100)
        .min(publish_ms.unwrap_or(u64::MAX))
}

/// How long a pending record (written at routing, before the response
/// confirms it) stays fresh, milliseconds ([`PrefixIndex::record_pending`]).
pub const PENDING_MS: u64 = 30_000;

/// How far back a pending record sets its entry's time: `max_age_ms −
/// PENDING_MS`, so that it reads as older than any confirmed entry yet
/// stays fresh for [`PENDING_MS`] ([`PrefixIndex::record_pending`]).
pub fn pending_offset_ms(max_age_ms: u64) -> u64 {
    max_age_ms.saturating_sub(PENDING_MS)
}

/// Milliseconds since a *pending* entry was written, if an entry found
/// `age_ms` old under `max_age_ms` is one (its age lies in
/// `[offset, max_age_ms]`, [`pending_offset_ms`]); `None` for a confirmed
/// entry, a stale one, or when `max_age_ms ≤ PENDING_MS` (no offset: the
/// two cannot be told apart). Cost: O(1).
pub fn pending_elapsed_ms(age_ms: u64, max_age_ms: u64) -> Option<u64> {
    let back = pending_offset_ms(max_age_ms);
    (back > 0 && (back..=max_age_ms).contains(&age_ms)).then(|| age_ms - back)
}

/// Which blocks a pending record ([`PrefixIndex::record_pending`]) writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PendingBlocks {
    /// Every block (with the deepest known one): a request placed on a
    /// replica that does not hold its prefix (cold, spilled), which
    /// prefills it all.
    All,
    /// Only the blocks past the known prefix, the known ones left as they
    /// are: a request kept on a holder of its known prefix that goes on
    /// past it (a conversation's next turn,
    /// [`crate::affinity::AffinityConfig::pending_warm`]). Made to look
    /// pending too, the known blocks would tell every request sharing them
    /// (the other conversations under one system prompt) that their prefix
    /// is being prefilled there: on `agent` traces at 7–32 replicas that
    /// cost 5–106 ms of p90. Sets: the new blocks' only.
    PastKnown,
}

/// Bytes per slot value.
pub const ENTRY_BYTES: usize = 10 + 2 * MAX_HOLDERS;
/// Replicas remembered per prefix point (how many of them are holder
/// candidates: [`crate::affinity::CORE_HOLDERS`]).
pub const MAX_HOLDERS: usize = 7;

/// One slot's value.
pub type SlotValue = [u8; ENTRY_BYTES];

/// A holder list of `K ≤ MAX_HOLDERS` replicas (front first), padded with
/// `None`; items past [`MAX_HOLDERS`] are dropped (tests spell holder lists
/// with it).
#[cfg(test)]
pub(crate) fn pad<const K: usize>(h: [Option<u16>; K]) -> [Option<u16>; MAX_HOLDERS] {
    let mut a = [None; MAX_HOLDERS];
    for (x, y) in a.iter_mut().zip(h) {
        *x = y;
    }
    a
}

/// The default configuration without end marks (tests of what the index
/// writes and finds without them: the ladder and the last block alone).
#[cfg(test)]
pub(crate) fn unmarked() -> IndexConfig {
    IndexConfig {
        end_marks: false,
        ..IndexConfig::default()
    }
}

/// Storage of the slot table. `get` of a never-written slot returns `None`.
pub trait SlotStore {
    /// Read slot `slot`.
    fn get(&self, slot: u32) -> Option<SlotValue>;
    /// Overwrite slot `slot`.
    fn set(&mut self, slot: u32, value: SlotValue);
}

/// Write the shared-data key of `slot` under `prefix` into `buf`:
/// `<prefix>i/<slot in lower-case hex>` (the same text as
/// `format!("{prefix}i/{slot:x}")`), reusing `buf`'s allocation; O(key length),
/// no allocation once `buf` has grown to the longest key.
pub fn slot_key_into(buf: &mut String, prefix: &str, slot: u32) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    buf.clear();
    buf.push_str(prefix);
    buf.push_str("i/");
    let digits = (u32::BITS - slot.leading_zeros()).div_ceil(4).max(1);
    for i in (0..digits).rev() {
        buf.push(char::from(HEX[((slot >> (4 * i)) & 0xf) as usize]));
    }
}

/// Table slots stored under one shared-data key by the filter
/// (`src/filter/slots.rs`): slots `4k` to `4k + 3`, a four-way set
/// ([`Sets`], [`IndexConfig::ways`] 4), so a probe or a write reads its set
/// with one get.
pub const SLOTS_PER_KEY: u32 = 4;

/// In-memory slot table (tests, simulator). Counts gets and sets as the
/// filter's host calls: table slots are read [`SLOTS_PER_KEY`] at a time
/// and the last [`crate::cluster::slots::HELD`] keys read or written in
/// a callback are kept ([`VecStore::new_callback`] starts one): a get of
/// a slot under a kept key is free, a set of a slot under another key
/// first reads it. Slots beyond the table (the reserved ones of
/// [`crate::pressure`]) are kept in a small side list, one get each.
#[derive(Debug, Clone)]
pub struct VecStore {
    slots: Vec<SlotValue>,
    reserved: Vec<(u32, SlotValue)>,
    gets: std::cell::Cell<u64>,
    sets: u64,
    /// Shared-data keys of this callback's table reads and writes (the
    /// filter's store keeps as many), and where the next one goes.
    held: std::cell::Cell<crate::cluster::slots::Memo<u32>>,
}

impl VecStore {
    /// A table of `slots` empty slots.
    pub fn new(slots: u32) -> VecStore {
        VecStore {
            slots: vec![[0; ENTRY_BYTES]; slots.max(1) as usize],
            reserved: Vec::new(),
            gets: std::cell::Cell::new(0),
            sets: 0,
            held: std::cell::Cell::new(crate::cluster::slots::Memo::new()),
        }
    }

    /// Start a new host callback: the filter's kept keys do not outlive
    /// one (`src/cluster/slots.rs`), so the next read of any key counts.
    pub fn new_callback(&self) {
        self.held.set(crate::cluster::slots::Memo::new());
    }

    /// Count a read of table slot `slot`'s shared-data key unless it is
    /// kept; keep it (in place of the oldest kept key).
    fn read_key(&self, slot: u32) {
        let key = slot / SLOTS_PER_KEY;
        let mut held = self.held.get();
        if held.find(|&k| k == key).is_some() {
            return;
        }
        self.gets.set(self.gets.get() + 1);
        held.keep(key, |&k| k == key);
        self.held.set(held);
    }

    /// Gets so far.
    pub fn gets(&self) -> u64 {
        self.gets.get()
    }

    /// Sets so far.
    pub fn sets(&self) -> u64 {
        self.sets
    }

    /// Slots in use.
    pub fn occupied(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| **s != [0; ENTRY_BYTES])
            .count()
    }
}

impl SlotStore for VecStore {
    fn get(&self, slot: u32) -> Option<SlotValue> {
        if (slot as usize) < self.slots.len() {
            self.read_key(slot);
        } else {
            self.gets.set(self.gets.get() + 1);
        }
        self.slots
            .get(slot as usize)
            .or_else(|| self.reserved.iter().find(|r| r.0 == slot).map(|r| &r.1))
            .copied()
            .filter(|v| *v != [0; ENTRY_BYTES])
    }

    fn set(&mut self, slot: u32, value: SlotValue) {
        self.sets += 1;
        if (slot as usize) < self.slots.len() {
            // The filter writes the key's slots together: it needs the
            // others (read unless the key is kept).
            self.read_key(slot);
        }
        if let Some(s) = self.slots.get_mut(slot as usize) {
            *s = value;
        } else if let Some(r) = self.reserved.iter_mut().find(|r| r.0 == slot) {
            r.1 = value;
        } else {
            self.reserved.push((slot, value));
        }
    }
}

/// A decoded slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// Low 48 bits of the block key (never 0).
    pub tag: u64,
    /// Last write, deciseconds (wrapping).
    pub time: u32,
    /// Replica indices, most recent first.
    pub holders: [Option<u16>; MAX_HOLDERS],
}

/// Bits of the stored tag that hold the [`Entry::stamp`] (the lowest).
pub const STAMP_BITS: u32 = 8;
/// The stamp bits of a stored tag.
pub const STAMP_MASK: u64 = (1 << STAMP_BITS) - 1;
/// Bit 8 of the stored tag: a **signpost** ([`Entry::is_signpost`]). The
/// peers' wire carries tag bits 8–47, so the flag travels, and bits 32–46
/// stay key bits (a table of 2^15 slots keeps implying the slot).
const SIGNPOST_BIT: u64 = 1 << STAMP_BITS;
/// Key bits of the stored tag: 9–46.
const TAG_MASK: u64 = ((1 << 47) - 1) & !STAMP_MASK & !SIGNPOST_BIT;
/// Bit 47 of the stored tag: the **end mark** ([`Entry::is_end`]).
const END_BIT: u64 = 1 << 47;

/// The second key of a mirrored last block ([`IndexConfig::mirror_from`]):
/// the block key with fixed bits flipped, so that the keyed slot hash puts
/// it in a slot (and gives it a tag) independent of the block's own.
pub fn mirror_key(key: u64) -> u64 {
    key ^ 0x9e37_79b9_7f4a_7c15
}

/// Tag of a block key (its bits 9–46, never 0; bit 47 of the stored tag is
/// the end mark, bit 8 the signpost, bits 0–7 the length stamp).
pub fn tag_of(key: u64) -> u64 {
    match key & TAG_MASK {
        0 => SIGNPOST_BIT << 1,
        t => t,
    }
}

impl Entry {
    /// Encode.
    pub fn encode(&self) -> SlotValue {
        let mut v = [0u8; ENTRY_BYTES];
        v[..6].copy_from_slice(&self.tag.to_le_bytes()[..6]);
        v[6..10].copy_from_slice(&self.time.to_le_bytes());
        for (i, h) in self.holders.iter().enumerate() {
            let x = h.map_or(0, |r| r.saturating_add(1));
            v[10 + 2 * i..12 + 2 * i].copy_from_slice(&x.to_le_bytes());
        }
        v
    }

    /// Decode (`None` for an empty value).
    pub fn decode(v: &SlotValue) -> Option<Entry> {
        let mut t = [0u8; 8];
        t[..6].copy_from_slice(&v[..6]);
        let tag = u64::from_le_bytes(t);
        if tag == 0 {
            return None;
        }
        let time = u32::from_le_bytes([v[6], v[7], v[8], v[9]]);
        let mut holders = [None; MAX_HOLDERS];
        for (i, h) in holders.iter_mut().enumerate() {
            let x = u16::from_le_bytes([v[10 + 2 * i], v[11 + 2 * i]]);
            *h = x.checked_sub(1);
        }
        Some(Entry { tag, time, holders })
    }

    /// The end mark: some recorded prompt ended with this block (its last
    /// block, closed at a message boundary) or in the block after it (its
    /// last whole block, when the last one is a partial block that a
    /// continuation does not share). See [`PrefixIndex::record`].
    pub fn is_end(&self) -> bool {
        self.tag & END_BIT != 0
    }

    /// Is this a **signpost**: a block on the search path to an end mark,
    /// written by a record with its own replica alone
    /// ([`IndexConfig::end_marks`])? A lookup passes through it on its way
    /// to the mark but never returns it (module docs, "Signposts").
    pub fn is_signpost(&self) -> bool {
        self.tag & SIGNPOST_BIT != 0 && !self.is_end()
    }

    /// The tag without the end mark, the signpost bit and the length stamp.
    pub fn key_tag(&self) -> u64 {
        self.tag & TAG_MASK
    }

    /// The stored tag without the length stamp: the key, the end mark and
    /// the signpost bit (what a peer's merge compares, [`crate::peers::merge`]).
    pub fn marked_key(&self) -> u64 {
        self.tag & !STAMP_MASK
    }

    /// The same entry with the length stamp `stamp`.
    pub fn with_stamp(self, stamp: u8) -> Entry {
        Entry {
            tag: self.marked_key() | u64::from(stamp),
            ..self
        }
    }

    /// The **length stamp** (module docs): the block count (at most 255)
    /// of the last recorded request that went on past this block as its
    /// deepest known one; 0: none.
    pub fn stamp(&self) -> u8 {
        (self.tag & STAMP_MASK) as u8
    }

    /// Holders, most recent first.
    pub fn holders(&self) -> impl Iterator<Item = usize> + '_ {
        self.holders.iter().flatten().map(|&h| h as usize)
    }

    /// `r` moved (or added) to the front; the oldest holder drops off.
    pub fn with_front(&self, r: u16) -> [Option<u16>; MAX_HOLDERS] {
        distinct_holders(std::iter::once(r).chain(self.holders.iter().flatten().copied()))
    }
}

/// The first [`MAX_HOLDERS`] distinct replicas of `order`, in that order
/// (the holder list of an entry: front first). O(`MAX_HOLDERS`) per item.
fn distinct_holders(order: impl Iterator<Item = u16>) -> [Option<u16>; MAX_HOLDERS] {
    let mut out = [None; MAX_HOLDERS];
    let mut m = 0;
    for h in order {
        if m == MAX_HOLDERS {
            break;
        }
        if !out[..m].contains(&Some(h)) {
            out[m] = Some(h);
            m += 1;
        }
    }
    out
}

/// Deciseconds from milliseconds (the entry clock; wraps every 13.6 years).
pub fn decis(now_ms: u64) -> u32 {
    (now_ms / 100) as u32
}

/// Result of a lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Known {
    /// Blocks of the request's prefix known to the index (≥ 1).
    pub depth: usize,
    /// The entry of block `depth − 1`.
    pub entry: Entry,
    /// Its age, milliseconds.
    pub age_ms: u64,
    /// The routing decision made of this lookup was a spill
    /// ([`crate::affinity::Reason::Spill`], the second tier's included)
    /// that writes its replica under its depth: set by the caller after the
    /// decision ([`Known::spilled`]; the router marks a spill in a fleet of
    /// more than [`MAX_HOLDERS`] replicas,
    /// [`crate::affinity::writes_new_holder`]), read by the record
    /// ([`NewHolder::Spill`]). False from a lookup.
    pub spill: bool,
}

impl Known {
    /// Depth `depth` with entry `entry`, aged at `now_ms`.
    pub fn at(depth: usize, entry: Entry, now_ms: u64) -> Known {
        Known {
            depth,
            entry,
            age_ms: u64::from(decis(now_ms).wrapping_sub(entry.time)) * 100,
            spill: false,
        }
    }

    /// This lookup with the decision made of it: `spill` when the request
    /// was routed as a spill, to be passed to [`PrefixIndex::record`] and
    /// [`PrefixIndex::record_pending`] ([`IndexConfig::new_holder_known`]).
    pub fn spilled(self, spill: bool) -> Known {
        Known { spill, ..self }
    }
}

/// Which records write their new holder into the shallower known ladder
/// blocks ([`IndexConfig::new_holder_known`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NewHolder {
    /// None.
    Off,
    /// Every record to a replica that does not hold the deepest known
    /// block: spills and cold placements under a known prefix.
    Placed,
    /// Spills only ([`Known::spill`]; the default): a cold placement under
    /// a known short prefix (a new holder the rule did not pick for that
    /// prefix) writes nothing below its depth. The caller decides which
    /// spills it marks ([`crate::affinity::writes_new_holder`]: in a fleet
    /// larger than an entry's holder list).
    #[default]
    Spill,
}

/// Gets of [`PrefixIndex::lookup_shallow`] at most (the ladder positions
/// it probes under the deepest known block, galloping: the 1st, 2nd and
/// 4th below it).
pub const SHALLOW_PROBES: usize = 3;

/// Index parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexConfig {
    /// Slots in the table.
    pub slots: u32,
    /// Largest number of new ladder blocks written per request.
    pub max_writes: usize,
    /// Significant bits of ladder positions (1 = powers of two; more = denser).
    pub ladder_bits: u32,
    /// Rewrite the known ladder blocks too (repairs collisions), not only the
    /// new ones.
    pub rewrite_known: bool,
    /// **New holder of a known prefix** ([`PrefixIndex::record`],
    /// [`PrefixIndex::record_pending`]): a record for a replica that is not
    /// a holder of the deepest known block (a spill, a cold placement under
    /// a known prefix) also writes the replica, first, into the known ladder
    /// blocks below that block, merged with their current holders (one get
    /// and one set each, within `max_writes`). That replica now caches the
    /// whole known prefix; without it only the deepest known block and the
    /// deeper ones list it, so a later request that shares a shallower part
    /// of the prefix (a system prompt and a document under another
    /// question) sees the old holders alone and waits behind them while
    /// the new holder is idle. Records to an existing holder are unchanged,
    /// so the extra writes are those of spills and known-prefix cold
    /// placements ([`NewHolder::Placed`]) or of spills only
    /// ([`NewHolder::Spill`], the default: the caller marks the lookup,
    /// [`Known::spilled`], and marks a spill only in a fleet larger than
    /// [`MAX_HOLDERS`], [`crate::affinity::writes_new_holder`]). Why the
    /// default and the fleet gate: `docs/benchmarks.md`, "Twenty-third
    /// session" (over 352 simulator runs, hit passes 340 → 343, p90 passes
    /// 305 → 308; every 7-replica run unchanged).
    pub new_holder_known: NewHolder,
    /// Seed of the keyed slot hash (per process; see the module docs).
    pub secret: u64,
    /// Write end marks ([`Entry::is_end`]) with their search paths, whose
    /// blocks are **signposts** ([`Entry::is_signpost`]). On by default
    /// since the twenty-sixth session; off in a filter with `peers`
    /// ([`crate::router::index_config`]). The `n − 2` block (the last whole
    /// block when the last one is partial) lets the next step of a session
    /// find its previous step under a long shared prompt, where the ladder
    /// has no position between the shared prompt's depth and the session's
    /// (`agent` at 32 replicas: 502 of 572 later steps went to another
    /// replica without it). The search paths are written with the
    /// recording replica alone and run through a shared prompt's last
    /// blocks; a lookup that stopped there saw one holder instead of the
    /// ladder block's several (`agent` at 16: p90 +30 %, twenty-second
    /// session), so a lookup never answers with a signpost: it returns the
    /// end mark its search reaches, else the ladder block. Measured
    /// against off (twenty-sixth session, `docs/benchmarks.md`): agent at
    /// 32 replicas hit passes 0 → 3 of 3 in sample and 0 → 3 of 3 on fresh
    /// seeds; 263 in-sample runs hit 260 → 261, p90 231 → 232; 29
    /// fresh-seed runs hit 25 → 28, p90 23 → 23. Costs more sets per
    /// request (agent at 32: 3.7 → 5.6) and peer traffic.
    pub end_marks: bool,
    /// Without `end_marks`: still mark the request's last block (no search
    /// path, no `n − 2` mark), which `record` writes anyway: no extra set.
    /// A longer prompt finds that mark when the block is on its lookup's
    /// path (a ladder position: every block up to 8, then four per octave),
    /// e.g. turn 2 of a conversation after a short first prompt and a long
    /// answer ([`crate::affinity`], `continuation`).
    pub last_mark: bool,
    /// **Merging records** ([`PrefixIndex::record`]): before rewriting the
    /// deepest known block, read its entry again (one get) and keep the
    /// holders written since the lookup (a spill's new holder) behind the
    /// recorded replica, so that a request looked up before a spill and
    /// answered after it does not erase the spill's holder.
    pub merge_record: bool,
    /// Significant bits of the ladder positions the **peers** publish
    /// (`peers.publish_bits`, [`crate::peers_log::PeerLadder`]); 0 or
    /// ≥ `ladder_bits`: all of them. Below `ladder_bits` a prefix learned
    /// from a peer has its coarse positions only, so [`PrefixIndex::lookup`]
    /// searches the coarse positions first, then the fine ones between the
    /// coarse hit and the coarse miss (the known fine positions are not
    /// contiguous there; a plain binary search over them would stop at a
    /// missing one).
    pub peer_bits: u32,
    /// **Mirrored last block** ([`mirror_key`]): from this many
    /// blocks (a prompt that fills the hashed window: `prefix_length /
    /// BLOCK_UNITS`, set by [`crate::Router::new`]), the request's last
    /// block is also written at a second, independent slot, and a lookup
    /// whose last block is missing probes it. 0: off.
    pub mirror_from: usize,
    /// **Ways per set** ([`Sets`]): 1 = direct-mapped; 4 (the default,
    /// [`SLOTS_PER_KEY`]: the filter's one shared-data value per set) = a
    /// key lives in one of the four slots `slot ^ i`, a write taking the
    /// key's own place, else an empty one, else the one used least
    /// recently. Powers of two up to 8 (more than [`SLOTS_PER_KEY`] would
    /// cost the filter a get per key of the set).
    pub ways: u32,
    /// Entries older than this are stale (the affinity TTL, set by
    /// [`crate::Router::new`]; 0: unknown). Only ranks a set's victims:
    /// a stale entry goes first, a pending one counts from its write
    /// ([`pending_elapsed_ms`]).
    pub max_age_ms: u64,
}

impl IndexConfig {
    /// The set layout of this table.
    pub fn sets(&self) -> Sets {
        Sets {
            ways: self.ways.clamp(1, 8).next_power_of_two(),
            slots: self.slots.max(1),
            max_age_ms: self.max_age_ms,
        }
    }
}

/// **Set-associative placement.** A key's slot `s` (from the keyed hash,
/// [`PrefixIndex::place`]) names its set: the `ways` slots `s ^ i`
/// (`i < ways`, inside the table), which differ only in their low bits,
/// so a set is `ways` adjacent slots. A probe reads them own slot first
/// and stops at the key's tag; a write ([`Sets::write_slot`]) reads the
/// set and takes the slot holding the key, else the first empty or stale
/// one, else the least recently used (own slot on ties).
///
/// Why: a direct-mapped table loses a key whenever another live key
/// hashes to its slot, whatever their ages, so at 39 % occupancy about a
/// fifth of the live keys are lost; with two ways a write evicts the older
/// of two entries, and a key is lost only when both slots hold newer keys
/// (the simulator's full-scale chat workload at 16 and 32 replicas: hit
/// rate +0.4 points, `docs/benchmarks.md`, "Twenty-fifth session"). Two
/// ways still lost a live key whenever two newer ones landed in its set:
/// in that workload at 32 replicas (262 144 slots, 54 % in use) 341 of
/// 35 600 next turns found only the system prompt, their first turn's
/// end mark evicted in the 10–60 s before they came, 0.2 points of hit
/// rate; with four ways 76 (with 1 048 576 two-way slots, 27), and the
/// full-scale chat rows reach the best baseline's hit rate
/// (`docs/benchmarks.md`, "Twenty-eighth session"). Cost: a probe that
/// misses its own slot reads the set's other slots, and a write reads its
/// set first; the filter stores a set's slots under one shared-data key
/// ([`SLOTS_PER_KEY`]), so either is one get (as [`VecStore`] counts it)
/// and a scan of four 24-byte entries. Invariant: a key is written to at most one slot of its
/// set by one write; two copies of one key (two gateways' writes merged
/// into different ways) are both valid, the probe reads the first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sets {
    /// Slots per set (a power of two, 1–8).
    pub ways: u32,
    /// Slots in the table.
    pub slots: u32,
    /// [`IndexConfig::max_age_ms`].
    pub max_age_ms: u64,
}

impl Sets {
    /// The slots of `slot`'s set, `slot` first.
    pub fn of(self, slot: u32) -> impl Iterator<Item = u32> {
        (0..self.ways)
            .map(move |i| slot ^ i)
            .filter(move |&s| s < self.slots)
    }

    /// Do slots `a` and `b` belong to one set?
    pub fn same(self, a: u32, b: u32) -> bool {
        a ^ b < self.ways
    }

    /// The slot a peer batch carries for an entry with tag `tag` written
    /// at `slot`: its key's own slot (in a power-of-two table its low bits
    /// are the tag's key bits 32 and up), so the wire's slot follows from
    /// the tag as for a direct-mapped table ([`crate::peers`], "Slots");
    /// the receiver merges into the set either way. `slot` itself when
    /// that cannot be told (one way, another table size).
    pub fn wire_slot(self, slot: u32, tag: u64) -> u32 {
        if self.ways < 2 || !self.slots.is_power_of_two() {
            return slot;
        }
        let way = self.ways - 1;
        let own = (slot & !way) | ((tag >> 32) as u32 & way);
        if own < self.slots {
            own
        } else {
            slot
        }
    }

    /// How long ago entry `e` was last used, for choosing a victim at
    /// `now` (decis): its age, or since its write for a pending entry;
    /// `u64::MAX − 1` when stale (as good as empty), 0 when from the
    /// future (another clock).
    fn idle_ms(self, e: &Entry, now: u32) -> u64 {
        let d = now.wrapping_sub(e.time);
        if d > u32::MAX / 2 {
            return 0;
        }
        let age = u64::from(d) * 100;
        if self.max_age_ms == 0 {
            return age;
        }
        match pending_elapsed_ms(age, self.max_age_ms) {
            Some(since) => since,
            None if age > self.max_age_ms => u64::MAX - 1,
            None => age,
        }
    }

    /// The slot of `slot`'s set that a write of the key with tag `tag`
    /// (its [`Entry::key_tag`]) takes at `now` (decis): the one holding the
    /// key, else the first empty, else the least recently used (stale ones
    /// first; own slot on ties). One get per way (none with one way).
    pub fn write_slot<S: SlotStore>(self, store: &S, slot: u32, tag: u64, now: u32) -> u32 {
        if self.ways < 2 {
            return slot;
        }
        let mut best = (slot, 0u64);
        for s in self.of(slot) {
            let idle = match store.get(s).and_then(|v| Entry::decode(&v)) {
                Some(e) if e.key_tag() == tag => return s,
                Some(e) => self.idle_ms(&e, now),
                None => u64::MAX,
            };
            if idle > best.1 || s == slot {
                best = (s, idle);
            }
        }
        best.0
    }
}

impl Default for IndexConfig {
    fn default() -> Self {
        IndexConfig {
            slots: 1 << 18,
            max_writes: 32,
            ladder_bits: 3,
            rewrite_known: false,
            new_holder_known: NewHolder::Spill,
            secret: 0,
            end_marks: true,
            last_mark: true,
            merge_record: true,
            peer_bits: 0,
            mirror_from: 0,
            ways: SLOTS_PER_KEY,
            max_age_ms: 0,
        }
    }
}

/// Is block position `p` on the ladder with `bits` significant bits?
pub fn on_ladder(p: usize, bits: u32) -> bool {
    let m = p + 1;
    let len = usize::BITS - m.leading_zeros();
    len <= bits || m & ((1usize << (len - bits.max(1))) - 1) == 0
}

/// The first ladder position at or after `p`.
pub fn next_ladder(p: usize, bits: u32) -> usize {
    (p..).find(|&q| on_ladder(q, bits)).unwrap_or(p)
}

/// The blocks that [`PrefixIndex::lookup`]'s binary search of the gap after
/// the deepest ladder position below `top` probes and finds known on its way
/// to block `top − 1` (empty when `top − 1` is a ladder position or `top` is
/// 0): at most `⌈log2(gap + 1)⌉` positions, ascending, the last one
/// `top − 1`.
pub fn gap_path(top: usize, bits: u32) -> impl Iterator<Item = usize> {
    let start = (0..top)
        .rev()
        .find(|&p| on_ladder(p, bits))
        .map_or(0, |p| p + 1);
    let (mut a, mut b) = (
        start,
        if start < top {
            next_ladder(top, bits)
        } else {
            start
        },
    );
    std::iter::from_fn(move || {
        while a < b {
            let mid = a + (b - a) / 2;
            if mid < top {
                a = mid + 1;
                return Some(mid);
            }
            b = mid;
        }
        None
    })
}

/// Copy `items` into `buf` (at most its length); returns how many.
fn fill(buf: &mut [usize], items: impl Iterator<Item = usize>) -> usize {
    let mut m = 0;
    for (slot, p) in buf.iter_mut().zip(items) {
        *slot = p;
        m += 1;
    }
    m
}

/// Ladder positions below `n`, ascending.
pub fn ladder(n: usize, bits: u32) -> impl Iterator<Item = usize> {
    (0..n).filter(move |&p| on_ladder(p, bits))
}

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Which end marks a write sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Marks {
    /// None (a pending record).
    None,
    /// The last block only ([`IndexConfig::last_mark`]).
    Last,
    /// Both marks and their search paths ([`IndexConfig::end_marks`]).
    Paths,
}

/// What a write sets besides the key bits of the tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flag {
    None,
    /// The end mark ([`Entry::is_end`]).
    End,
    /// A signpost ([`Entry::is_signpost`]).
    Signpost,
}

impl Flag {
    /// The end mark or nothing.
    fn end(mark: bool) -> Flag {
        if mark {
            Flag::End
        } else {
            Flag::None
        }
    }
    /// A block of a search path: its end mark, or a signpost on the way.
    fn path(mark: bool) -> Flag {
        if mark {
            Flag::End
        } else {
            Flag::Signpost
        }
    }
    fn bits(self) -> u64 {
        match self {
            Flag::None => 0,
            Flag::End => END_BIT,
            Flag::Signpost => SIGNPOST_BIT,
        }
    }
}

/// How [`PrefixIndex::write`] writes a record.
#[derive(Debug, Clone, Copy)]
struct Write {
    /// The entries' time, ms: the present, or set back for a pending record.
    at_ms: u64,
    /// The clock's present, deciseconds: ranks the ways of a set (a
    /// pending entry is ranked from its write, not from `at_ms`).
    now: u32,
    marks: Marks,
    /// Merge the deepest known block's current holders (one get).
    merge: bool,
    /// Only the blocks past the known depth ([`PendingBlocks::PastKnown`]).
    past: bool,
}

/// The index logic (stateless; the state is the [`SlotStore`]).
#[derive(Debug, Clone, Copy)]
pub struct PrefixIndex {
    cfg: IndexConfig,
    /// `cfg.sets()`, derived once.
    sets: Sets,
}

impl PrefixIndex {
    /// An index with `cfg`.
    pub fn new(cfg: IndexConfig) -> PrefixIndex {
        let cfg = IndexConfig {
            slots: cfg.slots.max(1),
            ..cfg
        };
        PrefixIndex {
            cfg,
            sets: cfg.sets(),
        }
    }

    /// Parameters.
    pub fn config(&self) -> IndexConfig {
        self.cfg
    }

    /// The table's set layout ([`IndexConfig::sets`]).
    pub fn sets(&self) -> Sets {
        self.sets
    }

    /// Slot and tag of a block key: both from the keyed hash.
    pub fn place(&self, key: u64) -> (u32, u64) {
        let k = xxh3_64_with_seed(&key.to_le_bytes(), self.cfg.secret);
        let slot = ((k >> 32) % u64::from(self.cfg.slots.max(1))) as u32;
        (slot, tag_of(k))
    }

    /// Slot of a block key.
    pub fn slot(&self, key: u64) -> u32 {
        self.place(key).0
    }

    fn probe<S: SlotStore>(&self, store: &S, key: u64) -> Option<Entry> {
        let (slot, tag) = self.place(key);
        self.sets.of(slot).find_map(|s| {
            store
                .get(s)
                .and_then(|v| Entry::decode(&v))
                .filter(|e| e.key_tag() == tag)
        })
    }

    /// Write a fresh-or-updated entry of `key` (no length stamp); `now`:
    /// the clock's present (decis), which `time` lags in a pending record;
    /// `flag`: [`Flag::Signpost`] for a block of a search path, else the end
    /// mark or none.
    fn put<S: SlotStore>(
        &self,
        store: &mut S,
        key: u64,
        (time, flag, now): (u32, Flag, u32),
        holders: [Option<u16>; MAX_HOLDERS],
    ) {
        self.put_stamped(store, key, (time, flag, 0), holders, now);
    }

    /// [`PrefixIndex::put`] with the length stamp `stamp`.
    fn put_stamped<S: SlotStore>(
        &self,
        store: &mut S,
        key: u64,
        (time, flag, stamp): (u32, Flag, u8),
        holders: [Option<u16>; MAX_HOLDERS],
        now: u32,
    ) {
        let (slot, tag) = self.place(key);
        let slot = self.sets.write_slot(store, slot, tag, now);
        let tag = tag | flag.bits() | u64::from(stamp);
        store.set(slot, Entry { tag, time, holders }.encode());
    }

    /// Longest known prefix of `blocks` (see the module docs); `None` when
    /// nothing is known. At most `1 + ⌈log2(ladder positions + 1)⌉` gets,
    /// one more when a mirrored last block ([`IndexConfig::mirror_from`])
    /// is missing (with [`IndexConfig::peer_bits`]: the deepest ladder position, then
    /// the search over the coarse positions, then the one or few fine
    /// positions between the coarse hit and the coarse miss).
    pub fn lookup<S: SlotStore>(&self, store: &S, blocks: &[u64], now_ms: u64) -> Option<Known> {
        let n = blocks.len();
        let last = *blocks.last()?;
        if let Some(e) = self.probe(store, last).filter(|e| !e.is_signpost()) {
            return Some(Known::at(n, e, now_ms));
        }
        if let Some(e) = self
            .mirrored(n)
            .then(|| self.probe(store, mirror_key(last)))
            .flatten()
        {
            return Some(Known::at(n, e, now_ms));
        }
        let bits = self.cfg.ladder_bits;
        // Ladder positions below the last block.
        let mut pos = [0usize; 64];
        let m = fill(&mut pos, ladder(n - 1, bits));
        let (&top, below) = pos[..m].split_last()?;
        let coarse = self.cfg.peer_bits;
        let (deepest, mut best) = if coarse == 0 || coarse >= bits {
            self.search(store, blocks, &pos[..m], now_ms)?
        } else if let Some(e) = self.probe(store, blocks[top]) {
            // A deep prefix known here: one get, as without `peer_bits`.
            (top, Known::at(top + 1, e, now_ms))
        } else {
            // Peers publish only the coarse positions: the known ones
            // among the fine positions need not be contiguous, the coarse
            // ones are. Search those, then the fine positions between the
            // deepest known coarse one and the next (unknown) one.
            let mut cpos = [0usize; 64];
            let c = fill(
                &mut cpos,
                below.iter().copied().filter(|&p| on_ladder(p, coarse)),
            );
            let (at, k) = self.search(store, blocks, &cpos[..c], now_ms)?;
            let upper = cpos[..c].iter().copied().find(|&p| p > at).unwrap_or(top);
            let mut fine = [0usize; 64];
            let f = fill(
                &mut fine,
                below.iter().copied().filter(|&p| p > at && p < upper),
            );
            self.search(store, blocks, &fine[..f], now_ms)
                .unwrap_or((at, k))
        };
        // Between the deepest known ladder position and the next (unknown)
        // one, blocks written by `confirm` (engine-confirmed depths) extend
        // the known prefix contiguously: binary search them too (no get when
        // the gap is empty, ≤ log2(gap) + 1 otherwise).
        // The gap's right end is the next ladder position even when this
        // request ends before it (blocks past its end count as unknown), so
        // the search path is the one `confirm` and `record` write for any
        // depth in the gap, whatever the length of the request.
        // Signposts (a record's search paths to its end marks) guide the
        // search; the answer is the end mark it reaches, else the ladder
        // block (module docs, "Signposts").
        let ladder_known = best;
        let (mut a, mut b) = (deepest + 1, next_ladder(deepest + 1, bits));
        while a < b {
            let mid = a + (b - a) / 2;
            let probed = if mid + 1 < n { blocks.get(mid) } else { None };
            match probed.and_then(|&key| self.probe(store, key)) {
                Some(e) => {
                    best = Known::at(mid + 1, e, now_ms);
                    a = mid + 1;
                }
                None => b = mid,
            }
        }
        if best.entry.is_signpost() {
            return Some(ladder_known);
        }
        Some(best)
    }

    /// The deepest known position of `pos` (ascending block positions, a
    /// known prefix of them assumed), with what is known there: gallop down
    /// from the deepest (deep shared prefixes are the common case and are
    /// found with one probe; a hole left by a colliding key below the
    /// first hit cannot hide it), then binary search between the first hit
    /// and the last miss. `None` when none is known. At most
    /// `2 ⌈log2(pos.len() + 1)⌉` gets.
    fn search<S: SlotStore>(
        &self,
        store: &S,
        blocks: &[u64],
        pos: &[usize],
        now_ms: u64,
    ) -> Option<(usize, Known)> {
        let m = pos.len();
        let mut miss = m; // pos[miss..] unknown
        let mut step = 1usize;
        let mut i = m.checked_sub(1)?;
        let (mut lo, mut best) = loop {
            if let Some(e) = self.probe(store, blocks[pos[i]]) {
                break (i, Known::at(pos[i] + 1, e, now_ms));
            }
            miss = i;
            if i == 0 {
                return None;
            }
            i = i.saturating_sub(step);
            step *= 2;
        };
        // Invariant: pos[lo] known (best), pos[miss] unknown.
        let (mut a, mut hi) = (lo + 1, miss);
        while a < hi {
            let mid = a + (hi - a) / 2;
            match self.probe(store, blocks[pos[mid]]) {
                Some(e) => {
                    best = Known::at(pos[mid] + 1, e, now_ms);
                    lo = mid;
                    a = mid + 1;
                }
                None => hi = mid,
            }
        }
        Some((pos[lo], best))
    }

    /// The **second tier** of a lookup: under `deep` (what
    /// [`PrefixIndex::lookup`] found for `blocks`), a shallower ladder
    /// block whose holders include a replica that `deep`'s holders do not,
    /// with its depth; `None` when no probed block has one.
    ///
    /// Why: a later step of a session has one holder of its deepest block
    /// (its first step's replica), while the replicas that hold only the
    /// shared prefix under it (a system prompt) would re-prefill just the
    /// session's own blocks; and the holders that a hot prefix's entry
    /// dropped (at most [`MAX_HOLDERS`] per entry) stay on the ladder
    /// blocks under it, which were written before. The spill rule prices a
    /// move to such a replica by the tokens it lacks ([`crate::affinity`],
    /// "Second tier").
    ///
    /// It probes the ladder positions strictly under block `deep.depth − 1`,
    /// galloping down from the deepest (the 1st, 2nd, 4th, … below it), at
    /// most [`SHALLOW_PROBES`] gets; the first present block with such a
    /// holder is returned. The blocks between a session's shared prefix and
    /// its deepest block were written by the session alone (its holders
    /// only), so the first such block found is at or under the shared
    /// prefix's deepest ladder block.
    ///
    /// Cost: at most [`SHALLOW_PROBES`] gets, made only when the decision
    /// asks (the spill rule found a move worth pricing,
    /// [`crate::affinity::choose_tiered`]). Invariants: the depth
    /// returned is `< deep.depth` and its block is
    /// present with its exact tag (never a false prefix: blocks are
    /// chained); some holder of the entry returned is not a holder of
    /// `deep`.
    pub fn lookup_shallow<S: SlotStore>(
        &self,
        store: &S,
        blocks: &[u64],
        deep: &Known,
        now_ms: u64,
    ) -> Option<Known> {
        let top = deep.depth.min(blocks.len()).checked_sub(1)?;
        let bits = self.cfg.ladder_bits;
        let mut below = (0..top).rev().filter(|&p| on_ladder(p, bits));
        // Gallop: skip 0, 0, 1, 3, … positions between probes.
        let mut skip = 0usize;
        for probe in 0..SHALLOW_PROBES {
            let p = below.nth(skip)?;
            skip = (1usize << probe).saturating_sub(1);
            let Some(e) = blocks.get(p).and_then(|&key| self.probe(store, key)) else {
                continue;
            };
            if e.holders().any(|h| !deep.entry.holders().any(|d| d == h)) {
                return Some(Known::at(p + 1, e, now_ms));
            }
        }
        None
    }

    /// The engine confirmed (its `cached_tokens`) that `replica` holds the
    /// first `depth` blocks of `blocks`: write, with the holders of `known`
    /// (what the request's lookup found) and `r` in front as `record` does,
    /// the blocks that [`PrefixIndex::lookup`]'s binary search of the gap
    /// after the deepest ladder position below `depth` probes on its way to
    /// block `depth − 1` and finds known (the probes at or below it), so that
    /// the lookup finds this exact depth for every request sharing it (a
    /// shared system prompt rarely ends on a ladder position). Only the
    /// search path is written, not the whole gap: at most `⌈log2(gap + 1)⌉`
    /// sets (≤ 5 for 256 blocks with 3 bits, against up to 31 for the gap),
    /// so confirmations do not crowd other prefixes out of the table. The
    /// search's right end is the next ladder position, where requests longer
    /// than it stop; a request that ends earlier or diverges inside the gap
    /// finds a shallower lower bound (never a false depth: blocks are
    /// chained). Returns the number of sets.
    pub fn confirm<S: SlotStore>(
        &self,
        store: &mut S,
        blocks: &[u64],
        depth: usize,
        known: Option<&Known>,
        replica: usize,
        now_ms: u64,
    ) -> usize {
        let top = depth.min(blocks.len());
        let r = replica.min(u16::MAX as usize - 1) as u16;
        let holders = known.map_or_else(
            || distinct_holders(std::iter::once(r)),
            |k| k.entry.with_front(r),
        );
        let end = known.is_some_and(|k| k.depth == top && k.entry.is_end());
        // The known block keeps its length stamp.
        let stamp = known
            .filter(|k| k.depth == top)
            .map_or(0, |k| k.entry.stamp());
        let time = decis(now_ms);
        let mut sets = 0;
        for p in gap_path(top, self.cfg.ladder_bits) {
            if let Some(&key) = blocks.get(p) {
                let at = p + 1 == top;
                let t = (time, Flag::end(end && at), stamp * u8::from(at));
                self.put_stamped(store, key, t, holders, time);
                sets += 1;
            }
        }
        sets
    }

    /// A **pending** record, at routing, of a request placed on a replica that
    /// did not hold its prefix (cold or spill): [`PrefixIndex::record`] with
    /// the entries' time set back so that they look `max_age_ms −
    /// PENDING_MS` old. The record after the response (2xx) rewrites them at
    /// the current time; if no response confirms them (the engine refused the
    /// request) they turn stale after [`PENDING_MS`] and lookups ignore them.
    /// Meanwhile requests with the same new prefix that arrive before the
    /// first response (a burst, a fan-out) find it and meet on the same
    /// replica instead of being placed cold one by one. `which`: every
    /// block, or only those past the known prefix for a request kept on a
    /// holder of it ([`PendingBlocks`]). Same cost as `record` without the
    /// end mark (a continuation comes after the response, whose record
    /// writes it): ≤ `max_writes + 3` sets (the mirror: see
    /// [`IndexConfig::mirror_from`]).
    pub fn record_pending<S: SlotStore>(
        &self,
        store: &mut S,
        blocks: &[u64],
        known: Option<&Known>,
        replica: usize,
        (now_ms, max_age_ms): (u64, u64),
        which: PendingBlocks,
    ) -> usize {
        let at = now_ms.saturating_sub(pending_offset_ms(max_age_ms));
        // The last-block mark is written here too, with end marks as
        // without (a continuation cannot come before the response; the
        // confirming record then writes the same tag, so peers see a
        // confirmation, published when the request moved its prefix, not a
        // new block, published only past `min_publish_chars`: without it a
        // conversation's first turn placed on a new replica stayed unknown
        // to the other gateways, twenty-sixth session).
        let marks = if self.cfg.last_mark || self.cfg.end_marks {
            Marks::Last
        } else {
            Marks::None
        };
        let how = Write {
            at_ms: at,
            now: decis(now_ms),
            marks,
            merge: false,
            past: which == PendingBlocks::PastKnown,
        };
        self.write(store, blocks, known, replica, how)
    }

    /// Record that the request with `blocks` went to `replica` (see the module
    /// docs). `known` is what [`PrefixIndex::lookup`] returned for it. Returns
    /// the number of sets. With [`IndexConfig::merge_record`] the deepest
    /// known block is read again first (one get) and its holders written
    /// since the lookup are kept behind `replica` (a request looked up
    /// before a spill and answered after it does not erase the spill's
    /// holder); the pending record ([`PrefixIndex::record_pending`], at
    /// routing, right after the lookup) does not.
    pub fn record<S: SlotStore>(
        &self,
        store: &mut S,
        blocks: &[u64],
        known: Option<&Known>,
        replica: usize,
        now_ms: u64,
    ) -> usize {
        let marks = match (self.cfg.end_marks, self.cfg.last_mark) {
            (true, _) => Marks::Paths,
            (false, true) => Marks::Last,
            (false, false) => Marks::None,
        };
        let how = Write {
            at_ms: now_ms,
            now: decis(now_ms),
            marks,
            merge: self.cfg.merge_record,
            past: false,
        };
        self.write(store, blocks, known, replica, how)
    }

    /// Would [`PrefixIndex::record`] of `blocks` for `replica` (with
    /// `known`, the routing lookup) only refresh the time of an entry
    /// younger than `fresh_ms`? Then the caller may skip the write (the
    /// filter's one shared-data set after a warm hit's 2xx).
    ///
    /// True exactly when the record is one set that rewrites the slot with
    /// the same tag (end mark included) and the same holders: an exact
    /// repeat (`known.depth` = the request's blocks; without
    /// `rewrite_known`, which would rewrite the other ladder blocks), with
    /// `replica` already the front holder, and the entry written less than
    /// `fresh_ms` before `now_ms` (a time in the future is never fresh).
    /// Every other record (a new holder or a reorder, a deeper prefix, a
    /// mark the write would drop, a pending entry: its time is set back by
    /// `max_age − PENDING_MS`, far beyond any bound [`refresh_skip_ms`]
    /// gives) writes as before. O(holders), no store access.
    ///
    /// What skipping changes: the entry's time lags its last use by less
    /// than `fresh_ms`, so every rule that reads entry ages (the TTL,
    /// eviction horizons of [`crate::feedback`], the peers' refresh
    /// horizon) sees the entry at most `fresh_ms` older than it is; a
    /// colliding key that overwrote the slot since the lookup is not
    /// overwritten back (the approximation the table already makes).
    pub fn record_unneeded(
        &self,
        blocks: &[u64],
        known: Option<&Known>,
        replica: usize,
        (now_ms, fresh_ms): (u64, u64),
    ) -> bool {
        let Some(k) = known else { return false };
        let n = blocks.len();
        if n == 0 || k.depth != n || (self.cfg.rewrite_known && n > 1) {
            return false;
        }
        let r = replica.min(u16::MAX as usize - 1) as u16;
        // `write` keeps the mark of an exact repeat only when marks are on.
        let marks = self.cfg.end_marks || self.cfg.last_mark;
        let keeps_mark = !k.entry.is_end() || marks;
        let age_ms = u64::from(decis(now_ms).wrapping_sub(k.entry.time)) * 100;
        keeps_mark && k.entry.with_front(r) == k.entry.holders && age_ms < fresh_ms
    }

    /// The holders to write on the deepest known block `key` (entry
    /// `seen` at the lookup) for replica `r`: `r` first, then the holders
    /// the entry has now (one get, with `merge` on: holders a spill or
    /// another record added since the lookup), then those `seen` showed
    /// (still there unless the current entry is full), at most
    /// [`MAX_HOLDERS`]. Without `merge` or when the slot now holds another
    /// key: `seen.with_front(r)`, no get.
    fn merged_front<S: SlotStore>(
        &self,
        store: &S,
        key: u64,
        seen: &Entry,
        r: u16,
        merge: bool,
    ) -> [Option<u16>; MAX_HOLDERS] {
        let Some(now) = merge.then(|| self.probe(store, key)).flatten() else {
            return seen.with_front(r);
        };
        let order = now.holders.iter().chain(seen.holders.iter()).flatten();
        distinct_holders(std::iter::once(r).chain(order.copied()))
    }

    /// `record` and `record_pending`: write the entries as `how` says.
    fn write<S: SlotStore>(
        &self,
        store: &mut S,
        blocks: &[u64],
        known: Option<&Known>,
        replica: usize,
        how: Write,
    ) -> usize {
        let Write {
            at_ms,
            now,
            marks,
            merge,
            past,
        } = how;
        let (paths, marks) = (marks == Marks::Paths, marks != Marks::None);
        let Some(&last) = blocks.last() else {
            return 0;
        };
        let n = blocks.len();
        let r = replica.min(u16::MAX as usize - 1) as u16;
        let time = decis(at_ms);
        let fresh = distinct_holders(std::iter::once(r));
        let alone = Entry {
            tag: 0,
            time,
            holders: fresh,
        };
        let mut sets = 0;
        let depth = known.map_or(0, |k| k.depth.min(n));
        let bits = self.cfg.ladder_bits;
        // `new_holder_known`: `r` takes the known prefix over; its shallower
        // ladder blocks get `r` too, merged (a read even in a pending record).
        let spread = known.is_some_and(|k| {
            let rule = match self.cfg.new_holder_known {
                NewHolder::Off => false,
                NewHolder::Placed => true,
                NewHolder::Spill => k.spill,
            };
            rule && depth > 1 && !k.entry.holders().any(|h| h == replica)
        });
        // The end mark goes on the last block, position `n − 1` (it ends at
        // a message boundary, so the next turn shares it), and on the one
        // before, `n − 2` (the last whole block when the last one is a
        // partial block that a longer prompt does not share: a completions
        // string), each with the lookup's search path to it, and only when
        // that block is new to the index: a block that an earlier prompt
        // contained too is shared (a system prompt under which short prompts
        // end), and its mark would make every prompt under it look like a
        // continuation. The deepest known block, shared by definition, is
        // rewritten without a mark for the same reason.
        let end_at = if paths && n >= 2 && n - 1 > depth {
            n - 1
        } else {
            0
        };
        let mark_last = marks && depth < n;
        // `past`: the known blocks are left as they are
        // ([`PendingBlocks::PastKnown`]).
        if let Some(k) = known.filter(|_| depth > 0 && !past) {
            // An exact repeat (a retry, the same prompt again) keeps its
            // mark: it proves no other prompt shares the block.
            let keep = Flag::end(depth == n && marks && k.entry.is_end());
            // The length stamp: this request's block count when it goes on
            // past the block (module docs), else (an exact repeat) kept.
            let stamp = if depth < n {
                n.min(usize::from(u8::MAX)) as u8
            } else {
                k.entry.stamp()
            };
            let key = blocks[depth - 1];
            let holders = self.merged_front(store, key, &k.entry, r, merge);
            self.put_stamped(store, key, (time, keep, stamp), holders, now);
            sets += 1;
            if depth == n && self.mirrored(n) {
                self.put_stamped(store, mirror_key(key), (time, keep, stamp), holders, now);
                sets += 1;
            }
        }
        // Every ladder block but the deepest known one (written above), the
        // deepest first, so a request never loses the blocks nearest its own
        // depth to the `max_writes` cap.
        let mut budget = self.cfg.max_writes;
        for p in (0..n - 1)
            .rev()
            .filter(|&p| on_ladder(p, bits) && p + 1 != depth)
            .filter(|&p| p >= depth || (!past && (self.cfg.rewrite_known || spread)))
        {
            if budget == 0 {
                break;
            }
            // A known ladder block (`rewrite_known`, `new_holder_known`)
            // keeps its current holders behind `r` with the merge (one get
            // each).
            let holders = if p < depth {
                self.merged_front(store, blocks[p], &alone, r, merge || spread)
            } else {
                fresh
            };
            let flag = Flag::end(p + 1 == end_at);
            self.put(store, blocks[p], (time, flag, now), holders);
            sets += 1;
            budget -= 1;
        }
        // The search paths to the end marks (nothing when they are ladder
        // positions, written above, or known already); the two paths share
        // most positions, each is written once.
        let mut written = [usize::MAX; 64];
        let mut w = 0;
        for p in gap_path(end_at, bits).filter(|&p| p >= depth) {
            if let Some(&key) = blocks.get(p) {
                let flag = Flag::path(p + 1 == end_at);
                self.put(store, key, (time, flag, now), fresh);
                sets += 1;
                if let Some(x) = written.get_mut(w) {
                    *x = p;
                    w += 1;
                }
            }
        }
        let last_path = gap_path(if mark_last && paths { n } else { 0 }, bits);
        for p in last_path.filter(|&p| p >= depth && p + 1 < n && !written[..w].contains(&p)) {
            if let Some(&key) = blocks.get(p) {
                self.put(store, key, (time, Flag::Signpost, now), fresh);
                sets += 1;
            }
        }
        if depth < n {
            self.put(store, last, (time, Flag::end(mark_last), now), fresh);
            sets += 1;
            if self.mirrored(n) {
                let flag = Flag::end(mark_last);
                self.put(store, mirror_key(last), (time, flag, now), fresh);
                sets += 1;
            }
        }
        sets
    }

    /// Is the last block of a request with `n` blocks mirrored
    /// ([`IndexConfig::mirror_from`])?
    fn mirrored(&self, n: usize) -> bool {
        self.cfg.mirror_from > 0 && n >= self.cfg.mirror_from
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::hash_id;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn chain(prefix: u64, shared: usize, own: u64, n: usize) -> Vec<u64> {
        let mut h = prefix;
        (0..n)
            .map(|i| {
                h = if i < shared {
                    hash_id(&[h.to_le_bytes(), (i as u64).to_le_bytes()].concat())
                } else {
                    hash_id(&[h.to_le_bytes(), own.to_le_bytes()].concat())
                };
                h
            })
            .collect()
    }

    /// A 45-block request under the 40-block shared prefix `chain(1, 40,
    /// …)`, with its own blocks from `own`.
    fn under(own: u64) -> Vec<u64> {
        chain(1, 40, own, 45)
    }

    /// An index with `cfg` and an empty table of its size.
    fn table(cfg: IndexConfig) -> (PrefixIndex, VecStore) {
        (PrefixIndex::new(cfg), VecStore::new(cfg.slots))
    }

    /// [`table`] with the default config, end marks `on` or off.
    fn marks(on: bool) -> (PrefixIndex, VecStore) {
        table(IndexConfig {
            end_marks: on,
            ..IndexConfig::default()
        })
    }

    /// Look `blocks` up and record them on `r` with what was found (the
    /// filter's order), at `now_ms`; returns what was found.
    fn route(
        idx: &PrefixIndex,
        st: &mut VecStore,
        blocks: &[u64],
        r: usize,
        now_ms: u64,
    ) -> Option<Known> {
        let k = idx.lookup(st, blocks, now_ms);
        idx.record(st, blocks, k.as_ref(), r, now_ms);
        k
    }

    #[test]
    fn slot_keys_match_the_formatted_form() {
        let mut buf = String::new();
        for slot in [
            0u32,
            1,
            9,
            10,
            15,
            16,
            255,
            4096,
            65535,
            0xdead_beef,
            u32::MAX,
        ] {
            slot_key_into(&mut buf, "prefix_router/p/00ff/", slot);
            assert_eq!(buf, format!("prefix_router/p/00ff/i/{slot:x}"));
        }
    }

    #[test]
    fn entry_roundtrip() {
        let e = Entry {
            tag: tag_of(0xdead_beef_cafe_f00d),
            time: 77,
            holders: pad([Some(3), Some(0), None]),
        };
        assert_eq!(Entry::decode(&e.encode()), Some(e));
        assert_eq!(Entry::decode(&[0; ENTRY_BYTES]), None);
        assert_eq!(e.with_front(0), pad([Some(0), Some(3), None]));
        assert_eq!(e.with_front(9), pad([Some(9), Some(3), Some(0)]));
        assert_eq!(tag_of(1 << 48), 1 << 9);
        assert_eq!(
            tag_of(0x1ff),
            1 << 9,
            "the stamp and signpost bits are not key bits"
        );
    }

    #[test]
    fn ladder_positions() {
        let l: Vec<usize> = ladder(40, 3).collect();
        assert_eq!(
            l,
            vec![0, 1, 2, 3, 4, 5, 6, 7, 9, 11, 13, 15, 19, 23, 27, 31, 39]
        );
        assert_eq!(ladder(256, 3).count(), 28);
        let p2: Vec<usize> = ladder(20, 1).collect();
        assert_eq!(p2, vec![0, 1, 3, 7, 15]);
    }

    #[test]
    fn a_full_window_s_last_block_survives_the_loss_of_its_slot() {
        // A prompt filling the window (256 blocks) whose last block's slot
        // is taken by a colliding key: without the mirror the lookup falls
        // back to the deepest ladder block under it (224 of 256), and the
        // prompt past the window (`beyond_window`) is no longer counted.
        let a = chain(7, 256, 0, 256);
        for (from, depth) in [(256, 256), (0, 224), (257, 224)] {
            let (idx, mut st) = table(IndexConfig {
                mirror_from: from,
                ..unmarked()
            });
            let sets = idx.record(&mut st, &a, None, 3, 0);
            // 27 ladder blocks under the last one, the last one, its mirror.
            assert_eq!(sets, 28 + usize::from(from == 256), "mirror_from {from}");
            let slot = idx.slot(a[255]);
            let other = Entry {
                tag: 1 << 9,
                time: 0,
                holders: pad([Some(6), None, None]),
            };
            st.set(slot, other.encode());
            let k = idx.lookup(&st, &a, 1000).unwrap();
            assert_eq!(
                (k.depth, k.entry.holders[0]),
                (depth, Some(3)),
                "mirror_from {from}"
            );
            // The next record of the same prompt rewrites the lost slot.
            idx.record(&mut st, &a, Some(&k), 4, 2000);
            let k = idx.lookup(&st, &a, 2000).unwrap();
            assert_eq!(k.depth, 256, "mirror_from {from}");
        }
        // A prompt shorter than `mirror_from` writes no mirror.
        let (idx, mut st) = table(IndexConfig {
            mirror_from: 256,
            ..unmarked()
        });
        assert_eq!(idx.record(&mut st, &a[..200], None, 3, 0), 27);
    }

    /// `N` block keys whose own slot is the same (key 1's), in a `slots` table.
    fn same_slot<const N: usize>(idx: &PrefixIndex) -> [u64; N] {
        let want = idx.slot(1);
        let mut k = (1u64..).filter(|&k| idx.slot(k) == want);
        std::array::from_fn(|_| k.next().unwrap_or(0))
    }

    #[test]
    fn two_ways_keep_two_keys_of_a_slot_and_evict_the_least_recently_used() {
        for ways in [1, 2] {
            let (idx, mut st) = table(IndexConfig {
                slots: 64,
                ways,
                ..IndexConfig::default()
            });
            let [a, b, c] = same_slot(&idx);
            let found = |st: &VecStore, k: u64, now: u64| idx.lookup(st, &[k], now).is_some();
            idx.record(&mut st, &[a], None, 1, 0);
            idx.record(&mut st, &[b], None, 2, 10_000);
            assert_eq!(
                (found(&st, a, 10_000), found(&st, b, 10_000)),
                (ways == 2, true)
            );
            if ways == 1 {
                continue;
            }
            // `a` used again: `b` is now the least recently used.
            let k = idx.lookup(&st, &[a], 20_000);
            idx.record(&mut st, &[a], k.as_ref(), 1, 20_000);
            idx.record(&mut st, &[c], None, 3, 30_000);
            let got = [a, b, c].map(|k| found(&st, k, 30_000));
            assert_eq!(got, [true, false, true]);
            // Rewriting a key stays in its slot (no second copy).
            let used = st.occupied();
            idx.record(&mut st, &[c], None, 4, 31_000);
            assert_eq!(st.occupied(), used);
        }
    }

    #[test]
    fn the_default_four_ways_keep_four_keys_of_a_slot_and_evict_the_least_recently_used() {
        let (idx, mut st) = table(IndexConfig {
            slots: 64,
            ..IndexConfig::default()
        });
        assert_eq!(idx.sets().ways, 4);
        let want = idx.slot(1);
        let keys: [u64; 5] = same_slot(&idx);
        let found = |st: &VecStore, k: u64, now: u64| idx.lookup(st, &[k], now).is_some();
        for (i, &k) in keys[..4].iter().enumerate() {
            idx.record(&mut st, &[k], None, 1, 10_000 * i as u64);
        }
        assert!(keys[..4].iter().all(|&k| found(&st, k, 40_000)));
        // The first used again: the second is the least recently used.
        let k0 = idx.lookup(&st, &[keys[0]], 50_000);
        idx.record(&mut st, &[keys[0]], k0.as_ref(), 1, 50_000);
        idx.record(&mut st, &[keys[4]], None, 2, 60_000);
        let got: Vec<bool> = keys.iter().map(|&k| found(&st, k, 60_000)).collect();
        assert_eq!(got, [true, false, true, true, true]);
        // One shared-data key per set: a lookup reads the set with one get.
        st.new_callback();
        let g = st.gets();
        assert!(keys
            .iter()
            .all(|&k| idx.slot(k) / SLOTS_PER_KEY == want / SLOTS_PER_KEY));
        let _ = idx.lookup(&st, &[keys[3]], 60_000);
        assert_eq!(st.gets() - g, 1);
    }

    #[test]
    fn a_peer_batch_names_a_key_by_its_own_slot_whichever_way_it_is_in() {
        // Two and four ways (the layouts before and since the twenty-eighth
        // session) name an entry alike, so either merges the other's batch.
        for (slots, ways) in [64u32, 1 << 16, 1 << 18, 3000]
            .into_iter()
            .flat_map(|s| [(s, 2), (s, 4)])
        {
            let (idx, mut st) = table(IndexConfig {
                slots,
                ways,
                ..IndexConfig::default()
            });
            let sets = idx.sets();
            let [a, b, _] = same_slot(&idx);
            idx.record(&mut st, &[a], None, 1, 0);
            idx.record(&mut st, &[b], None, 2, 1000);
            // `b` went to the partner of its own slot.
            let own = idx.slot(b);
            let partner = own ^ 1;
            let v = st.get(partner).and_then(|v| Entry::decode(&v));
            if partner >= slots {
                continue;
            }
            let e = v.expect("b in the partner slot");
            assert_eq!(e.key_tag(), idx.place(b).1);
            // Power-of-two tables: the own slot, from the tag's key bits;
            // another size: the slot as it is (the wire carries it whole).
            let want = if slots.is_power_of_two() {
                own
            } else {
                partner
            };
            assert_eq!(sets.wire_slot(partner, e.tag), want, "{slots}");
            assert_eq!(sets.wire_slot(own, e.tag), own, "{slots}");
            // One way: always the slot itself.
            let one = Sets { ways: 1, ..sets };
            assert_eq!(one.wire_slot(partner, e.tag), partner);
        }
    }

    #[test]
    fn a_pending_entry_counts_from_its_write_and_a_stale_one_goes_first() {
        let max_age = 600_000;
        // Two ways: three keys of one slot compete for them.
        let (idx, mut st) = table(IndexConfig {
            slots: 64,
            max_age_ms: max_age,
            ways: 2,
            ..IndexConfig::default()
        });
        let [a, b, c] = same_slot(&idx);
        // `a` confirmed at 1000 s, `b` pending at 1100 s (its time set
        // back by 570 s: older than `a` on the clock, but written after it).
        idx.record(&mut st, &[a], None, 1, 1_000_000);
        let pending = (1_100_000, max_age);
        idx.record_pending(&mut st, &[b], None, 2, pending, PendingBlocks::All);
        idx.record(&mut st, &[c], None, 3, 1_101_000);
        let got = |st: &VecStore, now| [a, b, c].map(|k| idx.lookup(st, &[k], now).is_some());
        assert_eq!(got(&st, 1_101_000), [false, true, true]);
        // 40 s on, `b` was never confirmed: stale after its 30 s, it goes
        // before `c` (written 40 s ago).
        idx.record(&mut st, &[a], None, 1, 1_141_000);
        assert_eq!(got(&st, 1_141_000), [true, false, true]);
    }

    #[test]
    fn known_prefix_and_holders() {
        // The ladder alone (end marks: see `end_marks_find_continuations`).
        let (idx, mut st) = marks(false);
        let a = chain(1, 40, 100, 48);
        assert_eq!(idx.lookup(&st, &a, 0), None);
        assert!(st.gets() <= 7, "cold lookup: last block + gallop");
        // Ladder below 47: 17 positions up to 39, plus the last block; each
        // set is read first to place the entry in it (one get; the record
        // after the response is another callback than the lookup).
        st.new_callback();
        let g = st.gets();
        assert_eq!(idx.record(&mut st, &a, None, 2, 0), 18);
        assert!((17..=18).contains(&(st.gets() - g)), "{}", st.gets() - g);
        // A request sharing 40 blocks: known up to ladder position 39, on 2.
        let b = under(200);
        st.new_callback();
        let g = st.gets();
        let k = idx.lookup(&st, &b, 1000).unwrap();
        assert_eq!((k.depth, k.entry.holders[0], k.age_ms), (40, Some(2), 1000));
        assert!(st.gets() - g <= 5, "{}", st.gets() - g);
        // Routed elsewhere: block 39 now has two holders, newest first.
        idx.record(&mut st, &b, Some(&k), 5, 1000);
        let k = idx.lookup(&st, &under(300), 1000).unwrap();
        assert_eq!(k.depth, 40);
        assert_eq!(k.entry.holders, pad([Some(5), Some(2), None]));
        // A request sharing 30 blocks: lower bound 28 (ladder 27).
        let d = chain(1, 30, 400, 45);
        assert_eq!(idx.lookup(&st, &d, 1000).unwrap().depth, 28);
        // Exact repeat: found with one get.
        let before = st.gets();
        let k = idx.lookup(&st, &a, 2000).unwrap();
        assert_eq!((k.depth, st.gets() - before), (48, 1));
    }

    #[test]
    fn the_second_tier_finds_dropped_holders_and_shared_prefixes() {
        let (idx, mut st) = table(IndexConfig::default());
        // A 40-block shared prefix, first routed to 0: every ladder block
        // [0]. Under it, replicas 1 ..= MAX_HOLDERS become holders of block
        // 39, and 0 drops off its entry.
        idx.record(&mut st, &chain(1, 40, 100, 48), None, 0, 0);
        for r in 1..=MAX_HOLDERS {
            route(&idx, &mut st, &under(100 * (r as u64 + 1)), r, 1000).unwrap();
        }
        let e = under(100 * (MAX_HOLDERS as u64 + 2));
        let deep = idx.lookup(&st, &e, 2000).unwrap();
        assert_eq!(deep.depth, 40);
        let newest_first: Vec<usize> = (1..=MAX_HOLDERS).rev().collect();
        assert_eq!(deep.entry.holders().collect::<Vec<_>>(), newest_first);
        let before = st.gets();
        let s = idx.lookup_shallow(&st, &e, &deep, 2000).unwrap();
        // Ladder position 31 (the first under 39) still names 0.
        assert_eq!((s.depth, s.entry.holders[0]), (32, Some(0)));
        assert_eq!(st.gets() - before, 1);
        // A later step of a session recorded on 1 over the shared prefix:
        // its deep blocks name 1 alone; the tier skips them down to the
        // shared prefix.
        route(&idx, &mut st, &chain(1, 40, 7, 60), 1, 3000).unwrap();
        let s2 = chain(1, 40, 7, 70);
        let deep = idx.lookup(&st, &s2, 4000).unwrap();
        assert_eq!(
            (deep.depth, deep.entry.holders),
            (60, pad([Some(1), None, None]))
        );
        // Probes 55 and 47 (the session's, [1]), then 31 (the gallop
        // skips 39): 0 holds the shared prefix up to 32 blocks (counted
        // in a callback of its own: after the lookup in the same one, the
        // sets it probed are kept).
        st.new_callback();
        let before = st.gets();
        let s = idx.lookup_shallow(&st, &s2, &deep, 4000).unwrap();
        assert_eq!(
            (s.depth, s.entry.holders[0], st.gets() - before),
            (32, Some(0), 3)
        );
        assert!(s.depth < deep.depth && s.entry.holders().any(|h| h != 1));
        // Nothing but the deep holders under it: None, after at most
        // SHALLOW_PROBES gets.
        let (idx, mut st) = table(IndexConfig::default());
        let a = chain(9, 40, 1, 48);
        idx.record(&mut st, &a, None, 4, 0);
        let deep = idx.lookup(&st, &chain(9, 40, 2, 45), 0).unwrap();
        let before = st.gets();
        assert_eq!(idx.lookup_shallow(&st, &a, &deep, 0), None);
        assert_eq!(st.gets() - before, SHALLOW_PROBES as u64);
        // Depth 1: nothing under it, no get.
        let one = Known { depth: 1, ..deep };
        let before = st.gets();
        assert_eq!(idx.lookup_shallow(&st, &a, &one, 0), None);
        assert_eq!(st.gets(), before);
    }

    #[test]
    fn a_stale_record_keeps_the_holders_written_since_its_lookup() {
        // Counts of reads without the search paths of end marks.
        let (idx, mut st) = table(unmarked());
        // A 40-block prefix held by 0 and 2; a request under it is looked
        // up while they were its only holders.
        idx.record(&mut st, &chain(1, 40, 100, 48), None, 2, 0);
        route(&idx, &mut st, &under(150), 0, 500).unwrap();
        let b = under(200);
        let stale = idx.lookup(&st, &b, 1000).unwrap();
        assert_eq!(stale.entry.holders, pad([Some(0), Some(2), None]));
        // A spill of another request to 1 records 1 in front.
        let s = under(300);
        let k = idx.lookup(&st, &s, 1000).unwrap();
        idx.record(&mut st, &s, Some(&k), 1, 1100);
        // The stale request answers on 0: the merge reads block 39 again
        // (one get, which also places its write), the last block's set is
        // read to place it (one get), and 1 stays.
        st.new_callback();
        let g = st.gets();
        idx.record(&mut st, &b, Some(&stale), 0, 1200);
        assert_eq!(st.gets() - g, 2);
        let now = idx.lookup(&st, &under(400), 2000).unwrap();
        assert_eq!(
            (now.depth, now.entry.holders),
            (40, pad([Some(0), Some(1), Some(2)]))
        );
        // Without the merge: only the placing reads, and the stale view
        // erases 1.
        let plain = PrefixIndex::new(IndexConfig {
            merge_record: false,
            ..unmarked()
        });
        plain.record(&mut st, &s, Some(&k), 1, 2100);
        st.new_callback();
        let g = st.gets();
        plain.record(&mut st, &b, Some(&stale), 0, 2200);
        assert_eq!(st.gets() - g, 2);
        let now = plain.lookup(&st, &under(400), 3000).unwrap();
        assert_eq!(now.entry.holders, pad([Some(0), Some(2), None]));
    }

    #[test]
    fn rewritten_known_ladder_blocks_keep_their_holders_with_the_merge() {
        for merge in [true, false] {
            let (idx, mut st) = table(IndexConfig {
                rewrite_known: true,
                merge_record: merge,
                ..IndexConfig::default()
            });
            idx.record(&mut st, &chain(1, 40, 100, 48), None, 2, 0);
            let b = under(200);
            let k = idx.lookup(&st, &b, 500).unwrap();
            assert_eq!(k.depth, 40);
            st.new_callback();
            let (g, sets) = (st.gets(), st.sets());
            idx.record(&mut st, &b, Some(&k), 0, 1000);
            // One get per set written (placing it in its set), none more
            // without the merge (its reads are those gets).
            let (gets, sets) = (st.gets() - g, st.sets() - sets);
            // Block 8 (a ladder position under the known depth).
            let e = idx.lookup(&st, &b[..8], 2000).unwrap();
            let want = if merge {
                pad([Some(0), Some(2), None])
            } else {
                pad([Some(0), None, None])
            };
            assert_eq!((e.depth, e.entry.holders), (8, want));
            assert!(gets <= sets, "{gets} gets for {sets} sets");
        }
    }

    #[test]
    fn a_new_holder_of_a_known_prefix_is_written_under_its_depth() {
        // Replica 2 holds a 40-block prefix; a request under it goes to 5
        // (a spill), then one sharing only its first 24 blocks looks up.
        let shallow = chain(1, 24, 300, 30);
        for on in [false, true] {
            let (idx, mut st) = table(IndexConfig {
                new_holder_known: if on {
                    NewHolder::Placed
                } else {
                    NewHolder::Off
                },
                ..unmarked()
            });
            idx.record(&mut st, &chain(1, 40, 100, 48), None, 2, 0);
            let b = under(200);
            let k = idx.lookup(&st, &b, 500).unwrap();
            assert_eq!(k.depth, 40);
            let sets =
                idx.record_pending(&mut st, &b, Some(&k), 5, (600, 600_000), PendingBlocks::All);
            let e = idx.lookup(&st, &shallow, 700).unwrap();
            let want = if on {
                pad([Some(5), Some(2), None])
            } else {
                pad([Some(2), None, None])
            };
            assert_eq!((e.depth, e.entry.holders), (24, want));
            // The confirming record merges again: no holder lost.
            idx.record(&mut st, &b, Some(&k), 5, 1000);
            let e = idx.lookup(&st, &shallow, 1100).unwrap();
            assert_eq!(e.entry.holders, want);
            // Extra sets only for the known ladder blocks below 40 (16).
            let base = if on { sets - 16 } else { sets };
            assert_eq!(base, 2, "the deepest known block and the last one");
            // A record to an existing holder writes nothing below its depth.
            let k = idx.lookup(&st, &under(400), 1200).unwrap();
            st.new_callback();
            let g = st.gets();
            idx.record(&mut st, &under(400), Some(&k), 2, 1300);
            assert_eq!(
                st.gets() - g,
                2,
                "block 39 (merge) and the last block's set"
            );
        }
    }

    #[test]
    fn a_new_holder_is_written_under_its_depth_for_spills_only() {
        // `NewHolder::Spill`: the same records as above, once as a cold
        // placement under the known prefix (the lookup unmarked), once as
        // a spill (marked by the caller); `Placed` writes both.
        let shallow = chain(1, 24, 300, 30);
        for (mode, spill, spread) in [
            (NewHolder::Spill, false, false),
            (NewHolder::Spill, true, true),
            (NewHolder::Placed, false, true),
            (NewHolder::Off, true, false),
        ] {
            let (idx, mut st) = table(IndexConfig {
                new_holder_known: mode,
                ..IndexConfig::default()
            });
            idx.record(&mut st, &chain(1, 40, 100, 48), None, 2, 0);
            let b = under(200);
            let k = idx.lookup(&st, &b, 500).unwrap();
            assert!(!k.spill, "a lookup is never a spill");
            let k = k.spilled(spill);
            let sets =
                idx.record_pending(&mut st, &b, Some(&k), 5, (600, 600_000), PendingBlocks::All);
            idx.record(&mut st, &b, Some(&k), 5, 1000);
            let e = idx.lookup(&st, &shallow, 1100).unwrap();
            let want = if spread {
                pad([Some(5), Some(2), None])
            } else {
                pad([Some(2), None, None])
            };
            assert_eq!(e.entry.holders, want, "{mode:?} spill {spill}");
            assert_eq!(sets, if spread { 18 } else { 2 }, "{mode:?} spill {spill}");
        }
    }

    #[test]
    fn lookup_cost_is_logarithmic_and_never_false() {
        let (idx, mut st) = table(IndexConfig {
            slots: 1 << 16,
            end_marks: false,
            ..IndexConfig::default()
        });
        let a = chain(9, 200, 1, 256);
        assert_eq!(idx.record(&mut st, &a, None, 1, 0), 28);
        for (shared, lower) in [
            (1usize, 1usize),
            (17, 16),
            (100, 96),
            (199, 192),
            (200, 192),
        ] {
            let b = chain(9, shared, 7, 256);
            let before = st.gets();
            let k = idx.lookup(&st, &b, 0).unwrap();
            assert_eq!(k.depth, lower, "shared {shared}");
            assert!(st.gets() - before <= 11);
        }
        let other = chain(10, 0, 3, 256);
        assert_eq!(idx.lookup(&st, &other, 0), None);
    }

    #[test]
    fn confirmed_depth_is_found_exactly() {
        let (idx, mut st) = table(IndexConfig::default());
        // A group of requests sharing 23 blocks (a 6,000-character system prompt).
        let a = chain(5, 23, 1, 25);
        idx.record(&mut st, &a, None, 2, 0);
        let b = chain(5, 23, 2, 25);
        assert_eq!(
            idx.lookup(&st, &b, 0).unwrap().depth,
            20,
            "ladder lower bound"
        );
        // The engine served b with 23 blocks cached: confirm them (the
        // search path of the gap 20..23: blocks 21 and 22).
        assert_eq!(idx.confirm(&mut st, &b, 23, None, 2, 0), 2);
        let c = chain(5, 23, 3, 25);
        let before = st.gets();
        let k = idx.lookup(&st, &c, 0).unwrap();
        assert_eq!((k.depth, k.entry.holders[0]), (23, Some(2)));
        assert!(st.gets() - before <= 9);
        // Confirming a ladder depth or nothing writes nothing; past the end is capped.
        assert_eq!(idx.confirm(&mut st, &b, 20, None, 2, 0), 0);
        assert_eq!(idx.confirm(&mut st, &b, 0, None, 2, 0), 0);
        assert_eq!(
            idx.confirm(&mut st, &b, 99, None, 2, 0),
            1,
            "after ladder position 23"
        );
        // An over-estimated depth is harmless: requests diverging earlier stop there.
        let d = chain(5, 22, 4, 25);
        assert_eq!(idx.lookup(&st, &d, 0).unwrap().depth, 22);
    }

    #[test]
    fn a_pending_record_past_the_known_prefix_leaves_the_known_blocks_as_they_are() {
        // A 40-block turn answered on replica 2, then its next turn (the 40
        // blocks and 24 more) kept there: the pending record past the known
        // prefix makes the 64-block prefix pending on 2 while the 40 known
        // blocks stay confirmed (not pending); the whole pending record
        // makes those look pending too, with more sets.
        let max_age = 600_000;
        let t0 = 1_000_000;
        let turn = chain(4, 40, 1, 40);
        let next = [turn.clone(), chain(turn[39], 0, 9, 24)].concat();
        let run = |past: bool| {
            let (idx, mut st) = table(IndexConfig::default());
            idx.record(&mut st, &turn, None, 2, t0);
            let known = idx.lookup(&st, &next, t0 + 50);
            assert_eq!(known.as_ref().map(|k| k.depth), Some(40));
            let which = if past {
                PendingBlocks::PastKnown
            } else {
                PendingBlocks::All
            };
            let at = (t0 + 50, max_age);
            let sets = idx.record_pending(&mut st, &next, known.as_ref(), 2, at, which);
            let deep = idx.lookup(&st, &next, t0 + 100).unwrap();
            let shallow = idx.lookup(&st, &turn, t0 + 100).unwrap();
            (sets, deep, shallow)
        };
        let (sets, deep, shallow) = run(true);
        assert_eq!((deep.depth, deep.entry.holders[0]), (64, Some(2)));
        assert!(pending_elapsed_ms(deep.age_ms, max_age).is_some());
        assert_eq!(shallow.depth, 40);
        assert_eq!(pending_elapsed_ms(shallow.age_ms, max_age), None);
        let (all_sets, _, shallow) = run(false);
        assert!(pending_elapsed_ms(shallow.age_ms, max_age).is_some());
        assert!(sets < all_sets, "{sets} against {all_sets}");
    }

    #[test]
    fn a_pending_record_is_found_at_once_and_turns_stale_unless_confirmed() {
        let (idx, mut st) = table(IndexConfig::default());
        let max_age = 600_000;
        let a = chain(4, 40, 1, 40);
        let t0 = 1_000_000;
        idx.record_pending(&mut st, &a, None, 2, (t0, max_age), PendingBlocks::All);
        let k = idx.lookup(&st, &a, t0 + 100).unwrap();
        assert_eq!((k.depth, k.entry.holders[0]), (40, Some(2)));
        assert!(k.age_ms <= max_age, "fresh at first: {}", k.age_ms);
        // Unconfirmed: stale after PENDING_MS.
        let k = idx.lookup(&st, &a, t0 + PENDING_MS + 200).unwrap();
        assert!(k.age_ms > max_age, "stale later: {}", k.age_ms);
        // Confirmed by the record after the response: fresh for max_age.
        idx.record(&mut st, &a, None, 2, t0 + 500);
        let k = idx.lookup(&st, &a, t0 + PENDING_MS + 200).unwrap();
        assert!(k.age_ms <= max_age, "{}", k.age_ms);
    }

    #[test]
    fn the_length_stamp_is_the_block_count_of_the_last_request_past_the_block() {
        let idx = PrefixIndex::new(unmarked());
        let mut st = VecStore::new(unmarked().slots);
        // A: 100 shared blocks and one of its own. Its blocks are new: no
        // stamp on the ladder block 95 that the next lookup finds.
        let a = chain(7, 100, 1, 101);
        idx.record(&mut st, &a, None, 1, 0);
        let b = chain(7, 100, 2, 101);
        let kb = idx.lookup(&st, &b, 0).unwrap();
        assert_eq!((kb.depth, kb.entry.stamp()), (96, 0));
        // B goes on past it: its record stamps block 95 with B's 101 blocks,
        // and the stamped entry is still found (not a key bit).
        idx.record(&mut st, &b, Some(&kb), 2, 0);
        let c = chain(7, 100, 3, 101);
        let kc = idx.lookup(&st, &c, 0).unwrap();
        assert_eq!((kc.depth, kc.entry.stamp()), (96, 101));
        assert_eq!(kc.entry.holders().collect::<Vec<_>>(), vec![2, 1]);
        // A conversation's next turn (A and 19 more blocks) meets the same
        // block and stamp; its record stamps its own length, capped at 255.
        let turn = chain(7, 100, 1, 120);
        let kt = idx.lookup(&st, &turn, 0).unwrap();
        assert_eq!((kt.depth, kt.entry.stamp()), (96, 101));
        let long = chain(7, 100, 4, 300);
        let kl = idx.lookup(&st, &long, 0).unwrap();
        idx.record(&mut st, &long, Some(&kl), 3, 0);
        assert_eq!(idx.lookup(&st, &c, 0).map(|k| k.entry.stamp()), Some(255));
        // An exact repeat keeps the stamp of its last block; the blocks a
        // record writes new carry none.
        let kr = idx.lookup(&st, &long, 0).unwrap();
        assert_eq!((kr.depth, kr.entry.stamp()), (300, 0));
        idx.record(&mut st, &c, Some(&kc), 4, 0);
        let again = idx.lookup(&st, &c, 0).unwrap();
        assert_eq!((again.depth, again.entry.stamp()), (101, 0));
        let short = &c[..96];
        let ks = idx.lookup(&st, short, 0).unwrap();
        assert_eq!((ks.depth, ks.entry.stamp()), (96, 101));
        idx.record(&mut st, short, Some(&ks), 5, 0);
        assert_eq!(
            idx.lookup(&st, short, 0).map(|k| k.entry.stamp()),
            Some(101)
        );
    }

    #[test]
    fn confirm_writes_only_the_search_path_and_is_found_at_every_depth() {
        let idx = PrefixIndex::new(IndexConfig::default());
        // A 200-block shared prefix: ladder positions 159 then 191; every
        // depth in the gap 160..=191 must be found exactly, with few sets.
        for depth in 161..=191 {
            let mut st = VecStore::new(IndexConfig::default().slots);
            let a = chain(9, depth, 1, 220);
            idx.record(&mut st, &a, None, 1, 0);
            let b = chain(9, depth, 2, 220);
            let sets = idx.confirm(&mut st, &b, depth, None, 3, 0);
            assert!((1..=5).contains(&sets), "depth {depth}: {sets} sets");
            let c = chain(9, depth, 3, 220);
            let k = idx.lookup(&st, &c, 0).unwrap();
            assert_eq!((k.depth, k.entry.holders[0]), (depth, Some(3)));
        }
    }

    #[test]
    fn a_coarse_peer_ladder_is_found_within_one_coarse_step() {
        // A 256-block prefix recorded here (the full 3-bit ladder), and a
        // peer's table holding only its 2-bit positions (what
        // `peers.publish_bits: 2` sends).
        let cfg = IndexConfig {
            slots: 1 << 16,
            end_marks: false,
            last_mark: false,
            ..IndexConfig::default()
        };
        let plain = PrefixIndex::new(cfg);
        let tolerant = PrefixIndex::new(IndexConfig {
            peer_bits: 2,
            ..cfg
        });
        let mut local = VecStore::new(1 << 16);
        let a = chain(5, 256, 1, 256);
        plain.record(&mut local, &a, None, 1, 0);
        let mut peer = VecStore::new(1 << 16);
        for p in ladder(256, 2) {
            let slot = plain.slot(a[p]);
            if let Some(v) = local.get(slot) {
                peer.set(slot, v);
            }
        }
        let (mut plain_short, mut local_gets) = (0, [0u64; 2]);
        for shared in 1..=250usize {
            let b = chain(5, shared, 1 << 40, 256);
            // The deepest coarse position at or below the shared depth.
            let coarse = (0..shared).rev().find(|&p| on_ladder(p, 2)).unwrap();
            let before = peer.gets();
            let found = tolerant.lookup(&peer, &b, 0).unwrap().depth;
            assert!(peer.gets() - before <= 13, "shared {shared}");
            assert!(found <= shared, "a lower bound: shared {shared}");
            assert!(found > coarse, "shared {shared}: {found} ≤ {coarse}");
            // Without the tolerance the binary search stops at a missing
            // fine position and loses more than a coarse step.
            if plain.lookup(&peer, &b, 0).map_or(0, |k| k.depth) <= coarse {
                plain_short += 1;
            }
            // On a table with the full ladder both find the same depth.
            for (i, idx) in [plain, tolerant].iter().enumerate() {
                let before = local.gets();
                let k = idx.lookup(&local, &b, 0).unwrap();
                local_gets[i] += local.gets() - before;
                let fine = (0..shared).rev().find(|&p| on_ladder(p, 3)).unwrap();
                assert_eq!(k.depth, fine + 1, "shared {shared}");
            }
        }
        assert!(plain_short > 0);
        // The same gets within 1 % (2 514 and 2 515 over these 250 depths:
        // one get more for the deepest position, one less for the coarse
        // search, one more for the fine position after it).
        assert!(local_gets[1] * 100 <= local_gets[0] * 101, "{local_gets:?}");
    }

    #[test]
    fn a_lost_shallow_slot_does_not_hide_a_deep_prefix() {
        let (idx, mut st) = marks(false);
        let a = chain(3, 120, 1, 128);
        idx.record(&mut st, &a, None, 4, 0);
        // Another key takes the slots of ladder positions 7 and 31.
        for p in [7usize, 31] {
            let v = Entry {
                tag: tag_of(!a[p]),
                time: 0,
                holders: pad([Some(0), None, None]),
            };
            st.set(idx.slot(a[p]), v.encode());
        }
        let b = chain(3, 120, 2, 128);
        let k = idx.lookup(&st, &b, 0).unwrap();
        assert_eq!((k.depth, k.entry.holders[0]), (112, Some(4)));
        // Unrelated chains are never reported known.
        for seed in 10..60 {
            assert_eq!(idx.lookup(&st, &chain(seed, 0, seed, 64), 0), None);
        }
    }

    #[test]
    fn end_marks_find_continuations() {
        let (idx, mut st) = marks(true);
        // Turn 1: 45 blocks, the last one partial; its last whole block (43)
        // is in the ladder gap 40..47.
        let t1 = chain(5, 44, 1, 45);
        let sets = idx.record(&mut st, &t1, None, 2, 0);
        // 17 ladder positions below 44, the last block, ≤ 3 + 3 path blocks.
        assert!((19..=24).contains(&sets), "{sets} sets");
        // Turn 2 extends turn 1's whole blocks, longer or shorter than the
        // next ladder position (47): found exactly, with the end mark.
        for n in [46, 60, 200] {
            let t2 = chain(5, 44, 9, n);
            let k = idx.lookup(&st, &t2, 1000).unwrap();
            assert_eq!(
                (k.depth, k.entry.is_end()),
                (44, true),
                "turn 2 of {n} blocks"
            );
            assert_eq!(k.entry.holders[0], Some(2));
        }
        // Blocks closed at message ends: turn 2 shares turn 1's last block
        // too and finds all of turn 1, marked (turn 1's last block, 44, is
        // in the gap 40..47; a search that went past the mark on 43 used to
        // find 44 unmarked).
        for n in [46, 47, 60, 200] {
            let t2 = chain(5, 44, 1, n);
            let k = idx.lookup(&st, &t2, 1000).unwrap();
            assert_eq!((k.depth, k.entry.is_end()), (45, true), "closed, {n}");
        }
        // An exact repeat: one get, marked.
        let k = idx.lookup(&st, &t1, 1000).unwrap();
        assert_eq!((k.depth, k.entry.is_end()), (45, true));
        // A prompt sharing less (same first 42 blocks): a lower bound, no mark.
        let other = chain(5, 42, 9, 60);
        let k = idx.lookup(&st, &other, 1000).unwrap();
        assert!(k.depth <= 42 && !k.entry.is_end());
        // Off: the ladder's lower bound only, no mark.
        let (off, mut st) = marks(false);
        off.record(&mut st, &t1, None, 2, 0);
        let k = off.lookup(&st, &chain(5, 44, 9, 60), 1000).unwrap();
        assert_eq!((k.depth, k.entry.is_end()), (40, false));
    }

    #[test]
    fn signposts_guide_the_search_but_are_never_the_answer() {
        let (idx, mut st) = marks(true);
        // Two sessions under one 42-block prompt (past the ladder block 39)
        // with two blocks of their own, on replicas 2 and 3: the search path
        // to their end marks (block 42, then 43) runs through the shared
        // block 41.
        route(&idx, &mut st, &chain(5, 42, 1, 44), 2, 0);
        route(&idx, &mut st, &chain(5, 42, 2, 44), 3, 100);
        let shared = chain(5, 42, 3, 60);
        assert!(idx.probe(&st, shared[41]).is_some_and(|e| e.is_signpost()));
        // A third session meets that signpost (written by the last session
        // alone) and answers with the ladder block, which both hold.
        let k = idx.lookup(&st, &shared, 1000).unwrap();
        assert_eq!(k.depth, 40);
        assert!(!k.entry.is_signpost() && !k.entry.is_end());
        let h: Vec<usize> = k.entry.holders().collect();
        assert!(h.contains(&2) && h.contains(&3), "{h:?}");
        // The next turn of the first session reaches its end mark through it.
        let next = idx.lookup(&st, &chain(5, 42, 1, 60), 1000).unwrap();
        let found = (next.depth, next.entry.is_end(), next.entry.holders[0]);
        assert_eq!(found, (44, true, Some(2)));
        // An engine-confirmed depth is an answer, not a signpost.
        idx.confirm(&mut st, &shared, 42, Some(&k), 4, 2000);
        let k = idx.lookup(&st, &chain(5, 42, 7, 60), 3000).unwrap();
        let found = (k.depth, k.entry.is_signpost(), k.entry.holders[0]);
        assert_eq!(found, (42, false, Some(4)));
        // Off: no signposts, the same ladder block.
        let (off, mut st) = marks(false);
        route(&off, &mut st, &chain(5, 42, 1, 44), 2, 0);
        assert_eq!(off.lookup(&st, &shared, 1000).map(|k| k.depth), Some(40));
    }

    #[test]
    fn the_last_block_mark_costs_no_set_and_finds_short_first_turns() {
        let (idx, mut st) = table(unmarked());
        let (plain, mut st_plain) = table(IndexConfig {
            last_mark: false,
            ..unmarked()
        });
        // Turn 1: a system prompt (4 blocks) and a short question (1 block).
        let t1 = chain(3, 4, 1, 5);
        let sets = idx.record(&mut st, &t1, None, 2, 0);
        assert_eq!(sets, plain.record(&mut st_plain, &t1, None, 2, 0));
        // Turn 2 after a long answer: 30 blocks, all of turn 1 known, marked
        // (a continuation whatever its coverage); without the mark, not.
        let t2: Vec<u64> = t1.iter().copied().chain(chain(9, 0, 9, 25)).collect();
        let k = idx.lookup(&st, &t2, 1000).unwrap();
        assert_eq!((k.depth, k.entry.is_end()), (5, true));
        let k = plain.lookup(&st_plain, &t2, 1000).unwrap();
        assert_eq!((k.depth, k.entry.is_end()), (5, false));
        // A pending record writes the same mark (its confirmation then
        // changes no tag); an exact repeat keeps it.
        let (idx, mut st) = table(unmarked());
        idx.record_pending(&mut st, &t1, None, 2, (0, 600_000), PendingBlocks::All);
        let k = idx.lookup(&st, &t2, 1000).unwrap();
        assert_eq!((k.depth, k.entry.is_end()), (5, true));
        let k = idx.lookup(&st, &t1, 1000);
        idx.record(&mut st, &t1, k.as_ref(), 2, 0);
        let k = idx.lookup(&st, &t2, 1000).unwrap();
        assert_eq!((k.depth, k.entry.is_end()), (5, true));
        // A second prompt sharing turn 1's blocks removes the mark.
        let k = idx.lookup(&st, &t2, 1000).unwrap();
        idx.record(&mut st, &t2, Some(&k), 4, 0);
        let other: Vec<u64> = t1.iter().copied().chain(chain(8, 0, 8, 25)).collect();
        let k = idx.lookup(&st, &other, 2000).unwrap();
        assert_eq!((k.depth, k.entry.is_end()), (5, false));
        // With end marks too: the confirming record rewrites the last block
        // with the tag the pending record gave it (peers see a confirmation).
        let (idx, mut st) = marks(true);
        idx.record_pending(&mut st, &t1, None, 2, (0, 600_000), PendingBlocks::All);
        let pending = idx.probe(&st, t1[4]).unwrap();
        assert!(pending.is_end());
        let k = idx.lookup(&st, &t1, 1000);
        idx.record(&mut st, &t1, k.as_ref(), 2, 1000);
        assert_eq!(idx.probe(&st, t1[4]).map(|e| e.tag), Some(pending.tag));
    }

    #[test]
    fn a_shared_block_loses_its_end_mark() {
        let (idx, mut st) = marks(true);
        // A short prompt ends just after a 3-block system prompt: its mark
        // lands on the system prompt's last block.
        let x = chain(7, 3, 1, 4);
        idx.record(&mut st, &x, None, 1, 0);
        let y = chain(7, 3, 2, 4);
        let k = idx.lookup(&st, &y, 0).unwrap();
        assert_eq!((k.depth, k.entry.is_end()), (3, true));
        // A second prompt under it proves the block shared: recorded, the
        // mark is gone, and it marks nothing it already knew.
        idx.record(&mut st, &y, Some(&k), 4, 0);
        let z = chain(7, 3, 3, 30);
        let k = idx.lookup(&st, &z, 0).unwrap();
        assert_eq!((k.depth, k.entry.is_end()), (3, false));
        assert_eq!(k.entry.holders, pad([Some(4), Some(1), None]));
    }

    #[test]
    fn slots_depend_on_the_secret() {
        let cfg = |secret| IndexConfig {
            slots: 65536,
            secret,
            ..IndexConfig::default()
        };
        let (a, b) = (PrefixIndex::new(cfg(0x1234)), PrefixIndex::new(cfg(0x5678)));
        // Someone who knows the text (so the block keys) but not the secret
        // predicts the slots at chance level (1/65536 each).
        let keys = chain(42, 1000, 0, 1000);
        let guessed = keys.iter().filter(|&&k| a.slot(k) == b.slot(k)).count();
        assert!(guessed <= 2, "{guessed} of 1000 slots predicted");
        let unkeyed = PrefixIndex::new(cfg(0));
        let guessed = keys
            .iter()
            .filter(|&&k| a.slot(k) == unkeyed.slot(k))
            .count();
        assert!(
            guessed <= 2,
            "{guessed} of 1000 slots predicted without the secret"
        );
        // An index written under one secret reads as empty under another.
        let mut st = VecStore::new(65536);
        a.record(&mut st, &keys[..64], None, 1, 0);
        assert!(a.lookup(&st, &keys[..64], 0).is_some());
        assert_eq!(b.lookup(&st, &keys[..64], 0), None);
    }

    /// `record_unneeded` is true exactly when `record` would change nothing
    /// but the time of an entry younger than the bound; a table that skips
    /// those records answers every lookup like one that writes them all,
    /// with ages at most the bound apart.
    #[test]
    fn a_record_is_skipped_only_when_it_would_refresh_a_fresh_entry() {
        let fresh_ms = refresh_skip_ms(600_000, None);
        assert_eq!(fresh_ms, REFRESH_SKIP_MS);
        assert_eq!(refresh_skip_ms(5_000, None), 50);
        assert_eq!(refresh_skip_ms(600_000, Some(0)), 0);
        let configs = [
            IndexConfig::default(),
            IndexConfig {
                last_mark: false,
                ..IndexConfig::default()
            },
            IndexConfig {
                end_marks: true,
                ..IndexConfig::default()
            },
            IndexConfig {
                rewrite_known: true,
                ..IndexConfig::default()
            },
        ];
        let prefixes: Vec<Vec<u64>> = (0..4).map(|i| chain(10 + i, 30, i, 30)).collect();
        let mut seed = 12_345u64;
        let mut rand = |n: u64| {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            (seed >> 33) % n
        };
        let (mut skipped, mut written) = (0, 0);
        for cfg in configs {
            let idx = PrefixIndex::new(cfg);
            let mut skipping = VecStore::new(cfg.slots);
            let mut always = VecStore::new(cfg.slots);
            let mut now = 1_000_000u64;
            for step in 0..600 {
                now += [0, 40, 100, 300, 900, 1_500, 20_000][rand(7) as usize];
                let p = &prefixes[rand(4) as usize];
                let blocks = &p[..[1, 2, 7, 16, 30][rand(5) as usize]];
                let r = if rand(3) > 0 { 0 } else { rand(4) as usize };
                if rand(10) == 0 {
                    // A pending record (cold placement) in both tables.
                    let k = idx.lookup(&always, blocks, now);
                    idx.record_pending(
                        &mut always,
                        blocks,
                        k.as_ref(),
                        r,
                        (now, 600_000),
                        PendingBlocks::All,
                    );
                    let k = idx.lookup(&skipping, blocks, now);
                    idx.record_pending(
                        &mut skipping,
                        blocks,
                        k.as_ref(),
                        r,
                        (now, 600_000),
                        PendingBlocks::All,
                    );
                    continue;
                }
                let known = idx.lookup(&skipping, blocks, now);
                let unneeded = idx.record_unneeded(blocks, known.as_ref(), r, (now, fresh_ms));
                // What the record would change, by slot.
                let mut probe = skipping.clone();
                let sets = idx.record(&mut probe, blocks, known.as_ref(), r, now);
                let time_only = probe.slots.iter().zip(&skipping.slots).all(|(n, o)| {
                    n == o
                        || match (Entry::decode(n), Entry::decode(o)) {
                            (Some(n), Some(o)) => n.tag == o.tag && n.holders == o.holders,
                            _ => false,
                        }
                });
                let fresh = known.is_some_and(|k| k.age_ms < fresh_ms);
                assert_eq!(
                    unneeded,
                    sets == 1 && time_only && fresh,
                    "step {step}, {cfg:?}: sets {sets}, time only {time_only}, known {known:?}"
                );
                if unneeded {
                    skipped += 1;
                } else {
                    skipping = probe;
                    written += 1;
                }
                route(&idx, &mut always, blocks, r, now);
                // Same answers, ages within the bound.
                for q in &prefixes {
                    let (a, b) = (idx.lookup(&always, q, now), idx.lookup(&skipping, q, now));
                    assert_eq!(
                        a.map(|k| (k.depth, k.entry.tag, k.entry.holders)),
                        b.map(|k| (k.depth, k.entry.tag, k.entry.holders)),
                        "step {step}"
                    );
                    if let (Some(a), Some(b)) = (a, b) {
                        assert!(b.age_ms >= a.age_ms && b.age_ms - a.age_ms < fresh_ms.max(100));
                    }
                }
            }
        }
        assert!(
            skipped > 50 && written > 500,
            "{skipped} skipped, {written} written"
        );
    }
}
