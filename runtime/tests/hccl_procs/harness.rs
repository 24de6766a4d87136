//! Ranks as processes: the parent test starts this same test binary once per rank, running one
//! named test with the torchrun environment and a role variable; the child sees the role and
//! runs the rank's body instead of the parent's.

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The variable that tells a child which scenario to run.
pub const ROLE: &str = "CANNON_TEST_HCCL_ROLE";

/// The CANN these tests run against, for this process and its children
/// (`cannon_sys::emulator::select_for_tests`: `CANNON_CANN_EMULATOR`, else an installed CANN
/// that loads, else the emulator cargo built); the emulator's path is passed to the children.
pub fn select_cann() -> Option<PathBuf> {
    match cannon_sys::emulator::select_for_tests() {
        Ok(cannon_sys::emulator::TestCann::Emulator(p)) => Some(p),
        Ok(cannon_sys::emulator::TestCann::Installed(_)) => None,
        Err(e) => panic!("{e}"),
    }
}

/// A port nothing listens on right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One started rank: its process and its output lines as they arrive.
pub struct Rank {
    pub rank: usize,
    pub child: Child,
    lines: mpsc::Receiver<String>,
    pub output: Vec<String>,
}

impl Rank {
    /// Waits until a line containing `marker` arrives (true), or the rank ends or `timeout`
    /// passes (false).
    pub fn wait_for_line(&mut self, marker: &str, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    let hit = l.contains(marker);
                    self.output.push(l);
                    if hit {
                        return true;
                    }
                }
                Err(_) => return false,
            }
        }
    }

    /// Waits for the process (killing it after `timeout`) and collects the rest of its output.
    /// Returns the exit code (None: killed by a signal or by us).
    pub fn finish(&mut self, timeout: Duration) -> Option<i32> {
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Ok(Some(s)) = self.child.try_wait() {
                break Some(s);
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                self.output.push(format!("<killed after {timeout:?}>"));
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        // The reader threads end when the pipes close.
        while let Ok(l) = self.lines.recv_timeout(Duration::from_secs(2)) {
            self.output.push(l);
        }
        status.and_then(|s| s.code())
    }

    pub fn log(&self) -> String {
        format!("--- rank {} ---\n{}", self.rank, self.output.join("\n"))
    }
}

fn pump(r: impl Read + Send + 'static, tx: mpsc::Sender<String>) {
    std::thread::spawn(move || {
        for l in BufReader::new(r).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                return;
            }
        }
    });
}

/// Starts `n` ranks of `test` (this binary's test function) in scenario `role`, with RANK,
/// WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1 and a free MASTER_PORT, the
/// selected CANN, and `env`.
pub fn start(test: &str, role: &str, n: usize, env: &[(&str, String)]) -> Vec<Rank> {
    let emulator = select_cann();
    let exe = std::env::current_exe().unwrap();
    let port = free_port();
    (0..n)
        .map(|r| {
            let mut c = Command::new(&exe);
            c.args([test, "--exact", "--nocapture", "--test-threads", "1"])
                .env(ROLE, role)
                .env("RANK", r.to_string())
                .env("WORLD_SIZE", n.to_string())
                .env("LOCAL_RANK", r.to_string())
                .env("LOCAL_WORLD_SIZE", n.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string())
                .env_remove("CANNON_RDZV_DIR")
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            if let Some(p) = &emulator {
                c.env(cannon_sys::emulator::ENV, p);
            }
            for (k, v) in env {
                c.env(k, v);
            }
            let mut child = c.spawn().expect("start a rank");
            let (tx, lines) = mpsc::channel();
            pump(child.stdout.take().unwrap(), tx.clone());
            pump(child.stderr.take().unwrap(), tx);
            Rank {
                rank: r,
                child,
                lines,
                output: Vec::new(),
            }
        })
        .collect()
}

/// The role of this process, when it is a child.
pub fn role() -> Option<String> {
    std::env::var(ROLE).ok()
}

/// This rank's number from the environment (children only).
pub fn env_rank() -> usize {
    std::env::var("RANK").unwrap().parse().unwrap()
}
