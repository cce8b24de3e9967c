//! MCP-over-xDS as an istiod reading `configSources` sees it: node metadata
//! `GENERATOR=api`, the type URLs Istio's config-source client subscribes to
//! (`adsc.ConfigInitialRequests`: the mesh config, then every Pilot kind), SotW and
//! Delta, the `istio.mcp.v1alpha1.Resource` envelope, pushes on config and registry
//! changes, removals, the secure port's allow-list, and Istio's `apigen_test.go`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use meshfed::app::CaSource;
use meshfed::testing::{AdsClient, ClientTls, DeltaClient, FakeServer, node_with, tls_channel};
use meshfed::xds::TypeUrl;
use meshfed_api::mcp::v1alpha1::Resource;
use meshfed_api::networking::v1alpha3 as net;
use meshfed_registry::config::ConfigObject;
use meshfed_registry::{ClusterId, Protocol, ServiceKey};
use prost::Message;
use tonic::Code;
use tonic::metadata::MetadataMap;

use crate::secure::issue;
use crate::support::*;

/// The node of istiod's config-source client (adsc's defaults: a sidecar id in
/// `default`), with `GENERATOR=api`.
fn istiod_node(namespace: &str) -> envoy_types::pb::envoy::config::core::v3::Node {
    node_with(
        &format!("sidecar~10.0.0.50~istiod-1.{namespace}~{namespace}.svc.cluster.local"),
        serde_json::json!({"GENERATOR": "api", "NAMESPACE": namespace}),
    )
}

/// What `adsc.ConfigInitialRequests()` asks at Istio HEAD: `gvk.MeshConfig`, then
/// `collections.Pilot` (each kind's preferred version). ProxyConfig and WasmPlugin
/// are kinds meshfed does not hold, and this test holds no EnvoyFilter: answered with
/// no resources.
const ISTIOD_WATCHES: &[&str] = &[
    "core/v1alpha1/MeshConfig",
    "security.istio.io/v1/AuthorizationPolicy",
    "networking.istio.io/v1/DestinationRule",
    "networking.istio.io/v1alpha3/EnvoyFilter",
    "networking.istio.io/v1/Gateway",
    "security.istio.io/v1/PeerAuthentication",
    "networking.istio.io/v1beta1/ProxyConfig",
    "security.istio.io/v1/RequestAuthentication",
    "networking.istio.io/v1/ServiceEntry",
    "networking.istio.io/v1/Sidecar",
    "telemetry.istio.io/v1/Telemetry",
    "networking.istio.io/v1/VirtualService",
    "extensions.istio.io/v1alpha1/WasmPlugin",
    "networking.istio.io/v1/WorkloadEntry",
    "networking.istio.io/v1/WorkloadGroup",
];

const SE: &str = "networking.istio.io/v1alpha3/ServiceEntry";
const WE: &str = "networking.istio.io/v1alpha3/WorkloadEntry";
const VS: &str = "networking.istio.io/v1alpha3/VirtualService";
const CONSUL_HOST: &str = "web.service.consul";

fn mcp(url: &str) -> TypeUrl {
    TypeUrl::parse(url).unwrap_or_else(|| panic!("{url} is served"))
}

/// A server whose mock registry (cluster `dc1`) has `web.service.consul` in `shop`
/// with two endpoints.
async fn server() -> (FakeServer, meshfed_registry::MemoryRegistry, ServiceKey) {
    let server = FakeServer::builder().start().await.unwrap();
    let reg = server.mock_registry("dc1");
    let mut svc = service(CONSUL_HOST, "shop", &[("http", 8080, Protocol::Http)]);
    svc.cluster_vips
        .insert(ClusterId::new("dc1"), vec!["10.96.0.7".parse().unwrap()]);
    reg.add_service(svc);
    let key = ServiceKey::new(CONSUL_HOST, "shop");
    reg.set_endpoints(
        &key,
        vec![
            endpoint("10.0.0.1", "http", 18080, "r1/z1"),
            endpoint("10.0.0.2", "http", 18080, "r1/z2"),
        ],
    );
    server.sync().await;
    (server, reg, key)
}

