#!/usr/bin/env bash
# prefix-router benchmarks (kept out of the test suite). Run from anywhere:
#   ./build.sh bench [overhead|profile|hostcalls|routing|llama|all]     (default: all)
# Parts:
#   overhead  the filter's added latency, throughput and CPU cost: one real Envoy, listeners
#             with the filter (prefix, affinity) and one without, same upstream, bodies
#             1 KiB..256 KiB, and two floor listeners (no-op wasm, pause+read wasm) (wrk; ~6 min)
#   profile   where the Envoy CPU per request goes (perf sampling; not part of `all`; ~2 min)
#   hostcalls host calls per request by kind, per listener (debug log tally; not part of `all`)
#   routing   routing quality through Envoy: 7 emulated replicas, round_robin vs least_request
#             vs prefix vs affinity on a SageMaker-style 8k-token workload, the demo mix at
#             scale and unique prompts (~7 min)
#   llama     real llama.cpp replicas (scripts/llama.sh bench; skips if llama-server is absent;
#             ~3 min when built)
# Each part prints a markdown table and writes JSON under .work/bench/; `all` ends with one
# markdown block for the README (command, date, machine, every table).
# Everything runs on 127.0.0.1 and everything started is stopped by PID, also on Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
source scripts/bench/lib.sh
source scripts/bench/overhead.sh
source scripts/bench/cluster.sh
source scripts/bench/routing.sh

part="${1:-all}"
case "$part" in
  overhead|profile|hostcalls|routing|llama|all) ;;
  -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
  *) echo "usage: ./build.sh bench [overhead|profile|hostcalls|routing|llama|all]" >&2; exit 2 ;;
esac

proc_install_trap
mkdir -p .work/bench
ensure_envoy
# Benchmark the code as it is now (incremental: a no-op when the .wasm is up to date).
build_wasm 2>&1 | tail -1 >&2
started_at="$(date +%s)"

# shellcheck disable=SC2317  # bench_* are called indirectly (run_part)
bench_llama() {
  if [ ! -f scripts/llama.sh ]; then
    log "llama: scripts/llama.sh not found; skipped"
    return 0
  fi
  log "llama: scripts/llama.sh bench"
  run_tracked llama bash scripts/llama.sh bench
}

rc=0
run_part() {
  log "bench part: $1"
  if ! "bench_$1"; then
    echo "error: bench part '$1' failed" >&2
    rc=1
  fi
}

case "$part" in
  all) run_part overhead; run_part routing; run_part llama ;;
  *) run_part "$part" ;;
esac

if [ "$part" = all ]; then
  echo
  echo "----- paste into README (benchmark section) -----"
  "$(bench_python)" scripts/bench/report.py combine .work/bench \
    --command "./build.sh bench" --machine "$(machine_line)" --since "$started_at" \
    --commit "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "----- end -----"
fi
exit "$rc"
