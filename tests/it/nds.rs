//! NDS over ADS: the DNS name table goes to proxies that capture DNS (metadata
//! `DNS_CAPTURE`), over SotW and Delta, with the auto-allocated addresses of DNS
//! ServiceEntries for proxies that use them; other proxies get nothing; a ServiceEntry
//! change pushes a new table.

use meshfed::ads::TypeUrl;
use meshfed::testing::{AdsClient, DeltaClient, FakeServer, decode_all, decode_delta, node_with};
use meshfed_api::networking::nds::v1::NameTable;
use meshfed_api::networking::v1alpha3 as net;
use meshfed_registry::config::ConfigObject;
use meshfed_registry::{ClusterId, Protocol, ServiceKey};
use net::service_entry::Resolution;

use crate::support::*;

const CAPTURE: &str = "sidecar~10.9.0.1~app.default~default.svc.cluster.local";
const PLAIN: &str = "sidecar~10.9.0.2~other.default~default.svc.cluster.local";
const API: &str = "api.example.com";
const DB: &str = "db.example.com";
const VIP_SERVICE: &str = "a.default.svc.cluster.local";

fn capture_and_auto() -> serde_json::Value {
    serde_json::json!({"DNS_CAPTURE": "true", "DNS_AUTO_ALLOCATE": "true"})
}

/// A DNS ServiceEntry without addresses (so it is given one).
fn dns_entry(name: &str, host: &str) -> ConfigObject {
    ConfigObject::new(
        "default",
        name,
        net::ServiceEntry {
            hosts: vec![host.into()],
            ports: vec![net::ServicePort {
                number: 5432,
                protocol: "TCP".into(),
                name: "tcp".into(),
                target_port: 0,
            }],
            resolution: Resolution::Dns as i32,
            ..Default::default()
        },
    )
}

/// A server with a mock service on VIP 10.96.0.1 and the DNS entry for [`API`].
async fn server() -> FakeServer {
    let server = FakeServer::builder().start().await.unwrap();
    let reg = server.mock_registry("c1");
    let mut svc = service(VIP_SERVICE, "default", &[("http", 80, Protocol::Http)]);
    svc.cluster_vips
        .insert(ClusterId::new("c1"), vec!["10.96.0.1".parse().unwrap()]);
    reg.add_service(svc);
    server.config_store().apply(dns_entry("api", API)).unwrap();
    wait_for_service(&server, API).await;
    server
}

/// Waits until the served snapshot has `host`, then until every event so far is
/// applied (the ServiceEntry registry converts on its own task).
async fn wait_for_service(server: &FakeServer, host: &'static str) {
    let snapshot = server.server().snapshot().clone();
    let key = ServiceKey::new(host, "default");
    eventually(&format!("{host} served"), move || {
        let served = snapshot
            .load()
            .services()
            .all()
            .iter()
            .any(|s| s.key() == key);
        async move { served.then_some(()) }
    })
    .await;
    server.sync().await;
}

/// The auto-allocated IPv4 address of `host` in the served snapshot.
fn allocated(server: &FakeServer, host: &str) -> String {
    let snapshot = server.server().snapshot().load();
    let service = snapshot
        .services()
        .all()
        .iter()
        .find(|s| s.hostname.as_str() == host)
        .cloned()
        .unwrap_or_else(|| panic!("{host} not served"));
    let ip = service
        .auto_allocated_ipv4
        .unwrap_or_else(|| panic!("{host} has no auto-allocated address"));
    assert_eq!(ip.octets()[..2], [240, 240], "{ip}");
    ip.to_string()
}

fn ips(table: &NameTable, host: &str) -> Option<Vec<String>> {
    table.table.get(host).map(|info| info.ips.clone())
}

