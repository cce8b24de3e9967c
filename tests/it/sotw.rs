//! State-of-the-world ADS conversations.

use envoy_types::pb::envoy::config::core::v3::HealthStatus;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use meshfed::ads::TypeUrl;
use meshfed::testing::{AdsClient, FakeServer, decode_all, node, node_with};
use meshfed_registry::{HealthStatus as Health, Protocol, ServiceKey};

use crate::support::*;

const SIDECAR: &str = "sidecar~10.0.0.1~app-1.default~default.svc.cluster.local";
const A: &str = "outbound|80||a.default.svc.cluster.local";
const B: &str = "outbound|80||b.default.svc.cluster.local";

/// Services `a` and `b` in `default`, one endpoint each (clusters [`A`] and [`B`]).
fn services_a_and_b(reg: &meshfed_registry::MemoryRegistry) -> (ServiceKey, ServiceKey) {
    let a = add_http_service(reg, "a.default.svc.cluster.local", "default", &["10.0.0.1"]);
    let b = add_http_service(reg, "b.default.svc.cluster.local", "default", &["10.0.1.1"]);
    (a, b)
}

fn addresses(cla: &ClusterLoadAssignment) -> Vec<String> {
    let mut out: Vec<String> = cla
        .endpoints
        .iter()
        .flat_map(|l| &l.lb_endpoints)
        .filter_map(|e| match &e.host_identifier {
            Some(HostIdentifier::Endpoint(ep)) => ep.address.as_ref(),
            _ => None,
        })
        .filter_map(|a| match &a.address {
            Some(envoy_types::pb::envoy::config::core::v3::address::Address::SocketAddress(s)) => {
                let port = match s.port_specifier {
                    Some(envoy_types::pb::envoy::config::core::v3::socket_address::PortSpecifier::PortValue(p)) => p,
                    _ => 0,
                };
                Some(format!("{}:{port}", s.address))
            }
            _ => None,
        })
        .collect();
    out.sort();
    out
}

#[tokio::test]
async fn initial_cds_then_eds_with_istio_names_and_localities() {
    let server = FakeServer::builder().start().await.unwrap();
    let reg = server.mock_registry("c1");
    reg.add_service(service(
        "echo.default.svc.cluster.local",
        "default",
        &[
            ("grpc", 7070, Protocol::Grpc),
            ("http", 8080, Protocol::Http),
        ],
    ));
    let key = ServiceKey::new("echo.default.svc.cluster.local", "default");
    let mut sick = endpoint("10.0.0.9", "grpc", 17070, "r1/z1");
    sick.health = Health::Unhealthy;
    reg.set_endpoints(
        &key,
        vec![
            endpoint("10.0.0.1", "grpc", 17070, "r1/z1").with_port("http", 18080),
            endpoint("10.0.0.2", "grpc", 17070, "r1/z2"),
            sick,
        ],
    );

    server.sync().await;
    let mut client = AdsClient::connect(server.grpc_addr(), node(SIDECAR))
        .await
        .unwrap();
    client.subscribe(TypeUrl::Cluster, &[]).await.unwrap();
    let clusters = client.recv_clusters().await.unwrap();
    let mut names: Vec<&str> = clusters.iter().map(|c| c.name.as_str()).collect();
    names.sort();
    // The sidecar (10.0.0.1) is an endpoint of echo: it also gets its inbound clusters.
    assert_eq!(
        names,
        vec![
            "BlackHoleCluster",
            "InboundPassthroughCluster",
            "PassthroughCluster",
            "inbound|17070||",
            "inbound|18080||",
            "outbound|7070||echo.default.svc.cluster.local",
            "outbound|8080||echo.default.svc.cluster.local",
        ]
    );

    client
        .subscribe(
            TypeUrl::Endpoint,
            &["outbound|7070||echo.default.svc.cluster.local"],
        )
        .await
        .unwrap();
    let clas = client.recv_load_assignments().await.unwrap();
    assert_eq!(clas.len(), 1);
    let cla = &clas[0];
    assert_eq!(
        cla.cluster_name,
        "outbound|7070||echo.default.svc.cluster.local"
    );
    assert_eq!(
        addresses(cla),
        vec!["10.0.0.1:17070", "10.0.0.2:17070"],
        "the unhealthy endpoint is not sent"
    );
    assert_eq!(cla.endpoints.len(), 2, "one group per locality");
    assert_eq!(cla.endpoints[0].locality.as_ref().unwrap().zone, "z1");
    assert!(
        cla.endpoints
            .iter()
            .all(|l| l.load_balancing_weight.is_some())
    );
    assert!(
        cla.endpoints
            .iter()
            .flat_map(|l| &l.lb_endpoints)
            .all(|e| e.health_status == HealthStatus::Healthy as i32)
    );
    server.shutdown().await;
}

