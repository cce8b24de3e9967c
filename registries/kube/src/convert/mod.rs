//! Kubernetes objects -> the mesh model, as Istio's Kubernetes registry converts them
//! (reference §2.2–§2.6). Pure functions: the writer task calls them as objects arrive
//! and keeps only the compact results, never the full objects.
//!
//! This file holds the service side (keys, errors, protocol detection, Service ->
//! model); `endpoints.rs` the endpoint side (slices, pods, nodes, namespaces, health).
//!
//! A conversion fails only for input the model cannot hold (a port out of range, an
//! address that is not an IP); the caller skips that one object and counts it.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::SystemTime;

use k8s_openapi::api::core::v1::Service as KubeService;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use meshfed_registry::{
    ExportTo, MeshLocation, Namespace, Port, Protocol, ProviderId, Resolution, Service,
};
use serde::Serialize;

use crate::config::KubeRegistryConfig;

mod endpoints;

pub use endpoints::{
    Conditions, NamespaceInfo, NodeInfo, PodInfo, SliceEndpoint, SliceInfo, convert_namespace,
    convert_node, convert_pod, convert_slice, health, pod_locality,
};

/// Label on an EndpointSlice naming its Service.
pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";
/// Label on EndpointSlices managed for multi-cluster services; Istio ignores them.
pub const LABEL_MCS_SERVICE_NAME: &str = "multicluster.kubernetes.io/service-name";
/// Service annotation listing the namespaces the service is visible in.
pub const ANNOTATION_EXPORT_TO: &str = "networking.istio.io/exportTo";
/// Service annotation: SPIFFE identities taken verbatim (comma list).
pub const ANNOTATION_CANONICAL_SERVICE_ACCOUNTS: &str = "alpha.istio.io/canonical-serviceaccounts";
/// Service annotation: Kubernetes service account names in the service's namespace.
pub const ANNOTATION_KUBERNETES_SERVICE_ACCOUNTS: &str =
    "alpha.istio.io/kubernetes-serviceaccounts";
/// Pod label saying whether the workload takes Istio mTLS.
pub const LABEL_TLS_MODE: &str = "security.istio.io/tlsMode";
/// Pod label overriding the locality (`region.zone.subzone`).
pub const LABEL_LOCALITY: &str = "topology.istio.io/locality";
/// The pre-1.x spelling of [`LABEL_LOCALITY`].
pub const LABEL_LEGACY_LOCALITY: &str = "istio-locality";
/// Pod / namespace label naming the network.
pub const LABEL_NETWORK: &str = "topology.istio.io/network";
/// The label that puts a pod or namespace in the ambient mesh (`ambient`) or keeps it
/// out (`none`).
pub const LABEL_DATAPLANE_MODE: &str = "istio.io/dataplane-mode";
/// The label that names the waypoint of a pod, namespace or service.
pub const LABEL_USE_WAYPOINT: &str = "istio.io/use-waypoint";
/// The namespace of the waypoint named by [`LABEL_USE_WAYPOINT`].
pub const LABEL_USE_WAYPOINT_NAMESPACE: &str = "istio.io/use-waypoint-namespace";
/// Endpoint label naming the cluster.
pub const LABEL_CLUSTER: &str = "topology.istio.io/cluster";
/// Node / endpoint label: subzone.
pub const LABEL_SUBZONE: &str = "topology.istio.io/subzone";
/// Node / endpoint label: region.
pub const LABEL_REGION: &str = "topology.kubernetes.io/region";
/// Node / endpoint label: zone.
pub const LABEL_ZONE: &str = "topology.kubernetes.io/zone";
/// Endpoint label: the node name.
pub const LABEL_HOSTNAME: &str = "kubernetes.io/hostname";
const LABEL_REGION_BETA: &str = "failure-domain.beta.kubernetes.io/region";
const LABEL_ZONE_BETA: &str = "failure-domain.beta.kubernetes.io/zone";
/// Service labels that turn on persistent sessions (Istio's defaults of
/// `PILOT_PERSISTENT_SESSION_LABEL` / `..._HEADER_LABEL`): such services keep draining
/// endpoints.
const PERSISTENT_SESSION_LABELS: [&str; 2] = [
    "istio.io/persistent-session",
    "istio.io/persistent-session-header",
];
/// Ports of server-first protocols that must not be sniffed (reference §2.3 step 5).
const SERVER_FIRST_PORTS: [u16; 4] = [25, 53, 3306, 27017];

