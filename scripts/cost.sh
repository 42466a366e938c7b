#!/usr/bin/env bash
# Instruction-count check of the routing core (a step of ./build.sh test; run it alone with
# `bash scripts/cost.sh`).
#
# Runs examples/cost_probe (release build) once under callgrind: every case (core cost per
# request on 1, 16 and 64 KiB chat bodies for `affinity` and `prefix`; the decision alone for
# 3..1000 replicas) leaves one callgrind dump, whose instruction count / iterations is the
# cost of one request. Callgrind counts are repeatable (they do not depend on machine load).
# Compares each case with scripts/cost-baseline.txt and FAILS if a case needs more than
# COST_TOLERANCE (default 1.20 = +20 %) times its baseline instructions, or more
# allocations per request than its baseline. Prints the table either way.
#   UPDATE_COST_BASELINE=1 bash scripts/cost.sh    rewrite the baseline from this run
#   COST_PROBE_BIN=<cost_probe> bash scripts/cost.sh   count another build of the probe (before/after)
#   bash scripts/cost.sh affinity/16k usage/       only the cases whose names start so (no check of
#                                                  missing cases; with callgrind_annotate's top
#                                                  functions of each case when COST_PROFILE=1)
# Installs valgrind (Debian package) if it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh

BASELINE="$ROOT/scripts/cost-baseline.txt"
TOL="${COST_TOLERANCE:-1.20}"
OUT="$ROOT/target/cost"

if ! command -v valgrind >/dev/null 2>&1; then
  log "installing valgrind (Debian package)"
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind >&2
  else
    sudo apt-get update -qq >&2 && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind >&2
  fi
fi

PROBE="${COST_PROBE_BIN:-}"
if [ -z "$PROBE" ]; then
  log "cargo build --release --example cost_probe"
  cargo build --release --example cost_probe >&2
  PROBE="$ROOT/target/release/examples/cost_probe"
fi
rm -rf "$OUT"; mkdir -p "$OUT"
log "callgrind: $PROBE $*"
(cd "$OUT" && valgrind --tool=callgrind --collect-atstart=no \
  --toggle-collect=cost_probe::measured_region --dump-after=cost_probe::measured_region \
  "$PROBE" "$@" >cases.txt 2>valgrind.log) \
  || { tail -20 "$OUT/valgrind.log" >&2; exit 1; }
if [ "${COST_PROFILE:-0}" = 1 ]; then
  # One callgrind run per case (the dumps of one run share compressed names): the functions
  # with the most instructions (self), per request.
  cat >"$OUT/top.py" <<'PY'
import re, sys
n, rows, started = int(sys.argv[1]), [], False
for line in sys.stdin:
    started = started or "file:function" in line
    m = started and re.match(r"\s*([\d,]+) \(\s*[\d.]+%\)\s+(\S.*?)(?: \[.*\])?$", line)
    if m:
        rows.append((int(m.group(1).replace(",", "")), m.group(2)))
    elif rows and not line.strip():
        break
for ins, name in rows[:13]:
    name = re.sub(r"^.*?([^/]+:)", r"\1", name)
    print(f"{ins / n:>10,.0f}  {name}")
PY
  while read -r name iters _; do
    (cd "$OUT" && valgrind --tool=callgrind --collect-atstart=no --callgrind-out-file="prof.$$" \
      --toggle-collect=cost_probe::measured_region "$PROBE" "$name" >/dev/null 2>>valgrind.log)
    echo "== $name: top functions, instructions per request (self)"
    callgrind_annotate --inclusive=no "$OUT/prof.$$" 2>/dev/null | python3 "$OUT/top.py" "$iters"
    rm -f "$OUT/prof.$$"
  done <"$OUT/cases.txt"
fi

# Dumps are callgrind.out.<pid>.1, .2, ... in the order of the cases printed by the probe
# (callgrind.out.<pid> itself is the empty rest at exit); each has a "totals: <Ir>" line
# (instructions executed inside the counted region).
python3 - "$OUT" "$BASELINE" "$TOL" "${UPDATE_COST_BASELINE:-0}" "$#" <<'EOF'
import glob, os, re, sys
out, baseline_path, tol, update = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4] == "1"
subset = sys.argv[5] != "0"
if subset and update:
    sys.exit("error: UPDATE_COST_BASELINE needs every case (no case arguments)")
