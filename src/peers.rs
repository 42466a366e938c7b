//! Peer exchange of prefix-index writes between gateway Envoys (pure core;
//! the transport, `dispatch_http_call` to a peers cluster, is the filter's).
//!
//! Several Envoys in front of the same replicas each keep their own
//! [`crate::index`] table. To agree on where prefixes live, every gateway
//! **logs the slot writes** of its own [`crate::index::PrefixIndex::record`]
//! calls ([`LoggingStore`] → [`DeltaLog`], a bounded ring numbered by a
//! sequence); peers **pull** the writes after their cursor on a tick
//! ([`DeltaLog::encode_since`] → [`decode`]) and **merge** them into their own
//! table ([`merge`]). Only slot entries travel (never prompt text), in a
//! compact form: the writes of one record share their front holder and
//! time, so the batch body is a sequence of **runs**: head (LEB128 varint:
//! count × 4 + mode) ‖ front holder (varint) ‖ age × 2 + stamped (varint;
//! age: deciseconds before the batch's newest write) ‖ [high-bit bitmap] ‖
//! [stamp list] ‖ count × (5-byte tag [‖ slot difference]).
//!
//! **Tags.** A stored tag ([`crate::index::Entry`]) is 48 bits: key bits
//! 8..46, the end mark (bit 47) and the **length stamp** (bits 0..7,
//! [`crate::index::Entry::stamp`]), which only the deepest known block a
//! record rewrote carries (0 elsewhere). An entry on the wire is the
//! tag's bits 8..47 (5 bytes); the stamps travel once per run, only for
//! the entries that have one: when the run's `stamped` bit is set, a
//! **stamp list** of pairs (varint `index in the run × 2 + more`, stamp
//! byte) follows the bitmap, indices strictly increasing and below the run
//! length, stamps non-zero, the last pair with `more` = 0 (usually one
//! pair of 2 bytes per record). The decoded tag is the 5 bytes shifted up
//! 8 bits, or-ed with the entry's stamp: exactly the stored tag.
//!
//! **Slots.** The slot mostly follows from the tag:
//! the index takes both from one keyed hash `k` (slot `(k >> 32) % slots`,
//! tag `k`'s low 47 bits plus the end-mark bit 47), so the tag carries key
//! bits 32..46. Modes: **implied** (0; every slot is `bits 32..46 % slots`,
//! exact for a power-of-two table of at most 2^15 slots): an entry is its
//! 5-byte tag; **high bit** (1; every slot is bits 32..46 plus one more bit,
//! a 2^16-slot table): one bitmap byte per 8 entries carries that bit;
//! **high bits** (3; a power-of-two table of 2^17 to 2^20 slots, `k` =
//! log2(slots) − 15 more bits, 3 for the default 2^18): the run's `k`-bit
//! values packed little-endian, `⌈count · k / 8⌉` bytes (twenty-fourth
//! session; a gateway without it refuses the run as malformed, counted as a
//! bad batch); **explicit** (2; any other table size): each entry adds its
//! difference from the implied slot (zigzag varint, 3 B for a slot past 2^16). A record's 24 ladder
//! writes (one run, one stamp) take 3 + 3 + 2 + 24 × 5 B in `PRX5`
//! (eleventh session) against 3 + 3 + 24 × 6 B in `PRX4` (sixth session:
//! the whole 6-byte stored tag, whose low byte is almost always 0), about
//! 4 + 24 × 8 B in `PRX3` (holder u16, a slot difference always: 1 B, or
//! 3 B for the half of a 2^16 table whose bit 15 the tag lacks) and 24 × 14 B
//! in `PRX2` items (slot u32 ‖ tag ‖ holder u16 ‖ age u16). Only the
//! **front** holder travels
//! (the replica that just served the prefix): the older holders were the front
//! of earlier writes, published then, and [`merge`] keeps the receiver's
//! existing holders behind the incoming one. The age is relative to the
//! newest write of the batch (clamped at 109 minutes, beyond any index TTL),
//! so a catch-up batch keeps every entry's true age.
//!
//! Batch format (little endian): `"PRX5"` ‖ layout u32 ‖ epoch u32 ‖
//! from_seq u64 ‖ count u32 ‖ base time u32 (deciseconds) ‖ runs (at most
//! [`ITEM_BYTES`], typically 5 B per entry). `layout`
//! identifies the table geometry and the replica list (see [`layout`]): a
//! batch from a peer with another layout is refused, since holder indices
//! and slots would mean something else there. `epoch` is random per process:
//! a restarted peer restarts its sequence and the puller's [`Cursor`] resets.
//!
//! Merge rule ([`merge`]): same tag (the length stamp aside,
//! [`crate::index::Entry::stamp`]) → holders = the incoming ones first, then
//! the existing ones (at most [`MAX_HOLDERS`], no duplicates), time = the
//! later one, stamp = the incoming one unless it has none; an empty slot or
//! another tag → the incoming entry replaces it. The slot is found as a
//! local write finds it ([`crate::index::Sets::write_slot`]): the slot of
//! the entry's set that holds its key, else an empty one, else the least
//! recently used, so the sender's way and the receiver's need not agree.
//!
//! Bounds: the log keeps at most `capacity` writes (older ones are lost to a
//! slow puller, counted by [`Cursor::advance`]); a batch carries at most
//! `max_count` entries; [`decode`] rejects anything malformed (wrong magic,
//! among them an older format's `PRX4`, length, count, layout, empty tag,
//! holder out of range, a stamp list out of order, out of its run or with
//! a zero stamp) before touching the table. Cost: O(count) per batch, one
//! get (the entry's set) + one set per entry.

use std::collections::VecDeque;

use crate::index::{Entry, Sets, SlotStore, SlotValue, MAX_HOLDERS, STAMP_BITS, STAMP_MASK};

/// Batch magic.
pub const MAGIC: [u8; 4] = *b"PRX5";
/// Header bytes.
pub const HEADER_BYTES: usize = 28;
/// Most bytes per entry on the wire: a run of one (head 1 B, front holder
/// ≤ 3 B, age and stamped bit ≤ 3 B, a stamp list of one pair 2 B) with a
/// 5-byte tag and a slot difference of ≤ 5 B; a typical entry takes 5 B
/// (see the module docs).
pub const ITEM_BYTES: usize = 1 + 3 + 3 + 2 + WIRE_TAG + 5;
/// Fewest bytes per entry on the wire (the 5-byte tag; its slot implied,
/// no stamp).
pub const MIN_ITEM_BYTES: usize = WIRE_TAG;
/// Item bytes of one record's `writes` on the wire for a table of `slots`,
/// as the sync budget counts them ([`crate::peers_budget::Offer::bytes`]):
/// one run (head, front holder, age: 3 B), its high bits (`⌈writes · k / 8⌉`
/// bytes for `k` high bits, at least one byte), 5 B
/// per entry and a 2-byte stamp pair per stamped entry. O(writes).
pub fn record_bytes(writes: &[(u32, SlotValue)], slots: u32) -> usize {
    let stamped = writes
        .iter()
        .filter(|(_, v)| Entry::decode(v).is_some_and(|e| e.stamp() > 0))
        .count();
    let k = high_bits(slots).unwrap_or(0).max(1) as usize;
    3 + (writes.len() * k).div_ceil(8).max(1) + writes.len() * MIN_ITEM_BYTES + 2 * stamped
}
/// Wire value of "no holder".
const NO_HOLDER: u16 = u16::MAX;