#[tokio::test]
async fn endpoint_change_resends_only_that_cluster_and_only_to_its_watchers() {
    let server = FakeServer::builder().start().await.unwrap();
    let reg = server.mock_registry("c1");
    let (a, b) = services_a_and_b(&reg);

    server.sync().await;
    let mut watcher_a = AdsClient::connect(server.grpc_addr(), node(SIDECAR))
        .await
        .unwrap();
    watcher_a.subscribe(TypeUrl::Cluster, &[]).await.unwrap();
    watcher_a.recv_clusters().await.unwrap();
    watcher_a
        .subscribe(TypeUrl::Endpoint, &[A, B])
        .await
        .unwrap();
    assert_eq!(watcher_a.recv_load_assignments().await.unwrap().len(), 2);

    let mut watcher_b = AdsClient::connect(
        server.grpc_addr(),
        node("sidecar~10.0.0.2~app-2.default~default.svc.cluster.local"),
    )
    .await
    .unwrap();
    watcher_b.subscribe(TypeUrl::Cluster, &[]).await.unwrap();
    watcher_b.recv_clusters().await.unwrap();
    watcher_b.subscribe(TypeUrl::Endpoint, &[B]).await.unwrap();
    watcher_b.recv_load_assignments().await.unwrap();

    reg.set_endpoints(
        &a,
        vec![
            endpoint("10.0.0.1", "http", 8080, "r1/z1"),
            endpoint("10.0.0.3", "http", 8080, "r1/z1"),
        ],
    );
    // The next thing watcher A sees is EDS (no CDS: endpoint-only) with only A's CLA.
    let response = watcher_a.recv_type(TypeUrl::Endpoint).await.unwrap();
    let clas: Vec<ClusterLoadAssignment> = decode_all(&response).unwrap();
    assert_eq!(clas.len(), 1);
    assert_eq!(clas[0].cluster_name, A);
    assert_eq!(addresses(&clas[0]), vec!["10.0.0.1:8080", "10.0.0.3:8080"]);

    // Watcher B got nothing for A: the next response it sees is for B's own change.
    reg.set_endpoints(&b, vec![endpoint("10.0.1.2", "http", 8080, "r1/z1")]);
    let clas = watcher_b.recv_load_assignments().await.unwrap();
    assert_eq!(clas.len(), 1);
    assert_eq!(clas[0].cluster_name, B);
    assert_eq!(addresses(&clas[0]), vec!["10.0.1.2:8080"]);
    server.shutdown().await;
}

