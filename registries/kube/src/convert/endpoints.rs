//! The endpoint side: EndpointSlices, Pods, Nodes and Namespaces in their compact
//! in-memory forms, endpoint health and pod locality.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Namespace as KubeNamespace, Node, Pod};
use k8s_openapi::api::discovery::v1::{EndpointConditions, EndpointSlice};
use meshfed_registry::{HealthStatus, Locality, WorkloadOwner};

use super::{
    AddressFamily, ConversionError, LABEL_LEGACY_LOCALITY, LABEL_LOCALITY, LABEL_MCS_SERVICE_NAME,
    LABEL_REGION, LABEL_REGION_BETA, LABEL_SERVICE_NAME, LABEL_SUBZONE, LABEL_ZONE,
    LABEL_ZONE_BETA, parse_ip, port_number,
};

/// The endpoint conditions that decide health.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct Conditions {
    /// `conditions.ready`.
    pub ready: Option<bool>,
    /// `conditions.serving`.
    pub serving: Option<bool>,
    /// `conditions.terminating`.
    pub terminating: Option<bool>,
}

impl From<Option<&EndpointConditions>> for Conditions {
    fn from(c: Option<&EndpointConditions>) -> Self {
        c.map(|c| Conditions {
            ready: c.ready,
            serving: c.serving,
            terminating: c.terminating,
        })
        .unwrap_or_default()
    }
}

/// Endpoint health from its slice conditions (reference §2.4): ready (or unset) is
/// healthy; otherwise draining for persistent-session services that still serve;
/// otherwise terminating unless `terminating` is explicitly false; else unhealthy.
pub fn health(c: Conditions, persistent_sessions: bool) -> HealthStatus {
    if c.ready != Some(false) {
        return HealthStatus::Healthy;
    }
    if persistent_sessions && c.serving != Some(false) && c.terminating != Some(false) {
        return HealthStatus::Draining;
    }
    if c.terminating != Some(false) {
        return HealthStatus::Terminating;
    }
    HealthStatus::Unhealthy
}

/// One endpoint of a slice, as kept in memory.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct SliceEndpoint {
    /// Addresses (the slice controller writes exactly one).
    pub addresses: Vec<IpAddr>,
    /// Readiness conditions.
    pub conditions: Conditions,
    /// Name of the Pod in `targetRef`, when the target is a Pod.
    pub pod: Option<Arc<str>>,
    /// `nodeName`.
    pub node_name: Option<Arc<str>>,
}

/// An EndpointSlice, as kept in memory.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct SliceInfo {
    /// The Service it belongs to (same namespace).
    pub service: Arc<str>,
    /// Address family.
    pub family: AddressFamily,
    /// Service port name -> port on the endpoints. Ports without a number are left
    /// out (they mean "all ports", which the model cannot express).
    pub ports: Vec<(Arc<str>, u16)>,
    /// Endpoints.
    pub endpoints: Vec<SliceEndpoint>,
}

/// EndpointSlice -> compact slice. `Ok(None)` for slices Istio ignores: FQDN slices and
/// slices of multi-cluster services.
pub fn convert_slice(slice: &EndpointSlice) -> Result<Option<SliceInfo>, ConversionError> {
    let labels = slice.metadata.labels.as_ref();
    if labels.is_some_and(|l| l.contains_key(LABEL_MCS_SERVICE_NAME)) {
        return Ok(None);
    }
    let family = match slice.address_type.as_str() {
        "IPv4" => AddressFamily::V4,
        "IPv6" => AddressFamily::V6,
        _ => return Ok(None),
    };
    let service = labels
        .and_then(|l| l.get(LABEL_SERVICE_NAME))
        .filter(|s| !s.is_empty())
        .ok_or(ConversionError::NoServiceName)?;
    let mut ports = Vec::new();
    for (i, p) in slice.ports.iter().flatten().enumerate() {
        if let Some(port) = p.port {
            let number = port_number(|| format!("ports[{i}].port"), port)?;
            ports.push((Arc::from(p.name.as_deref().unwrap_or("")), number));
        }
    }
    let mut endpoints = Vec::with_capacity(slice.endpoints.len());
    for (i, e) in slice.endpoints.iter().enumerate() {
        let addresses = e
            .addresses
            .iter()
            .enumerate()
            .map(|(j, a)| parse_ip(|| format!("endpoints[{i}].addresses[{j}]"), a))
            .collect::<Result<Vec<_>, _>>()?;
        let pod = e
            .target_ref
            .as_ref()
            .filter(|r| r.kind.as_deref() == Some("Pod"))
            .and_then(|r| r.name.as_deref())
            .map(Arc::from);
        endpoints.push(SliceEndpoint {
            addresses,
            conditions: e.conditions.as_ref().into(),
            pod,
            node_name: e.node_name.as_deref().map(Arc::from),
        });
    }
    Ok(Some(SliceInfo {
        service: Arc::from(service.as_str()),
        family,
        ports,
        endpoints,
    }))
}

