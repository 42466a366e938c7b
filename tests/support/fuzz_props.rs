//! Properties checked by the fuzz targets (`fuzz/fuzz_targets/*.rs`, libFuzzer on nightly) and
//! replayed over the committed corpus by `tests/fuzz_corpus.rs` on stable. Each function takes
//! arbitrary bytes and panics (assert) when a property does not hold; a panic from the code
//! under test is a finding too.
//!
//! Properties:
//! - [`json_scanner`]: [`Scanner`] accepts a body ⇔ serde_json accepts it as a JSON object,
//!   except for the scanner's documented leniencies ([`lenient_only`]).
//! - [`extract_text`]: [`extract`] gives the same kind, scoping fields and prefix hashes as an
//!   oracle that builds the text from serde_json's parse with the rules of `src/extract.rs`
//!   (`walk_text` in `src/json.rs`), reading the body as Python's `json` does.
//! - [`config`]: `Config::from_json` never panics and accepts only valid JSON.
//! - [`prometheus`]: `engine::parse_metrics` never panics, its output keeps the documented
//!   bounds, and `encode`/`decode` round-trip (decode accepts only what encode writes).
//! - [`peer_batch`]: `peers::decode` never panics and accepts only valid batches, which travel
//!   again unchanged; any entries `peers::encode` is given decode to what a peer is owed (the
//!   stored tag with its length stamp, the front holder, the time, the slot).
//!
//! Known differences (documented, not failures): the scanner checks numbers and literals by
//! character class (`01`, `1.2.3`, `+1` pass), passes invalid UTF-8 through and decodes a lone
//! surrogate escape to U+FFFD (src/json.rs); nesting near the depth limit
//! ([`prefix_router::json::MAX_DEPTH`], serde_json's 128) is skipped.

#![allow(dead_code, clippy::expect_used, clippy::panic, clippy::unwrap_used)]

use std::fmt;

use prefix_router::engine::{self, EngineSample};
use prefix_router::extract::{extract, raw_prefix, BodyKind};
use prefix_router::hash::PrefixHasher;
use prefix_router::index::{Entry, SlotValue, MAX_HOLDERS};
use prefix_router::json::{Scanner, ELEMENT_END};
use prefix_router::peers;
use prefix_router::Config;
use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

/// A property over arbitrary bytes.
pub type Property = fn(&[u8]);

/// The fuzz targets, by name (directory names under `fuzz/corpus/`).
pub const TARGETS: &[(&str, Property)] = &[
    ("json_scanner", json_scanner),
    ("extract", extract_text),
    ("config", config),
    ("prometheus", prometheus),
    ("peers", peer_batch),
];

// ---------------------------------------------------------------------------------------------
// JSON validity

/// A JSON object whose values are not kept (serde_json still checks all of them).
struct AnyObject;

impl<'de> Deserialize<'de> for AnyObject {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = AnyObject;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<AnyObject, A::Error> {
                while m.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(AnyObject)
            }
        }
        d.deserialize_map(V)
    }
}

