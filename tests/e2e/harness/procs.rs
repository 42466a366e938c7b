//! Child processes that are always stopped, and free loopback ports.
//!
//! Every process a test starts is wrapped in a [`Proc`]: `Drop` kills it (SIGKILL) and
//! reaps it, so it is stopped when the test ends, fails or panics. When the test binary
//! itself is killed (Ctrl-C), `Drop` does not run: each PID is also appended to the file
//! named by `E2E_PIDFILE`, which `scripts/test.sh` reads in its exit trap to stop
//! leftovers by PID.

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A started process, killed and reaped on drop.
pub struct Proc {
    /// Short name for messages (`envoy`, `replica r1`).
    pub name: String,
    child: Option<Child>,
    /// File receiving stdout and stderr.
    pub log: PathBuf,
}

impl Proc {
    /// Start `cmd` with stdout and stderr appended to `log`.
    pub fn spawn(name: &str, mut cmd: Command, log: &Path) -> Proc {
        let out = File::create(log).unwrap_or_else(|e| panic!("create {}: {e}", log.display()));
        let err = out.try_clone().expect("clone log handle");
        cmd.stdin(Stdio::null()).stdout(out).stderr(err);
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name} ({cmd:?}): {e}"));
        record_pid(child.id());
        Proc {
            name: name.to_string(),
            child: Some(child),
            log: log.to_path_buf(),
        }
    }

    /// `Some(status)` if the process has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Wait up to `timeout` for the process to exit on its own.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(s) = self.exited() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    /// The process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kill (SIGKILL) and reap now.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The process output so far (last `max` bytes).
    pub fn log_tail(&self, max: usize) -> String {
        let text = std::fs::read(&self.log).unwrap_or_default();
        let start = text.len().saturating_sub(max);
        String::from_utf8_lossy(&text[start..]).into_owned()
    }

    /// The whole output so far.
    pub fn log_text(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(&self.log).unwrap_or_default()).into_owned()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

fn record_pid(pid: u32) {
    let Ok(path) = std::env::var("E2E_PIDFILE") else {
        return;
    };
    if let Ok(mut f) = OpenOptions::new().create(true).append(true).open(path) {
        let _ = writeln!(f, "{pid}");
    }
}

static HANDED_OUT: Mutex<Vec<u16>> = Mutex::new(Vec::new());

/// A loopback port that was free a moment ago and was not handed out before in this
/// process (tests run in parallel threads). Bounded: at most 200 tries.
pub fn free_port() -> u16 {
    let mut used = HANDED_OUT.lock().unwrap_or_else(|p| p.into_inner());
    let seen: HashSet<u16> = used.iter().copied().collect();
    for _ in 0..200 {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let port = l.local_addr().expect("local addr").port();
        if !seen.contains(&port) {
            used.push(port);
            return port;
        }
    }
    panic!("no free loopback port after 200 tries");
}

/// Is something accepting TCP connections on 127.0.0.1:`port`?
pub fn port_open(port: u16) -> bool {
    TcpStream::connect_timeout(
        &format!("127.0.0.1:{port}").parse().expect("socket addr"),
        Duration::from_millis(200),
    )
    .is_ok()
}

/// Poll `check` every 50 ms until it returns `Some` or `timeout` passes.
pub fn wait_for<T>(timeout: Duration, mut check: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
