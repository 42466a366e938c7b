#!/usr/bin/env python3
"""Helpers of the `agreement` bench part (scripts/bench/agreement.sh).

    agreement.py slice SRC OUT --from N --count N --max-tokens N [--time-unit U]
    agreement.py report OUT_JSON --sim SIM_JSON [--sim-share SIM_JSON]
                 --envoy NAME=PREFIX_LOAD_JSON... [--meta KEY=VALUE...]

slice: lines FROM..FROM+COUNT-1 (0-based, empty lines skipped) of a Mooncake-style JSONL trace,
timestamps rebased to 0 and written in milliseconds, `output_length` capped at --max-tokens
(prefix-load caps its `max_tokens` there; the simulator uses the trace's value, so the file
carries the cap and both sides generate the same number of tokens). The unit of SRC is
--time-unit, else detected on the whole file by the rule of emulator/src/load/trace.rs
(`detect_unit`: an epoch by magnitude, relative times by the unit whose mean rate is closest to
10 req/s), so a window keeps the unit of its source. Both consumers are then run with
`--time-unit ms`. Cost: one pass over SRC.

report: one markdown table, per strategy the simulator's figures, Envoy's and their difference
(Envoy minus simulator), and OUT_JSON with every input. Exit status 1 when an Envoy run lost a
request, has no hit rate from the replicas, or did not replay the whole slice.

With --replay-sim BIN --slice FILE --time-scale T, each Envoy run is also replayed in the
simulator on Envoy's own routing ("simulator on Envoy's routing"): the slice is split by the
replica that served each request (prefix-load's --requests-jsonl, next to its JSON), and each
part runs on one simulated replica (`--replicas 1`; replicas do not interact, so this is the
simulator's answer for exactly that placement). A difference left there is the engine's and
the clock's (real time, arrival order of simultaneous requests), not the router's. Cost: 7
simulator runs per Envoy run (under a second each).
"""
import argparse
import json
import csv
import math
import os
import subprocess
import sys
import tempfile
from datetime import datetime, timezone

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import finish, spill  # noqa: E402

PER_SECOND = {"s": 1.0, "ms": 1e3, "us": 1e6, "ns": 1e9}


def number(v):
    """A JSON number or numeric string as int (exact) or float; None otherwise."""
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return v
    if isinstance(v, str):
        try:
            return int(v)
        except ValueError:
            try:
                return float(v)
            except ValueError:
                return None
    return None


def detect_unit(times):
    """The unit of raw timestamps (emulator/src/load/trace.rs `detect_unit`)."""
    t0 = min(times)
    a = abs(t0)
    if a >= 1e8:
        unit = "s" if a < 1e11 else "ms" if a < 1e14 else "us" if a < 1e17 else "ns"
        return unit, f"epoch magnitude {a:.2e}"
    span = max(times) - t0
    if len(times) < 2 or span <= 0:
        return "ms", "no time span (assumed)"
    best = None
    for u, per in PER_SECOND.items():
        rate = (len(times) - 1) / (span / per)
        d = abs(math.log10(rate) - 1.0)
        if best is None or d < best[1]:
            best = (u, d, rate)
    return best[0], f"mean rate {best[2]:.3f} req/s"


def slice_trace(args):
    rows = []
    with open(args.src) as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                ts = number(obj["timestamp"])
            except (ValueError, KeyError, TypeError) as e:
                print(f"error: {args.src} line {i}: {e}", file=sys.stderr)
                return 1
            if ts is None:
                print(f"error: {args.src} line {i}: timestamp is not a number", file=sys.stderr)
                return 1
            rows.append((ts, obj))
    if args.time_unit:
        unit, why = args.time_unit, "given"
    else:
        unit, why = detect_unit([t for t, _ in rows])
    window = rows[args.start:args.start + args.count]
    if len(window) < 2:
        print(f"error: {args.src} has {len(rows)} requests; window {args.start}+{args.count} "
              f"holds {len(window)}", file=sys.stderr)
        return 1
    t0 = min(t for t, _ in window)
    capped = 0
    with open(args.out, "w") as f:
        for t, obj in window:
            ms = (t - t0) * 1000 / PER_SECOND[unit]
            obj["timestamp"] = int(ms) if float(ms).is_integer() else round(ms, 3)
            out = number(obj.get("output_length"))
            if out is not None and out > args.max_tokens:
                obj["output_length"] = args.max_tokens
                capped += 1
            f.write(json.dumps(obj) + "\n")
    span = max(t for t, _ in window) - t0
    print(f"slice: requests {args.start + 1}-{args.start + len(window)} of {len(rows)} in "
          f"{os.path.basename(args.src)} (unit {unit}: {why}), span {span / PER_SECOND[unit]:.0f} s, "
          f"{capped} outputs capped at {args.max_tokens} tokens -> {args.out}")
    return 0


def fmt_ms(v):
    return f"{v:,.0f}".replace(",", " ")