/// A VirtualService of [`CONSUL_HOST`] routing to it.
fn routes_to_web() -> net::VirtualService {
    serde_json::from_value(serde_json::json!({
        "hosts": [CONSUL_HOST],
        "http": [{"route": [{"destination": {"host": CONSUL_HOST}}]}],
    }))
    .unwrap()
}

/// The resources of a response, as `Resource` envelopes.
fn envelopes(response: &DiscoveryResponse) -> Vec<Resource> {
    response
        .resources
        .iter()
        .map(|any| {
            assert_eq!(
                any.type_url,
                "type.googleapis.com/istio.mcp.v1alpha1.Resource"
            );
            Resource::decode(any.value.as_slice()).unwrap()
        })
        .collect()
}

fn names(resources: &[Resource]) -> Vec<String> {
    resources
        .iter()
        .map(|r| r.metadata.as_ref().unwrap().name.clone())
        .collect()
}

/// Subscribes to every type istiod asks for and collects one ACKed answer each.
async fn istiod_subscribes(client: &mut AdsClient) -> BTreeMap<String, DiscoveryResponse> {
    for url in ISTIOD_WATCHES {
        client
            .send(DiscoveryRequest {
                type_url: (*url).to_string(),
                ..Default::default()
            })
            .await
            .unwrap();
    }
    let mut answers = BTreeMap::new();
    while answers.len() < ISTIOD_WATCHES.len() {
        let response = client.recv().await.unwrap();
        if TypeUrl::parse(&response.type_url).is_some() {
            client.ack(&response).await.unwrap();
        } else {
            // Types meshfed does not hold: answered once, outside the conversation.
            client
                .send(DiscoveryRequest {
                    type_url: response.type_url.clone(),
                    response_nonce: response.nonce.clone(),
                    version_info: response.version_info.clone(),
                    ..Default::default()
                })
                .await
                .unwrap();
        }
        answers.insert(response.type_url.clone(), response);
    }
    answers
}

#[tokio::test]
async fn istiods_config_source_client_gets_every_kind_in_the_mcp_envelope() {
    let (server, _reg, _) = server().await;
    let mut vs = ConfigObject::new("shop", "web-routes", routes_to_web());
    vs.labels.insert("team".into(), "web".into());
    server.config_store().apply(vs).unwrap();
    server.sync().await;

    let mut client = AdsClient::connect(server.grpc_addr(), istiod_node("istio-system"))
        .await
        .unwrap();
    let answers = istiod_subscribes(&mut client).await;
    for url in ISTIOD_WATCHES {
        assert!(answers.contains_key(*url), "{url} answered");
    }
    for unheld in [
        "networking.istio.io/v1alpha3/EnvoyFilter",
        "networking.istio.io/v1beta1/ProxyConfig",
        "extensions.istio.io/v1alpha1/WasmPlugin",
    ] {
        assert!(answers[unheld].resources.is_empty(), "{unheld}");
    }
    // The mesh config: one MeshConfig, not wrapped.
    let mesh = &answers["core/v1alpha1/MeshConfig"];
    assert_eq!(mesh.resources.len(), 1);
    assert_eq!(
        mesh.resources[0].type_url,
        "type.googleapis.com/istio.mesh.v1alpha1.MeshConfig"
    );
    // The config object, as the store holds it.
    let vss = envelopes(&answers["networking.istio.io/v1/VirtualService"]);
    assert_eq!(names(&vss), ["shop/web-routes"]);
    let meta = vss[0].metadata.as_ref().unwrap();
    assert_eq!(meta.labels.get("team").map(String::as_str), Some("web"));
    assert!(!meta.version.is_empty(), "a version istiod compares");
    let body = vss[0].body.as_ref().unwrap();
    assert_eq!(
        body.type_url,
        "type.googleapis.com/istio.networking.v1alpha3.VirtualService"
    );
    let spec = net::VirtualService::decode(body.value.as_ref()).unwrap();
    assert_eq!(spec.hosts, [CONSUL_HOST]);
    // The synthesized ServiceEntry and its WorkloadEntries.
    let ses = envelopes(&answers["networking.istio.io/v1/ServiceEntry"]);
    assert_eq!(names(&ses), ["shop/synthetic-web.service.consul"]);
    let se = net::ServiceEntry::decode(ses[0].body.as_ref().unwrap().value.as_ref()).unwrap();
    assert_eq!(se.hosts, [CONSUL_HOST]);
    assert_eq!(se.addresses, ["10.96.0.7"]);
    assert_eq!(se.ports[0].name, "http");
    assert_eq!(se.ports[0].number, 8080);
    assert_eq!(se.ports[0].protocol, "HTTP");
    assert_eq!(se.resolution, net::service_entry::Resolution::Static as i32);
    assert_eq!(
        se.location,
        net::service_entry::Location::MeshInternal as i32
    );
    let selector = se.workload_selector.as_ref().unwrap().labels.clone();
    let wes = envelopes(&answers["networking.istio.io/v1/WorkloadEntry"]);
    assert_eq!(
        names(&wes),
        [
            "shop/synthetic-web.service.consul-10.0.0.1-18080",
            "shop/synthetic-web.service.consul-10.0.0.2-18080"
        ]
    );
    let we = net::WorkloadEntry::decode(wes[0].body.as_ref().unwrap().value.as_ref()).unwrap();
    assert_eq!(we.address, "10.0.0.1");
    assert_eq!(we.ports.get("http"), Some(&18080));
    assert_eq!(we.locality, "r1/z1");
    for (k, v) in &selector {
        assert_eq!(we.labels.get(k), Some(v), "selected by the ServiceEntry");
    }
    server.shutdown().await;
}

