#!/usr/bin/env bash
# Coverage-guided fuzzing of the routing core: `./build.sh fuzz [SECONDS] [TARGET...]`.
#
#   ./build.sh fuzz              every target for 60 s each
#   ./build.sh fuzz 600 extract  one target for 10 minutes
#   ./build.sh fuzz cmin         minimise fuzz/corpus/<target>/ in place (after long runs)
#
# Targets (fuzz/fuzz_targets/, properties in tests/support/fuzz_props.rs): json_scanner,
# extract, config, prometheus, peers. Each run starts from the committed corpus fuzz/corpus/<target>/
# and writes new inputs to fuzz/work/<target>/ (git-ignored); `cmin` merges both back into a
# minimal fuzz/corpus/<target>/. A crash leaves its input in fuzz/artifacts/<target>/ and fails
# the run. One libFuzzer process at a time (no -jobs/-workers): the machine's cores are shared.
#
# Needs a nightly toolchain (libFuzzer's instrumentation flags) and cargo-fuzz; installs
# cargo-fuzz with `cargo install` when missing and stops with a clear message when no nightly
# toolchain can be installed.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh

ALL_TARGETS=(json_scanner extract config prometheus peers)
MAX_LEN=${FUZZ_MAX_LEN:-16384}

ensure_nightly() {
  if ! rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
    log "rustup toolchain install nightly (cargo-fuzz needs it)"
    rustup toolchain install nightly --profile minimal >&2 || {
      echo "fuzz: no nightly Rust toolchain and 'rustup toolchain install nightly' failed;" \
           "cargo-fuzz (libFuzzer) needs nightly. The corpus is still replayed on stable by" \
           "'cargo test --test fuzz_corpus'." >&2
      exit 1
    }
  fi
}

ensure_cargo_fuzz() {
  if ! cargo fuzz --version >/dev/null 2>&1; then
    log "cargo install cargo-fuzz --locked"
    cargo install cargo-fuzz --locked >&2
  fi
}

ensure_nightly
ensure_cargo_fuzz

mode=run
secs=60
if [ "${1:-}" = cmin ]; then mode=cmin; shift; fi
if [[ "${1:-}" =~ ^[0-9]+$ ]]; then secs=$1; shift; fi
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=("${ALL_TARGETS[@]}")

cd fuzz
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t" "work/$t" "artifacts/$t"
  if [ "$mode" = cmin ]; then
    log "cargo fuzz cmin $t"
    # Merge the committed corpus and the working one into a fresh minimal set: the smallest
    # set of inputs covering every edge (set cover, hit counts ignored) keeps the committed
    # corpus at a few hundred files.
    cargo +nightly fuzz build --release "$t" >&2
    host="$(rustc -vV | sed -n 's/^host: //p')"
    rm -rf "work/$t.min" && mkdir -p "work/$t.min"
    "target/$host/release/$t" -set_cover_merge=1 -use_counters=0 -max_len="$MAX_LEN" \
      "work/$t.min" "corpus/$t" "work/$t" >&2
    rm -rf "corpus/$t" && mv "work/$t.min" "corpus/$t"
    log "$t: $(ls "corpus/$t" | wc -l) files, $(du -sh "corpus/$t" | cut -f1)"
  else
    log "cargo fuzz run $t for ${secs}s"
    cargo +nightly fuzz run "$t" --release "work/$t" "corpus/$t" -- \
      -max_total_time="$secs" -max_len="$MAX_LEN" -print_final_stats=1 >&2
  fi
done
