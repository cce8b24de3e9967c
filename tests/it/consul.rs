//! The Consul registry end to end: a fake Consul speaking the real HTTP API (blocking
//! queries with X-Consul-Index), meshfed bridging it, and an ADS client seeing the
//! result.

use std::net::SocketAddr;
use std::time::Duration;

use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use meshfed::ads::TypeUrl;
use meshfed::app::ConsulSettings;
use meshfed::testing::{AdsClient, FakeServer, node};
use meshfed_consul::fake::{CheckStatus, FakeConsul, Instance};

use crate::support::*;

const WEB: &str = "outbound|8080||web.service.consul";
const API: &str = "outbound|9090||api.service.consul";
const PROXY: &str = "sidecar~10.2.0.1~app.default~default.svc.cluster.local";

async fn start(consul: &FakeConsul) -> FakeServer {
    let settings = ConsulSettings {
        retry_interval: Duration::from_millis(20),
        max_retry_interval: Duration::from_millis(200),
        ..ConsulSettings::new(consul.url())
    };
    FakeServer::builder()
        .configure(move |c| c.consul = Some(settings))
        .start()
        .await
        .unwrap()
}

fn addresses(cla: &ClusterLoadAssignment) -> Vec<String> {
    let mut out: Vec<String> = cla
        .endpoints
        .iter()
        .flat_map(|l| &l.lb_endpoints)
        .filter_map(|e| match &e.host_identifier {
            Some(
                envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier::Endpoint(
                    ep,
                ),
            ) => ep.address.as_ref().and_then(|a| match &a.address {
                Some(
                    envoy_types::pb::envoy::config::core::v3::address::Address::SocketAddress(s),
                ) => Some(s.address.clone()),
                _ => None,
            }),
            _ => None,
        })
        .collect();
    out.sort();
    out
}

async fn consul_registry(http: SocketAddr) -> serde_json::Value {
    let r = get_json(http, "/debug/registryz").await;
    r["registries"]
        .as_array()
        .and_then(|rs| rs.iter().find(|r| r["provider"] == "Consul").cloned())
        .expect("the Consul registry in registryz")
}

#[tokio::test]
async fn a_consul_catalog_reaches_proxies_and_follows_changes_and_outages() {
    let consul = FakeConsul::start().await.unwrap();
    for (id, ip) in [("web-1", "10.0.0.1"), ("web-2", "10.0.0.2")] {
        consul.register(Instance::new("web", id, ip, 8080).with_meta("protocol", "http"));
    }
    consul.register(Instance::new("api", "api-1", "10.0.1.1", 9090).with_tags(&["grpc"]));

    let server = start(&consul).await;
    let http = server.bound().http;
    eventually("the Consul registry to sync", || async move {
        (http_get(http, "/ready").await.0 == 200).then_some(())
    })
    .await;
    let registry = consul_registry(http).await;
    assert_eq!(registry["registry"], "Consul/dc1");
    assert_eq!(registry["stale"], false);
    server.sync().await;

    let mut client = AdsClient::connect(server.grpc_addr(), node(PROXY))
        .await
        .unwrap();
    client.subscribe(TypeUrl::Cluster, &[]).await.unwrap();
    let clusters = client.recv_clusters().await.unwrap();
    let names: Vec<&str> = clusters.iter().map(|c| c.name.as_str()).collect();
    assert!(names.contains(&WEB) && names.contains(&API), "{names:?}");
    client.subscribe(TypeUrl::Endpoint, &[WEB]).await.unwrap();
    let cla = client.recv_load_assignments().await.unwrap();
    assert_eq!(addresses(&cla[0]), ["10.0.0.1", "10.0.0.2"]);
    assert_eq!(
        cla[0].endpoints[0].locality.as_ref().unwrap().region,
        "dc1",
        "the node's datacenter"
    );

    // Health flips and new instances are EDS updates for web.
    consul.set_health("web-2", CheckStatus::Critical);
    let cla = client.recv_load_assignments().await.unwrap();
    assert_eq!(
        (cla[0].cluster_name.as_str(), addresses(&cla[0])),
        (WEB, vec!["10.0.0.1".into()])
    );
    consul.set_health("web-2", CheckStatus::Passing);
    let cla = client.recv_load_assignments().await.unwrap();
    assert_eq!(addresses(&cla[0]), ["10.0.0.1", "10.0.0.2"]);
    consul.register(Instance::new("web", "web-3", "10.0.0.3", 8080).with_meta("protocol", "http"));
    let cla = client.recv_load_assignments().await.unwrap();
    assert_eq!(addresses(&cla[0]), ["10.0.0.1", "10.0.0.2", "10.0.0.3"]);

    // Consul goes away: stale in registryz, and a proxy connecting now still gets the
    // last known endpoints.
    consul.go_down().await;
    eventually("the registry to turn stale", || async move {
        (consul_registry(http).await["stale"] == true).then_some(())
    })
    .await;
    let (_, metrics) = http_get(server.bound().monitoring, "/metrics").await;
    assert!(
        metric(&metrics, "meshfed_consul_requests{result=\"error\"}").is_some_and(|n| n >= 1.0),
        "{metrics}"
    );
    assert!(
        metrics.contains("meshfed_registry_stale{registry=\"Consul/"),
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

    // It comes back with a change made meanwhile: fresh again, and the change arrives.
    consul.deregister("web-1");
    consul.come_back().await.unwrap();
    let cla = client.recv_load_assignments().await.unwrap();
    assert_eq!(addresses(&cla[0]), ["10.0.0.2", "10.0.0.3"]);
    eventually("the registry to be fresh", || async move {
        (consul_registry(http).await["stale"] == false).then_some(())
    })
    .await;

    // A service leaving the catalog leaves CDS.
    consul.remove_service("api");
    let clusters = loop {
        let response = client.recv().await.unwrap();
        client.ack(&response).await.unwrap();
        if response.type_url == TypeUrl::Cluster.as_str() {
            break meshfed::testing::decode_all::<
                envoy_types::pb::envoy::config::cluster::v3::Cluster,
            >(&response)
            .unwrap();
        }
    };
    assert!(clusters.iter().all(|c| c.name != API));
    assert!(clusters.iter().any(|c| c.name == WEB));
    server.shutdown().await;
}
