//! The `affinity` policy: longest known prefix, cost-aware spill, hot
//! prefixes on several replicas, consistent cold placement.
//!
//! Inputs (all available to the filter at decision time): the
//! [`RoutingKey`] (chained block keys, one per 256 characters of each
//! message, the last one of a message shorter; the key's `ends` give their
//! offsets, so a known depth is turned into characters and tokens by
//! [`RoutingKey::units_at`]), the prompt
//! size, what the [`crate::index`] knows about the key ([`Known`]: depth,
//! holders, age), the per-replica in-flight counts, the [`HashRing`], the
//! [`CostModel`] prices and this configuration. Never the replicas' true
//! cache contents.
//!
//! Algorithm:
//! 1. **Acceptable** replica: available, in-flight `< concurrency_threshold`
//!    and `in_flight + 1 ≤ load_factor × (mean + 1)`, `mean = total / n`. At
//!    high load this is KubeAI's bounded load (`load_factor × mean`); the `+1`
//!    is a slack of `load_factor` requests that keeps an idle or lightly loaded
//!    cluster from spilling (the KubeAI form `(total + 1) / n` accepts nobody
//!    when `n > load_factor` and the cluster is idle). When no available
//!    replica is under `concurrency_threshold` (a saturated fleet) the
//!    threshold is lifted for this decision: it no longer tells replicas
//!    apart, and a holder over it would otherwise spill to a replica just as
//!    far over, re-prefilling its prompt (`docs/benchmarks.md`,
//!    "Out-of-sample families").
//! 2. **Cold placement** `place(excluded)`: walk the ring from the request's
//!    key, keep the first `cold_choices` acceptable replicas not excluded,
//!    take the least loaded; on equal loads one under the request-share
//!    bound ([`crate::share`], when the caller read the counts), then the
//!    one given the fewest new prefixes recently ([`crate::pressure`], when
//!    the caller read it), then the smallest request share, then ring order. Without pressure it is deterministic given the loads, so
//!    every worker and every Envoy agree; with two choices it balances like
//!    power-of-two-choices. Pressure spreads new prefixes over the caches
//!    when loads tie (idle or sequential clients), where the ring alone can
//!    put most of a few prefixes on one replica. If none is acceptable: the
//!    least loaded available replica.
//!    **Short known prefix** ([`AffinityConfig::short_weight`], on): while
//!    the mean in-flight count per replica is at least
//!    [`AffinityConfig::short_min_load`] (2), a fresh known prefix under
//!    `min_match` (a system prompt) whose best holder is within the
//!    coverage-scaled load bound and the share bound replaces the cold
//!    choice `c` when its extra expected delay over `c` (queued prefill
//!    included) is at most [`AffinityConfig::short_weight`] (4) × the
//!    prefill of the known tokens (capped by `routing_budget_ms`): a miss
//!    costs the request its own prefill and costs the same GPU time to the
//!    requests queued behind it on `c`. The reason stays [`Reason::Cold`]
//!    (pending record) and the cold key is unchanged. Under that load
//!    ([`AffinityConfig::short_ties`], on) the same holder replaces `c`
//!    only when it is no slower (extra delay 0: a tie among idle
//!    replicas), so a system prompt's next sessions land where it is
//!    cached instead of wherever the cold tie-break points.
//! 3. **Warm**: when the index knows a fresh prefix (`age ≤ max_age_ms`)
//!    covering at least `min_match` of the hashed window (the first
//!    `prefix_length` characters), the holders (replicas that
//!    were sent it, most recent first) are the warm candidates. Take the least
//!    loaded acceptable holder `h` and the best other replica
//!    `a = place(holders)`. Keep `h` unless the extra wait
//!    `wait_ms(in_flight[h] − in_flight[a])` exceeds the cache-break penalty
//!    `prefill_ms(cached tokens)` (what the spill costs the request: a
//!    spill slower for it than the wait it avoids is never made; budget 0:
//!    penalty 0, pure load balancing among holders); then go to `a`
//!    ([`Reason::Spill`]). If every holder is over the bound, go to `a`
//!    ([`Reason::Spill`]) too: recorded as a new holder, the prefix then
//!    lives on 2…3 replicas and its traffic is split by load among them
//!    (hot prefixes grow instead of scattering).
//!    **Request share** (`share_factor > 0`, the caller read the counts
//!    and the mean in-flight count is under [`crate::share::LIGHT_LOAD`],
//!    [`crate::share`]): holders above the soft share bound are not taken
//!    while another holder is under it, and equal loads among holders go to
//!    the smaller share. If every holder within the load bound is above the
//!    soft share bound, the least loaded of them is kept (warm) unless it is
//!    above the hard bound too; then the request goes to `place(holders)`
//!    ranked by share first (the non-holder with the smallest share), if
//!    that one is under the soft bound ([`Reason::Spill`]: a new holder),
//!    and only if its known prefix **fanned out** (`share_fan_out`,
//!    `fan_out`): an earlier request at least as long went on past the
//!    deepest known block ([`crate::index::Entry::stamp`]) and the prefix
//!    is not a whole earlier prompt (end mark), so this request is one of
//!    several branching off a shared prefix. The next turn of a
//!    conversation (longer than the turn before) is kept: moving it
//!    re-prefills its history, and new conversations' placement evens the
//!    counts out for free; on chat in fast mode those moves were the whole
//!    1.0–1.5 points the bound cost (`docs/benchmarks.md`, "Tenth session:
//!    a share bound on by default").
//!    Such a move **waits while its target is prefilling**
//!    (`share_wait_busy`, with the queue picture): while `place(holders)`
//!    has more prompt tokens queued for prefill than the holder it would
//!    leave, by more than one in-flight request's wait at the cost model's
//!    prices (`prefill_ms(Δqueued) > wait_ms(1)`: a warm request's short
//!    prefill, or a take-off not yet seen, does not count), the request
//!    stays on the holder (warm) and the holder's next request asks again.
//!    Moving onto a replica that is prefilling makes the moved request wait
//!    behind that prefill and stacks a second new prefix there; through
//!    Envoy (the SageMaker-style bench: 7 replicas holding 4 prefixes each)
//!    two moves 0.2–0.3 s apart onto one replica were followed by load
//!    spills off it (its own groups queued behind two prefills) and
//!    evictions (a 5th prefix): 25.9 requests without a cached token per
//!    run before, 24.3 after, hit 90.88 → 91.44 % (means of 20 and 21 runs
//!    on four port bases, +0.56 ± 0.30; on one of them −0.10 ± 0.22:
//!    `docs/benchmarks.md`, "Fourteenth session: miss14"). Waiting costs
//!    no cache hit: the holder is under the load bound; the share
//!    correction comes a request later, and a deferred move can turn into
//!    more moves later.
//!    A known prefix that ends on an **end mark** (a recorded prompt's last
//!    block or last whole block, [`crate::index`]: the request continues that prompt, and
//!    its holder also cached the answer the index cannot see) is warm
//!    whatever its coverage (`continuation`).
//! 4. Otherwise **cold** ([`Reason::Cold`]): `place(∅)`.
//!
//! **Queue** (when the caller passes [`Request::queued_prefill`], the prompt
//! tokens each replica still has to prefill for requests routed there):
//! "least loaded" in steps 2 and 3 becomes "least expected delay", that is
//! `wait_ms(in-flight) + prefill_ms(queued tokens)`, then load. In-flight
//! counts rank a replica busy with one 30 000-token prefill (a second of
//! queueing for whatever comes next) like one decoding a short answer; on
//! the held-out traces that wait made most of the p90 (`docs/benchmarks.md`,
//! "p90 tail"). The spill rule (step 3) still compares in-flight counts:
//! letting the queue decide spills too moved 18 % of requests off their
//! holders and cut the hit rate from 65.7 to 54 % on the same trace (each
//! spill re-prefills elsewhere, which lengthens the queues it fled).
//!
//! **Wait price** (`queue_wait_cap`, on; with a queue picture): every
//! comparison above prices one more in-flight request at the learned wait
//! price, **at most the configured one** (`cost.wait_ms_per_request`):
//! the queued prefill is priced by its own tokens, and what the learner
//! adds above the configured price is work the in-flight count stands in
//! for, not a wait it causes (`wait_price`). The router's regressors
//! (expected uncached tokens, in-flight count) miss the prefills it cannot
//! see (a prefix the engine evicted: a full prefill where a hit was
//! expected; the queue ahead), and both grow with the in-flight count, so
//! the learned slope takes them: on the public Mooncake `synthetic_trace`
//! at 7 replicas it rose to 75–126 ms per request, while a fit of the same
//! runs on the true uncached tokens, the true queue ahead and the decoding
//! count gives 2–8 ms per decoding request. At that price the spill rule
//! moved holders with 4–6 sequences decoding and nothing queued to idle
//! replicas (a 5 000–13 000-token re-prefill, 100–500 ms, where the
//! holder would have answered in 25–55 ms) and cold placement avoided
//! in-flight counts the engines did not feel. The ceiling mirrors the
//! prefill floor (`crate::cost`, "Floor"): the errors of the router's
//! regressors bias the prefill slope down and the wait slope up. Before
//! it (seventh session) the part above the configured price counted in the
//! spill rule as far as the holder's extra queue backed it and in the
//! light-load and placement delays in full; the ceiling everywhere: public
//! trace at 7 replicas hit −0.49 → −0.04 points against the best baseline
//! (10 seeds), overloaded `heldout` (7 × 0.08) 6 → 8 of 8 within 0.5 points
//! (`docs/benchmarks.md`, "Seventeenth session"). Without a queue
//! picture, or with `queue_wait_cap` off, the learned price alone (it is
//! then the only sign of a queue).
//!
//! **Own counts** ([`Loads::per_count`]): behind N gateways that each count only
//! their own requests, an in-flight count stands for about N requests on
//! the replica. The learned price follows (it is learned against the same
//! counts: 47 ms per own request at N = 4 on the shipped trace against 11
//! at one gateway), the configured one does not, so the floor of the spill
//! price is `cost.wait_ms_per_request × per_count` per counted request. With
//! the floor at the configured price per own request, the cap cut the price
//! of 2 165 of 6 776 spill tests at N = 4 (952 of 6 773 at one gateway),
//! mostly to 10–20 ms against a learned 80–300 with no queue on either
//! side, and kept requests on holders 2–3 own requests busier
//! (`docs/multi-gateway.md`, "Ninth session: the spill price at N
//! gateways").
//!
//! **Holder list** ([`CORE_HOLDERS`]): an index entry remembers up to
//! [`crate::index::MAX_HOLDERS`] (7) replicas, most recent first. All of
//! them are holder candidates while some available replica has less than
//! `routing_budget_ms` of prefill queued; when every one has at least that
//! (the fleet is backlogged), only the first [`CORE_HOLDERS`] (3) are.
//! Why both: with 3 holders a hot shared prefix (an agent's tool prompt)
//! stays on 3 replicas and spills off them (`agent`, 16 replicas: p90 17.6 %
//! over CHWBL's, one replica of 16 given no request), while 7 holders for
//! every request spread each prefix over more caches in an overloaded fleet
//! and cost hit rate there (heldout 7 × 0.08: 8 → 5 of 8 traces within
//! 0.5 points of the best baseline; request shares 13.0–15.1 → 11.5–18.5 %,
//! spills 4.7 → 6.5 %). Gated, over 233 simulator runs: hit passes 226 →
//! 228, p90 passes 195 → 197 (`docs/benchmarks.md`, "Twentieth session"
//! and "Twenty-first session"). Where a list of 7 covers the fleet (7
//! replicas) spills become warm routes down the list: the shipped trace at
//! 7 lost 0.2 points of hit (−0.15 → −0.35 against the best baseline).
//! Cost: one pass over the replicas' queues, only for a warm request whose
//! entry has more than [`CORE_HOLDERS`] holders, stopping at the first
//! replica with room.
//!
//! **Second tier** (`tier`, on; [`choose_tiered`]): when a warm request
//! spills to `a = place(holders)` (step 3: every holder of the known prefix
//! over the load bound, or the spill rule moving it off one within the
//! bound), the caller looks up a shallower ladder block of
//! the same prefix whose holders include replicas the deep block's do not
//! ([`crate::index::PrefixIndex::lookup_shallow`], ≤ 3 gets, only then).
//! Its least loaded holder `s` within the load and share bounds is taken
//! instead of `a` when its extra wait over `a`, its queued prefill
//! included, is below the prefill of what it holds (`max(spill_extra(s,
//! a), delay(s) − delay(a)) ≤ prefill_ms(tokens at its depth)`; priced by
//! the in-flight gap alone, the moves cost 57–93 ms of `agent` p90,
//! `docs/benchmarks.md`, "Eighth session: more holders"); it is then a
//! [`Reason::Spill`] expecting those tokens cached. Why: an entry keeps at
//! most [`crate::index::MAX_HOLDERS`] replicas, so a hot shared prefix that
//! needs more keeps rotating its holders, and each spill to a replica
//! outside them re-prefills it; the holders it dropped are still written on
//! the ladder blocks under it (the tier finds them) and still cache most
//! of it. Until the twenty-second session only the first kind of spill
//! asked the tier, and a spill off a busy holder within the bound
//! re-prefilled the whole prefix on `a` (the deepest entry of a prefix
//! often has one holder, its shallower ladder blocks several). The second
//! kind asks it only while some available replica has less than
//! `routing_budget_ms` of prefill queued (`View::backlogged`, as for the
//! holders past the core): in a backlogged fleet the move loads a busier
//! holder of a hot prefix (heldout at 7 replicas × 0.08, p90 63–85 s for
//! every policy: 8 → 6 of 8 p90 passes without the gate). Over 263
//! simulator runs: hit passes 257 → 257, p90 passes 227 → 229, hit gaps
//! smaller (shipped trace at 7 replicas −0.35 → −0.18 points against the
//! best baseline, `uniqmix` 7 −0.36 → −0.24); on 29 fresh-seed runs hit
//! passes 25 → 26 (`docs/benchmarks.md`, "Twenty-second session"). The
//! first kind is not gated (not measured with the gate). Moving a warm
//! request off a holder it would keep to a shallow holder (priced by the
//! tokens it lacks) was measured too and cost 0.5–2.6 points of hit on
//! `uniqmix` (`docs/benchmarks.md`, "Eighth session"; again in the
//! twenty-second, for continuations).
//!
//! **New holder under the prefix** ([`writes_new_holder`];
//! [`crate::index::IndexConfig::new_holder_known`], `Spill`): a spill's
//! target now caches the whole known prefix, but the index lists it only on
//! the deepest known block and the deeper ones. A later request that shares
//! a shallower part (the same system prompt or document under another
//! question) finds the old holders alone and queues behind them, or spills
//! again to a third replica, re-prefilling what the first spill's target
//! holds. So the record of a spill also writes its replica, first, into the
//! known ladder blocks under that depth (merged with their holders: one get
//! and one set each, within the record's `max_writes`, for spills only:
//! 0.3–8 % of requests). Only in a fleet larger than an entry's holder list
//! ([`crate::index::MAX_HOLDERS`], 7): where 7 holders cover the fleet, the
//! shallow entries soon list nearly every replica, and in the overloaded
//! 7-replica sets the extra holders cost `heldout` at 7 × 0.15 one p90 pass
//! (20.5 → 25.4 s on one trace, request shares 12.6–17.6 → 11.0–21.1 %)
//! and fresh `uniqmix` traces 0.24 points of hit. At 16 and 32 replicas
//! (twenty-third session, 352 simulator runs, every 7-replica run
//! byte-identical): hit passes 340 → 343, p90 passes 305 → 308; the
//! small-block `nsblocks` traces at 32 × 0.0766 19 → 20 of 20 in sample
//! (worst −0.51 → −0.44 points against the best baseline) and 7 → 8 of 8
//! on fresh seeds (−0.54 → −0.40), the public trace at 32 replicas 4 → 5
//! of 5 (`docs/benchmarks.md`, "Twenty-third session").
//!
//! **Past the window** (`beyond_window`, 1): the router hashes only the
//! first `prefix_length` characters (65 536, ≈ 16 000 tokens). When the
//! index knows the whole window and the prompt is longer, the holder's
//! cached tokens are the window plus `beyond_window` of the rest (the
//! prompt size comes from the body, [`crate::router::prompt_chars`]): a
//! fully known window is a continuation or a repeat far more often than a
//! divergence just past it. Counting the window only, a 191 000-token
//! prompt with 190 000 tokens cached on its holder was priced as a
//! 16 000-token spill and moved (16.6 s of TTFT against 0.3 s), and the
//! queued prefill of every long repeat after it was overstated by
//! everything past the window (the public Mooncake `synthetic_trace`, 7
//! replicas: 53.5 → 54.7 % hit; `docs/benchmarks.md`, "Tenth session").
//!
//! **Pending prefix** (`pending_progress`, on): a known prefix whose
//! deepest entry is still *pending* (written at routing by
//! [`crate::index::PrefixIndex::record_pending`], not yet confirmed: the
//! filter confirms a 2xx answer at its headers, and an event stream at its
//! first body byte, since streaming servers send their headers before the
//! prefill) is being
//! prefilled on its holder, and the entry's age tells since when: `e` =
//! age − (`max_age_ms` − [`crate::index::PENDING_MS`]). The holder's queue
//! picture still counts the whole prefill (it drops at the first token), so
//! a holder deep into a long prefill of this very prefix looks as dear as
//! one that has not started, and the spill rule (or the load bound) sends
//! the request to re-prefill it all elsewhere. When the spill rule or the
//! bound would move such a request and the prefill has run for `done =
//! min(e, prefill_ms(cached)) ≥ routing_budget_ms`, the least-delay holder
//! (available, under the concurrency threshold and the share bound) is
//! kept if `delay(h) − done + routing_budget_ms ≤ delay(a) + prefill_ms(cached)`:
//! the spill would cost this request more than the budget. Below one
//! budget of progress nothing changes: a burst of requests on a prefix
//! whose prefill just started still spreads over new holders, which
//! prefill in parallel (keeping them on the pending holder from the first
//! request cost a long-document burst up to 1.2 s of p90). On the public
//! Mooncake `synthetic_trace` at 32 replicas with the load scaled, a
//! 191 000-token prompt arriving 10–12 s into the 17 s prefill of the same
//! document on its holder was moved and re-prefilled (17 s of TTFT against
//! SGLang's 5–7 s): +0.25 to +0.86 points of hit at 4 of 21 load levels,
//! no other run of the held-out, criterion or long-document sets changed
//! beyond one p90 (−57 ms) (`docs/benchmarks.md`, "Twelfth session").
//! Approximation: `e` counts from routing, not from the prefill's start,
//! so a prefill that waited in a queue is credited for its wait (the
//! holder's queue picture, which counts that wait, is charged in full).
//!
//! **Light load** (`light_slack`, 8 requests): a holder is over the load
//! bound of step 3 only when it is also more than `light_slack × min(1, 2 ×
//! coverage)` requests above the mean. At a light load the relative bound
//! alone (`2 × (mean + 1)`: 4.6 at a mean of 1.3) sent the next turn of a
//! long conversation off its holder because that holder had 4 requests
//! decoding, re-prefilling 3 000–5 000 cached tokens elsewhere (chat, fast
//! mode: 0.3–0.7 % of all prompt tokens, the largest share of the gap to
//! SGLang; `docs/benchmarks.md`, "Sixth session"). A holder kept by the
//! slack alone must also pass the spill test with its expected delay (the
//! queued prefill included) instead of its in-flight count. With the
//! default load factor the slack decides only below a mean of 6 in flight
//! per replica.
//!
//! **Hot share** ([`AffinityConfig::light_share`], 0.6): below
//! `queue_band_min_load` (4) requests in flight per replica the
//! light-load slack reaches up to `light_share` × the fleet's requests in
//! flight (scaled by coverage like the slack), priced the same way. A
//! slack counted in requests is blind to the fleet's size: at the same
//! load per replica, a prefix family that carries a fixed share of the
//! traffic (the popular prompts under one of a few system prompts) brings
//! its holder that share of N × mean requests, nearly all of them
//! decoding (a decoding sequence adds ~1 % to a step; a prefill in the
//! queue is what delays a new request, and the spill test prices it). On
//! 20 `nsblocks` traces with the load scaled to the fleet (16 replicas at
//! time scale 0.153, 32 at 0.0766: 1.3–1.9 in flight per replica), such
//! holders sat at the slack's limit (9–10 in flight, nothing queued) and
//! lost 40–60 requests per trace unpriced, each re-prefilling a
//! 1 000–3 000-token prefix elsewhere: hit within 0.5 points of the best
//! baseline in 5 / 20 and 0 / 20 traces; with the share 20 / 20 and 10 /
//! 20 (mean gap −0.60 → −0.30 and −1.56 → −0.53 points), p90 still 0.8 /
//! 2.7 ms under the lowest baseline's on average (`docs/benchmarks.md`,
//! "Sixteenth session"). At 7 replicas the share (0.6 × 7 × mean) stays
//! under the slack (mean + 8) up to a mean of 2.5: the same traces at the
//! default pace keep their p90 passes (12 / 20), where any larger fixed
//! slack (10–32 requests) lost 3–5 of them. The SGLang router makes the
//! same trade more loosely: cache-aware until the fleet's in-flight
//! imbalance exceeds 64 requests and 1.5 × the least loaded; the share
//! never lets a holder carry more than 64 requests above the mean
//! ([`HOT_SHARE_MAX_OVER_MEAN`]). It acts on a **pending** prefix too:
//! with `pending_warm` a conversation's next turn that arrives while the
//! turn before is prefilling finds that turn's blocks pending on its
//! holder, and excluded there it lost its history to an idle replica
//! (`nsblocks` at 32 replicas: 3–4 of 20 within 0.5 points of the best
//! baseline instead of 15–18). The price: a burst on a document whose
//! prefill just started spreads later (one `longdoc` trace at 32
//! replicas +178 ms of p90, one `bursty` trace −0.16 points). Cost: O(1).
//!
//! **Overload weight** ([`AffinityConfig::overload_weight`], 4): when the
//! replica a warm request would spill to has itself at least
//! `routing_budget_ms` of prefill queued, the cache-break penalty of step 3
//! is `max(P, min(overload_weight × P, routing_budget_ms))`, `P =
//! prefill_ms(cached)` ([`spill_penalty`]). The
//! spill test prices the request's own wait; in an overloaded fleet (every
//! replica with a backlog) a spill's re-prefill also delays every request
//! that queues behind it on that replica by the same GPU time, as for
//! `short_weight`. On the held-out `heldout` traces at 7 replicas and time
//! scale 0.15 (p90 of 10–40 s for every policy) 10 % of requests spilled
//! that way at a cost of ~2 points against SGLang's never-spilling tree:
//! with the weight, hit within 0.5 points of the best baseline in 6 of 8
//! (4 before); the public trace's overloaded levels +0.8 to +1.3 points
//! (`docs/benchmarks.md`, "Fifteenth session"). Gated by the target's
//! backlog, not the in-flight count: `agent` traces hold 144 requests per
//! replica with short queues, and a weight gated by the in-flight mean
//! cost them +0.6 s of p90.
//!
//! **Queue band** ([`AffinityConfig::queue_band`], 2;
//! [`AffinityConfig::queue_band_min_load`], 4): from a mean of 4 requests
//! in flight per replica, a holder over the relative bound of step 3 but
//! within `queue_band` × that bound (and under the concurrency threshold)
//! stays a warm candidate priced by its expected delay, queue included, as
//! a holder kept by the light-load slack is; unless the request's own known
//! prefix is **pending** there (a burst on a prefix whose prefill just
//! started still spreads: that spill is how a hot prefix gets its second
//! holder). The light-load slack reaches past the relative bound only
//! below a mean of 6 (and for a prefix covering under half the window, much
//! lower), so at 4–9 in flight per replica a holder one request over `2 ×
//! (mean + 1)` lost its request unpriced: the request re-prefilled 1 000–
//! 4 000 cached tokens elsewhere, usually for a worse TTFT (20 `nsblocks`
//! traces at 7 replicas and time scale 0.08: 12–14 such spills per trace,
//! hit within 0.5 points of the best baseline in 7 of 20; with the band 19
//! of 20, p90 passes 18 → 19; `docs/benchmarks.md`, "Fifteenth session").
//! Below a mean of 4 the band stays off: at 2–3 it cost light-load p90
//! (`nsblocks` at the default pace, 7 replicas: passes 12 → 11, +0.06 ms).
//!
//! **Head credit** ([`AffinityConfig::queue_credit`], 0.5): when a holder
//! kept over the relative bound by the light-load slack alone is priced
//! with its queue ([`queued_extra`]), the queued prefill counts at
//! `queue_credit` of its size. The queue picture counts a
//! request's tokens from its routing to its first token, so the prefill in
//! progress is counted whole while, for a request arriving at a uniformly
//! random moment of it, half of it is left on average (with a token budget
//! of several thousand tokens per step, the new request's short uncached
//! part is scheduled right after it). Counted whole, a holder busy with one
//! other prompt's 2 000–3 000-token prefill lost its warm request to an
//! idle replica at a light load: on 20 `nsblocks` traces at 32 replicas,
//! 12–14 spills per trace and 0.26–0.39 points of hit, with a p90 already
//! 1.3 ms under every baseline's (`docs/benchmarks.md`, "Fifteenth
//! session"). Not credited: a queue whose known prefix is **pending** (this
//! request's own prefix being prefilled on its holder, module docs
//! "Pending prefix"): its progress is known from the pending record's age,
//! and a burst on a document whose prefill just started must still spread
//! (credited there, `longdoc` at 7 replicas lost 0.2–1.6 s of p90). Nor a
//! holder at the concurrency threshold, a short-prefix or a second-tier
//! holder: their queues are many requests long, not one prefill in
//! progress (credited there, `agent` at 7 replicas, 144 in flight per
//! replica, lost 39–52 ms of p90 on each of 3 traces).
//!
//! **Holder at the threshold** (`soft_threshold`, on): a holder whose
//! in-flight count reached `concurrency_threshold` while some replica is
//! still under it is not acceptable for step 1, but within the relative
//! load bound it stays a warm candidate; it is kept only if the spill test
//! of step 3 passes with its expected delay (`max(spill_extra, delay(h) −
//! delay(a))`, queued prefill included, as for the light-load slack). In an
//! overloaded fleet (`uniqmix` at 7 replicas, a mean of 180–230 in flight
//! against a threshold of 256) the threshold alone sent 87–90 % of the
//! spills off their holders, each re-prefilling a conversation on a
//! replica whose queue was nearly as long: 1.8–2.1 points of the 2.4–2.7
//! lost to the bound (`docs/benchmarks.md`, "Ninth session"). Priced by the
//! in-flight gap alone (no delay) the holder kept its request into a
//! longer queue: +324 ± 178 ms of `agent` p90 at 7 replicas.
//!
//! **Continuation margin** ([`AffinityConfig::continuation_margin`], 2):
//! a request whose known prefix ends on an end mark (a conversation's next
//! turn, step 3) leaves a holder within the load bound only if the wait it
//! avoids beats its re-prefill by `margin × √mean × wait price` (`mean`:
//! the mean in-flight count). Why: the spill rule compares the holder's
//! in-flight count with the least loaded replica's, and with `N` replicas
//! running about `mean` requests each (standard deviation `√mean` for
//! arrivals at random) the least of `N` counts lies under the mean by
//! chance alone, by 1.35 standard deviations on average at `N` = 7, 1.77
//! at 16, 2.07 at 32, a gap that is gone by the time the request is
//! served; the re-prefill is paid for sure, and a conversation's prefix is
//! its own (moving it gives no other request a second holder, unlike a
//! shared prefix that fans out, "Slot wait"). On the simulator's full-scale
//! chat workload at 16 replicas, 80 and 95 % of saturation (≈ 110 in
//! flight per replica, under vLLM's 256 running sequences, 0.36 ms learned
//! wait price), `affinity` spilled 5.9–7.2 % of the turns (SGLang
//! 0.3–0.4 %) and lost 1.1–1.4 points of hit rate to SGLang; with a
//! margin of 1 −0.3 / −0.4 points (`docs/benchmarks.md`, "Twenty-fifth
//! session"). A margin of 1 still moved the turns of `uniqmix` at 7
//! replicas (60–160 in flight, 47 spills = the whole 0.50 points under
//! GIE tuned on `uniqmix-3`) for gaps within that chance; 2 covers the
//! expected gap up to 32 replicas: over 352 trace runs hit passes 348 →
//! 350, p90 passes unchanged (`docs/benchmarks.md`, "Twenty-seventh
//! session"). Applied to every spill above 64 in flight (not only
//! continuations), two held-out traces at 7 replicas fell from −0.41 /
//! −0.24 to −0.52 / −0.54 points under SGLang: there spills of shared
//! prefixes give them the second holders later requests use. Cost: one
//! square root per warm decision that reaches the spill rule.
//!
//! **Branch weight** ([`AffinityConfig::branch_weight`], 2): a request
//! that **fans out** from its known prefix ([`fan_out`]: a new conversation
//! under a shared system prompt, another question on a document, a new task
//! under an agent's tool prompt) and whose holder is within the load bound
//! pays the spill rule's in-flight gap twice: once for its own wait, once
//! for the next request of the session it starts, which follows it to
//! whichever replica it lands on (that request is a continuation, held
//! there by the continuation margin), and moving it gives the shared prefix
//! a holder that the next branches share. A continuation, or a prompt that
//! goes deeper than anyone before it, pays the gap once. Why: on the
//! full-scale chat workload at 32 replicas the flood of first turns (12 000
//! conversations in 12 s) piled onto the 7 listed holders of the system
//! prompt (105–185 in flight while others ran 1–12, 2–4 s in; the gap at
//! the learned 0.055 ms per request never beat the 9.6 ms re-prefill of 192
//! tokens): p90 49.8 / 52.9 / 57.7 ms at 50 / 80 / 95 % against SGLang
//! tuned's 49.2 / 54.3 / 59.1, the issue's one full-mode p90 miss. With the
//! weight: 49.5 / 52.1 / 55.9 ms (50 %: within the paired CI), hit rates
//! unchanged (5 seeds); over the 352 runs of `scripts/quality-loop.sh` hit
//! passes 350 → 350, p90 passes 308 → 308 (`docs/benchmarks.md`,
//! "Twenty-ninth session"). A weight of 4 gave 48 ms (one seed) but cost
//! `agent` at 32 replicas up to 0.35 points (a 6 000–14 000-token tool
//! prompt re-prefilled on each new holder); 8: hit passes 350 → 336. The
//! gap doubled for every request (not only branches): chat 32 × 95 %
//! −0.22 points. Cost: one multiplication per warm decision that reaches
//! the spill rule.
//!
//! **Slot wait** ([`AffinityConfig::slot_wait`], on): a request sent to a
//! holder over the threshold (the engine's sequence limit) waits for
//! running sequences to finish before its prefill starts; one frees every
//! `run / threshold` on average (Little's law on the running batch, `run`
//! the learned first-token-to-end time, [`CostModel::run_ms`]), so each
//! request over the threshold beyond the alternative's own excess adds that
//! much to the holder's extra wait ([`slot_extra`]). Charged only when the
//! request **fans out** from its known prefix (a new branch, not a
//! conversation's next turn: moving it gives the prefix a second holder
//! that the next branches share) and the alternative is at or under the
//! mean in-flight count (the fleet has room: where every replica nears the
//! threshold, a move re-prefills a prompt onto the next replica to fill).
//! On `agent` at 7 replicas (a 12 000-token tool prompt's one holder at
//! 220–261 in flight against a mean of 106–135, its steps twice as long):
//! p90 +11.4 % → −5.1 % against the lowest baseline, hit −0.14 → −0.10
//! points under the best; charged on every branch, `uniqmix` at 7 (a mean
//! of 170–230 in flight) lost 0.2 points, and a slot price from the whole
//! time in system (queue included) cost `heldout` at 7 × 0.15 0.8 points
//! (`docs/benchmarks.md`, "Nineteenth session"). Not charged: a hot
//! document's one holder past 256 whose alternatives are all above the
//! mean (`longdoc` at 7 replicas, p90 up to twice SageMaker tuned's).
//!
//! Cost: O(N) for the load sums plus a ring walk of a few points; no shared
//! data access (the index lookup and record are done by the caller;
//! [`choose_tiered`] decides twice when it asks for the second tier).
//!
//! Invariants: the primary is an available replica whenever one exists;
//! with no fresh known prefix the choice depends only on the key and the
//! loads; the secondary, when present, differs from the primary.

