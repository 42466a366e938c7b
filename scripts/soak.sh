#!/usr/bin/env bash
# Fault soak through a real Envoy: ./build.sh soak [SECONDS] (default 600).
# Steady load (4 clients x 5 req/s: chat, streams, completions, oversized bodies,
# resets mid-body and mid-stream) on 4 emulated replicas (one slow) while replicas are
# killed and restarted, fail their health checks (503) and stall, at random times.
# Prints: sent / answered / failed during a fault / other failures, in-flight gauges and
# Envoy rq_active at the end, Wasm VMs created during the run, Envoy RSS start -> end.
# Free loopback ports only (runs alongside the tests). The test is tests/e2e/soak.rs;
# the suite runs it for 60 s.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh

SECONDS_WANTED="${1:-600}"
case "$SECONDS_WANTED" in ''|*[!0-9]*) echo "usage: ./build.sh soak [SECONDS]" >&2; exit 2 ;; esac
ensure_envoy
build_wasm
log "cargo build -p replica-emulator"
cargo build -p replica-emulator >&2
log "soak for ${SECONDS_WANTED} s"
SOAK_SECONDS="$SECONDS_WANTED" ENVOY_BIN="$ENVOY_BIN" E2E_WASM="$WASM" \
  E2E_EMULATOR_BIN="$ROOT/target/debug/replica-emulator" \
  cargo test -p prefix-router --features e2e --test e2e -- soak::fault_soak --nocapture --test-threads 1