/// Layout id of a table: slots and the ordered replica list (FNV-1a).
pub fn layout(slots: u32, endpoints: &[String]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    let mut eat = |b: &[u8]| {
        for &x in b {
            h ^= u32::from(x);
            h = h.wrapping_mul(0x0100_0193);
        }
    };
    eat(&slots.to_le_bytes());
    for e in endpoints {
        eat(e.as_bytes());
        eat(b"\n");
    }
    h
}

/// Bounded, sequence-numbered ring of this gateway's own slot writes.
#[derive(Debug, Clone)]
pub struct DeltaLog {
    cap: usize,
    items: VecDeque<(u32, SlotValue)>,
    next_seq: u64,
}

impl DeltaLog {
    /// A log keeping at most `capacity` writes (≥ 1).
    pub fn new(capacity: usize) -> DeltaLog {
        DeltaLog {
            cap: capacity.max(1),
            items: VecDeque::new(),
            next_seq: 0,
        }
    }

    /// Append one write (the oldest is forgotten when full).
    pub fn push(&mut self, slot: u32, value: SlotValue) {
        if self.items.len() == self.cap {
            self.items.pop_front();
        }
        self.items.push_back((slot, value));
        self.next_seq += 1;
    }

    /// Sequence number of the next write.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Sequence number of the oldest write still kept.
    pub fn oldest_seq(&self) -> u64 {
        self.next_seq - self.items.len() as u64
    }

    /// Writes kept.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// No write kept.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The batch a peer whose cursor is at `seq` pulls: at most `max_count`
    /// writes starting at `max(seq, oldest)`. O(count).
    pub fn encode_since(
        &self,
        seq: u64,
        max_count: usize,
        (layout, slots): (u32, u32),
        epoch: u32,
    ) -> Vec<u8> {
        let from = seq.clamp(self.oldest_seq(), self.next_seq);
        let skip = (from - self.oldest_seq()) as usize;
        let count = self.items.len().saturating_sub(skip).min(max_count);
        encode(
            from,
            self.items.iter().skip(skip).take(count),
            layout,
            epoch,
            slots,
        )
    }
}

/// Encode a batch of `items` whose first write has sequence `from` (the
/// wire format of the module docs) for a table of `slots` slots. O(items).
pub fn encode<'a>(
    from: u64,
    items: impl ExactSizeIterator<Item = &'a (u32, SlotValue)>,
    layout: u32,
    epoch: u32,
    slots: u32,
) -> Vec<u8> {
    let count = items.len();
    let decoded: Vec<(u32, Option<Entry>)> = items.map(|(s, v)| (*s, Entry::decode(v))).collect();
    let base = decoded
        .iter()
        .filter_map(|(_, e)| e.map(|e| e.time))
        .max()
        .unwrap_or(0);
    let mut out = Vec::with_capacity(HEADER_BYTES + count * ITEM_BYTES);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&layout.to_le_bytes());
    out.extend_from_slice(&epoch.to_le_bytes());
    out.extend_from_slice(&from.to_le_bytes());
    out.extend_from_slice(&(count as u32).to_le_bytes());
    out.extend_from_slice(&base.to_le_bytes());
    let item = |(slot, e): &(u32, Option<Entry>)| {
        e.map_or((0, NO_HOLDER, 0, *slot), |e| {
            let age = u16::try_from(base.saturating_sub(e.time)).unwrap_or(u16::MAX);
            (e.tag, e.holders[0].unwrap_or(NO_HOLDER), age, *slot)
        })
    };
    // High bits of a slot past the tag's 15 (0: none to carry, or a table
    // that is not a power of two).
    let k_high = high_bits(slots).unwrap_or(0);
    let mut i = 0;
    while i < decoded.len() {
        let (_, front, age, _) = decoded.get(i).map_or((0, NO_HOLDER, 0, 0), item);
        let run = decoded[i..]
            .iter()
            .take_while(|d| {
                let (_, f, a, _) = item(d);
                (f, a) == (front, age)
            })
            .count()
            .max(1);
        let ds = &decoded[i..i + run];
        let diff = |d: &(u32, Option<Entry>)| {
            let (tag, _, _, slot) = item(d);
            i64::from(slot) - i64::from(predicted_slot(tag, slots))
        };
        let high = |d: &(u32, Option<Entry>)| {
            let (tag, _, _, slot) = item(d);
            (slot & LOW_MASK == low_slot(tag) && slot >> LOW_BITS < 1 << k_high)
                .then_some(slot >> LOW_BITS)
        };
        let mode = if ds.iter().all(|d| diff(d) == 0) {
            RUN_IMPLIED
        } else if k_high >= 1 && ds.iter().all(|d| high(d).is_some()) {
            if k_high == 1 {
                RUN_HIGH_BIT
            } else {
                RUN_HIGH_BITS
            }
        } else {
            RUN_EXPLICIT
        };
        // The run's stamped entries (usually none: one pass).
        let stamp_of = |d: &(u32, Option<Entry>)| (item(d).0 & STAMP_MASK) as u8;
        let stamped = ds.iter().filter(|d| stamp_of(d) != 0).count();
        put_varint(&mut out, (run as u64) << 2 | mode);
        put_varint(&mut out, u64::from(front));
        put_varint(&mut out, u64::from(age) << 1 | u64::from(stamped > 0));
        if mode == RUN_HIGH_BIT || mode == RUN_HIGH_BITS {
            pack_bits(&mut out, ds.iter().map(|d| high(d).unwrap_or(0)), k_high);
        }
        let mut left = stamped;
        for (k, d) in ds.iter().enumerate() {
            if left == 0 {
                break;
            }
            let stamp = stamp_of(d);
            if stamp != 0 {
                left -= 1;
                put_varint(&mut out, (k as u64) << 1 | u64::from(left > 0));
                out.push(stamp);
            }
        }
        for d in ds {
            let (tag, _, _, _) = item(d);
            out.extend_from_slice(&tag.to_le_bytes()[1..=WIRE_TAG]);
            if mode == RUN_EXPLICIT {
                put_varint(&mut out, zigzag(diff(d)));
            }
        }
        i += run;
    }
    out
}

/// Run modes (the low 2 bits of a run's head).
const RUN_IMPLIED: u64 = 0;
const RUN_HIGH_BIT: u64 = 1;
const RUN_EXPLICIT: u64 = 2;
const RUN_HIGH_BITS: u64 = 3;
/// Largest number of high bits a run carries (a 2^20-slot table, the
/// configuration's maximum).
const MAX_HIGH_BITS: u32 = 5;

/// Slot bits past the tag's 15 for a power-of-two table: `Some(0)` up to
/// 2^15 slots, `Some(log2(slots) − 15)` up to 2^20, `None` otherwise.
fn high_bits(slots: u32) -> Option<u32> {
    if !slots.is_power_of_two() {
        return None;
    }
    let k = slots.trailing_zeros().saturating_sub(LOW_BITS);
    (k <= MAX_HIGH_BITS).then_some(k)
}

/// Append `values` (each below `2^k`) packed `k` bits each, little-endian,
/// in `⌈n · k / 8⌉` bytes.
fn pack_bits(out: &mut Vec<u8>, values: impl Iterator<Item = u32>, k: u32) {
    let (mut acc, mut held) = (0u64, 0u32);
    for v in values {
        acc |= u64::from(v) << held;
        held += k;
        while held >= 8 {
            out.push(acc as u8);
            acc >>= 8;
            held -= 8;
        }
    }
    if held > 0 {
        out.push(acc as u8);
    }
}