/// An endpoint-only push is queued on the connections watching a changed name (the
/// watch index), not on every connection: the push record counts exactly them.
#[tokio::test]
async fn an_endpoint_change_is_queued_only_on_its_watchers() {
    let server = FakeServer::builder().start().await.unwrap();
    let reg = server.mock_registry("c1");
    let (a, b) = services_a_and_b(&reg);
    server.sync().await;
    let mut clients = Vec::new();
    for (ip, names) in [("10.0.0.1", &[A, B][..]), ("10.0.0.2", &[B][..])] {
        let id = format!("sidecar~{ip}~app-{ip}.default~default.svc.cluster.local");
        let mut c = AdsClient::connect(server.grpc_addr(), node(&id))
            .await
            .unwrap();
        c.subscribe(TypeUrl::Endpoint, names).await.unwrap();
        let first = c.recv_type(TypeUrl::Endpoint).await.unwrap();
        c.ack(&first).await.unwrap();
        clients.push(c);
    }
    let pushes_of = |host: &'static str| {
        let pipeline = server.server().pipeline();
        move || {
            let found = pipeline
                .history()
                .into_iter()
                .find(|p| !p.full && p.changes.iter().any(|c| c.contains(host)));
            std::future::ready(found)
        }
    };

    reg.set_endpoints(&a, vec![endpoint("10.0.0.3", "http", 8080, "r1/z1")]);
    clients[0].recv_type(TypeUrl::Endpoint).await.unwrap();
    let record = eventually("the push of a", pushes_of("a.default")).await;
    assert_eq!(record.connections, 1, "{record:?}");
    assert!(
        record.proxies[0].starts_with("app-10.0.0.1.default-"),
        "{record:?}"
    );

    reg.set_endpoints(&b, vec![endpoint("10.0.1.2", "http", 8080, "r1/z1")]);
    for c in &mut clients {
        c.recv_type(TypeUrl::Endpoint).await.unwrap();
    }
    let record = eventually("the push of b", pushes_of("b.default")).await;
    assert_eq!(record.connections, 2, "{record:?}");
    server.shutdown().await;
}

#[tokio::test]
async fn new_and_removed_services_push_cds() {
    let server = FakeServer::builder().start().await.unwrap();
    let reg = server.mock_registry("c1");
    add_http_service(
        &reg,
        "a.default.svc.cluster.local",
        "default",
        &["10.0.0.1"],
    );
    server.sync().await;
    let mut client = AdsClient::connect(server.grpc_addr(), node(SIDECAR))
        .await
        .unwrap();
    client.subscribe(TypeUrl::Cluster, &[]).await.unwrap();
    let first = client.recv_clusters().await.unwrap();
    assert!(first.iter().all(|c| c.name != B));

    let b = add_http_service(
        &reg,
        "b.default.svc.cluster.local",
        "default",
        &["10.0.1.1"],
    );
    let clusters = client.recv_clusters().await.unwrap();
    assert!(
        clusters.iter().any(|c| c.name == B),
        "the new service's cluster is pushed"
    );

    reg.remove_service(&b);
    let clusters = client.recv_clusters().await.unwrap();
    assert!(
        clusters.iter().all(|c| c.name != B),
        "the removed service's cluster is gone"
    );
    assert!(clusters.iter().any(|c| c.name == A));
    server.shutdown().await;
}

/// The destination ports of `virtualInbound`'s filter chains in an LDS response.
fn inbound_ports(
    response: &envoy_types::pb::envoy::service::discovery::v3::DiscoveryResponse,
) -> Vec<u32> {
    use envoy_types::pb::envoy::config::listener::v3::Listener;
    let listeners: Vec<Listener> = decode_all(response).unwrap();
    let inbound = listeners
        .iter()
        .find(|l| l.name == "virtualInbound")
        .expect("virtualInbound");
    let mut ports: Vec<u32> = inbound
        .filter_chains
        .iter()
        .filter_map(|c| c.filter_chain_match.as_ref()?.destination_port.as_ref())
        .map(|p| p.value)
        .collect();
    ports.sort();
    ports.dedup();
    ports
}