use crate::cost::CostModel;
use crate::index::{Known, PendingBlocks};
use crate::pressure::Pressure;
use crate::ring::HashRing;
use crate::router::RoutingKey;
use crate::select::Loads;
use crate::share::Share;

/// Policy parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AffinityConfig {
    /// In-flight count at which a replica is not acceptable.
    pub concurrency_threshold: u32,
    /// Bounded-load factor over the mean (KubeAI form).
    pub load_factor: f64,
    /// Characters per token of the served model (prompt size → tokens).
    pub chars_per_token: f64,
    /// Smallest fraction of the hashed window the known prefix must cover to
    /// count as warm.
    pub min_match: f64,
    /// Largest extra wait accepted to keep a warm replica **beyond** the
    /// re-prefill a spill would cost the request ([`spill_penalty`]), and
    /// the cap of the weighted penalties (`short_weight`,
    /// `overload_weight`), milliseconds. 0: pure load balancing among
    /// holders.
    pub routing_budget_ms: f64,
    /// Index entries older than this are treated as evicted, milliseconds.
    pub max_age_ms: u64,
    /// Ring candidates compared by cold placement (1 = ring owner only).
    pub cold_choices: usize,
    /// Place cold requests by the key of the block at `min_match` of the
    /// window (shared by every request that would later count as warm for
    /// this one) instead of the whole-window key: separate routers that have
    /// not seen each other's traffic then agree on where a new prefix goes.
    pub anchor_cold: bool,
    /// Break cold placement's load ties by cache pressure ([`Pressure`]).
    pub spread_cold: bool,
    /// **Continuation margin** (module docs), in standard deviations of an
    /// in-flight count (`√mean`) at the wait price: what a spill of a
    /// conversation's next turn off its holder within the bound must save
    /// beyond its re-prefill. 0: off.
    pub continuation_margin: f64,
    /// **Branch weight** (module docs): how many times the spill rule
    /// counts the in-flight gap of a request that branches off its known
    /// prefix, at a holder within the load bound; values under 1 count as 1
    /// (off).
    pub branch_weight: f64,
    /// Write a pending index record at routing for cold and spilled requests
    /// ([`crate::index::PrefixIndex::record_pending`]).
    pub record_pending: bool,
    /// Treat a known prefix that ends on a recorded prompt's end mark
    /// ([`crate::index::Entry::is_end`]) as warm whatever its coverage.
    pub continuation: bool,
    /// Request-share bound ([`crate::share`]): a holder whose share of recent
    /// requests is above `share_factor / N` (plus a slack) is passed over
    /// for another holder under it, else for the acceptable replica with the
    /// smallest share. 0: off.
    pub share_factor: f64,
    /// Mean in-flight requests per replica below which the share bound acts
    /// ([`crate::share::LIGHT_LOAD`]).
    pub share_light_load: f64,
    /// New prefixes per routed request below which the share floor may act
    /// ([`crate::share::SETTLED`]). 0: no floor.
    pub share_settled: f64,
    /// The share bound moves a warm request to a new holder only when its
    /// known prefix fanned out (`fan_out`: several requests branched off
    /// it, a shared prefix), not for the next turn of a conversation, whose
    /// move re-prefills its history and buys nothing that a new
    /// conversation's placement would not (module docs, "Request share").
    /// Off: every request over the hard bound may be moved.
    pub share_fan_out: bool,
    /// The share bound's move to a new holder waits while its target has
    /// more prompt tokens queued for prefill than the holder it would leave,
    /// by more than one in-flight request's wait at the cost model's prices
    /// (the request stays on the holder, warm): moving then makes the
    /// moved request wait behind that prefill and stacks a second new
    /// prefix on a replica already taking one (module docs, "Request
    /// share"). Needs the queue picture ([`Request::queued_prefill`]).
    pub share_wait_busy: bool,
    /// Absolute slack of a warm holder, requests: a holder is over the load
    /// bound only when it is also more than this many requests above the
    /// mean (module docs, "Light load"). 0: the relative bound alone.
    pub light_slack: f64,
    /// With a queue picture, the learned wait price counts at most at the
    /// configured one (module docs, "Wait price"; `wait_price`).
    pub queue_wait_cap: bool,
    /// The second lookup tier (module docs, "Second tier"): when a warm
    /// request spills (every holder over the load bound, or, while the fleet
    /// is not backlogged, the spill rule moving it off one), the new holder
    /// may be a replica that holds a shallower part of the prefix, priced by
    /// what it holds.
    pub tier: bool,
    /// A holder at or over `concurrency_threshold` but within the load
    /// bounds stays a warm candidate, kept only if the spill rule priced by
    /// its expected delay (queue included) says so (module docs, "Holder
    /// at the threshold"). Off: such a holder is not acceptable and the
    /// request spills while any replica is under the threshold.
    pub soft_threshold: bool,
    /// Price a holder's excess over the threshold by the wait for a
    /// sequence slot (module docs, "Slot wait"), for a request that fans
    /// out from its prefix while the alternative is at or under the mean.
    pub slot_wait: bool,
    /// Also write a pending record at routing, of the blocks past the
    /// known prefix only ([`crate::index::PendingBlocks::PastKnown`]),
    /// for a warm request whose prompt goes beyond the known prefix (the
    /// next turn of a conversation), so that a later turn arriving before
    /// its response finds the deeper prefix on its replica. On since the
    /// sixteenth session (`docs/benchmarks.md`, "Sixteenth session"): in an
    /// overloaded fleet the next turn routinely arrives before the turn
    /// before has answered (`heldout` at 7 replicas, time scale 0.08, p90
    /// of 50–90 s: hit within 0.5 points of the best baseline in 0 → 6 of
    /// 8 traces, +1.47 ± 0.32 points, p90 −3.5 s; 0.15: 6 → 8), and on
    /// small-block traces it gets the next turn to the replica prefilling
    /// the turn before (20 `nsblocks` traces × 7 load levels and fleet
    /// sizes: 106 → 118 of 140 runs meeting both criteria). Cost: the new
    /// blocks' sets at routing, which the response's record writes again
    /// (4.5 → 8.8 sets per request on `nsblocks`, 8.9 → 10.6 on `heldout`,
    /// 16.1 → 16.4 on the public Mooncake trace; a shared-data set is ~4 µs).
    /// The ninth session measured it with the known blocks made pending too
    /// (+0.12 ± 0.12 points on `uniqmix`) and left it off.
    pub pending_warm: bool,
    /// A fresh known prefix under `min_match` (a system prompt under a long
    /// prompt) whose holders are available makes them warm candidates
    /// under the coverage-scaled load bound (`warm_cap`), while the mean
    /// in-flight count per replica is at least `short_min_load`: the
    /// least-delay holder is kept only if its expected delay, queued
    /// prefill included, exceeds the cold choice's by at most
    /// `short_weight` × the prefill of the known tokens (and at most
    /// `routing_budget_ms`); otherwise the request is placed as cold (the
    /// cold key unchanged, no spill to a new holder). Either way its
    /// reason stays [`Reason::Cold`] (it gets the pending record of a cold
    /// request, so that its next turn finds the deeper prefix where it
    /// went); kept on a holder, `expected_cached_tokens` is the known
    /// prefix. Off: such a request is placed by the cold rule alone. On
    /// (the default since the thirteenth session; `docs/benchmarks.md`,
    /// "Thirteenth session: sw13"): +0.15–0.26 points of hit on the
    /// Mooncake conversation trace at 16 and 32 replicas (the cold
    /// requests whose 1.5k–4k-token system prompt SGLang and SageMaker
    /// send to its holder), `nsblocks` p90 unchanged thanks to
    /// `short_min_load`; fast-mode chat +0.30 ± 0.04 points, p90 +0.5 ms.
    /// Cost: O(holders) per cold request with a known prefix.
    ///
    /// This field is the weight `w` of the known tokens' prefill in that
    /// test (extra delay ≤ `w` × prefill; 0 = the rule off). A miss costs the request its own
    /// prefill (weight 1, the local TTFT rule) and also delays every
    /// request that queues behind it on the replica it lands on by the
    /// same GPU time; at the loads where the rule acts (≥ 2 in flight per
    /// replica) that is a few requests, so `w` = 4. Measured with 5 seeds
    /// on the Mooncake trace and its foreign-format copy at 7/16/32
    /// replicas: w = 1 / 2 / 4 gained +0.12–0.17 / +0.16–0.21 /
    /// +0.23–0.30 points of hit at 16/32 over `short_warm` off, p90 within
    /// noise (`docs/benchmarks.md`, "Thirteenth session: sw13").
    pub short_weight: f64,
    /// `short_warm` acts only while the mean in-flight count per replica
    /// (the requests of the replicas counted in the load bound) is at least
    /// this. Under it nobody queues behind a miss, and keeping the holders
    /// of a system prompt concentrates its traffic: on the 20 `nsblocks`
    /// traces (light load, 7 replicas) `short_warm` without this gate
    /// raised p90 by +0.35 ± 0.20 ms (paired) and lost 4 more p90
    /// comparisons; with 2: −0.03 ± 0.13 ms, and the Mooncake gains kept.
    pub short_min_load: f64,
    /// Below `short_min_load`, [`AffinityConfig::short_weight`]'s holder
    /// still replaces the cold choice when its extra expected delay is 0
    /// (module docs, step 2): a tie among idle replicas goes to the one
    /// that holds the known prefix. On 20 `nsblocks` traces at 16 and 32
    /// replicas: +0.03 / +0.08 points of hit, p90 within noise at 7
    /// (`docs/benchmarks.md`, "Fifteenth session"); any weight above 0
    /// there cost p90 (+0.35 to +0.43 ms at 7 replicas).
    pub short_ties: bool,
    /// Share of another prompt's queued prefill counted when a holder kept
    /// by the light-load slack is priced with its queue (module docs,
    /// "Head credit"; 1 = all of it).
    pub queue_credit: f64,
    /// Share of the fleet's requests in flight up to which a holder stays
    /// within the light-load slack, below `queue_band_min_load` in flight
    /// per replica (module docs, "Hot share"; 0 = off).
    pub light_share: f64,
    /// Multiple of the relative load bound up to which a holder over it
    /// stays a warm candidate priced with its whole queue, from
    /// `queue_band_min_load` requests in flight per replica (module docs,
    /// "Queue band"; ≤ 1 = off).
    pub queue_band: f64,
    /// Mean in-flight count per replica from which `queue_band` acts.
    pub queue_band_min_load: f64,
    /// Weight of the cache-break penalty when the spill target itself has
    /// at least `routing_budget_ms` of queued prefill (module docs,
    /// "Overload weight"; 1 = off).
    pub overload_weight: f64,
    /// Share of the prompt past the hashed window (`prefix_length`) that a
    /// holder of the whole window is expected to have cached (module docs,
    /// "Past the window"; 0 = only the window counts).
    pub beyond_window: f64,
    /// Pending progress (module docs, "Pending prefix"): a holder whose
    /// known prefix has been prefilling there for at least
    /// `routing_budget_ms` is kept, over the load bound too, when a spill
    /// would cost this request more than `routing_budget_ms`.
    pub pending_progress: bool,
}

