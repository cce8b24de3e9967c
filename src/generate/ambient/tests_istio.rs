//! Istio's vectors (`pilot/pkg/serviceregistry/kube/controller/ambient/`
//! `workloads_test.go` TestPodWorkloads and TestWorkloadEntryWorkloads,
//! `services_test.go` TestServiceEntryServices and TestServiceServices), each given
//! to meshfed as its registries would present the Istio input (a service with its
//! endpoints; every pod and WorkloadEntry also as a workload of its own). Each vector passes, or is
//! in [`KNOWN_GAPS`] with its reason, and the known-gaps test fails when a listed
//! vector starts passing.

use meshfed_registry::{Endpoint, HealthStatus, ProviderId, Resolution};

use super::tests::{CLUSTER, model_of, model_with, pod, service};
use super::*;

pub(super) type Vector = (&'static str, &'static str, fn() -> Result<(), String>);

pub(super) fn check<T: PartialEq + std::fmt::Debug>(
    what: &str,
    got: T,
    want: T,
) -> Result<(), String> {
    if got == want {
        Ok(())
    } else {
        Err(format!("{what}: got {got:?}, want {want:?}"))
    }
}

/// A pod workload as Istio's vectors expect it (no service, network unset).
fn expected_pod(status: wl::WorkloadStatus, canonical: &str) -> wl::Workload {
    wl::Workload {
        uid: format!("{CLUSTER}//Pod/ns/name"),
        name: "name".into(),
        namespace: "ns".into(),
        addresses: vec![vec![1, 2, 3, 4]],
        canonical_name: canonical.into(),
        canonical_revision: "latest".into(),
        workload_type: wl::WorkloadType::Pod as i32,
        workload_name: "name".into(),
        status: status as i32,
        cluster_id: CLUSTER.into(),
        ..Default::default()
    }
}

fn one_workload(model: &AmbientModel) -> Option<wl::Workload> {
    model.workloads.values().next().cloned()
}

fn hostname_service(ports: &[(&str, u16)]) -> meshfed_registry::Service {
    // Istio's vectors name the service host `hostname`.
    service("hostname", "ns", ProviderId::Kubernetes, &[], ports)
}

fn pod_app_foo(ports: &[(&str, u16)]) -> Endpoint {
    let mut p = pod("name", "ns", "1.2.3.4", ports);
    p.labels.insert("app".into(), "foo".into());
    p
}

fn with_services(mut w: wl::Workload, ports: &[(u32, u32)]) -> wl::Workload {
    w.services.insert(
        "ns/hostname".into(),
        wl::PortList {
            ports: ports
                .iter()
                .map(|(s, t)| wl::Port {
                    service_port: *s,
                    target_port: *t,
                })
                .collect(),
        },
    );
    w
}

