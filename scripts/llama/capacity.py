#!/usr/bin/env python3
"""How many prompts one llama-server really keeps, and what that predicts (scripts/llama.sh).

Subcommands:
  probe REPLICA KMAX LOG CRAM_MIB OUT_JSON [--expect C]
        measure the replica's capacity in bench-sized prompts (below); with --expect, exit 3
        (and say why) unless the measured capacity is C
  replay [--capacity C] [--groups G] [--rounds R] [--seeds N]
        the LRU model of the bench's workload: round robin against a router that keeps each
        group on one replica, for the bench's seed and over N other seeds

The cache being measured (llama.cpp `tools/server/server-context.cpp` get_available_slot,
`server-task.cpp` server_prompt_cache): with `-np 1` a replica has one slot. A request whose
prompt shares little with the slot's (f_sim <= 0.1) first SAVES the slot's prompt state to the
host-RAM prompt cache (`prompt_save` -> `alloc`: the oldest entries are evicted until the new
one fits in `-cram` MiB), THEN loads the cached entry that best matches the new prompt
(`load`: needs f_keep = common prefix / entry length >= 0.25, the entry leaves the cache and
becomes the slot's prompt). An entry is the slot's whole token sequence (prompt + generated
tokens) at 22.5 KiB per token for SmolLM2-135M. So with m = floor(CRAM / entry size) entries
in RAM, the save evicts the oldest before the load looks: the replica keeps the slot's prompt
plus m - 1 retrievable ones, an LRU of C = m prompts (not m + 1).

The probe: for k = 1..KMAX, send k fresh bench-sized prompts (never seen before, so they
push everything older further down the LRU), then send the first of them again with another
question, as the bench does. The re-send is a hit (>= half the prompt from cache) iff the
replica keeps k prompts. The capacity is the largest k whose re-send hit (and every smaller
k's). The replica runs with `-lv 4`, whose trace lines give the saved entry sizes, the cache
state and the f_keep of each candidate: the probe reads them from LOG to say why.
"""

import itertools
import json
import math
import re
import statistics
import sys

import client

HIT_SHARE = 0.5  # a request is a hit when at least this share of its prompt came from cache

SAVE_RE = re.compile(r"saving prompt with length (\d+), total state size = ([0-9.]+) MiB")
STATE_RE = re.compile(r"cache state: (\d+) prompts, ([0-9.]+) MiB \(limits: ([0-9.]+) MiB, (\d+) tokens")
EVICT_RE = re.compile(r"(making room for prompt cache entry|cache size limit reached|cache token limit)")
FKEEP_RE = re.compile(r"found better prompt with f_keep = ([0-9.]+)")


def is_hit(prompt_tokens, cached_tokens):
    return bool(prompt_tokens) and cached_tokens >= HIT_SHARE * prompt_tokens


def lru_hits(sequence, capacity):
    """Replay (replica, group) pairs through one LRU of `capacity` prompts per replica.

    Returns one bool per request: was its group among the replica's `capacity` most recently
    served groups. That is llama-server's cache as described above (slot + capacity - 1 saved
    prompts, same-group requests stay in the slot). O(len * capacity)."""
    caches, out = {}, []
    for replica, group in sequence:
        c = caches.setdefault(replica, [])
        hit = group in c
        if hit:
            c.remove(group)
        c.append(group)
        if len(c) > capacity:
            c.pop(0)
        out.append(hit)
    return out


def parse_log(path):
    """Entry sizes, cache states, evictions and f_keep values from a `-lv 4` replica log."""
    saves, states, fkeep, evictions = [], [], [], 0
    try:
        with open(path, errors="replace") as f:
            for line in f:
                m = SAVE_RE.search(line)
                if m:
                    saves.append((int(m.group(1)), float(m.group(2))))
                m = STATE_RE.search(line)
                if m:
                    states.append((int(m.group(1)), float(m.group(2)), float(m.group(3)), int(m.group(4))))
                m = FKEEP_RE.search(line)
                if m:
                    fkeep.append(float(m.group(1)))
                if EVICT_RE.search(line):
                    evictions += 1
    except OSError:
        pass
    return {"saves": saves, "states": states, "f_keep_loaded": fkeep, "evictions": evictions}


