//! Istio config from a watched directory to what a sidecar receives: clusters, listeners
//! and routes, checked for consistency and by where a simulated request lands.

use std::collections::BTreeSet;
use std::path::Path;

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
use meshfed::ads::TypeUrl;
use meshfed::generate::simulate::{self, Request, RouteOutcome};
use meshfed::testing::{AdsClient, FakeServer, ProxyConfig, decode_all, node_with};
use meshfed_registry::{Protocol, ServiceKey};

use crate::support::*;

const REVIEWS: &str = "reviews.default.svc.cluster.local";

const DESTINATION_RULE: &str = "apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: reviews, namespace: default}
spec:
  host: reviews
  trafficPolicy:
    connectionPool: {tcp: {maxConnections: 7}}
  subsets:
  - {name: v1, labels: {version: v1}}
  - {name: v2, labels: {version: v2}}
";

const VIRTUAL_SERVICE: &str = "apiVersion: networking.istio.io/v1beta1
kind: VirtualService
metadata: {name: reviews, namespace: default}
spec:
  hosts: [reviews]
  http:
  - match: [{headers: {end-user: {exact: jason}}}]
    route: [{destination: {host: reviews, subset: v2}}]
  - match: [{uri: {prefix: /v1}}]
    route: [{destination: {host: reviews, subset: v1}}]
  - route:
    - {destination: {host: reviews, subset: v1}, weight: 80}
    - {destination: {host: reviews, subset: v2}, weight: 20}
";

fn write_atomically(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

async fn setup(dir: &Path) -> FakeServer {
    let server = FakeServer::builder().config_dir(dir).start().await.unwrap();
    let reg = server.mock_registry("c1");
    reg.add_service(service(
        REVIEWS,
        "default",
        &[("http", 9080, Protocol::Http)],
    ));
    let mut v1 = endpoint("10.0.0.1", "http", 9080, "r1/z1");
    v1.labels.insert("version".into(), "v1".into());
    let mut v2 = endpoint("10.0.0.2", "http", 9080, "r1/z1");
    v2.labels.insert("version".into(), "v2".into());
    reg.set_endpoints(&ServiceKey::new(REVIEWS, "default"), vec![v1, v2]);
    ready_and_synced(&server).await;
    server
}

/// Fetches CDS, EDS, LDS and RDS like Envoy and returns them.
async fn full_config(
    client: &mut AdsClient,
) -> (
    Vec<Cluster>,
    Vec<Listener>,
    Vec<RouteConfiguration>,
    BTreeSet<String>,
) {
    client.subscribe(TypeUrl::Cluster, &[]).await.unwrap();
    let clusters = client.recv_clusters().await.unwrap();
    let eds: Vec<String> = clusters
        .iter()
        .filter(|c| c.eds_cluster_config.is_some())
        .map(|c| c.name.clone())
        .collect();
    let eds_refs: Vec<&str> = eds.iter().map(String::as_str).collect();
    client
        .subscribe(TypeUrl::Endpoint, &eds_refs)
        .await
        .unwrap();
    let clas = client.recv_load_assignments().await.unwrap();
    let served: BTreeSet<String> = clas.iter().map(|c| c.cluster_name.clone()).collect();
    client.subscribe(TypeUrl::Listener, &[]).await.unwrap();
    let listeners: Vec<Listener> =
        decode_all(&client.recv_type(TypeUrl::Listener).await.unwrap()).unwrap();
    let route_names: BTreeSet<String> = listeners
        .iter()
        .flat_map(|l| meshfed::generate::lds::references(l).1)
        .collect();
    let names: Vec<&str> = route_names.iter().map(String::as_str).collect();
    client.subscribe(TypeUrl::Route, &names).await.unwrap();
    let routes: Vec<RouteConfiguration> =
        decode_all(&client.recv_type(TypeUrl::Route).await.unwrap()).unwrap();
    (clusters, listeners, routes, served)
}

fn route_for<'a>(routes: &'a [RouteConfiguration], name: &str) -> &'a RouteConfiguration {
    routes
        .iter()
        .find(|r| r.name == name)
        .unwrap_or_else(|| panic!("no route table {name}"))
}

