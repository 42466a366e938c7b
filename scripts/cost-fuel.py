"""Wasm instructions per request of examples/cost_probe's cases (wasm32-wasip1 build), counted
as wasmtime fuel (one unit per wasm instruction: deterministic, independent of machine load).

Each case runs twice, with COST_PROBE_ITERS=0 and =N; the difference / N is one request (setup,
warm-up and the WASI start-up cancel out). Called by `bash scripts/cost-wasm.sh --fuel`.
    python cost-fuel.py <cost_probe.wasm> <N> <case>...
"""
import sys

from wasmtime import Config, Engine, ExitTrap, Linker, Module, Store, WasiConfig

WASM, N, CASES = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
cfg = Config()
cfg.consume_fuel = True
engine = Engine(cfg)
module = Module.from_file(engine, WASM)
FUEL = 2**62


def fuel(case, iters):
    store = Store(engine)
    store.set_fuel(FUEL)
    wasi = WasiConfig()
    wasi.argv = ["cost_probe", case]
    wasi.env = [("COST_PROBE_ITERS", str(iters))]
    store.set_wasi(wasi)
    linker = Linker(engine)
    linker.define_wasi()
    # The library also holds the proxy-wasm adapter: its host functions are imported but never
    # called by the probe (traps if they were).
    linker.define_unknown_imports_as_traps(module)
    inst = linker.instantiate(store, module)
    try:
        inst.exports(store)["_start"](store)
    except ExitTrap as e:
        if e.code != 0:
            sys.exit(f"cost_probe {case} exited with {e.code}")
    return FUEL - store.get_fuel()


print(f"{'case':<16} {'wasm instructions/request':>26}")
for case in CASES:
    per = (fuel(case, N) - fuel(case, 0)) / N
    print(f"{case:<16} {per:>26,.0f}")
