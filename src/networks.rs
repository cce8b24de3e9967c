//! Networks and their gateways (reference §6): which network an endpoint is on, which
//! gateways lead into each network, and the view split-horizon EDS reads.
//!
//! Gateways come from three places (§6.3):
//! 1. meshNetworks `gateways[].address` (an IP; hostnames are not resolved, so they
//!    give no gateway and are listed as unresolved);
//! 2. meshNetworks `gateways[].registryServiceName`, resolved by the Kubernetes
//!    registry of each cluster the network lists under `fromRegistry`
//!    ([`registry_service_gateways`] tells it which);
//! 3. services labelled `topology.istio.io/network` in a Kubernetes registry.
//!
//! (2) and (3) arrive through the aggregate (`ServiceRegistry::network_gateways`), (1)
//! from the meshNetworks file; [`NetworkView::new`] joins them. An endpoint without a
//! network of its own (label) is placed by meshNetworks: the network listing its
//! cluster under `fromRegistry`, else the one whose `fromCidr` holds its address.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use meshfed_api::mesh::v1alpha1::MeshNetworks;
use meshfed_api::mesh::v1alpha1::network::{istio_network_gateway::Gw, network_endpoints::Ne};
use meshfed_kube::GatewayServiceRef;
use meshfed_registry::{ClusterId, Endpoint, NetworkGateway, NetworkId, ShardKey};
use serde::Serialize;

use crate::mesh::parse_cidr;

/// Where a meshNetworks `address` gateway came from (the `source` of its entry).
pub const SOURCE_MESH_NETWORKS: &str = "meshNetworks address";

/// One gateway as split-horizon EDS uses it.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Serialize)]
pub struct Gateway {
    /// The network behind it.
    pub network: NetworkId,
    /// The cluster it belongs to (empty for meshNetworks `address` gateways).
    pub cluster: ClusterId,
    /// Where clients connect.
    pub address: IpAddr,
    /// Its mTLS port.
    pub port: u16,
}

/// A gateway and every place it was learned from (for `/debug/networkz`).
#[derive(Clone, Debug, Serialize)]
pub struct GatewayEntry {
    #[serde(flatten)]
    pub gateway: Gateway,
    /// Sorted, e.g. `meshNetworks address`,
    /// `registryServiceName istio-eastwestgateway.istio-system.svc.cluster.local@c2`,
    /// `label topology.istio.io/network on service istio-system/eastwest@c2`.
    pub sources: Vec<String>,
}

/// A meshNetworks gateway that gives no address.
#[derive(Clone, Debug, Serialize)]
pub struct UnresolvedGateway {
    pub network: NetworkId,
    /// The hostname given as `address`.
    pub address: String,
    pub port: u16,
    pub reason: &'static str,
}

/// Every network's gateways and the meshNetworks rules that place endpoints: what
/// split-horizon EDS reads. Built from one snapshot's meshNetworks and registry
/// gateways.
#[derive(Clone, Debug, Default)]
pub struct NetworkView {
    /// Every gateway, sorted by (network, cluster, address, port), with its sources.
    entries: Vec<GatewayEntry>,
    /// Gateways by network, sorted by (address, port).
    by_network: BTreeMap<NetworkId, Vec<Gateway>>,
    /// Gateways by (network, cluster), sorted by (address, port).
    by_network_cluster: BTreeMap<(NetworkId, ClusterId), Vec<Gateway>>,
    /// Least common multiple of every group size above (1 without gateways).
    lcm: u32,
    /// meshNetworks `fromRegistry`: cluster -> network (the first network by name when
    /// several list a cluster).
    from_registry: BTreeMap<ClusterId, NetworkId>,
    /// meshNetworks `fromCidr` in network-name and list order.
    from_cidr: Vec<(IpAddr, u8, NetworkId)>,
    unresolved: Vec<UnresolvedGateway>,
}

