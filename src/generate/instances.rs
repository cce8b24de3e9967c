//! The proxy's own service instances: which service ports its workload backs (Istio's
//! GetProxyServiceTargets). Inbound clusters and listeners are built from them.
//!
//! The registry that knows the proxy's workload answers first: on Kubernetes, the pod
//! at the proxy's IP and the services selecting it, so a pod that no EndpointSlice
//! lists yet (not ready, or the slice not yet updated) still serves its ports.
//! Everything else is found by matching the proxy's IPs against endpoints: the
//! registries without workloads (ServiceEntry/WorkloadEntry, Consul, mock), other
//! clusters' endpoints for a proxy naming no cluster, and a pod no service selects
//! (selector-less services with hand-written slices).

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;

use meshfed_api::networking::v1alpha3::{CaptureMode, Sidecar};
use meshfed_registry::{Port, ProviderId, Service};

use crate::model::proxy::Proxy;
use crate::push::config_index::Config;
use crate::push::snapshot::Snapshot;

/// The Sidecar scoping the proxy when it declares `ingress` listeners: they then
/// replace the inbound ports of the proxy's service instances (Istio's
/// `HasIngressListener`, without `PILOT_ALLOW_SIDECAR_SERVICE_INBOUND_LISTENER_MERGE`).
pub fn sidecar_ingress(snapshot: &Snapshot, proxy: &Proxy) -> Option<Arc<Config<Sidecar>>> {
    snapshot
        .config()
        .sidecar_for(&proxy.namespace, &proxy.labels)
        .filter(|s| !s.spec.ingress.is_empty())
        .cloned()
}

/// Whether an ingress (or egress) listener with this `captureMode` binds a real
/// listener: `NONE` does, `DEFAULT` does when the proxy has no interception (Istio's
/// `getBindToPort`).
pub fn binds_to_port(capture_mode: i32, interception_none: bool) -> bool {
    match CaptureMode::try_from(capture_mode).unwrap_or(CaptureMode::Default) {
        CaptureMode::Default => interception_none,
        mode => mode == CaptureMode::None,
    }
}

/// One service port the proxy's workload serves.
#[derive(Clone, Debug, PartialEq)]
pub struct ProxyInstance {
    /// The service.
    pub service: Arc<Service>,
    /// The service port.
    pub port: Port,
    /// The port the workload listens on for it.
    pub target_port: u16,
}

