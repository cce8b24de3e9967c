//! EDS: one `ClusterLoadAssignment` per outbound cluster (and DestinationRule subset),
//! endpoints from every shard of the service, grouped by locality, with split-horizon
//! for multi-network meshes (remote networks' endpoints replaced by their gateways) and
//! Istio's locality load balancing (distribute weights, failover priorities) for the
//! requesting proxy.

use std::collections::BTreeMap;
use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::{
    Address, HealthStatus as EnvoyHealth, Locality as EnvoyLocality, Metadata, SocketAddress,
    address, socket_address,
};
use envoy_types::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, Endpoint as EnvoyEndpoint, LbEndpoint, LocalityLbEndpoints, lb_endpoint,
};
use envoy_types::pb::google::protobuf::{UInt32Value, Value, value};
use meshfed_api::mesh::v1alpha1::MeshConfig;
use meshfed_api::networking::v1alpha3::{DestinationRule, LocalityLoadBalancerSetting};
use meshfed_registry::{
    Endpoint, EndpointShards, HealthStatus, Locality, NetworkId, Port, ServiceKey, ShardKey,
};

mod split_horizon;
#[cfg(test)]
mod tests_istio;

pub use split_horizon::{
    MtlsCheck, NetworkFilter, NetworkVisibility, in_network, mtls_enabled, rule_tls_mode,
};

use super::destination_rule;
use super::locality_lb::*;
use crate::model::{Proxy, ProxyClass};
use crate::networks::{Gateway, NetworkView};
use crate::push::cache::CacheInput;
use crate::push::snapshot::Snapshot;
use crate::xds::names::ClusterName;
use crate::xds::names::host_of;
use crate::xds::{EncodedResource, Resource, TypeUrl};

/// Options that change which endpoints are sent.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct EdsOptions {
    /// Send unhealthy (and draining) endpoints marked as such instead of dropping them
    /// (Istio's `PILOT_SEND_UNHEALTHY_ENDPOINTS`).
    pub send_unhealthy: bool,
    /// Only endpoints the client sends Istio mTLS ([`MtlsCheck`] when given, else the
    /// endpoint's TLS mode): a gateway's SNI-DNAT clusters, where the client's mTLS
    /// passes through, so a plaintext endpoint could not answer it.
    pub mtls_only: bool,
}

/// Which endpoints a load assignment carries and how they are prioritised.
#[derive(Clone, Copy, Debug, Default)]
pub struct EndpointSelection<'a> {
    /// Flags.
    pub options: EdsOptions,
    /// A DestinationRule subset's labels, which every endpoint must carry.
    pub subset: Option<&'a BTreeMap<String, String>>,
    /// Locality load balancing for the requesting client.
    pub locality_lb: Option<LocalityLb<'a>>,
    /// Split horizon for the requesting client's network (none: one flat network).
    pub network: Option<NetworkFilter<'a>>,
    /// The networks the client asked to see (none: every network).
    pub visibility: Option<NetworkVisibility<'a>>,
    /// Whether the client sends Istio mTLS to an endpoint (none: the endpoint's own
    /// TLS mode says): decides which remote endpoints go through a gateway and which
    /// endpoints an SNI-DNAT cluster keeps.
    pub mtls: Option<&'a MtlsCheck<'a>>,
    /// Leave out endpoints that carry a hostname instead of an IP (an EDS cluster:
    /// only DNS clusters resolve names).
    pub ips_only: bool,
    /// Keep only the endpoints on this node (a service with `internalTrafficPolicy:
    /// Local`, for a client on that node; Istio's `NodeLocal`).
    pub node: Option<&'a str>,
}

/// The node an endpoint runs on: its pod's, else its `kubernetes.io/hostname` label.
fn endpoint_node(ep: &Endpoint) -> &str {
    ep.workload
        .as_deref()
        .map(|w| w.node_name.as_str())
        .filter(|n| !n.is_empty())
        .or_else(|| ep.labels.get(LABEL_HOSTNAME).map(String::as_str))
        .unwrap_or_default()
}

/// The load assignment for `cluster_name` of `service` port `port`.
pub fn load_assignment(
    cluster_name: &str,
    port: &Port,
    shards: Option<&EndpointShards>,
    options: EdsOptions,
) -> ClusterLoadAssignment {
    load_assignment_for(
        cluster_name,
        port,
        shards,
        &EndpointSelection {
            options,
            ..Default::default()
        },
    )
}

/// The load assignment for `cluster_name` of port `port`, restricted to a subset and
/// prioritised for a client as `selection` says.
pub fn load_assignment_for(
    cluster_name: &str,
    port: &Port,
    shards: Option<&EndpointShards>,
    selection: &EndpointSelection<'_>,
) -> ClusterLoadAssignment {
    let (mut cla, labels) = grouped_assignment(
        cluster_name,
        port,
        shards,
        selection,
        selection.locality_lb.is_some(),
    );
    if let Some(lb) = &selection.locality_lb {
        apply_locality_lb(&mut cla, Some(&labels), lb);
    }
    cla
}

/// The labels failoverPriority compares, per locality group of a load assignment and
/// per endpoint within it, in the assignment's order.
pub type GroupLabels = Vec<Vec<BTreeMap<String, String>>>;

/// [`load_assignment_for`] without locality load balancing, with the labels of each
/// endpoint (Istio's topology labels added), for a cluster that applies its locality
/// setting itself (DNS clusters, whose assignment is inline).
pub fn labelled_assignment(
    cluster_name: &str,
    port: &Port,
    shards: Option<&EndpointShards>,
    selection: &EndpointSelection<'_>,
) -> (ClusterLoadAssignment, GroupLabels) {
    grouped_assignment(cluster_name, port, shards, selection, true)
}

fn grouped_assignment(
    cluster_name: &str,
    port: &Port,
    shards: Option<&EndpointShards>,
    selection: &EndpointSelection<'_>,
    want_labels: bool,
) -> (ClusterLoadAssignment, GroupLabels) {
    let mut by_locality: BTreeMap<&Locality, Vec<Entry<'_>>> = BTreeMap::new();
    let split = selection.network.filter(NetworkFilter::multi_network);
    for (shard, ep) in shards.into_iter().flat_map(|s| s.iter()) {
        let Some(&target) = ep.ports.get(&port.name) else {
            continue;
        };
        if selection.options.mtls_only && !mtls_enabled(selection.mtls, ep, target) {
            continue;
        }
        if selection
            .subset
            .is_some_and(|labels| !labels.iter().all(|(k, v)| ep.labels.get(k) == Some(v)))
        {
            continue;
        }
        if selection.ips_only && ep.hostname.is_some() {
            continue;
        }
        if selection.node.is_some_and(|node| endpoint_node(ep) != node) {
            continue;
        }
        if selection.visibility.is_some_and(|v| !v.shows(ep, shard)) {
            continue;
        }
        // An endpoint without an address is only ever sent as its network's gateway,
        // to a client of another network (Istio's filterIstioEndpoint).
        if !ep.has_address()
            && split
                .is_none_or(|f| in_network(f.proxy_network, &f.view.endpoint_network(ep, shard)))
        {
            continue;
        }
        let Some(health) = health_for(ep, selection.options) else {
            continue;
        };
        let weight = ep.effective_weight();
        by_locality.entry(&ep.locality).or_default().push(Entry {
            lb: lb_endpoint(ep, target, health, weight),
            weight,
            origin: Origin::Endpoint {
                shard,
                ep,
                port: target,
            },
        });
    }
    if let Some(filter) = split {
        for entries in by_locality.values_mut() {
            *entries =
                split_horizon::split_horizon(std::mem::take(entries), &filter, selection.mtls);
        }
        by_locality.retain(|_, entries| !entries.is_empty());
    }
    let mut labels: GroupLabels = Vec::new();
    let endpoints = by_locality
        .into_iter()
        .map(|(locality, entries)| {
            if want_labels {
                labels.push(
                    entries
                        .iter()
                        .map(|e| e.labels(selection.network.as_ref()))
                        .collect(),
                );
            }
            let weight = entries
                .iter()
                .map(|e| e.weight)
                .fold(0u32, u32::saturating_add);
            LocalityLbEndpoints {
                // Always present, empty when unknown (as Istio sends it): gRPC clients
                // reject a locality group without one.
                locality: Some(EnvoyLocality {
                    region: locality.region.clone(),
                    zone: locality.zone.clone(),
                    sub_zone: locality.subzone.clone(),
                }),
                lb_endpoints: entries.into_iter().map(|e| e.lb).collect(),
                // gRPC clients ignore a locality without a weight; Envoy accepts it.
                load_balancing_weight: Some(UInt32Value {
                    value: weight.max(1),
                }),
                ..Default::default()
            }
        })
        .collect();
    let cla = ClusterLoadAssignment {
        cluster_name: cluster_name.to_string(),
        endpoints,
        ..Default::default()
    };
    (cla, labels)
}