/// Value `i` of `k` bits packed by [`pack_bits`] in `bytes` (missing bytes
/// read as 0: the caller checked the length).
fn packed_at(bytes: &[u8], i: usize, k: u32) -> u32 {
    let first = i * k as usize;
    (0..k as usize).fold(0, |v, j| {
        let bit = first + j;
        let b = bytes.get(bit / 8).map_or(0, |x| (x >> (bit % 8)) & 1);
        v | u32::from(b) << j
    })
}
/// Bytes of a tag on the wire: stored-tag bits 8..47 (the key bits and the
/// end mark; the low byte, the length stamp, travels in the run's stamp
/// list).
const WIRE_TAG: usize = (48 - STAMP_BITS as usize) / 8;
// `decode` reads the wire tag as 4 + 1 bytes.
const _: () = assert!(WIRE_TAG == 5);
/// Key bits 32..46 that the 47-bit tag keeps ([`crate::index::tag_of`];
/// bit 47 of a stored tag is the end mark, not a key bit).
const LOW_BITS: u32 = 15;
const LOW_MASK: u32 = (1 << LOW_BITS) - 1;

/// Key bits 32..46 of a tag.
fn low_slot(tag: u64) -> u32 {
    ((tag >> 32) as u32) & LOW_MASK
}

/// The slot a tag implies: the index puts key `k` in `(k >> 32) % slots`
/// and keeps `k`'s low 47 bits as the tag, so for a power-of-two table of
/// at most 2^15 slots the slot is `low_slot(tag) % slots` exactly (an
/// implied run); a 2^16-slot table (the default) misses one bit per entry
/// (a high-bit run: one bitmap byte per 8 entries); other sizes carry the
/// difference (an explicit run).
fn predicted_slot(tag: u64, slots: u32) -> u32 {
    low_slot(tag) % slots.max(1)
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// LEB128 at `*at` (at most 10 bytes); advances `at`.
fn get_varint(b: &[u8], at: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for k in 0..10 {
        let x = *b.get(*at)?;
        *at += 1;
        v |= u64::from(x & 0x7f) << (7 * k);
        if x & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// The stamp list of a run of `run` entries at `*at` into `out`: pairs
/// (varint `index << 1 | more`, stamp byte) until `more` is 0; indices
/// strictly increasing and `< run`, stamps non-zero (anything else is
/// [`PeerError::Malformed`]: every listed entry has a stamp, and one entry
/// is listed at most once). At most `run` pairs; advances `at`.
fn get_stamps(
    b: &[u8],
    at: &mut usize,
    run: usize,
    out: &mut Vec<(usize, u8)>,
) -> Result<(), PeerError> {
    loop {
        let v = get_varint(b, at).ok_or(PeerError::Malformed)?;
        let k = usize::try_from(v >> 1).map_err(|_| PeerError::Malformed)?;
        let stamp = *b.get(*at).ok_or(PeerError::Malformed)?;
        *at += 1;
        if k >= run || out.last().is_some_and(|&(p, _)| k <= p) || stamp == 0 {
            return Err(PeerError::Malformed);
        }
        out.push((k, stamp));
        if v & 1 == 0 {
            return Ok(());
        }
    }
}

/// A [`SlotStore`] that also logs every set into a [`DeltaLog`] (wrap the
/// gateway's own table while it records its own decisions).
pub struct LoggingStore<'a, S: SlotStore> {
    /// The table.
    pub inner: &'a mut S,
    /// Where its writes are logged.
    pub log: &'a mut DeltaLog,
}

impl<S: SlotStore> SlotStore for LoggingStore<'_, S> {
    fn get(&self, slot: u32) -> Option<SlotValue> {
        self.inner.get(slot)
    }

    fn set(&mut self, slot: u32, value: SlotValue) {
        self.inner.set(slot, value);
        self.log.push(slot, value);
    }
}

/// Why a batch was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerError {
    /// Shorter than a header, bad magic or a length that is not header + count items.
    Malformed,
    /// Another table geometry or replica list.
    Layout,
    /// More entries than allowed.
    TooMany,
    /// An entry with an empty tag, a slot outside the table or a holder outside the replica list.
    BadEntry,
}

/// A validated batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// Sender's process epoch.
    pub epoch: u32,
    /// Sequence of the first entry.
    pub from_seq: u64,
    /// (slot, entry) in log order.
    pub entries: Vec<(u32, SlotValue)>,
}

impl Batch {
    /// Sequence after the last entry.
    pub fn next_seq(&self) -> u64 {
        self.from_seq + self.entries.len() as u64
    }
}

/// Validate a batch: magic, exact length, `layout`, at most `max_count`
/// entries, every slot `< slots`, every tag non-zero, every holder
/// `< replicas`. Nothing is returned unless everything is valid.
pub fn decode(
    bytes: &[u8],
    want_layout: u32,
    max_count: usize,
    slots: u32,
    replicas: usize,
) -> Result<Batch, PeerError> {
    let (head, body) = bytes
        .split_first_chunk::<HEADER_BYTES>()
        .ok_or(PeerError::Malformed)?;
    let u32_at = |i: usize| u32::from_le_bytes([head[i], head[i + 1], head[i + 2], head[i + 3]]);
    if head[..4] != MAGIC {
        return Err(PeerError::Malformed);
    }
    if u32_at(4) != want_layout {
        return Err(PeerError::Layout);
    }
    let epoch = u32_at(8);
    let mut s = [0u8; 8];
    s.copy_from_slice(&head[12..20]);
    let from_seq = u64::from_le_bytes(s);
    let count = u32_at(20) as usize;
    let base = u32_at(24);
    if count > max_count {
        return Err(PeerError::TooMany);
    }
    if body.len() < count * MIN_ITEM_BYTES || from_seq.checked_add(count as u64).is_none() {
        return Err(PeerError::Malformed);
    }
    let mut entries = Vec::with_capacity(count);
    let mut stamps = Vec::new();
    let mut at = 0;
    while at < body.len() {
        let head = get_varint(body, &mut at).ok_or(PeerError::Malformed)?;
        let (run, mode) = (head >> 2, head & 3);
        let front = get_varint(body, &mut at).ok_or(PeerError::Malformed)?;
        let front = u16::try_from(front).map_err(|_| PeerError::BadEntry)?;
        let age = get_varint(body, &mut at).ok_or(PeerError::Malformed)?;
        let stamped = age & 1 == 1;
        let age = u16::try_from(age >> 1).map_err(|_| PeerError::Malformed)?;
        // High bits: a 2^16 table's runs use mode 1 (one bit), larger
        // power-of-two tables mode 3; any other pairing is malformed.
        let k_high = high_bits(slots).unwrap_or(0);
        let bad_mode = match mode {
            RUN_HIGH_BIT => k_high != 1,
            RUN_HIGH_BITS => k_high < 2,
            _ => false,
        };
        if run == 0 || run > (count - entries.len()) as u64 || bad_mode {
            return Err(PeerError::Malformed);
        }
        if front == NO_HOLDER || usize::from(front) >= replicas {
            return Err(PeerError::BadEntry);
        }
        let run = run as usize;
        let bitmap = if mode == RUN_HIGH_BIT || mode == RUN_HIGH_BITS {
            let n = (run * k_high as usize).div_ceil(8);
            let b = body.get(at..at + n).ok_or(PeerError::Malformed)?;
            at += n;
            b
        } else {
            &[]
        };
        stamps.clear();
        if stamped {
            get_stamps(body, &mut at, run, &mut stamps)?;
        }
        let mut next_stamp = 0;
        for k in 0..run {
            let t = body.get(at..at + WIRE_TAG).ok_or(PeerError::Malformed)?;
            at += WIRE_TAG;
            let stamp = match stamps.get(next_stamp) {
                Some(&(i, s)) if i == k => {
                    next_stamp += 1;
                    s
                }
                _ => 0,
            };
            // Bits 8..47: two loads, no copy (`t` is WIRE_TAG = 5 bytes).
            let low = u32::from_le_bytes([t[0], t[1], t[2], t[3]]);
            let tag = u64::from(low) << 8 | u64::from(t[4]) << 40 | u64::from(stamp);
            let slot = match mode {
                RUN_EXPLICIT => {
                    let diff = unzigzag(get_varint(body, &mut at).ok_or(PeerError::Malformed)?);
                    i64::from(predicted_slot(tag, slots)).checked_add(diff)
                }
                RUN_HIGH_BIT | RUN_HIGH_BITS => {
                    let high = packed_at(bitmap, k, k_high);
                    Some(i64::from(low_slot(tag) | high << LOW_BITS))
                }
                _ => Some(i64::from(predicted_slot(tag, slots))),
            };
            let slot = slot
                .and_then(|x| u32::try_from(x).ok())
                .filter(|&x| x < slots)
                .ok_or(PeerError::BadEntry)?;
            if tag == 0 {
                return Err(PeerError::BadEntry);
            }
            let mut holders = [None; MAX_HOLDERS];
            holders[0] = Some(front);
            let entry = Entry {
                tag,
                time: base.wrapping_sub(u32::from(age)),
                holders,
            };
            entries.push((slot, entry.encode()));
        }
    }
    if entries.len() != count {
        return Err(PeerError::Malformed);
    }
    Ok(Batch {
        epoch,
        from_seq,
        entries,
    })
}

