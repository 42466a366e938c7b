//! OURS + engine feedback: `ours` whose index is corrected by what the
//! engines report (`cached_tokens` of each response), as the filter does
//! (`src/filter/delivered.rs`):
//! 1. the decision is the filter's own function,
//!    [`prefix_router::Router::choose_affinity_fed`] (lookup, holders older
//!    than their replica's eviction horizon dropped
//!    ([`prefix_router::feedback::Horizons::filter`]), the shallower entry
//!    when the horizons empty the deepest one
//!    ([`prefix_router::Router::past_horizon`]), request share, placement
//!    pressure, [`prefix_router::affinity::choose_tiered`], the lookup marked
//!    spilled), on a router carrying this policy's index and affinity
//!    parameters ([`OursParams`], `Router::with_index_config` /
//!    `with_affinity_config`); then, as the filter, the request-share count
//!    ([`prefix_router::Router::note_routed`]), the queue picture
//!    (`src/cluster/queued.rs`, as `ours`) and the pending record
//!    ([`prefix_router::Router::record_pending`]); the record
//!    ([`prefix_router::Router::record_affinity`]) when the response starts;
//! 2. at the first token (the engine's `cached_tokens` is known),
//!    [`prefix_router::usage::compare`] the prediction with what was
//!    delivered; with `--ours horizons=1` (the filter's `eviction_horizons`,
//!    off by default) an expected hit that got a miss raises the replica's
//!    horizon to the time of the index entry that predicted it; a delivery
//!    deeper than predicted writes the confirmed depth
//!    ([`prefix_router::index::PrefixIndex::confirm`]).
//!
//! Until the thirteenth session step 1 was a hand copy of the filter's
//! steps (it ran without the queue picture for four sessions unnoticed);
//! what the simulator still does around the call is bookkeeping only.
//!
//! `ours_feedback_2x`: two gateways, each with its own index, horizons, cost
//! model and in-flight counts, requests split at random (as `ours_2x`); each
//! learns only from the responses it proxied.

use prefix_router::affinity::Reason;
use prefix_router::cost::CostModel;
use prefix_router::feedback::Horizons;
use prefix_router::hash::BLOCK_UNITS;
use prefix_router::index::{decis, Known, VecStore};
use prefix_router::usage::{compare, predict, Prediction, Surprise};
use prefix_router::{Loads, Router};

use super::gateways::clock_ms;
use super::ours::OursParams;
use super::{Policy, Routed, View};
use crate::engine::SimRequest;

struct Gateway {
    store: VecStore,
    horizons: Horizons,
    cost: CostModel,
    in_flight: Vec<u32>,
    /// Prompt tokens routed per replica whose first token has not come
    /// (the filter's queue picture, `src/cluster/queued.rs`; as `ours`).
    queued: Option<Vec<u32>>,
}

#[derive(Clone, Copy, Default)]
struct Pending {
    gateway: u8,
    primary: u32,
    predicted: f32,
    uncached: f32,
    load: u32,
    entry_time: Option<u32>,
    routed_at: u32,
    known: Option<Known>,
    /// Tokens this request added to its gateway's queue picture.
    queued: u32,
}

/// OURS with feedback, over `m` gateways.
pub struct OursFeedback {
    /// The ring with [`OursParams`]' index and affinity parameters.
    router: Router,
    key: usize,
    gateways: Vec<Gateway>,
    pending: Vec<Pending>,
    rng: crate::rng::Rng,
    ticket: u64,
    routed: u64,
    /// [expected hit got miss, expected miss got hit, horizon raises].
    surprises: [u64; 3],
    predicted_tokens: f64,
    delivered_tokens: f64,
    confirms: u64,
    /// Raise eviction horizons ([`OursParams::horizons`]).
    horizons: bool,
    /// First-token times for the gateways' run time.
    run: super::RunClock,
}

impl OursFeedback {
    /// `m` gateways over `n` replicas; `key` indexes `Keys::core`;
    /// `router` is given `p`'s index and affinity parameters.
    pub fn new(router: Router, key: usize, p: OursParams, m: usize, n: usize, seed: u64) -> Self {
        let router = router
            .with_index_config(p.index)
            .with_affinity_config(p.affinity);
        let gateways = (0..m.clamp(1, 255))
            .map(|_| Gateway {
                store: VecStore::new(p.index.slots),
                horizons: Horizons::new(n),
                cost: CostModel::new(p.cost),
                in_flight: vec![0; n],
                queued: p.queued_prefill.then(|| vec![0; n]),
            })
            .collect();
        OursFeedback {
            router,
            key,
            gateways,
            pending: Vec::new(),
            rng: crate::rng::Rng::new(seed ^ 0x6662),
            ticket: 0,
            routed: 0,
            surprises: [0; 3],
            predicted_tokens: 0.0,
            delivered_tokens: 0.0,
            confirms: 0,
            horizons: p.horizons,
            run: super::RunClock::default(),
        }
    }
}