def signed(v, digits=0):
    return f"{v:+,.{digits}f}".replace(",", " ")


def sim_row(path, policy):
    """The simulator's figures of POLICY (means over its seeds) from its --json file."""
    with open(path) as f:
        data = json.load(f)
    w = data["workloads"][0]
    agg = next(a for a in w["aggregate"] if a["policy"] == policy)
    done = [p["completed"] for r in w["runs"] for p in r["policies"] if p["policy"] == policy]
    n = round(sum(done) / len(done)) if done else 0
    return {
        "hit_rate": agg["hit_rate"]["mean"],
        "hit_ci95": agg["hit_rate"]["ci95"],
        "bound": agg["bound_hit_rate"]["mean"],
        "p50": agg["ttft_ms"]["p50"]["mean"],
        "p90": agg["ttft_ms"]["p90"]["mean"],
        "p99": agg["ttft_ms"]["p99"]["mean"],
        "spills": round(agg["spill_rate"]["mean"] * n) if policy == "ours" else None,
        "requests": n,
        "seeds": data.get("seeds", 1),
    }


def nearest_rank(v, q):
    """prefix-load's percentile (emulator/src/load/report.rs `Dist`)."""
    v = sorted(v)
    return v[min(max(math.ceil(q * len(v)), 1), len(v)) - 1]