/// One endpoint of a locality group, before encoding.
struct Entry<'a> {
    lb: LbEndpoint,
    /// Its load balancing weight (also set in `lb`).
    weight: u32,
    origin: Origin<'a>,
}

/// What an [`Entry`] stands for.
enum Origin<'a> {
    /// A workload.
    Endpoint {
        shard: &'a ShardKey,
        ep: &'a Endpoint,
        /// The port the workload listens on for the cluster's service port.
        port: u16,
    },
    /// A network gateway standing in for a remote network's workloads.
    Gateway(&'a Gateway),
}

impl Entry<'_> {
    /// The labels failoverPriority compares: the workload's (with its network placed
    /// by meshNetworks when it has none), or a gateway's cluster and network.
    fn labels(&self, network: Option<&NetworkFilter<'_>>) -> BTreeMap<String, String> {
        match &self.origin {
            Origin::Endpoint { shard, ep, .. } => {
                let cluster = if ep.cluster_id.is_empty() {
                    shard.cluster.as_str()
                } else {
                    ep.cluster_id.as_str()
                };
                let placed = network.map(|f| f.view.endpoint_network(ep, shard));
                let net = placed.as_ref().unwrap_or(&ep.network);
                augment_labels(&ep.labels, cluster, &ep.locality, net.as_str())
            }
            Origin::Gateway(g) => augment_labels(
                &BTreeMap::new(),
                g.cluster.as_str(),
                &Locality::default(),
                g.network.as_str(),
            ),
        }
    }
}

/// The input of one proxy's load assignment for a cluster, and its cache key: the
/// cluster, the service it resolves to for the proxy, the DestinationRule that applies
/// for the proxy (its subset labels, its locality load balancing) and, only where they
/// change anything, the proxy's locality with the labels failoverPriority can name
/// (when a locality setting applies), its network and IP families with the
/// PeerAuthentications (when some network has a gateway: split horizon; the policies
/// decide which remote endpoints may go through a gateway), and the networks it asked
/// to see (`REQUESTED_NETWORK_VIEW`).
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct EdsInput {
    /// The cluster name, `outbound|<port>|<subset>|<host>`.
    pub name: Arc<str>,
    /// The service the proxy reaches under the cluster's hostname; `None` when there
    /// is none (an empty placeholder assignment).
    pub service: Option<ServiceKey>,
    /// The rule in force, `(namespace, name)`.
    pub rule: Option<(String, String)>,
    /// The proxy's locality and labels, when locality load balancing applies.
    pub locality: Option<(Locality, BTreeMap<String, String>)>,
    /// The proxy's network and IP families (v4, v6), when split horizon applies.
    pub network: Option<(NetworkId, bool, bool)>,
    /// A digest of every PeerAuthentication, when split horizon applies or only
    /// mTLS endpoints are sent ([`peer_authn_digest`]): which endpoints take mTLS
    /// depends on them.
    pub peer_authn: Option<u64>,
    /// The networks the proxy asked to see (sorted, deduplicated), when it named any.
    pub network_view: Option<Vec<NetworkId>>,
    /// The proxy's node, when the service keeps to the client's node
    /// (`internalTrafficPolicy: Local`).
    pub node: Option<String>,
    pub options: EdsOptions,
}

/// The locality setting in force for `port` and `subset` under `rule`, and whether
/// failover applies (outlier detection is set); only when it changes anything.
///
/// Without a locality setting in the rule, a service's traffic distribution
/// (`PreferClose`/`PreferSameZone`, `PreferSameNode`) stands for one, as istiod's
/// `GetLocalityLbSetting`: failover by network, region and zone (then subzone and
/// node), applied even without outlier detection.
fn locality_setting(
    mesh: &MeshConfig,
    rule: Option<&DestinationRule>,
    port: u16,
    subset: &str,
    service: &meshfed_registry::Service,
) -> Option<(LocalityLoadBalancerSetting, bool)> {
    let traffic_policy = rule.and_then(|r| destination_rule::destination_policy(r, port, subset));
    let failover = traffic_policy
        .as_ref()
        .is_some_and(|p| p.outlier_detection.is_some());
    let lb = traffic_policy
        .as_ref()
        .and_then(|p| p.load_balancer.as_ref());
    match destination_rule::locality_lb_setting_for(mesh, lb, service.traffic_distribution) {
        (setting, true) => setting.map(|s| (s, true)),
        (setting, false) => setting
            .filter(|s| !s.distribute.is_empty() || failover)
            .map(|s| (s, failover)),
    }
}

/// What a proxy's load assignments read of the proxy: its namespace (the service a
/// hostname resolves to, the DestinationRule in force), its locality, labels, cluster
/// and network (locality failover priorities, split horizon), its IP families (the
/// gateways it can reach) and the networks it asked to see.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct EdsClient {
    pub namespace: String,
    pub labels: BTreeMap<String, String>,
    pub cluster_id: String,
    pub locality: Locality,
    pub network: NetworkId,
    /// The client reaches IPv4 gateways (a client without any IP reaches both).
    pub ipv4: bool,
    /// The client reaches IPv6 gateways.
    pub ipv6: bool,
    pub network_view: Option<Vec<NetworkId>>,
    /// The proxy's node (metadata `NODE_NAME`), when some service keeps to or
    /// prefers the client's node ([`ClientFactsInUse`]): elsewhere it changes nothing.
    pub node: Option<String>,
}

