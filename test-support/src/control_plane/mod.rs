//! A real control plane for the end-to-end tests: etcd and kube-apiserver processes, run as
//! controller-runtime's envtest runs them, one per test binary ([`ControlPlane::shared`]).
//!
//! - **The binaries**: `TEST_ASSET_KUBE_APISERVER` and `TEST_ASSET_ETCD`, else
//!   `$KUBEBUILDER_ASSETS/kube-apiserver` and `$KUBEBUILDER_ASSETS/etcd` (envtest's variables).
//!   `e2e/build-assets.sh` builds both from their Go modules and prints the folder. Without them
//!   every test that asks for the control plane fails, saying how to get them.
//! - **etcd** on loopback with free ports and `--unsafe-no-fsync`; **kube-apiserver** on
//!   loopback with a free port, `--advertise-address=127.0.0.1`, RBAC, a service-account key,
//!   client certificates signed by a CA made for the run; it is ready when `/readyz` answers 200.
//! - **Clients**: [`ControlPlane::client`] is an administrator (`system:masters`);
//!   [`ControlPlane::config_as`] is any other user, who may do only what RBAC grants it.
//! - **Faults**: kube-apiserver can be paused and resumed (SIGSTOP, SIGCONT: connections are
//!   accepted by the kernel and never answered), and killed and started again on the same etcd,
//!   port and certificates.
//! - **Clean-up**: the processes and their folder go when the test process ends, however it
//!   ends (see `process.rs`).
//!
//! Why not kube-rs's `envtest` crate (0.3): it wraps controller-runtime's envtest through Go
//! at build time (cgo, bindgen: it needs libclang and clang's headers, which our machines do not
//! have; with them it built and started a control plane in 4 s), links a Go shared library, uses
//! kube 4 for its client (we are on kube 5: its `kube` feature is unusable, without it only the
//! kubeconfig text is reachable), and offers neither the faults the tests need (pause, kill and
//! restart kube-apiserver) nor clean-up when the test process is killed.
//!
//! kube-apiserver alone runs no controllers: no garbage collector (owned objects stay when their
//! owner goes), no namespace controller (a deleted namespace stays `Terminating`), no service
//! account tokens. Each test works in a namespace of its own ([`ControlPlane::namespace`]).

mod certs;
mod process;

use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, PostParams};
use tokio::sync::OnceCell;

use certs::Authority;
use process::Group;

/// How to get the binaries, for the message of a test that has none.
const HOW_TO_GET_THEM: &str = "build them with `export KUBEBUILDER_ASSETS=\"$(e2e/build-assets.sh)\"` \
     (needs Go 1.26 and the Go module proxy; about 5 min the first time, then instant), or set \
     TEST_ASSET_KUBE_APISERVER and TEST_ASSET_ETCD to the binaries; see the README, \"Testing \
     against a real API server\"";

/// How long kube-apiserver may take to become ready (its first start bootstraps RBAC roles and
/// priority levels into etcd; on 2 loaded cores that took up to ~10 s).
const READY_WITHIN: Duration = Duration::from_secs(90);

/// Why the control plane could not start.
#[derive(Debug)]
pub struct StartError(String);

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for StartError {}

fn fail(what: impl std::fmt::Display) -> StartError {
    StartError(what.to_string())
}

/// The paths of the two binaries, from envtest's variables.
fn binaries() -> Result<(PathBuf, PathBuf), StartError> {
    let assets = std::env::var_os("KUBEBUILDER_ASSETS").map(PathBuf::from);
    let find = |variable: &str, name: &str| -> Result<PathBuf, StartError> {
        let path = match (std::env::var_os(variable), &assets) {
            (Some(path), _) => PathBuf::from(path),
            (None, Some(dir)) => dir.join(name),
            (None, None) => {
                return Err(fail(format!(
                    "no control plane for the end-to-end tests: neither {variable} nor \
                     KUBEBUILDER_ASSETS is set; {HOW_TO_GET_THEM}"
                )));
            }
        };
        if path.is_file() {
            Ok(path)
        } else {
            Err(fail(format!(
                "no control plane for the end-to-end tests: {} does not exist; {HOW_TO_GET_THEM}",
                path.display()
            )))
        }
    };
    Ok((
        find("TEST_ASSET_KUBE_APISERVER", "kube-apiserver")?,
        find("TEST_ASSET_ETCD", "etcd")?,
    ))
}

