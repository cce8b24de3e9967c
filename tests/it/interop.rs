//! Interop with real xDS clients nobody here wrote: Python grpcio's proxyless gRPC
//! client (C-core's xDS resolver), which validates what it receives strictly.
//!
//! Each test runs the control plane in-process (127.0.0.1, port 0), spawns real gRPC
//! backends (`tests/interop/upstream.py`: `served-by:<name>:<payload>`) and a real
//! proxyless client (`tests/interop/client.py`, driven line by line over stdin so a
//! test can change registries between calls), and asserts on what the *client*
//! printed. After each test, every response a client rejected fails the test with the
//! client's own error text ([`Interop::finish`]).
//!
//! Python comes from `MESHFED_PYTHON` (`./test.sh` creates `.venv` with the pinned
//! `tests/interop/requirements.txt` and sets it). Without it these tests fail, saying
//! so, unless `MESHFED_SKIP_INTEROP=1` is set.
//!
//! Delta: grpcio speaks only the state-of-the-world stream (`StreamAggregatedResources`;
//! gRFC A27 covers SotW only), so a real client cannot exercise Delta here. Delta is
//! covered by the Rust Delta client (`tests/it/delta.rs`, and
//! [`grpc_generator_over_delta`] below for the gRPC generator).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
use meshfed::ads::TypeUrl;
use meshfed::testing::{DeltaClient, FakeServer, decode_delta, node_with};
use meshfed_registry::{Endpoint, MemoryRegistry, Protocol, ServiceKey};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::net::TcpSocket;
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use crate::support::*;

/// The client's node: a proxyless gRPC app in `default`, as Istio's agent describes it.
const CLIENT_NODE: &str = "sidecar~127.0.0.1~client.default~default.svc.cluster.local";
const ECHO: &str = "echo.default.svc.cluster.local";
/// How long a Python process may take to start (importing grpc) under a loaded machine.
const STARTUP: Duration = Duration::from_secs(30);
/// Deadline of each RPC the client makes.
const RPC_DEADLINE_S: u64 = 5;
/// How long a test waits for the client to converge on a change.
const CONVERGE: Duration = Duration::from_secs(20);

// ---------------------------------------------------------------------------------
// The cases

#[tokio::test]
async fn grpcio_resolves_and_calls_mock_registry_services() {
    let Some(t) = Interop::start().await else {
        return;
    };
    let (b1, b2) = tokio::join!(t.upstream("b1"), t.upstream("b2"));
    // Two ports of one service reach two backends; a service in another namespace.
    t.registry.add_service(service(
        ECHO,
        "default",
        &[
            ("grpc", 7070, Protocol::Grpc),
            ("grpc-alt", 7071, Protocol::Grpc),
        ],
    ));
    t.registry.set_endpoints(
        &ServiceKey::new(ECHO, "default"),
        vec![endpoint("127.0.0.1", "grpc", b1.port, "r1/z1").with_port("grpc-alt", b2.port)],
    );
    let greeter = "greeter.other.svc.cluster.local";
    t.registry
        .add_service(service(greeter, "other", &[("grpc", 8080, Protocol::Grpc)]));
    t.registry.set_endpoints(
        &ServiceKey::new(greeter, "other"),
        vec![b2.endpoint("grpc")],
    );
    t.sync().await;

    let mut client = t.client().await;
    let targets = [
        ("echo.default.svc.cluster.local:7070", "b1"),
        ("echo:7070", "b1"),
        ("echo.default:7071", "b2"),
        ("echo.default.svc:7071", "b2"),
        ("greeter.other:8080", "b2"),
    ];
    for (target, backend) in targets {
        t.expect_served_by(&mut client, target, 3, backend).await;
    }

    // What the server saw: gRPC C-core keeps one xDS client, so one SotW stream, per
    // channel target, each with the grpc generator and watching its own listener.
    let adsz = get_json(t.server().bound().http, "/debug/adsz").await;
    let clients = adsz["clients"].as_array().expect("clients");
    assert_eq!(clients.len(), targets.len(), "{adsz:#}");
    let mut watched: Vec<&str> = Vec::new();
    for conn in clients {
        assert_eq!(conn["flavour"], "Sotw", "{adsz:#}");
        assert_eq!(conn["proxy"]["generator"], "grpc", "{adsz:#}");
        assert!(
            conn["proxy"]["userAgent"]
                .as_str()
                .is_some_and(|ua| ua.contains("gRPC")),
            "{adsz:#}"
        );
        for name in conn["watches"]["lds"]["names"].as_array().expect("lds") {
            watched.push(name.as_str().expect("a name"));
        }
    }
    watched.sort_unstable();
    let mut want: Vec<&str> = targets.iter().map(|(t, _)| *t).collect();
    want.sort_unstable();
    assert_eq!(watched, want, "{adsz:#}");
    t.finish(vec![client]).await;
}

