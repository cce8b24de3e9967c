use super::*;
use crate::convert::{
    convert_namespace, convert_node, convert_pod, convert_service, convert_slice,
};
use crate::fake_api::objects::{namespace, node, pod, service, slice, slice_endpoint};
use meshfed_registry::HealthStatus;

fn state() -> ClusterState {
    ClusterState::new(Arc::new(KubeRegistryConfig::new("c1")))
}

fn k(ns: &str, name: &str) -> ObjectKey {
    ObjectKey::new(ns, name)
}

fn add_service(s: &mut ClusterState, name: &str) {
    let svc = service("ns", name, "10.0.0.1", &[("http", 80)]);
    let converted = convert_service(&svc, &s.config).unwrap();
    s.apply(Update::Service(k("ns", name), Some(converted)));
}

fn add_pod(s: &mut ClusterState, name: &str, ip: &str) {
    let p = convert_pod(&pod("ns", name, "app", ip, "n1")).unwrap();
    s.apply(Update::Pod(k("ns", name), p));
}

fn add_slice(s: &mut ClusterState, name: &str, service: &str, eps: &[(&str, &str)]) {
    let info = convert_slice(&slice("ns", name, service, &[("http", 80)], eps)).unwrap();
    s.apply(Update::Slice(k("ns", name), info));
}

fn endpoints(flush: &Flush) -> Vec<(String, Vec<String>)> {
    flush
        .endpoints
        .iter()
        .map(|(key, eps)| {
            (
                key.hostname.to_string(),
                eps.iter().map(|e| e.address.to_string()).collect(),
            )
        })
        .collect()
}

#[test]
fn a_late_pod_re_evaluates_only_its_service() {
    let mut s = state();
    add_service(&mut s, "a");
    add_service(&mut s, "b");
    add_slice(&mut s, "a-1", "a", &[("10.1.0.1", "a-1")]);
    let first = s.flush();
    assert_eq!(first.changed.len(), 2);
    assert_eq!(s.pending_pods(), 1);
    assert!(endpoints(&first).iter().all(|(_, eps)| eps.is_empty()));

    add_pod(&mut s, "a-1", "10.1.0.1");
    let next = s.flush();
    assert!(next.changed.is_empty() && next.view.is_none());
    assert_eq!(
        endpoints(&next),
        vec![(
            "a.ns.svc.cluster.local".to_string(),
            vec!["10.1.0.1".to_string()]
        )]
    );
    assert_eq!(s.pending_pods(), 0);

    // The same pod again (a status heartbeat): nothing to do.
    add_pod(&mut s, "a-1", "10.1.0.1");
    let idle = s.flush();
    assert!(idle.endpoints.is_empty() && idle.changed.is_empty());
}

#[test]
fn slices_merge_by_address_and_only_the_service_family_counts() {
    let mut s = state();
    add_service(&mut s, "a");
    add_pod(&mut s, "a-1", "10.1.0.1");
    add_pod(&mut s, "a-2", "10.1.0.2");
    add_slice(&mut s, "a-x", "a", &[("10.1.0.1", "a-1")]);
    // The endpoint moving to another slice shows up in both for a while.
    let mut moved = slice("ns", "a-y", "a", &[("grpc", 90)], &[("10.1.0.1", "a-1")]);
    moved
        .endpoints
        .push(slice_endpoint("ns", "10.1.0.2", Some("a-2")));
    let mut terminating = slice_endpoint("ns", "10.1.0.3", None);
    terminating.conditions = Some(k8s_openapi::api::discovery::v1::EndpointConditions {
        ready: Some(false),
        serving: Some(true),
        terminating: Some(true),
    });
    moved.endpoints.push(terminating);
    s.apply(Update::Slice(
        k("ns", "a-y"),
        convert_slice(&moved).unwrap(),
    ));
    let mut v6 = slice("ns", "a-v6", "a", &[("http", 80)], &[]);
    v6.address_type = "IPv6".into();
    v6.endpoints.push(slice_endpoint("ns", "fd00::1", None));
    s.apply(Update::Slice(k("ns", "a-v6"), convert_slice(&v6).unwrap()));

    let flush = s.flush();
    let (_, eps) = &flush.endpoints[0];
    let addresses: Vec<String> = eps.iter().map(|e| e.address.to_string()).collect();
    assert_eq!(addresses, vec!["10.1.0.1", "10.1.0.2", "10.1.0.3"]);
    let first = &eps[0];
    assert_eq!(first.ports.get("http"), Some(&80));
    assert_eq!(first.ports.get("grpc"), Some(&90), "ports of both slices");
    assert_eq!(eps[2].health, HealthStatus::Terminating);
    // An endpoint naming no pod is the slice's (Istio's EndpointSlice workload); one
    // naming a pod is the pod's.
    let slice_meta = eps[2].workload.as_deref().expect("slice object");
    assert_eq!(
        slice_meta.kind,
        meshfed_registry::WorkloadKind::EndpointSlice
    );
    assert_eq!(
        slice_meta.uid,
        format!(
            "{}/discovery.k8s.io/EndpointSlice/ns/a-y/10.1.0.3",
            s.config.cluster_id
        )
    );
    assert_eq!(slice_meta.name, "a-y");
    assert_eq!(
        eps[1].workload.as_deref().map(|m| m.kind),
        Some(meshfed_registry::WorkloadKind::Pod)
    );
}

