//! The README's EnvoyFilter example (`examples/envoyfilter`) on the bundled mock
//! registry: a Lua filter before the router on the reviews workload's inbound, echo's
//! cluster connect timeout merged mesh-wide, a response header added on the ingress
//! gateway's route configuration; their status in `/debug/configz` and
//! `pilot_envoy_filter_status`; and an EnvoyFilter change pushing only the proxies it
//! selects.

use envoy_types::pb::envoy::config::listener::v3::{Listener, filter};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
use meshfed::testing::{AdsClient, FakeServer, ProxyConfig, node_with};
use meshfed::xds::TypeUrl;
use prost::Message;
use serde_json::{Value, json};

use crate::support::*;

fn example() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/envoyfilter/config")
}

/// The HTTP filter names of each connection manager of listener `name`.
fn http_filters(listeners: &[Listener], name: &str) -> Vec<Vec<String>> {
    listeners
        .iter()
        .filter(|l| l.name == name)
        .flat_map(|l| l.filter_chains.iter())
        .flat_map(|c| c.filters.iter())
        .filter(|f| f.name == "envoy.filters.network.http_connection_manager")
        .filter_map(|f| match &f.config_type {
            Some(filter::ConfigType::TypedConfig(a)) => {
                HttpConnectionManager::decode(a.value.as_slice()).ok()
            }
            _ => None,
        })
        .map(|h| h.http_filters.into_iter().map(|f| f.name).collect())
        .collect()
}

async fn config_of(server: &FakeServer, id: &str, labels: Value) -> ProxyConfig {
    let mut client =
        AdsClient::connect(server.grpc_addr(), node_with(id, json!({"LABELS": labels})))
            .await
            .unwrap();
    client.fetch_config().await.unwrap()
}

const REVIEWS: &str = "sidecar~127.0.1.1~reviews-v1.bookinfo~bookinfo.svc.cluster.local";
const ECHO: &str = "sidecar~127.0.0.1~echo-v1.default~default.svc.cluster.local";
const INGRESS: &str = "router~127.0.2.1~ingress.istio-system~istio-system.svc.cluster.local";

#[test]
fn the_envoyfilter_example_validates() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_meshfed"))
        .args(["validate", "-f"])
        .arg(example())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("5 valid object(s), 0 error(s)"), "{text}");
    // A value that is no Envoy type is refused with its field.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("bad.yaml"),
        "apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {name: bad, namespace: default}
spec:
  configPatches:
  - applyTo: HTTP_FILTER
    patch:
      operation: ADD
      value:
        name: old
        typed_config: {'@type': type.googleapis.com/envoy.config.filter.http.lua.v2.Lua}
",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_meshfed"))
        .args(["validate", "-f"])
        .arg(dir.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains("spec.configPatches[0].patch.value") && text.contains("v3 XDS API"),
        "{text}"
    );
}

