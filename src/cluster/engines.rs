//! Engine-reported load per host, in shared data, and its use in selection.
//!
//! The polling VM scrapes each member's Prometheus endpoint every
//! `engine.refresh_ms` ([`crate::engine::parse_metrics`]) and stores the
//! sample with its time in the `engine` key: version ‖ (addr hash u64,
//! time ms u64, length u16, [`EngineSample::encode`] bytes)…, one entry per
//! host, pruned when the host leaves the membership. A request reads it with
//! one get.
//!
//! Use ([`apply`]), only with samples younger than 3 × `engine.refresh_ms`
//! (older ones are ignored and counted as stale; a host without a fresh
//! sample is judged on our own counts alone, so a failing scrape never
//! blocks a request):
//! - **load**: each host's load is `max(our in-flight count, engine waiting +
//!   running) + engine waiting`; the engine's view includes other Envoys'
//!   traffic and is the one every Envoy shares. Waiting requests count twice:
//!   a new request waits for every queued prefill, but a running (decoding)
//!   one only slows its steps a little, so in-flight counts alone rank a
//!   replica with a queue like one busy decoding. It feeds the load bound and
//!   the cost model (simulated with `--ours engine_load=queued`:
//!   `docs/benchmarks.md`);
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
use super::tables::{Keys, VERSION};
use super::view::View;
use crate::config::EngineParams;
use crate::engine::{engine_load, lora_tier, saturated, EngineLimits, EngineSample};

/// Samples per host with their time.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EngineTable {
    /// `(addr hash, time ms, sample)`, sorted by hash.
    pub entries: Vec<(u64, u64, EngineSample)>,
}

impl EngineTable {
    /// Decode (malformed → empty, a bad entry ends the table).
    pub fn decode(v: Option<&[u8]>) -> EngineTable {
        let mut entries = Vec::new();
        let Some([VERSION, b @ ..]) = v else {
            return EngineTable { entries };
        };
        let mut i = 0;
        while i < b.len() {
            let (Some(h), Some(t), Some(n)) = (
                b.get(i..i + 8).and_then(|s| <[u8; 8]>::try_from(s).ok()),
                b.get(i + 8..i + 16)
                    .and_then(|s| <[u8; 8]>::try_from(s).ok()),
                b.get(i + 16..i + 18)
                    .and_then(|s| <[u8; 2]>::try_from(s).ok()),
            ) else {
                break;
            };
            let n = usize::from(u16::from_le_bytes(n));
            let Some(s) = b.get(i + 18..i + 18 + n).and_then(EngineSample::decode) else {
                break;
            };
            entries.push((u64::from_le_bytes(h), u64::from_le_bytes(t), s));
            i += 18 + n;
        }
        EngineTable { entries }
    }

    /// Encode.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = vec![VERSION];
        for (h, t, s) in &self.entries {
            let b = s.encode();
            let Ok(n) = u16::try_from(b.len()) else {
                continue;
            };
            v.extend_from_slice(&h.to_le_bytes());
            v.extend_from_slice(&t.to_le_bytes());
            v.extend_from_slice(&n.to_le_bytes());
            v.extend_from_slice(&b);
        }
        v
    }

    /// The sample of `h` if younger than `max_age_ms`.
    pub fn fresh(&self, h: u64, now_ms: u64, max_age_ms: u64) -> Option<&EngineSample> {
        self.entries
            .iter()
            .find(|e| e.0 == h)
            .filter(|e| now_ms.saturating_sub(e.1) <= max_age_ms)
            .map(|e| &e.2)
    }

    /// Read from shared data.
    pub fn read<S: SharedData + ?Sized>(s: &S, k: &Keys) -> Result<EngineTable, ShareError> {
        Ok(EngineTable::decode(s.get(&k.engine)?.0.as_deref()))
    }

    /// Store `sample` of host `h` taken at `now_ms`; drop hosts not in `members`.
    pub fn store<S: SharedData + ?Sized>(
        s: &S,
        k: &Keys,
        h: u64,
        now_ms: u64,
        sample: &EngineSample,
        members: &[u64],
    ) -> Result<(), ShareError> {
        super::shared::update(s, &k.engine, |cur| {
            let mut t = EngineTable::decode(cur);
            t.entries.retain(|e| e.0 != h && members.contains(&e.0));
            t.entries.push((h, now_ms, sample.clone()));
            t.entries.sort_by_key(|e| e.0);
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
    let samples: Vec<Option<&EngineSample>> = (0..n)
        .map(|i| view.hash(i).and_then(|h| table.fresh(h, now_ms, max_age)))
        .collect();
    let mut effect = Effect {
        stale: samples.iter().filter(|s| s.is_none()).count(),
        ..Effect::default()
    };
    for (l, s) in loads.iter_mut().zip(&samples) {
        if let Some(e) = s.and_then(engine_load) {
            let waiting = s.and_then(|s| s.waiting).unwrap_or(0.0);
            let clamp = |x: f64| x.clamp(0.0, f64::from(u32::MAX)) as u32;
            *l = (*l).max(clamp(e)).saturating_add(clamp(waiting));
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
mod tests {
    use super::super::shared::MockShared;
    use super::super::tables::{addr_hash, Snapshot};
    use super::*;
    use crate::config::Config;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn view(n: usize) -> View {
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

    fn table(v: &View, samples: &[(usize, u64, EngineSample)]) -> EngineTable {
        let s = MockShared::new();
        let k = Keys::new("t");
        let members: Vec<u64> = (0..v.endpoints().len()).filter_map(|i| v.hash(i)).collect();
        for (i, t, x) in samples {
            EngineTable::store(&s, &k, v.hash(*i).unwrap(), *t, x, &members).unwrap();
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
            t.fresh(v.hash(0).unwrap(), 300, 300).map(|s| s.running),
            Some(Some(2.0))
        );
        assert!(t.fresh(v.hash(0).unwrap(), 306, 300).is_none());
        assert_eq!(EngineTable::decode(Some(b"\x01garbage")).entries.len(), 0);
        // A host that left is pruned at the next store.
        let s = MockShared::new();
        let k = Keys::new("t");
        EngineTable::store(&s, &k, 1, 0, &EngineSample::default(), &[1, 2]).unwrap();
        EngineTable::store(&s, &k, 2, 0, &EngineSample::default(), &[2]).unwrap();
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