#[tokio::test]
async fn grpcio_follows_endpoints_added_and_removed() {
    let Some(t) = Interop::start().await else {
        return;
    };
    let (b1, b2) = tokio::join!(t.upstream("b1"), t.upstream("b2"));
    let key = t.add_echo(&[&b1]);
    t.sync().await;
    let target = "echo:7070";
    let mut client = t.client().await;
    t.expect_served_by(&mut client, target, 3, "b1").await;

    // Added: round robin reaches the new backend.
    t.registry
        .set_endpoints(&key, vec![b1.endpoint("grpc"), b2.endpoint("grpc")]);
    t.converge(&mut client, target, "b2 to be reached", 1, |r| {
        r.starts_with("OK served-by:b2:")
    })
    .await;

    // Removed: every call goes to b2, and stays there once b1 is gone for good.
    t.registry.set_endpoints(&key, vec![b2.endpoint("grpc")]);
    t.converge(&mut client, target, "only b2 to answer", 5, |r| {
        r.starts_with("OK served-by:b2:")
    })
    .await;
    drop(b1);
    t.expect_served_by(&mut client, target, 5, "b2").await;

    // No endpoints at all: calls fail at once; endpoints back: calls work again.
    t.registry.set_endpoints(&key, Vec::new());
    t.converge(
        &mut client,
        target,
        "calls to fail without endpoints",
        1,
        |r| r.starts_with("ERR UNAVAILABLE"),
    )
    .await;
    t.registry.set_endpoints(&key, vec![b2.endpoint("grpc")]);
    t.converge(&mut client, target, "b2 to answer again", 1, |r| {
        r.starts_with("OK served-by:b2:")
    })
    .await;
    t.finish(vec![client]).await;
}

#[tokio::test]
async fn grpcio_reconnects_when_meshfed_restarts() {
    let Some(mut t) = Interop::start().await else {
        return;
    };
    let (b1, b2) = tokio::join!(t.upstream("b1"), t.upstream("b2"));
    t.add_echo(&[&b1]);
    t.sync().await;
    let target = "echo.default.svc.cluster.local:7070";
    let mut client = t.client().await;
    t.expect_served_by(&mut client, target, 2, "b1").await;

    // Control plane down: the client keeps calling with what it has.
    t.stop_server(&[&client]).await;
    t.expect_served_by(&mut client, target, 3, "b1").await;

    // A new meshfed on the same address, whose registry says b2: the client
    // reconnects, fetches again and follows.
    t.restart_server().await;
    t.add_echo(&[&b2]);
    t.sync().await;
    t.converge(
        &mut client,
        target,
        "the restarted meshfed's backend (b2)",
        1,
        |r| r.starts_with("OK served-by:b2:"),
    )
    .await;
    t.finish(vec![client]).await;
}

