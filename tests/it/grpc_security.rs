//! Security policy for proxyless gRPC, asserted on real calls: an xDS-enabled grpcio
//! server (`tests/interop/xds_server.py`, `grpc.server(xds=True)` with xDS server
//! credentials) and proxyless grpcio clients (`client.py xds`: xDS channel
//! credentials), each with a certificate of its own SPIFFE identity issued by the
//! mesh CA and read through gRPC's `file_watcher` certificate provider, as Istio's
//! agent sets them up. The server serves what meshfed's server-side listener says
//! (mTLS or plaintext, RBAC); a client uses mTLS when its cluster says so.
//!
//! Needs `MESHFED_PYTHON` like the other interop tests (see `interop.rs`).

use std::path::{Path, PathBuf};

use meshfed_registry::{Protocol, ServiceKey};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout};

use crate::interop::{
    GrpcClient, Interop, STARTUP, StderrTail, bootstrap, next_line, python_command, secure_interop,
};
use crate::support::*;

const GREETER: &str = "greeter.default.svc.cluster.local";
const TARGET: &str = "greeter.default.svc.cluster.local:7070";
const TRUST_DOMAIN: &str = "cluster.local";

/// Identity of the server's workload and of the two clients.
fn spiffe(sa: &str) -> String {
    format!("spiffe://{TRUST_DOMAIN}/ns/default/sa/{sa}")
}

/// Clients reach the greeter over Istio mTLS.
const ISTIO_MUTUAL: &str = "apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: greeter, namespace: default}
spec:
  host: greeter
  trafficPolicy: {tls: {mode: ISTIO_MUTUAL}}
";

fn peer_authentication(mode: &str) -> String {
    format!(
        "apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {{name: default, namespace: default}}
spec: {{mtls: {{mode: {mode}}}}}
"
    )
}

/// Only service account `a` may call workloads of `default`.
const ALLOW_A: &str = "apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: allow-a, namespace: default}
spec:
  action: ALLOW
  rules:
  - from: [{source: {principals: [cluster.local/ns/default/sa/a]}}]
";

/// A control plane with a CA, and the workloads' certificates from it.
struct Mesh {
    t: Interop,
    dir: tempfile::TempDir,
    ca_dir: PathBuf,
}

impl Mesh {
    async fn start() -> Option<Mesh> {
        let dir = tempfile::tempdir().unwrap();
        let ca_dir = dir.path().join("ca");
        let t = secure_interop(&ca_dir).await?;
        Some(Mesh { t, dir, ca_dir })
    }

    /// gRPC's `certificate_providers` with a `default` file watcher holding a
    /// certificate for service account `sa` from the mesh CA.
    fn certificate_providers(&self, sa: &str) -> serde_json::Value {
        let out = self.dir.path().join(sa);
        std::fs::create_dir_all(&out).unwrap();
        let (chain, key) = crate::secure::issue(&self.ca_dir, &spiffe(sa));
        std::fs::write(out.join("cert-chain.pem"), chain).unwrap();
        std::fs::write(out.join("key.pem"), key).unwrap();
        serde_json::json!({"default": {"plugin_name": "file_watcher", "config": {
            "certificate_file": out.join("cert-chain.pem"),
            "private_key_file": out.join("key.pem"),
            "ca_certificate_file": self.ca_dir.join("root-cert.pem"),
            "refresh_interval": "600s",
        }}})
    }

    /// A proxyless client with xDS credentials and a certificate for `sa`.
    async fn mtls_client(&self, sa: &str) -> GrpcClient {
        let mut b = bootstrap(self.t.ads);
        b["certificate_providers"] = self.certificate_providers(sa);
        GrpcClient::start_with_args(&self.t.python, &b, &["xds"]).await
    }

    /// A proxyless client with plaintext (insecure) credentials: it has a certificate
    /// (gRPC refuses TLS clusters naming a certificate provider its bootstrap lacks),
    /// but ignores the TLS its clusters ask for.
    async fn plaintext_client(&self) -> GrpcClient {
        let mut b = bootstrap(self.t.ads);
        b["certificate_providers"] = self.certificate_providers("plain");
        GrpcClient::start_with(&self.t.python, &b).await
    }

