//! The server under load: a `meshfed discovery` child process the tool starts on the
//! mock-registry file it writes, or one already running (`--server ADDR --mock-file
//! PATH`, with `--server-pid PID` for its memory and CPU).
//!
//! A spawned server listens on port 0 everywhere and logs JSON; the tool reads the
//! addresses from the file the server writes once it listens (`--readyFile`, JSON
//! `{"grpcAddr", "secureGrpcAddr", "httpAddr", "monitoringAddr", "pid"}`), waits until its `/ready`
//! answers 200 (registries synced: before that, streams are refused), forwards its
//! warnings and errors to stderr, and kills it when the run ends.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use serde::Deserialize;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// How long a spawned server may take to start listening.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// How often the tool looks for the ready file of a server it started.
const READY_FILE_POLL: Duration = Duration::from_millis(20);

/// What `meshfed discovery --readyFile` writes once it listens.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ReadyFile {
    /// The ADS address (`--grpcAddr`).
    pub grpc_addr: SocketAddr,
    /// The secure xDS address (`--secureGrpcAddr`), when the server serves it.
    #[serde(default)]
    pub secure_grpc_addr: Option<SocketAddr>,
    /// The `/ready` and debug address (`--httpAddr`).
    pub http_addr: SocketAddr,
    /// The `/metrics` address (`--monitoringAddr`).
    pub monitoring_addr: SocketAddr,
    /// The server's process id.
    pub pid: u32,
}

impl ReadyFile {
    /// Reads the file; `None` while it does not exist yet.
    pub fn read(path: &Path) -> anyhow::Result<Option<ReadyFile>> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(err) => {
                return Err(anyhow::Error::new(err).context(format!("reading {}", path.display())));
            }
        };
        serde_json::from_str(&text)
            .map(Some)
            .with_context(|| format!("{}: not a ready file: {text:?}", path.display()))
    }
}

/// Server log lines forwarded to stderr at most (warnings and errors).
const FORWARDED_LINES: usize = 40;

/// A server the run talks to.
#[derive(Debug)]
pub struct ServerUnderLoad {
    /// Its ADS address.
    pub grpc: SocketAddr,
    /// More replicas' ADS addresses (attached runs only).
    pub replicas: Vec<SocketAddr>,
    /// Its process, when local and known.
    pub pid: Option<u32>,
    /// The tool started it (and stops it when dropped).
    pub spawned: bool,
    /// Its `/metrics` address, when the tool started it.
    pub monitoring: Option<SocketAddr>,
    child: Option<Child>,
}

impl ServerUnderLoad {
    /// Every ADS address: the server's, then the other replicas'.
    pub fn addresses(&self) -> Vec<SocketAddr> {
        std::iter::once(self.grpc)
            .chain(self.replicas.iter().copied())
            .collect()
    }

    /// A server already running.
    pub fn attach(grpc: SocketAddr, pid: Option<u32>) -> anyhow::Result<ServerUnderLoad> {
        if let Some(pid) = pid
            && !Path::new(&format!("/proc/{pid}")).exists()
        {
            bail!("--server-pid {pid}: no such process");
        }
        Ok(ServerUnderLoad {
            grpc,
            replicas: Vec::new(),
            pid,
            spawned: false,
            monitoring: None,
            child: None,
        })
    }

