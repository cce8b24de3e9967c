//! The mesh model every registry converts into: services, ports, endpoints and the
//! identifiers that tie them to the registry and cluster they came from.
//!
//! Everything here is plain data. Strings that are keys (hostnames, cluster ids, networks)
//! are `Arc<str>` newtypes so that the same name held by thousands of endpoints and
//! snapshots costs one allocation, and comparisons are typed (a `ClusterId` is never
//! confused with a `NetworkId`).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::num::NonZeroU16;
use std::sync::Arc;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

macro_rules! name_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(Arc<str>);

        impl $name {
            /// Wraps a name.
            pub fn new(name: impl AsRef<str>) -> Self {
                Self(Arc::from(name.as_ref()))
            }

            /// The name as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }

            /// True for the empty name (e.g. "no network").
            pub fn is_empty(&self) -> bool {
                self.0.is_empty()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{:?}", &*self.0)
            }
        }

        impl From<&str> for $name {
            fn from(s: &str) -> Self {
                Self::new(s)
            }
        }

        impl From<String> for $name {
            fn from(s: String) -> Self {
                Self(Arc::from(s))
            }
        }

        impl std::borrow::Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl Default for $name {
            fn default() -> Self {
                Self::new("")
            }
        }
    };
}

name_type!(
    /// A service's fully qualified host name, the primary key of a service in the mesh
    /// (`reviews.default.svc.cluster.local`, `api.example.com`, `*.example.com`).
    Hostname
);
name_type!(
    /// The id of a cluster a registry reads from (`Kubernetes`, `cluster-2`, a Consul
    /// datacenter). Also the `CLUSTER_ID` a proxy announces.
    ClusterId
);
name_type!(
    /// A network in the meshNetworks sense: endpoints in one network reach each other
    /// directly; other networks are reached through their gateways. Empty = unknown.
    NetworkId
);
name_type!(
    /// A namespace name. Every service and config object lives in one.
    Namespace
);

impl Hostname {
    /// True for a wildcard host such as `*.example.com` or `*`.
    pub fn is_wildcard(&self) -> bool {
        self.0.starts_with('*')
    }
}

/// Which kind of registry produced a service or an endpoint shard. The names are
/// Istio's provider ids (`External` is the ServiceEntry registry); a registry crate
/// outside this workspace's built-in ones names its own ([`ProviderId::Named`]).
/// Serialized as its name.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub enum ProviderId {
    /// A Kubernetes cluster (local or remote).
    Kubernetes,
    /// Istio ServiceEntry / WorkloadEntry configuration.
    External,
    /// A Consul catalog.
    Consul,
    /// The in-memory mock registry (tests, demos, the mock-registry file).
    Mock,
    /// Any other registry, by the provider name it gives itself (`Nacos`, `Eureka`).
    Named(&'static str),
}

impl ProviderId {
    /// The provider name as Istio spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderId::Kubernetes => "Kubernetes",
            ProviderId::External => "External",
            ProviderId::Consul => "Consul",
            ProviderId::Mock => "Mock",
            ProviderId::Named(name) => name,
        }
    }
}

impl fmt::Display for ProviderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for ProviderId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for ProviderId {
    /// The built-in providers by name; a [`ProviderId::Named`] one is never read back.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        Ok(match name.as_str() {
            "Kubernetes" => ProviderId::Kubernetes,
            "External" => ProviderId::External,
            "Consul" => ProviderId::Consul,
            "Mock" => ProviderId::Mock,
            other => {
                return Err(serde::de::Error::custom(format!(
                    "unknown provider {other:?} (known: Kubernetes, External, Consul, Mock)"
                )));
            }
        })
    }
}

/// Identifies one registry's contribution of endpoints for a service: Istio's
/// `ShardKey`, rendered `Provider/Cluster` (e.g. `Kubernetes/cluster-1`).
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct ShardKey {
    /// Cluster the registry reads from.
    pub cluster: ClusterId,
    /// Kind of registry.
    pub provider: ProviderId,
}