#[tokio::test]
async fn config_dir_drives_clusters_routes_and_listeners_consistently() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("dr.yaml"), DESTINATION_RULE).unwrap();
    std::fs::write(dir.path().join("vs.yaml"), VIRTUAL_SERVICE).unwrap();
    let server = setup(dir.path()).await;
    let mut client = AdsClient::connect(
        server.grpc_addr(),
        node_with(
            "sidecar~10.9.0.1~productpage.default~default.svc.cluster.local",
            serde_json::json!({"LABELS": {"app": "productpage"}}),
        ),
    )
    .await
    .unwrap();
    let (clusters, listeners, routes, served) = full_config(&mut client).await;

    let names: BTreeSet<&str> = clusters.iter().map(|c| c.name.as_str()).collect();
    for want in [
        "outbound|9080||reviews.default.svc.cluster.local",
        "outbound|9080|v1|reviews.default.svc.cluster.local",
        "outbound|9080|v2|reviews.default.svc.cluster.local",
    ] {
        assert!(names.contains(want), "{want} missing from {names:?}");
    }
    let v1 = clusters.iter().find(|c| c.name.contains("|v1|")).unwrap();
    let thresholds = &v1.circuit_breakers.as_ref().unwrap().thresholds[0];
    assert_eq!(
        thresholds.max_connections.unwrap().value,
        7,
        "the DestinationRule's connection pool applies"
    );
    assert!(listeners.iter().any(|l| l.name == "0.0.0.0_9080"));
    let problems = simulate::check_consistency(&clusters, &listeners, &routes, &served);
    assert!(problems.is_empty(), "inconsistent config: {problems:#?}");

    let table = route_for(&routes, "9080");
    let jason = Request::new("reviews", 9080, "/reviews/1").header("end-user", "jason");
    assert_eq!(
        simulate::route(table, &jason).unwrap(),
        RouteOutcome::Cluster(format!("outbound|9080|v2|{REVIEWS}"))
    );
    let prefix = Request::new(REVIEWS, 9080, "/v1/x");
    assert_eq!(
        simulate::route(table, &prefix).unwrap(),
        RouteOutcome::Cluster(format!("outbound|9080|v1|{REVIEWS}"))
    );
    let other = Request::new("reviews.default", 9080, "/");
    assert_eq!(
        simulate::route(table, &other).unwrap(),
        RouteOutcome::WeightedClusters(vec![
            (format!("outbound|9080|v1|{REVIEWS}"), 80),
            (format!("outbound|9080|v2|{REVIEWS}"), 20)
        ])
    );

    // A live edit of the VirtualService reaches the proxy, and costs it its route
    // tables and listeners (whose TCP/TLS chains follow VirtualServices, as in Istio):
    // clusters and endpoints are not even generated again (they would be, and then
    // found unchanged, without the VirtualService skip); the listeners are, and are
    // found unchanged (this edit is HTTP only).
    let monitoring = server.bound().monitoring;
    let unchanged = || async move {
        let metrics = http_get(monitoring, "/metrics").await.1;
        metrics
            .lines()
            .filter(|l| l.starts_with("meshfed_xds_pushes_unchanged") && !l.ends_with(" 0"))
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let before = unchanged().await;
    write_atomically(
        &dir.path().join("vs.yaml"),
        &VIRTUAL_SERVICE.replace("jason", "alice"),
    );
    let changed = loop {
        let response = client.recv().await.unwrap();
        client.ack(&response).await.unwrap();
        if response.type_url == TypeUrl::Route.as_str() {
            break decode_all::<RouteConfiguration>(&response).unwrap();
        }
    };
    let alice = Request::new("reviews", 9080, "/").header("end-user", "alice");
    assert_eq!(
        simulate::route(route_for(&changed, "9080"), &alice).unwrap(),
        RouteOutcome::Cluster(format!("outbound|9080|v2|{REVIEWS}"))
    );
    assert!(before.is_empty(), "{before:?}");
    assert_eq!(
        unchanged().await,
        ["meshfed_xds_pushes_unchanged{type=\"lds\"} 1"],
        "no CDS/EDS generated for the edit; LDS generated and found unchanged"
    );
    server.shutdown().await;
}

