//! Istio's multicluster index vectors (`pilot/pkg/serviceregistry/kube/controller/`
//! `ambient/ambientindex_multicluster_test.go`, with `AMBIENT_ENABLE_MULTI_NETWORK`),
//! played in a [`Mesh`] of several clusters: each cluster's Services, pods and
//! network (meshfed's meshNetworks `fromRegistry`), the east-west gateways (a
//! Service `ns1/east-west` labelled `topology.istio.io/network` in the gateway's
//! cluster), merged as meshfed's aggregate merges them and built from `cluster0`'s
//! point of view with the test server's mesh config (`istio.io/global` services are
//! `GLOBAL`). Istio's push-event assertions become assertions on the state after
//! each step. Each vector passes or is in [`KNOWN_GAPS`] with its reason.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use meshfed_api::mesh::v1alpha1::{LabelSelector, LabelSelectorRequirement, MeshConfig};
use meshfed_api::mesh::v1alpha1::{MeshNetworks, mesh_config::ServiceScopeConfigs};
use meshfed_api::workload as wl;
use meshfed_registry::{
    ClusterId, Endpoint, HealthStatus, NetworkGateway, NetworkId, Port, Protocol, ProviderId,
    Service, ShardKey, WorkloadKind, WorkloadMeta,
};

use super::build::{self, AmbientModel};
use super::multinetwork::MultiNetwork;
use super::tests_istio::{Vector, check, run};
use super::tests_istio_world::*;
use super::waypoints::{WaypointInputs, Waypoints};
use crate::networks::NetworkView;

const MULTI: &str = "ambientindex_multicluster_test.go";