impl EdsClient {
    /// The facts of `proxy` in `snapshot`. Its labels count only where some locality
    /// setting orders failover by labels (`failoverPriority`): elsewhere they change
    /// nothing, and leaving them out lets the sidecars of every deployment share one
    /// answer.
    pub fn of(snapshot: &Snapshot, proxy: &Proxy) -> EdsClient {
        let in_use = snapshot.cached(ClientFactsInUse).unwrap_or(FactsInUse {
            labels: true,
            node: true,
        });
        let labels = if in_use.labels {
            proxy.labels.clone()
        } else {
            BTreeMap::new()
        };
        let ipv4 = proxy.ip_addresses.iter().any(|ip| ip.is_ipv4());
        let ipv6 = proxy.ip_addresses.iter().any(|ip| ip.is_ipv6());
        let none = !ipv4 && !ipv6;
        EdsClient {
            namespace: proxy.namespace.clone(),
            labels,
            cluster_id: proxy
                .cluster_id
                .as_ref()
                .map_or_else(String::new, |c| c.as_str().to_string()),
            locality: proxy.locality.clone(),
            network: proxy.network.clone(),
            ipv4: ipv4 || none,
            ipv6: ipv6 || none,
            network_view: proxy.requested_network_view(),
            node: in_use.node.then(|| {
                proxy
                    .metadata
                    .get("NODE_NAME")
                    .and_then(|v| v.as_str())
                    .unwrap_or_default()
                    .to_string()
            }),
        }
    }
}

impl EdsInput {
    /// What `proxy`'s assignment of cluster `name` (parsed: `cluster`) depends on.
    pub fn for_proxy(
        snapshot: &Snapshot,
        proxy: &Proxy,
        name: &str,
        cluster: &ClusterName<'_>,
        options: EdsOptions,
    ) -> EdsInput {
        EdsInput::for_client(
            snapshot,
            &EdsClient::of(snapshot, proxy),
            name,
            cluster,
            options,
        )
    }

    /// What `client`'s assignment of cluster `name` (parsed: `cluster`) depends on.
    pub fn for_client(
        snapshot: &Snapshot,
        client: &EdsClient,
        name: &str,
        cluster: &ClusterName<'_>,
        options: EdsOptions,
    ) -> EdsInput {
        let service = snapshot
            .services()
            .resolve(cluster.hostname, &client.namespace)
            .filter(|s| s.port(cluster.port).is_some());
        let rule = service.and_then(|s| {
            snapshot.config().destination_rule(
                &client.namespace,
                s.namespace.as_str(),
                s.hostname.as_str(),
            )
        });
        // A subset the rule in force does not define: nothing to send.
        let subset_ok = cluster.subset.is_empty()
            || rule.is_some_and(|r| destination_rule::subset(&r.spec, cluster.subset).is_some());
        let service = service.filter(|_| subset_ok);
        let locality = service.and_then(|service| {
            let (setting, failover) = locality_setting(
                &snapshot.mesh().config,
                rule.map(|r| &r.spec),
                cluster.port,
                cluster.subset,
                service,
            )?;
            let labels = if failover
                && setting.distribute.is_empty()
                && !setting.failover_priority.is_empty()
            {
                let mut labels = augment_labels(
                    &client.labels,
                    &client.cluster_id,
                    &client.locality,
                    client.network.as_str(),
                );
                // Istio's proxy labels carry the proxy's node (`PreferSameNode`).
                if let Some(node) = client.node.as_ref().filter(|n| !n.is_empty()) {
                    labels
                        .entry(LABEL_HOSTNAME.to_string())
                        .or_insert_with(|| node.clone());
                }
                labels
            } else {
                BTreeMap::new()
            };
            Some((client.locality.clone(), labels))
        });
        let network = (service.is_some() && snapshot.network_view().has_gateways())
            .then(|| (client.network.clone(), client.ipv4, client.ipv6));
        let options = EdsOptions {
            mtls_only: cluster.sni_dnat,
            ..options
        };
        let peer_authn = (service.is_some() && (network.is_some() || options.mtls_only))
            .then(|| peer_authn_digest(snapshot));
        let network_view = service.and_then(|_| client.network_view.clone());
        let node = service
            .filter(|s| s.node_local)
            .map(|_| client.node.clone().unwrap_or_default());
        EdsInput {
            name: Arc::from(name),
            service: service.map(|s| s.key()),
            rule: service
                .and(rule)
                .map(|r| (r.namespace.clone(), r.name.clone())),
            locality,
            network,
            peer_authn,
            network_view,
            node,
            options,
        }
    }
}

/// Which of a client's facts any load assignment of the snapshot reads, computed once
/// per snapshot: its labels only where some locality setting orders failover by
/// labels (`failoverPriority` in the mesh's or any DestinationRule's setting, top
/// level, per port, per subset, or a service's traffic distribution); its node only
/// where some service keeps to (`internalTrafficPolicy: Local`) or prefers
/// (`PreferSameNode`) the client's node.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct ClientFactsInUse;

/// What [`ClientFactsInUse`] finds.
#[derive(Clone, Copy, Debug)]
pub struct FactsInUse {
    pub labels: bool,
    pub node: bool,
}

impl CacheInput<Snapshot> for ClientFactsInUse {
    const TYPE: TypeUrl = TypeUrl::Endpoint;
    type Output = FactsInUse;
    fn class(&self) -> Option<ProxyClass> {
        None
    }
    fn generate(&self, snapshot: &Snapshot) -> Option<FactsInUse> {
        use meshfed_api::networking::v1alpha3::TrafficPolicy;
        let by_priority = |s: Option<&LocalityLoadBalancerSetting>| {
            s.is_some_and(|s| !s.failover_priority.is_empty())
        };
        let policy = |p: &TrafficPolicy| {
            let lb = |lb: Option<&meshfed_api::networking::v1alpha3::LoadBalancerSettings>| {
                by_priority(lb.and_then(|lb| lb.locality_lb_setting.as_ref()))
            };
            lb(p.load_balancer.as_ref())
                || p.port_level_settings
                    .iter()
                    .any(|port| lb(port.load_balancer.as_ref()))
        };
        let in_rules = snapshot.config().all_destination_rules().iter().any(|r| {
            r.spec.traffic_policy.as_ref().is_some_and(policy)
                || r.spec
                    .subsets
                    .iter()
                    .any(|s| s.traffic_policy.as_ref().is_some_and(policy))
        });
        let services = snapshot.services().all();
        let by_distribution = services.iter().any(|s| !s.traffic_distribution.is_any());
        Some(FactsInUse {
            labels: in_rules
                || by_distribution
                || by_priority(snapshot.mesh().config.locality_lb_setting.as_ref()),
            node: services.iter().any(|s| {
                s.node_local
                    || s.traffic_distribution
                        == meshfed_registry::TrafficDistribution::PreferSameNode
            }),
        })
    }
}

/// A set of cluster names in a cache key, compared by identity: connections that ask
/// for the same names share one interned set (held, so its address is never reused
/// while the key lives).
#[derive(Clone, Debug)]
pub struct SharedNames(pub Arc<std::collections::BTreeSet<String>>);

impl PartialEq for SharedNames {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for SharedNames {}

impl std::hash::Hash for SharedNames {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        Arc::as_ptr(&self.0).hash(state);
    }
}

/// Every load assignment a client asks for by name, in name order: the answer to a
/// whole EDS subscription, built once per distinct client and name set. Sidecars of
/// one namespace and labels that watch the same clusters (every unscoped sidecar of a
/// deployment) then share one walk of the names instead of a cache look-up per
/// cluster each. Each assignment still comes from its own [`EdsInput`], so an
/// endpoint change regenerates only the assignments of the services it touched.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct EdsListInput {
    pub client: EdsClient,
    pub names: SharedNames,
    pub options: EdsOptions,
}

