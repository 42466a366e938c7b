//! Prompt tokens queued for prefill per host, in shared data: the input of
//! [`crate::affinity`]'s **Queue** rule ([`crate::affinity::Request::queued_prefill`]).
//!
//! The count a router can keep (`docs/benchmarks.md`, "p90 tail"): when a
//! request is routed, its decision's expected uncached tokens are added to
//! its primary ([`Queued::start`]); at its first response body byte (or its end,
//! whichever comes first) the same amount is taken off ([`Queued::finish`],
//! idempotent). The simulator's `--ours queue=1` counts exactly this.
//!
//! Layout: the `queued` field of each host's entry in the in-flight value
//! ([`InFlight`], `<namespace>inflight`), so the routing-time read is the
//! picture's get and the start rides on the take
//! ([`super::request::Slot::take_later`] with [`Queued::joined`]): no host
//! call of their own. The filter's finish waits in the VM's
//! [`super::request::Releases`] with the take ([`Queued::finish_later`]):
//! both are written netted, so a request whose take was not written yet
//! costs nothing, and other workers see a take or a take-off at most one
//! publish period (10 ms) late. [`read`], [`Queued::start`] and
//! [`Queued::finish`] are the stand-alone forms (one get each, one get +
//! one CAS set each).
//!
//! Invariants: a request adds at most once and takes off exactly what it
//! added, at most once; counts saturate at 0 (a take-off after a reset never
//! wraps). A worker that dies between the two leaves its tokens counted;
//! [`reconcile`] (called by the poller after each admin poll) drops the
//! count of every host with no request in flight, so a leak lasts at most
//! until the host drains.
//!
//! Wired in `src/filter/http.rs` (read with the picture and started with
//! the take at routing with the affinity strategy, finished at the first
//! response body byte or at `on_log`) and `src/filter/poll.rs` (`reconcile`
//! after each admin poll).

use super::request::Releases;
use super::shared::{ShareError, SharedData};
use super::tables::{addr_hash, InFlight, Keys};
use super::view::View;

/// Queued tokens per member of `view` (member order); `None` if the read
/// failed (the caller then routes without the Queue rule).
pub fn read<S: SharedData + ?Sized>(s: &S, k: &Keys, view: &View) -> Option<Vec<u32>> {
    let (t, _) = InFlight::read(s, &k.inflight).ok()?;
    Some(view.queued(&t))
}

/// Drop the count of every host with no request in flight. Returns how many
/// counts were dropped.
///
/// # Errors
/// Shared data failed.
pub fn reconcile<S: SharedData + ?Sized>(s: &S, k: &Keys) -> Result<usize, ShareError> {
    let (t, cas) = InFlight::read(s, &k.inflight)?;
    if !t
        .entries
        .iter()
        .any(|e| e.1.inflight == 0 && e.1.queued > 0)
    {
        return Ok(0); // nothing to drop: no write
    }
    let mut dropped = 0;
    InFlight::modify(s, &k.inflight, Some((t, cas)), |t| {
        dropped = 0;
        for e in t.entries.iter_mut() {
            if e.1.inflight == 0 && e.1.queued > 0 {
                e.1.queued = 0;
                dropped += 1;
            }
        }
        t.entries.retain(|e| e.1 != Default::default());
    })?;
    Ok(dropped)
}

/// One request's share of the count.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Queued {
    /// Host hash and tokens added, until taken off.
    held: Option<(u64, u32)>,
}

impl Queued {
    /// Add `tokens` to `addr` (routing) in a CAS update of its own. A second
    /// call does nothing.
    ///
    /// # Errors
    /// Shared data failed: nothing is held, so nothing is taken off later.
    pub fn start<S: SharedData + ?Sized>(
        &mut self,
        s: &S,
        k: &Keys,
        addr: &str,
        tokens: u32,
    ) -> Result<(), ShareError> {
        if self.held.is_some() || tokens == 0 {
            return Ok(());
        }
        let h = addr_hash(addr);
        InFlight::modify(s, &k.inflight, None, |t| t.add_queued(h, i64::from(tokens)))?;
        self.held = Some((h, tokens));
        Ok(())
    }

