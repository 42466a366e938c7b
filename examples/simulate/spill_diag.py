#!/usr/bin/env python3
"""Which decisions make the p90 tail of `ours`, from one run's per-request dump
and per-decision log:

    SIM_DUMP=D SIM_DECIDE=1 simulate --workload trace --trace T --policies ours --threads 1 2> D/ours.dec
    spill_diag.py D/ours.csv D/ours.dec

Classes: `spill`, `cold`, and warm requests split by what the queue said at
the decision: `warm, queue>penalty` when the holder's expected delay over the
fleet's least (wait price x in-flight gap + prefill price x queued-token gap)
exceeded the cache-break penalty (prefill price x expected cached tokens),
i.e. the queue would have paid for a spill. Per class: requests, requests in
the tail (TTFT >= p90), mean TTFT; for spills the prices they saw and the
queues they left and joined; for warm tail requests the in-flight price, the
queue price and the penalty.
"""
import csv, sys, statistics as st
rows = {int(r['idx']): r for r in csv.DictReader(open(sys.argv[1]))}
dec = {}
for line in open(sys.argv[2]):
    if not line.startswith('DEC,'): continue
    f = line.strip().split(',')
    idx = int(f[1])
    dec[idx] = dict(reason=f[2], prim=int(f[3]), lp=int(f[4]), qp=int(f[5]), h=int(f[6]), lh=int(f[7]), qh=int(f[8]),
                    minl=int(f[9]), mean=float(f[10]), w=float(f[11]), b=float(f[12]), cached_exp=float(f[13]), minq=int(f[14]))
tt = sorted(float(r['ttft']) for r in rows.values())
p90 = tt[int(0.9 * (len(tt) - 1))]
ws = [d['w'] for d in dec.values()]
print(f"n={len(rows)} p90={p90*1e3:.0f}ms  learned wait ms/req: p10 {sorted(ws)[len(ws)//10]:.2f} p50 {st.median(ws):.2f} p90 {sorted(ws)[9*len(ws)//10]:.2f} max {max(ws):.2f}")
def cls(i):
    d = dec[i]; r = rows[i]
    if d['reason'] == 'spill': return 'spill'
    if d['reason'] == 'cold': return 'cold'
    # warm: did the queue (b × queued tokens) say the holder was slower than the least-loaded by more than the penalty?
    pen = d['b'] * d['cached_exp'] / 1000
    qdelay = d['w'] * (d['lp'] - d['minl']) + d['b'] * (d['qp'] - d['minq']) / 1000
    return 'warm, queue>penalty' if qdelay > pen else 'warm, queue<=penalty'
from collections import Counter, defaultdict
allc = Counter(); tailc = Counter(); ttf = defaultdict(list)
for i, r in rows.items():
    c = cls(i); allc[c] += 1; ttf[c].append(float(r['ttft']))
    if float(r['ttft']) >= p90: tailc[c] += 1
for c in sorted(allc):
    print(f"  {c:22} all {allc[c]:5}  tail {tailc[c]:4}  mean ttft {st.mean(ttf[c])*1e3:6.0f} ms")
# spills: in the tail, the price they saw
sp = [i for i in rows if dec[i]['reason'] == 'spill']
if sp:
    tsp = [i for i in sp if float(rows[i]['ttft']) >= p90]
    def desc(ids):
        return (f"holder-minload {st.mean(dec[i]['lh']-dec[i]['minl'] for i in ids):.1f}, wait price {st.mean(dec[i]['w'] for i in ids):.2f} ms/req, "
                f"holder q {st.mean(dec[i]['qh'] for i in ids)/1e3:.1f}k tok, target q {st.mean(dec[i]['qp'] for i in ids)/1e3:.1f}k, "
                f"uncached on target {st.mean(int(rows[i]['prompt'])-int(rows[i]['cached']) for i in ids):.0f}")
    print("  spills (all):", desc(sp))
    if tsp: print("  spills (tail):", desc(tsp))
    # would-be spill by in-flight price: w*(lh-minl) > pen? vs load bound
    bound = sum(1 for i in sp if dec[i]['lh'] + 1 > 2 * (dec[i]['mean'] + 1))
    print(f"  spills over the relative load bound 2(mean+1): {bound} of {len(sp)}")
wq = [i for i in rows if dec[i]['reason'] == 'warm' and float(rows[i]['ttft']) >= p90]
if wq:
    print(f"  warm tail: holder load-min {st.mean(dec[i]['lp']-dec[i]['minl'] for i in wq):.1f}, holder q {st.mean(dec[i]['qp'] for i in wq)/1e3:.1f}k vs min q {st.mean(dec[i]['minq'] for i in wq)/1e3:.1f}k, "
          f"price by in-flight {st.mean(dec[i]['w']*(dec[i]['lp']-dec[i]['minl']) for i in wq):.0f} ms vs by queue {st.mean(dec[i]['b']*(dec[i]['qp']-dec[i]['minq'])/1e3 for i in wq):.0f} ms vs penalty {st.mean(dec[i]['b']*dec[i]['cached_exp']/1e3 for i in wq):.0f} ms")