/// The gRPC generator over Delta, with the Rust client (grpcio has no Delta): the same
/// listener, route and cluster names, and removals when the service goes.
#[tokio::test]
async fn grpc_generator_over_delta() {
    let server = FakeServer::builder().start().await.unwrap();
    let reg = server.mock_registry("c1");
    reg.add_service(service(ECHO, "default", &[("grpc", 7070, Protocol::Grpc)]));
    let key = ServiceKey::new(ECHO, "default");
    reg.set_endpoints(&key, vec![endpoint("127.0.0.1", "grpc", 17070, "r1/z1")]);
    server.sync().await;

    let node = node_with(CLIENT_NODE, serde_json::json!({"GENERATOR": "grpc"}));
    let mut client = DeltaClient::connect(server.grpc_addr(), node)
        .await
        .unwrap();
    client
        .subscribe(TypeUrl::Listener, &["echo:7070"], &[])
        .await
        .unwrap();
    let lds = client.recv_type(TypeUrl::Listener).await.unwrap();
    let listeners: Vec<Listener> = decode_delta(&lds).unwrap();
    assert_eq!(listeners.len(), 1);
    assert_eq!(listeners[0].name, "echo:7070");
    assert!(listeners[0].api_listener.is_some());

    let route = "outbound|7070||echo.default.svc.cluster.local";
    client
        .subscribe(TypeUrl::Route, &[route], &[])
        .await
        .unwrap();
    let rds = client.recv_type(TypeUrl::Route).await.unwrap();
    let routes: Vec<RouteConfiguration> = decode_delta(&rds).unwrap();
    assert_eq!(routes.len(), 1);
    assert!(
        routes[0].virtual_hosts[0]
            .domains
            .iter()
            .any(|d| d == "echo:7070")
    );

    client
        .subscribe(TypeUrl::Cluster, &[route], &[])
        .await
        .unwrap();
    let cds = client.recv_type(TypeUrl::Cluster).await.unwrap();
    assert_eq!(cds.resources.len(), 1);
    assert_eq!(cds.resources[0].name, route);

    // The service goes: its listener and route are removed. (Its cluster stays, as an
    // EDS cluster with no endpoints, as Istio serves any well-formed cluster name.)
    reg.remove_service(&key);
    let mut removed_listeners = Vec::new();
    let mut removed_routes = Vec::new();
    while removed_listeners.is_empty() || removed_routes.is_empty() {
        let response = client.recv().await.unwrap();
        client.ack(&response).await.unwrap();
        match TypeUrl::parse(&response.type_url) {
            Some(TypeUrl::Listener) => removed_listeners.extend(response.removed_resources),
            Some(TypeUrl::Route) => removed_routes.extend(response.removed_resources),
            _ => assert!(response.removed_resources.is_empty(), "{response:?}"),
        }
    }
    assert_eq!(removed_listeners, vec!["echo:7070"]);
    assert_eq!(removed_routes, vec![route]);
    server.shutdown().await;
}

// ---------------------------------------------------------------------------------
// The harness

/// One interop test: a control plane with a mock registry, and the Python interpreter
/// that runs backends and clients. Everything it spawns dies with it.
struct Interop {
    python: PathBuf,
    /// `None` while stopped ([`Interop::stop_server`]).
    server: Option<FakeServer>,
    registry: MemoryRegistry,
    /// The ADS address, kept across restarts.
    ads: SocketAddr,
    /// While stopped, the ADS port stays bound (not listening: clients are refused) so
    /// no other test's server can take it and receive this test's clients.
    reserved: Option<TcpSocket>,
}

impl Interop {
    /// Starts the control plane, or returns `None` when interop tests are skipped.
    async fn start() -> Option<Interop> {
        let python = python()?;
        let server = FakeServer::builder().start().await.unwrap();
        let registry = server.mock_registry("c1");
        Some(Interop {
            python,
            ads: server.grpc_addr(),
            server: Some(server),
            registry,
            reserved: None,
        })
    }

    fn server(&self) -> &FakeServer {
        self.server.as_ref().expect("the control plane is stopped")
    }

    /// Waits until the registry changes made so far reached the connections.
    async fn sync(&self) {
        self.server().sync().await;
    }

    /// A backend named `name`.
    async fn upstream(&self, name: &str) -> Upstream {
        Upstream::start(&self.python, name).await
    }

    /// A proxyless client bootstrapped to this control plane.
    async fn client(&self) -> GrpcClient {
        GrpcClient::start(&self.python, self.ads).await
    }

