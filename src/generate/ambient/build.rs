//! Workloads and services of the ambient Address type, built from the registries'
//! merged services and endpoint shards (Istio's `ambient/workloads.go`,
//! `services.go`, `networks.go`, `sidecar_interop.go`; waypoints are read by
//! [`super::waypoints`]).
//!
//! - A workload is the object behind one or more endpoints
//!   ([`meshfed_registry::WorkloadMeta`]), keyed by its uid; its `services` map lists,
//!   for every service it backs, the service ports and its target ports. Every pod and
//!   WorkloadEntry is a workload, whether or not a service selects it: the registries
//!   list them ([`meshfed_registry::WorkloadLookup::every_workload`], frozen with the
//!   snapshot), and a change to them alone is pushed as an endpoint-only push that
//!   names no service. Pods without an IP, completed pods and pods of namespaces the
//!   registry does not select are none; a pod's status is its readiness.
//! - Addresses are the workload's IP (none for an entry without an address; a
//!   hostname for DNS endpoints), on the network the split-horizon model gives it;
//!   a workload on a network with gateways carries the first gateway (by address)
//!   as its `network_gateway`, HBONE port 15008.
//! - Tunnel protocol HBONE when the pod's traffic is redirected to ztunnel (the
//!   `ambient.istio.io/redirection: enabled` annotation istio-cni sets) or the
//!   workload speaks HBONE itself (`networking.istio.io/tunnel: http`, which also
//!   sets `native_tunnel`); otherwise plain TCP (sidecar workloads included: ztunnel
//!   reaches them over TCP and their sidecars do mTLS).
//! - Identity: the SPIFFE service account split into trust domain (left empty when
//!   it is `cluster.local`) and account name.
//! - Canonical name and revision from `service.istio.io/canonical-name|revision`,
//!   else `app.kubernetes.io/name|version`, else `app`/`version`, else the
//!   workload name / `latest`.
//! - Waypoints: `istio.io/use-waypoint` on the object (else its namespace) names a
//!   waypoint, set when [`super::waypoints`] finds it ready, taking that traffic and
//!   admitting the namespace (each service's `WaypointBound` condition says why not);
//!   a waypoint's own pods and Service have none, its instances carry its inbound
//!   binding as `application_tunnel`. With `DEFAULT_ALLOW_FROM_WAYPOINT` the
//!   waypoints' implicit allow policies are listed on the workloads that use them.
//! - Services: name (a ServiceEntry's object name), VIPs, ports with the target port
//!   the service gives (else the one its endpoints agree on), and load balancing from
//!   `internalTrafficPolicy`, traffic distribution and `publishNotReadyAddresses`.
//! - An EndpointSlice endpoint that names no pod is a workload of its own
//!   ([`WorkloadKind::EndpointSlice`]): host network, the slice's health, the
//!   service's ports, nothing else known.
//! - Host-network pods are workloads in network mode `HOST_NETWORK` (their address
//!   is the node's).
//! - Kubernetes `ExternalName` Services (alias services) are not sent.
//! - A WorkloadEntry with the address of a pod on the same network is not a workload
//!   (the pod is).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use meshfed_api::workload as wl;
use meshfed_registry::{
    ClusterId, Endpoint, NetworkId, ProviderId, Resolution, Service, ShardKey, TrafficDistribution,
    WorkloadKind, WorkloadMeta, WorkloadOwner,
};

use meshfed_registry::config::Kind;

pub use super::{HBONE_PORT, ip_bytes, ip_of};

use super::multinetwork::{self, MultiNetwork};
use super::waypoints::{
    LABEL_USE_WAYPOINT, LABEL_USE_WAYPOINT_NAMESPACE, Waypoint, WaypointInputs, Waypoints,
};
use crate::networks::NetworkView;
use crate::push::snapshot::Snapshot;

/// The label a workload that speaks HBONE itself carries (`http`).
const LABEL_TUNNEL: &str = "networking.istio.io/tunnel";
/// The label (value [`MESH_CONTROLLER`]) of a waypoint's own pods and Service.
const LABEL_MANAGED: &str = "gateway.istio.io/managed";
const MESH_CONTROLLER: &str = "istio.io-mesh-controller";

