#!/usr/bin/env bash
# prefix-router benchmarks (kept out of the test suite). Run from anywhere:
#   ./build.sh bench [overhead|profile|hostcalls|price|routing|agreement|memory|llama|quick|all]
#                                                                          (default: all)
# Parts:
#   overhead  the filter's added latency, throughput and CPU cost: one real Envoy, listeners
#             with the filter (prefix, affinity, affinity with read_usage off) and one without,
#             same upstream, bodies 1 KiB..256 KiB, and two floor listeners (no-op wasm,
#             pause+read wasm); prints the ratios and the load average (wrk; ~7.5 min)
#   profile   where the Envoy CPU per request goes (perf sampling; not part of `all`; ~2 min)
#   hostcalls host calls per request by kind, per listener (debug log tally; not part of `all`)
#   price     the price of one host call by kind (floor H with extra calls; not part of `all`)
#   routing   routing quality through Envoy: 7 emulated replicas, round_robin vs least_request
#             vs prefix vs affinity on a SageMaker-style 8k-token workload, the demo mix at
#             scale and unique prompts (~7 min)
#   agreement one trace slice on one engine model, in the simulator and through Envoy
#             (7 emulators with the simulator's calibrated model as flags): per strategy
#             (random; affinity with share_factor 0 as the simulator's default; AGREE_SHARE=1
#             adds share_factor 1.0) hit rate, TTFT p50/p90/p99 and spills on both sides and
#             their difference; 800 requests of the Mooncake conversation trace shipped in
#             scripts/bench/traces/ (AGREE_TRACE/AGREE_FROM/AGREE_COUNT/AGREE_TIME_SCALE pick
#             another; scripts/bench/agreement.sh). Not part of `all` (~6 min)
#   memory    Envoy memory per prefix-index slot: 7 fast emulators, index_slots 1024 / 65536 /
#             262144 (MEMORY_SLOTS), each table filled by unique long prompts, Envoy's allocated
#             heap before and after (scripts/bench/memory.sh). Not part of `all` (~3 min)
#   llama     real llama.cpp replicas (scripts/llama.sh bench; skips if llama-server is absent;
#             ~3 min when built)
#   quick     the smallest run that draws the routing and overhead plots: overhead with 3
#             latency rounds and 1 throughput round, routing on sagemaker and unique (~11 min)
# Each part prints a markdown table and writes JSON under .work/bench/; `all` ends with one
# markdown block for the README (command, date, machine, every table). Every part that ran also
# redraws its SVG plots in docs/img/ (scripts/bench/plot.py, from that JSON; see docs/benchmarks.md).
# Everything runs on 127.0.0.1 and everything started is stopped by PID, also on Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
source scripts/bench/lib.sh
source scripts/bench/overhead.sh
source scripts/bench/cluster.sh
source scripts/bench/routing.sh
source scripts/bench/agreement.sh
source scripts/bench/memory.sh

part="${1:-all}"
case "$part" in
  overhead|profile|hostcalls|price|routing|agreement|memory|llama|all) ;;
  quick)
    export OVERHEAD_LAT_ROUNDS="${OVERHEAD_LAT_ROUNDS:-3}" OVERHEAD_TPUT_ROUNDS="${OVERHEAD_TPUT_ROUNDS:-1}"
    export ROUTING_WORKLOADS="${ROUTING_WORKLOADS:-sagemaker unique}" ;;
  -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
  *) echo "usage: ./build.sh bench [overhead|profile|hostcalls|price|routing|agreement|memory|llama|quick|all]" >&2; exit 2 ;;
esac

proc_install_trap
mkdir -p .work/bench
ensure_envoy
# Benchmark the code as it is now (incremental: a no-op when the .wasm is up to date).
build_wasm 2>&1 | tail -1 >&2
started_at="$(date +%s)"
run_label="./build.sh bench"
[ "$part" = all ] || run_label+=" $part"

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
  quick) run_part overhead; run_part routing ;;
  *) run_part "$part" ;;
esac

if [ "$part" != profile ] && [ "$part" != hostcalls ] && [ "$part" != price ] &&
  [ "$part" != agreement ] && [ "$part" != memory ]; then
  # The plots of every part that wrote its JSON during this run (docs/img/*.svg).
  "$(bench_python)" scripts/bench/plot.py .work/bench docs/img --since "$started_at" \
    --command "$run_label" --machine "$(machine_line)" || rc=1
fi
if [ "$part" = all ] || [ "$part" = quick ]; then
  echo
  echo "----- paste into README (benchmark section) -----"
  "$(bench_python)" scripts/bench/report.py combine .work/bench \
    --command "$run_label" --machine "$(machine_line)" --since "$started_at" \
    --commit "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "----- end -----"
fi
exit "$rc"