/// The service ports the proxy's workload serves, in service order (hostname,
/// namespace) then port order, each once: the targets of its workload when a registry
/// knows it and some service selects it (that registry's cluster is then not matched
/// by endpoints), plus the service ports whose endpoints carry one of the proxy's IPs.
/// As in Istio, every service counts, whatever its exportTo; when the proxy names its
/// cluster (`CLUSTER_ID`), the endpoints of other Kubernetes clusters (which may reuse
/// pod IPs) are not the proxy.
pub fn proxy_instances(snapshot: &Snapshot, proxy: &Proxy) -> Vec<ProxyInstance> {
    let proxy_cluster = proxy.cluster_id.as_ref().map(|c| c.as_str());
    let workload = snapshot.workload(proxy).filter(|w| !w.targets.is_empty());
    let answered_cluster = workload.as_ref().map(|w| w.cluster_id.as_str());
    // Only the services with an endpoint at one of the proxy's addresses, or that
    // its workload backs, can have instances.
    let candidates: HashSet<&meshfed_registry::ServiceKey> = proxy
        .ip_addresses
        .iter()
        .flat_map(|ip| snapshot.services_at(ip))
        .chain(
            workload
                .iter()
                .flat_map(|w| w.targets.iter().map(|t| &t.service)),
        )
        .collect();
    let mut out = Vec::new();
    if candidates.is_empty() {
        return out;
    }
    for service in snapshot.services().all() {
        let key = service.key();
        if !candidates.contains(&key) {
            continue;
        }
        let mut seen: BTreeSet<u16> = BTreeSet::new();
        let targets = workload
            .iter()
            .flat_map(|w| &w.targets)
            .filter(|t| t.service == key);
        for target in targets {
            if let Some(port) = service.port(target.port)
                && seen.insert(target.port)
            {
                out.push(ProxyInstance {
                    service: service.clone(),
                    port: port.clone(),
                    target_port: target.target_port,
                });
            }
        }
        for (shard, ep) in snapshot.shards(&key).iter().flat_map(|s| s.iter()) {
            if !proxy.ip_addresses.contains(&ep.address) {
                continue;
            }
            if shard.provider == ProviderId::Kubernetes {
                let cluster = Some(shard.cluster.as_str());
                if cluster == answered_cluster || proxy_cluster.is_some_and(|c| Some(c) != cluster)
                {
                    continue;
                }
            }
            for port in &service.ports {
                if let Some(&target) = ep.ports.get(&port.name)
                    && seen.insert(port.port.get())
                {
                    out.push(ProxyInstance {
                        service: service.clone(),
                        port: port.clone(),
                        target_port: target,
                    });
                }
            }
        }
        // Keep the service's port order whatever order the targets and endpoints
        // came in.
        if seen.len() > 1 {
            let start = out.len() - seen.len();
            let order =
                |p: &ProxyInstance| service.ports.iter().position(|q| q.port == p.port.port);
            out[start..].sort_by_key(order);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::config::core::v3::Node;
    use meshfed_registry::{
        Aggregate, Endpoint, EndpointIndex, MemoryRegistry, Protocol, ProviderId, PushRequest,
        TriggerReason, UpdateSink,
    };

    use super::*;
    use crate::model::proxy::json_to_struct;
    use crate::push::config_index::ConfigIndex;

    fn snapshot() -> Snapshot {
        let index = Arc::new(EndpointIndex::new());
        let (sink, _rx) = UpdateSink::new(index.clone());
        let aggregate = Aggregate::new("c1");
        let reg = MemoryRegistry::new("c1", sink);
        for (host, ports) in [
            (
                "a.ns.svc.cluster.local",
                vec![("http", 80, 8080), ("grpc", 90, 9090)],
            ),
            ("b.ns.svc.cluster.local", vec![("tcp", 5432, 5432)]),
        ] {
            let mut s = Service::new(host, "ns", ProviderId::Mock, "c1");
            let mut e = Endpoint::new("10.0.0.1".parse().unwrap());
            let mut other = Endpoint::new("10.0.0.2".parse().unwrap());
            for (name, port, target) in ports {
                s.ports
                    .push(Port::new(name, port, Protocol::parse(name)).unwrap());
                e = e.with_port(name, target);
                other = other.with_port(name, target);
            }
            let key = s.key();
            reg.add_service(s);
            // The proxy's endpoint after another one, and twice in a: once per shard
            // would be the same.
            reg.set_endpoints(&key, vec![other, e]);
        }
        aggregate.add_registry(Arc::new(reg));
        Snapshot::build(
            &Snapshot::empty(),
            &crate::xds::deps::PushScope::new(&PushRequest::forced(TriggerReason::Global)),
            &aggregate,
            &index,
            Arc::new(Snapshot::empty().mesh().clone()),
            &|_| ConfigIndex::default(),
            1,
        )
    }

    fn proxy(ips: &str, cluster: Option<&str>) -> Proxy {
        let mut meta = serde_json::json!({"INSTANCE_IPS": ips});
        if let Some(c) = cluster {
            meta["CLUSTER_ID"] = c.into();
        }
        let node = Node {
            id: "sidecar~10.9.9.9~a-1.ns~ns.svc.cluster.local".into(),
            metadata: Some(json_to_struct(&meta)),
            ..Default::default()
        };
        Proxy::from_node(Some(&node)).unwrap()
    }

    /// (hostname, service port, target port) of each instance.
    fn found(snap: &Snapshot, proxy: &Proxy) -> Vec<(String, u16, u16)> {
        proxy_instances(snap, proxy)
            .into_iter()
            .map(|i| {
                (
                    i.service.hostname.to_string(),
                    i.port.port.get(),
                    i.target_port,
                )
            })
            .collect()
    }

    #[test]
    fn instances_are_the_service_ports_of_the_proxy_ips() {
        let snap = snapshot();
        let found = found(&snap, &proxy("10.0.0.1", None));
        assert_eq!(
            found,
            vec![
                ("a.ns.svc.cluster.local".to_string(), 80, 8080),
                ("a.ns.svc.cluster.local".to_string(), 90, 9090),
                ("b.ns.svc.cluster.local".to_string(), 5432, 5432),
            ]
        );
        assert!(proxy_instances(&snap, &proxy("10.0.0.7", None)).is_empty());
        // Any of the proxy's IPs; the mock registry is not filtered by cluster.
        assert_eq!(
            proxy_instances(&snap, &proxy("fd00::1,10.0.0.2", Some("other"))).len(),
            3
        );
    }

    /// A Kubernetes-like registry of cluster `c1`: one service selecting one pod that
    /// no endpoint lists yet, and an endpoint of a second service at the pod's IP that
    /// only endpoint matching could find.
    #[derive(Clone, Debug)]
    struct PodRegistry {
        cluster: meshfed_registry::ClusterId,
        services: Vec<Arc<Service>>,
        labels: std::collections::BTreeMap<String, String>,
    }

    impl meshfed_registry::ServiceRegistry for PodRegistry {
        fn provider(&self) -> ProviderId {
            ProviderId::Kubernetes
        }
        fn cluster_id(&self) -> &meshfed_registry::ClusterId {
            &self.cluster
        }
        fn services(&self) -> Vec<Arc<Service>> {
            self.services.clone()
        }
        fn has_synced(&self) -> bool {
            true
        }
        fn workloads(&self) -> Option<Arc<dyn meshfed_registry::WorkloadLookup>> {
            Some(Arc::new(self.clone()))
        }
    }

    impl meshfed_registry::WorkloadLookup for PodRegistry {
        fn find(
            &self,
            query: &meshfed_registry::WorkloadQuery<'_>,
        ) -> Option<meshfed_registry::WorkloadInstance> {
            let pod_ip: std::net::IpAddr = "10.1.0.5".parse().unwrap();
            if query.cluster.is_some_and(|c| *c != self.cluster) || !query.ips.contains(&pod_ip) {
                return None;
            }
            Some(meshfed_registry::WorkloadInstance {
                name: "reviews-1".into(),
                namespace: "ns".into(),
                cluster_id: self.cluster.clone(),
                labels: self.labels.clone(),
                locality: meshfed_registry::Locality::parse("r1/z1"),
                service_account: None,
                targets: vec![meshfed_registry::ServiceTarget {
                    service: meshfed_registry::ServiceKey::new(
                        "reviews.ns.svc.cluster.local",
                        "ns",
                    ),
                    port: 9080,
                    target_port: 9081,
                }],
            })
        }
    }

    fn pod_snapshot() -> Snapshot {
        let index = Arc::new(EndpointIndex::new());
        let aggregate = Aggregate::new("c1");
        let mut services = Vec::new();
        for (host, port) in [("reviews", 9080), ("legacy", 7000)] {
            let mut s = Service::new(
                format!("{host}.ns.svc.cluster.local"),
                "ns",
                ProviderId::Kubernetes,
                "c1",
            );
            s.ports
                .push(Port::new("http", port, Protocol::Http).unwrap());
            services.push(Arc::new(s));
        }
        // The pod's IP in `legacy`'s shard (a hand-written slice): with the pod known
        // and selected, its own cluster's endpoints are not consulted.
        let shard = meshfed_registry::ShardKey::new(ProviderId::Kubernetes, "c1");
        index.update(
            &shard,
            &services[1].key(),
            vec![Endpoint::new("10.1.0.5".parse().unwrap()).with_port("http", 7000)],
        );
        aggregate.add_registry(Arc::new(PodRegistry {
            cluster: "c1".into(),
            services,
            labels: [("app".to_string(), "reviews".to_string())].into(),
        }));
        Snapshot::build(
            &Snapshot::empty(),
            &crate::xds::deps::PushScope::new(&PushRequest::forced(TriggerReason::Global)),
            &aggregate,
            &index,
            Arc::new(Snapshot::empty().mesh().clone()),
            &|_| ConfigIndex::default(),
            1,
        )
    }

    #[test]
    fn a_pod_no_endpoint_lists_gets_the_inbound_cluster_of_the_service_selecting_it() {
        let snap = pod_snapshot();
        // No LABELS in the metadata: the pod's labels are the proxy's.
        let sidecar = proxy("10.1.0.5", None);
        assert!(sidecar.labels.is_empty());
        let found = found(&snap, &sidecar);
        assert_eq!(
            found,
            vec![("reviews.ns.svc.cluster.local".to_string(), 9080, 9081)]
        );
        let inbound: Vec<String> = crate::generate::cds::cached_inbound(&snap, &sidecar)
            .iter()
            .map(|r| r.name.to_string())
            .collect();
        assert!(
            inbound.contains(&"inbound|9081||".to_string()),
            "{inbound:?}"
        );
        let seen = snap.proxy_view(&sidecar);
        assert_eq!(seen.labels["app"], "reviews");
        assert_eq!(seen.locality.zone, "z1");

        // A proxy of another cluster at the same IP is not this pod: only endpoint
        // matching applies, and other clusters' endpoints are not it either.
        let elsewhere = proxy("10.1.0.5", Some("c2"));
        assert!(proxy_instances(&snap, &elsewhere).is_empty());
        assert!(snap.proxy_view(&elsewhere).labels.is_empty());
        // No CLUSTER_ID and no pod at the IP: endpoints as before.
        assert!(proxy_instances(&snap, &proxy("10.1.0.6", None)).is_empty());
    }

    #[test]
    fn a_proxy_asks_again_where_the_answers_are_not_shared() {
        let sidecar = proxy("10.1.0.5", None);
        // Asked where no registry knows the pod: no workload, remembered so...
        let empty = Snapshot::empty();
        assert!(empty.workload(&sidecar).is_none());
        assert!(empty.proxy_view(&sidecar).labels.is_empty());
        // ...for those answers only: a snapshot with answers of its own finds the pod,
        // and that is remembered in turn.
        let snap = pod_snapshot();
        assert_eq!(snap.proxy_view(&sidecar).labels["app"], "reviews");
        assert!(empty.workload(&sidecar).is_none());
        assert!(snap.workload(&sidecar).is_some());
        // A copy of the proxy remembers nothing.
        assert!(sidecar.clone().workload_memo.get(0).is_none());
    }
}
