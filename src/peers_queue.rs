//! Queued-prefill exchange between gateway Envoys (pure core; the filter's
//! transport is `src/filter/peers.rs`).
//!
//! The **Queue** rule ([`crate::affinity`]) ranks replicas by the prompt
//! tokens routed to them and not yet started ([`crate::cluster::queued`]),
//! a count each Envoy keeps for its own requests only. With N gateways each
//! sees 1/N of every queue, and the p90 gain of the rule is lost (simulator,
//! `docs/multi-gateway.md`, sixth session: the trace's p90 +25 / +46 % at
//! N = 2 / 4 against one gateway; a live exchange of the queues closes it).
//! So every answer to a pull also carries the serving gateway's queued
//! tokens per replica in a response header ([`HEADER`], [`encode`]:
//! `id=tokens` pairs, the holder id of [`crate::cluster::view::holder_id`]
//! in hex, the same in every Envoy; replicas with nothing queued are left
//! out), the puller keeps the last table of each peer with its time
//! ([`Exchange`], one shared-data value written by the pulling VM), and the
//! routing path adds the peers' fresh tables to its own counts
//! ([`Exchange::estimate`]).
//!
//! **Extrapolation.** A table is up to one pull period old, and the other
//! gateways keep routing by a similar picture: counting only their last
//! tables, every gateway would send its new work to the replica that looked
//! idle at the last exchange (a herd: worse than no exchange for short
//! prompts in the simulator). So the estimate adds, per replica, `k` times
//! this gateway's own change since the exchange (`k` fresh peers routing
//! the same share of the traffic): `max(own, own + Σ peers + k · (own −
//! own at the exchange))`. Simulator, 100 ms: never worse than the own
//! queues on the four synthetic workloads, the trace's p90 +6 / +10 % at
//! N = 2 / 4.
//!
//! Bounds: at most [`MAX_PAIRS`] pairs per table and [`MAX_PEERS`] peers
//! kept; a table older than `max_age_ms` (3 pull periods) is ignored, so a
//! dead peer's queues fade out. Cost: the header is ≈ 10 B per busy replica
//! per served pull; routing reads one shared-data value and adds O(peers ×
//! replicas). [`decode`] refuses anything but well-formed pairs.

use std::collections::HashMap;

/// Response header of a pull answer that carries the queued tokens.
pub const HEADER: &str = "x-prefix-router-queued";
/// Most `id=tokens` pairs in one table (replicas).
pub const MAX_PAIRS: usize = 1024;
/// Most peers whose tables are kept.
pub const MAX_PEERS: usize = 64;

/// One gateway's queued tokens by holder id (only non-zero ones).
pub type Table = Vec<(u16, u32)>;

/// The header value of `pairs` (zeros left out): `id=tokens,…`, ids in hex.
pub fn encode(pairs: impl IntoIterator<Item = (u16, u32)>) -> String {
    let mut out = String::new();
    for (id, t) in pairs.into_iter().filter(|p| p.1 > 0).take(MAX_PAIRS) {
        if !out.is_empty() {
            out.push(',');
        }
        out.push_str(&format!("{id:x}={t}"));
    }
    out
}

/// Parse a header value of [`encode`]; `None` unless every pair is
/// `hex id (≤ 4 digits) = decimal tokens (≤ 10 digits, fits u32)` and there
/// are at most [`MAX_PAIRS`]. An empty value is an empty table.
pub fn decode(v: &[u8]) -> Option<Table> {
    if v.is_empty() {
        return Some(Vec::new());
    }
    let s = std::str::from_utf8(v).ok()?;
    let mut out = Vec::new();
    for pair in s.split(',') {
        let (id, t) = pair.split_once('=')?;
        let hex = |c: char| c.is_ascii_hexdigit();
        let dec = |c: char| c.is_ascii_digit();
        if id.is_empty() || id.len() > 4 || !id.chars().all(hex) {
            return None;
        }
        if t.is_empty() || t.len() > 10 || !t.chars().all(dec) {
            return None;
        }
        out.push((u16::from_str_radix(id, 16).ok()?, t.parse::<u32>().ok()?));
        if out.len() > MAX_PAIRS {
            return None;
        }
    }
    Some(out)
}