    /// The greeter: service `greeter` port 7070 whose one endpoint is an xDS-enabled
    /// server on 127.0.0.1 running as service account `greeter`.
    async fn greeter(&self) -> XdsServer {
        let port = free_port();
        self.t.registry.add_service(service(
            GREETER,
            "default",
            &[("grpc", 7070, Protocol::Grpc)],
        ));
        let mut e = endpoint("127.0.0.1", "grpc", port, "r1/z1");
        e.service_account = Some(spiffe("greeter"));
        e.labels.insert("app".into(), "greeter".into());
        self.t
            .registry
            .set_endpoints(&ServiceKey::new(GREETER, "default"), vec![e]);
        self.t.sync().await;
        let mut b = bootstrap(self.t.ads);
        b["node"]["id"] = "sidecar~127.0.0.1~greeter-1.default~default.svc.cluster.local".into();
        b["node"]["cluster"] = "greeter.default".into();
        b["server_listener_resource_name_template"] = "xds.istio.io/grpc/lds/inbound/%s".into();
        b["certificate_providers"] = self.certificate_providers("greeter");
        XdsServer::start(&self.t.python, "greeter", port, &b).await
    }

    /// Calls through `client` until one answer satisfies `done`.
    async fn until(&self, client: &mut GrpcClient, what: &str, done: impl Fn(&str) -> bool) {
        self.t.converge(client, TARGET, what, 1, done).await;
    }

    /// `n` more calls, all of which must satisfy `ok`.
    async fn all(&self, client: &mut GrpcClient, n: usize, what: &str, ok: impl Fn(&str) -> bool) {
        let replies = client.call(TARGET, n).await;
        assert!(
            replies.iter().all(|r| ok(r)),
            "{what}: {replies:?}\nclient stderr:\n{}",
            client.stderr.text()
        );
    }
}

/// A port no one listens on now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// An answer of the greeter to a caller it saw as `peer` (`none`: plaintext).
fn served_to(peer: &str) -> impl Fn(&str) -> bool {
    let suffix = format!(" peer={peer}");
    move |r: &str| r.starts_with("OK served-by:greeter:") && r.ends_with(&suffix)
}

/// `tests/interop/xds_server.py`, killed when dropped.
struct XdsServer {
    _child: Child,
    _stdout: Lines<BufReader<ChildStdout>>,
    _stderr: StderrTail,
}

impl XdsServer {
    async fn start(python: &Path, name: &str, port: u16, bootstrap: &serde_json::Value) -> Self {
        let mut child = python_command(python, "xds_server.py")
            .arg(name)
            .arg(port.to_string())
            .env("GRPC_XDS_BOOTSTRAP_CONFIG", bootstrap.to_string())
            .spawn()
            .expect("spawning xds_server.py");
        let stderr = StderrTail::capture(&mut child);
        let mut stdout = BufReader::new(child.stdout.take().expect("piped")).lines();
        let line = next_line(&mut stdout, STARTUP, "the xDS server to start", &stderr).await;
        assert_eq!(line, "started", "xds_server.py: {}", stderr.text());
        XdsServer {
            _child: child,
            _stdout: stdout,
            _stderr: stderr,
        }
    }
}

// ---------------------------------------------------------------------------------
// The cases

#[tokio::test]
async fn grpcio_server_lets_the_allowed_service_account_call_and_denies_another() {
    let Some(m) = Mesh::start().await else {
        return;
    };
    m.t.apply(ISTIO_MUTUAL);
    m.t.apply(&peer_authentication("STRICT"));
    m.t.apply(ALLOW_A);
    let _greeter = m.greeter().await;
    let (mut a, mut b) = tokio::join!(m.mtls_client("a"), m.mtls_client("b"));

    // `a` is served over mTLS: the server saw its certificate's identity.
    m.until(&mut a, "a served over mTLS", served_to(&spiffe("a")))
        .await;
    m.all(&mut a, 3, "a stays allowed", served_to(&spiffe("a")))
        .await;
    // `b` reaches the same server over mTLS, and RBAC refuses it.
    m.until(&mut b, "b denied", |r| {
        r.starts_with("ERR PERMISSION_DENIED")
    })
    .await;
    m.all(&mut b, 3, "b stays denied", |r| {
        r.starts_with("ERR PERMISSION_DENIED")
    })
    .await;

    // Without the policy, both are served.
    m.t.apply(
        "apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: allow-a, namespace: default}
spec:
  action: ALLOW
  rules:
  - from: [{source: {principals: [cluster.local/ns/default/sa/a, cluster.local/ns/default/sa/b]}}]
",
    );
    m.until(
        &mut b,
        "b allowed once the policy names it",
        served_to(&spiffe("b")),
    )
    .await;
    m.t.finish(vec![a, b]).await;
}