impl ShardKey {
    /// Builds a shard key.
    pub fn new(provider: ProviderId, cluster: impl Into<ClusterId>) -> Self {
        Self {
            cluster: cluster.into(),
            provider,
        }
    }
}

impl fmt::Display for ShardKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.provider, self.cluster)
    }
}

impl Serialize for ShardKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// A service is identified by hostname within a namespace: the same hostname may exist
/// in several namespaces (ServiceEntries) and is then several services.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Serialize)]
pub struct ServiceKey {
    /// Fully qualified hostname.
    pub hostname: Hostname,
    /// Namespace the service is declared in.
    pub namespace: Namespace,
}

impl ServiceKey {
    /// Builds a key.
    pub fn new(hostname: impl Into<Hostname>, namespace: impl Into<Namespace>) -> Self {
        Self {
            hostname: hostname.into(),
            namespace: namespace.into(),
        }
    }
}

impl fmt::Display for ServiceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.hostname)
    }
}

/// Application protocol of a service port (Istio's protocol names). Anything Istio's
/// parser does not know becomes [`Protocol::Unsupported`], which means "sniff".
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default)]
pub enum Protocol {
    Grpc,
    GrpcWeb,
    Http,
    HttpProxy,
    Http2,
    Https,
    Tcp,
    Tls,
    Udp,
    Mongo,
    Redis,
    Mysql,
    /// Unknown: auto-detected by the proxy.
    #[default]
    Unsupported,
}

impl Protocol {
    /// Istio's case-insensitive parse; unknown names give `Unsupported`.
    pub fn parse(s: &str) -> Protocol {
        match s.to_ascii_lowercase().as_str() {
            "grpc" => Protocol::Grpc,
            "grpc-web" => Protocol::GrpcWeb,
            "http" => Protocol::Http,
            "http_proxy" => Protocol::HttpProxy,
            "http2" => Protocol::Http2,
            "https" => Protocol::Https,
            "tcp" => Protocol::Tcp,
            "tls" => Protocol::Tls,
            "udp" => Protocol::Udp,
            "mongo" => Protocol::Mongo,
            "redis" => Protocol::Redis,
            "mysql" => Protocol::Mysql,
            _ => Protocol::Unsupported,
        }
    }

    /// Strict parse: `None` for names Istio does not know (used where a typo should be
    /// an error rather than silently sniffed).
    pub fn parse_known(s: &str) -> Option<Protocol> {
        match Protocol::parse(s) {
            Protocol::Unsupported if !s.eq_ignore_ascii_case("unsupported") => None,
            p => Some(p),
        }
    }

