//! Engine-reported load per host, in shared data, and its use in selection.
//!
//! The polling VM scrapes each member's Prometheus endpoint every
//! `engine.refresh_ms` ([`crate::engine::parse_metrics`]) and stores the
//! sample with its time in the `engine` key: [`TABLE_VERSION`] ‖ (addr hash
//! u64, time ms u64, own in-flight u32, length u16, [`EngineSample::encode`]
//! bytes)…, one entry per host, pruned when the host leaves the membership.
//! `own in-flight` is this Envoy's in-flight count for the host when the
//! sample was stored (`u32::MAX`: unknown); a table of the older layout
//! (version [`VERSION`], no such field) still decodes, its samples without
//! it. A request reads the table with one get.
//!
//! Use ([`apply`]), only with samples younger than 3 × `engine.refresh_ms`
//! (older ones are ignored and counted as stale; a host without a fresh
//! sample is judged on our own counts alone, so a failing scrape never
//! blocks a request):
//! - **load** ([`crate::engine::load`], rule `Delta`): each host's load is
//!   `our in-flight now + max(0, engine waiting + running − our in-flight at
//!   the sample) + engine waiting`: our own requests counted live, the
//!   engine's others (other Envoys' traffic) and its queue from the sample.
//!   Waiting requests count twice: a new request waits for every queued
//!   prefill, but a running (decoding) one only slows its steps a little, so
//!   in-flight counts alone rank a replica with a queue like one busy
//!   decoding. Never below our live count. It feeds the load bound and the
//!   cost model (simulated with `--ours engine_load=delta`, the same
//!   function: `docs/benchmarks.md`);
//! - **saturation**: a host over `max_queue` waiting requests or
//!   `max_kv_usage` KV usage is made unusable for this request while some
//!   usable host is not saturated: it gets no new cold, spilled or
//!   (through [`super::view::AddrSlots`]) warm traffic; its prefixes go to its
//!   successor. All saturated: nothing changes (fail open: least loaded);
//! - **LoRA**: when the request's `model` is an adapter some host has loaded
//!   (running or waiting), the usable hosts with it loaded (tier 0) are the
//!   candidates; if none of them is usable, the usable hosts with a free
//!   adapter slot (tier 1); otherwise all. The prefix choice is made within
//!   that set.

use super::shared::{ShareError, SharedData};
use super::tables::{InFlight, Keys, VERSION};
use super::view::View;
use crate::config::EngineParams;
use crate::engine::load::{host_load, LoadRule};
use crate::engine::{lora_tier, saturated, EngineLimits, EngineSample};

/// Leading byte of the table's current layout (with our in-flight count).
pub const TABLE_VERSION: u8 = 2;
/// Stored in place of an unknown own in-flight count.
const OWN_UNKNOWN: u32 = u32::MAX;

/// One host's sample.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stored {
    /// Address hash of the host.
    pub hash: u64,
    /// When it was stored, ms.
    pub time_ms: u64,
    /// This Envoy's in-flight count for the host at that time.
    pub own: Option<u32>,
    /// The sample.
    pub sample: EngineSample,
}

/// Samples per host with their time.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EngineTable {
    /// Sorted by hash.
    pub entries: Vec<Stored>,
}