/// The slot of `slot`'s set that [`merge`] writes `incoming` to (its key's,
/// else an empty one, else the least recently used; `slot` when
/// `incoming` does not decode).
pub fn target<S: SlotStore>(store: &S, sets: Sets, slot: u32, incoming: &SlotValue) -> u32 {
    resolve(store, sets, slot, incoming).map_or(slot, |(at, _)| at)
}

/// `incoming` decoded, with the slot of its set it goes to ([`target`]).
fn resolve<S: SlotStore>(
    store: &S,
    sets: Sets,
    slot: u32,
    incoming: &SlotValue,
) -> Option<(u32, Entry)> {
    let inc = Entry::decode(incoming)?;
    Some((sets.write_slot(store, slot, inc.key_tag(), inc.time), inc))
}

/// Merge one peer entry, published at `slot`, into `store` (see the module
/// docs). Returns the slot it changed, if any.
pub fn merge<S: SlotStore>(
    store: &mut S,
    sets: Sets,
    slot: u32,
    incoming: &SlotValue,
) -> Option<u32> {
    let (at, inc) = resolve(store, sets, slot, incoming)?;
    merge_at(store, at, inc)
}

/// [`merge`] of the decoded entry `inc` into slot `slot` itself.
fn merge_at<S: SlotStore>(store: &mut S, slot: u32, inc: Entry) -> Option<u32> {
    let cur = store.get(slot);
    let merged = match cur.as_ref().and_then(Entry::decode) {
        Some(cur) if cur.marked_key() == inc.marked_key() => {
            let mut holders = [None; MAX_HOLDERS];
            let mut k = 0;
            for h in inc.holders.iter().chain(cur.holders.iter()).flatten() {
                if k < MAX_HOLDERS && !holders[..k].contains(&Some(*h)) {
                    holders[k] = Some(*h);
                    k += 1;
                }
            }
            // Wrapping decisecond clock: the later of the two.
            let time = if inc.time.wrapping_sub(cur.time) < u32::MAX / 2 {
                inc.time
            } else {
                cur.time
            };
            let stamp = if inc.stamp() > 0 { inc } else { cur }.stamp();
            Entry {
                tag: cur.tag,
                time,
                holders,
            }
            .with_stamp(stamp)
        }
        _ => inc,
    };
    let v = merged.encode();
    if cur == Some(v) {
        return None;
    }
    store.set(slot, v);
    Some(slot)
}

/// A puller's position in one peer's log.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cursor {
    /// Peer epoch the sequence belongs to (`None` before the first batch).
    pub epoch: Option<u32>,
    /// Next sequence to ask for.
    pub seq: u64,
}

impl Cursor {
    /// Take `batch` into account; returns the writes lost in between (the
    /// peer's log had forgotten them). A new epoch (the peer restarted)
    /// restarts the cursor without counting a loss.
    pub fn advance(&mut self, batch: &Batch) -> u64 {
        let lost = match self.epoch {
            Some(e) if e == batch.epoch => batch.from_seq.saturating_sub(self.seq),
            _ => 0,
        };
        self.epoch = Some(batch.epoch);
        self.seq = batch.next_seq();
        lost
    }
}

/// Constant-time equality (time depends only on the lengths).
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = u8::from(a.len() != b.len());
    for i in 0..a.len().max(b.len()) {
        diff |= a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0xff);
    }
    diff == 0
}

/// Fewest slots of the table sent per snapshot request (a cold gateway's
/// catch-up of what the peers' logs no longer hold).
pub const SNAPSHOT_SPAN: u32 = 4096;
/// Snapshot requests that cover a table of 2^16 slots or more.
pub const SNAPSHOT_CHUNKS: u32 = 16;

/// Slots per snapshot request for a table of `slots`: a sixteenth of the
/// table, at least [`SNAPSHOT_SPAN`], so a cold gateway copies any table in
/// at most 16 requests (one per tick; 16 384 slots, about 13 ms of gets for
/// the serving gateway, at the default 2^18).
pub fn snapshot_span(slots: u32) -> u32 {
    (slots / SNAPSHOT_CHUNKS).max(SNAPSHOT_SPAN)
}

/// What a request to the sync path asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Query {
    /// `since=<u64>`: the log after this sequence.
    Since(u64),
    /// `slots=<u32>`: the non-empty slots of `[start, start + snapshot_span(slots))`.
    Slots(u32),
    /// `queued`: only the serving gateway's queued-prefill table (a header
    /// of [`crate::peers_queue`], empty body): the queue exchange between
    /// index pulls (`peers.queue_ms`).
    Queued,
}

/// Parse the query of a sync request: exactly `since=<u64>`,
/// `slots=<u32>` or `queued`; anything else is `None` (answered 400).
pub fn parse_query(query: &[u8]) -> Option<Query> {
    let digits = |v: &[u8], max: usize| -> Option<u64> {
        if v.is_empty() || v.len() > max || !v.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(v).ok()?.parse().ok()
    };
    if query == b"queued" {
        return Some(Query::Queued);
    }
    if let Some(v) = query.strip_prefix(b"since=") {
        return digits(v, 20).map(Query::Since);
    }
    let v = query.strip_prefix(b"slots=")?;
    digits(v, 10)
        .and_then(|n| u32::try_from(n).ok())
        .map(Query::Slots)
}

