//! Federation end to end (issue 32's first "done means"): a meshfed with Consul and
//! mock registries serves MCP-over-xDS; a second meshfed reads it through
//! `configSources` and serves a sidecar that routes to the Consul service with the
//! right endpoints; a Consul change reaches that sidecar; the source going away keeps
//! the last known good.

use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::address::Address;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
use meshfed::ads::TypeUrl;
use meshfed::app::ConsulSettings;
use meshfed::testing::{AdsClient, FakeServer, node};
use meshfed_consul::fake::{FakeConsul, Instance};

use crate::support::*;

const SIDECAR: &str = "sidecar~10.9.0.1~app.default~default.svc.cluster.local";
const WEB: &str = "outbound|8080||web.service.consul";
const MOCK: &str = "outbound|80||inventory.mock.internal";

fn ips(clas: &[ClusterLoadAssignment]) -> Vec<String> {
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

/// What a new sidecar of `server` gets for `cluster`: whether CDS has it, and its
/// EDS endpoints (empty without the cluster).
async fn sidecar_view(server: std::net::SocketAddr, cluster: &str) -> Option<(bool, Vec<String>)> {
    let mut client = AdsClient::connect(server, node(SIDECAR)).await.ok()?;
    client.subscribe(TypeUrl::Cluster, &[]).await.ok()?;
    let clusters = client.recv_clusters().await.ok()?;
    if !clusters.iter().any(|c| c.name == cluster) {
        return Some((false, Vec::new()));
    }
    client.subscribe(TypeUrl::Endpoint, &[cluster]).await.ok()?;
    let clas = client.recv_load_assignments().await.ok()?;
    Some((true, ips(&clas)))
}

#[tokio::test]
async fn a_second_meshfed_routes_to_consul_through_the_first_ones_mcp() {
    // The federating meshfed: Consul and a mock registry.
    let consul = FakeConsul::start().await.unwrap();
    for (id, ip) in [("web-1", "10.0.0.1"), ("web-2", "10.0.0.2")] {
        consul.register(Instance::new("web", id, ip, 8080).with_meta("protocol", "http"));
    }
    let settings = ConsulSettings {
        retry_interval: Duration::from_millis(20),
        max_retry_interval: Duration::from_millis(200),
        ..ConsulSettings::new(consul.url())
    };
    let federator = FakeServer::builder()
        .configure(move |c| c.consul = Some(settings))
        .start()
        .await
        .unwrap();
    let mock = federator.mock_registry("mock-dc");
    add_http_service(&mock, "inventory.mock.internal", "mock", &["10.1.0.1"]);
    ready_and_synced(&federator).await;

    // The consuming meshfed: no registry, config from the first one's MCP.
    let dir = tempfile::tempdir().unwrap();
    let mesh = dir.path().join("mesh.yaml");
    let source = format!("xds://{}", federator.grpc_addr());
    std::fs::write(&mesh, format!("configSources:\n- address: {source}\n")).unwrap();
    let consumer = FakeServer::builder()
        .configure(|c| c.mesh_config = Some(mesh))
        .start()
        .await
        .unwrap();
    ready_and_synced(&consumer).await;
    let grpc = consumer.grpc_addr();
    let view = eventually(
        "the Consul service in the consumer's sidecar",
        || async move {
            sidecar_view(grpc, WEB)
                .await
                .filter(|(has, ips)| *has && ips.len() == 2)
        },
    )
    .await;
    assert_eq!(view.1, ["10.0.0.1", "10.0.0.2"]);
    // The mock registry's service came along too.
    let (has, ips) = sidecar_view(grpc, MOCK).await.unwrap();
    assert!(has);
    assert_eq!(ips, ["10.1.0.1"]);
    let configz = get_json(consumer.bound().http, "/debug/configz").await;
    assert!(
        configz["objects"]
            .as_array()
            .unwrap()
            .iter()
            .any(|o| o["kind"] == "ServiceEntry" && o["source"] == source.as_str()),
        "{configz}"
    );

    // A Consul change reaches the consumer's sidecar.
    consul.register(Instance::new("web", "web-3", "10.0.0.3", 8080).with_meta("protocol", "http"));
    eventually(
        "the new Consul instance in the consumer's sidecar",
        || async move {
            sidecar_view(grpc, WEB)
                .await
                .filter(|(_, ips)| ips == &["10.0.0.1", "10.0.0.2", "10.0.0.3"])
        },
    )
    .await;

    // The source goes away: the consumer keeps the last known good.
    federator.shutdown().await;
    let http = consumer.bound().http;
    eventually("the source marked stale", || async move {
        let configz = get_json(http, "/debug/configz").await;
        let s = &configz["configSources"][0];
        (s["stale"] == true && s["connected"] == false).then_some(())
    })
    .await;
    let (has, ips) = sidecar_view(grpc, WEB).await.unwrap();
    assert!(has);
    assert_eq!(ips, ["10.0.0.1", "10.0.0.2", "10.0.0.3"]);
    consumer.shutdown().await;
}
