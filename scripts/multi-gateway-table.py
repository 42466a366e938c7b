#!/usr/bin/env python3
"""Markdown tables of the simulator's multi-gateway policies (MODE/N[/DELAY]).

usage: scripts/multi-gateway-table.py [--spread] RUN.json|RUN.txt [...]

Each file is the `--json` output of `simulate` runs with `--gw-modes`, or
their printed tables (stdout). For every
workload: one row per (mode, delay), one column per gateway count, cells
`hit% / p50 / p90 ms`, a check mark when the cell meets the issue-11 target
against one gateway (`ours`, N = 1): hit within 2 points and p90 within 10 %.
The same workload in several files of different seeds (the JSON's `seed`,
or `_sN.` in a text file's name) is averaged per cell; a policy repeated in
several files of one seed (such as `ours`) counts once. `--spread` prints,
for every policy run with several seeds, the mean and the min–max. Python 3 standard library only.
"""
import json
import re
import sys
from collections import defaultdict


def parse(name):
    parts = name.split("/")
    if len(parts) not in (2, 3):
        return None
    mode, n = parts[0], int(parts[1])
    delay = int(float(parts[2])) if len(parts) == 3 else None
    return mode, n, delay


def seed_of(path):
    """Seed of a run: the JSON's `seed`, else `_sN.` in the file name, else 1."""
    with open(path) as f:
        text = f.read()
    if text.lstrip().startswith("{"):
        return json.loads(text).get("seed", 1)
    m = re.search(r"_s(\d+)\.", path)
    return int(m.group(1)) if m else 1


def load(path):
    """Workloads as in `simulate --json`, from a JSON file or printed tables."""
    with open(path) as f:
        text = f.read()
    if text.lstrip().startswith("{"):
        d = json.loads(text)
        out = []
        for w in d["workloads"]:
            if "runs" not in w:
                out.append(w)
                continue
            # `--seeds N`: one run per seed, seed .. seed + N - 1.
            for i, run in enumerate(w["runs"]):
                out.append(dict(w, policies=run["policies"], _seed=d.get("seed", 1) + i))
        return out
    out, cur, extra = [], None, {}
    at = [1, 2, 3]
    for line in text.splitlines():
        if line.startswith("== "):
            name, _, desc = line[3:].partition(": ")
            cur = {"workload": name, "description": desc, "policies": []}
            out.append(cur)
        elif line.startswith("  ") and cur and ": " in line:
            pol, _, kv = line.strip().partition(": ")
            e = extra.setdefault((cur["workload"], pol), {})
            for k, _, v in (x.partition("=") for x in kv.split() if "=" in x):
                try:
                    e[k] = float(v)
                except ValueError:
                    pass
        elif line.startswith("policy"):
            # Column positions from the header ("p50 ms" is one column).
            cols = [t for t in line.split() if t != "ms"]
            at = [cols.index(c) for c in ("hit%", "p50", "p90")]
        elif cur and line and not line.startswith(" "):
            f = line.split()
            if len(f) > max(at):
                try:
                    hit, p50, p90 = (float(f[i]) for i in at)
                except ValueError:
                    continue
                cur["policies"].append(
                    {"policy": f[0], "hit_rate": hit / 100, "ttft_ms": {"p50": p50, "p90": p90}}
                )
    for w in out:
        for r in w["policies"]:
            r["extra"] = extra.get((w["workload"], r["policy"]), {})
    return out


MODE_ORDER = ["indep", "truth", "det", "det+truth", "peer", "peer+truth", "peer+eng"]


def mode_rank(mode):
    return (MODE_ORDER.index(mode), "") if mode in MODE_ORDER else (len(MODE_ORDER), mode)


def spread(paths):
    """Per workload, every policy with several seeds: mean (min–max)."""
    by_seed = defaultdict(lambda: defaultdict(dict))
    for p in paths:
        seed = seed_of(p)
        for w in load(p):
            for r in w["policies"]:
                row = (round(100 * r["hit_rate"], 1), round(r["ttft_ms"]["p90"]))
                by_seed[w["workload"]][r["policy"]][w.get("_seed", seed)] = row
    cells = {
        wl: {k: list(v.values()) for k, v in pols.items()} for wl, pols in by_seed.items()
    }
    print("| workload | policy | seeds | hit % mean (min–max) | p90 ms mean (min–max) | target |")
    print("|---|---|---|---|---|---|")
    for wl, pols in cells.items():
        base = pols.get("ours")
        if not base:
            continue
        bh = sum(x[0] for x in base) / len(base)
        bp = sum(x[1] for x in base) / len(base)
        names = sorted((k for k, v in pols.items() if len(v) > 1), key=lambda k: (k != "ours", mode_rank(k.split("/")[0]), k))
        for k in names:
            v = pols[k]
            h = [x[0] for x in v]
            q = [x[1] for x in v]
            mh, mq = sum(h) / len(h), sum(q) / len(q)
            ok = "" if k == "ours" else ("✓" if mh >= bh - 2 and mq <= 1.1 * bp else "✗")
            print(
                f"| {wl} | {k} | {len(v)} | {mh:.1f} ({min(h):.1f}–{max(h):.1f}) | "
                f"{mq:.0f} ({min(q)}–{max(q)}) | {ok} |"
            )


