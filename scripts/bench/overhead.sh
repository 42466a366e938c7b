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
#     listener U (+14) = as C with read_usage: false (responses not scanned: the usage feature's cost)
#     listener B (+2) = router only
#     listener N (+11) = floor: no-op proxy-wasm filter + router (scripts/bench/floor, "noop")
#     listener R (+12) = floor: pause, buffer and read the body, nothing else + router ("read")
#     listener H (+13) = floor: "read" + the host calls of one affinity request, no routing work
#       ("hostcalls"; only `./build.sh bench profile` drives it)
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

# floor_h_mode UPSTREAM_PORT — the H floor's configuration from OVERHEAD_FLOOR_H: unset =
# "hostcalls"; "override ..." = the real target header with the first upstream address; anything
# else verbatim, e.g. "hostcalls extra=shared_get*20" or "hostcalls skip=header_set" (pricing
# modifiers, see scripts/bench/floor/lib.rs).
floor_h_mode() {
  local m="${OVERHEAD_FLOOR_H:-hostcalls}"
  case "$m" in
    override*) echo "override=127.0.0.1:$1${m#override}" ;;
    *) echo "$m" ;;
  esac
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

# overhead_start DIR — render the two Envoy configs into DIR and start them (all five listeners),
# check every listener answers a chat POST and the filter counted it. Sets OV_ADMIN, OV_A, OV_B,
# OV_C, OV_U, OV_N, OV_R, OV_H (listener ports), OV_UP_PID, OV_PX_PID and OV_BEFORE (decisions so far).
overhead_start() {
  local dir="$1"
  local base="${BENCH_PORT_BASE:-19400}"
  OV_ADMIN=$base OV_A=$((base + 1)) OV_B=$((base + 2)) OV_C=$((base + 3)) OV_N=$((base + 11)) OV_R=$((base + 12))
  OV_H=$((base + 13)) OV_U=$((base + 14))
  local up=$((base + 4)) ups=() eps=() i
  for ((i = 0; i < 7; i++)); do ups+=("UP$((i + 1))=$((up + i))"); eps+=("\"127.0.0.1:$((up + i))\""); done
  local endpoints; endpoints="$(IFS=,; echo "${eps[*]}")"

  ensure_wrk
  local wasm="${OVERHEAD_WASM:-$WASM}" strategy_a=prefix
  [ -z "${OVERHEAD_COMPARE_WASM:-}" ] || strategy_a=affinity
  [ -f "$wasm" ] || build_wasm
  build_floor
  rm -rf "$dir"; mkdir -p "$dir/runs"
  require_free_ports "$OV_ADMIN" "$OV_A" "$OV_B" "$OV_C" "$OV_U" "$OV_N" "$OV_R" "$OV_H" $(seq "$up" $((up + 6)))

  log "overhead: upstream Envoy (direct_response) on :$up-$((up + 6)); Envoy under test: A :$OV_A $strategy_a, C :$OV_C affinity, U :$OV_U affinity read_usage off, B :$OV_B no filter, N :$OV_N no-op wasm, R :$OV_R pause+read wasm"
  render "$BENCH_DIR_SELF/overhead-upstream.yaml.tmpl" "$dir/upstream.yaml" "${ups[@]}"
  render "$BENCH_DIR_SELF/overhead-proxy.yaml.tmpl" "$dir/proxy.yaml" "${ups[@]}" \
    "ADMIN_PORT=$OV_ADMIN" "PORT_A=$OV_A" "PORT_B=$OV_B" "PORT_C=$OV_C" "PORT_U=$OV_U" "PORT_N=$OV_N" "PORT_R=$OV_R" "PORT_H=$OV_H" \
    "WASM=$wasm" "FLOOR_WASM=$FLOOR_WASM" "ENDPOINTS=$endpoints" \
    "FLOOR_H_MODE=$(floor_h_mode "$up")" \
    "WASM_A=${OVERHEAD_COMPARE_WASM:-$wasm}" "STRATEGY_A=$strategy_a"
  start_envoy upstream "$dir/upstream.yaml" "$dir/upstream.log" --concurrency 1
  OV_UP_PID=$LAST_PID
  # shellcheck disable=SC2086  # OV_PROXY_ARGS: extra Envoy flags, word-split on purpose
  start_envoy proxy "$dir/proxy.yaml" "$dir/proxy.log" --concurrency 1 ${OV_PROXY_ARGS:-}
  OV_PX_PID=$LAST_PID
  wait_http "http://127.0.0.1:$up/" 30 "$OV_UP_PID" || { tail -20 "$dir/upstream.log" >&2; return 1; }
  wait_http "http://127.0.0.1:$OV_ADMIN/ready" 30 "$OV_PX_PID" || { tail -20 "$dir/proxy.log" >&2; return 1; }
  wait_http "http://127.0.0.1:$OV_A/" 10 "$OV_PX_PID" || { tail -20 "$dir/proxy.log" >&2; return 1; }

  # Sanity: every listener answers 200 to a chat POST, and A, C and U really ran the filter.
  local l code
  for l in "$OV_A" "$OV_B" "$OV_C" "$OV_U" "$OV_N" "$OV_R" "$OV_H"; do
    code="$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 -H 'content-type: application/json' \
      -d '{"model":"m","messages":[{"role":"user","content":"hello"}]}' "http://127.0.0.1:$l/v1/chat/completions")"
    [ "$code" = 200 ] || { echo "error: listener :$l answered $code, expected 200" >&2; tail -20 "$dir/proxy.log" >&2; return 1; }
  done
  OV_BEFORE="$(envoy_stats "$OV_ADMIN" 'wasmcustom.prefix_router.branch' | awk -F': ' '{s+=$2} END{print s+0}')"
  # (A compare build may be an ablation that never routes: then only C and U count.)
  local want=3
  [ -z "${OVERHEAD_COMPARE_WASM:-}" ] || want=2
  [ "$OV_BEFORE" -ge "$want" ] || { echo "error: the filter counted $OV_BEFORE decisions for 3 requests on A, C and U" >&2; return 1; }
}