impl NetworkView {
    /// Joins meshNetworks and the registries' gateways.
    pub fn new(networks: &MeshNetworks, registry_gateways: &[NetworkGateway]) -> NetworkView {
        let mut sources: BTreeMap<Gateway, BTreeSet<String>> = BTreeMap::new();
        let mut unresolved = Vec::new();
        let mut from_registry = BTreeMap::new();
        let mut from_cidr = Vec::new();
        for (name, network) in &networks.networks {
            let id = NetworkId::new(name);
            for e in &network.endpoints {
                match &e.ne {
                    Some(Ne::FromRegistry(cluster)) => {
                        from_registry
                            .entry(ClusterId::new(cluster))
                            .or_insert_with(|| id.clone());
                    }
                    Some(Ne::FromCidr(cidr)) => {
                        if let Some((addr, len)) = parse_cidr(cidr) {
                            from_cidr.push((addr, len, id.clone()));
                        }
                    }
                    None => {}
                }
            }
            for g in &network.gateways {
                let Some(Gw::Address(address)) = &g.gw else {
                    continue; // registryServiceName: the registries resolve it
                };
                let Ok(port) = u16::try_from(g.port) else {
                    continue;
                };
                match address.parse::<IpAddr>() {
                    Ok(ip) => {
                        sources
                            .entry(Gateway {
                                network: id.clone(),
                                cluster: ClusterId::default(),
                                address: ip,
                                port,
                            })
                            .or_default()
                            .insert(SOURCE_MESH_NETWORKS.to_string());
                    }
                    Err(_) => unresolved.push(UnresolvedGateway {
                        network: id.clone(),
                        address: address.clone(),
                        port,
                        reason: "hostname gateways are not resolved; use an IP address",
                    }),
                }
            }
        }
        for g in registry_gateways {
            sources
                .entry(Gateway {
                    network: g.network.clone(),
                    cluster: g.cluster.clone(),
                    address: g.address,
                    port: g.port,
                })
                .or_default()
                .insert(g.source.clone());
        }
        let mut by_network: BTreeMap<NetworkId, Vec<Gateway>> = BTreeMap::new();
        let mut by_network_cluster: BTreeMap<(NetworkId, ClusterId), Vec<Gateway>> =
            BTreeMap::new();
        for gateway in sources.keys() {
            by_network
                .entry(gateway.network.clone())
                .or_default()
                .push(gateway.clone());
            by_network_cluster
                .entry((gateway.network.clone(), gateway.cluster.clone()))
                .or_default()
                .push(gateway.clone());
        }
        for list in by_network
            .values_mut()
            .chain(by_network_cluster.values_mut())
        {
            list.sort_by_key(|g| (g.address, g.port));
        }
        let lcm = by_network
            .values()
            .chain(by_network_cluster.values())
            .fold(1u32, |acc, g| lcm(acc, g.len() as u32));
        NetworkView {
            entries: sources
                .into_iter()
                .map(|(gateway, sources)| GatewayEntry {
                    gateway,
                    sources: sources.into_iter().collect(),
                })
                .collect(),
            by_network,
            by_network_cluster,
            lcm,
            from_registry,
            from_cidr,
            unresolved,
        }
    }

    /// True when some network has a gateway: split horizon applies. Without any, the
    /// mesh is one flat network and EDS is sent unchanged.
    pub fn has_gateways(&self) -> bool {
        !self.entries.is_empty()
    }

    /// The least common multiple of the gateway counts per network and per (network,
    /// cluster): every endpoint weight is scaled by it so that a remote endpoint's
    /// weight divides evenly among its gateways.
    pub fn lcm(&self) -> u32 {
        self.lcm.max(1)
    }

    /// The gateways for endpoints of `network` in `cluster`: those of that cluster in
    /// the network, else every gateway of the network. Sorted by (address, port).
    pub fn gateways_for(&self, network: &NetworkId, cluster: &ClusterId) -> &[Gateway] {
        if let Some(gws) = self
            .by_network_cluster
            .get(&(network.clone(), cluster.clone()))
        {
            return gws;
        }
        self.by_network.get(network).map_or(&[], Vec::as_slice)
    }

    /// Every gateway into `network`, sorted by (address, port).
    pub fn network_gateways(&self, network: &NetworkId) -> &[Gateway] {
        self.by_network.get(network).map_or(&[], Vec::as_slice)
    }