/// A Pod, as kept in memory: what endpoints and (later) proxy targets need.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct PodInfo {
    /// Pod labels.
    pub labels: BTreeMap<String, String>,
    /// Pod IPs (`status.podIPs`, else `status.podIP`).
    pub ips: Vec<IpAddr>,
    /// `spec.serviceAccountName`.
    pub service_account: Option<Arc<str>>,
    /// `spec.nodeName`.
    pub node_name: Option<Arc<str>>,
    /// Named container ports (for named service target ports).
    pub named_ports: Vec<(Arc<str>, u16)>,
    /// `metadata.name`.
    pub name: Arc<str>,
    /// `metadata.uid` (empty when unset).
    pub uid: Arc<str>,
    /// The workload the pod belongs to (its Deployment, Job or CronJob, else itself).
    pub owner: (Arc<str>, WorkloadOwner),
    /// The `ambient.istio.io/redirection: enabled` annotation.
    pub ambient_redirected: bool,
    /// `spec.hostNetwork`.
    pub host_network: bool,
    /// The `Ready` condition is `True` (an ambient workload's status).
    pub ready: bool,
    /// `status.phase` is `Succeeded`: no longer a workload.
    pub completed: bool,
    /// `metadata.creationTimestamp` (`None` when unset).
    pub creation_time: Option<std::time::SystemTime>,
}

/// The annotation istio-cni sets on pods whose traffic it redirects to ztunnel.
pub const ANNOTATION_AMBIENT_REDIRECTION: &str = "ambient.istio.io/redirection";

/// The Deployment, Job or CronJob a pod belongs to, as Istio derives it from the
/// controller reference: a ReplicaSet named `<deployment>-<pod-template-hash>` is a
/// Deployment's; a Job named `<cronjob>-<8 to 10 digits>` a CronJob's; any other
/// controller names the workload (type POD); a pod without one names itself.
fn pod_owner(pod: &Pod, name: &str) -> (Arc<str>, WorkloadOwner) {
    let controller = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true));
    let labels = pod.metadata.labels.as_ref();
    match controller {
        Some(r) if r.kind == "ReplicaSet" => {
            let hash = labels.and_then(|l| l.get("pod-template-hash"));
            if let Some(deployment) = hash
                .and_then(|h| r.name.strip_suffix(h.as_str()))
                .and_then(|n| n.strip_suffix('-'))
            {
                return (Arc::from(deployment), WorkloadOwner::Deployment);
            }
        }
        Some(r) if r.kind == "Job" => {
            if let Some((cron, stamp)) = r.name.rsplit_once('-')
                && (8..=10).contains(&stamp.len())
                && stamp.bytes().all(|b| b.is_ascii_digit())
                && !cron.is_empty()
            {
                return (Arc::from(cron), WorkloadOwner::CronJob);
            }
            return (Arc::from(r.name.as_str()), WorkloadOwner::Job);
        }
        Some(r) if r.kind == "Deployment" => {
            return (Arc::from(r.name.as_str()), WorkloadOwner::Deployment);
        }
        Some(r) if r.kind == "CronJob" => {
            return (Arc::from(r.name.as_str()), WorkloadOwner::CronJob);
        }
        _ => {}
    }
    // Any other controller (a StatefulSet, a DaemonSet, a ReplicaSet of no
    // Deployment) names the workload; its type stays POD.
    match controller {
        Some(r) => (Arc::from(r.name.as_str()), WorkloadOwner::Pod),
        None => (Arc::from(name), WorkloadOwner::Pod),
    }
}