#[test]
fn node_and_system_namespace_changes_reach_the_endpoints() {
    let mut s = state();
    add_service(&mut s, "a");
    add_pod(&mut s, "a-1", "10.1.0.1");
    add_slice(&mut s, "a-1", "a", &[("10.1.0.1", "a-1")]);
    s.apply(Update::Node(
        k("", "n1"),
        Some(convert_node(&node("n1", "r1", "z1"))),
    ));
    let eps = &s.flush().endpoints[0].1;
    assert_eq!(eps[0].locality.to_string(), "r1/z1/");

    // Only the external IP changes: no endpoint depends on it.
    let mut n = node("n1", "r1", "z1");
    n.status.as_mut().unwrap().addresses.as_mut().unwrap()[0].address = "192.0.2.9".into();
    s.apply(Update::Node(k("", "n1"), Some(convert_node(&n))));
    assert!(s.flush().endpoints.is_empty());

    s.apply(Update::Node(
        k("", "n1"),
        Some(convert_node(&node("n1", "r2", "z1"))),
    ));
    assert_eq!(s.flush().endpoints[0].1[0].locality.region, "r2");

    let system = namespace("istio-system", &[("topology.istio.io/network", "n-1")]);
    s.apply(Update::Namespace(
        k("", "istio-system"),
        Some(convert_namespace(&system)),
    ));
    assert_eq!(s.flush().endpoints[0].1[0].network.as_str(), "n-1");
}

#[test]
fn services_exported_to_nobody_are_silent() {
    let mut s = state();
    let mut svc = service("ns", "hidden", "10.0.0.9", &[("http", 80)]);
    svc.metadata.annotations =
        Some([("networking.istio.io/exportTo".to_string(), "~".to_string())].into());
    let converted = convert_service(&svc, &s.config).unwrap();
    s.apply(Update::Service(k("ns", "hidden"), Some(converted)));
    let flush = s.flush();
    assert!(flush.view.is_some(), "readers still see it");
    assert!(flush.changed.is_empty() && flush.endpoints.is_empty());
    s.apply(Update::Service(k("ns", "hidden"), None));
    assert_eq!(s.flush().deleted.len(), 1);
}