/// A sidecar that becomes an endpoint of a service after it connected (an
/// endpoint-only change) gets its inbound listener chain without any other push.
#[tokio::test]
async fn a_new_endpoint_at_a_connected_sidecar_pushes_its_inbound_listener() {
    let server = FakeServer::builder().start().await.unwrap();
    let reg = server.mock_registry("c1");
    let a = add_http_service(
        &reg,
        "a.default.svc.cluster.local",
        "default",
        &["10.0.1.1"],
    );
    server.sync().await;
    let mut client = AdsClient::connect(server.grpc_addr(), node(SIDECAR))
        .await
        .unwrap();
    client.subscribe(TypeUrl::Listener, &[]).await.unwrap();
    let first = client.recv_type(TypeUrl::Listener).await.unwrap();
    client.ack(&first).await.unwrap();
    assert!(
        !inbound_ports(&first).contains(&8080),
        "not an endpoint yet"
    );

    reg.set_endpoints(
        &a,
        vec![
            endpoint("10.0.1.1", "http", 8080, "r1/z1"),
            endpoint("10.0.0.1", "http", 8080, "r1/z1"),
        ],
    );
    let pushed = client.recv_type(TypeUrl::Listener).await.unwrap();
    client.ack(&pushed).await.unwrap();
    assert!(
        inbound_ports(&pushed).contains(&8080),
        "{:?}",
        inbound_ports(&pushed)
    );

    // And it goes again when the endpoint goes.
    reg.set_endpoints(&a, vec![endpoint("10.0.1.1", "http", 8080, "r1/z1")]);
    let pushed = client.recv_type(TypeUrl::Listener).await.unwrap();
    assert!(!inbound_ports(&pushed).contains(&8080));
    let record = server.server().pipeline().history()[0].clone();
    assert!(!record.full, "an endpoint-only push: {record:?}");
    assert_eq!(record.connections, 1, "{record:?}");
    server.shutdown().await;
}

#[tokio::test]
async fn nack_is_recorded_visible_in_adsz_and_not_answered() {
    let server = FakeServer::builder().start().await.unwrap();
    let reg = server.mock_registry("c1");
    add_http_service(
        &reg,
        "a.default.svc.cluster.local",
        "default",
        &["10.0.0.1"],
    );
    server.sync().await;
    let mut client = AdsClient::connect(server.grpc_addr(), node(SIDECAR))
        .await
        .unwrap();
    client.subscribe(TypeUrl::Cluster, &[]).await.unwrap();
    let rejected = client.recv().await.unwrap();
    client
        .nack(&rejected, "cluster outbound|80||a: invalid lb policy")
        .await
        .unwrap();

    let http = server.bound().http;
    let adsz = eventually("the NACK to show in /debug/adsz", || async move {
        let adsz = get_json(http, "/debug/adsz").await;
        let error = adsz["clients"][0]["watches"]["cds"]["lastError"].clone();
        (!error.is_null()).then_some(adsz)
    })
    .await;
    assert_eq!(
        adsz["clients"][0]["watches"]["cds"]["lastError"],
        "cluster outbound|80||a: invalid lb policy"
    );
    let syncz = get_json(http, "/debug/syncz").await;
    assert_eq!(
        syncz[0]["types"]["cds"]["nonceNacked"],
        rejected.nonce.as_str()
    );

    // No resend: the next response is a new push caused by a change, not the rejected
    // one again.
    add_http_service(
        &reg,
        "b.default.svc.cluster.local",
        "default",
        &["10.0.1.1"],
    );
    let next = client.recv_type(TypeUrl::Cluster).await.unwrap();
    assert_ne!(next.version_info, rejected.version_info);
    assert_ne!(next.nonce, rejected.nonce);

    let (_, metrics) = http_get(server.bound().monitoring, "/metrics").await;
    assert_eq!(
        metric(&metrics, "pilot_total_xds_rejects"),
        Some(1.0),
        "{metrics}"
    );
    assert_eq!(metric(&metrics, "pilot_xds_cds_reject"), Some(1.0));
    server.shutdown().await;
}

