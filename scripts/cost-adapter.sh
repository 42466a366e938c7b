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
#   COST_ADAPTER_OVERLAP=K           K requests at a time (all routed, then all answered and ended)
#   COST_ADAPTER_VCLOCK_US=N         a virtual clock, N µs per request, and the root's tick every
#                                    10 ms of it (counts repeat exactly; default: real clock, no tick)
#   COST_ADAPTER_ALLOCS=1            count allocations per request by callback too: builds the
#                                    filter with `--features alloccount` (src/filter/alloc.rs) in
#                                    its own target dir (target/alloccount), never the shipped .wasm
#   bash scripts/cost-adapter.sh --check   1 KiB and 16 KiB against scripts/cost-adapter-baseline.txt:
#                                    FAILS above COST_TOLERANCE (default 1.20) x the baseline
#                                    (UPDATE_COST_BASELINE=1 rewrites it). Not wired into
#                                    ./build.sh test (it needs wasmtime from PyPI); counts vary
#                                    by ~0.05 % between runs (the index secret is random).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
FILTER="${COST_ADAPTER_WASM:-}"
if [ -z "$FILTER" ] && [ "${COST_ADAPTER_ALLOCS:-0}" = 1 ]; then
  ensure_target wasm32-wasip1
  log "cargo build --release --target wasm32-wasip1 -p prefix-router --lib --features alloccount"
  CARGO_TARGET_DIR="$ROOT/target/alloccount" cargo build --release --target wasm32-wasip1 \
    -p prefix-router --lib --features alloccount >&2
  FILTER="$ROOT/target/alloccount/wasm32-wasip1/release/prefix_router.wasm"
fi
if [ -z "$FILTER" ]; then
  build_wasm >/dev/null 2>&1 || build_wasm
  FILTER="$WASM"
fi
ensure_venv
if ! "$VENV/bin/python" -c 'import wasmtime' 2>/dev/null; then
  log "pip install wasmtime (into .venv)"
  "$VENV/bin/pip" install -q wasmtime >&2
fi
if [ "${1:-}" != --check ]; then
  exec "$VENV/bin/python" scripts/cost-adapter.py "$FILTER" "$@"
fi
BASELINE="$ROOT/scripts/cost-adapter-baseline.txt" TOL="${COST_TOLERANCE:-1.20}" rc=0 lines=()
for kb in 1 16; do
  n="$("$VENV/bin/python" scripts/cost-adapter.py "$FILTER" 100 $((kb * 1024)) \
    | sed -n 's/^wasm instructions per request: //p' | tr -d ,)"
  base="$(awk -v c="affinity/${kb}k" '$1 == c {print $2}' "$BASELINE" 2>/dev/null || true)"
  lines+=("affinity/${kb}k $n")
  if [ -z "$base" ]; then
    echo "affinity/${kb}k: $n wasm instructions per request (no baseline)"
  elif awk -v n="$n" -v b="$base" -v t="$TOL" 'BEGIN {exit !(n > b * t)}'; then
    echo "affinity/${kb}k: $n wasm instructions per request, baseline $base: FAIL (> $TOL x)"; rc=1
  else
    echo "affinity/${kb}k: $n wasm instructions per request, baseline $base: ok"
  fi
done
if [ "${UPDATE_COST_BASELINE:-0}" = 1 ]; then
  { echo "# Wasm instructions per request of the whole filter (scripts/cost-adapter.sh --check):"
    echo "# 1 and 16 KiB affinity chat bodies, warm index, the bench upstream's answer."
    printf '%s\n' "${lines[@]}"; } >"$BASELINE"
  echo "baseline written: $BASELINE"; exit 0
fi
exit "$rc"
