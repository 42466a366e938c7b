#!/usr/bin/env bash
# envoy/envoy-peers.yaml as shipped, run three times side by side (issue 11): one gateway,
# three gateways with peers, three without; the replicas' own hit rates and what the sync
# path answers to a client without the secret and to garbage. ~1 min per arm.
#   scripts/peers-example.sh [one|three|nopeers ...]
# Ports (all loopback): 127.0.0.{1,2,3}:20000 ingress, :25009 sync, :29901 admin; replicas
# 127.0.0.1:28001-28003.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
ensure_envoy
build_wasm 2>&1 | tail -1 >&2
cargo build -q -p replica-emulator
exec python3 scripts/peers-example.py "$PWD" "$(./build.sh envoy)" "$@"
