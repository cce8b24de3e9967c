//! Istio's ServiceEntry and WorkloadEntry vectors
//! (`pilot/pkg/serviceregistry/kube/controller/ambient/`
//! `ambientindex_serviceentry_test.go`, `ambientindex_workloadentry_test.go`) and
//! the cases of `workloads_test.go` (TestPodWorkloads, TestWorkloadEntryWorkloads,
//! TestServiceEntryWorkloads, TestEndpointSliceWorkloads) and `services_test.go`
//! (TestServiceEntryServices, TestServiceServices, TestServiceConditions) not in
//! `tests_istio`. Inputs are given as meshfed's registries present them. Each
//! vector passes or is in [`KNOWN_GAPS`] with its reason.

use std::collections::BTreeMap;
use std::sync::Arc;

use meshfed_api::workload as wl;
use meshfed_registry::{Endpoint, ProviderId, Resolution, WorkloadKind, WorkloadMeta};

use meshfed_registry::config::gateway_api::LabelSelector;

use super::tests::{CLUSTER as C0, model_of, model_with, model_with_waypoints, service};
use super::tests_istio::{Vector, check, run};
use super::tests_istio_world::*;
use super::waypoints::{Allowed, Traffic, Waypoint, Waypoints};

const SE_FILE: &str = "ambientindex_serviceentry_test.go";
const WE_FILE: &str = "ambientindex_workloadentry_test.go";
const WORKLOADS: &str = "workloads_test.go";
const SERVICES: &str = "services_test.go";

const HEALTHY: wl::WorkloadStatus = wl::WorkloadStatus::Healthy;

fn ports(key: &str, p: &[(u32, u32)]) -> BTreeMap<String, wl::PortList> {
    [(
        key.to_string(),
        wl::PortList {
            ports: p
                .iter()
                .map(|(s, t)| wl::Port {
                    service_port: *s,
                    target_port: *t,
                })
                .collect(),
        },
    )]
    .into()
}

/// A workload as Istio's vectors expect it: healthy, type POD, canonical revision
/// `latest`, on `testnetwork` in `cluster0`.
fn expected(uid: &str, name: &str, ns: &str, ip: &[u8], canonical: &str) -> wl::Workload {
    wl::Workload {
        uid: uid.into(),
        name: name.into(),
        namespace: ns.into(),
        addresses: if ip.is_empty() {
            Vec::new()
        } else {
            vec![ip.to_vec()]
        },
        network: NW.into(),
        canonical_name: canonical.into(),
        canonical_revision: "latest".into(),
        workload_type: wl::WorkloadType::Pod as i32,
        workload_name: name.into(),
        status: HEALTHY as i32,
        cluster_id: CLUSTER.into(),
        ..Default::default()
    }
}

/// An endpoint for a workload object of `kind` in namespace `ns`, as a registry
/// gives it (on `testnetwork`).
fn ep(kind: WorkloadKind, name: &str, ns: &str, ip: &str, ports: &[(&str, u16)]) -> Endpoint {
    let mut e = match ip.parse() {
        Ok(ip) => Endpoint::new(ip),
        Err(_) if ip.is_empty() => Endpoint::without_address(),
        Err(_) => Endpoint::for_hostname(ip),
    };
    for (n, p) in ports {
        e = e.with_port(n, *p);
    }
    e.cluster_id = C0.into();
    e.network = NW.into();
    let uid = match kind {
        WorkloadKind::Pod => format!("{C0}//Pod/{ns}/{name}"),
        WorkloadKind::WorkloadEntry => {
            format!("{C0}/networking.istio.io/WorkloadEntry/{ns}/{name}")
        }
        _ => format!("{C0}/networking.istio.io/ServiceEntry/{ns}/{name}/{ip}"),
    };
    e.workload = Some(Arc::new(WorkloadMeta {
        kind,
        name: name.into(),
        namespace: ns.into(),
        uid,
        workload_name: name.into(),
        ..WorkloadMeta::default()
    }));
    e
}

fn with_labels(mut e: Endpoint, l: &[(&str, &str)]) -> Endpoint {
    e.labels = labels(l);
    e
}

fn only_workload(m: &super::AmbientModel) -> Option<wl::Workload> {
    m.workloads.values().next().cloned()
}

/// The ServiceEntry world of `TestAmbientIndex_ServiceEntry` after the
/// ServiceEntry selecting `app: a` is added.
fn se_world() -> World {
    let mut w = World::new();
    w.we("140.140.0.10", "name0", "sa1", &[("app", "a")])
        .pod("140.140.0.10", "pod1", "sa1", &[("app", "a")])
        .pod("140.140.0.11", "pod2", "sa1", &[("app", "other")])
        .we("240.240.34.56", "name1", "sa1", &[("app", "a")])
        .we("240.240.34.57", "name2", "sa1", &[("app", "other")])
        .we("140.140.0.11", "name3", "sa1", &[("app", "other")])
        .service_entry(
            "mismatched.istio.io",
            &["240.240.23.45"],
            "name1",
            "mismatched-ns",
            &[("app", "a")],
            None,
        )
        .service_entry(
            "se.istio.io",
            &["240.240.23.45"],
            "name1",
            NS,
            &[("app", "a")],
            None,
        );
    w
}

/// `TestAmbientIndex_WorkloadEntries`: WorkloadEntries name1..3 and `svc1`.
fn we_world() -> World {
    let mut w = World::new();
    w.we("127.0.0.1", "name1", "sa1", &[("app", "a")])
        .we(
            "127.0.0.2",
            "name2",
            "sa2",
            &[("app", "a"), ("other", "label")],
        )
        .we("127.0.0.3", "name3", "sa3", &[("app", "other")])
        .service("svc1", &[], &[80], &[("app", "a")], "10.0.0.1");
    w
}

