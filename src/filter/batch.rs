//! Counter and gauge updates batched in the VM, published in bursts.
//!
//! A request used to make 4 counter increments and 2 gauge writes (each a
//! host call, ~1–2 µs with the V8 boundary), half of them on the latency
//! path at routing. Now [`add`] and [`gauge`] only update VM-local tables
//! (the VM is single-threaded) and [`flush`] makes one host call per
//! distinct metric: a counter's summed increment, a gauge's last value.
//!
//! When: on every root-context callback (the tick runs every [`FLUSH_MS`],
//! `root.rs`; poll responses), and at the end of a request (`on_log`, after
//! the response) if no other request of this VM is live or [`FLUSH_MS`]
//! passed ([`flush_at_request_end`]). So a counter appears in `/stats` when
//! its request ends at rest and within [`FLUSH_MS`] under load. The
//! in-flight gauges are not batched ([`gauge_now`] at each write of the
//! VM's in-flight changes, `local.rs`): each value is the count right
//! after one VM's update, and a
//! value published at a later flush could overwrite a newer one from
//! another worker (the e2e spill test saw a gauge stuck at 1 of 2).
//! Histograms are not batched (each sample is a host call, as before).
//!
//! Bound: one entry per distinct metric id touched since the last flush; a
//! flush is forced past [`MAX_PENDING`] entries, and the tables keep their
//! capacity (no allocation in steady state).

use super::host;
use std::cell::{Cell, RefCell};

/// Longest time a worker under continuous load holds updates back.
pub const FLUSH_MS: u64 = 100;
/// Under load, the clock is read at every this many request ends.
const CLOCK_EVERY: u32 = 16;
/// Most pending entries before a forced flush.
const MAX_PENDING: usize = 256;

#[derive(Default)]
struct Pending {
    /// (counter id, summed increment).
    counters: Vec<(u32, i64)>,
    /// (gauge id, last value).
    gauges: Vec<(u32, u64)>,
    /// Host time of the last flush, ms.
    flushed_ms: u64,
}

thread_local! {
    static PENDING: RefCell<Pending> = RefCell::new(Pending::default());
    /// HTTP contexts of this VM alive now (see [`Live`]).
    static LIVE: Cell<u32> = const { Cell::new(0) };
    /// Request ends seen while other requests were live.
    static ENDS: Cell<u32> = const { Cell::new(0) };
}

/// Apply `update` to the pending tables (or, if they are somehow borrowed,
/// make the host call at once with `now`); flush past [`MAX_PENDING`].
fn pend(update: impl FnOnce(&mut Pending), now: impl FnOnce()) {
    let full = PENDING.with(|p| match p.try_borrow_mut() {
        Ok(mut p) => {
            update(&mut p);
            p.counters.len() + p.gauges.len() > MAX_PENDING
        }
        Err(_) => {
            now();
            false
        }
    });
    if full {
        flush();
    }
}

/// Add `delta` to counter `id` (published at the next flush).
pub fn add(id: u32, delta: i64) {
    pend(
        |p| match p.counters.iter_mut().find(|(i, _)| *i == id) {
            Some((_, d)) => *d = d.saturating_add(delta),
            None => p.counters.push((id, delta)),
        },
        || host::increment_metric(id, delta),
    );
}

/// Set gauge `id` to `value` (the last value is published at the next flush).
pub fn gauge(id: u32, value: u64) {
    pend(
        |p| match p.gauges.iter_mut().find(|(i, _)| *i == id) {
            Some((_, v)) => *v = value,
            None => p.gauges.push((id, value)),
        },
        || host::record_metric(id, value),
    );
}

/// Set gauge `id` to `value` now (and drop a pending value of it).
pub fn gauge_now(id: u32, value: u64) {
    PENDING.with(|p| {
        if let Ok(mut p) = p.try_borrow_mut() {
            p.gauges.retain(|(i, _)| *i != id);
        }
    });
    if !super::probe::off(super::probe::Ablate::Flush) {
        host::record_metric(id, value);
    }
}

/// Publish every pending update (one host call per metric touched).
pub fn flush() {
    PENDING.with(|p| {
        let Ok(mut p) = p.try_borrow_mut() else {
            return;
        };
        if super::probe::off(super::probe::Ablate::Flush) {
            p.counters.clear();
            p.gauges.clear();
            return;
        }
        for &(id, delta) in &p.counters {
            if delta != 0 {
                host::increment_metric(id, delta);
            }
        }
        for &(id, value) in &p.gauges {
            host::record_metric(id, value);
        }
        p.counters.clear();
        p.gauges.clear();
    });
}

/// End of a request: flush if it was the VM's only live request (the
/// [`Live`] count includes the ending request), else if [`FLUSH_MS`] passed,
/// looking at the clock every [`CLOCK_EVERY`] request ends only (the tick
/// publishes within [`FLUSH_MS`] anyway).
pub fn flush_at_request_end() {
    let empty = PENDING.with(|p| {
        p.try_borrow()
            .is_ok_and(|p| p.counters.is_empty() && p.gauges.is_empty())
    });
    if empty {
        return;
    }
    if LIVE.with(Cell::get) > 1 {
        // Under load: look at the clock every CLOCK_EVERY request ends only.
        let ends = ENDS.with(|e| {
            let n = e.get().wrapping_add(1);
            e.set(n);
            n
        });
        if ends % CLOCK_EVERY != 0 {
            return;
        }
        let now = host::now_nanos() / 1_000_000;
        let due = PENDING.with(|p| {
            p.try_borrow_mut().is_ok_and(|mut p| {
                let due = now.saturating_sub(p.flushed_ms) >= FLUSH_MS;
                if due {
                    p.flushed_ms = now;
                }
                due
            })
        });
        if !due {
            return;
        }
    }
    flush();
}

/// Are requests of this VM other than the calling one live? (Called from a
/// request's own callbacks, which its [`Live`] counts.)
pub fn others_live() -> bool {
    LIVE.with(Cell::get) > 1
}

/// Counts a live HTTP context of this VM from creation to drop.
pub struct Live(());

impl Live {
    /// One more live context.
    pub fn new() -> Live {
        LIVE.with(|l| l.set(l.get().saturating_add(1)));
        Live(())
    }
}

impl Default for Live {
    fn default() -> Live {
        Live::new()
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        LIVE.with(|l| l.set(l.get().saturating_sub(1)));
    }
}
