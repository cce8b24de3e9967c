//! The Eureka registry end to end: a fake Eureka speaking the real REST API (full
//! fetch, then deltas with the reconcile hash code), meshfed bridging it, and a
//! sidecar's ADS client seeing the applications' endpoints.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::address::Address;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
use meshfed::ads::TypeUrl;
use meshfed::testing::{AdsClient, FakeServer, node};
use meshfed_eureka::EurekaConfig;
use meshfed_eureka::fake::{FakeEureka, Instance, Status};

use crate::support::*;

const WEB: &str = "outbound|8080||web.eureka";
const WEB_TLS: &str = "outbound|8443||web.eureka";
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

async fn eureka_registry(http: SocketAddr) -> serde_json::Value {
    let r = get_json(http, "/debug/registryz").await;
    r["registries"]
        .as_array()
        .and_then(|rs| rs.iter().find(|r| r["provider"] == "Eureka").cloned())
        .expect("the Eureka registry in registryz")
}

#[tokio::test]
async fn a_eureka_application_reaches_a_sidecar_and_follows_deltas_and_outages() {
    let eureka = FakeEureka::start().await.unwrap();
    eureka.register(
        Instance::new("WEB", "web-1", "10.0.0.1", 8080)
            .with_secure_port(8443)
            .with_metadata("zone", "zone-a"),
    );
    eureka.register(Instance::new("WEB", "web-2", "10.0.0.2", 8080));
    eureka.register(Instance::new("WEB", "web-3", "10.0.0.3", 8080).with_status(Status::Starting));
    let settings = EurekaConfig {
        fetch_interval: Duration::from_millis(100),
        retry_interval: Duration::from_millis(20),
        region: Some("eu-west".into()),
        ..EurekaConfig::new(&eureka.url()).unwrap()
    };
    let server = FakeServer::builder()
        .configure(move |c| c.add_registry(Arc::new(settings)))
        .start()
        .await
        .unwrap();
    let http = server.bound().http;
    eventually("the Eureka registry to sync", || async move {
        (http_get(http, "/ready").await.0 == 200).then_some(())
    })
    .await;
    let registry = eureka_registry(http).await;
    assert_eq!(registry["registry"], "Eureka/eureka");
    assert_eq!(registry["synced"], true);
    assert_eq!(registry["stale"], false);
    server.sync().await;

    let mut client = AdsClient::connect(server.grpc_addr(), node(PROXY))
        .await
        .unwrap();
    client.subscribe(TypeUrl::Cluster, &[]).await.unwrap();
    let clusters = client.recv_clusters().await.unwrap();
    let names: Vec<&str> = clusters.iter().map(|c| c.name.as_str()).collect();
    assert!(
        names.contains(&WEB) && names.contains(&WEB_TLS),
        "{names:?}"
    );
    client.subscribe(TypeUrl::Endpoint, &[WEB]).await.unwrap();
    let cla = client.recv_load_assignments().await.unwrap();
    assert_eq!(
        addresses(&cla[0]),
        ["10.0.0.1", "10.0.0.2"],
        "STARTING is not ready"
    );
    let locality = cla[0]
        .endpoints
        .iter()
        .filter_map(|l| l.locality.as_ref())
        .find(|l| !l.zone.is_empty())
        .expect("web-1's zone");
    assert_eq!(
        (locality.region.as_str(), locality.zone.as_str()),
        ("eu-west", "zone-a")
    );

    // A status change reaches the sidecar through the delta.
    eureka.set_status("WEB", "web-3", Status::Up);
    let cla = client.recv_load_assignments().await.unwrap();
    assert_eq!(addresses(&cla[0]), ["10.0.0.1", "10.0.0.2", "10.0.0.3"]);
    assert!(!eureka.requests_to("/eureka/apps/delta").is_empty());

    // Eureka goes away: stale, and a proxy connecting now still gets the last view.
    eureka.go_down().await;
    eventually("the registry to turn stale", || async move {
        (eureka_registry(http).await["stale"] == true).then_some(())
    })
    .await;
    let (_, metrics) = http_get(server.bound().monitoring, "/metrics").await;
    assert!(
        metric(&metrics, "meshfed_eureka_errors{registry=\"eureka\"}").is_some_and(|n| n >= 1.0),
        "{metrics}"
    );
    assert!(
        metric(&metrics, "meshfed_eureka_fetches{kind=\"delta\"}").is_some_and(|n| n >= 1.0),
        "{metrics}"
    );
    let mut late = AdsClient::connect(server.grpc_addr(), node(PROXY))
        .await
        .unwrap();
    late.subscribe(TypeUrl::Cluster, &[]).await.unwrap();
    late.recv_clusters().await.unwrap();
    late.subscribe(TypeUrl::Endpoint, &[WEB]).await.unwrap();
    let cla = late.recv_load_assignments().await.unwrap();
    assert_eq!(addresses(&cla[0]), ["10.0.0.1", "10.0.0.2", "10.0.0.3"]);

    // It comes back with a change made meanwhile.
    eureka.deregister("WEB", "web-2");
    eureka.come_back().await.unwrap();
    let cla = client.recv_load_assignments().await.unwrap();
    assert_eq!(addresses(&cla[0]), ["10.0.0.1", "10.0.0.3"]);
    eventually("the registry to be fresh", || async move {
        (eureka_registry(http).await["stale"] == false).then_some(())
    })
    .await;
    server.shutdown().await;
}
