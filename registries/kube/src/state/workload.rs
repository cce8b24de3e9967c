//! Which workload a proxy runs as, from the published views, and the topology
//! labels every workload gets.

use super::*;

/// Adds the topology labels Istio gives every workload and proxy (reference §2.6):
/// region, zone and subzone when set, the cluster, the node, and the network unless
/// the workload names one itself.
pub(super) fn add_topology_labels(
    labels: &mut BTreeMap<String, String>,
    locality: &Locality,
    cluster: &ClusterId,
    node: Option<&str>,
    network: &NetworkId,
) {
    for (label, value) in [
        (LABEL_REGION, &locality.region),
        (LABEL_ZONE, &locality.zone),
        (LABEL_SUBZONE, &locality.subzone),
    ] {
        if !value.is_empty() {
            labels.insert(label.to_string(), value.clone());
        }
    }
    labels.insert(LABEL_CLUSTER.to_string(), cluster.to_string());
    if let Some(node) = node {
        labels.insert(LABEL_HOSTNAME.to_string(), node.to_string());
    }
    if !network.is_empty() {
        labels
            .entry(LABEL_NETWORK.to_string())
            .or_insert_with(|| network.to_string());
    }
}

/// The workload a proxy runs as (reference §2.8), from the published views:
/// - its pod: the pod at one of the proxy's IPs; when several pods share them
///   (host-network pods), the one the proxy id `<pod>.<namespace>` names, in the
///   proxy's namespace; none if that leaves it ambiguous;
/// - its labels: the pod's, plus the topology labels (locality from the pod's label,
///   else its node; network from the pod's label, else the system namespace's);
/// - its targets: every service of the pod's namespace whose (non-empty) selector
///   matches the pod's labels, each port with its target port (a named one resolved
///   among the pod's container ports; a port whose name the pod lacks is skipped),
///   once per (target port, protocol) within a service.
///
/// The caller checks the proxy's cluster; this only looks.
pub(crate) fn find_workload(
    config: &KubeRegistryConfig,
    view: &View,
    pods: &PodView,
    query: &WorkloadQuery<'_>,
) -> Option<WorkloadInstance> {
    let mut candidates: Vec<&PodRef> = Vec::new();
    for ip in query.ips {
        for pod in pods.pods.get(ip) {
            if !candidates.iter().any(|c| c.0 == pod.0) {
                candidates.push(pod);
            }
        }
    }
    let named = candidates
        .iter()
        .find(|(key, _)| key.namespace.as_str() == query.namespace && names_pod(query.id, key));
    let (key, pod) = match (named, candidates.as_slice()) {
        (Some(pod), _) => *pod,
        (None, [only]) => *only,
        _ => return None,
    };

    let mut targets = Vec::new();
    for (service_key, service) in view.in_namespace(key.namespace.as_str()) {
        let selector = &service.attributes.selector;
        if selector.is_empty() || !selector.iter().all(|(k, v)| pod.labels.get(k) == Some(v)) {
            continue;
        }
        let mut seen: Vec<(u16, Protocol)> = Vec::new();
        let ports = service.attributes.target_ports.iter();
        for (target, port) in ports.zip(&service.service.ports) {
            let number = match &target.target {
                TargetPort::Number(n) => *n,
                TargetPort::Name(name) => {
                    match pod.named_ports.iter().find(|(n, _)| **n == **name) {
                        Some((_, number)) => *number,
                        None => continue,
                    }
                }
            };
            if seen.contains(&(number, port.protocol)) {
                continue;
            }
            seen.push((number, port.protocol));
            targets.push(ServiceTarget {
                service: service_key.clone(),
                port: target.port,
                target_port: number,
            });
        }
    }

    let node = pod.node_name.as_deref();
    let locality = pod_locality(&pod.labels)
        .or_else(|| {
            node.and_then(|n| pods.nodes.get(n))
                .map(|n| n.locality.clone())
        })
        .unwrap_or_default();
    let network = pod
        .labels
        .get(LABEL_NETWORK)
        .or(pods.default_network.as_ref())
        .map(NetworkId::new)
        .unwrap_or_default();
    let mut labels = pod.labels.clone();
    add_topology_labels(&mut labels, &locality, &config.cluster_id, node, &network);
    Some(WorkloadInstance {
        name: key.name.to_string(),
        namespace: key.namespace.clone(),
        cluster_id: config.cluster_id.clone(),
        labels,
        locality,
        service_account: pod
            .service_account
            .as_deref()
            .map(|sa| spiffe_id(&config.trust_domain, key.namespace.as_str(), sa)),
        targets,
    })
}

/// Whether a proxy id `<pod>.<namespace>` names this pod.
pub(super) fn names_pod(id: &str, pod: &ObjectKey) -> bool {
    id.strip_suffix(pod.namespace.as_str())
        .and_then(|rest| rest.strip_suffix('.'))
        == Some(&*pod.name)
}

/// Every pod of the selected namespaces as a workload, whether or not a Service
/// selects it (the ambient Address type; Istio's `podWorkloadBuilder`): one endpoint
/// per pod at its first IP, with no service ports, healthy when the pod is ready. Pods
/// without an IP and completed pods are none. None at all unless the registry's
/// `ambient_workloads` is set.
pub(crate) fn pod_workloads(config: &KubeRegistryConfig, pods: &PodView) -> Vec<Endpoint> {
    if !config.ambient_workloads {
        return Vec::new();
    }
    let ctx = endpoints::PodContext {
        config,
        nodes: &pods.nodes,
        namespaces: &pods.namespaces,
    };
    let mut out = Vec::new();
    for (ip, (key, pod)) in pods.pods.iter() {
        // A pod with several IPs is listed under each: take it at its first.
        if pod.ips.first() != Some(ip) || pod.completed {
            continue;
        }
        let namespace = key.namespace.as_str();
        let ns_labels = pods.namespaces.get(namespace).map(|n| &n.labels);
        if !config.namespaces.selects(namespace, ns_labels) {
            continue;
        }
        let mut endpoint = ctx.endpoint(*ip, namespace, Some(pod), None);
        endpoint.health = if pod.ready {
            meshfed_registry::HealthStatus::Healthy
        } else {
            meshfed_registry::HealthStatus::Unhealthy
        };
        out.push(endpoint);
    }
    out
}
