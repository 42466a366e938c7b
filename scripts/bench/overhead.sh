# Part (a) of scripts/bench.sh: the cost of the prefix-router filter inside a real Envoy.
# Source it from bench.sh (needs common.sh and bench/lib.sh); entry point: bench_overhead.
#
# Set-up (all on 127.0.0.1; ports from BENCH_PORT_BASE, default 19400):
#   upstream Envoy (+4..+10, --concurrency 1): one listener on 7 addresses, buffer filter +
#     direct_response 200, i.e. a real HTTP/1.1 server that reads the whole request and answers
#     at once with a small chat-completion JSON, with no model work
#   Envoy under test (--concurrency 1, admin +0), one cluster of those 7 addresses:
#     listener A (+1) = wasm filter, strategy prefix + router
#     listener C (+3) = wasm filter, strategy affinity (the shipped default) + router
#     listener B (+2) = router only
#     listener N (+11) = floor: no-op proxy-wasm filter + router (scripts/bench/floor, "noop")
#     listener R (+12) = floor: pause, buffer and read the body, nothing else + router ("read")
#   The floor filters are a separate bench-only crate built with the same SDK, toolchain and
#   release profile, so C - R is what routing adds to the least a body-reading filter costs.
#   wrk (Debian package): closed loop, keep-alive, 1 thread; 1 connection for latency and
#     8 connections for throughput; bodies from bench/chat-post.lua (64 distinct prefixes)
# Why --concurrency 1 for the Envoy under test: the machine this was built on has 2 cores that
# also run wrk and the upstream. One worker keeps the three from fighting over cores (which adds
# scheduler noise to every listener alike), and the filter's cost is per request on the worker
# that handles it, so one worker measures it exactly.
# The listeners run back to back, interleaved in a rotating order (A C B N R, C B N R A, ...) for
# every body size, so slow drift (other jobs on the machine) hits all alike; each figure is the
# median over rounds. Besides latency and throughput, the proxy Envoy's CPU time per request
# (from /proc, with vs without) gives the filter's cost in CPU microseconds, which other jobs on
# the machine disturb less than tail latency does (but it includes idle-loop costs when the
# worker is not saturated).
# Knobs: OVERHEAD_SECONDS (per run, default 2), OVERHEAD_LAT_ROUNDS (default 5),
# OVERHEAD_TPUT_ROUNDS (default 2), OVERHEAD_SIZES (bytes, default "1024 16384 65536 262144"),
# OVERHEAD_TPUT_CONNS (default 8), OVERHEAD_WASM (the filter .wasm to measure, default the
# release build: compare two builds without rebuilding).

ensure_wrk() {
  command -v wrk >/dev/null 2>&1 && return 0
  log "installing wrk (Debian package)"
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >&2
  else
    sudo apt-get update -qq >&2 && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >&2
  fi
  command -v wrk >/dev/null 2>&1 || { echo "error: wrk is required (apt-get install wrk)" >&2; return 1; }
}

# build_floor — the bench-only floor filters (scripts/bench/floor) -> $FLOOR_WASM.
FLOOR_WASM="$ROOT/target/wasm32-wasip1/release/bench_floor.wasm"
build_floor() {
  ensure_target wasm32-wasip1
  log "cargo build --release --target wasm32-wasip1 --manifest-path scripts/bench/floor/Cargo.toml"
  (cd "$ROOT" && cargo build --release --target wasm32-wasip1 --target-dir "$ROOT/target" \
    --manifest-path scripts/bench/floor/Cargo.toml >&2)
}

# cpu_ticks PID — user+system CPU time of a process (all its threads), in clock ticks.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# overhead_wrk LISTENER_PORT BODY_BYTES CONNS SECONDS OUT_JSON [ENVOY_PID]
# Writes wrk's summary to OUT_JSON and, with ENVOY_PID, the CPU ticks that Envoy used during
# the run to OUT_JSON.cpu (CPU per request is robust to other load on the machine, unlike p99).
overhead_wrk() {
  local port="$1" size="$2" conns="$3" secs="$4" out="$5" pid="${6:-}" t0=0
  [ -n "$pid" ] && t0="$(cpu_ticks "$pid")"
  BODY_BYTES="$size" BODY_KINDS=64 WRK_OUT="$out" \
    run_tracked wrk wrk -t1 -c"$conns" -d"${secs}s" --timeout 10s \
      -s "$BENCH_DIR_SELF/chat-post.lua" "http://127.0.0.1:$port/v1/chat/completions" >/dev/null
  [ -n "$pid" ] && echo "$(($(cpu_ticks "$pid") - t0)) $(getconf CLK_TCK) $conns" >"$out.cpu"
  [ -s "$out" ] || { echo "error: wrk wrote no summary to $out" >&2; return 1; }
}

