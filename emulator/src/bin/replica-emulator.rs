//! `replica-emulator`: a vLLM-like model server without a model. See `replica_emulator::server`
//! and emulator/README.md.

use std::sync::Arc;

use clap::Parser;
use replica_emulator::config::EmulatorArgs;
use replica_emulator::server::{self, Emulator};

fn main() {
    let args = EmulatorArgs::parse().resolved();
    let rt = match replica_emulator::runtime(args.threads) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("replica-emulator: runtime: {e}");
            std::process::exit(2);
        }
    };
    rt.block_on(async move {
        let (listener, addr) = match server::bind(&args).await {
            Ok(x) => x,
            Err(e) => {
                eprintln!("replica-emulator: bind {}:{}: {e}", args.host, args.port);
                std::process::exit(2);
            }
        };
        let id = args.id.clone().unwrap_or_else(|| addr.port().to_string());
        // One line on stdout, parsed by tests and scripts to learn the port (with --port 0).
        println!("replica-emulator {id} listening on {addr}");
        let emu = Arc::new(Emulator::new(args, id));
        server::serve(emu, listener).await;
    });
}