    /// The network an endpoint is on: its own (pod / namespace label, WorkloadEntry),
    /// else meshNetworks `fromRegistry` for its cluster, else the first `fromCidr`
    /// holding its address, else none.
    pub fn endpoint_network(&self, ep: &Endpoint, shard: &ShardKey) -> NetworkId {
        if !ep.network.is_empty() {
            return ep.network.clone();
        }
        let cluster = if ep.cluster_id.is_empty() {
            &shard.cluster
        } else {
            &ep.cluster_id
        };
        if let Some(network) = self.from_registry.get(cluster) {
            return network.clone();
        }
        self.from_cidr
            .iter()
            .find(|(net, len, _)| cidr_contains(*net, *len, ep.address))
            .map(|(_, _, network)| network.clone())
            .unwrap_or_default()
    }

    /// Every gateway with its sources.
    pub fn entries(&self) -> &[GatewayEntry] {
        &self.entries
    }

    /// meshNetworks gateways that give no address.
    pub fn unresolved(&self) -> &[UnresolvedGateway] {
        &self.unresolved
    }
}

/// The meshNetworks `registryServiceName` gateways the registry of `cluster` must
/// resolve: those of the networks that list `cluster` under `fromRegistry` (Istio
/// honours such an entry only there).
pub fn registry_service_gateways(
    networks: &MeshNetworks,
    cluster: &ClusterId,
) -> Vec<GatewayServiceRef> {
    let mut out = Vec::new();
    for (name, network) in &networks.networks {
        let listed = network
            .endpoints
            .iter()
            .any(|e| matches!(&e.ne, Some(Ne::FromRegistry(c)) if c == cluster.as_str()));
        if !listed {
            continue;
        }
        for g in &network.gateways {
            if let (Some(Gw::RegistryServiceName(host)), Ok(port)) = (&g.gw, u16::try_from(g.port))
            {
                out.push(GatewayServiceRef {
                    network: NetworkId::new(name),
                    hostname: host.clone(),
                    port,
                });
            }
        }
    }
    out
}

/// A WorkloadEntry (or a ServiceEntry's inline endpoint) without an address that split
/// horizon cannot place: no client reaches it (`/debug/configz` `unplacedWorkloads`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct UnplacedWorkload {
    pub kind: &'static str,
    pub namespace: String,
    pub name: String,
    /// The field that is empty, e.g. `spec.address`, `spec.endpoints[1].address`.
    pub field: String,
    /// Its network (empty when it names none).
    pub network: String,
    pub reason: String,
}

/// The address-less workloads of `objects` whose network has no gateway in `view`
/// (or that name no network), sorted by kind, namespace, name and field. Such an entry
/// is kept (it is sent as its network's gateway once one appears) but reaches no
/// client until then.
pub fn unplaced_workloads<'a>(
    objects: impl IntoIterator<Item = &'a meshfed_registry::config::ConfigObject>,
    view: &NetworkView,
) -> Vec<UnplacedWorkload> {
    use meshfed_api::networking::v1alpha3::WorkloadEntry;
    let mut out = Vec::new();
    let mut check = |obj: &meshfed_registry::config::ConfigObject,
                     kind: &'static str,
                     field: String,
                     we: &WorkloadEntry,
                     extra: Option<&BTreeMap<String, String>>| {
        if !we.address.is_empty() {
            return;
        }
        let network = if we.network.is_empty() {
            extra
                .and_then(|l| l.get(LABEL_NETWORK))
                .or_else(|| we.labels.get(LABEL_NETWORK))
                .cloned()
                .unwrap_or_default()
        } else {
            we.network.clone()
        };
        let reason = if network.is_empty() {
            "no address and no network: nothing can reach it".to_string()
        } else if view
            .by_network
            .get(&NetworkId::new(&network))
            .is_none_or(Vec::is_empty)
        {
            format!(
                "no address, and network {network:?} has no gateway: it is sent only as its \
                 network's gateway, so no client reaches it"
            )
        } else {
            return;
        };
        out.push(UnplacedWorkload {
            kind,
            namespace: obj.namespace.clone(),
            name: obj.name.clone(),
            field,
            network,
            reason,
        });
    };
    for obj in objects {
        if let Some(we) = obj.spec.as_workload_entry() {
            check(
                obj,
                "WorkloadEntry",
                "spec.address".into(),
                we,
                Some(&obj.labels),
            );
        } else if let Some(se) = obj.spec.as_service_entry() {
            for (i, we) in se.endpoints.iter().enumerate() {
                check(
                    obj,
                    "ServiceEntry",
                    format!("spec.endpoints[{i}].address"),
                    we,
                    None,
                );
            }
        }
    }
    out.sort_by(|a, b| {
        (a.kind, &a.namespace, &a.name, &a.field).cmp(&(b.kind, &b.namespace, &b.name, &b.field))
    });
    out
}

