//! The Address type built from registry data, and served by subscription.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;

use meshfed_api::mesh::v1alpha1::MeshNetworks;
use meshfed_registry::{
    Endpoint, HealthStatus, NetworkGateway, Port, Protocol, ProviderId, Service, ShardKey,
    WorkloadKind, WorkloadMeta, WorkloadOwner,
};

use super::build::{self, AmbientModel};
use super::waypoints::{Allowed, Traffic, Waypoint, Waypoints};
use super::*;
use crate::networks::NetworkView;

pub(super) const CLUSTER: &str = "cluster0";

pub(super) fn service(
    host: &str,
    ns: &str,
    provider: ProviderId,
    vips: &[&str],
    ports: &[(&str, u16)],
) -> Service {
    let mut s = Service::new(host, ns, provider, CLUSTER);
    for (name, port) in ports {
        s.ports.push(Port::new(name, *port, Protocol::Tcp).unwrap());
    }
    if !vips.is_empty() {
        s.cluster_vips.insert(
            CLUSTER.into(),
            vips.iter().map(|v| v.parse().unwrap()).collect(),
        );
    }
    s
}

pub(super) fn pod(name: &str, ns: &str, ip: &str, ports: &[(&str, u16)]) -> Endpoint {
    let mut e = Endpoint::new(ip.parse().unwrap());
    for (n, p) in ports {
        e = e.with_port(n, *p);
    }
    e.cluster_id = CLUSTER.into();
    e.workload = Some(Arc::new(WorkloadMeta {
        kind: WorkloadKind::Pod,
        name: name.into(),
        namespace: ns.into(),
        uid: format!("{CLUSTER}//Pod/{ns}/{name}"),
        workload_name: name.into(),
        ..WorkloadMeta::default()
    }));
    e
}

pub(super) fn model_of(
    services: Vec<(Service, Vec<Endpoint>)>,
    gateways: &[NetworkGateway],
) -> AmbientModel {
    model_with(services, vec![], gateways)
}

/// [`model_of`] with `standalone`: every workload the registries know beside the
/// services' endpoints (pods in the Kubernetes shard, the others in the External one).
pub(super) fn model_with(
    services: Vec<(Service, Vec<Endpoint>)>,
    standalone: Vec<Endpoint>,
    gateways: &[NetworkGateway],
) -> AmbientModel {
    model_with_waypoints(services, standalone, gateways, &Waypoints::default())
}

/// [`model_with`] with `waypoints`.
pub(super) fn model_with_waypoints(
    services: Vec<(Service, Vec<Endpoint>)>,
    standalone: Vec<Endpoint>,
    gateways: &[NetworkGateway],
    waypoints: &Waypoints,
) -> AmbientModel {
    let every: Vec<(ShardKey, Endpoint)> = standalone
        .into_iter()
        .map(|e| {
            let provider = match e.workload.as_deref().map(|m| m.kind) {
                Some(WorkloadKind::Pod) => ProviderId::Kubernetes,
                _ => ProviderId::External,
            };
            (ShardKey::new(provider, CLUSTER), e)
        })
        .collect();
    let standalone: Vec<(&ShardKey, &Endpoint)> = every.iter().map(|(s, e)| (s, e)).collect();
    let view = NetworkView::new(&MeshNetworks::default(), gateways);
    let owned: Vec<(Service, ShardKey, Vec<Endpoint>)> = services
        .into_iter()
        .map(|(s, eps)| {
            let shard = ShardKey::new(s.provider, s.cluster_id.clone());
            (s, shard, eps)
        })
        .collect();
    let input: Vec<build::ServiceEndpoints<'_>> = owned
        .iter()
        .map(|(s, shard, eps)| (s, eps.iter().map(|e| (shard, e)).collect()))
        .collect();
    build::build(
        &input,
        &standalone,
        &view,
        "cluster.local",
        "cluster.local",
        waypoints,
        None,
    )
}

