//! The Kubernetes registry end to end: a fake API server speaking the real wire format,
//! meshfed reading it, and an ADS client seeing the result.

use std::net::SocketAddr;

use meshfed::ads::TypeUrl;
use meshfed::app::{KubeSettings, KubeSource};
use meshfed::testing::{AdsClient, FakeServer, node};
use meshfed_kube::fake_api::{FakeApiServer, objects};

use crate::support::*;

const CLUSTER: &str = "outbound|80||reviews.default.svc.cluster.local";

async fn start(api: &FakeApiServer) -> FakeServer {
    let client = api.client();
    FakeServer::builder()
        .configure(move |c| {
            c.kubernetes = Some(KubeSettings {
                source: KubeSource::Client(client),
                namespaces: meshfed_kube::NamespaceFilter::All,
                system_namespace: "istio-system".into(),
                remote_secrets: Default::default(),
            });
        })
        .start()
        .await
        .unwrap()
}

async fn wait_ready(http: SocketAddr) {
    eventually("the Kubernetes registry to sync", || async move {
        (http_get(http, "/ready").await.0 == 200).then_some(())
    })
    .await;
}

#[tokio::test]
async fn services_and_endpoint_slices_reach_proxies_and_changes_are_incremental() {
    let api = FakeApiServer::start().await.unwrap();
    api.apply(&objects::node("node-1", "r1", "z1"));
    api.apply(&objects::service(
        "default",
        "reviews",
        "10.96.0.7",
        &[("http", 80)],
    ));
    api.apply(&objects::pod(
        "default",
        "reviews-1",
        "reviews",
        "10.1.0.1",
        "node-1",
    ));
    api.apply(&objects::slice(
        "default",
        "reviews-abc",
        "reviews",
        &[("http", 9080)],
        &[("10.1.0.1", "reviews-1")],
    ));

    let server = start(&api).await;
    wait_ready(server.bound().http).await;
    let http = server.bound().http;
    eventually("the service in registryz", || async move {
        let r = get_json(http, "/debug/registryz").await;
        (r["services"].as_array().is_some_and(|s| !s.is_empty())).then_some(())
    })
    .await;
    server.sync().await;

    let mut client = AdsClient::connect(
        server.grpc_addr(),
        node("sidecar~10.2.0.1~app.default~default.svc.cluster.local"),
    )
    .await
    .unwrap();
    client.subscribe(TypeUrl::Cluster, &[]).await.unwrap();
    let clusters = client.recv_clusters().await.unwrap();
    assert!(
        clusters.iter().any(|c| c.name == CLUSTER),
        "{:?}",
        clusters.iter().map(|c| &c.name).collect::<Vec<_>>()
    );
    client
        .subscribe(TypeUrl::Endpoint, &[CLUSTER])
        .await
        .unwrap();
    let cla = client.recv_load_assignments().await.unwrap();
    let endpoints: Vec<_> = cla[0]
        .endpoints
        .iter()
        .flat_map(|l| &l.lb_endpoints)
        .collect();
    assert_eq!(endpoints.len(), 1);
    assert_eq!(
        cla[0].endpoints[0].locality.as_ref().unwrap().zone,
        "z1",
        "locality from the node"
    );

    // A second pod joins the slice: only EDS for this service is pushed.
    api.apply(&objects::pod(
        "default",
        "reviews-2",
        "reviews",
        "10.1.0.2",
        "node-1",
    ));
    api.apply(&objects::slice(
        "default",
        "reviews-abc",
        "reviews",
        &[("http", 9080)],
        &[("10.1.0.1", "reviews-1"), ("10.1.0.2", "reviews-2")],
    ));
    let cla = client.recv_load_assignments().await.unwrap();
    assert_eq!(cla.len(), 1);
    assert_eq!(
        cla[0]
            .endpoints
            .iter()
            .flat_map(|l| &l.lb_endpoints)
            .count(),
        2
    );

    // The service is deleted: CDS drops its cluster.
    api.delete::<objects::types::Service>(Some("default"), "reviews");
    let clusters = client.recv_clusters().await.unwrap();
    assert!(clusters.iter().all(|c| c.name != CLUSTER));
    server.shutdown().await;
}