fn we_service_selection() -> Result<(), String> {
    let mut w = we_world();
    assert_workloads(&w, &addr("10.0.0.1"), HEALTHY, &["name1", "name2"])?;
    w.we("127.0.0.4", "name4", "sa4", &[("app", "a")]);
    assert_workloads(&w, &addr("10.0.0.1"), HEALTHY, &["name1", "name2", "name4"])?;
    w.delete(WorkloadKind::WorkloadEntry, "name4");
    assert_workloads(&w, &addr("10.0.0.1"), HEALTHY, &["name1", "name2"])?;
    assert_workloads(&w, &addr("127.0.0.4"), HEALTHY, &[])?;
    w.service(
        "svc1",
        &[],
        &[80],
        &[("app", "a"), ("other", "label")],
        "10.0.0.1",
    );
    assert_workloads(&w, &addr("10.0.0.1"), HEALTHY, &["name2"])?;
    w.we(
        "127.0.0.3",
        "name3",
        "sa3",
        &[("app", "a"), ("other", "label")],
    );
    assert_workloads(&w, &addr("10.0.0.1"), HEALTHY, &["name2", "name3"])?;
    w.we("127.0.0.3", "name3", "sa3", &[("app", "a")]);
    assert_workloads(&w, &addr("10.0.0.1"), HEALTHY, &["name2"])?;
    w.delete_service("svc1");
    assert_workloads(&w, &addr("10.0.0.1"), HEALTHY, &[])?;
    // The entries stay addresses without a service.
    assert_workloads(&w, "", HEALTHY, &["name1", "name2", "name3"])
}

fn we_waypoint() -> Result<(), String> {
    let mut w = we_world();
    w.waypoint("10.0.0.2", "waypoint-ns", "all", true)
        .ns_label(NS, &[("istio.io/use-waypoint", "waypoint-ns")]);
    check(
        "name1 waypoint",
        workload_waypoint(&w, &addr("127.0.0.1"))?,
        "waypoint-ns.ns1.svc.company.com".into(),
    )?;
    w.we("127.0.0.6", "name6", "sa6", &[("app", "a")]);
    check(
        "name6 waypoint",
        workload_waypoint(&w, &addr("127.0.0.6"))?,
        "waypoint-ns.ns1.svc.company.com".into(),
    )?;
    w.delete(WorkloadKind::WorkloadEntry, "name6")
        .delete_waypoint("waypoint-ns")
        .ns_label(NS, &[("istio.io/use-waypoint", "none")]);
    check(
        "opted out",
        workload_waypoint(&w, &addr("127.0.0.1"))?,
        String::new(),
    )?;
    Ok(())
}

fn we_policies() -> Result<(), String> {
    let mut w = we_world();
    let policies = |w: &World, ip: &str| {
        w.lookup(&addr(ip))
            .iter()
            .find_map(|f| f.workload().map(|w| w.authorization_policies.clone()))
            .unwrap_or_default()
    };
    w.policy("istio-system", "global", "{}")
        .policy("default", "namespace", "{}");
    check(
        "unselected",
        policies(&w, "127.0.0.1"),
        Vec::<String>::new(),
    )?;
    w.policy(NS, "selector", "selector:\n  matchLabels:\n    app: a");
    check(
        "selector",
        policies(&w, "127.0.0.1"),
        vec!["ns1/selector".into()],
    )?;
    w.policy(
        "istio-system",
        "global-selector",
        "selector:\n  matchLabels:\n    app: a",
    );
    check(
        "global selector",
        policies(&w, "127.0.0.1"),
        vec!["istio-system/global-selector".into(), "ns1/selector".into()],
    )?;
    w.policy(
        "istio-system",
        "global-selector",
        "selector:\n  matchLabels:\n    app: not-a",
    );
    check(
        "global selector elsewhere",
        policies(&w, "127.0.0.1"),
        vec!["ns1/selector".into()],
    )?;
    w.aps.retain(|(_, n, _)| n != "selector");
    check("deleted", policies(&w, "127.0.0.1"), Vec::<String>::new())
}

fn empty_address_entries() -> Result<(), String> {
    let mut w = World::new();
    w.we("", "emptyaddr1", "sa1", &[("app", "a")])
        .we("", "emptyaddr2", "sa1", &[("app", "a")]);
    assert_workloads(&w, "", HEALTHY, &["emptyaddr1", "emptyaddr2"])?;
    check(
        "by uid",
        names(&w.lookup(&we_uid("emptyaddr2"))),
        vec!["emptyaddr2".to_string()],
    )
}

fn update_existing_entry() -> Result<(), String> {
    let mut w = World::new();
    w.we("", "emptyaddr1", "sa1", &[("app", "a")]);
    assert_workloads(&w, "", HEALTHY, &["emptyaddr1"])?;
    w.we("", "emptyaddr1", "sa2", &[("app", "a")]);
    assert_workloads(&w, "", HEALTHY, &["emptyaddr1"])
}

fn inlined_entries() -> Result<(), String> {
    let mut w = World::new();
    w.service_entry(
        "se.istio.io",
        &["240.240.23.45"],
        "se1",
        NS,
        &[("app", "a")],
        Some(&["127.0.0.1", "127.0.0.2"]),
    );
    assert_workloads(&w, "", HEALTHY, &["se1"])?;
    let policies = |w: &World, ip: &str| {
        w.lookup(&se_uid("se1", ip))
            .first()
            .and_then(|f| f.workload().map(|w| w.authorization_policies.clone()))
    };
    w.policy(NS, "selector", "selector:\n  matchLabels:\n    app: a");
    for ip in ["127.0.0.1", "127.0.0.2"] {
        check(ip, policies(&w, ip), Some(vec!["ns1/selector".into()]))?;
    }
    w.aps.clear();
    for ip in ["127.0.0.1", "127.0.0.2"] {
        check(ip, policies(&w, ip), Some(Vec::new()))?;
    }
    w.delete_service_entry("se1", NS);
    assert_workloads(&w, "", HEALTHY, &[])
}

fn entries_not_selected_by_services() -> Result<(), String> {
    let mut w = we_world();
    w.services[0].selects_entries = false;
    w.pod("127.0.0.201", "pod1", "pod1", &[("app", "a")]);
    assert_workloads(&w, &addr("10.0.0.1"), HEALTHY, &["pod1"])?;
    assert_workloads(&w, "", HEALTHY, &["name1", "name2", "name3", "pod1"])
}

