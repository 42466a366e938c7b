#!/usr/bin/env python3
"""Where a policy loses cache hits on multi-turn chats, per request, from
`SIM_DUMP=DIR simulate --workload chat ...` CSVs (columns `output`, `prev`).

Usage: SIM_DUMP=/tmp/d simulate --workload chat --seed 1 --load-levels 0.8 \
           --policies sglang_tuned,ours
       turn_diag.py /tmp/d/sglang_tuned.csv /tmp/d/ours.csv

Per request, `ideal` = the prompt tokens a replica holding the previous turn
(its prompt and its answer, whole 16-token blocks) can serve, or for a first
turn the whole blocks of the prompt that the best request so far shared
(approximated by the system prompt: the cached tokens of the policy's best
first turn). `lost` = ideal − cached (≥ 0). Classes, in this order:
  first     a conversation's first turn
  moved     a later turn on another replica than its previous turn
            (split into spill = the policy flagged a spill, other = not)
  evicted   a later turn on the previous turn's replica that found less than
            ideal (its blocks were evicted, or the previous turn had not
            finished when it arrived)
  ok        the rest
Prints, per class, the requests and the tokens lost as a share of all prompt
tokens; with two or more files also the per-request difference against the
first file (which requests hit less, by class of the second file).
"""
import csv
import sys

BLOCK = 16


def load(path):
    rows = []
    for r in csv.DictReader(open(path)):
        rows.append(
            dict(
                idx=int(r["idx"]),
                rep=int(r["replica"]),
                P=int(r["prompt"]),
                C=int(r["cached"]),
                spill=int(r["spill"]),
                out=int(r["output"]),
                prev=int(r["prev"]),
                t=float(r["arrived"]),
                done=float(r["done"]),
            )
        )
    return rows


def classify(rows):
    first_best = max((r["C"] for r in rows if r["prev"] < 0), default=0)
    for r in rows:
        if r["prev"] < 0:
            r["ideal"] = min(first_best, r["P"] - 1)
            r["cls"] = "first"
        else:
            p = rows[r["prev"]]
            share = ((p["P"] + p["out"]) // BLOCK) * BLOCK
            r["ideal"] = min(share, ((r["P"] - 1) // BLOCK) * BLOCK)
            if r["rep"] != p["rep"]:
                r["cls"] = "moved/spill" if r["spill"] else "moved/other"
            elif r["C"] < r["ideal"]:
                r["cls"] = "evicted"
            else:
                r["cls"] = "ok"
        r["lost"] = max(0, r["ideal"] - r["C"])
    return rows


def summary(name, rows):
    total = sum(r["P"] for r in rows)
    hit = sum(r["C"] for r in rows) / total
    ideal = sum(r["ideal"] for r in rows) / total
    print(f"== {name}: {len(rows)} requests, hit {100*hit:.2f} %, ideal {100*ideal:.2f} %")
    for cls in ["first", "moved/spill", "moved/other", "evicted", "ok"]:
        sub = [r for r in rows if r["cls"] == cls]
        lost = sum(r["lost"] for r in sub)
        print(f"  {cls:12} n={len(sub):5}  lost {100*lost/total:5.2f} % of prompt tokens")
    return total


def main():
    runs = [(p.split("/")[-1], classify(load(p))) for p in sys.argv[1:]]
    for name, rows in runs:
        summary(name, rows)
    if len(runs) < 2:
        return
    base_name, base = runs[0]
    for name, rows in runs[1:]:
        total = sum(r["P"] for r in rows)
        print(f"== {name} against {base_name}: tokens hit less (+) / more (−), by {name}'s class")
        by = {}
        for a, b in zip(base, rows):
            d = a["C"] - b["C"]
            k = b["cls"]
            n, s, worse = by.get(k, (0, 0, 0))
            by[k] = (n + 1, s + d, worse + (d > 0))
        for k, (n, s, worse) in sorted(by.items()):
            print(f"  {k:12} n={n:5} hit less in {worse:5}  net {100*s/total:+.2f} % of prompt tokens")


main()