impl Policy for OursFeedback {
    fn route(&mut self, idx: u32, req: &SimRequest, view: &View<'_>) -> Routed {
        let now_ms = clock_ms(view.now);
        let multi = self.gateways.len() > 1;
        let g = if multi {
            self.rng.below(self.gateways.len() as u64) as usize
        } else {
            0
        };
        let (Some(key), Some(gw)) = (req.keys.core.get(self.key), self.gateways.get_mut(g)) else {
            return Routed {
                replica: 0,
                spill: false,
            };
        };
        // One gateway sees its own counts; the single gateway sees the view's.
        let loads = if multi {
            &gw.in_flight[..]
        } else {
            view.in_flight
        };
        self.ticket += 1;
        // The filter's decision (`src/filter/http.rs`, `select_affinity`).
        let (_, c, found) = self.router.choose_affinity_fed(
            key,
            req.body_chars as usize,
            Loads::new(loads),
            &gw.store,
            &gw.cost,
            (now_ms, self.ticket),
            &gw.horizons,
            gw.queued.as_deref(),
        );
        self.router.note_routed(&mut gw.store, c.primary);
        let queued =
            super::queue_start(gw.queued.as_mut(), c.primary, c.expected_uncached_tokens());
        // As the filter: a new placement is written at once as pending.
        self.router
            .record_pending(&mut gw.store, &key.blocks, found.as_ref(), &c, now_ms);
        let load = loads.get(c.primary).copied().unwrap_or(0);
        if let Some(x) = gw.in_flight.get_mut(c.primary) {
            *x += 1;
        }
        if self.pending.len() <= idx as usize {
            self.pending.resize(idx as usize + 1, Pending::default());
        }
        self.pending[idx as usize] = Pending {
            gateway: g as u8,
            primary: c.primary as u32,
            // As the filter (`Delivery::predicted_from`): from the lookup the
            // decision returned, an entry the horizons emptied included.
            predicted: {
                // The block after the known depth (blocks are uneven), in tokens.
                let depth = found.map_or(0, |k| k.depth);
                let next = key.units_at(depth + 1).saturating_sub(key.units_at(depth));
                predict(
                    c.expected_cached_tokens,
                    depth,
                    key.blocks.len(),
                    next as f64 / self.router.affinity_config().chars_per_token.max(0.1),
                    c.prompt_tokens,
                ) as f32
            },
            uncached: c.expected_uncached_tokens() as f32,
            load,
            entry_time: found.map(|k| k.entry.time),
            routed_at: decis(now_ms),
            known: found,
            queued,
        };
        self.routed += 1;
        Routed {
            replica: c.primary,
            spill: c.reason == Reason::Spill,
        }
    }

    fn on_first_token(&mut self, idx: u32, req: &SimRequest, r: usize, ttft: f64, now: f64) {
        if let Some(p) = self.pending.get(idx as usize) {
            if let Some(gw) = self.gateways.get_mut(p.gateway as usize) {
                super::queue_finish(gw.queued.as_mut(), p.primary as usize, p.queued);
                // Recorded once the response starts, for the replica that served it (as the
                // filter records after a 2xx).
                if let Some(key) = req.keys.core.get(self.key) {
                    let now_ms = clock_ms(now);
                    self.router.record_affinity(
                        &mut gw.store,
                        &key.blocks,
                        p.known.as_ref(),
                        r,
                        now_ms,
                    );
                }
                gw.cost
                    .observe(f64::from(p.uncached), f64::from(p.load), ttft * 1000.0);
            }
        }
        self.run.first_token(idx, now);
    }