    /// The canonical Istio spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Grpc => "GRPC",
            Protocol::GrpcWeb => "GRPC-Web",
            Protocol::Http => "HTTP",
            Protocol::HttpProxy => "HTTP_PROXY",
            Protocol::Http2 => "HTTP2",
            Protocol::Https => "HTTPS",
            Protocol::Tcp => "TCP",
            Protocol::Tls => "TLS",
            Protocol::Udp => "UDP",
            Protocol::Mongo => "Mongo",
            Protocol::Redis => "Redis",
            Protocol::Mysql => "MySQL",
            Protocol::Unsupported => "UnsupportedProtocol",
        }
    }

    /// HTTP family: routed through an HTTP connection manager.
    pub fn is_http(self) -> bool {
        matches!(
            self,
            Protocol::Http
                | Protocol::Http2
                | Protocol::HttpProxy
                | Protocol::Grpc
                | Protocol::GrpcWeb
        )
    }

    /// Needs HTTP/2 to the upstream.
    pub fn is_http2(self) -> bool {
        matches!(self, Protocol::Http2 | Protocol::Grpc | Protocol::GrpcWeb)
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Protocol {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// A named service port.
#[derive(Clone, PartialEq, Eq, Debug, Serialize)]
pub struct Port {
    /// Port name; endpoints refer to service ports by this name.
    pub name: Arc<str>,
    /// Port number the service listens on (never 0).
    pub port: NonZeroU16,
    /// Application protocol.
    pub protocol: Protocol,
}

impl Port {
    /// Builds a port; `None` for port number 0.
    pub fn new(name: &str, port: u16, protocol: Protocol) -> Option<Port> {
        Some(Port {
            name: Arc::from(name),
            port: NonZeroU16::new(port)?,
            protocol,
        })
    }
}

/// How clients find the endpoints of a service (decides the Envoy cluster type).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, Serialize)]
pub enum Resolution {
    /// Endpoints served by EDS, load balanced by the client.
    #[default]
    ClientSideLb,
    /// DNS resolution of the endpoints' host names (STRICT_DNS).
    DnsLb,
    /// DNS, one connection target at a time (LOGICAL_DNS).
    DnsRoundRobinLb,
    /// Forward to the original destination (ORIGINAL_DST).
    Passthrough,
    /// A DNS alias of another name (a Kubernetes `ExternalName` Service, whose target
    /// is [`Service::alias_for`]): no cluster or listener of its own; wherever the
    /// target service is matched by name, the alias's name matches too (Istio's
    /// `Alias` resolution).
    Alias,
}

/// Whether a service is part of the mesh (its workloads run proxies) or outside it.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, Serialize)]
pub enum MeshLocation {
    /// Inside the mesh: Istio mTLS may be used.
    #[default]
    MeshInternal,
    /// Outside the mesh.
    MeshExternal,
}

/// Namespace visibility of a service (`exportTo`). An empty set means "the default"
/// which resolves to public unless the mesh config says otherwise.
#[derive(Clone, PartialEq, Eq, Debug, Default, Serialize)]
pub struct ExportTo(pub BTreeSet<String>);

impl ExportTo {
    /// Visible everywhere (`*`).
    pub fn public() -> Self {
        ExportTo(BTreeSet::from(["*".to_string()]))
    }

    /// Whether a proxy in `client_ns` may see a service declared in `service_ns`.
    pub fn visible_to(&self, service_ns: &str, client_ns: &str) -> bool {
        if self.0.is_empty() || self.0.contains("*") {
            return true;
        }
        if self.0.contains("~") {
            return false;
        }
        (self.0.contains(".") && service_ns == client_ns) || self.0.contains(client_ns)
    }
}

/// One service as a registry sees it.
#[derive(Clone, PartialEq, Debug, Serialize)]
pub struct Service {
    /// Fully qualified host name.
    pub hostname: Hostname,
    /// Declaring namespace.
    pub namespace: Namespace,
    /// Ports, in declaration order.
    pub ports: Vec<Port>,
    /// Virtual IPs per cluster (dual stack gives several); merged across clusters by the
    /// aggregate. Empty for headless/external services.
    pub cluster_vips: BTreeMap<ClusterId, Vec<IpAddr>>,
    /// Address ranges per cluster: CIDR addresses wider than one host (a ServiceEntry's
    /// `10.0.0.0/16`), kept masked as `<network>/<len>`. Sidecars reach such a service
    /// through the wildcard listener of its port, matching these prefixes.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub cluster_cidrs: BTreeMap<ClusterId, Vec<String>>,
    /// How endpoints are resolved.
    pub resolution: Resolution,
    /// Mesh internal or external.
    pub location: MeshLocation,
    /// Service labels.
    pub labels: BTreeMap<String, String>,
    /// Namespace visibility.
    pub export_to: ExportTo,
    /// SPIFFE identities the service's workloads may present.
    pub service_accounts: BTreeSet<String>,
    /// When the source object was created; the older service wins hostname conflicts.
    pub creation_time: SystemTime,
    /// Registry kind that produced the service.
    pub provider: ProviderId,
    /// Cluster of the registry that produced the service.
    pub cluster_id: ClusterId,
    /// The IPv4 address Istio's legacy auto-allocation gives a ServiceEntry service
    /// without addresses (`240.240.x.y`; see `serviceentry::auto_allocation`). Only
    /// proxies that capture DNS and ask for it use it ([`Service::address_for_proxy`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auto_allocated_ipv4: Option<Ipv4Addr>,
    /// The IPv6 address of the same allocation (`2001:2::f0f0:..`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auto_allocated_ipv6: Option<Ipv6Addr>,
    /// The name an [`Resolution::Alias`] service stands for (a Kubernetes
    /// `ExternalName` Service's `spec.externalName`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alias_for: Option<Hostname>,
    /// Per service port number, the target port its source gives as a number (`0`:
    /// a named target port, resolved per workload): a Kubernetes Service's
    /// `spec.ports[].targetPort`. Empty when the source does not say.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub target_ports: BTreeMap<u16, u16>,
    /// How clients should prefer nearby endpoints (`spec.trafficDistribution`, else
    /// the `networking.istio.io/traffic-distribution` annotation).
    #[serde(skip_serializing_if = "TrafficDistribution::is_any")]
    pub traffic_distribution: TrafficDistribution,
    /// `spec.publishNotReadyAddresses`: endpoints are used whether ready or not.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub publish_not_ready: bool,
    /// `spec.internalTrafficPolicy: Local`: clients use endpoints on their own node
    /// only.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub node_local: bool,
    /// The name of the object that declared the service when that is not the first
    /// label of its host name: a ServiceEntry's `metadata.name`. Empty otherwise.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub object_name: String,
}

/// Istio's annotation for a service's traffic distribution (on a Kubernetes Service
/// before it had `spec.trafficDistribution`, and on a ServiceEntry).
pub const TRAFFIC_DISTRIBUTION_ANNOTATION: &str = "networking.istio.io/traffic-distribution";

/// A service's preference for nearby endpoints, as Istio reads Kubernetes'
/// `spec.trafficDistribution`.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, Serialize)]
pub enum TrafficDistribution {
    /// Any endpoint.
    #[default]
    Any,
    /// The same zone first, then region, then network (`PreferClose`,
    /// `PreferSameZone`).
    PreferSameZone,
    /// The same node first, then subzone, zone, region and network
    /// (`PreferSameNode`).
    PreferSameNode,
}

impl TrafficDistribution {
    /// `spec.trafficDistribution` when it names a preference, else the annotation's
    /// value (case-insensitive), as Istio's `GetTrafficDistribution`.
    pub fn parse(spec: Option<&str>, annotation: Option<&str>) -> TrafficDistribution {
        match spec {
            Some("PreferSameZone" | "PreferClose") => return TrafficDistribution::PreferSameZone,
            Some("PreferSameNode") => return TrafficDistribution::PreferSameNode,
            _ => {}
        }
        match annotation.map(str::to_ascii_lowercase).as_deref() {
            Some("preferclose" | "prefersamezone") => TrafficDistribution::PreferSameZone,
            Some("prefersamenode") => TrafficDistribution::PreferSameNode,
            _ => TrafficDistribution::Any,
        }
    }

    /// No preference.
    pub fn is_any(&self) -> bool {
        *self == TrafficDistribution::Any
    }
}

impl Service {
    /// A service with the given hostname and namespace and every other field at its
    /// default: no ports, client-side LB, mesh internal, created "now".
    pub fn new(
        hostname: impl Into<Hostname>,
        namespace: impl Into<Namespace>,
        provider: ProviderId,
        cluster_id: impl Into<ClusterId>,
    ) -> Service {
        Service {
            hostname: hostname.into(),
            namespace: namespace.into(),
            ports: Vec::new(),
            cluster_vips: BTreeMap::new(),
            cluster_cidrs: BTreeMap::new(),
            resolution: Resolution::ClientSideLb,
            location: MeshLocation::MeshInternal,
            labels: BTreeMap::new(),
            export_to: ExportTo::default(),
            service_accounts: BTreeSet::new(),
            creation_time: SystemTime::UNIX_EPOCH,
            provider,
            cluster_id: cluster_id.into(),
            auto_allocated_ipv4: None,
            auto_allocated_ipv6: None,
            alias_for: None,
            target_ports: BTreeMap::new(),
            traffic_distribution: TrafficDistribution::Any,
            publish_not_ready: false,
            node_local: false,
            object_name: String::new(),
        }
    }

    /// The `(hostname, namespace)` key.
    pub fn key(&self) -> ServiceKey {
        ServiceKey {
            hostname: self.hostname.clone(),
            namespace: self.namespace.clone(),
        }
    }

    /// The port with the given number.
    pub fn port(&self, number: u16) -> Option<&Port> {
        self.ports.iter().find(|p| p.port.get() == number)
    }

    /// The port with the given name.
    pub fn port_by_name(&self, name: &str) -> Option<&Port> {
        self.ports.iter().find(|p| &*p.name == name)
    }

    /// The address a proxy in `cluster` should use: that cluster's VIP if it has one,
    /// else the first VIP of the lowest cluster id, else none (headless/external).
    pub fn address_for(&self, cluster: Option<&ClusterId>) -> Option<IpAddr> {
        if let Some(ip) = cluster
            .and_then(|c| self.cluster_vips.get(c))
            .and_then(|v| v.first())
        {
            return Some(*ip);
        }
        self.cluster_vips.values().find_map(|v| v.first().copied())
    }

    /// The address a proxy uses for this service (Istio's `GetAddressForProxy`): its
    /// cluster's VIP; else, for a proxy that uses auto-allocated addresses
    /// (`uses_auto_allocated`: metadata `DNS_AUTO_ALLOCATE` and `DNS_CAPTURE`) and a
    /// service without VIPs, the allocated IPv4 address (preferred) or IPv6 address;
    /// else [`Service::address_for`].
    pub fn address_for_proxy(
        &self,
        cluster: Option<&ClusterId>,
        uses_auto_allocated: bool,
    ) -> Option<IpAddr> {
        if let Some(ip) = cluster
            .and_then(|c| self.cluster_vips.get(c))
            .and_then(|v| v.first())
        {
            return Some(*ip);
        }
        if uses_auto_allocated && self.cluster_vips.values().all(Vec::is_empty) {
            let auto = self
                .auto_allocated_ipv4
                .map(IpAddr::V4)
                .or(self.auto_allocated_ipv6.map(IpAddr::V6));
            if auto.is_some() {
                return auto;
            }
        }
        self.address_for(cluster)
    }
}

/// A `region/zone/subzone` locality; empty parts are allowed.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default, Serialize)]
pub struct Locality {
    pub region: String,
    pub zone: String,
    pub subzone: String,
}

impl Locality {
    /// Parses `region/zone/subzone` (missing trailing parts are empty).
    pub fn parse(label: &str) -> Locality {
        let mut parts = label.splitn(3, '/');
        Locality {
            region: parts.next().unwrap_or("").to_string(),
            zone: parts.next().unwrap_or("").to_string(),
            subzone: parts.next().unwrap_or("").to_string(),
        }
    }

    /// True when no part is set.
    pub fn is_empty(&self) -> bool {
        self.region.is_empty() && self.zone.is_empty() && self.subzone.is_empty()
    }
}

impl fmt::Display for Locality {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return Ok(());
        }
        write!(f, "{}/{}/{}", self.region, self.zone, self.subzone)
    }
}