/// The label that names a workload's network.
const LABEL_NETWORK: &str = "topology.istio.io/network";

/// `meshfed_unplaced_workloads{network}`: address-less WorkloadEntries and inline
/// endpoints that no client reaches (their network has no gateway, or they name no
/// network), by network, computed when scraped from the config stores and the current
/// network view. The same entries are listed under `unplacedWorkloads` in
/// `/debug/configz`.
pub struct UnplacedMetrics {
    stores: Vec<std::sync::Arc<dyn meshfed_registry::ConfigStore>>,
    view: Box<dyn Fn() -> std::sync::Arc<NetworkView> + Send + Sync>,
}

impl std::fmt::Debug for UnplacedMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UnplacedMetrics").finish_non_exhaustive()
    }
}

impl UnplacedMetrics {
    /// Registers the gauge in `registry`, reading `stores` and the network view `view`
    /// returns (the current snapshot's).
    pub fn register(
        stores: Vec<std::sync::Arc<dyn meshfed_registry::ConfigStore>>,
        view: impl Fn() -> std::sync::Arc<NetworkView> + Send + Sync + 'static,
        registry: &mut prometheus_client::registry::Registry,
    ) {
        registry.register_collector(Box::new(UnplacedMetrics {
            stores,
            view: Box::new(view),
        }));
    }

    /// Unplaced entries by network.
    fn counts(&self) -> BTreeMap<String, i64> {
        let objects: Vec<_> = self.stores.iter().flat_map(|s| s.all()).collect();
        let view = (self.view)();
        let mut counts = BTreeMap::new();
        for u in unplaced_workloads(objects.iter().map(|o| &**o), &view) {
            *counts.entry(u.network).or_default() += 1;
        }
        counts
    }
}

impl prometheus_client::collector::Collector for UnplacedMetrics {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> std::fmt::Result {
        let counts = self.counts();
        meshfed_registry::metrics::encode_gauges(
            &mut encoder,
            "meshfed_unplaced_workloads",
            "WorkloadEntries (and ServiceEntry inline endpoints) without an address that no client reaches: their network has no gateway, or they name no network; listed under unplacedWorkloads in /debug/configz",
            "network",
            counts.iter().map(|(n, c)| (n.as_str(), *c)),
        )
    }
}

/// `/debug/networkz`: every network (from meshNetworks or from a gateway), how its
/// endpoints are placed, and its gateways with where each came from. Sorted.
pub fn networkz(networks: &MeshNetworks, view: &NetworkView) -> serde_json::Value {
    let mut names: BTreeSet<String> = networks.networks.keys().cloned().collect();
    names.extend(view.entries.iter().map(|e| e.gateway.network.to_string()));
    let rows: Vec<serde_json::Value> = names
        .into_iter()
        .map(|name| {
            let endpoints: Vec<serde_json::Value> = networks
                .networks
                .get(&name)
                .map(|n| {
                    n.endpoints
                        .iter()
                        .filter_map(|e| match &e.ne {
                            Some(Ne::FromRegistry(c)) => {
                                Some(serde_json::json!({"fromRegistry": c}))
                            }
                            Some(Ne::FromCidr(c)) => Some(serde_json::json!({"fromCidr": c})),
                            None => None,
                        })
                        .collect()
                })
                .unwrap_or_default();
            let gateways: Vec<&GatewayEntry> = view
                .entries
                .iter()
                .filter(|e| e.gateway.network.as_str() == name)
                .collect();
            let unresolved: Vec<&UnresolvedGateway> = view
                .unresolved
                .iter()
                .filter(|u| u.network.as_str() == name)
                .collect();
            serde_json::json!({
                "network": name,
                "endpoints": endpoints,
                "gateways": gateways,
                "unresolvedGateways": unresolved,
            })
        })
        .collect();
    serde_json::json!({"lcm": view.lcm(), "networks": rows})
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 { a } else { gcd(b, a % b) }
}