impl CacheInput<Snapshot> for EdsListInput {
    const TYPE: TypeUrl = TypeUrl::Endpoint;
    type Output = Arc<[Resource]>;
    fn class(&self) -> Option<ProxyClass> {
        None
    }
    fn generate(&self, snapshot: &Snapshot) -> Option<Arc<[Resource]>> {
        let list: Vec<Resource> = self
            .names
            .0
            .iter()
            .filter_map(|name| {
                let parsed = ClusterName::parse(name)?;
                let input =
                    EdsInput::for_client(snapshot, &self.client, name, &parsed, self.options);
                snapshot.cached(input)
            })
            .collect();
        Some(list.into())
    }
}

impl CacheInput<Snapshot> for EdsInput {
    const TYPE: TypeUrl = TypeUrl::Endpoint;
    type Output = Resource;
    fn class(&self) -> Option<ProxyClass> {
        None
    }
    fn service(&self) -> Option<&str> {
        Some(host_of(&self.name))
    }

    /// Builds the assignment from this input and the snapshot's indexes alone.
    fn generate(&self, snapshot: &Snapshot) -> Option<Resource> {
        let found = self.service.as_ref().and_then(|key| {
            let service = snapshot.services().get(key)?;
            let cluster = ClusterName::parse(&self.name)?;
            let port = service.port(cluster.port)?;
            let rule = self
                .rule
                .as_ref()
                .and_then(|(ns, name)| snapshot.config().destination_rule_by_name(ns, name));
            let subset_labels = if cluster.subset.is_empty() {
                None
            } else {
                Some(
                    destination_rule::subset(&rule?.spec, cluster.subset)?
                        .labels
                        .clone(),
                )
            };
            let view = AssignmentView {
                subset_labels,
                locality_lb: self.locality.as_ref().and_then(|(locality, labels)| {
                    let (setting, failover) = locality_setting(
                        &snapshot.mesh().config,
                        rule.map(|r| &r.spec),
                        cluster.port,
                        cluster.subset,
                        service,
                    )?;
                    Some((setting, failover, locality.clone(), labels.clone()))
                }),
                network: self
                    .network
                    .as_ref()
                    .map(|(n, v4, v6)| (n.clone(), *v4, *v6)),
                networks: snapshot.network_view().clone(),
                visible: self.network_view.clone(),
                mtls_rule: rule.and_then(|r| rule_tls_mode(&r.spec, cluster.subset, cluster.port)),
                node: self.node.clone(),
            };
            Some((service, port, view))
        });
        match found {
            Some((service, port, view)) => {
                let shards = snapshot.shards(&service.key()).map(|s| &**s);
                let peer_disabled = |namespace: &str, labels: &BTreeMap<String, String>, port| {
                    super::authn::workload_mtls(snapshot, namespace, labels).port_mode(port)
                        == super::authn::MtlsMode::Disable
                };
                let check = MtlsCheck {
                    rule: view.mtls_rule,
                    namespace: service.namespace.as_str(),
                    peer_disabled: &peer_disabled,
                };
                let mtls = self.peer_authn.is_some().then_some(&check);
                let cla = load_assignment_for(
                    &self.name,
                    port,
                    shards,
                    &view.selection(self.options, mtls),
                );
                Some(EncodedResource::encode(
                    TypeUrl::Endpoint,
                    self.name.clone(),
                    &cla,
                ))
            }
            // A watched cluster whose service, port or subset is gone gets an empty
            // assignment (a placeholder, see EncodedResource), so a SotW client never
            // waits on it.
            None => {
                let empty = ClusterLoadAssignment {
                    cluster_name: self.name.to_string(),
                    ..Default::default()
                };
                Some(EncodedResource::encode_placeholder(
                    TypeUrl::Endpoint,
                    self.name.clone(),
                    &empty,
                ))
            }
        }
    }
}

/// What an [`EdsInput`] comes to against the snapshot: the subset's labels, the
/// locality setting with the client's locality and labels, the split-horizon view.
#[derive(Clone, Debug)]
struct AssignmentView {
    subset_labels: Option<BTreeMap<String, String>>,
    locality_lb: Option<(
        LocalityLoadBalancerSetting,
        bool,
        Locality,
        BTreeMap<String, String>,
    )>,
    /// Split horizon: the proxy's network and IP families (v4, v6).
    network: Option<(NetworkId, bool, bool)>,
    /// The mesh's networks and gateways.
    networks: Arc<NetworkView>,
    /// The networks the proxy asked to see.
    visible: Option<Vec<NetworkId>>,
    /// The TLS mode the DestinationRule sets for the cluster (`Some(true)`: Istio
    /// mTLS).
    mtls_rule: Option<bool>,
    /// The client's node, for a node-local service.
    node: Option<String>,
}

impl AssignmentView {
    /// The selection to build the assignment with.
    pub fn selection<'a>(
        &'a self,
        options: EdsOptions,
        mtls: Option<&'a MtlsCheck<'a>>,
    ) -> EndpointSelection<'a> {
        EndpointSelection {
            options,
            subset: self.subset_labels.as_ref(),
            locality_lb: self.locality_lb.as_ref().map(
                |(setting, failover, proxy_locality, proxy_labels)| LocalityLb {
                    setting,
                    proxy_locality,
                    proxy_labels,
                    failover: *failover,
                },
            ),
            network: self
                .network
                .as_ref()
                .map(|(proxy_network, ipv4, ipv6)| NetworkFilter {
                    view: &self.networks,
                    proxy_network,
                    ipv4: *ipv4,
                    ipv6: *ipv6,
                }),
            visibility: self.visible.as_deref().map(|networks| NetworkVisibility {
                view: &self.networks,
                networks,
            }),
            mtls,
            ips_only: true,
            node: self.node.as_deref(),
        }
    }
}

/// A digest of every PeerAuthentication of `snapshot` (namespace, name, creation time
/// and spec), computed once per snapshot: the part of an [`EdsInput`] that changes
/// when any of them does.
pub fn peer_authn_digest(snapshot: &Snapshot) -> u64 {
    struct Digest(u64);
    snapshot
        .derived(|snapshot| {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            for pa in snapshot.config().peer_authentications() {
                (&pa.namespace, &pa.name, pa.creation_time).hash(&mut h);
                format!("{:?}", pa.spec).hash(&mut h);
            }
            Digest(h.finish())
        })
        .0
}

/// Envoy health for an endpoint, or `None` when it must not be sent.
fn health_for(ep: &Endpoint, options: EdsOptions) -> Option<EnvoyHealth> {
    match ep.health {
        HealthStatus::Healthy => Some(EnvoyHealth::Healthy),
        HealthStatus::Unhealthy if options.send_unhealthy => Some(EnvoyHealth::Unhealthy),
        HealthStatus::Draining if options.send_unhealthy => Some(EnvoyHealth::Draining),
        HealthStatus::Unhealthy | HealthStatus::Draining | HealthStatus::Terminating => None,
    }
}

fn lb_endpoint(ep: &Endpoint, port: u16, health: EnvoyHealth, weight: u32) -> LbEndpoint {
    LbEndpoint {
        host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(EnvoyEndpoint {
            // DNS endpoints carry a hostname for Envoy to resolve.
            address: Some(socket(ep.connect_address(), port)),
            ..Default::default()
        })),
        health_status: health as i32,
        load_balancing_weight: Some(UInt32Value { value: weight }),
        metadata: Some(tls_mode_metadata(ep.tls_mode.as_str())),
    }
}

