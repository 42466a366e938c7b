//! The shared engine model ([`engine_model::Engine`]) driven in real time.
//!
//! One tokio task (started by the first submission) owns the stepping: it calls
//! [`Engine::step`] with the time since the emulator started, hands every event to the request
//! that awaits it, and sleeps until [`Engine::next_event_time`] or until a submission wakes it.
//! A step that the task reaches late (timer slack, a busy machine) still ends at its planned time
//! in the engine's clock, and the next one starts there, so lateness does not accumulate
//! (`Engine::step` catches up several steps at once if needed).
//!
//! A request is a [`Ticket`]: an id and a channel of its events. Dropping the ticket before
//! `Finished` aborts the request in the engine (its KV blocks are released): a client that leaves
//! never leaks. Cost: one lock of the engine per step and per submission/abort.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use engine_model::{Engine, Event, EventKind, Metrics, Params, Request};
use tokio::sync::{mpsc, Notify};

use crate::config::EmulatorArgs;
use crate::lock;

struct Inner {
    engine: Engine,
    waiters: HashMap<u64, mpsc::UnboundedSender<EventKind>>,
    next_id: u64,
    events: Vec<Event>,
}

/// The engine of one emulated replica and its clock.
pub struct Driver {
    inner: Mutex<Inner>,
    wake: Notify,
    origin: Instant,
    started: AtomicBool,
}

/// A submitted request: its events, in order, end with `Finished` (or the channel closes if the
/// engine is dropped). Dropping the ticket aborts the request.
pub struct Ticket {
    driver: Arc<Driver>,
    id: u64,
    rx: mpsc::UnboundedReceiver<EventKind>,
    finished: bool,
}

impl Ticket {
    /// The next event, `None` when there will be none.
    pub async fn next(&mut self) -> Option<EventKind> {
        if self.finished {
            return None;
        }
        let e = self.rx.recv().await;
        if matches!(e, Some(EventKind::Finished) | None) {
            self.finished = true;
        }
        e
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.finished {
            let mut g = lock(&self.driver.inner);
            g.waiters.remove(&self.id);
            g.engine.abort(self.id);
        }
    }
}

/// Engine parameters from the emulator's flags: `--decode-ms-per-token` is the step floor (the
/// inter-token latency of a small batch), `--prefill-us-per-token` the cost of an uncached
/// prompt token at position 0 (`--attention-tokens N > 0`: `1 + p / N` times that at position
/// `p`; 0: linear), `--prefill-overhead-ms` a cost per newly scheduled request,
/// `--decode-us-per-seq` the cost of each decoding sequence in a step,
/// `--decode-ns-per-ctx-token` the KV read per context token of each decoding sequence,
/// `--max-running` vLLM's `max_num_seqs`, `--max-num-batched-tokens` the step's token budget,
/// `--prefill-lanes` the most sequences prefilling in one step (0 = unlimited).
pub fn params(cfg: &EmulatorArgs) -> Params {
    let sat = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
    Params {
        block_tokens: sat(cfg.block_tokens),
        kv_blocks: sat(cfg.cache_blocks),
        max_num_seqs: sat(cfg.max_running),
        max_batched_tokens: sat(cfg.max_num_batched_tokens),
        max_partial_prefills: sat(cfg.prefill_lanes),
        prefill_s_per_token: cfg.prefill_us_per_token / 1e6,
        attention_tokens: if cfg.attention_tokens > 0.0 {
            cfg.attention_tokens
        } else {
            f64::INFINITY
        },
        step_base_s: cfg.decode_ms_per_token / 1e3,
        decode_s_per_seq: cfg.decode_us_per_seq / 1e6,
        decode_s_per_ctx_token: cfg.decode_ns_per_ctx_token / 1e9,
        request_overhead_s: cfg.prefill_overhead_ms / 1e3,
    }
    .sanitized()
}

impl Driver {
    /// An idle engine; the stepping task starts with the first submission.
    pub fn new(p: Params) -> Driver {
        let mut engine = Engine::new(p);
        engine.set_token_events(true);
        Driver {
            inner: Mutex::new(Inner {
                engine,
                waiters: HashMap::new(),
                next_id: 0,
                events: Vec::new(),
            }),
            wake: Notify::new(),
            origin: Instant::now(),
            started: AtomicBool::new(false),
        }
    }

    fn now(&self) -> f64 {
        self.origin.elapsed().as_secs_f64()
    }