const VECTORS: &[Vector] = &[
    (
        "workloads_test.go",
        "simple pod not running and not have podIP",
        || {
            // No IP: no endpoint, no workload.
            check("workload", one_workload(&model_of(vec![], &[])), None)
        },
    ),
    (
        "workloads_test.go",
        "simple pod not running but have podIP",
        || {
            // Pending, no Ready condition: the registry gives it unhealthy.
            let mut p = pod("name", "ns", "1.2.3.4", &[]);
            p.health = HealthStatus::Unhealthy;
            check(
                "workload",
                one_workload(&model_with(vec![], vec![p], &[])),
                Some(expected_pod(wl::WorkloadStatus::Unhealthy, "name")),
            )
        },
    ),
    ("workloads_test.go", "simple pod not ready", || {
        let mut p = pod("name", "ns", "1.2.3.4", &[]);
        p.health = HealthStatus::Unhealthy;
        check(
            "workload",
            one_workload(&model_with(vec![], vec![p], &[])),
            Some(expected_pod(wl::WorkloadStatus::Unhealthy, "name")),
        )
    }),
    ("workloads_test.go", "pod with service", || {
        let model = model_of(
            vec![(
                hostname_service(&[("http", 80)]),
                vec![pod_app_foo(&[("http", 8080)])],
            )],
            &[],
        );
        check(
            "workload",
            one_workload(&model),
            Some(with_services(
                expected_pod(wl::WorkloadStatus::Healthy, "foo"),
                &[(80, 8080)],
            )),
        )
    }),
    ("workloads_test.go", "pod with service named ports", || {
        // The registry resolves named target ports per pod; one not found in the
        // pod leaves the port out of the endpoint.
        let model = model_of(
            vec![(
                hostname_service(&[("80", 80), ("81", 81), ("82", 82)]),
                vec![pod_app_foo(&[("80", 8080), ("81", 9090)])],
            )],
            &[],
        );
        check(
            "workload",
            one_workload(&model),
            Some(with_services(
                expected_pod(wl::WorkloadStatus::Healthy, "foo"),
                &[(80, 8080), (81, 9090)],
            )),
        )
    }),
    ("workloads_test.go", "simple pod with locality", || {
        // The registry gives the pod its node's locality.
        let mut p = pod("name", "ns", "1.2.3.4", &[]);
        p.health = HealthStatus::Unhealthy;
        p.locality = meshfed_registry::Locality::parse("region/zone");
        check(
            "workload",
            one_workload(&model_with(vec![], vec![p], &[])).map(|w| w.locality),
            Some(Some(wl::Locality {
                region: "region".into(),
                zone: "zone".into(),
                subzone: String::new(),
            })),
        )
    }),
    ("workloads_test.go", "pod with authz", || {
        // Policies selecting `app: foo` in another namespace, the pod's and the root
        // namespace, and one selecting other labels in the pod's namespace.
        let selects =
            |app: &str| format!("selector:\n  matchLabels:\n    app: {app}\nrules:\n- {{}}\n");
        let (foo, not_foo) = (selects("foo"), selects("not-foo"));
        let aps = [
            ("not-ns", "wrong-ns", foo.as_str()),
            ("ns", "local-ns", foo.as_str()),
            ("ns", "local-ns-wrong-labels", not_foo.as_str()),
            ("istio-system", "root-ns", foo.as_str()),
        ];
        let policies = crate::generate::ambient_authz::AmbientPolicies::build(
            &crate::generate::ambient_authz::tests::index(&aps, &[]),
        );
        let p = pod_app_foo(&[]);
        let shard = meshfed_registry::ShardKey::new(ProviderId::Kubernetes, CLUSTER);
        let mut model = model_with(vec![], vec![p.clone()], &[]);
        build::attach_policies(&mut model, &[], &[(&shard, &p)], &policies);
        check(
            "authorization_policies",
            one_workload(&model).map(|w| w.authorization_policies),
            Some(vec!["istio-system/root-ns".into(), "ns/local-ns".into()]),
        )
    }),
    ("workloads_test.go", "we with service", || {
        let mut e = pod_app_foo(&[("http", 8080)]);
        let mut meta = (**e.workload.as_ref().unwrap()).clone();
        meta.kind = meshfed_registry::WorkloadKind::WorkloadEntry;
        meta.uid = format!("{CLUSTER}/networking.istio.io/WorkloadEntry/ns/name");
        e.workload = Some(std::sync::Arc::new(meta));
        let model = model_of(vec![(hostname_service(&[("http", 80)]), vec![e])], &[]);
        let mut want = with_services(
            expected_pod(wl::WorkloadStatus::Healthy, "foo"),
            &[(80, 8080)],
        );
        want.uid = format!("{CLUSTER}/networking.istio.io/WorkloadEntry/ns/name");
        check("workload", one_workload(&model), Some(want))
    }),
    (
        "services_test.go",
        "ServiceEntryServices/DNS service entry with address",
        || {
            let mut s = service(
                "a.example.com",
                "ns",
                ProviderId::External,
                &["1.2.3.4"],
                &[("http", 80)],
            );
            s.resolution = Resolution::DnsLb;
            s.service_accounts.insert("san1".into());
            s.object_name = "name".into();
            let model = model_of(vec![(s, vec![])], &[]);
            let svc = &model.services["ns/a.example.com"];
            check("name", svc.name.as_str(), "name")?;
            check(
                "ports",
                (svc.ports[0].service_port, svc.ports[0].target_port),
                (80, 80),
            )?;
            check(
                "sans",
                svc.subject_alt_names.clone(),
                vec!["san1".to_string()],
            )
        },
    ),
    (
        "services_test.go",
        "ServiceEntryServices/Uses auto-assigned addresses",
        || {
            let mut s = service(
                "assign-me.example.com",
                "ns",
                ProviderId::External,
                &[],
                &[("http", 80)],
            );
            s.resolution = Resolution::DnsLb;
            s.auto_allocated_ipv4 = Some("240.240.0.1".parse().unwrap());
            s.auto_allocated_ipv6 = Some("2001:2::1".parse().unwrap());
            let model = model_of(vec![(s, vec![])], &[]);
            let svc = &model.services["ns/assign-me.example.com"];
            let mut v6 = vec![0u8; 16];
            v6[..4].copy_from_slice(&[0x20, 0x01, 0, 2]);
            v6[15] = 1;
            check(
                "addresses",
                svc.addresses
                    .iter()
                    .map(|a| a.address.clone())
                    .collect::<Vec<_>>(),
                vec![vec![240, 240, 0, 1], v6],
            )?;
            check(
                "ports",
                (svc.ports[0].service_port, svc.ports[0].target_port),
                (80, 80),
            )
        },
    ),
    (
        "services_test.go",
        "ServiceEntryServices/Does not use auto-assigned addresses user provided address",
        || {
            let mut s = service(
                "user-provided.example.com",
                "ns",
                ProviderId::External,
                &["1.2.3.4"],
                &[("http", 80)],
            );
            s.resolution = Resolution::DnsLb;
            s.auto_allocated_ipv4 = Some("240.240.0.1".parse().unwrap());
            let model = model_of(vec![(s, vec![])], &[]);
            let svc = &model.services["ns/user-provided.example.com"];
            check(
                "addresses",
                svc.addresses
                    .iter()
                    .map(|a| a.address.clone())
                    .collect::<Vec<_>>(),
                vec![vec![1, 2, 3, 4]],
            )
        },
    ),
    (
        "services_test.go",
        "ServiceEntryServices/Does not use auto-assigned addresses none resolution",
        || {
            let mut s = service(
                "none-resolution.example.com",
                "ns",
                ProviderId::External,
                &[],
                &[("http", 80)],
            );
            s.resolution = Resolution::Passthrough;
            s.auto_allocated_ipv4 = Some("240.240.0.1".parse().unwrap());
            let model = model_of(vec![(s, vec![])], &[]);
            check(
                "addresses",
                model.services["ns/none-resolution.example.com"]
                    .addresses
                    .len(),
                0,
            )
        },
    ),
    ("services_test.go", "ServiceServices/simple", || {
        let s = service(
            "name.ns.svc.domain.suffix",
            "ns",
            ProviderId::Kubernetes,
            &["1.2.3.4"],
            &[("http", 80)],
        );
        let model = model_of(vec![(s, vec![])], &[]);
        let svc = &model.services["ns/name.ns.svc.domain.suffix"];
        check("name", svc.name.as_str(), "name")?;
        check("addresses", svc.addresses.len(), 1)?;
        check(
            "ports",
            (svc.ports[0].service_port, svc.ports[0].target_port),
            (80, 0),
        )
    }),
    ("services_test.go", "ServiceServices/target ports", || {
        // targetPort 81, and `something` (a name: 0).
        let mut s = service(
            "name.ns.svc.domain.suffix",
            "ns",
            ProviderId::Kubernetes,
            &["1.2.3.4"],
            &[("http", 80), ("http-alt", 8080)],
        );
        s.target_ports = [(80, 81), (8080, 0)].into();
        let model = model_of(vec![(s, vec![])], &[]);
        let svc = &model.services["ns/name.ns.svc.domain.suffix"];
        check(
            "ports",
            svc.ports
                .iter()
                .map(|p| (p.service_port, p.target_port))
                .collect::<Vec<_>>(),
            vec![(80, 81), (8080, 0)],
        )
    }),
    ("services_test.go", "ServiceServices/headless", || {
        let s = service(
            "name.ns.svc.domain.suffix",
            "ns",
            ProviderId::Kubernetes,
            &[],
            &[("http", 80)],
        );
        let model = model_of(vec![(s, vec![])], &[]);
        let svc = &model.services["ns/name.ns.svc.domain.suffix"];
        check("addresses", svc.addresses.len(), 0)?;
        check(
            "ports",
            (svc.ports[0].service_port, svc.ports[0].target_port),
            (80, 0),
        )
    }),
    (
        "services_test.go",
        "ServiceServices/traffic distribution prefer close",
        || traffic_distribution("PreferClose", PREFER_ZONE),
    ),
    (
        "services_test.go",
        "ServiceServices/traffic distribution prefer same zone",
        || traffic_distribution("PreferSameZone", PREFER_ZONE),
    ),
    (
        "services_test.go",
        "ServiceServices/traffic distribution prefer same node",
        || traffic_distribution("PreferSameNode", PREFER_NODE),
    ),
    ("networks_test.go", "LookupNetworkGatewayOrder", || {
        // Eight gateways of nw1: the one a workload names is the same every time,
        // the first in order.
        let gateways: Vec<meshfed_registry::NetworkGateway> = (0..8)
            .map(|i| meshfed_registry::NetworkGateway {
                network: "nw1".into(),
                cluster: CLUSTER.into(),
                address: format!("10.0.0.{i}").parse().unwrap(),
                port: 15443,
                source: format!("istio-system/gw{i}"),
            })
            .collect();
        let mut p = pod_app_foo(&[("http", 8080)]);
        p.network = "nw1".into();
        let first = one_workload(&model_of(
            vec![(hostname_service(&[("http", 80)]), vec![p.clone()])],
            &gateways,
        ))
        .and_then(|w| w.network_gateway);
        let want = wl::GatewayAddress {
            destination: Some(wl::gateway_address::Destination::Address(
                wl::NetworkAddress {
                    network: "nw1".into(),
                    address: vec![10, 0, 0, 0],
                },
            )),
            hbone_mtls_port: 15008,
        };
        check("first gateway", first.clone(), Some(want))?;
        for _ in 0..100 {
            let again = one_workload(&model_of(
                vec![(hostname_service(&[("http", 80)]), vec![p.clone()])],
                &gateways,
            ))
            .and_then(|w| w.network_gateway);
            check("same gateway", again, first.clone())?;
        }
        Ok(())
    }),
];

