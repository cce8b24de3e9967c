//! The DNS name table of a proxy (Istio's NDS, `BuildNameTable` in
//! `pkg/dns/server/name_table.go`): every service the proxy sees, with the IPs its DNS
//! proxy should answer for it. The agent of a proxy that captures DNS
//! (`ISTIO_META_DNS_CAPTURE`) subscribes to
//! `type.googleapis.com/istio.networking.nds.v1.NameTable`.
//!
//! As Istio:
//! - a service with an address for the proxy (its cluster's VIPs, or the
//!   auto-allocated ones when the proxy uses them,
//!   `meshfed_registry::Service::address_for_proxy`) answers with it (every VIP of that
//!   cluster: dual stack and ServiceEntries with several addresses);
//! - a headless service (resolution NONE) with ports answers with the IPs of the
//!   endpoints of its first port that are on the proxy's network (same or either
//!   unset); Istio's `MulticlusterHeadlessEnabled` default (on) keeps other clusters'
//!   endpoints;
//! - anything else (no address, or only host-name endpoints) has no entry;
//! - Kubernetes services carry their name and namespace (the agent expands `a`,
//!   `a.ns`, `a.ns.svc`); a Kubernetes service replaces another registry's entry of the
//!   same host, other registries' IPs are appended to an existing non-Kubernetes entry.
//!
//! Not done: the per-pod `<hostname>.<subdomain>` names of StatefulSet pods (the model
//! does not carry pod hostnames).

use std::collections::BTreeMap;
use std::net::IpAddr;

use meshfed_api::networking::nds::v1::NameTable;
use meshfed_api::networking::nds::v1::name_table::NameInfo;
use meshfed_registry::{ClusterId, NetworkId, ProviderId, Resolution, Service};

use crate::model::ProxyClass;
use crate::model::proxy::Proxy;
use crate::push::cache::CacheInput;
use crate::push::snapshot::Snapshot;
use crate::xds::{EncodedResource, Resource, TypeUrl};

/// NDS for `proxy`: its name table as the one resource of the type, named `""` as
/// Istio sends it; nothing for a proxy that does not capture DNS (metadata
/// `DNS_CAPTURE`) or has no table (gateways). Proxies with the same [`NdsInput`]
/// share one encoded table per snapshot; it is rebuilt on the pushes that touch NDS
/// (headless services' endpoint changes among them: they are full pushes).
pub fn resources(snapshot: &Snapshot, proxy: &Proxy) -> Vec<Resource> {
    if !proxy.captures_dns() || proxy.is_router() {
        return Vec::new();
    }
    let input = NdsInput::for_proxy(snapshot, proxy);
    snapshot.cached(input).into_iter().collect()
}

/// What a sidecar's name table is built from, and its cache key.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct NdsInput {
    /// Config namespace and workload labels (which services the Sidecar imports).
    pub namespace: String,
    pub labels: BTreeMap<String, String>,
    /// Which cluster's VIPs apply.
    pub cluster_id: Option<ClusterId>,
    /// Which headless endpoints are reachable directly.
    pub network: NetworkId,
    /// Whether auto-allocated addresses are used.
    pub auto: bool,
}

impl CacheInput<Snapshot> for NdsInput {
    const TYPE: TypeUrl = TypeUrl::NameTable;
    type Output = Resource;
    fn class(&self) -> Option<ProxyClass> {
        Some(ProxyClass::Sidecar)
    }
    fn generate(&self, snapshot: &Snapshot) -> Option<Resource> {
        Some(EncodedResource::encode(
            TypeUrl::NameTable,
            "",
            &self.table(snapshot),
        ))
    }
}

impl NdsInput {
    /// The input of `proxy`, as the snapshot knows its workload.
    pub fn for_proxy(snapshot: &Snapshot, proxy: &Proxy) -> NdsInput {
        let view = snapshot.proxy_view(proxy);
        NdsInput {
            namespace: view.namespace.clone(),
            labels: view.labels.clone(),
            cluster_id: proxy.cluster_id.clone(),
            network: proxy.network.clone(),
            auto: proxy.uses_auto_allocated_ips(),
        }
    }

    /// The table, from the input and the snapshot alone.
    pub fn table(&self, snapshot: &Snapshot) -> NameTable {
        table(snapshot, self)
    }
}

/// The `.clusterset.local` suffix of Kubernetes multi-cluster services, whose entries
/// carry no short name (to avoid clashing with the `cluster.local` service's).
const CLUSTERSET_SUFFIX: &str = ".clusterset.local";

/// The name table of `proxy`; `None` for gateways (Istio builds it for sidecars only).
pub fn name_table(snapshot: &Snapshot, proxy: &Proxy) -> Option<NameTable> {
    if proxy.is_router() {
        return None;
    }
    Some(table(snapshot, &NdsInput::for_proxy(snapshot, proxy)))
}

