bench_routing() { echo "routing: not yet" >&2; return 1; }
