//! Kubernetes objects in, mesh model out: services, endpoint shards and the pushes
//! that announce them.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use meshfed_kube::fake_api::FakeApiServer;
use meshfed_kube::fake_api::objects::{namespace, node, pod, service, slice, slice_endpoint};
use meshfed_kube::{
    EventType, ExternalAddress, KubeRegistryConfig, NamespaceFilter, ResourceKind, ServiceType,
};
use meshfed_registry::{
    ConfigKey, HealthStatus, Protocol, ProviderId, Resolution, ServiceRegistry, TlsMode,
};

use crate::support::{Harness, key};

async fn api() -> FakeApiServer {
    FakeApiServer::start().await.expect("fake API server")
}

fn hostnames(p: &meshfed_registry::PushRequest) -> Vec<String> {
    let mut names: Vec<String> = p.updated_hostnames().map(str::to_string).collect();
    names.dedup();
    names
}

#[tokio::test]
async fn initial_list_announces_everything_then_syncs() {
    let api = api().await;
    api.apply(&namespace("default", &[]));
    api.apply(&node("n1", "r1", "z1"));
    api.apply(&pod("default", "reviews-1", "reviews", "10.1.0.1", "n1"));
    api.apply(&service(
        "default",
        "reviews",
        "10.0.0.1",
        &[("http", 9080)],
    ));
    api.apply(&slice(
        "default",
        "reviews-abc",
        "reviews",
        &[("http", 9080)],
        &[("10.1.0.1", "reviews-1")],
    ));
    let mut h = Harness::start(api, KubeRegistryConfig::new("c1")).await;
    assert!(!h.registry.has_synced());
    let before = h.wait_synced().await;
    assert!(h.registry.has_synced());
    let reviews = key("default", "reviews");
    assert!(
        before
            .iter()
            .any(|p| p.full && p.configs_updated.contains(&ConfigKey::service(&reviews))),
        "the service is announced before Synced: {before:?}"
    );

    let services = h.registry.services();
    assert_eq!(services.len(), 1);
    let s = &services[0];
    assert_eq!(s.hostname.as_str(), "reviews.default.svc.cluster.local");
    assert_eq!(s.provider, ProviderId::Kubernetes);
    assert_eq!(
        s.cluster_vips[&meshfed_registry::ClusterId::new("c1")],
        vec!["10.0.0.1".parse::<std::net::IpAddr>().unwrap()]
    );
    assert_eq!(s.ports[0].protocol, Protocol::Http);
    assert_eq!(s.ports[0].port.get(), 9080);
    assert_eq!(s.labels["app"], "reviews");
    assert!(s.creation_time > std::time::SystemTime::UNIX_EPOCH);
    assert_eq!(h.registry.shard_key().to_string(), "Kubernetes/c1");

    let endpoints = h.endpoints(&reviews);
    assert_eq!(endpoints.len(), 1);
    let e = &endpoints[0];
    assert_eq!(e.address.to_string(), "10.1.0.1");
    assert_eq!(e.ports.get("http"), Some(&9080));
    assert_eq!(e.locality.to_string(), "r1/z1/");
    assert_eq!(e.tls_mode, TlsMode::Istio);
    assert_eq!(e.health, HealthStatus::Healthy);
    assert_eq!(e.cluster_id.as_str(), "c1");
    assert_eq!(
        e.service_account.as_deref(),
        Some("spiffe://cluster.local/ns/default/sa/reviews")
    );
    for (label, value) in [
        ("app", "reviews"),
        ("topology.istio.io/cluster", "c1"),
        ("kubernetes.io/hostname", "n1"),
        ("topology.kubernetes.io/region", "r1"),
        ("topology.kubernetes.io/zone", "z1"),
    ] {
        assert_eq!(
            e.labels.get(label).map(String::as_str),
            Some(value),
            "{label}"
        );
    }
    assert_eq!(h.registry.stats().objects(ResourceKind::Pod), 1);
    h.stop().await;
}

