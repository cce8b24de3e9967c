//! The Gateway API served end to end with the registries' state: listeners admitting
//! routes by namespace labels (`allowedRoutes.namespaces.from: Selector`, the labels of
//! `kind: Namespace` objects in the config directory) and backends looked up among the
//! registries' services (`BackendNotFound`, answered 500 by the router), both followed
//! as they change.

use meshfed::generate::simulate::{Call, CallMode, RouteOutcome, simulate_call};
use meshfed::testing::{AdsClient, FakeServer, ProxyConfig, node_with};
use meshfed_registry::{Endpoint, Protocol};
use serde_json::Value;

use crate::support::*;

const NAMESPACES: &str = "\
apiVersion: v1
kind: Namespace
metadata:
  name: team-a
  labels: {shared-gateway-access: \"true\"}
---
apiVersion: v1
kind: Namespace
metadata:
  name: team-b
";

const GATEWAY_AND_ROUTES: &str = "\
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw, namespace: infra}
spec:
  gatewayClassName: istio
  listeners:
  - name: http
    hostname: \"*.example.com\"
    port: 80
    protocol: HTTP
    allowedRoutes:
      namespaces:
        from: Selector
        selector:
          matchLabels: {shared-gateway-access: \"true\"}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: web, namespace: team-a}
spec:
  parentRefs: [{name: gw, namespace: infra}]
  hostnames: [a.example.com]
  rules:
  - matches: [{path: {type: PathPrefix, value: /missing}}]
    backendRefs: [{name: missing, port: 80}]
  - backendRefs: [{name: web, port: 80}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: web, namespace: team-b}
spec:
  parentRefs: [{name: gw, namespace: infra}]
  hostnames: [b.example.com]
  rules:
  - backendRefs: [{name: web, port: 80}]
";

/// The `parents[0]` condition `kind` of route `ns/name` in `/debug/configz`:
/// `(status, reason)`.
fn route_condition(configz: &Value, ns: &str, name: &str, kind: &str) -> (String, String) {
    let status = configz["gatewayApi"]["status"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["kind"] == "HTTPRoute" && s["namespace"] == ns && s["name"] == name)
        .unwrap_or_else(|| panic!("no status of HTTPRoute {ns}/{name}: {configz}"));
    let condition = status["status"]["parents"][0]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == kind)
        .unwrap_or_else(|| panic!("no {kind} condition in {status}"));
    (
        condition["status"].as_str().unwrap().to_string(),
        condition["reason"].as_str().unwrap().to_string(),
    )
}

fn pair(status: &str, reason: &str) -> (String, String) {
    (status.to_string(), reason.to_string())
}

async fn router(server: &FakeServer) -> ProxyConfig {
    let mut router = AdsClient::connect(
        server.grpc_addr(),
        node_with(
            "router~127.0.3.1~gw-istio-1.infra~infra.svc.cluster.local",
            serde_json::json!({}),
        ),
    )
    .await
    .unwrap();
    router.fetch_config().await.unwrap()
}

fn get(host: &str, path: &str) -> Call {
    let mut call = Call::http(8080).to("127.0.3.1").host(host);
    call.path = path.to_string();
    call.mode = CallMode::Gateway;
    call
}

#[tokio::test]
async fn selector_listeners_and_missing_backends_follow_the_registries() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("namespaces.yaml"), NAMESPACES).unwrap();
    std::fs::write(dir.path().join("gateway.yaml"), GATEWAY_AND_ROUTES).unwrap();
    let server = FakeServer::builder()
        .config_dir(dir.path())
        .start()
        .await
        .unwrap();
    let reg = server.mock_registry("c1");
    // The gateway's Service (Istio's generated `<gateway>-istio`) with the router as
    // its endpoint, and `web` in both teams' namespaces.
    let gw = service(
        "gw-istio.infra.svc.cluster.local",
        "infra",
        &[("http", 80, Protocol::Http)],
    );
    reg.add_service(gw.clone());
    reg.set_endpoints(
        &gw.key(),
        vec![Endpoint::new("127.0.3.1".parse().unwrap()).with_port("http", 8080)],
    );
    add_http_service(
        &reg,
        "web.team-a.svc.cluster.local",
        "team-a",
        &["127.0.3.10"],
    );
    add_http_service(
        &reg,
        "web.team-b.svc.cluster.local",
        "team-b",
        &["127.0.3.11"],
    );
    ready_and_synced(&server).await;

    let configz = get_json(server.bound().http, "/debug/configz").await;
    // team-a is labelled for the listener's selector, team-b is not.
    assert_eq!(
        route_condition(&configz, "team-a", "web", "Accepted"),
        pair("True", "Accepted")
    );
    assert_eq!(
        route_condition(&configz, "team-b", "web", "Accepted"),
        pair("False", "NotAllowedByListeners")
    );
    // team-a's route names a Service no registry has.
    assert_eq!(
        route_condition(&configz, "team-a", "web", "ResolvedRefs"),
        pair("False", "BackendNotFound")
    );
    // /debug/configz names the object and the spec field of each problem.
    let problems: Vec<String> = configz["gatewayApi"]["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            format!(
                "{} {}/{}: {}",
                p["kind"].as_str().unwrap(),
                p["namespace"].as_str().unwrap(),
                p["name"].as_str().unwrap(),
                p["problem"].as_str().unwrap()
            )
        })
        .collect();
    for expected in [
        "HTTPRoute team-a/web: spec.rules: ResolvedRefs BackendNotFound: backend(missing.team-a.svc.cluster.local) not found",
        "HTTPRoute team-b/web: spec.parentRefs[0]: Accepted NotAllowedByListeners",
    ] {
        assert!(
            problems.iter().any(|p| p.starts_with(expected)),
            "missing {expected:?} in {problems:#?}"
        );
    }

    // The router: team-a's host is served, the missing backend answers 500, team-b's
    // host is not served.
    let ProxyConfig {
        listeners,
        routes,
        clusters,
    } = router(&server).await;
    let web = simulate_call(&listeners, &routes, &clusters, &get("a.example.com", "/")).unwrap();
    assert_eq!(
        web.outcome,
        RouteOutcome::Cluster("outbound|80||web.team-a.svc.cluster.local".into())
    );
    let missing = simulate_call(
        &listeners,
        &routes,
        &clusters,
        &get("a.example.com", "/missing"),
    )
    .unwrap();
    assert_eq!(missing.outcome, RouteOutcome::DirectResponse(500));
    let refused = simulate_call(&listeners, &routes, &clusters, &get("b.example.com", "/"));
    assert!(refused.is_err(), "{refused:?}");

    // The missing Service appears: the route resolves without any config change.
    add_http_service(
        &reg,
        "missing.team-a.svc.cluster.local",
        "team-a",
        &["127.0.3.12"],
    );
    server.sync().await;
    let configz = get_json(server.bound().http, "/debug/configz").await;
    assert_eq!(
        route_condition(&configz, "team-a", "web", "ResolvedRefs"),
        pair("True", "ResolvedRefs")
    );

    // team-b gets the label: its route is admitted; team-a loses it: refused.
    std::fs::write(
        dir.path().join("namespaces.yaml"),
        NAMESPACES
            .replace("  labels: {shared-gateway-access: \"true\"}\n", "")
            .replace(
                "  name: team-b\n",
                "  name: team-b\n  labels: {shared-gateway-access: \"true\"}\n",
            ),
    )
    .unwrap();
    let http = server.bound().http;
    eventually("team-b's route to be admitted", || async move {
        let configz = get_json(http, "/debug/configz").await;
        (route_condition(&configz, "team-b", "web", "Accepted") == pair("True", "Accepted"))
            .then_some(())
    })
    .await;
    server.sync().await;
    let configz = get_json(http, "/debug/configz").await;
    assert_eq!(
        route_condition(&configz, "team-a", "web", "Accepted"),
        pair("False", "NotAllowedByListeners")
    );
}