/// Health of an endpoint (Istio's values).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, Serialize, Deserialize)]
pub enum HealthStatus {
    #[default]
    Healthy,
    Unhealthy,
    Draining,
    Terminating,
}

/// Whether the workload can take Istio mutual TLS (a sidecar or a mesh-aware client).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, Serialize, Deserialize)]
pub enum TlsMode {
    /// Plain text only.
    #[default]
    Disabled,
    /// Accepts Istio mTLS.
    Istio,
}

impl TlsMode {
    /// The label value (`security.istio.io/tlsMode`).
    pub fn as_str(self) -> &'static str {
        match self {
            TlsMode::Disabled => "disabled",
            TlsMode::Istio => "istio",
        }
    }
}

/// One workload instance backing a service. An endpoint serves one or more service
/// ports, each on its own target port.
#[derive(Clone, PartialEq, Debug, Serialize)]
pub struct Endpoint {
    /// Workload IP (unspecified for a [`Endpoint::hostname`] endpoint).
    pub address: IpAddr,
    /// A DNS name to connect to instead of `address`: the endpoints of DNS
    /// ServiceEntries (Envoy STRICT_DNS / LOGICAL_DNS clusters resolve it). Only DNS
    /// clusters can carry such endpoints; EDS needs IPs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hostname: Option<Hostname>,
    /// Service port name -> the port the workload listens on.
    pub ports: BTreeMap<Arc<str>, u16>,
    /// Workload labels.
    pub labels: BTreeMap<String, String>,
    /// Where the workload runs.
    pub locality: Locality,
    /// Network the workload is on (empty = unknown).
    pub network: NetworkId,
    /// Cluster the workload runs in.
    pub cluster_id: ClusterId,
    /// Health.
    pub health: HealthStatus,
    /// Load balancing weight; 0 means 1.
    pub weight: u32,
    /// Whether it takes Istio mTLS.
    pub tls_mode: TlsMode,
    /// SPIFFE identity, if known.
    pub service_account: Option<String>,
    /// The object the endpoint is (a pod, a WorkloadEntry, a ServiceEntry endpoint, a
    /// Consul instance...), when its registry knows it: what ambient workloads and
    /// certificate impersonation are built from. Not part of the endpoint's debug
    /// output (`/debug/endpointz` and the like show the endpoint, not the object).
    #[serde(skip)]
    pub workload: Option<Arc<WorkloadMeta>>,
}