impl AffinityConfig {
    /// Which pending record at routing a request decided for `reason`,
    /// whose lookup knew `known_depth` of its `blocks` blocks, gets (`None`:
    /// none): cold and spilled requests every block (with
    /// `record_pending`), and with `pending_warm` a warm one that extends
    /// its known prefix the blocks past it ([`PendingBlocks`]). Cost: O(1).
    pub fn pending_record(
        &self,
        reason: Reason,
        known_depth: usize,
        blocks: usize,
    ) -> Option<PendingBlocks> {
        if !self.record_pending {
            return None;
        }
        match reason {
            Reason::Cold | Reason::Spill => Some(PendingBlocks::All),
            Reason::Warm => {
                (self.pending_warm && known_depth < blocks).then_some(PendingBlocks::PastKnown)
            }
            Reason::NoKey => None,
        }
    }
}

impl Default for AffinityConfig {
    fn default() -> Self {
        AffinityConfig {
            concurrency_threshold: 256,
            load_factor: 2.0,
            chars_per_token: 4.0,
            min_match: 0.2,
            routing_budget_ms: 2000.0,
            max_age_ms: 600_000,
            cold_choices: 8,
            anchor_cold: false,
            spread_cold: true,
            continuation_margin: 2.0,
            branch_weight: 2.0,
            record_pending: true,
            continuation: true,
            share_factor: DEFAULT_SHARE_FACTOR,
            share_light_load: crate::share::LIGHT_LOAD,
            share_settled: crate::share::SETTLED,
            share_fan_out: true,
            share_wait_busy: true,
            light_slack: DEFAULT_LIGHT_SLACK,
            queue_wait_cap: true,
            tier: true,
            soft_threshold: true,
            slot_wait: true,
            pending_warm: true,
            short_weight: DEFAULT_SHORT_WEIGHT,
            short_min_load: 2.0,
            short_ties: true,
            queue_credit: 0.5,
            light_share: 0.6,
            queue_band: 2.0,
            queue_band_min_load: 4.0,
            overload_weight: 4.0,
            beyond_window: 1.0,
            pending_progress: true,
        }
    }
}

/// Most requests above the mean that [`AffinityConfig::light_share`] lets
/// a holder carry, whatever the fleet's size: the SGLang router's default
/// in-flight imbalance threshold (`--balance-abs-threshold` 64), past which
/// it too routes by load. In a large fleet the share alone would let one
/// replica decode hundreds of sequences (100 replicas at a mean of 3: 180),
/// which the TTFT model does not price (their inter-token latency).
pub const HOT_SHARE_MAX_OVER_MEAN: f64 = 64.0;

/// Default [`AffinityConfig::light_slack`]: 8 requests. Below a mean of 6
/// in flight per replica (`2 × (mean + 1) < mean + 8` with the default
/// load factor) it is what decides; above, the relative bound.
pub const DEFAULT_LIGHT_SLACK: f64 = 8.0;

/// Why the primary was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// A replica known to hold the prefix.
    Warm,
    /// A known prefix exists but its holders were too busy: a new holder.
    Spill,
    /// Nothing (fresh, large enough) known: cold placement.
    Cold,
    /// No key: least loaded.
    NoKey,
}

impl Reason {
    /// Label for stats and the decision header.
    pub const fn as_str(self) -> &'static str {
        match self {
            Reason::Warm => "warm",
            Reason::Spill => "spill",
            Reason::Cold => "cold",
            Reason::NoKey => "no_key",
        }
    }
}

/// A decision.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Choice {
    /// Replica to use.
    pub primary: usize,
    /// Replica to retry on.
    pub secondary: Option<usize>,
    /// Why.
    pub reason: Reason,
    /// Prompt tokens expected from the primary's cache.
    pub expected_cached_tokens: f64,
    /// Prompt tokens estimated from the body size.
    pub prompt_tokens: f64,
    /// The decision would use the second lookup tier
    /// ([`crate::index::PrefixIndex::lookup_shallow`]) if the caller gave
    /// it: a known prefix of ≥ 2 blocks whose request spilled to a new
    /// holder (every holder over the load bound, or, while the fleet is not
    /// backlogged, the spill rule moving it off one within it), with `tier`
    /// on and no
    /// [`Request::shallow`] given ([`choose_tiered`]: and its lookup found
    /// none).
    pub tier_wanted: bool,
}

impl Choice {
    /// Tokens the primary is expected to prefill (for [`CostModel::observe`]).
    pub fn expected_uncached_tokens(&self) -> f64 {
        (self.prompt_tokens - self.expected_cached_tokens).max(0.0)
    }
}

/// Default [`AffinityConfig::share_factor`]: off (`envoy/envoy.yaml` sets
/// 1.0, which meets SageMaker's per-replica share band end to end). Its hard
/// move no longer costs chat (it moves only requests whose known prefix
/// fanned out, [`AffinityConfig::share_fan_out`]), but on the public Mooncake
/// `synthetic_trace` at 32 replicas and a light load it still costs 0.8
/// points of hit rate for no TTFT gain (`docs/benchmarks.md`, "Tenth
/// session: a share bound on by default", and the lead's check after it).
pub const DEFAULT_SHARE_FACTOR: f64 = 0.0;

/// Default [`AffinityConfig::short_weight`] (the filter's
/// `short_prefix_weight`).
pub const DEFAULT_SHORT_WEIGHT: f64 = 4.0;

const MAX_CHOICES: usize = 8;

/// Holders of an entry that stay candidates when the whole fleet is
/// backlogged (module docs, "Holder list"); the ones past them, up to
/// [`crate::index::MAX_HOLDERS`], only while some replica has room.
pub const CORE_HOLDERS: usize = 3;

struct View<'a> {
    loads: Loads<'a>,
    pressure: Option<&'a Pressure>,
    share: Option<&'a Share>,
    /// [`Share::limit`] (infinite without counts or with the bound off).
    share_limit: f64,
    share_hard: f64,
    /// Prompt tokens queued for prefill per replica ([`Request::queued_prefill`]).
    queued: Option<&'a [u32]>,
    /// Prices: ms per in-flight request ([`wait_price`]), ms per 1000
    /// prefill tokens.
    prices: (f64, f64),
    all: bool,
    n: usize,
    cap: f64,
    threshold: u32,
    /// [`AffinityConfig::queue_credit`] for this request: 1 when its known
    /// prefix is pending (module docs, "Head credit").
    credit: f64,
}

impl View<'_> {
    fn available(&self, i: usize) -> bool {
        i < self.n && (self.all || self.loads.is_available(i))
    }
    fn load(&self, i: usize) -> u32 {
        self.loads.of(i)
    }
    /// Prompt tokens queued for prefill on `i` (0 without a queue picture).
    fn queued_tokens(&self, i: usize) -> u32 {
        self.queued.and_then(|q| q.get(i).copied()).unwrap_or(0)
    }
    /// ms to prefill `credit` of the tokens queued on `i`, at the view's
    /// price (0 without a queue picture).
    fn queued_ms(&self, i: usize, credit: f64) -> f64 {
        self.prices.1 * credit * f64::from(self.queued_tokens(i)) / 1000.0
    }
    /// Has `i` a whole routing budget of prefill queued (`queued_ms ≥
    /// routing_budget_ms`)? Never without a queue picture (unless the
    /// budget is 0).
    fn over_budget(&self, i: usize, cfg: &AffinityConfig) -> bool {
        self.queued_ms(i, 1.0) >= cfg.routing_budget_ms
    }
    /// Is every available replica [`View::over_budget`]? `false` without a
    /// queue picture. O(n), stops at the first replica with room.
    fn backlogged(&self, cfg: &AffinityConfig) -> bool {
        self.queued.is_some()
            && (0..self.n)
                .filter(|&i| self.available(i))
                .all(|i| self.over_budget(i, cfg))
    }
    /// Available and under the concurrency threshold, with room for one
    /// more request within `limit` (`in_flight + 1 ≤ limit`).
    fn room_under(&self, i: usize, limit: f64) -> bool {
        self.available(i) && self.load(i) < self.threshold && f64::from(self.load(i)) + 1.0 <= limit
    }
    /// Expected delay before a new request's prefill starts on `i`, whole
    /// ms: `wait_ms(in-flight) + prefill_ms(queued prefill tokens)`; 0
    /// without a queue picture (the order is then the load's alone).
    fn delay(&self, i: usize) -> u64 {
        self.delay_at(i, 1.0)
    }
    /// [`View::delay`] with `credit` of the queued tokens counted.
    fn delay_at(&self, i: usize, credit: f64) -> u64 {
        if self.queued.is_none() {
            return 0;
        }
        let ms = self.prices.0 * f64::from(self.load(i)) + self.queued_ms(i, credit);
        if ms.is_finite() && ms > 0.0 {
            ms.min(u64::MAX as f64) as u64
        } else {
            0
        }
    }
    /// Holder order: expected delay, then load, then the request share (0
    /// without counts).
    fn holder_rank(&self, i: usize) -> (u64, u32, u8) {
        (self.delay(i), self.load(i), self.share_of(i))
    }
    /// Placement order: expected delay, load, over the share bound, recent
    /// new prefixes (0 without pressure), then the request share (0 without
    /// counts). `by_share` (a new holder for the share bound): under the
    /// bound first, then the fewest new prefixes (the cache that has room:
    /// a split group adds a prefix to its new holder), then the share, then
    /// delay and load.
    fn rank(&self, i: usize, by_share: bool) -> [u64; 5] {
        let over = u64::from(self.over_share(i));
        let share = u64::from(self.share_of(i));
        let pressure = u64::from(self.pressure.map_or(0, |p| p.of(i)));
        let (delay, load) = (self.delay(i), u64::from(self.load(i)));
        if by_share {
            [over, pressure, share, delay, load]
        } else {
            [delay, load, over, pressure, share]
        }
    }
    fn share_of(&self, i: usize) -> u8 {
        self.share.map_or(0, |s| s.of(i))
    }
    /// Above the request-share bound ([`crate::share`])?
    fn over_share(&self, i: usize) -> bool {
        self.share.is_some_and(|s| s.over(i, self.share_limit))
    }
    /// Above the request-share bound for placing a new holder?
    fn over_hard(&self, i: usize) -> bool {
        self.share.is_some_and(|s| s.over(i, self.share_hard))
    }
    fn acceptable(&self, i: usize) -> bool {
        let l = self.load(i);
        self.available(i) && l < self.threshold && f64::from(l) + 1.0 <= self.cap
    }
}

fn place(
    ring: &HashRing,
    key: u64,
    v: &View<'_>,
    excluded: &[usize],
    choices: usize,
    by_share: bool,
) -> Option<usize> {
    let mut picks = [0usize; MAX_CHOICES];
    let mut m = 0;
    let want = choices.clamp(1, MAX_CHOICES);
    let mut least: Option<usize> = None;
    for c in ring.candidates(key) {
        if excluded.contains(&c) || !v.available(c) {
            continue;
        }
        if least.map_or(true, |b| v.load(c) < v.load(b)) {
            least = Some(c);
        }
        if v.acceptable(c) {
            picks[m] = c;
            m += 1;
            if m == want {
                break;
            }
        }
    }
    let mut best: Option<usize> = None;
    for &c in &picks[..m] {
        if best.map_or(true, |b| v.rank(c, by_share) < v.rank(b, by_share)) {
            best = Some(c);
        }
    }
    best.or(least)
}

/// The concurrency threshold in force: `threshold` while some available
/// replica (`load_of(i)` is `Some`) is under it, else none (`u32::MAX`).
/// When every replica is at or over it the fleet is saturated and the
/// threshold no longer tells replicas apart: a holder over it would spill
/// to a replica just as far over (the fallback of [`place`] is the least
/// loaded, acceptable or not), re-prefilling its whole prompt there and
/// adding prefill work to a saturated fleet. The relative bound and the
/// cost rule still decide. Cost: O(N).
fn saturated_threshold(threshold: u32, n: usize, load_of: impl Fn(usize) -> Option<u32>) -> u32 {
    if (0..n).any(|i| load_of(i).is_some_and(|l| l < threshold)) {
        threshold
    } else {
        u32::MAX
    }
}

/// The wait price of one more in-flight request, ms (module docs, "Wait
/// price"): the learned price, at most the configured one (times
/// [`Loads::per_count`], module docs "Own counts") when there is a queue
/// picture and `queue_wait_cap` is on. Cost: O(1).
fn wait_price(
    cost: &CostModel,
    loads: Loads<'_>,
    queued: Option<&[u32]>,
    cfg: &AffinityConfig,
) -> f64 {
    let learned = cost.wait_ms(1.0);
    if queued.is_some() && cfg.queue_wait_cap {
        learned.min(cost.config().wait_ms_per_request * loads.per_count())
    } else {
        learned
    }
}

/// The extra wait the spill rule charges for keeping holder `h` instead
/// of moving to `a` (module docs, "Wait price"): the in-flight gap at the
/// view's wait price ([`wait_price`]). Cost: O(1).
fn spill_extra(v: &View<'_>, h: usize, a: usize) -> f64 {
    v.prices.0 * f64::from(v.load(h).saturating_sub(v.load(a)))
}

/// [`spill_extra`] with the queued prefill counted too: `max(spill_extra,
/// delay(h) − delay(a))`, the price of keeping `h` when the load bound
/// alone does not vouch for it (light-load slack, the concurrency
/// threshold, a second-tier or short-prefix holder). With `head` (a holder
/// kept by the light-load slack alone) the queued tokens count at the
/// request's head credit (module docs, "Head credit"). Cost: O(1).
fn queued_extra(v: &View<'_>, (h, a): (usize, usize), head: bool) -> f64 {
    let credit = if head { v.credit } else { 1.0 };
    let queue = v.delay_at(h, credit).saturating_sub(v.delay_at(a, credit));
    spill_extra(v, h, a).max(queue as f64)
}

/// The cache-break penalty of the spill rule (module docs, step 3), ms:
/// `max(own, min(w × own, budget))` with `own` the prefill of the
/// request's cached tokens (what a spill costs the request itself), `w` the
/// overload weight, `budget` = `routing_budget_ms`; 0 when the budget is 0
/// (pure load balancing among holders). The budget caps only what the
/// cache may cost the request **beyond** its own re-prefill: a spill slower
/// for the request than the wait it avoids is never made. Cost: O(1).
fn spill_penalty(own: f64, w: f64, budget: f64) -> f64 {
    if budget > 0.0 {
        (w * own).min(budget).max(own)
    } else {
        0.0
    }
}

/// The slot wait of keeping holder `h` instead of moving to `a` (module
/// docs, "Slot wait"), ms: the requests over the concurrency threshold
/// that `h` would have with this one, beyond `a`'s, each at `run /
/// threshold` ([`CostModel::run_ms`]). 0 with no threshold in force
/// (none configured, or every replica at it) or no run time learned yet.
/// Cost: O(1).
fn slot_extra(v: &View<'_>, cost: &CostModel, h: usize, a: usize) -> f64 {
    if v.threshold == u32::MAX || v.threshold == 0 {
        return 0.0;
    }
    let over = |i: usize| v.load(i).saturating_add(1).saturating_sub(v.threshold);
    f64::from(over(h).saturating_sub(over(a))) * cost.run_ms() / f64::from(v.threshold)
}

/// What is known about one request at decision time.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// The routing key (`Router::key`).
    pub key: &'a RoutingKey,
    /// Prompt size in characters (the body size is a fine estimate).
    pub prompt_chars: usize,
    /// What the index knows ([`crate::index::PrefixIndex::lookup`]).
    pub known: Option<&'a Known>,
    /// In-flight counts and availability.
    pub loads: Loads<'a>,
    /// Rotates ties when there is no key (a counter).
    pub ticket: u64,
    /// Recent new prefixes per replica ([`crate::pressure`]): breaks load
    /// ties of cold placement. `None`: ring order.
    pub pressure: Option<&'a Pressure>,
    /// Recent requests per replica ([`crate::share`]): the share bound.
    /// `None`: no bound.
    pub share: Option<&'a Share>,
    /// Prompt tokens routed to each replica whose prefill has not finished
    /// (the expected uncached tokens of requests without a first token
    /// yet). With it, holders and cold candidates are ranked by expected
    /// delay before their prefill starts (module docs, "Queue"). `None`: by
    /// load.
    pub queued_prefill: Option<&'a [u32]>,
    /// The second lookup tier: a shallower block of the prefix whose
    /// holders include replicas that `known`'s do not
    /// ([`crate::index::PrefixIndex::lookup_shallow`]). `None`: unknown.
    pub shallow: Option<&'a Known>,
}

/// Does a decision write its replica, as a new holder, into the shallower
/// known ladder blocks of the request's prefix
/// ([`crate::index::NewHolder::Spill`], module docs "New holder under the
/// prefix")? A spill (`reason`), in a fleet of more than
/// [`crate::index::MAX_HOLDERS`] `replicas`. O(1).
pub fn writes_new_holder(reason: Reason, replicas: usize) -> bool {
    reason == Reason::Spill && replicas > crate::index::MAX_HOLDERS
}

/// Would `known` make a request warm (fresh, and covering at least
/// `min_match` of the hashed window)? Returns the coverage. The caller
/// reads the [`Pressure`] only for requests that are not: only cold
/// placement uses it.
pub fn warm_coverage(key: &RoutingKey, known: Option<&Known>, cfg: &AffinityConfig) -> Option<f64> {
    let k = known.filter(|k| k.age_ms <= cfg.max_age_ms)?;
    // Coverage of what the router hashed (the prompt may go on beyond
    // `prefix_length`; a fully known window says nothing against it).
    let seen = key.units_at(k.depth).min(key.units) as f64;
    let units = key.units.max(1) as f64;
    let coverage = seen / units;
    if cfg.continuation && k.entry.is_end() {
        // A continuation: the request extends a prompt routed before to its
        // last whole block (turn n + 1 of a conversation). The holder also
        // cached that prompt's answer, which the index cannot see, so the
        // share of the window it holds is unknown and `min_match` does not
        // apply.
        return Some(coverage);
    }
    (seen >= cfg.min_match * units).then_some(coverage)
}

