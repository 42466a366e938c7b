"""Wasm instructions per request of the whole filter (adapter + core), by callback.

scripts/cost-adapter.sh runs this (usage and caveats there). The filter's .wasm runs under
wasmtime with fuel metering (one unit per wasm instruction, deterministic) behind a fake
proxy-wasm host: shared data in a dict (with CAS), headers, body, response and
`upstream.address` from the request being replayed. Envoy's own work (header maps, the route
cache, codecs) and the host-call boundary are not counted; what is counted is exactly the wasm
code the filter runs, so two builds compare to the instruction.
"""
import os
import sys
import time

import wasmtime
from wasmtime import Config, Engine, FuncType, Linker, Module, Store

WASM = sys.argv[1]
REQUESTS = int(sys.argv[2]) if len(sys.argv) > 2 else 300
BODY_BYTES = int(sys.argv[3]) if len(sys.argv) > 3 else 16384
CONFIG = (sys.argv[4] if len(sys.argv) > 4 else
          '{"strategy":"affinity","endpoints":[' +
          ",".join(f'"127.0.0.1:{p}"' for p in range(19604, 19611)) + ']}').encode()
KINDS = 64
WARM = 2 * KINDS  # every prefix seen twice before counting (the index is warm: hits)

WORDS = ("the assistant must answer questions about billing accounts orders shipping returns "
         "warranty policy customer support always politely and concisely never reveal internal "
         "notes when a user asks for refund check order status first then explain options in "
         "plain language use metric units quote prices with currency escalate to human agent if "
         "request involves").split()


def lcg(seed):
    s = [seed]

    def r(n):
        s[0] = (s[0] * 1103515245 + 12345) % 2147483648
        return s[0] % n + 1
    return r


def prose(rand, n):
    out, ln = [], 0
    while ln < n:
        w = WORDS[rand(len(WORDS)) - 1]
        if rand(12) == 1:
            w += "."
        out.append(w)
        ln += len(w) + 1
    return " ".join(out)[:n]