    /// Starts `binary discovery` on `mock_file` (and `config_dir`, for config
    /// changes and Sidecars), with `extra` flags after the tool's own, and waits until
    /// it has written `ready_file` and its `/ready` answers 200. With `ca_dir`, the
    /// server runs its CA there (`--caDir`) and the run uses its secure address.
    pub async fn spawn(
        binary: &Path,
        mock_file: &Path,
        config_dir: Option<&Path>,
        ready_file: &Path,
        ca_dir: Option<&Path>,
        extra: &[String],
    ) -> anyhow::Result<ServerUnderLoad> {
        let mut command = Command::new(binary);
        command
            .arg("discovery")
            .arg("--mockRegistryFile")
            .arg(mock_file)
            .arg("--readyFile")
            .arg(ready_file)
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
        if let Some(dir) = ca_dir {
            command
                .arg("--caDir")
                .arg(dir)
                .args(["--secureGrpcAddr", "127.0.0.1:0"]);
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
        tokio::spawn(follow_log(stdout));
        let ready = tokio::select! {
            ready = wait_ready_file(ready_file) => ready?,
            status = child.wait() => bail!(
                "the server exited before it listened: {} (see its log above; is {} a meshfed \
                 build with --readyFile?)",
                status?,
                binary.display()
            ),
        };
        tokio::select! {
            ready = wait_ready(ready.http_addr) => ready?,
            status = child.wait() => bail!("the server exited before it was ready: {}", status?),
        }
        let grpc = match ca_dir {
            None => ready.grpc_addr,
            Some(_) => ready.secure_grpc_addr.context(
                "the server started with --caDir wrote no secureGrpcAddr in its ready file",
            )?,
        };
        Ok(ServerUnderLoad {
            grpc,
            replicas: Vec::new(),
            pid,
            spawned: true,
            monitoring: Some(ready.monitoring_addr),
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

/// Waits until the server has written its ready file (polled: the server writes it
/// once, by a rename, so it is either absent or complete).
async fn wait_ready_file(path: &Path) -> anyhow::Result<ReadyFile> {
    let deadline = tokio::time::Instant::now() + START_TIMEOUT;
    loop {
        if let Some(ready) = ReadyFile::read(path)? {
            return Ok(ready);
        }
        if tokio::time::Instant::now() >= deadline {
            bail!(
                "the server did not write its ready file {} within {START_TIMEOUT:?}",
                path.display()
            );
        }
        tokio::time::sleep(READY_FILE_POLL).await;
    }
}

/// Reads the server's JSON log: forwards warnings and errors, and keeps draining so
/// the server never blocks on a full pipe.
async fn follow_log(stdout: tokio::process::ChildStdout) {
    let mut lines = BufReader::new(stdout).lines();
    let mut forwarded = 0usize;
    while let Ok(Some(line)) = lines.next_line().await {
        let Ok(entry) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        let fields = &entry["fields"];
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

/// The server's xDS counters that are not zero (`meshfed_xds_*_total`, one entry per
/// labelled sample): what the server saw of the run's failures (handshake deadlines,
/// connections cut for not reading, refused streams). Empty when `/metrics` does not
/// answer.
pub async fn xds_counters(monitoring: SocketAddr) -> BTreeMap<String, f64> {
    let Ok(text) = http_get(monitoring, "/metrics").await else {
        return BTreeMap::new();
    };
    parse_xds_counters(&text)
}

fn parse_xds_counters(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|line| line.starts_with("meshfed_xds_") || line.starts_with("pilot_xds_push_time_"))
        .filter_map(|line| {
            let (name, value) = line.rsplit_once(' ')?;
            let metric = name.split('{').next()?;
            let value: f64 = value.parse().ok()?;
            // Also the generate + send time per response (sum and count, by type).
            let kept = metric.ends_with("_total")
                || metric.ends_with("push_time_sum")
                || metric.ends_with("push_time_count");
            (kept && value != 0.0).then(|| (name.to_string(), value))
        })
        .collect()
}

/// The body of `GET http://<addr><path>` (HTTP/1.0: the server closes when done).
async fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())
        .await?;
    let mut all = Vec::new();
    stream.take(16 << 20).read_to_end(&mut all).await?;
    let text = String::from_utf8_lossy(&all);
    Ok(text
        .split_once("\r\n\r\n")
        .map_or_else(String::new, |(_, body)| body.to_string()))
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

/// A fresh directory for the mock-registry file, config directory and ready file of a
/// spawned server.
pub fn scratch_dir() -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("meshfed-load-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    #[test]
    fn xds_counters_keep_non_zero_totals() {
        let text = "# TYPE meshfed_xds_handshake_timeouts counter\n\
                    meshfed_xds_handshake_timeouts_total 51\n\
                    meshfed_xds_refused_total{reason=\"rate_limited\"} 7170\n\
                    meshfed_xds_refused_total{reason=\"bad_node\"} 0\n\
                    meshfed_xds_push_seconds_bucket{le=\"0.1\"} 3\n\
                    meshfed_pushes_total 9\n";
        let counters = super::parse_xds_counters(text);
        assert_eq!(counters.len(), 2, "{counters:?}");
        assert_eq!(counters["meshfed_xds_handshake_timeouts_total"], 51.0);
        assert_eq!(
            counters["meshfed_xds_refused_total{reason=\"rate_limited\"}"],
            7170.0
        );
    }
}