/// What the pulling VM keeps (one shared-data value): its own table when
/// the last pull round started, and each peer's last table with its time.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Exchange {
    /// This gateway's own queued tokens at the start of the last round.
    pub own_at_round: Table,
    /// Peer (address hash) → (time ms, table).
    pub peers: HashMap<u64, (u64, Table)>,
}

impl Exchange {
    /// Keep `table` as `peer`'s at `now_ms` (the oldest peer is dropped
    /// beyond [`MAX_PEERS`]).
    pub fn set_peer(&mut self, peer: u64, now_ms: u64, table: Table) {
        if !self.peers.contains_key(&peer) && self.peers.len() >= MAX_PEERS {
            if let Some(old) = self.peers.iter().min_by_key(|e| (e.1).0).map(|e| *e.0) {
                self.peers.remove(&old);
            }
        }
        self.peers.insert(peer, (now_ms, table));
    }

    /// Add to `own` (this gateway's queued tokens per replica; `position`
    /// maps a holder id to its index) the fresh peers' tables (not older
    /// than `max_age_ms` at `now_ms`) and the extrapolation of the module
    /// docs. Returns the number of fresh peers. O(peers × pairs + replicas).
    pub fn estimate(
        &self,
        own: &mut [u32],
        position: impl Fn(u16) -> Option<usize>,
        now_ms: u64,
        max_age_ms: u64,
    ) -> usize {
        let mut sum = vec![0i64; own.len()];
        let mut fresh = 0i64;
        for (at, table) in self.peers.values() {
            if now_ms.saturating_sub(*at) > max_age_ms {
                continue;
            }
            fresh += 1;
            for &(id, t) in table {
                if let Some(x) = position(id).and_then(|i| sum.get_mut(i)) {
                    *x += i64::from(t);
                }
            }
        }
        if fresh == 0 {
            return 0;
        }
        let mut then = vec![0i64; own.len()];
        for &(id, t) in &self.own_at_round {
            if let Some(x) = position(id).and_then(|i| then.get_mut(i)) {
                *x += i64::from(t);
            }
        }
        for ((o, s), t) in own.iter_mut().zip(&sum).zip(&then) {
            let now = i64::from(*o);
            let v = now + s + fresh * (now - t);
            *o = v.clamp(now, i64::from(u32::MAX)) as u32;
        }
        fresh as usize
    }

