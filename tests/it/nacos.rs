//! The Nacos registry end to end: a fake Nacos speaking Nacos 2.x gRPC (with push) and
//! the HTTP API, meshfed bridging it, and a sidecar seeing the result over ADS.

use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::address::Address;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
use meshfed::ads::TypeUrl;
use meshfed::testing::{AdsClient, FakeServer, node};
use meshfed_nacos::NacosConfig;
use meshfed_nacos::fake::{FakeNacos, Instance};

use crate::support::*;

const WEB: &str = "outbound|8080||web.default-group.public.nacos";
const PROXY: &str = "sidecar~10.2.0.1~app.default~default.svc.cluster.local";

fn addresses(cla: &ClusterLoadAssignment) -> Vec<String> {
    let mut out: Vec<String> = cla
        .endpoints
        .iter()
        .flat_map(|l| &l.lb_endpoints)
        .filter_map(|e| match &e.host_identifier {
            Some(HostIdentifier::Endpoint(ep)) => {
                ep.address.as_ref().and_then(|a| match &a.address {
                    Some(Address::SocketAddress(s)) => Some(s.address.clone()),
                    _ => None,
                })
            }
            _ => None,
        })
        .collect();
    out.sort();
    out
}

#[tokio::test]
async fn a_sidecar_gets_a_nacos_services_endpoints_and_their_pushes() {
    let nacos = FakeNacos::start().await.unwrap();
    for ip in ["10.0.0.1", "10.0.0.2"] {
        nacos.register(Instance::new("web", ip, 8080).with_meta("protocol", "http"));
    }
    let config = NacosConfig {
        refresh_interval: Duration::from_millis(200),
        retry_interval: Duration::from_millis(20),
        max_retry_interval: Duration::from_millis(200),
        ..NacosConfig::new([nacos.server_addr()]).unwrap()
    };
    let server = FakeServer::builder()
        .configure(move |c| c.add_registry(Arc::new(config)))
        .start()
        .await
        .unwrap();
    let http = server.bound().http;
    eventually("the Nacos registry to sync", || async move {
        (http_get(http, "/ready").await.0 == 200).then_some(())
    })
    .await;
    let registryz = get_json(http, "/debug/registryz").await;
    let nacos_registry = registryz["registries"]
        .as_array()
        .and_then(|rs| rs.iter().find(|r| r["provider"] == "Nacos").cloned())
        .expect("the Nacos registry in registryz");
    assert_eq!(nacos_registry["registry"], "Nacos/nacos");
    assert_eq!(nacos_registry["stale"], false);
    server.sync().await;

    let mut client = AdsClient::connect(server.grpc_addr(), node(PROXY))
        .await
        .unwrap();
    client.subscribe(TypeUrl::Cluster, &[]).await.unwrap();
    let clusters = client.recv_clusters().await.unwrap();
    assert!(clusters.iter().any(|c| c.name == WEB), "{clusters:?}");
    client.subscribe(TypeUrl::Endpoint, &[WEB]).await.unwrap();
    let cla = client.recv_load_assignments().await.unwrap();
    assert_eq!(addresses(&cla[0]), ["10.0.0.1", "10.0.0.2"]);

    // A push from Nacos reaches the sidecar as an EDS update.
    nacos.register(Instance::new("web", "10.0.0.3", 8080).with_meta("protocol", "http"));
    let cla = client.recv_load_assignments().await.unwrap();
    assert_eq!(
        (cla[0].cluster_name.as_str(), addresses(&cla[0])),
        (
            WEB,
            vec!["10.0.0.1".into(), "10.0.0.2".into(), "10.0.0.3".into()]
        )
    );
    let (_, metrics) = http_get(server.bound().monitoring, "/metrics").await;
    assert!(
        metric(&metrics, "meshfed_nacos_transport{transport=\"grpc\"}") == Some(1.0),
        "{metrics}"
    );
    server.shutdown().await;
}