/// A pod `name` in `ns` at `ip` with `labels` and a container port `web` = 9081.
fn workload_pod(ns: &str, name: &str, ip: &str, labels: &[(&str, &str)]) -> PodInfo {
    let mut p = pod(ns, name, "unused", ip, "n1");
    p.metadata.labels = Some(
        labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    p.spec.as_mut().unwrap().containers[0].ports =
        Some(vec![k8s_openapi::api::core::v1::ContainerPort {
            name: Some("web".into()),
            container_port: 9081,
            ..Default::default()
        }]);
    // Not ready: what matters is that it exists, not that a slice lists it.
    p.status.as_mut().unwrap().conditions = Some(vec![k8s_openapi::api::core::v1::PodCondition {
        type_: "Ready".into(),
        status: "False".into(),
        ..Default::default()
    }]);
    convert_pod(&p).unwrap().unwrap()
}

/// Service `name` in `ns` selecting `app=<app>`, with (port name, port, targetPort)
/// ports; a target that does not parse as a number is a named port.
fn selecting_service(
    s: &mut ClusterState,
    ns: &str,
    name: &str,
    app: &str,
    ports: &[(&str, i32, &str)],
) {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    let plain: Vec<(&str, i32)> = ports.iter().map(|(n, p, _)| (*n, *p)).collect();
    let mut svc = service(ns, name, "10.0.0.1", &plain);
    let spec = svc.spec.as_mut().unwrap();
    spec.selector = Some([("app".to_string(), app.to_string())].into());
    for (port, (_, _, target)) in spec.ports.as_mut().unwrap().iter_mut().zip(ports) {
        port.target_port = Some(match target.parse::<i32>() {
            Ok(n) => IntOrString::Int(n),
            Err(_) => IntOrString::String(target.to_string()),
        });
    }
    let converted = convert_service(&svc, &s.config).unwrap();
    s.apply(Update::Service(k(ns, name), Some(converted)));
}

fn find(s: &ClusterState, ips: &[&str], id: &str, ns: &str) -> Option<WorkloadInstance> {
    let ips: Vec<IpAddr> = ips.iter().map(|ip| ip.parse().unwrap()).collect();
    let pods = PodView {
        pods: s.pods_by_ip.clone(),
        nodes: s.nodes.clone(),
        default_network: s.default_network().cloned(),
        namespaces: s.namespaces.clone(),
    };
    find_workload(
        &s.config,
        &s.published,
        &pods,
        &WorkloadQuery {
            ips: &ips,
            id,
            namespace: ns,
            cluster: None,
        },
    )
}

fn targets(w: &WorkloadInstance) -> Vec<(String, u16, u16)> {
    w.targets
        .iter()
        .map(|t| (t.service.hostname.to_string(), t.port, t.target_port))
        .collect()
}

#[test]
fn a_pod_is_served_by_the_services_selecting_it_with_target_ports_resolved() {
    let mut s = state();
    s.apply(Update::Node(
        k("", "n1"),
        Some(convert_node(&node("n1", "r1", "z1"))),
    ));
    selecting_service(
        &mut s,
        "ns",
        "reviews",
        "reviews",
        // A named target, a numeric one, a name the pod lacks, and a port landing
        // on the same target port and protocol as the first (kept once).
        &[
            ("http", 9080, "web"),
            ("grpc", 7070, "7071"),
            ("http-admin", 15000, "admin"),
            ("http-alt", 8080, "9081"),
        ],
    );
    selecting_service(&mut s, "ns", "other", "other", &[("http", 80, "80")]);
    // The same selector in another namespace does not select the pod.
    selecting_service(
        &mut s,
        "elsewhere",
        "reviews",
        "reviews",
        &[("http", 80, "80")],
    );
    s.apply(Update::Pod(
        k("ns", "reviews-1"),
        Some(workload_pod(
            "ns",
            "reviews-1",
            "10.1.0.5",
            &[("app", "reviews")],
        )),
    ));
    s.flush();

    let w = find(&s, &["10.1.0.5"], "reviews-1.ns", "ns").expect("the pod");
    assert_eq!(
        targets(&w),
        vec![
            ("reviews.ns.svc.cluster.local".to_string(), 9080, 9081),
            ("reviews.ns.svc.cluster.local".to_string(), 7070, 7071),
        ]
    );
    assert_eq!((w.name.as_str(), w.namespace.as_str()), ("reviews-1", "ns"));
    assert_eq!(w.cluster_id.as_str(), "c1");
    assert_eq!(w.labels["app"], "reviews");
    assert_eq!(w.labels[LABEL_ZONE], "z1", "topology from the node");
    assert_eq!(w.labels[LABEL_CLUSTER], "c1");
    assert_eq!(w.labels[LABEL_HOSTNAME], "n1");
    assert_eq!(w.locality.to_string(), "r1/z1/");
    assert_eq!(
        w.service_account.as_deref(),
        Some("spiffe://cluster.local/ns/ns/sa/unused")
    );
    // Found by IP whatever the id says; unknown IPs find nothing.
    assert!(find(&s, &["10.1.0.5"], "whatever", "ns").is_some());
    assert!(find(&s, &["10.9.9.9"], "reviews-1.ns", "ns").is_none());
}

#[test]
fn a_pod_whose_labels_no_service_selects_has_no_targets() {
    let mut s = state();
    selecting_service(&mut s, "ns", "reviews", "reviews", &[("http", 80, "80")]);
    s.apply(Update::Pod(
        k("ns", "lonely"),
        Some(workload_pod(
            "ns",
            "lonely",
            "10.1.0.6",
            &[("app", "lonely")],
        )),
    ));
    s.flush();
    let w = find(&s, &["10.1.0.6"], "lonely.ns", "ns").unwrap();
    assert!(w.targets.is_empty());
    assert_eq!(w.labels["app"], "lonely");
}

#[test]
fn pods_sharing_an_ip_are_told_apart_by_the_proxy_id() {
    let mut s = state();
    for name in ["a", "b"] {
        s.apply(Update::Pod(
            k("ns", name),
            Some(workload_pod("ns", name, "10.1.0.7", &[("app", name)])),
        ));
    }
    s.flush();
    let found = |id: &str, ns: &str| find(&s, &["10.1.0.7"], id, ns).map(|w| w.name);
    assert_eq!(found("b.ns", "ns").as_deref(), Some("b"));
    assert_eq!(found("a.ns", "ns").as_deref(), Some("a"));
    assert_eq!(
        found("b.ns", "other"),
        None,
        "the id must match the namespace"
    );
    assert_eq!(found("c.ns", "ns"), None, "ambiguous: no pod");
}

#[test]
fn pod_changes_publish_the_pod_view_and_name_the_pod() {
    let mut s = state();
    s.flush();
    let p = |labels: &[(&str, &str)]| workload_pod("ns", "p", "10.1.0.8", labels);
    s.apply(Update::Pod(k("ns", "p"), Some(p(&[("app", "a")]))));
    let flush = s.flush();
    assert!(flush.pods.is_some());
    let ip: IpAddr = "10.1.0.8".parse().unwrap();
    assert_eq!(
        flush.changed_pods,
        vec![PodChange {
            key: k("ns", "p"),
            before: vec![],
            now: vec![ip],
        }]
    );
    // The same pod again: nothing.
    s.apply(Update::Pod(k("ns", "p"), Some(p(&[("app", "a")]))));
    let idle = s.flush();
    assert!(idle.pods.is_none() && idle.changed_pods.is_empty());
    // A label change, then deletion.
    s.apply(Update::Pod(k("ns", "p"), Some(p(&[("app", "b")]))));
    let flush = s.flush();
    let published = flush.pods.unwrap();
    assert_eq!(published.pods.get(&ip)[0].1.labels["app"], "b");
    assert_eq!(flush.changed_pods[0].before, vec![ip]);
    s.apply(Update::Pod(k("ns", "p"), None));
    let flush = s.flush();
    assert!(flush.pods.unwrap().pods.get(&ip).is_empty());
    assert_eq!(flush.changed_pods[0].now, Vec::<IpAddr>::new());
    // The earlier published view is untouched (copy on write).
    assert_eq!(published.pods.get(&ip).len(), 1);
}

#[test]
fn pod_endpoints_carry_their_workload_and_follow_namespace_ambient_labels() {
    let mut s = state();
    add_service(&mut s, "a");
    let mut p = pod("ns", "a-7d9f-x1", "app", "10.1.0.1", "n1");
    p.metadata.uid = Some("u-1".into());
    p.metadata.labels.as_mut().unwrap().extend([
        ("pod-template-hash".to_string(), "7d9f".to_string()),
        ("istio.io/use-waypoint".to_string(), "wp".to_string()),
    ]);
    p.metadata.owner_references = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            kind: "ReplicaSet".into(),
            name: "a-7d9f".into(),
            controller: Some(true),
            ..Default::default()
        },
    ]);
    s.apply(Update::Pod(k("ns", "a-7d9f-x1"), convert_pod(&p).unwrap()));
    add_slice(&mut s, "a-1", "a", &[("10.1.0.1", "a-7d9f-x1")]);
    let first = s.flush();
    let ep = &first.endpoints[0].1[0];
    let w = ep
        .workload
        .as_deref()
        .expect("a pod endpoint names its pod");
    assert_eq!(w.kind, WorkloadKind::Pod);
    assert_eq!(w.uid, "c1//Pod/ns/a-7d9f-x1");
    assert_eq!((w.name.as_str(), w.namespace.as_str()), ("a-7d9f-x1", "ns"));
    assert_eq!(w.node_name, "n1");
    assert_eq!(w.workload_name, "a");
    assert_eq!(w.owner, meshfed_registry::WorkloadOwner::Deployment);
    assert_eq!(w.use_waypoint, "wp");
    assert_eq!(w.dataplane_mode, "");

    let ns = namespace("ns", &[("istio.io/dataplane-mode", "ambient")]);
    s.apply(Update::Namespace(k("", "ns"), Some(convert_namespace(&ns))));
    let next = s.flush();
    let ep = &next.endpoints[0].1[0];
    assert_eq!(ep.workload.as_deref().unwrap().dataplane_mode, "ambient");
}