    fn on_delivered(&mut self, idx: u32, req: &SimRequest, replica: usize, cached: u32) {
        let Some(p) = self.pending.get(idx as usize).copied() else {
            return;
        };
        let predicted = if replica == p.primary as usize {
            f64::from(p.predicted)
        } else {
            0.0
        };
        // The engine had more than the index could show: confirm that depth.
        // Whole blocks within the cached characters (blocks are uneven).
        let cfg = self.router.affinity_config();
        let cpt = cfg.chars_per_token.max(0.1);
        let key = req.keys.core.get(self.key);
        let confirmed = key.map_or(0, |k| k.depth_at((f64::from(cached) * cpt) as usize));
        let confirmed_tokens = key.map_or(0, |k| k.units_at(confirmed)) as f64 / cpt;
        if confirmed_tokens > predicted + 0.5 {
            if let (Some(gw), Some(key)) = (self.gateways.get_mut(p.gateway as usize), key) {
                let now_ms = u64::from(p.routed_at) * 100;
                // As the filter: a whole-request depth is also confirmed one
                // block short (the next request's last message differs).
                let n = key.blocks.len();
                let short = (confirmed == n && n > 1).then(|| n - 1);
                for depth in std::iter::once(confirmed).chain(short) {
                    self.router.index().confirm(
                        &mut gw.store,
                        &key.blocks,
                        depth,
                        p.known.as_ref(),
                        replica,
                        now_ms,
                    );
                }
                self.confirms += 1;
            }
        }
        self.predicted_tokens += predicted;
        self.delivered_tokens += f64::from(cached);
        let pr = Prediction {
            cached_tokens: predicted,
            prompt_tokens: f64::from(req.prompt_tokens),
        };
        let hit_tokens = BLOCK_UNITS as f64 / cpt;
        let s = compare(
            &pr,
            u64::from(cached),
            Some(u64::from(req.prompt_tokens)),
            hit_tokens,
            cfg.min_match,
        );
        match s {
            Surprise::ExpectedHitGotMiss => {
                self.surprises[0] += 1;
                if let (Some(gw), Some(t)) =
                    (self.gateways.get_mut(p.gateway as usize), p.entry_time)
                {
                    if self.horizons && gw.horizons.raise(replica, t, p.routed_at) {
                        self.surprises[2] += 1;
                    }
                }
            }
            Surprise::ExpectedMissGotHit => self.surprises[1] += 1,
            Surprise::None if predicted >= hit_tokens => {
                if let Some(gw) = self.gateways.get_mut(p.gateway as usize) {
                    gw.horizons.hit(replica);
                }
            }
            Surprise::None => {}
        }
    }

    fn on_done(&mut self, idx: u32, replica: usize, now: f64) {
        let g = self
            .pending
            .get(idx as usize)
            .map_or(0, |p| p.gateway as usize);
        let run = self.run.done(idx, now);
        if let Some(gw) = self.gateways.get_mut(g) {
            if let Some(x) = gw.in_flight.get_mut(replica) {
                *x = x.saturating_sub(1);
            }
            if let Some(ms) = run {
                gw.cost.observe_run(ms);
            }
        }
    }

    fn extra(&self) -> Vec<(String, f64)> {
        let n = self.routed.max(1) as f64;
        vec![
            ("expected_hit_got_miss".into(), self.surprises[0] as f64 / n),
            ("expected_miss_got_hit".into(), self.surprises[1] as f64 / n),
            ("horizon_raises".into(), self.surprises[2] as f64),
            ("confirms_per_req".into(), self.confirms as f64 / n),
            (
                "predicted_over_delivered".into(),
                self.predicted_tokens / self.delivered_tokens.max(1.0),
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ModelParams;
    use crate::policies::KeyBook;
    use crate::workload::{self, prepare_one};

    /// `--ours` knobs reach every step of the decision and its records:
    /// before the thirteenth session the pending record, the placement
    /// pressure and the horizon fallback read the key book's router (the
    /// shipped defaults), so `record_pending=0` still wrote pending records.
    #[test]
    fn the_policy_s_knobs_reach_the_filter_s_decision() {
        let k = workload::Knobs {
            scale: 0.01,
            load: 1.0,
            seed: 3,
        };
        let w = workload::sagemaker(&k);
        let base = OursParams::default();
        let book = KeyBook::new(&["ours_feedback".to_string()], 7, &base).unwrap();
        let req = prepare_one(&w.specs[0], &book, book.max_chars());
        let m = ModelParams::default();
        let view = View {
            now: 1.0,
            in_flight: &[0; 7],
            replicas: &[],
            scraped: &[],
            model: &m,
        };
        let sets = |p: OursParams| {
            let mut o = OursFeedback::new(book.routers[0].1.clone(), 0, p.clone(), 1, 7, 1);
            assert_eq!(o.router.index().config(), p.index);
            assert_eq!(*o.router.affinity_config(), p.affinity);
            o.route(0, &req, &view);
            o.gateways[0].store.sets()
        };
        // Nothing else writes at routing (no request-share counts).
        assert!(base.affinity.record_pending && base.affinity.share_factor == 0.0);
        assert!(
            sets(base.clone()) > 0,
            "a cold placement is written as pending"
        );
        let mut off = base;
        off.set("record_pending", "0").unwrap();
        off.set("slots", "1024").unwrap();
        assert_eq!(sets(off), 0);
    }
}