/// What kind of object a workload is.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default, Serialize, PartialOrd, Ord)]
pub enum WorkloadKind {
    /// A Kubernetes pod.
    #[default]
    Pod,
    /// A WorkloadEntry (selected by a ServiceEntry or a Kubernetes Service).
    WorkloadEntry,
    /// An endpoint written inline in a ServiceEntry.
    ServiceEntry,
    /// An instance from a registry outside Kubernetes and Istio config (Consul, the
    /// mock registry file).
    External,
    /// An EndpointSlice endpoint that names no pod (`targetRef` absent or not a Pod):
    /// the object is the slice (Istio's EndpointSlice workloads).
    EndpointSlice,
}

/// The controller kind that owns a pod (Istio's `WorkloadType`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default, Serialize)]
pub enum WorkloadOwner {
    /// No known controller: the workload is named after itself.
    #[default]
    Pod,
    Deployment,
    Job,
    CronJob,
}

/// The identity of the object behind an endpoint, as its registry knows it. An
/// object backing several services carries an equal record on each of its
/// endpoints; the `uid` is unique across registries and clusters.
#[derive(Clone, PartialEq, Eq, Debug, Default, Serialize)]
pub struct WorkloadMeta {
    /// What the object is.
    pub kind: WorkloadKind,
    /// Object name (pod name, WorkloadEntry name, ServiceEntry name, instance id).
    pub name: String,
    /// Namespace of the object (for registries without namespaces: the service's).
    pub namespace: String,
    /// Istio's workload uid: `<cluster>//Pod/<ns>/<name>`,
    /// `<cluster>/networking.istio.io/WorkloadEntry/<ns>/<name>`,
    /// `<cluster>/networking.istio.io/ServiceEntry/<ns>/<name>/<address>`; for other
    /// registries `<cluster>/<registry>/<ns>/<name>`.
    pub uid: String,
    /// The node it runs on (pods: `spec.nodeName`), empty when unknown.
    pub node_name: String,
    /// The workload it belongs to (a pod's Deployment, Job or CronJob; else the
    /// object's own name) and that workload's kind.
    pub workload_name: String,
    pub owner: WorkloadOwner,
    /// `istio.io/dataplane-mode` of the object, else of its namespace (`ambient`,
    /// `none`); empty when neither sets it.
    pub dataplane_mode: String,
    /// `istio.io/use-waypoint` of the object, else of its namespace; empty when unset.
    pub use_waypoint: String,
    /// `istio.io/use-waypoint-namespace` alongside the `use_waypoint` that was taken.
    pub use_waypoint_namespace: String,
    /// The `ambient.istio.io/redirection: enabled` annotation (set by istio-cni when
    /// the pod's traffic is captured by ztunnel).
    pub ambient_redirected: bool,
    /// A pod on the host network (never an ambient workload).
    pub host_network: bool,
    /// When the object was created, when its registry knows (a pod's or
    /// WorkloadEntry's `metadata.creationTimestamp`): the order of a waypoint's
    /// workloads.
    pub creation_time: Option<std::time::SystemTime>,
}

