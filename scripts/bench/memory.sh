# Part "memory" of scripts/bench.sh: Envoy memory per prefix-index slot (index_slots).
# Source from bench.sh (after common.sh, bench/lib.sh, bench/cluster.sh); entry: bench_memory.
#
# For each table size in MEMORY_SLOTS (default "1024 65536 262144"): 7 fast emulators, Envoy
# with envoy/envoy.yaml and that index_slots (ROUTER_SET), then unique 8,000-token prompts
# (about 27 index writes each: MEMORY_REQUESTS, default 2 x slots / 10 rounded up, fills a table
# to > 99 %), and Envoy's own heap figure (admin /memory, `allocated`) before and after. The
# bytes per slot are (allocated after − allocated after the 1024-slot run) / (slots − 1024):
# the shared-data key, value and map overhead of a full table, as Envoy's allocator counts it.

bench_memory() {
  local slots first_after="" first_slots="" out=.work/bench/memory.txt n after before
  cluster_ports_free || return 1
  { build_tools 2>&1 | tail -1 >&2; } || return 1
  : >"$out"
  for slots in ${MEMORY_SLOTS:-1024 65536 262144}; do
    n="${MEMORY_REQUESTS:-$(((slots * 2 + 9) / 10))}"
    [ "$n" -lt 2000 ] && n=2000
    cluster_start_replicas .work/bench/memory --prefill-us-per-token 0 --prefill-overhead-ms 0 \
      --decode-ms-per-token 1 --cache-blocks 4096 --block-tokens 16 || { cluster_stop; return 1; }
    ROUTER_SET="index_slots=$slots" cluster_start_envoy affinity .work/bench/memory ||
      { cluster_stop; return 1; }
    before="$(memory_allocated)"
    cluster_run "memory-$slots" "$n" ".work/bench/memory-$slots.json" --workload unique \
      --suffix-tokens 8000 --requests "$n" --rate 700 --max-tokens 1 --seed 7 ||
      { cluster_stop; return 1; }
    after="$(memory_allocated)"
    cluster_stop
    if [ -z "$first_after" ]; then
      first_after=$after; first_slots=$slots
      printf '| index_slots | requests | Envoy allocated before -> after (MiB) | bytes per slot over %s slots |\n|---:|---:|---|---:|\n' "$first_slots" | tee -a "$out"
      printf '| %s | %s | %.1f -> %.1f | - |\n' "$slots" "$n" "$(mib "$before")" "$(mib "$after")" | tee -a "$out"
    else
      printf '| %s | %s | %.1f -> %.1f | %.0f |\n' "$slots" "$n" "$(mib "$before")" "$(mib "$after")" \
        "$(awk -v a="$after" -v f="$first_after" -v s="$slots" -v t="$first_slots" 'BEGIN{print (a - f) / (s - t)}')" | tee -a "$out"
    fi
  done
}

# memory_allocated — Envoy's heap bytes in use (admin /memory).
memory_allocated() {
  curl -s --max-time 2 "http://$CLUSTER_HOST:$CLUSTER_ADMIN/memory" |
    "$(bench_python)" -c 'import json, sys; print(json.load(sys.stdin)["allocated"])'
}

mib() { awk -v b="$1" 'BEGIN{print b / 1048576}'; }