bench_overhead() {
  local secs="${OVERHEAD_SECONDS:-2}" lat_rounds="${OVERHEAD_LAT_ROUNDS:-5}"
  local tput_rounds="${OVERHEAD_TPUT_ROUNDS:-2}" conns="${OVERHEAD_TPUT_CONNS:-8}"
  local sizes="${OVERHEAD_SIZES:-1024 16384 65536 262144}"
  local base="${BENCH_PORT_BASE:-19400}"
  local admin=$base a=$((base + 1)) b=$((base + 2)) c=$((base + 3)) up=$((base + 4))
  local fn=$((base + 11)) fr=$((base + 12))
  local dir="$ROOT/.work/bench/overhead" started=$SECONDS
  local py; py="$(bench_python)"
  local ups=() eps=() i
  for ((i = 0; i < 7; i++)); do ups+=("UP$((i + 1))=$((up + i))"); eps+=("\"127.0.0.1:$((up + i))\""); done
  local endpoints; endpoints="$(IFS=,; echo "${eps[*]}")"

  ensure_wrk
  local wasm="${OVERHEAD_WASM:-$WASM}"
  [ -f "$wasm" ] || build_wasm
  build_floor
  rm -rf "$dir"; mkdir -p "$dir/runs"
  require_free_ports "$admin" "$a" "$b" "$c" "$fn" "$fr" $(seq "$up" $((up + 6)))

  log "overhead: upstream Envoy (direct_response) on :$up-$((up + 6)); Envoy under test: A :$a prefix, C :$c affinity, B :$b no filter, N :$fn no-op wasm, R :$fr pause+read wasm"
  render "$BENCH_DIR_SELF/overhead-upstream.yaml.tmpl" "$dir/upstream.yaml" "${ups[@]}"
  render "$BENCH_DIR_SELF/overhead-proxy.yaml.tmpl" "$dir/proxy.yaml" "${ups[@]}" \
    "ADMIN_PORT=$admin" "PORT_A=$a" "PORT_B=$b" "PORT_C=$c" "PORT_N=$fn" "PORT_R=$fr" \
    "WASM=$wasm" "FLOOR_WASM=$FLOOR_WASM" "ENDPOINTS=$endpoints"
  start_envoy upstream "$dir/upstream.yaml" "$dir/upstream.log" --concurrency 1
  local up_pid=$LAST_PID
  start_envoy proxy "$dir/proxy.yaml" "$dir/proxy.log" --concurrency 1
  local px_pid=$LAST_PID
  wait_http "http://127.0.0.1:$up/" 30 "$up_pid" || { tail -20 "$dir/upstream.log" >&2; return 1; }
  wait_http "http://127.0.0.1:$admin/ready" 30 "$px_pid" || { tail -20 "$dir/proxy.log" >&2; return 1; }
  wait_http "http://127.0.0.1:$a/" 10 "$px_pid" || { tail -20 "$dir/proxy.log" >&2; return 1; }

  # Sanity: every listener answers 200 to a chat POST, and A and C really ran the filter.
  local l code
  for l in "$a" "$b" "$c" "$fn" "$fr"; do
    code="$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 -H 'content-type: application/json' \
      -d '{"model":"m","messages":[{"role":"user","content":"hello"}]}' "http://127.0.0.1:$l/v1/chat/completions")"
    [ "$code" = 200 ] || { echo "error: listener :$l answered $code, expected 200" >&2; tail -20 "$dir/proxy.log" >&2; return 1; }
  done
  local before; before="$(envoy_stats "$admin" 'wasmcustom.prefix_router.branch' | awk -F': ' '{s+=$2} END{print s+0}')"
  [ "$before" -ge 2 ] || { echo "error: the filter counted $before decisions for 2 requests on A and C" >&2; return 1; }

  log "overhead: warm-up (2 s on each listener)"
  overhead_wrk "$a" 16384 1 2 "$dir/runs/warm-a.json"
  overhead_wrk "$c" 16384 1 2 "$dir/runs/warm-c.json"
  overhead_wrk "$b" 16384 1 2 "$dir/runs/warm-b.json"
  overhead_wrk "$fn" 16384 1 2 "$dir/runs/warm-n.json"
  overhead_wrk "$fr" 16384 1 2 "$dir/runs/warm-r.json"

  local total=0 n=0 size r mode conn rounds order lis
  local orders=("A C B N R" "C B N R A" "B N R A C" "N R A C B" "R A C B N")
  for size in $sizes; do total=$((total + 5 * (lat_rounds + tput_rounds))); done
  for size in $sizes; do
    for mode in latency throughput; do
      if [ "$mode" = latency ]; then conn=1; rounds=$lat_rounds; else conn=$conns; rounds=$tput_rounds; fi
      for ((r = 1; r <= rounds; r++)); do
        order="${orders[$(((r - 1) % 5))]}"
        for lis in $order; do
          n=$((n + 1))
          progress "$(printf '[%2d/%d] %6d B body, %-10s c=%d, round %d, listener %s' \
            "$n" "$total" "$size" "$mode" "$conn" "$r" "$lis")"
          case "$lis" in A) l=$a ;; B) l=$b ;; C) l=$c ;; N) l=$fn ;; R) l=$fr ;; esac
          overhead_wrk "$l" "$size" "$conn" "$secs" "$dir/runs/$size-$mode-$lis-$r.json" "$px_pid"
        done
      done
    done
  done
  progress_end

  # Every request on A and C went through the filter: its decision counters grew by as many.
  local after; after="$(envoy_stats "$admin" 'wasmcustom.prefix_router.branch' | awk -F': ' '{s+=$2} END{print s+0}')"
  envoy_stats "$admin" 'prefix_router|with_.*downstream_rq_[2-5]xx|without_filter.downstream_rq_[2-5]xx' \
    >"$dir/envoy-stats.txt"
  proc_stop "$px_pid"; proc_stop "$up_pid"; proc_untrack "$px_pid"; proc_untrack "$up_pid"

  "$py" "$BENCH_DIR_SELF/report.py" overhead "$dir" "$ROOT/.work/bench/overhead.json" \
    --decisions $((after - before)) --seconds "$secs" --conns "$conns" \
    --machine "$(machine_line)" --elapsed $((SECONDS - started))
}