/// Whether `text` is in the encoding of `message` (filter configs are nested in Anys,
/// so this finds a name or a principal anywhere in a listener or chain).
fn encodes(message: &impl prost::Message, text: &str) -> bool {
    let bytes = message.encode_to_vec();
    bytes.windows(text.len()).any(|w| w == text.as_bytes())
}

/// `examples/security` (the README's security example) on the bundled mock registry:
/// every object applies, none is rejected, the CUSTOM provider is found, and the
/// sidecar of reviews gets STRICT mTLS with its JWT and RBAC filters.
#[tokio::test]
async fn the_security_example_applies_to_the_bundled_mock_registry() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/security");
    let validate = std::process::Command::new(env!("CARGO_BIN_EXE_meshfed"))
        .args(["validate", "-f"])
        .arg(root.join("config"))
        .output()
        .unwrap();
    assert!(
        validate.status.success(),
        "{}",
        String::from_utf8_lossy(&validate.stdout)
    );
    let mesh = root.join("mesh.yaml");
    let server = FakeServer::builder()
        .embedded_mock_registry()
        .config_dir(root.join("config"))
        .configure(move |c| c.mesh_config = Some(mesh))
        .start()
        .await
        .unwrap();
    ready_and_synced(&server).await;
    let configz = get_json(server.bound().http, "/debug/configz").await;
    assert_eq!(configz["objects"].as_array().unwrap().len(), 6, "{configz}");
    assert_eq!(configz["rejected"], serde_json::json!([]));
    assert_eq!(configz["selectingNoWorkload"], serde_json::json!([]));
    let mut client = AdsClient::connect(
        server.grpc_addr(),
        node_with(
            "sidecar~127.0.1.1~reviews-v1.bookinfo~bookinfo.svc.cluster.local",
            serde_json::json!({"LABELS": {"app": "reviews", "version": "v1"}}),
        ),
    )
    .await
    .unwrap();
    let ProxyConfig { listeners, .. } = client.fetch_config().await.unwrap();
    let inbound = listeners
        .iter()
        .find(|l| l.name == "virtualInbound")
        .expect("virtualInbound");
    let port: Vec<_> = inbound
        .filter_chains
        .iter()
        .filter(|c| c.name == "0.0.0.0_19080")
        .collect();
    assert_eq!(port.len(), 1, "STRICT: the mTLS chain only");
    assert!(port[0].transport_socket.is_some());
    for needle in [
        "envoy.filters.http.jwt_authn",
        "envoy.filters.http.rbac",
        "spiffe://cluster.local/ns/bookinfo/sa/productpage",
    ] {
        assert!(encodes(port[0], needle), "{needle}");
    }
    server.shutdown().await;
}

/// Bad security input, as Istio treats it: an unknown action and a malformed JWKS are
/// rejected alone (object, field, reason in `/debug/configz`); a principal that can
/// never match and a selector that matches nothing are accepted and reported; the
/// sidecar the odd principal's policy selects still gets listeners Envoy accepts (the
/// test build checks every resource against Envoy's validation rules).
#[tokio::test]
async fn bad_security_input_is_rejected_or_reported_and_never_reaches_envoy() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("bad.yaml"),
        r#"apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: unknown-action, namespace: default}
spec: {action: MAYBE, rules: [{}]}
---
apiVersion: security.istio.io/v1
kind: RequestAuthentication
metadata: {name: bad-jwks, namespace: default}
spec:
  jwtRules:
  - {issuer: me, jwks: '{"keys": "none"}'}
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: spiffe-principal, namespace: default}
spec:
  selector: {matchLabels: {version: v1}}
  rules:
  - from: [{source: {principals: ["spiffe://cluster.local/ns/default/sa/a", "a*b"]}}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: selects-nothing, namespace: default}
spec:
  selector: {matchLabels: {app: nosuch}}
  rules: [{}]