#[tokio::test]
async fn the_envoyfilter_example_is_served() {
    let server = FakeServer::builder()
        .embedded_mock_registry()
        .config_dir(example())
        .start()
        .await
        .unwrap();
    ready_and_synced(&server).await;

    // reviews: Lua right before the router on its inbound connection managers only.
    let reviews = config_of(&server, REVIEWS, json!({"app": "reviews", "version": "v1"})).await;
    let inbound = http_filters(&reviews.listeners, "virtualInbound");
    assert!(!inbound.is_empty());
    for chain in &inbound {
        let n = chain.len();
        assert_eq!(
            chain[n - 2..],
            ["envoy.filters.http.lua", "envoy.filters.http.router"],
            "{chain:?}"
        );
    }
    for l in reviews
        .listeners
        .iter()
        .filter(|l| l.name != "virtualInbound")
    {
        for chain in http_filters(&reviews.listeners, &l.name) {
            assert!(
                !chain.contains(&"envoy.filters.http.lua".to_string()),
                "{}",
                l.name
            );
        }
    }
    // echo (another workload): no Lua; both get the connect timeout of the root
    // namespace's EnvoyFilter on echo's HTTP cluster, and only there.
    let echo = config_of(&server, ECHO, json!({"app": "echo", "version": "v1"})).await;
    for chain in http_filters(&echo.listeners, "virtualInbound") {
        assert!(!chain.contains(&"envoy.filters.http.lua".to_string()));
    }
    for config in [&reviews, &echo] {
        let timeout = |name: &str| {
            config
                .clusters
                .iter()
                .find(|c| c.name == name)
                .unwrap_or_else(|| panic!("{name}"))
                .connect_timeout
                .unwrap()
        };
        assert_eq!(
            timeout("outbound|8080||echo.default.svc.cluster.local").seconds,
            3
        );
        assert_ne!(
            timeout("outbound|7070||echo.default.svc.cluster.local").seconds,
            3
        );
    }

    // The gateway's route configuration carries the header.
    let ingress = config_of(&server, INGRESS, json!({"istio": "ingressgateway"})).await;
    let rc = ingress
        .routes
        .iter()
        .find(|r| r.name == "http.80")
        .unwrap_or_else(|| {
            panic!(
                "{:?}",
                ingress.routes.iter().map(|r| &r.name).collect::<Vec<_>>()
            )
        });
    let headers: Vec<_> = rc
        .response_headers_to_add
        .iter()
        .filter_map(|h| h.header.as_ref())
        .map(|h| (h.key.as_str(), h.value.as_str()))
        .collect();
    assert_eq!(headers, [("x-served-by", "meshfed")]);

    // Status: applied per EnvoyFilter and patch type.
    let configz = get_json(server.bound().http, "/debug/configz").await;
    let status = configz["envoyFilters"].as_array().unwrap();
    let applied = |name: &str, patch: &str| {
        status.iter().any(|s| {
            s["name"] == name && s["applied"].as_array().unwrap().iter().any(|p| p == patch)
        })
    };
    assert!(applied("bookinfo/reviews-lua", "httpfilter"), "{configz}");
    assert!(
        applied("istio-system/echo-connect-timeout", "cluster"),
        "{configz}"
    );
    assert!(applied("istio-system/gateway-header", "route"), "{configz}");
    let metrics = http_get(server.bound().monitoring, "/metrics").await.1;
    assert_eq!(
        metric(
            &metrics,
            "pilot_envoy_filter_status{name=\"bookinfo/reviews-lua\",patch=\"httpfilter\",result=\"applied\"}"
        ),
        Some(1.0),
        "{metrics}"
    );
    server.shutdown().await;
}

/// The proxies (`name.namespace` of their node ids) of the first recorded push of
/// `change` (`Kind/namespace/name`), sorted.
async fn pushed(server: &FakeServer, change: &str) -> Vec<String> {
    let pushes = eventually(change, || async {
        let p: Vec<_> = server
            .server()
            .pipeline()
            .history()
            .into_iter()
            .filter(|p| p.changes.iter().any(|c| c == change))
            .collect();
        (!p.is_empty()).then_some(p)
    })
    .await;
    let mut ids: Vec<String> = pushes[0]
        .proxies
        .iter()
        .map(|p| p.split('-').next().unwrap().to_string())
        .collect();
    ids.sort();
    ids
}

/// Connects a proxy of node id `id` with `labels` and takes its first CDS answer.
async fn connected(server: &FakeServer, id: &str, labels: Value) -> AdsClient {
    let mut c = AdsClient::connect(server.grpc_addr(), node_with(id, json!({"LABELS": labels})))
        .await
        .unwrap();
    c.subscribe(TypeUrl::Cluster, &[]).await.unwrap();
    c.recv_type(TypeUrl::Cluster).await.unwrap();
    c
}

/// A change to an EnvoyFilter selecting one workload pushes only the proxies it
/// selects; one of the root namespace pushes every proxy.
#[tokio::test]
async fn an_envoyfilter_change_pushes_only_the_proxies_it_selects() {
    use meshfed_api::networking::v1alpha3::EnvoyFilter;
    use meshfed_registry::config::ConfigObject;
    let server = FakeServer::builder().start().await.unwrap();
    server.sync().await;
    let mut clients = Vec::new();
    for (id, app) in [
        ("sidecar~10.0.0.1~a.foo~foo.svc.cluster.local", "a"),
        ("sidecar~10.0.0.2~b.foo~foo.svc.cluster.local", "b"),
        ("sidecar~10.0.0.3~c.bar~bar.svc.cluster.local", "a"),
        ("router~10.0.0.4~gw.bar~bar.svc.cluster.local", "gw"),
    ] {
        clients.push(connected(&server, id, json!({"app": app})).await);
    }
    let ef = |app: Option<&str>, timeout: &str| {
        serde_json::from_value::<EnvoyFilter>(json!({
            "workloadSelector": app.map(|a| json!({"labels": {"app": a}})),
            "configPatches": [{"applyTo": "CLUSTER", "patch": {"operation": "MERGE",
                "value": {"connect_timeout": timeout}}}],
        }))
        .unwrap()
    };
    server
        .config_store()
        .apply(ConfigObject::new("foo", "only-a", ef(Some("a"), "2s")))
        .expect("valid EnvoyFilter");
    assert_eq!(pushed(&server, "EnvoyFilter/foo/only-a").await, ["a.foo"]);
    server
        .config_store()
        .apply(ConfigObject::new("istio-system", "mesh", ef(None, "4s")))
        .expect("valid EnvoyFilter");
    assert_eq!(
        pushed(&server, "EnvoyFilter/istio-system/mesh").await,
        ["a.foo", "b.foo", "c.bar", "gw.bar"]
    );
    drop(clients);
    server.shutdown().await;
}