#[tokio::test]
async fn config_and_registry_changes_push_the_kinds_they_change() {
    let (server, reg, key) = server().await;
    let mut client = AdsClient::connect(server.grpc_addr(), istiod_node("istio-system"))
        .await
        .unwrap();
    for url in [SE, WE, VS] {
        client.subscribe(mcp(url), &[]).await.unwrap();
        client.recv_type(mcp(url)).await.unwrap();
    }

    // A config change pushes its kind, and only it.
    server
        .config_store()
        .apply(ConfigObject::new("shop", "canary", routes_to_web()))
        .unwrap();
    let pushed = client.recv_type(mcp(VS)).await.unwrap();
    assert_eq!(names(&envelopes(&pushed)), ["shop/canary"]);

    // An endpoint change pushes the WorkloadEntries alone.
    reg.set_endpoints(&key, vec![endpoint("10.0.0.3", "http", 18080, "r1/z1")]);
    let pushed = client.recv_type(mcp(WE)).await.unwrap();
    assert_eq!(
        names(&envelopes(&pushed)),
        ["shop/synthetic-web.service.consul-10.0.0.3-18080"]
    );

    // A service that goes is removed from both kinds.
    reg.remove_service(&key);
    let mut got = BTreeMap::new();
    while got.len() < 2 {
        let response = client.recv().await.unwrap();
        client.ack(&response).await.unwrap();
        got.insert(response.type_url.clone(), envelopes(&response).len());
    }
    assert_eq!(
        got,
        BTreeMap::from([(SE.to_string(), 0), (WE.to_string(), 0)])
    );
    server.shutdown().await;
}

#[tokio::test]
async fn delta_clients_get_changes_and_removals_by_name() {
    let (server, reg, key) = server().await;
    let mut client = DeltaClient::connect(server.grpc_addr(), istiod_node("istio-system"))
        .await
        .unwrap();
    client.subscribe(mcp(SE), &[], &[]).await.unwrap();
    let first = client.recv_type(mcp(SE)).await.unwrap();
    let held: Vec<&str> = first.resources.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(held, ["shop/synthetic-web.service.consul"]);
    assert!(!first.resources[0].version.is_empty());

    let mut other = service(
        "api.service.consul",
        "shop",
        &[("grpc", 9090, Protocol::Grpc)],
    );
    other.cluster_vips.clear();
    reg.add_service(other);
    let added = client.recv_type(mcp(SE)).await.unwrap();
    let names: Vec<&str> = added.resources.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(
        names,
        ["shop/synthetic-api.service.consul"],
        "only the change"
    );
    assert!(added.removed_resources.is_empty());

    reg.remove_service(&key);
    let removed = client.recv_type(mcp(SE)).await.unwrap();
    assert!(removed.resources.is_empty());
    assert_eq!(
        removed.removed_resources,
        ["shop/synthetic-web.service.consul"]
    );
    server.shutdown().await;
}