bench_overhead() {
  local secs="${OVERHEAD_SECONDS:-2}" lat_rounds="${OVERHEAD_LAT_ROUNDS:-5}"
  local tput_rounds="${OVERHEAD_TPUT_ROUNDS:-2}" conns="${OVERHEAD_TPUT_CONNS:-8}"
  local sizes="${OVERHEAD_SIZES:-1024 16384 65536 262144}"
  local dir="$ROOT/.work/bench/overhead" started=$SECONDS
  local py; py="$(bench_python)"
  # Other jobs on the machine ruin latency figures: the load average goes into the report.
  local load_start; load_start="$(cut -d' ' -f1-3 /proc/loadavg)"
  overhead_start "$dir" || return 1
  local admin=$OV_ADMIN a=$OV_A b=$OV_B c=$OV_C u=$OV_U fn=$OV_N fr=$OV_R
  local up_pid=$OV_UP_PID px_pid=$OV_PX_PID before=$OV_BEFORE l

  log "overhead: warm-up (2 s on each listener)"
  overhead_wrk "$a" 16384 1 2 "$dir/runs/warm-a.json"
  overhead_wrk "$c" 16384 1 2 "$dir/runs/warm-c.json"
  overhead_wrk "$u" 16384 1 2 "$dir/runs/warm-u.json"
  overhead_wrk "$b" 16384 1 2 "$dir/runs/warm-b.json"
  overhead_wrk "$fn" 16384 1 2 "$dir/runs/warm-n.json"
  overhead_wrk "$fr" 16384 1 2 "$dir/runs/warm-r.json"

  local total=0 n=0 size r mode conn rounds order lis
  local orders=("A C U B N R" "C U B N R A" "U B N R A C" "B N R A C U" "N R A C U B" "R A C U B N")
  for size in $sizes; do total=$((total + 6 * (lat_rounds + tput_rounds))); done
  for size in $sizes; do
    for mode in latency throughput; do
      if [ "$mode" = latency ]; then conn=1; rounds=$lat_rounds; else conn=$conns; rounds=$tput_rounds; fi
      for ((r = 1; r <= rounds; r++)); do
        order="${orders[$(((r - 1) % 6))]}"
        for lis in $order; do
          n=$((n + 1))
          progress "$(printf '[%2d/%d] %6d B body, %-10s c=%d, round %d, listener %s' \
            "$n" "$total" "$size" "$mode" "$conn" "$r" "$lis")"
          case "$lis" in A) l=$a ;; B) l=$b ;; C) l=$c ;; U) l=$u ;; N) l=$fn ;; R) l=$fr ;; esac
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
    --machine "$(machine_line); load average (1/5/15 min) $load_start at the start, $(cut -d' ' -f1-3 /proc/loadavg) at the end" \
    --elapsed $((SECONDS - started))
}