/// Merge a snapshot entry: like [`merge`], but only into its key's slot or
/// an empty one (the local entries may be newer; a snapshot only fills
/// gaps). Returns whether the table changed.
pub fn fill<S: SlotStore>(store: &mut S, sets: Sets, slot: u32, incoming: &SlotValue) -> bool {
    let Some((at, inc)) = resolve(store, sets, slot, incoming) else {
        return false;
    };
    match store.get(at).and_then(|v| Entry::decode(&v)) {
        Some(cur) if cur.marked_key() != inc.marked_key() => false,
        _ => merge_at(store, at, inc).is_some(),
    }
}

/// A slot value with `holders` (tests).
#[cfg(test)]
pub(crate) fn entry(tag: u64, time: u32, holders: &[u16]) -> SlotValue {
    let mut h = [None; MAX_HOLDERS];
    for (i, &x) in holders.iter().enumerate() {
        h[i] = Some(x);
    }
    Entry {
        tag,
        time,
        holders: h,
    }
    .encode()
}

#[cfg(test)]
mod tests {
    /// Direct-mapped sets: the merge rule alone, slot by slot.
    const DM: Sets = Sets {
        ways: 1,
        slots: u32::MAX,
        max_age_ms: 0,
    };
    use super::*;
    use crate::index::{pad, IndexConfig, PrefixIndex, VecStore, ENTRY_BYTES};
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn cfg() -> IndexConfig {
        IndexConfig {
            slots: 4096,
            ..IndexConfig::default()
        }
    }

    fn blocks(seed: u64, n: usize) -> Vec<u64> {
        (0..n as u64)
            .map(|i| (seed << 40) ^ (i.wrapping_mul(0x9e37_79b9_7f4a_7c15)) ^ i)
            .collect()
    }

    #[test]
    fn a_peer_learns_what_another_gateway_recorded() {
        let idx = PrefixIndex::new(cfg());
        let (mut a, mut b) = (VecStore::new(4096), VecStore::new(4096));
        let mut log = DeltaLog::new(1024);
        let k = blocks(7, 40);
        let sets = idx.record(
            &mut LoggingStore {
                inner: &mut a,
                log: &mut log,
            },
            &k,
            None,
            5,
            1000,
        );
        assert_eq!(log.len(), sets);
        assert!(idx.lookup(&b, &k, 1000).is_none());
        let lay = layout(4096, &["a".into(), "b".into()]);
        let wire = log.encode_since(0, 512, (lay, 4096), 9);
        // One run (one holder, one time): 3 bytes, then 5 per write (the
        // slot is implied by the tag in a 2^12-slot table; a first record
        // stamps nothing).
        assert_eq!(wire.len(), HEADER_BYTES + 3 + sets * MIN_ITEM_BYTES);
        let batch = decode(&wire, lay, 512, 4096, 7).unwrap();
        let mut cur = Cursor::default();
        assert_eq!(cur.advance(&batch), 0);
        assert_eq!(cur.seq, sets as u64);
        for (slot, v) in &batch.entries {
            merge(&mut b, idx.sets(), *slot, v);
        }
        let known = idx.lookup(&b, &k, 1000).unwrap();
        assert_eq!(known.depth, 40);
        assert_eq!(known.entry.holders().collect::<Vec<_>>(), vec![5]);
        // Nothing new: an empty batch from the cursor on.
        let again = decode(
            &log.encode_since(cur.seq, 512, (lay, 4096), 9),
            lay,
            512,
            4096,
            7,
        )
        .unwrap();
        assert!(again.entries.is_empty());
    }

    #[test]
    fn merge_keeps_both_holders_and_the_later_time() {
        let mut s = VecStore::new(16);
        assert!(merge(&mut s, DM, 3, &entry(42 << 8, 100, &[1])).is_some());
        assert!(merge(&mut s, DM, 3, &entry(42 << 8, 90, &[4, 1])).is_some());
        let e = Entry::decode(&s.get(3).unwrap()).unwrap();
        assert_eq!(e.holders().collect::<Vec<_>>(), vec![4, 1]);
        assert_eq!(e.time, 100);
        // Same again: no change.
        assert!(merge(&mut s, DM, 3, &entry(42 << 8, 90, &[4, 1])).is_none());
        // Another tag replaces (direct-mapped).
        assert!(merge(&mut s, DM, 3, &entry(43 << 8, 50, &[2])).is_some());
        let e = Entry::decode(&s.get(3).unwrap()).unwrap();
        assert_eq!((e.tag, e.holders().collect::<Vec<_>>()), (43 << 8, vec![2]));
        // At most MAX_HOLDERS, incoming first.
        let many: Vec<u16> = (5..5 + MAX_HOLDERS as u16 - 1).chain([2]).collect();
        assert!(merge(&mut s, DM, 3, &entry(43 << 8, 60, &many)).is_some());
        assert!(merge(&mut s, DM, 3, &entry(43 << 8, 61, &[0])).is_some());
        let e = Entry::decode(&s.get(3).unwrap()).unwrap();
        let want: Vec<usize> = [0]
            .into_iter()
            .chain(many.iter().map(|&h| usize::from(h)))
            .take(MAX_HOLDERS)
            .collect();
        assert_eq!(e.holders().collect::<Vec<_>>(), want);
        // The length stamp is not part of the key: merged, the incoming
        // stamp kept unless it has none; the end mark is.
        assert!(merge(&mut s, DM, 3, &entry((43 << 8) | 9, 62, &[1])).is_some());
        let e = Entry::decode(&s.get(3).unwrap()).unwrap();
        assert_eq!((e.stamp(), e.holders().count()), (9, MAX_HOLDERS));
        assert!(merge(&mut s, DM, 3, &entry(43 << 8, 63, &[2])).is_some());
        let e = Entry::decode(&s.get(3).unwrap()).unwrap();
        assert_eq!((e.stamp(), e.holders[0], e.time), (9, Some(2), 63));
        assert!(merge(&mut s, DM, 3, &entry((43 << 8) | (1 << 47), 64, &[4])).is_some());
        let e = Entry::decode(&s.get(3).unwrap()).unwrap();
        assert_eq!((e.is_end(), e.holders().count()), (true, 1));
    }

