//! Shared test helpers.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use meshfed_kube::fake_api::{FakeApiServer, RbacPolicy, RecordedRequest};
use meshfed_registry::{
    Endpoint, Locality, MemoryRegistry, Port, Protocol, ProviderId, Service, ServiceKey,
};
use serde::Deserialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The ClusterRole and Role of deploy/rbac.yaml as the fake API server enforces them,
/// the Role in the namespace deploy/kustomization.yaml installs into.
pub fn deploy_rbac() -> RbacPolicy {
    let deploy = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy");
    let yaml = |file: &str| -> Vec<serde_json::Value> {
        let path = deploy.join(file);
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        serde_norway::Deserializer::from_str(&text)
            .map(|doc| {
                serde_json::Value::deserialize(doc)
                    .unwrap_or_else(|e| panic!("{}: not YAML: {e}", path.display()))
            })
            .filter(|v| !v.is_null())
            .collect()
    };
    let kustomization = yaml("kustomization.yaml");
    let namespace = kustomization[0]["namespace"]
        .as_str()
        .expect("kustomization.yaml sets the namespace");
    RbacPolicy::from_roles(&yaml("rbac.yaml"), namespace)
        .unwrap_or_else(|e| panic!("deploy/rbac.yaml: {e}"))
}

/// A fake API server enforcing [`deploy_rbac`], for meshfed to read as a cluster it
/// runs in (or a remote cluster: the README gives the remote the same role). Dropped at
/// the end of a passing test, it fails the test if any request was refused; dropped by
/// a failing one, it prints the refusals (a missing rule shows as a readiness timeout).
pub struct EnforcedApi(FakeApiServer);

impl EnforcedApi {
    pub async fn start() -> EnforcedApi {
        let api = FakeApiServer::start().await.unwrap();
        api.enforce(deploy_rbac());
        EnforcedApi(api)
    }
}

impl std::ops::Deref for EnforcedApi {
    type Target = FakeApiServer;

    fn deref(&self) -> &FakeApiServer {
        &self.0
    }
}

impl Drop for EnforcedApi {
    fn drop(&mut self) {
        let denied = self.0.denied_requests();
        if denied.is_empty() {
            return;
        }
        let list = describe(&denied);
        if std::thread::panicking() {
            eprintln!("the fake API server refused (deploy/rbac.yaml):\n{list}");
        } else {
            panic!("deploy/rbac.yaml does not grant what meshfed asked:\n{list}");
        }
    }
}

/// One line per request: method, path, query and what RBAC saw.
pub fn describe(requests: &[RecordedRequest]) -> String {
    requests
        .iter()
        .map(|r| {
            format!(
                "  {} {} {:?} -> {:?}",
                r.method,
                r.path,
                r.query,
                r.attributes()
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `name.ns.svc.cluster.local` with the given ports, as a mock service.
pub fn service(host: &str, ns: &str, ports: &[(&str, u16, Protocol)]) -> Service {
    let mut s = Service::new(host, ns, ProviderId::Mock, "");
    for (name, port, protocol) in ports {
        s.ports.push(Port::new(name, *port, *protocol).unwrap());
    }
    s
}

/// An endpoint serving `port_name` on `target`.
pub fn endpoint(ip: &str, port_name: &str, target: u16, locality: &str) -> Endpoint {
    let mut e = Endpoint::new(ip.parse().unwrap()).with_port(port_name, target);
    e.locality = Locality::parse(locality);
    e
}

/// Adds an HTTP service on port 80 with the given endpoint IPs (target 8080).
pub fn add_http_service(reg: &MemoryRegistry, host: &str, ns: &str, ips: &[&str]) -> ServiceKey {
    reg.add_service(service(host, ns, &[("http", 80, Protocol::Http)]));
    let key = ServiceKey::new(host, ns);
    reg.set_endpoints(
        &key,
        ips.iter()
            .map(|ip| endpoint(ip, "http", 8080, "r1/z1"))
            .collect(),
    );
    key
}

/// A plain HTTP/1.1 GET; returns (status, body).
/// A control plane on the bundled example mock registry, synced.
pub async fn embedded_server() -> meshfed::testing::FakeServer {
    let server = meshfed::testing::FakeServer::builder()
        .embedded_mock_registry()
        .start()
        .await
        .unwrap();
    server.sync().await;
    server
}

/// Waits until `server` is ready (its config directory and registries loaded) and
/// every change so far is in its snapshot.
pub async fn ready_and_synced(server: &meshfed::testing::FakeServer) {
    let http = server.bound().http;
    eventually("the server to be ready", || async move {
        (http_get(http, "/ready").await.0 == 200).then_some(())
    })
    .await;
    server.sync().await;
}

pub async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect to admin");
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8_lossy(&raw).to_string();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    let body = if text
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(&body)
    } else {
        body
    };
    (status, body)
}

fn dechunk(body: &str) -> String {
    let mut out = String::new();
    let mut rest = body;
    while let Some((size, after)) = rest.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 {
            break;
        }
        out.push_str(&after[..n]);
        rest = &after[n + 2..];
    }
    out
}

/// GET returning parsed JSON.
pub async fn get_json(addr: SocketAddr, path: &str) -> serde_json::Value {
    let (status, body) = http_get(addr, path).await;
    assert_eq!(status, 200, "GET {path}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: not JSON ({e}): {body}"))
}

/// Polls `check` until it returns `Some`, failing after 10 s. For conditions that have
/// no event to wait on (a counter moving, a file reload being noticed).
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The arguments of `meshfed discovery` on the Mock registry, every address on a free
/// loopback port, writing `ready` once it listens; `extra` flags after them.
pub fn discovery_args(ready: &std::path::Path, extra: &[&str]) -> Vec<std::ffi::OsString> {
    let mut args: Vec<std::ffi::OsString> = [
        "discovery",
        "--registries",
        "Mock",
        "--grpcAddr",
        "127.0.0.1:0",
        "--secureGrpcAddr",
        "127.0.0.1:0",
        "--httpAddr",
        "127.0.0.1:0",
        "--monitoringAddr",
        "127.0.0.1:0",
        "--httpsAddr",
        "127.0.0.1:0",
        "--readyFile",
    ]
    .iter()
    .map(Into::into)
    .collect();
    args.push(ready.into());
    args.extend(extra.iter().map(Into::into));
    args
}

/// The JSON that `meshfed discovery --readyFile <path>` writes once it listens.
/// Bounded by the server's start-up, not a settle time.
pub async fn wait_for_ready_file(
    child: &mut std::process::Child,
    path: &std::path::Path,
) -> serde_json::Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(text) = std::fs::read_to_string(path)
            && let Ok(json) = serde_json::from_str(&text)
        {
            return json;
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!(
                "the server exited before writing {}: {status}",
                path.display()
            );
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no ready file within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The value of a metric sample line `name{labels} value` in Prometheus text.
pub fn metric(text: &str, sample: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(sample) && l[sample.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}
