#!/usr/bin/env python3
"""Where a policy's TTFT tail comes from, from `SIM_DUMP=DIR simulate ...` CSVs.

Usage: SIM_DUMP=/tmp/d simulate --workload trace --trace T --policies gie,ours
       tail_diag.py /tmp/d/gie.csv /tmp/d/ours.csv

Per request: `own` = the TTFT it would have alone on an idle replica (API
delay + its uncached prefill at the calibrated 30 us/token with the attention
factor + one 12 ms step per 8192-token chunk: an estimate), `wait` = TTFT -
own, `q_ahead` / `tok_ahead` = requests (and their uncached tokens) on the
same replica that arrived before it and had not had their first token yet.
Prints the means over all requests and over the slowest 10 % (the p90 tail).
"""
import csv,sys,bisect
def load(p):
    rows=[]
    for r in csv.DictReader(open(p)):
        rows.append(dict(idx=int(r['idx']),t=float(r['arrived']),rep=int(r['replica']),P=int(r['prompt']),C=int(r['cached']),ttft=float(r['ttft']),spill=int(r['spill']),done=float(r['done'])))
    return rows
def own(r):  # own prefill time estimate on idle replica: api + prefill
    u=r['P']-r['C']
    return 0.010+1e-6*r['P']+ u*30e-6*(1+ (r['C']+u/2)/53800) + 0.012*max(1,(u+8191)//8192)
def analyze(name,rows):
    n=len(rows)
    by={}
    for r in rows: by.setdefault(r['rep'],[]).append(r)
    for r in rows:
        t=r['t']; rep=by[r['rep']]
        ahead=[o for o in rep if o['t']<t and o['t']+o['ttft']>t]
        r['q_ahead']=len(ahead)
        r['tok_ahead']=sum(o['P']-o['C'] for o in ahead)
        r['inflight']=sum(1 for o in rep if o['t']<t and o['done']>t)
        r['own']=own(r)
        r['wait']=r['ttft']-r['own']
    tt=sorted(r['ttft'] for r in rows); p90=tt[int(0.9*(n-1))]
    tail=[r for r in rows if r['ttft']>=p90]
    import statistics as st
    def m(xs): return st.mean(xs) if xs else 0
    print(f"== {name}: n={n} p50={tt[n//2]*1e3:.0f} p90={p90*1e3:.0f} hit={sum(r['C'] for r in rows)/sum(r['P'] for r in rows)*100:.1f}")
    for lab,sub in [('all',rows),('tail',tail)]:
        print(f"  {lab:5} n={len(sub)} uncached={m([r['P']-r['C'] for r in sub]):.0f} prompt={m([r['P'] for r in sub]):.0f} own={m([r['own'] for r in sub])*1e3:.0f}ms wait={m([r['wait'] for r in sub])*1e3:.0f}ms q_ahead={m([r['q_ahead'] for r in sub]):.2f} tok_ahead={m([r['tok_ahead'] for r in sub]):.0f} inflight={m([r['inflight'] for r in sub]):.1f} hitfrac={m([r['C']/r['P'] for r in sub]):.2f}")
    # tail composition: own >= p90 (unavoidable), or wait dominated
    unav=sum(1 for r in tail if r['own']>=p90*0.8)
    print(f"  tail: own>=0.8*p90 {unav}, wait-dominated {sum(1 for r in tail if r['wait']>r['own'])}, hit(>50%) {sum(1 for r in tail if r['C']*2>=r['P'])}")
    return rows
res={}
for p in sys.argv[1:]:
    res[p]=analyze(p.split('/')[-1],load(p))