#[tokio::test]
async fn create_update_delete_show_up_in_the_model() {
    let mut h = Harness::synced(api().await).await;
    let ratings = key("default", "ratings");

    // Service add: a full push naming it.
    h.api.apply(&service(
        "default",
        "ratings",
        "10.0.0.2",
        &[("grpc", 9090)],
    ));
    let push = h.next_push().await;
    assert!(push.full);
    assert_eq!(hostnames(&push), vec![ratings.hostname.to_string()]);
    assert_eq!(h.registry.services()[0].ports[0].protocol, Protocol::Grpc);

    // Node, pod and slice: endpoints appear.
    h.api.apply(&node("n1", "r1", "z1"));
    h.api
        .apply(&pod("default", "ratings-1", "ratings", "10.1.0.7", "n1"));
    h.api.apply(&slice(
        "default",
        "ratings-1",
        "ratings",
        &[("grpc", 9090)],
        &[("10.1.0.7", "ratings-1")],
    ));
    h.until("the endpoint", |h| {
        (h.endpoints(&ratings).len() == 1).then_some(())
    })
    .await;

    // Pod update: the label change reaches the endpoint.
    let mut p: Pod = h.api.get(Some("default"), "ratings-1").unwrap();
    p.metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("version".into(), "v2".into());
    h.api.apply(&p);
    h.until("the pod's new label", |h| {
        h.endpoints(&ratings)
            .first()
            .and_then(|e| e.labels.get("version").cloned())
    })
    .await;

    // Node update: the locality follows the node's labels.
    let mut n: Node = h.api.get(None, "n1").unwrap();
    n.metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("topology.kubernetes.io/zone".into(), "z2".into());
    h.api.apply(&n);
    h.until("the node's new zone", |h| {
        h.endpoints(&ratings)
            .first()
            .filter(|e| e.locality.zone == "z2")
            .map(|_| ())
    })
    .await;

    // Slice update: a second address, not ready.
    let mut s: EndpointSlice = h.api.get(Some("default"), "ratings-1").unwrap();
    let mut not_ready = slice_endpoint("default", "10.1.0.8", None);
    not_ready.conditions.as_mut().unwrap().ready = Some(false);
    s.endpoints.push(not_ready);
    h.api.apply(&s);
    let endpoints = h
        .until("two endpoints", |h| {
            Some(h.endpoints(&ratings)).filter(|e| e.len() == 2)
        })
        .await;
    assert_eq!(endpoints[1].health, HealthStatus::Unhealthy);
    assert_eq!(
        endpoints[1].tls_mode,
        TlsMode::Disabled,
        "no pod, no sidecar"
    );

    // Slice delete: the key stays, with no endpoints.
    h.api
        .delete::<EndpointSlice>(Some("default"), "ratings-1")
        .unwrap();
    h.until("no endpoints", |h| {
        h.endpoints(&ratings).is_empty().then_some(())
    })
    .await;
    assert!(h.index.contains(&ratings));

    // Service delete: gone from the model and the index, with a full push.
    h.drain();
    h.api.delete::<Service>(Some("default"), "ratings").unwrap();
    let push = h.next_push().await;
    assert!(push.full && push.configs_updated.contains(&ConfigKey::service(&ratings)));
    assert!(h.registry.services().is_empty());
    assert!(!h.index.contains(&ratings));
    h.stop().await;
}

#[tokio::test]
async fn a_pod_arriving_after_its_slice_fills_the_endpoint() {
    let mut h = Harness::synced(api().await).await;
    let details = key("default", "details");
    h.api
        .apply(&service("default", "details", "10.0.0.3", &[("http", 80)]));
    h.api.apply(&slice(
        "default",
        "details-1",
        "details",
        &[("http", 80)],
        &[("10.1.0.3", "details-1")],
    ));
    h.until("the address waiting for its pod", |h| {
        (h.registry.stats().endpoints_pending_pod() == 1).then_some(())
    })
    .await;
    assert!(
        h.endpoints(&details).is_empty(),
        "skipped until the pod is known"
    );
    h.next_push().await; // the service
    h.api
        .apply(&pod("default", "details-1", "details", "10.1.0.3", "n1"));
    let push = loop {
        let push = h.next_push().await;
        if !h.endpoints(&details).is_empty() {
            break push;
        }
    };
    assert_eq!(hostnames(&push), vec![details.hostname.to_string()]);
    assert_eq!(h.registry.stats().endpoints_pending_pod(), 0);
    assert_eq!(h.endpoints(&details)[0].tls_mode, TlsMode::Istio);
    h.stop().await;
}