/// A TCP socket address.
pub fn socket(address: String, port: u16) -> Address {
    Address {
        address: Some(address::Address::SocketAddress(SocketAddress {
            address,
            port_specifier: Some(socket_address::PortSpecifier::PortValue(u32::from(port))),
            ..Default::default()
        })),
    }
}

/// `envoy.transport_socket_match: {tlsMode: ...}`: how Istio tells the client whether
/// the endpoint takes Istio mTLS.
fn tls_mode_metadata(mode: &str) -> Metadata {
    let fields = [(
        "tlsMode".to_string(),
        Value {
            kind: Some(value::Kind::StringValue(mode.to_string())),
        },
    )];
    Metadata {
        filter_metadata: crate::generate::proto::stable_map([(
            "envoy.transport_socket_match".to_string(),
            crate::generate::proto::stable_struct(fields),
        )]),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use meshfed_api::networking::v1alpha3::locality_load_balancer_setting::{Distribute, Failover};
    use meshfed_registry::{Protocol, ProviderId, ShardKey, TlsMode};

    use super::*;

    fn shards(eps: Vec<Endpoint>, other: Vec<Endpoint>) -> EndpointShards {
        let mut s = EndpointShards::default();
        s.shards
            .insert(ShardKey::new(ProviderId::Kubernetes, "c1"), eps.into());
        s.shards
            .insert(ShardKey::new(ProviderId::Kubernetes, "c2"), other.into());
        s
    }

    fn ep(ip: &str, locality: &str, weight: u32) -> Endpoint {
        let mut e = Endpoint::new(ip.parse().unwrap()).with_port("http", 8080);
        e.locality = Locality::parse(locality);
        e.weight = weight;
        e
    }

    #[test]
    fn groups_by_locality_sums_weights_and_merges_shards() {
        let port = Port::new("http", 80, Protocol::Http).unwrap();
        let mut unhealthy = ep("10.0.0.9", "r1/z1", 1);
        unhealthy.health = HealthStatus::Unhealthy;
        let mut other_port = Endpoint::new("10.0.0.8".parse().unwrap()).with_port("grpc", 9090);
        other_port.locality = Locality::parse("r1/z1");
        let s = shards(
            vec![
                ep("10.0.0.1", "r1/z1", 2),
                ep("10.0.0.2", "r1/z2", 0),
                unhealthy.clone(),
                other_port,
            ],
            vec![ep("10.1.0.1", "r1/z1", 3)],
        );
        let cla = load_assignment(
            "outbound|80||a.ns.svc.cluster.local",
            &port,
            Some(&s),
            EdsOptions::default(),
        );
        assert_eq!(cla.endpoints.len(), 2);
        let z1 = &cla.endpoints[0];
        assert_eq!(z1.locality.as_ref().unwrap().zone, "z1");
        assert_eq!(
            z1.lb_endpoints.len(),
            2,
            "both shards, without the unhealthy one or the other port's"
        );
        assert_eq!(z1.load_balancing_weight.unwrap().value, 5);
        assert_eq!(
            cla.endpoints[1].load_balancing_weight.unwrap().value,
            1,
            "weight 0 counts as 1"
        );

        let cla = load_assignment(
            "x",
            &port,
            Some(&s),
            EdsOptions {
                send_unhealthy: true,
                ..Default::default()
            },
        );
        let unhealthy_sent = cla.endpoints[0]
            .lb_endpoints
            .iter()
            .filter(|e| e.health_status == EnvoyHealth::Unhealthy as i32);
        assert_eq!(unhealthy_sent.count(), 1);
        assert!(
            load_assignment("x", &port, None, EdsOptions::default())
                .endpoints
                .is_empty()
        );
    }

    fn localities(cla: &ClusterLoadAssignment) -> Vec<(String, u32, u32, usize)> {
        cla.endpoints
            .iter()
            .map(|g| {
                let l = g.locality.clone().unwrap_or_default();
                (
                    format!("{}/{}/{}", l.region, l.zone, l.sub_zone),
                    g.priority,
                    g.load_balancing_weight.map_or(0, |w| w.value),
                    g.lb_endpoints.len(),
                )
            })
            .collect()
    }

    fn spread() -> EndpointShards {
        shards(
            vec![
                ep("10.0.0.1", "r1/z1/s1", 1),
                ep("10.0.0.2", "r1/z1/s2", 1),
                ep("10.0.0.3", "r1/z2", 1),
                ep("10.0.0.4", "r2/z1", 1),
            ],
            vec![ep("10.0.0.5", "r3/z1", 1)],
        )
    }

    #[test]
    fn subsets_keep_only_endpoints_with_their_labels() {
        let port = Port::new("http", 80, Protocol::Http).unwrap();
        let mut v1 = ep("10.0.0.1", "r1/z1", 1);
        v1.labels.insert("version".into(), "v1".into());
        v1.labels.insert("app".into(), "reviews".into());
        let mut v2 = ep("10.0.0.2", "r1/z1", 1);
        v2.labels.insert("version".into(), "v2".into());
        let s = shards(vec![v1, v2], vec![]);
        let labels = BTreeMap::from([("version".to_string(), "v1".to_string())]);
        let cla = load_assignment_for(
            "outbound|80|v1|a",
            &port,
            Some(&s),
            &EndpointSelection {
                subset: Some(&labels),
                ..Default::default()
            },
        );
        assert_eq!(cla.cluster_name, "outbound|80|v1|a");
        assert_eq!(localities(&cla), vec![("r1/z1/".into(), 0, 1, 1)]);
    }

    #[test]
    fn locality_failover_priorities_by_proximity() {
        let port = Port::new("http", 80, Protocol::Http).unwrap();
        let s = spread();
        let setting = LocalityLoadBalancerSetting::default();
        let client = Locality::parse("r1/z1/s1");
        let no_labels = BTreeMap::new();
        let lb = |failover: bool| EndpointSelection {
            locality_lb: Some(LocalityLb {
                setting: &setting,
                proxy_locality: &client,
                proxy_labels: &no_labels,
                failover,
            }),
            ..Default::default()
        };
        let cla = load_assignment_for("c", &port, Some(&s), &lb(true));
        assert_eq!(
            localities(&cla),
            vec![
                ("r1/z1/s1".into(), 0, 1, 1),
                ("r1/z1/s2".into(), 1, 1, 1),
                ("r1/z2/".into(), 2, 1, 1),
                ("r2/z1/".into(), 3, 1, 1),
                ("r3/z1/".into(), 3, 1, 1),
            ]
        );
        let cla = load_assignment_for("c", &port, Some(&s), &lb(false));
        assert!(
            cla.endpoints.iter().all(|g| g.priority == 0),
            "no outlier detection, no failover"
        );
        // failover r1 -> r3: other regions drop below r3 (and priorities stay dense).
        let setting = LocalityLoadBalancerSetting {
            failover: vec![Failover {
                from: "r1".into(),
                to: "r3".into(),
            }],
            ..Default::default()
        };
        let sel = EndpointSelection {
            locality_lb: Some(LocalityLb {
                setting: &setting,
                proxy_locality: &client,
                proxy_labels: &no_labels,
                failover: true,
            }),
            ..Default::default()
        };
        let cla = load_assignment_for("c", &port, Some(&s), &sel);
        let prio: Vec<(String, u32)> = localities(&cla).into_iter().map(|l| (l.0, l.1)).collect();
        assert_eq!(
            prio,
            vec![
                ("r1/z1/s1".into(), 0),
                ("r1/z1/s2".into(), 1),
                ("r1/z2/".into(), 2),
                ("r2/z1/".into(), 4),
                ("r3/z1/".into(), 3),
            ]
        );
    }

    #[test]
    fn locality_distribute_reweights_and_drops_the_rest() {
        let port = Port::new("http", 80, Protocol::Http).unwrap();
        let s = spread();
        let setting = LocalityLoadBalancerSetting {
            distribute: vec![
                Distribute {
                    from: "r9/*".into(),
                    to: BTreeMap::from([("r9/*".to_string(), 100)]),
                },
                Distribute {
                    from: "r1/z1/*".into(),
                    to: BTreeMap::from([("r1/z1/*".to_string(), 80), ("r2/*".to_string(), 20)]),
                },
            ],
            ..Default::default()
        };
        let client = Locality::parse("r1/z1/s2");
        let no_labels = BTreeMap::new();
        let sel = EndpointSelection {
            locality_lb: Some(LocalityLb {
                setting: &setting,
                proxy_locality: &client,
                proxy_labels: &no_labels,
                failover: false,
            }),
            ..Default::default()
        };
        let cla = load_assignment_for("c", &port, Some(&s), &sel);
        assert_eq!(
            localities(&cla),
            vec![
                ("r1/z1/s1".into(), 0, 40, 1),
                ("r1/z1/s2".into(), 0, 40, 1),
                ("r1/z2/".into(), 0, 1, 0),
                ("r2/z1/".into(), 0, 20, 1),
                ("r3/z1/".into(), 0, 1, 0),
            ],
            "80 shared by the two r1/z1 subzones, 20 for r2, nothing elsewhere"
        );
    }

    #[test]
    fn failover_priority_labels_split_localities() {
        let port = Port::new("http", 80, Protocol::Http).unwrap();
        let mut same = ep("10.0.0.1", "r1/z1", 1);
        same.network = "n1".into();
        same.labels.insert("tier".into(), "gold".into());
        let mut other_network = ep("10.0.0.2", "r1/z1", 1);
        other_network.network = "n2".into();
        other_network.labels.insert("tier".into(), "gold".into());
        let mut other_tier = ep("10.0.0.3", "r1/z1", 1);
        other_tier.network = "n1".into();
        other_tier.labels.insert("tier".into(), "silver".into());
        let s = shards(vec![same, other_network, other_tier], vec![]);
        let setting = LocalityLoadBalancerSetting {
            failover_priority: vec![LABEL_NETWORK.into(), "tier=gold".into()],
            ..Default::default()
        };
        let client = Locality::parse("r1/z1");
        let client_labels = augment_labels(&BTreeMap::new(), "c1", &client, "n1");
        let sel = EndpointSelection {
            locality_lb: Some(LocalityLb {
                setting: &setting,
                proxy_locality: &client,
                proxy_labels: &client_labels,
                failover: true,
            }),
            ..Default::default()
        };
        let cla = load_assignment_for("c", &port, Some(&s), &sel);
        let groups: Vec<(u32, Vec<String>)> = cla
            .endpoints
            .iter()
            .map(|g| {
                (
                    g.priority,
                    g.lb_endpoints
                        .iter()
                        .map(|e| match &e.host_identifier {
                            Some(lb_endpoint::HostIdentifier::Endpoint(ep)) => {
                                match &ep.address.as_ref().unwrap().address {
                                    Some(address::Address::SocketAddress(a)) => a.address.clone(),
                                    _ => unreachable!(),
                                }
                            }
                            _ => unreachable!(),
                        })
                        .collect(),
                )
            })
            .collect();
        assert_eq!(
            groups,
            vec![
                (0, vec!["10.0.0.1".to_string()]),
                (1, vec!["10.0.0.3".to_string()]),
                (2, vec!["10.0.0.2".to_string()]),
            ],
            "same network and tier first, then same network, then the rest"
        );
    }

    // ---- split horizon (reference §6.4; test vectors of §6.5) ----

    use meshfed_registry::{NetworkGateway, NetworkId};

    /// A gateway `ip:15443` into `network`, in `cluster`.
    fn gateway(network: &str, cluster: &str, ip: &str) -> NetworkGateway {
        NetworkGateway {
            network: network.into(),
            cluster: cluster.into(),
            address: ip.parse().unwrap(),
            port: 15443,
            source: "test".into(),
        }
    }

    fn view(gateways: &[NetworkGateway]) -> NetworkView {
        NetworkView::new(&Default::default(), gateways)
    }

    /// An endpoint on `network` in cluster `cluster`, taking Istio mTLS or not.
    fn net_ep(ip: &str, network: &str, cluster: &str, tls: TlsMode) -> Endpoint {
        let mut e = ep(ip, "r1/z1", 1);
        e.network = network.into();
        e.cluster_id = cluster.into();
        e.tls_mode = tls;
        e
    }

    /// The test setup of §6.5: 2 endpoints in N1, 3 in N2 (one locality).
    fn two_networks(n2_tls: TlsMode) -> EndpointShards {
        shards(
            vec![
                net_ep("10.0.0.1", "N1", "c1", TlsMode::Istio),
                net_ep("10.0.0.2", "N1", "c1", TlsMode::Istio),
            ],
            vec![
                net_ep("10.1.0.1", "N2", "c2", n2_tls),
                net_ep("10.1.0.2", "N2", "c2", n2_tls),
                net_ep("10.1.0.3", "N2", "c2", n2_tls),
            ],
        )
    }

    /// `(address:port, weight, tlsMode)` of every endpoint, and every locality weight.
    fn split(
        shards: &EndpointShards,
        view: &NetworkView,
        proxy_network: &str,
        ips: &[&str],
    ) -> (Vec<(String, u32, String)>, Vec<u32>) {
        let port = Port::new("http", 80, Protocol::Http).unwrap();
        let proxy_network = NetworkId::new(proxy_network);
        let filter = NetworkFilter {
            view,
            proxy_network: &proxy_network,
            ipv4: ips.iter().any(|ip| ip.contains('.')),
            ipv6: ips.iter().any(|ip| ip.contains(':')),
        };
        let cla = load_assignment_for(
            "outbound|80||a.ns.svc.cluster.local",
            &port,
            Some(shards),
            &EndpointSelection {
                network: Some(filter),
                ..Default::default()
            },
        );
        let endpoints = cla
            .endpoints
            .iter()
            .flat_map(|g| &g.lb_endpoints)
            .map(|e| {
                let Some(lb_endpoint::HostIdentifier::Endpoint(ep)) = &e.host_identifier else {
                    unreachable!()
                };
                let Some(address::Address::SocketAddress(a)) =
                    &ep.address.as_ref().unwrap().address
                else {
                    unreachable!()
                };
                let Some(socket_address::PortSpecifier::PortValue(port)) = a.port_specifier else {
                    unreachable!()
                };
                let tls =
                    e.metadata.as_ref().unwrap().filter_metadata["envoy.transport_socket_match"]
                        .fields["tlsMode"]
                        .kind
                        .clone();
                let Some(value::Kind::StringValue(tls)) = tls else {
                    unreachable!()
                };
                (
                    format!("{}:{port}", a.address),
                    e.load_balancing_weight.unwrap().value,
                    tls,
                )
            })
            .collect();
        let localities = cla
            .endpoints
            .iter()
            .map(|g| g.load_balancing_weight.unwrap().value)
            .collect();
        (endpoints, localities)
    }

    fn row(address: &str, weight: u32, tls: &str) -> (String, u32, String) {
        (address.to_string(), weight, tls.to_string())
    }

    #[test]
    fn vector_one_gateway_carries_the_remote_endpoints() {
        // Proxy in N1; 2 endpoints in N1, 3 in N2 (tlsMode istio); N2 has one gateway
        // G(1.1.1.1:15443), lcm=1 -> EDS = [ep1 w1, ep2 w1, G w3].
        let v = view(&[gateway("N2", "c2", "1.1.1.1")]);
        assert_eq!(v.lcm(), 1);
        let (eps, localities) = split(&two_networks(TlsMode::Istio), &v, "N1", &["10.0.0.9"]);
        assert_eq!(
            eps,
            vec![
                row("10.0.0.1:8080", 1, "istio"),
                row("10.0.0.2:8080", 1, "istio"),
                row("1.1.1.1:15443", 3, "istio"),
            ]
        );
        assert_eq!(localities, vec![5], "locality weight = sum");
    }

    #[test]
    fn vector_two_gateways_scale_by_the_lcm() {
        // Same with N2 having gateways G1, G2 (lcm=2) -> [ep1 w2, ep2 w2, G1 w3, G2 w3].
        let v = view(&[
            gateway("N2", "c2", "1.1.1.1"),
            gateway("N2", "c2", "1.1.1.2"),
        ]);
        assert_eq!(v.lcm(), 2);
        let (eps, localities) = split(&two_networks(TlsMode::Istio), &v, "N1", &["10.0.0.9"]);
        assert_eq!(
            eps,
            vec![
                row("10.0.0.1:8080", 2, "istio"),
                row("10.0.0.2:8080", 2, "istio"),
                row("1.1.1.1:15443", 3, "istio"),
                row("1.1.1.2:15443", 3, "istio"),
            ]
        );
        assert_eq!(localities, vec![10]);
    }

    #[test]
    fn vector_remote_endpoints_without_mtls_are_dropped() {
        // Same but N2 endpoints tlsMode=disabled -> [ep1, ep2] only.
        let v = view(&[gateway("N2", "c2", "1.1.1.1")]);
        let (eps, _) = split(&two_networks(TlsMode::Disabled), &v, "N1", &["10.0.0.9"]);
        assert_eq!(
            eps,
            vec![
                row("10.0.0.1:8080", 1, "istio"),
                row("10.0.0.2:8080", 1, "istio")
            ]
        );
    }

    #[test]
    fn vector_without_gateways_every_endpoint_is_direct() {
        // Same but no gateways anywhere -> all 5 endpoints direct.
        let (eps, localities) = split(
            &two_networks(TlsMode::Istio),
            &view(&[]),
            "N1",
            &["10.0.0.9"],
        );
        let addresses: Vec<&str> = eps.iter().map(|e| e.0.as_str()).collect();
        assert_eq!(
            addresses,
            [
                "10.0.0.1:8080",
                "10.0.0.2:8080",
                "10.1.0.1:8080",
                "10.1.0.2:8080",
                "10.1.0.3:8080"
            ]
        );
        assert!(eps.iter().all(|e| e.1 == 1));
        assert_eq!(localities, vec![5]);
    }

    #[test]
    fn vector_a_proxy_without_network_uses_the_gateway() {
        // Proxy with empty NETWORK and endpoints in N2 with gateway -> gateway used.
        let v = view(&[gateway("N2", "c2", "1.1.1.1")]);
        let (eps, _) = split(&two_networks(TlsMode::Istio), &v, "", &["10.0.0.9"]);
        assert_eq!(
            eps,
            vec![
                row("10.0.0.1:8080", 1, "istio"),
                row("10.0.0.2:8080", 1, "istio"),
                row("1.1.1.1:15443", 3, "istio"),
            ],
            "N1 has no gateway, so its endpoints stay direct"
        );
    }

    #[test]
    fn the_mirror_view_from_the_other_network() {
        // A proxy in N2 with gateways in both networks: N1's endpoints go through N1's
        // gateway; N2's own are direct. lcm = 2 (N1 has two gateways).
        let v = view(&[
            gateway("N1", "c1", "2.2.2.1"),
            gateway("N1", "c1", "2.2.2.2"),
            gateway("N2", "c2", "1.1.1.1"),
        ]);
        let (eps, localities) = split(&two_networks(TlsMode::Istio), &v, "N2", &["10.1.0.9"]);
        assert_eq!(
            eps,
            vec![
                row("10.1.0.1:8080", 2, "istio"),
                row("10.1.0.2:8080", 2, "istio"),
                row("10.1.0.3:8080", 2, "istio"),
                row("2.2.2.1:15443", 2, "istio"),
                row("2.2.2.2:15443", 2, "istio"),
            ]
        );
        assert_eq!(localities, vec![10]);
    }

    #[test]
    fn a_remote_network_without_gateway_is_sent_direct() {
        // N3 has no gateway (only N2 does): its endpoints are sent as if flat.
        let s = shards(
            vec![net_ep("10.0.0.1", "N1", "c1", TlsMode::Istio)],
            vec![net_ep("10.3.0.1", "N3", "c3", TlsMode::Disabled)],
        );
        let v = view(&[gateway("N2", "c2", "1.1.1.1")]);
        let (eps, _) = split(&s, &v, "N1", &["10.0.0.9"]);
        assert_eq!(
            eps,
            vec![
                row("10.0.0.1:8080", 1, "istio"),
                row("10.3.0.1:8080", 1, "disabled")
            ]
        );
    }

    #[test]
    fn endpoint_weights_split_among_gateways_and_scale() {
        // Weighted endpoints: 3 and 1 in N2 behind two gateways (lcm 2): 2*(3+1)/2 = 4
        // each; the local endpoint of weight 5 becomes 10.
        let mut local = net_ep("10.0.0.1", "N1", "c1", TlsMode::Istio);
        local.weight = 5;
        let mut heavy = net_ep("10.1.0.1", "N2", "c2", TlsMode::Istio);
        heavy.weight = 3;
        let light = net_ep("10.1.0.2", "N2", "c2", TlsMode::Istio);
        let s = shards(vec![local], vec![heavy, light]);
        let v = view(&[
            gateway("N2", "c2", "1.1.1.2"),
            gateway("N2", "c2", "1.1.1.1"),
        ]);
        let (eps, localities) = split(&s, &v, "N1", &["10.0.0.9"]);
        assert_eq!(
            eps,
            vec![
                row("10.0.0.1:8080", 10, "istio"),
                row("1.1.1.1:15443", 4, "istio"),
                row("1.1.1.2:15443", 4, "istio"),
            ],
            "gateways sorted by address"
        );
        assert_eq!(localities, vec![18]);
    }

    #[test]
    fn gateways_of_the_endpoint_cluster_come_first_and_families_filter() {
        // N2 spans c2 (IPv4 gateway) and c3 (IPv6 gateway). c2's endpoints use c2's
        // gateway only; an IPv6-only proxy cannot reach it, so they are dropped.
        let s = shards(
            vec![net_ep("10.0.0.1", "N1", "c1", TlsMode::Istio)],
            vec![
                net_ep("10.1.0.1", "N2", "c2", TlsMode::Istio),
                net_ep("10.1.0.2", "N2", "c3", TlsMode::Istio),
            ],
        );
        let v = view(&[
            gateway("N2", "c2", "1.1.1.1"),
            gateway("N2", "c3", "fd00::1"),
        ]);
        // (N2): 2, (N2,c2): 1, (N2,c3): 1 -> lcm 2.
        assert_eq!(v.lcm(), 2);
        let (v4, _) = split(&s, &v, "N1", &["10.0.0.9"]);
        assert_eq!(
            v4,
            vec![
                row("10.0.0.1:8080", 2, "istio"),
                row("1.1.1.1:15443", 2, "istio")
            ],
            "c3's endpoint needs an IPv6 gateway: dropped for an IPv4-only proxy"
        );
        let (v6, _) = split(&s, &v, "N1", &["fd00::9"]);
        assert_eq!(
            v6,
            vec![
                row("10.0.0.1:8080", 2, "istio"),
                row("fd00::1:15443", 2, "istio")
            ]
        );
        let (dual, localities) = split(&s, &v, "N1", &["10.0.0.9", "fd00::9"]);
        assert_eq!(dual.len(), 3);
        assert_eq!(localities, vec![6]);
    }

    #[test]
    fn endpoints_without_a_network_and_mesh_networks_placement() {
        use meshfed_api::mesh::v1alpha1::MeshNetworks;
        // An endpoint with no network label is placed by meshNetworks fromRegistry.
        let networks: MeshNetworks = serde_json::from_value(serde_json::json!({
            "networks": {
                "N2": {"endpoints": [{"fromRegistry": "c2"}], "gateways": [{"address": "1.1.1.1", "port": 15443}]},
            }
        }))
        .unwrap();
        let v = NetworkView::new(&networks, &[]);
        let s = shards(
            vec![net_ep("10.0.0.1", "", "c1", TlsMode::Istio)],
            vec![net_ep("10.1.0.1", "", "c2", TlsMode::Istio)],
        );
        let (eps, _) = split(&s, &v, "N1", &["10.0.0.9"]);
        assert_eq!(
            eps,
            vec![
                row("10.0.0.1:8080", 1, "istio"),
                row("1.1.1.1:15443", 1, "istio")
            ],
            "c1's endpoint has no network: direct; c2's is in N2 by fromRegistry"
        );
    }

    fn addresses(cla: &ClusterLoadAssignment) -> Vec<(u32, Vec<String>)> {
        cla.endpoints
            .iter()
            .map(|g| {
                let mut ips: Vec<String> = g
                    .lb_endpoints
                    .iter()
                    .map(|e| match &e.host_identifier {
                        Some(lb_endpoint::HostIdentifier::Endpoint(ep)) => {
                            match &ep.address.as_ref().unwrap().address {
                                Some(address::Address::SocketAddress(a)) => a.address.clone(),
                                _ => unreachable!(),
                            }
                        }
                        _ => unreachable!(),
                    })
                    .collect();
                ips.sort();
                (g.priority, ips)
            })
            .collect()
    }

    #[test]
    fn traffic_distribution_stands_for_a_locality_failover_setting() {
        use meshfed_registry::TrafficDistribution;
        let mesh = crate::mesh::default_mesh_config();
        let mut svc = meshfed_registry::Service::new(
            "a.ns.svc.cluster.local",
            "ns",
            ProviderId::Kubernetes,
            "c1",
        );
        // Without traffic distribution or outlier detection: nothing to apply.
        assert_eq!(locality_setting(&mesh, None, 80, "", &svc), None);
        svc.traffic_distribution = TrafficDistribution::PreferSameZone;
        let (setting, failover) = locality_setting(&mesh, None, 80, "", &svc).unwrap();
        assert!(failover, "failover applies without outlier detection");
        assert_eq!(
            setting.failover_priority,
            [LABEL_NETWORK, LABEL_REGION, LABEL_ZONE]
        );
        svc.traffic_distribution = TrafficDistribution::PreferSameNode;
        let (setting, _) = locality_setting(&mesh, None, 80, "", &svc).unwrap();
        assert_eq!(
            setting.failover_priority,
            [
                LABEL_NETWORK,
                LABEL_REGION,
                LABEL_ZONE,
                LABEL_SUBZONE,
                LABEL_HOSTNAME
            ]
        );
        // A DestinationRule's locality setting wins (here: turned off).
        let rule: DestinationRule = serde_json::from_value(serde_json::json!({
            "host": "a.ns.svc.cluster.local",
            "trafficPolicy": {"loadBalancer": {"localityLbSetting": {"enabled": false}}},
        }))
        .unwrap();
        assert_eq!(locality_setting(&mesh, Some(&rule), 80, "", &svc), None);

        // PreferSameZone for a client in n1 r1/z1: its zone first, then its region,
        // then its network, then the rest.
        let port = Port::new("http", 80, Protocol::Http).unwrap();
        let mk = |ip: &str, locality: &str, network: &str| {
            let mut e = ep(ip, locality, 1);
            e.network = network.into();
            e
        };
        let s = shards(
            vec![
                mk("10.0.0.1", "r1/z1", "n1"),
                mk("10.0.0.2", "r1/z2", "n1"),
                mk("10.0.0.3", "r2/z1", "n1"),
                mk("10.0.0.4", "r1/z1", "n2"),
            ],
            vec![],
        );
        let setting = traffic_distribution_setting(TrafficDistribution::PreferSameZone).unwrap();
        let client = Locality::parse("r1/z1");
        let client_labels = augment_labels(&BTreeMap::new(), "c1", &client, "n1");
        let sel = EndpointSelection {
            locality_lb: Some(LocalityLb {
                setting: &setting,
                proxy_locality: &client,
                proxy_labels: &client_labels,
                failover: true,
            }),
            ..Default::default()
        };
        let mut got = addresses(&load_assignment_for("c", &port, Some(&s), &sel));
        got.sort();
        assert_eq!(
            got,
            vec![
                (0, vec!["10.0.0.1".to_string()]),
                (1, vec!["10.0.0.2".to_string()]),
                (2, vec!["10.0.0.3".to_string()]),
                (3, vec!["10.0.0.4".to_string()]),
            ]
        );
    }

    #[test]
    fn a_node_local_service_keeps_the_clients_node_only() {
        let port = Port::new("http", 80, Protocol::Http).unwrap();
        let on = |ip: &str, node: &str| {
            let mut e = ep(ip, "r1/z1", 1);
            e.workload = Some(Arc::new(meshfed_registry::WorkloadMeta {
                node_name: node.into(),
                ..Default::default()
            }));
            e
        };
        let mut by_label = ep("10.0.0.3", "r1/z1", 1);
        by_label.labels.insert(LABEL_HOSTNAME.into(), "n1".into());
        let s = shards(
            vec![on("10.0.0.1", "n1"), on("10.0.0.2", "n2"), by_label],
            vec![],
        );
        let sel = EndpointSelection {
            node: Some("n1"),
            ..Default::default()
        };
        assert_eq!(
            addresses(&load_assignment_for("c", &port, Some(&s), &sel)),
            vec![(0, vec!["10.0.0.1".to_string(), "10.0.0.3".to_string()])]
        );
        // A client whose node is unknown gets none.
        let sel = EndpointSelection {
            node: Some(""),
            ..Default::default()
        };
        assert!(
            load_assignment_for("c", &port, Some(&s), &sel)
                .endpoints
                .is_empty()
        );
    }
}
