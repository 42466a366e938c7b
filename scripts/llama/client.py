#!/usr/bin/env python3
"""Stdlib client for real llama.cpp replicas behind Envoy (used by scripts/llama.sh).

Subcommands:
  free-base N                 print a loopback port P such that P..P+N-1 are all free
  wait URL TIMEOUT_S          poll URL (host:port/path) until it answers 200 (exit 1 on timeout)
  wait-healthy ADMIN CLUSTER N TIMEOUT_S
                              poll Envoy admin /clusters until N hosts of CLUSTER are healthy
  chars-per-token REPLICA [WORDS]
                              characters per token of the workload's text (llama /tokenize)
  smoke ENVOY_URL REPLICAS ADMIN STRATEGY
                              4 chat requests sharing a ~1,000-token system prefix through
                              Envoy; checks they land on one replica that reports cached tokens
                              and (affinity) that the filter's prediction matches the engine
  bench ENVOY_URL REPLICAS ADMIN STRATEGY OUT_JSON
                              replay the benchmark workload once, write per-strategy JSON
  report OUT_JSON RUN_JSON... merge per-strategy runs, print a markdown table, write OUT_JSON

REPLICAS is a comma list of host:port (the llama-server replicas, read directly for /metrics).
ADMIN is Envoy's admin host:port: the filter's `prefix_router.delivered.*` counters (predicted
and delivered cached tokens, summed over responses) are read there after every request.

Which replica served a request is known two ways, and both are recorded:
  - the `x-served-by` response header, which Envoy fills with %UPSTREAM_REMOTE_ADDRESS%;
  - the replica whose /metrics prompt-token counters moved (requests are sent one at a time,
    so exactly one replica's counters move per request).
Cache reuse is read from the servers themselves: `usage.prompt_tokens_details.cached_tokens`
in the response (same as `timings.cache_n`) and the `llamacpp:prompt_tokens_cached_total`
metric. Nothing here assumes a result: every number comes from a response.
"""

import http.client
import json
import os
import random
import socket
import statistics
import sys
import time

MODEL = "smollm2-135m"
TIMEOUT_S = 120.0
WORDS = (
    "cache replica prefix token router envoy request latency model server memory block hash ring "
    "load balance stream prompt system user answer question document section policy budget score "
    "engine queue worker cluster health metric counter window batch decode prefill context slot "
    "weight layer vector matrix kernel thread core socket header filter config endpoint timeout "
    "retry fallback bound factor spill hit miss evict store index table entry value key chain seed "
    "river mountain forest garden harbor castle bridge village market library museum theater "
    "orange purple silver golden yellow crimson violet amber green blue bright quiet gentle rapid"
).split()


# ---------------------------------------------------------------- HTTP helpers


def _conn(hostport, timeout=TIMEOUT_S):
    host, port = hostport.rsplit(":", 1)
    c = http.client.HTTPConnection(host, int(port), timeout=timeout)
    c.connect()
    c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return c


def http_get(hostport, path, timeout=5.0):
    c = _conn(hostport, timeout)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def metrics(hostport):
    """llamacpp:* counters and gauges of one replica as a dict (name without prefix)."""
    status, body = http_get(hostport, "/metrics")
    if status != 200:
        raise RuntimeError(f"{hostport}/metrics answered {status}")
    out = {}
    for line in body.decode().splitlines():
        if line.startswith("llamacpp:"):
            name, _, value = line.partition(" ")
            out[name[len("llamacpp:"):]] = float(value)
    return out


def snapshot(replicas):
    return {r: metrics(r) for r in replicas}


def delta(before, after, replicas):
    """Per replica: prompt tokens computed / reused between two snapshots."""
    d = {}
    for r in replicas:
        d[r] = {
            "prompt_tokens": int(after[r]["prompt_tokens_total"] - before[r]["prompt_tokens_total"]),
            "cached_tokens": int(
                after[r]["prompt_tokens_cached_total"] - before[r]["prompt_tokens_cached_total"]
            ),
        }
    return d


def filter_stats(admin):
    """The filter's counters on Envoy's admin: delivered totals and surprises (summed)."""
    status, body = http_get(admin, "/stats?filter=prefix_router")
    if status != 200:
        raise RuntimeError(f"{admin}/stats answered {status}")
    out = {"surprise": 0}
    for line in body.decode().splitlines():
        name, _, value = line.partition(": ")
        if not value.strip().isdigit():
            continue  # histograms
        if name.startswith("wasmcustom.prefix_router.delivered."):
            out[name[len("wasmcustom.prefix_router.delivered."):]] = int(value)
        elif ".surprise." in name and name.startswith("wasmcustom.prefix_router.endpoint."):
            out["surprise"] += int(value)
    return out


