//! Interop with real xDS clients nobody here wrote: Python grpcio's proxyless gRPC
//! client (C-core's xDS resolver), which validates what it receives strictly.
//!
//! Each test runs the control plane in-process (127.0.0.1, port 0), spawns real gRPC
//! backends (`tests/interop/upstream.py`: `served-by:<name>:<payload>`, and the
//! backend's name in the trailing metadata of every answer, Health/Check included)
//! and a real proxyless client (`tests/interop/client.py`, driven line by line over
//! stdin so a test can change registries and config between calls; each command picks
//! the target, the method and the request metadata), and asserts on what the *client*
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

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
use meshfed::ads::TypeUrl;
use meshfed::testing::{DeltaClient, FakeServer, FakeServerBuilder, decode_delta, node_with};
use meshfed_registry::config::{Decoded, decode};
use meshfed_registry::{Endpoint, MemoryRegistry, Protocol, ServiceKey};
use serde::Deserialize;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::net::TcpSocket;
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use crate::support::*;

/// The client's node: a proxyless gRPC app in `default`, as Istio's agent describes it.
const CLIENT_NODE: &str = "sidecar~127.0.0.1~client.default~default.svc.cluster.local";
const ECHO: &str = "echo.default.svc.cluster.local";
/// How long a Python process may take to start (importing grpc) under a loaded machine.
pub(crate) const STARTUP: Duration = Duration::from_secs(30);
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

#[tokio::test]
async fn grpcio_splits_80_20_between_subsets() {
    // gRPC picks a weighted cluster at random per RPC, so the number of calls to v2 is
    // binomial(N, 0.2): mean 0.2 N, SD sqrt(N * 0.2 * 0.8). N = 1000: mean 200, SD 12.65;
    // the tolerance of 5 SD (±63, i.e. 13.7 % to 26.3 %) fails a correct split with
    // probability below 1e-6, and still fails 90/10 (mean 100) and 70/30 (mean 300).
    const CALLS: usize = 1000;
    const V2_SHARE: f64 = 0.2;
    let expected = CALLS as f64 * V2_SHARE;
    let sd = (CALLS as f64 * V2_SHARE * (1.0 - V2_SHARE)).sqrt();
    let tolerance = 5.0 * sd;

    let Some(t) = Interop::start().await else {
        return;
    };
    let (v1, v2) = tokio::join!(t.upstream("v1"), t.upstream("v2"));
    t.add_versioned_echo(&v1, &v2);
    t.apply(ECHO_SUBSETS);
    t.apply(
        "apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: echo, namespace: default}
spec:
  hosts: [echo]
  http:
  - route:
    - {destination: {host: echo, subset: v1}, weight: 80}
    - {destination: {host: echo, subset: v2}, weight: 20}
",
    );
    // The client's first fetch already has the VirtualService: every call counts.
    t.sync().await;
    let mut client = t.client().await;
    let started = Instant::now();
    let replies = client.call("echo:7070", CALLS).await;
    let elapsed = started.elapsed();
    let counts = match count_backends(&replies) {
        Ok(counts) => counts,
        Err(message) => t.fail(&client, message).await,
    };
    let (n1, n2) = (
        counts.get("v1").copied().unwrap_or(0),
        counts.get("v2").copied().unwrap_or(0),
    );
    eprintln!("80/20 split over {CALLS} calls in {elapsed:?}: v1 {n1}, v2 {n2}");
    assert_eq!(n1 + n2, CALLS, "only v1 and v2 answer: {counts:?}");
    if (n2 as f64 - expected).abs() > tolerance {
        t.fail(
            &client,
            format!(
                "v2 answered {n2} of {CALLS} calls; expected {expected} ± {tolerance:.0} \
                 (5 SD of binomial({CALLS}, {V2_SHARE})); v1 answered {n1}"
            ),
        )
        .await;
    }
    t.finish(vec![client]).await;
}

