# Process and HTTP helpers shared by scripts/bench.sh and scripts/demo.sh. Source it after
# scripts/common.sh; do not run it.
#
# Every process started through these helpers is recorded (PID + name) and stopped by PID in
# `proc_stop_all`, which the caller installs as its EXIT/INT/TERM trap (`proc_install_trap`).
# Envoy is started from a subshell (`( setsid envoy ... & )`): an Envoy started in the
# background of a shell that later exits gets SIGTERM (notes/envoy-facts.md §0), so the subshell
# exits at once and we keep the PID it printed. Nothing here binds a non-loopback address.

# shellcheck disable=SC2034  # used by the scripts that source this file
BENCH_DIR_SELF="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PROC_PIDS=()
PROC_NAMES=()
RUN_DIR="${RUN_DIR:-}"

# proc_track PID NAME — remember a process to stop later.
proc_track() { PROC_PIDS+=("$1"); PROC_NAMES+=("$2"); }

# proc_alive PID — true while the process exists and is not a zombie.
proc_alive() {
  local st
  st="$(ps -o stat= -p "$1" 2>/dev/null)" || return 1
  [ -n "$st" ] && [ "${st:0:1}" != Z ]
}

# proc_stop PID [GRACE_SECONDS] — SIGTERM, wait up to GRACE (default 5 s), then SIGKILL.
proc_stop() {
  local pid="$1" grace="${2:-5}" i
  proc_alive "$pid" || { wait "$pid" 2>/dev/null || true; return 0; }
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < grace * 20; i++)); do
    proc_alive "$pid" || break
    sleep 0.05
  done
  if proc_alive "$pid"; then kill -KILL "$pid" 2>/dev/null || true; sleep 0.1; fi
  # Reap our own children (a no-op for subshell-started Envoy). Not inside the exit trap: a
  # `wait` there, after a Ctrl-C interrupted another `wait`, was seen to block forever on a
  # child that had already exited; the process is gone either way (a zombie at most, reaped
  # by init when the script exits).
  [ -n "${PROC_IN_TRAP:-}" ] || wait "$pid" 2>/dev/null || true
}

# proc_stop_named NAME — stop every tracked process whose name starts with NAME.
proc_stop_named() {
  local i
  for i in "${!PROC_PIDS[@]}"; do
    if [[ "${PROC_NAMES[$i]}" == "$1"* ]]; then
      proc_stop "${PROC_PIDS[$i]}"
      unset 'PROC_PIDS[i]' 'PROC_NAMES[i]'
    fi
  done
  PROC_PIDS=("${PROC_PIDS[@]}"); PROC_NAMES=("${PROC_NAMES[@]}")
}

