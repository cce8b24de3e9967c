//! The server under load: a `meshfed discovery` child process the tool starts on the
//! mock-registry file it writes, or one already running (`--server ADDR --mock-file
//! PATH`, with `--server-pid PID` for its memory and CPU).
//!
//! A spawned server listens on port 0 everywhere and logs JSON; the tool reads the
//! addresses from its `meshfed discovery serving` line, waits until its `/ready`
//! answers 200 (registries synced: before that, streams are refused), forwards its
//! warnings and errors to stderr, and kills it when the run ends.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::oneshot;

/// How long a spawned server may take to start listening.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Server log lines forwarded to stderr at most (warnings and errors).
const FORWARDED_LINES: usize = 40;

/// A server the run talks to.
#[derive(Debug)]
pub struct ServerUnderLoad {
    /// Its ADS address.
    pub grpc: SocketAddr,
    /// Its process, when local and known.
    pub pid: Option<u32>,
    /// The tool started it (and stops it when dropped).
    pub spawned: bool,
    child: Option<Child>,
}

impl ServerUnderLoad {
    /// A server already running.
    pub fn attach(grpc: SocketAddr, pid: Option<u32>) -> anyhow::Result<ServerUnderLoad> {
        if let Some(pid) = pid
            && !Path::new(&format!("/proc/{pid}")).exists()
        {
            bail!("--server-pid {pid}: no such process");
        }
        Ok(ServerUnderLoad {
            grpc,
            pid,
            spawned: false,
            child: None,
        })
    }

    /// Starts `binary discovery` on `mock_file` (and `config_dir`, for config
    /// changes), with `extra` flags after the tool's own, and waits until it listens.
    pub async fn spawn(
        binary: &Path,
        mock_file: &Path,
        config_dir: Option<&Path>,
        extra: &[String],
    ) -> anyhow::Result<ServerUnderLoad> {
        let mut command = Command::new(binary);
        command
            .arg("discovery")
            .arg("--mockRegistryFile")
            .arg(mock_file)
            .args(["--grpcAddr", "127.0.0.1:0"])
            .args(["--httpAddr", "127.0.0.1:0"])
            .args(["--monitoringAddr", "127.0.0.1:0"])
            .arg("--log_as_json")
            // Connection logs (one line per proxy) would cost the server more than
            // the work measured.
            .args(["--log_output_level", "default:info,ads:warn"]);
        if let Some(dir) = config_dir {
            command.arg("--configDir").arg(dir);
        }
        command
            .args(extra)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        let mut child = command
            .spawn()
            .with_context(|| format!("starting {} discovery", binary.display()))?;
        let pid = child.id();
        let stdout = child.stdout.take().context("the server's stdout")?;
        let (tx, rx) = oneshot::channel();
        tokio::spawn(follow_log(stdout, tx));
        let (grpc, http) = tokio::select! {
            addr = rx => addr.context(
                "the server exited before it listened (see its log above; config changes need \
                 a server with --configDir)",
            )?,
            status = child.wait() => bail!("the server exited before it listened: {}", status?),
            () = tokio::time::sleep(START_TIMEOUT) => {
                bail!("the server did not log `meshfed discovery serving` within {START_TIMEOUT:?}")
            }
        };
        tokio::select! {
            ready = wait_ready(http) => ready?,
            status = child.wait() => bail!("the server exited before it was ready: {}", status?),
        }
        Ok(ServerUnderLoad {
            grpc,
            pid,
            spawned: true,
            child: Some(child),
        })
    }

    /// Stops a spawned server (a server the tool attached to keeps running).
    pub async fn stop(mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
        }
    }
}

/// Reads the server's JSON log: sends the ADS address of the serving line, forwards
/// warnings and errors, and keeps draining so the server never blocks on a full pipe.
async fn follow_log(
    stdout: tokio::process::ChildStdout,
    tx: oneshot::Sender<(SocketAddr, SocketAddr)>,
) {
    let mut lines = BufReader::new(stdout).lines();
    let mut tx = Some(tx);
    let mut forwarded = 0usize;
    while let Ok(Some(line)) = lines.next_line().await {
        let Ok(entry) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        let fields = &entry["fields"];
        let addr = |key: &str| fields[key].as_str().and_then(|a| a.parse().ok());
        if fields["message"] == "meshfed discovery serving"
            && let (Some(grpc), Some(http)) = (addr("grpc"), addr("http"))
            && let Some(tx) = tx.take()
        {
            let _ = tx.send((grpc, http));
            continue;
        }
        let level = entry["level"].as_str().unwrap_or("");
        if matches!(level, "WARN" | "ERROR") {
            forwarded += 1;
            if forwarded <= FORWARDED_LINES {
                eprintln!("server {level}: {fields}");
            } else if forwarded == FORWARDED_LINES + 1 {
                eprintln!("server: further warnings and errors are not shown");
            }
        }
    }
}

/// Waits until `GET http://<http>/ready` answers 200.
async fn wait_ready(http: SocketAddr) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + START_TIMEOUT;
    let mut last = String::from("no answer");
    while tokio::time::Instant::now() < deadline {
        match ready_status(http).await {
            Ok(200) => return Ok(()),
            Ok(code) => last = format!("HTTP {code}"),
            Err(err) => last = err.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("the server's /ready did not answer 200 within {START_TIMEOUT:?} (last: {last})")
}

/// The status code of `GET /ready` (HTTP/1.0, so the server closes the connection).
async fn ready_status(http: SocketAddr) -> std::io::Result<u16> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(http).await?;
    stream
        .write_all(b"GET /ready HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .await?;
    let mut head = Vec::new();
    stream.take(64).read_to_end(&mut head).await?;
    let line = String::from_utf8_lossy(&head);
    line.split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("not an HTTP answer: {line:?}")))
}

/// A fresh directory for the mock-registry file of a spawned server.
pub fn scratch_dir() -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("meshfed-load-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}
