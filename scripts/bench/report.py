#!/usr/bin/env python3
"""Tables and JSON summaries for scripts/bench.sh and scripts/demo.sh (stdlib only).

Subcommands:
  overhead DIR OUT_JSON ...   per-run wrk summaries in DIR/runs -> markdown table + OUT_JSON
  combine BENCH_DIR ...       every part's JSON in BENCH_DIR -> one markdown block for the README

Run files of the overhead part are named <size>-<latency|throughput>-<A|B>-<round>.json
(A = listener with the filter, B = the same Envoy without it).
"""

import argparse
import json
import os
import statistics
import sys
from datetime import datetime, timezone

# SPEC section 8: added latency at 16 KiB.
TARGET_P50_MS = 0.1
TARGET_P99_MS = 0.3


def load_runs(runs_dir):
    runs = {}
    for name in sorted(os.listdir(runs_dir)):
        if not name.endswith(".json") or name.startswith("warm"):
            continue
        size, mode, lis, rnd = name[:-5].split("-")
        with open(os.path.join(runs_dir, name)) as f:
            runs.setdefault((int(size), mode, lis), []).append(json.load(f))
    return runs


def errors(run):
    return sum(run["errors"].values())


def summarise(runs, lis_runs):
    """Medians over rounds of one (size, mode, listener)."""
    reqs = sum(r["requests"] for r in lis_runs)
    secs = sum(r["duration_us"] for r in lis_runs) / 1e6
    return {
        "rounds": len(lis_runs),
        "requests": reqs,
        "errors": sum(errors(r) for r in lis_runs),
        "p50_ms": statistics.median(r["latency_us"]["p50"] for r in lis_runs) / 1000,
        "p90_ms": statistics.median(r["latency_us"]["p90"] for r in lis_runs) / 1000,
        "p99_ms": statistics.median(r["latency_us"]["p99"] for r in lis_runs) / 1000,
        "rps": reqs / secs if secs else 0.0,
    }


def fmt_size(n):
    return f"{n // 1024} KiB" if n % 1024 == 0 else f"{n} B"


def overhead(args):
    runs = load_runs(os.path.join(args.dir, "runs"))
    sizes = sorted({k[0] for k in runs})
    rows = []
    for size in sizes:
        row = {"body_bytes": size}
        for mode in ("latency", "throughput"):
            a = summarise(runs, runs.get((size, mode, "A"), []))
            b = summarise(runs, runs.get((size, mode, "B"), []))
            row[mode] = {
                "with_filter": a,
                "without_filter": b,
                "added_p50_ms": a["p50_ms"] - b["p50_ms"],
                "added_p99_ms": a["p99_ms"] - b["p99_ms"],
                "throughput_ratio": a["rps"] / b["rps"] if b["rps"] else 0.0,
            }
        rows.append(row)

    total_errors = sum(errors(r) for v in runs.values() for r in v)
    a_requests = sum(r["requests"] for k, v in runs.items() if k[2] == "A" for r in v)
    with open(os.path.join(args.dir, "runs", "warm-a.json")) as f:
        a_requests += json.load(f)["requests"]

    t16 = next((r for r in rows if r["body_bytes"] == 16384), None)
    target = None
    if t16:
        lat = t16["latency"]
        target = {
            "added_p50_ms": round(lat["added_p50_ms"], 4),
            "added_p99_ms": round(lat["added_p99_ms"], 4),
            "p50_target_ms": TARGET_P50_MS,
            "p99_target_ms": TARGET_P99_MS,
            "met": lat["added_p50_ms"] <= TARGET_P50_MS and lat["added_p99_ms"] <= TARGET_P99_MS,
        }

    out = {
        "part": "overhead",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": args.machine,
        "setup": {
            "envoy_under_test": "Envoy 1.40.0 --concurrency 1, listener A = prefix-router wasm "
            "(strategy prefix) + router, listener B = router only, same cluster",
            "upstream": "Envoy 1.40.0 --concurrency 1, buffer filter + direct_response 200",
            "load": f"wrk -t1, closed loop, keep-alive; latency c=1, throughput c={args.conns}; "
            f"{args.seconds} s per run, A/B interleaved; medians over rounds",
            "throughput_connections": args.conns,
            "bodies": "OpenAI chat JSON (system prompt + user message), 64 distinct prefixes",
        },
        "rows": rows,
        "target_16k": target,
        "errors": total_errors,
        "filter_decisions": args.decisions,
        "requests_via_filter": a_requests,
        "elapsed_s": args.elapsed,
    }
    with open(args.out, "w") as f:
        json.dump(out, f, indent=2)
        f.write("\n")

    print(overhead_markdown(out))
    problems = []
    if total_errors:
        problems.append(f"{total_errors} wrk errors (connect/read/write/status/timeout)")
    # wrk stops counting a request still in flight when the run ends: allow a few per run.
    if abs(args.decisions - a_requests) > 2 * len(runs) + 8:
        problems.append(f"filter counted {args.decisions} decisions but {a_requests} requests "
                        "went through listener A")
    for p in problems:
        print(f"error: {p}", file=sys.stderr)
    return 1 if problems else 0