    /// Queue a request (its `id` is assigned here). Must be called inside a tokio runtime.
    pub fn submit(self: &Arc<Self>, mut req: Request) -> Ticket {
        let (tx, rx) = mpsc::unbounded_channel();
        let id = {
            let mut g = lock(&self.inner);
            g.next_id += 1;
            let id = g.next_id;
            req.id = id;
            g.waiters.insert(id, tx);
            let now = self.now();
            g.engine.submit(req, now);
            id
        };
        if !self.started.swap(true, Relaxed) {
            tokio::spawn(self.clone().drive());
        }
        self.wake.notify_one();
        Ticket {
            driver: self.clone(),
            id,
            rx,
            finished: false,
        }
    }

    /// Gauges and counters of the engine now.
    pub fn metrics(&self) -> Metrics {
        lock(&self.inner).engine.metrics()
    }

    /// Drops every cached block not in use.
    pub fn reset_cache(&self) -> u32 {
        lock(&self.inner).engine.reset_cache()
    }

    /// Steps the engine forever (one task per emulator).
    async fn drive(self: Arc<Self>) {
        loop {
            let next = {
                let mut g = lock(&self.inner);
                let inner = &mut *g;
                let now = self.now();
                inner.events.clear();
                inner.engine.step(now, &mut inner.events);
                for e in &inner.events {
                    if let Some(tx) = inner.waiters.get(&e.id) {
                        // A closed receiver: its ticket is being dropped and aborts the request.
                        let _ = tx.send(e.kind);
                    }
                    if e.kind == EventKind::Finished {
                        inner.waiters.remove(&e.id);
                    }
                }
                inner.engine.next_event_time()
            };
            match next {
                Some(t) => {
                    let at = self.origin + Duration::from_secs_f64(t.max(0.0));
                    tokio::select! {
                        _ = tokio::time::sleep_until(at.into()) => {}
                        _ = self.wake.notified() => {}
                    }
                }
                None => self.wake.notified().await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn the_calibrated_model_s_terms_map_onto_the_engine() {
        let plain = params(&EmulatorArgs::parse_from(["replica-emulator"]));
        assert!(plain.attention_tokens.is_infinite());
        assert_eq!(plain.decode_s_per_ctx_token, 0.0);
        let cal = params(&EmulatorArgs::parse_from([
            "replica-emulator",
            "--prefill-us-per-token",
            "30",
            "--attention-tokens",
            "53800",
            "--decode-ns-per-ctx-token",
            "20",
        ]));
        assert_eq!(cal.attention_tokens, 53_800.0);
        assert!((cal.decode_s_per_ctx_token - 20e-9).abs() < 1e-15);
        // A 191 000-token prompt then costs 2.8 times its linear price, as
        // in the simulator's model.
        let ratio = cal.prefill_cost(0, 191_000) / plain_at(30.0).prefill_cost(0, 191_000);
        assert!((ratio - 2.775).abs() < 0.01, "{ratio}");
    }

    #[test]
    fn the_preset_is_the_simulator_s_calibrated_model() {
        let r = EmulatorArgs::parse_from(["replica-emulator", "--preset", "llama70b-h100x8"])
            .resolved();
        let p = params(&r);
        assert_eq!(p, engine_model::Params::llama70b_h100x8().sanitized());
        // The same as the flags the agreement bench used to spell out.
        let flags = EmulatorArgs::parse_from([
            "replica-emulator",
            "--prefill-us-per-token",
            "30",
            "--attention-tokens",
            "53800",
            "--prefill-overhead-ms",
            "0",
            "--prefill-lanes",
            "0",
            "--decode-ms-per-token",
            "12",
            "--decode-us-per-seq",
            "30",
            "--decode-ns-per-ctx-token",
            "20",
            "--max-running",
            "256",
            "--max-num-batched-tokens",
            "8192",
            "--cache-blocks",
            "78000",
            "--block-tokens",
            "16",
        ]);
        let q = params(&flags);
        assert_eq!(
            (q.kv_blocks, q.max_num_seqs, q.block_tokens),
            (p.kv_blocks, p.max_num_seqs, p.block_tokens)
        );
        for (a, b) in [
            (q.prefill_s_per_token, p.prefill_s_per_token),
            (q.attention_tokens, p.attention_tokens),
            (q.step_base_s, p.step_base_s),
            (q.decode_s_per_seq, p.decode_s_per_seq),
            (q.decode_s_per_ctx_token, p.decode_s_per_ctx_token),
        ] {
            assert!((a - b).abs() <= 1e-9 * b.abs().max(1e-12), "{a} vs {b}");
        }
        assert_eq!((r.api_delay_ms, r.api_us_per_token), (10.0, 1.0));
        // No preset: the flags as given.
        assert_eq!(EmulatorArgs::defaults().resolved().cache_blocks, 4096);
    }

    fn plain_at(us: f64) -> Params {
        params(&EmulatorArgs::parse_from([
            "replica-emulator".to_string(),
            "--prefill-us-per-token".to_string(),
            us.to_string(),
        ]))
    }
}