def filter_delta(admin, before, timeout_s=3.0):
    """Counters moved by one response: waits until the filter counted it (the usage is read at
    the last chunk, which the client may see just before the filter's bookkeeping ends)."""
    deadline = time.monotonic() + timeout_s
    while True:
        now = filter_stats(admin)
        done = now.get("responses", 0) + now.get("unreported", 0)
        if done > before.get("responses", 0) + before.get("unreported", 0) or time.monotonic() > deadline:
            return {k: now.get(k, 0) - before.get(k, 0) for k in now}
        time.sleep(0.02)


def chat(envoy, system, user, max_tokens=4, rid=""):
    """One streamed chat completion through Envoy.

    Returns status, served_by header, decision header, TTFT (first content chunk) and total
    time in ms, the usage and timings of the final chunk, and the generated text.
    """
    body = json.dumps(
        {
            "model": MODEL,
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": user},
            ],
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    ).encode()
    t0 = time.perf_counter()
    c = _conn(envoy)
    try:
        c.request(
            "POST",
            "/v1/chat/completions",
            body=body,
            headers={"content-type": "application/json", "x-bench-id": rid},
        )
        r = c.getresponse()
        res = {
            "id": rid,
            "status": r.status,
            "served_by": r.getheader("x-served-by", ""),
            "decision": r.getheader("x-prefix-router-decision", ""),
            "ttft_ms": None,
            "usage": None,
            "timings": None,
            "text": "",
        }
        if r.status != 200:
            res["error"] = r.read()[:300].decode(errors="replace")
            res["total_ms"] = (time.perf_counter() - t0) * 1000
            return res
        first_event_ms = None
        for _ in range(100000):  # bounded: one iteration per SSE line
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            now_ms = (time.perf_counter() - t0) * 1000
            if first_event_ms is None:
                first_event_ms = now_ms
            ev = json.loads(data)
            for ch in ev.get("choices") or []:
                piece = (ch.get("delta") or {}).get("content")
                if piece:
                    if res["ttft_ms"] is None:
                        res["ttft_ms"] = now_ms
                    res["text"] += piece
            if ev.get("usage"):
                res["usage"] = ev["usage"]
            if ev.get("timings"):
                res["timings"] = ev["timings"]
        if res["ttft_ms"] is None:
            res["ttft_ms"] = first_event_ms
        res["total_ms"] = (time.perf_counter() - t0) * 1000
        return res
    finally:
        c.close()


def cached_of(res):
    u = res.get("usage") or {}
    return int(((u.get("prompt_tokens_details") or {}).get("cached_tokens")) or 0)


def prompt_of(res):
    return int((res.get("usage") or {}).get("prompt_tokens") or 0)


# ---------------------------------------------------------------- workload text


def document(seed, n_words):
    """Deterministic pseudo-English system prompt; different seeds differ from the first word."""
    rng = random.Random(seed)
    head = f"Document {seed}: reference manual number {rng.randrange(10**9)} for assistant {seed}."
    sentences, count = [head], 0
    while count < n_words:
        k = rng.randint(8, 16)
        words = [rng.choice(WORDS) for _ in range(k)]
        sentences.append(" ".join(words).capitalize() + ".")
        count += k
    return " ".join(sentences)


# ~1,000 tokens for SmolLM2's tokenizer (measured with /tokenize: 740 words -> 865 tokens, so
# 840 words -> ~985 tokens, plus ~25 tokens of chat template)
PREFIX_WORDS = 840
QUESTIONS = [
    "What is the first word of the document?",
    "Summarize the document in five words.",
    "Name one color mentioned above.",
    "How many sections does it have?",
]