def body(i, size):
    rand = lcg(7919 * i + 17)
    head = '{"model":"bench-model","messages":[{"role":"system","content":"'
    mid = '"},{"role":"user","content":"'
    tail = '"}],"max_tokens":64,"stream":false}'
    pre = f"Tenant {i}, deployment {(i * 37) % 1000}. "
    room = max(16, size - len(head) - len(mid) - len(tail) - len(pre))
    user = max(8, room // 8)
    return (head + pre + prose(rand, room - user) + mid + prose(rand, user) + tail).encode()


BODIES = [body(i, BODY_BYTES) for i in range(KINDS)]
RESPONSE = (b'{"id":"bench","object":"chat.completion","model":"bench","choices":[{"index":0,'
            b'"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":'
            b'{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}')
RESPONSE = os.environ.get("COST_ADAPTER_RESPONSE", "").encode() or RESPONSE

cfg = Config()
cfg.consume_fuel = True
if os.environ.get("COST_ADAPTER_PERFMAP"):
    cfg.profiler = "perfmap"  # perf record -g python ...: JIT frames named
engine = Engine(cfg)
store = Store(engine)
store.set_fuel(2**62)
module = Module.from_file(engine, WASM)
linker = Linker(engine)
state = {"req_headers": [], "resp_headers": [], "body": b"", "upstream": b"127.0.0.1:19604"}
shared = {}
cas_seq = [1]
calls = {}
by_phase = {}  # (phase group, kind) -> calls
PHASE = ["setup"]
mem = [None]


def count(k):
    calls[k] = calls.get(k, 0) + 1
    g = (PHASE[0], k)
    by_phase[g] = by_phase.get(g, 0) + 1


def u32(caller, ptr, v):
    mem[0].write(caller, int(v).to_bytes(4, "little"), ptr)


def give(caller, data, pp, sp):
    p = caller["proxy_on_memory_allocate"](caller, len(data))
    if data:
        mem[0].write(caller, data, p)
    u32(caller, pp, p)
    u32(caller, sp, len(data))
    return 0


def read(caller, p, n):
    return bytes(mem[0].read(caller, p, p + n)) if n else b""


def pairs(h):
    out = bytearray(len(h).to_bytes(4, "little"))
    for k, v in h:
        out += len(k).to_bytes(4, "little") + len(v).to_bytes(4, "little")
    for k, v in h:
        out += k + b"\0" + v + b"\0"
    return bytes(out)


def headers(m):
    return state["req_headers"] if m == 0 else state["resp_headers"]


def h_log(c, level, p, n):
    if level >= 3:
        print(f"log[{level}] {read(c, p, n).decode(errors='replace')}", file=sys.stderr)
    return 0


CLOCKS = []  # fuel left at each clock read (COST_ADAPTER_CLOCKS: phase split of a selfprof build)


# COST_ADAPTER_VCLOCK_US=N: a virtual clock that advances N µs per request started (counts then
# repeat exactly; the root's tick runs every TICK_MS of it). Default: the real clock, no ticks.
VCLOCK_US = int(os.environ.get("COST_ADAPTER_VCLOCK_US", "0") or 0)
VNOW = [time.time_ns()]
# COST_ADAPTER_OVERLAP=K: K requests at a time (all routed, then all answered and ended in turn),
# so the VM is idle only after the K-th: what concurrency changes (writes batched, idle ends).
OVERLAP = max(1, int(os.environ.get("COST_ADAPTER_OVERLAP", "1") or 1))
TICK_MS = 10


def now_ns():
    return VNOW[0] if VCLOCK_US else time.time_ns()


def h_time(c, p):
    count("clock")
    if os.environ.get("COST_ADAPTER_CLOCKS"):
        CLOCKS.append(store.get_fuel())
    mem[0].write(c, now_ns().to_bytes(8, "little"), p)
    return 0


def h_buffer(c, kind, start, mx, pp, sp):
    count("buffer_get")
    b = {7: CONFIG, 0: state["body"], 1: RESPONSE}.get(kind)
    if b is None:
        return 1
    return give(c, b[start:start + (mx & 0xFFFFFFFF)], pp, sp)


def h_pairs(c, m, pp, sp):
    count("header_get")
    return give(c, pairs(headers(m)), pp, sp)


def h_value(c, m, kp, kn, pp, sp):
    count("header_get")
    k = read(c, kp, kn)
    for n, v in headers(m):
        if n == k:
            return give(c, v, pp, sp)
    return 1


def h_replace(c, m, kp, kn, vp, vn):
    count("header_set")
    k = read(c, kp, kn)
    state["req_headers"] = [(n, v) for n, v in state["req_headers"] if n != k] + [(k, read(c, vp, vn))]
    return 0


def h_remove(c, m, kp, kn):
    count("header_remove")
    k = read(c, kp, kn)
    state["req_headers"] = [(n, v) for n, v in state["req_headers"] if n != k]
    return 0


def h_property(c, pp, pn, dp, sp):
    count("property_get")
    path = read(c, pp, pn)
    if path == b"plugin_name":
        return give(c, b"prefix_router", dp, sp)
    if path == b"upstream\0address":
        return give(c, state["upstream"], dp, sp)
    return 1


def h_set_property(c, *a):
    count("property_set")
    return 0


def h_shared_get(c, kp, kn, dp, sp, cp):
    count("shared_get")
    e = shared.get(read(c, kp, kn))
    if e is None:
        return 1
    u32(c, cp, e[1])
    return give(c, e[0], dp, sp)


def h_shared_set(c, kp, kn, vp, vn, cas):
    count("shared_set")
    k = read(c, kp, kn)
    e = shared.get(k)
    if cas != 0 and e is not None and e[1] != cas:
        return 8
    cas_seq[0] += 1
    shared[k] = (read(c, vp, vn), cas_seq[0])
    return 0


def h_define(c, kind, np, nn, ip):
    cas_seq[0] += 1
    u32(c, ip, cas_seq[0])
    return 0


def h_metric(name):
    def f(c, *a):
        count(name)
        return 0
    return f


def h_log_level(c, p):
    u32(c, p, 2)
    return 0


def h_environ_sizes(c, a, b):
    u32(c, a, 0)
    u32(c, b, 0)
    return 0


def h_random(c, p, n):
    mem[0].write(c, os.urandom(n), p)
    return 0


HOST = {
    "proxy_log": h_log, "proxy_get_log_level": h_log_level,
    "proxy_get_current_time_nanoseconds": h_time, "proxy_get_buffer_bytes": h_buffer,
    "proxy_get_header_map_pairs": h_pairs, "proxy_get_header_map_value": h_value,
    "proxy_replace_header_map_value": h_replace, "proxy_remove_header_map_value": h_remove,
    "proxy_get_property": h_property, "proxy_set_property": h_set_property,
    "proxy_get_shared_data": h_shared_get, "proxy_set_shared_data": h_shared_set,
    "proxy_define_metric": h_define, "proxy_increment_metric": h_metric("metric_increment"),
    "proxy_record_metric": h_metric("metric_record"),
    "environ_sizes_get": h_environ_sizes, "random_get": h_random,
}


def default(ft):
    def f(c, *a):
        return 12 if ft.results else None  # Unimplemented
    return f


for imp in module.imports:
    ft = imp.type
    if not isinstance(ft, FuncType):
        continue
    fn = HOST.get(imp.name)
    if fn is None:
        fn = default(ft)
        if imp.name in ("environ_get", "fd_write", "proxy_set_effective_context",
                        "proxy_set_tick_period_milliseconds", "proxy_continue_stream"):
            fn = (lambda c, *a: 0)
    linker.define_func(imp.module, imp.name, ft, fn, access_caller=True)

inst = linker.instantiate(store, module)
ex = inst.exports(store)
mem[0] = ex["memory"]
ex["_initialize"](store)
ROOT = 1
ex["proxy_on_context_create"](store, ROOT, 0)
ex["proxy_on_vm_start"](store, ROOT, 0)
if not ex["proxy_on_configure"](store, ROOT, len(CONFIG)):
    sys.exit("configuration refused")

# Host calls are also tallied by part of the request: routing (request callbacks), response
# (response callbacks), log (on_log and the context's end).
GROUP = {"context_create": "routing", "request_headers": "routing", "request_body": "routing",
         "response_headers": "response", "response_body": "response", "log": "log",
         "done_delete": "log"}
PHASES = ["context_create", "request_headers", "request_body", "response_headers",
          "response_body", "log", "done_delete"]
fuel = {p: 0 for p in PHASES}
# A `--features alloccount` build exports its allocation count (src/filter/alloc.rs).
try:
    ALLOCS = ex["prefix_router_allocs"]
except KeyError:
    ALLOCS = None
allocs = {p: 0 for p in PHASES}


def request(i, ctx):
    """One request's steps, with its own header and upstream state."""
    body = BODIES[i % KINDS]
    own = {"body": body,
           "req_headers": [(b":method", b"POST"), (b":path", b"/v1/chat/completions"),
                           (b":authority", b"127.0.0.1"), (b"content-type", b"application/json"),
                           (b"content-length", str(len(body)).encode()),
                           (b"user-agent", b"wrk"), (b"x-request-id", f"r{ctx}".encode())],
           "resp_headers": [(b":status", b"200"), (b"content-type", b"application/json"),
                            (b"content-length", str(len(RESPONSE)).encode())],
           "upstream": b"127.0.0.1:19604"}
    steps = [
        ("context_create", lambda: ex["proxy_on_context_create"](store, ctx, ROOT)),
        ("request_headers", lambda: ex["proxy_on_request_headers"](store, ctx, 7, 0)),
        ("request_body", lambda: ex["proxy_on_request_body"](store, ctx, len(body), 1)),
        ("response_headers", lambda: ex["proxy_on_response_headers"](store, ctx, 3, 0)),
        ("response_body", lambda: ex["proxy_on_response_body"](store, ctx, len(RESPONSE), 1)),
        ("log", lambda: ex["proxy_on_log"](store, ctx)),
        ("done_delete", lambda: (ex["proxy_on_done"](store, ctx), ex["proxy_on_delete"](store, ctx))),
    ]
    return own, steps


last_tick = [None]


def tick(measure):
    """The root's tick, every TICK_MS of the virtual clock (none on the real clock)."""
    if not VCLOCK_US:
        return
    if last_tick[0] is None:
        last_tick[0] = VNOW[0]
    while VNOW[0] - last_tick[0] >= TICK_MS * 1_000_000:
        last_tick[0] += TICK_MS * 1_000_000
        PHASE[0] = "tick" if measure else "setup"
        ex["proxy_on_tick"](store, ROOT)


def step(own, name, fn, measure):
    state.update(own)
    if name == "response_headers":
        target = dict(state["req_headers"]).get(b"x-gateway-destination-endpoint")
        if target:
            state["upstream"] = target.split(b",")[0]
    PHASE[0] = GROUP.get(name, name) if measure else "setup"
    a0 = ALLOCS(store) if ALLOCS else 0
    f0 = store.get_fuel()
    fn()
    if measure:
        fuel[name] += f0 - store.get_fuel()
        if ALLOCS:
            allocs[name] += ALLOCS(store) - a0
    for k in own:
        own[k] = state[k]


def run_group(first, ctx, n, measure):
    """Requests first..first+n-1 (contexts ctx..): all routed, then all answered and ended."""
    reqs = [request(first + j, ctx + j) for j in range(n)]
    for own, steps in reqs:
        VNOW[0] += VCLOCK_US * 1000
        tick(measure)
        for name, fn in steps[:3]:
            step(own, name, fn, measure)
    for own, steps in reqs:
        for name, fn in steps[3:]:
            step(own, name, fn, measure)


ctx = 100
for i in range(0, WARM, OVERLAP):
    run_group(i, ctx, min(OVERLAP, WARM - i), False)
    ctx += OVERLAP
calls.clear()
by_phase.clear()
for i in range(0, REQUESTS, OVERLAP):
    CLOCKS.clear()
    run_group(i, ctx, min(OVERLAP, REQUESTS - i), True)
    ctx += OVERLAP
total = sum(fuel.values())
print(f"{BODY_BYTES} B chat bodies, {REQUESTS} requests after {WARM} of warm-up "
      f"(`affinity`, 7 static endpoints, " +
      (f"{OVERLAP} at a time" if OVERLAP > 1 else "one request at a time") +
      (f", virtual clock {VCLOCK_US} µs per request, tick every {TICK_MS} ms):" if VCLOCK_US else "):"))
print(f"wasm instructions per request: {total / REQUESTS:,.0f}")
print("by callback: " + ", ".join(f"{p} {fuel[p] / REQUESTS:,.0f}" for p in PHASES))
print("host calls per request: " + " ".join(f"{k}={v / REQUESTS:.2f}" for k, v in sorted(calls.items())))
print(f"host calls per request: {sum(calls.values()) / REQUESTS:.2f}, by part:")
for g in ("routing", "response", "log", "tick"):
    kinds = sorted((k, v) for (p, k), v in by_phase.items() if p == g)
    tot = sum(v for _, v in kinds) / REQUESTS
    print(f"  {g:<8} {tot:5.2f}: " + " ".join(f"{k}={v / REQUESTS:.2f}" for k, v in kinds))
if ALLOCS:
    print(f"allocations per request: {sum(allocs.values()) / REQUESTS:.2f} (" +
          ", ".join(f"{p} {allocs[p] / REQUESTS:.2f}" for p in PHASES) + ")")
if CLOCKS:
    print("fuel between consecutive clock reads (last request): " +
          " ".join(f"{a - b:,}" for a, b in zip(CLOCKS, CLOCKS[1:])))
