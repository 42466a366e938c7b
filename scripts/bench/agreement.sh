# Part "agreement" of scripts/bench.sh: one trace slice on one engine model, in the simulator
# and end to end through Envoy. Source from bench.sh (after common.sh, bench/lib.sh,
# bench/cluster.sh); entry: bench_agreement.
#
# 1. A window of a Mooncake-style trace (default: the 800 requests shipped in
#    scripts/bench/traces/, see its README) is written to .work/bench/agreement/slice.jsonl,
#    timestamps rebased to 0 in ms and output_length capped at AGREE_MAX_TOKENS
#    (scripts/bench/agreement.py slice): prefix-load caps max_tokens there, the simulator takes
#    the trace's output_length, so the cap in the file makes both generate the same tokens.
# 2. The simulator (examples/simulate, its calibrated engine model) replays the slice on 7
#    replicas: `ours` (the filter's affinity code, share_factor 0 = the code default) and
#    `random`, AGREE_SIM_SEEDS seeds (mean and 95 % CI; on this slice only `random` varies).
# 3. 7 replica-emulators with the same engine model (`--preset llama70b-h100x8`, the
#    engine-model crate's `Params::llama70b_h100x8` and the simulator's API delay;
#    AGREE_EMULATOR_ARGS, used for every run; emulator/README.md, "Step time") behind Envoy with envoy/envoy.yaml, fresh
#    replicas and Envoy per run; prefix-load replays the slice at the trace's times with
#    strategy `random`, then `affinity` with share_factor 0 (ROUTER_SET, as the simulator).
#    AGREE_SHARE=1 adds the pair with share_factor 1.0 (envoy.yaml's value) on both sides.
# 4. One markdown table (simulator, Envoy, difference per strategy) and
#    .work/bench/agreement.json (scripts/bench/agreement.py report). A further row per run,
#    "simulator on Envoy's routing", replays the slice in the simulator with each request on
#    the replica Envoy sent it to: what is left between that row and Envoy is the engine and
#    the clock, not the router. Fails (non-zero) when a build, a run or a request fails.
#
# Environment: AGREE_TRACE (file), AGREE_FROM (0-based first request, default 0), AGREE_COUNT
# (default 800), AGREE_TIME_SCALE (default 0.45: the 800 requests in 120 s, 6.7 req/s, the
# replicas' prefill ~40 % busy under `ours`), AGREE_TIME_UNIT (default: detected on the whole
# file), AGREE_MAX_TOKENS (16), AGREE_SIM_SEEDS (10), AGREE_SHARE (0). ~5 min (two 2-minute
# replays + builds); ~7 with AGREE_SHARE=1.
#
# The API delay is the simulator's (10 ms + 1 µs per prompt token before the engine, in the
# preset: --api-delay-ms 10 --api-us-per-token 1 --prefill-overhead-ms 0), not a 10 ms step cost: this
# trace's requests arrive in bursts, and which prompt of a burst reaches the engine first
# decides who waits behind a long prefill (docs/benchmarks.md, "Eleventh session: simulator and
# Envoy on one trace"). What still differs by construction: Envoy's TTFT is measured at the
# client (HTTP, Envoy, the filter); requests of one burst reach an emulator in real-time order;
# Envoy's `engine` setting (queue/KV scrape) has no counterpart in the simulator's `ours` (its
# engine_load is off).

AGREE_EMULATOR_ARGS=(--preset llama70b-h100x8 --max-model-len 262144)

# agreement_envoy_run NAME STRATEGY SHARE_FACTOR DIR SLICE TOTAL — fresh replicas + Envoy, one replay.
agreement_envoy_run() {
  local name="$1" strategy="$2" share="$3" dir="$4" slice="$5" total="$6" set="${ROUTER_SET:-}"
  [ -n "$share" ] && set+=" share_factor=$share"
  log "agreement: Envoy, strategy $strategy${share:+ share_factor $share}: fresh replicas + Envoy"
  cluster_start_replicas "$dir/logs-$name" "${AGREE_EMULATOR_ARGS[@]}" || return 1
  ROUTER_SET="$set" cluster_start_envoy "$strategy" "$dir/logs-$name" || return 1
  cluster_run "agreement/$name" "$total" "$dir/envoy-$name.json" --trace "$slice" \
    --time-unit ms --time-scale "$AGREE_SCALE" --max-tokens "$AGREE_TOKENS" --seed 11 \
    --timeout-s 300 --requests-jsonl "$dir/envoy-$name.requests.jsonl" || return 1
  sed -n '/^\[/p' "$dir/envoy-$name.out" >&2
  cluster_stop
}