const PREFER_ZONE: &[wl::load_balancing::Scope] = &[
    wl::load_balancing::Scope::Network,
    wl::load_balancing::Scope::Region,
    wl::load_balancing::Scope::Zone,
];
const PREFER_NODE: &[wl::load_balancing::Scope] = &[
    wl::load_balancing::Scope::Network,
    wl::load_balancing::Scope::Region,
    wl::load_balancing::Scope::Zone,
    wl::load_balancing::Scope::Subzone,
    wl::load_balancing::Scope::Node,
];

/// `spec.trafficDistribution: <value>`: routing preferences `scopes`, failing over.
fn traffic_distribution(value: &str, scopes: &[wl::load_balancing::Scope]) -> Result<(), String> {
    let mut s = service(
        "name.ns.svc.domain.suffix",
        "ns",
        ProviderId::Kubernetes,
        &["1.2.3.4"],
        &[("http", 80)],
    );
    s.traffic_distribution = meshfed_registry::TrafficDistribution::parse(Some(value), None);
    let model = model_of(vec![(s, vec![])], &[]);
    check(
        "load_balancing",
        model.services["ns/name.ns.svc.domain.suffix"]
            .load_balancing
            .clone(),
        Some(wl::LoadBalancing {
            routing_preference: scopes.iter().map(|s| *s as i32).collect(),
            mode: wl::load_balancing::Mode::Failover as i32,
            health_policy: wl::load_balancing::HealthPolicy::OnlyHealthy as i32,
        }),
    )
}

