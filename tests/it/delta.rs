//! Delta ADS conversations.

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use meshfed::ads::TypeUrl;
use meshfed::testing::{DeltaClient, FakeServer, decode_delta, node};

use crate::support::*;

const SIDECAR: &str = "sidecar~10.0.0.1~app-1.default~default.svc.cluster.local";
const A: &str = "outbound|80||a.default.svc.cluster.local";
const B: &str = "outbound|80||b.default.svc.cluster.local";

fn names(
    response: &envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryResponse,
) -> Vec<&str> {
    let mut n: Vec<&str> = response.resources.iter().map(|r| r.name.as_str()).collect();
    n.sort();
    n
}

#[tokio::test]
async fn wildcard_cds_subscribe_eds_and_incremental_updates() {
    let server = FakeServer::builder().start().await.unwrap();
    let reg = server.mock_registry("c1");
    let a = add_http_service(
        &reg,
        "a.default.svc.cluster.local",
        "default",
        &["10.0.0.1"],
    );
    add_http_service(
        &reg,
        "b.default.svc.cluster.local",
        "default",
        &["10.0.1.1"],
    );

    server.sync().await;
    let mut client = DeltaClient::connect(server.grpc_addr(), node(SIDECAR))
        .await
        .unwrap();
    client.subscribe(TypeUrl::Cluster, &[], &[]).await.unwrap();
    let cds = client.recv_type(TypeUrl::Cluster).await.unwrap();
    // The sidecar (10.0.0.1) is an endpoint of a: it also gets its inbound clusters.
    assert_eq!(
        names(&cds),
        vec![
            "BlackHoleCluster",
            "InboundPassthroughCluster",
            "PassthroughCluster",
            "inbound|8080||",
            A,
            B
        ]
    );
    assert!(
        cds.resources.iter().all(|r| !r.version.is_empty()),
        "every delta resource carries a version"
    );
    let decoded: Vec<Cluster> = decode_delta(&cds).unwrap();
    assert_eq!(decoded.len(), 6);

    client
        .subscribe(TypeUrl::Endpoint, &[A], &[])
        .await
        .unwrap();
    let eds = client.recv_type(TypeUrl::Endpoint).await.unwrap();
    assert_eq!(names(&eds), vec![A]);

    // Subscribing B adds only B.
    client
        .subscribe(TypeUrl::Endpoint, &[B], &[])
        .await
        .unwrap();
    let eds = client.recv_type(TypeUrl::Endpoint).await.unwrap();
    assert_eq!(names(&eds), vec![B]);

    // An endpoint change of A sends only A's assignment (the sidecar's own endpoint
    // stays as it was, so its inbound clusters do too).
    reg.set_endpoints(
        &a,
        vec![
            endpoint("10.0.0.1", "http", 8080, "r1/z1"),
            endpoint("10.0.0.2", "http", 8080, "r1/z1"),
        ],
    );
    let eds = client.recv_type(TypeUrl::Endpoint).await.unwrap();
    assert_eq!(names(&eds), vec![A]);
    assert!(eds.removed_resources.is_empty());
    let cla: Vec<ClusterLoadAssignment> = decode_delta(&eds).unwrap();
    assert_eq!(cla[0].endpoints[0].lb_endpoints.len(), 2);
    server.shutdown().await;
}