#[tokio::test]
async fn only_the_changed_hostname_is_pushed() {
    let api = api().await;
    for (name, ip, pod_ip) in [
        ("a", "10.0.0.10", "10.1.0.10"),
        ("b", "10.0.0.11", "10.1.0.11"),
    ] {
        api.apply(&service("default", name, ip, &[("http", 80)]));
        api.apply(&pod("default", &format!("{name}-1"), name, pod_ip, "n1"));
        api.apply(&slice(
            "default",
            &format!("{name}-1"),
            name,
            &[("http", 80)],
            &[(pod_ip, &format!("{name}-1"))],
        ));
    }
    let mut h = Harness::synced(api).await;
    let (a, b) = (key("default", "a"), key("default", "b"));

    // A new address for a: an endpoints-only push for a alone. (The pod alone pushes
    // nothing: no slice names it yet.)
    h.api.apply(&pod("default", "a-2", "a", "10.1.0.12", "n1"));
    let mut s: EndpointSlice = h.api.get(Some("default"), "a-1").unwrap();
    s.endpoints
        .push(slice_endpoint("default", "10.1.0.12", Some("a-2")));
    h.api.apply(&s);
    let push = h.next_push().await;
    assert!(push.is_endpoints_only(), "{push:?}");
    assert_eq!(hostnames(&push), vec![a.hostname.to_string()]);
    assert_eq!(h.endpoints(&a).len(), 2);

    // A change to a's Service that does not change the model pushes nothing: the next
    // push is b's.
    let mut svc: Service = h.api.get(Some("default"), "a").unwrap();
    svc.metadata.annotations = Some(BTreeMap::from([("unrelated".into(), "x".into())]));
    let updates = h
        .registry
        .stats()
        .events(ResourceKind::Service, EventType::Update);
    h.api.apply(&svc);
    h.until("the service update applied", |h| {
        (h.registry
            .stats()
            .events(ResourceKind::Service, EventType::Update)
            > updates)
            .then_some(())
    })
    .await;
    let mut p: Pod = h.api.get(Some("default"), "b-1").unwrap();
    p.metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("version".into(), "v2".into());
    h.api.apply(&p);
    let push = h.next_push().await;
    assert!(push.is_endpoints_only(), "{push:?}");
    assert_eq!(hostnames(&push), vec![b.hostname.to_string()]);
    h.stop().await;
}

#[tokio::test]
async fn conversion_errors_skip_only_the_bad_object() {
    let api = api().await;
    api.apply(&service("default", "good", "10.0.0.20", &[("http", 80)]));
    api.apply(&service(
        "default",
        "bad-port",
        "10.0.0.21",
        &[("http", 70000)],
    ));
    api.apply(&service("default", "bad-ip", "10.0.0.300", &[("http", 80)]));
    api.apply(&pod("default", "good-1", "good", "10.1.0.20", "n1"));
    let mut bad_slice = slice("default", "good-bad", "good", &[("http", 80)], &[]);
    bad_slice
        .endpoints
        .push(slice_endpoint("default", "not-an-ip", None));
    api.apply(&bad_slice);
    api.apply(&slice(
        "default",
        "good-1",
        "good",
        &[("http", 80)],
        &[("10.1.0.20", "good-1")],
    ));
    let mut h = Harness::synced(api).await;
    let names: Vec<String> = h
        .registry
        .services()
        .iter()
        .map(|s| s.hostname.to_string())
        .collect();
    assert_eq!(names, vec!["good.default.svc.cluster.local"]);
    assert_eq!(h.endpoints(&key("default", "good")).len(), 1);
    let stats = h.registry.stats();
    assert_eq!(stats.conversion_errors(ResourceKind::Service), 2);
    assert_eq!(stats.conversion_errors(ResourceKind::EndpointSlice), 1);

    // Fixing the bad service brings it in.
    h.api.apply(&service(
        "default",
        "bad-port",
        "10.0.0.21",
        &[("http", 8080)],
    ));
    let push = h.next_push().await;
    assert_eq!(
        hostnames(&push),
        vec!["bad-port.default.svc.cluster.local".to_string()]
    );
    // Breaking a good service keeps its last good version.
    h.api
        .apply(&service("default", "good", "10.0.0.20", &[("http", 0)]));
    h.until("the error counted", |h| {
        (h.registry.stats().conversion_errors(ResourceKind::Service) == 3).then_some(())
    })
    .await;
    let good = h.registry.service(&key("default", "good")).unwrap();
    assert_eq!(good.ports[0].port.get(), 80);
    h.stop().await;
}