def chars_per_token(replica, words=None):
    """Characters per model token of the workload's text, from llama-server's /tokenize. The
    filter's `affinity` predicts cached tokens as characters / chars_per_token; an operator sets
    it for the served model, the scripts measure it. Clamped to the config's range 1..16."""
    n_words = {None: PREFIX_WORDS, "": PREFIX_WORDS, "bench": BENCH_PREFIX_WORDS}.get(words)
    text = document("cpt", n_words if n_words else int(words))
    c = _conn(replica, 10.0)
    try:
        c.request("POST", "/tokenize", body=json.dumps({"content": text}).encode(),
                  headers={"content-type": "application/json"})
        r = c.getresponse()
        body = r.read()
        if r.status != 200:
            raise RuntimeError(f"{replica}/tokenize answered {r.status}")
    finally:
        c.close()
    n = len(json.loads(body).get("tokens") or [])
    if n == 0:
        raise RuntimeError("/tokenize returned no tokens")
    return round(min(16.0, max(1.0, len(text) / n)), 3)


def cmd_chars_per_token(replica, words=None):
    print(f"{chars_per_token(replica, words):.3f}")
    return 0


# ---------------------------------------------------------------- smoke

# Predicted vs delivered on llama.cpp. llama-server reuses the longest common token prefix
# (single-token granularity, `timings.cache_n` = `cached_tokens`): it includes the chat
# template's tokens around the system message and stops inside the user message. The filter
# predicts from the message text it hashed, in 256-character blocks: the known blocks plus half
# a block where the prompt diverges, converted with chars_per_token. On the first hit of a
# prefix the index knows only its "ladder" blocks (a lower bound, docs/delivered.md); once the
# engine confirmed the depth, the prediction is honest when it is within one block
# (256 / chars_per_token tokens: the divergence point lies anywhere in the last block) plus
# TEMPLATE_TOKENS (template tokens the router never sees: "<|im_start|>system\n",
# "<|im_end|>\n<|im_start|>user\n") of what was served.
TEMPLATE_TOKENS = 16
BLOCK_CHARS = 256


def agreement_tolerance(chars_per_token):
    return BLOCK_CHARS / chars_per_token + TEMPLATE_TOKENS


