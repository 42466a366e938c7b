#!/usr/bin/env bash
# The simulator's out-of-sample loop (issue 9): every trace set of docs/routing-quality.md,
# regenerated from its seeds, run once per trace seed, and the criterion per set.
#
#   scripts/quality-loop.sh [OUT] [SETS]          (OUT: .work/quality; SETS: all)
#
# SETS (comma-separated): accept (heldout 21-28 at 7/16/32, nsblocks 21-28 at 7, time scale 0.35),
# ns (nsblocks 31-50 at seven loads), oos (agent, bursty, uniqmix 1-3 at 7/16/32), longdoc (1-6 at
# 7/16/32; oosgen.py families at time scale 0.3 / 0.15 / 0.12 / 0.2 x 7 / N),
# heldload (heldout 21-28 at 7 x 0.15 and 0.08), shipped (the workspace's Mooncake conversation
# trace at 7/16/32, seeds 1-5; SHIPPED_TRACE=FILE, by default ../shared/traces/...), public (Mooncake's FAST25 synthetic_trace.jsonl at 7/16/32, seeds 1-5; needs
# PUBLIC_TRACE=FILE, skipped without it), fresh (agent/bursty/uniqmix 4-6, nsblocks 51-54:
# seeds no rule was tuned on), fresh2 (heldout 31-38 at 7/16/32, nsblocks 55-62 at three loads,
# uniqmix/agent 7-8).
#
# POLICIES (env) is what each run simulates: every baseline and `ours` by default; set it to
# e.g. "ours:ways=4" to run a variant only, in another OUT, and compare the two with
#   python3 examples/simulate/criterion.py --ours 'ours:ways=4' OUT/set/*.json OUT2/set/*.json
# (criterion.py merges the rows of one case from several files by policy name).
# A run is `simulate --seeds 1` (one secret per trace seed); traces are written once under
# OUT/traces. Runs already in OUT are kept (delete OUT to start again). Prints one criterion
# table per set and writes OUT/summary.md. 2 cores: about 26 min for every set.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-.work/quality}
SETS=${2:-all}
POLICIES=${POLICIES:-}
mkdir -p "$OUT/traces"
cargo build --release --example simulate >&2
SIM=target/release/examples/simulate
GEN=examples/simulate/oosgen.py

want() { [[ ",$SETS," == *",all,"* || ",$SETS," == *",$1,"* ]]; }

# trace KIND SEED -> path (generated once)
trace() {
  local kind=$1 seed=$2 f="$OUT/traces/$1-$2.jsonl"
  if [[ ! -s $f ]]; then
    case $kind in
      heldout | nsblocks) $SIM --gen-trace "$kind" --seed "$seed" --out "$f" >/dev/null ;;
      *) python3 "$GEN" "$kind" "$seed" "$f" >/dev/null ;;
    esac
  fi
  echo "$f"
}

# run SET NAME TRACE REPLICAS SCALE [SEED]: one simulate run, kept as OUT/SET/NAME.json
run() {
  local set=$1 name=$2 tr=$3 n=$4 scale=$5 seed=${6:-1}
  local f="$OUT/$set/$name.json"
  mkdir -p "$OUT/$set"
  [[ -s $f ]] && return 0
  local pol=()
  [[ -n $POLICIES ]] && pol=(--policies "$POLICIES")
  $SIM --workload trace --trace "$tr" --replicas "$n" --time-scale "$scale" \
    --seed "$seed" --seeds 1 "${pol[@]}" --json "$f" >/dev/null 2>"$f.log" ||
    { echo "FAILED: $set/$name (see $f.log)" >&2; rm -f "$f"; }
}

scale_for() { # trace time scale for N replicas: the 7-replica scale of KIND (or a number) x 7 / N
  local t7=$1
  case $t7 in agent) t7=0.3 ;; bursty) t7=0.15 ;; uniqmix) t7=0.12 ;; longdoc) t7=0.2 ;; esac
  python3 -c "import sys; print(round(float(sys.argv[1]) * 7 / int(sys.argv[2]), 4))" "$t7" "$2"
}

