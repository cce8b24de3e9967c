//! The proxy's own service instances: which service ports its workload backs, found by
//! matching the proxy's IPs against the endpoints in the snapshot (Istio's
//! GetProxyServiceTargets). Inbound clusters and listeners are built from them.

use std::collections::BTreeSet;
use std::sync::Arc;

use meshfed_registry::{Port, ProviderId, Service};

use crate::ads::node::Proxy;
use crate::push::snapshot::Snapshot;

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

/// The service ports whose endpoints carry one of the proxy's IPs, in service order
/// (hostname, namespace) then port order, each once. As in Istio, every service counts,
/// whatever its exportTo; when the proxy names its cluster (`CLUSTER_ID`), the endpoints
/// of other Kubernetes clusters (which may reuse pod IPs) are not the proxy.
pub fn proxy_instances(snapshot: &Snapshot, proxy: &Proxy) -> Vec<ProxyInstance> {
    let proxy_cluster = proxy.cluster_id.as_ref().map(|c| c.as_str());
    let mut out = Vec::new();
    for service in snapshot.services.all() {
        let Some(shards) = snapshot.shards(&service.key()) else {
            continue;
        };
        let mut seen: BTreeSet<u16> = BTreeSet::new();
        for (shard, ep) in shards.iter() {
            if !proxy.ip_addresses.contains(&ep.address) {
                continue;
            }
            if let Some(c) = proxy_cluster
                && shard.provider == ProviderId::Kubernetes
                && shard.cluster.as_str() != c
            {
                continue;
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
        // Keep the service's port order whatever order the endpoints came in.
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
    use crate::ads::node::json_to_struct;
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
            &PushRequest::forced(TriggerReason::Global),
            &aggregate,
            &index,
            Snapshot::empty().mesh.clone(),
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

    #[test]
    fn instances_are_the_service_ports_of_the_proxy_ips() {
        let snap = snapshot();
        let found: Vec<(String, u16, u16)> = proxy_instances(&snap, &proxy("10.0.0.1", None))
            .into_iter()
            .map(|i| {
                (
                    i.service.hostname.to_string(),
                    i.port.port.get(),
                    i.target_port,
                )
            })
            .collect();
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
}
