# The emulated serving stack shared by scripts/demo.sh and the routing part of scripts/bench.sh:
# 7 replica emulators on 127.0.0.1:18001-18007 and Envoy (envoy/envoy.yaml: listener :10000,
# admin :9901) with the prefix-router filter. Source after common.sh and bench/lib.sh.
#
#   cluster_start_replicas LOGDIR ARGS...   start 7 fresh replicas (cold caches), wait for /health
#   cluster_start_envoy STRATEGY LOGDIR     render envoy/envoy.yaml with STRATEGY and start Envoy,
#                                           wait until the 7 hosts are healthy
#   cluster_run LABEL TOTAL OUT_JSON ARGS...  run prefix-load through Envoy with a live progress
#                                           line (requests done, read from Envoy's admin)
#   cluster_stop                            stop Envoy and the replicas (by PID)

CLUSTER_HOST=127.0.0.1
CLUSTER_PORTS=(18001 18002 18003 18004 18005 18006 18007)
CLUSTER_LISTENER=10000
CLUSTER_ADMIN=9901
# CLUSTER_PORT_BASE=B (environment) moves everything off the fixed ports, so a run does not
# collide with the demo or another bench: listener B, admin B+1, replicas B+11..B+17
# (envoy.yaml is rendered with them). Unset: the fixed ports above.
if [ -n "${CLUSTER_PORT_BASE:-}" ]; then
  CLUSTER_LISTENER=$CLUSTER_PORT_BASE
  CLUSTER_ADMIN=$((CLUSTER_PORT_BASE + 1))
  CLUSTER_PORTS=()
  for _i in 1 2 3 4 5 6 7; do CLUSTER_PORTS+=($((CLUSTER_PORT_BASE + 10 + _i))); done
  unset _i
fi
EMULATOR_BIN="$ROOT/target/release/replica-emulator"
LOAD_BIN="$ROOT/target/release/prefix-load"

cluster_ports_free() {
  require_free_ports "${CLUSTER_PORTS[@]}" "$CLUSTER_LISTENER" "$CLUSTER_ADMIN"
}

# cluster_start_replicas LOGDIR EMULATOR_ARGS...
cluster_start_replicas() {
  local logdir="$1" i port pids=()
  shift
  mkdir -p "$logdir"
  for i in "${!CLUSTER_PORTS[@]}"; do
    port="${CLUSTER_PORTS[$i]}"
    "$EMULATOR_BIN" --host "$CLUSTER_HOST" --port "$port" --id "r$((i + 1))" "$@" \
      >"$logdir/replica-$port.log" 2>&1 </dev/null &
    pids+=($!)
    proc_track "$!" "replica-$port"
  done
  for i in "${!CLUSTER_PORTS[@]}"; do
    port="${CLUSTER_PORTS[$i]}"
    if ! wait_http "http://$CLUSTER_HOST:$port/health" 20 "${pids[$i]}"; then
      echo "error: replica on :$port did not become healthy; log:" >&2
      tail -5 "$logdir/replica-$port.log" >&2
      return 1
    fi
  done
}

# cluster_render_envoy STRATEGY OUT — envoy/envoy.yaml with the plugin's strategy replaced and
# the .wasm path made absolute (so Envoy's working directory does not matter).
# ROUTER_SET="field=value ..." (environment) also replaces numeric plugin fields that
# envoy.yaml sets, e.g. ROUTER_SET="load_factor=2.0 concurrency_threshold=32", to explore them.
cluster_render_envoy() {
  local strategy="$1" out="$2" kv k v expr=()
  expr+=(-e "s|\"strategy\": *\"[a-z_]*\"|\"strategy\": \"$strategy\"|")
  expr+=(-e "s|filename: target/wasm32-wasip1/release/prefix_router.wasm|filename: $WASM|")
  # envoy.yaml's prefix_length is the affinity strategy's (the whole prompt, for its prefix
  # index). prefix/session hash exactly prefix_length characters, so with that value every
  # prompt with a unique suffix would get its own key: drop the line for them and let the
  # filter use its default for the strategy (2048 characters, SageMaker's PrefixLength).
  if [ "$strategy" != affinity ] && [[ " ${ROUTER_SET:-} " != *" prefix_length="* ]]; then
    expr+=(-e '/"prefix_length": *[0-9]*,/d')
  fi
  for kv in ${ROUTER_SET:-}; do
    k="${kv%%=*}"; v="${kv#*=}"
    expr+=(-e "s|\"$k\": *[0-9.]*|\"$k\": $v|")
  done
  if [ -n "${CLUSTER_PORT_BASE:-}" ]; then
    expr+=(-e "s|port_value: 10000}|port_value: $CLUSTER_LISTENER}|")
    expr+=(-e "s|port_value: 9901}|port_value: $CLUSTER_ADMIN}|")
    for i in "${!CLUSTER_PORTS[@]}"; do
      expr+=(-e "s#\(127\.0\.0\.1:\|port_value: \)1800$((i + 1))\b#\1${CLUSTER_PORTS[$i]}#g")
    done
  fi
  sed "${expr[@]}" "$ROOT/envoy/envoy.yaml" >"$out"
  if ! grep -q "\"strategy\": \"$strategy\"" "$out" || ! grep -q "filename: $WASM" "$out"; then
    echo "error: could not render strategy/wasm path into envoy/envoy.yaml (layout changed?)" >&2
    return 1
  fi
  for kv in ${ROUTER_SET:-}; do
    grep -q "\"${kv%%=*}\": ${kv#*=}" "$out" || {
      echo "error: ROUTER_SET: field ${kv%%=*} not found in envoy/envoy.yaml's plugin config" >&2
      return 1
    }
  done
}