/// The endpoint meshfed's Kubernetes registry gives for an EndpointSlice endpoint
/// that names no pod: the slice is its object.
fn slice_endpoint(slice: &str, ns: &str, ip: &str, port: (&str, u16)) -> Endpoint {
    let mut e = Endpoint::new(ip.parse().unwrap()).with_port(port.0, port.1);
    e.cluster_id = C0.into();
    e.network = NW.into();
    e.workload = Some(Arc::new(WorkloadMeta {
        kind: WorkloadKind::EndpointSlice,
        name: slice.into(),
        namespace: ns.into(),
        uid: format!("{C0}/discovery.k8s.io/EndpointSlice/{ns}/{slice}/{ip}"),
        ..WorkloadMeta::default()
    }));
    e
}

/// An EndpointSlice workload as Istio's vectors expect it.
fn slice_workload(slice: &str, ip: &str, service: &str, port: (u32, u32)) -> wl::Workload {
    let ip: std::net::IpAddr = ip.parse().unwrap();
    wl::Workload {
        uid: format!("{C0}/discovery.k8s.io/EndpointSlice/default/{slice}/{ip}"),
        name: slice.into(),
        namespace: "default".into(),
        addresses: vec![super::ip_bytes(ip)],
        network: NW.into(),
        status: HEALTHY as i32,
        network_mode: wl::NetworkMode::HostNetwork as i32,
        cluster_id: C0.into(),
        services: ports(service, &[port]),
        ..Default::default()
    }
}

