"""misses.py [-v] RUN.jsonl... : for `prefix-load --requests-jsonl` records of the `sagemaker` workload through
Envoy (`./build.sh bench routing`: `.work/bench/routing/sagemaker-affinity.requests.jsonl`; the emulator echoes
the filter's `x-prefix-router-decision`, so each record carries its decision): per run hit, share band, TTFT p50/p90, zero-cached requests by class.
Classes of a request with 0 cached tokens (per-request records with the echoed decision):
  cold    first request of its group (16 unavoidable)
  share   decision spill, no holder had a prefill queued (decoding requests at most): the share bound's move
  load    decision spill, some holder had a prefill queued (a request in flight without its first token): a load (cost) spill;
          only requests with 0 cached tokens count as prefilling (a warm prefill is ~17 ms)
  evict   decision hit (warm) on a replica that served the group before: its prefix was evicted
  pending decision hit on a replica whose first prefill of the group had not finished at send
  other   anything else (e.g. decision cold for a known group)
A 'spill' that lands on a replica that already served the group and gets 0 cached is counted as
share/load by its decision, with '+ev' when it lands on a former holder."""
import json, sys, collections
def pct(xs, q):
    xs = sorted(xs); i = min(len(xs) - 1, max(0, int(round(q * (len(xs)) + 0.5)) - 1))
    return xs[i]
def analyse(path, verbose=False):
    rs = [json.loads(l) for l in open(path)]
    rs.sort(key=lambda r: r["start_ms"])
    served = collections.defaultdict(dict)   # group -> replica -> end of first prefill (start+ttft)
    spans = collections.defaultdict(list)    # replica -> [(start, end)]
    cls = collections.Counter(); lines = []
    pt = sum(r["prompt_tokens"] for r in rs); ct = sum(r["cached_tokens"] for r in rs)
    per = collections.Counter(r["replica"] for r in rs)
    for r in rs:
        g, rep, t, d = r["group"], r["replica"], r["start_ms"], r.get("decision")
        if r["cached_tokens"] == 0:
            holders = served[g]
            if not holders:
                c = "cold"
            elif d == "spill":
                # a holder with a prefill queued (a request sent there whose first token had not come)
                busy = [h for h in holders if any(s <= t < f for (s, f, e, c) in spans[h] if c == 0)]
                c = "load" if busy else "share"
                if rep in holders: c += "+ev"
            elif d == "hit":
                if rep in holders and holders[rep] > t: c = "pending"
                elif rep in holders: c = "evict"
                else: c = "other-hit"
            else:
                c = "other-" + str(d)
            cls[c] += 1
            if c != "cold":
                inflight = {h: (sum(1 for (s, f, e, c) in spans[h] if s <= t < e), sum(1 for (s, f, e, c) in spans[h] if s <= t < f and c == 0)) for h in sorted(holders)}
                lines.append(f"  {t/1000:6.2f}s {c:8} {g:6} -> {rep} holders(in flight, cold prefilling) {inflight} counts {dict(sorted(collections.Counter(x['replica'] for x in rs if x['start_ms']<t).items()))}")
        served[g].setdefault(rep, t + r["ttft_ms"])
        spans[rep].append((t, t + r["ttft_ms"], t + r["latency_ms"], r["cached_tokens"]))
    tt = [r["ttft_ms"] for r in rs]
    n = len(rs)
    res = dict(hit=100 * ct / pt, mn=min(per.values()), mx=max(per.values()), p50=pct(tt, .5), p90=pct(tt, .9),
               zero=sum(cls.values()), cls=dict(cls), dec=dict(collections.Counter(r.get("decision") for r in rs)))
    if verbose: print("\n".join(lines))
    return res
if __name__ == "__main__":  # python3 scripts/bench/misses.py [-v] FILES
    v = "-v" in sys.argv
    tot = collections.Counter(); k = 0
    for p in [a for a in sys.argv[1:] if a != "-v"]:
        r = analyse(p, v); k += 1
        tot.update({c: x for c, x in r["cls"].items() if c != "cold"})
        nc = {c: x for c, x in sorted(r["cls"].items()) if c != "cold"}
        print(f"{p.split('/')[-1]:22} hit {r['hit']:5.2f} % share {r['mn']}-{r['mx']} p50 {r['p50']:5.1f} p90 {r['p90']:5.1f} zero {r['zero']} non-cold {nc} dec {r['dec']}")
    print("total non-cold misses over", k, "runs:", dict(tot))