/// Decide; see the module docs. Without the second tier's lookup: a
/// decision that would use it says so ([`Choice::tier_wanted`]); see
/// [`choose_tiered`].
pub fn choose(
    ring: &HashRing,
    req: &Request<'_>,
    cost: &CostModel,
    cfg: &AffinityConfig,
) -> Choice {
    decide(ring, req, cost, cfg, None)
}

/// [`choose`] with the second lookup tier: when the decision reaches a
/// spill that would use it ([`Choice::tier_wanted`]), `shallow(known)` is
/// asked for it there (the caller's
/// [`crate::index::PrefixIndex::lookup_shallow`]: a few gets) and the
/// spill is priced with what it finds. Likewise `pressure()` (the
/// caller's [`Pressure::read`]) is asked, when [`Request::pressure`] is
/// `None`, only for a warm request that the share bound may move to a new
/// holder (module docs, "Request share"): the new holder is ranked by it.
/// Cost: one [`choose`] (O(N)) and at most one call of each, only on those
/// paths. Same decision as [`choose`] given [`Request::shallow`] =
/// `shallow(known)` when the tier is wanted (everything before the spill
/// rule is independent of it) and [`Request::pressure`] = `pressure()`
/// when it is asked.
pub fn choose_tiered(
    ring: &HashRing,
    req: &Request<'_>,
    cost: &CostModel,
    cfg: &AffinityConfig,
    shallow: impl FnOnce(&Known) -> Option<Known>,
    pressure: impl FnOnce() -> Option<Pressure>,
) -> Choice {
    let mut shallow = Some(shallow);
    let mut once = |k: &Known| shallow.take().and_then(|f| f(k));
    let mut pressure = Some(pressure);
    let mut read = || pressure.take().and_then(|f| f());
    decide(ring, req, cost, cfg, Some((&mut once, &mut read)))
}

/// The caller's lookups as [`decide`] takes them: the second tier's, and
/// the pressure counters.
type Lookups<'a> = (
    &'a mut dyn FnMut(&Known) -> Option<Known>,
    &'a mut dyn FnMut() -> Option<Pressure>,
);

/// [`choose`], with `lookups` the caller's lookups ([`choose_tiered`]) if
/// it has them (each called at most once; `dyn`, so that the filter holds
/// one copy of the decision, not one per caller).
fn decide(
    ring: &HashRing,
    req: &Request<'_>,
    cost: &CostModel,
    cfg: &AffinityConfig,
    lookups: Option<Lookups<'_>>,
) -> Choice {
    let (lookup, read_pressure) = match lookups {
        Some((l, p)) => (Some(l), Some(p)),
        None => (None, None),
    };
    // Pressure counters read here (`read_pressure`), outliving the view.
    let fetched: Option<Pressure>;
    let (key, prompt_chars, known, loads, ticket) =
        (req.key, req.prompt_chars, req.known, req.loads, req.ticket);
    let n = ring.len();
    let all = !(0..n).any(|i| loads.is_available(i));
    let (total, count) = if all {
        Loads::new(loads.in_flight).total(n)
    } else {
        loads.total(n)
    };
    // The share bound balances a light load only (`share_light_load`).
    let share = req
        .share
        .filter(|_| (total as f64) < cfg.share_light_load * count.max(1) as f64);
    let (share_limit, share_hard) = share.map_or((f64::INFINITY, f64::INFINITY), |s| {
        s.limits(cfg.share_factor, n, |i| all || loads.is_available(i))
    });
    // Since when the request's own known prefix has been prefilling, if its
    // entry is a pending record (read by the head credit, the queue band
    // and `pending_progress`).
    let pending = req
        .known
        .and_then(|k| crate::index::pending_elapsed_ms(k.age_ms, cfg.max_age_ms));
    let mut v = View {
        loads,
        pressure: req.pressure,
        share,
        share_limit,
        share_hard,
        queued: req.queued_prefill,
        prices: (
            wait_price(cost, loads, req.queued_prefill, cfg),
            cost.prefill_ms(1000.0),
        ),
        all,
        n,
        cap: cfg.load_factor * (total as f64 / count.max(1) as f64 + 1.0),
        threshold: saturated_threshold(cfg.concurrency_threshold, n, |i| {
            (all || loads.is_available(i)).then(|| loads.of(i))
        }),
        credit: if pending.is_some() {
            1.0
        } else {
            cfg.queue_credit.clamp(0.0, 1.0)
        },
    };
    let cpt = cfg.chars_per_token.max(0.1);
    let prompt_tokens = (prompt_chars.max(key.units) as f64 / cpt).max(1.0);
    let Some(window_key) = key.key else {
        // No key: least loaded, ties rotated by the ticket.
        let off = if n == 0 {
            0
        } else {
            (ticket % n as u64) as usize
        };
        let primary = (0..n)
            .map(|k| (off + k) % n)
            .filter(|&i| v.available(i))
            .min_by_key(|&i| v.load(i))
            .unwrap_or(0);
        return Choice {
            primary,
            secondary: (0..n).find(|&i| i != primary && v.available(i)),
            reason: Reason::NoKey,
            expected_cached_tokens: 0.0,
            prompt_tokens,
            tier_wanted: false,
        };
    };
    let mean1 = total as f64 / count.max(1) as f64 + 1.0;
    let ring_key = if cfg.anchor_cold && !key.blocks.is_empty() {
        // The first block reaching `min_match` of the window (blocks are
        // uneven: by units, not by count).
        let n = key.blocks.len();
        let want = (cfg.min_match * key.units as f64).ceil() as usize;
        let i = key
            .ends
            .partition_point(|&e| (e as usize) < want)
            .min(n - 1);
        key.blocks.get(i).copied().unwrap_or(window_key)
    } else {
        window_key
    };
    // `View::backlogged` (O(n)), asked by the holder list and by a spill
    // off a holder within the bound: computed at most once.
    let backlog = std::cell::Cell::new(None);
    let backlogged = |v: &View<'_>| match backlog.get() {
        Some(b) => b,
        None => {
            let b = v.backlogged(cfg);
            backlog.set(Some(b));
            b
        }
    };
    let warm = known.and_then(|k| {
        let coverage = warm_coverage(key, Some(k), cfg)?;
        let cached = known_tokens(key, k, prompt_tokens, cpt, cfg);
        let mut holders = [0usize; crate::index::MAX_HOLDERS];
        let mut m = 0;
        // The holders past the core ones only while the fleet has room
        // (module docs, "Holder list"); asked only when there are some.
        let cap = if k.entry.holders().nth(CORE_HOLDERS).is_some() && backlogged(&v) {
            CORE_HOLDERS
        } else {
            crate::index::MAX_HOLDERS
        };
        for h in k.entry.holders().filter(|&h| v.available(h)).take(cap) {
            holders[m] = h;
            m += 1;
        }
        (m > 0).then_some((holders, m, cached, coverage))
    });
    // Does this request branch off its known prefix ([`fan_out`])? Asked
    // once: the share bound's move and the slot wait read it.
    let branches = known.is_some_and(|k| fan_out(key, k, prompt_chars));
    // The share bound may move this warm request to a new holder (a holder
    // over the soft bound at a light load, and the known prefix fanned
    // out): the new holder is ranked by pressure first, and the floor
    // (`crate::share`, "Floor": while a replica that has room is under it,
    // the hard bound is the soft one) reads it too; read now if the caller
    // did not (only warm requests come here; cold ones read it up front).
    // May the hard share bound move this request at all (`share_fan_out`)?
    // Decided once: the pressure read below and the move itself ask it.
    let movable = !cfg.share_fan_out || branches;
    let may_move = share
        .zip(warm.as_ref())
        .filter(|(_, (h, m, _, _))| movable && h[..*m].iter().any(|&r| v.over_share(r)));
    if let Some((s, _)) = may_move {
        if v.pressure.is_none() {
            fetched = read_pressure.and_then(|f| f());
            v.pressure = fetched.as_ref();
        }
        let open = s.floor_open(cfg.share_factor, cfg.share_settled, v.pressure, n, |i| {
            (v.available(i), v.acceptable(i))
        });
        if open {
            v.share_hard = v.share_limit;
        }
    }
    let secondary_of = |k: u64, p: usize| ring.candidates(k).find(|&c| c != p && v.available(c));
    if let Some((holders, m, cached, coverage)) = warm {
        let holders = &holders[..m];
        // Slack by value: a holder may exceed the mean by the load factor's
        // slack times the share of the prompt it holds (plus one request), so
        // a short shared prefix (a system prompt under long, varied prompts)
        // does not pull its traffic onto a few replicas, while a prefix that
        // is most of the prompt keeps the full bound.
        let coverage = coverage.clamp(0.0, 1.0);
        let warm_cap = warm_cap(&v, cfg, mean1, coverage);
        let in_bound = |h: usize| v.acceptable(h) && f64::from(v.load(h)) + 1.0 <= warm_cap;
        // A holder at the concurrency threshold (`soft_threshold`): within
        // the load bounds it stays a candidate; the spill rule prices it by
        // its expected delay (below).
        let at_threshold = |h: usize| cfg.soft_threshold && v.load(h) >= v.threshold;
        let holder_bound = |h: usize| {
            in_bound(h)
                || (at_threshold(h)
                    && v.available(h)
                    && f64::from(v.load(h)) + 1.0 <= v.cap.min(warm_cap))
        };
        // Light load: within `light_slack` requests of the mean, or under
        // the queue band's load within `light_share` of the fleet's requests
        // (a hot prefix's family, pending or not), both
        // scaled by value like the relative slack, a holder is not over the
        // bound, whatever the ratio; kept only if its extra expected delay,
        // queue included, is below the penalty (below).
        let by_value = (2.0 * coverage).min(1.0);
        let hot = if mean1 - 1.0 < cfg.queue_band_min_load {
            (cfg.light_share * total as f64).min(mean1 - 1.0 + HOT_SHARE_MAX_OVER_MEAN)
        } else {
            0.0
        };
        let light_limit = (mean1 - 1.0 + cfg.light_slack * by_value).max(hot * by_value);
        let light = |h: usize| v.room_under(h, light_limit);
        // Queue band (module docs): over the relative bound, within
        // `queue_band` × it, from `queue_band_min_load` in flight, priced
        // with its whole queue; not while this prefix is pending.
        let band = |h: usize| {
            cfg.queue_band > 1.0
                && pending.is_none()
                && mean1 - 1.0 >= cfg.queue_band_min_load
                && v.room_under(h, cfg.queue_band * warm_cap)
        };
        let load_ok = |h: usize| holder_bound(h) || light(h) || band(h);
        // Holders within both bounds; equal loads go to the smaller share.
        let best_ok = holders
            .iter()
            .copied()
            .filter(|&h| load_ok(h) && !v.over_share(h))
            .min_by_key(|&h| v.holder_rank(h));
        // A holder within the load bound but over the share bound: leave it
        // for the replica with the smallest share if that one is under it.
        let share_held = holders
            .iter()
            .copied()
            .filter(|&h| load_ok(h))
            .min_by_key(|&h| v.holder_rank(h));
        let by_share = best_ok.is_none() && share_held.is_some();
        let alt = place(ring, ring_key, &v, holders, cfg.cold_choices, by_share);
        // Over the hard bound, a move to `alt` (under the soft one) is
        // worth it for a prefix that several requests branched off, not for
        // the next turn of one conversation (`share_fan_out`, module docs).
        let hard = share_held.is_some_and(|h| v.over_hard(h))
            && !(by_share && !movable && alt.is_some_and(|a| !v.over_share(a)));
        // A move for the share bound waits while its target is prefilling
        // more than the holder: its extra queued prefill is priced above
        // one in-flight request's wait (`share_wait_busy`, module docs).
        let target_busy = |a: usize| {
            cfg.share_wait_busy
                && share_held
                    .is_some_and(|h| v.queued_ms(a, 1.0) - v.queued_ms(h, 1.0) > v.prices.0)
        };
        // Second tier (module docs): the least loaded acceptable replica
        // that holds a shallower part of the prefix `s` (not a holder of the
        // deep block), with the tokens it holds.
        let tier_of = |s: &Known| {
            let held = (key.units_at(s.depth) as f64 / cpt).min(cached);
            s.entry
                .holders()
                .filter(|&r| !holders.contains(&r) && in_bound(r) && !v.over_share(r))
                .min_by_key(|&r| v.holder_rank(r))
                .map(|r| (r, held))
        };
        let ask = cfg.tier && req.shallow.is_none() && known.is_some_and(|k| k.depth > 1);
        // A spill to a new holder instead of `a`: one that holds a
        // shallower part (`tier`) is worth its extra wait over `a` up to
        // what it saves.
        let new_holder = |a: usize, tier: Option<(usize, f64)>, moved: &mut f64| match tier {
            Some((s, held)) if queued_extra(&v, (s, a), false) <= cost.prefill_ms(held) => {
                *moved = held;
                (s, Reason::Spill)
            }
            _ => (a, Reason::Spill),
        };
        let mut tier_wanted = false;
        // Tokens a new holder from the second tier is expected to hold.
        let mut moved_cached = 0.0;
        // A load spill to `a` (every holder over the bound, or the spill
        // rule moved the request off one within it): the second tier may
        // take it instead.
        let mut to_tier = false;
        let (primary, reason) = match (best_ok, alt) {
            (None, Some(a)) if by_share && (v.over_share(a) || !hard || target_busy(a)) => {
                match share_held {
                    // Nobody under the share bound: moving costs a prefill
                    // and buys no share; or the target is prefilling.
                    Some(h) => (h, Reason::Warm),
                    None => (a, Reason::Spill),
                }
            }
            (Some(h), None) => (h, Reason::Warm),
            (Some(h), Some(a)) => {
                // Kept over the relative bound by the light-load slack
                // (its queued prefill at the head credit), by the queue
                // band, or at the concurrency threshold: its queued
                // prefill counts too.
                let queue = if in_bound(h) {
                    // A new branch pays the gap for the session it starts
                    // too (module docs, "Branch weight").
                    let weight = if branches {
                        cfg.branch_weight.max(1.0)
                    } else {
                        1.0
                    };
                    weight * spill_extra(&v, h, a)
                } else {
                    queued_extra(&v, (h, a), light(h) && !at_threshold(h))
                };
                // Past the threshold, a new branch of the prefix waits for
                // a sequence slot while the fleet has room (module docs).
                let slot = if cfg.slot_wait && branches && f64::from(v.load(a)) + 1.0 <= mean1 {
                    slot_extra(&v, cost, h, a)
                } else {
                    0.0
                };
                let extra = queue + slot;
                // Overload weight (module docs): the target has a backlog
                // of a whole routing budget.
                let w = if v.over_budget(a, cfg) {
                    cfg.overload_weight.max(1.0)
                } else {
                    1.0
                };
                let penalty = spill_penalty(cost.prefill_ms(cached), w, cfg.routing_budget_ms);
                // Continuation margin (module docs): a conversation's next
                // turn moves only for a wait beyond the counts' noise.
                let margin = if known.is_some_and(|k| k.entry.is_end()) {
                    cfg.continuation_margin * v.prices.0 * (mean1 - 1.0).max(0.0).sqrt()
                } else {
                    0.0
                };
                if extra <= penalty + margin {
                    (h, Reason::Warm)
                } else if let Some(k) = pending_keep(&v, cost, cfg, pending, holders, a, cached) {
                    (k, Reason::Warm)
                } else {
                    // Off a holder within the bound: to `a`, or the second
                    // tier (below) while the fleet has room.
                    to_tier = !backlogged(&v);
                    (a, Reason::Spill)
                }
            }
            (None, Some(a)) => {
                if let Some(h) = pending_keep(&v, cost, cfg, pending, holders, a, cached) {
                    // Every holder over the bound, one deep into this
                    // prefix's prefill (`pending_progress`).
                    (h, Reason::Warm)
                } else {
                    to_tier = true;
                    (a, Reason::Spill)
                }
            }
            (None, None) => (
                holders
                    .iter()
                    .copied()
                    .min_by_key(|&h| v.load(h))
                    .unwrap_or(0),
                Reason::Warm,
            ),
        };
        let (primary, reason) = if to_tier {
            // The second tier: the caller's lookup, asked here only.
            let found = known
                .filter(|_| ask)
                .and_then(|k| lookup.and_then(|f| f(k)));
            tier_wanted = ask && found.is_none();
            let shallow = found.as_ref().or(req.shallow).filter(|_| cfg.tier);
            new_holder(primary, shallow.and_then(tier_of), &mut moved_cached)
        } else {
            (primary, reason)
        };
        let secondary = holders
            .iter()
            .copied()
            .find(|&h| h != primary)
            .or_else(|| secondary_of(ring_key, primary));
        return Choice {
            primary,
            secondary,
            reason,
            expected_cached_tokens: if reason == Reason::Warm {
                cached
            } else {
                moved_cached
            },
            prompt_tokens,
            tier_wanted,
        };
    }
    let primary = place(ring, ring_key, &v, &[], cfg.cold_choices, false).unwrap_or(0);
    // `short_warm`: a fresh known prefix under `min_match`.
    let short = known
        .filter(|k| {
            cfg.short_weight > 0.0
                && (cfg.short_ties || mean1 - 1.0 >= cfg.short_min_load)
                && k.age_ms <= cfg.max_age_ms
                && k.depth > 0
        })
        .and_then(|k| {
            let seen = key.units_at(k.depth).min(key.units) as f64;
            let coverage = (seen / key.units.max(1) as f64).clamp(0.0, 1.0);
            let cached = (seen / cpt).min(prompt_tokens);
            let cap = warm_cap(&v, cfg, mean1, coverage);
            // Under the gate a tie only (`short_ties`).
            let w = if mean1 - 1.0 >= cfg.short_min_load {
                cfg.short_weight
            } else {
                0.0
            };
            short_holder(&v, (cfg, cost, w), k, primary, cached, cap)
        });
    if let Some((h, cached)) = short {
        return Choice {
            primary: h,
            secondary: secondary_of(ring_key, h),
            // Still cold by `min_match` (pending record, cold counts).
            reason: Reason::Cold,
            expected_cached_tokens: cached,
            prompt_tokens,
            tier_wanted: false,
        };
    }
    Choice {
        primary,
        secondary: secondary_of(ring_key, primary),
        reason: Reason::Cold,
        expected_cached_tokens: 0.0,
        prompt_tokens,
        tier_wanted: false,
    }
}

/// [`AffinityConfig::pending_progress`] (module docs, "Pending prefix"):
/// the holder to keep instead of spilling to `a`, for a request whose known
/// prefix (`cached` tokens) is **pending** (`pending`: ms since its pending
/// record). `None` unless the prefill has run for `done = min(e, P) ≥
/// routing_budget_ms` (`e` = `pending`, `P = prefill_ms(cached)`) and the least-delay available
/// holder under the concurrency threshold and the share bound satisfies
/// `delay(h) − done + routing_budget_ms ≤ delay(a) + P`. Needs the queue
/// picture (without it `delay` is 0 and says nothing). Cost: O(holders).
fn pending_keep(
    v: &View<'_>,
    cost: &CostModel,
    cfg: &AffinityConfig,
    pending: Option<u64>,
    holders: &[usize],
    a: usize,
    cached: f64,
) -> Option<usize> {
    let elapsed = pending.filter(|_| cfg.pending_progress && v.queued.is_some())?;
    let p = cost.prefill_ms(cached);
    let done = (elapsed as f64).min(p);
    if done < cfg.routing_budget_ms {
        return None;
    }
    let h = holders
        .iter()
        .copied()
        .filter(|&h| v.room_under(h, f64::INFINITY) && !v.over_share(h))
        .min_by_key(|&h| v.holder_rank(h))?;
    (v.delay(h) as f64 - done + cfg.routing_budget_ms <= v.delay(a) as f64 + p).then_some(h)
}