const VECTORS: &[Vector] = &[
    (SE_FILE, "ServiceEntry/inlined endpoint", || {
        let mut w = World::new();
        w.service_entry(
            "se.istio.io",
            &["240.240.23.45"],
            "name1",
            NS,
            &[],
            Some(&["127.0.0.1"]),
        );
        let mut want = expected(
            &se_uid("name1", "127.0.0.1"),
            "name1",
            NS,
            &[127, 0, 0, 1],
            "name1",
        );
        want.services = ports("ns1/se.istio.io", &[(80, 8081)]);
        check(
            "127.0.0.1",
            w.lookup(&addr("127.0.0.1")),
            vec![Found::W(want)],
        )?;
        w.delete_service_entry("name1", NS);
        check("deleted", w.lookup(&addr("127.0.0.1")), Vec::new())
    }),
    (
        SE_FILE,
        "ServiceEntry/workload selector picks pods and entries",
        || {
            let w = se_world();
            let mut name1 = expected(&we_uid("name1"), "name1", NS, &[240, 240, 34, 56], "a");
            name1.service_account = "sa1".into();
            name1.services = ports("ns1/se.istio.io", &[(80, 8080)]);
            check(
                "240.240.34.56",
                w.lookup(&addr("240.240.34.56")),
                vec![Found::W(name1)],
            )?;
            let mut pod1 = expected(&pod_uid("pod1"), "pod1", NS, &[140, 140, 0, 10], "a");
            pod1.service_account = "sa1".into();
            pod1.node = "node1".into();
            pod1.services = ports("ns1/se.istio.io", &[(80, 8080)]);
            check("pod1", w.lookup(&pod_uid("pod1")), vec![Found::W(pod1)])
        },
    ),
    (
        SE_FILE,
        "ServiceEntry/no selection across namespaces",
        || {
            let w = se_world();
            let m = w.model();
            check(
                "workloads of mismatched-ns/mismatched.istio.io",
                m.workloads
                    .values()
                    .filter(|w| w.services.contains_key("mismatched-ns/mismatched.istio.io"))
                    .count(),
                0,
            )
        },
    ),
    (
        SE_FILE,
        "ServiceEntry/entry sharing a pod's address is dropped",
        || {
            let w = se_world();
            check(
                "at 140.140.0.10",
                names(&w.lookup(&addr("140.140.0.10"))),
                vec!["pod1".to_string()],
            )
        },
    ),
    (SE_FILE, "ServiceEntry/unselected workloads stay", || {
        let mut w = se_world();
        assert_workloads(&w, "", HEALTHY, &["pod1", "pod2", "name1", "name2"])?;
        w.delete_service_entry("name1", NS);
        assert_workloads(&w, "", HEALTHY, &["pod1", "pod2", "name1", "name2"])
    }),
    (
        SE_FILE,
        "ServiceEntry_DisableK8SServiceSelectWorkloadEntries",
        || {
            let mut w = World::new();
            w.pod("140.140.0.10", "pod1", "sa1", &[("app", "a")])
                .pod("140.140.0.11", "pod2", "sa1", &[("app", "other")])
                .we("240.240.34.56", "name1", "sa1", &[("app", "a")])
                .we("240.240.34.57", "name2", "sa1", &[("app", "other")])
                .service_entry(
                    "se.istio.io",
                    &["240.240.23.45"],
                    "name1",
                    NS,
                    &[("app", "a")],
                    None,
                );
            assert_workloads(&w, &addr("240.240.23.45"), HEALTHY, &["pod1", "name1"])
        },
    ),
    (
        WE_FILE,
        "WorkloadEntries/base: service selection",
        we_service_selection,
    ),
    (
        WE_FILE,
        "WorkloadEntries/multicluster (enabled but unused): service selection",
        we_service_selection,
    ),
    (WE_FILE, "WorkloadEntries/base: waypoint", we_waypoint),
    (
        WE_FILE,
        "WorkloadEntries/multicluster (enabled but unused): waypoint",
        we_waypoint,
    ),
    (WE_FILE, "WorkloadEntries/base: policies", we_policies),
    (
        WE_FILE,
        "WorkloadEntries/multicluster (enabled but unused): policies",
        we_policies,
    ),
    (
        WE_FILE,
        "EmptyAddrWorkloadEntries/base",
        empty_address_entries,
    ),
    (
        WE_FILE,
        "EmptyAddrWorkloadEntries/multicluster (enabled but unused)",
        empty_address_entries,
    ),
    (
        WE_FILE,
        "UpdateExistingWorkloadEntry/base",
        update_existing_entry,
    ),
    (
        WE_FILE,
        "UpdateExistingWorkloadEntry/multicluster (enabled but unused)",
        update_existing_entry,
    ),
    (WE_FILE, "InlinedWorkloadEntries/base", inlined_entries),
    (
        WE_FILE,
        "InlinedWorkloadEntries/multicluster (enabled but unused)",
        inlined_entries,
    ),
    (
        WE_FILE,
        "WorkloadEntries_DisableK8SServiceSelectWorkloadEntries/base",
        entries_not_selected_by_services,
    ),
    (
        WE_FILE,
        "WorkloadEntries_DisableK8SServiceSelectWorkloadEntries/multicluster (enabled but unused)",
        entries_not_selected_by_services,
    ),
    (WORKLOADS, "PodWorkloads/pod from replicaset", || {
        // Running, not ready; controlled by ReplicaSet `rs` (no pod-template-hash):
        // the registry names the workload after its controller. No service selects it.
        let mut p = ep(WorkloadKind::Pod, "rs-xvnqd", "ns", "1.2.3.4", &[]);
        let mut meta = (**p.workload.as_ref().unwrap()).clone();
        meta.workload_name = "rs".into();
        p.workload = Some(Arc::new(meta));
        p.health = meshfed_registry::HealthStatus::Unhealthy;
        let mut want = expected(
            "cluster0//Pod/ns/rs-xvnqd",
            "rs-xvnqd",
            "ns",
            &[1, 2, 3, 4],
            "rs",
        );
        want.workload_name = "rs".into();
        want.status = wl::WorkloadStatus::Unhealthy as i32;
        check(
            "workload",
            only_workload(&model_with(vec![], vec![p], &[])),
            Some(want),
        )
    }),
    (
        WORKLOADS,
        "PodWorkloads/pod selected by ServiceEntry honors port name mapping",
        || {
            let s = service(
                "httpbin.httpbin2.mesh.internal",
                "httpbin2",
                ProviderId::External,
                &[],
                &[("http", 8002)],
            );
            let p = with_labels(
                ep(
                    WorkloadKind::Pod,
                    "httpbin-123",
                    "httpbin2",
                    "10.1.1.1",
                    &[("http", 8000)],
                ),
                &[("app", "httpbin")],
            );
            let mut want = expected(
                "cluster0//Pod/httpbin2/httpbin-123",
                "httpbin-123",
                "httpbin2",
                &[10, 1, 1, 1],
                "httpbin",
            );
            want.services = ports("httpbin2/httpbin.httpbin2.mesh.internal", &[(8002, 8000)]);
            check(
                "workload",
                only_workload(&model_of(vec![(s, vec![p])], &[])),
                Some(want),
            )
        },
    ),
    (WORKLOADS, "PodWorkloads/pod with waypoint", || {
        // `istio.io/use-waypoint: waypoint`, a waypoint for all traffic at
        // `hostname.example`; no service selects the pod.
        let mut p = with_labels(
            ep(WorkloadKind::Pod, "name", "ns", "1.2.3.4", &[]),
            &[("app", "foo"), ("istio.io/use-waypoint", "waypoint")],
        );
        let mut meta = (**p.workload.as_ref().unwrap()).clone();
        meta.use_waypoint = "waypoint".into();
        p.workload = Some(Arc::new(meta));
        let mut want = expected("cluster0//Pod/ns/name", "name", "ns", &[1, 2, 3, 4], "foo");
        want.waypoint = Some(waypoint_addr("hostname.example", 15008));
        let waypoints = waypoints(waypoint_all("hostname.example", 15008, None));
        check(
            "workload",
            only_workload(&model_with_waypoints(vec![], vec![p], &[], &waypoints)),
            Some(want),
        )
    }),
    (WORKLOADS, "PodWorkloads/pod that is a waypoint", || {
        // The waypoint's own pod: no waypoint of its own.
        let p = with_labels(
            ep(WorkloadKind::Pod, "waypoint", "ns", "1.2.3.4", &[]),
            &[("gateway.networking.k8s.io/gateway-name", "waypoint")],
        );
        let waypoints = waypoints(waypoint_all("hostname.example", 15008, None));
        check(
            "workload",
            only_workload(&model_with_waypoints(vec![], vec![p], &[], &waypoints)),
            Some(expected(
                "cluster0//Pod/ns/waypoint",
                "waypoint",
                "ns",
                &[1, 2, 3, 4],
                "waypoint",
            )),
        )
    }),
    (
        WORKLOADS,
        "PodWorkloads/pod as part of selectorless service",
        || {
            // The EndpointSlice's targetRef names the pod.
            let s = service(
                "svc.default.svc.domain.suffix",
                "default",
                ProviderId::Kubernetes,
                &[],
                &[("80", 80)],
            );
            let p = with_labels(
                ep(
                    WorkloadKind::Pod,
                    "pod-123",
                    "default",
                    "1.2.3.4",
                    &[("80", 80)],
                ),
                &[("app", "foo")],
            );
            let mut want = expected(
                "cluster0//Pod/default/pod-123",
                "pod-123",
                "default",
                &[1, 2, 3, 4],
                "foo",
            );
            want.services = ports("default/svc.default.svc.domain.suffix", &[(80, 80)]);
            check(
                "workload",
                only_workload(&model_of(vec![(s, vec![p])], &[])),
                Some(want),
            )
        },
    ),
    (
        WORKLOADS,
        "PodWorkloads/pod as part of selectorless service without targetRef",
        || {
            // The slice's endpoint names no pod: the pod does not back the service
            // (the endpoint is an EndpointSlice workload of its own).
            let s = service(
                "svc.default.svc.domain.suffix",
                "default",
                ProviderId::Kubernetes,
                &[],
                &[("80", 80)],
            );
            let p = with_labels(
                ep(WorkloadKind::Pod, "pod-123", "default", "1.2.3.4", &[]),
                &[("app", "foo")],
            );
            // The registry joins the slice's endpoint to the pod at its IP for its
            // labels, but the object behind it is the slice.
            let mut by_ip = slice_endpoint("svc-123", "default", "1.2.3.4", ("80", 80));
            by_ip.labels = p.labels.clone();
            let m = model_with(vec![(s, vec![by_ip])], vec![p], &[]);
            check(
                "pod-123",
                m.workloads
                    .get("cluster0//Pod/default/pod-123")
                    .map(|w| w.services.is_empty()),
                Some(true),
            )
        },
    ),
    (WORKLOADS, "PodWorkloads/host network pod", || {
        let s = service(
            "svc.default.svc.domain.suffix",
            "default",
            ProviderId::Kubernetes,
            &[],
            &[("80", 80)],
        );
        let mut p = with_labels(
            ep(
                WorkloadKind::Pod,
                "pod-123",
                "default",
                "1.1.1.1",
                &[("80", 80)],
            ),
            &[("app", "foo")],
        );
        let mut meta = (**p.workload.as_ref().unwrap()).clone();
        meta.host_network = true;
        p.workload = Some(Arc::new(meta));
        let mut want = expected(
            "cluster0//Pod/default/pod-123",
            "pod-123",
            "default",
            &[1, 1, 1, 1],
            "foo",
        );
        want.network_mode = wl::NetworkMode::HostNetwork as i32;
        want.services = ports("default/svc.default.svc.domain.suffix", &[(80, 80)]);
        check(
            "workload",
            only_workload(&model_of(vec![(s, vec![p])], &[])),
            Some(want),
        )
    }),
    (
        WORKLOADS,
        "WorkloadEntryWorkloads/we without labels",
        || {
            // The service selects `app: foo`; the entry has no labels: a workload of
            // its own, backing no service.
            let s = service(
                "hostname",
                "ns",
                ProviderId::Kubernetes,
                &[],
                &[("http", 80)],
            );
            let e = ep(WorkloadKind::WorkloadEntry, "name", "ns", "1.2.3.4", &[]);
            check(
                "workload",
                only_workload(&model_with(vec![(s, vec![])], vec![e], &[])),
                Some(expected(
                    "cluster0/networking.istio.io/WorkloadEntry/ns/name",
                    "name",
                    "ns",
                    &[1, 2, 3, 4],
                    "name",
                )),
            )
        },
    ),
    (WORKLOADS, "WorkloadEntryWorkloads/we spec labels", || {
        let s = service(
            "hostname",
            "ns",
            ProviderId::Kubernetes,
            &[],
            &[("http", 80)],
        );
        let e = with_labels(
            ep(
                WorkloadKind::WorkloadEntry,
                "name",
                "ns",
                "1.2.3.4",
                &[("http", 8080)],
            ),
            &[("app", "foo")],
        );
        let mut want = expected(
            "cluster0/networking.istio.io/WorkloadEntry/ns/name",
            "name",
            "ns",
            &[1, 2, 3, 4],
            "foo",
        );
        want.services = ports("ns/hostname", &[(80, 8080)]);
        check(
            "workload",
            only_workload(&model_of(vec![(s, vec![e])], &[])),
            Some(want),
        )
    }),
    (
        WORKLOADS,
        "WorkloadEntryWorkloads/pod with service named ports",
        || {
            // Port 80 targets 8080; "81" is in the entry's ports (8180); 82 targets the
            // entry's "82-target" (8280); 83's target name is not in the entry.
            let s = service(
                "hostname",
                "ns",
                ProviderId::Kubernetes,
                &[],
                &[("80", 80), ("81", 81), ("82", 82), ("83", 83)],
            );
            let e = with_labels(
                ep(
                    WorkloadKind::WorkloadEntry,
                    "name",
                    "ns",
                    "1.2.3.4",
                    &[("80", 8080), ("81", 8180), ("82", 8280)],
                ),
                &[("app", "foo")],
            );
            let mut want = expected(
                "cluster0/networking.istio.io/WorkloadEntry/ns/name",
                "name",
                "ns",
                &[1, 2, 3, 4],
                "foo",
            );
            want.services = ports("ns/hostname", &[(80, 8080), (81, 8180), (82, 8280)]);
            check(
                "workload",
                only_workload(&model_of(vec![(s, vec![e])], &[])),
                Some(want),
            )
        },
    ),
    (
        WORKLOADS,
        "WorkloadEntryWorkloads/pod with serviceentry named ports",
        || {
            // A ServiceEntry port the entry does not name targets the port itself.
            let s = service(
                "hostname",
                "ns",
                ProviderId::External,
                &[],
                &[("80", 80), ("81", 81), ("82", 82)],
            );
            let e = with_labels(
                ep(
                    WorkloadKind::WorkloadEntry,
                    "name",
                    "ns",
                    "1.2.3.4",
                    &[("80", 8080), ("81", 8180), ("82", 82)],
                ),
                &[("app", "foo")],
            );
            let mut want = expected(
                "cluster0/networking.istio.io/WorkloadEntry/ns/name",
                "name",
                "ns",
                &[1, 2, 3, 4],
                "foo",
            );
            want.services = ports("ns/hostname", &[(80, 8080), (81, 8180), (82, 82)]);
            check(
                "workload",
                only_workload(&model_of(vec![(s, vec![e])], &[])),
                Some(want),
            )
        },
    ),
    (
        WORKLOADS,
        "WorkloadEntryWorkloads/host pod with ServiceEntry workloadSelector",
        || {
            let s = service(
                "hostname",
                "ns",
                ProviderId::External,
                &[],
                &[("80", 80), ("81", 81), ("82", 82)],
            );
            let e = with_labels(
                ep(
                    WorkloadKind::WorkloadEntry,
                    "name",
                    "ns",
                    "hostname",
                    &[("80", 8080), ("81", 8180), ("82", 82)],
                ),
                &[("app", "foo")],
            );
            let mut want = expected(
                "cluster0/networking.istio.io/WorkloadEntry/ns/name",
                "name",
                "ns",
                &[],
                "foo",
            );
            want.hostname = "hostname".into();
            want.services = ports("ns/hostname", &[(80, 8080), (81, 8180), (82, 82)]);
            check(
                "workload",
                only_workload(&model_of(vec![(s, vec![e])], &[])),
                Some(want),
            )
        },
    ),
    (WORKLOADS, "WorkloadEntryWorkloads/cross network we", || {
        // No address, network `remote-network`, whose gateway is 9.9.9.9.
        let mut e = Endpoint::without_address().with_port("80", 80);
        let plain = ep(WorkloadKind::WorkloadEntry, "name", "ns", "1.2.3.4", &[]);
        e.cluster_id = C0.into();
        e.network = "remote-network".into();
        e.workload = plain.workload;
        let gateway = meshfed_registry::NetworkGateway {
            network: "remote-network".into(),
            cluster: C0.into(),
            address: "9.9.9.9".parse().unwrap(),
            port: 15443,
            source: "test".into(),
        };
        let mut want = expected(
            "cluster0/networking.istio.io/WorkloadEntry/ns/name",
            "name",
            "ns",
            &[],
            "name",
        );
        want.network = "remote-network".into();
        want.network_gateway = Some(wl::GatewayAddress {
            destination: Some(wl::gateway_address::Destination::Address(
                wl::NetworkAddress {
                    network: "remote-network".into(),
                    address: vec![9, 9, 9, 9],
                },
            )),
            hbone_mtls_port: 15008,
        });
        check(
            "workload",
            only_workload(&model_with(vec![], vec![e], &[gateway])),
            Some(want),
        )
    }),
    (
        WORKLOADS,
        "WorkloadEntryWorkloads/cross network we hostname gateway",
        || {
            // The network's gateway is the `istio-remote` Gateway
            // `ns-gtw/remote-network-hostname`, reporting a host name.
            let mut e = Endpoint::without_address().with_port("80", 80);
            let plain = ep(WorkloadKind::WorkloadEntry, "name", "ns", "1.2.3.4", &[]);
            e.cluster_id = C0.into();
            e.network = "remote-network-hostname".into();
            e.workload = plain.workload;
            let spec: meshfed_registry::config::gateway_api::GatewaySpec =
                serde_json::from_value(serde_json::json!({
                    "gatewayClassName": "istio-remote",
                    "listeners": [{"name": "cross-network", "port": 15008, "protocol": "HBONE"}],
                }))
                .unwrap();
            let mut gw = meshfed_registry::config::ConfigObject::new(
                "ns-gtw",
                "remote-network-hostname",
                spec,
            );
            gw.labels = [(
                "topology.istio.io/network".to_string(),
                "remote-network-hostname".to_string(),
            )]
            .into();
            gw.status_addresses
                .push(meshfed_registry::config::StatusAddress {
                    kind: "Hostname".into(),
                    value: "networkgateway.example.com".into(),
                });
            let waypoints = Waypoints::read(
                &[Arc::new(gw)],
                super::waypoints::WaypointInputs {
                    domain: "domain.suffix",
                    service_exists: &|_| false,
                    network_of: &|_| String::new(),
                    namespaces: Default::default(),
                },
            );
            check(
                "network_gateway",
                only_workload(&model_with_waypoints(vec![], vec![e], &[], &waypoints))
                    .and_then(|w| w.network_gateway),
                Some(wl::GatewayAddress {
                    destination: Some(wl::gateway_address::Destination::Hostname(
                        wl::NamespacedHostname {
                            namespace: "ns-gtw".into(),
                            hostname: "networkgateway.example.com".into(),
                        },
                    )),
                    hbone_mtls_port: 15008,
                }),
            )
        },
    ),
    (WORKLOADS, "WorkloadEntryWorkloads/waypoint binding", || {
        // The entry is an instance of waypoint `waypoint`, whose class binds inbound
        // traffic as PROXY on 15088.
        let e = with_labels(
            ep(WorkloadKind::WorkloadEntry, "name", "ns", "", &[]),
            &[("gateway.networking.k8s.io/gateway-name", "waypoint")],
        );
        let waypoints = waypoints(waypoint_all(
            "waypoint.example.com",
            0,
            Some(wl::ApplicationTunnel {
                protocol: wl::application_tunnel::Protocol::Proxy as i32,
                port: 15088,
            }),
        ));
        check(
            "application_tunnel",
            only_workload(&model_with_waypoints(vec![], vec![e], &[], &waypoints))
                .and_then(|w| w.application_tunnel),
            Some(wl::ApplicationTunnel {
                protocol: wl::application_tunnel::Protocol::Proxy as i32,
                port: 15088,
            }),
        )
    }),
    (
        WORKLOADS,
        "ServiceEntryWorkloads/dns without endpoints",
        || {
            // One endpoint per host, resolved by DNS.
            let mut inputs = Vec::new();
            for host in ["a.example.com", "b.example.com"] {
                let mut s = service(
                    host,
                    "ns",
                    ProviderId::External,
                    &["1.2.3.4"],
                    &[("http", 80)],
                );
                s.resolution = Resolution::DnsLb;
                let e = ep(
                    WorkloadKind::ServiceEntry,
                    "name",
                    "ns",
                    host,
                    &[("http", 80)],
                );
                inputs.push((s, vec![e]));
            }
            let m = model_of(inputs, &[]);
            let got: Vec<wl::Workload> = m.workloads.values().cloned().collect();
            let want: Vec<wl::Workload> = ["a.example.com", "b.example.com"]
                .iter()
                .map(|h| {
                    let mut w = expected(
                        &format!("cluster0/networking.istio.io/ServiceEntry/ns/name/{h}"),
                        "name",
                        "ns",
                        &[],
                        "name",
                    );
                    w.hostname = h.to_string();
                    w.services = ports(&format!("ns/{h}"), &[(80, 80)]);
                    w
                })
                .collect();
            check("workloads", got, want)
        },
    ),
    (WORKLOADS, "ServiceEntryWorkloads/static", || {
        let s = service(
            "a.example.com",
            "ns",
            ProviderId::External,
            &["1.2.3.4"],
            &[("http", 80)],
        );
        let a = ep(
            WorkloadKind::ServiceEntry,
            "name",
            "ns",
            "2.3.4.5",
            &[("http", 80)],
        );
        let mut b = ep(
            WorkloadKind::ServiceEntry,
            "name",
            "ns",
            "3.4.5.6",
            &[("http", 80)],
        );
        let mut meta = (**b.workload.as_ref().unwrap()).clone();
        meta.use_waypoint = "waypoint".into();
        b.workload = Some(Arc::new(meta));
        let waypoints = waypoints(waypoint_all("waypoint.example.com", 0, None));
        let m = model_with_waypoints(vec![(s, vec![a, b])], vec![], &[], &waypoints);
        check(
            "waypoint",
            m.workloads
                .get("cluster0/networking.istio.io/ServiceEntry/ns/name/3.4.5.6")
                .and_then(|w| w.waypoint.clone()),
            Some(wl::GatewayAddress {
                destination: Some(wl::gateway_address::Destination::Hostname(
                    wl::NamespacedHostname {
                        namespace: "ns".into(),
                        hostname: "waypoint.example.com".into(),
                    },
                )),
                hbone_mtls_port: 0,
            }),
        )
    }),
    (WORKLOADS, "EndpointSliceWorkloads/api server", || {
        let s = service(
            "kubernetes.default.svc.domain.suffix",
            "default",
            ProviderId::Kubernetes,
            &["1.2.3.4"],
            &[("https", 443)],
        );
        let e = slice_endpoint("kubernetes", "default", "172.18.0.5", ("https", 6443));
        let m = model_of(vec![(s, vec![e])], &[]);
        check(
            "workload",
            only_workload(&m),
            Some(slice_workload(
                "kubernetes",
                "172.18.0.5",
                "default/kubernetes.default.svc.domain.suffix",
                (443, 6443),
            )),
        )
    }),
    (
        WORKLOADS,
        "EndpointSliceWorkloads/pod as part of selectorless service without targetRef",
        || {
            let s = service(
                "svc.default.svc.domain.suffix",
                "default",
                ProviderId::Kubernetes,
                &[],
                &[("http", 80)],
            );
            let e = slice_endpoint("svc-123", "default", "1.2.3.4", ("http", 80));
            let m = model_of(vec![(s, vec![e])], &[]);
            check(
                "workload",
                only_workload(&m),
                Some(slice_workload(
                    "svc-123",
                    "1.2.3.4",
                    "default/svc.default.svc.domain.suffix",
                    (80, 80),
                )),
            )
        },
    ),
    (
        SERVICES,
        "ServiceEntryServices/Uses multiple auto-assigned addresses",
        || {
            let mut inputs = Vec::new();
            for (host, v4, v6) in [
                (
                    "multi-host-assign-me.example.com",
                    "240.240.0.1",
                    "2001:2::1",
                ),
                (
                    "second-host-assign-me.example.com",
                    "240.240.0.2",
                    "2001:2::2",
                ),
            ] {
                let mut s = service(host, "ns", ProviderId::External, &[], &[("http", 80)]);
                s.object_name = "multi-host-auto-assigned".into();
                s.resolution = Resolution::DnsLb;
                s.auto_allocated_ipv4 = Some(v4.parse().unwrap());
                s.auto_allocated_ipv6 = Some(v6.parse().unwrap());
                inputs.push((s, vec![]));
            }
            let m = model_of(inputs, &[]);
            let svc = &m.services["ns/second-host-assign-me.example.com"];
            check("addresses", svc.addresses.len(), 2)?;
            check(
                "address",
                svc.addresses[0].address.clone(),
                vec![240, 240, 0, 2],
            )?;
            check("name", svc.name.as_str(), "multi-host-auto-assigned")
        },
    ),
    (
        SERVICES,
        "ServiceEntryServices/Does not use auto-assigned addresses user opted out",
        || {
            // `networking.istio.io/enable-autoallocate-ip: "false"`: the registry
            // allocates nothing.
            let mut s = service(
                "user-opt-out.example.com",
                "ns",
                ProviderId::External,
                &[],
                &[("http", 80)],
            );
            s.resolution = Resolution::DnsLb;
            let m = model_of(vec![(s, vec![])], &[]);
            let svc = &m.services["ns/user-opt-out.example.com"];
            check("addresses", svc.addresses.len(), 0)?;
            check(
                "ports",
                (svc.ports[0].service_port, svc.ports[0].target_port),
                (80, 80),
            )
        },
    ),
    (
        SERVICES,
        "ServiceEntryServices/Does not use auto-assigned addresses for wildcard host",
        || {
            let mut wild = service(
                "*.wildcard.example.com",
                "ns",
                ProviderId::External,
                &[],
                &[("http", 80)],
            );
            wild.resolution = Resolution::DnsLb;
            let mut ok = service(
                "this-is-ok.example.com",
                "ns",
                ProviderId::External,
                &[],
                &[("http", 80)],
            );
            ok.resolution = Resolution::DnsLb;
            ok.auto_allocated_ipv4 = Some("240.240.0.1".parse().unwrap());
            ok.auto_allocated_ipv6 = Some("2001:2::1".parse().unwrap());
            let m = model_of(vec![(wild, vec![]), (ok, vec![])], &[]);
            check(
                "wildcard",
                m.services["ns/*.wildcard.example.com"].addresses.len(),
                0,
            )?;
            check(
                "this-is-ok",
                m.services["ns/this-is-ok.example.com"].addresses.len(),
                2,
            )
        },
    ),
    (SERVICES, "ServiceServices/external name", || {
        let mut s = service(
            "name.ns.svc.domain.suffix",
            "ns",
            ProviderId::Kubernetes,
            &[],
            &[],
        );
        s.resolution = Resolution::Alias;
        s.alias_for = Some("example.com".into());
        check(
            "services",
            model_of(vec![(s, vec![])], &[]).services.len(),
            0,
        )
    }),
    (SERVICES, "ServiceServices/publishNotReadyAddresses", || {
        let mut s = service(
            "name.ns.svc.domain.suffix",
            "ns",
            ProviderId::Kubernetes,
            &["1.2.3.4"],
            &[("http", 80)],
        );
        s.publish_not_ready = true;
        let m = model_of(vec![(s, vec![])], &[]);
        check(
            "load_balancing",
            m.services["ns/name.ns.svc.domain.suffix"]
                .load_balancing
                .clone(),
            Some(wl::LoadBalancing {
                health_policy: wl::load_balancing::HealthPolicy::AllowAll as i32,
                ..Default::default()
            }),
        )
    }),
    (SERVICES, "ServiceServices/cross namespace waypoint", || {
        let mut s = service(
            "name.ns.svc.domain.suffix",
            "ns",
            ProviderId::Kubernetes,
            &["1.2.3.4"],
            &[("http", 80)],
        );
        s.labels = labels(&[
            ("istio.io/use-waypoint", "waypoint"),
            ("istio.io/use-waypoint-namespace", "waypoint-ns"),
        ]);
        let m = model_with_waypoints(vec![(s, vec![])], vec![], &[], &cross_namespace("ns"));
        check(
            "waypoint",
            m.services["ns/name.ns.svc.domain.suffix"].waypoint.clone(),
            Some(waypoint_addr("hostname.example", 15008)),
        )
    }),
    (
        SERVICES,
        "ServiceServices/cross namespace waypoint denied",
        || {
            let mut s = service(
                "name.ns.svc.domain.suffix",
                "ns",
                ProviderId::Kubernetes,
                &["1.2.3.4"],
                &[("http", 80)],
            );
            s.labels = labels(&[
                ("istio.io/use-waypoint", "waypoint"),
                ("istio.io/use-waypoint-namespace", "waypoint-ns"),
            ]);
            let m =
                model_with_waypoints(vec![(s, vec![])], vec![], &[], &cross_namespace("not-ns"));
            check(
                "waypoint",
                waypoint_host(m.services["ns/name.ns.svc.domain.suffix"].waypoint.as_ref()),
                String::new(),
            )
        },
    ),
    (
        SERVICES,
        "ServiceConditions/service bound to waypoint",
        || service_condition(None, ""),
    ),
    (
        SERVICES,
        "ServiceConditions/service bound to waypoint and using waypoint for ingress",
        || service_condition(Some("true"), ". Ingress traffic will traverse the waypoint"),
    ),
    (
        SERVICES,
        "ServiceConditions/service bound to waypoint and ingress label is malformed",
        || {
            service_condition(
                Some("eurt"),
                ". Ingress traffic is not using the waypoint, set the istio.io/ingress-use-waypoint label to true if desired.",
            )
        },
    ),
];