    /// `echo.default.svc.cluster.local` port 7070 (`grpc`) served by `backends`.
    fn add_echo(&self, backends: &[&Upstream]) -> ServiceKey {
        self.registry
            .add_service(service(ECHO, "default", &[("grpc", 7070, Protocol::Grpc)]));
        let key = ServiceKey::new(ECHO, "default");
        self.registry
            .set_endpoints(&key, backends.iter().map(|b| b.endpoint("grpc")).collect());
        key
    }

    /// `n` calls to `target`, which must all be answered by `backend`.
    async fn expect_served_by(
        &self,
        client: &mut GrpcClient,
        target: &str,
        n: usize,
        backend: &str,
    ) {
        let replies = client.call(target, n).await;
        let prefix = format!("OK served-by:{backend}:");
        if !replies.iter().all(|r| r.starts_with(&prefix)) {
            self.fail(
                client,
                format!(
                    "calls to {target} should all be served by {backend}; got:\n{}\nclient stderr:\n{}",
                    replies.join("\n"),
                    client.stderr.text()
                ),
            )
            .await;
        }
    }

    /// Calls `target` until the last `run` replies satisfy `done` (see
    /// [`GrpcClient::call_until`]).
    async fn converge(
        &self,
        client: &mut GrpcClient,
        target: &str,
        what: &str,
        run: usize,
        done: impl Fn(&str) -> bool,
    ) {
        if let Err(message) = client.call_until(target, what, run, done).await {
            self.fail(client, message).await;
        }
    }

    /// Fails the test; a rejected config is the likelier cause, so that is reported
    /// first when there is one.
    async fn fail(&self, client: &GrpcClient, message: String) -> ! {
        if let Some(server) = &self.server {
            assert_no_rejections(server, &[client]).await;
        }
        panic!("{message}");
    }

    /// Stops the control plane, after checking what its clients rejected. Its ADS port
    /// stays reserved until [`Interop::restart_server`].
    async fn stop_server(&mut self, clients: &[&GrpcClient]) {
        let server = self.server.take().expect("already stopped");
        assert_no_rejections(&server, clients).await;
        let ads = self.ads;
        let reserve = async move {
            // The port frees during shutdown; take it at once.
            loop {
                if let Some(socket) = reserve_port(ads) {
                    return socket;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        };
        let ((), reserved) = tokio::join!(server.shutdown(), reserve);
        self.reserved = Some(reserved);
    }

    /// Starts a new control plane with an empty registry on the old ADS address.
    async fn restart_server(&mut self) {
        assert!(self.server.is_none(), "stop_server first");
        let server = FakeServer::builder()
            .grpc_addr(self.ads)
            .start()
            .await
            .unwrap();
        self.reserved = None;
        self.registry = server.mock_registry("c1");
        self.server = Some(server);
    }

    /// Fails if any client rejected any response, then stops the clients (before the
    /// server, so they cannot reconnect to whatever binds its port next) and the
    /// server.
    async fn finish(mut self, clients: Vec<GrpcClient>) {
        let server = self.server.take().expect("the control plane is stopped");
        assert_no_rejections(&server, &clients.iter().collect::<Vec<_>>()).await;
        for client in clients {
            client.stop().await;
        }
        server.shutdown().await;
    }
}

/// Binds `addr` without listening (connections to it are refused); SO_REUSEADDR lets a
/// listener bind it too.
fn reserve_port(addr: SocketAddr) -> Option<TcpSocket> {
    let socket = TcpSocket::new_v4().ok()?;
    socket.set_reuseaddr(true).ok()?;
    socket.bind(addr).ok()?;
    Some(socket)
}

/// Python with grpcio, or `None` when interop tests are skipped.
fn python() -> Option<PathBuf> {
    match std::env::var_os("MESHFED_PYTHON") {
        Some(p) if !p.is_empty() => Some(PathBuf::from(p)),
        _ if std::env::var("MESHFED_SKIP_INTEROP").as_deref() == Ok("1") => {
            eprintln!("MESHFED_SKIP_INTEROP=1: skipping the grpcio interop test");
            None
        }
        _ => panic!(
            "the interop tests need Python with grpcio: run ./test.sh (it creates .venv from \
             tests/interop/requirements.txt and sets MESHFED_PYTHON), or set \
             MESHFED_PYTHON=/path/to/python yourself; MESHFED_SKIP_INTEROP=1 skips them"
        ),
    }
}

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/interop")
        .join(name)
}

/// A Python process with piped stdio, killed when dropped, never sent through a proxy.
fn python_command(python: &Path, script_name: &str) -> Command {
    let mut command = Command::new(python);
    command
        .arg(script(script_name))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .env("PYTHONUNBUFFERED", "1");
    for var in [
        "http_proxy",
        "https_proxy",
        "grpc_proxy",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "GRPC_PROXY",
    ] {
        command.env_remove(var);
    }
    command
}

/// The last lines a process wrote to stderr, for failure messages.
#[derive(Clone, Default)]
struct StderrTail(Arc<Mutex<Vec<String>>>);

impl StderrTail {
    fn capture(child: &mut Child) -> StderrTail {
        let tail = StderrTail::default();
        let stderr = child.stderr.take().expect("stderr is piped");
        let lines = tail.0.clone();
        tokio::spawn(async move {
            let mut reader = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                let mut lines = lines.lock().unwrap();
                if lines.len() >= 200 {
                    lines.remove(0);
                }
                lines.push(line);
            }
        });
        tail
    }

