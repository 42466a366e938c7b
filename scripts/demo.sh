#!/usr/bin/env bash
# prefix-router demo: the README's first command.
#   ./build.sh demo
# Builds the filter and the dev tools, starts 7 emulated vLLM-like replicas on
# 127.0.0.1:18001-18007 and Envoy (envoy/envoy.yaml: listener :10000, admin :9901) with the
# filter, replays one built-in workload (shared-prefix groups, multi-turn chats and unique
# prompts, mixed) under `round_robin`, `prefix` (consistent hashing with bounded load) and
# `affinity` (the default: prefix index + cost model), and prints them side by side:
# prefix-cache hit rate (the replicas' own counters), TTFT p50/p90/p99, requests per replica
# (min/max share) and the router's hit/spill counts (Envoy stats).
# Replicas restart between the runs (cold caches) and Envoy restarts to change strategy.
# Everything runs on loopback; everything started is stopped by PID on exit and on Ctrl-C.
# Knobs (environment): DEMO_REQUESTS (default 480), DEMO_RATE (requests/s, default 16),
# DEMO_STRATEGIES (default "round_robin prefix affinity"; the first one is the baseline).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
source scripts/bench/lib.sh
source scripts/bench/cluster.sh
proc_install_trap

DIR="$ROOT/.work/demo"
REQUESTS="${DEMO_REQUESTS:-480}"
RATE="${DEMO_RATE:-16}"
# Replica timing (see emulator/README.md): a 7B-class model on a mid-range GPU, scaled so the
# demo is quick: 100 us per uncached prompt token (a 2,000-token prefix costs 200 ms to
# prefill, a cache hit almost nothing), one prefill at a time per replica (compute bound, so
# misses also delay the requests queued behind them), 10 ms per output token, 16 output tokens.
# The KV cache holds 1,024 blocks x 16 tokens = 16k tokens per replica: room for a few of the
# workload's prefixes, not all of them - spreading every prefix over every replica (what
# round_robin does) makes them evict each other.
EMULATOR_ARGS=(--prefill-us-per-token 100 --prefill-overhead-ms 2 --prefill-lanes 1
  --decode-ms-per-token 10 --cache-blocks 1024 --block-tokens 16)
# Workload (prefix-load --workload mixed): 50 % of the requests on 12 shared 2,000-token system
# prompts (+ a 32-token unique question), 30 % multi-turn chats (30 chats x 5 turns, the whole
# history resent every turn), 20 % unique 32-token prompts; open loop (Poisson arrivals) so both
# strategies see exactly the same offered load.
LOAD_ARGS=(--workload mixed --requests "$REQUESTS" --groups 12 --prefix-tokens 2000
  --conversations 30 --turns 5 --rate "$RATE" --max-tokens 16 --seed 7 --timeout-s 60)

t0=$SECONDS
log "demo: building the filter and the tools (cached after the first run)"
build_wasm 2>&1 | tail -1 >&2
build_tools 2>&1 | tail -1 >&2
ensure_envoy
if [ ! -x "$EMULATOR_BIN" ] || [ ! -x "$LOAD_BIN" ]; then
  echo "error: $EMULATOR_BIN or $LOAD_BIN missing after build" >&2
  exit 1
fi
cluster_ports_free
rm -rf "$DIR"; mkdir -p "$DIR"
t_run=$SECONDS

read -r -a strategies <<<"${DEMO_STRATEGIES:-round_robin prefix affinity}"
for i in "${!strategies[@]}"; do
  s="${strategies[$i]}"
  log "demo $((i + 1))/${#strategies[@]}: strategy $s — starting 7 fresh replicas (cold caches) and Envoy"
  cluster_start_replicas "$DIR/logs-$s" "${EMULATOR_ARGS[@]}"
  cluster_start_envoy "$s" "$DIR/logs-$s"
  cluster_run "$s" "$REQUESTS" "$DIR/$s.json" "${LOAD_ARGS[@]}"
  sed -n '/^\[/p' "$DIR/$s.out" >&2
  cluster_stop
done

summaries=()
for s in "${strategies[@]}"; do summaries+=("$DIR/$s.json"); done
echo
echo "prefix-router demo: ${REQUESTS} requests (mixed: shared prefixes, multi-turn chats, unique prompts)"
echo "at ${RATE} req/s through Envoy to 7 emulated replicas; strategies: ${strategies[*]}"
echo
"$LOAD_BIN" table "${summaries[@]}"
"$(bench_python)" scripts/bench/report.py demo "${summaries[@]}"
echo
# Predicted vs delivered, from the access-log field the filter writes (docs/delivered.md).
echo "Cached prompt tokens reported by the replicas vs predicted by the router (access log usage=):"
for s in "${strategies[@]}"; do
  f="$DIR/logs-$s/envoy-$s.log"
  [ -f "$f" ] || continue
  grep -o 'predicted=[0-9-]* delivered=[0-9-]* prompt=[0-9-]*' "$f" |
    awk -F'[= ]' -v s="$s" '{p += $2; d += $4; n += $6}
      END {if (n > 0) printf "  %-12s delivered %5.1f %%   predicted %5.1f %%   (%d responses)\n", s, 100 * d / n, 100 * p / n, NR}'
done
last="${strategies[${#strategies[@]}-1]}"
echo
echo "Where to look (while Envoy runs): http://127.0.0.1:9901/stats?filter=prefix_router and"
echo "http://127.0.0.1:9901/stats/prometheus (per-replica series carry an endpoint label);"
echo "Grafana: envoy/grafana-dashboard.json. Access-log lines of the $last run ($DIR/logs-$last/envoy-$last.log):"
grep 'usage="branch=' "$DIR/logs-$last/envoy-$last.log" 2>/dev/null | tail -3 | cut -c1-240 || true
echo
echo "Run took $((SECONDS - t_run)) s (plus $((t_run - t0)) s of build checks). Summaries: .work/demo/*.json;"
echo "replica and Envoy logs: .work/demo/logs-*/. Benchmarks: ./build.sh bench"
