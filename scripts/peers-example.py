#!/usr/bin/env python3
"""Run envoy/envoy-peers.yaml as shipped, three times, as a user would (issue 11).

Each gateway's config is the shipped file with text substitutions only: its own
loopback address (127.0.0.1/2/3) for the admin, ingress and sync listeners, other
ports (20000 ingress, 25009 sync, 29901 admin, replicas 28001-28003) so that it
does not collide with the demo or the benchmarks, and the absolute .wasm path.
Three emulated replicas; a client sends a mixed workload (80 % on 12 shared
1,600-word system prompts, 20 % unique) with 6 requests in flight, each to a
gateway drawn at random. Arms: `one` (one gateway), `three` (the file as
shipped), `nopeers` (three gateways, the `peers` object removed). Prints the
replicas' own prefix-cache hit rate (vllm:prefix_cache_*_total deltas), the
failed requests, what the sync path answers to a client without the secret and
to garbage, and the peers counters. Loopback only; every process started is
stopped. Usage: scripts/peers-example.sh [ARM ...]
"""
import json
import random
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

ROOT = sys.argv[1]
ENVOY = sys.argv[2]
ARMS = sys.argv[3:] or ["one", "three", "nopeers"]
WASM = ROOT + "/target/wasm32-wasip1/release/prefix_router.wasm"
EMULATOR = ROOT + "/target/debug/replica-emulator"
SRC = open(ROOT + "/envoy/envoy-peers.yaml").read()
REPLICAS = [28001, 28002, 28003]
WORK = ROOT + "/.work/peers-example"


def config(i, arm):
    """The shipped file for gateway i (1-based), ports moved, nothing else."""
    t = SRC
    if arm == "nopeers":
        t, n = re.subn(r',\n\s*"peers": \{[^}]*\}', "", t)
        assert n == 1, "the peers object was not found in envoy/envoy-peers.yaml"
    a = f"127.0.0.{i}"
    t = t.replace("port_value: 9901", "port_value: 29901")
    t = t.replace("port_value: 10000", "port_value: 20000")
    t = t.replace("{address: 0.0.0.0, port_value: 15009}", f"{{address: {a}, port_value: 25009}}")
    t = t.replace("port_value: 15009}", "port_value: 25009}")
    for old, new in zip([18001, 18002, 18003], REPLICAS):
        t = t.replace(str(old), str(new))
    t = re.sub(r"address: 127\.0\.0\.1, port_value: (29901|20000)",
               lambda m: f"address: {a}, port_value: {m.group(1)}", t)
    t = t.replace("filename: target/wasm32-wasip1/release/prefix_router.wasm", "filename: " + WASM)
    path = f"{WORK}/{arm}-gw{i}.yaml"
    open(path, "w").write(t)
    return path


def http(url, data=None, timeout=30):
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (OSError, urllib.error.URLError) as e:
        return 0, str(e).encode()


def replica_counters():
    hits = queries = 0.0
    for port in REPLICAS:
        _, body = http(f"http://127.0.0.1:{port}/metrics")
        for line in body.decode(errors="replace").splitlines():
            if line.startswith("vllm:prefix_cache_hits_total"):
                hits += float(line.split()[-1])
            elif line.startswith("vllm:prefix_cache_queries_total"):
                queries += float(line.split()[-1])
    return hits, queries


def workload(seed=7, n=360):
    rnd = random.Random(seed)
    words = ["alpha", "beta", "gamma", "delta", "kappa", "omega", "sigma", "theta"]
    groups = [" ".join(rnd.choice(words) + str(rnd.randrange(1000)) for _ in range(1600))
              for _ in range(12)]
    bodies = []
    for k in range(n):
        shared = rnd.random() < 0.8
        system = groups[rnd.randrange(len(groups))] if shared else \
            " ".join(rnd.choice(words) + str(rnd.randrange(10**6)) for _ in range(400))
        bodies.append(json.dumps({"model": "emulated-model", "max_tokens": 8, "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": f"question {k} " + rnd.choice(words) * 5}]}).encode())
    return bodies


def run(arm, bodies):
    procs = []

    def start(cmd, log):
        procs.append(subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT))

    gateways = 1 if arm == "one" else 3
    try:
        for port in REPLICAS:
            start([EMULATOR, "--port", str(port), "--prefill-us-per-token", "50",
                   "--cache-blocks", "2048"], f"{WORK}/{arm}-replica-{port}.log")
        for i in range(1, gateways + 1):
            start([ENVOY, "-c", config(i, arm), "--base-id", str(400 + i), "--concurrency", "2",
                   "--log-level", "warn"], f"{WORK}/{arm}-envoy{i}.log")
        for _ in range(150):
            if all(http(f"http://127.0.0.{i}:29901/ready", timeout=2)[0] == 200
                   for i in range(1, gateways + 1)):
                break
            time.sleep(0.2)
        else:
            raise SystemExit(f"{arm}: the gateways did not become ready (logs in {WORK})")
        time.sleep(3)  # first health checks and discovery
        before = replica_counters()
        rnd = random.Random(11)
        lock = threading.Lock()
        state = {"next": 0, "failed": 0}

        def worker():
            while True:
                with lock:
                    if state["next"] >= len(bodies):
                        return
                    body = bodies[state["next"]]
                    state["next"] += 1
                    gw = rnd.randrange(1, gateways + 1)
                status, _ = http(f"http://127.0.0.{gw}:20000/v1/chat/completions", data=body)
                if status != 200:
                    with lock:
                        state["failed"] += 1

        threads = [threading.Thread(target=worker) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        hits, queries = (a - b for a, b in zip(replica_counters(), before))
        probes, peers = [], []
        for i in range(1, gateways + 1):
            probes.append((http(f"http://127.0.0.{i}:25009/prefix-router/peers?since=0")[0],
                           http(f"http://127.0.0.{i}:25009/prefix-router/peers",
                                data=b"\x00garbage" * 64)[0],
                           http(f"http://127.0.0.{i}:20000/prefix-router/peers?since=0")[0]))
            _, stats = http(f"http://127.0.0.{i}:29901/stats?filter=prefix_router.peers")
            kv = dict(line.rsplit(": ", 1) for line in stats.decode().splitlines() if ": " in line)
            peers.append("/".join(kv.get(f"wasmcustom.prefix_router.peers.{k}", "-")
                                  for k in ("pull_ok", "pull_refused", "bad_batch")))
        return {"arm": arm, "gateways": gateways, "requests": len(bodies),
                "failed": state["failed"], "hit": 100.0 * hits / max(queries, 1.0),
                "probes": probes, "peers": peers}
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()


def main():
    subprocess.run(["mkdir", "-p", WORK], check=True)
    bodies = workload()
    print("| arm | gateways | requests | failed | replica hit % | sync path: no secret / garbage POST / public listener | peers pull_ok/refused/bad_batch per gateway |")
    print("|---|---:|---:|---:|---:|---|---|")
    for arm in ARMS:
        r = run(arm, bodies)
        probes = " ".join("/".join(str(c) for c in p) for p in r["probes"])
        print(f"| {arm} | {r['gateways']} | {r['requests']} | {r['failed']} | {r['hit']:.1f} | {probes} | {' '.join(r['peers'])} |",
              flush=True)


if __name__ == "__main__":
    main()