impl Endpoint {
    /// A healthy, weight-1 endpoint at `address` with no ports yet.
    pub fn new(address: IpAddr) -> Endpoint {
        Endpoint {
            address,
            hostname: None,
            ports: BTreeMap::new(),
            labels: BTreeMap::new(),
            locality: Locality::default(),
            network: NetworkId::default(),
            cluster_id: ClusterId::default(),
            health: HealthStatus::Healthy,
            weight: 1,
            tls_mode: TlsMode::Disabled,
            service_account: None,
            workload: None,
        }
    }

    /// A healthy, weight-1 endpoint reached by resolving `hostname` (DNS
    /// ServiceEntries); its `address` is the unspecified IPv4 address.
    pub fn for_hostname(hostname: impl Into<Hostname>) -> Endpoint {
        Endpoint {
            hostname: Some(hostname.into()),
            ..Endpoint::new(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED))
        }
    }

    /// A healthy, weight-1 endpoint without an address (a WorkloadEntry that names a
    /// network and no address): reachable only through its network's gateway, never
    /// served as an IP.
    pub fn without_address() -> Endpoint {
        Endpoint::new(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED))
    }

    /// False for an endpoint made by [`Endpoint::without_address`]: no hostname and
    /// the unspecified IP.
    pub fn has_address(&self) -> bool {
        self.hostname.is_some() || !self.address.is_unspecified()
    }

    /// What a client connects to: the hostname of a DNS endpoint, else the IP.
    pub fn connect_address(&self) -> String {
        match &self.hostname {
            Some(host) => host.to_string(),
            None => self.address.to_string(),
        }
    }

    /// Adds a `service port name -> target port` mapping.
    pub fn with_port(mut self, name: &str, target: u16) -> Endpoint {
        self.ports.insert(Arc::from(name), target);
        self
    }

    /// The effective weight (0 counts as 1).
    pub fn effective_weight(&self) -> u32 {
        self.weight.max(1)
    }
}