def overhead_markdown(o):
    lines = [
        "| body | p50 without | p50 with | added p50 | p99 without | p99 with | added p99 "
        f"| req/s without (c={o['setup']['throughput_connections']}) "
        "| req/s with | throughput with/without |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in o["rows"]:
        lat, tp = r["latency"], r["throughput"]
        lines.append(
            f"| {fmt_size(r['body_bytes'])} "
            f"| {lat['without_filter']['p50_ms']:.3f} ms | {lat['with_filter']['p50_ms']:.3f} ms "
            f"| **{lat['added_p50_ms'] * 1000:+.0f} µs** "
            f"| {lat['without_filter']['p99_ms']:.3f} ms | {lat['with_filter']['p99_ms']:.3f} ms "
            f"| **{lat['added_p99_ms'] * 1000:+.0f} µs** "
            f"| {tp['without_filter']['rps']:,.0f} | {tp['with_filter']['rps']:,.0f} "
            f"| {tp['throughput_ratio']:.2f} |"
        )
    t = o.get("target_16k")
    if t:
        verdict = "met" if t["met"] else "NOT met"
        lines.append("")
        lines.append(
            f"Target at 16 KiB (SPEC §8): added p50 ≤ {t['p50_target_ms']} ms, "
            f"p99 ≤ {t['p99_target_ms']} ms → measured {t['added_p50_ms']:+.3f} ms / "
            f"{t['added_p99_ms']:+.3f} ms: **{verdict}**."
        )
    lines.append("")
    lines.append(f"Load: {o['setup']['load']}. Envoy under test: {o['setup']['envoy_under_test']}; "
                 f"upstream: {o['setup']['upstream']}.")
    return "\n".join(lines)


def combine(args):
    parts = []
    for name in ("overhead", "routing", "llama"):
        path = os.path.join(args.bench_dir, f"{name}.json")
        if os.path.exists(path) and (not args.since or os.path.getmtime(path) >= args.since):
            with open(path) as f:
                parts.append((name, json.load(f)))
    print("### Benchmarks")
    print()
    print(f"Command: `{args.command}` — run {datetime.now().strftime('%Y-%m-%d')} on "
          f"{args.machine}.")
    for name, data in parts:
        print()
        if name == "overhead":
            print("#### Filter overhead (real Envoy, same process, with vs without the filter)")
            print()
            print(overhead_markdown(data))
        elif name == "routing":
            print("#### Routing quality through Envoy (7 emulated replicas)")
            print()
            print(data.get("markdown", ""))
        elif name == "llama":
            print("#### Real engines (llama.cpp)")
            print()
            print(data.get("markdown", json.dumps(data, indent=2)))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    o = sub.add_parser("overhead")
    o.add_argument("dir")
    o.add_argument("out")
    o.add_argument("--decisions", type=int, required=True)
    o.add_argument("--seconds", type=float, required=True)
    o.add_argument("--conns", type=int, required=True)
    o.add_argument("--machine", default="")
    o.add_argument("--elapsed", type=int, default=0)
    c = sub.add_parser("combine")
    c.add_argument("bench_dir")
    c.add_argument("--command", default="./build.sh bench")
    c.add_argument("--machine", default="")
    c.add_argument("--since", type=float, default=0)
    args = ap.parse_args()
    return overhead(args) if args.cmd == "overhead" else combine(args)


if __name__ == "__main__":
    sys.exit(main())
