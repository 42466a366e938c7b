#!/usr/bin/env python3
"""Hit rate lost behind giant prefills, from one `SIM_DUMP` CSV.

Usage: giant_diag.py TRACE.jsonl POLICY.csv [GIANT_TOKENS [BLOCK_TOKENS]]

A *giant* is a request whose uncached prompt (prompt − cached) exceeds
GIANT_TOKENS (default 50 000); it occupies its replica from arrival to
first token. For every request, its *known prefix* is the run's ground
truth (not the router's index): the longest run of its leading `hash_ids`
that earlier requests of the same run contained, `depth` blocks, whose
*holder* is the replica that served the latest such request. A request
that got fewer than `min(prompt, depth × BLOCK_TOKENS)` tokens cached lost
the difference; the loss counts as **behind a giant** when it was served
away from that holder while the holder was prefilling a giant (arrived in
the giant's [arrival, first token) window).

Prints: the number of giants, the points of hit rate (lost tokens / all
prompt tokens × 100) lost behind giants and how many requests lost them,
the points lost in all, and the run's hit rate. Cost: O(requests × blocks
+ lost requests × giants of one replica).
"""

import collections
import csv
import json
import sys


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    trace = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
    rows = list(csv.DictReader(open(sys.argv[2])))
    giant = int(sys.argv[3]) if len(sys.argv) > 3 else 50_000
    block = int(sys.argv[4]) if len(sys.argv) > 4 else 512
    if len(rows) != len(trace):
        sys.exit(f"{len(rows)} rows for {len(trace)} trace lines")
    total = sum(int(r["prompt"]) for r in rows)
    windows = collections.defaultdict(list)
    giants = 0
    for r in rows:
        if int(r["prompt"]) - int(r["cached"]) > giant:
            giants += 1
            start = float(r["arrived"])
            windows[r["replica"]].append((start, start + float(r["ttft"])))
    holder = {}  # chained block key -> replica that served it last
    lost_behind = lost_all = behind_n = 0
    for req, r in zip(trace, rows):
        keys, k = [], 0
        for b in req["hash_ids"]:
            k = hash((k, b))
            keys.append(k)
        depth = 0
        while depth < len(keys) and keys[depth] in holder:
            depth += 1
        if depth > 0:
            miss = max(0, min(int(r["prompt"]), depth * block) - int(r["cached"]))
            if miss > 0:
                lost_all += miss
                h, t = holder[keys[depth - 1]], float(r["arrived"])
                if h != r["replica"] and any(a <= t < e for a, e in windows[h]):
                    lost_behind += miss
                    behind_n += 1
        for key in keys:
            holder[key] = r["replica"]
    pts = lambda x: 100.0 * x / max(total, 1)  # noqa: E731
    hit = pts(sum(int(r["cached"]) for r in rows))
    print(
        f"giants {giants}  lost behind a giant {pts(lost_behind):.3f} points "
        f"({behind_n} requests)  lost in all {pts(lost_all):.3f} points  hit {hit:.2f} %"
    )


if __name__ == "__main__":
    main()