def cmd_smoke(envoy, replicas_csv, admin, strategy):
    replicas = replicas_csv.split(",")
    system = document("smoke", PREFIX_WORDS)
    passed, failed = 0, 0

    def check(ok, what):
        nonlocal passed, failed
        if ok:
            passed += 1
        else:
            failed += 1
        print(f"  [{'PASS' if ok else 'FAIL'}] {what}", flush=True)

    before = snapshot(replicas)
    results, owners, filt = [], [], []
    for i, q in enumerate(QUESTIONS):
        pre = snapshot(replicas)
        fpre = filter_stats(admin)
        res = chat(envoy, system, q, max_tokens=4, rid=f"smoke-{i}")
        fd = filter_delta(admin, fpre)
        post = snapshot(replicas)
        d = delta(pre, post, replicas)
        moved = [r for r in replicas if d[r]["prompt_tokens"] + d[r]["cached_tokens"] > 0]
        owners.append(moved)
        results.append(res)
        filt.append(fd)
        print(
            f"  req {i + 1}: status={res['status']} served_by={res['served_by'] or '-'} "
            f"metrics_moved={','.join(moved) or '-'} decision={res['decision'] or '-'} "
            f"prompt_tokens={prompt_of(res)} cached_tokens={cached_of(res)} "
            f"filter: predicted={fd.get('predicted_tokens')} delivered={fd.get('cached_tokens')} "
            f"ttft_ms={res['ttft_ms'] if res['ttft_ms'] is None else round(res['ttft_ms'], 1)}",
            flush=True,
        )
    after = snapshot(replicas)

    check(all(r["status"] == 200 and r["usage"] for r in results), "4/4 requests answered 200 with usage")
    check(prompt_of(results[0]) >= 900, f"shared prompt is ~1,000 tokens (got {prompt_of(results[0])})")
    served = {r["served_by"] for r in results}
    check(
        len(served) == 1 and next(iter(served)) in replicas,
        f"x-served-by names one replica for all 4 requests ({sorted(served)})",
    )
    moved_sets = {tuple(m) for m in owners}
    check(
        len(moved_sets) == 1 and len(owners[0]) == 1,
        f"replica /metrics: exactly one replica's prompt counters moved, the same one each time "
        f"({[list(m) for m in owners]})",
    )
    owner = owners[0][0] if owners and len(owners[0]) == 1 else None
    check(owner is not None and owner in served, "the replica whose metrics moved is the one Envoy named")
    cached = [cached_of(r) for r in results]
    check(cached[0] < 100, f"request 1 is a cold prefill (cached_tokens {cached[0]} < 100)")
    check(all(c >= 900 for c in cached[1:]), f"requests 2..4 report cached_tokens >= 900 ({cached[1:]})")
    d = delta(before, after, replicas)
    if owner:
        check(
            d[owner]["cached_tokens"] >= 3 * 900,
            f"owner's llamacpp:prompt_tokens_cached_total delta {d[owner]['cached_tokens']} >= 2700",
        )
        others = [r for r in replicas if r != owner]
        check(
            all(d[r]["prompt_tokens"] == 0 and d[r]["cached_tokens"] == 0 for r in others),
            f"other replicas did no prompt work ({ {r: d[r] for r in others} })",
        )
    else:
        check(False, "owner's prompt_tokens_cached_total delta (no single owner)")
        check(False, "other replicas did no prompt work (no single owner)")
    warm = [r["ttft_ms"] for r in results[1:] if r["ttft_ms"] is not None]
    if results[0]["ttft_ms"] and warm:
        check(
            max(warm) < results[0]["ttft_ms"] / 3,
            f"warm TTFT max {max(warm):.0f} ms < cold TTFT {results[0]['ttft_ms']:.0f} ms / 3",
        )
    else:
        check(False, "TTFT measured for cold and warm requests")
    # The filter read the engine's usage: its delivered counters equal what the client saw.
    check(
        [f.get("responses") for f in filt] == [1] * len(filt)
        and [f.get("cached_tokens") for f in filt] == cached
        and [f.get("prompt_tokens") for f in filt] == [prompt_of(r) for r in results],
        f"filter counted each response's usage: delivered {[f.get('cached_tokens') for f in filt]}, "
        f"prompt {[f.get('prompt_tokens') for f in filt]}",
    )
    if strategy == "affinity":
        cpt = chars_per_token(replicas[0])
        tol = agreement_tolerance(cpt)
        pred = [f.get("predicted_tokens", 0) for f in filt]
        check(pred[0] == 0, f"request 1 predicted cold (predicted {pred[0]}, delivered {cached[0]})")
        check(
            0 < pred[1] <= cached[1] + tol,
            f"request 2 (first hit): 0 < predicted {pred[1]} <= delivered {cached[1]} + {tol:.0f} "
            "(the index's ladder blocks prove a lower bound of the shared prefix)",
        )
        diffs = [p - c for p, c in zip(pred[2:], cached[2:])]
        check(
            all(abs(x) <= tol for x in diffs),
            f"requests 3..4 (depth confirmed by the engine): |predicted - delivered| <= {tol:.0f} "
            f"tokens (1 block at {cpt:.2f} chars/token + {TEMPLATE_TOKENS} template): "
            f"predicted {pred[2:]}, delivered {cached[2:]}",
        )
        check(
            sum(f.get("surprise", 0) for f in filt) == 0,
            "no surprise (expected hit got miss / expected miss got hit) counted",
        )
    print(f"llama smoke: {passed} passed, {failed} failed", flush=True)
    return 0 if failed == 0 else 1


# ---------------------------------------------------------------- bench


# The bench: GROUPS system prompts of ~400 tokens (340 words, > 2,300 characters so that the
# `prefix` strategy's default 2,048-character key is the system prompt alone), ROUNDS rounds;
# every round sends each group once, in a fresh seeded random order (tenants at the same rate,
# interleaved). Each replica keeps 3 prompts (scripts/llama.sh: -cram 34, measured by the probe
# in scripts/llama/capacity.py before the run), so the 9 groups fit in the fleet (9) only if
# each group stays on one replica, 3 per replica; round robin sends every group everywhere.
# 12 rounds: the ratio to round robin depends on the interleaving; over seeds its spread
# narrows with rounds (`capacity.py replay`, docs/llama.md).
BENCH_PREFIX_WORDS = 340
GROUPS = 9
ROUNDS = 12


def workload(groups=GROUPS, rounds=ROUNDS, seed=7):
    """Shared-prefix groups, interleaved: `rounds` seeded permutations of the groups."""
    systems = [document(f"group-{g}", BENCH_PREFIX_WORDS) for g in range(groups)]
    rng = random.Random(seed)
    items = []
    for k in range(rounds):
        order = list(range(groups))
        rng.shuffle(order)
        for g in order:
            items.append({"kind": "shared", "group": g, "system": systems[g],
                          "user": QUESTIONS[(k + g) % len(QUESTIONS)]})
    return items