/// Tokens a holder of the known prefix `k` is expected to have cached: the
/// known part of the hashed window, and, when the whole window is known and
/// the prompt goes on past it, `beyond_window` of the rest (module docs,
/// "Past the window"). Cost: O(log blocks).
fn known_tokens(
    key: &RoutingKey,
    k: &Known,
    prompt_tokens: f64,
    cpt: f64,
    cfg: &AffinityConfig,
) -> f64 {
    let seen = key.units_at(k.depth);
    let cached = (seen as f64 / cpt).min(prompt_tokens);
    if k.depth >= key.blocks.len() && seen >= key.units {
        cached + cfg.beyond_window.clamp(0.0, 1.0) * (prompt_tokens - cached).max(0.0)
    } else {
        cached
    }
}

/// Has the known prefix `k` of `key` (a prompt of `prompt_chars`) **fanned
/// out**, i.e. is this request one of several branching off it rather than
/// the next turn of a conversation (module docs, "Request share")?
/// - a known prefix that ends on an end mark is a whole prompt recorded
///   before, which this one extends: no;
/// - its deepest known block carries a length stamp
///   ([`crate::index::Entry::stamp`]: an earlier request went on past it)
///   and this request is no longer than that one: yes, it did not extend
///   it (a conversation's next turn is longer than the turn before); no
///   stamp (nobody went on past the block before) or longer: no;
/// - the whole key known: an exact repeat (yes: identical prompts), unless
///   the prompt goes on past the hashed window (a long conversation's next
///   turn far more often than a divergence just past it: no).
///
/// Cost: O(1), no store access.
fn fan_out(key: &RoutingKey, k: &Known, prompt_chars: usize) -> bool {
    let n = key.blocks.len();
    if k.depth >= n {
        return prompt_chars <= key.units;
    }
    let stamp = usize::from(k.entry.stamp());
    !k.entry.is_end() && stamp > 0 && n.min(usize::from(u8::MAX)) <= stamp
}

/// The load bound of a warm holder whose prefix covers `coverage` of the
/// window (`mean1`: mean in-flight + 1): the relative bound `v.cap`, its
/// slack over the mean scaled by the coverage (full from half the window).
/// Cost: O(1).
fn warm_cap(v: &View<'_>, cfg: &AffinityConfig, mean1: f64, coverage: f64) -> f64 {
    v.cap
        .min(mean1 * (1.0 + (cfg.load_factor - 1.0).max(0.0) * (2.0 * coverage).min(1.0)) + 1.0)
}

