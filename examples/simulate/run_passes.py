#!/usr/bin/env python3
"""Per-run verdicts of `scripts/quality-loop.sh` outputs: how many single runs
(one trace seed, one secret) pass each half of the issue-9 criterion, per set.

Usage: run_passes.py [--ours POLICY] OUT [OUT2 ...]

OUT is a loop directory (sets as subdirectories of `simulate --json` files).
Files of the same set and name in several OUTs are merged by policy name, so a
variant run alone (`POLICIES='ours:ways=4' scripts/quality-loop.sh OUT2`) is
judged against the baselines of OUT. Per run: hit passes when `ours` is at
least the best prefix-aware baseline's hit rate minus 0.5 points; p90 passes
when it is at most the lowest baseline p90 (strict: a single run has no CI).
Prints per set: runs, hit passes, mean (worst) hit - best in points, p90
passes, mean p90 against the lowest in %.
"""
import json
import os
import sys
from collections import defaultdict

BASELINES = ["sagemaker", "sagemaker_tuned", "chwbl", "chwbl_tuned",
             "gie", "gie_tuned", "sglang", "sglang_tuned"]


def main():
    args = sys.argv[1:]
    ours = "ours"
    if args[:1] == ["--ours"]:
        ours, args = args[1], args[2:]
    if not args:
        sys.exit(__doc__)
    runs = defaultdict(dict)  # (set, name) -> policy -> (hit %, p90 ms)
    for out in args:
        for st in sorted(os.listdir(out)):
            d = os.path.join(out, st)
            if st == "traces" or not os.path.isdir(d):
                continue
            for name in sorted(os.listdir(d)):
                if not name.endswith(".json"):
                    continue
                data = json.load(open(os.path.join(d, name)))
                for w in data["workloads"]:
                    for a in w["aggregate"]:
                        runs[(st, name)][a["policy"]] = (
                            100 * a["hit_rate"]["mean"],
                            a["ttft_ms"]["p90"]["mean"],
                        )
    sets = defaultdict(list)
    for (st, name), pols in sorted(runs.items()):
        base = {p: pols[p] for p in BASELINES if p in pols}
        if ours not in pols or not base:
            continue
        best = max(v[0] for v in base.values())
        low = min(v[1] for v in base.values())
        hit, p90 = pols[ours]
        sets[st].append((name, hit - best, 100 * (p90 - low) / low if low > 0 else 0.0))
    print(f"| set | runs | hit ≥ best − 0.5 | {ours} hit − best: mean (worst) "
          "| p90 ≤ lowest | p90 against the lowest, mean | misses |")
    print("|---|---:|---:|---:|---:|---:|---|")
    total = [0, 0, 0]
    for st, rows in sets.items():
        n = len(rows)
        hp = sum(1 for _, d, _ in rows if d >= -0.5)
        pp = sum(1 for _, _, q in rows if q <= 0)
        worst = min(d for _, d, _ in rows)
        miss = [f"{nm[:-5]} {d:+.2f}" for nm, d, _ in rows if d < -0.5]
        total = [total[0] + n, total[1] + hp, total[2] + pp]
        print(f"| {st} | {n} | {hp} | {sum(d for _, d, _ in rows) / n:+.2f} ({worst:+.2f}) "
              f"| {pp} | {sum(q for _, _, q in rows) / n:+.1f} % | {', '.join(miss)} |")
    print(f"| all | {total[0]} | {total[1]} | | {total[2]} | | |")


if __name__ == "__main__":
    main()