    fn text(&self) -> String {
        self.0.lock().unwrap().join("\n")
    }
}

/// Reads the next stdout line, failing with the process's stderr after `timeout`.
async fn next_line(
    lines: &mut Lines<BufReader<ChildStdout>>,
    timeout: Duration,
    what: &str,
    stderr: &StderrTail,
) -> String {
    match tokio::time::timeout(timeout, lines.next_line()).await {
        Ok(Ok(Some(line))) => line,
        Ok(Ok(None)) => panic!("{what}: the process exited; its stderr:\n{}", stderr.text()),
        Ok(Err(e)) => panic!("{what}: reading stdout: {e}; stderr:\n{}", stderr.text()),
        Err(_) => panic!(
            "{what}: nothing within {timeout:?}; stderr:\n{}",
            stderr.text()
        ),
    }
}

/// A plain gRPC backend (`tests/interop/upstream.py NAME`) on 127.0.0.1.
struct Upstream {
    port: u16,
    _child: Child,
    _stdout: Lines<BufReader<ChildStdout>>,
}

impl Upstream {
    async fn start(python: &Path, name: &str) -> Upstream {
        let mut child = python_command(python, "upstream.py")
            .arg(name)
            .spawn()
            .expect("spawning upstream.py");
        let stderr = StderrTail::capture(&mut child);
        let mut stdout = BufReader::new(child.stdout.take().expect("piped")).lines();
        let what = format!("upstream {name} to listen");
        let line = next_line(&mut stdout, STARTUP, &what, &stderr).await;
        let port = line
            .strip_prefix("listening on 127.0.0.1:")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("{what}: unexpected line {line:?}"));
        Upstream {
            port,
            _child: child,
            _stdout: stdout,
        }
    }

    /// This backend as an endpoint of service port `port_name`.
    fn endpoint(&self, port_name: &str) -> Endpoint {
        endpoint("127.0.0.1", port_name, self.port, "r1/z1")
    }
}

/// A proxyless gRPC client (`tests/interop/client.py`) bootstrapped to an ADS address.
struct GrpcClient {
    child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
    stderr: StderrTail,
}

impl GrpcClient {
    async fn start(python: &Path, ads: SocketAddr) -> GrpcClient {
        let mut child = python_command(python, "client.py")
            .arg(RPC_DEADLINE_S.to_string())
            .stdin(Stdio::piped())
            .env("GRPC_XDS_BOOTSTRAP_CONFIG", bootstrap(ads).to_string())
            .spawn()
            .expect("spawning client.py");
        let stderr = StderrTail::capture(&mut child);
        let mut stdout = BufReader::new(child.stdout.take().expect("piped")).lines();
        let stdin = child.stdin.take().expect("piped");
        let line = next_line(&mut stdout, STARTUP, "the gRPC client to start", &stderr).await;
        assert_eq!(line, "ready", "client.py: {}", stderr.text());
        GrpcClient {
            child,
            stdin,
            stdout,
            stderr,
        }
    }

