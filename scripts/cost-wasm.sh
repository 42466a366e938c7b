#!/usr/bin/env bash
# Time of the routing core compiled to wasm32-wasip1 (the filter's target, with its SIMD
# flags) under Node's V8, the engine Envoy embeds: examples/cost_probe in timing mode
# (COST_PROBE_TIME rounds, best round per case). Wall time on a shared machine: compare two
# builds in the same run, not with numbers from another day. Not a test step.
#   bash scripts/cost-wasm.sh [case-prefix...]        e.g. affinity/16k prefix/
#   COST_WASM=<other cost_probe.wasm> bash scripts/cost-wasm.sh   time another build
#   bash scripts/cost-wasm.sh --fuel CASE...   wasm INSTRUCTIONS per request of the named cases
#                                    instead of time (wasmtime fuel, scripts/cost-fuel.py):
#                                    exact, independent of machine load; e.g. --fuel key/16k
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
ROUNDS="${COST_PROBE_TIME:-15}"
WASM="${COST_WASM:-}"
if [ -z "$WASM" ]; then
  log "cargo build --release --example cost_probe --target wasm32-wasip1"
  cargo build --release --example cost_probe --target wasm32-wasip1 >&2
  WASM="$ROOT/target/wasm32-wasip1/release/examples/cost_probe.wasm"
fi
if [ "${1:-}" = --fuel ]; then
  shift
  ensure_venv
  if ! "$VENV/bin/python" -c 'import wasmtime' 2>/dev/null; then
    log "pip install wasmtime (into .venv)"
    "$VENV/bin/pip" install -q wasmtime >&2
  fi
  exec "$VENV/bin/python" scripts/cost-fuel.py "$WASM" "${COST_FUEL_ITERS:-20}" "$@"
fi
command -v node >/dev/null || { echo "node is needed (apt-get install nodejs)" >&2; exit 1; }
node --no-warnings - "$WASM" "$ROUNDS" "$@" <<'JS'
const fs = require('fs');
const { WASI } = require('wasi');
const [wasmPath, rounds, ...cases] = process.argv.slice(2);
const wasi = new WASI({ version: 'preview1', args: ['cost_probe', ...cases],
                        env: { COST_PROBE_TIME: rounds } });
const mod = new WebAssembly.Module(fs.readFileSync(wasmPath));
// The library also holds the proxy-wasm adapter: its host functions are imported but never
// called by the probe (stubs that fail loudly if they were).
const imports = wasi.getImportObject();
for (const i of WebAssembly.Module.imports(mod)) {
  if (i.kind !== 'function' || (imports[i.module] && imports[i.module][i.name])) continue;
  imports[i.module] = imports[i.module] || {};
  imports[i.module][i.name] = () => { throw new Error(`host call ${i.module}.${i.name}`); };
}
// The proxy-wasm SDK exports `_initialize` too, which Node's WASI refuses next to `_start`.
const { exports } = new WebAssembly.Instance(mod, imports);
wasi.start({ exports: { memory: exports.memory, _start: exports._start } });
JS