#[tokio::test]
async fn grpcio_routes_by_header_and_path_prefix() {
    let Some(t) = Interop::start().await else {
        return;
    };
    let (v1, v2) = tokio::join!(t.upstream("v1"), t.upstream("v2"));
    t.add_versioned_echo(&v1, &v2);
    t.apply(ECHO_SUBSETS);
    t.apply(
        "apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: echo, namespace: default}
spec:
  hosts: [echo]
  http:
  - name: jason
    match: [{headers: {x-user: {exact: jason}}}]
    route: [{destination: {host: echo, subset: v2}}]
  - name: health
    match: [{uri: {prefix: /grpc.health.v1.Health/}}]
    route: [{destination: {host: echo, subset: v2}}]
  - name: echo
    match: [{uri: {prefix: /harness.Echo/}}]
    route: [{destination: {host: echo, subset: v1}}]
",
    );
    t.sync().await;
    let mut client = t.client().await;
    // Either backend could answer any call without the routes (round robin over both):
    // ten calls each make landing on the routed one by chance unlikely (2^-10).
    let cases = [
        // Path prefix /harness.Echo/.
        ("echo:7070", "v1"),
        ("echo:7070 say", "v1"),
        // The header wins over the path (first match), and must match exactly.
        ("echo:7070 say x-user=jason", "v2"),
        ("echo:7070 say x-user=jasonx", "v1"),
        ("echo:7070 say x-other=jason", "v1"),
        // Path prefix /grpc.health.v1.Health/.
        ("echo:7070 health", "v2"),
        ("echo:7070 health x-user=alice", "v2"),
        ("echo:7070 health x-user=jason", "v2"),
    ];
    for (rpc, backend) in cases {
        t.expect_served_by(&mut client, rpc, 10, backend).await;
    }
    t.finish(vec![client]).await;
}

#[tokio::test]
async fn grpcio_keeps_the_previous_routes_when_a_virtual_service_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let vs = dir.path().join("vs.yaml");
    write_atomically(&dir.path().join("dr.yaml"), ECHO_SUBSETS);
    write_atomically(&vs, &weighted_echo(100, 0));
    let Some(t) = Interop::start_with(|b| b.config_dir(dir.path())).await else {
        return;
    };
    let (v1, v2) = tokio::join!(t.upstream("v1"), t.upstream("v2"));
    t.add_versioned_echo(&v1, &v2);
    t.configz_until("the config directory to load", |c| {
        c["objects"].as_array().is_some_and(|o| o.len() == 2)
    })
    .await;
    t.sync().await;
    let mut client = t.client().await;
    let target = "echo:7070";
    t.expect_served_by(&mut client, target, 10, "v1").await;

    // Weights summing to 110, which would send nearly every call to v2 if applied:
    // rejected, and the VirtualService in force stays the previous one.
    write_atomically(&vs, &weighted_echo(10, 100));
    t.configz_until("the invalid VirtualService to be rejected", |c| {
        c["rejected"].as_array().is_some_and(|r| {
            r.iter()
                .any(|r| r.to_string().contains("vs.yaml") && r.to_string().contains("weight"))
        })
    })
    .await;
    t.sync().await;
    let configz = get_json(t.server().bound().http, "/debug/configz").await;
    let in_force = configz["objects"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["kind"] == "VirtualService")
        .unwrap_or_else(|| panic!("the previous VirtualService stays: {configz:#}"));
    assert_eq!(
        in_force["spec"]["http"][0]["route"][0]["weight"], 100,
        "{configz:#}"
    );
    // What the client does: every call still lands on v1 (with the rejected weights,
    // 20 calls all on v1 would have probability (10/110)^20).
    t.expect_served_by(&mut client, target, 20, "v1").await;

    // The client was following all along: a valid edit does move it.
    write_atomically(&vs, &weighted_echo(0, 100));
    t.converge(&mut client, target, "the valid edit (all to v2)", 10, |r| {
        r.starts_with("OK served-by:v2:")
    })
    .await;
    t.configz_until("the rejection to clear", |c| {
        c["rejected"].as_array().is_some_and(Vec::is_empty)
    })
    .await;
    t.finish(vec![client]).await;
}

/// A `STATIC` ServiceEntry's host is a listener name like any service's. (Its
/// endpoints name a locality only because gRPC rejects endpoints without one, see
/// [`grpcio_accepts_endpoints_without_a_locality`].)
#[tokio::test]
async fn grpcio_resolves_and_calls_a_service_entry_service() {
    let Some(t) = Interop::start().await else {
        return;
    };
    let (b1, b2) = tokio::join!(t.upstream("b1"), t.upstream("b2"));
    // `ext.example.com` port 7070, its one endpoint on 127.0.0.1:`port`.
    let ext = |port: u16| {
        format!(
            "apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: ext, namespace: default}}
spec:
  hosts: [ext.example.com]
  ports: [{{number: 7070, name: grpc, protocol: GRPC}}]
  resolution: STATIC
  endpoints:
  - {{address: 127.0.0.1, locality: r1/z1, ports: {{grpc: {}}}}}
",
            port
        )
    };
    t.apply(&ext(b1.port));
    t.sync().await;
    let mut client = t.client().await;
    let target = "ext.example.com:7070";
    t.expect_served_by(&mut client, target, 3, "b1").await;

    // An edit of the ServiceEntry's endpoints reaches the client.
    t.apply(&ext(b2.port));
    t.converge(&mut client, target, "the edited endpoint (b2)", 3, |r| {
        r.starts_with("OK served-by:b2:")
    })
    .await;
    t.finish(vec![client]).await;
}