#[tokio::test]
async fn service_kinds_and_annotations_convert() {
    let api = api().await;
    let mut headless = service("default", "db", "None", &[("tcp-db", 5432)]);
    headless.spec.as_mut().unwrap().cluster_ips = Some(vec!["None".into()]);
    api.apply(&headless);
    let mut external = service("default", "ext", "", &[("https", 443)]);
    let spec = external.spec.as_mut().unwrap();
    spec.type_ = Some("ExternalName".into());
    spec.external_name = Some("api.example.com".into());
    spec.cluster_ip = None;
    spec.cluster_ips = None;
    api.apply(&external);
    let mut lb = service("istio-system", "eastwest", "10.0.0.30", &[("tls", 15443)]);
    lb.spec.as_mut().unwrap().type_ = Some("LoadBalancer".into());
    lb.status = Some(k8s_openapi::api::core::v1::ServiceStatus {
        load_balancer: Some(k8s_openapi::api::core::v1::LoadBalancerStatus {
            ingress: Some(vec![
                k8s_openapi::api::core::v1::LoadBalancerIngress {
                    ip: Some("203.0.113.5".into()),
                    ..Default::default()
                },
                k8s_openapi::api::core::v1::LoadBalancerIngress {
                    hostname: Some("lb.example.com".into()),
                    ..Default::default()
                },
            ]),
        }),
        ..Default::default()
    });
    lb.metadata.annotations = Some(BTreeMap::from([(
        "networking.istio.io/exportTo".to_string(),
        ".".to_string(),
    )]));
    api.apply(&lb);
    let h = Harness::synced(api).await;

    let db = h.registry.service(&key("default", "db")).unwrap();
    assert_eq!(db.resolution, Resolution::Passthrough);
    assert!(db.cluster_vips.is_empty());
    assert_eq!(db.ports[0].protocol, Protocol::Tcp);

    let ext_key = key("default", "ext");
    let ext = h.registry.service(&ext_key).unwrap();
    assert_eq!(ext.location, meshfed_registry::MeshLocation::MeshExternal);
    // Istio HEAD: an alias of its external name, not a DNS cluster of its own.
    assert_eq!(ext.resolution, Resolution::Alias);
    assert_eq!(
        ext.alias_for.as_ref().map(|h| h.as_str()),
        Some("api.example.com")
    );
    let attributes = h.registry.attributes(&ext_key).unwrap();
    assert_eq!(attributes.service_type, ServiceType::ExternalName);
    assert_eq!(attributes.external_name.as_deref(), Some("api.example.com"));

    let ew = key("istio-system", "eastwest");
    assert_eq!(
        h.registry.external_addresses(&ew),
        vec![
            ExternalAddress::Ip("203.0.113.5".parse().unwrap()),
            ExternalAddress::Hostname("lb.example.com".into()),
        ]
    );
    // The same by hostname, as text (a Gateway API Gateway's `status.addresses`).
    assert_eq!(
        meshfed_registry::ServiceRegistry::external_addresses(
            &*h.registry,
            "eastwest.istio-system.svc.cluster.local"
        ),
        ["203.0.113.5", "lb.example.com"]
    );
    let ew_service = h.registry.service(&ew).unwrap();
    assert!(
        ew_service
            .export_to
            .visible_to("istio-system", "istio-system")
    );
    assert!(!ew_service.export_to.visible_to("istio-system", "default"));
    h.stop().await;
}

#[tokio::test]
async fn namespace_selection_and_the_system_namespace_network() {
    let api = api().await;
    api.apply(&namespace(
        "istio-system",
        &[("topology.istio.io/network", "net-1")],
    ));
    api.apply(&namespace("apps", &[("mesh", "on")]));
    api.apply(&namespace("other", &[]));
    for ns in ["apps", "other"] {
        api.apply(&service(ns, "web", "10.0.0.40", &[("http", 80)]));
        api.apply(&pod(ns, "web-1", "web", "10.1.0.40", "n1"));
        api.apply(&slice(
            ns,
            "web-1",
            "web",
            &[("http", 80)],
            &[("10.1.0.40", "web-1")],
        ));
    }
    let config = KubeRegistryConfig {
        namespaces: NamespaceFilter::Selectors(vec![LabelSelector {
            match_labels: Some(BTreeMap::from([("mesh".to_string(), "on".to_string())])),
            match_expressions: None,
        }]),
        ..KubeRegistryConfig::new("c1")
    };
    let mut h = Harness::start(api, config).await;
    h.wait_synced().await;
    let (apps, other) = (key("apps", "web"), key("other", "web"));
    assert_eq!(h.registry.services().len(), 1);
    assert!(h.registry.service(&apps).is_some());
    assert_eq!(h.endpoints(&apps)[0].network.as_str(), "net-1");
    assert_eq!(
        h.endpoints(&apps)[0].labels["topology.istio.io/network"],
        "net-1"
    );
    assert!(
        !h.index.contains(&other),
        "unselected namespaces write no endpoints"
    );

    // Labelling the namespace selects it.
    h.api.apply(&namespace("other", &[("mesh", "on")]));
    h.until("the newly selected service", |h| h.registry.service(&other))
        .await;
    h.until("its endpoints", |h| {
        (h.endpoints(&other).len() == 1).then_some(())
    })
    .await;

    // A pod's own network label wins over the system namespace's.
    let mut p: Pod = h.api.get(Some("other"), "web-1").unwrap();
    p.metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("topology.istio.io/network".into(), "net-2".into());
    h.api.apply(&p);
    h.until("the pod's network", |h| {
        h.endpoints(&other)
            .first()
            .filter(|e| e.network.as_str() == "net-2")
            .map(|_| ())
    })
    .await;

    // Unlabelling deselects it: deleted with a full push.
    h.api.apply(&namespace("other", &[]));
    h.until("the deselected service gone", |h| {
        h.registry.service(&other).is_none().then_some(())
    })
    .await;
    assert!(!h.index.contains(&other));
    let _ = h.api.delete::<Namespace>(None, "other");
    h.stop().await;
}
