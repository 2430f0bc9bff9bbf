//! The processes: etcd and kube-apiserver in one process group of their own, and a janitor that
//! kills that group and removes the working folder when the test process is gone, however it
//! ends (returns, panics, is killed with SIGKILL).
//!
//! # Why a janitor
//!
//! The control plane lives in a `static` for the whole test binary, and statics are never
//! dropped, so no `Drop` can stop it; and a test process killed by a signal runs no code at
//! all. A parent-death signal (`PR_SET_PDEATHSIG`) needs `unsafe` `pre_exec` (this crate forbids
//! unsafe code) and fires when the spawning *thread* ends, which in a test binary is the first
//! test's thread. So a small `sh` janitor holds the read end of a pipe whose write end only this
//! process holds: when this process ends, for any reason, the kernel closes it, the janitor reads
//! end-of-file, kills the process group with SIGKILL and removes the folder. It ignores SIGINT,
//! SIGTERM and SIGHUP, so that a Ctrl-C to the terminal's process group (which the janitor is in)
//! ends the tests first and it still cleans up after them. etcd and kube-apiserver are in a
//! process group of their own, so a Ctrl-C does not reach them mid-test.

use std::fs::File;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};

/// The janitor's script: `$1` is the folder; the first line on stdin the process group to kill.
const JANITOR: &str = r#"trap '' INT TERM HUP
read -r group
while read -r _; do :; done
if [ -n "$group" ]; then kill -s KILL -- "-$group" 2>/dev/null; fi
rm -rf -- "$1""#;

/// A process group of servers, cleaned up when this process ends.
#[derive(Debug)]
pub(crate) struct Group {
    /// The process group: the first server's pid (0 until one started).
    pgid: u32,
    /// The write end of the janitor's pipe: held until this process ends.
    janitor: ChildStdin,
    dir: PathBuf,
}

impl Group {
    /// Starts the janitor of `dir`.
    pub(crate) fn new(dir: &Path) -> std::io::Result<Self> {
        let mut janitor = Command::new("sh")
            .arg("-c")
            .arg(JANITOR)
            .arg("janitor")
            .arg(dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let stdin = janitor.stdin.take().expect("piped");
        // Never waited for: it outlives this process by design (init reaps it).
        drop(janitor);
        Ok(Group {
            pgid: 0,
            janitor: stdin,
            dir: dir.to_path_buf(),
        })
    }

    /// Starts a server in the group, its output to `<dir>/<name>.log`.
    pub(crate) fn spawn(
        &mut self,
        name: &str,
        program: &Path,
        args: &[String],
    ) -> std::io::Result<Child> {
        // Appended to: a restarted server's log follows its predecessor's.
        let log = File::options()
            .create(true)
            .append(true)
            .open(self.log_path(name))?;
        let child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(self.pgid as i32)
            .spawn()?;
        if self.pgid == 0 {
            self.pgid = child.id();
            writeln!(self.janitor, "{}", self.pgid)?;
            self.janitor.flush()?;
        }
        Ok(child)
    }

    pub(crate) fn log_path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.log"))
    }

    /// The last lines of a server's log: for error messages.
    pub(crate) fn log_tail(&self, name: &str, lines: usize) -> String {
        let log = std::fs::read_to_string(self.log_path(name)).unwrap_or_default();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}