/// Endpoints without a locality (most ServiceEntry endpoints, registries without
/// zones): gRPC requires every `LocalityLbEndpoints` to carry a `locality`, empty or
/// not, and NACKs the assignment otherwise (`endpoints[0].locality error:field not
/// present`). Istio always sends one (empty when unknown).
#[tokio::test]
async fn grpcio_accepts_endpoints_without_a_locality() {
    let Some(t) = Interop::start().await else {
        return;
    };
    let b1 = t.upstream("b1").await;
    let key = t.add_echo(&[]);
    t.registry
        .set_endpoints(&key, vec![endpoint("127.0.0.1", "grpc", b1.port, "")]);
    t.sync().await;
    let mut client = t.client().await;
    t.expect_served_by(&mut client, "echo:7070", 3, "b1").await;
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

/// A CA-backed control plane for the secure-port cases: its CA directory and the
/// serving name `localhost` (the name grpcio checks for `localhost:PORT`).
pub(crate) async fn secure_interop(ca_dir: &Path) -> Option<Interop> {
    let ca_dir = ca_dir.to_path_buf();
    Interop::start_with(move |b| {
        b.configure(move |c| {
            c.ca = Some(meshfed::app::CaSource::Dir {
                cacerts: None,
                self_signed_dir: ca_dir,
            });
            c.secure.custom_hosts = vec!["localhost".into()];
        })
    })
    .await
}

/// The bootstrap of a client reaching the secure port as `localhost` with the
/// certificate `files` of [`workload_files`] (gRFC A65 TLS channel credentials).
fn secure_bootstrap(t: &Interop, files: serde_json::Value) -> serde_json::Value {
    let secure = t.server().secure_grpc_addr();
    let mut bootstrap = bootstrap(secure);
    bootstrap["xds_servers"][0]["server_uri"] = format!("localhost:{}", secure.port()).into();
    bootstrap["xds_servers"][0]["channel_creds"] =
        serde_json::json!([{"type": "tls", "config": files}]);
    bootstrap
}

/// Writes a workload certificate for `identity` and the root as files for grpcio.
pub(crate) fn workload_files(ca_dir: &Path, out: &Path, identity: &str) -> serde_json::Value {
    let (chain, key) = crate::secure::issue(ca_dir, identity);
    std::fs::write(out.join("cert-chain.pem"), chain).unwrap();
    std::fs::write(out.join("key.pem"), key).unwrap();
    serde_json::json!({
        "ca_certificate_file": ca_dir.join("root-cert.pem"),
        "certificate_file": out.join("cert-chain.pem"),
        "private_key_file": out.join("key.pem"),
    })
}

#[tokio::test]
async fn grpcio_resolves_and_calls_through_the_secure_port_with_a_workload_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let ca_dir = dir.path().join("ca");
    let Some(t) = secure_interop(&ca_dir).await else {
        return;
    };
    let b1 = t.upstream("b1").await;
    t.add_echo(&[&b1]);
    t.sync().await;
    let files = workload_files(
        &ca_dir,
        dir.path(),
        "spiffe://cluster.local/ns/default/sa/default",
    );
    let mut client = GrpcClient::start_with(&t.python, &secure_bootstrap(&t, files)).await;
    client
        .call_until(&format!("{ECHO}:7070"), "an answer from b1", 1, |r| {
            r.starts_with("OK served-by:b1")
        })
        .await
        .unwrap();
    let adsz = get_json(t.server().bound().http, "/debug/adsz").await;
    assert_eq!(
        adsz["clients"][0]["proxy"]["verifiedIdentity"],
        "spiffe://cluster.local/ns/default/sa/default",
        "{adsz}"
    );
    t.finish(vec![client]).await;
}