impl EngineTable {
    /// Decode (malformed → empty, a bad entry ends the table).
    pub fn decode(v: Option<&[u8]>) -> EngineTable {
        let mut entries = Vec::new();
        let (b, own_len) = match v {
            Some([TABLE_VERSION, b @ ..]) => (b, 4),
            Some([VERSION, b @ ..]) => (b, 0),
            _ => return EngineTable { entries },
        };
        let arr = |at: usize| b.get(at..at + 8).and_then(|s| <[u8; 8]>::try_from(s).ok());
        let mut i = 0;
        while i < b.len() {
            let o = i + 16; // own count (current layout), then the length
            let l = o + own_len;
            let (Some(h), Some(t), Some(n)) = (
                arr(i),
                arr(i + 8),
                b.get(l..l + 2).and_then(|s| <[u8; 2]>::try_from(s).ok()),
            ) else {
                break;
            };
            let own = match own_len {
                0 => None,
                _ => match b.get(o..o + 4).and_then(|s| <[u8; 4]>::try_from(s).ok()) {
                    Some(x) => Some(u32::from_le_bytes(x)).filter(|&x| x != OWN_UNKNOWN),
                    None => break,
                },
            };
            let n = usize::from(u16::from_le_bytes(n));
            let Some(sample) = b.get(l + 2..l + 2 + n).and_then(EngineSample::decode) else {
                break;
            };
            entries.push(Stored {
                hash: u64::from_le_bytes(h),
                time_ms: u64::from_le_bytes(t),
                own,
                sample,
            });
            i = l + 2 + n;
        }
        EngineTable { entries }
    }

    /// Encode.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = vec![TABLE_VERSION];
        for e in &self.entries {
            let b = e.sample.encode();
            let Ok(n) = u16::try_from(b.len()) else {
                continue;
            };
            v.extend_from_slice(&e.hash.to_le_bytes());
            v.extend_from_slice(&e.time_ms.to_le_bytes());
            v.extend_from_slice(&e.own.unwrap_or(OWN_UNKNOWN).to_le_bytes());
            v.extend_from_slice(&n.to_le_bytes());
            v.extend_from_slice(&b);
        }
        v
    }

    /// The entry of `h` if its sample is younger than `max_age_ms`.
    pub fn fresh(&self, h: u64, now_ms: u64, max_age_ms: u64) -> Option<&Stored> {
        self.entries
            .iter()
            .find(|e| e.hash == h)
            .filter(|e| now_ms.saturating_sub(e.time_ms) <= max_age_ms)
    }

    /// Read from shared data.
    pub fn read<S: SharedData + ?Sized>(s: &S, k: &Keys) -> Result<EngineTable, ShareError> {
        Ok(EngineTable::decode(s.get(&k.engine)?.0.as_deref()))
    }

    /// This Envoy's in-flight count of host `h` as shared data holds it now
    /// (what [`Stored::own`] records; a failed read: unknown). Releases a
    /// worker has not written yet (at most one tick) are still counted.
    pub fn own_count<S: SharedData + ?Sized>(s: &S, k: &Keys, h: u64) -> Option<u32> {
        InFlight::read(s, &k.inflight).ok().map(|(t, _)| t.get(h))
    }

    /// Store `e` (a host's sample, its time and our in-flight count then);
    /// drop hosts not in `members`.
    pub fn store<S: SharedData + ?Sized>(
        s: &S,
        k: &Keys,
        e: &Stored,
        members: &[u64],
    ) -> Result<(), ShareError> {
        super::shared::update(s, &k.engine, |cur| {
            let mut t = EngineTable::decode(cur);
            t.entries
                .retain(|x| x.hash != e.hash && members.contains(&x.hash));
            t.entries.push(e.clone());
            t.entries.sort_by_key(|x| x.hash);
            Some(t.encode())
        })
        .map(|_| ())
    }
}

/// What the engine view changed for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Effect {
    /// Hosts with a stale (or missing) sample.
    pub stale: usize,
    /// Saturated hosts taken out of the candidates.
    pub saturated: usize,
    /// The candidates were narrowed to an adapter tier (0 or 1).
    pub lora_tier: Option<u8>,
}