    #[test]
    fn garbage_is_refused_before_touching_the_table() {
        let lay = layout(64, &["x".into()]);
        let mut log = DeltaLog::new(8);
        log.push(3, entry(42, 1, &[0]));
        let good = log.encode_since(0, 8, (lay, 64), 1);
        assert!(decode(&good, lay, 8, 64, 1).is_ok());
        let bad = |b: &[u8]| decode(b, lay, 8, 64, 1).unwrap_err();
        assert_eq!(bad(b""), PeerError::Malformed);
        assert_eq!(bad(b"GET / HTTP/1.1\r\n\r\n......"), PeerError::Malformed);
        assert_eq!(bad(&good[..good.len() - 1]), PeerError::Malformed);
        let mut extra = good.clone();
        extra.push(0);
        assert_eq!(bad(&extra), PeerError::Malformed);
        assert_eq!(
            decode(&good, lay ^ 1, 8, 64, 1).unwrap_err(),
            PeerError::Layout
        );
        assert_eq!(
            decode(&good, lay, 0, 64, 1).unwrap_err(),
            PeerError::TooMany
        );
        // Slot outside the table, holder outside the replica list, empty tag.
        assert_eq!(
            decode(&good, lay, 8, 3, 1).unwrap_err(),
            PeerError::BadEntry
        );
        let mut l2 = DeltaLog::new(8);
        l2.push(3, entry(42, 1, &[1]));
        assert_eq!(
            bad(&l2.encode_since(0, 8, (lay, 64), 1)),
            PeerError::BadEntry
        );
        let mut l3 = DeltaLog::new(8);
        l3.push(3, [0; ENTRY_BYTES]);
        assert_eq!(
            bad(&l3.encode_since(0, 8, (lay, 64), 1)),
            PeerError::BadEntry
        );
        // A count that does not match the length.
        let mut lie = good.clone();
        lie[20] = 2;
        assert_eq!(bad(&lie), PeerError::Malformed);
        // A run longer than the count, an endless varint, a run of 0.
        // (run head = count × 4 + mode; slot 3 is not tag 42's implied
        // slot 0 in 64, so the run is explicit: head 6).
        assert_eq!(good[HEADER_BYTES], 6);
        let mut long_run = good.clone();
        long_run[HEADER_BYTES] = 10;
        assert_eq!(bad(&long_run), PeerError::Malformed);
        // The same run claimed implied: its difference byte is left over;
        // an unknown mode.
        for head in [4, 7] {
            let mut other = good.clone();
            other[HEADER_BYTES] = head;
            assert_eq!(bad(&other), PeerError::Malformed, "{head}");
        }
        // A front holder past u16.
        let mut wide = good[..HEADER_BYTES].to_vec();
        wide.extend([6, 0x80, 0x80, 0x04, 0]);
        wide.extend(&good[HEADER_BYTES + 3..]);
        assert_eq!(bad(&wide), PeerError::BadEntry);
        let mut endless = good[..HEADER_BYTES].to_vec();
        endless.extend([0xff; 14]);
        assert_eq!(bad(&endless), PeerError::Malformed);
        let mut zero = good.clone();
        zero[HEADER_BYTES] = 0;
        assert_eq!(bad(&zero), PeerError::Malformed);
        zero[HEADER_BYTES] = 1;
        assert_eq!(bad(&zero), PeerError::Malformed);
    }

    #[test]
    fn implied_slots_take_no_bytes_and_other_slots_round_trip() {
        // 2^15 slots: implied; 2^16: one bit per entry; 2^17, 2^18 (the
        // default) and 2^20: 2, 3 and 5 bits per entry, packed.
        for (slots, extra) in [
            (1 << 15, 0),
            (1 << 16, 2),
            (1 << 17, 3),
            (1 << 18, 4),
            (1 << 20, 7),
        ] {
            let idx = PrefixIndex::new(IndexConfig {
                slots,
                ..IndexConfig::default()
            });
            let lay = layout(slots, &[]);
            let mut log = DeltaLog::new(64);
            for b in blocks(3, 10) {
                let (slot, tag) = idx.place(b);
                log.push(slot, entry(tag, 500, &[2]));
            }
            let wire = log.encode_since(0, 64, (lay, slots), 1);
            // One run: head, holder, age (1 B each), the bitmap, 5 B per entry.
            assert_eq!(wire.len(), HEADER_BYTES + 3 + extra + 10 * 5, "{slots}");
            let b = decode(&wire, lay, 64, slots, 3).unwrap();
            let want: Vec<u32> = log.items.iter().map(|x| x.0).collect();
            assert_eq!(b.entries.iter().map(|x| x.0).collect::<Vec<_>>(), want);
            // (tables past 2^15: some slots in the upper part)
            assert!(slots < 1 << 16 || want.iter().any(|&s| s >= 1 << 15));
            assert!(slots > 1 << 15 || want.iter().any(|&s| s < 1 << 15));
            // A bit of the packed values flipped: another slot, never the
            // same one (2^15: no bits to flip).
            if extra > 0 {
                let mut flipped = wire.clone();
                flipped[HEADER_BYTES + 3] ^= 1;
                let got = decode(&flipped, lay, 64, slots, 3).unwrap();
                assert_ne!(got.entries[0].0, want[0], "{slots}");
                assert_eq!(got.entries[1..], b.entries[1..], "{slots}");
            }
        }
        // A run's mode must fit the table: one high bit on a 2^18 table, or
        // packed bits on a 2^16 or a 3000-slot one, is malformed.
        let run_of = |slots: u32| {
            let idx = PrefixIndex::new(IndexConfig {
                slots,
                ..IndexConfig::default()
            });
            let mut log = DeltaLog::new(64);
            for b in blocks(5, 12) {
                let (slot, tag) = idx.place(b);
                log.push(slot, entry(tag, 500, &[2]));
            }
            log
        };
        for (made, read) in [
            (1u32 << 16, 1u32 << 18),
            (1 << 18, 1 << 16),
            (1 << 18, 3000),
        ] {
            let wire = run_of(made).encode_since(0, 64, (layout(read, &[]), made), 1);
            assert_eq!(
                decode(&wire, layout(read, &[]), 64, read, 3).unwrap_err(),
                PeerError::Malformed,
                "{made} read as {read}"
            );
        }
        // Packed bits cut short: malformed.
        let wire = run_of(1 << 18).encode_since(0, 64, (layout(1 << 18, &[]), 1 << 18), 1);
        let mut short = wire[..HEADER_BYTES + 4].to_vec();
        short[20..24].copy_from_slice(&12u32.to_le_bytes());
        assert!(decode(&short, layout(1 << 18, &[]), 64, 1 << 18, 3).is_err());
        let slots = 1 << 16;
        let lay = layout(slots, &[]);
        let mut log = DeltaLog::new(64);
        // A slot that is not the implied one makes its run explicit; every
        // slot survives the trip, and a 300-replica holder is a 2-byte varint.
        log.push(7, entry(0x0001_0000_0001, 500, &[2]));
        log.push(9, entry(0x0002_0000_0001, 500, &[299]));
        let wire = log.encode_since(0, 64, (lay, slots), 1);
        let b = decode(&wire, lay, 64, slots, 300).unwrap();
        let want: Vec<u32> = log.items.iter().map(|x| x.0).collect();
        assert_eq!(b.entries.iter().map(|x| x.0).collect::<Vec<_>>(), want);
        let front = |i: usize| Entry::decode(&b.entries[i].1).unwrap().holders[0];
        assert_eq!((front(0), front(1)), (Some(2), Some(299)));
        assert_eq!(
            decode(&wire, lay, 64, slots, 299).unwrap_err(),
            PeerError::BadEntry
        );
    }

    /// What a batch of `items` delivers by the rules of every format since
    /// `PRX4`: the stored tag (stamp included), the front holder alone, the
    /// time within 65 535 ds of the batch's newest, the slot.
    fn delivered(items: &[(u32, SlotValue)]) -> Vec<(u32, SlotValue)> {
        let es: Vec<(u32, Entry)> = items
            .iter()
            .map(|(s, v)| (*s, Entry::decode(v).unwrap()))
            .collect();
        let base = es.iter().map(|(_, e)| e.time).max().unwrap_or(0);
        es.iter()
            .map(|(s, e)| {
                let entry = Entry {
                    tag: e.tag,
                    time: base - (base - e.time).min(65_535),
                    holders: pad([e.holders[0]]),
                };
                (*s, entry.encode())
            })
            .collect()
    }

