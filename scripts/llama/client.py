#!/usr/bin/env python3
"""Stdlib client for real llama.cpp replicas behind Envoy (used by scripts/llama.sh).

Subcommands:
  free-base N                 print a loopback port P such that P..P+N-1 are all free
  wait URL TIMEOUT_S          poll URL (host:port/path) until it answers 200 (exit 1 on timeout)
  wait-healthy ADMIN CLUSTER N TIMEOUT_S
                              poll Envoy admin /clusters until N hosts of CLUSTER are healthy
  smoke ENVOY_URL REPLICAS    4 chat requests sharing a ~1,000-token system prefix through
                              Envoy; checks they land on one replica that reports cached tokens
  bench ENVOY_URL REPLICAS STRATEGY OUT_JSON
                              replay the benchmark workload once, write per-strategy JSON
  report OUT_JSON RUN_JSON... merge per-strategy runs, print a markdown table, write OUT_JSON

REPLICAS is a comma list of host:port (the llama-server replicas, read directly for /metrics).

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


# ---------------------------------------------------------------- smoke


def cmd_smoke(envoy, replicas_csv):
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
    results, owners = [], []
    for i, q in enumerate(QUESTIONS):
        pre = snapshot(replicas)
        res = chat(envoy, system, q, max_tokens=4, rid=f"smoke-{i}")
        post = snapshot(replicas)
        d = delta(pre, post, replicas)
        moved = [r for r in replicas if d[r]["prompt_tokens"] + d[r]["cached_tokens"] > 0]
        owners.append(moved)
        results.append(res)
        print(
            f"  req {i + 1}: status={res['status']} served_by={res['served_by'] or '-'} "
            f"metrics_moved={','.join(moved) or '-'} decision={res['decision'] or '-'} "
            f"prompt_tokens={prompt_of(res)} cached_tokens={cached_of(res)} "
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
    print(f"llama smoke: {passed} passed, {failed} failed", flush=True)
    return 0 if failed == 0 else 1


# ---------------------------------------------------------------- bench


def workload(groups=4, per_group=4, unique=4, seed=7):
    """Shared-prefix groups plus unique prompts, in one fixed shuffled order."""
    items = []
    for g in range(groups):
        system = document(f"group-{g}", PREFIX_WORDS)
        for k in range(per_group):
            items.append(
                {"kind": "shared", "group": g, "system": system, "user": QUESTIONS[k % len(QUESTIONS)]}
            )
    for u in range(unique):
        items.append(
            {"kind": "unique", "group": None, "system": document(f"unique-{u}", 120), "user": QUESTIONS[u % 4]}
        )
    rng = random.Random(seed)
    rng.shuffle(items)
    return items


def pct(values, p):
    v = sorted(values)
    if not v:
        return None
    k = (len(v) - 1) * p / 100.0
    lo, hi = int(k), min(int(k) + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def cmd_bench(envoy, replicas_csv, strategy, out):
    replicas = replicas_csv.split(",")
    items = workload()
    t0 = time.perf_counter()
    before = snapshot(replicas)
    rows = []
    for i, it in enumerate(items):
        pre = snapshot(replicas)
        res = chat(envoy, it["system"], it["user"], max_tokens=4, rid=f"{strategy}-{i}")
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
            "ttft_ms": res["ttft_ms"],
            "total_ms": res["total_ms"],
        }
        rows.append(row)
        print(
            f"  {strategy:>11} #{i:02d} {it['kind']:6} g={it['group'] if it['group'] is not None else '-'} "
            f"-> {row['served_by'] or '?'} {row['decision'] or '-':13} prompt={row['prompt_tokens']:5d} "
            f"cached={row['cached_tokens']:5d} ttft={row['ttft_ms'] or 0:7.0f} ms",
            flush=True,
        )
    wall_s = time.perf_counter() - t0
    after = snapshot(replicas)
    d = delta(before, after, replicas)
    ok = [r for r in rows if r["status"] == 200 and r["ttft_ms"] is not None]
    ttft = [r["ttft_ms"] for r in ok]
    ttft_shared = [r["ttft_ms"] for r in ok if r["kind"] == "shared"]
    usage_prompt = sum(r["prompt_tokens"] for r in ok)
    usage_cached = sum(r["cached_tokens"] for r in ok)
    m_computed = sum(d[r]["prompt_tokens"] for r in replicas)
    m_cached = sum(d[r]["cached_tokens"] for r in replicas)
    per_replica = {r: sum(1 for x in rows if x["served_by"] == r) for r in replicas}
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
        "served_by_vs_metrics_mismatches": mismatches,
        "wall_s": wall_s,
        "metrics_per_replica": d,
        "rows": rows,
    }
    with open(out, "w") as f:
        json.dump(summary, f, indent=2)
    return 0 if summary["errors"] == 0 else 1


def _fmt(v, kind):
    if v is None:
        return "-"
    if kind == "pct":
        return f"{100 * v:.1f} %"
    if kind == "ms":
        return f"{v:.0f} ms"
    if kind == "s":
        return f"{v:.1f} s"
    return str(v)


def cmd_report(out, run_files):
    runs = []
    for p in run_files:
        with open(p) as f:
            runs.append(json.load(f))
    by = {r["strategy"]: r for r in runs}
    names = [r["strategy"] for r in runs]
    lines = [
        "| metric | " + " | ".join(names) + (" | prefix / round_robin |" if {"prefix", "round_robin"} <= set(by) else " |"),
        "|---|" + "---|" * len(names) + ("---|" if {"prefix", "round_robin"} <= set(by) else ""),
    ]
    fields = [
        ("cached share of prompt tokens (usage.cached_tokens)", "usage_cached_share", "pct"),
        ("cached share of prompt tokens (/metrics)", "metrics_cached_share", "pct"),
        ("prompt tokens computed (/metrics)", "metrics_prompt_tokens_computed", "n"),
        ("requests with >= 90 % of the prompt cached", "warm_requests", "n"),
        ("TTFT mean, all requests", "ttft_mean_ms", "ms"),
        ("TTFT p50, all requests", "ttft_p50_ms", "ms"),
        ("TTFT p90, all requests", "ttft_p90_ms", "ms"),
        ("TTFT p50, shared-prefix requests", "ttft_shared_p50_ms", "ms"),
        ("TTFT p90, shared-prefix requests", "ttft_shared_p90_ms", "ms"),
        ("total time (sequential)", "wall_s", "s"),
        ("errors", "errors", "n"),
    ]
    ratios = {}
    for label, key, kind in fields:
        row = f"| {label} | " + " | ".join(_fmt(by[n][key], kind) for n in names) + " |"
        if {"prefix", "round_robin"} <= set(by):
            a, b = by["prefix"][key], by["round_robin"][key]
            if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b:
                ratios[key] = a / b
                row += f" {a / b:.2f}x |"
            else:
                row += " - |"
        lines.append(row)
    rpr = " | ".join(
        " / ".join(str(v) for v in by[n]["requests_per_replica"].values()) for n in names
    )
    lines.append(f"| requests per replica | {rpr} |" + (" |" if ratios or {"prefix", "round_robin"} <= set(by) else ""))
    table = "\n".join(lines)
    print(table)
    markdown = (
        "3 llama.cpp `llama-server` replicas (SmolLM2-135M-Instruct Q4_1, `-c 2048 -t 1 -np 1 "
        "-cram 64`, fresh and cold for each strategy) behind Envoy 1.40 with the filter. Workload: "
        "4 groups x 4 chat requests sharing a ~1,000-token system prompt + 4 unique ~160-token "
        "prompts, one fixed shuffled order, sent one at a time, streamed, `max_tokens` 4. Cached "
        "shares are what the servers report; TTFT is measured at the client.\n\n" + table
    )
    with open(out, "w") as f:
        json.dump(
            {
                "workload": "4 groups x 4 chat requests sharing a ~1,000-token system prompt "
                "+ 4 unique ~160-token prompts, one fixed shuffled order, sequential, max_tokens 4",
                "replicas": "3 x llama-server (SmolLM2-135M-Instruct Q4_1, -c 2048 -t 1 -np 1 -cram 64)",
                "runs": {n: {k: v for k, v in by[n].items() if k != "rows"} for n in names},
                "rows": {n: by[n]["rows"] for n in names},
                "ratios_prefix_over_round_robin": ratios,
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
    if cmd == "smoke":
        return cmd_smoke(args[0], args[1])
    if cmd == "bench":
        return cmd_bench(args[0], args[1], args[2], args[3])
    if cmd == "report":
        return cmd_report(args[0], args[1:])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