"#,
    )
    .unwrap();
    let server = setup(dir.path()).await;
    let configz = get_json(server.bound().http, "/debug/configz").await;
    let mut applied: Vec<&str> = configz["objects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["name"].as_str().unwrap())
        .collect();
    applied.sort();
    assert_eq!(applied, ["selects-nothing", "spiffe-principal"]);
    let rejected = configz["rejected"].to_string();
    assert!(
        rejected.contains("unknown-action") && rejected.contains("spec.action"),
        "{rejected}"
    );
    assert!(
        rejected.contains("bad-jwks") && rejected.contains("jwks"),
        "{rejected}"
    );
    assert_eq!(
        configz["selectingNoWorkload"],
        serde_json::json!(["AuthorizationPolicy default/selects-nothing: app=nosuch"])
    );
    // The sidecar of reviews v1 gets its RBAC, built from the odd principals.
    let mut client = AdsClient::connect(
        server.grpc_addr(),
        node_with(
            "sidecar~10.0.0.1~reviews-v1.default~default.svc.cluster.local",
            serde_json::json!({"LABELS": {"version": "v1"}}),
        ),
    )
    .await
    .unwrap();
    let ProxyConfig { listeners, .. } = client.fetch_config().await.unwrap();
    let inbound = listeners
        .iter()
        .find(|l| l.name == "virtualInbound")
        .expect("virtualInbound");
    assert!(
        encodes(inbound, "spiffe://spiffe://cluster.local/ns/default/sa/a"),
        "the principal as Istio writes it (it never matches)"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn configz_lists_security_policies_whose_selector_matches_no_workload() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("policies.yaml"),
        "apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: v1-only, namespace: default}
spec:
  selector: {matchLabels: {version: v1}}
  rules: [{}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: typo, namespace: default}
spec:
  selector: {matchLabels: {version: v9}}
  rules: [{}]
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: other-namespace, namespace: prod}
spec:
  selector: {matchLabels: {version: v1}}
  mtls: {mode: STRICT}
",
    )
    .unwrap();
    let server = setup(dir.path()).await;
    let configz = get_json(server.bound().http, "/debug/configz").await;
    assert_eq!(
        configz["selectingNoWorkload"],
        serde_json::json!([
            "AuthorizationPolicy default/typo: version=v9",
            "PeerAuthentication prod/other-namespace: version=v1"
        ])
    );
    server.shutdown().await;
}

#[tokio::test]
async fn an_invalid_object_is_rejected_alone_and_shown_in_configz() {
    let dir = tempfile::tempdir().unwrap();
    let bad_vs = VIRTUAL_SERVICE.replace("weight: 20", "weight: 30");
    std::fs::write(
        dir.path().join("all.yaml"),
        format!("{DESTINATION_RULE}---\n{bad_vs}"),
    )
    .unwrap();
    let server = setup(dir.path()).await;
    let http = server.bound().http;
    let configz = get_json(http, "/debug/configz").await;
    let objects: Vec<&str> = configz["objects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["kind"].as_str().unwrap())
        .collect();
    assert_eq!(objects, vec!["DestinationRule"], "the valid object applies");
    let rejected = configz["rejected"].to_string();
    assert!(rejected.contains("all.yaml:"), "file and line: {rejected}");
    assert!(rejected.contains("weight"), "the field: {rejected}");

    // Without a VirtualService the default route goes to the service's cluster, and the
    // DestinationRule's subsets still exist.
    let mut client = AdsClient::connect(
        server.grpc_addr(),
        node_with(
            "sidecar~10.9.0.1~pp.default~default.svc.cluster.local",
            serde_json::json!({}),
        ),
    )
    .await
    .unwrap();
    let (clusters, _, routes, _) = full_config(&mut client).await;
    assert!(clusters.iter().any(|c| c.name.contains("|v2|")));
    let outcome = simulate::route(
        route_for(&routes, "9080"),
        &Request::new("reviews", 9080, "/"),
    )
    .unwrap();
    assert_eq!(
        outcome,
        RouteOutcome::Cluster(format!("outbound|9080||{REVIEWS}"))
    );
    let (_, metrics) = http_get(server.bound().monitoring, "/metrics").await;
    assert!(metrics.contains("meshfed_config_rejected 1"), "{metrics}");
    server.shutdown().await;
}

#[test]
fn validate_command_reports_file_line_field_and_fails() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.yaml");
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&good, DESTINATION_RULE).unwrap();
    std::fs::write(&bad, VIRTUAL_SERVICE.replace("weight: 20", "weight: 30")).unwrap();
    let bin = env!("CARGO_BIN_EXE_meshfed");
    let ok = std::process::Command::new(bin)
        .args(["validate", "-f"])
        .arg(&good)
        .output()
        .unwrap();
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stdout)
    );
    let failed = std::process::Command::new(bin)
        .args(["validate", "-f"])
        .arg(&good)
        .arg(&bad)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&failed.stdout);
    assert!(!failed.status.success());
    assert!(
        out.contains("bad.yaml:") && out.contains("VirtualService") && out.contains("weight"),
        "{out}"
    );
}

