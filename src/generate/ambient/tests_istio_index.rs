//! Istio's index vectors (`pilot/pkg/serviceregistry/kube/controller/ambient/`
//! `ambientindex_test.go` but `TestAmbientIndex_Policy` and `TestRBACConvert`, which
//! live with `ambient_authz`; `sidecar_interop_test.go`), played in a [`World`] standing in for
//! Istio's test server. Istio's push-event assertions become assertions on the
//! state after each step (meshfed rebuilds the type per snapshot and Delta sends
//! what changed). Each vector passes or is in [`KNOWN_GAPS`] with its reason.

use meshfed_api::workload as wl;

use super::tests_istio::{Vector, check, run};
use super::tests_istio_world::*;

const INDEX: &str = "ambientindex_test.go";
const INTEROP: &str = "sidecar_interop_test.go";

const USE_WAYPOINT: &str = "istio.io/use-waypoint";
const MANAGED: (&str, &str) = ("gateway.istio.io/managed", "istio.io-mesh-controller");
const GATEWAY_NAME: &str = "gateway.networking.k8s.io/gateway-name";

/// `TestAmbientIndex_WaypointForWorkloadTraffic`: a `test-wp` waypoint for one
/// traffic type, `pod1` and `svc1` both labelled to use it; whether each carries it.
fn waypoint_for_traffic(traffic: &str, pod_uses: bool, svc_uses: bool) -> Result<(), String> {
    let mut w = World::new();
    w.waypoint("10.0.0.10", "test-wp", traffic, true)
        .pod(
            "127.0.0.1",
            "pod1",
            "sa1",
            &[("app", "a"), (USE_WAYPOINT, "test-wp")],
        )
        .service(
            "svc1",
            &[(USE_WAYPOINT, "test-wp")],
            &[80],
            &[("app", "a")],
            "10.0.0.1",
        );
    let host = "test-wp.ns1.svc.company.com";
    check(
        "pod1 waypoint",
        workload_waypoint(&w, &pod_uid("pod1"))?,
        if pod_uses { host } else { "" }.to_string(),
    )?;
    let m = w.model();
    check(
        "svc1 waypoint",
        waypoint_host(m.services[&svc_key("svc1")].waypoint.as_ref()),
        if svc_uses { host } else { "" }.to_string(),
    )
}

/// `ServicesForWaypoint(key)`: the services whose waypoint is one of the key's
/// host names or addresses.
fn services_for_waypoint(w: &World, hostnames: &[&str], addresses: &[&str]) -> Vec<String> {
    w.model()
        .services
        .values()
        .filter(|s| {
            let h = waypoint_host(s.waypoint.as_ref());
            !h.is_empty() && (hostnames.contains(&h.as_str()) || addresses.contains(&h.as_str()))
        })
        .map(|s| s.name.clone())
        .collect()
}

/// `TestAmbientIndex_ServicesForWaypoint`: `svc1` uses waypoint `wp`, whose
/// Gateway reports the IP `status_ip` and/or the host name `status_host`.
fn services_for_waypoint_case(
    wp_vip: &str,
    status_ip: &str,
    status_host: &str,
) -> Result<(), String> {
    let mut w = World::new();
    w.waypoint_at(status_ip, status_host, "wp", "all", true)
        .service(
            "svc1",
            &[(USE_WAYPOINT, "wp")],
            &[80],
            &[("app", "app1")],
            "11.0.0.1",
        )
        .service("wp", &[], &[80], &[("app", "waypoint")], wp_vip);
    check(
        "ServicesForWaypoint",
        services_for_waypoint(&w, &["wp.ns1.svc.company.com"], &["10.0.0.1"]),
        vec!["svc1".to_string()],
    )
}

/// Pods `pod1..pod3` (app a, a+other, other) and `svc1` selecting `app: a`.
fn three_pods_and_svc1() -> World {
    let mut w = World::new();
    w.pod("127.0.0.1", "pod1", "sa1", &[("app", "a")])
        .pod(
            "127.0.0.2",
            "pod2",
            "sa1",
            &[("app", "a"), ("other", "label")],
        )
        .pod("127.0.0.3", "pod3", "sa1", &[("app", "other")])
        .service("svc1", &[], &[80], &[("app", "a")], "10.0.0.1");
    w
}