# proc_stop_all — stop everything tracked, newest first (load generators before servers).
proc_stop_all() {
  local i
  for ((i = ${#PROC_PIDS[@]} - 1; i >= 0; i--)); do
    proc_stop "${PROC_PIDS[$i]}" 3
  done
  PROC_PIDS=(); PROC_NAMES=()
}

# proc_install_trap — stop everything on exit, Ctrl-C or SIGTERM; keep the exit status.
# On INT/TERM the handler exits 130/143 so the script does not go on after cleaning up.
proc_install_trap() {
  trap 'rc=$?; trap - EXIT INT TERM; PROC_IN_TRAP=1; proc_stop_all; exit $rc' EXIT
  trap 'echo >&2; log "interrupted: stopping everything this script started"; exit 130' INT
  trap 'exit 143' TERM
}

# port_busy PORT — true if something accepts TCP connections on 127.0.0.1:PORT.
port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# require_free_ports PORT... — fail with a clear message if any port is taken.
require_free_ports() {
  local p busy=()
  for p in "$@"; do port_busy "$p" && busy+=("$p"); done
  if [ "${#busy[@]}" -gt 0 ]; then
    echo "error: port(s) ${busy[*]} on 127.0.0.1 already in use (another demo/bench/test running?)" >&2
    return 1
  fi
}

# render TEMPLATE OUT KEY=VALUE... — copy TEMPLATE to OUT replacing @KEY@ with VALUE.
render() {
  local tmpl="$1" out="$2" kv expr=()
  shift 2
  for kv in "$@"; do expr+=(-e "s|@${kv%%=*}@|${kv#*=}|g"); done
  sed "${expr[@]}" "$tmpl" >"$out"
  if grep -q '@[A-Z_]*@' "$out"; then
    echo "error: unrendered placeholder in $out: $(grep -o '@[A-Z_]*@' "$out" | sort -u | tr '\n' ' ')" >&2
    return 1
  fi
}

# start_envoy NAME CONFIG LOGFILE [EXTRA_ARGS...] — start Envoy in the background (subshell,
# new session), track its PID and put it in LAST_PID (not printed: a $(...) caller would track
# it in a subshell). Hot restart is disabled so several Envoys can run on one machine without
# base-id clashes.
start_envoy() {
  local name="$1" cfg="$2" logf="$3" pidf pid
  shift 3
  pidf="$(mktemp)"
  ( setsid "$ENVOY_BIN" -c "$cfg" --disable-hot-restart --log-level warn "$@" \
      >"$logf" 2>&1 </dev/null & echo $! >"$pidf" )
  pid="$(cat "$pidf")"; rm -f "$pidf"
  proc_track "$pid" "$name"
  # shellcheck disable=SC2034  # read by the caller
  LAST_PID="$pid"
}

# run_tracked NAME CMD... — run CMD in the background, track it and wait for it; returns its
# status. Unlike a foreground command, the wait is cut short by Ctrl-C/SIGTERM sent to the
# script alone, and the trap then stops CMD by PID.
run_tracked() {
  local name="$1" pid rc=0
  shift
  "$@" &
  pid=$!
  proc_track "$pid" "$name"
  wait "$pid" || rc=$?
  proc_untrack "$pid"
  return "$rc"
}

# proc_untrack PID — forget a process that has ended.
proc_untrack() {
  local i
  for i in "${!PROC_PIDS[@]}"; do
    [ "${PROC_PIDS[$i]}" = "$1" ] && unset 'PROC_PIDS[i]' 'PROC_NAMES[i]'
  done
  PROC_PIDS=("${PROC_PIDS[@]}"); PROC_NAMES=("${PROC_NAMES[@]}")
}

# wait_http URL TIMEOUT_S [PID] — wait until URL answers (any HTTP status); fail early if PID died.
wait_http() {
  local url="$1" timeout="$2" pid="${3:-}" i
  for ((i = 0; i < timeout * 10; i++)); do
    if curl -s -o /dev/null --max-time 1 "$url"; then return 0; fi
    if [ -n "$pid" ] && ! proc_alive "$pid"; then return 1; fi
    sleep 0.1
  done
  return 1
}

# envoy_stats ADMIN_PORT FILTER — counter/gauge lines "name: value" matching FILTER (regex).
envoy_stats() {
  curl -s --max-time 5 "http://127.0.0.1:$1/stats?filter=$2"
}

# machine_line — "N cores, CPU model" for benchmark reports.
machine_line() {
  local model
  model="$(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//')"
  echo "$(nproc) cores, ${model:-unknown CPU}, $(uname -sr)"
}

# bench_python — a Python 3 for the small JSON/table helpers (the project venv if present).
bench_python() {
  if [ -x "$VENV/bin/python" ]; then echo "$VENV/bin/python"; else command -v python3; fi
}

# progress TEXT — one status line: rewritten in place on a terminal, one line per call otherwise.
progress() {
  if [ -t 2 ]; then printf '\r\033[K  %s' "$*" >&2; else printf '  %s\n' "$*" >&2; fi
}
# progress_end — finish the in-place status line.
progress_end() { if [ -t 2 ]; then printf '\n' >&2; fi; }