/// A free port on 127.0.0.1 (free when asked: envtest's way, with the same small race).
fn free_port() -> Result<u16, StartError> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(fail)?;
    Ok(listener.local_addr().map_err(fail)?.port())
}

fn write(path: &Path, contents: &str) -> Result<(), StartError> {
    std::fs::write(path, contents).map_err(|e| fail(format!("{}: {e}", path.display())))
}

/// kube-apiserver's process and how to start it again.
#[derive(Debug)]
struct ApiServerProcess {
    child: Option<Child>,
    binary: PathBuf,
    args: Vec<String>,
}

/// etcd and kube-apiserver, for one test binary.
#[derive(Debug)]
pub struct ControlPlane {
    url: String,
    dir: PathBuf,
    ca: Authority,
    group: Mutex<Group>,
    apiserver: Mutex<ApiServerProcess>,
    namespaces: AtomicUsize,
}

/// The binary's control plane, or why it did not start (tried once: the tests after the first
/// fail with the same message instead of each trying again).
static SHARED: OnceCell<Result<ControlPlane, StartError>> = OnceCell::const_new();

impl ControlPlane {
    /// The test binary's control plane, started by the first test that asks (later ones wait
    /// for it). Panics, saying how to get the binaries, when there are none; panics with the
    /// servers' last log lines when they do not start.
    pub async fn shared() -> &'static ControlPlane {
        match SHARED.get_or_init(ControlPlane::start_retrying).await {
            Ok(plane) => plane,
            Err(e) => panic!("{e}"),
        }
    }

    /// [`ControlPlane::start`], again with other ports (up to 3 tries) when a port was taken
    /// between its choice and the server's bind: a free port is found by binding port 0 and
    /// letting it go, and any process's outgoing connection may take it meanwhile.
    async fn start_retrying() -> Result<ControlPlane, StartError> {
        let mut tries = 0;
        loop {
            tries += 1;
            match ControlPlane::start().await {
                Err(e) if tries < 3 && e.0.contains("address already in use") => {
                    eprintln!("control plane: a chosen port was taken before its bind; again");
                }
                result => return result,
            }
        }
    }

    async fn start() -> Result<ControlPlane, StartError> {
        let (apiserver_binary, etcd_binary) = binaries()?;
        static STARTED: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "workqueue-e2e-{}-{}",
            std::process::id(),
            STARTED.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).map_err(|e| fail(format!("{}: {e}", dir.display())))?;
        let mut group = Group::new(&dir).map_err(fail)?;

        let ca = Authority::new().map_err(fail)?;
        let serving = ca.serving().map_err(fail)?;
        let file = |name: &str| dir.join(name).display().to_string();
        write(&dir.join("ca.crt"), &ca.cert_pem())?;
        write(&dir.join("apiserver.crt"), &serving.cert_pem)?;
        write(&dir.join("apiserver.key"), &serving.key_pem)?;
        let service_account = certs::service_account_key().map_err(fail)?;
        write(&dir.join("service-account.pub"), &service_account.cert_pem)?;
        write(&dir.join("service-account.key"), &service_account.key_pem)?;

        let (etcd_port, peer_port, port) = (free_port()?, free_port()?, free_port()?);
        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let etcd_args = vec![
            format!("--data-dir={}", file("etcd")),
            format!("--listen-client-urls={etcd_url}"),
            format!("--advertise-client-urls={etcd_url}"),
            format!("--listen-peer-urls=http://127.0.0.1:{peer_port}"),
            format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}"),
            format!("--initial-cluster=default=http://127.0.0.1:{peer_port}"),
            "--unsafe-no-fsync=true".into(),
            "--log-level=warn".into(),
        ];
        group
            .spawn("etcd", &etcd_binary, &etcd_args)
            .map_err(|e| fail(format!("starting {}: {e}", etcd_binary.display())))?;

        let url = format!("https://127.0.0.1:{port}");
        let apiserver_args = vec![
            format!("--etcd-servers={etcd_url}"),
            format!("--secure-port={port}"),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            format!("--cert-dir={}", file("apiserver-certs")),
            format!("--tls-cert-file={}", file("apiserver.crt")),
            format!("--tls-private-key-file={}", file("apiserver.key")),
            format!("--client-ca-file={}", file("ca.crt")),
            "--service-cluster-ip-range=10.0.0.0/24".into(),
            "--authorization-mode=RBAC".into(),
            "--allow-privileged=true".into(),
            "--disable-admission-plugins=ServiceAccount".into(),
            format!("--service-account-issuer={url}"),
            format!("--service-account-key-file={}", file("service-account.pub")),
            format!(
                "--service-account-signing-key-file={}",
                file("service-account.key")
            ),
        ];
        let child = group
            .spawn("kube-apiserver", &apiserver_binary, &apiserver_args)
            .map_err(|e| fail(format!("starting {}: {e}", apiserver_binary.display())))?;

        let plane = ControlPlane {
            url,
            dir,
            ca,
            group: Mutex::new(group),
            apiserver: Mutex::new(ApiServerProcess {
                child: Some(child),
                binary: apiserver_binary,
                args: apiserver_args,
            }),
            namespaces: AtomicUsize::new(0),
        };
        let started = Instant::now();
        plane.wait_ready().await?;
        eprintln!(
            "control plane: kube-apiserver at {} ready {:.1} s after start (etcd, logs in {})",
            plane.url,
            started.elapsed().as_secs_f64(),
            plane.dir.display()
        );
        Ok(plane)
    }

    /// Waits until kube-apiserver's `/readyz` answers 200.
    async fn wait_ready(&self) -> Result<(), StartError> {
        let client = kube::Client::try_from(self.config()).map_err(fail)?;
        let start = Instant::now();
        let mut last = String::new();
        while start.elapsed() < READY_WITHIN {
            if let Some(status) = self.apiserver_exit() {
                return Err(self.log_error(&format!("kube-apiserver exited: {status}")));
            }
            let request = http::Request::get("/readyz")
                .body(Vec::new())
                .map_err(fail)?;
            match tokio::time::timeout(Duration::from_secs(5), client.request_text(request)).await {
                Ok(Ok(_)) => return Ok(()),
                Ok(Err(e)) => last = e.to_string(),
                Err(_) => last = "no answer within 5 s".into(),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(self.log_error(&format!(
            "kube-apiserver not ready within {READY_WITHIN:?}; /readyz: {last}"
        )))
    }

    fn apiserver_exit(&self) -> Option<std::process::ExitStatus> {
        let mut apiserver = self.apiserver.lock().unwrap();
        apiserver.child.as_mut()?.try_wait().ok().flatten()
    }

    fn log_error(&self, what: &str) -> StartError {
        let group = self.group.lock().unwrap();
        fail(format!(
            "{what}\n--- kube-apiserver's log (last lines) ---\n{}\n--- etcd's log (last lines) ---\n{}",
            group.log_tail("kube-apiserver", 30),
            group.log_tail("etcd", 10)
        ))
    }

    /// kube-apiserver's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A client configuration for `user`, authenticated by a client certificate, with
    /// `group` (if any) besides `system:authenticated`; kube's defaults otherwise (timeouts,
    /// retries of 429, 503 and 504).
    pub fn config_for(&self, user: &str, group: Option<&str>) -> kube::Config {
        let pair = self
            .ca
            .client(user, group)
            .expect("signing a client certificate");
        let users = self.dir.join("users");
        std::fs::create_dir_all(&users).expect("the users' folder");
        let stem = users.join(format!(
            "{user}-{}",
            self.namespaces.fetch_add(1, Ordering::Relaxed)
        ));
        let (cert, key) = (stem.with_extension("crt"), stem.with_extension("key"));
        std::fs::write(&cert, &pair.cert_pem).expect("writing a client certificate");
        std::fs::write(&key, &pair.key_pem).expect("writing a client key");
        let mut config = kube::Config::new(self.url.parse().expect("the URL"));
        config.root_cert = Some(vec![self.ca.cert_der()]);
        config.auth_info.client_certificate = Some(cert.display().to_string());
        config.auth_info.client_key = Some(key.display().to_string());
        config
    }

    /// An administrator's client configuration (`system:masters`: RBAC allows everything).
    pub fn config(&self) -> kube::Config {
        self.config_for("admin", Some("system:masters"))
    }

    /// A user with no group but `system:authenticated`: RBAC allows only what a test binds
    /// to it.
    pub fn config_as(&self, user: &str) -> kube::Config {
        self.config_for(user, None)
    }

    /// An administrator's client. Make one per test (per tokio runtime): a client's
    /// connections belong to the runtime that opened them.
    pub fn client(&self) -> kube::Client {
        kube::Client::try_from(self.config()).expect("a client of the control plane")
    }

    /// Creates a namespace of its own for a test: `prefix` and a number.
    pub async fn namespace(&self, prefix: &str) -> String {
        let name = format!(
            "{prefix}-{}",
            self.namespaces.fetch_add(1, Ordering::Relaxed)
        );
        let namespace = Namespace {
            metadata: kube::api::ObjectMeta {
                name: Some(name.clone()),
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<Namespace>::all(self.client())
            .create(&PostParams::default(), &namespace)
            .await
            .unwrap_or_else(|e| panic!("creating namespace {name}: {e}"));
        name
    }

    fn apiserver_pid(&self) -> u32 {
        let apiserver = self.apiserver.lock().unwrap();
        apiserver
            .child
            .as_ref()
            .expect("kube-apiserver is not running (killed and not restarted)")
            .id()
    }

    /// Pauses kube-apiserver (SIGSTOP): the kernel still accepts connections, nothing answers.
    pub fn pause_apiserver(&self) {
        crate::signal::send(self.apiserver_pid(), "STOP").expect("SIGSTOP to kube-apiserver");
    }

    /// Resumes a paused kube-apiserver (SIGCONT).
    pub fn resume_apiserver(&self) {
        crate::signal::send(self.apiserver_pid(), "CONT").expect("SIGCONT to kube-apiserver");
    }

    /// Kills kube-apiserver (SIGKILL) and waits for it to exit: connections are refused until
    /// [`ControlPlane::restart_apiserver`].
    pub fn kill_apiserver(&self) {
        let mut apiserver = self.apiserver.lock().unwrap();
        let mut child = apiserver
            .child
            .take()
            .expect("kube-apiserver is not running");
        child.kill().expect("SIGKILL to kube-apiserver");
        child.wait().expect("waiting for kube-apiserver");
    }

    /// Starts kube-apiserver again after [`ControlPlane::kill_apiserver`], with the same
    /// flags (the same etcd, port and certificates), and waits until it is ready.
    pub async fn restart_apiserver(&self) {
        {
            let mut apiserver = self.apiserver.lock().unwrap();
            assert!(apiserver.child.is_none(), "kube-apiserver is running");
            let mut group = self.group.lock().unwrap();
            let child = group
                .spawn("kube-apiserver", &apiserver.binary, &apiserver.args)
                .expect("restarting kube-apiserver");
            apiserver.child = Some(child);
        }
        if let Err(e) = self.wait_ready().await {
            panic!("{e}");
        }
    }
}