/// The test server's mesh config: services labelled `istio.io/global` are global.
fn scopes() -> Vec<ServiceScopeConfigs> {
    let mut c = ServiceScopeConfigs {
        services_selector: Some(LabelSelector {
            match_expressions: vec![LabelSelectorRequirement {
                key: "istio.io/global".into(),
                operator: "Exists".into(),
                values: vec![],
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    c.set_scope(meshfed_api::mesh::v1alpha1::mesh_config::service_scope_configs::Scope::Global);
    vec![c]
}

/// Several clusters as meshfed's registries present them.
#[derive(Default, Clone)]
struct Mesh {
    /// cluster -> network.
    networks: BTreeMap<String, String>,
    /// (cluster, name) -> (labels, VIP).
    services: BTreeMap<(String, String), (BTreeMap<String, String>, String)>,
    /// (cluster, name) -> (IP, labels).
    pods: BTreeMap<(String, String), (String, BTreeMap<String, String>)>,
    /// cluster -> (network, IP) of its east-west gateway.
    gateways: BTreeMap<String, (String, String)>,
    /// The local cluster's waypoint Gateways (and the waypoint class).
    waypoints: World,
}

impl Mesh {
    fn new(clusters: &[(&str, &str)]) -> Mesh {
        Mesh {
            networks: clusters
                .iter()
                .map(|(c, n)| (c.to_string(), n.to_string()))
                .collect(),
            waypoints: World::new(),
            ..Mesh::default()
        }
    }

    fn service(&mut self, cluster: &str, name: &str, l: &[(&str, &str)], vip: &str) -> &mut Self {
        self.services
            .insert((cluster.into(), name.into()), (labels(l), vip.into()));
        self
    }

    fn delete_service(&mut self, cluster: &str, name: &str) -> &mut Self {
        self.services
            .remove(&(cluster.to_string(), name.to_string()));
        self
    }

    fn pod(&mut self, cluster: &str, ip: &str, name: &str, l: &[(&str, &str)]) -> &mut Self {
        self.pods
            .insert((cluster.into(), name.into()), (ip.into(), labels(l)));
        self
    }

    fn gateway(&mut self, cluster: &str, network: &str, ip: &str) -> &mut Self {
        self.gateways
            .insert(cluster.into(), (network.into(), ip.into()));
        self
    }

    fn pod_endpoint(
        &self,
        cluster: &str,
        name: &str,
        ip: &str,
        l: &BTreeMap<String, String>,
    ) -> Endpoint {
        let mut e = Endpoint::new(ip.parse::<IpAddr>().unwrap()).with_port("80", 80);
        e.labels = l.clone();
        e.cluster_id = cluster.into();
        e.health = HealthStatus::Healthy;
        e.service_account = Some(format!("spiffe://cluster.local/ns/{NS}/sa/sa1"));
        let from = |k: &str| l.get(k).cloned().unwrap_or_default();
        e.workload = Some(Arc::new(WorkloadMeta {
            kind: WorkloadKind::Pod,
            name: name.into(),
            namespace: NS.into(),
            uid: format!("{cluster}//Pod/{NS}/{name}"),
            node_name: "node1".into(),
            workload_name: name.into(),
            use_waypoint: from("istio.io/use-waypoint"),
            use_waypoint_namespace: from("istio.io/use-waypoint-namespace"),
            ..WorkloadMeta::default()
        }));
        e
    }

    /// The Address type `cluster0` builds.
    fn model(&self) -> AmbientModel {
        let networks: MeshNetworks = serde_json::from_value(serde_json::json!({
            "networks": self.networks.iter().fold(serde_json::Map::new(), |mut m, (c, n)| {
                let entry = m.entry(n.clone()).or_insert_with(|| serde_json::json!({"endpoints": [], "gateways": []}));
                entry["endpoints"].as_array_mut().unwrap().push(serde_json::json!({"fromRegistry": c}));
                m
            }),
        }))
        .unwrap();
        let gateways: Vec<NetworkGateway> = self
            .gateways
            .iter()
            .map(|(c, (n, ip))| NetworkGateway {
                network: NetworkId::new(n),
                cluster: ClusterId::new(c),
                address: ip.parse().unwrap(),
                port: 15443,
                source: format!("label topology.istio.io/network on service {NS}/east-west@{c}"),
            })
            .collect();
        let view = NetworkView::new(&networks, &gateways);
        // The aggregate: one service per name, the local cluster's as the base.
        let mut merged: BTreeMap<String, (Service, Vec<(ShardKey, Endpoint)>)> = BTreeMap::new();
        let mut keys: Vec<&(String, String)> = self.services.keys().collect();
        keys.sort_by_key(|(c, n)| (n.clone(), c != CLUSTER, c.clone()));
        for key in keys {
            let (cluster, name) = key;
            let (l, vip) = &self.services[key];
            let host = format!("{name}.{NS}.svc.{DOMAIN}");
            let (svc, eps) = merged.entry(name.clone()).or_insert_with(|| {
                let mut s =
                    Service::new(host.as_str(), NS, ProviderId::Kubernetes, cluster.as_str());
                s.ports.push(Port::new("80", 80, Protocol::Tcp).unwrap());
                s.labels = l.clone();
                (s, Vec::new())
            });
            svc.cluster_vips
                .insert(cluster.as_str().into(), vec![vip.parse().unwrap()]);
            for ((c, pod), (ip, pl)) in &self.pods {
                if c == cluster && pl.get("app").is_some_and(|a| a == "a") {
                    eps.push((
                        ShardKey::new(ProviderId::Kubernetes, cluster.as_str()),
                        self.pod_endpoint(c, pod, ip, pl),
                    ));
                }
            }
        }
        let refs: Vec<build::ServiceEndpoints<'_>> = merged
            .values()
            .map(|(s, eps)| (s, eps.iter().map(|(k, e)| (k, e)).collect()))
            .collect();
        let every: Vec<(ShardKey, Endpoint)> = self
            .pods
            .iter()
            .map(|((c, pod), (ip, pl))| {
                (
                    ShardKey::new(ProviderId::Kubernetes, c.as_str()),
                    self.pod_endpoint(c, pod, ip, pl),
                )
            })
            .collect();
        let standalone: Vec<(&ShardKey, &Endpoint)> = every.iter().map(|(k, e)| (k, e)).collect();
        let ns_labels: BTreeMap<String, BTreeMap<String, String>> =
            [(NS.to_string(), BTreeMap::new())].into();
        let waypoints = Waypoints::read(
            &self.waypoints.gateways,
            WaypointInputs {
                domain: DOMAIN,
                service_exists: &|h| merged.values().any(|(s, _)| s.hostname.as_str() == h),
                network_of: &|ip| build::ip_network(&view, &refs, ip),
                namespaces: Arc::new(ns_labels.clone()),
            },
        );
        let local_cluster = ClusterId::new(CLUSTER);
        let local_network = NetworkId::new(&self.networks[CLUSTER]);
        let scopes = scopes();
        let multi = MultiNetwork {
            local_cluster: &local_cluster,
            local_network: &local_network,
            scopes: &scopes,
            namespaces: &ns_labels,
        };
        build::build(
            &refs,
            &standalone,
            &view,
            "cluster.local",
            DOMAIN,
            &waypoints,
            Some(&multi),
        )
    }
}

fn svc2_key() -> String {
    svc_key("svc2")
}

fn split_horizon_uid(network: &str, gateway: &str) -> String {
    format!(
        "{network}/SplitHorizonWorkload/{NS}/east-west/{gateway}/{}",
        svc2_key()
    )
}

fn lookup_len(m: &AmbientModel, key: &str) -> usize {
    lookup(m, key).len()
}

/// `TestAmbientMulticlusterIndex_WaypointForWorkloadTraffic`: `svc2` (global) and
/// `pod1` in `cluster0` and `c2` (network `testnetwork`) and `c1`
/// (`testnetwork-2`, gateway 77.1.2.49); `c1`'s pod is reached through a
/// split-horizon workload. Then `cluster0`'s pod and service use waypoint
/// `test-wp` for `traffic`; last, `cluster0`'s service and pod are deleted.
fn multicluster_traffic(traffic: &str, pod_uses: bool, svc_uses: bool) -> Result<(), String> {
    let mut mesh = Mesh::new(&[(CLUSTER, NW), ("c1", "testnetwork-2"), ("c2", NW)]);
    mesh.gateway(CLUSTER, NW, "77.1.2.4")
        .gateway("c1", "testnetwork-2", "77.1.2.49");
    mesh.waypoints
        .waypoint("10.0.0.10", "test-wp", traffic, true);
    let global = [("istio.io/global", "true")];
    for (cluster, svc_ip, pod_ip) in [
        (CLUSTER, "10.0.0.1", "127.0.0.1"),
        ("c1", "10.0.0.1", "127.0.0.1"),
        ("c2", "10.1.0.1", "127.0.0.6"),
    ] {
        mesh.service(cluster, "svc2", &global, svc_ip).pod(
            cluster,
            pod_ip,
            "pod1",
            &[("app", "a")],
        );
    }
    let m = mesh.model();
    let sh = split_horizon_uid("testnetwork-2", "77.1.2.49");
    check(
        "split-horizon workload",
        m.workloads.contains_key(&sh),
        true,
    )?;
    check(
        "split-horizon capacity",
        m.workloads[&sh].capacity.as_ref().map(|c| c.value),
        Some(1),
    )?;
    for cluster in [CLUSTER, "c2"] {
        let uid = format!("{cluster}//Pod/{NS}/pod1");
        check(
            &format!("{uid} backs svc2"),
            m.workloads
                .get(&uid)
                .is_some_and(|w| w.services.contains_key(&svc2_key())),
            true,
        )?;
    }
    check(
        "c1's pod is not sent",
        m.workloads.contains_key(&format!("c1//Pod/{NS}/pod1")),
        false,
    )?;
    check("svc2 addresses", m.services[&svc2_key()].addresses.len(), 3)?;

    // Label the local pod and service to use the waypoint.
    let use_wp = ("istio.io/use-waypoint", "test-wp");
    mesh.pod(CLUSTER, "127.0.0.1", "pod1", &[("app", "a"), use_wp])
        .service(CLUSTER, "svc2", &[use_wp, global[0]], "10.0.0.1");
    let m = mesh.model();
    let host = format!("test-wp.{NS}.svc.{DOMAIN}");
    let want = |uses: bool| if uses { host.clone() } else { String::new() };
    check(
        "pod1 waypoint",
        waypoint_host(m.workloads[&pod_uid("pod1")].waypoint.as_ref()),
        want(pod_uses),
    )?;
    check(
        "svc2 waypoint",
        waypoint_host(m.services[&svc2_key()].waypoint.as_ref()),
        want(svc_uses),
    )?;

    // Delete the local service: the local pod no longer backs it; the remote
    // clusters' svc2 remains.
    mesh.delete_service(CLUSTER, "svc2");
    let m = mesh.model();
    check(
        "pod1 backs svc2 after the delete",
        m.workloads[&pod_uid("pod1")]
            .services
            .contains_key(&svc2_key()),
        false,
    )?;
    check(
        "svc2 addresses after the delete",
        m.services[&svc2_key()].addresses.len(),
        2,
    )?;
    // Delete the remote services: no service, no split-horizon workload.
    mesh.delete_service("c1", "svc2")
        .delete_service("c2", "svc2");
    let m = mesh.model();
    check(
        "svc2 after deleting all",
        m.services.contains_key(&svc2_key()),
        false,
    )?;
    check(
        "split-horizon workload after deleting all",
        m.workloads.contains_key(&sh),
        false,
    )
}

/// `TestMulticlusterAmbientIndex_ServicesForWaypoint`: `svc1` uses waypoint `wp`
/// whose Gateway reports the IP `status_ip` and/or the host name `status_host`.
fn services_for_waypoint_case(
    wp_vip: &str,
    status_ip: &str,
    status_host: &str,
) -> Result<(), String> {
    let mut w = World::new();
    w.waypoint_at(status_ip, status_host, "wp", "all", true)
        .service(
            "svc1",
            &[("istio.io/use-waypoint", "wp")],
            &[80],
            &[("app", "app1")],
            "11.0.0.1",
        )
        .service("wp", &[], &[80], &[("app", "waypoint")], wp_vip);
    let found: Vec<String> = w
        .model()
        .services
        .values()
        .filter(|s| {
            let h = waypoint_host(s.waypoint.as_ref());
            h == format!("wp.{NS}.svc.{DOMAIN}") || h == "10.0.0.1"
        })
        .map(|s| s.name.clone())
        .collect();
    check("ServicesForWaypoint", found, vec!["svc1".to_string()])
}

const REMOTE: &str = "remote-cluster";
const REMOTE_NW: &str = "remote-network";

fn service_merging() -> Result<(), String> {
    let mut mesh = Mesh::new(&[(CLUSTER, NW), (REMOTE, REMOTE_NW)]);
    mesh.service(CLUSTER, "svc2", &[], "10.0.0.1")
        .service(REMOTE, "svc2", &[], "127.1.0.1");
    let m = mesh.model();
    check(
        "local scope: addresses",
        m.services[&svc2_key()].addresses.len(),
        1,
    )?;
    mesh.delete_service(CLUSTER, "svc2");
    check(
        "a remote local-scoped service is not sent",
        mesh.model().services.contains_key(&svc2_key()),
        false,
    )?;
    mesh.service(REMOTE, "svc2", &[("istio.io/global", "true")], "127.1.0.1");
    let m = mesh.model();
    check(
        "global remote service: addresses",
        m.services.get(&svc2_key()).map(|s| s.addresses.len()),
        Some(1),
    )?;
    mesh.service(CLUSTER, "svc2", &[("istio.io/global", "true")], "10.0.0.1");
    check(
        "global in both: addresses",
        mesh.model().services[&svc2_key()].addresses.len(),
        2,
    )
}

fn split_horizon() -> Result<(), String> {
    let mut mesh = Mesh::new(&[(CLUSTER, NW), (REMOTE, REMOTE_NW)]);
    let global = [("istio.io/global", "true")];
    mesh.gateway(REMOTE, REMOTE_NW, "172.0.1.2")
        .service(CLUSTER, "svc2", &global, "10.0.0.1")
        .service(REMOTE, "svc2", &global, "127.1.0.1");
    let m = mesh.model();
    let gw = m
        .workloads
        .get(&format!("{NS}/east-west/172.0.1.2"))
        .ok_or("no network gateway workload")?;
    check(
        "gateway addresses",
        gw.addresses.clone(),
        vec![vec![172, 0, 1, 2]],
    )?;
    check("gateway network", gw.network.as_str(), REMOTE_NW)?;

    mesh.pod(CLUSTER, "10.0.1.1", "pod1", &[("app", "a")]).pod(
        REMOTE,
        "127.0.0.1",
        "pod1-abc",
        &[("app", "a")],
    );
    let sh = split_horizon_uid(REMOTE_NW, "172.0.1.2");
    let m = mesh.model();
    check("lookup svc2", lookup_len(&m, &svc2_key()), 3)?;
    let w = m.workloads.get(&sh).ok_or("no split-horizon workload")?;
    check("split-horizon addresses", w.addresses.len(), 0)?;
    let gateway = match w
        .network_gateway
        .as_ref()
        .and_then(|g| g.destination.as_ref())
    {
        Some(wl::gateway_address::Destination::Address(a)) => {
            (a.address.clone(), a.network.clone())
        }
        _ => return Err("split-horizon workload without a gateway address".into()),
    };
    check(
        "split-horizon gateway",
        gateway,
        (vec![172, 0, 1, 2], REMOTE_NW.to_string()),
    )?;
    check("capacity", w.capacity.as_ref().map(|c| c.value), Some(1))?;

    mesh.pod(REMOTE, "127.0.0.2", "pod2", &[("app", "a")]);
    let m = mesh.model();
    check("lookup svc2 with pod2", lookup_len(&m, &svc2_key()), 3)?;
    check(
        "capacity with pod2",
        m.workloads[&sh].capacity.as_ref().map(|c| c.value),
        Some(2),
    )?;

    // Without the gateway there is no split-horizon workload.
    mesh.gateways.clear();
    let m = mesh.model();
    check("lookup without gateway", lookup_len(&m, &svc2_key()), 2)?;
    check(
        "split-horizon without gateway",
        m.workloads.contains_key(&sh),
        false,
    )?;
    mesh.gateway(REMOTE, REMOTE_NW, "172.0.1.2");
    let m = mesh.model();
    check(
        "lookup with the gateway back",
        lookup_len(&m, &svc2_key()),
        3,
    )?;
    check(
        "capacity with the gateway back",
        m.workloads[&sh].capacity.as_ref().map(|c| c.value),
        Some(2),
    )?;

    // Local scope: no split horizon.
    mesh.service(CLUSTER, "svc2", &[], "10.0.0.1")
        .service(REMOTE, "svc2", &[], "127.1.0.1");
    let m = mesh.model();
    check("lookup when local", lookup_len(&m, &svc2_key()), 2)?;
    check(
        "split-horizon when local",
        m.workloads.contains_key(&sh),
        false,
    )?;

    // The remote cluster on the local network, the service global again: its pods
    // are sent as themselves.
    mesh.networks.insert(REMOTE.into(), NW.into());
    mesh.service(CLUSTER, "svc2", &global, "10.0.0.1").service(
        REMOTE,
        "svc2",
        &global,
        "127.1.0.1",
    );
    let m = mesh.model();
    check("lookup on one network", lookup_len(&m, &svc2_key()), 4)?;
    for pod in ["pod2", "pod1-abc"] {
        check(
            pod,
            m.workloads
                .contains_key(&format!("{REMOTE}//Pod/{NS}/{pod}")),
            true,
        )?;
    }

    // And back to its own network.
    mesh.networks.insert(REMOTE.into(), REMOTE_NW.into());
    let m = mesh.model();
    check(
        "lookup back on two networks",
        lookup_len(&m, &svc2_key()),
        3,
    )?;
    check("split-horizon back", m.workloads.contains_key(&sh), true)
}

const VECTORS: &[Vector] = &[
    (
        MULTI,
        "Multicluster WaypointForWorkloadTraffic/service traffic",
        || multicluster_traffic("service", false, true),
    ),
    (
        MULTI,
        "Multicluster WaypointForWorkloadTraffic/all traffic",
        || multicluster_traffic("all", true, true),
    ),
    (
        MULTI,
        "Multicluster WaypointForWorkloadTraffic/workload traffic",
        || multicluster_traffic("workload", true, false),
    ),
    (
        MULTI,
        "Multicluster WaypointForWorkloadTraffic/no traffic",
        || multicluster_traffic("none", false, false),
    ),
    (
        MULTI,
        "Multicluster ServicesForWaypoint/hostname (multicluster but unused)",
        || services_for_waypoint_case("10.0.0.2", "", "wp.ns1.svc.company.com"),
    ),
    (
        MULTI,
        "Multicluster ServicesForWaypoint/ip (multicluster but unused)",
        || services_for_waypoint_case("10.0.0.1", "10.0.0.1", ""),
    ),
    (
        MULTI,
        "Multicluster ServicesForWaypoint/mixed (multicluster but unused)",
        || services_for_waypoint_case("10.0.0.1", "10.0.0.1", "wp.ns1.svc.company.com"),
    ),
    (MULTI, "MulticlusterServiceMerging", service_merging),
    (MULTI, "MulticlusterSplitHorizon", split_horizon),
];

/// Vectors meshfed does not pass, with the reason.
const KNOWN_GAPS: &[(&str, &str)] = &[];

#[test]
fn istio_ambient_multicluster_vectors() {
    run(VECTORS, KNOWN_GAPS);
}

#[test]
fn a_mesh_config_scope_selector_decides_global() {
    let config: MeshConfig = serde_json::from_value(serde_json::json!({
        "serviceScopeConfigs": [
            {"namespaceSelector": {"matchLabels": {"team": "a"}}, "scope": "GLOBAL"},
            {"servicesSelector": {"matchExpressions": [{"key": "x", "operator": "Bogus"}]}, "scope": "GLOBAL"},
        ]
    }))
    .unwrap();
    let (c, n) = (ClusterId::new(CLUSTER), NetworkId::new(NW));
    let ns: BTreeMap<String, BTreeMap<String, String>> = [
        ("a-ns".to_string(), labels(&[("team", "a")])),
        ("b-ns".to_string(), labels(&[("team", "b")])),
    ]
    .into();
    let m = MultiNetwork {
        local_cluster: &c,
        local_network: &n,
        scopes: &config.service_scope_configs,
        namespaces: &ns,
    };
    let svc = |ns: &str, provider| {
        Service::new(
            format!("s.{ns}.svc.cluster.local").as_str(),
            ns,
            provider,
            CLUSTER,
        )
    };
    assert!(m.is_global(&svc("a-ns", ProviderId::Kubernetes)));
    // The second entry's selector is invalid: skipped, not matching everything.
    assert!(!m.is_global(&svc("b-ns", ProviderId::Kubernetes)));
    // A namespace with no known labels matches no entry.
    assert!(!m.is_global(&svc("c-ns", ProviderId::Kubernetes)));
    // ServiceEntries are not scoped.
    assert!(!m.is_global(&svc("a-ns", ProviderId::External)));
    let warnings = crate::mesh::service_scope_warnings(&config);
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(warnings[0].contains("sidecars and gateways ignore it"));
    assert!(warnings[1].starts_with("serviceScopeConfigs[1].servicesSelector"));
}

#[test]
fn the_mesh_config_file_carries_service_scopes_and_says_who_reads_them() {
    let path = std::path::Path::new("mesh.yaml");
    let text = "serviceScopeConfigs:\n- servicesSelector:\n    matchExpressions: [{key: istio.io/global, operator: Exists}]\n  scope: GLOBAL\n";
    let config = crate::mesh::parse_mesh_config(path, text).unwrap();
    assert_eq!(config.service_scope_configs.len(), 1);
    assert_eq!(
        config.service_scope_configs[0].scope(),
        meshfed_api::mesh::v1alpha1::mesh_config::service_scope_configs::Scope::Global
    );
    let warnings = crate::mesh::mesh_config_warnings(path, text);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains("--ambientMultiNetwork"),
        "{warnings:?}"
    );
}

#[test]
fn the_local_network_is_the_system_namespace_label_else_the_clusters_mesh_network() {
    let networks: MeshNetworks = serde_json::from_value(serde_json::json!({
        "networks": {"n1": {"endpoints": [{"fromRegistry": CLUSTER}], "gateways": []}}
    }))
    .unwrap();
    let view = NetworkView::new(&networks, &[]);
    let c = ClusterId::new(CLUSTER);
    assert_eq!(build::local_network(&view, &c, None).as_str(), "n1");
    let label = labels(&[("topology.istio.io/network", "n2")]);
    assert_eq!(build::local_network(&view, &c, Some(&label)).as_str(), "n2");
}