# bench_profile (`./build.sh bench profile`) — where the Envoy CPU per request goes, per listener:
# perf samples the Envoy under test (software cpu-clock event: no hardware counters needed) while
# wrk drives one listener at a time (c=8, PROFILE_SIZE bytes, default 16384; PROFILE_SECONDS per
# run, default 4; PROFILE_ROUNDS rounds, default 3, listeners interleaved; PROFILE_CONNS
# connections, default 8). Per request it reports the Envoy CPU, the part with a wasm (V8 JIT) frame on the stack (the filter's code plus
# the host calls it makes, body copy included) and the wasm code alone (JIT self). Envoy is
# stripped, so host calls are not split by name; the floor listeners separate the parts: no-op
# wasm, pause+read, and pause+read plus the very host calls of an affinity request (H).
# PROFILE_LISTENERS="read hostcalls" profiles only those listeners (names as in the table);
# OVERHEAD_FLOOR_H sets the H floor's mode (pricing one kind of host call: floor_h_mode).
# OVERHEAD_COMPARE_WASM=<other .wasm> puts that build (strategy affinity) on listener A, shown
# as `compare`: two builds measured in the same Envoy, interleaved (a fair before/after).
bench_profile() {
  local size="${PROFILE_SIZE:-16384}" secs="${PROFILE_SECONDS:-4}" rounds="${PROFILE_ROUNDS:-3}"
  local conns="${PROFILE_CONNS:-8}"
  local dir="$ROOT/.work/bench/profile" r x name port
  if ! command -v perf >/dev/null 2>&1; then
    log "installing perf (Debian package linux-perf)"
    apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq linux-perf >&2
  fi
  overhead_start "$dir" || return 1
  local a_name=prefix
  [ -z "${OVERHEAD_COMPARE_WASM:-}" ] || a_name=compare
  # The order rotates every round (A C U B N R H, C U B N R H A, ...): a fixed order showed a
  # position effect (the listener right after A measured ~20 µs more in wasm frames with the
  # same build on both) that would bias before/after comparisons.
  local list=("$a_name:$OV_A" "affinity:$OV_C" "nousage:$OV_U" "none:$OV_B" "noop:$OV_N" "read:$OV_R" "hostcalls:$OV_H") i
  if [ -n "${PROFILE_LISTENERS:-}" ]; then
    # A subset by name (e.g. "read hostcalls" to price host calls with OVERHEAD_FLOOR_H).
    local keep=() y
    for y in "${list[@]}"; do [[ " $PROFILE_LISTENERS " == *" ${y%%:*} "* ]] && keep+=("$y"); done
    list=("${keep[@]}")
  fi
  for x in "${list[@]}"; do
    overhead_wrk "${x#*:}" "$size" "$conns" 2 "$dir/runs/warm-${x%%:*}.json"
  done
  for ((r = 1; r <= rounds; r++)); do
    for ((i = 0; i < ${#list[@]}; i++)); do
      x="${list[$(((i + r - 1) % ${#list[@]}))]}"
      name="${x%%:*}" port="${x#*:}"
      progress "profile round $r/$rounds: $name ($size B, c=$conns, ${secs} s)"
      run_tracked perf perf record -q -g -e cpu-clock -F 2000 -p "$OV_PX_PID" \
        -o "$dir/runs/$name-$r.perf" -- sleep "$secs" >/dev/null 2>&1 &
      overhead_wrk "$port" "$size" "$conns" "$secs" "$dir/runs/$name-$r.json"
      wait
      perf report -i "$dir/runs/$name-$r.perf" --stdio --no-children --sort dso -n 2>/dev/null \
        >"$dir/runs/$name-$r.self.txt"
      perf report -i "$dir/runs/$name-$r.perf" --stdio --children --sort dso 2>/dev/null \
        >"$dir/runs/$name-$r.children.txt"
    done
  done
  progress_end
  proc_stop "$OV_PX_PID"; proc_stop "$OV_UP_PID"; proc_untrack "$OV_PX_PID"; proc_untrack "$OV_UP_PID"
  "$(bench_python)" - "$dir/runs" "$size" "$conns" <<'PY'
import glob, json, os, re, statistics, sys
runs, size, conns = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rows = {}
for path in sorted(glob.glob(os.path.join(runs, "*-*.json"))):
    name, r = os.path.basename(path)[:-5].rsplit("-", 1)
    if name == "warm" or not r.isdigit():
        continue
    run = json.load(open(path))
    req = run["requests"]
    rps = req / (run["duration_us"] / 1e6)
    samples, jit_self = 0, 0
    for line in open(path[:-5] + ".self.txt"):
        m = re.match(r"\s+[\d.]+%\s+(\d+)\s+(.*)", line)
        if m:
            samples += int(m.group(1))
            jit_self += int(m.group(1)) if "[JIT]" in m.group(2) else 0
    jit_incl = 0.0
    for line in open(path[:-5] + ".children.txt"):
        m = re.match(r"\s+([\d.]+)%\s+[\d.]+%\s+(.*)", line)
        if m and "[JIT]" in m.group(2):
            jit_incl = float(m.group(1)) / 100
            break
    us = samples * 500 / req  # 2000 Hz: one sample = 500 us
    rows.setdefault(name, []).append((us, us * jit_incl, jit_self * 500 / req, rps))
med = {n: [statistics.median(v[i] for v in vs) for i in range(4)] for n, vs in rows.items()}
print(f"Envoy CPU per request at {size} B, c={conns} (perf cpu-clock, median of {len(next(iter(rows.values())))} rounds):")
print()
print("| listener | Envoy CPU/request | in wasm + host calls | wasm code alone | above pause+read (total / wasm+host / wasm) | requests/s |")
print("|---|---:|---:|---:|---:|---:|")
base = med.get("read")
for n in ("none", "noop", "read", "hostcalls", "prefix", "compare", "affinity", "nousage"):
    if n not in med:
        continue
    t, inc, self_, rps = med[n]
    above = (f"{t - base[0]:+.0f} / {inc - base[1]:+.0f} / {self_ - base[2]:+.0f} µs" if base else "-")
    print(f"| {n} | {t:.0f} µs | {inc:.0f} µs | {self_:.0f} µs | {above} | {rps:.0f} |")
if "compare" in rows and "affinity" in rows:
    # Paired: the same round's compare − affinity (both interleaved), then the median.
    n = min(len(rows["compare"]), len(rows["affinity"]))
    d = [[rows["compare"][i][j] - rows["affinity"][i][j] for i in range(n)] for j in range(4)]
    print()
    print("compare − affinity, per round (total / wasm+host / wasm µs, requests/s): "
          + "; ".join(f"{d[0][i]:+.0f} / {d[1][i]:+.0f} / {d[2][i]:+.0f}, {d[3][i]:+.0f}" for i in range(n))
          + f"; median {statistics.median(d[0]):+.0f} / {statistics.median(d[1]):+.0f} / "
          + f"{statistics.median(d[2]):+.0f} µs, {statistics.median(d[3]):+.0f} rps")
PY
}

# bench_hostcalls (`./build.sh bench hostcalls`) — host calls per request, by kind, for each
# prefix-router listener (A prefix, C affinity, U affinity with read_usage off): the Envoy under
# test runs with `--component-log-level wasm:debug` and the filter writes, at the end of each
# request, the host calls its VM made since the previous such line (src/filter/tally.rs). wrk
# drives one listener at a time for HOSTCALLS_SECONDS (default 3) with HOSTCALLS_SIZE-byte bodies
# (default 16384, 64 distinct prefixes): with c=1 each line is exactly one request (the table
# shows the most common tally and its share: the first requests of a VM define metrics, a miss
# writes more index slots than a hit); with c=8 the lines sum to the calls of all requests, so
# the mean per request shows what batching saves under load. Counts do not depend on machine
# load (only the number of requests does).
bench_hostcalls() {
  local size="${HOSTCALLS_SIZE:-16384}" secs="${HOSTCALLS_SECONDS:-3}"
  local dir="$ROOT/.work/bench/hostcalls" x conns
  OV_PROXY_ARGS="--component-log-level wasm:debug" overhead_start "$dir" || return 1
  : >"$dir/marks"
  for conns in 1 8; do
    for x in "prefix_router:$OV_A" "prefix_router_affinity:$OV_C" "prefix_router_affinity_nousage:$OV_U"; do
      progress "host calls: ${x%%:*} ($size B, c=$conns, ${secs} s)"
      echo "$conns ${x%%:*} $(wc -l <"$dir/proxy.log")" >>"$dir/marks"
      overhead_wrk "${x#*:}" "$size" "$conns" "$secs" "$dir/runs/${x%%:*}-c$conns.json"
      sleep 0.5
      echo "end - $(wc -l <"$dir/proxy.log")" >>"$dir/marks"
    done
  done
  progress_end
  proc_stop "$OV_PX_PID"; proc_stop "$OV_UP_PID"; proc_untrack "$OV_PX_PID"; proc_untrack "$OV_UP_PID"
  "$(bench_python)" - "$dir" "$size" <<'PY'
import collections, json, os, re, sys
d, size = sys.argv[1], int(sys.argv[2])
lines = open(os.path.join(d, "proxy.log"), errors="replace").read().splitlines()
marks = [l.split() for l in open(os.path.join(d, "marks"))]
names = {"prefix_router": "prefix", "prefix_router_affinity": "affinity",
         "prefix_router_affinity_nousage": "affinity, read_usage off"}
rows = []
for (conns, vm, start), (_, _, end) in zip(marks[::2], marks[1::2]):
    tallies = []
    for line in lines[int(start):int(end)]:
        m = re.search(r" (\S+): prefix-router: #\d+ host calls: (.*)$", line)
        if m and m.group(1) == vm:
            tallies.append(dict(kv.split("=") for kv in m.group(2).split()))
    req = json.load(open(os.path.join(d, "runs", f"{vm}-c{conns}.json")))["requests"]
    rows.append((names[vm], int(conns), tallies, req))
print(f"Host calls per request at {size} B body (wrk; c=1: most common tally and its share of "
      "requests; c=8: all calls / requests):")
print()
print("| listener | c | requests | host calls per request | by kind |")
print("|---|---:|---:|---:|---|")
for label, conns, tallies, req in rows:
    if not tallies:
        print(f"| {label} | {conns} | {req} | - | no tally lines (is wasm debug logging on?) |")
        continue
    if conns == 1:
        key = collections.Counter(tuple(sorted(t.items())) for t in tallies).most_common(1)[0]
        t, n = dict(key[0]), key[1]
        kinds = " ".join(f"{k}={v}" for k, v in t.items() if k != "total")
        print(f"| {label} | 1 | {len(tallies)} | {t['total']} ({n / len(tallies):.0%} of requests) | {kinds} |")
    else:
        sums = collections.Counter()
        for t in tallies:
            sums.update({k: int(v) for k, v in t.items()})
        n = max(len(tallies), 1)
        kinds = " ".join(f"{k}={v / n:.2f}" for k, v in sums.items() if k != "total")
        print(f"| {label} | {conns} | {n} | {sums['total'] / n:.2f} | {kinds} |")
PY
}

# bench_price (`./build.sh bench price`) — the price of one host call, by kind: for each kind K
# in PRICE_KINDS, one `bench profile` of the pause+read floor R and the hostcalls floor H with
# PRICE_EXTRA (default 20) more calls of K per request (OVERHEAD_FLOOR_H="hostcalls
# extra=K*N"), plus one of H as is; (H_K - H) / N is the price of one call of K, in Envoy CPU
# and in wasm frames (each figure the median of PROFILE_ROUNDS, default 5, interleaved R/H
# rounds; R is measured alongside every time to show the drift). Then every `skip=K` run:
# H - H_skip is what the calls of K cost in an affinity request as it is made today.
# Results: .work/bench/price/price.md (also printed).
bench_price() {
  local -; set -f  # the modes contain "*"
  local n="${PRICE_EXTRA:-20}" k mode out="$ROOT/.work/bench/price"
  local kinds="${PRICE_KINDS:-header_set header_set_fresh header_remove header_get buffer_get property_get property_set shared_get shared_get_big shared_set metric_increment metric_record clock}"
  local skips="${PRICE_SKIPS:-}"
  mkdir -p "$out"; : >"$out/raw.txt"
  for mode in "hostcalls" $(for k in $kinds; do echo "hostcalls_extra=$k*$n"; done) \
    $(for k in $skips; do echo "hostcalls_skip=$k"; done); do
    progress "price: $mode"
    OVERHEAD_FLOOR_H="${mode/_/ }" PROFILE_LISTENERS="read hostcalls" \
      PROFILE_ROUNDS="${PROFILE_ROUNDS:-5}" bench_profile >"$out/last.txt" || return 1
    echo "$mode $(grep -E '^\| (read|hostcalls) \|' "$out/last.txt" | tr '\n' ' ')" >>"$out/raw.txt"
  done
  progress_end
  "$(bench_python)" - "$out/raw.txt" "$n" <<'PY' | tee "$out/price.md"
import re, sys
raw, n = sys.argv[1], int(sys.argv[2])
rows = {}
for line in open(raw):
    mode, rest = line.split(" ", 1)
    vals = {}
    for m in re.finditer(r"\| (read|hostcalls) \| (\d+) µs \| (\d+) µs \| (\d+) µs", rest):
        vals[m.group(1)] = tuple(int(m.group(i)) for i in (2, 3, 4))
    rows[mode] = vals
def above(v):  # H - R of one run: the drift between runs cancels
    r, h = v.get("read"), v.get("hostcalls")
    return (h[0] - r[0], h[1] - r[1]) if r and h else None
base = above(rows.get("hostcalls", {}))
print(f"Price of one host call (16 KiB, c=8; µs of Envoy CPU per request, total / in wasm frames;")
print(f"H - R of each run, so drift between runs cancels; extra: ((H_K - R) - (H - R)) / {n}):")
print()
print("| H mode | R | H | H - R | per call (extra) or the kind's calls (skip) |")
print("|---|---:|---:|---:|---:|")
for mode, v in rows.items():
    a = above(v)
    if not (a and base):
        continue
    r, h = v["read"], v["hostcalls"]
    per = "-"
    if "extra=" in mode:
        per = f"{(a[0] - base[0]) / n:+.1f} / {(a[1] - base[1]) / n:+.1f}"
    elif "skip=" in mode:
        per = f"{base[0] - a[0]:+d} / {base[1] - a[1]:+d}"
    print(f"| `{mode.replace('_', ' ', 1)}` | {r[0]} / {r[1]} | {h[0]} / {h[1]} | {a[0]:+d} / {a[1]:+d} | {per} |")
PY
}