/// A change to an EnvoyFilter with `targetRefs` pushes only the proxies of the
/// Gateway API gateways it names in its namespace (before and after the change); one
/// naming only a waypoint target (a Service) pushes none.
#[tokio::test]
async fn an_envoyfilter_change_with_target_refs_pushes_only_the_named_gateways_proxies() {
    use meshfed_api::networking::v1alpha3::EnvoyFilter;
    use meshfed_registry::config::ConfigObject;
    let server = FakeServer::builder().start().await.unwrap();
    server.sync().await;
    let label = "gateway.networking.k8s.io/gateway-name";
    let mut clients = Vec::new();
    for (id, labels) in [
        (
            "router~10.0.0.1~public.gw~gw.svc.cluster.local",
            json!({label: "public"}),
        ),
        (
            "router~10.0.0.2~private.gw~gw.svc.cluster.local",
            json!({label: "private"}),
        ),
        (
            "router~10.0.0.3~public.other~other.svc.cluster.local",
            json!({label: "public"}),
        ),
        (
            "router~10.0.0.4~classic.gw~gw.svc.cluster.local",
            json!({"istio": "ingressgateway"}),
        ),
        (
            "sidecar~10.0.0.5~app.gw~gw.svc.cluster.local",
            json!({"app": "public"}),
        ),
    ] {
        clients.push(connected(&server, id, labels).await);
    }
    let ef = |targets: Value, timeout: &str| {
        serde_json::from_value::<EnvoyFilter>(json!({
            "targetRefs": targets,
            "configPatches": [{"applyTo": "CLUSTER", "patch": {"operation": "MERGE",
                "value": {"connect_timeout": timeout}}}],
        }))
        .unwrap()
    };
    let gateway =
        |name: &str| json!({"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": name});
    let store = server.config_store();
    store
        .apply(ConfigObject::new(
            "gw",
            "to-public",
            ef(json!([gateway("public")]), "2s"),
        ))
        .expect("valid EnvoyFilter");
    assert_eq!(
        pushed(&server, "EnvoyFilter/gw/to-public").await,
        ["public.gw"]
    );
    // Retargeted: the proxies of the old and of the new target.
    store
        .apply(ConfigObject::new(
            "gw",
            "to-public",
            ef(json!([gateway("private")]), "2s"),
        ))
        .expect("valid EnvoyFilter");
    let retargeted = eventually("the retargeting push", || async {
        let p: Vec<_> = server
            .server()
            .pipeline()
            .history()
            .into_iter()
            .filter(|p| p.changes.iter().any(|c| c == "EnvoyFilter/gw/to-public"))
            .collect();
        (p.len() >= 2).then(|| p[0].clone())
    })
    .await;
    let mut ids: Vec<String> = retargeted
        .proxies
        .iter()
        .map(|p| p.split('-').next().unwrap().to_string())
        .collect();
    ids.sort();
    assert_eq!(ids, ["private.gw", "public.gw"]);
    store
        .apply(ConfigObject::new(
            "gw",
            "to-waypoint",
            ef(json!([{"kind": "Service", "name": "public"}]), "3s"),
        ))
        .expect("valid EnvoyFilter");
    assert!(
        pushed(&server, "EnvoyFilter/gw/to-waypoint")
            .await
            .is_empty()
    );
    drop(clients);
    server.shutdown().await;
}