/// Served objects are exactly what `meshfed validate` accepts: each Resource turned
/// into Istio's YAML form passes the validator.
#[tokio::test]
async fn served_objects_round_trip_through_istio_yaml_and_validate() {
    let (server, reg, _) = server().await;
    let mut dns = service("db.service.consul", "data", &[("tcp", 5432, Protocol::Tcp)]);
    dns.resolution = meshfed_registry::Resolution::DnsLb;
    dns.location = meshfed_registry::MeshLocation::MeshExternal;
    dns.cluster_vips.clear();
    reg.add_service(dns);
    let key = ServiceKey::new("db.service.consul", "data");
    let mut host = meshfed_registry::Endpoint::for_hostname("db-1.node.consul");
    host.ports.insert("tcp".into(), 5432);
    host.labels.insert("bad label".into(), "x".into());
    reg.set_endpoints(&key, vec![host]);
    server.sync().await;
    let mut client = AdsClient::connect(server.grpc_addr(), istiod_node("istio-system"))
        .await
        .unwrap();
    let mut checked = 0;
    for (url, kind) in [(SE, "ServiceEntry"), (WE, "WorkloadEntry")] {
        client.subscribe(mcp(url), &[]).await.unwrap();
        let response = client.recv_type(mcp(url)).await.unwrap();
        for resource in envelopes(&response) {
            let yaml = istio_yaml(kind, &resource);
            let report = meshfed_registry::config::validate_text(Path::new("served.yaml"), &yaml);
            assert!(report.errors.is_empty(), "{yaml}\n{:?}", report.errors);
            assert_eq!(report.objects.len(), 1, "{yaml}");
            checked += 1;
        }
    }
    // Two ServiceEntries, three WorkloadEntries (the DNS one by host name).
    assert_eq!(checked, 5);
    server.shutdown().await;
}

/// A served `Resource` in Istio's YAML form (`kubectl get -o yaml` of the object).
fn istio_yaml(kind: &str, resource: &Resource) -> String {
    let meta = resource.metadata.as_ref().unwrap();
    let (namespace, name) = meta.name.split_once('/').unwrap();
    let body = resource.body.as_ref().unwrap();
    let spec = match kind {
        "ServiceEntry" => {
            serde_json::to_value(net::ServiceEntry::decode(body.value.as_ref()).unwrap())
        }
        _ => serde_json::to_value(net::WorkloadEntry::decode(body.value.as_ref()).unwrap()),
    }
    .unwrap();
    let object = serde_json::json!({
        "apiVersion": "networking.istio.io/v1",
        "kind": kind,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": meta.labels,
            "annotations": meta.annotations,
        },
        "spec": spec,
    });
    serde_norway::to_string(&object).unwrap()
}

struct SecureMesh {
    _dir: tempfile::TempDir,
    ca_dir: PathBuf,
    server: FakeServer,
}

async fn secure_mesh() -> SecureMesh {
    let dir = tempfile::tempdir().unwrap();
    let ca_dir = dir.path().join("ca");
    let server = FakeServer::builder()
        .embedded_mock_registry()
        .configure(|c| {
            c.ca = Some(CaSource::Dir {
                cacerts: None,
                self_signed_dir: ca_dir.clone(),
            });
        })
        .start()
        .await
        .unwrap();
    server.sync().await;
    SecureMesh {
        _dir: dir,
        ca_dir,
        server,
    }
}

impl SecureMesh {
    async fn client(
        &self,
        identity: &str,
        node: envoy_types::pb::envoy::config::core::v3::Node,
    ) -> AdsClient {
        let tls = ClientTls {
            roots_pem: std::fs::read_to_string(self.ca_dir.join("root-cert.pem")).unwrap(),
            identity: Some(issue(&self.ca_dir, identity)),
            server_name: "istiod.istio-system.svc".into(),
        };
        let channel = tls_channel(self.server.secure_grpc_addr(), &tls)
            .await
            .unwrap();
        AdsClient::over(channel, MetadataMap::new(), node)
            .await
            .unwrap()
    }
}