def cmd_probe(replica, kmax, log_path, cram_mib, out, expect=None):
    trials = []
    for k in range(1, kmax + 1):
        systems = [client.document(f"probe-{k}-{j}", client.BENCH_PREFIX_WORDS) for j in range(k)]
        for j, s in enumerate(systems):
            r = client.chat(replica, s, client.QUESTIONS[j % len(client.QUESTIONS)], rid=f"probe-{k}-{j}")
            if r["status"] != 200:
                print(f"probe: request answered {r['status']}: {r.get('error', '')}", file=sys.stderr)
                return 1
        r = client.chat(replica, systems[0], client.QUESTIONS[1], rid=f"probe-{k}-again")
        if r["status"] != 200:
            print(f"probe: request answered {r['status']}: {r.get('error', '')}", file=sys.stderr)
            return 1
        p, c = client.prompt_of(r), client.cached_of(r)
        trials.append({"k": k, "prompt_tokens": p, "cached_tokens": c, "hit": is_hit(p, c),
                       "ttft_ms": r["ttft_ms"]})
        print(f"  probe k={k}: {k} fresh prompts, then the first again: prompt {p}, cached {c} "
              f"-> {'HIT' if is_hit(p, c) else 'miss'}", flush=True)
    capacity = 0
    for t in trials:
        if not t["hit"]:
            break
        capacity = t["k"]
    lru_like = all(not t["hit"] for t in trials[capacity:])
    log = parse_log(log_path)
    sizes = [mib for _, mib in log["saves"]]
    lengths = [n for n, _ in log["saves"]]
    entry_mib = statistics.fmean(sizes) if sizes else None
    model = math.floor(cram_mib / max(sizes)) if sizes else None
    summary = {
        "cram_mib": cram_mib,
        "capacity": capacity,
        "lru_like": lru_like,
        "entry_mib_mean": entry_mib,
        "entry_mib_max": max(sizes) if sizes else None,
        "entry_tokens_mean": statistics.fmean(lengths) if lengths else None,
        "kib_per_token": (1024 * statistics.fmean(m / n for n, m in log["saves"]) if log["saves"] else None),
        "model_capacity": model,
        "max_prompts_in_ram": max((s[0] for s in log["states"]), default=None),
        "evictions": log["evictions"],
        "f_keep_loaded_min": min(log["f_keep_loaded"], default=None),
        "trials": trials,
    }
    with open(out, "w") as f:
        json.dump(summary, f, indent=2)
    why = (f"entries of {entry_mib:.2f} MiB ({summary['entry_tokens_mean']:.0f} tokens incl. generated, "
           f"{summary['kib_per_token']:.1f} KiB/token), at most {summary['max_prompts_in_ram']} in "
           f"{cram_mib} MiB of RAM; the slot's prompt is saved (evicting the oldest) before the "
           f"wanted one is loaded, so the model says floor({cram_mib} / {max(sizes):.2f}) = {model}"
           if sizes else "no 'saving prompt' trace lines in the log (was -lv 4 set?)")
    print(f"llama probe: -cram {cram_mib}: the replica keeps {capacity} prompts "
          f"(measured; {why})", flush=True)
    if not lru_like:
        print("llama probe: WARNING: a deeper re-send hit after a shallower one missed: not an LRU",
              flush=True)
    if expect is not None and (capacity != expect or not lru_like):
        print(f"llama probe: FAILED: the bench's sizing needs each replica to keep exactly {expect} "
              f"prompts, -cram {cram_mib} keeps {capacity}. Set LLAMA_BENCH_CRAM so that "
              f"floor(CRAM / entry MiB) = {expect} (entries measured above), or "
              f"LLAMA_BENCH_CAPACITY to what the workload is sized for.", flush=True)
        return 3
    return 0


def bench_order(groups, rounds, seed):
    """Group of each request of the bench's workload (client.workload) for another seed."""
    return [it["group"] for it in client.workload(groups, rounds, seed)]


def replay_ratio(order, capacity, replicas=3):
    """Hits of round robin and of a router that keeps each group on one replica, placing new
    groups in turn over the replicas (affinity's spread_cold on a sequential workload)."""
    rr = sum(lru_hits([(i % replicas, g) for i, g in enumerate(order)], capacity))
    placed = {}
    for g in order:
        placed.setdefault(g, len(placed) % replicas)
    one = sum(lru_hits([(placed[g], g) for g in order], capacity))
    return rr, one


def cmd_replay(capacity, groups, rounds, seeds):
    order = bench_order(groups, rounds, 7)
    rr, one = replay_ratio(order, capacity)
    n = len(order)
    print(f"bench order (seed 7, {groups} groups x {rounds} rounds, capacity {capacity}): "
          f"round robin {rr}/{n} hits, one replica per group (placed in turn) {one}/{n}: "
          f"{one / rr if rr else float('inf'):.2f}x")
    if groups <= 10:  # 3^groups placements
        best = max(sum(lru_hits([(p[g], g) for g in order], capacity))
                   for p in itertools.product(range(3), repeat=groups))
        print(f"  best placement of the groups over 3 replicas: {best}/{n} hits "
              f"({best / rr if rr else 0:.2f}x)")
    ratios = []
    for s in range(seeds):
        a, b = replay_ratio(bench_order(groups, rounds, 1000 + s), capacity)
        ratios.append(b / a if a else float("inf"))
    q = sorted(ratios)
    print(f"  {seeds} other seeds: hit ratio median {statistics.median(q):.2f}, "
          f"p10 {q[len(q) // 10]:.2f}, p90 {q[9 * len(q) // 10]:.2f}, "
          f">= 3x in {100 * sum(r >= 3 for r in q) / len(q):.0f} %")
    return 0


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    cmd, args = argv[1], argv[2:]
    if cmd == "probe" and len(args) >= 5:
        expect = None
        if len(args) >= 7 and args[5] == "--expect":
            expect = int(args[6])
        return cmd_probe(args[0], int(args[1]), args[2], int(args[3]), args[4], expect)
    if cmd == "replay":
        opts = {"--capacity": 3, "--groups": client.GROUPS, "--rounds": client.ROUNDS, "--seeds": 500}
        for k, v in zip(args[::2], args[1::2]):
            if k not in opts:
                print(f"unknown option {k}", file=sys.stderr)
                return 2
            opts[k] = int(v)
        return cmd_replay(opts["--capacity"], opts["--groups"], opts["--rounds"], opts["--seeds"])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