#[tokio::test]
async fn grpcio_with_a_certificate_of_another_namespace_gets_no_config() {
    let dir = tempfile::tempdir().unwrap();
    let ca_dir = dir.path().join("ca");
    let Some(t) = secure_interop(&ca_dir).await else {
        return;
    };
    let files = workload_files(
        &ca_dir,
        dir.path(),
        "spiffe://cluster.local/ns/other/sa/default",
    );
    let mut client = GrpcClient::start_with(&t.python, &secure_bootstrap(&t, files)).await;
    let replies = client.call(&format!("{ECHO}:7070"), 1).await;
    assert!(replies[0].starts_with("ERR"), "{replies:?}");
    let monitoring = t.server().bound().monitoring;
    eventually("the refusal to be counted", || async move {
        let text = http_get(monitoring, "/metrics").await.1;
        metric(
            &text,
            r#"meshfed_xds_request_errors_total{reason="permission_denied"}"#,
        )
        .filter(|n| *n >= 1.0)
    })
    .await;
    client.stop().await;
}

#[tokio::test]
async fn python_csrs_of_both_key_types_get_the_callers_identity_and_a_verifiable_chain() {
    let dir = tempfile::tempdir().unwrap();
    let ca_dir = dir.path().join("ca");
    let Some(t) = secure_interop(&ca_dir).await else {
        return;
    };
    let id = "spiffe://cluster.local/ns/default/sa/reviews";
    workload_files(&ca_dir, dir.path(), id);
    for key_type in ["rsa2048", "ecp256"] {
        let out = run_csr(
            &t.python,
            t.server().secure_grpc_addr(),
            &ca_dir.join("root-cert.pem"),
            key_type,
            7200,
            &[
                "--cert".as_ref(),
                dir.path().join("cert-chain.pem").as_os_str(),
                "--key".as_ref(),
                dir.path().join("key.pem").as_os_str(),
            ],
        )
        .await;
        assert_eq!(out["ok"], true, "{key_type}: {out}");
        assert_eq!(out["sans"], serde_json::json!([id]), "{key_type}: {out}");
        assert_eq!(
            out["ttl"],
            7200.0 + 120.0,
            "{key_type}: TTL plus the 2-minute backdating"
        );
        assert_eq!(out["chain"], 2);
        assert_eq!(out["leaf_matches_key"], true);
        assert_eq!(out["chain_verified"], true);
        assert_eq!(out["root_is_given_root"], true);
    }
    // Without a credential: refused.
    let out = run_csr(
        &t.python,
        t.server().secure_grpc_addr(),
        &ca_dir.join("root-cert.pem"),
        "ecp256",
        0,
        &[],
    )
    .await;
    assert_eq!(out["code"], "UNAUTHENTICATED", "{out}");
}

#[tokio::test]
async fn python_csrs_with_a_kubernetes_token_chain_to_the_root_published_in_the_configmap() {
    use meshfed_kube::fake_api::{FakeApiServer, objects};
    let api = FakeApiServer::start().await.unwrap();
    for ns in ["default", "istio-system"] {
        api.apply(&objects::namespace(ns, &[]));
    }
    let client = api.client();
    let Some(t) =
        Interop::start_with(move |b| b.configure(move |c| crate::secure::kube_ca(c, client))).await
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // The root a pod would mount from its namespace's ConfigMap.
    let root = dir.path().join("root-cert.pem");
    std::fs::write(&root, crate::secure::published_root(&api, "default").await).unwrap();
    let hour = std::time::SystemTime::now() + Duration::from_secs(3600);
    let token = dir.path().join("istio-token");
    std::fs::write(
        &token,
        api.issue_token("default", "reviews", &["istio-ca"], hour, None),
    )
    .unwrap();
    let with_token = [
        "--token".as_ref(),
        token.as_os_str(),
        "--clusterid".as_ref(),
        "Kubernetes".as_ref(),
    ];
    for key_type in ["rsa2048", "ecp256"] {
        let out = run_csr(
            &t.python,
            t.server().secure_grpc_addr(),
            &root,
            key_type,
            3600,
            &with_token,
        )
        .await;
        assert_eq!(out["ok"], true, "{key_type}: {out}");
        assert_eq!(
            out["sans"],
            serde_json::json!(["spiffe://cluster.local/ns/default/sa/reviews"]),
            "{key_type}: the token's identity only: {out}"
        );
        assert_eq!(out["ttl"], 3600.0 + 120.0, "{key_type}: {out}");
        assert_eq!(out["chain_verified"], true, "{key_type}: {out}");
        assert_eq!(out["root_is_given_root"], true, "{key_type}: {out}");
        assert_eq!(out["leaf_matches_key"], true, "{key_type}: {out}");
    }
    let expired = dir.path().join("expired-token");
    let past = std::time::SystemTime::now() - Duration::from_secs(60);
    std::fs::write(
        &expired,
        api.issue_token("default", "reviews", &["istio-ca"], past, None),
    )
    .unwrap();
    let out = run_csr(
        &t.python,
        t.server().secure_grpc_addr(),
        &root,
        "ecp256",
        0,
        &["--token".as_ref(), expired.as_os_str()],
    )
    .await;
    assert_eq!(out["code"], "UNAUTHENTICATED", "{out}");
}