#[tokio::test]
async fn the_secure_port_serves_mcp_to_the_allow_list_only() {
    let mesh = secure_mesh().await;
    // The system namespace's identities are allowed by default.
    let mut istiod = mesh
        .client(
            "spiffe://cluster.local/ns/istio-system/sa/istiod",
            istiod_node("istio-system"),
        )
        .await;
    istiod.subscribe(mcp(SE), &[]).await.unwrap();
    let answer = istiod.recv_type(mcp(SE)).await.unwrap();
    assert!(
        !envelopes(&answer).is_empty(),
        "the embedded mock's services"
    );

    // An istiod-shaped client of another namespace is refused at once.
    let mut other = mesh
        .client(
            "spiffe://cluster.local/ns/apps/sa/istiod",
            istiod_node("apps"),
        )
        .await;
    other.subscribe(mcp(SE), &[]).await.unwrap();
    let status = other.recv_error().await.unwrap();
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert!(
        status.message().contains("--mcpAllowedIdentities"),
        "{status:?}"
    );

    // A workload that asks for an MCP type is refused too.
    let sidecar = node_with(
        "sidecar~10.0.0.9~app-1.apps~apps.svc.cluster.local",
        serde_json::json!({"NAMESPACE": "apps"}),
    );
    let mut workload = mesh
        .client("spiffe://cluster.local/ns/apps/sa/app", sidecar)
        .await;
    workload.subscribe(mcp(VS), &[]).await.unwrap();
    let status = workload.recv_error().await.unwrap();
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");

    let (_, metrics) = http_get(mesh.server.bound().monitoring, "/metrics").await;
    assert_eq!(metric(&metrics, "meshfed_mcp_denied_total"), Some(2.0));
    mesh.server.shutdown().await;
}

/// Istio's `pilot/pkg/networking/apigen/apigen_test.go`, vector by vector. Those
/// meshfed does not pass are in [`KNOWN_GAPS`], whose test fails once one passes.
mod istio_apigen {
    use super::*;
    use meshfed::ads::mcp::McpServing;

    /// `initDS`: a memory registry service `fortio1.fortio.svc.cluster.local` (HTTP
    /// port `http-main`, 8081, VIP 10.10.10.1) with one endpoint (127.0.0.1:14056), or
    /// with `addresses`.
    async fn init_ds(addresses: &[&str]) -> FakeServer {
        let server = FakeServer::builder().start().await.unwrap();
        let reg = server.mock_registry("Kubernetes-mem");
        let host = "fortio1.fortio.svc.cluster.local";
        let mut svc = service(host, "fortio", &[("http-main", 8081, Protocol::Http)]);
        svc.cluster_vips.insert(
            ClusterId::new("Kubernetes-mem"),
            vec!["10.10.10.1".parse().unwrap()],
        );
        reg.add_service(svc);
        reg.set_endpoints(
            &ServiceKey::new(host, "fortio"),
            addresses
                .iter()
                .map(|a| endpoint(a, "http-main", 14056, ""))
                .collect(),
        );
        server.sync().await;
        server
    }

    /// `TestAPIGen/adsc` and `TestAPIGenWithMulAddresses/adsc`: an api client with
    /// `APIWatches()` gets a ServiceEntry response (holding the registry's service).
    async fn adsc_gets_service_entries(addresses: &[&str]) {
        let server = init_ds(addresses).await;
        let mut client = AdsClient::connect(server.grpc_addr(), istiod_node("default"))
            .await
            .unwrap();
        let answers = istiod_subscribes(&mut client).await;
        let ses = envelopes(&answers["networking.istio.io/v1/ServiceEntry"]);
        assert_eq!(
            names(&ses),
            ["fortio/synthetic-fortio1.fortio.svc.cluster.local"]
        );
        let wes = envelopes(&answers["networking.istio.io/v1/WorkloadEntry"]);
        assert_eq!(wes.len(), addresses.len());
        server.shutdown().await;
    }