/// Everything the Address type holds for one snapshot, by resource name.
#[derive(Default, Debug)]
pub struct AmbientModel {
    /// Workload uid -> workload.
    pub workloads: BTreeMap<String, wl::Workload>,
    /// `namespace/hostname` -> service.
    pub services: BTreeMap<String, wl::Service>,
    /// `network/IP` -> the names of the resources at that address.
    pub aliases: BTreeMap<String, Vec<String>>,
    /// `DEFAULT_ALLOW_FROM_WAYPOINT`'s allow policies for the waypoints' service
    /// accounts, by resource name (`<ns>/istio_allow_waypoint_<ns>_<name>`), served
    /// with the Authorization type.
    pub implicit_policies: BTreeMap<String, meshfed_api::security::Authorization>,
    /// Workload uid -> why the waypoint its `istio.io/use-waypoint` names gives it
    /// none (istiod's reasons and messages; shown in `/debug/ambientz`).
    pub workload_waypoint_problems: BTreeMap<String, WaypointBound>,
    /// `namespace/hostname` -> the `WaypointBound` condition istiod writes to the
    /// service's status (services naming a waypoint only; meshfed shows them in
    /// `/debug/ambientz`).
    pub service_conditions: BTreeMap<String, WaypointBound>,
    /// Waypoint `namespace/name` -> the uids of the workloads that use it, oldest
    /// first (then by uid; a workload whose registry gives no creation time counts
    /// as oldest), as istiod's `WorkloadsForWaypoint` orders them.
    pub waypoint_workloads: BTreeMap<String, Vec<String>>,
    /// `namespace/hostname` -> the waypoint (`namespace/name`) of each service that
    /// asks gateways to send through its waypoint (`istio.io/ingress-use-waypoint:
    /// "true"` on the Service, else its namespace), which meshfed's gateways do not do
    /// (shown in `/debug/ambientz` and logged, so the label is not ignored silently).
    pub ingress_use_waypoint_not_routed: BTreeMap<String, String>,
}

/// A service's `WaypointBound` condition.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct WaypointBound {
    pub status: bool,
    pub reason: String,
    pub message: String,
}

/// The label with which a service asks gateways and sidecars to send through its
/// waypoint (`true`).
const LABEL_INGRESS_USE_WAYPOINT: &str = "istio.io/ingress-use-waypoint";

/// What building needs besides the registries' data.
pub struct BuildContext<'a> {
    /// Split-horizon networks and gateways.
    pub networks: &'a NetworkView,
    /// The mesh trust domain.
    pub trust_domain: &'a str,
    /// The cluster DNS domain (`--domain`).
    pub domain: &'a str,
    /// The ready waypoints and the namespace labels.
    pub waypoints: &'a Waypoints,
}

/// One service with its endpoints, each with the shard it came from.
pub type ServiceEndpoints<'a> = (&'a Service, Vec<(&'a ShardKey, &'a Endpoint)>);

/// Builds the ambient model from a snapshot: its services with their endpoints, and
/// every workload the registries know ([`Snapshot::every_workload`]: pods and
/// WorkloadEntries that back no service are workloads too).
pub fn from_snapshot(snapshot: &Snapshot, options: &super::AmbientOptions) -> AmbientModel {
    let trust_domain = snapshot.mesh().config.trust_domain.clone();
    let services: Vec<ServiceEndpoints<'_>> = snapshot
        .services()
        .all()
        .iter()
        .map(|s| {
            let eps = snapshot
                .shards(&s.key())
                .map(|sh| sh.iter().collect())
                .unwrap_or_default();
            (&**s, eps)
        })
        .collect();
    let every = snapshot.every_workload();
    let standalone: Vec<(&ShardKey, &Endpoint)> = every.iter().map(|(s, e)| (s, e)).collect();
    let networks = snapshot.network_view();
    let domain = snapshot.config().domain.clone();
    let waypoints = read_waypoints(snapshot, &services, networks, &domain);
    let local_cluster = ClusterId::new(options.local_cluster);
    let namespaces = snapshot.config().namespace_labels_all();
    let local_network = local_network(
        networks,
        &local_cluster,
        namespaces.get(&snapshot.mesh().config.root_namespace),
    );
    let multi = options.multi_network.then(|| MultiNetwork {
        local_cluster: &local_cluster,
        local_network: &local_network,
        scopes: &snapshot.mesh().config.service_scope_configs,
        namespaces: &namespaces,
    });
    let mut model = build(
        &services,
        &standalone,
        networks,
        &trust_domain,
        &domain,
        &waypoints,
        multi.as_ref(),
    );
    let policies = crate::generate::ambient_authz::ambient_policies(snapshot);
    attach_policies(&mut model, &services, &standalone, &policies);
    if options.default_allow_from_waypoint {
        add_implicit_waypoint_policies(
            &mut model,
            &services,
            &standalone,
            &waypoints,
            &trust_domain,
        );
    }
    model
}

/// The network of the local cluster: its system namespace's
/// `topology.istio.io/network` label, else meshNetworks `fromRegistry`.
pub(crate) fn local_network(
    networks: &NetworkView,
    cluster: &ClusterId,
    system_namespace: Option<&BTreeMap<String, String>>,
) -> NetworkId {
    match system_namespace.and_then(|l| l.get("topology.istio.io/network")) {
        Some(n) if !n.is_empty() => NetworkId::new(n),
        _ => network_of(networks, IpAddr::from([0, 0, 0, 0]), cluster),
    }
}