/// `targetRefs` of `kind: Gateway` patch the proxies of that Gateway API gateway
/// (label `gateway.networking.k8s.io/gateway-name`) of the EnvoyFilter's namespace
/// only; a waypoint target (a Service) patches nothing and shows in `/debug/configz`.
#[tokio::test]
async fn target_refs_patch_the_named_gateways_proxies_and_waypoint_targets_are_reported() {
    use envoy_types::pb::envoy::config::cluster::v3::Cluster;
    use meshfed::testing::decode_all;
    use meshfed_api::networking::v1alpha3::EnvoyFilter;
    use meshfed_registry::config::ConfigObject;
    let server = FakeServer::builder().start().await.unwrap();
    server.sync().await;
    let ef = |target: Value| {
        serde_json::from_value::<EnvoyFilter>(json!({
            "targetRefs": [target],
            "configPatches": [{"applyTo": "CLUSTER", "patch": {"operation": "MERGE",
                "value": {"alt_stat_name": "patched"}}}],
        }))
        .unwrap()
    };
    let store = server.config_store();
    store
        .apply(ConfigObject::new(
            "gw",
            "to-public",
            ef(json!({"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "public"})),
        ))
        .expect("valid EnvoyFilter");
    store
        .apply(ConfigObject::new(
            "gw",
            "to-waypoint",
            ef(json!({"kind": "Service", "name": "public"})),
        ))
        .expect("valid EnvoyFilter");
    server.sync().await;
    let patched = |id: &'static str, labels: Value| {
        let server = &server;
        async move {
            let mut c =
                AdsClient::connect(server.grpc_addr(), node_with(id, json!({"LABELS": labels})))
                    .await
                    .unwrap();
            c.subscribe(TypeUrl::Cluster, &[]).await.unwrap();
            let clusters: Vec<Cluster> =
                decode_all(&c.recv_type(TypeUrl::Cluster).await.unwrap()).unwrap();
            assert!(!clusters.is_empty());
            clusters.iter().all(|c| c.alt_stat_name == "patched")
        }
    };
    let label = "gateway.networking.k8s.io/gateway-name";
    assert!(
        patched(
            "router~10.0.0.1~public-1.gw~gw.svc.cluster.local",
            json!({label: "public"})
        )
        .await
    );
    assert!(
        !patched(
            "router~10.0.0.2~private-1.gw~gw.svc.cluster.local",
            json!({label: "private"})
        )
        .await
    );
    assert!(
        !patched(
            "router~10.0.0.3~classic-1.gw~gw.svc.cluster.local",
            json!({"istio": "ingressgateway"})
        )
        .await
    );
    assert!(
        !patched(
            "sidecar~10.0.0.4~app-1.gw~gw.svc.cluster.local",
            json!({"app": "public"})
        )
        .await
    );
    let configz = get_json(server.bound().http, "/debug/configz").await;
    let statuses = configz["envoyFilters"].as_array().unwrap();
    let waypoint = statuses
        .iter()
        .find(|s| s["name"] == "gw/to-waypoint")
        .unwrap_or_else(|| panic!("{configz}"));
    assert!(
        waypoint["notApplied"][0]
            .as_str()
            .unwrap()
            .contains("waypoints, which meshfed does not serve"),
        "{waypoint}"
    );
    let public = statuses
        .iter()
        .find(|s| s["name"] == "gw/to-public")
        .unwrap();
    assert!(public.get("notApplied").is_none(), "{public}");
    server.shutdown().await;
}

/// A gateway route configuration `portNumber` match names the Gateway server's port:
/// through the router's port map it patches the route configuration of the port the
/// gateway workload listens on (`http.8080` for a server on port 80 of a gateway
/// service mapping 80 to target port 8080), as istiod's `GatewayPortMap`; a match on
/// the target port still holds, another port's does not.
#[tokio::test]
async fn a_gateway_route_configuration_port_match_follows_the_service_port_map() {
    use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
    let header_filter = |name: &str, port: u32| {
        format!(
            "apiVersion: networking.istio.io/v1alpha3\nkind: EnvoyFilter\nmetadata:\n  name: {name}\n  namespace: istio-system\nspec:\n  configPatches:\n  - applyTo: ROUTE_CONFIGURATION\n    match:\n      context: GATEWAY\n      routeConfiguration: {{portNumber: {port}}}\n    patch:\n      operation: MERGE\n      value:\n        response_headers_to_add:\n        - header: {{key: x-{name}, value: \"1\"}}\n---\n"
        )
    };
    let config = "apiVersion: networking.istio.io/v1alpha3\nkind: Gateway\nmetadata:\n  name: gw\n  namespace: istio-system\nspec:\n  selector:\n    istio: ingressgateway\n  servers:\n  - port: {number: 80, name: http, protocol: HTTP}\n    hosts: [\"example.com\"]\n---\napiVersion: networking.istio.io/v1alpha3\nkind: ServiceEntry\nmetadata:\n  name: ingress\n  namespace: istio-system\nspec:\n  hosts: [\"ingress.example.com\"]\n  ports:\n  - {number: 80, targetPort: 8080, name: http, protocol: HTTP}\n  resolution: STATIC\n  location: MESH_INTERNAL\n  endpoints:\n  - address: 1.1.1.1\n    labels: {istio: ingressgateway}\n---\n".to_string()
        + &header_filter("service-port", 80)
        + &header_filter("target-port", 8080)
        + &header_filter("other-port", 81);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("istio.yaml"), config).unwrap();
    let server = FakeServer::builder()
        .config_dir(dir.path())
        .start()
        .await
        .unwrap();
    ready_and_synced(&server).await;
    let mut client = AdsClient::connect(
        server.grpc_addr(),
        node_with(
            "router~1.1.1.1~istio-ingressgateway.istio-system~istio-system.svc.cluster.local",
            json!({"LABELS": {"istio": "ingressgateway"}}),
        ),
    )
    .await
    .unwrap();
    let routes: Vec<RouteConfiguration> = client.fetch_config().await.unwrap().routes;
    let rc = routes
        .iter()
        .find(|r| r.name == "http.8080")
        .unwrap_or_else(|| {
            panic!(
                "{:?}",
                routes.iter().map(|r| r.name.as_str()).collect::<Vec<_>>()
            )
        });
    let headers: Vec<&str> = rc
        .response_headers_to_add
        .iter()
        .filter_map(|h| h.header.as_ref().map(|h| h.key.as_str()))
        .collect();
    assert_eq!(headers, ["x-service-port", "x-target-port"]);
    server.shutdown().await;
}

/// A `SIDECAR_INBOUND` cluster patch matching a `service` patches the inbound cluster of
/// the port a sidecar serves that service on (Istio matches the services of the
/// inbound cluster's workload, as the cluster name carries none); another service's
/// match patches nothing there.
#[tokio::test]
async fn an_inbound_cluster_service_match_names_the_service_the_sidecar_serves() {
    use envoy_types::pb::envoy::config::cluster::v3::Cluster;
    let filter = |name: &str, service: &str| {
        format!(
            "apiVersion: networking.istio.io/v1alpha3\nkind: EnvoyFilter\nmetadata:\n  name: {name}\n  namespace: istio-system\nspec:\n  configPatches:\n  - applyTo: CLUSTER\n    match:\n      context: SIDECAR_INBOUND\n      cluster: {{service: {service}}}\n    patch:\n      operation: MERGE\n      value: {{alt_stat_name: {name}}}\n---\n"
        )
    };
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("istio.yaml"),
        filter("reviews-inbound", "reviews.bookinfo.svc.cluster.local")
            + &filter("echo-inbound", "echo.default.svc.cluster.local"),
    )
    .unwrap();
    let server = FakeServer::builder()
        .embedded_mock_registry()
        .config_dir(dir.path())
        .start()
        .await
        .unwrap();
    ready_and_synced(&server).await;
    let reviews = config_of(&server, REVIEWS, json!({"app": "reviews", "version": "v1"})).await;
    let inbound: Vec<&Cluster> = reviews
        .clusters
        .iter()
        .filter(|c| c.name.starts_with("inbound|19080|"))
        .collect();
    assert!(
        !inbound.is_empty(),
        "{:?}",
        reviews.clusters.iter().map(|c| &c.name).collect::<Vec<_>>()
    );
    for c in inbound {
        assert_eq!(c.alt_stat_name, "reviews-inbound", "{}", c.name);
    }
    for c in reviews
        .clusters
        .iter()
        .filter(|c| !c.name.starts_with("inbound|"))
    {
        assert!(!c.alt_stat_name.ends_with("-inbound"), "{}", c.name);
    }
    server.shutdown().await;
}