    #[tokio::test]
    async fn test_api_gen_adsc() {
        adsc_gets_service_entries(&["127.0.0.1"]).await;
    }

    #[tokio::test]
    async fn test_api_gen_with_mul_addresses_adsc() {
        adsc_gets_service_entries(&["127.0.0.1", "2001:1::1"]).await;
    }

    // `TestAPIGenRequiresControlPlaneIdentity`, on the secure port (where meshfed
    // knows identities).
    const SYSTEM: &str = "spiffe://cluster.local/ns/istio-system/sa/istiod";

    #[test]
    fn requires_control_plane_identity_non_system_namespace_rejected() {
        assert!(
            !McpServing::default().admits(true, Some("spiffe://cluster.local/ns/attacker/sa/x"))
        );
    }

    #[test]
    fn requires_control_plane_identity_control_plane_identity_allowed() {
        assert!(McpServing::default().admits(true, Some(SYSTEM)));
    }

    #[test]
    fn requires_control_plane_identity_gate_disabled_allows_unauthenticated() {
        // The plaintext port is the gate turned off.
        assert!(McpServing::default().admits(false, None));
    }

    /// Vectors meshfed does not pass, with why. Each entry's check returns whether
    /// meshfed now behaves as the vector wants: the test fails when one does, so the
    /// entry moves out of this list.
    const KNOWN_GAPS: &[(&str, &str)] = &[
        (
            "TestAPIGenRequiresControlPlaneIdentity/unauthenticated rejected",
            "the plaintext port (15010) serves MCP to any client, as Istio's xds:// config sources dial it plaintext (README: Differences from istiod)",
        ),
        (
            "TestAPIGenADSRejectsUnauthenticated",
            "the same: a GENERATOR=api stream without identity on 15010 is served",
        ),
    ];

    #[tokio::test]
    async fn known_gaps_still_differ() {
        assert_eq!(KNOWN_GAPS.len(), 2);
        // unauthenticated rejected: would need `admits(false, None)` to be false.
        assert!(
            McpServing::default().admits(false, None),
            "{} passes now: move it out of KNOWN_GAPS",
            KNOWN_GAPS[0].0
        );
        // ADS rejects unauthenticated: the plaintext stream is answered, not ended.
        let server = init_ds(&["127.0.0.1"]).await;
        let mut client = AdsClient::connect(server.grpc_addr(), istiod_node("default"))
            .await
            .unwrap();
        client.subscribe(mcp(SE), &[]).await.unwrap();
        assert!(
            client.recv_type(mcp(SE)).await.is_ok(),
            "{} passes now: move it out of KNOWN_GAPS",
            KNOWN_GAPS[1].0
        );
        server.shutdown().await;
    }
}

/// `examples/feed-istiod`: its mock registry file is served as the README says, and
/// its mesh config lists meshfed's plaintext port and istiod's own cluster.
#[tokio::test]
async fn the_feed_istiod_example_serves_its_registry() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/feed-istiod");
    let mesh: serde_json::Value =
        serde_norway::from_str(&std::fs::read_to_string(root.join("istio-mesh.yaml")).unwrap())
            .unwrap();
    let sources: Vec<&str> = mesh["configSources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["address"].as_str().unwrap())
        .collect();
    assert_eq!(sources, ["xds://meshfed.istio-system.svc:15010", "k8s://"]);

    let server = FakeServer::builder()
        .mock_registry_file(root.join("mock-registry.yaml"))
        .start()
        .await
        .unwrap();
    ready_and_synced(&server).await;
    let mut client = AdsClient::connect(server.grpc_addr(), istiod_node("istio-system"))
        .await
        .unwrap();
    client.subscribe(mcp(SE), &[]).await.unwrap();
    let ses = envelopes(&client.recv_type(mcp(SE)).await.unwrap());
    assert_eq!(
        names(&ses),
        [
            "shop/synthetic-payments.service.consul",
            "shop/synthetic-web.service.consul"
        ]
    );
    client.subscribe(mcp(WE), &[]).await.unwrap();
    let wes = envelopes(&client.recv_type(mcp(WE)).await.unwrap());
    assert_eq!(wes.len(), 3);
    server.shutdown().await;
}