def replay_row(args, envoy_json):
    """The simulator on the placement of one Envoy run (see the module docs)."""
    reqs = envoy_json[:-len(".json")] + ".requests.jsonl"
    with open(args.slice) as f:
        lines = [ln for ln in f.read().splitlines() if ln.strip()]
    by = {}
    with open(reqs) as f:
        for ln in f:
            r = json.loads(ln)
            by.setdefault(r["replica"], []).append(r["index"])
    ttft, cached, prompt = [], 0, 0
    with tempfile.TemporaryDirectory() as tmp:
        for rep, idx in sorted(by.items()):
            part = os.path.join(tmp, f"{rep}.jsonl")
            os.makedirs(os.path.join(tmp, rep))
            with open(part, "w") as f:
                f.write("\n".join(lines[i] for i in sorted(idx)) + "\n")
            subprocess.run([args.replay_sim, "--workload", "trace", "--trace", part,
                            "--time-unit", "ms", "--time-scale", args.time_scale, "--replicas",
                            "1", "--policies", "random", "--threads", "1"],
                           env=dict(os.environ, SIM_DUMP=os.path.join(tmp, rep)), check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            with open(os.path.join(tmp, rep, "random.csv")) as f:
                for row in csv.DictReader(f):
                    ttft.append(float(row["ttft"]) * 1000)
                    cached += int(row["cached"])
                    prompt += int(row["prompt"])
    return {"hit_rate": cached / prompt if prompt else None, "requests": len(ttft),
            **{k: nearest_rank(ttft, q) for k, q in (("p50", .5), ("p90", .9), ("p99", .99))}}


def envoy_row(path):
    with open(path) as f:
        s = json.load(f)
    t = s["ttft_ms"]
    return {
        "hit_rate": s.get("hit_rate"),
        "p50": t["p50"], "p90": t["p90"], "p99": t["p99"],
        "spills": spill(s),
        "requests": s["requests"], "ok": s["ok"], "errors": s["errors"],
        "status_counts": s.get("status_counts"),
        "branches": (s.get("envoy") or {}).get("branches"),
        "summary": s,
    }


# name of an Envoy run -> (strategy label, simulator file key, simulator policy)
PAIRS = {
    "affinity": ("`affinity`, `share_factor` 0 / `ours`", "sim", "ours"),
    "affinity_shipped": ("`affinity`, `share_factor` 1.0 (as shipped) / `ours share_factor=1`",
                         "sim_share", "ours"),
    "random": ("`random`", "sim", "random"),
}


def report(args):
    envoy = dict(kv.split("=", 1) for kv in args.envoy)
    meta = dict(kv.split("=", 1) for kv in args.meta)
    sims = {"sim": args.sim, "sim_share": args.sim_share}
    lines = [
        "| strategy | run | hit % | TTFT p50 ms | p90 ms | p99 ms | spills |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    problems, pairs, bound = [], {}, None
    for name, (label, key, policy) in PAIRS.items():
        if name not in envoy or not sims.get(key):
            continue
        sm, ev = sim_row(sims[key], policy), envoy_row(envoy[name])
        if policy != "ours":
            ev["spills"] = None  # spills are the affinity strategy's
        bound = sm["bound"]
        if ev["errors"] or ev["ok"] != sm["requests"]:
            problems.append(f"Envoy {name}: {ev['ok']} of {sm['requests']} requests answered, "
                            f"{ev['errors']} failed {ev['status_counts']}")
        if ev["hit_rate"] is None:
            problems.append(f"Envoy {name}: no hit rate from the replicas' counters")
            continue
        ci = f" ± {sm['hit_ci95'] * 100:.1f}" if sm["seeds"] > 1 else ""
        sp = lambda v: "–" if v is None else str(v)  # noqa: E731
        lines.append(f"| {label} | simulator | {sm['hit_rate'] * 100:.1f}{ci} | {fmt_ms(sm['p50'])} "
                     f"| {fmt_ms(sm['p90'])} | {fmt_ms(sm['p99'])} | {sp(sm['spills'])} |")
        lines.append(f"| | Envoy | {ev['hit_rate'] * 100:.1f} | {fmt_ms(ev['p50'])} "
                     f"| {fmt_ms(ev['p90'])} | {fmt_ms(ev['p99'])} | {sp(ev['spills'])} |")
        d = {k: ev[k] - sm[k] for k in ("p50", "p90", "p99")}
        d["hit_points"] = (ev["hit_rate"] - sm["hit_rate"]) * 100
        d["spills"] = (ev["spills"] - sm["spills"]
                       if ev["spills"] is not None and sm["spills"] is not None else None)
        lines.append(f"| | **Envoy − simulator** | **{signed(d['hit_points'], 1)}** "
                     f"| {signed(d['p50'])} | {signed(d['p90'])} | {signed(d['p99'])} "
                     f"| {'–' if d['spills'] is None else signed(d['spills'])} |")
        pairs[name] = {"simulator": sm, "envoy": {k: v for k, v in ev.items() if k != "summary"},
                       "difference": d}
        if args.replay_sim:
            rp = replay_row(args, envoy[name])
            lines.append(f"| | simulator on Envoy's routing | {rp['hit_rate'] * 100:.1f} "
                         f"| {fmt_ms(rp['p50'])} | {fmt_ms(rp['p90'])} | {fmt_ms(rp['p99'])} | |")
            rd = {k: ev[k] - rp[k] for k in ("p50", "p90", "p99")}
            rd["hit_points"] = (ev["hit_rate"] - rp["hit_rate"]) * 100
            lines.append(f"| | Envoy − that | {signed(rd['hit_points'], 1)} | {signed(rd['p50'])} "
                         f"| {signed(rd['p90'])} | {signed(rd['p99'])} | |")
            pairs[name]["simulator_on_envoy_routing"] = rp
            pairs[name]["difference_to_replay"] = rd
        if abs(d["hit_points"]) > 3:
            print(f"warning: {name}: hit rates differ by {d['hit_points']:+.1f} points "
                  "(more than 3: look for a setting that differs first)", file=sys.stderr)
    if not pairs and not problems:
        problems.append("no simulator/Envoy pair to compare")
    lines.append("")
    seeds = pairs and next(iter(pairs.values()))["simulator"]["seeds"]
    lines.append(
        f"Trace: {meta.get('trace', '?')}, requests {meta.get('window', '?')} "
        f"(infinite-cache bound {'?' if bound is None else f'{bound * 100:.1f} %'}), time scale "
        f"{meta.get('time_scale', '?')}, outputs capped at {meta.get('max_tokens', '?')} tokens. "
        f"Simulator: 7 replicas, calibrated engine model, mean of {seeds} seed(s) (± = 95 % CI); "
        f"Envoy: 7 replica-emulators `{meta.get('emulator', '?')}`, `envoy/envoy.yaml`, "
        "prefix-load at the trace's times, one run; hit = cached / prompt tokens (the replicas' "
        "counters); TTFT at the client; spills = the filter's `branch.spill` / the simulator's "
        "spill rate × requests"
        + ("; simulator on Envoy's routing = the slice split by the replica Envoy chose, each "
           "part on one simulated replica (percentiles nearest-rank, as prefix-load's)."
           if args.replay_sim else "."))
    md = "\n".join(lines)
    out = {
        "part": "agreement",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "meta": meta,
        "pairs": pairs,
        "envoy_runs": {n: envoy_row(p)["summary"] for n, p in envoy.items()},
        "markdown": md,
    }
    return finish(args.out, out, problems)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("slice")
    s.add_argument("src")
    s.add_argument("out")
    s.add_argument("--from", dest="start", type=int, default=0)
    s.add_argument("--count", type=int, required=True)
    s.add_argument("--max-tokens", type=int, required=True)
    s.add_argument("--time-unit", choices=sorted(PER_SECOND), default=None)
    r = sub.add_parser("report")
    r.add_argument("out")
    r.add_argument("--sim", required=True)
    r.add_argument("--sim-share", default=None)
    r.add_argument("--envoy", action="append", default=[], help="NAME=prefix-load JSON")
    r.add_argument("--meta", action="append", default=[], help="KEY=VALUE for the caption")
    r.add_argument("--replay-sim", default=None, help="simulate binary: replay Envoy's routing")
    r.add_argument("--slice", default=None)
    r.add_argument("--time-scale", default="1")
    args = ap.parse_args()
    return {"slice": slice_trace, "report": report}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
