//! `configSources` in the mesh config: a server reading its Istio config from an
//! `xds://` MCP source (a fake one in Istio's shape): the source's objects reach a
//! sidecar, a bad one is rejected and reported with the source, the source going
//! away keeps the last known good (marked stale), and a bad `configSources` entry
//! refuses the start naming the field.

use envoy_types::pb::envoy::config::core::v3::address::Address;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
use meshfed::ads::TypeUrl;
use meshfed::config_sources::fake::{FakeMcpServer, FakeStream, resource};
use meshfed::config_sources::store::type_url;
use meshfed::testing::{AdsClient, FakeServer, node};
use meshfed_api::networking::v1alpha3 as net;
use meshfed_registry::config::Kind;
use net::service_entry::{Location, Resolution};

use crate::support::*;

const SIDECAR: &str = "sidecar~10.9.0.1~app.default~default.svc.cluster.local";
const CLUSTER: &str = "outbound|8080||billing.mcp.internal";

/// A MESH_INTERNAL STATIC ServiceEntry with its endpoints inline, as a federating
/// source serves one.
fn billing(ips: &[&str]) -> net::ServiceEntry {
    net::ServiceEntry {
        hosts: vec!["billing.mcp.internal".into()],
        addresses: vec!["240.0.0.20".into()],
        ports: vec![net::ServicePort {
            number: 8080,
            protocol: "HTTP".into(),
            name: "http".into(),
            target_port: 0,
        }],
        location: Location::MeshInternal as i32,
        resolution: Resolution::Static as i32,
        endpoints: ips
            .iter()
            .map(|ip| net::WorkloadEntry {
                address: ip.to_string(),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

/// Reads the client's first requests, then sends every kind: the ServiceEntries
/// given, the others empty; reads each ACK.
async fn serve_all(
    stream: &mut FakeStream,
    version: &str,
    entries: Vec<envoy_types::pb::google::protobuf::Any>,
) {
    let mut entries = Some(entries);
    for kind in Kind::ALL {
        let resources = if kind == Kind::ServiceEntry {
            entries.take().unwrap_or_default()
        } else {
            Vec::new()
        };
        let nonce = stream.send(&type_url(kind), version, resources);
        // Skip the initial requests still queued; stop at this response's ACK.
        loop {
            let request = stream.request().await;
            if request.response_nonce == nonce {
                assert!(request.error_detail.is_none());
                break;
            }
        }
    }
}

fn mesh_file(dir: &tempfile::TempDir, sources: &[&str]) -> std::path::PathBuf {
    let path = dir.path().join("mesh.yaml");
    let mut text = String::from("configSources:\n");
    for s in sources {
        text.push_str(&format!("- address: {s}\n"));
    }
    std::fs::write(&path, text).unwrap();
    path
}

fn endpoint_ips(clas: &[ClusterLoadAssignment]) -> Vec<String> {
    let mut ips: Vec<String> = clas
        .iter()
        .flat_map(|c| &c.endpoints)
        .flat_map(|l| &l.lb_endpoints)
        .filter_map(|e| match &e.host_identifier {
            Some(HostIdentifier::Endpoint(ep)) => match ep.address.as_ref()?.address.as_ref()? {
                Address::SocketAddress(s) => Some(s.address.clone()),
                _ => None,
            },
            _ => None,
        })
        .collect();
    ips.sort();
    ips
}

async fn sidecar_endpoints(server: &FakeServer) -> (bool, Vec<String>) {
    let mut client = AdsClient::connect(server.grpc_addr(), node(SIDECAR))
        .await
        .unwrap();
    let config = client.fetch_config().await.unwrap();
    let has_cluster = config.clusters.iter().any(|c| c.name == CLUSTER);
    client
        .subscribe(TypeUrl::Endpoint, &[CLUSTER])
        .await
        .unwrap();
    let clas = client.recv_load_assignments().await.unwrap();
    (has_cluster, endpoint_ips(&clas))
}

#[tokio::test]
async fn objects_from_an_xds_source_reach_a_sidecar_and_outlive_the_source() {
    let mut mcp = FakeMcpServer::start(([127, 0, 0, 1], 0).into()).await;
    let dir = tempfile::tempdir().unwrap();
    let mesh = mesh_file(&dir, &[&format!("xds://{}", mcp.addr)]);
    let server = FakeServer::builder()
        .configure(|c| c.mesh_config = Some(mesh))
        .start()
        .await
        .unwrap();
    let source = format!("xds://{}", mcp.addr);
    // Not ready before the source has sent every kind.
    let (status, body) = http_get(server.bound().http, "/ready").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains(&format!("config source {source}")), "{body}");

    let mut stream = mcp.stream().await;
    let bad = net::ServiceEntry {
        hosts: vec![],
        ..billing(&["10.0.0.9"])
    };
    serve_all(
        &mut stream,
        "v1",
        vec![
            resource("mcp/billing", "1", &billing(&["10.0.0.1", "10.0.0.2"])),
            resource("mcp/broken", "1", &bad),
        ],
    )
    .await;
    ready_and_synced(&server).await;
    let (has_cluster, ips) = sidecar_endpoints(&server).await;
    assert!(has_cluster);
    assert_eq!(ips, ["10.0.0.1", "10.0.0.2"]);

    // Provenance, the rejection and the source's state in /debug/configz.
    let configz = get_json(server.bound().http, "/debug/configz").await;
    let billing_obj = configz["objects"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["name"] == "billing")
        .expect("billing in configz");
    assert_eq!(billing_obj["source"], source.as_str());
    let rejected = configz["rejected"].as_array().unwrap();
    assert!(
        rejected.iter().any(|r| r["name"] == "broken"
            && r["source"] == source.as_str()
            && r["errors"][0].as_str().unwrap().contains("hosts")),
        "{rejected:?}"
    );
    let sources = configz["configSources"].as_array().unwrap();
    assert_eq!(sources[0]["address"], source.as_str());
    assert_eq!(sources[0]["connected"], true);
    assert_eq!(sources[0]["objects"], 1);

    // A change the source sends reaches a sidecar.
    serve_all(
        &mut stream,
        "v2",
        vec![resource("mcp/billing", "2", &billing(&["10.0.0.3"]))],
    )
    .await;
    let grpc = server.grpc_addr();
    eventually("the changed endpoints", || async {
        let mut client = AdsClient::connect(grpc, node(SIDECAR)).await.ok()?;
        client.subscribe(TypeUrl::Cluster, &[]).await.ok()?;
        client.recv_clusters().await.ok()?;
        client.subscribe(TypeUrl::Endpoint, &[CLUSTER]).await.ok()?;
        let clas = client.recv_load_assignments().await.ok()?;
        (endpoint_ips(&clas) == ["10.0.0.3"]).then_some(())
    })
    .await;

    // The source goes away: the last known good stays, marked stale.
    stream.fail(tonic::Status::unavailable("source shutting down"));
    drop(stream);
    mcp.stop().await;
    let http = server.bound().http;
    eventually("the source marked stale", || async move {
        let configz = get_json(http, "/debug/configz").await;
        let s = &configz["configSources"][0];
        (s["stale"] == true && s["connected"] == false).then_some(())
    })
    .await;
    let (has_cluster, ips) = sidecar_endpoints(&server).await;
    assert!(has_cluster);
    assert_eq!(ips, ["10.0.0.3"]);
    let (_, metrics) = http_get(server.bound().monitoring, "/metrics").await;
    let label = format!("{{source=\"{source}\"}}");
    assert_eq!(
        metric(&metrics, &format!("meshfed_config_source_stale{label}")),
        Some(1.0),
        "{metrics}"
    );
    assert_eq!(
        metric(&metrics, &format!("meshfed_config_source_objects{label}")),
        Some(1.0)
    );
    server.shutdown().await;
}

#[tokio::test]
async fn bad_config_sources_refuse_the_start_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    for (sources, want) in [
        (
            vec!["k8s://", "k8s://"],
            "configSources[1].address: a second k8s://",
        ),
        (
            vec!["nacos://127.0.0.1:8848"],
            "configSources[0].address: \"nacos://127.0.0.1:8848\": unknown config source scheme",
        ),
        (vec!["xds://127.0.0.1"], "configSources[0].address"),
    ] {
        let mesh = mesh_file(&dir, &sources);
        let err = FakeServer::builder()
            .configure(|c| c.mesh_config = Some(mesh))
            .start()
            .await
            .unwrap_err();
        let text = format!("{err:#}");
        assert!(text.contains(want), "{sources:?}: {text}");
    }
    // k8s:// without the Kubernetes registry, and --configDir beside configSources.
    let mesh = mesh_file(&dir, &["k8s://"]);
    let err = FakeServer::builder()
        .configure(|c| c.mesh_config = Some(mesh))
        .start()
        .await
        .unwrap_err();
    assert!(
        format!("{err:#}").contains("k8s://, which needs the Kubernetes registry"),
        "{err:#}"
    );
    let mesh = mesh_file(&dir, &["xds://127.0.0.1:1"]);
    let err = FakeServer::builder()
        .config_dir(dir.path())
        .configure(|c| c.mesh_config = Some(mesh))
        .start()
        .await
        .unwrap_err();
    assert!(
        format!("{err:#}").contains("list it there as fs://"),
        "{err:#}"
    );
}

#[tokio::test]
async fn an_fs_source_is_a_config_directory() {
    let dir = tempfile::tempdir().unwrap();
    let config = tempfile::tempdir().unwrap();
    std::fs::write(
        config.path().join("se.yaml"),
        "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: billing, namespace: mcp}\nspec:\n  hosts: [billing.mcp.internal]\n  addresses: [240.0.0.20]\n  location: MESH_INTERNAL\n  resolution: STATIC\n  ports: [{number: 8080, name: http, protocol: HTTP}]\n  endpoints: [{address: 10.0.0.7}]\n",
    )
    .unwrap();
    let mesh = mesh_file(&dir, &[&format!("fs://{}", config.path().display())]);
    let server = FakeServer::builder()
        .configure(|c| c.mesh_config = Some(mesh))
        .start()
        .await
        .unwrap();
    ready_and_synced(&server).await;
    let (has_cluster, ips) = sidecar_endpoints(&server).await;
    assert!(has_cluster);
    assert_eq!(ips, ["10.0.0.7"]);
    server.shutdown().await;
}