/// True when `b` uses a leniency of the scanner that strict JSON refuses: invalid UTF-8, a
/// lone surrogate escape, a number or literal outside the JSON grammar, or nesting near the
/// depth limit. Only then may the scanner accept what serde_json refuses.
pub fn lenient_only(b: &[u8]) -> bool {
    if std::str::from_utf8(b).is_err() {
        return true;
    }
    let (mut depth, mut max_depth) = (0usize, 0usize);
    let mut i = 0;
    while let Some(&c) = b.get(i) {
        match c {
            b'"' => {
                i += 1;
                while let Some(&c) = b.get(i) {
                    match c {
                        b'"' => break,
                        b'\\' if b.get(i + 1) == Some(&b'u') => {
                            if let Some(u) = hex4(b, i + 2) {
                                if (0xD800..0xDC00).contains(&u) {
                                    let low = (b.get(i + 6) == Some(&b'\\')
                                        && b.get(i + 7) == Some(&b'u'))
                                    .then(|| hex4(b, i + 8))
                                    .flatten();
                                    if !low.is_some_and(|l| (0xDC00..0xE000).contains(&l)) {
                                        return true;
                                    }
                                    i += 6;
                                } else if (0xDC00..0xE000).contains(&u) {
                                    return true;
                                }
                            }
                            i += 2;
                        }
                        b'\\' => i += 2,
                        _ => i += 1,
                    }
                }
            }
            b'[' | b'{' => {
                depth += 1;
                max_depth = max_depth.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            c if c.is_ascii_alphanumeric() || matches!(c, b'-' | b'+' | b'.') => {
                let end = b[i..]
                    .iter()
                    .position(|&c| !(c.is_ascii_alphanumeric() || matches!(c, b'-' | b'+' | b'.')))
                    .map_or(b.len(), |n| i + n);
                if !json_scalar(&b[i..end]) {
                    return true;
                }
                i = end;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    max_depth >= prefix_router::json::MAX_DEPTH - 2
}

fn hex4(b: &[u8], at: usize) -> Option<u32> {
    let s = std::str::from_utf8(b.get(at..at + 4)?).ok()?;
    u32::from_str_radix(s, 16).ok()
}

/// A literal or a number of the JSON grammar: `-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?`.
fn json_scalar(t: &[u8]) -> bool {
    if matches!(t, b"true" | b"false" | b"null") {
        return true;
    }
    let digits = |t: &[u8], i: &mut usize| {
        let s = *i;
        while t.get(*i).is_some_and(u8::is_ascii_digit) {
            *i += 1;
        }
        *i > s
    };
    let mut i = usize::from(t.first() == Some(&b'-'));
    if t.get(i) == Some(&b'0') {
        i += 1;
    } else if !digits(t, &mut i) {
        return false;
    }
    if t.get(i) == Some(&b'.') {
        i += 1;
        if !digits(t, &mut i) {
            return false;
        }
    }
    if matches!(t.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(t.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        if !digits(t, &mut i) {
            return false;
        }
    }
    i == t.len()
}

/// Scanner validity agrees with serde_json's.
pub fn json_scanner(b: &[u8]) {
    let scanner = Scanner::new(b).object_members(|_, _| {}).is_ok();
    let strict = serde_json::from_slice::<AnyObject>(b).is_ok();
    if strict {
        assert!(
            scanner,
            "the scanner refused valid JSON: {:?}",
            String::from_utf8_lossy(b)
        );
    } else if scanner {
        assert!(
            lenient_only(b),
            "the scanner accepted invalid JSON: {:?}",
            String::from_utf8_lossy(b)
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Extraction oracle

/// The members of an object in document order, duplicates kept, keys unescaped, values raw.
struct Members<'a>(Vec<(String, &'a RawValue)>);

impl<'de: 'a, 'a> Deserialize<'de> for Members<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Members<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Members<'a>, A::Error> {
                let mut out = Vec::new();
                while let Some(kv) = m.next_entry::<String, &'de RawValue>()? {
                    out.push(kv);
                }
                Ok(Members(out))
            }
        }
        d.deserialize_map(V(std::marker::PhantomData))
    }
}

/// Object fields walked inside prompt values: the first four are text, the rest media.
const PROMPT_FIELDS: &[&str] = &[
    "content",
    "text",
    "output",
    "input",
    "image_url",
    "input_audio",
    "file",
    "image",
    "audio",
    "video_url",
    "file_id",
];
const TEXT_FIELDS: usize = 4;
/// Separator between `instructions` and `input` (src/extract.rs `FIELD_END`).
const FIELD_END: &[u8] = b"\x1d";

/// A prompt field repeated inside one object: `extract` refuses the body (`Malformed`).
struct Repeated;

/// The spelling-independent digest of a media value (src/json.rs `media_digest`): strings
/// hash their unescaped bytes, arrays chain their elements' digests in order, objects add up
/// one hash per member (order-independent), scalars hash their text with seed 1.
fn media_digest(raw: &RawValue) -> u64 {
    let t = raw.get();
    match t.as_bytes().first() {
        Some(b'"') => xxh3_64(
            serde_json::from_str::<String>(t)
                .expect("string")
                .as_bytes(),
        ),
        Some(b'[') => serde_json::from_str::<Vec<&RawValue>>(t)
            .expect("array")
            .iter()
            .fold(u64::from(b'['), |acc, v| {
                xxh3_64_with_seed(&media_digest(v).to_le_bytes(), acc)
            }),
        Some(b'{') => serde_json::from_str::<Members>(t)
            .expect("object")
            .0
            .iter()
            .fold(u64::from(b'{'), |acc, (k, v)| {
                let kd = xxh3_64(k.as_bytes());
                acc.wrapping_add(xxh3_64_with_seed(&media_digest(v).to_le_bytes(), kd))
            }),
        _ => xxh3_64_with_seed(t.as_bytes(), 1),
    }
}

/// `walk_text`'s rules on serde_json's parse: strings are text, integer tokens their digits
/// and a space marker, arrays each element then `element_end`, objects their text fields and
/// the digests of their media fields (a prompt field twice in one object is [`Repeated`]);
/// other values nothing. Nothing is looked at once the budget is spent.
fn walk(raw: &RawValue, h: &mut PrefixHasher, element_end: &[u8]) -> Result<(), Repeated> {
    if h.is_full() {
        return Ok(());
    }
    let t = raw.get();
    match t.as_bytes().first() {
        Some(b'"') => {
            let s: String = serde_json::from_str(t).expect("valid string");
            h.push_str(&s);
        }
        Some(b'[') => {
            for item in serde_json::from_str::<Vec<&RawValue>>(t).expect("valid array") {
                walk(item, h, b"")?;
                // A message, item or prompt closes its last hash block; a
                // token id does not (src/hash.rs `end_element`).
                let element = matches!(item.get().as_bytes().first(), Some(b'"' | b'[' | b'{'));
                if element && !element_end.is_empty() {
                    h.end_element(element_end);
                } else {
                    h.push_marker(element_end);
                }
            }
        }
        Some(b'{') => {
            let mut seen = [false; PROMPT_FIELDS.len()];
            for (k, v) in serde_json::from_str::<Members>(t).expect("valid object").0 {
                let Some(i) = PROMPT_FIELDS.iter().position(|f| *f == k) else {
                    continue;
                };
                if std::mem::replace(&mut seen[i], true) {
                    return Err(Repeated);
                }
                if i < TEXT_FIELDS {
                    walk(v, h, b"")?;
                } else {
                    h.push_marker(&media_digest(v).to_le_bytes());
                }
            }
        }
        _ => {
            if t.bytes().all(|c| c.is_ascii_digit() || c == b'-') {
                h.push_str(t);
                h.push_marker(b" ");
            }
        }
    }
    Ok(())
}

type Want = (
    BodyKind,
    prefix_router::hash::PrefixHashes,
    [Option<String>; 3],
);

/// What `extract` must return for a body serde_json reads as an object, read the way Python's
/// `json` does (vLLM, SGLang): keys unescaped, the last of duplicate top-level fields wins,
/// `null` is absent. `Err(())` = `Malformed`.
fn expected(body: &str, limit: usize, block: usize) -> Option<Result<Want, ()>> {
    let m: Members = serde_json::from_str(body).ok()?;
    let last = |name: &str| {
        m.0.iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| *v)
            .filter(|v| v.get() != "null")
    };
    // Every `messages` member is walked while the body is scanned (a later one restarts the
    // hasher): a repeated prompt field in any of them is refused.
    let mut h = PrefixHasher::new(limit, block);
    for (_, v) in m.0.iter().filter(|(k, _)| k == "messages") {
        h = PrefixHasher::new(limit, block);
        if walk(v, &mut h, ELEMENT_END).is_err() {
            return Some(Err(()));
        }
    }
    let mut scoping: [Option<String>; 3] = [None, None, None];
    for (slot, name) in scoping
        .iter_mut()
        .zip(["model", "cache_salt", "prompt_cache_key"])
    {
        if let Some(v) = last(name) {
            match serde_json::from_str::<String>(v.get()) {
                Ok(s) => *slot = Some(s),
                Err(_) => return Some(Err(())),
            }
        }
    }
    for (name, allowed) in [
        ("messages", "["),
        ("prompt", "\"["),
        ("instructions", "\""),
        ("input", "\"["),
    ] {
        if let Some(c) = last(name).and_then(|v| v.get().bytes().next()) {
            if !allowed.as_bytes().contains(&c) {
                return Some(Err(()));
            }
        }
    }
    let kind = if last("messages").is_some() {
        BodyKind::Chat
    } else if last("instructions").is_some() || last("input").is_some() {
        for (i, field) in ["instructions", "input"].into_iter().enumerate() {
            if i == 1 {
                h.end_element(FIELD_END);
            }
            if let Some(v) = last(field) {
                if walk(v, &mut h, ELEMENT_END).is_err() {
                    return Some(Err(()));
                }
            }
        }
        BodyKind::Responses
    } else if let Some(p) = last("prompt") {
        if walk(p, &mut h, ELEMENT_END).is_err() {
            return Some(Err(()));
        }
        BodyKind::Completions
    } else {
        return Some(Ok((
            BodyKind::Raw,
            raw_prefix(body.as_bytes(), limit, block),
            scoping,
        )));
    };
    Some(Ok((kind, h.finish(), scoping)))
}