/// `TestServiceConditions`: service `ns/name` bound to the cross-namespace
/// waypoint, `istio.io/ingress-use-waypoint` as given; the condition's message ends
/// with `suffix`.
fn service_condition(ingress: Option<&str>, suffix: &str) -> Result<(), String> {
    let mut s = service(
        "name.ns.svc.domain.suffix",
        "ns",
        ProviderId::Kubernetes,
        &["1.2.3.4"],
        &[("http", 80)],
    );
    s.labels = labels(&[
        ("istio.io/use-waypoint", "waypoint"),
        ("istio.io/use-waypoint-namespace", "waypoint-ns"),
    ]);
    if let Some(v) = ingress {
        s.labels
            .insert("istio.io/ingress-use-waypoint".into(), v.into());
    }
    let m = model_with_waypoints(vec![(s, vec![])], vec![], &[], &cross_namespace("ns"));
    check(
        "WaypointBound",
        m.service_conditions
            .get("ns/name.ns.svc.domain.suffix")
            .cloned(),
        Some(super::build::WaypointBound {
            status: true,
            reason: "WaypointAccepted".into(),
            message: format!("Successfully attached to waypoint waypoint-ns/waypoint{suffix}"),
        }),
    )
}

/// A waypoint address by host name (`namespace` ns).
fn waypoint_addr(host: &str, port: u32) -> wl::GatewayAddress {
    wl::GatewayAddress {
        destination: Some(wl::gateway_address::Destination::Hostname(
            wl::NamespacedHostname {
                namespace: "ns".into(),
                hostname: host.into(),
            },
        )),
        hbone_mtls_port: port,
    }
}

