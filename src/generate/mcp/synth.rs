//! ServiceEntries and WorkloadEntries synthesized from the services of the exported
//! registries, so that an istiod fed over MCP routes to them with no other source.
//!
//! For each exported service (merged by the aggregate: one per hostname and namespace,
//! collisions resolved by its policy), in the service's namespace:
//! - a ServiceEntry `synthetic-<hostname>`: `hosts: [hostname]`, its ports (name,
//!   number, protocol), `resolution` (STATIC, DNS, DNS_ROUND_ROBIN or NONE as the
//!   service resolves), `location` (MESH_INTERNAL or MESH_EXTERNAL), its VIPs and CIDRs
//!   as `addresses`, `exportTo`, its identities as `subjectAltNames`, and a
//!   `workloadSelector` on the label [`SELECTOR_LABEL`];
//! - a WorkloadEntry `synthetic-<hostname>-<address>-<ports>` per healthy endpoint of
//!   an exported registry: address, ports by service port name, network, locality,
//!   labels (the endpoint's valid labels and the selector label), weight and service
//!   account.
//!
//! Endpoints are WorkloadEntries rather than inline endpoints: an endpoint change then
//! changes WorkloadEntries only (pushed alone, and to istiod an endpoint update), and
//! each instance is an object a consumer can list.
//!
//! Names are derived from the hostname (and the endpoint's address and ports) alone,
//! so they are the same across restarts and replicas: lower-cased, every character but
//! `a-z`, `0-9`, `-` and `.` replaced by `-`, trimmed to start and end with an
//! alphanumeric, and a name longer than 253 characters cut to 236 and suffixed with
//! `-` and 16 hex digits of the FNV-1a hash of the whole name.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::SystemTime;

use meshfed_api::networking::v1alpha3 as net;
use meshfed_registry::endpoints::EndpointShards;
use meshfed_registry::{
    Endpoint, HealthStatus, MeshLocation, ProviderId, Resolution, Service, ServiceKey, ShardKey,
};

/// The label a synthesized ServiceEntry selects its WorkloadEntries by; its value is
/// the ServiceEntry's name (made a valid label value).
pub const SELECTOR_LABEL: &str = "mcp.meshfed.io/service";

/// The annotation naming the registry a synthesized object comes from.
pub const REGISTRY_ANNOTATION: &str = "mcp.meshfed.io/registry";

/// Which registries and namespaces are exported (`--mcpExportRegistries`,
/// `--mcpExportNamespaces`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct McpExport {
    /// Provider names (as Istio spells them, compared without case); `None`: every
    /// registry but Kubernetes. `Kubernetes` exports the remote clusters: the local
    /// cluster (`local_cluster`) is never exported, its consumer reads it itself.
    pub registries: Option<BTreeSet<String>>,
    /// Namespaces exported; empty: all.
    pub namespaces: BTreeSet<String>,
    /// The local cluster's id (`--clusterID`).
    pub local_cluster: String,
}

impl Default for McpExport {
    fn default() -> Self {
        McpExport {
            registries: None,
            namespaces: BTreeSet::new(),
            local_cluster: "Kubernetes".to_string(),
        }
    }
}

impl McpExport {
    /// Whether the services and endpoints of `shard` are exported. ServiceEntry
    /// services never are: their objects are served as they are.
    pub fn exports(&self, shard: &ShardKey) -> bool {
        match shard.provider {
            ProviderId::External => false,
            ProviderId::Kubernetes if shard.cluster.as_str() == self.local_cluster => false,
            provider => match &self.registries {
                None => provider != ProviderId::Kubernetes,
                Some(names) => names
                    .iter()
                    .any(|n| n.eq_ignore_ascii_case(provider.as_str())),
            },
        }
    }

    /// Whether a merged `service` is exported: its registry and its namespace.
    pub fn exports_service(&self, service: &Service) -> bool {
        self.exports(&ShardKey::new(service.provider, service.cluster_id.clone()))
            && self.exports_namespace(service.namespace.as_str())
    }

    /// Whether objects of `namespace` are exported.
    pub fn exports_namespace(&self, namespace: &str) -> bool {
        self.namespaces.is_empty() || self.namespaces.contains(namespace)
    }
}

/// One synthesized object.
#[derive(Clone, Debug, PartialEq)]
pub struct Synthetic<T> {
    /// Its name (see the module doc).
    pub name: String,
    /// The service's namespace.
    pub namespace: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Annotations ([`REGISTRY_ANNOTATION`]).
    pub annotations: BTreeMap<String, String>,
    /// The service's creation time.
    pub creation_time: SystemTime,
    /// The spec.
    pub spec: T,
}

