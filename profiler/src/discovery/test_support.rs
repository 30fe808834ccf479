//! Real processes for the discovery tests, the MPI installation they run against, and the
//! system tools that give the ground truth.

use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const OPENMPI_C: &str = "/usr/lib/x86_64-linux-gnu/libmpi.so.40";
pub const OPENMPI_MPIFH: &str = "/usr/lib/x86_64-linux-gnu/libmpi_mpifh.so.40";
pub const OPENMPI_F08: &str = "/usr/lib/x86_64-linux-gnu/libmpi_usempif08.so.40";
pub const OPENMPI_TKR: &str = "/usr/lib/x86_64-linux-gnu/libmpi_usempi_ignore_tkr.so.40";
pub const MPICH_C: &str = "/usr/lib/x86_64-linux-gnu/libmpich.so.12";
pub const MPICH_FORT: &str = "/usr/lib/x86_64-linux-gnu/libmpichfort.so.12";

/// Runs a tool that gives the ground truth (binutils, ldconfig) and returns its output.
pub fn tool(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(out.status.success(), "{program} {args:?} failed");
    String::from_utf8(out.stdout).unwrap()
}

/// A started process tree that is terminated and reaped when dropped, also when a test fails.
pub struct Spawned {
    child: Child,
}

impl Spawned {
    /// Starts `cmd` in a process group of its own, so that dropping reaches everything it started
    /// (MPI launchers fork ranks and proxies).
    pub fn start(mut cmd: Command) -> Self {
        let program = cmd.get_program().to_string_lossy().into_owned();
        let child = cmd
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {program}: {e} (is MPI installed?)"));
        Spawned { child }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Polls `probe` until it yields a value; processes take a while to exec and load libraries.
    pub fn wait_until<T>(&self, mut probe: impl FnMut() -> Option<T>) -> T {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(value) = probe() {
                return value;
            }
            assert!(
                Instant::now() < deadline,
                "process {} never reached the expected state",
                self.pid()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let group = -(self.child.id() as i32);
        unsafe { libc::kill(group, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        // Whatever ignored SIGTERM, the launcher included, goes now.
        unsafe { libc::kill(group, libc::SIGKILL) };
        let _ = self.child.wait();
    }
}