/// Apply the engine view to one request's `loads` and `usable` (member
/// order); see the module docs.
pub fn apply(
    view: &View,
    table: &EngineTable,
    p: &EngineParams,
    model: Option<&str>,
    now_ms: u64,
    loads: &mut [u32],
    usable: &mut [bool],
) -> Effect {
    let max_age = 3 * u64::from(p.refresh_ms);
    let limits = EngineLimits {
        max_queue: p.max_queue,
        max_kv_usage: p.max_kv_usage,
    };
    let n = view.endpoints().len();
    let stored: Vec<Option<&Stored>> = (0..n)
        .map(|i| view.hash(i).and_then(|h| table.fresh(h, now_ms, max_age)))
        .collect();
    let samples: Vec<Option<&EngineSample>> = stored.iter().map(|s| s.map(|s| &s.sample)).collect();
    let mut effect = Effect {
        stale: samples.iter().filter(|s| s.is_none()).count(),
        ..Effect::default()
    };
    for (l, s) in loads.iter_mut().zip(&stored) {
        if let Some(s) = s {
            *l = host_load(LoadRule::Delta, *l, &s.sample, s.own);
        }
    }
    let sat: Vec<bool> = samples
        .iter()
        .map(|s| s.is_some_and(|s| saturated(s, &limits)))
        .collect();
    let is_usable = |u: &[bool], i: usize| u.get(i).copied().unwrap_or(false);
    let is_sat = |i: usize| sat.get(i).copied().unwrap_or(false);
    if (0..n).any(|i| is_usable(usable, i) && !is_sat(i)) {
        for (i, u) in usable.iter_mut().enumerate() {
            if *u && is_sat(i) {
                *u = false;
                effect.saturated += 1;
            }
        }
    }
    if let Some(m) = model.filter(|m| !m.is_empty()) {
        let tier = |i: usize| {
            samples
                .get(i)
                .copied()
                .flatten()
                .map_or(2, |s| lora_tier(s, m))
        };
        let known = (0..n).any(|i| tier(i) == 0);
        if known {
            for t in [0u8, 1] {
                if (0..n).any(|i| is_usable(usable, i) && tier(i) == t) {
                    for (i, u) in usable.iter_mut().enumerate() {
                        *u = *u && tier(i) == t;
                    }
                    effect.lora_tier = Some(t);
                    break;
                }
            }
        }
    }
    effect
}