    /// Kills the client and waits for it to exit.
    async fn stop(mut self) {
        let _ = self.child.kill().await;
    }

    /// `n` RPCs to `xds:///target`; one `OK <reply>` / `ERR <code> <details>` each.
    async fn call(&mut self, target: &str, n: usize) -> Vec<String> {
        self.stdin
            .write_all(format!("call {target} {n}\n").as_bytes())
            .await
            .unwrap_or_else(|e| panic!("client.py stdin: {e}; stderr:\n{}", self.stderr.text()));
        let timeout = Duration::from_secs(10 + RPC_DEADLINE_S * 2 * n as u64);
        let mut out = Vec::with_capacity(n);
        loop {
            let line = next_line(&mut self.stdout, timeout, "RPC results", &self.stderr).await;
            if line == "END" {
                break;
            }
            out.push(line);
        }
        assert_eq!(out.len(), n, "client.py answered {out:?}");
        out
    }

    /// Calls `target` once at a time until the last `run` replies all satisfy `done`;
    /// after [`CONVERGE`], an error quoting every reply.
    async fn call_until(
        &mut self,
        target: &str,
        what: &str,
        run: usize,
        done: impl Fn(&str) -> bool,
    ) -> Result<Vec<String>, String> {
        let deadline = Instant::now() + CONVERGE;
        let mut history: Vec<String> = Vec::new();
        loop {
            history.extend(self.call(target, 1).await);
            if history.len() >= run && history[history.len() - run..].iter().all(|r| done(r)) {
                return Ok(history);
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "timed out waiting for {what} on {target}; replies:\n{}\nclient stderr:\n{}",
                    history.join("\n"),
                    self.stderr.text()
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// gRPC's bootstrap for `ads`, as an app would get it from Istio's agent.
fn bootstrap(ads: SocketAddr) -> serde_json::Value {
    serde_json::json!({
        "xds_servers": [{
            "server_uri": ads.to_string(),
            "channel_creds": [{"type": "insecure"}],
            "server_features": ["xds_v3"],
        }],
        "node": {
            "id": CLIENT_NODE,
            "cluster": "client.default",
            "metadata": {"GENERATOR": "grpc", "NAMESPACE": "default"},
            "locality": {},
        },
    })
}

/// Waits until every client answered the last response of every type (ACK or NACK),
/// then fails if any response was rejected, quoting the client's error.
async fn assert_no_rejections(server: &FakeServer, clients: &[&GrpcClient]) {
    let http = server.bound().http;
    let syncz = eventually("every client to answer its last response", || async move {
        let syncz = get_json(http, "/debug/syncz").await;
        let answered = syncz.as_array().is_some_and(|rows| {
            rows.iter().all(|row| {
                row["types"].as_object().is_some_and(|types| {
                    types.values().all(|t| {
                        !t["nonceSent"].is_null()
                            && (t["nonceSent"] == t["nonceAcked"]
                                || t["nonceSent"] == t["nonceNacked"])
                    })
                })
            })
        });
        answered.then_some(syncz)
    })
    .await;
    let errors: Vec<String> = syncz
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|row| {
            let conn = row["connectionId"].to_string();
            row["types"]
                .as_object()
                .into_iter()
                .flatten()
                .filter(|(_, t)| !t["lastError"].is_null())
                .map(move |(ty, t)| format!("{conn} {ty}: {}", t["lastError"]))
        })
        .collect();
    let (_, metrics) = http_get(server.bound().monitoring, "/metrics").await;
    let rejects = metric(&metrics, "pilot_total_xds_rejects").unwrap_or(0.0);
    if errors.is_empty() && rejects == 0.0 {
        return;
    }
    let stderr: Vec<String> = clients.iter().map(|c| c.stderr.text()).collect();
    panic!(
        "a client rejected meshfed's config ({rejects} NACKs):\n{}\n/debug/syncz: {syncz:#}\nclient stderr:\n{}",
        errors.join("\n"),
        stderr.join("\n---\n")
    );
}
