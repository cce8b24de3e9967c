//! The Kubernetes registry end to end: a fake API server speaking the real wire format,
//! meshfed reading it, and an ADS client seeing the result.

use std::net::SocketAddr;

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
use meshfed::ads::TypeUrl;
use meshfed::app::{KubeSettings, KubeSource};
use meshfed::generate::simulate::{self, Request, RouteOutcome};
use meshfed::testing::{AdsClient, FakeServer, decode_all, node};
use meshfed_kube::fake_api::{CustomResource, FakeApiServer, objects};

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

/// Waits for `/ready`; a request the enforced role refused fails at once.
async fn wait_ready(api: &FakeApiServer, http: SocketAddr) {
    eventually("the Kubernetes registry to sync", || async move {
        let denied = api.denied_requests();
        assert!(denied.is_empty(), "refused:\n{}", describe(&denied));
        (http_get(http, "/ready").await.0 == 200).then_some(())
    })
    .await;
}

#[tokio::test]
async fn services_and_endpoint_slices_reach_proxies_and_changes_are_incremental() {
    let api = EnforcedApi::start().await;
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
    wait_ready(&api, server.bound().http).await;
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

/// The first route table named `name` in an RDS response, if any.
fn route_table(routes: &[RouteConfiguration], name: &str) -> Option<RouteConfiguration> {
    routes.iter().find(|r| r.name == name).cloned()
}

/// Reads (and ACKs) responses until one of `type_url` satisfies `check`.
async fn recv_until<M: prost::Message + Default, T>(
    client: &mut AdsClient,
    type_url: TypeUrl,
    mut check: impl FnMut(&[M]) -> Option<T>,
) -> T {
    loop {
        let response = client.recv().await.unwrap();
        client.ack(&response).await.unwrap();
        if response.type_url == type_url.as_str()
            && let Some(found) = check(&decode_all::<M>(&response).unwrap())
        {
            return found;
        }
    }
}

#[tokio::test]
async fn istio_config_from_the_api_server_reaches_proxies_and_rejections_show_in_configz() {
    const REVIEWS: &str = "reviews.default.svc.cluster.local";
    const RATINGS: &str = "ratings.default.svc.cluster.local";
    let api = EnforcedApi::start().await;
    api.install_crds(CustomResource::istio_networking(&[
        "v1", "v1beta1", "v1alpha3",
    ]));
    api.apply(&objects::node("node-1", "r1", "z1"));
    for (name, vip, ip) in [
        ("reviews", "10.96.0.7", "10.1.0.1"),
        ("ratings", "10.96.0.8", "10.1.0.2"),
    ] {
        let pod = format!("{name}-1");
        api.apply(&objects::service("default", name, vip, &[("http", 9080)]));
        api.apply(&objects::pod("default", &pod, name, ip, "node-1"));
        api.apply(&objects::slice(
            "default",
            &format!("{name}-abc"),
            name,
            &[("http", 9080)],
            &[(ip, &pod)],
        ));
    }
    let server = start(&api).await;
    let http = server.bound().http;
    wait_ready(&api, http).await;
    assert!(
        server.server().kube_config_store().is_some(),
        "on by default with Kubernetes"
    );
    server.sync().await;

    let mut client = AdsClient::connect(
        server.grpc_addr(),
        node("sidecar~10.2.0.1~app.default~default.svc.cluster.local"),
    )
    .await
    .unwrap();
    client.subscribe(TypeUrl::Listener, &[]).await.unwrap();
    let listeners: Vec<Listener> =
        decode_all(&client.recv_type(TypeUrl::Listener).await.unwrap()).unwrap();
    let route_names: Vec<String> = listeners
        .iter()
        .flat_map(|l| meshfed::generate::lds::references(l).1)
        .collect();
    assert!(route_names.iter().any(|r| r == "9080"), "{route_names:?}");
    client.subscribe(TypeUrl::Route, &["9080"]).await.unwrap();
    let routes: Vec<RouteConfiguration> =
        decode_all(&client.recv_type(TypeUrl::Route).await.unwrap()).unwrap();
    let to_reviews = Request::new("reviews", 9080, "/");
    assert_eq!(
        simulate::route(&route_table(&routes, "9080").unwrap(), &to_reviews).unwrap(),
        RouteOutcome::Cluster(format!("outbound|9080||{REVIEWS}"))
    );

    // A VirtualService written to the API server (in v1beta1) sends reviews' traffic to
    // ratings.
    api.apply_custom(&objects::istio(
        "v1beta1",
        "VirtualService",
        "default",
        "reviews",
        serde_json::json!({"hosts": ["reviews"], "http": [{"route": [{"destination": {"host": "ratings"}}]}]}),
    ));
    let want = RouteOutcome::Cluster(format!("outbound|9080||{RATINGS}"));
    recv_until(
        &mut client,
        TypeUrl::Route,
        |routes: &[RouteConfiguration]| {
            let table = route_table(routes, "9080")?;
            (simulate::route(&table, &to_reviews).ok()? == want).then_some(())
        },
    )
    .await;

    // A ServiceEntry from the API server reaches the ServiceEntry registry: a cluster.
    client.subscribe(TypeUrl::Cluster, &[]).await.unwrap();
    api.apply_custom(&objects::istio(
        "v1",
        "ServiceEntry",
        "default",
        "external",
        serde_json::json!({
            "hosts": ["api.example.com"],
            "ports": [{"number": 443, "name": "tls", "protocol": "TLS"}],
            "resolution": "DNS",
            "location": "MESH_EXTERNAL",
        }),
    ));
    recv_until(&mut client, TypeUrl::Cluster, |clusters: &[Cluster]| {
        clusters
            .iter()
            .any(|c| c.name == "outbound|443||api.example.com")
            .then_some(())
    })
    .await;

    // An invalid DestinationRule is rejected alone and shows in configz with its
    // namespace, name and field; the VirtualService stays.
    api.apply_custom(&objects::istio(
        "v1",
        "DestinationRule",
        "default",
        "reviews-bad",
        serde_json::json!({"host": "reviews", "subsets": [{"name": ""}]}),
    ));
    let rejected = eventually("the rejection in configz", || async move {
        let configz = get_json(http, "/debug/configz").await;
        configz["rejected"]
            .as_array()?
            .iter()
            .find(|r| r["name"] == "reviews-bad")
            .cloned()
    })
    .await;
    assert_eq!(rejected["namespace"], "default");
    assert_eq!(rejected["kind"], "DestinationRule");
    assert_eq!(
        rejected["source"],
        "kubernetes:Kubernetes/default/reviews-bad"
    );
    assert!(
        rejected["errors"][0]
            .as_str()
            .unwrap()
            .starts_with("spec.subsets[0].name: "),
        "{rejected}"
    );
    // The store's state is on /metrics for alerts.
    let (_, metrics) = http_get(server.bound().monitoring, "/metrics").await;
    for line in [
        "meshfed_kube_config_objects{kind=\"VirtualService\"} 1",
        "meshfed_kube_config_objects{kind=\"ServiceEntry\"} 1",
        "meshfed_kube_config_rejections{registry=\"kubernetes\"} 1",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "{line} not in:\n{metrics}"
        );
    }
    let configz = get_json(http, "/debug/configz").await;
    let objects: Vec<String> = configz["objects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            format!(
                "{} {}",
                o["kind"].as_str().unwrap(),
                o["name"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(
        objects,
        ["ServiceEntry external", "VirtualService reviews"],
        "the valid objects apply"
    );
    server.shutdown().await;
}

/// `connect_timeout` of `outbound|80||reviews...` in seconds.
fn connect_timeout(clusters: &[Cluster]) -> Option<i64> {
    clusters
        .iter()
        .find(|c| c.name == CLUSTER)
        .and_then(|c| c.connect_timeout.as_ref())
        .map(|d| d.seconds)
}

async fn networks(http: SocketAddr) -> Vec<String> {
    let z = get_json(http, "/debug/networkz").await;
    z["networks"]
        .as_array()
        .map(|n| {
            n.iter()
                .filter_map(|n| n["network"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn mesh_settings_come_from_the_istio_config_map_watched_with_the_last_good_rule() {
    let api = EnforcedApi::start().await;
    api.apply(&objects::node("node-1", "r1", "z1"));
    api.apply(&objects::service(
        "default",
        "reviews",
        "10.96.0.7",
        &[("http", 80)],
    ));
    let networks_yaml = |name: &str| {
        format!(
            "networks:\n  {name}:\n    endpoints: [{{fromCidr: 10.9.0.0/16}}]\n    gateways: [{{address: 192.0.2.99, port: 15443}}]\n"
        )
    };
    api.apply(&objects::config_map(
        "istio-system",
        "istio",
        &[
            ("mesh", "connectTimeout: 7s\n"),
            ("meshNetworks", &networks_yaml("n9")),
        ],
    ));
    let server = start(&api).await;
    let http = server.bound().http;
    wait_ready(&api, http).await;
    server.sync().await;
    assert_eq!(networks(http).await, ["n9"]);
    let mut client = AdsClient::connect(
        server.grpc_addr(),
        node("sidecar~10.1.0.9~app.default~default.svc.cluster.local"),
    )
    .await
    .unwrap();
    client.subscribe(TypeUrl::Cluster, &[]).await.unwrap();
    let clusters = client.recv_clusters().await.unwrap();
    assert_eq!(connect_timeout(&clusters), Some(7));

    // A change is pushed.
    api.apply(&objects::config_map(
        "istio-system",
        "istio",
        &[
            ("mesh", "connectTimeout: 3s\n"),
            ("meshNetworks", &networks_yaml("n9")),
        ],
    ));
    let clusters = client.recv_clusters().await.unwrap();
    assert_eq!(connect_timeout(&clusters), Some(3));

    // An invalid `mesh` keeps the last good MeshConfig; the valid key still applies.
    api.apply(&objects::config_map(
        "istio-system",
        "istio",
        &[
            ("mesh", "connectTimeout: banana\n"),
            ("meshNetworks", &networks_yaml("n8")),
        ],
    ));
    eventually("meshNetworks n8 applied", || async move {
        (networks(http).await == ["n8"]).then_some(())
    })
    .await;
    let clusters = client.recv_clusters().await.unwrap();
    assert_eq!(connect_timeout(&clusters), Some(3), "last good MeshConfig");

    // Deleted: the last good settings stay.
    api.delete::<objects::ConfigMap>(Some("istio-system"), "istio");
    api.apply(&objects::service(
        "default",
        "ratings",
        "10.96.0.8",
        &[("http", 80)],
    ));
    server.sync().await;
    assert_eq!(networks(http).await, ["n8"]);
}

async fn leader(server: &FakeServer) -> Option<f64> {
    let (_, text) = http_get(server.bound().monitoring, "/metrics").await;
    metric(&text, "meshfed_leader{lease=\"meshfed-leader\"}")
}

#[tokio::test]
async fn one_replica_holds_the_lease_and_hands_it_over_when_it_stops() {
    let api = EnforcedApi::start().await;
    let replica = |identity: &'static str| {
        let client = api.client();
        FakeServer::builder()
            .configure(move |c| {
                c.kubernetes = Some(KubeSettings {
                    source: KubeSource::Client(client),
                    namespaces: meshfed_kube::NamespaceFilter::All,
                    system_namespace: "istio-system".into(),
                    remote_secrets: Default::default(),
                });
                c.lease = Some(meshfed::app::LeaseSettings {
                    identity: Some(identity.into()),
                    duration: std::time::Duration::from_secs(3),
                    renew_every: std::time::Duration::from_millis(100),
                    ..Default::default()
                });
            })
            .start()
    };
    let a = replica("replica-a").await.unwrap();
    eventually("replica-a leads", || async {
        (leader(&a).await == Some(1.0)).then_some(())
    })
    .await;
    let b = replica("replica-b").await.unwrap();
    wait_ready(&api, b.bound().http).await;
    // b keeps trying while a renews: it never takes the Lease.
    eventually("replica-b retried at least once", || async {
        let gets = api
            .requests()
            .iter()
            .filter(|r| r.method == "GET" && r.path.ends_with("/leases/meshfed-leader"))
            .count();
        (gets >= 6).then_some(())
    })
    .await;
    assert_eq!(leader(&b).await, Some(0.0));
    assert_eq!(leader(&a).await, Some(1.0));
    // a stops and releases the Lease: b takes it without waiting it out.
    let stopped = tokio::time::Instant::now();
    a.shutdown().await;
    eventually("replica-b leads", || async {
        (leader(&b).await == Some(1.0)).then_some(())
    })
    .await;
    assert!(
        stopped.elapsed() < std::time::Duration::from_secs(3),
        "taken over after the release, not after the 3 s Lease ran out: {:?}",
        stopped.elapsed()
    );
    b.shutdown().await;
}

/// The addresses of the endpoints in a load assignment.
fn lb_addresses(
    cla: &envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment,
) -> Vec<String> {
    use envoy_types::pb::envoy::config::core::v3::address::Address;
    use envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
    cla.endpoints
        .iter()
        .flat_map(|l| &l.lb_endpoints)
        .filter_map(|e| match e.host_identifier.as_ref()? {
            HostIdentifier::Endpoint(ep) => match ep.address.as_ref()?.address.as_ref()? {
                Address::SocketAddress(s) => Some(s.address.clone()),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

/// Reads load assignments until `cluster`'s addresses are `want` (sorted).
async fn recv_addresses(client: &mut AdsClient, cluster: &str, want: &[&str]) {
    recv_until(
        client,
        TypeUrl::Endpoint,
        |clas: &[envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment]| {
            let cla = clas.iter().find(|c| c.cluster_name == cluster)?;
            let mut got = lb_addresses(cla);
            got.sort();
            (got == want).then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn a_service_selects_workload_entries_of_its_namespace_into_its_endpoints() {
    let api = EnforcedApi::start().await;
    api.install_crds(CustomResource::istio_networking(&[
        "v1", "v1beta1", "v1alpha3",
    ]));
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
    // A VM running reviews, and one in another namespace that must stay out.
    let vm = |namespace: &str| {
        objects::istio(
            "v1",
            "WorkloadEntry",
            namespace,
            "reviews-vm",
            serde_json::json!({"address": "10.5.0.9", "labels": {"app": "reviews"}}),
        )
    };
    api.apply_custom(&vm("default"));
    api.apply_custom(&objects::istio(
        "v1",
        "WorkloadEntry",
        "other",
        "reviews-vm",
        serde_json::json!({"address": "10.6.0.9", "labels": {"app": "reviews"}}),
    ));

    let server = start(&api).await;
    wait_ready(&api, server.bound().http).await;
    server.sync().await;
    let mut client = AdsClient::connect(
        server.grpc_addr(),
        node("sidecar~10.2.0.1~app.default~default.svc.cluster.local"),
    )
    .await
    .unwrap();
    client.subscribe(TypeUrl::Cluster, &[]).await.unwrap();
    client.recv_clusters().await.unwrap();
    client
        .subscribe(TypeUrl::Endpoint, &[CLUSTER])
        .await
        .unwrap();
    recv_addresses(&mut client, CLUSTER, &["10.1.0.1", "10.5.0.9"]).await;

    // The VM's own proxy serves the Service's port (Istio finds the Services its entry
    // is selected by).
    let mut vm_proxy = AdsClient::connect(
        server.grpc_addr(),
        node("sidecar~10.5.0.9~reviews-vm.default~default.svc.cluster.local"),
    )
    .await
    .unwrap();
    vm_proxy.subscribe(TypeUrl::Cluster, &[]).await.unwrap();
    let clusters = vm_proxy.recv_clusters().await.unwrap();
    assert!(
        clusters.iter().any(|c| c.name == "inbound|80||"),
        "{:?}",
        clusters.iter().map(|c| &c.name).collect::<Vec<_>>()
    );

    // The entry is deleted: the VM leaves the service's endpoints.
    api.delete_custom(
        "networking.istio.io",
        "WorkloadEntry",
        "default",
        "reviews-vm",
    )
    .expect("the entry existed");
    recv_addresses(&mut client, CLUSTER, &["10.1.0.1"]).await;

    // Back again, then the Service's selector no longer matches it.
    api.apply_custom(&vm("default"));
    recv_addresses(&mut client, CLUSTER, &["10.1.0.1", "10.5.0.9"]).await;
    let mut reviews = objects::service("default", "reviews", "10.96.0.7", &[("http", 80)]);
    reviews.spec.as_mut().unwrap().selector = Some(
        [("app".to_string(), "reviews-v2".to_string())]
            .into_iter()
            .collect(),
    );
    api.apply(&reviews);
    recv_addresses(&mut client, CLUSTER, &["10.1.0.1"]).await;
    server.shutdown().await;
}

/// A fresh cluster without `istio-system`: the CA Secret and the Lease cannot be
/// written there, yet plaintext xDS serves, `/debug/duties` and the metrics say what
/// is missing and what to do, and creating the namespace completes both duties (the
/// secure port then serves certificates).
#[tokio::test]
async fn a_missing_system_namespace_is_reported_and_plaintext_serves_meanwhile() {
    use meshfed::testing::{ClientTls, create_certificate, tls_channel};
    let api = FakeApiServer::start().await.unwrap();
    api.require_namespaces();
    api.apply(&objects::namespace("default", &[]));
    let client = api.client();
    let server = FakeServer::builder()
        .configure(move |c| crate::secure::kube_ca(c, client))
        .start()
        .await
        .expect("a missing istio-system does not stop the start");
    let http = server.bound().http;

    // Plaintext xDS serves.
    let mut ads = AdsClient::connect(
        server.grpc_addr(),
        node("sidecar~10.1.0.9~a.default~default.svc.cluster.local"),
    )
    .await
    .unwrap();
    ads.subscribe(TypeUrl::Cluster, &[]).await.unwrap();
    ads.recv_clusters().await.unwrap();

    // What is missing, and what to do, per duty.
    let duties = eventually("the CA and Lease duties to fail", || async move {
        let (_, body) = http_get(http, "/debug/duties").await;
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        let failing = |duty: &str| {
            v["duties"]
                .as_array()
                .unwrap()
                .iter()
                .any(|d| d["duty"] == duty && d["state"] == "failing")
        };
        (failing("ca-secret") && failing("leader-lease")).then_some(v)
    })
    .await;
    let ca = duties["duties"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["duty"] == "ca-secret")
        .unwrap();
    let error = ca["last_error"].as_str().unwrap();
    assert!(
        error.contains("creating Secret istio-system/istio-ca-secret: namespace istio-system does not exist: create it")
            && error.contains("--systemNamespace")
            && error.contains("the secure xDS port waits for the CA"),
        "{error}"
    );
    let metrics = http_get(server.bound().monitoring, "/metrics").await.1;
    assert!(
        metric(&metrics, "meshfed_unmet_duties").unwrap() >= 2.0,
        "{metrics}"
    );
    assert!(
        metrics.contains("meshfed_startup_duty_failures_total{duty=\"ca-secret\"}"),
        "{metrics}"
    );

    // Once the namespace exists, the duties complete.
    api.apply(&objects::namespace("istio-system", &[]));
    eventually("the duties to complete", || async move {
        let (_, body) = http_get(http, "/debug/duties").await;
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        v["duties"]
            .as_array()
            .unwrap()
            .iter()
            .all(|d| d["state"] == "done")
            .then_some(())
    })
    .await;
    let root = crate::secure::published_root(&api, "default").await;
    assert!(
        api.get::<objects::types::Secret>(Some("istio-system"), "istio-ca-secret")
            .is_some()
    );
    let tls = ClientTls {
        roots_pem: root.clone(),
        identity: None,
        server_name: "istiod.istio-system.svc".into(),
    };
    let channel = tls_channel(server.secure_grpc_addr(), &tls).await.unwrap();
    let token = api.issue_token(
        "default",
        "app",
        &["istio-ca"],
        std::time::SystemTime::now() + std::time::Duration::from_secs(3600),
        None,
    );
    let mut metadata = tonic::metadata::MetadataMap::new();
    metadata.insert("authorization", format!("Bearer {token}").parse().unwrap());
    let key = rcgen::KeyPair::generate().unwrap();
    let csr = rcgen::CertificateParams::new(Vec::<String>::new())
        .unwrap()
        .serialize_request(&key)
        .unwrap()
        .pem()
        .unwrap();
    let response = create_certificate(
        channel,
        metadata,
        meshfed_api::auth::v1::IstioCertificateRequest {
            csr,
            ..Default::default()
        },
    )
    .await
    .expect("the secure port serves once the CA loads");
    assert_eq!(response.cert_chain.last().unwrap(), &root);
    let metrics = http_get(server.bound().monitoring, "/metrics").await.1;
    assert_eq!(
        metric(&metrics, "meshfed_unmet_duties"),
        Some(0.0),
        "{metrics}"
    );
    server.shutdown().await;
}
