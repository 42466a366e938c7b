# Part (b) of scripts/bench.sh: routing quality through a real Envoy with the filter.
# Source from bench.sh (after common.sh, bench/lib.sh, bench/cluster.sh); entry: bench_routing.
#
# 7 replica emulators (127.0.0.1:18001-18007) behind Envoy (envoy/envoy.yaml, strategy rendered
# in). For every workload and every strategy, the replicas are restarted (cold caches) and Envoy
# is restarted with the strategy; prefix-load replays the same seeded workload open loop
# (Poisson arrivals: same offered load for every strategy) and reads the replicas' own
# prefix-cache counters and Envoy's prefix_router stats before and after.
#
# Workloads (ROUTING_WORKLOADS, default "sagemaker mixed unique"):
#   sagemaker  SageMaker's benchmark shape: 16 groups sharing an 8,000-token system prompt,
#              64-token unique suffixes; 320 requests at 8 req/s
#   mixed      the demo mix at scale: 50 % on 12 shared 2,000-token prompts, 30 % multi-turn
#              chats (40 x 5 turns), 20 % unique; 640 requests at 16 req/s
#   unique     unique 128-token prompts ("do no harm" vs least_request); 320 requests at 16 req/s
#   sagemaker56  the same shape with 56 groups (8 per replica), 1,120 requests at 12 req/s and
#              16,384-block caches (every replica can hold its 8 prefixes): the per-replica
#              share test (SageMaker reports 13.3-15.4 % per instance for 7 instances)
# Strategies (ROUTING_STRATEGIES, default "round_robin least_request prefix affinity"); prefix
# runs with its own default prefix_length (see cluster_render_envoy).
#
# Replica timing (emulator flags; documented in the README's benchmark section):
#   --prefill-us-per-token 50   a miss on an 8,000-token prefix costs 400 ms of prefill, on a
#                               2,000-token prefix 100 ms (half of a 7-8B model on one A100,
#                               ~20k tokens/s, to keep the runs short)
#   --prefill-overhead-ms 2     fixed per-request cost
#   --prefill-lanes 1           one prefill at a time per replica (compute bound): misses queue
#                               behind each other, as on a real GPU
#   --decode-ms-per-token 10    16 output tokens per request
#   --cache-blocks 2048 (x16 tokens = 32k tokens): 4 of the 16 SageMaker prefixes per replica,
#                               so a replica that sees every prefix (round_robin) keeps evicting
# The offered loads keep round_robin below saturation (its prefill lanes ~60 % busy on sagemaker)
# so the comparison shows cache effects rather than an overloaded baseline.

ROUTING_EMULATOR_ARGS=(--prefill-us-per-token 50 --prefill-overhead-ms 2 --prefill-lanes 1
  --decode-ms-per-token 10 --cache-blocks 2048 --block-tokens 16)

# routing_emulator_args NAME — prints the emulator flags for workload NAME (one per line).
routing_emulator_args() {
  local a prev=
  for a in "${ROUTING_EMULATOR_ARGS[@]}"; do
    [ "$1" = sagemaker56 ] && [ "$prev" = --cache-blocks ] && a=16384
    printf '%s\n' "$a"
    prev=$a
  done
}

# routing_workload_args NAME — prints "TOTAL ARGS..." for prefix-load.
routing_workload_args() {
  case "$1" in
    sagemaker) echo 320 --workload sagemaker --requests 320 --groups 16 --prefix-tokens 8000 \
      --suffix-tokens 64 --rate 8 ;;
    mixed) echo 640 --workload mixed --requests 640 --groups 12 --prefix-tokens 2000 \
      --conversations 40 --turns 5 --rate 16 ;;
    unique) echo 320 --workload unique --requests 320 --suffix-tokens 128 --rate 16 ;;
    sagemaker56) echo 1120 --workload sagemaker --requests 1120 --groups 56 --prefix-tokens 8000 \
      --suffix-tokens 64 --rate 12 ;;
    *) echo "error: unknown routing workload '$1'" >&2; return 1 ;;
  esac
}

bench_routing() {
  local workloads="${ROUTING_WORKLOADS:-sagemaker mixed unique}"
  local strategies="${ROUTING_STRATEGIES:-round_robin least_request prefix affinity}"
  local dir="$ROOT/.work/bench/routing" started=$SECONDS w s spec total files=() n=0 count=0 emu=()
  build_tools 2>&1 | tail -1 >&2
  [ -f "$WASM" ] || build_wasm
  cluster_ports_free
  rm -rf "$dir"; mkdir -p "$dir"
  for w in $workloads; do for s in $strategies; do count=$((count + 1)); done; done
  for w in $workloads; do
    spec="$(routing_workload_args "$w")"
    total="${spec%% *}"
    for s in $strategies; do
      n=$((n + 1))
      log "routing [$n/$count] workload $w, strategy $s: fresh replicas + Envoy"
      mapfile -t emu < <(routing_emulator_args "$w")
      cluster_start_replicas "$dir/logs-$w-$s" "${emu[@]}"
      cluster_start_envoy "$s" "$dir/logs-$w-$s"
      # shellcheck disable=SC2086
      cluster_run "$w/$s" "$total" "$dir/$w-$s.json" ${spec#* } --max-tokens 16 --seed 11 \
        --timeout-s 120 --requests-jsonl "$dir/$w-$s.requests.jsonl"
      sed -n '/^\[/p' "$dir/$w-$s.out" >&2
      cluster_stop
      files+=("$dir/$w-$s.json")
    done
  done
  "$(bench_python)" "$BENCH_DIR_SELF/report.py" routing "$ROOT/.work/bench/routing.json" \
    --machine "$(machine_line)" --elapsed $((SECONDS - started)) \
    --emulator "${ROUTING_EMULATOR_ARGS[*]}" "${files[@]}"
}