# cluster_healthy_hosts — how many of the llm cluster's hosts Envoy reports healthy.
cluster_healthy_hosts() {
  curl -s --max-time 2 "http://$CLUSTER_HOST:$CLUSTER_ADMIN/clusters" |
    grep -c '^llm::.*::health_flags::healthy$' || true
}

# cluster_start_envoy STRATEGY LOGDIR [CONCURRENCY]  (default $CLUSTER_ENVOY_CONCURRENCY, else 2 workers)
cluster_start_envoy() {
  local strategy="$1" logdir="$2" conc="${3:-${CLUSTER_ENVOY_CONCURRENCY:-2}}" pid i
  mkdir -p "$logdir"
  cluster_render_envoy "$strategy" "$logdir/envoy-$strategy.yaml"
  start_envoy "envoy-$strategy" "$logdir/envoy-$strategy.yaml" "$logdir/envoy-$strategy.log" \
    --concurrency "$conc"
  pid=$LAST_PID
  if ! wait_http "http://$CLUSTER_HOST:$CLUSTER_ADMIN/ready" 30 "$pid"; then
    echo "error: Envoy did not start; log:" >&2
    tail -20 "$logdir/envoy-$strategy.log" >&2
    return 1
  fi
  for ((i = 0; i < 200; i++)); do
    if [ "$(cluster_healthy_hosts)" -ge "${#CLUSTER_PORTS[@]}" ]; then
      cluster_wait_filter_members
      return 0
    fi
    sleep 0.1
  done
  echo "error: Envoy does not see all ${#CLUSTER_PORTS[@]} replicas healthy after 20 s" >&2
  return 1
}

# cluster_filter_available — replicas the filter's membership view has as available (its
# `prefix_router.cluster.available` gauge, published by the poller every refresh_ms); 0 if absent.
cluster_filter_available() {
  curl -s --max-time 1 "http://$CLUSTER_HOST:$CLUSTER_ADMIN/stats?filter=prefix_router\.cluster\.available$" |
    awk -F': ' '{print $2+0; found=1} END{if (!found) print 0}'
}

# cluster_wait_filter_members — wait (up to 5 s) until the filter's own view has every replica
# available, not only Envoy's health checks: the filter polls Envoy's admin every refresh_ms
# (1 s), so load started right after Envoy reported all healthy could be routed on an older view
# with fewer replicas. Seen once in 51 SageMaker runs (docs/benchmarks.md, "Fourteenth session:
# miss14"): the first 8 requests all cold on one replica, 88.8 % hit instead of 90.7–91.9 %.
cluster_wait_filter_members() {
  local i
  for ((i = 0; i < 50; i++)); do
    [ "$(cluster_filter_available)" -ge "${#CLUSTER_PORTS[@]}" ] && return 0
    sleep 0.1
  done
  echo "note: the filter's view does not have all ${#CLUSTER_PORTS[@]} replicas available after 5 s" >&2
}

# cluster_requests_done — requests Envoy's listener has completed since it started.
cluster_requests_done() {
  curl -s --max-time 1 "http://$CLUSTER_HOST:$CLUSTER_ADMIN/stats?filter=^http\.llm_ingress\.downstream_rq_completed$" |
    awk -F': ' '{print $2+0; found=1} END{if (!found) print 0}'
}

# cluster_monitor LABEL TOTAL — the progress line, until killed (bounded: 30 min).
cluster_monitor() {
  local label="$1" total="$2" start=$SECONDS n i
  trap '' INT   # a Ctrl-C to the process group must not end it early: the script stops it
  # On a terminal the line is redrawn every 0.5 s; in a log, one line every 5 s.
  local every=10
  [ -t 2 ] && every=1
  for ((i = 0; i < 3600; i++)); do
    if ((i % every == every - 1)); then
      n="$(cluster_requests_done)"
      progress "$(printf '%s: %4d/%d requests, %3d s' "$label" "${n:-0}" "$total" $((SECONDS - start)))"
    fi
    sleep 0.5
  done
}

# cluster_run LABEL TOTAL OUT_JSON PREFIX_LOAD_ARGS...
cluster_run() {
  local label="$1" total="$2" out="$3" rc=0 mon replicas=() p
  shift 3
  for p in "${CLUSTER_PORTS[@]}"; do replicas+=(--replica "http://$CLUSTER_HOST:$p"); done
  cluster_monitor "$label" "$total" &
  mon=$!
  proc_track "$mon" monitor
  run_tracked prefix-load "$LOAD_BIN" run --url "http://$CLUSTER_HOST:$CLUSTER_LISTENER" \
    --envoy-admin "http://$CLUSTER_HOST:$CLUSTER_ADMIN" "${replicas[@]}" \
    --label "$label" --json "$out" "$@" >"${out%.json}.out" 2>&1 || rc=$?
  proc_stop "$mon" 1; proc_untrack "$mon"
  progress "$(printf '%s: %4d/%d requests, done' "$label" "$(cluster_requests_done)" "$total")"
  progress_end
  if [ "$rc" -ne 0 ] || [ ! -s "$out" ]; then
    echo "error: prefix-load failed (status $rc); output:" >&2
    tail -20 "${out%.json}.out" >&2
    return 1
  fi
}

cluster_stop() {
  proc_stop_named envoy-
  proc_stop_named replica-
}