fn table(snapshot: &Snapshot, input: &NdsInput) -> NameTable {
    let mut table: BTreeMap<String, NameInfo> = BTreeMap::new();
    for service in snapshot.visible_services(&input.namespace, &input.labels) {
        let ips = addresses(snapshot, input, service);
        if ips.is_empty() {
            continue;
        }
        let ips: Vec<String> = ips.iter().map(ToString::to_string).collect();
        let host = service.hostname.as_str();
        let kube = service.provider == ProviderId::Kubernetes;
        let short = |info: &mut NameInfo| {
            if kube && !host.ends_with(CLUSTERSET_SUFFIX) {
                info.namespace = service.namespace.to_string();
                info.shortname = host.split('.').next().unwrap_or_default().to_string();
            }
        };
        match table.get_mut(host) {
            None => {
                let mut info = NameInfo {
                    ips,
                    registry: service.provider.as_str().to_string(),
                    ..Default::default()
                };
                short(&mut info);
                table.insert(host.to_string(), info);
            }
            Some(info) if info.registry != ProviderId::Kubernetes.as_str() => {
                if kube {
                    info.ips = ips;
                    info.registry = ProviderId::Kubernetes.as_str().to_string();
                    short(info);
                } else {
                    info.ips.extend(ips);
                }
            }
            Some(_) => {}
        }
    }
    NameTable {
        table: table.into_iter().collect(),
        name_info: None,
    }
}