/// Why one object could not be converted. The object is skipped; nothing else is.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConversionError {
    /// A metadata field every object has was absent.
    #[error("metadata.{0} is missing")]
    MissingMetadata(&'static str),
    /// A Service without `spec`.
    #[error("spec is missing")]
    MissingSpec,
    /// A port number outside 1..=65535.
    #[error("{field}: port {value} is out of range 1-65535")]
    PortOutOfRange {
        /// Which field (`spec.ports[0].port`).
        field: String,
        /// The number found.
        value: i32,
    },
    /// An address field that does not hold an IP address.
    #[error("{field}: {value:?} is not an IP address")]
    BadAddress {
        /// Which field.
        field: String,
        /// The text found.
        value: String,
    },
    /// `spec.type` is not one of Kubernetes' four Service types.
    #[error("spec.type {0:?} is not a Service type")]
    UnknownServiceType(String),
    /// An EndpointSlice without the `kubernetes.io/service-name` label.
    #[error("label {LABEL_SERVICE_NAME} is missing")]
    NoServiceName,
}

/// A Kubernetes object's identity: namespace (empty for cluster-scoped kinds) and name.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct ObjectKey {
    /// Namespace; empty for Nodes and Namespaces.
    pub namespace: Namespace,
    /// Object name.
    pub name: Arc<str>,
}

impl ObjectKey {
    /// Builds a key.
    pub fn new(namespace: impl Into<Namespace>, name: &str) -> Self {
        ObjectKey {
            namespace: namespace.into(),
            name: Arc::from(name),
        }
    }

    /// The key of any object from its metadata.
    pub fn of<K: kube::Resource>(obj: &K) -> Result<Self, ConversionError> {
        let meta = obj.meta();
        let name = meta
            .name
            .as_deref()
            .ok_or(ConversionError::MissingMetadata("name"))?;
        Ok(ObjectKey::new(
            meta.namespace.as_deref().unwrap_or(""),
            name,
        ))
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() {
            f.write_str(&self.name)
        } else {
            write!(f, "{}/{}", self.namespace, self.name)
        }
    }
}

/// IP family of an EndpointSlice or a Service's primary family.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, Serialize)]
pub enum AddressFamily {
    /// `IPv4`.
    #[default]
    V4,
    /// `IPv6`.
    V6,
}

/// Kubernetes Service type.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, Serialize)]
pub enum ServiceType {
    /// `ClusterIP` (also the default when unset).
    #[default]
    ClusterIp,
    /// `NodePort`.
    NodePort,
    /// `LoadBalancer`.
    LoadBalancer,
    /// `ExternalName`: a DNS alias outside the cluster.
    ExternalName,
}

/// A service's `targetPort`: a number, or the name of a container port.
#[derive(Clone, PartialEq, Eq, Debug, Serialize)]
pub enum TargetPort {
    /// A port number on the pod.
    Number(u16),
    /// A named container port, resolved per pod.
    Name(String),
}

/// One service port and where it lands on the workloads (for a proxy's own inbound
/// services, which need the target port resolved in the pod).
#[derive(Clone, PartialEq, Eq, Debug, Serialize)]
pub struct PortTarget {
    /// Service port name.
    pub name: Arc<str>,
    /// Service port number.
    pub port: u16,
    /// Target port (defaults to the service port).
    pub target: TargetPort,
}