#[test]
fn a_pod_behind_two_services_is_one_workload_listing_both() {
    let a = service(
        "a.ns.svc.cluster.local",
        "ns",
        ProviderId::Kubernetes,
        &["10.96.0.1"],
        &[("http", 80)],
    );
    let b = service(
        "b.ns.svc.cluster.local",
        "ns",
        ProviderId::Kubernetes,
        &["10.96.0.2"],
        &[("grpc", 90)],
    );
    let mut p = pod("p", "ns", "10.1.0.1", &[("http", 8080)]);
    let mut meta = (**p.workload.as_ref().unwrap()).clone();
    meta.ambient_redirected = true;
    meta.node_name = "n1".into();
    meta.owner = WorkloadOwner::Deployment;
    meta.workload_name = "dep".into();
    p.workload = Some(Arc::new(meta));
    p.service_account = Some("spiffe://cluster.local/ns/ns/sa/sa1".into());
    let q = pod("p", "ns", "10.1.0.1", &[("grpc", 9090)]).clone();
    let q = Endpoint {
        workload: p.workload.clone(),
        service_account: p.service_account.clone(),
        ..q
    };
    let model = model_of(vec![(a, vec![p]), (b, vec![q])], &[]);
    assert_eq!(model.workloads.len(), 1);
    let w = &model.workloads["cluster0//Pod/ns/p"];
    assert_eq!(w.tunnel_protocol, wl::TunnelProtocol::Hbone as i32);
    assert_eq!(
        (w.trust_domain.as_str(), w.service_account.as_str()),
        ("", "sa1")
    );
    assert_eq!(w.workload_type, wl::WorkloadType::Deployment as i32);
    assert_eq!(w.workload_name, "dep");
    assert_eq!(w.node, "n1");
    assert_eq!(
        w.services["ns/a.ns.svc.cluster.local"].ports[0].target_port,
        8080
    );
    assert_eq!(
        w.services["ns/b.ns.svc.cluster.local"].ports[0].target_port,
        9090
    );
    assert_eq!(model.services.len(), 2);
    assert_eq!(
        model.aliases["/10.1.0.1"],
        vec!["cluster0//Pod/ns/p".to_string()]
    );
    assert_eq!(
        model.aliases["/10.96.0.1"],
        vec!["ns/a.ns.svc.cluster.local".to_string()]
    );
}

#[test]
fn a_workload_on_a_network_with_a_gateway_names_it_and_waypoints_are_named() {
    let mut s = service(
        "a.ns.svc.cluster.local",
        "ns",
        ProviderId::Kubernetes,
        &["10.96.0.1"],
        &[("http", 80)],
    );
    s.labels.insert("istio.io/use-waypoint".into(), "wp".into());
    let wp = service(
        "wp.ns.svc.cluster.local",
        "ns",
        ProviderId::Kubernetes,
        &["10.96.0.9"],
        &[("mesh", 15008)],
    );
    let mut p = pod("p", "ns", "10.1.0.1", &[("http", 8080)]);
    p.network = "nw1".into();
    let mut meta = (**p.workload.as_ref().unwrap()).clone();
    meta.use_waypoint = "other".into();
    meta.use_waypoint_namespace = "wpns".into();
    p.workload = Some(Arc::new(meta));
    p.health = HealthStatus::Unhealthy;
    let gw = NetworkGateway {
        network: "nw1".into(),
        cluster: CLUSTER.into(),
        address: "192.0.2.1".parse().unwrap(),
        port: 15443,
        source: "test".into(),
    };
    let hostname = |name: &str, ns: &str| wl::GatewayAddress {
        destination: Some(wl::gateway_address::Destination::Hostname(
            wl::NamespacedHostname {
                namespace: ns.into(),
                hostname: format!("{name}.{ns}.svc.cluster.local"),
            },
        )),
        hbone_mtls_port: 15008,
    };
    let waypoints = Waypoints::of(
        [
            Waypoint {
                namespace: "wpns".into(),
                name: "other".into(),
                address: hostname("other", "wpns"),
                binding: None,
                traffic: Traffic::All,
                allowed: Allowed::All,
            },
            Waypoint {
                namespace: "ns".into(),
                name: "wp".into(),
                address: hostname("wp", "ns"),
                binding: None,
                traffic: Traffic::Service,
                allowed: Allowed::Same,
            },
        ],
        Default::default(),
    );
    let model = model_with_waypoints(vec![(s, vec![p]), (wp, vec![])], vec![], &[gw], &waypoints);
    let w = &model.workloads["cluster0//Pod/ns/p"];
    assert_eq!(w.network, "nw1");
    assert_eq!(w.status, wl::WorkloadStatus::Unhealthy as i32);
    let gw = w.network_gateway.as_ref().unwrap();
    assert_eq!(gw.hbone_mtls_port, 15008);
    assert!(matches!(
        &gw.destination,
        Some(wl::gateway_address::Destination::Address(a)) if a.address == vec![192, 0, 2, 1] && a.network == "nw1"
    ));
    // The waypoint of another namespace that admits all: its address.
    assert!(matches!(
        &w.waypoint.as_ref().unwrap().destination,
        Some(wl::gateway_address::Destination::Hostname(h)) if h.hostname == "other.wpns.svc.cluster.local"
    ));
    // A service waypoint of the service's namespace.
    let svc = &model.services["ns/a.ns.svc.cluster.local"];
    assert!(matches!(
        &svc.waypoint.as_ref().unwrap().destination,
        Some(wl::gateway_address::Destination::Hostname(h)) if h.hostname == "wp.ns.svc.cluster.local" && h.namespace == "ns"
    ));
}