    /// Deterministic xorshift (tests).
    fn rng(state: &mut u64) -> u64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    }

    /// Batches of every run mode with no, one and several stamps per run;
    /// `(slots, items)`.
    fn stamped_batches() -> Vec<(u32, Vec<(u32, SlotValue)>)> {
        let mut out = Vec::new();
        // 2^12: implied; 2^16: high bit; 2^18: 3 high bits; 3000: explicit.
        for slots in [1u32 << 12, 1 << 16, 1 << 18, 3000] {
            let idx = PrefixIndex::new(IndexConfig {
                slots,
                ..IndexConfig::default()
            });
            for stamps in [&[][..], &[0][..], &[3][..], &[0, 4, 9][..], &[9][..]] {
                let mut items = Vec::new();
                for (i, b) in blocks(u64::from(slots) + stamps.len() as u64, 10)
                    .into_iter()
                    .enumerate()
                {
                    let (slot, tag) = idx.place(b);
                    let stamp = if stamps.contains(&i) {
                        200 + i as u64
                    } else {
                        0
                    };
                    // Every third entry carries the end mark.
                    let mark = if i % 3 == 0 { 1 << 47 } else { 0 };
                    // Two runs: entries 0..6 one holder and time, 6..10 another.
                    let (h, t) = if i < 6 { (1, 500) } else { (4, 480) };
                    items.push((slot, entry(tag | mark | stamp, t, &[h, 2])));
                }
                out.push((slots, items));
            }
        }
        out
    }

    #[test]
    fn stamps_travel_once_per_run_and_every_entry_is_delivered_as_before() {
        for (slots, items) in stamped_batches() {
            let lay = layout(slots, &[]);
            let wire = encode(0, items.iter(), lay, 1, slots);
            let b = decode(&wire, lay, 64, slots, 5).unwrap();
            assert_eq!(b.entries, delivered(&items), "{slots}");
            // Size: 28 + per run (3 B + bitmap + 2 B per stamp) + 5 B per
            // entry + the explicit differences.
            let stamped = items
                .iter()
                .filter(|(_, v)| Entry::decode(v).unwrap().stamp() > 0)
                .count();
            // Per run of 6 and 4 entries: 1 + 1 B of one bit, 3 + 2 B of 3.
            let bitmaps = match slots {
                0x1_0000 => 2,
                0x4_0000 => 5,
                _ => 0,
            };
            let fixed = HEADER_BYTES + 2 * 3 + bitmaps + 2 * stamped + 10 * MIN_ITEM_BYTES;
            if slots == 3000 {
                assert!(wire.len() > fixed, "{slots}");
            } else {
                assert_eq!(wire.len(), fixed, "{slots} {stamped}");
            }
        }
        // The budget's count of one record (one run, ≤ 8 entries) is exact
        // on the 2^16 and the default 2^18 tables.
        for (slots, items) in stamped_batches()
            .iter()
            .filter(|b| b.0 == 1 << 16 || b.0 == 1 << 18)
        {
            let lay = layout(*slots, &[]);
            let wire = encode(0, items[..6].iter(), lay, 1, *slots);
            assert_eq!(record_bytes(&items[..6], *slots), wire.len() - HEADER_BYTES);
        }
        // Every stamp value survives, on a stamp-only tag too (no key bits).
        let lay = layout(64, &[]);
        let mut log = DeltaLog::new(512);
        for s in 1..=255u64 {
            log.push(3, entry(s << 40 | s, 7, &[0]));
            log.push(4, entry(s, 7, &[0]));
        }
        let items: Vec<_> = log.items.iter().copied().collect();
        let b = decode(&log.encode_since(0, 512, (lay, 64), 1), lay, 512, 64, 1).unwrap();
        assert_eq!(b.entries, delivered(&items));
    }

    #[test]
    fn a_length_stamp_reaches_the_peer() {
        let idx = PrefixIndex::new(cfg());
        let (mut a, mut b) = (VecStore::new(4096), VecStore::new(4096));
        let mut log = DeltaLog::new(1024);
        let k = blocks(9, 40);
        let mut w = LoggingStore {
            inner: &mut a,
            log: &mut log,
        };
        idx.record(&mut w, &k[..20], None, 1, 1000);
        let known = idx.lookup(&*w.inner, &k, 1000);
        assert_eq!(known.map(|x| x.depth), Some(20));
        idx.record(&mut w, &k, known.as_ref(), 2, 1000);
        let lay = layout(4096, &["a".into(), "b".into(), "c".into()]);
        let batch = decode(&log.encode_since(0, 512, (lay, 4096), 9), lay, 512, 4096, 3).unwrap();
        for (slot, v) in &batch.entries {
            merge(&mut b, idx.sets(), *slot, v);
        }
        // The deepest known block is stamped with the request's 40 blocks,
        // at the sender and at the peer alike.
        let stamp = |s: &VecStore| idx.lookup(s, &k[..20], 1000).map(|x| x.entry.stamp());
        assert_eq!(stamp(&a), Some(40));
        assert_eq!(stamp(&b), Some(40));
    }

    #[test]
    fn malformed_stamp_lists_and_older_formats_are_refused() {
        let lay = layout(1 << 12, &[]);
        let (slots, items) = (1 << 12, &stamped_batches()[3].1);
        let good = encode(0, items.iter(), lay, 1, slots);
        let ok = |b: &[u8]| decode(b, lay, 64, slots, 5);
        assert!(ok(&good).is_ok());
        // The first run (entries 0..6): head 6 × 4 + implied, front 1, age
        // 0 × 2 + stamped, then the pairs (index 0 × 2 + more, 200),
        // (4 × 2, 204); entry 9 is listed in the second run.
        let h = HEADER_BYTES;
        assert_eq!(good[h..h + 7], [24, 1, 1, 1, 200, 8, 204]);
        let with = |f: &dyn Fn(&mut Vec<u8>)| {
            let mut b = good.clone();
            f(&mut b);
            ok(&b).unwrap_err()
        };
        // An older format's magic: refused like a foreign one.
        assert_eq!(
            with(&|b| b[..4].copy_from_slice(b"PRX4")),
            PeerError::Malformed
        );
        // A duplicate index (0 after 0), decreasing (5 then 4), out of the
        // run (6 of 6), a zero stamp.
        assert_eq!(with(&|b| b[h + 5] = 0), PeerError::Malformed);
        assert_eq!(with(&|b| b[h + 3] = 5 << 1 | 1), PeerError::Malformed);
        assert_eq!(with(&|b| b[h + 5] = 6 << 1), PeerError::Malformed);
        assert_eq!(with(&|b| b[h + 4] = 0), PeerError::Malformed);
        // The stamped bit without its list; the list without the bit; the
        // last pair claiming another: the bytes after it are then read out
        // of place (as a pair, as tags; refused as malformed or as a bad
        // entry, whichever check the shifted bytes meet first).
        with(&|b| drop(b.drain(h + 3..h + 7)));
        with(&|b| b[h + 2] = 0);
        with(&|b| b[h + 5] = 4 << 1 | 1);
        // The age field: 65 535 ds with the stamped bit is a valid age;
        // 65 536 is past u16.
        let age = |v: [u8; 3]| {
            let mut b = good.clone();
            b.splice(h + 2..h + 3, v);
            ok(&b)
        };
        assert!(age([0xff, 0xff, 0x07]).is_ok());
        assert_eq!(age([0x81, 0x80, 0x08]).unwrap_err(), PeerError::Malformed);
        // Cut inside the list.
        for cut in h + 3..h + 7 {
            assert_eq!(ok(&good[..cut]).unwrap_err(), PeerError::Malformed, "{cut}");
        }
        // The unmutated bytes: the same checks pass.
        for (at, v) in [(h + 5, 8), (h + 3, 1), (h + 4, 200), (h + 2, 1)] {
            let mut b = good.clone();
            b[at] = v;
            assert!(ok(&b).is_ok());
        }
    }

    #[test]
    fn mutated_batches_never_panic_and_what_decodes_is_valid() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut accepted = 0;
        for (slots, items) in stamped_batches() {
            let lay = layout(slots, &[]);
            let good = encode(0, items.iter(), lay, 1, slots);
            for _ in 0..2000 {
                let mut b = good.clone();
                for _ in 0..1 + rng(&mut seed) % 3 {
                    let at = HEADER_BYTES + (rng(&mut seed) as usize) % (b.len() - HEADER_BYTES);
                    match rng(&mut seed) % 4 {
                        0 => b[at] ^= 1 << (rng(&mut seed) % 8),
                        1 => b[at] = rng(&mut seed) as u8,
                        2 => drop(b.remove(at)),
                        _ => b.insert(at, rng(&mut seed) as u8),
                    }
                }
                let Ok(batch) = decode(&b, lay, 64, slots, 5) else {
                    continue;
                };
                accepted += 1;
                assert_eq!(batch.entries.len(), 10);
                for (slot, v) in &batch.entries {
                    let e = Entry::decode(v).unwrap();
                    assert!(*slot < slots && e.tag != 0 && e.tag < 1 << 48);
                    assert!(e.holders[0].is_some_and(|h| h < 5) && e.holders[1].is_none());
                }
                // Whatever was accepted travels again unchanged (times
                // within the age range of one batch).
                let times: Vec<u32> = batch
                    .entries
                    .iter()
                    .map(|(_, v)| Entry::decode(v).unwrap().time)
                    .collect();
                let (lo, hi) = (times.iter().min().unwrap(), times.iter().max().unwrap());
                if hi - lo <= 65_535 {
                    let again = encode(0, batch.entries.iter(), lay, 1, slots);
                    assert_eq!(decode(&again, lay, 64, slots, 5).unwrap(), batch);
                }
            }
        }
        // Some mutants are valid batches (a tag bit flipped, a stamp changed).
        assert!(accepted > 100, "{accepted}");
    }

    #[test]
    fn the_log_is_bounded_and_a_slow_puller_counts_its_loss() {
        let lay = layout(64, &["x".into()]);
        let mut log = DeltaLog::new(4);
        for i in 0..10u32 {
            log.push(i, entry(u64::from(i) + 1, i, &[0]));
        }
        assert_eq!((log.len(), log.oldest_seq(), log.next_seq()), (4, 6, 10));
        let mut cur = Cursor {
            epoch: Some(1),
            seq: 2,
        };
        let b = decode(&log.encode_since(cur.seq, 3, (lay, 64), 1), lay, 3, 64, 1).unwrap();
        assert_eq!((b.from_seq, b.entries.len()), (6, 3));
        assert_eq!(cur.advance(&b), 4);
        assert_eq!(cur.seq, 9);
        // A restarted peer (new epoch): the cursor follows without a loss.
        let fresh = decode(
            &DeltaLog::new(4).encode_since(9, 3, (lay, 64), 2),
            lay,
            3,
            64,
            1,
        )
        .unwrap();
        assert_eq!(cur.advance(&fresh), 0);
        assert_eq!(
            cur,
            Cursor {
                epoch: Some(2),
                seq: 0
            }
        );
    }

    #[test]
    fn layout_depends_on_slots_and_replica_order() {
        let e = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let a = layout(64, &e(&["a:1", "b:1"]));
        assert_ne!(a, layout(128, &e(&["a:1", "b:1"])));
        assert_ne!(a, layout(64, &e(&["b:1", "a:1"])));
        assert_eq!(a, layout(64, &e(&["a:1", "b:1"])));
    }

    #[test]
    fn compact_items_keep_tag_front_holder_and_age() {
        let lay = layout(64, &[]);
        let mut log = DeltaLog::new(8);
        log.push(1, entry(0xabcd_ef01_2345, 100_000, &[7, 2]));
        log.push(2, entry(42, 100_030, &[3]));
        // Older than the age field: clamped to 65535 ds (109 min), past any TTL.
        log.push(3, entry(43, 100_030 - 70_000, &[3]));
        let wire = log.encode_since(0, 8, (lay, 64), 1);
        assert!(wire.len() <= HEADER_BYTES + 3 * ITEM_BYTES);
        let b = decode(&wire, lay, 8, 64, 8).unwrap();
        let e: Vec<Entry> = b
            .entries
            .iter()
            .map(|(_, v)| Entry::decode(v).unwrap())
            .collect();
        assert_eq!(
            (e[0].tag, e[0].time, e[0].holders),
            (0xabcd_ef01_2345, 100_000, pad([Some(7), None, None]))
        );
        assert_eq!((e[1].tag, e[1].time), (42, 100_030));
        assert_eq!(e[2].time, 100_030 - 65_535);
        // A receiver that knew holder 2 keeps it behind the incoming front.
        let mut s = VecStore::new(64);
        merge(&mut s, DM, 1, &entry(0xabcd_ef01_2345, 90_000, &[2]));
        merge(&mut s, DM, 1, &b.entries[0].1);
        let m = Entry::decode(&s.get(1).unwrap()).unwrap();
        assert_eq!(
            (m.holders().collect::<Vec<_>>(), m.time),
            (vec![7, 2], 100_000)
        );
    }

    #[test]
    fn secret_comparison_and_query() {
        assert!(ct_eq(b"abc", b"abc"));
        assert!(!ct_eq(b"abc", b"abd"));
        assert!(!ct_eq(b"abc", b"ab"));
        assert!(!ct_eq(b"", b"a"));
        assert_eq!(parse_query(b"since=42"), Some(Query::Since(42)));
        assert_eq!(parse_query(b"slots=4096"), Some(Query::Slots(4096)));
        assert_eq!(parse_query(b"queued"), Some(Query::Queued));
        for bad in [
            &b"queued=1"[..],
            b"queued&since=1",
            b"Queued",
            b"",
            b"since=",
            b"since=-1",
            b"since=1&x=2",
            b"x=1",
            b"since=99999999999999999999999",
            b"slots=4294967296",
            b"slots=1&since=2",
        ] {
            assert_eq!(parse_query(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn a_snapshot_fills_gaps_only() {
        let mut s = VecStore::new(16);
        assert!(fill(&mut s, DM, 1, &entry(5 << 8, 10, &[1])));
        assert!(fill(&mut s, DM, 1, &entry(5 << 8, 20, &[2])));
        let e = Entry::decode(&s.get(1).unwrap()).unwrap();
        assert_eq!((e.holders().collect::<Vec<_>>(), e.time), (vec![2, 1], 20));
        // Another tag: the local entry stays.
        assert!(!fill(&mut s, DM, 1, &entry(6 << 8, 30, &[3])));
        assert_eq!(Entry::decode(&s.get(1).unwrap()).unwrap().tag, 5 << 8);
    }
}