/// [`AffinityConfig::short_weight`]: for a request whose fresh known prefix
/// `k` (`cached` tokens) is under `min_match`, the holder to keep instead
/// of the cold choice `c`, with `cached`. Candidates: available holders
/// within the coverage-scaled load bound `warm_cap` ([`warm_cap`]) and the share
/// bound, the least expected delay first; kept if its extra delay over `c`
/// (queued prefill included, and at least the spill rule's
/// [`spill_extra`]) is at most `weight` × the prefill of the known tokens
/// (capped by `routing_budget_ms`; the caller passes `short_weight` at or
/// above `short_min_load`, 0 under it with `short_ties`). `None` (place
/// cold) also when `c` is a holder. Cost: O(holders).
fn short_holder(
    v: &View<'_>,
    (cfg, cost, weight): (&AffinityConfig, &CostModel, f64),
    k: &Known,
    c: usize,
    cached: f64,
    warm_cap: f64,
) -> Option<(usize, f64)> {
    if k.entry.holders().any(|h| h == c) {
        return None;
    }
    let h = k
        .entry
        .holders()
        .filter(|&h| {
            v.available(h)
                && v.acceptable(h)
                && f64::from(v.load(h)) + 1.0 <= warm_cap
                && !v.over_share(h)
        })
        .min_by_key(|&h| v.holder_rank(h))?;
    let extra = queued_extra(v, (h, c), false);
    (extra <= (weight * cost.prefill_ms(cached)).min(cfg.routing_budget_ms)).then_some((h, cached))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::CostConfig;
    use crate::decision::KeySource;
    use crate::hash::BLOCK_UNITS;
    use crate::index::{Entry, MAX_HOLDERS};
    use crate::router::RoutingId;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn ring(n: usize) -> HashRing {
        let eps: Vec<String> = (0..n).map(|i| format!("10.0.0.{}:80", i + 1)).collect();
        HashRing::build(&eps, 64)
    }

    fn key(k: u64, blocks: usize) -> RoutingKey {
        RoutingKey {
            key: Some(k),
            blocks: (0..blocks as u64).map(|b| b ^ k).collect(),
            ends: (1..=blocks).map(|b| (b * BLOCK_UNITS) as u32).collect(),
            units: blocks * BLOCK_UNITS,
            source: KeySource::Chat,
            routing_id: RoutingId::Absent,
        }
    }

    fn known(depth: usize, holders: &[u16], age_ms: u64) -> Known {
        let mut h = [None; MAX_HOLDERS];
        for (i, &x) in holders.iter().enumerate() {
            h[i] = Some(x);
        }
        Known {
            depth,
            entry: Entry {
                tag: 1,
                time: 0,
                holders: h,
            },
            age_ms,
            spill: false,
        }
    }

    fn cost() -> CostModel {
        CostModel::new(CostConfig {
            prefill_ms_per_ktok: 30.0,
            wait_ms_per_request: 10.0,
            learn: false,
            forget: 1.0,
            prefill_floor: true,
        })
    }

    fn request<'a>(k: &'a RoutingKey, kn: Option<&'a Known>, loads: Loads<'a>) -> Request<'a> {
        Request {
            key: k,
            prompt_chars: k.units,
            known: kn,
            loads,
            ticket: 0,
            pressure: None,
            share: None,
            queued_prefill: None,
            shallow: None,
        }
    }

    /// The 64-block window of `key(9, 64)` (16 384 characters, 4 096
    /// tokens) known on replica 0 of 8, which has 6 requests in flight
    /// (the others 1) and `queued_on_0` tokens queued; the prompt is
    /// `prompt_chars` long.
    fn window_held_on_0(prompt_chars: usize, queued_on_0: u32, cfg: &AffinityConfig) -> Choice {
        let k = key(9, 64);
        let kn = known(64, &[0], 0);
        let loads = [6, 1, 1, 1, 1, 1, 1, 1];
        let queued = [queued_on_0, 0, 0, 0, 0, 0, 0, 0];
        let req = Request {
            prompt_chars,
            queued_prefill: Some(&queued),
            ..request(&k, Some(&kn), Loads::new(&loads))
        };
        choose(&ring(8), &req, &cost(), cfg)
    }

    #[test]
    fn holders_past_the_core_are_candidates_only_while_the_fleet_has_room() {
        // 4 096 tokens known on 5 replicas, 0..5 (newest first); 0, 1, 2
        // are busy (6 in flight, 100 000 tokens queued: 3 s at 30 ms per
        // 1 000, over the 2 s routing budget), 3 and 4 are not.
        let k = key(9, 64);
        let kn = known(64, &[0, 1, 2, 3, 4], 0);
        let loads = [6, 6, 6, 1, 1, 1, 1, 1];
        let cfg = AffinityConfig::default();
        let decide = |queued: &[u32]| {
            let req = Request {
                queued_prefill: Some(queued),
                ..request(&k, Some(&kn), Loads::new(&loads))
            };
            choose(&ring(8), &req, &cost(), &cfg)
        };
        // Replicas 5..8 have nothing queued: 3 and 4 are warm candidates.
        let room = [100_000, 100_000, 100_000, 0, 0, 0, 0, 0];
        let c = decide(&room);
        assert!(c.primary == 3 || c.primary == 4, "{c:?}");
        assert_eq!(c.reason, Reason::Warm);
        assert!(c.expected_cached_tokens > 4000.0, "{c:?}");
        // Every replica has a routing budget queued (70 000 tokens: 2.1 s):
        // only the first CORE_HOLDERS are holders; 3 and 4 are not
        // expected to cache anything.
        let backlog = [
            100_000, 100_000, 100_000, 70_000, 70_000, 70_000, 70_000, 70_000,
        ];
        let c = decide(&backlog);
        let core = c.primary < CORE_HOLDERS;
        assert!(core == (c.reason == Reason::Warm), "{c:?}");
        if !core {
            assert_eq!(c.expected_cached_tokens, 0.0, "{c:?}");
        }
        // Without a queue picture the fleet is never taken as backlogged.
        let req = request(&k, Some(&kn), Loads::new(&loads));
        let c = choose(&ring(8), &req, &cost(), &cfg);
        assert!(c.primary == 3 || c.primary == 4, "{c:?}");
    }

    #[test]
    fn a_spill_slower_than_the_wait_it_avoids_is_never_made() {
        // 100 000 tokens known on replica 0 (the window and the prompt past
        // it, 400 000 characters): their re-prefill elsewhere costs 3 s at
        // 30 ms per 1 000, more than the 2 s `routing_budget_ms`.
        let decide = |queued_on_0: u32, budget: f64| {
            let cfg = AffinityConfig {
                routing_budget_ms: budget,
                ..AffinityConfig::default()
            };
            window_held_on_0(400_000, queued_on_0, &cfg)
        };
        // The holder's queue costs more than the budget but less than the
        // re-prefill: kept (a spill capped at the budget moved it, 3 s
        // slower for the request than the wait).
        for queued in [150_000, 180_000] {
            let c = decide(queued, 2000.0);
            assert_eq!((c.primary, c.reason), (0, Reason::Warm), "{queued}");
        }
        // A queue that costs more than the re-prefill: spilled.
        let c = decide(300_000, 2000.0);
        assert_eq!(c.reason, Reason::Spill);
        assert_ne!(c.primary, 0);
        // Budget 0: pure load balancing among holders, spilled.
        let c = decide(150_000, 0.0);
        assert_eq!(c.reason, Reason::Spill);
        // A penalty under the budget is the re-prefill, as before: the
        // window alone (a prompt that ends with it: 123 ms) spills behind
        // 20 000 tokens.
        let c = window_held_on_0(64 * BLOCK_UNITS, 20_000, &AffinityConfig::default());
        assert_eq!(c.reason, Reason::Spill);
    }

    #[test]
    fn a_fully_known_window_counts_the_prompt_past_it() {
        // The whole window known on replica 0 (`window_held_on_0`), 20 000
        // tokens queued there; the prompt goes on to 400 000 characters
        // (100 000 tokens) past the window.
        let decide = |prompt_chars: usize, beyond_window: f64| {
            let cfg = AffinityConfig {
                beyond_window,
                ..AffinityConfig::default()
            };
            window_held_on_0(prompt_chars, 20_000, &cfg)
        };
        // Counting the window only, the holder's 600 ms of queue (20 000
        // tokens at 30 ms per 1000) exceed the 123 ms prefill of what it
        // holds: spilled, re-prefilling 100 000 tokens (3 s) elsewhere.
        let c = decide(400_000, 0.0);
        assert_eq!(c.reason, Reason::Spill);
        // Counting the prompt past the window: kept, 100 000 tokens cached.
        let c = decide(400_000, 1.0);
        assert_eq!((c.primary, c.reason), (0, Reason::Warm));
        assert_eq!(c.expected_cached_tokens.round(), 100_000.0);
        assert!(c.expected_uncached_tokens() < 1.0);
        // Half of it: 52 048 tokens.
        let c = decide(400_000, 0.5);
        assert_eq!(c.expected_cached_tokens.round(), 52_048.0);
        // A prompt that ends within the window is not extended.
        let short = key(9, 64);
        let part = known(40, &[0], 0);
        let (loads, queued) = ([6, 1, 1, 1, 1, 1, 1, 1], [20_000, 0, 0, 0, 0, 0, 0, 0]);
        let req = Request {
            prompt_chars: 400_000,
            queued_prefill: Some(&queued),
            ..request(&short, Some(&part), Loads::new(&loads))
        };
        let c = choose(&ring(8), &req, &cost(), &AffinityConfig::default());
        assert!(c.expected_cached_tokens <= (short.units_at(40) as f64 / 4.0) + 0.5);
    }

    #[test]
    fn a_holder_deep_into_this_prefix_s_prefill_is_kept() {
        let r = ring(8);
        // The whole window known on replica 0, the prompt 200 000 tokens
        // (6 s of prefill at 30 ms per 1000): the holder has 13 requests in
        // flight and that prefill queued, every other replica 1 and none.
        let k = key(9, 64);
        let loads = [13, 1, 1, 1, 1, 1, 1, 1];
        let back = crate::index::pending_offset_ms(AffinityConfig::default().max_age_ms);
        let decide = |age_ms: u64, queued0: u32, on: bool| {
            let kn = known(64, &[0], age_ms);
            let queued = [queued0, 0, 0, 0, 0, 0, 0, 0];
            let req = Request {
                prompt_chars: 800_000,
                ..request_queued(&k, Some(&kn), &loads, &queued)
            };
            let cfg = AffinityConfig {
                pending_progress: on,
                ..AffinityConfig::default()
            };
            let c = choose(&r, &req, &cost(), &cfg);
            (c.primary, c.reason)
        };
        // Pending, routed 3 s ago: at most 3 s of the 6 s are left, the
        // spill would re-prefill all 6 s: kept over the bound.
        assert_eq!(decide(back + 3_000, 200_000, true), (0, Reason::Warm));
        // Off, or a confirmed entry (not pending): moved, as before.
        assert_eq!(decide(back + 3_000, 200_000, false).1, Reason::Spill);
        assert_eq!(decide(1_000, 200_000, true).1, Reason::Spill);
        // Half of that prefill queued (3.1 s with the 13 requests): kept
        // after 2 s of progress, not after 1.5 s (less than the budget:
        // the prefill may have just started; a burst spreads instead).
        assert_eq!(decide(back + 2_000, 100_000, true), (0, Reason::Warm));
        assert_eq!(decide(back + 1_500, 100_000, true).1, Reason::Spill);
        // Another 6 s of work queued behind it on the holder: moved.
        assert_eq!(decide(back + 3_000, 400_000, true).1, Reason::Spill);
        // Without a queue picture the rule says nothing.
        let kn = known(64, &[0], back + 3_000);
        let req = Request {
            prompt_chars: 800_000,
            ..request(&k, Some(&kn), Loads::new(&loads))
        };
        assert_eq!(
            choose(&r, &req, &cost(), &AffinityConfig::default()).reason,
            Reason::Spill
        );
    }

    #[test]
    fn every_holder_over_the_bound_moves_to_a_holder_of_a_shallower_part() {
        // The queue band off: the deep holders below must be over every
        // bound (this test is about the second tier).
        let no_band = AffinityConfig {
            queue_band: 0.0,
            ..AffinityConfig::default()
        };
        let r = ring(8);
        let k = key(7, 40);
        let deep = known(40, &[0, 1, 2], 0);
        // Replica 5 holds the first 32 blocks (2 048 tokens: 61 ms of
        // prefill at 30 ms per 1000), the deep holders are over the bound.
        let shallow = known(32, &[5, 0], 0);
        let held = (k.units_at(32) as f64 / 4.0).round();
        let decide = |l5: u32, s: Option<&Known>, tier: bool| {
            let loads = [30, 30, 30, 2, 2, l5, 2, 2];
            let cfg = AffinityConfig { tier, ..no_band };
            let req = Request {
                shallow: s,
                ..request(&k, Some(&deep), Loads::new(&loads))
            };
            choose(&r, &req, &cost(), &cfg)
        };
        // Without the tier: a spill that expects nothing cached, and the
        // decision asks for the tier.
        let c = decide(6, None, true);
        assert_eq!((c.reason, c.expected_cached_tokens), (Reason::Spill, 0.0));
        assert!(c.tier_wanted);
        assert!(![0, 1, 2].contains(&c.primary));
        // With it: 5 is 4 requests (40 ms) above the least loaded, less than
        // the 61 ms it saves.
        let c = decide(6, Some(&shallow), true);
        assert_eq!((c.primary, c.reason), (5, Reason::Spill));
        assert_eq!(c.expected_cached_tokens.round(), held);
        assert!(!c.tier_wanted);
        // 10 requests (100 ms) above: not worth it.
        let c = decide(12, Some(&shallow), true);
        assert_ne!(c.primary, 5);
        assert_eq!(c.expected_cached_tokens, 0.0);
        // The tier off: neither asked nor used.
        let c = decide(6, Some(&shallow), false);
        assert!(c.primary != 5 && !c.tier_wanted);
        // Queued prefill counts in its extra wait, whole (the head credit
        // is for a holder kept by the light-load slack only): as loaded as
        // the least loaded, but 3 000 queued tokens (90 ms) over them: not
        // worth the 61 ms; 1 000 (30 ms): taken.
        for (q5, taken) in [(3000, false), (1000, true)] {
            let loads = [30, 30, 30, 2, 2, 2, 2, 2];
            let queued = [0, 0, 0, 0, 0, q5, 0, 0];
            let req = Request {
                shallow: Some(&shallow),
                queued_prefill: Some(&queued),
                ..request(&k, Some(&deep), Loads::new(&loads))
            };
            let c = choose(&r, &req, &cost(), &no_band);
            assert_eq!((c.primary == 5, c.reason), (taken, Reason::Spill), "{q5}");
        }
        // A holder within the bound: kept, the tier is not asked for.
        let loads = [3, 30, 30, 2, 2, 2, 2, 2];
        let req = request(&k, Some(&deep), Loads::new(&loads));
        let asked = std::cell::Cell::new(0);
        let c = choose_tiered(
            &r,
            &req,
            &cost(),
            &no_band,
            |_| {
                asked.set(asked.get() + 1);
                Some(shallow)
            },
            || None,
        );
        assert_eq!((c.primary, c.reason, asked.get()), (0, Reason::Warm, 0));
        // Over the bound: asked once, and its answer decides.
        let loads = [30, 30, 30, 2, 2, 6, 2, 2];
        let req = request(&k, Some(&deep), Loads::new(&loads));
        let c = tiered_40(&r, &req, &no_band, shallow, &asked);
        assert_eq!((c.primary, asked.get()), (5, 1));
        // The same decision as `choose` given the lookup's answer; with
        // none, the same as without the tier (and still wanted).
        let given = Request {
            shallow: Some(&shallow),
            ..req
        };
        assert_eq!(c, choose(&r, &given, &cost(), &no_band));
        let c = choose_tiered(&r, &req, &cost(), &no_band, |_| None, || None);
        assert!(c.tier_wanted);
        assert_eq!(c, choose(&r, &req, &cost(), &no_band));
    }

    #[test]
    fn a_spill_off_a_holder_within_the_bound_goes_to_a_holder_of_a_shallower_part() {
        let r = ring(8);
        let k = key(7, 40);
        // Replica 0 holds all 40 blocks (2 560 tokens: 77 ms of prefill at
        // 30 ms per 1000) and is within the load bound (23 ≤ 2 × (13.25 +
        // 1)) but 10 requests (100 ms) above the others: the spill rule
        // moves the request. Replica 5 holds the first 32 blocks (2 048
        // tokens, 61 ms) and is one request (10 ms) above the least loaded.
        let deep = known(40, &[0], 0);
        let shallow = known(32, &[5, 0], 0);
        let held = (k.units_at(32) as f64 / 4.0).round();
        let loads = [22, 12, 12, 12, 12, 13, 12, 12];
        let decide = |s: Option<&Known>, tier: bool| {
            let cfg = AffinityConfig {
                tier,
                ..AffinityConfig::default()
            };
            let req = Request {
                shallow: s,
                ..request(&k, Some(&deep), Loads::new(&loads))
            };
            choose(&r, &req, &cost(), &cfg)
        };
        // Without the tier's answer: a spill to a replica that holds
        // nothing, and the decision asks for the tier.
        let c = decide(None, true);
        assert_eq!((c.reason, c.expected_cached_tokens), (Reason::Spill, 0.0));
        assert!(c.tier_wanted && c.primary != 0 && c.primary != 5);
        // With it: replica 5, expecting its 2 048 tokens.
        let c = decide(Some(&shallow), true);
        assert_eq!((c.primary, c.reason), (5, Reason::Spill));
        assert_eq!(c.expected_cached_tokens.round(), held);
        // The tier off: neither asked nor used.
        let c = decide(Some(&shallow), false);
        assert!(c.primary != 5 && !c.tier_wanted);
        // A backlogged fleet (every replica with more than the 2 s routing
        // budget of prefill queued): replica 0, 35 requests (350 ms) above
        // the others and within the bound (61 ≤ 2 × (29.5 + 1)), is left
        // (the overload weight prices the cache at 4 × 77 ms), for `a`.
        let busy = [60, 25, 25, 25, 25, 26, 25, 25];
        let queued = [
            80_000, 70_000, 70_000, 70_000, 70_000, 70_000, 70_000, 70_000,
        ];
        let req = Request {
            shallow: Some(&shallow),
            queued_prefill: Some(&queued),
            ..request(&k, Some(&deep), Loads::new(&busy))
        };
        let c = choose(&r, &req, &cost(), &AffinityConfig::default());
        assert_eq!((c.reason, c.expected_cached_tokens), (Reason::Spill, 0.0));
        assert!(c.primary != 5 && !c.tier_wanted);
        // Room on replica 5: the tier again.
        let mut room = queued;
        room[5] = 0;
        let req = Request {
            queued_prefill: Some(&room),
            ..req
        };
        let c = choose(&r, &req, &cost(), &AffinityConfig::default());
        assert_eq!((c.primary, c.reason), (5, Reason::Spill));
        assert_eq!(c.expected_cached_tokens.round(), held);
        // The caller's lookup is asked once, for the deep prefix.
        let asked = std::cell::Cell::new(0);
        let req = request(&k, Some(&deep), Loads::new(&loads));
        let c = tiered_40(&r, &req, &AffinityConfig::default(), shallow, &asked);
        assert_eq!((c.primary, asked.get()), (5, 1));
    }

    /// [`choose_tiered`] whose lookup answers `shallow`, checks that it is
    /// asked for the 40-block deep prefix and counts the asks in `asked`.
    fn tiered_40(
        r: &HashRing,
        req: &Request<'_>,
        cfg: &AffinityConfig,
        shallow: Known,
        asked: &std::cell::Cell<u32>,
    ) -> Choice {
        choose_tiered(
            r,
            req,
            &cost(),
            cfg,
            |d| {
                asked.set(asked.get() + 1);
                assert_eq!(d.depth, 40);
                Some(shallow)
            },
            || None,
        )
    }

    /// An exact repeat of a 128-block prompt held by replica 3 (of 7), with
    /// `holder` requests in flight there and `others` on every other one.
    fn repeat_on_3(others: u32, holder: u32) -> (RoutingKey, Known, [u32; 7]) {
        let mut loads = [others; 7];
        loads[3] = holder;
        (key(7, 128), known(128, &[3], 0), loads)
    }

    /// [`request`] with a queue picture.
    fn request_queued<'a>(
        k: &'a RoutingKey,
        kn: Option<&'a Known>,
        loads: &'a [u32],
        queued: &'a [u32],
    ) -> Request<'a> {
        Request {
            queued_prefill: Some(queued),
            shallow: None,
            ..request(k, kn, Loads::new(loads))
        }
    }
    /// Where a request for `kn` goes on 7 replicas: to holder 3 or not,
    /// and why.
    fn kept_on_3(
        k: &RoutingKey,
        kn: &Known,
        (loads, queued): (&[u32], &[u32]),
        cfg: &AffinityConfig,
    ) -> (bool, Reason) {
        let c = choose(
            &ring(7),
            &request_queued(k, Some(kn), loads, queued),
            &cost(),
            cfg,
        );
        (c.primary == 3, c.reason)
    }

    fn pick(k: &RoutingKey, kn: Option<&Known>, loads: &[u32]) -> Choice {
        pick_with(k, kn, loads, None)
    }

    fn pick_with(k: &RoutingKey, kn: Option<&Known>, loads: &[u32], s: Option<&Share>) -> Choice {
        let req = Request {
            share: s,
            ..request(k, kn, Loads::new(loads))
        };
        let cfg = AffinityConfig {
            share_factor: if s.is_some() { 1.0 } else { 0.0 },
            ..AffinityConfig::default()
        };
        choose(&ring(loads.len()), &req, &cost(), &cfg)
    }

    /// A decision of the `short_warm` tests: known prefix `kn`, in-flight
    /// `loads`, queued prefill tokens `queued`.
    fn short_decide(
        r: &HashRing,
        k: &RoutingKey,
        cfg: &AffinityConfig,
        kn: &Known,
        loads: &[u32],
        queued: &[u32],
    ) -> Choice {
        choose(r, &request_queued(k, Some(kn), loads, queued), &cost(), cfg)
    }

    #[test]
    fn short_warm_keeps_a_holder_of_a_prefix_under_min_match_while_it_is_cheap() {
        // 10 of 128 blocks known (640 tokens, 19 ms of prefill at 30 ms per
        // 1000): under `min_match`, so cold without the knob.
        let r = ring(7);
        let k = key(7, 128);
        // The local rule (weight 1), at any load.
        let on = AffinityConfig {
            share_factor: 0.0,
            short_weight: 1.0,
            short_min_load: 0.0,
            ..AffinityConfig::default()
        };
        let off = AffinityConfig {
            short_weight: 0.0,
            ..on
        };
        let idle = [0u32; 7];
        let none = [0u32; 7];
        let decide = |cfg: &AffinityConfig, kn: &Known, loads: &[u32], queued: &[u32]| {
            short_decide(&r, &k, cfg, kn, loads, queued)
        };
        let cold = decide(&off, &known(10, &[], 0), &idle, &none).primary;
        let h = (cold + 1) % 7;
        let kn = known(10, &[h as u16], 0);
        let c = decide(&off, &kn, &idle, &none);
        assert_eq!((c.primary, c.reason), (cold, Reason::Cold));
        assert_eq!(c.expected_cached_tokens, 0.0);
        // On: the idle holder is kept; still cold by `min_match`.
        let c = decide(&on, &kn, &idle, &none);
        assert_eq!((c.primary, c.reason), (h, Reason::Cold));
        assert!((c.expected_cached_tokens - 640.0).abs() < 1e-9);
        // Its queued prefill (2 000 tokens: 60 ms) costs more than the
        // known prefix saves: the cold choice.
        let mut queued = [0u32; 7];
        queued[h] = 2000;
        let c = decide(&on, &kn, &idle, &queued);
        assert_eq!((c.primary, c.reason), (cold, Reason::Cold));
        // Over the coverage-scaled bound (5 in flight, mean 0.7): cold.
        let mut loads = [0u32; 7];
        loads[h] = 5;
        let c = decide(&on, &kn, &loads, &none);
        assert_eq!((c.primary, c.reason), (cold, Reason::Cold));
        // At 1 in flight it is within the bound and the wait (10 ms) is
        // under the prefill saved.
        loads[h] = 1;
        assert_eq!(decide(&on, &kn, &loads, &none).primary, h);
    }

    #[test]
    fn short_warm_weighs_the_miss_for_the_queue_behind_it_from_two_in_flight() {
        // 10 of 128 blocks known: 640 tokens, 19.2 ms of prefill.
        let r = ring(7);
        let k = key(7, 128);
        let d = AffinityConfig {
            share_factor: 0.0,
            ..AffinityConfig::default()
        };
        assert!(d.short_weight > 0.0);
        let decide = |cfg: &AffinityConfig, kn: &Known, loads: &[u32], queued: &[u32]| {
            short_decide(&r, &k, cfg, kn, loads, queued)
        };
        let off = AffinityConfig {
            short_weight: 0.0,
            ..d
        };
        let busy = [2u32; 7];
        let none = [0u32; 7];
        let cold = decide(&off, &known(10, &[], 0), &busy, &none).primary;
        let h = (cold + 1) % 7;
        let kn = known(10, &[h as u16], 0);
        // 2 000 tokens queued on the holder: 60 ms more than the cold
        // choice (counted whole: no head credit for a short-prefix holder),
        // over 1 × 19.2 ms but under 4 × 19.2 ms.
        let mut queued = [0u32; 7];
        queued[h] = 2000;
        let c = decide(&d, &kn, &busy, &queued);
        assert_eq!((c.primary, c.reason), (h, Reason::Cold));
        assert!((c.expected_cached_tokens - 640.0).abs() < 1e-9);
        let w1 = AffinityConfig {
            short_weight: 1.0,
            ..d
        };
        assert_eq!(decide(&w1, &kn, &busy, &queued).primary, cold);
        assert_eq!(decide(&off, &kn, &busy, &queued).primary, cold);
        // Over 4 × 19.2 ms (3 000 tokens: 90 ms): cold.
        queued[h] = 3000;
        assert_eq!(decide(&d, &kn, &busy, &queued).primary, cold);
        // Light load (1 in flight per replica): nobody queues behind a
        // miss; a holder as idle as the cold choice is a tie and takes it
        // (`short_ties`), one request more is not (10 ms over 0), and
        // without `short_ties` the cold rule alone decides.
        let light = [1u32; 7];
        let cold = decide(&off, &known(10, &[], 0), &light, &none).primary;
        let h = (cold + 1) % 7;
        let kn = known(10, &[h as u16], 0);
        assert_eq!(decide(&d, &kn, &light, &none).primary, h);
        let mut busier = light;
        busier[h] = 2;
        assert_eq!(decide(&d, &kn, &busier, &none).primary, cold);
        let no_ties = AffinityConfig {
            short_ties: false,
            ..d
        };
        assert_eq!(decide(&no_ties, &kn, &light, &none).primary, cold);
        let ungated = AffinityConfig {
            short_min_load: 0.0,
            ..no_ties
        };
        assert_eq!(decide(&ungated, &kn, &busier, &none).primary, h);
    }

    #[test]
    fn cold_placement_is_consistent_and_load_aware() {
        let r = ring(5);
        let k = key(0xfeed, 8);
        let order: Vec<usize> = r.candidates(0xfeed).collect();
        let c = pick(&k, None, &[0; 5]);
        assert_eq!((c.primary, c.reason), (order[0], Reason::Cold));
        assert_ne!(c.secondary, Some(c.primary));
        // Power of two choices on the ring: the second candidate if less loaded.
        let mut loads = [3u32; 5];
        loads[order[1]] = 1;
        assert_eq!(pick(&k, None, &loads).primary, order[1]);
    }

    #[test]
    fn equal_loads_place_new_prefixes_by_cache_pressure() {
        // Sequential clients: every load 0. The ring alone sends 8 new
        // prefixes wherever their keys fall; with the pressure counters
        // (bumped per placement, as the router does) they spread 3/3/2.
        let r = ring(3);
        let mut store = crate::index::VecStore::new(64);
        let mut per = [0u32; 3];
        for g in 0..8u64 {
            let k = key(0x1000 + g, 8);
            let p = Pressure::read(&store, 3);
            let req = Request {
                pressure: Some(&p),
                ..request(&k, None, Loads::new(&[0; 3]))
            };
            let c = choose(&r, &req, &cost(), &AffinityConfig::default());
            assert_eq!(c.reason, Reason::Cold);
            per[c.primary] += 1;
            Pressure::bump(&mut store, c.primary, 3);
        }
        per.sort_unstable();
        assert_eq!(per, [2, 3, 3]);
        // Load still comes first: a busier replica with less pressure loses.
        let p = Pressure::from_counts(&[9, 0, 9]);
        let k = key(0x77, 8);
        let req = Request {
            pressure: Some(&p),
            ..request(&k, None, Loads::new(&[0, 1, 0]))
        };
        let c = choose(&r, &req, &cost(), &AffinityConfig::default());
        assert_ne!(c.primary, 1);
    }

    #[test]
    fn a_saturated_fleet_lifts_the_concurrency_threshold() {
        // Every replica at or over the threshold (256): a holder over it
        // stays warm instead of spilling to a replica just as far over.
        let (k, kn, mut loads) = repeat_on_3(260, 262);
        let c = pick(&k, Some(&kn), &loads);
        assert_eq!((c.primary, c.reason), (3, Reason::Warm));
        // With the threshold forced on (as before), the same request spills.
        let cfg = AffinityConfig::default();
        let v_threshold =
            saturated_threshold(cfg.concurrency_threshold, 7, |i| loads.get(i).copied());
        assert_eq!(v_threshold, u32::MAX);
        // One replica under the threshold: it holds, the holder spills there.
        loads[5] = 100;
        let c = pick(&k, Some(&kn), &loads);
        assert_eq!((c.primary, c.reason), (5, Reason::Spill));
        assert_eq!(saturated_threshold(256, 7, |i| loads.get(i).copied()), 256);
        // Unavailable replicas do not count as under it.
        assert_eq!(
            saturated_threshold(256, 7, |i| (i != 5).then(|| loads[i])),
            u32::MAX
        );
    }

    #[test]
    fn warm_holder_is_kept_until_the_wait_exceeds_the_penalty() {
        let k = key(7, 128); // 8192 tokens, all known: penalty 245 ms
        let kn = known(128, &[3], 0);
        let mut loads = [10u32; 7];
        loads[3] = 12;
        let c = pick(&k, Some(&kn), &loads);
        assert_eq!((c.primary, c.reason), (3, Reason::Warm));
        assert_eq!(c.expected_cached_tokens, 8192.0);
        // Small known prefix (below min_match): cold.
        let c = pick(&k, Some(&known(10, &[3], 0)), &loads);
        assert_eq!(c.reason, Reason::Cold);
        // Stale: cold.
        let c = pick(&k, Some(&known(128, &[3], 3_600_000)), &loads);
        assert_eq!(c.reason, Reason::Cold);
        // A short prompt: 40 × 10 ms extra wait > 64 tokens of prefill.
        let short = key(7, 1);
        let mut loads = [0u32; 7];
        loads[3] = 40;
        let c = pick(&short, Some(&known(1, &[3], 0)), &loads);
        assert_eq!(c.reason, Reason::Spill);
        assert_ne!(c.primary, 3);
    }

    #[test]
    fn a_continuation_is_warm_whatever_its_coverage() {
        let k = key(7, 128);
        let loads = [1u32; 7];
        // 10 of 128 blocks known (under `min_match`), ending on an end mark
        // (bit 47 of the stored tag): the next turn of a conversation.
        let mut kn = known(10, &[3], 0);
        kn.entry.tag |= 1 << 47;
        assert!(kn.entry.is_end());
        let c = pick(&k, Some(&kn), &loads);
        assert_eq!((c.primary, c.reason), (3, Reason::Warm));
        assert_eq!(c.expected_cached_tokens, 640.0);
        // Without the mark, or with the rule off, or stale: cold.
        let c = pick(&k, Some(&known(10, &[3], 0)), &loads);
        assert_eq!(c.reason, Reason::Cold);
        let off = AffinityConfig {
            continuation: false,
            ..AffinityConfig::default()
        };
        let req = request(&k, Some(&kn), Loads::new(&loads));
        assert_eq!(choose(&ring(7), &req, &cost(), &off).reason, Reason::Cold);
        kn.age_ms = 3_600_000;
        assert_eq!(pick(&k, Some(&kn), &loads).reason, Reason::Cold);
    }

    #[test]
    fn a_continuation_moves_only_for_a_wait_beyond_the_counts_noise() {
        // 8 blocks (512 tokens) known on replica 3: their re-prefill costs
        // 15.4 ms at 30 ms per 1 000. Replica 3 runs 19 requests, replica 0
        // 15, the rest 16 (mean 16.3, √mean ≈ 4 counts): keeping 3 costs
        // 4 × 10 ms = 40 ms of wait, over the re-prefill, within it plus
        // one standard deviation of a count at the wait price (40.4 ms).
        // The prompt is 10 blocks: a next turn goes on past the turn before
        // (a whole known key would be an exact repeat, a branch).
        let k = key(7, 10);
        let mut loads = [16u32; 7];
        loads[3] = 19;
        loads[0] = 15;
        let mut cont = known(8, &[3], 0);
        cont.entry.tag |= 1 << 47;
        let fan = known(8, &[3], 0);
        let with = |margin: f64, kn: &Known, loads: &[u32]| {
            let cfg = AffinityConfig {
                continuation_margin: margin,
                ..AffinityConfig::default()
            };
            let c = choose(
                &ring(7),
                &request(&k, Some(kn), Loads::new(loads)),
                &cost(),
                &cfg,
            );
            (c.primary, c.reason)
        };
        let default = AffinityConfig::default().continuation_margin;
        assert_eq!(default, 2.0);
        // A conversation's next turn stays (a margin of 1 and the default).
        assert_eq!(with(1.0, &cont, &loads), (3, Reason::Warm));
        assert_eq!(with(default, &cont, &loads), (3, Reason::Warm));
        // Any other prompt under the same prefix moves, and so does the
        // next turn without the margin.
        assert_eq!(with(1.0, &fan, &loads), (0, Reason::Spill));
        assert_eq!(with(default, &fan, &loads), (0, Reason::Spill));
        assert_eq!(with(0.0, &cont, &loads), (0, Reason::Spill));
        // 6 counts more (60 ms): beyond one standard deviation (56 ms with
        // the re-prefill), within two (96 ms): a margin of 1 moves it, the
        // default keeps it.
        loads[3] = 21;
        assert_eq!(with(1.0, &cont, &loads), (0, Reason::Spill));
        assert_eq!(with(default, &cont, &loads), (3, Reason::Warm));
        // A wait beyond two standard deviations moves it (11 counts more).
        loads[3] = 26;
        assert_eq!(with(default, &cont, &loads), (0, Reason::Spill));
    }

    #[test]
    fn a_new_branch_prices_its_in_flight_gap_twice() {
        // 8 of 10 blocks (512 tokens) known on replica 3: their re-prefill
        // costs 15.4 ms at 30 ms per 1 000. Replica 3 runs 17 requests, the
        // others 16: keeping 3 costs one in-flight request's wait, 10 ms.
        let k = key(7, 10);
        let mut loads = [16u32; 7];
        loads[3] = 17;
        let at = |stamp: u64, end: bool| {
            let mut kn = known(8, &[3], 0);
            kn.entry.tag = (1 << 8) | stamp | if end { 1 << 47 } else { 0 };
            kn
        };
        // An earlier request of 10 blocks went on past the known prefix:
        // this one branches off it (a new session under a shared prompt).
        let branch = at(10, false);
        // Nobody went past it (a deeper prompt extending it), or it ends on
        // an end mark (a conversation's next turn).
        let (deeper, next) = (at(0, false), at(10, true));
        let with = |weight: f64, kn: &Known, loads: &[u32]| {
            let cfg = AffinityConfig {
                branch_weight: weight,
                ..AffinityConfig::default()
            };
            let req = request(&k, Some(kn), Loads::new(loads));
            let c = choose(&ring(7), &req, &cost(), &cfg);
            (c.primary, c.reason)
        };
        let default = AffinityConfig::default().branch_weight;
        assert_eq!(default, 2.0);
        // The branch moves at the default (20 ms of wait over 15.4 ms of
        // re-prefill), stays with the weight off (1: 10 ms).
        let (to, why) = with(default, &branch, &loads);
        assert_eq!(why, Reason::Spill);
        assert_ne!(to, 3);
        assert_eq!(with(1.0, &branch, &loads), (3, Reason::Warm));
        // The others are priced once: they stay.
        assert_eq!(with(default, &deeper, &loads), (3, Reason::Warm));
        assert_eq!(with(default, &next, &loads), (3, Reason::Warm));
        // Equal loads: nothing to gain, the branch stays too.
        loads[3] = 16;
        assert_eq!(with(default, &branch, &loads), (3, Reason::Warm));
    }

    #[test]
    fn hot_prefix_spreads_over_its_holders_then_grows() {
        let k = key(99, 64);
        // Two holders: the less loaded one.
        let mut loads = [5u32; 7];
        loads[2] = 9;
        loads[4] = 6;
        let c = pick(&k, Some(&known(64, &[2, 4], 0)), &loads);
        assert_eq!(
            (c.primary, c.reason, c.secondary),
            (4, Reason::Warm, Some(2))
        );
        // Every holder over the bound: a new replica (a third holder).
        let mut loads = [2u32; 7];
        loads[2] = 30;
        loads[4] = 30;
        let c = pick(&k, Some(&known(64, &[2, 4], 0)), &loads);
        assert_eq!(c.reason, Reason::Spill);
        assert!(c.primary != 2 && c.primary != 4);
    }

    #[test]
    fn pending_records_follow_the_reason_and_the_known_depth() {
        let warm = AffinityConfig::default();
        assert_eq!(
            warm.pending_record(Reason::Cold, 0, 4),
            Some(PendingBlocks::All)
        );
        assert_eq!(
            warm.pending_record(Reason::Spill, 4, 4),
            Some(PendingBlocks::All)
        );
        assert_eq!(
            warm.pending_record(Reason::Warm, 2, 4),
            Some(PendingBlocks::PastKnown)
        );
        assert!(warm.pending_record(Reason::NoKey, 0, 4).is_none());
        let cold_only = AffinityConfig {
            pending_warm: false,
            ..warm
        };
        assert!(cold_only.pending_record(Reason::Warm, 2, 4).is_none());
        assert!(cold_only.pending_record(Reason::Cold, 0, 4).is_some());
        // Nothing beyond the known prefix: nothing to write.
        assert!(warm.pending_record(Reason::Warm, 4, 4).is_none());
        let off = AffinityConfig {
            record_pending: false,
            ..warm
        };
        assert!(off.pending_record(Reason::Cold, 0, 4).is_none());
        assert!(off.pending_record(Reason::Warm, 2, 4).is_none());
    }

    /// Replica 3 holds 8192 tokens of the request (penalty 245 ms): with
    /// `loads` it keeps the request under the default configuration, loses
    /// it to another replica under `off`, and loses it too with 30 000
    /// tokens (900 ms) queued on it. Returns the key, what is known and
    /// that queue for further checks.
    fn kept_unless(loads: &[u32], off: &AffinityConfig) -> (RoutingKey, Known, [u32; 7]) {
        let k = key(7, 128);
        let kn = known(128, &[3], 0);
        let c = pick(&k, Some(&kn), loads);
        assert_eq!((c.primary, c.reason), (3, Reason::Warm));
        let req = request(&k, Some(&kn), Loads::new(loads));
        let c = choose(&ring(7), &req, &cost(), off);
        assert_eq!(c.reason, Reason::Spill);
        assert_ne!(c.primary, 3);
        let mut queued = [0u32; 7];
        queued[3] = 30_000;
        let req = request_queued(&k, Some(&kn), loads, &queued);
        let c = choose(&ring(7), &req, &cost(), &AffinityConfig::default());
        assert_eq!(c.reason, Reason::Spill);
        assert_ne!(c.primary, 3);
        (k, kn, queued)
    }

    #[test]
    fn an_overloaded_target_weighs_the_cache_break() {
        // A quarter of the window known on holder 3 (2 048 tokens: 61 ms
        // of prefill), 10 more requests in flight there than elsewhere
        // (100 ms of wait, within the load bound): a spill. When every
        // replica has 70 000 tokens queued (2.1 s, over the 2 s routing
        // budget), the penalty is 4 × 61 ms and the holder keeps it; with
        // the weight at 1, or without the backlog, it spills.
        let k = key(7, 128);
        let kn = known(32, &[3], 0);
        let mut loads = [20u32; 7];
        loads[3] = 30;
        let d = AffinityConfig::default();
        let decide =
            |cfg: &AffinityConfig, queued: &[u32]| kept_on_3(&k, &kn, (&loads, queued), cfg);
        let idle = [0u32; 7];
        let backlog = [70_000u32; 7];
        assert_eq!(decide(&d, &idle), (false, Reason::Spill));
        assert_eq!(decide(&d, &backlog), (true, Reason::Warm));
        let off = AffinityConfig {
            overload_weight: 1.0,
            ..d
        };
        assert_eq!(decide(&off, &backlog), (false, Reason::Spill));
    }

    #[test]
    fn a_holder_in_the_queue_band_is_priced_with_its_queue() {
        // Others at 4 in flight, the holder at 14: mean 38 / 7 ≈ 5.4, over
        // the relative bound (12.9) and the light-load slack (13.4), within
        // the band (25.7). Its extra wait (10 in flight more: 100 ms) is
        // under the penalty: kept; its queued prefill counts whole.
        let mut loads = [4u32; 7];
        loads[3] = 14;
        let d = AffinityConfig::default();
        let k = key(7, 128);
        let kn = known(128, &[3], 0);
        let none = [0u32; 7];
        let decide = |kn: &Known, cfg: &AffinityConfig, queued: &[u32]| {
            kept_on_3(&k, kn, (&loads, queued), cfg)
        };
        assert_eq!(decide(&kn, &d, &none), (true, Reason::Warm));
        let warm = choose(
            &ring(7),
            &request_queued(&k, Some(&kn), &loads, &none),
            &cost(),
            &d,
        );
        let p = cost()
            .prefill_ms(warm.expected_cached_tokens)
            .min(d.routing_budget_ms);
        assert!(p > 110.0, "{p}");
        // Queued prefill worth the rest of the penalty and 10 ms more.
        let mut queued = [0u32; 7];
        queued[3] = ((p - 100.0 + 10.0) / 30.0 * 1000.0) as u32;
        assert_eq!(decide(&kn, &d, &queued), (false, Reason::Spill));
        // Without the band, or with this prefix pending on the holder (a
        // burst spreads), or over the band: a spill.
        let off = AffinityConfig {
            queue_band: 0.0,
            ..d
        };
        assert_eq!(decide(&kn, &off, &none), (false, Reason::Spill));
        let pending = known(
            128,
            &[3],
            crate::index::pending_offset_ms(d.max_age_ms) + 10,
        );
        assert_eq!(decide(&pending, &d, &none), (false, Reason::Spill));
        let narrow = AffinityConfig {
            queue_band: 1.05,
            ..d
        };
        assert_eq!(decide(&kn, &narrow, &none), (false, Reason::Spill));
        // Under `queue_band_min_load` in flight per replica: off (and the
        // hot share, which acts there, off too).
        let late = AffinityConfig {
            queue_band_min_load: 6.0,
            light_share: 0.0,
            ..d
        };
        assert_eq!(decide(&kn, &late, &none), (false, Reason::Spill));
    }

    #[test]
    fn a_hot_prefix_keeps_its_holder_up_to_a_share_of_the_fleet() {
        // 32 replicas, 31 at 1 in flight and the holder at 14: mean 45 / 32
        // ≈ 1.4, over the relative bound (4.8) and the light-load slack
        // (9.4), within `light_share` of the fleet's 45 requests (27):
        // kept (nothing queued, its extra wait 130 ms is under the
        // penalty), also while this prefix is pending there (a
        // conversation's turn arriving while the turn before prefills).
        // Not with the share off, nor for a prefix covering a fifth of the
        // window (the share scaled like the slack: 10.8), nor from
        // `queue_band_min_load` in flight per replica.
        let n = 32;
        let mut loads = vec![1u32; n];
        loads[3] = 14;
        let none = vec![0u32; n];
        let d = AffinityConfig::default();
        let k = key(7, 128);
        let go = |kn: &Known, cfg: &AffinityConfig, loads: &[u32], queued: &[u32]| {
            let c = choose(
                &ring(n),
                &request_queued(&k, Some(kn), loads, queued),
                &cost(),
                cfg,
            );
            (c.primary == 3, c.reason)
        };
        let kn = known(128, &[3], 0);
        assert_eq!(go(&kn, &d, &loads, &none), (true, Reason::Warm));
        let off = AffinityConfig {
            light_share: 0.0,
            ..d
        };
        assert_eq!(go(&kn, &off, &loads, &none), (false, Reason::Spill));
        let pending = known(
            128,
            &[3],
            crate::index::pending_offset_ms(d.max_age_ms) + 10,
        );
        assert_eq!(go(&pending, &d, &loads, &none), (true, Reason::Warm));
        let fifth = known(26, &[3], 0);
        assert!(!go(&fifth, &d, &loads, &none).0);
        let early = AffinityConfig {
            queue_band_min_load: 1.0,
            ..d
        };
        assert_eq!(go(&kn, &early, &loads, &none), (false, Reason::Spill));
        // Still priced: a queue worth more than the penalty sends it away.
        let mut queued = none.clone();
        queued[3] = 30_000;
        assert_eq!(go(&kn, &d, &loads, &queued), (false, Reason::Spill));
        // A large fleet: 200 replicas at 1, the holder at 80 (mean 1.4).
        // The share (0.6 × 279 = 167) would keep it; capped at the mean +
        // 64 it spills, even with in-flight waits priced at 0; at 60 it is
        // kept.
        let free = CostModel::new(CostConfig {
            wait_ms_per_request: 0.0,
            ..cost().config()
        });
        let big = |holder: u32| {
            let mut loads = vec![1u32; 200];
            loads[3] = holder;
            let none = vec![0u32; 200];
            let req = request_queued(&k, Some(&kn), &loads, &none);
            let c = choose(&ring(200), &req, &free, &d);
            (c.primary == 3, c.reason)
        };
        assert_eq!(big(60), (true, Reason::Warm));
        assert_eq!(big(80), (false, Reason::Spill));
    }

    #[test]
    fn a_holder_busy_with_another_prompt_s_prefill_is_priced_at_the_head_credit() {
        // Mean 11 / 7: the holder (5 in flight) is over the relative bound
        // and kept by the light-load slack, so its queue prices the keep:
        // 10 ms per request more (40 ms) plus the queued prefill, against
        // the penalty `p`. `q` tokens cost 30 q / 1000 ms whole and half
        // that at the head credit: kept at the default, spilled counted
        // whole, and spilled when the queue is this prefix's own pending
        // prefill (its progress is the pending record's age).
        let mut loads = [1u32; 7];
        loads[3] = 5;
        let d = AffinityConfig::default();
        let k = key(7, 128);
        let kn = known(128, &[3], 0);
        let warm = choose(
            &ring(7),
            &request(&k, Some(&kn), Loads::new(&loads)),
            &cost(),
            &d,
        );
        assert_eq!((warm.primary, warm.reason), (3, Reason::Warm));
        let p = cost()
            .prefill_ms(warm.expected_cached_tokens)
            .min(d.routing_budget_ms);
        assert!(p > 60.0, "{p}");
        let q = ((p - 40.0) / 22.5 * 1000.0) as u32;
        let mut queued = [0u32; 7];
        queued[3] = q;
        let decide = |kn: &Known, cfg: &AffinityConfig| kept_on_3(&k, kn, (&loads, &queued), cfg);
        assert_eq!(decide(&kn, &d), (true, Reason::Warm));
        let whole = AffinityConfig {
            queue_credit: 1.0,
            ..d
        };
        assert_eq!(decide(&kn, &whole), (false, Reason::Spill));
        // Pending for 10 ms (under `routing_budget_ms`: `pending_progress`
        // does not keep it either).
        let pending = known(
            128,
            &[3],
            crate::index::pending_offset_ms(d.max_age_ms) + 10,
        );
        assert!(crate::index::pending_elapsed_ms(pending.age_ms, d.max_age_ms).is_some());
        assert_eq!(decide(&pending, &d), (false, Reason::Spill));
        // A holder at the concurrency threshold (256, the others at 250:
        // 60 ms of in-flight gap) is not credited: its queue is many
        // requests long. Spilled at all of its queue, kept at half of it.
        let mut loads = [250u32; 7];
        loads[3] = 256;
        let q = ((p - 60.0) / 22.5 * 1000.0) as u32;
        let mut queued = [0u32; 7];
        queued[3] = q;
        let at = |queued: &[u32]| kept_on_3(&k, &kn, (&loads, queued), &d);
        assert_eq!(at(&queued), (false, Reason::Spill));
        queued[3] = q / 2;
        assert_eq!(at(&queued), (true, Reason::Warm));
    }

    #[test]
    fn a_holder_at_the_threshold_is_kept_while_its_delay_is_below_the_penalty() {
        // The holder at the threshold (256), the others at 250: the gap (6
        // requests, 60 ms) is below the penalty, so the holder keeps its
        // request; with `soft_threshold` off the threshold alone makes it
        // spill; its queued prefill counts.
        let mut loads = [250u32; 7];
        loads[3] = 256;
        let hard = AffinityConfig {
            soft_threshold: false,
            ..AffinityConfig::default()
        };
        let (k, kn, queued) = kept_unless(&loads, &hard);
        // The same queue under the threshold (255 in flight, within the
        // relative bound): the queue does not decide (module docs, "Queue").
        loads[3] = 255;
        let req = request_queued(&k, Some(&kn), &loads, &queued);
        let c = choose(&ring(7), &req, &cost(), &AffinityConfig::default());
        assert_eq!((c.primary, c.reason), (3, Reason::Warm));
    }

    #[test]
    fn a_new_branch_pays_the_slot_wait_of_a_holder_past_the_threshold() {
        // Holder 3 at 260 in flight (threshold 256, within the relative
        // bound 2 × 166.7), the others at 150 (mean 165.7); a wait price of
        // 0.5 ms per request (the in-flight gap: 55 ms) and an exact repeat
        // of an 8 192-token prompt (245 ms of prefill): kept. A learned run
        // time of 20 s frees a slot every 78 ms, and the 5 requests over the
        // threshold cost 390 ms more: moved; 5 s (98 ms more): kept.
        let (k, repeat, loads) = repeat_on_3(150, 260);
        let none = [0u32; 7];
        let model = |run_ms: f64| {
            let mut m = CostModel::new(CostConfig {
                wait_ms_per_request: 0.5,
                learn: true,
                ..cost().config()
            });
            if run_ms > 0.0 {
                m.observe_run(run_ms);
            }
            m
        };
        let on = AffinityConfig::default();
        let off = AffinityConfig {
            slot_wait: false,
            ..on
        };
        let go = |kn: &Known, queued: &[u32], run_ms: f64, cfg: &AffinityConfig| {
            let req = request_queued(&k, Some(kn), &loads, queued);
            let c = choose(&ring(7), &req, &model(run_ms), cfg);
            (c.primary == 3, c.reason)
        };
        assert_eq!(go(&repeat, &none, 0.0, &on), (true, Reason::Warm));
        assert_eq!(go(&repeat, &none, 20_000.0, &on), (false, Reason::Spill));
        assert_eq!(go(&repeat, &none, 20_000.0, &off), (true, Reason::Warm));
        assert_eq!(go(&repeat, &none, 5_000.0, &on), (true, Reason::Warm));
        // A conversation's next turn (half of its prompt known, no other
        // request went on past it: not a branch) is not charged: kept.
        let turn = known(64, &[3], 0);
        assert_eq!(go(&turn, &none, 20_000.0, &on), (true, Reason::Warm));
        // Nor a move whose target is above the mean: replicas 0–2 (100 in
        // flight) are prefilling 50 000 tokens each, so the alternative is
        // one of 4–6 at 200 (mean 165.7): kept.
        let mut uneven = [200u32; 7];
        uneven[..3].copy_from_slice(&[100; 3]);
        uneven[3] = 260;
        let mut busy = [0u32; 7];
        busy[..3].copy_from_slice(&[50_000; 3]);
        let req = request_queued(&k, Some(&repeat), &uneven, &busy);
        let c = choose(&ring(7), &req, &model(20_000.0), &on);
        assert_eq!((c.primary, c.reason), (3, Reason::Warm));
    }

    #[test]
    fn light_load_keeps_a_holder_within_the_absolute_slack() {
        // Mean 11 / 7 ≈ 1.6: the relative bound 2 × 2.6 = 5.1 puts the
        // holder (5 in flight) over it, the absolute slack (mean + 8 ≈ 9.6)
        // does not; without the slack it spills; kept over the relative
        // bound only while its queued prefill does not outweigh the penalty.
        let mut loads = [1u32; 7];
        loads[3] = 5;
        let strict = AffinityConfig {
            light_slack: 0.0,
            light_share: 0.0,
            ..AffinityConfig::default()
        };
        let (k, kn, queued) = kept_unless(&loads, &strict);
        // Within the relative bound the queue does not decide the spill
        // (module docs, "Queue"): 3 in flight (bound 2 × 2.3 = 4.6) keeps
        // the holder.
        let mut loads4 = loads;
        loads4[3] = 3;
        let req = request_queued(&k, Some(&kn), &loads4, &queued);
        let c = choose(&ring(7), &req, &cost(), &AffinityConfig::default());
        assert_eq!((c.primary, c.reason), (3, Reason::Warm));
        // Heavier load: mean 78 / 7 ≈ 11.1, the holder at 30 is over both
        // the relative bound (24.3) and the slack (19.1): without the queue
        // band it spills; with it (within 2 × 24.3) the queued prefill
        // decides.
        let mut loads = [8u32; 7];
        loads[3] = 30;
        let no_band = AffinityConfig {
            queue_band: 0.0,
            ..AffinityConfig::default()
        };
        let c = choose(
            &ring(7),
            &request(&k, Some(&kn), Loads::new(&loads)),
            &cost(),
            &no_band,
        );
        assert_eq!(c.reason, Reason::Spill);
        assert_ne!(c.primary, 3);
        let req = request_queued(&k, Some(&kn), &loads, &queued);
        let c = choose(&ring(7), &req, &cost(), &AffinityConfig::default());
        assert_eq!(c.reason, Reason::Spill);
        let none = [0u32; 7];
        let req = request_queued(&k, Some(&kn), &loads, &none);
        let c = choose(&ring(7), &req, &cost(), &AffinityConfig::default());
        assert_eq!((c.primary, c.reason), (3, Reason::Warm));
    }

    /// A model (configured 10 ms per in-flight request) that learned
    /// TTFT = 20 + 30 ms per 1000 tokens + `wait` ms per request.
    fn learned_ms_per_request(wait: f64) -> CostModel {
        let mut learned = CostModel::new(CostConfig {
            learn: true,
            forget: 0.999,
            ..cost().config()
        });
        for i in 0..4000u32 {
            let (u, l) = (f64::from(i * 7919 % 9000), f64::from(i * 31 % 40));
            learned.observe(u, l, 20.0 + 0.03 * u + wait * l);
        }
        learned
    }

    /// [`learned_ms_per_request`] at 100 ms.
    fn learned_100ms_per_request() -> CostModel {
        learned_ms_per_request(100.0)
    }

    #[test]
    fn a_learned_wait_above_the_prior_is_charged_at_the_prior_with_a_queue_picture() {
        let learned = learned_100ms_per_request();
        assert!(
            (learned.wait_ms(1.0) - 100.0).abs() < 5.0,
            "{}",
            learned.wait_ms(1.0)
        );
        // 8192 tokens known (penalty 245 ms); the holder 10 requests above
        // the others (within the load bound): 1 000 ms at the learned
        // price, 100 at the configured one.
        let (k, kn, loads) = repeat_on_3(40, 50);
        let mut queued = [50_000u32; 7];
        let decide = |queued: Option<&[u32]>, cfg: &AffinityConfig| {
            let req = Request {
                queued_prefill: queued,
                shallow: None,
                ..request(&k, Some(&kn), Loads::new(&loads))
            };
            choose(&ring(7), &req, &learned, cfg)
        };
        let on = AffinityConfig::default();
        let off = AffinityConfig {
            queue_wait_cap: false,
            ..on
        };
        // Equal queues: the in-flight gap is not backed by queued prefill,
        // the configured price (100 ms) is charged: kept.
        let c = decide(Some(&queued), &on);
        assert_eq!((c.primary, c.reason), (3, Reason::Warm));
        // The learned price alone (cap off, or no queue picture): spilled.
        assert_eq!(decide(Some(&queued), &off).reason, Reason::Spill);
        assert_eq!(decide(None, &on).reason, Reason::Spill);
        // 20 000 more tokens queued on the holder (600 ms): still the
        // configured price, as the configured model decides (the holder is
        // within the load bound, where the queue is not priced).
        queued[3] = 70_000;
        let c = decide(Some(&queued), &on);
        assert_eq!((c.primary, c.reason), (3, Reason::Warm));
        let req = request_queued(&k, Some(&kn), &loads, &queued);
        assert_eq!(choose(&ring(7), &req, &cost(), &on).reason, Reason::Warm);
        assert_eq!(decide(Some(&queued), &off).reason, Reason::Spill);
        // The ceiling never raises a price: a learned price under the
        // configured one is used as is (2 ms per request: 20 ms for the
        // 10-request gap, against 100 at the configured price; a 2 048-token
        // prefix saves 61 ms).
        let low = learned_ms_per_request(2.0);
        assert!((low.wait_ms(1.0) - 2.0).abs() < 0.5, "{}", low.wait_ms(1.0));
        let part = known(32, &[3], 0);
        let req = request_queued(&k, Some(&part), &loads, &queued);
        let at = |m: &CostModel| choose(&ring(7), &req, m, &on);
        assert_eq!((at(&low).primary, at(&low).reason), (3, Reason::Warm));
        assert_eq!(at(&cost()).reason, Reason::Spill);
    }

    #[test]
    fn the_spill_price_floor_counts_a_replica_request_per_own_count() {
        // Behind 4 gateways counting their own requests, one count stands
        // for 4 requests, and the learned price (100 ms per count) for
        // 4 × 25: the floor of the cap is 40 ms per count.
        let learned = learned_100ms_per_request();
        // 8192 tokens known (penalty 245 ms); the holder 10 counts above
        // the others, equal queues: the floor decides.
        let (k, kn, loads) = repeat_on_3(40, 50);
        let queued = [50_000u32; 7];
        let scaled = |per_count: f64| Request {
            queued_prefill: Some(&queued),
            shallow: None,
            ..request(&k, Some(&kn), Loads::new(&loads).scaled(per_count))
        };
        let cfg = AffinityConfig::default();
        // One gateway: 100 ms, kept.
        let c = choose(&ring(7), &scaled(1.0), &learned, &cfg);
        assert_eq!((c.primary, c.reason), (3, Reason::Warm));
        // Four: 400 ms, spilled.
        let c = choose(&ring(7), &scaled(4.0), &learned, &cfg);
        assert_eq!(c.reason, Reason::Spill);
        assert_ne!(c.primary, 3);
        // A scale below 1 (or not a number) counts as 1.
        for s in [0.0, 0.5, f64::NAN] {
            let c = choose(&ring(7), &scaled(s), &learned, &cfg);
            assert_eq!((c.primary, c.reason), (3, Reason::Warm), "{s}");
        }
        // The floor never raises the price above the learned one: at the
        // configured 10 ms per count (100 ms here) the holder stays at
        // any scale.
        let c = choose(&ring(7), &scaled(4.0), &cost(), &cfg);
        assert_eq!((c.primary, c.reason), (3, Reason::Warm));
    }

    #[test]
    fn a_short_shared_prefix_gets_less_slack_than_a_long_one() {
        // Mean load 4 (bound 2 × 5 = 10): a holder at 7 in flight.
        let mut loads = [4u32; 7];
        loads[3] = 7;
        loads[0] = 1;
        // The prefix is the whole prompt: the holder is kept.
        let whole = key(11, 64);
        let c = pick(&whole, Some(&known(64, &[3], 0)), &loads);
        assert_eq!((c.primary, c.reason), (3, Reason::Warm));
        // The same known prefix under a prompt 4× longer (coverage 0.25):
        // with the holder at 8 in flight (mean 29/7), slack
        // (mean + 1)·1.5 + 1 ≈ 8.7 < 8 + 1 ≤ full bound 10.3: a new holder.
        loads[3] = 8;
        let mut long = key(11, 64);
        long.units *= 4;
        let req = Request {
            key: &long,
            prompt_chars: long.units,
            known: Some(&known(64, &[3], 0)),
            loads: Loads::new(&loads),
            ticket: 0,
            pressure: None,
            share: None,
            queued_prefill: None,
            shallow: None,
        };
        // (The queue band off: at a mean of 4.1 it would price this holder.)
        let no_band = AffinityConfig {
            queue_band: 0.0,
            ..AffinityConfig::default()
        };
        let c = choose(&ring(7), &req, &cost(), &no_band);
        assert_eq!(c.reason, Reason::Spill);
        assert_ne!(c.primary, 3);
    }

    fn pick_shared(k: &RoutingKey, kn: Option<&Known>, loads: &[u32], counts: &[u8]) -> Choice {
        pick_with(k, kn, loads, Some(&Share::from_counts(counts)))
    }

    #[test]
    fn a_holder_over_the_share_bound_passes_its_prefix_on() {
        let k = key(42, 64);
        let idle = [0u32; 7];
        // Replica 3 holds the prefix. Counts: the others 10. With 12 on
        // replica 3 (mean 73 / 7, soft bound 12.4, hard 14.4): over the soft
        // bound only, it keeps its prefix.
        let mut counts = [10u8; 7];
        counts[3] = 12;
        let c = pick_shared(&k, Some(&known(64, &[3], 0)), &idle, &counts);
        assert_eq!((c.primary, c.reason), (3, Reason::Warm));
        // A second holder under the bound takes it (free).
        let c = pick_shared(&k, Some(&known(64, &[3, 5], 0)), &idle, &counts);
        assert_eq!((c.primary, c.reason), (5, Reason::Warm));
        // Two holders under the bound: the smaller share.
        counts[3] = 9;
        counts[5] = 11;
        let c = pick_shared(&k, Some(&known(64, &[5, 3], 0)), &idle, &counts);
        assert_eq!((c.primary, c.reason), (3, Reason::Warm));
        // Over the hard bound (mean 78 / 7, 14 + 1 > 11.1 + 4): the replica
        // with the smallest share becomes a holder.
        let mut counts = [10u8; 7];
        counts[3] = 14;
        counts[6] = 7;
        let c = pick_shared(&k, Some(&known(64, &[3], 0)), &idle, &counts);
        assert_eq!((c.primary, c.reason), (6, Reason::Spill));
        assert_eq!(c.expected_cached_tokens, 0.0);
        // Without counts (or with the bound off in the caller): warm.
        let c = pick(&k, Some(&known(64, &[3], 0)), &idle);
        assert_eq!((c.primary, c.reason), (3, Reason::Warm));
        // The load bound still comes first: a holder under the share bound
        // but over the load bound is not taken.
        let mut loads = [0u32; 7];
        loads[5] = 30;
        counts[5] = 0;
        let c = pick_shared(&k, Some(&known(64, &[3, 5], 0)), &loads, &counts);
        assert_ne!(c.primary, 5);
    }

    #[test]
    fn the_share_bound_splits_a_prefix_that_fanned_out_not_a_conversation() {
        // Replica 3 holds 48 of the request's 64 blocks and is over the
        // hard bound (as above); replica 6 has the smallest share.
        let k = key(42, 64);
        let idle = [0u32; 7];
        let mut counts = [10u8; 7];
        counts[3] = 14;
        counts[6] = 7;
        let known_at = |depth: usize, stamp: u64, end: bool| {
            let mut kn = known(depth, &[3], 0);
            kn.entry.tag = (1 << 8) | stamp | if end { 1 << 47 } else { 0 };
            kn
        };
        let pick_at = |kn: Known, cfg: &AffinityConfig, prompt_chars: usize| {
            let sh = Share::from_counts(&counts);
            let req = Request {
                share: Some(&sh),
                prompt_chars,
                ..request(&k, Some(&kn), Loads::new(&idle))
            };
            let c = choose(&ring(7), &req, &cost(), cfg);
            (c.primary, c.reason)
        };
        let on = AffinityConfig {
            share_factor: 1.0,
            ..AffinityConfig::default()
        };
        let units = k.units;
        // An earlier request of 64 blocks or more went on past the known
        // block: this one (64) did not extend it, the prefix fanned out.
        for stamp in [64, 70, 255] {
            let c = pick_at(known_at(48, stamp, false), &on, units);
            assert_eq!(c, (6, Reason::Spill), "{stamp}");
        }
        // A shorter one did (the next turn of a conversation is longer
        // than the turn before), nobody did, or the known prefix is a whole
        // prompt (end mark): kept.
        for (stamp, end) in [(63, false), (10, false), (0, false), (64, true)] {
            let c = pick_at(known_at(48, stamp, end), &on, units);
            assert_eq!(c, (3, Reason::Warm), "{stamp} {end}");
        }
        // The whole key known: an exact repeat moves, a window that the
        // prompt goes on past does not.
        assert_eq!(
            pick_at(known_at(64, 0, true), &on, units),
            (6, Reason::Spill)
        );
        assert_eq!(
            pick_at(known_at(64, 0, true), &on, units + 1),
            (3, Reason::Warm)
        );
        // `share_fan_out` off: every request over the hard bound moves.
        let off = AffinityConfig {
            share_fan_out: false,
            ..on
        };
        assert_eq!(
            pick_at(known_at(48, 0, false), &off, units),
            (6, Reason::Spill)
        );
    }

    #[test]
    fn a_warm_request_reads_the_pressure_only_when_the_share_bound_may_move_it() {
        let k = key(42, 64);
        let idle = [0u32; 7];
        let on = AffinityConfig {
            share_factor: 1.0,
            ..AffinityConfig::default()
        };
        // Replica 3 holds 48 blocks, stamped by a request of 64: fanned out.
        let mut kn = known(48, &[3], 0);
        kn.entry.tag = (1 << 8) | 64;
        // Pressure: replicas 5 and 6 have the same share; the one given
        // fewer new prefixes becomes the new holder.
        let five = Pressure::from_counts(&[3, 3, 3, 3, 3, 2, 4]);
        let six = Pressure::from_counts(&[3, 3, 3, 3, 3, 4, 2]);
        let asked = std::cell::Cell::new(0);
        let run_with = |p: Pressure, counts: &[u8], kn: &Known| {
            let sh = Share::from_counts(counts);
            let req = Request {
                share: Some(&sh),
                ..request(&k, Some(kn), Loads::new(&idle))
            };
            let read = || {
                asked.set(asked.get() + 1);
                Some(p)
            };
            let c = choose_tiered(&ring(7), &req, &cost(), &on, |_| None, read);
            (c.primary, c.reason)
        };
        let run = |counts: &[u8], kn: &Known| run_with(five, counts, kn);
        // Under the soft bound: kept, nothing read.
        let under = [10u8; 7];
        assert_eq!((run(&under, &kn), asked.get()), ((3, Reason::Warm), 0));
        // Over the hard bound (replicas 5 and 6 lowest): read once, and the
        // new holder is ranked by it.
        let mut over = [10u8; 7];
        over[3] = 14;
        over[5] = 7;
        over[6] = 7;
        assert_eq!((run(&over, &kn), asked.get()), ((5, Reason::Spill), 1));
        assert_eq!(run_with(six, &over, &kn), (6, Reason::Spill));
        asked.set(1);
        // The next turn of a conversation (no stamp): not movable, not read.
        assert_eq!(
            (run(&over, &known(48, &[3], 0)), asked.get()),
            ((3, Reason::Warm), 1)
        );
    }

    #[test]
    fn a_share_move_waits_while_its_target_is_prefilling() {
        // Replica 3 holds the prefix (fanned out) and is over the hard bound;
        // replica 6 has the smallest share (as above).
        let k = key(42, 64);
        let mut kn = known(48, &[3], 0);
        kn.entry.tag = (1 << 8) | 64;
        let mut counts = [10u8; 7];
        counts[3] = 14;
        counts[6] = 7;
        let sh = Share::from_counts(&counts);
        let on = AffinityConfig {
            share_factor: 1.0,
            ..AffinityConfig::default()
        };
        let pick_q = |loads: &[u32], queued: &[u32], cfg: &AffinityConfig| {
            let req = Request {
                share: Some(&sh),
                ..request_queued(&k, Some(&kn), loads, queued)
            };
            let c = choose(&ring(7), &req, &cost(), cfg);
            (c.primary, c.reason)
        };
        let idle = [0u32; 7];
        // Nothing queued anywhere: the move (a new holder).
        assert_eq!(pick_q(&idle, &[0; 7], &on), (6, Reason::Spill));
        // Replica 6 is prefilling another prompt (4 000 tokens queued, one
        // request in flight): the request stays on its holder, warm.
        let mut loads = [0u32; 7];
        loads[6] = 1;
        let mut queued = [0u32; 7];
        queued[6] = 4000;
        assert_eq!(pick_q(&loads, &queued, &on), (3, Reason::Warm));
        // The holder is prefilling as much or more: the move goes ahead.
        loads[3] = 1;
        queued[3] = 4000;
        assert_eq!(pick_q(&loads, &queued, &on), (6, Reason::Spill));
        // Replica 6 decoding only (in flight, nothing queued), or starting a
        // short warm prefill (200 tokens: 6 ms at 30 ms per 1 000, under the
        // 10 ms of one in-flight request): the move.
        let (mut loads, mut queued) = ([0u32; 7], [0u32; 7]);
        loads[6] = 1;
        assert_eq!(pick_q(&loads, &queued, &on), (6, Reason::Spill));
        queued[6] = 200;
        assert_eq!(pick_q(&loads, &queued, &on), (6, Reason::Spill));
        queued[6] = 400;
        assert_eq!(pick_q(&loads, &queued, &on), (3, Reason::Warm));
        // Knob off: the move whatever the target's queue.
        let off = AffinityConfig {
            share_wait_busy: false,
            ..on
        };
        let mut queued = [0u32; 7];
        queued[6] = 4000;
        assert_eq!(pick_q(&loads, &queued, &off), (6, Reason::Spill));
        assert_eq!(pick_q(&loads, &queued, &on), (3, Reason::Warm));
    }

    #[test]
    fn a_replica_under_the_share_floor_takes_the_split_of_a_holder_over_the_soft_bound() {
        let k = key(42, 64);
        let idle = [0u32; 7];
        // Replica 3 holds the prefix with 51 (mean 342 / 7 = 48.9, slack
        // 2.1: soft bound 51.0, hard 53.0, floor 46.8): over the soft bound
        // only. Replica 6 has 40: 41 < 46.8, under the floor.
        let mut counts = [50u8; 7];
        counts[3] = 51;
        counts[6] = 40;
        let holder = known(64, &[3], 0);
        let cfg = AffinityConfig {
            share_factor: 1.0,
            ..AffinityConfig::default()
        };
        let pick_p = |counts: &[u8], pressure: &[u8], loads: &[u32]| {
            let (sh, p) = (Share::from_counts(counts), Pressure::from_counts(pressure));
            let req = Request {
                share: Some(&sh),
                pressure: Some(&p),
                ..request(&k, Some(&holder), Loads::new(loads))
            };
            let c = choose(&ring(7), &req, &cost(), &cfg);
            (c.primary, c.reason)
        };
        // Settled (21 new prefixes for 341 requests) and replica 6 has as
        // few prefixes as any: the floor is open, the hard bound is the
        // soft one, and the split goes to replica 6.
        assert_eq!(pick_p(&counts, &[3; 7], &idle), (6, Reason::Spill));
        // Without the floor (no pressure counters: it stays closed) the
        // holder keeps its prefix, as before.
        let c = pick_shared(&k, Some(&holder), &idle, &counts);
        assert_eq!((c.primary, c.reason), (3, Reason::Warm));
        // Replica 6 was given more new prefixes than another replica (no
        // room): closed, warm.
        let mut p = [3u8; 7];
        p[6] = 4;
        assert_eq!(pick_p(&counts, &p, &idle), (3, Reason::Warm));
        // Not settled (35 new prefixes ≥ 0.1 × 341): closed, warm.
        assert_eq!(pick_p(&counts, &[5; 7], &idle), (3, Reason::Warm));
        // Replica 6 over the load bound: not acceptable, closed, warm.
        let mut loads = [0u32; 7];
        loads[6] = 6;
        assert_eq!(pick_p(&counts, &[3; 7], &loads), (3, Reason::Warm));
        // A holder under the soft bound is never moved by the floor.
        counts[3] = 49;
        assert_eq!(pick_p(&counts, &[3; 7], &idle), (3, Reason::Warm));
    }

    #[test]
    fn cold_placement_breaks_load_ties_by_share() {
        let r = ring(5);
        let k = key(0xbeef, 8);
        let order: Vec<usize> = r.candidates(0xbeef).collect();
        // The ring's first choice has the most requests: the next one.
        let mut counts = [5u8; 5];
        counts[order[0]] = 9;
        let c = pick_shared(&k, None, &[0; 5], &counts);
        assert_eq!(c.reason, Reason::Cold);
        assert_ne!(c.primary, order[0]);
        assert_eq!(pick_shared(&k, None, &[0; 5], &[5; 5]).primary, order[0]);
        // Load first: an idle replica with a high share beats a busy one.
        let mut loads = [2u32; 5];
        loads[order[0]] = 0;
        assert_eq!(pick_shared(&k, None, &loads, &counts).primary, order[0]);
    }

    #[test]
    fn cached_tokens_and_coverage_follow_uneven_blocks() {
        // Blocks closed at message ends: 256 | 44 | 256 | 44 | 1000 × 256.
        let mut k = key(7, 1004);
        let mut ends = vec![256u32, 300, 556, 600];
        ends.extend((1..=1000).map(|b| 600 + 256 * b));
        k.ends = ends;
        k.units = 600 + 256_000;
        let cfg = AffinityConfig {
            min_match: 0.0,
            ..AffinityConfig::default()
        };
        let kn = known(4, &[3], 0);
        let c = choose(
            &ring(7),
            &request(&k, Some(&kn), Loads::new(&[0; 7])),
            &cost(),
            &cfg,
        );
        assert_eq!((c.primary, c.reason), (3, Reason::Warm));
        // 600 characters known, not 4 × 256.
        let cpt = cfg.chars_per_token;
        assert!((c.expected_cached_tokens - 600.0 / cpt).abs() < 1e-9);
        // Coverage by characters: the first 2 blocks are 300 of 600.
        k.ends.truncate(4);
        k.blocks.truncate(4);
        k.units = 600;
        let half = warm_coverage(&k, Some(&known(2, &[3], 0)), &cfg).unwrap();
        assert!((half - 0.5).abs() < 1e-9);
        // With min_match 0.6 the same depth is not enough (by count it
        // would be: 2 of 4 blocks × 256 = 512 ≥ 360).
        let strict = AffinityConfig {
            min_match: 0.6,
            ..cfg
        };
        assert_eq!(warm_coverage(&k, Some(&known(2, &[3], 0)), &strict), None);
        assert!(warm_coverage(&k, Some(&known(3, &[3], 0)), &strict).is_some());
    }

    #[test]
    fn queued_prefill_ranks_holders_and_cold_candidates_by_expected_delay() {
        let r = ring(7);
        let k = key(0xfeed, 64);
        let order: Vec<usize> = r.candidates(0xfeed).collect();
        // The ring owner has 30 000 tokens queued (900 ms at 30 ms per 1000
        // tokens), every other replica none.
        let mut queued = [0u32; 7];
        queued[order[0]] = 30_000;
        let go = |kn: Option<&Known>, loads: &[u32], q: Option<&[u32]>| {
            let req = Request {
                queued_prefill: q,
                shallow: None,
                ..request(&k, kn, Loads::new(loads))
            };
            choose(&r, &req, &cost(), &AffinityConfig::default())
        };
        let loads = [2u32; 7];
        // Cold, equal loads: the second candidate; by load alone the owner.
        let c = go(None, &loads, Some(&queued));
        assert_eq!((c.primary, c.reason), (order[1], Reason::Cold));
        assert_eq!(go(None, &loads, None).primary, order[0]);
        // One more in flight on every other replica (10 ms) does not
        // outweigh 900 ms of queue, 100 more (1000 ms) do.
        for (l, want) in [(3, order[1]), (102, order[0])] {
            let mut loads = [l; 7];
            loads[order[0]] = 2;
            assert_eq!(go(None, &loads, Some(&queued)).primary, want, "{l}");
        }
        // Warm, two holders at equal load: the one without a queue; by load
        // alone the first listed (most recent).
        let loads = [2u32; 7];
        let other = order[1];
        let two = known(64, &[order[0] as u16, other as u16], 0);
        let c = go(Some(&two), &loads, Some(&queued));
        assert_eq!((c.primary, c.reason), (other, Reason::Warm));
        assert_eq!(go(Some(&two), &loads, None).primary, order[0]);
        // The spill rule still compares in-flight counts: a lone holder with
        // a queue keeps its prefix.
        let lone = known(64, &[order[0] as u16], 0);
        let c = go(Some(&lone), &loads, Some(&queued));
        assert_eq!((c.primary, c.reason), (order[0], Reason::Warm));
    }

    #[test]
    fn unavailable_and_keyless() {
        let k = key(5, 16);
        let order: Vec<usize> = ring(3).candidates(5).collect();
        let mut avail = [true; 3];
        avail[order[0]] = false;
        let loads = Loads::with_available(&[0; 3], &avail);
        let c = choose(
            &ring(3),
            &request(&k, None, loads),
            &cost(),
            &AffinityConfig::default(),
        );
        assert_ne!(c.primary, order[0]);
        // A holder that is down is not warm.
        let down = known(16, &[order[0] as u16], 0);
        let c = choose(
            &ring(3),
            &request(&k, Some(&down), loads),
            &cost(),
            &AffinityConfig::default(),
        );
        assert_eq!(c.reason, Reason::Cold);
        let nokey = RoutingKey {
            key: None,
            blocks: vec![],
            ends: vec![],
            units: 0,
            source: KeySource::None,
            routing_id: RoutingId::Absent,
        };
        let c = pick(&nokey, None, &[4, 1, 3]);
        assert_eq!((c.primary, c.reason), (1, Reason::NoKey));
    }
}