#[tokio::test]
async fn a_capturing_proxy_gets_its_name_table_over_sotw_and_a_new_one_when_an_entry_changes() {
    let server = server().await;
    let api_ip = allocated(&server, API);
    let mut client = AdsClient::connect(server.grpc_addr(), node_with(CAPTURE, capture_and_auto()))
        .await
        .unwrap();
    client.subscribe(TypeUrl::NameTable, &[]).await.unwrap();
    let response = client.recv_type(TypeUrl::NameTable).await.unwrap();
    assert_eq!(
        response.type_url,
        "type.googleapis.com/istio.networking.nds.v1.NameTable"
    );
    let tables: Vec<NameTable> = decode_all(&response).unwrap();
    assert_eq!(tables.len(), 1, "one table");
    assert_eq!(ips(&tables[0], API), Some(vec![api_ip.clone()]));
    assert_eq!(
        ips(&tables[0], VIP_SERVICE),
        Some(vec!["10.96.0.1".to_string()])
    );
    assert_eq!(ips(&tables[0], DB), None);

    // The proxy's table is visible on the debug page as it was sent.
    let ndsz = get_json(server.bound().http, "/debug/ndsz?proxyID=app.default").await;
    assert_eq!(ndsz["table"][API]["ips"][0], api_ip.as_str(), "{ndsz:#}");

    // A second entry: the next response is a new table with both.
    server.config_store().apply(dns_entry("db", DB)).unwrap();
    let response = client.recv_type(TypeUrl::NameTable).await.unwrap();
    let tables: Vec<NameTable> = decode_all(&response).unwrap();
    let db_ip = allocated(&server, DB);
    assert_ne!(db_ip, api_ip);
    assert_eq!(ips(&tables[0], DB), Some(vec![db_ip]));
    assert_eq!(ips(&tables[0], API), Some(vec![api_ip]));

    // Removed again: the table loses it.
    assert!(server.config_store().delete(
        meshfed_registry::config::Kind::ServiceEntry,
        "default",
        "db"
    ));
    let response = client.recv_type(TypeUrl::NameTable).await.unwrap();
    let tables: Vec<NameTable> = decode_all(&response).unwrap();
    assert_eq!(ips(&tables[0], DB), None);

    let (status, metrics) = http_get(server.bound().monitoring, "/metrics").await;
    assert_eq!(status, 200);
    assert_eq!(
        metric(&metrics, "pilot_xds_pushes{type=\"nds\"}"),
        Some(3.0),
        "{metrics}"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn a_capturing_proxy_gets_its_name_table_over_delta() {
    let server = server().await;
    let api_ip = allocated(&server, API);
    let mut client =
        DeltaClient::connect(server.grpc_addr(), node_with(CAPTURE, capture_and_auto()))
            .await
            .unwrap();
    client
        .subscribe(TypeUrl::NameTable, &[], &[])
        .await
        .unwrap();
    let response = client.recv_type(TypeUrl::NameTable).await.unwrap();
    assert_eq!(response.resources.len(), 1);
    assert_eq!(response.resources[0].name, "", "the table has no name");
    let tables: Vec<NameTable> = decode_delta(&response).unwrap();
    assert_eq!(ips(&tables[0], API), Some(vec![api_ip]));

    server.config_store().apply(dns_entry("db", DB)).unwrap();
    let response = client.recv_type(TypeUrl::NameTable).await.unwrap();
    assert!(response.removed_resources.is_empty());
    let tables: Vec<NameTable> = decode_delta(&response).unwrap();
    assert_eq!(ips(&tables[0], DB), Some(vec![allocated(&server, DB)]));
    server.shutdown().await;
}

#[tokio::test]
async fn proxies_that_do_not_capture_dns_get_no_table_and_others_no_allocated_addresses() {
    let server = server().await;
    for meta in [
        serde_json::json!({}),
        serde_json::json!({"DNS_AUTO_ALLOCATE": "true"}),
        serde_json::json!({"DNS_CAPTURE": "false"}),
    ] {
        let mut client = AdsClient::connect(server.grpc_addr(), node_with(PLAIN, meta.clone()))
            .await
            .unwrap();
        client.subscribe(TypeUrl::NameTable, &[]).await.unwrap();
        // Requests are answered in order: had NDS answered, its response would come
        // before the clusters.
        client.subscribe(TypeUrl::Cluster, &[]).await.unwrap();
        let response = client.recv().await.unwrap();
        assert_eq!(response.type_url, TypeUrl::Cluster.as_str(), "{meta}");
    }
    let (status, body) = http_get(server.bound().http, "/debug/ndsz?proxyID=other.default").await;
    assert_eq!(status, 404, "{body}");

    // Capturing DNS without DNS_AUTO_ALLOCATE: a table, without the entry that only
    // has an allocated address.
    let mut client = AdsClient::connect(
        server.grpc_addr(),
        node_with(CAPTURE, serde_json::json!({"DNS_CAPTURE": true})),
    )
    .await
    .unwrap();
    client.subscribe(TypeUrl::NameTable, &[]).await.unwrap();
    let response = client.recv_type(TypeUrl::NameTable).await.unwrap();
    let tables: Vec<NameTable> = decode_all(&response).unwrap();
    assert_eq!(ips(&tables[0], API), None);
    assert_eq!(
        ips(&tables[0], VIP_SERVICE),
        Some(vec!["10.96.0.1".to_string()])
    );
    server.shutdown().await;
}