const BACKEND_TLS: &str = "\
apiVersion: gateway.networking.k8s.io/v1
kind: BackendTLSPolicy
metadata: {name: web-tls, namespace: team-a}
spec:
  targetRefs: [{group: \"\", kind: Service, name: web, sectionName: https}]
  validation:
    wellKnownCACertificates: System
    hostname: web.example.com
";

/// A BackendTLSPolicy served: the DestinationRule it becomes sets TLS with the policy's
/// SNI on the port its `sectionName` names, in the clusters a sidecar gets; the other
/// port stays plaintext.
#[tokio::test]
async fn a_backend_tls_policy_originates_tls_on_the_port_it_names() {
    use envoy_types::pb::envoy::config::core::v3::transport_socket::ConfigType;
    use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::UpstreamTlsContext;

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("policy.yaml"), BACKEND_TLS).unwrap();
    let server = FakeServer::builder()
        .config_dir(dir.path())
        .start()
        .await
        .unwrap();
    let reg = server.mock_registry("c1");
    let web = service(
        "web.team-a.svc.cluster.local",
        "team-a",
        &[
            ("http", 80, Protocol::Http),
            ("https", 443, Protocol::Https),
        ],
    );
    reg.add_service(web.clone());
    reg.set_endpoints(
        &web.key(),
        vec![
            Endpoint::new("127.0.3.20".parse().unwrap())
                .with_port("http", 8080)
                .with_port("https", 8443),
        ],
    );
    ready_and_synced(&server).await;

    let configz = get_json(server.bound().http, "/debug/configz").await;
    let generated: Vec<&str> = configz["gatewayApi"]["generated"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["name"].as_str().unwrap())
        .collect();
    assert_eq!(generated, ["web~istio-autogenerated-k8s-gateway"]);
    assert_eq!(configz["gatewayApi"]["problems"], serde_json::json!([]));

    let mut sidecar = AdsClient::connect(
        server.grpc_addr(),
        node_with(
            "sidecar~127.0.3.30~sleep-1.team-a~team-a.svc.cluster.local",
            serde_json::json!({}),
        ),
    )
    .await
    .unwrap();
    let ProxyConfig { clusters, .. } = sidecar.fetch_config().await.unwrap();
    let tls_of = |name: &str| {
        let cluster = clusters
            .iter()
            .find(|c| c.name == name)
            .unwrap_or_else(|| panic!("no cluster {name}"));
        cluster
            .transport_socket
            .as_ref()
            .and_then(|t| match &t.config_type {
                Some(ConfigType::TypedConfig(a)) => {
                    <UpstreamTlsContext as prost::Message>::decode(a.value.as_slice()).ok()
                }
                _ => None,
            })
    };
    let https = tls_of("outbound|443||web.team-a.svc.cluster.local").expect("TLS on 443");
    assert_eq!(https.sni, "web.example.com");
    assert!(
        tls_of("outbound|80||web.team-a.svc.cluster.local")
            .is_none_or(|t| t.sni != "web.example.com"),
        "port 80 is not named by the policy"
    );
}

/// In Kubernetes (deploy/rbac.yaml enforced), the ConfigMap a BackendTLSPolicy names
/// as its CA is followed by name: missing, the policy's status says so as istiod's
/// does and the credential fails closed (`invalid://`); created later, it is picked
/// up and the policy points at it (`configmap://`, served over SDS).
#[tokio::test]
async fn a_kubernetes_ca_config_map_created_later_is_picked_up() {
    use meshfed::app::{KubeSettings, KubeSource};
    use meshfed_kube::fake_api::{CustomResource, objects};

    let api = EnforcedApi::start().await;
    api.apply(&objects::namespace("istio-system", &[]));
    api.apply(&objects::namespace("apps", &[]));
    api.install_crds(CustomResource::istio(&["v1"]));
    api.install_crd(CustomResource::new(
        "gateway.networking.k8s.io",
        "BackendTLSPolicy",
        "backendtlspolicies",
        &["v1"],
    ));
    api.apply(&objects::service(
        "apps",
        "web",
        "10.96.0.30",
        &[("https", 443)],
    ));
    api.apply_custom(&serde_json::json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "BackendTLSPolicy",
        "metadata": {"name": "web-tls", "namespace": "apps"},
        "spec": {
            "targetRefs": [{"group": "", "kind": "Service", "name": "web"}],
            "validation": {
                "caCertificateRefs": [{"group": "", "kind": "ConfigMap", "name": "web-ca"}],
                "hostname": "web.example.com",
            },
        },
    }));
    let client = api.client();
    let server = FakeServer::builder()
        .configure(move |c| {
            c.kubernetes = Some(KubeSettings {
                source: KubeSource::Client(client),
                namespaces: meshfed_kube::NamespaceFilter::All,
                system_namespace: "istio-system".into(),
                remote_secrets: Default::default(),
            });
        })
        .start()
        .await
        .unwrap();
    let http = server.bound().http;
    let credential = |configz: &Value| {
        configz["gatewayApi"]["generated"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|o| o["kind"] == "DestinationRule")
            .map(|o| o["spec"]["trafficPolicy"]["tls"]["credentialName"].clone())
    };
    let configz = eventually("the policy translated", || async move {
        let c = get_json(http, "/debug/configz").await;
        credential(&c).is_some().then_some(c)
    })
    .await;
    assert_eq!(credential(&configz).unwrap(), "invalid://");
    let problems = configz["gatewayApi"]["problems"].to_string();
    assert!(
        problems.contains(
            "Certificate reference invalid: reference apps/web-ca (of kind ConfigMap) not found"
        ),
        "{problems}"
    );

    api.apply(&objects::config_map(
        "apps",
        "web-ca",
        &[("ca.crt", "-----BEGIN CERTIFICATE-----")],
    ));
    let configz = eventually("the ConfigMap picked up", || async move {
        let c = get_json(http, "/debug/configz").await;
        (credential(&c)? == "configmap://apps/web-ca").then_some(c)
    })
    .await;
    assert_eq!(configz["gatewayApi"]["problems"], serde_json::json!([]));
    server.shutdown().await;
}
