//! What a VM keeps between its requests ([`VmLocal`]): the down-mark cache
//! (read at most every 100 ms by routing, dropped when this VM writes marks)
//! and the in-flight changes not written yet (takes, moves, releases,
//! queued take-offs: written by a routing once the oldest is
//! `Releases::PUBLISH_MS` old, on every tick, before the poller's
//! reconcile, and at a request end that leaves the VM idle). The algorithms
//! and their invariants are in [`crate::cluster::request`], tested natively.

use super::host::HostShared;
use super::root::Plugin;
use super::stats::HostFailure;
use crate::cluster::request::VmLocal;
use crate::cluster::tables::InFlight;

thread_local! {
    /// This VM's state (the VM is single-threaded: one per worker).
    pub static LOCAL: VmLocal = VmLocal::default();
}

/// This VM wrote the down-mark table: its next request reads it again.
pub fn marks_written() {
    LOCAL.with(|l| l.downs.invalidate());
}

/// Write the waiting in-flight releases (no host call if none wait) and
/// publish the released hosts' gauges at once.
pub fn flush_releases(p: &Plugin) {
    flush_releases_seen(p, None);
}

/// [`flush_releases`] trying `seen` (the picture's read) first.
pub fn flush_releases_seen(p: &Plugin, seen: Option<(InFlight, u32)>) {
    match LOCAL.with(|l| l.releases.flush_seen(&HostShared, &p.keys, seen)) {
        Ok(gauges) => {
            for (addr, n) in gauges {
                p.stats.in_flight_now(&addr, n);
            }
        }
        Err(e) => {
            log::warn!("cannot release in-flight counts: {e:?}");
            p.stats.failure(HostFailure::SharedData);
        }
    }
}