/// Pod -> compact pod. `Ok(None)` for Failed pods, which Istio does not watch.
pub fn convert_pod(pod: &Pod) -> Result<Option<PodInfo>, ConversionError> {
    let status = pod.status.as_ref();
    if status.and_then(|s| s.phase.as_deref()) == Some("Failed") {
        return Ok(None);
    }
    let mut ips = Vec::new();
    if let Some(pod_ips) = status.and_then(|s| s.pod_ips.as_ref()) {
        for (i, ip) in pod_ips.iter().enumerate() {
            ips.push(parse_ip(|| format!("status.podIPs[{i}]"), &ip.ip)?);
        }
    }
    if let Some(ip) = status
        .and_then(|s| s.pod_ip.as_deref())
        .filter(|s| !s.is_empty())
    {
        let ip = parse_ip(|| "status.podIP".to_string(), ip)?;
        if !ips.contains(&ip) {
            ips.insert(0, ip);
        }
    }
    let spec = pod.spec.as_ref();
    let mut named_ports = Vec::new();
    for (ci, container) in spec
        .map(|s| s.containers.as_slice())
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        for (pi, p) in container.ports.iter().flatten().enumerate() {
            if let Some(name) = p.name.as_deref() {
                let number = port_number(
                    || format!("spec.containers[{ci}].ports[{pi}].containerPort"),
                    p.container_port,
                )?;
                named_ports.push((Arc::from(name), number));
            }
        }
    }
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    Ok(Some(PodInfo {
        name: Arc::from(name),
        uid: Arc::from(pod.metadata.uid.as_deref().unwrap_or_default()),
        owner: pod_owner(pod, name),
        ambient_redirected: pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION_AMBIENT_REDIRECTION))
            .is_some_and(|v| v == "enabled"),
        host_network: spec.and_then(|s| s.host_network).unwrap_or(false),
        ready: status
            .and_then(|s| s.conditions.as_ref())
            .into_iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True"),
        completed: status.and_then(|s| s.phase.as_deref()) == Some("Succeeded"),
        creation_time: pod
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| std::time::SystemTime::from(t.0)),
        labels: pod.metadata.labels.clone().unwrap_or_default(),
        ips,
        service_account: spec
            .and_then(|s| s.service_account_name.as_deref())
            .filter(|s| !s.is_empty())
            .map(Arc::from),
        node_name: spec
            .and_then(|s| s.node_name.as_deref())
            .filter(|s| !s.is_empty())
            .map(Arc::from),
        named_ports,
    }))
}

/// A Node, as kept in memory: its locality and external IPs.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct NodeInfo {
    /// From the topology labels (reference §2.6).
    pub locality: Locality,
    /// `ExternalIP` addresses (NodePort gateways).
    pub external_ips: Vec<IpAddr>,
    /// The node's labels (what a NodePort gateway's node selector matches).
    pub labels: BTreeMap<String, String>,
}

/// Node -> compact node. Unparseable external IPs are skipped (they only matter for
/// NodePort gateways, and one bad address must not hide the node's locality).
pub fn convert_node(node: &Node) -> NodeInfo {
    let labels = node.metadata.labels.as_ref();
    let label = |primary: &str, fallback: Option<&str>| -> String {
        let get = |k: &str| labels.and_then(|l| l.get(k)).cloned();
        get(primary)
            .or_else(|| fallback.and_then(get))
            .unwrap_or_default()
    };
    let external_ips = node
        .status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .into_iter()
        .flatten()
        .filter(|a| a.type_ == "ExternalIP")
        .filter_map(|a| a.address.parse().ok())
        .collect();
    NodeInfo {
        locality: Locality {
            region: label(LABEL_REGION, Some(LABEL_REGION_BETA)),
            zone: label(LABEL_ZONE, Some(LABEL_ZONE_BETA)),
            subzone: label(LABEL_SUBZONE, None),
        },
        external_ips,
        labels: labels.cloned().unwrap_or_default(),
    }
}

/// A Namespace, as kept in memory: its labels (selection, default network).
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct NamespaceInfo {
    /// Namespace labels.
    pub labels: BTreeMap<String, String>,
}

/// Namespace -> compact namespace.
pub fn convert_namespace(ns: &KubeNamespace) -> NamespaceInfo {
    NamespaceInfo {
        labels: ns.metadata.labels.clone().unwrap_or_default(),
    }
}

/// The locality a pod's labels set (`topology.istio.io/locality`, else the legacy
/// `istio-locality`; dots stand for slashes since label values cannot hold `/`).
pub fn pod_locality(labels: &BTreeMap<String, String>) -> Option<Locality> {
    labels
        .get(LABEL_LOCALITY)
        .or_else(|| labels.get(LABEL_LEGACY_LOCALITY))
        .filter(|v| !v.is_empty())
        .map(|v| Locality::parse(&v.replace('.', "/")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_follows_the_conditions() {
        let c = |ready, serving, terminating| Conditions {
            ready,
            serving,
            terminating,
        };
        assert_eq!(health(c(None, None, None), false), HealthStatus::Healthy);
        assert_eq!(
            health(c(Some(true), None, None), false),
            HealthStatus::Healthy
        );
        assert_eq!(
            health(c(Some(false), Some(false), Some(false)), false),
            HealthStatus::Unhealthy
        );
        assert_eq!(
            health(c(Some(false), Some(true), Some(true)), false),
            HealthStatus::Terminating
        );
        assert_eq!(
            health(c(Some(false), Some(true), Some(true)), true),
            HealthStatus::Draining
        );
        assert_eq!(
            health(c(Some(false), Some(false), Some(true)), true),
            HealthStatus::Terminating
        );
    }

    #[test]
    fn pod_locality_label_uses_dots() {
        let labels = BTreeMap::from([(LABEL_LOCALITY.to_string(), "r1.z1.s1".to_string())]);
        assert_eq!(pod_locality(&labels).unwrap().to_string(), "r1/z1/s1");
        assert!(pod_locality(&BTreeMap::new()).is_none());
    }
}