/// The oracle's kind and counted units for a body (`None`: invalid or a known difference).
pub fn oracle(b: &[u8]) -> Option<(BodyKind, usize)> {
    match expected(std::str::from_utf8(b).ok()?, 2048, 256)? {
        Ok((kind, prefix, _)) => Some((kind, prefix.units)),
        Err(()) => None,
    }
}

/// `extract` agrees with the serde_json oracle on kind, scoping fields and prefix hashes.
pub fn extract_text(b: &[u8]) {
    for (limit, block) in [(2048, 256), (40, 7)] {
        let got = extract(b, limit, block);
        let first = b.iter().find(|c| !c.is_ascii_whitespace());
        if first != Some(&b'{') {
            let e = got.expect("a non-object body is raw");
            assert_eq!(e.kind, BodyKind::Raw);
            assert_eq!(e.prefix, raw_prefix(b, limit, block));
            continue;
        }
        if lenient_only(b) {
            continue; // a documented leniency: only "no panic" holds
        }
        let Ok(text) = std::str::from_utf8(b) else {
            continue; // unreachable: lenient_only covers invalid UTF-8
        };
        if serde_json::from_str::<AnyObject>(text).is_err() {
            assert!(got.is_err(), "extract accepted invalid JSON: {text:?}");
            continue;
        }
        let Some(want) = expected(text, limit, block) else {
            continue;
        };
        match (want, got) {
            (Err(()), Err(_)) => {}
            (Ok((kind, prefix, scoping)), Ok(e)) => {
                assert_eq!(e.kind, kind, "kind of {text:?}");
                assert_eq!(e.prefix, prefix, "prefix of {text:?} (limit {limit})");
                let got = [&e.model, &e.cache_salt, &e.prompt_cache_key]
                    .map(|f| f.as_ref().map(|s| s.to_string()));
                assert_eq!(got, scoping, "scoping fields of {text:?}");
            }
            (want, got) => panic!(
                "extract {:?} but the oracle says {:?} for {text:?}",
                got.map(|e| e.kind),
                want.map(|w| w.0)
            ),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Config and Prometheus

/// `Config::from_json` never panics and accepts only valid JSON.
pub fn config(b: &[u8]) {
    if Config::from_json(b).is_ok() {
        assert!(serde_json::from_slice::<serde_json::Value>(b).is_ok());
    }
}

/// `parse_metrics` keeps its bounds; encode/decode round-trip; decode accepts only canonical
/// encodings.
pub fn prometheus(b: &[u8]) {
    let s = engine::parse_metrics(b);
    for v in [s.waiting, s.running].into_iter().flatten() {
        assert!(
            v.is_finite() && (0.0..=engine::MAX_COUNT).contains(&v),
            "{v}"
        );
    }
    assert!(s.kv_usage.map_or(true, |k| (0.0..=1.0).contains(&k)));
    for list in [&s.loras_running, &s.loras_waiting] {
        assert!(list.len() <= engine::MAX_ADAPTERS);
        assert!(list
            .iter()
            .all(|n| !n.is_empty() && n.len() <= engine::MAX_ADAPTER_NAME));
    }
    assert_eq!(EngineSample::decode(&s.encode()).as_ref(), Some(&s));
    if let Some(d) = EngineSample::decode(b) {
        assert_eq!(d.encode(), b, "decode accepted a non-canonical encoding");
    }
}

// ---------------------------------------------------------------------------------------------
// Peer batches

/// The geometry byte of a [`peer_batch`] input: table size (the three run modes: 2^12 slots
/// implied, 2^16 high bit, 3000 explicit) and replica count (1–64).
fn peer_geometry(g: u8) -> (u32, usize) {
    let slots = [1 << 12, 1 << 16, 3000][usize::from(g % 3)];
    (slots, 1 + usize::from(g / 3) % 64)
}

/// Input: a geometry byte ([`peer_geometry`]) then bytes read two ways.
/// - As a batch: `peers::decode` (the batch's own layout field, at most 4096 entries) never
///   panics; an accepted batch has `count` entries, each with a slot in the table, a non-zero
///   tag of 48 bits and exactly one holder, in the replica list; encoded again it decodes to
///   the same batch (when its times lie within one batch's age range, 65 535 ds).
/// - As entries, 16 bytes each (slot u32, stored tag 6 B, time u16 offset, holder byte, the
///   rest unused): `peers::encode` then `decode` delivers each entry's exact stored tag (its
///   length stamp included), its front holder, its time (clamped at 65 535 ds before the
///   newest, as documented) and its slot.
pub fn peer_batch(b: &[u8]) {
    let Some((&g, rest)) = b.split_first() else {
        return;
    };
    let (slots, replicas) = peer_geometry(g);
    let layout = rest
        .get(4..8)
        .map_or(0, |x| u32::from_le_bytes([x[0], x[1], x[2], x[3]]));
    if let Ok(batch) = peers::decode(rest, layout, 4096, slots, replicas) {
        let count = rest
            .get(20..24)
            .map(|x| u32::from_le_bytes([x[0], x[1], x[2], x[3]]));
        assert_eq!(Some(batch.entries.len() as u32), count);
        let mut times = Vec::new();
        for (slot, v) in &batch.entries {
            let e = Entry::decode(v).expect("an accepted entry is not empty");
            assert!(
                *slot < slots && e.tag != 0 && e.tag < 1 << 48,
                "{slot} {:x}",
                e.tag
            );
            assert_eq!(e.holders().count(), 1);
            assert!(e.holders[0].is_some_and(|h| usize::from(h) < replicas));
            times.push(e.time);
        }
        let span = times
            .iter()
            .max()
            .zip(times.iter().min())
            .map_or(0, |(a, b)| a - b);
        if span <= 65_535 {
            let again = peers::encode(
                batch.from_seq,
                batch.entries.iter(),
                layout,
                batch.epoch,
                slots,
            );
            assert_eq!(
                peers::decode(&again, layout, 4096, slots, replicas),
                Ok(batch)
            );
        }
    }
    // The same bytes as entries.
    let mut items: Vec<(u32, SlotValue)> = Vec::new();
    for c in rest.chunks_exact(16) {
        let mut t = [0u8; 8];
        t[..6].copy_from_slice(&c[4..10]);
        let tag = u64::from_le_bytes(t);
        if tag == 0 {
            continue;
        }
        let mut holders = [None; MAX_HOLDERS];
        holders[0] = Some(u16::from(c[12]) % replicas as u16);
        let entry = Entry {
            tag,
            time: 1_000_000 + u32::from(u16::from_le_bytes([c[10], c[11]])) * 2,
            holders,
        };
        let slot = u32::from_le_bytes([c[0], c[1], c[2], c[3]]) % slots;
        items.push((slot, entry.encode()));
    }
    let layout = peers::layout(slots, &[]);
    let wire = peers::encode(7, items.iter(), layout, 3, slots);
    let batch = peers::decode(&wire, layout, items.len(), slots, replicas)
        .expect("what encode writes decodes");
    assert_eq!(batch.entries.len(), items.len());
    let newest = items
        .iter()
        .filter_map(|(_, v)| Entry::decode(v).map(|e| e.time))
        .max()
        .unwrap_or(0);
    for ((slot, v), (got_slot, got)) in items.iter().zip(&batch.entries) {
        let (e, d) = (Entry::decode(v).unwrap(), Entry::decode(got).unwrap());
        assert_eq!((got_slot, d.tag, d.holders[0]), (slot, e.tag, e.holders[0]));
        assert_eq!(d.time, newest - (newest - e.time).min(65_535));
    }
}