/// An address at which the service is reachable from outside the cluster.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Debug, Serialize)]
pub enum ExternalAddress {
    /// An IP (LoadBalancer ingress IP or `spec.externalIPs`).
    Ip(IpAddr),
    /// A LoadBalancer ingress hostname, kept unresolved as Istio does.
    Hostname(String),
}

/// The annotation that makes a NodePort service a network gateway on the nodes it
/// selects (Istio's `traffic.istio.io/nodeSelector`).
pub const ANNOTATION_NODE_SELECTOR: &str = "traffic.istio.io/nodeSelector";

/// What Istio keeps about a Kubernetes service beyond the mesh model (its
/// `K8sAttributes`, selector, external addresses): what the multi-network gateway and
/// proxy-target code need later, kept beside the service.
#[derive(Clone, PartialEq, Eq, Debug, Serialize)]
pub struct KubeAttributes {
    /// The Service object's name.
    pub name: String,
    /// Service type.
    pub service_type: ServiceType,
    /// `spec.externalName` of an ExternalName service: the DNS name clients resolve.
    pub external_name: Option<String>,
    /// `spec.selector`; empty for selector-less services.
    pub selector: BTreeMap<String, String>,
    /// Port -> target port, in spec order.
    pub target_ports: Vec<PortTarget>,
    /// Service port -> node port (NodePort / LoadBalancer services).
    pub node_ports: BTreeMap<u16, u16>,
    /// LoadBalancer ingress and `spec.externalIPs`, in that order, de-duplicated.
    pub external_addresses: Vec<ExternalAddress>,
    /// A NodePort gateway's node selector (annotation `traffic.istio.io/nodeSelector`,
    /// a JSON map of node labels; `{}` selects every node): its external addresses are
    /// the `ExternalIP`s of the nodes it selects, its ports their node ports. Only for
    /// `NodePort` services, as in Istio.
    pub node_selector: Option<BTreeMap<String, String>>,
    /// `internalTrafficPolicy: Local`: clients only use endpoints on their own node.
    pub node_local: bool,
    /// `publishNotReadyAddresses`.
    pub publish_not_ready: bool,
    /// The primary IP family (`spec.ipFamilies[0]`); only EndpointSlices of this
    /// family are read, since the model has one address per endpoint.
    pub ip_family: AddressFamily,
    /// Persistent sessions are on: not-ready but serving endpoints are `Draining`.
    pub persistent_sessions: bool,
}

/// A converted Service: the mesh model plus the Kubernetes extras.
#[derive(Clone, PartialEq, Debug)]
pub struct ConvertedService {
    /// The service as the mesh sees it.
    pub service: Arc<Service>,
    /// Kubernetes-only attributes.
    pub attributes: Arc<KubeAttributes>,
}

impl ConvertedService {
    /// Whether the service is exported to nobody (`exportTo: ~`): Istio neither pushes
    /// nor writes endpoints for such a service.
    pub fn exported_to_none(&self) -> bool {
        self.service.export_to.0.contains("~")
    }
}

/// Istio's `ConvertProtocol` (reference §2.3): UDP first, then `appProtocol` (with
/// the `kubernetes.io/h2c|ws|wss` names) or else the port name, a `grpc-web` prefix,
/// the prefix before the first `-`, and TCP for unsniffable server-first ports.
pub fn convert_protocol(
    port: u16,
    name: &str,
    protocol: Option<&str>,
    app_protocol: Option<&str>,
) -> Protocol {
    if protocol == Some("UDP") {
        return Protocol::Udp;
    }
    let name = match app_protocol {
        Some("kubernetes.io/h2c") => return Protocol::Http2,
        Some("kubernetes.io/ws") => return Protocol::Http,
        Some("kubernetes.io/wss") => return Protocol::Https,
        Some(app) => app,
        None => name,
    };
    if name
        .get(..8)
        .is_some_and(|p| p.eq_ignore_ascii_case("grpc-web"))
    {
        return Protocol::GrpcWeb;
    }
    let prefix = name.split('-').next().unwrap_or("");
    match Protocol::parse(prefix) {
        Protocol::Unsupported if SERVER_FIRST_PORTS.contains(&port) => Protocol::Tcp,
        p => p,
    }
}

