#!/usr/bin/env python3
"""Sync traffic of the simulator's `peer` gateway policies, per workload.

usage: scripts/multi-gateway-sync.py RUN.json [...]

For each `--json` output of `simulate --gw-modes peer...`: one row per
(file, workload), one column per gateway count, cells `hit % / sync share`
where the share is the bytes a gateway serves to its N - 1 peers (14-byte
items, batch headers not counted) over its request bytes, and the hit rate
of one gateway (`ours`) for reference. Python 3 standard library only.
"""
import json
import sys


def main(paths):
    rows, ns = [], set()
    for path in paths:
        d = json.load(open(path))
        for w in d["workloads"]:
            cells, one = {}, None
            for run in w["runs"][:1]:
                for p in run["policies"]:
                    name = p["policy"]
                    if name == "ours":
                        one = p["hit_rate"]
                    parts = name.split("/")
                    if parts[0] != "peer" or len(parts) != 3:
                        continue
                    n = int(parts[1])
                    ns.add(n)
                    share = p["extra"].get("sync_share_of_body", 0.0)
                    cells[n] = (p["hit_rate"], share)
            rows.append((path, w["workload"], one, cells))
    ns = sorted(ns)
    print("| run | workload | one gateway hit | " + " | ".join(f"N={n}: hit / sync" for n in ns) + " |")
    print("|---|---|---|" + "---|" * len(ns))
    for path, wl, one, cells in rows:
        one_s = f"{100 * one:.1f} %" if one is not None else "—"
        out = []
        for n in ns:
            if n in cells:
                h, s = cells[n]
                out.append(f"{100 * h:.1f} % / {100 * s:.2f} %")
            else:
                out.append("—")
        print(f"| {path} | {wl} | {one_s} | " + " | ".join(out) + " |")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
