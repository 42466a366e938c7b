#!/usr/bin/env python3
"""Sync traffic of the simulator's `peer` gateway policies, per workload.

usage: scripts/multi-gateway-sync.py [--label NAME=RUN.json ...] RUN.json [...]

For each `--json` output of `simulate --gw-modes peer...`: one row per
(file, workload), one column per gateway count N, cells
`hit % / items % / total %`:
- items: the item bytes a gateway sends to its N - 1 peers (batches as the
  filter encodes them, headers not counted) over its request bytes
  (`sync_share_of_body`);
- total: sent + received items plus, per pull, a request and a response
  head (100 B over HTTP/2 as measured end to end, both as puller and as
  server) at 1 000 requests/s per gateway and the default 100 ms period
  (`sync_share_total_at_1000`;
  printed as "-" for runs made before it existed);
and the hit rate of one gateway (`ours`) for reference. A file may be
given as NAME=PATH to print NAME in the first column. Python 3 standard
library only.
"""
import json
import sys


def main(args):
    rows, ns = [], set()
    for arg in args:
        label, _, path = arg.rpartition("=")
        label = label or path
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
                    extra = p["extra"]
                    cells[n] = (
                        p["hit_rate"],
                        extra.get("sync_share_of_body", 0.0),
                        extra.get("sync_share_total_at_1000"),
                    )
            rows.append((label, w["workload"].split(":")[0], one, cells))
    ns = sorted(ns)
    print("| run | workload | one gateway hit | "
          + " | ".join(f"N={n}: hit / items / total" for n in ns) + " |")
    print("|---|---|---|" + "---|" * len(ns))
    for label, wl, one, cells in rows:
        one_s = f"{100 * one:.1f} %" if one is not None else "—"
        out = []
        for n in ns:
            if n in cells:
                h, s, t = cells[n]
                t_s = f"{100 * t:.2f} %" if t is not None else "-"
                out.append(f"{100 * h:.1f} % / {100 * s:.2f} % / {t_s}")
            else:
                out.append("—")
        print(f"| {label} | {wl} | {one_s} | " + " | ".join(out) + " |")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