    /// The take of this request's in-flight count added `tokens` to `addr`
    /// in the same update ([`super::request::Slot::take`]): hold them. A
    /// second call does nothing.
    pub fn joined(&mut self, addr: &str, tokens: u32) {
        if self.held.is_none() && tokens > 0 {
            self.held = Some((addr_hash(addr), tokens));
        }
    }

    /// Take the added tokens off (first response byte, or the end).
    /// Idempotent.
    ///
    /// # Errors
    /// Shared data failed: the tokens stay counted until [`reconcile`].
    pub fn finish<S: SharedData + ?Sized>(&mut self, s: &S, k: &Keys) -> Result<(), ShareError> {
        let Some((h, tokens)) = self.held.take() else {
            return Ok(());
        };
        InFlight::modify(s, &k.inflight, None, |t| {
            t.add_queued(h, -i64::from(tokens))
        })
        .map(|_| ())
    }

    /// [`Queued::finish`] without a host call: the take-off waits in
    /// `releases` (written, netted with the take, by the VM's next flush).
    /// Idempotent.
    pub fn finish_later(&mut self, releases: &Releases) {
        if let Some((h, tokens)) = self.held.take() {
            releases.push_queued(h, tokens);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::engines::tests::view;
    use super::super::shared::MockShared;
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn start_adds_once_and_finish_takes_off_once() {
        let (s, k, v) = (MockShared::new(), Keys::new("q"), view(3));
        let a = v.addr(0).unwrap().to_string();
        let b = v.addr(2).unwrap().to_string();
        let (mut r1, mut r2, mut r3) = (Queued::default(), Queued::default(), Queued::default());
        r1.start(&s, &k, &a, 30_000).unwrap();
        r1.start(&s, &k, &a, 30_000).unwrap(); // no double count
        r2.start(&s, &k, &a, 500).unwrap();
        r3.start(&s, &k, &b, 7).unwrap();
        assert_eq!(read(&s, &k, &v), Some(vec![30_500, 0, 7]));
        r1.finish(&s, &k).unwrap();
        r1.finish(&s, &k).unwrap(); // idempotent
        assert_eq!(read(&s, &k, &v), Some(vec![500, 0, 7]));
        r2.finish(&s, &k).unwrap();
        r3.finish(&s, &k).unwrap();
        assert_eq!(read(&s, &k, &v), Some(vec![0, 0, 0]));
        // Nothing queued (a full hit): nothing held.
        let mut r4 = Queued::default();
        r4.start(&s, &k, &a, 0).unwrap();
        assert_eq!(r4, Queued::default());
    }

    #[test]
    fn failures_never_double_count_and_reconcile_drops_idle_hosts() {
        let (s, k, v) = (MockShared::new(), Keys::new("q"), view(2));
        let a = v.addr(0).unwrap().to_string();
        let c = v.addr(1).unwrap().to_string();
        // A failed start holds nothing: its finish takes nothing off.
        let mut ok = Queued::default();
        ok.start(&s, &k, &a, 100).unwrap();
        s.fail_next.set(1);
        let mut failed = Queued::default();
        assert!(failed.start(&s, &k, &a, 900).is_err());
        failed.finish(&s, &k).unwrap();
        assert_eq!(read(&s, &k, &v), Some(vec![100, 0]));
        // A failed read: no picture.
        s.fail_next.set(1);
        assert_eq!(read(&s, &k, &v), None);
        // A leaked count (a dead worker) on a host with nothing in flight is
        // dropped; a host with requests in flight keeps its count.
        let mut leak = Queued::default();
        leak.start(&s, &k, &c, 4000).unwrap();
        InFlight::add(&s, &k, addr_hash(&a), 1, None).unwrap();
        assert_eq!(reconcile(&s, &k).unwrap(), 1);
        assert_eq!(read(&s, &k, &v), Some(vec![100, 0]));
        // A take-off after the reset saturates at 0.
        leak.finish(&s, &k).unwrap();
        assert_eq!(read(&s, &k, &v), Some(vec![100, 0]));
    }
}