    /// Bytes of the shared-data value: own pairs, then per peer its hash,
    /// time and pairs (little endian; counts as u16).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let put = |out: &mut Vec<u8>, t: &Table| {
            out.extend_from_slice(&(t.len().min(MAX_PAIRS) as u16).to_le_bytes());
            for (id, v) in t.iter().take(MAX_PAIRS) {
                out.extend_from_slice(&id.to_le_bytes());
                out.extend_from_slice(&v.to_le_bytes());
            }
        };
        put(&mut out, &self.own_at_round);
        out.extend_from_slice(&(self.peers.len() as u16).to_le_bytes());
        for (peer, (at, t)) in &self.peers {
            out.extend_from_slice(&peer.to_le_bytes());
            out.extend_from_slice(&at.to_le_bytes());
            put(&mut out, t);
        }
        out
    }

    /// Parse [`Exchange::to_bytes`]; `None` if malformed.
    pub fn from_bytes(b: &[u8]) -> Option<Exchange> {
        let mut at = 0;
        let take = |at: &mut usize, n: usize| -> Option<&[u8]> {
            let s = b.get(*at..*at + n)?;
            *at += n;
            Some(s)
        };
        let u16_at = |at: &mut usize| -> Option<u16> {
            take(at, 2).map(|s| u16::from_le_bytes([s[0], s[1]]))
        };
        let u64_at = |at: &mut usize| -> Option<u64> {
            let mut w = [0u8; 8];
            w.copy_from_slice(take(at, 8)?);
            Some(u64::from_le_bytes(w))
        };
        let table = |at: &mut usize| -> Option<Table> {
            let n = usize::from(u16_at(at)?);
            (0..n)
                .map(|_| {
                    let id = u16_at(at)?;
                    let s = take(at, 4)?;
                    Some((id, u32::from_le_bytes([s[0], s[1], s[2], s[3]])))
                })
                .collect()
        };
        let own_at_round = table(&mut at)?;
        let n = usize::from(u16_at(&mut at)?);
        let mut peers = HashMap::new();
        for _ in 0..n.min(MAX_PEERS) {
            let peer = u64_at(&mut at)?;
            let time = u64_at(&mut at)?;
            peers.insert(peer, (time, table(&mut at)?));
        }
        (at == b.len()).then_some(Exchange {
            own_at_round,
            peers,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn header_round_trip_and_garbage_refused() {
        let v = encode([(0x1a2b, 4000), (7, 0), (0xffff, u32::MAX)]);
        assert_eq!(v, "1a2b=4000,ffff=4294967295");
        assert_eq!(
            decode(v.as_bytes()),
            Some(vec![(0x1a2b, 4000), (0xffff, u32::MAX)])
        );
        assert_eq!(decode(b""), Some(vec![]));
        for bad in [
            &b"1a2b"[..],
            b"=5",
            b"1=",
            b"1=5,",
            b"12345=1",
            b"g=1",
            b"1=4294967296",
            b"1=-1",
            b"1=+1",
            b"1=5;2=3",
            b"\xff=1",
        ] {
            assert_eq!(decode(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
        let many = (0..=MAX_PAIRS)
            .map(|i| format!("{i:x}=1"))
            .collect::<Vec<_>>();
        assert_eq!(decode(many.join(",").as_bytes()), None);
    }

    #[test]
    fn fresh_peers_add_their_queues_and_the_own_change_is_extrapolated() {
        let pos = |id: u16| (id < 3).then_some(usize::from(id));
        let mut ex = Exchange {
            own_at_round: vec![(0, 100)],
            ..Exchange::default()
        };
        ex.set_peer(11, 1000, vec![(1, 500), (9, 77)]);
        ex.set_peer(12, 1000, vec![(1, 300), (2, 50)]);
        ex.set_peer(13, 500, vec![(2, 9999)]);
        // Own: replica 0 had 100 at the round and has 300 now (+200, counted
        // twice more for 2 fresh peers); replica 2 had 0 and has 40 (+40 × 2).
        // Peer 13 is stale; id 9 is not a member.
        let mut own = vec![300, 0, 40];
        assert_eq!(ex.estimate(&mut own, pos, 1100, 300), 2);
        assert_eq!(own, vec![300 + 2 * 200, 800, 40 + 50 + 2 * 40]);
        // A drained own queue never goes under the own count.
        let mut own = vec![0, 0, 0];
        ex.estimate(&mut own, pos, 1100, 300);
        assert_eq!(own, vec![0, 800, 50]);
        // No fresh peer: unchanged.
        let mut own = vec![5, 6, 7];
        assert_eq!(ex.estimate(&mut own, pos, 9000, 300), 0);
        assert_eq!(own, vec![5, 6, 7]);
    }

    #[test]
    fn shared_value_round_trip_bounded_peers() {
        let mut ex = Exchange {
            own_at_round: vec![(3, 10)],
            ..Exchange::default()
        };
        for p in 0..(MAX_PEERS as u64 + 5) {
            ex.set_peer(p, 100 + p, vec![(1, p as u32)]);
        }
        assert_eq!(ex.peers.len(), MAX_PEERS);
        assert!(!ex.peers.contains_key(&0) && ex.peers.contains_key(&(MAX_PEERS as u64 + 4)));
        let b = ex.to_bytes();
        assert_eq!(Exchange::from_bytes(&b), Some(ex));
        assert_eq!(Exchange::from_bytes(&b[..b.len() - 1]), None);
        assert_eq!(Exchange::from_bytes(&[b.as_slice(), &[0]].concat()), None);
        assert_eq!(Exchange::from_bytes(b""), None);
    }
}