const VECTORS: &[Vector] = &[
    (INDEX, "WaypointForWorkloadTraffic/service traffic", || {
        waypoint_for_traffic("service", false, true)
    }),
    (INDEX, "WaypointForWorkloadTraffic/all traffic", || {
        waypoint_for_traffic("all", true, true)
    }),
    (INDEX, "WaypointForWorkloadTraffic/workload traffic", || {
        waypoint_for_traffic("workload", true, false)
    }),
    (INDEX, "WaypointForWorkloadTraffic/no traffic", || {
        waypoint_for_traffic("none", false, false)
    }),
    (INDEX, "NetworkAndClusterIDs/values unset", || {
        let mut w = World::new();
        w.pod("127.0.0.1", "pod1", "sa1", &[("app", "a")]);
        assert_addresses(&w, &addr("127.0.0.1"), &["pod1"])
    }),
    (INDEX, "NetworkAndClusterIDs/values set", || {
        let mut w = World::new();
        w.pod("127.0.0.1", "pod1", "sa1", &[("app", "a")]);
        assert_addresses(&w, &addr("127.0.0.1"), &["pod1"])
    }),
    (INDEX, "WorkloadNotFound", || {
        let mut w = World::new();
        w.pod("127.0.0.1", "pod1", "sa1", &[("app", "a")]);
        assert_addresses(&w, &addr("10.0.0.1"), &[])
    }),
    (INDEX, "LookupWorkloads", || {
        let mut w = World::new();
        w.pod("127.0.0.1", "pod1", "sa1", &[("app", "a")])
            .pod(
                "127.0.0.2",
                "pod2",
                "sa1",
                &[("app", "a"), ("other", "label")],
            )
            .pod("127.0.0.3", "pod3", "sa1", &[("app", "other")]);
        assert_addresses(&w, "", &["pod1", "pod2", "pod3"])?;
        assert_addresses(&w, &addr("127.0.0.1"), &["pod1"])?;
        let want = wl::Workload {
            name: "pod3".into(),
            namespace: NS.into(),
            addresses: vec![vec![127, 0, 0, 3]],
            network: NW.into(),
            service_account: "sa1".into(),
            uid: pod_uid("pod3"),
            node: "node1".into(),
            canonical_name: "other".into(),
            canonical_revision: "latest".into(),
            workload_type: wl::WorkloadType::Pod as i32,
            workload_name: "pod3".into(),
            cluster_id: CLUSTER.into(),
            status: wl::WorkloadStatus::Healthy as i32,
            ..Default::default()
        };
        for key in [pod_uid("pod3"), addr("127.0.0.3")] {
            check(&key, w.lookup(&key), vec![Found::W(want.clone())])?;
        }
        Ok(())
    }),
    (INDEX, "ServiceAttachedWaypoints", || {
        let mut w = World::new();
        // "default" is no traffic type: the Gateway is labelled `service`.
        w.waypoint("10.0.0.10", "test-wp", "default", true)
            .pod("127.0.0.1", "pod1", "sa1", &[("app", "a")])
            .service(
                "svc1",
                &[(USE_WAYPOINT, "test-wp")],
                &[80],
                &[("app", "a")],
                "10.0.0.1",
            );
        let found = w.lookup(&addr("10.0.0.1"));
        let Some(Found::S(s)) = found.first() else {
            return Err(format!("no service first at 10.0.0.1: {found:?}"));
        };
        check(
            "svc1 waypoint",
            waypoint_host(s.waypoint.as_ref()),
            "test-wp.ns1.svc.company.com".into(),
        )
    }),
    (INDEX, "ServiceSelectsCorrectWorkloads", || {
        let mut w = three_pods_and_svc1();
        assert_addresses(&w, &addr("10.0.0.1"), &["pod1", "pod2", "svc1"])?;
        w.pod("127.0.0.4", "pod4", "sa1", &[("app", "a")]);
        assert_addresses(&w, &addr("10.0.0.1"), &["pod1", "pod2", "pod4", "svc1"])?;
        w.delete(meshfed_registry::WorkloadKind::Pod, "pod4");
        assert_addresses(&w, &addr("127.0.0.4"), &[])?;
        assert_addresses(&w, &pod_uid("pod4"), &[])?;
        w.service(
            "svc1",
            &[],
            &[80],
            &[("app", "a"), ("other", "label")],
            "10.0.0.1",
        );
        assert_addresses(&w, &addr("10.0.0.1"), &["pod2", "svc1"])?;
        w.pod(
            "127.0.0.3",
            "pod3",
            "sa1",
            &[("app", "a"), ("other", "label")],
        );
        assert_addresses(&w, &addr("10.0.0.1"), &["pod2", "pod3", "svc1"])?;
        w.pod("127.0.0.3", "pod3", "sa1", &[("app", "a")]);
        assert_addresses(&w, &addr("10.0.0.1"), &["pod2", "svc1"])?;
        w.delete_service("svc1");
        assert_addresses(&w, &addr("10.0.0.1"), &[])?;
        // Every pod stays an address without the service.
        assert_addresses(&w, "", &["pod1", "pod2", "pod3"])
    }),
    (INDEX, "WaypointConfiguredOnlyWhenReady", || {
        // waypoint-sa1's Gateway has no address yet: pod1 gets no waypoint until
        // it has.
        let mut w = World::new();
        w.pod(
            "127.0.0.1",
            "pod1",
            "sa1",
            &[("app", "a"), (USE_WAYPOINT, "waypoint-sa1")],
        )
        .pod(
            "127.0.0.2",
            "pod2",
            "sa2",
            &[("app", "b"), (USE_WAYPOINT, "waypoint-sa2")],
        )
        .waypoint("10.0.0.1", "waypoint-sa1", "", false)
        .waypoint("10.0.0.2", "waypoint-sa2", "workload", true);
        check(
            "pod1 waypoint",
            workload_waypoint(&w, &addr("127.0.0.1"))?,
            String::new(),
        )?;
        check(
            "why pod1 has none",
            w.model()
                .workload_waypoint_problems
                .get(&pod_uid("pod1"))
                .map(|p| p.message.clone()),
            Some("waypoint \"ns1/waypoint-sa1\" is not ready".to_string()),
        )?;
        check(
            "pod2 waypoint",
            workload_waypoint(&w, &addr("127.0.0.2"))?,
            "waypoint-sa2.ns1.svc.company.com".into(),
        )?;
        w.waypoint("10.0.0.1", "waypoint-sa1", "workload", true);
        check(
            "pod1 waypoint once ready",
            workload_waypoint(&w, &addr("127.0.0.1"))?,
            "waypoint-sa1.ns1.svc.company.com".into(),
        )
    }),
    (INDEX, "WaypointAddressAddedToWorkloads", || {
        let mut w = World::new();
        w.ns_label(NS, &[(USE_WAYPOINT, "waypoint-ns")])
            .pod("127.0.0.1", "pod1", "sa1", &[("app", "a")])
            .pod(
                "127.0.0.2",
                "pod2",
                "sa1",
                &[("app", "a"), ("other", "label")],
            )
            .pod("127.0.0.3", "pod3", "sa1", &[("app", "a")])
            .pod(
                "127.0.0.4",
                "pod4",
                "sa2",
                &[("app", "b"), (USE_WAYPOINT, "waypoint-sa2")],
            )
            .waypoint("10.0.0.2", "waypoint-ns", "all", true)
            .pod(
                "127.0.0.200",
                "waypoint-ns-pod",
                "namespace-wide",
                &[MANAGED, (GATEWAY_NAME, "waypoint-ns")],
            )
            .service(
                "waypoint-ns",
                &[MANAGED],
                &[80],
                &[(GATEWAY_NAME, "waypoint-ns")],
                "10.0.0.2",
            )
            .waypoint("10.0.0.3", "waypoint-sa2", "all", true)
            .pod(
                "127.0.0.250",
                "waypoint-sa2-pod",
                "service-account",
                &[MANAGED, (GATEWAY_NAME, "waypoint-sa2")],
            )
            .service(
                "waypoint-sa2",
                &[MANAGED],
                &[80],
                &[(GATEWAY_NAME, "waypoint-sa2")],
                "10.0.0.3",
            )
            .service("svc1", &[], &[80], &[("app", "a")], "10.0.0.1");
        check(
            "pod3 waypoint",
            workload_waypoint(&w, &addr("127.0.0.3"))?,
            "waypoint-ns.ns1.svc.company.com".into(),
        )?;
        // Waypoints have no waypoint; looking up the waypoint VIP gives the service
        // and its pod.
        check(
            "waypoint pod's waypoint",
            workload_waypoint(&w, &addr("127.0.0.200"))?,
            String::new(),
        )?;
        assert_addresses(&w, &addr("10.0.0.2"), &["waypoint-ns", "waypoint-ns-pod"])?;
        assert_addresses(
            &w,
            &svc_key("waypoint-ns"),
            &["waypoint-ns", "waypoint-ns-pod"],
        )?;
        check(
            "pod4 waypoint",
            workload_waypoint(&w, &addr("127.0.0.4"))?,
            "waypoint-sa2.ns1.svc.company.com".into(),
        )?;
        // svc1's pods carry the namespace's waypoint; without the waypoint's
        // Gateway they carry none.
        let via_svc1 = |w: &World| {
            w.lookup(&addr("10.0.0.1"))
                .iter()
                .find_map(Found::workload)
                .map(|wl| waypoint_host(wl.waypoint.as_ref()))
        };
        check(
            "pod via svc1",
            via_svc1(&w),
            Some("waypoint-ns.ns1.svc.company.com".into()),
        )?;
        w.delete_waypoint("waypoint-ns")
            .delete_service("waypoint-ns")
            .delete_waypoint("waypoint-sa2")
            .delete_service("waypoint-sa2");
        check(
            "pod via svc1, waypoints gone",
            via_svc1(&w),
            Some(String::new()),
        )
    }),
    (INDEX, "WaypointInboundBinding", || {
        // The istio-waypoint GatewayClass annotates `PROXY/15088`.
        let mut w = World::new();
        w.waypoint_class(&[("ambient.istio.io/waypoint-inbound-binding", "PROXY/15088")])
            .waypoint("1.2.3.4", "proxy-sandwich", "all", true)
            .pod(
                "10.0.0.1",
                "proxy-sandwich-instance",
                "",
                &[(GATEWAY_NAME, "proxy-sandwich")],
            );
        let found = w.lookup(&pod_uid("proxy-sandwich-instance"));
        check(
            "application tunnel",
            found
                .first()
                .and_then(Found::workload)
                .and_then(|w| w.application_tunnel),
            Some(wl::ApplicationTunnel {
                protocol: wl::application_tunnel::Protocol::Proxy as i32,
                port: 15088,
            }),
        )
    }),
    (INDEX, "ServicesForWaypoint/hostname", || {
        services_for_waypoint_case("10.0.0.2", "", "wp.ns1.svc.company.com")
    }),
    (INDEX, "ServicesForWaypoint/ip", || {
        services_for_waypoint_case("10.0.0.1", "10.0.0.1", "")
    }),
    (INDEX, "ServicesForWaypoint/mixed", || {
        services_for_waypoint_case("10.0.0.1", "10.0.0.1", "wp.ns1.svc.company.com")
    }),
    (INDEX, "DefaultAllowWaypointPolicy", || {
        // `setupPolicyTest` with DEFAULT_ALLOW_FROM_WAYPOINT: the namespace's waypoint
        // has two pods with different service accounts; pod1 uses it.
        let mut w = World::new();
        w.default_allow_from_waypoint = true;
        w.pod("127.0.0.1", "pod1", "sa1", &[("app", "a")])
            .pod(
                "127.0.0.200",
                "waypoint-ns-pod",
                "namespace-wide",
                &[MANAGED, (GATEWAY_NAME, "waypoint-ns")],
            )
            .pod(
                "127.0.0.201",
                "waypoint2-sa",
                "waypoint-sa",
                &[MANAGED, (GATEWAY_NAME, "waypoint-ns")],
            )
            .waypoint("10.0.0.2", "waypoint-ns", "all", true)
            .ns_label(NS, &[(USE_WAYPOINT, "waypoint-ns")]);
        let policy = "ns1/istio_allow_waypoint_ns1_waypoint-ns";
        let m = w.model();
        let principals: Vec<String> = m
            .implicit_policies
            .get(policy)
            .map(|p| {
                p.groups[0].rules[0].matches[0]
                    .principals
                    .iter()
                    .filter_map(|sm| match &sm.match_type {
                        Some(meshfed_api::security::string_match::MatchType::Exact(e)) => {
                            Some(e.clone())
                        }
                        _ => None,
                    })
                    .collect()
            })
            .unwrap_or_default();
        check(
            "policy with service accounts",
            principals,
            vec![
                "cluster.local/ns/ns1/sa/namespace-wide".to_string(),
                "cluster.local/ns/ns1/sa/waypoint-sa".to_string(),
            ],
        )?;
        let found = lookup(&m, &addr("127.0.0.1"));
        check(
            "attach policy to workload",
            found
                .first()
                .and_then(Found::workload)
                .map(|w| w.authorization_policies.clone()),
            Some(vec![policy.to_string()]),
        )
    }),
    (INDEX, "PodLifecycleWorkloadGates", || {
        let mut w = World::new();
        w.pod("127.0.0.1", "pod1", "sa1", &[("app", "a")])
            .pod(
                "127.0.0.2",
                "pod2",
                "sa1",
                &[("app", "a"), ("other", "label")],
            )
            .pod("127.0.0.3", "pod3", "sa1", &[("app", "other")]);
        for o in w.objs.iter_mut().filter(|o| o.name != "pod1") {
            o.ready = false;
        }
        assert_workloads(&w, "", wl::WorkloadStatus::Healthy, &["pod1"])?;
        assert_workloads(&w, "", wl::WorkloadStatus::Unhealthy, &["pod2", "pod3"])
    }),
    (INDEX, "AddressInformation", || {
        let w = three_pods_and_svc1();
        let r = super::AddressResources::new(w.model());
        let names: std::collections::BTreeSet<String> = [svc_key("svc1"), pod_uid("pod2")].into();
        let got = r.select(super::super::Subscription {
            wildcard: false,
            names: &names,
            interned: None,
        });
        let mut seen: Vec<&str> = got.iter().map(|r| &*r.name).collect();
        let n = seen.len();
        seen.dedup();
        check("resources without duplicates", (n, seen.len()), (2, 2))
    }),
    (INDEX, "EmptyVIPsExcluded", || {
        // No ClusterIP and an empty load-balancer ingress IP: the registry gives no
        // VIP, so the service has no address.
        let mut w = World::new();
        w.service("svc", &[], &[80], &[("app", "a")], "10.0.0.1");
        w.services[0].vips.clear();
        check(
            "addresses",
            w.model().services[&svc_key("svc")].addresses.len(),
            0,
        )
    }),
    (INDEX, "UpdateWaypointForWorkload", || {
        let mut w = World::new();
        w.waypoint("10.0.0.2", "waypoint-sa1", "workload", true)
            .waypoint("10.0.0.1", "waypoint-ns", "workload", true)
            .pod("127.0.0.1", "pod1", "sa1", &[("app", "a")]);
        let wp = |w: &World| workload_waypoint(w, &pod_uid("pod1"));
        check("no waypoint", wp(&w)?, String::new())?;
        w.ns_label(NS, &[(USE_WAYPOINT, "waypoint-ns")]);
        check(
            "namespace",
            wp(&w)?,
            "waypoint-ns.ns1.svc.company.com".into(),
        )?;
        w.pod(
            "127.0.0.1",
            "pod1",
            "sa1",
            &[(USE_WAYPOINT, "waypoint-sa1")],
        );
        check(
            "pod label",
            wp(&w)?,
            "waypoint-sa1.ns1.svc.company.com".into(),
        )?;
        w.pod("127.0.0.1", "pod1", "sa1", &[]);
        check(
            "pod label removed",
            wp(&w)?,
            "waypoint-ns.ns1.svc.company.com".into(),
        )?;
        w.ns_label(NS, &[]);
        check("namespace label removed", wp(&w)?, String::new())?;
        w.pod(
            "127.0.0.1",
            "pod1",
            "sa1",
            &[(USE_WAYPOINT, "waypoint-sa1")],
        )
        .ns_label(NS, &[(USE_WAYPOINT, "waypoint-ns")]);
        check(
            "pod label over namespace",
            wp(&w)?,
            "waypoint-sa1.ns1.svc.company.com".into(),
        )?;
        w.pod("127.0.0.1", "pod1", "sa1", &[(USE_WAYPOINT, "none")]);
        check("none", wp(&w)?, String::new())?;
        w.pod("127.0.0.1", "pod1", "sa1", &[(USE_WAYPOINT, "~")]);
        check("~", wp(&w)?, String::new())
    }),
    (INDEX, "WorkloadsForWaypoint", || {
        let mut w = World::new();
        w.waypoint("10.0.0.1", "waypoint-ns", "workload", true)
            .waypoint("10.0.0.2", "waypoint-sa1", "workload", true)
            .ns_label(NS, &[(USE_WAYPOINT, "waypoint-ns")])
            .pod(
                "127.0.0.1",
                "pod1",
                "sa1",
                &[(USE_WAYPOINT, "waypoint-sa1")],
            )
            .pod("127.0.0.2", "pod2", "sa2", &[("app", "a")]);
        check(
            "pod2 waypoint",
            workload_waypoint(&w, &pod_uid("pod2"))?,
            "waypoint-ns.ns1.svc.company.com".into(),
        )?;
        check(
            "pod1 waypoint",
            workload_waypoint(&w, &pod_uid("pod1"))?,
            "waypoint-sa1.ns1.svc.company.com".into(),
        )
    }),
    (INDEX, "WorkloadsForWaypointOrder", || {
        // Workloads of a waypoint in creation order: pod3, pod1, pod2.
        let mut w = World::new();
        w.waypoint("10.0.0.1", "waypoint", "workload", true);
        for (ip, name) in [
            ("127.0.0.3", "pod3"),
            ("127.0.0.1", "pod1"),
            ("127.0.0.2", "pod2"),
        ] {
            w.pod(ip, name, "sa", &[("app", "a"), (USE_WAYPOINT, "waypoint")]);
        }
        let m = w.model();
        check(
            "order",
            m.waypoint_workloads.get("ns1/waypoint").cloned(),
            Some(vec![pod_uid("pod3"), pod_uid("pod1"), pod_uid("pod2")]),
        )
    }),
    (INDEX, "PolicyAfterPod", || {
        let mut w = World::new();
        w.service("svc1", &[], &[80], &[("app", "a")], "10.0.0.1")
            .pod("127.0.0.1", "pod1", "sa1", &[("app", "a")])
            .policy(NS, "selector", "selector:\n  matchLabels:\n    app: a");
        let found = w.lookup(&svc_key("svc1"));
        check(
            "pod1 policies via svc1",
            found
                .get(1)
                .and_then(Found::workload)
                .map(|w| w.authorization_policies.clone()),
            Some(vec!["ns1/selector".to_string()]),
        )
    }),
    (INTEROP, "IngressInterop", || {
        // svc1 (`istio.io/ingress-use-waypoint`) and the waypoint it uses, as
        // `ServicesWithWaypoint` reports it: the waypoint's service host name (an IP
        // waypoint: the service at that VIP).
        let services_with_waypoint = |w: &World| -> Vec<String> {
            let m = w.model();
            let Some(svc) = m.services.get(&svc_key("svc1")) else {
                return Vec::new();
            };
            let host = waypoint_host(svc.waypoint.as_ref());
            if host.is_empty() {
                return Vec::new();
            }
            let waypoint = match lookup(&m, &addr(&host)).into_iter().find_map(|f| match f {
                Found::S(s) => Some(s.hostname),
                Found::W(_) => None,
            }) {
                Some(h) => h,
                None => host,
            };
            vec![format!("{}/{waypoint}", svc.hostname)]
        };
        let mut w = World::new();
        w.service(
            "svc1",
            &[
                (USE_WAYPOINT, "wp-svc"),
                ("istio.io/ingress-use-waypoint", "true"),
            ],
            &[80],
            &[("app", "a")],
            "10.0.0.2",
        );
        check("before wp-svc", services_with_waypoint(&w), vec![])?;
        w.waypoint_at("10.0.0.1", "", "wp-svc", "all", true)
            .service("wp-svc", &[], &[80], &[("app", "waypoint")], "10.0.0.1");
        let want = vec!["svc1.ns1.svc.company.com/wp-svc.ns1.svc.company.com".to_string()];
        check("IP waypoint", services_with_waypoint(&w), want.clone())?;
        w.pod("127.0.0.4", "wp-pod1", "wp-sa", &[("app", "waypoint")])
            .pod("127.0.0.5", "wp-pod2", "wp-sa", &[("app", "waypoint")]);
        check("with instances", services_with_waypoint(&w), want)?;
        w.service(
            "svc1",
            &[(USE_WAYPOINT, "wp-svc-host")],
            &[80],
            &[("app", "a")],
            "10.0.0.2",
        )
        .waypoint_at("", "example.com", "wp-svc-host", "all", true);
        check(
            "host name waypoint",
            services_with_waypoint(&w),
            vec!["svc1.ns1.svc.company.com/example.com".to_string()],
        )
    }),
];

/// Vectors meshfed does not pass, with the reason.
const KNOWN_GAPS: &[(&str, &str)] = &[];

#[test]
fn istio_ambient_index_vectors() {
    run(VECTORS, KNOWN_GAPS);
}