#[tokio::test]
async fn unsubscribe_is_silent_and_removed_services_are_reported() {
    let server = FakeServer::builder().start().await.unwrap();
    let reg = server.mock_registry("c1");
    let a = add_http_service(
        &reg,
        "a.default.svc.cluster.local",
        "default",
        &["10.0.0.1"],
    );
    let b = add_http_service(
        &reg,
        "b.default.svc.cluster.local",
        "default",
        &["10.0.1.1"],
    );

    server.sync().await;
    let mut client = DeltaClient::connect(server.grpc_addr(), node(SIDECAR))
        .await
        .unwrap();
    client
        .subscribe(TypeUrl::Cluster, &["*"], &[])
        .await
        .unwrap();
    client.recv_type(TypeUrl::Cluster).await.unwrap();
    client
        .subscribe(TypeUrl::Endpoint, &[A, B], &[])
        .await
        .unwrap();
    client.recv_type(TypeUrl::Endpoint).await.unwrap();

    // Unsubscribing A gets no answer, and later changes of A are not sent: the next
    // response is for B's change.
    client
        .subscribe(TypeUrl::Endpoint, &[], &[A])
        .await
        .unwrap();
    reg.set_endpoints(&a, vec![endpoint("10.0.0.9", "http", 8080, "r1/z1")]);
    reg.set_endpoints(&b, vec![endpoint("10.0.1.9", "http", 8080, "r1/z1")]);
    // The sidecar (10.0.0.1) stopped being an endpoint of a: a push of its own removes
    // its inbound cluster at once; EDS sends B's change and never A's.
    let (mut inbound_gone, mut b_sent) = (false, false);
    while !(inbound_gone && b_sent) {
        let r = client.recv().await.unwrap();
        client.ack(&r).await.unwrap();
        if r.type_url == TypeUrl::Cluster.as_str() {
            inbound_gone |= r.removed_resources.iter().any(|n| n == "inbound|8080||");
        } else if r.type_url == TypeUrl::Endpoint.as_str() {
            assert!(!names(&r).contains(&A), "{:?}", names(&r));
            b_sent |= names(&r).contains(&B);
        }
    }

    // Removing service B: CDS says the cluster is removed, EDS removes the assignment.
    reg.remove_service(&b);
    let cds = client.recv_type(TypeUrl::Cluster).await.unwrap();
    assert_eq!(
        cds.removed_resources,
        vec![B.to_string()],
        "{:?}",
        names(&cds)
    );
    assert!(
        cds.resources.is_empty(),
        "unchanged clusters are not re-sent: {:?}",
        names(&cds)
    );
    let eds = client.recv_type(TypeUrl::Endpoint).await.unwrap();
    assert_eq!(eds.removed_resources, vec![B.to_string()]);
    assert!(eds.resources.is_empty(), "{:?}", names(&eds));
    server.shutdown().await;
}

#[tokio::test]
async fn new_service_nack_and_stale_nonce() {
    let server = FakeServer::builder().start().await.unwrap();
    let reg = server.mock_registry("c1");
    add_http_service(
        &reg,
        "a.default.svc.cluster.local",
        "default",
        &["10.0.0.1"],
    );
    server.sync().await;
    let mut client = DeltaClient::connect(server.grpc_addr(), node(SIDECAR))
        .await
        .unwrap();
    client.subscribe(TypeUrl::Cluster, &[], &[]).await.unwrap();
    let first = client.recv().await.unwrap();

    // NACK the first CDS response: recorded, not answered.
    client.nack(&first, "rejected by test").await.unwrap();
    let http = server.bound().http;
    eventually("the NACK in /debug/adsz", || async move {
        let adsz = get_json(http, "/debug/adsz").await;
        (adsz["clients"][0]["watches"]["cds"]["lastError"] == "rejected by test").then_some(())
    })
    .await;

    // A stale nonce with no new subscription is ignored.
    client
        .ack_nonce(TypeUrl::Cluster, "never-sent")
        .await
        .unwrap();

    // A new service: only its cluster is sent (the others are unchanged).
    add_http_service(
        &reg,
        "b.default.svc.cluster.local",
        "default",
        &["10.0.1.1"],
    );
    let cds = client.recv_type(TypeUrl::Cluster).await.unwrap();
    assert_eq!(names(&cds), vec![B]);
    assert_ne!(cds.nonce, first.nonce);
    let (_, metrics) = http_get(server.bound().monitoring, "/metrics").await;
    assert_eq!(
        metric(&metrics, "pilot_xds_cds_reject"),
        Some(1.0),
        "{metrics}"
    );
    assert_eq!(
        metric(&metrics, "pilot_xds_expired_nonce{type=\"cds\"}"),
        Some(1.0),
        "{metrics}"
    );
    server.shutdown().await;
}