/// What synthesis made and what it left out.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Synthesized {
    /// One ServiceEntry per exported service, by namespace and name.
    pub service_entries: Vec<Synthetic<net::ServiceEntry>>,
    /// One WorkloadEntry per exported endpoint, by namespace and name.
    pub workload_entries: Vec<Synthetic<net::WorkloadEntry>>,
    /// Exported hostnames another registry also has: `<namespace>/<hostname>: ...`
    /// (the aggregate's merge policy picked the one served).
    pub conflicts: Vec<String>,
    /// What could not be expressed, with why.
    pub skipped: Vec<String>,
}

/// Synthesizes the objects of the exported `services` (merged, sorted by key), their
/// endpoints read through `shards`; `conflicts` are the aggregate's
/// `(service, winner, loser)` triples.
pub fn synthesize(
    services: &[Arc<Service>],
    shards: impl Fn(&ServiceKey) -> Option<Arc<EndpointShards>>,
    conflicts: &[(ServiceKey, ShardKey, ShardKey)],
    export: &McpExport,
) -> Synthesized {
    let mut out = Synthesized::default();
    for service in services.iter().filter(|s| export.exports_service(s)) {
        let objects = synthesize_service(service, shards(&service.key()).as_deref(), export);
        out.skipped.extend(objects.skipped);
        out.service_entries.extend(objects.service_entry);
        out.workload_entries.extend(objects.workload_entries);
    }
    out.conflicts = conflict_lines(conflicts, |k| {
        services
            .binary_search_by(|s| s.key().cmp(k))
            .is_ok_and(|i| export.exports_service(&services[i]))
    });
    out.service_entries
        .sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    out.workload_entries
        .sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    out
}

/// The exported services another registry also has: `<namespace>/<hostname>: served
/// from <provider>/<cluster>, also in <provider>/<cluster>`; `exported` says whether
/// a merged service is exported.
pub fn conflict_lines(
    conflicts: &[(ServiceKey, ShardKey, ShardKey)],
    exported: impl Fn(&ServiceKey) -> bool,
) -> Vec<String> {
    conflicts
        .iter()
        .filter(|(key, _, _)| exported(key))
        .map(|(key, winner, loser)| {
            format!(
                "{}/{}: served from {}/{}, also in {}/{}",
                key.namespace,
                key.hostname,
                winner.provider.as_str(),
                winner.cluster,
                loser.provider.as_str(),
                loser.cluster
            )
        })
        .collect()
}

/// What one exported service comes to.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ServiceObjects {
    /// Its ServiceEntry, unless it has no ServiceEntry form.
    pub service_entry: Option<Synthetic<net::ServiceEntry>>,
    /// Its WorkloadEntries, by name.
    pub workload_entries: Vec<Synthetic<net::WorkloadEntry>>,
    /// Why it was left out, when it was.
    pub skipped: Option<String>,
}