/// The IPs the proxy's DNS answers for `service` (empty: no entry).
fn addresses(snapshot: &Snapshot, input: &NdsInput, service: &Service) -> Vec<IpAddr> {
    if let Some(ip) = service.address_for_proxy(input.cluster_id.as_ref(), input.auto) {
        // Every VIP of the cluster the address came from (dual stack, several
        // ServiceEntry addresses); an auto-allocated address alone.
        let cluster_vips = service
            .cluster_vips
            .values()
            .find(|vips| vips.contains(&ip));
        return match cluster_vips {
            Some(vips) => vips.clone(),
            None => vec![ip],
        };
    }
    if service.resolution != Resolution::Passthrough {
        return Vec::new();
    }
    let Some(first) = service.ports.first() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (_, ep) in snapshot
        .shards(&service.key())
        .iter()
        .flat_map(|s| s.iter())
    {
        if ep.hostname.is_some() || !ep.has_address() || !ep.ports.contains_key(&first.name) {
            continue;
        }
        let same_network = ep.network.as_str().is_empty()
            || input.network.as_str().is_empty()
            || ep.network == input.network;
        if same_network && !out.contains(&ep.address) {
            out.push(ep.address);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use envoy_types::pb::envoy::config::core::v3::Node;
    use meshfed_registry::{ClusterId, Endpoint, NetworkId, Port, Protocol};

    use super::*;
    use crate::generate::lds::outbound::tests::{Registry, snapshot_with_endpoints};
    use crate::model::proxy::json_to_struct;

    fn service(host: &str, provider: ProviderId, vips: &[&str]) -> Service {
        let mut s = Service::new(host, "ns", provider, "c1");
        s.ports.push(Port::new("tcp", 5432, Protocol::Tcp).unwrap());
        if !vips.is_empty() {
            s.cluster_vips.insert(
                ClusterId::new("c1"),
                vips.iter().map(|v| v.parse().unwrap()).collect(),
            );
        }
        s
    }

    fn snapshot(registries: Vec<Registry>) -> Snapshot {
        snapshot_with_endpoints(registries)
    }

    fn proxy(meta: serde_json::Value) -> Proxy {
        let node = Node {
            id: "sidecar~10.9.9.9~a-1.ns~ns.svc.cluster.local".into(),
            metadata: Some(json_to_struct(&meta)),
            ..Default::default()
        };
        Proxy::from_node(Some(&node)).unwrap()
    }

    fn entries(table: &NameTable) -> Vec<(String, Vec<String>, String, String)> {
        table
            .table
            .iter()
            .map(|(h, i)| {
                (
                    h.clone(),
                    i.ips.clone(),
                    i.registry.clone(),
                    i.shortname.clone(),
                )
            })
            .collect()
    }

    #[test]
    fn vips_headless_endpoints_and_auto_allocated_addresses() {
        let mut headless = service("db.ns.svc.cluster.local", ProviderId::Mock, &[]);
        headless.resolution = Resolution::Passthrough;
        let mut remote = Endpoint::new("10.0.0.3".parse().unwrap()).with_port("tcp", 5432);
        remote.network = NetworkId::from("other");
        let mut external = service("ext.example.com", ProviderId::Mock, &[]);
        external.resolution = Resolution::DnsLb;
        external.auto_allocated_ipv4 = Some("240.240.0.1".parse().unwrap());
        let snap = snapshot(vec![(
            ProviderId::Mock,
            vec![
                (
                    service(
                        "a.ns.svc.cluster.local",
                        ProviderId::Mock,
                        &["10.96.0.1", "fd00::1"],
                    ),
                    vec![],
                ),
                (
                    headless,
                    vec![
                        Endpoint::new("10.0.0.1".parse().unwrap()).with_port("tcp", 5432),
                        Endpoint::new("10.0.0.2".parse().unwrap()).with_port("tcp", 5432),
                        remote,
                    ],
                ),
                (external, vec![]),
            ],
        )]);
        let plain = proxy(serde_json::json!({"NETWORK": "n1"}));
        let table = name_table(&snap, &plain).unwrap();
        assert_eq!(
            entries(&table),
            [
                (
                    "a.ns.svc.cluster.local".to_string(),
                    vec!["10.96.0.1".to_string(), "fd00::1".to_string()],
                    "Mock".to_string(),
                    String::new()
                ),
                (
                    "db.ns.svc.cluster.local".to_string(),
                    vec!["10.0.0.1".to_string(), "10.0.0.2".to_string()],
                    "Mock".to_string(),
                    String::new()
                ),
            ],
            "no entry for a service without an address; other networks' endpoints left out"
        );

        let capturing =
            proxy(serde_json::json!({"DNS_CAPTURE": "true", "DNS_AUTO_ALLOCATE": "true"}));
        let table = name_table(&snap, &capturing).unwrap();
        assert_eq!(table.table["ext.example.com"].ips, ["240.240.0.1"]);
        assert_eq!(
            table.table["db.ns.svc.cluster.local"].ips.len(),
            3,
            "a proxy without a network takes every endpoint"
        );
    }

    #[test]
    fn capturing_proxies_with_the_same_view_share_one_table_and_others_get_none() {
        let snap = snapshot(vec![(
            ProviderId::Mock,
            vec![(
                service("a.ns.svc.cluster.local", ProviderId::Mock, &["10.96.0.1"]),
                vec![],
            )],
        )]);
        let capturing = |id: &str, network: &str| {
            Proxy::from_node(Some(&Node {
                id: format!("sidecar~{id}~a-1.ns~ns.svc.cluster.local"),
                metadata: Some(json_to_struct(
                    &serde_json::json!({"DNS_CAPTURE": "true", "NETWORK": network}),
                )),
                ..Default::default()
            }))
            .unwrap()
        };
        let one = resources(&snap, &capturing("10.9.9.1", "n1"));
        let two = resources(&snap, &capturing("10.9.9.2", "n1"));
        assert_eq!((one.len(), &*one[0].name), (1, ""));
        assert!(Arc::ptr_eq(&one[0], &two[0]), "one encoding for both");
        let elsewhere = resources(&snap, &capturing("10.9.9.3", "n2"));
        assert!(
            !Arc::ptr_eq(&one[0], &elsewhere[0]),
            "another network, another key"
        );
        assert!(resources(&snap, &proxy(serde_json::json!({}))).is_empty());
    }

    #[test]
    fn kubernetes_entries_carry_names_and_win_over_other_registries() {
        let in_ns = |host: &str, ns: &str, provider: ProviderId, vip: &str| {
            let mut s = service(host, provider, &[vip]);
            s.namespace = ns.into();
            (s, vec![])
        };
        let snap = snapshot(vec![
            (
                ProviderId::Kubernetes,
                vec![in_ns(
                    "a.ns.svc.cluster.local",
                    "ns",
                    ProviderId::Kubernetes,
                    "10.96.0.1",
                )],
            ),
            (
                ProviderId::External,
                vec![
                    in_ns(
                        "a.ns.svc.cluster.local",
                        "z",
                        ProviderId::External,
                        "10.96.0.9",
                    ),
                    in_ns("b.example.com", "x", ProviderId::External, "10.1.0.1"),
                    in_ns("b.example.com", "y", ProviderId::External, "10.1.0.2"),
                ],
            ),
        ]);
        let table = name_table(&snap, &proxy(serde_json::json!({}))).unwrap();
        let a = &table.table["a.ns.svc.cluster.local"];
        assert_eq!(a.ips, ["10.96.0.1"], "the Kubernetes entry stands alone");
        assert_eq!(a.registry, "Kubernetes");
        assert_eq!((a.shortname.as_str(), a.namespace.as_str()), ("a", "ns"));
        let b = &table.table["b.example.com"];
        assert_eq!(b.ips, ["10.1.0.1", "10.1.0.2"], "other registries append");
        assert_eq!((b.shortname.as_str(), b.namespace.as_str()), ("", ""));

        let gateway = Proxy::from_node(Some(&Node {
            id: "router~10.9.9.9~gw.ns~ns.svc.cluster.local".into(),
            ..Default::default()
        }))
        .unwrap();
        assert!(name_table(&snap, &gateway).is_none(), "gateways get none");
    }
}