#[cfg(test)]
pub(crate) mod tests {
    use super::super::shared::MockShared;
    use super::super::tables::{addr_hash, Snapshot};
    use super::*;
    use crate::config::Config;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    /// A view of `n` hosts `10.0.0.i:80` (shared with `queued`'s tests).
    pub(crate) fn view(n: usize) -> View {
        let base = Config::from_json(br#"{"cluster":"l","admin_cluster":"a"}"#).unwrap();
        let hosts = (0..n).map(|i| (format!("10.0.0.{i}:80"), 0)).collect();
        View::from_snapshot(
            &base,
            &Snapshot {
                generation: 1,
                hosts,
            },
        )
    }

    fn params() -> EngineParams {
        EngineParams {
            metrics_path: "/metrics".into(),
            refresh_ms: 100,
            max_queue: 8.0,
            max_kv_usage: 0.9,
        }
    }

    fn sample(
        waiting: f64,
        running: f64,
        kv: f64,
        loras: &[&str],
        max_lora: Option<u32>,
    ) -> EngineSample {
        EngineSample {
            waiting: Some(waiting),
            running: Some(running),
            kv_usage: Some(kv),
            loras_running: loras.iter().map(|s| s.to_string()).collect(),
            loras_waiting: vec![],
            max_lora,
        }
    }

    fn stored(hash: u64, time_ms: u64, own: Option<u32>, sample: EngineSample) -> Stored {
        Stored {
            hash,
            time_ms,
            own,
            sample,
        }
    }

    /// Samples stored without our in-flight count (the older poller).
    fn table(v: &View, samples: &[(usize, u64, EngineSample)]) -> EngineTable {
        let with: Vec<_> = samples
            .iter()
            .map(|(i, t, x)| (*i, *t, None, x.clone()))
            .collect();
        table_own(v, &with)
    }

    fn table_own(v: &View, samples: &[(usize, u64, Option<u32>, EngineSample)]) -> EngineTable {
        let s = MockShared::new();
        let k = Keys::new("t");
        let members: Vec<u64> = (0..v.endpoints().len()).filter_map(|i| v.hash(i)).collect();
        for (i, t, own, x) in samples {
            let e = stored(v.hash(*i).unwrap(), *t, *own, x.clone());
            EngineTable::store(&s, &k, &e, &members).unwrap();
        }
        EngineTable::read(&s, &k).unwrap()
    }

    #[test]
    fn round_trip_and_pruning() {
        let v = view(3);
        let t = table(
            &v,
            &[
                (0, 5, sample(1.0, 2.0, 0.5, &["a"], Some(2))),
                (1, 6, sample(0.0, 0.0, 0.1, &[], None)),
            ],
        );
        assert_eq!(t.entries.len(), 2);
        assert_eq!(EngineTable::decode(Some(&t.encode())), t);
        assert_eq!(
            t.fresh(v.hash(0).unwrap(), 300, 300)
                .map(|s| s.sample.running),
            Some(Some(2.0))
        );
        assert!(t.fresh(v.hash(0).unwrap(), 306, 300).is_none());
        assert_eq!(EngineTable::decode(Some(b"\x01garbage")).entries.len(), 0);
        assert_eq!(EngineTable::decode(Some(b"\x02garbage")).entries.len(), 0);
        // Our in-flight count at the sample round-trips; unknown stays unknown.
        let t = table_own(
            &v,
            &[
                (0, 5, Some(7), sample(1.0, 2.0, 0.5, &[], None)),
                (1, 5, None, EngineSample::default()),
            ],
        );
        assert_eq!(EngineTable::decode(Some(&t.encode())), t);
        assert_eq!(
            t.fresh(v.hash(0).unwrap(), 5, 10).and_then(|s| s.own),
            Some(7)
        );
        assert_eq!(
            t.fresh(v.hash(1).unwrap(), 5, 10).map(|s| s.own),
            Some(None)
        );
        // A host that left is pruned at the next store.
        let s = MockShared::new();
        let k = Keys::new("t");
        let e = |h| stored(h, 0, Some(1), EngineSample::default());
        EngineTable::store(&s, &k, &e(1), &[1, 2]).unwrap();
        EngineTable::store(&s, &k, &e(2), &[2]).unwrap();
        assert_eq!(EngineTable::read(&s, &k).unwrap().entries.len(), 1);
        let _ = addr_hash("x");
    }

    #[test]
    fn saturation_load_and_fail_open() {
        let v = view(3);
        let t = table(
            &v,
            &[
                (0, 1000, sample(9.0, 4.0, 0.2, &[], None)), // queue full
                (1, 1000, sample(0.0, 3.0, 0.95, &[], None)), // KV full
                (2, 0, sample(50.0, 50.0, 1.0, &[], None)),  // stale: ignored
            ],
        );
        let mut loads = vec![1, 5, 0];
        let mut usable = vec![true; 3];
        let e = apply(&v, &t, &params(), None, 1000, &mut loads, &mut usable);
        // max(own, waiting + running) + waiting: 13 + 9, 5 + 0.
        assert_eq!(loads, vec![22, 5, 0]);
        assert_eq!(usable, vec![false, false, true]);
        assert_eq!((e.stale, e.saturated), (1, 2));
        // All saturated: fail open (usable unchanged).
        let t = table(
            &v,
            &[
                (0, 1000, sample(9.0, 0.0, 0.0, &[], None)),
                (1, 1000, sample(9.0, 0.0, 0.0, &[], None)),
                (2, 1000, sample(9.0, 0.0, 0.0, &[], None)),
            ],
        );
        let mut usable = vec![true; 3];
        let e = apply(&v, &t, &params(), None, 1000, &mut [0; 3], &mut usable);
        assert_eq!((usable, e.saturated), (vec![true; 3], 0));
    }

    #[test]
    fn the_older_layout_still_decodes_without_our_count() {
        // Version 1: (hash, time, length, sample) per entry, no own count.
        let x = sample(2.0, 3.0, 0.1, &[], None).encode();
        let mut b = vec![VERSION];
        b.extend_from_slice(&42u64.to_le_bytes());
        b.extend_from_slice(&9u64.to_le_bytes());
        b.extend_from_slice(&(x.len() as u16).to_le_bytes());
        b.extend_from_slice(&x);
        let t = EngineTable::decode(Some(&b));
        assert_eq!(t.entries.len(), 1);
        assert_eq!(
            (t.entries[0].hash, t.entries[0].time_ms, t.entries[0].own),
            (42, 9, None)
        );
        assert_eq!(t.entries[0].sample.waiting, Some(2.0));
        // Re-encoded in the current layout, with the count unknown.
        assert_eq!(t.encode()[0], TABLE_VERSION);
        assert_eq!(EngineTable::decode(Some(&t.encode())), t);
    }

    #[test]
    fn our_count_at_the_sample_makes_the_load_live() {
        let v = view(3);
        // Host 0 was sampled with 4 waiting + 6 running while we had 10
        // there; we have 1 left now (drained since). Host 1: 2 of the 5
        // running are another Envoy's, and we sent 3 more since (5 now).
        // Host 2: no count stored (older poller): the queued rule.
        let t = table_own(
            &v,
            &[
                (0, 1000, Some(10), sample(4.0, 6.0, 0.2, &[], None)),
                (1, 1000, Some(3), sample(0.0, 5.0, 0.2, &[], None)),
                (2, 1000, None, sample(1.0, 2.0, 0.2, &[], None)),
            ],
        );
        let mut loads = vec![1, 6, 0];
        let mut usable = vec![true; 3];
        apply(&v, &t, &params(), None, 1000, &mut loads, &mut usable);
        // 1 + max(0, 10 − 10) + 4; 6 + (5 − 3) + 0; max(0, 3) + 1.
        assert_eq!(loads, vec![5, 8, 4]);
        // Without our count the first host would read max(1, 10) + 4 = 14.
        let old = table(&v, &[(0, 1000, sample(4.0, 6.0, 0.2, &[], None))]);
        let mut loads = vec![1, 6, 0];
        apply(&v, &old, &params(), None, 1000, &mut loads, &mut usable);
        assert_eq!(loads, vec![14, 6, 0]);
    }

    #[test]
    fn lora_tiers_narrow_the_candidates() {
        let v = view(4);
        let t = table(
            &v,
            &[
                (0, 0, sample(0.0, 1.0, 0.1, &["sql"], Some(2))),
                (1, 0, sample(0.0, 1.0, 0.1, &["chat"], Some(2))), // free slot
                (2, 0, sample(0.0, 1.0, 0.1, &["x", "y"], Some(2))), // full
                (3, 0, sample(0.0, 1.0, 0.1, &["sql"], Some(2))),
            ],
        );
        let p = params();
        let mut usable = vec![true; 4];
        let e = apply(&v, &t, &p, Some("sql"), 10, &mut [0; 4], &mut usable);
        assert_eq!(
            (usable, e.lora_tier),
            (vec![true, false, false, true], Some(0))
        );
        // Holders down: hosts with a free slot.
        let mut usable = vec![false, true, true, false];
        let e = apply(&v, &t, &p, Some("sql"), 10, &mut [0; 4], &mut usable);
        assert_eq!(
            (usable, e.lora_tier),
            (vec![false, true, false, false], Some(1))
        );
        // Not an adapter anyone has loaded (a base model): no narrowing.
        let mut usable = vec![true; 4];
        let e = apply(&v, &t, &p, Some("base-model"), 10, &mut [0; 4], &mut usable);
        assert_eq!((usable, e.lora_tier), (vec![true; 4], None));
    }
}
