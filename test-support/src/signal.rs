//! Signals to processes (the control plane's servers, the tests' own child processes).

use std::process::Command;

/// Sends `signal` (`STOP`, `CONT`, `TERM`, `KILL`, ...) to the process `pid` through the shell's
/// `kill` builtin (no `unsafe`, no dependency). Returns once `kill` has sent it.
pub fn send(pid: u32, signal: &str) -> std::io::Result<()> {
    let status = Command::new("sh")
        .arg("-c")
        .arg(r#"kill -s "$1" "$2""#)
        .arg("signal")
        .arg(signal)
        .arg(pid.to_string())
        .status()?;
    if status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(format!(
            "kill -s {signal} {pid}: {status}"
        )))
    }
}
