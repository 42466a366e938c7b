//! `prefix-load`: replays a workload through Envoy and reports hit rate, TTFT and shares.
//! See `replica_emulator::load` and emulator/README.md.

fn main() {
    std::process::exit(replica_emulator::load::cli::main());
}