fn lcm(a: u32, b: u32) -> u32 {
    if a == 0 || b == 0 {
        return a.max(b).max(1);
    }
    (a / gcd(a, b)).saturating_mul(b)
}

/// Whether `addr/len` holds `ip` (families must match).
pub fn cidr_contains(net: IpAddr, len: u8, ip: IpAddr) -> bool {
    match (net, ip) {
        (IpAddr::V4(n), IpAddr::V4(i)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
            u32::from(n) & mask == u32::from(i) & mask
        }
        (IpAddr::V6(n), IpAddr::V6(i)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
            u128::from(n) & mask == u128::from(i) & mask
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use meshfed_registry::ProviderId;

    use super::*;
    use crate::mesh::parse_mesh_networks;

    fn networks(yaml: &str) -> MeshNetworks {
        parse_mesh_networks(std::path::Path::new("n.yaml"), yaml).unwrap()
    }

    fn gw(network: &str, cluster: &str, ip: &str, source: &str) -> NetworkGateway {
        NetworkGateway {
            network: network.into(),
            cluster: cluster.into(),
            address: ip.parse().unwrap(),
            port: 15443,
            source: source.into(),
        }
    }

    const MESH: &str = "networks:\n  \
        n1:\n    endpoints: [{fromRegistry: c1}]\n    gateways: [{address: 1.1.1.1, port: 15443}, {address: gw.example.com, port: 15443}]\n  \
        n2:\n    endpoints: [{fromRegistry: c2}, {fromCidr: 10.2.0.0/16}]\n    \
        gateways: [{registryServiceName: eastwest.istio-system.svc.cluster.local, port: 15443}]\n  \
        n3:\n    endpoints: [{fromRegistry: c2}, {fromCidr: 10.0.0.0/8}]\n";

    #[test]
    fn endpoint_networks_come_from_labels_then_registry_then_cidr() {
        let view = NetworkView::new(&networks(MESH), &[]);
        let shard = ShardKey::new(ProviderId::Kubernetes, "c2");
        let mut ep = Endpoint::new("192.0.2.1".parse().unwrap());
        ep.network = "labelled".into();
        assert_eq!(view.endpoint_network(&ep, &shard).as_str(), "labelled");
        ep.network = NetworkId::default();
        assert_eq!(
            view.endpoint_network(&ep, &shard).as_str(),
            "n2",
            "the shard's cluster, first network by name"
        );
        ep.cluster_id = "c9".into();
        assert_eq!(view.endpoint_network(&ep, &shard).as_str(), "");
        ep.address = "10.2.3.4".parse().unwrap();
        assert_eq!(view.endpoint_network(&ep, &shard).as_str(), "n2");
        ep.address = "10.3.3.4".parse().unwrap();
        assert_eq!(view.endpoint_network(&ep, &shard).as_str(), "n3");
    }

    #[test]
    fn gateways_join_with_their_sources_and_the_lcm_covers_every_group() {
        let view = NetworkView::new(
            &networks(MESH),
            &[
                gw(
                    "n2",
                    "c2",
                    "2.2.2.2",
                    "label on service istio-system/eastwest@c2",
                ),
                gw("n2", "c2", "2.2.2.2", "registryServiceName eastwest@c2"),
                gw("n2", "c2", "2.2.2.3", "registryServiceName eastwest@c2"),
                gw(
                    "n2",
                    "c3",
                    "2.2.2.4",
                    "label on service istio-system/eastwest@c3",
                ),
            ],
        );
        assert!(view.has_gateways());
        // n1: 1; n2: 3; (n1,""): 1; (n2,c2): 2; (n2,c3): 1 -> lcm 6.
        assert_eq!(view.lcm(), 6);
        let c2 = view.gateways_for(&"n2".into(), &"c2".into());
        assert_eq!(c2.len(), 2);
        assert_eq!(
            view.gateways_for(&"n2".into(), &"c9".into()).len(),
            3,
            "another cluster of the network: every gateway of the network"
        );
        assert!(view.gateways_for(&"n3".into(), &"c2".into()).is_empty());
        let entry = &view.entries()[1];
        assert_eq!(entry.gateway.address.to_string(), "2.2.2.2");
        assert_eq!(entry.sources.len(), 2, "one gateway, two sources");
        assert_eq!(view.unresolved().len(), 1);
        let z = networkz(&networks(MESH), &view);
        let names: Vec<&str> = z["networks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["network"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["n1", "n2", "n3"]);
        assert_eq!(
            z["networks"][0]["gateways"][0]["sources"][0],
            SOURCE_MESH_NETWORKS
        );
        assert_eq!(
            z["networks"][0]["unresolvedGateways"][0]["address"],
            "gw.example.com"
        );
        assert!(!NetworkView::new(&MeshNetworks::default(), &[]).has_gateways());
        assert_eq!(NetworkView::default().lcm(), 1);
    }

    #[test]
    fn address_less_workloads_without_a_gateway_are_unplaced() {
        use meshfed_api::networking::v1alpha3 as net;
        use meshfed_registry::config::ConfigObject;
        let we = |name: &str, address: &str, network: &str| {
            ConfigObject::new(
                "vms",
                name,
                net::WorkloadEntry {
                    address: address.into(),
                    network: network.into(),
                    ..Default::default()
                },
            )
        };
        let se = ConfigObject::new(
            "vms",
            "inline",
            net::ServiceEntry {
                hosts: vec!["a.example.com".into()],
                endpoints: vec![
                    net::WorkloadEntry {
                        address: "10.0.0.1".into(),
                        ..Default::default()
                    },
                    net::WorkloadEntry {
                        network: "n3".into(),
                        ..Default::default()
                    },
                ],
                ..Default::default()
            },
        );
        let objects = [
            we("behind-gateway", "", "n2"),
            we("with-address", "10.0.0.2", "n3"),
            we("no-gateway", "", "n3"),
            se,
        ];
        let view = NetworkView::new(&networks(MESH), &[gw("n2", "c2", "2.2.2.2", "test")]);
        let unplaced = unplaced_workloads(objects.iter(), &view);
        let got: Vec<(&str, &str, &str, &str)> = unplaced
            .iter()
            .map(|u| {
                (
                    u.kind,
                    u.name.as_str(),
                    u.field.as_str(),
                    u.network.as_str(),
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                ("ServiceEntry", "inline", "spec.endpoints[1].address", "n3"),
                ("WorkloadEntry", "no-gateway", "spec.address", "n3"),
            ]
        );
    }

    #[test]
    fn registry_service_names_go_to_the_clusters_of_their_network() {
        let n = networks(MESH);
        let c2 = registry_service_gateways(&n, &"c2".into());
        assert_eq!(
            c2,
            vec![GatewayServiceRef {
                network: "n2".into(),
                hostname: "eastwest.istio-system.svc.cluster.local".into(),
                port: 15443,
            }]
        );
        assert!(registry_service_gateways(&n, &"c1".into()).is_empty());
    }

    #[test]
    fn cidrs_and_lcm() {
        assert!(cidr_contains(
            "10.0.0.0".parse().unwrap(),
            8,
            "10.9.9.9".parse().unwrap()
        ));
        assert!(!cidr_contains(
            "10.0.0.0".parse().unwrap(),
            8,
            "11.0.0.1".parse().unwrap()
        ));
        assert!(cidr_contains(
            "0.0.0.0".parse().unwrap(),
            0,
            "11.0.0.1".parse().unwrap()
        ));
        assert!(cidr_contains(
            "fd00::".parse().unwrap(),
            8,
            "fd12::1".parse().unwrap()
        ));
        assert!(!cidr_contains(
            "fd00::".parse().unwrap(),
            8,
            "10.0.0.1".parse().unwrap()
        ));
        assert_eq!(lcm(4, 6), 12);
        assert_eq!(lcm(1, 1), 1);
    }
}