/// The snapshot's ready waypoints (see [`Waypoints`]).
fn read_waypoints(
    snapshot: &Snapshot,
    services: &[ServiceEndpoints<'_>],
    networks: &NetworkView,
    domain: &str,
) -> Waypoints {
    let config = snapshot.config();
    let mut objects = config.objects_of(Kind::KubernetesGateway).to_vec();
    objects.extend_from_slice(config.objects_of(Kind::GatewayClass));
    let index = snapshot.services();
    Waypoints::read(
        &objects,
        WaypointInputs {
            domain,
            service_exists: &|h| index.has_hostname(h),
            network_of: &|ip| ip_network(networks, services, ip),
            namespaces: config.namespace_labels_all(),
        },
    )
}

/// The network of a waypoint's IP: that of the cluster whose service has it as a
/// VIP, else the meshNetworks CIDR holding it.
pub fn ip_network(networks: &NetworkView, services: &[ServiceEndpoints<'_>], ip: IpAddr) -> String {
    let cluster = services
        .iter()
        .find_map(|(s, _)| {
            s.cluster_vips
                .iter()
                .find(|(_, vips)| vips.contains(&ip))
                .map(|(c, _)| c.clone())
        })
        .unwrap_or_default();
    network_of(networks, ip, &cluster).to_string()
}

/// Lists on each workload the policies that select it (`authorization_policies`).
pub fn attach_policies(
    model: &mut AmbientModel,
    services: &[ServiceEndpoints<'_>],
    standalone: &[(&ShardKey, &Endpoint)],
    policies: &crate::generate::ambient_authz::AmbientPolicies,
) {
    let endpoints = services
        .iter()
        .flat_map(|(_, eps)| eps.iter())
        .chain(standalone);
    for (_, ep) in endpoints {
        if let Some(meta) = ep.workload.as_deref()
            && meta.kind != WorkloadKind::EndpointSlice
            && let Some(w) = model.workloads.get_mut(&meta.uid)
            && w.authorization_policies.is_empty()
        {
            w.authorization_policies = policies.workload_policies(&meta.namespace, &ep.labels);
        }
    }
}

/// Builds the ambient model of `services`, each with its endpoints and their shards,
/// and of `standalone`, every workload the registries know as an endpoint without
/// service ports (those behind a service are among them too: one workload per uid);
/// `domain` is the cluster DNS domain; `waypoints` the ready waypoints.
pub fn build(
    services: &[ServiceEndpoints<'_>],
    standalone: &[(&ShardKey, &Endpoint)],
    networks: &NetworkView,
    trust_domain: &str,
    domain: &str,
    waypoints: &Waypoints,
    multi: Option<&MultiNetwork<'_>>,
) -> AmbientModel {
    let ctx = BuildContext {
        networks,
        trust_domain: if trust_domain.is_empty() {
            "cluster.local"
        } else {
            trust_domain
        },
        domain: if domain.is_empty() {
            "cluster.local"
        } else {
            domain
        },
        waypoints,
    };
    let mut model = AmbientModel::default();
    // A WorkloadEntry at a pod's address (same network) is left out, as istiod does.
    let pod_addresses: BTreeSet<(NetworkId, IpAddr)> = services
        .iter()
        .flat_map(|(_, eps)| eps.iter())
        .chain(standalone)
        .filter(|(_, ep)| {
            ep.hostname.is_none()
                && ep.has_address()
                && ep
                    .workload
                    .as_deref()
                    .is_some_and(|m| m.kind == WorkloadKind::Pod)
        })
        .map(|(shard, ep)| (ctx.networks.endpoint_network(ep, shard), ep.address))
        .collect();
    // Endpoints of global services on other networks: (service name, network) ->
    // how many, and their identities.
    let mut remote: BTreeMap<(String, NetworkId), (u32, BTreeSet<String>)> = BTreeMap::new();
    for (service, endpoints) in services {
        // Istio sends no Service for an `ExternalName` Service.
        if service.resolution == Resolution::Alias {
            continue;
        }
        let scoped;
        let (service, endpoints): (&Service, &[(&ShardKey, &Endpoint)]) = match multi {
            None => (service, endpoints),
            Some(m) => match scope_service(m, service, endpoints) {
                Some(s) => {
                    scoped = s;
                    (&scoped.0, &scoped.1)
                }
                None => continue,
            },
        };
        let global = multi.is_some_and(|m| m.is_global(service));
        let (svc, condition) = service_resource(service, endpoints, &ctx);
        let name = format!("{}/{}", svc.namespace, svc.hostname);
        if let Ok(Some(w)) = service_waypoint(service, ctx.waypoints)
            && ingress_use_waypoint(service, ctx.waypoints)
        {
            model
                .ingress_use_waypoint_not_routed
                .insert(name.clone(), w.key());
        }
        if let Some(c) = condition {
            model.service_conditions.insert(name.clone(), c);
        }
        for a in &svc.addresses {
            if let Some(ip) = ip_of(&a.address) {
                model
                    .aliases
                    .entry(format!("{}/{ip}", a.network))
                    .or_default()
                    .push(name.clone());
            }
        }
        for (shard, ep) in endpoints {
            let Some(meta) = ep.workload.as_deref() else {
                continue;
            };
            if shadowed_by_pod(meta, ep, shard, &pod_addresses, &ctx) {
                continue;
            }
            if let Some(m) = multi {
                let network = ctx.networks.endpoint_network(ep, shard);
                if network != *m.local_network {
                    if global {
                        let entry = remote.entry((name.clone(), network)).or_default();
                        entry.0 += 1;
                        entry.1.extend(ep.service_account.iter().cloned());
                    }
                    continue;
                }
            }
            let workload = model
                .workloads
                .entry(meta.uid.clone())
                .or_insert_with(|| workload_resource(meta, ep, shard, &ctx));
            let ports = workload
                .services
                .entry(name.clone())
                .or_insert_with(wl::PortList::default);
            for port in &service.ports {
                if let Some(target) = ep.ports.get(&port.name)
                    && !ports
                        .ports
                        .iter()
                        .any(|p| p.service_port == u32::from(port.port.get()))
                {
                    ports.ports.push(wl::Port {
                        service_port: u32::from(port.port.get()),
                        target_port: u32::from(*target),
                    });
                }
            }
        }
        model.services.insert(name, svc);
    }
    for (shard, ep) in standalone {
        let Some(meta) = ep.workload.as_deref() else {
            continue;
        };
        let elsewhere =
            multi.is_some_and(|m| ctx.networks.endpoint_network(ep, shard) != *m.local_network);
        if !elsewhere && !shadowed_by_pod(meta, ep, shard, &pod_addresses, &ctx) {
            model
                .workloads
                .entry(meta.uid.clone())
                .or_insert_with(|| workload_resource(meta, ep, shard, &ctx));
        }
    }
    if let Some(m) = multi {
        add_split_horizon(&mut model, m, remote, &ctx);
    }
    // Why a workload's `istio.io/use-waypoint` gives it no waypoint.
    let endpoints = services
        .iter()
        .flat_map(|(_, eps)| eps.iter())
        .chain(standalone);
    let mut by_waypoint: BTreeMap<String, BTreeSet<(Option<std::time::SystemTime>, String)>> =
        BTreeMap::new();
    for (_, ep) in endpoints {
        let Some(meta) = ep.workload.as_deref() else {
            continue;
        };
        if !model.workloads.contains_key(&meta.uid) {
            continue;
        }
        match workload_waypoint_or_why(meta, ep, ctx.waypoints) {
            Ok(Some(w)) => {
                by_waypoint
                    .entry(w.key())
                    .or_default()
                    .insert((meta.creation_time, meta.uid.clone()));
            }
            Ok(None) => {}
            Err(e) => {
                model
                    .workload_waypoint_problems
                    .entry(meta.uid.clone())
                    .or_insert_with(|| WaypointBound {
                        status: false,
                        reason: e.reason().into(),
                        message: e.message(),
                    });
            }
        }
    }
    model.waypoint_workloads = by_waypoint
        .into_iter()
        .map(|(k, set)| (k, set.into_iter().map(|(_, uid)| uid).collect()))
        .collect();
    for (uid, w) in &model.workloads {
        for a in &w.addresses {
            if let Some(ip) = ip_of(a) {
                model
                    .aliases
                    .entry(format!("{}/{ip}", w.network))
                    .or_default()
                    .push(uid.clone());
            }
        }
    }
    model
}

/// Whether `istio.io/ingress-use-waypoint` is `true` on the service, else (when the
/// service does not set it) on its namespace, as istiod reads it.
fn ingress_use_waypoint(service: &Service, waypoints: &Waypoints) -> bool {
    let value = service.labels.get(LABEL_INGRESS_USE_WAYPOINT).or_else(|| {
        waypoints
            .namespace_labels(service.namespace.as_str())
            .and_then(|l| l.get(LABEL_INGRESS_USE_WAYPOINT))
    });
    value.is_some_and(|v| v.eq_ignore_ascii_case("true"))
}

/// The part of `service` (and of its endpoints) the local control plane shares
/// under multi-network ([`super::multinetwork`]): all of a global service, the local
/// cluster's part of a local one; `None` when nothing is left.
fn scope_service<'a>(
    m: &MultiNetwork<'_>,
    service: &Service,
    endpoints: &[(&'a ShardKey, &'a Endpoint)],
) -> Option<(Service, Vec<(&'a ShardKey, &'a Endpoint)>)> {
    if service.provider != ProviderId::Kubernetes || m.is_global(service) {
        return Some((service.clone(), endpoints.to_vec()));
    }
    if !m.is_in_local_cluster(service) {
        return None;
    }
    let mut local = service.clone();
    local.cluster_vips.retain(|c, _| c == m.local_cluster);
    let endpoints = endpoints
        .iter()
        .filter(|(shard, ep)| {
            let cluster = if ep.cluster_id.is_empty() {
                &shard.cluster
            } else {
                &ep.cluster_id
            };
            cluster == m.local_cluster
        })
        .copied()
        .collect();
    Some((local, endpoints))
}

/// The split-horizon workloads of the global services' endpoints on other networks
/// (one per service and network with a gateway), the identities of those endpoints
/// added to their services' subject alt names, and a workload per gateway into
/// another network.
fn add_split_horizon(
    model: &mut AmbientModel,
    m: &MultiNetwork<'_>,
    remote: BTreeMap<(String, NetworkId), (u32, BTreeSet<String>)>,
    ctx: &BuildContext<'_>,
) {
    for ((name, network), (count, identities)) in remote {
        let Some(service) = model.services.get_mut(&name) else {
            continue;
        };
        let Some(gateway) = ctx.networks.network_gateways(&network).first() else {
            continue;
        };
        let mut sans: BTreeSet<String> = service.subject_alt_names.drain(..).collect();
        sans.extend(identities);
        service.subject_alt_names = sans.into_iter().collect();
        let gateway_name = multinetwork::gateway_resource_name(ctx.networks, gateway);
        let w = multinetwork::split_horizon_workload(
            &name,
            service,
            gateway,
            &gateway_name,
            count,
            ctx.trust_domain,
        );
        model.workloads.insert(w.uid.clone(), w);
    }
    for entry in ctx.networks.entries() {
        let gateway = &entry.gateway;
        if gateway.network == *m.local_network {
            continue;
        }
        let gateway_name = multinetwork::gateway_resource_name(ctx.networks, gateway);
        let w = multinetwork::gateway_workload(gateway, &gateway_name, ctx.trust_domain);
        model.workloads.entry(w.uid.clone()).or_insert(w);
    }
}

/// A WorkloadEntry at the address of a pod on the same network is not a workload.
fn shadowed_by_pod(
    meta: &WorkloadMeta,
    ep: &Endpoint,
    shard: &ShardKey,
    pod_addresses: &BTreeSet<(NetworkId, IpAddr)>,
    ctx: &BuildContext<'_>,
) -> bool {
    meta.kind == WorkloadKind::WorkloadEntry
        && ep.hostname.is_none()
        && !pod_addresses.is_empty()
        && pod_addresses.contains(&(ctx.networks.endpoint_network(ep, shard), ep.address))
}

/// The network of an address of `cluster` (VIPs: the cluster's network, else the
/// meshNetworks CIDR holding it).
fn network_of(networks: &NetworkView, ip: IpAddr, cluster: &ClusterId) -> NetworkId {
    let mut probe = Endpoint::new(ip);
    probe.cluster_id = cluster.clone();
    networks.endpoint_network(&probe, &ShardKey::new(ProviderId::Mock, cluster.clone()))
}

fn service_resource(
    service: &Service,
    endpoints: &[(&ShardKey, &Endpoint)],
    ctx: &BuildContext<'_>,
) -> (wl::Service, Option<WaypointBound>) {
    let hostname = service.hostname.to_string();
    let namespace = service.namespace.to_string();
    let name = match service.provider {
        _ if !service.object_name.is_empty() => service.object_name.clone(),
        ProviderId::Kubernetes => hostname.split('.').next().unwrap_or_default().to_string(),
        _ => hostname.clone(),
    };
    let mut addresses = Vec::new();
    let mut v4 = false;
    let mut v6 = false;
    let mut vip_list: Vec<(ClusterId, IpAddr)> = service
        .cluster_vips
        .iter()
        .flat_map(|(c, vips)| vips.iter().map(move |v| (c.clone(), *v)))
        .collect();
    // Auto-allocated addresses stand in when none is given (not for NONE resolution).
    if vip_list.is_empty() && service.resolution != Resolution::Passthrough {
        let auto = [
            service.auto_allocated_ipv4.map(IpAddr::V4),
            service.auto_allocated_ipv6.map(IpAddr::V6),
        ];
        vip_list.extend(
            auto.into_iter()
                .flatten()
                .map(|ip| (service.cluster_id.clone(), ip)),
        );
    }
    for (cluster, vip) in &vip_list {
        v4 |= vip.is_ipv4();
        v6 |= vip.is_ipv6();
        let network = network_of(ctx.networks, *vip, cluster).to_string();
        let address = wl::NetworkAddress {
            network,
            address: ip_bytes(*vip),
        };
        if !addresses.contains(&address) {
            addresses.push(address);
        }
    }
    let ports = service
        .ports
        .iter()
        .map(|p| {
            // The number the service gives (0: a named target port); else the
            // target port every endpoint agrees on, else 0 (per workload); a
            // ServiceEntry's (or other registry's) port without endpoints targets
            // itself.
            if let Some(t) = service.target_ports.get(&p.port.get()) {
                return wl::Port {
                    service_port: u32::from(p.port.get()),
                    target_port: u32::from(*t),
                };
            }
            let mut targets = endpoints.iter().filter_map(|(_, e)| e.ports.get(&p.name));
            let first = targets.next().copied();
            let target = match first {
                Some(t) if targets.all(|o| *o == t) => u32::from(t),
                Some(_) => 0,
                None if service.provider == ProviderId::Kubernetes => 0,
                None => u32::from(p.port.get()),
            };
            wl::Port {
                service_port: u32::from(p.port.get()),
                target_port: target,
            }
        })
        .collect();
    let found = service_waypoint(service, ctx.waypoints);
    let condition = match &found {
        Ok(None) => None,
        Ok(Some(w)) => {
            let ingress = match service.labels.get(LABEL_INGRESS_USE_WAYPOINT) {
                None => "",
                Some(v) if v == "true" => ". Ingress traffic will traverse the waypoint",
                Some(_) => {
                    ". Ingress traffic is not using the waypoint, set the istio.io/ingress-use-waypoint label to true if desired."
                }
            };
            Some(WaypointBound {
                status: true,
                reason: "WaypointAccepted".into(),
                message: format!("Successfully attached to waypoint {}{ingress}", w.key()),
            })
        }
        Err(e) => Some(WaypointBound {
            status: false,
            reason: e.reason().into(),
            message: e.message(),
        }),
    };
    let waypoint = found.ok().flatten().map(|w| w.address.clone());
    let svc = wl::Service {
        name,
        namespace,
        hostname,
        addresses,
        ports,
        // ServiceEntry `subjectAltNames` (Kubernetes Services carry none).
        subject_alt_names: match service.provider {
            ProviderId::External => service.service_accounts.iter().cloned().collect(),
            _ => Vec::new(),
        },
        waypoint,
        load_balancing: load_balancing(service),
        ip_families: match (v4, v6) {
            (true, false) => wl::IpFamilies::Ipv4Only as i32,
            (false, true) => wl::IpFamilies::Ipv6Only as i32,
            (true, true) => wl::IpFamilies::Dual as i32,
            (false, false) => wl::IpFamilies::Automatic as i32,
        },
        extensions: Vec::new(),
        creation_timestamp: None,
    };
    (svc, condition)
}

/// The service's load balancing as istiod sets it: the node only, strictly, for
/// `internalTrafficPolicy: Local`, else its traffic distribution as routing
/// preferences (failing over); `ALLOW_ALL` health for `publishNotReadyAddresses`.
fn load_balancing(service: &Service) -> Option<wl::LoadBalancing> {
    use wl::load_balancing::{HealthPolicy, Mode, Scope};
    let (scopes, mode): (&[Scope], Mode) = if service.node_local {
        (&[Scope::Node], Mode::Strict)
    } else {
        match service.traffic_distribution {
            TrafficDistribution::Any => (&[], Mode::UnspecifiedMode),
            TrafficDistribution::PreferSameZone => (
                &[Scope::Network, Scope::Region, Scope::Zone],
                Mode::Failover,
            ),
            TrafficDistribution::PreferSameNode => (
                &[
                    Scope::Network,
                    Scope::Region,
                    Scope::Zone,
                    Scope::Subzone,
                    Scope::Node,
                ],
                Mode::Failover,
            ),
        }
    };
    if scopes.is_empty() && !service.publish_not_ready {
        return None;
    }
    Some(wl::LoadBalancing {
        routing_preference: scopes.iter().map(|s| *s as i32).collect(),
        mode: mode as i32,
        health_policy: if service.publish_not_ready {
            HealthPolicy::AllowAll
        } else {
            HealthPolicy::OnlyHealthy
        } as i32,
    })
}

/// Istio's canonical service name and revision of a workload.
pub fn canonical(labels: &BTreeMap<String, String>, workload_name: &str) -> (String, String) {
    let first = |keys: &[&str]| {
        keys.iter()
            .find_map(|k| labels.get(*k).filter(|v| !v.is_empty()))
            .cloned()
    };
    let name = first(&[
        "service.istio.io/canonical-name",
        "app.kubernetes.io/name",
        "app",
    ])
    .unwrap_or_else(|| workload_name.to_string());
    let revision = first(&[
        "service.istio.io/canonical-revision",
        "app.kubernetes.io/version",
        "version",
    ])
    .unwrap_or_else(|| "latest".to_string());
    (name, revision)
}

fn workload_resource(
    meta: &WorkloadMeta,
    ep: &Endpoint,
    shard: &ShardKey,
    ctx: &BuildContext<'_>,
) -> wl::Workload {
    let network = ctx.networks.endpoint_network(ep, shard);
    let cluster = if ep.cluster_id.is_empty() {
        &shard.cluster
    } else {
        &ep.cluster_id
    };
    if meta.kind == WorkloadKind::EndpointSlice {
        return endpoint_slice_workload(meta, ep, &network, cluster, ctx);
    }
    let (trust_domain, service_account) = match ep.service_account.as_deref() {
        Some(spiffe) => split_spiffe(spiffe),
        None => (String::new(), String::new()),
    };
    let trust_domain = if trust_domain == "cluster.local" || trust_domain == ctx.trust_domain {
        super::trust_domain_field(ctx.trust_domain)
    } else {
        trust_domain
    };
    let (addresses, hostname) = match &ep.hostname {
        Some(h) => (Vec::new(), h.to_string()),
        None if ep.has_address() => (vec![ip_bytes(ep.address)], String::new()),
        None => (Vec::new(), String::new()),
    };
    let native = ep.labels.get(LABEL_TUNNEL).is_some_and(|v| v == "http");
    let tunnel = if meta.ambient_redirected || native {
        wl::TunnelProtocol::Hbone
    } else {
        wl::TunnelProtocol::None
    };
    let workload_name = if meta.workload_name.is_empty() {
        meta.name.clone()
    } else {
        meta.workload_name.clone()
    };
    let (canonical_name, canonical_revision) = canonical(&ep.labels, &workload_name);
    // The network's gateways from meshNetworks and the registries, else those the
    // `istio-remote` Gateways declare (which may be host names).
    let network_gateway = ctx
        .networks
        .gateways_for(&network, cluster)
        .first()
        .map(|g| wl::GatewayAddress {
            destination: Some(wl::gateway_address::Destination::Address(
                wl::NetworkAddress {
                    network: g.network.to_string(),
                    address: ip_bytes(g.address),
                },
            )),
            hbone_mtls_port: HBONE_PORT,
        })
        .or_else(|| {
            (!network.is_empty())
                .then(|| ctx.waypoints.network_gateway(network.as_str()).cloned())
                .flatten()
        });
    let waypoint = workload_waypoint(meta, ep, ctx.waypoints).map(|w| w.address.clone());
    // A waypoint's own instance carries the waypoint's inbound binding.
    let application_tunnel = ctx
        .waypoints
        .instance_of(&meta.namespace, &ep.labels)
        .and_then(|w| w.binding);
    let locality = (!ep.locality.is_empty()).then(|| wl::Locality {
        region: ep.locality.region.clone(),
        zone: ep.locality.zone.clone(),
        subzone: ep.locality.subzone.clone(),
    });
    wl::Workload {
        uid: meta.uid.clone(),
        name: meta.name.clone(),
        namespace: meta.namespace.clone(),
        addresses,
        hostname,
        network: network.to_string(),
        tunnel_protocol: tunnel as i32,
        trust_domain,
        service_account,
        waypoint,
        network_gateway,
        node: meta.node_name.clone(),
        canonical_name,
        canonical_revision,
        workload_type: match (meta.kind, meta.owner) {
            (WorkloadKind::Pod, WorkloadOwner::Deployment) => wl::WorkloadType::Deployment,
            (WorkloadKind::Pod, WorkloadOwner::Job) => wl::WorkloadType::Job,
            (WorkloadKind::Pod, WorkloadOwner::CronJob) => wl::WorkloadType::Cronjob,
            _ => wl::WorkloadType::Pod,
        } as i32,
        workload_name,
        native_tunnel: native,
        application_tunnel,
        services: BTreeMap::new(),
        authorization_policies: Vec::new(),
        status: super::workload_status(ep.health) as i32,
        cluster_id: cluster.to_string(),
        locality,
        network_mode: if meta.host_network {
            wl::NetworkMode::HostNetwork
        } else {
            wl::NetworkMode::Standard
        } as i32,
        extensions: Vec::new(),
        capacity: None,
    }
}

/// An EndpointSlice endpoint that names no pod, as istiod sends it: its address on
/// the host network (it may share it with anything), the slice's health, and nothing
/// else known (no identity, waypoint, locality or policies).
fn endpoint_slice_workload(
    meta: &WorkloadMeta,
    ep: &Endpoint,
    network: &NetworkId,
    cluster: &ClusterId,
    ctx: &BuildContext<'_>,
) -> wl::Workload {
    wl::Workload {
        uid: meta.uid.clone(),
        name: meta.name.clone(),
        namespace: meta.namespace.clone(),
        addresses: vec![ip_bytes(ep.address)],
        network: network.to_string(),
        trust_domain: super::trust_domain_field(ctx.trust_domain),
        status: super::workload_status(ep.health) as i32,
        cluster_id: cluster.to_string(),
        network_mode: wl::NetworkMode::HostNetwork as i32,
        ..Default::default()
    }
}

/// The waypoint a workload uses: its own (or, when the registry gave none, its
/// namespace's) `istio.io/use-waypoint`, if that waypoint takes workload traffic;
/// none for a waypoint's own pods.
fn workload_waypoint<'w>(
    meta: &WorkloadMeta,
    ep: &Endpoint,
    waypoints: &'w Waypoints,
) -> Option<&'w Waypoint> {
    workload_waypoint_or_why(meta, ep, waypoints).ok().flatten()
}

/// [`workload_waypoint`], or why the waypoint named gives none.
fn workload_waypoint_or_why<'w>(
    meta: &WorkloadMeta,
    ep: &Endpoint,
    waypoints: &'w Waypoints,
) -> Result<Option<&'w Waypoint>, super::waypoints::Unbound> {
    if meta.kind == WorkloadKind::EndpointSlice
        || ep
            .labels
            .get(LABEL_MANAGED)
            .is_some_and(|v| v == MESH_CONTROLLER)
    {
        return Ok(None);
    }
    if meta.use_waypoint.is_empty() {
        let ns = waypoints.namespace_labels(&meta.namespace);
        let label = |k: &str| {
            ns.and_then(|l| l.get(k))
                .map(String::as_str)
                .unwrap_or_default()
        };
        waypoints.for_workload(
            label(LABEL_USE_WAYPOINT),
            label(LABEL_USE_WAYPOINT_NAMESPACE),
            &meta.namespace,
        )
    } else {
        waypoints.for_workload(
            &meta.use_waypoint,
            &meta.use_waypoint_namespace,
            &meta.namespace,
        )
    }
}