#[test]
fn host_network_pods_are_host_network_workloads_and_bare_endpoints_are_not_workloads() {
    let s = service(
        "a.ns.svc.cluster.local",
        "ns",
        ProviderId::Kubernetes,
        &["10.96.0.1"],
        &[("http", 80)],
    );
    let mut host = pod("h", "ns", "10.0.0.5", &[("http", 8080)]);
    let mut meta = (**host.workload.as_ref().unwrap()).clone();
    meta.host_network = true;
    host.workload = Some(Arc::new(meta));
    let bare = Endpoint::new("10.1.0.9".parse::<IpAddr>().unwrap()).with_port("http", 8080);
    let model = model_of(vec![(s, vec![host, bare])], &[]);
    assert_eq!(model.workloads.len(), 1);
    assert_eq!(
        model.workloads["cluster0//Pod/ns/h"].network_mode,
        wl::NetworkMode::HostNetwork as i32
    );
    assert_eq!(model.services.len(), 1);
}

#[test]
fn subscriptions_select_by_name_and_alias() {
    let s = service(
        "a.ns.svc.cluster.local",
        "ns",
        ProviderId::Kubernetes,
        &["10.96.0.1"],
        &[("http", 80)],
    );
    let p = pod("p", "ns", "10.1.0.1", &[("http", 8080)]);
    let r = AddressResources::new(model_of(vec![(s, vec![p])], &[]));
    let none = BTreeSet::new();
    let all = r.select(Subscription {
        wildcard: true,
        names: &none,
        interned: None,
    });
    assert_eq!(all.len(), 2);
    let names: BTreeSet<String> = ["/10.1.0.1", "ns/a.ns.svc.cluster.local", "missing"]
        .map(String::from)
        .into();
    let some = r.select(Subscription {
        wildcard: false,
        names: &names,
        interned: None,
    });
    let got: Vec<&str> = some.iter().map(|r| &*r.name).collect();
    assert_eq!(got, vec!["/10.1.0.1", "ns/a.ns.svc.cluster.local"]);
    // The alias answer carries the workload.
    match decode_address(&some[0]).r#type {
        Some(wl::address::Type::Workload(w)) => assert_eq!(w.uid, "cluster0//Pod/ns/p"),
        other => panic!("{other:?}"),
    }
    // A wildcard subscription with an alias adds the alias answer only.
    let both = r.select(Subscription {
        wildcard: true,
        names: &names,
        interned: None,
    });
    assert_eq!(both.len(), 3);
}

#[test]
fn canonical_names_follow_istios_label_order() {
    let l = |pairs: &[(&str, &str)]| {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<std::collections::BTreeMap<_, _>>()
    };
    assert_eq!(
        build::canonical(&l(&[]), "w"),
        ("w".into(), "latest".into())
    );
    assert_eq!(
        build::canonical(&l(&[("app", "a"), ("version", "v1")]), "w"),
        ("a".into(), "v1".into())
    );
    assert_eq!(
        build::canonical(
            &l(&[
                ("app", "a"),
                ("app.kubernetes.io/name", "k"),
                ("service.istio.io/canonical-name", "c"),
                ("app.kubernetes.io/version", "kv"),
            ]),
            "w"
        ),
        ("c".into(), "kv".into())
    );
}

#[test]
fn internal_traffic_policy_local_keeps_to_the_node_over_traffic_distribution() {
    let mut s = service(
        "a.ns.svc.cluster.local",
        "ns",
        ProviderId::Kubernetes,
        &["10.96.0.1"],
        &[("http", 80)],
    );
    s.node_local = true;
    s.traffic_distribution = meshfed_registry::TrafficDistribution::PreferSameZone;
    s.publish_not_ready = true;
    let model = model_of(vec![(s, vec![])], &[]);
    assert_eq!(
        model.services["ns/a.ns.svc.cluster.local"].load_balancing,
        Some(wl::LoadBalancing {
            routing_preference: vec![wl::load_balancing::Scope::Node as i32],
            mode: wl::load_balancing::Mode::Strict as i32,
            health_policy: wl::load_balancing::HealthPolicy::AllowAll as i32,
        })
    );
}

#[test]
fn ingress_use_waypoint_is_listed_as_not_routed_by_gateways() {
    use super::tests_istio_world::World;
    let mut w = World::new();
    w.waypoint_at("10.0.0.1", "", "wp", "all", true)
        .service("wp", &[], &[80], &[("app", "waypoint")], "10.0.0.1")
        .service(
            "svc1",
            &[
                ("istio.io/use-waypoint", "wp"),
                ("istio.io/ingress-use-waypoint", "true"),
            ],
            &[80],
            &[("app", "a")],
            "10.0.0.2",
        )
        .service(
            "svc2",
            &[("istio.io/use-waypoint", "wp")],
            &[80],
            &[("app", "b")],
            "10.0.0.3",
        );
    let listed = |w: &World| {
        w.model()
            .ingress_use_waypoint_not_routed
            .into_iter()
            .collect::<Vec<_>>()
    };
    assert_eq!(
        listed(&w),
        vec![(
            "ns1/svc1.ns1.svc.company.com".to_string(),
            "ns1/wp".to_string()
        )]
    );
    // The namespace's label counts for services that do not set it.
    w.ns_label("ns1", &[("istio.io/ingress-use-waypoint", "true")]);
    assert_eq!(listed(&w).len(), 2);
}