#[test]
fn every_pod_is_a_workload_whether_or_not_a_service_selects_it() {
    let mut s = ClusterState::new(Arc::new(KubeRegistryConfig {
        ambient_workloads: true,
        ..KubeRegistryConfig::new("c1")
    }));
    add_service(&mut s, "a");
    // `a-1` backs service `a`; `lone` backs nothing; `done` has completed; `waiting`
    // has no IP yet; `sts-0` belongs to a StatefulSet and is not ready.
    add_pod(&mut s, "a-1", "10.1.0.1");
    add_slice(&mut s, "a-1", "a", &[("10.1.0.1", "a-1")]);
    add_pod(&mut s, "lone", "10.1.0.2");
    let mut done = pod("ns", "done", "job", "10.1.0.3", "n1");
    done.status.as_mut().unwrap().phase = Some("Succeeded".into());
    s.apply(Update::Pod(k("ns", "done"), convert_pod(&done).unwrap()));
    let mut waiting = pod("ns", "waiting", "app", "", "n1");
    let status = waiting.status.as_mut().unwrap();
    (status.pod_ip, status.pod_ips) = (None, None);
    s.apply(Update::Pod(
        k("ns", "waiting"),
        convert_pod(&waiting).unwrap(),
    ));
    let mut sts = pod("ns", "sts-0", "db", "10.1.0.4", "n1");
    sts.status.as_mut().unwrap().conditions = None;
    sts.metadata.owner_references = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            kind: "StatefulSet".into(),
            name: "sts".into(),
            controller: Some(true),
            ..Default::default()
        },
    ]);
    s.apply(Update::Pod(k("ns", "sts-0"), convert_pod(&sts).unwrap()));
    let ns = namespace("ns", &[("istio.io/use-waypoint", "wp")]);
    s.apply(Update::Namespace(k("", "ns"), Some(convert_namespace(&ns))));
    let flush = s.flush();
    let pods = flush.pods.expect("pods changed: the pod view is published");

    let mut workloads = pod_workloads(&s.config, &pods);
    workloads.sort_by_key(|e| e.address);
    let summary: Vec<(String, String, HealthStatus, String, String)> = workloads
        .iter()
        .map(|e| {
            let w = e.workload.as_deref().expect("a workload record");
            (
                e.address.to_string(),
                w.uid.clone(),
                e.health,
                w.workload_name.clone(),
                w.use_waypoint.clone(),
            )
        })
        .collect();
    let row = |ip: &str, name: &str, health, workload: &str| {
        (
            ip.to_string(),
            format!("c1//Pod/ns/{name}"),
            health,
            workload.to_string(),
            "wp".to_string(),
        )
    };
    assert_eq!(
        summary,
        vec![
            row("10.1.0.1", "a-1", HealthStatus::Healthy, "a-1"),
            row("10.1.0.2", "lone", HealthStatus::Healthy, "lone"),
            row("10.1.0.4", "sts-0", HealthStatus::Unhealthy, "sts"),
        ]
    );
    assert_eq!(
        workloads[0].service_account.as_deref(),
        Some("spiffe://cluster.local/ns/ns/sa/app")
    );
    assert!(
        workloads.iter().all(|e| e.ports.is_empty()),
        "no service ports"
    );
}