fn port_number(field: impl FnOnce() -> String, value: i32) -> Result<u16, ConversionError> {
    u16::try_from(value)
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| ConversionError::PortOutOfRange {
            field: field(),
            value,
        })
}

fn parse_ip(field: impl FnOnce() -> String, value: &str) -> Result<IpAddr, ConversionError> {
    value.parse().map_err(|_| ConversionError::BadAddress {
        field: field(),
        value: value.to_string(),
    })
}

fn comma_list(value: &str) -> impl Iterator<Item = &str> {
    value.split(',').map(str::trim).filter(|s| !s.is_empty())
}

/// The hostname of service `name` in `namespace`: `name.namespace.svc.<domain>`.
pub fn service_hostname(name: &str, namespace: &str, domain: &str) -> String {
    format!("{name}.{namespace}.svc.{domain}")
}

/// The SPIFFE identity of a Kubernetes service account.
pub fn spiffe_id(trust_domain: &str, namespace: &str, service_account: &str) -> String {
    format!("spiffe://{trust_domain}/ns/{namespace}/sa/{service_account}")
}

/// Service -> model service (reference §2.2).
pub fn convert_service(
    svc: &KubeService,
    config: &KubeRegistryConfig,
) -> Result<ConvertedService, ConversionError> {
    let key = ObjectKey::of(svc)?;
    if key.namespace.is_empty() {
        return Err(ConversionError::MissingMetadata("namespace"));
    }
    let spec = svc.spec.as_ref().ok_or(ConversionError::MissingSpec)?;
    let meta = &svc.metadata;
    let annotations = meta.annotations.as_ref();
    let annotation = |name: &str| annotations.and_then(|a| a.get(name)).map(String::as_str);
    let hostname = service_hostname(&key.name, key.namespace.as_str(), &config.domain);
    let mut service = Service::new(
        hostname,
        key.namespace.clone(),
        ProviderId::Kubernetes,
        config.cluster_id.clone(),
    );
    let service_type = match spec.type_.as_deref() {
        None | Some("ClusterIP") => ServiceType::ClusterIp,
        Some("NodePort") => ServiceType::NodePort,
        Some("LoadBalancer") => ServiceType::LoadBalancer,
        Some("ExternalName") => ServiceType::ExternalName,
        Some(other) => return Err(ConversionError::UnknownServiceType(other.to_string())),
    };

    // Addresses: `None` is headless; the list form wins over the single field.
    let cluster_ips: Vec<&str> = match (&spec.cluster_ips, &spec.cluster_ip) {
        (Some(ips), _) if !ips.is_empty() => ips.iter().map(String::as_str).collect(),
        (_, Some(ip)) if !ip.is_empty() => vec![ip.as_str()],
        _ => Vec::new(),
    };
    let external_name = spec
        .external_name
        .clone()
        .filter(|n| service_type == ServiceType::ExternalName && !n.is_empty());
    if cluster_ips.first() == Some(&"None") {
        service.resolution = Resolution::Passthrough;
    } else if !cluster_ips.is_empty() {
        let vips = cluster_ips
            .iter()
            .enumerate()
            .map(|(i, ip)| parse_ip(|| format!("spec.clusterIPs[{i}]"), ip))
            .collect::<Result<Vec<_>, _>>()?;
        service.cluster_vips.insert(config.cluster_id.clone(), vips);
    }
    if let Some(target) = &external_name {
        // Istio's alias: clients resolve the name to the target through Kubernetes DNS
        // (a CNAME); the mesh matches the alias's name wherever it matches the target.
        service.resolution = Resolution::Alias;
        service.location = MeshLocation::MeshExternal;
        service.alias_for = Some(target.to_ascii_lowercase().into());
        service.cluster_vips.clear();
    }

    let mut target_ports = Vec::new();
    let mut node_ports = BTreeMap::new();
    for (i, p) in spec.ports.iter().flatten().enumerate() {
        let number = port_number(|| format!("spec.ports[{i}].port"), p.port)?;
        let name = p.name.as_deref().unwrap_or("");
        let protocol = convert_protocol(
            number,
            name,
            p.protocol.as_deref(),
            p.app_protocol.as_deref(),
        );
        let port = Port::new(name, number, protocol).expect("port checked non-zero");
        let target = match &p.target_port {
            None => TargetPort::Number(number),
            Some(IntOrString::Int(t)) => {
                TargetPort::Number(port_number(|| format!("spec.ports[{i}].targetPort"), *t)?)
            }
            Some(IntOrString::String(s)) => match s.parse::<i32>() {
                Ok(t) => {
                    TargetPort::Number(port_number(|| format!("spec.ports[{i}].targetPort"), t)?)
                }
                Err(_) => TargetPort::Name(s.clone()),
            },
        };
        // The ambient Service's target port: a number as given, 0 for a name (none
        // given: not recorded).
        match &target {
            _ if p.target_port.is_none() => {}
            TargetPort::Number(t) => {
                service.target_ports.insert(number, *t);
            }
            TargetPort::Name(_) => {
                service.target_ports.insert(number, 0);
            }
        }
        if let Some(node_port) = p.node_port.filter(|n| *n != 0) {
            node_ports.insert(
                number,
                port_number(|| format!("spec.ports[{i}].nodePort"), node_port)?,
            );
        }
        target_ports.push(PortTarget {
            name: port.name.clone(),
            port: number,
            target,
        });
        service.ports.push(port);
    }

    let mut external_addresses = Vec::new();
    let ingress = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref());
    for (i, ingress) in ingress.into_iter().flatten().enumerate() {
        if let Some(ip) = ingress.ip.as_deref().filter(|s| !s.is_empty()) {
            external_addresses.push(ExternalAddress::Ip(parse_ip(
                || format!("status.loadBalancer.ingress[{i}].ip"),
                ip,
            )?));
        } else if let Some(host) = ingress.hostname.as_deref().filter(|s| !s.is_empty()) {
            external_addresses.push(ExternalAddress::Hostname(host.to_string()));
        }
    }
    for (i, ip) in spec.external_ips.iter().flatten().enumerate() {
        let ip = ExternalAddress::Ip(parse_ip(|| format!("spec.externalIPs[{i}]"), ip)?);
        if !external_addresses.contains(&ip) {
            external_addresses.push(ip);
        }
    }

    if let Some(labels) = &meta.labels {
        service.labels = labels.clone();
    }
    service.traffic_distribution = meshfed_registry::TrafficDistribution::parse(
        spec.traffic_distribution.as_deref(),
        annotation(meshfed_registry::TRAFFIC_DISTRIBUTION_ANNOTATION),
    );
    service.publish_not_ready = spec.publish_not_ready_addresses.unwrap_or(false);
    service.node_local = spec.internal_traffic_policy.as_deref() == Some("Local");
    if let Some(export_to) = annotation(ANNOTATION_EXPORT_TO) {
        service.export_to = ExportTo(comma_list(export_to).map(str::to_string).collect());
    }
    if let Some(accounts) = annotation(ANNOTATION_CANONICAL_SERVICE_ACCOUNTS) {
        service
            .service_accounts
            .extend(comma_list(accounts).map(str::to_string));
    }
    if let Some(accounts) = annotation(ANNOTATION_KUBERNETES_SERVICE_ACCOUNTS) {
        service.service_accounts.extend(
            comma_list(accounts)
                .map(|sa| spiffe_id(&config.trust_domain, key.namespace.as_str(), sa)),
        );
    }
    service.creation_time = meta
        .creation_timestamp
        .as_ref()
        .map(|t| SystemTime::from(t.0))
        .unwrap_or(SystemTime::UNIX_EPOCH);

    let persistent_sessions = PERSISTENT_SESSION_LABELS
        .iter()
        .any(|l| service.labels.get(*l).is_some_and(|v| !v.is_empty()));
    let attributes = KubeAttributes {
        name: key.name.to_string(),
        service_type,
        external_name,
        selector: spec.selector.clone().unwrap_or_default(),
        target_ports,
        node_ports,
        external_addresses,
        node_selector: match (service_type, annotation(ANNOTATION_NODE_SELECTOR)) {
            (ServiceType::NodePort, Some(json)) => {
                match serde_json::from_str::<BTreeMap<String, String>>(json) {
                    Ok(selector) => Some(selector),
                    Err(e) => {
                        tracing::warn!(
                            service = %format!("{}/{}", key.namespace, key.name),
                            annotation = ANNOTATION_NODE_SELECTOR,
                            "not a JSON map of node labels, the service is no NodePort gateway: {e}"
                        );
                        None
                    }
                }
            }
            _ => None,
        },
        node_local: spec.internal_traffic_policy.as_deref() == Some("Local"),
        publish_not_ready: spec.publish_not_ready_addresses.unwrap_or(false),
        ip_family: match spec.ip_families.as_ref().and_then(|f| f.first()) {
            Some(f) if f == "IPv6" => AddressFamily::V6,
            _ => AddressFamily::V4,
        },
        persistent_sessions,
    };
    Ok(ConvertedService {
        service: Arc::new(service),
        attributes: Arc::new(attributes),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ServicePort, ServiceSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    #[test]
    fn protocol_detection_follows_the_reference_table() {
        use Protocol::*;
        // (port name, port, protocol, appProtocol, expected)
        type Case<'a> = (&'a str, u16, Option<&'a str>, Option<&'a str>, Protocol);
        let cases: &[Case] = &[
            // The test vectors of reference §2.3.
            ("http2-web", 80, Some("TCP"), None, Http2),
            ("foo", 3306, None, None, Tcp),
            ("foo", 8080, None, None, Unsupported),
            ("tcp", 80, None, Some("http"), Http),
            ("x", 53, Some("UDP"), None, Udp),
            // UDP wins over everything, even appProtocol.
            ("http", 80, Some("UDP"), Some("http"), Udp),
            // Kubernetes' own appProtocol names.
            ("tcp", 80, None, Some("kubernetes.io/h2c"), Http2),
            ("tcp", 80, None, Some("kubernetes.io/ws"), Http),
            ("tcp", 443, None, Some("kubernetes.io/wss"), Https),
            // grpc-web before the prefix split, case-insensitively.
            ("grpc-web", 80, None, None, GrpcWeb),
            ("GRPC-Web-api", 80, None, None, GrpcWeb),
            ("x", 80, None, Some("grpc-web"), GrpcWeb),
            // Prefix before the first '-'.
            ("http-api", 80, None, None, Http),
            ("grpc-x", 80, None, None, Grpc),
            ("https-admin", 443, None, None, Https),
            ("mongo-db", 27017, None, None, Mongo),
            ("redis", 6379, None, None, Redis),
            ("mysql", 3306, None, None, Mysql),
            ("tls-passthrough", 443, None, None, Tls),
            ("httpfoo", 80, None, None, Unsupported),
            ("HTTP", 80, None, None, Http),
            ("", 80, None, None, Unsupported),
            // Unknown names on server-first ports are TCP; known ones keep their protocol.
            ("smtp", 25, None, None, Tcp),
            ("", 53, Some("TCP"), None, Tcp),
            ("db", 27017, None, None, Tcp),
            ("http", 25, None, None, Http),
            // An unknown appProtocol on a server-first port is TCP too.
            ("http", 3306, None, Some("mysql-x"), Mysql),
            ("http", 3306, None, Some("custom"), Tcp),
            // SCTP is detected like TCP.
            ("http", 80, Some("SCTP"), None, Http),
        ];
        for (name, port, proto, app, want) in cases {
            assert_eq!(
                convert_protocol(*port, name, *proto, *app),
                *want,
                "name={name:?} port={port} protocol={proto:?} appProtocol={app:?}"
            );
        }
    }

    fn service(spec: ServiceSpec) -> KubeService {
        KubeService {
            metadata: ObjectMeta {
                name: Some("reviews".into()),
                namespace: Some("default".into()),
                ..Default::default()
            },
            spec: Some(spec),
            status: None,
        }
    }

    fn port(name: &str, port: i32) -> ServicePort {
        ServicePort {
            name: Some(name.into()),
            port,
            ..Default::default()
        }
    }

    #[test]
    fn service_conversion_covers_addresses_and_types() {
        let config = KubeRegistryConfig::new("c1");
        let converted = convert_service(
            &service(ServiceSpec {
                cluster_ip: Some("10.0.0.1".into()),
                cluster_ips: Some(vec!["10.0.0.1".into(), "fd00::1".into()]),
                ports: Some(vec![port("http", 80)]),
                ..Default::default()
            }),
            &config,
        )
        .unwrap();
        let s = &converted.service;
        assert_eq!(s.hostname.as_str(), "reviews.default.svc.cluster.local");
        assert_eq!(
            s.cluster_vips[&meshfed_registry::ClusterId::new("c1")].len(),
            2
        );
        assert_eq!(s.resolution, Resolution::ClientSideLb);
        assert_eq!(s.ports[0].protocol, Protocol::Http);
        assert_eq!(
            converted.attributes.target_ports[0].target,
            TargetPort::Number(80)
        );

        let headless = convert_service(
            &service(ServiceSpec {
                cluster_ip: Some("None".into()),
                ..Default::default()
            }),
            &config,
        )
        .unwrap();
        assert_eq!(headless.service.resolution, Resolution::Passthrough);
        assert!(headless.service.cluster_vips.is_empty());

        let external = convert_service(
            &service(ServiceSpec {
                type_: Some("ExternalName".into()),
                external_name: Some("db.example.com".into()),
                ..Default::default()
            }),
            &config,
        )
        .unwrap();
        assert_eq!(external.service.location, MeshLocation::MeshExternal);
        assert_eq!(external.service.resolution, Resolution::Alias);
        assert_eq!(
            external.service.alias_for.as_ref().map(|h| h.as_str()),
            Some("db.example.com")
        );
        assert_eq!(
            external.attributes.external_name.as_deref(),
            Some("db.example.com")
        );
    }

    #[test]
    fn service_conversion_rejects_what_the_model_cannot_hold() {
        let config = KubeRegistryConfig::new("c1");
        let bad_port = service(ServiceSpec {
            ports: Some(vec![port("http", 70000)]),
            ..Default::default()
        });
        assert!(matches!(
            convert_service(&bad_port, &config),
            Err(ConversionError::PortOutOfRange { value: 70000, .. })
        ));
        let bad_ip = service(ServiceSpec {
            cluster_ip: Some("10.0.0.300".into()),
            ..Default::default()
        });
        assert!(matches!(
            convert_service(&bad_ip, &config),
            Err(ConversionError::BadAddress { .. })
        ));
        let mut no_name = service(ServiceSpec::default());
        no_name.metadata.name = None;
        assert_eq!(
            convert_service(&no_name, &config),
            Err(ConversionError::MissingMetadata("name"))
        );
    }

    #[test]
    fn annotations_and_labels_carry_over() {
        let config = KubeRegistryConfig::new("c1");
        let mut svc = service(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            external_ips: Some(vec!["192.0.2.7".into()]),
            ports: Some(vec![ServicePort {
                node_port: Some(30080),
                target_port: Some(IntOrString::String("web".into())),
                ..port("http", 80)
            }]),
            ..Default::default()
        });
        svc.metadata.annotations = Some(BTreeMap::from([
            (
                ANNOTATION_EXPORT_TO.to_string(),
                " ., istio-system ".to_string(),
            ),
            (
                ANNOTATION_CANONICAL_SERVICE_ACCOUNTS.to_string(),
                "spiffe://other/ns/x/sa/y".to_string(),
            ),
            (
                ANNOTATION_KUBERNETES_SERVICE_ACCOUNTS.to_string(),
                "reviews,ratings".to_string(),
            ),
        ]));
        svc.metadata.labels = Some(BTreeMap::from([("app".to_string(), "r".to_string())]));
        let converted = convert_service(&svc, &config).unwrap();
        let s = &converted.service;
        assert_eq!(
            s.export_to.0.iter().map(String::as_str).collect::<Vec<_>>(),
            vec![".", "istio-system"]
        );
        assert!(s.service_accounts.contains("spiffe://other/ns/x/sa/y"));
        assert!(
            s.service_accounts
                .contains("spiffe://cluster.local/ns/default/sa/ratings")
        );
        assert_eq!(s.labels["app"], "r");
        let a = &converted.attributes;
        assert_eq!(a.service_type, ServiceType::LoadBalancer);
        assert_eq!(a.node_ports[&80], 30080);
        assert_eq!(a.target_ports[0].target, TargetPort::Name("web".into()));
        assert_eq!(
            a.external_addresses,
            vec![ExternalAddress::Ip("192.0.2.7".parse().unwrap())]
        );
    }

    /// What the ambient Service is built from: numeric target ports (0 for a name,
    /// none recorded when not given), traffic distribution (the spec before the
    /// annotation), `publishNotReadyAddresses`, `internalTrafficPolicy: Local`.
    #[test]
    fn ambient_fields_carry_over() {
        let config = KubeRegistryConfig::new("c1");
        let mut svc = service(ServiceSpec {
            ports: Some(vec![
                ServicePort {
                    target_port: Some(IntOrString::Int(8080)),
                    ..port("http", 80)
                },
                ServicePort {
                    target_port: Some(IntOrString::String("web".into())),
                    ..port("web", 81)
                },
                port("plain", 82),
            ]),
            traffic_distribution: Some("PreferSameNode".into()),
            publish_not_ready_addresses: Some(true),
            internal_traffic_policy: Some("Local".into()),
            ..Default::default()
        });
        svc.metadata.annotations = Some(BTreeMap::from([(
            meshfed_registry::TRAFFIC_DISTRIBUTION_ANNOTATION.to_string(),
            "PreferClose".to_string(),
        )]));
        let s = convert_service(&svc, &config).unwrap().service;
        assert_eq!(s.target_ports, BTreeMap::from([(80, 8080), (81, 0)]));
        assert_eq!(
            s.traffic_distribution,
            meshfed_registry::TrafficDistribution::PreferSameNode
        );
        assert!(s.publish_not_ready);
        assert!(s.node_local);
        // Without the spec field, the annotation (any case).
        let mut svc = service(ServiceSpec {
            ports: Some(vec![port("http", 80)]),
            ..Default::default()
        });
        svc.metadata.annotations = Some(BTreeMap::from([(
            meshfed_registry::TRAFFIC_DISTRIBUTION_ANNOTATION.to_string(),
            "preferclose".to_string(),
        )]));
        let s = convert_service(&svc, &config).unwrap().service;
        assert_eq!(
            s.traffic_distribution,
            meshfed_registry::TrafficDistribution::PreferSameZone
        );
        assert!(!s.publish_not_ready && !s.node_local);
    }
}