/// The waypoint a service uses, or why its `istio.io/use-waypoint` gives none; a
/// waypoint's own Service has none.
fn service_waypoint<'w>(
    service: &Service,
    waypoints: &'w Waypoints,
) -> Result<Option<&'w Waypoint>, super::waypoints::Unbound> {
    if service
        .labels
        .get(LABEL_MANAGED)
        .is_some_and(|v| v == MESH_CONTROLLER)
    {
        return Ok(None);
    }
    waypoints.for_service(&service.labels, service.namespace.as_str())
}

/// `DEFAULT_ALLOW_FROM_WAYPOINT`: for each waypoint with pods (its instances, labelled
/// `gateway.networking.k8s.io/gateway-name`), an ALLOW policy
/// `<ns>/istio_allow_waypoint_<ns>_<name>` for their service accounts, listed on
/// every workload that uses the waypoint or backs a service that does (the
/// services' waypoints first, then its own), after its other policies.
pub fn add_implicit_waypoint_policies(
    model: &mut AmbientModel,
    services: &[ServiceEndpoints<'_>],
    standalone: &[(&ShardKey, &Endpoint)],
    waypoints: &Waypoints,
    trust_domain: &str,
) {
    use meshfed_api::security as sec;
    let trust_domain = if trust_domain.is_empty() {
        "cluster.local"
    } else {
        trust_domain
    };
    let endpoints: Vec<&Endpoint> = services
        .iter()
        .flat_map(|(_, eps)| eps.iter().map(|(_, e)| *e))
        .chain(standalone.iter().map(|(_, e)| *e))
        .collect();
    // Each waypoint's instances: pod uid -> service account.
    let mut accounts: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for ep in &endpoints {
        let Some(meta) = ep
            .workload
            .as_deref()
            .filter(|m| m.kind == WorkloadKind::Pod)
        else {
            continue;
        };
        if let Some(w) = waypoints.instance_of(&meta.namespace, &ep.labels) {
            let sa = ep
                .service_account
                .as_deref()
                .map(|id| split_spiffe(id).1)
                .unwrap_or_default();
            accounts
                .entry(w.key())
                .or_default()
                .insert(meta.uid.clone(), sa);
        }
    }
    let mut policy_of: BTreeMap<String, String> = BTreeMap::new();
    for (key, pods) in &accounts {
        let Some((ns, name)) = key.split_once('/') else {
            continue;
        };
        let mut sas: Vec<&String> = pods.values().collect();
        sas.sort();
        let policy = sec::Authorization {
            name: format!("istio_allow_waypoint_{ns}_{name}"),
            namespace: ns.to_string(),
            scope: sec::Scope::WorkloadSelector as i32,
            action: sec::Action::Allow as i32,
            groups: vec![sec::Group {
                rules: vec![sec::Rules {
                    matches: vec![sec::Match {
                        principals: sas
                            .iter()
                            .map(|sa| sec::StringMatch {
                                match_type: Some(sec::string_match::MatchType::Exact(format!(
                                    "{trust_domain}/ns/{ns}/sa/{sa}"
                                ))),
                            })
                            .collect(),
                        ..Default::default()
                    }],
                }],
            }],
        };
        let resource = format!("{ns}/{}", policy.name);
        policy_of.insert(key.clone(), resource.clone());
        model.implicit_policies.insert(resource, policy);
    }
    if policy_of.is_empty() {
        return;
    }
    let service_waypoints: BTreeMap<String, String> = services
        .iter()
        .filter_map(|(s, _)| {
            let w = service_waypoint(s, waypoints).ok().flatten()?;
            Some((format!("{}/{}", s.namespace, s.hostname), w.key()))
        })
        .collect();
    let mut done = BTreeSet::new();
    for ep in &endpoints {
        let Some(meta) = ep
            .workload
            .as_deref()
            .filter(|m| m.kind != WorkloadKind::EndpointSlice)
        else {
            continue;
        };
        if !done.insert(meta.uid.clone()) {
            continue;
        }
        let Some(workload) = model.workloads.get_mut(&meta.uid) else {
            continue;
        };
        let own = workload_waypoint(meta, ep, waypoints).map(Waypoint::key);
        let mut keys: Vec<String> = workload
            .services
            .keys()
            .filter_map(|s| service_waypoints.get(s))
            .filter(|k| Some(*k) != own.as_ref())
            .cloned()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        keys.extend(own);
        for key in keys {
            if let Some(p) = policy_of.get(&key)
                && !workload.authorization_policies.contains(p)
            {
                workload.authorization_policies.push(p.clone());
            }
        }
    }
}

/// `spiffe://<td>/ns/<ns>/sa/<sa>` -> (td, sa).
fn split_spiffe(id: &str) -> (String, String) {
    let Some(rest) = id.strip_prefix("spiffe://") else {
        return (String::new(), id.to_string());
    };
    let (td, path) = rest.split_once('/').unwrap_or((rest, ""));
    let sa = path.rsplit_once("/sa/").map(|(_, sa)| sa).unwrap_or("");
    (td.to_string(), sa.to_string())
}