def pct(values, p):
    v = sorted(values)
    if not v:
        return None
    k = (len(v) - 1) * p / 100.0
    lo, hi = int(k), min(int(k) + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def cmd_bench(envoy, replicas_csv, admin, strategy, out):
    replicas = replicas_csv.split(",")
    items = workload()
    t0 = time.perf_counter()
    before = snapshot(replicas)
    fbefore = filter_stats(admin)
    rows = []
    for i, it in enumerate(items):
        pre = snapshot(replicas)
        fpre = filter_stats(admin)
        res = chat(envoy, it["system"], it["user"], max_tokens=4, rid=f"{strategy}-{i}")
        fd = filter_delta(admin, fpre)
        post = snapshot(replicas)
        d = delta(pre, post, replicas)
        moved = [r for r in replicas if d[r]["prompt_tokens"] + d[r]["cached_tokens"] > 0]
        row = {
            "i": i,
            "kind": it["kind"],
            "group": it["group"],
            "status": res["status"],
            "served_by": res["served_by"],
            "metrics_replica": moved[0] if len(moved) == 1 else None,
            "decision": res["decision"],
            "prompt_tokens": prompt_of(res),
            "cached_tokens": cached_of(res),
            "filter_predicted_tokens": fd.get("predicted_tokens"),
            "filter_delivered_tokens": fd.get("cached_tokens"),
            "ttft_ms": res["ttft_ms"],
            "total_ms": res["total_ms"],
        }
        rows.append(row)
        print(
            f"  {strategy:>11} #{i:02d} {it['kind']:6} g={it['group'] if it['group'] is not None else '-'} "
            f"-> {row['served_by'] or '?'} {row['decision'] or '-':13} prompt={row['prompt_tokens']:5d} "
            f"cached={row['cached_tokens']:5d} predicted={row['filter_predicted_tokens']} "
            f"ttft={row['ttft_ms'] or 0:7.0f} ms",
            flush=True,
        )
    wall_s = time.perf_counter() - t0
    after = snapshot(replicas)
    d = delta(before, after, replicas)
    fafter = filter_stats(admin)
    fd = {k: fafter.get(k, 0) - fbefore.get(k, 0) for k in fafter}
    ok = [r for r in rows if r["status"] == 200 and r["ttft_ms"] is not None]
    ttft = [r["ttft_ms"] for r in ok]
    ttft_shared = [r["ttft_ms"] for r in ok if r["kind"] == "shared"]
    usage_prompt = sum(r["prompt_tokens"] for r in ok)
    usage_cached = sum(r["cached_tokens"] for r in ok)
    m_computed = sum(d[r]["prompt_tokens"] for r in replicas)
    m_cached = sum(d[r]["cached_tokens"] for r in replicas)
    per_replica = {r: sum(1 for x in rows if x["served_by"] == r) for r in replicas}
    groups_per_replica = {r: len({x["group"] for x in rows if x["served_by"] == r}) for r in replicas}
    import capacity  # noqa: E402 (capacity.py imports this module)

    predicting = strategy == "affinity"
    hits = [capacity.is_hit(r["prompt_tokens"], r["cached_tokens"]) for r in rows]
    mismatches = sum(1 for x in rows if x["metrics_replica"] and x["metrics_replica"] != x["served_by"])
    summary = {
        "strategy": strategy,
        "requests": len(rows),
        "ok": len(ok),
        "errors": len(rows) - len(ok),
        "usage_prompt_tokens": usage_prompt,
        "usage_cached_tokens": usage_cached,
        "usage_cached_share": usage_cached / usage_prompt if usage_prompt else None,
        "metrics_prompt_tokens_computed": m_computed,
        "metrics_prompt_tokens_cached": m_cached,
        "metrics_cached_share": m_cached / (m_computed + m_cached) if (m_computed + m_cached) else None,
        "ttft_mean_ms": statistics.fmean(ttft) if ttft else None,
        "ttft_p50_ms": pct(ttft, 50),
        "ttft_p90_ms": pct(ttft, 90),
        "ttft_shared_p50_ms": pct(ttft_shared, 50),
        "ttft_shared_p90_ms": pct(ttft_shared, 90),
        "warm_requests": sum(1 for r in ok if r["prompt_tokens"] and r["cached_tokens"] >= 0.9 * r["prompt_tokens"]),
        "requests_per_replica": per_replica,
        "groups_per_replica": groups_per_replica,
        "filter_responses": fd.get("responses", 0),
        "filter_unreported": fd.get("unreported", 0),
        "filter_prompt_tokens": fd.get("prompt_tokens", 0),
        "filter_delivered_tokens": fd.get("cached_tokens", 0),
        "filter_delivered_share": fd.get("cached_tokens", 0) / fd["prompt_tokens"] if fd.get("prompt_tokens") else None,
        "filter_predicted_tokens": fd.get("predicted_tokens", 0) if predicting else None,
        "filter_predicted_over_delivered": (
            fd.get("predicted_tokens", 0) / fd["cached_tokens"] if predicting and fd.get("cached_tokens") else None
        ),
        "filter_surprises": fd.get("surprise", 0),
        "delivered_hits": sum(hits),
        "served_by_vs_metrics_mismatches": mismatches,
        "wall_s": wall_s,
        "metrics_per_replica": d,
        "rows": rows,
    }
    with open(out, "w") as f:
        json.dump(summary, f, indent=2)
    return 0 if summary["errors"] == 0 else 1


REPORT_FIELDS = [
    ("cached share of prompt tokens (usage.cached_tokens)", "usage_cached_share", "pct"),
    ("cached share of prompt tokens (/metrics)", "metrics_cached_share", "pct"),
    ("filter: delivered cached share (prefix_router.delivered.*)", "filter_delivered_share", "pct"),
    ("filter: predicted / delivered cached tokens", "filter_predicted_over_delivered", "x"),
    ("filter: surprises", "filter_surprises", "n"),
    ("hits delivered (>= 50 % of the prompt cached)", "delivered_hits", "n"),
    ("hits predicted by the measured capacity (LRU replay of the routing)", "model_hits", "n"),
    ("requests where that prediction and the engine disagree", "model_disagreements", "n"),
    ("prompt tokens computed (/metrics)", "metrics_prompt_tokens_computed", "n"),
    ("requests with >= 90 % of the prompt cached", "warm_requests", "n"),
    ("TTFT mean", "ttft_mean_ms", "ms"),
    ("TTFT p50", "ttft_p50_ms", "ms"),
    ("TTFT p90", "ttft_p90_ms", "ms"),
    ("total time (sequential)", "wall_s", "s"),
    ("errors", "errors", "n"),
]
# Ratios against round robin are shown for these (higher is better for the shares, lower for
# the rest; the table just divides).
RATIO_KEYS = {"usage_cached_share", "metrics_cached_share", "metrics_prompt_tokens_computed",
              "ttft_mean_ms", "ttft_p50_ms", "wall_s", "delivered_hits"}


def add_capacity_model(run, cap):
    """Predicted vs delivered for any strategy: replay the run's actual routing (served_by,
    group) through an LRU of `cap` prompts per replica (the probe's measured capacity) and
    compare, request by request, with what the engine delivered."""
    import capacity  # noqa: E402 (capacity.py imports this module)

    rows = run.get("rows") or []
    model = capacity.lru_hits([(r["served_by"], r["group"]) for r in rows], cap)
    got = [capacity.is_hit(r["prompt_tokens"], r["cached_tokens"]) for r in rows]
    run["delivered_hits"] = sum(got)
    run["model_capacity"] = cap
    run["model_hits"] = sum(model)
    run["model_disagreements"] = sum(1 for m, g in zip(model, got) if m != g)


def _fmt(v, kind):
    if v is None:
        return "-"
    if kind == "pct":
        return f"{100 * v:.1f} %"
    if kind == "ms":
        return f"{v:.0f} ms"
    if kind == "s":
        return f"{v:.1f} s"
    if kind == "x":
        return f"{v:.2f}"
    return str(v)


def cmd_report(out, run_files):
    runs = []
    for p in run_files:
        with open(p) as f:
            runs.append(json.load(f))
    by = {r["strategy"]: r for r in runs}
    names = [r["strategy"] for r in runs]
    probe = None
    if os.environ.get("LLAMA_BENCH_PROBE") and os.path.exists(os.environ["LLAMA_BENCH_PROBE"]):
        with open(os.environ["LLAMA_BENCH_PROBE"]) as f:
            probe = json.load(f)
    cap = int(probe["capacity"]) if probe else int(os.environ.get("LLAMA_BENCH_CAPACITY", "3"))
    for r in runs:
        add_capacity_model(r, cap)
    base = by.get("round_robin")
    others = [n for n in names if n != "round_robin"] if base else []
    head = "| metric | " + " | ".join(names) + "".join(f" | {n} / round_robin" for n in others) + " |"
    lines = [head, "|---|" + "---|" * (len(names) + len(others))]
    ratios = {n: {} for n in others}
    for label, key, kind in REPORT_FIELDS:
        row = f"| {label} | " + " | ".join(_fmt(by[n].get(key), kind) for n in names) + " |"
        for n in others:
            a, b = by[n].get(key), base.get(key)
            if key in RATIO_KEYS and isinstance(a, (int, float)) and isinstance(b, (int, float)) and b:
                ratios[n][key] = a / b
                row += f" {a / b:.2f}x |"
            else:
                row += " - |"
        lines.append(row)
    for label, key in (("requests per replica", "requests_per_replica"), ("groups per replica", "groups_per_replica")):
        cells = [" / ".join(str(v) for v in (by[n].get(key) or {}).values()) for n in names]
        lines.append(f"| {label} | " + " | ".join(cells) + " |" + " - |" * len(others))
    table = "\n".join(lines)
    print(table)
    workload = (
        f"{GROUPS} prefix groups (system prompts of {BENCH_PREFIX_WORDS} words, ~400 tokens) x "
        f"{ROUNDS} rounds, each round every group once in a seeded random order (interleaved), "
        "sent one at a time, streamed, max_tokens 4"
    )
    measured = (f"measured before the run: each replica keeps {probe['capacity']} prompts, "
                f"entries of {probe['entry_mib_mean']:.2f} MiB" if probe and probe.get("entry_mib_mean")
                else f"sized for {cap} prompts per replica, not measured")
    replicas_desc = (f"3 x llama-server (SmolLM2-135M-Instruct Q4_1, -c 2048 -t 1 -np 1 -cram "
                     f"{os.environ.get('LLAMA_BENCH_CRAM', '?')}; {measured})")
    markdown = (
        f"{replicas_desc}, fresh and cold for each strategy, behind Envoy 1.40 with the filter. "
        f"Workload: {workload}. Cached shares are what the servers report; TTFT is measured at "
        "the client.\n\n" + table
    )
    with open(out, "w") as f:
        json.dump(
            {
                "workload": workload,
                "replicas": replicas_desc,
                "probe": probe,
                "runs": {n: {k: v for k, v in by[n].items() if k != "rows"} for n in names},
                "rows": {n: by[n]["rows"] for n in names},
                "ratios_over_round_robin": ratios,
                "table_markdown": table,
                "markdown": markdown,
            },
            f,
            indent=2,
        )
    return 0


# ---------------------------------------------------------------- misc


def cmd_free_base(n):
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20000, 40000)
        socks = []
        try:
            for p in range(base, base + n):
                s = socket.socket()
                s.bind(("127.0.0.1", p))
                socks.append(s)
            print(base)
            return 0
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    return 1