if want accept; then
  for s in 21 22 23 24 25 26 27 28; do
    for n in 7 16 32; do run accept "heldout-$s-$n" "$(trace heldout $s)" $n 0.35; done
    run accept "nsblocks-$s-7" "$(trace nsblocks $s)" 7 0.35
  done
fi
if want ns; then
  for s in $(seq 31 50); do
    tr=$(trace nsblocks "$s")
    for load in 7:0.35 16:0.35 32:0.35 16:0.153 32:0.0766 7:0.15 7:0.08; do
      n=${load%%:*} sc=${load#*:}
      run "ns-$n-$sc" "nsblocks-$s-$n" "$tr" "$n" "$sc"
    done
  done
fi
if want oos; then
  for k in agent bursty uniqmix; do
    for s in 1 2 3; do
      for n in 7 16 32; do run oos "$k-$s-$n" "$(trace $k $s)" $n "$(scale_for $k $n)"; done
    done
  done
fi
if want longdoc; then
  for s in 1 2 3 4 5 6; do
    for n in 7 16 32; do run longdoc "longdoc-$s-$n" "$(trace longdoc $s)" $n "$(scale_for longdoc $n)"; done
  done
fi
if want heldload; then
  for s in 21 22 23 24 25 26 27 28; do
    for sc in 0.15 0.08; do run "heldout-7-$sc" "heldout-$s-7" "$(trace heldout $s)" 7 $sc; done
  done
fi
# mooncake SET FILE: a Mooncake trace at 7/16/32 replicas (0.35 x 7 / N), secret seeds 1-5
mooncake() {
  local set=$1 tr=$2 s load n sc
  if [[ -z $tr || ! -s $tr ]]; then
    echo "$set: no trace (${tr:-unset}; set ${3}=FILE); skipped" >&2
    return 0
  fi
  for s in 1 2 3 4 5; do
    for load in 7:0.35 16:0.153 32:0.0766; do
      n=${load%%:*} sc=${load#*:}
      run "$set" "$set-$s-$n" "$tr" "$n" "$sc" "$s"
    done
  done
}
if want shipped; then
  mooncake shipped "${SHIPPED_TRACE:-../shared/traces/mooncake_conversation_trace.jsonl}" SHIPPED_TRACE
fi
if want public; then mooncake public "${PUBLIC_TRACE:-}" PUBLIC_TRACE; fi
if want fresh; then
  for k in agent:4 agent:5 agent:6 bursty:4 bursty:5 uniqmix:4 uniqmix:5; do
    for n in 7 16 32; do run fresh "${k%%:*}-${k#*:}-$n" "$(trace ${k%%:*} ${k#*:})" $n "$(scale_for ${k%%:*} $n)"; done
  done
  for s in 51 52 53 54; do
    for load in 7:0.35 16:0.153; do
      n=${load%%:*} sc=${load#*:}
      run "fresh-ns-$n" "nsblocks-$s-$n" "$(trace nsblocks $s)" "$n" "$sc"
    done
  done
fi
if want fresh2; then
  for s in 31 32 33 34 35 36 37 38; do
    for n in 7 16 32; do run fresh2 "heldout-$s-$n" "$(trace heldout $s)" $n 0.35; done
  done
  for s in 55 56 57 58 59 60 61 62; do
    for load in 7:0.35 16:0.153 32:0.0766; do
      n=${load%%:*} sc=${load#*:}
      run "fresh2-ns-$n" "nsblocks-$s-$n" "$(trace nsblocks $s)" "$n" "$sc"
    done
  done
  for k in uniqmix agent; do
    for s in 7 8; do
      for n in 7 16 32; do run fresh2 "$k-$s-$n" "$(trace $k $s)" $n "$(scale_for $k $n)"; done
    done
  done
fi

# One criterion table per set directory (the cases inside are kind x replicas).
{
  for d in "$OUT"/*/; do
    set=$(basename "$d")
    [[ $set == traces ]] && continue
    compgen -G "$d*.json" >/dev/null || continue
    echo "## $set"
    python3 examples/simulate/criterion.py "$d"*.json
    echo
  done
} | tee "$OUT/summary.md"