/// The objects of one exported `service` with endpoint `shards`.
pub fn synthesize_service(
    service: &Service,
    shards: Option<&EndpointShards>,
    export: &McpExport,
) -> ServiceObjects {
    let mut out = ServiceObjects::default();
    let key = service.key();
    let resolution = match service.resolution {
        Resolution::ClientSideLb => net::service_entry::Resolution::Static,
        Resolution::DnsLb => net::service_entry::Resolution::Dns,
        Resolution::DnsRoundRobinLb => net::service_entry::Resolution::DnsRoundRobin,
        Resolution::Passthrough => net::service_entry::Resolution::None,
        Resolution::Alias => {
            out.skipped = Some(format!(
                "{}/{}: an alias of another name has no ServiceEntry form",
                key.namespace, key.hostname
            ));
            return out;
        }
    };
    if service.ports.is_empty() {
        out.skipped = Some(format!(
            "{}/{}: no ports (a ServiceEntry needs at least one)",
            key.namespace, key.hostname
        ));
        return out;
    }
    let name = object_name(&format!("synthetic-{}", key.hostname));
    let selector = label_value(&name);
    let registry = format!("{}/{}", service.provider.as_str(), service.cluster_id);
    let annotations = BTreeMap::from([(REGISTRY_ANNOTATION.to_string(), registry.clone())]);
    let mut addresses: BTreeSet<String> = service
        .cluster_vips
        .values()
        .flatten()
        .filter(|ip| !ip.is_unspecified())
        .map(ToString::to_string)
        .collect();
    addresses.extend(service.cluster_cidrs.values().flatten().cloned());
    let spec = net::ServiceEntry {
        hosts: vec![key.hostname.to_string()],
        addresses: addresses.into_iter().collect(),
        ports: service
            .ports
            .iter()
            .map(|p| net::ServicePort {
                number: u32::from(p.port.get()),
                protocol: protocol_name(p.protocol).to_string(),
                name: p.name.to_string(),
                target_port: 0,
            })
            .collect(),
        location: match service.location {
            MeshLocation::MeshInternal => net::service_entry::Location::MeshInternal,
            MeshLocation::MeshExternal => net::service_entry::Location::MeshExternal,
        } as i32,
        resolution: resolution as i32,
        endpoints: Vec::new(),
        workload_selector: (resolution != net::service_entry::Resolution::None).then(|| {
            net::WorkloadSelector {
                labels: BTreeMap::from([(SELECTOR_LABEL.to_string(), selector.clone())]),
            }
        }),
        export_to: service.export_to.0.iter().cloned().collect(),
        subject_alt_names: service.service_accounts.iter().cloned().collect(),
    };
    let port_names: BTreeSet<&str> = service.ports.iter().map(|p| &*p.name).collect();
    if resolution != net::service_entry::Resolution::None
        && let Some(shards) = shards
    {
        let mut seen = BTreeSet::new();
        for (shard, endpoint) in shards.iter() {
            if !export.exports(shard) || endpoint.health != HealthStatus::Healthy {
                continue;
            }
            let Some(we) = workload_entry(endpoint, &port_names, &service.namespace) else {
                continue;
            };
            let mut numbers: Vec<u32> = we.ports.values().copied().collect();
            numbers.sort_unstable();
            numbers.dedup();
            let suffix: Vec<String> = numbers.iter().map(u32::to_string).collect();
            let we_name = object_name(&format!("{name}-{}-{}", we.address, suffix.join("-")));
            if !seen.insert(we_name.clone()) {
                continue;
            }
            let mut labels = we.labels.clone();
            labels.insert(SELECTOR_LABEL.to_string(), selector.clone());
            out.workload_entries.push(Synthetic {
                name: we_name,
                namespace: key.namespace.to_string(),
                labels: labels.clone(),
                annotations: BTreeMap::from([(
                    REGISTRY_ANNOTATION.to_string(),
                    format!("{}/{}", shard.provider.as_str(), shard.cluster),
                )]),
                creation_time: service.creation_time,
                spec: net::WorkloadEntry { labels, ..we },
            });
        }
    }
    out.service_entry = Some(Synthetic {
        name,
        namespace: key.namespace.to_string(),
        labels: BTreeMap::new(),
        annotations,
        creation_time: service.creation_time,
        spec,
    });
    out.workload_entries
        .sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    out
}

/// The WorkloadEntry spec of `endpoint` (labels without the selector label), or `None`
/// when it has no port of the service.
fn workload_entry(
    endpoint: &Endpoint,
    port_names: &BTreeSet<&str>,
    namespace: &meshfed_registry::Namespace,
) -> Option<net::WorkloadEntry> {
    let ports: BTreeMap<String, u32> = endpoint
        .ports
        .iter()
        .filter(|(name, _)| port_names.contains(&***name))
        .map(|(name, port)| (name.to_string(), u32::from(*port)))
        .collect();
    if ports.is_empty() {
        return None;
    }
    let address = match &endpoint.hostname {
        Some(host) => host.to_string(),
        None => endpoint.address.to_string(),
    };
    let labels = endpoint
        .labels
        .iter()
        .filter(|(k, v)| valid_label_key(k) && valid_label_value(v) && k.as_str() != SELECTOR_LABEL)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    // `region/zone/subzone` without empty trailing parts (Istio's form: `r1/z1`).
    let l = &endpoint.locality;
    let locality = [l.region.as_str(), &l.zone, &l.subzone]
        .join("/")
        .trim_end_matches('/')
        .to_string();
    Some(net::WorkloadEntry {
        address,
        ports,
        labels,
        network: endpoint.network.to_string(),
        locality,
        weight: endpoint.weight,
        service_account: endpoint
            .service_account
            .as_deref()
            .and_then(|sa| service_account_name(sa, namespace.as_str()))
            .unwrap_or_default(),
    })
}

/// The service account name of identity `sa` for a WorkloadEntry in `namespace`: the
/// `sa` segment of a SPIFFE id of that namespace, or a plain valid name.
fn service_account_name(sa: &str, namespace: &str) -> Option<String> {
    if let Some(path) = sa.strip_prefix("spiffe://") {
        let rest = path.split_once('/')?.1;
        let (ns, name) = rest.strip_prefix("ns/")?.split_once("/sa/")?;
        return (ns == namespace && is_dns_label(name)).then(|| name.to_string());
    }
    is_dns_label(sa).then(|| sa.to_string())
}

