//! A byte budget for the peer exchange (pure; the filter keeps one per VM,
//! the simulator one per gateway).
//!
//! Every write a gateway publishes is pulled by each of its `N − 1` peers,
//! and it pulls theirs: with every write published, the sync bytes of a
//! gateway (sent + received) are `2 (N − 1) · W` for `W` item bytes
//! published per request, a share of the request bytes that grows with `N`
//! whatever the item size. The budget caps that share at `share` for any
//! `N` by publishing less, and chooses what to drop by value: a record's
//! new blocks are published only if it added at least `threshold`
//! characters beyond the prefix known at routing (a long new prefix saves
//! the most prefill when reused elsewhere; short ones are cheap to prefill
//! again), and the threshold adapts to the budget.
//!
//! Algorithm (a token bucket with an adaptive admission threshold):
//! - every routed request of `bytes` earns `share · bytes / (2 (N − 1))`
//!   bytes of credit (nothing to earn, and no limit, without peers); the
//!   credit is capped at [`BURST`] bytes;
//! - a record whose news is only placement changes (a new holder of a known
//!   prefix: how peers learn that a hot prefix grew) is always published
//!   and pays its cost (the credit may go down to `−BURST`);
//! - a record with new blocks is published if its new extent is at least
//!   the threshold and the credit covers its cost; a record over the
//!   threshold refused for lack of credit raises the threshold by 25 %
//!   (at most [`MAX_THRESHOLD`]); each request that leaves more than half
//!   of [`BURST`] unspent lowers it by 5 % down to the configured floor
//!   (`min_publish_chars`), so the threshold settles where the records it
//!   admits spend what the requests earn.
//!
//! Invariant: over any run, published bytes ≤ earned credit + 2·[`BURST`]
//! (a placement-only record can overdraw by at most `BURST`, and a record is
//! charged before the next one is judged), so sent + received item bytes
//! per gateway stay within `share` of its request bytes plus a constant.
//! Cost: O(1) per request and per record, no allocation.

/// Largest credit kept (bytes): a burst of new prefixes after an idle time.
pub const BURST: f64 = 4_096.0;
/// Largest admission threshold, characters.
pub const MAX_THRESHOLD: f64 = 1_048_576.0;

/// What a record would publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Offer {
    /// Characters the record added beyond the known prefix.
    pub new_chars: usize,
    /// Bytes its news takes on the wire (items).
    pub bytes: usize,
    /// The news has new blocks (else placement changes only).
    pub blocks: bool,
}

/// The budget of one publisher (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Budget {
    share: f64,
    floor: f64,
    credit: f64,
    threshold: f64,
}

impl Budget {
    /// A budget of `share` (fraction of the request bytes, e.g. 0.008) with
    /// the threshold floor `min_chars` (`min_publish_chars`). `share ≤ 0`:
    /// no budget (everything over the floor is published).
    pub fn new(share: f64, min_chars: usize) -> Budget {
        Budget {
            share: if share.is_finite() { share } else { 0.0 },
            floor: min_chars as f64,
            credit: BURST,
            threshold: min_chars as f64,
        }
    }

    /// A routed request of `bytes` request bytes, with `peers` peers.
    pub fn earn(&mut self, bytes: usize, peers: usize) {
        if self.share <= 0.0 || peers == 0 {
            return;
        }
        self.credit = (self.credit + self.share * bytes as f64 / (2 * peers) as f64).min(BURST);
        if self.credit > BURST / 2.0 {
            self.threshold = (self.threshold * 0.95).max(self.floor);
        }
    }

    /// Publish this record? Charges its bytes when it does.
    pub fn admit(&mut self, o: Offer) -> bool {
        if o.blocks && (o.new_chars as f64) < self.threshold {
            return false;
        }
        if self.share <= 0.0 {
            return true;
        }
        let cost = o.bytes as f64;
        if !o.blocks {
            self.credit = (self.credit - cost).max(-BURST);
            return true;
        }
        if self.credit < cost {
            self.threshold = (self.threshold * 1.25).min(MAX_THRESHOLD);
            return false;
        }
        self.credit -= cost;
        true
    }

    /// The current admission threshold, characters.
    pub fn threshold(&self) -> usize {
        self.threshold as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn offer(new_chars: usize, bytes: usize) -> Offer {
        Offer {
            new_chars,
            bytes,
            blocks: true,
        }
    }

    #[test]
    fn without_a_budget_only_the_floor_applies() {
        let mut b = Budget::new(0.0, 512);
        assert!(!b.admit(offer(511, 70)));
        assert!(b.admit(offer(512, 70)));
        for _ in 0..10_000 {
            assert!(b.admit(offer(4096, 1000)));
        }
        // No peers: nothing earned, nothing limited beyond the floor.
        let mut lone = Budget::new(0.01, 512);
        lone.earn(1000, 0);
        assert!(lone.admit(offer(600, 70)));
    }

    #[test]
    fn published_bytes_stay_within_the_share_at_any_n() {
        // Requests of 2 000 B, each offering 60 B of new blocks with a new
        // extent spread over 500..4500 characters (as short unique prompts).
        for peers in [1usize, 3, 7] {
            let mut b = Budget::new(0.01, 512);
            let (mut sent, mut req, mut long_kept, mut long) = (0.0, 0.0, 0, 0);
            for i in 0..50_000usize {
                b.earn(2000, peers);
                req += 2000.0;
                let chars = 500 + (i * 7919) % 4000;
                let kept = b.admit(offer(chars, 60));
                if kept {
                    sent += 60.0;
                }
                if chars >= 4000 {
                    long += 1;
                    long_kept += usize::from(kept);
                }
            }
            // Sent + received (2 · sent · peers) within the share plus the burst.
            let total = 2.0 * sent * peers as f64;
            assert!(
                total <= 0.01 * req + 2.0 * BURST * 2.0 * peers as f64,
                "peers {peers}: {total} of {req}"
            );
            // Not starved: it spends most of what it earns, on the longest first.
            assert!(total >= 0.005 * req, "peers {peers}: {total} of {req}");
            let all = 50_000.0 * 60.0 * 2.0 * peers as f64;
            let short_share = (total / all).min(1.0);
            assert!(
                long_kept as f64 / long as f64 >= short_share,
                "peers {peers}: long kept {long_kept}/{long}, overall {short_share:.2}"
            );
        }
    }

    #[test]
    fn placements_pass_and_the_threshold_comes_back_down() {
        let mut b = Budget::new(0.01, 512);
        // Drain the credit: the threshold rises.
        while b.admit(offer(1000, 1000)) {}
        assert!(b.threshold() > 512 && b.threshold() <= 1250);
        // A placement change passes even without credit.
        assert!(b.admit(Offer {
            new_chars: 0,
            bytes: 20,
            blocks: false,
        }));
        // Idle traffic refills the bucket and lowers the threshold to the floor.
        for _ in 0..100_000 {
            b.earn(2000, 1);
        }
        assert_eq!(b.threshold(), 512);
        assert!(b.admit(offer(600, 70)));
    }
}