/// Runs `tests/interop/csr.py` against `addr` and returns its JSON line.
async fn run_csr(
    python: &Path,
    addr: SocketAddr,
    root: &Path,
    key_type: &str,
    ttl: u64,
    extra: &[&std::ffi::OsStr],
) -> serde_json::Value {
    let output = python_command(python, "csr.py")
        .arg(addr.to_string())
        .arg("istiod.istio-system.svc")
        .arg(root)
        .arg(key_type)
        .arg(ttl.to_string())
        .args(extra)
        .output()
        .await
        .expect("running csr.py");
    let stdout = String::from_utf8_lossy(&output.stdout);
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "csr.py: {e}; stdout: {stdout}; stderr: {}",
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

// ---------------------------------------------------------------------------------
// The harness

/// One interop test: a control plane with a mock registry, and the Python interpreter
/// that runs backends and clients. Everything it spawns dies with it.
pub(crate) struct Interop {
    pub(crate) python: PathBuf,
    /// `None` while stopped ([`Interop::stop_server`]).
    server: Option<FakeServer>,
    pub(crate) registry: MemoryRegistry,
    /// The ADS address, kept across restarts.
    pub(crate) ads: SocketAddr,
    /// While stopped, the ADS port stays bound (not listening: clients are refused) so
    /// no other test's server can take it and receive this test's clients.
    reserved: Option<TcpSocket>,
}

impl Interop {
    /// Starts the control plane, or returns `None` when interop tests are skipped.
    async fn start() -> Option<Interop> {
        Interop::start_with(|b| b).await
    }

    /// [`Interop::start`] with more settings (a config directory).
    async fn start_with(
        configure: impl FnOnce(FakeServerBuilder) -> FakeServerBuilder,
    ) -> Option<Interop> {
        let python = python()?;
        let server = configure(FakeServer::builder()).start().await.unwrap();
        let registry = server.mock_registry("c1");
        Some(Interop {
            python,
            ads: server.grpc_addr(),
            server: Some(server),
            registry,
            reserved: None,
        })
    }

    pub(crate) fn server(&self) -> &FakeServer {
        self.server.as_ref().expect("the control plane is stopped")
    }

    /// Waits until the registry changes made so far reached the connections.
    pub(crate) async fn sync(&self) {
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

    /// Applies Istio config objects (YAML, `---` between objects) through the
    /// in-memory store, failing on any the store rejects.
    pub(crate) fn apply(&self, yaml: &str) {
        for document in serde_norway::Deserializer::from_str(yaml) {
            let value = serde_json::Value::deserialize(document).expect("YAML");
            match decode(&value, "memory") {
                Decoded::Object(object) => {
                    let id = object.id();
                    if let Err(errors) = self.server().config_store().apply(object) {
                        panic!("{id} rejected: {errors:?}");
                    }
                }
                other => panic!("not a config object: {other:?}"),
            }
        }
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

    /// `echo` port 7070 served by `v1` and `v2`, labelled `version: v1` / `v2`, with the
    /// subsets of [`ECHO_SUBSETS`].
    fn add_versioned_echo(&self, v1: &Upstream, v2: &Upstream) -> ServiceKey {
        let key = self.add_echo(&[]);
        self.registry
            .set_endpoints(&key, vec![v1.versioned("v1"), v2.versioned("v2")]);
        key
    }

    /// Waits until `/debug/configz` satisfies `check`.
    async fn configz_until(&self, what: &str, check: impl Fn(&serde_json::Value) -> bool) {
        let http = self.server().bound().http;
        let check = &check;
        eventually(what, || async move {
            let configz = get_json(http, "/debug/configz").await;
            check(&configz).then_some(())
        })
        .await;
    }

    /// `n` calls as `target` says (see [`GrpcClient::call`]), which must all be
    /// answered by `backend`.
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
    pub(crate) async fn converge(
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
    pub(crate) async fn finish(mut self, clients: Vec<GrpcClient>) {
        let server = self.server.take().expect("the control plane is stopped");
        assert_no_rejections(&server, &clients.iter().collect::<Vec<_>>()).await;
        for client in clients {
            client.stop().await;
        }
        server.shutdown().await;
    }
}

/// The DestinationRule every routing case uses: subsets `v1`/`v2` by endpoint label.
const ECHO_SUBSETS: &str = "apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: echo, namespace: default}
spec:
  host: echo
  subsets:
  - {name: v1, labels: {version: v1}}
  - {name: v2, labels: {version: v2}}
";

/// `echo` routed entirely by weight: `v1_weight` to v1, `v2_weight` to v2.
fn weighted_echo(v1_weight: u32, v2_weight: u32) -> String {
    format!(
        "apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: echo, namespace: default}}
spec:
  hosts: [echo]
  http:
  - route:
    - {{destination: {{host: echo, subset: v1}}, weight: {v1_weight}}}
    - {{destination: {{host: echo, subset: v2}}, weight: {v2_weight}}}
"
    )
}

/// Writes `text` to `path` as one change (a reader never sees half a file).
fn write_atomically(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// How many of `replies` each backend answered, or the first failed call.
fn count_backends(replies: &[String]) -> Result<BTreeMap<String, usize>, String> {
    let mut counts = BTreeMap::new();
    for reply in replies {
        let backend = reply
            .strip_prefix("OK served-by:")
            .and_then(|r| r.split_once(':'))
            .map(|(backend, _)| backend)
            .ok_or_else(|| format!("a call failed: {reply}"))?;
        *counts.entry(backend.to_string()).or_default() += 1;
    }
    Ok(counts)
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
pub(crate) fn python_command(python: &Path, script_name: &str) -> Command {
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
pub(crate) struct StderrTail(Arc<Mutex<Vec<String>>>);

impl StderrTail {
    pub(crate) fn capture(child: &mut Child) -> StderrTail {
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

    pub(crate) fn text(&self) -> String {
        self.0.lock().unwrap().join("\n")
    }
}

/// Reads the next stdout line, failing with the process's stderr after `timeout`.
pub(crate) async fn next_line(
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

    /// This backend as an endpoint of service port `grpc`, labelled `version`.
    fn versioned(&self, version: &str) -> Endpoint {
        let mut e = self.endpoint("grpc");
        e.labels.insert("version".into(), version.into());
        e
    }
}

/// A proxyless gRPC client (`tests/interop/client.py`) bootstrapped to an ADS address.
pub(crate) struct GrpcClient {
    child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
    pub(crate) stderr: StderrTail,
}

impl GrpcClient {
    async fn start(python: &Path, ads: SocketAddr) -> GrpcClient {
        GrpcClient::start_with(python, &bootstrap(ads)).await
    }

    /// A client with its own bootstrap (TLS to the secure port).
    pub(crate) async fn start_with(python: &Path, bootstrap: &serde_json::Value) -> GrpcClient {
        GrpcClient::start_with_args(python, bootstrap, &[]).await
    }

    /// [`GrpcClient::start_with`] passing `args` to `client.py` after the deadline
    /// (`xds`: xDS channel credentials).
    pub(crate) async fn start_with_args(
        python: &Path,
        bootstrap: &serde_json::Value,
        args: &[&str],
    ) -> GrpcClient {
        let mut child = python_command(python, "client.py")
            .arg(RPC_DEADLINE_S.to_string())
            .args(args)
            .stdin(Stdio::piped())
            .env("GRPC_XDS_BOOTSTRAP_CONFIG", bootstrap.to_string())
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
    pub(crate) async fn stop(mut self) {
        let _ = self.child.kill().await;
    }

    /// `n` RPCs as `rpc` says (`TARGET [say|health] [KEY=VALUE ...]`: `xds:///TARGET`,
    /// the method, request metadata); one `OK served-by:<backend>:<reply>` /
    /// `ERR <code> <details>` each.
    pub(crate) async fn call(&mut self, rpc: &str, n: usize) -> Vec<String> {
        self.stdin
            .write_all(format!("call {n} {rpc}\n").as_bytes())
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

    /// Calls `rpc` (see [`GrpcClient::call`]) once at a time until the last `run`
    /// replies all satisfy `done`; after [`CONVERGE`], an error quoting every reply.
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
pub(crate) fn bootstrap(ads: SocketAddr) -> serde_json::Value {
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