/// Istio's spelling of a port protocol in a ServiceEntry; empty (detected by the
/// proxy) for an unknown one.
fn protocol_name(protocol: meshfed_registry::Protocol) -> &'static str {
    use meshfed_registry::Protocol as P;
    match protocol {
        P::Grpc => "GRPC",
        P::GrpcWeb => "GRPC-Web",
        P::Http => "HTTP",
        P::HttpProxy => "HTTP_PROXY",
        P::Http2 => "HTTP2",
        P::Https => "HTTPS",
        P::Tcp => "TCP",
        P::Tls => "TLS",
        P::Udp => "UDP",
        P::Mongo => "Mongo",
        P::Redis => "Redis",
        P::Mysql => "MySQL",
        P::Unsupported => "",
    }
}

/// FNV-1a, 64 bits: a hash that is the same in every build and on every machine.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// `raw` as a DNS-1123 subdomain (see the module doc).
pub fn object_name(raw: &str) -> String {
    let mapped: String = raw
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let trimmed = mapped.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    let name = if trimmed.is_empty() {
        "synthetic"
    } else {
        trimmed
    };
    // No empty labels (`a..b`), which DNS-1123 subdomains forbid.
    let mut name = name
        .split('.')
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(".");
    name = name.replace(".-", ".x-").replace("-.", "-x.");
    if name.len() > 253 {
        let head = name[..236].trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
        name = format!("{head}-{:016x}", fnv1a(raw.as_bytes()));
    }
    name
}

/// `name` as a label value: itself when it is one, else cut to 46 characters and
/// suffixed with `-` and 16 hex digits of its hash.
fn label_value(name: &str) -> String {
    if valid_label_value(name) {
        return name.to_string();
    }
    let head: String = name.chars().take(46).collect();
    let head = head.trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
    format!("{head}-{:016x}", fnv1a(name.as_bytes()))
}

fn is_qualified(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

fn valid_label_value(v: &str) -> bool {
    v.is_empty() || is_qualified(v)
}

fn valid_label_key(k: &str) -> bool {
    let (prefix, name) = match k.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    let prefix_ok =
        prefix.is_none_or(|p| !p.is_empty() && p.len() <= 253 && p.split('.').all(is_dns_label));
    prefix_ok && is_qualified(name)
}

fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_dns1123_and_stable() {
        assert_eq!(
            object_name("synthetic-web.service.consul"),
            "synthetic-web.service.consul"
        );
        assert_eq!(
            object_name("synthetic-Web_API.svc"),
            "synthetic-web-api.svc"
        );
        assert_eq!(
            object_name("synthetic-web.consul-10.0.0.1-8080"),
            "synthetic-web.consul-10.0.0.1-8080"
        );
        assert_eq!(
            object_name("synthetic-x-2001:db8::1-80"),
            "synthetic-x-2001-db8--1-80"
        );
        let long = format!("synthetic-{}", "a".repeat(300));
        let name = object_name(&long);
        assert!(name.len() <= 253, "{}", name.len());
        assert_eq!(name, object_name(&long), "stable");
        assert!(name.ends_with(&format!("{:016x}", fnv1a(long.as_bytes()))));
        assert_eq!(label_value("synthetic-web.consul"), "synthetic-web.consul");
        assert!(label_value(&long).len() <= 63);
    }

    #[test]
    fn the_default_exports_every_registry_but_kubernetes() {
        let export = McpExport::default();
        assert!(export.exports(&ShardKey::new(ProviderId::Consul, "dc1")));
        assert!(export.exports(&ShardKey::new(ProviderId::Mock, "x")));
        assert!(export.exports(&ShardKey::new(ProviderId::Named("Nacos"), "x")));
        assert!(!export.exports(&ShardKey::new(ProviderId::Kubernetes, "Kubernetes")));
        assert!(!export.exports(&ShardKey::new(ProviderId::Kubernetes, "remote")));
        assert!(!export.exports(&ShardKey::new(ProviderId::External, "Kubernetes")));
        let listed = McpExport {
            registries: Some(BTreeSet::from([
                "kubernetes".to_string(),
                "Consul".to_string(),
            ])),
            ..McpExport::default()
        };
        assert!(listed.exports(&ShardKey::new(ProviderId::Kubernetes, "remote")));
        assert!(!listed.exports(&ShardKey::new(ProviderId::Kubernetes, "Kubernetes")));
        assert!(!listed.exports(&ShardKey::new(ProviderId::Mock, "x")));
    }

    #[test]
    fn service_accounts_of_the_namespace_only() {
        assert_eq!(
            service_account_name("spiffe://cluster.local/ns/shop/sa/web", "shop").as_deref(),
            Some("web")
        );
        assert_eq!(
            service_account_name("spiffe://cluster.local/ns/other/sa/web", "shop"),
            None
        );
        assert_eq!(service_account_name("web", "shop").as_deref(), Some("web"));
        assert_eq!(service_account_name("Not Valid", "shop"), None);
    }
}