/// Vectors meshfed does not pass, with the reason.
const KNOWN_GAPS: &[(&str, &str)] = &[];

#[test]
fn istio_ambient_vectors() {
    run(VECTORS, KNOWN_GAPS);
}

/// Runs `vectors`: each passes, or is listed in `gaps` and fails; a listed vector
/// that passes, or a gap naming no vector, fails the test.
pub(super) fn run(vectors: &[Vector], gaps: &[(&str, &str)]) {
    let mut failures = Vec::new();
    let mut passed = 0;
    for (file, name, run) in vectors {
        let result = run();
        // Shown with `--nocapture`: why each gap fails.
        println!("{file} {name}: {result:?}");
        let gap = gaps.iter().any(|(g, _)| g == name);
        match (result, gap) {
            (Ok(()), false) => passed += 1,
            (Err(_), true) => {}
            (Ok(()), true) => failures.push(format!(
                "{file} {name}: passes now; drop it from the known gaps"
            )),
            (Err(e), false) => failures.push(format!("{file} {name}: {e}")),
        }
    }
    for (g, _) in gaps {
        assert!(vectors.iter().any(|(_, n, _)| n == g), "unknown gap {g}");
    }
    assert!(failures.is_empty(), "{failures:#?}");
    assert_eq!(passed + gaps.len(), vectors.len());
}
