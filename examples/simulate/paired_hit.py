#!/usr/bin/env python3
"""Paired hit-rate test for trace rows (complements criterion.py).

Usage: paired_hit.py [--ours POLICY] FILE.json...   (files as for criterion.py)

criterion.py's hit test on trace rows compares means with CIs taken over the
trace seeds, which differ from each other far more than the policies do
(uniqmix: ±6 points), so a gap of several points can pass "within the CIs".
Here, per case (trace kind, replica count), the best baseline (highest mean
hit among the prefix-aware baselines) is compared trace by trace: mean paired
difference `ours − best` and its 95 % Student CI over the trace seeds.
Passes when the mean is ≥ −0.5 points. criterion.py applies the same paired
test to its trace rows' hit verdict (with "yes (CI)" when the CI reaches
−0.5); this script shows the per-case detail.
"""
import json, math, os, re, sys
from collections import defaultdict

BASELINES = ["sagemaker", "sagemaker_tuned", "chwbl", "chwbl_tuned", "gie", "gie_tuned", "sglang", "sglang_tuned"]
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776}


def main():
    args = sys.argv[1:]
    ours = "ours"
    if args[:1] == ["--ours"]:
        ours, args = args[1], args[2:]
    # case -> policy -> seed -> hit %
    hits = defaultdict(lambda: defaultdict(dict))
    for f in args:
        d = json.load(open(f))
        name = re.sub(r"^q-", "", os.path.basename(f)).replace(".json", "")
        parts = name.split("-")
        kind, seed = parts[0], parts[1] if len(parts) > 2 else "1"
        for w in d["workloads"]:
            if w["workload"] != "trace":
                continue
            for a in w["aggregate"]:
                hits[(kind, d["replicas"])][a["policy"]][seed] = 100 * a["hit_rate"]["mean"]
    print(f"| case | best baseline | paired Δ hit ({ours} − best), pts | ≥ −0.5 |")
    print("|---|---|---:|:-:|")
    for case in sorted(hits):
        pols = hits[case]
        if ours not in pols:
            continue
        base = [p for p in BASELINES if p in pols]
        best = max(base, key=lambda p: sum(pols[p].values()) / len(pols[p]))
        seeds = sorted(set(pols[ours]) & set(pols[best]))
        diffs = [pols[ours][s] - pols[best][s] for s in seeds]
        m = sum(diffs) / len(diffs)
        ci = 0.0
        if len(diffs) > 1:
            sd = math.sqrt(sum((x - m) ** 2 for x in diffs) / (len(diffs) - 1))
            ci = T975.get(len(diffs) - 1, 1.96) * sd / math.sqrt(len(diffs))
        print(f"| {case[0]}, {case[1]} replicas | {best} | {m:+.2f} ± {ci:.2f} | {'yes' if m >= -0.5 else '**no**'} |")


if __name__ == "__main__":
    main()