def main(paths):
    passes = defaultdict(lambda: defaultdict(list))  # (mode, delay) -> n -> [workload ok]
    # (workload) -> policy -> seed -> (hit, p50, p90, extra)
    cells = defaultdict(lambda: defaultdict(dict))
    desc = {}
    for p in paths:
        seed = seed_of(p)
        for w in load(p):
            desc[w["workload"]] = w["description"]
            for r in w["policies"]:
                t = r["ttft_ms"]
                row = (100 * r["hit_rate"], t["p50"], t["p90"], r.get("extra", {}))
                # One run per (policy, seed): `ours` repeated in each file counts once.
                cells[w["workload"]][r["policy"]][w.get("_seed", seed)] = row
    cells = {wl: {k: list(v.values()) for k, v in pols.items()} for wl, pols in cells.items()}
    for wl, pols in cells.items():
        avg = {
            k: tuple(sum(x[i] for x in v) / len(v) for i in range(3)) for k, v in pols.items()
        }
        seeds = max(len(v) for k, v in pols.items() if parse(k))
        base = avg.get("ours") or avg.get("indep/1")
        print(f"\n#### {wl}: {desc[wl]}\n")
        if base:
            print(
                f"One gateway (`ours`): hit {base[0]:.1f} %, p50 {base[1]:.0f} ms, "
                f"p90 {base[2]:.0f} ms ({seeds} seed(s)). Cells: hit % / p50 / p90 ms; "
                "✓ = hit ≥ one gateway − 2 pts and p90 ≤ 1.1 × one gateway.\n"
            )
        rows = defaultdict(dict)
        ns = set()
        for k, v in avg.items():
            q = parse(k)
            if not q:
                continue
            mode, n, delay = q
            ns.add(n)
            rows[(mode, delay)][n] = v
        ns = sorted(ns)
        print("| mode | delay ms | " + " | ".join(f"N={n}" for n in ns) + " |")
        print("|---|---|" + "---|" * len(ns))
        order = sorted(rows, key=lambda md: (mode_rank(md[0]), -1 if md[1] is None else md[1]))
        for mode, delay in order:
            out = []
            for n in ns:
                v = rows[(mode, delay)].get(n)
                if not v:
                    out.append("")
                    continue
                ok = bool(base) and v[0] >= base[0] - 2 and v[2] <= 1.1 * base[2]
                passes[(mode, delay)][n].append((wl, ok))
                out.append(f"{v[0]:.1f} / {v[1]:.0f} / {v[2]:.0f}{' ✓' if ok else ''}")
            d = "—" if delay is None else str(delay)
            print(f"| {mode} | {d} | " + " | ".join(out) + " |")
        # Sync traffic of peer modes (bytes per request, share of request bytes).
        sync = [
            (k, v[0][3])
            for k, v in sorted(pols.items())
            if "peer" in k and v[0][3].get("sync_bytes_per_req") and parse(k)[2] == 200
        ]
        if sync:
            print("\nPeer sync traffic at 200 ms (per routed request, sent to all peers):\n")
            print(
                "| policy | index writes | bytes | share of request bytes |"
            )
            print("|---|---|---|---|")
            for k, e in sorted(sync, key=lambda ke: (mode_rank(parse(ke[0])[0]), parse(ke[0])[1:])):
                share = e.get("sync_share_of_body", 0)
                print(
                    f"| {k} | {e.get('sets_per_req', 0):.1f} | "
                    f"{e.get('sync_bytes_per_req', 0):.0f} | "
                    f"{100 * share:.2f} % |"
                )
    # Summary: workloads meeting the target per (mode, delay) and N.
    ns = sorted({n for v in passes.values() for n in v})
    print("\n#### Workloads meeting the target (hit ≥ one gateway − 2 pts, p90 ≤ +10 %)\n")
    print("| mode | delay ms | " + " | ".join(f"N={n}" for n in ns) + " |")
    print("|---|---|" + "---|" * len(ns))
    for mode, delay in sorted(passes, key=lambda md: (mode_rank(md[0]), -1 if md[1] is None else md[1])):
        cells = []
        for n in ns:
            r = passes[(mode, delay)].get(n, [])
            fails = [w for w, ok in r if not ok]
            cell = f"{len(r) - len(fails)}/{len(r)}"
            cells.append(cell + (f" (not {', '.join(fails)})" if fails else ""))
        d = "—" if delay is None else str(delay)
        print(f"| {mode} | {d} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        print(__doc__)
        sys.exit(2)
    if sys.argv[1] == "--spread":
        spread(sys.argv[2:])
    else:
        main(sys.argv[1:])