/// Issue 15 finding 5: config Envoy refuses is refused by `meshfed validate` too.
#[test]
fn validate_command_refuses_what_envoy_would_nack() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("nack.yaml");
    std::fs::write(
        &bad,
        r#"apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: nack, namespace: default}
spec:
  hosts: [reviews]
  http:
  - match: [{uri: {regex: "a{1001}"}}]
    headers: {request: {set: {"Bad Header:": x}}}
    route: [{destination: {host: reviews}}]
"#,
    )
    .unwrap();
    let failed = std::process::Command::new(env!("CARGO_BIN_EXE_meshfed"))
        .args(["validate", "-f"])
        .arg(&bad)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&failed.stdout);
    assert!(!failed.status.success(), "{out}");
    assert!(
        out.contains("spec.http[0].match[0].uri.regex") && out.contains("{1001}"),
        "{out}"
    );
    assert!(
        out.contains("spec.http[0].headers.request.set[Bad Header:]"),
        "{out}"
    );
}

/// Every resource the library encodes in these tests is checked against Envoy's own
/// field rules (the `testing` feature): a cluster without a name would be NACKed.
#[test]
#[should_panic(expected = "Envoy would NACK resource \"nameless\"")]
fn encoding_checks_envoys_rules_in_tests() {
    meshfed::xds::EncodedResource::encode(
        meshfed::xds::TypeUrl::Cluster,
        "nameless",
        &Cluster::default(),
    );
}

/// Security policies in the config directory are read and validated; those meshfed
/// does not fully apply (here the AUDIT policy, which proxyless gRPC servers cannot
/// apply) are counted in `meshfed_config_not_enforced` (and logged at warn) rather than
/// silently ignored, the PeerAuthentication and the ALLOW policy are applied by every
/// proxy and not counted, and an invalid one is rejected like any object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_policies_are_counted_as_not_enforced() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("security.yaml"),
        "apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: default, namespace: istio-system}
spec: {mtls: {mode: STRICT}}
---
apiVersion: security.istio.io/v1beta1
kind: AuthorizationPolicy
metadata: {name: allow-nothing, namespace: foo}
spec: {}
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: audit, namespace: foo}
spec: {action: AUDIT, rules: [{}]}
---
apiVersion: security.istio.io/v1
kind: RequestAuthentication
metadata: {name: bad, namespace: foo}
spec:
  jwtRules:
  - audiences: [a]
",
    )
    .unwrap();
    let server = meshfed::testing::FakeServer::builder()
        .config_dir(dir.path())
        .start()
        .await
        .unwrap();
    let (http, monitoring) = (server.bound().http, server.bound().monitoring);
    ready_and_synced(&server).await;
    let metrics = http_get(monitoring, "/metrics").await.1;
    assert_eq!(
        metric(&metrics, "meshfed_config_not_enforced"),
        Some(1.0),
        "{metrics}"
    );
    assert_eq!(
        metric(&metrics, "meshfed_config_rejected"),
        Some(1.0),
        "{metrics}"
    );
    let configz = http_get(http, "/debug/configz").await.1;
    assert!(
        configz.contains("issuer or jwksUri must be non-empty string"),
        "{configz}"
    );
    server.shutdown().await;
}
