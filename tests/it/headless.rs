//! Headless services: a sidecar gets one outbound listener per endpoint of a headless
//! service's TCP port, and an endpoint change of such a service is a full push (its
//! listeners and name-table entry follow), as in Istio.

use envoy_types::pb::envoy::config::listener::v3::Listener;
use meshfed::ads::TypeUrl;
use meshfed::testing::{AdsClient, FakeServer, decode_all, node_with};
use meshfed_api::networking::nds::v1::NameTable;
use meshfed_registry::{Protocol, Resolution, ServiceKey};

use crate::support::*;

const DB: &str = "db.default.svc.cluster.local";

fn names(listeners: &[Listener]) -> Vec<String> {
    let mut out: Vec<String> = listeners
        .iter()
        .map(|l| l.name.clone())
        .filter(|n| n.ends_with("_5432"))
        .collect();
    out.sort();
    out
}

#[tokio::test]
async fn headless_endpoint_changes_push_per_endpoint_listeners_and_the_name_table() {
    let server = FakeServer::builder().start().await.unwrap();
    let reg = server.mock_registry("c1");
    let mut svc = service(DB, "default", &[("tcp", 5432, Protocol::Tcp)]);
    svc.resolution = Resolution::Passthrough;
    reg.add_service(svc);
    let key = ServiceKey::new(DB, "default");
    reg.set_endpoints(&key, vec![endpoint("10.1.0.1", "tcp", 5432, "")]);
    server.sync().await;

    let mut client = AdsClient::connect(
        server.grpc_addr(),
        node_with(
            "sidecar~10.9.0.1~app.default~default.svc.cluster.local",
            serde_json::json!({"DNS_CAPTURE": "true"}),
        ),
    )
    .await
    .unwrap();
    client.subscribe(TypeUrl::Listener, &[]).await.unwrap();
    let listeners: Vec<Listener> =
        decode_all(&client.recv_type(TypeUrl::Listener).await.unwrap()).unwrap();
    assert_eq!(names(&listeners), ["10.1.0.1_5432"]);
    client.subscribe(TypeUrl::NameTable, &[]).await.unwrap();
    let tables: Vec<NameTable> =
        decode_all(&client.recv_type(TypeUrl::NameTable).await.unwrap()).unwrap();
    assert_eq!(tables[0].table[DB].ips, ["10.1.0.1"]);

    // A second pod: not an EDS-only push, the listeners and the table follow.
    reg.set_endpoints(
        &key,
        vec![
            endpoint("10.1.0.1", "tcp", 5432, ""),
            endpoint("10.1.0.2", "tcp", 5432, ""),
        ],
    );
    let listeners: Vec<Listener> =
        decode_all(&client.recv_type(TypeUrl::Listener).await.unwrap()).unwrap();
    assert_eq!(names(&listeners), ["10.1.0.1_5432", "10.1.0.2_5432"]);
    let tables: Vec<NameTable> =
        decode_all(&client.recv_type(TypeUrl::NameTable).await.unwrap()).unwrap();
    assert_eq!(tables[0].table[DB].ips, ["10.1.0.1", "10.1.0.2"]);

    let history = get_json(server.bound().http, "/debug/push_status").await;
    assert_eq!(history["pushes"][0]["full"], true, "{history:#}");
    server.shutdown().await;
}

#[tokio::test]
async fn a_pod_of_a_headless_service_gets_no_listener_for_itself() {
    let server = FakeServer::builder().start().await.unwrap();
    let reg = server.mock_registry("c1");
    let mut svc = service(DB, "default", &[("tcp", 5432, Protocol::Tcp)]);
    svc.resolution = Resolution::Passthrough;
    reg.add_service(svc);
    reg.set_endpoints(
        &ServiceKey::new(DB, "default"),
        vec![
            endpoint("10.1.0.1", "tcp", 5432, ""),
            endpoint("10.1.0.2", "tcp", 5432, ""),
        ],
    );
    server.sync().await;
    let mut client = AdsClient::connect(
        server.grpc_addr(),
        node_with(
            "sidecar~10.1.0.2~db-1.default~default.svc.cluster.local",
            serde_json::json!({}),
        ),
    )
    .await
    .unwrap();
    client.subscribe(TypeUrl::Listener, &[]).await.unwrap();
    let listeners: Vec<Listener> =
        decode_all(&client.recv_type(TypeUrl::Listener).await.unwrap()).unwrap();
    assert_eq!(names(&listeners), ["10.1.0.1_5432"]);
    server.shutdown().await;
}
