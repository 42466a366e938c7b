#!/usr/bin/env bash
# Wasm instructions per request of the whole filter (adapter + core), split by callback: the
# release .wasm under wasmtime with fuel metering (one unit per wasm instruction: deterministic,
# independent of machine load) behind a fake proxy-wasm host (scripts/cost-adapter.py), one
# 16 KiB `affinity` chat request at a time over 64 distinct prefixes, after a warm-up that fills
# the index. Envoy's side of each host call is NOT counted (price it with
# `./build.sh bench price`); what is counted is all the wasm code the filter runs. Not a test step.
#   bash scripts/cost-adapter.sh [REQUESTS] [BODY_BYTES] [CONFIG_JSON]
#   COST_ADAPTER_WASM=<other .wasm>  count another build (e.g. a PR_ABLATE=... build: src/filter/probe.rs)
#   COST_ADAPTER_CLOCKS=1            with a `--features selfprof` build: the instructions between
#                                    consecutive clock reads, i.e. per timed phase
#   COST_ADAPTER_RESPONSE='{...}'    another upstream answer (default: the bench upstream's JSON)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
WASM="${COST_ADAPTER_WASM:-}"
if [ -z "$WASM" ]; then
  build_wasm >/dev/null 2>&1 || build_wasm
  WASM="$ROOT/target/wasm32-wasip1/release/prefix_router.wasm"
fi
ensure_venv
if ! "$VENV/bin/python" -c 'import wasmtime' 2>/dev/null; then
  log "pip install wasmtime (into .venv)"
  "$VENV/bin/pip" install -q wasmtime >&2
fi
exec "$VENV/bin/python" scripts/cost-adapter.py "$WASM" "$@"