#[tokio::test]
async fn stale_nonce_is_ignored() {
    let server = FakeServer::builder().start().await.unwrap();
    let reg = server.mock_registry("c1");
    for host in ["a", "b", "c"] {
        add_http_service(
            &reg,
            &format!("{host}.default.svc.cluster.local"),
            "default",
            &["10.0.0.1"],
        );
    }
    let c = "outbound|80||c.default.svc.cluster.local";
    server.sync().await;
    let mut client = AdsClient::connect(server.grpc_addr(), node(SIDECAR))
        .await
        .unwrap();
    client.subscribe(TypeUrl::Endpoint, &[A]).await.unwrap();
    let first = client.recv_type(TypeUrl::Endpoint).await.unwrap();

    // A request answering a nonce the server never sent, adding B: ignored.
    client
        .send(DiscoveryRequest {
            type_url: TypeUrl::Endpoint.as_str().into(),
            resource_names: vec![A.into(), B.into()],
            version_info: first.version_info.clone(),
            response_nonce: "not-a-nonce-we-sent".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    // The current nonce adding C: answered. If the stale one had been honoured, its
    // response (with B, without C) would come first.
    client.subscribe(TypeUrl::Endpoint, &[A, c]).await.unwrap();
    let clas = client.recv_load_assignments().await.unwrap();
    let mut names: Vec<&str> = clas.iter().map(|c| c.cluster_name.as_str()).collect();
    names.sort();
    assert_eq!(names, vec![A, c]);
    let (_, metrics) = http_get(server.bound().monitoring, "/metrics").await;
    assert_eq!(
        metric(&metrics, "pilot_xds_expired_nonce{type=\"eds\"}"),
        Some(1.0),
        "{metrics}"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn bad_node_ids_are_refused_with_invalid_argument() {
    let server = FakeServer::builder().start().await.unwrap();
    let mut client = AdsClient::connect(server.grpc_addr(), node("sidecar~10.0.0.1~only-three"))
        .await
        .unwrap();
    client.subscribe(TypeUrl::Cluster, &[]).await.unwrap();
    let status = client.recv_error().await.unwrap();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains("Type~IP~ID~Domain"),
        "{}",
        status.message()
    );

    let mut client = AdsClient::connect(
        server.grpc_addr(),
        node_with(SIDECAR, serde_json::json!({"LABELS": "app=x"})),
    )
    .await
    .unwrap();
    client.subscribe(TypeUrl::Cluster, &[]).await.unwrap();
    let status = client.recv_error().await.unwrap();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().contains("LABELS"), "{}", status.message());
    server.shutdown().await;
}

#[tokio::test]
async fn streams_wait_for_registry_sync() {
    let server = FakeServer::builder().start().await.unwrap();
    let pending =
        meshfed_registry::MemoryRegistry::new_unsynced("slow", server.server().sink().clone());
    server
        .server()
        .add_registry(std::sync::Arc::new(pending.clone()));
    // The stream is refused before it starts.
    let err = AdsClient::connect(server.grpc_addr(), node(SIDECAR))
        .await
        .unwrap_err();
    let refused = err.downcast_ref::<tonic::Status>().expect("a gRPC status");
    assert_eq!(refused.code(), tonic::Code::Unavailable);
    let (status, body) = http_get(server.bound().http, "/ready").await;
    assert_eq!(status, 503);
    assert!(body.contains("Mock/slow"), "{body}");

    pending.mark_synced();
    assert_eq!(http_get(server.bound().http, "/ready").await.0, 200);
    let mut client = AdsClient::connect(server.grpc_addr(), node(SIDECAR))
        .await
        .unwrap();
    client.subscribe(TypeUrl::Cluster, &[]).await.unwrap();
    client.recv_clusters().await.unwrap();
    server.shutdown().await;
}

#[tokio::test]
async fn grpc_style_named_cds_gets_only_what_it_asked_for() {
    let server = FakeServer::builder().start().await.unwrap();
    let reg = server.mock_registry("c1");
    add_http_service(
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
    let mut client = AdsClient::connect(server.grpc_addr(), node(SIDECAR))
        .await
        .unwrap();
    client.subscribe(TypeUrl::Cluster, &[A]).await.unwrap();
    let clusters = client.recv_clusters().await.unwrap();
    assert_eq!(
        clusters.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
        vec![A]
    );
    server.shutdown().await;
}

#[tokio::test]
async fn shutdown_ends_streams_with_unavailable_and_stops_every_task() {
    let server = embedded_server().await;
    let mut client = AdsClient::connect(server.grpc_addr(), node(SIDECAR))
        .await
        .unwrap();
    client.subscribe(TypeUrl::Cluster, &[]).await.unwrap();
    client.recv_clusters().await.unwrap();
    let addr = server.grpc_addr();
    tokio::time::timeout(std::time::Duration::from_secs(10), server.shutdown())
        .await
        .expect("shutdown drains in time");
    let status = client.recv_error().await.unwrap();
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "the listener is closed"
    );
}
