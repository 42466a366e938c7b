//! The real `replica-emulator` binary on a loopback port, for the integration tests. A Drop
//! guard kills it, also when an assertion fails.
#![allow(dead_code)] // each test file uses a part

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Emu {
    child: Child,
    pub port: u16,
}

impl Drop for Emu {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Emu {
    pub fn start(args: &[&str]) -> Emu {
        let mut child = Command::new(env!("CARGO_BIN_EXE_replica-emulator"))
            .args(["--host", "127.0.0.1", "--port", "0"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn replica-emulator");
        let mut line = String::new();
        let out = child.stdout.take().expect("stdout");
        BufReader::new(out)
            .read_line(&mut line)
            .expect("read stdout");
        let port = line.trim().rsplit(':').next().and_then(|p| p.parse().ok());
        let Some(port) = port else {
            let _ = child.kill();
            panic!("no port in {line:?}");
        };
        Emu { child, port }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Waits (bounded) for the process to exit; returns its exit code.
    pub fn wait_exit(&mut self, within: Duration) -> Option<i32> {
        let end = Instant::now() + within;
        while Instant::now() < end {
            if let Ok(Some(st)) = self.child.try_wait() {
                return st.code();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}