#[tokio::test]
async fn grpcio_server_in_strict_mode_refuses_plaintext_and_in_permissive_mode_serves_it() {
    let Some(m) = Mesh::start().await else {
        return;
    };
    m.t.apply(ISTIO_MUTUAL);
    m.t.apply(&peer_authentication("STRICT"));
    let _greeter = m.greeter().await;
    let (mut a, mut plain) = tokio::join!(m.mtls_client("a"), m.plaintext_client());

    m.until(&mut a, "a served over mTLS", served_to(&spiffe("a")))
        .await;
    // The server serves (a got through), and only over TLS: the plaintext client's
    // connection fails.
    m.all(&mut plain, 2, "plaintext refused in STRICT", |r| {
        r.starts_with("ERR UNAVAILABLE")
    })
    .await;

    // PERMISSIVE: gRPC cannot serve TLS and plaintext on one port, so as in Istio the
    // server takes plaintext, and clients follow a DestinationRule without mTLS.
    m.t.apply(&peer_authentication("PERMISSIVE"));
    m.t.apply(
        "apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: greeter, namespace: default}
spec:
  host: greeter
  trafficPolicy: {tls: {mode: DISABLE}}
",
    );
    m.until(
        &mut plain,
        "plaintext served in PERMISSIVE",
        served_to("none"),
    )
    .await;
    m.until(
        &mut a,
        "the xDS-credentials client served in plaintext",
        served_to("none"),
    )
    .await;
    m.t.finish(vec![a, plain]).await;
}

#[tokio::test]
async fn grpcio_server_accepts_a_policy_with_rules_grpc_cannot_check_and_errs_on_the_safe_side() {
    let Some(m) = Mesh::start().await else {
        return;
    };
    m.t.apply(ISTIO_MUTUAL);
    m.t.apply(&peer_authentication("STRICT"));
    // gRPC rejects a whole listener over a path template or a `grpc-*` header
    // matcher. Sent as written, the server would never serve (UNAVAILABLE) and the
    // listener would be NACKed; instead the ALLOW rule with the template allows
    // nothing (a is denied) and the DENY rule with the header denies whatever else it
    // names (b is denied), and `c` (allowed, not denied) shows the server serves.
    m.t.apply(
        "apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: allow, namespace: default}
spec:
  action: ALLOW
  rules:
  - from: [{source: {principals: [cluster.local/ns/default/sa/a]}}]
    to: [{operation: {paths: ['/harness.Echo/{*}']}}]
  - from: [{source: {principals: [cluster.local/ns/default/sa/b, cluster.local/ns/default/sa/c]}}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny, namespace: default}
spec:
  action: DENY
  rules:
  - from: [{source: {principals: [cluster.local/ns/default/sa/b]}}]
    when: [{key: 'request.headers[grpc-tag]', values: [x]}]
",
    );
    let _greeter = m.greeter().await;
    let (mut a, mut b, mut c) =
        tokio::join!(m.mtls_client("a"), m.mtls_client("b"), m.mtls_client("c"));
    m.until(&mut c, "c served", served_to(&spiffe("c"))).await;
    m.all(
        &mut a,
        2,
        "a denied: its ALLOW rule cannot be checked",
        |r| r.starts_with("ERR PERMISSION_DENIED"),
    )
    .await;
    m.all(
        &mut b,
        2,
        "b denied: its DENY rule applies without the header",
        |r| r.starts_with("ERR PERMISSION_DENIED"),
    )
    .await;
    m.t.finish(vec![a, b, c]).await;
}

#[tokio::test]
async fn grpcio_client_accepts_only_the_server_identities_its_cluster_names() {
    let Some(m) = Mesh::start().await else {
        return;
    };
    // The rule names an identity the greeter does not have: the client refuses the
    // greeter's certificate.
    m.t.apply(
        "apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: greeter, namespace: default}
spec:
  host: greeter
  trafficPolicy:
    tls: {mode: ISTIO_MUTUAL, subjectAltNames: [spiffe://cluster.local/ns/default/sa/impostor]}
",
    );
    m.t.apply(&peer_authentication("STRICT"));
    let _greeter = m.greeter().await;
    let mut a = m.mtls_client("a").await;
    m.until(&mut a, "the greeter's identity refused", |r| {
        r.starts_with("ERR UNAVAILABLE")
    })
    .await;
    // Without `subjectAltNames`, the service's account (its endpoint's) is expected.
    m.t.apply(ISTIO_MUTUAL);
    m.until(
        &mut a,
        "a served once the greeter's identity is expected",
        served_to(&spiffe("a")),
    )
    .await;
    m.t.finish(vec![a]).await;
}