# agreement_sim OUT_JSON POLICIES [SIMULATE_ARGS...] — the simulator on the slice.
agreement_sim() {
  local out="$1" policies="$2"
  shift 2
  log "agreement: simulator, policies $policies $*"
  if ! run_tracked simulate "$ROOT/target/release/examples/simulate" --workload trace \
    --trace "$AGREE_SLICE" --time-unit ms --time-scale "$AGREE_SCALE" --replicas 7 \
    --policies "$policies" --seeds "${AGREE_SIM_SEEDS:-10}" --threads 1 --json "$out" "$@" \
    >"${out%.json}.out" 2>&1; then
    echo "error: simulate failed; output:" >&2
    tail -20 "${out%.json}.out" >&2
    return 1
  fi
  grep -E '^(== |   infinite|policy|ours|random)' "${out%.json}.out" >&2 || true
}

bench_agreement() {
  local trace="${AGREE_TRACE:-$BENCH_DIR_SELF/traces/mooncake_conversation_1-800.jsonl}"
  local from="${AGREE_FROM:-0}" count="${AGREE_COUNT:-800}" py total
  local dir="$ROOT/.work/bench/agreement" started=$SECONDS envoy_args=() sim_share=()
  AGREE_SCALE="${AGREE_TIME_SCALE:-0.45}" AGREE_TOKENS="${AGREE_MAX_TOKENS:-16}"
  AGREE_SLICE="$dir/slice.jsonl"
  py="$(bench_python)"
  { build_tools 2>&1 | tail -1 >&2; } || return 1
  log "cargo build --release --example simulate"
  (cd "$ROOT" && cargo build --release --example simulate 2>&1 | tail -1 >&2) || return 1
  [ -f "$WASM" ] || build_wasm || return 1
  cluster_ports_free || return 1
  rm -rf "$dir"; mkdir -p "$dir"
  "$py" "$BENCH_DIR_SELF/agreement.py" slice "$trace" "$AGREE_SLICE" --from "$from" \
    --count "$count" --max-tokens "$AGREE_TOKENS" ${AGREE_TIME_UNIT:+--time-unit "$AGREE_TIME_UNIT"} >&2 ||
    return 1
  total="$(grep -c . "$AGREE_SLICE")"

  agreement_sim "$dir/sim.json" ours,random || return 1
  if [ "${AGREE_SHARE:-0}" = 1 ]; then
    agreement_sim "$dir/sim-share.json" ours --ours share_factor=1 || return 1
    sim_share=(--sim-share "$dir/sim-share.json")
  fi

  agreement_envoy_run random random "" "$dir" "$AGREE_SLICE" "$total" || return 1
  agreement_envoy_run affinity affinity 0.0 "$dir" "$AGREE_SLICE" "$total" || return 1
  envoy_args=(--envoy "random=$dir/envoy-random.json" --envoy "affinity=$dir/envoy-affinity.json")
  if [ "${AGREE_SHARE:-0}" = 1 ]; then
    agreement_envoy_run affinity_shipped affinity 1.0 "$dir" "$AGREE_SLICE" "$total" || return 1
    envoy_args+=(--envoy "affinity_shipped=$dir/envoy-affinity_shipped.json")
  fi

  "$py" "$BENCH_DIR_SELF/agreement.py" report "$ROOT/.work/bench/agreement.json" \
    --sim "$dir/sim.json" "${sim_share[@]}" "${envoy_args[@]}" \
    --replay-sim "$ROOT/target/release/examples/simulate" --slice "$AGREE_SLICE" \
    --time-scale "$AGREE_SCALE" \
    --meta "trace=$(basename "$trace")" --meta "window=$((from + 1))–$((from + total))" \
    --meta "time_scale=$AGREE_SCALE" --meta "max_tokens=$AGREE_TOKENS" \
    --meta "emulator=${AGREE_EMULATOR_ARGS[*]}" --meta "machine=$(machine_line)" \
    --meta "elapsed_s=$((SECONDS - started))"
}
