//! A sidecar's own services come from its pod: a pod that no EndpointSlice lists yet
//! (not ready) still gets the inbound cluster of the service selecting it, and its pod
//! labels (the proxy sends no `LABELS`) decide VirtualService `sourceLabels` matches,
//! also after they change.

use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryResponse;
use meshfed::ads::TypeUrl;
use meshfed::app::{KubeSettings, KubeSource};
use meshfed::generate::simulate::{self, Request, RouteOutcome};
use meshfed::testing::{AdsClient, FakeServer, decode_all, node_with};
use meshfed_kube::fake_api::{FakeApiServer, objects};
use meshfed_registry::config::{Decoded, decode};
use serde::Deserialize;

use crate::support::*;

const RATINGS: &str = "ratings.default.svc.cluster.local";
const DETAILS: &str = "details.default.svc.cluster.local";

const VIRTUAL_SERVICE: &str = "apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: ratings, namespace: default}
spec:
  hosts: [ratings]
  http:
  - match: [{sourceLabels: {app: reviews, version: v1}}]
    route: [{destination: {host: details}}]
  - route: [{destination: {host: ratings}}]
";

/// `reviews` (port 9080 -> the pod's named port `http-web`) and two plain services.
fn services(api: &FakeApiServer) {
    let mut reviews = serde_json::to_value(objects::service(
        "default",
        "reviews",
        "10.96.0.7",
        &[("http", 9080)],
    ))
    .unwrap();
    reviews["spec"]["ports"][0]["targetPort"] = "http-web".into();
    api.apply(&serde_json::from_value::<objects::types::Service>(reviews).unwrap());
    api.apply(&objects::service(
        "default",
        "ratings",
        "10.96.0.8",
        &[("http", 9080)],
    ));
    api.apply(&objects::service(
        "default",
        "details",
        "10.96.0.9",
        &[("http", 9080)],
    ));
}

/// Pod `reviews-1` at 10.1.0.5, labelled `app=reviews,version=<version>`, listening on
/// its container port `http-web` = 9081, and not ready (so in no slice yet).
fn reviews_pod(version: &str) -> objects::types::Pod {
    let pod = objects::pod("default", "reviews-1", "reviews", "10.1.0.5", "node-1");
    let mut pod = serde_json::to_value(pod).unwrap();
    pod["metadata"]["labels"]["version"] = version.into();
    pod["spec"]["containers"][0]["ports"] =
        serde_json::json!([{"name": "http-web", "containerPort": 9081}]);
    pod["status"]["conditions"] = serde_json::json!([{"type": "Ready", "status": "False"}]);
    serde_json::from_value(pod).unwrap()
}

async fn start(api: &FakeApiServer) -> FakeServer {
    let client = api.client();
    let server = FakeServer::builder()
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
        .unwrap();
    let http = server.bound().http;
    eventually("the Kubernetes registry to sync", || async move {
        (http_get(http, "/ready").await.0 == 200).then_some(())
    })
    .await;
    server
}

fn apply(server: &FakeServer, yaml: &str) {
    let value =
        serde_json::Value::deserialize(serde_norway::Deserializer::from_str(yaml)).expect("YAML");
    match decode(&value, "test") {
        Decoded::Object(object) => {
            server.config_store().apply(object).expect("valid config");
        }
        other => panic!("not a config object: {other:?}"),
    }
}

/// The next response of `type_url`, ACKing (and skipping) responses of other types.
async fn next_of(client: &mut AdsClient, type_url: TypeUrl) -> DiscoveryResponse {
    loop {
        let response = client.recv().await.unwrap();
        client.ack(&response).await.unwrap();
        if response.type_url == type_url.as_str() {
            return response;
        }
    }
}

/// Where a request to `ratings:9080` goes in route table `9080`.
fn ratings_route(response: &DiscoveryResponse) -> RouteOutcome {
    let tables: Vec<RouteConfiguration> = decode_all(response).unwrap();
    let table = tables
        .iter()
        .find(|t| t.name == "9080")
        .expect("table 9080");
    simulate::route(table, &Request::new(RATINGS, 9080, "/")).unwrap()
}

#[tokio::test]
async fn a_sidecar_in_a_pod_no_slice_lists_gets_its_inbound_cluster_and_pod_labels() {
    let api = EnforcedApi::start().await;
    api.apply(&objects::node("node-1", "r1", "z1"));
    services(&api);
    api.apply(&reviews_pod("v1"));
    let server = start(&api).await;
    apply(&server, VIRTUAL_SERVICE);
    server.sync().await;

    // No LABELS, no CLUSTER_ID: everything the proxy is comes from its pod.
    let mut client = AdsClient::connect(
        server.grpc_addr(),
        node_with(
            "sidecar~10.1.0.5~reviews-1.default~default.svc.cluster.local",
            serde_json::json!({}),
        ),
    )
    .await
    .unwrap();
    client.subscribe(TypeUrl::Cluster, &[]).await.unwrap();
    let clusters = client.recv_clusters().await.unwrap();
    let names: Vec<&str> = clusters.iter().map(|c| c.name.as_str()).collect();
    assert!(
        names.contains(&"inbound|9081||"),
        "the named target port, resolved in the pod: {names:?}"
    );

    client.subscribe(TypeUrl::Route, &["9080"]).await.unwrap();
    let routes = next_of(&mut client, TypeUrl::Route).await;
    assert_eq!(
        ratings_route(&routes),
        RouteOutcome::Cluster(format!("outbound|9080||{DETAILS}")),
        "sourceLabels matched the pod's labels"
    );

    // The pod is relabelled: the next push gives the proxy its new labels.
    api.apply(&reviews_pod("v2"));
    let routes = next_of(&mut client, TypeUrl::Route).await;
    assert_eq!(
        ratings_route(&routes),
        RouteOutcome::Cluster(format!("outbound|9080||{RATINGS}"))
    );
    server.shutdown().await;
}