/// The workload a proxy runs as, as a registry knows it (on Kubernetes: the proxy's
/// pod). It gives the proxy its labels and locality, and the service ports it serves
/// (its inbound clusters and listeners) even before any endpoint lists it.
#[derive(Clone, PartialEq, Debug, Serialize)]
pub struct WorkloadInstance {
    /// Workload name (the pod name).
    pub name: String,
    /// Namespace the workload runs in.
    pub namespace: Namespace,
    /// Cluster of the registry that knows it.
    pub cluster_id: ClusterId,
    /// Workload labels plus the topology labels every workload carries (region, zone,
    /// subzone, cluster, node, network): what the proxy's labels become.
    pub labels: BTreeMap<String, String>,
    /// Where it runs (empty when unknown).
    pub locality: Locality,
    /// SPIFFE identity, if known.
    pub service_account: Option<String>,
    /// The service ports it serves: services in key order, each service's ports in
    /// declaration order, one per (target port, protocol) of a service.
    pub targets: Vec<ServiceTarget>,
}

/// One service port a workload serves and the port it listens on for it.
#[derive(Clone, PartialEq, Eq, Debug, Serialize)]
pub struct ServiceTarget {
    /// The service.
    pub service: ServiceKey,
    /// The service port number.
    pub port: u16,
    /// The workload port (the service's target port, a named one resolved).
    pub target_port: u16,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn providers_are_written_and_read_by_name() {
        for (provider, name) in [
            (ProviderId::Kubernetes, "\"Kubernetes\""),
            (ProviderId::External, "\"External\""),
            (ProviderId::Consul, "\"Consul\""),
            (ProviderId::Mock, "\"Mock\""),
            (ProviderId::Named("Nacos"), "\"Nacos\""),
        ] {
            assert_eq!(serde_json::to_string(&provider).unwrap(), name);
        }
        let read: ProviderId = serde_json::from_str("\"Consul\"").unwrap();
        assert_eq!(read, ProviderId::Consul);
        assert!(serde_json::from_str::<ProviderId>("\"Nacos\"").is_err());
        assert_eq!(
            ShardKey::new(ProviderId::Named("Nacos"), "dc1").to_string(),
            "Nacos/dc1"
        );
    }