/// Waypoint `ns/waypoint` for all traffic at `host` (Istio's test `Waypoint`, its
/// allowed routes unset: the same namespace).
fn waypoint_all(host: &str, port: u32, binding: Option<wl::ApplicationTunnel>) -> Waypoint {
    Waypoint {
        namespace: "ns".into(),
        name: "waypoint".into(),
        address: waypoint_addr(host, port),
        binding,
        traffic: Traffic::All,
        allowed: Allowed::Same,
    }
}

fn waypoints(w: Waypoint) -> Waypoints {
    Waypoints::of([w], Default::default())
}

/// `services_test.go`'s cross-namespace waypoint `waypoint-ns/waypoint`, admitting
/// namespaces labelled `kubernetes.io/metadata.name: <admitted>`; namespace `ns`
/// carries that label with its own name.
fn cross_namespace(admitted: &str) -> Waypoints {
    let selector: LabelSelector = serde_json::from_value(
        serde_json::json!({"matchLabels": {"kubernetes.io/metadata.name": admitted}}),
    )
    .unwrap();
    Waypoints::of(
        [Waypoint {
            namespace: "waypoint-ns".into(),
            name: "waypoint".into(),
            address: waypoint_addr("hostname.example", 15008),
            binding: None,
            traffic: Traffic::All,
            allowed: Allowed::Selector(Some(selector)),
        }],
        [(
            "ns".to_string(),
            labels(&[("kubernetes.io/metadata.name", "ns")]),
        )]
        .into(),
    )
}

/// Vectors meshfed does not pass, with the reason.
const KNOWN_GAPS: &[(&str, &str)] = &[];

#[test]
fn istio_ambient_entry_vectors() {
    run(VECTORS, KNOWN_GAPS);
}