cases = [l.split() for l in open(os.path.join(out, "cases.txt")) if l.strip()]
dumps = sorted(glob.glob(os.path.join(out, "callgrind.out.*.*")),
               key=lambda p: int(p.rsplit(".", 1)[1]))
if len(dumps) != len(cases):
    sys.exit(f"error: {len(cases)} cases but {len(dumps)} callgrind dumps in {out}")
now = {}
for (name, iters, allocs), path in zip(cases, dumps):
    total = None
    for line in open(path):
        m = re.match(r"(?:totals|summary):\s+(\d+)", line)
        if m:
            total = int(m.group(1))
    if total is None:
        sys.exit(f"error: no instruction total in {path}")
    now[name] = (total / int(iters), float(allocs))

base = {}
if os.path.exists(baseline_path):
    for line in open(baseline_path):
        if line.strip() and not line.startswith("#"):
            name, ins, allocs = line.split()
            base[name] = (float(ins), float(allocs))

failed = []
print(f"{'case':<20} {'instructions/request':>21} {'baseline':>10} {'ratio':>6} "
      f"{'allocs/request':>15} {'baseline':>9}")
for name, (ins, allocs) in now.items():
    b = base.get(name)
    ratio = ins / b[0] if b and b[0] else float("nan")
    flag = ""
    if b and not update:
        if ins > tol * b[0]:
            flag += f"  FAIL: > {tol:g} x baseline instructions"
        if allocs > b[1]:
            flag += "  FAIL: more allocations than the baseline"
    elif not update:
        flag = "  (no baseline)"
    if "FAIL" in flag:
        failed.append(name)
    print(f"{name:<20} {ins:>21,.0f} {b[0] if b else float('nan'):>10,.0f} {ratio:>6.2f} "
          f"{allocs:>15.1f} {b[1] if b else float('nan'):>9.1f}{flag}")

if not subset and not update:
    for name in base:
        if name not in now:
            print(f"{name:<20} FAIL: in the baseline but not measured")
            failed.append(name)

# Decision cost against fleet size (the ring build excluded): largest / smallest fleet. The
# routing decision (fleet/: key + lookup + choice + record) must stay within 2x; decide/ (the
# same without the key) is shown to make what grows with the fleet visible.
for label in ("fleet", "decide"):
    for kind in ("warm", "cold"):
        xs = sorted((int(n.split("/")[1]), v[0]) for n, v in now.items()
                    if n.startswith(label + "/") and n.endswith("/" + kind))
        if len(xs) < 2:
            continue
        spread = max(v for _, v in xs) / min(v for _, v in xs)
        print(f"{label} {kind}: {xs[0][0]} -> {xs[-1][0]} replicas: {xs[0][1]:,.0f} -> "
              f"{xs[-1][1]:,.0f} instructions (max/min {spread:.2f}x)")
        if label == "fleet" and spread > 2.0 and not update:
            failed.append(f"fleet/{kind} (max/min {spread:.2f}x > 2x)")

if update:
    with open(baseline_path, "w") as f:
        f.write("# Routing-core cost per request: case, callgrind instructions, allocations.\n"
                "# Written by `UPDATE_COST_BASELINE=1 bash scripts/cost.sh`; checked by\n"
                "# scripts/cost.sh (./build.sh test): fail above +20 % instructions or above\n"
                "# the allocations. Counts of examples/cost_probe (see its docs).\n")
        for name, (ins, allocs) in now.items():
            f.write(f"{name} {ins:.0f} {allocs:.1f}\n")
    print(f"baseline written: {baseline_path}")
    sys.exit(0)
if failed:
    print(f"cost: {len(now) - len(failed)} passed, {len(failed)} failed: " + ", ".join(failed))
    print("(if the increase is intended: UPDATE_COST_BASELINE=1 bash scripts/cost.sh, and say why"
          " in the commit)")
    sys.exit(1)
print(f"cost: {len(now)} passed, 0 failed")
EOF