def cmd_wait(url, timeout_s):
    hostport, _, path = url.partition("/")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            status, _ = http_get(hostport, "/" + path, timeout=1.0)
            if status == 200:
                return 0
        except OSError:
            pass
        time.sleep(0.1)
    return 1


def cmd_wait_healthy(admin, cluster, n, timeout_s):
    """Poll Envoy admin /clusters until `n` hosts of `cluster` report health_flags::healthy."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            status, body = http_get(admin, "/clusters", timeout=1.0)
            if status == 200:
                healthy = [
                    l for l in body.decode().splitlines()
                    if l.startswith(cluster + "::") and l.endswith("::health_flags::healthy")
                ]
                if len(healthy) >= n:
                    return 0
        except OSError:
            pass
        time.sleep(0.2)
    return 1


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    cmd, args = argv[1], argv[2:]
    if cmd == "free-base":
        return cmd_free_base(int(args[0]))
    if cmd == "wait":
        return cmd_wait(args[0], float(args[1]))
    if cmd == "wait-healthy":
        return cmd_wait_healthy(args[0], args[1], int(args[2]), float(args[3]))
    if cmd == "chars-per-token":
        return cmd_chars_per_token(args[0], args[1] if len(args) > 1 else None)
    if cmd == "smoke":
        return cmd_smoke(args[0], args[1], args[2], args[3])
    if cmd == "bench":
        return cmd_bench(args[0], args[1], args[2], args[3], args[4])
    if cmd == "report":
        return cmd_report(args[0], args[1:])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
