//! Processes of a test's (or bench's) own binary in another role: a replica, a controller, a
//! load generator. The parent spawns them with their role and the API server's client
//! configuration in the environment ([`pass_client`], [`client_from_env`]), sends them signals
//! (SIGSTOP, SIGCONT, SIGTERM, SIGKILL), and never leaves one behind:
//!
//! - a [`Child`] dropped (a test that returns or panics) is killed and reaped;
//! - a child whose parent is gone (a test process killed with SIGKILL, where no `Drop` runs)
//!   exits by itself: [`exit_with_parent`] watches the parent's pid.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The variables that carry the client configuration to a child.
const URL: &str = "WORKQUEUE_E2E_URL";
const CA: &str = "WORKQUEUE_E2E_CA";
const CERT: &str = "WORKQUEUE_E2E_CLIENT_CERT";
const KEY: &str = "WORKQUEUE_E2E_CLIENT_KEY";
const PARENT: &str = "WORKQUEUE_E2E_PARENT";

/// A child process, killed and reaped when dropped.
#[derive(Debug)]
pub struct Child {
    name: String,
    child: std::process::Child,
    log: PathBuf,
    exited: Option<ExitStatus>,
}

impl Child {
    /// Spawns `command` as `name`, its stdout and stderr appended to `log`.
    pub fn spawn(name: &str, mut command: Command, log: &Path) -> std::io::Result<Child> {
        let out = File::options().create(true).append(true).open(log)?;
        let child = command
            .env(PARENT, std::process::id().to_string())
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()?;
        Ok(Child {
            name: name.into(),
            child,
            log: log.to_path_buf(),
            exited: None,
        })
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` (`STOP`, `CONT`, `TERM`, `KILL`, ...).
    pub fn signal(&self, signal: &str) {
        workqueue_test_support::signal::send(self.pid(), signal)
            .unwrap_or_else(|e| panic!("SIG{signal} to {}: {e}", self.name));
    }

    /// Kills it (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        if self.exited.is_none() {
            let _ = self.child.kill();
            self.exited = self.child.wait().ok();
        }
    }

    /// Waits up to `within` for it to exit; its status, or `None` if it still runs.
    pub fn wait_exit(&mut self, within: Duration) -> Option<ExitStatus> {
        let start = Instant::now();
        while self.exited.is_none() {
            self.exited = self.child.try_wait().ok().flatten();
            if self.exited.is_some() || start.elapsed() >= within {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.exited
    }

    /// [`Child::wait_exit`] on tokio's timer: polls every 20 ms without blocking a thread.
    pub async fn exit_within(&mut self, within: Duration) -> Option<ExitStatus> {
        let start = Instant::now();
        while !self.has_exited() && start.elapsed() < within {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.exited
    }

    /// Whether it has exited (without waiting).
    pub fn has_exited(&mut self) -> bool {
        self.wait_exit(Duration::ZERO).is_some()
    }

    /// The last `lines` of its output: for failure messages.
    pub fn log_tail(&self, lines: usize) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Puts `config`'s server, CA and client certificate into `command`'s environment, for
/// [`client_from_env`] in the child. The CA's certificates are written to files in `dir`.
/// Supports what the control plane's configurations use: a URL, root certificates and a client
/// certificate and key in files.
pub fn pass_client(config: &kube::Config, dir: &Path, command: &mut Command) {
    command.env(URL, config.cluster_url.to_string());
    if let Some(roots) = &config.root_cert {
        let paths: Vec<String> = roots
            .iter()
            .enumerate()
            .map(|(i, der)| {
                let path = dir.join(format!("ca-{i}.der"));
                // Written whole under another name, then renamed: a child started before may
                // be reading it.
                if std::fs::read(&path).ok().as_ref() != Some(der) {
                    let temp = dir.join(format!(".ca-{i}.der.{}", std::process::id()));
                    std::fs::write(&temp, der).expect("writing the CA certificate");
                    std::fs::rename(&temp, &path).expect("renaming the CA certificate");
                }
                path.display().to_string()
            })
            .collect();
        command.env(CA, paths.join(":"));
    }
    let auth = &config.auth_info;
    assert!(
        auth.client_certificate_data.is_none() && auth.token.is_none(),
        "only a client certificate in files is passed to a child"
    );
    if let (Some(cert), Some(key)) = (&auth.client_certificate, &auth.client_key) {
        command.env(CERT, cert).env(KEY, key);
    }
}

/// The client configuration [`pass_client`] put into this process's environment.
pub fn client_from_env() -> kube::Config {
    let url = std::env::var(URL).unwrap_or_else(|_| panic!("{URL} is not set"));
    let mut config = kube::Config::new(url.parse().expect("the API server's URL"));
    if let Ok(paths) = std::env::var(CA) {
        let roots = paths
            .split(':')
            .map(|p| std::fs::read(p).unwrap_or_else(|e| panic!("{p}: {e}")))
            .collect();
        config.root_cert = Some(roots);
    }
    config.auth_info.client_certificate = std::env::var(CERT).ok();
    config.auth_info.client_key = std::env::var(KEY).ok();
    config
}

/// Exits this process (status 3) once its parent is gone: a thread that checks every 200 ms
/// whether it was re-parented. Call it first thing in a child.
pub fn exit_with_parent() {
    let Some(parent) = std::env::var(PARENT)
        .ok()
        .and_then(|p| p.parse::<u32>().ok())
    else {
        return;
    };
    std::thread::spawn(move || {
        loop {
            if std::os::unix::process::parent_id() != parent {
                eprintln!("the parent process {parent} is gone: exiting");
                std::process::exit(3);
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    });
}

/// A command that runs this binary again as a child: for a test binary, only the test named
/// `entry` (which must enter the child's role at once); for a bench or example
/// (`entry = None`), with no argument.
pub fn this_binary(entry: Option<&str>) -> Command {
    let exe = std::env::current_exe().expect("this binary's path");
    let mut command = Command::new(exe);
    if let Some(entry) = entry {
        command.args([entry, "--exact", "--nocapture", "--include-ignored"]);
    }
    command
}