    #[test]
    fn protocol_parse_is_case_insensitive_and_unknown_sniffs() {
        assert_eq!(Protocol::parse("gRPC"), Protocol::Grpc);
        assert_eq!(Protocol::parse("HTTP2"), Protocol::Http2);
        assert_eq!(Protocol::parse("grpc-web"), Protocol::GrpcWeb);
        assert_eq!(Protocol::parse("httpfoo"), Protocol::Unsupported);
        assert_eq!(Protocol::parse_known("httpfoo"), None);
        assert_eq!(Protocol::parse_known("tcp"), Some(Protocol::Tcp));
    }

    #[test]
    fn export_to_rules() {
        assert!(ExportTo::default().visible_to("a", "b"));
        assert!(ExportTo::public().visible_to("a", "b"));
        let private = ExportTo(BTreeSet::from([".".to_string()]));
        assert!(private.visible_to("a", "a"));
        assert!(!private.visible_to("a", "b"));
        let none = ExportTo(BTreeSet::from(["~".to_string()]));
        assert!(!none.visible_to("a", "a"));
        let named = ExportTo(BTreeSet::from(["b".to_string()]));
        assert!(named.visible_to("a", "b"));
        assert!(!named.visible_to("a", "c"));
    }

    #[test]
    fn auto_allocated_addresses_only_for_proxies_that_use_them_and_services_without_vips() {
        let mut s = Service::new("db.example.com", "ns", ProviderId::External, "c1");
        s.auto_allocated_ipv4 = Some("240.240.0.1".parse().unwrap());
        s.auto_allocated_ipv6 = Some("2001:2::f0f0:1".parse().unwrap());
        let c1 = ClusterId::new("c1");
        assert_eq!(s.address_for_proxy(Some(&c1), false), None);
        assert_eq!(
            s.address_for_proxy(Some(&c1), true),
            Some("240.240.0.1".parse().unwrap()),
            "IPv4 preferred"
        );
        s.auto_allocated_ipv4 = None;
        assert_eq!(
            s.address_for_proxy(None, true),
            Some("2001:2::f0f0:1".parse().unwrap())
        );
        s.cluster_vips
            .insert(c1.clone(), vec!["10.0.0.1".parse().unwrap()]);
        assert_eq!(
            s.address_for_proxy(Some(&c1), true),
            Some("10.0.0.1".parse().unwrap()),
            "a VIP wins"
        );
    }

    #[test]
    fn locality_round_trips() {
        let l = Locality::parse("r1/z1");
        assert_eq!(l.zone, "z1");
        assert_eq!(l.subzone, "");
        assert_eq!(l.to_string(), "r1/z1/");
        assert_eq!(Locality::parse("").to_string(), "");
    }

    #[test]
    fn address_for_prefers_the_proxy_cluster() {
        let mut s = Service::new("a.ns.svc.cluster.local", "ns", ProviderId::Kubernetes, "c1");
        s.cluster_vips
            .insert("c1".into(), vec!["10.0.0.1".parse().unwrap()]);
        s.cluster_vips
            .insert("c2".into(), vec!["10.1.0.1".parse().unwrap()]);
        assert_eq!(
            s.address_for(Some(&"c2".into())),
            Some("10.1.0.1".parse().unwrap())
        );
        assert_eq!(
            s.address_for(Some(&"c9".into())),
            Some("10.0.0.1".parse().unwrap())
        );
        assert_eq!(s.address_for(None), Some("10.0.0.1".parse().unwrap()));
    }
}
